//! The kernel relay's own tests: counters, and one connection through the
//! loaded program (the tests run as root, as CI does).

use super::bpf::{kernel, map_lookup};
use super::counts::Counts;
use super::link::Link;
use std::io::{Read, Write};
use std::net::Shutdown as Direction;
use std::time::{Duration, Instant};

use crate::test_support::pair;

/// Waits, at most 5 s, until `cond` holds (what the kernel does next
/// comes without a wake-up to wait for); the test then asserts.
fn soon(mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() && Instant::now() < deadline {
        std::thread::yield_now();
    }
}

#[test]
fn the_counters_leave_out_syn_and_fin() {
    let (mut a, mut b) = pair();
    let fresh = Counts::of(&a).unwrap();
    // The connecting side's SYN counts as one acked byte.
    assert_eq!(fresh.handed(), 1);
    a.write_all(b"12345").unwrap();
    a.shutdown(Direction::Write).unwrap();
    let mut got = Vec::new();
    b.read_to_end(&mut got).unwrap();
    let c = Counts::of(&b).unwrap();
    assert!(c.fin_in());
    assert_eq!(c.received, 6);
    assert_eq!(c.data_in(), 5);
}

#[test]
fn the_program_loads_and_relays_both_ways() {
    // The tests run as root here; elsewhere this is the check that
    // says the kernel path cannot work.
    let kernel = kernel().expect("the sockmap program should load (root, sockmap)");
    let (mut client, client_end) = pair();
    let (backend_end, mut backend) = pair();
    // Bytes queued before insertion must come through too.
    client.write_all(b"early ").unwrap();
    let mut link = Link::new(kernel, &client_end, &backend_end);
    soon(|| Counts::of(&client_end).unwrap().received >= 6);
    link.insert().unwrap();
    client.write_all(b"then more").unwrap();
    let mut got = [0u8; 15];
    backend.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"early then more");
    backend.write_all(b"reply").unwrap();
    let mut reply = [0u8; 5];
    client.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"reply");
    // The program counted what it redirected from each side.
    let moved = |i: usize| map_lookup(&kernel.moved, link.cookies[i]).unwrap();
    soon(|| (moved(0), moved(1)) == (15, 5));
    assert_eq!((moved(0), moved(1)), (15, 5));
    // Unwound, the sockets are plain again and bytes still flow.
    let mut moved = [0u64; 2];
    assert!(link.unwind(Duration::from_secs(5), &mut moved).is_ok());
    assert_eq!(moved, [15, 5]);
    client.write_all(b"plain").unwrap();
    let mut buf = [0u8; 5];
    let mut from = &client_end;
    from.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"plain");
}

#[test]
fn kept_bytes_read_in_small_pieces_come_whole() {
    let kernel = kernel().expect("the sockmap program should load (root, sockmap)");
    let (mut client, client_end) = pair();
    let (backend_end, _backend) = pair();
    let mut link = Link::new(kernel, &client_end, &backend_end);
    link.insert().unwrap();
    // Latch the client's socket at once: everything it receives is kept.
    super::bpf::map_update(&kernel.limits, link.cookies[0], 0).unwrap();
    const TOTAL: u64 = 64 << 20;
    let writer = std::thread::spawn(move || {
        let mut chunk = vec![0u8; 256 * 1024];
        let mut at = 0u64;
        while at < TOTAL {
            for (k, b) in chunk.iter_mut().enumerate() {
                *b = ((at + k as u64) % 251) as u8;
            }
            client.write_all(&chunk).unwrap();
            at += chunk.len() as u64;
        }
    });
    let mut buf = [0u8; 4096];
    let mut got = 0u64;
    let mut from = &client_end;
    while got < TOTAL {
        let n = from.read(&mut buf).unwrap();
        assert!(n > 0);
        for (k, &b) in buf[..n].iter().enumerate() {
            assert_eq!(b, ((got + k as u64) % 251) as u8, "byte {}", got + k as u64);
        }
        got += n as u64;
    }
    writer.join().unwrap();
    assert_eq!(link.taken(0).unwrap(), (0, true));
}

#[test]
fn bytes_handed_on_beyond_those_received_end_the_connection() {
    let kernel = kernel().expect("the sockmap program should load (root, sockmap)");
    let (mut client, client_end) = pair();
    let (backend_end, _backend) = pair();
    let mut link = Link::new(kernel, &client_end, &backend_end);
    let src = Counts::of(&client_end).unwrap();
    let dst = Counts::of(&backend_end).unwrap();
    link.ways[0].in_base = src.data_in();
    link.ways[0].out_base = dst.handed();
    // As many handed on as received: whole.
    assert!(link.not_doubled(0, &src, &dst).is_ok());
    // Bytes received after the source was sampled, already handed on:
    // the source read again covers them.
    client.write_all(b"12345").unwrap();
    soon(|| Counts::of(&client_end).unwrap().data_in() >= src.data_in() + 5);
    let ahead = Counts {
        acked: dst.acked + 5,
        ..dst
    };
    assert!(link.not_doubled(0, &src, &ahead).is_ok());
    // More handed on than ever received: the kernel doubled bytes.
    let doubled = Counts {
        acked: dst.acked + 6,
        ..dst
    };
    let Err(fault) = link.not_doubled(0, &src, &doubled) else {
        panic!("a doubled byte went unseen");
    };
    // Told as the client's stream broken: both peers get a reset.
    let super::Relayed::Failed {
        socket,
        error,
        broken,
    } = fault.into_relayed()
    else {
        panic!("not a failure");
    };
    assert_eq!((socket, broken), (Some(0), true));
    assert_eq!(error.kind(), std::io::ErrorKind::ConnectionReset);
    // Once the way passed its end of stream on, our FIN counts there.
    link.ways[0].done = true;
    assert!(link.not_doubled(0, &src, &doubled).is_ok());
}

/// The copy pump with the relay from the first byte, on its own thread,
/// counting into `stats`; it closes the sockets as the worker does.
fn pump_relayed(
    client_end: std::net::TcpStream,
    backend_end: std::net::TcpStream,
    stats: &std::sync::Arc<crate::stats::Stats>,
) -> std::thread::JoinHandle<crate::proxy::pump::Pumped> {
    use crate::proxy::pump::{close, pump, PumpOptions};
    let stats = std::sync::Arc::clone(stats);
    std::thread::spawn(move || {
        super::count_for(&stats);
        let options = PumpOptions {
            idle_timeout: Duration::from_secs(10),
            fin_timeout: Duration::from_secs(10),
            yield_before_poll: crate::units::Switch::Off,
            up_rate: None,
            down_rate: None,
            promote: true,
            promote_after: 0,
        };
        let pumped = pump(&client_end, &backend_end, 4096, &options);
        close(&client_end, &backend_end, pumped.end, pumped.no_shutdown);
        pumped
    })
}

/// Writes `bytes` into `socket` (non-blocking: its owner made it so) as
/// it takes them, for at most 10 s.
fn write_when_taken(socket: &std::net::TcpStream, bytes: &[u8]) {
    let mut left = bytes;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !left.is_empty() && Instant::now() < deadline {
        match (&mut &*socket).write(left) {
            Ok(n) => left = &left[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::yield_now(),
            Err(e) => panic!("the write failed: {e}"),
        }
    }
    assert!(left.is_empty(), "the socket never took the bytes");
}

/// A connection back from the backlog bound on the copy pump, whose
/// client socket is then handed bytes behind the pump's back (as the
/// kernel's late doubled segment is): the pump's guard ends the connection
/// with a reset, not with a whole-looking end. The bytes go in once the
/// client has read more than the program relayed (so the pump writes:
/// the relay is over).
#[test]
fn bytes_handed_behind_the_pump_after_the_bound_end_it_with_resets() {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    use std::sync::Arc;

    let kernel = kernel().expect("the sockmap program should load (root, sockmap)");
    let (mut client, client_end) = pair();
    let (backend_end, mut backend) = pair();
    let injector = client_end.try_clone().unwrap();
    let backend_cookie = super::counts::cookie(&backend_end).unwrap();
    let stats = Arc::new(crate::stats::Stats::default());
    let pumping = pump_relayed(client_end, backend_end, &stats);
    // The backend writes 64 MiB at most, then its end, while the client
    // reads nothing: past the 4 MiB bound the program latches and the copy
    // pump takes the connection.
    backend
        .set_write_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let writer = std::thread::spawn(move || {
        let chunk = vec![b'b'; 64 * 1024];
        for _ in 0..1024 {
            if backend.write_all(&chunk).is_err() {
                return;
            }
        }
        let _ = backend.shutdown(Direction::Write);
    });
    let fell_back = || stats.kernel_relay_fallbacks.load(Relaxed);
    soon(|| fell_back() == 1);
    assert_eq!(fell_back(), 1, "the connection never met the bound");
    let relayed = map_lookup(&kernel.moved, backend_cookie).unwrap();
    assert!(relayed >= super::bpf::LATCHED, "the program did not latch");
    let relayed = relayed - super::bpf::LATCHED;
    // The client reads now: its stream is to end with a reset.
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let read = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&read);
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match client.read(&mut buf) {
                Ok(0) => return None,
                Ok(n) => counted.fetch_add(n as u64, Relaxed),
                Err(e) => return Some(e.kind()),
            };
        }
    });
    soon(|| read.load(Relaxed) > relayed);
    assert!(read.load(Relaxed) > relayed, "the copy pump never wrote");
    write_when_taken(&injector, b"doubled");
    // The pump's close is then the socket's last: no copy stays open.
    drop(injector);
    assert_eq!(
        reader.join().unwrap(),
        Some(std::io::ErrorKind::ConnectionReset),
        "a stream with bytes doubled did not end with a reset"
    );
    let error = pumping.join().unwrap().error.expect("no error told");
    assert!(
        error.to_string().contains("after the kernel relay"),
        "{error}"
    );
    // The backend's writes end too (its socket was reset).
    writer.join().unwrap();
}

/// A connection back from the backlog bound on the copy pump, whose
/// client then sends its last words and half-closes while the backend is
/// still streaming: the pump's guard, which checks each direction once
/// more with its FIN counted, lets every byte and both ends through. The
/// end it owes is no doubled byte; a reset here would cut a healthy
/// download.
#[test]
fn a_half_close_after_the_bound_passes_every_byte_and_both_ends() {
    use std::sync::atomic::Ordering::Relaxed;
    use std::sync::Arc;

    const CHUNK: usize = 64 * 1024;
    const CHUNKS: usize = 1024;
    kernel().expect("the sockmap program should load (root, sockmap)");
    let (mut client, client_end) = pair();
    let (backend_end, mut backend) = pair();
    let stats = Arc::new(crate::stats::Stats::default());
    let pumping = pump_relayed(client_end, backend_end, &stats);
    // The backend streams 64 MiB while the client reads nothing (past the
    // 4 MiB bound the copy pump takes the connection back), then reads
    // the client's words to their end, then ends its own stream.
    let streamer = std::thread::spawn(move || {
        let chunk = vec![b'b'; CHUNK];
        for _ in 0..CHUNKS {
            backend
                .write_all(&chunk)
                .expect("the backend's stream was cut");
        }
        let mut words = Vec::new();
        backend
            .read_to_end(&mut words)
            .expect("the client's end never came");
        backend.shutdown(Direction::Write).unwrap();
        words
    });
    let fell_back = || stats.kernel_relay_fallbacks.load(Relaxed);
    soon(|| fell_back() == 1);
    assert_eq!(fell_back(), 1, "the connection never met the bound");
    client.write_all(b"last words").unwrap();
    client.shutdown(Direction::Write).unwrap();
    let mut buf = vec![0u8; CHUNK];
    let mut read = 0;
    loop {
        match client.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                assert!(buf[..n].iter().all(|&b| b == b'b'), "a byte changed");
                read += n;
            }
            Err(e) => panic!("after {read} bytes, the client's stream ended with {e}"),
        }
    }
    assert_eq!(read, CHUNK * CHUNKS, "the client's stream ended short");
    assert_eq!(streamer.join().unwrap(), b"last words");
    let pumped = pumping.join().unwrap();
    assert!(pumped.error.is_none(), "{:?}", pumped.error);
    assert_eq!(pumped.end, crate::conduit::outcome::End::ClientClosed);
    assert_eq!(pumped.transfer.to_client, (CHUNK * CHUNKS) as u64);
    assert_eq!(pumped.transfer.to_backend, 10);
}

/// The counters taken at rest give the exact count of bytes handed to a
/// socket, though its peer's acknowledgements keep arriving: `TCP_INFO`'s
/// acknowledged bytes and `SIOCOUTQ` are two calls, and an
/// acknowledgement between them made the sum short by what it
/// acknowledged (a relay base short by a reply, which the doubling check
/// then took for bytes sent twice: 3 connections in 4,000 under wrk).
#[test]
fn counts_at_rest_are_exact_while_acknowledgements_arrive() {
    let (a, mut b) = pair();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 64 * 1024];
        while matches!(b.read(&mut buf), Ok(n) if n > 0) {}
    });
    let mut written = 0u64;
    let mut short = 0;
    for _ in 0..20_000 {
        (&a).write_all(&[7u8; 850]).unwrap();
        written += 850;
        let (counts, _) = super::counts::at_rest([&a]).unwrap().expect("at rest");
        // The connecting side's SYN counts one.
        if counts[0].handed() != written + 1 {
            short += 1;
        }
    }
    a.shutdown(Direction::Write).unwrap();
    reader.join().unwrap();
    assert_eq!(
        short, 0,
        "{short} samples in 20,000 were not the bytes written"
    );
}
