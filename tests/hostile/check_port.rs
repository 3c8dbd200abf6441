//! A backend's own check, attacked: bad ports, addresses and kinds, and
//! options given twice, each refused in one line; and check endpoints that
//! accept and never answer, dribble, answer garbage or a megabyte without
//! a line end, or reset: each bounded by `health_timeout` and taken as a
//! failed check, never a hang of the health thread.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crate::common::{time_until, TestBackend, TestBalancer};
use rodizio::backend::BackendSpec;
use rodizio::health::{CheckKind, HealthConfig};

use crate::child::BIN;

/// Every bad own check, in the string form (in a file and as the argument
/// of `rodizio probe`) and the object form: exit 2, one line naming what
/// is wrong, clipped when the value is huge.
#[test]
fn bad_own_checks_are_refused_in_one_line() {
    let huge = "7".repeat(100_000);
    let object = |keys: &str| format!(r#"{{"host": "127.0.0.1", "port": 5432, {keys}}}"#);
    let string = |options: &str| format!(r#""127.0.0.1:5432,{options}""#);
    let cases = [
        (string("check_port=0"), "check_port must be a port"),
        (string("check_port=70000"), "check_port must be a port"),
        (string("check_port=garbage"), "check_port must be a port"),
        // Clipped before the reason: the value is not echoed whole.
        (string(&format!("check_port={huge}")), "more characters"),
        (string("check_address=db.invalid"), "IP address"),
        (string("check_address=999.1.1.1"), "IP address"),
        (string("check_port=8008,check_port=8009"), "given twice"),
        (string("health_check=ping"), "not a health check"),
        (object(r#""check_port": 0"#), "check_port must be a port"),
        (
            object(r#""check_port": 70000"#),
            "check_port must be a port",
        ),
        (object(r#""check_port": [8008]"#), "a string or a number"),
        (object(r#""check_address": "not an address""#), "IP address"),
        (
            object(r#""check_port": 8008, "check_port": 8009"#),
            "given twice",
        ),
        (object(r#""health_check": "ping""#), "not a health check"),
        (object(r#""rise": 0"#), "rise must be"),
        (object(r#""health_interval": "0s""#), "more than 0"),
        (object(r#""health_check": "send-expect""#), "health_expect"),
    ];
    let dir = std::env::temp_dir().join(format!("rodizio-hostile-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.json");
    for (backend, words) in &cases {
        std::fs::write(&path, format!(r#"{{"backends": [{backend}]}}"#)).unwrap();
        let out = crate::child::output(Command::new(BIN).arg("check-config").arg(&path));
        let err = String::from_utf8_lossy(&out.stderr);
        let shown = &backend[..backend.len().min(80)];
        assert_eq!(out.status.code(), Some(2), "{shown}: {err}");
        assert!(err.contains(words), "{shown}: {words} not in {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{shown}: {err}");
        assert!(err.len() < 2000, "{shown}: {} bytes", err.len());
    }
    let _ = std::fs::remove_dir_all(dir);
    for (spec, words) in [
        ("127.0.0.1:5432,check_port=0", "check_port must be a port"),
        ("127.0.0.1:5432,check_address=db.invalid", "IP address"),
        ("127.0.0.1:5432,rise=1,rise=2", "given twice"),
    ] {
        let out = crate::child::output(Command::new(BIN).args(["probe", spec]));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{spec}: {err}");
        assert!(err.contains(words), "{spec}: {err}");
    }
}

/// A balancer over one echo "database" per endpoint, each checked with
/// http on its endpoint's port every 100 ms, down after 2 failures; the
/// checks may take 300 ms.
fn over_endpoints(endpoints: &[&TestBackend], dbs: &[TestBackend]) -> TestBalancer {
    TestBalancer::with(&[], |config| {
        config.backends = dbs
            .iter()
            .zip(endpoints)
            .map(|(db, ep)| {
                BackendSpec::parse(&format!(
                    "{},check_port={},health_check=http,health_interval=100ms,fall=2",
                    db.addr(),
                    ep.addr().port()
                ))
                .unwrap()
            })
            .collect();
        config.health = HealthConfig {
            check: CheckKind::Tcp,
            interval: Duration::from_secs(1),
            timeout: Duration::from_millis(300),
            ..HealthConfig::default()
        };
    })
}

/// Reads the request head (bounded), then runs `then` on the stream.
fn after_request(
    then: impl Fn(&mut TcpStream) -> std::io::Result<()> + Send + Sync + 'static,
) -> TestBackend {
    TestBackend::start(Arc::new(move |mut stream: TcpStream| {
        let mut head = Vec::new();
        let mut buf = [0u8; 512];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
            match stream.read(&mut buf)? {
                0 => break,
                n => head.extend_from_slice(&buf[..n]),
            }
        }
        then(&mut stream)
    }))
}

/// Endpoints that accept and say nothing, dribble a status line a byte
/// every 100 ms (past the timeout), answer binary garbage, a megabyte
/// without a line end, or reset the connection: each backend goes down,
/// its last check says why, and no check took much longer than
/// `health_timeout` (300 ms).
#[test]
fn silent_slow_garbage_and_resetting_endpoints_fail_their_checks() {
    let silent = after_request(|s| {
        // Holds the connection until the check gives up and closes it.
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).map(drop)
    });
    let dribble = after_request(|s| {
        for b in b"HTTP/1.1 200 OK\r\n\r\n" {
            s.write_all(&[*b])?;
            thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    });
    let garbage = after_request(|s| s.write_all(b"\x00\xff\x16\x03 not http at all\r\n"));
    let huge = after_request(|s| s.write_all(&vec![b'A'; 1 << 20]));
    let reset = after_request(|s| {
        socket2::SockRef::from(&*s).set_linger(Some(Duration::ZERO))?;
        Ok(())
    });
    let endpoints = [&silent, &dribble, &garbage, &huge, &reset];
    let dbs: Vec<TestBackend> = endpoints.iter().map(|_| TestBackend::echo()).collect();
    let lb = over_endpoints(&endpoints, &dbs);
    for (db, why) in dbs.iter().zip([
        "GET /health",
        "GET /health",
        "not an HTTP status line",
        "not an HTTP status line",
        "GET /health",
    ]) {
        let b = lb.backend(db.addr());
        time_until(Duration::from_secs(20), || !b.is_healthy())
            .unwrap_or_else(|| panic!("{} never marked down", b.name()));
        let check = b.last_check().unwrap();
        let error = check.error.unwrap_or_default();
        assert!(error.contains(why), "{}: {error}", b.name());
        assert!(
            check.took < Duration::from_secs(2),
            "{}: a check took {:?}",
            b.name(),
            check.took
        );
        // No check went to the database port.
        assert_eq!(db.accepted(), 0, "{}", b.name());
    }
}

/// `POST /backends` over the admin API with a backend's own check: bad
/// ports, unknown keys and a `send-expect` with no `health_expect` are
/// answered 400 in one line and add nothing; a good one is added with its
/// check target.
#[test]
fn the_admin_api_takes_own_checks_and_refuses_bad_ones() {
    let db = TestBackend::echo();
    let lb = TestBalancer::with(&[db.addr()], |config| {
        config.admin_listen = Some("127.0.0.1:0".parse().unwrap());
    });
    let admin = lb.admin.unwrap();
    let post = |body: &str| -> (String, String) {
        let mut s = crate::common::connect(admin).unwrap();
        write!(
            s,
            "POST /backends HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
        (
            head.lines().next().unwrap_or("").to_string(),
            body.to_string(),
        )
    };
    let other = TestBackend::echo();
    let address = other.addr();
    for (extra, words) in [
        (r#""check_port": 0"#, "check_port must be a port"),
        (r#""check_port": 70000"#, "check_port must be a port"),
        (r#""check_address": "db.invalid""#, "IP address"),
        (r#""check_prot": 8008"#, "unknown field `check_prot`"),
        (r#""health_check": "send-expect""#, "health_expect"),
        (r#""health_check": "ping""#, "not a health check"),
    ] {
        let (status, body) = post(&format!(r#"{{"address": "{address}", {extra}}}"#));
        assert!(status.contains(" 400 "), "{extra}: {status} {body}");
        assert!(body.contains(words), "{extra}: {body}");
        assert_eq!(body.trim().lines().count(), 1, "{body}");
    }
    assert_eq!(lb.scheduler.snapshot().len(), 1, "a refused one was added");
    // A port nothing listens on: the check goes nowhere else.
    let port = crate::common::closed_port().port();
    let (status, body) = post(&format!(
        r#"{{"address": "{address}", "check_port": {port}, "rise": 1}}"#
    ));
    assert!(status.contains(" 201 "), "{status} {body}");
    let target = format!(r#""check_target":"127.0.0.1:{port}""#);
    assert!(body.contains(&target), "{body}");
    let own = format!(r#""own_check":"check_port={port},rise=1""#);
    assert!(body.contains(&own), "{body}");
}
