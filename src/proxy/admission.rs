//! The one admission gate: [`Proxy::admit`] decides, for every client on
//! every path, whether it is served and where it goes. In order: the
//! `allow` and `deny` lists, the per-client cap (`per_client`), the rate
//! limiter, then the scheduler's pick, which gives a backend, "wait for a
//! slot" (every available backend is at its `max_connections`) or no
//! backend at all. The answer is an [`Admitted`] (its pick or the wait, and
//! its per-client place) or a typed [`Refusal`]; the caller closes a
//! refused client and hands the refusal to its `Report`, the one place a
//! refusal becomes counters, an access log line, trace sentences and a
//! throttled log line. The gate itself tells its decisions in the trace as
//! they happen: the lists' or the cap's refusal, the limiter's decision,
//! the pick (no backend is told by the report).
//!
//! Which address it judges: the socket's peer for a plain client; the
//! address in the PROXY header behind `--accept-proxy` (`header.rs`); the
//! peer again for a client routed by SNI (`crate::sni_router`), whose
//! gate is the chosen service's. A service that terminates TLS runs the
//! gate before the handshake, on whichever path brought the client, so a
//! refused client costs no handshake.
//!
//! # Threads
//!
//! The accept loops (one per listening address) for plain clients, right
//! after `accept(2)`; a worker for a client behind a PROXY header or on an
//! address shared by SNI, once the header or the ClientHello is read (the
//! accept loop never waits for a client's bytes). On the plain path it
//! allocates nothing and adds no system call: `ArcSwap` loads, the
//! limiter's and the per-client table's shard locks when those are on
//! (held for a few instructions), the scheduler's atomics.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C's accept loop (the `while (1)` of `main()`)
//! queues every client it accepts, with `get_next_thread()`'s pick.

use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Instant;

use super::{PerClient, Proxy, Refusal};
use crate::limiter::{Decision, Limiter, Place};
use crate::scheduler::Pick;
use crate::trace::{self, Event};

/// A client the gate let through.
#[derive(Debug)]
pub(crate) struct Admitted {
    /// The backend picked for it; `None`: every available backend is at
    /// its `max_connections`, and a worker is to wait for a slot
    /// (`waiting.rs`).
    pub pick: Option<Pick>,
    /// Its place under `max_connections_per_client`, when the cap is on:
    /// held until it is closed.
    pub place: Option<Place>,
}

impl Proxy {
    /// The gate for `client`, judged as a client from `source` (the
    /// socket's peer, or the PROXY header's address): admitted, or why
    /// not. A refused client is answered here only where the per-client
    /// cap answers it; the caller answers the others
    /// ([`Proxy::answer`]), closes it and reports the refusal.
    pub(crate) fn admit(
        &self,
        client: &TcpStream,
        source: SocketAddr,
    ) -> Result<Admitted, Refusal> {
        let ip = source.ip();
        let settings = self.settings.load();
        if !settings.admits(ip) {
            // Before the limiter: a denied client takes no place in it.
            trace::event(Event::Denied { ip });
            return Err(Refusal::Denied);
        }
        let place = match self.per_client(&settings, client, ip) {
            PerClient::Open => None,
            PerClient::Placed(place) => Some(place),
            PerClient::Refused => {
                trace::event(Event::TooManyConnections { ip });
                return Err(Refusal::TooManyConnections);
            }
        };
        drop(settings);
        self.rate_limit(ip)?;
        let pick = self.scheduler.pick(ip);
        match &pick {
            Some(pick) if trace::on() => trace::event(Event::Picked {
                algorithm: self.scheduler.algorithm().name(),
                server_idx: pick.server_idx,
                backend: pick.backend.name(),
                service: self.report.named(),
            }),
            Some(_) => {}
            // Every backend down, draining, or none listed.
            None if !self.scheduler.any_available() => {
                return Err(Refusal::NoBackend {
                    scheduler: Arc::clone(&self.scheduler),
                })
            }
            // Available, but each at its cap: the client waits.
            None => {}
        }
        Ok(Admitted { pick, place })
    }

    /// The rate limiter's say on a client from `ip`, when it is on: told
    /// in the trace, and its refusal as a [`Refusal::RateLimited`].
    fn rate_limit(&self, ip: IpAddr) -> Result<(), Refusal> {
        let limiter = self.limiter.load();
        let Some(limiter) = limiter.as_deref() else {
            return Ok(());
        };
        let now = Instant::now();
        let decision = limiter.check(ip, now);
        if trace::on() {
            trace_decision(limiter, ip, now, decision);
        }
        match decision {
            Decision::Allowed => Ok(()),
            Decision::Refused { first, retry_after } => Err(Refusal::RateLimited {
                first,
                retry_after,
                rate: limiter.config().rate,
                reply: limiter.config().reply,
            }),
        }
    }
}

/// Tells the limiter's `decision` for `ip` at `now` (`--trace`).
#[cold]
fn trace_decision(limiter: &Limiter, ip: IpAddr, now: Instant, decision: Decision) {
    let rate = limiter.config().rate;
    trace::event(match decision {
        Decision::Allowed => Event::RateAllowed {
            ip,
            used: limiter.used(ip, now),
            limit: rate.limit,
            window: rate.window,
        },
        Decision::Refused { retry_after, .. } => Event::RateRefused {
            ip,
            limit: rate.limit,
            window: rate.window,
            retry_after,
        },
    });
}
