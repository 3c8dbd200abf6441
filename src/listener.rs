//! The listening socket and the accept loop.
//!
//! One thread (the one that calls [`crate::Balancer::run`]) sits in a
//! blocking `accept(2)`. For each client it picks the backend, wraps the pair
//! in a [`Job`] and hands it to the pool. It never waits for a client or for
//! a worker, so a slow connection cannot slow the accepting of others. It
//! waits only when the queue is full, which is back-pressure by design: new
//! clients then wait in the kernel's backlog. It shares the scheduler, the
//! pool and the stats with the workers; each of those does its own
//! synchronization, so this module holds no lock of its own.
//!
//! When no backend is available (all down or draining) the client is closed
//! at once, or with `--http-replies` answered `503` first, by one
//! non-blocking write (see [`crate::health::reply_at_once`]).
//!
//! With `--rate-limit`, each client is first checked against the per-IP
//! limiter (`Acceptor::admit`): a refused client is counted, logged once per
//! window, closed here and never queued. Closing it never blocks: with the
//! `http` reply it gets one non-blocking write and a few non-blocking reads
//! (see [`limiter::refuse`]); the 429 and the 503 are the only bytes this
//! thread ever moves.
//!
//! An `accept(2)` error is never fatal. `ECONNABORTED` (the client left
//! before we took it) and `EINTR` are retried at once; anything else
//! (`EMFILE`: out of file descriptors, `ENOBUFS`, `ENOMEM`) is logged and
//! retried after a short back-off, since retrying at once would spin on the
//! same error while the connections in flight free what it needs.
//!
//! # Corresponds to the C article
//!
//! `create_balancer_socket()` and the `while (1)` loop of `main()`. The C
//! calls `exit()` on any `accept` error; binds `INADDR_ANY` only; and, after
//! queueing, calls `get_next_thread()`, which may `pthread_join` a busy
//! thread and so stop accepting until that connection ends.

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use crate::error::{Error, Result};
use crate::limiter::{self, Decision, Limiter};
use crate::pool::Pool;
use crate::proxy::Job;
use crate::scheduler::Scheduler;
use crate::shutdown::Shutdown;
use crate::stats::Stats;

/// Pause after an `accept(2)` error that is not the client's doing.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Creates the listening socket: `SO_REUSEADDR`, bound, listening with
/// `backlog`.
///
/// `SO_REUSEADDR` lets a restarted balancer bind at once even while
/// connections of the previous run linger in `TIME_WAIT` (the article's
/// reason too).
///
/// # Errors
///
/// [`Error::Bind`] with the address and the system's reason.
pub fn bind(addr: SocketAddr, backlog: i32) -> Result<TcpListener> {
    let fail = |source| Error::Bind { addr, source };
    let socket =
        Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP)).map_err(fail)?;
    socket.set_reuse_address(true).map_err(fail)?;
    socket.bind(&addr.into()).map_err(fail)?;
    socket.listen(backlog).map_err(fail)?;
    Ok(socket.into())
}

/// What the accept loop needs besides the socket.
pub(crate) struct Acceptor<'a> {
    pub scheduler: &'a Scheduler,
    pub pool: &'a Pool<Job>,
    pub stats: &'a Arc<Stats>,
    pub shutdown: &'a Shutdown,
    /// The rate limiter, when `--rate-limit` is on.
    pub limiter: Option<&'a Limiter>,
    /// Answer `503 Service Unavailable` when no backend is available.
    pub http_replies: bool,
}

impl Acceptor<'_> {
    /// Accepts clients until shutdown is triggered.
    pub fn run(&self, listener: &TcpListener) {
        let stop = self.shutdown.receiver();
        loop {
            let (client, peer) = match listener.accept() {
                Ok(accepted) => accepted,
                Err(err) => {
                    if self.shutdown.is_triggered() {
                        return;
                    }
                    Stats::incr(&self.stats.accept_errors);
                    match err.kind() {
                        ErrorKind::ConnectionAborted | ErrorKind::Interrupted => {}
                        _ => {
                            log::error!("accept failed: {err}; retrying in {ACCEPT_BACKOFF:?}");
                            // Sleeps, but wakes at once on shutdown.
                            let _ = stop.recv_timeout(ACCEPT_BACKOFF);
                        }
                    }
                    continue;
                }
            };
            if self.shutdown.is_triggered() {
                // The wake-up connection, or a client that came too late.
                return;
            }
            Stats::incr(&self.stats.accepted);
            let Some(client) = self.admit(client, peer) else {
                continue;
            };
            if let Err(err) = client.set_nodelay(true) {
                log::debug!("client {peer}: cannot set TCP_NODELAY: {err}");
            }
            let Some(pick) = self.scheduler.pick(peer.ip()) else {
                Stats::incr(&self.stats.no_backend);
                log::warn!(
                    "closing client {peer}: no backend is available \
                     (all {} down or draining)",
                    self.scheduler.snapshot().len()
                );
                if self.http_replies {
                    crate::health::reply_at_once(&client, crate::health::REPLY_503);
                }
                continue;
            };
            if self.pool.submit(Job { pick, client, peer }).is_err() {
                // The pool closed while we waited for room: shutting down.
                return;
            }
        }
    }

    /// The rate-limit gate: gives the client back if it may go on; else
    /// counts it, logs its first refusal of the window, ends it without
    /// blocking (see [`limiter::refuse`]) and returns `None`.
    fn admit(&self, client: TcpStream, peer: SocketAddr) -> Option<TcpStream> {
        let Some(limiter) = self.limiter else {
            return Some(client);
        };
        let Decision::Refused { first, retry_after } = limiter.check(peer.ip(), Instant::now())
        else {
            return Some(client);
        };
        Stats::incr(&self.stats.rate_limited);
        if first {
            log::info!(
                "rate limit: refusing {} for {retry_after:.1?} (over {}); \
                 its further refusals in this window are counted, not logged",
                peer.ip(),
                limiter.config().rate
            );
        }
        limiter::refuse(client, limiter.config().reply, retry_after);
        None
    }
}
