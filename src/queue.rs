//! The FIFO queue between the accept loop and the workers: a
//! `std::sync::Mutex` around a bounded `VecDeque`, plus two condition
//! variables. `not_empty` wakes one idle worker per push; `not_full` makes a
//! push wait while the queue is full, so new clients wait in the kernel's
//! listen backlog and memory stays bounded. It counts its idle consumers, so
//! the pool knows when to spawn ([`Queue::push`]); [`Queue::close`] ends it;
//! [`Queue::pop_or_retire`] lets an idle consumer leave, decided under the
//! lock. Why the standard library's lock, why a push wakes a worker after it
//! unlocks and only when one waits: docs/internals.md, "The queue".
//!
//! # Threads
//!
//! One producer (the accept loop, through [`crate::pool::Pool::submit`]),
//! many consumers (the workers). The lock is held only to move an entry in or
//! out (a few instructions), never while a socket is read or written.
//!
//! # Corresponds to the C article
//!
//! `queue.c` / `queue.h` plus the global `queue_mutex`. The C list allocates
//! a node per connection and has no bound, and needs no condition variable
//! because it creates one thread per entry; our workers are reused.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// A bounded, closable, multi-consumer FIFO.
#[derive(Debug)]
pub struct Queue<T> {
    state: Mutex<State<T>>,
    /// Signalled once per push: wakes one waiting consumer.
    not_empty: Condvar,
    /// Signalled once per pop: wakes the producer if it waits for room.
    not_full: Condvar,
}

#[derive(Debug)]
struct State<T> {
    items: VecDeque<T>,
    capacity: usize,
    closed: bool,
    /// Consumers blocked in `pop` right now.
    idle: usize,
    /// Producers blocked in `push` on a full queue right now.
    blocked: usize,
}

/// What a successful push tells the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pushed {
    /// Entries in the queue that no idle consumer is already waiting for.
    /// When above zero, another consumer is needed to serve them promptly.
    pub unserved: usize,
}

/// What [`Queue::pop_or_retire`] hands back.
#[derive(Debug, PartialEq, Eq)]
pub enum Popped<T> {
    /// The oldest entry.
    Entry(T),
    /// The queue is closed and empty: the consumer ends.
    Closed,
    /// The consumer waited the whole idle time for nothing and was allowed
    /// to leave: it is no longer counted idle, so a later push knows to
    /// ask for another.
    Retired,
}

impl<T> Queue<T> {
    /// An empty queue holding at most `capacity` entries (at least 1).
    pub fn new(capacity: usize) -> Queue<T> {
        let capacity = capacity.max(1);
        Queue {
            state: Mutex::new(State {
                items: VecDeque::with_capacity(capacity.min(4096)),
                capacity,
                closed: false,
                idle: 0,
                blocked: 0,
            }),
            not_empty: Condvar::new(),
            not_full: Condvar::new(),
        }
    }

    /// The state, locked. A consumer that panicked cannot leave the state
    /// half-changed (every change is a single push, pop or count), so a
    /// poisoned lock is taken as it is.
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends an entry, waiting while the queue is full.
    ///
    /// # Errors
    ///
    /// Gives the entry back when the queue is closed (before or while
    /// waiting), so the caller can close the client cleanly.
    pub fn push(&self, item: T) -> Result<Pushed, T> {
        let mut state = self.lock();
        while state.items.len() >= state.capacity && !state.closed {
            state.blocked += 1;
            state = self
                .not_full
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
            state.blocked -= 1;
        }
        if state.closed {
            return Err(item);
        }
        state.items.push_back(item);
        let unserved = state.items.len().saturating_sub(state.idle);
        let someone_waits = state.idle > 0;
        // Wake after the unlock, so the worker does not wake into a lock
        // still held, and only when one waits: the standard condvar's
        // notify is a system call even with nobody to wake.
        drop(state);
        if someone_waits {
            self.not_empty.notify_one();
        }
        Ok(Pushed { unserved })
    }

    /// Takes the oldest entry, sleeping while the queue is empty. Returns
    /// `None` once the queue is closed and empty.
    pub fn pop(&self) -> Option<T> {
        match self.take(None, || false) {
            Popped::Entry(item) => Some(item),
            Popped::Closed | Popped::Retired => None,
        }
    }

    /// Takes the oldest entry as [`Queue::pop`] does, but once it has
    /// waited `idle` with nothing to take it calls `may_retire`, under the
    /// queue's lock: `true` returns [`Popped::Retired`]. The caller does
    /// whatever makes its leaving count in there (the pool lowers its
    /// count of live workers), so a push never relies on a consumer that
    /// has decided to go.
    ///
    /// `false` (the pool is at its floor) makes it wait for the next entry
    /// with no time limit: a consumer kept for good should not wake every
    /// `idle` for nothing, and a short `idle` would make that a busy loop.
    pub fn pop_or_retire(&self, idle: Duration, may_retire: impl FnMut() -> bool) -> Popped<T> {
        self.take(Some(idle), may_retire)
    }

    /// The one consumer loop behind [`Queue::pop`] and
    /// [`Queue::pop_or_retire`]; `idle: None` never retires.
    fn take(&self, idle: Option<Duration>, mut may_retire: impl FnMut() -> bool) -> Popped<T> {
        // The idle time counts from the first wait, so an entry already
        // waiting is taken without reading the clock; a wake-up that finds
        // the entry taken by another consumer does not restart it. (A time
        // too far to represent is no limit.)
        let mut idle = idle;
        let mut deadline = None;
        let mut expired = false;
        let mut state = self.lock();
        loop {
            if let Some(item) = state.items.pop_front() {
                let producer_waits = state.blocked > 0;
                drop(state);
                if producer_waits {
                    self.not_full.notify_one();
                }
                return Popped::Entry(item);
            }
            if state.closed {
                return Popped::Closed;
            }
            if expired {
                if may_retire() {
                    return Popped::Retired;
                }
                deadline = None;
            }
            let left = match idle.take() {
                Some(idle) => {
                    deadline = Instant::now().checked_add(idle);
                    deadline.map(|_| idle)
                }
                None => deadline.map(|d| d.saturating_duration_since(Instant::now())),
            };
            state.idle += 1;
            // Timed out or not, the loop looks at the queue again first.
            (state, expired) = match left {
                Some(left) => {
                    let (state, waited) = self
                        .not_empty
                        .wait_timeout(state, left)
                        .unwrap_or_else(PoisonError::into_inner);
                    (state, waited.timed_out())
                }
                None => (
                    self.not_empty
                        .wait(state)
                        .unwrap_or_else(PoisonError::into_inner),
                    false,
                ),
            };
            state.idle -= 1;
        }
    }

    /// Closes the queue: pushes fail from now on, waiting pushes return
    /// their entry, and pops drain what is left, then return `None`.
    pub fn close(&self) {
        self.lock().closed = true;
        self.not_empty.notify_all();
        self.not_full.notify_all();
    }

    /// Entries waiting now.
    pub fn len(&self) -> usize {
        self.lock().items.len()
    }

    /// True when no entry waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn fifo_order() {
        let q = Queue::new(10);
        for i in 0..5 {
            q.push(i).unwrap();
        }
        let out: Vec<i32> = (0..5).map(|_| q.pop().unwrap()).collect();
        assert_eq!(out, [0, 1, 2, 3, 4]);
        assert!(q.is_empty());
    }

    #[test]
    fn close_drains_then_ends() {
        let q = Queue::new(10);
        q.push(1).unwrap();
        q.push(2).unwrap();
        q.close();
        assert_eq!(q.push(3), Err(3));
        assert_eq!(q.pop(), Some(1));
        assert_eq!(q.pop(), Some(2));
        assert_eq!(q.pop(), None);
    }

    #[test]
    fn close_wakes_a_waiting_consumer() {
        let q = Arc::new(Queue::<u8>::new(1));
        let (tx, rx) = crossbeam_channel::bounded(1);
        let q2 = Arc::clone(&q);
        let t = std::thread::spawn(move || tx.send(q2.pop()).unwrap());
        q.close();
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(None));
        t.join().unwrap();
    }

    #[test]
    fn full_queue_blocks_the_producer_until_a_pop() {
        let q = Arc::new(Queue::new(1));
        q.push(1).unwrap();
        let (tx, rx) = crossbeam_channel::bounded(1);
        let q2 = Arc::clone(&q);
        let t = std::thread::spawn(move || tx.send(q2.push(2).is_ok()).unwrap());
        // The producer cannot finish while the queue is full.
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
        assert_eq!(q.pop(), Some(1));
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(true));
        assert_eq!(q.pop(), Some(2));
        t.join().unwrap();
    }

    #[test]
    fn an_idle_consumer_retires_after_its_idle_time() {
        let q = Queue::<u8>::new(4);
        let from = Instant::now();
        assert_eq!(
            q.pop_or_retire(Duration::from_millis(50), || true),
            Popped::Retired
        );
        assert!(from.elapsed() >= Duration::from_millis(50));
        // Gone: a push is not counted as taken by it.
        assert_eq!(q.push(1).unwrap().unserved, 1);
        // An entry there is taken, whatever the idle time.
        assert_eq!(q.pop_or_retire(Duration::ZERO, || true), Popped::Entry(1));
        q.close();
        assert_eq!(q.pop_or_retire(Duration::ZERO, || true), Popped::Closed);
    }

    #[test]
    fn a_consumer_kept_waits_for_work_without_waking() {
        let q = Arc::new(Queue::new(4));
        let (asked_tx, asked_rx) = crossbeam_channel::unbounded();
        let q2 = Arc::clone(&q);
        let t = std::thread::spawn(move || {
            q2.pop_or_retire(Duration::from_millis(5), || {
                asked_tx.send(()).unwrap();
                false
            })
        });
        asked_rx.recv_timeout(Duration::from_secs(5)).unwrap();
        // Refused once, it waits for work: asked again, it would be a
        // wake-up every 5 ms for nothing.
        assert!(asked_rx.recv_timeout(Duration::from_millis(100)).is_err());
        q.push(7).unwrap();
        assert_eq!(t.join().unwrap(), Popped::Entry(7));
    }

    #[test]
    fn a_push_during_the_decision_waits_and_finds_the_consumer_gone() {
        let q = Arc::new(Queue::new(4));
        let (deciding_tx, deciding_rx) = crossbeam_channel::bounded(1);
        let (decide_tx, decide_rx) = crossbeam_channel::bounded::<bool>(1);
        let q2 = Arc::clone(&q);
        let consumer = std::thread::spawn(move || {
            q2.pop_or_retire(Duration::from_millis(1), || {
                deciding_tx.send(()).unwrap();
                decide_rx.recv_timeout(Duration::from_secs(5)).unwrap()
            })
        });
        deciding_rx.recv_timeout(Duration::from_secs(5)).unwrap();
        let (pushed_tx, pushed_rx) = crossbeam_channel::bounded(1);
        let q3 = Arc::clone(&q);
        let producer = std::thread::spawn(move || pushed_tx.send(q3.push(9)).unwrap());
        // The decision holds the lock: the push cannot count the consumer
        // as idle while it is deciding to leave.
        assert!(pushed_rx.recv_timeout(Duration::from_millis(100)).is_err());
        decide_tx.send(true).unwrap();
        assert_eq!(consumer.join().unwrap(), Popped::Retired);
        let pushed = pushed_rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(pushed, Ok(Pushed { unserved: 1 }), "asks for a consumer");
        producer.join().unwrap();
        assert_eq!(q.pop(), Some(9));
    }

    /// A push wakes a consumer only when one is counted idle, and a pop
    /// wakes the producer only when it is counted blocked: a count that
    /// went wrong would leave an entry or a push asleep, and the channel
    /// below would time out instead of receiving every entry.
    #[test]
    fn no_wake_up_is_lost_between_three_consumers_and_a_blocked_producer() {
        const ENTRIES: u32 = 20_000;
        let q = Arc::new(Queue::new(2));
        let (tx, rx) = crossbeam_channel::unbounded();
        let consumers: Vec<_> = (0..3)
            .map(|n| {
                let (q, tx) = (Arc::clone(&q), tx.clone());
                std::thread::spawn(move || loop {
                    // One consumer retires and comes back over and over.
                    match q.pop_or_retire(Duration::from_micros(50 * n), || n == 0) {
                        Popped::Entry(entry) => tx.send(entry).unwrap(),
                        Popped::Retired => continue,
                        Popped::Closed => return,
                    }
                })
            })
            .collect();
        drop(tx);
        let producer = {
            let q = Arc::clone(&q);
            std::thread::spawn(move || (0..ENTRIES).all(|entry| q.push(entry).is_ok()))
        };
        let mut seen = vec![false; ENTRIES as usize];
        for _ in 0..ENTRIES {
            let entry = rx
                .recv_timeout(Duration::from_secs(10))
                .expect("an entry left asleep");
            assert!(
                !std::mem::replace(&mut seen[entry as usize], true),
                "{entry} twice"
            );
        }
        assert!(producer.join().unwrap());
        q.close();
        for consumer in consumers {
            consumer.join().unwrap();
        }
    }

    /// Each push finds the one consumer asleep on the empty queue (it
    /// answers before the next push) and must wake it.
    #[test]
    fn a_lone_sleeping_consumer_is_woken_by_every_push() {
        let q = Arc::new(Queue::new(4));
        let (tx, rx) = crossbeam_channel::unbounded();
        let consumer = {
            let q = Arc::clone(&q);
            std::thread::spawn(move || {
                while let Some(entry) = q.pop() {
                    tx.send(entry).unwrap();
                }
            })
        };
        for entry in 0..1_000 {
            q.push(entry).unwrap();
            assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok(entry));
        }
        q.close();
        consumer.join().unwrap();
    }

    #[test]
    fn unserved_counts_entries_beyond_idle_consumers() {
        let q = Queue::new(10);
        assert_eq!(q.push(1).unwrap().unserved, 1);
        assert_eq!(q.push(2).unwrap().unserved, 2);
    }
}
