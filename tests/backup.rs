//! Backup backends and slow start with real traffic (`ab` and HTTP requests
//! through the balancer to demo backends), counted by the admin API's
//! `/backends`: a backup gets nothing while primaries serve, takes every
//! client when they are gone and hands back when one returns; a backend
//! back in rotation under `slow_start` gets a small share at first and its
//! full share once the ramp is over.

mod child;
mod common;
mod peers;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use child::{Child, Scratch};
use common::*;
use peers::{ab, free_port, loopback};
use rodizio::backend::BackendSpec;
use rodizio::health::{CheckKind, HealthConfig};
use rodizio::scheduler::Algorithm;
use rodizio::Config;
use serde_json::Value;

/// `GET /backends` of the admin API: each backend's JSON by address.
fn backends(admin: SocketAddr) -> Vec<Value> {
    let r = http_get(admin, "/backends").expect("GET /backends");
    assert!(r.status.contains("200"), "{r:?}");
    serde_json::from_str::<Value>(&r.body)
        .unwrap()
        .as_array()
        .cloned()
        .unwrap_or_else(|| panic!("not a list: {}", r.body))
}

/// One backend's JSON from `/backends`.
fn one(admin: SocketAddr, addr: SocketAddr) -> Value {
    let name = addr.to_string();
    backends(admin)
        .into_iter()
        .find(|b| b["address"] == name.as_str())
        .unwrap_or_else(|| panic!("{name} not listed"))
}

/// The connections the balancer handed to the backend at `addr`.
fn total(admin: SocketAddr, addr: SocketAddr) -> u64 {
    one(admin, addr)["total"].as_u64().unwrap()
}

/// `PUT /backends/{addr}` with `{"state": state}`.
fn set_state(admin: SocketAddr, addr: SocketAddr, state: &str) {
    let body = format!("{{\"state\":\"{state}\"}}");
    let head = format!(
        "PUT /backends/{addr} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let mut s = connect(admin).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body.as_bytes()).unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

/// A config over `specs`, with the admin API, and tcp checks every 100ms
/// (down after 1 failure, up after 1 success).
fn config(specs: &[String]) -> Config {
    let mut config = common::config(&[]);
    config.backends = specs
        .iter()
        .map(|s| BackendSpec::parse(s).unwrap())
        .collect();
    config.admin_listen = Some("127.0.0.1:0".parse().unwrap());
    config.proxy.connect_timeout = Duration::from_secs(1);
    config.health = HealthConfig {
        check: CheckKind::Tcp,
        interval: Duration::from_millis(100),
        timeout: Duration::from_millis(500),
        fall: 1,
        rise: 1,
        ..HealthConfig::default()
    };
    config
}

/// Two primaries and a backup: the backup gets no client while a primary
/// is up; with one primary in maintenance and the other stopped (found
/// down by the checks), the backup takes every client; a primary back
/// takes the new clients again and the backup's count stops growing.
#[test]
fn the_backup_takes_over_and_hands_back() {
    let a = Demo::start("127.0.0.1:0", "a");
    let mut b = Demo::start("127.0.0.1:0", "b");
    let c = Demo::start("127.0.0.1:0", "c");
    let specs = [
        a.addr.to_string(),
        format!("{},backup", c.addr),
        b.addr.to_string(),
    ];
    let lb = TestBalancer::start(config(&specs));
    let admin = lb.admin.unwrap();
    assert_eq!(one(admin, c.addr)["backup"], true);
    assert_eq!(one(admin, a.addr)["backup"], false);

    // (a) Primaries up: nothing for the backup.
    assert_eq!(ab(lb.addr, 300, 4), (300, 0));
    assert_eq!(total(admin, c.addr), 0);
    let both = total(admin, a.addr) + total(admin, b.addr);
    assert!((300..=304).contains(&both), "{both}");
    let metrics = http_get(admin, "/metrics").unwrap().body;
    let line = format!(
        "rodizio_backend_backup{{service=\"default\",backend=\"{}\"}} 1",
        c.addr
    );
    assert!(metrics.contains(&line), "{metrics}");

    // (b) Both primaries gone: the backup takes everything.
    let before = (total(admin, a.addr), total(admin, b.addr));
    set_state(admin, a.addr, "maint");
    b.stop();
    until("b found down", || one(admin, b.addr)["state"] == "down");
    assert_eq!(ab(lb.addr, 200, 4), (200, 0));
    let on_backup = total(admin, c.addr);
    assert!((200..=204).contains(&on_backup), "{on_backup}");
    assert_eq!((total(admin, a.addr), total(admin, b.addr)), before);

    // (c) A primary back: new clients go to it, the backup stops growing.
    set_state(admin, a.addr, "ready");
    assert_eq!(ab(lb.addr, 200, 4), (200, 0));
    // Up to `c` spare connections of (b)'s last round may be picked after
    // its count was read (they sat in the listen queue): 4 at most, where
    // a backup still in rotation would have taken all 200.
    let grew = total(admin, c.addr) - on_backup;
    assert!(grew <= 4, "the backup's count grew by {grew}");
    let on_a = total(admin, a.addr) - before.0;
    assert!((200..=204).contains(&on_a), "{on_a}");
    lb.stop();
}

/// Under slow start (4s), a backend back from maintenance gets a share of
/// the first second's clients well under its steady half, shows
/// `ramping`, and gets its half again once the ramp is over.
#[test]
fn slow_start_ramps_a_backend_back_from_maintenance() {
    let a = Demo::start("127.0.0.1:0", "a");
    let b = Demo::start("127.0.0.1:0", "b");
    let mut config = config(&[a.addr.to_string(), b.addr.to_string()]);
    config.health.check = CheckKind::Off;
    config.slow_start = Some(Duration::from_secs(4));
    let lb = TestBalancer::start(config);
    let admin = lb.admin.unwrap();
    // Running at start-up: no ramp.
    assert_eq!(one(admin, b.addr)["ramping"], false);
    assert_eq!(ab(lb.addr, 200, 2), (200, 0));
    let steady_b = total(admin, b.addr);
    assert!(
        (80..=120).contains(&steady_b),
        "steady share: {steady_b} of 200"
    );

    set_state(admin, b.addr, "maint");
    set_state(admin, b.addr, "ready");
    let shown = one(admin, b.addr);
    assert_eq!(shown["ramping"], true, "{shown}");
    assert!(shown["effective_weight"].as_f64().unwrap() < 0.5, "{shown}");
    // The first second's clients, one after another.
    let (a0, b0) = (total(admin, a.addr), total(admin, b.addr));
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(1) {
        request(lb.addr).unwrap();
    }
    let (da, db) = (total(admin, a.addr) - a0, total(admin, b.addr) - b0);
    let share = db as f64 / (da + db) as f64;
    assert!(da + db >= 20, "too few requests to judge: {da} + {db}");
    eprintln!("first second of the ramp: b took {db} of {}", da + db);
    assert!(share < 0.3, "first second: b took {db} of {}", da + db);

    until("the ramp ends", || one(admin, b.addr)["ramping"] == false);
    assert_eq!(one(admin, b.addr)["effective_weight"], 1.0);
    let b1 = total(admin, b.addr);
    assert_eq!(ab(lb.addr, 200, 2), (200, 0));
    let after = total(admin, b.addr) - b1;
    eprintln!("after the ramp: b took {after} of 200");
    assert!(
        (80..=120).contains(&after),
        "after the ramp: {after} of 200"
    );
    lb.stop();
}

/// The same with least connections and a backend added through the admin
/// API: it ramps too, and the pick goes on serving every client.
#[test]
fn slow_start_ramps_a_backend_added_at_run_time() {
    let a = Demo::start("127.0.0.1:0", "a");
    let b = Demo::start("127.0.0.1:0", "b");
    let mut config = config(&[a.addr.to_string()]);
    config.health.check = CheckKind::Off;
    config.algorithm = Algorithm::LeastConnections;
    config.slow_start = Some(Duration::from_secs(4));
    let lb = TestBalancer::start(config);
    let admin = lb.admin.unwrap();
    let body = format!("{{\"address\":\"{}\",\"backup\":false}}", b.addr);
    let head = format!(
        "POST /backends HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let mut s = connect(admin).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body.as_bytes()).unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    assert_eq!(one(admin, b.addr)["ramping"], true);
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed() < Duration::from_secs(1) {
        request(lb.addr).unwrap();
        n += 1;
    }
    let db = total(admin, b.addr);
    assert!(
        n >= 20 && (db as f64) < 0.3 * n as f64,
        "b took {db} of {n}"
    );
    lb.stop();
}

/// A reload that turns slow start on and adds a backend: the reload says
/// so, and the new backend ramps (a small share of real traffic, shown
/// `ramping`); the file's object form takes `"backup": true`.
#[test]
fn a_reload_turns_slow_start_on_and_the_backend_it_adds_ramps() {
    let a = Demo::start("127.0.0.1:0", "a");
    let b = Demo::start("127.0.0.1:0", "b");
    let c = Demo::start("127.0.0.1:0", "c");
    let admin = loopback(free_port());
    let dir = Scratch::new("backup-reload");
    let path = dir.path("rodizio.json");
    let write = |extra: &str, backends: &str| {
        let text = format!(
            "{{\"listen\": \"127.0.0.1:0\", \"admin_listen\": \"{admin}\", \
             \"health_check\": \"off\", {extra} \"backends\": [{backends}]}}"
        );
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    };
    let backup = format!(
        "{{\"host\": \"127.0.0.1\", \"port\": {}, \"backup\": true}}",
        c.addr.port()
    );
    write("", &format!("\"{}\", {backup}", a.addr));
    let mut rodizio = Child::start(child::command(&["--allow-root", "-c"]).arg(&path));
    until("the admin API", || http_get(admin, "/backends").is_ok());
    assert_eq!(one(admin, c.addr)["backup"], true);

    write(
        "\"slow_start\": \"1h\",",
        &format!("\"{}\", \"{}\", {backup}", a.addr, b.addr),
    );
    rodizio.signal(libc::SIGHUP);
    let line = rodizio.next_log("slow_start off → 1h");
    assert!(line.contains(&b.addr.to_string()), "{line}");
    let shown = one(admin, b.addr);
    assert_eq!(shown["ramping"], true, "{shown}");
    for _ in 0..200 {
        request(rodizio.addr).unwrap();
    }
    let (ta, tb) = (total(admin, a.addr), total(admin, b.addr));
    assert_eq!(ta + tb, 200);
    assert!(tb < 40, "the new backend took {tb} of 200 at once");
    assert_eq!(total(admin, c.addr), 0);
    let config = http_get(admin, "/config").unwrap().body;
    assert!(config.contains("\"slow_start\":\"1h\""), "{config}");

    // The backup made a primary, and slow start off, by another reload:
    // in place, and it serves at once.
    let primary = format!("\"{}\"", c.addr);
    write("", &format!("\"{}\", \"{}\", {primary}", a.addr, b.addr));
    rodizio.signal(libc::SIGHUP);
    let line = rodizio.next_log("now a primary");
    assert!(line.contains("slow_start 1h → off"), "{line}");
    assert_eq!(one(admin, c.addr)["backup"], false);
    for _ in 0..30 {
        request(rodizio.addr).unwrap();
    }
    assert_eq!(total(admin, c.addr), 10);
    drop(rodizio);
}
