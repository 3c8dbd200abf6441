//! Smooth weighted round robin (nginx's): weights 5, 1, 1 give
//! `a a b a c a a`, so a heavy backend never takes a burst of consecutive
//! clients.
//!
//! nginx runs the algorithm under a lock at every pick; here
//! [`smooth_cycle`] runs once, when the list changes, to build the whole
//! cycle (one entry per unit of weight), and a pick is the same atomic turn
//! as round robin, indexing that cycle: lock-free and exact under
//! concurrency.
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
        let slot = snap.cycle[turn % snap.cycle.len()] as usize;
        // A backend that is down gives its turn to the next one in list
        // order, so one down backend costs one cheap step.
        first_available(&snap.list, slot)
    }
}

/// The smooth weighted round-robin cycle (nginx's algorithm): at each step
/// every backend's current weight grows by its weight, the largest current
/// weight wins (the first one on a tie) and loses the total.
pub(crate) fn smooth_cycle(weights: &[u32]) -> Vec<u32> {
    if weights.is_empty() {
        return vec![0];
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
