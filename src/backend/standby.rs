//! A backend's standing beyond up and down: whether it is a backup (served
//! only while no primary is available), and when it last came back, from
//! which slow start ramps its share up (see docs/scheduling.md, "Backups
//! and slow start").
//!
//! Both are atomics. The backup flag is set when the backend is made, or
//! by a reload (which then rebuilds the scheduler's snapshot); the time it
//! came back is written by the thread that flips it (the health thread, a
//! worker, the admin API, a reload). The accept loop reads neither per
//! pick: the snapshot holds the rotation, and the time only while a slow
//! start is under way.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C's servers are all alike and never leave.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::Backend;
use crate::error::{Error, Result};

/// A full share: a ramp's share of its weight counts in 1024ths.
pub const RAMP_FULL: u32 = 1024;

/// The share a ramp starts from: about 5% of the weight (HAProxy's
/// slow start starts near 5% too), so a backend just back gets a trickle
/// at once rather than nothing.
const RAMP_FLOOR: u32 = RAMP_FULL / 20;

/// What a backend holds for backups and slow start.
#[derive(Debug, Default)]
pub(super) struct Standby {
    /// A backup: taken only when no primary is available.
    backup: AtomicBool,
    /// When it last came back into rotation, in ms of [`coarse_now_ms`];
    /// 0 when it has not since it was made at start-up (HAProxy does not
    /// slow-start servers at start-up either: they are all cold alike).
    back_at_ms: AtomicU64,
}

impl Standby {
    /// Records that the backend came back into rotation now.
    pub(super) fn came_back(&self) {
        // At least 1: 0 means "never" (the clock counts from boot, so it
        // is far above 0 anyway).
        self.back_at_ms
            .store(coarse_now_ms().max(1), Ordering::Relaxed);
    }
}

impl Backend {
    /// The same backend, a backup (`true`) or a primary.
    pub fn with_backup(self, backup: bool) -> Backend {
        self.standby.backup.store(backup, Ordering::Relaxed);
        self
    }

    /// Whether it is a backup, served only while no primary is available.
    pub fn is_backup(&self) -> bool {
        self.standby.backup.load(Ordering::Relaxed)
    }

    /// Makes it a backup (`true`) or a primary. The scheduler builds its
    /// rotation from this: call
    /// [`crate::scheduler::Scheduler::set_backup`] instead.
    pub(crate) fn set_backup(&self, backup: bool) {
        self.standby.backup.store(backup, Ordering::Relaxed);
    }

    /// Counts it as come back now, so that slow start ramps it: the
    /// scheduler calls this for a backend added at run time.
    pub(crate) fn start_ramp(&self) {
        self.standby.came_back();
    }

    /// When its ramp over `over_ms` ends, on the [`coarse_now_ms`] clock,
    /// or `None` if it came back longer ago than that (or never).
    pub(crate) fn ramp_end_ms(&self, over_ms: u64, now_ms: u64) -> Option<u64> {
        let back = self.standby.back_at_ms.load(Ordering::Relaxed);
        let end = back.checked_add(over_ms)?;
        (back != 0 && end > now_ms).then_some(end)
    }

    /// Its share of its weight at `now_ms` under a slow start of `over_ms`,
    /// in 1024ths: from about 5% when it came back, growing in a straight
    /// line to [`RAMP_FULL`] at `over_ms` after. Never 0, never above full,
    /// whatever the clock says (a time before it came back counts as the
    /// start).
    pub fn ramp_share(&self, over_ms: u64, now_ms: u64) -> u32 {
        let back = self.standby.back_at_ms.load(Ordering::Relaxed);
        if back == 0 || over_ms == 0 {
            return RAMP_FULL;
        }
        let elapsed = now_ms.saturating_sub(back);
        if elapsed >= over_ms {
            return RAMP_FULL;
        }
        // elapsed < over_ms, so the quotient is below RAMP_FULL; u128 so
        // that no duration overflows the product.
        let share = u128::from(elapsed) * u128::from(RAMP_FULL) / u128::from(over_ms);
        (share as u32).max(RAMP_FLOOR)
    }
}

/// Milliseconds of the coarse monotonic clock (`CLOCK_MONOTONIC_COARSE`:
/// read from memory the kernel updates every tick, a few milliseconds
/// apart, without a system call). Read per pick only while a slow start
/// is under way.
pub fn coarse_now_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the call only writes it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64) * 1000 + (ts.tv_nsec as u64) / 1_000_000
}

/// Reads `option` of the backend `text` if it is `backup`: sets `backup`
/// and returns true; false for any other option.
///
/// # Errors
///
/// [`Error::InvalidBackend`] for `backup` given twice or with a value.
pub(super) fn backup_option(text: &str, option: &str, backup: &mut bool) -> Result<bool> {
    let option = option.trim();
    if option.split('=').next().map(str::trim) != Some("backup") {
        return Ok(false);
    }
    if option != "backup" {
        return Err(Error::InvalidBackend(format!(
            "'{text}': backup takes no value (write ,backup)"
        )));
    }
    if *backup {
        return Err(Error::InvalidBackend(format!(
            "'{text}': backup is given twice"
        )));
    }
    *backup = true;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::BackendSpec;

    #[test]
    fn a_backend_made_at_start_up_does_not_ramp() {
        let b = Backend::new("b".into(), vec![], 1);
        assert_eq!(b.ramp_share(4000, coarse_now_ms()), RAMP_FULL);
        assert_eq!(b.ramp_end_ms(4000, coarse_now_ms()), None);
    }

    #[test]
    fn the_share_grows_from_the_floor_to_full() {
        let b = Backend::new("b".into(), vec![], 1);
        b.standby.back_at_ms.store(10_000, Ordering::Relaxed);
        assert_eq!(b.ramp_share(4000, 10_000), RAMP_FLOOR);
        assert_eq!(b.ramp_share(4000, 9_000), RAMP_FLOOR, "clock before it");
        assert_eq!(b.ramp_share(4000, 12_000), RAMP_FULL / 2);
        assert_eq!(b.ramp_share(4000, 14_000), RAMP_FULL);
        assert_eq!(b.ramp_share(4000, u64::MAX), RAMP_FULL);
        assert_eq!(b.ramp_share(u64::MAX, u64::MAX - 1), 1023);
        assert_eq!(b.ramp_end_ms(4000, 12_000), Some(14_000));
        assert_eq!(b.ramp_end_ms(4000, 14_000), None);
        assert_eq!(b.ramp_end_ms(u64::MAX, 1), None, "no overflow");
    }

    #[test]
    fn coming_back_starts_a_ramp() {
        let b = Backend::new("b".into(), vec![], 1);
        b.set_healthy(false);
        b.set_healthy(true);
        let now = coarse_now_ms();
        assert!(b.ramp_share(3_600_000, now) < RAMP_FULL);
        assert!(b.ramp_end_ms(3_600_000, now).is_some());
    }

    #[test]
    fn backup_is_an_option_given_once_without_value() {
        let spec = BackendSpec::parse("127.0.0.1:8003,backup").unwrap();
        assert!(spec.backup);
        assert_eq!(spec.to_string(), "127.0.0.1:8003,backup");
        let both = BackendSpec::parse("127.0.0.1:8003,weight=3,backup").unwrap();
        assert_eq!((both.weight, both.backup), (3, true));
        assert!(!BackendSpec::parse("127.0.0.1:8003").unwrap().backup);
        for bad in [
            "127.0.0.1:8003,backup,backup",
            "127.0.0.1:8003,backup=1",
            "127.0.0.1:8003,backup=",
            "127.0.0.1:8003,backups",
        ] {
            let err = BackendSpec::parse(bad).unwrap_err().to_string();
            assert!(!err.contains('\n'), "{err}");
        }
        let err = BackendSpec::parse("127.0.0.1:8003,backup=1").unwrap_err();
        assert!(err.to_string().contains("no value"), "{err}");
        let backend = Backend::from_spec(&both).unwrap();
        assert!(backend.is_backup());
    }
}
