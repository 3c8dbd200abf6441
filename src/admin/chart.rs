//! The stats page's charts: per service, connections per second and the
//! p99 connection time over the last minutes, kept as a bounded ring of
//! samples and drawn as inline SVG (no JavaScript).
//!
//! [`Charts`] is filled by the sampler thread (`sampler.rs`) every
//! [`SAMPLE_EVERY`], never by a worker: a sample reads the services'
//! counters and histograms, which the workers raise anyway. The p99 is the
//! difference between two histogram snapshots ([`p99`]), so it is the p99
//! of the connections that ended in that interval. The same pass keeps
//! each backend's connection rate. The page takes the lock for a copy.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::collections::{HashMap, VecDeque};
use std::fmt::Write;
use std::sync::Arc;
use std::time::Duration;

use crate::service::Service;
use crate::stats::HistogramSnapshot;

/// Time between two samples.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// Samples kept per service: ten minutes at one per [`SAMPLE_EVERY`].
pub const SAMPLES: usize = 120;

/// One point of a service's chart.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Connections accepted per second over the interval.
    pub rate: f64,
    /// The p99 of the connections that ended in the interval, in seconds;
    /// `None` when none ended.
    pub p99: Option<f64>,
}

/// What the last sample of a service read, to take the next one's
/// differences from.
#[derive(Debug)]
struct Last {
    accepted: u64,
    durations: HistogramSnapshot,
    points: VecDeque<Sample>,
}

/// The charts of every service and the backends' connection rates.
#[derive(Debug, Default)]
pub struct Charts {
    services: HashMap<String, Last>,
    /// Per backend id: its total at the last sample and its rate since.
    backends: HashMap<u64, (u64, f64)>,
}

impl Charts {
    /// Takes one sample of `services`, `elapsed` after the last one.
    /// Services and backends no longer listed are forgotten, so the
    /// memory is bounded by what runs now.
    pub fn sample(&mut self, services: &[Arc<Service>], elapsed: Duration) {
        let secs = elapsed.as_secs_f64().max(0.001);
        self.services
            .retain(|name, _| services.iter().any(|s| s.name() == name));
        let mut seen = HashMap::with_capacity(self.backends.len());
        for service in services {
            let accepted = service.stats.own().accepted;
            let durations = service.stats.histograms.connection_duration.snapshot();
            match self.services.get_mut(service.name()) {
                Some(last) => {
                    let sample = Sample {
                        rate: accepted.saturating_sub(last.accepted) as f64 / secs,
                        p99: p99(&last.durations, &durations),
                    };
                    if last.points.len() == SAMPLES {
                        last.points.pop_front();
                    }
                    last.points.push_back(sample);
                    last.accepted = accepted;
                    last.durations = durations;
                }
                None => {
                    let last = Last {
                        accepted,
                        durations,
                        points: VecDeque::with_capacity(SAMPLES),
                    };
                    self.services.insert(service.name().to_string(), last);
                }
            }
            for b in service.live.scheduler.snapshot().iter() {
                let total = b.total();
                let rate = match self.backends.get(&b.id()) {
                    Some(&(before, _)) => total.saturating_sub(before) as f64 / secs,
                    None => 0.0,
                };
                seen.insert(b.id(), (total, rate));
            }
        }
        self.backends = seen;
    }

    /// A service's points, oldest first.
    pub fn points(&self, service: &str) -> Vec<Sample> {
        self.services
            .get(service)
            .map_or_else(Vec::new, |l| l.points.iter().copied().collect())
    }

    /// A backend's connections per second over the last interval, once
    /// two samples saw it.
    pub fn backend_rate(&self, id: u64) -> Option<f64> {
        self.backends.get(&id).map(|&(_, rate)| rate)
    }
}

/// The p99 of the observations between `before` and `after` (two
/// snapshots of one histogram), interpolated within its bucket as
/// Prometheus's `histogram_quantile` does; `None` when there were none.
/// An observation above the last bound counts as the last bound.
pub fn p99(before: &HistogramSnapshot, after: &HistogramSnapshot) -> Option<f64> {
    let counts: Vec<(f64, u64)> = after
        .per_bucket
        .iter()
        .zip(&before.per_bucket)
        .map(|(a, b)| (a.0, a.1.saturating_sub(b.1)))
        .collect();
    let total: u64 = counts.iter().map(|c| c.1).sum();
    if total == 0 {
        return None;
    }
    let rank = 0.99 * total as f64;
    let (mut below, mut lower) = (0u64, 0.0f64);
    for (bound, n) in counts {
        if n > 0 && (below + n) as f64 >= rank {
            if bound.is_infinite() {
                return Some(lower);
            }
            let within = (rank - below as f64) / n as f64;
            return Some(lower + (bound - lower) * within);
        }
        below += n;
        if bound.is_finite() {
            lower = bound;
        }
    }
    Some(lower)
}

/// Width and height of one chart, in SVG units.
const W: f64 = 360.0;
const H: f64 = 90.0;

/// The chart of one service: two panels, connections per second and p99
/// connection time, each scaled to its own maximum, as inline SVG. Text
/// is escaped by the caller's `esc`.
pub fn svg(points: &[Sample], label: &str, esc: fn(&str) -> String) -> String {
    let mut out = String::with_capacity(2048);
    let span = points.len() as u64 * SAMPLE_EVERY.as_secs();
    let _ = write!(
        out,
        "<svg class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" \
viewBox=\"0 0 {} {}\" role=\"img\" aria-label=\"{}\"><title>{}: connections per second \
and p99 connection time, last {} s</title>",
        W * 2.0 + 30.0,
        H + 30.0,
        W * 2.0 + 30.0,
        H + 30.0,
        esc(label),
        esc(label),
        span
    );
    let rates: Vec<f64> = points.iter().map(|p| p.rate).collect();
    let p99s: Vec<f64> = points
        .iter()
        .map(|p| p.p99.unwrap_or(0.0) * 1000.0)
        .collect();
    panel(&mut out, 0.0, "connections/s", &rates, "#2a6fdb");
    panel(&mut out, W + 30.0, "p99 ms", &p99s, "#d9822b");
    out.push_str("</svg>");
    out
}

/// One panel at `x`: a frame, its title with the latest value and the
/// maximum, and the line.
fn panel(out: &mut String, x: f64, title: &str, values: &[f64], colour: &str) {
    let max = values.iter().copied().fold(0.0f64, f64::max);
    let last = values.last().copied();
    let _ = write!(
        out,
        "<g transform=\"translate({x},0)\"><rect x=\"0\" y=\"18\" width=\"{W}\" height=\"{H}\" \
fill=\"#fafafa\" stroke=\"#bbb\"/><text x=\"2\" y=\"13\" font-size=\"12\" \
font-family=\"sans-serif\">{title}: {} (max {})</text>",
        last.map_or("-".to_string(), number),
        number(max)
    );
    if values.len() >= 2 {
        let step = W / (SAMPLES - 1) as f64;
        let start = W - step * (values.len() - 1) as f64;
        let top = if max > 0.0 { max } else { 1.0 };
        out.push_str("<polyline fill=\"none\" stroke=\"");
        out.push_str(colour);
        out.push_str("\" stroke-width=\"1.5\" points=\"");
        for (i, v) in values.iter().enumerate() {
            let px = start + step * i as f64;
            let py = 18.0 + H - (v / top) * (H - 4.0);
            let _ = write!(out, "{px:.1},{py:.1} ");
        }
        out.push_str("\"/>");
    } else {
        let _ = write!(
            out,
            "<text x=\"8\" y=\"{}\" font-size=\"11\" fill=\"#777\" \
font-family=\"sans-serif\">collecting (one point every {} s)</text>",
            18.0 + H / 2.0,
            SAMPLE_EVERY.as_secs()
        );
    }
    out.push_str("</g>");
}

/// `12`, `3.4`, `0.012`: short, for a chart's title.
fn number(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Histogram;

    fn esc(s: &str) -> String {
        s.replace('&', "&amp;").replace('<', "&lt;")
    }

    #[test]
    fn p99_of_an_interval_is_from_the_difference() {
        let h = Histogram::default();
        for _ in 0..1000 {
            h.observe(Duration::from_secs(30));
        }
        let before = h.snapshot();
        for _ in 0..99 {
            h.observe(Duration::from_micros(50));
        }
        h.observe(Duration::from_millis(7));
        let after = h.snapshot();
        let p = p99(&before, &after).unwrap();
        // 99 of 100 within 100 µs: the rank 99 lands at the first bound.
        assert!((p - 0.0001).abs() < 1e-9, "{p}");
        assert_eq!(p99(&after, &after), None);
        h.observe(Duration::from_secs(120));
        let inf = h.snapshot();
        assert_eq!(p99(&after, &inf), Some(60.0));
    }

    #[test]
    fn the_ring_is_bounded_and_services_gone_are_forgotten() {
        let (running, _) = crate::running::for_tests(vec![("web", vec![])]);
        let services = running.list();
        let mut charts = Charts::default();
        for _ in 0..SAMPLES + 50 {
            crate::stats::Stats::incr(&services[0].stats.accepted);
            charts.sample(&services, Duration::from_secs(5));
        }
        let points = charts.points("web");
        assert_eq!(points.len(), SAMPLES);
        assert!((points[0].rate - 0.2).abs() < 1e-9, "{points:?}");
        charts.sample(&[], Duration::from_secs(5));
        assert!(charts.points("web").is_empty());
    }

    #[test]
    fn the_svg_is_bounded_escaped_and_has_two_lines() {
        let points: Vec<Sample> = (0..SAMPLES)
            .map(|i| Sample {
                rate: i as f64,
                p99: Some(0.002),
            })
            .collect();
        let svg = svg(&points, "<a&b>", esc);
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("aria-label=\"&lt;a&amp;b>\""), "{svg}");
        assert!(!svg.contains("<a&b>"));
        assert!(svg.len() < 12_000, "{}", svg.len());
        let empty = super::svg(&[], "x", esc);
        assert!(empty.contains("collecting"));
    }
}
