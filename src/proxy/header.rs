//! The worker's route for a client behind a proxy: the accept loop queues
//! it with [`Route::AfterHeader`] and no backend, and the worker that takes
//! it reads its PROXY protocol header ([`crate::proxy_protocol`]), then runs
//! what the accept loop runs for everyone else, in the same order, with the
//! header's address: the rate limiter, then the scheduler's pick (so
//! `ip-hash` hashes the real client). A client refused on the way is counted
//! and closed.
//!
//! # Threads
//!
//! Worker threads only; the accept loop never waits on a client's bytes.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C's clients connect to it directly.

use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Instant;

use super::{close, PerClient, Proxy};
use crate::limiter::{self, Place};
pub use crate::proxy_protocol::AcceptProxy;
use crate::proxy_protocol::{self, REFUSAL_LOG_WINDOW};
pub(crate) use crate::proxy_protocol::{send, Origin};
use crate::reply;
use crate::scheduler::Pick;
use crate::stats::Stats;

/// Whether the backend was picked at accept time, or will be once the
/// PROXY protocol header has told the worker who the client is.
#[derive(Debug)]
pub enum Route {
    /// The accept loop checked the limiter and picked: the usual way.
    Picked(Pick),
    /// `--accept-proxy`: the worker reads the header, then checks the
    /// limiter and picks with the address it carries.
    AfterHeader,
    /// Every available backend was at its `max_connections`: the worker
    /// waits for a slot in the service's waitlist (`proxy/waiting.rs`).
    Waiting,
    /// An address shared by services (SNI routing): the worker hands the
    /// client to this router, which peeks its ClientHello, chooses the
    /// service and queues nothing: it serves it there, as [`Route::AfterSni`].
    Unrouted(Arc<dyn Divert>),
    /// Chosen by SNI: the allow and deny lists, the limiter and the pick
    /// run on the worker, as after a PROXY header.
    AfterSni,
}

/// What routes a client of a shared address on the worker (`crate::sni`'s
/// router): a trait, so that this module knows nothing of SNI.
pub trait Divert: Send + Sync + std::fmt::Debug {
    /// Chooses the service of `job` (routed [`Route::Unrouted`]): the job
    /// for it ([`Route::AfterSni`]) and what names the client in the
    /// access log until it ends, or `None` when the client was closed
    /// (counted and reported there).
    fn divert(&self, job: super::Job) -> Option<(super::Job, crate::access_log::SniGuard)>;
}

impl Proxy {
    /// The worker's half of accepting a client behind a proxy: trust,
    /// header, the allow and deny lists, the per-client cap, limiter, pick.
    /// Gives back the client, its pick (`None`: every backend is at its
    /// cap, the client is to wait), who it is and its per-client place;
    /// `None` when the client was closed.
    pub(super) fn after_header(
        &self,
        accept: &AcceptProxy,
        client: TcpStream,
        peer: SocketAddr,
    ) -> Option<(TcpStream, Option<Pick>, Origin, Option<Place>)> {
        let origin = match proxy_protocol::receive(accept, &client, peer) {
            Ok(origin) => origin,
            Err(why) => {
                Stats::incr(&self.stats.proxy_header_refused);
                self.report.log_access(
                    peer,
                    None,
                    Instant::now(),
                    super::Access::refused(crate::access_log::End::ProxyHeaderRefused),
                );
                if let Some(silenced) = accept.note_refusal(peer.ip(), Instant::now()) {
                    let silenced = if silenced > 0 {
                        format!(" ({silenced} more since the last line, not logged)")
                    } else {
                        String::new()
                    };
                    log::warn!(
                        "closing client {peer}: {why}{silenced}; \
                         this source is logged at most once per {REFUSAL_LOG_WINDOW:?}"
                    );
                }
                close(&client);
                return None;
            }
        };
        let (client, pick, place) = self.gate(client, origin.source, peer)?;
        Some((client, pick, origin, place))
    }

    /// The worker's half of accepting a client routed by SNI: the allow
    /// and deny lists, limiter, pick, as the accept loop runs them for
    /// other clients.
    pub(super) fn after_sni(
        &self,
        client: TcpStream,
        peer: SocketAddr,
    ) -> Option<(TcpStream, Option<Pick>, Origin, Option<Place>)> {
        let (client, pick, place) = self.gate(client, peer, peer)?;
        let origin = Origin {
            source: peer,
            destination: None,
        };
        Some((client, pick, origin, place))
    }

    /// The allow and deny lists, the per-client cap, the limiter and the
    /// pick for the client `source` (which came from `peer`): the client,
    /// its pick (`None`: every backend is at its cap, the client is to
    /// wait) and its per-client place, or `None` when it was refused
    /// (counted, logged and closed).
    fn gate(
        &self,
        client: TcpStream,
        source: SocketAddr,
        peer: SocketAddr,
    ) -> Option<(TcpStream, Option<Pick>, Option<Place>)> {
        if !self.settings.load().admits(source.ip()) {
            // The allow and deny lists, with the header's address.
            Stats::incr(&self.stats.denied);
            self.report.log_access(
                source,
                None,
                Instant::now(),
                super::Access::refused(crate::access_log::End::Denied),
            );
            close(&client);
            return None;
        }
        let place = self.placed(&client, source)?;
        let client = self.admit(client, source)?;
        let pick = self.scheduler.pick(source.ip());
        if pick.is_none() && !self.scheduler.any_available() {
            Stats::incr(&self.stats.no_backend);
            self.report.log_access(
                source,
                None,
                Instant::now(),
                super::Access::refused(crate::access_log::End::NoBackend),
            );
            log::warn!(
                "closing client {source} (via {peer}){}: no backend is available",
                self.report.whose()
            );
            if self.health.load().http_replies {
                reply::reply_at_once(&client, reply::REPLY_503);
            }
            close(&client);
            return None;
        }
        Some((client, pick, place))
    }

    /// The per-client cap, with the header's address: the client's place,
    /// or `None` when it was refused (then counted, logged and closed).
    fn placed(&self, client: &TcpStream, source: SocketAddr) -> Option<Option<Place>> {
        match self.per_client(&self.settings.load(), client, source.ip()) {
            PerClient::Open => Some(None),
            PerClient::Placed(place) => Some(Some(place)),
            PerClient::Refused => {
                Stats::incr(&self.stats.too_many_connections);
                self.report.log_access(
                    source,
                    None,
                    Instant::now(),
                    super::Access::refused(crate::access_log::End::TooManyConnections),
                );
                close(client);
                None
            }
        }
    }

    /// The rate-limit gate, as the accept loop runs it for other clients,
    /// with the header's address: gives the client back if it may go on;
    /// else it is counted, its first refusal of the window logged, and it
    /// is ended without blocking ([`limiter::refuse`]).
    fn admit(&self, client: TcpStream, source: SocketAddr) -> Option<TcpStream> {
        let limiter = self.limiter.load();
        let Some(limiter) = limiter.as_deref() else {
            return Some(client);
        };
        let decision = limiter.check(source.ip(), Instant::now());
        let admitted = limiter::admit(limiter, client, source.ip(), decision, &self.stats);
        if admitted.is_none() {
            self.report.log_access(
                source,
                None,
                Instant::now(),
                super::Access::refused(crate::access_log::End::RateLimited),
            );
        }
        admitted
    }
}
