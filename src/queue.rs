//! The FIFO queue between the accept loop and the workers: a
//! `parking_lot::Mutex` around a bounded `VecDeque`, plus two condition
//! variables. `not_empty` wakes one idle worker per push; `not_full` makes a
//! push wait while the queue is full, so new clients wait in the kernel's
//! listen backlog and memory stays bounded. It counts its idle consumers, so
//! the pool knows when to spawn ([`Queue::push`]); [`Queue::close`] ends it;
//! [`Queue::pop_or_retire`] lets an idle consumer leave, decided under the
//! lock. Why two condition variables, and why a push notifies before it
//! unlocks: docs/internals.md, "The queue".
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
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

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
            }),
            not_empty: Condvar::new(),
            not_full: Condvar::new(),
        }
    }

    /// Appends an entry, waiting while the queue is full.
    ///
    /// # Errors
    ///
    /// Gives the entry back when the queue is closed (before or while
    /// waiting), so the caller can close the client cleanly.
    pub fn push(&self, item: T) -> Result<Pushed, T> {
        let mut state = self.state.lock();
        while state.items.len() >= state.capacity && !state.closed {
            self.not_full.wait(&mut state);
        }
        if state.closed {
            return Err(item);
        }
        state.items.push_back(item);
        let unserved = state.items.len().saturating_sub(state.idle);
        // Notify while still holding the lock. With a parking_lot condvar
        // this does not wake the worker into a mutex we hold (the usual
        // reason to notify after unlocking): it moves the worker from the
        // condvar's queue to the mutex's, and the unlock just below wakes
        // it: fewer context switches per connection than unlock-then-notify
        // (docs/benchmarks.md has the measurement).
        self.not_empty.notify_one();
        drop(state);
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
        let mut state = self.state.lock();
        loop {
            if let Some(item) = state.items.pop_front() {
                drop(state);
                self.not_full.notify_one();
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
            if let Some(idle) = idle.take() {
                deadline = Instant::now().checked_add(idle);
            }
            state.idle += 1;
            // Timed out or not, the loop looks at the queue again first.
            expired = match deadline {
                Some(d) => self.not_empty.wait_until(&mut state, d).timed_out(),
                None => {
                    self.not_empty.wait(&mut state);
                    false
                }
            };
            state.idle -= 1;
        }
    }

    /// Closes the queue: pushes fail from now on, waiting pushes return
    /// their entry, and pops drain what is left, then return `None`.
    pub fn close(&self) {
        self.state.lock().closed = true;
        self.not_empty.notify_all();
        self.not_full.notify_all();
    }

    /// Entries waiting now.
    pub fn len(&self) -> usize {
        self.state.lock().items.len()
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

    #[test]
    fn unserved_counts_entries_beyond_idle_consumers() {
        let q = Queue::new(10);
        assert_eq!(q.push(1).unwrap().unserved, 1);
        assert_eq!(q.push(2).unwrap().unserved, 2);
    }
}
