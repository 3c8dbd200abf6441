//! A backend that refuses connections costs no client request, and its
//! share goes where the scheduler would have sent it had it been marked
//! down: spread over the others by the algorithm, primaries first, then
//! the backups.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rodizio::backend::BackendSpec;
use rodizio::scheduler::Algorithm;

use common::{closed_port, config, http_get, TestBackend, TestBalancer};

/// Three backends, the middle one a closed port: 30 requests all succeed.
/// The dead backend's first 3 turns (requests 1, 4 and 7) fail over to the
/// two others in turn (a, c, a), not always to the next in the list; the
/// third failure in a row marks it down (passive health), and the 22
/// requests after that alternate between the two left. So the first
/// backend serves 3 + 2 + 11 = 16 and the third 2 + 1 + 11 = 14 (with
/// list-order fail-over: 14 and 16).
#[test]
fn one_refusing_backend_of_three_costs_nothing() {
    let a = TestBackend::http(0);
    let c = TestBackend::http(2);
    let lb = TestBalancer::over(&[a.addr(), closed_port(), c.addr()]);
    for i in 0..30 {
        let r = http_get(lb.addr, "/").unwrap_or_else(|e| panic!("request {i} failed: {e}"));
        assert_eq!(r.status, "HTTP/1.1 200 OK");
    }
    assert_eq!((a.accepted(), c.accepted()), (16, 14));
    let stats = lb.stats.snapshot();
    assert_eq!(stats.connect_failures, 3);
    assert_eq!(stats.no_backend, 0);
    lb.stop();
}

/// Sends `n` requests one after the other, each of which must succeed, and
/// returns what each backend of `live` served.
fn served(lb: &TestBalancer, n: usize, live: &[&TestBackend]) -> Vec<usize> {
    for i in 0..n {
        let r = http_get(lb.addr, "/").unwrap_or_else(|e| panic!("request {i} failed: {e}"));
        assert_eq!(r.status, "HTTP/1.1 200 OK", "request {i}");
    }
    live.iter().map(|b| b.accepted()).collect()
}

/// A balancer over `specs` (`HOST:PORT[,options]`) with `algorithm` and
/// passive health off, so a dead backend stays in rotation: every one of
/// its turns is a fail-over.
fn without_passive_health(specs: &[String], algorithm: Algorithm) -> TestBalancer {
    let mut cfg = config(&[]);
    cfg.backends = specs
        .iter()
        .map(|s| BackendSpec::parse(s).unwrap())
        .collect();
    cfg.algorithm = algorithm;
    cfg.health.passive_failures = 0;
    TestBalancer::start(cfg)
}

/// Two primaries whose ports refuse, and a backup: every request is
/// served by the backup, through fail-over, before any check marks the
/// primaries down; with passive health on and off.
#[test]
fn refusing_primaries_fail_over_to_the_backup() {
    for passive_failures in [3, 0] {
        let c = TestBackend::http(2);
        let mut cfg = config(&[]);
        cfg.backends = vec![
            BackendSpec::parse(&closed_port().to_string()).unwrap(),
            BackendSpec::parse(&closed_port().to_string()).unwrap(),
            BackendSpec::parse(&format!("{},backup", c.addr())).unwrap(),
        ];
        cfg.health.passive_failures = passive_failures;
        let lb = TestBalancer::start(cfg);
        assert_eq!(
            served(&lb, 8, &[&c]),
            [8],
            "8 of 8 on the backup (passive_failures {passive_failures})"
        );
        lb.stop();
    }
}

/// Four backends, the third dead and never marked down: its quarter of
/// 240 requests spreads over the three others as the algorithm spreads
/// any backend's share (round robin, least connections, p2c): 70 to 90
/// each with round robin (55 to 105 for least connections and p2c, whose
/// ties and draws vary from run to run), where list-order fail-over gave
/// 60/60/120.
#[test]
fn a_dead_backends_share_spreads_over_the_others() {
    for algorithm in [
        Algorithm::RoundRobin,
        Algorithm::LeastConnections,
        Algorithm::PowerOfTwo,
    ] {
        let live: Vec<TestBackend> = (0..3).map(TestBackend::http).collect();
        let dead: SocketAddr = closed_port();
        let addrs = [live[0].addr(), live[1].addr(), dead, live[2].addr()];
        let specs: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
        let lb = without_passive_health(&specs, algorithm);
        let counts = served(&lb, 240, &live.iter().collect::<Vec<_>>());
        // Round robin is exact. p2c draws its two candidates at random
        // (one backend's count of 240 spreads by about 7 around 80), and
        // least connections breaks ties by whether the previous client's
        // connection is still counted when the next one picks: both get a
        // wider bound, which list-order fail-over's 120 is still far out of.
        let bound = match algorithm {
            Algorithm::RoundRobin => 70..=90,
            _ => 55..=105,
        };
        for n in &counts {
            assert!(bound.contains(n), "{algorithm}: {counts:?}");
        }
        lb.stop();
    }
}

/// Weights 1 and 3, and a dead backend of weight 1: its fifth of the
/// requests goes 1:3 too, about 60:180 of 240 (list-order fail-over gave
/// 96:144).
#[test]
fn a_dead_backends_share_follows_the_weights() {
    let light = TestBackend::http(0);
    let heavy = TestBackend::http(1);
    let specs = [
        format!("{},weight=1", light.addr()),
        format!("{},weight=3", heavy.addr()),
        format!("{},weight=1", closed_port()),
    ];
    let lb = without_passive_health(&specs, Algorithm::WeightedRoundRobin);
    let counts = served(&lb, 240, &[&light, &heavy]);
    assert!((55..=65).contains(&counts[0]), "{counts:?}");
    assert_eq!(counts[0] + counts[1], 240, "{counts:?}");
    lb.stop();
}

/// The access log's JSON lines in `path`, once there are `n` (bounded).
fn access_lines(path: &std::path::Path, n: usize) -> Vec<serde_json::Value> {
    let mut got = Vec::new();
    let found = common::wait_for(common::IO_TIMEOUT, || {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        got = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect();
        got.len() >= n
    });
    assert!(found, "only {} lines: {got:?}", got.len());
    got
}

/// A balancer over `backends` with passive health off (every client
/// meets every dead backend), an access log in JSON at `path`, and
/// `tune` applied.
fn logged(
    backends: &[SocketAddr],
    path: &std::path::Path,
    tune: impl FnOnce(&mut rodizio::Config),
) -> TestBalancer {
    let _ = std::fs::remove_file(path);
    let mut cfg = config(backends);
    cfg.health.passive_failures = 0;
    cfg.access_log = Some(rodizio::access_log::Format::Json);
    cfg.access_log_file = Some(path.to_path_buf());
    tune(&mut cfg);
    TestBalancer::start(cfg)
}

/// Five refusing backends and `connect_retries` 1: a client's tries end
/// after exactly two backends, and its line says the retries ended them
/// (`"failovers":2,"failovers_ended":"retries"`). With `connect_retries`
/// 0, one backend; with the default, all five (and no limit named).
#[test]
fn connect_retries_bounds_the_backends_tried() {
    let dead: Vec<SocketAddr> = (0..5).map(|_| closed_port()).collect();
    for (retries, tried, ended) in [
        (Some(1), 2, Some("retries")),
        (Some(0), 1, Some("retries")),
        (None, 5, None),
    ] {
        let path = std::env::temp_dir().join(format!(
            "rodizio-retries-{}-{retries:?}.log",
            std::process::id()
        ));
        let lb = logged(&dead, &path, |c| c.proxy.connect_retries = retries);
        let mut client = common::connect(lb.addr).unwrap();
        assert!(common::is_closed(&mut client), "no backend answers");
        let line = &access_lines(&path, 1)[0];
        assert_eq!(line["end"], "connect_failed", "{line}");
        assert_eq!(line["failovers"], tried, "{retries:?}: {line}");
        assert_eq!(lb.stats.snapshot().connect_failures, tried, "{retries:?}");
        match ended {
            Some(ended) => assert_eq!(line["failovers_ended"], ended, "{line}"),
            None => assert!(line.get("failovers_ended").is_none(), "{line}"),
        }
        lb.stop();
        let _ = std::fs::remove_file(&path);
    }
}

/// Five black holes (full backlogs: connects time out), connect timeout
/// 400 ms. Without a budget a client waits for all five timeouts (about
/// 2 s); with `connect_retry_budget` 600 ms it is closed after about
/// 600 ms (the second try gets the 200 ms left), and its line says the
/// budget ended the tries.
#[test]
fn connect_retry_budget_bounds_the_clients_wait() {
    let holes: Vec<_> = (0..5).map(|_| common::black_hole()).collect();
    let addrs: Vec<SocketAddr> = holes.iter().map(|h| h.1).collect();
    let wait = |budget: Option<Duration>| {
        let path = std::env::temp_dir().join(format!(
            "rodizio-budget-{}-{}.log",
            std::process::id(),
            budget.is_some()
        ));
        let lb = logged(&addrs, &path, |c| {
            c.proxy.connect_timeout = Duration::from_millis(400);
            c.proxy.connect_retry_budget = budget;
        });
        let started = Instant::now();
        let mut client = common::connect(lb.addr).unwrap();
        assert!(common::is_closed(&mut client), "no backend answers");
        let waited = started.elapsed();
        let line = access_lines(&path, 1).remove(0);
        lb.stop();
        let _ = std::fs::remove_file(&path);
        (waited, line)
    };
    let (budgeted, line) = wait(Some(Duration::from_millis(600)));
    assert_eq!(line["end"], "connect_failed", "{line}");
    assert_eq!(line["failovers_ended"], "budget", "{line}");
    assert_eq!(line["failovers"], 2, "{line}");
    let (unbudgeted, line) = wait(None);
    assert_eq!(line["failovers"], 5, "{line}");
    assert!(line.get("failovers_ended").is_none(), "{line}");
    assert!(
        budgeted >= Duration::from_millis(550) && budgeted < Duration::from_millis(1_500),
        "with a 600 ms budget the client waited {budgeted:?}"
    );
    assert!(
        unbudgeted >= Duration::from_millis(1_900) && budgeted < unbudgeted,
        "{budgeted:?} budgeted, {unbudgeted:?} without"
    );
}
