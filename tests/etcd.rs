//! `backends_from: etcd://...` with a real etcd on loopback: two rodizio
//! processes follow one prefix; a key put makes both serve its backend
//! within a second, a key deleted drains it; with etcd killed the list
//! stays and clients are served, and once etcd is back on the same data
//! directory and port a key put after the restart is followed.

mod child;
mod common;
mod peers;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use child::{Child, Scratch};
use common::{connect, time_until, TestBackend};
use peers::{need, temp_dir, Peer};
use rodizio::etcd::EtcdSource;

const PREFIX: &str = "/lb/web/";

/// etcd on `client` (peers on `peer`) over `data`, ready when this
/// returns (a range read answers); stopped by SIGKILL.
fn etcd(client: u16, peer: u16, data: &Path) -> Peer {
    let bin = need("etcd", "etcd-server");
    let mut cmd = Command::new(bin);
    let (c, p) = (
        format!("http://127.0.0.1:{client}"),
        format!("http://127.0.0.1:{peer}"),
    );
    cmd.args(["--name", "t", "--data-dir"])
        .arg(data)
        .args(["--listen-client-urls", &c, "--advertise-client-urls", &c])
        .args([
            "--listen-peer-urls",
            &p,
            "--initial-advertise-peer-urls",
            &p,
        ])
        .args(["--initial-cluster", &format!("t={p}")]);
    let peer = Peer::spawn("etcd", cmd, libc::SIGKILL, &temp_dir("etcd"));
    let source = source(client);
    time_until(Duration::from_secs(20), || {
        rodizio::etcd::range(&source).is_ok()
    })
    .unwrap_or_else(|| panic!("etcd did not answer: {}", peer.output()));
    peer
}

fn source(client: u16) -> EtcdSource {
    format!("etcd://127.0.0.1:{client}{PREFIX}")
        .parse()
        .unwrap()
}

/// `etcdctl ARGS` against `client`; fails the test unless it succeeds.
fn etcdctl(client: u16, args: &[&str]) {
    let bin = need("etcdctl", "etcd-client");
    let out = Command::new(bin)
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints=http://127.0.0.1:{client}"))
        .args(["--dial-timeout=3s", "--command-timeout=5s"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "etcdctl {args:?}: {out:?}");
}

/// One byte echoed through `lb`.
fn echo(lb: SocketAddr) {
    let mut s = connect(lb).unwrap();
    s.write_all(b"x").unwrap();
    let mut b = [0u8];
    s.read_exact(&mut b).unwrap();
}

/// Whether a few clients of `lb` reach `backend` within `limit`.
fn reaches(lb: SocketAddr, backend: &TestBackend, limit: Duration) -> bool {
    time_until(limit, || {
        let before = backend.accepted();
        for _ in 0..4 {
            echo(lb);
        }
        backend.accepted() > before
    })
    .is_some()
}

/// Whether clients of `lb` stop reaching `backend` within `limit`.
fn left(lb: SocketAddr, backend: &TestBackend, limit: Duration) -> bool {
    time_until(limit, || {
        let before = backend.accepted();
        for _ in 0..6 {
            echo(lb);
        }
        backend.accepted() == before
    })
    .is_some()
}

/// The value of `rodizio_NAME{source="etcd"}` on `lb`'s `/metrics`.
fn etcd_metric(lb: &Child, name: &str) -> u64 {
    let body = common::http_get(lb.admin(), "/metrics").unwrap().body;
    let wanted = format!("rodizio_{name}{{source=\"etcd\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&wanted)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {wanted} in /metrics:\n{body}"))
}

fn rodizio(client: u16, fixed: &TestBackend) -> Child {
    Child::on_loopback(
        &[
            "--admin",
            "127.0.0.1:0",
            "-b",
            &fixed.addr().to_string(),
            "--backends-from",
            &source(client).to_string(),
        ],
        |_| {},
    )
}

/// Two balancers follow one prefix: a put serves, a delete drains.
#[test]
fn two_balancers_follow_one_prefix() {
    let ports = peers::free_ports(2);
    let data = Scratch::new("etcd-data");
    let _etcd = etcd(ports[0], ports[1], &data.path("d"));
    let (fixed, a, b) = (
        TestBackend::echo(),
        TestBackend::echo(),
        TestBackend::echo(),
    );
    // A key whose value is the backend, with an option.
    etcdctl(
        ports[0],
        &[
            "put",
            &format!("{PREFIX}a"),
            &format!("{},weight=1", a.addr()),
        ],
    );
    let mut one = rodizio(ports[0], &fixed);
    let mut two = rodizio(ports[0], &fixed);
    let (l1, l2) = (one.listening(), two.listening());
    for lb in [l1, l2] {
        assert!(
            reaches(lb, &a, Duration::from_secs(10)),
            "a from the first read"
        );
    }
    // A key with no value: its last segment is the backend.
    etcdctl(ports[0], &["put", &format!("{PREFIX}{}", b.addr()), ""]);
    for lb in [l1, l2] {
        assert!(reaches(lb, &b, Duration::from_secs(1)), "b within a second");
    }
    etcdctl(ports[0], &["del", &format!("{PREFIX}{}", b.addr())]);
    for lb in [l1, l2] {
        assert!(left(lb, &b, Duration::from_secs(1)), "b drained");
        assert!(
            reaches(lb, &fixed, Duration::from_secs(1)),
            "the file's backend serves"
        );
    }
    assert!(one.log().contains("draining"), "{}", one.log());
    drop(two);
}

/// etcd killed: the list stays and serves; etcd back: followed again.
#[test]
fn an_etcd_restart_keeps_the_list_then_follows_again() {
    let ports = peers::free_ports(2);
    let data = Scratch::new("etcd-data");
    let mut server = etcd(ports[0], ports[1], &data.path("d"));
    let (fixed, a, c) = (
        TestBackend::echo(),
        TestBackend::echo(),
        TestBackend::echo(),
    );
    etcdctl(
        ports[0],
        &["put", &format!("{PREFIX}a"), &a.addr().to_string()],
    );
    let mut lb = rodizio(ports[0], &fixed);
    let addr = lb.listening();
    assert!(reaches(addr, &a, Duration::from_secs(10)));
    server.stop();
    // The list stays: a keeps serving, and the warning is one line.
    for _ in 0..3 {
        assert!(
            reaches(addr, &a, Duration::from_secs(2)),
            "a after etcd died"
        );
    }
    time_until(Duration::from_secs(10), || {
        lb.log().contains("stay as they are")
    })
    .expect("a warning that etcd is gone");
    let _back = etcd(ports[0], ports[1], &data.path("d"));
    etcdctl(
        ports[0],
        &["put", &format!("{PREFIX}c"), &c.addr().to_string()],
    );
    assert!(
        reaches(addr, &c, Duration::from_secs(15)),
        "c, put after the restart: {}",
        lb.log()
    );
    assert!(reaches(addr, &a, Duration::from_secs(2)));
    assert_eq!(
        lb.log().matches("stay as they are").count(),
        1,
        "{}",
        lb.log()
    );
    // The reads and the failures while etcd was gone, counted.
    assert!(etcd_metric(&lb, "discovery_lookups_total") >= 3);
    assert!(etcd_metric(&lb, "discovery_errors_total") >= 1);
}
