//! The kernel relay after a promotion (`--kernel-relay
//! --kernel-relay-after 4`), attacked: resets on either side once the
//! kernel moves the bytes, 200 promoted connections reset at once, a slow
//! reader behind a fast writer, the same with the balancer frozen (the
//! bound kept by the kernel), a backend that closes while its bytes are
//! kept, resets on either side while the bound holds, descriptors and
//! workers run out while 500 connections are promoted. The balancer runs as a child process, so
//! its descriptors and memory are its own to count. Needs root (or
//! CAP_BPF + CAP_NET_ADMIN), as the relay does: each test checks the
//! promotions counted, so without the kernel path it fails.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use socket2::SockRef;

use crate::child::Child;
use crate::common::{
    connect, held_back, is_closed, read_checked, stream_out, test_data, until, wait_for,
    TestBackend, IO_TIMEOUT,
};

/// Exchanges before the hand-over.
const AFTER: usize = 4;

/// A balancer child that promotes after four exchanges, in front of
/// `backend`, with its admin API for the counters.
fn promoting(backend: &TestBackend) -> Child {
    promoting_with(backend, 512, |_| {})
}

/// [`promoting`] with `workers` workers, no active checks (their sockets
/// would come and go while descriptors are counted), and `prepare` run on
/// the command before it starts.
fn promoting_with(
    backend: &TestBackend,
    workers: usize,
    prepare: impl FnOnce(&mut std::process::Command),
) -> Child {
    let (addr, workers) = (backend.addr().to_string(), workers.to_string());
    Child::on_loopback(
        &[
            "-b",
            &addr,
            "--health-check",
            "off",
            "--kernel-relay",
            "--kernel-relay-after",
            "4",
            "--admin",
            "127.0.0.1:0",
            "--workers",
            &workers,
        ],
        prepare,
    )
}

/// Makes the four exchanges of a promotion through an echo backend.
fn chat(s: &mut TcpStream) {
    for i in 0..AFTER {
        let line = format!("hello {i:06}\n");
        s.write_all(line.as_bytes()).unwrap();
        let mut back = vec![0u8; line.len()];
        s.read_exact(&mut back).unwrap();
        assert_eq!(back, line.as_bytes());
    }
}

/// A client with a small receive buffer, promoted by its four exchanges
/// through `child` (its first connection).
fn promoted_slow_reader(child: &Child) -> TcpStream {
    let mut c = connect(child.addr).unwrap();
    SockRef::from(&c).set_recv_buffer_size(64 * 1024).unwrap();
    chat(&mut c);
    until("the promotion", || {
        child.metric("kernel_relayed_total") == 1
    });
    c
}

/// The go to a streaming backend ([`promoted_then_go`]) toward a client
/// that reads nothing: the connection meets the bound and goes back to
/// the copy pump (the first fall-back of `child`).
fn go_past_the_bound(child: &Child, c: &mut TcpStream) {
    c.write_all(b"G").unwrap();
    until("the fall-back to the copy pump", || {
        child.metric("kernel_relay_fallbacks_total") == 1
    });
}

/// A streaming backend's side of the promotion: echoes the client's four
/// exchanges ([`chat`]), then waits for its one-byte go.
fn promoted_then_go(s: &mut TcpStream) -> std::io::Result<()> {
    let mut line = [0u8; 13];
    for _ in 0..AFTER {
        s.read_exact(&mut line)?;
        s.write_all(&line)?;
    }
    s.read_exact(&mut [0u8; 1])
}

/// One connection promoted and ended first, so that the program and its
/// maps are loaded before descriptors are counted; then `n` connections
/// promoted and kept open. The descriptors open between the two, and the
/// `n` clients.
fn promoted_after_a_first(child: &Child, n: usize) -> (usize, Vec<TcpStream>) {
    let mut first = connect(child.addr).unwrap();
    chat(&mut first);
    until("the first promotion", || {
        child.metric("kernel_relayed_total") == 1
    });
    first.shutdown(Shutdown::Write).unwrap();
    assert!(is_closed(&mut first));
    until("the first connection's end", || {
        child.metric("completed_total") == 1
    });
    let start = child.open_fds();
    let clients = (0..n)
        .map(|_| {
            let mut c = connect(child.addr).unwrap();
            chat(&mut c);
            c
        })
        .collect();
    until(&format!("{n} promotions"), || {
        child.metric("kernel_relayed_total") == 1 + n as u64
    });
    (start, clients)
}

/// Resets a socket: `SO_LINGER` 0, then close.
fn reset(s: TcpStream) {
    SockRef::from(&s).set_linger(Some(Duration::ZERO)).unwrap();
    drop(s);
}

/// A client that resets once the kernel moves its bytes, in the middle of
/// a transfer, then a backend that does the same: each ends as its reset,
/// the process stays up and serves the next client.
#[test]
fn resets_on_either_side_after_the_promotion() {
    let backend = TestBackend::start(Arc::new(|mut s: TcpStream| {
        let mut line = [0u8; 13];
        for _ in 0..AFTER {
            s.read_exact(&mut line)?;
            s.write_all(&line)?;
        }
        let mut what = [0u8; 1];
        s.read_exact(&mut what)?;
        if what[0] == b'R' {
            // The backend resets in the middle of its reply.
            s.write_all(&test_data(100_000, 1))?;
            reset(s);
            return Ok(());
        }
        crate::common::echo(s)
    }));
    let mut child = promoting(&backend);
    // The client resets mid-way through a transfer.
    let mut c = connect(child.addr).unwrap();
    chat(&mut c);
    until("the promotion", || {
        child.metric("kernel_relayed_total") == 1
    });
    c.write_all(b"E").unwrap();
    c.write_all(&test_data(500_000, 2)).unwrap();
    reset(c);
    until("the client's reset", || {
        child.metric("ended_client_reset_total") == 1
    });
    // The backend resets mid-way through its reply.
    let mut c = connect(child.addr).unwrap();
    chat(&mut c);
    until("the second promotion", || {
        child.metric("kernel_relayed_total") == 2
    });
    c.write_all(b"R").unwrap();
    let mut sink = Vec::new();
    let _ = c.read_to_end(&mut sink);
    assert!(sink.len() <= 100_000, "more bytes than the backend sent");
    until("the backend's reset", || {
        child.metric("ended_backend_reset_total") == 1
    });
    assert!(child.alive(), "the balancer died: {}", child.log());
    // And the next client is served, promoted, whole.
    let mut c = connect(child.addr).unwrap();
    chat(&mut c);
    c.write_all(b"Eagain").unwrap();
    let mut back = [0u8; 5];
    c.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"again");
    until("the third promotion", || {
        child.metric("kernel_relayed_total") == 3
    });
}

/// 200 connections promoted to the kernel path, then all reset at once
/// by their clients: the process stays up, and its descriptors go back to
/// where they were (the sockets, hence their entries in the kernel's maps,
/// are gone); the program's own maps stay loaded for the next ones.
#[test]
fn two_hundred_promoted_connections_reset_at_once() {
    const N: usize = 200;
    let backend = TestBackend::echo();
    let mut child = promoting(&backend);
    let (start, mut clients) = promoted_after_a_first(&child, N);
    assert!(
        child.open_fds() >= start + N,
        "the connections are not open"
    );
    for c in clients.drain(..) {
        reset(c);
    }
    until("every connection's end", || {
        child.metric("completed_total") == 1 + N as u64
    });
    assert!(
        wait_for(Duration::from_secs(10), || child.open_fds() <= start),
        "descriptors left: {} against {start} before",
        child.open_fds()
    );
    assert!(child.alive(), "the balancer died: {}", child.log());
    assert_eq!(child.metric("kernel_relay_fallbacks_total"), 0);
    // The kernel path still takes new connections.
    let mut c = connect(child.addr).unwrap();
    chat(&mut c);
    until("a promotion after the resets", || {
        child.metric("kernel_relayed_total") == 2 + N as u64
    });
}

/// After the promotion, a backend streams 1 GiB as fast as it can to a
/// client that reads nothing: the kernel's queue toward the client passes
/// the 4 MiB bound, the connection goes back to the copy pump (counted),
/// TCP holds the backend back, and the balancer's memory stays small. The
/// client then reads every byte. (The bound is the program's: the next
/// test freezes the balancer to show it.)
#[test]
fn a_slow_reader_behind_a_fast_writer_after_the_promotion() {
    const TOTAL: u64 = 1 << 30;
    let written = Arc::new(AtomicU64::new(0));
    let backend = {
        let written = written.clone();
        TestBackend::start(Arc::new(move |mut s: TcpStream| {
            promoted_then_go(&mut s)?;
            let chunk = vec![7u8; 256 * 1024];
            let mut at = 0u64;
            while at < TOTAL {
                s.write_all(&chunk)?;
                at += chunk.len() as u64;
                written.store(at, Ordering::SeqCst);
            }
            s.shutdown(Shutdown::Write)
        }))
    };
    let mut child = promoting(&backend);
    let rss_before = child.rss_kib();
    let mut c = promoted_slow_reader(&child);
    go_past_the_bound(&child, &mut c);
    // Held back: the count stops growing, far below the total.
    assert!(held_back(&written, Duration::from_secs(20)));
    let held = written.load(Ordering::SeqCst);
    eprintln!("the backend was held back at {} MiB", held >> 20);
    assert!(
        held < TOTAL / 2,
        "{} MiB written: nothing held it back",
        held >> 20
    );
    let grown = child.rss_kib().saturating_sub(rss_before);
    assert!(grown < 32 * 1024, "the balancer grew by {grown} KiB");
    assert_eq!(read_checked(&mut c, |_| 7), TOTAL);
    assert!(child.alive(), "the balancer died: {}", child.log());
}

/// A byte of the stream in [`the_bound_holds_while_the_balancer_gets_no_cpu`]:
/// a period of 251 shows a byte lost, added or moved.
fn stream_byte(at: u64) -> u8 {
    (at % 251) as u8
}

/// `SIOCOUTQ` (bytes not yet acknowledged) or `SIOCINQ` (bytes unread).
fn queued(s: &TcpStream, request: libc::c_ulong) -> u64 {
    use std::os::fd::AsRawFd;
    let mut n: libc::c_int = 0;
    // SAFETY: both requests write one int.
    assert_eq!(unsafe { libc::ioctl(s.as_raw_fd(), request, &mut n) }, 0);
    n.max(0) as u64
}

/// The backlog bound is the kernel's to keep, not a thread's to sample:
/// after the promotion the balancer is frozen (`SIGSTOP`: none of its
/// threads runs, as on a saturated CPU at its worst), the client reads
/// nothing, and the backend writes 256 MiB as fast as it can. What the
/// balancer's sockets hold stops at the bound plus their own buffers
/// (measured: the backend's count less its unsent bytes and the client's
/// unread ones); with a bound kept by sampling, the kernel took it all.
/// Thawed, the connection goes back to the copy pump (counted) and every
/// byte arrives, in order.
#[test]
fn the_bound_holds_while_the_balancer_gets_no_cpu() {
    const TOTAL: u64 = 256 << 20;
    const BOUND: u64 = rodizio::proxy::kernel_relay::BACKLOG_BOUND;
    let written = Arc::new(AtomicU64::new(0));
    let writer: Arc<std::sync::Mutex<Option<TcpStream>>> = Arc::default();
    let backend = {
        let (written, writer) = (written.clone(), writer.clone());
        TestBackend::start(Arc::new(move |mut s: TcpStream| {
            promoted_then_go(&mut s)?;
            *writer.lock().unwrap() = Some(s.try_clone()?);
            s.set_write_timeout(Some(Duration::from_secs(60)))?;
            stream_out(&mut s, TOTAL, stream_byte, &written)?;
            s.shutdown(Shutdown::Write)
        }))
    };
    let mut child = promoting(&backend);
    let mut c = promoted_slow_reader(&child);
    child.signal(libc::SIGSTOP);
    c.write_all(b"G").unwrap();
    // Held back: the backend's count stops growing.
    let settled = held_back(&written, Duration::from_secs(30));
    let at = written.load(Ordering::SeqCst);
    let unsent = writer
        .lock()
        .unwrap()
        .as_ref()
        .map_or(0, |w| queued(w, libc::TIOCOUTQ));
    let unread = queued(&c, libc::FIONREAD);
    let held = at.saturating_sub(unsent + unread);
    eprintln!(
        "frozen balancer: the backend wrote {} MiB, the balancer holds {} KiB (bound {} KiB)",
        at >> 20,
        held >> 10,
        BOUND >> 10,
    );
    child.signal(libc::SIGCONT);
    assert!(
        settled,
        "the backend was never held back ({} MiB)",
        at >> 20
    );
    // The bound, and on top what the balancer's two sockets hold of their
    // own: the backend's kept bytes (its receive buffer, still small when
    // the bound is met) and the client's unsent ones (its send buffer).
    assert!(
        held <= 2 * BOUND,
        "the balancer holds {} KiB, over twice the bound",
        held >> 10
    );
    assert_eq!(read_checked(&mut c, stream_byte), TOTAL);
    until("the fall-back to the copy pump", || {
        child.metric("kernel_relay_fallbacks_total") == 1
    });
    assert!(child.alive(), "the balancer died: {}", child.log());
}

/// 500 connections promoted to the kernel path, then 100 more clients
/// while the balancer is out of descriptors (`RLIMIT_NOFILE` 1,120: the
/// 500 hold 1,000) and near its worker bound (520): the process stays up,
/// every promoted connection still echoes while it is stuck, the clients
/// left waiting are served once 300 promoted connections close, and every
/// descriptor comes back.
#[test]
fn descriptors_and_workers_run_out_while_500_connections_are_promoted() {
    const PROMOTED: usize = 500;
    const MORE: usize = 100;
    let backend = TestBackend::echo();
    let mut child = promoting_with(&backend, 520, |command| {
        crate::common::limit_in_child(command, libc::RLIMIT_NOFILE, 1120)
    });
    let (start, mut promoted) = promoted_after_a_first(&child, PROMOTED);
    // More clients than descriptors and workers are left: each sends a
    // line and waits for it.
    let line = |i: usize| format!("waiting {i:05}\n");
    let mut waiting: Vec<TcpStream> = (0..MORE)
        .map(|i| {
            let mut c = connect(child.addr).unwrap();
            c.write_all(line(i).as_bytes()).unwrap();
            c
        })
        .collect();
    assert!(
        wait_for(Duration::from_secs(30), || child
            .log()
            .contains("Too many open files")),
        "never ran out of descriptors ({} open): {}",
        child.open_fds(),
        child.log()
    );
    // Stuck: the kernel still relays the promoted connections.
    for (i, c) in promoted.iter_mut().enumerate().step_by(50) {
        let probe = format!("probe {i:07}\n");
        c.write_all(probe.as_bytes()).unwrap();
        let mut back = vec![0u8; probe.len()];
        c.read_exact(&mut back).unwrap();
        assert_eq!(back, probe.as_bytes(), "promoted connection {i}");
    }
    assert!(child.alive(), "the balancer died: {}", child.log());
    // 300 promoted connections end: the waiting clients are served.
    for mut c in promoted.drain(..300) {
        c.shutdown(Shutdown::Write).unwrap();
        assert!(is_closed(&mut c));
    }
    for (i, c) in waiting.iter_mut().enumerate() {
        let want = line(i);
        let mut back = vec![0u8; want.len()];
        c.read_exact(&mut back)
            .unwrap_or_else(|e| panic!("waiting client {i}: {e}; {}", child.log()));
        assert_eq!(back, want.as_bytes());
    }
    drop(waiting);
    drop(promoted);
    assert!(
        wait_for(Duration::from_secs(30), || child.open_fds() <= start),
        "descriptors left: {} against {start} before",
        child.open_fds()
    );
    assert!(child.alive(), "the balancer died: {}", child.log());
    // The kernel path still takes new connections.
    let mut c = connect(child.addr).unwrap();
    chat(&mut c);
    until("a promotion after the exhaustion", || {
        child.metric("kernel_relayed_total") >= 2 + PROMOTED as u64
    });
}

/// A backend that writes 16 MiB (past the 4 MiB bound) to a client that
/// reads nothing, then closes: its end of stream arrives while the
/// balancer's socket still keeps bytes the program held back for the copy
/// pump. The client then reads every byte in order and a clean end after
/// them, never an end before the kept bytes; the connection counts one
/// fall-back and ends as the backend's close.
#[test]
fn a_backend_that_closes_while_its_bytes_are_kept_is_heard_to_the_end() {
    const TOTAL: u64 = 16 << 20;
    let written = Arc::new(AtomicU64::new(0));
    let backend = {
        let written = written.clone();
        TestBackend::start(Arc::new(move |mut s: TcpStream| {
            promoted_then_go(&mut s)?;
            s.set_write_timeout(Some(Duration::from_secs(60)))?;
            stream_out(&mut s, TOTAL, stream_byte, &written)?;
            s.shutdown(Shutdown::Write)
        }))
    };
    let child = promoting(&backend);
    let mut c = promoted_slow_reader(&child);
    go_past_the_bound(&child, &mut c);
    // Held back by the bound and the sockets' buffers, or done: either
    // way the backend's close comes while bytes wait in the balancer.
    assert!(held_back(&written, Duration::from_secs(20)));
    assert_eq!(read_checked(&mut c, stream_byte), TOTAL);
    c.shutdown(Shutdown::Write).unwrap();
    until("the connection's end", || {
        child.metric("completed_total") == 1
    });
    assert_eq!(
        child.metric("ended_backend_closed_total"),
        1,
        "{}",
        child.log()
    );
}

/// The relay's counters and the balancer's log, for a wait that failed.
fn relay_state(child: &Child) -> String {
    let metrics: Vec<String> = [
        "kernel_relayed_total",
        "kernel_relay_fallbacks_total",
        "active",
        "completed_total",
    ]
    .iter()
    .map(|m| format!("{m} {}", child.metric(m)))
    .collect();
    format!("{}; log: {}", metrics.join(", "), child.log())
}

/// Resets while the bound holds a connection back (the program latched,
/// the worker settling or the copy pump reading the kept bytes): first the
/// stalled client resets, then, on a second connection, the streaming
/// backend does. Each ends only its own connection, the process stays up
/// and serves the next client, and the descriptors come back.
#[test]
fn resets_while_the_bound_holds_end_only_their_connection() {
    // The backend streams until told to reset (its writes time out every
    // 100 ms while the client reads nothing, so it hears the word).
    let stop = Arc::new(AtomicBool::new(false));
    let backend = {
        let stop = stop.clone();
        TestBackend::start(Arc::new(move |mut s: TcpStream| {
            promoted_then_go(&mut s)?;
            s.set_write_timeout(Some(Duration::from_millis(100)))?;
            let chunk = vec![7u8; 64 * 1024];
            while !stop.load(Ordering::SeqCst) {
                match s.write(&chunk) {
                    Err(e) if !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                        return Err(e)
                    }
                    _ => {}
                }
            }
            reset(s);
            Ok(())
        }))
    };
    let mut child = promoting(&backend);
    // A first connection, ended, so that the maps are loaded before the
    // descriptors are counted.
    let mut first = connect(child.addr).unwrap();
    chat(&mut first);
    first.shutdown(Shutdown::Write).unwrap();
    assert!(is_closed(&mut first));
    until("the first connection's end", || {
        child.metric("completed_total") == 1
    });
    let fds = child.open_fds();
    for (n, client_resets) in [(1u64, true), (2, false)] {
        let relayed = child.metric("kernel_relayed_total");
        let mut c = connect(child.addr).unwrap();
        SockRef::from(&c).set_recv_buffer_size(64 * 1024).unwrap();
        chat(&mut c);
        // On the kernel path before the go, as the slow reader's tests
        // are, so that the stream that follows meets the program's bound.
        until("the promotion", || {
            child.metric("kernel_relayed_total") == relayed + 1
        });
        c.write_all(b"G").unwrap();
        assert!(
            wait_for(IO_TIMEOUT, || child.metric("kernel_relay_fallbacks_total")
                == n),
            "the bound not met on connection {n}: {}",
            relay_state(&child)
        );
        if client_resets {
            reset(c);
        } else {
            stop.store(true, Ordering::SeqCst);
            // The client hears the backend's reset as a reset, after what
            // arrived before it.
            let mut buf = vec![0u8; 256 * 1024];
            let end = loop {
                match c.read(&mut buf) {
                    Ok(n) if n > 0 => continue,
                    other => break other,
                }
            };
            assert!(
                matches!(&end, Err(e) if e.kind() == ErrorKind::ConnectionReset),
                "the client heard {end:?}"
            );
        }
        // The first, and each earlier round's two, are counted already.
        until(&format!("the end of connection {n}"), || {
            child.metric("completed_total") == 2 * n
        });
        let mut next = connect(child.addr).unwrap();
        chat(&mut next);
        drop(next);
    }
    until("every descriptor back", || child.open_fds() <= fds);
    assert!(child.alive(), "the balancer died: {}", child.log());
}
