//! How the pump waits: what each socket is polled for, the `poll(2)` call,
//! and what its answer tells each direction.
//!
//! # Threads
//!
//! Runs on the worker thread that serves the connection; shares nothing.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C blocks in `read()` on one socket at a time.

use std::io;
use std::net::TcpStream;
use std::os::unix::io::AsRawFd;

use super::half::Half;
use crate::poll::poll_once as poll;
use crate::proxy::conduit::Conduits;

/// How [`wait`] waits.
pub(super) struct WaitFor {
    pub(super) timeout_ms: i32,
    pub(super) release_ms: i32,
    /// Nothing waits in either buffer (their pages may be given back).
    pub(super) idle: bool,
    /// `--yield-before-poll`, and bytes moved this round.
    pub(super) yield_first: bool,
}

/// Waits for one of `fds` to be ready, at most `timeout_ms`; returns how
/// many are (0 at the timeout). A signal ends the wait
/// (`ErrorKind::Interrupted`): the pump looks whether a hand-over asks
/// for its connection, and waits again.
pub(super) fn wait(
    fds: &mut [libc::pollfd; 2],
    conduits: &mut Conduits,
    how: WaitFor,
) -> io::Result<usize> {
    // --yield-before-poll: bytes just went out, so the other side is
    // probably about to answer (a backend's reply to the request just
    // forwarded, a client's next request after a reply). Let it run first,
    // then look without waiting: if the answer is there, the sleep in poll
    // and the wake-up that ends it (the scheduler's two most expensive
    // paths on this workload) are skipped.
    if how.yield_first {
        // SAFETY: no arguments; on Linux it always succeeds.
        unsafe { libc::sched_yield() };
        let ready = poll(fds, 0)?;
        if ready > 0 {
            return Ok(ready);
        }
    }
    // Nothing waits in either buffer: if the wait is long, give their pages
    // back after RELEASE_AFTER, then wait out the rest.
    if how.idle && how.timeout_ms > how.release_ms {
        match poll(fds, how.release_ms)? {
            0 => {
                conduits.release();
                poll(fds, how.timeout_ms - how.release_ms)
            }
            ready => Ok(ready),
        }
    } else {
        poll(fds, how.timeout_ms)
    }
}

/// A `pollfd` for `socket`. A socket with nothing to wait for gets fd -1,
/// which `poll(2)` skips: otherwise a hang-up on it (always reported, even
/// when not asked for) would wake every call at once and spin the CPU.
pub(super) fn watch(socket: &TcpStream, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd: if events == 0 { -1 } else { socket.as_raw_fd() },
        events,
        revents: 0,
    }
}

/// Poll events for a socket that is the source of `from` and the destination
/// of `to`.
pub(super) fn interest(from: &Half, to: &Half) -> libc::c_short {
    let mut events = 0;
    if from.wants_read() {
        events |= libc::POLLIN;
    }
    if to.pending() {
        events |= libc::POLLOUT;
    }
    events
}

/// Marks ready what `poll` reported on `fds` (the client's, then the
/// backend's). Errors and hang-ups count as "ready": the next read or
/// write reports them (or the end of stream) precisely.
#[inline]
pub(super) fn learn(fds: &[libc::pollfd; 2], up: &mut Half, down: &mut Half) {
    const ANY: libc::c_short = libc::POLLERR | libc::POLLHUP;
    if fds[0].revents & (libc::POLLIN | ANY) != 0 {
        up.readable = true;
    }
    if fds[0].revents & (libc::POLLOUT | ANY) != 0 {
        down.writable = true;
    }
    if fds[1].revents & (libc::POLLIN | ANY) != 0 {
        down.readable = true;
    }
    if fds[1].revents & (libc::POLLOUT | ANY) != 0 {
        up.writable = true;
    }
}
