//! SNI routing's ClientHello reader: garbage, a hello trickled byte by
//! byte, one of 16 KiB and one claiming more, a lying length that stalls,
//! silent clients, a reset mid-hello, and a thousand bad clients against
//! the binary: each is bounded by `sni_timeout` and 16 KiB of hello, no
//! worker is held beyond the timeout, and the process stays within bounds.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use rodizio::sni::client_hello::{self, MAX_HELLO};
use rodizio::Config;

use crate::balancer_port::reset;
use crate::child::Child;
use crate::child::Scratch;
use crate::common::{self, connect, until, TestBackend, TestBalancer};
use crate::config_file::refused;
use crate::peers::{free_port, loopback};

/// A balancer with one service routed by SNI (`a.test`, no default) on a
/// free port, `workers` workers and `timeout` for the hello, in front of
/// an echo backend (no health checks: its accepted count is the clients
/// that reached it).
fn routed(timeout: Duration, workers: usize) -> (TestBackend, TestBalancer) {
    routed_for(timeout, workers, "off")
}

/// [`routed`], the service taking only clients offering one of `alpn`
/// (`server_alpn`; `off`: any).
fn routed_for(timeout: Duration, workers: usize, alpn: &str) -> (TestBackend, TestBalancer) {
    let backend = TestBackend::echo();
    let mut c = common::config(&[backend.addr()]);
    c.name = "a".into();
    c.listen = loopback(free_port());
    c.health.interval = Duration::from_secs(3600);
    c.sni.server_names = Some("a.test".parse().unwrap());
    c.sni.timeout = timeout;
    c.sni.alpn = alpn.parse().unwrap();
    let config = Config {
        services: vec![c],
        workers,
        drain_timeout: Duration::from_secs(5),
        ..Config::default()
    };
    (backend, TestBalancer::start(config))
}

/// The hello for a.test, with `padding` bytes of padding.
fn hello(padding: usize) -> Vec<u8> {
    client_hello::build(Some("a.test"), padding)
}

/// Sends `bytes` and reads them back through the echo backend.
fn echoed(addr: SocketAddr, bytes: &[u8]) -> bool {
    let Ok(mut s) = connect(addr) else {
        return false;
    };
    let mut back = vec![0; bytes.len()];
    s.write_all(bytes).is_ok() && s.read_exact(&mut back).is_ok() && back == bytes
}

/// Sends `bytes` (the write may fail once closed) and returns how long
/// until the balancer closes the connection.
fn closed_after(addr: SocketAddr, bytes: &[u8]) -> Duration {
    let mut s = connect(addr).unwrap();
    let started = Instant::now();
    let _ = s.write_all(bytes);
    assert!(
        common::is_closed(&mut s),
        "left open after {} bytes",
        bytes.len()
    );
    started.elapsed()
}

/// Sends `bytes` one at a time, `gap` apart, stopping at a failed write.
fn trickle(s: &mut TcpStream, bytes: &[u8], gap: Duration) {
    for b in bytes {
        if s.write_all(&[*b]).is_err() {
            return;
        }
        // Pacing is what this client is about, not ordering events.
        thread::sleep(gap);
    }
}

/// Garbage instead of a ClientHello (an HTTP request, an SSH banner, a
/// TLS alert, a ServerHello, records of length 0 and 65535, a handshake
/// longer than its record) is closed at once, not at the 10 s timeout;
/// none reaches the backend, each is counted `not_tls` and refused.
#[test]
fn garbage_instead_of_a_client_hello_is_closed_at_once() {
    let (backend, lb) = routed(Duration::from_secs(10), 16);
    let mut long_handshake = hello(0);
    long_handshake[6] = 0xff;
    let mut server_hello = hello(0);
    server_hello[5] = 2;
    let garbage: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n".to_vec(),
        b"SSH-2.0-OpenSSH_9.6\r\n".to_vec(),
        vec![0x15, 3, 3, 0, 2, 2, 40],
        server_hello,
        vec![0x16, 3, 1, 0, 0],
        vec![0x16, 3, 1, 0xff, 0xff, 1, 0, 0],
        long_handshake,
        (0..=255u8).rev().collect(),
    ];
    for bytes in &garbage {
        let took = closed_after(lb.addr, bytes);
        assert!(took < Duration::from_secs(3), "{took:?} for {bytes:?}");
    }
    let n = garbage.len() as u64;
    until("all counted", || lb.stats.snapshot().sni_refused == n);
    assert_eq!(lb.stats.snapshot().sni_not_tls, n);
    assert_eq!(backend.accepted(), 0);
    assert!(echoed(lb.addr, &hello(0)));
    lb.stop();
}

/// ClientHellos whose ALPN extension lies are each closed at once as not
/// TLS, and only their own connection: a list length past the extension
/// (and 65535), one short of it, a name running past the list, an empty
/// list, an empty name, a body too short for its length, garbage, and a
/// second ALPN extension. A client offering h2 and connected before them
/// is served on throughout, and one offering a thousand names ending in
/// h2 is served after them; one offering a thousand others is refused
/// (no service for it), and none of the bad ones reaches the backend.
#[test]
fn malformed_alpn_hellos_close_only_their_own_connection() {
    let (backend, lb) = routed_for(Duration::from_secs(10), 16, "h2");
    let offering = |body: &[u8]| client_hello::build_with_alpn(Some("a.test"), Some(body), 0);
    let good = offering(&client_hello::alpn_body(&["h2"]));
    let mut before = connect(lb.addr).unwrap();
    before.write_all(&good).unwrap();
    let mut back = vec![0; good.len()];
    before.read_exact(&mut back).unwrap();
    assert_eq!(back, good);
    let mut twice = good.clone();
    // A second ALPN extension, its lengths added to the record's, the
    // handshake's and the extensions' (as `client_hello`'s tests do).
    let ext = [0, 16, 0, 5, 0, 3, 2, b'h', b'2'];
    twice.extend_from_slice(&ext);
    for at in [3, 7, 50] {
        let n = u16::from_be_bytes([twice[at], twice[at + 1]]) + ext.len() as u16;
        twice[at..at + 2].copy_from_slice(&n.to_be_bytes());
    }
    let bad: Vec<Vec<u8>> = vec![
        offering(&[0, 9, 2, b'h', b'2']),
        offering(&[0xff, 0xff, 2, b'h', b'2']),
        offering(&[0, 2, 2, b'h', b'2']),
        offering(&[0, 3, 9, b'h', b'2']),
        offering(&[0, 0]),
        offering(&[0, 3, 0, 1, b'x']),
        offering(&[0]),
        offering(&[0x41; 300]),
        twice,
    ];
    for bytes in &bad {
        let took = closed_after(lb.addr, bytes);
        assert!(took < Duration::from_secs(3), "{took:?} for {bytes:?}");
    }
    let n = bad.len() as u64;
    until("all counted", || lb.stats.snapshot().sni_not_tls == n);
    // The first client is still served, on its own connection.
    before.write_all(b"still here").unwrap();
    let mut more = [0; 10];
    before.read_exact(&mut more).unwrap();
    assert_eq!(&more, b"still here");
    drop(before);
    let many: Vec<String> = (0..1000).map(|i| format!("proto-{i}")).collect();
    let mut names: Vec<&str> = many.iter().map(String::as_str).collect();
    assert!(
        closed_after(lb.addr, &offering(&client_hello::alpn_body(&names))) < Duration::from_secs(3)
    );
    names.push("h2");
    assert!(echoed(lb.addr, &offering(&client_hello::alpn_body(&names))));
    assert_eq!(lb.stats.snapshot().sni_refused, n + 1);
    assert_eq!(backend.accepted(), 2);
    lb.stop();
}

/// A ClientHello trickled a byte every 2 ms is served once whole, within
/// the 5 s timeout, and the backend gets it all; trickled a byte every
/// 100 ms against a 500 ms timeout, the client is closed at the timeout
/// (the timeout is for the whole hello, not per byte) and counted.
#[test]
fn a_trickled_client_hello_is_served_once_complete_within_the_timeout() {
    let (backend, lb) = routed(Duration::from_secs(5), 16);
    let bytes = hello(40);
    let mut s = connect(lb.addr).unwrap();
    trickle(&mut s, &bytes, Duration::from_millis(2));
    let mut back = vec![0; bytes.len()];
    s.read_exact(&mut back).unwrap();
    assert_eq!(back, bytes);
    drop(s);
    lb.stop();

    let (_backend2, lb) = routed(Duration::from_millis(500), 16);
    let mut slow = connect(lb.addr).unwrap();
    let started = Instant::now();
    let writer = {
        let mut w = slow.try_clone().unwrap();
        thread::spawn(move || trickle(&mut w, &hello(0)[..40], Duration::from_millis(100)))
    };
    assert!(common::is_closed(&mut slow));
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_secs(4),
        "{took:?}"
    );
    writer.join().unwrap();
    until("counted", || lb.stats.snapshot().sni_timeout == 1);
    assert_eq!(backend.accepted(), 1);
    lb.stop();
}

/// A ClientHello of exactly one full TLS record (16 KiB of payload, the
/// padding extension) is read whole and passed on untouched; a record
/// header claiming one byte more is refused at once, before any of it
/// is waited for.
#[test]
fn a_16_kib_client_hello_is_served_and_a_larger_one_refused() {
    let (backend, lb) = routed(Duration::from_secs(5), 16);
    let big = client_hello::build_of_len(Some("a.test"), MAX_HELLO);
    assert_eq!(big.len(), MAX_HELLO);
    assert!(echoed(lb.addr, &big));
    let mut over = big.clone();
    over[3..5].copy_from_slice(&(16 * 1024 + 1u16).to_be_bytes());
    assert!(closed_after(lb.addr, &over) < Duration::from_secs(3));
    until("counted", || lb.stats.snapshot().sni_not_tls == 1);
    assert_eq!(backend.accepted(), 1);
    lb.stop();
}

/// A record header that claims 16 KiB, 10 bytes of it, then silence;
/// and a client that sends nothing at all: each is closed at the 300 ms
/// timeout and counted. With one worker, a good client behind them is
/// served: the worker was freed.
#[test]
fn a_lying_length_and_a_silent_client_are_bounded_by_the_timeout() {
    let (backend, lb) = routed(Duration::from_millis(300), 1);
    let mut lying = vec![0x16, 3, 1, 0x40, 0];
    lying.extend_from_slice(&hello(0)[5..15]);
    for bytes in [&lying[..], &[]] {
        let took = closed_after(lb.addr, bytes);
        assert!(
            took >= Duration::from_millis(250) && took < Duration::from_secs(5),
            "{took:?}"
        );
    }
    until("both counted", || lb.stats.snapshot().sni_timeout == 2);
    assert!(echoed(lb.addr, &hello(0)));
    assert_eq!(backend.accepted(), 1);
    lb.stop();
}

/// A client that resets half-way through its hello ends its own
/// connection at once, not at the 10 s timeout; the next is served.
#[test]
fn a_reset_mid_hello_ends_that_client_at_once() {
    let (backend, lb) = routed(Duration::from_secs(10), 16);
    let started = Instant::now();
    let mut s = connect(lb.addr).unwrap();
    s.write_all(&hello(100)[..30]).unwrap();
    reset(s);
    until("counted", || lb.stats.snapshot().sni_not_tls == 1);
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(echoed(lb.addr, &hello(0)));
    assert_eq!(backend.accepted(), 1);
    lb.stop();
}

/// The binary with `--server-names a.test --sni-timeout 300ms --workers
/// 8`: 900 garbage clients and 100 silent ones, in waves of 100, are all
/// closed (the silent ones by the timeout: 100 / 8 x 300 ms a wave at
/// most); its threads never pass the 8 workers and a few others, its
/// memory stays under 64 MiB, and a good client is served after them.
#[test]
fn a_thousand_bad_clients_hold_no_worker_and_the_binary_stays_bounded() {
    let backend = TestBackend::echo();
    let b = backend.addr().to_string();
    let mut child = Child::on_loopback(
        &[
            "-b",
            &b,
            "--server-names",
            "a.test",
            "--sni-timeout",
            "300ms",
            "--workers",
            "8",
        ],
        |_| {},
    );
    let pid = child.pid();
    let started = Instant::now();
    let mut most_threads = 0;
    for wave in 0..10 {
        let mut clients: Vec<TcpStream> = (0..100)
            .map(|i| {
                let mut s = connect(child.addr).unwrap();
                if wave != 0 || i >= 10 {
                    let _ = s.write_all(b"\x16\x03\x01\x00\x05\x02garbage");
                }
                s
            })
            .collect();
        most_threads = most_threads.max(crate::child::proc_status(pid, "Threads"));
        for s in &mut clients {
            assert!(common::is_closed(s), "a bad client left open");
        }
    }
    let took = started.elapsed();
    assert!(took < Duration::from_secs(60), "{took:?}");
    assert!(most_threads <= 8 + 8, "{most_threads} threads");
    let rss_kib = crate::child::proc_status(pid, "VmRSS");
    eprintln!("1000 bad clients: {took:?}, at most {most_threads} threads, {rss_kib} KiB resident");
    assert!(rss_kib < 64 * 1024, "{rss_kib} KiB resident");
    assert!(echoed(child.addr, &hello(0)), "{}", child.log());
    assert!(child.alive());
    assert_eq!(backend.accepted(), 1);
    let log = child.log();
    assert!(!log.contains("panicked"), "{log}");
}

/// Config files that misuse SNI routing are refused by `check-config`
/// with exit 2 and one line naming the problem: a name that is no host
/// name, a huge one, a wildcard in the middle, a list of 5000 names, a
/// number instead of a name, an address shared by a service without
/// names, two defaults on one address, a default without names,
/// `server_alpn` without names, a bad or huge protocol list, and one
/// name on one address twice without `server_alpn` apart.
#[test]
fn bad_sni_settings_are_refused_in_one_line() {
    let dir = Scratch::new("hostile-sni");
    let svc = |name: &str, extra: &str| {
        format!(
            r#"{{"name": "{name}", "listen": "127.0.0.1:9443", "backends": ["127.0.0.1:1"]{extra}}}"#
        )
    };
    let many: Vec<String> = (0..5000).map(|i| format!("\"n{i}.test\"")).collect();
    let huge = "a".repeat(100_000);
    let cases = [
        (
            svc("a", r#", "server_names": ["a b"]"#),
            "is not a server name",
        ),
        (
            svc("a", &format!(r#", "server_names": ["{huge}"]"#)),
            "is not a server name",
        ),
        (
            svc("a", r#", "server_names": "a.*.test""#),
            "is not a server name",
        ),
        (
            svc("a", &format!(r#", "server_names": [{}]"#, many.join(","))),
            "at most 1024",
        ),
        (svc("a", r#", "server_names": [3]"#), "server_names"),
        (
            format!(
                "{}, {}",
                svc("a", r#", "server_names": "a.test""#),
                svc("b", "")
            ),
            "both listen there",
        ),
        (
            format!(
                "{}, {}",
                svc("a", r#", "server_names": "a.test", "sni_default": true"#),
                svc("b", r#", "server_names": "b.test", "sni_default": true"#)
            ),
            "both the default of 127.0.0.1:9443",
        ),
        (svc("a", r#", "sni_default": true"#), "needs `server_names`"),
        (svc("a", r#", "server_alpn": "h2""#), "needs `server_names`"),
        (
            svc("a", r#", "server_names": "a.test", "server_alpn": "h 2""#),
            "is not an ALPN protocol name",
        ),
        (
            svc(
                "a",
                &format!(
                    r#", "server_names": "a.test", "server_alpn": [{}]"#,
                    many.join(",")
                ),
            ),
            "at most 16 ALPN protocols",
        ),
        (
            format!(
                "{}, {}",
                svc("a", r#", "server_names": "a.test""#),
                svc("b", r#", "server_names": "a.test", "server_alpn": "off""#)
            ),
            "services `a` and `b` both claim `a.test` on 127.0.0.1:9443",
        ),
        (
            format!(
                "{}, {}",
                svc(
                    "a",
                    r#", "server_names": "a.test", "server_alpn": "h2,http/1.1""#
                ),
                svc(
                    "b",
                    r#", "server_names": "*.x,a.test", "server_alpn": ["http/1.1"]"#
                )
            ),
            "services `a` and `b` both claim `a.test` for `http/1.1` on 127.0.0.1:9443",
        ),
    ];
    for (i, (services, says)) in cases.iter().enumerate() {
        let text = format!(r#"{{"services": [{services}]}}"#);
        let path = dir.file(&format!("sni-{i}.json"), text.as_bytes());
        let line = refused(&path);
        assert!(line.contains(says), "case {i}: {line}");
        assert!(line.len() < 600, "case {i}: a line of {} bytes", line.len());
    }
}

/// A flood of clients on an address routed by SNI, sent to the default
/// service (they are not TLS) whose one backend is down: each is refused
/// by that service's admission gate on its worker, logged at most once a
/// second, and its descriptor given back.
#[test]
fn a_flood_refused_after_the_peek_logs_a_bounded_number_of_lines() {
    crate::proxy_header::refused_flood_is_throttled(
        &["--server-names", "a.test", "--sni-default"],
        b"not TLS\n",
    );
}
