//! Past the C's limits: more than 4096 connections, and long connections
//! next to short ones.

mod common;

use std::io::{Read, Write};
use std::net::Shutdown;
use std::time::{Duration, Instant};

use common::{connect, TestBackend, TestBalancer};

/// Threads named `rodizio-worker` in this process now.
fn worker_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.trim() == "rodizio-worker")
        })
        .count()
}

/// One short echo round trip on a new connection.
fn round_trip(addr: std::net::SocketAddr, i: usize) {
    let mut s = connect(addr).unwrap_or_else(|e| panic!("connection {i}: {e}"));
    let msg = (i as u32).to_be_bytes();
    s.write_all(&msg).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let mut back = Vec::new();
    s.read_to_end(&mut back)
        .unwrap_or_else(|e| panic!("connection {i}: {e}"));
    assert_eq!(back, msg, "connection {i}");
}

/// 4500 connections one after the other are all served, in bounded time,
/// by a handful of reused worker threads. The C exits on its 4096th
/// connection ("Failed to join the thread").
#[test]
fn more_than_4096_connections_in_a_row() {
    let backend = TestBackend::echo();
    // No active checks: on a loaded machine a check that times out after
    // its connect is a connection the backend saw that no check counted.
    let lb = TestBalancer::with(&[backend.addr()], |c| {
        c.health.check = rodizio::health::CheckKind::Off;
    });
    let started = Instant::now();
    for i in 0..4500 {
        round_trip(lb.addr, i);
    }
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_secs(40), "took {elapsed:?}");
    // Threads are reused, not one per connection as in the C. (The other
    // test in this binary may hold up to 4 more at the same time.)
    let workers = worker_threads();
    eprintln!("4500 connections in {elapsed:?}, {workers} worker threads");
    assert!(
        workers <= 32,
        "{workers} worker threads for sequential clients"
    );
    let (held, seen) = lb.proxied(&[&backend], |c| c == [4500]);
    assert!(held, "the backend took {seen:?} connections");
    // The worker counts a connection after closing it, so possibly just
    // after the client saw the end of it.
    assert!(common::wait_for(Duration::from_secs(5), || {
        lb.stats.snapshot().completed == 4500
    }));
    lb.stop();
}

/// A connection held open does not delay the ones after it: the C joins
/// thread slot `i % 4096`, so one long connection there stalls its accept
/// loop. Here 500 short connections are served while one stays open, and
/// the long one still works afterwards.
#[test]
fn a_long_connection_does_not_block_short_ones() {
    let backend = TestBackend::echo();
    let mut cfg = common::config(&[backend.addr()]);
    // Few workers, so the pool wraps around the long connection's thread
    // many times.
    cfg.workers = 4;
    let lb = TestBalancer::start(cfg);
    let mut long = connect(lb.addr).unwrap();
    long.write_all(b"first").unwrap();
    let mut buf = [0u8; 5];
    long.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"first");
    for i in 0..500 {
        round_trip(lb.addr, i);
    }
    long.write_all(b"after").unwrap();
    long.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"after");
    drop(long);
    lb.stop();
}
