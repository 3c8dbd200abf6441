//! What a worker does with one connection: connect to the backend (failing
//! over to the next one), turn on TCP keep-alive on both sockets when
//! `tcp_keepalive` asks for it, pump bytes both ways until both sides are
//! done ([`pump()`]), then shut down and close both sockets, count how the
//! connection ended (the `ended_*` counters, by [`End`]) and log it.
//!
//! Clean closes and resets by either peer are how connections normally end
//! (many TLS clients close with a reset), so they are logged at `debug`;
//! timeouts and failed writes at `info`. Warnings are kept for what an
//! operator can act on: backends that cannot be reached.
//!
//! Only worker threads run this code, each on its own connection. They share
//! the scheduler (read for fail-over), the counters (atomics) and the live
//! settings (an [`ArcSwap`], read once per connection: a connection keeps the
//! settings it started with, and a change applies to the next one). The
//! pump's buffers and pipes are thread-local, so nothing here takes a lock.
//!
//! A client that waited in the queue longer than
//! [`ProxyConfig::queue_timeout`] (all workers busy) is closed before any
//! backend is connected, when a worker finally takes it: it has most likely
//! given up, and serving it late would spend a backend connection on
//! nobody. The worker checks [`Job::queued_at`] as it starts; nothing
//! watches the queue in between, so such a client is closed as soon as a
//! worker frees up, not at the very moment its time runs out.
//!
//! With [`ProxyConfig::client_first_byte_timeout`] (off by default), a
//! client that has sent nothing that long after it was accepted is closed
//! the same way, before a backend is connected: the worker waits for its
//! first byte with `poll(2)`, so a crowd of silent clients (slowloris)
//! holds each worker for that long at most instead of `idle_timeout`.
//!
//! # Parts
//!
//! - this file: [`Proxy::handle`], the connection's life and fail-over;
//! - [`mod@pump`]: the duplex state machine, copying or splicing;
//! - `conduit`: the thread's buffers and pipes the pump moves bytes through;
//! - [`mod@header`]: the PROXY protocol on the worker: reading a client's
//!   header (then the limiter and the pick, [`Route::AfterHeader`]) and
//!   sending one to the backends that take it.
//!
//! # Corresponds to the C article
//!
//! `proxy_function()`. The C reads one chunk of the request (at most 4090
//! bytes), sends it with `strlen(buffer)` (so binary data is cut at the first
//! zero byte), then copies the reply until the backend closes. It cannot
//! serve a request larger than a chunk, a second request on the same
//! connection, or a protocol where the client speaks again after the reply
//! starts; and any read error calls `exit()`, ending every other connection
//! too. Here errors end only this connection, and both directions stream for
//! as long as either side has data. The final `shutdown(SHUT_RDWR)` then
//! `close()` on both sockets is the C's, kept on every path. Its
//! `get_final_server_socket()` is [`Backend::connect`].

mod conduit;
pub mod header;
pub mod pump;

use std::io;
use std::net::{Shutdown as Direction, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::{ArcSwap, ArcSwapOption};
use socket2::{SockRef, TcpKeepalive};

use crate::access_log::{AccessLog, End as LogEnd, Record};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::health::{self, HealthConfig};
use crate::limiter::Limiter;
use crate::reply;
use crate::scheduler::{Pick, Scheduler};
use crate::stats::Stats;
use crate::system;
use crate::throttle::{self, LogThrottle};
use crate::trace::{self, Event};
use crate::units::format_duration;

pub use header::{AcceptProxy, Route};
pub use pump::{pump, splice_pump, End, Outcome, PumpOptions, Transfer};

/// One accepted client, with the backend chosen for it at accept time: the
/// `(server_idx, client_sock)` pair of the C queue. Behind
/// `--accept-proxy` the choice waits for the client's PROXY protocol
/// header ([`Route::AfterHeader`], see [`mod@header`]).
#[derive(Debug)]
pub struct Job {
    /// The backend picked by the scheduler, or "pick after the header".
    pub route: Route,
    /// The client's socket.
    pub client: TcpStream,
    /// The client's address, as the socket's peer.
    pub peer: SocketAddr,
    /// When the accept loop queued it: a worker that takes it after more
    /// than [`ProxyConfig::queue_timeout`] closes it unserved.
    pub queued_at: Instant,
}

/// How the workers connect and move bytes (a part of [`crate::Config`]).
/// Every field may change while the balancer runs; a connection keeps the
/// values it started with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyConfig {
    /// Bytes per read, each direction (`buffer_size`). Default 4096, the
    /// article's chunk.
    pub buffer_size: usize,
    /// Longest wait for one backend connect (`connect_timeout`). Default 3 s.
    pub connect_timeout: Duration,
    /// Longest time a connection may move no byte (`idle_timeout`).
    /// Default 10 min.
    pub idle_timeout: Duration,
    /// Move bytes with `splice(2)` ([`splice_pump`]) instead of buffers
    /// (`splice`). Default off: the article's pump copies through a buffer.
    pub splice: bool,
    /// Yield once before each wait that follows moved bytes
    /// (`yield_before_poll`). Default off.
    pub yield_before_poll: bool,
    /// Longest a client may wait in the queue for a free worker
    /// (`queue_timeout`, HAProxy's `timeout queue`); one that waited longer
    /// is closed unserved (or answered 503 with `http_replies`) when a
    /// worker takes it. Default [`DEFAULT_QUEUE_TIMEOUT`].
    pub queue_timeout: Duration,
    /// Close a client that has sent nothing this long after it was
    /// accepted, before any backend is connected
    /// (`client_first_byte_timeout`). Default `None` (off): in protocols
    /// where the server speaks first (SMTP, FTP, MySQL) the client waits in
    /// silence for the greeting, which would never come.
    pub client_first_byte_timeout: Option<Duration>,
    /// Once one side has closed its write side, the longest time the other
    /// may stay silent before the connection is closed (`fin_timeout`).
    /// Default `None`: the same as `idle_timeout`.
    pub fin_timeout: Option<Duration>,
    /// TCP keep-alive on both sockets of each connection (`tcp_keepalive`):
    /// the first probe after this long without traffic (`TCP_KEEPIDLE`),
    /// then one every third of it (at least 1 s, `TCP_KEEPINTVL`), and the
    /// connection is dropped after 3 unanswered (`TCP_KEEPCNT`). Default
    /// `None` (off).
    pub tcp_keepalive: Option<Duration>,
}

/// Default of `queue_timeout`: 30 s, the low end of HAProxy's example
/// `timeout queue` values (30 s to 1 min). A client that has waited that
/// long for a worker has most likely given up already (people do within
/// seconds; many HTTP clients time out at 30 s), so serving it would only
/// spend a backend connection on nobody, while a burst that the workers
/// clear in a few seconds is never cut.
pub const DEFAULT_QUEUE_TIMEOUT: Duration = Duration::from_secs(30);

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            buffer_size: 4096,
            connect_timeout: Duration::from_secs(3),
            idle_timeout: Duration::from_secs(600),
            splice: false,
            yield_before_poll: false,
            queue_timeout: DEFAULT_QUEUE_TIMEOUT,
            client_first_byte_timeout: None,
            fin_timeout: None,
            tcp_keepalive: None,
        }
    }
}

/// The largest `buffer_size` accepted.
pub const MAX_BUFFER_SIZE: usize = 16 * 1024 * 1024;

/// The largest `tcp_keepalive` accepted: Linux's limit for `TCP_KEEPIDLE`.
pub const MAX_TCP_KEEPALIVE: Duration = Duration::from_secs(32767);

/// Unanswered keep-alive probes before the kernel drops a connection.
const KEEPALIVE_PROBES: u32 = 3;

impl ProxyConfig {
    /// Checks that every value is usable.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSetting`] naming the first bad setting.
    pub fn validate(&self) -> Result<()> {
        if self.buffer_size == 0 || self.buffer_size > MAX_BUFFER_SIZE {
            return Err(Error::setting(
                "buffer_size",
                format!(
                    "must be 1..{MAX_BUFFER_SIZE} bytes, got {}",
                    self.buffer_size
                ),
            ));
        }
        for (name, d) in [
            ("connect_timeout", self.connect_timeout),
            ("idle_timeout", self.idle_timeout),
            ("queue_timeout", self.queue_timeout),
        ] {
            if d.is_zero() {
                return Err(Error::setting(name, "must be more than 0"));
            }
        }
        if self.client_first_byte_timeout == Some(Duration::ZERO) {
            return Err(Error::setting(
                "client_first_byte_timeout",
                "must be more than 0",
            ));
        }
        if self.fin_timeout.is_some_and(|d| d.is_zero()) {
            return Err(Error::setting("fin_timeout", "must be more than 0"));
        }
        if let Some(idle) = self.tcp_keepalive {
            // The kernel counts these in whole seconds.
            if idle < Duration::from_secs(1) || idle > MAX_TCP_KEEPALIVE || idle.subsec_nanos() != 0
            {
                return Err(Error::setting(
                    "tcp_keepalive",
                    format!(
                        "must be 1s..{}s (whole seconds), got {idle:?}",
                        MAX_TCP_KEEPALIVE.as_secs()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// What the pump needs of these settings.
    pub fn pump_options(&self) -> PumpOptions {
        PumpOptions {
            idle_timeout: self.idle_timeout,
            fin_timeout: self.fin_timeout.unwrap_or(self.idle_timeout),
            yield_before_poll: self.yield_before_poll,
        }
    }
}

/// First pause of a worker whose backend connect found no descriptor left.
const OUT_OF_DESCRIPTORS_FIRST_PAUSE: Duration = Duration::from_millis(5);
/// Longest pause between two such tries: shorter than the accept loop's
/// back-off, so that a freed descriptor more often goes to a client already
/// accepted than to a new one.
const OUT_OF_DESCRIPTORS_MAX_PAUSE: Duration = Duration::from_millis(50);

/// A client that waited this long in the queue means every worker is busy
/// and clients pile up: the operator is told (at most every
/// [`BUSY_WARNING_EVERY`]).
pub const BUSY_WARNING_AFTER: Duration = Duration::from_secs(1);
/// How often the busy warning may repeat while it lasts.
pub const BUSY_WARNING_EVERY: Duration = Duration::from_secs(10);

/// Longest a worker spends on a 502 reply (writing it, then waiting for the
/// client to close first so the reply is not destroyed by a reset).
const REPLY_LINGER: Duration = Duration::from_secs(1);

/// Reads how many clients wait in the queue.
pub type QueueDepth = Arc<dyn Fn() -> usize + Send + Sync>;

/// Settings and shared state the workers need for every connection.
pub struct Proxy {
    /// Where fail-over finds the other backends.
    pub scheduler: Arc<Scheduler>,
    /// Counters.
    pub stats: Arc<Stats>,
    /// Timeouts, chunk size and the pump's flags, read once per connection.
    pub settings: Arc<ArcSwap<ProxyConfig>>,
    /// Passive health (`passive_failures`) and the 502 reply
    /// (`http_replies`), read once per connection.
    pub health: Arc<ArcSwap<HealthConfig>>,
    /// The rate limiter, for clients behind `--accept-proxy` (checked
    /// here once their header is read; others at accept time).
    pub limiter: Arc<ArcSwapOption<Limiter>>,
    /// `--accept-proxy`: who may send a header and how long it may take.
    pub accept_proxy: Option<AcceptProxy>,
    /// `--access-log`: one line per connection when it ends.
    pub access_log: Option<AccessLog>,
    /// "No backend could be reached" at most once a second.
    pub unreachable_log: LogThrottle,
    /// "Every worker is busy" at most once every 10 s.
    pub busy_log: LogThrottle,
    /// The most workers, for the busy warning.
    pub max_workers: usize,
    /// Clients waiting in the queue now, for the busy warning: set once
    /// the pool (which holds the queue, and is built around this proxy)
    /// exists.
    pub queue_depth: Arc<std::sync::OnceLock<QueueDepth>>,
    /// Clients closed for waiting too long in the queue are logged at most
    /// once a second, with the count of the others.
    pub queue_timeout_log: LogThrottle,
    /// Backend connects that found no descriptor left are logged at most
    /// once a second.
    pub out_of_descriptors_log: LogThrottle,
    /// Clients closed for sending nothing in time are logged at most once
    /// a second.
    pub first_byte_timeout_log: LogThrottle,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("max_workers", &self.max_workers)
            .field("access_log", &self.access_log.is_some())
            .finish_non_exhaustive()
    }
}

/// With this backend name, [`Proxy::handle`] panics once connected: the
/// unit tests' way to show that a panic leaves no counter wrong.
#[cfg(test)]
const PANIC_BACKEND: &str = "panic.test:1";

impl Proxy {
    /// Serves one client from start to end. Never panics on I/O and never
    /// returns an error: whatever happens is logged and ends only this
    /// connection.
    pub fn handle(&self, job: Job) {
        let Job {
            route,
            client,
            peer,
            queued_at,
        } = job;
        if trace::on() {
            trace::taken(client.as_raw_fd(), crate::pool::worker_number());
        }
        let started = Instant::now();
        let settings = self.settings.load_full();
        let health = self.health.load_full();
        let waited = started.saturating_duration_since(queued_at);
        self.stats.histograms.queue_wait.observe(waited);
        if waited >= BUSY_WARNING_AFTER {
            if let Some(others) = self.busy_log.event(Instant::now()) {
                log::warn!(
                    "every worker is busy: a client waited {waited:.1?} in the queue, \
                     {} waiting now (--workers {}){}",
                    self.queue_depth(),
                    self.max_workers,
                    throttle::more(others)
                );
            }
        }
        if waited > settings.queue_timeout {
            self.queue_timed_out(&client, peer, waited, &settings, &health);
            self.log_access(
                peer,
                None,
                queued_at,
                Access {
                    queue_wait: waited,
                    ..Access::refused(LogEnd::QueueTimeout)
                },
            );
            return;
        }
        if let Some(limit) = settings.client_first_byte_timeout {
            let deadline = queued_at + limit;
            if !wait_readable(&client, deadline) {
                Stats::incr(&self.stats.first_byte_timeouts);
                if let Some(others) = self.first_byte_timeout_log.event(Instant::now()) {
                    log::info!(
                        "closing client {peer}: nothing received within {} \
                         (client first byte timeout){}",
                        format_duration(limit),
                        throttle::more(others)
                    );
                }
                close(&client);
                self.log_access(
                    peer,
                    None,
                    queued_at,
                    Access::refused(LogEnd::FirstByteTimeout),
                );
                return;
            }
        }
        let (client, pick, origin) = match (route, &self.accept_proxy) {
            (Route::Picked(pick), _) => {
                let origin = header::Origin {
                    source: peer,
                    destination: None,
                };
                (client, pick, origin)
            }
            (Route::AfterHeader, Some(accept)) => match self.after_header(accept, client, peer) {
                Some(taken) => taken,
                None => return,
            },
            (Route::AfterHeader, None) => {
                log::error!("client {peer} queued for a PROXY header with --accept-proxy off");
                close(&client);
                return;
            }
        };
        // From here on the client is who the header said.
        let peer = origin.source;
        let mut failovers = 0;
        let connecting = Instant::now();
        let connected = self.connect(&pick, &client, origin, &settings, &health, &mut failovers);
        let connect_time = connecting.elapsed();
        let (backend_sock, backend) = match connected {
            Ok(found) => found,
            Err(err) => {
                let reason = match &err {
                    Error::BackendConnect { source, .. } => system::error_words(source),
                    other => other.to_string(),
                };
                self.log_access(
                    peer,
                    Some(pick.backend.name()),
                    queued_at,
                    Access {
                        queue_wait: waited,
                        connect_time: Some(connect_time),
                        failovers,
                        ..Access::refused(LogEnd::ConnectFailed(reason))
                    },
                );
                Stats::incr(&self.stats.no_backend);
                if let Some(others) = self.unreachable_log.event(Instant::now()) {
                    log::warn!(
                        "closing client {peer}: no backend could be reached, last: {err}{}",
                        throttle::more(others)
                    );
                }
                if health.http_replies {
                    reply::reply_and_linger(&client, reply::REPLY_502, REPLY_LINGER);
                }
                close(&client);
                trace::event(Event::Unreachable);
                trace::waiting();
                return;
            }
        };
        let backend_active = backend.start_connection();
        // Counted as active now: the pick's reservation (least connections'
        // count of clients on their way) is released.
        drop(pick);
        // Held by a guard, so that whatever ends the connection (a panic
        // included) takes it off the count.
        let active = self.stats.hold(&self.stats.active);
        #[cfg(test)]
        if backend.name() == PANIC_BACKEND {
            panic!("a test asked for a panic inside a connection");
        }
        if let Some(idle) = settings.tcp_keepalive {
            for (side, socket) in [("client", &client), ("backend", &backend_sock)] {
                if let Err(err) = keep_alive(socket, idle) {
                    log::debug!(
                        "client {peer}: TCP keep-alive not set on the {side} socket: {err}"
                    );
                }
            }
        }
        let options = settings.pump_options();
        let outcome = if settings.splice {
            splice_pump(&client, &backend_sock, &options)
        } else {
            pump(&client, &backend_sock, settings.buffer_size, &options)
        };
        let transfer = outcome.transfer;
        // Counters before the close, so that whoever sees this connection
        // close also sees it counted; `completed` and then the active
        // gauges last, so that whoever sees the connection completed (and
        // no longer active) sees how it ended and its bytes too.
        self.stats
            .histograms
            .connection_duration
            .observe(queued_at.elapsed());
        Stats::incr(ended_counter(&self.stats, outcome.end));
        if !outcome.end.is_clean() {
            Stats::incr(&self.stats.errors);
        }
        Stats::add(&self.stats.bytes_to_backends, transfer.to_backend);
        Stats::add(&self.stats.bytes_to_clients, transfer.to_client);
        backend.add_bytes(transfer.to_backend, transfer.to_client);
        Stats::incr(&self.stats.completed);
        drop(active);
        drop(backend_active);
        // The article's ending: shutdown(SHUT_RDWR), then close(), on both
        // sockets. After an error or the idle timeout it cuts both
        // directions at once; after a clean finish both FINs have already
        // passed and the call only returns ENOTCONN, a cheap system call
        // kept so every connection ends the same, visible way.
        close(&backend_sock);
        close(&client);
        drop(backend_sock);
        drop(client);
        if trace::on() {
            // A timeout has no io::Error of its own: the trace tells it as
            // one, as it tells resets and failed writes.
            let timeout = (outcome.error.is_none() && !outcome.end.is_clean())
                .then(|| io::Error::new(io::ErrorKind::TimedOut, outcome.end.to_string()));
            trace::closed(
                transfer.to_backend,
                transfer.to_client,
                outcome.error.as_ref().or(timeout.as_ref()),
            );
        }
        trace::waiting();
        if self.access_log.is_some() {
            let end = LogEnd::pumped(outcome.end, outcome.error.as_ref());
            self.log_access(
                peer,
                Some(backend.name()),
                queued_at,
                Access {
                    queue_wait: waited,
                    connect_time: Some(connect_time),
                    failovers,
                    transfer,
                    end,
                },
            );
        }
        let elapsed = started.elapsed();
        let why = match &outcome.error {
            Some(err) => format!("{}: {err}", outcome.end),
            None => outcome.end.to_string(),
        };
        // Clean closes and resets are how connections normally end (many
        // TLS clients close with a reset): debug. Timeouts and failed
        // writes: info. Neither calls for an operator, so no warning.
        let level = if outcome.end.is_clean() || outcome.end.is_reset() {
            log::Level::Debug
        } else {
            log::Level::Info
        };
        // "finished" when both sides closed, "ended" otherwise.
        let verb = if outcome.end.is_clean() {
            "finished"
        } else {
            "ended"
        };
        log::log!(
            level,
            "connection {verb}: client {peer} backend {}: {why} (sent {} received {} in {:?})",
            backend.name(),
            transfer.to_backend,
            transfer.to_client,
            elapsed
        );
    }

    /// Clients waiting in the queue now (0 before the pool exists).
    fn queue_depth(&self) -> usize {
        self.queue_depth.get().map_or(0, |f| f())
    }

    /// One access log line, when `--access-log` is on; a line the writer
    /// could not take is counted (`access_log_dropped`).
    pub(crate) fn log_access(
        &self,
        client: SocketAddr,
        backend: Option<&str>,
        queued_at: Instant,
        access: Access,
    ) {
        log_access(
            self.access_log.as_ref(),
            &self.stats,
            client,
            backend,
            queued_at,
            access,
        );
    }

    /// Ends a client that waited longer than `queue_timeout` for a worker,
    /// before any backend is connected: a 503 with `http_replies` (one
    /// non-blocking write, as the accept loop's: a worker that lingered
    /// here would make the backlog that caused the wait grow), then the
    /// close. Counted; logged at most once a second.
    fn queue_timed_out(
        &self,
        client: &TcpStream,
        peer: SocketAddr,
        waited: Duration,
        settings: &ProxyConfig,
        health: &HealthConfig,
    ) {
        Stats::incr(&self.stats.queue_timeouts);
        if let Some(others) = self.queue_timeout_log.event(Instant::now()) {
            log::warn!(
                "closing client {peer}: it waited {waited:.1?} for a free worker \
                 (queue timeout {}; all workers busy){}",
                format_duration(settings.queue_timeout),
                throttle::more(others)
            );
        }
        if health.http_replies {
            reply::reply_at_once(client, reply::REPLY_503_BUSY);
        }
        close(client);
    }

    /// Connects to the picked backend or, failing that, to each other
    /// available backend once, in list order.
    ///
    /// Each attempt gets the whole `connect_timeout`, not a share of one
    /// total: a black-holed backend then costs a client one connect timeout,
    /// and the next backend still gets a full chance. (One total budget
    /// would let a single black hole use it all up and fail the client even
    /// though a live backend was next.) Passive health takes the black hole
    /// out after `passive_failures` such clients, so later ones pay nothing.
    fn connect(
        &self,
        pick: &Pick,
        client: &TcpStream,
        origin: header::Origin,
        settings: &ProxyConfig,
        health: &HealthConfig,
        failed: &mut u32,
    ) -> Result<(TcpStream, Arc<Backend>)> {
        let mut last = match self.try_backend(&pick.backend, client, origin, settings, health) {
            Ok(stream) => return Ok((stream, Arc::clone(&pick.backend))),
            Err(err) => err,
        };
        *failed += 1;
        for backend in self.scheduler.failover_order(&pick.backend) {
            trace::event(Event::FailOver {
                backend: backend.name(),
            });
            match self.try_backend(&backend, client, origin, settings, health) {
                Ok(stream) => return Ok((stream, backend)),
                Err(err) => {
                    *failed += 1;
                    last = err;
                }
            }
        }
        Err(last)
    }

    /// One connect attempt, counted in the stats and (unless it failed for a
    /// reason of this host) in the backend's passive health. A backend that
    /// takes the PROXY protocol is sent its header here, before any client
    /// byte; failing to send it counts as failing to connect.
    ///
    /// When the socket cannot even be created because this process is out
    /// of file descriptors (`EMFILE`, `ENFILE`), the backend is not to
    /// blame: that is not counted against its health (which would mark
    /// every backend down at once), and the worker waits for a connection
    /// to end and free descriptors, trying again with a back-off (from
    /// [`OUT_OF_DESCRIPTORS_FIRST_PAUSE`], doubling) for at most
    /// `connect_timeout`.
    fn try_backend(
        &self,
        backend: &Backend,
        client: &TcpStream,
        origin: header::Origin,
        settings: &ProxyConfig,
        health: &HealthConfig,
    ) -> Result<TcpStream> {
        let started = trace::on().then(Instant::now);
        let deadline = Instant::now() + settings.connect_timeout;
        let mut pause = OUT_OF_DESCRIPTORS_FIRST_PAUSE;
        loop {
            let connected = backend
                .connect(settings.connect_timeout)
                .and_then(|stream| {
                    header::send(backend, &stream, || origin.header(client))?;
                    Ok(stream)
                });
            match connected {
                Err(source) if system::is_out_of_descriptors(&source) => {
                    Stats::incr(&self.stats.out_of_descriptors);
                    let give_up = Instant::now() + pause >= deadline;
                    if let Some(others) = self.out_of_descriptors_log.event(Instant::now()) {
                        log::error!(
                            "cannot connect to backend {}: {source} (this process's \
                             limit; {}){}",
                            backend.name(),
                            if give_up {
                                "giving up on this client"
                            } else {
                                "waiting for connections to end"
                            },
                            throttle::more(others)
                        );
                    }
                    if give_up {
                        return Err(Error::BackendConnect {
                            backend: backend.name().to_string(),
                            source,
                        });
                    }
                    // While any worker waits here, the accept loop holds
                    // off, so a descriptor freed by a connection that ends
                    // goes to a client already accepted rather than to
                    // one more client that would wait too.
                    let _waiting = self.stats.hold(&self.stats.descriptor_waits);
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(OUT_OF_DESCRIPTORS_MAX_PAUSE);
                }
                other => return self.connected_or_failed(backend, other, health, started),
            }
        }
    }

    /// Counts the outcome of one connect attempt that reached the backend
    /// (or tried to): success or failure, in the stats and its passive
    /// health ([`health::connect_failed`], which leaves out a failure of
    /// this host and logs at most a line a second per backend).
    fn connected_or_failed(
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
            Err(source) => {
                Stats::incr(&self.stats.connect_failures);
                let failures = health::connect_failed(backend, health, &source);
                trace::event(Event::ConnectFailed {
                    backend: backend.name(),
                    reason: &source,
                    failures,
                });
                Err(Error::BackendConnect {
                    backend: backend.name().to_string(),
                    source,
                })
            }
        }
    }
}

/// One access log line to `log`, if there is one; a line the writer could
/// not take is counted (`access_log_dropped`). The accept loop calls it
/// for the clients it refuses, workers through [`Proxy::log_access`].
pub(crate) fn log_access(
    log: Option<&AccessLog>,
    stats: &Stats,
    client: SocketAddr,
    backend: Option<&str>,
    accepted: Instant,
    access: Access,
) {
    let Some(log) = log else {
        return;
    };
    if !log.log(access.record(client, backend, accepted)) {
        Stats::incr(&stats.access_log_dropped);
    }
}

/// What an access log line says beyond the client, the backend and the
/// times (see [`Proxy::log_access`]).
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
    pub end: LogEnd,
}

impl Access {
    /// A client ended before any backend was tried.
    pub(crate) fn refused(end: LogEnd) -> Access {
        Access {
            queue_wait: Duration::ZERO,
            connect_time: None,
            failovers: 0,
            transfer: Transfer::default(),
            end,
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
            backend: backend.map(str::to_string),
            queue_wait: self.queue_wait,
            connect_time: self.connect_time,
            duration: since,
            failovers: self.failovers,
            bytes_to_backend: self.transfer.to_backend,
            bytes_to_client: self.transfer.to_client,
            end: self.end,
        }
    }
}

/// Waits with `poll(2)` until `client` has something to read (bytes, or
/// its end of stream: the pump deals with both) or `deadline` passes;
/// whether it became readable. A client already past its deadline is looked
/// at once, without waiting: one that waited in the queue longer than the
/// first-byte timeout gets no second one.
fn wait_readable(client: &TcpStream, deadline: Instant) -> bool {
    use std::os::fd::AsRawFd;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        // Rounded up, so a wait of 0.3 ms is not a wait of 0.
        let ms = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        let mut fd = libc::pollfd {
            fd: client.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, for the length of the call.
        let rc = unsafe { libc::poll(&mut fd, 1, ms) };
        if rc > 0 {
            return true;
        }
        if rc == 0 {
            return false;
        }
        if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            // A poll error on our own socket: let the pump meet it.
            return true;
        }
    }
}

/// The `ended_*` counter of `end`.
fn ended_counter(stats: &Stats, end: End) -> &AtomicU64 {
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

/// Turns on TCP keep-alive on `socket`: first probe after `idle` without
/// traffic, then every `idle / 3` (at least 1 s), dropped after
/// [`KEEPALIVE_PROBES`] unanswered. Four `setsockopt` calls.
fn keep_alive(socket: &TcpStream, idle: Duration) -> io::Result<()> {
    let interval = (idle / 3).max(Duration::from_secs(1));
    let params = TcpKeepalive::new()
        .with_time(idle)
        .with_interval(interval)
        .with_retries(KEEPALIVE_PROBES);
    SockRef::from(socket).set_tcp_keepalive(&params)
}

/// `shutdown(SHUT_RDWR)` then close, as the C does; errors are irrelevant
/// here (the peer may be gone already), so they are ignored.
fn close(stream: &TcpStream) {
    let _ = stream.shutdown(Direction::Both);
    // The descriptor itself is closed when the `TcpStream` is dropped.
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::Pool;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    #[test]
    fn the_fast_paths_are_off_by_default() {
        let c = ProxyConfig::default();
        assert!(!c.splice);
        assert!(!c.yield_before_poll);
        assert_eq!(c.buffer_size, 4096);
    }

    #[test]
    fn keep_alive_sets_idle_interval_and_count() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (b, _) = listener.accept().unwrap();
        for (idle, interval) in [(60, 20), (2, 1)] {
            for socket in [&a, &b] {
                keep_alive(socket, Duration::from_secs(idle)).unwrap();
                let s = SockRef::from(socket);
                assert!(s.keepalive().unwrap());
                assert_eq!(s.keepalive_time().unwrap(), Duration::from_secs(idle));
                assert_eq!(
                    s.keepalive_interval().unwrap(),
                    Duration::from_secs(interval)
                );
                assert_eq!(s.keepalive_retries().unwrap(), KEEPALIVE_PROBES);
            }
        }
    }

    #[test]
    fn fin_timeout_defaults_to_the_idle_timeout_and_keepalive_is_off() {
        let c = ProxyConfig::default();
        assert_eq!(c.fin_timeout, None);
        assert_eq!(c.tcp_keepalive, None);
        assert_eq!(c.pump_options().fin_timeout, c.idle_timeout);
        let c = ProxyConfig {
            fin_timeout: Some(Duration::from_secs(5)),
            ..ProxyConfig::default()
        };
        assert_eq!(c.pump_options().fin_timeout, Duration::from_secs(5));
        assert_eq!(c.pump_options().idle_timeout, c.idle_timeout);
    }

    #[test]
    fn bad_fin_timeout_and_keepalive_are_named() {
        let bad = |c: ProxyConfig| match c.validate() {
            Err(Error::InvalidSetting { setting, .. }) => setting,
            other => panic!("{other:?}"),
        };
        let zero_fin = ProxyConfig {
            fin_timeout: Some(Duration::ZERO),
            ..ProxyConfig::default()
        };
        assert_eq!(bad(zero_fin), "fin_timeout");
        for idle in [
            Duration::from_millis(500),
            Duration::from_millis(1500),
            Duration::from_secs(40_000),
        ] {
            let c = ProxyConfig {
                tcp_keepalive: Some(idle),
                ..ProxyConfig::default()
            };
            assert_eq!(bad(c), "tcp_keepalive");
        }
        let ok = ProxyConfig {
            fin_timeout: Some(Duration::from_millis(1)),
            tcp_keepalive: Some(Duration::from_secs(1)),
            ..ProxyConfig::default()
        };
        assert!(ok.validate().is_ok());
    }

    #[test]
    fn every_end_has_its_own_counter() {
        let stats = Stats::default();
        let ends = [
            End::ClientClosed,
            End::BackendClosed,
            End::ClientReset,
            End::BackendReset,
            End::IdleTimeout,
            End::FinTimeout,
            End::WriteToClientFailed,
            End::WriteToBackendFailed,
            End::Error,
        ];
        for (i, end) in ends.iter().enumerate() {
            for _ in 0..=i {
                Stats::incr(ended_counter(&stats, *end));
            }
        }
        let s = stats.snapshot();
        assert_eq!(
            [
                s.ended_client_closed,
                s.ended_backend_closed,
                s.ended_client_reset,
                s.ended_backend_reset,
                s.ended_idle_timeout,
                s.ended_fin_timeout,
                s.ended_client_write_failed,
                s.ended_backend_write_failed,
                s.ended_error,
            ],
            [1, 2, 3, 4, 5, 6, 7, 8, 9]
        );
    }

    #[test]
    fn a_panic_inside_a_connection_leaves_the_active_gauge_at_zero() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr().unwrap();
        let backend = Arc::new(Backend::new(PANIC_BACKEND.into(), vec![addr], 1));
        let scheduler = Arc::new(Scheduler::new(vec![Arc::clone(&backend)]));
        let stats = Arc::new(Stats::default());
        let proxy = Arc::new(test_proxy(&scheduler, &stats, HealthConfig::default()));
        let pool = Pool::new(
            1,
            256 * 1024,
            4,
            Arc::clone(&stats),
            Arc::new(move |job: Job| proxy.handle(job)),
        );
        let front = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(front.local_addr().unwrap()).unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let (accepted, peer) = front.accept().unwrap();
        let pick = scheduler.pick(peer.ip()).unwrap();
        pool.submit(Job {
            route: Route::Picked(pick),
            client: accepted,
            peer,
            queued_at: Instant::now(),
        })
        .unwrap();
        // The worker connected, then panicked: the unwinding closed the
        // client, so its read ends.
        let (_at_backend, _) = server.accept().unwrap();
        client.write_all(b"x").ok();
        let mut buf = [0u8; 16];
        let _ = client.read(&mut buf);
        pool.close();
        assert_eq!(pool.wait_exit(Duration::from_secs(10)), 0);
        let s = stats.snapshot();
        assert_eq!(s.worker_panics, 1, "{s:?}");
        assert_eq!(s.active, 0, "{s:?}");
        assert_eq!(backend.active(), 0);
        assert_eq!(backend.total(), 1);
    }

    /// A proxy over `scheduler` with the default settings but `health`.
    fn test_proxy(scheduler: &Arc<Scheduler>, stats: &Arc<Stats>, health: HealthConfig) -> Proxy {
        Proxy {
            scheduler: Arc::clone(scheduler),
            stats: Arc::clone(stats),
            settings: Arc::new(ArcSwap::from_pointee(ProxyConfig::default())),
            health: Arc::new(ArcSwap::from_pointee(health)),
            queue_timeout_log: LogThrottle::new(Duration::from_secs(1)),
            out_of_descriptors_log: LogThrottle::new(Duration::from_secs(1)),
            first_byte_timeout_log: LogThrottle::new(Duration::from_secs(1)),
            limiter: Arc::new(ArcSwapOption::empty()),
            accept_proxy: None,
            access_log: None,
            unreachable_log: LogThrottle::new(Duration::from_secs(1)),
            busy_log: LogThrottle::new(BUSY_WARNING_EVERY),
            max_workers: 1,
            queue_depth: Arc::default(),
        }
    }

    /// Passive health blames a backend for its own failures only: a connect
    /// that failed for a reason of this host (no buffer, memory, local port
    /// or descriptor left) leaves its failures in a row and its health
    /// alone, even with `passive_failures` 1; a refusal counts at once.
    #[test]
    fn a_local_connect_failure_does_not_count_against_the_backend() {
        let b = Arc::new(Backend::new("b".into(), vec![], 1));
        let scheduler = Arc::new(Scheduler::new(vec![Arc::clone(&b)]));
        let stats = Arc::new(Stats::default());
        let health = HealthConfig {
            passive_failures: 1,
            ..HealthConfig::default()
        };
        let proxy = test_proxy(&scheduler, &stats, health.clone());
        let fail = |code| {
            let attempt = Err(io::Error::from_raw_os_error(code));
            assert!(proxy
                .connected_or_failed(&b, attempt, &health, None)
                .is_err());
        };
        for code in [
            libc::ENOBUFS,
            libc::ENOMEM,
            libc::EADDRNOTAVAIL,
            libc::EMFILE,
            libc::ENFILE,
        ] {
            fail(code);
            assert_eq!(b.connect_failures_in_a_row(), 0, "errno {code}");
            assert!(b.is_healthy(), "errno {code}");
        }
        assert_eq!(b.connect_failures_total(), 0);
        fail(libc::ECONNREFUSED);
        assert_eq!(b.connect_failures_in_a_row(), 1);
        assert!(!b.is_healthy());
        // Every failed attempt is still a failed connect in the counters.
        assert_eq!(stats.snapshot().connect_failures, 6);
    }
}
