//! Process-wide settings taken from the operating system at start-up.
//!
//! Each connection costs the balancer two file descriptors (client and
//! backend), and the default soft limit is often 1024, which would cap the
//! balancer near 500 connections whatever `--workers` says. So `main` raises
//! the soft `RLIMIT_NOFILE` to the hard limit before accepting anything.
//! It runs once, on the main thread; the limit belongs to the process, so
//! it holds for every thread. [`is_out_of_descriptors`] tells the accept
//! loop and the workers when that limit is reached; [`nofile_limit`] and
//! [`open_descriptors`] read the limit and the count, for the `process_*`
//! metrics and for sizing the descriptors kept aside (`reserve.rs`).
//!
//! The other helpers read an OS error for the rest of the balancer, on
//! whatever thread met it: [`is_local_failure`] tells a fault of this host
//! (no descriptor, memory, buffer or local port left) from a fault of the
//! peer, so that health checks blame a backend only for its own;
//! [`error_words`] names an error in a word or two for the access log;
//! [`read_bounded`] reads a file an operator names (the config file, a
//! certificate, a CRL, the admin token) without blocking on a FIFO or
//! growing without bound on a device ([`crate::files::read`] decides
//! whether it runs here or in the root reader).
//!
//! # Corresponds to the C article
//!
//! No C counterpart; the C `exit()`s on the first `accept` past the limit.

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

/// The soft open-files limit (`RLIMIT_NOFILE`) as it is now; `None` when
/// it cannot be read.
pub fn nofile_limit() -> Option<u64> {
    // SAFETY: rlimit is plain data, filled by getrlimit.
    let limit = unsafe {
        let mut limit: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return None;
        }
        limit
    };
    Some(limit.rlim_cur)
}

/// How many descriptors this process has open now (`/proc/self/fd`);
/// `None` when that cannot be listed.
pub fn open_descriptors() -> Option<u64> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count() as u64)
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

/// A connect or transfer error in a word or two, for the access log's
/// `reason`: `refused`, `timeout`, `unreachable`, `reset`, `out of file
/// descriptors`, `no local port free`, or else the system's own words
/// (`protocol error`), without the `(os error N)` tail.
pub fn error_words(err: &io::Error) -> String {
    let words = match err.raw_os_error() {
        Some(libc::ECONNREFUSED) => "refused",
        Some(libc::ETIMEDOUT | libc::EINPROGRESS) => "timeout",
        Some(libc::EHOSTUNREACH | libc::ENETUNREACH | libc::EHOSTDOWN | libc::ENETDOWN) => {
            "unreachable"
        }
        Some(libc::ECONNRESET) => "reset",
        Some(libc::EPIPE) => "broken pipe",
        Some(libc::EMFILE | libc::ENFILE) => "out of file descriptors",
        Some(libc::EADDRNOTAVAIL) => "no local port free",
        Some(libc::ENOMEM | libc::ENOBUFS) => "out of memory",
        Some(_) => "",
        None => match err.kind() {
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => "timeout",
            io::ErrorKind::ConnectionRefused => "refused",
            io::ErrorKind::ConnectionReset => "reset",
            _ => "",
        },
    };
    if !words.is_empty() {
        return words.to_string();
    }
    // The system's message ("Protocol error (os error 71)"), lower case and
    // without the number, which means nothing to an operator.
    let text = err.to_string();
    let text = match text.rfind(" (os error ") {
        Some(at) if text.ends_with(')') => &text[..at],
        _ => &text,
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => "error".to_string(),
    }
}

/// Why [`read_bounded`] read nothing.
#[derive(Debug)]
pub enum FileError {
    /// The system refused (no such file, no permission, ...).
    Io(io::Error),
    /// A directory.
    Directory,
    /// Not a regular file: a FIFO would block the read until a writer
    /// comes, a device such as `/dev/zero` never ends.
    NotRegular,
    /// Larger than the bound given.
    TooLarge,
}

/// The bytes of the regular file `path`, at most `max` of them (never
/// more into memory); anything else is a [`FileError`]. The type is
/// checked before the file is opened, since opening a FIFO for reading
/// blocks until a writer comes.
///
/// # Errors
///
/// The [`FileError`] that says why.
pub fn read_bounded(path: &std::path::Path, max: u64) -> Result<Vec<u8>, FileError> {
    use std::io::Read;
    let meta = std::fs::metadata(path).map_err(FileError::Io)?;
    if meta.is_dir() {
        return Err(FileError::Directory);
    }
    if !meta.is_file() {
        return Err(FileError::NotRegular);
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(max + 1).read_to_end(&mut bytes))
        .map_err(FileError::Io)?;
    if bytes.len() as u64 > max {
        return Err(FileError::TooLarge);
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    /// A FIFO is refused without blocking, `/dev/zero` without reading
    /// it, a directory as such, a file past the bound as too large.
    #[test]
    fn only_regular_files_within_the_bound_are_read() {
        let dir = std::env::temp_dir().join(format!("rodizio-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        let path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
        assert!(matches!(
            read_bounded(&fifo, 10),
            Err(FileError::NotRegular)
        ));
        let zero = std::path::Path::new("/dev/zero");
        assert!(matches!(read_bounded(zero, 10), Err(FileError::NotRegular)));
        assert!(matches!(read_bounded(&dir, 10), Err(FileError::Directory)));
        let file = dir.join("eleven");
        std::fs::write(&file, b"eleven byte").unwrap();
        assert!(matches!(read_bounded(&file, 10), Err(FileError::TooLarge)));
        assert_eq!(read_bounded(&file, 11).unwrap(), b"eleven byte");
        let missing = dir.join("missing");
        assert!(matches!(read_bounded(&missing, 10), Err(FileError::Io(_))));
        std::fs::remove_dir_all(&dir).unwrap();
    }

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

    #[test]
    fn errors_in_an_operators_words() {
        assert_eq!(error_words(&os(libc::ECONNREFUSED)), "refused");
        assert_eq!(error_words(&os(libc::EHOSTUNREACH)), "unreachable");
        assert_eq!(error_words(&os(libc::EMFILE)), "out of file descriptors");
        let timed_out = io::Error::new(io::ErrorKind::TimedOut, "connect timed out after 3s");
        assert_eq!(error_words(&timed_out), "timeout");
        // Anything else: the system's words, without the number.
        assert_eq!(error_words(&os(libc::EPROTO)), "protocol error");
        let custom = io::Error::other("Backend has no address");
        assert_eq!(error_words(&custom), "backend has no address");
    }
}
