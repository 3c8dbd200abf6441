//! Connections open now per client address (the per-client cap,
//! nginx's `limit_conn`, HAProxy's `sc_conn_cur`): a bounded, sharded table
//! of counts, keyed as the rate limiter keys its clients (IPv4 whole, IPv6
//! by its prefix, `rate_limit_ipv6_prefix`).
//!
//! [`ConnTable::take`] counts a client in and gives a [`Place`]; dropping
//! the place (the worker, when the connection ends, or whoever closes a
//! refused client) counts it out, and an address whose count reaches 0
//! leaves the table. So the table holds only addresses with connections
//! open, never more than its `max_clients` (the limiter's
//! `rate_limit_max_clients`): all its memory is allocated when it is made.
//! When it is full, a new address is refused, as nginx does when its zone
//! is exhausted: serving it uncounted would let a client past its cap.
//!
//! # Threads
//!
//! The accept loops (and workers behind `--accept-proxy`) take places; the
//! workers drop them. Each shard has its own lock, held for a probe of a
//! few slots, never across I/O.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::table::{key_of, KeyHasher};
use crate::throttle::LogThrottle;

/// Addresses per shard the table aims at (as the limiter's).
const SHARD_TARGET: usize = 256;

/// One address and its open connections; `count == 0`: an empty slot.
#[derive(Clone, Copy)]
struct Entry {
    key: [u64; 2],
    count: u32,
}

const EMPTY: Entry = Entry {
    key: [0; 2],
    count: 0,
};

/// One shard on its own cache line.
#[repr(align(64))]
struct Shard(Mutex<Counts>);

/// Open addressing with linear probing and backward-shift deletion, of a
/// fixed size: a third more slots than `cap`, so a probe always ends.
struct Counts {
    slots: Box<[Entry]>,
    len: u32,
    cap: u32,
}

impl Counts {
    fn with_capacity(cap: usize) -> Counts {
        Counts {
            slots: vec![EMPTY; cap + cap / 3 + 1].into_boxed_slice(),
            len: 0,
            cap: u32::try_from(cap).unwrap_or(u32::MAX),
        }
    }

    fn home(&self, hash: u64) -> usize {
        (((hash & 0xffff_ffff) * self.slots.len() as u64) >> 32) as usize
    }

    /// `Ok(index)` of `key`, or `Err(index)` of the empty slot where it
    /// would go.
    fn find(&self, key: [u64; 2], hash: u64) -> Result<usize, usize> {
        let n = self.slots.len();
        let mut i = self.home(hash);
        loop {
            if self.slots[i].count == 0 {
                return Err(i);
            }
            if self.slots[i].key == key {
                return Ok(i);
            }
            i = if i + 1 == n { 0 } else { i + 1 };
        }
    }

    /// Empties slot `i` and shifts back the entries that probed past it.
    fn remove(&mut self, i: usize, hasher: &KeyHasher) {
        let n = self.slots.len();
        let (mut hole, mut j) = (i, i);
        loop {
            j = if j + 1 == n { 0 } else { j + 1 };
            if self.slots[j].count == 0 {
                break;
            }
            let home = self.home(hasher.hash(self.slots[j].key));
            if (j + n - home) % n >= (j + n - hole) % n {
                self.slots[hole] = self.slots[j];
                hole = j;
            }
        }
        self.slots[hole] = EMPTY;
        self.len -= 1;
    }
}

/// What [`ConnTable::take`] answers.
#[derive(Debug)]
pub enum Take {
    /// Counted in: the place is given back when dropped.
    Taken(Place),
    /// The address has `limit` connections open already.
    Over,
    /// The table is full (every slot an address with connections open).
    Full,
}

/// The per-client counts of one service. `Sync`: shared in an `Arc`.
pub struct ConnTable {
    hasher: KeyHasher,
    ipv6_mask: u128,
    ipv6_prefix: u8,
    max_clients: usize,
    shard_mask: usize,
    shards: Box<[Shard]>,
    /// Refusals are logged at most once a second.
    pub(crate) refusals_log: LogThrottle,
}

/// One connection's place in its address's count, given back when dropped.
pub struct Place {
    table: Arc<ConnTable>,
    key: [u64; 2],
}

impl std::fmt::Debug for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Place").finish_non_exhaustive()
    }
}

impl ConnTable {
    /// An empty table for at most `max_clients` addresses (clamped to the
    /// limiter's bounds), keying IPv6 by `ipv6_prefix` bits; its memory is
    /// allocated now.
    pub fn new(max_clients: usize, ipv6_prefix: u8) -> Arc<ConnTable> {
        let max_clients = max_clients.clamp(1, super::MAX_MAX_CLIENTS);
        let shard_count = max_clients.div_ceil(SHARD_TARGET).next_power_of_two();
        let shards = (0..shard_count)
            .map(|i| {
                let cap = max_clients / shard_count + usize::from(i < max_clients % shard_count);
                Shard(Mutex::new(Counts::with_capacity(cap)))
            })
            .collect();
        let prefix = u32::from(ipv6_prefix.clamp(1, 128));
        Arc::new(ConnTable {
            hasher: KeyHasher::new(),
            ipv6_mask: u128::MAX << (128 - prefix),
            ipv6_prefix,
            max_clients,
            shard_mask: shard_count - 1,
            shards,
            refusals_log: LogThrottle::new(Duration::from_secs(1)),
        })
    }

    /// Whether it was made for these bounds (a reload may change them: the
    /// service then makes a new table).
    pub fn fits(&self, max_clients: usize, ipv6_prefix: u8) -> bool {
        self.max_clients == max_clients.clamp(1, super::MAX_MAX_CLIENTS)
            && self.ipv6_prefix == ipv6_prefix
    }

    fn shard(&self, hash: u64) -> &Mutex<Counts> {
        &self.shards[(hash >> 32) as usize & self.shard_mask].0
    }

    /// Counts a connection from `ip` in, if its address has fewer than
    /// `limit` open.
    pub fn take(self: &Arc<Self>, ip: IpAddr, limit: usize) -> Take {
        let key = key_of(ip, self.ipv6_mask);
        let hash = self.hasher.hash(key);
        let mut counts = self.shard(hash).lock();
        match counts.find(key, hash) {
            Ok(i) => {
                let entry = &mut counts.slots[i];
                if entry.count as usize >= limit {
                    return Take::Over;
                }
                entry.count += 1;
            }
            Err(i) => {
                if counts.len >= counts.cap {
                    return Take::Full;
                }
                if limit == 0 {
                    return Take::Over;
                }
                counts.slots[i] = Entry { key, count: 1 };
                counts.len += 1;
            }
        }
        drop(counts);
        Take::Taken(Place {
            table: Arc::clone(self),
            key,
        })
    }

    /// Connections open now from `ip`'s address (locks its shard).
    pub fn count(&self, ip: IpAddr) -> u32 {
        let key = key_of(ip, self.ipv6_mask);
        let hash = self.hasher.hash(key);
        let counts = self.shard(hash).lock();
        counts.find(key, hash).map_or(0, |i| counts.slots[i].count)
    }

    /// Addresses with connections open now (locks every shard in turn).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.0.lock().len as usize).sum()
    }

    /// Whether no address has a connection open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Most addresses tracked at once.
    pub fn capacity(&self) -> usize {
        self.shards.iter().map(|s| s.0.lock().cap as usize).sum()
    }

    /// Bytes of the table, all allocated by [`ConnTable::new`].
    pub fn memory_bytes(&self) -> usize {
        let slots: usize = self.shards.iter().map(|s| s.0.lock().slots.len()).sum();
        std::mem::size_of::<ConnTable>()
            + self.shards.len() * std::mem::size_of::<Shard>()
            + slots * std::mem::size_of::<Entry>()
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let hash = self.table.hasher.hash(self.key);
        let mut counts = self.table.shard(hash).lock();
        // Always found: a place's entry leaves only with its last place.
        if let Ok(i) = counts.find(self.key, hash) {
            counts.slots[i].count -= 1;
            if counts.slots[i].count == 0 {
                counts.remove(i, &self.table.hasher);
            }
        }
    }
}

impl std::fmt::Debug for ConnTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnTable")
            .field("max_clients", &self.max_clients)
            .field("ipv6_prefix", &self.ipv6_prefix)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    fn taken(t: Take) -> Place {
        match t {
            Take::Taken(p) => p,
            other => panic!("not taken: {other:?}"),
        }
    }

    #[test]
    fn the_cap_holds_per_address_and_a_drop_frees_a_place() {
        let table = ConnTable::new(100, 64);
        let a: Vec<Place> = (0..3).map(|_| taken(table.take(v4(1), 3))).collect();
        assert!(matches!(table.take(v4(1), 3), Take::Over));
        let _b = taken(table.take(v4(2), 3));
        assert_eq!((table.count(v4(1)), table.count(v4(2))), (3, 1));
        let mut a = a;
        a.pop();
        assert_eq!(table.count(v4(1)), 2);
        let _again = taken(table.take(v4(1), 3));
        drop(a);
        assert_eq!(table.count(v4(1)), 1);
        assert_eq!(table.len(), 2);
    }

    #[test]
    fn an_ipv6_prefix_is_one_address_and_mapped_ipv4_is_ipv4() {
        let table = ConnTable::new(100, 64);
        let one: IpAddr = "2001:db8::1".parse().unwrap();
        let same: IpAddr = "2001:db8::ffff:2".parse().unwrap();
        let _p = taken(table.take(one, 2));
        let _q = taken(table.take(same, 2));
        assert!(matches!(table.take(one, 2), Take::Over));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        let _r = taken(table.take(mapped, 1));
        assert!(matches!(table.take(v4(1), 1), Take::Over));
    }

    /// More addresses than the table holds: the extra ones are refused,
    /// the table never grows, and every drop empties it again.
    #[test]
    fn a_full_table_refuses_new_addresses_and_empties_on_drop() {
        let table = ConnTable::new(300, 64);
        let bytes = table.memory_bytes();
        let cap = table.capacity();
        assert_eq!(cap, 300);
        let mut held = Vec::new();
        let mut full = 0;
        for i in 0..2000u32 {
            match table.take(IpAddr::from((0x0a00_0000 + i).to_be_bytes()), 5) {
                Take::Taken(p) => held.push(p),
                Take::Full => full += 1,
                Take::Over => panic!("one connection each"),
            }
        }
        // Shards fill unevenly: the table is full once one shard is.
        assert!(held.len() <= cap && held.len() > cap / 2, "{}", held.len());
        assert_eq!(held.len() + full, 2000);
        assert_eq!(table.len(), held.len());
        assert_eq!(table.memory_bytes(), bytes);
        drop(held);
        assert!(table.is_empty());
    }

    /// Exact under contention: places taken and dropped by many threads
    /// leave every count at 0.
    #[test]
    fn counts_stay_exact_under_many_threads() {
        let table = ConnTable::new(1000, 64);
        std::thread::scope(|s| {
            for t in 0..8u8 {
                let table = &table;
                s.spawn(move || {
                    for i in 0..2000u32 {
                        let ip = v4((i % 17) as u8 + t);
                        if let Take::Taken(p) = table.take(ip, 1000) {
                            drop(p);
                        }
                    }
                });
            }
        });
        assert!(table.is_empty());
    }
}
