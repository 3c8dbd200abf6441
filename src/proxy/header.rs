//! A client's [`Route`] through the pool, and the worker's route for a
//! client behind a proxy: the accept loop queues it with
//! [`Route::AfterHeader`] and no backend, and the worker that takes it
//! reads its PROXY protocol header ([`crate::proxy_protocol`]), then runs
//! the admission gate (`admission.rs`) with the header's address (so the
//! lists, the caps and the limiter judge the real client, and `ip-hash`
//! hashes it). A refused header or gate is a `Refusal`, reported as any
//! other.
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

use super::{Admitted, Proxy, Refusal};
use crate::proxy_protocol;
pub use crate::proxy_protocol::AcceptProxy;
pub(crate) use crate::proxy_protocol::{send, Origin};
use crate::scheduler::Pick;

/// Whether the backend was picked at accept time, or will be once the
/// PROXY protocol header has told the worker who the client is.
#[derive(Debug)]
pub enum Route {
    /// The accept loop ran the admission gate, which picked: the usual way.
    Picked(Pick),
    /// `--accept-proxy`: the worker reads the header, then runs the
    /// admission gate with the address it carries.
    AfterHeader,
    /// Every available backend was at its `max_connections`: the worker
    /// waits for a slot in the service's waitlist (`proxy/waiting.rs`).
    Waiting,
    /// An address shared by services (SNI routing): the worker hands the
    /// client to this router, which peeks its ClientHello, chooses the
    /// service and queues nothing: it serves it there, as [`Route::AfterSni`].
    Unrouted(Arc<dyn Divert>),
    /// Chosen by SNI: the chosen service's admission gate runs on the
    /// worker, as after a PROXY header. With the time the worker took the
    /// client, before reading its hello: its queue wait ends there (the
    /// hello's read is not time in the queue).
    AfterSni(std::time::Instant),
    /// Carried in from the previous process (`upgrade_socket`), connected
    /// to its backend already: the worker goes on pumping it
    /// (`carried.rs`).
    Carried(Box<super::carried::Carried>),
}

/// What routes a client of a shared address on the worker (`crate::sni`'s
/// router): a trait, so that this module knows nothing of SNI.
pub trait Divert: Send + Sync + std::fmt::Debug {
    /// Chooses the service of `job` (routed [`Route::Unrouted`]): the job
    /// for it ([`Route::AfterSni`]) and what names the client in the
    /// access log until it ends, or `None` when the client was refused
    /// (closed and reported there, through its service's `Report`).
    fn divert(&self, job: super::Job) -> Option<(super::Job, crate::access_log::SniGuard)>;
}

impl Proxy {
    /// The worker's half of accepting a client behind a proxy: trust and
    /// header, then the admission gate with the header's address. Gives
    /// who the client is (the peer, when the header was refused) and the
    /// gate's answer; the caller closes and reports a refused client.
    pub(super) fn after_header(
        &self,
        accept: &AcceptProxy,
        client: &TcpStream,
        peer: SocketAddr,
    ) -> (Origin, Result<Admitted, Refusal>) {
        match proxy_protocol::receive(accept, client, peer) {
            Ok(origin) => (origin, self.admit(client, origin.source)),
            Err(why) => {
                let origin = Origin {
                    source: peer,
                    destination: None,
                };
                let silenced = accept.note_refusal(peer.ip(), Instant::now());
                (origin, Err(Refusal::ProxyHeader { why, silenced }))
            }
        }
    }
}
