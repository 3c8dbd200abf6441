//! TLS termination attacked: garbage instead of a ClientHello, a
//! ClientHello trickled byte by byte, a 16 KiB ClientHello, handshakes
//! that never finish, a thousand failed handshakes, a reload with a
//! bad certificate, the `tls` health check of a re-encrypting service
//! against backends that say nothing, trickle or send garbage, and
//! descriptors run out while handshakes and SNI peeks are pending. Each handshake is bounded by `tls_handshake_timeout`,
//! each failure counted by its reason, and no backend is ever connected
//! for a client that did not finish its handshake.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use crate::child::{self, Child};
use crate::common::{wait_for, TestBackend, TestBalancer};
use crate::tls_certs::{connect, subject_of, Certs};
use rodizio::tls_term::CertList;

/// A TLS balancer over an echo backend, handshakes bounded by `timeout`,
/// at most `workers` workers.
fn start(certs: &Certs, timeout: Duration, workers: usize) -> (TestBalancer, TestBackend) {
    let pair = certs.issue("a", &["localhost"], 1);
    let backend = TestBackend::echo();
    let b = TestBalancer::with(&[backend.addr()], |c| {
        c.tls.certs = CertList(vec![pair.setting()]);
        c.tls.handshake_timeout = timeout;
        c.workers = workers;
    });
    (b, backend)
}

fn raw(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Reads until the server closes (or resets); what it sent.
fn until_closed(s: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// A plain HTTP request on the TLS port is answered with at most an alert
/// and closed at once; counted as not TLS; no backend is connected.
#[test]
fn garbage_instead_of_a_client_hello() {
    let certs = Certs::new();
    let (b, backend) = start(&certs, Duration::from_secs(10), 16);
    let started = Instant::now();
    let mut s = raw(b.addr);
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let got = until_closed(&mut s);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // Nothing but a TLS alert record (type 21), if anything.
    assert!(got.is_empty() || got[0] == 21, "{got:?}");
    assert!(wait_for(Duration::from_secs(10), || {
        b.stats.snapshot().tls_handshake_failures_not_tls == 1
    }));
    assert_eq!(backend.accepted(), 0);
}

/// The ClientHello of a real client (rustls) sent one byte at a time: the
/// handshake still finishes and bytes flow.
#[test]
fn a_client_hello_trickled_byte_by_byte() {
    let certs = Certs::new();
    let (b, _backend) = start(&certs, Duration::from_secs(20), 16);
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let mut conn =
        rustls::ClientConnection::new(crate::tls_certs::client_config(&certs.ca()), name).unwrap();
    let mut hello = Vec::new();
    conn.write_tls(&mut hello).unwrap();
    let mut s = raw(b.addr);
    s.set_nodelay(true).unwrap();
    for byte in &hello {
        s.write_all(std::slice::from_ref(byte)).unwrap();
        // A pause so that each byte leaves in its own segment.
        thread::sleep(Duration::from_millis(1));
    }
    let mut stream = rustls::StreamOwned::new(conn, s);
    while stream.conn.is_handshaking() {
        stream.conn.complete_io(&mut stream.sock).unwrap();
    }
    stream.write_all(b"ping").unwrap();
    let mut buf = [0u8; 4];
    stream.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ping");
    assert!(hello.len() > 100, "{}", hello.len());
}

/// A TLS 1.2 ClientHello of about 16 KiB (thousands of cipher suites),
/// over two records: read whole and answered with a ServerHello.
#[test]
fn a_16_kib_client_hello() {
    let certs = Certs::new();
    let (b, _backend) = start(&certs, Duration::from_secs(10), 16);
    let hello = big_client_hello(16 * 1024);
    let mut s = raw(b.addr);
    s.write_all(&hello).unwrap();
    let mut head = [0u8; 6];
    s.read_exact(&mut head).unwrap();
    // A handshake record whose first message is a ServerHello (2).
    assert_eq!((head[0], head[5]), (22, 2), "{head:?}");
}

/// A ClientHello of `size` bytes or more, cut into records of at most
/// 16 KiB: TLS 1.2, ECDHE-ECDSA-AES128-GCM-SHA256 among thousands of
/// unknown suites.
fn big_client_hello(size: usize) -> Vec<u8> {
    let mut body = vec![3, 3];
    body.extend([7u8; 32]); // random
    body.push(0); // no session id
    let unknown = size / 2;
    let mut suites: Vec<u8> = (0..unknown as u16)
        .flat_map(|i| (0xd000u16.wrapping_add(i % 0x0f00)).to_be_bytes())
        .collect();
    suites.extend([0xc0, 0x2b]);
    body.extend((suites.len() as u16).to_be_bytes());
    body.extend(suites);
    body.extend([1, 0]); // compression: null
    let mut ext = Vec::new();
    // supported_groups: secp256r1, x25519.
    ext.extend([0x00, 0x0a, 0x00, 0x06, 0x00, 0x04, 0x00, 0x17, 0x00, 0x1d]);
    // ec_point_formats: uncompressed.
    ext.extend([0x00, 0x0b, 0x00, 0x02, 0x01, 0x00]);
    // signature_algorithms: ecdsa_secp256r1_sha256.
    ext.extend([0x00, 0x0d, 0x00, 0x04, 0x00, 0x02, 0x04, 0x03]);
    // extended_master_secret.
    ext.extend([0x00, 0x17, 0x00, 0x00]);
    body.extend((ext.len() as u16).to_be_bytes());
    body.extend(ext);
    let mut message = vec![1]; // ClientHello
    message.extend(&(body.len() as u32).to_be_bytes()[1..]);
    message.extend(body);
    let mut out = Vec::new();
    for chunk in message.chunks(16 * 1024) {
        out.extend([22, 3, 1]);
        out.extend((chunk.len() as u16).to_be_bytes());
        out.extend(chunk);
    }
    out
}

/// Clients that never finish: silent, or half a ClientHello. Each is closed
/// once the handshake timeout passes, its worker freed; counted as
/// timeouts; no backend connected.
#[test]
fn a_handshake_that_never_finishes_is_bounded() {
    let certs = Certs::new();
    let (b, backend) = start(&certs, Duration::from_secs(1), 16);
    let half = &big_client_hello(200)[..40];
    let started = Instant::now();
    let mut silent = raw(b.addr);
    let mut partial = raw(b.addr);
    partial.write_all(half).unwrap();
    assert!(until_closed(&mut silent).is_empty());
    until_closed(&mut partial);
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(900), "{took:?}");
    assert!(took < Duration::from_secs(15), "{took:?}");
    assert!(wait_for(Duration::from_secs(10), || {
        let s = b.stats.snapshot();
        s.tls_handshake_failures_timeout == 2 && s.workers_busy == 0
    }));
    assert_eq!(backend.accepted(), 0);
}

/// A thousand failed handshakes, 50 at a time: each closed, each counted by
/// its reason, the workers stay within their limit, and a real client is
/// served afterwards.
#[test]
fn a_thousand_failed_handshakes() {
    let certs = Certs::new();
    let (b, backend) = start(&certs, Duration::from_secs(10), 32);
    let addr = b.addr;
    let per_thread = 20;
    let threads: Vec<_> = (0..50)
        .map(|i| {
            thread::spawn(move || {
                for j in 0..per_thread {
                    let mut s = raw(addr);
                    if (i + j) % 2 == 0 {
                        let _ = s.write_all(b"\x16\x03\x01\x00\x05garbage-after-a-header");
                    } else {
                        let _ = s.write_all(b"SSH-2.0-OpenSSH_9.2\r\n");
                    }
                    until_closed(&mut s);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(
        wait_for(Duration::from_secs(20), || {
            let s = b.stats.snapshot();
            s.tls_handshake_failures_not_tls + s.tls_handshake_failures_protocol == 1000
        }),
        "{:?}",
        b.stats.snapshot()
    );
    let s = b.stats.snapshot();
    assert!(s.tls_handshake_failures_not_tls >= 500, "{s:?}");
    assert!(s.workers <= 32, "{s:?}");
    assert_eq!(backend.accepted(), 0);
    let mut ok = connect(addr, "localhost", &certs.ca()).unwrap();
    ok.write_all(b"still").unwrap();
    let mut buf = [0u8; 5];
    ok.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"still");
}

/// A reload whose certificate is bad (its key is another's, or the file
/// is garbage) is refused in one line, and the old certificate is still
/// served.
#[test]
fn a_reload_with_a_bad_certificate_keeps_the_old_one() {
    let certs = Certs::new();
    let good = certs.issue("site", &["one.localhost", "localhost"], 1);
    let other = certs.issue("other", &["localhost"], 2);
    let backend = TestBackend::echo();
    let config = certs.dir.join("rodizio.json");
    std::fs::write(
        &config,
        format!(
            r#"{{"listen": "127.0.0.1:0", "backends": ["{}"], "tls_certs": [{}]}}"#,
            backend.addr(),
            good.json()
        ),
    )
    .unwrap();
    let r = Child::balancer(&["-c", config.to_str().unwrap()]);
    // The certificate renewed wrong: another's key, then garbage.
    std::fs::copy(&other.cert, &good.cert).unwrap();
    r.signal(libc::SIGHUP);
    assert!(
        wait_for(Duration::from_secs(20), || r
            .log()
            .contains("do not make a pair")),
        "{}",
        r.log()
    );
    std::fs::write(&good.cert, "not a certificate\n").unwrap();
    r.signal(libc::SIGHUP);
    assert!(
        wait_for(Duration::from_secs(20), || r
            .log()
            .contains("holds no PEM certificate")),
        "{}",
        r.log()
    );
    let c = connect(r.addr, "localhost", &certs.ca()).unwrap();
    assert!(subject_of(&c).contains("one.localhost"), "{}", r.log());
}

/// A backend that accepts and treats each connection with `behave` (on a
/// thread of its own, every socket with a timeout); stopped when dropped.
struct FakeBackend {
    addr: SocketAddr,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl FakeBackend {
    fn start(behave: fn(TcpStream)) -> FakeBackend {
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = std::sync::Arc::clone(&stop);
        let thread = thread::spawn(move || {
            for s in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(s) = s else { continue };
                let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
                let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
                thread::spawn(move || behave(s));
            }
        });
        FakeBackend {
            addr,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for FakeBackend {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        // Wake the blocked accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(5));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A re-encrypting balancer over `addr`, its `tls` check every 200 ms
/// bounded by 1 s, one failure enough to mark it down.
fn tls_checked(certs: &Certs, addr: SocketAddr) -> TestBalancer {
    TestBalancer::with(&[addr], |c| {
        c.tls.backend = true;
        c.tls.backend_ca = Some(certs.ca());
        c.tls.backend_server_name = Some("backend.test".into());
        c.health.check = rodizio::health::CheckKind::Tls;
        c.health.interval = Duration::from_millis(200);
        c.health.timeout = Duration::from_secs(1);
        c.health.fall = 1;
        c.health.rise = 1;
    })
}

/// Waits until `addr`'s backend is down with a last check; its reason and
/// how long that check took.
fn down_with(b: &TestBalancer, addr: SocketAddr) -> (String, Duration) {
    let backend = b.backend(addr);
    let mut last = None;
    let held = wait_for(Duration::from_secs(20), || {
        last = backend.last_check();
        !backend.is_healthy() && last.as_ref().is_some_and(|r| r.error.is_some())
    });
    assert!(held, "{last:?}");
    let last = last.unwrap();
    (last.error.unwrap(), last.took)
}

/// Reads until the peer closes or the read times out.
fn hold(mut s: TcpStream) {
    let mut buf = [0u8; 4096];
    while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
}

/// The `tls` check of a re-encrypting service against a backend that
/// accepts and says nothing: down, each check ended by the health timeout
/// (1 s), not held longer.
#[test]
fn the_tls_check_against_a_silent_backend_ends_at_its_timeout() {
    let certs = Certs::new();
    let silent = FakeBackend::start(hold);
    let b = tls_checked(&certs, silent.addr);
    let (reason, took) = down_with(&b, silent.addr);
    assert!(reason.contains("timed out"), "{reason}");
    assert!(took >= Duration::from_millis(900), "{took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
}

/// A backend that trickles a handshake record one byte every 100 ms: each
/// byte would renew a plain socket timeout, but the check is bounded by
/// its deadline.
#[test]
fn the_tls_check_against_a_trickling_backend_ends_at_its_timeout() {
    let certs = Certs::new();
    let trickle = FakeBackend::start(|mut s| {
        let mut record = vec![22, 3, 3, 0x40, 0x00, 2, 0, 0x3f, 0xfc];
        record.resize(2000, 0);
        for byte in record {
            if s.write_all(&[byte]).is_err() {
                return;
            }
            thread::sleep(Duration::from_millis(100));
        }
    });
    let b = tls_checked(&certs, trickle.addr);
    let (reason, took) = down_with(&b, trickle.addr);
    assert!(reason.contains("timed out"), "{reason}");
    assert!(took < Duration::from_secs(3), "{took:?}");
}

/// A backend that answers the ClientHello with garbage (an HTTP error, a
/// record that lies about its length): down at once, the reason saying it
/// is not TLS.
#[test]
fn the_tls_check_against_a_garbage_backend_is_down() {
    let certs = Certs::new();
    let http = FakeBackend::start(|mut s| {
        let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n");
        hold(s);
    });
    let b = tls_checked(&certs, http.addr);
    let (reason, took) = down_with(&b, http.addr);
    assert!(reason.contains("does not speak TLS"), "{reason}");
    assert!(took < Duration::from_millis(900), "{took:?}");
    let liar = FakeBackend::start(|mut s| {
        // A handshake record announcing 65 535 bytes: more than TLS allows.
        let _ = s.write_all(&[22, 3, 3, 0xff, 0xff, 2, 0, 0, 1]);
        hold(s);
    });
    let b = tls_checked(&certs, liar.addr);
    let (reason, _) = down_with(&b, liar.addr);
    assert!(reason.starts_with("tls: "), "{reason}");
    assert!(!reason.contains("timed out"), "{reason}");
}

/// The rodizio binary with `args` (and `RUST_LOG=warn`) and at most
/// `nofile` descriptors (soft and hard, set between fork and exec),
/// listening.
fn limited(args: &[&str], nofile: libc::rlim_t) -> Child {
    let mut command = child::command(&[&["--allow-root"], args].concat());
    command.env("RUST_LOG", "warn");
    crate::common::limit_in_child(&mut command, libc::RLIMIT_NOFILE, nofile);
    Child::start(&mut command)
}

/// Opens clients on `addr` until the balancer logs that it is out of
/// descriptors (every third sends half a ClientHello, the others
/// nothing: all handshakes or peeks pending); closes them all; the
/// process is still running, and a fresh TLS client for `name` is served
/// (echoed) once descriptors are free.
fn exhaust_then_serve(r: &mut Child, name: &str, ca: &std::path::Path) {
    let half = &big_client_hello(200)[..40];
    let mut open = Vec::new();
    let mut out_of_fds = false;
    for i in 0..600 {
        let Ok(mut s) = TcpStream::connect_timeout(&r.addr, Duration::from_secs(2)) else {
            break;
        };
        s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        if i % 3 == 0 {
            let _ = s.write_all(half);
        }
        open.push(s);
        if i % 20 == 19 && r.stderr.text().contains("Too many open files") {
            out_of_fds = true;
            break;
        }
    }
    assert!(
        out_of_fds
            || wait_for(Duration::from_secs(20), || r
                .stderr
                .text()
                .contains("Too many open files")),
        "never ran out of descriptors with {} clients: {}",
        open.len(),
        r.stderr.text()
    );
    drop(open);
    assert!(r.alive(), "{}", r.stderr.text());
    let mut echoed = false;
    let served = wait_for(Duration::from_secs(30), || {
        let Ok(mut c) = connect(r.addr, name, ca) else {
            return false;
        };
        let mut buf = [0u8; 5];
        echoed = c.write_all(b"fresh").is_ok() && c.read_exact(&mut buf).is_ok();
        echoed && &buf == b"fresh"
    });
    assert!(served, "no fresh client served: {}", r.stderr.text());
    assert!(r.alive(), "{}", r.stderr.text());
}

/// Out of descriptors while TLS handshakes are pending: a terminating
/// balancer limited to 96 descriptors, flooded with clients that never
/// finish their handshake, logs the accept failures, keeps running, and
/// serves a fresh TLS client once they are gone.
#[test]
fn out_of_descriptors_during_tls_handshakes() {
    let certs = Certs::new();
    let pair = certs.issue("a", &["localhost"], 1);
    let backend = TestBackend::echo();
    let mut r = limited(
        &[
            "-l",
            "127.0.0.1:0",
            "-b",
            &backend.addr().to_string(),
            "--tls-cert",
            &pair.flag(),
            "--tls-handshake-timeout",
            "60s",
            "--health-check",
            "off",
        ],
        96,
    );
    exhaust_then_serve(&mut r, "localhost", &certs.ca());
}

/// Out of descriptors while ClientHellos are being peeked (SNI routing,
/// no termination): the same flood against a balancer routing `a.test`
/// to a TLS backend; it keeps running and routes a fresh client, whose
/// handshake is the backend's.
#[test]
fn out_of_descriptors_during_sni_peeks() {
    let certs = Certs::new();
    let pair = certs.issue("a", &["a.test"], 1);
    let echo = TestBackend::echo();
    let tls_backend = TestBalancer::with(&[echo.addr()], |c| {
        c.tls.certs = CertList(vec![pair.setting()]);
    });
    let mut r = limited(
        &[
            "-l",
            "127.0.0.1:0",
            "-b",
            &tls_backend.addr.to_string(),
            "--server-names",
            "a.test",
            "--sni-timeout",
            "60s",
            "--health-check",
            "off",
        ],
        96,
    );
    exhaust_then_serve(&mut r, "a.test", &certs.ca());
}
