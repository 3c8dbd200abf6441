//! The worker limit: connections past it wait for a free worker.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::time::Duration;

use common::{config, connect, TestBackend, TestBalancer};

/// With `workers: 2` and two connections held open, a third is accepted
/// but not served (no echo within 300 ms); once one of the two ends, the
/// third is served with the bytes it sent while waiting.
#[test]
fn third_connection_waits_for_a_free_worker() {
    let backend = TestBackend::echo();
    let mut cfg = config(&[backend.addr()]);
    cfg.workers = 2;
    let lb = TestBalancer::start(cfg);
    let mut held = Vec::new();
    for i in 0..2u8 {
        let mut s = connect(lb.addr).unwrap();
        s.write_all(&[i]).unwrap();
        let mut b = [9u8];
        s.read_exact(&mut b).unwrap();
        assert_eq!(b, [i]);
        held.push(s);
    }
    let mut third = connect(lb.addr).unwrap();
    third.write_all(b"third").unwrap();
    third
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut buf = [0u8; 5];
    match third.read(&mut buf) {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        other => panic!("the third connection was served by a third worker: {other:?}"),
    }
    assert_eq!(backend.accepted(), 2);
    drop(held.pop());
    third.set_read_timeout(Some(common::IO_TIMEOUT)).unwrap();
    third.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"third");
    assert_eq!(backend.accepted(), 3);
    drop(held);
    drop(third);
    lb.stop();
}
