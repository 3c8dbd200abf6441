//! A backend that refuses connections costs no client request.

mod common;

use common::{closed_port, http_get, TestBackend, TestBalancer};

/// Three backends, the middle one a closed port: 30 requests all succeed.
/// The dead backend's first 3 turns (requests 1, 4 and 7) fail over to the
/// next one in list order; the third failure in a row marks it down
/// (passive health), and the 22 requests after that alternate between the
/// two left. So the first backend serves 3 + 11 = 14, the third 5 + 11 = 16.
#[test]
fn one_refusing_backend_of_three_costs_nothing() {
    let a = TestBackend::http(0);
    let c = TestBackend::http(2);
    let lb = TestBalancer::over(&[a.addr(), closed_port(), c.addr()]);
    for i in 0..30 {
        let r = http_get(lb.addr, "/").unwrap_or_else(|e| panic!("request {i} failed: {e}"));
        assert_eq!(r.status, "HTTP/1.1 200 OK");
    }
    assert_eq!((a.accepted(), c.accepted()), (14, 16));
    let stats = lb.stats.snapshot();
    assert_eq!(stats.connect_failures, 3);
    assert_eq!(stats.no_backend, 0);
    lb.stop();
}
