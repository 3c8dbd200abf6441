//! The Prometheus view of the balancer: every counter of the table, the
//! backends one by one, the queue, the workers, the limiter and the
//! histograms, in the Prometheus text format.
//!
//! Built with `prometheus-client` (the Prometheus project's own Rust
//! client) as one [`Collector`] that reads the live values at each scrape:
//! nothing is counted twice, and a counter added to the `counters!` table
//! of [`crate::stats`] shows up here with no change. Rendering runs on the
//! admin listener's thread; it reads atomics and the scheduler's snapshot,
//! and takes no lock the workers take.
//!
//! Names are `rodizio_` followed by the table's name; counters get the
//! `_total` suffix Prometheus expects. Histogram buckets are cumulative in
//! the text, as Prometheus wants (`le="0.005"` counts every observation of
//! 5 ms or less, `le="+Inf"` equals `_count`); the encoder cumulates the
//! per-bucket counts of [`crate::stats::HistogramSnapshot`], nothing else
//! does. Per-backend values carry a
//! `backend` label with the backend's address as given.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C prints `### REQUEST FINISHED ###` per request.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::backend::Backend;
use crate::stats::{Kind, Stats};

/// What the metrics are read from; cheap to clone (reference counts and
/// closures over them).
#[derive(Clone)]
pub struct Sources {
    /// The table of counters and the histograms.
    pub stats: Arc<Stats>,
    /// The backends now.
    pub backends: Arc<dyn Fn() -> Arc<[Arc<Backend>]> + Send + Sync>,
    /// Clients waiting in the queue now.
    pub queued: Arc<dyn Fn() -> usize + Send + Sync>,
    /// The most worker threads (`workers`).
    pub max_workers: usize,
    /// Clients the limiter tracks now and its capacity, when it is on.
    pub limiter: Arc<dyn Fn() -> Option<(usize, usize)> + Send + Sync>,
}

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sources")
            .field("max_workers", &self.max_workers)
            .finish_non_exhaustive()
    }
}

/// The Prometheus text (format 0.0.4) of everything in `sources`.
pub fn render(sources: &Sources) -> String {
    let mut registry = Registry::with_prefix("rodizio");
    registry.register_collector(Box::new(View(sources.clone())));
    let mut out = String::new();
    // Writing into a String cannot fail; an encoder error would mean a bug
    // in a name, which the tests catch.
    if let Err(err) = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry) {
        log::error!("encoding the metrics failed: {err}");
    }
    out
}

/// The collector: reads [`Sources`] at each scrape.
#[derive(Debug)]
struct View(Sources);

impl Collector for View {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = &self.0;
        let snapshot = s.stats.snapshot();
        for entry in snapshot.entries() {
            match entry.kind {
                Kind::Counter => {
                    let m = ConstCounter::new(entry.value);
                    m.encode(encoder.encode_descriptor(
                        entry.name,
                        entry.help,
                        None,
                        m.metric_type(),
                    )?)?;
                }
                Kind::Gauge => gauge(&mut encoder, entry.name, entry.help, entry.value as i64)?,
            }
        }
        let limiter = (s.limiter)();
        let overall = [
            (
                "queue_depth",
                "Clients waiting in the queue for a worker now.",
                Some((s.queued)()),
            ),
            (
                "workers_max",
                "The most worker threads (workers).",
                Some(s.max_workers),
            ),
            (
                "workers_idle",
                "Worker threads alive and waiting for a client now.",
                Some(snapshot.workers.saturating_sub(snapshot.workers_busy) as usize),
            ),
            // The limiter's two only when it is on.
            (
                "rate_limit_clients",
                "Client IPs the rate limiter tracks now.",
                limiter.map(|(tracked, _)| tracked),
            ),
            (
                "rate_limit_capacity",
                "Most client IPs the rate limiter can track.",
                limiter.map(|(_, capacity)| capacity),
            ),
        ];
        for (name, help, value) in overall {
            if let Some(value) = value {
                gauge(&mut encoder, name, help, value as i64)?;
            }
        }
        let backends = (s.backends)();
        for &(name, help, kind, value) in PER_BACKEND {
            per_backend(&mut encoder, name, help, kind, &backends, value)?;
        }
        backend_up(&mut encoder, &backends)?;
        for (name, help, snap) in s.stats.histogram_snapshots() {
            let mut m = encoder.encode_descriptor(name, help, None, MetricType::Histogram)?;
            // The encoder takes counts per bucket and writes them cumulated
            // (the `le` lines): the snapshot's are per bucket, so they are
            // added up here once, by the encoder alone.
            m.encode_histogram::<NoLabelSet>(snap.sum, snap.count, &snap.per_bucket, None)?;
        }
        let mut m = encoder.encode_descriptor(
            "build_info",
            "Always 1; the version is a label.",
            None,
            MetricType::Gauge,
        )?;
        let labels = [("version", env!("CARGO_PKG_VERSION").to_string())];
        ConstGauge::new(1i64).encode(m.encode_family(&labels)?)?;
        Ok(())
    }
}

/// A series with one value per backend: its name, help, type, and how it
/// is read from the backend.
type PerBackend = (&'static str, &'static str, MetricType, fn(&Backend) -> u64);

/// The per-backend series, in the order they are written.
const PER_BACKEND: &[PerBackend] = &[
    (
        "backend_connections_active",
        "Connections being proxied to the backend now.",
        MetricType::Gauge,
        |b| b.active() as u64,
    ),
    (
        "backend_connections",
        "Connections ever handed to the backend.",
        MetricType::Counter,
        Backend::total,
    ),
    (
        "backend_bytes_to_backend",
        "Bytes from clients delivered to the backend.",
        MetricType::Counter,
        Backend::bytes_to_backend,
    ),
    (
        "backend_bytes_to_client",
        "Bytes from the backend delivered to clients.",
        MetricType::Counter,
        Backend::bytes_to_client,
    ),
    (
        "backend_connect_failures",
        "Connect attempts to the backend that failed.",
        MetricType::Counter,
        Backend::connect_failures_total,
    ),
];

/// `backend_up`: per backend, 1 for its current state and 0 for the others.
fn backend_up(
    encoder: &mut DescriptorEncoder,
    backends: &[Arc<Backend>],
) -> Result<(), std::fmt::Error> {
    let mut m = encoder.encode_descriptor(
        "backend_up",
        "1 for the backend's current state (up, down, draining, maint), 0 for the others.",
        None,
        MetricType::Gauge,
    )?;
    for b in backends {
        let now = b.state_name();
        for st in ["up", "down", "draining", "maint"] {
            let labels = [("backend", b.name().to_string()), ("state", st.to_string())];
            let value = i64::from(st == now);
            ConstGauge::new(value).encode(m.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

/// One gauge without labels.
fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: i64,
) -> Result<(), std::fmt::Error> {
    let m = ConstGauge::new(value);
    m.encode(encoder.encode_descriptor(name, help, None, m.metric_type())?)
}

/// One value per backend, labelled `backend`.
fn per_backend(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    backends: &[Arc<Backend>],
    value: impl Fn(&Backend) -> u64,
) -> Result<(), std::fmt::Error> {
    let mut m = encoder.encode_descriptor(name, help, None, kind)?;
    for b in backends {
        let labels = [("backend", b.name().to_string())];
        let family = m.encode_family(&labels)?;
        match kind {
            MetricType::Counter => ConstCounter::new(value(b)).encode(family)?,
            _ => ConstGauge::new(value(b) as i64).encode(family)?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn sources(stats: Arc<Stats>, backends: Vec<Arc<Backend>>) -> Sources {
        let list: Arc<[Arc<Backend>]> = backends.into();
        Sources {
            stats,
            backends: Arc::new(move || Arc::clone(&list)),
            queued: Arc::new(|| 3),
            max_workers: 4096,
            limiter: Arc::new(|| Some((5, 65536))),
        }
    }

    #[test]
    fn every_counter_of_the_table_is_rendered_with_its_help() {
        let stats = Arc::new(Stats::default());
        Stats::add(&stats.accepted, 7);
        let a = Arc::new(Backend::new("127.0.0.1:8001".into(), vec![], 1));
        let b = Arc::new(Backend::new("127.0.0.1:8002".into(), vec![], 1));
        b.set_healthy(false);
        let a2 = Arc::clone(&a);
        let _held = a2.start_connection();
        stats
            .histograms
            .queue_wait
            .observe(Duration::from_micros(30));
        let text = render(&sources(Arc::clone(&stats), vec![a, b]));
        assert!(
            text.contains("# HELP rodizio_accepted_total Connections accepted from clients."),
            "{text}"
        );
        assert!(text.contains("\nrodizio_accepted_total 7\n"), "{text}");
        assert!(text.contains("# TYPE rodizio_active gauge"), "{text}");
        assert!(text.contains("rodizio_queue_depth 3"), "{text}");
        assert!(
            text.contains("rodizio_backend_connections_active{backend=\"127.0.0.1:8001\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("rodizio_backend_connections_total{backend=\"127.0.0.1:8001\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("rodizio_backend_up{backend=\"127.0.0.1:8002\",state=\"down\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("rodizio_backend_up{backend=\"127.0.0.1:8002\",state=\"up\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("rodizio_queue_wait_seconds_bucket{le=\"0.0001\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("rodizio_queue_wait_seconds_count 1"),
            "{text}"
        );
        assert!(
            text.contains("rodizio_queue_wait_seconds_bucket{le=\"+Inf\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("rodizio_rate_limit_capacity 65536"), "{text}");
        assert!(
            text.contains(&format!(
                "rodizio_build_info{{version=\"{}\"}} 1",
                env!("CARGO_PKG_VERSION")
            )),
            "{text}"
        );
        for entry in stats.snapshot().entries() {
            assert!(
                text.contains(&format!("rodizio_{}", entry.name)),
                "{} missing",
                entry.name
            );
        }
    }

    /// Buckets are cumulated once: each `le` line counts the observations
    /// at or below its bound, and `+Inf` is `_count`, for every histogram.
    #[test]
    fn histogram_buckets_are_cumulated_once() {
        let stats = Arc::new(Stats::default());
        for (_, _, h) in stats.histograms.entries() {
            for d in [50, 3000, 3000, 120_000_000] {
                h.observe(Duration::from_micros(d));
            }
        }
        let text = render(&sources(Arc::clone(&stats), vec![]));
        for (name, _, _) in stats.histograms.entries() {
            for (le, n) in [
                ("0.0001", 1),
                ("0.0025", 1),
                ("0.005", 3),
                ("1", 3),
                ("60", 3),
                ("+Inf", 4),
            ] {
                let line = format!("rodizio_{name}_bucket{{le=\"{le}\"}} {n}\n");
                assert!(text.contains(&line), "{line}{text}");
            }
            let count = format!("rodizio_{name}_count 4\n");
            assert!(text.contains(&count), "{count}{text}");
            assert_eq!(
                text.matches(&format!("rodizio_{name}_bucket{{le=\"+Inf\"}}"))
                    .count(),
                1
            );
        }
    }
}
