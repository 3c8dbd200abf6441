//! One TCP connect, bounded by a timeout: the workers' connect to a
//! backend ([`crate::backend::Backend::connect`]) and the health checks'
//! connect to a backend's check target ([`connect_any`]).
//!
//! # Threads
//!
//! Runs on the thread that connects (a worker, a probe thread); no state.
//!
//! # Corresponds to the C article
//!
//! The `connect()` of `get_final_server_socket()`, bounded here by a
//! timeout the C did not have.

use std::io::{self, ErrorKind};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};

/// Connects to the first of `addrs` that answers within `timeout` each,
/// as [`crate::backend::Backend::connect`] does (the health checks use
/// this for a check target other than the backend's own addresses).
///
/// # Errors
///
/// The last address's error, or `InvalidInput` if `addrs` is empty.
pub fn connect_any(addrs: &[SocketAddr], timeout: Duration) -> io::Result<TcpStream> {
    let mut last = None;
    for addr in addrs {
        match connect_one(*addr, timeout) {
            Ok(stream) => return Ok(stream),
            Err(err) => last = Some(err),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::new(ErrorKind::InvalidInput, "no address to connect to")))
}

/// One connect attempt to one address: see [`crate::backend::Backend::connect`].
pub(crate) fn connect_one(addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    // Small writes (a request line, a Redis command) must leave at once,
    // not wait for Nagle's algorithm to batch them.
    socket.set_nodelay(true)?;
    // A zero timeout would mean "wait forever" to the kernel.
    socket.set_write_timeout(Some(timeout.max(Duration::from_millis(1))))?;
    match socket.connect(&addr.into()) {
        Ok(()) => Ok(socket.into()),
        Err(err) if err.raw_os_error() == Some(libc::EINPROGRESS) => Err(timed_out(addr, timeout)),
        Err(err) => Err(err),
    }
}

/// The error of a connect that timed out, worded; cold, and out of the
/// frame every connect runs in.
#[cold]
#[inline(never)]
fn timed_out(addr: SocketAddr, timeout: Duration) -> io::Error {
    let message = format!("connect to {addr} timed out after {timeout:?}");
    io::Error::new(ErrorKind::TimedOut, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::time::Instant;

    #[test]
    fn connect_sets_nodelay_and_reaches_the_listener() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = connect_one(l.local_addr().unwrap(), Duration::from_secs(5)).unwrap();
        assert!(stream.nodelay().unwrap());
        let (_accepted, peer) = l.accept().unwrap();
        assert_eq!(peer, stream.local_addr().unwrap());
    }

    #[test]
    fn connect_gives_up_at_the_timeout() {
        // A listener whose accept queue is full drops further SYNs, so a
        // connect to it hangs until the timeout (SO_SNDTIMEO) ends it.
        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let l = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        l.bind(&addr.into()).unwrap();
        l.listen(0).unwrap();
        let addr = l.local_addr().unwrap().as_socket().unwrap();
        let mut fillers = Vec::new();
        let started = Instant::now();
        let err = loop {
            match connect_one(addr, Duration::from_millis(200)) {
                Ok(stream) => fillers.push(stream),
                Err(err) => break err,
            }
            assert!(fillers.len() < 64, "the accept queue never filled");
        };
        assert_eq!(err.kind(), ErrorKind::TimedOut, "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn connect_any_tries_each_address_in_turn() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let live = l.local_addr().unwrap();
        // A port just closed refuses at once.
        let dead = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let stream = connect_any(&[dead, live], Duration::from_secs(5)).unwrap();
        assert_eq!(stream.peer_addr().unwrap(), live);
        let err = connect_any(&[dead], Duration::from_secs(5)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ConnectionRefused, "{err}");
        let err = connect_any(&[], Duration::from_secs(5)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
    }
}
