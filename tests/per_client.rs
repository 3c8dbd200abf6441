//! Connections per client address: `max_connections_per_client` holds
//! with 100 connections from one address while another is served; a
//! client over the cap gets the rate limiter's reply (a close, or its
//! 429), is counted and holds no worker; a closed connection frees a
//! place; the PROXY header's address is the one counted; the cap is live.

mod child;
mod common;
mod peers;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use child::{Scratch, BIN};
use common::{until, TestBackend, TestBalancer, IO_TIMEOUT};
use peers::connect_from;
use rodizio::limiter::{RateLimitConfig, RateLimitReply};
use rodizio::proxy::ProxyConfig;

/// A connection from `from` that echoed one byte (so it is served and
/// counted), or `None` when the balancer closed it.
fn served(from: [u8; 4], lb: &TestBalancer) -> Option<TcpStream> {
    let mut s = connect_from(from, lb.addr, IO_TIMEOUT).expect("connect");
    let _ = s.write_all(b"x");
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(1) if b[0] == b'x' => Some(s),
        Ok(_) => None,
        // Closed with the byte unread: the kernel answers with a reset.
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => None,
        Err(e) => panic!("neither echoed nor closed: {e}"),
    }
}

fn capped(n: usize) -> ProxyConfig {
    ProxyConfig {
        max_connections_per_client: Some(n),
        ..ProxyConfig::default()
    }
}

/// 100 connections held from 127.0.0.2 at a cap of 100: the 101st is
/// closed, 127.0.0.3 is still served, and closing one of the hundred
/// frees a place for 127.0.0.2.
#[test]
fn the_cap_holds_with_100_connections_and_frees_a_place_on_close() {
    let backend = TestBackend::echo();
    let lb = TestBalancer::with(&[backend.addr()], |c| {
        c.proxy = capped(100);
    });
    let mut held: Vec<TcpStream> = (0..100)
        .map(|i| served([127, 0, 0, 2], &lb).unwrap_or_else(|| panic!("connection {i} refused")))
        .collect();
    assert!(
        served([127, 0, 0, 2], &lb).is_none(),
        "the 101st is refused"
    );
    let other = served([127, 0, 0, 3], &lb).expect("another address is served");
    until("the refusal counted", || {
        lb.stats.snapshot().too_many_connections == 1
    });
    // The refused one never reached the backend.
    assert_eq!(backend.accepted(), 101);
    drop(held.pop());
    // The place frees once the worker has ended that connection: poll.
    let mut again = None;
    assert!(
        common::wait_for(IO_TIMEOUT, || {
            again = served([127, 0, 0, 2], &lb);
            again.is_some()
        }),
        "a place freed for 127.0.0.2"
    );
    assert!(served([127, 0, 0, 2], &lb).is_none(), "full again");
    drop((held, other, again));
    until("every connection ended", || lb.stats.snapshot().active == 0);
}

/// With rate limiting replying `http`, a client over the cap gets the
/// limiter's 429.
#[test]
fn over_the_cap_a_client_gets_the_rate_limiters_429() {
    let backend = TestBackend::echo();
    let lb = TestBalancer::with(&[backend.addr()], |c| {
        c.proxy = capped(1);
        let mut rate = RateLimitConfig::new(rodizio::limiter::Rate::parse("1000/1s").unwrap());
        rate.reply = RateLimitReply::Http;
        c.rate_limit = Some(rate);
    });
    let _one = served([127, 0, 0, 2], &lb).expect("the first is served");
    let mut s = connect_from([127, 0, 0, 2], lb.addr, IO_TIMEOUT).unwrap();
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    assert!(reply.starts_with("HTTP/1.1 429 "), "{reply:?}");
    assert!(reply.contains("Retry-After: 1"), "{reply:?}");
    until("the refusal counted", || {
        lb.stats.snapshot().too_many_connections == 1
    });
    assert_eq!(lb.stats.snapshot().rate_limited, 0);
}

/// Behind a proxy, the header's address is counted, not the proxy's.
#[test]
fn behind_a_proxy_the_header_address_is_counted() {
    let backend = TestBackend::echo();
    let lb = TestBalancer::with(&[backend.addr()], |c| {
        c.accept_proxy = true;
        c.proxy = capped(1);
    });
    let through = |source: &str| {
        let mut s = TcpStream::connect(lb.addr).unwrap();
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        let header = format!("PROXY TCP4 {source} 192.0.2.10 40000 80\r\n");
        s.write_all(header.as_bytes()).unwrap();
        let _ = s.write_all(b"x");
        let mut b = [0u8; 1];
        match s.read(&mut b) {
            Ok(1) => Some(s),
            Ok(_) => None,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => None,
            Err(e) => panic!("neither echoed nor closed: {e}"),
        }
    };
    let first = through("192.0.2.1").expect("served");
    assert!(through("192.0.2.1").is_none(), "same address, over the cap");
    let second = through("192.0.2.2").expect("another address is served");
    until("the refusal counted", || {
        lb.stats.snapshot().too_many_connections == 1
    });
    drop((first, second));
}

/// The cap is live: raised, the address over it is served; turned off,
/// nothing is counted.
#[test]
fn the_cap_is_live() {
    let backend = TestBackend::echo();
    let lb = TestBalancer::with(&[backend.addr()], |c| {
        c.proxy = capped(1);
    });
    let a = served([127, 0, 0, 2], &lb).expect("served");
    assert!(served([127, 0, 0, 2], &lb).is_none());
    lb.live.proxy.store(Arc::new(capped(2)));
    let b = served([127, 0, 0, 2], &lb).expect("served under the raised cap");
    assert!(served([127, 0, 0, 2], &lb).is_none());
    lb.live.proxy.store(Arc::new(ProxyConfig::default()));
    let more: Vec<TcpStream> = (0..3)
        .map(|_| served([127, 0, 0, 2], &lb).expect("no cap"))
        .collect();
    until("two refusals counted", || {
        lb.stats.snapshot().too_many_connections == 2
    });
    drop((a, b, more));
}

/// Bad values are refused at start-up in one line, as a flag and as a key.
#[test]
fn bad_caps_are_refused_in_words() {
    for value in ["0", "-1", "x", "99999999999999999999"] {
        let (code, err) = refused_at_start(&[
            "-l",
            "127.0.0.1:0",
            "-b",
            "127.0.0.1:1",
            &format!("--max-connections-per-client={value}"),
        ]);
        assert_eq!(code, Some(2), "{value}: {err}");
        assert!(
            err.contains("--max-connections-per-client"),
            "{value}: {err}"
        );
    }
    let dir = Scratch::new("per-client");
    for value in ["0", "-3", r#""lots""#, "1.5"] {
        let path = dir.path("bad.json");
        std::fs::write(
            &path,
            format!(r#"{{"backends": ["127.0.0.1:1"], "max_connections_per_client": {value}}}"#),
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
            err.contains("`max_connections_per_client`"),
            "{value}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

/// Runs the binary with `args`, expecting it to refuse them at start-up:
/// its exit code and standard error. One that starts serving instead is
/// killed (by its PID) after 10 s, and the test fails.
pub fn refused_at_start(args: &[&str]) -> (Option<i32>, String) {
    let mut command = child::command(&[&["--allow-root"], args].concat());
    command.env_remove("RUST_LOG");
    let out = child::run_within(&mut command, IO_TIMEOUT);
    (out.code, out.stderr)
}
