//! The health thread: rounds of checks over the current backend list, each
//! result fed to that backend's [`Probe`]. Each backend is checked at its
//! own interval (its own `health_interval`, else the service's), with its
//! own kind, path, `rise` and `fall` laid over the service's
//! ([`HealthConfig::for_backend`]): a round checks the backends that are
//! due, and the thread sleeps until the next one is.
//!
//! A backend in maintenance ([`Backend::is_maint`]) is skipped: no probe, its
//! state left as it was; its agent, if it has one, is still asked (it may
//! say `ready`), each `agent_interval` (`agent.rs`), within
//! `health_timeout` or that interval if it is shorter. Each check's result
//! and duration is kept on the backend ([`Backend::record_check`]) for the
//! admin API. A check that failed for a reason of this host
//! ([`CheckFailure::local`]) is fed to the probe as
//! [`Verdict::Inconclusive`], counted in `health_check_local_failures` and
//! said in a warning at most once a second; so is a probe thread that cannot
//! be started (the check then runs on this thread, and is not lost).
//!
//! # Threads
//!
//! One thread (`rodizio-health`) owns every probe, so none is shared. It
//! reads the live [`HealthConfig`] and each backend's own check at each
//! round, so new settings apply from the next round on; between rounds it
//! sleeps on the shutdown receiver, so a shutdown wakes it at once.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C never checks a backend.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use arc_swap::ArcSwap;
use crossbeam_channel::RecvTimeoutError;

use super::check::{check_with, CheckFailure};
use super::{in_a_row, mark_down, mark_up, CheckKind, HealthConfig, Probe, Transition, Verdict};
use crate::backend::{Backend, CheckRecord};
use crate::scheduler::Scheduler;
use crate::shutdown::Shutdown;
use crate::stats::Stats;
use crate::throttle::{self, LogThrottle};
use crate::tls_term::backend::BackendTls;
use crate::tls_term::Terminator;

/// A backend due this little after a round starts is checked in it, not
/// in a round of its own a moment later.
const DUE_SLACK: Duration = Duration::from_millis(10);

/// A probe thread's stack: a check's I/O and parsing are shallow.
const PROBE_STACK: usize = 128 * 1024;

/// Shortest time between two warnings about checks that failed here.
const LOCAL_FAILURE_LOG_EVERY: Duration = Duration::from_secs(1);

/// The health thread's state: one [`Probe`] per backend, by id.
pub(super) struct Checker {
    config: Arc<ArcSwap<HealthConfig>>,
    /// Where each check's duration is counted.
    stats: Arc<Stats>,
    probes: HashMap<u64, Probe>,
    /// When each backend's next check is due, by id: each has its own
    /// interval (its own `health_interval`, or the service's).
    due: HashMap<u64, Instant>,
    /// When each backend's agent is next asked, by id.
    agent_due: HashMap<u64, Instant>,
    /// With checks off: when each down backend was first seen down.
    down_since: HashMap<u64, Instant>,
    /// Checks that failed for a reason of this host: one line a second at
    /// most.
    local_log: LogThrottle,
    /// Probe threads that could not be started: one line a second at most.
    spawn_log: LogThrottle,
    /// The service's TLS, when it has any: with `backend_tls` on, its `tls`
    /// checks are whole handshakes with the workers' client configuration,
    /// loaded at each round (a reload swaps it).
    tls: Option<Arc<ArcSwap<Terminator>>>,
}

impl Checker {
    pub(super) fn new(
        config: Arc<ArcSwap<HealthConfig>>,
        stats: Arc<Stats>,
        tls: Option<Arc<ArcSwap<Terminator>>>,
    ) -> Checker {
        Checker {
            tls,
            config,
            stats,
            probes: HashMap::new(),
            due: HashMap::new(),
            agent_due: HashMap::new(),
            down_since: HashMap::new(),
            local_log: LogThrottle::new(LOCAL_FAILURE_LOG_EVERY),
            spawn_log: LogThrottle::new(LOCAL_FAILURE_LOG_EVERY),
        }
    }

    /// Runs rounds until `shutdown`; `first_round`, if still there, runs
    /// once every backend has been checked.
    pub(super) fn run(
        mut self,
        scheduler: &Scheduler,
        shutdown: &Shutdown,
        mut first_round: Option<super::FirstRound>,
    ) {
        let stop = shutdown.receiver();
        // The first round comes one interval after start-up (the shortest
        // of the service's and the backends' own), like every other: the
        // `fall`-th failed check of a backend dead from the start is then
        // at `fall × interval`, and a short-lived balancer (a test, a
        // one-off run) probes nothing.
        let config = self.config.load_full();
        let mut wake = Instant::now()
            + scheduler
                .snapshot()
                .iter()
                .map(|b| period(&config.for_backend(&b.own_check())))
                .fold(period(&config), Duration::min);
        loop {
            let wait = wake.saturating_duration_since(Instant::now());
            match stop.recv_timeout(wait) {
                Err(RecvTimeoutError::Timeout) => {}
                // Disconnected: the shutdown was triggered.
                _ => return,
            }
            if shutdown.is_triggered() {
                return;
            }
            let config = self.config.load_full();
            let (next, all_known) = self.round(scheduler, &config, Instant::now());
            wake = next;
            if all_known {
                if let Some(hook) = first_round.take() {
                    hook();
                }
            }
        }
    }

    /// One round: probe every backend of the current list that is due and
    /// not in maintenance, each with its own settings over the service's.
    /// Returns when the next round is due (the first backend due next, or
    /// one service period from now, to see backends added meanwhile), and
    /// whether every backend checked actively has been checked once.
    fn round(
        &mut self,
        scheduler: &Scheduler,
        config: &HealthConfig,
        now: Instant,
    ) -> (Instant, bool) {
        let all = scheduler.snapshot();
        // Forget backends that were removed.
        let listed = |id: &u64| all.iter().any(|b| b.id() == *id);
        self.probes.retain(|id, _| listed(id));
        self.down_since.retain(|id, _| listed(id));
        self.due.retain(|id, _| listed(id));
        self.agent_due.retain(|id, _| listed(id));
        let mut next = now + period(config);
        let agents = self.agents_due(&all, config, now, &mut next);
        let mut resting = Vec::new();
        let mut checked = Vec::new();
        let mut all_known = true;
        for backend in all.iter().filter(|b| !b.is_maint()) {
            let own = backend.own_check();
            let settings = config.for_backend(&own);
            if settings.check == CheckKind::Off {
                next = next.min(now + period(&settings));
                resting.push(Arc::clone(backend));
                continue;
            }
            // A backend seen for the first time is checked at once.
            let due = self.due.entry(backend.id()).or_insert(now);
            if *due <= now + DUE_SLACK {
                // Each backend keeps its rhythm, like a `tick`: due one
                // interval after it was due, not after its check ended.
                *due = (*due + settings.interval).max(now);
                checked.push((Arc::clone(backend), settings));
            } else {
                all_known &= self.probes.contains_key(&backend.id());
            }
            next = next.min(*due);
        }
        self.cooldown(&resting, config.cooldown);
        let edge = self.tls.as_ref().map(|t| t.load_full());
        let backend_tls = edge.as_deref().and_then(|t| t.backend.as_ref());
        let results = probe_all(&checked, backend_tls, &self.spawn_log);
        for ((backend, settings), (result, took)) in checked.iter().zip(results) {
            self.judge(backend, settings, result, took);
        }
        super::agent::check_all(&agents, scheduler);
        (next, all_known)
    }

    /// The backends of `all` whose agent is due now, with its port and
    /// the timeout; `next` is brought forward to the next agent due.
    fn agents_due(
        &mut self,
        all: &[Arc<Backend>],
        config: &HealthConfig,
        now: Instant,
        next: &mut Instant,
    ) -> Vec<(Arc<Backend>, u16, Duration)> {
        let mut agents = Vec::new();
        for backend in all {
            let own = backend.own_check();
            let Some(port) = own.agent_port else {
                continue;
            };
            let settings = config.for_backend(&own);
            let every = own.agent_interval.unwrap_or(settings.interval);
            let due = self.agent_due.entry(backend.id()).or_insert(now);
            if *due <= now + DUE_SLACK {
                *due = (*due + every).max(now);
                agents.push((Arc::clone(backend), port, settings.timeout.min(every)));
            }
            *next = (*next).min(*due);
        }
        agents
    }

    /// Feeds one check's result to `backend`'s probe, and marks it down or
    /// up when the probe says so.
    fn judge(
        &mut self,
        backend: &Backend,
        settings: &HealthConfig,
        result: std::result::Result<(), CheckFailure>,
        took: Duration,
    ) {
        self.stats.histograms.health_check.observe(took);
        backend.record_check(CheckRecord {
            error: result.as_ref().err().map(|failure| {
                if failure.local {
                    format!("{failure} (a fault of this host: not counted)")
                } else {
                    failure.reason.clone()
                }
            }),
            at: SystemTime::now(),
            took,
        });
        let verdict = match &result {
            Ok(()) => Verdict::Pass,
            Err(failure) if failure.local => {
                self.local_failure(backend, failure);
                Verdict::Inconclusive
            }
            Err(_) => Verdict::Fail,
        };
        let (fall, rise) = (settings.fall, settings.rise);
        let probe = self
            .probes
            .entry(backend.id())
            .or_insert_with(|| Probe::new(fall, rise));
        // A reload may have changed them.
        probe.set_thresholds(fall, rise);
        // Passive checks may have marked it down since the last round.
        probe.sync(backend.is_healthy());
        let transition = probe.observe(verdict);
        let (run, needed) = probe.progress();
        backend.tally.set_progress(run, needed);
        match (transition, result) {
            (Some(Transition::Down), Err(failure)) => {
                let failed = in_a_row(u64::from(fall), "failed check");
                mark_down(backend, &format!("{failed}, last: {failure}"));
            }
            (Some(Transition::Up), _) => {
                // A fresh start for the passive count too.
                backend.record_connect_success();
                let passed = match rise {
                    1 => "1 check passed".to_string(),
                    n => format!("{n} checks passed in a row"),
                };
                mark_up(backend, &passed);
            }
            _ => {}
        }
    }

    /// A check of `backend` failed for a reason of this host: counted, and
    /// said at most once a second.
    fn local_failure(&self, backend: &Backend, failure: &CheckFailure) {
        Stats::incr(&self.stats.health_check_local_failures);
        if let Some(others) = self.local_log.event(Instant::now()) {
            log::warn!(
                "health check of backend {} could not be made: {failure} \
                 (a limit of this host: not counted against the backend){}",
                backend.name(),
                throttle::more(others)
            );
        }
    }

    /// Checks off: a backend down for `cooldown` is tried again.
    fn cooldown(&mut self, list: &[Arc<Backend>], cooldown: Duration) {
        let now = Instant::now();
        for backend in list {
            if backend.is_healthy() {
                self.down_since.remove(&backend.id());
                continue;
            }
            let since = *self.down_since.entry(backend.id()).or_insert(now);
            if now.duration_since(since) >= cooldown {
                self.down_since.remove(&backend.id());
                mark_up(
                    backend,
                    &format!("cool-down of {:?} over, trying it again", cooldown),
                );
            }
        }
    }
}

/// One check's result and how long it took.
type Timed = (std::result::Result<(), CheckFailure>, Duration);

/// One check, timed.
fn timed_check(backend: &Backend, config: &HealthConfig, tls: Option<&BackendTls>) -> Timed {
    let started = Instant::now();
    let result = check_with(backend, config, tls);
    (result, started.elapsed())
}

/// Probes every backend in parallel, one short-lived thread each; returns
/// the results in list order. A thread that cannot be started (a limit of
/// this host: threads, memory) is replaced by probing inline, and said in
/// `log` (at most once a second): the check is slower, not lost, and the
/// backend not blamed.
fn probe_all(
    list: &[(Arc<Backend>, Cow<HealthConfig>)],
    tls: Option<&BackendTls>,
    log: &LogThrottle,
) -> Vec<Timed> {
    // A verified TLS handshake runs deeper than the other checks.
    let stack = if tls.is_some() {
        crate::tls_term::TLS_WORKER_STACK
    } else {
        PROBE_STACK
    };
    thread::scope(|scope| {
        let handles: Vec<_> = list
            .iter()
            .map(|(backend, config)| {
                let config: &HealthConfig = config;
                thread::Builder::new()
                    .name("rodizio-probe".into())
                    .stack_size(stack)
                    .spawn_scoped(scope, move || timed_check(backend, config, tls))
                    .map_err(|err| (backend, config, err))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h {
                Ok(handle) => handle.join().unwrap_or_else(|_| {
                    (Err("the check panicked".to_string().into()), Duration::ZERO)
                }),
                Err((backend, config, err)) => {
                    if let Some(others) = log.event(Instant::now()) {
                        log::warn!(
                            "health check of backend {}: cannot start a probe thread ({err}); \
                             checking it on the health thread{}",
                            backend.name(),
                            throttle::more(others)
                        );
                    }
                    timed_check(backend, config, tls)
                }
            })
            .collect()
    })
}

/// Time between two rounds. With checks off only the cool-down is
/// watched: often enough for it.
fn period(config: &HealthConfig) -> Duration {
    if config.check == CheckKind::Off {
        config.interval.min(config.cooldown)
    } else {
        config.interval
    }
}
