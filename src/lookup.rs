//! A backend's addresses ([`Addresses`]) and its host name's lookups
//! ([`Lookup`]): what a name gives (IPv4 first, at most
//! [`MAX_ADDRESSES`]), looked up again every `resolve_interval` and at
//! every reload (see `resolver.rs`). A name with several addresses stays
//! one backend, whose connect tries them in turn.
//!
//! # Threads
//!
//! The list is an `ArcSwap`: a worker reads it with one atomic load and
//! no lock, and a connection keeps the address it connected to when the
//! list is swapped. Lookups run on the resolver thread and the reloading
//! thread, never on a worker or an accept loop: `getaddrinfo(3)` may wait
//! seconds for a DNS server. A lookup's record is behind a mutex taken
//! once per lookup and by the admin API; no I/O is done under it.
//!
//! # Corresponds to the C article
//!
//! The C resolves each server once, with `gethostbyname()`, when it is
//! typed at the prompt; this is that call, made again later.

use std::io;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use arc_swap::{ArcSwap, Guard};
use parking_lot::Mutex;

use crate::throttle::LogThrottle;

/// Most addresses kept from one name: the first ones, IPv4 before IPv6.
/// A connect tries a backend's addresses in turn, each up to
/// `connect_timeout`, so a name giving hundreds would hold a worker for
/// minutes while a client waits; sixteen is more than any real pool of
/// servers behind one name, and the log says when some were left out.
pub const MAX_ADDRESSES: usize = 16;

/// How often a name whose lookups keep failing is written in the log: its
/// first failure at once, then one line at most this often, saying how
/// many failed meanwhile. A name gone for good is then a line an hour,
/// not one per `resolve_interval`.
pub const FAILURE_LOG_EVERY: Duration = Duration::from_secs(3600);

/// Lookups made and lookups failed since start-up by one source of
/// backends (the metrics' `rodizio_discovery_lookups_total` and
/// `rodizio_discovery_errors_total`, labelled `source`). Process-wide:
/// a source's lookups are the process's, whichever service asked.
#[derive(Debug)]
pub struct SourceCount {
    lookups: AtomicU64,
    errors: AtomicU64,
}

impl SourceCount {
    /// Nothing counted yet.
    pub const fn new() -> SourceCount {
        SourceCount {
            lookups: AtomicU64::new(0),
            errors: AtomicU64::new(0),
        }
    }

    /// Counts one lookup, failed or not.
    pub fn count(&self, ok: bool) {
        self.lookups.fetch_add(1, Ordering::Relaxed);
        if !ok {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Lookups since start-up.
    pub fn lookups(&self) -> u64 {
        self.lookups.load(Ordering::Relaxed)
    }

    /// Failed lookups since start-up.
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }
}

impl Default for SourceCount {
    fn default() -> Self {
        SourceCount::new()
    }
}

/// `dns`: backends' host names looked up again.
pub static DNS: SourceCount = SourceCount::new();
/// `srv`: `srv:` names' records looked up.
pub static SRV: SourceCount = SourceCount::new();
/// `etcd`: reads and watches of an etcd prefix.
pub static ETCD: SourceCount = SourceCount::new();

/// Every source that looks backends up, with its word.
pub fn sources() -> [(&'static str, &'static SourceCount); 3] {
    [("dns", &DNS), ("srv", &SRV), ("etcd", &ETCD)]
}

/// The addresses `host` gives for `port`: IPv4 first, duplicates removed
/// (all of them: a backend keeps [`MAX_ADDRESSES`]).
///
/// IPv4 comes first because `localhost` often resolves to `::1` before
/// `127.0.0.1`, while the article's `python3 -m http.server` listens on
/// IPv4 only; the other addresses are still tried in order.
///
/// # Errors
///
/// The resolver's (the name is unknown, the DNS server cannot be
/// reached), or `NotFound` when it gives no address.
pub fn addresses(host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
    let mut addrs: Vec<SocketAddr> = (host, port).to_socket_addrs()?.collect();
    // A stable sort: within each family, the resolver's order stays.
    addrs.sort_by_key(|a| a.is_ipv6());
    addrs.dedup();
    if addrs.is_empty() {
        return Err(io::Error::new(io::ErrorKind::NotFound, "no address"));
    }
    Ok(addrs)
}

/// `addrs` cut to [`MAX_ADDRESSES`], saying so for `backend` when `warn`.
fn capped(mut addrs: Vec<SocketAddr>, backend: &str, warn: bool) -> Vec<SocketAddr> {
    if addrs.len() > MAX_ADDRESSES && warn {
        log::warn!(
            "backend {backend}: the name gives {} addresses; the first {MAX_ADDRESSES} are used",
            addrs.len()
        );
    }
    addrs.truncate(MAX_ADDRESSES);
    addrs
}

/// Addresses as a log line lists them: `10.0.0.5:5432, 10.0.0.6:5432`.
pub fn list(addrs: &[SocketAddr]) -> String {
    let words: Vec<String> = addrs.iter().map(ToString::to_string).collect();
    words.join(", ")
}

/// A list of addresses, shared: what a connect reads, what a swap replaces.
pub type List = Arc<Vec<SocketAddr>>;

/// A backend's addresses, and its host name's lookups when it has one.
#[derive(Debug)]
pub struct Addresses {
    /// The addresses now, tried in order.
    list: ArcSwap<Vec<SocketAddr>>,
    /// The host name's lookups; `None` for an IP address. Boxed: most
    /// backends have none.
    lookup: Option<Box<Lookup>>,
    /// How many addresses the last lookup gave, before the cap: the
    /// warning about a cut list is logged when this changes, not at every
    /// lookup.
    given: AtomicUsize,
}

impl Addresses {
    /// The addresses of `backend` (at most [`MAX_ADDRESSES`]: the log
    /// says when more were given), not looked up again unless
    /// [`named`](Self::named).
    pub fn new(addrs: Vec<SocketAddr>, backend: &str) -> Addresses {
        let given = AtomicUsize::new(addrs.len());
        Addresses {
            list: ArcSwap::from_pointee(capped(addrs, backend, true)),
            lookup: None,
            given,
        }
    }

    /// The same addresses, found from `host`: looked up again later when
    /// `host` is a name, not an IP address.
    pub fn named(self, host: &str, port: u16) -> Addresses {
        let lookup = host
            .parse::<IpAddr>()
            .is_err()
            .then(|| Lookup::new(host, port));
        Addresses {
            lookup: lookup.map(Box::new),
            ..self
        }
    }

    /// Puts `addrs` in place of the addresses (a `srv:` record's target
    /// moved); true when they changed. Connections in flight keep theirs.
    pub fn replace(&self, addrs: Vec<SocketAddr>) -> bool {
        if **self.list.load() == addrs {
            return false;
        }
        self.list.store(Arc::new(addrs));
        true
    }

    /// The addresses for one connect: one atomic load, no lock.
    pub fn load(&self) -> Guard<Arc<Vec<SocketAddr>>> {
        self.list.load()
    }

    /// The addresses now, to keep.
    pub fn now(&self) -> Arc<Vec<SocketAddr>> {
        self.list.load_full()
    }

    /// The host name's lookups, when it has one.
    pub fn lookup(&self) -> Option<&Lookup> {
        self.lookup.as_deref()
    }

    /// Lookups of the host name that failed (0 for an IP address).
    pub fn failures(&self) -> u64 {
        self.lookup.as_ref().map_or(0, |l| l.failures())
    }

    /// Looks the host name up again (nothing for an IP address) and, when
    /// the addresses changed, swaps them: new connections go to the new
    /// ones, connections in flight keep theirs. A failed lookup keeps the
    /// last addresses (counted, and logged throttled). Returns the change,
    /// `(was, now)`, if any. `backend` names it in the log.
    pub fn resolve_again(&self, backend: &str) -> Option<(List, List)> {
        let found = self.lookup.as_ref()?.run(backend).ok()?;
        let changed = self.given.swap(found.len(), Ordering::Relaxed) != found.len();
        let now = Arc::new(capped(found, backend, changed));
        if *now == **self.list.load() {
            return None;
        }
        let was = self.list.swap(Arc::clone(&now));
        log::info!(
            "backend {backend}: the name now gives {} (was {}); new connections go there",
            list(&now),
            list(&was)
        );
        Some((was, now))
    }
}

/// What the last lookup of a name found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookupRecord {
    /// When it ended.
    pub at: SystemTime,
    /// `None` when it gave addresses, else the resolver's error in words.
    pub error: Option<String>,
}

/// A backend's host name, looked up again from time to time.
#[derive(Debug)]
pub struct Lookup {
    /// The name as written (`db.internal`).
    host: String,
    /// The backend's port.
    port: u16,
    /// The last lookup since start-up (`None`: none since then).
    last: Mutex<Option<LookupRecord>>,
    /// When the last lookup started, as ms since `epoch` plus 1 (0: never):
    /// the resolver thread's "is it due" reads this without a lock.
    started_ms: AtomicU64,
    /// The clock `started_ms` counts from.
    epoch: Instant,
    /// Lookups that failed, ever.
    failures: AtomicU64,
    /// Failures written in the log: see [`FAILURE_LOG_EVERY`].
    failure_log: LogThrottle,
}

impl Lookup {
    /// The lookups of `host` for `port`, none run yet.
    pub fn new(host: &str, port: u16) -> Lookup {
        Lookup {
            host: host.to_string(),
            port,
            last: Mutex::new(None),
            started_ms: AtomicU64::new(0),
            epoch: Instant::now(),
            failures: AtomicU64::new(0),
            failure_log: LogThrottle::new(FAILURE_LOG_EVERY),
        }
    }

    /// The name looked up.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// Looks the name up now and records the result: the addresses, or
    /// the error after counting it and, throttled, logging it for
    /// `backend` (whose addresses then stay as they were).
    ///
    /// # Errors
    ///
    /// The lookup's, in words.
    pub fn run(&self, backend: &str) -> Result<Vec<SocketAddr>, String> {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.started_ms
            .store(ms.saturating_add(1), Ordering::Relaxed);
        let result = addresses(&self.host, self.port);
        DNS.count(result.is_ok());
        let error = result.as_ref().err().map(|e| e.to_string());
        *self.last.lock() = Some(LookupRecord {
            at: SystemTime::now(),
            error: error.clone(),
        });
        match result {
            Ok(addrs) => Ok(addrs),
            Err(_) => {
                let error = error.unwrap_or_default();
                self.failures.fetch_add(1, Ordering::Relaxed);
                if let Some(missed) = self.failure_log.event(Instant::now()) {
                    let more = if missed > 0 {
                        format!(" ({missed} more failed since the last line)")
                    } else {
                        String::new()
                    };
                    log::warn!(
                        "backend {backend}: looking up {} again failed: {error}; \
                         its last addresses stay in use{more}",
                        self.host
                    );
                }
                Err(error)
            }
        }
    }

    /// Time until a lookup every `interval` is due (zero: now).
    pub fn due_in(&self, interval: Duration) -> Duration {
        let started = self.started_ms.load(Ordering::Relaxed);
        if started == 0 {
            return Duration::ZERO;
        }
        let since = self
            .epoch
            .elapsed()
            .saturating_sub(Duration::from_millis(started - 1));
        interval.saturating_sub(since)
    }

    /// The last lookup's result, if one ran since start-up.
    pub fn last(&self) -> Option<LookupRecord> {
        self.last.lock().clone()
    }

    /// Lookups that failed since start-up.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn localhost_gives_ipv4_first() {
        let addrs = addresses("localhost", 8001).unwrap();
        assert!(addrs[0].is_ipv4(), "{addrs:?}");
    }

    #[test]
    fn a_failed_lookup_is_counted_and_recorded() {
        // A NUL byte fails before any resolver runs: no DNS server is
        // asked, so the test does not depend on the network.
        let lookup = Lookup::new("no\0name", 80);
        assert_eq!(lookup.due_in(Duration::from_secs(5)), Duration::ZERO);
        assert!(lookup.last().is_none());
        assert!(lookup.run("no name:80").is_err());
        assert_eq!(lookup.failures(), 1);
        let last = lookup.last().unwrap();
        assert!(last.error.is_some());
        // Just run: not due again for about the interval.
        assert!(lookup.due_in(Duration::from_secs(5)) > Duration::from_secs(4));
    }

    #[test]
    fn only_names_are_looked_up_again_and_a_change_is_swapped_in() {
        let old: SocketAddr = "127.0.0.9:80".parse().unwrap();
        let literal = Addresses::new(vec![old], "b").named("127.0.0.9", 80);
        assert!(literal.lookup().is_none());
        assert!(literal.resolve_again("x").is_none());
        let name = Addresses::new(vec![old], "b").named("localhost", 80);
        let held = name.now();
        let (was, now) = name.resolve_again("localhost:80").unwrap();
        assert_eq!(*was, [old]);
        assert!(now[0].ip().is_loopback() && now[0].is_ipv4(), "{now:?}");
        assert_eq!(*name.now(), *now);
        // What a connection took before the swap is still what it was.
        assert_eq!(*held, [old]);
        // The same answer again: no change.
        assert!(name.resolve_again("localhost:80").is_none());
        assert_eq!(name.failures(), 0);
    }

    #[test]
    fn a_backend_keeps_at_most_the_cap() {
        let many: Vec<SocketAddr> = (1..=100u16)
            .map(|p| SocketAddr::from(([127, 0, 0, 1], p)))
            .collect();
        let kept = Addresses::new(many.clone(), "b").now();
        assert_eq!(*kept, many[..MAX_ADDRESSES]);
    }

    #[test]
    fn a_literal_resolves_to_itself() {
        let lookup = Lookup::new("127.0.0.1", 80);
        let addrs = lookup.run("127.0.0.1:80").unwrap();
        assert_eq!(addrs, ["127.0.0.1:80".parse().unwrap()]);
        assert_eq!(lookup.last().unwrap().error, None);
    }
}
