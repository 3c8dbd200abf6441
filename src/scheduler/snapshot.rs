//! A snapshot of the backend list: one immutable version of it, with what
//! the algorithms precompute from it (the backends in rotation and those
//! available, the smooth weighted cycle, the names' hashes, a slow start
//! under way), and the pick of one of its backends.
//!
//! Built by the thread that changes the list or flips a backend (a
//! reload, the admin API, the health thread, a worker) and then only read,
//! by the accept loop and the workers, through an `Arc` swapped under the
//! scheduler's `RwLock`.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C's `servers[]` array never changes.

use std::sync::Arc;

use super::ramp::Ramp;
use super::{backup, first_available, ip_hash, weighted, Algorithm, Pick};
use crate::backend::Backend;

/// One immutable version of the backend list, with what the algorithms
/// precompute from it and from which backends were available.
#[derive(Debug)]
pub(crate) struct Snapshot {
    /// The backends, in the order given.
    pub(super) all: Arc<[Arc<Backend>]>,
    /// The backends in rotation, those the algorithm picks from: `all`
    /// itself (the same `Arc`) unless some are backups (`backup.rs`).
    pub(crate) list: Arc<[Arc<Backend>]>,
    /// Where each of `list` is in `all`, when `list` is not `all`.
    pub(super) places: Option<Box<[usize]>>,
    /// A slow start under way when this was built (`ramp.rs`), or none.
    pub(super) ramp: Option<Ramp>,
    /// The positions in `list` of the backends available when this
    /// snapshot was built, in list order.
    pub(crate) up: Box<[usize]>,
    /// The smooth weighted round-robin cycle over the backends in `up`:
    /// positions in `list`, one per unit of weight (after dividing their
    /// weights by their gcd). Empty when none is available, or when the
    /// algorithm is not weighted round robin.
    pub(crate) cycle: Box<[u32]>,
    /// Per backend, the hash of its name (rendezvous hashing).
    pub(crate) keys: Box<[u64]>,
    /// Whether every weight is the same (ip-hash then needs no floats).
    pub(crate) uniform: bool,
    /// The algorithm picking from this list (changed like the list).
    pub(super) algorithm: Algorithm,
}

impl Snapshot {
    /// Reads each backend's state now: build it only once the backends
    /// tell this scheduler of their flips (see [`Scheduler::change_with`](super::Scheduler::change_with)).
    /// `ramp_ms` is the slow start (0: off).
    pub(super) fn new(all: Arc<[Arc<Backend>]>, algorithm: Algorithm, ramp_ms: u64) -> Snapshot {
        let (list, places) = backup::rotation(&all);
        let weights: Vec<u32> = list.iter().map(|b| b.weight()).collect();
        let up: Box<[usize]> = (0..list.len())
            .filter(|&i| list[i].is_available())
            .collect();
        // Only weighted round robin reads the cycle, the costly part (a
        // change of algorithm builds a new snapshot): fail-over builds
        // snapshots of its own (`failover.rs`) and pays only for its
        // algorithm's.
        let cycle = match algorithm {
            Algorithm::WeightedRoundRobin => {
                let up_weights: Vec<u32> = up.iter().map(|&i| weights[i]).collect();
                weighted::smooth_cycle(&up_weights)
                    .into_iter()
                    .map(|k| up[k as usize] as u32)
                    .collect()
            }
            _ => Box::default(),
        };
        let keys = list.iter().map(|b| ip_hash::hash_name(b.name())).collect();
        let uniform = weights.windows(2).all(|w| w[0] == w[1]);
        let ramp = Ramp::of(&list, ramp_ms);
        Snapshot {
            all,
            list,
            places,
            ramp,
            up,
            cycle,
            keys,
            uniform,
            algorithm,
        }
    }

    /// The available backend whose turn `turn` is, in rotation over the
    /// available ones: with `m` available, each gets exactly one turn in
    /// every `m` in a row, whichever others are out.
    pub(crate) fn in_turn(&self, turn: usize) -> Option<usize> {
        let start = match self.up.len() {
            // None was available when this was built; one may have come
            // back since (its rebuild is on its way): look at them all.
            0 => turn % self.list.len(),
            m => self.up[turn % m],
        };
        // Checked again: see "Availability" in the module docs.
        first_available(&self.list, start)
    }
}

impl Snapshot {
    /// The pick of `list[idx]`, reserved if the algorithm counts picks.
    #[inline]
    /// Where the backend at `idx` of `list` is in the whole list.
    pub(crate) fn place(&self, idx: usize) -> usize {
        self.places.as_ref().map_or(idx, |places| places[idx])
    }

    pub(super) fn pick_at(&self, idx: usize) -> Pick {
        let backend = Arc::clone(&self.list[idx]);
        let reservation = self
            .algorithm
            .strategy()
            .reserves()
            .then(|| backend.reserve());
        Pick {
            server_idx: self.place(idx),
            backend,
            _reservation: reservation,
        }
    }
}
