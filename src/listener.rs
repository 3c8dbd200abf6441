//! The listening sockets and the accept loop.
//!
//! For each client the loop runs the admission gate
//! (`proxy/admission.rs`: the allow and deny lists, the per-client cap,
//! the rate limiter, the pick), makes its [`Job`] and hands it to the
//! pool; with `--accept-proxy`, or on an address shared by SNI, it queues
//! the client unpicked ([`Route::AfterHeader`], [`Route::Unrouted`]) and
//! the worker runs the same gate once it knows who the client is or which
//! service it is for. A client refused here is an `Outcome`, counted and
//! told by this loop's own `Report`, and closed without blocking: the 429
//! and the 503 are one non-blocking write each ([`crate::reply::reply_at_once`]).
//! An `accept(2)` error is never fatal: retried at once or after a
//! back-off, logged at most once a second (docs/operations.md, "Out of
//! file descriptors"). `--defer-accept` and `--reuse-port` are set here
//! too, and `TCP_NODELAY`, once on the listening socket for every client.
//! A socket passed by systemd is taken instead of bound (`systemd.rs`).
//!
//! # Threads
//!
//! One accept loop per listening address of each service, each on its own
//! thread. A loop never waits for a client's bytes or a worker, only for
//! room in the queue (back-pressure: new clients then wait in the kernel's
//! backlog), under `max_connections` for a slot, and out of descriptors
//! for the workers' reserve to be whole (`reserve.rs`). The scheduler, the
//! pool and the stats synchronize themselves; this module holds no lock
//! (the gate takes the limiter's and the per-client table's shard locks
//! when those are on).
//!
//! # Corresponds to the C article
//!
//! `create_balancer_socket()` and the `while (1)` loop of `main()`. The C
//! calls `exit()` on any `accept` error; binds `INADDR_ANY` only; and, after
//! queueing, calls `get_next_thread()`, which may `pthread_join` a busy
//! thread and so stop accepting until that connection ends.

use std::io::{self, ErrorKind};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::limiter::Place;
use crate::pool::Pool;
use crate::proxy::{Admitted, Fate, Job, Outcome, Proxy, Refusal, Report, Route};
use crate::shutdown::Shutdown;
use crate::slots::{Slot, Slots};
use crate::stats::Stats;
use crate::system;
use crate::systemd::{self, Gate};
use crate::throttle::{self, LogThrottle};
use crate::trace;

/// How long the kernel holds back, with `--defer-accept`, a client that
/// sends nothing: after this it is handed over anyway.
pub const DEFER_ACCEPT_SECS: libc::c_int = 1;

/// Pause after an `accept(2)` error that is not the client's doing: long
/// enough that a loop stuck on `EMFILE` costs no CPU (ten tries a second),
/// short enough that a descriptor freed by a finished connection is taken
/// up quickly.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Pause of the accept loop while a worker waits for a file descriptor to
/// connect to its backend (see `Proxy::handle`), or while the descriptors
/// kept for that cannot all be taken back.
const DESCRIPTOR_WAIT_PAUSE: Duration = Duration::from_millis(10);

/// Longest wait for a free slot under `max_connections` before the loop
/// looks at the shutdown again.
const SLOT_WAIT: Duration = Duration::from_millis(100);

/// The service's listening sockets as `config` says, one per address:
/// address and backlog, `SO_REUSEPORT` and `TCP_DEFER_ACCEPT` when asked.
/// When a service listens on several addresses, an IPv6 one takes IPv6
/// clients only (`IPV6_V6ONLY`), so `0.0.0.0:P` and `[::]:P` can both be
/// listed; alone, `[::]:P` takes IPv4 clients too, as the system sets it.
/// A socket systemd passed for an address is taken as it is, with its own
/// backlog and options (`TCP_DEFER_ACCEPT` is still set when asked, and
/// `TCP_NODELAY` always, for the clients it passes on).
///
/// # Errors
///
/// [`Error::Bind`] when an address cannot be listened on, [`Error::Io`]
/// when `TCP_DEFER_ACCEPT` cannot be set.
pub fn open(config: &Config) -> Result<Vec<TcpListener>> {
    open_except(config, &[])
}

/// [`open`], leaving out the addresses in `skip` (shared by SNI with a
/// service that binds them, see `crate::config::sni_check::bound_before`).
///
/// # Errors
///
/// As [`open`].
pub fn open_except(config: &Config, skip: &[SocketAddr]) -> Result<Vec<TcpListener>> {
    let addrs = config.listen_addrs();
    let only_v6 = addrs.len() > 1;
    addrs
        .into_iter()
        .filter(|a| !skip.contains(a))
        .map(|addr| {
            // A socket systemd opened for this address is taken as it is.
            let listener = match systemd::inherited(addr) {
                Some(listener) => listener,
                None => bind_socket(addr, config.backlog, shares_port(config), only_v6)
                    .map_err(|e| of_service(e, &config.name))?,
            };
            if config.defer_accept {
                defer_accept(&listener)
                    .map_err(|e| Error::io("setting TCP_DEFER_ACCEPT (--defer-accept)", e))?;
            }
            nodelay_for_clients(&listener, addr);
            systemd::gate_if_shared(&listener);
            Ok(listener)
        })
        .collect()
}

/// A bind error of service `name`'s, naming it: with several services,
/// "address in use" alone does not say whose address it is. The one
/// service of a configuration without `services` keeps the bare words.
fn of_service(err: Error, name: &str) -> Error {
    match err {
        Error::Bind { addr, source } if name != crate::config::DEFAULT_SERVICE => Error::Io {
            context: format!("service `{name}`: failed to listen on {addr}"),
            source,
        },
        other => other,
    }
}

/// Whether `config` opens the listening socket with `SO_REUSEPORT`
/// (`--reuse-port`), sharing its port with other processes: the kernel
/// then spreads new clients among them, and what it does with the clients
/// of one that closes is `net.ipv4.tcp_migrate_req`'s (checked by `rodizio
/// preflight`, docs/scaling.md).
pub fn shares_port(config: &Config) -> bool {
    config.reuse_port
}

/// Makes the shutdown's trigger wake an `accept` blocked on `listener`
/// (listening on `addr`, opened by [`open`] with `config`).
///
/// # Errors
///
/// [`Error::Io`] when the listening socket cannot be duplicated.
pub(crate) fn wake_on(
    listener: &TcpListener,
    addr: SocketAddr,
    config: &Config,
    shutdown: &Shutdown,
) -> Result<()> {
    if let Some(gate) = Gate::of(listener) {
        // A socket shared with systemd: no wake-up connection (it could
        // take a client's place), no shutdown (it would close the socket
        // for the next process): the loop waits on the gate too.
        shutdown.on_trigger(move || gate.open());
    } else if shares_port(config) {
        // A connection could wake another process of the port's group:
        // shut the socket down instead (see wake_by_shutdown).
        let listener = listener
            .try_clone()
            .map_err(|e| Error::io("duplicating the listening socket", e))?;
        shutdown.on_trigger(move || wake_by_shutdown(&listener));
    } else {
        shutdown.wake_on_trigger(addr);
    }
    Ok(())
}

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
    bind_with(addr, backlog, false)
}

/// [`bind`], and with `reuse_port` also `SO_REUSEPORT` (`--reuse-port`):
/// several processes may then listen on the same port, the kernel
/// spreading new connections among them, which is what lets a new
/// version start before the old one leaves (docs/scaling.md).
///
/// # Errors
///
/// [`Error::Bind`] with the address and the system's reason (a port held
/// by a process that did not set `SO_REUSEPORT` too is `EADDRINUSE`).
pub fn bind_with(addr: SocketAddr, backlog: i32, reuse_port: bool) -> Result<TcpListener> {
    bind_socket(addr, backlog, reuse_port, false)
}

/// [`bind_with`], and with `only_v6` an IPv6 address takes IPv6 clients
/// only.
fn bind_socket(
    addr: SocketAddr,
    backlog: i32,
    reuse_port: bool,
    only_v6: bool,
) -> Result<TcpListener> {
    let fail = |source| Error::Bind { addr, source };
    let socket =
        Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP)).map_err(fail)?;
    socket.set_reuse_address(true).map_err(fail)?;
    if reuse_port {
        socket.set_reuse_port(true).map_err(fail)?;
    }
    if only_v6 && addr.is_ipv6() {
        socket.set_only_v6(true).map_err(fail)?;
    }
    socket.bind(&addr.into()).map_err(fail)?;
    socket.listen(backlog).map_err(fail)?;
    Ok(socket.into())
}

/// Sets `TCP_NODELAY` on a listening socket, once, for every client it
/// will accept: Linux copies the listener's TCP options into each socket
/// `accept(2)` makes (so `TCP_NODELAY`, like `SO_KEEPALIVE`, comes set),
/// and the accept loop needs no `setsockopt` per client. The pump wants
/// it on both sockets: a small reply must leave at once, not wait for the
/// acknowledgement of the one before (Nagle's algorithm). A socket that
/// refuses is logged and served anyway, its clients then without it.
fn nodelay_for_clients(listener: &TcpListener, addr: SocketAddr) {
    if let Err(err) = socket2::SockRef::from(listener).set_nodelay(true) {
        log::warn!("{addr}: cannot set TCP_NODELAY for the clients: {err}");
    }
}

/// Sets `TCP_DEFER_ACCEPT` on a listening socket (`--defer-accept`): the
/// kernel queues a client for `accept(2)` only once its first bytes arrive,
/// or after about [`DEFER_ACCEPT_SECS`] without any.
///
/// # Errors
///
/// The system's reason when the option cannot be set.
pub fn defer_accept(listener: &TcpListener) -> io::Result<()> {
    let secs = DEFER_ACCEPT_SECS;
    // SAFETY: a valid socket descriptor and a pointer to a c_int that
    // lives for the whole call, with its exact size.
    let rc = unsafe {
        libc::setsockopt(
            listener.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&secs as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Wakes a thread blocked in `accept(2)` on `listener` by shutting the
/// listening socket down: `accept` then fails (`EINVAL`) at once, and the
/// socket leaves its `SO_REUSEPORT` group, so the kernel sends new
/// connections to the other processes on the port.
///
/// With `--reuse-port` this replaces the usual wake-up (a connection to
/// the listening address), which the kernel could hand to another process
/// of the group, leaving this one asleep. Connections still waiting in
/// this socket's accept queue move to another listener of the group when
/// `net.ipv4.tcp_migrate_req` is 1 (Linux 5.14 and later); otherwise the
/// kernel resets them (docs/scaling.md).
pub(crate) fn wake_by_shutdown(listener: &TcpListener) {
    // SAFETY: shutdown(2) on a descriptor owned by a live TcpListener.
    unsafe { libc::shutdown(listener.as_raw_fd(), libc::SHUT_RD) };
}

/// What the accept loop needs besides the socket: one per listening
/// address, on its own thread (the first on the caller's).
pub(crate) struct Acceptor {
    /// The runtime of the service the address belongs to: its scheduler,
    /// counters, limiter (live: a reload may swap it), health settings
    /// (the 503) and `--accept-proxy` (clients are then queued unpicked).
    pub proxy: Arc<Proxy>,
    pub pool: Arc<Pool<Job>>,
    pub shutdown: Shutdown,
    /// The service's `max_connections`, when set: a slot is taken before
    /// each `accept`.
    pub slots: Option<Arc<Slots>>,
    /// Where the clients refused here are counted and logged (the access
    /// log, the throttled warnings).
    pub report: Report,
    /// The loop is woken without a connection of its own (a socket from
    /// systemd, or `--reuse-port`'s shutdown of the socket): a client
    /// accepted as the stop comes is a real one, and is served (the queue
    /// closes only once the loops have left, see `crate::running`).
    pub serves_late: bool,
    /// An address shared by services (SNI routing): clients are queued
    /// unrouted to this router, which chooses their service on the worker.
    pub sni: Option<Arc<dyn crate::proxy::Divert>>,
}

impl Acceptor {
    /// Accepts clients until shutdown is triggered.
    pub fn run(&self, listener: &TcpListener) {
        let stop = self.shutdown.receiver();
        // Out of descriptors, accept fails ten times a second (once per
        // back-off) for as long as it lasts: one line a second says so.
        let errors_log = LogThrottle::new(Duration::from_secs(1));
        let gate = Gate::of(listener);
        loop {
            if self.proxy.process.descriptor_waits.load(Ordering::Relaxed) > 0
                || !self.proxy.spare.refill()
            {
                // A worker is waiting for a descriptor to reach its
                // backend: accepting now would take the one it waits for.
                // Or the descriptors kept for the workers' backend sockets
                // are not all back (`crate::reserve`): those a connection
                // frees when it ends go to them first, so a worker that
                // takes a queued client always finds one.
                let _ = stop.recv_timeout(DESCRIPTOR_WAIT_PAUSE);
                if self.shutdown.is_triggered() {
                    return;
                }
                continue;
            }
            if gate.as_ref().is_some_and(|gate| !gate.wait(listener)) {
                return;
            }
            let (client, peer) = match listener.accept() {
                Ok(accepted) => accepted,
                Err(err) => {
                    if self.shutdown.is_triggered() {
                        return;
                    }
                    Stats::incr(&self.proxy.stats.accept_errors);
                    match err.kind() {
                        ErrorKind::ConnectionAborted | ErrorKind::Interrupted => {}
                        _ => {
                            if system::is_out_of_descriptors(&err) {
                                Stats::incr(&self.proxy.stats.out_of_descriptors);
                            }
                            if let Some(others) = errors_log.event(Instant::now()) {
                                log::error!(
                                    "accept failed: {err}; retrying every {ACCEPT_BACKOFF:?}{}",
                                    throttle::more(others)
                                );
                            }
                            // Sleeps, but wakes at once on shutdown.
                            let _ = stop.recv_timeout(ACCEPT_BACKOFF);
                        }
                    }
                    continue;
                }
            };
            if self.shutdown.is_triggered() && !self.serves_late {
                // The wake-up connection, or a client that came too late.
                return;
            }
            // At the service's limit, the loop waits with this client in
            // hand, and the next ones wait in the backlog.
            let slot = match &self.slots {
                None => None,
                Some(slots) => loop {
                    if let Some(slot) = slots.take(SLOT_WAIT) {
                        break Some(slot);
                    }
                    if self.shutdown.is_triggered() {
                        return;
                    }
                },
            };
            // A bug in the gate or the scheduler must not end accepting for
            // everyone: like a worker, the loop catches a panic, logs it and
            // goes on (the client, dropped while unwinding, is closed).
            match catch_unwind(AssertUnwindSafe(|| self.dispatch(client, peer, slot))) {
                Ok(true) => {}
                Ok(false) => return,
                Err(_) => log::error!("handling new client {peer} panicked; accepting goes on"),
            }
        }
    }

    /// Takes one accepted client through the admission gate into the
    /// pool, or refuses it. Returns false when the pool has closed
    /// (shutting down).
    fn dispatch(&self, client: TcpStream, peer: SocketAddr, slot: Option<Slot>) -> bool {
        if self.sni.is_none() {
            // On an address shared by SNI, the router counts the client
            // for the service its hello chooses (`sni_router.rs`).
            Stats::incr(&self.proxy.stats.accepted);
        }
        trace::accepted(peer, client.as_raw_fd());
        let (route, place) = match self.route(&client, peer) {
            Ok(routed) => routed,
            Err(refusal) => {
                self.refuse(client, peer, refusal);
                return true;
            }
        };
        let job = Job::new(Arc::clone(&self.proxy), client, peer, route, slot, place);
        if trace::on() {
            trace::queued(job.client.as_raw_fd(), self.pool.queued());
        }
        // An error means the pool closed while we waited for room.
        self.pool.submit(job).is_ok()
    }

    /// Where the client goes. A plain client passes the admission gate
    /// here (`proxy/admission.rs`): its pick, or a worker's wait for a
    /// slot, and its per-client place. Behind `--accept-proxy` who the
    /// client is comes in its header, and on an address shared by SNI its
    /// service in its ClientHello: this thread never waits for a client's
    /// bytes, so it is queued unpicked, and the worker runs the same gate
    /// once it knows.
    fn route(
        &self,
        client: &TcpStream,
        peer: SocketAddr,
    ) -> Result<(Route, Option<Place>), Refusal> {
        if let Some(router) = &self.sni {
            return Ok((Route::Unrouted(Arc::clone(router)), None));
        }
        if self.proxy.accept_proxy.is_some() {
            return Ok((Route::AfterHeader, None));
        }
        let Admitted { pick, place } = self.proxy.admit(client, peer)?;
        Ok((pick.map_or(Route::Waiting, Route::Picked), place))
    }

    /// Ends the client from `peer` the gate refused: counted, answered
    /// (one non-blocking write at most: this thread never blocks on a
    /// client), closed, then told by this loop's own `Report`.
    #[cold]
    #[inline(never)]
    fn refuse(&self, client: TcpStream, peer: SocketAddr, refusal: Refusal) {
        let outcome = Outcome::refused(peer, Instant::now(), refusal);
        self.report.count(&outcome);
        if let Fate::Refused(refusal) = &outcome.fate {
            let http_replies = self.proxy.health.load().http_replies;
            crate::proxy::answer(&client, refusal, http_replies);
        }
        drop(client);
        self.report.tell(&outcome);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deferred_secs(listener: &TcpListener) -> libc::c_int {
        let mut value: libc::c_int = -1;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: valid descriptor, pointers to a c_int and its length.
        let rc = unsafe {
            libc::getsockopt(
                listener.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_DEFER_ACCEPT,
                (&mut value as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0);
        value
    }

    #[test]
    fn two_listeners_share_a_port_with_reuse_port_only() {
        let first = bind_with("127.0.0.1:0".parse().unwrap(), 16, true).unwrap();
        let addr = first.local_addr().unwrap();
        let second = bind_with(addr, 16, true).unwrap();
        assert_eq!(second.local_addr().unwrap(), addr);
        assert!(matches!(bind(addr, 16), Err(Error::Bind { .. })));
    }

    #[test]
    fn a_taken_address_names_its_service() {
        let taken = bind("127.0.0.1:0".parse().unwrap(), 16).unwrap();
        let addr = taken.local_addr().unwrap();
        let mut config = Config {
            listen: addr,
            ..Config::default()
        };
        let err = open(&config).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("failed to listen on {addr}")),
            "{err}"
        );
        config.name = "db".into();
        let err = open(&config).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("service `db`: failed to listen on {addr}: ")),
            "{err}"
        );
    }

    #[test]
    fn a_shutdown_wakes_a_blocked_accept() {
        let listener = Arc::new(bind_with("127.0.0.1:0".parse().unwrap(), 16, true).unwrap());
        let blocked = {
            let listener = Arc::clone(&listener);
            std::thread::spawn(move || listener.accept().map(drop))
        };
        // Whether the thread is already in accept(2) or not, the shutdown
        // makes it fail at once.
        wake_by_shutdown(&listener);
        assert!(blocked.join().unwrap().is_err());
    }

    /// The accept loop sets no option per client: `TCP_NODELAY` comes
    /// from the listening socket. A plain listener's clients have it off,
    /// so this fails if the listener stops setting it (or a kernel stops
    /// passing it on).
    #[test]
    fn accepted_clients_come_with_nodelay_from_the_listener() {
        let config = Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            ..Config::default()
        };
        let listeners = open(&config).unwrap();
        let addr = listeners[0].local_addr().unwrap();
        let _client = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
        let (accepted, _) = listeners[0].accept().unwrap();
        assert!(accepted.nodelay().unwrap());
        // Without it, a client comes without it: the listener is the cause.
        let plain = bind("127.0.0.1:0".parse().unwrap(), 16).unwrap();
        let addr = plain.local_addr().unwrap();
        let _client = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
        let (accepted, _) = plain.accept().unwrap();
        assert!(!accepted.nodelay().unwrap());
    }

    #[test]
    fn defer_accept_is_off_until_asked() {
        let listener = bind("127.0.0.1:0".parse().unwrap(), 16).unwrap();
        assert_eq!(deferred_secs(&listener), 0);
        defer_accept(&listener).unwrap();
        // The kernel rounds the seconds to SYN-ACK retransmissions and
        // reports them back in seconds: at least what was asked.
        assert!(deferred_secs(&listener) >= DEFER_ACCEPT_SECS);
    }
}
