//! Reaching a backend for one client: the picked one first, then the
//! others as the scheduler chooses them after a failed connect (fail-over:
//! `scheduler/failover.rs`), each once, primaries before backups, waiting
//! in line when the primaries left are full; each attempt counted in the
//! stats and in the backend's passive health.
//!
//! # Threads
//!
//! Worker threads, each for its own client; the scheduler and the backends
//! are shared through atomics and the scheduler's own locks.
//!
//! # Corresponds to the C article
//!
//! `get_final_server_socket()`, which is [`Backend::connect`]; the C has no
//! fail-over and `exit()`s when a connect fails.

use std::net::{IpAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::report::Refusal;
use super::waiting::Look;
use super::{header, Proxy, ProxyConfig};
use crate::access_log::TriesEnded;
use crate::backend::{Backend, Reservation};
use crate::error::{Error, Result};
use crate::health::{self, HealthConfig};
use crate::scheduler::{Next, Pick};
use crate::stats::Stats;
use crate::system;
use crate::trace::{self, Event};

/// First pause of a worker whose backend connect found no descriptor left.
const OUT_OF_DESCRIPTORS_FIRST_PAUSE: Duration = Duration::from_millis(5);
/// Longest pause between two such tries: shorter than the accept loop's
/// back-off, so that a freed descriptor more often goes to a client already
/// accepted than to a new one.
const OUT_OF_DESCRIPTORS_MAX_PAUSE: Duration = Duration::from_millis(50);

/// A client connected: the backend's socket, the backend, and the place
/// reserved on it when it has a cap and was failed over to.
pub(super) struct Connected(
    pub TcpStream,
    pub Arc<Backend>,
    pub Option<crate::backend::Reservation>,
);

/// What each connect attempt for one client needs, read once: the client,
/// who it is, and the settings.
pub(super) struct Attempt<'a> {
    /// The client's socket (its address goes into a PROXY header).
    pub client: &'a TcpStream,
    /// Who the client is (after `--accept-proxy`, who its header says).
    pub origin: &'a header::Origin,
    /// The connect timeout.
    pub settings: &'a ProxyConfig,
    /// Passive health.
    pub health: &'a HealthConfig,
    /// When the client was accepted: a wait for a slot during fail-over
    /// ends at `queue_timeout` after it.
    pub queued_at: Instant,
}

/// A backend fail-over tries, with the place reserved on it.
type Candidate = (Arc<Backend>, Option<Reservation>);

/// How the connects for one client went, beside their result: the
/// failed connects, and the refusal of a wait for a full primary's slot
/// when fail-over waited for one and was refused (its queue was full, its
/// time ran out, or the client left).
#[derive(Debug, Default)]
pub(super) struct Tries {
    /// Failed connects.
    pub failed: u32,
    /// Why a wait for a slot during fail-over ended the client (boxed:
    /// this lives in the frame every connect runs under, and is rare).
    pub refused: Option<Box<Refusal>>,
    /// What ended the tries while backends were left untried
    /// (`connect_retries`, `connect_retry_budget`).
    pub ended: Option<TriesEnded>,
}

/// How far one client's tries may go: the one place that says whether
/// another backend may be tried, and with what connect timeout.
#[derive(Debug, Clone, Copy)]
struct Limits {
    /// Each try's own timeout (`connect_timeout`).
    connect_timeout: Duration,
    /// Other backends that may be tried after the first (`connect_retries`).
    retries: Option<u32>,
    /// When the tries' budget is spent (`connect_retry_budget`).
    deadline: Option<Instant>,
}

impl Limits {
    /// The limits of a client whose first connect starts at `now`.
    fn new(settings: &ProxyConfig, now: Instant) -> Limits {
        Limits {
            connect_timeout: settings.connect_timeout,
            retries: settings.connect_retries,
            deadline: settings.connect_retry_budget.map(|budget| now + budget),
        }
    }

    /// The first try's connect timeout: `connect_timeout`, cut to the
    /// budget when that is shorter.
    fn first(&self, now: Instant) -> Duration {
        self.left(now).unwrap_or(self.connect_timeout)
    }

    /// The connect timeout of the try after `retried` retries, at `now`,
    /// or what forbids it: the retries are used up, or the budget spent.
    fn retry(&self, retried: u32, now: Instant) -> std::result::Result<Duration, TriesEnded> {
        if self.retries.is_some_and(|most| retried >= most) {
            return Err(TriesEnded::Retries);
        }
        match self.left(now) {
            Some(left) if left.is_zero() => Err(TriesEnded::Budget),
            Some(left) => Ok(left),
            None => Ok(self.connect_timeout),
        }
    }

    /// What is left of the budget, no more than `connect_timeout`;
    /// `None` without a budget.
    fn left(&self, now: Instant) -> Option<Duration> {
        self.deadline.map(|deadline| {
            deadline
                .saturating_duration_since(now)
                .min(self.connect_timeout)
        })
    }
}

impl Proxy {
    /// Connects to the picked backend or, failing that, to the backends
    /// fail-over chooses ([`crate::scheduler::Scheduler::fail_over`]),
    /// each once, until one answers or none is left; `tries` says how it
    /// went.
    ///
    /// By default each attempt gets the whole `connect_timeout`, not a
    /// share of one total: a black-holed backend then costs a client one
    /// connect timeout, and the next backend still gets a full chance.
    /// (One total budget would let a single black hole use it all up and
    /// fail the client even though a live backend was next.) Passive
    /// health takes the black hole out after a few such clients (its
    /// failures in a row), so later ones pay nothing. `connect_retries`
    /// and `connect_retry_budget` bound the tries for those who prefer a
    /// bounded wait ([`Limits`]); `tries.ended` says which ended them.
    ///
    /// Not inlined, nor the fail-over: every connect runs under this
    /// frame and the caller's, so they hold little (docs/internals.md,
    /// "The pool"). The first connect that succeeds pays nothing for the
    /// fail-over: no allocation, no lock.
    #[inline(never)]
    pub(super) fn connect(
        &self,
        pick: &Pick,
        attempt: &Attempt<'_>,
        tries: &mut Tries,
    ) -> Result<Connected> {
        let now = Instant::now();
        let limits = Limits::new(attempt.settings, now);
        match self.try_backend(&pick.backend, attempt, limits.first(now)) {
            Ok(stream) => Ok(Connected(stream, Arc::clone(&pick.backend), None)),
            Err(first) => self.fail_over(first, pick, attempt, tries, limits),
        }
    }

    /// The picked backend failed with `first`: the next one as the
    /// scheduler would have chosen had the failed ones been marked down
    /// (primaries first, then backups), until one answers or every
    /// candidate was tried; the error is the last one's. When the
    /// primaries left are all at their cap, the client waits in line for
    /// a slot, as at its pick.
    #[cold]
    #[inline(never)]
    fn fail_over(
        &self,
        first: Error,
        pick: &Pick,
        attempt: &Attempt<'_>,
        tries: &mut Tries,
        limits: Limits,
    ) -> Result<Connected> {
        tries.failed += 1;
        let peer = attempt.origin.source.ip();
        let mut tried = vec![pick.backend.id()];
        let mut last = first;
        loop {
            let next = self.scheduler.fail_over(peer, &tried, false);
            // A limit ends the tries only when a backend was left to try
            // (a reservation the scheduler made is released on return).
            let retried = tries.failed - 1;
            if let (Next::Try(..) | Next::Wait, Err(ended)) =
                (&next, limits.retry(retried, Instant::now()))
            {
                tries.ended = Some(ended);
                return Err(last);
            }
            let (backend, held) = match next {
                Next::Try(backend, held) => (backend, held),
                Next::Done => return Err(last),
                Next::Wait => match self.wait_to_fail_over(attempt, peer, &tried) {
                    Ok(Some(next)) => next,
                    Ok(None) => return Err(last),
                    Err(refusal) => {
                        tries.refused = Some(Box::new(refusal));
                        return Err(last);
                    }
                },
            };
            // Asked again: a wait for a slot may have spent the budget.
            let timeout = match limits.retry(retried, Instant::now()) {
                Ok(timeout) => timeout,
                Err(ended) => {
                    tries.ended = Some(ended);
                    return Err(last);
                }
            };
            tried.push(backend.id());
            trace::event(Event::FailOver {
                backend: backend.name(),
            });
            match self.try_backend(&backend, attempt, timeout) {
                Ok(stream) => return Ok(Connected(stream, backend, held)),
                Err(err) => {
                    tries.failed += 1;
                    last = err;
                }
            }
        }
    }

    /// Fail-over found the primaries left at their cap: waits in the
    /// service's line (`waiting.rs`) for a slot on one of them, and gives
    /// the backend to try with its place reserved, or `None` when no
    /// candidate is left (a refusal: the wait ended the client).
    fn wait_to_fail_over(
        &self,
        attempt: &Attempt<'_>,
        peer: IpAddr,
        tried: &[u64],
    ) -> std::result::Result<Option<Candidate>, Refusal> {
        let settings = attempt.settings;
        self.wait_in_line(
            attempt.client,
            attempt.queued_at,
            settings,
            |first| match self.scheduler.fail_over(peer, tried, first) {
                Next::Try(backend, held) => Look::Taken((backend, held)),
                Next::Wait => Look::Full,
                Next::Done => Look::Nothing,
            },
        )
    }

    /// One connect attempt, counted in the stats and (unless it failed for a
    /// reason of this host) in the backend's passive health. A backend that
    /// takes the PROXY protocol is sent its header here, before any client
    /// byte; failing to send it counts as failing to connect.
    ///
    /// When the socket cannot even be created because this process is out
    /// of file descriptors (`EMFILE`, `ENFILE`), the backend is not to
    /// blame: that is not counted against its health (which would mark
    /// every backend down at once). The worker gives back one of the
    /// descriptors the process keeps for this (`crate::reserve`) and tries
    /// again at once; with none left, it waits for a connection to end and
    /// free descriptors, trying again with a back-off (from
    /// [`OUT_OF_DESCRIPTORS_FIRST_PAUSE`], doubling) for at most
    /// `timeout` (`connect_timeout`, or what is left of the budget).
    fn try_backend(
        &self,
        backend: &Backend,
        attempt: &Attempt<'_>,
        timeout: Duration,
    ) -> Result<TcpStream> {
        let started = trace::on().then(Instant::now);
        let deadline = Instant::now() + timeout;
        let mut pause = OUT_OF_DESCRIPTORS_FIRST_PAUSE;
        // Out of descriptors, the accept loops are held off from the first
        // failure to the last try, so that none takes the descriptor given
        // back or freed for this socket.
        let mut holding_off = None;
        loop {
            let connected = backend.connect(timeout).and_then(|stream| {
                header::send(backend.send_proxy(), &stream, || {
                    attempt.origin.header(attempt.client)
                })?;
                Ok(stream)
            });
            match connected {
                Err(source) if system::is_out_of_descriptors(&source) => {
                    holding_off
                        .get_or_insert_with(|| self.process.hold(&self.process.descriptor_waits));
                    self.wait_for_descriptor(backend, source, deadline, &mut pause)?;
                }
                other => return self.connected_or_failed(backend, other, attempt.health, started),
            }
        }
    }

    /// No descriptor left for the backend's socket: logged, then one of
    /// the process's kept descriptors given back, or else a pause of
    /// `pause` (doubled for the next time), before the caller tries again;
    /// an error once that would pass `deadline`. Cold, and kept out of the
    /// frame every connect runs under.
    #[cold]
    #[inline(never)]
    fn wait_for_descriptor(
        &self,
        backend: &Backend,
        source: std::io::Error,
        deadline: Instant,
        pause: &mut Duration,
    ) -> Result<()> {
        let spared = self.spare.release();
        let give_up = !spared && Instant::now() + *pause >= deadline;
        let then = match (spared, give_up) {
            (true, _) => "one of those kept aside given back for it",
            (false, true) => "giving up on this client",
            (false, false) => "waiting for connections to end",
        };
        self.report
            .out_of_descriptors(backend.name(), &source, then);
        if spared {
            return Ok(());
        }
        if give_up {
            return Err(Error::BackendConnect {
                backend: backend.name().to_string(),
                source,
            });
        }
        // While any worker waits here, the accept loop holds off (the
        // caller's `holding_off`), so a descriptor freed by a connection
        // that ends goes to a client already accepted rather than to one
        // more client that would wait too.
        std::thread::sleep(*pause);
        *pause = (*pause * 2).min(OUT_OF_DESCRIPTORS_MAX_PAUSE);
        Ok(())
    }

    /// Counts the outcome of one connect attempt that reached the backend
    /// (or tried to): success or failure, in the stats and its passive
    /// health ([`health::connect_failed`], which leaves out a failure of
    /// this host and logs at most a line a second per backend).
    pub(super) fn connected_or_failed(
        &self,
        backend: &Backend,
        attempt: std::io::Result<TcpStream>,
        health: &HealthConfig,
        started: Option<Instant>,
    ) -> Result<TcpStream> {
        match attempt {
            Ok(stream) => {
                backend.record_connect_success();
                if let Some(started) = started {
                    trace::event(Event::Connected {
                        backend: backend.name(),
                        fd: stream.as_raw_fd(),
                        took: started.elapsed(),
                    });
                }
                Ok(stream)
            }
            Err(source) => Err(self.connect_failed(backend, source, health)),
        }
    }

    /// One connect attempt failed: counted, told to passive health and the
    /// trace, and worded for the operator.
    #[cold]
    #[inline(never)]
    fn connect_failed(
        &self,
        backend: &Backend,
        source: std::io::Error,
        health: &HealthConfig,
    ) -> Error {
        Stats::incr(&self.stats.connect_failures);
        let failures = health::connect_failed(backend, health, &source);
        trace::event(Event::ConnectFailed {
            backend: backend.name(),
            reason: &source,
            failures,
        });
        Error::BackendConnect {
            backend: backend.name().to_string(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(retries: Option<u32>, budget: Option<u64>) -> (Limits, Instant) {
        let settings = ProxyConfig {
            connect_timeout: Duration::from_millis(300),
            connect_retries: retries,
            connect_retry_budget: budget.map(Duration::from_millis),
            ..ProxyConfig::default()
        };
        let now = Instant::now();
        (Limits::new(&settings, now), now)
    }

    #[test]
    fn without_limits_every_try_gets_the_whole_connect_timeout() {
        let (l, now) = limits(None, None);
        let full = Duration::from_millis(300);
        assert_eq!(l.first(now), full);
        for retried in [0, 1, 1_000, u32::MAX] {
            assert_eq!(l.retry(retried, now + Duration::from_secs(3_600)), Ok(full));
        }
    }

    #[test]
    fn retries_end_the_tries_after_that_many_others() {
        let (l, now) = limits(Some(2), None);
        assert!(l.retry(0, now).is_ok());
        assert!(l.retry(1, now).is_ok());
        assert_eq!(l.retry(2, now), Err(TriesEnded::Retries));
        let (none, now) = limits(Some(0), None);
        assert_eq!(none.retry(0, now), Err(TriesEnded::Retries));
    }

    #[test]
    fn the_budget_cuts_each_timeout_to_what_is_left_then_ends_the_tries() {
        let (l, now) = limits(None, Some(500));
        let ms = Duration::from_millis;
        assert_eq!(l.first(now), ms(300));
        assert_eq!(l.retry(0, now + ms(300)), Ok(ms(200)));
        assert_eq!(l.retry(1, now + ms(450)), Ok(ms(50)));
        assert_eq!(l.retry(2, now + ms(500)), Err(TriesEnded::Budget));
        assert_eq!(l.retry(2, now + ms(9_000)), Err(TriesEnded::Budget));
        // A budget shorter than one timeout cuts the first try too.
        let (short, now) = limits(None, Some(120));
        assert_eq!(short.first(now), ms(120));
        // The retries are looked at first.
        let (both, now) = limits(Some(1), Some(100));
        assert_eq!(both.retry(1, now + ms(200)), Err(TriesEnded::Retries));
    }
}
