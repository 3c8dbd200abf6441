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
//! random-number state to share or lock.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C only rotates.

use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::{least_loaded, mix64, Snapshot, Strategy};
use crate::backend::Backend;

/// See the module docs.
pub(crate) struct PowerOfTwo;

impl Strategy for PowerOfTwo {
    fn name(&self) -> &'static str {
        "p2c"
    }

    fn choose(&self, snap: &Snapshot, _peer: IpAddr, turn: &AtomicUsize) -> Option<usize> {
        let list = &snap.list;
        let n = list.len();
        let turn = turn.fetch_add(1, Ordering::Relaxed);
        if n == 1 {
            return list[0].is_available().then_some(0);
        }
        let draw = mix64(turn as u64);
        let a = (draw % n as u64) as usize;
        // A second index, different from the first.
        let b = (a + 1 + ((draw >> 32) % (n as u64 - 1)) as usize) % n;
        match (list[a].is_available(), list[b].is_available()) {
            (true, true) => Some(if load_below(&list[b], &list[a]) { b } else { a }),
            (true, false) => Some(a),
            (false, true) => Some(b),
            // Both drawn are out: look at all of them, as least connections.
            (false, false) => least_loaded(list, a),
        }
    }

    fn reserves(&self) -> bool {
        true
    }
}

/// Whether `x` carries less load per unit of weight than `y`.
fn load_below(x: &Backend, y: &Backend) -> bool {
    let load = |b: &Backend| (b.active() + b.pending()) as u64;
    load(x) * u64::from(y.weight()) < load(y) * u64::from(x.weight())
}

#[cfg(test)]
mod tests {
    use crate::backend::Backend;
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
}
