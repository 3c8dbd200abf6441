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

use std::os::fd::AsRawFd;

use super::{Job, Proxy, ProxyConfig};

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

/// Takes the connection off the connections' table when dropped: the
/// last resort of a panic (every other path takes it off before its
/// sockets close, [`crate::connections::end`]).
pub(super) struct Listed;

impl Drop for Listed {
    fn drop(&mut self) {
        crate::connections::end();
    }
}
