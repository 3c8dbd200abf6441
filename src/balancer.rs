//! The balancer assembled: listener, scheduler, pool, proxy, the health
//! checker, the rate limiter and the admin API wired together.
//!
//! [`Balancer::bind`] does everything that can fail at start-up (validate,
//! try the workers' stack size, resolve the backends, bind the port), so
//! errors come before any client and a test learns its port first;
//! [`Balancer::run`] accepts until the [`Shutdown`] is triggered, then
//! drains. What may change while it runs is shared as [`Live`] values
//! (`ArcSwap`, one atomic load to read). The live settings and the drain in
//! detail: docs/internals.md, "The balancer".
//!
//! # Threads
//!
//! `run` turns the calling thread into the accept loop and starts the health
//! thread and the admin API's (systemd, when it listens, hears "ready" after
//! the first round of checks and "stopping" when the drain starts); the pool spawns the workers as clients come.
//! The [`Shutdown`] wakes a blocked `accept` (a connection to itself, or with
//! `SO_REUSEPORT` a shutdown of the socket) and a push waiting in a full queue.
//! The parts are shared through `Arc`s; the `Balancer` itself holds no lock.
//!
//! # Corresponds to the C article
//!
//! `main()`: `queue_init()`, `create_balancer_socket()`, the thread
//! attributes, and the accept loop (`servers_entry()` is the caller's).

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};

use crate::access_log::{AccessLog, Target};
use crate::admin::{self, AdminListener, ReloadHook};
use crate::backend::Backend;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::limiter::Limiter;
use crate::listener::{self, Acceptor};
use crate::pool::{self, Pool};
use crate::proxy::{Job, Proxy, Report};
use crate::scheduler::Scheduler;
use crate::shutdown::Shutdown;
use crate::stats::Stats;
use crate::systemd::{self, Gate};
use crate::units;

pub use crate::live::Live;

/// A bound, ready-to-run balancer.
pub struct Balancer {
    config: Config,
    listener: TcpListener,
    local_addr: SocketAddr,
    live: Live,
    stats: Arc<Stats>,
    pool: Pool<Job>,
    /// The admin API's socket, when `admin_listen` is set.
    admin: Option<AdminListener>,
    /// What the admin API's `POST /reload` calls.
    reload: Option<ReloadHook>,
    /// The access log's writer, when `access_log` is set.
    access_log: Option<AccessLog>,
}

impl Balancer {
    /// Validates `config`, resolves its backends and binds the listener.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSetting`] or [`Error::InvalidBackend`] for bad
    /// settings (the admin token file included), [`Error::Bind`] when the
    /// address (or the admin address) cannot be listened on.
    pub fn bind(config: Config) -> Result<Balancer> {
        config.validate()?;
        let listener = Balancer::listen(&config)?;
        Balancer::with_listener(config, listener)
    }

    /// Binds the listening socket as `config` asks (address, backlog,
    /// `TCP_DEFER_ACCEPT`): the first half of [`Balancer::bind`], for a
    /// caller that binds before the backends are known (the binary binds,
    /// then asks for the backends, then builds the balancer).
    ///
    /// # Errors
    ///
    /// [`Error::Bind`] when the address cannot be listened on, [`Error::Io`]
    /// when `TCP_DEFER_ACCEPT` cannot be set.
    pub fn listen(config: &Config) -> Result<TcpListener> {
        listener::open(config)
    }

    /// The second half of [`Balancer::bind`]: validates `config`, resolves
    /// its backends, and builds the balancer on `listener` (from
    /// [`Balancer::listen`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSetting`] or [`Error::InvalidBackend`] for bad
    /// settings, [`Error::Io`] when the listening address cannot be read.
    pub fn with_listener(config: Config, listener: TcpListener) -> Result<Balancer> {
        config.validate()?;
        pool::check_stack(&config)?;
        let backends = resolve_backends(&config)?;
        let scheduler = Arc::new(Scheduler::with_algorithm(backends, config.algorithm));
        let stats = Arc::new(Stats::default());
        let local_addr = listener
            .local_addr()
            .map_err(|e| Error::io("reading the listening address", e))?;
        let admin = AdminListener::bind(&config)?;
        let limiter = start_limiter(&config, &stats)?;
        if config.trace {
            crate::trace::enable(config.trace_lang);
        }
        let live = Live {
            scheduler,
            proxy: Arc::new(ArcSwap::from_pointee(config.proxy.clone())),
            health: Arc::new(ArcSwap::from_pointee(config.health.clone())),
            limiter: Arc::new(ArcSwapOption::new(limiter)),
        };
        let access_log = start_access_log(&config)?;
        let queue_depth: Arc<std::sync::OnceLock<crate::proxy::QueueDepth>> = Arc::default();
        let accept_proxy = config.header_acceptor();
        let proxy = Arc::new(
            Proxy::new(
                Arc::clone(&live.scheduler),
                Arc::clone(&live.proxy),
                Arc::clone(&live.health),
                Arc::clone(&live.limiter),
                Arc::clone(&stats),
                access_log.clone(),
                accept_proxy,
            )
            .busy_warning(config.workers, Arc::clone(&queue_depth)),
        );
        let pool = Pool::with_config(
            &config,
            Arc::clone(&stats),
            Arc::new(move |job: Job| proxy.handle(job)),
        );
        let _ = queue_depth.set(pool.queue_len());
        Ok(Balancer {
            config,
            listener,
            local_addr,
            live,
            stats,
            pool,
            admin,
            reload: None,
            access_log,
        })
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

    /// Gives the admin API's `POST /reload` something to call (without
    /// one, it answers 409: no config file).
    pub fn set_reload(&mut self, hook: ReloadHook) {
        self.reload = Some(hook);
    }

    /// The address clients connect to (with the real port when the config
    /// asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The live counters.
    pub fn stats(&self) -> Arc<Stats> {
        Arc::clone(&self.stats)
    }

    /// The scheduler, which holds the backend list.
    pub fn scheduler(&self) -> Arc<Scheduler> {
        Arc::clone(&self.live.scheduler)
    }

    /// The settings read live (see the module docs).
    pub fn live(&self) -> Live {
        self.live.clone()
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
        self.wake_on(shutdown)?;
        let admin = match self.admin.take() {
            None => None,
            Some(listener) => {
                let parts = admin::Parts {
                    live: self.live.clone(),
                    config: self.config.clone(),
                    reload: self.reload.take(),
                    stats: Arc::clone(&self.stats),
                    queued: self.pool.queue_len(),
                };
                Some(admin::spawn(listener, parts, shutdown)?)
            }
        };
        // systemd hears "ready" once the backends' states are known.
        let (stats, scheduler) = (Arc::clone(&self.stats), Arc::clone(&self.live.scheduler));
        let ready = move || systemd::ready(&systemd::status(&stats, &scheduler.snapshot()));
        let health = crate::health::spawn(
            Arc::clone(&self.live.scheduler),
            Arc::clone(&self.live.health),
            Arc::clone(&self.stats),
            shutdown.clone(),
            Box::new(ready),
        )?;
        let acceptor = Acceptor {
            scheduler: &self.live.scheduler,
            pool: &self.pool,
            stats: &self.stats,
            shutdown,
            limiter: &self.live.limiter,
            health: &self.live.health,
            accept_proxy: self.config.accept_proxy,
            report: Report::new(Arc::clone(&self.stats), self.access_log.clone()),
        };
        acceptor.run(&self.listener);
        if let Some(gate) = Gate::of(&self.listener) {
            gate.left();
        }
        systemd::stopping(self.stats.snapshot().active);
        if let Some(health) = health {
            // Wakes at once on the trigger (at most one check timeout).
            let _ = health.join();
        }
        if let Some(admin) = admin {
            // Each handler ends after the request it has.
            admin.join();
        }
        self.drain(started);
        Ok(())
    }

    /// Makes the shutdown's trigger wake the accept loop wherever it waits:
    /// in `accept` (a connection to the listening address, or with
    /// `SO_REUSEPORT` a shutdown of the socket) or for room in a full queue.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when the listening socket cannot be duplicated.
    fn wake_on(&self, shutdown: &Shutdown) -> Result<()> {
        if let Some(gate) = Gate::of(&self.listener) {
            // A socket shared with systemd: no wake-up connection, and the
            // queue closed only once the loop has handed over the client
            // it may hold (see Gate::stop).
            let close = self.pool.closer();
            shutdown.on_trigger(move || gate.stop(close));
            return Ok(());
        }
        listener::wake_on(&self.listener, self.local_addr, &self.config, shutdown)?;
        // The accept loop may instead be waiting for room in a full queue,
        // where no connection reaches it: closing the queue on trigger makes
        // that push fail, and the loop returns (the client it held is
        // closed, unserved; those already queued are still served).
        shutdown.on_trigger(self.pool.closer());
        Ok(())
    }

    /// After the accept loop: closes the listening socket, lets the
    /// workers finish for at most `drain_timeout`, then logs the run's
    /// summary and flushes the access log.
    fn drain(self, started: std::time::Instant) {
        drop(self.listener);
        self.pool.close();
        let active = self.stats.snapshot().active;
        if active > 0 || self.pool.queued() > 0 {
            log::info!(
                "draining {} in flight, {} queued (at most {:?})",
                units::count(active, "connection"),
                self.pool.queued(),
                self.config.drain_timeout
            );
        }
        let left = self.pool.wait_exit(self.config.drain_timeout);
        if left > 0 {
            let active = self.stats.snapshot().active;
            Stats::add(&self.stats.drain_cut, active.max(1));
            log::warn!(
                "drain timeout: {} still open {} cut",
                units::count(active, "connection"),
                if active == 1 { "is" } else { "are" }
            );
        } else {
            log::info!("all connections finished; stopped");
        }
        log::info!("{}", summary(&self.stats.snapshot(), started.elapsed()));
        if let Some(log) = &self.access_log {
            // Every line written before the process exits.
            log.close();
        }
    }
}

/// The backends of `config`, resolved, each with its PROXY protocol
/// setting.
///
/// # Errors
///
/// [`Error::InvalidBackend`] for one that cannot be resolved.
fn resolve_backends(config: &Config) -> Result<Vec<Arc<Backend>>> {
    config
        .backends
        .iter()
        .map(|spec| {
            let send_proxy = spec.send_proxy.or(config.send_proxy);
            Backend::from_spec(spec).map(|b| Arc::new(b.with_send_proxy(send_proxy)))
        })
        .collect()
}

/// The rate limiter `config` asks for, if any, logged as one line.
///
/// # Errors
///
/// The limiter's (its shared store cannot be set up).
fn start_limiter(config: &Config, stats: &Arc<Stats>) -> Result<Option<Arc<Limiter>>> {
    let limiter = config
        .rate_limit
        .as_ref()
        .map(|c| Limiter::with_store(c, &config.rate_limit_store, Arc::clone(stats)))
        .transpose()?
        .map(Arc::new);
    if let (Some(l), Some(url)) = (&limiter, &config.rate_limit_store.url) {
        let c = l.config();
        let store = &config.rate_limit_store;
        log::info!(
            "rate limit: {} per client IP ({}, IPv6 per /{}), shared in {url} \
             (timeout {:?}, on failure {})",
            c.rate,
            c.algorithm,
            c.ipv6_prefix,
            store.timeout,
            store.failure.name()
        );
    } else if let Some(l) = &limiter {
        let c = l.config();
        log::info!(
            "rate limit: {} per client IP ({}, IPv6 per /{}), up to {} clients ({} KiB)",
            c.rate,
            c.algorithm,
            c.ipv6_prefix,
            l.capacity(),
            l.memory_bytes() / 1024
        );
    }
    Ok(limiter)
}

/// The access log's writer, when `access_log` is set.
///
/// # Errors
///
/// [`Error::Io`] when its file cannot be opened.
fn start_access_log(config: &Config) -> Result<Option<AccessLog>> {
    Ok(match config.access_log {
        None => None,
        Some(format) => {
            let target = match &config.access_log_file {
                Some(path) => Target::File(path.clone()),
                None => Target::Stdout,
            };
            Some(AccessLog::start(format, target)?)
        }
    })
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
