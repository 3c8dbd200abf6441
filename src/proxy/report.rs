//! A connection's fate as one typed value, [`Outcome`], and [`Report`], the
//! one place an outcome becomes counters, an access log line, trace
//! sentences and a throttled log line. A new way for a connection to end
//! is one variant of [`Refusal`] and its rows in `refusal.rs`, or of the
//! pump's `End` and its rows in the tables below.
//!
//! Reporting has two halves, because their order is observable:
//! [`Report::count`] runs before the sockets close (whoever sees a
//! connection closed sees it counted; `completed` is raised last, then the
//! caller drops the active gauges), [`Report::tell`] after (the trace's
//! "close() on both sockets" is true when it is told).
//!
//! # Threads
//!
//! Workers report their connections and the clients they refuse; each
//! accept loop the clients it refuses, with a `Report` of its own.
//! Counters are atomics, the throttles lock-free, the access log a
//! non-blocking channel: nothing here locks.
//!
//! # Corresponds to the C article
//!
//! The `### REQUEST FINISHED ###` line at the end of `proxy_function()`.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::pump::{self, End};
use super::refusal::{refused_counter, whose, Refusals, Told};
pub(crate) use super::refusal::{Access, Refusal};
use super::BUSY_WARNING_EVERY;
use crate::access_log::{self, AccessLog};
use crate::backend::Backend;
use crate::connections::Kill;
use crate::stats::Stats;
use crate::throttle::{self, LogThrottle};
use crate::trace;

/// How one client connection ended, and what is known of it then.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// The client (after `--accept-proxy`, the one its header names).
    pub peer: SocketAddr,
    /// When the accept loop queued it.
    pub queued_at: Instant,
    /// Time in the queue before a worker took it.
    pub queue_wait: Duration,
    /// What happened to it.
    pub fate: Fate,
}

impl Outcome {
    /// A client accepted at `queued_at` from `peer` and refused by
    /// `refusal` before any worker waited on it.
    pub(crate) fn refused(peer: SocketAddr, queued_at: Instant, refusal: Refusal) -> Outcome {
        Outcome {
            peer,
            queued_at,
            queue_wait: Duration::ZERO,
            fate: Fate::Refused(refusal),
        }
    }
}

/// Refused before any backend, or served.
#[derive(Debug)]
pub(crate) enum Fate {
    /// Closed before any byte reached a backend.
    Refused(Refusal),
    /// Connected and pumped.
    Served(Served),
}

/// A connection a backend served.
#[derive(Debug)]
pub(crate) struct Served {
    /// The backend that served it.
    pub backend: Arc<Backend>,
    /// How the pump ended, and the bytes.
    pub pumped: pump::Pumped,
    /// Time spent connecting, failed tries included.
    pub connect_time: Duration,
    /// Failed connects before the one that served.
    pub failovers: u32,
    /// When the worker took the client.
    pub started: Instant,
    /// The client's TLS, when terminated here (boxed: nothing on the
    /// plain path's frames).
    pub tls: Option<Box<access_log::TlsNote>>,
}

/// The kind of error the backend's tally counts for `end`, if any.
fn error_kind(end: End) -> Option<crate::tally::ErrorKind> {
    use crate::tally::ErrorKind;
    match end {
        End::ClientReset | End::BackendReset => Some(ErrorKind::Reset),
        End::IdleTimeout | End::FinTimeout => Some(ErrorKind::Timeout),
        End::Killed(Kill::Down) => Some(ErrorKind::KilledDown),
        End::Killed(Kill::Removed) => Some(ErrorKind::KilledRemoved),
        _ => None,
    }
}

/// The `ended_*` counter of each way the pump ends.
pub(super) fn ended_counter(stats: &Stats, end: End) -> &AtomicU64 {
    match end {
        End::ClientClosed => &stats.ended_client_closed,
        End::BackendClosed => &stats.ended_backend_closed,
        End::ClientReset => &stats.ended_client_reset,
        End::BackendReset => &stats.ended_backend_reset,
        End::IdleTimeout => &stats.ended_idle_timeout,
        End::FinTimeout => &stats.ended_fin_timeout,
        End::WriteToClientFailed => &stats.ended_client_write_failed,
        End::WriteToBackendFailed => &stats.ended_backend_write_failed,
        End::Error => &stats.ended_error,
        End::Killed(Kill::Down) => &stats.ended_killed_down,
        End::Killed(Kill::Removed) => &stats.ended_killed_removed,
        End::Killed(Kill::MaxLifetime) => &stats.ended_max_lifetime,
        End::Killed(Kill::Killed | Kill::Drain) => &stats.ended_killed,
        End::Killed(Kill::Carried) => &stats.ended_handed_over,
    }
}

/// The counters, the access log and the throttled log lines of the
/// workers (one per service), or of one accept loop.
pub(crate) struct Report {
    stats: Arc<Stats>,
    access_log: Option<AccessLog>,
    /// The refusals' log lines, each at most once a second.
    refusals: Refusals,
    /// "Every worker is busy" at most once every 10 s.
    busy_log: LogThrottle,
    /// Connects that found no descriptor left, at most once a second.
    out_of_descriptors_log: LogThrottle,
    /// The service's name on access log lines, unless it is the one
    /// service of a flat configuration (`default`).
    service: Option<Arc<str>>,
}

impl Report {
    /// A reporter counting in `stats` and logging to `access_log`.
    pub(crate) fn new(stats: Arc<Stats>, access_log: Option<AccessLog>) -> Report {
        Report {
            stats,
            access_log,
            refusals: Refusals::new(),
            busy_log: LogThrottle::new(BUSY_WARNING_EVERY),
            out_of_descriptors_log: LogThrottle::new(Duration::from_secs(1)),
            service: None,
        }
    }

    /// The service's name as the connections' table shows it.
    pub(crate) fn service(&self) -> Option<Arc<str>> {
        self.service.clone()
    }

    /// ` of service NAME` after a client in a log line, when the service
    /// is named (not on a flat configuration's one service).
    pub(crate) fn whose(&self) -> String {
        whose(self.named())
    }

    /// The service's name, when it is named (not `default`).
    pub(crate) fn named(&self) -> Option<&str> {
        self.service.as_deref()
    }

    /// Names `service` on the access log lines (not `default`).
    pub(crate) fn for_service(self, service: &str) -> Report {
        Report {
            service: (service != crate::access_log::DEFAULT_SERVICE).then(|| service.into()),
            ..self
        }
    }

    /// Whether an access log is on.
    pub(crate) fn access_log(&self) -> Option<&AccessLog> {
        self.access_log.as_ref()
    }

    /// Counts `outcome`; called before its sockets close. For a served
    /// connection `completed` is raised last, and the caller drops the
    /// active gauges after: whoever sees it completed sees how it ended
    /// and its bytes too.
    pub(crate) fn count(&self, outcome: &Outcome) {
        // Off the table before the sockets close (a no-op when the
        // connection left it already, or on an accept loop).
        crate::connections::end();
        let stats = &*self.stats;
        match &outcome.fate {
            Fate::Refused(refusal) => {
                if let Some(counter) = refused_counter(stats, refusal) {
                    Stats::incr(counter);
                }
            }
            Fate::Served(served) => {
                let (end, transfer) = (served.pumped.end, served.pumped.transfer);
                stats
                    .histograms
                    .connection_duration
                    .observe(outcome.queued_at.elapsed());
                Stats::incr(ended_counter(stats, end));
                if !end.is_clean() && !matches!(end, End::Killed(_)) {
                    Stats::incr(&stats.errors);
                }
                if let Some(kind) = error_kind(end) {
                    served.backend.tally.error(kind);
                }
                Stats::add(&stats.bytes_to_backends, transfer.to_backend);
                Stats::add(&stats.bytes_to_clients, transfer.to_client);
                served
                    .backend
                    .add_bytes(transfer.to_backend, transfer.to_client);
                Stats::incr(&stats.completed);
            }
        }
    }

    /// Tells `outcome` once its sockets are closed: the trace, the access
    /// log line, the log line.
    pub(crate) fn tell(&self, outcome: &Outcome) {
        match &outcome.fate {
            Fate::Refused(refusal) => {
                let told = Told {
                    peer: outcome.peer,
                    queue_wait: outcome.queue_wait,
                    service: self.named(),
                };
                let (backend, access) = self.refusals.tell(&told, refusal);
                self.log_access(outcome.peer, backend, outcome.queued_at, access);
            }
            Fate::Served(served) => self.tell_served(outcome, served),
        }
    }

    fn tell_served(&self, outcome: &Outcome, served: &Served) {
        let pumped = &served.pumped;
        let (end, transfer) = (pumped.end, pumped.transfer);
        if trace::on() {
            // A timeout has no io::Error of its own: the trace tells it as
            // one, as it tells resets and failed writes.
            let timeout = (pumped.error.is_none() && !end.is_clean())
                .then(|| io::Error::new(io::ErrorKind::TimedOut, end.to_string()));
            trace::closed(
                transfer.to_backend,
                transfer.to_client,
                pumped.error.as_ref().or(timeout.as_ref()),
                pumped.no_shutdown == [true, true],
            );
        }
        trace::waiting();
        if self.access_log.is_some() {
            let access = Access {
                queue_wait: outcome.queue_wait,
                connect_time: Some(served.connect_time),
                failovers: served.failovers,
                failovers_ended: None,
                transfer,
                end: access_log::End::pumped(end, pumped.error.as_ref()),
                tls: served.tls.as_deref().cloned(),
            };
            let backend = Some(served.backend.name());
            self.log_access(outcome.peer, backend, outcome.queued_at, access);
        }
        // Clean closes and resets are how connections normally end (many
        // TLS clients close with a reset): debug. Timeouts and failed
        // writes: info. Neither calls for an operator, so no warning.
        // Handed to a new process, it goes on there: debug.
        let level = if end.is_clean() || end.is_reset() || end == End::Killed(Kill::Carried) {
            log::Level::Debug
        } else {
            log::Level::Info
        };
        // The line is made only when it is written: formatting it for
        // nothing cost every connection an allocation.
        if !log::log_enabled!(level) {
            return;
        }
        let why = match &pumped.error {
            Some(err) => format!("{end}: {err}"),
            None => end.to_string(),
        };
        // "finished" when both sides closed, "ended" otherwise.
        let verb = if end.is_clean() { "finished" } else { "ended" };
        log::log!(
            level,
            "connection {verb}: client {} backend {}: {why} (sent {} received {} in {:?})",
            outcome.peer,
            served.backend.name(),
            transfer.to_backend,
            transfer.to_client,
            served.started.elapsed()
        );
    }

    /// One access log line, when `--access-log` is on.
    pub(crate) fn log_access(
        &self,
        client: SocketAddr,
        backend: Option<&str>,
        queued_at: Instant,
        access: Access,
    ) {
        let Some(log) = &self.access_log else {
            return;
        };
        let mut record = access.record(client, backend, queued_at);
        record.service.clone_from(&self.service);
        if !log.log(record) {
            Stats::incr(&self.stats.access_log_dropped);
        }
    }

    /// A connection was just connected to `backend`: its line at the
    /// connect (`access_log_at_connect`), and the pump's hook for its
    /// interim lines (`access_log_interval`); whether the hook was set
    /// (the caller clears it once the pump is done: `interim::take_unused`).
    #[inline]
    pub(crate) fn opened(
        &self,
        outcome: &Outcome,
        backend: &Backend,
        connect_time: Duration,
        failovers: u32,
    ) -> bool {
        match &self.access_log {
            Some(log) if log.at_connect() || log.interval().is_some() => {
                self.open_lines(outcome, backend.name(), connect_time, failovers)
            }
            _ => false,
        }
    }

    #[cold]
    #[inline(never)]
    fn open_lines(
        &self,
        outcome: &Outcome,
        backend: &str,
        connect_time: Duration,
        failovers: u32,
    ) -> bool {
        let access = || Access {
            queue_wait: outcome.queue_wait,
            connect_time: Some(connect_time),
            failovers,
            // Unwritten on these lines (see `access_log::Phase`).
            ..Access::refused(access_log::End::FailedOver)
        };
        if self.access_log.as_ref().is_some_and(AccessLog::at_connect) {
            self.log_open(outcome, backend, access(), access_log::Phase::Connect);
        }
        let Some((every, tell)) = self.interim_lines(outcome, backend, access()) else {
            return false;
        };
        let ms = u64::try_from(every.as_millis()).unwrap_or(u64::MAX);
        pump::interim::set(ms, tell);
        true
    }

    /// A line of a connection still open, written when the access log
    /// asks for it: at its connect (`access_log_at_connect`) or an
    /// interim one (`access_log_interval`), `access.transfer` being the
    /// bytes since its last line.
    fn log_open(&self, outcome: &Outcome, backend: &str, access: Access, phase: access_log::Phase) {
        let Some(log) = &self.access_log else {
            return;
        };
        let mut record = access.record(outcome.peer, Some(backend), outcome.queued_at);
        record.service.clone_from(&self.service);
        record.phase = phase;
        if !log.log(record) {
            Stats::incr(&self.stats.access_log_dropped);
        }
    }

    /// The access log's interim lines of a connection just connected
    /// (`access_log_interval`): how often, and what writes one, given the
    /// bytes since the last. `None` when they are off.
    fn interim_lines(
        &self,
        outcome: &Outcome,
        backend: &str,
        access: Access,
    ) -> Option<(Duration, pump::interim::Tell)> {
        let log = self.access_log.as_ref()?;
        let every = log.interval()?;
        let mut base = access.record(outcome.peer, Some(backend), outcome.queued_at);
        base.service.clone_from(&self.service);
        base.phase = access_log::Phase::Interim;
        let (log, stats, queued_at) = (log.clone(), Arc::clone(&self.stats), outcome.queued_at);
        let tell = move |delta: pump::Transfer| {
            let mut record = base.clone();
            record.duration = queued_at.elapsed();
            record.bytes_to_backend = delta.to_backend;
            record.bytes_to_client = delta.to_client;
            if !log.log(record) {
                Stats::incr(&stats.access_log_dropped);
            }
        };
        Some((every, Box::new(tell)))
    }

    /// A client waited `waited` in the queue: past [`super::BUSY_WARNING_AFTER`]
    /// the operator is told every worker is busy (at most every
    /// [`BUSY_WARNING_EVERY`]).
    pub(crate) fn busy(&self, waited: Duration, waiting: impl FnOnce() -> usize, workers: usize) {
        if waited < super::BUSY_WARNING_AFTER {
            return;
        }
        if let Some(others) = self.busy_log.event(Instant::now()) {
            log::warn!(
                "every worker is busy: a client waited {waited:.1?} in the queue, \
                 {} waiting now (--workers {workers}){}",
                waiting(),
                throttle::more(others)
            );
        }
    }

    /// A backend connect found no descriptor left (this process's limit):
    /// counted, and logged at most once a second with `then`, what the
    /// worker does next.
    pub(crate) fn out_of_descriptors(&self, backend: &str, source: &io::Error, then: &str) {
        Stats::incr(&self.stats.out_of_descriptors);
        if let Some(others) = self.out_of_descriptors_log.event(Instant::now()) {
            log::error!(
                "cannot connect to backend {backend}: {source} (this process's \
                 limit; {then}){}",
                throttle::more(others)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::limiter::RateLimitReply;
    use crate::scheduler::Scheduler;

    fn refused(refusal: Refusal) -> Outcome {
        Outcome::refused("127.0.0.1:5000".parse().unwrap(), Instant::now(), refusal)
    }

    /// Each refusal raises its own counter once, and none is `completed`.
    #[test]
    fn every_refusal_is_counted_once() {
        let stats = Arc::new(Stats::default());
        let report = Report::new(Arc::clone(&stats), None);
        let backend = Arc::new(Backend::new("b".into(), vec![], 1));
        let scheduler = Arc::new(Scheduler::new(vec![Arc::clone(&backend)]));
        let limit = Duration::from_secs(1);
        for refusal in [
            Refusal::QueueTimeout { limit },
            Refusal::FirstByteTimeout { limit },
            Refusal::NoBackend { scheduler },
            Refusal::RateLimited {
                first: true,
                retry_after: limit,
                rate: crate::limiter::Rate {
                    limit: 1,
                    window: limit,
                },
                reply: RateLimitReply::Close,
            },
            Refusal::Denied,
            Refusal::TooManyConnections,
            Refusal::ConnectFailed {
                backend,
                error: Error::InvalidConfig("x".into()),
                failovers: 1,
                ended: None,
                connect_time: limit,
            },
        ] {
            let outcome = refused(refusal);
            report.count(&outcome);
            report.tell(&outcome);
        }
        let s = stats.snapshot();
        assert_eq!(
            (s.queue_timeouts, s.first_byte_timeouts, s.no_backend),
            (1, 1, 2),
            "{s:?}"
        );
        assert_eq!((s.completed, s.errors, s.rate_limited), (0, 0, 1), "{s:?}");
        assert_eq!((s.denied, s.too_many_connections), (1, 1), "{s:?}");
    }
}
