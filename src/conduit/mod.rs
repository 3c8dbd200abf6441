//! The conduits: where one direction's bytes wait between the read and the
//! write: a buffer in user memory (the article's way), or a pipe for
//! `splice(2)`.
//!
//! Both belong to the worker thread, not the connection: they are made once
//! per thread and reused by every connection it serves, so nothing is
//! allocated or zeroed per connection. Only the pump of that thread touches
//! them, so nothing here is shared or locked.
//!
//! # Threads
//!
//! Each worker thread has its own (thread-locals); nothing is shared.
//!
//! # Corresponds to the C article
//!
//! The C's `char buffer[_BUFFER_SIZE]` on the stack of each thread, used for
//! one read of the request and the copy of the reply.
//!
//! # Parts
//!
//! - this file: the buffers (`Buffers`) and pipes, and the thread-locals
//!   that keep them;
//! - `outcome`: what a pump is told ([`PumpOptions`](outcome::PumpOptions))
//!   and tells back ([`Pumped`](outcome::Pumped): the
//!   [`Transfer`](outcome::Transfer) and the [`End`](outcome::End));
//! - `reset`: a peer's reset passed on to the other peer as a reset, for
//!   every pump (copy, splice, TLS);
//! - `stack`: the stack pages touched below a pump (a TLS handshake, the
//!   backend connect) handed back to the kernel.

use std::cell::RefCell;
use std::io;
use std::net::TcpStream;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::io::{AsRawFd, RawFd};
use std::ptr::NonNull;
use std::time::Duration;

pub mod outcome;
pub mod reset;
pub(crate) mod stack;

/// The conduits of one pump, one per direction, as the thread keeps them.
pub(crate) enum Conduits<'a> {
    Buffers(&'a mut Buffers),
    Pipes(&'a [Pipe; 2]),
}

impl Conduits<'_> {
    /// Client-to-backend and backend-to-client.
    pub(crate) fn halves(&mut self) -> (Conduit<'_>, Conduit<'_>) {
        match self {
            Conduits::Buffers(b) => {
                let (up, down) = b.halves();
                (Conduit::Buffer(up), Conduit::Buffer(down))
            }
            Conduits::Pipes([up, down]) => (Conduit::Pipe(up), Conduit::Pipe(down)),
        }
    }

    /// Gives memory back while the connection is idle. A drained pipe holds
    /// no pages, so only buffers have anything to give.
    pub(crate) fn release(&mut self) {
        if let Conduits::Buffers(b) = self {
            b.release();
        }
        // And the stack pages the connect touched below the pump.
        stack::trim_idle();
    }
}

/// One direction's conduit: where its bytes wait between the read and
/// the write.
pub(crate) enum Conduit<'a> {
    /// User memory: `recv` copies into it and `send` copies out of it.
    Buffer(&'a mut [u8]),
    /// A pipe: `splice` moves socket pages in and out, no copy.
    Pipe(&'a Pipe),
}

impl Conduit<'_> {
    /// The most one read can take.
    pub(crate) fn capacity(&self) -> usize {
        match self {
            Conduit::Buffer(buf) => buf.len(),
            Conduit::Pipe(pipe) => pipe.capacity,
        }
    }

    /// Reads at most `max` bytes (at most its capacity) from `src` into
    /// the (empty) buffer or pipe.
    pub(crate) fn fill(&mut self, src: &TcpStream, max: usize) -> io::Result<usize> {
        match self {
            Conduit::Buffer(buf) => {
                let n = max.min(buf.len());
                recv(src, &mut buf[..n])
            }
            Conduit::Pipe(pipe) => splice(
                src.as_raw_fd(),
                pipe.write.as_raw_fd(),
                max.min(pipe.capacity),
                0,
            ),
        }
    }

    /// Writes the bytes `start..end` of what `fill` read on to `dst`.
    /// `more`: more bytes will follow at once (`MSG_MORE`).
    pub(crate) fn drain(
        &mut self,
        dst: &TcpStream,
        start: usize,
        end: usize,
        more: bool,
    ) -> io::Result<usize> {
        match self {
            Conduit::Buffer(buf) => send(dst, &buf[start..end], more),
            // The pipe holds exactly the bytes not yet written, in order.
            Conduit::Pipe(pipe) => {
                let more = if more { libc::SPLICE_F_MORE } else { 0 };
                splice(pipe.read.as_raw_fd(), dst.as_raw_fd(), end - start, more)
            }
        }
    }
}

/// A non-blocking pipe used by [`splice_pump`] for one direction.
pub(crate) struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    /// Bytes it holds at most (`F_GETPIPE_SZ`, 64 KiB by default).
    capacity: usize,
}

impl Pipe {
    pub(crate) fn new() -> io::Result<Pipe> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` is a valid array of two ints for the call.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded, so both are open descriptors owned by no
        // one else; OwnedFd closes each exactly once.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: F_GETPIPE_SZ on a pipe we own; no pointer involved.
        let size = unsafe { libc::fcntl(write.as_raw_fd(), libc::F_GETPIPE_SZ) };
        let capacity = usize::try_from(size).unwrap_or(0).max(4096);
        Ok(Pipe {
            read,
            write,
            capacity,
        })
    }
}

/// One `splice(2)` of at most `len` bytes from `from` to `to`, one of which
/// is a pipe; never blocks on the pipe (the sockets are non-blocking).
fn splice(from: RawFd, to: RawFd, len: usize, flags: libc::c_uint) -> io::Result<usize> {
    // SAFETY: plain descriptors and null offsets (both are streams).
    let n = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK | flags,
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// How long a connection may sit with both buffers empty before their
/// pages are given back to the kernel. Long enough that a busy connection
/// (or a keep-alive client between requests) never pays for it, short
/// enough that a thousand idle connections cost no buffer memory.
pub(crate) const RELEASE_AFTER: Duration = Duration::from_millis(500);

thread_local! {
    /// This thread's pump buffers, kept for every connection it serves so
    /// none is allocated (and zeroed) per connection.
    pub(crate) static BUFFERS: RefCell<Option<Buffers>> = const { RefCell::new(None) };
    /// This thread's pipes for `--splice`, one per direction.
    pub(crate) static PIPES: RefCell<Option<[Pipe; 2]>> = const { RefCell::new(None) };
}

/// The two buffers of the pump (one per direction) in one anonymous,
/// private mapping of their own.
///
/// Why a mapping and not a `Vec`: its pages are whole, so `madvise(2)` with
/// `MADV_DONTNEED` can hand them back to the kernel while a connection is
/// idle ([`Buffers::release`]), taking them out of the resident set; the
/// next read finds fresh zeroed pages. A thread that never reads never
/// touches them, so they cost no memory at all until used.
pub(crate) struct Buffers {
    ptr: NonNull<u8>,
    /// Bytes mapped: `2 * size` rounded up to whole pages.
    len: usize,
    /// Bytes per direction.
    pub(crate) size: usize,
}

impl Buffers {
    pub(crate) fn new(size: usize) -> io::Result<Buffers> {
        let size = size.max(1);
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let len = (2 * size).div_ceil(page) * page;
        // SAFETY: a new anonymous private mapping; no existing memory is
        // touched. The result is checked against MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast()).ok_or_else(io::Error::last_os_error)?;
        Ok(Buffers { ptr, len, size })
    }

    /// The client-to-backend and backend-to-client buffers.
    pub(crate) fn halves(&mut self) -> (&mut [u8], &mut [u8]) {
        // SAFETY: the mapping is `len >= 2 * size` bytes, readable and
        // writable, owned by `self` and borrowed mutably for the slices'
        // lifetime, so nothing else reads or writes it meanwhile.
        let all = unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), 2 * self.size) };
        all.split_at_mut(self.size)
    }

    /// Hands the pages back to the kernel; their content (nothing pending,
    /// by the caller's check) reads as zeros from now on.
    pub(crate) fn release(&mut self) {
        // SAFETY: the range is exactly our own mapping, and no slice into it
        // is alive (`&mut self`). An error only means the pages stay.
        unsafe {
            libc::madvise(self.ptr.as_ptr().cast(), self.len, libc::MADV_DONTNEED);
        }
    }
}

impl Drop for Buffers {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`, once.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// `recv(2)` that never blocks (`MSG_DONTWAIT`), whatever the socket's mode:
/// no `fcntl`/`ioctl` is needed to make the sockets non-blocking first.
fn recv(socket: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the call.
    let n = unsafe {
        libc::recv(
            socket.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// `send(2)` that never blocks, and never raises `SIGPIPE` on a closed peer
/// (`EPIPE` is returned instead).
fn send(socket: &TcpStream, buf: &[u8], more: bool) -> io::Result<usize> {
    let more = if more { libc::MSG_MORE } else { 0 };
    // SAFETY: `buf` is valid for reads of `buf.len()` bytes for the call.
    let n = unsafe {
        libc::send(
            socket.as_raw_fd(),
            buf.as_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL | more,
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_buffers_read_as_zeros_and_stay_usable() {
        let mut b = Buffers::new(5000).unwrap();
        assert!(b.len >= 10000 && b.len % 4096 == 0);
        let (up, down) = b.halves();
        assert_eq!((up.len(), down.len()), (5000, 5000));
        up.fill(7);
        down.fill(9);
        b.release();
        let (up, down) = b.halves();
        assert!(up.iter().chain(down.iter()).all(|&x| x == 0));
        up[4999] = 1;
        down[0] = 2;
        assert_eq!((up[4999], down[0]), (1, 2));
    }
}
