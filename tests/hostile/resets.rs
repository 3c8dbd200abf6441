//! Resets mid-way under many connections: a backend that resets after
//! part of its reply, clients that reset mid-upload, and connections that
//! end cleanly, all at once. Each reset reaches the other peer as a reset
//! (not an end of stream that a reader to the end takes for complete
//! data), each clean end stays clean and whole, every connection is
//! counted by how it ended, and the balancer serves on. With the copy
//! pump, the splice pump, and the copy pump with `yield_before_poll` `on`
//! (the kernel relay's attacks are in `kernel_relay`).

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use rodizio::units::Switch;
use socket2::SockRef;

use crate::common::{connect, echo_through, TestBackend, TestBalancer};

/// Client threads at once, and connections each.
const THREADS: usize = 16;
const EACH: usize = 12;

/// What one connection is asked to do, from its first line `K n\n`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// The backend sends `n` bytes, then resets.
    BackendResets,
    /// The backend sends `n` bytes, then closes.
    Clean,
    /// The client sends `n` bytes, then resets; the backend reads to the end.
    ClientResets,
}

impl Kind {
    fn of(i: usize) -> Kind {
        [Kind::BackendResets, Kind::Clean, Kind::ClientResets][i % 3]
    }

    fn letter(self) -> u8 {
        match self {
            Kind::BackendResets => b'R',
            Kind::Clean => b'C',
            Kind::ClientResets => b'U',
        }
    }
}

/// Resets `stream`: SO_LINGER 0, then close.
fn reset(stream: TcpStream) {
    let _ = SockRef::from(&stream).set_linger(Some(Duration::ZERO));
    drop(stream);
}

/// Reads to the end: the bytes, and whether the end was a reset.
fn read_to_the_end(s: &mut TcpStream) -> (u64, Result<bool, String>) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = 0u64;
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (got, Ok(false)),
            Ok(n) => got += n as u64,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return (got, Ok(true)),
            Err(e) => return (got, Err(e.to_string())),
        }
    }
}

/// The backend: reads the first line, then does what it says; the ends
/// of the uploads it read go to `uploads`.
fn backend(uploads: crossbeam_channel::Sender<(u64, Result<bool, String>)>) -> TestBackend {
    TestBackend::start(Arc::new(move |mut stream: TcpStream| {
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        while byte[0] != b'\n' {
            stream.read_exact(&mut byte)?;
            line.push(byte[0]);
        }
        let n: usize = String::from_utf8_lossy(&line[2..line.len() - 1])
            .parse()
            .unwrap_or(0);
        match line[0] {
            b'R' => {
                stream.write_all(&vec![b'r'; n])?;
                reset(stream);
            }
            b'C' => {
                stream.write_all(&vec![b'c'; n])?;
                stream.shutdown(std::net::Shutdown::Write)?;
                let mut rest = Vec::new();
                let _ = stream.read_to_end(&mut rest);
            }
            _ => {
                let _ = uploads.send(read_to_the_end(&mut stream));
            }
        }
        Ok(())
    }))
}

/// One connection of kind `kind` with `n` bytes: what the client saw
/// (`None` for an upload, whose end the backend reports).
fn one(addr: std::net::SocketAddr, kind: Kind, n: usize) -> Option<(u64, Result<bool, String>)> {
    let mut s = connect(addr).unwrap();
    let mut first = vec![kind.letter(), b' '];
    first.extend_from_slice(format!("{n}\n").as_bytes());
    s.write_all(&first).unwrap();
    if kind == Kind::ClientResets {
        s.write_all(&vec![b'u'; n]).unwrap();
        reset(s);
        return None;
    }
    Some(read_to_the_end(&mut s))
}

#[test]
fn resets_mid_way_under_many_connections_reach_the_other_side_as_resets() {
    let (tx, uploads) = crossbeam_channel::unbounded();
    let backend = backend(tx);
    // With the yields `on` (a yield after every round that moved bytes;
    // `auto` yields on the same path, while the answers come).
    let pumps = [
        (false, Switch::Off),
        (true, Switch::Off),
        (false, Switch::On),
    ];
    for (splice, yields) in pumps {
        // The pumps named, whatever RODIZIO_TEST_KERNEL_RELAY says: on the
        // kernel path a reset that races the hand-over may still end as an
        // ordinary close (docs/moving-bytes.md, the kernel relay's known
        // limits; its own attacks are in `kernel_relay`).
        let lb = TestBalancer::with(&[backend.addr()], |c| {
            c.proxy.splice = splice;
            c.proxy.yield_before_poll = yields;
            c.proxy.kernel_relay = rodizio::units::Switch::Off;
        });
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let addr = lb.addr;
                thread::spawn(move || {
                    (0..EACH)
                        .map(|i| {
                            let kind = Kind::of(t + i);
                            // 16 KB to about 600 KB, different per connection.
                            let n = 16_000 + (t * 7919 + i * 104_729) % 600_000;
                            (kind, n, one(addr, kind, n))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let seen: Vec<_> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        let count = |k: Kind| seen.iter().filter(|(kind, ..)| *kind == k).count();
        let (resets, cleans, ups) = (
            count(Kind::BackendResets),
            count(Kind::Clean),
            count(Kind::ClientResets),
        );
        let ups_seen: Vec<_> = (0..ups)
            .map(|_| uploads.recv_timeout(Duration::from_secs(20)).unwrap())
            .collect();
        assert!(
            lb.wait_ended((THREADS * EACH) as u64, Duration::from_secs(20)),
            "splice={splice} yields={yields:?}: {:?}",
            lb.stats.snapshot()
        );
        let snap = lb.stats.snapshot();
        // A clean end stays clean, and whole.
        for (kind, n, end) in &seen {
            if *kind == Kind::Clean {
                assert_eq!(
                    end,
                    &Some((*n as u64, Ok(false))),
                    "splice={splice} yields={yields:?}"
                );
            }
        }
        // Each reset reaches the other peer as a reset (at most one in
        // twenty may be lost to a race of the test's own sockets).
        let backend_resets_seen = seen
            .iter()
            .filter(|(kind, _, end)| {
                *kind == Kind::BackendResets && matches!(end, Some((_, Ok(true))))
            })
            .count();
        let client_resets_seen = ups_seen.iter().filter(|(_, end)| end == &Ok(true)).count();
        assert!(
            backend_resets_seen * 20 >= resets * 19,
            "splice={splice} yields={yields:?}: {backend_resets_seen} of {resets} clients saw the backend's reset"
        );
        assert!(
            client_resets_seen * 20 >= ups * 19,
            "splice={splice} yields={yields:?}: {client_resets_seen} of {ups} uploads ended in a reset: {ups_seen:?}"
        );
        assert_eq!(snap.ended_backend_reset, resets as u64, "{snap:?}");
        assert_eq!(snap.ended_client_reset, ups as u64, "{snap:?}");
        assert_eq!(
            snap.ended_backend_closed + snap.ended_client_closed,
            cleans as u64,
            "{snap:?}"
        );
        // Still serving.
        let ping = Arc::new(b"C 4\n".to_vec());
        let back = echo_through(connect(lb.addr).unwrap(), ping).unwrap();
        assert_eq!(back, b"cccc");
        lb.stop();
    }
}
