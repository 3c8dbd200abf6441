//! How each connection ends is counted by cause (`ended_*`), with exact
//! byte counts, and the fin timeout and TCP keep-alive settings act on the
//! connections.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{self, SocketAddr, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::{connect, wait_for, TestBackend, TestBalancer};
use rodizio::stats::StatsSnapshot;
use socket2::SockRef;

/// Waits until `n` proxied connections have ended and none is active, and
/// returns the counters then.
fn ended(lb: &TestBalancer, n: u64) -> StatsSnapshot {
    assert!(
        lb.wait_ended(n, Duration::from_secs(10)),
        "{:?}",
        lb.stats.snapshot()
    );
    lb.stats.snapshot()
}

/// Resets `stream`: SO_LINGER 0, then close.
fn reset(stream: TcpStream) {
    SockRef::from(&stream)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(stream);
}

/// The client sends, closes its write side, reads the whole reply: both
/// sides closed, the client first. Not an error.
#[test]
fn a_client_that_closes_first_is_counted_as_such() {
    let backend = TestBackend::reply_after_eof();
    let lb = TestBalancer::over(&[backend.addr()]);
    let mut s = connect(lb.addr).unwrap();
    s.write_all(b"question").unwrap();
    s.shutdown(net::Shutdown::Write).unwrap();
    let mut reply = Vec::new();
    s.read_to_end(&mut reply).unwrap();
    assert_eq!(reply.len(), 8 + 8);
    let s = ended(&lb, 1);
    assert_eq!(s.ended_client_closed, 1, "{s:?}");
    assert_eq!(s.errors, 0, "{s:?}");
    lb.stop();
}

/// An HTTP backend answers `Connection: close` and closes; the client then
/// closes too: the backend closed first. Not an error.
#[test]
fn a_backend_that_closes_first_is_counted_as_such() {
    let backend = TestBackend::http(1);
    let lb = TestBalancer::over(&[backend.addr()]);
    let mut s = connect(lb.addr).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut reply = Vec::new();
    s.read_to_end(&mut reply).unwrap();
    assert!(reply.ends_with(b"backend 1\n"));
    drop(s);
    let s = ended(&lb, 1);
    assert_eq!(s.ended_backend_closed, 1, "{s:?}");
    assert_eq!(s.errors, 0, "{s:?}");
    lb.stop();
}

/// A client that resets once its exchange is over (as many TLS clients
/// do) is counted as a client reset.
#[test]
fn a_client_reset_after_the_exchange_is_counted_as_such() {
    let backend = TestBackend::echo();
    let lb = TestBalancer::over(&[backend.addr()]);
    let mut s = connect(lb.addr).unwrap();
    s.write_all(b"ping").unwrap();
    let mut back = [0u8; 4];
    s.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"ping");
    reset(s);
    let s = ended(&lb, 1);
    assert_eq!(s.ended_client_reset, 1, "{s:?}");
    assert_eq!(s.ended_backend_reset, 0, "{s:?}");
    lb.stop();
}

/// The client sends exactly N bytes; the backend reads exactly N and
/// resets. What the balancer counts as sent to the backend is N, in the
/// stats, and the end is a backend reset.
#[test]
fn byte_counts_are_exact_when_the_backend_resets() {
    const N: usize = 8 << 20;
    let backend = TestBackend::start(Arc::new(|mut stream: TcpStream| {
        let mut buf = vec![0u8; 64 * 1024];
        let mut left = N;
        while left > 0 {
            let n = stream.read(&mut buf[..left.min(64 * 1024)])?;
            if n == 0 {
                break;
            }
            left -= n;
        }
        reset(stream);
        Ok(())
    }));
    for splice in [false, true] {
        let lb = TestBalancer::with(&[backend.addr()], |c| c.proxy.splice = splice);
        let mut s = connect(lb.addr).unwrap();
        let data = vec![b'u'; N];
        s.write_all(&data).unwrap();
        // The balancer closes the client once the backend is gone.
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        assert!(rest.is_empty());
        let snap = ended(&lb, 1);
        assert_eq!(snap.bytes_to_backends, N as u64, "splice={splice}");
        assert_eq!(snap.ended_backend_reset, 1, "splice={splice}: {snap:?}");
        lb.stop();
    }
}

/// The backend answers a request with N bytes and resets at once. What
/// the balancer counts as sent to the client is exactly what the client
/// received (the bytes the reset destroyed in the backend's kernel never
/// reached the balancer, and are not counted).
#[test]
fn byte_counts_are_exact_when_the_backend_sends_then_resets() {
    const N: usize = 4 << 20;
    let backend = TestBackend::start(Arc::new(|mut stream: TcpStream| {
        let mut ask = [0u8; 3];
        stream.read_exact(&mut ask)?;
        stream.write_all(&vec![b'd'; N])?;
        reset(stream);
        Ok(())
    }));
    for splice in [false, true] {
        let lb = TestBalancer::with(&[backend.addr()], |c| c.proxy.splice = splice);
        let mut s = connect(lb.addr).unwrap();
        s.write_all(b"go\n").unwrap();
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        assert!(!got.is_empty(), "splice={splice}");
        let snap = ended(&lb, 1);
        assert_eq!(snap.bytes_to_clients, got.len() as u64, "splice={splice}");
        assert_eq!(snap.ended_backend_reset, 1, "splice={splice}: {snap:?}");
        lb.stop();
    }
}

/// With `idle_timeout` 200 ms, a connection on which nothing moves is
/// closed and counted as an idle timeout.
#[test]
fn a_silent_connection_ends_at_the_idle_timeout() {
    let backend = TestBackend::echo();
    let lb = TestBalancer::with(&[backend.addr()], |c| {
        c.proxy.idle_timeout = Duration::from_millis(200);
    });
    let mut s = connect(lb.addr).unwrap();
    let mut buf = [0u8; 1];
    assert_eq!(s.read(&mut buf).unwrap(), 0);
    let s = ended(&lb, 1);
    assert_eq!(s.ended_idle_timeout, 1, "{s:?}");
    assert_eq!(s.errors, 1, "{s:?}");
    lb.stop();
}

/// `fin_timeout` 300 ms (idle 30 s): the client closes its write side, the
/// backend reads it all and then stays silent without closing. The
/// balancer closes the connection after about the fin timeout, well before
/// the idle timeout, and counts it as a fin timeout.
#[test]
fn a_half_closed_connection_ends_at_the_fin_timeout() {
    let (hold, held) = crossbeam_channel::bounded::<()>(0);
    let backend = TestBackend::start(Arc::new(move |mut stream: TcpStream| {
        let mut got = Vec::new();
        stream.read_to_end(&mut got)?;
        // Silent, and open, until the test ends.
        let _ = held.recv_timeout(Duration::from_secs(20));
        Ok(())
    }));
    let lb = TestBalancer::with(&[backend.addr()], |c| {
        c.proxy.idle_timeout = Duration::from_secs(30);
        c.proxy.fin_timeout = Some(Duration::from_millis(300));
    });
    let mut s = connect(lb.addr).unwrap();
    s.write_all(b"done").unwrap();
    s.shutdown(net::Shutdown::Write).unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 1];
    assert_eq!(s.read(&mut buf).unwrap(), 0);
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(250), "{took:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    let snap = ended(&lb, 1);
    assert_eq!(snap.ended_fin_timeout, 1, "{snap:?}");
    drop(hold);
    lb.stop();
}

/// The `/proc/net/tcp` timer of the IPv4 socket from `local` to `remote`:
/// `(kind, clock ticks left)`, kind 2 being the keep-alive timer.
fn tcp_timer(local: SocketAddr, remote: SocketAddr) -> Option<(u32, u64)> {
    let hex = |a: SocketAddr| match a {
        SocketAddr::V4(v4) => format!(
            "{:08X}:{:04X}",
            u32::from_ne_bytes(v4.ip().octets()),
            v4.port()
        ),
        SocketAddr::V6(_) => panic!("IPv4 only"),
    };
    let (local, remote) = (hex(local), hex(remote));
    let table = std::fs::read_to_string("/proc/net/tcp").expect("read /proc/net/tcp");
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || f[1] != local || f[2] != remote {
            return None;
        }
        let (kind, when) = f[5].split_once(':')?;
        Some((
            u32::from_str_radix(kind, 16).ok()?,
            u64::from_str_radix(when, 16).ok()?,
        ))
    })
}

/// With `tcp_keepalive` 60 s, both of the balancer's sockets of a
/// connection (toward the client and toward the backend) have their
/// keep-alive timer armed at about 60 s, as `/proc/net/tcp` shows; the
/// test's own client socket, without keep-alive, has none.
#[test]
fn tcp_keepalive_is_armed_on_both_sockets() {
    let (tx, rx) = crossbeam_channel::unbounded();
    let backend = TestBackend::start(Arc::new(move |stream: TcpStream| {
        let _ = tx.send(stream.peer_addr()?);
        common::echo(stream)
    }));
    let lb = TestBalancer::with(&[backend.addr()], |c| {
        c.proxy.tcp_keepalive = Some(Duration::from_secs(60));
    });
    let mut s = connect(lb.addr).unwrap();
    s.write_all(b"ping").unwrap();
    let mut back = [0u8; 4];
    s.read_exact(&mut back).unwrap();
    let toward_backend = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let toward_client = (lb.addr, s.local_addr().unwrap());
    // About 60 s in clock ticks (100 per second), and not the kernel's
    // default of two hours.
    let armed =
        |t: Option<(u32, u64)>| matches!(t, Some((2, when)) if (5000..=6000).contains(&when));
    assert!(
        wait_for(Duration::from_secs(5), || {
            armed(tcp_timer(toward_client.0, toward_client.1))
                && armed(tcp_timer(toward_backend, backend.addr()))
        }),
        "client side {:?}, backend side {:?}",
        tcp_timer(toward_client.0, toward_client.1),
        tcp_timer(toward_backend, backend.addr())
    );
    let own = tcp_timer(s.local_addr().unwrap(), lb.addr);
    assert!(
        own.is_some() && !armed(own),
        "the client's own socket: {own:?}"
    );
    drop(s);
    ended(&lb, 1);
    lb.stop();
}

/// How one client's read to the end went: the bytes it got, and whether
/// the end was a reset (`true`) or an ordinary end of stream.
fn read_to_the_end(mut s: TcpStream) -> (u64, bool) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = 0u64;
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (got, false),
            Ok(n) => got += n as u64,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return (got, true),
            Err(e) => panic!("after {got} bytes: {e}"),
        }
    }
}

/// Twenty clients at once ask a backend that sends 200 KB and then resets
/// (SO_LINGER 0) before its end of stream. Each client reads to the end:
/// at least 19 of 20 learn of the reset (ECONNRESET), as they would from
/// the backend itself, and not an ordinary end of stream that a client
/// reading to the end takes for a complete reply; and the clients got
/// every byte the balancer counts as sent to them. With the copy pump and
/// the splice pump.
#[test]
fn a_backend_reset_reaches_the_client_as_a_reset() {
    const CLIENTS: usize = 20;
    let backend = TestBackend::start(Arc::new(|mut stream: TcpStream| {
        let mut ask = [0u8; 3];
        stream.read_exact(&mut ask)?;
        stream.write_all(&vec![b'd'; 200 * 1000])?;
        reset(stream);
        Ok(())
    }));
    for splice in [false, true] {
        let lb = TestBalancer::with(&[backend.addr()], |c| c.proxy.splice = splice);
        let clients: Vec<_> = (0..CLIENTS)
            .map(|_| {
                let addr = lb.addr;
                thread::spawn(move || {
                    let mut s = connect(addr).unwrap();
                    s.write_all(b"go\n").unwrap();
                    read_to_the_end(s)
                })
            })
            .collect();
        let ends: Vec<(u64, bool)> = clients.into_iter().map(|c| c.join().unwrap()).collect();
        let resets = ends.iter().filter(|(_, reset)| *reset).count();
        let got: u64 = ends.iter().map(|(n, _)| n).sum();
        let snap = ended(&lb, CLIENTS as u64);
        assert!(
            resets >= CLIENTS - 1,
            "splice={splice}: {resets} of {CLIENTS} saw the reset: {ends:?}"
        );
        assert_eq!(snap.ended_backend_reset, CLIENTS as u64, "{snap:?}");
        assert_eq!(snap.bytes_to_clients, got, "splice={splice}");
        lb.stop();
    }
}

/// The other way: twenty clients at once send 200 KB and then reset
/// before their end of stream. The backend, reading each connection to
/// the end, learns of the reset (at least 19 of 20) after every byte the
/// balancer counts as sent to it.
#[test]
fn a_client_reset_reaches_the_backend_as_a_reset() {
    const CLIENTS: usize = 20;
    let (tx, rx) = crossbeam_channel::unbounded();
    let backend = TestBackend::start(Arc::new(move |stream: TcpStream| {
        stream.set_read_timeout(Some(Duration::from_secs(20)))?;
        let _ = tx.send(read_to_the_end(stream));
        Ok(())
    }));
    for splice in [false, true] {
        let lb = TestBalancer::with(&[backend.addr()], |c| c.proxy.splice = splice);
        let clients: Vec<_> = (0..CLIENTS)
            .map(|_| {
                let addr = lb.addr;
                thread::spawn(move || {
                    let mut s = connect(addr).unwrap();
                    s.write_all(&vec![b'u'; 200 * 1000]).unwrap();
                    reset(s);
                })
            })
            .collect();
        for c in clients {
            c.join().unwrap();
        }
        let ends: Vec<(u64, bool)> = (0..CLIENTS)
            .map(|_| rx.recv_timeout(Duration::from_secs(20)).unwrap())
            .collect();
        let resets = ends.iter().filter(|(_, reset)| *reset).count();
        let got: u64 = ends.iter().map(|(n, _)| n).sum();
        let snap = ended(&lb, CLIENTS as u64);
        assert!(
            resets >= CLIENTS - 1,
            "splice={splice}: {resets} of {CLIENTS} saw the reset: {ends:?}"
        );
        assert_eq!(snap.ended_client_reset, CLIENTS as u64, "{snap:?}");
        assert_eq!(snap.bytes_to_backends, got, "splice={splice}");
        lb.stop();
    }
}
