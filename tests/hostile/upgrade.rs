//! The upgrade socket (`upgrade_socket`) attacked from both ends.
//!
//! A fake running process (a `SOCK_SEQPACKET` listener of the test) in
//! front of a real new one: garbage, a refusal, a socket that lies about
//! its address, descriptors that are not listening TCP sockets, more
//! sockets than the bound, silence, a close, a socket of another kind or a
//! plain file at the path. The new process exits with one line naming
//! `upgrade_socket`, within the bound, and never serves on what it was
//! handed.
//!
//! A fake new process in front of a real running one: a wrong greeting, a
//! greeting with a descriptor, silence, 200 connections in a row, a request
//! while the running one is out of descriptors, a peer of
//! another user. The running one serves on throughout, its descriptors
//! come back to where they were, and a real upgrade afterwards works.

use std::fs;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use rodizio::upgrade::{wire, HELLO};
use socket2::{Domain, SockAddr, Socket, Type};

use crate::child::{self, Child, Scratch};
use crate::common::{wait_for, TestBackend};

/// Longest a refused hand-over may take the new process (its waits are
/// 5 s a message).
const WAIT: Duration = Duration::from_secs(15);

/// A SEQPACKET listener at `path`, as a running rodizio's would be.
fn fake_old(path: &Path) -> Socket {
    let socket = Socket::new(Domain::UNIX, Type::SEQPACKET, None).unwrap();
    socket.bind(&SockAddr::unix(path).unwrap()).unwrap();
    socket.listen(16).unwrap();
    socket
}

/// Starts a new rodizio on `listen` against `path` and lets `old` answer
/// its greeting with `answer` (on a thread); the new process's exit code,
/// its log, and how long it took.
fn new_against(
    path: &Path,
    listen: SocketAddr,
    answer: impl FnOnce(&Socket) + Send + 'static,
) -> (Option<i32>, String, Duration) {
    let old = fake_old(path);
    let peer = thread::spawn(move || {
        old.set_read_timeout(Some(WAIT)).unwrap();
        let (conn, _) = old.accept().unwrap();
        conn.set_read_timeout(Some(WAIT)).unwrap();
        conn.set_write_timeout(Some(WAIT)).unwrap();
        let (hello, _) = wire::recv(&conn).unwrap();
        assert_eq!(hello, HELLO);
        answer(&conn);
        // Held until the new process is gone.
        let _ = wire::recv(&conn);
    });
    let started = Instant::now();
    let ended = child::run_within(
        &mut child::command(&[
            "--allow-root",
            "-l",
            &listen.to_string(),
            "-b",
            "127.0.0.1:9",
            "--health-check",
            "off",
            "--upgrade-socket",
            path.to_str().unwrap(),
        ]),
        WAIT + Duration::from_secs(10),
    );
    let took = started.elapsed();
    let out = ended.output();
    peer.join().unwrap();
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), log, took)
}

/// The new process refused the hand-over: exit 2, one line naming the
/// setting and `why`, nothing served, within the bound.
fn refused(result: (Option<i32>, String, Duration), why: &str) {
    let (code, log, took) = result;
    assert_eq!(code, Some(2), "{log}");
    assert!(log.contains("upgrade_socket"), "{log}");
    assert!(log.contains(why), "wanted {why:?}: {log}");
    assert!(!log.contains("Load balancer listening"), "{log}");
    assert!(took < WAIT, "took {took:?}");
}

/// Sends `L addr` with `fd`.
fn listener_line(conn: &Socket, addr: SocketAddr, fd: RawFd) {
    wire::send(conn, &format!("L {addr}"), Some(fd)).unwrap();
}

#[test]
fn a_lying_or_garbled_running_process_is_refused_by_the_new_one() {
    let scratch = Scratch::new("upgrade-fake-old");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let lfd = listener.as_raw_fd();
    let elsewhere = TcpListener::bind("127.0.0.1:0").unwrap();
    let efd = elsewhere.as_raw_fd();
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let ufd = udp.as_raw_fd();
    let (pipe_r, _pipe_w) = std::io::pipe().unwrap();
    let pfd = pipe_r.as_raw_fd();
    let unbound = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    let nfd = unbound.as_raw_fd();
    type Answer = Box<dyn FnOnce(&Socket) + Send>;
    let cases: Vec<(&str, Answer, &str)> = vec![
        (
            "garbage",
            Box::new(|c| wire::send(c, "HTTP/1.1 200 OK", None).unwrap()),
            "said",
        ),
        (
            "refusal",
            Box::new(|c| wire::send(c, "NO go away", None).unwrap()),
            "refused: go away",
        ),
        (
            "pipe",
            Box::new(move |c| listener_line(c, addr, pfd)),
            "not a socket",
        ),
        (
            "udp",
            Box::new(move |c| listener_line(c, addr, ufd)),
            "another kind",
        ),
        (
            "not listening",
            Box::new(move |c| listener_line(c, addr, nfd)),
            "not listening",
        ),
        (
            "lie",
            Box::new(move |c| listener_line(c, addr, efd)),
            "listening on",
        ),
        (
            "no fd",
            Box::new(move |c| wire::send(c, &format!("L {addr}"), None).unwrap()),
            "said",
        ),
        (
            "bad address",
            Box::new(move |c| listener_line(c, "1.2.3.4:5".parse().unwrap(), lfd)),
            "listening on",
        ),
        (
            "no upgrade socket",
            Box::new(move |c| {
                listener_line(c, addr, lfd);
                wire::send(c, "END", None).unwrap();
            }),
            "did not hand its upgrade socket",
        ),
        (
            "too many",
            Box::new(move |c| {
                for _ in 0..1100 {
                    if wire::send(c, &format!("L {addr}"), Some(lfd)).is_err() {
                        break;
                    }
                }
            }),
            "upgrade_socket",
        ),
        ("silence", Box::new(|_| {}), "no answer in time"),
        (
            "close",
            Box::new(|c| {
                let _ = c.shutdown(std::net::Shutdown::Both);
            }),
            "closed",
        ),
    ];
    for (name, answer, why) in cases {
        let path = scratch.path(&format!("{}.sock", name.replace(' ', "-")));
        eprintln!("case {name}");
        refused(new_against(&path, addr, answer), why);
    }
}

/// At the path: a stream socket (not a rodizio's), or a plain file.
#[test]
fn a_path_that_is_not_an_upgrade_socket_is_an_error_at_start() {
    let scratch = Scratch::new("upgrade-path");
    let run = |path: &Path| {
        let out = child::run_within(
            &mut child::command(&[
                "--allow-root",
                "-l",
                "127.0.0.1:0",
                "-b",
                "127.0.0.1:9",
                "--health-check",
                "off",
                "--upgrade-socket",
                path.to_str().unwrap(),
            ]),
            WAIT,
        )
        .output();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let stream = scratch.path("stream.sock");
    let _listening = std::os::unix::net::UnixListener::bind(&stream).unwrap();
    let (code, log) = run(&stream);
    assert_eq!(code, Some(2), "{log}");
    assert!(log.contains("another kind"), "{log}");
    let file = scratch.file("plain", "not a socket");
    let (code, log) = run(&file);
    assert_eq!(code, Some(2), "{log}");
    assert!(log.contains("not a socket"), "{log}");
    assert_eq!(
        fs::read_to_string(&file).unwrap(),
        "not a socket",
        "the file was touched"
    );
}

/// A running rodizio with an upgrade socket, in front of an echo backend;
/// its upgrade socket's path.
fn old_one(scratch: &Scratch, backend: SocketAddr) -> (Child, std::path::PathBuf) {
    old_limited(scratch, backend, None)
}

/// [`old_one`], with at most `nofile` descriptors when given.
fn old_limited(
    scratch: &Scratch,
    backend: SocketAddr,
    nofile: Option<libc::rlim_t>,
) -> (Child, std::path::PathBuf) {
    let path = scratch.path("up.sock");
    let child = Child::on_loopback(
        &[
            "-b",
            &backend.to_string(),
            "--health-check",
            "off",
            "--upgrade-socket",
            path.to_str().unwrap(),
        ],
        |command| {
            if let Some(n) = nofile {
                crate::common::limit_in_child(command, libc::RLIMIT_NOFILE, n);
            }
        },
    );
    (child, path)
}

/// A connection to the upgrade socket at `path`, every wait bounded.
fn dial(path: &Path) -> Socket {
    let socket = Socket::new(Domain::UNIX, Type::SEQPACKET, None).unwrap();
    socket.set_read_timeout(Some(WAIT)).unwrap();
    socket.set_write_timeout(Some(WAIT)).unwrap();
    socket.connect(&SockAddr::unix(path).unwrap()).unwrap();
    socket
}

/// Greets the upgrade socket at `path` from a child process running as
/// `uid` (forked: between the fork and its exit it makes system calls
/// only); what its read got: bytes, 0 for a close, -1 for an error.
fn greet_as(uid: u32, path: &Path) -> i32 {
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (to, from) in addr.sun_path.iter_mut().zip(path.to_str().unwrap().bytes()) {
        *to = from as libc::c_char;
    }
    let hello = format!("{HELLO}\n");
    let timeout = libc::timeval {
        tv_sec: 10,
        tv_usec: 0,
    };
    // SAFETY: the child makes only async-signal-safe system calls on data
    // prepared before the fork, then _exit()s; the parent waits for it.
    unsafe {
        let pid = libc::fork();
        assert!(pid >= 0, "fork");
        if pid == 0 {
            let mut buf = [0u8; 512];
            let code = if libc::setgid(uid) != 0 || libc::setuid(uid) != 0 {
                101
            } else {
                let s = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0);
                let size = std::mem::size_of::<libc::timeval>() as libc::socklen_t;
                let optval = (&timeout as *const libc::timeval).cast();
                libc::setsockopt(s, libc::SOL_SOCKET, libc::SO_RCVTIMEO, optval, size);
                let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
                if libc::connect(s, (&addr as *const libc::sockaddr_un).cast(), len) != 0 {
                    102
                } else {
                    libc::send(s, hello.as_ptr().cast(), hello.len(), libc::MSG_NOSIGNAL);
                    match libc::recv(s, buf.as_mut_ptr().cast(), buf.len(), 0) {
                        n if n > 0 => 1,
                        0 => 0,
                        _ => 2,
                    }
                }
            };
            libc::_exit(code);
        }
        let mut status = 0;
        assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
        match libc::WEXITSTATUS(status) {
            0 => 0,
            1 => 1,
            2 => -1,
            other => panic!("the child as user {uid} could not greet: code {other}"),
        }
    }
}

/// One echo through the balancer at `addr`.
fn echoes(addr: SocketAddr) -> bool {
    let data = std::sync::Arc::new(b"still here".to_vec());
    crate::common::connect(addr)
        .and_then(|s| crate::common::echo_through(s, data))
        .is_ok_and(|got| got == b"still here")
}

#[test]
fn a_hostile_new_process_leaves_the_running_one_serving() {
    let echo = TestBackend::echo();
    let scratch = Scratch::new("upgrade-fake-new");
    let (mut old, path) = old_one(&scratch, echo.addr());
    let addr = old.addr;
    assert!(echoes(addr));
    let baseline = old.open_fds();

    // A wrong greeting: "NO", and it serves on.
    let c = dial(&path);
    wire::send(&c, "RODIZIO-UPGRADE 999", None).unwrap();
    let (no, fd) = wire::recv(&c).unwrap();
    assert!(no.starts_with("NO ") && fd.is_none(), "{no}");
    old.next_log("no hand-over");
    drop(c);

    // The right greeting with a descriptor attached: refused.
    let c = dial(&path);
    let file = fs::File::open("/dev/null").unwrap();
    wire::send(&c, HELLO, Some(file.as_raw_fd())).unwrap();
    assert!(wire::recv(&c).unwrap().0.starts_with("NO "));
    old.next_log("no hand-over");
    drop(c);

    // Silence: the running one gives up after its wait and hears the
    // next; it serves clients all along.
    let silent = dial(&path);
    assert!(echoes(addr));
    old.next_log("no answer in time");
    drop(silent);

    // 200 connections one after another, each closed at once (more wait
    // in the socket's backlog of 16 while it turns to each).
    for _ in 0..200 {
        drop(dial(&path));
    }
    assert!(echoes(addr));

    // A peer of another user (the socket opened to it on purpose): a
    // child process of the test as user 65534 greets it and reads what
    // comes back.
    fs::set_permissions(&path, fs::Permissions::from_mode(0o666)).unwrap();
    let got = greet_as(65534, &path);
    old.next_log("asked by user 65534");
    assert!(got <= 0, "{got} bytes handed to a stranger");

    assert!(old.alive());
    assert!(echoes(addr));
    assert!(
        wait_for(Duration::from_secs(10), || old.open_fds() <= baseline),
        "descriptors: {} now, {baseline} before",
        old.open_fds()
    );

    // And a real upgrade still works.
    let mut new = Child::start(&mut child::command(&[
        "--allow-root",
        "-l",
        &addr.to_string(),
        "-b",
        &echo.addr().to_string(),
        "--health-check",
        "off",
        "--upgrade-socket",
        path.to_str().unwrap(),
    ]));
    assert!(
        old.wait_exit(WAIT).is_some_and(|s| s.success()),
        "{}",
        old.output()
    );
    assert!(echoes(addr));
    new.stop();
}

/// Asked for a hand-over while out of descriptors (64, all taken by
/// clients): the running one may not take the request or copy its
/// sockets. Within the bound the new process either takes over whole (a
/// descriptor came free) or exits saying why while the running one serves
/// on; the running one says so in at most a line a second, and once its
/// clients leave a real upgrade works.
#[test]
fn a_hand_over_asked_while_out_of_descriptors_leaves_the_running_one_serving() {
    let echo = TestBackend::echo();
    let scratch = Scratch::new("upgrade-emfile");
    let (mut old, path) = old_limited(&scratch, echo.addr(), Some(64));
    let addr = old.addr;
    let clients: Vec<std::net::TcpStream> = (0..40)
        .map(|_| {
            let mut s = crate::common::connect(addr).unwrap();
            std::io::Write::write_all(&mut s, b"x").unwrap();
            s
        })
        .collect();
    assert!(
        wait_for(WAIT, || old.log().contains("Too many open files")),
        "never out of descriptors: {}",
        old.log()
    );
    // The new process, as any operator would start it.
    let args = [
        "--allow-root".to_string(),
        "-l".into(),
        addr.to_string(),
        "-b".into(),
        echo.addr().to_string(),
        "--health-check".into(),
        "off".into(),
        "--upgrade-socket".into(),
        path.to_str().unwrap().into(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let started = Instant::now();
    let mut first = Child::spawn(&mut child::command(&args));
    let decided = wait_for(WAIT, || {
        !first.alive() || first.stdout.text().contains("Load balancer listening")
    });
    let took = started.elapsed();
    assert!(
        decided,
        "neither started nor refused in {took:?}: {}",
        first.log()
    );
    let lines = old.log().matches("upgrade_socket").count();
    assert!(
        lines <= took.as_secs() as usize + 2,
        "{lines} upgrade lines in {took:?}: {}",
        old.log()
    );
    if first.alive() {
        // It found a descriptor free after all: a whole upgrade, the old
        // one gone.
        assert!(
            old.wait_exit(WAIT).is_some_and(|s| s.success()),
            "{}",
            old.output()
        );
        drop(clients);
        assert!(echoes(addr));
        first.stop();
        return;
    }
    // Refused: a line that says why, and the running one serves on.
    assert!(!first.wait_exit(WAIT).unwrap().success());
    // (Its log read to the end: the line may follow the exit.)
    assert!(
        wait_for(WAIT, || first.log().contains("upgrade_socket")),
        "{}",
        first.log()
    );
    assert!(old.alive(), "{}", old.log());
    drop(clients);
    assert!(echoes(addr));
    let mut new = Child::start(&mut child::command(&args));
    assert!(
        old.wait_exit(WAIT).is_some_and(|s| s.success()),
        "{}",
        old.output()
    );
    assert!(echoes(addr));
    new.stop();
}
