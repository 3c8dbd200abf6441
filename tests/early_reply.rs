//! A backend that answers before it has read the whole request (an early
//! `413`, a `401` before the upload) gets its answer to the client, on
//! the copy pump, the splice pump and the kernel relay (the second pass of
//! `make test`); with the relay from the start (`kernel_relay_after` 0)
//! the end may be told as an error rather than a backend reset, the one
//! known limit left (docs/moving-bytes.md).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::{connect, TestBackend, TestBalancer};

const REPLY: &[u8] = b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 0\r\n\r\n";

/// The client uploads 10 MiB; the backend reads about 1 KiB, answers 413
/// and closes with the rest unread (so its kernel resets the connection).
/// The balancer's writes toward it fail, and the 413 still reaches the
/// client, with and without `--splice`. The client reads on its own thread
/// while it writes, and everything is bounded in time.
#[test]
fn an_early_reply_during_an_upload_reaches_the_client() {
    for splice in [false, true] {
        let backend = TestBackend::start(Arc::new(|mut stream: TcpStream| {
            let mut head = [0u8; 1024];
            stream.read_exact(&mut head)?;
            stream.write_all(REPLY)
            // Dropped here with the upload unread: the kernel sends a reset.
        }));
        let lb = TestBalancer::with(&[backend.addr()], |c| c.proxy.splice = splice);
        let mut client = connect(lb.addr).unwrap();
        let mut reader = client.try_clone().unwrap();
        let started = Instant::now();
        let reply = thread::spawn(move || {
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            // Until the reply is whole, the end of stream or an error (the
            // balancer's close resets the upload that it no longer reads).
            while !got.starts_with(REPLY) {
                match reader.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            got
        });
        let chunk = vec![b'x'; 64 * 1024];
        let mut sent = 0;
        while sent < 10 << 20 && started.elapsed() < Duration::from_secs(20) {
            match client.write(&chunk) {
                Ok(n) => sent += n,
                Err(_) => break,
            }
        }
        let got = reply.join().unwrap();
        assert!(
            got.starts_with(REPLY),
            "splice={splice}: the client got {:?} after sending {sent} bytes",
            String::from_utf8_lossy(&got)
        );
        assert!(started.elapsed() < Duration::from_secs(20));
        drop(client);
        assert!(lb.wait_ended(1, Duration::from_secs(5)));
        let s = lb.stats.snapshot();
        if !splice && common::kernel_relay_after_from_env() == Some(0) {
            // The known limit of the kernel relay from the start
            // (docs/moving-bytes.md, "Known limit"): the answer arrives and
            // is counted, but when the reset meets the way back to the copy
            // pump under a full upload the end may be told as an error.
            assert_eq!(
                s.ended_backend_reset + s.ended_error,
                1,
                "splice={splice}: {s:?}"
            );
        } else {
            assert_eq!(s.ended_backend_reset, 1, "splice={splice}: {s:?}");
        }
        assert_eq!(s.bytes_to_clients, REPLY.len() as u64, "splice={splice}");
        lb.stop();
    }
}
