//! The access log's settings and its interim lines, attacked: templates
//! that are huge, name unknown fields or leave a brace open, targets that
//! are no address, limits that are no number, each refused by
//! `check-config` in one line naming the fault; and a thousand long
//! connections with an interim line every 100 ms, whose lines stay bounded
//! (one per connection per interval at most, the rest dropped and
//! counted) while a new client is served at once. (A syslog receiver gone,
//! full or slow: `access_log::syslog`'s and `access_log`'s unit tests and
//! `tests/access_log_syslog.rs`.)

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rodizio::access_log::Format;

use crate::child::Scratch;
use crate::common::{self, connect, echo_through, TestBackend, TestBalancer};
use crate::config_file::refused;

/// Each bad value of the access log's settings (and of the fail-over's
/// limits) is refused by `check-config` with exit 2 and one short line
/// that names the fault.
#[test]
fn bad_access_log_settings_are_refused_in_one_line() {
    let dir = Scratch::new("hostile-access-log");
    let huge = "{client}".repeat(100_000);
    let long_unknown = format!("{{{}}}", "x".repeat(100_000));
    let cases = [
        (
            r#""access_log_format": "{client} {bytes}""#.to_string(),
            "unknown field {bytes}",
        ),
        (format!(r#""access_log_format": "{huge}""#), "at most 4096"),
        (
            format!(r#""access_log_format": "{long_unknown}""#),
            "at most 4096",
        ),
        (r#""access_log_format": "{client""#.into(), "without its"),
        (r#""access_log_format": "a } b""#.into(), "lone '}'"),
        (r#""access_log_format": "   ""#.into(), "empty"),
        (r#""access_log_interval": "5ms""#.into(), "at least 100ms"),
        (
            r#""access_log_format": ["{client}"]"#.into(),
            "access_log_format",
        ),
        (
            r#""access_log_target": "syslog:nowhere:514""#.into(),
            "IP:PORT",
        ),
        (r#""access_log_target": "syslog:""#.into(), "IP:PORT"),
        (
            r#""access_log_target": "tcp://127.0.0.1:514""#.into(),
            "expected stdout, file",
        ),
        (
            r#""access_log_target": "file""#.into(),
            "needs `access_log_file`",
        ),
        (
            r#""access_log_interval": "0""#.into(),
            "access_log_interval",
        ),
        (
            r#""access_log_interval": "forever""#.into(),
            "access_log_interval",
        ),
        (r#""connect_retries": -1"#.into(), "connect_retries"),
        (r#""connect_retries": "many""#.into(), "connect_retries"),
        (r#""connect_retries": 1e99"#.into(), "connect_retries"),
        (
            r#""connect_retry_budget": "0""#.into(),
            "connect_retry_budget",
        ),
    ];
    for (i, (setting, says)) in cases.iter().enumerate() {
        let text = format!(r#"{{"backends": ["127.0.0.1:1"], "access_log": "text", {setting}}}"#);
        let path = dir.file(&format!("access-{i}.json"), text.as_bytes());
        let line = refused(&path);
        assert!(line.contains(says), "case {i}: {line}");
        assert!(line.len() < 800, "case {i}: a line of {} bytes", line.len());
    }
    // Without `access_log`, its settings would be ignored: refused too.
    let text = r#"{"backends": ["127.0.0.1:1"], "access_log_interval": "1s"}"#;
    let line = refused(&dir.file("no-log.json", text.as_bytes()));
    assert!(line.contains("needs `access_log`"), "{line}");
}

/// A thousand connections that stay open with `access_log_interval`
/// 100 ms: while they live, a new client is echoed at once, the file holds
/// at most one interim line per connection per interval (the grid), and
/// the lines the channel could not take are counted, not waited for.
#[test]
fn interim_lines_of_a_thousand_long_connections_are_bounded() {
    const CONNECTIONS: usize = 1_000;
    let dir = Scratch::new("hostile-interim");
    let path = dir.path("access.log");
    let backend = TestBackend::echo();
    let mut cfg = common::config(&[backend.addr()]);
    cfg.workers = CONNECTIONS + 64;
    cfg.access_log = Some(Format::Json);
    cfg.access_log_file = Some(path.clone());
    cfg.access_log_interval = Some(Duration::from_millis(100));
    let lb = TestBalancer::start(cfg);
    let started = Instant::now();
    let mut open: Vec<TcpStream> = Vec::with_capacity(CONNECTIONS);
    for i in 0..CONNECTIONS {
        let mut s = connect(lb.addr).unwrap();
        s.write_all(b"x").unwrap();
        let mut one = [0u8; 1];
        s.read_exact(&mut one)
            .unwrap_or_else(|e| panic!("connection {i}: {e}"));
        open.push(s);
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "opening took too long"
        );
    }
    // Lines flow while they live: wait (bounded) for a good many.
    let interim = || {
        std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(r#""event":"interim""#))
            .count()
    };
    assert!(
        common::wait_for(Duration::from_secs(20), || interim() >= 2 * CONNECTIONS),
        "only {} interim lines",
        interim()
    );
    let quick = Instant::now();
    let back = echo_through(connect(lb.addr).unwrap(), Arc::new(vec![9; 1000])).unwrap();
    assert_eq!(back.len(), 1000);
    assert!(
        quick.elapsed() < Duration::from_secs(2),
        "a new client waited {:?} under the interim lines",
        quick.elapsed()
    );
    let lived_ms = started.elapsed().as_millis() as usize;
    drop(open);
    lb.stop();
    let lines = interim();
    let most = CONNECTIONS * (lived_ms / 100 + 2);
    assert!(
        lines <= most,
        "{lines} interim lines in {lived_ms} ms, at most {most}"
    );
}
