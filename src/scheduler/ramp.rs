//! Slow start (HAProxy's `slowstart`): a backend that comes back into
//! rotation (health up, end of maintenance or draining, added at run time)
//! gets a share of its weight that grows from about 5% to all of it over
//! the service's slow start, so a cold cache is not flooded.
//!
//! How each algorithm takes the share:
//! - round robin, weighted round robin (and any algorithm that takes
//!   turns): a turn that falls on a ramping backend is passed on to the
//!   next with probability 1 − share, so it gets about share × its turns;
//! - least connections and p2c: its weight is scaled by the share, and
//!   every load counts one more (HAProxy's leastconn form), so an idle
//!   backend just back does not win every tie;
//! - ip-hash: unaffected. A client's backend is its hash's; sending some of
//!   them elsewhere for a while would move them twice.
//!
//! A snapshot knows whether a ramp is under way when it is built; only
//! then does a pick read the clock (the coarse one) and the backends'
//! shares. Without a slow start, or once every ramp is over, a pick is
//! what it was.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C's servers never leave, so never come back.

use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLockReadGuard;

use super::{mix64, Pick, Scheduler, Snapshot, Strategy};
use crate::backend::{coarse_now_ms, Backend, RAMP_FULL};

/// A slow start under way when a snapshot was built: some backend of its
/// rotation came back less than `over_ms` ago.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ramp {
    /// The service's slow start, in ms.
    pub(crate) over_ms: u64,
    /// When the last of these ramps ends, on the coarse clock.
    pub(crate) until_ms: u64,
}

impl Ramp {
    /// The ramp under way in `list` with a slow start of `over_ms` (0:
    /// off), or `None`.
    pub(crate) fn of(list: &[Arc<Backend>], over_ms: u64) -> Option<Ramp> {
        if over_ms == 0 {
            return None;
        }
        let now = coarse_now_ms();
        let until_ms = list
            .iter()
            .filter_map(|b| b.ramp_end_ms(over_ms, now))
            .max()?;
        Some(Ramp { over_ms, until_ms })
    }
}

/// A ramp as one pick sees it, at one time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RampNow {
    /// The service's slow start, in ms.
    pub(crate) over_ms: u64,
    /// Now, on the coarse clock.
    pub(crate) now_ms: u64,
}

impl RampNow {
    /// `b`'s share of its weight now, in 1024ths.
    pub(crate) fn share(&self, b: &Backend) -> u32 {
        b.ramp_share(self.over_ms, self.now_ms)
    }

    /// `b`'s load and weight as least connections and p2c compare them
    /// during a ramp: one more than its connections, and its weight times
    /// its share (so always at least 1).
    pub(crate) fn load_weight(&self, b: &Backend) -> (u64, u64) {
        let load = (b.active() + b.pending()) as u64 + 1;
        (load, u64::from(b.weight()) * u64::from(self.share(b)))
    }

    /// Whether a turn that fell on `b` stays with it: always at full
    /// share, else with probability share (drawn from `seed`).
    fn keeps(&self, b: &Backend, seed: u64) -> bool {
        let share = self.share(b);
        share >= RAMP_FULL || mix64(seed) % u64::from(RAMP_FULL) < u64::from(share)
    }
}

impl Scheduler {
    /// Sets the slow start (`None`: off): backends that came back less
    /// than this ago get a share of their weight growing to all of it
    /// (`ramp.rs`). Picks from now on use it.
    pub fn set_ramp(&self, over: Option<Duration>) {
        let ms = over.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        if self.shared.ramp_ms.swap(ms, Ordering::Relaxed) != ms {
            self.refresh();
        }
    }

    /// The slow start set by [`Scheduler::set_ramp`], or `None` (off).
    pub fn ramp(&self) -> Option<Duration> {
        let ms = self.shared.ramp_ms.load(Ordering::Relaxed);
        (ms != 0).then(|| Duration::from_millis(ms))
    }

    /// `b`'s weight as the scheduler counts it now, and whether slow
    /// start still ramps it: its weight times its share while it ramps.
    pub fn effective_weight(&self, b: &Backend) -> (f64, bool) {
        let weight = f64::from(b.weight());
        let over_ms = self.shared.ramp_ms.load(Ordering::Relaxed);
        let share = b.ramp_share(over_ms, crate::backend::coarse_now_ms());
        if share >= crate::backend::RAMP_FULL {
            return (weight, false);
        }
        let share = f64::from(share) / f64::from(crate::backend::RAMP_FULL);
        ((weight * share * 100.0).round() / 100.0, true)
    }

    /// [`Scheduler::pick`] while a slow start is under way: the clock is
    /// read, and once every ramp is over the snapshot is rebuilt without
    /// it (after the read lock is released).
    #[cold]
    #[inline(never)]
    pub(super) fn pick_ramping(
        &self,
        snap: RwLockReadGuard<'_, Snapshot>,
        peer: IpAddr,
        first_waiting: bool,
    ) -> Option<Pick> {
        let ramp = snap.ramp?;
        let now_ms = crate::backend::coarse_now_ms();
        let strategy = snap.algorithm.strategy();
        let next = &self.shared.next;
        let over = now_ms >= ramp.until_ms;
        let idx = if over {
            strategy.choose(&snap, peer, next)
        } else {
            let at = RampNow {
                over_ms: ramp.over_ms,
                now_ms,
            };
            strategy.choose_ramping(&snap, peer, next, &at)
        };
        let pick = match idx {
            Some(idx) if snap.list[idx].is_capped() => self.pick_capped(&snap, idx, first_waiting),
            Some(idx) => Some(snap.pick_at(idx)),
            None => None,
        };
        drop(snap);
        if over {
            // Whoever holds the writer lock rebuilds anyway.
            if let Some(_writer) = self.shared.writer.try_lock() {
                self.shared.rebuild();
            }
        }
        pick
    }
}

/// How many turns in a row may be passed on before the last one is kept
/// anyway (every backend ramping at once, say): a pick stays bounded.
const PASSES: u64 = 8;

/// [`Strategy::choose_ramping`] of the algorithms that take turns: a turn
/// that falls on a ramping backend is passed on with probability 1 − its
/// share.
pub(crate) fn pass_turns<S: Strategy + ?Sized>(
    strategy: &S,
    snap: &Snapshot,
    peer: IpAddr,
    turn: &AtomicUsize,
    ramp: &RampNow,
) -> Option<usize> {
    let mut idx = strategy.choose(snap, peer, turn)?;
    for pass in 0..PASSES {
        let seed = (turn.load(Ordering::Relaxed) as u64) ^ (pass << 56);
        if ramp.keeps(&snap.list[idx], seed) {
            break;
        }
        idx = strategy.choose(snap, peer, turn)?;
    }
    Some(idx)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{tally, weighted, PEER};
    use super::super::Algorithm;
    use super::*;
    use std::time::Duration;

    /// Picks with backend 0 ramping (just back) and the others steady,
    /// under every algorithm: the ramping one's share is well under its
    /// steady one, except under ip-hash and first, which are left alone.
    #[test]
    fn a_backend_just_back_gets_a_small_share() {
        for algorithm in Algorithm::ALL.iter().copied() {
            let list = weighted(&[1, 1, 1, 1]);
            let s = Scheduler::with_algorithm(list.clone(), algorithm);
            s.set_ramp(Some(Duration::from_secs(3600)));
            list[0].set_maint(true);
            list[0].set_maint(false);
            let mut held = Vec::new();
            let mut counts = [0usize; 4];
            for i in 0..4000 {
                let pick = s.pick(PEER).unwrap();
                counts[pick.server_idx] += 1;
                // Least connections needs connections to weigh.
                held.push(list[pick.server_idx].start_connection());
                if i % 8 == 7 {
                    held.clear();
                }
            }
            if matches!(algorithm, Algorithm::IpHash | Algorithm::First) {
                continue;
            }
            // Steady: 1000 each. Ramping: about 5% of that.
            assert!(counts[0] < 250, "{algorithm}: {counts:?}");
            assert!(
                counts[1..].iter().all(|&c| c > 1000),
                "{algorithm}: {counts:?}"
            );
        }
    }

    #[test]
    fn without_a_ramp_or_once_over_nothing_changes() {
        let list = weighted(&[1, 1]);
        let s = Scheduler::new(list.clone());
        list[0].set_maint(true);
        list[0].set_maint(false);
        assert_eq!(tally(&s, 100), vec![50, 50], "off");
        s.set_ramp(Some(Duration::from_millis(1)));
        // Once the coarse clock has ticked past the ramp, a pick rebuilds
        // the snapshot without it.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while s.shared.current.read().ramp.is_some() {
            assert!(std::time::Instant::now() < deadline, "the ramp never ended");
            s.pick(PEER).unwrap();
            std::thread::yield_now();
        }
        assert_eq!(tally(&s, 100), vec![50, 50], "over");
    }

    #[test]
    fn a_backend_added_at_run_time_ramps() {
        let s = Scheduler::new(weighted(&[1]));
        s.set_ramp(Some(Duration::from_secs(3600)));
        s.add(Arc::new(Backend::new("b1".into(), vec![], 1)));
        let counts = tally(&s, 1000);
        assert!(counts[1] < 120, "{counts:?}");
        let (weight, ramping) = s.effective_weight(&s.snapshot()[1]);
        assert!(ramping && weight < 0.2, "{weight} {ramping}");
        assert_eq!(s.effective_weight(&s.snapshot()[0]), (1.0, false));
    }
}
