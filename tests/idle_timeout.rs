//! The idle timeout: a connection where no byte moves is closed, so a dead
//! peer cannot hold a worker forever.

mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::{config, connect, is_closed, TestBackend, TestBalancer};

/// With `idle_timeout` 300 ms, a connection that goes quiet after one echo
/// is closed by the balancer after about 300 ms (not before), counted as an
/// error, and its worker is free again.
#[test]
fn quiet_connection_is_closed_after_the_idle_timeout() {
    let backend = TestBackend::echo();
    let mut cfg = config(&[backend.addr()]);
    cfg.proxy.idle_timeout = Duration::from_millis(300);
    cfg.workers = 1;
    let lb = TestBalancer::start(cfg);
    let mut s = connect(lb.addr).unwrap();
    s.write_all(b"x").unwrap();
    let mut b = [0u8];
    s.read_exact(&mut b).unwrap();
    let quiet_since = Instant::now();
    assert!(is_closed(&mut s), "the quiet connection was not closed");
    let waited = quiet_since.elapsed();
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(3),
        "closed after {waited:?}"
    );
    assert!(common::wait_for(Duration::from_secs(5), || {
        lb.stats.snapshot().errors == 1
    }));
    // The only worker serves the next client.
    let mut next = connect(lb.addr).unwrap();
    next.write_all(b"y").unwrap();
    next.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"y");
    drop(next);
    lb.stop();
}
