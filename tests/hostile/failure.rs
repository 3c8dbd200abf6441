//! Failure under pressure: dead backends, exhausted descriptors and threads, the pool after a flood.

// ---------------------------------------------------------------------------
// Health checks and failure logs under pressure: a check that cannot even
// open its socket (EMFILE) failed because of this host, not of the backend,
// and must not take a healthy backend out of the rotation; a dead backend
// under load must not log one line per client.
// ---------------------------------------------------------------------------

/// Health checks at the descriptor ceiling, and the log of failed connects.
mod health_and_failure_logs {
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpStream};
    use std::process::Command;
    use std::time::{Duration, Instant};

    use crate::common::{self, wait_for, TestBackend};
    use crate::peers::{self, Peer};

    const BIN: &str = env!("CARGO_BIN_EXE_rodizio");
    /// Small enough for a few dozen clients to use every descriptor.
    const NOFILE: libc::rlim_t = 64;
    /// More clients than the limit lets in: the others wait in the backlog.
    const FLOOD: usize = 120;
    /// Longest wait for anything the test polls for.
    const TIMEOUT: Duration = Duration::from_secs(20);
    /// Words of the throttled warning about a check that failed here.
    const LOCAL_WARNING: &str = "not counted against the backend";

    /// The binary listening on `127.0.0.1:0` with `args`, and
    /// `RLIMIT_NOFILE` at `nofile` if given (soft and hard, so it cannot
    /// raise it); returns it with the port it listens on.
    fn start(args: &[&str], nofile: Option<libc::rlim_t>) -> (Peer, SocketAddr) {
        let dir = peers::temp_dir("health-and-failure-logs");
        let mut cmd = Command::new(BIN);
        cmd.args(["-l", "127.0.0.1:0"])
            .args(args)
            .env("RUST_LOG", "info");
        if let Some(nofile) = nofile {
            common::limit_in_child(&mut cmd, libc::RLIMIT_NOFILE, nofile);
        }
        let rodizio = Peer::spawn("rodizio", cmd, libc::SIGTERM, &dir);
        let mut port = None;
        let found = wait_for(TIMEOUT, || {
            port = rodizio
                .output()
                .lines()
                .find_map(|l| l.strip_prefix("Load balancer listening on port "))
                .and_then(|p| p.split_whitespace().next()?.parse::<u16>().ok());
            port.is_some()
        });
        assert!(found, "no listening line:\n{}", rodizio.output());
        (rodizio, peers::loopback(port.unwrap_or_default()))
    }

    /// One byte through the balancer and back from the echo backend.
    fn served(addr: SocketAddr) -> bool {
        let Ok(mut s) = common::connect(addr) else {
            return false;
        };
        let mut b = [0u8];
        s.write_all(b"h").is_ok() && s.read_exact(&mut b).is_ok() && b == *b"h"
    }

    /// A flood of held clients uses every descriptor of a balancer checking
    /// its one healthy backend every 100 ms with `--fall 1`. Each check then
    /// fails with EMFILE: the balancer says so in a throttled warning (seen
    /// twice, so at least a second and about ten rounds pass under the
    /// flood), never marks the backend DOWN, and serves clients again once
    /// the flood is released.
    #[test]
    fn checks_failing_for_want_of_descriptors_do_not_mark_a_backend_down() {
        let backend = TestBackend::echo();
        let (mut rodizio, addr) = start(
            &[
                "-b",
                &backend.addr().to_string(),
                "--health-interval",
                "100ms",
                "--health-timeout",
                "1s",
                "--fall",
                "1",
                "--rise",
                "1",
            ],
            Some(NOFILE),
        );
        assert!(served(addr), "not served before the flood");
        let flood: Vec<TcpStream> = (0..FLOOD)
            .map(|i| common::connect(addr).unwrap_or_else(|e| panic!("client {i}: {e}")))
            .collect();
        let down = |log: &str| log.contains("is now DOWN");
        // Two warnings: the first, and one a second later with the count
        // of the checks in between.
        let rounds_seen = |log: &str| {
            log.lines()
                .filter(|l| l.contains(LOCAL_WARNING))
                .any(|l| l.contains("more since the last such line"))
        };
        wait_for(TIMEOUT, || {
            let log = rodizio.output();
            down(&log) || rounds_seen(&log)
        });
        let log = rodizio.output();
        assert!(!down(&log), "a healthy backend went DOWN:\n{log}");
        assert!(
            rounds_seen(&log),
            "no repeated warning about checks failing here:\n{log}"
        );
        drop(flood);
        let mut tries = 0;
        let back = wait_for(TIMEOUT, || {
            tries += 1;
            tries <= 1000 && served(addr)
        });
        let log = rodizio.output();
        assert!(back, "not served after the flood:\n{log}");
        assert!(!down(&log), "a healthy backend went DOWN:\n{log}");
        rodizio.stop();
        let log = rodizio.output();
        eprintln!("{log}");
        assert!(!log.contains("panicked"), "{log}");
    }

    /// Clients sent to one dead backend (passive and active checks off, so
    /// it stays in the rotation), 200 one after the other, each closed
    /// unserved: the workers' "connect failed" warning comes at most once a
    /// second (plus the first), with the count of the others, instead of
    /// once per client; and a streak is told only once there is one (no
    /// "1 in a row").
    #[test]
    fn a_dead_backend_under_load_is_one_line_a_second() {
        const CLIENTS: usize = 200;
        let dead = common::closed_port().to_string();
        let (mut rodizio, addr) = start(
            &[
                "-b",
                &dead,
                "--health-check",
                "off",
                "--passive-failures",
                "0",
            ],
            None,
        );
        let started = Instant::now();
        for i in 0..CLIENTS {
            let mut client = common::connect(addr).unwrap_or_else(|e| panic!("client {i}: {e}"));
            assert!(common::is_closed(&mut client), "client {i} was served");
            assert!(started.elapsed() < TIMEOUT, "too slow: {i} clients");
        }
        let elapsed = started.elapsed();
        // Each warning is written before its client is closed.
        let log = rodizio.output();
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("connect failed"))
            .collect();
        let most = elapsed.as_secs() as usize + 2;
        assert!(
            (1..=most).contains(&lines.len()),
            "{} lines in {elapsed:?} for {CLIENTS} clients:\n{log}",
            lines.len()
        );
        assert!(lines.iter().all(|l| !l.contains("(1 in a row)")), "{log}");
        rodizio.stop();
        assert!(
            !rodizio.output().contains("panicked"),
            "{}",
            rodizio.output()
        );
    }

    /// `PUT /backends/{address}` with `body` on the admin API; the reply's
    /// status line.
    fn put(admin: SocketAddr, address: &str, body: &str) -> String {
        let mut s = common::connect(admin).unwrap_or_else(|e| panic!("admin: {e}"));
        let request = format!(
            "PUT /backends/{address} HTTP/1.1\r\nHost: rodizio\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        );
        s.write_all(request.as_bytes()).unwrap();
        let mut reply = Vec::new();
        let _ = s.take(64 * 1024).read_to_end(&mut reply);
        let reply = String::from_utf8_lossy(&reply);
        reply.lines().next().unwrap_or_default().to_string()
    }

    /// The log speaks the operator's words: a state set through the admin
    /// API is `draining`, `in maintenance` or `ready` (the API's and the
    /// docs' words, not `Drain`), and the shutdown summary of one client
    /// says `1 connection accepted`, not `1 connections`.
    #[test]
    fn the_log_says_states_and_counts_in_words() {
        let backend = TestBackend::echo();
        let name = backend.addr().to_string();
        let (mut rodizio, addr) = start(
            &[
                "-b",
                &name,
                "--health-check",
                "off",
                "--admin",
                "127.0.0.1:0",
            ],
            None,
        );
        let mut admin = None;
        let found = wait_for(TIMEOUT, || {
            admin = rodizio.output().lines().find_map(|l| {
                let (_, at) = l.split_once("admin API listening on ")?;
                at.trim().parse::<SocketAddr>().ok()
            });
            admin.is_some()
        });
        assert!(found, "no admin line:\n{}", rodizio.output());
        let admin = admin.unwrap_or(addr);
        assert!(served(addr), "not served");
        for (state, words) in [
            ("drain", "draining"),
            ("maint", "in maintenance"),
            ("ready", "ready"),
        ] {
            let status = put(admin, &name, &format!(r#"{{"state": "{state}"}}"#));
            assert!(status.starts_with("HTTP/1.1 200"), "{state}: {status}");
            let line = format!("backend {name} is now {words}");
            assert!(
                wait_for(TIMEOUT, || rodizio.output().contains(&line)),
                "no {line:?}:\n{}",
                rodizio.output()
            );
        }
        rodizio.stop();
        let log = rodizio.output();
        assert!(log.contains(", 1 connection accepted, 1 served,"), "{log}");
        for enum_name in ["Drain", "Maint", "Ready"] {
            assert!(!log.contains(enum_name), "{enum_name} in the log:\n{log}");
        }
    }
}

/// A backend out of rotation (down, drained) gives its share to all the
/// backends left, in proportion to their weights, not to its neighbour in
/// the list.
mod spread_over_the_rest {
    use std::collections::HashMap;
    use std::time::Duration;

    use crate::common::{closed_port, request, until, Demo, TestBalancer};
    use rodizio::health::{CheckKind, HealthConfig};
    use rodizio::scheduler::Algorithm;

    /// `requests` sequential requests through `lb`; how many each demo
    /// backend answered, by name.
    fn split(lb: &TestBalancer, requests: usize) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        for i in 0..requests {
            let name = request(lb.addr).unwrap_or_else(|e| panic!("request {i}: {e}"));
            *counts.entry(name).or_insert(0) += 1;
        }
        counts
    }

    fn expected(pairs: &[(&str, usize)]) -> HashMap<String, usize> {
        pairs.iter().map(|&(n, c)| (n.to_string(), c)).collect()
    }

    /// Round robin over a, b, (c: a closed port, found down by the health
    /// checks), d: 240 requests are exactly 80 each, not 60 / 60 / 120.
    #[test]
    fn a_dead_backends_share_is_spread_evenly_over_the_rest() {
        let (a, b, d) = (
            Demo::start("127.0.0.1:0", "a"),
            Demo::start("127.0.0.1:0", "b"),
            Demo::start("127.0.0.1:0", "d"),
        );
        let dead = closed_port();
        let lb = TestBalancer::with(&[a.addr, b.addr, dead, d.addr], |config| {
            config.health = HealthConfig {
                check: CheckKind::Tcp,
                interval: Duration::from_millis(200),
                timeout: Duration::from_secs(2),
                fall: 1,
                ..HealthConfig::default()
            };
        });
        let c = lb.backend(dead);
        until("the closed port is found DOWN", || !c.is_healthy());
        assert_eq!(
            split(&lb, 240),
            expected(&[("a", 80), ("b", 80), ("d", 80)])
        );
        assert!(!c.is_healthy());
        lb.stop();
    }

    /// Weighted round robin, weights 1, 3, 2, 5, the last two drained: 100
    /// requests are exactly 25 and 75, not about 73 and 27 (the drained
    /// backends' turns falling to a, the next one in the list).
    #[test]
    fn drained_backends_share_goes_to_the_rest_by_weight() {
        let demos: Vec<Demo> = ["a", "b", "c", "d"]
            .iter()
            .map(|name| Demo::start("127.0.0.1:0", name))
            .collect();
        let addrs: Vec<_> = demos.iter().map(|d| d.addr).collect();
        let lb = TestBalancer::with(&addrs, |config| {
            config.algorithm = Algorithm::WeightedRoundRobin;
            for (spec, weight) in config.backends.iter_mut().zip([1, 3, 2, 5]) {
                spec.weight = weight;
            }
        });
        for addr in &addrs[2..] {
            lb.scheduler.drain(lb.backend(*addr).id(), true).unwrap();
        }
        assert_eq!(split(&lb, 100), expected(&[("a", 25), ("b", 75)]));
        assert_eq!(split(&lb, 100), expected(&[("a", 25), ("b", 75)]));
        lb.stop();
    }
}
