//! `GET /metrics` is exact: N connections move the counters by exactly N,
//! and the gauges come back to 0 when the connections end, also after a
//! client reset and a backend that dies mid-transfer.

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use rodizio::Config;

/// The admin API on `127.0.0.1:0` in front of `backends`.
fn admin_config(backends: &[SocketAddr]) -> Config {
    Config {
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        ..config(backends)
    }
}

/// `GET /metrics`: every sample, by its name with labels.
fn scrape(admin: SocketAddr) -> HashMap<String, f64> {
    let mut s = connect(admin).expect("connect to the admin API");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .expect("send");
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("read");
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (name, value) = l.rsplit_once(' ').expect("name value");
            (name.to_string(), value.parse().expect("a number"))
        })
        .collect()
}

fn get(m: &HashMap<String, f64>, name: &str) -> f64 {
    *m.get(name)
        .unwrap_or_else(|| panic!("{name} is not in the metrics"))
}

/// 25 echo exchanges of known size move each counter by exactly 25 (and
/// the bytes by exactly what was sent), and leave every gauge at 0.
#[test]
fn counters_move_by_exactly_the_connections_made() {
    let backend = TestBackend::echo();
    let lb = TestBalancer::start(admin_config(&[backend.addr()]));
    let admin = lb.admin.expect("admin on");
    let before = scrape(admin);
    let n = 25;
    let len = 3000;
    for i in 0..n {
        let data = Arc::new(test_data(len, i));
        let back = echo_through(connect(lb.addr).unwrap(), Arc::clone(&data)).unwrap();
        assert!(back == *data);
    }
    assert!(lb.wait_active(0, IO_TIMEOUT));
    until("the last connection is counted", || {
        get(&scrape(admin), "rodizio_completed_total") - get(&before, "rodizio_completed_total")
            >= n as f64
    });
    let after = scrape(admin);
    let moved = |name: &str| get(&after, name) - get(&before, name);
    assert_eq!(moved("rodizio_accepted_total"), n as f64);
    assert_eq!(moved("rodizio_completed_total"), n as f64);
    let backend_total = format!(
        "rodizio_backend_connections_total{{backend=\"{}\"}}",
        backend.addr()
    );
    assert_eq!(moved(&backend_total), n as f64);
    assert_eq!(
        moved("rodizio_bytes_to_backends_total"),
        (n as usize * len) as f64
    );
    assert_eq!(
        moved("rodizio_bytes_to_clients_total"),
        (n as usize * len) as f64
    );
    assert_eq!(moved("rodizio_queue_wait_seconds_count"), n as f64);
    assert_eq!(moved("rodizio_connection_duration_seconds_count"), n as f64);
    assert_eq!(get(&after, "rodizio_active"), 0.0);
    assert_eq!(get(&after, "rodizio_workers_busy"), 0.0);
    let active = format!(
        "rodizio_backend_connections_active{{backend=\"{}\"}}",
        backend.addr()
    );
    assert_eq!(get(&after, &active), 0.0);
    assert_eq!(get(&after, "rodizio_queue_depth"), 0.0);
    lb.stop();
}

/// A client that resets mid-transfer and a backend that dies mid-transfer
/// each end their connection; the gauges come back to 0.
#[test]
fn gauges_come_back_to_zero_after_resets() {
    // A backend that reads a little, then resets.
    let dying = TestBackend::start(Arc::new(|mut s: TcpStream| {
        let mut buf = [0u8; 1024];
        let _ = s.read(&mut buf);
        socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO))?;
        Ok(())
    }));
    let echo = TestBackend::echo();
    let lb = TestBalancer::start(admin_config(&[echo.addr(), dying.addr()]));
    let admin = lb.admin.expect("admin on");
    // Client reset, against the echo backend (round robin: the first).
    let mut c = connect(lb.addr).unwrap();
    c.write_all(&test_data(100_000, 1)).unwrap();
    assert!(lb.wait_active(1, IO_TIMEOUT));
    socket2::SockRef::from(&c)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(c);
    // The dying backend (the second).
    let mut d = connect(lb.addr).unwrap();
    let _ = d.write_all(&test_data(10_000, 2));
    let mut sink = Vec::new();
    let _ = d.read_to_end(&mut sink);
    until("both connections end", || {
        let m = scrape(admin);
        get(&m, "rodizio_completed_total") == 2.0
    });
    let m = scrape(admin);
    assert_eq!(get(&m, "rodizio_active"), 0.0);
    assert_eq!(get(&m, "rodizio_workers_busy"), 0.0);
    for b in [echo.addr(), dying.addr()] {
        let name = format!("rodizio_backend_connections_active{{backend=\"{b}\"}}");
        assert_eq!(get(&m, &name), 0.0, "{name}");
        let name = format!("rodizio_backend_connections_total{{backend=\"{b}\"}}");
        assert_eq!(get(&m, &name), 1.0, "{name}");
    }
    lb.stop();
}
