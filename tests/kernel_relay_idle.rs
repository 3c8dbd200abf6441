//! An idle connection on the kernel relay costs little CPU: its worker
//! cannot be woken by the bytes the program moves, so it looks at the
//! sockets' counters, less and less often while nothing moves, down to
//! once a second (`MAX_IDLE_CHECK`; ten times a second before, about
//! 0.2 ms of CPU a second per connection). In a test binary of its own so
//! that no other test's workers count. Needs root (or CAP_BPF +
//! CAP_NET_ADMIN), as the relay does: without it the test fails, it does
//! not pass on the copy pump.

mod common;
#[path = "common/cpu.rs"]
mod cpu;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::{connect, echo_through, test_data, wait_for, TestBackend, TestBalancer};
use rodizio::units::Switch;

/// Connections held idle at once.
const IDLE: usize = 200;

/// Sends one byte and reads its echo.
fn exchange(s: &mut TcpStream, byte: u8) {
    s.write_all(&[byte]).unwrap();
    let mut back = [0u8; 1];
    s.read_exact(&mut back).unwrap();
    assert_eq!(back[0], byte);
}

/// 200 relayed connections, quiet: over 4 s, once their looks have spaced
/// out (the pause doubles from 100 ms to 1 s over the first 1.5 s of
/// quiet), their workers look at most 1,200 times in all, counted as the
/// times they went to sleep (800 measured, once a second each, with three
/// busy loops beside as without; 27 to 34 ms of CPU). At ten looks a
/// second they would look 8,000 times (the code before used 236 ms). The
/// count, not the CPU time, is bounded: on a shared machine the same looks
/// cost more or less CPU from one run to the next. Then every one of them
/// still answers at once, and 16 MiB each way through one of them after
/// the quiet arrive byte for byte (its first look after the burst may find
/// the program's limit met: it then ends on the copy pump, exactly).
#[test]
fn idle_relayed_connections_look_once_a_second() {
    let backend = TestBackend::echo();
    let mut cfg = common::config(&[backend.addr()]);
    cfg.proxy.kernel_relay = Switch::On;
    cfg.proxy.kernel_relay_after = 0;
    let lb = TestBalancer::start(cfg);
    let mut clients: Vec<TcpStream> = (0..IDLE)
        .map(|_| {
            let mut s = connect(lb.addr).unwrap();
            exchange(&mut s, b'a');
            s
        })
        .collect();
    assert!(
        wait_for(Duration::from_secs(10), || lb
            .stats
            .snapshot()
            .kernel_relayed
            >= IDLE as u64),
        "the kernel path did not take every connection: {:?}",
        lb.stats.snapshot()
    );
    // The looks space out over the first 1.5 s of quiet: the window
    // measures the settled cadence, not the way down to it.
    thread::sleep(Duration::from_secs(2));
    let (looks, used) = cpu::worker_sleeps_over(Duration::from_secs(4));
    assert!(
        looks <= 6 * IDLE as u64,
        "{IDLE} idle relayed connections looked {looks} times in 4 s ({used:?} of CPU)"
    );
    for s in &mut clients {
        exchange(s, b'b');
    }
    let data = Arc::new(test_data(16 << 20, 7));
    let back = echo_through(clients.pop().unwrap(), data.clone()).unwrap();
    assert!(back == *data, "the burst after the quiet came back changed");
    let s = lb.stats.snapshot();
    assert_eq!(s.errors, 0, "{s:?}");
    drop(clients);
    lb.stop();
}
