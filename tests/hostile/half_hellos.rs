//! Half-hellos: clients that send the start of a ClientHello and stop,
//! thousands at once, against TLS termination and SNI routing. With
//! `tls_max_pending` the handshakes and peeks in progress are bounded: a
//! new client closes the one stalled longest (`tls_pending_closed`,
//! logged at most once a second), so a real client behind the flood is
//! served in under a second. A stalled partial hello on an SNI address
//! with a default service is closed at `sni_timeout`, never handed to
//! the default; a hello split over two records is routed by its name.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use rodizio::sni::client_hello;
use rodizio::tls_term::CertList;
use rodizio::Config;

use crate::child::Child;
use crate::common::{self, connect, until, wait_for, TestBackend, TestBalancer};
use crate::peers::{free_port, loopback};
use crate::tls_certs::{self, Certs};

/// Half-hello clients in a flood: more than the bound and the workers
/// together, many times over.
const FLOOD: usize = 2_000;

/// The start of a ClientHello for `name`: its record header and 55 bytes
/// of the hundreds it announces.
fn half_hello(name: &str) -> Vec<u8> {
    client_hello::build(Some(name), 300)[..60].to_vec()
}

/// `count` clients that each send `bytes` and then nothing, held open.
fn flood(addr: SocketAddr, count: usize, bytes: &[u8]) -> Vec<TcpStream> {
    (0..count)
        .map(|_| {
            let mut s = connect(addr).unwrap();
            s.write_all(bytes).unwrap();
            s
        })
        .collect()
}

/// 2,000 half-hellos against a TLS service with 64 workers and
/// `tls_max_pending` 16, handshakes allowed a minute: a real rustls
/// client connecting right behind them finishes its handshake in under a
/// second and is served; the flood was recycled oldest first (counted),
/// and no backend was connected for it.
#[test]
fn a_flood_of_half_hellos_leaves_a_real_tls_client_served_within_a_second() {
    let certs = Certs::new();
    let pair = certs.issue("a", &["localhost"], 1);
    let backend = TestBackend::echo();
    let b = TestBalancer::with(&[backend.addr()], |c| {
        c.tls.certs = CertList(vec![pair.setting()]);
        c.tls.handshake_timeout = Duration::from_secs(60);
        c.tls.max_pending = 16;
        c.workers = 64;
    });
    let flooded = Instant::now();
    let held = flood(b.addr, FLOOD, &half_hello("localhost"));
    let started = Instant::now();
    let mut real = tls_certs::connect(b.addr, "localhost", &certs.ca()).unwrap();
    let took = started.elapsed();
    real.write_all(b"served").unwrap();
    let mut back = [0u8; 6];
    real.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"served");
    eprintln!(
        "{FLOOD} half-hellos sent in {:?}; a real handshake behind them took {took:?}",
        started - flooded
    );
    assert!(took < Duration::from_secs(1), "{took:?}");
    // Every half-hello but the 15 or 16 still in progress was closed to
    // make room (16 when the real client entered before the last of them).
    assert!(
        wait_for(Duration::from_secs(20), || {
            b.stats.snapshot().tls_pending_closed >= (FLOOD - 16) as u64
        }),
        "{:?}",
        b.stats.snapshot()
    );
    let s = b.stats.snapshot();
    assert!(s.tls_pending_closed <= (FLOOD + 1 - 16) as u64, "{s:?}");
    assert!(s.workers <= 64, "{s:?}");
    assert_eq!(s.tls_handshakes, 1, "{s:?}");
    assert_eq!(backend.accepted(), 1);
    drop(held);
}

/// Two services sharing a free port by SNI: `a.test` on `a`, `b.test` on
/// `b`, the default; `max_pending` for both.
fn shared(a: &TestBackend, b: &TestBackend, timeout: Duration, max_pending: usize) -> TestBalancer {
    let listen = loopback(free_port());
    let service = |name: &str, backend: &TestBackend, names: &str, default: bool| {
        let mut c = common::config(&[backend.addr()]);
        c.name = name.into();
        c.listen = listen;
        c.health.interval = Duration::from_secs(3600);
        c.sni.server_names = Some(names.parse().unwrap());
        c.sni.default = default;
        c.sni.timeout = timeout;
        c.tls.max_pending = max_pending;
        c
    };
    TestBalancer::start(Config {
        services: vec![
            service("a", a, "a.test", false),
            service("b", b, "b.test", true),
        ],
        workers: 32,
        drain_timeout: Duration::from_secs(5),
        ..Config::default()
    })
}

/// Sends `bytes` and reads them back through an echo backend.
fn echoed(addr: SocketAddr, bytes: &[u8]) -> bool {
    let Ok(mut s) = connect(addr) else {
        return false;
    };
    let mut back = vec![0; bytes.len()];
    s.write_all(bytes).is_ok() && s.read_exact(&mut back).is_ok() && back == bytes
}

/// On an SNI address with a default service, a hello begun and never
/// finished is closed at `sni_timeout` (300 ms), counted as a timeout and
/// a refusal; the default service's backend never sees it. A whole hello
/// for an unknown name still goes to the default.
#[test]
fn a_stalled_partial_hello_is_closed_at_sni_timeout_not_handed_to_the_default() {
    let (a, b) = (TestBackend::echo(), TestBackend::echo());
    let lb = shared(&a, &b, Duration::from_millis(300), 1024);
    let mut s = connect(lb.addr).unwrap();
    let started = Instant::now();
    s.write_all(&half_hello("a.test")).unwrap();
    assert!(common::is_closed(&mut s), "the stalled hello was left open");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(5),
        "{took:?}"
    );
    until("counted", || {
        let s = lb.stats.snapshot();
        s.sni_timeout == 1 && s.sni_refused == 1
    });
    assert_eq!((a.accepted(), b.accepted()), (0, 0));
    assert!(echoed(lb.addr, &client_hello::build(Some("c.test"), 0)));
    assert_eq!((a.accepted(), b.accepted()), (0, 1));
    lb.stop();
}

/// `hello`'s handshake message in two records, cut `at` bytes in.
fn in_two_records(hello: &[u8], at: usize) -> Vec<u8> {
    let message = &hello[client_hello::RECORD_HEADER..];
    let mut wire = Vec::new();
    for part in [&message[..at], &message[at..]] {
        wire.extend_from_slice(&[0x16, 3, 1]);
        wire.extend_from_slice(&(part.len() as u16).to_be_bytes());
        wire.extend_from_slice(part);
    }
    wire
}

/// A ClientHello for `a.test` split over two records, the name in the
/// second (and, another time, cut in the middle of the name), reaches
/// `a`'s backend byte for byte, not the default's.
#[test]
fn a_hello_split_in_two_records_routes_by_its_name() {
    let (a, b) = (TestBackend::echo(), TestBackend::echo());
    let lb = shared(&a, &b, Duration::from_secs(5), 1024);
    let hello = client_hello::build(Some("a.test"), 400);
    let name_at = hello.windows(6).position(|w| w == b"a.test").unwrap();
    for at in [20, name_at - client_hello::RECORD_HEADER + 3] {
        assert!(echoed(lb.addr, &in_two_records(&hello, at)), "cut at {at}");
    }
    assert_eq!((a.accepted(), b.accepted()), (2, 0));
    assert_eq!(lb.stats.snapshot().sni_matched, 2);
    lb.stop();
}

/// 2,000 half-hellos on an SNI address with a default, peeks bounded at
/// 8 by `tls_max_pending`, hellos allowed a minute: a whole hello right
/// behind them is routed and echoed in under a second; none of the flood
/// reached a backend.
#[test]
fn a_flood_of_half_hellos_leaves_an_sni_client_routed_within_a_second() {
    let (a, b) = (TestBackend::echo(), TestBackend::echo());
    let lb = shared(&a, &b, Duration::from_secs(60), 8);
    let held = flood(lb.addr, FLOOD, &half_hello("a.test"));
    let started = Instant::now();
    assert!(echoed(lb.addr, &client_hello::build(Some("a.test"), 100)));
    let took = started.elapsed();
    assert!(took < Duration::from_secs(1), "{took:?}");
    assert!(
        wait_for(Duration::from_secs(20), || {
            lb.stats.snapshot().tls_pending_closed >= (FLOOD - 8) as u64
        }),
        "{:?}",
        lb.stats.snapshot()
    );
    let s = lb.stats.snapshot();
    assert!(s.tls_pending_closed <= (FLOOD + 1 - 8) as u64, "{s:?}");
    assert_eq!((a.accepted(), b.accepted()), (1, 0));
    drop(held);
    lb.stop();
}

/// The binary, peeks bounded at 4: 300 half-hellos close 296 of them to
/// make room, told in a warning at most once a second (plus one), each
/// line naming the setting.
#[test]
fn clients_closed_to_make_room_are_logged_at_most_once_a_second() {
    const CLIENTS: usize = 300;
    let backend = TestBackend::echo();
    let addr = backend.addr().to_string();
    let child = Child::on_loopback(
        &[
            "-b",
            &addr,
            "--health-check",
            "off",
            "--server-names",
            "a.test",
            "--sni-timeout",
            "60s",
            "--tls-max-pending",
            "4",
            "--workers",
            "16",
        ],
        |_| {},
    );
    let started = Instant::now();
    let held = flood(child.addr, CLIENTS, &half_hello("a.test"));
    let lines = || {
        child
            .log()
            .lines()
            .filter(|l| l.contains("to make room") && l.contains("tls_max_pending (4)"))
            .count()
    };
    until("the closes logged", || lines() > 0);
    // All but the newest 4 are closed to make room (their end of stream
    // reads as 0 bytes; one still open would block).
    for s in &held {
        s.set_nonblocking(true).unwrap();
    }
    until("the flood recycled", || {
        let closed = held.iter().filter(|s| {
            let mut s: &TcpStream = s;
            matches!(s.read(&mut [0u8; 1]), Ok(0))
        });
        closed.count() >= CLIENTS - 4
    });
    let seconds = started.elapsed().as_secs() as usize;
    let logged = lines();
    assert!(
        logged <= seconds + 2,
        "{logged} lines for {CLIENTS} closes in {seconds} s:\n{}",
        child.log()
    );
    assert_eq!(backend.accepted(), 0);
}
