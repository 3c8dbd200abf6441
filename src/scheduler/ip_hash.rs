//! ip-hash by rendezvous (highest random weight) hashing of the client's
//! address against each backend's name.
//!
//! Each backend gets a pseudo-random score per client; the client goes to
//! the highest score. The same IP goes to the same backend while the set is
//! unchanged, and removing (or losing) one backend moves only the clients
//! that were on it. Adding one takes about `1/n` of the clients, only from
//! each of the others. Hashing the *name* (not the position) keeps this true
//! across restarts and reorders.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C only rotates.

use std::net::IpAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use super::ramp::RampNow;
use super::{mix64, Snapshot, Strategy};
use crate::backend::Backend;

/// See the module docs.
pub(crate) struct Rendezvous;

impl Strategy for Rendezvous {
    fn name(&self) -> &'static str {
        "ip-hash"
    }

    fn choose(&self, snap: &Snapshot, peer: IpAddr, _turn: &AtomicUsize) -> Option<usize> {
        rendezvous(&snap.list, &snap.keys, snap.uniform, hash_ip(peer))
    }

    /// Slow start leaves ip-hash alone: sending a client elsewhere while
    /// its backend ramps would move it twice (see `ramp.rs`).
    fn choose_ramping(
        &self,
        snap: &Snapshot,
        peer: IpAddr,
        turn: &AtomicUsize,
        _ramp: &RampNow,
    ) -> Option<usize> {
        self.choose(snap, peer, turn)
    }
}

/// Rendezvous hashing: the available backend with the highest score for
/// this client.
pub(crate) fn rendezvous(
    list: &[Arc<Backend>],
    keys: &[u64],
    uniform: bool,
    ip: u64,
) -> Option<usize> {
    if uniform {
        // Equal weights: the highest hash wins, integers only.
        let mut best: Option<(usize, u64)> = None;
        for (idx, b) in list.iter().enumerate() {
            let h = mix64(ip ^ keys[idx]);
            if best.map_or(true, |(_, s)| h > s) && b.is_available() {
                best = Some((idx, h));
            }
        }
        return best.map(|(idx, _)| idx);
    }
    // Weighted rendezvous: score = w / -ln(u), with u uniform in (0, 1),
    // gives each backend a share of clients proportional to its weight.
    // With equal weights it picks the same backend as the integer path
    // above (the score grows with u, so with h), so a list whose weights
    // become equal keeps every client where it was.
    //
    // Scores are compared as w_a × L_b > w_b × L_a (L = -ln u > 0): no
    // division. The logarithm is the costly part, so it is skipped when the
    // backend cannot win: -ln u ≥ 1 − u, so w / (1 − u) bounds its score.
    let mut best: Option<(usize, f64, f64)> = None; // (index, weight, L)
    for (idx, b) in list.iter().enumerate() {
        let h = mix64(ip ^ keys[idx]);
        let u = ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        let w = f64::from(b.weight());
        if let Some((_, bw, bl)) = best {
            if w * bl <= bw * (1.0 - u) {
                continue;
            }
        }
        if !b.is_available() {
            continue;
        }
        let l = -u.ln();
        if best.map_or(true, |(_, bw, bl)| w * bl > bw * l) {
            best = Some((idx, w, l));
        }
    }
    best.map(|(idx, _, _)| idx)
}

/// FNV-1a of a backend name, mixed.
pub(crate) fn hash_name(name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in name.bytes() {
        h ^= u64::from(byte);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix64(h)
}

/// A client address as one 64-bit value.
pub(crate) fn hash_ip(ip: IpAddr) -> u64 {
    match ip {
        IpAddr::V4(v4) => mix64(u64::from(u32::from(v4))),
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            mix64((bits as u64) ^ mix64((bits >> 64) as u64))
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::scheduler::tests::{backends, ip, OUT};
    use crate::scheduler::{Algorithm, Scheduler};

    #[test]
    fn an_out_backend_moves_only_its_clients_spread_over_the_rest() {
        let clients = 12_000u32;
        for (how, set_out) in OUT {
            let list = backends(4);
            let s = Scheduler::with_algorithm(list.clone(), Algorithm::IpHash);
            let at = |i: u32| s.pick(ip(i)).unwrap().server_idx;
            let before: Vec<usize> = (0..clients).map(at).collect();
            set_out(&list[2], true);
            // Where c's clients went, per backend.
            let mut moved_to = [0usize; 4];
            for i in 0..clients {
                let (was, now) = (before[i as usize], at(i));
                if was == 2 {
                    moved_to[now] += 1;
                } else {
                    assert_eq!(
                        now, was,
                        "client {i} moved off a backend that stayed ({how})"
                    );
                }
            }
            // About a quarter of the clients were on c; each of the other
            // three takes about a third of them, d no more than a or b.
            let moved: usize = moved_to.iter().sum();
            assert!((2700..=3300).contains(&moved), "{moved} moved ({how})");
            assert_eq!(moved_to[2], 0);
            for to in [0, 1, 3] {
                assert!(
                    moved_to[to] * 100 >= moved * 30 && moved_to[to] * 100 <= moved * 37,
                    "{moved_to:?} ({how})"
                );
            }
            // Back: every client where it was.
            set_out(&list[2], false);
            assert!((0..clients).all(|i| at(i) == before[i as usize]), "{how}");
        }
    }
}
