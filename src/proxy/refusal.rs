//! Why a client was closed before any backend served it, as one typed
//! value, [`Refusal`], and how each refusal is told: its counter, its
//! access log line, its log line (throttled where a flood could fill the
//! log) and, where one is, its trace sentence. Whoever refuses (the
//! admission gate's callers, the waits, the connect, the SNI router, the
//! TLS handshake) hands the refusal to a `Report` (`report.rs`); nothing
//! else counts or logs a refusal. A new way to refuse is one variant here
//! and its rows below.
//!
//! # Threads
//!
//! The accept loops and the workers, each through its `Report`: counters
//! are atomics, the throttles lock-free.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C serves every client it accepts, or `exit()`s.

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::pump::{self, Transfer};
use crate::access_log::{self, Record};
use crate::backend::Backend;
use crate::error::Error;
use crate::limiter::{Rate, RateLimitReply};
use crate::scheduler::Scheduler;
use crate::stats::Stats;
use crate::system;
use crate::throttle::{self, LogThrottle};
use crate::trace::{self, Event};
use crate::units::format_duration;

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
    /// by its kind and logged where it failed (`tls_term::handshake`:
    /// debug, a refused client certificate at info), access-logged here.
    TlsHandshake,
    /// Queued on a route its service does not serve: a bug, logged as an
    /// error. Also the fate a worker's outcome starts with, so that a
    /// step that forgot to say how its client ended shows as this, not as
    /// nothing.
    Misrouted,
    /// Ended on purpose before it reached a backend (`DELETE
    /// /connections/{id}`, the drain's spread): its access log `end=` is
    /// the reason's word.
    Killed(crate::connections::Kill),
    /// Every backend connect failed.
    ConnectFailed {
        /// The backend tried first.
        backend: Arc<Backend>,
        /// Why the last one failed.
        error: Error,
        /// Failed connects.
        failovers: u32,
        /// What ended the tries while backends were left untried.
        ended: Option<access_log::TriesEnded>,
        /// Time spent connecting.
        connect_time: Duration,
    },
}

/// The counter each refusal raises (`None`: counted where it is decided).
pub(super) fn refused_counter<'s>(stats: &'s Stats, refusal: &Refusal) -> Option<&'s AtomicU64> {
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
        Refusal::Killed(_) => Some(&stats.ended_killed),
    }
}

/// A refused client as its refusal's lines name it.
pub(super) struct Told<'a> {
    /// The client (after a PROXY header, the one it names).
    pub peer: SocketAddr,
    /// Its time in the queue before a worker took it.
    pub queue_wait: Duration,
    /// Its service's name, unless it is a flat configuration's one service.
    pub service: Option<&'a str>,
}

impl Told<'_> {
    /// ` of service NAME` after the client in a log line, when named.
    fn whose(&self) -> String {
        whose(self.service)
    }
}

/// ` of service NAME` after a client in a log line, when `service` is
/// named.
pub(super) fn whose(service: Option<&str>) -> String {
    service.map_or_else(String::new, |s| format!(" of service {s}"))
}

/// The throttles of the refusals' log lines: each at most once a second,
/// with the count of the others, since under load they would flood the
/// log.
pub(super) struct Refusals {
    /// "No backend could be reached".
    unreachable_log: LogThrottle,
    /// "No backend is available".
    no_backend_log: LogThrottle,
    /// Queue timeouts, and the refusals of clients at the backends' caps.
    queue_timeout_log: LogThrottle,
    /// First-byte timeouts.
    first_byte_timeout_log: LogThrottle,
}

impl Refusals {
    /// Fresh throttles.
    pub(super) fn new() -> Refusals {
        let second = || LogThrottle::new(Duration::from_secs(1));
        Refusals {
            unreachable_log: second(),
            no_backend_log: second(),
            queue_timeout_log: second(),
            first_byte_timeout_log: second(),
        }
    }

    /// Tells `refusal` of the client `outcome`: its trace sentence and log
    /// line; gives the backend and what its access log line says.
    pub(super) fn tell<'r>(
        &self,
        outcome: &Told<'_>,
        refusal: &'r Refusal,
    ) -> (Option<&'r str>, Access) {
        let peer = outcome.peer;
        let now = Instant::now();
        // One row per refusal: its access log line, then its log line.
        match refusal {
            Refusal::QueueTimeout { limit } => {
                if let Some(others) = self.queue_timeout_log.event(now) {
                    log::warn!(
                        "closing client {peer}{}: it waited {:.1?} in the queue before a \
                         worker took it, past queue_timeout {}{}",
                        outcome.whose(),
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
                        outcome.whose(),
                        format_duration(*limit),
                        throttle::more(others)
                    );
                }
                (None, Access::refused(access_log::End::FirstByteTimeout))
            }
            Refusal::NoBackend { scheduler } => {
                self.no_backend(outcome, scheduler, now);
                (None, Access::refused(access_log::End::NoBackend))
            }
            Refusal::RateLimited { .. } | Refusal::Denied | Refusal::TooManyConnections => {
                (None, self.at_gate(outcome, refusal))
            }
            Refusal::ProxyHeader { .. }
            | Refusal::NoServiceForSni { .. }
            | Refusal::TlsHandshake
            | Refusal::Misrouted => (None, self.before_route(outcome, refusal)),
            Refusal::Killed(kill) => {
                log::info!(
                    "closing client {peer}{}: ended on purpose before any backend ({})",
                    outcome.whose(),
                    kill.word()
                );
                let end = access_log::End::Pumped(pump::End::Killed(*kill));
                (None, Access::refused(end))
            }
            Refusal::ConnectFailed {
                backend,
                error,
                failovers,
                ended,
                connect_time,
            } => {
                let tries = (*failovers, *ended, *connect_time);
                let access = self.unreachable(outcome, error, tries, now);
                (Some(backend.name()), access)
            }
        }
    }

    /// A client the admission gate refused by its lists, its caps or its
    /// limiter: the limiter's first refusal of a window is logged; the
    /// per-client cap logs its own, throttled (`per_client`); a denied
    /// client is not logged (a scan would flood the log).
    fn at_gate(&self, outcome: &Told<'_>, refusal: &Refusal) -> Access {
        let end = match refusal {
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
                        outcome.peer.ip(),
                        outcome.whose()
                    );
                }
                access_log::End::RateLimited
            }
            Refusal::Denied => access_log::End::Denied,
            _ => access_log::End::TooManyConnections,
        };
        Access::refused(end)
    }

    /// Every backend connect failed for the client of `outcome`, the last
    /// with `error`: logged at most once a second, traced; its access log
    /// entry.
    #[cold]
    fn unreachable(
        &self,
        outcome: &Told<'_>,
        error: &Error,
        (failovers, failovers_ended, connect_time): (u32, Option<access_log::TriesEnded>, Duration),
        now: Instant,
    ) -> Access {
        let reason = match error {
            Error::BackendConnect { source, .. } => system::error_words(source),
            other => other.to_string(),
        };
        if let Some(others) = self.unreachable_log.event(now) {
            log::warn!(
                "closing client {}{}: no backend could be reached, last: {error}{}",
                outcome.peer,
                outcome.whose(),
                throttle::more(others)
            );
        }
        trace::event(Event::Unreachable);
        trace::waiting();
        Access {
            queue_wait: outcome.queue_wait,
            connect_time: Some(connect_time),
            failovers,
            failovers_ended,
            ..Access::refused(access_log::End::ConnectFailed(reason))
        }
    }

    /// A client refused before its service or its address was known (the
    /// PROXY header, SNI, TLS, a wrong route): its log line, and its
    /// access log entry.
    #[cold]
    fn before_route(&self, outcome: &Told<'_>, refusal: &Refusal) -> Access {
        let peer = outcome.peer;
        let end = match refusal {
            Refusal::ProxyHeader { why, silenced } => {
                if let Some(silenced) = silenced {
                    log::warn!(
                        "closing client {peer}{}: {why}{}; this source is logged at most \
                         once per {:?}",
                        outcome.whose(),
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
                    outcome.whose()
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
    fn at_cap(&self, outcome: &Told<'_>, refusal: &Refusal, now: Instant) -> Access {
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
                outcome.whose(),
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
    fn no_backend(&self, outcome: &Told<'_>, scheduler: &Scheduler, now: Instant) {
        let peer = outcome.peer;
        trace::event(Event::NoBackend);
        if let Some(others) = self.no_backend_log.event(now) {
            let why = match scheduler.snapshot().len() {
                0 => "the list is empty".to_string(),
                1 => "the one backend is down or draining".to_string(),
                n => format!("all {n} are down or draining"),
            };
            log::warn!(
                "closing client {peer}{}: no backend is available ({why}){}",
                outcome.whose(),
                throttle::more(others)
            );
        }
    }
}

/// What an access log line says beyond the client, the backend and the
/// times (see `Report::log_access`).
#[derive(Debug)]
pub(crate) struct Access {
    /// Time in the queue before a worker took the client.
    pub queue_wait: Duration,
    /// Time spent connecting (failed tries included), when it got that far.
    pub connect_time: Option<Duration>,
    /// Failed connects before the one that served (or before giving up).
    pub failovers: u32,
    /// What ended the fail-over while backends were left untried.
    pub failovers_ended: Option<access_log::TriesEnded>,
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
            failovers_ended: None,
            transfer: Transfer::default(),
            end,
            tls: None,
        }
    }

    /// The line's record; `queued_at` is when the client was accepted.
    pub(super) fn record(
        self,
        client: SocketAddr,
        backend: Option<&str>,
        queued_at: Instant,
    ) -> Record {
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
            failovers_ended: self.failovers_ended,
            bytes_to_backend: self.transfer.to_backend,
            bytes_to_client: self.transfer.to_client,
            end: self.end,
            phase: access_log::Phase::End,
            tls: self.tls,
        }
    }
}
