//! First (HAProxy's `balance first`): the first available backend in list
//! order with a free slot under its `max_connections` takes the client. A
//! backend without a cap takes every client that reaches it, so the list
//! is filled from the top and the backends at its end stay idle until the
//! ones before are full: they can be scaled down.
//!
//! With every backend at its cap, the first available one is chosen and
//! the pick finds it full: the client waits in the service's waitlist.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C only rotates.

use std::net::IpAddr;
use std::sync::atomic::AtomicUsize;

use super::{first_available, Snapshot, Strategy};

/// See the module docs.
pub(crate) struct First;

impl Strategy for First {
    fn name(&self) -> &'static str {
        "first"
    }

    fn choose(&self, snap: &Snapshot, _peer: IpAddr, _turn: &AtomicUsize) -> Option<usize> {
        // Checked again here, not only in `up`: see "Availability".
        let list = &snap.list;
        let free = snap
            .up
            .iter()
            .copied()
            .find(|&i| list[i].is_available() && list[i].has_free_slot());
        free.or_else(|| first_available(list, 0))
    }
}

#[cfg(test)]
mod tests {
    use crate::scheduler::tests::{backends, PEER};
    use crate::scheduler::{Algorithm, Pick, Scheduler};

    #[test]
    fn fills_the_first_backend_to_its_cap_before_the_next() {
        let list = backends(3);
        list[0].set_max_connections(Some(2));
        list[1].set_max_connections(Some(3));
        let s = Scheduler::with_algorithm(list.clone(), Algorithm::First);
        // Held picks count against the caps.
        let held: Vec<Pick> = (0..5).map(|_| s.pick(PEER).unwrap()).collect();
        let order: Vec<usize> = held.iter().map(|p| p.server_idx).collect();
        assert_eq!(order, [0, 0, 1, 1, 1]);
        // c has no cap: it takes all the rest.
        let more: Vec<Pick> = (0..4).map(|_| s.pick(PEER).unwrap()).collect();
        assert!(more.iter().all(|p| p.server_idx == 2));
        drop(more);
        // a frees a slot: the next client goes back to a.
        let mut held = held;
        held.remove(0);
        assert_eq!(s.pick(PEER).unwrap().server_idx, 0);
        assert_eq!(list[1].pending(), 3, "b is still full");
    }

    #[test]
    fn below_the_cap_the_second_backend_gets_nothing() {
        let list = backends(2);
        list[0].set_max_connections(Some(5));
        let s = Scheduler::with_algorithm(list.clone(), Algorithm::First);
        for _ in 0..100 {
            let a = list[0].start_connection();
            assert_eq!(s.pick(PEER).unwrap().server_idx, 0);
            drop(a);
        }
        assert_eq!(list[1].total(), 0);
        // Without caps the first takes everything.
        let s = Scheduler::with_algorithm(backends(3), Algorithm::First);
        let held: Vec<Pick> = (0..50).map(|_| s.pick(PEER).unwrap()).collect();
        assert!(held.iter().all(|p| p.server_idx == 0));
    }

    #[test]
    fn skips_backends_out_of_rotation_and_waits_when_all_are_full() {
        let list = backends(3);
        for b in &list {
            b.set_max_connections(Some(1));
        }
        list[0].set_healthy(false);
        let s = Scheduler::with_algorithm(list.clone(), Algorithm::First);
        let one = s.pick(PEER).unwrap();
        let two = s.pick(PEER).unwrap();
        assert_eq!((one.server_idx, two.server_idx), (1, 2));
        assert!(s.pick(PEER).is_none());
        assert!(s.any_available(), "full, not gone: the client waits");
        drop(one);
        assert_eq!(s.pick(PEER).unwrap().server_idx, 1);
    }
}
