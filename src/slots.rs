//! A service's `max_connections`: a count of the clients it holds, queued
//! or served, that the accept loop waits on before it accepts another
//! (HAProxy's frontend `maxconn`). While the count is at its limit, the
//! service's new clients wait in the kernel's backlog, so one busy service
//! cannot take every worker from the others.
//!
//! # Threads
//!
//! The accept loops of the service take slots; the worker that ends a
//! client (or the accept loop that refuses it) gives its slot back by
//! dropping it. A mutex and a condition variable; the lock is held for a
//! count's change only.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C accepts whenever a thread can be found.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

/// The count of one service's clients, up to its limit.
#[derive(Debug)]
pub struct Slots {
    limit: usize,
    held: Mutex<usize>,
    freed: Condvar,
}

/// One client's place in its service's count, given back when dropped.
#[derive(Debug)]
pub struct Slot(Arc<Slots>);

impl Slots {
    /// Room for `limit` clients at once.
    pub fn new(limit: usize) -> Arc<Slots> {
        Arc::new(Slots {
            limit,
            held: Mutex::new(0),
            freed: Condvar::new(),
        })
    }

    /// A slot, waiting at most `wait` for one to be free.
    pub fn take(self: &Arc<Self>, wait: Duration) -> Option<Slot> {
        let mut held = self.held.lock();
        if *held >= self.limit {
            let _ = self.freed.wait_for(&mut held, wait);
            if *held >= self.limit {
                return None;
            }
        }
        *held += 1;
        Some(Slot(Arc::clone(self)))
    }

    /// Clients held now.
    pub fn held(&self) -> usize {
        *self.held.lock()
    }

    /// The limit.
    pub fn limit(&self) -> usize {
        self.limit
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        *self.0.held.lock() -= 1;
        self.0.freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_holds_and_a_slot_given_back_is_taken_again() {
        let slots = Slots::new(2);
        let a = slots.take(Duration::ZERO).unwrap();
        let _b = slots.take(Duration::ZERO).unwrap();
        assert_eq!(slots.held(), 2);
        assert!(slots.take(Duration::from_millis(10)).is_none());
        let waiter = {
            let slots = Arc::clone(&slots);
            std::thread::spawn(move || slots.take(Duration::from_secs(10)).is_some())
        };
        drop(a);
        assert!(waiter.join().unwrap());
        // The waiter's slot was dropped with its thread's result.
        assert_eq!(slots.held(), 1);
    }
}
