//! `--access-log`: one line per connection when it ends, refused clients
//! included, with exact byte counts and how each connection ended; the
//! interim lines of a connection that lives, and the line at its connect.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use rodizio::access_log::Format;
use rodizio::limiter::{Rate, RateLimitConfig};
use serde_json::Value;

/// The lines of `path` once there are at least `n`, parsed (bounded wait).
fn lines(path: &std::path::Path, n: usize) -> Vec<Value> {
    let mut got = Vec::new();
    let found = wait_for(IO_TIMEOUT, || {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        got = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect();
        got.len() >= n
    });
    assert!(found, "only {} lines: {got:?}", got.len());
    got
}

/// Three echo exchanges and one client refused by the rate limit: four
/// JSON lines, each with the client, the backend, exact bytes and its end.
#[test]
fn every_connection_and_every_refusal_gets_a_line() {
    let backend = TestBackend::echo();
    let path = std::env::temp_dir().join(format!("rodizio-access-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let mut config = config(&[backend.addr()]);
    config.access_log = Some(Format::Json);
    config.access_log_file = Some(path.clone());
    config.rate_limit = Some(RateLimitConfig::new(Rate {
        limit: 3,
        window: Duration::from_secs(60),
    }));
    let lb = TestBalancer::start(config);
    for i in 0..3 {
        let data = Arc::new(test_data(1000 + i, i as u64));
        let back = echo_through(connect(lb.addr).unwrap(), Arc::clone(&data)).unwrap();
        assert!(back == *data);
    }
    let mut refused = connect(lb.addr).unwrap();
    assert!(is_closed(&mut refused), "the fourth client is refused");
    let got = lines(&path, 4);
    let served: Vec<&Value> = got.iter().filter(|l| l["end"] != "rate_limited").collect();
    assert_eq!(served.len(), 3, "{got:?}");
    let mut sizes: Vec<u64> = served
        .iter()
        .map(|l| l["to_backend"].as_u64().unwrap())
        .collect();
    sizes.sort_unstable();
    assert_eq!(sizes, [1000, 1001, 1002]);
    for l in &served {
        assert_eq!(l["to_backend"], l["to_client"], "{l}");
        assert_eq!(l["backend"], backend.addr().to_string(), "{l}");
        assert!(
            l["end"] == "client_closed" || l["end"] == "backend_closed",
            "{l}"
        );
        assert!(l["client"].as_str().unwrap().starts_with("127.0.0.1:"));
        assert!(l["connect_us"].as_u64().is_some(), "{l}");
    }
    let refusal = got
        .iter()
        .find(|l| l["end"] == "rate_limited")
        .expect("a refusal line");
    assert_eq!(refusal["backend"], Value::Null);
    assert_eq!(lb.stats.snapshot().access_log_dropped, 0);
    lb.stop();
    let _ = std::fs::remove_file(&path);
}

/// A client whose backend refuses the connect gets a `connect_failed` line
/// that says why in a word: `"reason":"refused"`, not `null`.
#[test]
fn a_failed_connect_says_why() {
    let dead = closed_port();
    let path =
        std::env::temp_dir().join(format!("rodizio-access-refused-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let mut config = config(&[dead]);
    config.access_log = Some(Format::Json);
    config.access_log_file = Some(path.clone());
    let lb = TestBalancer::start(config);
    let mut client = connect(lb.addr).unwrap();
    assert!(
        is_closed(&mut client),
        "a client of a dead backend is closed"
    );
    let got = lines(&path, 1);
    assert_eq!(got[0]["end"], "connect_failed", "{got:?}");
    assert_eq!(got[0]["reason"], "refused", "{got:?}");
    assert_eq!(got[0]["backend"], dead.to_string(), "{got:?}");
    lb.stop();
    let _ = std::fs::remove_file(&path);
}

/// The JSON lines of `path` that match `keep`, once there are at least
/// `n` of them (bounded wait).
fn lines_where(path: &std::path::Path, n: usize, keep: impl Fn(&Value) -> bool) -> Vec<Value> {
    let mut got = Vec::new();
    let found = wait_for(IO_TIMEOUT, || {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        got = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .filter(|l| keep(l))
            .collect();
        got.len() >= n
    });
    assert!(found, "only {} lines: {got:?}", got.len());
    got
}

/// With `access_log_interval` 100 ms, a connection that lives gets
/// interim lines, each with the bytes since the one before: 100 bytes,
/// then 50 more, show as an interim line of 100 and a later one of 50
/// (none in between says more than nothing moved), and the end line has
/// the whole 150. The interim lines' bytes add up to the end line's.
#[test]
fn interim_lines_carry_the_bytes_since_the_last() {
    use std::io::{Read, Write};
    let backend = TestBackend::echo();
    let path = std::env::temp_dir().join(format!("rodizio-interim-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let mut config = config(&[backend.addr()]);
    config.access_log = Some(Format::Json);
    config.access_log_file = Some(path.clone());
    config.access_log_interval = Some(Duration::from_millis(100));
    let lb = TestBalancer::start(config);
    let mut client = connect(lb.addr).unwrap();
    let mut back = [0u8; 100];
    client.write_all(&[1; 100]).unwrap();
    client.read_exact(&mut back).unwrap();
    let interim = |l: &Value| l["event"] == "interim";
    let with = |n: u64| move |l: &Value| l["event"] == "interim" && l["to_backend"] == n;
    lines_where(&path, 1, with(100));
    client.write_all(&[2; 50]).unwrap();
    client.read_exact(&mut back[..50]).unwrap();
    lines_where(&path, 1, with(50));
    drop(client);
    let end = lines_where(&path, 1, |l| l["end"] == "client_closed").remove(0);
    assert_eq!(
        (end["to_backend"].as_u64(), end["to_client"].as_u64()),
        (Some(150), Some(150))
    );
    let lines = lines_where(&path, 2, interim);
    for l in &lines {
        assert_eq!(l["end"], Value::Null, "{l}");
        assert_eq!(l["backend"], backend.addr().to_string(), "{l}");
    }
    let up: u64 = lines
        .iter()
        .map(|l| l["to_backend"].as_u64().unwrap())
        .sum();
    let down: u64 = lines.iter().map(|l| l["to_client"].as_u64().unwrap()).sum();
    assert_eq!((up, down), (150, 150), "{lines:?}");
    lb.stop();
    let _ = std::fs::remove_file(&path);
}

/// The interim lines cut the pump's waits, not its idle timeout: with a
/// line every 100 ms, a silent connection still ends at `idle_timeout`
/// (700 ms), as `idle_timeout`, after a handful of interim lines.
#[test]
fn interim_lines_leave_the_idle_timeout_whole() {
    let backend = TestBackend::echo();
    let path =
        std::env::temp_dir().join(format!("rodizio-interim-idle-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let mut config = config(&[backend.addr()]);
    config.access_log = Some(Format::Json);
    config.access_log_file = Some(path.clone());
    config.access_log_interval = Some(Duration::from_millis(100));
    config.proxy.idle_timeout = Duration::from_millis(700);
    let lb = TestBalancer::start(config);
    let started = std::time::Instant::now();
    let mut client = connect(lb.addr).unwrap();
    assert!(is_closed(&mut client), "closed at the idle timeout");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(680) && waited < Duration::from_secs(3),
        "closed after {waited:?}"
    );
    let end = lines_where(&path, 1, |l| l["end"] == "idle_timeout");
    assert_eq!(end.len(), 1);
    let interim = lines_where(&path, 1, |l| l["event"] == "interim");
    assert!(
        (1..=12).contains(&interim.len()),
        "{} interim lines",
        interim.len()
    );
    lb.stop();
    let _ = std::fs::remove_file(&path);
}

/// `access_log_at_connect`: a line with `"event":"connect"` and no end
/// before the end line, for a served client.
#[test]
fn a_line_at_connect_comes_before_the_end() {
    let backend = TestBackend::echo();
    let path = std::env::temp_dir().join(format!("rodizio-at-connect-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let mut config = config(&[backend.addr()]);
    config.access_log = Some(Format::Json);
    config.access_log_file = Some(path.clone());
    config.access_log_at_connect = true;
    let lb = TestBalancer::start(config);
    let back = echo_through(connect(lb.addr).unwrap(), Arc::new(vec![7; 10])).unwrap();
    assert_eq!(back.len(), 10);
    let got = lines(&path, 2);
    assert_eq!(got[0]["event"], "connect", "{got:?}");
    assert_eq!(got[0]["end"], Value::Null, "{got:?}");
    assert_eq!(got[0]["to_backend"], 0, "{got:?}");
    assert!(got[1].get("event").is_none(), "{got:?}");
    assert_eq!(got[1]["to_backend"], 10, "{got:?}");
    lb.stop();
    let _ = std::fs::remove_file(&path);
}
