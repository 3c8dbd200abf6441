//! The `rodizio` binary end to end: the article's prompt through piped
//! standard input, exit codes, one-line errors, signals, running out of
//! file descriptors, the `demo` and `backend` subcommands, and the log.

mod child;
mod common;

use std::io::{Read, Write};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use child::Child;
use common::{connect, http_get, wait_for, TestBackend};

const WAIT: Duration = Duration::from_secs(10);

/// `rodizio ARGS`, logging warnings and errors only; allowed to serve as
/// root (the tests run as root on CI), unless ARGS runs `backend`, which
/// takes no balancer flag.
fn command(args: &[&str]) -> Command {
    let root: &[&str] = if args.first() == Some(&"backend") {
        &[]
    } else {
        &["--allow-root"]
    };
    let mut command = child::command(&[root, args].concat());
    command.env("RUST_LOG", "warn");
    command
}

/// `rodizio ARGS` with `input` on its standard input, then end of input.
fn start(args: &[&str], input: &[u8]) -> Child {
    Child::spawn_fed(&mut command(args), input.to_vec())
}

/// Waits until standard output contains `needle`; returns all of it so far.
fn wait_stdout(rodizio: &Child, needle: &str) -> String {
    wait_stdout_until(rodizio, needle, |text| text.contains(needle))
}

/// Waits for the whole `Load balancer listening on port N (ADDR)` line,
/// checks that ADDR has port N, and returns N and the output so far.
fn wait_listening(rodizio: &Child) -> (u16, String) {
    const LINE: &str = child::LISTENING;
    let out = wait_stdout_until(rodizio, LINE, |text| {
        text.split(LINE)
            .nth(1)
            .is_some_and(|rest| rest.contains('\n'))
    });
    // `N (ADDR)`: the article's words, then the address.
    let rest = out.split(LINE).nth(1).unwrap().lines().next().unwrap();
    let (port, addr) = rest.split_once(' ').expect("the port, then the address");
    let port: u16 = port.parse().expect("a port number");
    let addr: std::net::SocketAddr = addr
        .trim_start_matches('(')
        .trim_end_matches(')')
        .parse()
        .expect("the address in brackets");
    assert_eq!(addr.port(), port, "{rest}");
    (port, out)
}

/// Waits until `done` holds for standard output; returns all of it.
fn wait_stdout_until(rodizio: &Child, needle: &str, done: impl Fn(&str) -> bool) -> String {
    let held = wait_for(WAIT, || done(&rodizio.stdout.text()));
    let text = rodizio.stdout.text();
    assert!(held, "no {needle:?} in time; got {text:?}");
    text
}

/// Waits until standard error contains `needle`; returns all of it so far.
fn wait_stderr(rodizio: &Child, needle: &str) -> String {
    let held = wait_for(WAIT, || rodizio.log().contains(needle));
    let text = rodizio.log();
    assert!(held, "no {needle:?} on stderr in time; got {text:?}");
    text
}

/// Waits for the exit (bounded) and returns the status and standard error.
fn wait_exit(mut rodizio: Child) -> (ExitStatus, String) {
    let status = rodizio.wait_exit(WAIT).expect("rodizio did not exit");
    rodizio.stderr.wait_end(WAIT);
    (status, rodizio.log())
}

/// The article's session: invalid answers are re-asked with
/// `Invalid input.`, then the balancer listens and proxies to the backend
/// that was typed in.
#[test]
fn prompt_end_to_end_with_piped_stdin() {
    let backend = TestBackend::http(7);
    let port = backend.addr().port().to_string();
    let input = format!("abc\n0\n11\n\n1\nbad/host\n127.0.0.1\n0\n70000\nhttp\n{port}\n");
    let rodizio = start(&["-l", "127.0.0.1:0"], input.as_bytes());
    let (port, out) = wait_listening(&rodizio);
    let expected_prompts = "Enter the number of servers (1 <= number_of_servers <= 10): \
                            Invalid input.\n"
        .repeat(4)
        + "Enter the number of servers (1 <= number_of_servers <= 10): "
        + "Enter the address of the 1 server: Invalid input.\n"
        + "Enter the address of the 1 server: "
        + &"Enter the port of the 1 server: Invalid input.\n".repeat(3)
        + "Enter the port of the 1 server: ";
    // Each `Invalid input.` is followed by its reason on the same line.
    let mut without_reasons = String::new();
    for line in out.split_inclusive('\n') {
        match line.find("Invalid input. ") {
            Some(at) => {
                assert!(line.len() > at + "Invalid input. ".len() + 1, "{line}");
                without_reasons.push_str(&line[..at]);
                without_reasons.push_str("Invalid input.\n");
            }
            None => without_reasons.push_str(line),
        }
    }
    assert!(
        without_reasons.starts_with(&expected_prompts),
        "unexpected prompt output:\n{out}"
    );
    assert_eq!(out.matches("Invalid input.").count(), 8);
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let response = http_get(addr, "/").expect("a request through the binary");
    assert_eq!(response.body, "backend 7\n");
    assert_eq!(backend.accepted(), 1);
}

/// Standard input closed in the middle of the prompt: exit code 2 and one
/// line on standard error, not a loop.
#[test]
fn end_of_input_during_the_prompt_exits_2() {
    for input in ["", "2\n127.0.0.1\n", "abc\n"] {
        let rodizio = start(&["-l", "127.0.0.1:0"], input.as_bytes());
        let (status, err) = wait_exit(rodizio);
        assert_eq!(status.code(), Some(2), "input {input:?}, stderr {err:?}");
        assert_eq!(err.lines().count(), 1, "input {input:?}, stderr {err:?}");
    }
}

/// Bad flags exit with code 2 and exactly one line saying what is wrong.
#[test]
fn bad_flags_exit_2_with_one_line() {
    for args in [
        &["--workers", "many"][..],
        &["-b", "nope"],
        &["--connect-timeout", "3 parsecs"],
        &["--no-such-flag"],
    ] {
        let rodizio = start(args, b"");
        let (status, err) = wait_exit(rodizio);
        assert_eq!(status.code(), Some(2), "{args:?}: {err:?}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err:?}");
        assert!(err.starts_with("rodizio: "), "{args:?}: {err:?}");
    }
}

/// `--help` and `--version` print and exit 0.
#[test]
fn help_and_version_exit_0() {
    let rodizio = start(&["--help"], b"");
    let out = wait_stdout(&rodizio, "--connect-timeout");
    assert!(out.contains("Usage:"), "{out}");
    assert_eq!(wait_exit(rodizio).0.code(), Some(0));
    let rodizio = start(&["--version"], b"");
    wait_stdout(&rodizio, env!("CARGO_PKG_VERSION"));
    assert_eq!(wait_exit(rodizio).0.code(), Some(0));
}

/// SIGTERM to a running balancer: it drains and exits 0.
#[test]
fn sigterm_exits_0() {
    let backend = TestBackend::http(0);
    let backend_flag = backend.addr().to_string();
    let rodizio = start(&["-l", "127.0.0.1:0", "-b", &backend_flag], b"");
    let (port, _) = wait_listening(&rodizio);
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    assert_eq!(http_get(addr, "/").unwrap().body, "backend 0\n");
    let pid = rodizio.pid() as libc::pid_t;
    // SAFETY: sending a signal to our own child, which is still running
    // (it has not been waited for).
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let (status, err) = wait_exit(rodizio);
    assert_eq!(status.code(), Some(0), "stderr: {err}");
}

/// Out of file descriptors (the process is started with a limit of 24 it
/// cannot raise, and 40 clients hold connections): accept and connect
/// errors are logged, never fatal, and once the clients leave the balancer
/// serves again.
#[test]
fn running_out_of_descriptors_is_not_fatal() {
    let backend = TestBackend::echo();
    let backend_flag = backend.addr().to_string();
    let mut command = command(&["-l", "127.0.0.1:0", "-b", &backend_flag]);
    common::limit_in_child(&mut command, libc::RLIMIT_NOFILE, 24);
    let mut rodizio = Child::spawn(&mut command);
    let (port, _) = wait_listening(&rodizio);
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut held = Vec::new();
    for _ in 0..40 {
        let mut s = connect(addr).unwrap();
        s.write_all(b"x").unwrap();
        held.push(s);
    }
    wait_stderr(&rodizio, "Too many open files");
    drop(held);
    // Served again once the descriptors are free (the accept loop retries
    // after a short back-off).
    let served = wait_for(WAIT, || {
        let Ok(mut s) = connect(addr) else {
            return false;
        };
        let mut b = [0u8; 4];
        s.write_all(b"ping").is_ok() && s.read_exact(&mut b).is_ok() && &b == b"ping"
    });
    assert!(served, "not serving after the descriptors were freed");
    assert!(rodizio.alive(), "rodizio exited");
}

/// The first SIGTERM drains: the connection in flight keeps working and
/// new clients are refused; the second SIGTERM exits at once (status 143,
/// as a shell reports it). At start the open-files limit was raised to its
/// hard limit.
#[test]
fn first_sigterm_drains_second_exits_at_once() {
    let backend = TestBackend::echo();
    let backend_flag = backend.addr().to_string();
    let mut rodizio = start(&["-l", "127.0.0.1:0", "-b", &backend_flag], b"");
    let (port, _) = wait_listening(&rodizio);
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let pid = rodizio.pid() as libc::pid_t;

    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let open_files: Vec<&str> = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(
        open_files[3], open_files[4],
        "soft limit not raised: {limits}"
    );

    let mut held = connect(addr).unwrap();
    let mut b = [0u8];
    held.write_all(b"a").unwrap();
    held.read_exact(&mut b).unwrap();
    // SAFETY: a signal to our own child, not yet waited for.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    assert!(
        wait_for(WAIT, || std::net::TcpStream::connect(addr).is_err()),
        "still accepting after SIGTERM"
    );
    held.write_all(b"b").unwrap();
    held.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"b", "the connection in flight was cut by the drain");
    assert!(rodizio.alive());
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let (status, err) = wait_exit(rodizio);
    assert_eq!(status.code(), Some(143), "stderr: {err}");
}

/// `rodizio -l 127.0.0.1:0 demo --first-port 0`: three demo backends and
/// the balancer; three requests are answered by three different backends.
#[test]
fn demo_subcommand_round_robins_over_three_backends() {
    let rodizio = start(&["-l", "127.0.0.1:0", "demo", "--first-port", "0"], b"");
    let (port, out) = wait_listening(&rodizio);
    assert_eq!(out.matches("Demo backend ").count(), 3, "{out}");
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut bodies: Vec<String> = (0..3).map(|_| http_get(addr, "/").unwrap().body).collect();
    assert!(bodies
        .iter()
        .all(|b| b.starts_with("Handled by server 127.0.0.1:")));
    bodies.sort();
    bodies.dedup();
    assert_eq!(bodies.len(), 3, "{bodies:?}");
    assert_eq!(http_get(addr, "/health").unwrap().body, "OK\n");
}

/// `rodizio backend --listen 127.0.0.1:0 --name B`: one demo backend,
/// answering with its name and serving `/health`.
#[test]
fn backend_subcommand_serves_alone() {
    let rodizio = start(&["backend", "--listen", "127.0.0.1:0", "--name", "B"], b"");
    let out = wait_stdout_until(&rodizio, "Demo backend listening on ", |t| {
        t.split("Demo backend listening on ")
            .nth(1)
            .is_some_and(|rest| rest.contains('\n'))
    });
    let addr = out
        .split("Demo backend listening on ")
        .nth(1)
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let r = http_get(addr, "/").unwrap();
    assert_eq!(
        (r.status.as_str(), r.body.as_str()),
        ("HTTP/1.1 200 OK", "Handled by server B\n")
    );
    assert_eq!(http_get(addr, "/health").unwrap().body, "OK\n");
}

/// At `RUST_LOG=debug`, each connection ends with one line naming the
/// client, the backend and the bytes each way (the C printed
/// `### REQUEST FINISHED ###`).
#[test]
fn debug_log_has_one_line_per_connection() {
    let backend = TestBackend::echo();
    let backend_flag = backend.addr().to_string();
    let mut command = command(&["-l", "127.0.0.1:0", "-b", &backend_flag]);
    command.env("RUST_LOG", "debug");
    let rodizio = Child::spawn(&mut command);
    let (port, _) = wait_listening(&rodizio);
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let back =
        common::echo_through(connect(addr).unwrap(), std::sync::Arc::new(vec![7; 1234])).unwrap();
    assert_eq!(back.len(), 1234);
    let err = wait_stderr(&rodizio, "connection finished");
    let line = err
        .lines()
        .find(|l| l.contains("connection finished"))
        .unwrap();
    assert!(line.contains(&backend_flag), "{line}");
    assert!(line.contains("1234"), "{line}");
}
