//! One service's part of a reload: its backends (added, drained,
//! reweighted or restored by name), its live settings, and its listening
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
use crate::limiter::Limiter;
use crate::listener;
use crate::live::Live;
use crate::reaper::Reaper;
use crate::running::Running;
use crate::service::Service;
use crate::stats::Stats;
use crate::tls_term::Terminator;
use crate::units;

use super::ReloadReport;

/// What a reload changes in one running service.
pub(super) struct Plan {
    pub service: Arc<Service>,
    /// Its new settings, restart-only ones kept at their running value.
    pub config: Config,
    add: Vec<Arc<Backend>>,
    restore: Vec<Arc<Backend>>,
    reweight: Vec<(Arc<Backend>, u32)>,
    drain: Vec<Arc<Backend>>,
    /// New listening addresses, bound, with their configured address.
    listen_new: Vec<(SocketAddr, TcpListener)>,
    /// Configured addresses no longer listed.
    listen_gone: Vec<SocketAddr>,
    pub needs_restart: Vec<&'static str>,
    /// The service's TLS terminator with its certificates read again,
    /// for a service that terminates TLS.
    tls: Option<Terminator>,
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
    let retiring: Vec<u64> = reaper.watched();
    let mut unmatched: Vec<Arc<Backend>> = list.to_vec();
    let mut plan = Plan {
        service: Arc::clone(service),
        config: Config::default(),
        add: Vec::new(),
        restore: Vec::new(),
        reweight: Vec::new(),
        drain: Vec::new(),
        listen_new: Vec::new(),
        listen_gone: Vec::new(),
        needs_restart: Vec::new(),
        tls: None,
    };
    for spec in &new.backends {
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
    plan.needs_restart = settings::keep_restart_only_in(Scope::Service, &mut new, old);
    plan.tls = prepare_tls(service, old, &mut new, &mut plan.needs_restart)?;
    let (was, now) = (old.listen_addrs(), new.listen_addrs());
    plan.listen_gone = was.iter().filter(|a| !now.contains(a)).copied().collect();
    for addr in now.into_iter().filter(|a| !was.contains(a)) {
        let one = Config {
            listen: addr,
            listen_also: Vec::new(),
            ..new.clone()
        };
        let mut bound = listener::open(&one)?;
        plan.listen_new.push((addr, bound.remove(0)));
    }
    plan.config = new;
    Ok(plan)
}

/// The terminator of a service that terminates TLS, its certificate and
/// key files read again (certbot renews them in place): a bad one fails
/// the reload here, before anything changed. Turning TLS on or off needs
/// a restart: the running value is kept, with the warning.
fn prepare_tls(
    service: &Service,
    old: &Config,
    new: &mut Config,
    needs_restart: &mut Vec<&'static str>,
) -> Result<Option<Terminator>> {
    if old.tls.on() != new.tls.on() {
        new.tls.certs = old.tls.certs.clone();
        new.tls.backend = old.tls.backend;
        needs_restart.push(if old.tls.terminates() != new.tls.terminates() {
            "tls_certs"
        } else {
            "backend_tls"
        });
    }
    match service.live.tls {
        Some(_) => Terminator::load(&new.tls),
        None => Ok(None),
    }
}

/// Changes the running service as planned, saying each change in
/// `parts`; cannot fail (an accept thread that cannot start is logged).
pub(super) fn apply(
    plan: Plan,
    old: &Config,
    running: &Running,
    reaper: &Reaper,
    parts: &mut Vec<String>,
    report: &mut ReloadReport,
) {
    let live = &plan.service.live;
    let config = &plan.config;
    // What runs now, as the live values say (an admin request may have
    // changed them since the last reload).
    let mut before = old.clone();
    before.algorithm = live.scheduler.algorithm();
    before.proxy = current(&live.proxy);
    before.health = current(&live.health);
    before.rate_limit = live.limiter.load().as_ref().map(|l| l.config().clone());
    let name = plan.service.name().to_string();
    if !plan.listen_new.is_empty() {
        let addrs: Vec<String> = plan.listen_new.iter().map(|(a, _)| a.to_string()).collect();
        parts.push(format!("listening on {}", addrs.join(", ")));
        if let Err(err) = running.listen_more(&name, plan.listen_new) {
            log::error!("reload: {err}");
        }
    }
    apply_backends(
        live,
        reaper,
        plan.add,
        &plan.restore,
        &plan.reweight,
        parts,
        report,
    );
    apply_settings(live, &plan.service.stats, &before, config, parts, report);
    if let (Some(running), Some(tls)) = (&live.tls, plan.tls) {
        running.store(Arc::new(tls));
        parts.push("certificates read again".into());
    }
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
            if let Err(err) = reaper.watch(Arc::clone(b), Some(deadline)) {
                // The backend stays in the list, draining: harmless.
                log::warn!("reload: could not start the reaper thread: {err}");
            }
        }
        report.draining += plan.drain.len();
    }
    if !plan.listen_gone.is_empty() {
        let addrs: Vec<String> = plan.listen_gone.iter().map(|a| a.to_string()).collect();
        parts.push(format!("no longer listening on {}", addrs.join(", ")));
        running.stop_listening(&name, &plan.listen_gone).join();
    }
}

/// Adds the new backends, serves again the restored ones and sets the new
/// weights, saying each in `parts`.
fn apply_backends(
    live: &Live,
    reaper: &Reaper,
    add: Vec<Arc<Backend>>,
    restore: &[Arc<Backend>],
    reweight: &[(Arc<Backend>, u32)],
    parts: &mut Vec<String>,
    report: &mut ReloadReport,
) {
    // New backends first, drains last: never a moment with fewer backends
    // than both lists share.
    if !add.is_empty() {
        let names: Vec<&str> = add.iter().map(|b| b.name()).collect();
        parts.push(format!(
            "+{} ({})",
            units::count(add.len() as u64, "backend"),
            names.join(", ")
        ));
        report.added += add.len();
        for b in add {
            live.scheduler.add(b);
        }
    }
    for b in restore {
        reaper.forget(b.id());
        b.set_draining(false);
        parts.push(format!("serving {} again", b.name()));
    }
    report.restored += restore.len();
    for (b, weight) in reweight {
        parts.push(format!("weight {} {} → {weight}", b.name(), b.weight()));
        live.scheduler.set_weight(b.id(), *weight);
    }
    report.reweighted += reweight.len();
}

/// Sets the algorithm, the proxy's, health's and the rate limit's settings
/// that changed from `before`, saying each in `parts`.
fn apply_settings(
    live: &Live,
    stats: &Arc<Stats>,
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
