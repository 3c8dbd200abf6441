//! The health thread: every interval, one round of checks over the current
//! backend list, each result fed to that backend's [`Probe`].
//!
//! One thread (`rodizio-health`) owns every probe, so none is shared. It
//! reads the live [`HealthConfig`] at each round, so new settings apply from
//! the next round on; between rounds it sleeps on the shutdown receiver, so
//! a shutdown wakes it at once.
//!
//! A backend in maintenance ([`Backend::is_maint`], set by an operator) is
//! skipped: no probe is sent to it and its probe state is left as it was.
//! Each check's result and duration is kept on the backend
//! ([`Backend::record_check`]) for the admin API to show. A check that
//! could not open its socket because this process was out of descriptors
//! is kept there too, but not fed to the probe: it says nothing about the
//! backend.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C never checks a backend.

use std::collections::HashMap;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use arc_swap::ArcSwap;
use crossbeam_channel::RecvTimeoutError;

use super::check::Failure;
use super::{check, mark_down, mark_up, CheckKind, HealthConfig, Probe, Transition};
use crate::backend::{Backend, CheckRecord};
use crate::scheduler::Scheduler;
use crate::shutdown::Shutdown;
use crate::stats::Stats;

/// The health thread's state: one [`Probe`] per backend, by id.
pub(super) struct Checker {
    config: Arc<ArcSwap<HealthConfig>>,
    /// Where each check's duration is counted.
    stats: Arc<Stats>,
    probes: HashMap<u64, Probe>,
    /// With checks off: when each down backend was first seen down.
    down_since: HashMap<u64, Instant>,
}

impl Checker {
    pub(super) fn new(config: Arc<ArcSwap<HealthConfig>>, stats: Arc<Stats>) -> Checker {
        Checker {
            config,
            stats,
            probes: HashMap::new(),
            down_since: HashMap::new(),
        }
    }

    pub(super) fn run(mut self, scheduler: &Scheduler, shutdown: &Shutdown) {
        let stop = shutdown.receiver();
        let mut next = Instant::now() + period(&self.config.load());
        loop {
            // The first round comes one interval after start-up, like every
            // other: the `fall`-th failed check of a backend dead from the
            // start is then at `fall × interval`, and a short-lived balancer
            // (a test, a one-off run) probes nothing.
            let wait = next.saturating_duration_since(Instant::now());
            match stop.recv_timeout(wait) {
                Err(RecvTimeoutError::Timeout) => {}
                // Disconnected: the shutdown was triggered.
                _ => return,
            }
            if shutdown.is_triggered() {
                return;
            }
            let config = self.config.load_full();
            // The next round is due one period after this one was, not
            // after it ended: rounds keep their rhythm like a `tick`.
            next += period(&config);
            let now = Instant::now();
            if next < now {
                next = now;
            }
            self.round(scheduler, &config);
        }
    }

    /// One round: probe every backend of the current list that is not in
    /// maintenance.
    fn round(&mut self, scheduler: &Scheduler, config: &HealthConfig) {
        let all = scheduler.snapshot();
        // Forget backends that were removed.
        self.probes
            .retain(|id, _| all.iter().any(|b| b.id() == *id));
        self.down_since
            .retain(|id, _| all.iter().any(|b| b.id() == *id));
        let list: Vec<Arc<Backend>> = all.iter().filter(|b| !b.is_maint()).cloned().collect();
        if config.check == CheckKind::Off {
            self.cooldown(&list, config.cooldown);
            return;
        }
        let results = probe_all(&list, config);
        for (backend, (result, took)) in list.iter().zip(results) {
            self.stats.histograms.health_check.observe(took);
            backend.record_check(CheckRecord {
                error: result.as_ref().err().map(|f| f.reason.clone()),
                at: SystemTime::now(),
                took,
            });
            let (fall, rise) = (config.fall, config.rise);
            let probe = self
                .probes
                .entry(backend.id())
                .or_insert_with(|| Probe::new(fall, rise));
            if let Err(Failure { ours: true, reason }) = &result {
                // Out of descriptors here: no verdict on the backend.
                log::debug!("check of {} not counted: {reason}", backend.name());
                continue;
            }
            // Passive checks may have marked it down since the last round.
            probe.sync(backend.is_healthy());
            match (probe.observe(result.is_ok()), result) {
                (Some(Transition::Down), Err(failure)) => {
                    let reason = failure.reason;
                    mark_down(
                        backend,
                        &format!("{fall} failed checks in a row, last: {reason}"),
                    );
                }
                (Some(Transition::Up), _) => {
                    // A fresh start for the passive count too.
                    backend.record_connect_success();
                    mark_up(backend, &format!("{rise} checks passed in a row"));
                }
                _ => {}
            }
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
type Timed = (std::result::Result<(), Failure>, Duration);

/// One check, timed.
fn timed_check(backend: &Backend, config: &HealthConfig) -> Timed {
    let started = Instant::now();
    let result = check::run(backend, config);
    (result, started.elapsed())
}

/// Probes every backend in parallel, one short-lived thread each; returns
/// the results in list order. A thread that cannot be started is replaced
/// by probing inline.
fn probe_all(list: &[Arc<Backend>], config: &HealthConfig) -> Vec<Timed> {
    thread::scope(|scope| {
        let handles: Vec<_> = list
            .iter()
            .map(|backend| {
                thread::Builder::new()
                    .name("rodizio-probe".into())
                    .stack_size(128 * 1024)
                    .spawn_scoped(scope, move || timed_check(backend, config))
                    .map_err(|_| backend)
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h {
                Ok(handle) => handle.join().unwrap_or_else(|_| {
                    let panicked = Failure {
                        reason: "the check panicked".into(),
                        ours: false,
                    };
                    (Err(panicked), Duration::ZERO)
                }),
                Err(backend) => timed_check(backend, config),
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
