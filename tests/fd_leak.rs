//! No file descriptor is left open: a test binary of its own, with a
//! single test, so nothing else in the process opens or closes descriptors
//! while it counts.

mod common;

use std::io::{Read, Write};
use std::net::Shutdown;
use std::sync::Arc;
use std::time::Duration;

use common::{closed_port, config, connect, echo_through, test_data, TestBackend, TestBalancer};
use socket2::SockRef;

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// After clean transfers, half-closes, a client reset, fail-overs past a
/// refusing backend and a full balancer stop, the process has exactly the
/// descriptors it had before.
#[test]
fn no_descriptor_left_after_a_batch_and_a_stop() {
    // Warm up whatever the runtime opens once (e.g. for the first thread).
    drop(TestBackend::echo());
    // The kernel relay's program and maps, when a pass turns it on: loaded
    // once per process and kept, as in the balancer.
    common::kernel_relay_after_from_env();
    // A refused port, held (one descriptor) for the life of the process.
    let dead = closed_port();
    let before = open_fds();
    {
        let echo = TestBackend::echo();
        let other = TestBackend::echo();
        let mut cfg = config(&[echo.addr(), dead, other.addr()]);
        cfg.proxy.connect_timeout = Duration::from_millis(500);
        let lb = TestBalancer::start(cfg);
        // The closed port's first three turns fail over; the third failure
        // marks it down (passive health) and later clients skip it.
        for i in 0..30u64 {
            let data = Arc::new(test_data(100_000, i + 1));
            let back = echo_through(connect(lb.addr).unwrap(), data.clone()).unwrap();
            assert!(back == *data, "transfer {i}");
        }
        assert_eq!(lb.stats.snapshot().connect_failures, 3);
        // A client that resets mid-transfer.
        let mut bad = connect(lb.addr).unwrap();
        bad.write_all(&[1; 5000]).unwrap();
        let mut some = [0u8; 100];
        bad.read_exact(&mut some).unwrap();
        SockRef::from(&bad)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(bad);
        // A client that leaves without a word.
        let quiet = connect(lb.addr).unwrap();
        quiet.shutdown(Shutdown::Both).unwrap();
        drop(quiet);
        assert!(lb.wait_active(0, Duration::from_secs(5)));
        lb.stop();
    }
    let after = open_fds();
    assert_eq!(after, before, "descriptors leaked");
}
