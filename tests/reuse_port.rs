//! The zero-downtime upgrade with the real binary: under a steady load, a
//! second rodizio starts on the same port (`--reuse-port`), the first is
//! sent SIGTERM and drains, and no request fails.
//!
//! Connections waiting in the accept queue of a listener that closes are
//! reset by the kernel unless `net.ipv4.tcp_migrate_req` is 1 (Linux
//! 5.14+), which moves them to another listener of the port. The test sets
//! it for its network namespace while it runs and puts the old value back
//! (docs/scaling.md tells what happens without it).

mod child;
mod common;
mod peers;

use std::fs;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use child::Child;
use common::{connect, TestBackend};
use peers::{free_port, loopback};

const MIGRATE: &str = "/proc/sys/net/ipv4/tcp_migrate_req";

/// Sets `net.ipv4.tcp_migrate_req` to 1 and puts the old value back when
/// dropped.
struct MigrateReq(String);

impl MigrateReq {
    fn on() -> MigrateReq {
        let old = fs::read_to_string(MIGRATE).unwrap_or_else(|e| {
            panic!("{MIGRATE}: {e} (the kernel needs to be 5.14 or later; see docs/scaling.md)")
        });
        fs::write(MIGRATE, "1").unwrap_or_else(|e| panic!("setting {MIGRATE} to 1: {e}"));
        MigrateReq(old.trim().to_string())
    }
}

impl Drop for MigrateReq {
    fn drop(&mut self) {
        let _ = fs::write(MIGRATE, &self.0);
    }
}

/// A rodizio process on `port` with `--reuse-port`, ready to serve.
fn rodizio(port: u16, backend: SocketAddr) -> Child {
    Child::start(&mut child::command(&[
        "--allow-root",
        "-l",
        &format!("127.0.0.1:{port}"),
        "-b",
        &backend.to_string(),
        "--reuse-port",
        "--health-check",
        "off",
        "--drain-timeout",
        "5s",
    ]))
}

/// One request through `addr`; whether a whole 200 came back.
fn request(addr: SocketAddr) -> Result<(), String> {
    let mut s = connect(addr).map_err(|e| format!("connect: {e}"))?;
    s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .map_err(|e| format!("write: {e}"))?;
    let mut reply = String::new();
    s.read_to_string(&mut reply)
        .map_err(|e| format!("read: {e}"))?;
    if reply.starts_with("HTTP/1.1 200") && reply.ends_with("backend 1\n") {
        Ok(())
    } else {
        Err(format!("reply {reply:?}"))
    }
}

/// Under a steady load of sequential requests, a second process takes the
/// port with `--reuse-port`, the first is sent SIGTERM, drains and exits
/// 0, and not one request fails.
#[test]
fn a_second_process_takes_over_without_a_failed_request() {
    let _migrate = MigrateReq::on();
    let web = TestBackend::http(1);
    let port = free_port();
    let addr = loopback(port);
    let mut old = rodizio(port, web.addr());

    let done = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let failed = Arc::new(Mutex::new(Vec::new()));
    let load = {
        let (done, stop, failed) = (done.clone(), stop.clone(), failed.clone());
        thread::spawn(move || {
            let started = Instant::now();
            // Bounded in count and time, whatever happens.
            while !stop.load(Ordering::SeqCst)
                && done.load(Ordering::SeqCst) < 50_000
                && started.elapsed() < Duration::from_secs(60)
            {
                if let Err(e) = request(addr) {
                    failed.lock().unwrap().push(e);
                }
                done.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    let wait_more = |n: usize| {
        let target = done.load(Ordering::SeqCst) + n;
        assert!(
            common::wait_for(Duration::from_secs(30), || done.load(Ordering::SeqCst)
                >= target),
            "the load stalled"
        );
    };
    wait_more(200);
    let new = rodizio(port, web.addr());
    wait_more(500);
    old.signal(libc::SIGTERM);
    let status = old
        .wait_exit(Duration::from_secs(15))
        .expect("the old process did not exit");
    assert!(status.success(), "old process: {status}\n{}", old.output());
    wait_more(500);
    stop.store(true, Ordering::SeqCst);
    load.join().unwrap();
    let failed = failed.lock().unwrap();
    let total = done.load(Ordering::SeqCst);
    assert!(
        failed.is_empty(),
        "{} of {total} requests failed: {:?}\nold:\n{}\nnew:\n{}",
        failed.len(),
        &failed[..failed.len().min(5)],
        old.output(),
        new.output()
    );
    eprintln!("{total} requests, none failed");
    drop(new);
}
