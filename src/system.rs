//! Process-wide settings taken from the operating system at start-up.
//!
//! Each connection costs the balancer two file descriptors (client and
//! backend), and the default soft limit is often 1024, which would cap the
//! balancer near 500 connections whatever `--workers` says. So `main` raises
//! the soft `RLIMIT_NOFILE` to the hard limit before accepting anything.
//! It runs once, on the main thread; the limit belongs to the process, so
//! it holds for every thread. [`is_out_of_descriptors`] tells the accept
//! loop and the workers when that limit is reached.
//!
//! The other helpers read an OS error for the rest of the balancer, on
//! whatever thread met it: [`is_local_failure`] tells a fault of this host
//! (no descriptor, memory, buffer or local port left) from a fault of the
//! peer, so that health checks blame a backend only for its own.
//!
//! # Corresponds to the C article
//!
//! No C counterpart; the C runs out of descriptors at the soft limit and
//! `exit()`s on the failed `accept`.

use std::io;

/// Raises the soft limit on open files to the hard limit; returns the new
/// soft limit.
///
/// # Errors
///
/// The `getrlimit`/`setrlimit` error.
pub fn raise_nofile_limit() -> io::Result<u64> {
    // SAFETY: rlimit is plain data, filled by getrlimit.
    unsafe {
        let mut limit: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return Err(io::Error::last_os_error());
        }
        if limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(limit.rlim_cur as u64)
    }
}

/// Whether `err` says this process (`EMFILE`) or the whole system
/// (`ENFILE`) has no file descriptor left: our own limit, which frees up as
/// connections end, not the fault of a client or a backend.
pub fn is_out_of_descriptors(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// Whether `err` is a fault of this host rather than of the peer: no file
/// descriptor ([`is_out_of_descriptors`]), no memory (`ENOMEM`) or socket
/// buffer (`ENOBUFS`) left, or no local port free for one more connection
/// (`EADDRNOTAVAIL` from `connect(2)`, when every ephemeral port is taken).
/// Such a failure says nothing about the backend: it passes when load goes
/// down, and blaming the backends for it would take every one of them out
/// of the rotation at once.
pub fn is_local_failure(err: &io::Error) -> bool {
    is_out_of_descriptors(err)
        || err.kind() == io::ErrorKind::OutOfMemory
        || matches!(
            err.raw_os_error(),
            Some(libc::ENOMEM | libc::ENOBUFS | libc::EADDRNOTAVAIL)
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(code: i32) -> io::Error {
        io::Error::from_raw_os_error(code)
    }

    #[test]
    fn local_failures_are_this_hosts_and_the_rest_the_peers() {
        for code in [
            libc::EMFILE,
            libc::ENFILE,
            libc::ENOMEM,
            libc::ENOBUFS,
            libc::EADDRNOTAVAIL,
        ] {
            assert!(is_local_failure(&os(code)), "{}", os(code));
        }
        assert!(is_local_failure(&io::Error::from(
            io::ErrorKind::OutOfMemory
        )));
        for code in [
            libc::ECONNREFUSED,
            libc::ETIMEDOUT,
            libc::EHOSTUNREACH,
            libc::ENETUNREACH,
            libc::ECONNRESET,
            libc::EPIPE,
        ] {
            assert!(!is_local_failure(&os(code)), "{}", os(code));
        }
        let timed_out = io::Error::new(io::ErrorKind::TimedOut, "connect timed out after 3s");
        assert!(!is_local_failure(&timed_out));
        assert!(is_out_of_descriptors(&os(libc::EMFILE)));
        assert!(!is_out_of_descriptors(&os(libc::ENOBUFS)));
    }
}
