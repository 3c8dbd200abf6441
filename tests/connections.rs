//! The live table of connections through the admin API: 100 open, one
//! killed by id, the 99 others byte-exact afterwards; a backend's
//! connections killed by its path; a backend marked DOWN with
//! `on_backend_down: close` left with none within a second; and
//! `max_connection_lifetime` sending the client its FIN; a backend's own
//! `on_backend_down` over its service's, and changed by a reload; the
//! drain's spread, oldest first.

mod child;
mod common;
mod tls_certs;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use rodizio::connections::OnDown;
use rodizio::Config;
use serde_json::Value;

/// A balancer over `backend` with its admin API on, after `tweak`.
fn balancer(backend: SocketAddr, tweak: impl FnOnce(&mut Config)) -> TestBalancer {
    TestBalancer::with(&[backend], |c| {
        c.admin_listen = Some("127.0.0.1:0".parse().unwrap());
        tweak(c);
    })
}

/// `GET path` on the admin API, as JSON.
fn get(b: &TestBalancer, path: &str) -> Value {
    let (status, body) = child::call(b.admin.unwrap(), "GET", path, "");
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap()
}

/// `n` clients through the balancer, each with one echo done.
fn open(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    (0..n)
        .map(|i| {
            let mut s = connect(addr).unwrap();
            let hello = format!("hello {i}\n");
            s.write_all(hello.as_bytes()).unwrap();
            let mut back = vec![0; hello.len()];
            s.read_exact(&mut back).unwrap();
            assert_eq!(back, hello.as_bytes());
            s
        })
        .collect()
}

/// Whether the peer of `s` ended it (end of stream or a reset) within 1 s.
fn ended(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

#[test]
fn of_100_open_connections_one_killed_ends_and_99_go_on_byte_exact() {
    let backend = TestBackend::echo();
    let b = balancer(backend.addr(), |_| {});
    let mut clients = open(b.addr, 100);
    let filter = format!("/connections?backend={}&limit=1000", backend.addr());
    // A worker counts its round's bytes into the table after the round's
    // writes, so a client can have its echo a moment before the table
    // shows the bytes: each connection's count is awaited, never assumed.
    let counted = |c: &Value| c["bytes_to_backend"].as_u64().unwrap() >= 8;
    let mut listed = Value::Null;
    let all_counted = wait_for(IO_TIMEOUT, || {
        listed = get(&b, &filter);
        listed["connections"]
            .as_array()
            .unwrap()
            .iter()
            .all(counted)
    });
    assert!(all_counted, "a connection's bytes never counted: {listed}");
    let conns = listed["connections"].as_array().unwrap();
    assert_eq!(conns.len(), 100, "{listed}");
    for c in conns {
        assert_eq!(c["backend"], backend.addr().to_string());
        assert_eq!(c["state"], "pumping", "{c}");
        assert!(counted(c), "{c}");
    }
    // The client of the connection to kill: the listed one whose client
    // address is ours.
    let victim = &conns[37];
    let id = victim["id"].as_u64().unwrap();
    let client: SocketAddr = victim["client"].as_str().unwrap().parse().unwrap();
    let at = clients
        .iter()
        .position(|s| s.local_addr().unwrap() == client)
        .expect("the listed client is one of ours");
    let (status, body) = child::call(
        b.admin.unwrap(),
        "DELETE",
        &format!("/connections/{id}"),
        "",
    );
    assert_eq!(status, 200, "{body}");
    let mut gone = clients.remove(at);
    assert!(ended(&mut gone), "the killed client saw no end");
    // The client sees its end before the worker has left the table (a
    // second DELETE meanwhile finds it still there): once it is gone, a
    // second DELETE finds nothing.
    until("the killed connection leaves the table", || {
        let listed = get(&b, &filter);
        !listed["connections"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["id"].as_u64() == Some(id))
    });
    let (status, _) = child::call(
        b.admin.unwrap(),
        "DELETE",
        &format!("/connections/{id}"),
        "",
    );
    assert_eq!(status, 404, "killed twice");
    // The 99 others: each echoes 64 KiB byte-exact.
    let data = std::sync::Arc::new(test_data(64 * 1024, 7));
    for s in clients.iter_mut() {
        s.write_all(&data).unwrap();
        let mut back = vec![0; data.len()];
        s.read_exact(&mut back).unwrap();
        assert!(back == *data, "a connection not killed lost bytes");
    }
    assert!(wait_for(Duration::from_secs(5), || b
        .stats
        .snapshot()
        .ended_killed
        == 1));
    assert!(b.wait_active(99, Duration::from_secs(5)));
    let listed = get(&b, &filter);
    assert_eq!(listed["connections"].as_array().unwrap().len(), 99);
    // The stats page shows the oldest and the busiest of them.
    let page = http_get(b.admin.unwrap(), "/").unwrap().body;
    assert!(page.contains("id=\"oldest\"") && page.contains("id=\"busiest\""));
    assert!(page.contains(&backend.addr().to_string()));
}

#[test]
fn a_backends_connections_are_killed_by_its_path_and_paged_by_id() {
    let backend = TestBackend::echo();
    let b = balancer(backend.addr(), |_| {});
    let mut clients = open(b.addr, 5);
    let page = get(
        &b,
        &format!("/connections?backend={}&limit=2", backend.addr()),
    );
    assert_eq!(page["connections"].as_array().unwrap().len(), 2);
    let next = page["next"].as_u64().expect("a next page");
    let rest = get(
        &b,
        &format!(
            "/connections?backend={}&after={next}&limit=1000",
            backend.addr()
        ),
    );
    assert_eq!(rest["connections"].as_array().unwrap().len(), 3);
    assert!(rest["next"].is_null());
    let path = format!("/backends/{}/connections", backend.addr());
    let (status, body) = child::call(b.admin.unwrap(), "DELETE", &path, "");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"killed\":5"), "{body}");
    for s in clients.iter_mut() {
        assert!(ended(s));
    }
    assert!(b.wait_active(0, Duration::from_secs(5)));
}

#[test]
fn a_backend_marked_down_with_on_backend_down_close_keeps_no_connection_past_a_second() {
    let backend = TestBackend::echo();
    let b = balancer(backend.addr(), |c| {
        c.proxy.ends.on_backend_down = OnDown::Close
    });
    let mut clients = open(b.addr, 20);
    assert!(b.wait_active(20, Duration::from_secs(5)));
    let down = Instant::now();
    b.backend(backend.addr()).set_healthy(false);
    assert!(b.wait_active(0, Duration::from_secs(1)), "connections left");
    assert!(down.elapsed() < Duration::from_secs(1));
    for s in clients.iter_mut() {
        assert!(ended(s));
    }
    assert_eq!(b.stats.snapshot().ended_killed_down, 20);
    assert_eq!(b.backend(backend.addr()).tally.killed_down(), 20);
}

#[test]
fn a_backend_marked_down_keeps_its_connections_by_default() {
    let backend = TestBackend::echo();
    let b = balancer(backend.addr(), |_| {});
    let mut clients = open(b.addr, 3);
    b.backend(backend.addr()).set_healthy(false);
    for s in clients.iter_mut() {
        s.write_all(b"still\n").unwrap();
        let mut back = [0u8; 6];
        s.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"still\n");
    }
    assert_eq!(b.stats.snapshot().active, 3);
}

#[test]
fn max_connection_lifetime_sends_the_client_its_fin_and_logs_max_lifetime() {
    let backend = TestBackend::echo();
    let b = balancer(backend.addr(), |c| {
        c.proxy.ends.max_connection_lifetime = Some(Duration::from_millis(300));
        c.proxy.fin_timeout = Some(Duration::from_millis(500));
    });
    let mut clients = open(b.addr, 2);
    let started = Instant::now();
    for s in clients.iter_mut() {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 16];
        assert_eq!(s.read(&mut buf).unwrap(), 0, "no FIN at the lifetime");
    }
    assert!(started.elapsed() < Duration::from_secs(3));
    // Still silent after the FIN: closed a fin timeout later.
    assert!(b.wait_active(0, Duration::from_secs(5)));
    assert_eq!(b.stats.snapshot().ended_max_lifetime, 2);
}

#[test]
fn a_backends_own_on_backend_down_wins_over_its_services() {
    let closing = TestBackend::echo();
    let keeping = TestBackend::echo();
    let spec = |addr: SocketAddr, own: &str| {
        rodizio::backend::BackendSpec::parse(&format!("{addr},on_backend_down={own}")).unwrap()
    };
    assert!(rodizio::backend::BackendSpec::parse("127.0.0.1:1,on_backend_down=maybe").is_err());
    let written = spec(closing.addr(), "close").to_string();
    assert!(written.ends_with(",on_backend_down=close"), "{written}");
    // The service keeps; the first backend closes. One balancer each, so
    // that each client's backend is known.
    let b = TestBalancer::with(&[closing.addr()], |c| {
        c.backends = vec![spec(closing.addr(), "close")];
    });
    let k = TestBalancer::with(&[keeping.addr()], |c| {
        c.proxy.ends.on_backend_down = OnDown::Close;
        c.backends = vec![spec(keeping.addr(), "keep")];
    });
    let mut closed = open(b.addr, 3);
    let mut kept = open(k.addr, 3);
    b.backend(closing.addr()).set_healthy(false);
    k.backend(keeping.addr()).set_healthy(false);
    assert!(b.wait_active(0, Duration::from_secs(1)));
    for s in closed.iter_mut() {
        assert!(ended(s));
    }
    for s in kept.iter_mut() {
        s.write_all(b"kept\n").unwrap();
        let mut back = [0u8; 5];
        s.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"kept\n");
    }
    assert_eq!(k.stats.snapshot().active, 3);
}

#[test]
fn a_removed_backend_closes_its_connections_at_once_or_after_its_drain_timeout() {
    use rodizio::connections::Removal;
    let backend = TestBackend::echo();
    let b = balancer(backend.addr(), |c| {
        c.proxy.ends.on_backend_removed = Removal::Close
    });
    let mut clients = open(b.addr, 3);
    let path = format!("/backends/{}", backend.addr());
    let (status, body) = child::call(b.admin.unwrap(), "DELETE", &path, "");
    assert_eq!(status, 202, "{body}");
    assert!(b.wait_active(0, Duration::from_secs(1)));
    for s in clients.iter_mut() {
        assert!(ended(s));
    }
    assert_eq!(b.stats.snapshot().ended_killed_removed, 3);

    let backend = TestBackend::echo();
    let b = balancer(backend.addr(), |c| {
        c.proxy.ends.removed_drain_timeout = Some(Duration::from_millis(500));
    });
    let mut clients = open(b.addr, 3);
    let path = format!("/backends/{}", backend.addr());
    let removed = Instant::now();
    let (status, body) = child::call(b.admin.unwrap(), "DELETE", &path, "");
    assert_eq!(status, 202, "{body}");
    // Draining: served on until the timeout.
    for s in clients.iter_mut() {
        s.write_all(b"drain\n").unwrap();
        let mut back = [0u8; 6];
        s.read_exact(&mut back).unwrap();
    }
    assert!(b.wait_active(0, Duration::from_secs(5)));
    assert!(removed.elapsed() >= Duration::from_millis(450));
    assert_eq!(b.stats.snapshot().ended_killed_removed, 3);
}

/// `drain_spread` through the binary (SIGTERM): the ten connections still
/// open at the drain timeout are closed one after another over the
/// window, oldest first, and the log tells the progress.
#[test]
fn the_drain_spread_closes_the_connections_left_one_by_one_oldest_first() {
    let backend = TestBackend::echo();
    let mut lb = child::Child::balancer(&[
        "-l",
        "127.0.0.1:0",
        "-b",
        &backend.addr().to_string(),
        "--health-check",
        "off",
        "--drain-timeout",
        "200ms",
        "--drain-spread",
        "1s",
    ]);
    let clients = open(lb.addr, 10);
    let signalled = Instant::now();
    lb.signal(libc::SIGTERM);
    let watchers: Vec<_> = clients
        .into_iter()
        .map(|mut s| {
            std::thread::spawn(move || {
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                let mut buf = [0u8; 16];
                let _ = s.read(&mut buf);
                signalled.elapsed()
            })
        })
        .collect();
    let ends: Vec<Duration> = watchers.into_iter().map(|w| w.join().unwrap()).collect();
    assert!(ends[0] >= Duration::from_millis(200), "{ends:?}");
    assert!(
        ends[9] - ends[0] >= Duration::from_millis(600),
        "not spread: {ends:?}"
    );
    assert!(
        ends.windows(2).all(|w| w[0] <= w[1]),
        "not oldest first: {ends:?}"
    );
    assert!(lb.wait_exit(child::WAIT).is_some(), "rodizio still runs");
    lb.next_log("drain: 10 of 10 connections closed");
}

/// Two balancers in one process (as an embedding program may run): each
/// lists and ends only its own connections.
#[test]
fn each_balancer_lists_and_ends_only_its_own_connections() {
    let backend = TestBackend::echo();
    let one = balancer(backend.addr(), |_| {});
    let two = balancer(backend.addr(), |_| {});
    let mut mine = open(one.addr, 1);
    let theirs = get(&two, "/connections?limit=1000");
    assert_eq!(
        theirs["connections"].as_array().unwrap().len(),
        0,
        "{theirs}"
    );
    let listed = get(&one, "/connections?limit=1000");
    let id = listed["connections"][0]["id"].as_u64().unwrap();
    let (status, _) = child::call(
        two.admin.unwrap(),
        "DELETE",
        &format!("/connections/{id}"),
        "",
    );
    assert_eq!(status, 404);
    mine[0].write_all(b"mine\n").unwrap();
    let mut back = [0u8; 5];
    mine[0].read_exact(&mut back).unwrap();
    assert_eq!(&back, b"mine\n");
}

/// A connection handed to the kernel relay is still listed (its mode
/// says so) and killable: both its sockets shut down, its worker wakes
/// and ends it as `killed`. Needs root (or CAP_BPF and CAP_NET_ADMIN), as
/// `tests/kernel_relay.rs` does: it checks the kernel path was taken.
#[test]
fn a_connection_on_the_kernel_relay_is_listed_and_killable() {
    let backend = TestBackend::echo();
    let b = balancer(backend.addr(), |c| {
        c.proxy.kernel_relay = rodizio::units::Switch::On;
        c.proxy.kernel_relay_after = 0;
    });
    let mut clients = open(b.addr, 2);
    assert!(
        wait_for(Duration::from_secs(10), || b
            .stats
            .snapshot()
            .kernel_relayed
            >= 2),
        "the kernel relay took no connection: {:?}",
        b.stats.snapshot()
    );
    let listed = get(&b, "/connections?limit=1000");
    let conns = listed["connections"].as_array().unwrap();
    assert_eq!(conns.len(), 2, "{listed}");
    assert!(
        conns.iter().all(|c| c["mode"] == "kernel_relay"),
        "{listed}"
    );
    let victim = conns[0]["client"].as_str().unwrap().to_string();
    let id = conns[0]["id"].as_u64().unwrap();
    let (status, _) = child::call(
        b.admin.unwrap(),
        "DELETE",
        &format!("/connections/{id}"),
        "",
    );
    assert_eq!(status, 200);
    let at = clients
        .iter()
        .position(|s| s.local_addr().unwrap().to_string() == victim)
        .unwrap();
    let mut gone = clients.remove(at);
    assert!(ended(&mut gone), "the killed client saw no end");
    assert!(wait_for(Duration::from_secs(5), || b
        .stats
        .snapshot()
        .ended_killed
        == 1));
    let mut kept = clients.remove(0);
    kept.write_all(b"relayed\n").unwrap();
    let mut back = [0u8; 8];
    kept.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"relayed\n");
}

/// A connection whose TLS is terminated here is listed with its mode,
/// server name and TLS version.
#[test]
fn a_tls_connection_is_listed_with_its_server_name_and_version() {
    let certs = tls_certs::Certs::new();
    let pair = certs.issue("a", &["a.test"], 1);
    let backend = TestBackend::echo();
    let b = balancer(backend.addr(), |c| {
        c.tls.certs = rodizio::tls_term::CertList(vec![pair.setting()]);
    });
    let mut c = tls_certs::connect(b.addr, "a.test", &certs.ca()).unwrap();
    c.write_all(b"hi").unwrap();
    let mut buf = [0u8; 2];
    c.read_exact(&mut buf).unwrap();
    let listed = get(&b, "/connections");
    let one = &listed["connections"][0];
    assert_eq!(one["mode"], "tls", "{listed}");
    assert_eq!(one["sni"], "a.test", "{listed}");
    assert_eq!(one["tls_version"], "TLSv1.3", "{listed}");
    assert_eq!(one["state"], "pumping", "{listed}");
}

/// A reload that gives a kept backend its own `on_backend_down: close`
/// changes it in place (the reload's line says so): when its checks mark
/// it DOWN, the connections made after the reload are closed, and the
/// one made before keeps the policy it started with (the service's
/// `keep`), as every live setting applies to new connections.
#[test]
fn a_reload_changes_a_backends_own_on_backend_down_in_place() {
    let backend = TestBackend::echo();
    let check = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let check_port = check.local_addr().unwrap().port();
    let dir = child::Scratch::new("connections-reload");
    let path = dir.path("rodizio.json");
    let write = |own: &str| {
        let text = format!(
            r#"{{"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0",
                "health_check": "tcp", "health_interval": "100ms", "fall": 1, "rise": 1,
                "backends": [{{"host": "127.0.0.1", "port": {}, "check_port": {check_port}{own}}}]}}"#,
            backend.addr().port()
        );
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    };
    write("");
    let mut rodizio = child::Child::start(child::command(&["--allow-root", "-c"]).arg(&path));
    let mut before = open(rodizio.addr, 1);
    write(r#", "on_backend_down": "close""#);
    rodizio.signal(libc::SIGHUP);
    let line = rodizio.next_log("ends of");
    assert!(line.contains("on_backend_down=close"), "{line}");
    let mut after = open(rodizio.addr, 2);
    // The check port closes: the checks mark the backend DOWN, and the
    // new connections end although the backend itself still holds them.
    drop(check);
    rodizio.next_log("DOWN");
    for s in after.iter_mut() {
        assert!(ended(s), "a connection outlived its backend marked DOWN");
    }
    let s = &mut before[0];
    s.write_all(b"kept\n").unwrap();
    let mut back = [0u8; 5];
    s.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"kept\n");
}
