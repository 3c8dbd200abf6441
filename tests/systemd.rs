//! rodizio as a systemd service, through the binary: what it tells a
//! `NOTIFY_SOCKET` the test binds (ready once listening, the first checks'
//! status, reloading, ready, a failed reload's status, stopping; every
//! listening address announced), and
//! the listening sockets it is given with `LISTEN_FDS`, by the real
//! `systemd-socket-activate` (Debian package systemd) and by the test
//! itself through a restart, with no client refused.

mod child;
mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{self, UnixDatagram};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use child::{Child, BIN};
use common::{closed_port, request, time_until, Demo, IO_TIMEOUT};

/// Longest wait for any message or exit.
const WAIT: Duration = Duration::from_secs(15);

/// A child process (rodizio, or a program that becomes it) with
/// `RUST_LOG=info`, as a [`Child`]: killed by its PID and reaped on drop.
fn spawn(mut command: Command) -> Child {
    Child::spawn(command.env("RUST_LOG", "info"))
}

/// Waits for the exit of `child` (bounded); its code.
fn exit_code(child: &mut Child) -> Option<i32> {
    let status = child.wait_exit(WAIT);
    status
        .unwrap_or_else(|| panic!("did not exit; log:\n{}", child.log()))
        .code()
}

/// Waits until the log of `child` has `what`.
fn wait_log(child: &Child, what: &str) {
    let seen = time_until(WAIT, || child.log().contains(what));
    assert!(seen.is_some(), "no {what:?} in the log:\n{}", child.log());
}

/// A notification socket bound by the test, removed on drop when it is a
/// path.
struct NotifySocket {
    socket: UnixDatagram,
    /// What `NOTIFY_SOCKET` says.
    name: String,
    path: Option<PathBuf>,
}

impl NotifySocket {
    fn at_path(tag: &str) -> NotifySocket {
        let path =
            std::env::temp_dir().join(format!("rodizio-notify-{tag}-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let socket = UnixDatagram::bind(&path).expect("bind the notify socket");
        socket.set_read_timeout(Some(WAIT)).unwrap();
        NotifySocket {
            socket,
            name: path.display().to_string(),
            path: Some(path),
        }
    }

    fn abstract_name(tag: &str) -> NotifySocket {
        let name = format!("rodizio-notify-{tag}-{}", std::process::id());
        let addr = net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let socket = UnixDatagram::bind_addr(&addr).expect("bind the notify socket");
        socket.set_read_timeout(Some(WAIT)).unwrap();
        NotifySocket {
            socket,
            name: format!("@{name}"),
            path: None,
        }
    }

    /// The next message, or a failed test after [`WAIT`].
    fn next(&self) -> String {
        let mut buf = [0u8; 4096];
        let n = self
            .socket
            .recv(&mut buf)
            .expect("a message from rodizio in time");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }
}

impl Drop for NotifySocket {
    fn drop(&mut self) {
        if let Some(path) = &self.path {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// `CLOCK_MONOTONIC` in microseconds, as systemd and rodizio read it.
fn monotonic_usec() -> u64 {
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: fills a timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000
}

/// The value of `key=` in a notification.
fn field(message: &str, key: &str) -> Option<String> {
    message
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .map(str::to_string)
}

/// With checks on, READY=1 comes once the port listens, before the first
/// round (its STATUS names the address and says the checks still run);
/// the round's STATUS follows (the dead backend down, fall 1). SIGHUP
/// gives RELOADING=1 with the monotonic clock's time, then READY=1; a
/// reload of a bad file gives READY=1 whose STATUS says it failed and
/// why; SIGTERM gives STOPPING=1, and a clean exit.
#[test]
fn notifications_follow_the_start_a_reload_and_the_stop() {
    let notify = NotifySocket::at_path("sequence");
    let dir = std::env::temp_dir();
    let config = dir.join(format!("rodizio-notify-{}.json", std::process::id()));
    let good = format!(
        r#"{{"listen": "127.0.0.1:0", "backends": ["{}"],
            "health_interval": "1s", "health_timeout": "100ms", "fall": 1,
            "allow_root": true}}"#,
        closed_port()
    );
    std::fs::write(&config, &good).unwrap();
    let mut command = Command::new(BIN);
    command
        .arg("-c")
        .arg(&config)
        .env("NOTIFY_SOCKET", &notify.name);
    let mut rodizio = spawn(command);

    let ready = notify.next();
    assert!(ready.starts_with("READY=1\n"), "{ready:?}");
    let status = field(&ready, "STATUS").unwrap_or_default();
    let addr = rodizio.listening();
    assert_eq!(
        status,
        format!(
            "listening on {addr}; first health checks running; 0 connections, 1 of 1 backend up"
        )
    );
    // Down after the first round (fall 1), said in a STATUS alone.
    assert_eq!(
        notify.next(),
        format!("STATUS=listening on {addr}; 0 connections, 0 of 1 backend up")
    );

    let before = monotonic_usec();
    rodizio.signal(libc::SIGHUP);
    let reloading = notify.next();
    let after = monotonic_usec();
    assert!(reloading.starts_with("RELOADING=1\n"), "{reloading:?}");
    let usec: u64 = field(&reloading, "MONOTONIC_USEC")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no MONOTONIC_USEC in {reloading:?}"));
    assert!(
        (before..=after).contains(&usec),
        "{usec} not between {before} and {after}"
    );
    let ready = notify.next();
    assert_eq!(ready, "READY=1\nSTATUS=0 connections, 0 of 1 backend up");

    std::fs::write(&config, r#"{"listen": "127.0.0.1:0", "workers": "many"}"#).unwrap();
    rodizio.signal(libc::SIGHUP);
    assert!(notify.next().starts_with("RELOADING=1\n"));
    let ready = notify.next();
    let status = field(&ready, "STATUS").unwrap_or_default();
    assert!(ready.starts_with("READY=1\n"), "{ready:?}");
    assert!(status.starts_with("reload failed: "), "{status}");
    assert!(status.contains("workers"), "{status}");
    assert!(
        status.ends_with("; 0 connections, 0 of 1 backend up"),
        "{status}"
    );

    rodizio.signal(libc::SIGTERM);
    let stopping = notify.next();
    assert!(stopping.starts_with("STOPPING=1\n"), "{stopping:?}");
    assert_eq!(exit_code(&mut rodizio), Some(0), "{}", rodizio.log());
    let _ = std::fs::remove_file(&config);
}

/// An abstract `NOTIFY_SOCKET` (`@name`) is reached too; with checks off,
/// READY=1 needs no round (the dead backend is still counted up) and says
/// no check runs.
#[test]
fn an_abstract_notify_socket_hears_ready_with_checks_off() {
    let notify = NotifySocket::abstract_name("abstract");
    let mut command = Command::new(BIN);
    command
        .args(["-l", "127.0.0.1:0", "-b", &closed_port().to_string()])
        .args(["--health-check", "off", "--allow-root"])
        .env("NOTIFY_SOCKET", &notify.name);
    let mut rodizio = spawn(command);
    let ready = notify.next();
    let addr = rodizio.listening();
    assert_eq!(
        ready,
        format!("READY=1\nSTATUS=listening on {addr}; 0 connections, 1 of 1 backend up"),
    );
    rodizio.signal(libc::SIGTERM);
    assert!(notify.next().starts_with("STOPPING=1\n"));
    assert_eq!(exit_code(&mut rodizio), Some(0));
}

/// Every address is announced, in the start-up line and in READY=1's
/// STATUS: two of one service and a second service's.
#[test]
fn every_listening_address_is_announced() {
    let notify = NotifySocket::at_path("addresses");
    let backend = closed_port().to_string();
    let config = std::env::temp_dir().join(format!("rodizio-addrs-{}.json", std::process::id()));
    std::fs::write(
        &config,
        format!(
            r#"{{"allow_root": true, "health_check": "off", "services": [
                {{"name": "web", "listen": ["127.0.0.1:0", "127.0.0.2:0"], "backends": ["{backend}"]}},
                {{"name": "api", "listen": "127.0.0.3:0", "backends": ["{backend}"]}}]}}"#
        ),
    )
    .unwrap();
    let mut command = Command::new(BIN);
    command
        .arg("-c")
        .arg(&config)
        .env("NOTIFY_SOCKET", &notify.name);
    let mut rodizio = spawn(command);
    let ready = notify.next();
    let first = rodizio.listening();
    let _ = std::fs::remove_file(&config);
    let line = rodizio
        .output()
        .lines()
        .find(|l| l.starts_with(child::LISTENING))
        .map(str::to_string)
        .unwrap_or_default();
    let rest = line
        .split("; also on ")
        .nth(1)
        .unwrap_or_else(|| panic!("{line}"));
    let others: Vec<SocketAddr> = rest.split(", ").map(|a| a.parse().unwrap()).collect();
    let ips: Vec<String> = others.iter().map(|a| a.ip().to_string()).collect();
    assert_eq!(first.ip().to_string(), "127.0.0.1");
    assert_eq!(ips, ["127.0.0.2", "127.0.0.3"], "{line}");
    let all = [vec![first], others].concat();
    let listed: Vec<String> = all.iter().map(ToString::to_string).collect();
    assert_eq!(
        field(&ready, "STATUS").unwrap_or_default(),
        format!(
            "listening on {}; 0 connections, 2 of 2 backends up",
            listed.join(", ")
        )
    );
    for addr in all {
        assert!(
            TcpStream::connect_timeout(&addr, IO_TIMEOUT).is_ok(),
            "{addr}"
        );
    }
    rodizio.signal(libc::SIGTERM);
    assert_eq!(exit_code(&mut rodizio), Some(0));
}

/// A free port on loopback, for `systemd-socket-activate`, which cannot
/// be told port 0: bound, read, closed.
fn free_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

/// `systemd-socket-activate` opens the port and starts rodizio only when
/// the first client comes: that client, connected before rodizio existed,
/// is served from the backlog, and the log names the socket.
#[test]
fn systemd_socket_activate_hands_over_its_socket_and_first_client() {
    let tool = "systemd-socket-activate";
    assert!(
        Command::new(tool).arg("--help").output().is_ok(),
        "{tool} is missing (Debian package systemd; scripts/install-test-tools.sh installs it)"
    );
    let demo = Demo::start("127.0.0.1:0", "A");
    let addr = free_port();
    let mut command = Command::new(tool);
    command
        .args(["-l", &addr.to_string(), "--fdname=web", BIN])
        .args(["-l", &addr.to_string(), "-b", &demo.addr.to_string()])
        .args(["--health-check", "off", "--allow-root"]);
    let mut activator = spawn(command);
    wait_log(&activator, "Listening on");
    // rodizio is not running yet: the tool waits for this client.
    let mut client = TcpStream::connect_timeout(&addr, IO_TIMEOUT).expect("connect");
    client.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    client.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    client.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut reply = String::new();
    client
        .read_to_string(&mut reply)
        .expect("the first client's reply");
    assert!(reply.contains("Handled by server A"), "{reply:?}");
    drop(client);
    wait_log(
        &activator,
        "through the socket systemd passed (descriptor 3, named web)",
    );
    assert_eq!(request(addr).expect("a second client"), "A");
    activator.signal(libc::SIGTERM);
    assert_eq!(exit_code(&mut activator), Some(0), "{}", activator.log());
}

/// rodizio on `listener`, passed as descriptor 3 with `LISTEN_FDS=1`, as
/// systemd passes it. `LISTEN_PID` must be rodizio's own PID, known only
/// in the child: `sh` sets it to its own (`$$`), then `exec`s rodizio,
/// which keeps that PID.
fn start_on(listener: &TcpListener, backend: SocketAddr) -> Child {
    let addr = listener.local_addr().unwrap().to_string();
    let fd = listener.as_raw_fd();
    let mut command = Command::new("sh");
    command
        .args(["-c", "export LISTEN_PID=$$; exec \"$0\" \"$@\"", BIN])
        .args(["-l", &addr, "-b", &backend.to_string()])
        .args(["--health-check", "off", "--allow-root"])
        .env("LISTEN_FDS", "1")
        .env("LISTEN_FDNAMES", "test");
    // SAFETY: between fork and exec only dup2 and fcntl run, both
    // async-signal-safe, on a descriptor the parent keeps open.
    unsafe {
        command.pre_exec(move || {
            let rc = if fd == 3 {
                libc::fcntl(3, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, 3)
            };
            if rc < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    spawn(command)
}

/// The test holds the listening socket, as systemd does: a client that
/// connects before rodizio starts is served; then, with clients coming one
/// after another all the time, rodizio is stopped and a new one started on
/// the same socket, and not one client is refused (those that came between
/// the two waited in the backlog).
#[test]
fn a_restart_on_a_passed_socket_refuses_no_client() {
    let demo = Demo::start("127.0.0.1:0", "A");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();

    // Before any rodizio: the kernel completes the handshake and holds it.
    let mut early = TcpStream::connect_timeout(&addr, IO_TIMEOUT).expect("connect");
    early.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    early.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut first = start_on(&listener, demo.addr);
    let mut reply = String::new();
    early
        .read_to_string(&mut reply)
        .expect("the early client's reply");
    assert!(reply.contains("Handled by server A"), "{reply:?}");
    drop(early);
    wait_log(
        &first,
        "through the socket systemd passed (descriptor 3, named test)",
    );

    let served = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let clients = {
        let (served, failures, stop) = (served.clone(), failures.clone(), stop.clone());
        thread::spawn(move || {
            let mut longest = Duration::ZERO;
            while !stop.load(Ordering::SeqCst) {
                let started = std::time::Instant::now();
                match request(addr) {
                    Ok(_) => served.fetch_add(1, Ordering::SeqCst),
                    Err(err) => {
                        failures.lock().unwrap().push(err.to_string());
                        0
                    }
                };
                longest = longest.max(started.elapsed());
            }
            longest
        })
    };
    let at_least = |n: usize| {
        let reached = time_until(WAIT, || served.load(Ordering::SeqCst) >= n);
        assert!(reached.is_some(), "{n} clients not served in time");
    };
    at_least(50);
    first.signal(libc::SIGTERM);
    assert_eq!(exit_code(&mut first), Some(0), "{}", first.log());
    let before_second = served.load(Ordering::SeqCst);
    let mut second = start_on(&listener, demo.addr);
    at_least(before_second + 50);
    stop.store(true, Ordering::SeqCst);
    let longest = clients.join().unwrap();
    // The client that waited for the second rodizio waited longest.
    eprintln!(
        "{} clients served across the restart, the longest in {longest:?}",
        served.load(Ordering::SeqCst)
    );
    let failures = failures.lock().unwrap();
    assert!(
        failures.is_empty(),
        "{} of {} clients failed across the restart: {:?}",
        failures.len(),
        served.load(Ordering::SeqCst) + failures.len(),
        &failures[..failures.len().min(5)]
    );
    second.signal(libc::SIGTERM);
    assert_eq!(exit_code(&mut second), Some(0), "{}", second.log());
}
