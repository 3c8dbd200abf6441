//! Chooses the backend for each new connection.
//!
//! The accept loop calls [`Scheduler::pick`] once per accepted client; the
//! answer travels with the client through the queue to a worker. The backend
//! list is an immutable snapshot (`Arc<[Arc<Backend>]>`) behind a read-write
//! lock: a pick clones the `Arc` (one atomic increment under a read lock held
//! for a few instructions), so changing the list never waits for traffic and
//! traffic never waits for a change longer than that.
//!
//! Round robin is one `AtomicUsize` incremented with `fetch_add`: every caller
//! gets its own turn, so under any number of threads no turn is taken twice
//! or skipped. Backends that are down or draining are passed over.
//!
//! # Corresponds to the C article
//!
//! `get_next_server_id(int* cur_id)`: `*cur_id = (*cur_id + 1) % _NUM_SERVERS`.
//! The C keeps the index in `main`'s local variable, which is only safe because
//! one thread accepts. The atomic counter here gives the same sequence
//! (0, 1, 2, 0, 1, 2, ...) and stays exact when many threads pick.

use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::backend::Backend;

/// The backend chosen for one connection.
#[derive(Debug, Clone)]
pub struct Pick {
    /// The backend's position in the snapshot it was picked from (the C's
    /// `server_idx`); for logs and tests. The worker uses `backend`, which
    /// keeps meaning the same server even if the list changes meanwhile.
    pub server_idx: usize,
    /// The backend itself.
    pub backend: Arc<Backend>,
}

/// The backend list and the round-robin turn.
#[derive(Debug)]
pub struct Scheduler {
    /// The current list; replaced whole, never edited in place.
    backends: RwLock<Arc<[Arc<Backend>]>>,
    /// The next round-robin turn (taken modulo the list length).
    next: AtomicUsize,
}

impl Scheduler {
    /// A scheduler over these backends, starting with the first.
    pub fn new(backends: Vec<Arc<Backend>>) -> Scheduler {
        Scheduler {
            backends: RwLock::new(backends.into()),
            next: AtomicUsize::new(0),
        }
    }

    /// The current backend list.
    pub fn snapshot(&self) -> Arc<[Arc<Backend>]> {
        Arc::clone(&self.backends.read())
    }

    /// Picks the backend for a new connection from `peer`, or `None` when no
    /// backend is available (all down or draining, or none configured).
    pub fn pick(&self, _peer: IpAddr) -> Option<Pick> {
        let list = self.snapshot();
        let n = list.len();
        if n == 0 {
            return None;
        }
        let turn = self.next.fetch_add(1, Ordering::Relaxed);
        (0..n)
            .map(|i| (turn + i) % n)
            .find(|&i| list[i].is_available())
            .map(|server_idx| Pick {
                server_idx,
                backend: Arc::clone(&list[server_idx]),
            })
    }

    /// The backends to try after `first` failed to connect: the others in
    /// round-robin order from it, each once, skipping those unavailable.
    pub fn failover_order(&self, first: &Backend) -> Vec<Arc<Backend>> {
        let list = self.snapshot();
        let start = list.iter().position(|b| b.id() == first.id()).unwrap_or(0);
        let n = list.len();
        (1..=n)
            .map(|i| &list[(start + i) % n])
            .filter(|b| b.id() != first.id() && b.is_available())
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn backends(n: usize) -> Vec<Arc<Backend>> {
        (0..n)
            .map(|i| Arc::new(Backend::new(format!("b{i}"), vec![], 1)))
            .collect()
    }

    const PEER: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    #[test]
    fn round_robin_is_a_b_c_a_b_c() {
        let s = Scheduler::new(backends(3));
        let seq: Vec<usize> = (0..7).map(|_| s.pick(PEER).unwrap().server_idx).collect();
        assert_eq!(seq, [0, 1, 2, 0, 1, 2, 0]);
    }

    #[test]
    fn skips_unavailable_backends() {
        let list = backends(3);
        list[1].set_healthy(false);
        let s = Scheduler::new(list.clone());
        let seq: Vec<usize> = (0..4).map(|_| s.pick(PEER).unwrap().server_idx).collect();
        assert_eq!(seq, [0, 2, 2, 0]);
        for b in &list {
            b.set_healthy(false);
        }
        assert!(s.pick(PEER).is_none());
        assert!(Scheduler::new(vec![]).pick(PEER).is_none());
    }

    #[test]
    fn exact_counts_under_many_threads() {
        let s = Arc::new(Scheduler::new(backends(5)));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let s = Arc::clone(&s);
                std::thread::spawn(move || {
                    let mut counts = [0usize; 5];
                    for _ in 0..10_000 {
                        counts[s.pick(PEER).unwrap().server_idx] += 1;
                    }
                    counts
                })
            })
            .collect();
        let mut total = [0usize; 5];
        for t in threads {
            for (i, c) in t.join().unwrap().iter().enumerate() {
                total[i] += c;
            }
        }
        assert_eq!(total, [16_000; 5]);
    }

    #[test]
    fn failover_order_follows_the_rotation() {
        let list = backends(4);
        let s = Scheduler::new(list.clone());
        let order: Vec<String> = s
            .failover_order(&list[2])
            .iter()
            .map(|b| b.name().to_string())
            .collect();
        assert_eq!(order, ["b3", "b0", "b1"]);
    }
}
