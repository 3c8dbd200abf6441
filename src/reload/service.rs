//! One service's part of a reload: its backends (added, drained,
//! reweighted, restored by name, or checked anew: a changed own check,
//! `check_port` included, changes the backend in place; the names looked
//! up again), its live settings, and its listening
//! addresses (new ones bound while planning, so an address that cannot be
//! bound fails the reload before anything changed).
//!
//! # Threads
//!
//! Runs on the reloading thread, under the reloader's lock.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C reads its backends once, at the prompt.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Instant;

use crate::backend::Backend;
use crate::config::file::ConfigFile;
use crate::config::settings::{self, Scope};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::health::OwnCheck;
use crate::limiter::Limiter;
use crate::listener;
use crate::live::Live;
use crate::lookup;
use crate::reaper::Reaper;
use crate::running::Running;
use crate::service::Service;
use crate::stats::Stats;
use crate::tls_term::Terminator;
use crate::units;

use super::ReloadReport;

/// What a reload does to one service's backends, matched by name.
#[derive(Default)]
pub(super) struct Backends {
    add: Vec<Arc<Backend>>,
    restore: Vec<Arc<Backend>>,
    reweight: Vec<(Arc<Backend>, u32)>,
    /// Kept backends whose own check changed (`check_port`, `rise`, ...):
    /// changed in place, their connections, state and counters kept.
    recheck: Vec<(Arc<Backend>, OwnCheck)>,
    /// Backends whose `max_connections` changed, with the new one.
    recap: Vec<(Arc<Backend>, Option<usize>)>,
    /// Backends whose `backup` changed, with the new value.
    rerole: Vec<(Arc<Backend>, bool)>,
    /// Backends whose own `on_backend_down` or `on_backend_removed`
    /// changed, with the new ones.
    reend: Vec<(Arc<Backend>, crate::connections::Own)>,
    drain: Vec<Arc<Backend>>,
    /// Backends kept, given by name: looked up again by every reload.
    names: Vec<Arc<Backend>>,
}

/// What a reload changes in one running service.
pub(super) struct Plan {
    pub service: Arc<Service>,
    /// Its new settings, restart-only ones kept at their running value.
    pub config: Config,
    backends: Backends,
    /// New listening addresses, bound, with their configured address.
    listen_new: Vec<(SocketAddr, TcpListener)>,
    /// Configured addresses no longer listed.
    listen_gone: Vec<SocketAddr>,
    pub needs_restart: Vec<&'static str>,
    /// The service's TLS terminator with its certificates read again,
    /// for a service that terminates TLS.
    tls: Option<Terminator>,
}

/// Matches `new`'s backends with `list` (the running ones; `retiring`,
/// the ids of those draining out) by name: what to add, serve again,
/// reweigh and drain. A new backend is resolved here, so one that does
/// not resolve fails the plan.
pub(super) fn plan_backends(
    list: &[Arc<Backend>],
    retiring: &[u64],
    old: &Config,
    new: &Config,
    file: &ConfigFile,
    from_file: bool,
) -> Result<Backends> {
    // A `srv:` entry's backends follow its records (`srv_follow.rs`), not
    // the file: a reload leaves them, and its entries, alone.
    let mut unmatched: Vec<Arc<Backend>> = list
        .iter()
        .filter(|b| b.source_name().is_none())
        .cloned()
        .collect();
    let mut plan = Backends::default();
    for spec in new.backends.iter().filter(|s| !s.is_srv()) {
        let name = spec.name();
        match unmatched.iter().position(|b| b.name() == name) {
            Some(pos) => {
                let b = unmatched.remove(pos);
                if b.configured_weight() != spec.weight {
                    plan.reweight.push((Arc::clone(&b), spec.weight));
                }
                if *b.own_check() != spec.check {
                    plan.recheck.push((Arc::clone(&b), spec.check.clone()));
                }
                if b.addresses().lookup().is_some() {
                    plan.names.push(Arc::clone(&b));
                }
                if b.max_connections() != spec.max_connections {
                    plan.recap.push((Arc::clone(&b), spec.max_connections));
                }
                if b.is_backup() != spec.backup {
                    plan.rerole.push((Arc::clone(&b), spec.backup));
                }
                if b.own_ends() != spec.ends {
                    plan.reend.push((Arc::clone(&b), spec.ends));
                }
                if retiring.contains(&b.id()) {
                    plan.restore.push(b);
                }
            }
            None => {
                let send_proxy = spec.send_proxy.or(old.send_proxy);
                let backend = Backend::from_spec(spec)
                    .map_err(|e| match e {
                        Error::InvalidBackend(msg) if from_file => file.error_at("backends", msg),
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
    Ok(plan)
}

/// Plans the change of `service` (running with `old`) to `new`: what can
/// fail (a backend that does not resolve, an address that cannot be
/// bound) fails here.
pub(super) fn prepare(
    service: &Arc<Service>,
    old: &Config,
    mut new: Config,
    reaper: &Reaper,
    file: &ConfigFile,
    from_file: bool,
) -> Result<Plan> {
    let list = service.live.scheduler.snapshot();
    let backends = plan_backends(&list, &reaper.watched(), old, &new, file, from_file)?;
    let mut needs_restart = settings::keep_restart_only_in(Scope::Service, &mut new, old);
    // The resolver follows the `srv:` entries the service started with.
    let srv = |c: &Config| {
        c.backends
            .iter()
            .filter(|b| b.is_srv())
            .cloned()
            .collect::<Vec<_>>()
    };
    if srv(old) != srv(&new) {
        needs_restart.push("srv: backends");
        // Kept as running, like every setting a restart changes.
        new.backends.retain(|b| !b.is_srv());
        new.backends.extend(srv(old));
    }
    let tls = prepare_tls(service, old, &mut new, &mut needs_restart)?;
    let (was, now) = (old.listen_addrs(), new.listen_addrs());
    let listen_gone = was.iter().filter(|a| !now.contains(a)).copied().collect();
    let mut listen_new = Vec::new();
    for addr in now.into_iter().filter(|a| !was.contains(a)) {
        let one = Config {
            listen: addr,
            listen_also: Vec::new(),
            ..new.clone()
        };
        let mut bound = listener::open(&one)?;
        listen_new.push((addr, bound.remove(0)));
    }
    Ok(Plan {
        service: Arc::clone(service),
        config: new,
        backends,
        listen_new,
        listen_gone,
        needs_restart,
        tls,
    })
}

/// The terminator of a service that terminates TLS, its certificate and
/// key files read again (certbot renews them in place): a bad one fails
/// the reload here, before anything changed; sessions resume across it
/// when no TLS setting changed. Turning TLS on or off needs a restart
/// ([`keep_tls_switch`]).
fn prepare_tls(
    service: &Service,
    old: &Config,
    new: &mut Config,
    needs_restart: &mut Vec<&'static str>,
) -> Result<Option<Terminator>> {
    needs_restart.extend(keep_tls_switch(old, new));
    match &service.live.tls {
        // The running terminator's session cache and ticket keys go on
        // when no TLS setting changed: clients resume across the reload.
        Some(running) => Terminator::load_after(&new.tls, Some(&running.load())),
        None => Ok(None),
    }
}

/// Turning TLS on or off for a service (terminating it, or speaking it to
/// the backends, where neither was, or the reverse) needs a restart: the
/// running values of `tls_certs` and `backend_tls` are kept in `new`, and
/// the keys of those that changed are returned (only those: turning
/// `tls_certs` on does not name `backend_tls`). The one rule for a reload
/// and for `check-config --diff`.
pub(super) fn keep_tls_switch(old: &Config, new: &mut Config) -> Vec<&'static str> {
    if old.tls.on() == new.tls.on() {
        return Vec::new();
    }
    let mut kept = Vec::new();
    if old.tls.terminates() != new.tls.terminates() {
        kept.push("tls_certs");
    }
    if old.tls.backend != new.tls.backend {
        kept.push("backend_tls");
    }
    new.tls.certs = old.tls.certs.clone();
    new.tls.backend = old.tls.backend;
    kept
}

/// The settings `service` runs with now: `old` as the live values say (an
/// admin request may have changed them since the last reload).
fn running_settings(service: &Service, old: &Config) -> Config {
    let live = &service.live;
    let mut before = old.clone();
    before.algorithm = live.scheduler.algorithm();
    before.proxy = current(&live.proxy);
    before.health = current(&live.health);
    before.rate_limit = live.limiter.load().as_ref().map(|l| l.config().clone());
    before
}

/// What `apply` will do to the service, one part per change, in the words
/// of the reload's log line; counted in `report`.
pub(super) fn describe(plan: &Plan, old: &Config, report: &mut ReloadReport) -> Vec<String> {
    let before = running_settings(&plan.service, old);
    let listen_new: Vec<SocketAddr> = plan.listen_new.iter().map(|(a, _)| *a).collect();
    let mut parts = describe_changes(
        &plan.backends,
        &before,
        &plan.config,
        (&listen_new, &plan.listen_gone),
        report,
    );
    if plan.tls.is_some() {
        parts.push("certificates read again".into());
    }
    parts
}

/// The parts of a service's change from `before` to `config`, in the
/// order `apply` makes them: listening on more addresses, backends added,
/// served again, reweighted, settings, backends draining, addresses given
/// up.
pub(super) fn describe_changes(
    backends: &Backends,
    before: &Config,
    config: &Config,
    (listen_new, listen_gone): (&[SocketAddr], &[SocketAddr]),
    report: &mut ReloadReport,
) -> Vec<String> {
    let mut parts = Vec::new();
    let addrs = |list: &[SocketAddr]| {
        let list: Vec<String> = list.iter().map(|a| a.to_string()).collect();
        list.join(", ")
    };
    if !listen_new.is_empty() {
        parts.push(format!("listening on {}", addrs(listen_new)));
    }
    if !backends.add.is_empty() {
        let names: Vec<&str> = backends.add.iter().map(|b| b.name()).collect();
        parts.push(format!(
            "+{} ({})",
            units::count(backends.add.len() as u64, "backend"),
            names.join(", ")
        ));
        report.added += backends.add.len();
    }
    for b in &backends.restore {
        parts.push(format!("serving {} again", b.name()));
    }
    report.restored += backends.restore.len();
    for (b, weight) in &backends.reweight {
        parts.push(format!(
            "weight {} {} → {weight}",
            b.name(),
            b.configured_weight()
        ));
    }
    report.reweighted += backends.reweight.len();
    for (b, own) in &backends.recheck {
        parts.push(format!("checks of {}: {}", b.name(), own_words(own)));
    }
    report.settings_changed += backends.recheck.len();
    let show = |cap: Option<usize>| cap.map_or("none".to_string(), |n| n.to_string());
    for (b, cap) in &backends.recap {
        let was = show(b.max_connections());
        parts.push(format!(
            "max_connections {} {was} → {}",
            b.name(),
            show(*cap)
        ));
    }
    for (b, backup) in &backends.rerole {
        let now = if *backup { "a backup" } else { "a primary" };
        parts.push(format!("{} now {now}", b.name()));
    }
    for (b, ends) in &backends.reend {
        let words = ends.to_string().replace(',', " ");
        let words = if words.is_empty() {
            " as the service's".into()
        } else {
            words
        };
        parts.push(format!("ends of {}:{words}", b.name()));
    }
    report.settings_changed += backends.reend.len();
    setting_changes(before, config, &mut parts, report);
    for b in &backends.drain {
        let n = b.active() + b.pending();
        parts.push(format!(
            "draining {} ({})",
            b.name(),
            units::count(n as u64, "connection")
        ));
    }
    report.draining += backends.drain.len();
    if !listen_gone.is_empty() {
        parts.push(format!("no longer listening on {}", addrs(listen_gone)));
    }
    parts
}

/// An own check in the words of the reload's log line.
fn own_words(own: &OwnCheck) -> String {
    match own.to_string() {
        text if text.is_empty() => "as the service's".to_string(),
        text => text[1..].to_string(),
    }
}

/// Changes the running service as planned (what `describe` says);
/// cannot fail (an accept thread that cannot start is logged). Returns
/// what only doing it can tell: the names whose lookup now gives other
/// addresses, as parts of the reload's log line.
pub(super) fn apply(plan: Plan, old: &Config, running: &Running, reaper: &Reaper) -> Vec<String> {
    let live = &plan.service.live;
    let config = &plan.config;
    let before = running_settings(&plan.service, old);
    let name = plan.service.name().to_string();
    if !plan.listen_new.is_empty() {
        if let Err(err) = running.listen_more(&name, plan.listen_new) {
            log::error!("reload: {err}");
        }
    }
    let backends = plan.backends;
    apply_backends(
        live,
        reaper,
        backends.add,
        &backends.restore,
        &backends.reweight,
    );
    for (b, own) in backends.recheck {
        b.set_own_check(own);
    }
    for (b, cap) in &backends.recap {
        b.set_max_connections(*cap);
        // A raised cap frees slots for the clients waiting.
        live.scheduler.waitlist().notify();
    }
    // Every name again, whatever `resolve_interval` says: a backend
    // restarted with a new address is followed by a reload. A failed
    // lookup keeps its addresses (and is logged); the reload goes on.
    let mut moved = Vec::new();
    for b in &backends.names {
        if let Some((_, now)) = b.addresses().resolve_again(b.name()) {
            moved.push(format!("{} now at {}", b.name(), lookup::list(&now)));
        }
    }
    for (b, backup) in &backends.rerole {
        live.scheduler.set_backup(b.id(), *backup);
    }
    for (b, ends) in &backends.reend {
        b.set_ends(*ends);
    }
    apply_settings(live, &plan.service.stats, &before, config);
    if let (Some(running), Some(tls)) = (&live.tls, plan.tls) {
        running.store(Arc::new(tls));
    }
    if !backends.drain.is_empty() {
        let deadline = Instant::now() + config.drain_timeout;
        for b in &backends.drain {
            b.set_draining(true);
            if let Err(err) = reaper.watch(Arc::clone(b), Some(deadline)) {
                // The backend stays in the list, draining: harmless.
                log::warn!("reload: could not start the reaper thread: {err}");
            }
        }
    }
    if !plan.listen_gone.is_empty() {
        running.stop_listening(&name, &plan.listen_gone).join();
    }
    moved
}

/// Adds the new backends, serves again the restored ones and sets the new
/// weights.
fn apply_backends(
    live: &Live,
    reaper: &Reaper,
    add: Vec<Arc<Backend>>,
    restore: &[Arc<Backend>],
    reweight: &[(Arc<Backend>, u32)],
) {
    // New backends first, drains last: never a moment with fewer backends
    // than both lists share.
    for b in add {
        live.scheduler.add(b);
    }
    for b in restore {
        reaper.forget(b.id());
        b.set_draining(false);
    }
    for (b, weight) in reweight {
        live.scheduler.set_weight(b.id(), *weight);
    }
}

/// Sets the algorithm, the proxy's, health's and the rate limit's settings
/// that changed from `before`.
fn apply_settings(live: &Live, stats: &Arc<Stats>, before: &Config, config: &Config) {
    if before.algorithm != config.algorithm {
        live.scheduler.set_algorithm(config.algorithm);
    }
    crate::service::tune_scheduler(&live.scheduler, config);
    if before.proxy != config.proxy {
        live.proxy.store(Arc::new(config.proxy.clone()));
    }
    if before.health != config.health {
        live.health.store(Arc::new(config.health.clone()));
    }
    if before.rate_limit != config.rate_limit {
        match config
            .rate_limit
            .as_ref()
            .map(|c| Limiter::with_store(c, &config.rate_limit_store, Arc::clone(stats)))
        {
            None => live.limiter.store(None),
            Some(Ok(limiter)) => live.limiter.store(Some(Arc::new(limiter))),
            Some(Err(err)) => log::error!("reload: the rate limit stays as it was: {err}"),
        }
    }
}

/// The settings that differ from `before` (the algorithm, then the other
/// service settings), each as `key was → now` in `parts`.
fn setting_changes(
    before: &Config,
    config: &Config,
    parts: &mut Vec<String>,
    report: &mut ReloadReport,
) {
    if before.algorithm != config.algorithm {
        parts.push(format!(
            "algorithm {} → {}",
            before.algorithm, config.algorithm
        ));
        report.settings_changed += 1;
    }
    let old: Vec<(&str, String)> = before.describe();
    for (key, value) in config.describe() {
        if matches!(key, "backends" | "algorithm" | "listen")
            || settings::scope_of(key) != Some(Scope::Service)
        {
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

/// A copy of what an `ArcSwap` holds now.
fn current<T: Clone>(swap: &arc_swap::ArcSwap<T>) -> T {
    T::clone(&swap.load())
}
