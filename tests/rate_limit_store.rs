//! The rate limit shared through a real redis-server (started here on a
//! free loopback port, stopped by PID): two balancers count one client
//! together; when Redis is stopped or frozen the failure policy holds and
//! nothing hangs; when it is back on the same port, sharing resumes.

mod common;
mod peers;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{TestBackend, TestBalancer};
use peers::{connect_from, free_port, Peer};
use rodizio::limiter::{
    FailurePolicy, Limiter, Rate, RateLimitAlgorithm, RateLimitConfig, RateLimitReply, StoreConfig,
};
use rodizio::stats::Stats;

/// The store timeout of these tests. Far above a loopback round trip (tens
/// of microseconds) so that a loaded test machine does not turn a slow
/// answer into a failure, and still short enough to keep every wait small.
const STORE_TIMEOUT: Duration = Duration::from_millis(500);

/// A request may take this long at most, Redis down or frozen included:
/// one store timeout plus the proxying, with room for a loaded machine.
const BOUND: Duration = Duration::from_secs(3);

/// redis-server on `port`, with no persistence.
fn redis(port: u16) -> Peer {
    peers::redis_server(port, "store-redis")
}

fn store(port: u16, failure: FailurePolicy) -> StoreConfig {
    StoreConfig {
        url: Some(format!("redis://127.0.0.1:{port}/0")),
        timeout: STORE_TIMEOUT,
        failure,
    }
}

/// A balancer limiting `rate` per client IP, counted in the Redis on
/// `port`, answering refusals with a 429.
fn shared(backend: SocketAddr, rate: &str, port: u16, failure: FailurePolicy) -> TestBalancer {
    TestBalancer::with(&[backend], |c| {
        c.rate_limit = Some(RateLimitConfig {
            reply: RateLimitReply::Http,
            ..RateLimitConfig::new(Rate::parse(rate).unwrap())
        });
        c.rate_limit_store = store(port, failure);
    })
}

/// What one request from `from` got: `Some(true)` served, `Some(false)`
/// refused with a 429; `None` anything else. Fails the test if it took
/// longer than [`BOUND`].
fn attempt(from: [u8; 4], to: SocketAddr) -> Option<bool> {
    let started = Instant::now();
    let mut s = connect_from(from, to, BOUND).ok()?;
    s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    assert!(
        started.elapsed() < BOUND,
        "a request took {:?}",
        started.elapsed()
    );
    if reply.starts_with("HTTP/1.1 200") {
        Some(true)
    } else if reply.starts_with("HTTP/1.1 429") {
        Some(false)
    } else {
        None
    }
}

/// `n` attempts from `from`, alternating between the balancers; how many
/// were served.
fn alternate(from: [u8; 4], balancers: &[&TestBalancer], n: usize) -> usize {
    (0..n)
        .filter(|i| attempt(from, balancers[i % balancers.len()].addr) == Some(true))
        .count()
}

fn failures(b: &TestBalancer) -> u64 {
    b.stats.snapshot().rate_limit_store_failures
}

/// Two balancers on different ports share one Redis: one client IP
/// alternating between them with `--rate-limit 20/10s` is served 20 times
/// in the window, not 40. The slack allowed is the checks Redis failed to
/// answer (each served by the open policy, and counted): the scripts run
/// atomically in Redis, so without a failure the count is exact. Then Redis
/// is frozen (SIGSTOP) and stopped: the open balancers serve, the closed
/// one refuses, every request within its bound. Then a new Redis on the
/// same port: the balancers reconnect by themselves and share again.
#[test]
fn two_balancers_share_one_limit_and_survive_redis_going_away() {
    let web = TestBackend::http(1);
    let port = free_port();
    let mut server = redis(port);
    let a = shared(web.addr(), "20/10s", port, FailurePolicy::Open);
    let b = shared(web.addr(), "20/10s", port, FailurePolicy::Open);
    let closed = shared(web.addr(), "20/10s", port, FailurePolicy::Closed);

    let started = Instant::now();
    let served = alternate([127, 0, 0, 20], &[&a, &b], 40);
    let elapsed = started.elapsed();
    assert!(
        elapsed < Duration::from_secs(10),
        "the window ran out: {elapsed:?}"
    );
    let slack = (failures(&a) + failures(&b)) as usize;
    assert!(
        served >= 20 && served <= 20 + slack,
        "served {served} of 40 (store failures: {slack})"
    );
    // The key is the client's, and it expires with its window.
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/0")).unwrap();
    let mut con = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .unwrap();
    let ttl: i64 = redis::cmd("PTTL")
        .arg("rodizio:rl:fw:127.0.0.20")
        .query(&mut con)
        .unwrap();
    assert!(ttl > 0 && ttl <= 10_000, "PTTL {ttl}");
    drop(con);

    // Frozen: Redis accepts nothing and answers nothing.
    server.signal(libc::SIGSTOP);
    for (balancer, served) in [(&a, Some(true)), (&closed, Some(false))] {
        let before = failures(balancer);
        assert_eq!(attempt([127, 0, 0, 21], balancer.addr), served);
        assert!(failures(balancer) > before, "the failure is counted");
    }
    server.signal(libc::SIGCONT);

    // Gone: the port is closed.
    server.stop();
    for balancer in [&a, &b, &a, &b] {
        assert_eq!(attempt([127, 0, 0, 22], balancer.addr), Some(true));
    }
    assert_eq!(attempt([127, 0, 0, 22], closed.addr), Some(false));
    assert!(failures(&a) > 0 && failures(&b) > 0 && failures(&closed) > 0);

    // Back on the same port, empty: each balancer reconnects within its
    // hold-off (a second); a throw-away client shows when.
    let _server = redis(port);
    for balancer in [&a, &b] {
        let back = common::wait_for(Duration::from_secs(10), || {
            let before = failures(balancer);
            attempt([127, 0, 0, 23], balancer.addr);
            failures(balancer) == before
        });
        assert!(back, "the balancer did not reconnect to Redis");
    }
    let (fa, fb) = (failures(&a), failures(&b));
    let started = Instant::now();
    let served = alternate([127, 0, 0, 24], &[&a, &b], 40);
    assert!(started.elapsed() < Duration::from_secs(10));
    let slack = (failures(&a) - fa + failures(&b) - fb) as usize;
    assert!(
        served >= 20 && served <= 20 + slack,
        "after the restart: served {served} of 40 (store failures: {slack})"
    );
}

/// Each algorithm's script, run by the real Redis: `N` allowed from a fresh
/// client, then refused with a retry time within the window; only the
/// first refusal is marked first; another client is not affected.
#[test]
fn every_algorithm_counts_in_redis() {
    let port = free_port();
    let _server = redis(port);
    for algorithm in RateLimitAlgorithm::ALL {
        let rules = RateLimitConfig {
            algorithm,
            ..RateLimitConfig::new(Rate::parse("5/10s").unwrap())
        };
        let stats = Arc::new(Stats::default());
        let limiter =
            Limiter::with_store(&rules, &store(port, FailurePolicy::Closed), stats.clone())
                .unwrap();
        assert!(limiter.is_shared());
        let ip = format!("192.0.2.{}", 10 + algorithm as u8).parse().unwrap();
        let now = Instant::now();
        for n in 0..5 {
            assert!(limiter.check(ip, now).is_allowed(), "{algorithm}: {n}");
        }
        for n in 0..3 {
            match limiter.check(ip, now) {
                rodizio::limiter::Decision::Refused { first, retry_after } => {
                    assert_eq!(first, n == 0, "{algorithm}: refusal {n}");
                    assert!(
                        retry_after > Duration::ZERO && retry_after <= Duration::from_secs(10),
                        "{algorithm}: {retry_after:?}"
                    );
                }
                other => panic!("{algorithm}: {other:?}"),
            }
        }
        let other = "192.0.2.99".parse().unwrap();
        assert!(limiter.check(other, now).is_allowed(), "{algorithm}");
        // IPv6 clients share their /64.
        let v6a = "2001:db8:0:1::1".parse().unwrap();
        let v6b = "2001:db8:0:1::2".parse().unwrap();
        for _ in 0..5 {
            assert!(limiter.check(v6a, now).is_allowed(), "{algorithm}");
        }
        assert!(
            !limiter.check(v6b, now).is_allowed(),
            "{algorithm}: same /64"
        );
        assert_eq!(stats.snapshot().rate_limit_store_failures, 0);
    }
}

/// Accepts per second through a balancer, the in-process limiter against
/// the Redis store, in two cases: every client allowed (the worst case for
/// the store: one round trip per accept), and a flood from clients over
/// their limit (what a limit is for: refused clients are remembered until
/// their retry time, so the store is asked once per window). A
/// measurement, not a check: run it alone, in release, with `--ignored
/// --nocapture`; docs/scaling.md gives its numbers.
#[test]
#[ignore]
fn measure_accepts_per_second() {
    const THREADS: usize = 4;
    const EACH: usize = 500;
    let web = TestBackend::http(1);
    let port = free_port();
    let _server = redis(port);
    // Each case has its own clients: the Redis keys outlive a balancer.
    let run = |addr: SocketAddr, served: bool| {
        let net = if served { 1 } else { 2 };
        let started = Instant::now();
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                std::thread::spawn(move || {
                    let from = [127, 0, net, t as u8 + 1];
                    // A refused client's 429 may be lost to a reset (it
                    // wrote its request first): count it as refused.
                    (0..EACH)
                        .filter(|_| (attempt(from, addr) == Some(true)) == served)
                        .count()
                })
            })
            .collect();
        let n: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        let rate = n as f64 / started.elapsed().as_secs_f64();
        (n, rate)
    };
    for (case, rate, served) in [
        ("all allowed", "1000000/1s", true),
        ("flood over the limit", "1/1m", false),
    ] {
        let local = TestBalancer::with(&[web.addr()], |c| {
            c.rate_limit = Some(RateLimitConfig {
                reply: RateLimitReply::Http,
                ..RateLimitConfig::new(Rate::parse(rate).unwrap())
            });
        });
        let shared = shared(web.addr(), rate, port, FailurePolicy::Open);
        // Warm both up (threads, the script's first load, the first
        // allowed connection of each client), then measure each twice.
        run(local.addr, served);
        run(shared.addr, served);
        let mut l = 0.0;
        let mut r = 0.0;
        for _ in 0..2 {
            let (n, rate) = run(local.addr, served);
            assert_eq!(n, THREADS * EACH, "{case}");
            l += rate / 2.0;
            let (n, rate) = run(shared.addr, served);
            assert_eq!(n, THREADS * EACH, "{case}");
            r += rate / 2.0;
        }
        eprintln!(
            "{case}: accepts per second: in-process {l:.0}, redis {r:.0}, ratio {:.2}",
            r / l
        );
        assert_eq!(failures(&shared), 0);
    }
}
