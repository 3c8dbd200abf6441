//! The balancer assembled: listener, scheduler, pool and proxy wired together.
//!
//! [`Balancer::bind`] does everything that can fail at start-up (validate the
//! config, resolve the backends, bind the port) so errors surface before any
//! client is accepted, and so a test can learn the port it got from
//! `127.0.0.1:0` before traffic starts. [`Balancer::run`] then accepts until
//! the [`Shutdown`] is triggered and drains.
//!
//! # Draining
//!
//! On shutdown the accept loop returns and the listening socket is closed at
//! once (new clients are refused by the kernel). The queue is closed: what it
//! holds is still served, then each worker exits. `run` waits for the workers
//! at most `drain_timeout`; connections still open then are cut when the
//! process exits.
//!
//! # Corresponds to the C article
//!
//! `main()`: `queue_init()`, `servers_entry()` (done by the caller here),
//! `create_balancer_socket()`, the thread attributes, and the accept loop.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

use crate::backend::Backend;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::listener::{self, Acceptor};
use crate::pool::Pool;
use crate::proxy::{Job, Proxy};
use crate::scheduler::Scheduler;
use crate::shutdown::Shutdown;
use crate::stats::Stats;

/// A bound, ready-to-run balancer.
pub struct Balancer {
    config: Config,
    listener: TcpListener,
    local_addr: SocketAddr,
    scheduler: Arc<Scheduler>,
    stats: Arc<Stats>,
    pool: Pool<Job>,
}

impl Balancer {
    /// Validates `config`, resolves its backends and binds the listener.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] or [`Error::InvalidBackend`] for bad
    /// settings, [`Error::Bind`] when the address cannot be listened on.
    pub fn bind(config: Config) -> Result<Balancer> {
        config.validate()?;
        let backends = config
            .backends
            .iter()
            .map(|spec| Backend::from_spec(spec).map(Arc::new))
            .collect::<Result<Vec<_>>>()?;
        let scheduler = Arc::new(Scheduler::new(backends));
        let stats = Arc::new(Stats::default());
        let listener = listener::bind(config.listen, config.backlog)?;
        let local_addr = listener
            .local_addr()
            .map_err(|e| Error::io("reading the listening address", e))?;
        let proxy = Arc::new(Proxy {
            scheduler: Arc::clone(&scheduler),
            stats: Arc::clone(&stats),
            buffer_size: config.buffer_size,
            connect_timeout: config.connect_timeout,
            idle_timeout: config.idle_timeout,
            splice: config.pump.splice,
        });
        let pool = Pool::new(
            config.workers,
            config.thread_stack,
            config.queue_capacity,
            Arc::new(move |job: Job| proxy.handle(job)),
        );
        Ok(Balancer {
            config,
            listener,
            local_addr,
            scheduler,
            stats,
            pool,
        })
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
        Arc::clone(&self.scheduler)
    }

    /// Accepts and proxies clients until `shutdown` is triggered, then
    /// drains (see the module docs).
    ///
    /// # Errors
    ///
    /// None today: errors after start-up are per connection and logged.
    pub fn run(self, shutdown: &Shutdown) -> Result<()> {
        shutdown.wake_on_trigger(self.local_addr);
        Acceptor {
            scheduler: &self.scheduler,
            pool: &self.pool,
            stats: &self.stats,
            shutdown,
        }
        .run(&self.listener);
        drop(self.listener);
        self.pool.close();
        let active = self.stats.snapshot().active;
        if active > 0 || self.pool.queued() > 0 {
            log::info!(
                "draining {active} connection(s) in flight, {} queued (at most {:?})",
                self.pool.queued(),
                self.config.drain_timeout
            );
        }
        let left = self.pool.wait_exit(self.config.drain_timeout);
        if left > 0 {
            log::warn!(
                "drain timeout: {} connection(s) still open are cut",
                self.stats.snapshot().active
            );
        } else {
            log::info!("all connections finished; stopped");
        }
        Ok(())
    }
}

/// Binds and runs a balancer: [`Balancer::bind`] then [`Balancer::run`].
///
/// # Errors
///
/// The start-up errors of [`Balancer::bind`].
pub fn run(config: Config, shutdown: &Shutdown) -> Result<()> {
    Balancer::bind(config)?.run(shutdown)
}
