//! The PROXY protocol header reader: lying lengths, trickled and garbage headers.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use rodizio::proxy_protocol::{V1_MAX_LEN, V2_SIGNATURE};

use crate::balancer_port::reset;
use crate::child::Child;
use crate::common::{self, connect, until, TestBackend, TestBalancer};

/// What a valid version 1 header looks like here.
const GOOD_V1: &[u8] = b"PROXY TCP4 192.0.2.1 198.51.100.7 51234 80\r\n";

/// A balancer with `--accept-proxy` (header timeout `timeout`, loopback
/// trusted) in front of an echo backend, with no health checks, so the
/// backend's accepted count is the clients that reached it.
fn behind_proxy(timeout: Duration, workers: usize) -> (TestBackend, TestBalancer) {
    let backend = TestBackend::echo();
    let lb = TestBalancer::with(&[backend.addr()], |c| {
        c.accept_proxy = true;
        c.accept_proxy_timeout = timeout;
        c.workers = workers;
        c.health.interval = Duration::from_secs(3600);
    });
    (backend, lb)
}

/// Sends `bytes` (the write may fail once the balancer has closed) and
/// returns how long until the connection is closed by the balancer.
fn closed_after(addr: SocketAddr, bytes: &[u8]) -> Duration {
    let mut s = connect(addr).unwrap();
    let started = Instant::now();
    let _ = s.write_all(bytes);
    assert!(common::is_closed(&mut s), "left open after {bytes:?}");
    started.elapsed()
}

/// A client with a valid header and a payload is echoed the payload.
fn served(addr: SocketAddr, header: &[u8]) -> bool {
    let Ok(mut s) = connect(addr) else {
        return false;
    };
    let mut sent = header.to_vec();
    sent.extend(b"payload");
    let mut back = [0u8; 7];
    s.write_all(&sent).is_ok() && s.read_exact(&mut back).is_ok() && &back == b"payload"
}

/// The refusals counted, and that none of those clients reached the
/// backend.
fn assert_refused(lb: &TestBalancer, backend: &TestBackend, n: u64) {
    until("the refusals counted", || {
        lb.stats.snapshot().proxy_header_refused == n
    });
    assert_eq!(
        backend.accepted(),
        0,
        "a refused client reached the backend"
    );
}

/// Version 1 lines that never end are refused at the 107-byte bound, long
/// before the 10 s header timeout: one just over it, one of 10,000 bytes
/// with no line end, and one that streams 4 MiB (the balancer stops
/// reading and closes, so the sender's writes fail or it sees the close).
#[test]
fn v1_lines_that_never_end_are_refused_at_the_bound() {
    let (backend, lb) = behind_proxy(Duration::from_secs(10), 64);
    let mut just_over = b"PROXY TCP4 ".to_vec();
    just_over.resize(V1_MAX_LEN + 1, b'1');
    let mut long = b"PROXY ".to_vec();
    long.resize(10_000, b'9');
    for line in [just_over, long] {
        let took = closed_after(lb.addr, &line);
        assert!(took < Duration::from_secs(2), "{took:?}");
    }
    let mut s = connect(lb.addr).unwrap();
    let started = Instant::now();
    let chunk = [b'7'; 16 * 1024];
    let mut sent = 0usize;
    s.write_all(b"PROXY ").unwrap();
    while sent < 4 * 1024 * 1024 && s.write_all(&chunk).is_ok() {
        sent += chunk.len();
    }
    assert!(common::is_closed(&mut s));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_refused(&lb, &backend, 3);
    assert!(served(lb.addr, GOOD_V1));
    lb.stop();
}

/// Version 1 headers that lie: ports past 65535, signs and hex, bad or
/// mixed-up addresses, missing fields, a bad protocol word, a bare `\n`.
/// Each is refused at once and counted; none reaches the backend; a good
/// header still works afterwards.
#[test]
fn v1_headers_with_lying_ports_and_bad_addresses_are_refused() {
    let (backend, lb) = behind_proxy(Duration::from_secs(10), 64);
    let lies: &[&[u8]] = &[
        b"PROXY TCP4 192.0.2.1 198.51.100.7 99999 80\r\n",
        b"PROXY TCP4 192.0.2.1 198.51.100.7 65536 80\r\n",
        b"PROXY TCP4 192.0.2.1 198.51.100.7 18446744073709551617 80\r\n",
        b"PROXY TCP4 192.0.2.1 198.51.100.7 -1 80\r\n",
        b"PROXY TCP4 192.0.2.1 198.51.100.7 +80 80\r\n",
        b"PROXY TCP4 192.0.2.1 198.51.100.7 0x50 80\r\n",
        b"PROXY TCP4 192.0.2.1 198.51.100.7 80\r\n",
        b"PROXY TCP4 999.0.2.1 198.51.100.7 1 80\r\n",
        b"PROXY TCP4 192.0.2 198.51.100.7 1 80\r\n",
        b"PROXY TCP4 ::1 ::1 1 80\r\n",
        b"PROXY TCP6 192.0.2.1 198.51.100.7 1 80\r\n",
        b"PROXY TCP6 ::1::2 ::1 1 80\r\n",
        b"PROXY TCP5 192.0.2.1 198.51.100.7 1 80\r\n",
        b"PROXY TCP4  192.0.2.1 198.51.100.7 1 80\r\n",
        b"PROXY TCP4 192.0.2.1 198.51.100.7 1 80 extra\r\n",
        b"PROXY TCP4 192.0.2.1 198.51.100.7 1 80\n",
        b"PROXY TCP4 192.0.2.1\0 198.51.100.7 1 80\r\n",
        b"proxy TCP4 192.0.2.1 198.51.100.7 1 80\r\n",
    ];
    for lie in lies {
        let took = closed_after(lb.addr, lie);
        assert!(
            took < Duration::from_secs(2),
            "{:?} took {took:?}",
            String::from_utf8_lossy(lie)
        );
    }
    assert_refused(&lb, &backend, lies.len() as u64);
    assert!(served(lb.addr, GOOD_V1));
    lb.stop();
}

/// Sends `bytes` one at a time, `gap` apart, stopping at the first failed
/// write.
fn trickle(s: &mut TcpStream, bytes: &[u8], gap: Duration) {
    for b in bytes {
        if s.write_all(&[*b]).is_err() {
            return;
        }
        // Pacing is what this client is about, not ordering events.
        thread::sleep(gap);
    }
}

/// A header trickled byte by byte is taken when it is whole within the
/// header timeout (here 2 s), and the client is served; trickled slower,
/// the client is closed at the timeout, counted, and never reaches the
/// backend. The timeout is for the whole header, not per byte.
#[test]
fn a_trickled_header_is_taken_within_the_timeout_and_refused_beyond() {
    let (backend, lb) = behind_proxy(Duration::from_secs(2), 64);
    let mut s = connect(lb.addr).unwrap();
    trickle(&mut s, GOOD_V1, Duration::from_millis(5));
    s.write_all(b"after").unwrap();
    let mut back = [0u8; 5];
    s.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"after");
    drop(s);
    until("served", || backend.accepted() == 1);

    let mut slow = connect(lb.addr).unwrap();
    let started = Instant::now();
    // 44 bytes, 100 ms apart: 4.4 s, past the 2 s timeout.
    let writer = {
        let mut w = slow.try_clone().unwrap();
        thread::spawn(move || trickle(&mut w, GOOD_V1, Duration::from_millis(100)))
    };
    assert!(common::is_closed(&mut slow));
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(5),
        "{took:?}"
    );
    writer.join().unwrap();
    until("the slow one refused", || {
        lb.stats.snapshot().proxy_header_refused == 1
    });
    assert_eq!(backend.accepted(), 1);
    lb.stop();
}

/// A version 2 header: the signature, `ver_cmd`, `fam`, the length as
/// given, then `rest`.
fn v2(ver_cmd: u8, fam: u8, len: u16, rest: &[u8]) -> Vec<u8> {
    let mut h = V2_SIGNATURE.to_vec();
    h.extend([ver_cmd, fam]);
    h.extend(len.to_be_bytes());
    h.extend(rest);
    h
}

/// TCP4 addresses and ports, 12 bytes.
const V2_ADDRS: [u8; 12] = [192, 0, 2, 1, 198, 51, 100, 7, 0xc8, 0x12, 0, 80];

/// Version 2 headers with lying lengths: 65535 and any length past the
/// bound are refused at once, without waiting for the bytes; a TLV whose
/// length runs past the header, or an address block shorter than its
/// family needs, is refused at once; a length larger than what is sent
/// waits only until the header timeout (2 s). None reaches the backend.
#[test]
fn v2_headers_with_lying_lengths_are_refused() {
    let (backend, lb) = behind_proxy(Duration::from_secs(2), 64);
    let mut tlv_overrun = V2_ADDRS.to_vec();
    tlv_overrun.extend([0x04, 0xff, 0xff, 0x00]);
    let mut tlv_half = V2_ADDRS.to_vec();
    tlv_half.extend([0x04, 0x00]);
    let at_once = [
        v2(0x21, 0x11, 65535, &V2_ADDRS),
        v2(0x21, 0x11, 521 + 12, &V2_ADDRS),
        v2(0x21, 0x11, tlv_overrun.len() as u16, &tlv_overrun),
        v2(0x21, 0x11, tlv_half.len() as u16, &tlv_half),
        v2(0x21, 0x11, 4, &V2_ADDRS[..4]),
        v2(0x21, 0x21, 12, &V2_ADDRS),
    ];
    for h in &at_once {
        let took = closed_after(lb.addr, h);
        assert!(took < Duration::from_secs(1), "{h:?} took {took:?}");
    }
    // Says 100 bytes follow, sends 12, then waits: the timeout ends it.
    let took = closed_after(lb.addr, &v2(0x21, 0x11, 100, &V2_ADDRS));
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert_refused(&lb, &backend, at_once.len() as u64 + 1);
    assert!(served(lb.addr, &v2(0x21, 0x11, 12, &V2_ADDRS)));
    lb.stop();
}

/// Garbage after the version 2 signature (a version other than 2, an
/// unknown command, an unknown family), half a signature followed by
/// something else, and bytes that are no header at all (HTTP, TLS, zeros)
/// are refused at once and counted; the balancer keeps serving.
#[test]
fn garbage_after_the_signature_and_instead_of_a_header_is_refused() {
    let (backend, lb) = behind_proxy(Duration::from_secs(10), 64);
    let mut half_signature = V2_SIGNATURE[..6].to_vec();
    half_signature.extend(b"GET / HTTP/1.1\r\n");
    let garbage = [
        v2(0x31, 0x11, 12, &V2_ADDRS),
        v2(0x11, 0x11, 12, &V2_ADDRS),
        v2(0x2f, 0x11, 12, &V2_ADDRS),
        v2(0x21, 0x99, 12, &V2_ADDRS),
        half_signature,
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        vec![0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc],
        vec![0; 64],
        b"PROXY\r\n".to_vec(),
    ];
    for g in &garbage {
        let took = closed_after(lb.addr, g);
        assert!(took < Duration::from_secs(2), "{g:?} took {took:?}");
    }
    assert_refused(&lb, &backend, garbage.len() as u64);
    assert!(served(lb.addr, GOOD_V1));
    lb.stop();
}

/// A client that resets mid-header (half a version 1 line, half a version
/// 2 block) ends its own connection at once, not at the 10 s header
/// timeout, and is counted; the next client is served.
#[test]
fn a_reset_mid_header_ends_that_client_at_once() {
    let (backend, lb) = behind_proxy(Duration::from_secs(10), 64);
    let started = Instant::now();
    for half in [&GOOD_V1[..15], &v2(0x21, 0x11, 12, &V2_ADDRS)[..20]] {
        let mut s = connect(lb.addr).unwrap();
        s.write_all(half).unwrap();
        reset(s);
    }
    assert_refused(&lb, &backend, 2);
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(served(lb.addr, GOOD_V1));
    lb.stop();
}

/// 60 clients stall mid-header at once in front of 8 workers with a
/// 300 ms header timeout: the workers never exceed 8, each stalled client
/// costs one worker its timeout, and a client with a good header arriving
/// behind them is served within the time the stalled ones cost (60 / 8 x
/// 300 ms, about 2.3 s), well under 6 s. All 60 are counted.
#[test]
fn many_clients_stalled_mid_header_are_bounded_by_workers_and_timeout() {
    let (backend, lb) = behind_proxy(Duration::from_millis(300), 8);
    let stalled: Vec<TcpStream> = (0..60)
        .map(|_| {
            let mut s = connect(lb.addr).unwrap();
            s.write_all(b"PROXY TCP4 192.0.2.1 ").unwrap();
            s
        })
        .collect();
    let started = Instant::now();
    assert!(served(lb.addr, GOOD_V1));
    let took = started.elapsed();
    assert!(took < Duration::from_secs(6), "{took:?}");
    let s = lb.stats.snapshot();
    assert!(s.workers <= 8, "{s:?}");
    until("all 60 refused", || {
        lb.stats.snapshot().proxy_header_refused == 60
    });
    assert_eq!(backend.accepted(), 1);
    drop(stalled);
    lb.stop();
}

/// The binary as a child with `--accept-proxy --accept-proxy-timeout
/// 300ms --workers 4`: a never-ending line, a 65535-byte v2 length, a
/// stalled half header and 20 silent clients are all closed; it logs the
/// refusals in one line each (no type names), stays up and serves a
/// good header behind them.
#[test]
fn the_binary_refuses_hostile_headers_and_keeps_serving() {
    let backend = TestBackend::echo();
    let b = backend.addr().to_string();
    let mut child = Child::on_loopback(
        &[
            "-b",
            &b,
            "--accept-proxy",
            "--accept-proxy-timeout",
            "300ms",
            "--workers",
            "4",
        ],
        |_| {},
    );
    let mut never_ends = b"PROXY ".to_vec();
    never_ends.resize(4096, b'x');
    for bytes in [
        never_ends,
        v2(0x21, 0x11, 65535, &V2_ADDRS),
        GOOD_V1[..20].to_vec(),
    ] {
        assert!(closed_after(child.addr, &bytes) < Duration::from_secs(3));
    }
    let mut silent: Vec<TcpStream> = (0..20).map(|_| connect(child.addr).unwrap()).collect();
    assert!(served(child.addr, GOOD_V1), "{}", child.log());
    for s in &mut silent {
        assert!(common::is_closed(s));
    }
    assert!(child.alive());
    until("the refusals logged", || {
        child.log().contains("closing client 127.0.0.1:")
    });
    let log = child.log();
    assert!(!log.contains("panicked"), "{log}");
    for type_name in ["HeaderError", "TooLong", "Timeout {", "usize", "Refusal"] {
        assert!(!log.contains(type_name), "{type_name} in: {log}");
    }
}

/// A flood of clients behind a proxy with no backend available: each is
/// refused by the admission gate on its worker, and the log says so at
/// most once a second (with the count of the others), as for plain
/// clients, not once per client; every refused client's descriptor is
/// given back.
#[test]
fn a_flood_refused_after_the_header_logs_a_bounded_number_of_lines() {
    refused_flood_is_throttled(&["--accept-proxy"], GOOD_V1);
}

/// The binary with `extra` flags in front of a backend that is down, then
/// a flood of clients that each open with `opening` and are refused for
/// it by the admission gate on a worker: the log's "no backend" lines stay
/// at about one a second, and the refused clients' descriptors are given
/// back.
pub(crate) fn refused_flood_is_throttled(extra: &[&str], opening: &[u8]) {
    const CLIENTS: usize = 200;
    let dead = common::closed_port().to_string();
    let mut args = vec![
        "-b",
        &dead,
        "--health-check",
        "off",
        "--passive-failures",
        "1",
        "--health-cooldown",
        "10m",
        "--workers",
        "8",
    ];
    args.extend_from_slice(extra);
    let child = Child::on_loopback(&args, |_| {});
    // The first client's failed connect marks the one backend down.
    assert!(closed_after(child.addr, opening) < Duration::from_secs(5));
    until("the backend marked down", || {
        child.log().contains("is now DOWN")
    });
    let baseline = child.open_fds();
    let started = Instant::now();
    for _ in 0..CLIENTS {
        assert!(closed_after(child.addr, opening) < Duration::from_secs(5));
    }
    let seconds = started.elapsed().as_secs() as usize;
    let lines = || {
        child
            .log()
            .lines()
            .filter(|l| l.contains("no backend is available"))
            .count()
    };
    until("the refusals logged", || lines() > 0);
    let logged = lines();
    assert!(
        logged <= seconds + 2,
        "{logged} lines for {CLIENTS} refusals in {seconds} s:\n{}",
        child.log()
    );
    until("the refused clients' descriptors given back", || {
        child.open_fds() <= baseline
    });
}

/// Out of descriptors with every worker between its client and its
/// backend: the binary with `--accept-proxy`, 4 workers and 48 open files
/// (a limit it cannot raise). Sixty clients connect and send nothing: the
/// workers take the first four and wait for their headers, the accept loop
/// takes clients until no descriptor is left. Then each client sends its
/// header and a byte, one after another: the four workers need a backend
/// socket at once with none free and no connection open that could end
/// and free one. Each takes one of the descriptors the process keeps for
/// this; every client is served, none waits out a timeout, and the
/// descriptors come back to where they were.
#[test]
fn out_of_descriptors_with_every_worker_before_its_backend_each_client_is_served() {
    const MANY: usize = 60;
    let backend = TestBackend::echo();
    let b = backend.addr().to_string();
    let args = [
        "-b",
        &b,
        "--health-check",
        "off",
        "--accept-proxy",
        "--accept-proxy-timeout",
        "20s",
        "--connect-timeout",
        "20s",
        "--workers",
        "4",
    ];
    let mut child = Child::on_loopback(&args, |c| {
        c.env("RUST_LOG", "warn");
        common::limit_in_child(c, libc::RLIMIT_NOFILE, 48);
    });
    assert!(served(child.addr, GOOD_V1), "{}", child.log());
    let fds = child.open_fds();
    let mut clients: Vec<TcpStream> = (0..MANY).map(|_| connect(child.addr).unwrap()).collect();
    until("out of descriptors", || {
        child.log().contains("Too many open files")
    });
    let started = Instant::now();
    for (i, s) in clients.iter_mut().enumerate() {
        let byte = [i as u8];
        s.write_all(GOOD_V1).unwrap();
        s.write_all(&byte).unwrap();
        let mut back = [0u8];
        let read = s.read_exact(&mut back);
        assert!(
            read.is_ok() && back == byte,
            "client {i}: {read:?} after {:?}: {}",
            started.elapsed(),
            child.log()
        );
        s.shutdown(std::net::Shutdown::Both).unwrap();
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}: {}",
        started.elapsed(),
        child.log()
    );
    drop(clients);
    until("the descriptors back", || child.open_fds() <= fds);
    let log = child.log();
    assert!(!log.contains("giving up"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
    assert!(child.alive());
}

/// The same shortage across two services, which share the descriptors
/// kept aside, with clients that leave badly: the binary with two services
/// behind `--accept-proxy`, 4 workers, 64 open files. Eighty clients, one
/// in two on each service, connect and send nothing until the accept loops
/// have run out of descriptors; then one in four resets before any byte,
/// one in four sends half a header and resets, and the others send their
/// header and a byte. Every one of those is echoed; the resets
/// end only their own connections; the descriptors come back to where
/// they were (so the kept ones are whole again) and each service serves a
/// new client.
#[test]
fn two_services_out_of_descriptors_with_resets_mid_header_serve_the_rest() {
    const MANY: usize = 80;
    let backend = TestBackend::echo();
    let dir = crate::child::Scratch::new("hostile-reserve-two");
    let path = dir.path("two.json");
    let service = |name: &str| {
        format!(
            r#"{{"name": "{name}", "listen": "127.0.0.1:0", "backends": ["{}"],
                "health_check": "off"}}"#,
            backend.addr()
        )
    };
    std::fs::write(
        &path,
        format!(
            r#"{{"workers": 4, "accept_proxy": true, "accept_proxy_timeout": "20s",
                "connect_timeout": "20s", "services": [{}, {}]}}"#,
            service("a"),
            service("b")
        ),
    )
    .unwrap();
    let mut command = crate::child::command(&["--allow-root", "-c"]);
    command.arg(&path).env("RUST_LOG", "warn");
    common::limit_in_child(&mut command, libc::RLIMIT_NOFILE, 64);
    let mut child = Child::spawn(&mut command);
    child.listening();
    let mut addrs = Vec::new();
    let both = common::wait_for(common::IO_TIMEOUT, || {
        addrs = child.listening_now();
        addrs.len() == 2
    });
    assert!(both, "{addrs:?}: {}", child.log());
    for &addr in &addrs {
        assert!(served(addr, GOOD_V1), "{addr}: {}", child.log());
    }
    let ports: Vec<u16> = addrs.iter().map(SocketAddr::port).collect();
    until("the first clients' sockets closed", || {
        crate::balancer_port::sockets_on(&ports) == 0
    });
    let fds = child.open_fds();
    let clients: Vec<TcpStream> = (0..MANY).map(|i| connect(addrs[i % 2]).unwrap()).collect();
    until("out of descriptors", || {
        child.log().contains("Too many open files")
    });
    // Every client says its part before any echo is read: the two accept
    // loops fill one queue in no fixed order, so a worker may take any of
    // them next, and must find what it waits for.
    let started = Instant::now();
    let mut kept = Vec::new();
    for (i, mut s) in clients.into_iter().enumerate() {
        match i % 4 {
            1 => reset(s),
            3 => {
                s.write_all(&GOOD_V1[..12]).unwrap();
                reset(s);
            }
            _ => {
                s.write_all(GOOD_V1).unwrap();
                s.write_all(&[i as u8]).unwrap();
                kept.push((i, s));
            }
        }
    }
    for (i, mut s) in kept {
        let mut back = [0u8];
        let read = s.read_exact(&mut back);
        assert!(
            read.is_ok() && back == [i as u8],
            "client {i}: {read:?} after {:?}: {}",
            started.elapsed(),
            child.log()
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}: {}",
        started.elapsed(),
        child.log()
    );
    until("the descriptors back", || child.open_fds() <= fds);
    for &addr in &addrs {
        assert!(served(addr, GOOD_V1), "{addr} after: {}", child.log());
    }
    let log = child.log();
    assert!(!log.contains("giving up"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
    assert!(child.alive());
}
