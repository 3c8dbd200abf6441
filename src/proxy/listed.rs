//! A connection's place in the connections' table
//! ([`crate::connections`]): listed when a worker takes it, with the
//! policies of its service's settings, and taken off whatever happens.
//!
//! # Threads
//!
//! Worker threads, each on its own connection.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use super::{Job, Proxy, ProxyConfig};
use crate::backend::Backend;

impl Proxy {
    /// Lists the connection `job` brings in the connections' table, with
    /// the policies `settings` give it. Not inlined: its locals stay out
    /// of the frames under the pump.
    #[inline(never)]
    pub(super) fn list(&self, job: &Job, settings: &ProxyConfig) {
        use crate::connections::{begin, Begin, OnRemoved};
        let lifetime = settings
            .ends
            .max_connection_lifetime
            .map(|life| (life, settings.ends.max_connection_lifetime_jitter));
        let how = Begin {
            owner: Arc::as_ptr(&self.process) as usize,
            service: self.report.service(),
            lifetime,
            fin: settings.fin_timeout.unwrap_or(settings.idle_timeout),
            on_down: settings.ends.on_backend_down,
            on_removed: OnRemoved::of(
                settings.ends.on_backend_removed,
                settings.ends.removed_drain_timeout,
            ),
        };
        begin(job.peer, job.client.as_raw_fd(), how);
    }
}

/// The connection reached `backend` on `socket`: listed with it, and
/// with the backend's own policies over the service's.
pub(super) fn linked(backend: &Arc<Backend>, socket: &TcpStream, settings: &ProxyConfig) {
    let own = backend.own_ends();
    let removed = own
        .on_removed
        .map(|r| crate::connections::OnRemoved::of(r, settings.ends.removed_drain_timeout));
    let peer: Arc<dyn crate::connections::Peer> = backend.clone();
    crate::connections::linked(peer, socket.as_raw_fd(), (own.on_down, removed));
}

/// Takes the connection off the connections' table when dropped: the
/// last resort of a panic (every other path takes it off before its
/// sockets close, [`crate::connections::end`]).
pub(super) struct Listed;

impl Drop for Listed {
    fn drop(&mut self) {
        crate::connections::end();
    }
}
