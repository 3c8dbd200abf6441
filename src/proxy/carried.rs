//! A connection carried in from the previous process (`upgrade_socket`):
//! queued as a [`Job`] routed [`Route::Carried`], it skips every step
//! before the pump (it was admitted, routed and connected there) and its
//! pump goes on from the state handed over (`pump::pump_from`): the bytes
//! waiting each way, the ends already seen, the counters, its age. It is
//! counted active and logged at its end as any other, the bytes moved in
//! the previous process included.
//!
//! # Threads
//!
//! The upgrade's hand-over makes the job ([`Proxy::carried`]); a worker
//! serves it.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::serve::Link;
use super::{Job, Proxy, ProxyConfig, Route};
use crate::backend::Backend;
use crate::connections::carry::State;

/// What a carried connection brings besides its client socket.
#[derive(Debug)]
pub struct Carried {
    /// Its backend, among this process's backends of the service.
    pub backend: Arc<Backend>,
    /// The socket connected to it.
    pub socket: TcpStream,
    /// Its state at the hand-over.
    pub state: State,
}

impl Proxy {
    /// The job of a connection carried in: `client` and the backend
    /// `socket`, its state, for the backend of this service named in it;
    /// `Err` (in words) when the service has no such backend.
    ///
    /// # Errors
    ///
    /// The backend the state names is not one of this service's.
    pub fn carried(
        self: &Arc<Self>,
        client: TcpStream,
        socket: TcpStream,
        state: State,
    ) -> Result<Job, String> {
        let backend = self
            .scheduler
            .find(|b| b.name() == state.backend)
            .ok_or_else(|| format!("no backend {} in this service", state.backend))?;
        let peer = state.client;
        let now = Instant::now();
        let queued_at = now
            .checked_sub(Duration::from_millis(state.age_ms))
            .unwrap_or(now);
        let carried = Carried {
            backend,
            socket,
            state,
        };
        let route = Route::Carried(Box::new(carried));
        let mut job = Job::new(Arc::clone(self), client, peer, route, None, None);
        // Its times count from its first start, in the other process.
        job.queued_at = queued_at;
        Ok(job)
    }

    /// A carried job's [`Link`], with no step before the pump: listed in
    /// the connections' table with its age and bytes. Not inlined: the
    /// plain path's frames stay as they were.
    #[cold]
    #[inline(never)]
    pub(super) fn resumed(&self, job: Job, settings: Arc<ProxyConfig>) -> Option<Link> {
        self.list(&job, &settings);
        let Job {
            route: Route::Carried(carried),
            client,
            ..
        } = job
        else {
            return None;
        };
        let Carried {
            backend,
            socket,
            state,
        } = *carried;
        crate::connections::carry::carried_in(state.age_ms, state.to_backend, state.to_client);
        super::listed::linked(&backend, &socket, &settings);
        let age = Duration::from_millis(state.age_ms);
        let now = Instant::now();
        Some(Link {
            client,
            backend_sock: socket,
            backend,
            pick: None,
            held: None,
            settings,
            started: now.checked_sub(age).unwrap_or(now),
            connect_time: Duration::ZERO,
            failovers: 0,
            place: None,
            tls: None,
            resumed: Some(Box::new(state)),
        })
    }
}
