//! Graceful drain: shutdown stops accepting but finishes what is in flight.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::time::Duration;

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

/// With nothing in flight, `run` returns at once after the trigger, and
/// so does it when a client holds a connection open past `drain_timeout`
/// (that connection is cut).
#[test]
fn run_returns_after_the_drain_timeout() {
    let backend = TestBackend::echo();
    let mut cfg = common::config(&[backend.addr()]);
    cfg.drain_timeout = Duration::from_millis(300);
    let lb = TestBalancer::start(cfg);
    let mut idle = connect(lb.addr).unwrap();
    idle.write_all(b"x").unwrap();
    let mut b = [0u8];
    idle.read_exact(&mut b).unwrap();
    lb.shutdown.trigger();
    assert!(
        lb.wait_stopped(Duration::from_secs(5)),
        "run ignored the drain timeout"
    );
    let _ = idle.shutdown(Shutdown::Both);
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
