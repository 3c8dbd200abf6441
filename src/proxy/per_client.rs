//! The cap on connections open at once from one client address
//! (`max_connections_per_client`; nginx's `limit_conn`, HAProxy's
//! `sc_conn_cur`). With one thread per connection, an address that stays
//! under the rate limit could still hold every worker: past the cap its
//! next client gets the rate limiter's reply (closed, or its 429) and is
//! counted `too_many_connections`.
//!
//! Checked at accept after the `allow` and `deny` lists and before the
//! rate limiter, with the PROXY header's address behind `accept_proxy`.
//! The counts live in a [`ConnTable`] the service makes when the cap is
//! first on, sized and keyed as the rate limiter's table (its most
//! clients and its IPv6 prefix, their defaults when rate limiting is
//! off), and made again when a reload changes those.
//!
//! # Threads
//!
//! The accept loops, and workers behind `--accept-proxy`; the table locks
//! one shard per call. When the cap is off, nothing here runs.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::net::{IpAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Proxy, ProxyConfig};
use crate::limiter::{
    ConnTable, Place, RateLimitReply, Take, DEFAULT_IPV6_PREFIX, DEFAULT_MAX_CLIENTS,
};
use crate::{reply, throttle};

/// The `Retry-After` of the 429 a capped client gets: a place frees when
/// one of its connections ends, which nothing here can foresee.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// What the cap says of one client.
pub(crate) enum PerClient {
    /// No cap: nothing counted.
    Open,
    /// Counted in, with its place.
    Placed(Place),
    /// Over the cap (or the table full): answered, to be closed.
    Refused,
}

impl Proxy {
    /// The cap's gate for a client from `ip`: with the cap on, counts it
    /// in, or answers it as the rate limiter would (the caller closes it,
    /// counts and access-logs it) and logs that, once a second at most.
    pub(crate) fn per_client(
        &self,
        settings: &ProxyConfig,
        client: &TcpStream,
        ip: IpAddr,
    ) -> PerClient {
        let Some(limit) = settings.max_connections_per_client else {
            return PerClient::Open;
        };
        self.per_client_cold(limit, client, ip)
    }

    #[cold]
    #[inline(never)]
    fn per_client_cold(&self, limit: usize, client: &TcpStream, ip: IpAddr) -> PerClient {
        let (table, reply) = self.conn_table();
        let full = match table.take(ip, limit) {
            Take::Taken(place) => return PerClient::Placed(place),
            Take::Over => false,
            Take::Full => true,
        };
        if reply == RateLimitReply::Http {
            reply::reply_at_once(client, reply::too_many_requests(RETRY_AFTER).as_bytes());
        }
        if let Some(others) = table.refusals_log.event(Instant::now()) {
            let more = throttle::more(others);
            if full {
                log::warn!(
                    "closing client {ip}{}: the table of client addresses is full ({} \
                     addresses with connections open){more}",
                    self.report.whose(),
                    table.capacity()
                );
            } else {
                log::info!(
                    "closing client {ip}{}: its address has {limit} connections open \
                     (max_connections_per_client){more}",
                    self.report.whose()
                );
            }
        }
        PerClient::Refused
    }

    /// The service's table, made (or made again) for the rate limiter's
    /// bounds, and the reply a capped client gets.
    fn conn_table(&self) -> (Arc<ConnTable>, RateLimitReply) {
        let (max_clients, prefix, reply) = match self.limiter.load().as_deref() {
            Some(l) => {
                let c = l.config();
                (c.max_clients, c.ipv6_prefix, c.reply)
            }
            None => (
                DEFAULT_MAX_CLIENTS,
                DEFAULT_IPV6_PREFIX,
                RateLimitReply::Close,
            ),
        };
        let current = self.clients.load_full();
        if let Some(table) = current.as_ref().filter(|t| t.fits(max_clients, prefix)) {
            return (Arc::clone(table), reply);
        }
        // Two accept loops may get here at once: one table wins, and both
        // count in it. Places in a replaced table give themselves back to
        // it, so its counts stay right until it is gone.
        let fresh = ConnTable::new(max_clients, prefix);
        let before = self
            .clients
            .compare_and_swap(&current, Some(Arc::clone(&fresh)));
        let won = match (&*before, &current) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        if won {
            return (fresh, reply);
        }
        match self.clients.load_full() {
            Some(table) => (table, reply),
            None => (fresh, reply),
        }
    }

    /// Connections open now from `ip`'s address, as the cap counts them
    /// (0 while the cap has never been on).
    pub fn connections_from(&self, ip: IpAddr) -> u32 {
        self.clients.load().as_ref().map_or(0, |t| t.count(ip))
    }

    /// Addresses with connections open, and the most the table holds
    /// (`None` while the cap has never been on).
    pub fn client_addresses(&self) -> Option<(usize, usize)> {
        self.clients
            .load()
            .as_ref()
            .map(|t| (t.len(), t.capacity()))
    }
}
