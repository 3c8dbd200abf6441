//! A new process takes the running one's listening sockets
//! (`upgrade_socket`): a binary or configuration upgrade in which no
//! client knocking at the port is refused or reset, with no kernel setting
//! and no `SO_REUSEPORT`.
//!
//! The running process listens on a Unix socket (`SOCK_SEQPACKET`, mode
//! 0600, at `upgrade_socket`). A process started with the same setting
//! finds it there and, before it binds anything, asks for the hand-over:
//!
//! ```text
//! new → old   RODIZIO-UPGRADE 1
//! old → new   L 127.0.0.1:8080     + the listening socket (SCM_RIGHTS)
//!             ...                  one per listening address
//!             U                    + the upgrade socket itself
//!             END
//! new         takes each socket whose address it listens on, binds the
//!             others, starts; closes those it does not listen on
//! new → old   OK                   (once every address accepts)
//! old → new   C ... / TOOK / GO    each open connection (`carry`)
//! old → new   PING, new → old PONG (then the old one stops accepting and
//!             sends those its queue held)
//! old → new   BYE                  then the old drains what it kept
//! ```
//!
//! Both processes accept from the same sockets until the connections are
//! over: a client in the kernel's queue is taken by one of them, never
//! dropped. The old one's accept loops then stop on their gate
//! (`systemd::Gate`), never by `shutdown(2)`, which would close the
//! socket for the new one too. Its open plain connections go to the new
//! process with their unsent bytes (`carry`), those on the kernel relay
//! taken back by the copy pump first; the TLS ones end as they would on
//! SIGTERM (`drain_timeout`). If the new
//! process refuses, dies or says nothing in time before the end of the
//! connections, the old one serves on (accepting, the connections it
//! still has pumping) and says so in one line, and the next attempt is
//! heard. A peer of another user than root or this process's is
//! refused.
//!
//! The new process gets the upgrade socket with the listeners, so the
//! path stays valid without a new bind (which the new process, once it
//! gave root up, could not do in a root-only directory); a process that
//! stops without handing over removes the path if it is still its socket.
//!
//! The messages and their descriptors: `wire`; the open connections:
//! `carry`; `rodizio upgrade`, which starts the new process and waits
//! for its report: `launch`.
//!
//! # Threads
//!
//! The new side runs in `Balancer::listen`, before any address is bound;
//! the old side is one thread (`rodizio-upgrade`) that waits on the Unix
//! socket and the shutdown's gate, one hand-over at a time.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C is stopped and started by hand.

pub mod carry;
pub mod launch;
pub mod wire;

pub use carry::Carrier;

use std::fs;
use std::io::{self, ErrorKind};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use socket2::{Domain, SockAddr, SockRef, Socket, Type};

use crate::error::{Error, Result};
use crate::shutdown::Shutdown;
use crate::systemd::{self, Gate};
use crate::throttle::{self, LogThrottle};

/// The first message, and the version of the hand-over it names.
pub const HELLO: &str = "RODIZIO-UPGRADE 1";
/// Longest wait for each message of the hand-over but `OK`.
const STEP: Duration = Duration::from_secs(5);
/// Longest wait for the new process's `OK`: its whole start-up (names
/// resolved, files read).
const START_WAIT: Duration = Duration::from_secs(60);
/// The most listening sockets a hand-over carries.
const MAX_LISTENERS: usize = 1024;

/// What gives the listening sockets to hand over, each with its address,
/// at the time of the hand-over (a reload may have added or removed some).
/// An error (a socket that could not be copied) sends none.
pub type Sockets = Box<dyn Fn() -> Result<Vec<(SocketAddr, TcpListener)>, String> + Send>;

/// This process's side of `upgrade_socket`: the Unix socket it serves
/// hand-overs on, and the process it took the sockets from, if any.
#[derive(Debug)]
pub struct Upgrade {
    path: PathBuf,
    server: Socket,
    /// The path's device and inode when this process took or made it.
    node: Option<(u64, u64)>,
    /// The previous process, waiting for `OK`.
    previous: Option<Socket>,
    /// Whether this process handed its sockets over.
    handed: Arc<AtomicBool>,
    /// `rodizio upgrade`'s pipe, when it started this process.
    report: Option<fs::File>,
}

/// At start-up, before any address is bound: takes the running process's
/// listening sockets through `path` when one answers there (they are then
/// found by `systemd::inherited`, as systemd's would be), or makes `path`
/// this process's upgrade socket.
///
/// # Errors
///
/// [`Error::InvalidSetting`] (`upgrade_socket`) when the path cannot be
/// used, or the process there refused or answered what is not a
/// hand-over; the running process serves on.
pub fn start(path: &Path) -> Result<Upgrade> {
    let fail = |why: String| Error::setting("upgrade_socket", format!("{}: {why}", path.display()));
    let previous = connect(path).map_err(|e| fail(words(&e)))?;
    let (server, previous) = match previous {
        Some(conn) => (take_over(&conn).map_err(fail)?, Some(conn)),
        None => (bind(path).map_err(fail)?, None),
    };
    Ok(Upgrade {
        node: node(path),
        path: path.to_path_buf(),
        server,
        previous,
        handed: Arc::default(),
        report: launch::take_report(),
    })
}

impl Upgrade {
    /// Once this process accepts on every address: tells the previous
    /// process, if any, to drain, takes its open connections (each to
    /// `carrier`), then hears the next process's requests
    /// on a thread of its own, handing it what `sockets` gives at that
    /// time (each listening socket with its address).
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when the thread or its eventfd cannot be made.
    pub fn serve(mut self, sockets: Sockets, carrier: &Carrier, shutdown: &Shutdown) -> Result<()> {
        let carried = match self.previous.take() {
            Some(previous) => release(&previous, &self.path, carrier),
            None => carry::Counts::default(),
        };
        launch::report(self.report.take(), carried.carried, carried.stayed);
        let gate = Arc::new(Gate::new().map_err(|e| Error::io("making the upgrade's eventfd", e))?);
        {
            let gate = Arc::clone(&gate);
            let (path, mine, handed) = (self.path.clone(), self.node, Arc::clone(&self.handed));
            shutdown.on_trigger(move || {
                gate.open();
                // Stopped without a hand-over: the path goes, if it is
                // still this socket (a hand-over leaves it to the next).
                if !handed.load(Ordering::SeqCst) && mine.is_some() && node(&path) == mine {
                    let _ = fs::remove_file(&path);
                }
            });
        }
        let shutdown = shutdown.clone();
        thread::Builder::new()
            .name("rodizio-upgrade".into())
            .spawn(move || self.run(&sockets, &gate, &shutdown))
            .map_err(|e| Error::io("starting the upgrade thread", e))?;
        Ok(())
    }

    /// Hears hand-over requests until one succeeds (the shutdown is then
    /// triggered) or the process stops.
    fn run(self, sockets: &Sockets, gate: &Gate, shutdown: &Shutdown) {
        // Out of descriptors, accept fails at every try: a line a second.
        let errors_log = LogThrottle::new(Duration::from_secs(1));
        while gate.wait(&self.server) {
            let conn = match self.server.accept() {
                Ok((conn, _)) => conn,
                Err(err) => {
                    if let Some(others) = errors_log.event(std::time::Instant::now()) {
                        log::warn!(
                            "upgrade_socket {}: accept failed: {err}; retrying every 100ms{}",
                            self.path.display(),
                            throttle::more(others)
                        );
                    }
                    let _ = shutdown.receiver().recv_timeout(Duration::from_millis(100));
                    continue;
                }
            };
            // The connections offered to this new process, by id: each once.
            let mut seen = std::collections::HashSet::new();
            let carried = self.hand_over(&conn, sockets).and_then(|()| {
                // Still accepting while the open connections go: a new
                // process that fails now leaves this one serving.
                let _ = conn.set_read_timeout(Some(STEP));
                carry::send_all(&conn, &mut seen, false)?;
                // Still there, before this one stops accepting.
                carry::confirm(&conn)
            });
            match carried {
                Ok(()) => {
                    log::info!(
                        "a new rodizio took the listening sockets through {}: draining",
                        self.path.display()
                    );
                    self.handed.store(true, Ordering::SeqCst);
                    shutdown.trigger();
                    // No longer accepting: what the queue still held goes too.
                    match carry::send_all(&conn, &mut seen, true) {
                        Ok(()) => {
                            let _ = wire::send(&conn, "BYE", None);
                        }
                        Err(why) => log::warn!(
                            "upgrade_socket {}: open connections no longer handed over \
                             ({why}); the rest drain here",
                            self.path.display()
                        ),
                    }
                    return;
                }
                Err(why) => log::warn!(
                    "upgrade_socket {}: no hand-over ({why}); this process serves on",
                    self.path.display()
                ),
            }
        }
    }

    /// One hand-over, on `conn`: `Ok` once the new process said `OK`.
    fn hand_over(&self, conn: &Socket, sockets: &Sockets) -> std::result::Result<(), String> {
        let uid = peer_uid(conn).map_err(|e| words(&e))?;
        // SAFETY: geteuid cannot fail.
        let own = unsafe { libc::geteuid() };
        if uid != 0 && uid != own {
            return Err(format!(
                "asked by user {uid}, neither root nor this process's"
            ));
        }
        let timeouts = |d| {
            conn.set_read_timeout(Some(d))
                .and_then(|()| conn.set_write_timeout(Some(STEP)))
        };
        timeouts(STEP).map_err(|e| words(&e))?;
        let said = |e: io::Error| format!("the new process: {}", words(&e));
        let (hello, fd) = wire::recv(conn).map_err(said)?;
        if hello != HELLO || fd.is_some() {
            let _ = wire::send(conn, &format!("NO this rodizio speaks {HELLO}"), None);
            return Err(format!(
                "the new process said {:?}, not {HELLO:?}",
                crate::units::shown(&hello, 80)
            ));
        }
        let listeners = match sockets() {
            Ok(listeners) => listeners,
            Err(why) => {
                let _ = wire::send(conn, &format!("NO {why}"), None);
                return Err(why);
            }
        };
        for (addr, listener) in &listeners {
            wire::send(conn, &format!("L {addr}"), Some(listener.as_raw_fd())).map_err(said)?;
        }
        wire::send(conn, "U", Some(self.server.as_raw_fd())).map_err(said)?;
        wire::send(conn, "END", None).map_err(said)?;
        timeouts(START_WAIT).map_err(|e| words(&e))?;
        let (ok, fd) = wire::recv(conn)
            .map_err(|e| format!("the new process did not say it serves: {}", words(&e)))?;
        if ok != "OK" || fd.is_some() {
            return Err(format!(
                "the new process said {:?}, not \"OK\"",
                crate::units::shown(&ok, 80)
            ));
        }
        Ok(())
    }
}

/// A connection to the process listening at `path`; `None` when nothing
/// listens there (no file, or a socket left by a process that ended).
fn connect(path: &Path) -> io::Result<Option<Socket>> {
    let socket = Socket::new(Domain::UNIX, Type::SEQPACKET, None)?;
    socket.set_read_timeout(Some(STEP))?;
    socket.set_write_timeout(Some(STEP))?;
    match socket.connect(&SockAddr::unix(path)?) {
        Ok(()) => Ok(Some(socket)),
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ConnectionRefused) => {
            Ok(None)
        }
        Err(e) if e.raw_os_error() == Some(libc::EPROTOTYPE) => Err(io::Error::new(
            ErrorKind::InvalidInput,
            "a socket of another kind listens there (not a rodizio upgrade socket)",
        )),
        Err(e) => Err(e),
    }
}

/// Makes `path` a new upgrade socket: a socket file nothing listens on
/// is replaced; any other file is an error.
fn bind(path: &Path) -> std::result::Result<Socket, String> {
    if let Ok(meta) = fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err("a file that is not a socket is there".into());
        }
        fs::remove_file(path).map_err(|e| format!("removing the old socket: {}", words(&e)))?;
    }
    let socket = Socket::new(Domain::UNIX, Type::SEQPACKET, None).map_err(|e| words(&e))?;
    let addr = SockAddr::unix(path).map_err(|e| words(&e))?;
    socket.bind(&addr).map_err(|e| words(&e))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600)).map_err(|e| words(&e))?;
    socket.listen(16).map_err(|e| words(&e))?;
    Ok(socket)
}

/// The new side of the hand-over on `conn`: every listening socket put
/// among the passed ones, the upgrade socket returned.
fn take_over(conn: &Socket) -> std::result::Result<Socket, String> {
    let said = |e: io::Error| format!("the running rodizio: {}", words(&e));
    wire::send(conn, HELLO, None).map_err(said)?;
    let mut server = None;
    let mut taken = 0;
    loop {
        let (line, fd) = wire::recv(conn).map_err(said)?;
        let (word, rest) = line.split_once(' ').unwrap_or((line.as_str(), ""));
        match (word, fd) {
            ("END", None) if rest.is_empty() => break,
            ("NO", None) => {
                return Err(format!(
                    "the running rodizio refused: {}",
                    crate::units::shown(rest, 80)
                ))
            }
            ("L", Some(fd)) if taken < MAX_LISTENERS => {
                let addr: SocketAddr = rest.parse().map_err(|_| {
                    format!(
                        "the running rodizio named {:?}, not an address",
                        crate::units::shown(rest, 80)
                    )
                })?;
                check(&fd, Type::STREAM, Some(addr))?;
                systemd::adopt(addr, fd);
                taken += 1;
            }
            ("U", Some(fd)) if rest.is_empty() && server.is_none() => {
                check(&fd, Type::SEQPACKET, None)?;
                server = Some(Socket::from(fd));
            }
            _ => {
                return Err(format!(
                    "the running rodizio said {:?}",
                    crate::units::shown(&line, 80)
                ))
            }
        }
    }
    let server = server.ok_or("the running rodizio did not hand its upgrade socket over")?;
    let taken = crate::units::count(taken as u64, "listening socket");
    log::info!("took {taken} from the running rodizio");
    Ok(server)
}

/// Whether `fd` is a listening socket of `kind`, on `addr` when given.
fn check(fd: &OwnedFd, kind: Type, addr: Option<SocketAddr>) -> std::result::Result<(), String> {
    let socket = SockRef::from(fd);
    let what = addr.map_or_else(
        || "its upgrade socket".to_string(),
        |a| format!("the socket for {a}"),
    );
    let bad = |why: &str| format!("the running rodizio handed over {what}, but it is {why}");
    match socket.r#type() {
        Ok(t) if t == kind => {}
        Ok(_) => return Err(bad("a socket of another kind")),
        Err(_) => return Err(bad("not a socket")),
    }
    if !socket.is_listener().unwrap_or(false) {
        return Err(bad("not listening"));
    }
    if let Some(addr) = addr {
        let local = socket.local_addr().ok().and_then(|a| a.as_socket());
        if local != Some(addr) {
            let local = local.map_or_else(|| "no address".to_string(), |a| a.to_string());
            return Err(bad(&format!("listening on {local}")));
        }
    }
    Ok(())
}

/// Tells the previous process that this one serves; it stops accepting,
/// hands its open connections over (each to `carrier`), says `BYE` and
/// drains what it kept. Failures are warnings.
fn release(previous: &Socket, path: &Path, carrier: &Carrier) -> carry::Counts {
    if let Err(err) = wire::send(previous, "OK", None) {
        log::warn!(
            "the previous rodizio ({}) was not told ({}): it may still serve",
            path.display(),
            words(&err)
        );
        return carry::Counts::default();
    }
    // systemd follows this process from now on (`NotifyAccess=all`).
    systemd::notify(&format!("MAINPID={}", std::process::id()));
    let started = std::time::Instant::now();
    let mut done = carry::Counts::default();
    let taken = carry::take_all(previous, carrier, &mut done);
    let left = if done.stayed > 0 {
        format!(", {} left with it", done.stayed)
    } else {
        String::new()
    };
    let carried = crate::units::count(done.carried as u64, "open connection");
    match taken {
        Ok(()) => log::info!(
            "the previous rodizio ({}) drains; {carried} carried over in {:?}{left}",
            path.display(),
            started.elapsed(),
        ),
        Err(why) => log::warn!(
            "the previous rodizio ({}): {why}; {carried} carried over; it keeps the others \
             and serves on, as this one does (stop the one not wanted with SIGTERM)",
            path.display()
        ),
    }
    done
}

/// The user id of the process at the other end of `conn`.
fn peer_uid(conn: &Socket) -> io::Result<u32> {
    // SAFETY: a zeroed ucred is valid; getsockopt writes at most its size.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: as above, on a live socket.
    let r = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.uid)
}

/// The device and inode of `path`, if it exists.
fn node(path: &Path) -> Option<(u64, u64)> {
    fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// An I/O error in words: a timeout says so.
fn words(err: &io::Error) -> String {
    match err.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => "no answer in time".into(),
        _ => err.to_string(),
    }
}
