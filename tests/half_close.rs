//! Half-close: the client shuts its write side and still gets its reply.

mod common;

use std::io::{Read, Write};
use std::net::Shutdown;

use common::{after_eof_reply, connect, test_data, TestBackend, TestBalancer};

/// The client sends a request, shuts its write side, then reads. The
/// backend replies only after it sees that end of stream, so the balancer
/// must pass the half-close on (and keep the other direction open) for the
/// reply to arrive. Sizes from empty to several buffers long.
#[test]
fn reply_after_client_eof_arrives_whole() {
    let backend = TestBackend::reply_after_eof();
    let lb = TestBalancer::over(&[backend.addr()]);
    for (i, len) in [0usize, 1, 4096, 4097, 300_000].into_iter().enumerate() {
        let request = test_data(len, i as u64 + 1);
        let mut s = connect(lb.addr).unwrap();
        s.write_all(&request).unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        let mut reply = Vec::new();
        s.read_to_end(&mut reply)
            .expect("the whole reply, then end of stream");
        assert_eq!(reply, after_eof_reply(&request), "request of {len} bytes");
    }
    assert_eq!(backend.accepted(), 5);
    lb.stop();
}
