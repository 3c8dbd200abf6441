//! The binary and its signals: SIGHUP and SIGUSR1/2 never kill it, SIGTERM
//! drains and exits 0.

mod child;
mod common;

use std::time::Duration;

use child::Child;
use common::{http_get, TestBackend};

/// Starts the binary on a free port in front of `backend`.
fn start(backend: std::net::SocketAddr) -> Child {
    Child::balancer(&[
        "-l",
        "127.0.0.1:0",
        "-b",
        &backend.to_string(),
        "--health-check",
        "off",
    ])
}

/// SIGHUP, SIGUSR1 and SIGUSR2 are logged and survived; the balancer still
/// serves after them; SIGTERM then ends it with exit code 0.
#[test]
fn hangup_and_user_signals_do_not_stop_it() {
    let backend = TestBackend::http(100);
    let mut child = start(backend.addr());
    let addr = child.addr;
    assert_eq!(
        http_get(addr, "/").expect("first request").status,
        "HTTP/1.1 200 OK"
    );
    for signo in [libc::SIGHUP, libc::SIGUSR1, libc::SIGUSR2] {
        child.signal(signo);
        // Still alive and serving after each one.
        assert_eq!(
            http_get(addr, "/").expect("request after a signal").status,
            "HTTP/1.1 200 OK"
        );
        assert!(child.alive());
    }
    child.signal(libc::SIGTERM);
    let status = child
        .wait_exit(Duration::from_secs(10))
        .expect("rodizio did not exit after SIGTERM");
    assert_eq!(status.code(), Some(0), "{status:?}");
    child.stderr.wait_end(child::WAIT);
    let log = child.log();
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
