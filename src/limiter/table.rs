//! The bounded, sharded table of tracked clients: open addressing with
//! linear probing, backward-shift deletion, a fixed capacity per shard, and
//! the sweep and eviction that make room (see `docs/rate-limiting.md`).
//!
//! Each [`Shard`] is locked by its caller (the limiter) for one check; the
//! table itself takes no lock.
//!
//! # Corresponds to the C article
//!
//! The rate-limiting article's per-client hash table, with a bound.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::net::IpAddr;

use parking_lot::Mutex;

use super::rule::{Rule, Slot};

/// One shard on its own cache line, so two threads locking neighbouring
/// shards do not fight over one line.
#[repr(align(64))]
pub(super) struct Padded(pub(super) Mutex<Shard>);

/// What [`Shard::make_room`] did.
pub(super) struct Room {
    pub(super) swept: usize,
    pub(super) evicted: bool,
}

/// An open-addressing table with linear probing, fixed size.
///
/// The tick of each slot's last attempt lives in its own array, `seen`
/// (0: the slot is empty), so that looking for the least recently seen
/// entry reads 8 bytes per slot instead of 40.
pub(super) struct Shard {
    pub(super) slots: Box<[Slot]>,
    /// `seen[i]` is the tick of slot `i`'s last attempt; 0 if it is empty.
    pub(super) seen: Box<[u64]>,
    /// Occupied slots.
    pub(super) len: u32,
    /// Most occupied slots; `slots.len()` is a third more, so a probe always
    /// meets an empty slot and stays short.
    pub(super) cap: u32,
    /// No entry runs out before this tick (a lower bound: exact after a
    /// sweep, lowered by each insert). Lets a full shard skip the sweep
    /// when nothing can have run out, the common case in a flood.
    pub(super) run_out_at: u64,
}

impl Shard {
    pub(super) fn with_capacity(cap: usize) -> Shard {
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
    pub(super) fn home(&self, hash: u64) -> usize {
        (((hash & 0xffff_ffff) * self.slots.len() as u64) >> 32) as usize
    }

    /// `Ok(index)` of `key`, or `Err(index)` of the empty slot where it
    /// would go.
    pub(super) fn find(&self, key: [u64; 2], hash: u64) -> std::result::Result<usize, usize> {
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
    pub(super) fn remove(&mut self, i: usize, hasher: &KeyHasher) {
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
    /// or, if none has run out, evicts one entry chosen by [`Shard::victim`].
    pub(super) fn make_room(&mut self, t: u64, rule: &Rule, hasher: &KeyHasher) -> Room {
        if t >= self.run_out_at {
            let swept = self.sweep(t, rule, hasher);
            if swept > 0 {
                return Room {
                    swept,
                    evicted: false,
                };
            }
        }
        let victim = self.victim(t, rule);
        if let Some(i) = victim {
            self.remove(i, hasher);
        }
        Room {
            swept: 0,
            evicted: victim.is_some(),
        }
    }

    /// The entry to evict from a full shard where nothing has run out.
    ///
    /// An entry over its limit (its next attempt would be refused) holds
    /// the one fact the limiter exists for: forgetting it lets that client
    /// in again at once. An entry within its limit only loses part of an
    /// allowance it has not used. So the victim is the least recently seen
    /// entry *within* its limit; only when every entry of the shard is over
    /// its limit is one of those evicted, the one whose refusal ends
    /// soonest (it would have been let in first anyway).
    ///
    /// Cost: one pass over `seen` as before; the rule is asked about a slot
    /// only when its tick is older than the best candidate so far, which in
    /// a flood of new addresses is a handful of slots per pass. The second
    /// pass runs only in a shard that is entirely over its limit.
    fn victim(&self, t: u64, rule: &Rule) -> Option<usize> {
        let mut oldest_within = (u64::MAX, None);
        for (i, &seen) in self.seen.iter().enumerate() {
            if seen != 0
                && seen < oldest_within.0
                && rule.refused_until(&self.slots[i], t).is_none()
            {
                oldest_within = (seen, Some(i));
            }
        }
        if oldest_within.1.is_some() {
            return oldest_within.1;
        }
        // Every entry is over its limit: the refusal that ends first.
        let mut soonest = (u64::MAX, None);
        for (i, &seen) in self.seen.iter().enumerate() {
            if seen != 0 {
                let until = rule.refused_until(&self.slots[i], t).unwrap_or(0);
                if soonest.1.is_none() || until < soonest.0 {
                    soonest = (until, Some(i));
                }
            }
        }
        soonest.1
    }

    /// Removes every run-out entry and makes `run_out_at` exact again.
    pub(super) fn sweep(&mut self, t: u64, rule: &Rule, hasher: &KeyHasher) -> usize {
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

/// The table key of `ip`: IPv4 as its IPv4-mapped IPv6 form, IPv6
/// ANDed with `ipv6_mask` (its prefix).
pub(super) fn key_of(ip: IpAddr, ipv6_mask: u128) -> [u64; 2] {
    let bits = match ip.to_canonical() {
        IpAddr::V4(v4) => 0xffff_0000_0000 | u128::from(u32::from(v4)),
        // A masked IPv6 key cannot equal a mapped IPv4 key: canonical
        // IPv6 addresses are never in ::ffff:0:0/96, and masking only
        // clears bits, which cannot make bits 80..96 all ones.
        IpAddr::V6(v6) => u128::from(v6) & ipv6_mask,
    };
    [(bits >> 64) as u64, bits as u64]
}

/// A keyed hash of a 128-bit key: two rounds of "folded multiply" (the
/// 128-bit product's halves XORed) with random per-process seeds. Fast
/// (two multiplications) and, the seeds being secret, a client cannot aim
/// its addresses at one shard or one probe chain.
pub(super) struct KeyHasher {
    pub(super) seeds: [u64; 4],
}

impl KeyHasher {
    pub(super) fn new() -> KeyHasher {
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

    pub(super) fn hash(&self, key: [u64; 2]) -> u64 {
        let a = fold(key[0] ^ self.seeds[0], key[1] ^ self.seeds[1]);
        fold(a ^ self.seeds[2], self.seeds[3] | 1)
    }
}

pub(super) fn fold(a: u64, b: u64) -> u64 {
    let product = u128::from(a) * u128::from(b);
    (product as u64) ^ ((product >> 64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn slot_is_40_bytes() {
        assert_eq!(std::mem::size_of::<Slot>() + std::mem::size_of::<u64>(), 40);
        assert_eq!(std::mem::size_of::<Padded>(), 64);
    }
}
