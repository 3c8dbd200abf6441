//! The worker's side of `--send-proxy` (and `-b HOST:PORT,send-proxy[-v2]`):
//! writing the header a backend takes on its fresh connection, before any
//! client byte.
//!
//! # Threads
//!
//! Runs on the worker that connected to the backend. No C counterpart: the
//! C's `proxy_function()` sends the client's bytes only.

use std::io::{self, Write};
use std::net::TcpStream;

use super::{encode, Header, Version};

/// Writes the PROXY protocol header a backend takes (`version`, its
/// [`send_proxy`](crate::backend::Backend::send_proxy)), if any, on its fresh
/// connection: before any client byte. The header is at most a few hundred
/// bytes into an empty send buffer, so the write does not wait; the
/// connect's write timeout (`SO_SNDTIMEO`) still bounds it.
///
/// Not inlined: the header and its bytes would otherwise sit in the frame
/// of every backend connect, under the `connect(2)`.
///
/// # Errors
///
/// The write's error.
#[inline(never)]
pub(crate) fn send(
    version: Option<Version>,
    mut stream: &TcpStream,
    header: impl FnOnce() -> io::Result<Header>,
) -> io::Result<()> {
    let Some(version) = version else {
        return Ok(());
    };
    let bytes = encode(version, &header()?);
    stream.write_all(&bytes)
}
