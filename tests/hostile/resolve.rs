//! Backends given by name (`resolve_interval`): bad intervals refused at
//! start-up, flag and file alike (a `services` entry too); a name that
//! gives 100 addresses keeps 16 and still serves; lookups that fail
//! forever, for 50 names at once, grow neither the log nor the memory.
//!
//! The balancer runs under a hosts file the test controls
//! (`common/names.rs`: a user and mount namespace of its own).

use std::time::{Duration, Instant};

use crate::child;
use crate::common::{self, wait_for};
use crate::names::{self, round_trip, same_port, Echo, Files, NamedBalancer};

/// Longest a refusal may take.
const WAIT: Duration = Duration::from_secs(10);

/// Runs `rodizio ARGS` (under the test's hosts file) to its end: its exit
/// code and standard error. Fails if it is still running after [`WAIT`].
fn run(files: &Files, args: &[&str]) -> (Option<i32>, String) {
    let ended = child::run_within(names::command(files, args).env("RUST_LOG", "warn"), WAIT);
    (ended.code, ended.stderr)
}

/// Zero, under a second, garbage, negative and over a day: refused with
/// exit code 2 and one line naming the setting, from a flag and from the
/// file (a `services` entry too); `off` and `30s` pass.
#[test]
fn bad_resolve_intervals_are_refused() {
    let files = Files::new("hostile-bad");
    for bad in [
        "0",
        "0s",
        "500ms",
        "soon",
        "-1s",
        "25h",
        "2d",
        "99999999999999999999s",
        "",
    ] {
        let (code, err) = run(
            &files,
            &[
                "--allow-root",
                "-l",
                "127.0.0.1:0",
                "-b",
                "127.0.0.1:1",
                "--resolve-interval",
                bad,
            ],
        );
        assert_eq!(code, Some(2), "--resolve-interval {bad:?}: {err}");
        assert!(err.contains("resolve-interval"), "{bad:?}: {err}");
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert!(lines.len() <= 3, "{bad:?}: {err}");
        assert!(
            !err.contains("Error {") && !err.contains("Duration"),
            "{err}"
        );
    }
    let config = files.config();
    let path = config.to_str().unwrap();
    for bad in [
        r#""0""#,
        "0",
        r#""soon""#,
        r#""25h""#,
        r#""400d""#,
        "-5",
        "true",
        "[1]",
    ] {
        for text in [
            format!(r#"{{"backends": ["127.0.0.1:1"], "resolve_interval": {bad}}}"#),
            format!(
                r#"{{"services": [{{"name": "a", "listen": "127.0.0.1:0",
                     "backends": ["127.0.0.1:1"], "resolve_interval": {bad}}}]}}"#
            ),
        ] {
            files.set_config(&text);
            let (code, err) = run(&files, &["check-config", path]);
            assert_eq!(code, Some(2), "{text}: {err}");
            assert!(err.contains("resolve_interval"), "{text}: {err}");
            assert_eq!(err.trim().lines().count(), 1, "{text}: {err}");
        }
    }
    files.set_config(
        r#"{"services": [{"name": "a", "listen": "127.0.0.1:0",
             "backends": ["127.0.0.1:1"], "resolve_interval": "30s"},
            {"name": "b", "listen": "127.0.0.1:0", "backends": ["127.0.0.1:2"],
             "resolve_interval": "off"}]}"#,
    );
    let (code, err) = run(&files, &["check-config", path]);
    assert_eq!(code, Some(0), "{err}");
}

/// A name that gives 100 addresses: the backend keeps the first 16 (shown
/// in `/backends`, said once in the log), a client is served by the 16th
/// when the first 15 refuse, and the 17th is never tried.
#[test]
fn a_name_with_100_addresses_keeps_16() {
    let mut pair = same_port(&[[127, 0, 1, 16], [127, 0, 1, 17]]);
    let port = pair[0].local_addr().unwrap().port();
    let beyond = Echo::on(pair.pop().unwrap());
    let sixteenth = Echo::on(pair.pop().unwrap());
    let files = Files::new("hostile-many");
    let hosts: String = (1..=100)
        .map(|i| format!("127.0.1.{i} many.rodizio.test\n"))
        .collect();
    files.set_hosts(&hosts);
    files.set_config(&format!(
        r#"{{"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0", "health_check": "off",
            "backends": ["many.rodizio.test:{port}"], "resolve_interval": "1s"}}"#
    ));
    let balancer = NamedBalancer::start(&files);
    round_trip(balancer.addr(), b"through the 16th").unwrap();
    assert_eq!((sixteenth.accepted(), beyond.accepted()), (1, 0));
    let body = common::http_get(balancer.admin(), "/backends")
        .unwrap()
        .body;
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    let addrs = list[0]["addresses"].as_array().unwrap();
    assert_eq!(addrs.len(), 16, "{body}");
    assert_eq!(addrs[15], format!("127.0.1.16:{port}"));
    // Three lookups again later (three times seen), still one warning.
    let mut seen = std::collections::BTreeSet::new();
    assert!(wait_for(Duration::from_secs(30), || {
        let body = common::http_get(balancer.admin(), "/backends")
            .unwrap()
            .body;
        let list: serde_json::Value = serde_json::from_str(&body).unwrap();
        if let Some(at) = list[0]["resolve"]["at_unix_ms"].as_u64() {
            seen.insert(at);
        }
        seen.len() >= 3
    }));
    assert_eq!(
        balancer.count("the name gives 100 addresses"),
        1,
        "{:#?}",
        balancer.log()
    );
}

/// Fifty names, all gone from the hosts file, each looked up every
/// second: every failure is counted, each name is logged once, the
/// balancer's memory does not grow with the failures, and clients are
/// still served at the last addresses.
#[test]
fn lookups_failing_forever_grow_neither_log_nor_memory() {
    const N: usize = 50;
    let ips: Vec<[u8; 4]> = (1..=N as u8).map(|i| [127, 0, 2, i]).collect();
    let listeners = same_port(&ips);
    let port = listeners[0].local_addr().unwrap().port();
    let echoes: Vec<Echo> = listeners.into_iter().map(Echo::on).collect();
    let files = Files::new("hostile-failing");
    let hosts: String = (1..=N)
        .map(|i| format!("127.0.2.{i} n{i}.rodizio.test\n"))
        .collect();
    files.set_hosts(&hosts);
    let backends: Vec<String> = (1..=N)
        .map(|i| format!(r#""n{i}.rodizio.test:{port}""#))
        .collect();
    files.set_config(&format!(
        r#"{{"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0", "health_check": "off",
            "algorithm": "round-robin", "backends": [{}], "resolve_interval": "1s"}}"#,
        backends.join(", ")
    ));
    let balancer = NamedBalancer::start(&files);
    let admin = balancer.admin();
    files.set_hosts("127.0.0.9 other.rodizio.test\n");
    let failures = || -> u64 {
        let metrics = common::http_get(admin, "/metrics").unwrap().body;
        metrics
            .lines()
            .filter(|l| l.starts_with("rodizio_backend_resolve_failures_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    assert!(wait_for(Duration::from_secs(30), || failures() >= 2 * N as u64));
    let rss_before = balancer.rss_kib();
    let lines_before = balancer.log().len();
    let target = failures() + 5 * N as u64;
    let started = Instant::now();
    assert!(
        wait_for(Duration::from_secs(60), || failures() >= target),
        "lookups stalled: {} of {target}",
        failures()
    );
    let rss_after = balancer.rss_kib();
    assert_eq!(
        balancer.count("again failed"),
        N,
        "one line per name: {:#?}",
        balancer.log()
    );
    // Nothing else either (a line per failure would be hundreds).
    assert!(
        balancer.log().len() <= lines_before + 2,
        "{:#?}",
        balancer.log()
    );
    assert!(
        rss_after <= rss_before + 1024,
        "{rss_before} KiB → {rss_after} KiB over {} failures in {:?}",
        5 * N,
        started.elapsed()
    );
    // Still served, each at its last good address.
    for i in 0..N {
        round_trip(balancer.addr(), format!("still {i}").as_bytes()).unwrap();
    }
    assert!(echoes.iter().all(|e| e.accepted() == 1));
}
