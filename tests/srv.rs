//! `srv:` backends followed with a real nameserver: dnsmasq on loopback
//! serves a SRV name and its targets' A records; a record added makes a
//! new backend that serves, a record removed drains its backend (the
//! connection in flight goes on) until it is removed, and with dnsmasq
//! stopped the list stays as it was and keeps serving.

mod child;
mod common;
mod peers;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::{connect, time_until, TestBackend, TestBalancer};
use peers::{loopback, need, temp_dir, Peer};
use rodizio::backend::{Backend, BackendSpec};
use rodizio::health::{CheckKind, HealthConfig};
use rodizio::scheduler::Scheduler;
use rodizio::srv::Nameservers;

const NAME: &str = "_echo._tcp.svc.test";

/// dnsmasq on `port` answering `NAME` with one SRV record per
/// `(target, port)`, each target at 127.0.0.1; ready when this returns.
fn dnsmasq(port: u16, records: &[(&str, u16)]) -> Peer {
    let bin = need("dnsmasq", "dnsmasq-base");
    let mut cmd = Command::new(bin);
    cmd.args([
        "--no-daemon",
        "--no-resolv",
        "--no-hosts",
        "--conf-file=/dev/null",
        "--pid-file=",
        "--local-ttl=1",
        "--listen-address=127.0.0.1",
        "--bind-interfaces",
    ]);
    cmd.arg(format!("--port={port}"));
    for (target, p) in records {
        cmd.arg(format!("--srv-host={NAME},{target},{p},0,1"));
        cmd.arg(format!("--host-record={target},127.0.0.1"));
    }
    // Its own directory: a stopped peer removes it.
    let peer = Peer::spawn("dnsmasq", cmd, libc::SIGTERM, &temp_dir("dnsmasq"));
    let server = loopback(port);
    time_until(Duration::from_secs(10), || {
        rodizio::srv::lookup(NAME, &[server]).is_ok_and(|a| a.records.len() == records.len())
    })
    .unwrap_or_else(|| panic!("dnsmasq did not answer: {}", peer.output()));
    peer
}

fn names(s: &Scheduler) -> Vec<String> {
    let mut all: Vec<String> = s.snapshot().iter().map(|b| b.name().to_string()).collect();
    all.sort();
    all
}

fn echo(lb: SocketAddr, byte: u8) -> std::net::TcpStream {
    let mut s = connect(lb).unwrap();
    s.write_all(&[byte]).unwrap();
    let mut b = [0u8];
    s.read_exact(&mut b).unwrap();
    assert_eq!(b[0], byte);
    s
}

#[test]
fn an_srv_name_follows_dnsmasq_records() {
    let (a, b) = (TestBackend::echo(), TestBackend::echo());
    let (pa, pb) = (a.addr().port(), b.addr().port());
    let port = peers::free_port();
    let mut dns = dnsmasq(port, &[("a.svc.test", pa)]);
    let lb = TestBalancer::with(&[], |config| {
        config.backends = vec![BackendSpec::parse(&format!("srv:{NAME}")).unwrap()];
        config.proxy.resolvers = Some(Nameservers(vec![loopback(port)]));
        config.health = HealthConfig {
            check: CheckKind::Off,
            ..HealthConfig::default()
        };
    });
    let s = Arc::clone(&lb.scheduler);
    let (name_a, name_b) = (format!("a.svc.test:{pa}"), format!("b.svc.test:{pb}"));
    assert_eq!(names(&s), vec![name_a.clone()]);
    let first: Arc<Backend> = s.snapshot()[0].clone();
    assert_eq!(first.origin().name(), "srv");
    drop(echo(lb.addr, 1));
    assert_eq!(a.accepted(), 1);

    // A record added: its backend serves.
    dns.stop();
    dns = dnsmasq(port, &[("a.svc.test", pa), ("b.svc.test", pb)]);
    time_until(Duration::from_secs(20), || names(&s).len() == 2).expect("the new record followed");
    assert_eq!(names(&s), vec![name_a.clone(), name_b.clone()]);
    for i in 0..20 {
        drop(echo(lb.addr, i));
    }
    assert!(
        b.accepted() >= 5,
        "the new backend serves: {}",
        b.accepted()
    );

    // A record removed: its backend drains; the connection in flight
    // goes on, then it is removed.
    let mut held = None;
    for i in 0..4 {
        let c = echo(lb.addr, i);
        if first.active() == 1 {
            held = Some(c);
            break;
        }
    }
    let mut held = held.expect("a connection to a");
    dns.stop();
    dns = dnsmasq(port, &[("b.svc.test", pb)]);
    time_until(Duration::from_secs(20), || first.state_name() == "draining").expect("a drained");
    let before = a.accepted();
    for i in 0..10 {
        drop(echo(lb.addr, i));
    }
    assert_eq!(a.accepted(), before, "no new client to a drained backend");
    held.write_all(b"z").unwrap();
    let mut byte = [0u8];
    held.read_exact(&mut byte).unwrap();
    drop(held);
    time_until(Duration::from_secs(20), || {
        names(&s) == vec![name_b.clone()]
    })
    .expect("a removed");

    // dnsmasq stopped: lookups fail, the list stays and serves.
    dns.stop();
    let errors = rodizio::lookup::SRV.errors();
    time_until(Duration::from_secs(30), || {
        rodizio::lookup::SRV.errors() >= errors + 2
    })
    .expect("two failed lookups");
    assert_eq!(names(&s), vec![name_b]);
    let before = b.accepted();
    drop(echo(lb.addr, 9));
    assert_eq!(b.accepted(), before + 1);
}
