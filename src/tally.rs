//! What a backend's stats page row and its metrics show beyond its basic
//! counters: the peak of its connections, its errors by kind, its total
//! time down and its health check's progress (`2/3` toward DOWN).
//!
//! One [`Tally`] lives in each [`crate::backend::Backend`]. Every value is
//! a relaxed atomic: a worker raises `resets` or `timeouts` once at the end
//! of a connection that ended so (nothing on a clean end), counts a failed
//! connect, and reads the peak once per connection (a store only when it
//! grows); the health thread (`mark_down`, `mark_up`) writes the progress
//! and the time down on its own, colder path; the admin API reads them.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C counts nothing.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// Milliseconds since the Unix epoch (0 if the clock is before it).
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A backend's peak, errors by kind, time down and check progress.
#[derive(Debug, Default)]
pub struct Tally {
    /// Connect failures on real traffic, ever (not only in a row).
    connect_failures: AtomicU64,
    /// The most connections it had at once.
    peak: AtomicUsize,
    /// Connections to it that ended by a reset (from either side).
    resets: AtomicU64,
    /// Connections to it closed by the idle or fin timeout.
    timeouts: AtomicU64,
    /// Connections to it closed when it was marked DOWN.
    killed_down: AtomicU64,
    /// Connections to it closed when it was removed.
    killed_removed: AtomicU64,
    /// When it last went down, ms since the Unix epoch; 0 while up.
    down_since_ms: AtomicU64,
    /// Time down before the current spell, in ms.
    downtime_ms: AtomicU64,
    /// The check's streak against its state, `run << 32 | needed`; 0
    /// before the first check.
    progress: AtomicU64,
}

/// How a served connection ended, as far as the tally tells errors apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A reset, from the client or the backend.
    Reset,
    /// The idle or fin timeout closed it.
    Timeout,
    /// Closed because the backend was marked DOWN (`on_backend_down`).
    KilledDown,
    /// Closed because the backend was removed (`on_backend_removed`).
    KilledRemoved,
}

impl Tally {
    /// Notes `now` connections at once, keeping the most. One load, and a
    /// store only when a new peak is reached.
    pub fn note_active(&self, now: usize) {
        if now > self.peak.load(Ordering::Relaxed) {
            self.peak.fetch_max(now, Ordering::Relaxed);
        }
    }

    /// The most connections at once.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed) as u64
    }

    /// Counts one failed connect.
    pub fn connect_failed(&self) {
        self.connect_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// Failed connects, ever.
    pub fn connect_failures(&self) -> u64 {
        self.connect_failures.load(Ordering::Relaxed)
    }

    /// Counts one connection that ended by `kind`.
    pub fn error(&self, kind: ErrorKind) {
        let counter = match kind {
            ErrorKind::Reset => &self.resets,
            ErrorKind::Timeout => &self.timeouts,
            ErrorKind::KilledDown => &self.killed_down,
            ErrorKind::KilledRemoved => &self.killed_removed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Connections ended by a reset.
    pub fn resets(&self) -> u64 {
        self.resets.load(Ordering::Relaxed)
    }

    /// Connections ended by a timeout.
    pub fn timeouts(&self) -> u64 {
        self.timeouts.load(Ordering::Relaxed)
    }

    /// Connections closed because it was marked DOWN.
    pub fn killed_down(&self) -> u64 {
        self.killed_down.load(Ordering::Relaxed)
    }

    /// Connections closed because it was removed.
    pub fn killed_removed(&self) -> u64 {
        self.killed_removed.load(Ordering::Relaxed)
    }

    /// The backend's health changed now: a spell down starts, or ends and
    /// is added to the total.
    pub fn health_changed(&self, healthy: bool) {
        self.health_changed_at(healthy, now_ms());
    }

    /// The backend's health changed at `now_ms` (ms since the epoch).
    pub fn health_changed_at(&self, healthy: bool, now_ms: u64) {
        if healthy {
            let since = self.down_since_ms.swap(0, Ordering::Relaxed);
            if since != 0 {
                self.downtime_ms
                    .fetch_add(now_ms.saturating_sub(since), Ordering::Relaxed);
            }
        } else {
            self.down_since_ms.store(now_ms.max(1), Ordering::Relaxed);
        }
    }

    /// Time down ever, the current spell included.
    pub fn downtime(&self) -> Duration {
        self.downtime_at(now_ms())
    }

    /// Time down ever, the current spell included, as of `now_ms`.
    pub fn downtime_at(&self, now_ms: u64) -> Duration {
        let since = self.down_since_ms.load(Ordering::Relaxed);
        let current = if since == 0 {
            0
        } else {
            now_ms.saturating_sub(since)
        };
        Duration::from_millis(self.downtime_ms.load(Ordering::Relaxed) + current)
    }

    /// Records the check's streak: `run` results in a row against the
    /// backend's state, of the `needed` that flip it.
    pub fn set_progress(&self, run: u32, needed: u32) {
        let packed = (u64::from(run) << 32) | u64::from(needed);
        self.progress.store(packed, Ordering::Relaxed);
    }

    /// `(run, needed)`, or `None` before the first check.
    pub fn progress(&self) -> Option<(u32, u32)> {
        let packed = self.progress.load(Ordering::Relaxed);
        (packed != 0).then_some(((packed >> 32) as u32, packed as u32))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peak_keeps_the_most() {
        let t = Tally::default();
        for n in [1, 3, 2, 0] {
            t.note_active(n);
        }
        assert_eq!(t.peak(), 3);
    }

    #[test]
    fn errors_are_counted_by_kind() {
        let t = Tally::default();
        t.error(ErrorKind::Reset);
        t.error(ErrorKind::Reset);
        t.error(ErrorKind::Timeout);
        t.connect_failed();
        assert_eq!((t.resets(), t.timeouts(), t.connect_failures()), (2, 1, 1));
    }

    #[test]
    fn downtime_adds_every_spell_and_the_current_one() {
        let t = Tally::default();
        assert_eq!(t.downtime_at(5_000), Duration::ZERO);
        t.health_changed_at(false, 1_000);
        t.health_changed_at(true, 3_000);
        assert_eq!(t.downtime_at(10_000), Duration::from_secs(2));
        t.health_changed_at(false, 10_000);
        assert_eq!(t.downtime_at(10_500), Duration::from_millis(2_500));
        // Up twice in a row adds nothing more.
        t.health_changed_at(true, 11_000);
        t.health_changed_at(true, 20_000);
        assert_eq!(t.downtime_at(30_000), Duration::from_secs(3));
    }

    #[test]
    fn progress_is_none_before_a_check() {
        let t = Tally::default();
        assert_eq!(t.progress(), None);
        t.set_progress(2, 3);
        assert_eq!(t.progress(), Some((2, 3)));
        t.set_progress(0, 3);
        assert_eq!(t.progress(), Some((0, 3)));
    }
}
