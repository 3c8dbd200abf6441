//! One table of counters and gauges: what the balancer did, for logs, tests
//! and metrics.
//!
//! Each one is written once, in the `counters!` table below, with its help
//! text and its kind; the table makes the live [`Stats`] (atomics), the
//! [`StatsSnapshot`] (plain numbers) and [`StatsSnapshot::entries`] (name,
//! help, kind and value of each, for anything that lists them all). A
//! counter added to the table shows up everywhere.
//!
//! Every value is an atomic, with no lock on the hot path. Counters are
//! raised with `Release` and a snapshot reads them with `Acquire`, in table
//! order, so one that sees a connection `completed` also sees how it ended
//! and its bytes, which are counted just before (on x86 these are the same
//! instructions as `Relaxed`). Gauges that
//! go up and down around a span of work are held by a [`GaugeGuard`], so
//! whatever ends the span (a panic included) takes it down again.
//!
//! # Corresponds to the C article
//!
//! No C counterpart; the C prints `### REQUEST FINISHED ###` per request.

use std::sync::atomic::{AtomicU64, Ordering};

/// Whether a value only grows or goes up and down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only grows (connections accepted, bytes).
    Counter,
    /// Goes up and down (connections active now).
    Gauge,
}

/// One entry of the table, for listings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The field's name (`accepted`).
    pub name: &'static str,
    /// What it counts, one sentence.
    pub help: &'static str,
    /// Counter or gauge.
    pub kind: Kind,
    /// Its value in the snapshot.
    pub value: u64,
}

macro_rules! counters {
    ($( #[doc = $help:literal] $name:ident : $kind:ident, )*) => {
        /// Live counters, shared by the accept loop, the pool and the
        /// workers.
        #[derive(Debug, Default)]
        pub struct Stats {
            $( #[doc = $help] pub $name: AtomicU64, )*
            /// Distributions of durations (queue wait, connection, check).
            pub histograms: Histograms,
            /// The services' own counters (see [`Stats::child`]), added
            /// into every snapshot of this one.
            children: parking_lot::Mutex<Vec<std::sync::Arc<Stats>>>,
        }

        /// A copy of [`Stats`] at one moment.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct StatsSnapshot {
            $( #[doc = $help] pub $name: u64, )*
        }

        /// The values of the table that are the whole process's, raised in its
/// own table only (the pool, the drain, reloads, the admin API); every
/// other value is a service's, raised in that service's table.
pub const PROCESS_WIDE: &[&str] = &[
    "workers",
    "workers_busy",
    "worker_panics",
    "worker_spawn_failures",
    "descriptor_waits",
    "drain_cut",
    "reloads_ok",
    "reloads_failed",
    "admin_slow_bodies",
    "admin_connections_refused",
    "admin_idle_closes",
    "admin_evictions",
];

impl Stats {
    /// A new table of counters whose values are added into every
    /// snapshot of this one: a service's, under the process's. Each
    /// counter is raised in one table only, so nothing is counted twice.
    pub fn child(&self) -> std::sync::Arc<Stats> {
        let child = std::sync::Arc::new(Stats::default());
        self.children.lock().push(std::sync::Arc::clone(&child));
        child
    }

    /// The histograms, this table's and its children's added up.
    pub fn histogram_snapshots(&self) -> Vec<(&'static str, &'static str, HistogramSnapshot)> {
        let children = self.children.lock();
        self.histograms
            .entries()
            .into_iter()
            .enumerate()
            .map(|(i, (name, help, h))| {
                let mut snap = h.snapshot();
                for child in children.iter() {
                    snap.add(&child.histograms.entries()[i].2.snapshot());
                }
                (name, help, snap)
            })
            .collect()
    }

            /// Reads every value: this table's own, plus its children's.
            pub fn snapshot(&self) -> StatsSnapshot {
                let mut all = self.own();
                for child in self.children.lock().iter() {
                    all.add(&child.own());
                }
                all
            }

            /// Reads this table's own values, without its children's.
            pub fn own(&self) -> StatsSnapshot {
                StatsSnapshot {
                    $( $name: self.$name.load(Ordering::Acquire), )*
                }
            }
        }

        impl StatsSnapshot {
            /// Adds `other`'s values to these.
            pub fn add(&mut self, other: &StatsSnapshot) {
                $( self.$name += other.$name; )*
            }

            /// Every value with its name, help text and kind, in table order.
            pub fn entries(&self) -> Vec<Entry> {
                vec![$(
                    Entry {
                        name: stringify!($name),
                        help: $help.trim(),
                        kind: Kind::$kind,
                        value: self.$name,
                    },
                )*]
            }
        }
    };
}

counters! {
    /// Connections accepted from clients.
    accepted: Counter,
    /// Connections being proxied now.
    active: Gauge,
    /// Connections that were proxied and ended (cleanly or not).
    completed: Counter,
    /// Proxied connections that did not end with both sides closing: a reset, a failed write, a timeout or an error (the ended_* counters tell which).
    errors: Counter,
    /// Backend connect attempts that failed (each try of a fail-over counts).
    connect_failures: Counter,
    /// Clients closed because no backend could be reached or none was up.
    no_backend: Counter,
    /// Clients refused by the rate limiter.
    rate_limited: Counter,
    /// Clients refused by the allow and deny lists.
    denied: Counter,
    /// Clients refused because their address had as many connections open as the per-client cap allows (or the table of addresses was full).
    too_many_connections: Counter,
    /// Errors returned by accept(2).
    accept_errors: Counter,
    /// Bytes sent from clients to backends.
    bytes_to_backends: Counter,
    /// Bytes sent from backends to clients.
    bytes_to_clients: Counter,
    /// Worker threads alive now.
    workers: Gauge,
    /// Worker threads serving a connection now.
    workers_busy: Gauge,
    /// Panics caught while a worker served a connection.
    worker_panics: Counter,
    /// Worker threads that could not be started (resource limits).
    worker_spawn_failures: Counter,
    /// Connections handed to the kernel relay after their exchanges on the copy pump (kernel_relay).
    kernel_relayed: Counter,
    /// Connections due for the kernel relay that stayed on (or came back to) the copy pump: the program did not load, a socket could not be inserted, or the backlog bound.
    kernel_relay_fallbacks: Counter,
    /// Clients closed unserved after waiting longer than queue_timeout for a worker or a backend slot.
    queue_timeouts: Counter,
    /// Clients waiting now for a slot under the backends' max_connections (the service's queue).
    queued: Gauge,
    /// Clients refused because every backend was at its max_connections and max_queue clients waited already.
    queue_full: Counter,
    /// Times accept(2) or a backend connect found no file descriptor left (EMFILE, ENFILE).
    out_of_descriptors: Counter,
    /// Active health checks that failed for a reason of this host (no file descriptor, memory, buffer or local port left): not counted against the backend.
    health_check_local_failures: Counter,
    /// Workers waiting now for a file descriptor to connect to a backend (the accept loop holds off meanwhile).
    descriptor_waits: Gauge,
    /// Clients closed unserved for sending nothing within client_first_byte_timeout.
    first_byte_timeouts: Counter,
    /// Connections still open when the drain timeout ended them.
    drain_cut: Counter,
    /// Proxied connections that ended with both sides closed, the client first.
    ended_client_closed: Counter,
    /// Proxied connections that ended with both sides closed, the backend first.
    ended_backend_closed: Counter,
    /// Proxied connections ended by a reset from the client.
    ended_client_reset: Counter,
    /// Proxied connections ended by a reset from the backend.
    ended_backend_reset: Counter,
    /// Proxied connections closed after the idle timeout with both sides open.
    ended_idle_timeout: Counter,
    /// Proxied connections closed after the fin timeout: one side had closed, the other stayed silent.
    ended_fin_timeout: Counter,
    /// Proxied connections ended by a failed write toward the client (other than a reset).
    ended_client_write_failed: Counter,
    /// Proxied connections ended on purpose through the admin API (DELETE /connections/{id}, or a backend's connections), or by the drain's spread.
    ended_killed: Counter,
    /// Proxied connections closed because their backend was marked DOWN (on_backend_down: close).
    ended_killed_down: Counter,
    /// Proxied connections closed because their backend was removed (on_backend_removed: close, or removed_drain_timeout).
    ended_killed_removed: Counter,
    /// Proxied connections closed at their max_connection_lifetime.
    ended_max_lifetime: Counter,
    /// Proxied connections handed to a new process (upgrade_socket), which carries them on.
    ended_handed_over: Counter,
    /// Proxied connections ended by a failed write toward the backend (other than a reset).
    ended_backend_write_failed: Counter,
    /// Proxied connections ended by another error (a read error, or the pump's own buffers, pipes or poll).
    ended_error: Counter,
    /// Reloads of the config file that were applied.
    reloads_ok: Counter,
    /// Reloads of the config file refused (a bad file): nothing changed.
    reloads_failed: Counter,
    /// Clients closed for their PROXY protocol header: an untrusted peer, a malformed or oversized header, or none in time.
    proxy_header_refused: Counter,
    /// Access log lines dropped because the writer fell behind.
    access_log_dropped: Counter,
    /// Admin API requests whose body did not come within the 2 s deadline (answered 408).
    admin_slow_bodies: Counter,
    /// Admin API connections refused because the most it serves at once were open (answered 503).
    admin_connections_refused: Counter,
    /// Admin API connections closed because no byte moved either way for 15 s (a client that stopped reading, say).
    admin_idle_closes: Counter,
    /// Admin API connections closed while they waited for a request head, the oldest first, to make room for a new one when the most it serves at once were open (a flood of slow heads cannot keep the operator out).
    admin_evictions: Counter,
    /// TLS handshakes finished with clients (services with tls_certs).
    tls_handshakes: Counter,
    /// TLS handshakes that did not finish within tls_handshake_timeout.
    tls_handshake_failures_timeout: Counter,
    /// TLS handshakes the client closed or reset before they finished.
    tls_handshake_failures_closed: Counter,
    /// TLS handshakes whose client did not speak TLS (a plain request, garbage).
    tls_handshake_failures_not_tls: Counter,
    /// TLS handshakes with no version, cipher suite or group in common.
    tls_handshake_failures_incompatible: Counter,
    /// TLS handshakes the client refused with an alert (our certificate, say).
    tls_handshake_failures_refused: Counter,
    /// TLS handshakes whose client certificate was missing or not trusted (tls_client_ca).
    tls_handshake_failures_client_certificate: Counter,
    /// TLS handshakes that broke the protocol in another way.
    tls_handshake_failures_protocol: Counter,
    /// TLS handshakes refused because no certificate covers the client's server name, or it sent none (tls_strict_sni).
    tls_handshake_failures_unknown_name: Counter,
    /// TLS handshakes and SNI peeks closed, the one stalled longest first, to make room for a new client at tls_max_pending.
    tls_pending_closed: Counter,
    /// Rate-limit checks the shared store (Redis) could not answer in time; decided by --rate-limit-store-failure.
    rate_limit_store_failures: Counter,
    /// SNI routing: ClientHellos whose name matched a service's server_names.
    sni_matched: Counter,
    /// SNI routing: ClientHellos whose name matched no service, taken by the default service.
    sni_default: Counter,
    /// SNI routing: ClientHellos without a server name.
    sni_no_sni: Counter,
    /// SNI routing: clients whose first bytes were not a TLS ClientHello (or one cut short, or over 16 KiB in one record or several).
    sni_not_tls: Counter,
    /// SNI routing: clients with no complete ClientHello within sni_timeout (those that began one are closed).
    sni_timeout: Counter,
    /// SNI routing: clients closed because no service took them (no match and no default).
    sni_refused: Counter,
}

impl Stats {
    /// Adds one to a counter. `Release`, with the snapshot's `Acquire`
    /// loads: a snapshot that sees this change also sees what the same
    /// thread did before it to the counters later in the table.
    pub(crate) fn incr(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Release);
    }

    /// Adds `n` to a counter.
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        if n != 0 {
            counter.fetch_add(n, Ordering::Release);
        }
    }

    /// Raises `gauge` now and lowers it when the guard is dropped, however
    /// the holder ends (a panic unwinds through the drop too).
    pub fn hold<'a>(&self, gauge: &'a AtomicU64) -> GaugeGuard<'a> {
        gauge.fetch_add(1, Ordering::Release);
        GaugeGuard(gauge)
    }
}

/// Lowers its gauge by one when dropped. See [`Stats::hold`].
#[derive(Debug)]
pub struct GaugeGuard<'a>(&'a AtomicU64);

impl Drop for GaugeGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

/// Upper bounds of the duration buckets, in seconds: from 100 µs (a
/// connection on loopback) to a minute (a long download, a slow check).
pub const DURATION_BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 10.0, 60.0,
];

/// A distribution of durations in fixed buckets ([`DURATION_BUCKETS`]),
/// lock-free: one observation is a short scan of the bounds and three
/// relaxed atomic additions, so workers never wait on each other.
#[derive(Debug, Default)]
pub struct Histogram {
    /// Observations per bucket (not cumulative); the last one is "+Inf".
    counts: [AtomicU64; DURATION_BUCKETS.len() + 1],
    /// Sum of the observations, in nanoseconds.
    sum_nanos: AtomicU64,
}

/// A copy of a [`Histogram`]: how many observations fell in each bucket,
/// each bucket on its own.
///
/// Not cumulative, on purpose: Prometheus's `le` buckets are cumulative
/// (each counts everything at or below its bound), and the one place that
/// adds them up is the encoder of `/metrics` (`prometheus-client`'s
/// `encode_histogram` takes counts per bucket and cumulates them itself).
/// Cumulating here as well once made `le="60"` read 224 after 20
/// connections. A reader that wants "at or below" adds them up itself.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// `(upper bound in seconds, observations in this bucket alone)`: an
    /// observation is in the first bucket whose bound is at or above it.
    /// The last bound is `f64::INFINITY` (Prometheus's "+Inf").
    pub per_bucket: Vec<(f64, u64)>,
    /// Number of observations: the sum of `per_bucket`.
    pub count: u64,
    /// Sum of the observations, in seconds.
    pub sum: f64,
}

impl HistogramSnapshot {
    /// Adds `other`'s observations to these (same buckets).
    pub fn add(&mut self, other: &HistogramSnapshot) {
        for (mine, theirs) in self.per_bucket.iter_mut().zip(&other.per_bucket) {
            mine.1 += theirs.1;
        }
        self.count += other.count;
        self.sum += other.sum;
    }
}

impl Histogram {
    /// Records one duration.
    pub fn observe(&self, d: std::time::Duration) {
        let secs = d.as_secs_f64();
        let i = DURATION_BUCKETS
            .iter()
            .position(|&bound| secs <= bound)
            .unwrap_or(DURATION_BUCKETS.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Reads the buckets. Each is read once and `count` is their sum, so
    /// the copy is consistent with itself even while workers observe (a
    /// concurrent observation may be in the count and not yet in the sum,
    /// which Prometheus tolerates).
    pub fn snapshot(&self) -> HistogramSnapshot {
        let bounds = DURATION_BUCKETS.iter().chain([&f64::INFINITY]);
        let per_bucket: Vec<(f64, u64)> = bounds
            .zip(&self.counts)
            .map(|(bound, n)| (*bound, n.load(Ordering::Relaxed)))
            .collect();
        HistogramSnapshot {
            count: per_bucket.iter().map(|(_, n)| n).sum(),
            per_bucket,
            sum: self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

/// The distributions the balancer keeps.
#[derive(Debug, Default)]
pub struct Histograms {
    /// Time from accept to a worker taking the client.
    pub queue_wait: Histogram,
    /// Time from accept to the end of a proxied connection.
    pub connection_duration: Histogram,
    /// Time one active health check took.
    pub health_check: Histogram,
}

impl Histograms {
    /// Each histogram with its name and help, for listings.
    pub fn entries(&self) -> [(&'static str, &'static str, &Histogram); 3] {
        [
            (
                "queue_wait_seconds",
                "Time from accept to a worker taking the client.",
                &self.queue_wait,
            ),
            (
                "connection_duration_seconds",
                "Time from accept to the end of a proxied connection.",
                &self.connection_duration,
            ),
            (
                "health_check_duration_seconds",
                "Time one active health check took.",
                &self.health_check,
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::panic::{catch_unwind, AssertUnwindSafe};

    #[test]
    fn the_table_lists_every_value_once_with_its_help() {
        let stats = Stats::default();
        Stats::incr(&stats.accepted);
        Stats::add(&stats.bytes_to_clients, 612);
        let entries = stats.snapshot().entries();
        let accepted = entries.iter().find(|e| e.name == "accepted").unwrap();
        assert_eq!(accepted.value, 1);
        assert_eq!(accepted.help, "Connections accepted from clients.");
        assert_eq!(accepted.kind, Kind::Counter);
        let bytes = entries
            .iter()
            .find(|e| e.name == "bytes_to_clients")
            .unwrap();
        assert_eq!(bytes.value, 612);
        let active = entries.iter().find(|e| e.name == "active").unwrap();
        assert_eq!(active.kind, Kind::Gauge);
        let mut names: Vec<_> = entries.iter().map(|e| e.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), entries.len());
        assert!(entries.iter().all(|e| !e.help.is_empty()));
    }

    #[test]
    fn histogram_buckets_count_each_observation_in_one_bucket() {
        use std::time::Duration;
        let h = Histogram::default();
        h.observe(Duration::from_micros(50)); // first bucket
        h.observe(Duration::from_micros(100)); // on the bound: still first
        h.observe(Duration::from_millis(3)); // 0.005
        h.observe(Duration::from_secs(120)); // +Inf
        let s = h.snapshot();
        assert_eq!(s.count, 4);
        assert_eq!(s.per_bucket.len(), DURATION_BUCKETS.len() + 1);
        let at = |bound: f64| s.per_bucket.iter().find(|(b, _)| *b == bound).unwrap().1;
        assert_eq!(at(0.0001), 2);
        assert_eq!(at(0.0025), 0);
        assert_eq!(at(0.005), 1);
        assert_eq!(at(60.0), 0);
        assert_eq!(at(f64::INFINITY), 1);
        assert_eq!(s.per_bucket.iter().map(|(_, n)| n).sum::<u64>(), s.count);
        assert!((s.sum - 120.00315).abs() < 1e-6, "{}", s.sum);
        assert!(s.per_bucket.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn a_gauge_guard_comes_down_even_through_a_panic() {
        let stats = Stats::default();
        {
            let _a = stats.hold(&stats.active);
            let _b = stats.hold(&stats.active);
            assert_eq!(stats.snapshot().active, 2);
        }
        assert_eq!(stats.snapshot().active, 0);
        let result = catch_unwind(AssertUnwindSafe(|| {
            let _held = stats.hold(&stats.active);
            panic!("inside the span");
        }));
        assert!(result.is_err());
        assert_eq!(stats.snapshot().active, 0);
    }
}
