//! The three ways to count a client's connections: fixed window, sliding
//! window (HAProxy's two-counter estimate), token bucket (GCRA). See
//! `docs/rate-limiting.md` for each.
//!
//! Pure arithmetic on one [`Slot`] and a tick, called with the client's
//! shard locked (so by one thread at a time for a given client).
//!
//! # Corresponds to the C article
//!
//! The rate-limiting article's `allow_request()` (the fixed window).

use std::time::Duration;

use super::{Decision, Rate, RateLimitAlgorithm, MAX_LIMIT};

/// High bit of [`Slot::count`]: "the refusal of this window was reported".
const REPORTED: u32 = 1 << 31;

/// The algorithm with its numbers in nanoseconds.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rule {
    algorithm: RateLimitAlgorithm,
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
    pub(super) fn new(algorithm: RateLimitAlgorithm, rate: Rate) -> Rule {
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
                RateLimitAlgorithm::FixedWindow => window,
                RateLimitAlgorithm::SlidingWindow => 2 * window,
                RateLimitAlgorithm::TokenBucket => 0,
            },
        }
    }

    /// The tick at which a slot with this `stamp` is back to the state of
    /// a new entry, so forgetting it changes no decision.
    pub(super) fn run_out_at(&self, stamp: u64) -> u64 {
        stamp.saturating_add(self.lifetime)
    }

    /// How much of the limit `slot` has used at tick `t`, without changing
    /// it (see `Limiter::used`).
    pub(super) fn used(&self, slot: &Slot, t: u64) -> u32 {
        match self.algorithm {
            RateLimitAlgorithm::FixedWindow | RateLimitAlgorithm::SlidingWindow => {
                if t.saturating_sub(slot.stamp) >= self.window {
                    0
                } else {
                    slot.count & !REPORTED
                }
            }
            RateLimitAlgorithm::TokenBucket => {
                let debt = slot.stamp.saturating_sub(t);
                let tokens = debt.div_ceil(self.interval).min(u64::from(self.limit));
                tokens as u32
            }
        }
    }

    /// When the slot's client is over its limit at tick `t` (its next
    /// attempt would be refused), the tick at which it would be let through
    /// again; `None` while it is within its limit. Asks [`Rule::decide`]
    /// about a copy, so the answer is exactly the decision an attempt would
    /// get, for every algorithm.
    pub(super) fn refused_until(&self, slot: &Slot, t: u64) -> Option<u64> {
        let mut copy = *slot;
        match self.decide(&mut copy, t) {
            Decision::Allowed => None,
            Decision::Refused { retry_after, .. } => {
                let wait = u64::try_from(retry_after.as_nanos()).unwrap_or(u64::MAX);
                Some(t.saturating_add(wait))
            }
        }
    }

    /// Counts one attempt at tick `t` against `slot`.
    pub(super) fn decide(&self, slot: &mut Slot, t: u64) -> Decision {
        match self.algorithm {
            RateLimitAlgorithm::FixedWindow => self.fixed(slot, t),
            RateLimitAlgorithm::SlidingWindow => self.sliding(slot, t),
            RateLimitAlgorithm::TokenBucket => self.token(slot, t),
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

/// One tracked client, with its `seen` tick kept apart (see the table's `Shard`):
/// 32 + 8 = 40 bytes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Slot {
    /// The client's key (see [`Limiter::key`]).
    pub(super) key: [u64; 2],
    /// Window start, or the token bucket's TAT (see [`Rule`]).
    pub(super) stamp: u64,
    /// Allowed in the current window; the high bit is [`REPORTED`].
    pub(super) count: u32,
    /// Allowed in the previous window (sliding), or the reported window
    /// (token bucket).
    pub(super) prev: u32,
}

impl Slot {
    pub(super) const EMPTY: Slot = Slot {
        key: [0, 0],
        stamp: 0,
        count: 0,
        prev: 0,
    };

    /// A new client at tick `t`: an open window with nothing counted, or a
    /// full bucket.
    pub(super) fn fresh(key: [u64; 2], t: u64) -> Slot {
        Slot {
            key,
            stamp: t,
            count: 0,
            prev: 0,
        }
    }
}
