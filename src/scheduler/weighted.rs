//! Smooth weighted round robin (nginx's): weights 5, 1, 1 give
//! `a a b a c a a`, so a heavy backend never takes a burst of consecutive
//! clients.
//!
//! nginx runs the algorithm under a lock at every pick; here
//! [`smooth_cycle`] runs once, when the list or a backend's availability
//! changes, to build the whole cycle over the available backends (one entry
//! per unit of weight), and a pick is the same atomic turn as round robin,
//! indexing that cycle: lock-free and exact under concurrency. A backend
//! out of rotation is not in the cycle, so its share goes to the others in
//! proportion to their weights, as in nginx.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C has no weights.

use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::{first_available, Snapshot, Strategy};

/// See the module docs.
pub(crate) struct SmoothWeighted;

impl Strategy for SmoothWeighted {
    fn name(&self) -> &'static str {
        "weighted-round-robin"
    }

    fn choose(&self, snap: &Snapshot, _peer: IpAddr, turn: &AtomicUsize) -> Option<usize> {
        let turn = turn.fetch_add(1, Ordering::Relaxed);
        match snap.cycle.len() {
            // None was available when the cycle was built.
            0 => snap.in_turn(turn),
            // Checked again: see "Availability" in the module docs.
            len => first_available(&snap.list, snap.cycle[turn % len] as usize),
        }
    }
}

/// The smooth weighted round-robin cycle (nginx's algorithm): at each step
/// every backend's current weight grows by its weight, the largest current
/// weight wins (the first one on a tie) and loses the total. Positions in
/// `weights`; empty when `weights` is.
pub(crate) fn smooth_cycle(weights: &[u32]) -> Vec<u32> {
    if weights.is_empty() {
        return Vec::new();
    }
    // Weights 10,20 give the same order as 1,2 in a cycle ten times shorter.
    let g = weights.iter().fold(0, |g, &w| gcd(g, w.max(1)));
    let w: Vec<i64> = weights.iter().map(|&x| i64::from(x.max(1) / g)).collect();
    let total: i64 = w.iter().sum();
    let mut current = vec![0i64; w.len()];
    let mut cycle = Vec::with_capacity(total as usize);
    for _ in 0..total {
        let mut best = 0;
        for i in 0..w.len() {
            current[i] += w[i];
            if current[i] > current[best] {
                best = i;
            }
        }
        current[best] -= total;
        cycle.push(best as u32);
    }
    cycle
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::tests::{count_concurrent, names, tally, weighted, OUT};
    use crate::scheduler::{Algorithm, Scheduler};
    use std::sync::Arc;

    #[test]
    fn out_backends_share_goes_to_the_others_by_weight() {
        for (how, set_out) in OUT {
            let list = weighted(&[1, 3, 2, 5]);
            let s = Scheduler::with_algorithm(list.clone(), Algorithm::WeightedRoundRobin);
            set_out(&list[2], true);
            set_out(&list[3], true);
            // Exactly 1:3 in every 100 picks (not 15:85), still smooth.
            for _ in 0..3 {
                assert_eq!(tally(&s, 100), [25, 75, 0, 0], "c and d {how}");
            }
            assert_eq!(names(&s, 8), "babbbabb", "c and d {how}");
            set_out(&list[2], false);
            set_out(&list[3], false);
            assert_eq!(tally(&s, 110), [10, 30, 20, 50], "back from {how}");
        }
    }

    #[test]
    fn a_heavy_backend_out_leaves_the_others_even() {
        let list = weighted(&[5, 1, 1]);
        let s = Scheduler::with_algorithm(list.clone(), Algorithm::WeightedRoundRobin);
        list[0].set_healthy(false);
        // a's five turns in seven do not all go to b.
        assert_eq!(names(&s, 8), "bcbcbcbc");
    }

    #[test]
    fn exact_counts_under_threads_with_backends_out() {
        // Weights 1..=5 over 50 backends, ten of them out (weights 1..=5
        // twice), leaving a total weight of 120: 2000 threads × 12 picks
        // are 200 cycles.
        let weights: Vec<u32> = (0..50).map(|i| i % 5 + 1).collect();
        let list = weighted(&weights);
        let s = Arc::new(Scheduler::with_algorithm(
            list.clone(),
            Algorithm::WeightedRoundRobin,
        ));
        for (i, b) in list.iter().enumerate().take(10) {
            OUT[i % 3].1(b, true);
        }
        let counts = count_concurrent(&s, 2000, 12);
        for (i, w) in weights.iter().enumerate() {
            let expected = if i < 10 { 0 } else { 200 * *w as usize };
            assert_eq!(
                counts.get(&format!("b{i}")).copied().unwrap_or(0),
                expected,
                "b{i}"
            );
        }
    }

    #[test]
    fn smooth_cycle_matches_the_weights() {
        let cycle = smooth_cycle(&[5, 1, 1]);
        assert_eq!(cycle, [0, 0, 1, 0, 2, 0, 0]);
        let cycle = smooth_cycle(&[30, 20, 10]);
        assert_eq!(cycle.len(), 6, "divided by the gcd");
        let cycle = smooth_cycle(&[7, 3, 1000, 1]);
        for (i, w) in [7, 3, 1000, 1].into_iter().enumerate() {
            assert_eq!(cycle.iter().filter(|&&c| c as usize == i).count(), w);
        }
    }
}
