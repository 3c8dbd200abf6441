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
