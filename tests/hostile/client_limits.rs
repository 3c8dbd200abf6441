//! The per-client controls attacked: `max_connections_per_client` against
//! a flood from one address, against more addresses than its table holds,
//! and against a reset mid-way; `upload_rate` and `download_rate` against
//! garbage values and a throttled reader that resets.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use crate::child::{Scratch, BIN};
use crate::common::{until, wait_for, TestBackend, TestBalancer, IO_TIMEOUT};
use crate::peers::connect_from;
use rodizio::limiter::{Rate, RateLimitConfig};
use rodizio::proxy::ProxyConfig;
use rodizio::units::ByteRate;

/// A connection from `from` that echoed one byte, or `None` when closed.
fn served(from: [u8; 4], lb: &TestBalancer) -> Option<TcpStream> {
    let mut s = connect_from(from, lb.addr, IO_TIMEOUT).expect("connect");
    let _ = s.write_all(b"x");
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(1) if b[0] == b'x' => Some(s),
        Ok(_) => None,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => None,
        Err(e) => panic!("neither echoed nor closed: {e}"),
    }
}

/// Whether a connection from `from` gets the backend's stream (`false`:
/// closed by the balancer).
fn streams(from: [u8; 4], lb: &TestBalancer) -> bool {
    let mut s = connect_from(from, lb.addr, IO_TIMEOUT).expect("connect");
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(1) => b[0] == b'd',
        Ok(_) => false,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => false,
        Err(e) => panic!("neither streamed nor closed: {e}"),
    }
}

/// 300 idle connections at once from one address capped at 10: 290 are
/// closed at once and take no worker; another address is served.
#[test]
fn a_flood_from_one_address_takes_only_its_cap_of_workers() {
    let backend = TestBackend::echo();
    let lb = TestBalancer::with(&[backend.addr()], |c| {
        c.proxy.max_connections_per_client = Some(10);
    });
    let flood: Vec<TcpStream> = (0..300)
        .map(|_| connect_from([127, 0, 0, 2], lb.addr, IO_TIMEOUT).unwrap())
        .collect();
    until("290 refusals counted", || {
        lb.stats.snapshot().too_many_connections == 290
    });
    assert!(served([127, 0, 0, 3], &lb).is_some());
    let s = lb.stats.snapshot();
    assert!(s.workers_busy <= 11, "{s:?}");
    let closed = flood
        .into_iter()
        .filter_map(|mut s| {
            let mut b = [0u8; 1];
            s.set_read_timeout(Some(Duration::from_millis(200)))
                .unwrap();
            matches!(s.read(&mut b), Ok(0) | Err(_)).then_some(())
        })
        .count();
    assert!(closed >= 290, "{closed}");
}

/// More addresses than the table holds (16): the ones that find it full
/// are refused, never served uncounted, and once they leave every address
/// is served again (the table emptied itself).
#[test]
fn more_addresses_than_the_table_holds_stay_bounded() {
    let backend = TestBackend::echo();
    let lb = TestBalancer::with(&[backend.addr()], |c| {
        c.proxy.max_connections_per_client = Some(3);
        let mut limit = RateLimitConfig::new(Rate::parse("100000/1s").unwrap());
        limit.max_clients = 16;
        c.rate_limit = Some(limit);
    });
    let mut held = Vec::new();
    let mut refused = 0;
    for last in 2..=61u8 {
        match served([127, 0, 1, last], &lb) {
            Some(s) => held.push(s),
            None => refused += 1,
        }
    }
    assert!(held.len() <= 16, "{} served", held.len());
    assert_eq!(held.len() + refused, 60);
    until("the refusals counted", || {
        lb.stats.snapshot().too_many_connections == refused as u64
    });
    drop(held);
    until("every connection ended", || lb.stats.snapshot().active == 0);
    // The places are given back when each worker ends: poll for them.
    for last in [2u8, 30, 61] {
        assert!(
            wait_for(IO_TIMEOUT, || served([127, 0, 1, last], &lb).is_some()),
            "127.0.1.{last} served again"
        );
    }
}

/// A throttled download read slowly, then reset mid-way: the worker is
/// released and the address's count goes back down.
#[test]
fn a_throttled_slow_reader_that_resets_frees_its_worker_and_place() {
    let backend = TestBackend::start(Arc::new(|mut stream: TcpStream| {
        let chunk = [b'd'; 16 * 1024];
        loop {
            stream.write_all(&chunk)?;
        }
    }));
    let lb = TestBalancer::with(&[backend.addr()], |c| {
        c.proxy = ProxyConfig {
            max_connections_per_client: Some(1),
            download_rate: Some(ByteRate::parse("32k").unwrap()),
            ..ProxyConfig::default()
        };
    });
    let mut slow = connect_from([127, 0, 0, 2], lb.addr, IO_TIMEOUT).unwrap();
    let mut got = 0;
    let mut buf = [0u8; 100];
    while got < 5000 {
        got += slow.read(&mut buf).unwrap();
    }
    until("served", || lb.stats.snapshot().active == 1);
    assert!(!streams([127, 0, 0, 2], &lb), "at its cap");
    // A reset: SO_LINGER 0, then close.
    socket2::SockRef::from(&slow)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(slow);
    until("the worker released", || {
        let s = lb.stats.snapshot();
        s.active == 0 && s.workers_busy == 0
    });
    let s = lb.stats.snapshot();
    assert!(s.ended_client_reset == 1, "{s:?}");
    assert!(
        wait_for(IO_TIMEOUT, || streams([127, 0, 0, 2], &lb)),
        "its place is free again"
    );
}

/// Garbage, negative and huge rates and caps: refused at start-up with
/// one line and exit 2, as flags and as keys of the file.
#[test]
fn bad_rates_and_caps_are_refused_in_one_line() {
    let dir = Scratch::new("client-limits");
    let path = dir.path("bad.json");
    for (key, value) in [
        ("download_rate", r#""fast""#),
        ("download_rate", r#""-1""#),
        ("upload_rate", r#""99999999999999999999""#),
        ("upload_rate", r#""2000000m""#),
        ("upload_rate", "-1024"),
        ("upload_rate", "1.5"),
        ("max_connections_per_client", "0"),
        ("max_connections_per_client", "-5"),
        ("max_connections_per_client", "1e30"),
    ] {
        std::fs::write(
            &path,
            format!(r#"{{"backends": ["127.0.0.1:1"], "{key}": {value}}}"#),
        )
        .unwrap();
        let out = crate::child::output(
            std::process::Command::new(BIN)
                .arg("check-config")
                .arg(&path),
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{key} {value}: {err}");
        assert!(err.contains(&format!("`{key}`")), "{key} {value}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    for flag in [
        "--download-rate=-1",
        "--upload-rate=lots",
        "--upload-rate=9999999999m",
    ] {
        let (code, err) = refused_at_start(&["-l", "127.0.0.1:0", "-b", "127.0.0.1:1", flag]);
        assert_eq!(code, Some(2), "{flag}: {err}");
        let name = flag.split('=').next().unwrap();
        assert!(err.contains(name), "{flag}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{flag}: {err}");
    }
}

/// Runs the binary with `args`, expecting it to refuse them at start-up:
/// its exit code and standard error. One that starts serving instead is
/// killed (by its PID) after 10 s, and the test fails.
fn refused_at_start(args: &[&str]) -> (Option<i32>, String) {
    let mut command = crate::child::command(&[&["--allow-root"], args].concat());
    command.env_remove("RUST_LOG");
    let out = crate::child::run_within(&mut command, IO_TIMEOUT);
    (out.code, out.stderr)
}

/// A reload with a bad rate or cap is refused whole: the running values
/// stay; a good one applies them live.
#[test]
fn a_bad_reload_keeps_the_running_caps() {
    use rodizio::config::{file, Overrides};
    use rodizio::reload::Reloader;
    let dir = Scratch::new("client-limits-reload");
    let path = dir.path("rodizio.json");
    let good = r#"{"listen": "127.0.0.1:0", "backends": ["127.0.0.1:1"],
        "download_rate": "1MB", "max_connections_per_client": 4}"#;
    std::fs::write(&path, good).unwrap();
    let config = file::load(&path)
        .unwrap()
        .settle(&Overrides::default())
        .unwrap();
    let balancer = rodizio::Balancer::bind(config).unwrap();
    let reloader = Reloader::new(&path, Overrides::default(), &balancer);
    let running = || balancer.live().proxy.load_full();
    for bad in [
        r#""download_rate": "-1MB""#,
        r#""upload_rate": "a lot""#,
        r#""max_connections_per_client": 0"#,
    ] {
        let text = format!(r#"{{"listen": "127.0.0.1:0", "backends": ["127.0.0.1:1"], {bad}}}"#);
        std::fs::write(&path, text).unwrap();
        let err = reloader.reload().unwrap_err().to_string();
        assert_eq!(err.lines().count(), 1, "{err}");
        assert_eq!(running().download_rate, Some(ByteRate(1 << 20)), "{bad}");
        assert_eq!(running().max_connections_per_client, Some(4), "{bad}");
    }
    std::fs::write(
        &path,
        r#"{"listen": "127.0.0.1:0", "backends": ["127.0.0.1:1"], "upload_rate": "64k"}"#,
    )
    .unwrap();
    reloader.reload().unwrap();
    assert_eq!(running().upload_rate, Some(ByteRate(65536)));
    assert_eq!(running().download_rate, None);
    assert_eq!(running().max_connections_per_client, None);
}
