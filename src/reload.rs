//! Reloading the config file while the balancer runs: on SIGHUP (and
//! whatever else calls [`Reloader::reload`], such as an admin request).
//!
//! A reload lays the file between the defaults and the start-up flags, as
//! at start-up, and checks everything before it changes anything: a bad
//! file is one error line, counted in `reloads_failed`, and the running
//! settings stay. A good one is applied to the [`Live`] values (backends
//! added, drained or reweighted in place with [`Scheduler::set_weight`](crate::scheduler::Scheduler::set_weight);
//! the algorithm, the proxy's, health's and the rate limit's settings, a
//! new [`Limiter`] when these change), counted in `reloads_ok` and logged
//! in one line. The settings marked `restart` in the settings table
//! (`config/table.rs`), and the file's `mode`, keep their running value
//! with one warning. systemd, when it listens, hears "reloading" then
//! "ready" around each reload. No connection is cut; `docs/operations.md`
//! (Reloading: SIGHUP) tells the whole story.
//!
//! # Threads
//!
//! `reload` runs on the calling thread (the signal thread for SIGHUP); a
//! mutex makes two reloads take turns. Draining backends are watched by a
//! [`Reaper`] thread, started when the first one drains and ending when
//! none is left; it polls each one's `active() + pending()` every
//! [`REAP_POLL`].
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C reads its backends once, at the prompt.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::backend::Backend;
use crate::balancer::{Balancer, Live};
use crate::config::file::{self, Mode};
use crate::config::{settings, Config, Overrides};
use crate::error::{Error, Result};
use crate::limiter::Limiter;
use crate::reaper::{self, Owner, Reaper};
use crate::stats::Stats;
use crate::systemd;
use crate::units;

/// How often the reaper looks at the draining backends.
pub const REAP_POLL: Duration = reaper::POLL;

/// What one reload did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReloadReport {
    /// The info line logged for it (`reload: +1 backend (...), ...`).
    pub summary: String,
    /// Backends added.
    pub added: usize,
    /// Backends that started draining (no longer in the file).
    pub draining: usize,
    /// Draining backends written in the file again, serving again.
    pub restored: usize,
    /// Backends whose weight changed.
    pub reweighted: usize,
    /// Other settings changed live (the algorithm included).
    pub settings_changed: usize,
    /// Settings that differ in the file but need a restart: kept.
    pub needs_restart: Vec<&'static str>,
}

/// Reloads the config file into a running balancer. Cheap to clone; every
/// clone reloads the same balancer, one reload at a time.
#[derive(Debug, Clone)]
pub struct Reloader {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The config file, read again at each reload.
    path: PathBuf,
    /// The flags given at start-up (and backends typed at the prompt):
    /// they still win over the file.
    flags: Overrides,
    /// What a reload changes.
    live: Live,
    /// Where reloads are counted.
    stats: Arc<Stats>,
    /// The settings running now; the lock serializes reloads.
    running: Mutex<Running>,
    /// Removes the backends drained by a reload once their last
    /// connection ends (or at `drain_timeout`).
    reaper: Reaper,
}

#[derive(Debug)]
struct Running {
    config: Config,
    mode: Mode,
}

impl Reloader {
    /// A reloader for `balancer`, reading `path` under `flags` (the
    /// start-up flags, with the prompt's backends if it asked).
    pub fn new(path: impl Into<PathBuf>, flags: Overrides, balancer: &Balancer) -> Reloader {
        Reloader::from_parts(
            path,
            flags,
            balancer.live(),
            balancer.stats(),
            balancer.config().clone(),
        )
    }

    /// [`Reloader::new`] from the parts: the live values, the stats, and
    /// the configuration running now.
    pub fn from_parts(
        path: impl Into<PathBuf>,
        flags: Overrides,
        live: Live,
        stats: Arc<Stats>,
        running: Config,
    ) -> Reloader {
        let reaper = Reaper::new(Arc::clone(&live.scheduler), Owner::Reload, None);
        Reloader {
            inner: Arc::new(Inner {
                path: path.into(),
                flags,
                live,
                stats,
                running: Mutex::new(Running {
                    config: running,
                    mode: Mode::LoadBalancer,
                }),
                reaper,
            }),
        }
    }

    /// The config file it reads.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Reads the file again and applies it (see the module docs). Logs one
    /// info line on success, one error line on failure, and a warning for
    /// settings that need a restart.
    ///
    /// # Errors
    ///
    /// [`Error::ConfigFile`] (or another usage error) when the file cannot
    /// be read or is not valid; nothing was changed then.
    pub fn reload(&self) -> Result<ReloadReport> {
        let inner = &self.inner;
        let mut running = inner.running.lock();
        systemd::reloading();
        let result = self.reload_locked(&mut running);
        // Ready again, with the new settings or the old ones.
        let backends = inner.live.scheduler.snapshot();
        systemd::ready(&systemd::status(&inner.stats, &backends));
        result
    }

    /// [`Reloader::reload`] under the lock, between what it tells systemd.
    fn reload_locked(&self, running: &mut Running) -> Result<ReloadReport> {
        let inner = &self.inner;
        let plan = match self.prepare(running) {
            Ok(plan) => plan,
            Err(err) => {
                Stats::incr(&inner.stats.reloads_failed);
                log::error!("reload refused, the running settings stay: {err}");
                return Err(err);
            }
        };
        let report = self.apply(running, plan);
        Stats::incr(&inner.stats.reloads_ok);
        if !report.needs_restart.is_empty() {
            log::warn!("{}", restart_warning(&report.needs_restart));
        }
        log::info!("{}", report.summary);
        Ok(report)
    }

    /// Everything that can fail: read, validate, resolve new backends.
    fn prepare(&self, running: &Running) -> Result<Plan> {
        let inner = &self.inner;
        let file = file::load(&inner.path)?;
        let mut config = file.settle(&inner.flags)?;
        file.require_backends(&config)?;
        let from_file = !inner.flags.given().contains(&"backends");
        let list = inner.live.scheduler.snapshot();
        let retiring: Vec<u64> = inner.reaper.watched();
        let mut unmatched: Vec<Arc<Backend>> = list.to_vec();
        let mut plan = Plan::default();
        for spec in &config.backends {
            let name = spec.name();
            match unmatched.iter().position(|b| b.name() == name) {
                Some(pos) => {
                    let b = unmatched.remove(pos);
                    if b.weight() != spec.weight {
                        plan.reweight.push((Arc::clone(&b), spec.weight));
                    }
                    if retiring.contains(&b.id()) {
                        plan.restore.push(b);
                    }
                }
                None => {
                    let send_proxy = spec.send_proxy.or(running.config.send_proxy);
                    let backend = Backend::from_spec(spec)
                        .map_err(|e| match e {
                            Error::InvalidBackend(msg) if from_file => {
                                file.error_at("backends", msg)
                            }
                            other => other,
                        })?
                        .with_send_proxy(send_proxy);
                    plan.add.push(Arc::new(backend));
                }
            }
        }
        plan.drain = unmatched
            .into_iter()
            .filter(|b| !retiring.contains(&b.id()))
            .collect();
        plan.needs_restart = settings::keep_restart_only(&mut config, &running.config);
        if file.mode != running.mode {
            plan.needs_restart.push("mode");
        }
        plan.config = config;
        Ok(plan)
    }

    /// Changes the live values as planned; cannot fail.
    fn apply(&self, running: &mut Running, plan: Plan) -> ReloadReport {
        let live = &self.inner.live;
        let config = plan.config;
        // What runs now, as the live values say (an admin request may have
        // changed them since the last reload).
        let mut before = running.config.clone();
        before.algorithm = live.scheduler.algorithm();
        before.proxy = current(&live.proxy);
        before.health = current(&live.health);
        before.rate_limit = live.limiter.load().as_ref().map(|l| l.config().clone());
        let mut parts = Vec::new();
        let mut report = ReloadReport {
            needs_restart: plan.needs_restart,
            ..ReloadReport::default()
        };
        self.apply_backends(
            plan.add,
            &plan.restore,
            &plan.reweight,
            &mut parts,
            &mut report,
        );
        self.apply_settings(&before, &config, &mut parts, &mut report);
        if !plan.drain.is_empty() {
            let deadline = Instant::now() + config.drain_timeout;
            for b in &plan.drain {
                b.set_draining(true);
                let n = b.active() + b.pending();
                parts.push(format!(
                    "draining {} ({})",
                    b.name(),
                    units::count(n as u64, "connection")
                ));
                if let Err(err) = self.inner.reaper.watch(Arc::clone(b), Some(deadline)) {
                    // The backend stays in the list, draining: harmless.
                    log::warn!("reload: could not start the reaper thread: {err}");
                }
            }
            report.draining = plan.drain.len();
        }
        report.summary = if parts.is_empty() {
            "reload: no change".to_string()
        } else {
            format!("reload: {}", parts.join(", "))
        };
        running.config = config;
        report
    }

    /// Adds the new backends, serves again the restored ones and sets the
    /// new weights, saying each in `parts`.
    fn apply_backends(
        &self,
        add: Vec<Arc<Backend>>,
        restore: &[Arc<Backend>],
        reweight: &[(Arc<Backend>, u32)],
        parts: &mut Vec<String>,
        report: &mut ReloadReport,
    ) {
        let live = &self.inner.live;
        // New backends first, drains last: never a moment with fewer
        // backends than both lists share.
        if !add.is_empty() {
            let names: Vec<&str> = add.iter().map(|b| b.name()).collect();
            parts.push(format!(
                "+{} ({})",
                units::count(add.len() as u64, "backend"),
                names.join(", ")
            ));
            report.added = add.len();
            for b in add {
                live.scheduler.add(b);
            }
        }
        if !restore.is_empty() {
            for b in restore {
                self.inner.reaper.forget(b.id());
                b.set_draining(false);
                parts.push(format!("serving {} again", b.name()));
            }
            report.restored = restore.len();
        }
        for (b, weight) in reweight {
            parts.push(format!("weight {} {} → {weight}", b.name(), b.weight()));
            live.scheduler.set_weight(b.id(), *weight);
        }
        report.reweighted = reweight.len();
    }

    /// Sets the algorithm, the proxy's, health's and the rate limit's
    /// settings that changed from `before`, saying each in `parts`.
    fn apply_settings(
        &self,
        before: &Config,
        config: &Config,
        parts: &mut Vec<String>,
        report: &mut ReloadReport,
    ) {
        let live = &self.inner.live;
        if before.algorithm != config.algorithm {
            parts.push(format!(
                "algorithm {} → {}",
                before.algorithm, config.algorithm
            ));
            live.scheduler.set_algorithm(config.algorithm);
            report.settings_changed += 1;
        }
        if before.proxy != config.proxy {
            live.proxy.store(Arc::new(config.proxy.clone()));
        }
        if before.health != config.health {
            live.health.store(Arc::new(config.health.clone()));
        }
        if before.rate_limit != config.rate_limit {
            match config.rate_limit.as_ref().map(|c| {
                Limiter::with_store(c, &config.rate_limit_store, Arc::clone(&self.inner.stats))
            }) {
                None => live.limiter.store(None),
                Some(Ok(limiter)) => live.limiter.store(Some(Arc::new(limiter))),
                Some(Err(err)) => log::error!("reload: the rate limit stays as it was: {err}"),
            }
        }
        let old: Vec<(&str, String)> = before.describe();
        for (key, value) in config.describe() {
            if matches!(key, "backends" | "algorithm") {
                continue;
            }
            // The rate limit's details are listed only when it was on and
            // stays on; `rate_limit` itself says "off → 10/1s".
            let Some((_, was)) = old.iter().find(|(k, _)| *k == key) else {
                continue;
            };
            if *was != value {
                parts.push(format!("{key} {was} → {value}"));
                report.settings_changed += 1;
            }
        }
    }
}

/// The warning about settings a reload cannot change, in plain English:
/// `reload: workers needs a restart to change; its running value stays`,
/// `reload: listen, workers and mode need a restart ...`.
fn restart_warning(keys: &[&str]) -> String {
    let list = match keys {
        [] => String::new(),
        [one] => one.to_string(),
        [first @ .., last] => format!("{} and {last}", first.join(", ")),
    };
    if keys.len() == 1 {
        format!("reload: {list} needs a restart to change; its running value stays")
    } else {
        format!("reload: {list} need a restart to change; their running values stay")
    }
}

/// What `prepare` decided, for `apply`.
#[derive(Debug, Default)]
struct Plan {
    config: Config,
    add: Vec<Arc<Backend>>,
    restore: Vec<Arc<Backend>>,
    reweight: Vec<(Arc<Backend>, u32)>,
    drain: Vec<Arc<Backend>>,
    needs_restart: Vec<&'static str>,
}

/// A copy of what an `ArcSwap` holds now.
fn current<T: Clone>(swap: &arc_swap::ArcSwap<T>) -> T {
    T::clone(&swap.load())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::Algorithm;
    use std::io::Write;

    fn assert_send_sync<T: Send + Sync + Clone>() {}

    #[test]
    fn a_reloader_can_be_shared() {
        assert_send_sync::<Reloader>();
    }

    /// A balancer (bound, not running) over backends that are never
    /// connected to, and a reloader on a temporary file.
    struct Setup {
        balancer: Balancer,
        reloader: Reloader,
        path: PathBuf,
    }

    impl Setup {
        fn new(name: &str, text: &str) -> Setup {
            let path = std::env::temp_dir()
                .join(format!("rodizio-reload-{name}-{}.json", std::process::id()));
            std::fs::write(&path, text).unwrap();
            let file = file::load(&path).unwrap();
            let mut config = file.settle(&Overrides::default()).unwrap();
            config.listen = "127.0.0.1:0".parse().unwrap();
            let balancer = Balancer::bind(config).unwrap();
            let reloader = Reloader::new(&path, Overrides::default(), &balancer);
            Setup {
                balancer,
                reloader,
                path,
            }
        }

        fn write(&self, text: &str) {
            let mut f = std::fs::File::create(&self.path).unwrap();
            f.write_all(text.as_bytes()).unwrap();
        }

        fn names(&self) -> Vec<String> {
            let list = self.balancer.scheduler().snapshot();
            list.iter().map(|b| b.name().to_string()).collect()
        }
    }

    impl Drop for Setup {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.path);
        }
    }

    #[test]
    fn a_reload_adds_drains_and_reweighs_by_name() {
        let s = Setup::new(
            "diff",
            r#"{"listen": "127.0.0.1:0", "backends": ["127.0.0.1:1", "127.0.0.1:2"]}"#,
        );
        let first = s.balancer.scheduler().snapshot()[0].clone();
        let held = first.start_connection();
        s.write(
            r#"{"listen": "127.0.0.1:0", "algorithm": "least_connections",
                "backends": ["127.0.0.1:1,weight=3", "127.0.0.1:3"], "connect_timeout": "1s"}"#,
        );
        let r = s.reloader.reload().unwrap();
        assert_eq!((r.added, r.draining, r.reweighted), (1, 1, 1), "{r:?}");
        assert_eq!(
            r.summary,
            "reload: +1 backend (127.0.0.1:3), weight 127.0.0.1:1 1 → 3, \
             algorithm round-robin → least-connections, connect_timeout 3s → 1s, \
             draining 127.0.0.1:2 (0 connections)"
        );
        let live = s.balancer.live();
        assert_eq!(live.scheduler.algorithm(), Algorithm::LeastConnections);
        assert_eq!(live.proxy.load().connect_timeout, Duration::from_secs(1));
        let same = live.scheduler.find(|b| b.name() == "127.0.0.1:1").unwrap();
        assert!(Arc::ptr_eq(&same, &first), "reweighed in place");
        assert_eq!((same.weight(), same.active()), (3, 1));
        drop(held);
        // The drained one leaves the list once idle.
        let deadline = Instant::now() + Duration::from_secs(10);
        while s.names().contains(&"127.0.0.1:2".to_string()) {
            assert!(Instant::now() < deadline, "not removed: {:?}", s.names());
            std::thread::sleep(REAP_POLL);
        }
        assert_eq!(s.names(), ["127.0.0.1:1", "127.0.0.1:3"]);
        let stats = s.balancer.stats().snapshot();
        assert_eq!((stats.reloads_ok, stats.reloads_failed), (1, 0));
    }

    #[test]
    fn a_bad_file_changes_nothing() {
        let s = Setup::new(
            "bad",
            r#"{"listen": "127.0.0.1:0", "backends": ["127.0.0.1:1"]}"#,
        );
        for bad in [
            "{\"backends\": [\"127.0.0.1:2\"],\n \"workers\": 0}",
            "{\"backends\": [\"127.0.0.1:2\"],\n \"wrokers\": 4}",
            "{\"backends\": [\"127.0.0.1:2\"],\n \"idle_timeout\": \"soon\"}",
            "{\"backends\": [\"127.0.0.1:2\"],,}",
            "{\"workers\": 4}",
        ] {
            s.write(bad);
            let err = s.reloader.reload().unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::ConfigFile {
                        position: Some(_),
                        ..
                    }
                ),
                "{err}"
            );
            assert_eq!(s.names(), ["127.0.0.1:1"], "{bad}");
        }
        assert_eq!(s.balancer.stats().snapshot().reloads_failed, 5);
        std::fs::remove_file(&s.path).unwrap();
        let err = s.reloader.reload().unwrap_err().to_string();
        assert!(err.contains("cannot be read"), "{err}");
    }

    #[test]
    fn restart_only_settings_keep_their_running_value() {
        let s = Setup::new(
            "restart",
            r#"{"listen": "127.0.0.1:0", "backends": ["127.0.0.1:1"]}"#,
        );
        s.write(
            r#"{"listen": "127.0.0.1:0", "backends": ["127.0.0.1:1"], "workers": 8,
                "backlog": 64, "mode": "backend", "rate_limit": "10/1s"}"#,
        );
        let r = s.reloader.reload().unwrap();
        assert_eq!(r.needs_restart, ["workers", "backlog", "mode"]);
        assert_eq!(
            restart_warning(&r.needs_restart),
            "reload: workers, backlog and mode need a restart to change; \
             their running values stay"
        );
        assert_eq!(
            restart_warning(&["access_log"]),
            "reload: access_log needs a restart to change; its running value stays"
        );
        assert_eq!(
            restart_warning(&["listen", "backlog"]),
            "reload: listen and backlog need a restart to change; their running values stay"
        );
        assert_eq!(r.summary, "reload: rate_limit off → 10/1s");
        assert!(s.balancer.live().limiter.load().is_some());
        // The same file again: still a restart, nothing else.
        let r = s.reloader.reload().unwrap();
        assert_eq!(r.summary, "reload: no change");
        assert_eq!(r.needs_restart.len(), 3);
    }

    #[test]
    fn a_draining_backend_written_again_comes_back() {
        let s = Setup::new(
            "restore",
            r#"{"listen": "127.0.0.1:0", "backends": ["127.0.0.1:1", "127.0.0.1:2"]}"#,
        );
        let second = s.balancer.scheduler().snapshot()[1].clone();
        let held = second.start_connection();
        s.write(r#"{"listen": "127.0.0.1:0", "backends": ["127.0.0.1:1"]}"#);
        let r = s.reloader.reload().unwrap();
        assert_eq!(r.draining, 1);
        assert!(
            r.summary.contains("draining 127.0.0.1:2 (1 connection)"),
            "{}",
            r.summary
        );
        assert!(second.is_draining());
        s.write(r#"{"listen": "127.0.0.1:0", "backends": ["127.0.0.1:1", "127.0.0.1:2"]}"#);
        let r = s.reloader.reload().unwrap();
        assert_eq!((r.restored, r.added), (1, 0));
        assert!(!second.is_draining());
        drop(held);
        assert_eq!(s.names(), ["127.0.0.1:1", "127.0.0.1:2"]);
    }

    #[test]
    fn worker_idle_timeout_needs_a_restart() {
        let s = Setup::new(
            "worker-idle",
            r#"{"listen": "127.0.0.1:0", "backends": ["127.0.0.1:1"]}"#,
        );
        s.write(
            r#"{"listen": "127.0.0.1:0", "backends": ["127.0.0.1:1"],
                "worker_idle_timeout": "off"}"#,
        );
        let r = s.reloader.reload().unwrap();
        assert_eq!(r.needs_restart, ["worker_idle_timeout"]);
        assert_eq!(r.summary, "reload: no change");
    }
}
