//! A client waiting for a backend slot: every available backend is at its
//! `max_connections`, so the worker holds the client in the service's
//! waitlist (`waitlist.rs`) until a slot frees and its turn comes, up to
//! `queue_timeout` since it was accepted and with at most `max_queue`
//! clients waiting; otherwise it gets the service's refusal (closed, or
//! 503 with `http_replies`). A worker whose connect failed and whose
//! fail-over finds the primaries left at their cap waits in the same line
//! (`connect.rs`): a full primary queues its clients, the backups are for
//! primaries that are gone.
//!
//! While it waits the worker looks at its client now and then: one that
//! closed without sending anything leaves the line (a client that sent a
//! request and then half-closed is kept: its request is still to serve).
//!
//! # Threads
//!
//! Worker threads, each for its own client. Only clients that found every
//! backend full come here: with no cap, this code never runs.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C sends every client to its turn's server.

use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::report::{Outcome, Refusal};
use super::{Proxy, ProxyConfig};
use crate::health::HealthConfig;
use crate::scheduler::Pick;

/// How often a waiting worker looks at its client (and, should a wake-up
/// be missed, at the backends).
const LOOK_EVERY: Duration = Duration::from_millis(100);

impl Proxy {
    /// Waits for a slot for `client`: its pick, or `None` when it was
    /// refused (counted, answered and closed already, said in `outcome`).
    #[cold]
    #[inline(never)]
    pub(super) fn wait_for_slot(
        &self,
        client: &TcpStream,
        peer: SocketAddr,
        queued_at: Instant,
        settings: &ProxyConfig,
        health: &HealthConfig,
        outcome: &mut Outcome,
    ) -> Option<Pick> {
        let slot = self.slot(client, peer, queued_at, settings);
        // The access log's queue time: for the worker, then for the slot.
        outcome.queue_wait = queued_at.elapsed();
        match slot {
            Ok(pick) => Some(pick),
            Err(refusal) => {
                self.refuse(outcome, refusal, client, health);
                None
            }
        }
    }

    /// The wait itself; see the module docs.
    fn slot(
        &self,
        client: &TcpStream,
        peer: SocketAddr,
        queued_at: Instant,
        settings: &ProxyConfig,
    ) -> Result<Pick, Refusal> {
        let scheduler = &self.scheduler;
        let taken = self.wait_in_line(client, queued_at, settings, |first| {
            if first {
                // Taken while the ticket is held: the next in line sees
                // the slot gone.
                if let Some(pick) = scheduler.pick_for_first_waiting(peer.ip()) {
                    return Look::Taken(pick);
                }
            }
            match scheduler.any_available() {
                true => Look::Full,
                false => Look::Nothing,
            }
        })?;
        taken.ok_or_else(|| Refusal::NoBackend {
            scheduler: Arc::clone(&self.scheduler),
        })
    }

    /// Waits in the service's line until `look`, asked whether this client
    /// is the first in line, takes a slot (`Some`) or finds nothing left
    /// to wait for (`None`); refused at `queue_timeout` since `queued_at`,
    /// when `max_queue` clients wait already, or when the client leaves.
    /// Fail-over waits here too, for a full primary's slot
    /// (`connect.rs`).
    pub(super) fn wait_in_line<T>(
        &self,
        client: &TcpStream,
        queued_at: Instant,
        settings: &ProxyConfig,
        mut look: impl FnMut(bool) -> Look<T>,
    ) -> Result<Option<T>, Refusal> {
        let waitlist = self.scheduler.waitlist();
        let max = settings.max_queue;
        let Some(ticket) = waitlist.join(max) else {
            return Err(Refusal::QueueFull { max });
        };
        let _queued = self.stats.hold(&self.stats.queued);
        let deadline = queued_at + settings.queue_timeout;
        loop {
            let (first, seen) = ticket.first();
            match look(first) {
                Look::Taken(taken) => return Ok(Some(taken)),
                Look::Nothing => return Ok(None),
                Look::Full => {}
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Refusal::SlotTimeout {
                    limit: settings.queue_timeout,
                });
            }
            if left(client) {
                return Err(Refusal::LeftQueue);
            }
            ticket.wait(seen, deadline.min(now + LOOK_EVERY));
        }
    }
}

/// What a client in line finds when it looks at the backends.
pub(super) enum Look<T> {
    /// A slot, taken.
    Taken(T),
    /// None free for it yet, but one to wait for.
    Full,
    /// Nothing left to wait for.
    Nothing,
}

/// Whether the client closed (or reset) its connection without leaving a
/// byte to serve.
fn left(client: &TcpStream) -> bool {
    let mut fds = [libc::pollfd {
        fd: client.as_raw_fd(),
        events: libc::POLLIN | libc::POLLRDHUP,
        revents: 0,
    }];
    // SAFETY: one valid pollfd, zero timeout.
    let ready = unsafe { libc::poll(fds.as_mut_ptr(), 1, 0) };
    if ready <= 0 {
        return false;
    }
    let revents = fds[0].revents;
    if revents & (libc::POLLERR | libc::POLLHUP) != 0 {
        return true;
    }
    // Readable: gone only if nothing is left to read (its end of stream).
    let mut byte = [0u8; 1];
    matches!(client.peek(&mut byte), Ok(0) | Err(_))
}
