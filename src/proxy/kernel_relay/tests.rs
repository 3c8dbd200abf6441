//! The kernel relay's own tests: counters, and one connection through the
//! loaded program (the tests run as root, as CI does).

use super::bpf::{kernel, map_lookup};
use super::counts::Counts;
use super::link::Link;
use std::io::{Read, Write};
use std::net::Shutdown as Direction;
use std::time::{Duration, Instant};

use crate::test_support::pair;

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
    let mut deadline = Instant::now() + Duration::from_secs(5);
    while Counts::of(&client_end).unwrap().received < 6 && Instant::now() < deadline {
        std::thread::yield_now();
    }
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
    deadline = Instant::now() + Duration::from_secs(5);
    let moved = |i: usize| map_lookup(&kernel.moved, link.cookies[i]).unwrap();
    while (moved(0), moved(1)) != (15, 5) && Instant::now() < deadline {
        std::thread::yield_now();
    }
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
