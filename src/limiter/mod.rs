//! Per-client-IP rate limiting at accept time, in a table of bounded size.
//!
//! When `--rate-limit N/WINDOW` is given, the admission gate
//! (`proxy/admission.rs`) asks [`Limiter::check`] about every client
//! (right after `accept(2)`, or once its PROXY header or SNI is read), before the
//! scheduler picks a backend and before anything is queued. A refused client
//! is counted, optionally sent a short `429` reply ([`refuse`]), and closed;
//! it never reaches a backend. Off by default. Time is a monotonic
//! [`Instant`] passed in as `now`. Parts: this file the facade ([`Limiter`],
//! [`refuse`], the 429); `settings` the rate, algorithm and reply; `rule`
//! the three ways to count; `table` the bounded, sharded table; `store` the
//! table shared through Redis; `conns` the connections open per client
//! address, for the cap on them, keyed the same way. `docs/rate-limiting.md` explains the
//! algorithms, the table's shape and what happens when it is full.
//!
//! # Threads
//!
//! The accept loop (and a worker behind `--accept-proxy`) calls
//! [`Limiter::check`]; each shard of the table has its own lock, held for
//! a few dozen instructions, never across I/O.
//!
//! # Corresponds to the C article
//!
//! No C counterpart in the balancer article; the rate-limiting article's
//! `allow_request()` fixed window, with the races removed and a bounded
//! table.

pub mod conns;
mod rule;
mod settings;
mod store;
mod table;

use std::fmt;
use std::net::{IpAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::error::Result;
use crate::reply;
use crate::stats::Stats;
pub use conns::{ConnTable, Place, Take};
use rule::{Rule, Slot};
pub use settings::{
    Rate, RateLimitAlgorithm, RateLimitConfig, RateLimitReply, DEFAULT_IPV6_PREFIX,
    DEFAULT_MAX_CLIENTS, MAX_LIMIT, MAX_MAX_CLIENTS, MIN_WINDOW,
};
use store::RedisStore;
pub use store::{FailurePolicy, StoreConfig};
use table::{KeyHasher, Padded, Shard};

/// Clients per shard the table aims at: small enough that a scan of a full
/// shard is well under a microsecond, large enough that the per-shard cap
/// lets the table fill to about 80% before the first eviction.
const SHARD_TARGET: usize = 256;

/// The answer of [`Limiter::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Let the client through.
    Allowed,
    /// Close the client.
    Refused {
        /// True for the client's first refusal in its current window: log
        /// this one, count the others silently.
        first: bool,
        /// When the client may try again (the `Retry-After` of the 429).
        retry_after: Duration,
    },
}

impl Decision {
    /// Whether the client may go on.
    pub fn is_allowed(&self) -> bool {
        matches!(self, Decision::Allowed)
    }
}

/// The per-client-IP limiter: a bounded, sharded table. `Sync`: share it
/// by reference or in an `Arc`.
pub struct Limiter {
    config: RateLimitConfig,
    rule: Rule,
    hasher: KeyHasher,
    /// IPv6 addresses are ANDed with this before they become a key.
    ipv6_mask: u128,
    /// `shards.len() - 1`; the count is a power of two.
    shard_mask: usize,
    shards: Box<[Padded]>,
    /// Ticks are nanoseconds since this instant, plus one (0 marks an
    /// empty slot).
    epoch: Instant,
    /// Live entries forgotten because their shard was full.
    evictions: AtomicU64,
    /// Run-out entries removed to make room.
    swept: AtomicU64,
    /// `--rate-limit-store redis://...`: the counts are kept in Redis,
    /// shared with other balancers (`store.rs`), and the table is unused.
    store: Option<RedisStore>,
}

impl Limiter {
    /// A limiter with an empty table, its memory allocated now. Instants
    /// before its creation count as its creation instant.
    ///
    /// # Panics
    ///
    /// Never for a config that passed [`RateLimitConfig::validate`]; a
    /// `max_clients` of 0 is taken as 1.
    pub fn new(config: &RateLimitConfig) -> Limiter {
        let max_clients = config.max_clients.clamp(1, MAX_MAX_CLIENTS);
        let shard_count = max_clients.div_ceil(SHARD_TARGET).next_power_of_two();
        let shards = (0..shard_count)
            .map(|i| {
                // Spread the cap exactly: the shard caps add up to max_clients.
                let cap = max_clients / shard_count + usize::from(i < max_clients % shard_count);
                Padded(Mutex::new(Shard::with_capacity(cap)))
            })
            .collect();
        let prefix = u32::from(config.ipv6_prefix.clamp(1, 128));
        Limiter {
            config: config.clone(),
            rule: Rule::new(config.algorithm, config.rate),
            hasher: KeyHasher::new(),
            ipv6_mask: u128::MAX << (128 - prefix),
            shard_mask: shard_count - 1,
            shards,
            epoch: Instant::now(),
            evictions: AtomicU64::new(0),
            swept: AtomicU64::new(0),
            store: None,
        }
    }

    /// A limiter keeping its counts where `store` says: in this process
    /// (as [`Limiter::new`]) or in Redis, shared with other balancers.
    /// Failures of the store are counted in `stats`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSetting`](crate::error::Error::InvalidSetting) for a URL that is not a Redis URL.
    pub fn with_store(
        config: &RateLimitConfig,
        store: &StoreConfig,
        stats: std::sync::Arc<Stats>,
    ) -> Result<Limiter> {
        let redis = match &store.url {
            None => None,
            // The table is not used: keep it to its smallest.
            Some(url) => Some(RedisStore::new(store, url, config, stats)?),
        };
        let limiter = if redis.is_some() {
            Limiter::new(&RateLimitConfig {
                max_clients: 1,
                ..config.clone()
            })
        } else {
            Limiter::new(config)
        };
        Ok(Limiter {
            config: config.clone(),
            store: redis,
            ..limiter
        })
    }

    /// Whether the counts are kept in Redis.
    pub fn is_shared(&self) -> bool {
        self.store.is_some()
    }

    /// The settings it was built with.
    pub fn config(&self) -> &RateLimitConfig {
        &self.config
    }

    /// Counts a connection from `ip` at `now` and says whether to let it
    /// through. Exact under contention: the client's shard is locked for
    /// the whole read-modify-write. With a Redis store, Redis decides
    /// (bounded by the store's timeout; see `store.rs`).
    pub fn check(&self, ip: IpAddr, now: Instant) -> Decision {
        let key = self.key(ip);
        if let Some(store) = &self.store {
            return store.check(key, self.config.ipv6_prefix, now);
        }
        let hash = self.hasher.hash(key);
        let t = self.tick(now);
        let mut guard = self.shards[(hash >> 32) as usize & self.shard_mask]
            .0
            .lock();
        let shard = &mut *guard;
        let (i, new) = match shard.find(key, hash) {
            Ok(i) => (i, false),
            Err(mut i) => {
                if shard.len >= shard.cap {
                    let room = shard.make_room(t, &self.rule, &self.hasher);
                    if room.evicted {
                        self.evictions.fetch_add(1, Ordering::Relaxed);
                    }
                    self.swept.fetch_add(room.swept as u64, Ordering::Relaxed);
                    // Making room moves slots; find the new empty one.
                    let (Ok(j) | Err(j)) = shard.find(key, hash);
                    i = j;
                }
                shard.slots[i] = Slot::fresh(key, t);
                shard.len += 1;
                (i, true)
            }
        };
        // max: threads may pass slightly out-of-order instants.
        shard.seen[i] = shard.seen[i].max(t);
        let decision = self.rule.decide(&mut shard.slots[i], t);
        if new {
            // A slot's stamp never moves back, so its run-out time as of now
            // stays a lower bound for good.
            let run_out = self.rule.run_out_at(shard.slots[i].stamp);
            shard.run_out_at = shard.run_out_at.min(run_out);
        }
        decision
    }

    /// Clients tracked now (locks every shard in turn: for tests and
    /// reports, not the hot path).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.0.lock().len as usize).sum()
    }

    /// Whether no client is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Most clients tracked at once (`--rate-limit-max-clients`).
    pub fn capacity(&self) -> usize {
        self.shards.iter().map(|s| s.0.lock().cap as usize).sum()
    }

    /// Live entries evicted so far because their shard was full.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// Run-out entries swept so far to make room.
    pub fn swept(&self) -> u64 {
        self.swept.load(Ordering::Relaxed)
    }

    /// Bytes of the table: the limiter, the shard headers and every slot,
    /// all allocated by [`Limiter::new`].
    pub fn memory_bytes(&self) -> usize {
        let slots: usize = self.shards.iter().map(|s| s.0.lock().slots.len()).sum();
        std::mem::size_of::<Limiter>()
            + self.shards.len() * std::mem::size_of::<Padded>()
            + slots * (std::mem::size_of::<Slot>() + std::mem::size_of::<u64>())
    }

    /// Number of shards (a power of two).
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// How much of its limit `ip` has used at `now`, as the rule counts it:
    /// connections allowed in the current window (fixed and sliding
    /// window: the current window only), or tokens taken and not yet back
    /// (token bucket). Read-only: it counts nothing. For `--trace`, not the
    /// hot path (it locks the client's shard).
    pub fn used(&self, ip: IpAddr, now: Instant) -> u32 {
        let key = self.key(ip);
        let hash = self.hasher.hash(key);
        let t = self.tick(now);
        let guard = self.shards[(hash >> 32) as usize & self.shard_mask]
            .0
            .lock();
        match guard.find(key, hash) {
            Ok(i) => self.rule.used(&guard.slots[i], t),
            Err(_) => 0,
        }
    }

    /// The table key of `ip`: IPv4 as its IPv4-mapped IPv6 form, IPv6
    /// masked to the prefix. An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`,
    /// what a dual-stack listener reports for IPv4 clients) is first turned
    /// back into IPv4, so one client has one key whichever way it came.
    fn key(&self, ip: IpAddr) -> [u64; 2] {
        table::key_of(ip, self.ipv6_mask)
    }

    /// Nanoseconds since the epoch, plus one so that 0 means "empty".
    fn tick(&self, now: Instant) -> u64 {
        let nanos = now.saturating_duration_since(self.epoch).as_nanos();
        u64::try_from(nanos).unwrap_or(u64::MAX - 1) + 1
    }
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("config", &self.config)
            .field("shards", &self.shards.len())
            .finish_non_exhaustive()
    }
}

/// Answers a refused client without ever blocking the caller: with
/// [`RateLimitReply::Http`], a short 429 reply with `Retry-After` goes out
/// through [`reply::reply_at_once`] (one non-blocking write, a FIN, the
/// client's pending bytes read so that the close sends no reset). The
/// caller closes the socket; the admission gate (`proxy/admission.rs`)
/// decides, its report counts and logs.
pub fn refuse(client: &TcpStream, reply: RateLimitReply, retry_after: Duration) {
    if reply == RateLimitReply::Http {
        let response = reply::too_many_requests(retry_after);
        reply::reply_at_once(client, response.as_bytes());
    }
}

#[cfg(test)]
mod tests;
