//! A waiting connection costs no CPU: the worker sleeps in poll(2) and does
//! not spin. In a test binary of its own so no other test's threads count.

mod common;
#[path = "common/cpu.rs"]
mod cpu;

use std::io::{Read, Write};
use std::net::Shutdown;
use std::sync::Arc;
use std::time::Duration;

use common::{connect, TestBackend, TestBalancer};

/// Three kinds of waiting connection, held at once: fully open and quiet;
/// half-closed by the client while the backend takes its time; half-closed
/// by the backend while the client stays. Together their workers use at
/// most 50 ms of CPU in half a second, and all three then finish
/// normally.
#[test]
fn waiting_connections_do_not_spin() {
    let (release_tx, release_rx) = crossbeam_channel::bounded::<()>(0);
    let (seen_tx, seen_rx) = crossbeam_channel::unbounded::<&'static str>();
    let backend = TestBackend::start(Arc::new(move |mut s: std::net::TcpStream| {
        let mut first = [0u8; 1];
        s.read_exact(&mut first)?;
        match first[0] {
            // Echo while the client talks.
            b'e' => {
                s.write_all(&first)?;
                common::echo(s)
            }
            // Read to the end, wait for the release, then reply.
            b'h' => {
                let mut rest = Vec::new();
                s.read_to_end(&mut rest)?;
                let _ = seen_tx.send("client eof");
                let _ = release_rx.recv_timeout(Duration::from_secs(10));
                s.write_all(b"late reply")?;
                s.shutdown(Shutdown::Write)
            }
            // Close our sending side at once, then wait for the client's end.
            _ => {
                s.shutdown(Shutdown::Write)?;
                let mut rest = Vec::new();
                s.read_to_end(&mut rest)?;
                s.write_all(b"")
            }
        }
    }));
    let lb = TestBalancer::over(&[backend.addr()]);

    let mut quiet = connect(lb.addr).unwrap();
    quiet.write_all(b"e").unwrap();
    let mut b = [0u8];
    quiet.read_exact(&mut b).unwrap();

    let mut half = connect(lb.addr).unwrap();
    half.write_all(b"hello").unwrap();
    half.shutdown(Shutdown::Write).unwrap();
    assert_eq!(
        seen_rx.recv_timeout(Duration::from_secs(5)),
        Ok("client eof")
    );

    let mut other_half = connect(lb.addr).unwrap();
    other_half.write_all(b"b").unwrap();
    let mut got = Vec::new();
    // The backend's end of stream reaches us while our side stays open.
    other_half.read_to_end(&mut got).unwrap();
    assert!(got.is_empty());

    assert_eq!(lb.stats.snapshot().active, 3);
    let used = cpu::worker_cpu_over(Duration::from_millis(500));
    assert!(
        used <= Duration::from_millis(50),
        "waiting workers used {used:?} of CPU"
    );

    drop(release_tx);
    let mut reply = Vec::new();
    half.read_to_end(&mut reply).unwrap();
    assert_eq!(reply, b"late reply");
    quiet.shutdown(Shutdown::Write).unwrap();
    assert_eq!(quiet.read(&mut b).unwrap(), 0);
    other_half.shutdown(Shutdown::Write).unwrap();
    assert!(lb.wait_active(0, Duration::from_secs(5)));
    assert_eq!(lb.stats.snapshot().errors, 0);
    lb.stop();
}
