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
    use std::time::{Duration, Instant};

    use crate::child::Child;
    use crate::common::{self, wait_for, TestBackend};
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
    /// raise it); returns it with the address it listens on.
    fn start(args: &[&str], nofile: Option<libc::rlim_t>) -> (Child, SocketAddr) {
        let rodizio = Child::on_loopback(args, |cmd| {
            if let Some(nofile) = nofile {
                common::limit_in_child(cmd, libc::RLIMIT_NOFILE, nofile);
            }
        });
        let addr = rodizio.addr;
        (rodizio, addr)
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

// ---- The pool after a flood: idle workers exit (`worker_idle_timeout`) ----

mod pool_after_a_flood {
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::thread::{self, JoinHandle};
    use std::time::{Duration, Instant};

    use socket2::{Domain, Socket, Type};

    use crate::child::Child;
    use crate::common::{connect, wait_for};
    use rodizio::pool::WORKER_FLOOR;

    /// Idle connections held at once.
    const CLIENTS: usize = 2000;
    /// Longest wait for the flood to be up, and for the pool to shrink.
    const LIMIT: Duration = Duration::from_secs(60);

    /// A backend that accepts every connection on one thread and holds it,
    /// silent, until dropped: thousands of connections, one thread.
    struct Holder {
        addr: SocketAddr,
        held: Arc<Mutex<Vec<TcpStream>>>,
        stop: Arc<AtomicBool>,
        thread: Option<JoinHandle<()>>,
    }

    impl Holder {
        fn start(most: usize) -> Holder {
            // A backlog as deep as the system allows: thousands of connects
            // arrive at once, and one dropped would be retried a second
            // later, or fail.
            let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
            socket
                .bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
                .unwrap();
            socket.listen(4096).unwrap();
            let listener: TcpListener = socket.into();
            let addr = listener.local_addr().unwrap();
            let held: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
            let stop = Arc::new(AtomicBool::new(false));
            let thread = {
                let (held, stop) = (Arc::clone(&held), Arc::clone(&stop));
                thread::spawn(move || {
                    for stream in listener.incoming() {
                        if stop.load(Ordering::SeqCst) {
                            return;
                        }
                        let mut held = held.lock().unwrap();
                        if let Ok(stream) = stream {
                            if held.len() < most {
                                held.push(stream);
                            }
                        }
                    }
                })
            };
            Holder {
                addr,
                held,
                stop,
                thread: Some(thread),
            }
        }

        fn count(&self) -> usize {
            self.held.lock().unwrap().len()
        }

        /// Closes every connection held.
        fn close_all(&self) {
            self.held.lock().unwrap().clear();
        }
    }

    impl Drop for Holder {
        fn drop(&mut self) {
            self.stop.store(true, Ordering::SeqCst);
            let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }

    /// Threads, worker threads and resident memory (KiB) of process `pid`.
    fn threads_workers_rss(pid: i32) -> (usize, usize, u64) {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let field = |name: &str| -> u64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
        };
        let workers = std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .flatten()
            .filter(|t| {
                std::fs::read_to_string(t.path().join("comm"))
                    .is_ok_and(|c| c.trim() == "rodizio-worker")
            })
            .count();
        (field("Threads:") as usize, workers, field("VmRSS:"))
    }

    /// What glibc's malloc may keep for good after a flood, in KiB: up to
    /// 8 arenas per CPU, each keeping its top chunk (up to the 128 KiB trim
    /// threshold plus its header and pad).
    fn arena_allowance() -> u64 {
        // SAFETY: sysconf reads a system value; no pointer involved.
        let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as u64;
        8 * cpus * 256
    }

    /// The binary with a one-second worker idle timeout in front of
    /// `backend`, and the address it listens on.
    fn start(backend: SocketAddr) -> (Child, SocketAddr) {
        let rodizio = Child::on_loopback(
            &[
                "--health-check",
                "off",
                "-b",
                &backend.to_string(),
                "--worker-idle-timeout",
                "1s",
                "--connect-timeout",
                "10s",
            ],
            |cmd| {
                cmd.env("RUST_LOG", "warn");
            },
        );
        let addr = rodizio.addr;
        (rodizio, addr)
    }

    /// 2,000 idle connections held through the binary raise its thread
    /// count by one worker each; once they are closed, a worker idle for
    /// `--worker-idle-timeout 1s` exits, so the workers come back down to
    /// the pool's floor, and resident memory comes back near where it
    /// started: within 6 MiB plus what malloc's arenas may keep (2,000
    /// workers hold some 45 MiB; glibc's cache of thread stacks alone would
    /// keep 12 MiB if it were not emptied).
    #[test]
    fn the_pool_shrinks_back_after_a_flood_of_idle_connections() {
        let backend = Holder::start(CLIENTS);
        let (mut rodizio, addr) = start(backend.addr);
        let pid = rodizio.pid() as i32;
        let (threads_before, workers_before, rss_before) = threads_workers_rss(pid);
        let started = Instant::now();
        let mut clients = Vec::with_capacity(CLIENTS);
        for i in 0..CLIENTS {
            clients.push(connect(addr).unwrap_or_else(|e| panic!("client {i}: {e}")));
            assert!(started.elapsed() < LIMIT, "{i} clients after {LIMIT:?}");
        }
        let all_up = wait_for(LIMIT, || {
            backend.count() == CLIENTS && threads_workers_rss(pid).1 >= workers_before + CLIENTS
        });
        let (threads_peak, workers_peak, rss_peak) = threads_workers_rss(pid);
        assert!(
            all_up,
            "{} of {CLIENTS} connections reached the backend; workers {workers_before} → {workers_peak}",
            backend.count()
        );
        assert!(
            threads_peak >= threads_before + CLIENTS,
            "{threads_peak} threads"
        );
        drop(clients);
        backend.close_all();
        let rss_bound = rss_before + 6 * 1024 + arena_allowance();
        let back = wait_for(LIMIT, || {
            let (_, workers, rss) = threads_workers_rss(pid);
            workers <= WORKER_FLOOR && rss <= rss_bound
        });
        let (threads_after, workers_after, rss_after) = threads_workers_rss(pid);
        eprintln!(
            "threads {threads_before} → {threads_peak} → {threads_after}, \
             workers {workers_before} → {workers_peak} → {workers_after}, \
             VmRSS {rss_before} → {rss_peak} → {rss_after} KiB"
        );
        assert!(
            back,
            "workers {workers_before} → {workers_peak} → {workers_after} (want at most \
             {WORKER_FLOOR}); VmRSS {rss_before} → {rss_peak} → {rss_after} KiB (want at \
             most {rss_bound})"
        );
        // No other thread was left behind: only workers came and went.
        assert!(
            threads_after - workers_after <= threads_peak - workers_peak,
            "threads {threads_peak} → {threads_after}"
        );
        assert!(rodizio.alive(), "rodizio exited: {}", rodizio.output());
        rodizio.stop();
    }
}

// ---- end of: the pool after a flood ----
