//! Full duplex and binary safety: large transfers both ways at once.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{connect, echo_through, test_data, TestBackend, TestBalancer};

const MIB: usize = 1024 * 1024;

/// 10 MiB of random bytes (with runs of zero bytes) written by the client
/// while it reads the echo on another thread: 10 MiB each way at the same
/// time, returned byte for byte. A proxy that only copies one direction at
/// a time, or blocks writing toward a client that is itself blocked
/// writing, deadlocks here (the read then times out and the test fails).
#[test]
fn ten_mib_each_way_at_once_byte_for_byte() {
    let backend = TestBackend::echo();
    let lb = TestBalancer::over(&[backend.addr()]);
    let data = Arc::new(test_data(10 * MIB, 0x5eed));
    assert!(data.iter().filter(|&&b| b == 0).count() > 10_000);
    let started = Instant::now();
    let back = echo_through(connect(lb.addr).unwrap(), data.clone()).expect("transfer");
    let elapsed = started.elapsed();
    assert_eq!(back.len(), data.len(), "lost or added bytes");
    if let Some(i) = back.iter().zip(data.iter()).position(|(a, b)| a != b) {
        panic!("first difference at byte {i}");
    }
    assert!(elapsed < Duration::from_secs(30), "took {elapsed:?}");
    // The counters are updated when the worker has closed the connection,
    // possibly just after the client saw its end.
    let len = data.len() as u64;
    assert!(common::wait_for(Duration::from_secs(5), || {
        let s = lb.stats.snapshot();
        s.bytes_to_backends == len && s.bytes_to_clients == len
    }));
    assert_eq!(lb.stats.snapshot().errors, 0);
    lb.stop();
}

/// Odd buffer sizes (1 byte, 7 bytes, 64 KiB) move the same bytes: no
/// off-by-one at chunk boundaries, in either direction.
#[test]
fn odd_buffer_sizes_lose_no_byte() {
    let backend = TestBackend::echo();
    for (buffer_size, len) in [(1, 64 * 1024), (7, 256 * 1024), (64 * 1024, MIB)] {
        let mut cfg = common::config(&[backend.addr()]);
        cfg.proxy.buffer_size = buffer_size;
        let lb = TestBalancer::start(cfg);
        let data = Arc::new(test_data(len, buffer_size as u64));
        let back = echo_through(connect(lb.addr).unwrap(), data.clone()).expect("transfer");
        assert!(back == *data, "buffer size {buffer_size}: bytes differ");
        lb.stop();
    }
}
