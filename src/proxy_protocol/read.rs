//! Taking one PROXY protocol header off a client socket, and not one byte
//! more, within a deadline: peek, parse, consume what is header.
//!
//! # Threads
//!
//! Runs on the worker that serves the client; it may wait up to its
//! timeout, which is why the accept loop hands such a client over first.
//! No C counterpart.

use std::io;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::codec::{Header, HeaderError, Parsed, Version, MAX_LEN, V1_MAX_LEN, V2_MAX_LEN};
use super::parse;

/// Reads one PROXY protocol header from `stream`, consuming exactly its bytes.
///
/// The client's first bytes often arrive in the same segment as the header
/// (a sender writes both at once), and they belong to the proxy, not to this
/// function. So it never reads blindly: it *peeks* (`recv` with `MSG_PEEK`)
/// at what is in the socket, asks [`parse`](fn@parse) how much of it is header, and
/// consumes that much only. Every byte consumed is known to be part of the
/// header, so once the header is complete nothing beyond it has been taken,
/// and while it is incomplete the socket is left empty, so `poll(2)` sleeps
/// until more arrives instead of reporting the same peeked bytes again.
///
/// It waits with `poll(2)` until the header is complete, the bound is
/// exceeded, the peer closes, or `timeout` has passed since the call: a
/// client that connects and says nothing costs a worker `timeout`, no more.
/// The socket stays blocking (`MSG_DONTWAIT` is used per call), and its own
/// read timeout is neither used nor changed.
///
/// # Errors
///
/// [`HeaderError::Timeout`], [`HeaderError::Closed`], [`HeaderError::Io`],
/// or what [`parse`](fn@parse) refuses.
pub fn read_header(stream: &TcpStream, timeout: Duration) -> Result<Header, HeaderError> {
    let deadline = Instant::now() + timeout;
    let fd = stream.as_raw_fd();
    let mut buf = [0u8; MAX_LEN];
    // Bytes of the header consumed from the socket so far, in buf[..have].
    let mut have = 0;
    loop {
        if let Parsed::Complete { header, .. } = parse(&buf[..have])? {
            return Ok(header);
        }
        // `parse` says Incomplete only below its bounds, and the buffer
        // holds the larger one, so there is always room; this only keeps a
        // broken promise from becoming a zero-length read that looks like a
        // close.
        let room = &mut buf[have..];
        if room.is_empty() {
            let (version, limit) = if buf[0] == b'P' {
                (Version::V1, V1_MAX_LEN)
            } else {
                (Version::V2, V2_MAX_LEN)
            };
            return Err(HeaderError::TooLong { version, limit });
        }
        let peeked = match recv(fd, room, libc::MSG_PEEK | libc::MSG_DONTWAIT) {
            Ok(0) => return Err(HeaderError::Closed { received: have }),
            Ok(n) => n,
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                wait_readable(fd, deadline, have, timeout)?;
                continue;
            }
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(HeaderError::Io(err)),
        };
        // How many of the peeked bytes are header: all of them while it is
        // incomplete, up to its end once it is complete.
        let take = match parse(&buf[..have + peeked])? {
            Parsed::Complete { len, .. } => len - have,
            Parsed::Incomplete => peeked,
        };
        // The bytes are in the socket (just peeked), so this does not wait;
        // it may in principle take fewer, and the loop then goes round again.
        match recv(fd, &mut buf[have..have + take], libc::MSG_DONTWAIT) {
            Ok(0) => return Err(HeaderError::Closed { received: have }),
            Ok(n) => have += n,
            Err(err)
                if matches!(
                    err.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) => {}
            Err(err) => return Err(HeaderError::Io(err)),
        }
    }
}

/// `recv(2)` into `buf` with `flags`.
fn recv(fd: libc::c_int, buf: &mut [u8], flags: libc::c_int) -> io::Result<usize> {
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the whole
    // call, and `fd` is an open socket borrowed from a live `TcpStream`.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), flags) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        // Non-negative and at most buf.len(), so it fits.
        Ok(n as usize)
    }
}

/// Waits until `fd` is readable (or hung up, or in error: the next `recv`
/// then says which) or `deadline` passes (`crate::poll::readable_by`).
fn wait_readable(
    fd: libc::c_int,
    deadline: Instant,
    received: usize,
    timeout: Duration,
) -> Result<(), HeaderError> {
    match crate::poll::readable_by(fd, deadline) {
        Ok(true) => Ok(()),
        Ok(false) => Err(HeaderError::Timeout { received, timeout }),
        Err(e) => Err(HeaderError::Io(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy_protocol::samples::proxy;
    use crate::proxy_protocol::{encode, HeaderError, Version, V1_MAX_LEN, V2_SIGNATURE};
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener};
    use std::thread;

    const SOCKET_TIMEOUT: Duration = Duration::from_secs(5);

    /// A connected pair on loopback: (the client's end, the server's end).
    fn socket_pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        for socket in [&client, &server] {
            socket.set_read_timeout(Some(SOCKET_TIMEOUT)).unwrap();
            socket.set_write_timeout(Some(SOCKET_TIMEOUT)).unwrap();
            socket.set_nodelay(true).unwrap();
        }
        (client, server)
    }

    /// The bytes after the header stay in the socket, for v1 and v2, sent
    /// together with the header in one write.
    #[test]
    fn read_header_leaves_the_clients_bytes() {
        for version in [Version::V1, Version::V2] {
            let (mut client, mut server) = socket_pair();
            let header = proxy("192.0.2.1:5000", "198.51.100.7:80");
            let mut bytes = encode(version, &header);
            bytes.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
            client.write_all(&bytes).unwrap();
            client.shutdown(Shutdown::Write).unwrap();

            assert_eq!(read_header(&server, SOCKET_TIMEOUT).unwrap(), header);
            let mut rest = Vec::new();
            server.read_to_end(&mut rest).unwrap();
            assert_eq!(rest, b"GET / HTTP/1.1\r\n\r\n", "{version}");
        }
    }

    /// A header sent one byte per write (one segment each, with
    /// TCP_NODELAY) is put together, and what follows it is left.
    #[test]
    fn read_header_assembles_a_header_sent_byte_by_byte() {
        for version in [Version::V1, Version::V2] {
            let (mut client, mut server) = socket_pair();
            let header = proxy("[2001:db8::1]:5000", "[2001:db8::2]:80");
            let mut bytes = encode(version, &header);
            bytes.extend_from_slice(b"hello");
            let writer = thread::spawn(move || {
                for byte in bytes {
                    client.write_all(&[byte]).unwrap();
                }
                client
            });
            assert_eq!(read_header(&server, SOCKET_TIMEOUT).unwrap(), header);
            let _client = writer.join().unwrap();
            let mut rest = [0u8; 5];
            server.read_exact(&mut rest).unwrap();
            assert_eq!(&rest, b"hello", "{version}");
        }
    }

    /// A client that connects and says nothing costs the timeout, no more.
    #[test]
    fn read_header_times_out_on_a_silent_client() {
        let (mut client, server) = socket_pair();
        client.write_all(b"PROXY TCP4 ").unwrap();
        let timeout = Duration::from_millis(200);
        let started = Instant::now();
        let err = read_header(&server, timeout).unwrap_err();
        let elapsed = started.elapsed();
        assert!(
            matches!(err, HeaderError::Timeout { received: 11, .. }),
            "{err}"
        );
        assert!(elapsed >= timeout, "returned after {elapsed:?}");
        assert!(elapsed < SOCKET_TIMEOUT, "returned after {elapsed:?}");
    }

    /// Headers over the bound are refused at once, not waited for.
    #[test]
    fn read_header_refuses_a_header_too_long() {
        let (mut client, server) = socket_pair();
        let mut line = b"PROXY UNKNOWN ".to_vec();
        line.resize(V1_MAX_LEN + 10, b'x');
        client.write_all(&line).unwrap();
        let err = read_header(&server, SOCKET_TIMEOUT).unwrap_err();
        assert!(matches!(err, HeaderError::TooLong { .. }), "{err}");

        let (mut client, server) = socket_pair();
        client.write_all(&V2_SIGNATURE).unwrap();
        client.write_all(&[0x21, 0x11, 0xff, 0xff]).unwrap();
        let err = read_header(&server, SOCKET_TIMEOUT).unwrap_err();
        assert!(matches!(err, HeaderError::TooLong { .. }), "{err}");
    }

    /// A client that closes mid-header, or sends no header, is told apart.
    #[test]
    fn read_header_reports_a_close_and_a_missing_header() {
        let (mut client, server) = socket_pair();
        let v2_tcp4 = encode(Version::V2, &proxy("172.19.0.1:42578", "172.19.0.3:80"));
        client.write_all(&v2_tcp4[..20]).unwrap();
        client.shutdown(Shutdown::Write).unwrap();
        let err = read_header(&server, SOCKET_TIMEOUT).unwrap_err();
        assert!(matches!(err, HeaderError::Closed { received: 20 }), "{err}");

        let (mut client, server) = socket_pair();
        client.write_all(b"GET / HTTP/1.1\r\n").unwrap();
        let err = read_header(&server, SOCKET_TIMEOUT).unwrap_err();
        assert!(matches!(err, HeaderError::NoSignature), "{err}");
    }
}
