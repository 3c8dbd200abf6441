//! Unit tests of the rate limiter: each algorithm with an explicit `now`,
//! the bounded table under churn and contention, and the refusal reply.

use super::*;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::atomic::AtomicU32;
use std::sync::Arc;

const S: Duration = Duration::from_secs(1);

fn limiter(algorithm: RateLimitAlgorithm, limit: u32, window: Duration) -> Limiter {
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
fn every_algorithm_allows_exactly_n_then_refuses() {
    for algorithm in [
        RateLimitAlgorithm::FixedWindow,
        RateLimitAlgorithm::SlidingWindow,
        RateLimitAlgorithm::TokenBucket,
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
    let l = limiter(RateLimitAlgorithm::FixedWindow, 3, 10 * S);
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
    let l = limiter(RateLimitAlgorithm::FixedWindow, n, 10 * S);
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
    let s = limiter(RateLimitAlgorithm::SlidingWindow, n, 10 * S);
    assert!(s.check(ip(1), t0).is_allowed());
    let before = allowed(&s, ip(1), edge - Duration::from_millis(1), n);
    let after = allowed(&s, ip(1), edge + Duration::from_millis(1), n + 1);
    assert_eq!(1 + before, n);
    assert_eq!(after, 0);
}

#[test]
fn sliding_window_weighs_the_previous_window() {
    let l = limiter(RateLimitAlgorithm::SlidingWindow, 10, 10 * S);
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
    let l = limiter(RateLimitAlgorithm::TokenBucket, 10, 10 * S);
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
    let l = limiter(RateLimitAlgorithm::TokenBucket, 2, 10 * S);
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
        RateLimitAlgorithm::FixedWindow,
        RateLimitAlgorithm::SlidingWindow,
        RateLimitAlgorithm::TokenBucket,
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
    let l = limiter(RateLimitAlgorithm::FixedWindow, 2, 10 * S);
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
    let l = limiter(RateLimitAlgorithm::FixedWindow, 2, 10 * S);
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
fn full_table_evicts_the_least_recently_seen_within_its_limit() {
    let l = Limiter::new(&RateLimitConfig {
        max_clients: 4,
        ..RateLimitConfig::new(Rate {
            limit: 2,
            window: 60 * S,
        })
    });
    let t0 = Instant::now();
    let at = |ms| t0 + Duration::from_millis(ms);
    // Client 0 uses its allowance and is refused: over its limit, and
    // the least recently seen of all.
    assert_eq!(allowed(&l, ip(0), at(0), 3), 2);
    for n in 1..4 {
        assert!(l.check(ip(n), at(u64::from(n) + 1)).is_allowed());
    }
    // A newcomer evicts 1, the oldest of those within their limit.
    assert!(l.check(ip(99), at(11)).is_allowed());
    assert_eq!((l.len(), l.evictions(), l.swept()), (4, 1, 0));
    // Client 1 was forgotten: allowed twice again. Client 0 was kept.
    assert_eq!(allowed(&l, ip(1), at(12), 2), 2);
    assert!(!l.check(ip(0), at(13)).is_allowed());
}

#[test]
fn a_shard_all_over_its_limit_evicts_the_refusal_that_ends_first() {
    let l = Limiter::new(&RateLimitConfig {
        max_clients: 4,
        ..RateLimitConfig::new(Rate {
            limit: 1,
            window: 60 * S,
        })
    });
    let t0 = Instant::now();
    let at = |ms| t0 + Duration::from_millis(ms);
    // Client 3 opens its window first, so its refusal ends first,
    // although it is the most recently seen.
    assert!(l.check(ip(3), at(0)).is_allowed());
    for n in 0..3 {
        assert!(l.check(ip(n), at(u64::from(n) + 1)).is_allowed());
    }
    assert!(!l.check(ip(3), at(5)).is_allowed());
    // Every entry is at its limit: the newcomer evicts client 3.
    assert!(l.check(ip(99), at(10)).is_allowed());
    assert_eq!((l.len(), l.evictions()), (4, 1));
    assert!(!l.check(ip(0), at(11)).is_allowed());
    assert!(l.check(ip(3), at(12)).is_allowed());
}

/// `--rate-limit 3/30s --rate-limit-max-clients 1000`: a client over its
/// limit stays refused through 20,000 new addresses in one window,
/// probed only every 2,000 of them (so it is never recently seen).
#[test]
fn an_abuser_stays_refused_while_many_new_addresses_arrive() {
    let l = Limiter::new(&RateLimitConfig {
        max_clients: 1000,
        ..RateLimitConfig::new(Rate {
            limit: 3,
            window: 30 * S,
        })
    });
    let t0 = Instant::now();
    let abuser = IpAddr::V4(Ipv4Addr::new(203, 0, 113, 9));
    assert_eq!(allowed(&l, abuser, t0, 5), 3);
    for n in 1..=20_000u32 {
        // All within the window: 100 µs apart, two seconds in all.
        let now = t0 + Duration::from_micros(100 * u64::from(n));
        assert!(l.check(ip(0x0a00_0000 + n), now).is_allowed());
        if n % 2000 == 0 {
            assert!(
                !l.check(abuser, now).is_allowed(),
                "the abuser was let through after {n} new addresses"
            );
            assert!(l.len() <= l.capacity(), "{} > {}", l.len(), l.capacity());
        }
    }
    assert!(l.evictions() > 18_000, "{}", l.evictions());
    // A fresh client is still served.
    let fresh = IpAddr::V4(Ipv4Addr::new(198, 51, 100, 1));
    assert_eq!(allowed(&l, fresh, t0 + 3 * S, 3), 3);
    assert!(l.len() <= l.capacity());
    assert_eq!(l.capacity(), 1000);
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
        RateLimitAlgorithm::FixedWindow,
        RateLimitAlgorithm::SlidingWindow,
        RateLimitAlgorithm::TokenBucket,
    ] {
        let l = Limiter::new(&RateLimitConfig {
            max_clients: 50,
            algorithm,
            ..RateLimitConfig::new(Rate {
                // Some entries within their limit, some over it, so
                // that both sweeps and evictions happen (with a limit
                // of 1 every entry is over it, and eviction takes the
                // one about to run out before any sweep can).
                limit: 2,
                // A sliding window's state lasts two windows.
                window: Duration::from_millis(if algorithm == RateLimitAlgorithm::SlidingWindow {
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
    let l = limiter(RateLimitAlgorithm::FixedWindow, 1, S);
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
    // A bare number is per second.
    assert_eq!(Rate::parse(" 100 "), Rate::parse("100/1s"));
    for bad in [
        "", "0", "-5", "1.5", "/1s", "0/1s", "x/1s", "10/0s", "10/1x", "-1/1s", "5/0.5ms",
    ] {
        assert!(Rate::parse(bad).is_err(), "accepted {bad:?}");
    }
}

#[test]
fn http_refusal_is_a_429_and_a_close() {
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    client.set_read_timeout(Some(5 * S)).unwrap();
    let (server_side, _) = listener.accept().unwrap();
    refuse(
        &server_side,
        RateLimitReply::Http,
        Duration::from_millis(2500),
    );
    drop(server_side);
    let mut reply = String::new();
    client.read_to_string(&mut reply).unwrap();
    assert!(
        reply.starts_with("HTTP/1.1 429 Too Many Requests\r\n"),
        "{reply}"
    );
    assert!(reply.contains("\r\nRetry-After: 3\r\n"), "{reply}");
    assert!(reply.contains("\r\nConnection: close\r\n"), "{reply}");
    assert!(reply.ends_with(crate::reply::BODY_429));
}

#[test]
fn used_counts_what_check_counted_and_changes_nothing() {
    let t0 = Instant::now();
    for algorithm in [
        RateLimitAlgorithm::FixedWindow,
        RateLimitAlgorithm::SlidingWindow,
        RateLimitAlgorithm::TokenBucket,
    ] {
        let l = limiter(algorithm, 3, S);
        assert_eq!(l.used(ip(1), t0), 0, "{algorithm}: unknown client");
        for n in 1..=3 {
            assert!(l.check(ip(1), t0).is_allowed());
            assert_eq!(l.used(ip(1), t0), n, "{algorithm}");
            assert_eq!(l.used(ip(1), t0), n, "{algorithm}: reading twice");
        }
        assert!(!l.check(ip(1), t0).is_allowed());
        assert_eq!(l.used(ip(1), t0), 3, "{algorithm}: a refusal uses nothing");
        assert_eq!(l.used(ip(2), t0), 0, "{algorithm}: another client");
    }
    // A fixed window that ended counts nothing any more.
    let l = limiter(RateLimitAlgorithm::FixedWindow, 3, S);
    let t1 = Instant::now();
    l.check(ip(1), t1);
    assert_eq!(l.used(ip(1), t1), 1);
    assert_eq!(l.used(ip(1), t1 + S), 0);
}

mod properties {
    use super::super::*;
    use proptest::prelude::*;

    proptest! {
        /// Random text never panics the parser.
        #[test]
        fn random_text_never_panics(text in ".{0,30}") {
            let _ = Rate::parse(&text);
        }

        /// Rate-like text never panics it either.
        #[test]
        fn rate_like_text_never_panics(text in "[0-9-]{0,12}/?[0-9.]{0,10}(ms|s|m|h|x)?") {
            let _ = Rate::parse(&text);
        }

        /// Any valid rate, written as N/WINDOW with the window in
        /// milliseconds, parses back to itself; out of range is refused.
        #[test]
        fn a_written_rate_parses_back(limit in 1u32..=MAX_LIMIT, ms in 1u64..1_000_000_000) {
            let rate = Rate { limit, window: Duration::from_millis(ms) };
            prop_assert_eq!(Rate::parse(&format!("{limit}/{ms}ms")), Ok(rate));
            let zero = format!("0/{ms}ms");
            prop_assert!(Rate::parse(&zero).is_err());
        }
    }
}
