//! Start-up and exit of the binary: one-line errors for what cannot work
//! (a stack the system refuses, sub-millisecond durations, a demo port too
//! high), a log filter that would silence everything, a closed standard
//! output, and exit codes that are the same every time.

mod child;
mod common;

use std::io::{Read, Write};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use child::{Child, BIN};
use common::{connect, wait_for, TestBackend};

const WAIT: Duration = Duration::from_secs(10);

/// Runs `rodizio ARGS` to its end (it must end by itself), stdin closed,
/// `RUST_LOG` as the test's; a balancer is allowed to serve as root, so
/// that the error a test looks for is not the refusal to (the tests run as
/// root on CI).
fn run(args: &[&str]) -> Output {
    let subcommand = matches!(args.first(), Some(&("demo" | "backend")));
    let root: &[&str] = if subcommand { &[] } else { &["--allow-root"] };
    let mut command = child::command(&[root, args].concat());
    inherit_log_filter(&mut command);
    child::run_within(&mut command, WAIT).output()
}

/// `RUST_LOG` as this process has it (or none), not [`child::command`]'s.
fn inherit_log_filter(command: &mut Command) {
    match std::env::var_os("RUST_LOG") {
        Some(filter) => command.env("RUST_LOG", filter),
        None => command.env_remove("RUST_LOG"),
    };
}

/// Asserts a usage error: exit 2, one line on stderr containing `wanted`.
fn assert_usage_error(out: &Output, wanted: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(wanted), "{err}");
}

/// `rodizio -l 127.0.0.1:0 ARGS`, standard output closed at once (as
/// `| head -0` would); returns it once it listens, with the address its own
/// socket has (read from `/proc`: the listening line went nowhere, and a
/// port chosen beforehand could be taken by another test's listener).
fn start_on_free_port(args: &[&str], env: &[(&str, &str)]) -> (Child, std::net::SocketAddr) {
    let mut command = Command::new(BIN);
    command
        .args(["--allow-root", "-l", "127.0.0.1:0"])
        .args(args);
    for (k, v) in env {
        command.env(k, v);
    }
    let running = Child::spawn_stdout_closed(&mut command);
    let mut addr = None;
    assert!(
        wait_for(WAIT, || {
            addr = child::listening_sockets(running.pid()).first().copied();
            addr.is_some()
        }),
        "not listening; stderr: {}",
        running.log()
    );
    (running, addr.unwrap())
}

/// A worker stack the system cannot give (900 MiB under a 600 MiB address
/// space limit) is refused at start-up in one line, instead of a balancer
/// that accepts clients no worker can serve; over 1 GiB is refused too.
#[test]
fn a_thread_stack_the_system_refuses_is_a_start_up_error() {
    let mut command = Command::new(BIN);
    command
        .args([
            "--allow-root",
            "-b",
            "127.0.0.1:1",
            "-l",
            "127.0.0.1:0",
            "--thread-stack",
            "900m",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    common::limit_in_child(&mut command, libc::RLIMIT_AS, 600 << 20);
    let out = child::run_within(&mut command, WAIT).output();
    assert_usage_error(&out, "--thread-stack cannot start a worker thread");
    for big in ["65536m", "18446744073709551615"] {
        let out = run(&[
            "-b",
            "127.0.0.1:1",
            "-l",
            "127.0.0.1:0",
            "--thread-stack",
            big,
        ]);
        assert_usage_error(&out, "--thread-stack must be at most");
    }
}

/// Every duration setting refuses less than a millisecond.
#[test]
fn durations_under_a_millisecond_exit_2() {
    for flag in [
        "--connect-timeout",
        "--idle-timeout",
        "--queue-timeout",
        "--health-interval",
    ] {
        let out = run(&["-b", "127.0.0.1:1", "-l", "127.0.0.1:0", flag, "0.5ms"]);
        assert_usage_error(&out, &format!("{flag} must be at least 1ms"));
    }
}

/// `demo --first-port 65534` says so before starting any backend.
#[test]
fn demo_port_too_high_is_checked_first() {
    let out = run(&["-l", "127.0.0.1:0", "demo", "--first-port", "65534"]);
    assert_usage_error(&out, "--first-port 65534 is too high for 3 backends");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// A backend that does not resolve is named with its port.
#[test]
fn an_unresolvable_backend_keeps_its_port_in_the_message() {
    let out = run(&["-l", "127.0.0.1:0", "-b", "nosuchhost.invalid:1"]);
    assert_usage_error(&out, "'nosuchhost.invalid:1'");
}

/// `RUST_LOG=garbage` would silence every line: a warning, then `info`.
/// Standard output closed: nothing panics, and it serves.
#[test]
fn a_bad_log_filter_falls_back_to_info_and_a_closed_stdout_is_harmless() {
    let backend = TestBackend::echo();
    let (mut running, addr) = start_on_free_port(
        &["-b", &backend.addr().to_string()],
        &[("RUST_LOG", "garbage")],
    );
    let mut s = connect(addr).unwrap();
    s.write_all(b"x").unwrap();
    let mut b = [0u8];
    s.read_exact(&mut b).unwrap();
    drop(s);
    running.signal(libc::SIGTERM);
    assert_eq!(running.exited().code(), Some(0));
    let err = running.log();
    assert!(err.contains("RUST_LOG=\"garbage\""), "{err}");
    assert!(err.contains("INFO"), "no info line: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// `--help` and `--version` into a closed pipe exit 0 without a panic.
#[test]
fn help_into_a_closed_pipe_does_not_panic() {
    for flag in ["--help", "--version"] {
        let mut command = Command::new(BIN);
        command.arg(flag);
        let mut running = Child::spawn_stdout_closed(&mut command);
        assert_eq!(running.exited().code(), Some(0), "{}", running.log());
        assert!(!running.log().contains("panicked"), "{}", running.log());
    }
}

/// A second SIGTERM that comes as the drain ends on its own (the
/// connection it waits for is closed just before the signal) ends the
/// process with 0 or 143 and nothing else: never killed by the signal,
/// never hung, never a panic. Which of the two depends on whether the
/// signal beat the moment `main` settles its exit code (a few
/// microseconds before the process is gone), and no outside observer can
/// order the two, so both are accepted; a second signal that surely came
/// during the drain gives 143 every time (`tests/binary.rs`).
#[test]
fn a_second_sigterm_as_the_drain_ends_exits_0_or_143() {
    let backend = TestBackend::echo();
    for _ in 0..10 {
        let (mut running, addr) = start_on_free_port(&["-b", &backend.addr().to_string()], &[]);
        let mut held = connect(addr).unwrap();
        held.write_all(b"x").unwrap();
        let mut b = [0u8];
        held.read_exact(&mut b).unwrap();
        running.signal(libc::SIGTERM);
        assert!(wait_for(WAIT, || running.log().contains("draining")));
        drop(held);
        running.signal(libc::SIGTERM);
        let code = running.exited().code();
        assert!(
            matches!(code, Some(0) | Some(143)),
            "exit {code:?}: {}",
            running.log()
        );
        assert!(!running.log().contains("panicked"), "{}", running.log());
    }
}

/// A drain that had to cut a connection at the drain timeout exits 3; a
/// clean one exits 0.
#[test]
fn a_drain_that_cut_connections_exits_3() {
    let backend = TestBackend::echo();
    let (mut running, addr) = start_on_free_port(
        &[
            "-b",
            &backend.addr().to_string(),
            "--drain-timeout",
            "200ms",
        ],
        &[],
    );
    let mut held = connect(addr).unwrap();
    held.write_all(b"x").unwrap();
    let mut b = [0u8];
    held.read_exact(&mut b).unwrap();
    running.signal(libc::SIGTERM);
    assert_eq!(running.exited().code(), Some(3), "{}", running.log());
    let (mut clean, _) = start_on_free_port(&["-b", &backend.addr().to_string()], &[]);
    clean.signal(libc::SIGTERM);
    assert_eq!(clean.exited().code(), Some(0), "{}", clean.log());
}

/// A SIGTERM sent the moment the port listens (seen in `/proc`, polled
/// without a pause) drains and exits 0: the signals are taken by their
/// thread before the port is opened, never left to their default, which
/// would kill the process (no exit code).
#[test]
fn a_sigterm_as_soon_as_the_port_listens_exits_0() {
    let backend = TestBackend::echo();
    for round in 0..20 {
        let mut command = Command::new(BIN);
        command
            .args(["--allow-root", "-l", "127.0.0.1:0"])
            .args(["-b", &backend.addr().to_string()]);
        let mut running = Child::spawn(&mut command);
        let pid = running.pid();
        let deadline = std::time::Instant::now() + WAIT;
        while child::listening_sockets(pid).is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "round {round}: not listening"
            );
            std::thread::yield_now();
        }
        running.signal(libc::SIGTERM);
        let status = running.exited();
        assert_eq!(
            status.code(),
            Some(0),
            "round {round}: {status:?}: {}",
            running.log()
        );
    }
}

/// The backend role does not claim to drain: it stops.
#[test]
fn the_backend_role_stops_without_claiming_a_drain() {
    let mut command = Command::new(BIN);
    command.args(["backend", "--listen", "127.0.0.1:0"]);
    let mut running = Child::spawn(&mut command);
    let pid = running.pid();
    assert!(wait_for(WAIT, || !child::listening_sockets(pid).is_empty()));
    running.signal(libc::SIGTERM);
    let status = running.exited();
    assert_eq!(status.code(), Some(0), "{status:?}: {}", running.log());
    let err = running.log();
    assert!(!err.contains("draining"), "{err}");
    assert!(err.contains("stopping"), "{err}");
}

/// `-b A -b A` (or `localhost` beside `127.0.0.1`) is refused in one line
/// naming both spellings and saying that `weight` gives a larger share.
#[test]
fn a_backend_given_twice_is_refused() {
    for second in ["127.0.0.1:29001", "localhost:29001"] {
        let out = run(&["-l", "127.0.0.1:0", "-b", "127.0.0.1:29001", "-b", second]);
        assert_usage_error(&out, "--backend");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("'127.0.0.1:29001'"), "{err}");
        assert!(err.contains(&format!("'{second}'")), "{err}");
        assert!(err.contains("weight="), "{err}");
    }
}

/// `--access-log-file` alone would be ignored: refused, as
/// `--rate-limit-reply` without `--rate-limit` is.
#[test]
fn an_access_log_file_without_an_access_log_exits_2() {
    let out = run(&[
        "-l",
        "127.0.0.1:0",
        "-b",
        "127.0.0.1:1",
        "--access-log-file",
        "/tmp/rodizio-never.log",
    ]);
    assert_usage_error(&out, "--access-log-file needs --access-log");
}

/// The admin address that cannot be bound is called the admin address.
#[test]
fn an_admin_bind_failure_names_the_admin_address() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let admin = taken.local_addr().unwrap().to_string();
    let out = run(&["-l", "127.0.0.1:0", "-b", "127.0.0.1:1", "--admin", &admin]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!("the admin API cannot listen on {admin} (--admin)")),
        "{err}"
    );
}

/// `rodizio demo -l ADDR` says the balancer flags go before `demo`.
#[test]
fn balancer_flags_after_demo_get_a_hint() {
    let out = run(&["demo", "-l", "127.0.0.1:0"]);
    assert_usage_error(&out, "before 'demo'");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("rodizio -l 127.0.0.1:0 demo"), "{err}");
}

/// With the access log on standard output, standard output is the access
/// log alone: the listening line (with its address) goes to stderr.
#[test]
fn an_access_log_on_stdout_keeps_stdout_pure() {
    let backend = TestBackend::echo();
    let mut command = Command::new(BIN);
    command.args(["--allow-root", "-l", "127.0.0.1:0"]).args([
        "-b",
        &backend.addr().to_string(),
        "--access-log",
        "json",
    ]);
    let mut running = Child::spawn(&mut command);
    let stdout = running.stdout.clone();
    assert!(
        wait_for(WAIT, || running
            .log()
            .contains("Load balancer listening on port")),
        "{}",
        running.log()
    );
    let addr = child::listening_addr(&running.log()).unwrap();
    assert_eq!(
        child::listening_sockets(running.pid()),
        [addr],
        "{}",
        running.log()
    );
    let mut client = connect(addr).unwrap();
    client.write_all(b"ping").unwrap();
    let mut got = [0u8; 4];
    client.read_exact(&mut got).unwrap();
    drop(client);
    assert!(
        wait_for(WAIT, || stdout.text().contains('\n')),
        "no access log line"
    );
    running.signal(libc::SIGTERM);
    running.exited();
    assert!(stdout.wait_end(WAIT));
    let text = stdout.text();
    for line in text.lines() {
        assert!(
            line.starts_with('{') && line.ends_with('}'),
            "not JSON: {line:?} in {text:?}"
        );
    }
}

/// The policy of each thread of `pid`, read from `/proc/PID/task/*/sched`.
fn thread_policies(pid: u32) -> Vec<(String, u32)> {
    let mut all = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let path = task.unwrap().path();
        let (Ok(sched), Ok(name)) = (
            std::fs::read_to_string(path.join("sched")),
            std::fs::read_to_string(path.join("comm")),
        ) else {
            continue; // a thread that ended while the list was read
        };
        let policy = sched
            .lines()
            .find(|l| l.starts_with("policy"))
            .and_then(|l| l.split(':').nth(1))
            .and_then(|v| v.trim().parse().ok())
            .unwrap();
        all.push((name.trim().to_string(), policy));
    }
    all
}

/// `--sched-policy batch` puts every thread under SCHED_BATCH (3): those
/// made at start-up and the workers made later for clients; without it
/// every thread stays SCHED_OTHER (0). A policy it does not know is one
/// line and exit 2.
#[test]
fn sched_policy_batch_reaches_every_thread() {
    let backend = TestBackend::echo();
    let b = backend.addr().to_string();
    for (flags, want) in [(&["--sched-policy", "batch"][..], 3), (&[][..], 0)] {
        let mut args = vec!["-b", &b];
        args.extend_from_slice(flags);
        let (running, addr) = start_on_free_port(&args, &[]);
        // Clients held open at once, so that workers are made for them.
        let mut held = Vec::new();
        for _ in 0..4 {
            let mut c = connect(addr).unwrap();
            c.write_all(b"x").unwrap();
            let mut one = [0u8];
            c.read_exact(&mut one).unwrap();
            held.push(c);
        }
        let threads = thread_policies(running.pid());
        let workers = threads
            .iter()
            .filter(|(n, _)| n.starts_with("rodizio-worker"))
            .count();
        assert!(workers >= 4, "{threads:?}");
        assert!(
            threads.iter().all(|&(_, p)| p == want),
            "{flags:?}: {threads:?}"
        );
    }
    let out = run(&["-b", &b, "--sched-policy", "fifo"]);
    assert_usage_error(&out, "normal or batch");
}
