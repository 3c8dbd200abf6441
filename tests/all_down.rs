//! When no backend can be reached, the client is closed promptly.

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::{closed_port, config, connect, is_closed, wait_for, TestBalancer};

/// Every backend refuses: each client is closed (end of stream or reset)
/// well within the connect timeout, not left hanging, and the balancer
/// keeps serving (three clients in a row get the same treatment).
#[test]
fn client_is_closed_within_the_connect_timeout() {
    let mut cfg = config(&[closed_port(), closed_port(), closed_port()]);
    cfg.proxy.connect_timeout = Duration::from_millis(500);
    let lb = TestBalancer::start(cfg);
    for round in 1..=3u64 {
        let started = Instant::now();
        let mut s = connect(lb.addr).unwrap();
        // The write may already fail if the balancer closed first.
        let _ = s.write_all(b"GET / HTTP/1.1\r\n\r\n");
        assert!(
            is_closed(&mut s),
            "round {round}: the client was not closed"
        );
        let elapsed = started.elapsed();
        // Refused ports fail at once; even three full timeouts would be 1.5 s.
        assert!(elapsed < Duration::from_millis(1500), "took {elapsed:?}");
        assert!(wait_for(Duration::from_secs(5), || {
            lb.stats.snapshot().no_backend == round
        }));
    }
    assert_eq!(lb.stats.snapshot().connect_failures, 9);
    lb.stop();
}
