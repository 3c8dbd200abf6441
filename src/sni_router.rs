//! The worker's side of SNI routing: a client of a shared address comes
//! unrouted ([`Route::Unrouted`]); the router peeks its ClientHello,
//! chooses the service by name and offered ALPN protocols
//! ([`choose`], the one place that decides), counts how the hello went, and hands the
//! client to that service's usual path ([`Route::AfterSni`]: its admission
//! gate, `proxy/admission.rs`, then connect and pump, on this same
//! worker). A client no service takes is closed and reported as a refusal
//! (`sni_refused`, access-logged as `no_service_for_sni`); so is a hello
//! begun and never finished by `sni_timeout` (never handed to the
//! default service, which would hold it until `idle_timeout`), and one
//! closed to make room at `tls_max_pending` (the peeks in progress on the
//! address, [`crate::pending`]).
//!
//! # Threads
//!
//! Built once at start-up (the services sharing an address are fixed
//! until a restart); read by workers, with no lock.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.
//!
//! A room of its own above `service`, not a part of `sni/`: it reads the
//! services and hands their clients to `proxy`, while `sni/` (the hello,
//! the names, the peek) sits below both.

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::access_log;
use crate::pending::Pending;
use crate::proxy::{Divert, Job, Outcome, Proxy, Refusal, Route};
use crate::service::Service;
use crate::sni::alpn::AlpnList;
use crate::sni::names::{choose, Chosen, ServerNames};
use crate::sni::peek::{self, Peeked};
use crate::stats::Stats;
use crate::trace::{self, Event};

/// The services sharing one listening address.
#[derive(Debug)]
pub struct Router {
    /// Each service's names, in the configuration's order.
    names: Vec<ServerNames>,
    /// Each service's ALPN protocols, in the same order (empty: any).
    alpn: Vec<AlpnList>,
    /// Each service's proxy and name, in the same order.
    services: Vec<(Arc<Proxy>, Arc<str>)>,
    /// The default service, when one is.
    default: Option<usize>,
    /// The longest wait for the ClientHello.
    timeout: Duration,
    /// The peeks in progress, bounded by the largest `tls_max_pending` of
    /// the services sharing the address.
    pending: Pending,
}

/// The router of one shared address, and the service whose accept loop
/// runs it (the first listing the address, which binds it).
#[derive(Debug, Clone)]
pub struct Routed {
    /// The service that binds the address.
    pub owner: Arc<str>,
    /// The address as configured.
    pub addr: SocketAddr,
    /// What its accept loop queues the clients to.
    pub router: Arc<Router>,
}

/// The routers of every address where services route by SNI.
pub fn routers(services: &[Arc<Service>]) -> Vec<Routed> {
    let mut all = Vec::new();
    for (i, owner) in services.iter().enumerate() {
        if owner.config.sni.server_names.is_none() {
            continue;
        }
        for addr in owner.config.listen_addrs() {
            let listed = |s: &&Arc<Service>| s.config.listen_addrs().contains(&addr);
            if addr.port() != 0 && services[..i].iter().any(|s| listed(&s)) {
                continue; // an earlier service binds it
            }
            // Port 0 is "any free port": never shared, the owner alone.
            let group: Vec<&Arc<Service>> = services[i..]
                .iter()
                .take(if addr.port() == 0 { 1 } else { services.len() })
                .filter(listed)
                .filter(|s| s.config.sni.server_names.is_some())
                .collect();
            let router = Router {
                names: group
                    .iter()
                    .map(|s| s.config.sni.server_names.clone().unwrap_or_default())
                    .collect(),
                alpn: group.iter().map(|s| s.config.sni.alpn.clone()).collect(),
                services: group
                    .iter()
                    .map(|s| (Arc::clone(&s.proxy), Arc::from(s.name())))
                    .collect(),
                default: group.iter().position(|s| s.config.sni.default),
                timeout: group
                    .iter()
                    .map(|s| s.config.sni.timeout)
                    .max()
                    .unwrap_or(crate::sni::DEFAULT_TIMEOUT),
                pending: Pending::new(
                    group
                        .iter()
                        .map(|s| s.config.tls.max_pending)
                        .max()
                        .unwrap_or(crate::pending::DEFAULT_MAX_PENDING),
                ),
            };
            all.push(Routed {
                owner: Arc::from(owner.name()),
                addr,
                router: Arc::new(router),
            });
        }
    }
    all
}

/// The counter a hello raises, given the service it went to.
fn counter<'s>(stats: &'s Stats, peeked: &Peeked, chosen: Chosen) -> Option<&'s AtomicU64> {
    match (peeked, chosen) {
        (Peeked::Hello { name: Some(_), .. }, Chosen::Matched(_)) => Some(&stats.sni_matched),
        (Peeked::Hello { name: Some(_), .. }, Chosen::Default(_)) => Some(&stats.sni_default),
        (Peeked::Hello { name: Some(_), .. }, Chosen::Nobody) => None,
        (Peeked::Hello { name: None, .. }, _) => Some(&stats.sni_no_sni),
        (Peeked::NotTls(_), _) => Some(&stats.sni_not_tls),
        (Peeked::Timeout | Peeked::Stalled, _) => Some(&stats.sni_timeout),
        (Peeked::MadeRoom, _) => Some(&stats.tls_pending_closed),
    }
}

/// How the hello went, in the trace's and log's words.
fn how(peeked: &Peeked) -> &'static str {
    match peeked {
        Peeked::Hello { name: Some(_), .. } => "",
        Peeked::Hello { name: None, .. } => "no server name",
        Peeked::NotTls(why) => why,
        Peeked::Timeout => "no complete ClientHello in time",
        Peeked::Stalled => "a ClientHello begun and not finished in time",
        Peeked::MadeRoom => "closed, stalled longest, to make room (tls_max_pending)",
    }
}

impl Divert for Router {
    fn divert(&self, mut job: Job) -> Option<(Job, access_log::SniGuard)> {
        // Taken by this worker now: the trace's line and the queue wait
        // end here, before the hello is read.
        let taken = Instant::now();
        if trace::on() {
            trace::taken(job.client.as_raw_fd(), trace::worker_number());
        }
        let deadline = taken + self.timeout;
        let ticket = self.pending.enter(&job.client, job.queued_at);
        let mut peeked = peek::client_hello(&job.client, deadline);
        if ticket.leave() {
            peeked = Peeked::MadeRoom;
        }
        let (host, offered) = match &peeked {
            Peeked::Hello { name, alpn } => (name.as_deref(), &**alpn),
            _ => (None, &[][..]),
        };
        let chosen = match peeked {
            // Nobody takes a hello that stalled: its client is closed.
            Peeked::Stalled | Peeked::MadeRoom => Chosen::Nobody,
            _ => choose(&self.names, &self.alpn, self.default, host, offered),
        };
        let at = match chosen {
            Chosen::Matched(i) | Chosen::Default(i) => Some(i),
            Chosen::Nobody => None,
        };
        // The owner's counters when nobody takes the client; accepted
        // here, not by the owner's accept loop, so that each service of
        // the address counts its own clients.
        let (proxy, name) = &self.services[at.unwrap_or(0)];
        Stats::incr(&proxy.stats.accepted);
        if let Some(c) = counter(&proxy.stats, &peeked, chosen) {
            Stats::incr(c);
        }
        if trace::on() {
            trace_sni(host, &peeked, at.map(|_| &**name));
        }
        // The access log lines of this client name the server it asked for.
        let sni = access_log::set_sni(host.map(Box::from));
        if at.is_none() {
            refuse(proxy, job, host, &peeked);
            return None;
        }
        job.proxy = Arc::clone(proxy);
        job.route = Route::AfterSni(taken);
        Some((job, sni))
    }
}

/// Tells the choice in the trace (`--trace`). Not inlined: its sentence
/// would sit in the router's frame, under every routed connection's.
#[inline(never)]
fn trace_sni(host: Option<&str>, peeked: &Peeked, service: Option<&str>) {
    trace::event(Event::Sni {
        name: host,
        why: how(peeked),
        service,
    });
}

/// No service takes the client: closed, and reported through the owner's
/// `Report` as any refusal (counted `sni_refused`, logged at debug level,
/// as a scan would flood the log, and access-logged).
#[cold]
#[inline(never)]
fn refuse(proxy: &Proxy, job: Job, host: Option<&str>, peeked: &Peeked) {
    let refusal = Refusal::NoServiceForSni {
        host: host.map(Box::from),
        how: how(peeked),
    };
    let outcome = Outcome::refused(job.peer, job.queued_at, refusal);
    proxy.report.count(&outcome);
    let _ = job.client.shutdown(std::net::Shutdown::Both);
    drop(job);
    proxy.report.tell(&outcome);
}
