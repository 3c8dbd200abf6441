//! The balancer's port: garbage, resets mid-way, many idle clients, slow peers.

use std::io::{self, Read, Write};
use std::net::{self, SocketAddr, TcpStream};

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use socket2::SockRef;

use crate::child::Child;
use crate::common::{
    self, connect, echo_through, test_data, until, wait_for, TestBackend, TestBalancer,
};

/// Open TCP sockets on IPv4 (listening ones aside, and those in
/// `TIME_WAIT`, which hold no descriptor) with one end on one of `ports`.
/// Other tests run in the same process at the same time, so counting this
/// process's descriptors would count theirs too; a test's ports are its
/// own.
pub(crate) fn sockets_on(ports: &[u16]) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let port = |end: &str| u16::from_str_radix(end.rsplit(':').next().unwrap(), 16).unwrap();
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (local, remote, state, inode) = (f[1], f[2], f[3], f[9]);
            // 0A: LISTEN. Inode 0: no descriptor (TIME_WAIT and the like).
            state != "0A"
                && inode != "0"
                && (ports.contains(&port(local)) || ports.contains(&port(remote)))
        })
        .count()
}

/// Resets `stream`: SO_LINGER 0, then close.
pub(crate) fn reset(stream: TcpStream) {
    SockRef::from(&stream)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(stream);
}

/// One echo round trip of `byte` on `s`.
fn round_trip(s: &mut TcpStream, byte: u8) -> bool {
    let mut b = [0u8];
    s.write_all(&[byte]).is_ok() && s.read_exact(&mut b).is_ok() && b[0] == byte
}

/// A new client through `addr` is echoed one byte within 5 s.
fn serves(addr: SocketAddr) -> bool {
    let Ok(mut s) = connect(addr) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    round_trip(&mut s, b'!')
}

/// Garbage shaped like broken protocols, and random bytes with runs of
/// zeros, cross the balancer both ways on eight connections at once, byte
/// for byte, and each connection ends as a clean close.
#[test]
fn garbage_and_random_bytes_cross_both_ways_byte_exact() {
    let backend = TestBackend::echo();
    let lb = TestBalancer::over(&[backend.addr()]);
    let mut garbage: Vec<u8> =
        b"GET / HTTP/9.9\r\n\0\0\xff\xfe\r\n\r\n\x16\x03\x01\x02\x00".to_vec();
    garbage.extend(b"PROXY TCP4 1.2.3.4\r\n\r\n\0\r\nQUIT\n".repeat(1000));
    garbage.extend((0..=255u8).cycle().take(70_000));
    let sends: Vec<Arc<Vec<u8>>> = (0..8u64)
        .map(|i| match i {
            0 => Arc::new(garbage.clone()),
            _ => Arc::new(test_data(300_000 + i as usize * 7919, i)),
        })
        .collect();
    let threads: Vec<_> = sends
        .iter()
        .map(|data| {
            let (addr, data) = (lb.addr, data.clone());
            thread::spawn(move || echo_through(connect(addr)?, data))
        })
        .collect();
    for (thread, sent) in threads.into_iter().zip(&sends) {
        let back = thread.join().unwrap().expect("transfer");
        assert!(
            back == **sent,
            "{} bytes sent, {} back",
            sent.len(),
            back.len()
        );
    }
    until("eight connections ended", || {
        lb.stats.snapshot().completed == 8
    });
    let s = lb.stats.snapshot();
    let sent: u64 = sends.iter().map(|d| d.len() as u64).sum();
    assert_eq!((s.bytes_to_backends, s.bytes_to_clients), (sent, sent));
    assert_eq!(s.errors, 0, "{s:?}");
    lb.stop();
}

/// A backend that writes without end, as fast as it is let.
fn firehose(written: Arc<AtomicU64>) -> TestBackend {
    TestBackend::start(Arc::new(move |mut s: TcpStream| {
        let chunk = vec![b'x'; 64 * 1024];
        // Bounded: 1 GiB at most, and the socket's 10 s write timeout.
        for _ in 0..16 * 1024 {
            let n = s.write(&chunk)?;
            written.fetch_add(n as u64, Ordering::SeqCst);
        }
        Ok(())
    }))
}

/// Half of a bystander's transfer: connects, has its first 64 KiB of
/// `data` echoed, and returns the connection mid-transfer.
fn bystander_half(addr: SocketAddr, data: &[u8]) -> TcpStream {
    let mut s = connect(addr).unwrap();
    s.write_all(&data[..64 * 1024]).unwrap();
    let mut back = vec![0; 64 * 1024];
    s.read_exact(&mut back).unwrap();
    assert!(back == data[..64 * 1024]);
    s
}

/// The bystander's other half: the rest of `data` comes back byte for
/// byte.
fn bystander_rest(s: TcpStream, data: &[u8]) -> bool {
    let rest = Arc::new(data[64 * 1024..].to_vec());
    echo_through(s, rest.clone()).is_ok_and(|back| back == *rest)
}

/// A client resets (SO_LINGER 0) while a backend streams to it: only that
/// connection ends, counted as a client reset (an error); a transfer in
/// flight beside it finishes byte for byte, and the next client is served.
#[test]
fn a_client_reset_mid_transfer_ends_that_connection_only() {
    let written = Arc::new(AtomicU64::new(0));
    let hose = firehose(written.clone());
    let (echo, echo2) = (TestBackend::echo(), TestBackend::echo());
    // Round robin: the first client to the hose, the others to echo.
    let lb = TestBalancer::over(&[hose.addr(), echo.addr(), echo2.addr()]);
    let mut c = connect(lb.addr).unwrap();
    c.write_all(b"go").unwrap();
    let mut some = vec![0; 256 * 1024];
    c.read_exact(&mut some).unwrap();
    let data = test_data(2 * 1024 * 1024, 11);
    let bystander = bystander_half(lb.addr, &data);
    reset(c);
    until("the reset connection ended", || {
        lb.stats.snapshot().ended_client_reset == 1
    });
    assert!(bystander_rest(bystander, &data), "the bystander lost bytes");
    until("both ended", || lb.stats.snapshot().completed == 2);
    let s = lb.stats.snapshot();
    assert_eq!(
        (s.ended_client_reset, s.errors, s.active),
        (1, 1, 0),
        "{s:?}"
    );
    assert!(serves(lb.addr));
    lb.stop();
}

/// A backend resets mid-way while the client is still sending: only that
/// connection ends, counted as a backend reset; the client sees its
/// connection end (not hang), a transfer in flight beside it finishes byte
/// for byte, and the next client is served.
#[test]
fn a_backend_reset_mid_transfer_ends_that_connection_only() {
    let resetter = TestBackend::start(Arc::new(|mut s: TcpStream| {
        let mut buf = vec![0; 100_000];
        s.read_exact(&mut buf)?;
        s.write_all(b"half an answer")?;
        reset(s);
        Ok(())
    }));
    let (echo, echo2) = (TestBackend::echo(), TestBackend::echo());
    // Round robin: the first client to the resetter, the others to echo.
    let lb = TestBalancer::over(&[resetter.addr(), echo.addr(), echo2.addr()]);
    let mut c = connect(lb.addr).unwrap();
    let by_data = test_data(2 * 1024 * 1024, 12);
    let bystander = bystander_half(lb.addr, &by_data);
    let data = test_data(4 * 1024 * 1024, 3);
    // The sender stops at the first error: the reset reaches it.
    let sender = {
        let mut w = c.try_clone().unwrap();
        thread::spawn(move || data.chunks(16 * 1024).try_for_each(|ch| w.write_all(ch)))
    };
    let mut got = Vec::new();
    let _ = c.read_to_end(&mut got);
    assert!(got.len() <= b"half an answer".len(), "{got:?}");
    // What the sender saw depends on how much the buffers took in time.
    let _ = sender.join().unwrap();
    until("the reset connection ended", || {
        lb.stats.snapshot().ended_backend_reset == 1
    });
    assert!(
        bystander_rest(bystander, &by_data),
        "the bystander lost bytes"
    );
    until("both ended", || lb.stats.snapshot().completed == 2);
    let s = lb.stats.snapshot();
    assert_eq!(
        (s.ended_backend_reset, s.errors, s.active),
        (1, 1, 0),
        "{s:?}"
    );
    assert!(serves(lb.addr));
    lb.stop();
}

/// 2,000 clients connect and send nothing to the binary, with 500 workers
/// and a 1 s first-byte timeout: each is closed by the settings (first-byte
/// or queue timeout, every one counted), a real client is served at once
/// afterwards, and once they are gone the process has no descriptor more
/// than before and no thread beyond the pool's 500 workers.
#[test]
fn two_thousand_idle_clients_are_bounded_and_leave_nothing_behind() {
    const IDLE: u64 = 2000;
    let backend = TestBackend::echo();
    let b = backend.addr().to_string();
    let child = Child::on_loopback(
        &[
            "-b",
            &b,
            "--workers",
            "500",
            "--client-first-byte-timeout",
            "1s",
            "--queue-timeout",
            "1s",
            "--health-check",
            "off",
            "--admin",
            "127.0.0.1:0",
        ],
        |_| {},
    );
    child.admin();
    assert!(serves(child.addr));
    let (fds, threads) = (child.open_fds(), child.threads());
    let started = Instant::now();
    let mut idle: Vec<TcpStream> = Vec::new();
    for _ in 0..IDLE {
        idle.push(connect(child.addr).unwrap());
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "connecting took too long"
        );
    }
    for c in &mut idle {
        assert!(common::is_closed(c), "an idle client was left open");
    }
    let closed = child.metric("first_byte_timeouts_total") + child.metric("queue_timeouts_total");
    assert_eq!(closed, IDLE);
    drop(idle);
    assert!(serves(child.addr));
    let workers = child.metric("workers") as usize;
    assert!(workers <= 500, "{workers} workers");
    assert!(
        wait_for(Duration::from_secs(10), || child.open_fds() <= fds
            && child.threads() <= threads + 500),
        "descriptors {} (were {fds}), threads {} (were {threads}, with 1 worker)",
        child.open_fds(),
        child.threads()
    );
}

/// A client that never reads while its backend sends without end: the
/// worker stops reading from the backend once the client's socket is full
/// (the backend's writes stall well short of what it tried), and the idle
/// timeout ends the connection.
#[test]
fn a_client_that_never_reads_stalls_the_backend_and_times_out() {
    let written = Arc::new(AtomicU64::new(0));
    let hose = firehose(written.clone());
    let lb = TestBalancer::with(&[hose.addr()], |c| {
        c.proxy.idle_timeout = Duration::from_secs(2);
    });
    let mut c = connect(lb.addr).unwrap();
    SockRef::from(&c).set_recv_buffer_size(64 * 1024).unwrap();
    c.write_all(b"go").unwrap();
    // Written bytes stop growing: the backend is blocked. Sampled 200 ms
    // apart: a count that did not move in that time has stalled.
    let mut last = u64::MAX;
    let stalled = wait_for(Duration::from_secs(10), || {
        thread::sleep(Duration::from_millis(200));
        let now = written.load(Ordering::SeqCst);
        let same = now == last && now > 0;
        last = now;
        same
    });
    let w = written.load(Ordering::SeqCst);
    // What the sockets' kernel buffers on the way hold (about 7 MiB here):
    // the worker itself holds one 4 KiB chunk, never the stream.
    assert!(stalled && w < 16 * 1024 * 1024, "backend wrote {w} bytes");
    until("the idle timeout", || {
        lb.stats.snapshot().ended_idle_timeout == 1
    });
    assert_eq!(lb.stats.snapshot().active, 0);
    drop(c);
    lb.stop();
}

/// Slowloris against the binary: 40 clients connect and send nothing to a
/// balancer with 4 workers and `--client-first-byte-timeout 300ms`. They
/// are closed (none of them reaches the backend), and a real client
/// connecting behind them is served within 5 s.
#[test]
fn slowloris_clients_are_closed_by_the_first_byte_timeout() {
    let backend = TestBackend::echo();
    let b = backend.addr().to_string();
    let child = Child::on_loopback(
        &[
            "-b",
            &b,
            "--workers",
            "4",
            "--client-first-byte-timeout",
            "300ms",
            "--health-check",
            "off",
        ],
        |_| {},
    );
    let mut silent: Vec<TcpStream> = (0..40).map(|_| connect(child.addr).unwrap()).collect();
    let started = Instant::now();
    assert!(serves(child.addr), "{}", child.log());
    assert!(started.elapsed() < Duration::from_secs(5));
    for s in &mut silent {
        assert!(common::is_closed(s));
    }
    // No health checks: the real client alone reached the backend.
    assert_eq!(backend.accepted(), 1);
    until("the first-byte timeout logged", || {
        child.log().contains("first byte")
    });
}

/// 3,000 clients connect and close at once (half of them with a reset),
/// bounded in count and time: the balancer accepts them, ends each, keeps
/// no socket open, and serves the next client.
#[test]
fn connect_and_close_floods_leave_it_serving() {
    let backend = TestBackend::echo();
    let lb = TestBalancer::over(&[backend.addr()]);
    assert!(serves(lb.addr));
    until("the first client's end", || lb.stats.snapshot().active == 0);
    let started = Instant::now();
    for i in 0..3000 {
        let s = connect(lb.addr).unwrap();
        if i % 2 == 0 {
            reset(s);
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "flood too slow"
        );
    }
    until("all 3,001 accepted and ended", || {
        let s = lb.stats.snapshot();
        s.accepted == 3001 && s.active == 0 && lb.stats.snapshot().workers_busy == 0
    });
    assert!(serves(lb.addr));
    let ports = [lb.addr.port(), backend.addr().port()];
    assert!(
        wait_for(Duration::from_secs(10), || sockets_on(&ports) == 0),
        "{} sockets still open",
        sockets_on(&ports)
    );
    lb.stop();
}

/// Half-open peers, both ways: a client that shuts its write side before
/// sending anything still gets the backend's whole reply; a backend that
/// shuts its write side at once still receives the client's whole
/// megabyte.
#[test]
fn half_open_peers_lose_no_byte() {
    let eof_first = TestBackend::reply_after_eof();
    let lb = TestBalancer::with(&[eof_first.addr()], |c| {
        c.proxy.client_first_byte_timeout = Some(Duration::from_secs(5));
    });
    let mut c = connect(lb.addr).unwrap();
    c.shutdown(net::Shutdown::Write).unwrap();
    let mut reply = Vec::new();
    c.read_to_end(&mut reply).unwrap();
    assert_eq!(reply, common::after_eof_reply(b""));
    lb.stop();

    let got = Arc::new(AtomicUsize::new(0));
    let mute = {
        let got = got.clone();
        TestBackend::start(Arc::new(move |mut s: TcpStream| {
            s.shutdown(net::Shutdown::Write)?;
            let mut buf = vec![0; 64 * 1024];
            loop {
                match s.read(&mut buf)? {
                    0 => return Ok(()),
                    n => got.fetch_add(n, Ordering::SeqCst),
                };
            }
        }))
    };
    let lb = TestBalancer::over(&[mute.addr()]);
    let mut c = connect(lb.addr).unwrap();
    let data = test_data(1024 * 1024, 9);
    c.write_all(&data).unwrap();
    c.shutdown(net::Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    c.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    until("the backend got the whole megabyte", || {
        got.load(Ordering::SeqCst) == data.len()
    });
    until("the connection ended", || {
        lb.stats.snapshot().completed == 1
    });
    assert_eq!(lb.stats.snapshot().errors, 0, "{:?}", lb.stats.snapshot());
    lb.stop();
}

/// Out of descriptors (`RLIMIT_NOFILE` 64, 100 clients held open, with
/// health checks every 100 ms that need descriptors too): once the held
/// clients leave, the next 20 clients are each served at once, one after
/// another, and its descriptors come back to where they were. Failing checks during the shortage must not leave the backend
/// marked down afterwards.
#[test]
fn after_running_out_of_descriptors_it_serves_at_once() {
    let backend = TestBackend::echo();
    let b = backend.addr().to_string();
    let mut child = Child::on_loopback(&["-b", &b, "--health-interval", "100ms"], |c| {
        c.env("RUST_LOG", "info,rodizio::health=debug");
        common::limit_in_child(c, libc::RLIMIT_NOFILE, 64)
    });
    assert!(serves(child.addr));
    let fds = child.open_fds();
    let held: Vec<TcpStream> = (0..100).map(|_| connect(child.addr).unwrap()).collect();
    // Three check rounds fall in the shortage (a backend goes down after
    // three failed checks in a row, by default).
    until("three checks in the shortage", || {
        let log = child.log();
        log.matches("not counted").count() >= 3 || log.contains("is now DOWN")
    });
    drop(held);
    for i in 0..20u8 {
        let started = Instant::now();
        let mut s = connect(child.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        assert!(round_trip(&mut s, i), "client {i}: {}", child.log());
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "client {i} waited"
        );
    }
    // A check's socket may be open at any moment: one more is allowed.
    assert!(
        wait_for(Duration::from_secs(10), || child.open_fds() <= fds + 1),
        "{} descriptors, were {fds}",
        child.open_fds()
    );
    assert!(child.alive());
    assert!(!child.log().contains("panicked"), "{}", child.log());
}

/// Lowers the address-space limit of the running process `pid` to `bytes`
/// (`prlimit(2)`, which root may do to another process).
fn limit_address_space(pid: u32, bytes: u64) -> io::Result<()> {
    let limit = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: `limit` is a valid rlimit for the call; the old value is not
    // asked for (null).
    let r = unsafe {
        libc::prlimit(
            pid as libc::pid_t,
            libc::RLIMIT_AS,
            &limit,
            std::ptr::null_mut(),
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The process's virtual memory size, in bytes.
fn vm_size(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib * 1024
}

/// Stack of each worker in the thread-exhaustion test: large, so that an
/// address-space cap can refuse a new worker's stack while leaving the
/// process room for everything else it allocates.
const BIG_STACK: u64 = 256 * 1024 * 1024;

/// Threads cannot be started: the running binary's address space is
/// capped (`RLIMIT_AS`, set from outside with `prlimit`) below what one
/// more worker's 256 MiB stack needs, with 64 MiB left for the rest (a
/// cgroup pids limit is not available here, `RLIMIT_NPROC` does not bind
/// root, and a cap with no room left fails small allocations, which abort
/// any Rust or C program). With its one worker busy, five clients arrive:
/// the balancer stays up and counts the failed spawns; once the cap is
/// lifted, the next client is served, and so are the five that waited.
#[test]
fn when_no_thread_can_start_it_stays_up_counts_and_recovers() {
    let backend = TestBackend::echo();
    let b = backend.addr().to_string();
    let stack = BIG_STACK.to_string();
    let mut child = Child::on_loopback(
        &[
            "-b",
            &b,
            "--admin",
            "127.0.0.1:0",
            "--health-check",
            "off",
            "--thread-stack",
            &stack,
        ],
        |_| {},
    );
    child.admin();
    let mut busy = connect(child.addr).unwrap();
    assert!(round_trip(&mut busy, b'b'));
    let pid = child.pid();
    // The listening line comes before `run` starts the service's threads
    // (its health thread among them): the cap must come after them, or a
    // thread of the balancer's own would be the one that cannot start. A
    // thread names itself once running (after its signal stack is
    // allocated): until then it shows the process's name, as only the
    // main thread should. The signal thread, started first, may be the
    // last to run on a loaded machine.
    until("the balancer's own threads running", || {
        let names = thread_names(pid);
        names.iter().filter(|n| *n == "rodizio").count() == 1
            && ["rodizio-health", "rodizio-signal"]
                .iter()
                .all(|t| names.iter().any(|n| n == t))
    });
    limit_address_space(pid, vm_size(pid) + BIG_STACK / 4).unwrap();
    let mut waiting: Vec<TcpStream> = Vec::new();
    for i in 0..5u8 {
        let mut s = connect(child.addr).unwrap();
        s.write_all(&[i]).unwrap();
        waiting.push(s);
    }
    until("five failed spawns", || {
        child
            .log()
            .matches("could not start a worker thread")
            .count()
            >= 5
    });
    assert!(child.alive(), "{}", child.log());
    limit_address_space(pid, libc::RLIM_INFINITY).unwrap();
    assert_eq!(child.metric("worker_spawn_failures_total"), 5);
    assert!(serves(child.addr), "{}", child.log());
    for (i, s) in waiting.iter_mut().enumerate() {
        let mut b = [0u8];
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert!(
            s.read_exact(&mut b).is_ok() && b[0] == i as u8,
            "client {i} waits"
        );
    }
    assert!(child.alive());
    assert!(!child.log().contains("panicked"), "{}", child.log());
}

/// The names of the threads of `pid` (`/proc/PID/task/*/comm`).
fn thread_names(pid: u32) -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|name| name.trim().to_string())
        .collect()
}
