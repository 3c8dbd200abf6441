//! A backend's `max_connections` and the service's queue, attacked: caps
//! of 0, huge and garbage refused in one line (flag, file, admin API); 500
//! clients against a cap of 1 and a queue of 4, with bounded workers and
//! each refused with a clean 503; clients that close or reset while they
//! wait free their place; the backend they wait for removed under them.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use rodizio::backend::BackendSpec;
use rodizio::Config;

use crate::common::{self, connect, http_get, until, wait_for, TestBackend, TestBalancer};

use crate::child::{Scratch, BIN};

/// A backend that holds every connection until `gate` opens, then answers
/// `ok` and closes (the gate is polled: nothing waits on a sleep's order).
fn gated(gate: Arc<AtomicBool>) -> TestBackend {
    TestBackend::start(Arc::new(move |mut s: TcpStream| {
        let open = wait_for(Duration::from_secs(30), || gate.load(Ordering::SeqCst));
        if open {
            s.write_all(b"ok")?;
        }
        s.shutdown(Shutdown::Both)
    }))
}

/// A balancer in front of `backend` capped at `cap`, with `max_queue`,
/// 503 replies and the admin API.
fn capped(backend: SocketAddr, cap: usize, max_queue: usize) -> TestBalancer {
    let mut cfg: Config = common::config(&[]);
    cfg.backends = vec![BackendSpec::parse(&format!("{backend},max_connections={cap}")).unwrap()];
    cfg.proxy.max_queue = max_queue;
    cfg.proxy.queue_timeout = Duration::from_secs(30);
    cfg.health.http_replies = true;
    cfg.workers = 64;
    cfg.admin_listen = Some("127.0.0.1:0".parse().unwrap());
    TestBalancer::start(cfg)
}

/// Adds the backend `spec` to `lb`'s list, as the admin API would.
fn add(lb: &TestBalancer, spec: &str) {
    let spec = BackendSpec::parse(spec).unwrap();
    let backend = rodizio::backend::Backend::from_spec(&spec).unwrap();
    lb.scheduler.add(Arc::new(backend));
}

/// Sends a request, half-closes, reads everything. A refused client may
/// see a reset after its 503 (its request came after the balancer's close,
/// which is best effort by design): what it read before counts.
fn ask(addr: SocketAddr) -> std::io::Result<String> {
    let mut s = connect(addr)?;
    s.write_all(b"GET / HTTP/1.0\r\n\r\n")?;
    let _ = s.shutdown(Shutdown::Write);
    let mut got = Vec::new();
    let mut chunk = [0u8; 512];
    loop {
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) if got.is_empty() => return Err(e),
            Err(_) => break,
        }
    }
    Ok(String::from_utf8_lossy(&got).into_owned())
}

/// `POST path` with a JSON body to the admin API: the status line and body.
fn post(admin: SocketAddr, path: &str, body: &str) -> String {
    let mut s = connect(admin).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut got = String::new();
    let _ = s.read_to_string(&mut got);
    got
}

#[test]
fn caps_of_zero_huge_and_garbage_are_refused_in_one_line() {
    for bad in ["0", "1000001", "99999999999999999999999", "-3", "lots", ""] {
        let out = crate::child::output(
            Command::new(BIN)
                .args(["--allow-root", "-l", "127.0.0.1:0", "-b"])
                .arg(format!("127.0.0.1:9,max_connections={bad}")),
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{bad:?}: {err}");
        assert!(err.contains("max_connections must be"), "{bad:?}: {err}");
    }
    let out = crate::child::output(
        Command::new(BIN)
            .args(["--allow-root", "-l", "127.0.0.1:0", "-b", "127.0.0.1:9"])
            .args(["--max-queue", "99999999"]),
    );
    assert_eq!(out.status.code(), Some(2));
    let dir = Scratch::new("hostile-cap-file");
    let path = dir.path("bad.json");
    for bad in ["0", "100000000000000000000", "\"x\"", "-1", "1.5"] {
        let text = format!(
            r#"{{"backends": [{{"host": "127.0.0.1", "port": 9, "max_connections": {bad}}}]}}"#
        );
        std::fs::write(&path, text).unwrap();
        let out = crate::child::output(Command::new(BIN).arg("check-config").arg(&path));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{bad}: {err}");
        assert!(err.contains("max_connections"), "{bad}: {err}");
        assert!(!err.contains("usize"), "{bad}: {err}");
    }
    // The admin API: 400 in one line, nothing added.
    let backend = TestBackend::echo();
    let lb = capped(backend.addr(), 1, 4);
    let admin = lb.admin.unwrap();
    for bad in ["0", "1000001", "\"x\"", "-1"] {
        let body = format!(r#"{{"address": "127.0.0.1:9", "max_connections": {bad}}}"#);
        let got = post(admin, "/backends", &body);
        assert!(got.starts_with("HTTP/1.1 400 "), "{bad}: {got}");
    }
    assert_eq!(lb.scheduler.snapshot().len(), 1);
    let got = post(
        admin,
        "/backends",
        r#"{"address": "127.0.0.1:9", "max_connections": 7}"#,
    );
    assert!(got.starts_with("HTTP/1.1 201 "), "{got}");
    assert!(got.contains(r#""max_connections":7"#), "{got}");
    lb.stop();
}

#[test]
fn five_hundred_clients_against_a_cap_of_one_and_a_queue_of_four() {
    let gate = Arc::new(AtomicBool::new(false));
    let backend = gated(Arc::clone(&gate));
    let lb = capped(backend.addr(), 1, 4);
    let clients: Vec<_> = (0..500)
        .map(|_| {
            let addr = lb.addr;
            thread::spawn(move || ask(addr))
        })
        .collect();
    // One on the backend, four waiting, the rest refused at once.
    until("495 refused", || lb.stats.snapshot().queue_full == 495);
    let s = lb.stats.snapshot();
    assert_eq!(s.queued, 4);
    assert!(s.workers <= 64, "{} workers", s.workers);
    assert_eq!(backend.accepted(), 1);
    let metrics = http_get(lb.admin.unwrap(), "/metrics").unwrap().body;
    for line in [
        "rodizio_queued{service=\"default\"} 4\n".to_string(),
        "rodizio_queue_full_total{service=\"default\"} 495\n".to_string(),
        format!(
            "rodizio_backend_max_connections{{service=\"default\",backend=\"{}\"}} 1\n",
            backend.addr()
        ),
    ] {
        assert!(metrics.contains(&line), "{line} not in:\n{metrics}");
    }
    gate.store(true, Ordering::SeqCst);
    let (mut ok, mut refused) = (0, 0);
    for c in clients {
        let got = c.join().unwrap().unwrap();
        if got == "ok" {
            ok += 1;
        } else {
            assert!(got.starts_with("HTTP/1.1 503 "), "{got:?}");
            refused += 1;
        }
    }
    assert_eq!((ok, refused), (5, 495));
    let services = http_get(lb.admin.unwrap(), "/services").unwrap().body;
    assert!(services.contains(r#""queued":0"#), "{services}");
    lb.stop();
}

#[test]
fn clients_that_close_or_reset_while_waiting_free_their_place() {
    let gate = Arc::new(AtomicBool::new(false));
    let backend = gated(Arc::clone(&gate));
    let lb = capped(backend.addr(), 1, 8);
    let holder = thread::spawn({
        let addr = lb.addr;
        move || ask(addr)
    });
    until("the slot is taken", || backend.accepted() == 1);
    let mut waiting = Vec::new();
    for _ in 0..8 {
        waiting.push(connect(lb.addr).unwrap());
    }
    until("eight wait", || lb.stats.snapshot().queued == 8);
    // Half close quietly, half reset.
    for (i, s) in waiting.into_iter().enumerate() {
        if i % 2 == 1 {
            socket2::SockRef::from(&s)
                .set_linger(Some(Duration::ZERO))
                .unwrap();
        }
        drop(s);
    }
    until("the queue is empty", || lb.stats.snapshot().queued == 0);
    let admin = lb.admin.unwrap();
    let services = http_get(admin, "/services").unwrap().body;
    assert!(services.contains(r#""queued":0"#), "{services}");
    // The places are free: eight new ones wait again, and all are served.
    let again: Vec<_> = (0..8)
        .map(|_| {
            let addr = lb.addr;
            thread::spawn(move || ask(addr))
        })
        .collect();
    until("eight wait again", || lb.stats.snapshot().queued == 8);
    gate.store(true, Ordering::SeqCst);
    assert_eq!(holder.join().unwrap().unwrap(), "ok");
    for c in again {
        assert_eq!(c.join().unwrap().unwrap(), "ok");
    }
    assert_eq!(backend.accepted(), 9, "the ones that left never reached it");
    lb.stop();
}

#[test]
fn the_backend_waited_for_is_removed_under_the_waiting_clients() {
    let gate = Arc::new(AtomicBool::new(false));
    let backend = gated(Arc::clone(&gate));
    let lb = capped(backend.addr(), 1, 8);
    let holder = thread::spawn({
        let addr = lb.addr;
        move || ask(addr)
    });
    until("the slot is taken", || backend.accepted() == 1);
    let waiting: Vec<_> = (0..3)
        .map(|_| {
            let addr = lb.addr;
            thread::spawn(move || ask(addr))
        })
        .collect();
    until("three wait", || lb.stats.snapshot().queued == 3);
    let id = lb.backend(backend.addr()).id();
    assert!(lb.scheduler.remove(id).is_some());
    // Nothing left to wait for: each gets the no-backend 503 at once.
    for c in waiting {
        let got = c.join().unwrap().unwrap();
        assert!(got.starts_with("HTTP/1.1 503 "), "{got:?}");
    }
    assert_eq!(lb.stats.snapshot().queued, 0);
    // The connection in flight on the removed backend finishes.
    gate.store(true, Ordering::SeqCst);
    assert_eq!(holder.join().unwrap().unwrap(), "ok");
    assert_eq!(backend.accepted(), 1);
    // Waiting clients follow a backend added while they wait.
    let other = TestBackend::echo();
    add(&lb, &format!("{},max_connections=1", other.addr()));
    let held = {
        let mut s = connect(lb.addr).unwrap();
        s.write_all(b"1").unwrap();
        let mut b = [0u8];
        s.read_exact(&mut b).unwrap();
        s
    };
    let late = thread::spawn({
        let addr = lb.addr;
        move || {
            let mut s = connect(addr)?;
            s.write_all(b"2")?;
            let mut b = [0u8];
            s.read_exact(&mut b)?;
            Ok::<u8, std::io::Error>(b[0])
        }
    });
    until("one waits", || lb.stats.snapshot().queued == 1);
    let third = gated(Arc::new(AtomicBool::new(true)));
    add(&lb, &third.addr().to_string());
    // Served by the new backend (it says ok, the echo would say 2).
    assert_eq!(late.join().unwrap().unwrap(), b'o');
    assert_eq!(third.accepted(), 1);
    drop(held);
    lb.stop();
}
