//! A backend's slots: the clients on their way to it (reservations) and
//! its `max_connections` (HAProxy's server `maxconn`), the most
//! connections it is given at once.
//!
//! A backend's load is its active connections plus its reservations: a
//! pick reserves a place at accept time and gives it back once the worker
//! has connected and counted the connection as active (or has given up).
//! Least connections reads that load; a capped backend is given a client
//! only when [`Backend::try_reserve`] finds it under its cap, so the
//! clients accepted faster than they connect cannot push it over.
//!
//! # Threads
//!
//! The accept loops and the workers (picks, fail-over) reserve; the
//! workers give back; a reload or the admin API change the cap. Atomics
//! only: a compare-and-swap on the reservations is what makes two picks
//! racing for the last slot take it once.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C sends every client to its turn's server.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::backend::Backend;
use crate::error::{Error, Result};

/// The largest `max_connections` accepted: more than one process can
/// hold open (a worker thread each), yet far from a typo's `1e12`.
pub const MAX_MAX_CONNECTIONS: usize = 1_000_000;

/// A backend's cap: 0 for none (the default), else the most connections
/// (active plus reserved) it is given at once. An atomic, so that a reload
/// changes it in place while connections flow.
#[derive(Debug, Default)]
pub struct Cap {
    limit: AtomicUsize,
}

/// Parses the `N` of `,max_connections=N` in the backend `spec`.
///
/// # Errors
///
/// [`Error::InvalidBackend`] when it is not a whole number
/// 1..=[`MAX_MAX_CONNECTIONS`].
pub fn parse(spec: &str, value: &str) -> Result<usize> {
    value
        .trim()
        .parse::<usize>()
        .ok()
        .filter(|n| (1..=MAX_MAX_CONNECTIONS).contains(n))
        .ok_or_else(|| {
            Error::InvalidBackend(format!(
                "'{spec}': max_connections must be a whole number 1..{MAX_MAX_CONNECTIONS}"
            ))
        })
}

/// Counts a client as on its way to a backend until dropped (see
/// [`Backend::reserve`]).
#[derive(Debug)]
pub struct Reservation {
    backend: Arc<Backend>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.backend.pending.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Backend {
    /// Clients picked for it that have not connected yet (see
    /// [`Backend::reserve`]).
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }

    /// Counts a client as picked for this backend until the returned guard
    /// is dropped (when its connection has started, or whatever else
    /// happens to it). Least connections adds these to the active count, so
    /// a burst of clients accepted faster than they connect is spread out
    /// instead of all going to the backend that looked idlest.
    pub fn reserve(self: &Arc<Self>) -> Reservation {
        self.pending.fetch_add(1, Ordering::Relaxed);
        Reservation {
            backend: Arc::clone(self),
        }
    }

    /// Its `max_connections`, or `None` when it has no cap.
    pub fn max_connections(&self) -> Option<usize> {
        match self.cap.limit.load(Ordering::Relaxed) {
            0 => None,
            n => Some(n),
        }
    }

    /// Sets (or, with `None`, lifts) its cap; connections beyond a lowered
    /// cap finish, and no new one comes until it is under it again.
    pub fn set_max_connections(&self, limit: Option<usize>) {
        self.cap.limit.store(limit.unwrap_or(0), Ordering::Relaxed);
    }

    /// Whether it has a cap: the one check the pick makes for every client
    /// (an atomic load), to stay off the capped path otherwise.
    #[inline]
    pub fn is_capped(&self) -> bool {
        self.cap.limit.load(Ordering::Relaxed) != 0
    }

    /// Whether it may take one more connection now: no cap, or its active
    /// and reserved connections under it.
    pub fn has_free_slot(&self) -> bool {
        match self.max_connections() {
            None => true,
            Some(limit) => self.active() + self.pending() < limit,
        }
    }

    /// Reserves a place on it if it is under its cap (or has none).
    ///
    /// The check and the reservation are one compare-and-swap on the
    /// reservations: of two threads racing for the last place, one wins.
    /// `active` may grow meanwhile only from a reservation (the worker
    /// counts the connection active, then drops the reservation), so the
    /// sum read here can be too high for a moment, never too low.
    pub fn try_reserve(self: &Arc<Self>) -> Option<Reservation> {
        let Some(limit) = self.max_connections() else {
            return Some(self.reserve());
        };
        let mut pending = self.pending.load(Ordering::Acquire);
        loop {
            if self.active() + pending >= limit {
                return None;
            }
            match self.pending.compare_exchange_weak(
                pending,
                pending + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    return Some(Reservation {
                        backend: Arc::clone(self),
                    })
                }
                Err(now) => pending = now,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend(limit: Option<usize>) -> Arc<Backend> {
        let b = Arc::new(Backend::new("b".into(), vec![], 1));
        b.set_max_connections(limit);
        b
    }

    #[test]
    fn parses_the_cap_and_refuses_zero_huge_and_garbage() {
        assert_eq!(parse("x", "5").unwrap(), 5);
        assert_eq!(parse("x", " 1000000 ").unwrap(), MAX_MAX_CONNECTIONS);
        for bad in [
            "0",
            "1000001",
            "99999999999999999999999",
            "-1",
            "five",
            "",
            "5k",
        ] {
            let err = parse("127.0.0.1:80,max_connections=", bad).unwrap_err();
            let text = err.to_string();
            assert!(text.contains("max_connections must be"), "{bad:?}: {text}");
            assert!(!text.contains('\n'), "{text}");
        }
    }

    #[test]
    fn reserves_up_to_the_cap_counting_active_connections() {
        let b = backend(Some(3));
        let active = b.start_connection();
        let r1 = b.try_reserve().unwrap();
        let r2 = b.try_reserve().unwrap();
        assert!(b.try_reserve().is_none());
        assert!(!b.has_free_slot());
        drop(r1);
        assert!(b.has_free_slot());
        let r3 = b.try_reserve().unwrap();
        assert!(b.try_reserve().is_none());
        drop((active, r2, r3));
        assert_eq!((b.active(), b.pending()), (0, 0));
        // Lifted: always room.
        b.set_max_connections(None);
        let many: Vec<_> = (0..10).map(|_| b.try_reserve().unwrap()).collect();
        assert_eq!(b.pending(), 10);
        drop(many);
    }

    #[test]
    fn racing_threads_take_the_last_places_once() {
        let b = backend(Some(7));
        let won = std::sync::Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..50 {
                        if let Some(r) = b.try_reserve() {
                            won.lock().unwrap().push(r);
                        }
                    }
                });
            }
        });
        assert_eq!(won.lock().unwrap().len(), 7);
        assert_eq!(b.pending(), 7);
    }
}
