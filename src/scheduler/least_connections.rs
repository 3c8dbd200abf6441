//! Least connections: the available backend with the fewest connections,
//! divided by its weight; ties in rotation from a round-robin turn, so
//! equal backends still alternate.
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

use super::{least_loaded, Snapshot, Strategy};

/// See the module docs.
pub(crate) struct LeastConnections;

impl Strategy for LeastConnections {
    fn name(&self) -> &'static str {
        "least-connections"
    }

    fn choose(&self, snap: &Snapshot, _peer: IpAddr, turn: &AtomicUsize) -> Option<usize> {
        let turn = turn.fetch_add(1, Ordering::Relaxed);
        least_loaded(&snap.list, turn % snap.list.len())
    }

    fn reserves(&self) -> bool {
        true
    }
}
