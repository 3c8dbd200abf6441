//! Backends given by name, followed when the name moves: the real binary
//! under a hosts file the test controls (`common/names.rs`: a user and
//! mount namespace of its own), `backend.rodizio.test` moved from 127.0.0.2 to
//! 127.0.0.3. With `resolve_interval`, the new address gets the new
//! connections within the interval while an open connection to the old
//! one goes on; without it, a reload looks the name up again; a failed
//! lookup keeps the last addresses and is logged once.

mod child;
mod common;
#[path = "common/names.rs"]
mod names;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use names::{round_trip, same_port, Echo, Files, NamedBalancer};

const NAME: &str = "backend.rodizio.test";
/// Generous: the machine may be loaded.
const DEADLINE: Duration = Duration::from_secs(30);

/// Two echo backends on one port, at 127.0.0.2 and 127.0.0.3.
fn two_backends() -> (Echo, Echo, u16) {
    let mut listeners = same_port(&[[127, 0, 0, 2], [127, 0, 0, 3]]);
    let port = listeners[0].local_addr().unwrap().port();
    let b = Echo::on(listeners.pop().unwrap());
    let a = Echo::on(listeners.pop().unwrap());
    (a, b, port)
}

fn config(port: u16, extra: &str) -> String {
    format!(
        r#"{{"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0",
            "backends": ["{NAME}:{port}"], "health_check": "off"{extra}}}"#
    )
}

/// Round trips through the balancer until `done` (bounded); how long it took.
fn until(balancer: &NamedBalancer, what: &str, done: impl Fn() -> bool) -> Duration {
    let started = Instant::now();
    let mut n = 0u32;
    while !done() {
        assert!(
            started.elapsed() < DEADLINE,
            "{what}: {:#?}",
            balancer.log()
        );
        n += 1;
        round_trip(balancer.addr(), format!("ping {n}").as_bytes()).expect("a round trip");
        std::thread::sleep(Duration::from_millis(50));
    }
    started.elapsed()
}

/// `/backends` of the default service, as JSON.
fn backends(balancer: &NamedBalancer) -> serde_json::Value {
    let r = common::http_get(balancer.admin(), "/backends").unwrap();
    assert!(r.status.contains("200"), "{r:?}");
    serde_json::from_str(&r.body).unwrap()
}

/// A name that moves is followed within `resolve_interval`: new
/// connections reach the new address, the old address gets no new one,
/// and a connection opened before the move goes on, byte for byte.
#[test]
fn a_moved_name_is_followed_within_the_interval() {
    let (a, b, port) = two_backends();
    let files = Files::new("moved");
    files.set_hosts(&format!("127.0.0.2 {NAME}\n"));
    files.set_config(&config(port, r#", "resolve_interval": "1s""#));
    let balancer = NamedBalancer::start(&files);
    let mut open = round_trip(balancer.addr(), b"before the move").unwrap();
    assert_eq!((a.accepted(), b.accepted()), (1, 0));
    let list = backends(&balancer);
    assert_eq!(list[0]["addresses"][0], format!("127.0.0.2:{port}"));
    assert_eq!(list[0]["resolve"]["name"], NAME);

    files.set_hosts(&format!("127.0.0.3 {NAME}\n"));
    let moved = Instant::now();
    until(&balancer, "no connection reached the new address", || {
        b.accepted() > 0
    });
    // Within the interval, plus a round's slack on a loaded machine.
    assert!(
        moved.elapsed() < Duration::from_secs(10),
        "{:?}",
        moved.elapsed()
    );
    balancer.wait_log(
        &format!("now gives 127.0.0.3:{port} (was 127.0.0.2:{port})"),
        DEADLINE,
    );
    let on_a = a.accepted();
    for i in 0..5 {
        round_trip(balancer.addr(), format!("after {i}").as_bytes()).unwrap();
    }
    assert_eq!(a.accepted(), on_a, "the old address got a new connection");
    assert_eq!(b.accepted(), 6);
    // The connection opened before the move still works.
    open.write_all(b"still here").unwrap();
    let mut back = [0u8; 10];
    open.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"still here");
    let list = backends(&balancer);
    assert_eq!(list[0]["addresses"][0], format!("127.0.0.3:{port}"));
    assert_eq!(list[0]["resolve"]["result"], "ok");
    assert_eq!(
        list.as_array().unwrap().len(),
        1,
        "one backend for the name"
    );
}

/// Without `resolve_interval`, nothing follows the name until a reload,
/// which looks it up again and says so.
#[test]
fn a_reload_looks_every_name_up_again() {
    let (a, b, port) = two_backends();
    let files = Files::new("reload");
    files.set_hosts(&format!("127.0.0.2 {NAME}\n"));
    files.set_config(&config(port, ""));
    let balancer = NamedBalancer::start(&files);
    round_trip(balancer.addr(), b"one").unwrap();
    files.set_hosts(&format!("127.0.0.3 {NAME}\n"));
    // No interval: the old address keeps the traffic (for three rounds of
    // what an interval of 1s would have been).
    let until_then = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until_then {
        round_trip(balancer.addr(), b"still a").unwrap();
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(b.accepted(), 0, "followed without an interval or a reload");
    assert!(a.accepted() > 1);
    balancer.signal(libc::SIGHUP);
    let line = balancer.wait_log(&format!("{NAME}:{port} now at 127.0.0.3:{port}"), DEADLINE);
    assert!(line.contains("reload: "), "{line}");
    round_trip(balancer.addr(), b"after the reload").unwrap();
    assert_eq!(b.accepted(), 1);
}

/// A lookup that fails (the name gone from the hosts file) keeps the last
/// addresses in use, is counted at every interval, and is logged once.
#[test]
fn a_failed_lookup_keeps_the_last_addresses_and_is_logged_once() {
    let (a, _b, port) = two_backends();
    let files = Files::new("failed");
    files.set_hosts(&format!("127.0.0.2 {NAME}\n"));
    files.set_config(&config(port, r#", "resolve_interval": "1s""#));
    let balancer = NamedBalancer::start(&files);
    round_trip(balancer.addr(), b"one").unwrap();
    files.set_hosts("127.0.0.9 other.rodizio.test\n");
    let failures = |balancer: &NamedBalancer| {
        backends(balancer)[0]["resolve"]["failures"]
            .as_u64()
            .unwrap()
    };
    until(&balancer, "fewer than 3 failed lookups", || {
        failures(&balancer) >= 3
    });
    let needle = format!("looking up {NAME} again failed");
    assert_eq!(balancer.count(&needle), 1, "{:#?}", balancer.log());
    assert!(balancer
        .log()
        .iter()
        .any(|l| l.contains("last addresses stay in use")));
    // Still served, at the last good address.
    let on_a = a.accepted();
    round_trip(balancer.addr(), b"still served").unwrap();
    assert_eq!(a.accepted(), on_a + 1);
    let list = backends(&balancer);
    assert_eq!(list[0]["resolve"]["result"], "failed");
    assert_eq!(list[0]["addresses"][0], format!("127.0.0.2:{port}"));
    let metrics = common::http_get(balancer.admin(), "/metrics").unwrap().body;
    let line = metrics
        .lines()
        .find(|l| l.starts_with("rodizio_backend_resolve_failures_total{"))
        .unwrap_or_else(|| panic!("{metrics}"));
    let n: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(n >= 3, "{line}");
}

/// `resolve_interval` turned on by a reload (the resolver thread starts
/// then): the reload says so, and a later move is followed with no other
/// reload.
#[test]
fn a_reload_turns_the_interval_on() {
    let (_a, b, port) = two_backends();
    let files = Files::new("turned-on");
    files.set_hosts(&format!("127.0.0.2 {NAME}\n"));
    files.set_config(&config(port, ""));
    let balancer = NamedBalancer::start(&files);
    round_trip(balancer.addr(), b"one").unwrap();
    files.set_config(&config(port, r#", "resolve_interval": "1s""#));
    balancer.signal(libc::SIGHUP);
    let line = balancer.wait_log("resolve_interval off → 1s", DEADLINE);
    assert!(line.contains("reload: "), "{line}");
    files.set_hosts(&format!("127.0.0.3 {NAME}\n"));
    until(
        &balancer,
        "the move was not followed after the reload",
        || b.accepted() > 0,
    );
    assert_eq!(balancer.count("reload: "), 1, "{:#?}", balancer.log());
}
