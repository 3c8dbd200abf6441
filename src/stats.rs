//! Counters of what the balancer did, for logs, tests and metrics.
//!
//! Every field is an atomic updated with `Relaxed` ordering: each counter is
//! independent, nobody derives a decision from two of them at once, so no
//! stronger ordering (and no lock) is needed on the hot path.
//!
//! # Corresponds to the C article
//!
//! No C counterpart; the C prints `### REQUEST FINISHED ###` per request.

use std::sync::atomic::{AtomicU64, Ordering};

/// Live counters, shared by the accept loop and the workers.
#[derive(Debug, Default)]
pub struct Stats {
    /// Connections accepted from clients.
    pub accepted: AtomicU64,
    /// Connections being proxied now.
    pub active: AtomicU64,
    /// Connections that were proxied and ended (cleanly or not).
    pub completed: AtomicU64,
    /// Proxied connections that ended on an error or the idle timeout.
    pub errors: AtomicU64,
    /// Backend connect attempts that failed (each try of a fail-over counts).
    pub connect_failures: AtomicU64,
    /// Clients closed because no backend could be reached or none was up.
    pub no_backend: AtomicU64,
    /// Clients refused by the rate limiter.
    pub rate_limited: AtomicU64,
    /// Errors returned by `accept(2)`.
    pub accept_errors: AtomicU64,
    /// Bytes sent from clients to backends.
    pub bytes_to_backends: AtomicU64,
    /// Bytes sent from backends to clients.
    pub bytes_to_clients: AtomicU64,
}

/// A copy of [`Stats`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// See [`Stats::accepted`].
    pub accepted: u64,
    /// See [`Stats::active`].
    pub active: u64,
    /// See [`Stats::completed`].
    pub completed: u64,
    /// See [`Stats::errors`].
    pub errors: u64,
    /// See [`Stats::connect_failures`].
    pub connect_failures: u64,
    /// See [`Stats::no_backend`].
    pub no_backend: u64,
    /// See [`Stats::rate_limited`].
    pub rate_limited: u64,
    /// See [`Stats::accept_errors`].
    pub accept_errors: u64,
    /// See [`Stats::bytes_to_backends`].
    pub bytes_to_backends: u64,
    /// See [`Stats::bytes_to_clients`].
    pub bytes_to_clients: u64,
}

impl Stats {
    /// Adds one to a counter.
    pub(crate) fn incr(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Reads every counter.
    pub fn snapshot(&self) -> StatsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            accepted: get(&self.accepted),
            active: get(&self.active),
            completed: get(&self.completed),
            errors: get(&self.errors),
            connect_failures: get(&self.connect_failures),
            no_backend: get(&self.no_backend),
            rate_limited: get(&self.rate_limited),
            accept_errors: get(&self.accept_errors),
            bytes_to_backends: get(&self.bytes_to_backends),
            bytes_to_clients: get(&self.bytes_to_clients),
        }
    }
}
