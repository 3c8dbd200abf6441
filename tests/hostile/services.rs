//! Many services, and services files made to hurt: a hundred services
//! under a descriptor limit too small for their sockets fail in one line;
//! a hundred under a normal limit each serve alone, with an accept and a
//! health thread each and nothing more; names and nesting made to be
//! refused are, in one clipped line.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::common::{http_get, limit_in_child, TestBackend, IO_TIMEOUT};

use crate::child::{self, Child, Scratch, BIN};

/// A file of `n` services on `127.0.0.1:0`, each in front of `backend`,
/// with the admin API on.
fn many(path: &Path, n: usize, backend: SocketAddr) {
    let services: Vec<String> = (0..n)
        .map(|i| {
            format!(
                r#"{{"name": "s{i}", "listen": "127.0.0.1:0", "backends": ["{backend}"],
                    "health_check": "off"}}"#
            )
        })
        .collect();
    let text = format!(
        r#"{{"admin_listen": "127.0.0.1:0", "workers": 64, "services": [{}]}}"#,
        services.join(",")
    );
    std::fs::write(path, text).unwrap();
}

/// `rodizio --allow-root -c PATH`.
fn command(path: &Path) -> Command {
    let mut c = child::command(&["--allow-root", "-c"]);
    c.arg(path);
    c
}

#[test]
fn a_hundred_services_under_a_small_descriptor_limit_fail_in_one_line() {
    let backend = TestBackend::echo();
    let dir = Scratch::new("hostile-services-fd");
    let path = dir.path("many.json");
    many(&path, 100, backend.addr());
    let mut c = command(&path);
    limit_in_child(&mut c, libc::RLIMIT_NOFILE, 64);
    let out = child::run_within(&mut c, Duration::from_secs(20));
    let err = out.stderr;
    assert_eq!(out.code, Some(1), "{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(last.contains("Too many open files"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn a_hundred_services_each_serve_alone_with_one_accept_thread_each() {
    let backend = TestBackend::echo();
    let dir = Scratch::new("hostile-services-many");
    let path = dir.path("many.json");
    many(&path, 100, backend.addr());
    let mut child = Child::spawn(&mut command(&path));
    let admin = child.admin();
    let body = http_get(admin, "/services").unwrap().body;
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 100);
    // Every tenth service: one echo through it, counted by it alone.
    for i in (0..100).step_by(10) {
        let addr: SocketAddr = list[i]["listen"][0].as_str().unwrap().parse().unwrap();
        let mut s = TcpStream::connect_timeout(&addr, IO_TIMEOUT).unwrap();
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        s.write_all(&[i as u8]).unwrap();
        let mut b = [0u8];
        s.read_exact(&mut b).unwrap();
        assert_eq!(b[0], i as u8);
    }
    let metrics = http_get(admin, "/metrics").unwrap().body;
    for i in 0..100 {
        let want = if i % 10 == 0 { 1 } else { 0 };
        let line = format!("rodizio_accepted_total{{service=\"s{i}\"}} {want}\n");
        assert!(metrics.contains(&line), "{line}");
    }
    // The admin API's paths with a service's name: a name of 9000
    // characters, dots, a missing service and the plain path are each
    // answered in a few hundred bytes, never echoed whole.
    let long = "a".repeat(9000);
    for (path, status) in [
        (format!("/services/{long}/backends"), 404),
        ("/services/%2e%2e/backends".to_string(), 404),
        ("/services/../backends".to_string(), 404),
        ("/services/s1/backends/%ZZ".to_string(), 404),
        ("/backends".to_string(), 409),
        ("/services/s1/nothing".to_string(), 404),
    ] {
        let reply = http_get(admin, &path).unwrap();
        assert!(
            reply.status.starts_with(&format!("HTTP/1.1 {status} ")),
            "{}: {}",
            &path[..path.len().min(60)],
            reply.status
        );
        assert!(reply.body.len() < 1024, "{} bytes", reply.body.len());
    }
    // Per service, its accept loop and its health thread (passive checks'
    // cool-down), and the rest fixed: nothing grows with the clients.
    let threads = child.threads();
    assert!(threads < 2 * 100 + 40, "{threads} threads");
    child.signal(libc::SIGTERM);
    let status = child.wait_exit(Duration::from_secs(20));
    let status = status.unwrap_or_else(|| panic!("did not stop: {}", child.log()));
    assert_eq!(status.code(), Some(0), "{}", child.log());
}

#[test]
fn names_and_nesting_made_to_hurt_are_refused_in_one_line() {
    let dir = Scratch::new("hostile-services-names");
    let path = dir.path("bad.json");
    let long = "n".repeat(100_000);
    let mut nested =
        String::from(r#"{"name": "x", "listen": "127.0.0.1:0", "backends": ["127.0.0.1:1"]}"#);
    for k in 0..40 {
        nested = format!(r#"{{"name": "n{k}", "services": [{nested}]}}"#);
    }
    let nested = format!(r#"{{"services": [{nested}]}}"#);
    for (text, words) in [
        (
            format!(r#"{{"services": [{{"name": "{long}", "listen": "127.0.0.1:0", "backends": ["127.0.0.1:1"]}}]}}"#),
            "is not a service name",
        ),
        (
            r#"{"services": [{"name": "a\u0000b", "listen": "127.0.0.1:0", "backends": ["127.0.0.1:1"]}]}"#.to_string(),
            "is not a service name",
        ),
        (nested, "goes at the top level of the file only"),
        (
            r#"{"services": [{"name": "a", "listen": ["127.0.0.1:0", "127.0.0.1:0", 7], "backends": ["127.0.0.1:1"]}]}"#.to_string(),
            "listen",
        ),
    ] {
        std::fs::write(&path, &text).unwrap();
        let out = crate::child::output(Command::new(BIN).arg("check-config").arg(&path));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(words), "{words}: {}", &err[..err.len().min(400)]);
        assert_eq!(err.lines().count(), 1, "{}", &err[..err.len().min(400)]);
        // The message is clipped: a long name is not echoed whole.
        assert!(err.len() < 2000, "{} bytes", err.len());
    }
}
