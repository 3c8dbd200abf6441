//! Many services, and services files made to hurt: a hundred services
//! under a descriptor limit too small for their sockets fail in one line;
//! a hundred under a normal limit each serve alone, with an accept and a
//! health thread each and nothing more; names and nesting made to be
//! refused are, in one clipped line.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::{self, http_get, limit_in_child, wait_for, TestBackend, IO_TIMEOUT};
use crate::peers::temp_dir;

use crate::child::BIN;

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

/// The child, killed (by its PID) and reaped when dropped, so a failing
/// test leaves no process behind.
struct Guard(std::process::Child);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

fn command(path: &Path) -> Command {
    let mut c = Command::new(BIN);
    c.args(["--allow-root", "-c"])
        .arg(path)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

#[test]
fn a_hundred_services_under_a_small_descriptor_limit_fail_in_one_line() {
    let backend = TestBackend::echo();
    let dir = temp_dir("hostile-services-fd");
    let path = dir.join("many.json");
    many(&path, 100, backend.addr());
    let mut c = command(&path);
    limit_in_child(&mut c, libc::RLIMIT_NOFILE, 64);
    let mut child = c.spawn().unwrap();
    let stderr = common::collect(child.stderr.take().unwrap());
    let ended = wait_for(Duration::from_secs(20), || {
        matches!(child.try_wait(), Ok(Some(_)))
    });
    if !ended {
        let _ = child.kill();
    }
    let status = child.wait().unwrap();
    assert!(stderr.wait_end(Duration::from_secs(5)));
    let err = stderr.text();
    assert!(ended, "still running: {err}");
    assert_eq!(status.code(), Some(1), "{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(last.contains("Too many open files"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_hundred_services_each_serve_alone_with_one_accept_thread_each() {
    let backend = TestBackend::echo();
    let dir = temp_dir("hostile-services-many");
    let path = dir.join("many.json");
    many(&path, 100, backend.addr());
    let mut guard = Guard(command(&path).spawn().unwrap());
    let child = &mut guard.0;
    let stderr = common::collect(child.stderr.take().unwrap());
    let _stdout = common::collect(child.stdout.take().unwrap());
    let admin = || {
        stderr
            .text()
            .lines()
            .find_map(|l| l.split("admin API listening on ").nth(1))
            .and_then(|a| a.trim().parse::<SocketAddr>().ok())
    };
    assert!(
        wait_for(Duration::from_secs(20), || admin().is_some()),
        "{}",
        stderr.text()
    );
    let admin = admin().unwrap();
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
    let threads = std::fs::read_dir(format!("/proc/{}/task", child.id()))
        .unwrap()
        .count();
    assert!(threads < 2 * 100 + 40, "{threads} threads");
    // SAFETY: a plain kill(2) on the child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let ended = wait_for(Duration::from_secs(20), || {
        matches!(child.try_wait(), Ok(Some(_)))
    });
    if !ended {
        let _ = child.kill();
    }
    assert!(ended, "did not stop: {}", stderr.text());
    assert_eq!(child.wait().unwrap().code(), Some(0), "{}", stderr.text());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn names_and_nesting_made_to_hurt_are_refused_in_one_line() {
    let dir = temp_dir("hostile-services-names");
    let path = dir.join("bad.json");
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
    let _ = std::fs::remove_dir_all(dir);
}
