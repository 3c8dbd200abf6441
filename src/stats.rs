//! One table of counters and gauges: what the balancer did, for logs, tests
//! and metrics.
//!
//! Each one is written once, in the `counters!` table below, with its help
//! text and its kind; the table makes the live [`Stats`] (atomics), the
//! [`StatsSnapshot`] (plain numbers) and [`StatsSnapshot::entries`] (name,
//! help, kind and value of each, for anything that lists them all). A
//! counter added to the table shows up everywhere.
//!
//! Every value is an atomic updated with `Relaxed` ordering: each is
//! independent, nobody derives a decision from two of them at once, so no
//! stronger ordering (and no lock) is needed on the hot path. Gauges that
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
        }

        /// A copy of [`Stats`] at one moment.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct StatsSnapshot {
            $( #[doc = $help] pub $name: u64, )*
        }

        impl Stats {
            /// Reads every value.
            pub fn snapshot(&self) -> StatsSnapshot {
                StatsSnapshot {
                    $( $name: self.$name.load(Ordering::Relaxed), )*
                }
            }
        }

        impl StatsSnapshot {
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
    /// Proxied connections that ended on an error or the idle timeout.
    errors: Counter,
    /// Backend connect attempts that failed (each try of a fail-over counts).
    connect_failures: Counter,
    /// Clients closed because no backend could be reached or none was up.
    no_backend: Counter,
    /// Clients refused by the rate limiter.
    rate_limited: Counter,
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
}

impl Stats {
    /// Adds one to a counter.
    pub(crate) fn incr(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds `n` to a counter.
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        if n != 0 {
            counter.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Raises `gauge` now and lowers it when the guard is dropped, however
    /// the holder ends (a panic unwinds through the drop too).
    pub fn hold<'a>(&self, gauge: &'a AtomicU64) -> GaugeGuard<'a> {
        gauge.fetch_add(1, Ordering::Relaxed);
        GaugeGuard(gauge)
    }
}

/// Lowers its gauge by one when dropped. See [`Stats::hold`].
#[derive(Debug)]
pub struct GaugeGuard<'a>(&'a AtomicU64);

impl Drop for GaugeGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
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
