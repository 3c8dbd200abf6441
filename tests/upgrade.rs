//! The upgrade through `upgrade_socket` with the real binary: under a
//! steady load, a new process takes the running one's listening sockets,
//! the old one drains and exits 0, and no request fails, twice in a row
//! and with `net.ipv4.tcp_migrate_req` at 0 (no kernel setting needed). A
//! new process that dies half-way, or cannot start, leaves the old one
//! serving, its descriptors back where they were, and the next upgrade
//! still works.

mod child;
mod common;
mod peers;

use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use child::{Child, Scratch};
use common::{connect, get_backend_1, wait_for, Load, TestBackend};
use peers::{free_port, loopback};
use rodizio::upgrade::{wire, HELLO};
use socket2::{Domain, SockAddr, Socket, Type};

const MIGRATE: &str = "/proc/sys/net/ipv4/tcp_migrate_req";

/// Sets `net.ipv4.tcp_migrate_req` to 0 (the kernel's default) and puts
/// the old value back when dropped: the hand-over must not need it.
struct NoMigrate(String);

impl NoMigrate {
    fn set() -> NoMigrate {
        let old = fs::read_to_string(MIGRATE).unwrap_or_else(|e| panic!("{MIGRATE}: {e}"));
        fs::write(MIGRATE, "0").unwrap_or_else(|e| panic!("setting {MIGRATE} to 0: {e}"));
        NoMigrate(old.trim().to_string())
    }
}

impl Drop for NoMigrate {
    fn drop(&mut self) {
        let _ = fs::write(MIGRATE, &self.0);
    }
}

/// A rodizio on `port` with `--upgrade-socket PATH`, ready to serve;
/// `extra` adds flags.
fn rodizio(port: u16, backend: SocketAddr, path: &Path, extra: &[&str]) -> Child {
    let (port, backend) = (format!("127.0.0.1:{port}"), backend.to_string());
    let path = path.to_str().unwrap();
    let args = [
        &["--allow-root", "-l", &port, "-b", &backend][..],
        &["--health-check", "off", "--upgrade-socket", path],
        extra,
    ]
    .concat();
    Child::start(&mut child::command(&args))
}

/// Waits for `old` to exit after a hand-over; fails with its log if it
/// does not, or not with 0.
fn exits_cleanly(old: &mut Child) {
    let status = old
        .wait_exit(Duration::from_secs(15))
        .unwrap_or_else(|| panic!("the old process did not exit:\n{}", old.output()));
    assert!(status.success(), "old process: {status}\n{}", old.output());
    assert!(
        old.log()
            .contains("a new rodizio took the listening sockets"),
        "{}",
        old.log()
    );
}

/// Under a steady load, a second process takes the sockets, then a third
/// takes them from the second: both old ones exit 0, the upgrade socket
/// stays at its path, and not one request fails.
#[test]
fn two_upgrades_in_a_row_under_load_fail_no_request() {
    let _no_migrate = NoMigrate::set();
    let web = TestBackend::http(1);
    let scratch = Scratch::new("upgrade");
    let path = scratch.path("upgrade.sock");
    let port = free_port();
    let mut first = rodizio(port, web.addr(), &path, &[]);
    let load = Load::start(loopback(port));
    load.more(200);
    let mut second = rodizio(port, web.addr(), &path, &[]);
    exits_cleanly(&mut first);
    assert!(
        second.log().contains("took 1 listening socket from"),
        "{}",
        second.log()
    );
    load.more(300);
    let mut third = rodizio(port, web.addr(), &path, &[]);
    exits_cleanly(&mut second);
    load.more(300);
    let total = load.none_failed(&third.output());
    assert!(path.exists(), "the upgrade socket's path went away");
    eprintln!("{total} requests over two upgrades, none failed");
    // Stopped without a hand-over, the last one removes its socket.
    third.signal(libc::SIGTERM);
    assert!(third
        .wait_exit(Duration::from_secs(15))
        .is_some_and(|s| s.success()));
    assert!(
        wait_for(Duration::from_secs(5), || !path.exists()),
        "the last process left its upgrade socket behind"
    );
}

/// Takes the sockets as a new process would, then goes away without
/// saying `OK`: what it received.
fn take_and_vanish(path: &Path) -> Vec<String> {
    let socket = Socket::new(Domain::UNIX, Type::SEQPACKET, None).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    socket.connect(&SockAddr::unix(path).unwrap()).unwrap();
    wire::send(&socket, HELLO, None).unwrap();
    let mut lines = Vec::new();
    loop {
        let (line, fd) = wire::recv(&socket).unwrap();
        let end = line == "END";
        lines.push(format!("{line} {}", fd.is_some()));
        if end {
            return lines;
        }
    }
}

/// A new process that takes the sockets and dies before it serves, then
/// one that cannot bind its second address: the old one serves on
/// through both, with a line for each, its descriptors back where they
/// were; then a real upgrade works.
#[test]
fn a_new_process_that_dies_or_fails_leaves_the_old_serving() {
    let web = TestBackend::http(1);
    let scratch = Scratch::new("upgrade-fail");
    let path = scratch.path("upgrade.sock");
    let port = free_port();
    let mut old = rodizio(port, web.addr(), &path, &[]);
    let load = Load::start(loopback(port));
    load.more(100);
    // Taken once it serves: every thread and descriptor of its own made.
    // Between two requests it holds no connection's.
    let mut baseline = usize::MAX;
    wait_for(Duration::from_secs(1), || {
        baseline = baseline.min(old.open_fds());
        false
    });

    let got = take_and_vanish(&path);
    assert_eq!(
        got,
        [
            format!("L 127.0.0.1:{port} true"),
            "U true".into(),
            "END false".into()
        ]
    );
    old.next_log("no hand-over");
    load.more(200);

    // A new process whose second service's address is taken: it exits
    // naming that address, after it took the first from the old one.
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let other = taken.local_addr().unwrap();
    let config = scratch.file(
        "two.json",
        format!(
            r#"{{"health_check": "off", "upgrade_socket": "{}", "services": [
                 {{"name": "a", "listen": "127.0.0.1:{port}", "backends": ["{}"]}},
                 {{"name": "b", "listen": "{other}", "backends": ["{}"]}}]}}"#,
            path.display(),
            web.addr(),
            web.addr()
        ),
    );
    let ended = child::run_within(
        &mut child::command(&["--allow-root", "-c", config.to_str().unwrap()]),
        Duration::from_secs(20),
    );
    let out = ended.output();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("failed to listen on {other}")),
        "{stderr}"
    );
    old.next_log("no hand-over");
    load.more(200);
    assert!(old.alive());
    assert!(
        wait_for(Duration::from_secs(5), || old.open_fds() == baseline),
        "descriptors: {} after, {baseline} before",
        old.open_fds()
    );

    let new = rodizio(port, web.addr(), &path, &[]);
    exits_cleanly(&mut old);
    load.more(200);
    load.none_failed("");
    drop(new);
}

/// An open connection is carried over: opened before the upgrade, it
/// echoes after it through the new process, and the old one exits at
/// once, with nothing left to drain.
#[test]
fn an_open_connection_is_carried_to_the_new_process() {
    let echo = TestBackend::echo();
    let scratch = Scratch::new("upgrade-open");
    let path = scratch.path("upgrade.sock");
    let port = free_port();
    let (old_log, new_log) = (scratch.path("old.log"), scratch.path("new.log"));
    let log = |file: &Path| {
        let file = file.to_str().unwrap().to_string();
        ["--access-log", "text", "--access-log-file"]
            .map(String::from)
            .into_iter()
            .chain([file])
            .collect::<Vec<_>>()
    };
    let (old_flags, new_flags) = (log(&old_log), log(&new_log));
    let old_flags: Vec<&str> = old_flags.iter().map(String::as_str).collect();
    let new_flags: Vec<&str> = new_flags.iter().map(String::as_str).collect();
    let mut old = rodizio(port, echo.addr(), &path, &old_flags);
    let mut open = connect(loopback(port)).unwrap();
    open.write_all(b"before").unwrap();
    let mut buf = [0u8; 6];
    open.read_exact(&mut buf).unwrap();
    let mut new = rodizio(port, echo.addr(), &path, &new_flags);
    exits_cleanly(&mut old);
    assert!(
        old.log()
            .contains("handed 1 open connection to the new rodizio"),
        "{}",
        old.log()
    );
    new.next_log("1 open connection carried over");
    open.write_all(b"after!").unwrap();
    open.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"after!");
    open.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(open.read(&mut buf).unwrap(), 0, "no clean end");
    new.signal(libc::SIGTERM);
    assert!(new.wait_exit(Duration::from_secs(15)).is_some());
    let old_lines = fs::read_to_string(&old_log).unwrap();
    let new_lines = fs::read_to_string(&new_log).unwrap();
    // The old line says where it went; the new one counts every byte,
    // from the connection's first start.
    assert!(
        old_lines.contains("to_backend=6 to_client=6 end=handed_over"),
        "{old_lines}"
    );
    assert!(
        new_lines.contains("to_backend=12 to_client=12 end=client_closed"),
        "{new_lines}"
    );
    // `...THH:MM:SS.mmmZ` in milliseconds of the day.
    let ms = |lines: &str| -> i64 {
        let time = lines.split(' ').next().unwrap().split('T').nth(1).unwrap();
        let t: Vec<f64> = time
            .trim_end_matches('Z')
            .split(':')
            .map(|n| n.parse().unwrap())
            .collect();
        ((t[0] * 3600.0 + t[1] * 60.0 + t[2]) * 1000.0) as i64
    };
    // The age crosses on a coarse clock: a few milliseconds apart.
    let apart = (ms(&old_lines) - ms(&new_lines)).abs();
    assert!(
        apart <= 20,
        "not the same start ({apart} ms):\n{old_lines}{new_lines}"
    );
}

/// A configuration of services `(name, port)`, each in front of `web`,
/// with `path` as its upgrade socket.
fn services(path: &Path, web: SocketAddr, list: &[(&str, u16)]) -> String {
    let one = |(name, port): &(&str, u16)| {
        format!(r#"{{"name": "{name}", "listen": "127.0.0.1:{port}", "backends": ["{web}"]}}"#)
    };
    let list: Vec<String> = list.iter().map(one).collect();
    format!(
        r#"{{"health_check": "off", "upgrade_socket": "{}", "services": [{}]}}"#,
        path.display(),
        list.join(", ")
    )
}

/// What the running process hands over is what it listens on at that
/// time: a service a reload removed is not handed, one a later reload
/// added is (its socket gated like the others, though it may reuse the
/// removed one's descriptor number), and both addresses serve through
/// the new process.
#[test]
fn sockets_added_and_removed_by_reloads_are_handed_as_they_are() {
    let web = TestBackend::http(1);
    let scratch = Scratch::new("upgrade-reload");
    let path = scratch.path("upgrade.sock");
    let (pa, pb, pc) = (free_port(), free_port(), free_port());
    let file = scratch.file(
        "lb.json",
        services(&path, web.addr(), &[("a", pa), ("b", pb)]),
    );
    let config = file.to_str().unwrap();
    let mut old = Child::start(&mut child::command(&["--allow-root", "-c", config]));
    get_backend_1(loopback(pb)).unwrap();
    scratch.file("lb.json", services(&path, web.addr(), &[("a", pa)]));
    old.signal(libc::SIGHUP);
    old.next_log("reload: ");
    scratch.file(
        "lb.json",
        services(&path, web.addr(), &[("a", pa), ("c", pc)]),
    );
    old.signal(libc::SIGHUP);
    old.next_log("reload: ");
    for port in [pa, pc] {
        get_backend_1(loopback(port)).unwrap_or_else(|e| panic!("{port}: {e}\n{}", old.log()));
    }
    let new = Child::start(&mut child::command(&["--allow-root", "-c", config]));
    exits_cleanly(&mut old);
    assert!(
        new.log().contains("took 2 listening sockets"),
        "{}",
        new.log()
    );
    for port in [pa, pc] {
        get_backend_1(loopback(port)).unwrap_or_else(|e| panic!("{port}: {e}\n{}", new.log()));
    }
    assert!(get_backend_1(loopback(pb)).is_err(), "b still answers");
}

/// A real client across three upgrades: `ab` (one connection per request,
/// four at once, for 4 s), each upgrade after 300 more requests, while the sockets pass from process to process:
/// not one failed request.
#[test]
fn ab_across_three_upgrades_fails_nothing() {
    // HTTP/1.0 as ab speaks it: one answer, then the close.
    let web = TestBackend::start(Arc::new(|mut s: std::net::TcpStream| {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte)? == 1 {
            head.push(byte[0]);
        }
        s.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")
    }));
    let scratch = Scratch::new("upgrade-ab");
    let path = scratch.path("upgrade.sock");
    let port = free_port();
    let mut current = rodizio(port, web.addr(), &path, &[]);
    let ab = thread::spawn(move || peers::ab_for(loopback(port), 4, 4));
    for _ in 0..3 {
        // Each upgrade once ab has had 300 more requests served.
        let target = web.accepted() + 300;
        assert!(
            wait_for(Duration::from_secs(10), || web.accepted() >= target),
            "ab stalled"
        );
        let next = rodizio(port, web.addr(), &path, &[]);
        exits_cleanly(&mut current);
        current = next;
    }
    let (complete, failed) = ab.join().unwrap();
    assert!(complete > 100, "ab completed only {complete}");
    assert_eq!(failed, 0, "{failed} of {complete} failed");
    eprintln!("ab: {complete} requests across three upgrades, none failed");
}

/// A real new process killed in the middle of the hand-over: started with
/// no backend, it takes the sockets and then waits at the article's
/// prompt (so it never accepts); killed there with SIGKILL, it never said
/// `OK`. The old one serves throughout (the load meanwhile queued on the
/// same sockets is its), says so in one line, and the next upgrade works.
#[test]
fn a_new_process_killed_at_its_prompt_leaves_the_old_serving() {
    let web = TestBackend::http(1);
    let scratch = Scratch::new("upgrade-killed");
    let path = scratch.path("upgrade.sock");
    let port = free_port();
    let mut old = rodizio(port, web.addr(), &path, &[]);
    let load = Load::start(loopback(port));
    load.more(100);
    let mut prompt = std::process::Command::new(env!("CARGO_BIN_EXE_rodizio"))
        .args(["--allow-root", "-l", &format!("127.0.0.1:{port}")])
        .args([
            "--health-check",
            "off",
            "--upgrade-socket",
            path.to_str().unwrap(),
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = prompt.stdout.take().unwrap();
    let mut asked = Vec::new();
    let mut byte = [0u8; 1];
    let started = Instant::now();
    while !String::from_utf8_lossy(&asked).contains("Enter the number of servers") {
        assert!(started.elapsed() < Duration::from_secs(20), "no prompt");
        assert_eq!(
            out.read(&mut byte).unwrap(),
            1,
            "{}",
            String::from_utf8_lossy(&asked)
        );
        asked.push(byte[0]);
    }
    load.more(200);
    prompt.kill().unwrap();
    prompt.wait().unwrap();
    old.next_log("no hand-over");
    load.more(200);
    let new = rodizio(port, web.addr(), &path, &[]);
    exits_cleanly(&mut old);
    load.more(200);
    load.none_failed("");
    drop(new);
}
