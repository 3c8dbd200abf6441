//! The limit shared by several balancers: the counters kept in Redis
//! (`--rate-limit-store redis://HOST:PORT/DB`) instead of in this process.
//!
//! Each check is one Lua script run by Redis (`EVALSHA`, loaded on first
//! use), so reading, deciding and writing are one atomic step, on Redis's
//! own clock (`TIME`); one key per client, `rodizio:rl:ALGORITHM:ADDRESS`,
//! each with an expiry. A slow Redis must not become a slow balancer:
//! every call is bounded by `--rate-limit-store-timeout`, a failure drops
//! that connection and none is tried again for [`RECONNECT_INTERVAL`], and
//! `--rate-limit-store-failure` decides a failed check (counted, warned at
//! most every [`WARN_INTERVAL`]). `docs/scaling.md` ("One rate limit for
//! all instances") explains the scripts and the failure policy.
//!
//! # Threads
//!
//! The accept loop calls it, and so do the workers for clients behind
//! `--accept-proxy`. Idle connections wait in a small free list behind a
//! `parking_lot::Mutex` held only to take one out or put one back, never
//! while talking to Redis; clients Redis refused are remembered until
//! their retry time (at most [`REFUSED_CACHE`]). No C counterpart: the
//! article's limiter is per process.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::{Client, Connection, Script};

use super::{Decision, RateLimitAlgorithm, RateLimitConfig};
use crate::error::{Error, Result};
use crate::stats::Stats;

/// Default of `--rate-limit-store-timeout`: a loopback or LAN round trip
/// takes well under a millisecond; 50 ms means Redis is in trouble.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);
/// After a failure, the shortest time before a new connection is tried.
pub const RECONNECT_INTERVAL: Duration = Duration::from_secs(1);
/// Shortest time between two warnings about the store.
pub const WARN_INTERVAL: Duration = Duration::from_secs(10);
/// Most refused clients remembered until their retry time.
pub const REFUSED_CACHE: usize = 4096;
/// Most idle connections kept for reuse.
const MAX_IDLE: usize = 8;

/// What a check does when Redis cannot answer in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailurePolicy {
    /// Let the client through (the default): Redis down means no limit,
    /// not no service.
    #[default]
    Open,
    /// Refuse the client: no limit check, no service.
    Closed,
}

impl FailurePolicy {
    /// The name used in flags and the config file (`open`, `closed`).
    pub fn name(self) -> &'static str {
        match self {
            FailurePolicy::Open => "open",
            FailurePolicy::Closed => "closed",
        }
    }
}

impl std::str::FromStr for FailurePolicy {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<Self, String> {
        match text {
            "open" => Ok(FailurePolicy::Open),
            "closed" => Ok(FailurePolicy::Closed),
            _ => Err(format!(
                "'{text}' is not a failure policy (use open or closed)"
            )),
        }
    }
}

/// Where the limiter keeps its counts (a part of [`crate::Config`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// `redis://HOST:PORT/DB` (`rate_limit_store`), or `None` for the
    /// in-process table (the default).
    pub url: Option<String>,
    /// Connect, read and write timeout of each Redis call
    /// (`rate_limit_store_timeout`). Default 50 ms.
    pub timeout: Duration,
    /// What to do when Redis fails (`rate_limit_store_failure`). Default
    /// open.
    pub failure: FailurePolicy,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            url: None,
            timeout: DEFAULT_TIMEOUT,
            failure: FailurePolicy::Open,
        }
    }
}

impl StoreConfig {
    /// Checks that the URL is a Redis URL and the timeout usable.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSetting`] naming the bad setting.
    pub fn validate(&self) -> Result<()> {
        if let Some(url) = &self.url {
            if !url.starts_with("redis://") {
                return Err(Error::setting(
                    "rate_limit_store",
                    format!("'{url}': expected redis://HOST:PORT/DB"),
                ));
            }
            Client::open(url.as_str())
                .map_err(|e| Error::setting("rate_limit_store", format!("'{url}': {e}")))?;
        }
        if self.timeout.is_zero() {
            return Err(Error::setting(
                "rate_limit_store_timeout",
                "must be more than 0",
            ));
        }
        Ok(())
    }
}

/// Fixed window: the key counts the window's connections and lives for
/// the window. Returns `{allowed, retry_after_us, first_refusal}`.
const FIXED: &str = r"
local n = redis.call('INCR', KEYS[1])
local w = tonumber(ARGV[2])
if n == 1 then redis.call('PEXPIRE', KEYS[1], w) end
if n <= tonumber(ARGV[1]) then return {1, 0, 0} end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then redis.call('PEXPIRE', KEYS[1], w); ttl = w end
local first = 0
if n == tonumber(ARGV[1]) + 1 then first = 1 end
return {0, ttl * 1000, first}
";

/// Sliding window, the two-counter estimate over windows aligned on
/// Redis's clock: `w` the current window's number, `c` its count, `p` the
/// previous window's, `r` the window whose refusal was reported.
const SLIDING: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local limit = tonumber(ARGV[1])
local w = tonumber(ARGV[2]) * 1000
local idx = math.floor(now / w)
local h = redis.call('HMGET', KEYS[1], 'w', 'c', 'p', 'r')
local cw = tonumber(h[1]) or idx
local c = tonumber(h[2]) or 0
local p = tonumber(h[3]) or 0
local r = tonumber(h[4]) or -1
if idx == cw + 1 then p = c; c = 0 elseif idx ~= cw then p = 0; c = 0 end
local left = w - (now - idx * w)
local ttl = math.ceil((left + w) / 1000)
if p * left / w + c + 1 <= limit then
  redis.call('HSET', KEYS[1], 'w', idx, 'c', c + 1, 'p', p, 'r', r)
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {1, 0, 0}
end
local first = 0
if r ~= idx then first = 1 end
redis.call('HSET', KEYS[1], 'w', idx, 'c', c, 'p', p, 'r', idx)
redis.call('PEXPIRE', KEYS[1], ttl)
return {0, math.max(left, 1000), first}
";

/// Token bucket as GCRA: `t` the theoretical arrival time (µs of Redis's
/// clock), `r` the window-long slice of time whose refusal was reported.
const TOKEN: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local w = tonumber(ARGV[2]) * 1000
local interval = w / tonumber(ARGV[1])
local h = redis.call('HMGET', KEYS[1], 't', 'r')
local tat = tonumber(h[1]) or now
local r = tonumber(h[2]) or -1
if tat < now then tat = now end
local allow_at = tat + interval - w
if now >= allow_at then
  local nt = tat + interval
  redis.call('HSET', KEYS[1], 't', nt, 'r', r)
  redis.call('PEXPIRE', KEYS[1], math.ceil((nt - now) / 1000) + 1)
  return {1, 0, 0}
end
local slice = math.floor(now / w)
local first = 0
if r ~= slice then first = 1 end
redis.call('HSET', KEYS[1], 'r', slice)
redis.call('PEXPIRE', KEYS[1], math.ceil((tat - now) / 1000) + 1)
return {0, math.ceil(allow_at - now), first}
";

/// The Redis side of a [`super::Limiter`]; see the module docs.
pub(super) struct RedisStore {
    client: Client,
    timeout: Duration,
    failure: FailurePolicy,
    script: Script,
    /// `rodizio:rl:ALGORITHM:`, the start of every key.
    prefix: String,
    limit: u32,
    window_ms: u64,
    idle: Mutex<Vec<Connection>>,
    /// Milliseconds since `epoch` before which no connection is opened
    /// (set after a failure); 0 when none is pending.
    retry_at_ms: AtomicU64,
    /// Milliseconds since `epoch` of the last warning, plus one (0: none).
    warned_at_ms: AtomicU64,
    /// Clients Redis refused, and until when, to refuse without asking.
    refused: Mutex<HashMap<[u64; 2], Instant>>,
    epoch: Instant,
    stats: Arc<Stats>,
}

impl RedisStore {
    /// A store for `rules`, talking to the Redis at `config.url`. Opens no
    /// connection yet: the first check does.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSetting`] when the URL is not a Redis URL.
    pub(super) fn new(
        config: &StoreConfig,
        url: &str,
        rules: &RateLimitConfig,
        stats: Arc<Stats>,
    ) -> Result<RedisStore> {
        let client = Client::open(url)
            .map_err(|e| Error::setting("rate_limit_store", format!("'{url}': {e}")))?;
        let (code, short) = match rules.algorithm {
            RateLimitAlgorithm::FixedWindow => (FIXED, "fw"),
            RateLimitAlgorithm::SlidingWindow => (SLIDING, "sw"),
            RateLimitAlgorithm::TokenBucket => (TOKEN, "tb"),
        };
        let window_ms = u64::try_from(rules.rate.window.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        Ok(RedisStore {
            client,
            timeout: config.timeout.max(Duration::from_millis(1)),
            failure: config.failure,
            script: Script::new(code),
            prefix: format!("rodizio:rl:{short}:"),
            limit: rules.rate.limit,
            window_ms,
            idle: Mutex::new(Vec::new()),
            retry_at_ms: AtomicU64::new(0),
            warned_at_ms: AtomicU64::new(0),
            refused: Mutex::new(HashMap::new()),
            epoch: Instant::now(),
            stats,
        })
    }

    /// Decides about the client whose table key is `key` (its IPv6
    /// addresses masked to `prefix` bits) at `now`.
    pub(super) fn check(&self, key: [u64; 2], prefix: u8, now: Instant) -> Decision {
        if let Some(until) = self.refused_until(key, now) {
            return Decision::Refused {
                first: false,
                retry_after: until - now,
            };
        }
        match self.ask(key, prefix, now) {
            Ok(decision) => {
                if let Decision::Refused { retry_after, .. } = decision {
                    self.remember_refused(key, now + retry_after, now);
                }
                decision
            }
            Err(why) => self.failed(&why, now),
        }
    }

    /// One round trip: a connection from the free list (or a new one),
    /// the script, the connection back to the list.
    fn ask(
        &self,
        key: [u64; 2],
        prefix: u8,
        now: Instant,
    ) -> std::result::Result<Decision, String> {
        let taken = self.idle.lock().pop();
        let mut con = match taken {
            Some(con) => con,
            None => self.open(now)?,
        };
        let result: redis::RedisResult<(i64, i64, i64)> = self
            .script
            .key(format!("{}{}", self.prefix, key_text(key, prefix)))
            .arg(self.limit)
            .arg(self.window_ms)
            .invoke(&mut con);
        match result {
            Ok((allowed, retry_us, first)) => {
                let mut idle = self.idle.lock();
                if idle.len() < MAX_IDLE {
                    idle.push(con);
                }
                drop(idle);
                Ok(if allowed == 1 {
                    Decision::Allowed
                } else {
                    Decision::Refused {
                        first: first == 1,
                        retry_after: Duration::from_micros(retry_us.max(1) as u64),
                    }
                })
            }
            // The connection is dropped: a reply that comes late must not
            // be taken for the answer to the next question.
            Err(err) => {
                self.hold_off(now);
                Err(format!("Redis: {err}"))
            }
        }
    }

    /// Opens a connection, unless a failure happened less than
    /// [`RECONNECT_INTERVAL`] ago.
    fn open(&self, now: Instant) -> std::result::Result<Connection, String> {
        let retry_at = self.retry_at_ms.load(Ordering::Relaxed);
        if retry_at != 0 && self.ms(now) < retry_at {
            return Err("Redis unreachable; the next try is at most a second away".into());
        }
        let connected = self
            .client
            .get_connection_with_timeout(self.timeout)
            .and_then(|con| {
                con.set_read_timeout(Some(self.timeout))?;
                con.set_write_timeout(Some(self.timeout))?;
                Ok(con)
            });
        match connected {
            Ok(con) => {
                if retry_at != 0 {
                    self.retry_at_ms.store(0, Ordering::Relaxed);
                    log::info!("rate limit store: Redis reachable again; the limit is shared");
                }
                Ok(con)
            }
            Err(err) => {
                self.hold_off(now);
                Err(format!("connecting to Redis: {err}"))
            }
        }
    }

    /// No new connection before [`RECONNECT_INTERVAL`] from `now`.
    fn hold_off(&self, now: Instant) {
        let at = self.ms(now) + RECONNECT_INTERVAL.as_millis() as u64;
        self.retry_at_ms.store(at.max(1), Ordering::Relaxed);
    }

    /// A check Redis could not answer: counted, warned about (at most every
    /// [`WARN_INTERVAL`]) and decided by the failure policy.
    fn failed(&self, why: &str, now: Instant) -> Decision {
        Stats::incr(&self.stats.rate_limit_store_failures);
        let ms = self.ms(now) + 1;
        let last = self.warned_at_ms.load(Ordering::Relaxed);
        let due = last == 0 || ms.saturating_sub(last) >= WARN_INTERVAL.as_millis() as u64;
        if due
            && self
                .warned_at_ms
                .compare_exchange(last, ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let what = match self.failure {
                FailurePolicy::Open => "clients are let through unchecked",
                FailurePolicy::Closed => "clients are refused",
            };
            log::warn!(
                "rate limit store failed ({why}); --rate-limit-store-failure {}: {what} \
                 (this warning repeats at most every {WARN_INTERVAL:?}; \
                 rate_limit_store_failures counts them all)",
                self.failure.name()
            );
        }
        match self.failure {
            FailurePolicy::Open => Decision::Allowed,
            FailurePolicy::Closed => Decision::Refused {
                first: false,
                retry_after: RECONNECT_INTERVAL,
            },
        }
    }

    /// Until when the client is known refused, if it is.
    fn refused_until(&self, key: [u64; 2], now: Instant) -> Option<Instant> {
        let mut refused = self.refused.lock();
        match refused.get(&key) {
            Some(&until) if until > now => Some(until),
            Some(_) => {
                refused.remove(&key);
                None
            }
            None => None,
        }
    }

    /// Remembers a refusal until `until`; when the cache is full, run-out
    /// entries are dropped first, and if none has run out the newcomer is
    /// simply not remembered (it then asks Redis again: slower, not wrong).
    fn remember_refused(&self, key: [u64; 2], until: Instant, now: Instant) {
        let mut refused = self.refused.lock();
        if refused.len() >= REFUSED_CACHE {
            refused.retain(|_, u| *u > now);
            if refused.len() >= REFUSED_CACHE {
                return;
            }
        }
        refused.insert(key, until);
    }

    fn ms(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.epoch).as_millis()).unwrap_or(u64::MAX)
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("failure", &self.failure)
            .finish_non_exhaustive()
    }
}

/// The client's address as the Redis key writes it: IPv4 as it is, IPv6 as
/// its masked prefix (`2001:db8::/64`), from the table key (see
/// [`super::Limiter`]'s `key`).
pub(super) fn key_text(key: [u64; 2], prefix: u8) -> String {
    let bits = (u128::from(key[0]) << 64) | u128::from(key[1]);
    if bits >> 32 == 0xffff {
        IpAddr::V4(Ipv4Addr::from(bits as u32)).to_string()
    } else {
        format!("{}/{prefix}", Ipv6Addr::from(bits))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_read_as_the_address_or_its_prefix() {
        let v4 = 0xffff_0000_0000u128 | u128::from(u32::from(Ipv4Addr::new(192, 0, 2, 7)));
        assert_eq!(key_text([(v4 >> 64) as u64, v4 as u64], 64), "192.0.2.7");
        let v6: u128 = "2001:db8::".parse::<Ipv6Addr>().unwrap().into();
        assert_eq!(
            key_text([(v6 >> 64) as u64, v6 as u64], 64),
            "2001:db8::/64"
        );
    }

    #[test]
    fn settings_are_checked() {
        assert!(StoreConfig::default().validate().is_ok());
        for bad in ["http://127.0.0.1:6379", "redis://", "127.0.0.1:6379"] {
            let c = StoreConfig {
                url: Some(bad.into()),
                ..StoreConfig::default()
            };
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains("rate_limit_store"), "{bad}: {err}");
        }
        let c = StoreConfig {
            url: Some("redis://127.0.0.1:6379/0".into()),
            timeout: Duration::ZERO,
            ..StoreConfig::default()
        };
        assert!(c.validate().is_err());
        assert_eq!("closed".parse(), Ok(FailurePolicy::Closed));
        assert!("ajar".parse::<FailurePolicy>().is_err());
    }

    /// A Redis that cannot be reached costs one connect attempt per
    /// second, not one per check, and the policy decides meanwhile.
    #[test]
    fn a_dead_redis_is_tried_once_per_second_and_the_policy_decides() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let stats = Arc::new(Stats::default());
        let rules = RateLimitConfig::new(super::super::Rate {
            limit: 1,
            window: Duration::from_secs(10),
        });
        for (policy, allowed) in [(FailurePolicy::Open, true), (FailurePolicy::Closed, false)] {
            let config = StoreConfig {
                url: Some(format!("redis://127.0.0.1:{port}/0")),
                failure: policy,
                ..StoreConfig::default()
            };
            let store = RedisStore::new(
                &config,
                config.url.as_deref().unwrap(),
                &rules,
                stats.clone(),
            )
            .unwrap();
            let now = Instant::now();
            let started = Instant::now();
            for _ in 0..100 {
                assert_eq!(store.check([0, 1], 64, now).is_allowed(), allowed);
            }
            assert!(
                started.elapsed() < Duration::from_secs(1),
                "{:?}",
                started.elapsed()
            );
            // One attempt failed and set the hold-off; the others waited for it.
            assert!(store.retry_at_ms.load(Ordering::Relaxed) >= 1000);
        }
        assert_eq!(stats.snapshot().rate_limit_store_failures, 200);
    }
}
