//! The admin API: lying and huge lengths, slow heads and bodies, many
//! connections, a slowloris flood, garbage, resets, the descriptor
//! ceiling, and a bounded random fuzzer while proxy traffic flows. The process must live, the
//! proxy lose nothing, and the API answer again at once.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::*;
use rodizio::admin::{BODY_DEADLINE, HEAD_DEADLINE, IDLE_TIMEOUT, MAX_BODY, MAX_CONNECTIONS};
use rodizio::Config;

use crate::child::{Child, Scratch};

/// A socket with short timeouts: an attack that hangs the server fails
/// the test instead of hanging it.
fn dial(addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    Ok(s)
}

/// The status of the answer to `raw`, sent whole; `None` when the server
/// closed without one.
fn status_of(addr: SocketAddr, raw: &[u8]) -> Option<u16> {
    let mut s = dial(addr, Duration::from_secs(5)).ok()?;
    let _ = s.write_all(raw);
    read_status(&mut s)
}

/// Reads until the status line is in (or the close); its status.
fn read_status(s: &mut TcpStream) -> Option<u16> {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.windows(2).any(|w| w == b"\r\n") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    let line = String::from_utf8_lossy(&got);
    line.split(' ').nth(1)?.get(..3)?.parse().ok()
}

/// `GET path` with a token or none; the status, or `None`.
fn get(addr: SocketAddr, path: &str) -> Option<u16> {
    let head = format!("GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    status_of(addr, head.as_bytes())
}

/// How long until `GET /backends` is answered 200, if within `limit`.
fn answered_within(admin: SocketAddr, limit: Duration) -> Option<Duration> {
    time_until(limit, || get(admin, "/backends") == Some(200))
}

/// The balancer binary, a child with its admin API, both on port 0 (their
/// addresses read from what it prints); killed on drop.
struct Rodizio {
    child: Child,
    stderr: Collected,
    addr: SocketAddr,
    admin: SocketAddr,
}

impl Rodizio {
    fn start(backend: SocketAddr, extra: &[&str], nofile: Option<libc::rlim_t>) -> Rodizio {
        let mut command = crate::child::command(&[
            "-l",
            "127.0.0.1:0",
            "-b",
            &backend.to_string(),
            "--admin",
            "127.0.0.1:0",
            "--allow-root",
        ]);
        // Warnings, and the admin API's line with its address.
        command
            .args(extra)
            .env("RUST_LOG", "warn,rodizio::admin=info");
        if let Some(n) = nofile {
            limit_in_child(&mut command, libc::RLIMIT_NOFILE, n);
        }
        let child = Child::start(&mut command);
        let admin = child.admin();
        Rodizio {
            stderr: child.stderr.clone(),
            addr: child.addr,
            admin,
            child,
        }
    }

    fn alive(&mut self) -> bool {
        self.child.alive()
    }
}

/// One echo round trip of `n` bytes through the balancer.
fn echo_ok(addr: SocketAddr, n: usize) -> bool {
    let Ok(s) = dial(addr, Duration::from_secs(10)) else {
        return false;
    };
    let data = Arc::new(test_data(n, n as u64));
    matches!(echo_through(s, Arc::clone(&data)), Ok(back) if back == *data)
}

/// A `Content-Length` of a terabyte, on every path, with and without the
/// token: answered (413, or 401 first when a token is wanted) and the
/// process lives on. tiny_http allocated the announced length to drain it
/// and aborted the whole balancer.
#[test]
fn a_lying_content_length_is_answered_and_the_process_lives() {
    let echo = TestBackend::echo();
    let dir = Scratch::new("hostile-admin-token");
    let token = dir.path("token");
    std::fs::write(&token, "tok\n").unwrap();
    for extra in [vec![], vec!["--admin-token-file", token.to_str().unwrap()]] {
        let mut lb = Rodizio::start(echo.addr(), &extra, None);
        let auth = if extra.is_empty() { 413 } else { 401 };
        for path in ["/metrics", "/backends", "/", "/reload", "/nope"] {
            for method in ["GET", "POST", "PUT"] {
                let head = format!(
                    "{method} {path} HTTP/1.1\r\nHost: a\r\nContent-Length: 1000000000000\r\n\r\n"
                );
                assert_eq!(
                    status_of(lb.admin, head.as_bytes()),
                    Some(auth),
                    "{method} {path}"
                );
            }
        }
        // Announced within the limit, sent in part, then the client resets.
        let mut s = dial(lb.admin, Duration::from_secs(5)).unwrap();
        s.write_all(b"POST /backends HTTP/1.1\r\nHost: a\r\nContent-Length: 60000\r\n\r\n{")
            .unwrap();
        socket2::SockRef::from(&s)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(s);
        assert!(lb.alive(), "rodizio died: {}", lb.stderr.text());
        assert!(echo_ok(lb.addr, 100_000), "the proxy still works");
    }
}

/// Four (and then a hundred) clients announcing bodies they never send,
/// over the limit or under it, do not freeze the API: it answers at once
/// meanwhile, the ones over the limit get 413 at once, the others 408 at
/// the body deadline.
#[test]
fn unsent_bodies_do_not_freeze_the_api() {
    let echo = TestBackend::echo();
    let lb = TestBalancer::start(Config {
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        ..config(&[echo.addr()])
    });
    let admin = lb.admin.unwrap();
    for clients in [4, 100] {
        let mut over = Vec::new();
        let mut under = Vec::new();
        for i in 0..clients {
            let mut s = dial(admin, Duration::from_secs(10)).unwrap();
            let length = if i % 2 == 0 { 100_000 } else { 1_000 };
            let head =
                format!("POST /backends HTTP/1.1\r\nHost: a\r\nContent-Length: {length}\r\n\r\n");
            s.write_all(head.as_bytes()).unwrap();
            if length > MAX_BODY {
                over.push(s);
            } else {
                under.push(s);
            }
        }
        let t = answered_within(admin, Duration::from_secs(1));
        assert!(t.is_some(), "{clients} clients froze the API");
        let started = Instant::now();
        for s in &mut over {
            assert_eq!(read_status(s), Some(413));
        }
        assert!(started.elapsed() < BODY_DEADLINE, "413 at once");
        for s in &mut under {
            assert_eq!(read_status(s), Some(408));
        }
        assert!(started.elapsed() < BODY_DEADLINE + Duration::from_secs(3));
    }
    assert!(echo_ok(lb.addr, 10_000));
    lb.stop();
}

/// A head that never ends is cut at the head deadline; a huge head, a
/// huge line, a thousand headers and garbage are refused, and a chunked
/// body that lies about its chunk sizes or grows past the limit gets 413
/// or 400, never a crash.
#[test]
fn slow_huge_and_garbage_requests_are_refused() {
    let echo = TestBackend::echo();
    let lb = TestBalancer::start(Config {
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        ..config(&[echo.addr()])
    });
    let admin = lb.admin.unwrap();
    // Slow head.
    let mut slow = dial(admin, HEAD_DEADLINE * 3).unwrap();
    slow.write_all(b"GET /backends HTTP/1.1\r\nHost: a\r\n")
        .unwrap();
    let started = Instant::now();
    let mut rest = Vec::new();
    let end = slow.read_to_end(&mut rest);
    let cut = match &end {
        Ok(_) => true,
        Err(e) => e.kind() == io::ErrorKind::ConnectionReset,
    };
    assert!(cut, "the slow head was not cut: {end:?}");
    assert!(started.elapsed() < HEAD_DEADLINE + Duration::from_secs(3));
    let huge_line = format!("GET /{} HTTP/1.1\r\nHost: a\r\n\r\n", "a".repeat(1 << 20));
    let many: String = (0..1000).map(|i| format!("X-{i}: {i}\r\n")).collect();
    let many = format!("GET / HTTP/1.1\r\nHost: a\r\n{many}\r\n");
    let huge_header = format!(
        "GET / HTTP/1.1\r\nHost: a\r\nX: {}\r\n\r\n",
        "b".repeat(1 << 20)
    );
    let mut big_chunks =
        b"POST /backends HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..20 {
        big_chunks.extend_from_slice(b"1000\r\n");
        big_chunks.extend_from_slice(&[b' '; 0x1000]);
        big_chunks.extend_from_slice(b"\r\n");
    }
    let cases: Vec<(&str, Vec<u8>, &[u16])> = vec![
        ("huge request line", huge_line.into_bytes(), &[414, 431, 400]),
        ("a thousand headers", many.into_bytes(), &[431, 400]),
        ("huge header", huge_header.into_bytes(), &[431, 400]),
        ("garbage", test_data(10_000, 7), &[400]),
        ("binary request line", b"\x00\x01\x02 / HTTP/1.1\r\n\r\n".to_vec(), &[400]),
        (
            "a chunk size past u64",
            b"POST /backends HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFFFF\r\nx".to_vec(),
            &[400, 413],
        ),
        (
            "a chunk of a terabyte",
            b"POST /backends HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nE8D4A51000\r\nxx".to_vec(),
            &[413, 408],
        ),
        ("chunks past the limit", big_chunks, &[413]),
        (
            "100-continue over the limit",
            b"POST /backends HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 999999999\r\n\r\n".to_vec(),
            &[413],
        ),
        (
            "two lengths",
            b"POST /backends HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nContent-Length: 900000\r\n\r\n{}".to_vec(),
            &[400],
        ),
    ];
    for (what, raw, allowed) in cases {
        let status = status_of(admin, &raw);
        // A refusal may also be the close itself (the server need not
        // read a megabyte to refuse it).
        assert!(
            status.map_or(true, |s| allowed.contains(&s)),
            "{what}: {status:?}, expected one of {allowed:?}"
        );
        assert_eq!(get(admin, "/backends"), Some(200), "after {what}");
    }
    assert!(echo_ok(lb.addr, 10_000));
    lb.stop();
}

/// More connections than the API serves at once: each one beyond closes
/// the oldest still waiting for its request head (here: the first 20,
/// which sent nothing), and once they all close the API answers within a
/// second. A keep-alive connection gone quiet is closed at the head
/// deadline (the next request's head is awaited from the moment the answer
/// was sent).
#[test]
fn many_idle_connections_are_bounded_and_closed() {
    let echo = TestBackend::echo();
    let lb = TestBalancer::start(Config {
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        ..config(&[echo.addr()])
    });
    let admin = lb.admin.unwrap();
    let held: Vec<TcpStream> = (0..MAX_CONNECTIONS + 20)
        .map(|_| dial(admin, Duration::from_secs(10)).unwrap())
        .collect();
    until("20 connections made room", || {
        lb.stats.snapshot().admin_evictions >= 20
    });
    // Looked at without waiting: the others must still be open, well
    // before their head deadline.
    let closed = |s: &TcpStream| {
        let mut s = s.try_clone().unwrap();
        s.set_nonblocking(true).unwrap();
        match s.read(&mut [0u8; 1]) {
            Ok(n) => n == 0,
            Err(e) => e.kind() != io::ErrorKind::WouldBlock,
        }
    };
    until("the 20 oldest are closed", || held[..20].iter().all(closed));
    let others = held[20..].iter().filter(|s| closed(s)).count();
    assert_eq!(others, 0, "the newer ones are open");
    drop(held);
    assert!(
        answered_within(admin, Duration::from_secs(1)).is_some(),
        "answers within 1 s once they closed"
    );
    let snapshot = lb.stats.snapshot();
    assert_eq!(snapshot.admin_connections_refused, 0, "{snapshot:?}");
    // One keep-alive client that asks once and then stays silent.
    let mut quiet = dial(admin, IDLE_TIMEOUT * 2).unwrap();
    quiet
        .write_all(b"GET /config HTTP/1.1\r\nHost: a\r\n\r\n")
        .unwrap();
    assert_eq!(read_status(&mut quiet), Some(200));
    let quiet_since = Instant::now();
    // The quiet one is closed at the head deadline (its answer was read).
    let mut rest = Vec::new();
    let _ = quiet.read_to_end(&mut rest);
    let waited = quiet_since.elapsed();
    assert!(
        waited >= HEAD_DEADLINE - Duration::from_secs(1)
            && waited < HEAD_DEADLINE + Duration::from_secs(3),
        "closed after {waited:?}"
    );
    lb.stop();
}

/// A slowloris flood: a client keeps more connections open than the API
/// serves at once, each with half a request head and then nothing, and
/// opens new ones as fast as it can. The operator's requests are still
/// answered (each closes the oldest half-head to make room): 19 of 20 at
/// least, where the 256 slots held for the head deadline answered 503.
#[test]
fn a_slowloris_flood_does_not_keep_the_operator_out() {
    let echo = TestBackend::echo();
    let lb = TestBalancer::start(Config {
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        ..config(&[echo.addr()])
    });
    let admin = lb.admin.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let flood = {
        let stop = Arc::clone(&stop);
        thread::spawn(move || {
            let half = |s: &mut TcpStream| {
                let _ = s.write_all(b"GET /backends HTTP/1.1\r\nHost: a\r\n");
                s.set_nonblocking(true).is_ok()
            };
            let started = Instant::now();
            let mut open: Vec<TcpStream> = Vec::new();
            let mut dialed = 0;
            while !stop.load(Ordering::SeqCst)
                && started.elapsed() < Duration::from_secs(30)
                && dialed < 50_000
            {
                // Those the server closed (answered 503, or closed to
                // make room) are opened again; those it holds are kept.
                open.retain_mut(|s| matches!(s.read(&mut [0u8; 512]), Err(e) if e.kind() == io::ErrorKind::WouldBlock));
                while open.len() < MAX_CONNECTIONS + 50 && dialed < 50_000 {
                    let Ok(mut s) = dial(admin, Duration::from_secs(1)) else {
                        break;
                    };
                    dialed += 1;
                    if half(&mut s) {
                        open.push(s);
                    }
                }
            }
            dialed
        })
    };
    until("the flood takes every admin slot", || {
        let s = lb.stats.snapshot();
        s.admin_evictions + s.admin_connections_refused > 0
    });
    let answered = (0..20)
        .filter(|_| get(admin, "/backends") == Some(200))
        .count();
    stop.store(true, Ordering::SeqCst);
    let dialed = flood.join().unwrap();
    assert!(
        answered >= 19,
        "{answered} of 20 answered (flood: {dialed})"
    );
    assert!(dialed > MAX_CONNECTIONS, "the flood dialed only {dialed}");
    lb.stop();
}

/// A client that asks and asks but never reads its answers: once the
/// buffers are full nothing moves, and the connection is closed at the
/// idle timeout instead of holding its slot for ever.
#[test]
fn a_client_that_does_not_read_is_closed_when_idle() {
    let echo = TestBackend::echo();
    let lb = TestBalancer::start(Config {
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        ..config(&[echo.addr()])
    });
    let admin = lb.admin.unwrap();
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket
        .connect_timeout(&admin.into(), Duration::from_secs(5))
        .unwrap();
    let s: TcpStream = socket.into();
    s.set_write_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let started = Instant::now();
    // Pipelined requests, written while the server takes them in; its
    // answers (the stats page, a few KiB each) fill both buffers.
    let request = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    for _ in 0..2000 {
        if (&s).write_all(request).is_err() {
            break;
        }
    }
    let wrote = Instant::now();
    // Seen from the server's side: once closed, its FIN may wait behind
    // answers this client never reads, so the client's TCP state cannot
    // tell (it does only when unread requests make the close a reset).
    let closed = time_until(IDLE_TIMEOUT + Duration::from_secs(30), || {
        lb.stats.snapshot().admin_idle_closes == 1
    });
    assert!(
        closed.is_some(),
        "not closed {:?} after the last write",
        wrote.elapsed()
    );
    assert!(
        started.elapsed() >= IDLE_TIMEOUT - Duration::from_secs(1),
        "closed after {:?}",
        started.elapsed()
    );
    assert_eq!(get(admin, "/backends"), Some(200));
    lb.stop();
}

/// At the descriptor ceiling (the balancer's clients took every one), the
/// admin API still answers: it keeps descriptors in reserve for itself.
#[test]
fn the_api_answers_at_the_descriptor_ceiling() {
    let echo = TestBackend::echo();
    let mut lb = Rodizio::start(echo.addr(), &["--health-check", "off"], Some(64));
    // Each proxied client costs two descriptors: 64 cannot hold 60.
    let clients: Vec<TcpStream> = (0..60)
        .filter_map(|_| dial(lb.addr, Duration::from_secs(5)).ok())
        .collect();
    let full = wait_for(Duration::from_secs(10), || {
        lb.stderr.text().contains("descriptor") || lb.stderr.text().contains("Too many open files")
    });
    assert!(full, "the ceiling was not reached: {}", lb.stderr.text());
    for _ in 0..3 {
        assert_eq!(
            get(lb.admin, "/backends"),
            Some(200),
            "{}",
            lb.stderr.text()
        );
    }
    drop(clients);
    assert!(lb.alive());
    assert!(wait_for(Duration::from_secs(10), || echo_ok(lb.addr, 1000)));
}

/// A small reproducible generator (xorshift), so a failing run can be
/// replayed from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

/// One random request, sent whole, in part, or reset mid-way.
fn fuzz_one(admin: SocketAddr, rng: &mut Rng) -> Option<u16> {
    let method = rng.pick(&[
        "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "G\0T", "",
    ]);
    let path = match rng.below(8) {
        0 => "/".to_string(),
        1 => "/metrics".to_string(),
        2 => "/backends".to_string(),
        3 => "/config".to_string(),
        4 => "/reload".to_string(),
        5 => format!("/backends/{:x}", rng.next()),
        6 => format!("/%{:x}%zz?{}", rng.next(), "q".repeat(rng.below(3000))),
        _ => String::from_utf8_lossy(&test_data(rng.below(200), rng.next())).into_owned(),
    };
    let most = if rng.below(4) == 0 { 100_000 } else { 300 };
    let (len, seed) = (rng.below(most), rng.next());
    let body = test_data(len, seed);
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: fuzz\r\n");
    match rng.below(6) {
        0 => head.push_str(&format!("Content-Length: {}\r\n", body.len())),
        1 => head.push_str(&format!(
            "Content-Length: {}\r\n",
            rng.next() >> rng.below(64)
        )),
        2 => head.push_str("Transfer-Encoding: chunked\r\n"),
        3 => head.push_str(&format!("Content-Length: -{}\r\n", rng.below(9))),
        4 => head.push_str("Expect: 100-continue\r\nContent-Length: 10\r\n"),
        _ => {}
    }
    if rng.below(3) == 0 {
        head.push_str(&format!(
            "Authorization: {}\r\n",
            rng.pick(&["Bearer x", "Basic !!", "basic", "\u{7f}"])
        ));
    }
    head.push_str(if rng.below(2) == 0 {
        "Connection: close\r\n\r\n"
    } else {
        "\r\n"
    });
    let mut s = dial(admin, Duration::from_secs(3)).ok()?;
    let mut raw = head.into_bytes();
    raw.extend_from_slice(&body);
    let cut = match rng.below(4) {
        0 => rng.below(raw.len() + 1),
        _ => raw.len(),
    };
    let _ = s.write_all(&raw[..cut]);
    if rng.below(5) == 0 {
        let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
        return None;
    }
    if cut < raw.len() {
        let _ = s.shutdown(Shutdown::Write);
    }
    read_status(&mut s)
}

/// A number from a process's `/proc/PID/status` (`Threads:`, `VmRSS:`).
fn proc_status(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The names of `pid`'s threads that serve its admin API (its runtime's
/// `rodizio-admin` and the handlers of its blocking pool).
fn admin_threads(pid: u32) -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|name| name.trim().to_string())
        .filter(|name| name.starts_with("rodizio-admin"))
        .collect()
}

/// A bounded random fuzzer against the admin API while proxy traffic
/// flows: the traffic loses nothing, every answer is a real status (never
/// a 500) or a close, the process lives, and afterwards the API answers
/// within a second, with its threads and memory back within bounds.
#[test]
fn a_fuzzer_while_traffic_flows() {
    const REQUESTS: usize = 1200;
    let echo = TestBackend::echo();
    let mut lb = Rodizio::start(echo.addr(), &[], None);
    let pid = lb.child.pid();
    assert!(echo_ok(lb.addr, 20_000));
    let (threads0, rss0) = (proc_status(pid, "Threads:"), proc_status(pid, "VmRSS:"));
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let traffic = {
        let (stop, ok, failed, addr) = (
            Arc::clone(&stop),
            Arc::clone(&ok),
            Arc::clone(&failed),
            lb.addr,
        );
        thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(60);
            while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                let counter = if echo_ok(addr, 20_000) { &ok } else { &failed };
                counter.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    let admin = lb.admin;
    let seed = 0x5eed_0000_u64 ^ u64::from(std::process::id());
    let codes = Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::<
        String,
        usize,
    >::new()));
    let started = Instant::now();
    let fuzzers: Vec<_> = (0..4u64)
        .map(|t| {
            let codes = Arc::clone(&codes);
            thread::spawn(move || {
                let mut rng = Rng(seed.wrapping_add(t * 0x9e37_79b9) | 1);
                for _ in 0..REQUESTS / 4 {
                    let code =
                        fuzz_one(admin, &mut rng).map_or("closed".to_string(), |c| c.to_string());
                    *codes.lock().unwrap().entry(code).or_default() += 1;
                }
            })
        })
        .collect();
    for f in fuzzers {
        f.join().unwrap();
    }
    let fuzz_time = started.elapsed();
    let peak = (proc_status(pid, "Threads:"), proc_status(pid, "VmRSS:"));
    let t = answered_within(admin, Duration::from_secs(1));
    stop.store(true, Ordering::SeqCst);
    traffic.join().unwrap();
    let codes = codes.lock().unwrap().clone();
    let after = (proc_status(pid, "Threads:"), proc_status(pid, "VmRSS:"));
    eprintln!(
        "fuzz: seed {seed:#x}, {REQUESTS} requests in {fuzz_time:?}, answers {codes:?}; \
         traffic {} ok, {} failed; threads {threads0} / {} / {} and RSS {rss0} / {} / {} kB \
         (before / at the end of the fuzzing / after)",
        ok.load(Ordering::SeqCst),
        failed.load(Ordering::SeqCst),
        peak.0,
        after.0,
        peak.1,
        after.1,
    );
    assert!(lb.alive(), "rodizio died: {}", lb.stderr.text());
    assert!(t.is_some(), "the API answers within 1 s after the fuzzing");
    assert_eq!(failed.load(Ordering::SeqCst), 0, "proxy traffic lost");
    assert!(ok.load(Ordering::SeqCst) > 0);
    for code in codes.keys().filter(|c| *c != "closed") {
        let n: u16 = code.parse().unwrap();
        assert!((100..600).contains(&n) && n != 500, "status {n}");
    }
    // The admin API's threads: its runtime's own and its blocking pool, at
    // most 4, `HANDLERS` in src/admin/server.rs (the workers the traffic started, the checks' probe
    // threads and the pool's trim come and go, and are not the API's).
    let admin = admin_threads(pid);
    assert!(
        admin.len() <= 1 + 4,
        "admin threads {admin:?} (all threads: {threads0} -> {})",
        after.0
    );
    assert!(
        after.1 < rss0 + 32 * 1024,
        "RSS {rss0} kB -> {} kB",
        after.1
    );
}
