//! The rise/fall state machine that turns check results into up and down,
//! so one lost check does not flap a backend.
//!
//! No clock and no I/O: the checker thread feeds it one [`Verdict`] at a
//! time, and the tests feed it directly. Only the checker thread owns
//! probes. Whether a failed check was the backend's fault is decided where
//! the I/O happened ([`crate::health::check()`]); a check that failed because
//! of this host (no file descriptor left, say) is
//! [`Verdict::Inconclusive`], and the probe does not move.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C never checks a backend.

/// A change of state decided by a [`Probe`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// The backend is now down.
    Down,
    /// The backend is now up.
    Up,
}

/// What one check says about a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The backend answered as a healthy one does.
    Pass,
    /// The backend refused, did not answer, or answered wrong.
    Fail,
    /// The check could not be made for a reason of this host (no file
    /// descriptor, memory or local port left): it says nothing about the
    /// backend, so it counts neither toward `fall` nor toward `rise`, and
    /// does not break a streak either.
    Inconclusive,
}

/// The rise/fall state machine of one backend, fed one check result at a
/// time. No clock and no I/O: the thread feeds it, tests feed it directly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    fall: u32,
    rise: u32,
    up: bool,
    /// Results in a row that disagree with `up` (failures while up,
    /// successes while down).
    run: u32,
}

impl Probe {
    /// A probe that starts up (backends are trusted until shown otherwise).
    pub fn new(fall: u32, rise: u32) -> Probe {
        Probe {
            fall: fall.max(1),
            rise: rise.max(1),
            up: true,
            run: 0,
        }
    }

    /// Whether the probe thinks the backend is up.
    pub fn is_up(&self) -> bool {
        self.up
    }

    /// Feeds one check result; returns the transition it causes, if any.
    pub fn observe(&mut self, verdict: Verdict) -> Option<Transition> {
        let success = match verdict {
            Verdict::Pass => true,
            Verdict::Fail => false,
            Verdict::Inconclusive => return None,
        };
        if success == self.up {
            // The result agrees with the state: any streak is broken.
            self.run = 0;
            return None;
        }
        self.run += 1;
        let needed = if self.up { self.fall } else { self.rise };
        if self.run < needed {
            return None;
        }
        self.up = !self.up;
        self.run = 0;
        Some(if self.up {
            Transition::Up
        } else {
            Transition::Down
        })
    }

    /// Takes new thresholds (a reload, a backend's own `fall` and `rise`);
    /// a streak under way counts toward them.
    pub fn set_thresholds(&mut self, fall: u32, rise: u32) {
        self.fall = fall.max(1);
        self.rise = rise.max(1);
    }

    /// The streak against the state and how long it must grow to flip
    /// it: `(2, 3)` is two failures of the three that mark it down.
    pub fn progress(&self) -> (u32, u32) {
        (self.run, if self.up { self.fall } else { self.rise })
    }

    /// Aligns the probe with a state decided elsewhere (passive checks, an
    /// operator): a backend marked down needs `rise` successes from now on.
    pub fn sync(&mut self, up: bool) {
        if self.up != up {
            self.up = up;
            self.run = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Verdict::{Fail, Inconclusive, Pass};

    #[test]
    fn goes_down_after_fall_failures_in_a_row() {
        let mut p = Probe::new(3, 2);
        assert!(p.is_up());
        assert_eq!(p.observe(Fail), None);
        assert_eq!(p.observe(Fail), None);
        // One success breaks the streak: no flapping on a lost probe.
        assert_eq!(p.observe(Pass), None);
        assert_eq!(p.observe(Fail), None);
        assert_eq!(p.observe(Fail), None);
        assert_eq!(p.observe(Fail), Some(Transition::Down));
        assert!(!p.is_up());
        // Logged once: more failures change nothing.
        assert_eq!(p.observe(Fail), None);
        assert_eq!(p.observe(Fail), None);
    }

    #[test]
    fn comes_up_after_rise_successes_in_a_row() {
        let mut p = Probe::new(1, 2);
        assert_eq!(p.observe(Fail), Some(Transition::Down));
        assert_eq!(p.observe(Pass), None);
        assert_eq!(p.observe(Fail), None);
        assert_eq!(p.observe(Pass), None);
        assert_eq!(p.observe(Pass), Some(Transition::Up));
        assert_eq!(p.observe(Pass), None);
        assert!(p.is_up());
    }

    #[test]
    fn sync_with_a_passive_down_needs_rise_successes() {
        let mut p = Probe::new(3, 2);
        p.sync(false);
        assert!(!p.is_up());
        assert_eq!(p.observe(Pass), None);
        assert_eq!(p.observe(Pass), Some(Transition::Up));
        p.sync(true);
        assert_eq!(p.observe(Pass), None);
    }

    #[test]
    fn an_inconclusive_check_neither_counts_nor_breaks_a_streak() {
        let mut p = Probe::new(3, 2);
        assert_eq!(p.observe(Fail), None);
        assert_eq!(p.observe(Fail), None);
        // However many checks fail here (no descriptor left), the backend
        // stays up: they are not failures of the backend...
        for _ in 0..100 {
            assert_eq!(p.observe(Inconclusive), None);
        }
        assert!(p.is_up());
        // ...and they do not wipe out the two real failures before them.
        assert_eq!(p.observe(Fail), Some(Transition::Down));
        // Nor do they count toward rise, or break its streak.
        assert_eq!(p.observe(Pass), None);
        for _ in 0..100 {
            assert_eq!(p.observe(Inconclusive), None);
        }
        assert!(!p.is_up());
        assert_eq!(p.observe(Pass), Some(Transition::Up));
        // A fresh probe fed only inconclusive checks stays up.
        let mut fresh = Probe::new(1, 1);
        for _ in 0..100 {
            assert_eq!(fresh.observe(Inconclusive), None);
        }
        assert!(fresh.is_up());
    }
}
