//! The demo backend: slow, partial and garbage requests.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use crate::balancer_port::{reset, sockets_on};
use crate::child::{self, Child};
use crate::common::{self, connect, request, until, Demo};

/// `rodizio backend --listen 127.0.0.1:0` as a child, after `prepare` has
/// adjusted the command; returns once it says where it listens.
fn start_demo(prepare: impl FnOnce(&mut Command)) -> Child {
    let mut command = child::command(&["backend", "--listen", "127.0.0.1:0", "--name", "child"]);
    prepare(&mut command);
    let mut demo = Child::spawn(&mut command);
    demo.printed("Demo backend listening on ");
    // The line comes before the server's own descriptors (its runtime's)
    // are open: a count taken before a first answer could be short of
    // them, and a later one never come back down to it. Taken while the
    // answer's connection is still open in the server, it would be one
    // over: the counts are the tests' once that one is closed too.
    assert_eq!(request(demo.addr).unwrap(), "child");
    until("the first answer's connection closed", || {
        sockets_on(&[demo.addr.port()]) == 0
    });
    demo
}

/// Sends `bytes` and reads everything until the demo backend closes;
/// returns the status line of the first response (or `""`).
fn first_status(addr: SocketAddr, bytes: &[u8]) -> String {
    let mut s = connect(addr).unwrap();
    let _ = s.write_all(bytes);
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    let reply = String::from_utf8_lossy(&reply).into_owned();
    reply.lines().next().unwrap_or("").to_string()
}

/// Twenty clients send half a request and stall: a client behind them is
/// served at once, and each half request, once finished, gets its answer.
#[test]
fn slow_and_partial_requests_do_not_hold_up_others() {
    let demo = Demo::start("127.0.0.1:0", "A");
    let mut halves: Vec<TcpStream> = (0..20)
        .map(|_| {
            let mut s = connect(demo.addr).unwrap();
            s.write_all(b"GET / HTT").unwrap();
            s
        })
        .collect();
    let started = Instant::now();
    assert_eq!(request(demo.addr).unwrap(), "A");
    assert!(started.elapsed() < Duration::from_secs(2));
    for s in &mut halves {
        s.write_all(b"P/1.0\r\n\r\n").unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        assert!(reply.starts_with("HTTP/1.0 200 OK\r\n"), "{reply}");
    }
}

/// Writes `fill` after `start` on a new connection, on a thread, until a
/// write fails or 10 s pass; returns the status line the demo backend
/// answered, and whether the writes were stopped by the backend closing
/// the connection (not by the 10 s), and how long that took.
fn flood(addr: SocketAddr, start: &'static [u8], fill: &'static [u8]) -> (String, bool, Duration) {
    let s = connect(addr).unwrap();
    let mut w = s.try_clone().unwrap();
    let started = Instant::now();
    let writer = thread::spawn(move || {
        let chunk: Vec<u8> = fill.iter().copied().cycle().take(64 * 1024).collect();
        if w.write_all(start).is_err() {
            return true;
        }
        while started.elapsed() < Duration::from_secs(10) {
            if w.write_all(&chunk).is_err() {
                return true;
            }
        }
        false
    });
    let mut status = String::new();
    let _ = BufReader::new(s).read_line(&mut status);
    let cut = writer.join().unwrap();
    (status.trim_end().to_string(), cut, started.elapsed())
}

/// The resident memory of process `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib * 1024
}

/// A request line sent without end, and a head of header lines sent
/// without end, get `431`: the demo backend (the binary) answers once it
/// has read its bound (16 KiB a head), reads and discards what follows for
/// its 2 s linger only, then closes under the sender.
/// Its resident memory grows by less than 4 MiB for all that.
#[test]
fn huge_request_heads_are_refused_with_bounded_memory() {
    let demo = start_demo(|_| {});
    assert_eq!(request(demo.addr).unwrap(), "child");
    let before = rss(demo.pid());
    for (start, fill, expected) in [
        (
            &b"GET /"[..],
            &b"aaaaaaaa"[..],
            "HTTP/1.1 431 Request Header Fields Too Large",
        ),
        (
            b"GET / HTTP/1.1\r\n",
            b"X-Fill: 0123456789\r\n",
            "HTTP/1.1 431 Request Header Fields Too Large",
        ),
    ] {
        let (status, cut, took) = flood(demo.addr, start, fill);
        assert_eq!(status, expected);
        assert!(
            cut && took < Duration::from_secs(6),
            "still taking bytes after {took:?}"
        );
    }
    let grown = rss(demo.pid()).saturating_sub(before);
    assert!(grown < 4 * 1024 * 1024, "grew by {grown} bytes");
    assert_eq!(request(demo.addr).unwrap(), "child");
}

/// Garbage (binary, zeros, a TLS hello, other protocols and versions, a
/// transfer coding it does not know) gets `400`, or a close, never a 200;
/// the backend keeps serving.
#[test]
fn garbage_gets_an_error_and_a_close() {
    let demo = Demo::start("127.0.0.1:0", "A");
    let mut random = common::test_data(10_000, 5);
    random.extend(b"\r\n\r\n");
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (random, "HTTP/1.1 400"),
        (vec![0; 100], ""),
        (
            vec![
                0x16, 0x03, 0x01, 0x00, 0x05, 0x01, 0x00, 0x00, 0x01, 0x00, b'\n',
            ],
            "HTTP/1.1 400",
        ),
        (b"GET / HTTP/2.0\r\n\r\n".to_vec(), "HTTP/1.1 400"),
        (b"GET / FOO/1.1\r\n\r\n".to_vec(), "HTTP/1.1 400"),
        (b"GET  / HTTP/1.1\r\n\r\n".to_vec(), "HTTP/1.1 400"),
        (
            b"GET / HTTP/1.1\r\n Folded: x\r\n\r\n".to_vec(),
            "HTTP/1.1 400",
        ),
        (
            b"GET / HTTP/1.1\r\nNo colon\r\n\r\n".to_vec(),
            "HTTP/1.1 400",
        ),
        (
            b"GET / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n".to_vec(),
            "HTTP/1.1 400",
        ),
        (
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n".to_vec(),
            "HTTP/1.1 400",
        ),
        (b"SSH-2.0-OpenSSH_9.2\r\n".to_vec(), "HTTP/1.1 400"),
    ];
    for (bytes, expected) in &cases {
        let status = first_status(demo.addr, bytes);
        assert!(
            status.starts_with(expected) && !status.contains("200"),
            "{:?}: {status:?}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(40)])
        );
    }
    assert_eq!(request(demo.addr).unwrap(), "A");
}

/// Lying `Content-Length`s: past `u64`, negative, two different ones, one
/// beside a chunked body (the chunks are read, the connection closed after
/// the answer: RFC 9112, 6.1), a body shorter than announced (then a
/// close), a body longer than announced (the rest is read as the next
/// request, and refused). Each gets its answer or a close, and the
/// backend keeps serving.
#[test]
fn lying_content_lengths_are_refused_or_cut() {
    let demo = Demo::start("127.0.0.1:0", "A");
    let post = |headers: &str, body: &str| {
        format!("POST / HTTP/1.1\r\nHost: x\r\n{headers}\r\n{body}").into_bytes()
    };
    for (bytes, expected) in [
        (
            post("Content-Length: 99999999999999999999999\r\n", ""),
            "HTTP/1.1 400",
        ),
        (post("Content-Length: -1\r\n", ""), "HTTP/1.1 400"),
        (post("Content-Length: 1, 2\r\n", "x"), "HTTP/1.1 400"),
        (
            post("Content-Length: 1\r\nContent-Length: 2\r\n", "xx"),
            "HTTP/1.1 400",
        ),
        (
            post(
                "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n",
                "0\r\n\r\nGET / HTTP/1.1\r\n\r\n",
            ),
            "HTTP/1.1 200",
        ),
    ] {
        // `first_status` reads to the close: each connection ends.
        assert!(first_status(demo.addr, &bytes).starts_with(expected));
    }
    // Shorter than announced, then the client closes its write side: no
    // answer, the connection ends.
    let mut s = connect(demo.addr).unwrap();
    s.write_all(&post("Content-Length: 1000000\r\n", "only this"))
        .unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut reply = Vec::new();
    s.read_to_end(&mut reply).unwrap();
    assert!(reply.is_empty(), "{}", String::from_utf8_lossy(&reply));
    // Longer than announced: the surplus is the next "request".
    let mut s = connect(demo.addr).unwrap();
    s.write_all(&post("Content-Length: 2\r\n", "okGARBAGE\r\n\r\n"))
        .unwrap();
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    assert!(reply.starts_with("HTTP/1.1 200 OK\r\n"), "{reply}");
    assert!(reply.contains("HTTP/1.1 400 Bad Request"), "{reply}");
    // Announced huge and stalled: it holds its own connection only.
    let mut stalled = connect(demo.addr).unwrap();
    stalled
        .write_all(&post("Content-Length: 1000000000000\r\n", "a few"))
        .unwrap();
    assert_eq!(request(demo.addr).unwrap(), "A");
}

/// Fifty clients reset (SO_LINGER 0) mid-request or before reading their
/// answer: the demo backend closes every one of their sockets, starts no
/// thread for them, and serves the next client.
#[test]
fn resets_mid_request_leave_it_serving() {
    let mut demo = start_demo(|_| {});
    let (threads, idle) = (demo.threads(), demo.open_fds());
    for i in 0..50 {
        let mut s = connect(demo.addr).unwrap();
        let bytes: &[u8] = if i % 2 == 0 {
            b"GET / HTTP/1.1\r\nHost"
        } else {
            b"GET / HTTP/1.1\r\n\r\n"
        };
        s.write_all(bytes).unwrap();
        reset(s);
    }
    until("the reset connections closed", || demo.open_fds() <= idle);
    assert_eq!(demo.threads(), threads);
    assert_eq!(request(demo.addr).unwrap(), "child");
    assert!(demo.alive());
}

/// The demo backend's default bound on connections served at once.
const DEMO_MAX_CONNECTIONS: usize = 1024;

/// 1,124 connections sit idle on the demo backend (the binary): it serves
/// at most 1,024 at once, all on its one thread, so its threads do not
/// grow, and the 100 over it get `503` and a close at once, not a place
/// each. Once the idle ones leave, it serves again.
#[test]
fn many_idle_connections_are_bounded() {
    let mut demo = start_demo(|_| {});
    let (idle, descriptors) = (demo.threads(), demo.open_fds());
    let mut held: Vec<TcpStream> = Vec::new();
    for _ in 0..DEMO_MAX_CONNECTIONS {
        held.push(connect(demo.addr).unwrap());
    }
    until("a descriptor for each held connection", || {
        demo.open_fds() >= descriptors + DEMO_MAX_CONNECTIONS
    });
    let started = Instant::now();
    for _ in 0..100 {
        let status = first_status(demo.addr, b"GET / HTTP/1.1\r\n\r\n");
        assert!(status.starts_with("HTTP/1.1 503"), "{status:?}");
    }
    assert!(started.elapsed() < Duration::from_secs(10));
    let threads = demo.threads();
    assert_eq!(
        threads, idle,
        "{threads} threads for {DEMO_MAX_CONNECTIONS} connections"
    );
    drop(held);
    until("the idle connections closed", || {
        demo.open_fds() <= descriptors
    });
    assert_eq!(request(demo.addr).unwrap(), "child");
    assert!(demo.alive());
    until("the bound logged", || {
        demo.stderr.text().contains("connections at once")
    });
}

/// Out of descriptors (`RLIMIT_NOFILE` 32, 40 clients held): the accept
/// loop backs off instead of spinning on `EMFILE` (well under half a CPU
/// over the next second), logs it, and once the clients leave serves
/// again.
#[test]
fn out_of_descriptors_it_backs_off_and_recovers() {
    let mut demo = start_demo(|c| common::limit_in_child(c, libc::RLIMIT_NOFILE, 32));
    let held: Vec<TcpStream> = (0..40).map(|_| connect(demo.addr).unwrap()).collect();
    until("out of descriptors", || {
        demo.stderr.text().contains("Too many open files")
    });
    let (ticks, started) = (demo.cpu_ticks(), Instant::now());
    let second = Duration::from_secs(1);
    // Measuring over a second of wall time is the point here.
    thread::sleep(second);
    let used = demo.cpu_ticks() - ticks;
    let elapsed_ticks = started.elapsed().as_millis() as u64 / 10;
    assert!(
        used * 2 < elapsed_ticks,
        "{used} ticks of CPU in {elapsed_ticks}"
    );
    drop(held);
    assert_eq!(request(demo.addr).unwrap(), "child");
    assert!(demo.alive());
}

/// Sends `bytes` then one `fill` byte every 100 ms on `s` (a clone), on a
/// thread, for at most 10 s or until a write fails.
fn trickle_forever(s: &TcpStream, bytes: &'static [u8]) -> thread::JoinHandle<()> {
    let mut w = s.try_clone().unwrap();
    thread::spawn(move || {
        let started = Instant::now();
        if w.write_all(bytes).is_err() {
            return;
        }
        while started.elapsed() < Duration::from_secs(10) && w.write_all(b"a").is_ok() {
            // Pacing is what this client is about, not ordering events.
            thread::sleep(Duration::from_millis(100));
        }
    })
}

/// With a request timeout of 1 s (60 s by default), a client that trickles
/// a byte every 100 ms, into a header that never ends or a body that never
/// completes, is cut at 1 s, not kept for as long as it goes on; a
/// keep-alive client pausing between its requests is not cut, each
/// request having its own time.
#[test]
fn a_trickled_request_is_cut_at_the_request_timeout() {
    let shutdown = rodizio::Shutdown::new();
    let demo = rodizio::demo::DemoBackend::bind("127.0.0.1:0".parse().unwrap(), Some("T".into()))
        .unwrap()
        .request_timeout(Duration::from_secs(1));
    let addr = demo.local_addr().unwrap();
    let accept = demo.spawn(shutdown.clone()).unwrap();
    for start in [
        &b"GET / HTTP/1.1\r\nX-Slow: "[..],
        b"POST / HTTP/1.1\r\nContent-Length: 100000\r\n\r\n",
    ] {
        let mut s = connect(addr).unwrap();
        let started = Instant::now();
        let writer = trickle_forever(&s, start);
        assert!(common::is_closed(&mut s));
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(900) && took < Duration::from_secs(5),
            "{took:?}"
        );
        writer.join().unwrap();
    }
    let s = connect(addr).unwrap();
    let mut reader = BufReader::new(s.try_clone().unwrap());
    for _ in 0..3 {
        // A pause between requests, shorter than the timeout: pacing, as
        // above, not ordering.
        thread::sleep(Duration::from_millis(400));
        (&s).write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        let response = common::read_response(&mut reader).unwrap();
        assert_eq!(response.body, "Handled by server T\n");
    }
    shutdown.trigger();
    accept.join().unwrap();
}
