//! The reaper: takes drained backends out of the scheduler's list once
//! their last connection has ended. One reaper type serves both who drain:
//! the admin API (`DELETE /backends/{address}`) and a reload (a backend no
//! longer in the file, with `drain_timeout` as its deadline).
//!
//! A backend with no connection in flight and none on its way
//! (`active() + pending() == 0`), or whose deadline has passed, is removed.
//! One that is no longer draining (an operator set it `ready` or `maint`, a
//! reload wrote it in the file again) is let go: the removal is cancelled.
//! A connection that never ends keeps its backend listed until its deadline
//! (reload) or for good (admin); the idle timeout ends the silent ones.
//!
//! # Threads
//!
//! Each reaper starts its thread when it is handed its first backend, looks
//! at its list every [`POLL`] under a short lock, and ends when the list is
//! empty (or, for one given a [`Shutdown`], at the shutdown).
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::io;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver};
use parking_lot::Mutex;

use crate::backend::Backend;
use crate::scheduler::Scheduler;
use crate::shutdown::Shutdown;
use crate::units;

/// How often a draining backend is looked at: short enough that a removal
/// follows its last connection closely, long enough to cost nothing.
pub const POLL: Duration = Duration::from_millis(20);

/// Who hands backends to a reaper: its thread and log lines name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// The admin API's `DELETE`.
    Admin,
    /// A reload that no longer finds the backend in the file.
    Reload,
}

/// Removes the backends it is handed once drained. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Reaper {
    shared: Arc<ReaperState>,
}

#[derive(Debug)]
struct ReaperState {
    scheduler: Arc<Scheduler>,
    owner: Owner,
    /// Stops the thread and refuses new backends once triggered.
    shutdown: Option<Shutdown>,
    list: Mutex<List>,
}

#[derive(Debug, Default)]
struct List {
    /// Each backend, with the time after which it leaves the list anyway.
    watched: Vec<(Arc<Backend>, Option<Instant>)>,
    /// Whether the thread is running.
    running: bool,
}

impl Reaper {
    /// A reaper removing from `scheduler`; with a `shutdown`, it stops at
    /// the shutdown.
    pub fn new(scheduler: Arc<Scheduler>, owner: Owner, shutdown: Option<Shutdown>) -> Reaper {
        Reaper {
            shared: Arc::new(ReaperState {
                scheduler,
                owner,
                shutdown,
                list: Mutex::default(),
            }),
        }
    }

    /// Removes `backend` (already set draining) once its last connection
    /// ends, or at `deadline` if it has one. A backend already watched
    /// keeps its first deadline.
    ///
    /// # Errors
    ///
    /// The balancer is stopping, or the thread could not be started (the
    /// backend then stays listed, draining: harmless).
    pub fn watch(&self, backend: Arc<Backend>, deadline: Option<Instant>) -> io::Result<()> {
        if self
            .shared
            .shutdown
            .as_ref()
            .is_some_and(Shutdown::is_triggered)
        {
            return Err(io::Error::other("the balancer is stopping"));
        }
        // `on_backend_removed`: its connections close now, or get their
        // drain's deadline (`removed_drain_timeout`).
        let closed = crate::connections::table().backend_removed(backend.id());
        if closed > 0 {
            log::info!(
                "backend {}: {} closed (on_backend_removed: close)",
                backend.name(),
                crate::units::count(closed as u64, "connection")
            );
        }
        let mut list = self.shared.list.lock();
        if !list.watched.iter().any(|(b, _)| b.id() == backend.id()) {
            list.watched.push((backend, deadline));
        }
        if !list.running {
            let shared = Arc::clone(&self.shared);
            let name = match self.shared.owner {
                Owner::Admin => "rodizio-admin-reaper",
                Owner::Reload => "rodizio-reaper",
            };
            thread::Builder::new()
                .name(name.into())
                .stack_size(128 * 1024)
                .spawn(move || run(&shared))?;
            list.running = true;
        }
        Ok(())
    }

    /// Stops watching the backend `id` (it serves again).
    pub fn forget(&self, id: u64) {
        self.shared
            .list
            .lock()
            .watched
            .retain(|(b, _)| b.id() != id);
    }

    /// The ids of the backends watched now.
    pub fn watched(&self) -> Vec<u64> {
        let list = self.shared.list.lock();
        list.watched.iter().map(|(b, _)| b.id()).collect()
    }
}

/// The thread's body: every [`POLL`], removes what is drained, until the
/// list is empty or the shutdown.
fn run(shared: &ReaperState) {
    let stop: Receiver<()> = match &shared.shutdown {
        Some(s) => s.receiver(),
        None => crossbeam_channel::never(),
    };
    loop {
        select! {
            recv(stop) -> _ => {
                shared.list.lock().running = false;
                return;
            }
            default(POLL) => {}
        }
        let mut list = shared.list.lock();
        let now = Instant::now();
        list.watched
            .retain(|(b, deadline)| keep(shared, b, deadline.is_some_and(|d| now >= d)));
        if list.watched.is_empty() {
            list.running = false;
            return;
        }
    }
}

/// Whether `b` stays watched; removes it from the list when it is drained
/// or its time is up (`late`).
fn keep(shared: &ReaperState, b: &Backend, late: bool) -> bool {
    let who = match shared.owner {
        Owner::Admin => "admin",
        Owner::Reload => "reload",
    };
    if !b.is_draining() {
        log::info!(
            "{who}: removal of backend {} cancelled (no longer draining)",
            b.name()
        );
        return false;
    }
    let left = b.active() + b.pending();
    if left > 0 && !late {
        return true;
    }
    if shared.scheduler.remove(b.id()).is_none() {
        return false; // gone already
    }
    match (shared.owner, left) {
        (Owner::Admin, 0) => log::info!("admin: backend {} removed (drained)", b.name()),
        (Owner::Reload, 0) => log::info!("reload: {} drained and removed", b.name()),
        _ => log::warn!(
            "{who}: {} removed from the list with {} still open ({} on)",
            b.name(),
            units::count(left as u64, "connection"),
            if left == 1 { "it goes" } else { "they go" }
        ),
    }
    false
}

/// One reaper per service (by its scheduler), made when first asked for:
/// what a reload and the admin API each keep.
#[derive(Debug)]
pub struct Reapers {
    owner: Owner,
    shutdown: Option<Shutdown>,
    list: Mutex<Vec<(Arc<Scheduler>, Reaper)>>,
}

impl Reapers {
    /// No reaper yet; each made with `owner` and `shutdown` (see
    /// [`Reaper::new`]).
    pub fn new(owner: Owner, shutdown: Option<Shutdown>) -> Reapers {
        Reapers {
            owner,
            shutdown,
            list: Mutex::new(Vec::new()),
        }
    }

    /// The reaper of `scheduler`'s drained backends. Those of schedulers
    /// no longer in `running` (stopped services) are let go.
    pub fn of(&self, scheduler: &Arc<Scheduler>, running: &[Arc<Scheduler>]) -> Reaper {
        let mut list = self.list.lock();
        list.retain(|(s, _)| running.iter().any(|r| Arc::ptr_eq(r, s)));
        if let Some((_, r)) = list.iter().find(|(s, _)| Arc::ptr_eq(s, scheduler)) {
            return r.clone();
        }
        let r = Reaper::new(Arc::clone(scheduler), self.owner, self.shutdown.clone());
        list.push((Arc::clone(scheduler), r.clone()));
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::BackendSpec;

    fn setup(names: &[&str]) -> (Arc<Scheduler>, Vec<Arc<Backend>>) {
        let backends: Vec<Arc<Backend>> = names
            .iter()
            .map(|n| Arc::new(Backend::from_spec(&BackendSpec::parse(n).unwrap()).unwrap()))
            .collect();
        let scheduler = Arc::new(Scheduler::new(backends.clone()));
        (scheduler, backends)
    }

    fn names(s: &Scheduler) -> Vec<String> {
        s.snapshot().iter().map(|b| b.name().to_string()).collect()
    }

    fn until(what: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !what() {
            assert!(Instant::now() < deadline, "timed out");
            thread::sleep(POLL);
        }
    }

    #[test]
    fn a_drained_backend_leaves_once_idle_and_the_thread_ends() {
        let (s, b) = setup(&["127.0.0.1:1", "127.0.0.1:2"]);
        let reaper = Reaper::new(Arc::clone(&s), Owner::Admin, None);
        let held = b[1].start_connection();
        b[1].set_draining(true);
        // The decision itself: kept while a connection is open.
        assert!(keep(&reaper.shared, &b[1], false));
        assert_eq!(names(&s), ["127.0.0.1:1", "127.0.0.1:2"], "still in use");
        reaper.watch(Arc::clone(&b[1]), None).unwrap();
        reaper.watch(Arc::clone(&b[1]), None).unwrap();
        assert_eq!(reaper.watched(), [b[1].id()], "watched once");
        drop(held);
        until(|| names(&s) == ["127.0.0.1:1"]);
        until(|| !reaper.shared.list.lock().running);
        assert!(reaper.watched().is_empty());
    }

    #[test]
    fn a_deadline_removes_a_busy_backend_and_serving_again_cancels() {
        let (s, b) = setup(&["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]);
        let reaper = Reaper::new(Arc::clone(&s), Owner::Reload, None);
        let _held = [b[1].start_connection(), b[2].start_connection()];
        for x in &b[1..] {
            x.set_draining(true);
        }
        reaper
            .watch(Arc::clone(&b[1]), Some(Instant::now()))
            .unwrap();
        reaper.watch(Arc::clone(&b[2]), None).unwrap();
        until(|| names(&s) == ["127.0.0.1:1", "127.0.0.1:3"]);
        b[2].set_draining(false);
        until(|| reaper.watched().is_empty());
        assert_eq!(names(&s), ["127.0.0.1:1", "127.0.0.1:3"]);
    }

    #[test]
    fn after_the_shutdown_nothing_more_is_taken() {
        let (s, b) = setup(&["127.0.0.1:1"]);
        let shutdown = Shutdown::new();
        let reaper = Reaper::new(s, Owner::Admin, Some(shutdown.clone()));
        shutdown.trigger();
        assert!(reaper.watch(Arc::clone(&b[0]), None).is_err());
    }
}
