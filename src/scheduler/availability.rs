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

use crate::backend::Backend;

/// Told when a backend's availability (health, drain, maintenance) has
/// flipped, on the thread that flipped it, after the new state is stored.
pub(crate) trait AvailabilityWatcher: Send + Sync {
    /// `backend` was taken out of rotation or put back.
    fn availability_changed(&self, backend: &Backend);
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

    /// Tells every live watcher that `backend`'s availability flipped.
    pub(crate) fn tell(&self, backend: &Backend) {
        // Upgraded under the lock, told after it is released: a scheduler
        // holds its own writer lock while it calls `add` on its backends,
        // and takes that lock again to rebuild, so telling it with this lock
        // held could deadlock against a change of its list.
        let live: Vec<Arc<dyn AvailabilityWatcher>> =
            self.0.lock().iter().filter_map(Weak::upgrade).collect();
        for watcher in live {
            watcher.availability_changed(backend);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Default)]
    struct Counter(AtomicUsize);

    impl AvailabilityWatcher for Counter {
        fn availability_changed(&self, _: &Backend) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn each_flip_is_told_once_to_each_live_watcher() {
        let b = Backend::new("b".into(), vec![], 1);
        let (one, two) = (Arc::new(Counter::default()), Arc::new(Counter::default()));
        for _ in 0..3 {
            b.watch(Arc::downgrade(&one) as Weak<dyn AvailabilityWatcher>);
        }
        b.watch(Arc::downgrade(&two) as Weak<dyn AvailabilityWatcher>);
        b.set_draining(true);
        b.set_draining(true); // no flip
        b.set_maint(true);
        b.set_healthy(false);
        assert_eq!(one.0.load(Ordering::Relaxed), 3);
        drop(two);
        b.set_healthy(true);
        assert_eq!(one.0.load(Ordering::Relaxed), 4);
        // The dropped one is forgotten at the next `add`.
        b.watch(Arc::downgrade(&one) as Weak<dyn AvailabilityWatcher>);
        assert_eq!(format!("{:?}", b).matches("(Weak)").count(), 1);
    }
}
