//! Round robin, the article's algorithm: each backend in turn, a b c a b c.
//!
//! One `AtomicUsize` incremented with `fetch_add`: every caller gets its own
//! turn, so under any number of threads no turn is taken twice or skipped.
//! The turns go round the backends available (the snapshot's `up`), so one
//! that is out of rotation gives its share to all the others evenly, not to
//! the next one in the list.
//!
//! # Corresponds to the C article
//!
//! `get_next_server_id(int* cur_id)`: `*cur_id = (*cur_id + 1) % _NUM_SERVERS`,
//! kept in a local variable of `main`, safe there only because one thread
//! accepts. The atomic gives the same sequence and stays exact when many
//! threads pick.

use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::{Snapshot, Strategy};

/// See the module docs.
pub(crate) struct RoundRobin;

impl Strategy for RoundRobin {
    fn name(&self) -> &'static str {
        "round-robin"
    }

    fn choose(&self, snap: &Snapshot, _peer: IpAddr, turn: &AtomicUsize) -> Option<usize> {
        snap.in_turn(turn.fetch_add(1, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use crate::scheduler::tests::{backends, names, tally, OUT};
    use crate::scheduler::Scheduler;

    #[test]
    fn an_out_backends_share_is_spread_evenly() {
        for (how, set_out) in OUT {
            let list = backends(4);
            let s = Scheduler::new(list.clone());
            set_out(&list[2], true);
            // a b (c out) d: 80 each of 240, not 60 / 60 / 120 for a, b, d.
            assert_eq!(tally(&s, 240), [80, 80, 0, 80], "c {how}");
            assert_eq!(names(&s, 6), "abdabd", "c {how}");
            set_out(&list[2], false);
            assert_eq!(tally(&s, 240), [60, 60, 60, 60], "c back from {how}");
        }
    }

    #[test]
    fn two_out_side_by_side_do_not_pile_on_the_next_one() {
        let list = backends(6);
        let s = Scheduler::new(list.clone());
        // b down, c draining: d is the next one in the list for both.
        list[1].set_healthy(false);
        list[2].set_draining(true);
        list[4].set_maint(true);
        assert_eq!(tally(&s, 300), [100, 0, 0, 100, 0, 100]);
        // Every backend out, then one back.
        for b in &list {
            b.set_healthy(false);
        }
        assert!(s.pick(crate::scheduler::tests::PEER).is_none());
        list[4].set_maint(false);
        list[4].set_healthy(true);
        assert_eq!(tally(&s, 5), [0, 0, 0, 0, 5, 0]);
    }
}
