//! Backend health with real sockets: fail-over and passive marking under
//! load, active checks taking a backend out and bringing it back, black
//! holes, and what a client gets when no backend can serve it.
//!

mod common;

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::{black_hole, connect, request, time_until, Demo, TestBalancer, IO_TIMEOUT};
use rodizio::health::{CheckKind, HealthConfig};
use rodizio::Config;

/// TCP checks every `interval` (200 ms timeout), down after `fall` failures
/// in a row, up after `rise` successes.
fn tcp_checks(interval: Duration, fall: u32, rise: u32) -> HealthConfig {
    HealthConfig {
        check: CheckKind::Tcp,
        interval,
        timeout: Duration::from_millis(200),
        fall,
        rise,
        ..HealthConfig::default()
    }
}

/// One client request of the load: when it started, and how it went.
struct Outcome {
    started: Instant,
    result: io::Result<String>,
}

/// Stopping one of three backends under 100 concurrent clients: new
/// connections keep succeeding, it is marked DOWN within fall × interval,
/// and once it listens again it is UP within rise × interval and serves
/// again.
#[test]
fn one_of_three_stops_under_load_and_comes_back() {
    let interval = Duration::from_millis(100);
    let (fall, rise) = (3u32, 2u32);
    let a = Demo::start("127.0.0.1:0", "a");
    let mut b = Demo::start("127.0.0.1:0", "b");
    let c = Demo::start("127.0.0.1:0", "c");
    let b_addr = b.addr;
    let lb = TestBalancer::with(&[a.addr, b.addr, c.addr], |config| {
        config.proxy.connect_timeout = Duration::from_secs(1);
        config.health = tcp_checks(interval, fall, rise);
    });
    let backend_b = lb.backend(b_addr);

    let stop = Arc::new(AtomicBool::new(false));
    let outcomes = Arc::new(Mutex::new(Vec::<Outcome>::new()));
    let served_by_b = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..100)
        .map(|_| {
            let (stop, outcomes, served_by_b) = (
                Arc::clone(&stop),
                Arc::clone(&outcomes),
                Arc::clone(&served_by_b),
            );
            let addr = lb.addr;
            thread::spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(60);
                // Bounded in count and in time.
                for _ in 0..300 {
                    if stop.load(Ordering::Relaxed) || Instant::now() > deadline {
                        break;
                    }
                    let started = Instant::now();
                    let result = request(addr);
                    if matches!(&result, Ok(name) if name == "b") {
                        served_by_b.fetch_add(1, Ordering::Relaxed);
                    }
                    outcomes.lock().unwrap().push(Outcome { started, result });
                }
            })
        })
        .collect();
    let done = || outcomes.lock().unwrap().len();

    // Traffic flows to all three.
    time_until(Duration::from_secs(30), || {
        done() >= 300 && served_by_b.load(Ordering::Relaxed) > 0
    })
    .expect("load started");

    // Stop b: its listening socket is closed when `stop` returns.
    b.stop();
    let stopped = Instant::now();
    let down_after =
        time_until(Duration::from_secs(10), || !backend_b.is_healthy()).expect("b marked down");
    let served_before = done();
    // Clients go on while b is down.
    time_until(Duration::from_secs(30), || done() >= served_before + 300)
        .expect("traffic while b is down");

    // b comes back on the same port (SO_REUSEADDR).
    let _b_again = Demo::start(&b_addr.to_string(), "b");
    let up_after =
        time_until(Duration::from_secs(10), || backend_b.is_healthy()).expect("b marked up");
    let b_count = served_by_b.load(Ordering::Relaxed);
    time_until(Duration::from_secs(30), || {
        served_by_b.load(Ordering::Relaxed) > b_count
    })
    .expect("b serves again");

    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.join().unwrap();
    }
    let outcomes = outcomes.lock().unwrap();
    // Connections that b had already accepted into its backlog when it
    // closed are lost with it; every connection started after that worked.
    let lost_before: Vec<_> = outcomes
        .iter()
        .filter(|o| o.started < stopped && o.result.is_err())
        .collect();
    let failed_after: Vec<String> = outcomes
        .iter()
        .filter(|o| o.started >= stopped)
        .filter_map(|o| o.result.as_ref().err().map(|e| e.to_string()))
        .collect();
    eprintln!(
        "{} requests; DOWN after {down_after:?}, UP after {up_after:?}; \
         {} lost in b's backlog when it stopped",
        outcomes.len(),
        lost_before.len()
    );
    assert!(failed_after.is_empty(), "failed: {failed_after:?}");
    // The bounds of the design, plus one interval and one check timeout of
    // slack for a round already under way and a loaded machine.
    let slack = interval + Duration::from_millis(200);
    assert!(
        down_after <= interval * fall + slack,
        "DOWN after {down_after:?}"
    );
    assert!(up_after <= interval * rise + slack, "UP after {up_after:?}");
}

/// A black-holed backend costs a client at most the connect timeout (then
/// fail-over serves it), and after `passive_failures` such clients it is
/// marked down, so the next clients pay nothing.
#[test]
fn a_black_hole_costs_at_most_the_connect_timeout() {
    let (_hole, hole_addr, _fillers) = black_hole();
    let good = Demo::start("127.0.0.1:0", "good");
    let connect_timeout = Duration::from_millis(300);
    let lb = TestBalancer::with(&[hole_addr, good.addr], |config| {
        config.proxy.connect_timeout = connect_timeout;
        config.health = HealthConfig {
            check: CheckKind::Off,
            passive_failures: 3,
            cooldown: Duration::from_secs(600),
            ..HealthConfig::default()
        };
    });
    let hole = lb.backend(hole_addr);
    let mut slow = 0;
    for i in 0..10 {
        let started = Instant::now();
        assert_eq!(request(lb.addr).unwrap(), "good", "request {i}");
        let took = started.elapsed();
        // The connect timeout plus the time of a loopback request, with room
        // for a loaded machine; without the timeout the kernel would retry
        // the handshake for minutes.
        assert!(took < connect_timeout + Duration::from_secs(2), "{took:?}");
        if took >= connect_timeout {
            slow += 1;
        }
    }
    // Round robin sent clients 0, 2 and 4 to the hole; the third failure
    // marked it down.
    assert_eq!(slow, 3);
    assert!(!hole.is_healthy());
}

/// The active tcp check marks a black hole down within fall × (interval +
/// timeout), with no client traffic at all.
#[test]
fn the_tcp_check_finds_a_black_hole() {
    let (_hole, hole_addr, _fillers) = black_hole();
    let good = Demo::start("127.0.0.1:0", "good");
    let health = HealthConfig {
        check: CheckKind::Tcp,
        interval: Duration::from_millis(50),
        timeout: Duration::from_millis(100),
        fall: 2,
        ..HealthConfig::default()
    };
    let lb = TestBalancer::with(&[hole_addr, good.addr], |config| {
        config.health = health.clone();
    });
    let hole = lb.backend(hole_addr);
    let took = time_until(Duration::from_secs(10), || !hole.is_healthy()).expect("hole down");
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert!(lb.backend(good.addr).is_healthy());
    // Every client now goes straight to the good one.
    for _ in 0..4 {
        let started = Instant::now();
        assert_eq!(request(lb.addr).unwrap(), "good");
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}

/// The http check takes out a backend whose /health does not answer 2xx or
/// 3xx, and keeps one that does.
#[test]
fn the_http_check_reads_the_status() {
    use std::net::TcpListener;
    // A server that answers every request with 503.
    let sick = TcpListener::bind("127.0.0.1:0").unwrap();
    let sick_addr = sick.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = Arc::clone(&stop);
    let server = thread::spawn(move || {
        for conn in sick.incoming() {
            if stop2.load(Ordering::Relaxed) {
                break;
            }
            let Ok(mut s) = conn else { continue };
            let _ = s.set_read_timeout(Some(IO_TIMEOUT));
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf);
            let _ = s.write_all(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n");
        }
    });
    let good = Demo::start("127.0.0.1:0", "good");
    let lb = TestBalancer::with(&[sick_addr, good.addr], |config| {
        config.health = HealthConfig {
            check: CheckKind::Http,
            interval: Duration::from_millis(50),
            timeout: Duration::from_millis(500),
            fall: 2,
            ..HealthConfig::default()
        };
    });
    let sick_backend = lb.backend(sick_addr);
    time_until(Duration::from_secs(10), || !sick_backend.is_healthy()).expect("sick down");
    // A few more rounds: the good one stays up.
    let good_backend = lb.backend(good.addr);
    assert!(
        time_until(Duration::from_millis(300), || !good_backend.is_healthy()).is_none(),
        "the demo backend answers /health with 200"
    );
    for _ in 0..4 {
        assert_eq!(request(lb.addr).unwrap(), "good");
    }
    drop(lb);
    stop.store(true, Ordering::Relaxed);
    let _ = TcpStream::connect(sick_addr);
    server.join().unwrap();
}

/// Reads everything the balancer sends a client that sends `request`.
fn exchange(addr: SocketAddr, request: &[u8]) -> String {
    let mut s = connect(addr).unwrap();
    if !request.is_empty() {
        s.write_all(request).unwrap();
    }
    let mut reply = Vec::new();
    // A reset instead of a clean close also ends the exchange.
    let _ = s.read_to_end(&mut reply);
    String::from_utf8_lossy(&reply).into_owned()
}

/// With every backend down or draining a client is closed at once, or
/// answered 503 with --http-replies; when every connect fails it is
/// answered 502.
#[test]
fn no_backend_gives_close_503_or_502() {
    let demo = Demo::start("127.0.0.1:0", "d");
    let quiet = |config: &mut Config, replies: bool| {
        config.health = HealthConfig {
            check: CheckKind::Off,
            passive_failures: 0,
            http_replies: replies,
            ..HealthConfig::default()
        };
    };
    // Draining (operator) and down (health) both count as unavailable.
    let lb = TestBalancer::with(&[demo.addr], |c| quiet(c, true));
    let backend = lb.backend(demo.addr);
    lb.scheduler.drain(backend.id(), true).unwrap();
    let reply = exchange(lb.addr, b"");
    assert!(
        reply.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
        "{reply:?}"
    );
    lb.scheduler.drain(backend.id(), false).unwrap();
    backend.set_healthy(false);
    assert!(exchange(lb.addr, b"").starts_with("HTTP/1.1 503 "));
    backend.set_healthy(true);
    assert_eq!(request(lb.addr).unwrap(), "d");

    // Without --http-replies: closed at once, nothing sent.
    let lb = TestBalancer::with(&[demo.addr], |c| quiet(c, false));
    lb.backend(demo.addr).set_healthy(false);
    let started = Instant::now();
    assert_eq!(exchange(lb.addr, b""), "");
    assert!(started.elapsed() < Duration::from_secs(2));

    // A backend that refuses: 502.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let lb = TestBalancer::with(&[closed], |c| quiet(c, true));
    let reply = exchange(lb.addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(
        reply.starts_with("HTTP/1.1 502 Bad Gateway\r\n"),
        "{reply:?}"
    );
}

/// Active checks alone (no client traffic): a stopped backend is DOWN no
/// sooner than (fall − 1) intervals (one failed check does not flap it) and
/// no later than fall intervals; back, it is UP after (rise − 1) to rise
/// intervals.
#[test]
fn active_checks_follow_fall_and_rise() {
    let interval = Duration::from_millis(200);
    let (fall, rise) = (3u32, 2u32);
    let a = Demo::start("127.0.0.1:0", "a");
    let mut b = Demo::start("127.0.0.1:0", "b");
    let b_addr = b.addr;
    let lb = TestBalancer::with(&[a.addr, b_addr], |config| {
        config.health = tcp_checks(interval, fall, rise);
    });
    let backend_b = lb.backend(b_addr);
    b.stop();
    let down = time_until(Duration::from_secs(10), || !backend_b.is_healthy()).expect("down");
    let _b = Demo::start(&b_addr.to_string(), "b");
    let up = time_until(Duration::from_secs(10), || backend_b.is_healthy()).expect("up");
    eprintln!("DOWN after {down:?}, UP after {up:?}");
    // Checks come every interval; the first failing one at most one interval
    // after the stop. Slack: scheduling jitter of a busy machine.
    let jitter = Duration::from_millis(150);
    assert!(
        down >= (interval * (fall - 1)).saturating_sub(jitter),
        "{down:?}"
    );
    assert!(down <= interval * fall + jitter, "{down:?}");
    assert!(
        up >= (interval * (rise - 1)).saturating_sub(jitter),
        "{up:?}"
    );
    assert!(up <= interval * rise + jitter, "{up:?}");
}
