//! One service at run time: its listening sockets, its backends and live
//! settings, its counters (a child of the process's, see
//! [`Stats::child`]), its rate limiter and its `max_connections`.
//!
//! Every service shares the one pool of workers and its FIFO: the queue's
//! item, a [`Job`], names its service (the [`Proxy`] that serves it) as
//! well as its backend. [`crate::Balancer`] builds one [`Service`] per
//! entry of `services` (or one, `default`, from a flat configuration).
//!
//! # Threads
//!
//! Built on the main thread (or the reloading one). Each listening address
//! gets an accept loop (`Acceptor`, in `listener.rs`) on a thread of its
//! own, and each service its health thread when checks are on: both
//! started by [`crate::running`].
//!
//! # Corresponds to the C article
//!
//! `create_balancer_socket()` and the setup of `main()`, once per service.

use std::net::TcpListener;
use std::sync::{Arc, OnceLock};

use arc_swap::{ArcSwap, ArcSwapOption};

use crate::access_log::AccessLog;
use crate::backend::Backend;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::limiter::Limiter;
use crate::listener::{self, Acceptor};
use crate::live::Live;
use crate::pool::Pool;
use crate::proxy::{Job, Proxy, QueueDepth, Report};
use crate::scheduler::Scheduler;
use crate::shutdown::Shutdown;
use crate::slots::Slots;
use crate::srv_follow;
use crate::stats::Stats;

/// What every service shares.
pub(crate) struct ProcessWide {
    /// The process's counters: each service's are a child of these.
    pub stats: Arc<Stats>,
    /// The access log, when on.
    pub access_log: Option<AccessLog>,
    /// The most workers, for the busy warning.
    pub workers: usize,
    /// The queue's length, once the pool exists.
    pub queue_depth: Arc<OnceLock<QueueDepth>>,
    /// The descriptors kept for the workers' backend sockets.
    pub spare: Arc<crate::reserve::Reserve>,
}

/// Sets what `config` asks of the scheduler besides its list and its
/// algorithm (the slow start), at start-up and at each reload.
pub(crate) fn tune_scheduler(scheduler: &Scheduler, config: &Config) {
    scheduler.set_ramp(config.slow_start);
}

/// The other way: writes into `config` what [`tune_scheduler`] set, as
/// `scheduler` has it now (for the admin API's `/config`).
pub(crate) fn tuned(scheduler: &Scheduler, config: &mut Config) {
    config.slow_start = scheduler.ramp();
}

/// One service, built and bound.
pub struct Service {
    /// Its settings, as started (a reload changes the live values).
    pub config: Config,
    /// Its backends and live settings.
    pub live: Live,
    /// Its own counters.
    pub stats: Arc<Stats>,
    /// What the workers run for its clients.
    pub proxy: Arc<Proxy>,
    /// Its `max_connections`, when set.
    pub slots: Option<Arc<Slots>>,
}

impl Service {
    /// Builds the service `config` describes (its listening sockets are
    /// bound apart, by [`listener::open`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidBackend`] for a backend that does not resolve, the
    /// limiter's errors.
    pub(crate) fn build(config: Config, shared: &ProcessWide) -> Result<Service> {
        let backends = resolve_backends(&config)?;
        let scheduler = Arc::new(Scheduler::with_algorithm(backends, config.algorithm));
        tune_scheduler(&scheduler, &config);
        let stats = shared.stats.child();
        let limiter = start_limiter(&config, &stats)?;
        let live = Live {
            scheduler,
            proxy: Arc::new(ArcSwap::from_pointee(config.proxy.clone())),
            health: Arc::new(ArcSwap::from_pointee(config.health.clone())),
            limiter: Arc::new(ArcSwapOption::new(limiter)),
            tls: crate::tls_term::Terminator::load(&config.tls)?
                .map(|t| Arc::new(ArcSwap::from_pointee(t))),
        };
        let proxy = Proxy::new(
            Arc::clone(&live.scheduler),
            Arc::clone(&live.proxy),
            Arc::clone(&live.health),
            Arc::clone(&live.limiter),
            Arc::clone(&stats),
            shared.access_log.clone(),
            config.header_acceptor(),
        )
        .busy_warning(shared.workers, Arc::clone(&shared.queue_depth))
        .process_wide(Arc::clone(&shared.stats), Arc::clone(&shared.spare))
        .named(&config.name)
        .terminating(live.tls.clone());
        Ok(Service {
            slots: config.max_connections.map(Slots::new),
            config,
            live,
            stats,
            proxy: Arc::new(proxy),
        })
    }

    /// The service's name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// An accept loop for this service's `listener`, stopping on `stop`.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when the socket cannot be duplicated (to wake it).
    pub(crate) fn acceptor(
        &self,
        listener: &TcpListener,
        pool: &Arc<Pool<Job>>,
        stop: &Shutdown,
        access_log: Option<AccessLog>,
    ) -> Result<Acceptor> {
        let addr = listener
            .local_addr()
            .map_err(|e| Error::io("reading the listening address", e))?;
        listener::wake_on(listener, addr, &self.config, stop)?;
        Ok(Acceptor {
            serves_late: crate::systemd::Gate::of(listener).is_some()
                || listener::shares_port(&self.config),
            proxy: Arc::clone(&self.proxy),
            pool: Arc::clone(pool),
            shutdown: stop.clone(),
            slots: self.slots.clone(),
            report: Report::new(Arc::clone(&self.stats), access_log).for_service(self.name()),
            sni: None,
        })
    }
}

/// The backends of `config`, resolved, each with its PROXY protocol
/// setting.
///
/// # Errors
///
/// [`Error::InvalidBackend`] for one that cannot be resolved.
fn resolve_backends(config: &Config) -> Result<Vec<Arc<Backend>>> {
    let mut list = Vec::new();
    for spec in config.backends.iter().filter(|s| !s.is_srv()) {
        let send_proxy = spec.send_proxy.or(config.send_proxy);
        list.push(Arc::new(
            Backend::from_spec(spec)?.with_send_proxy(send_proxy),
        ));
    }
    // One backend per record of each `srv:` name, looked up once here
    // (a name that gives none fails the start, as a host name does).
    let servers = srv_follow::servers(config.proxy.resolvers.as_ref());
    for entry in srv_entries(config) {
        let found = srv_follow::backends(&entry, &servers)
            .map_err(|e| Error::InvalidBackend(format!("{}: {e}", entry.spec.host)))?;
        list.extend(found);
    }
    Ok(list)
}

/// The `srv:` entries of `config`'s backends, each with the service's
/// `send_proxy`.
pub(crate) fn srv_entries(config: &Config) -> Vec<srv_follow::Entry> {
    let entries = config.backends.iter().filter(|s| s.is_srv());
    entries
        .map(|spec| srv_follow::Entry {
            spec: spec.clone(),
            send_proxy: config.send_proxy,
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
    let Some(l) = &limiter else {
        return Ok(None);
    };
    let c = l.config();
    let whose = if config.name == crate::config::DEFAULT_SERVICE {
        String::new()
    } else {
        format!(" (service {})", config.name)
    };
    if let Some(url) = &config.rate_limit_store.url {
        let store = &config.rate_limit_store;
        log::info!(
            "rate limit{whose}: {} per client IP ({}, IPv6 per /{}), shared in {url} \
             (timeout {:?}, on failure {})",
            c.rate,
            c.algorithm,
            c.ipv6_prefix,
            store.timeout,
            store.failure.name()
        );
    } else {
        log::info!(
            "rate limit{whose}: {} per client IP ({}, IPv6 per /{}), up to {} clients ({} KiB)",
            c.rate,
            c.algorithm,
            c.ipv6_prefix,
            l.capacity(),
            l.memory_bytes() / 1024
        );
    }
    Ok(limiter)
}
