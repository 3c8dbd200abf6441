//! A backend server: where it is, and what the balancer knows about it now.
//!
//! A [`Backend`] is created once, from a [`BackendSpec`], and shared as an
//! `Arc<Backend>` by the accept loop (which picks it), the workers (which
//! connect to it and count their connections on it) and, where enabled, the
//! health checker (which marks it up or down). Everything that changes after
//! start-up is an atomic, so no lock is ever held while a connection is being
//! proxied. The lock on the last check's record is taken by the health
//! thread once per check and by the admin API when it lists the backends;
//! no worker touches it. A flip of its state also tells the schedulers
//! holding it, on the flipping thread (see `availability.rs`).
//!
//! # Parts
//!
//! - this file: [`Backend`], its live state and [`Backend::connect`];
//! - `spec`: the backend as written ([`BackendSpec`]: `HOST:PORT` and its
//!   options);
//! - `cap`: its slots, the clients on their way to it and its
//!   `max_connections`;
//! - `standby`: backup or primary, and when it came back (slow start);
//! - `own_check`: its own health check settings (`check_port`, `rise`,
//!   ...), and `check_kind`, the kinds of check they name; both kept here,
//!   below `health`, which re-exports them;
//! - `origin`: where it came from ([`Origin`]: file, api, dns, srv, etcd);
//! - `steer`: the operator's drain and maintenance ([`Wanted`]) and what
//!   its agent says ([`AgentView`]), applied in one place.
//!
//! # Corresponds to the C article
//!
//! `struct server_info servers[_MAX_SERVERS]`, resolved here at start-up
//! (a typo fails before the first client; a worker never calls the
//! resolver); [`Backend::connect`] is `get_final_server_socket()`.

mod check_kind;
mod origin;
pub mod own_check;
mod spec;
mod standby;
mod steer;

use std::io::{self, ErrorKind};
use std::net::SocketAddr;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use crate::availability::{AvailabilityWatcher, Watchers};
use crate::dial;
use crate::error::Result;
use crate::lookup::Addresses;
use crate::proxy_protocol::Version;
use crate::throttle::LogThrottle;

pub use cap::Reservation;
pub use check_kind::CheckKind;
pub use origin::Origin;
pub use own_check::OwnCheck;
pub(crate) use spec::parse_port;
pub use spec::{help as backend_help, BackendSpec, OPTIONS as BACKEND_OPTIONS, SRV_PREFIX};
pub use standby::{coarse_now_ms, RAMP_FULL};
pub use steer::{AgentRecord, AgentView, Wanted};

pub mod cap;

/// A backend in use: its resolved addresses and its live state.
#[derive(Debug)]
pub struct Backend {
    /// A number unique to this backend for the life of the process; it stays
    /// the same when other backends are added or removed.
    id: u64,
    /// `HOST:PORT` as the user wrote it, for logs.
    name: String,
    /// The addresses, tried in order; a name's are looked up again
    /// (`resolve_interval`, reloads; `lookup.rs`), read without a lock.
    addrs: Addresses,
    /// Relative weight as configured (weighted algorithms only). An
    /// atomic, so that a reload or the admin API can change it in place,
    /// keeping the backend's connections, health and counters; the
    /// scheduler then rebuilds its snapshot. Its agent scales it.
    weight: AtomicU32,
    /// What its agent says (see `steer.rs`).
    pub agent: AgentView,
    /// Where it came from (see `origin.rs`), and the `srv:` name (or
    /// etcd prefix) that gave it.
    origin: Origin,
    source_name: Option<Arc<str>>,
    /// Connections being proxied to this backend right now.
    active: AtomicUsize,
    /// Connections ever handed to this backend.
    total: AtomicU64,
    /// False once health checks (active or passive) decided it is down.
    healthy: AtomicBool,
    /// True when an operator asked for no new connections.
    draining: AtomicBool,
    /// Connect failures in a row on real traffic (passive health).
    connect_failures: AtomicU32,
    /// Clients picked for it and not yet connected (waiting in the queue,
    /// or connecting); least connections and the cap count them with
    /// `active` (see `cap.rs`).
    pub(crate) pending: AtomicUsize,
    /// Its `max_connections` (see `cap.rs`).
    pub(crate) cap: cap::Cap,
    /// True while an operator holds it in maintenance: no new connections
    /// and no health checks.
    maint: AtomicBool,
    /// When its state (health, drain, maintenance) last changed: ms since
    /// the Unix epoch (0: never, since it was created).
    changed_ms: AtomicU64,
    /// Bytes sent to this backend by finished connections.
    bytes_to_backend: AtomicU64,
    /// Bytes sent back to clients by finished connections.
    bytes_to_client: AtomicU64,
    /// The last active health check: set by the health thread, read by the
    /// admin API.
    last_check: Mutex<Option<CheckRecord>>,
    /// The PROXY protocol version it is sent before each client's bytes
    /// (and a LOCAL header before each health check), or `None`. Fixed
    /// for the backend's life.
    send_proxy: Option<Version>,
    /// Its own `on_backend_down` and `on_backend_removed`, over its
    /// service's ([`Own::bits`](crate::connections::Own::bits); the
    /// connections' table reads them at connect, a reload may change them).
    ends: AtomicU8,
    /// The workers' "connect failed" warnings about this backend: one line
    /// a second at most, so a dead backend under load is not one line per
    /// client.
    connect_failure_log: LogThrottle,
    /// The schedulers to tell when it is taken out of rotation or put back.
    watchers: Watchers,
    /// Its own check (see `own_check.rs`): read by the health thread once
    /// per check, replaced by a reload; no worker reads it.
    pub(crate) own_check: ArcSwap<OwnCheck>,
    /// Backup or primary, and when it last came back (slow start).
    standby: standby::Standby,
    /// Connect failures ever, resets, timeouts, peak, time down, check
    /// progress: the stats page's and the metrics' figures (`tally.rs`).
    pub tally: crate::tally::Tally,
}

/// The result of one active health check, kept on the backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckRecord {
    /// `None` when the check passed, else why it failed.
    pub error: Option<String>,
    /// When the check ended.
    pub at: SystemTime,
    /// How long it took.
    pub took: Duration,
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Process-wide source of [`Backend::id`]s.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// What the connections' table keeps of a connection's backend.
impl crate::connections::Peer for Backend {
    fn peer_name(&self) -> &str {
        self.name()
    }

    fn peer_id(&self) -> u64 {
        self.id()
    }
}

impl Backend {
    /// Resolves a spec into a backend.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidBackend`](crate::error::Error::InvalidBackend) when the host does not resolve.
    pub fn from_spec(spec: &BackendSpec) -> Result<Backend> {
        if spec.is_srv() {
            let why = "its records' backends are made by the service that lists it";
            return Err(crate::error::Error::InvalidBackend(format!(
                "{}: {why}",
                spec.name()
            )));
        }
        let mut backend = Backend::new(spec.name(), spec.resolve()?, spec.weight);
        backend.addrs = backend.addrs.named(&spec.host, spec.port);
        if backend.addrs.lookup().is_some() {
            backend.origin = Origin::Dns;
        }
        backend.set_max_connections(spec.max_connections);
        Ok(backend
            .with_ends(spec.ends)
            .with_send_proxy(spec.send_proxy)
            .with_own_check(spec.check.clone())
            .with_backup(spec.backup))
    }

    /// The same backend, sent a PROXY protocol header of `version` before
    /// each client's bytes and each health check (`None`: no header).
    pub fn with_send_proxy(mut self, version: Option<Version>) -> Backend {
        self.send_proxy = version;
        self
    }

    /// The same backend, checked as `own` says (see `health/target.rs`).
    pub fn with_own_check(self, own: OwnCheck) -> Backend {
        self.own_check.store(Arc::new(own));
        self
    }

    /// Its own `on_backend_down` and `on_backend_removed`, if given.
    pub fn own_ends(&self) -> crate::connections::Own {
        crate::connections::Own::from_bits(self.ends.load(Ordering::Relaxed))
    }

    /// Changes its own `on_backend_down` and `on_backend_removed` (a
    /// reload): connections made from now on follow them.
    pub fn set_ends(&self, ends: crate::connections::Own) {
        self.ends.store(ends.bits(), Ordering::Relaxed);
    }

    /// The same backend, with its own `on_backend_down` and
    /// `on_backend_removed`.
    pub fn with_ends(self, ends: crate::connections::Own) -> Backend {
        self.set_ends(ends);
        self
    }

    /// The same backend, said to come from `origin`.
    pub fn with_origin(mut self, origin: Origin) -> Backend {
        self.origin = origin;
        self
    }

    /// Where it came from.
    pub fn origin(&self) -> Origin {
        self.origin
    }

    /// The PROXY protocol version this backend is sent, if any.
    pub fn send_proxy(&self) -> Option<Version> {
        self.send_proxy
    }

    /// A backend at known addresses (tests and the demo use this).
    pub fn new(name: String, addrs: Vec<SocketAddr>, weight: u32) -> Backend {
        Backend {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            addrs: Addresses::new(addrs, &name),
            name,
            weight: AtomicU32::new(weight.max(1)),
            agent: AgentView::default(),
            origin: Origin::File,
            source_name: None,
            active: AtomicUsize::new(0),
            total: AtomicU64::new(0),
            healthy: AtomicBool::new(true),
            draining: AtomicBool::new(false),
            connect_failures: AtomicU32::new(0),
            pending: AtomicUsize::new(0),
            cap: cap::Cap::default(),
            maint: AtomicBool::new(false),
            changed_ms: AtomicU64::new(now_ms()),
            bytes_to_backend: AtomicU64::new(0),
            bytes_to_client: AtomicU64::new(0),
            last_check: Mutex::new(None),
            send_proxy: None,
            ends: AtomicU8::new(0),
            connect_failure_log: LogThrottle::new(Duration::from_secs(1)),
            watchers: Watchers::default(),
            own_check: ArcSwap::from_pointee(OwnCheck::default()),
            standby: standby::Standby::default(),
            tally: Default::default(),
        }
    }

    /// The stable identifier of this backend.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// `HOST:PORT`, for logs.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The resolved addresses now, in the order they are tried.
    pub fn addrs(&self) -> Arc<Vec<SocketAddr>> {
        self.addrs.now()
    }

    /// Its addresses, and its name's lookups when it was given by name.
    pub fn addresses(&self) -> &Addresses {
        &self.addrs
    }

    /// The relative weight the schedulers use: the configured one scaled
    /// by its agent's percentage (`steer.rs`).
    pub fn weight(&self) -> u32 {
        self.agent.scale(self.configured_weight())
    }

    /// Changes the weight (at least 1). The scheduler precomputes from the
    /// weights: call [`crate::scheduler::Scheduler::refresh`] afterwards.
    pub fn set_weight(&self, weight: u32) {
        self.weight.store(weight.max(1), Ordering::Relaxed);
    }

    /// Connections being proxied to it now.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    /// Connections ever handed to it.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// Whether health checks consider it up.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Sets the health state; returns the previous one.
    pub fn set_healthy(&self, healthy: bool) -> bool {
        let was = self.healthy.swap(healthy, Ordering::Relaxed);
        if was != healthy {
            self.changed();
        }
        if was && !healthy {
            // `on_backend_down: close`: its connections end now.
            let closed = crate::connections::table().backend_down(self.id);
            if closed > 0 {
                log::info!(
                    "backend {}: {closed} connection(s) closed (on_backend_down: close)",
                    self.name
                );
            }
        }
        was
    }

    /// Whether an operator asked it to take no new connections.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Stops (or resumes) new connections to this backend.
    pub fn set_draining(&self, draining: bool) {
        if self.draining.swap(draining, Ordering::Relaxed) != draining {
            self.changed();
        }
    }

    /// Whether an operator holds it in maintenance.
    pub fn is_maint(&self) -> bool {
        self.maint.load(Ordering::Relaxed)
    }

    /// Puts it in (or takes it out of) maintenance: while set, no new
    /// connection is sent to it and the health checks skip it.
    pub fn set_maint(&self, maint: bool) {
        if self.maint.swap(maint, Ordering::Relaxed) != maint {
            self.changed();
        }
    }

    /// Its state as the API, the metrics and the stats page name it:
    /// `maint`, `draining`, `down` or `up`, the operator's word first.
    pub fn state_name(&self) -> &'static str {
        if self.is_maint() {
            "maint"
        } else if self.is_draining() {
            "draining"
        } else if !self.is_healthy() || self.agent.says_down() {
            "down"
        } else {
            "up"
        }
    }

    /// How long ago its state last changed (or it was created).
    pub fn since_change(&self) -> Duration {
        Duration::from_millis(now_ms().saturating_sub(self.changed_ms.load(Ordering::Relaxed)))
    }

    /// Records a flip of its state and tells the schedulers holding it.
    fn changed(&self) {
        self.changed_ms.store(now_ms(), Ordering::Relaxed);
        if self.is_available() {
            self.standby.came_back();
        }
        self.watchers.tell(self.id);
    }

    /// Tells `watcher` of every later flip of its availability.
    pub(crate) fn watch(&self, watcher: Weak<dyn AvailabilityWatcher>) {
        self.watchers.add(watcher);
    }

    /// Whether a scheduler may pick it: healthy (as its checks and its
    /// agent say), not draining, not in maintenance.
    pub fn is_available(&self) -> bool {
        self.is_healthy() && !self.agent.says_down() && !self.is_draining() && !self.is_maint()
    }

    /// Records a failed connect on real traffic; returns the failures in a row.
    pub fn record_connect_failure(&self) -> u32 {
        self.tally.connect_failed();
        self.connect_failures.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Connect failures on real traffic in a row, now.
    pub fn connect_failures_in_a_row(&self) -> u32 {
        self.connect_failures.load(Ordering::Relaxed)
    }

    /// Where the workers' warnings about failed connects to it are
    /// throttled (one line a second).
    pub(crate) fn connect_failure_log(&self) -> &LogThrottle {
        &self.connect_failure_log
    }

    /// Connect failures on real traffic since start-up.
    pub fn connect_failures_total(&self) -> u64 {
        self.tally.connect_failures()
    }

    /// Counts the bytes a finished connection moved each way.
    pub fn add_bytes(&self, to_backend: u64, to_client: u64) {
        self.bytes_to_backend
            .fetch_add(to_backend, Ordering::Relaxed);
        self.bytes_to_client.fetch_add(to_client, Ordering::Relaxed);
    }

    /// Bytes sent to it by finished connections.
    pub fn bytes_to_backend(&self) -> u64 {
        self.bytes_to_backend.load(Ordering::Relaxed)
    }

    /// Bytes it sent back to clients, over finished connections.
    pub fn bytes_to_client(&self) -> u64 {
        self.bytes_to_client.load(Ordering::Relaxed)
    }

    /// Keeps the result of an active check (the health thread calls this).
    pub fn record_check(&self, record: CheckRecord) {
        *self.last_check.lock() = Some(record);
    }

    /// The last active check, if any ran.
    pub fn last_check(&self) -> Option<CheckRecord> {
        self.last_check.lock().clone()
    }

    /// Records a successful connect on real traffic.
    pub fn record_connect_success(&self) {
        if self.connect_failures.load(Ordering::Relaxed) != 0 {
            self.connect_failures.store(0, Ordering::Relaxed);
        }
    }

    /// Opens a TCP connection to the first of the backend's addresses that
    /// answers within `timeout`, with `TCP_NODELAY` set.
    ///
    /// The connect is a plain blocking `connect(2)` bounded by `SO_SNDTIMEO`,
    /// which Linux applies to `connect` too (it then fails with `EINPROGRESS`,
    /// reported here as `TimedOut`). `TcpStream::connect_timeout` would do the
    /// same work in five system calls (switch to non-blocking, connect, `poll`,
    /// switch back); this takes three, and a connection to a backend on the same
    /// host is usually complete by the time `connect` returns.
    ///
    /// # Errors
    ///
    /// The last address's error, or `InvalidInput` if the backend has none.
    pub fn connect(&self, timeout: Duration) -> io::Result<TcpStream> {
        let mut last = None;
        let addrs = self.addrs.load();
        for addr in addrs.iter() {
            match dial::connect_one(*addr, timeout) {
                Ok(stream) => return Ok(stream),
                Err(err) => last = Some(err),
            }
        }
        // Made only when needed: an `io::Error` with a message takes two
        // allocations, whose `malloc` calls run deep on a worker's stack
        // (docs/internals.md, "The pool").
        Err(last
            .unwrap_or_else(|| io::Error::new(ErrorKind::InvalidInput, "backend has no address")))
    }

    /// Counts a connection as started on this backend. The returned guard
    /// counts it as ended when dropped, whatever ends the connection (an
    /// error, a panic, a normal close), so the count never drifts.
    pub fn start_connection(&self) -> ActiveGuard<'_> {
        self.active.fetch_add(1, Ordering::Relaxed);
        self.total.fetch_add(1, Ordering::Relaxed);
        ActiveGuard { backend: self }
    }
}

/// Decrements [`Backend::active`] when dropped.
#[derive(Debug)]
pub struct ActiveGuard<'a> {
    backend: &'a Backend,
}

impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        self.backend.active.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_host_port_and_weight() {
        let spec = BackendSpec::parse("127.0.0.1:8001,weight=5").unwrap();
        assert_eq!(spec.host, "127.0.0.1");
        assert_eq!(spec.port, 8001);
        assert_eq!(spec.weight, 5);
        let v6 = BackendSpec::parse("[::1]:9000").unwrap();
        assert_eq!(v6.host, "::1");
        assert_eq!(v6.name(), "[::1]:9000");
    }

    #[test]
    fn refuses_bad_specs() {
        for bad in [
            "",
            "127.0.0.1",
            "127.0.0.1:0",
            "127.0.0.1:65536",
            "127.0.0.1:http",
            ":80",
            "::1:80",
            "127.0.0.1:80,weight=0",
            "127.0.0.1:80,weight=x",
            "127.0.0.1:80,color=red",
            "127.0.0.1:80,send-proxy-v3",
            "127.0.0.1:80,send-proxy,send-proxy-v2",
        ] {
            assert!(BackendSpec::parse(bad).is_err(), "accepted {bad:?}");
        }
    }

    #[test]
    fn parses_send_proxy_options() {
        let plain = BackendSpec::parse("127.0.0.1:8001").unwrap();
        assert_eq!(plain.send_proxy, None);
        let v1 = BackendSpec::parse("127.0.0.1:8001,send-proxy").unwrap();
        assert_eq!(v1.send_proxy, Some(Version::V1));
        let v2 = BackendSpec::parse("[::1]:8001,weight=2,send-proxy-v2").unwrap();
        assert_eq!((v2.weight, v2.send_proxy), (2, Some(Version::V2)));
        // Written back the way it was given, so --help and logs show it.
        assert_eq!(v1.to_string(), "127.0.0.1:8001,send-proxy");
        assert_eq!(v2.to_string(), "[::1]:8001,weight=2,send-proxy-v2");
        assert_eq!(BackendSpec::parse(&v2.to_string()).unwrap(), v2);
        let backend = Backend::from_spec(&v1).unwrap();
        assert_eq!(backend.send_proxy(), Some(Version::V1));
        let err = BackendSpec::parse("127.0.0.1:80,proxy").unwrap_err();
        assert!(err.to_string().contains("send-proxy-v2"), "{err}");
    }

    #[test]
    fn resolves_localhost_ipv4_first() {
        let addrs = BackendSpec::parse("localhost:8001")
            .unwrap()
            .resolve()
            .unwrap();
        assert!(addrs[0].is_ipv4(), "{addrs:?}");
    }

    #[test]
    fn reservation_counts_down_on_drop() {
        let b = Arc::new(Backend::new("b".into(), vec![], 1));
        let r1 = b.reserve();
        let r2 = b.reserve();
        assert_eq!(b.pending(), 2);
        drop(r1);
        assert_eq!(b.pending(), 1);
        drop(r2);
        assert_eq!(b.pending(), 0);
    }

    #[test]
    fn active_guard_counts_down_on_drop() {
        let b = Backend::new("b".into(), vec![], 1);
        {
            let _g1 = b.start_connection();
            let _g2 = b.start_connection();
            assert_eq!(b.active(), 2);
        }
        assert_eq!(b.active(), 0);
        assert_eq!(b.total(), 2);
    }

    mod properties {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            /// Random text never panics the parser.
            #[test]
            fn random_text_never_panics(text in ".{0,40}") {
                let _ = BackendSpec::parse(&text);
            }

            /// Text near the grammar (hosts, brackets, ports, options)
            /// never panics it either.
            #[test]
            fn spec_like_text_never_panics(text in "\\[?[a-z0-9.:]{0,12}\\]?(:[0-9]{0,6})?(,[a-z=0-9]{0,10}){0,2}") {
                let _ = BackendSpec::parse(&text);
            }

            /// A spec written out parses back equal: names, IPv4 and IPv6
            /// literals, any port, any weight.
            #[test]
            fn a_formatted_spec_parses_back(
                host in prop_oneof![
                    "[a-z][a-z0-9-]{0,10}(\\.[a-z][a-z0-9-]{0,10}){0,2}",
                    any::<std::net::Ipv4Addr>().prop_map(|ip| ip.to_string()),
                    any::<std::net::Ipv6Addr>().prop_map(|ip| ip.to_string()),
                ],
                port in 1u16..,
                weight in 1u32..=1000,
                backup in any::<bool>(),
            ) {
                let spec = BackendSpec {
                    host,
                    port,
                    weight,
                    send_proxy: None,
                    check: OwnCheck::default(),
                    max_connections: None,
                    backup,
                    ends: Default::default(),
                };
                prop_assert_eq!(BackendSpec::parse(&spec.to_string()).ok(), Some(spec));
            }
        }
    }

    use crate::availability::AvailabilityWatcher;
    use std::sync::Weak;

    #[derive(Default)]
    struct Counter(AtomicUsize);

    impl AvailabilityWatcher for Counter {
        fn availability_changed(&self, _: u64) {
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
