//! Least connections: the available backend with the fewest connections,
//! divided by its weight. Ties go by a round-robin turn among the tied
//! backends only, so equal backends take exactly one turn each in turn, and
//! the share of a busier or unavailable backend is not handed to the one
//! after it in the list.
//!
//! A backend's count is [`Backend::active`](crate::backend::Backend::active)
//! plus [`Backend::pending`](crate::backend::Backend::pending): the clients
//! picked for it that wait in the queue or are connecting (the pick holds a
//! reservation, see [`Strategy::reserves`]). Without the pending part, a
//! burst of clients accepted faster than they connect would all go to the
//! backend that looked idlest.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C only rotates.

use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::ramp::RampNow;
use super::{least_loaded, least_loaded_by, Snapshot, Strategy};

/// See the module docs.
pub(crate) struct LeastConnections;

impl Strategy for LeastConnections {
    fn name(&self) -> &'static str {
        "least-connections"
    }

    fn choose(&self, snap: &Snapshot, _peer: IpAddr, turn: &AtomicUsize) -> Option<usize> {
        least_loaded(&snap.list, turn.fetch_add(1, Ordering::Relaxed))
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
        let turn = turn.fetch_add(1, Ordering::Relaxed);
        least_loaded_by(&snap.list, turn, |b| ramp.load_weight(b))
    }
}

#[cfg(test)]
mod tests {
    use crate::scheduler::tests::{backends, tally, weighted, OUT, PEER};
    use crate::scheduler::{Algorithm, Pick, Scheduler};

    #[test]
    fn an_out_backends_share_is_spread_evenly() {
        for (how, set_out) in OUT {
            let list = backends(4);
            let s = Scheduler::with_algorithm(list.clone(), Algorithm::LeastConnections);
            set_out(&list[2], true);
            // All idle (each pick dropped at once): every pick is a tie
            // among a, b and d, which take turns.
            assert_eq!(tally(&s, 240), [80, 80, 0, 80], "c {how}");
            set_out(&list[2], false);
            assert_eq!(tally(&s, 240), [60, 60, 60, 60], "c back from {how}");
        }
    }

    #[test]
    fn ties_do_not_favour_the_backend_after_a_busier_one() {
        let list = backends(4);
        let s = Scheduler::with_algorithm(list.clone(), Algorithm::LeastConnections);
        // a carries one connection: b, c and d tie at zero and share
        // evenly; the turns that start at a must not all go to b.
        let _a = list[0].start_connection();
        assert_eq!(tally(&s, 300), [0, 100, 100, 100]);
        // The same with c down: a's and c's turns spread over b and d.
        list[2].set_healthy(false);
        assert_eq!(tally(&s, 300), [0, 150, 0, 150]);
    }

    #[test]
    fn more_equals_than_remembered_take_turns_too() {
        // 40 idle backends, 3 out: 37 equals, more than the 16 the first
        // pass remembers, so the later turns take the second pass.
        let list = backends(40);
        let s = Scheduler::with_algorithm(list.clone(), Algorithm::LeastConnections);
        for i in [0, 17, 39] {
            list[i].set_draining(true);
        }
        let counts = tally(&s, 37 * 3);
        for (i, c) in counts.iter().enumerate() {
            let out = [0, 17, 39].contains(&i);
            assert_eq!(*c, if out { 0 } else { 3 }, "{counts:?}");
        }
    }

    #[test]
    fn weights_share_the_load_among_the_backends_left() {
        for (how, set_out) in OUT {
            let list = weighted(&[1, 3, 2, 5]);
            let s = Scheduler::with_algorithm(list.clone(), Algorithm::LeastConnections);
            set_out(&list[2], true);
            set_out(&list[3], true);
            // Held picks count as load: 100 of them split 1:3.
            let held: Vec<Pick> = (0..100).map(|_| s.pick(PEER).unwrap()).collect();
            let pending: Vec<usize> = list.iter().map(|b| b.pending()).collect();
            assert_eq!(pending, [25, 75, 0, 0], "c and d {how}");
            drop(held);
        }
    }
}
