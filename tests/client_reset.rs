//! A client that resets its connection ends only that connection.

mod common;

use std::io::{Read, Write};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::{connect, echo_through, test_data, wait_for, TestBackend, TestBalancer};
use socket2::SockRef;

const FIRST: usize = 64 * 1024;

/// Four transfers are in flight (each has had its first 64 KiB echoed)
/// when a fifth client resets its connection mid-transfer (SO_LINGER 0,
/// then close). The four then finish byte for byte, the reset is counted as
/// one connection error, every worker is free again, and new clients are
/// still served.
#[test]
fn reset_mid_transfer_leaves_the_others_intact() {
    let backend = TestBackend::echo();
    let lb = TestBalancer::over(&[backend.addr()]);
    let (ready_tx, ready_rx) = crossbeam_channel::unbounded();
    let (go_tx, go_rx) = crossbeam_channel::bounded::<()>(0);
    let good: Vec<_> = (0..4u64)
        .map(|i| {
            let (addr, ready_tx, go_rx) = (lb.addr, ready_tx.clone(), go_rx.clone());
            thread::spawn(move || {
                let data = test_data(2 * 1024 * 1024, 100 + i);
                let mut s = connect(addr).unwrap();
                s.write_all(&data[..FIRST]).unwrap();
                let mut first = vec![0; FIRST];
                s.read_exact(&mut first).unwrap();
                assert_eq!(first, data[..FIRST]);
                ready_tx.send(()).unwrap();
                // Dropped, not sent: disconnection is the signal to go on.
                let _ = go_rx.recv_timeout(Duration::from_secs(10));
                let rest = Arc::new(data[FIRST..].to_vec());
                let back = echo_through(s, rest.clone()).expect("transfer after the reset");
                back == *rest
            })
        })
        .collect();
    for _ in 0..4 {
        ready_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    }
    // The bad client: sends, reads part of the echo, then resets.
    let mut bad = connect(lb.addr).unwrap();
    let data = test_data(1024 * 1024, 7);
    bad.write_all(&data[..FIRST]).unwrap();
    let mut some = vec![0; 1000];
    bad.read_exact(&mut some).unwrap();
    bad.write_all(&data[FIRST..2 * FIRST]).unwrap();
    SockRef::from(&bad)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(bad);
    assert!(wait_for(Duration::from_secs(5), || {
        lb.stats.snapshot().errors == 1
    }));
    drop(go_tx);
    for t in good {
        assert!(t.join().unwrap(), "a transfer was corrupted");
    }
    assert!(lb.wait_active(0, Duration::from_secs(5)));
    assert_eq!(lb.stats.snapshot().errors, 1);
    // Still serving.
    let back = echo_through(connect(lb.addr).unwrap(), Arc::new(b"ping".to_vec())).unwrap();
    assert_eq!(back, b"ping");
    lb.stop();
}
