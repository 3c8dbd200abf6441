//! What a worker does with one connection, the article's
//! `proxy_function()`: [`Proxy::handle`] is
//! `self.serve(job, &mut outcome); self.report.tell(&outcome)`.
//!
//! # Parts
//!
//! - this file: [`Job`] (made by [`Job::new`] only), the settings
//!   ([`ProxyConfig`]) and [`Proxy`];
//! - `admission`: the one gate every client passes (allow and deny, the
//!   per-client cap, the rate limit, the pick), on the accept loop or,
//!   after a PROXY header or SNI, on the worker;
//! - `serve`: the chain wait → route (and the gate, where it runs here) →
//!   TLS → a slot → connect → pump → close;
//! - `validate`: each of [`ProxyConfig`]'s values checked;
//! - `listed`: the connection's place in the connections' table;
//! - `waiting`: a client waiting for a slot when every backend is at its
//!   `max_connections`;
//! - `connect`: the backend connect, with fail-over;
//! - `report`: the connection's `Outcome` and the one place it becomes
//!   counters, access log, trace and log lines; `refusal`: why a client
//!   was refused, and each refusal's rows;
//! - `pumps`: which pump a connected client gets (copy or pipes, TLS,
//!   or the carried one's);
//! - [`mod@pump`]: the duplex state machine, copying or splicing;
//! - [`mod@kernel_relay`]: an eBPF sockmap program that moves a promoted
//!   connection's bytes in the kernel;
//! - [`crate::conduit`] (below, re-exported here): the thread's buffers
//!   and pipes the pump moves bytes through;
//! - [`mod@header`]: a client's route, and the PROXY protocol on the worker;
//! - `per_client`: the cap on connections open per client address;
//! - `carried`: a connection carried in from the previous process
//!   (`upgrade_socket`), its job and its link.
//!
//! # Threads
//!
//! Worker threads run this code, each on its own connection; the accept
//! loops run the gate (`admission`) and `report` for the clients they
//! refuse. They share the scheduler, the counters (atomics) and the live
//! settings (an [`ArcSwap`], read once per connection: a change applies to
//! the next one). The locks taken here are short and never held across
//! I/O: the waitlist's, by a client waiting for a slot (`waiting`); the
//! limiter's and the per-client table's shards, when those are on.
//!
//! # Corresponds to the C article
//!
//! `proxy_function()` (see `serve`); `get_final_server_socket()` is
//! [`Backend::connect`](crate::backend::Backend::connect).

mod admission;
mod carried;
mod connect;
pub mod header;
pub mod kernel_relay;
mod listed;
mod per_client;
pub mod pump;
mod pumps;
mod refusal;
mod report;
mod serve;
mod validate;
mod waiting;

use std::io;
use std::net::{Shutdown as Direction, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::{ArcSwap, ArcSwapOption};
use socket2::{SockRef, TcpKeepalive};

use crate::access_log::AccessLog;
pub(crate) use crate::conduit;
use crate::health::HealthConfig;
use crate::limiter::Limiter;
use crate::proxy_protocol::CidrList;
use crate::reserve::Reserve;
use crate::scheduler::Scheduler;
use crate::stats::Stats;
use crate::units::{ByteRate, Switch};

pub(crate) use admission::Admitted;
pub use carried::Carried;
pub use header::{AcceptProxy, Divert, Route};
pub(crate) use per_client::PerClient;
pub use pump::{pump, splice_pump, End, PumpOptions, Transfer};
pub(crate) use report::{Fate, Outcome, Refusal, Report};
pub(crate) use serve::answer;

/// One accepted client, with the backend chosen for it at accept time: the
/// `(server_idx, client_sock)` pair of the C queue. Behind
/// `--accept-proxy` the choice waits for the client's PROXY protocol
/// header ([`Route::AfterHeader`], see [`mod@header`]), on an address
/// shared by SNI for its ClientHello ([`Route::Unrouted`]); a client that
/// found every backend at its cap waits for a slot ([`Route::Waiting`]).
#[derive(Debug)]
pub struct Job {
    /// The runtime of the service the client came to (its [`Proxy`]):
    /// its backends, settings and counters.
    pub proxy: Arc<Proxy>,
    /// Its place under the service's `max_connections`, given back when
    /// the job ends.
    pub slot: Option<crate::slots::Slot>,
    /// Its place in its address's count under
    /// `max_connections_per_client`, given back when the job ends.
    pub place: Option<crate::limiter::Place>,
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

impl Job {
    /// The job of `client` (from `peer`) for the service run by `proxy`, on `route`, with
    /// its places under the service's and the per-client caps, queued
    /// now. The one place a job is made. It makes no system call: the
    /// client's `TCP_NODELAY` came with it from the listening socket
    /// (`listener.rs`), so the accept loop does only accept, the gate and
    /// the push.
    pub fn new(
        proxy: Arc<Proxy>,
        client: TcpStream,
        peer: SocketAddr,
        route: Route,
        slot: Option<crate::slots::Slot>,
        place: Option<crate::limiter::Place>,
    ) -> Job {
        Job {
            proxy,
            slot,
            place,
            route,
            client,
            peer,
            queued_at: Instant::now(),
        }
    }
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
    /// Other backends tried after a failed connect (`connect_retries`).
    /// Default `None`: every candidate.
    pub connect_retries: Option<u32>,
    /// Longest all of a client's connects take together
    /// (`connect_retry_budget`). Default `None` (off).
    pub connect_retry_budget: Option<Duration>,
    /// Longest time a connection may move no byte (`idle_timeout`).
    /// Default 10 min.
    pub idle_timeout: Duration,
    /// Move bytes with `splice(2)` ([`splice_pump`]) instead of buffers
    /// (`splice`). Default off: the article's pump copies through a buffer.
    pub splice: bool,
    /// Yield once before a wait that follows moved bytes
    /// (`yield_before_poll`): `Off` (the default) never, `Auto` while it
    /// pays on the connection, `On` before every such wait.
    pub yield_before_poll: Switch,
    /// Longest a client may wait in the queue for a free worker
    /// (`queue_timeout`, HAProxy's `timeout queue`); one that waited longer
    /// is closed unserved (or answered 503 with `http_replies`) when a
    /// worker takes it. Default [`DEFAULT_QUEUE_TIMEOUT`].
    pub queue_timeout: Duration,
    /// Most clients of the service waiting at once for a slot when every
    /// backend is at its `max_connections` (`max_queue`, HAProxy's
    /// `maxqueue`); one more is refused at once. 0: none wait. Default
    /// [`DEFAULT_MAX_QUEUE`].
    pub max_queue: usize,
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
    /// `TCP_USER_TIMEOUT` on both sockets of each connection
    /// (`tcp_user_timeout`): how long sent data may stay unacknowledged
    /// before the kernel drops the connection. Default `None` (off).
    pub tcp_user_timeout: Option<Duration>,
    /// Only clients from these networks are served (`allow`, nginx's
    /// `allow`). Default `None`: every client.
    pub allow: Option<CidrList>,
    /// Clients from these networks are refused (`deny`, nginx's `deny`),
    /// even when `allow` lists them. Default `None`: none.
    pub deny: Option<CidrList>,
    /// Look the backends given by name up again this often
    /// (`resolve_interval`, nginx's `resolve`, HAProxy's `resolvers`), on
    /// the resolver thread (`resolver.rs`); a reload looks them up again
    /// whatever this says. Kept here because it is live per service like
    /// the rest, though no worker reads it. Default `None` (off).
    pub resolve_interval: Option<Duration>,
    /// The nameservers `srv:` backends are asked of; `None` (the
    /// default): the system's (`/etc/resolv.conf`).
    pub resolvers: Option<crate::srv::Nameservers>,
    /// Backends followed from etcd (`backends_from`,
    /// `etcd://HOST:PORT/PREFIX`) beside the file's, by the service's
    /// `rodizio-etcd` thread (`etcd_follow.rs`); no worker reads it.
    /// Default `None` (off).
    pub backends_from: Option<crate::etcd::EtcdSource>,
    /// Most connections open at once from one client address
    /// (`max_connections_per_client`, nginx's `limit_conn`); see
    /// `per_client`. Default `None`: no cap.
    pub max_connections_per_client: Option<usize>,
    /// Most bytes a second read from each client (`upload_rate`, nginx's
    /// `proxy_upload_rate`), per connection. Default `None` (or 0): no cap.
    pub upload_rate: Option<ByteRate>,
    /// Most bytes a second read from the backend of each connection
    /// (`download_rate`, nginx's `proxy_download_rate`). Default `None`
    /// (or 0): no cap.
    pub download_rate: Option<ByteRate>,
    /// Hand a long-lived, chatty connection to the kernel relay
    /// (`kernel_relay`, see [`kernel_relay`]): an eBPF sockmap program
    /// then moves its bytes. `Auto`: where the program loads. Default `Off`.
    pub kernel_relay: Switch,
    /// Exchanges (a request and its reply) a connection makes on the copy
    /// pump before the hand-over (`kernel_relay_after`); 0: from the
    /// start. Default [`DEFAULT_KERNEL_RELAY_AFTER`].
    pub kernel_relay_after: u32,
    /// What ends its connections on purpose: `on_backend_down`,
    /// `on_backend_removed`, `removed_drain_timeout`,
    /// `max_connection_lifetime` and its jitter. Default: none does.
    pub ends: crate::connections::Ends,
}

/// Default of `kernel_relay_after`: past the few exchanges of a short
/// connection (a handshake, one request), so that only connections that
/// go on talking pay the hand-over.
pub const DEFAULT_KERNEL_RELAY_AFTER: u32 = 4;

/// Shortest `resolve_interval`: a lookup per backend more often than once
/// a second would load a DNS server for nothing (records live for seconds
/// at least).
pub const MIN_RESOLVE_INTERVAL: Duration = Duration::from_secs(1);

/// Longest `resolve_interval`: a day. Longer is a typo, or meant `off`.
pub const MAX_RESOLVE_INTERVAL: Duration = Duration::from_secs(24 * 3600);

/// Default of `queue_timeout`: 30 s, the low end of HAProxy's example
/// `timeout queue` values (30 s to 1 min). A client that has waited that
/// long for a worker has most likely given up already (people do within
/// seconds; many HTTP clients time out at 30 s), so serving it would only
/// spend a backend connection on nobody, while a burst that the workers
/// clear in a few seconds is never cut.
pub const DEFAULT_QUEUE_TIMEOUT: Duration = Duration::from_secs(30);

/// Default of `max_queue`: each waiting client holds a worker thread, so
/// the line is kept well under the default 4096 workers.
pub const DEFAULT_MAX_QUEUE: usize = 256;

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            buffer_size: 4096,
            connect_timeout: Duration::from_secs(3),
            connect_retries: None,
            connect_retry_budget: None,
            idle_timeout: Duration::from_secs(600),
            splice: false,
            yield_before_poll: Switch::Off,
            queue_timeout: DEFAULT_QUEUE_TIMEOUT,
            max_queue: DEFAULT_MAX_QUEUE,
            client_first_byte_timeout: None,
            fin_timeout: None,
            tcp_keepalive: None,
            tcp_user_timeout: None,
            allow: None,
            deny: None,
            resolve_interval: None,
            resolvers: None,
            backends_from: None,
            max_connections_per_client: None,
            upload_rate: None,
            download_rate: None,
            kernel_relay: Switch::Off,
            kernel_relay_after: DEFAULT_KERNEL_RELAY_AFTER,
            ends: crate::connections::Ends::default(),
        }
    }
}

/// The largest `buffer_size` accepted.
pub const MAX_BUFFER_SIZE: usize = 16 * 1024 * 1024;

/// Unanswered keep-alive probes before the kernel drops a connection.
const KEEPALIVE_PROBES: u32 = 3;

/// The largest `tcp_keepalive` accepted: Linux's limit for `TCP_KEEPIDLE`.
pub const MAX_TCP_KEEPALIVE: Duration = Duration::from_secs(32767);

impl ProxyConfig {
    /// Turns on TCP keep-alive and sets `TCP_USER_TIMEOUT` on both sockets
    /// of a connection of `peer` when these settings ask for them; a socket
    /// that refuses is logged (debug) and served anyway.
    fn keep_alive(&self, client: &TcpStream, backend: &TcpStream, peer: SocketAddr) {
        if self.tcp_keepalive.is_none() && self.tcp_user_timeout.is_none() {
            return;
        }
        for (side, socket) in [("client", client), ("backend", backend)] {
            if let Some(idle) = self.tcp_keepalive {
                if let Err(err) = keep_alive(socket, idle) {
                    log::debug!(
                        "client {peer}: TCP keep-alive not set on the {side} socket: {err}"
                    );
                }
            }
            if let Some(limit) = self.tcp_user_timeout {
                if let Err(err) = SockRef::from(socket).set_tcp_user_timeout(Some(limit)) {
                    log::debug!(
                        "client {peer}: TCP_USER_TIMEOUT not set on the {side} socket: {err}"
                    );
                }
            }
        }
    }

    /// Whether a client from `ip` may be served: not in `deny`, and in
    /// `allow` when it is set. The address is the socket's peer, or the
    /// PROXY protocol header's with `accept_proxy`.
    pub fn admits(&self, ip: std::net::IpAddr) -> bool {
        !self.deny.as_ref().is_some_and(|d| d.contains(ip))
            && self.allow.as_ref().map_or(true, |a| a.contains(ip))
    }

    /// What the pump needs of these settings.
    pub fn pump_options(&self) -> PumpOptions {
        PumpOptions {
            idle_timeout: self.idle_timeout,
            fin_timeout: self.fin_timeout.unwrap_or(self.idle_timeout),
            yield_before_poll: self.yield_before_poll,
            up_rate: self.upload_rate.and_then(ByteRate::per_second),
            down_rate: self.download_rate.and_then(ByteRate::per_second),
            // A capped direction keeps its bucket on the copy pump; `auto`
            // where the program did not load never tries (last: the one
            // check that reads shared state).
            promote: !self.splice
                && self.upload_rate.and_then(ByteRate::per_second).is_none()
                && self.download_rate.and_then(ByteRate::per_second).is_none()
                && kernel_relay::promotes(self.kernel_relay),
            promote_after: self.kernel_relay_after,
        }
    }
}

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
    pub(crate) scheduler: Arc<Scheduler>,
    /// The service's counters.
    pub(crate) stats: Arc<Stats>,
    /// The process's counters, for what every service's accept loop reads
    /// (`descriptor_waits`): the service's own by default.
    pub(crate) process: Arc<Stats>,
    /// The process's descriptors kept for the workers' backend sockets
    /// (`crate::reserve`): the accept loops take a client only while it
    /// is whole; none by default.
    pub(crate) spare: Arc<Reserve>,
    /// Timeouts, chunk size and the pump's flags, read once per connection.
    pub(crate) settings: Arc<ArcSwap<ProxyConfig>>,
    /// Passive health and the 502 reply
    /// (`http_replies`), read once per connection.
    pub(crate) health: Arc<ArcSwap<HealthConfig>>,
    /// The rate limiter, read by the admission gate (`admission`) for
    /// every client: at accept time, or once its header or SNI is read.
    pub(crate) limiter: Arc<ArcSwapOption<Limiter>>,
    /// `--accept-proxy`: who may send a header and how long it may take.
    pub(crate) accept_proxy: Option<AcceptProxy>,
    /// The connections open per client address, made when
    /// `max_connections_per_client` is first on (see `per_client`).
    clients: ArcSwapOption<crate::limiter::ConnTable>,
    /// TLS termination, for a service with `tls_certs`: `None` (plain
    /// TCP) costs the plain path one test of this field.
    pub(crate) tls: Option<Arc<ArcSwap<crate::tls_term::Terminator>>>,
    /// Where outcomes are counted and logged, with the log throttles.
    pub(crate) report: Report,
    /// The most workers, for the busy warning.
    max_workers: usize,
    /// Clients waiting in the queue now, for the busy warning: set once
    /// the pool (which holds the queue, and is built around this proxy)
    /// exists.
    queue_depth: Arc<std::sync::OnceLock<QueueDepth>>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("max_workers", &self.max_workers)
            .field("access_log", &self.report.access_log().is_some())
            .finish_non_exhaustive()
    }
}

/// With this backend name, [`Proxy::handle`] panics once connected: the
/// unit tests' way to show that a panic leaves no counter wrong.
#[cfg(test)]
const PANIC_BACKEND: &str = "panic.test:1";

impl Proxy {
    /// The workers' proxy over the live `scheduler`, `settings`, `health`
    /// and `limiter` (those a reload swaps), counting in `stats` and
    /// logging to `access_log`.
    pub fn new(
        scheduler: Arc<Scheduler>,
        settings: Arc<ArcSwap<ProxyConfig>>,
        health: Arc<ArcSwap<HealthConfig>>,
        limiter: Arc<ArcSwapOption<Limiter>>,
        stats: Arc<Stats>,
        access_log: Option<AccessLog>,
        accept_proxy: Option<AcceptProxy>,
    ) -> Proxy {
        Proxy {
            scheduler,
            settings,
            health,
            limiter,
            report: Report::new(Arc::clone(&stats), access_log),
            process: Arc::clone(&stats),
            spare: Arc::new(Reserve::new(0)),
            stats,
            accept_proxy,
            clients: ArcSwapOption::empty(),
            tls: None,
            max_workers: 1,
            queue_depth: Arc::default(),
        }
    }

    /// For the busy warning: the most workers, and the queue's length,
    /// filled in once the pool (built around this proxy) exists.
    pub fn busy_warning(
        self,
        max_workers: usize,
        queue_depth: Arc<std::sync::OnceLock<QueueDepth>>,
    ) -> Proxy {
        Proxy {
            max_workers,
            queue_depth,
            ..self
        }
    }

    /// Names the service `name` on its access log lines (not `default`).
    pub fn named(self, name: &str) -> Proxy {
        Proxy {
            report: self.report.for_service(name),
            ..self
        }
    }

    /// Terminates TLS with `tls` (the service's live terminator).
    pub fn terminating(self, tls: Option<Arc<ArcSwap<crate::tls_term::Terminator>>>) -> Proxy {
        Proxy { tls, ..self }
    }

    /// Shares with every service of the process what their accept loops
    /// read: `process`, the process's counters, and `spare`, the
    /// descriptors kept for the workers' backend sockets.
    pub fn process_wide(self, process: Arc<Stats>, spare: Arc<Reserve>) -> Proxy {
        Proxy {
            process,
            spare,
            ..self
        }
    }

    /// Serves one client from start to end, then reports how it ended.
    /// Never panics on I/O and never returns an error: whatever happens is
    /// logged and ends only this connection.
    pub fn handle(&self, mut job: Job) {
        let slot = job.slot.take();
        // Off the connections' table whatever happens (a panic included);
        // on every other path it left before its sockets closed.
        let _listed = listed::Listed;
        // Until a step says how it ended (each does: see `Refusal::Misrouted`).
        let mut outcome = Outcome::refused(job.peer, job.queued_at, Refusal::Misrouted);
        self.serve(job, &mut outcome);
        self.report.tell(&outcome);
        drop(slot);
    }

    /// Clients waiting in the queue now (0 before the pool exists).
    fn queue_depth(&self) -> usize {
        self.queue_depth.get().map_or(0, |f| f())
    }
}

/// What the pool runs for each job: its service's [`Proxy::handle`]. A
/// client of an address shared by SNI is routed first, in a frame of its
/// own that is gone before the pump runs, so the router's frames are not
/// under the pump (docs/tls.md, "SNI routing (passthrough)", its "Cost"
/// paragraph).
#[inline]
pub fn run(job: Job) {
    if matches!(job.route, Route::Unrouted(_)) {
        return run_routed(job);
    }
    Arc::clone(&job.proxy).handle(job);
}

/// [`run`] for a client of an address shared by SNI: routed, then served
/// by the service chosen. Out of [`run`]'s frame, so that a plain
/// connection's worker stack stays as deep as it was.
#[cold]
#[inline(never)]
fn run_routed(job: Job) {
    let Route::Unrouted(router) = &job.route else {
        return;
    };
    let router = Arc::clone(router);
    if let Some((job, _sni)) = router.divert(job) {
        Arc::clone(&job.proxy).handle(job);
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
    use super::report::ended_counter;
    use super::*;
    use crate::backend::Backend;
    use crate::error::Error;
    use crate::pool::Pool;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    #[test]
    fn the_fast_paths_are_off_by_default() {
        let c = ProxyConfig::default();
        assert!(!c.splice);
        assert_eq!(c.yield_before_poll, Switch::Off);
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
            Arc::new(|job: Job| Arc::clone(&job.proxy).handle(job)),
        );
        let front = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(front.local_addr().unwrap()).unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let (accepted, peer) = front.accept().unwrap();
        let pick = scheduler.pick(peer.ip()).unwrap();
        pool.submit(Job::new(
            proxy,
            accepted,
            peer,
            Route::Picked(pick),
            None,
            None,
        ))
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
        Proxy::new(
            Arc::clone(scheduler),
            Arc::new(ArcSwap::from_pointee(ProxyConfig::default())),
            Arc::new(ArcSwap::from_pointee(health)),
            Arc::new(ArcSwapOption::empty()),
            Arc::clone(stats),
            None,
            None,
        )
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
