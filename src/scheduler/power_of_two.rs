//! Power of two choices (`p2c`): two different backends drawn at random,
//! and the less loaded of the two wins, load counted as least connections
//! counts it (active plus pending, per unit of weight).
//!
//! Why: least connections reads every backend's count at each pick, and
//! sends every client of a burst to the one backend that looks idlest until
//! the counts catch up. Two random choices read two counts, and a backend
//! that looks idlest is only one candidate in each draw, so a burst spreads
//! (Mitzenmacher's result: the most loaded backend's excess drops from
//! `log n / log log n` with one random choice to `log log n` with two).
//!
//! The draw is derived from the scheduler's shared turn counter, mixed: no
//! random-number state to share or lock. Both candidates are drawn from the
//! backends available (the snapshot's `up`), so a backend out of rotation
//! neither hands its draws to its neighbour nor makes the other candidate
//! win whatever its load.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C only rotates.

use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::ramp::RampNow;
use super::{least_loaded, mix64, Snapshot, Strategy};
use crate::backend::Backend;

/// See the module docs.
pub(crate) struct PowerOfTwo;

impl Strategy for PowerOfTwo {
    fn name(&self) -> &'static str {
        "p2c"
    }

    fn choose(&self, snap: &Snapshot, _peer: IpAddr, turn: &AtomicUsize) -> Option<usize> {
        draw(snap, turn, |b| {
            ((b.active() + b.pending()) as u64, u64::from(b.weight()))
        })
    }

    fn reserves(&self) -> bool {
        true
    }

    fn choose_ramping(
        &self,
        snap: &Snapshot,
        _peer: IpAddr,
        turn: &AtomicUsize,
        ramp: &RampNow,
    ) -> Option<usize> {
        draw(snap, turn, |b| ramp.load_weight(b))
    }
}

/// The less loaded of two backends drawn from those available, load and
/// weight as `load` gives them.
fn draw(
    snap: &Snapshot,
    turn: &AtomicUsize,
    load: impl Fn(&Backend) -> (u64, u64),
) -> Option<usize> {
    let (list, up) = (&snap.list, &snap.up);
    let turn = turn.fetch_add(1, Ordering::Relaxed);
    let m = up.len();
    if m < 2 {
        // One or none to draw from: no choice to make.
        return snap.in_turn(turn);
    }
    let draw = mix64(turn as u64);
    let i = (draw % m as u64) as usize;
    // A second one, different from the first.
    let j = (i + 1 + ((draw >> 32) % (m as u64 - 1)) as usize) % m;
    let (a, b) = (up[i], up[j]);
    // Checked again: see "Availability" in the module docs.
    match (list[a].is_available(), list[b].is_available()) {
        (true, true) => Some(if below(&list[b], &list[a], &load) {
            b
        } else {
            a
        }),
        (true, false) => Some(a),
        (false, true) => Some(b),
        // Both went out since the snapshot was built: look at them all.
        (false, false) => least_loaded(list, turn),
    }
}

/// Whether `x` carries less load per unit of weight than `y`.
fn below(x: &Backend, y: &Backend, load: impl Fn(&Backend) -> (u64, u64)) -> bool {
    let ((lx, wx), (ly, wy)) = (load(x), load(y));
    lx * wy < ly * wx
}

#[cfg(test)]
mod tests {
    use crate::backend::Backend;
    use crate::scheduler::tests::{tally, OUT};
    use crate::scheduler::{Algorithm, Scheduler};
    use std::collections::HashMap;
    use std::net::{IpAddr, Ipv4Addr};
    use std::sync::Arc;

    const PEER: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    fn backends(n: usize) -> Vec<Arc<Backend>> {
        (0..n)
            .map(|i| Arc::new(Backend::new(format!("b{i}"), vec![], 1)))
            .collect()
    }

    #[test]
    fn never_picks_the_more_loaded_of_the_two() {
        let list = backends(3);
        // b0 carries 50 connections; b1 and b2 none.
        let _held: Vec<_> = (0..50).map(|_| list[0].start_connection()).collect();
        let s = Scheduler::with_algorithm(list.clone(), Algorithm::PowerOfTwo);
        let mut counts: HashMap<String, usize> = HashMap::new();
        for _ in 0..3000 {
            // Dropped at once: the reservation does not pile up.
            let pick = s.pick(PEER).unwrap();
            *counts.entry(pick.backend.name().to_string()).or_default() += 1;
        }
        assert_eq!(counts.get("b0"), None, "{counts:?}");
        // The two idle ones share the rest, each well above a third.
        assert!(counts["b1"] > 1000 && counts["b2"] > 1000, "{counts:?}");
    }

    #[test]
    fn spreads_a_burst_of_reserved_picks() {
        let s = Scheduler::with_algorithm(backends(4), Algorithm::PowerOfTwo);
        // Held picks count as load (reservations): 400 of them end up
        // nearly even, where one random choice would leave some backend
        // far above 100.
        let held: Vec<_> = (0..400).map(|_| s.pick(PEER).unwrap()).collect();
        let mut counts: HashMap<String, usize> = HashMap::new();
        for p in &held {
            *counts.entry(p.backend.name().to_string()).or_default() += 1;
        }
        for (name, n) in &counts {
            assert!((90..=110).contains(n), "{name}: {n} in {counts:?}");
        }
    }

    #[test]
    fn skips_unavailable_backends_and_says_none_when_all_are_out() {
        let list = backends(3);
        let s = Scheduler::with_algorithm(list.clone(), Algorithm::PowerOfTwo);
        list[1].set_healthy(false);
        for _ in 0..300 {
            assert_ne!(s.pick(PEER).unwrap().backend.name(), "b1");
        }
        list[0].set_draining(true);
        for _ in 0..100 {
            assert_eq!(s.pick(PEER).unwrap().backend.name(), "b2");
        }
        list[2].set_healthy(false);
        assert!(s.pick(PEER).is_none());
        let one = Scheduler::with_algorithm(backends(1), Algorithm::PowerOfTwo);
        assert_eq!(one.pick(PEER).unwrap().server_idx, 0);
    }

    #[test]
    fn draws_do_not_favour_the_backend_after_out_ones() {
        for (how, set_out) in OUT {
            let list = backends(5);
            let s = Scheduler::with_algorithm(list.clone(), Algorithm::PowerOfTwo);
            // b and c out side by side: a draw of both must not fall back
            // on d, the next one in the list.
            set_out(&list[1], true);
            set_out(&list[2], true);
            let counts = tally(&s, 3000);
            assert_eq!(counts[1] + counts[2], 0, "{counts:?} ({how})");
            for i in [0, 3, 4] {
                assert!((900..=1100).contains(&counts[i]), "{counts:?} ({how})");
            }
        }
    }

    #[test]
    fn weights_share_held_picks_among_the_backends_left() {
        let list = crate::scheduler::tests::weighted(&[1, 3, 2, 5]);
        let s = Scheduler::with_algorithm(list.clone(), Algorithm::PowerOfTwo);
        list[2].set_draining(true);
        list[3].set_maint(true);
        let held: Vec<_> = (0..100).map(|_| s.pick(PEER).unwrap()).collect();
        let pending: Vec<usize> = list.iter().map(|b| b.pending()).collect();
        assert!((24..=26).contains(&pending[0]), "{pending:?}");
        assert_eq!(pending[0] + pending[1], 100, "{pending:?}");
        drop(held);
    }
}
