//! The binary and its signals: SIGHUP and SIGUSR1/2 never kill it, SIGTERM
//! drains and exits 0.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{http_get, time_until, TestBackend};

/// Starts the binary on a free port in front of `backend`; returns the
/// child and the port it printed.
fn start(backend: std::net::SocketAddr) -> (Child, u16) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rodizio"))
        // The tests run as root on CI.
        .arg("--allow-root")
        .args(["-l", "127.0.0.1:0", "-b", &backend.to_string()])
        .args(["--health-check", "off"])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rodizio");
    let mut line = String::new();
    let stdout = child.stdout.take().expect("stdout");
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read the first line");
    let port = line
        .split_whitespace()
        .nth(5)
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {line:?}"));
    (child, port)
}

fn signal(child: &Child, signo: libc::c_int) {
    // SAFETY: kill(2) with the PID of our own child and a valid signal.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, signo) };
    assert_eq!(rc, 0, "kill failed");
}

/// SIGHUP, SIGUSR1 and SIGUSR2 are logged and survived; the balancer still
/// serves after them; SIGTERM then ends it with exit code 0.
#[test]
fn hangup_and_user_signals_do_not_stop_it() {
    let backend = TestBackend::http(100);
    let (mut child, port) = start(backend.addr());
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    assert_eq!(
        http_get(addr, "/").expect("first request").status,
        "HTTP/1.1 200 OK"
    );
    for signo in [libc::SIGHUP, libc::SIGUSR1, libc::SIGUSR2] {
        signal(&child, signo);
        // Still alive and serving after each one.
        assert_eq!(
            http_get(addr, "/").expect("request after a signal").status,
            "HTTP/1.1 200 OK"
        );
        assert!(child.try_wait().expect("try_wait").is_none());
    }
    signal(&child, libc::SIGTERM);
    let status = time_until(Duration::from_secs(10), || {
        matches!(child.try_wait(), Ok(Some(_)))
    });
    if status.is_none() {
        let _ = child.kill();
        panic!("rodizio did not exit after SIGTERM");
    }
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(0), "{status:?}");
    let mut log = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut log)
        .expect("read the log");
    assert!(log.contains("SIGHUP received"), "{log}");
    assert!(log.contains("SIGUSR1 received"), "{log}");
    assert!(log.contains("SIGUSR2 received: ignored"), "{log}");
    assert!(log.contains("SIGTERM received"), "{log}");
    // One summary line at the end: the four requests served.
    assert!(log.contains("summary: up"), "{log}");
    assert!(
        log.contains("4 connections accepted, 4 served, 0 refused"),
        "{log}"
    );
}
