//! A connection's fate as one typed value, [`Outcome`], and [`Report`], the
//! one place an outcome becomes counters, an access log line, trace
//! sentences and a throttled log line. A new way for a connection to end
//! is one variant of [`Refusal`] (or of the pump's `End`) and its rows in
//! the tables below.
//!
//! Reporting has two halves, because their order is observable:
//! [`Report::count`] runs before the sockets close (whoever sees a
//! connection closed sees it counted; `completed` is raised last, then the
//! caller drops the active gauges), [`Report::tell`] after (the trace's
//! "close() on both sockets" is true when it is told).
//!
//! # Threads
//!
//! Workers report their connections, the accept loop the clients it
//! refuses (each thread with a `Report` of its own). Counters are atomics, the throttles
//! lock-free, the access log a non-blocking channel: nothing here locks.
//!
//! # Corresponds to the C article
//!
//! The `### REQUEST FINISHED ###` line at the end of `proxy_function()`.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::pump::{self, End, Transfer};
use super::BUSY_WARNING_EVERY;
use crate::access_log::{self, AccessLog, Record};
use crate::backend::Backend;
use crate::error::Error;
use crate::limiter::{Rate, RateLimitReply};
use crate::scheduler::Scheduler;
use crate::stats::Stats;
use crate::system;
use crate::throttle::{self, LogThrottle};
use crate::trace::{self, Event};
use crate::units::format_duration;

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

/// Why a client was closed before any backend served it.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// It waited in the queue longer than `queue_timeout`.
    QueueTimeout {
        /// The `queue_timeout` it passed.
        limit: Duration,
    },
    /// Every backend was at its `max_connections`, and `max_queue`
    /// clients waited for a slot already.
    QueueFull {
        /// The `max_queue` it found reached.
        max: usize,
    },
    /// It waited for a backend slot until `queue_timeout` since it was
    /// accepted.
    SlotTimeout {
        /// The `queue_timeout` it reached.
        limit: Duration,
    },
    /// It closed its connection while it waited for a backend slot.
    LeftQueue,
    /// It sent nothing within `client_first_byte_timeout`.
    FirstByteTimeout {
        /// The timeout.
        limit: Duration,
    },
    /// The accept loop found no backend available (all down or
    /// draining, or none listed).
    NoBackend {
        /// The backends, read only when the line is logged.
        scheduler: Arc<Scheduler>,
    },
    /// The rate limiter refused it (the admission gate): answered with a
    /// 429 when its reply says so, counted, logged on its first refusal
    /// of the window only.
    RateLimited {
        /// Its first refusal in the current window: the one logged.
        first: bool,
        /// When it may try again (the 429's `Retry-After`).
        retry_after: Duration,
        /// The rate it went over, for the log line.
        rate: Rate,
        /// What it is answered before the close.
        reply: RateLimitReply,
    },
    /// The `allow` and `deny` lists refused it: closed at once, with no
    /// log line (a scan would flood it), counted and access-logged.
    Denied,
    /// Its address had as many connections open as the per-client cap
    /// allows:
    /// answered as the rate limiter answers, closed, counted and
    /// access-logged; logged by the gate, throttled.
    TooManyConnections,
    /// Behind `--accept-proxy`, no valid PROXY header from a trusted peer
    /// in time.
    ProxyHeader {
        /// Why.
        why: crate::proxy_protocol::Refusal,
        /// `Some(n)`: logged, `n` refusals from its source silenced since
        /// its last line; `None`: counted only (one line per source per
        /// [`crate::proxy_protocol::REFUSAL_LOG_WINDOW`]).
        silenced: Option<u64>,
    },
    /// On an address shared by SNI, no service takes the name it asked for
    /// (or it sent none, or no ClientHello in time) and none is the
    /// default: logged at debug level only (a scan would flood the log).
    NoServiceForSni {
        /// The name it asked for.
        host: Option<Box<str>>,
        /// How its hello went, in words.
        how: &'static str,
    },
    /// The TLS handshake of a service that terminates TLS failed: counted
    /// by its kind and logged (debug) where it failed
    /// (`tls_term::handshake`), access-logged here.
    TlsHandshake,
    /// Queued on a route its service does not serve: a bug, logged as an
    /// error. Also the fate a worker's outcome starts with, so that a
    /// step that forgot to say how its client ended shows as this, not as
    /// nothing.
    Misrouted,
    /// Every backend connect failed.
    ConnectFailed {
        /// The backend tried first.
        backend: Arc<Backend>,
        /// Why the last one failed.
        error: Error,
        /// Failed connects.
        failovers: u32,
        /// Time spent connecting.
        connect_time: Duration,
    },
}

/// A connection a backend served.
#[derive(Debug)]
pub(crate) struct Served {
    /// The backend that served it.
    pub backend: Arc<Backend>,
    /// How the pump ended, and the bytes.
    pub pumped: pump::Outcome,
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
    }
}

/// The counter each refusal raises (`None`: counted where it is decided).
fn refused_counter<'s>(stats: &'s Stats, refusal: &Refusal) -> Option<&'s AtomicU64> {
    match refusal {
        Refusal::QueueTimeout { .. } | Refusal::SlotTimeout { .. } => Some(&stats.queue_timeouts),
        Refusal::QueueFull { .. } => Some(&stats.queue_full),
        // Gone by itself: the access log says so.
        Refusal::LeftQueue => None,
        Refusal::FirstByteTimeout { .. } => Some(&stats.first_byte_timeouts),
        Refusal::NoBackend { .. } | Refusal::ConnectFailed { .. } => Some(&stats.no_backend),
        Refusal::RateLimited { .. } => Some(&stats.rate_limited),
        Refusal::Denied => Some(&stats.denied),
        Refusal::TooManyConnections => Some(&stats.too_many_connections),
        Refusal::ProxyHeader { .. } => Some(&stats.proxy_header_refused),
        Refusal::NoServiceForSni { .. } => Some(&stats.sni_refused),
        // Counted by the kind of failure, where it failed.
        Refusal::TlsHandshake => None,
        // The error line says so.
        Refusal::Misrouted => None,
    }
}

/// The counters, the access log and the throttled log lines of the workers.
pub(crate) struct Report {
    stats: Arc<Stats>,
    access_log: Option<AccessLog>,
    /// "No backend could be reached" at most once a second.
    unreachable_log: LogThrottle,
    /// "No backend is available" (the accept loop) at most once a second,
    /// with the count of the others: under load it would flood the log.
    no_backend_log: LogThrottle,
    /// "Every worker is busy" at most once every 10 s.
    busy_log: LogThrottle,
    /// Queue timeouts, at most once a second, with the count of the others.
    queue_timeout_log: LogThrottle,
    /// Connects that found no descriptor left, at most once a second.
    out_of_descriptors_log: LogThrottle,
    /// First-byte timeouts, at most once a second.
    first_byte_timeout_log: LogThrottle,
    /// The service's name on access log lines, unless it is the one
    /// service of a flat configuration (`default`).
    service: Option<Arc<str>>,
}

impl Report {
    /// A reporter counting in `stats` and logging to `access_log`.
    pub(crate) fn new(stats: Arc<Stats>, access_log: Option<AccessLog>) -> Report {
        let second = || LogThrottle::new(Duration::from_secs(1));
        Report {
            stats,
            access_log,
            unreachable_log: second(),
            no_backend_log: second(),
            busy_log: LogThrottle::new(BUSY_WARNING_EVERY),
            queue_timeout_log: second(),
            out_of_descriptors_log: second(),
            first_byte_timeout_log: second(),
            service: None,
        }
    }

    /// ` of service NAME` after a client in a log line, when the service
    /// is named (not on a flat configuration's one service).
    pub(crate) fn whose(&self) -> String {
        self.service
            .as_ref()
            .map_or_else(String::new, |s| format!(" of service {s}"))
    }

    /// The service's name, when it is named (not `default`).
    pub(crate) fn named(&self) -> Option<&str> {
        self.service.as_deref()
    }

    /// Names `service` on the access log lines (not `default`).
    pub(crate) fn for_service(self, service: &str) -> Report {
        Report {
            service: (service != crate::config::DEFAULT_SERVICE).then(|| service.into()),
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
                if !end.is_clean() {
                    Stats::incr(&stats.errors);
                    if let Some(kind) = error_kind(end) {
                        served.backend.tally.error(kind);
                    }
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
            Fate::Refused(refusal) => self.tell_refusal(outcome, refusal),
            Fate::Served(served) => self.tell_served(outcome, served),
        }
    }

    fn tell_refusal(&self, outcome: &Outcome, refusal: &Refusal) {
        let peer = outcome.peer;
        let now = Instant::now();
        // One row per refusal: its access log line, then its log line.
        let (backend, access) = match refusal {
            Refusal::QueueTimeout { limit } => {
                if let Some(others) = self.queue_timeout_log.event(now) {
                    log::warn!(
                        "closing client {peer}{}: it waited {:.1?} for a free worker \
                         (queue timeout {}; all workers busy){}",
                        self.whose(),
                        outcome.queue_wait,
                        format_duration(*limit),
                        throttle::more(others)
                    );
                }
                let access = Access {
                    queue_wait: outcome.queue_wait,
                    ..Access::refused(access_log::End::QueueTimeout)
                };
                (None, access)
            }
            Refusal::QueueFull { .. } | Refusal::SlotTimeout { .. } | Refusal::LeftQueue => {
                (None, self.at_cap(outcome, refusal, now))
            }
            Refusal::FirstByteTimeout { limit } => {
                if let Some(others) = self.first_byte_timeout_log.event(now) {
                    log::info!(
                        "closing client {peer}{}: nothing received within {} \
                         (client first byte timeout){}",
                        self.whose(),
                        format_duration(*limit),
                        throttle::more(others)
                    );
                }
                (None, Access::refused(access_log::End::FirstByteTimeout))
            }
            Refusal::NoBackend { scheduler } => {
                self.no_backend(peer, scheduler, now);
                (None, Access::refused(access_log::End::NoBackend))
            }
            Refusal::RateLimited {
                first,
                retry_after,
                rate,
                ..
            } => {
                if *first {
                    log::info!(
                        "rate limit: refusing {}{} for {retry_after:.1?} (over {rate}); \
                         its further refusals in this window are counted, not logged",
                        peer.ip(),
                        self.whose()
                    );
                }
                (None, Access::refused(access_log::End::RateLimited))
            }
            Refusal::Denied => (None, Access::refused(access_log::End::Denied)),
            // Logged by the gate (`per_client`), throttled.
            Refusal::TooManyConnections => {
                (None, Access::refused(access_log::End::TooManyConnections))
            }
            Refusal::ProxyHeader { .. }
            | Refusal::NoServiceForSni { .. }
            | Refusal::TlsHandshake
            | Refusal::Misrouted => (None, self.before_route(peer, refusal)),
            Refusal::ConnectFailed {
                backend,
                error,
                failovers,
                connect_time,
            } => {
                let reason = match error {
                    Error::BackendConnect { source, .. } => system::error_words(source),
                    other => other.to_string(),
                };
                let access = Access {
                    queue_wait: outcome.queue_wait,
                    connect_time: Some(*connect_time),
                    failovers: *failovers,
                    ..Access::refused(access_log::End::ConnectFailed(reason))
                };
                if let Some(others) = self.unreachable_log.event(now) {
                    log::warn!(
                        "closing client {peer}{}: no backend could be reached, last: {error}{}",
                        self.whose(),
                        throttle::more(others)
                    );
                }
                trace::event(Event::Unreachable);
                trace::waiting();
                (Some(backend.name()), access)
            }
        };
        self.log_access(peer, backend, outcome.queued_at, access);
    }

    /// A client refused before its service or its address was known (the
    /// PROXY header, SNI, TLS, a wrong route): its log line, and its
    /// access log entry.
    #[cold]
    fn before_route(&self, peer: SocketAddr, refusal: &Refusal) -> Access {
        let end = match refusal {
            Refusal::ProxyHeader { why, silenced } => {
                if let Some(silenced) = silenced {
                    log::warn!(
                        "closing client {peer}{}: {why}{}; this source is logged at most \
                         once per {:?}",
                        self.whose(),
                        throttle::more(*silenced),
                        crate::proxy_protocol::REFUSAL_LOG_WINDOW
                    );
                }
                access_log::End::ProxyHeaderRefused
            }
            Refusal::NoServiceForSni { host, how } => {
                log::debug!(
                    "closing client {peer}: no service for server name {} ({how})",
                    host.as_deref().unwrap_or("-"),
                );
                access_log::End::NoServiceForSni
            }
            Refusal::TlsHandshake => access_log::End::Error("tls handshake failed".into()),
            _ => {
                log::error!(
                    "closing client {peer}{}: queued on a route its service does not serve",
                    self.whose()
                );
                access_log::End::Error("misrouted".into())
            }
        };
        Access::refused(end)
    }

    /// A client refused while every backend was at its `max_connections`:
    /// logged at most once a second (with the queue timeouts' throttle),
    /// and its access log entry.
    #[cold]
    fn at_cap(&self, outcome: &Outcome, refusal: &Refusal, now: Instant) -> Access {
        let (why, end) = match refusal {
            Refusal::QueueFull { max } => (
                format!("{max} clients wait already (max_queue)"),
                access_log::End::QueueFull,
            ),
            Refusal::SlotTimeout { limit } => (
                format!(
                    "no slot freed within {} (queue timeout)",
                    format_duration(*limit)
                ),
                access_log::End::QueueTimeout,
            ),
            _ => (
                "it closed while waiting".to_string(),
                access_log::End::Pumped(pump::End::ClientClosed),
            ),
        };
        if let Some(others) = self.queue_timeout_log.event(now) {
            log::warn!(
                "closing client {}{}: every backend is at its max_connections and {why}{}",
                outcome.peer,
                self.whose(),
                throttle::more(others)
            );
        }
        Access {
            queue_wait: outcome.queue_wait,
            ..Access::refused(end)
        }
    }

    /// No backend was available for the client from `peer`: traced, and
    /// logged at most once a second.
    fn no_backend(&self, peer: SocketAddr, scheduler: &Scheduler, now: Instant) {
        trace::event(Event::NoBackend);
        if let Some(others) = self.no_backend_log.event(now) {
            let why = match scheduler.snapshot().len() {
                0 => "the list is empty".to_string(),
                1 => "the one backend is down or draining".to_string(),
                n => format!("all {n} are down or draining"),
            };
            log::warn!(
                "closing client {peer}{}: no backend is available ({why}){}",
                self.whose(),
                throttle::more(others)
            );
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
            );
        }
        trace::waiting();
        if self.access_log.is_some() {
            let access = Access {
                queue_wait: outcome.queue_wait,
                connect_time: Some(served.connect_time),
                failovers: served.failovers,
                transfer,
                end: access_log::End::pumped(end, pumped.error.as_ref()),
                tls: served.tls.as_deref().cloned(),
            };
            let backend = Some(served.backend.name());
            self.log_access(outcome.peer, backend, outcome.queued_at, access);
        }
        let why = match &pumped.error {
            Some(err) => format!("{end}: {err}"),
            None => end.to_string(),
        };
        // Clean closes and resets are how connections normally end (many
        // TLS clients close with a reset): debug. Timeouts and failed
        // writes: info. Neither calls for an operator, so no warning.
        let level = if end.is_clean() || end.is_reset() {
            log::Level::Debug
        } else {
            log::Level::Info
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
    /// counted, and logged at most once a second.
    pub(crate) fn out_of_descriptors(&self, backend: &str, source: &io::Error, give_up: bool) {
        Stats::incr(&self.stats.out_of_descriptors);
        if let Some(others) = self.out_of_descriptors_log.event(Instant::now()) {
            log::error!(
                "cannot connect to backend {backend}: {source} (this process's \
                 limit; {}){}",
                if give_up {
                    "giving up on this client"
                } else {
                    "waiting for connections to end"
                },
                throttle::more(others)
            );
        }
    }
}

/// What an access log line says beyond the client, the backend and the
/// times (see [`Report::log_access`]).
#[derive(Debug)]
pub(crate) struct Access {
    /// Time in the queue before a worker took the client.
    pub queue_wait: Duration,
    /// Time spent connecting (failed tries included), when it got that far.
    pub connect_time: Option<Duration>,
    /// Failed connects before the one that served (or before giving up).
    pub failovers: u32,
    /// Bytes each way.
    pub transfer: Transfer,
    /// How it ended.
    pub end: access_log::End,
    /// The client's TLS, when terminated here.
    pub tls: Option<access_log::TlsNote>,
}

impl Access {
    /// A client ended before any backend was tried.
    pub(crate) fn refused(end: access_log::End) -> Access {
        Access {
            queue_wait: Duration::ZERO,
            connect_time: None,
            failovers: 0,
            transfer: Transfer::default(),
            end,
            tls: None,
        }
    }

    /// The line's record; `queued_at` is when the client was accepted.
    fn record(self, client: SocketAddr, backend: Option<&str>, queued_at: Instant) -> Record {
        let since = queued_at.elapsed();
        Record {
            time: std::time::SystemTime::now()
                .checked_sub(since)
                .unwrap_or_else(std::time::SystemTime::now),
            client,
            service: None,
            sni: access_log::current_sni(),
            backend: backend.map(str::to_string),
            queue_wait: self.queue_wait,
            connect_time: self.connect_time,
            duration: since,
            failovers: self.failovers,
            bytes_to_backend: self.transfer.to_backend,
            bytes_to_client: self.transfer.to_client,
            end: self.end,
            tls: self.tls,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
