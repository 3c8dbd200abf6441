//! Round robin, the article's algorithm: each backend in turn, a b c a b c.
//!
//! One `AtomicUsize` incremented with `fetch_add`: every caller gets its own
//! turn, so under any number of threads no turn is taken twice or skipped. A
//! backend that is down gives its turn to the next available one.
//!
//! # Corresponds to the C article
//!
//! `get_next_server_id(int* cur_id)`: `*cur_id = (*cur_id + 1) % _NUM_SERVERS`,
//! kept in a local variable of `main`, safe there only because one thread
//! accepts. The atomic gives the same sequence and stays exact when many
//! threads pick.

use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::{first_available, Snapshot, Strategy};

/// See the module docs.
pub(crate) struct RoundRobin;

impl Strategy for RoundRobin {
    fn name(&self) -> &'static str {
        "round-robin"
    }

    fn choose(&self, snap: &Snapshot, _peer: IpAddr, turn: &AtomicUsize) -> Option<usize> {
        let turn = turn.fetch_add(1, Ordering::Relaxed);
        first_available(&snap.list, turn % snap.list.len())
    }
}
