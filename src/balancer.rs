//! The balancer assembled: listener, scheduler, pool, proxy, the health
//! checker and the rate limiter wired together.
//!
//! [`Balancer::bind`] does everything that can fail at start-up (validate the
//! config, resolve the backends, bind the port) so errors surface before any
//! client is accepted, and so a test can learn the port it got from
//! `127.0.0.1:0` before traffic starts. [`Balancer::run`] then accepts until
//! the [`Shutdown`] is triggered and drains.
//!
//! # Threads
//!
//! `run` turns the calling thread into the accept loop. Besides the workers
//! (spawned by the pool as clients come), it starts the health thread (when
//! checks are on, see [`crate::health`]), and registers two wake-ups with
//! the [`Shutdown`]: a connection to the listening address (for a blocking
//! `accept`) and the queue's close (for a push waiting in a full queue),
//! both run by whichever thread pulls the trigger. They share the
//! scheduler, the stats and the pool through `Arc`s and references; the
//! `Balancer` itself holds no lock.
//!
//! # Live settings
//!
//! What may change while the balancer runs is shared as live values
//! (`arc_swap::ArcSwap`, one atomic load to read): the proxy's settings
//! ([`crate::proxy::ProxyConfig`]) read once per connection, the health
//! settings read by the checker at each round and by the workers once per
//! connection, the limiter read by the accept loop once per client, and the
//! algorithm and backend list held by the [`Scheduler`]. [`Balancer::live`]
//! hands them out, so a reload can change them without restarting a
//! thread; a connection keeps the settings it started with.
//!
//! # Draining
//!
//! On shutdown the queue is closed at once (what it holds is still served,
//! then each worker exits), the accept loop returns, the health thread is
//! joined and the listening socket is closed (new clients are refused by the
//! kernel). `run` waits for the workers at most `drain_timeout`; connections
//! still open then are cut when the process exits.
//!
//! # Corresponds to the C article
//!
//! `main()`: `queue_init()`, `servers_entry()` (done by the caller here),
//! `create_balancer_socket()`, the thread attributes, and the accept loop.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

use arc_swap::{ArcSwap, ArcSwapOption};

use crate::backend::Backend;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::health::HealthConfig;
use crate::limiter::Limiter;
use crate::listener::{self, Acceptor};
use crate::pool::Pool;
use crate::proxy::{Job, Proxy, ProxyConfig};
use crate::scheduler::Scheduler;
use crate::shutdown::Shutdown;
use crate::stats::Stats;

/// The settings a running balancer reads live, and the scheduler: what a
/// reload changes. Cheap to clone (reference counts).
#[derive(Debug, Clone)]
pub struct Live {
    /// The backend list and the algorithm.
    pub scheduler: Arc<Scheduler>,
    /// Chunk size, timeouts, splice: read once per connection.
    pub proxy: Arc<ArcSwap<ProxyConfig>>,
    /// Health settings: read by the checker each round and by the workers
    /// once per connection.
    pub health: Arc<ArcSwap<HealthConfig>>,
    /// The rate limiter, or none: read by the accept loop once per client.
    pub limiter: Arc<ArcSwapOption<Limiter>>,
}

/// A bound, ready-to-run balancer.
pub struct Balancer {
    config: Config,
    listener: TcpListener,
    local_addr: SocketAddr,
    live: Live,
    stats: Arc<Stats>,
    pool: Pool<Job>,
}

impl Balancer {
    /// Validates `config`, resolves its backends and binds the listener.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSetting`] or [`Error::InvalidBackend`] for bad
    /// settings, [`Error::Bind`] when the address cannot be listened on.
    pub fn bind(config: Config) -> Result<Balancer> {
        config.validate()?;
        let backends = config
            .backends
            .iter()
            .map(|spec| Backend::from_spec(spec).map(Arc::new))
            .collect::<Result<Vec<_>>>()?;
        let scheduler = Arc::new(Scheduler::with_algorithm(backends, config.algorithm));
        let stats = Arc::new(Stats::default());
        let listener = listener::bind(config.listen, config.backlog)?;
        if config.defer_accept {
            listener::defer_accept(&listener)
                .map_err(|e| Error::io("setting TCP_DEFER_ACCEPT (--defer-accept)", e))?;
        }
        let local_addr = listener
            .local_addr()
            .map_err(|e| Error::io("reading the listening address", e))?;
        let limiter = config
            .rate_limit
            .as_ref()
            .map(|c| Arc::new(Limiter::new(c)));
        if let Some(l) = &limiter {
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
        let live = Live {
            scheduler,
            proxy: Arc::new(ArcSwap::from_pointee(config.proxy.clone())),
            health: Arc::new(ArcSwap::from_pointee(config.health.clone())),
            limiter: Arc::new(ArcSwapOption::new(limiter)),
        };
        let proxy = Arc::new(Proxy {
            scheduler: Arc::clone(&live.scheduler),
            stats: Arc::clone(&stats),
            settings: Arc::clone(&live.proxy),
            health: Arc::clone(&live.health),
        });
        let pool = Pool::new(
            config.workers,
            config.thread_stack,
            config.queue_capacity,
            Arc::clone(&stats),
            Arc::new(move |job: Job| proxy.handle(job)),
        );
        Ok(Balancer {
            config,
            listener,
            local_addr,
            live,
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
        Arc::clone(&self.live.scheduler)
    }

    /// The settings read live (see the module docs).
    pub fn live(&self) -> Live {
        self.live.clone()
    }

    /// Accepts and proxies clients until `shutdown` is triggered, then
    /// drains (see the module docs).
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when the health thread cannot be started; errors after
    /// start-up are per connection and logged.
    pub fn run(self, shutdown: &Shutdown) -> Result<()> {
        shutdown.wake_on_trigger(self.local_addr);
        // The accept loop may instead be waiting for room in a full queue,
        // where no connection reaches it: closing the queue on trigger makes
        // that push fail, and the loop returns (the client it held is
        // closed, unserved; those already queued are still served).
        shutdown.on_trigger(self.pool.closer());
        let health = crate::health::spawn(
            Arc::clone(&self.live.scheduler),
            Arc::clone(&self.live.health),
            shutdown.clone(),
        )?;
        let acceptor = Acceptor {
            scheduler: &self.live.scheduler,
            pool: &self.pool,
            stats: &self.stats,
            shutdown,
            limiter: &self.live.limiter,
            health: &self.live.health,
        };
        acceptor.run(&self.listener);
        if let Some(health) = health {
            // Wakes at once on the trigger (at most one check timeout).
            let _ = health.join();
        }
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
