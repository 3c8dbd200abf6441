//! Who may connect: `allow` and `deny` checked at accept, before the rate
//! limiter (on the PROXY header's address with `accept_proxy`). A refused
//! client is closed at once, counted and holds no worker; both lists are
//! live.

mod child;
mod common;
mod peers;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use child::{Scratch, BIN};
use common::{until, TestBackend, TestBalancer, IO_TIMEOUT};
use peers::connect_from;
use rodizio::proxy_protocol::CidrList;

fn cidrs(text: &str) -> Option<CidrList> {
    Some(text.parse().unwrap())
}

/// One byte through the balancer from `from`: `true` when it came back
/// echoed, `false` when the balancer closed the connection (a timeout
/// fails the test).
fn echoed(from: [u8; 4], lb: &TestBalancer) -> bool {
    let mut s = connect_from(from, lb.addr, IO_TIMEOUT).expect("connect");
    let _ = s.write_all(b"x");
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(1) => b[0] == b'x',
        Ok(_) => false,
        // Closed with the byte unread: the kernel answers with a reset.
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => false,
        Err(e) => panic!("neither echoed nor closed: {e}"),
    }
}

#[test]
fn deny_refuses_and_allow_admits_only_its_networks() {
    let backend = TestBackend::echo();
    let lb = TestBalancer::with(&[backend.addr()], |c| {
        c.proxy.deny = cidrs("127.0.0.2/32");
    });
    assert!(echoed([127, 0, 0, 1], &lb));
    assert!(!echoed([127, 0, 0, 2], &lb));
    until("the refusal counted, the served one ended", || {
        let s = lb.stats.snapshot();
        (s.denied, s.accepted, s.completed) == (1, 2, 1)
    });
    // Live: `allow` only 127.0.0.3, `deny` still wins over it.
    let live = rodizio::proxy::ProxyConfig {
        allow: cidrs("127.0.0.3/32,127.0.0.2/32"),
        deny: cidrs("127.0.0.2/32"),
        ..rodizio::proxy::ProxyConfig::default()
    };
    lb.live.proxy.store(Arc::new(live));
    assert!(!echoed([127, 0, 0, 1], &lb));
    assert!(!echoed([127, 0, 0, 2], &lb));
    assert!(echoed([127, 0, 0, 3], &lb));
    until("every refusal counted", || lb.stats.snapshot().denied == 3);
    // The backend saw only the clients served.
    until("the served ones ended", || {
        lb.stats.snapshot().completed == 2
    });
    assert_eq!(backend.accepted(), 2);
}

/// Two hundred refused clients at once hold no worker: with two workers,
/// an admitted client is served while they come.
#[test]
fn a_flood_of_refused_clients_takes_no_worker() {
    let backend = TestBackend::echo();
    let lb = TestBalancer::with(&[backend.addr()], |c| {
        c.workers = 2;
        c.proxy.deny = cidrs("127.0.0.2/32");
    });
    let flood: Vec<TcpStream> = (0..200)
        .map(|_| connect_from([127, 0, 0, 2], lb.addr, IO_TIMEOUT).unwrap())
        .collect();
    assert!(echoed([127, 0, 0, 1], &lb));
    until("every refusal counted", || {
        lb.stats.snapshot().denied == 200
    });
    for mut s in flood {
        let mut b = [0u8; 1];
        assert_eq!(s.read(&mut b).unwrap(), 0, "a refused client is closed");
    }
    until("the served one ended", || {
        lb.stats.snapshot().completed == 1
    });
    assert_eq!(backend.accepted(), 1);
}

/// Behind a proxy, the address the header carries is the one checked.
#[test]
fn behind_a_proxy_the_header_address_is_checked() {
    let backend = TestBackend::echo();
    let lb = TestBalancer::with(&[backend.addr()], |c| {
        c.accept_proxy = true;
        c.proxy.deny = cidrs("10.0.0.0/8");
    });
    let through = |source: &str| {
        let mut s = TcpStream::connect(lb.addr).unwrap();
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        let header = format!("PROXY TCP4 {source} 192.0.2.10 40000 80\r\n");
        s.write_all(header.as_bytes()).unwrap();
        let _ = s.write_all(b"x");
        let mut b = [0u8; 1];
        match s.read(&mut b) {
            Ok(n) => n == 1,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => false,
            Err(e) => panic!("neither echoed nor closed: {e}"),
        }
    };
    assert!(!through("10.9.9.9"));
    assert!(through("192.0.2.1"));
    until("the refusal counted", || lb.stats.snapshot().denied == 1);
}

/// Bad networks are refused at start-up in words, as a flag and as a key.
#[test]
fn bad_networks_are_refused_in_words() {
    let out = child::output(std::process::Command::new(BIN).args([
        "--allow-root",
        "--deny",
        "10.0.0.0/33",
        "-b",
        "127.0.0.1:1",
    ]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("'10.0.0.0/33': the prefix length must be 0..=32"),
        "{err}"
    );
    let dir = Scratch::new("allow-deny");
    for (value, words) in [
        (r#""nonsense""#, "is not an IPv4 or IPv6 address"),
        ("5", "'5' is not an IPv4 or IPv6 address"),
        (r#""10.0.0.0/8,""#, "allow"),
    ] {
        let path = dir.path("bad.json");
        std::fs::write(
            &path,
            format!(r#"{{"backends": ["127.0.0.1:1"], "allow": {value}}}"#),
        )
        .unwrap();
        let out = child::output(
            std::process::Command::new(BIN)
                .arg("check-config")
                .arg(&path),
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{value}: {err}");
        assert!(
            err.contains("`allow`") && err.contains(words),
            "{value}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}
