//! Backends checked somewhere else than where their clients go: the
//! Patroni case (a database port whose traffic follows an HTTP endpoint on
//! another port answering 200 on the primary and 503 on a replica), each
//! backend at its own interval, rise and fall, and the check target shown
//! by `/backends`, `check-config` and `rodizio probe`.

mod child;
mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use child::{Child, BIN};
use common::{closed_port, connect, http_get, time_until, TestBackend, TestBalancer};
use rodizio::backend::BackendSpec;
use rodizio::health::{CheckKind, HealthConfig};

/// Patroni's REST API, reduced: an HTTP server answering every request
/// with the status it is told (200 primary, 503 replica), counting them.
struct Endpoint {
    status: Arc<AtomicU16>,
    server: TestBackend,
}

impl Endpoint {
    fn start(status: u16) -> Endpoint {
        let status = Arc::new(AtomicU16::new(status));
        let answer = Arc::clone(&status);
        let server = TestBackend::start(Arc::new(move |mut stream: TcpStream| {
            // The request head, at most 8 KiB (the stream has a timeout).
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
                match stream.read(&mut buf)? {
                    0 => break,
                    n => head.extend_from_slice(&buf[..n]),
                }
            }
            let code = answer.load(Ordering::SeqCst);
            let reason = if code == 200 {
                "OK"
            } else {
                "Service Unavailable"
            };
            write!(
                stream,
                "HTTP/1.1 {code} {reason}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )
        }));
        Endpoint { status, server }
    }

    fn set(&self, code: u16) {
        self.status.store(code, Ordering::SeqCst);
    }

    fn port(&self) -> u16 {
        self.server.addr().port()
    }

    /// Checks it answered.
    fn hits(&self) -> usize {
        self.server.accepted()
    }
}

/// The service's health settings: tcp every second, which the backends'
/// own settings override.
fn service_health() -> HealthConfig {
    HealthConfig {
        check: CheckKind::Tcp,
        interval: Duration::from_secs(1),
        timeout: Duration::from_millis(500),
        ..HealthConfig::default()
    }
}

/// `n` one-byte echoes through the balancer at `lb`.
fn echo_through(lb: SocketAddr, n: usize) {
    for i in 0..n {
        let mut s = connect(lb).unwrap();
        s.write_all(&[i as u8]).unwrap();
        let mut b = [0u8];
        s.read_exact(&mut b).unwrap();
        assert_eq!(b[0], i as u8);
    }
}

/// Two "databases" (echo servers) whose checks go to their own status
/// endpoint on another port: clients go to the one whose endpoint says
/// 200, never to the replica, and no check ever reaches a database port;
/// when the endpoints flip, the traffic follows within fall (and rise) ×
/// interval.
#[test]
fn traffic_follows_the_endpoint_that_says_primary() {
    let (db1, db2) = (TestBackend::echo(), TestBackend::echo());
    let (ep1, ep2) = (Endpoint::start(200), Endpoint::start(503));
    let interval = Duration::from_millis(100);
    let own = |db: &TestBackend, ep: &Endpoint| {
        BackendSpec::parse(&format!(
            "{},check_port={},health_check=http,health_path=/primary,\
             health_interval=100ms,fall=2,rise=1",
            db.addr(),
            ep.port()
        ))
        .unwrap()
    };
    let lb = TestBalancer::with(&[], |config| {
        config.backends = vec![own(&db1, &ep1), own(&db2, &ep2)];
        config.health = service_health();
        config.admin_listen = Some("127.0.0.1:0".parse().unwrap());
    });
    let (b1, b2) = (lb.backend(db1.addr()), lb.backend(db2.addr()));
    let limit = Duration::from_secs(20);
    time_until(limit, || !b2.is_healthy()).expect("the replica marked down");
    assert!(b1.is_healthy());
    echo_through(lb.addr, 10);
    assert_eq!((db1.accepted(), db2.accepted()), (10, 0));
    // /backends names where each is checked, and how.
    let list = http_get(lb.admin.unwrap(), "/backends").unwrap().body;
    let list: serde_json::Value = serde_json::from_str(&list).unwrap();
    let first = &list[0];
    assert_eq!(first["address"], db1.addr().to_string());
    assert_eq!(
        first["check_target"],
        format!("127.0.0.1:{}", ep1.port()),
        "{first}"
    );
    let own_check = first["own_check"].as_str().unwrap();
    assert!(own_check.contains("health_check=http"), "{own_check}");
    assert_eq!(list[1]["state"], "down");

    // The failover: the old primary now says 503, the new one 200.
    ep1.set(503);
    ep2.set(200);
    let flipped = Instant::now();
    time_until(limit, || !b1.is_healthy() && b2.is_healthy()).expect("the primary moved");
    let took = flipped.elapsed();
    eprintln!("traffic moved to the new primary in {took:?} (fall 2 × {interval:?})");
    assert!(took >= interval, "{took:?}: before a second failed check");
    echo_through(lb.addr, 10);
    assert_eq!((db1.accepted(), db2.accepted()), (10, 10));
    // Every check went to the endpoints; the databases saw clients only.
    assert!(ep1.hits() >= 3 && ep2.hits() >= 3);
}

/// Two backends with the same service settings but their own interval,
/// fall and rise: the one checked every 50 ms with `fall=1` goes down long
/// before the one checked every second with `fall=3`, whose endpoint is
/// asked far less often.
#[test]
fn each_backend_keeps_its_own_interval_and_fall() {
    let (quick_db, slow_db) = (TestBackend::echo(), TestBackend::echo());
    let (quick, slow) = (Endpoint::start(200), Endpoint::start(200));
    let lb = TestBalancer::with(&[], |config| {
        config.backends = vec![
            BackendSpec::parse(&format!(
                "{},check_port={},health_check=http,health_interval=50ms,fall=1",
                quick_db.addr(),
                quick.port()
            ))
            .unwrap(),
            BackendSpec::parse(&format!(
                "{},check_port={},health_check=http,health_interval=1s,fall=3",
                slow_db.addr(),
                slow.port()
            ))
            .unwrap(),
        ];
        config.health = service_health();
    });
    let (q, s) = (lb.backend(quick_db.addr()), lb.backend(slow_db.addr()));
    let limit = Duration::from_secs(20);
    // Both checked at least once before the flip.
    time_until(limit, || quick.hits() > 0 && slow.hits() > 0).expect("first checks");
    quick.set(503);
    slow.set(503);
    let flipped = Instant::now();
    let quick_down = time_until(limit, || !q.is_healthy()).expect("quick one down");
    assert!(s.is_healthy(), "the slow one went down with the quick one");
    let slow_down = time_until(limit, || !s.is_healthy()).expect("slow one down");
    let slow_down = flipped.elapsed().max(slow_down);
    eprintln!("down after {quick_down:?} (50 ms, fall 1) and {slow_down:?} (1 s, fall 3)");
    // Three failed checks a second apart: two seconds at least (less the
    // few milliseconds a check may come early to share a round).
    assert!(slow_down >= Duration::from_millis(1900), "{slow_down:?}");
    assert!(quick_down < slow_down);
    // And its endpoint was asked far less often (the quick one's checks
    // went on while the slow one was failing).
    let (quick_hits, slow_hits) = (quick.hits(), slow.hits());
    assert!(
        quick_hits > 5 * slow_hits,
        "{quick_hits} quick checks, {slow_hits} slow ones"
    );
}

/// The object form in a config file: `check-config` writes each backend
/// with its own check, and `rodizio probe` says where it checks and
/// passes on the endpoint while the database port is closed.
#[test]
fn the_file_form_and_probe_name_the_check_target() {
    let ep = Endpoint::start(200);
    let db = closed_port();
    let dir = std::env::temp_dir().join(format!("rodizio-check-port-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("patroni.json");
    let text = format!(
        r#"{{"backends": [{{"host": "127.0.0.1", "port": {}, "check_port": {},
              "check_address": "127.0.0.1", "health_check": "http",
              "health_path": "/primary", "health_interval": 0.5, "rise": 1, "fall": 2}}]}}"#,
        db.port(),
        ep.port()
    );
    std::fs::write(&path, text).unwrap();
    let out = child::output(Command::new(BIN).arg("check-config").arg(&path));
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want = format!(
        "{db},check_port={},check_address=127.0.0.1,health_check=http,health_path=/primary,\
         health_interval=500ms,rise=1,fall=2",
        ep.port()
    );
    assert!(printed.contains(&want), "{want} not in:\n{printed}");
    // Inside a `services` entry too, laid over that service's settings: its
    // `health_expect` makes a backend's own send-expect valid, and the
    // other service, without one, refuses it.
    let services = format!(
        r#"{{"services": [
            {{"name": "db", "listen": "127.0.0.1:0", "health_expect": "+PONG",
              "backends": ["{db},check_port={},health_check=send-expect"]}},
            {{"name": "web", "listen": "127.0.0.1:0",
              "backends": [{{"host": "127.0.0.1", "port": 1, "health_check": "send-expect"}}]}}]}}"#,
        ep.port()
    );
    std::fs::write(&path, services).unwrap();
    let out = child::output(Command::new(BIN).arg("check-config").arg(&path));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("127.0.0.1:1,health_check=send-expect"),
        "{err}"
    );
    assert!(err.contains("health_expect"), "{err}");
    let spec = format!("{db},check_port={}", ep.port());
    let out = child::output(Command::new(BIN).args([
        "probe",
        &spec,
        "--timeout",
        "2s",
        "--path",
        "/primary",
    ]));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains(&format!(
            "checking 127.0.0.1:{}, the check target of {db}",
            ep.port()
        )),
        "{said}"
    );
    let http = said.lines().find(|l| l.starts_with("http")).unwrap_or("");
    assert!(http.contains("pass") && http.contains("200"), "{said}");
    assert_eq!(out.status.code(), Some(0), "{said}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A reload that moves a kept backend's check to another port changes it
/// in place: the same backend (its counters kept) is now checked at the
/// new port, and comes back up when that one says 200.
#[test]
fn a_reload_moves_the_check_in_place() {
    let db = TestBackend::echo();
    let (replica, primary) = (Endpoint::start(503), Endpoint::start(200));
    let dir = std::env::temp_dir().join(format!("rodizio-check-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("reload.json");
    let file = |port: u16| {
        format!(
            r#"{{"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0",
                 "health_interval": "100ms", "health_timeout": "1s", "fall": 1, "rise": 1,
                 "backends": [{{"host": "127.0.0.1", "port": {}, "check_port": {port},
                                "health_check": "http"}}]}}"#,
            db.addr().port()
        )
    };
    std::fs::write(&path, file(replica.port())).unwrap();
    let child = Child::start(child::command(&["--allow-root", "-c"]).arg(&path));
    let admin = child.admin();
    let limit = Duration::from_secs(20);
    let backend = || -> serde_json::Value {
        let body = http_get(admin, "/backends").unwrap().body;
        serde_json::from_str::<serde_json::Value>(&body).unwrap()[0].clone()
    };
    time_until(limit, || backend()["state"] == "down").expect("down on the replica's 503");
    assert_eq!(
        backend()["check_target"],
        format!("127.0.0.1:{}", replica.port())
    );
    std::fs::write(&path, file(primary.port())).unwrap();
    child.signal(libc::SIGHUP);
    time_until(limit, || backend()["state"] == "up")
        .unwrap_or_else(|| panic!("not up again: {}", child.log()));
    let log = child.log();
    assert!(
        log.contains(&format!(
            "checks of {}: check_port={},health_check=http",
            db.addr(),
            primary.port()
        )),
        "{log}"
    );
    assert!(!log.contains("draining"), "{log}");
    assert_eq!(
        backend()["check_target"],
        format!("127.0.0.1:{}", primary.port())
    );
    assert_eq!(db.accepted(), 0, "a check reached the database port");
    let _ = std::fs::remove_dir_all(dir);
}
