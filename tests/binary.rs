//! The `rodizio` binary end to end: the article's prompt through piped
//! standard input, exit codes, one-line errors, signals, running out of
//! file descriptors, the `demo` and `backend` subcommands, and the log.

mod common;

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};

use common::{connect, http_get, wait_for, TestBackend};

const BIN: &str = env!("CARGO_BIN_EXE_rodizio");
const WAIT: Duration = Duration::from_secs(10);

/// A running `rodizio`, killed on drop if still alive. Its standard output
/// and error are read by threads into channels, so no read can hang a test.
struct Running {
    child: Child,
    stdout: Receiver<Vec<u8>>,
    out: Vec<u8>,
    stderr: Receiver<Vec<u8>>,
    err: Vec<u8>,
}

/// `rodizio ARGS`, logging warnings and errors only; allowed to serve as
/// root (the tests run as root on CI), unless ARGS runs `backend`, which
/// takes no balancer flag.
fn command(args: &[&str]) -> Command {
    let mut command = Command::new(BIN);
    if args.first() != Some(&"backend") {
        command.arg("--allow-root");
    }
    command.args(args).env("RUST_LOG", "warn");
    command
}

impl Running {
    fn start(args: &[&str], input: &[u8]) -> Running {
        Running::spawn(command(args), input)
    }

    fn spawn(mut command: Command, input: &[u8]) -> Running {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start rodizio");
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(input).unwrap();
        // Closing stdin here: the prompt sees end of input after `input`.
        drop(stdin);
        let stdout = pipe_reader(child.stdout.take().unwrap());
        let stderr = pipe_reader(child.stderr.take().unwrap());
        Running {
            child,
            stdout,
            out: Vec::new(),
            stderr,
            err: Vec::new(),
        }
    }

    /// Waits until standard output contains `needle`; returns all of it so far.
    fn wait_stdout(&mut self, needle: &str) -> String {
        self.wait_stdout_until(needle, |text| text.contains(needle))
    }

    /// Waits for the whole `Load balancer listening on port N` line and
    /// returns N and the output so far.
    fn wait_listening(&mut self) -> (u16, String) {
        const LINE: &str = "Load balancer listening on port ";
        let out = self.wait_stdout_until(LINE, |text| {
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
    fn wait_stdout_until(&mut self, needle: &str, done: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let text = String::from_utf8_lossy(&self.out).into_owned();
            if done(&text) {
                return text;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stdout.recv_timeout(left) {
                Ok(chunk) => self.out.extend(chunk),
                Err(RecvTimeoutError::Timeout) => panic!("no {needle:?} in time; got {text:?}"),
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("stdout closed before {needle:?}; got {text:?}")
                }
            }
        }
    }

    /// Waits until standard error contains `needle`; returns all of it so far.
    fn wait_stderr(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let text = String::from_utf8_lossy(&self.err).into_owned();
            if text.contains(needle) {
                return text;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(chunk) => self.err.extend(chunk),
                Err(_) => panic!("no {needle:?} on stderr in time; got {text:?}"),
            }
        }
    }

    /// Waits for the exit (bounded) and returns the status and standard error.
    fn wait_exit(mut self) -> (ExitStatus, String) {
        let mut status = None;
        assert!(
            wait_for(WAIT, || {
                status = self.child.try_wait().unwrap();
                status.is_some()
            }),
            "rodizio did not exit"
        );
        let mut err = std::mem::take(&mut self.err);
        while let Ok(chunk) = self.stderr.recv_timeout(WAIT) {
            err.extend(chunk);
        }
        (status.unwrap(), String::from_utf8_lossy(&err).into_owned())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Sends what `pipe` yields into a channel, chunk by chunk, until it closes.
fn pipe_reader(mut pipe: impl Read + Send + 'static) -> Receiver<Vec<u8>> {
    let (tx, rx) = crossbeam_channel::unbounded();
    thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = pipe.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    rx
}

/// The article's session: invalid answers are re-asked with
/// `Invalid input.`, then the balancer listens and proxies to the backend
/// that was typed in.
#[test]
fn prompt_end_to_end_with_piped_stdin() {
    let backend = TestBackend::http(7);
    let port = backend.addr().port().to_string();
    let input = format!("abc\n0\n11\n\n1\nbad/host\n127.0.0.1\n0\n70000\nhttp\n{port}\n");
    let mut rodizio = Running::start(&["-l", "127.0.0.1:0"], input.as_bytes());
    let (port, out) = rodizio.wait_listening();
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
        let rodizio = Running::start(&["-l", "127.0.0.1:0"], input.as_bytes());
        let (status, err) = rodizio.wait_exit();
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
        let rodizio = Running::start(args, b"");
        let (status, err) = rodizio.wait_exit();
        assert_eq!(status.code(), Some(2), "{args:?}: {err:?}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err:?}");
        assert!(err.starts_with("rodizio: "), "{args:?}: {err:?}");
    }
}

/// `--help` and `--version` print and exit 0.
#[test]
fn help_and_version_exit_0() {
    let mut rodizio = Running::start(&["--help"], b"");
    let out = rodizio.wait_stdout("--connect-timeout");
    assert!(out.contains("Usage:"), "{out}");
    assert_eq!(rodizio.wait_exit().0.code(), Some(0));
    let mut rodizio = Running::start(&["--version"], b"");
    rodizio.wait_stdout(env!("CARGO_PKG_VERSION"));
    assert_eq!(rodizio.wait_exit().0.code(), Some(0));
}

/// SIGTERM to a running balancer: it drains and exits 0.
#[test]
fn sigterm_exits_0() {
    let backend = TestBackend::http(0);
    let backend_flag = backend.addr().to_string();
    let mut rodizio = Running::start(&["-l", "127.0.0.1:0", "-b", &backend_flag], b"");
    let (port, _) = rodizio.wait_listening();
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    assert_eq!(http_get(addr, "/").unwrap().body, "backend 0\n");
    let pid = rodizio.child.id() as libc::pid_t;
    // SAFETY: sending a signal to our own child, which is still running
    // (it has not been waited for).
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let (status, err) = rodizio.wait_exit();
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
    // SAFETY: setrlimit is async-signal-safe; nothing else runs in the
    // child between fork and exec.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 24,
                rlim_max: 24,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut rodizio = Running::spawn(command, b"");
    let (port, _) = rodizio.wait_listening();
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut held = Vec::new();
    for _ in 0..40 {
        let mut s = connect(addr).unwrap();
        s.write_all(b"x").unwrap();
        held.push(s);
    }
    rodizio.wait_stderr("Too many open files");
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
    assert!(
        rodizio.child.try_wait().unwrap().is_none(),
        "rodizio exited"
    );
}

/// The first SIGTERM drains: the connection in flight keeps working and
/// new clients are refused; the second SIGTERM exits at once (status 143,
/// as a shell reports it). At start the open-files limit was raised to its
/// hard limit.
#[test]
fn first_sigterm_drains_second_exits_at_once() {
    let backend = TestBackend::echo();
    let backend_flag = backend.addr().to_string();
    let mut rodizio = Running::start(&["-l", "127.0.0.1:0", "-b", &backend_flag], b"");
    let (port, _) = rodizio.wait_listening();
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let pid = rodizio.child.id() as libc::pid_t;

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
    assert!(rodizio.child.try_wait().unwrap().is_none());
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let (status, err) = rodizio.wait_exit();
    assert_eq!(status.code(), Some(143), "stderr: {err}");
}

/// `rodizio -l 127.0.0.1:0 demo --first-port 0`: three demo backends and
/// the balancer; three requests are answered by three different backends.
#[test]
fn demo_subcommand_round_robins_over_three_backends() {
    let mut rodizio = Running::start(&["-l", "127.0.0.1:0", "demo", "--first-port", "0"], b"");
    let (port, out) = rodizio.wait_listening();
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
    let mut rodizio = Running::start(&["backend", "--listen", "127.0.0.1:0", "--name", "B"], b"");
    let out = rodizio.wait_stdout_until("Demo backend listening on ", |t| {
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
    let mut rodizio = Running::spawn(command, b"");
    let (port, _) = rodizio.wait_listening();
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let back =
        common::echo_through(connect(addr).unwrap(), std::sync::Arc::new(vec![7; 1234])).unwrap();
    assert_eq!(back.len(), 1234);
    let err = rodizio.wait_stderr("connection finished");
    let line = err
        .lines()
        .find(|l| l.contains("connection finished"))
        .unwrap();
    assert!(line.contains(&backend_flag), "{line}");
    assert!(line.contains("1234"), "{line}");
}
