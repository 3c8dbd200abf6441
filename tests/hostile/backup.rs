//! Backup backends and slow start, attacked: `backup` given twice, with a
//! value, in files with wrong types; `slow_start` at 0, negative, huge,
//! garbage, by flag and by file (also inside a `services` entry); a list
//! of backups only; a backup with a weight; a connection on a backup when
//! a primary returns; a backend flapping up and down through a slow start
//! under concurrent clients.
//!
//! Each refusal runs the binary as a child with a deadline, killed by its
//! PID if it outlives it; each balancer runs in-process and is stopped by
//! its guard.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::child::{self, Scratch};
use crate::common::{config, connect, TestBackend, TestBalancer};
use rodizio::backend::BackendSpec;
use rodizio::scheduler::Algorithm;

/// Longest a refusal may take.
const WAIT: Duration = Duration::from_secs(10);

/// Runs `rodizio ARGS`, which must exit 2 within [`WAIT`] with one line on
/// standard error, naming no Rust type; that line. A child still running
/// is killed by its PID and fails the test.
fn refused(args: &[&str]) -> String {
    let mut command = child::command(args);
    command.env("RUST_LOG", "warn");
    let out = child::run_within(&mut command, WAIT);
    let (status, text) = (out.status, out.stderr);
    assert_eq!(status.code(), Some(2), "{args:?}: {text}");
    assert_eq!(text.lines().count(), 1, "{args:?}: {text}");
    for rust in ["u64", "u32", "Duration", "bool`", "Option"] {
        assert!(!text.contains(rust), "{args:?}: {text}");
    }
    text
}

/// `check-config` on a file holding `text`: the one line of its refusal.
fn refused_file(text: &str) -> String {
    let dir = Scratch::new("hostile-backup");
    let path = dir.file("rodizio.json", text);
    refused(&["check-config", path.to_str().unwrap()])
}

/// `backup` twice, with a value, misspelt: one line each, at start-up.
#[test]
fn backup_garbage_on_the_command_line_is_refused() {
    for (spec, says) in [
        ("127.0.0.1:9,backup,backup", "given twice"),
        ("127.0.0.1:9,backup=1", "no value"),
        ("127.0.0.1:9,backup=", "no value"),
        ("127.0.0.1:9,backup=true", "no value"),
        ("127.0.0.1:9,backups", "unknown option"),
        ("127.0.0.1:9,,backup", "unknown option"),
    ] {
        let line = refused(&["--allow-root", "-l", "127.0.0.1:0", "-b", spec]);
        assert!(line.contains(says), "{spec}: {line}");
    }
}

/// `slow_start` at 0, negative, over an hour, absurdly long, garbage:
/// refused in one line at start-up, by flag and by file, flat or in a
/// `services` entry.
#[test]
fn absurd_slow_starts_are_refused() {
    for value in ["0", "0ms", "-1s", "2h", "99999999999h", "abc", "1e300", ""] {
        let line = refused(&[
            "--allow-root",
            "-l",
            "127.0.0.1:0",
            "-b",
            "127.0.0.1:9",
            "--slow-start",
            value,
        ]);
        assert!(line.contains("slow-start"), "{value}: {line}");
    }
    for value in [
        "0", "-5", "1e300", "-1e300", "\"0s\"", "\"2h\"", "\"x\"", "true", "[]",
    ] {
        let flat = format!("{{\"backends\": [\"127.0.0.1:9\"], \"slow_start\": {value}}}");
        let nested = format!(
            "{{\"services\": [{{\"name\": \"web\", \"listen\": \"127.0.0.1:0\", \
             \"backends\": [\"127.0.0.1:9\"], \"slow_start\": {value}}}]}}"
        );
        for text in [flat, nested] {
            let line = refused_file(&text);
            assert!(line.contains("slow_start"), "{text}: {line}");
            assert!(line.len() < 300, "{line}");
        }
    }
}

/// The object form: `backup` twice, or not a boolean; refused in one line
/// naming it.
#[test]
fn backup_garbage_in_a_file_is_refused() {
    for value in ["true, \"backup\": true", "\"yes\"", "1", "null", "{}"] {
        let text = format!(
            "{{\"backends\": [{{\"host\": \"127.0.0.1\", \"port\": 9, \"backup\": {value}}}]}}"
        );
        let line = refused_file(&text);
        assert!(line.contains("backup"), "{text}: {line}");
    }
    let line = refused_file("{\"backends\": [\"127.0.0.1:9,backup=1\"]}");
    assert!(line.contains("no value"), "{line}");
}

/// A few bytes through the balancer, read back.
fn echo_once(addr: SocketAddr) {
    let mut client = connect(addr).expect("connect to the balancer");
    client.write_all(b"ping").unwrap();
    let mut got = [0u8; 4];
    client.read_exact(&mut got).expect("the echo");
    assert_eq!(&got, b"ping");
}

/// Specs for the backends at `addrs`, with `suffix` after each.
fn specs(addrs: &[SocketAddr], suffix: &[&str]) -> Vec<BackendSpec> {
    addrs
        .iter()
        .zip(suffix)
        .map(|(a, s)| BackendSpec::parse(&format!("{a}{s}")).unwrap())
        .collect()
}

/// Every backend a backup: nothing to prefer, so they serve, in turns.
#[test]
fn a_list_of_backups_only_serves() {
    let (a, b) = (TestBackend::echo(), TestBackend::echo());
    let mut c = config(&[]);
    c.backends = specs(&[a.addr(), b.addr()], &[",backup", ",backup"]);
    let lb = TestBalancer::start(c);
    for _ in 0..20 {
        echo_once(lb.addr);
    }
    assert_eq!(lb.backend(a.addr()).total(), 10);
    assert_eq!(lb.backend(b.addr()).total(), 10);
    lb.stop();
}

/// Backups with weights share the load by weight (weighted round robin)
/// once the primary is gone, and nothing before.
#[test]
fn backups_with_weights_share_by_weight() {
    let (p, b1, b2) = (
        TestBackend::echo(),
        TestBackend::echo(),
        TestBackend::echo(),
    );
    let mut c = config(&[]);
    c.algorithm = Algorithm::WeightedRoundRobin;
    c.backends = specs(
        &[p.addr(), b1.addr(), b2.addr()],
        &[",weight=5", ",weight=3,backup", ",backup"],
    );
    let lb = TestBalancer::start(c);
    for _ in 0..8 {
        echo_once(lb.addr);
    }
    assert_eq!(lb.backend(p.addr()).total(), 8);
    lb.backend(p.addr()).set_maint(true);
    for _ in 0..40 {
        echo_once(lb.addr);
    }
    assert_eq!(lb.backend(b1.addr()).total(), 30);
    assert_eq!(lb.backend(b2.addr()).total(), 10);
    lb.stop();
}

/// Fifty idle clients on a backup keep their connections when a primary
/// comes back; new clients go to the primary.
#[test]
fn idle_connections_on_a_backup_outlive_the_primarys_return() {
    let (p, b) = (TestBackend::echo(), TestBackend::echo());
    let mut c = config(&[]);
    c.backends = specs(&[p.addr(), b.addr()], &["", ",backup"]);
    let lb = TestBalancer::start(c);
    let primary = lb.backend(p.addr());
    primary.set_maint(true);
    let mut held: Vec<TcpStream> = (0..50).map(|_| connect(lb.addr).unwrap()).collect();
    let mut got = [0u8; 3];
    for s in &mut held {
        s.write_all(b"one").unwrap();
        s.read_exact(&mut got).unwrap();
    }
    assert_eq!(lb.backend(b.addr()).active(), 50);
    primary.set_maint(false);
    for _ in 0..10 {
        echo_once(lb.addr);
    }
    assert_eq!(primary.total(), 10);
    for s in &mut held {
        s.write_all(b"two").unwrap();
        s.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"two");
    }
    assert_eq!(lb.backend(b.addr()).total(), 50);
    drop(held);
    lb.stop();
}

/// A backend flipping up and down thousands of times while it ramps (a
/// slow start of 1ms, and one of an hour), under eight client threads: no
/// panic, no overflow, every client served by the steady backend at
/// least, and the balancer stops cleanly.
#[test]
fn a_backend_flapping_through_a_slow_start_breaks_nothing() {
    for over in [Duration::from_millis(1), Duration::from_secs(3600)] {
        for algorithm in Algorithm::ALL.iter().copied() {
            let (steady, flappy) = (TestBackend::echo(), TestBackend::echo());
            let mut c = config(&[steady.addr(), flappy.addr()]);
            c.algorithm = algorithm;
            c.slow_start = Some(over);
            let lb = TestBalancer::start(c);
            let flapper = lb.backend(flappy.addr());
            let stop = Arc::new(AtomicBool::new(false));
            let flips = {
                let stop = stop.clone();
                thread::spawn(move || {
                    let deadline = Instant::now() + Duration::from_secs(20);
                    let mut n = 0u32;
                    while !stop.load(Ordering::SeqCst) && n < 200_000 && Instant::now() < deadline {
                        flapper.set_healthy(n % 2 == 1);
                        n += 1;
                    }
                    flapper.set_healthy(true);
                    n
                })
            };
            let clients: Vec<_> = (0..8)
                .map(|_| {
                    let addr = lb.addr;
                    thread::spawn(move || {
                        for _ in 0..25 {
                            echo_once(addr);
                        }
                    })
                })
                .collect();
            for c in clients {
                c.join().expect("a client failed");
            }
            stop.store(true, Ordering::SeqCst);
            assert!(flips.join().unwrap() > 0);
            let served: u64 = lb.scheduler.snapshot().iter().map(|b| b.total()).sum();
            assert_eq!(served, 200, "{algorithm}, {over:?}");
            lb.stop();
        }
    }
}
