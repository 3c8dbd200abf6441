//! The pump's one hook for `access_log_interval`: while a connection
//! lives, every interval its worker tells the bytes moved since the last
//! time (`Interim`) to whoever set the hook (the access log's interim
//! line, `proxy/report.rs`).
//!
//! The worker sets the hook for the connection it is about to pump
//! ([`set`]); the pump takes it when it starts, so a connection without it
//! pays one thread-local read. With it, the pump asks `Interim::due` at
//! each round (a coarse clock read) and cuts its waits at the next line's
//! time (`wait_for`): the silence allowed (`idle_timeout`) is still
//! counted whole, across the cuts.
//!
//! # Threads
//!
//! The worker thread that serves the connection; the hook is its own
//! (thread-local), never shared.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::cell::RefCell;
use std::io;

use super::wait::{wait, WaitFor};
use super::Transfer;
use crate::backend::coarse_now_ms;
use crate::proxy::conduit::Conduits;

/// Told the bytes moved since the last call, each way.
pub type Tell = Box<dyn FnMut(Transfer)>;

thread_local! {
    /// The hook set for the next connection this thread pumps. Boxed: a
    /// pointer in every worker's thread-locals (which sit at the top of
    /// its small stack) and in the pump's frame, not the whole hook.
    static NEXT: RefCell<Option<Box<Interim>>> = const { RefCell::new(None) };
}

/// Sets the hook for the next pump on this thread: `tell` every
/// `every_ms` (at least 1) from now while the connection lives.
pub fn set(every_ms: u64, tell: Tell) {
    let every_ms = every_ms.max(1);
    let interim = Interim {
        every_ms,
        next_ms: coarse_now_ms() + every_ms,
        told: Transfer::default(),
        tell,
    };
    NEXT.with(|next| *next.borrow_mut() = Some(Box::new(interim)));
}

/// Takes the hook set for this pump, if any (none is left for the next).
pub(super) fn take() -> Option<Box<Interim>> {
    NEXT.with(|next| next.borrow_mut().take())
}

/// Clears a hook no pump took (one that failed before its loop, or a TLS
/// connection's, whose pump has no interim lines); whether there was one.
pub fn take_unused() -> bool {
    take().is_some()
}

/// A connection's interim lines: when the next is due, and what was told.
pub(super) struct Interim {
    every_ms: u64,
    next_ms: u64,
    /// The bytes as of the last line.
    told: Transfer,
    tell: Tell,
}

impl Interim {
    /// Tells the bytes since the last line when one is due at `now_ms`.
    pub(super) fn due(&mut self, now_ms: u64, transfer: &Transfer) {
        if now_ms < self.next_ms {
            return;
        }
        let delta = Transfer {
            to_backend: transfer.to_backend - self.told.to_backend,
            to_client: transfer.to_client - self.told.to_client,
        };
        self.told = *transfer;
        // The next on the grid, never in the past: a worker that slept
        // over several intervals writes one line, not a burst.
        let behind = (now_ms - self.next_ms) / self.every_ms + 1;
        self.next_ms += behind * self.every_ms;
        (self.tell)(delta);
    }

    /// Milliseconds until the next line, at `now_ms`.
    fn left_ms(&self, now_ms: u64) -> i32 {
        i32::try_from(self.next_ms.saturating_sub(now_ms)).unwrap_or(i32::MAX)
    }
}

/// [`wait`], cut into pieces that end at each interim line's time (told
/// in between), for as long in all as `how.timeout_ms` of silence. Not
/// inlined: in the pump's frame its locals would be stack every idle
/// worker keeps (112 bytes once, a third page: docs/internals.md, "The
/// pool").
#[inline(never)]
pub(super) fn wait_for(
    fds: &mut [libc::pollfd; 2],
    conduits: &mut Conduits,
    how: WaitFor,
    interim: &mut Interim,
    transfer: &Transfer,
) -> io::Result<usize> {
    let start = coarse_now_ms();
    let silence = u64::try_from(how.timeout_ms.max(0)).unwrap_or(0);
    // The idle buffers are given back here, at a piece's edge, once the
    // whole wait has lasted `release_ms` (a piece alone may never).
    let release = u64::try_from(how.release_ms.max(0)).unwrap_or(0);
    let mut released = !how.idle || silence <= release;
    loop {
        let now = coarse_now_ms();
        let elapsed = now - start;
        if !released && elapsed >= release {
            conduits.release();
            released = true;
        }
        let mut piece = silence.saturating_sub(elapsed);
        if !released {
            piece = piece.min(release - elapsed);
        }
        let piece = i32::try_from(piece).unwrap_or(i32::MAX);
        let piece = piece.min(interim.left_ms(now).max(1));
        let ready = wait(
            fds,
            conduits,
            WaitFor {
                timeout_ms: piece,
                release_ms: i32::MAX,
                ..how
            },
        )?;
        let now = coarse_now_ms();
        interim.due(now, transfer);
        if ready > 0 || now - start >= silence {
            return Ok(ready);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    fn recording() -> (Interim, Arc<Mutex<Vec<Transfer>>>) {
        let told = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&told);
        let interim = Interim {
            every_ms: 100,
            next_ms: 1_100,
            told: Transfer::default(),
            tell: Box::new(move |t| sink.lock().unwrap().push(t)),
        };
        (interim, told)
    }

    fn moved(to_backend: u64, to_client: u64) -> Transfer {
        Transfer {
            to_backend,
            to_client,
        }
    }

    #[test]
    fn each_line_tells_the_bytes_since_the_last() {
        let (mut i, told) = recording();
        i.due(1_050, &moved(5, 5));
        i.due(1_100, &moved(10, 20));
        i.due(1_150, &moved(11, 21));
        i.due(1_200, &moved(15, 40));
        assert_eq!(*told.lock().unwrap(), [moved(10, 20), moved(5, 20)]);
    }

    #[test]
    fn a_late_worker_writes_one_line_and_keeps_the_grid() {
        let (mut i, told) = recording();
        i.due(1_750, &moved(1, 1));
        assert_eq!(told.lock().unwrap().len(), 1);
        assert_eq!(i.next_ms, 1_800);
        assert_eq!(i.left_ms(1_750), 50);
        i.due(1_799, &moved(2, 2));
        assert_eq!(told.lock().unwrap().len(), 1);
    }

    #[test]
    fn the_hook_is_for_one_pump_only() {
        set(0, Box::new(|_| {}));
        let taken = take().expect("set");
        assert_eq!(taken.every_ms, 1, "at least a millisecond");
        assert!(take().is_none());
    }
}
