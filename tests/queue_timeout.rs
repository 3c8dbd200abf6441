//! The queue timeout: a client that waited longer than `queue_timeout` for
//! a free worker is closed unserved (or answered 503 with `http_replies`)
//! when a worker takes it, and counted in `queue_timeouts`.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{config, connect, until, TestBackend, TestBalancer};

const QUEUE_TIMEOUT: Duration = Duration::from_millis(200);

/// A balancer with one worker and a 200 ms queue timeout; the worker is
/// held by a first client, and a second one is left waiting (unserved) for
/// longer than the timeout. Returns the balancer, the holder, the waiter.
fn one_worker_held_and_one_waiting(
    backend: &TestBackend,
    http_replies: bool,
) -> (TestBalancer, TcpStream, TcpStream) {
    let mut cfg = config(&[backend.addr()]);
    cfg.workers = 1;
    cfg.proxy.queue_timeout = QUEUE_TIMEOUT;
    cfg.health.http_replies = http_replies;
    let lb = TestBalancer::start(cfg);
    let mut holder = connect(lb.addr).unwrap();
    holder.write_all(b"1").unwrap();
    let mut b = [0u8];
    holder.read_exact(&mut b).unwrap();
    let mut waiter = connect(lb.addr).unwrap();
    waiter.write_all(b"2").unwrap();
    until("the second client is accepted", || {
        lb.stats.snapshot().accepted == 2
    });
    // Not served for 1.5 times the queue timeout: it waits in the queue.
    waiter
        .set_read_timeout(Some(QUEUE_TIMEOUT * 3 / 2))
        .unwrap();
    match waiter.read(&mut b) {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        other => panic!("the second client was served by a second worker: {other:?}"),
    }
    waiter.set_read_timeout(Some(common::IO_TIMEOUT)).unwrap();
    (lb, holder, waiter)
}

/// The waiter is closed without a byte once the worker frees up, never
/// reaches the backend, and is counted; the next client is served.
#[test]
fn a_client_that_waited_too_long_is_closed_unserved() {
    let backend = TestBackend::echo();
    let (lb, holder, mut waiter) = one_worker_held_and_one_waiting(&backend, false);
    drop(holder);
    let mut got = Vec::new();
    match waiter.read_to_end(&mut got) {
        Ok(_) => assert!(got.is_empty(), "{got:?}"),
        Err(e) => assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}"),
    }
    assert_eq!(lb.stats.snapshot().queue_timeouts, 1);
    assert_eq!(backend.accepted(), 1);
    // A client that does not wait is served as usual.
    let mut next = connect(lb.addr).unwrap();
    next.write_all(b"3").unwrap();
    let mut b = [0u8];
    next.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"3");
    assert_eq!(lb.stats.snapshot().queue_timeouts, 1);
    drop(next);
    lb.stop();
}

/// With `http_replies`, the waiter reads a 503 before the close.
#[test]
fn with_http_replies_the_client_gets_a_503() {
    let backend = TestBackend::echo();
    let (lb, holder, mut waiter) = one_worker_held_and_one_waiting(&backend, true);
    drop(holder);
    let mut got = String::new();
    waiter.read_to_string(&mut got).unwrap();
    assert!(
        got.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
        "{got:?}"
    );
    assert!(
        got.ends_with("\r\n\r\nwaited past queue_timeout, try later\r\n"),
        "{got:?}"
    );
    assert_eq!(lb.stats.snapshot().queue_timeouts, 1);
    assert_eq!(backend.accepted(), 1);
    lb.stop();
}
