//! Running as a systemd service: telling systemd how the service is doing
//! (the `sd_notify(3)` protocol) and taking the listening sockets it opened
//! (socket activation, `sd_listen_fds(3)`).
//!
//! **Notifications.** With `NOTIFY_SOCKET` set (`Type=notify`), one
//! datagram per event goes to that Unix socket: [`ready`] once every
//! listener is bound and serving ([`StartNotice`]: its `STATUS=` names
//! every address and says the first health checks still run, then says
//! again once they are done), [`reloading`] then [`ready`] around a reload
//! (a failed one says so in its `STATUS=`), [`stopping`] when the drain
//! starts, each with a `STATUS=` line that `systemctl status` shows.
//! Without `NOTIFY_SOCKET` each call does nothing. A failed send is a
//! warning, never an error: the service runs on whatever systemd thinks.
//!
//! **Socket activation.** With `LISTEN_PID` equal to this process's id,
//! the `LISTEN_FDS` descriptors from 3 on are listening sockets opened by
//! systemd (a `.socket` unit) or by `systemd-socket-activate`. A listen
//! address that matches one of them ([`inherited`]) uses it instead of
//! binding. Such a socket outlives the process, so clients that connect
//! during a restart wait in its backlog for the next process instead of
//! being refused. The three variables are unset once read, as
//! `sd_listen_fds(1)` does, so that nothing started later takes them for
//! its own.
//!
//! The same table takes the listening sockets a previous rodizio handed
//! over through `upgrade_socket` ([`adopt`], by `crate::upgrade`), and a
//! process that may hand its own over gates them ([`gate`]).
//!
//! A socket shared that way must not be woken the usual ways at shutdown:
//! a connection to it could be a client's turn taken, and `shutdown(2)`
//! would close it for the next process too. So the accept loop waits in
//! `poll(2)` on the socket and on an eventfd that the shutdown writes to
//! (`Gate`), calls `accept(2)` only when a client is waiting, and the
//! client it holds when the stop comes is still served.
//!
//! # Threads
//!
//! The notifications are sent from whatever thread has the event (the
//! health thread, the signal thread for a reload, the accept loop's for the
//! drain) through one unbound socket, opened at the first event; a datagram
//! send needs no lock. The passed sockets are read once, at the first call
//! of [`inherited`] (from `main`, before any other thread starts, since the
//! environment is changed), and kept under a mutex.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C is started by hand and binds its own port.

use std::env;
use std::ffi::OsString;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{self, UnixDatagram};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;

use crate::backend::Backend;
use crate::stats::Stats;
use crate::units;

/// The first descriptor systemd passes (`SD_LISTEN_FDS_START`).
pub const LISTEN_FDS_START: RawFd = 3;

/// Where the notifications go, when systemd asked for them.
struct Notifier {
    socket: UnixDatagram,
    addr: net::SocketAddr,
}

/// Opened at the first notification; `None` without `NOTIFY_SOCKET`.
static NOTIFIER: OnceLock<Option<Notifier>> = OnceLock::new();

/// The notification socket, if systemd gave one.
fn notifier() -> Option<&'static Notifier> {
    NOTIFIER
        .get_or_init(|| {
            let path = env::var_os("NOTIFY_SOCKET")?;
            match open_notifier(&path) {
                Ok(notifier) => Some(notifier),
                Err(err) => {
                    log::warn!(
                        "NOTIFY_SOCKET={}: {err}; systemd will not hear from rodizio",
                        path.to_string_lossy()
                    );
                    None
                }
            }
        })
        .as_ref()
}

/// An unbound datagram socket and the address `NOTIFY_SOCKET` names: a
/// path, or with a leading `@` a name in the abstract namespace.
fn open_notifier(path: &OsString) -> io::Result<Notifier> {
    let bytes = path.as_bytes();
    let addr = match bytes.strip_prefix(b"@") {
        Some(name) => net::SocketAddr::from_abstract_name(name)?,
        None if bytes.starts_with(b"/") => net::SocketAddr::from_pathname(path)?,
        None => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a path nor an @abstract name",
            ))
        }
    };
    Ok(Notifier {
        socket: UnixDatagram::unbound()?,
        addr,
    })
}

/// Sends `message` (newline-separated `KEY=value` lines) to systemd, if
/// it listens.
pub fn notify(message: &str) {
    let Some(notifier) = notifier() else {
        return;
    };
    if let Err(err) = notifier
        .socket
        .send_to_addr(message.as_bytes(), &notifier.addr)
    {
        let first = message.lines().next().unwrap_or_default();
        log::warn!("could not tell systemd {first}: {err}");
    }
}

/// The service is up: every listener bound, the first round of checks
/// done (or after a reload, the new settings in place). `status` is the
/// one line `systemctl status` shows ([`status`]).
pub fn ready(status: &str) {
    notify(&format!("READY=1\nSTATUS={status}"));
}

/// A new `STATUS=` line alone, for `systemctl status`.
pub fn tell_status(status: &str) {
    notify(&format!("STATUS={status}"));
}

/// What systemd hears at start-up: READY=1 as soon as every address
/// listens ([`StartNotice::listening`]), with a `STATUS=` that names every
/// listening address and says whether the first health checks still run;
/// then, once the last service's first round is done
/// ([`StartNotice::round_done`]), the `STATUS=` again with the backends'
/// states known. A lock orders the two, whichever comes first.
pub struct StartNotice {
    /// First rounds still to come, and whether READY=1 was sent.
    state: Mutex<(usize, bool)>,
    /// `127.0.0.1:8080, [::1]:8443`.
    addrs: String,
    /// The running status ([`status`]).
    status: Box<dyn Fn() -> String + Send + Sync>,
}

impl StartNotice {
    /// A notice for `rounds` first rounds (one per service) and the
    /// listening addresses `addrs`; `status` gives the status line.
    pub fn new(
        rounds: usize,
        addrs: &[SocketAddr],
        status: impl Fn() -> String + Send + Sync + 'static,
    ) -> Arc<StartNotice> {
        let addrs: Vec<String> = addrs.iter().map(ToString::to_string).collect();
        Arc::new(StartNotice {
            state: Mutex::new((rounds, false)),
            addrs: addrs.join(", "),
            status: Box::new(status),
        })
    }

    /// One service's first round is done.
    pub fn round_done(&self) {
        let mut state = self.state.lock();
        state.0 = state.0.saturating_sub(1);
        if state.0 == 0 && state.1 {
            tell_status(&self.line(0));
        }
    }

    /// Every address listens: READY=1.
    pub fn listening(&self) {
        let mut state = self.state.lock();
        state.1 = true;
        ready(&self.line(state.0));
    }

    /// The status line with `left` first rounds to come.
    fn line(&self, left: usize) -> String {
        let checks = match left {
            0 => "",
            _ => "first health checks running; ",
        };
        format!("listening on {}; {checks}{}", self.addrs, (self.status)())
    }
}

/// A reload starts. systemd (253 and later) then waits for the next
/// [`ready`]; `MONOTONIC_USEC` tells it which reload this is.
pub fn reloading() {
    notify(&format!(
        "RELOADING=1\nMONOTONIC_USEC={}\nSTATUS=reloading the config file",
        monotonic_usec()
    ));
}

/// The drain starts: no new client is accepted; `active` connections are
/// still served.
pub fn stopping(active: u64) {
    notify(&format!(
        "STOPPING=1\nSTATUS=draining {}",
        units::count(active, "connection")
    ));
}

/// The one-line summary sent as `STATUS=`: connections open now and the
/// backends that take new clients (healthy, not draining, not in
/// maintenance), e.g. `3 connections, 2 of 3 backends up`.
pub fn status(stats: &Stats, backends: &[Arc<Backend>]) -> String {
    let up = backends.iter().filter(|b| b.is_available()).count();
    format!(
        "{}, {up} of {} up",
        units::count(stats.snapshot().active, "connection"),
        units::count(backends.len() as u64, "backend")
    )
}

/// `CLOCK_MONOTONIC` in microseconds: the clock systemd compares
/// `MONOTONIC_USEC` with.
fn monotonic_usec() -> u64 {
    // SAFETY: clock_gettime fills a timespec we own.
    let ts = unsafe {
        let mut ts: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
        ts
    };
    (ts.tv_sec as u64) * 1_000_000 + (ts.tv_nsec as u64) / 1_000
}

/// One listening socket passed by systemd.
#[derive(Debug)]
struct Passed {
    /// Taken by the listen address it matches.
    fd: Option<OwnedFd>,
    /// Its number, for the log.
    number: RawFd,
    /// The address it listens on.
    addr: SocketAddr,
    /// Its name (`FileDescriptorName=`, by default the socket unit's).
    name: String,
    /// Who passed it.
    from: PassedBy,
}

/// Who passed a listening socket to this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PassedBy {
    /// systemd (`LISTEN_FDS`).
    Systemd,
    /// The previous rodizio, through `upgrade_socket`.
    Previous,
}

impl std::fmt::Display for PassedBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PassedBy::Systemd => "systemd",
            PassedBy::Previous => "the previous rodizio",
        })
    }
}

/// The passed sockets, read at the first call of [`inherited`].
static PASSED: OnceLock<Mutex<Vec<Passed>>> = OnceLock::new();

/// The listening socket systemd passed for `addr`, if any: the same
/// address; for `0.0.0.0:PORT` also the `[::]:PORT` socket that systemd's
/// `ListenStream=PORT` opens (it takes IPv4 clients too). Taken once: the
/// next call for the same address gets `None`.
pub fn inherited(addr: SocketAddr) -> Option<TcpListener> {
    let mut passed = PASSED.get_or_init(|| Mutex::new(read_listen_fds())).lock();
    let found = passed
        .iter_mut()
        .find(|p| p.fd.is_some() && serves(p.addr, addr))?;
    let listener = TcpListener::from(found.fd.take()?);
    log::info!(
        "listening on {} through the socket {} passed (descriptor {}, {})",
        found.addr,
        found.from,
        found.number,
        found.name
    );
    gate(&listener);
    Some(listener)
}

/// Puts a listening socket on `addr` that another process handed over
/// (`crate::upgrade`) among the passed ones: the listen address it
/// serves takes it, as it would take systemd's.
pub fn adopt(addr: SocketAddr, fd: OwnedFd) {
    let number = fd.as_raw_fd();
    let mut passed = PASSED.get_or_init(|| Mutex::new(read_listen_fds())).lock();
    passed.push(Passed {
        fd: Some(fd),
        number,
        addr,
        name: "upgrade_socket".into(),
        from: PassedBy::Previous,
    });
}

/// The listening sockets handed over but taken by no listen address: they
/// are closed (the previous process stops accepting on them as it
/// drains); their addresses, for the log.
pub fn drop_unadopted() -> Vec<SocketAddr> {
    let Some(passed) = PASSED.get() else {
        return Vec::new();
    };
    let mut passed = passed.lock();
    let left: Vec<SocketAddr> = passed
        .iter()
        .filter(|p| p.fd.is_some() && p.from == PassedBy::Previous)
        .map(|p| p.addr)
        .collect();
    passed.retain(|p| p.fd.is_none() || p.from == PassedBy::Systemd);
    left
}

/// Whether this process shares every listening socket it opens with the
/// next one (`upgrade_socket`): each is then gated as it is opened.
static SHARED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// From now on, every listening socket this process opens (at start-up
/// and by reloads) is gated ([`gate`]): the next process may take it.
pub fn share_listeners() {
    SHARED.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// [`gate`], when [`share_listeners`] was called.
pub fn gate_if_shared(listener: &TcpListener) {
    if SHARED.load(std::sync::atomic::Ordering::SeqCst) {
        gate(listener);
    }
}

/// Gives `listener` a gate (`Gate`): its accept loop then stops on an eventfd,
/// never by a wake-up connection or `shutdown(2)`, so that the socket can
/// be shared with the next process. Without an eventfd, a warning and the
/// usual wake-up.
pub fn gate(listener: &TcpListener) {
    if Gate::of(listener).is_some() {
        return;
    }
    match Gate::new() {
        Ok(gate) => {
            let mut gates = GATES.lock();
            // Gates of sockets closed since (a reload removed their
            // service) go: their numbers may be reused by others.
            gates.retain(|(id, _)| identity(id.0) == Some(*id));
            if let Some(id) = identity(listener.as_raw_fd()) {
                gates.push((id, Arc::new(gate)));
            }
        }
        Err(err) => log::warn!(
            "no eventfd for a shared listening socket ({err}): a stop will wake the \
             accept loop with a connection, which may take a waiting client's turn"
        ),
    }
}

/// Whether a socket listening on `passed` serves the listen address
/// `wanted`.
fn serves(passed: SocketAddr, wanted: SocketAddr) -> bool {
    if passed == wanted {
        return true;
    }
    // `ListenStream=8080` binds [::]:8080, which also takes IPv4 clients
    // (unless BindIPv6Only=ipv6-only, when 0.0.0.0:8080 would have to be
    // bound beside it: that bind then fails and says so).
    wanted.ip().is_unspecified()
        && wanted.is_ipv4()
        && passed.ip().is_unspecified()
        && passed.is_ipv6()
        && passed.port() == wanted.port()
}

/// Reads `LISTEN_PID`, `LISTEN_FDS` and `LISTEN_FDNAMES`, unsets them, and
/// returns the TCP listening sockets passed to this process.
fn read_listen_fds() -> Vec<Passed> {
    let pid = env::var("LISTEN_PID").ok();
    let count = env::var("LISTEN_FDS").ok();
    let names = env::var("LISTEN_FDNAMES").unwrap_or_default();
    if pid.is_none() && count.is_none() {
        return Vec::new();
    }
    for name in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        env::remove_var(name);
    }
    let ours =
        pid.as_deref().and_then(|p| p.trim().parse::<u32>().ok()) == Some(std::process::id());
    let count = count
        .as_deref()
        .and_then(|n| n.trim().parse::<RawFd>().ok());
    let (true, Some(count)) = (ours, count) else {
        log::warn!(
            "LISTEN_FDS={} LISTEN_PID={} are not for this process ({}): ignored",
            count.map_or_else(|| "?".to_string(), |n| n.to_string()),
            pid.unwrap_or_default(),
            std::process::id()
        );
        return Vec::new();
    };
    let names: Vec<&str> = names.split(':').collect();
    let mut passed = Vec::new();
    for (i, number) in (LISTEN_FDS_START..LISTEN_FDS_START.saturating_add(count)).enumerate() {
        let name = names.get(i).copied().filter(|n| !n.is_empty());
        let name = name.map_or_else(|| "unnamed".to_string(), |n| format!("named {n}"));
        match take_listener(number) {
            Ok((fd, addr)) => passed.push(Passed {
                fd: Some(fd),
                number,
                addr,
                name,
                from: PassedBy::Systemd,
            }),
            Err(why) => {
                log::warn!("descriptor {number} passed by systemd ({name}): {why}; not used")
            }
        }
    }
    passed
}

/// Takes descriptor `number` if it is a TCP socket in the listening state,
/// marked close-on-exec; its address.
fn take_listener(number: RawFd) -> Result<(OwnedFd, SocketAddr), String> {
    // SAFETY: fcntl on a descriptor number only reads or sets its flags;
    // a closed number fails with EBADF.
    if unsafe { libc::fcntl(number, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error().to_string());
    }
    let mut listening: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: a descriptor, and a c_int with its exact size.
    let rc = unsafe {
        libc::getsockopt(
            number,
            libc::SOL_SOCKET,
            libc::SO_ACCEPTCONN,
            (&mut listening as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(format!("not a socket ({})", io::Error::last_os_error()));
    }
    if listening == 0 {
        return Err("not a listening socket (ListenStream= gives one)".into());
    }
    // SAFETY: the protocol hands descriptors from 3 to 3 + LISTEN_FDS - 1
    // to this process; nothing else here owns them, and each is taken once.
    let fd = unsafe { OwnedFd::from_raw_fd(number) };
    let socket = socket2::SockRef::from(&fd);
    let tcp = socket.r#type().ok() == Some(socket2::Type::STREAM)
        && matches!(socket.domain(), Ok(d) if d == socket2::Domain::IPV4 || d == socket2::Domain::IPV6);
    let addr = socket.local_addr().ok().and_then(|a| a.as_socket());
    match (tcp, addr) {
        (true, Some(addr)) => Ok((fd, addr)),
        // Not ours to keep: left open, as it was given.
        _ => {
            let _ = std::os::fd::IntoRawFd::into_raw_fd(fd);
            Err("not a TCP socket".into())
        }
    }
}

/// The accept loop's wait on a passed socket: a client, or the stop.
///
/// The stop opens the gate ([`Gate::open`]); the balancer closes the
/// workers' queue only once the accept loops have left (at most
/// [`Gate::GRACE`] later, for a loop that waits for room in a full queue):
/// a client the loop accepted just before the stop is then queued and
/// served, not dropped, and any later one stays in the socket's backlog
/// for the next process.
#[derive(Debug)]
pub(crate) struct Gate {
    /// An eventfd, readable once the shutdown has written to it.
    stop: OwnedFd,
}

/// The gates of the passed or shared sockets in use, by listening
/// descriptor and the socket's inode ([`identity`]): a number reused by a
/// new socket is not taken for the old one.
static GATES: Mutex<Vec<(SocketId, Arc<Gate>)>> = parking_lot::const_mutex(Vec::new());

/// A descriptor and the inode of the socket it is open on.
type SocketId = (RawFd, u64);

/// A descriptor and the inode of what it is open on now; `None` when it
/// is not open.
fn identity(fd: RawFd) -> Option<SocketId> {
    // SAFETY: a zeroed stat is valid; fstat writes at most its size.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat on a number; a closed one fails with EBADF.
    (unsafe { libc::fstat(fd, &mut stat) } == 0).then_some((fd, stat.st_ino))
}

impl Gate {
    /// A closed gate of its own (an eventfd), registered nowhere.
    pub(crate) fn new() -> io::Result<Gate> {
        // SAFETY: eventfd returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor that nothing else owns.
        Ok(Gate {
            stop: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Longest wait for the accept loops to leave before the queue
    /// closes: a loop has a client in hand for microseconds, unless the
    /// queue is full.
    pub(crate) const GRACE: Duration = Duration::from_secs(1);

    /// The gate of `listener`, when it is a socket systemd or the previous
    /// process passed, or one shared with the next (`upgrade_socket`).
    pub(crate) fn of(listener: &TcpListener) -> Option<Arc<Gate>> {
        let id = identity(listener.as_raw_fd())?;
        GATES
            .lock()
            .iter()
            .find(|(n, _)| *n == id)
            .map(|(_, gate)| Arc::clone(gate))
    }

    /// Wakes every [`Gate::wait`], now and later (the shutdown's hook).
    pub(crate) fn open(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a u64 that lives for the call.
        unsafe { libc::write(self.stop.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Waits until a client is waiting on `listener` (true) or the gate is
    /// opened (false: stop). A `poll(2)` error says true, and `accept(2)`
    /// then says what is wrong.
    pub(crate) fn wait(&self, listener: &impl AsRawFd) -> bool {
        let mut fds = [listener.as_raw_fd(), self.stop.as_raw_fd()].map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
        match crate::poll::poll(&mut fds, -1) {
            Ok(_) => fds[1].revents == 0,
            Err(_) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_address_serves_from_the_ipv6_wildcard_of_its_port() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert!(serves(a("127.0.0.1:80"), a("127.0.0.1:80")));
        assert!(serves(a("[::]:80"), a("0.0.0.0:80")));
        assert!(!serves(a("[::]:80"), a("0.0.0.0:81")));
        assert!(!serves(a("[::]:80"), a("127.0.0.1:80")));
        assert!(!serves(a("0.0.0.0:80"), a("[::]:80")));
        assert!(!serves(a("127.0.0.1:80"), a("127.0.0.2:80")));
    }

    #[test]
    fn the_status_line_counts_connections_and_backends_up() {
        let stats = Stats::default();
        let one = Arc::new(Backend::new("a".into(), vec![a()], 1));
        let two = Arc::new(Backend::new("b".into(), vec![a()], 1));
        two.set_healthy(false);
        let _c = stats.hold(&stats.active);
        assert_eq!(
            status(&stats, &[one, two]),
            "1 connection, 1 of 2 backends up"
        );
        fn a() -> SocketAddr {
            "127.0.0.1:1".parse().unwrap()
        }
    }

    #[test]
    fn the_gate_lets_a_client_through_and_closes_for_good() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let gate = Gate::new().unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        assert!(gate.wait(&listener), "a client waits");
        drop(listener.accept().unwrap());
        gate.open();
        assert!(!gate.wait(&listener), "opened: stop");
        assert!(!gate.wait(&listener), "and it stays so");
    }

    #[test]
    fn monotonic_microseconds_go_forward() {
        let a = monotonic_usec();
        let b = monotonic_usec();
        assert!(a > 0 && b >= a);
    }
}
