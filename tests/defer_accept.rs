//! `--defer-accept`: a client reaches the accept loop only once it has sent
//! its first bytes, and is then served as usual.

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use common::{config, connect, TestBackend, TestBalancer};

/// With `--defer-accept` a connected client that has sent nothing is not
/// yet accepted (the kernel holds it), and once it sends, it is accepted
/// and its bytes come back through an echo backend.
#[test]
fn a_client_is_accepted_once_it_sends() {
    let backend = TestBackend::echo();
    let mut cfg = config(&[backend.addr()]);
    cfg.defer_accept = true;
    let lb = TestBalancer::start(cfg);

    let mut client = connect(lb.addr).unwrap();
    // The handshake is done, but the kernel keeps the connection out of
    // accept(2) for about a second while no byte has come.
    assert!(!common::wait_for(Duration::from_millis(300), || {
        lb.stats.snapshot().accepted > 0
    }));

    client.write_all(b"hello").unwrap();
    let mut back = [0u8; 5];
    client.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"hello");
    assert_eq!(lb.stats.snapshot().accepted, 1);
    drop(client);
    lb.stop();
}

/// The flag is off by default: a silent client is accepted at once, so
/// protocols where the server speaks first keep working.
#[test]
fn off_by_default_a_silent_client_is_accepted() {
    let backend = TestBackend::echo();
    let lb = TestBalancer::over(&[backend.addr()]);
    let client = connect(lb.addr).unwrap();
    assert!(common::wait_for(Duration::from_secs(5), || {
        lb.stats.snapshot().accepted == 1
    }));
    drop(client);
    lb.stop();
}
