//! The connections' endpoints attacked: ids that do not exist or lie
//! (huge, negative, not numbers, path tricks), huge and unknown filters,
//! thousands of kills at once, kills racing the connections' natural end,
//! a kill of a connection still waiting for its first byte (it never
//! reaches a backend), and a client in the pool's queue (not listed,
//! served once a kill frees the worker). Nothing but the connection named
//! ends, and the balancer serves on.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crate::child::call;
use crate::common::*;

fn with_admin(backend: SocketAddr, tweak: impl FnOnce(&mut rodizio::Config)) -> TestBalancer {
    TestBalancer::with(&[backend], |c| {
        c.admin_listen = Some("127.0.0.1:0".parse().unwrap());
        tweak(c);
    })
}

/// One echo through `s`, byte-exact.
fn echoes(s: &mut TcpStream, text: &[u8]) -> bool {
    s.write_all(text).is_ok() && {
        let mut back = vec![0; text.len()];
        s.read_exact(&mut back).is_ok() && back == text
    }
}

fn echo_client(addr: SocketAddr) -> TcpStream {
    let mut s = connect(addr).unwrap();
    assert!(echoes(&mut s, b"first\n"));
    s
}

#[test]
fn ids_that_lie_end_nothing() {
    let backend = TestBackend::echo();
    let lb = with_admin(backend.addr(), |_| {});
    let mut kept = echo_client(lb.addr);
    let admin = lb.admin.unwrap();
    for id in [
        "0",
        "18446744073709551615",
        "18446744073709551616",
        "99999999999999999999999999999999999999",
        "-1",
        "+1",
        "1e3",
        "0x10",
        "abc",
        "%31",
        "1%00",
        "..",
        "1/..",
        "..%2F1",
        " 1",
        &"9".repeat(5000),
    ] {
        let (status, body) = call(admin, "DELETE", &format!("/connections/{id}"), "");
        assert!(matches!(status, 400 | 404), "{id:.40}: {status} {body}");
    }
    for (method, path) in [
        ("POST", "/connections/1"),
        ("PUT", "/connections"),
        ("GET", "/connections/1"),
    ] {
        let (status, _) = call(admin, method, path, "");
        assert_eq!(status, 405, "{method} {path}");
    }
    assert!(echoes(&mut kept, b"still here\n"));
    assert_eq!(lb.stats.snapshot().ended_killed, 0);
}

#[test]
fn huge_and_unknown_filters_are_refused_in_one_line() {
    let backend = TestBackend::echo();
    let lb = with_admin(backend.addr(), |_| {});
    let mut kept = echo_client(lb.addr);
    let admin = lb.admin.unwrap();
    let long = "x".repeat(10_000);
    for query in [
        "min_age=99999999999999999999".to_string(),
        "idle_for=1000000000000".to_string(),
        "min_age=-1".to_string(),
        "limit=0".to_string(),
        "limit=100000000000000000000000".to_string(),
        "after=-5".to_string(),
        "after=18446744073709551616".to_string(),
        "nope=1".to_string(),
        format!("client={long}"),
        "service=%FF".to_string(),
    ] {
        let (status, body) = call(admin, "GET", &format!("/connections?{query}"), "");
        assert_eq!(status, 400, "{query:.40}: {body}");
        assert!(body.contains("error") && body.len() < 400, "{body}");
    }
    // Filters that match nothing are fine, and bounded.
    let (status, body) = call(admin, "GET", "/connections?min_age=1000000&limit=1000", "");
    assert_eq!(
        (status, body.contains("\"connections\":[]")),
        (200, true),
        "{body}"
    );
    assert!(echoes(&mut kept, b"still here\n"));
}

#[test]
fn thousands_of_kills_at_once_end_only_what_they_name() {
    let backend = TestBackend::echo();
    let lb = with_admin(backend.addr(), |_| {});
    let mut kept = echo_client(lb.addr);
    let admin = lb.admin.unwrap();
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            thread::spawn(move || {
                (0..500u64)
                    .map(|i| {
                        let id = u64::MAX - t * 1000 - i;
                        call(admin, "DELETE", &format!("/connections/{id}"), "").0
                    })
                    .filter(|&s| s != 404)
                    .count()
            })
        })
        .collect();
    let odd: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(odd, 0, "answers other than 404");
    assert!(echoes(&mut kept, b"still here\n"));
    assert_eq!(lb.stats.snapshot().ended_killed, 0);
}

#[test]
fn kills_racing_the_natural_end_leave_nothing_behind() {
    let backend = TestBackend::echo();
    let lb = with_admin(backend.addr(), |_| {});
    let admin = lb.admin.unwrap();
    for _round in 0..5 {
        let clients: Vec<TcpStream> = (0..20).map(|_| echo_client(lb.addr)).collect();
        assert!(lb.wait_active(20, Duration::from_secs(5)));
        let path = format!("/connections?backend={}&limit=1000", backend.addr());
        let (_, body) = call(admin, "GET", &path, "");
        let listed: serde_json::Value = serde_json::from_str(&body).unwrap();
        let ids: Vec<u64> = listed["connections"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["id"].as_u64().unwrap())
            .collect();
        let killer = thread::spawn(move || {
            ids.iter()
                .map(|id| call(admin, "DELETE", &format!("/connections/{id}"), "").0)
                .all(|s| s == 200 || s == 404)
        });
        for c in clients {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        assert!(
            killer.join().unwrap(),
            "a kill answered neither 200 nor 404"
        );
        assert!(lb.wait_active(0, Duration::from_secs(5)));
    }
    let mut after = echo_client(lb.addr);
    assert!(echoes(&mut after, &test_data(100_000, 3)));
}

#[test]
fn a_connection_killed_while_it_waits_for_its_first_byte_ends() {
    let backend = TestBackend::echo();
    let lb = with_admin(backend.addr(), |c| {
        c.proxy.client_first_byte_timeout = Some(Duration::from_secs(30));
    });
    let admin = lb.admin.unwrap();
    let mut silent = connect(lb.addr).unwrap();
    let me = silent.local_addr().unwrap();
    let listed = Arc::new(std::sync::Mutex::new(serde_json::Value::Null));
    assert!(wait_for(Duration::from_secs(5), || {
        let (_, body) = call(admin, "GET", &format!("/connections?client={me}"), "");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        let found = v["connections"].as_array().is_some_and(|a| a.len() == 1);
        *listed.lock().unwrap() = v;
        found
    }));
    let v = listed.lock().unwrap().clone();
    assert_eq!(v["connections"][0]["state"], "waiting", "{v}");
    let id = v["connections"][0]["id"].as_u64().unwrap();
    let (status, _) = call(admin, "DELETE", &format!("/connections/{id}"), "");
    assert_eq!(status, 200);
    silent
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut buf = [0u8; 8];
    assert!(matches!(silent.read(&mut buf), Ok(0) | Err(_)));
    assert!(wait_for(Duration::from_secs(5), || {
        lb.stats.snapshot().ended_killed == 1
    }));
    assert_eq!(
        backend.accepted(),
        0,
        "a killed waiting client reached the backend"
    );
    let mut after = echo_client(lb.addr);
    assert!(echoes(&mut after, b"served\n"));
}

#[test]
fn a_client_in_the_queue_is_not_listed_and_is_served_once_a_kill_frees_its_worker() {
    let backend = TestBackend::echo();
    let lb = with_admin(backend.addr(), |c| c.workers = 1);
    let admin = lb.admin.unwrap();
    let mut busy = echo_client(lb.addr);
    let mut queued = connect(lb.addr).unwrap();
    queued.write_all(b"queued\n").unwrap();
    let path = format!("/connections?backend={}", backend.addr());
    let (_, body) = call(admin, "GET", &path, "");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let listed = v["connections"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{v}");
    let id = listed[0]["id"].as_u64().unwrap();
    let (status, _) = call(admin, "DELETE", &format!("/connections/{id}"), "");
    assert_eq!(status, 200);
    busy.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut buf = [0u8; 8];
    assert!(matches!(busy.read(&mut buf), Ok(0) | Err(_)));
    // The worker freed takes the queued client, whose bytes were waiting.
    let mut back = [0u8; 7];
    queued.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"queued\n");
}
