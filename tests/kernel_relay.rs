//! `--kernel-relay` keeps every promise of the copy pump: the same kinds of
//! tests (duplex, half-close both ways, server speaks first, a reset, many
//! downloads, the idle timeout, exact counts, the drain, a slow reader)
//! with the bytes moved by the kernel's sockmap program, from the start
//! (`kernel_relay_after` 0), then after a promotion (`kernel_relay_after`
//! 4: a connection moves to the kernel path once it has made four
//! exchanges on the copy pump). These tests need root (or CAP_BPF +
//! CAP_NET_ADMIN), as the flag does: each checks that the kernel path was
//! really taken, so without it they fail, not pass on the copy pump.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::{
    after_eof_reply, connect, echo_through, held_back, is_closed, read_checked, stream_out,
    test_data, wait_for, TestBackend, TestBalancer,
};
use rodizio::units::Switch;
use rodizio::Config;
use socket2::SockRef;

const MIB: usize = 1024 * 1024;

/// A balancer with `--kernel-relay --kernel-relay-after 0` (the kernel
/// path from the start) in front of `backend`.
fn relay_over(backend: &TestBackend, tweak: impl FnOnce(&mut Config)) -> TestBalancer {
    let mut cfg = common::config(&[backend.addr()]);
    cfg.proxy.kernel_relay = Switch::On;
    cfg.proxy.kernel_relay_after = 0;
    tweak(&mut cfg);
    TestBalancer::start(cfg)
}

/// Waits until the balancer has counted `n` finished connections.
fn wait_completed(lb: &TestBalancer, n: u64) {
    assert!(
        wait_for(Duration::from_secs(10), || lb.stats.snapshot().completed
            >= n),
        "connections did not finish: {:?}",
        lb.stats.snapshot()
    );
}

/// Waits until the relay has taken `n` connections into the kernel path:
/// a client that half-closed before that would be copied in user space
/// instead (the kernel takes only ESTABLISHED sockets), and the test would
/// not test the kernel path.
fn wait_relayed(lb: &TestBalancer, n: u64) {
    assert!(
        wait_for(Duration::from_secs(10), || lb
            .stats
            .snapshot()
            .kernel_relayed
            >= n),
        "the kernel path did not take the connection: {:?}",
        lb.stats.snapshot()
    );
}

/// `len` bytes each way at once through the relay, byte for byte; returns
/// the balancer's counters once the connection is done.
fn duplex(len: usize, seed: u64) -> rodizio::stats::StatsSnapshot {
    let backend = TestBackend::echo();
    let lb = relay_over(&backend, |_| {});
    let data = Arc::new(test_data(len, seed));
    let back = match echo_through(connect(lb.addr).unwrap(), data.clone()) {
        Ok(back) => back,
        Err(e) => panic!("transfer: {e}; {:?}", lb.stats.snapshot()),
    };
    assert_eq!(back.len(), data.len(), "lost or added bytes");
    if let Some(i) = back.iter().zip(data.iter()).position(|(a, b)| a != b) {
        panic!("first difference at byte {i}");
    }
    wait_completed(&lb, 1);
    let s = lb.stats.snapshot();
    assert_eq!(s.kernel_relayed, 1, "the kernel path was not taken: {s:?}");
    assert_eq!(s.bytes_to_backends, len as u64, "{s:?}");
    assert_eq!(s.bytes_to_clients, len as u64, "{s:?}");
    assert_eq!(s.errors, 0, "{s:?}");
    lb.stop();
    s
}

/// 10 MiB each way at once, byte for byte, with the byte counters exact.
/// The test's echo backend can fall more than the 4 MiB bound behind, and
/// then the connection ends on the copy pump: that hand-over loses and
/// doubles nothing either.
#[test]
fn ten_mib_each_way_byte_for_byte_with_exact_counts() {
    let s = duplex(10 * MIB, 0xfeed);
    assert!(s.kernel_relay_fallbacks <= 1, "{s:?}");
}

/// 2 MiB each way at once: the kernel's queue can never pass the bound,
/// so the whole transfer stays on the kernel path.
#[test]
fn two_mib_each_way_stay_on_the_kernel_path() {
    let s = duplex(2 * MIB, 0xbeef);
    assert_eq!(s.kernel_relay_fallbacks, 0, "{s:?}");
}

/// Different sizes each way, counted exactly: 12 345 bytes up, 54 321 down.
#[test]
fn byte_counts_are_exact_each_way() {
    let backend = TestBackend::start(Arc::new(|mut s: TcpStream| {
        let mut got = vec![0; 12_345];
        s.read_exact(&mut got)?;
        s.write_all(&test_data(54_321, 9))?;
        s.shutdown(Shutdown::Write)?;
        let mut rest = Vec::new();
        s.read_to_end(&mut rest)?;
        Ok(())
    }));
    let lb = relay_over(&backend, |_| {});
    let mut c = connect(lb.addr).unwrap();
    wait_relayed(&lb, 1);
    c.write_all(&test_data(12_345, 8)).unwrap();
    let mut reply = Vec::new();
    c.read_to_end(&mut reply).unwrap();
    assert!(reply == test_data(54_321, 9));
    c.shutdown(Shutdown::Write).unwrap();
    wait_completed(&lb, 1);
    let s = lb.stats.snapshot();
    assert_eq!(s.kernel_relayed, 1, "{s:?}");
    assert_eq!(
        (s.bytes_to_backends, s.bytes_to_clients),
        (12_345, 54_321),
        "{s:?}"
    );
    lb.stop();
}

/// The client sends, half-closes and reads: the backend replies only after
/// that end of stream, which the relay passes on only once every request
/// byte reached the backend. Sizes from empty to many segments.
#[test]
fn client_half_close_is_passed_on_after_its_bytes() {
    let backend = TestBackend::reply_after_eof();
    let lb = relay_over(&backend, |_| {});
    for (i, len) in [0usize, 1, 4096, 4097, 300_000, 3 * MIB]
        .into_iter()
        .enumerate()
    {
        let request = test_data(len, i as u64 + 1);
        let mut s = connect(lb.addr).unwrap();
        wait_relayed(&lb, i as u64 + 1);
        s.write_all(&request).unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        let mut reply = Vec::new();
        s.read_to_end(&mut reply)
            .expect("the whole reply, then EOF");
        assert!(reply == after_eof_reply(&request), "request of {len} bytes");
        wait_completed(&lb, i as u64 + 1);
    }
    let s = lb.stats.snapshot();
    assert_eq!(s.kernel_relayed, 6, "{s:?}");
    assert_eq!(s.errors, 0, "{s:?}");
    lb.stop();
}

/// The backend half-closes first (a reply, then its end of stream), and
/// the client keeps talking afterwards: its bytes still reach the backend
/// whole, and its own end of stream too.
#[test]
fn backend_half_close_keeps_the_other_direction() {
    let (tx, rx) = crossbeam_channel::unbounded::<Vec<u8>>();
    let backend = TestBackend::start(Arc::new(move |mut s: TcpStream| {
        // The client's first bytes come through the relay, so the relay
        // holds both sockets by the time this backend half-closes.
        let mut hi = [0u8; 2];
        s.read_exact(&mut hi)?;
        s.write_all(b"goodbye, but I still listen")?;
        s.shutdown(Shutdown::Write)?;
        let mut got = Vec::new();
        s.read_to_end(&mut got)?;
        let _ = tx.send(got);
        Ok(())
    }));
    let lb = relay_over(&backend, |_| {});
    let mut c = connect(lb.addr).unwrap();
    c.write_all(b"hi").unwrap();
    let mut first = Vec::new();
    c.read_to_end(&mut first).unwrap();
    assert_eq!(first, b"goodbye, but I still listen");
    let late = test_data(2 * MIB, 77);
    c.write_all(&late).unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    let got = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(got == late, "the client's bytes after the backend's EOF");
    wait_completed(&lb, 1);
    let s = lb.stats.snapshot();
    assert_eq!(s.kernel_relayed, 1, "{s:?}");
    assert_eq!(s.bytes_to_backends, 2 + late.len() as u64);
    lb.stop();
}

/// A server that speaks first (a greeting sent at accept, before the relay
/// has put the sockets in its maps): the greeting arrives, then the
/// conversation goes on.
#[test]
fn a_server_that_speaks_first_is_heard() {
    let backend = TestBackend::start(Arc::new(|mut s: TcpStream| {
        s.write_all(b"220 hello\r\n")?;
        common::echo(s)
    }));
    let lb = relay_over(&backend, |_| {});
    for _ in 0..20 {
        let mut c = connect(lb.addr).unwrap();
        let mut greeting = [0u8; 11];
        c.read_exact(&mut greeting).unwrap();
        assert_eq!(&greeting, b"220 hello\r\n");
        c.write_all(b"QUIT\r\n").unwrap();
        let mut echo = [0u8; 6];
        c.read_exact(&mut echo).unwrap();
        assert_eq!(&echo, b"QUIT\r\n");
    }
    wait_completed(&lb, 20);
    assert_eq!(lb.stats.snapshot().kernel_relayed, 20);
    lb.stop();
}

/// A client resets its connection in the middle of a transfer while four
/// others are under way: only that one ends, as one error; the others
/// finish byte for byte and the workers are free again.
#[test]
fn a_client_reset_mid_transfer_ends_only_that_connection() {
    const FIRST: usize = 64 * 1024;
    let backend = TestBackend::echo();
    let lb = relay_over(&backend, |_| {});
    let (ready_tx, ready_rx) = crossbeam_channel::unbounded();
    let (go_tx, go_rx) = crossbeam_channel::bounded::<()>(0);
    let good: Vec<_> = (0..4u64)
        .map(|i| {
            let (addr, ready_tx, go_rx) = (lb.addr, ready_tx.clone(), go_rx.clone());
            thread::spawn(move || {
                let data = test_data(2 * MIB, 100 + i);
                let mut s = connect(addr).unwrap();
                s.write_all(&data[..FIRST]).unwrap();
                let mut first = vec![0; FIRST];
                s.read_exact(&mut first).unwrap();
                assert_eq!(first, data[..FIRST]);
                ready_tx.send(()).unwrap();
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
    let mut bad = connect(lb.addr).unwrap();
    let data = test_data(MIB, 7);
    bad.write_all(&data[..FIRST]).unwrap();
    let mut some = vec![0; 1000];
    bad.read_exact(&mut some).unwrap();
    bad.write_all(&data[FIRST..2 * FIRST]).unwrap();
    SockRef::from(&bad)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(bad);
    assert!(wait_for(Duration::from_secs(5), || lb
        .stats
        .snapshot()
        .errors
        == 1));
    drop(go_tx);
    for t in good {
        assert!(t.join().unwrap(), "a transfer was corrupted");
    }
    assert!(lb.wait_active(0, Duration::from_secs(5)));
    let s = lb.stats.snapshot();
    assert_eq!(s.errors, 1, "{s:?}");
    assert_eq!(s.kernel_relayed, 5, "{s:?}");
    lb.stop();
}

/// A byte of a 1 MiB download, from its position and seed: no short period,
/// so a lost, doubled or reordered segment shows.
fn download_byte(i: u64, seed: u64) -> u8 {
    let x = (i ^ (i >> 11) ^ seed.wrapping_mul(0x9e37_79b9)).wrapping_mul(0x2545_f491_4f6c_dd1d);
    (x >> 56) as u8
}

/// 200 downloads of 1 MiB (the backend writes and closes at once, so the
/// relay must not close before the kernel has handed over the last bytes),
/// four clients at a time, each checked byte for byte.
#[test]
fn two_hundred_one_mib_downloads_arrive_whole() {
    let backend = TestBackend::start(Arc::new(|mut s: TcpStream| {
        let mut seed = [0u8; 1];
        s.read_exact(&mut seed)?;
        let body: Vec<u8> = (0..MIB as u64)
            .map(|i| download_byte(i, seed[0] as u64))
            .collect();
        s.write_all(&body)?;
        s.shutdown(Shutdown::Write)
    }));
    let lb = relay_over(&backend, |_| {});
    let clients: Vec<_> = (0..4u8)
        .map(|t| {
            let addr = lb.addr;
            thread::spawn(move || {
                for n in 0..50u8 {
                    let seed = t * 50 + n;
                    let mut s = connect(addr).unwrap();
                    s.write_all(&[seed]).unwrap();
                    let mut got = Vec::with_capacity(MIB);
                    s.read_to_end(&mut got).unwrap();
                    assert_eq!(got.len(), MIB, "download {seed}: length");
                    let bad = (0..MIB).position(|i| got[i] != download_byte(i as u64, seed as u64));
                    assert_eq!(bad, None, "download {seed}: first wrong byte");
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    wait_completed(&lb, 200);
    let s = lb.stats.snapshot();
    assert_eq!(s.bytes_to_clients, 200 * MIB as u64, "{s:?}");
    assert_eq!(s.errors, 0, "{s:?}");
    assert_eq!(s.kernel_relayed, 200, "{s:?}");
    lb.stop();
}

/// With `idle_timeout` 300 ms, a relayed connection that goes quiet after
/// one echo is closed after about 300 ms (not before), counted as an error,
/// though the worker never saw a byte: the kernel's counters tell it.
#[test]
fn a_quiet_connection_is_closed_at_the_idle_timeout() {
    let backend = TestBackend::echo();
    let lb = relay_over(&backend, |c| {
        c.proxy.idle_timeout = Duration::from_millis(300);
        c.workers = 1;
    });
    let mut s = connect(lb.addr).unwrap();
    // Keep it busy for longer than the timeout first: moving bytes keep
    // the connection alive.
    let started = Instant::now();
    let mut b = [0u8; 1];
    while started.elapsed() < Duration::from_millis(600) {
        s.write_all(b"x").unwrap();
        s.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"x");
    }
    let quiet_since = Instant::now();
    assert!(is_closed(&mut s), "the quiet connection was not closed");
    let waited = quiet_since.elapsed();
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(3),
        "closed after {waited:?}"
    );
    assert!(wait_for(Duration::from_secs(5), || lb
        .stats
        .snapshot()
        .errors
        == 1));
    assert_eq!(lb.stats.snapshot().kernel_relayed, 1);
    lb.stop();
}

/// Shutdown while a relayed transfer is half done: `run` waits, the
/// transfer completes byte for byte, and `run` returns after it.
#[test]
fn the_drain_waits_for_a_relayed_transfer() {
    let backend = TestBackend::echo();
    let lb = relay_over(&backend, |_| {});
    let data = test_data(2 * MIB, 42);
    let mut s = connect(lb.addr).unwrap();
    s.write_all(&data[..MIB]).unwrap();
    let mut first = vec![0; MIB];
    s.read_exact(&mut first).unwrap();
    assert!(first == data[..MIB]);
    lb.shutdown.trigger();
    assert!(
        !lb.wait_stopped(Duration::from_millis(200)),
        "run returned while a transfer was in flight"
    );
    let rest = Arc::new(data[MIB..].to_vec());
    let back = echo_through(s, rest.clone()).expect("the rest of the transfer");
    assert!(back == *rest, "the transfer was corrupted by the drain");
    assert!(
        lb.wait_stopped(Duration::from_secs(5)),
        "run did not return after the last connection ended"
    );
    assert_eq!(lb.stats.snapshot().kernel_relayed, 1);
}

/// A client that reads nothing while the backend streams 128 MiB: the
/// kernel path would queue all of it for the client; past the 4 MiB bound
/// the relay hands the connection to the copy pump, so the backend is held
/// back by TCP (what it managed to write stays within the sockets' buffers
/// plus the bound). When the client reads, all 128 MiB arrive in order.
#[test]
fn a_slow_reader_keeps_memory_bounded() {
    const TOTAL: u64 = 128 * MIB as u64;
    let written = Arc::new(AtomicU64::new(0));
    let backend = {
        let written = written.clone();
        TestBackend::start(Arc::new(move |mut s: TcpStream| {
            let mut go = [0u8; 2];
            s.read_exact(&mut go)?;
            stream_out(&mut s, TOTAL, |at| download_byte(at, 5), &written)?;
            s.shutdown(Shutdown::Write)
        }))
    };
    let lb = relay_over(&backend, |_| {});
    let s = connect(lb.addr).unwrap();
    // A small receive buffer on the client, so what the client's kernel
    // holds is not what the test measures.
    SockRef::from(&s).set_recv_buffer_size(64 * 1024).unwrap();
    let mut s = s;
    s.write_all(b"go").unwrap();
    // Wait until the backend is held back: its count stops growing.
    held_back(&written, Duration::from_secs(20));
    let held = written.load(Ordering::SeqCst);
    assert!(
        held < TOTAL,
        "the backend wrote everything: nothing held it back"
    );
    assert!(
        held <= 80 * MIB as u64,
        "{} MiB in flight toward a client that reads nothing",
        held / MIB as u64
    );
    assert!(wait_for(Duration::from_secs(5), || lb
        .stats
        .snapshot()
        .kernel_relay_fallbacks
        == 1));
    // Now read it all, checking every byte.
    assert_eq!(read_checked(&mut s, |at| download_byte(at, 5)), TOTAL);
    drop(s);
    wait_completed(&lb, 1);
    let st = lb.stats.snapshot();
    assert_eq!(st.bytes_to_clients, TOTAL, "{st:?}");
    assert_eq!(st.bytes_to_backends, 2, "{st:?}");
    lb.stop();
}

// ------------------------------------------------------------ promotion

/// Exchanges before the hand-over in the promotion tests.
const AFTER: u32 = 4;

/// A balancer with `--kernel-relay --kernel-relay-after 4` in front of
/// `backend`.
fn promoting_over(backend: &TestBackend, tweak: impl FnOnce(&mut Config)) -> TestBalancer {
    relay_over(backend, |c| {
        c.proxy.kernel_relay_after = AFTER;
        tweak(c);
    })
}

/// One request and its echo, checked byte for byte.
fn exchange(s: &mut TcpStream, n: usize) {
    let request = format!("request {n:04}\n");
    s.write_all(request.as_bytes()).unwrap();
    let mut reply = vec![0u8; request.len()];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(reply, request.as_bytes(), "exchange {n}");
}

/// Makes the `AFTER` exchanges of a promotion on `s` (through an echo
/// backend) and waits until the balancer has promoted `n` connections.
fn promote(lb: &TestBalancer, s: &mut TcpStream, n: u64) {
    for i in 0..AFTER as usize {
        exchange(s, i);
    }
    wait_relayed(lb, n);
}

/// A keep-alive client making 20 exchanges: the first four on the copy
/// pump, the rest through the kernel, every byte exact, one promotion and
/// no fall-back counted.
#[test]
fn a_chatty_connection_is_promoted_once_and_stays_exact() {
    let backend = TestBackend::echo();
    let lb = promoting_over(&backend, |_| {});
    let mut s = connect(lb.addr).unwrap();
    promote(&lb, &mut s, 1);
    for i in AFTER as usize..20 {
        exchange(&mut s, i);
    }
    s.shutdown(Shutdown::Write).unwrap();
    assert!(is_closed(&mut s));
    wait_completed(&lb, 1);
    let st = lb.stats.snapshot();
    assert_eq!(
        (st.kernel_relayed, st.kernel_relay_fallbacks),
        (1, 0),
        "{st:?}"
    );
    assert_eq!(st.bytes_to_backends, 20 * 13, "{st:?}");
    assert_eq!(st.bytes_to_clients, 20 * 13, "{st:?}");
    assert_eq!(st.errors, 0, "{st:?}");
    lb.stop();
}

/// Connections that make fewer exchanges than the threshold, and one that
/// uploads 1 MiB and gets one reply, are never promoted. (A bulk echo is:
/// each chunk back after a chunk sent is an exchange.)
#[test]
fn a_short_connection_is_never_promoted() {
    let backend = TestBackend::start(Arc::new(|mut s: TcpStream| {
        let mut first = [0u8; 1];
        s.read_exact(&mut first)?;
        if first[0] == b'U' {
            let mut upload = vec![0u8; MIB];
            s.read_exact(&mut upload)?;
            s.write_all(b"thanks")?;
            let mut rest = Vec::new();
            s.read_to_end(&mut rest)?;
            return s.shutdown(Shutdown::Write);
        }
        s.write_all(&first)?;
        common::echo(s)
    }));
    let lb = promoting_over(&backend, |_| {});
    for _ in 0..5 {
        let mut s = connect(lb.addr).unwrap();
        for i in 0..AFTER as usize - 1 {
            exchange(&mut s, i);
        }
        s.shutdown(Shutdown::Write).unwrap();
        assert!(is_closed(&mut s));
    }
    let mut s = connect(lb.addr).unwrap();
    s.write_all(b"U").unwrap();
    s.write_all(&test_data(MIB, 3)).unwrap();
    let mut thanks = [0u8; 6];
    s.read_exact(&mut thanks).unwrap();
    assert_eq!(&thanks, b"thanks");
    s.shutdown(Shutdown::Write).unwrap();
    assert!(is_closed(&mut s));
    wait_completed(&lb, 6);
    let st = lb.stats.snapshot();
    assert_eq!(
        (st.kernel_relayed, st.kernel_relay_fallbacks),
        (0, 0),
        "{st:?}"
    );
    lb.stop();
}

/// 10 MiB each way at once after the promotion, byte for byte, with the
/// byte counters exact (the copy pump's part and the kernel's added up).
#[test]
fn ten_mib_each_way_after_the_promotion() {
    let backend = TestBackend::echo();
    let lb = promoting_over(&backend, |_| {});
    let mut s = connect(lb.addr).unwrap();
    promote(&lb, &mut s, 1);
    let data = Arc::new(test_data(10 * MIB, 0xabc));
    let back = echo_through(s, data.clone()).expect("transfer");
    assert_eq!(back.len(), data.len(), "lost or added bytes");
    assert!(back == *data, "the bytes differ");
    wait_completed(&lb, 1);
    let st = lb.stats.snapshot();
    let total = 10 * MIB as u64 + u64::from(AFTER) * 13;
    assert_eq!(st.bytes_to_backends, total, "{st:?}");
    assert_eq!(st.bytes_to_clients, total, "{st:?}");
    assert_eq!(st.kernel_relayed, 1, "{st:?}");
    assert_eq!(st.errors, 0, "{st:?}");
    lb.stop();
}

/// After the promotion the client sends its last request and half-closes:
/// the backend gets every byte and the end of stream, and its reply (sent
/// after that end) comes back whole.
#[test]
fn a_client_half_close_after_the_promotion() {
    let backend = TestBackend::start(Arc::new(|mut s: TcpStream| {
        let mut line = [0u8; 13];
        for _ in 0..AFTER {
            s.read_exact(&mut line)?;
            s.write_all(&line)?;
        }
        let mut rest = Vec::new();
        s.read_to_end(&mut rest)?;
        s.write_all(&after_eof_reply(&rest))?;
        s.shutdown(Shutdown::Write)
    }));
    let lb = promoting_over(&backend, |_| {});
    let mut s = connect(lb.addr).unwrap();
    promote(&lb, &mut s, 1);
    let last = test_data(300_000, 21);
    s.write_all(&last).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let mut reply = Vec::new();
    s.read_to_end(&mut reply).unwrap();
    assert!(
        reply == after_eof_reply(&last),
        "the reply after the half-close"
    );
    wait_completed(&lb, 1);
    let st = lb.stats.snapshot();
    assert_eq!((st.kernel_relayed, st.errors), (1, 0), "{st:?}");
    assert_eq!(
        st.bytes_to_backends,
        u64::from(AFTER) * 13 + last.len() as u64
    );
    lb.stop();
}

/// A backend that closes right after its reply to the fifth request (a
/// `Connection: close` answer): the client gets the whole reply, then the
/// end of stream, and the connection ends cleanly, the backend first.
#[test]
fn a_backend_that_closes_right_after_its_reply() {
    let backend = TestBackend::start(Arc::new(|mut s: TcpStream| {
        let mut line = [0u8; 13];
        for _ in 0..AFTER {
            s.read_exact(&mut line)?;
            s.write_all(&line)?;
        }
        s.read_exact(&mut line)?;
        s.write_all(&test_data(200_000, 5))?;
        Ok(()) // dropped: closed at once
    }));
    let lb = promoting_over(&backend, |_| {});
    let mut s = connect(lb.addr).unwrap();
    promote(&lb, &mut s, 1);
    s.write_all(b"request 0004\n").unwrap();
    let mut reply = Vec::new();
    s.read_to_end(&mut reply).unwrap();
    assert!(reply == test_data(200_000, 5), "the last reply, whole");
    drop(s);
    wait_completed(&lb, 1);
    let st = lb.stats.snapshot();
    assert_eq!(st.kernel_relayed, 1, "{st:?}");
    assert_eq!(st.ended_backend_closed, 1, "{st:?}");
    lb.stop();
}

/// A promoted connection that goes quiet is closed at the idle timeout
/// (300 ms), not before, counted as an error.
#[test]
fn a_promoted_connection_is_closed_at_the_idle_timeout() {
    let backend = TestBackend::echo();
    let lb = promoting_over(&backend, |c| {
        c.proxy.idle_timeout = Duration::from_millis(300);
    });
    let mut s = connect(lb.addr).unwrap();
    promote(&lb, &mut s, 1);
    exchange(&mut s, 99);
    let quiet_since = Instant::now();
    assert!(is_closed(&mut s), "the quiet connection was not closed");
    let waited = quiet_since.elapsed();
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(3),
        "closed after {waited:?}"
    );
    assert!(wait_for(Duration::from_secs(5), || lb
        .stats
        .snapshot()
        .ended_idle_timeout
        == 1));
    lb.stop();
}

/// After the promotion, a client that reads nothing while the backend
/// streams 128 MiB: past the 4 MiB bound the connection goes back to the
/// copy pump (one fall-back counted), the backend is held back, and all
/// the bytes arrive in order once the client reads.
#[test]
fn the_backlog_bound_after_the_promotion() {
    const TOTAL: u64 = 128 * MIB as u64;
    let written = Arc::new(AtomicU64::new(0));
    let backend = {
        let written = written.clone();
        TestBackend::start(Arc::new(move |mut s: TcpStream| {
            let mut line = [0u8; 13];
            for _ in 0..AFTER {
                s.read_exact(&mut line)?;
                s.write_all(&line)?;
            }
            s.read_exact(&mut line)?;
            stream_out(&mut s, TOTAL, |at| download_byte(at, 6), &written)?;
            s.shutdown(Shutdown::Write)
        }))
    };
    let lb = promoting_over(&backend, |_| {});
    let mut s = connect(lb.addr).unwrap();
    SockRef::from(&s).set_recv_buffer_size(64 * 1024).unwrap();
    promote(&lb, &mut s, 1);
    s.write_all(b"request 0004\n").unwrap();
    assert!(
        wait_for(Duration::from_secs(20), || lb
            .stats
            .snapshot()
            .kernel_relay_fallbacks
            == 1),
        "the backlog bound did not send the connection back to the copy pump"
    );
    // Wait until the backend is held back: its count stops growing.
    assert!(held_back(&written, Duration::from_secs(20)));
    let held = written.load(Ordering::SeqCst);
    assert!(
        held < TOTAL,
        "the backend wrote everything: nothing held it back"
    );
    assert!(
        held <= 80 * MIB as u64,
        "{} MiB in flight",
        held / MIB as u64
    );
    assert_eq!(read_checked(&mut s, |at| download_byte(at, 6)), TOTAL);
    drop(s);
    wait_completed(&lb, 1);
    let st = lb.stats.snapshot();
    assert_eq!(st.bytes_to_clients, TOTAL + u64::from(AFTER) * 13, "{st:?}");
    assert_eq!(st.kernel_relayed, 1, "{st:?}");
    lb.stop();
}

/// `kernel_relay` is live: a connection opened after it is turned on is
/// promoted, one opened after it is turned off again is not, while the
/// first, already promoted, carries on exact.
#[test]
fn the_relay_is_turned_on_and_off_live_for_new_connections() {
    let backend = TestBackend::echo();
    let lb = TestBalancer::start(common::config(&[backend.addr()]));
    let chat = |lb: &TestBalancer| {
        let mut s = connect(lb.addr).unwrap();
        for i in 0..AFTER as usize {
            exchange(&mut s, i);
        }
        s
    };
    let on = rodizio::proxy::ProxyConfig {
        kernel_relay: Switch::On,
        kernel_relay_after: AFTER,
        ..lb.live.proxy.load().as_ref().clone()
    };
    let off = rodizio::proxy::ProxyConfig {
        kernel_relay: Switch::Off,
        ..on.clone()
    };
    lb.live.proxy.store(Arc::new(off.clone()));
    let mut before = chat(&lb);
    lb.live.proxy.store(Arc::new(on));
    let mut promoted = chat(&lb);
    wait_relayed(&lb, 1);
    lb.live.proxy.store(Arc::new(off));
    let mut after = chat(&lb);
    for s in [&mut before, &mut promoted, &mut after] {
        exchange(s, 50);
        s.shutdown(Shutdown::Write).unwrap();
        assert!(is_closed(s));
    }
    wait_completed(&lb, 3);
    let st = lb.stats.snapshot();
    assert_eq!((st.kernel_relayed, st.errors), (1, 0), "{st:?}");
    lb.stop();
}

/// A service with an upload or a download rate keeps its connections on
/// the copy pump (the caps live in its token buckets): never promoted, and
/// no fall-back counted either.
#[test]
fn a_rate_keeps_the_copy_pump() {
    use rodizio::units::ByteRate;
    let backend = TestBackend::echo();
    for up in [true, false] {
        let lb = promoting_over(&backend, |c| {
            let rate = Some(ByteRate(10 << 20));
            if up {
                c.proxy.upload_rate = rate;
            } else {
                c.proxy.download_rate = rate;
            }
        });
        let mut s = connect(lb.addr).unwrap();
        for i in 0..3 * AFTER as usize {
            exchange(&mut s, i);
        }
        s.shutdown(Shutdown::Write).unwrap();
        assert!(is_closed(&mut s));
        wait_completed(&lb, 1);
        let st = lb.stats.snapshot();
        assert_eq!(
            (st.kernel_relayed, st.kernel_relay_fallbacks),
            (0, 0),
            "{st:?}"
        );
        lb.stop();
    }
}
