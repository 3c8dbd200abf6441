//! `tcp_user_timeout`: `TCP_USER_TIMEOUT` on both of the balancer's
//! sockets of each connection (the client's and the backend's), read back
//! with getsockopt on the balancer's own sockets (it runs in this process),
//! and changed by a reload for the connections that follow.

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::BorrowedFd;
use std::time::Duration;

use common::{connect, wait_for};
use rodizio::balancer::Balancer;
use rodizio::config::{Config, Overrides};
use rodizio::health::CheckKind;
use rodizio::reload::Reloader;
use rodizio::Shutdown;
use socket2::SockRef;

const WAIT: Duration = Duration::from_secs(10);

/// The balancer's TCP socket from `local` to `peer`, with its
/// `TCP_USER_TIMEOUT`, looked for among this process's descriptors.
fn user_timeout_of(local: SocketAddr, peer: SocketAddr) -> Option<Option<Duration>> {
    let fds = std::fs::read_dir("/proc/self/fd").ok()?;
    for entry in fds.flatten() {
        let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        // SAFETY: the sockets looked for belong to connections this test
        // holds open, so they stay open while they are read. Any other
        // descriptor is only asked for its addresses; one closed meanwhile
        // by another thread makes those calls fail with EBADF, skipped.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let s = SockRef::from(&fd);
        let addrs = (s.local_addr(), s.peer_addr());
        let (Ok(l), Ok(p)) = addrs else { continue };
        if l.as_socket() == Some(local) && p.as_socket() == Some(peer) {
            return s.tcp_user_timeout().ok();
        }
    }
    None
}

/// One connection through the balancer at `lb` to the backend listening
/// on `backend`: the client, the backend's end, and the balancer's two
/// sockets as (local, peer) pairs.
struct Through {
    _client: TcpStream,
    _backend_end: TcpStream,
    client_side: (SocketAddr, SocketAddr),
    backend_side: (SocketAddr, SocketAddr),
}

fn through(lb: SocketAddr, backend: &TcpListener) -> Through {
    let mut client = connect(lb).expect("connect to the balancer");
    client.write_all(b"x").expect("first byte");
    let mut accepted = None;
    let got = wait_for(WAIT, || {
        accepted = backend.accept().ok();
        accepted.is_some()
    });
    assert!(got, "the balancer never connected to the backend");
    let (end, from) = accepted.expect("accepted above");
    end.set_read_timeout(Some(WAIT)).unwrap();
    end.set_write_timeout(Some(WAIT)).unwrap();
    let backend_addr = backend.local_addr().unwrap();
    Through {
        client_side: (lb, client.local_addr().unwrap()),
        backend_side: (from, backend_addr),
        _client: client,
        _backend_end: end,
    }
}

/// Waits until both of the balancer's sockets of `t` read `expected`
/// (the worker sets them just after connecting); returns what they read.
fn both_read(t: &Through, expected: Option<Duration>) -> [Option<Option<Duration>>; 2] {
    let read = || {
        [
            user_timeout_of(t.client_side.0, t.client_side.1),
            user_timeout_of(t.backend_side.0, t.backend_side.1),
        ]
    };
    wait_for(WAIT, || read() == [Some(expected), Some(expected)]);
    read()
}

/// A balancer in front of `backend` with `tweak` applied, with a
/// reloader reading `file`; its run thread stops on `shutdown`.
fn start(
    backend: SocketAddr,
    file: &std::path::Path,
    tweak: impl FnOnce(&mut Config),
    shutdown: &Shutdown,
) -> (SocketAddr, Reloader, std::thread::JoinHandle<()>) {
    let mut config = common::config(&[backend]);
    config.health.check = CheckKind::Off;
    tweak(&mut config);
    let balancer = Balancer::bind(config).expect("bind");
    let addr = balancer.local_addr();
    let reloader = Reloader::new(file, Overrides::default(), &balancer);
    let stop = shutdown.clone();
    let thread = std::thread::spawn(move || {
        let _ = balancer.run(&stop);
    });
    (addr, reloader, thread)
}

fn backend_listener() -> TcpListener {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    listener
}

/// With `tcp_user_timeout` 7 s, the balancer's client socket and backend
/// socket both carry `TCP_USER_TIMEOUT` = 7000 ms; off by default.
#[test]
fn both_sockets_carry_the_user_timeout() {
    let shutdown = Shutdown::new();
    let backend = backend_listener();
    let file = std::env::temp_dir().join(format!("rodizio-tut-{}-a.json", std::process::id()));
    let seven = Some(Duration::from_secs(7));
    let (lb, _reloader, thread) = start(
        backend.local_addr().unwrap(),
        &file,
        |c| c.proxy.tcp_user_timeout = seven,
        &shutdown,
    );
    let t = through(lb, &backend);
    assert_eq!(both_read(&t, seven), [Some(seven), Some(seven)]);
    shutdown.trigger();
    drop(t);
    thread.join().unwrap();

    // Off by default: the kernel's 0, which socket2 reads as none.
    let shutdown = Shutdown::new();
    let (lb, _reloader, thread) = start(backend.local_addr().unwrap(), &file, |_| {}, &shutdown);
    let t = through(lb, &backend);
    assert_eq!(both_read(&t, None), [Some(None), Some(None)]);
    shutdown.trigger();
    drop(t);
    thread.join().unwrap();
}

/// A reload that sets `tcp_user_timeout` applies to the connections
/// accepted after it, and a reload that changes it again too.
#[test]
fn a_reload_changes_it_for_new_connections() {
    let shutdown = Shutdown::new();
    let backend = backend_listener();
    let backend_addr = backend.local_addr().unwrap();
    let file = std::env::temp_dir().join(format!("rodizio-tut-{}-b.json", std::process::id()));
    let write = |extra: &str| {
        let text = format!(
            "{{\"listen\": \"127.0.0.1:0\", \"backends\": [\"{backend_addr}\"], \
             \"health_check\": \"off\", \"connect_timeout\": \"2s\", \
             \"idle_timeout\": \"30s\", \"drain_timeout\": \"10s\"{extra}}}"
        );
        std::fs::write(&file, text).unwrap();
    };
    let (lb, reloader, thread) = start(backend_addr, &file, |_| {}, &shutdown);
    let before = through(lb, &backend);
    assert_eq!(both_read(&before, None), [Some(None), Some(None)]);

    write(", \"tcp_user_timeout\": \"3s\"");
    let report = reloader.reload().expect("reload");
    assert!(
        report.summary.contains("tcp_user_timeout off → 3s"),
        "{}",
        report.summary
    );
    let three = Some(Duration::from_secs(3));
    let after = through(lb, &backend);
    assert_eq!(both_read(&after, three), [Some(three), Some(three)]);

    write(", \"tcp_user_timeout\": 1.5");
    reloader.reload().expect("reload");
    let again = Some(Duration::from_millis(1500));
    let last = through(lb, &backend);
    assert_eq!(both_read(&last, again), [Some(again), Some(again)]);

    shutdown.trigger();
    drop((before, after, last));
    thread.join().unwrap();
    let _ = std::fs::remove_file(&file);
}
