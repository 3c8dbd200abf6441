//! IPv6: the balancer listens on `::1` and reaches backends on either
//! family.

mod common;

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

use common::{config, connect, echo_through, TestBackend, TestBalancer};

/// Balancer on `[::1]:0`, one backend on `127.0.0.1` and one on `[::1]`
/// (given as `[::1]:PORT`): clients over IPv6 reach both in turn. Fails,
/// saying so, where the machine has no IPv6 loopback (CI has one).
#[test]
fn listens_on_ipv6_and_proxies_to_both_families() {
    if let Err(e) = TcpListener::bind("[::1]:0") {
        panic!("this test needs an IPv6 loopback (`::1`), and binding it failed: {e}");
    }
    let v4 = TestBackend::echo();
    let v6 = TestBackend::start_on("[::1]:0".parse().unwrap(), Arc::new(common::echo));
    let mut cfg = config(&[v4.addr(), v6.addr()]);
    assert_eq!(cfg.backends[1].host, "::1");
    cfg.listen = "[::1]:0".parse::<SocketAddr>().unwrap();
    let lb = TestBalancer::start(cfg);
    assert!(lb.addr.is_ipv6());
    for i in 0..4u8 {
        let data = Arc::new(vec![i; 10_000]);
        let back = echo_through(connect(lb.addr).unwrap(), data.clone()).unwrap();
        assert!(back == *data);
    }
    assert_eq!((v4.accepted(), v6.accepted()), (2, 2));
    lb.stop();
}
