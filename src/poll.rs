//! Waiting on sockets with `poll(2)`, written once: the pump waits on both
//! sockets of a connection, the worker and the PROXY header reader wait for
//! a client's first bytes until a deadline.
//!
//! A signal that interrupts a wait (`EINTR`) restarts it; a descriptor of
//! -1 is skipped by the kernel, so a caller can leave out a socket it has
//! nothing to wait for.
//!
//! # Threads
//!
//! Called on whatever thread waits (a worker, the accept loop); no state.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C blocks in `read()` and `recv()`.

use std::io;
use std::os::unix::io::RawFd;
use std::time::{Duration, Instant};

/// `poll(2)` on `fds` for at most `timeout_ms` (negative: no limit);
/// returns how many are ready (0 at the timeout). A signal restarts the
/// wait with the whole timeout.
///
/// # Errors
///
/// The error of `poll(2)` other than `EINTR`.
#[inline]
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<usize> {
    loop {
        // SAFETY: `fds` is a valid slice of pollfd for the whole call, and
        // the count passed is its length.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        if let Ok(ready) = usize::try_from(ready) {
            return Ok(ready);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// One `poll(2)` on `fds` for at most `timeout_ms`, which a signal ends
/// (`ErrorKind::Interrupted`): the pump's wait, which a hand-over to a new
/// process wakes with a signal (`connections::carry`).
///
/// # Errors
///
/// The error of `poll(2)`, `EINTR` included.
#[inline]
pub fn poll_once(fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<usize> {
    // SAFETY: as in `poll`.
    let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    usize::try_from(ready).map_err(|_| io::Error::last_os_error())
}

/// Waits until `fd` is readable (bytes, end of stream, a hang-up or an
/// error: the next read says which) or `deadline` passes; whether it became
/// readable. A deadline already past is looked at once, without waiting. A
/// signal restarts the wait with the time left.
///
/// # Errors
///
/// The error of `poll(2)` other than `EINTR`.
pub fn readable_by(fd: RawFd, deadline: Instant) -> io::Result<bool> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut fds = [libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        }];
        // One call at a time, so a signal recomputes the time left.
        match poll(&mut fds, millis_rounded_up(left)) {
            Ok(0) if Instant::now() >= deadline => return Ok(false),
            Ok(0) => continue,
            Ok(_) => return Ok(true),
            Err(e) => return Err(e),
        }
    }
}

/// A duration as `poll(2)`'s milliseconds, cut down to whole milliseconds
/// (and to `i32::MAX`).
pub fn millis(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX)
}

/// A duration as `poll(2)`'s milliseconds, rounded up, so a wait of 0.3 ms
/// does not become `poll(0)` and spin.
pub fn millis_rounded_up(d: Duration) -> i32 {
    i32::try_from(d.as_micros().div_ceil(1000)).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::io::AsRawFd;

    use crate::test_support::pair;

    #[test]
    fn a_silent_socket_is_not_readable_by_its_deadline() {
        let (_a, b) = pair();
        let start = Instant::now();
        let deadline = start + Duration::from_millis(30);
        assert!(!readable_by(b.as_raw_fd(), deadline).unwrap());
        assert!(Instant::now() >= deadline);
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn bytes_make_a_socket_readable_even_past_its_deadline() {
        let (mut a, b) = pair();
        a.write_all(b"x").unwrap();
        let later = Instant::now() + Duration::from_secs(5);
        assert!(readable_by(b.as_raw_fd(), later).unwrap());
        // Already past: looked at once, and the byte is there.
        assert!(readable_by(b.as_raw_fd(), Instant::now()).unwrap());
    }

    #[test]
    fn poll_skips_minus_one_and_times_out() {
        let mut fds = [libc::pollfd {
            fd: -1,
            events: libc::POLLIN,
            revents: 0,
        }];
        assert_eq!(poll(&mut fds, 1).unwrap(), 0);
    }

    #[test]
    fn millis_round_as_told() {
        let d = Duration::from_micros(300);
        assert_eq!((millis(d), millis_rounded_up(d)), (0, 1));
        assert_eq!(millis(Duration::from_secs(u64::MAX)), i32::MAX);
        assert_eq!(millis_rounded_up(Duration::from_secs(u64::MAX)), i32::MAX);
    }
}
