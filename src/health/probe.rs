//! The rise/fall state machine that turns check results into up and down,
//! so one lost check does not flap a backend.
//!
//! No clock and no I/O: the checker thread feeds it one result at a time,
//! and the tests feed it directly. Only the checker thread owns probes.
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
    pub fn observe(&mut self, success: bool) -> Option<Transition> {
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

    #[test]
    fn goes_down_after_fall_failures_in_a_row() {
        let mut p = Probe::new(3, 2);
        assert!(p.is_up());
        assert_eq!(p.observe(false), None);
        assert_eq!(p.observe(false), None);
        // One success breaks the streak: no flapping on a lost probe.
        assert_eq!(p.observe(true), None);
        assert_eq!(p.observe(false), None);
        assert_eq!(p.observe(false), None);
        assert_eq!(p.observe(false), Some(Transition::Down));
        assert!(!p.is_up());
        // Logged once: more failures change nothing.
        assert_eq!(p.observe(false), None);
        assert_eq!(p.observe(false), None);
    }

    #[test]
    fn comes_up_after_rise_successes_in_a_row() {
        let mut p = Probe::new(1, 2);
        assert_eq!(p.observe(false), Some(Transition::Down));
        assert_eq!(p.observe(true), None);
        assert_eq!(p.observe(false), None);
        assert_eq!(p.observe(true), None);
        assert_eq!(p.observe(true), Some(Transition::Up));
        assert_eq!(p.observe(true), None);
        assert!(p.is_up());
    }

    #[test]
    fn sync_with_a_passive_down_needs_rise_successes() {
        let mut p = Probe::new(3, 2);
        p.sync(false);
        assert!(!p.is_up());
        assert_eq!(p.observe(true), None);
        assert_eq!(p.observe(true), Some(Transition::Up));
        p.sync(true);
        assert_eq!(p.observe(true), None);
    }
}
