//! The access log to a real syslog daemon: rsyslogd (Debian's `rsyslog`),
//! started with a private configuration on a 127.0.0.1 UDP port and a Unix
//! datagram socket, receives one RFC 5424 message per line and parses it
//! (its APP-NAME, PROCID and MSGID are ours); a daemon stopped mid-way
//! costs lines, never a client.

mod common;
mod peers;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use rodizio::access_log::{Destination, Format, SyslogAddr};

/// A balancer over an echo backend whose access log goes to `target`.
fn logging_to(
    backend: &TestBackend,
    target: SyslogAddr,
    tune: impl FnOnce(&mut rodizio::Config),
) -> TestBalancer {
    let mut cfg = config(&[backend.addr()]);
    cfg.access_log = Some(Format::Text);
    cfg.access_log_target = Some(Destination::Syslog(target));
    tune(&mut cfg);
    TestBalancer::start(cfg)
}

/// Echoes `len` bytes through the balancer.
fn echo(lb: &TestBalancer, len: usize) {
    let data = Arc::new(test_data(len, len as u64));
    let back = echo_through(connect(lb.addr).unwrap(), Arc::clone(&data)).unwrap();
    assert!(back == *data);
}

/// Over UDP, three connections are three messages that rsyslog parses as
/// RFC 5424: version 1, APP-NAME `rodizio`, our PID, MSGID `access`, and
/// the text line as the message, with the exact bytes.
#[test]
fn udp_lines_reach_rsyslog_as_rfc_5424() {
    let rsyslog = peers::rsyslogd("syslog-udp");
    let backend = TestBackend::echo();
    let lb = logging_to(&backend, SyslogAddr::Udp(rsyslog.udp), |_| {});
    for len in [1000, 1001, 1002] {
        echo(&lb, len);
    }
    let lines = rsyslog.lines_from("rodizio", 3);
    assert_eq!(lines.len(), 3, "{lines:?}");
    let head = format!("1 rodizio {} access ", std::process::id());
    let mut sizes: Vec<u64> = lines
        .iter()
        .map(|l| {
            assert!(l.starts_with(&head), "{l}");
            assert!(l.contains(&format!(" backend={} ", backend.addr())), "{l}");
            let field = l.split(' ').find(|f| f.starts_with("to_backend=")).unwrap();
            field["to_backend=".len()..].parse().unwrap()
        })
        .collect();
    sizes.sort_unstable();
    assert_eq!(sizes, [1000, 1001, 1002]);
    lb.stop();
}

/// Over the Unix socket, with a template and a line at each connect:
/// each connection is a `connect` line, then its `end` line with its bytes.
#[test]
fn unix_socket_lines_with_a_template_and_a_line_at_connect() {
    let rsyslog = peers::rsyslogd("syslog-unix");
    let backend = TestBackend::echo();
    let lb = logging_to(&backend, SyslogAddr::Unix(rsyslog.socket.clone()), |c| {
        c.access_log_format = Some("{event} {backend} up={to_backend}".parse().unwrap());
        c.access_log_at_connect = true;
    });
    echo(&lb, 777);
    // The first connection's two lines are in before the second connects:
    // its `end` comes after the client has its bytes, so a second client
    // at once could put its `connect` line between them.
    let first = rsyslog.lines_from("rodizio", 2);
    assert_eq!(first.len(), 2, "{first:?}");
    echo(&lb, 778);
    let lines = rsyslog.lines_from("rodizio", 4);
    let msgs: Vec<&str> = lines
        .iter()
        .map(|l| l.splitn(5, ' ').nth(4).unwrap())
        .collect();
    let b = backend.addr();
    assert_eq!(
        msgs,
        [
            format!("connect {b} up=0"),
            format!("end {b} up=777"),
            format!("connect {b} up=0"),
            format!("end {b} up=778"),
        ],
        "{lines:?}"
    );
    lb.stop();
}

/// rsyslogd stopped while the balancer runs (its socket gone, its port
/// closed): clients are served as before and as fast; the lines are lost.
#[test]
fn a_syslog_daemon_gone_costs_lines_not_clients() {
    for unix in [false, true] {
        let mut rsyslog = peers::rsyslogd("syslog-gone");
        let target = if unix {
            SyslogAddr::Unix(rsyslog.socket.clone())
        } else {
            SyslogAddr::Udp(rsyslog.udp)
        };
        let backend = TestBackend::echo();
        let lb = logging_to(&backend, target, |_| {});
        echo(&lb, 10);
        assert_eq!(rsyslog.lines_from("rodizio", 1).len(), 1);
        rsyslog.peer.stop();
        let started = Instant::now();
        for i in 0..200 {
            echo(&lb, 100 + i);
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "200 clients took {:?}",
            started.elapsed()
        );
        assert_eq!(lb.stats.snapshot().completed, 201);
        lb.stop();
    }
}
