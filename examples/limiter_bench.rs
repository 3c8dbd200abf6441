//! Cost of a rate-limit check and memory per tracked client.
//!
//! Run with `cargo run --release --example limiter_bench` (a debug build
//! measures the debug build). Not a test: it prints numbers for
//! `docs/rate-limiting.md` and asserts nothing about speed.
//!
//! What it measures:
//! - ns per `Limiter::check` with a precomputed `now`, on 1 and 2 threads:
//!   hits (the IP is already in the table), inserts into a table with room,
//!   and inserts into a full table (every one sweeps or evicts);
//! - the cost of `Instant::now()`, which the accept loop adds per check;
//! - bytes per tracked client, from the table's layout and from the growth
//!   of the process's resident memory for a table of 1,000,000 clients.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rodizio::limiter::{Limiter, Rate, RateLimitAlgorithm as Algorithm, RateLimitConfig};

const HIT_CHECKS: u32 = 10_000_000;
const INSERTS: u32 = 1_000_000;

fn config(algorithm: Algorithm, max_clients: usize) -> RateLimitConfig {
    RateLimitConfig {
        algorithm,
        max_clients,
        // Everything allowed: the benchmark measures the table, not refusals.
        ..RateLimitConfig::new(Rate {
            limit: 1_000_000_000,
            window: Duration::from_secs(3600),
        })
    }
}

fn ip(n: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(n))
}

/// Runs `per_thread(thread_index)` on `threads` threads at once; returns
/// the wall time.
fn on_threads(threads: u32, per_thread: impl Fn(u32) + Sync) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let f = &per_thread;
            s.spawn(move || f(t));
        }
    });
    start.elapsed()
}

/// Hits: `HIT_CHECKS` checks per thread over 10,000 clients already in the
/// table (each thread its own 10,000).
fn hits(algorithm: Algorithm, threads: u32) -> f64 {
    let limiter = Arc::new(Limiter::new(&config(algorithm, 65536)));
    let now = Instant::now();
    for n in 0..10_000 * threads {
        limiter.check(ip(n), now);
    }
    let elapsed = on_threads(threads, |t| {
        let base = t * 10_000;
        for i in 0..HIT_CHECKS {
            black_box(limiter.check(ip(base + i % 10_000), now));
        }
    });
    elapsed.as_nanos() as f64 / f64::from(HIT_CHECKS)
}

/// Inserts: `INSERTS` new clients per thread into a table of
/// `max_clients`; returns ns per check and the evictions.
fn inserts(threads: u32, max_clients: usize) -> (f64, u64) {
    let limiter = Limiter::new(&config(Algorithm::FixedWindow, max_clients));
    let now = Instant::now();
    let elapsed = on_threads(threads, |t| {
        let base = 0x0a00_0000 + t * INSERTS;
        for i in 0..INSERTS {
            black_box(limiter.check(ip(base + i), now));
        }
    });
    (
        elapsed.as_nanos() as f64 / f64::from(INSERTS),
        limiter.evictions(),
    )
}

/// The fixed window's edge burst, replayed on a virtual clock for each
/// algorithm: with N = 10 per 10 s, one connection at 0 s, then 10 tries at
/// 9.999 s and 10 more at 10.001 s.
fn edge_burst() {
    let n = 10;
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
    ] {
        let limiter = Limiter::new(&RateLimitConfig {
            algorithm,
            ..RateLimitConfig::new(Rate {
                limit: n,
                window: Duration::from_secs(10),
            })
        });
        let t0 = Instant::now();
        let client = ip(0xc000_0201);
        let allowed = |at: Duration, tries: u32| {
            (0..tries)
                .filter(|_| limiter.check(client, t0 + at).is_allowed())
                .count()
        };
        let first = allowed(Duration::ZERO, 1);
        let before = allowed(Duration::from_millis(9_999), n);
        let after = allowed(Duration::from_millis(10_001), n);
        println!(
            "edge burst, {algorithm:<14}: 0 s: {first}/1, 9.999 s: {before}/{n}, 10.001 s: {after}/{n} \
             => {} allowed within 10.001 s, {} within the last 2 ms",
            first + before + after,
            before + after
        );
    }
}

/// Inserts into a default-sized table (65,536) that has room: 25,000 new
/// clients per thread into a fresh table, 40 rounds; ns per check.
fn inserts_with_room(threads: u32) -> f64 {
    let (rounds, per_thread) = (40u32, 25_000u32);
    let mut total = Duration::ZERO;
    for _ in 0..rounds {
        let limiter = Limiter::new(&config(Algorithm::FixedWindow, 65536));
        let now = Instant::now();
        total += on_threads(threads, |t| {
            let base = 0x0a00_0000 + t * per_thread;
            for i in 0..per_thread {
                black_box(limiter.check(ip(base + i), now));
            }
        });
    }
    total.as_nanos() as f64 / f64::from(rounds * per_thread)
}

/// Resident set size of this process, in bytes (Linux `/proc`).
fn rss() -> Option<usize> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: usize = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * usize::try_from(page).ok()?)
}

fn main() {
    println!("rodizio limiter benchmark (ns per check, `now` precomputed)");
    if cfg!(debug_assertions) {
        println!("warning: debug build; run with --release for real numbers");
    }

    // First, before other tables come and go, so the heap is fresh.
    {
        let before = rss();
        let limiter = Limiter::new(&config(Algorithm::FixedWindow, 1_000_000));
        let created = rss();
        let now = Instant::now();
        for n in 0..1_000_000 {
            limiter.check(ip(0x0a00_0000 + n), now);
        }
        let filled = rss();
        if let (Some(before), Some(created), Some(filled)) = (before, created, filled) {
            println!(
            "RSS: table of 1000000 clients: +{} bytes at creation, +{} more after 1000000 inserts \
             ({} tracked, {} evicted): {:.1} bytes per client of capacity",
            created - before,
            filled.saturating_sub(created),
            limiter.len(),
            limiter.evictions(),
            (filled - before) as f64 / limiter.capacity() as f64
        );
        }
    }

    edge_burst();

    let start = Instant::now();
    let mut last = start;
    for _ in 0..HIT_CHECKS {
        last = black_box(Instant::now());
    }
    let clock = (last - start).as_nanos() as f64 / f64::from(HIT_CHECKS);
    println!("Instant::now(): {clock:.1} ns (added once per accepted client)");

    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
    ] {
        let one = hits(algorithm, 1);
        let two = hits(algorithm, 2);
        println!(
            "hit, {algorithm:<14}: 1 thread {one:5.1} ns/check; 2 threads {two:5.1} ns/check \
             per thread ({:.1} ns/check aggregate)",
            two / 2.0
        );
    }

    let (one, two) = (inserts_with_room(1), inserts_with_room(2));
    println!(
        "insert, table with room (65536): 1 thread {one:5.1} ns/check; 2 threads {two:5.1} ns/check per thread"
    );
    let (one, _) = inserts(1, 4 * INSERTS as usize);
    let (two, _) = inserts(2, 4 * INSERTS as usize);
    println!(
        "insert, table with room (4000000, 214 MB): 1 thread {one:5.1} ns/check; 2 threads {two:5.1} ns/check per thread"
    );
    let (one, ev1) = inserts(1, 65536);
    let (two, ev2) = inserts(2, 65536);
    println!(
        "insert, full table (65536)     : 1 thread {one:5.1} ns/check; 2 threads {two:5.1} ns/check per thread \
         ({ev1} and {ev2} evictions)"
    );

    // How full the table is when the first shard fills (per-shard caps).
    for max_clients in [65536, 1_000_000] {
        let l = Limiter::new(&config(Algorithm::FixedWindow, max_clients));
        let now = Instant::now();
        let mut n = 0;
        while l.evictions() == 0 {
            l.check(ip(0x0a00_0000 + n), now);
            n += 1;
        }
        println!(
            "first eviction: {max_clients}-client table, after {n} distinct clients ({:.0}% full)",
            100.0 * f64::from(n - 1) / max_clients as f64
        );
    }

    for max_clients in [65536, 1_000_000] {
        let l = Limiter::new(&config(Algorithm::FixedWindow, max_clients));
        println!(
            "layout: {max_clients} clients, {} shards: {} bytes, {:.1} bytes per client",
            l.shard_count(),
            l.memory_bytes(),
            l.memory_bytes() as f64 / l.capacity() as f64
        );
    }
}
