//! The short replies a client may get from rodizio itself, and the two ways
//! of sending them without letting one client hold up the thread.
//!
//! rodizio is a layer-4 proxy and never speaks HTTP on its own, except on
//! three refusals, when `--http-replies` or `--rate-limit-reply http` ask
//! for it: `429 Too Many Requests` (the limiter), `503 Service Unavailable`
//! (no backend is available) and `502 Bad Gateway` (none could be reached).
//!
//! - [`reply_at_once`] is for the accept loop, which must never wait for a
//!   client: one non-blocking write, a FIN, a few non-blocking reads.
//! - [`reply_and_linger`] is for a worker, which may wait a little so the
//!   reply is not destroyed by a reset.
//!
//! A leaf: it uses no other module of rodizio.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C closes (or `exit()`s) without a word.

use std::io::{ErrorKind, Read, Write};
use std::net::{self, TcpStream};
use std::time::{Duration, Instant};

/// `HTTP/1.1 503 Service Unavailable`, for clients no backend is available
/// for.
pub const REPLY_503: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
Content-Type: text/plain\r\nContent-Length: 29\r\nConnection: close\r\n\r\n\
no backend server available\r\n";

/// `HTTP/1.1 503 Service Unavailable`, for clients that waited longer than
/// `queue_timeout` before a worker took them (the words say that, not why:
/// the workers may all have been busy, or the wait was elsewhere).
pub const REPLY_503_QUEUE: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
Content-Type: text/plain\r\nContent-Length: 38\r\nConnection: close\r\n\r\n\
waited past queue_timeout, try later\r\n";

/// `HTTP/1.1 503 Service Unavailable`, for clients refused because every
/// backend was at its `max_connections`: the line for a slot was full, or
/// they waited for one until `queue_timeout`.
pub const REPLY_503_FULL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
Content-Type: text/plain\r\nContent-Length: 40\r\nConnection: close\r\n\r\n\
backends at max_connections, try later\r\n";

/// `HTTP/1.1 502 Bad Gateway`, for clients whose every backend connect
/// failed.
pub const REPLY_502: &[u8] = b"HTTP/1.1 502 Bad Gateway\r\n\
Content-Type: text/plain\r\nContent-Length: 29\r\nConnection: close\r\n\r\n\
no backend server reachable\r\n";

/// Best-effort reply from the accept loop, which must never wait for a
/// client (the 503 here, the 429 of [`crate::limiter::refuse`]): the socket
/// is made non-blocking and gets one write of `reply` (a short reply fits
/// an empty send buffer, so it goes out whole in practice; if it does not,
/// the client gets less, never the accept loop stuck), then
/// `shutdown(Write)`, then a few non-blocking reads of what the client
/// already sent (closing with unread data makes the kernel send a reset,
/// which can destroy the reply before the client reads it). The caller then
/// closes.
pub fn reply_at_once(client: &TcpStream, reply: &[u8]) {
    if client.set_nonblocking(true).is_err() {
        return;
    }
    if let Err(err) = (&*client).write(reply) {
        log::debug!("reply not sent: {err}");
    }
    let _ = client.shutdown(net::Shutdown::Write);
    let mut sink = [0u8; 2048];
    for _ in 0..4 {
        match (&*client).read(&mut sink) {
            Ok(n) if n > 0 => {}
            _ => break,
        }
    }
}

/// Reply from a worker, which may wait a little: write `reply` (at most
/// `timeout`), shut the write side, then read and discard until the client
/// closes or `timeout` passes ("lingering close": closing with unread data
/// would make the kernel send a reset, which can destroy the reply before
/// the client reads it).
pub fn reply_and_linger(client: &TcpStream, reply: &[u8], timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let _ = client.set_nonblocking(false);
    let _ = client.set_write_timeout(Some(timeout));
    if (&*client).write_all(reply).is_err() {
        return;
    }
    let _ = client.shutdown(net::Shutdown::Write);
    drain_until(client, deadline);
}

/// Reads and discards what `client` still sends, until it closes or
/// `deadline` passes ("lingering close": closing a socket with unread bytes
/// makes the kernel send a reset, which can destroy a reply before the
/// client has read it). A 1 KiB buffer, whatever the client sends.
pub fn drain_until(client: &TcpStream, deadline: Instant) {
    let mut sink = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || client.set_read_timeout(Some(left)).is_err() {
            return;
        }
        match (&*client).read(&mut sink) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// The body of the 429 reply.
pub(crate) const BODY_429: &str = "Too many connections from your address; try again later.\n";

/// `HTTP/1.1 429 Too Many Requests` with `Retry-After` (whole seconds,
/// rounded up, at least 1) and `Connection: close`.
pub fn too_many_requests(retry_after: Duration) -> String {
    let secs = retry_after
        .as_secs()
        .saturating_add(u64::from(retry_after.subsec_nanos() > 0))
        .max(1);
    format!(
        "HTTP/1.1 429 Too Many Requests\r\nRetry-After: {secs}\r\nConnection: close\r\n\
         Content-Type: text/plain\r\nContent-Length: {}\r\n\r\n{BODY_429}",
        BODY_429.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::thread;

    #[test]
    fn replies_reach_the_client() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let (server, _) = l.accept().unwrap();
        reply_at_once(&server, REPLY_503);
        drop(server);
        let mut got = String::new();
        c.read_to_string(&mut got).unwrap();
        assert!(
            got.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{got}"
        );
        assert!(got.ends_with("\r\n\r\nno backend server available\r\n"));

        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let (server, _) = l.accept().unwrap();
        c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let t = thread::spawn(move || reply_and_linger(&server, REPLY_502, Duration::from_secs(5)));
        let mut got = String::new();
        c.read_to_string(&mut got).unwrap();
        assert!(got.starts_with("HTTP/1.1 502 Bad Gateway\r\n"), "{got}");
        assert!(got.ends_with("\r\n\r\nno backend server reachable\r\n"));
        drop(c);
        t.join().unwrap();
    }

    #[test]
    fn each_reply_says_its_own_length() {
        for reply in [REPLY_503, REPLY_503_QUEUE, REPLY_503_FULL, REPLY_502] {
            let text = std::str::from_utf8(reply).unwrap();
            let (head, body) = text.split_once("\r\n\r\n").unwrap();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("Content-Length: "))
                .unwrap();
            assert_eq!(length.parse::<usize>().unwrap(), body.len(), "{text}");
        }
    }
}
