//! Backend health: active checks on a thread of their own, passive checks on
//! real traffic, and what a client gets when no backend can serve it.
//!
//! Each backend's [`Probe`] (no clock, no I/O) flips it down after `--fall`
//! failed checks in a row and up after `--rise` passed ones; workers count
//! connect failures, and [`connect_failed`] marks a backend down at once after
//! `--passive-failures`. A failure of this host (no descriptor, memory or
//! local port left) counts neither way. Health is the probes' opinion,
//! draining the operator's: separate flags. Parts: this file
//! ([`HealthConfig`], [`connect_failed`], [`spawn`]), [`probe`],
//! [`mod@check`], [`protocol`], [`agent`] (a backend's agent, asked how
//! it is), `checker`, `target` (where a backend's checks go), and [`survey`] (`rodizio probe`: every kind once against
//! one server); a backend's own check settings are `backend`'s
//! ([`OwnCheck`], [`CheckKind`]). The details:
//! docs/health-checks.md, "Inside the checker".
//!
//! # Threads
//!
//! One thread (`rodizio-health`) runs a round when a backend's check is due
//! (each `--health-interval`, or a backend's own), each probe on a
//! short-lived thread of its own; between rounds it sleeps on
//! [`Shutdown::receiver`], so a shutdown wakes it at once. Passive marking
//! runs on the worker whose connect failed.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C sends clients to a dead backend forever.

pub mod agent;
pub mod check;
mod checker;
pub mod probe;
pub mod protocol;
pub mod survey;
mod target;

use std::borrow::Cow;
use std::io;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::scheduler::Scheduler;
use crate::shutdown::Shutdown;
use crate::stats::Stats;
use crate::system;
use crate::throttle;
use crate::units;

/// A backend's own check, kept with the backend it belongs to.
pub use crate::backend::own_check as own;
pub use crate::backend::{CheckKind, OwnCheck};
pub use check::{check, CheckFailure};
pub use probe::{Probe, Transition, Verdict};

/// Health settings (a part of [`crate::Config`]). Every field may change
/// while the balancer runs: the checker reads them at each round, the
/// workers once per connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthConfig {
    /// The active check. Default tcp.
    pub check: CheckKind,
    /// Time between rounds of checks. Default 5 s.
    pub interval: Duration,
    /// Longest wait for one check. Default 2 s.
    pub timeout: Duration,
    /// Path of the http check. Default `/health`.
    pub path: String,
    /// Failures in a row to go down. Default 3.
    pub fall: u32,
    /// Successes in a row to come back up. Default 2.
    pub rise: u32,
    /// Connect failures in a row on real traffic to go down; 0 disables.
    /// Default 3.
    pub passive_failures: u32,
    /// With checks off, rest before retrying a down backend. Default 10 s.
    pub cooldown: Duration,
    /// Answer 503/502 instead of closing silently. Default false.
    pub http_replies: bool,
    /// The user of the `mysql` and `pgsql` checks (`health_user`). Default
    /// none: `mysql` then only reads the greeting, `pgsql` asks for
    /// `rodizio`.
    pub user: Option<String>,
    /// Bytes the `send-expect` check sends first (`health_send`). Default
    /// none: it only reads.
    pub send: Option<Vec<u8>>,
    /// Bytes the `send-expect` check wants in the reply (`health_expect`).
    pub expect: Option<Vec<u8>>,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            check: CheckKind::Tcp,
            interval: Duration::from_secs(5),
            timeout: Duration::from_secs(2),
            path: "/health".into(),
            fall: 3,
            rise: 2,
            passive_failures: 3,
            cooldown: Duration::from_secs(10),
            http_replies: false,
            user: None,
            send: None,
            expect: None,
        }
    }
}

impl HealthConfig {
    /// Checks that every value is usable.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSetting`] naming the first bad setting.
    pub fn validate(&self) -> Result<()> {
        for (name, d) in [
            ("health_interval", self.interval),
            ("health_timeout", self.timeout),
            ("health_cooldown", self.cooldown),
        ] {
            if d.is_zero() {
                return Err(Error::setting(name, "must be more than 0"));
            }
        }
        if self.fall == 0 {
            return Err(Error::setting("fall", "must be at least 1"));
        }
        if self.rise == 0 {
            return Err(Error::setting("rise", "must be at least 1"));
        }
        if self.check == CheckKind::SendExpect && self.expect.as_ref().map_or(true, Vec::is_empty) {
            return Err(Error::setting(
                "health_expect",
                "must be given (and not empty) with `health_check` send-expect",
            ));
        }
        if !own::usable_path(&self.path) {
            return Err(Error::setting(
                "health_path",
                "must start with / and contain no spaces or control characters",
            ));
        }
        Ok(())
    }
}

impl HealthConfig {
    /// These settings as a backend's own check changes them (its kind,
    /// path, interval, rise and fall): borrowed when it changes none.
    pub fn for_backend<'a>(&'a self, own: &OwnCheck) -> Cow<'a, HealthConfig> {
        let OwnCheck {
            kind,
            path,
            interval,
            rise,
            fall,
            ..
        } = own;
        if kind.is_none()
            && path.is_none()
            && interval.is_none()
            && rise.is_none()
            && fall.is_none()
        {
            return Cow::Borrowed(self);
        }
        Cow::Owned(HealthConfig {
            check: kind.unwrap_or(self.check),
            path: path.clone().unwrap_or_else(|| self.path.clone()),
            interval: interval.unwrap_or(self.interval),
            rise: rise.unwrap_or(self.rise),
            fall: fall.unwrap_or(self.fall),
            ..self.clone()
        })
    }
}

/// Marks `backend` down (logging it once) and returns `true` when it is
/// healthy now, so this change is the first.
pub(crate) fn mark_down(backend: &Backend, reason: &str) -> bool {
    let was_up = backend.set_healthy(false);
    if was_up {
        backend.tally.health_changed(false);
        log::warn!("backend {} is now DOWN ({reason})", backend.name());
    }
    was_up
}

/// Marks `backend` up (logging it once).
pub(crate) fn mark_up(backend: &Backend, reason: &str) {
    if !backend.set_healthy(true) {
        backend.tally.health_changed(true);
        log::info!("backend {} is now UP ({reason})", backend.name());
    }
}

/// `1 failed check`, `3 failed checks in a row`: a streak for a log line.
pub(crate) fn in_a_row(n: u64, noun: &str) -> String {
    let counted = units::count(n, noun);
    if n == 1 {
        counted
    } else {
        format!("{counted} in a row")
    }
}

/// Passive health: a worker's connect to `backend` failed with `err`.
/// Returns the backend's connect failures in a row now (for the trace).
///
/// A failure of this host ([`system::is_local_failure`]: no memory,
/// buffer, local port or descriptor left) says nothing about the backend:
/// it is not added to its failures in a row, so a burst cannot mark every
/// backend down. Any other failure is, and the backend is marked down once
/// `passive_failures` of them are in a row.
///
/// Either way the worker's warning comes at most once a second per backend
/// (a dead backend under load would otherwise log one line per client),
/// with the count of the others, and names the streak from its second
/// failure on.
pub fn connect_failed(backend: &Backend, config: &HealthConfig, err: &io::Error) -> u32 {
    let local = system::is_local_failure(err);
    let failures = if local {
        backend.connect_failures_in_a_row()
    } else {
        backend.record_connect_failure()
    };
    if let Some(others) = backend.connect_failure_log().event(Instant::now()) {
        let streak = match (local, failures) {
            (true, _) => " (a limit of this host: not counted against the backend)".to_string(),
            (false, 0 | 1) => String::new(),
            (false, n) => format!(" ({n} in a row)"),
        };
        log::warn!(
            "backend {} connect failed{streak}: {err}{}",
            backend.name(),
            throttle::more(others)
        );
    }
    if !local && config.passive_failures > 0 && failures >= config.passive_failures {
        let failed = in_a_row(u64::from(failures), "connect failure");
        mark_down(backend, &format!("{failed} on client traffic: {err}"));
    }
    failures
}

/// What to do once the first round of active checks is done (the balancer
/// then tells systemd it is ready): the backends' states are known.
pub type FirstRound = Box<dyn FnOnce() + Send>;

/// Starts the health thread if the configuration needs one (active checks,
/// or passive checks that need the cool-down); returns its handle. The
/// thread exits when `shutdown` is triggered. `first_round` runs once the
/// first round of checks is done, or at once when active checks are off.
/// `tls`, the service's TLS when it has any, makes its `tls` checks whole
/// handshakes when it re-encrypts (`backend_tls`).
///
/// # Errors
///
/// [`Error::Io`] when the thread cannot be started.
pub fn spawn(
    scheduler: Arc<Scheduler>,
    config: Arc<ArcSwap<HealthConfig>>,
    stats: Arc<Stats>,
    shutdown: Shutdown,
    first_round: FirstRound,
    tls: Option<Arc<ArcSwap<crate::tls_term::Terminator>>>,
) -> Result<Option<JoinHandle<()>>> {
    let mut first_round = Some(first_round);
    {
        let now = config.load();
        // A backend may check itself while the service does not.
        let own = scheduler.snapshot().iter().any(|b| {
            let own = b.own_check();
            own.agent_port.is_some() || own.kind.is_some_and(|kind| kind != CheckKind::Off)
        });
        if now.check == CheckKind::Off && !own {
            if let Some(hook) = first_round.take() {
                hook();
            }
        }
        if now.check == CheckKind::Off && now.passive_failures == 0 && !own {
            return Ok(None);
        }
        log::debug!(
            "health checks: {} every {:?}",
            now.check.name(),
            now.interval
        );
    }
    thread::Builder::new()
        .name("rodizio-health".into())
        .spawn(move || {
            checker::Checker::new(config, stats, tls).run(&scheduler, &shutdown, first_round)
        })
        .map(Some)
        .map_err(|e| Error::io("starting the health thread", e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::ErrorKind;
    use std::net::{SocketAddr, TcpListener};
    use std::time::Instant;

    fn live(config: HealthConfig) -> Arc<ArcSwap<HealthConfig>> {
        Arc::new(ArcSwap::from_pointee(config))
    }

    #[test]
    fn defaults_and_validation() {
        let c = HealthConfig::default();
        assert_eq!(c.interval, Duration::from_secs(5));
        assert_eq!(c.timeout, Duration::from_secs(2));
        assert_eq!((c.fall, c.rise, c.passive_failures), (3, 2, 3));
        assert!(c.validate().is_ok());
        let err = HealthConfig {
            fall: 0,
            ..HealthConfig::default()
        }
        .validate()
        .unwrap_err();
        assert!(matches!(&err, Error::InvalidSetting { setting, .. } if setting == "fall"));
        let err = HealthConfig {
            path: "health".into(),
            ..HealthConfig::default()
        }
        .validate()
        .unwrap_err();
        assert!(matches!(&err, Error::InvalidSetting { setting, .. } if setting == "health_path"));
        let err = HealthConfig {
            path: "/up\u{1b}[2J".into(),
            ..HealthConfig::default()
        }
        .validate()
        .unwrap_err();
        assert!(err.to_string().contains("control characters"), "{err}");
        for kind in CheckKind::ALL {
            assert_eq!(kind.name().parse::<CheckKind>(), Ok(kind));
        }
        assert_eq!(
            "send_expect".parse::<CheckKind>(),
            Ok(CheckKind::SendExpect)
        );
        let err = HealthConfig {
            check: CheckKind::SendExpect,
            ..HealthConfig::default()
        }
        .validate()
        .unwrap_err();
        assert!(
            matches!(&err, Error::InvalidSetting { setting, .. } if setting == "health_expect")
        );
        assert!("ping".parse::<CheckKind>().is_err());
    }

    /// Polls `cond` every few milliseconds until it holds or `limit` passes.
    fn wait_for(limit: Duration, cond: impl Fn() -> bool) -> Option<Duration> {
        let started = Instant::now();
        while started.elapsed() < limit {
            if cond() {
                return Some(started.elapsed());
            }
            thread::sleep(Duration::from_millis(5));
        }
        None
    }

    #[test]
    fn the_thread_marks_down_and_up_and_stops_on_shutdown() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr: SocketAddr = l.local_addr().unwrap();
        let b = Arc::new(Backend::new(addr.to_string(), vec![addr], 1));
        let s = Arc::new(Scheduler::new(vec![Arc::clone(&b)]));
        let config = HealthConfig {
            interval: Duration::from_millis(50),
            timeout: Duration::from_millis(200),
            ..HealthConfig::default()
        };
        let shutdown = Shutdown::new();
        let first_round = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let done = Arc::clone(&first_round);
        let handle = spawn(
            Arc::clone(&s),
            live(config),
            Arc::default(),
            shutdown.clone(),
            Box::new(move || done.store(true, std::sync::atomic::Ordering::SeqCst)),
            None,
        )
        .unwrap()
        .unwrap();
        drop(l);
        wait_for(Duration::from_secs(5), || !b.is_healthy()).expect("marked down");
        // Down after `fall` rounds: the first one has told it was done.
        assert!(first_round.load(std::sync::atomic::Ordering::SeqCst));
        let l = socket2_rebind(addr);
        wait_for(Duration::from_secs(5), || b.is_healthy()).expect("marked up");
        // A passive down is brought back by the checks too.
        b.set_healthy(false);
        wait_for(Duration::from_secs(5), || b.is_healthy()).expect("back up");
        let started = Instant::now();
        shutdown.trigger();
        handle.join().unwrap();
        assert!(started.elapsed() < Duration::from_secs(1));
        drop(l);
    }

    fn socket2_rebind(addr: SocketAddr) -> TcpListener {
        // std sets SO_REUSEADDR on Unix, so the port is free again at once.
        TcpListener::bind(addr).unwrap()
    }

    #[test]
    fn cooldown_brings_a_backend_back_with_checks_off() {
        let b = Arc::new(Backend::new("b".into(), vec![], 1));
        let s = Arc::new(Scheduler::new(vec![Arc::clone(&b)]));
        let config = HealthConfig {
            check: CheckKind::Off,
            interval: Duration::from_millis(20),
            cooldown: Duration::from_millis(100),
            ..HealthConfig::default()
        };
        let shutdown = Shutdown::new();
        let first_round = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let done = Arc::clone(&first_round);
        let hook = Box::new(move || done.store(true, std::sync::atomic::Ordering::SeqCst));
        let handle = spawn(
            s,
            live(config),
            Arc::default(),
            shutdown.clone(),
            hook,
            None,
        )
        .unwrap()
        .unwrap();
        // Checks off: nothing to wait for.
        assert!(first_round.load(std::sync::atomic::Ordering::SeqCst));
        let err = io::Error::from(ErrorKind::ConnectionRefused);
        assert_eq!(connect_failed(&b, &HealthConfig::default(), &err), 1);
        assert_eq!(connect_failed(&b, &HealthConfig::default(), &err), 2);
        assert!(b.is_healthy(), "below the threshold");
        assert_eq!(connect_failed(&b, &HealthConfig::default(), &err), 3);
        assert!(!b.is_healthy());
        let took = wait_for(Duration::from_secs(5), || b.is_healthy()).expect("retried");
        assert!(took >= Duration::from_millis(80), "{took:?}");
        shutdown.trigger();
        handle.join().unwrap();
        // No thread at all when nothing needs it.
        let off = HealthConfig {
            check: CheckKind::Off,
            passive_failures: 0,
            ..HealthConfig::default()
        };
        let s = Arc::new(Scheduler::new(vec![]));
        assert!(spawn(
            s,
            live(off),
            Arc::default(),
            Shutdown::new(),
            Box::new(|| {}),
            None
        )
        .unwrap()
        .is_none());
    }
}
