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
//! The standard `process_*` series (`process.rs`) come with it, under the
//! names every exporter gives them.
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
use crate::running::Running;
use crate::stats::{Entry, Kind, Stats, StatsSnapshot, PROCESS_WIDE};

/// What the metrics are read from; cheap to clone (reference counts and
/// closures over them).
#[derive(Clone)]
pub struct Sources {
    /// The process's counters (every service's added).
    pub stats: Arc<Stats>,
    /// The services: their counters, backends and limiters.
    pub running: Arc<Running>,
    /// Clients waiting in the queue now.
    pub queued: Arc<dyn Fn() -> usize + Send + Sync>,
    /// The most worker threads (`workers`).
    pub max_workers: usize,
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
    let mut registry = Registry::default();
    registry
        .sub_registry_with_prefix("rodizio")
        .register_collector(Box::new(View(sources.clone())));
    // The standard names, with no prefix.
    registry.register_collector(Box::new(super::process::Process));
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
        let services = s.running.list();
        let snapshot = s.stats.snapshot();
        counters(&mut encoder, &snapshot, &services)?;
        let overall = [
            (
                "queue_depth",
                "Clients waiting in the queue for a worker now.",
                (s.queued)(),
            ),
            (
                "workers_max",
                "The most worker threads (workers).",
                s.max_workers,
            ),
            (
                "workers_idle",
                "Worker threads alive and waiting for a client now.",
                snapshot.workers.saturating_sub(snapshot.workers_busy) as usize,
            ),
        ];
        for (name, help, value) in overall {
            gauge(&mut encoder, name, help, value as i64)?;
        }
        per_service_gauges(&mut encoder, &services)?;
        let lists: Vec<(&str, Arc<[Arc<Backend>]>)> = services
            .iter()
            .map(|x| (x.name(), x.live.scheduler.snapshot()))
            .collect();
        for &(name, help, kind, value) in PER_BACKEND {
            per_backend(&mut encoder, name, help, kind, &lists, value)?;
        }
        backend_up(&mut encoder, &lists)?;
        backend_last_change(&mut encoder, &lists)?;
        backend_errors(&mut encoder, &lists)?;
        discovery(&mut encoder, &lists)?;
        certificate_expiry(&mut encoder, &services)?;
        let histograms: Vec<_> = services
            .iter()
            .map(|x| (x.name(), x.stats.histogram_snapshots()))
            .collect();
        for (i, (name, help, _)) in s.stats.histogram_snapshots().into_iter().enumerate() {
            let mut m = encoder.encode_descriptor(name, help, None, MetricType::Histogram)?;
            for (service, all) in &histograms {
                let snap = &all[i].2;
                let labels = [("service", service.to_string())];
                // The encoder takes counts per bucket and writes them
                // cumulated (the `le` lines): the snapshot's are per
                // bucket, so they are added up here once, by the encoder.
                m.encode_family(&labels)?.encode_histogram::<NoLabelSet>(
                    snap.sum,
                    snap.count,
                    &snap.per_bucket,
                    None,
                )?;
            }
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

/// Seconds until each served certificate's `notAfter` (negative once
/// expired), labelled `service` and `certificate` (its file); nothing
/// when no service terminates TLS.
fn certificate_expiry(
    encoder: &mut DescriptorEncoder,
    services: &[Arc<crate::service::Service>],
) -> Result<(), std::fmt::Error> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let all: Vec<(&str, Arc<crate::tls_term::Terminator>)> = services
        .iter()
        .filter_map(|x| x.live.tls.as_ref().map(|t| (x.name(), t.load_full())))
        .collect();
    if all.iter().all(|(_, t)| t.expiry().is_empty()) {
        return Ok(());
    }
    let mut m = encoder.encode_descriptor(
        "tls_certificate_expiry_seconds",
        "Seconds until each served certificate's notAfter (negative once expired).",
        None,
        MetricType::Gauge,
    )?;
    for (service, term) in &all {
        for cert in term.expiry() {
            let Some(not_after) = cert.not_after else {
                continue;
            };
            let labels = [
                ("service", service.to_string()),
                ("certificate", cert.file.clone()),
            ];
            ConstGauge::new(not_after - now).encode(m.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

/// Every value of the counters' table: the process's without labels,
/// the others once per service, labelled `service`.
fn counters(
    encoder: &mut DescriptorEncoder,
    snapshot: &StatsSnapshot,
    services: &[Arc<crate::service::Service>],
) -> Result<(), std::fmt::Error> {
    // Each service's values once, in the table's order, as `entries` is.
    let per_service: Vec<(&str, Vec<Entry>)> = services
        .iter()
        .map(|x| (x.name(), x.stats.own().entries()))
        .collect();
    for (i, entry) in snapshot.entries().into_iter().enumerate() {
        let kind = match entry.kind {
            Kind::Counter => MetricType::Counter,
            Kind::Gauge => MetricType::Gauge,
        };
        let mut m = encoder.encode_descriptor(entry.name, entry.help, None, kind)?;
        if PROCESS_WIDE.contains(&entry.name) {
            value(m, kind, entry.value)?;
            continue;
        }
        for (name, own) in &per_service {
            let labels = [("service", name.to_string())];
            value(m.encode_family(&labels)?, kind, own[i].value)?;
        }
    }
    Ok(())
}

/// One value as a counter or a gauge.
fn value(
    encoder: prometheus_client::encoding::MetricEncoder,
    kind: MetricType,
    v: u64,
) -> Result<(), std::fmt::Error> {
    match kind {
        MetricType::Counter => ConstCounter::new(v).encode(encoder),
        _ => ConstGauge::new(v as i64).encode(encoder),
    }
}

/// Per service: its clients held under `max_connections` and its limit,
/// and its rate limiter's tracked clients and capacity, when on.
fn per_service_gauges(
    encoder: &mut DescriptorEncoder,
    services: &[Arc<crate::service::Service>],
) -> Result<(), std::fmt::Error> {
    type Read = fn(&crate::service::Service) -> Option<usize>;
    let series: [(&str, &str, Read); 4] = [
        (
            "service_connections_held",
            "Clients of the service held now, queued or served (with max_connections).",
            |x| x.slots.as_ref().map(|s| s.held()),
        ),
        (
            "service_max_connections",
            "The service's max_connections.",
            |x| x.slots.as_ref().map(|s| s.limit()),
        ),
        (
            "rate_limit_clients",
            "Client IPs the rate limiter tracks now.",
            |x| x.live.limiter.load().as_ref().map(|l| l.len()),
        ),
        (
            "rate_limit_capacity",
            "Most client IPs the rate limiter can track.",
            |x| x.live.limiter.load().as_ref().map(|l| l.capacity()),
        ),
    ];
    for (name, help, read) in series {
        let values: Vec<(&str, usize)> = services
            .iter()
            .filter_map(|x| read(x).map(|v| (x.name(), v)))
            .collect();
        if values.is_empty() {
            continue;
        }
        let mut m = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
        for (service, v) in values {
            let labels = [("service", service.to_string())];
            ConstGauge::new(v as i64).encode(m.encode_family(&labels)?)?;
        }
    }
    Ok(())
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
        "backend_weight",
        "The backend's weight now (the config's, or the admin API's since).",
        MetricType::Gauge,
        |b| u64::from(b.weight()),
    ),
    (
        "backend_max_connections",
        "The backend's max_connections (0: no cap).",
        MetricType::Gauge,
        |b| b.max_connections().unwrap_or(0) as u64,
    ),
    (
        "backend_connect_failures",
        "Connect attempts to the backend that failed.",
        MetricType::Counter,
        Backend::connect_failures_total,
    ),
    (
        "backend_resolve_failures",
        "Lookups of the backend's host name that failed (its last addresses stayed).",
        MetricType::Counter,
        |b| b.addresses().failures(),
    ),
    (
        "backend_backup",
        "1 for a backup backend (served only while no primary is available), 0 for a primary.",
        MetricType::Gauge,
        |b| u64::from(b.is_backup()),
    ),
    (
        "backend_connections_peak",
        "The most connections the backend had at once.",
        MetricType::Gauge,
        |b| b.tally.peak(),
    ),
    (
        "backend_down_seconds",
        "Whole seconds the backend was down, ever (the current spell included).",
        MetricType::Counter,
        |b| b.tally.downtime().as_secs(),
    ),
];

/// `backend_errors`: per backend, connections that failed by kind
/// (`connect`, `reset`, `timeout`).
fn backend_errors(
    encoder: &mut DescriptorEncoder,
    lists: &[(&str, Arc<[Arc<Backend>]>)],
) -> Result<(), std::fmt::Error> {
    let mut m = encoder.encode_descriptor(
        "backend_errors",
        "Errors with the backend by kind: connect (a failed connect), reset (a connection ended by a reset), timeout (closed by the idle or fin timeout), killed_down and killed_removed (closed on purpose when it was marked DOWN or removed, by on_backend_down and on_backend_removed).",
        None,
        MetricType::Counter,
    )?;
    for (service, backends) in lists {
        for b in backends.iter() {
            let t = &b.tally;
            let kinds = [
                ("connect", b.connect_failures_total()),
                ("reset", t.resets()),
                ("timeout", t.timeouts()),
                ("killed_down", t.killed_down()),
                ("killed_removed", t.killed_removed()),
            ];
            for (kind, v) in kinds {
                let labels = [
                    ("service", service.to_string()),
                    ("backend", b.name().to_string()),
                    ("kind", kind.to_string()),
                ];
                ConstCounter::new(v).encode(m.encode_family(&labels)?)?;
            }
        }
    }
    Ok(())
}

/// Where the backends come from: the lookups and failed lookups of each
/// source (`dns`, `srv`, `etcd`) since start-up, and each service's
/// backends by origin now.
fn discovery(
    encoder: &mut DescriptorEncoder,
    lists: &[(&str, Arc<[Arc<Backend>]>)],
) -> Result<(), std::fmt::Error> {
    type Read = fn(&crate::lookup::SourceCount) -> u64;
    let read: [(&str, &str, Read); 2] = [
        (
            "discovery_lookups",
            "Lookups of backends by source: dns (a host name looked up again), srv (a srv: name's records), etcd.",
            |c| c.lookups(),
        ),
        (
            "discovery_errors",
            "Failed lookups of backends by source (the last good answer kept).",
            |c| c.errors(),
        ),
    ];
    for (name, help, value) in read {
        let mut m = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
        for (source, count) in crate::lookup::sources() {
            let labels = [("source", source.to_string())];
            ConstCounter::new(value(count)).encode(m.encode_family(&labels)?)?;
        }
    }
    let mut m = encoder.encode_descriptor(
        "backends_by_origin",
        "Backends now by where they came from: file, api, dns, srv, etcd.",
        None,
        MetricType::Gauge,
    )?;
    for (service, backends) in lists {
        for origin in crate::backend::Origin::ALL {
            let n = backends.iter().filter(|b| b.origin() == origin).count();
            let labels = [
                ("service", service.to_string()),
                ("origin", origin.name().to_string()),
            ];
            ConstGauge::new(n as i64).encode(m.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

/// `backend_up`: per backend, 1 for its current state and 0 for the others.
fn backend_up(
    encoder: &mut DescriptorEncoder,
    lists: &[(&str, Arc<[Arc<Backend>]>)],
) -> Result<(), std::fmt::Error> {
    let mut m = encoder.encode_descriptor(
        "backend_up",
        "1 for the backend's current state (up, down, draining, maint), 0 for the others.",
        None,
        MetricType::Gauge,
    )?;
    for (service, backends) in lists {
        for b in backends.iter() {
            let now = b.state_name();
            for st in ["up", "down", "draining", "maint"] {
                let labels = [
                    ("service", service.to_string()),
                    ("backend", b.name().to_string()),
                    ("state", st.to_string()),
                ];
                let value = i64::from(st == now);
                ConstGauge::new(value).encode(m.encode_family(&labels)?)?;
            }
        }
    }
    Ok(())
}

/// `backend_last_change_seconds`: per backend, when its state (up, down,
/// draining, maint) last changed, or it was added, in seconds since the
/// Unix epoch.
fn backend_last_change(
    encoder: &mut DescriptorEncoder,
    lists: &[(&str, Arc<[Arc<Backend>]>)],
) -> Result<(), std::fmt::Error> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let mut m = encoder.encode_descriptor(
        "backend_last_change_seconds",
        "When the backend's state last changed (or it was added), in seconds since the Unix epoch.",
        None,
        MetricType::Gauge,
    )?;
    for (service, backends) in lists {
        for b in backends.iter() {
            let labels = [
                ("service", service.to_string()),
                ("backend", b.name().to_string()),
            ];
            let at = now.saturating_sub(b.since_change()).as_secs_f64();
            // Whole milliseconds, as the backend keeps them.
            let at = (at * 1000.0).round() / 1000.0;
            ConstGauge::new(at).encode(m.encode_family(&labels)?)?;
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

/// One value per backend, labelled `service` and `backend`.
fn per_backend(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    lists: &[(&str, Arc<[Arc<Backend>]>)],
    read: impl Fn(&Backend) -> u64,
) -> Result<(), std::fmt::Error> {
    let mut m = encoder.encode_descriptor(name, help, None, kind)?;
    for (service, backends) in lists {
        for b in backends.iter() {
            let labels = [
                ("service", service.to_string()),
                ("backend", b.name().to_string()),
            ];
            value(m.encode_family(&labels)?, kind, read(b))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// One service, `default`, over `backends`; its counters.
    fn sources(backends: Vec<Arc<Backend>>) -> (Sources, Arc<Stats>) {
        let (running, stats) = crate::running::for_tests(vec![("default", backends)]);
        let service = running.list()[0].stats.clone();
        let sources = Sources {
            stats,
            running,
            queued: Arc::new(|| 3),
            max_workers: 4096,
        };
        (sources, service)
    }

    #[test]
    fn process_series_weight_and_last_change_are_rendered() {
        let a = Arc::new(Backend::new("127.0.0.1:8001".into(), vec![], 3));
        let (sources, _) = sources(vec![Arc::clone(&a)]);
        let text = render(&sources);
        for name in [
            "process_start_time_seconds",
            "process_open_fds",
            "process_max_fds",
            "process_resident_memory_bytes",
            "process_virtual_memory_bytes",
            "process_threads",
        ] {
            assert!(
                text.contains(&format!("# TYPE {name} gauge\n{name} ")),
                "{name}: {text}"
            );
        }
        assert!(
            text.contains("# TYPE process_cpu_seconds_total counter"),
            "{text}"
        );
        assert!(!text.contains("rodizio_process_"), "{text}");
        let weight = "rodizio_backend_weight{service=\"default\",backend=\"127.0.0.1:8001\"} 3\n";
        assert!(text.contains(weight), "{text}");
        a.set_weight(5);
        assert!(render(&sources).contains(&weight.replace("} 3", "} 5")));
        let line = text
            .lines()
            .find(|l| l.starts_with("rodizio_backend_last_change_seconds{"))
            .unwrap();
        let at: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!((now - at).abs() < 60.0, "{line} at {now}");
    }

    #[test]
    fn every_counter_of_the_table_is_rendered_with_its_help() {
        let a = Arc::new(Backend::new("127.0.0.1:8001".into(), vec![], 1));
        let b = Arc::new(Backend::new("127.0.0.1:8002".into(), vec![], 1));
        b.set_healthy(false);
        let a2 = Arc::clone(&a);
        let _held = a2.start_connection();
        a2.tally.note_active(a2.active());
        let (sources, stats) = sources(vec![a, b]);
        Stats::add(&stats.accepted, 7);
        Stats::add(&sources.stats.reloads_ok, 2);
        stats
            .histograms
            .queue_wait
            .observe(Duration::from_micros(30));
        let text = render(&sources);
        assert!(
            text.contains("# HELP rodizio_accepted_total Connections accepted from clients."),
            "{text}"
        );
        assert!(
            text.contains("\nrodizio_accepted_total{service=\"default\"} 7\n"),
            "{text}"
        );
        assert!(text.contains("\nrodizio_reloads_ok_total 2\n"), "{text}");
        assert!(text.contains("# TYPE rodizio_active gauge"), "{text}");
        assert!(text.contains("rodizio_queue_depth 3"), "{text}");
        assert!(
            text.contains("rodizio_backend_connections_active{service=\"default\",backend=\"127.0.0.1:8001\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("rodizio_backend_connections_total{service=\"default\",backend=\"127.0.0.1:8001\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("rodizio_backend_connections_peak{service=\"default\",backend=\"127.0.0.1:8001\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("rodizio_backend_errors_total{service=\"default\",backend=\"127.0.0.1:8001\",kind=\"reset\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE rodizio_backend_down_seconds_total counter"),
            "{text}"
        );
        assert!(
            text.contains("rodizio_backend_up{service=\"default\",backend=\"127.0.0.1:8002\",state=\"down\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "rodizio_backend_up{service=\"default\",backend=\"127.0.0.1:8002\",state=\"up\"} 0"
            ),
            "{text}"
        );
        assert!(
            text.contains("rodizio_queue_wait_seconds_bucket{service=\"default\",le=\"0.0001\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("rodizio_queue_wait_seconds_count{service=\"default\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("rodizio_queue_wait_seconds_bucket{service=\"default\",le=\"+Inf\"} 1\n"),
            "{text}"
        );
        // The limiter's series only while it is on.
        assert!(!text.contains("rodizio_rate_limit_capacity"), "{text}");
        let rate = crate::limiter::Rate::parse("10/1s").unwrap();
        let limiter = crate::limiter::Limiter::with_store(
            &crate::limiter::RateLimitConfig::new(rate),
            &crate::limiter::StoreConfig::default(),
            Arc::clone(&stats),
        )
        .unwrap();
        let capacity = limiter.capacity();
        let service = &sources.running.list()[0];
        service.live.limiter.store(Some(Arc::new(limiter)));
        let text = render(&sources);
        assert!(
            text.contains(&format!(
                "rodizio_rate_limit_capacity{{service=\"default\"}} {capacity}"
            )),
            "{text}"
        );
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
        let (sources, stats) = sources(vec![]);
        for (_, _, h) in stats.histograms.entries() {
            for d in [50, 3000, 3000, 120_000_000] {
                h.observe(Duration::from_micros(d));
            }
        }
        let text = render(&sources);
        for (name, _, _) in stats.histograms.entries() {
            for (le, n) in [
                ("0.0001", 1),
                ("0.0025", 1),
                ("0.005", 3),
                ("1", 3),
                ("60", 3),
                ("+Inf", 4),
            ] {
                let line =
                    format!("rodizio_{name}_bucket{{service=\"default\",le=\"{le}\"}} {n}\n");
                assert!(text.contains(&line), "{line}{text}");
            }
            let count = format!("rodizio_{name}_count{{service=\"default\"}} 4\n");
            assert!(text.contains(&count), "{count}{text}");
            assert_eq!(
                text.matches(&format!(
                    "rodizio_{name}_bucket{{service=\"default\",le=\"+Inf\"}}"
                ))
                .count(),
                1
            );
        }
    }
}
