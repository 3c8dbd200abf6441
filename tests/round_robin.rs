//! Round robin over three backends is exact, counted on the backends' side.

mod common;

use common::{backends, http_get, TestBackend, TestBalancer};

/// 30 sequential requests over 3 backends: each backend accepts exactly 10
/// connections, and the replies come in the order A B C A B C ...
#[test]
fn thirty_requests_are_ten_each_in_order() {
    let backends = backends(3, TestBackend::http);
    let addrs: Vec<_> = backends.iter().map(|b| b.addr()).collect();
    let lb = TestBalancer::over(&addrs);
    for i in 0..30 {
        let response = http_get(lb.addr, "/").expect("request through the balancer");
        assert_eq!(response.status, "HTTP/1.1 200 OK");
        assert_eq!(response.body, format!("backend {}\n", i % 3), "request {i}");
    }
    let (held, counts) = lb.proxied(&backends.iter().collect::<Vec<_>>(), |c| c == [10, 10, 10]);
    assert!(held, "split {counts:?}");
    assert_eq!(lb.stats.snapshot().accepted, 30);
    lb.stop();
}
