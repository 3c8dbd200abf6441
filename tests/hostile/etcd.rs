//! A fake etcd (an HTTP listener of the test) behind a service's
//! `backends_from` that turns hostile after a good answer: garbage, a
//! lying `Content-Length` (short of its body, or a terabyte), a chunked
//! stream that never ends, keys that are not base64, 100,000 keys. The
//! service keeps its last good list and serves on, its memory bounded.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;

use crate::child::Child;
use crate::common::{connect, http_get, time_until, TestBackend};

const GOOD: u8 = 0;
const GARBAGE: u8 = 1;
const SHORT: u8 = 2;
const HUGE: u8 = 3;
const ENDLESS: u8 = 4;
const BAD_BASE64: u8 = 5;
const MANY: u8 = 6;
/// A good read, then a watch whose event is not JSON.
const BAD_EVENT: u8 = 7;
/// A good read, then a watch that never says anything.
const STALL: u8 = 8;

/// The test's etcd: answers each request as `mode` says, counting them.
struct FakeEtcd {
    addr: SocketAddr,
    mode: Arc<AtomicU8>,
    asked: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

fn b64(s: &str) -> String {
    STANDARD.encode(s)
}

/// The answer to one request in `mode`; `good` is the one backend.
fn answer(mut s: TcpStream, mode: u8, good: SocketAddr, stop: &AtomicBool) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
    let mut head = [0u8; 4096];
    let n = s.read(&mut head).unwrap_or(0);
    let watch = String::from_utf8_lossy(&head[..n]).contains("/v3/watch");
    // The read is a good one in the modes that turn only the watch bad.
    let mode = if !watch && (mode == BAD_EVENT || mode == STALL) {
        GOOD
    } else {
        mode
    };
    let json = |body: String| {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let reply = match mode {
        GOOD if watch => {
            // The creation message, then the stream ends: the follower reads again.
            let line = "{\"result\":{\"header\":{\"revision\":\"5\"},\"created\":true}}\n";
            format!(
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{line}\r\n0\r\n\r\n",
                line.len()
            )
        }
        GOOD => json(format!(
            r#"{{"header":{{"revision":"4"}},"kvs":[{{"key":"{}","value":"{}"}}],"count":"1"}}"#,
            b64("/h/a"),
            b64(&good.to_string())
        )),
        GARBAGE => "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{garbage]".into(),
        BAD_EVENT => {
            let lines = "{\"result\":{\"header\":{\"revision\":\"5\"},\"created\":true}}\n{\"result\":{\"events\":[{\"kv\":\n";
            format!(
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{lines}\r\n",
                lines.len()
            )
        }
        STALL => {
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
            while !stop.load(Ordering::SeqCst) {
                thread::sleep(Duration::from_millis(20));
            }
            return;
        }
        SHORT => "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{\"header\":".into(),
        HUGE => "HTTP/1.1 200 OK\r\nContent-Length: 1099511627776\r\n\r\n{".into(),
        ENDLESS => {
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
            let chunk = format!("10000\r\n{}\r\n", "a".repeat(0x10000));
            while !stop.load(Ordering::SeqCst) && s.write_all(chunk.as_bytes()).is_ok() {}
            return;
        }
        BAD_BASE64 => json(
            r#"{"header":{"revision":"9"},"kvs":[{"key":"!!!not base64","value":"@@"}]}"#.into(),
        ),
        _ => {
            let mut body = String::from(r#"{"header":{"revision":"9"},"count":"100000","kvs":["#);
            for i in 0..100_000u32 {
                if i > 0 {
                    body.push(',');
                }
                body.push_str(&format!(
                    r#"{{"key":"{}","value":""}}"#,
                    b64(&format!("/h/127.0.0.1:{}", 1 + i % 60_000))
                ));
            }
            body.push_str("]}");
            json(body)
        }
    };
    let _ = s.write_all(reply.as_bytes());
    // Hold the connection a moment (a lying length is not followed by more).
    let mut rest = [0u8; 64];
    let _ = s.read(&mut rest);
}

impl FakeEtcd {
    fn start(good: SocketAddr) -> FakeEtcd {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (mode, asked, stop) = (
            Arc::new(AtomicU8::new(GOOD)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let thread = {
            let (mode, asked, stop) = (mode.clone(), asked.clone(), stop.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((s, _)) => {
                            let _ = s.set_nonblocking(false);
                            asked.fetch_add(1, Ordering::SeqCst);
                            let (m, stop) = (mode.load(Ordering::SeqCst), stop.clone());
                            thread::spawn(move || answer(s, m, good, &stop));
                        }
                        Err(_) => thread::sleep(Duration::from_millis(5)),
                    }
                }
            })
        };
        FakeEtcd {
            addr,
            mode,
            asked,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for FakeEtcd {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The backends' addresses the balancer's admin API lists, sorted.
fn names(lb: &Child) -> Vec<String> {
    let list = http_get(lb.admin(), "/backends").unwrap().body;
    let list: serde_json::Value = serde_json::from_str(&list).unwrap();
    let mut all: Vec<String> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["address"].as_str().unwrap().to_string())
        .collect();
    all.sort();
    all
}

/// Every hostile answer keeps the last good list; clients are served. The
/// balancer is a process of its own, so that its memory is its own (the
/// suite's other tests run beside this one in the test process).
#[test]
fn a_hostile_etcd_leaves_the_last_good_list() {
    let (fixed, good) = (TestBackend::echo(), TestBackend::echo());
    let fake = FakeEtcd::start(good.addr());
    let source = format!("etcd://{}/h/", fake.addr);
    let fixed_addr = fixed.addr().to_string();
    let args = ["-b", &fixed_addr, "--admin", "127.0.0.1:0"];
    let mut lb = Child::on_loopback(&[&args[..], &["--backends-from", &source]].concat(), |_| {});
    let mut want = vec![fixed.addr().to_string(), good.addr().to_string()];
    want.sort();
    time_until(Duration::from_secs(10), || names(&lb) == want).expect("the good list");
    let rss0 = lb.rss_kib();
    let mut peak = rss0;
    for mode in [GARBAGE, SHORT, HUGE, ENDLESS, BAD_BASE64, MANY, BAD_EVENT] {
        fake.mode.store(mode, Ordering::SeqCst);
        let seen = fake.asked.load(Ordering::SeqCst);
        time_until(Duration::from_secs(20), || {
            peak = peak.max(lb.rss_kib());
            fake.asked.load(Ordering::SeqCst) >= seen + 2
        })
        .unwrap_or_else(|| panic!("mode {mode}: the follower asked again"));
        assert_eq!(names(&lb), want, "mode {mode}: the last good list");
        for _ in 0..4 {
            let mut s = connect(lb.addr).unwrap();
            s.write_all(b"x").unwrap();
            let mut b = [0u8];
            s.read_exact(&mut b).unwrap();
        }
    }
    // A watch that never speaks: the follower waits on it (no new
    // request, no spin), the list stays, clients are served, and the
    // balancer still stops (the wait looks at the shutdown).
    fake.mode.store(STALL, Ordering::SeqCst);
    let seen = fake.asked.load(Ordering::SeqCst);
    time_until(Duration::from_secs(20), || {
        fake.asked.load(Ordering::SeqCst) >= seen + 2
    })
    .expect("a read and a watch in the stalling mode");
    assert_eq!(names(&lb), want, "stalled: the last good list");
    let mut s = connect(lb.addr).unwrap();
    s.write_all(b"x").unwrap();
    let mut b = [0u8];
    s.read_exact(&mut b).unwrap();
    // A body is read up to 4 MiB; a follower that kept what it was sent
    // would grow by the endless stream's gigabytes.
    let grown = peak.saturating_sub(rss0);
    assert!(
        grown < 32 * 1024,
        "memory grew by {grown} kB (from {rss0} kB)"
    );
    assert!(good.accepted() > 0 && fixed.accepted() > 0);
    drop(s);
    assert_eq!(lb.stop().and_then(|s| s.code()), Some(0), "{}", lb.output());
}

/// An etcd whose authentication answers lie: a token carrying a header of
/// its own (CRLF), a 1 MiB token, garbage, a wrong password's 400. Each is
/// an error of the read, in words, and no request follows with it.
#[test]
fn hostile_authentication_answers_are_refused() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let asked = Arc::new(AtomicUsize::new(0));
    let token_answers = [
        r#"{"token":"t.1\r\nX-Injected: yes"}"#.to_string(),
        format!(r#"{{"token":"{}"}}"#, "t".repeat(1 << 20)),
        "{garbage".to_string(),
        r#"{"token":""}"#.to_string(),
    ];
    let cases = token_answers.len() + 1;
    let counted = asked.clone();
    let server = thread::spawn(move || {
        for (i, conn) in listener.incoming().take(cases).enumerate() {
            let mut s = conn.unwrap();
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let mut head = [0u8; 4096];
            let n = s.read(&mut head).unwrap_or(0);
            if !String::from_utf8_lossy(&head[..n]).contains("/v3/auth/authenticate") {
                counted.fetch_add(1, Ordering::SeqCst);
            }
            let reply = match token_answers.get(i) {
                Some(body) => format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                ),
                None => "HTTP/1.1 400 Bad Request\r\nContent-Length: 2\r\n\r\n{}".into(),
            };
            let _ = s.write_all(reply.as_bytes());
        }
    });
    let source: rodizio::etcd::EtcdSource = format!("etcd://lb:pw@{addr}/lb/").parse().unwrap();
    for _ in 0..cases {
        let err = rodizio::etcd::range(&source).unwrap_err();
        assert!(err.contains("authenticating as lb"), "{err}");
        assert!(!err.contains("pw@") && !err.contains("X-Injected"), "{err}");
    }
    server.join().unwrap();
    assert_eq!(
        asked.load(Ordering::SeqCst),
        0,
        "a request went out with a bad token"
    );
}

/// A peer of `etcds://` or of the authentication that never answers, or
/// answers garbage where TLS is expected: each read ends in an error, in
/// words, within the client's timeout (3 s), never a hang.
#[test]
fn a_stalled_or_garbage_tls_or_authentication_peer_is_an_error_in_bounded_time() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let held = stop.clone();
    // Every connection: read what comes, then either nothing more (held
    // open until the end) or garbage, by turns.
    let server = thread::spawn(move || {
        let mut open = Vec::new();
        for (i, conn) in listener.incoming().take(4).enumerate() {
            let mut s = conn.unwrap();
            s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
            let mut head = [0u8; 4096];
            let _ = s.read(&mut head);
            if i % 2 == 1 {
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\n\r\nthis is no TLS record at all\n");
            }
            open.push(s);
        }
        while !held.load(Ordering::SeqCst) {
            thread::sleep(Duration::from_millis(10));
        }
    });
    let ca = std::env::temp_dir().join(format!(
        "rodizio-hostile-etcd-ca-{}.pem",
        std::process::id()
    ));
    let status = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args([
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=test-ca",
            "-keyout",
            "/dev/null",
            "-out",
        ])
        .arg(&ca)
        .output()
        .expect("openssl");
    assert!(status.status.success(), "{status:?}");
    let sources = [
        format!("etcds://{addr}/lb/?ca={}", ca.display()),
        format!("etcds://{addr}/lb/?ca={}", ca.display()),
        format!("etcd://lb:pw@{addr}/lb/"),
        format!("etcd://lb:pw@{addr}/lb/"),
    ];
    for (i, text) in sources.iter().enumerate() {
        let source: rodizio::etcd::EtcdSource = text.parse().unwrap();
        let began = std::time::Instant::now();
        let err = rodizio::etcd::range(&source).unwrap_err();
        let took = began.elapsed();
        assert!(took < Duration::from_secs(5), "case {i}: {took:?} ({err})");
        if i >= 2 {
            assert!(err.contains("authenticating as lb"), "case {i}: {err}");
        }
        assert!(!err.contains("pw@"), "case {i}: {err}");
    }
    stop.store(true, Ordering::SeqCst);
    server.join().unwrap();
    let _ = std::fs::remove_file(&ca);
}
