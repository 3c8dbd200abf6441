//! Per-client-IP rate limiting at accept time, in a table of bounded size.
//!
//! When `--rate-limit N/WINDOW` is given, the accept loop asks
//! [`Limiter::check`] about every client right after `accept(2)`, before the
//! scheduler picks a backend and before anything is queued. A refused client
//! is counted, optionally sent a short `429` reply ([`refuse`]), and closed;
//! it never reaches a backend. Off by default, so the article's `ab` test
//! (every request from 127.0.0.1) behaves as it always did.
//!
//! # The algorithms
//!
//! [`Algorithm`] picks one of three ways to count; all three allow exactly
//! `N` connections from a fresh client in a burst, and a refused attempt is
//! never counted (a client that keeps knocking is not punished beyond the
//! limit; it simply stays refused until the algorithm lets one through).
//!
//! - **Fixed window** (the default, the design this project started from):
//!   a client's window opens at its first connection and lasts `WINDOW`; it
//!   may open `N` connections in it; the next connection after the window
//!   ends opens a new one. Cheap and easy to explain, with one known flaw,
//!   the *edge burst*: `N` connections at the very end of one window and `N`
//!   more at the start of the next pass, so up to `2N` get through in a span
//!   barely longer than the boundary (`docs/rate-limiting.md` shows it
//!   measured).
//! - **Sliding window**, the two-counter estimate HAProxy uses for
//!   `conn_rate`: windows follow each other back to back; the rate is
//!   estimated as `previous × (time left in the current window / WINDOW) +
//!   current`, and a connection is allowed when the estimate plus this one
//!   stays at most `N`. It smooths the edge burst away with two counters and
//!   no log of timestamps.
//! - **Token bucket**: a bucket of `N` tokens refilled at `N` per `WINDOW`
//!   (one every `WINDOW / N`); a connection takes a token. Written in its
//!   "virtual scheduling" form (GCRA): one timestamp, the *theoretical
//!   arrival time*, stands for the tokens, so refilling is arithmetic, not
//!   a timer.
//!
//! Time is a monotonic [`Instant`] passed in as `now`: the wall clock can
//! jump (NTP, an operator), a monotonic clock cannot, and passing it in lets
//! the tests walk through windows without sleeping.
//!
//! # The table: why this shape
//!
//! The state is 40 bytes per tracked client: a 32-byte `Slot` (the key,
//! which is the IPv4 address or the IPv6 address masked to
//! `--rate-limit-ipv6-prefix` bits, `/64` by default since one host usually
//! owns a whole `/64`; a timestamp; two counters whose meaning depends on
//! the algorithm) and, in an array of its own, the 8-byte tick of the
//! client's last attempt.
//!
//! Slots live in *shards* of about 256 clients each; the key's hash picks
//! the shard, and each shard is a small open-addressing table (linear
//! probing, backward-shift deletion, so no tombstones) behind its own
//! `parking_lot::Mutex`. The reasons:
//!
//! - **Memory is small and fixed.** Every shard allocates all of its slots
//!   at start-up, with a third more slots than clients (at most 75% full),
//!   so a tracked client costs `40 × 4/3 ≈ 53` bytes plus a share of the
//!   shard headers, under nginx's 64 bytes, and the whole table is paid for
//!   up front: no allocation on the accept path, no growth under attack.
//!   A `HashMap` would spend more (its buckets come in powers of two, so
//!   it is between 44% and 87% full, each bucket with the same 40 bytes
//!   and a control byte), and it grows by doubling.
//! - **Exact under contention.** A check holds its shard's lock for a few
//!   dozen instructions, so counts are exact: 8 threads racing on one IP
//!   let exactly `N` through. The accept loop is a single thread, so in the
//!   balancer the locks are never contended; the shards are there for
//!   callers with several threads and to keep each shard small.
//! - **Bounded worst case.** When a shard is full, inserting a new client
//!   reads the last-seen ticks of that one shard (about 340 of them, 2.7
//!   KiB, hence the separate array), never the whole table; the sweep of
//!   run-out entries is skipped while a per-shard watermark says none can
//!   have run out. The hash is keyed with a random seed per process, so a
//!   client cannot choose addresses that pile into one shard; even if it
//!   could, a probe never walks more than one shard.
//!
//! # When the table is full
//!
//! The table never holds more than `--rate-limit-max-clients` clients (each
//! shard has its share of the cap). Inserting a new client into a full
//! shard first *sweeps* it: every entry whose state has run out (its window
//! is over, its bucket refilled) is removed. Forgetting such an entry
//! changes no decision, since a new entry would start in the same state.
//! Only when nothing has run out is an entry *evicted*: the one seen least
//! recently (the one whose last attempt, allowed or refused, is oldest).
//! Eviction forgets live state: that client's count starts again. Choosing
//! the least recently *seen* entry means a client over its limit that keeps
//! connecting is always recent and so is never the one evicted, however
//! fast other addresses churn the table.
//!
//! The table is never cleared wholesale, which would be simpler: it would
//! let an attacker reset its own counter by making (or spoofing the source
//! of) enough new connections to fill the table.
//!
//! Because the cap is per shard, evictions can begin in one shard a little
//! before the table as a whole is full (measured: at 77% to 84% full with
//! shards of 256).
//!
//! # Logging
//!
//! [`Decision::Refused`] says whether this is the client's first refusal in
//! its current window; the accept loop logs only that one at `info`, so a
//! flood of refused connections is counted (`Stats::rate_limited`) but
//! cannot flood the log.
//!
//! # Corresponds to the C article
//!
//! No C counterpart in the balancer article. The rate-limiting article that
//! came with it sketches the fixed window (`allow_request()`, with a
//! `RateLimiter` of a counter and a window start) and per-client state in a
//! hash table; this module is that design with the races removed (the C
//! resets the window without a lock), a bound on the table, and the two
//! other algorithms the article describes.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::net::{IpAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use parking_lot::Mutex;

use crate::config::parse_duration;
use crate::error::{Error, Result};

/// Default of `--rate-limit-max-clients`.
pub const DEFAULT_MAX_CLIENTS: usize = 65536;
/// Largest `--rate-limit-max-clients`: 16 Mi clients, about 900 MB of table.
pub const MAX_MAX_CLIENTS: usize = 1 << 24;
/// Default of `--rate-limit-ipv6-prefix`: one host usually owns a `/64`.
pub const DEFAULT_IPV6_PREFIX: u8 = 64;
/// Largest `N` of `--rate-limit N/WINDOW` (the counters are 31 bits).
pub const MAX_LIMIT: u32 = 1_000_000_000;
/// Shortest `WINDOW` of `--rate-limit N/WINDOW`.
pub const MIN_WINDOW: Duration = Duration::from_millis(1);

/// Clients per shard the table aims at: small enough that a scan of a full
/// shard is well under a microsecond, large enough that the per-shard cap
/// lets the table fill to about 80% before the first eviction.
const SHARD_TARGET: usize = 256;

/// High bit of [`Slot::count`]: "the refusal of this window was reported".
const REPORTED: u32 = 1 << 31;

/// How connections are counted. See the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Algorithm {
    /// `N` per window; a window opens at a client's first connection.
    #[default]
    FixedWindow,
    /// HAProxy's two-counter estimate of the rate over the last window.
    SlidingWindow,
    /// A bucket of `N` tokens refilled at `N` per window.
    TokenBucket,
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Algorithm::FixedWindow => "fixed-window",
            Algorithm::SlidingWindow => "sliding-window",
            Algorithm::TokenBucket => "token-bucket",
        })
    }
}

/// What a refused client gets before it is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Reply {
    /// Nothing: the connection is closed at once.
    #[default]
    Close,
    /// `HTTP/1.1 429 Too Many Requests` with `Retry-After` and
    /// `Connection: close`, written once without blocking, then closed.
    Http,
}

/// `N` connections per `WINDOW`, as in `--rate-limit 100/1s`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Connections allowed per window, 1 to [`MAX_LIMIT`].
    pub limit: u32,
    /// The window, at least [`MIN_WINDOW`].
    pub window: Duration,
}

impl Rate {
    /// Parses `N/WINDOW`: `100/1s`, `20/10s`, `5/500ms`; a bare unit means
    /// one of it (`100/s`, `10/m`).
    ///
    /// # Errors
    ///
    /// A one-line message saying what is wrong, for clap to print.
    pub fn parse(text: &str) -> std::result::Result<Rate, String> {
        let usage = || format!("'{text}' is not a rate (examples: 100/1s, 20/10s, 5/500ms)");
        let (n, w) = text.trim().split_once('/').ok_or_else(usage)?;
        let limit: u32 = n.trim().parse().map_err(|_| usage())?;
        let w = w.trim();
        let window = if w.starts_with(|c: char| c.is_ascii_alphabetic()) {
            parse_duration(&format!("1{w}")).map_err(|_| usage())?
        } else {
            parse_duration(w)?
        };
        let rate = Rate { limit, window };
        rate.check().map_err(|e| format!("'{text}': {e}"))?;
        Ok(rate)
    }

    fn check(&self) -> std::result::Result<(), String> {
        if self.limit == 0 || self.limit > MAX_LIMIT {
            return Err(format!(
                "the number of connections must be 1..{MAX_LIMIT}, got {}",
                self.limit
            ));
        }
        if self.window < MIN_WINDOW {
            return Err(format!("the window must be at least {MIN_WINDOW:?}"));
        }
        Ok(())
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{:?}", self.limit, self.window)
    }
}

/// Everything the limiter needs; `Config::rate_limit` holds one when rate
/// limiting is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitConfig {
    /// `N` per `WINDOW`.
    pub rate: Rate,
    /// How to count. Default: fixed window.
    pub algorithm: Algorithm,
    /// Most clients tracked at once. Default [`DEFAULT_MAX_CLIENTS`].
    pub max_clients: usize,
    /// IPv6 clients are keyed by this many leading bits (1 to 128).
    /// Default [`DEFAULT_IPV6_PREFIX`].
    pub ipv6_prefix: u8,
    /// What a refused client gets. Default: closed at once.
    pub reply: Reply,
}

impl RateLimitConfig {
    /// `rate` with every other setting at its default.
    pub fn new(rate: Rate) -> RateLimitConfig {
        RateLimitConfig {
            rate,
            algorithm: Algorithm::default(),
            max_clients: DEFAULT_MAX_CLIENTS,
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
            reply: Reply::default(),
        }
    }

    /// Checks that every value is usable.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the flag of the first bad value.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::InvalidConfig(msg));
        if let Err(msg) = self.rate.check() {
            return bad(format!("--rate-limit: {msg}"));
        }
        if self.max_clients == 0 || self.max_clients > MAX_MAX_CLIENTS {
            return bad(format!(
                "--rate-limit-max-clients must be 1..{MAX_MAX_CLIENTS}, got {}",
                self.max_clients
            ));
        }
        if self.ipv6_prefix == 0 || self.ipv6_prefix > 128 {
            return bad(format!(
                "--rate-limit-ipv6-prefix must be 1..128, got {}",
                self.ipv6_prefix
            ));
        }
        Ok(())
    }
}

/// The rate-limiting flags, flattened into the balancer's flags.
#[derive(Debug, Args)]
pub struct RateLimitArgs {
    /// Limit each client IP to N new connections per WINDOW (e.g. 100/1s,
    /// 20/10s). Off by default.
    #[arg(long, value_name = "N/WINDOW", value_parser = Rate::parse)]
    pub rate_limit: Option<Rate>,
    /// How connections are counted [default: fixed-window].
    #[arg(long, value_enum, value_name = "ALGORITHM")]
    pub rate_limit_algorithm: Option<Algorithm>,
    /// Most client IPs tracked at once; the table is allocated at start-up,
    /// about 54 bytes per client [default: 65536].
    #[arg(
        long,
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..=MAX_MAX_CLIENTS as i64)
    )]
    pub rate_limit_max_clients: Option<u32>,
    /// IPv6 clients are limited per prefix of this many bits; 128 limits
    /// each address [default: 64].
    #[arg(
        long,
        value_name = "BITS",
        value_parser = clap::value_parser!(u8).range(1..=128)
    )]
    pub rate_limit_ipv6_prefix: Option<u8>,
    /// What a refused client gets: `close` (closed at once) or `http` (a
    /// minimal 429 reply, then closed) [default: close].
    #[arg(long, value_enum, value_name = "REPLY")]
    pub rate_limit_reply: Option<Reply>,
}

// The flags other than --rate-limit are Options with the defaults applied
// here, not clap defaults, so that one given without --rate-limit is an
// error instead of a setting silently ignored.
impl RateLimitArgs {
    /// The limiter settings, or `None` when `--rate-limit` is not given.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] when another `--rate-limit-*` flag is given
    /// without `--rate-limit`.
    pub fn to_config(&self) -> Result<Option<RateLimitConfig>> {
        let Some(rate) = self.rate_limit else {
            let given = [
                (
                    "--rate-limit-algorithm",
                    self.rate_limit_algorithm.is_some(),
                ),
                (
                    "--rate-limit-max-clients",
                    self.rate_limit_max_clients.is_some(),
                ),
                (
                    "--rate-limit-ipv6-prefix",
                    self.rate_limit_ipv6_prefix.is_some(),
                ),
                ("--rate-limit-reply", self.rate_limit_reply.is_some()),
            ];
            return match given.iter().find(|(_, is_given)| *is_given) {
                Some((flag, _)) => Err(Error::InvalidConfig(format!(
                    "{flag} needs --rate-limit N/WINDOW"
                ))),
                None => Ok(None),
            };
        };
        let defaults = RateLimitConfig::new(rate);
        Ok(Some(RateLimitConfig {
            rate,
            algorithm: self.rate_limit_algorithm.unwrap_or(defaults.algorithm),
            max_clients: self
                .rate_limit_max_clients
                .map_or(defaults.max_clients, |n| n as usize),
            ipv6_prefix: self.rate_limit_ipv6_prefix.unwrap_or(defaults.ipv6_prefix),
            reply: self.rate_limit_reply.unwrap_or(defaults.reply),
        }))
    }
}

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
}

/// One shard on its own cache line, so two threads locking neighbouring
/// shards do not fight over one line.
#[repr(align(64))]
struct Padded(Mutex<Shard>);

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
        }
    }

    /// The settings it was built with.
    pub fn config(&self) -> &RateLimitConfig {
        &self.config
    }

    /// Counts a connection from `ip` at `now` and says whether to let it
    /// through. Exact under contention: the client's shard is locked for
    /// the whole read-modify-write.
    pub fn check(&self, ip: IpAddr, now: Instant) -> Decision {
        let key = self.key(ip);
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

    /// The table key of `ip`: IPv4 as its IPv4-mapped IPv6 form, IPv6
    /// masked to the prefix. An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`,
    /// what a dual-stack listener reports for IPv4 clients) is first turned
    /// back into IPv4, so one client has one key whichever way it came.
    fn key(&self, ip: IpAddr) -> [u64; 2] {
        let bits = match ip.to_canonical() {
            IpAddr::V4(v4) => 0xffff_0000_0000 | u128::from(u32::from(v4)),
            // A masked IPv6 key cannot equal a mapped IPv4 key: canonical
            // IPv6 addresses are never in ::ffff:0:0/96, and masking only
            // clears bits, which cannot make bits 80..96 all ones.
            IpAddr::V6(v6) => u128::from(v6) & self.ipv6_mask,
        };
        [(bits >> 64) as u64, bits as u64]
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

/// The algorithm with its numbers in nanoseconds.
#[derive(Debug, Clone, Copy)]
struct Rule {
    algorithm: Algorithm,
    limit: u32,
    window: u64,
    /// Token bucket: one token comes back every `interval` ns.
    interval: u64,
    /// Token bucket: the bucket holds `burst / interval` = `limit` tokens.
    burst: u64,
    /// How long after its `stamp` a slot has run out: a fixed window is
    /// over after one window; a sliding window's count still weighs for one
    /// more; a token bucket is full again once `t` reaches its TAT.
    lifetime: u64,
}

impl Rule {
    fn new(algorithm: Algorithm, rate: Rate) -> Rule {
        let window = u64::try_from(rate.window.as_nanos())
            .unwrap_or(u64::MAX / 4)
            .clamp(1, u64::MAX / 4);
        let limit = rate.limit.clamp(1, MAX_LIMIT);
        let interval = (window / u64::from(limit)).max(1);
        Rule {
            algorithm,
            limit,
            window,
            interval,
            burst: interval * u64::from(limit),
            lifetime: match algorithm {
                Algorithm::FixedWindow => window,
                Algorithm::SlidingWindow => 2 * window,
                Algorithm::TokenBucket => 0,
            },
        }
    }

    /// The tick at which a slot with this `stamp` is back to the state of
    /// a new entry, so forgetting it changes no decision.
    fn run_out_at(&self, stamp: u64) -> u64 {
        stamp.saturating_add(self.lifetime)
    }

    /// Counts one attempt at tick `t` against `slot`.
    fn decide(&self, slot: &mut Slot, t: u64) -> Decision {
        match self.algorithm {
            Algorithm::FixedWindow => self.fixed(slot, t),
            Algorithm::SlidingWindow => self.sliding(slot, t),
            Algorithm::TokenBucket => self.token(slot, t),
        }
    }

    /// `stamp`: window start; `count`: connections allowed in it.
    fn fixed(&self, slot: &mut Slot, t: u64) -> Decision {
        if t.saturating_sub(slot.stamp) >= self.window {
            slot.stamp = t;
            slot.count = 0;
        }
        if slot.count & !REPORTED < self.limit {
            slot.count += 1;
            return Decision::Allowed;
        }
        refused(slot, (slot.stamp + self.window).saturating_sub(t))
    }

    /// `stamp`: start of the current window; `count`: allowed in it;
    /// `prev`: allowed in the window before it.
    fn sliding(&self, slot: &mut Slot, t: u64) -> Decision {
        let w = self.window;
        let age = t.saturating_sub(slot.stamp);
        if age >= w {
            if age < 2 * w {
                // The next window, back to back: today becomes yesterday.
                slot.prev = slot.count & !REPORTED;
                slot.stamp += w;
            } else {
                // Idle for a whole window or more: nothing to carry over.
                slot.prev = 0;
                slot.stamp = t;
            }
            slot.count = 0;
        }
        let elapsed = t.saturating_sub(slot.stamp).min(w);
        let current = slot.count & !REPORTED;
        // estimate = prev × (w − elapsed)/w + current; allow when
        // estimate + 1 ≤ limit. Multiplied through by w to stay in integers.
        let weighted = u128::from(slot.prev) * u128::from(w - elapsed)
            + (u128::from(current) + 1) * u128::from(w);
        if weighted <= u128::from(self.limit) * u128::from(w) {
            slot.count += 1;
            return Decision::Allowed;
        }
        // Conservative hint: by the end of this window the estimate has
        // fallen by at least the previous window's remaining weight.
        refused(slot, (slot.stamp + w).saturating_sub(t))
    }

    /// `stamp`: the theoretical arrival time (TAT) of the next token: the
    /// bucket is full when `stamp ≤ t`, and holds `(burst − (stamp − t)) /
    /// interval` tokens otherwise. `prev`: the window number (plus one) of
    /// the last reported refusal.
    fn token(&self, slot: &mut Slot, t: u64) -> Decision {
        let tat = slot.stamp.max(t);
        let debt = tat - t + self.interval;
        if debt <= self.burst {
            slot.stamp = tat + self.interval;
            return Decision::Allowed;
        }
        // No window here: report at most once per WINDOW-long slice of time.
        let window = ((t / self.window) % u64::from(u32::MAX)) as u32 + 1;
        let first = slot.prev != window;
        slot.prev = window;
        Decision::Refused {
            first,
            retry_after: Duration::from_nanos(debt - self.burst),
        }
    }
}

/// A refusal in a windowed algorithm: first one of the window is reported.
fn refused(slot: &mut Slot, wait: u64) -> Decision {
    let first = slot.count & REPORTED == 0;
    slot.count |= REPORTED;
    Decision::Refused {
        first,
        retry_after: Duration::from_nanos(wait),
    }
}

/// One tracked client, with its `seen` tick kept apart (see [`Shard`]):
/// 32 + 8 = 40 bytes.
#[derive(Debug, Clone, Copy)]
struct Slot {
    /// The client's key (see [`Limiter::key`]).
    key: [u64; 2],
    /// Window start, or the token bucket's TAT (see [`Rule`]).
    stamp: u64,
    /// Allowed in the current window; the high bit is [`REPORTED`].
    count: u32,
    /// Allowed in the previous window (sliding), or the reported window
    /// (token bucket).
    prev: u32,
}

impl Slot {
    const EMPTY: Slot = Slot {
        key: [0, 0],
        stamp: 0,
        count: 0,
        prev: 0,
    };

    /// A new client at tick `t`: an open window with nothing counted, or a
    /// full bucket.
    fn fresh(key: [u64; 2], t: u64) -> Slot {
        Slot {
            key,
            stamp: t,
            count: 0,
            prev: 0,
        }
    }
}

/// What [`Shard::make_room`] did.
struct Room {
    swept: usize,
    evicted: bool,
}

/// An open-addressing table with linear probing, fixed size.
///
/// The tick of each slot's last attempt lives in its own array, `seen`
/// (0: the slot is empty), so that looking for the least recently seen
/// entry reads 8 bytes per slot instead of 40.
struct Shard {
    slots: Box<[Slot]>,
    /// `seen[i]` is the tick of slot `i`'s last attempt; 0 if it is empty.
    seen: Box<[u64]>,
    /// Occupied slots.
    len: u32,
    /// Most occupied slots; `slots.len()` is a third more, so a probe always
    /// meets an empty slot and stays short.
    cap: u32,
    /// No entry runs out before this tick (a lower bound: exact after a
    /// sweep, lowered by each insert). Lets a full shard skip the sweep
    /// when nothing can have run out, the common case in a flood.
    run_out_at: u64,
}

impl Shard {
    fn with_capacity(cap: usize) -> Shard {
        let n = cap + cap / 3 + 1;
        Shard {
            slots: vec![Slot::EMPTY; n].into_boxed_slice(),
            seen: vec![0; n].into_boxed_slice(),
            len: 0,
            cap: u32::try_from(cap).unwrap_or(u32::MAX),
            run_out_at: u64::MAX,
        }
    }

    /// Where a hash starts probing: the low 32 bits scaled to the table
    /// (the high bits chose the shard), which works for any table size.
    fn home(&self, hash: u64) -> usize {
        (((hash & 0xffff_ffff) * self.slots.len() as u64) >> 32) as usize
    }

    /// `Ok(index)` of `key`, or `Err(index)` of the empty slot where it
    /// would go.
    fn find(&self, key: [u64; 2], hash: u64) -> std::result::Result<usize, usize> {
        let n = self.slots.len();
        let mut i = self.home(hash);
        loop {
            if self.seen[i] == 0 {
                return Err(i);
            }
            if self.slots[i].key == key {
                return Ok(i);
            }
            i = if i + 1 == n { 0 } else { i + 1 };
        }
    }

    /// Empties slot `i` and shifts back the entries after it that probed
    /// past it, so every entry stays reachable from its home with no
    /// tombstone left behind.
    fn remove(&mut self, i: usize, hasher: &KeyHasher) {
        let n = self.slots.len();
        let mut hole = i;
        let mut j = i;
        loop {
            j = if j + 1 == n { 0 } else { j + 1 };
            if self.seen[j] == 0 {
                break;
            }
            let home = self.home(hasher.hash(self.slots[j].key));
            // The entry at j may fill the hole unless its home lies
            // (cyclically) after the hole, in (hole, j].
            if (j + n - home) % n >= (j + n - hole) % n {
                self.slots[hole] = self.slots[j];
                self.seen[hole] = self.seen[j];
                hole = j;
            }
        }
        self.slots[hole] = Slot::EMPTY;
        self.seen[hole] = 0;
        self.len -= 1;
    }

    /// Frees at least one slot of a full shard: sweeps every run-out entry,
    /// or, if none has run out, evicts the least recently seen one.
    fn make_room(&mut self, t: u64, rule: &Rule, hasher: &KeyHasher) -> Room {
        if t >= self.run_out_at {
            let swept = self.sweep(t, rule, hasher);
            if swept > 0 {
                return Room {
                    swept,
                    evicted: false,
                };
            }
        }
        // Nothing has run out: evict the least recently seen entry.
        let mut oldest = (u64::MAX, None);
        for (i, &seen) in self.seen.iter().enumerate() {
            if seen != 0 && seen < oldest.0 {
                oldest = (seen, Some(i));
            }
        }
        if let (_, Some(i)) = oldest {
            self.remove(i, hasher);
        }
        Room {
            swept: 0,
            evicted: oldest.1.is_some(),
        }
    }

    /// Removes every run-out entry and makes `run_out_at` exact again.
    fn sweep(&mut self, t: u64, rule: &Rule, hasher: &KeyHasher) -> usize {
        let mut swept = 0;
        let mut next_run_out = u64::MAX;
        let mut i = 0;
        while i < self.slots.len() {
            if self.seen[i] != 0 {
                let run_out = rule.run_out_at(self.slots[i].stamp);
                if run_out <= t {
                    // Removing shifts a later entry into `i`: look at it
                    // again.
                    self.remove(i, hasher);
                    swept += 1;
                    continue;
                }
                next_run_out = next_run_out.min(run_out);
            }
            i += 1;
        }
        self.run_out_at = next_run_out;
        swept
    }
}

/// A keyed hash of a 128-bit key: two rounds of "folded multiply" (the
/// 128-bit product's halves XORed) with random per-process seeds. Fast
/// (two multiplications) and, the seeds being secret, a client cannot aim
/// its addresses at one shard or one probe chain.
struct KeyHasher {
    seeds: [u64; 4],
}

impl KeyHasher {
    fn new() -> KeyHasher {
        // std's RandomState is seeded from the OS's random source.
        let state = RandomState::new();
        let mut seeds = [0u64; 4];
        for (i, seed) in seeds.iter_mut().enumerate() {
            let mut h = state.build_hasher();
            h.write_usize(i);
            *seed = h.finish();
        }
        KeyHasher { seeds }
    }

    fn hash(&self, key: [u64; 2]) -> u64 {
        let a = fold(key[0] ^ self.seeds[0], key[1] ^ self.seeds[1]);
        fold(a ^ self.seeds[2], self.seeds[3] | 1)
    }
}

fn fold(a: u64, b: u64) -> u64 {
    let product = u128::from(a) * u128::from(b);
    (product as u64) ^ ((product >> 64) as u64)
}

/// The body of the 429 reply.
const BODY_429: &str = "Too many connections from your address; try again later.\n";

/// Ends a refused client without ever blocking the caller: with
/// [`Reply::Http`], a short 429 reply with `Retry-After` goes out through
/// [`crate::health::reply_at_once`] (one non-blocking write, a FIN, the
/// client's pending bytes read so that the close sends no reset). Then the
/// socket is closed.
pub fn refuse(client: TcpStream, reply: Reply, retry_after: Duration) {
    if reply == Reply::Http {
        let secs = retry_after
            .as_secs()
            .saturating_add(u64::from(retry_after.subsec_nanos() > 0))
            .max(1);
        let response = format!(
            "HTTP/1.1 429 Too Many Requests\r\nRetry-After: {secs}\r\nConnection: close\r\n\
             Content-Type: text/plain\r\nContent-Length: {}\r\n\r\n{BODY_429}",
            BODY_429.len()
        );
        crate::health::reply_at_once(&client, response.as_bytes());
    }
    drop(client);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};
    use std::sync::atomic::AtomicU32;
    use std::sync::Arc;

    const S: Duration = Duration::from_secs(1);

    fn limiter(algorithm: Algorithm, limit: u32, window: Duration) -> Limiter {
        Limiter::new(&RateLimitConfig {
            algorithm,
            ..RateLimitConfig::new(Rate { limit, window })
        })
    }

    fn ip(n: u32) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(n))
    }

    /// How many of `tries` attempts at `now` are allowed.
    fn allowed(l: &Limiter, ip: IpAddr, now: Instant, tries: u32) -> u32 {
        (0..tries).filter(|_| l.check(ip, now).is_allowed()).count() as u32
    }

    #[test]
    fn slot_is_40_bytes() {
        assert_eq!(std::mem::size_of::<Slot>() + std::mem::size_of::<u64>(), 40);
        assert_eq!(std::mem::size_of::<Padded>(), 64);
    }

    #[test]
    fn every_algorithm_allows_exactly_n_then_refuses() {
        for algorithm in [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::TokenBucket,
        ] {
            let l = limiter(algorithm, 5, 10 * S);
            let t0 = Instant::now();
            for i in 0..5 {
                assert!(
                    l.check(ip(1), t0 + Duration::from_millis(i)).is_allowed(),
                    "{algorithm}: attempt {i}"
                );
            }
            match l.check(ip(1), t0 + Duration::from_millis(10)) {
                Decision::Refused { first, retry_after } => {
                    assert!(first, "{algorithm}");
                    assert!(retry_after > Duration::ZERO && retry_after <= 10 * S);
                }
                Decision::Allowed => panic!("{algorithm}: sixth allowed"),
            }
            // Further refusals in the window are not "first".
            assert!(
                matches!(
                    l.check(ip(1), t0 + Duration::from_millis(20)),
                    Decision::Refused { first: false, .. }
                ),
                "{algorithm}"
            );
            // Another client is unaffected.
            assert_eq!(allowed(&l, ip(2), t0 + S, 5), 5, "{algorithm}");
            // Long after, a whole burst is allowed again.
            assert_eq!(allowed(&l, ip(1), t0 + 100 * S, 6), 5, "{algorithm}");
        }
    }

    #[test]
    fn fixed_window_opens_again_after_the_window() {
        let l = limiter(Algorithm::FixedWindow, 3, 10 * S);
        let t0 = Instant::now();
        assert_eq!(allowed(&l, ip(1), t0, 4), 3);
        assert_eq!(
            allowed(&l, ip(1), t0 + 10 * S - Duration::from_nanos(1), 1),
            0
        );
        assert_eq!(allowed(&l, ip(1), t0 + 10 * S, 3), 3);
        // The new window's first refusal is reported again, once.
        assert!(matches!(
            l.check(ip(1), t0 + 11 * S),
            Decision::Refused { first: true, .. }
        ));
        assert!(matches!(
            l.check(ip(1), t0 + 12 * S),
            Decision::Refused { first: false, .. }
        ));
    }

    #[test]
    fn fixed_window_edge_burst_lets_2n_through_across_a_boundary() {
        let n = 10;
        let l = limiter(Algorithm::FixedWindow, n, 10 * S);
        let t0 = Instant::now();
        // One connection opens the window at t0; the other n-1 come at its
        // very end, n more right after it: 2n-1 within 2 ms, 2n within one
        // window length.
        assert!(l.check(ip(1), t0).is_allowed());
        let edge = t0 + 10 * S;
        let before = allowed(&l, ip(1), edge - Duration::from_millis(1), n);
        let after = allowed(&l, ip(1), edge + Duration::from_millis(1), n + 1);
        assert_eq!(1 + before + after, 2 * n);
        // The sliding window refuses most of that second burst.
        let s = limiter(Algorithm::SlidingWindow, n, 10 * S);
        assert!(s.check(ip(1), t0).is_allowed());
        let before = allowed(&s, ip(1), edge - Duration::from_millis(1), n);
        let after = allowed(&s, ip(1), edge + Duration::from_millis(1), n + 1);
        assert_eq!(1 + before, n);
        assert_eq!(after, 0);
    }

    #[test]
    fn sliding_window_weighs_the_previous_window() {
        let l = limiter(Algorithm::SlidingWindow, 10, 10 * S);
        let t0 = Instant::now();
        assert_eq!(allowed(&l, ip(1), t0, 10), 10);
        // Halfway through the next window the previous 10 weigh 5: five more.
        assert_eq!(allowed(&l, ip(1), t0 + 15 * S, 10), 5);
        // At 80%, they weigh 2: 2 + 5 + 3 = 10.
        assert_eq!(allowed(&l, ip(1), t0 + 18 * S, 10), 3);
        // In the window after, the 8 of the last window weigh 8 × 0.9.
        // 7.2 + 1 ≤ 10, 7.2 + 2 ≤ 10, 7.2 + 3 > 10: two more.
        assert_eq!(allowed(&l, ip(1), t0 + 21 * S, 10), 2);
        // After two idle windows nothing carries over.
        assert_eq!(allowed(&l, ip(1), t0 + 60 * S, 11), 10);
    }

    #[test]
    fn token_bucket_refills_one_token_per_interval() {
        // 10 per 10 s: one token per second, bucket of 10.
        let l = limiter(Algorithm::TokenBucket, 10, 10 * S);
        let t0 = Instant::now();
        assert_eq!(allowed(&l, ip(1), t0, 11), 10);
        assert_eq!(allowed(&l, ip(1), t0 + S / 2, 1), 0);
        assert_eq!(allowed(&l, ip(1), t0 + S, 2), 1);
        assert_eq!(allowed(&l, ip(1), t0 + 5 * S, 10), 4);
        match l.check(ip(1), t0 + 5 * S) {
            Decision::Refused { retry_after, .. } => assert_eq!(retry_after, S),
            other => panic!("{other:?}"),
        }
        // Never more than the bucket, however long the wait.
        assert_eq!(allowed(&l, ip(1), t0 + 1000 * S, 20), 10);
    }

    #[test]
    fn token_bucket_reports_once_per_window() {
        let l = limiter(Algorithm::TokenBucket, 2, 10 * S);
        let t0 = Instant::now();
        assert_eq!(allowed(&l, ip(1), t0, 2), 2);
        let firsts = (0..100)
            .filter(|i| {
                matches!(
                    l.check(ip(1), t0 + Duration::from_millis(*i)),
                    Decision::Refused { first: true, .. }
                )
            })
            .count();
        assert_eq!(firsts, 1);
    }

    #[test]
    fn contention_allows_exactly_n() {
        for algorithm in [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::TokenBucket,
        ] {
            let l = Arc::new(limiter(algorithm, 1000, 60 * S));
            let t0 = Instant::now();
            let total = Arc::new(AtomicU32::new(0));
            let threads: Vec<_> = (0..8)
                .map(|_| {
                    let (l, total) = (Arc::clone(&l), Arc::clone(&total));
                    std::thread::spawn(move || {
                        // Everyone within one window (a few ms of the 60 s).
                        for _ in 0..5000 {
                            let now = Instant::now().max(t0);
                            if l.check(ip(7), now).is_allowed() {
                                total.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            assert_eq!(total.load(Ordering::Relaxed), 1000, "{algorithm}");
        }
    }

    #[test]
    fn ipv6_is_keyed_by_prefix() {
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        let t0 = Instant::now();
        let l = limiter(Algorithm::FixedWindow, 2, 10 * S);
        assert_eq!(allowed(&l, a, t0, 1) + allowed(&l, b, t0, 2), 2);
        assert_eq!(allowed(&l, c, t0, 2), 2);
        let per_address = Limiter::new(&RateLimitConfig {
            ipv6_prefix: 128,
            ..RateLimitConfig::new(Rate {
                limit: 2,
                window: 10 * S,
            })
        });
        assert_eq!(allowed(&per_address, a, t0, 3), 2);
        assert_eq!(allowed(&per_address, b, t0, 3), 2);
    }

    #[test]
    fn ipv4_mapped_ipv6_is_the_ipv4_client() {
        let l = limiter(Algorithm::FixedWindow, 2, 10 * S);
        let t0 = Instant::now();
        let v4 = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
        let mapped = IpAddr::V6(Ipv4Addr::new(192, 0, 2, 1).to_ipv6_mapped());
        assert_eq!(allowed(&l, v4, t0, 1) + allowed(&l, mapped, t0, 2), 2);
        // And ::/64 (which would mask ::ffff:... to zero) is another client.
        assert_eq!(allowed(&l, IpAddr::V6(Ipv6Addr::LOCALHOST), t0, 2), 2);
    }

    #[test]
    fn run_out_entries_are_swept_before_any_eviction() {
        let l = Limiter::new(&RateLimitConfig {
            max_clients: 100,
            ..RateLimitConfig::new(Rate {
                limit: 1,
                window: 10 * S,
            })
        });
        assert_eq!(l.shard_count(), 1);
        let t0 = Instant::now();
        for n in 0..100 {
            assert!(l.check(ip(n), t0).is_allowed());
        }
        assert_eq!(l.len(), 100);
        // A new window: the 100 have run out; a newcomer sweeps them all.
        assert!(l.check(ip(1000), t0 + 10 * S).is_allowed());
        assert_eq!((l.len(), l.swept(), l.evictions()), (1, 100, 0));
    }

    #[test]
    fn full_table_evicts_the_least_recently_seen() {
        let l = Limiter::new(&RateLimitConfig {
            max_clients: 4,
            ..RateLimitConfig::new(Rate {
                limit: 1,
                window: 60 * S,
            })
        });
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        for n in 0..4 {
            assert!(l.check(ip(n), at(u64::from(n))).is_allowed());
        }
        // Client 0 comes back (refused) and so is recent; 1 is now oldest.
        assert!(!l.check(ip(0), at(10)).is_allowed());
        assert!(l.check(ip(99), at(11)).is_allowed());
        assert_eq!((l.len(), l.evictions(), l.swept()), (4, 1, 0));
        // Client 1 was forgotten: allowed again. Client 0 was kept: refused.
        assert!(l.check(ip(1), at(12)).is_allowed());
        assert!(!l.check(ip(0), at(13)).is_allowed());
    }

    #[test]
    fn a_million_addresses_never_exceed_the_cap_nor_free_the_attacker() {
        let cap = 4096;
        let l = Limiter::new(&RateLimitConfig {
            max_clients: cap,
            ..RateLimitConfig::new(Rate {
                limit: 5,
                window: 60 * S,
            })
        });
        let t0 = Instant::now();
        let attacker = IpAddr::V4(Ipv4Addr::new(203, 0, 113, 7));
        assert_eq!(allowed(&l, attacker, t0, 10), 5);
        for n in 0..1_000_000u32 {
            // All within one window: 1 µs apart, one second in all.
            let now = t0 + Duration::from_micros(u64::from(n) + 1);
            // 10.x.x.x: never the attacker's address.
            assert!(l.check(ip(0x0a00_0000 + n), now).is_allowed());
            if n % 500 == 0 {
                assert!(
                    !l.check(attacker, now).is_allowed(),
                    "attacker let through after {n} other clients"
                );
            }
            if n % 65536 == 0 {
                assert!(l.len() <= cap);
            }
        }
        assert!(l.len() <= cap && l.len() > cap / 2, "{}", l.len());
        assert!(l.evictions() > 900_000, "{}", l.evictions());
        assert_eq!(l.capacity(), cap);
    }

    /// Every occupied slot is found from its home, and no key is there twice.
    fn assert_table_is_sound(l: &Limiter) {
        for shard in l.shards.iter() {
            let shard = shard.0.lock();
            let occupied: Vec<usize> = (0..shard.slots.len())
                .filter(|&i| shard.seen[i] != 0)
                .collect();
            assert_eq!(occupied.len(), shard.len as usize);
            assert!(shard.len <= shard.cap);
            for i in occupied {
                let key = shard.slots[i].key;
                assert_eq!(shard.find(key, l.hasher.hash(key)), Ok(i));
                // The watermark never promises more than the truth.
                assert!(shard.run_out_at <= l.rule.run_out_at(shard.slots[i].stamp));
            }
        }
    }

    #[test]
    fn sweeps_and_evictions_keep_every_entry_reachable() {
        // A small, crowded table with mixed expiry, so removals shift long
        // probe chains, including ones that wrap around the end.
        for algorithm in [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::TokenBucket,
        ] {
            let l = Limiter::new(&RateLimitConfig {
                max_clients: 50,
                algorithm,
                ..RateLimitConfig::new(Rate {
                    limit: 1,
                    // A sliding window's state lasts two windows.
                    window: Duration::from_millis(if algorithm == Algorithm::SlidingWindow {
                        17
                    } else {
                        50
                    }),
                })
            });
            let t0 = Instant::now();
            let mut x: u32 = 12345;
            for step in 0..20_000u64 {
                // A small xorshift: repeatable pseudo-random client numbers.
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                l.check(ip(x % 100), t0 + Duration::from_millis(step / 3));
                if step % 97 == 0 {
                    assert_table_is_sound(&l);
                }
            }
            assert_table_is_sound(&l);
            assert!(
                l.swept() > 100 && l.evictions() > 100,
                "{algorithm}: {} swept, {} evicted",
                l.swept(),
                l.evictions()
            );
        }
    }

    #[test]
    fn memory_per_client_is_under_64_bytes() {
        let l = limiter(Algorithm::FixedWindow, 1, S);
        let per_client = l.memory_bytes() as f64 / l.capacity() as f64;
        assert!(per_client <= 64.0, "{per_client}");
        assert_eq!(l.capacity(), DEFAULT_MAX_CLIENTS);
    }

    #[test]
    fn rates_parse() {
        assert_eq!(
            Rate::parse("100/1s"),
            Ok(Rate {
                limit: 100,
                window: S
            })
        );
        assert_eq!(Rate::parse("20/10s").unwrap().window, 10 * S);
        assert_eq!(
            Rate::parse("5/500ms").unwrap().window,
            Duration::from_millis(500)
        );
        assert_eq!(Rate::parse("10/m").unwrap().window, 60 * S);
        for bad in [
            "", "100", "/1s", "0/1s", "x/1s", "10/0s", "10/1x", "-1/1s", "5/0.5ms",
        ] {
            assert!(Rate::parse(bad).is_err(), "accepted {bad:?}");
        }
    }

    #[test]
    fn flags_build_the_config() {
        use crate::cli::Cli;
        use clap::Parser;
        let cli = Cli::try_parse_from(["rodizio"]).unwrap();
        assert!(cli.balancer.to_config().unwrap().rate_limit.is_none());
        let cli = Cli::try_parse_from([
            "rodizio",
            "--rate-limit",
            "20/10s",
            "--rate-limit-algorithm",
            "token-bucket",
            "--rate-limit-max-clients",
            "1000",
            "--rate-limit-ipv6-prefix",
            "128",
            "--rate-limit-reply",
            "http",
        ])
        .unwrap();
        let rl = cli.balancer.to_config().unwrap().rate_limit.unwrap();
        assert_eq!(
            rl,
            RateLimitConfig {
                rate: Rate {
                    limit: 20,
                    window: 10 * S
                },
                algorithm: Algorithm::TokenBucket,
                max_clients: 1000,
                ipv6_prefix: 128,
                reply: Reply::Http,
            }
        );
        assert!(rl.validate().is_ok());
        let cli = Cli::try_parse_from(["rodizio", "--rate-limit", "100/1s"]).unwrap();
        assert_eq!(
            cli.balancer.to_config().unwrap().rate_limit,
            Some(RateLimitConfig::new(Rate {
                limit: 100,
                window: S
            }))
        );
        for args in [
            vec!["rodizio", "--rate-limit", "lots"],
            vec!["rodizio", "--rate-limit", "0/1s"],
            vec!["rodizio", "--rate-limit-algorithm", "leaky"],
            vec!["rodizio", "--rate-limit-max-clients", "0"],
            vec!["rodizio", "--rate-limit-ipv6-prefix", "129"],
            vec!["rodizio", "--rate-limit-reply", "teapot"],
        ] {
            let err = Cli::try_parse_from(&args).unwrap_err();
            let line = crate::cli::one_line(&err);
            assert!(line.starts_with("error:"), "{args:?}: {line}");
        }
        // The other flags mean nothing without a limit: a usage error.
        let cli = Cli::try_parse_from(["rodizio", "--rate-limit-reply", "http"]).unwrap();
        let err = cli.balancer.to_config().unwrap_err();
        assert!(err.is_usage());
        assert!(err
            .to_string()
            .contains("--rate-limit-reply needs --rate-limit"));
    }

    #[test]
    fn http_refusal_is_a_429_and_a_close() {
        use std::io::Read;
        use std::net::{TcpListener, TcpStream};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        client.set_read_timeout(Some(5 * S)).unwrap();
        let (server_side, _) = listener.accept().unwrap();
        refuse(server_side, Reply::Http, Duration::from_millis(2500));
        let mut reply = String::new();
        client.read_to_string(&mut reply).unwrap();
        assert!(
            reply.starts_with("HTTP/1.1 429 Too Many Requests\r\n"),
            "{reply}"
        );
        assert!(reply.contains("\r\nRetry-After: 3\r\n"), "{reply}");
        assert!(reply.contains("\r\nConnection: close\r\n"), "{reply}");
        assert!(reply.ends_with(BODY_429));
    }
}
