//! Per-client-IP rate limiting through a real balancer: clients bound to
//! different loopback source addresses (127.0.0.2, 127.0.0.3, ...), an echo
//! backend that counts the connections it accepts, and a long window (60 s)
//! so no check can straddle a window boundary.

mod child;
mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

use child::BIN;
use common::{specs, until, TestBackend, TestBalancer};
use rodizio::limiter::{Rate, RateLimitConfig, RateLimitReply};
use rodizio::Config;
use socket2::{Domain, Socket, Type};

const TIMEOUT: Duration = Duration::from_secs(5);
const WINDOW: Duration = Duration::from_secs(60);

/// A balancer with 16 workers in front of `backend`, limited by
/// `rate_limit`.
fn start(backend: SocketAddr, rate_limit: Option<RateLimitConfig>) -> TestBalancer {
    TestBalancer::start(Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        backends: specs(&[backend]),
        workers: 16,
        drain_timeout: TIMEOUT,
        rate_limit,
        ..Config::default()
    })
}

fn limit(n: u32, reply: RateLimitReply) -> Option<RateLimitConfig> {
    Some(RateLimitConfig {
        reply,
        ..RateLimitConfig::new(Rate {
            limit: n,
            window: WINDOW,
        })
    })
}

/// A connection to `to` from the loopback address `127.0.0.<last>`
/// (bound before connecting, port chosen by the kernel), with timeouts.
fn connect_from(last: u8, to: SocketAddr) -> TcpStream {
    connect_from_ip(Ipv4Addr::new(127, 0, 0, last), to)
}

/// A connection to `to` from the loopback address `ip`, with timeouts.
fn connect_from_ip(ip: Ipv4Addr, to: SocketAddr) -> TcpStream {
    let source = SocketAddr::new(IpAddr::V4(ip), 0);
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    socket.bind(&source.into()).unwrap();
    socket.connect_timeout(&to.into(), TIMEOUT).unwrap();
    let stream: TcpStream = socket.into();
    stream.set_read_timeout(Some(TIMEOUT)).unwrap();
    stream.set_write_timeout(Some(TIMEOUT)).unwrap();
    stream
}

/// Sends a line through the balancer and expects it echoed by the backend.
fn round_trip(last: u8, to: SocketAddr) {
    let mut stream = connect_from(last, to);
    let line = format!("hello from 127.0.0.{last}\n");
    stream.write_all(line.as_bytes()).unwrap();
    let mut echoed = vec![0u8; line.len()];
    stream.read_exact(&mut echoed).unwrap();
    assert_eq!(echoed, line.as_bytes());
}

/// Connects and expects the balancer to close without sending a byte (a
/// read timeout, the sign of a connection left open, fails the test).
fn expect_closed(last: u8, to: SocketAddr) {
    let mut stream = connect_from(last, to);
    let mut buf = [0u8; 64];
    match stream.read(&mut buf) {
        Ok(0) => {}
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted
            ) => {}
        other => panic!("127.0.0.{last}: expected a close, got {other:?}"),
    }
}

/// The (N+1)th connection from one address in a window is closed and never
/// reaches the backend, while another address keeps its own full allowance.
#[test]
fn over_the_limit_is_closed_and_other_addresses_are_unaffected() {
    let backend = TestBackend::echo();
    let lb = start(backend.addr(), limit(3, RateLimitReply::Close));
    for _ in 0..3 {
        round_trip(2, lb.addr);
    }
    expect_closed(2, lb.addr);
    // While 127.0.0.2 is refused, 127.0.0.3 gets through, all three times.
    round_trip(3, lb.addr);
    expect_closed(2, lb.addr);
    round_trip(3, lb.addr);
    round_trip(3, lb.addr);
    expect_closed(3, lb.addr);
    expect_closed(2, lb.addr);
    // Exactly the six allowed connections reached the backend.
    let (held, seen) = lb.proxied(&[&backend], |c| c == [6]);
    assert!(held, "the backend took {seen:?} connections");
    let stats = lb.stats.snapshot();
    assert_eq!(stats.rate_limited, 4);
    assert_eq!(stats.accepted, 10);
    until("six proxied connections complete", || {
        lb.stats.snapshot().completed == 6
    });
    lb.stop();
}

/// With `--rate-limit-reply http` the refused client reads a 429 with
/// `Retry-After` and `Connection: close`, then end of stream.
#[test]
fn http_reply_sends_429_then_closes() {
    let backend = TestBackend::echo();
    let lb = start(backend.addr(), limit(2, RateLimitReply::Http));
    round_trip(4, lb.addr);
    round_trip(4, lb.addr);
    let mut stream = connect_from(4, lb.addr);
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    assert!(
        reply.starts_with("HTTP/1.1 429 Too Many Requests\r\n"),
        "{reply:?}"
    );
    assert!(reply.contains("\r\nConnection: close\r\n"), "{reply:?}");
    let retry_after: u64 = reply
        .lines()
        .find_map(|l| l.strip_prefix("Retry-After: "))
        .expect("a Retry-After header")
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    // Another address still gets through; the backend saw only the allowed.
    round_trip(5, lb.addr);
    let (held, seen) = lb.proxied(&[&backend], |c| c == [3]);
    assert!(held, "the backend took {seen:?} connections");
    assert_eq!(lb.stats.snapshot().rate_limited, 1);
    lb.stop();
}

/// Without `--rate-limit` nothing is limited: many connections from one
/// address all reach the backend (the article's `ab` test relies on it).
#[test]
fn off_by_default() {
    let backend = TestBackend::echo();
    let lb = start(backend.addr(), None);
    for _ in 0..50 {
        round_trip(6, lb.addr);
    }
    let (held, seen) = lb.proxied(&[&backend], |c| c == [50]);
    assert!(held, "the backend took {seen:?} connections");
    assert_eq!(lb.stats.snapshot().rate_limited, 0);
    lb.stop();
}

/// A bad rate-limit flag exits with status 2 and one line on standard
/// error, before anything is asked or bound.
#[test]
fn bad_flags_exit_2_with_one_line() {
    for args in [
        &["--rate-limit", "0/1s"][..],
        &["--rate-limit", "100/1x"],
        &[
            "--rate-limit",
            "10/1s",
            "--rate-limit-algorithm",
            "leaky-bucket",
        ],
        &["--rate-limit", "10/1s", "--rate-limit-ipv6-prefix", "129"],
        &["--rate-limit-reply", "http"],
    ] {
        let out = child::output(
            std::process::Command::new(BIN)
                .args(args)
                .stdin(std::process::Stdio::null()),
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("rodizio: "), "{args:?}: {stderr}");
    }
}

/// A client over its limit stays refused while 1,500 new addresses
/// (127.1.x.y, each bound before connecting) pass through a balancer that
/// tracks at most 256 clients, probed every 500 of them; a fresh address is
/// then served.
#[test]
fn an_abuser_stays_refused_while_many_new_addresses_arrive() {
    let backend = TestBackend::echo();
    let mut config = limit(3, RateLimitReply::Close);
    if let Some(c) = config.as_mut() {
        c.max_clients = 256;
    }
    let lb = start(backend.addr(), config);
    for _ in 0..3 {
        round_trip(7, lb.addr);
    }
    expect_closed(7, lb.addr);
    for n in 1..=1500u16 {
        let [hi, lo] = n.to_be_bytes();
        let ip = Ipv4Addr::new(127, 1, hi, lo);
        let mut stream = connect_from_ip(ip, lb.addr);
        stream.write_all(b"x").unwrap();
        let mut echoed = [0u8; 1];
        stream.read_exact(&mut echoed).unwrap();
        if n % 500 == 0 {
            expect_closed(7, lb.addr);
        }
    }
    round_trip(8, lb.addr);
    let (held, seen) = lb.proxied(&[&backend], |c| c == [3 + 1500 + 1]);
    assert!(held, "the backend took {seen:?} connections");
    assert_eq!(lb.stats.snapshot().rate_limited, 1 + 1500 / 500);
    lb.stop();
}
