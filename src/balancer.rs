//! The balancer assembled: its services (each its listeners, scheduler,
//! health checker and rate limiter, see [`crate::service`]), the one pool
//! and the admin API wired together.
//!
//! [`Balancer::bind`] does everything that can fail at start-up (validate,
//! try the workers' stack size, resolve the backends, bind the ports), so
//! errors come before any client and a test learns its port first;
//! [`Balancer::run`] accepts until the [`Shutdown`] is triggered, then
//! drains. What may change while it runs is shared as [`Live`] values
//! (`ArcSwap`, one atomic load to read). The live settings and the drain in
//! detail: docs/internals.md, "The balancer".
//!
//! # Threads
//!
//! `run` starts an accept loop per listening address and a health thread
//! per service ([`crate::running`]) and the admin API's thread, then waits
//! for the [`Shutdown`]; the pool spawns the workers as clients come.
//! systemd, when it listens, hears "ready" once every address listens
//! (its status says whether the first checks still run, then says again
//! once they are done) and "stopping" when the drain starts. The
//! [`Shutdown`] wakes every blocked `accept` (a connection to itself, with
//! `SO_REUSEPORT` a shutdown of the socket, through systemd's socket a
//! gate); the queue closes once the loops have left (or after a second,
//! which releases a push waiting in a full queue). The parts are shared
//! through `Arc`s; the `Balancer` itself holds no lock.
//!
//! # Corresponds to the C article
//!
//! `main()`: `queue_init()`, `create_balancer_socket()`, the thread
//! attributes, and the accept loop (`servers_entry()` is the caller's).

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use crate::access_log::{AccessLog, Target};
use crate::admin::{self, AdminListener, DryRunHook, ReloadHook};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::listener;
use crate::pool::{self, Pool};
use crate::running::Running;
use crate::scheduler::Scheduler;
use crate::service::{ProcessWide, Service};
use crate::shutdown::Shutdown;
use crate::stats::Stats;
use crate::systemd::{self, Gate};
use crate::units;
use crate::upgrade::Upgrade;

pub use crate::live::Live;

/// A bound, ready-to-run balancer.
pub struct Balancer {
    config: Config,
    /// The services at start-up, in the configuration's order (one,
    /// `default`, for a flat configuration).
    services: Vec<Arc<Service>>,
    /// Their listening sockets, until `run` starts their accept loops.
    listeners: Vec<Vec<TcpListener>>,
    /// The first service's first address (its real port).
    local_addr: SocketAddr,
    /// The services running, with what they share (the pool, the
    /// process's counters).
    running: Arc<Running>,
    /// The admin API's socket, when `admin_listen` is set.
    admin: Option<AdminListener>,
    /// What the admin API's `POST /reload` calls.
    reload: Option<ReloadHook>,
    /// What the admin API's `POST /reload?dry_run=1` calls.
    dry_run: Option<DryRunHook>,
    /// `upgrade_socket`: the previous process to release, the next to
    /// hand the listening sockets to.
    upgrade: Option<Upgrade>,
    /// The access log's writer, when `access_log` is set.
    access_log: Option<AccessLog>,
}

/// Every service's listening sockets, bound (some perhaps taken from the
/// previous process through `upgrade_socket`): what [`Balancer::listen`]
/// gives and [`Balancer::with_listener`] takes.
#[derive(Debug)]
pub struct Listeners {
    sockets: Vec<Vec<TcpListener>>,
    upgrade: Option<Upgrade>,
}

impl Balancer {
    /// Validates `config`, resolves its backends and binds the listeners.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSetting`] or [`Error::InvalidBackend`] for bad
    /// settings (the admin token file included), [`Error::Bind`] when an
    /// address (or the admin address) cannot be listened on.
    pub fn bind(config: Config) -> Result<Balancer> {
        config.validate()?;
        let listeners = Balancer::listen(&config)?;
        Balancer::with_listener(config, listeners)
    }

    /// Reads every file `config` names, as start-up would, and binds
    /// nothing: each service's certificates and keys (`tls_certs`, the
    /// key matched to its certificate), `tls_client_ca`, `backend_tls_ca`,
    /// and the admin token file. What `rodizio check-config` runs, so that
    /// a file that would stop a start (or a reload) is found before it.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSetting`] naming the setting and the file.
    pub fn check_files(config: &Config) -> Result<()> {
        for service in config.service_list() {
            crate::tls_term::Terminator::load(&service.tls)?;
        }
        if let Some(path) = &config.admin_token_file {
            admin::read_token(path)?;
        }
        Ok(())
    }

    /// Binds every service's listening sockets as `config` asks (address,
    /// backlog, `TCP_DEFER_ACCEPT`): the first half of [`Balancer::bind`],
    /// for a caller that binds before the backends are known (the binary
    /// binds, then asks for the backends, then builds the balancer).
    ///
    /// # Errors
    ///
    /// [`Error::Bind`] when an address cannot be listened on, [`Error::Io`]
    /// when `TCP_DEFER_ACCEPT` cannot be set.
    pub fn listen(config: &Config) -> Result<Listeners> {
        // Before any address is bound: a running rodizio's sockets taken,
        // and every socket opened from now on (reloads too) shared with
        // the next process, so gated.
        let upgrade = config
            .upgrade_socket
            .as_deref()
            .map(crate::upgrade::start)
            .transpose()?;
        if upgrade.is_some() {
            systemd::share_listeners();
        }
        let list = config.service_list();
        // An address shared by SNI is bound once, by the first service.
        let sockets: Vec<Vec<TcpListener>> = (0..list.len())
            .map(|i| {
                listener::open_except(list[i], &crate::config::sni_check::bound_before(&list, i))
            })
            .collect::<Result<_>>()?;
        if upgrade.is_some() {
            for addr in systemd::drop_unadopted() {
                log::info!(
                    "{addr}, handed over by the previous rodizio, is not listened on here: closed"
                );
            }
        }
        Ok(Listeners { sockets, upgrade })
    }

    /// The second half of [`Balancer::bind`]: validates `config`, resolves
    /// its backends, and builds the balancer on `listeners` (from
    /// [`Balancer::listen`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSetting`] or [`Error::InvalidBackend`] for bad
    /// settings, [`Error::Io`] when a listening address cannot be read.
    pub fn with_listener(config: Config, listeners: Listeners) -> Result<Balancer> {
        config.validate()?;
        pool::check_stack(&config)?;
        crate::kernel_sched::apply(config.sched_policy)
            .map_err(|e| Error::io("setting the scheduling policy", e))?;
        let admin = AdminListener::bind(&config)?;
        if config.trace {
            crate::trace::enable(config.trace_lang);
        }
        // Loads the program now, before the privilege drop and so that the
        // log says at start which path promoted connections take: a
        // warning if a service says `on`, else one info line for `auto`.
        let modes: Vec<_> = config
            .service_list()
            .iter()
            .map(|c| c.proxy.kernel_relay)
            .collect();
        if let Some(mode) = [units::Switch::On, units::Switch::Auto]
            .into_iter()
            .find(|m| modes.contains(m))
        {
            crate::proxy::kernel_relay::prepare(mode);
        }
        let shared = ProcessWide {
            stats: Arc::new(Stats::default()),
            access_log: start_access_log(&config)?,
            workers: config.workers,
            queue_depth: Arc::default(),
            spare: Arc::new(crate::reserve::Reserve::for_workers(config.workers)),
        };
        let services = config
            .service_list()
            .into_iter()
            .map(|c| Service::build(c.clone(), &shared).map(Arc::new))
            .collect::<Result<Vec<_>>>()?;
        let local_addr = listeners.sockets[0][0]
            .local_addr()
            .map_err(|e| Error::io("reading the listening address", e))?;
        // The queue's item names its service: the worker serves it with
        // that service's proxy.
        let pool = Pool::with_config(
            &config,
            Arc::clone(&shared.stats),
            Arc::new(|job: crate::proxy::Job| crate::proxy::run(job)),
        );
        let _ = shared.queue_depth.set(pool.queue_len());
        let access_log = shared.access_log.clone();
        let running = Arc::new(Running::new(shared, Arc::new(pool), &services));
        Ok(Balancer {
            config,
            services,
            listeners: listeners.sockets,
            local_addr,
            running,
            admin,
            reload: None,
            dry_run: None,
            upgrade: listeners.upgrade,
            access_log,
        })
    }

    /// The services running (or to run), for the reload and the admin
    /// API.
    pub fn running(&self) -> Arc<Running> {
        Arc::clone(&self.running)
    }

    /// The access log, when `access_log` is set: the binary reopens it on
    /// SIGUSR1.
    pub fn access_log(&self) -> Option<AccessLog> {
        self.access_log.clone()
    }

    /// Where the admin API listens (with the real port when port 0 was
    /// asked), or `None` when it is off.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().map(AdminListener::local_addr)
    }

    /// The admin API's token (when the API is on), for the reload that
    /// reads `admin_token_file` again.
    pub fn admin_token(&self) -> Option<admin::Token> {
        self.admin.as_ref().map(AdminListener::token)
    }

    /// Gives the admin API's `POST /reload` something to call (without
    /// one, it answers 409: no config file).
    pub fn set_reload(&mut self, hook: ReloadHook) {
        self.reload = Some(hook);
    }

    /// Gives the admin API's `POST /reload?dry_run=1` something to call
    /// (without one, it answers 409 as `POST /reload` does).
    pub fn set_dry_run(&mut self, hook: DryRunHook) {
        self.dry_run = Some(hook);
    }

    /// Every address clients connect to, each service's in turn (with
    /// the real port when the config asked for port 0); empty once
    /// [`Balancer::run`] has started.
    pub fn addresses(&self) -> Vec<SocketAddr> {
        let bound = self.listeners.iter().flatten();
        bound.filter_map(|l| l.local_addr().ok()).collect()
    }

    /// The start-up line: `Load balancer listening on port N (ADDR)`, the
    /// C's words with the first address, then every other address it
    /// listens on (`; also on ADDR, ADDR`).
    pub fn listening_line(&self) -> String {
        let addr = self.local_addr;
        let mut line = format!("Load balancer listening on port {} ({addr})", addr.port());
        let others: Vec<String> = self
            .addresses()
            .iter()
            .filter(|a| **a != addr)
            .map(ToString::to_string)
            .collect();
        if !others.is_empty() {
            line.push_str(&format!("; also on {}", others.join(", ")));
        }
        line
    }

    /// The address clients connect to (with the real port when the config
    /// asked for port 0): the first service's first.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The services at start-up, in the configuration's order.
    pub fn services(&self) -> &[Arc<Service>] {
        &self.services
    }

    /// The live counters of the whole process (every service's added).
    pub fn stats(&self) -> Arc<Stats> {
        Arc::clone(&self.running.shared.stats)
    }

    /// The first service's scheduler, which holds its backend list.
    pub fn scheduler(&self) -> Arc<Scheduler> {
        Arc::clone(&self.services[0].live.scheduler)
    }

    /// The first service's settings read live (see the module docs).
    pub fn live(&self) -> Live {
        self.services[0].live.clone()
    }

    /// The configuration it was built with (a reload changes the live
    /// values, not this).
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Accepts and proxies clients until `shutdown` is triggered, then
    /// drains (see the module docs).
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when the health thread or the admin API cannot be
    /// started; errors after start-up are per connection and logged.
    pub fn run(mut self, shutdown: &Shutdown) -> Result<()> {
        let started = std::time::Instant::now();
        self.running.stop_with(shutdown);
        // systemd hears "ready" once every address listens, and how the
        // first round of checks of each service goes.
        let notice = {
            let running = Arc::clone(&self.running);
            systemd::StartNotice::new(self.services.len(), &self.addresses(), move || {
                running.status()
            })
        };
        if let Err(err) = self.start_services(&notice) {
            shutdown.trigger();
            self.running.take_threads().join();
            return Err(err);
        }
        self.running.resolve_names();
        // The admin API once every service listens: `/services` shows
        // their addresses from its first answer.
        let admin = match self.admin.take() {
            None => None,
            Some(listener) => {
                let parts = admin::Parts {
                    running: Arc::clone(&self.running),
                    config: self.config.clone(),
                    reload: self.reload.take(),
                    dry_run: self.dry_run.take(),
                    stats: self.stats(),
                    queued: self.running.pool.queue_len(),
                };
                match admin::spawn(listener, parts, shutdown) {
                    Ok(admin) => Some(admin),
                    Err(err) => {
                        shutdown.trigger();
                        self.running.take_threads().join();
                        return Err(err);
                    }
                }
            }
        };
        notice.listening();
        if let Some(upgrade) = self.upgrade.take() {
            let running = Arc::clone(&self.running);
            let sockets = Box::new(move || running.listening_sockets());
            let carrier = crate::upgrade::carry::carrier(Arc::clone(&self.running));
            if let Err(err) = upgrade.serve(sockets, &carrier, shutdown) {
                log::warn!("{err}: no upgrade through upgrade_socket");
            }
        }
        // Every accept loop runs on its own thread; this one waits for the
        // shutdown, then for them. The queue closes once they have left,
        // each with the client it may hold handed over, or after a grace
        // (a loop waiting for room in a full queue is released by it).
        let _ = shutdown.receiver().recv();
        systemd::stopping(self.stats().snapshot().active);
        let pool = Arc::clone(&self.running.pool);
        self.running
            .take_threads()
            .join_within(Gate::GRACE, move || pool.close());
        if let Some(admin) = admin {
            // Each handler ends after the request it has.
            admin.join();
        }
        self.drain(started);
        Ok(())
    }

    /// Starts every service's accept loops on its listening sockets.
    fn start_services(&mut self, notice: &Arc<systemd::StartNotice>) -> Result<()> {
        let listeners = std::mem::take(&mut self.listeners);
        let list = self.config.service_list();
        for (i, (service, listeners)) in self.services.iter().zip(listeners).enumerate() {
            let shared = crate::config::sni_check::bound_before(&list, i);
            let listeners = service
                .config
                .listen_addrs()
                .into_iter()
                .filter(|a| !shared.contains(a))
                .zip(listeners)
                .collect();
            let ready = {
                let notice = Arc::clone(notice);
                Box::new(move || notice.round_done())
            };
            self.running.start(Arc::clone(service), listeners, ready)?;
        }
        Ok(())
    }

    /// After the accept loop: closes the listening socket, lets the
    /// workers finish for at most `drain_timeout`, then logs the run's
    /// summary and flushes the access log.
    fn drain(self, started: std::time::Instant) {
        // The listening sockets closed as their loops returned.
        let pool = &self.running.pool;
        let stats = self.stats();
        pool.close();
        let active = stats.snapshot().active;
        if active > 0 || pool.queued() > 0 {
            log::info!(
                "draining {} in flight, {} queued (at most {:?})",
                units::count(active, "connection"),
                pool.queued(),
                self.config.drain_timeout
            );
        }
        let mut left = pool.wait_exit(self.config.drain_timeout);
        if let Some(window) = self.config.drain_spread.filter(|_| left > 0) {
            left = spread(pool, &stats, window, self.config.drain_spread_order);
        }
        if left > 0 {
            let active = stats.snapshot().active;
            Stats::add(&stats.drain_cut, active.max(1));
            log::warn!(
                "drain timeout: {} still open {} cut",
                units::count(active, "connection"),
                if active == 1 { "is" } else { "are" }
            );
        } else {
            log::info!("all connections finished; stopped");
        }
        log::info!("{}", summary(&stats.snapshot(), started.elapsed()));
        if let Some(log) = &self.access_log {
            // Every line written before the process exits.
            log.close();
        }
    }
}

/// How long the workers have to end once the spread closed the last
/// connection.
const AFTER_SPREAD: Duration = Duration::from_secs(2);

/// The drain's spread (`drain_spread`): the connections still open at the
/// drain timeout are closed one after another over `window`, in `order`
/// (each `end=drain_cut`, counted in `drain_cut`), their progress in the
/// log and systemd's `STATUS=`, so that their clients do not all reconnect
/// elsewhere at once. Returns the workers still busy after it.
fn spread(
    pool: &Pool<crate::proxy::Job>,
    stats: &Arc<Stats>,
    window: Duration,
    order: crate::connections::SpreadOrder,
) -> usize {
    use crate::connections::{table, Kill, SpreadOrder};
    let owner = std::sync::Arc::as_ptr(stats) as usize;
    let mut open = table().list();
    open.retain(|v| v.owner == owner);
    match order {
        SpreadOrder::Oldest => open.sort_by_key(|v| std::cmp::Reverse(v.age)),
        SpreadOrder::Idlest => open.sort_by_key(|v| std::cmp::Reverse(v.idle)),
    }
    let n = open.len();
    log::info!(
        "drain timeout: closing {} over {}, {order} first",
        units::count(n as u64, "connection"),
        units::format_duration(window)
    );
    let each = window / u32::try_from(n.max(1)).unwrap_or(u32::MAX);
    let step = (n / 10).max(1);
    let start = std::time::Instant::now();
    for (i, v) in open.iter().enumerate() {
        let due = start + each * u32::try_from(i).unwrap_or(u32::MAX);
        std::thread::sleep(due.saturating_duration_since(std::time::Instant::now()));
        if table().kill(v.id, Kill::Drain) {
            Stats::incr(&stats.drain_cut);
        }
        if (i + 1) % step == 0 || i + 1 == n {
            let progress = format!("drain: {} of {n} connections closed", i + 1);
            systemd::notify(&format!("STATUS={progress}"));
            log::info!("{progress}");
        }
    }
    pool.wait_exit(AFTER_SPREAD)
}

/// The access log's writer, when `access_log` is set.
///
/// # Errors
///
/// [`Error::Io`] when its file cannot be opened.
fn start_access_log(config: &Config) -> Result<Option<AccessLog>> {
    use crate::access_log::{Destination, Options};
    let Some(format) = config.access_log else {
        return Ok(None);
    };
    // Validation saw to it that a file target has its path.
    let target = match (&config.access_log_target, &config.access_log_file) {
        (Some(Destination::Syslog(addr)), _) => Target::Syslog(addr.clone()),
        (Some(Destination::Stdout), _) | (_, None) => Target::Stdout,
        (_, Some(path)) => Target::File(path.clone()),
    };
    let options = Options {
        format,
        template: config.access_log_format.clone(),
        interval: config.access_log_interval,
        at_connect: config.access_log_at_connect,
    };
    AccessLog::open(options, target).map(Some)
}

/// The one line logged at shutdown: what this run did.
fn summary(s: &crate::stats::StatsSnapshot, uptime: Duration) -> String {
    let refused = s.rate_limited + s.no_backend + s.queue_timeouts + s.first_byte_timeouts;
    format!(
        "summary: up {}, {} accepted, {} served, {} refused \
         ({} rate limited, {} no backend, {} queue timeout, {} first-byte timeout), \
         {} ended on an error or a timeout, {} to backends, {} to clients",
        units::format_duration(Duration::from_secs(uptime.as_secs())),
        units::count(s.accepted, "connection"),
        s.completed,
        refused,
        s.rate_limited,
        s.no_backend,
        s.queue_timeouts,
        s.first_byte_timeouts,
        s.errors,
        units::count(s.bytes_to_backends, "byte"),
        units::count(s.bytes_to_clients, "byte")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One of a thing is singular in the summary, others plural.
    #[test]
    fn the_summary_counts_in_words() {
        let mut s = crate::stats::StatsSnapshot {
            accepted: 1,
            completed: 1,
            bytes_to_backends: 1,
            bytes_to_clients: 612,
            ..Default::default()
        };
        let line = summary(&s, Duration::from_secs(61));
        assert!(
            line.starts_with("summary: up 61s, 1 connection accepted, 1 served, 0 refused"),
            "{line}"
        );
        assert!(
            line.ends_with("1 byte to backends, 612 bytes to clients"),
            "{line}"
        );
        s.accepted = 4;
        let line = summary(&s, Duration::ZERO);
        assert!(line.contains(", 4 connections accepted,"), "{line}");
    }
}
