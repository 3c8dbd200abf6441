//! A service's queue of clients waiting for a backend slot: when every
//! available backend is at its `max_connections`, a client waits here
//! (HAProxy's backend queue, bounded by `max_queue`, for at most
//! `queue_timeout`) until a slot frees, first come first served.
//!
//! Each waiting client holds a [`Ticket`]; only the first ticket in line
//! may take a slot, so the line drains in order, and a new client that
//! finds anyone waiting joins the line instead of taking a slot that has
//! just freed (see `Scheduler::pick`). A ticket dropped (the client got
//! its slot, gave up, or left) leaves the line wherever it stands, so the
//! count never leaks.
//!
//! # Threads
//!
//! Workers wait here, each for its own client; the worker that ends a
//! connection on a capped backend, and whoever changes the backends
//! (health, reload, admin API), wake them. A `parking_lot` mutex over the
//! line and a condition variable; the lock is held for a few lines, never
//! across I/O. `len` is an atomic, so the accept loop reads it without the
//! lock. A waiter wakes on a change or at its next look at its client, so
//! a wake-up missed between its check and its wait costs a short delay at
//! most, and none thanks to the generation count.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C sends every client to its turn's server.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

/// See the module docs.
#[derive(Debug, Default)]
pub struct Waitlist {
    /// Clients in line now; a copy of `line.tickets.len()` read without
    /// the lock.
    waiting: AtomicUsize,
    /// The line itself.
    line: Mutex<Line>,
    /// Signalled on every change: a slot freed, a ticket left, a backend
    /// changed.
    changed: Condvar,
}

/// The tickets in line, oldest first.
#[derive(Debug, Default)]
struct Line {
    /// The number of the next ticket given.
    next: u64,
    /// The tickets waiting, in the order they came.
    tickets: VecDeque<u64>,
    /// Raised at every change, so that a waiter that looked at the
    /// backends before a change does not sleep through it.
    generation: u64,
}

/// One client's place in line; leaves the line when dropped.
#[derive(Debug)]
pub struct Ticket<'a> {
    list: &'a Waitlist,
    number: u64,
}

impl Waitlist {
    /// Clients waiting now.
    pub fn len(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// Whether no client waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A place at the end of the line, or `None` when `max` clients wait
    /// already.
    pub fn join(&self, max: usize) -> Option<Ticket<'_>> {
        let mut line = self.line.lock();
        if line.tickets.len() >= max {
            return None;
        }
        let number = line.next;
        line.next += 1;
        line.tickets.push_back(number);
        self.waiting.store(line.tickets.len(), Ordering::Release);
        Some(Ticket { list: self, number })
    }

    /// Wakes the waiters to look again: a slot may have freed. Costs one
    /// atomic load when nobody waits.
    pub fn notify(&self) {
        if self.is_empty() {
            return;
        }
        self.changed_now(&mut self.line.lock());
    }

    fn changed_now(&self, line: &mut Line) {
        line.generation = line.generation.wrapping_add(1);
        self.changed.notify_all();
    }
}

impl Ticket<'_> {
    /// Whether this ticket is the first in line (the one that may take a
    /// slot), and the generation to hand to [`Ticket::wait`] after looking.
    pub fn first(&self) -> (bool, u64) {
        let line = self.list.line.lock();
        (line.tickets.front() == Some(&self.number), line.generation)
    }

    /// Sleeps until something changes after `seen` (a generation from
    /// [`Ticket::first`]) or `until` passes.
    pub fn wait(&self, seen: u64, until: Instant) {
        let mut line = self.list.line.lock();
        if line.generation == seen {
            self.list.changed.wait_until(&mut line, until);
        }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let mut line = self.list.line.lock();
        if let Some(at) = line.tickets.iter().position(|&t| t == self.number) {
            line.tickets.remove(at);
        }
        self.list
            .waiting
            .store(line.tickets.len(), Ordering::Release);
        // The next in line may take the slot this one leaves.
        self.list.changed_now(&mut line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_line_is_first_come_first_served_and_bounded() {
        let w = Waitlist::default();
        let a = w.join(3).unwrap();
        let b = w.join(3).unwrap();
        let c = w.join(3).unwrap();
        assert!(w.join(3).is_none(), "full at 3");
        assert_eq!(w.len(), 3);
        assert!(a.first().0 && !b.first().0 && !c.first().0);
        // One in the middle leaves: the order of the others stays.
        drop(b);
        assert_eq!(w.len(), 2);
        assert!(a.first().0 && !c.first().0);
        drop(a);
        assert!(c.first().0);
        let d = w.join(3).unwrap();
        assert!(!d.first().0);
        drop((c, d));
        assert!(w.is_empty());
    }

    #[test]
    fn a_change_after_the_look_is_not_slept_through() {
        let w = Waitlist::default();
        let t = w.join(1).unwrap();
        let (_, seen) = t.first();
        w.notify();
        let started = Instant::now();
        t.wait(seen, Instant::now() + Duration::from_secs(30));
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn a_waiter_is_woken_by_a_notify_from_another_thread() {
        let w = Waitlist::default();
        let t = w.join(1).unwrap();
        let (_, seen) = t.first();
        let started = Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                // Before or after the waiter sleeps: the generation
                // makes the order irrelevant.
                w.notify();
            });
            t.wait(seen, Instant::now() + Duration::from_secs(30));
        });
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}
