//! Fail-over: the backend a worker tries after a connect failed, chosen as
//! the scheduler would have chosen had the failed ones been marked down.
//! The candidates are the backends available and not yet tried for this
//! client, primaries while one of them is left, then the backups; the
//! service's algorithm chooses among those with a free slot, on its own
//! turn counter, so a dead backend's share spreads over the others as a
//! backend out of rotation's does (round robin, weights, least load,
//! ip-hash, first), and the rotation of new clients is left as it was.
//!
//! An untried primary that is available but at its `max_connections`
//! keeps the backups out: the client waits for its slot ([`Next::Wait`]),
//! as a client does whose pick finds every backend full.
//!
//! # Threads
//!
//! Worker threads, on the cold path after a failed connect only: it copies
//! the candidates into a snapshot of their own (an allocation and one read
//! lock per try), which the pick of new clients never pays.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C `exit()`s when a connect fails.

use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::ramp::RampNow;
use super::{Scheduler, Snapshot};
use crate::backend::{coarse_now_ms, Backend, Reservation};

/// What a worker whose connects failed does next.
#[derive(Debug)]
pub enum Next {
    /// Try this backend, with the place reserved on it (a capped one, or
    /// for the algorithms that count the clients on their way).
    Try(Arc<Backend>, Option<Reservation>),
    /// Every primary left untried is at its cap: wait for a slot (the
    /// backups are not for full primaries).
    Wait,
    /// Every candidate was tried: the client cannot be served.
    Done,
}

impl Scheduler {
    /// The next backend to try for a client from `peer` whose connects to
    /// the backends with the ids in `tried` failed. `first_waiting` says
    /// that the client is the first in the [`Scheduler::waitlist`]: only it
    /// may take a capped backend's slot while others wait.
    pub fn fail_over(&self, peer: IpAddr, tried: &[u64], first_waiting: bool) -> Next {
        let (all, algorithm) = {
            let snap = self.shared.current.read();
            (Arc::clone(&snap.all), snap.algorithm)
        };
        let untried = |b: &&Arc<Backend>| b.is_available() && !tried.contains(&b.id());
        // Primaries while one is left, full or not; then the backups.
        let primary_left = all.iter().filter(untried).any(|b| !b.is_backup());
        let tier: Vec<&Arc<Backend>> = all
            .iter()
            .filter(untried)
            .filter(|b| b.is_backup() != primary_left)
            .collect();
        if tier.is_empty() {
            return Next::Done;
        }
        let line = !first_waiting && !self.shared.waitlist.is_empty();
        // Those with a free slot (none of them capped when others wait:
        // the line drains in order).
        let mut free: Vec<Arc<Backend>> = tier
            .into_iter()
            .filter(|b| !(b.is_capped() && line) && b.has_free_slot())
            .cloned()
            .collect();
        let ramp_ms = self.shared.ramp_ms.load(Ordering::Relaxed);
        // A capped one may fill between the look and the reservation: then
        // the algorithm chooses again without it.
        while !free.is_empty() {
            let snap = Snapshot::new(free.clone().into(), algorithm, ramp_ms);
            let Some(idx) = choose(&snap, peer, &self.shared.failover_next) else {
                return Next::Done;
            };
            let backend = Arc::clone(&snap.list[idx]);
            let reserves = algorithm.strategy().reserves();
            if !backend.is_capped() {
                let held = reserves.then(|| backend.reserve());
                return Next::Try(backend, held);
            }
            if let Some(held) = backend.try_reserve() {
                return Next::Try(backend, Some(held));
            }
            free.retain(|b| b.id() != backend.id());
        }
        Next::Wait
    }
}

/// The algorithm's choice in `snap`, with its slow start if one is under
/// way.
fn choose(snap: &Snapshot, peer: IpAddr, turn: &std::sync::atomic::AtomicUsize) -> Option<usize> {
    let strategy = snap.algorithm.strategy();
    if let Some(ramp) = snap.ramp {
        let now_ms = coarse_now_ms();
        if now_ms < ramp.until_ms {
            let at = RampNow {
                over_ms: ramp.over_ms,
                now_ms,
            };
            return strategy.choose_ramping(snap, peer, turn, &at);
        }
    }
    strategy.choose(snap, peer, turn)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{backends, ip, weighted, OUT, PEER};
    use super::super::{Algorithm, Scheduler};
    use super::*;

    /// The backend a client lands on: its pick, or, when the pick is the
    /// dead one (`dead`: positions in the list), the fail-over's choice
    /// from the others, in turn, as a worker makes it.
    fn served(s: &Scheduler, peer: IpAddr, dead: &[usize]) -> usize {
        let list = s.snapshot();
        let pick = s.pick(peer).unwrap();
        let mut at = pick.server_idx;
        let mut tried = vec![pick.backend.id()];
        let mut held = Vec::new();
        while dead.contains(&at) {
            match s.fail_over(peer, &tried, false) {
                Next::Try(b, r) => {
                    at = list.iter().position(|x| x.id() == b.id()).unwrap();
                    tried.push(b.id());
                    held.push(r);
                }
                other => panic!("nothing left: {other:?}"),
            }
        }
        at
    }

    fn tally_served(s: &Scheduler, clients: u32, dead: &[usize]) -> Vec<usize> {
        let mut counts = vec![0; s.snapshot().len()];
        for i in 0..clients {
            counts[served(s, ip(i), dead)] += 1;
        }
        counts
    }

    #[test]
    fn a_dead_backends_share_spreads_as_if_it_were_down() {
        // Round robin, least connections (all idle: ties take turns):
        // exactly 80 each; p2c near it.
        for algorithm in [
            Algorithm::RoundRobin,
            Algorithm::LeastConnections,
            Algorithm::PowerOfTwo,
        ] {
            let s = Scheduler::with_algorithm(backends(4), algorithm);
            let counts = tally_served(&s, 240, &[2]);
            assert_eq!(counts[2], 0, "{algorithm}: {counts:?}");
            for i in [0, 1, 3] {
                assert!((70..=90).contains(&counts[i]), "{algorithm}: {counts:?}");
            }
            if algorithm != Algorithm::PowerOfTwo {
                assert_eq!(counts, [80, 80, 0, 80], "{algorithm}");
            }
        }
        // Weights 1, 3 and a dead 1: its fifth goes 1:3 too, 60:180.
        let s = Scheduler::with_algorithm(weighted(&[1, 3, 1]), Algorithm::WeightedRoundRobin);
        assert_eq!(tally_served(&s, 240, &[2]), [60, 180, 0]);
        // A dead weight 3 listed first: 120:120, not all on its neighbour.
        let s = Scheduler::with_algorithm(weighted(&[3, 1, 1]), Algorithm::WeightedRoundRobin);
        assert_eq!(tally_served(&s, 250, &[0]), [0, 125, 125]);
    }

    #[test]
    fn ip_hash_fails_over_where_a_mark_down_would_send_the_client() {
        let list = backends(4);
        let s = Scheduler::with_algorithm(list.clone(), Algorithm::IpHash);
        let failed_over: Vec<usize> = (0..2000).map(|i| served(&s, ip(i), &[2])).collect();
        list[2].set_healthy(false);
        for (i, &at) in failed_over.iter().enumerate() {
            assert_eq!(s.pick(ip(i as u32)).unwrap().server_idx, at, "client {i}");
        }
    }

    #[test]
    fn first_fails_over_to_the_next_in_list_order() {
        let s = Scheduler::with_algorithm(backends(3), Algorithm::First);
        assert_eq!(tally_served(&s, 10, &[0]), [0, 10, 0]);
        assert_eq!(tally_served(&s, 10, &[0, 1]), [0, 0, 10]);
    }

    #[test]
    fn primaries_first_then_backups_then_done() {
        let list: Vec<_> = [false, true, false, true]
            .iter()
            .enumerate()
            .map(|(i, &bk)| Arc::new(Backend::new(format!("b{i}"), vec![], 1).with_backup(bk)))
            .collect();
        let s = Scheduler::new(list.clone());
        let ids = |v: &[usize]| v.iter().map(|&i| list[i].id()).collect::<Vec<u64>>();
        let next = |tried: &[usize]| match s.fail_over(PEER, &ids(tried), false) {
            Next::Try(b, _) => Some(b.name().to_string()),
            Next::Done => None,
            Next::Wait => panic!("nothing is capped"),
        };
        assert_eq!(next(&[0]).as_deref(), Some("b2"));
        let backup = next(&[0, 2]).unwrap();
        assert!(backup == "b1" || backup == "b3", "{backup}");
        assert_eq!(next(&[0, 2, 1]).as_deref(), Some("b3"));
        assert_eq!(next(&[0, 2, 1, 3]), None);
        // A primary out of rotation is no candidate.
        for (how, set_out) in OUT {
            set_out(&list[2], true);
            assert!(next(&[0]).unwrap() != "b2", "{how}");
            set_out(&list[2], false);
        }
    }

    #[test]
    fn a_full_primary_makes_the_client_wait_not_the_backup_serve() {
        let list: Vec<_> = [false, false, true]
            .iter()
            .enumerate()
            .map(|(i, &bk)| Arc::new(Backend::new(format!("b{i}"), vec![], 1).with_backup(bk)))
            .collect();
        list[0].set_max_connections(Some(1));
        let s = Scheduler::new(list.clone());
        let held = list[0].try_reserve().unwrap();
        // b1 failed; b0 is up and full.
        let tried = [list[1].id()];
        assert!(matches!(s.fail_over(PEER, &tried, false), Next::Wait));
        drop(held);
        match s.fail_over(PEER, &tried, false) {
            Next::Try(b, held) => {
                assert_eq!(b.name(), "b0");
                assert!(held.is_some(), "its slot is reserved");
                assert!(matches!(s.fail_over(PEER, &tried, false), Next::Wait));
            }
            other => panic!("{other:?}"),
        }
        // Others in line: a newcomer does not take the slot, the first does.
        let ticket = s.waitlist().join(10).unwrap();
        assert!(matches!(s.fail_over(PEER, &tried, false), Next::Wait));
        assert!(matches!(s.fail_over(PEER, &tried, true), Next::Try(..)));
        drop(ticket);
        // b0 down: the backup serves.
        list[0].set_healthy(false);
        match s.fail_over(PEER, &tried, false) {
            Next::Try(b, _) => assert_eq!(b.name(), "b2"),
            other => panic!("{other:?}"),
        }
    }
}
