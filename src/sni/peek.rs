//! Peeking at a client's ClientHello with `recv(MSG_PEEK)`: the bytes
//! stay in the socket, and the backend later receives them untouched.
//!
//! A hello may come in pieces (one byte at a time, even). Polling for
//! "readable" would return at once while the peeked bytes sit unread, so
//! the worker raises the socket's `SO_RCVLOWAT` to the bytes it still
//! needs: `poll(2)` then wakes only once that many have arrived (or the
//! client closed), and a trickling client costs one wake-up per piece, not
//! a busy loop. The mark is put back to 1 before anything else reads the
//! socket (the pump's `poll(2)` relies on it), whatever happens.
//!
//! The wait is bounded by a deadline, the size by [`MAX_WIRE`] (a hello
//! of at most 16 KiB, in one record or several, which the parser joins),
//! and the buffer is allocated to the records' announced length only once
//! their headers have arrived. A hello still incomplete at the deadline is
//! [`Peeked::Stalled`], told apart from a client that sent nothing.
//!
//! # Threads
//!
//! Worker threads, on the client they hold.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::io;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Instant;

use super::client_hello::{self, Parsed, MAX_WIRE, RECORD_HEADER};

/// What the first bytes of a client were.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peeked {
    /// A complete ClientHello: the name it asks for, lower case, and the
    /// protocols it offers by ALPN, as [`client_hello::Hello::alpn`]
    /// holds them (empty: none).
    Hello {
        /// The server name, if any.
        name: Option<Box<str>>,
        /// The ALPN protocol list, checked (walk it with
        /// [`client_hello::protocols`]).
        alpn: Box<[u8]>,
    },
    /// Not a ClientHello (or it ended before being complete): why.
    NotTls(&'static str),
    /// Nothing at all by the deadline (a client that waits for the
    /// server to speak first, or a silent one).
    Timeout,
    /// The start of a ClientHello, never finished by the deadline.
    Stalled,
    /// Closed by another worker, stalled longest, to make room for a new
    /// client (`tls_max_pending`, [`crate::pending`]).
    MadeRoom,
}

/// Puts `SO_RCVLOWAT` back to 1 when dropped.
struct LowMark(RawFd);

impl Drop for LowMark {
    fn drop(&mut self) {
        let _ = set_low_mark(self.0, 1);
    }
}

/// Peeks at `client` until a whole ClientHello is there, it cannot be one,
/// or `deadline` passes. Consumes nothing.
#[inline(never)]
pub fn client_hello(client: &TcpStream, deadline: Instant) -> Peeked {
    let fd = client.as_raw_fd();
    let mut buf = vec![0u8; RECORD_HEADER];
    // A hello over several records is joined here (left empty otherwise).
    let mut joined = Vec::new();
    let mut seen = 0;
    let _mark = LowMark(fd);
    loop {
        if let Err(err) = set_low_mark(fd, buf.len()) {
            log::debug!("cannot set SO_RCVLOWAT on a client: {err}");
            return Peeked::NotTls("a socket error");
        }
        match crate::poll::readable_by(fd, deadline) {
            Ok(true) => {}
            Ok(false) => return timed_out(fd, &mut buf),
            Err(_) => return Peeked::NotTls("a socket error"),
        }
        let n = match peek(fd, &mut buf) {
            Ok(0) => return Peeked::NotTls("closed before a ClientHello"),
            Ok(n) => n,
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => continue,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return Peeked::NotTls("a socket error"),
        };
        match client_hello::parse(&buf[..n], &mut joined) {
            Parsed::Hello(hello) => {
                return Peeked::Hello {
                    name: hello.name.map(lower),
                    // No allocation when the hello offers no ALPN.
                    alpn: hello.alpn.into(),
                };
            }
            Parsed::NotTls(why) => return Peeked::NotTls(why),
            Parsed::NeedMore(total) => {
                if n == seen && n < buf.len() {
                    // Readable with nothing new: the client closed its
                    // side with its hello incomplete.
                    return Peeked::NotTls("a ClientHello cut short");
                }
                seen = n;
                if total > buf.len() {
                    // The parser bounds `total` by `MAX_WIRE`.
                    buf.resize(total.min(MAX_WIRE), 0);
                }
            }
        }
    }
}

/// The deadline passed: [`Peeked::Stalled`] when any byte came (the
/// low mark may have hidden a few), else [`Peeked::Timeout`].
#[cold]
fn timed_out(fd: RawFd, buf: &mut [u8]) -> Peeked {
    match peek(fd, buf) {
        Ok(n) if n > 0 => Peeked::Stalled,
        _ => Peeked::Timeout,
    }
}

/// `name`, lower case, without a trailing dot.
fn lower(name: &str) -> Box<str> {
    name.trim_end_matches('.').to_ascii_lowercase().into()
}

/// `recv(2)` with `MSG_PEEK`, not waiting.
fn peek(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: a valid descriptor and a buffer of `buf.len()` writable
    // bytes that lives for the whole call.
    let n = unsafe {
        libc::recv(
            fd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Sets `SO_RCVLOWAT`: `poll(2)` reports the socket readable once this
/// many bytes are queued (or at its end of stream).
fn set_low_mark(fd: RawFd, bytes: usize) -> io::Result<()> {
    let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: a valid descriptor and a pointer to a c_int that lives for
    // the whole call, with its exact size.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::time::Duration;

    use crate::test_support::pair;

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(10)
    }

    #[test]
    fn a_hello_in_pieces_is_read_whole_and_left_in_place() {
        let (mut client, server) = pair();
        let hello = client_hello::build(Some("A.Test."), 3000);
        let writer = {
            let hello = hello.clone();
            std::thread::spawn(move || {
                for piece in hello.chunks(700) {
                    client.write_all(piece).unwrap();
                    std::thread::yield_now();
                }
                client
            })
        };
        assert_eq!(
            client_hello(&server, soon()),
            Peeked::Hello {
                name: Some("a.test".into()),
                alpn: Box::default()
            }
        );
        let _client = writer.join().unwrap();
        // Nothing was consumed, and the mark is back at 1.
        let mut all = vec![0; hello.len()];
        assert_eq!(peek(server.as_raw_fd(), &mut all).unwrap(), hello.len());
        assert_eq!(all, hello);
        let mut mark: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: valid descriptor, pointers to a c_int and its length.
        let rc = unsafe {
            libc::getsockopt(
                server.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                (&mut mark as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!((rc, mark), (0, 1));
    }

    #[test]
    fn a_hello_in_two_records_is_joined_and_left_in_place() {
        let (mut client, server) = pair();
        let hello = client_hello::build(Some("b.test"), 500);
        let message = &hello[RECORD_HEADER..];
        let mut wire = Vec::new();
        for part in [&message[..40], &message[40..]] {
            wire.extend_from_slice(&[0x16, 3, 1]);
            wire.extend_from_slice(&(part.len() as u16).to_be_bytes());
            wire.extend_from_slice(part);
        }
        client.write_all(&wire).unwrap();
        assert_eq!(
            client_hello(&server, soon()),
            Peeked::Hello {
                name: Some("b.test".into()),
                alpn: Box::default()
            }
        );
        let mut all = vec![0; wire.len() + 1];
        assert_eq!(peek(server.as_raw_fd(), &mut all).unwrap(), wire.len());
    }

    #[test]
    fn garbage_silence_and_a_cut_hello_end_the_wait() {
        let (mut client, server) = pair();
        client.write_all(b"SSH-2.0-x\r\n").unwrap();
        assert!(matches!(client_hello(&server, soon()), Peeked::NotTls(_)));
        let (_quiet, server) = pair();
        let short = Instant::now() + Duration::from_millis(50);
        assert_eq!(client_hello(&server, short), Peeked::Timeout);
        // A few bytes, under the low mark, then silence: stalled.
        let (mut client, server) = pair();
        client.write_all(&[0x16, 3]).unwrap();
        let short = Instant::now() + Duration::from_millis(50);
        assert_eq!(client_hello(&server, short), Peeked::Stalled);
        // Half a hello, then silence: stalled too.
        let (mut client, server) = pair();
        client
            .write_all(&client_hello::build(Some("a.test"), 0)[..30])
            .unwrap();
        let short = Instant::now() + Duration::from_millis(50);
        assert_eq!(client_hello(&server, short), Peeked::Stalled);
        let (mut client, server) = pair();
        client
            .write_all(&client_hello::build(Some("a.test"), 0)[..20])
            .unwrap();
        client.shutdown(std::net::Shutdown::Write).unwrap();
        assert_eq!(
            client_hello(&server, soon()),
            Peeked::NotTls("a ClientHello cut short")
        );
    }
}
