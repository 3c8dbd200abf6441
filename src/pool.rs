//! The bounded pool of worker threads: OS threads with a small fixed stack
//! (64 KiB by default), spawned on demand up to `max_workers` and reused. A
//! worker runs `pop → handle → pop → ...` until the queue is closed and
//! empty; with [`Pool::shrink_when_idle`] one idle that long exits, down to
//! [`WORKER_FLOOR`]. A panic while handling one entry is caught, counted and
//! logged, and the worker goes on: one client's bug cannot shrink the pool.
//! How the count, the retirement and the memory handed back work:
//! docs/internals.md, "The pool".
//!
//! # Threads
//!
//! The accept loops (one per listening address) call [`Pool::submit`];
//! the workers pop; on shutdown the balancer's `run` closes the queue
//! ([`Pool::close`]) once the accept loops have left (or after a grace, so
//! a loop waiting for room is released), then waits in
//! [`Pool::wait_exit`]. The count of live workers is an atomic claimed with a
//! compare-and-swap, so the limit holds without a lock; what the pool counts
//! goes to the shared [`Stats`] table.
//!
//! # Corresponds to the C article
//!
//! `threads[_MAX_THREAD_NUM]`, `get_next_thread()`, `pthread_create` with
//! `pthread_attr_setstacksize`. The C joins slot `i % 4096` before reusing
//! it, blocking the accept loop, and `exit()`s on the 4096th connection; here
//! nothing ever waits on a particular thread.

use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::config::Config;
use crate::error::Error;
use crate::queue::{Popped, Queue};
use crate::stats::{GaugeGuard, Stats};

/// The number of the worker thread calling it; kept by the trace, which
/// reads it (to name the worker that took a client), so the connection's
/// code below the pool asks the trace, not the pool.
pub use crate::trace::worker_number;

/// What a worker does with each entry.
pub type Handler<T> = dyn Fn(T) + Send + Sync + 'static;

/// Workers a shrinking pool keeps however long they idle: the next few
/// clients after a quiet spell are served without starting a thread, and
/// four threads cost next to nothing (a 64 KiB stack of which a few pages
/// are touched). The pool starts with none and grows to this as clients
/// come, as before; only what is above it exits when idle.
pub const WORKER_FLOOR: usize = 4;

/// The name of every worker thread (`ps -L`, `/proc/PID/task/*/comm`).
const WORKER_THREAD: &str = "rodizio-worker";

/// The pool: a queue and the threads that serve it.
pub struct Pool<T: Send + 'static> {
    queue: Arc<Queue<T>>,
    shared: Arc<PoolState>,
    stats: Arc<Stats>,
    handler: Arc<Handler<T>>,
    max_workers: usize,
    stack_size: usize,
    /// How long a worker above the floor may wait for work before it
    /// exits; `None`: never (the pool only grows).
    idle_timeout: Option<Duration>,
    /// Workers kept whatever the idle timeout ([`WORKER_FLOOR`]).
    floor: usize,
}

/// How large the settings make the pool: what it may ask of the host at
/// its fullest (threads, stacks, and the connections waiting in its
/// queue). Read here once for [`Pool::with_config`], and by `rodizio
/// preflight` ([`crate::preflight`]) to weigh the host's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizing {
    /// Most worker threads (`workers`).
    pub workers: usize,
    /// Each worker's stack, in bytes.
    pub stack_size: usize,
    /// Most accepted clients waiting in the queue for a worker.
    pub waiting: usize,
}

impl Sizing {
    /// The pool `config` asks for.
    pub fn of(config: &Config) -> Sizing {
        Sizing {
            workers: config.workers.max(1),
            stack_size: worker_stack(config.thread_stack, config),
            waiting: config.queue_capacity,
        }
    }
}

/// State the workers share with the pool.
#[derive(Debug, Default)]
struct PoolState {
    /// Worker threads alive now: claimed before a spawn, given back when
    /// a worker exits, or, when it retires, under the queue's lock.
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
    /// Retired workers whose threads have not ended yet.
    leaving: AtomicUsize,
    /// When a retiree last gave memory back ([`give_memory_back`]): at
    /// most once a second.
    gave_back: Mutex<Option<Instant>>,
    /// Tests only: a worker that retired says so on the first channel and
    /// waits on the second before it goes on, held where a push must no
    /// longer count on it.
    #[cfg(test)]
    retire_pause: Mutex<
        Option<(
            crossbeam_channel::Sender<()>,
            crossbeam_channel::Receiver<()>,
        )>,
    >,
}

/// What one worker thread owns: its share of the pool and its settings.
struct Worker<T: Send + 'static> {
    queue: Arc<Queue<T>>,
    shared: Arc<PoolState>,
    handler: Arc<Handler<T>>,
    stats: Arc<Stats>,
    /// Its [`worker_number`].
    number: usize,
    /// The pool's, read once at the start.
    idle_timeout: Option<Duration>,
    floor: usize,
}

impl<T: Send + 'static> Worker<T> {
    /// The thread's body: take and handle entries until the queue closes
    /// or, with an idle timeout, until it retires.
    fn run(self) {
        crate::trace::set_worker_number(self.number);
        let stats = &self.stats;
        let shared = &self.shared;
        let mut alive = Some(stats.hold(&stats.workers));
        loop {
            match self.next(&mut alive) {
                Popped::Entry(job) => {
                    let busy = stats.hold(&stats.workers_busy);
                    if catch_unwind(AssertUnwindSafe(|| (self.handler)(job))).is_err() {
                        self.panicked();
                    }
                    drop(busy);
                }
                Popped::Closed => {
                    drop(alive);
                    let _guard = shared.exit_lock.lock();
                    shared.live.fetch_sub(1, Ordering::AcqRel);
                    shared.exited.notify_all();
                    return;
                }
                Popped::Retired => {
                    self.retire();
                    return;
                }
            }
        }
    }

    /// The next entry, or the end: waits on the queue (with an idle
    /// timeout, retiring when [`Worker::leave_count`] says so, and then
    /// dropping `alive`, the worker's place in the gauge). Not inlined:
    /// the wait's locals stay out of [`Worker::run`]'s frame.
    #[inline(never)]
    fn next<'s>(&self, alive: &mut Option<GaugeGuard<'s>>) -> Popped<T> {
        match self.idle_timeout {
            None => self.queue.pop().map_or(Popped::Closed, Popped::Entry),
            Some(idle) => self.queue.pop_or_retire(idle, || {
                let retired = self.leave_count();
                if retired {
                    // With the count, so the gauge never shows more
                    // workers than `live` allows.
                    *alive = None;
                }
                retired
            }),
        }
    }

    /// After a panic in the handler: counted and logged. Kept out of
    /// [`Worker::run`], whose frame stays on the stack under every
    /// connection the worker serves (docs/internals.md, "The pool").
    #[cold]
    #[inline(never)]
    fn panicked(&self) {
        Stats::incr(&self.stats.worker_panics);
        log::error!("a connection handler panicked; the worker goes on");
    }

    /// The retirement decision, taken under the queue's lock (see
    /// [`Queue::pop_or_retire`]): above the floor, leave the count of live
    /// workers now, not once the thread is gone, so that a push that
    /// follows is free to spawn, even at `max_workers`.
    fn leave_count(&self) -> bool {
        let shared = &self.shared;
        let retired = shared
            .live
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n > self.floor).then(|| n - 1)
            })
            .is_ok();
        if retired {
            shared.leaving.fetch_add(1, Ordering::AcqRel);
        }
        retired
    }

    /// The end of a retired worker, out of the queue's lock.
    #[cold]
    #[inline(never)]
    fn retire(&self) {
        let shared = &self.shared;
        #[cfg(test)]
        {
            let pause = shared.retire_pause.lock().clone();
            if let Some((retired, resume)) = pause {
                let _ = retired.send(());
                let _ = resume.recv_timeout(Duration::from_secs(10));
            }
        }
        // `live` went down in the queue's lock; `wait_exit` reads it
        // under `exit_lock`, so wake it under that.
        drop(shared.exit_lock.lock());
        shared.exited.notify_all();
        // The last of a wave of retirees out, with the pool at its floor:
        // the flood is over.
        let last_out = shared.leaving.fetch_sub(1, Ordering::AcqRel) == 1;
        if last_out && shared.live.load(Ordering::Acquire) <= self.floor {
            self.after_a_flood();
        }
    }

    /// Once the pool is back at its floor: hands the memory of the exited
    /// workers back to the system, at most once a second (see
    /// [`give_memory_back`]).
    fn after_a_flood(&self) {
        {
            let mut last = self.shared.gave_back.lock();
            let now = Instant::now();
            if last.is_some_and(|t| now.duration_since(t) < Duration::from_secs(1)) {
                return;
            }
            *last = Some(now);
        }
        wait_for_retirees(&self.shared.live);
        give_memory_back();
        log::debug!(
            "idle workers exited: the pool is back to its floor of {} workers",
            self.floor
        );
    }
}

/// Waits (at most two seconds) until no worker thread is left beyond the
/// pool's count and the caller: retirees that left the count just before
/// it may still be on their way out, and their stacks would reach glibc's
/// cache after [`give_memory_back`] emptied it. A thread leaves
/// `/proc/self/task` once the kernel has reaped it, after glibc is done
/// with its stack. (Polling, in a thread that is leaving anyway and holds
/// no lock.)
fn wait_for_retirees(live: &AtomicUsize) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while worker_threads() > live.load(Ordering::Acquire) + 1 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
    }
}

/// Threads of this process named [`WORKER_THREAD`].
fn worker_threads() -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm"))
                .is_ok_and(|comm| comm.trim_end() == WORKER_THREAD)
        })
        .count()
}

/// Gives back to the system what glibc keeps of exited threads.
///
/// glibc keeps the stacks of exited threads for reuse, up to 40 MiB of
/// them (its default `glibc.pthread.stack_cache_size`), and each keeps
/// about 20 KiB of touched pages: after a flood of 64 KiB workers, some
/// 600 stacks and 12 MB resident for good. A thread whose stack alone is
/// that size makes glibc unmap the others when it exits (glibc evicts the
/// oldest stacks until the cache fits), and costs only address space: it
/// touches a few pages. `malloc_trim` then returns the free pages of every
/// malloc arena (the connections' buffers), which glibc otherwise keeps
/// when they are not at the top of their arena.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn give_memory_back() {
    const GLIBC_STACK_CACHE: usize = 40 << 20;
    let evict = thread::Builder::new()
        .name("rodizio-trim".into())
        .stack_size(GLIBC_STACK_CACHE)
        .spawn(|| {});
    match evict {
        Ok(handle) => {
            let _ = handle.join();
        }
        // Only memory that stays cached: nothing to report above debug.
        Err(err) => log::debug!("could not start the thread that trims glibc's stack cache: {err}"),
    }
    // SAFETY: malloc_trim takes no pointer; it walks glibc's own arenas
    // under their locks and may be called from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Other C libraries: nothing known to give back.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn give_memory_back() {}

/// The workers' stack: `asked` (the setting), raised to
/// [`TLS_WORKER_STACK`](crate::tls_term::TLS_WORKER_STACK) when any
/// service of `config` speaks TLS. Here, beside its one caller, because
/// `tls_term` sits below the [`Config`] it reads.
pub fn worker_stack(asked: usize, config: &Config) -> usize {
    let tls = config.tls.on() || config.services.iter().any(|s| s.tls.on());
    if tls {
        asked.max(crate::tls_term::TLS_WORKER_STACK)
    } else {
        asked
    }
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
            shared: Arc::new(PoolState::default()),
            stats,
            handler,
            max_workers: max_workers.max(1),
            stack_size,
            idle_timeout: None,
            floor: WORKER_FLOOR,
        }
    }

    /// The balancer's pool, sized and shrunk as `config` says: its
    /// [`Sizing`] and idle timeout.
    pub fn with_config(config: &Config, stats: Arc<Stats>, handler: Arc<Handler<T>>) -> Pool<T> {
        let sizing = Sizing::of(config);
        Pool::new(
            sizing.workers,
            sizing.stack_size,
            sizing.waiting,
            stats,
            handler,
        )
        .shrink_when_idle(config.worker_idle_timeout, WORKER_FLOOR)
    }

    /// Makes idle workers exit: one that waited `idle_timeout` for work
    /// exits unless only `floor` workers are alive. `None` (the default of
    /// [`Pool::new`]) never shrinks the pool. Call before the first
    /// [`Pool::submit`]: a worker reads it when it starts.
    #[must_use]
    pub fn shrink_when_idle(mut self, idle_timeout: Option<Duration>, floor: usize) -> Pool<T> {
        self.idle_timeout = idle_timeout;
        self.floor = floor;
        self
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
        let worker = Worker {
            queue: Arc::clone(&self.queue),
            shared: Arc::clone(&self.shared),
            handler: Arc::clone(&self.handler),
            stats: Arc::clone(&self.stats),
            number: self.shared.spawned.fetch_add(1, Ordering::Relaxed) + 1,
            idle_timeout: self.idle_timeout,
            floor: self.floor,
        };
        thread::Builder::new()
            .name(WORKER_THREAD.into())
            .stack_size(self.stack_size)
            .spawn(move || worker.run())
            .map(drop)
    }

    /// Closes the queue: no more submissions; workers finish what is queued
    /// and in hand, then exit.
    pub fn close(&self) {
        self.queue.close();
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

/// Checks the pool's settings in `config` that only the system can judge:
/// the workers' stack size, tried on a real thread.
///
/// # Errors
///
/// [`Error::InvalidSetting`] when a worker thread cannot be started.
pub fn check_stack(config: &Config) -> Result<(), Error> {
    check_thread_stack(config.thread_stack)
}

/// Starts (and joins) one thread with the workers' stack size, so that a
/// stack the system cannot give (too large for the memory or the address
/// space limits) is a start-up error, not a balancer that accepts clients
/// and has no worker to serve them.
///
/// # Errors
///
/// [`Error::InvalidSetting`] on `thread_stack`, with the system's reason.
fn check_thread_stack(stack: usize) -> Result<(), Error> {
    let refused = |reason: String| {
        Error::setting(
            "thread_stack",
            format!("cannot start a worker thread with a stack of {stack} bytes: {reason}"),
        )
    };
    // catch_unwind: the standard library asserts on some sizes it cannot
    // hand to pthread_attr_setstacksize instead of returning an error.
    let spawned = std::panic::catch_unwind(|| {
        std::thread::Builder::new()
            .name("rodizio-stack-check".into())
            .stack_size(stack)
            .spawn(|| {})
    });
    match spawned {
        Ok(Ok(handle)) => handle
            .join()
            .map_err(|_| refused("the thread panicked".into())),
        Ok(Err(err)) => Err(refused(err.to_string())),
        Err(_) => Err(refused("the size was refused".into())),
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

    /// A pool whose entries block until released: each handler says it
    /// started, then waits (at most 10 s) for `release` to be dropped.
    fn blocking_pool(
        max: usize,
        idle: Duration,
        floor: usize,
    ) -> (
        Pool<u32>,
        crossbeam_channel::Receiver<u32>,
        crossbeam_channel::Sender<()>,
    ) {
        let (started_tx, started_rx) = unbounded();
        let (release_tx, release_rx) = bounded::<()>(0);
        let pool = Pool::new(
            max,
            64 * 1024,
            100,
            Arc::new(Stats::default()),
            Arc::new(move |n: u32| {
                started_tx.send(n).unwrap();
                let _ = release_rx.recv_timeout(Duration::from_secs(10));
            }),
        )
        .shrink_when_idle(Some(idle), floor);
        (pool, started_rx, release_tx)
    }

    /// Polls `cond` every millisecond for at most `limit`: whether it held.
    fn within(limit: Duration, cond: impl Fn() -> bool) -> bool {
        let deadline = Instant::now() + limit;
        while !cond() {
            if Instant::now() >= deadline {
                return false;
            }
            thread::sleep(Duration::from_millis(1));
        }
        true
    }

    #[test]
    fn idle_workers_exit_down_to_the_floor() {
        let idle = Duration::from_millis(100);
        let (pool, started, release) = blocking_pool(16, idle, 2);
        for i in 0..16 {
            pool.submit(i).unwrap();
        }
        for _ in 0..16 {
            started.recv_timeout(Duration::from_secs(5)).unwrap();
        }
        assert_eq!(pool.workers(), 16, "one worker per blocked entry");
        let freed = Instant::now();
        drop(release);
        let gauge = || pool.stats.snapshot().workers;
        assert!(
            within(Duration::from_secs(10), || pool.workers() == 2
                && gauge() == 2),
            "still {} workers ({} in the gauge)",
            pool.workers(),
            gauge()
        );
        assert!(freed.elapsed() >= idle, "exited before their idle time");
        // The floor stays, however long it idles.
        assert!(!within(idle * 3, || pool.workers() < 2));
        assert_eq!(gauge(), 2);
        pool.close();
        assert_eq!(pool.wait_exit(Duration::from_secs(5)), 0);
        let s = pool.stats.snapshot();
        assert_eq!((s.workers, s.workers_busy), (0, 0));
    }

    #[test]
    fn a_shrunk_pool_grows_again() {
        let (started_tx, started_rx) = unbounded();
        let (release_tx, release_rx) = bounded::<()>(0);
        let pool = Pool::new(
            8,
            64 * 1024,
            100,
            Arc::new(Stats::default()),
            Arc::new(move |n: u32| {
                started_tx.send(n).unwrap();
                if n < 100 {
                    let _ = release_rx.recv_timeout(Duration::from_secs(10));
                }
            }),
        )
        .shrink_when_idle(Some(Duration::from_millis(20)), 1);
        for round in 0..3 {
            for i in 0..8 {
                pool.submit(i).unwrap();
            }
            for _ in 0..8 {
                started_rx.recv_timeout(Duration::from_secs(5)).unwrap();
            }
            assert_eq!(pool.workers(), 8, "round {round}");
            // Release the 8 (a zero-capacity channel: one send per taker).
            for _ in 0..8 {
                release_tx.send_timeout((), Duration::from_secs(5)).unwrap();
            }
            assert!(
                within(Duration::from_secs(10), || pool.workers() == 1),
                "round {round}: {} workers",
                pool.workers()
            );
        }
        pool.submit(100).unwrap();
        assert_eq!(started_rx.recv_timeout(Duration::from_secs(5)), Ok(100));
        pool.close();
        assert_eq!(pool.wait_exit(Duration::from_secs(5)), 0);
    }

    #[test]
    fn a_push_just_after_a_retirement_starts_a_worker() {
        // One worker at most, no floor, and the retiring worker held just
        // after its decision: the push that comes then must start a new
        // worker, which only works if the retiree no longer counts.
        let (tx, rx) = unbounded();
        let pool = Pool::new(
            1,
            64 * 1024,
            10,
            Arc::new(Stats::default()),
            Arc::new(move |n: u32| tx.send(n).unwrap()),
        )
        .shrink_when_idle(Some(Duration::from_millis(10)), 0);
        let (retired_tx, retired_rx) = bounded(1);
        let (resume_tx, resume_rx) = bounded::<()>(0);
        *pool.shared.retire_pause.lock() = Some((retired_tx, resume_rx));
        pool.submit(1).unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(1));
        retired_rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(pool.workers(), 0, "the retiree left the count");
        pool.submit(2).unwrap();
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(5)),
            Ok(2),
            "the push relied on the retiring worker"
        );
        *pool.shared.retire_pause.lock() = None;
        drop(resume_tx);
        pool.close();
        assert_eq!(pool.wait_exit(Duration::from_secs(5)), 0);
        assert_eq!(pool.stats.snapshot().workers, 0);
    }

    #[test]
    fn a_push_racing_a_retirement_is_served() {
        // One worker at most and no floor: every retirement leaves the pool
        // empty, and only the submit that follows can start a worker. If a
        // retiring worker still counted as alive (or as idle) when a push
        // came, the push would spawn nothing and its entry would wait for
        // ever. The pause between rounds swings around the idle time, so
        // pushes land before, during and after retirements.
        const ROUNDS: u32 = 3000;
        let idle = Duration::from_millis(1);
        let (tx, rx) = unbounded();
        let pool = Pool::new(
            1,
            64 * 1024,
            10,
            Arc::new(Stats::default()),
            Arc::new(move |n: u32| tx.send(n).unwrap()),
        )
        .shrink_when_idle(Some(idle), 0);
        let started = Instant::now();
        for i in 0..ROUNDS {
            pool.submit(i).unwrap();
            assert_eq!(
                rx.recv_timeout(Duration::from_secs(5)),
                Ok(i),
                "entry {i} was never served"
            );
            let pause = idle * (i % 9) / 4;
            let from = Instant::now();
            while from.elapsed() < pause {
                thread::yield_now();
            }
            assert!(started.elapsed() < Duration::from_secs(60), "too slow");
        }
        // The race was run: workers retired and were started again.
        let spawned = pool.shared.spawned.load(Ordering::Relaxed);
        assert!(spawned > ROUNDS as usize / 10, "only {spawned} workers");
        assert!(pool.workers() <= 1);
        pool.close();
        assert_eq!(pool.wait_exit(Duration::from_secs(5)), 0);
        assert_eq!(pool.stats.snapshot().workers, 0);
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
