//! The admin API through real HTTP requests: each endpoint, each error,
//! a drain with a connection in flight, maintenance and health checks,
//! the token, start-up refusals, shutdown, and its latency under load.

mod common;

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use rodizio::admin::ReloadHook;
use rodizio::health::{CheckKind, HealthConfig};
use rodizio::scheduler::Algorithm;
use rodizio::{Balancer, Config, Error};
use serde_json::{json, Value};

/// One HTTP answer as the test reads it.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: String,
    json: Value,
}

/// Sends one request by hand (HTTP/1.1, `Connection: close`) and reads the
/// whole answer.
fn call_raw(addr: SocketAddr, head: &str, body: &[u8]) -> io::Result<Answer> {
    let mut s = connect(addr)?;
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    parse_answer(&raw)
}

fn parse_answer(raw: &[u8]) -> io::Result<Answer> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
    let text = String::from_utf8_lossy(raw);
    let (headers, body) = text.split_once("\r\n\r\n").ok_or_else(|| bad("no head"))?;
    let status = headers
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status"))?;
    let body = if headers
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body).ok_or_else(|| bad("bad chunks"))?
    } else {
        body.to_string()
    };
    let json = serde_json::from_str(&body).map_err(|e| bad(&format!("{e}: {body:?}")))?;
    Ok(Answer {
        status,
        headers: headers.to_string(),
        json,
    })
}

fn dechunk(mut text: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = text.split_once("\r\n")?;
        let size = usize::from_str_radix(size.trim(), 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        out.push_str(rest.get(..size)?);
        text = rest.get(size + 2..)?;
    }
}

/// `METHOD path` with an optional JSON body and extra header lines.
fn call_with(addr: SocketAddr, method: &str, path: &str, body: &str, extra: &str) -> Answer {
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n{extra}\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    call_raw(addr, &head, body.as_bytes()).expect("admin request")
}

fn call(addr: SocketAddr, method: &str, path: &str, body: &str) -> Answer {
    call_with(addr, method, path, body, "")
}

fn get(addr: SocketAddr, path: &str) -> Answer {
    call(addr, "GET", path, "")
}

/// A test config with the admin API on `127.0.0.1:0`.
fn admin_config(backends: &[SocketAddr]) -> Config {
    Config {
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        ..config(backends)
    }
}

fn admin(b: &TestBalancer) -> SocketAddr {
    b.admin.expect("the admin API is on")
}

/// The backend named `name` in a `GET /backends` answer.
fn entry(list: &Value, name: &str) -> Option<Value> {
    list.as_array()?
        .iter()
        .find(|b| b["address"] == name)
        .cloned()
}

/// One echo exchange of `len` bytes through the balancer, checked.
fn echo_once(addr: SocketAddr, len: usize, seed: u64) {
    let data = Arc::new(test_data(len, seed));
    let back = echo_through(connect(addr).unwrap(), Arc::clone(&data)).unwrap();
    assert!(back == *data, "the echo differs");
}

/// `GET /backends` lists each backend with its state and counters, and the
/// byte counters are exactly what went through.
#[test]
fn lists_backends_with_their_counters() {
    let (a, b) = (TestBackend::echo(), TestBackend::echo());
    let lb = TestBalancer::start(admin_config(&[a.addr(), b.addr()]));
    let answer = get(admin(&lb), "/backends");
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(answer.headers.contains("application/json"));
    let list = answer.json.as_array().unwrap().clone();
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["address"], a.addr().to_string());
    assert_eq!(list[0]["state"], "up");
    assert_eq!(list[0]["weight"], 1);
    assert_eq!(list[0]["total"], 0);
    assert_eq!(list[0]["last_check"], Value::Null);
    // Round robin: the first client goes to `a`.
    echo_once(lb.addr, 10_000, 1);
    until("the connection counted", || {
        lb.backend(a.addr()).bytes_to_client() == 10_000
    });
    let list = get(admin(&lb), "/backends").json;
    let on_a = entry(&list, &a.addr().to_string()).unwrap();
    assert_eq!(on_a["total"], 1);
    assert_eq!(on_a["active"], 0);
    assert_eq!(on_a["bytes_to_backend"], 10_000);
    assert_eq!(on_a["bytes_to_client"], 10_000);
    assert_eq!(on_a["connect_failures"], 0);
    let on_b = entry(&list, &b.addr().to_string()).unwrap();
    assert_eq!(on_b["total"], 0);
    assert_eq!(on_b["bytes_to_backend"], 0);
    lb.stop();
}

/// `POST /backends` adds a backend that then gets clients; a duplicate is
/// 409, a bad body or an address that does not resolve is 400.
#[test]
fn adds_a_backend_and_refuses_bad_ones() {
    let (a, b) = (TestBackend::echo(), TestBackend::echo());
    let lb = TestBalancer::start(admin_config(&[a.addr()]));
    let at = admin(&lb);
    let body = json!({"address": b.addr().to_string(), "weight": 2}).to_string();
    let answer = call(at, "POST", "/backends", &body);
    assert_eq!(answer.status, 201, "{answer:?}");
    assert_eq!(answer.json["address"], b.addr().to_string());
    assert_eq!(answer.json["weight"], 2);
    assert_eq!(answer.json["state"], "up");
    for i in 0..4 {
        echo_once(lb.addr, 100, i);
    }
    assert_eq!(a.accepted(), 2);
    assert_eq!(b.accepted(), 2, "round robin reaches the new backend");
    let again = call(at, "POST", "/backends", &body);
    assert_eq!(again.status, 409, "{again:?}");
    assert!(again.json["error"].as_str().unwrap().contains("exists"));
    for (bad, says) in [
        ("{", "bad JSON"),
        ("[]", "bad JSON"),
        (r#"{"weight": 2}"#, "missing field `address`"),
        (
            r#"{"address": "127.0.0.1:1", "color": "red"}"#,
            "unknown field",
        ),
        (r#"{"address": "127.0.0.1"}"#, "HOST:PORT"),
        (
            r#"{"address": "127.0.0.1:1,weight=3", "weight": 2}"#,
            "`weight` is given twice",
        ),
        (
            r#"{"address": "127.0.0.1:1", "weight": 0}"#,
            "weight must be",
        ),
        (
            r#"{"address": "no-such-host.invalid:80"}"#,
            "no-such-host.invalid",
        ),
    ] {
        let answer = call(at, "POST", "/backends", bad);
        assert_eq!(answer.status, 400, "{bad}: {answer:?}");
        let error = answer.json["error"].as_str().unwrap();
        assert!(error.contains(says), "{bad}: {error}");
    }
    assert_eq!(lb.scheduler.snapshot().len(), 2, "nothing else was added");
    lb.stop();
}

/// `PUT /backends/{address}` with a weight: the weighted cycle follows it.
#[test]
fn a_weight_change_reaches_the_weighted_cycle() {
    let (a, b) = (TestBackend::echo(), TestBackend::echo());
    let mut config = admin_config(&[a.addr(), b.addr()]);
    config.algorithm = Algorithm::WeightedRoundRobin;
    let lb = TestBalancer::start(config);
    let path = format!("/backends/{}", a.addr());
    let answer = call(admin(&lb), "PUT", &path, r#"{"weight": 3}"#);
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.json["weight"], 3);
    for i in 0..8 {
        echo_once(lb.addr, 100, i);
    }
    assert_eq!((a.accepted(), b.accepted()), (6, 2));
    for bad in [
        r#"{"weight": 0}"#,
        r#"{"weight": 1001}"#,
        r#"{}"#,
        r#"{"state": "up"}"#,
    ] {
        let answer = call(admin(&lb), "PUT", &path, bad);
        assert_eq!(answer.status, 400, "{bad}: {answer:?}");
    }
    assert_eq!(
        lb.backend(a.addr()).weight(),
        3,
        "bad requests changed nothing"
    );
    let unknown = call(
        admin(&lb),
        "PUT",
        "/backends/127.0.0.1:1",
        r#"{"weight": 2}"#,
    );
    assert_eq!(unknown.status, 404, "{unknown:?}");
    lb.stop();
}

/// A drain through the API while a connection is in flight: it finishes
/// byte for byte, and no new client reaches that backend; `ready` brings
/// it back.
#[test]
fn a_drain_lets_the_connection_in_flight_finish() {
    let (a, b) = (TestBackend::echo(), TestBackend::echo());
    let lb = TestBalancer::start(admin_config(&[a.addr(), b.addr()]));
    let data = test_data(200_000, 7);
    let mut client = connect(lb.addr).unwrap();
    let (first, second) = data.split_at(100_000);
    client.write_all(first).unwrap();
    let mut back = vec![0; data.len()];
    client.read_exact(&mut back[..first.len()]).unwrap();
    assert_eq!(a.accepted(), 1, "the first client is on a");
    let path = format!("/backends/{}", a.addr());
    let answer = call(admin(&lb), "PUT", &path, r#"{"state": "drain"}"#);
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.json["state"], "draining");
    assert_eq!(answer.json["active"], 1);
    for i in 0..4 {
        echo_once(lb.addr, 1000, i);
    }
    assert_eq!(
        a.accepted(),
        1,
        "no new client reached the draining backend"
    );
    assert_eq!(b.accepted(), 4);
    client.write_all(second).unwrap();
    client.shutdown(std::net::Shutdown::Write).unwrap();
    client.read_exact(&mut back[first.len()..]).unwrap();
    assert!(is_closed(&mut client));
    assert!(
        back == data,
        "the connection in flight finished byte for byte"
    );
    let answer = call(admin(&lb), "PUT", &path, r#"{"state": "ready"}"#);
    assert_eq!(answer.json["state"], "up");
    echo_once(lb.addr, 10, 1);
    echo_once(lb.addr, 10, 2);
    assert_eq!(a.accepted(), 2, "ready: back in rotation");
    lb.stop();
}

/// Maintenance: no new client, and no health check while it lasts; `ready`
/// brings both back.
#[test]
fn maint_stops_health_checks() {
    let (a, b) = (TestBackend::echo(), TestBackend::echo());
    let mut config = admin_config(&[a.addr(), b.addr()]);
    config.health = HealthConfig {
        check: CheckKind::Tcp,
        interval: Duration::from_millis(30),
        timeout: Duration::from_millis(500),
        ..HealthConfig::default()
    };
    let lb = TestBalancer::start(config);
    let (ba, bb) = (lb.backend(a.addr()), lb.backend(b.addr()));
    until("a was checked", || ba.last_check().is_some());
    let path = format!("/backends/{}", a.addr());
    let answer = call(admin(&lb), "PUT", &path, r#"{"state": "maint"}"#);
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.json["state"], "maint");
    assert_eq!(answer.json["last_check"]["result"], "ok");
    // A round may have been under way: take a's last check once b has been
    // checked after the change, then wait for three more rounds of b.
    let after = |b: &rodizio::backend::Backend, t| b.last_check().is_some_and(|c| c.at > t);
    let changed = std::time::SystemTime::now();
    until("b checked after the change", || after(&bb, changed));
    let frozen = ba.last_check().unwrap();
    let a_accepted = a.accepted();
    for _ in 0..3 {
        let t = bb.last_check().unwrap().at;
        until("another round on b", || after(&bb, t));
    }
    assert_eq!(
        ba.last_check().unwrap(),
        frozen,
        "a was not checked in maint"
    );
    assert_eq!(a.accepted(), a_accepted, "no probe connection reached a");
    for i in 0..3 {
        echo_once(lb.addr, 10, i);
    }
    assert_eq!(a.accepted(), a_accepted, "no client reached a");
    let answer = call(admin(&lb), "PUT", &path, r#"{"state": "ready"}"#);
    assert_eq!(answer.json["state"], "up");
    until("a checked again", || after(&ba, frozen.at));
    lb.stop();
}

/// `DELETE` drains the backend and removes it once its last connection
/// ended; an unknown backend is 404.
#[test]
fn delete_drains_then_removes() {
    let (a, b) = (TestBackend::echo(), TestBackend::echo());
    let lb = TestBalancer::start(admin_config(&[a.addr(), b.addr()]));
    let mut client = connect(lb.addr).unwrap();
    client.write_all(b"hello").unwrap();
    let mut got = [0; 5];
    client.read_exact(&mut got).unwrap();
    let path = format!("/backends/{}", a.addr());
    let answer = call(admin(&lb), "DELETE", &path, "");
    assert_eq!(answer.status, 202, "{answer:?}");
    assert_eq!(answer.json["state"], "draining");
    assert_eq!(answer.json["removing"], true);
    let list = get(admin(&lb), "/backends").json;
    assert!(
        entry(&list, &a.addr().to_string()).is_some(),
        "still listed while a connection is open"
    );
    client.write_all(b" world").unwrap();
    client.shutdown(std::net::Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    client.read_to_end(&mut rest).unwrap();
    assert_eq!(rest, b" world");
    until("a removed", || {
        entry(&get(admin(&lb), "/backends").json, &a.addr().to_string()).is_none()
    });
    assert_eq!(lb.scheduler.snapshot().len(), 1);
    let again = call(admin(&lb), "DELETE", &path, "");
    assert_eq!(again.status, 404, "{again:?}");
    lb.stop();
}

/// `POST /reload`: 409 without a config file, 200 with the summary, 422
/// with the error (and the hook's failure changes nothing else).
#[test]
fn reload_calls_the_hook() {
    let a = TestBackend::echo();
    let lb = TestBalancer::start(admin_config(&[a.addr()]));
    let answer = call(admin(&lb), "POST", "/reload", "");
    assert_eq!(answer.status, 409, "{answer:?}");
    assert_eq!(answer.json["error"], "no config file, reload not supported");
    assert_eq!(get(admin(&lb), "/reload").status, 405);
    lb.stop();

    let fail = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicUsize::new(0));
    let hook: ReloadHook = {
        let (fail, calls) = (Arc::clone(&fail), Arc::clone(&calls));
        Arc::new(move || {
            calls.fetch_add(1, Ordering::SeqCst);
            if fail.load(Ordering::SeqCst) {
                Err("rodizio.json: line 3: expected a number".to_string())
            } else {
                Ok("2 backends, 1 added".to_string())
            }
        })
    };
    let lb = TestBalancer::start_with_reload(admin_config(&[a.addr()]), Some(hook));
    let answer = call(admin(&lb), "POST", "/reload", "");
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.json["summary"], "2 backends, 1 added");
    fail.store(true, Ordering::SeqCst);
    let answer = call(admin(&lb), "POST", "/reload", "");
    assert_eq!(answer.status, 422, "{answer:?}");
    assert_eq!(
        answer.json["error"],
        "rodizio.json: line 3: expected a number"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    echo_once(lb.addr, 100, 1);
    lb.stop();
}

/// `GET /config`: the settings in force, the live backend list included,
/// numbers as numbers and the backends as objects.
#[test]
fn config_shows_the_settings_in_force() {
    let (a, b) = (TestBackend::echo(), TestBackend::echo());
    let mut config = admin_config(&[a.addr()]);
    config.workers = 7;
    let lb = TestBalancer::start(config);
    let answer = get(admin(&lb), "/config");
    assert_eq!(answer.status, 200, "{answer:?}");
    let c = &answer.json;
    assert_eq!(c["workers"], 7);
    assert_eq!(c["algorithm"], "round-robin");
    assert_eq!(c["admin_listen"], admin(&lb).to_string());
    assert_eq!(
        c["backends"],
        json!([{"address": a.addr().to_string(), "weight": 1, "max_connections": null, "backup": false}])
    );
    assert_eq!(c["rate_limit"], Value::Null);
    assert_eq!(c["splice"], false);
    assert!(c["connect_timeout"].as_str().unwrap().ends_with('s'), "{c}");
    let body = json!({"address": b.addr().to_string(), "weight": 4, "max_connections": 9});
    assert_eq!(
        call(admin(&lb), "POST", "/backends", &body.to_string()).status,
        201
    );
    let c = get(admin(&lb), "/config").json;
    assert_eq!(
        c["backends"],
        json!([
            {"address": a.addr().to_string(), "weight": 1, "max_connections": null, "backup": false},
            {"address": b.addr().to_string(), "weight": 4, "max_connections": 9, "backup": false}
        ])
    );
    lb.stop();
}

/// Every bad request gets a JSON error, and the proxying goes on.
#[test]
fn bad_requests_get_json_errors_and_the_proxy_goes_on() {
    let a = TestBackend::echo();
    let lb = TestBalancer::start(admin_config(&[a.addr()]));
    let at = admin(&lb);
    let cases: Vec<(Answer, u16)> = vec![
        // `GET /` is the stats page (tests/metrics.rs and
        // scripts/observability-check.sh); other methods there are refused.
        (call(at, "DELETE", "/", ""), 405),
        (get(at, "/nope"), 404),
        (get(at, "/backends/x/y"), 404),
        (call(at, "DELETE", "/backends", ""), 405),
        (call(at, "PATCH", "/backends/127.0.0.1:1", "{}"), 405),
        (call(at, "POST", "/config", ""), 405),
        (call(at, "POST", "/backends", "not json"), 400),
        (
            call(at, "PUT", "/backends/127.0.0.1:1", r#"{"state": "drain"}"#),
            404,
        ),
        (call(at, "DELETE", "/backends/%5B::1%5D:1", ""), 404),
    ];
    for (answer, status) in &cases {
        assert_eq!(answer.status, *status, "{answer:?}");
        assert!(answer.json["error"].is_string(), "{answer:?}");
    }
    assert!(
        cases[3].0.headers.contains("Allow: GET, HEAD, POST"),
        "{:?}",
        cases[3]
    );
    // Too large, announced: refused without reading it.
    let head = format!(
        "POST /backends HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\
         Content-Length: {}\r\n\r\n",
        1024 * 1024
    );
    let answer = call_raw(at, &head, b"").unwrap();
    assert_eq!(answer.status, 413, "{answer:?}");
    // Too large, chunked: refused once 64 KiB were read.
    let head = "POST /backends HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\
                Transfer-Encoding: chunked\r\n\r\n";
    let mut body = Vec::new();
    for _ in 0..80 {
        body.extend_from_slice(format!("{:x}\r\n", 1024).as_bytes());
        body.extend_from_slice(&[b' '; 1024]);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(b"0\r\n\r\n");
    let answer = call_raw(at, head, &body).unwrap();
    assert_eq!(answer.status, 413, "{answer:?}");
    // A large body within the bound, read by the helper: fine.
    let padded = format!(
        r#"{{"address": "{}", "weight": 1}}{}"#,
        a.addr(),
        " ".repeat(4000)
    );
    let answer = call(at, "POST", "/backends", &padded);
    assert_eq!(answer.status, 409, "parsed, and it exists: {answer:?}");
    echo_once(lb.addr, 50_000, 3);
    lb.stop();
}

/// A body that stalls holds no handler: other admin requests are answered
/// meanwhile, and the stalled one gets 408 at the deadline, its connection
/// closed without waiting for the rest.
#[test]
fn a_stalled_body_does_not_hold_the_api() {
    let a = TestBackend::echo();
    let lb = TestBalancer::start(admin_config(&[a.addr()]));
    let at = admin(&lb);
    let mut slow = connect(at).unwrap();
    let head = "POST /backends HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\
                Content-Length: 2000\r\n\r\n";
    slow.write_all(head.as_bytes()).unwrap();
    slow.write_all(b"{").unwrap();
    for _ in 0..10 {
        assert_eq!(get(at, "/backends").status, 200);
    }
    // The body's deadline passes (and is counted): 408, and the
    // connection is closed though the body never came.
    let mut raw = Vec::new();
    slow.read_to_end(&mut raw).unwrap();
    let answer = parse_answer(&raw).unwrap();
    assert_eq!(answer.status, 408, "{answer:?}");
    assert_eq!(lb.stats.snapshot().admin_slow_bodies, 1);
    assert_eq!(get(at, "/backends").status, 200);
    lb.stop();
}

/// With a token file, every request needs the bearer token.
#[test]
fn the_token_is_required_when_configured() {
    let a = TestBackend::echo();
    let dir = std::env::temp_dir().join(format!("rodizio-admin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("token");
    std::fs::write(&file, "s3cret-token\n").unwrap();
    let mut config = admin_config(&[a.addr()]);
    config.admin_token_file = Some(file.clone());
    let lb = TestBalancer::start(config);
    let at = admin(&lb);
    for extra in [
        "",
        "Authorization: Bearer wrong\r\n",
        "Authorization: Bearer s3cret-toke\r\n",
        "Authorization: s3cret-token\r\n",
    ] {
        let answer = call_with(at, "GET", "/backends", "", extra);
        assert_eq!(answer.status, 401, "{extra:?}: {answer:?}");
        assert!(answer.json["error"].is_string());
    }
    let no = call_with(at, "DELETE", &format!("/backends/{}", a.addr()), "", "");
    assert_eq!(no.status, 401);
    assert_eq!(lb.scheduler.snapshot().len(), 1, "refused: nothing changed");
    let ok = call_with(
        at,
        "GET",
        "/backends",
        "",
        "Authorization: Bearer s3cret-token\r\n",
    );
    assert_eq!(ok.status, 200, "{ok:?}");
    lb.stop();
    // An empty or missing file is refused at start-up.
    std::fs::write(&file, " \n").unwrap();
    let mut config = admin_config(&[a.addr()]);
    config.admin_token_file = Some(file.clone());
    let err = Balancer::bind(config.clone()).err().unwrap();
    assert!(
        err.is_usage() && err.to_string().contains("is empty"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
    let err = Balancer::bind(config).err().unwrap();
    assert!(err.is_usage(), "{err}");
    assert!(err.to_string().contains("admin_token_file"), "{err}");
}

/// A non-loopback admin address is refused at start-up unless allowed.
#[test]
fn a_remote_admin_address_is_refused_unless_allowed() {
    let a = TestBackend::echo();
    let mut config = admin_config(&[a.addr()]);
    config.admin_listen = Some("0.0.0.0:0".parse().unwrap());
    let err = Balancer::bind(config.clone()).err().unwrap();
    assert!(matches!(&err, Error::InvalidSetting { setting, .. } if setting == "admin_listen"));
    let line = err.worded_as_flag().to_string();
    assert!(line.contains("--admin-allow-remote"), "{line}");
    config.admin_allow_remote = true;
    assert!(config.validate().is_ok());
}

/// Shutdown stops the admin API: its port is closed once `run` returned.
#[test]
fn shutdown_closes_the_admin_port() {
    let a = TestBackend::echo();
    let lb = TestBalancer::start(admin_config(&[a.addr()]));
    let at = admin(&lb);
    assert_eq!(get(at, "/backends").status, 200);
    lb.stop();
    until("the admin port closed", || {
        TcpStream::connect_timeout(&at, Duration::from_secs(1)).is_err()
    });
}

/// Latency of `GET /backends` while 8 clients keep the proxy busy (bounded:
/// 200 requests, at most 30 s); prints the numbers.
#[test]
fn admin_latency_under_load() {
    let backends: Vec<TestBackend> = (0..3).map(|_| TestBackend::echo()).collect();
    let addrs: Vec<SocketAddr> = backends.iter().map(|b| b.addr()).collect();
    let lb = TestBalancer::start(admin_config(&addrs));
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    let deadline = Instant::now() + Duration::from_secs(30);
    let load: Vec<_> = (0..8)
        .map(|i| {
            let (stop, served, addr) = (Arc::clone(&stop), Arc::clone(&served), lb.addr);
            thread::spawn(move || {
                let data = Arc::new(test_data(16 * 1024, i));
                while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                    let back = echo_through(connect(addr).unwrap(), Arc::clone(&data)).unwrap();
                    assert!(back == *data);
                    served.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    until("load running", || served.load(Ordering::SeqCst) > 50);
    let mut times = Vec::with_capacity(200);
    for _ in 0..200 {
        let started = Instant::now();
        let answer = get(admin(&lb), "/backends");
        times.push(started.elapsed());
        assert_eq!(answer.status, 200);
        assert!(Instant::now() < deadline, "bounded in time");
    }
    stop.store(true, Ordering::SeqCst);
    for t in load {
        t.join().unwrap();
    }
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let p = |q: f64| times[((times.len() - 1) as f64 * q) as usize];
    println!(
        "admin GET /backends under load ({} echo connections meanwhile): \
         p50 {:.3} ms, p90 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        served.load(Ordering::SeqCst),
        ms(p(0.5)),
        ms(p(0.9)),
        ms(p(0.99)),
        ms(times[times.len() - 1])
    );
    assert!(p(0.99) < Duration::from_secs(1), "p99 {:?}", p(0.99));
    lb.stop();
}
