//! One connect attempt to one address, the system calls of
//! [`Backend::connect`](super::Backend::connect); kept apart so the
//! backend's file reads as its state.
//!
//! Runs on a worker thread, on its small stack: no allocation unless the
//! connect fails.
//!
//! # Corresponds to the C article
//!
//! The `socket()` and `connect()` calls of `get_final_server_socket()`.

use std::io::{self, ErrorKind};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};

/// One connect attempt to one address: see [`Backend::connect`].
pub(super) fn connect_one(addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
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
