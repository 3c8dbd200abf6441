//! How a backend tells the schedulers holding it that it was taken out of
//! rotation or put back, so that they rebuild what they precompute from
//! the available backends (see "Availability" in the scheduler's docs).
//!
//! Runs on the thread that flips the backend's state: the health thread, a
//! worker (passive health), the admin API, a reload. Each backend's list of
//! watchers is behind a `parking_lot::Mutex`, taken at a flip and when a
//! scheduler takes the backend in, never by a pick.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C's servers never go out of rotation.

use std::sync::{Arc, Weak};

use parking_lot::Mutex;

/// Told when a backend's availability (health, drain, maintenance) has
/// flipped, on the thread that flipped it, after the new state is stored.
pub(crate) trait AvailabilityWatcher: Send + Sync {
    /// The backend with this id ([`crate::backend::Backend::id`]) was
    /// taken out of rotation or put back.
    fn availability_changed(&self, backend_id: u64);
}

/// The watchers of one backend: the schedulers holding it. Weak, so a
/// dropped scheduler is skipped, then forgotten.
#[derive(Debug, Default)]
pub(crate) struct Watchers(Mutex<Vec<Weak<dyn AvailabilityWatcher>>>);

impl Watchers {
    /// Adds `watcher` (once, however often it asks), forgetting those that
    /// are gone: the list is never longer than the number of live
    /// schedulers that took the backend in.
    pub(crate) fn add(&self, watcher: Weak<dyn AvailabilityWatcher>) {
        let mut watchers = self.0.lock();
        watchers.retain(|w| w.strong_count() > 0);
        if !watchers.iter().any(|w| w.ptr_eq(&watcher)) {
            watchers.push(watcher);
        }
    }

    /// Tells every live watcher that the availability of the backend
    /// `backend_id` flipped.
    pub(crate) fn tell(&self, backend_id: u64) {
        // Upgraded under the lock, told after it is released: a scheduler
        // holds its own writer lock while it calls `add` on its backends,
        // and takes that lock again to rebuild, so telling it with this lock
        // held could deadlock against a change of its list.
        let live: Vec<Arc<dyn AvailabilityWatcher>> =
            self.0.lock().iter().filter_map(Weak::upgrade).collect();
        for watcher in live {
            watcher.availability_changed(backend_id);
        }
    }
}
