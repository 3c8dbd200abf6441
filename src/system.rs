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
