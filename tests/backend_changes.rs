//! The backend list changing while traffic flows, through a real balancer:
//! drain, remove and add, with connections already open left alone.
//!

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

use common::{connect, request, until, Demo, TestBalancer};
use rodizio::backend::{Backend, BackendSpec};
use rodizio::health::{CheckKind, HealthConfig};
use rodizio::scheduler::Algorithm;
use rodizio::Config;

/// A keep-alive HTTP/1.1 client connection through the balancer.
struct KeepAlive {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl KeepAlive {
    fn open(addr: SocketAddr) -> KeepAlive {
        let s = connect(addr).unwrap();
        KeepAlive {
            writer: s.try_clone().unwrap(),
            reader: BufReader::new(s),
        }
    }

    /// Sends one request and reads one response; returns the backend name.
    fn ask(&mut self) -> String {
        self.writer
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut length = 0;
        let mut line = String::new();
        loop {
            line.clear();
            assert!(self.reader.read_line(&mut line).unwrap() > 0, "closed");
            if line == "\r\n" {
                break;
            }
            if let Some(v) = line.strip_prefix("Content-Length: ") {
                length = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; length];
        self.reader.read_exact(&mut body).unwrap();
        let body = String::from_utf8(body).unwrap();
        body.trim_end()
            .strip_prefix("Handled by server ")
            .unwrap()
            .to_string()
    }
}

/// Demo backends "a", "b" and "c", and their addresses in that order.
fn three_demos() -> (Vec<Demo>, Vec<SocketAddr>) {
    let demos: Vec<Demo> = ["a", "b", "c"]
        .iter()
        .map(|n| Demo::start("127.0.0.1:0", n))
        .collect();
    let addrs = demos.iter().map(|d| d.addr).collect();
    (demos, addrs)
}

fn no_checks(config: &mut Config) {
    config.health = HealthConfig {
        check: CheckKind::Off,
        passive_failures: 0,
        ..HealthConfig::default()
    };
}

/// Draining a backend stops new clients going to it while its open
/// connection goes on; removing it does the same for good; an added backend
/// takes its turn at once.
#[test]
fn drain_remove_and_add_while_serving() {
    let (_demos, addrs) = three_demos();
    let lb = TestBalancer::with(&addrs, no_checks);

    // An open connection, served by `held`.
    let mut open = KeepAlive::open(lb.addr);
    let held = open.ask();
    let held_addr = addrs[(held.as_bytes()[0] - b'a') as usize];
    let backend = lb.backend(held_addr);

    // Drain: no new client goes there; the open connection goes on.
    lb.scheduler.drain(backend.id(), true).unwrap();
    for _ in 0..6 {
        assert_ne!(request(lb.addr).unwrap(), held);
    }
    assert_eq!(open.ask(), held);
    assert_eq!(backend.active(), 1, "the open connection is still counted");

    // Back from draining: it gets its turn again.
    lb.scheduler.drain(backend.id(), false).unwrap();
    let names: Vec<String> = (0..3).map(|_| request(lb.addr).unwrap()).collect();
    assert!(names.contains(&held), "{names:?}");

    // Remove: gone from the list, the open connection still works.
    let removed = lb.scheduler.remove(backend.id()).unwrap();
    assert_eq!(lb.scheduler.snapshot().len(), 2);
    for _ in 0..6 {
        assert_ne!(request(lb.addr).unwrap(), held);
    }
    assert_eq!(open.ask(), held);
    drop(open);
    // Its count drops when the connection ends, whatever the list says.
    until("count never dropped", || removed.active() == 0);

    // Add a new one: with three backends again, three new clients in a row
    // go to three different backends, one of them the new one.
    let d = Demo::start("127.0.0.1:0", "d");
    let spec = BackendSpec::parse(&d.addr.to_string()).unwrap();
    lb.scheduler
        .add(Arc::new(Backend::from_spec(&spec).unwrap()));
    let mut names: Vec<String> = (0..3).map(|_| request(lb.addr).unwrap()).collect();
    names.sort();
    let mut expected: Vec<String> = ["a", "b", "c", "d"]
        .iter()
        .filter(|n| **n != held)
        .map(|n| n.to_string())
        .collect();
    expected.sort();
    assert_eq!(names, expected);
}

/// Weighted round robin through the balancer: weights 3 and 1 give 3 and 1
/// clients of every 4, in nginx's smooth order.
#[test]
fn weighted_round_robin_through_the_balancer() {
    let heavy = Demo::start("127.0.0.1:0", "heavy");
    let light = Demo::start("127.0.0.1:0", "light");
    let lb = TestBalancer::with(&[heavy.addr, light.addr], |config| {
        no_checks(config);
        config.algorithm = Algorithm::WeightedRoundRobin;
        config.backends[0].weight = 3;
    });
    let names: Vec<String> = (0..8).map(|_| request(lb.addr).unwrap()).collect();
    assert_eq!(
        names,
        ["heavy", "heavy", "light", "heavy", "heavy", "heavy", "light", "heavy"]
    );
}

/// ip-hash through the balancer: the same client address always reaches
/// the same backend.
#[test]
fn ip_hash_through_the_balancer() {
    let (_demos, addrs) = three_demos();
    let lb = TestBalancer::with(&addrs, |config| {
        no_checks(config);
        config.algorithm = Algorithm::IpHash;
    });
    let first = request(lb.addr).unwrap();
    for _ in 0..6 {
        assert_eq!(request(lb.addr).unwrap(), first);
    }
}

/// Least connections through the balancer, with connections of uneven
/// length: while two backends hold a long connection each, short clients all
/// go to the third; when one long connection ends, its backend shares again.
#[test]
fn least_connections_through_the_balancer() {
    let (_demos, addrs) = three_demos();
    let lb = TestBalancer::with(&addrs, |config| {
        no_checks(config);
        config.algorithm = Algorithm::LeastConnections;
    });
    let backends: Vec<Arc<Backend>> = addrs.iter().map(|a| lb.backend(*a)).collect();
    let by_name = |name: &str| Arc::clone(&backends[(name.as_bytes()[0] - b'a') as usize]);
    let idle = || backends.iter().all(|b| b.active() == 0);

    // Two long connections, on two different backends.
    let mut long1 = KeepAlive::open(lb.addr);
    let first = by_name(&long1.ask());
    until("first long counted", || first.active() == 1);
    let mut long2 = KeepAlive::open(lb.addr);
    let second = by_name(&long2.ask());
    assert_ne!(first.id(), second.id());
    until("second long counted", || second.active() == 1);
    let third = backends
        .iter()
        .find(|b| b.id() != first.id() && b.id() != second.id())
        .unwrap();

    // Short clients: all to the third, the only one with no connection.
    for _ in 0..6 {
        let name = request(lb.addr).unwrap();
        assert_eq!(by_name(&name).id(), third.id());
        until("short one ended", || third.active() == 0);
    }

    // The first long connection ends: its backend takes clients again, in
    // rotation with the third; the second (still busy) gets none.
    assert_eq!(long1.ask(), demo_name(&first, &backends));
    drop(long1);
    until("first long ended", || first.active() == 0);
    let mut seen = Vec::new();
    for _ in 0..6 {
        let name = request(lb.addr).unwrap();
        let b = by_name(&name);
        assert_ne!(b.id(), second.id());
        seen.push(b.id());
        until("short one ended", || b.active() == 0);
    }
    assert!(seen.contains(&first.id()) && seen.contains(&third.id()));
    assert_eq!(long2.ask(), demo_name(&second, &backends));
    drop(long2);
    until("all idle", idle);
}

/// The demo name ("a", "b", "c") of a backend of this test.
fn demo_name(backend: &Backend, backends: &[Arc<Backend>]) -> String {
    let i = backends
        .iter()
        .position(|b| b.id() == backend.id())
        .unwrap();
    char::from(b'a' + i as u8).to_string()
}
