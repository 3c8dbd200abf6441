//! Reloading the config file while the balancer runs: on SIGHUP (and
//! whatever else calls [`Reloader::reload`], such as an admin request).
//!
//! A reload lays the file between the defaults and the start-up flags, as
//! at start-up, and checks everything before it changes anything: a bad
//! file is one error line, counted in `reloads_failed`, and the running
//! settings stay. A good one is applied service by service (`service.rs`):
//! to a running one's [`Live`](crate::live::Live) values (backends added,
//! drained or reweighted in place with
//! [`Scheduler::set_weight`](crate::scheduler::Scheduler::set_weight); the
//! algorithm, the proxy's, health's and the rate limit's settings, a new
//! [`Limiter`](crate::limiter::Limiter) when these change; its listening
//! addresses); a new service is started, one no longer in the file
//! stopped ([`Running`]). It is counted in `reloads_ok` and logged in one
//! line. The settings marked `restart` in the settings table
//! (`config/table.rs`), and the file's `mode`, keep their running value
//! with one warning. systemd, when it listens, hears "reloading" then
//! "ready" around each reload. No connection is cut; `docs/operations.md`
//! (Reloading: SIGHUP) tells the whole story. `diff` is
//! `check-config --diff OLD NEW`: two files compared in the same words.
//! `asked` makes one reloader answer SIGHUP and the admin API's
//! reload and dry run. `flags_only` is the reload of a balancer started without a config
//! file (its files read again). `root_reader` keeps, when root is given up, a process that reads the
//! files of a reload with root's rights ([`keep_root_reader`]).
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

mod asked;
mod diff;
mod flags_only;
mod root_reader;
mod service;

pub use diff::between;
pub use root_reader::{keep_root_reader, named_files};

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::admin::Token;
use crate::balancer::Balancer;
use crate::config::file::{self, Mode};
use crate::config::settings::{self, Scope};
use crate::config::{Config, Overrides};
use crate::error::{Error, Result};
use crate::listener;
use crate::reaper::{self, Owner, Reaper, Reapers};
use crate::running::{Bound, Running};
use crate::service::Service;
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
    /// Backends given by name whose name now gives other addresses.
    pub readdressed: usize,
    /// Other settings changed live (the algorithm included).
    pub settings_changed: usize,
    /// Services started.
    pub services_added: usize,
    /// Services stopped (their clients are served to the end).
    pub services_removed: usize,
    /// Settings that differ in the file but need a restart: kept. A
    /// service's are written `service: key` when there are several.
    pub needs_restart: Vec<String>,
    /// Each change of the summary on its own (`+1 backend (...)`, `service
    /// api: weight ... 1 → 3`), in the order made.
    pub changes: Vec<String>,
}

/// Reloads the config file into a running balancer. Cheap to clone; every
/// clone reloads the same balancer, one reload at a time.
#[derive(Debug, Clone)]
pub struct Reloader {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The config file, read again at each reload; `None` when the
    /// balancer was started with flags alone, which are applied again.
    path: Option<PathBuf>,
    /// The flags given at start-up (and backends typed at the prompt):
    /// they still win over the file.
    flags: Overrides,
    /// The services, which a reload changes, adds and stops.
    running: Arc<Running>,
    /// Where reloads are counted.
    stats: Arc<Stats>,
    /// The settings running now; the lock serializes reloads.
    state: Mutex<State>,
    /// Per service (by its scheduler): removes the backends drained by a
    /// reload once their last connection ends (or at `drain_timeout`).
    reapers: Reapers,
    /// The admin API's token, when it has one: its file is read again.
    token: Option<Token>,
}

#[derive(Debug)]
struct State {
    config: Config,
    mode: Mode,
}

/// What `prepare` decided, for `apply` (or, in a dry run, for `describe`
/// alone).
struct Plan {
    config: Config,
    changed: Vec<service::Plan>,
    added: Vec<Added>,
    removed: Vec<String>,
    needs_restart: Vec<String>,
    /// The admin token, its file read again.
    token: Option<String>,
}

/// A service the file adds.
struct Added {
    name: String,
    /// Its listening addresses, as configured.
    addrs: Vec<SocketAddr>,
    /// The service built and its sockets bound; `None` in a dry run, which
    /// binds the addresses to see that it can, then lets them go.
    start: Option<(Arc<Service>, Bound)>,
}

impl Reloader {
    /// A reloader for `balancer`, reading `path` under `flags` (the
    /// start-up flags, with the prompt's backends if it asked).
    pub fn new(path: impl Into<PathBuf>, flags: Overrides, balancer: &Balancer) -> Reloader {
        Reloader::reading(Some(path.into()), flags, balancer)
    }

    /// A reloader for `balancer` started without a config file: each
    /// reload keeps the settings running (the admin API's changes too)
    /// and reads again the TLS files they name (certificates, keys, CAs,
    /// CRLs).
    pub fn flags_only(flags: Overrides, balancer: &Balancer) -> Reloader {
        Reloader::reading(None, flags, balancer)
    }

    fn reading(path: Option<PathBuf>, flags: Overrides, balancer: &Balancer) -> Reloader {
        Reloader {
            inner: Arc::new(Inner {
                path,
                flags,
                running: balancer.running(),
                stats: balancer.stats(),
                state: Mutex::new(State {
                    config: balancer.config().clone(),
                    mode: Mode::LoadBalancer,
                }),
                reapers: Reapers::new(Owner::Reload, None),
                token: balancer.admin_token(),
            }),
        }
    }

    /// The config file it reads (`None`: the flags alone).
    pub fn path(&self) -> Option<&Path> {
        self.inner.path.as_deref()
    }

    /// What [`Reloader::reload`] would do now, without doing it: the file
    /// read and checked, new backends resolved and new addresses bound (then
    /// let go), as a reload does, and the report it would give. Counts
    /// nothing and tells systemd nothing.
    ///
    /// # Errors
    ///
    /// As [`Reloader::reload`]: the reason the reload would be refused.
    pub fn dry_run(&self) -> Result<ReloadReport> {
        let state = self.inner.state.lock();
        if self.inner.path.is_none() {
            // Without a file a reload only reads the TLS files again.
            let tls = state.config.service_list().iter().any(|c| c.tls.on());
            let summary = match tls {
                true => "a reload would do: certificates read again",
                false => "a reload would do: no change",
            };
            return Ok(ReloadReport {
                summary: summary.to_string(),
                ..ReloadReport::default()
            });
        }
        let plan = self.prepare(&state, true)?;
        let mut report = self.describe(&state, &plan);
        report.summary = report
            .summary
            .replacen("reload: ", "a reload would do: ", 1);
        Ok(report)
    }

    /// Reads the file again and applies it (see the module docs). Logs one
    /// info line on success, one error line on failure, and a warning for
    /// settings that need a restart.
    ///
    /// # Errors
    ///
    /// [`Error::ConfigFile`] (or another usage
    /// error) when the file cannot be read or is not valid, or
    /// [`Error::Bind`] when a new listening
    /// address cannot be bound; nothing was changed then.
    pub fn reload(&self) -> Result<ReloadReport> {
        let inner = &self.inner;
        let mut state = inner.state.lock();
        systemd::reloading();
        let result = self.reload_locked(&mut state);
        // Ready again, with the new settings or the old ones; a failure
        // stays in `systemctl status` until the next reload.
        let status = inner.running.status();
        match &result {
            Ok(_) => systemd::ready(&status),
            Err(err) => systemd::ready(&format!("reload failed: {}; {status}", in_short(err))),
        }
        result
    }

    /// [`Reloader::reload`] under the lock, between what it tells systemd.
    fn reload_locked(&self, state: &mut State) -> Result<ReloadReport> {
        let inner = &self.inner;
        if inner.path.is_none() {
            return self.reload_files(state);
        }
        let plan = match self.prepare(state, false) {
            Ok(plan) => plan,
            Err(err) => {
                Stats::incr(&inner.stats.reloads_failed);
                log::error!("reload refused, the running settings stay: {err}");
                return Err(err);
            }
        };
        let report = self.apply(state, plan);
        Stats::incr(&inner.stats.reloads_ok);
        if !report.needs_restart.is_empty() {
            log::warn!("{}", restart_warning(&report.needs_restart));
        }
        log::info!("{}", report.summary);
        Ok(report)
    }

    /// The reaper of `service`'s drained backends.
    fn reaper(&self, service: &Service) -> Reaper {
        let running = self.inner.running.schedulers();
        self.inner.reapers.of(&service.live.scheduler, &running)
    }

    /// Everything that can fail: read, validate, resolve new backends,
    /// bind new addresses. A `dry` plan builds no new service.
    fn prepare(&self, state: &State, dry: bool) -> Result<Plan> {
        let inner = &self.inner;
        let file = match &inner.path {
            Some(path) => file::load(path)?,
            None => file::parse(Path::new("the command line"), "{}")?,
        };
        let mut config = file.settle(&inner.flags)?;
        file.require_backends(&config)?;
        let from_file = !inner.flags.given().contains(&"backends");
        let mut needs_restart: Vec<String> =
            settings::keep_restart_only_in(Scope::Process, &mut config, &state.config)
                .into_iter()
                .map(String::from)
                .collect();
        settings::share_process(&mut config);
        crate::config::sni_check::same_routing(&state.config, &config)?;
        if file.mode != state.mode {
            needs_restart.push("mode".into());
        }
        let several = config.services.len() > 1 || state.config.services.len() > 1;
        let old_list: Vec<Config> = state.config.service_list().into_iter().cloned().collect();
        let mut plan = Plan {
            config: Config::default(),
            changed: Vec::new(),
            added: Vec::new(),
            removed: Vec::new(),
            needs_restart,
            token: self.read_token(&state.config)?,
        };
        let leaving: Vec<&Config> = old_list
            .iter()
            .filter(|o| !config.service_list().iter().any(|n| n.name == o.name))
            .collect();
        for new in config.service_list() {
            let name = new.name.as_str();
            let running = inner.running.find(name);
            match (running, old_list.iter().find(|o| o.name == name)) {
                (Some(service), Some(old)) => {
                    let reaper = self.reaper(&service);
                    let one =
                        service::prepare(&service, old, new.clone(), &reaper, &file, from_file)?;
                    plan.needs_restart.extend(one.needs_restart.iter().map(|k| {
                        if several {
                            format!("{name}: {k}")
                        } else {
                            k.to_string()
                        }
                    }));
                    plan.changed.push(one);
                }
                _ => plan.added.push(self.prepare_new(new, dry, &leaving)?),
            }
        }
        let names: Vec<&str> = config
            .service_list()
            .iter()
            .map(|n| n.name.as_str())
            .collect();
        plan.removed = old_list
            .iter()
            .filter(|o| !names.contains(&o.name.as_str()))
            .map(|o| o.name.clone())
            .collect();
        // The kept restart-only values, in the configuration that runs.
        for one in &plan.changed {
            if let Some(s) = config_service(&mut config, one.service.name()) {
                *s = one.config.clone();
            }
        }
        plan.config = config;
        Ok(plan)
    }

    /// What `plan` does, in words: the report of the reload that applies
    /// it, read before anything changes.
    fn describe(&self, state: &State, plan: &Plan) -> ReloadReport {
        let running = &self.inner.running;
        let mut report = ReloadReport {
            needs_restart: plan.needs_restart.clone(),
            ..ReloadReport::default()
        };
        let several = plan.config.services.len() > 1 || state.config.services.len() > 1;
        let removed = plan.removed.iter().map(|name| {
            let active = running.find(name).map_or(0, |s| s.stats.own().active);
            (name.clone(), Some(active))
        });
        let old_list: Vec<Config> = state.config.service_list().into_iter().cloned().collect();
        let mut changed = Vec::new();
        for one in &plan.changed {
            let name = one.service.name();
            let old = old_list.iter().find(|o| o.name == name);
            let parts = service::describe(one, old.unwrap_or(&Config::default()), &mut report);
            changed.push((name.to_string(), parts));
        }
        let added = plan.added.iter().map(|a| (a.name.clone(), a.addrs.clone()));
        let services = Services {
            removed: removed.collect(),
            changed,
            added: added.collect(),
        };
        services.tell(several, &mut report);
        report
    }

    /// A service the file adds: its addresses bound and its backends
    /// resolved; built, unless `dry`. An address that a service stopped
    /// by this reload (`leaving`) listens on is taken over: its socket is
    /// handed on once that service has stopped, since binding it again
    /// would fail while the old one holds it (a service renamed with its
    /// address kept).
    fn prepare_new(&self, new: &Config, dry: bool, leaving: &[&Config]) -> Result<Added> {
        let addrs = new.listen_addrs();
        let taken = self.taken_over(new, leaving);
        let held: Vec<SocketAddr> = taken.iter().map(|(addr, _)| *addr).collect();
        let bound = listener::open_except(new, &held)?;
        let start = if dry {
            for spec in &new.backends {
                spec.resolve()?;
            }
            None
        } else {
            let service = Service::build(new.clone(), &self.inner.running.shared)?;
            let mut bound = bound.into_iter();
            let mut listeners = Vec::new();
            for &addr in &addrs {
                let socket = match taken.iter().find(|(a, _)| *a == addr) {
                    Some((_, owner)) => self.inner.running.socket_of(owner, addr)?,
                    // `open_except` bound the others, in the same order.
                    None => bound.next(),
                };
                let socket = socket.ok_or_else(|| Error::Bind {
                    addr,
                    source: std::io::ErrorKind::AddrNotAvailable.into(),
                })?;
                listeners.push((addr, socket));
            }
            Some((Arc::new(service), listeners))
        };
        Ok(Added {
            name: new.name.clone(),
            addrs,
            start,
        })
    }

    /// The addresses of `new` that a service stopped by this reload
    /// listens on, with that service's name: those `new` takes over. Not
    /// when either side shares its port ([`listener::shares_port`]): such
    /// a socket is woken from its accept by shutting it down, which would
    /// end it for the new service too, and a second socket binds beside it
    /// anyway.
    fn taken_over(&self, new: &Config, leaving: &[&Config]) -> Vec<(SocketAddr, String)> {
        if listener::shares_port(new) {
            return Vec::new();
        }
        let running = &self.inner.running;
        let mut taken = Vec::new();
        for old in leaving.iter().filter(|o| !listener::shares_port(o)) {
            for addr in running.configured_addrs(&old.name) {
                if addr.port() != 0 && new.listen_addrs().contains(&addr) {
                    taken.push((addr, old.name.clone()));
                }
            }
        }
        taken
    }

    /// Changes the services as planned; cannot fail (a thread that cannot
    /// start is logged).
    fn apply(&self, state: &mut State, plan: Plan) -> ReloadReport {
        let inner = &self.inner;
        let mut report = self.describe(state, &plan);
        // Stopped first: a new service may take over one's address.
        for name in &plan.removed {
            inner.running.stop(name).join();
        }
        let old_list: Vec<Config> = state.config.service_list().into_iter().cloned().collect();
        for one in plan.changed {
            let name = one.service.name().to_string();
            let old = old_list
                .iter()
                .find(|o| o.name == name)
                .cloned()
                .unwrap_or_default();
            let reaper = self.reaper(&one.service);
            for part in service::apply(one, &old, &inner.running, &reaper) {
                report.readdressed += 1;
                report.summary = match report.summary.as_str() {
                    "reload: no change" => format!("reload: {part}"),
                    summary => format!("{summary}; {part}"),
                };
                report.changes.push(part);
            }
        }
        for (service, listeners) in plan.added.into_iter().filter_map(|a| a.start) {
            let name = service.name().to_string();
            if let Err(err) = inner.running.start(service, listeners, Box::new(|| {})) {
                log::error!("reload: service {name} could not start: {err}");
            }
        }
        if let (Some(cell), Some(token)) = (&inner.token, plan.token) {
            cell.set(token);
        }
        state.config = plan.config;
        // A reload may have turned `resolve_interval` on.
        inner.running.resolve_names();
        report
    }
}

/// A reload's changes, service by service, in words.
pub(crate) struct Services {
    /// Services stopped, with their connections finishing (when known).
    pub removed: Vec<(String, Option<u64>)>,
    /// Services changed, with the parts of their change.
    pub changed: Vec<(String, Vec<String>)>,
    /// Services started, with their listening addresses.
    pub added: Vec<(String, Vec<SocketAddr>)>,
}

impl Services {
    /// Writes the summary and the changes into `report`, each part under
    /// its service's name when `several` services run (or will).
    pub(crate) fn tell(self, several: bool, report: &mut ReloadReport) {
        let mut changes = Vec::new();
        let mut sections = Vec::new();
        for (name, active) in self.removed {
            changes.push(match active {
                Some(n) => format!(
                    "service {name} stopped ({} finishing)",
                    units::count(n, "connection")
                ),
                None => format!("service {name} stopped"),
            });
            report.services_removed += 1;
        }
        sections.extend(changes.iter().cloned());
        for (name, parts) in self.changed {
            if parts.is_empty() {
                continue;
            }
            if several {
                changes.extend(parts.iter().map(|p| format!("service {name}: {p}")));
                sections.push(format!("service {name}: {}", parts.join(", ")));
            } else {
                sections.push(parts.join(", "));
                changes.extend(parts);
            }
        }
        for (name, addrs) in self.added {
            let addrs: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
            let line = format!("service {name} started on {}", addrs.join(", "));
            changes.push(line.clone());
            sections.push(line);
            report.services_added += 1;
        }
        report.summary = if sections.is_empty() {
            "reload: no change".to_string()
        } else {
            format!("reload: {}", sections.join("; "))
        };
        report.changes = changes;
    }
}

/// The service `name` of `config` (itself when it has no `services`).
fn config_service<'a>(config: &'a mut Config, name: &str) -> Option<&'a mut Config> {
    if config.services.is_empty() {
        return (config.name == name).then_some(config);
    }
    config.services.iter_mut().find(|s| s.name == name)
}

/// Why a reload failed, in at most 120 characters, for `STATUS=`.
fn in_short(err: &Error) -> String {
    let text = err.to_string();
    let line = text.lines().next().unwrap_or_default();
    match line.char_indices().nth(119) {
        Some((at, _)) => format!("{}…", &line[..at]),
        None => line.to_string(),
    }
}

/// The warning about settings a reload cannot change, in plain English:
/// `reload: workers needs a restart to change; its running value stays`,
/// `reload: backlog, workers and mode need a restart ...`.
fn restart_warning<S: AsRef<str>>(keys: &[S]) -> String {
    let keys: Vec<&str> = keys.iter().map(AsRef::as_ref).collect();
    let list = match keys.as_slice() {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::scheduler::Algorithm;
    use std::io::Write;
    use std::time::Instant;

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
    fn a_reload_changes_a_backend_s_cap_in_place() {
        let s = Setup::new(
            "cap",
            r#"{"listen": "127.0.0.1:0", "backends": ["127.0.0.1:1", "127.0.0.1:2"]}"#,
        );
        let first = s.balancer.scheduler().snapshot()[0].clone();
        assert_eq!(first.max_connections(), None);
        s.write(
            r#"{"listen": "127.0.0.1:0", "max_queue": 9, "backends": [
                "127.0.0.1:1,max_connections=5", {"host": "127.0.0.1", "port": 2, "max_connections": 7}]}"#,
        );
        let r = s.reloader.reload().unwrap();
        assert!(
            r.summary.contains(
                "max_connections 127.0.0.1:1 none → 5, max_connections 127.0.0.1:2 none → 7"
            ),
            "{}",
            r.summary
        );
        assert_eq!(first.max_connections(), Some(5), "in place");
        assert_eq!(s.balancer.live().proxy.load().max_queue, 9);
        // A bad cap keeps the old ones.
        s.write(r#"{"listen": "127.0.0.1:0", "backends": ["127.0.0.1:1,max_connections=0"]}"#);
        assert!(s.reloader.reload().is_err());
        assert_eq!(first.max_connections(), Some(5));
        s.write(r#"{"listen": "127.0.0.1:0", "backends": ["127.0.0.1:1", "127.0.0.1:2"]}"#);
        s.reloader.reload().unwrap();
        assert_eq!(first.max_connections(), None, "lifted");
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
    fn a_dry_run_says_what_a_reload_does_and_does_nothing() {
        let s = Setup::new(
            "dry",
            r#"{"listen": "127.0.0.1:0", "backends": ["127.0.0.1:1", "127.0.0.1:2"]}"#,
        );
        s.write(
            r#"{"listen": "127.0.0.1:0", "workers": 8,
                "backends": ["127.0.0.1:1,weight=3", "127.0.0.1:3"]}"#,
        );
        let dry = s.reloader.dry_run().unwrap();
        assert_eq!(
            dry.changes,
            [
                "+1 backend (127.0.0.1:3)",
                "weight 127.0.0.1:1 1 → 3",
                "draining 127.0.0.1:2 (0 connections)"
            ]
        );
        assert_eq!(dry.needs_restart, ["workers"]);
        assert_eq!(s.names(), ["127.0.0.1:1", "127.0.0.1:2"]);
        assert_eq!(s.balancer.scheduler().snapshot()[0].weight(), 1);
        let stats = s.balancer.stats().snapshot();
        assert_eq!((stats.reloads_ok, stats.reloads_failed), (0, 0));
        // The reload then does what the dry run said, in the same words.
        let done = s.reloader.reload().unwrap();
        assert_eq!(done.changes, dry.changes);
        assert_eq!(
            done.summary.trim_start_matches("reload: "),
            dry.summary.trim_start_matches("a reload would do: ")
        );
        s.write("{\"backends\": [],,}");
        assert!(s.reloader.dry_run().is_err());
        assert_eq!(s.balancer.stats().snapshot().reloads_failed, 0);
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

    fn service_names(s: &Setup) -> Vec<String> {
        let running = s.balancer.running().list();
        running.iter().map(|x| x.name().to_string()).collect()
    }

    #[test]
    fn services_are_added_changed_and_stopped_by_name() {
        let s = Setup::new(
            "services",
            r#"{"services": [
                {"name": "a", "listen": "127.0.0.1:0", "backends": ["127.0.0.1:1"]},
                {"name": "b", "listen": "127.0.0.1:0", "backends": ["127.0.0.1:2"]}]}"#,
        );
        assert_eq!(service_names(&s), ["a", "b"]);
        let b = s.balancer.running().find("b").unwrap();
        s.write(
            r#"{"services": [
                {"name": "b", "listen": "127.0.0.1:0", "backends": ["127.0.0.1:2"],
                 "algorithm": "least-connections", "send_proxy": "v2"},
                {"name": "c", "listen": "127.0.0.1:0", "backends": ["127.0.0.1:3"]}]}"#,
        );
        let r = s.reloader.reload().unwrap();
        assert_eq!((r.services_added, r.services_removed), (1, 1), "{r:?}");
        assert_eq!(r.needs_restart, ["b: send_proxy"]);
        assert_eq!(
            r.summary,
            "reload: service a stopped (0 connections finishing); \
             service b: algorithm round-robin → least-connections; \
             service c started on 127.0.0.1:0"
        );
        assert_eq!(service_names(&s), ["b", "c"]);
        assert_eq!(b.live.scheduler.algorithm(), Algorithm::LeastConnections);
        // An address that cannot be bound fails the whole reload.
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        s.write(&format!(
            r#"{{"services": [
                {{"name": "b", "listen": "127.0.0.1:0", "backends": ["127.0.0.1:2"],
                  "algorithm": "round-robin"}},
                {{"name": "d", "listen": "127.0.0.1:{port}", "backends": ["127.0.0.1:4"]}}]}}"#
        ));
        let err = s.reloader.reload().unwrap_err().to_string();
        assert!(
            err.starts_with(&format!(
                "service `d`: failed to listen on 127.0.0.1:{port}"
            )),
            "{err}"
        );
        assert_eq!(service_names(&s), ["b", "c"]);
        assert_eq!(b.live.scheduler.algorithm(), Algorithm::LeastConnections);
        s.balancer.running().stop("c").join();
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
