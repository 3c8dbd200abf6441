//! The services running now, with their threads: started at start-up and
//! by a reload, stopped by a reload or at shutdown. The admin API and the
//! reload read and change the list here.
//!
//! # Threads
//!
//! Each listening address has its accept loop on a thread of its own
//! (`rodizio-accept`), stopped by its own [`Shutdown`], a child of the
//! process's; each service has its health thread when checks are on.
//! The list is behind a mutex, held to read or change it, never while a
//! thread is joined.
//!
//! # Corresponds to the C article
//!
//! The C's `main()` runs its one accept loop on the main thread; here
//! there is one loop per listening address, each blocking in `accept(2)`
//! as the C's does.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::pool::Pool;
use crate::proxy::Job;
use crate::resolver::{Resolver, Watched};
use crate::service::{ProcessWide, Service};
use crate::shutdown::Shutdown;

/// Listening sockets, each with its address as configured (port 0 stays
/// 0).
pub(crate) type Bound = Vec<(SocketAddr, TcpListener)>;

/// The running services and what they share.
pub struct Running {
    pub(crate) shared: ProcessWide,
    pub(crate) pool: Arc<Pool<Job>>,
    /// Stops everything here: every stop below is its child. Triggered
    /// by the process's shutdown (see [`Running::stop_with`]).
    shutdown: Shutdown,
    services: Mutex<Vec<Entry>>,
    /// The thread that looks the backends' names up again
    /// (`resolve_interval`), once a service asks for it.
    resolver: Resolver,
    /// The services whose `backends_from` a `rodizio-etcd` thread
    /// follows, by name, with the thread.
    etcd: Mutex<Vec<(String, std::thread::JoinHandle<()>)>>,
    /// The addresses shared by SNI, with their routers (fixed at
    /// start-up).
    sni: Vec<crate::sni_router::Routed>,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("services", &self.services.lock().len())
            .finish_non_exhaustive()
    }
}

/// One running service.
struct Entry {
    service: Arc<Service>,
    loops: Vec<Loop>,
    /// Its health thread and what stops it.
    health: Option<(Shutdown, JoinHandle<()>)>,
}

/// One accept loop.
struct Loop {
    /// The address as configured (port 0 stays 0).
    configured: SocketAddr,
    /// The address bound (its real port).
    addr: SocketAddr,
    /// The listening socket, a second descriptor of the loop's: a reload
    /// that renames the service hands it to the new one (see
    /// [`Running::socket_of`]), since binding the address again would fail
    /// while this one holds it.
    socket: TcpListener,
    stop: Shutdown,
    thread: JoinHandle<()>,
}

/// Threads to join once they were told to stop.
#[must_use = "join the threads, outside any lock"]
pub(crate) struct Stopped(Vec<JoinHandle<()>>);

impl Stopped {
    /// Waits for every thread: an accept loop returns at once, a health
    /// thread within one check's timeout.
    pub(crate) fn join(self) {
        for t in self.0 {
            let _ = t.join();
        }
    }

    /// Waits up to `grace` for every thread to end, runs `then` (the
    /// queue's close, which releases a loop waiting for room in it), then
    /// waits for the rest.
    pub(crate) fn join_within(self, grace: Duration, then: impl FnOnce()) {
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline && !self.0.iter().all(JoinHandle::is_finished) {
            std::thread::sleep(Duration::from_millis(1));
        }
        then();
        self.join();
    }
}

impl Running {
    /// The list of `services`, not started yet (see [`Running::start`]).
    pub(crate) fn new(
        shared: ProcessWide,
        pool: Arc<Pool<Job>>,
        services: &[Arc<Service>],
    ) -> Running {
        let entries = services
            .iter()
            .map(|s| Entry {
                service: Arc::clone(s),
                loops: Vec::new(),
                health: None,
            })
            .collect();
        Running {
            shared,
            pool,
            shutdown: Shutdown::new(),
            services: Mutex::new(entries),
            resolver: Resolver::default(),
            etcd: Mutex::new(Vec::new()),
            sni: crate::sni_router::routers(services),
        }
    }

    /// Stops every service's threads when `shutdown` is triggered.
    pub(crate) fn stop_with(&self, shutdown: &Shutdown) {
        let all = self.shutdown.clone();
        shutdown.on_trigger(move || all.trigger());
    }

    /// Starts the resolver thread if a service has `resolve_interval` and
    /// it does not run yet (at start-up and after each reload); a thread
    /// that cannot start is logged, and names are then looked up again
    /// only by reloads.
    pub(crate) fn resolve_names(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let watch = Box::new(move || {
            let running = weak.upgrade()?;
            let list = running.list();
            let watched = list.iter().filter_map(|s| {
                let proxy = s.live.proxy.load();
                let srv = crate::service::srv_entries(&s.config);
                (proxy.resolve_interval.is_some() || !srv.is_empty()).then(|| Watched {
                    interval: proxy.resolve_interval,
                    backends: s.live.scheduler.snapshot(),
                    service: s.name().to_string(),
                    scheduler: Arc::clone(&s.live.scheduler),
                    srv,
                    resolvers: proxy.resolvers.clone(),
                })
            });
            Some(watched.collect())
        });
        if let Err(err) = self.resolver.start_once(&self.shutdown, watch) {
            log::error!("{err}; backend names are looked up again only by reloads");
        }
        self.follow_etcd();
    }

    /// Starts a `rodizio-etcd` thread for each service with
    /// `backends_from` that has none yet; one that cannot start is logged.
    fn follow_etcd(&self) {
        let mut started = self.etcd.lock();
        for s in self.list() {
            let Some(source) = s.config.proxy.backends_from.clone() else {
                continue;
            };
            if started.iter().any(|(name, _)| name == s.name()) {
                continue;
            }
            let follower = crate::etcd_follow::Follower {
                source,
                scheduler: Arc::clone(&s.live.scheduler),
                send_proxy: s.config.send_proxy,
            };
            match crate::etcd_follow::start(follower, &self.shutdown) {
                Ok(handle) => started.push((s.name().to_string(), handle)),
                Err(err) => log::error!("{err}; {} keeps its other backends", s.name()),
            }
        }
    }

    /// The services, in their order.
    pub fn list(&self) -> Vec<Arc<Service>> {
        self.services
            .lock()
            .iter()
            .map(|e| Arc::clone(&e.service))
            .collect()
    }

    /// The services' schedulers, in their order.
    pub fn schedulers(&self) -> Vec<Arc<crate::scheduler::Scheduler>> {
        let services = self.services.lock();
        services
            .iter()
            .map(|e| Arc::clone(&e.service.live.scheduler))
            .collect()
    }

    /// The service named `name`.
    pub fn find(&self, name: &str) -> Option<Arc<Service>> {
        self.services
            .lock()
            .iter()
            .find(|e| e.service.name() == name)
            .map(|e| Arc::clone(&e.service))
    }

    /// The one line systemd shows as the status: connections, and the
    /// backends up of every service.
    pub fn status(&self) -> String {
        let backends: Vec<Arc<crate::backend::Backend>> = self
            .list()
            .iter()
            .flat_map(|s| s.live.scheduler.snapshot().to_vec())
            .collect();
        crate::systemd::status(&self.shared.stats, &backends)
    }

    /// The addresses the service `name` accepts clients on: those its own
    /// accept loops listen on, then those it shares by SNI with a service
    /// whose loop binds them (its clients come through that loop; a
    /// shared address is never port 0, so it is as configured). Empty
    /// until its loops run.
    pub fn addrs(&self, name: &str) -> Vec<SocketAddr> {
        let list = self.services.lock();
        let Some(e) = list.iter().find(|e| e.service.name() == name) else {
            return Vec::new();
        };
        let mut out: Vec<SocketAddr> = e.loops.iter().map(|l| l.addr).collect();
        if out.is_empty() && e.service.config.sni.server_names.is_none() {
            return out;
        }
        let bound_by_another = |addr: &SocketAddr| {
            list.iter()
                .filter(|o| o.service.name() != name)
                .any(|o| o.loops.iter().any(|l| l.configured == *addr))
        };
        for addr in e.service.config.listen_addrs() {
            let own = e.loops.iter().any(|l| l.configured == addr);
            if !own && addr.port() != 0 && bound_by_another(&addr) {
                out.push(addr);
            }
        }
        out
    }

    /// Starts `service` (added to the list if it is not there): an
    /// accept loop on each of `listeners` (with their configured
    /// addresses), and its health thread, which runs `first_round` once
    /// its first round of checks is done.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when a thread cannot be started; what was started
    /// for it is stopped again, and the list is as it was.
    pub(crate) fn start(
        &self,
        service: Arc<Service>,
        listeners: Bound,
        first_round: crate::health::FirstRound,
    ) -> Result<()> {
        let loops = self.spawn_loops(&service, listeners)?;
        let stop = self.shutdown.child();
        let health = crate::health::spawn(
            Arc::clone(&service.live.scheduler),
            Arc::clone(&service.live.health),
            Arc::clone(&service.stats),
            stop.clone(),
            first_round,
            service.live.tls.clone(),
        );
        let entry = Entry {
            service: Arc::clone(&service),
            loops,
            health: None,
        };
        let health = match health {
            Ok(h) => h.map(|t| (stop, t)),
            Err(err) => {
                stop_entry(entry).join();
                return Err(err);
            }
        };
        let mut services = self.services.lock();
        let at = services
            .iter()
            .position(|e| Arc::ptr_eq(&e.service, &service));
        let entry = Entry { health, ..entry };
        match at {
            Some(i) => services[i] = entry,
            None => services.push(entry),
        }
        Ok(())
    }

    /// Starts accept loops for `service` on `listeners`.
    fn spawn_loops(&self, service: &Service, listeners: Bound) -> Result<Vec<Loop>> {
        let mut loops = Vec::new();
        for (configured, listener) in listeners {
            let stop = self.shutdown.child();
            let spawned = service
                .acceptor(&listener, &self.pool, &stop, self.shared.access_log.clone())
                .and_then(|mut acceptor| {
                    acceptor.sni = self.router(service.name(), configured);
                    let addr = listener
                        .local_addr()
                        .map_err(|e| Error::io("reading the listening address", e))?;
                    let socket = listener
                        .try_clone()
                        .map_err(|e| Error::io("duplicating the listening socket", e))?;
                    std::thread::Builder::new()
                        .name("rodizio-accept".into())
                        .spawn(move || acceptor.run(&listener))
                        .map(|thread| Loop {
                            configured,
                            addr,
                            socket,
                            stop: stop.clone(),
                            thread,
                        })
                        .map_err(|e| Error::io("starting an accept thread", e))
                });
            match spawned {
                Ok(l) => loops.push(l),
                Err(err) => {
                    stop.trigger();
                    let threads = loops.into_iter().map(|l| {
                        l.stop.trigger();
                        l.thread
                    });
                    Stopped(threads.collect()).join();
                    return Err(err);
                }
            }
        }
        Ok(loops)
    }

    /// The SNI router of `addr` when the service `name` binds it for
    /// services sharing it.
    fn router(&self, name: &str, addr: SocketAddr) -> Option<Arc<dyn crate::proxy::Divert>> {
        self.sni
            .iter()
            .find(|r| r.addr == addr && &*r.owner == name)
            .map(|r| Arc::clone(&r.router) as Arc<dyn crate::proxy::Divert>)
    }

    /// Adds accept loops on `listeners` to the running service `name`.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when a thread cannot be started.
    pub(crate) fn listen_more(&self, name: &str, listeners: Bound) -> Result<()> {
        let Some(service) = self.find(name) else {
            return Ok(());
        };
        let loops = self.spawn_loops(&service, listeners)?;
        if let Some(e) = self
            .services
            .lock()
            .iter_mut()
            .find(|e| e.service.name() == name)
        {
            e.loops.extend(loops);
        }
        Ok(())
    }

    /// The listening socket of the service `name` on the configured
    /// address `configured` (a new descriptor of it), for a service that
    /// takes the address over once `name` is stopped (a reload that renames
    /// a service keeps its address: the socket, its backlog and the
    /// clients waiting in it go on). `None` when `name` does not listen
    /// there.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when the socket cannot be duplicated.
    pub(crate) fn socket_of(
        &self,
        name: &str,
        configured: SocketAddr,
    ) -> Result<Option<TcpListener>> {
        let services = self.services.lock();
        let Some(l) = services
            .iter()
            .filter(|e| e.service.name() == name)
            .flat_map(|e| e.loops.iter())
            .find(|l| l.configured == configured)
        else {
            return Ok(None);
        };
        l.socket
            .try_clone()
            .map(Some)
            .map_err(|e| Error::io("duplicating the listening socket", e))
    }

    /// Every listening socket of every service (a new descriptor of each)
    /// with the address it is bound to: what a hand-over to the next
    /// process sends (`upgrade_socket`), reloads included; an address is
    /// named once, however many loops share its socket.
    ///
    /// # Errors
    ///
    /// The first socket that cannot be duplicated (out of descriptors),
    /// in words: a hand-over then sends none, rather than some.
    pub fn listening_sockets(&self) -> std::result::Result<Vec<(SocketAddr, TcpListener)>, String> {
        let services = self.services.lock();
        let mut seen = Vec::new();
        let loops = services.iter().flat_map(|e| e.loops.iter());
        loops
            .filter(|l| {
                let first = !seen.contains(&l.addr);
                seen.push(l.addr);
                first
            })
            .map(|l| match l.socket.try_clone() {
                Ok(socket) => Ok((l.addr, socket)),
                Err(err) => Err(format!("copying the socket of {}: {err}", l.addr)),
            })
            .collect()
    }

    /// The configured addresses the service `name` listens on.
    pub(crate) fn configured_addrs(&self, name: &str) -> Vec<SocketAddr> {
        self.services
            .lock()
            .iter()
            .filter(|e| e.service.name() == name)
            .flat_map(|e| e.loops.iter().map(|l| l.configured))
            .collect()
    }

    /// Stops the accept loops of the service `name` on `addrs`.
    pub(crate) fn stop_listening(&self, name: &str, addrs: &[SocketAddr]) -> Stopped {
        let mut threads = Vec::new();
        if let Some(e) = self
            .services
            .lock()
            .iter_mut()
            .find(|e| e.service.name() == name)
        {
            let (stopping, kept) = e
                .loops
                .drain(..)
                .partition(|l| addrs.contains(&l.configured));
            e.loops = kept;
            for l in stopping {
                l.stop.trigger();
                threads.push(l.thread);
            }
        }
        Stopped(threads)
    }

    /// Stops the service `name`: no new client is accepted; those it has
    /// are served to their end by the workers.
    pub(crate) fn stop(&self, name: &str) -> Stopped {
        let mut services = self.services.lock();
        match services.iter().position(|e| e.service.name() == name) {
            Some(i) => stop_entry(services.remove(i)),
            None => Stopped(Vec::new()),
        }
    }

    /// Every thread of every service, once the process's shutdown is
    /// triggered (which stopped them all).
    pub(crate) fn take_threads(&self) -> Stopped {
        let mut threads = Vec::new();
        for e in self.services.lock().iter_mut() {
            threads.extend(e.loops.drain(..).map(|l| l.thread));
            threads.extend(e.health.take().map(|(_, t)| t));
        }
        Stopped(threads)
    }
}

/// For tests: services named as given over these backends (not
/// started), with a pool of one worker; and the process's counters.
#[cfg(test)]
pub(crate) fn for_tests(
    services: Vec<(&str, Vec<Arc<crate::backend::Backend>>)>,
) -> (Arc<Running>, Arc<crate::stats::Stats>) {
    let stats = Arc::new(crate::stats::Stats::default());
    let shared = ProcessWide {
        stats: Arc::clone(&stats),
        access_log: None,
        workers: 1,
        queue_depth: Arc::default(),
        spare: Arc::new(crate::reserve::Reserve::new(0)),
    };
    let built: Vec<Arc<Service>> = services
        .into_iter()
        .map(|(name, backends)| {
            let config = crate::config::Config {
                name: name.into(),
                ..crate::config::Config::default()
            };
            let service = Service::build(config, &shared).unwrap();
            for b in backends {
                service.live.scheduler.add(b);
            }
            Arc::new(service)
        })
        .collect();
    let pool = Pool::new(
        1,
        256 * 1024,
        4,
        Arc::clone(&stats),
        Arc::new(crate::proxy::run),
    );
    (
        Arc::new(Running::new(shared, Arc::new(pool), &built)),
        stats,
    )
}

/// Tells every thread of `entry` to stop.
fn stop_entry(entry: Entry) -> Stopped {
    let mut threads = Vec::new();
    for l in entry.loops {
        l.stop.trigger();
        threads.push(l.thread);
    }
    if let Some((stop, t)) = entry.health {
        stop.trigger();
        threads.push(t);
    }
    Stopped(threads)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// `then` runs once the threads have ended, or after the grace when
    /// one has not.
    #[test]
    fn join_within_runs_then_after_the_threads_or_the_grace() {
        let done = Arc::new(AtomicBool::new(false));
        let quick = std::thread::spawn(|| {});
        let started = Instant::now();
        Stopped(vec![quick]).join_within(Duration::from_secs(10), || {
            done.store(true, Ordering::SeqCst)
        });
        assert!(done.load(Ordering::SeqCst));
        assert!(started.elapsed() < Duration::from_secs(5));
        let (tx, rx) = crossbeam_channel::bounded::<()>(0);
        let waiting = std::thread::spawn(move || {
            let _ = rx.recv();
        });
        let started = Instant::now();
        // The thread ends only once `then` has run: after the grace.
        Stopped(vec![waiting]).join_within(Duration::from_millis(50), move || drop(tx));
        assert!(started.elapsed() >= Duration::from_millis(50));
    }
}
