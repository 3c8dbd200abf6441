//! `rodizio simulate` against a real run: a balancer in front of two
//! backends that count the connections they accept, 2000 clients through
//! it, and the shares each backend took compared with the ones the
//! simulation prints for the same settings (within 1 point). The binary's
//! output is read as an operator would read it.

mod child;
mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;

use std::time::Duration;

use common::{connect, wait_for, TestBackend, TestBalancer};
use rodizio::backend::BackendSpec;
use rodizio::health::CheckKind;
use rodizio::scheduler::Algorithm;

/// Longest a simulation may take (a loaded machine, a debug build).
const TIMEOUT: Duration = Duration::from_secs(60);
/// Clients in the real run.
const CLIENTS: usize = 2000;

/// Runs `rodizio ARGS`, killed by PID (failing the test) past
/// [`TIMEOUT`]; its exit code, standard output and standard error.
fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let out = child::run_within(child::command(args).env("RUST_LOG", "warn"), TIMEOUT);
    (out.code, out.stdout, out.stderr)
}

/// The percentage `simulate` printed for `backend`.
fn share_printed(text: &str, backend: SocketAddr) -> f64 {
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(&backend.to_string()))
        .unwrap_or_else(|| panic!("no line for {backend}: {text}"));
    let last = line.split_whitespace().last().unwrap();
    last.trim_end_matches('%').parse().unwrap()
}

/// One client: a byte there and back, then the end.
fn one_client(addr: SocketAddr) {
    let mut stream = connect(addr).expect("connect to the balancer");
    stream.write_all(b"x").unwrap();
    let mut got = [0u8; 1];
    stream.read_exact(&mut got).unwrap();
}

/// The shares of a real run with weights 1:3 (weighted round robin) equal
/// those `rodizio simulate` prints for the same backends, within 1 point.
#[test]
fn simulated_shares_match_a_real_run() {
    let backends = [TestBackend::echo(), TestBackend::echo()];
    let addrs: Vec<SocketAddr> = backends.iter().map(TestBackend::addr).collect();
    let lb = TestBalancer::with(&addrs, |c| {
        c.algorithm = Algorithm::WeightedRoundRobin;
        c.backends = vec![
            BackendSpec::parse(&format!("{},weight=1", addrs[0])).unwrap(),
            BackendSpec::parse(&format!("{},weight=3", addrs[1])).unwrap(),
        ];
        // No check connects: every connection a backend accepts is a client's.
        c.health.check = CheckKind::Off;
    });
    for _ in 0..CLIENTS {
        one_client(lb.addr);
    }
    let counted = || backends.iter().map(TestBackend::accepted).sum::<usize>();
    assert!(
        wait_for(Duration::from_secs(10), || counted() == CLIENTS),
        "{} of {CLIENTS} connections reached the backends",
        counted()
    );
    let clients = CLIENTS.to_string();
    let (b0, b1) = (
        format!("{},weight=1", addrs[0]),
        format!("{},weight=3", addrs[1]),
    );
    let args = [
        "-b",
        b0.as_str(),
        "-b",
        b1.as_str(),
        "--algorithm",
        "weighted-round-robin",
        "simulate",
        "--clients",
        clients.as_str(),
    ];
    let (code, out, err) = run(&args);
    assert_eq!(code, Some(0), "{out}{err}");
    for (i, backend) in backends.iter().enumerate() {
        let real = backend.accepted() as f64 * 100.0 / CLIENTS as f64;
        let simulated = share_printed(&out, addrs[i]);
        assert!(
            (real - simulated).abs() <= 1.0,
            "{}: real {real:.2}%, simulated {simulated:.2}%\n{out}",
            addrs[i]
        );
    }
    assert!((share_printed(&out, addrs[1]) - 75.0).abs() <= 1.0, "{out}");
}

/// For ip-hash, removing one of four backends moves its clients and no
/// other: the moved share printed equals its share before.
#[test]
fn ip_hash_removal_moves_only_its_clients() {
    let args = [
        "-b",
        "10.0.0.1:80",
        "-b",
        "10.0.0.2:80",
        "-b",
        "10.0.0.3:80",
        "-b",
        "10.0.0.4:80",
        "--algorithm",
        "ip-hash",
        "simulate",
        "--clients",
        "40000",
        "--remove",
        "10.0.0.3:80",
    ];
    let (code, out, err) = run(&args);
    assert_eq!(code, Some(0), "{out}{err}");
    let before: u64 = out
        .lines()
        .find(|l| l.trim_start().starts_with("10.0.0.3:80"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    let moved = format!("clients on another backend than before: {before} of 40000");
    assert!(out.contains(&moved), "{out}");
    let after = out.split("after --remove").nth(1).unwrap();
    assert!(!after.contains("10.0.0.3:80  "), "{out}");
}
