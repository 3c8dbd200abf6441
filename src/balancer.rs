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
//! both run by whichever thread pulls the trigger. They share the scheduler, the stats and the pool through
//! `Arc`s and references; the `Balancer` itself holds no lock.
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

use crate::backend::Backend;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::limiter::Limiter;
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
    limiter: Option<Limiter>,
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
        let scheduler = Arc::new(Scheduler::with_algorithm(
            backends,
            config.scheduling.algorithm,
        ));
        let stats = Arc::new(Stats::default());
        let listener = listener::bind(config.listen, config.backlog)?;
        if config.accept.defer_accept {
            listener::defer_accept(&listener)
                .map_err(|e| Error::io("setting TCP_DEFER_ACCEPT (--defer-accept)", e))?;
        }
        let local_addr = listener
            .local_addr()
            .map_err(|e| Error::io("reading the listening address", e))?;
        let proxy = Arc::new(Proxy {
            scheduler: Arc::clone(&scheduler),
            stats: Arc::clone(&stats),
            buffer_size: config.buffer_size,
            connect_timeout: config.connect_timeout,
            idle_timeout: config.idle_timeout,
            health: config.health.clone(),
            splice: config.pump.splice,
            yield_before_poll: config.pump.yield_before_poll,
        });
        let pool = Pool::new(
            config.workers,
            config.thread_stack,
            config.queue_capacity,
            Arc::new(move |job: Job| proxy.handle(job)),
        );
        let limiter = config.rate_limit.as_ref().map(Limiter::new);
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
        Ok(Balancer {
            config,
            listener,
            local_addr,
            scheduler,
            stats,
            pool,
            limiter,
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
            Arc::clone(&self.scheduler),
            self.config.health.clone(),
            shutdown.clone(),
        )?;
        let acceptor = Acceptor {
            scheduler: &self.scheduler,
            pool: &self.pool,
            stats: &self.stats,
            shutdown,
            limiter: self.limiter.as_ref(),
            http_replies: self.config.health.http_replies,
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

/// Binds and runs a balancer: [`Balancer::bind`] then [`Balancer::run`].
///
/// # Errors
///
/// The start-up errors of [`Balancer::bind`].
pub fn run(config: Config, shutdown: &Shutdown) -> Result<()> {
    Balancer::bind(config)?.run(shutdown)
}
