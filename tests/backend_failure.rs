//! A misbehaving backend ends only its own connection.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use common::{connect, echo_through, is_closed, test_data, wait_for, TestBackend, TestBalancer};
use socket2::SockRef;

/// Resets the connection (SO_LINGER 0, then close) after echoing `after`
/// bytes.
fn resetter(after: usize) -> TestBackend {
    TestBackend::start(Arc::new(move |mut s: TcpStream| {
        let mut buf = vec![0u8; after];
        s.read_exact(&mut buf)?;
        s.write_all(&buf)?;
        SockRef::from(&s).set_linger(Some(Duration::ZERO))?;
        Ok(())
    }))
}

/// Backends: one that resets at once, one that resets after echoing 64 KiB,
/// and a good echo backend. The clients of the first two see their
/// connection closed (end of stream or reset, never a hang); a transfer on
/// the good backend running at the same time completes byte for byte; two
/// connection errors are counted and no worker stays busy.
#[test]
fn backend_resets_end_only_their_connection() {
    let early = resetter(1);
    let late = resetter(64 * 1024);
    let good = TestBackend::echo();
    let lb = TestBalancer::over(&[early.addr(), late.addr(), good.addr()]);

    let mut first = connect(lb.addr).unwrap();
    let mut second = connect(lb.addr).unwrap();
    let data = Arc::new(test_data(4 * 1024 * 1024, 3));
    let transfer = {
        let (stream, data) = (connect(lb.addr).unwrap(), data.clone());
        std::thread::spawn(move || echo_through(stream, data))
    };

    first.write_all(b"x").unwrap();
    let mut b = [0u8];
    // The echo of the single byte may or may not arrive before the reset.
    let _ = first.read_exact(&mut b);
    assert!(is_closed(&mut first), "first client not closed");

    let payload = test_data(64 * 1024, 9);
    second.write_all(&payload).unwrap();
    let mut back = Vec::new();
    // The stream ends (end of stream or reset, not a timeout); the reset
    // may cut the echo short, but what arrives must be a prefix.
    if let Err(e) = second.read_to_end(&mut back) {
        assert!(
            matches!(
                e.kind(),
                ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted
            ),
            "second client not closed: {e}"
        );
    }
    assert!(
        payload.starts_with(&back),
        "corrupted echo before the reset"
    );

    let back = transfer.join().unwrap().expect("the good transfer");
    assert!(back == *data, "the good transfer was corrupted");
    assert!(wait_for(Duration::from_secs(5), || {
        let s = lb.stats.snapshot();
        s.active == 0 && s.errors == 2
    }));
    lb.stop();
}
