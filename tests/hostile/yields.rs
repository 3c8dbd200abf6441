//! `yield_before_poll` `on` and `auto` against slow and partial peers: a
//! client that speaks one byte at a time, an upload written in odd small
//! pieces while its echo is read, a backend that answers late (the yields
//! find nothing, and `auto` stops them), then a half-close. Every byte
//! comes back in order, every end is clean, and each connection is
//! counted as it ended. Then the binary with the yields on, out of
//! descriptors and workers at once: every client served, every descriptor
//! given back. Resets mid-way with the yields on are in `resets`.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use rodizio::units::Switch;

use crate::child::Child;
use crate::common::{connect, echo, limit_in_child, until, TestBackend, TestBalancer};

/// Clients at once, and the one-byte exchanges each makes.
const CLIENTS: usize = 8;
const EXCHANGES: usize = 40;

/// The upload each client writes in pieces, then reads back.
const UPLOAD: usize = 32 * 1024;

/// A backend that waits a little before each answer: a peer whose reply
/// is never there when the worker looks right after its yield.
fn late_echo() -> TestBackend {
    TestBackend::start(Arc::new(|mut stream: TcpStream| {
        let mut buf = vec![0u8; 4096];
        loop {
            let n = stream.read(&mut buf)?;
            if n == 0 {
                return stream.shutdown(Shutdown::Write);
            }
            // Load shaping, not ordering: the reply comes late.
            thread::sleep(Duration::from_millis(1));
            stream.write_all(&buf[..n])?;
        }
    }))
}

/// One client: one-byte exchanges, then the upload in pieces of 1 to 97
/// bytes with its echo read on another thread, then a half-close; the
/// echo must be byte for byte and end cleanly.
fn client(addr: SocketAddr, seed: usize) {
    let mut s = connect(addr).unwrap();
    for k in 0..EXCHANGES {
        let byte = [(seed * 31 + k) as u8];
        s.write_all(&byte).unwrap();
        let mut back = [0u8; 1];
        s.read_exact(&mut back).unwrap();
        assert_eq!(back, byte, "client {seed}, exchange {k}");
    }
    let upload: Vec<u8> = (0..UPLOAD).map(|i| (i * 7 + seed) as u8).collect();
    let mut reader = s.try_clone().unwrap();
    let echoed = thread::spawn(move || {
        let mut got = Vec::new();
        reader.read_to_end(&mut got).map(|_| got)
    });
    let mut at = 0;
    let mut piece = seed % 97 + 1;
    while at < UPLOAD {
        let end = (at + piece).min(UPLOAD);
        s.write_all(&upload[at..end]).unwrap();
        at = end;
        piece = piece * 13 % 97 + 1;
    }
    s.shutdown(Shutdown::Write).unwrap();
    let got = echoed.join().unwrap().expect("a clean end after the echo");
    assert!(
        got == upload,
        "client {seed}: {} bytes back of {UPLOAD}, or out of order",
        got.len()
    );
}

#[test]
fn slow_and_partial_peers_get_every_byte_with_the_yields_on() {
    let quick = TestBackend::start(Arc::new(echo));
    let late = late_echo();
    for yields in [Switch::On, Switch::Auto] {
        for backend in [&quick, &late] {
            let lb = TestBalancer::with(&[backend.addr()], |c| {
                c.proxy.yield_before_poll = yields;
                c.proxy.kernel_relay = rodizio::units::Switch::Off;
            });
            let clients: Vec<_> = (0..CLIENTS)
                .map(|seed| {
                    let addr = lb.addr;
                    thread::spawn(move || client(addr, seed))
                })
                .collect();
            for c in clients {
                c.join().unwrap();
            }
            assert!(
                lb.wait_ended(CLIENTS as u64, Duration::from_secs(20)),
                "yields={yields:?}: {:?}",
                lb.stats.snapshot()
            );
            let snap = lb.stats.snapshot();
            assert_eq!(
                snap.ended_client_closed + snap.ended_backend_closed,
                CLIENTS as u64,
                "yields={yields:?}: {snap:?}"
            );
            lb.stop();
        }
    }
}

/// The binary with the yields `on` and `auto`, 4 workers and 48 open files
/// (a limit it cannot raise): 60 clients at once, each making 20 one-byte
/// exchanges. Workers run out (the others wait in the queue, each holding
/// a descriptor) and so do descriptors (the accept loop backs off); every
/// client is served in the end, and once they are gone the process holds
/// the descriptors it held before and is still up.
#[test]
fn out_of_descriptors_and_workers_with_the_yields_on_every_client_is_served() {
    const MANY: usize = 60;
    const EACH: usize = 20;
    let backend = TestBackend::start(Arc::new(echo));
    for yields in ["--yield-before-poll=on", "--yield-before-poll=auto"] {
        let b = backend.addr().to_string();
        let args = ["-b", &b, "--health-check", "off", "--workers", "4", yields];
        let lb = Child::on_loopback(&args, |command| {
            command.env("RUST_LOG", "warn");
            limit_in_child(command, libc::RLIMIT_NOFILE, 48);
        });
        let mut first = connect(lb.addr).unwrap();
        first.write_all(b"w").unwrap();
        first.read_exact(&mut [0u8]).unwrap();
        let baseline = lb.open_fds() - 2;
        drop(first);
        let clients: Vec<_> = (0..MANY)
            .map(|seed| {
                let addr = lb.addr;
                thread::spawn(move || {
                    let mut s = connect(addr).unwrap();
                    for k in 0..EACH {
                        let byte = [(seed * 7 + k) as u8];
                        s.write_all(&byte).unwrap();
                        let mut back = [0u8];
                        s.read_exact(&mut back).unwrap();
                        assert_eq!(back, byte, "client {seed}, exchange {k}");
                    }
                })
            })
            .collect();
        for c in clients {
            c.join().unwrap();
        }
        assert!(
            lb.log().contains("Too many open files"),
            "{yields}: never out of descriptors: {}",
            lb.log()
        );
        until("the descriptors given back", || lb.open_fds() <= baseline);
        let mut last = connect(lb.addr).unwrap();
        last.write_all(b"z").unwrap();
        let mut back = [0u8];
        last.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"z", "{yields}");
        assert!(!lb.log().contains("panicked"), "{}", lb.log());
    }
}
