//! A backend that never answers costs one connect timeout, then the next
//! backend serves the client.

mod common;

use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{black_hole, config, connect, echo_through, TestBackend, TestBalancer};

/// Backends: a silent one, then an echo one; connect timeout 300 ms. The
/// client picked for the silent backend waits about one connect timeout,
/// then is served by the echo backend; the next client goes straight there.
#[test]
fn silent_backend_costs_one_connect_timeout_then_fails_over() {
    let (_listener, silent, _fillers) = black_hole();
    // Check the premise: a plain connect to it times out.
    assert!(TcpStream::connect_timeout(&silent, Duration::from_millis(200)).is_err());
    let echo = TestBackend::echo();
    let mut cfg = config(&[silent, echo.addr()]);
    cfg.proxy.connect_timeout = Duration::from_millis(300);
    let lb = TestBalancer::start(cfg);

    let started = Instant::now();
    let back = echo_through(connect(lb.addr).unwrap(), Arc::new(b"first".to_vec())).unwrap();
    let first = started.elapsed();
    assert_eq!(back, b"first");
    assert!(
        first >= Duration::from_millis(250) && first < Duration::from_secs(2),
        "the fail-over took {first:?}"
    );
    assert_eq!(lb.stats.snapshot().connect_failures, 1);

    let back = echo_through(connect(lb.addr).unwrap(), Arc::new(b"second".to_vec())).unwrap();
    assert_eq!(back, b"second");
    // No second timeout: the second client went straight to the echo backend.
    assert_eq!(lb.stats.snapshot().connect_failures, 1);
    assert_eq!(echo.accepted(), 2);
    lb.stop();
}
