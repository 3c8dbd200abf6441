//! Graceful drain: shutdown stops accepting but finishes what is in flight.

mod child;
mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use child::Child;
use common::{connect, echo_through, is_closed, test_data, wait_for, TestBackend, TestBalancer};

const HALF: usize = 1024 * 1024;

/// A transfer is half done when shutdown is triggered. New connections
/// are then refused (or closed unserved), `run` keeps waiting while the
/// transfer goes on, the transfer completes byte for byte, and `run`
/// returns once it has.
#[test]
fn transfer_in_flight_completes_after_shutdown() {
    let backend = TestBackend::echo();
    let lb = TestBalancer::over(&[backend.addr()]);
    let data = test_data(2 * HALF, 42);
    let mut s = connect(lb.addr).unwrap();
    s.write_all(&data[..HALF]).unwrap();
    let mut first = vec![0; HALF];
    s.read_exact(&mut first).unwrap();
    assert_eq!(first, data[..HALF]);

    lb.shutdown.trigger();

    // New clients: refused once the listener is closed; any that still got
    // through the handshake are closed without being served.
    assert!(wait_for(Duration::from_secs(5), || {
        match TcpStream::connect_timeout(&lb.addr, Duration::from_secs(1)) {
            // Reset: the handshake raced the listening socket's close.
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::ConnectionRefused | ErrorKind::ConnectionReset
                ) =>
            {
                true
            }
            Err(e) => panic!("unexpected connect error: {e}"),
            Ok(mut late) => {
                late.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let _ = late.write_all(b"late");
                assert!(is_closed(&mut late), "a client was served after shutdown");
                false
            }
        }
    }));
    assert_eq!(backend.accepted(), 1, "a late client reached the backend");
    assert!(
        !lb.wait_stopped(Duration::from_millis(50)),
        "run returned while a transfer was in flight"
    );

    let rest = Arc::new(data[HALF..].to_vec());
    let back = echo_through(s, rest.clone()).expect("the rest of the transfer");
    assert!(back == *rest, "the transfer was corrupted by the drain");
    assert!(
        lb.wait_stopped(Duration::from_secs(5)),
        "run did not return after the last connection ended"
    );
}

/// The drain waits for the connections open when it begins, and cuts
/// those still open at `drain_timeout`, through the binary (SIGTERM), as a
/// client sees it: two clients hold connections, each served once. During
/// the drain both are still served; one ends its exchange (its last bytes
/// and end of stream come back: served to its end), the other stays idle
/// and sees its connection end no sooner than the drain timeout after the
/// signal, when the process exits, saying it cut one.
#[test]
fn the_drain_serves_open_connections_and_cuts_the_idle_one_at_its_timeout() {
    const DRAIN: Duration = Duration::from_secs(1);
    let backend = TestBackend::echo();
    let mut lb = Child::balancer(&[
        "-l",
        "127.0.0.1:0",
        "-b",
        &backend.addr().to_string(),
        "--health-check",
        "off",
        "--drain-timeout",
        "1s",
    ]);
    let round_trip = |s: &mut TcpStream, byte: u8| {
        s.write_all(&[byte]).unwrap();
        let mut b = [0u8];
        s.read_exact(&mut b).unwrap();
        assert_eq!(b[0], byte);
    };
    let mut idle = connect(lb.addr).unwrap();
    round_trip(&mut idle, b'x');
    let mut busy = connect(lb.addr).unwrap();
    round_trip(&mut busy, b'x');

    let signalled = Instant::now();
    lb.signal(libc::SIGTERM);
    lb.next_log("draining 2 connections in flight");

    // Both are still served while the drain waits.
    round_trip(&mut idle, b'y');
    let rest = Arc::new(test_data(64 * 1024, 3));
    let back = echo_through(busy, rest.clone()).expect("the busy client's exchange");
    assert!(back == *rest, "the busy client was not served to its end");

    // The idle one is cut, at the drain timeout and not before.
    assert!(
        is_closed(&mut idle),
        "the idle client's connection stayed open"
    );
    let cut = signalled.elapsed();
    assert!(
        cut >= DRAIN,
        "the idle client was cut {cut:?} after SIGTERM"
    );
    assert!(
        lb.wait_exit(child::WAIT).is_some(),
        "rodizio still runs after the drain"
    );
    lb.next_log("drain timeout: 1 connection still open is cut");
}

/// Shutdown while the accept loop waits for room in a full queue (one
/// worker busy, one client queued, one more accepted): `run` still returns
/// within the drain timeout instead of waiting for the busy connection.
#[test]
fn shutdown_with_a_full_queue_honours_the_drain_timeout() {
    let backend = TestBackend::echo();
    let mut cfg = common::config(&[backend.addr()]);
    cfg.workers = 1;
    cfg.queue_capacity = 1;
    cfg.drain_timeout = Duration::from_millis(300);
    let lb = TestBalancer::start(cfg);
    let mut busy = connect(lb.addr).unwrap();
    busy.write_all(b"x").unwrap();
    let mut b = [0u8];
    busy.read_exact(&mut b).unwrap();
    let queued = connect(lb.addr).unwrap();
    let mut blocked = connect(lb.addr).unwrap();
    // The third client is accepted, and the accept loop waits to queue it.
    assert!(wait_for(Duration::from_secs(5), || {
        lb.stats.snapshot().accepted == 3
    }));
    lb.shutdown.trigger();
    let stopped = lb.wait_stopped(Duration::from_secs(5));
    // The client the accept loop was holding is closed, not served.
    blocked
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    let _ = blocked.write_all(b"late");
    let closed = is_closed(&mut blocked);
    // Only the busy client reached the backend. (Once `busy` is dropped, the
    // worker, still alive after the drain timeout, serves `queued`.)
    let reached = backend.accepted();
    drop((busy, queued, blocked));
    assert!(
        stopped,
        "run waited for a busy worker past the drain timeout"
    );
    assert!(closed, "the client held by the accept loop was not closed");
    assert_eq!(reached, 1);
}
