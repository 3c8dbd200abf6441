//! The bounded pool of worker threads.
//!
//! Workers are OS threads with a small fixed stack (64 KiB by default), spawned
//! on demand and reused. [`Pool::submit`] pushes an entry into the [`Queue`];
//! if no idle worker is waiting for it and fewer than `max_workers` threads
//! exist, it spawns one more. A worker runs `pop → handle → pop → ...` until
//! the queue is closed and empty, then exits. So the pool grows to the
//! largest number of connections that were open at once (never more than the
//! limit) and then stays that size, its idle threads asleep on the queue's
//! condition variable.
//!
//! Who touches it: the accept loop calls [`Pool::submit`]; the workers pop;
//! the shutdown trigger (through `Pool::closer`) and `run` close it, and `run`
//! waits in [`Pool::wait_exit`]. The count of live workers is an atomic,
//! claimed with a compare-and-swap before a spawn so the limit holds without
//! a lock; a `Mutex<()>` and `Condvar` let `wait_exit` sleep until the last
//! worker leaves instead of polling. What the pool counts (workers alive and
//! busy, panics, failed spawns) goes to the shared [`Stats`] table.
//!
//! A panic while handling one entry is caught with `catch_unwind`, counted and
//! logged; the worker then goes on with the next entry, so a bug that one
//! client can trigger cannot shrink the pool. (The entry's sockets are
//! dropped, hence closed, as the panic unwinds.)
//!
//! # Corresponds to the C article
//!
//! `pthread_t threads[_MAX_THREAD_NUM]`, `get_next_thread()`, `pthread_create`
//! with `pthread_attr_setstacksize(&attrs, _THREAD_STACK_SIZE)`. The C creates
//! a thread per connection and, from the 4096th connection on, joins the
//! thread of slot `i % 4096` before reusing the slot. That join blocks the
//! accept loop behind whatever connection that slot serves (head-of-line
//! blocking), and on the 4096th connection it joins a slot that never held a
//! thread, fails, and calls `exit()`. Here nothing ever waits on a particular
//! thread: idle workers wait for work, and the accept loop never waits for a
//! worker.

use std::cell::Cell;
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::queue::Queue;
use crate::stats::Stats;

/// What a worker does with each entry.
pub type Handler<T> = dyn Fn(T) + Send + Sync + 'static;

/// The pool: a queue and the threads that serve it.
pub struct Pool<T: Send + 'static> {
    queue: Arc<Queue<T>>,
    shared: Arc<Shared>,
    stats: Arc<Stats>,
    handler: Arc<Handler<T>>,
    max_workers: usize,
    stack_size: usize,
}

/// State the workers share with the pool.
#[derive(Debug, Default)]
struct Shared {
    /// Worker threads alive now (spawned and not yet exited).
    live: AtomicUsize,
    /// Guards nothing but lets `wait_exit` sleep until `live` reaches 0.
    exit_lock: Mutex<()>,
    exited: Condvar,
    /// Workers started so far: the next one gets this plus one as its
    /// number (see [`worker_number`]).
    spawned: AtomicUsize,
    /// Spawns that failed since the last one that worked: the next spawn
    /// that works starts this many more (see `Pool::grow`).
    failed_spawns: AtomicUsize,
}

thread_local! {
    /// This thread's worker number; 0 on a thread that is not a worker.
    static WORKER_NUMBER: Cell<usize> = const { Cell::new(0) };
}

/// The number of the worker thread calling it (1 for the first worker a
/// pool started, 2 for the next, ...), or 0 on any other thread. The
/// trace uses it to say which worker took a client.
pub fn worker_number() -> usize {
    WORKER_NUMBER.with(Cell::get)
}

impl<T: Send + 'static> Pool<T> {
    /// A pool with no thread yet.
    ///
    /// `max_workers` is at least 1; `stack_size` is each thread's stack in
    /// bytes; `queue_capacity` bounds the entries waiting for a worker;
    /// `stats` gets the pool's counters.
    pub fn new(
        max_workers: usize,
        stack_size: usize,
        queue_capacity: usize,
        stats: Arc<Stats>,
        handler: Arc<Handler<T>>,
    ) -> Pool<T> {
        Pool {
            queue: Arc::new(Queue::new(queue_capacity)),
            shared: Arc::new(Shared::default()),
            stats,
            handler,
            max_workers: max_workers.max(1),
            stack_size,
        }
    }

    /// Queues an entry for a worker, spawning a thread if none is idle and
    /// the limit allows. Waits while the queue is full.
    ///
    /// # Errors
    ///
    /// Gives the entry back once the pool is closed.
    pub fn submit(&self, job: T) -> Result<(), T> {
        let pushed = self.queue.push(job)?;
        if pushed.unserved > 0 {
            self.grow();
        }
        Ok(())
    }

    /// Spawns one worker unless the limit is reached; after spawns that
    /// failed, more.
    fn grow(&self) {
        if !self.grow_one() {
            return;
        }
        // Each failed spawn left an entry queued with no worker coming for
        // it, and nothing else would start one until more clients arrive.
        // Threads start again, so make those up now.
        let owed = self.shared.failed_spawns.swap(0, Ordering::AcqRel);
        for _ in 0..owed {
            if !self.grow_one() {
                break;
            }
        }
    }

    /// Spawns one worker unless the limit is reached; whether it did.
    fn grow_one(&self) -> bool {
        let claimed = self
            .shared
            .live
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max_workers).then_some(n + 1)
            })
            .is_ok();
        if !claimed {
            return false;
        }
        if let Err(err) = self.spawn_worker() {
            self.shared.live.fetch_sub(1, Ordering::AcqRel);
            self.shared.failed_spawns.fetch_add(1, Ordering::AcqRel);
            Stats::incr(&self.stats.worker_spawn_failures);
            // The entry stays queued; a running worker, or one started
            // once threads can be started again, will take it.
            log::warn!("could not start a worker thread: {err}");
            return false;
        }
        true
    }

    fn spawn_worker(&self) -> io::Result<()> {
        let queue = Arc::clone(&self.queue);
        let shared = Arc::clone(&self.shared);
        let handler = Arc::clone(&self.handler);
        let stats = Arc::clone(&self.stats);
        let number = self.shared.spawned.fetch_add(1, Ordering::Relaxed) + 1;
        thread::Builder::new()
            .name("rodizio-worker".into())
            .stack_size(self.stack_size)
            .spawn(move || {
                WORKER_NUMBER.with(|n| n.set(number));
                let alive = stats.hold(&stats.workers);
                while let Some(job) = queue.pop() {
                    let busy = stats.hold(&stats.workers_busy);
                    if catch_unwind(AssertUnwindSafe(|| handler(job))).is_err() {
                        Stats::incr(&stats.worker_panics);
                        log::error!("a connection handler panicked; the worker goes on");
                    }
                    drop(busy);
                }
                drop(alive);
                let _guard = shared.exit_lock.lock();
                shared.live.fetch_sub(1, Ordering::AcqRel);
                shared.exited.notify_all();
            })
            .map(drop)
    }

    /// Closes the queue: no more submissions; workers finish what is queued
    /// and in hand, then exit.
    pub fn close(&self) {
        self.queue.close();
    }

    /// A function that closes this pool's queue, for a thread that cannot
    /// borrow the pool (the shutdown trigger).
    pub(crate) fn closer(&self) -> impl FnOnce() + Send + 'static {
        let queue = Arc::clone(&self.queue);
        move || queue.close()
    }

    /// Waits until every worker has exited, at most `timeout`. Returns the
    /// number still alive (0 when all finished in time).
    pub fn wait_exit(&self, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        let mut guard = self.shared.exit_lock.lock();
        loop {
            let live = self.shared.live.load(Ordering::Acquire);
            if live == 0 {
                return 0;
            }
            if self
                .shared
                .exited
                .wait_until(&mut guard, deadline)
                .timed_out()
            {
                return self.shared.live.load(Ordering::Acquire);
            }
        }
    }

    /// Worker threads alive now.
    pub fn workers(&self) -> usize {
        self.shared.live.load(Ordering::Acquire)
    }

    /// Entries waiting for a worker now.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// A function that reads [`Pool::queued`], for a thread that cannot
    /// borrow the pool (the admin API).
    pub fn queue_len(&self) -> std::sync::Arc<dyn Fn() -> usize + Send + Sync> {
        let queue = Arc::clone(&self.queue);
        Arc::new(move || queue.len())
    }

    /// Panics caught so far.
    pub fn panics(&self) -> u64 {
        self.stats.worker_panics.load(Ordering::Relaxed)
    }

    /// Worker threads that could not be started so far.
    pub fn spawn_failures(&self) -> u64 {
        self.stats.worker_spawn_failures.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbeam_channel::{bounded, unbounded};

    #[test]
    fn reuses_threads_and_respects_the_limit() {
        let (tx, rx) = unbounded();
        let pool = Pool::new(
            2,
            64 * 1024,
            100,
            Arc::new(Stats::default()),
            Arc::new(move |n: u32| tx.send(n).unwrap()),
        );
        for i in 0..50 {
            pool.submit(i).unwrap();
        }
        let mut got: Vec<u32> = (0..50)
            .map(|_| rx.recv_timeout(Duration::from_secs(5)).unwrap())
            .collect();
        got.sort_unstable();
        assert_eq!(got, (0..50).collect::<Vec<_>>());
        assert!(pool.workers() <= 2);
        pool.close();
        assert_eq!(pool.wait_exit(Duration::from_secs(5)), 0);
    }

    #[test]
    fn a_panic_does_not_shrink_the_pool() {
        let (tx, rx) = unbounded();
        let pool = Pool::new(
            1,
            64 * 1024,
            10,
            Arc::new(Stats::default()),
            Arc::new(move |n: u32| {
                if n == 0 {
                    panic!("boom");
                }
                tx.send(n).unwrap();
            }),
        );
        pool.submit(0).unwrap();
        pool.submit(1).unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(1));
        assert_eq!(pool.panics(), 1);
        assert_eq!(pool.workers(), 1);
        pool.close();
        assert_eq!(pool.wait_exit(Duration::from_secs(5)), 0);
        // The gauges came down with the worker, the panic included.
        let s = pool.stats.snapshot();
        assert_eq!((s.workers, s.workers_busy, s.worker_panics), (0, 0, 1));
    }

    #[test]
    fn a_busy_worker_does_not_block_the_next_entry() {
        // Entry 0 blocks until released; entry 1 must still be served.
        let (release_tx, release_rx) = bounded::<()>(0);
        let (done_tx, done_rx) = unbounded();
        let pool = Pool::new(
            4,
            64 * 1024,
            10,
            Arc::new(Stats::default()),
            Arc::new(move |n: u32| {
                if n == 0 {
                    let _ = release_rx.recv_timeout(Duration::from_secs(10));
                }
                done_tx.send(n).unwrap();
            }),
        );
        pool.submit(0).unwrap();
        pool.submit(1).unwrap();
        assert_eq!(done_rx.recv_timeout(Duration::from_secs(5)), Ok(1));
        release_tx.send(()).unwrap();
        assert_eq!(done_rx.recv_timeout(Duration::from_secs(5)), Ok(0));
        pool.close();
        assert_eq!(pool.wait_exit(Duration::from_secs(5)), 0);
    }

    #[test]
    fn workers_are_numbered_from_one() {
        let (tx, rx) = unbounded();
        let pool = Pool::new(
            1,
            64 * 1024,
            10,
            Arc::new(Stats::default()),
            Arc::new(move |_: u32| tx.send(worker_number()).unwrap()),
        );
        assert_eq!(worker_number(), 0, "not a worker");
        pool.submit(0).unwrap();
        pool.submit(1).unwrap();
        for _ in 0..2 {
            assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(1));
        }
        pool.close();
        assert_eq!(pool.wait_exit(Duration::from_secs(5)), 0);
    }
}
