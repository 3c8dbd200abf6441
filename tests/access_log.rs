//! `--access-log`: one line per connection when it ends, refused clients
//! included, with exact byte counts and how each connection ended.

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
