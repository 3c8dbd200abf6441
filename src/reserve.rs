//! File descriptors kept aside: a few held open on `/dev/null`, so that
//! when the process has reached its open-files limit one can be closed
//! and its place taken at once by the socket that needed it.
//!
//! Two reserves exist. The admin API keeps its own (four), so that it
//! still answers when the process is out of descriptors. The workers share
//! the process's: the accept loops fill every descriptor the limit allows
//! with clients, and a worker that then takes a client from the queue finds
//! none left for its backend socket; if every worker is in that state, no
//! connection is open to end and give one back, and they all wait until
//! their connect timeout closes the client. With the reserve, such a worker
//! closes one held descriptor and opens its socket in its place
//! (`proxy/connect.rs`), and an accept loop takes a client only once the
//! reserve is whole again ([`Reserve::refill`], `listener.rs`): the
//! descriptors a connection frees when it ends go back to the reserve
//! first. docs/operations.md, "Out of file descriptors", tells the whole.
//!
//! # Threads
//!
//! A reserve is shared: one lock guards the held files; whether it is
//! whole is an atomic, so the accept loop's check costs one load while
//! nothing is missing.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C `exit()`s on the first `accept` past the limit.

use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::system;

/// What the held descriptors are opened on.
const HELD_ON: &str = "/dev/null";

/// The most descriptors the workers' reserve holds, however many workers
/// there are: each lets one more worker reach its backend at the limit,
/// and past a few dozen the process is short of descriptors for clients
/// anyway (the preflight says so at start-up).
pub const MOST_FOR_WORKERS: usize = 64;

/// Descriptors held open so that one can be given back when none is left.
pub struct Reserve {
    files: Mutex<Vec<File>>,
    /// How many it holds; equal to `files.len()` whenever the lock is free.
    held: AtomicUsize,
    /// How many it holds when whole: lowered for good to what it holds
    /// when [`HELD_ON`] cannot be opened for another reason than a
    /// shortage of descriptors.
    want: AtomicUsize,
}

impl Reserve {
    /// A reserve of `want` descriptors, as many of them opened now as the
    /// limit allows.
    pub fn new(want: usize) -> Reserve {
        Reserve::on(Path::new(HELD_ON), want)
    }

    /// A reserve of `want` descriptors opened on `path`.
    fn on(path: &Path, want: usize) -> Reserve {
        let reserve = Reserve {
            files: Mutex::new(Vec::with_capacity(want)),
            held: AtomicUsize::new(0),
            want: AtomicUsize::new(want),
        };
        reserve.refill_from(path);
        reserve
    }

    /// The workers' reserve for a pool of `workers`: one per worker, at
    /// most [`MOST_FOR_WORKERS`], and at most a quarter of the descriptors
    /// the limit leaves free now, so that a low limit still leaves most of
    /// them to clients.
    pub fn for_workers(workers: usize) -> Reserve {
        Reserve::new(workers.min(MOST_FOR_WORKERS).min(free_descriptors() / 4))
    }

    /// Opens descriptors again up to the number wanted, as far as the
    /// limit allows now; whether the reserve is whole. One atomic load
    /// when it already is.
    pub fn refill(&self) -> bool {
        self.refill_from(Path::new(HELD_ON))
    }

    /// [`Reserve::refill`] with descriptors opened on `path`. A failure
    /// that is not a shortage of descriptors (no `/dev/null` in a bare
    /// container) would hold the accept loops off for ever: the reserve
    /// then does without the rest, and says so once.
    fn refill_from(&self, path: &Path) -> bool {
        if self.held.load(Ordering::Acquire) >= self.want.load(Ordering::Relaxed) {
            return true;
        }
        let mut files = self.files.lock();
        while files.len() < self.want.load(Ordering::Relaxed) {
            match File::open(path) {
                Ok(file) => files.push(file),
                Err(e) if system::is_out_of_descriptors(&e) => break,
                Err(e) => {
                    log::warn!(
                        "cannot open {}: {e}; {} descriptors kept aside instead of {}",
                        path.display(),
                        files.len(),
                        self.want.load(Ordering::Relaxed)
                    );
                    self.want.store(files.len(), Ordering::Relaxed);
                }
            }
        }
        self.held.store(files.len(), Ordering::Release);
        files.len() >= self.want.load(Ordering::Relaxed)
    }

    /// Closes one held descriptor, for the caller to open what it needs in
    /// its place; false when none is left.
    pub fn release(&self) -> bool {
        let mut files = self.files.lock();
        let released = files.pop().is_some();
        self.held.store(files.len(), Ordering::Release);
        released
    }
}

/// Descriptors the soft `RLIMIT_NOFILE` leaves this process now (0 when
/// either the limit or the open descriptors cannot be read).
fn free_descriptors() -> usize {
    let free = match (system::nofile_limit(), system::open_descriptors()) {
        (Some(limit), Some(open)) => limit.saturating_sub(open),
        _ => 0,
    };
    usize::try_from(free).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_gives_back_and_refills() {
        let reserve = Reserve::new(2);
        assert_eq!(reserve.held.load(Ordering::Acquire), 2);
        assert!(reserve.release());
        assert_eq!(reserve.held.load(Ordering::Acquire), 1);
        assert!(reserve.refill());
        assert!(reserve.release());
        assert!(reserve.release());
        assert!(!reserve.release());
        assert_eq!(reserve.held.load(Ordering::Acquire), 0);
        assert!(reserve.refill());
        assert_eq!(reserve.held.load(Ordering::Acquire), 2);
        assert_eq!(reserve.files.lock().len(), 2);
    }

    #[test]
    fn an_empty_reserve_is_always_whole() {
        let reserve = Reserve::new(0);
        assert!(reserve.refill());
        assert!(!reserve.release());
    }

    #[test]
    fn a_reserve_that_cannot_open_its_file_does_without() {
        let reserve = Reserve::on(Path::new("/nonexistent/rodizio-reserve"), 3);
        assert_eq!(reserve.want.load(Ordering::Relaxed), 0);
        assert!(reserve.refill_from(Path::new("/nonexistent/rodizio-reserve")));
        assert!(!reserve.release());
    }

    #[test]
    fn the_workers_reserve_is_bounded_by_the_workers_and_the_cap() {
        assert_eq!(Reserve::for_workers(3).want.load(Ordering::Relaxed), 3);
        assert_eq!(
            Reserve::for_workers(100_000).want.load(Ordering::Relaxed),
            MOST_FOR_WORKERS
        );
    }
}
