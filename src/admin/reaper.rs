//! The reaper: removes the backends that `DELETE /backends/{address}` put
//! to drain, once their last connection has ended.
//!
//! One thread (`rodizio-admin-reaper`) receives the backends on a channel
//! and, while it has any, looks at each every [`POLL`]: a backend with no
//! connection in flight and none on its way (`active() + pending() == 0`)
//! is removed from the scheduler. A backend that is no longer draining (an
//! operator set it `ready` or `maint` meanwhile) is kept: the removal is
//! cancelled. With nothing to watch the thread sleeps on the channel; a
//! shutdown wakes it at once and it exits.
//!
//! A connection that never ends keeps its backend listed; the idle timeout
//! ends the silent ones.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use crossbeam_channel::{select, Receiver};

use crate::backend::Backend;
use crate::scheduler::Scheduler;
use crate::shutdown::Shutdown;

/// How often a draining backend is looked at: short enough that a removal
/// follows its last connection closely, long enough to cost nothing.
pub const POLL: Duration = Duration::from_millis(20);

/// Starts the reaper thread.
pub(super) fn spawn(
    scheduler: Arc<Scheduler>,
    jobs: Receiver<Arc<Backend>>,
    shutdown: Shutdown,
) -> std::io::Result<JoinHandle<()>> {
    thread::Builder::new()
        .name("rodizio-admin-reaper".into())
        .stack_size(128 * 1024)
        .spawn(move || run(&scheduler, &jobs, &shutdown))
}

fn run(scheduler: &Scheduler, jobs: &Receiver<Arc<Backend>>, shutdown: &Shutdown) {
    let stop = shutdown.receiver();
    let mut watched: Vec<Arc<Backend>> = Vec::new();
    loop {
        let timeout = if watched.is_empty() {
            crossbeam_channel::never()
        } else {
            crossbeam_channel::after(POLL)
        };
        select! {
            recv(jobs) -> job => match job {
                Ok(backend) => {
                    if !watched.iter().any(|b| b.id() == backend.id()) {
                        watched.push(backend);
                    }
                }
                Err(_) => return,
            },
            recv(stop) -> _ => return,
            recv(timeout) -> _ => {}
        }
        watched.retain(|backend| {
            if !backend.is_draining() {
                log::info!(
                    "admin: removal of backend {} cancelled (no longer draining)",
                    backend.name()
                );
                return false;
            }
            if backend.active() + backend.pending() > 0 {
                return true;
            }
            if scheduler.remove(backend.id()).is_some() {
                log::info!("admin: backend {} removed (drained)", backend.name());
            }
            false
        });
    }
}
