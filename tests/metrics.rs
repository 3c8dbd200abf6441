//! `GET /metrics` is exact: N connections move the counters by exactly N,
//! and the gauges come back to 0 when the connections end, also after a
//! client reset and a backend that dies mid-transfer. Every histogram in
//! the text is consistent (buckets cumulated once, `+Inf` equal to
//! `_count`), checked by [`histograms`], which reads every `_bucket`
//! family, so a histogram added later is checked with no change here.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use rodizio::health::HealthConfig;
use rodizio::Config;

/// The admin API on `127.0.0.1:0` in front of `backends`.
fn admin_config(backends: &[SocketAddr]) -> Config {
    Config {
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        ..config(backends)
    }
}

/// `GET /metrics`: the body, after checking the status and content type.
fn scrape_text(admin: SocketAddr) -> String {
    let mut s = connect(admin).expect("connect to the admin API");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .expect("send");
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("read");
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    body.to_string()
}

/// `GET /metrics`: every sample, by its name with labels.
fn scrape(admin: SocketAddr) -> HashMap<String, f64> {
    scrape_text(admin)
        .lines()
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

/// The key of the histogram `name` of the service `default`, as
/// [`histograms`] writes it.
fn of_default(name: &str) -> String {
    format!("{name}{{\"service\": \"default\"}}")
}

/// One histogram series read back from the text format.
#[derive(Debug)]
struct Histogram {
    /// `(le, value)` in the order written; `le` of `+Inf` is infinity.
    buckets: Vec<(f64, u64)>,
    /// `_count`.
    count: u64,
    /// `_sum`, in seconds.
    sum: f64,
}

impl Histogram {
    /// The value of the bucket `le`, as written.
    fn at(&self, le: f64) -> u64 {
        self.buckets
            .iter()
            .find(|(b, _)| *b == le)
            .unwrap_or_else(|| panic!("no bucket le={le} in {self:?}"))
            .1
    }
}

/// A sample line's name, labels and value: `name{k="v",...} value`.
fn sample(line: &str) -> Result<(String, BTreeMap<String, String>, f64), String> {
    let (series, value) = line
        .rsplit_once(' ')
        .ok_or_else(|| format!("no value in {line:?}"))?;
    let value: f64 = match value {
        "+Inf" => f64::INFINITY,
        v => v.parse().map_err(|_| format!("bad value in {line:?}"))?,
    };
    let Some((name, rest)) = series.split_once('{') else {
        return Ok((series.to_string(), BTreeMap::new(), value));
    };
    let mut labels = BTreeMap::new();
    let mut chars = rest
        .strip_suffix('}')
        .ok_or_else(|| format!("unclosed labels in {line:?}"))?
        .chars();
    loop {
        let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
        if key.is_empty() {
            break;
        }
        if chars.next() != Some('"') {
            return Err(format!("unquoted label {key} in {line:?}"));
        }
        let mut v = String::new();
        loop {
            match chars.next() {
                Some('"') => break,
                Some('\\') => match chars.next() {
                    Some('n') => v.push('\n'),
                    Some(c) => v.push(c),
                    None => return Err(format!("bad escape in {line:?}")),
                },
                Some(c) => v.push(c),
                None => return Err(format!("unclosed label value in {line:?}")),
            }
        }
        labels.insert(key.trim_start_matches(',').to_string(), v);
    }
    Ok((name.to_string(), labels, value))
}

/// What [`histograms`] checks of one series once read.
fn consistent(h: &Histogram) -> Result<(), &'static str> {
    if h.buckets.windows(2).any(|w| w[0].0 >= w[1].0) {
        return Err("le bounds do not rise");
    }
    if h.buckets.windows(2).any(|w| w[0].1 > w[1].1) {
        return Err("a bucket holds less than the one below");
    }
    match h.buckets.last() {
        Some(&(le, n)) if le == f64::INFINITY && n == h.count => {}
        _ => return Err("le=\"+Inf\" is not _count"),
    }
    if !h.sum.is_finite() || h.sum < 0.0 || (h.count == 0 && h.sum != 0.0) {
        return Err("bad _sum");
    }
    Ok(())
}

/// Every histogram series of a `/metrics` text, by its family name (and its
/// labels other than `le`, if any), checked for what Prometheus assumes:
/// every `_bucket` belongs to a family declared `histogram` and every such
/// family has buckets; the `le` bounds rise, ending with `+Inf`; each bucket
/// counts the observations at or below its bound, so the values never go
/// down; `+Inf` equals `_count`; `_sum` is finite, not negative, and 0 when
/// nothing was observed. A histogram whose buckets are cumulated twice fails
/// the `+Inf` check (or the last finite bucket passes `_count`).
fn histograms(text: &str) -> Result<BTreeMap<String, Histogram>, String> {
    let declared: BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" histogram"))
        .collect();
    let mut series: BTreeMap<String, Histogram> = BTreeMap::new();
    let mut parts: BTreeMap<String, (Option<u64>, Option<f64>)> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (name, mut labels, value) = sample(line)?;
        let (family, suffix) = match name.rsplit_once('_') {
            Some((f, s @ ("bucket" | "count" | "sum"))) => (f, s),
            _ => (name.as_str(), ""),
        };
        if suffix == "bucket" && !declared.contains(family) {
            return Err(format!("{line:?}: a bucket of no declared histogram"));
        }
        if !declared.contains(family) || suffix.is_empty() {
            continue;
        }
        let le = labels.remove("le");
        let key = if labels.is_empty() {
            family.to_string()
        } else {
            format!("{family}{labels:?}")
        };
        let whole = |v: f64| -> Result<u64, String> {
            (v >= 0.0 && v.fract() == 0.0 && v < 1e15)
                .then_some(v as u64)
                .ok_or_else(|| format!("{line:?}: not a count"))
        };
        match suffix {
            "bucket" => {
                let le = le.ok_or_else(|| format!("{line:?}: a bucket with no le"))?;
                let le = match le.as_str() {
                    "+Inf" => f64::INFINITY,
                    b => b.parse().map_err(|_| format!("{line:?}: bad le"))?,
                };
                let h = series.entry(key).or_insert(Histogram {
                    buckets: Vec::new(),
                    count: 0,
                    sum: 0.0,
                });
                h.buckets.push((le, whole(value)?));
            }
            "count" => parts.entry(key).or_default().0 = Some(whole(value)?),
            _ => parts.entry(key).or_default().1 = Some(value),
        }
    }
    for family in &declared {
        if !series.keys().any(|k| k.split('{').next() == Some(family)) {
            return Err(format!("histogram {family} has no buckets"));
        }
    }
    for (key, h) in series.iter_mut() {
        let (count, sum) = parts.remove(key).unwrap_or_default();
        h.count = count.ok_or_else(|| format!("{key}: no _count"))?;
        h.sum = sum.ok_or_else(|| format!("{key}: no _sum"))?;
        consistent(h).map_err(|err| format!("{key}: {err}: {h:?}"))?;
    }
    if let Some(key) = parts.keys().next() {
        return Err(format!("{key}: _count or _sum with no buckets"));
    }
    Ok(series)
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
    // A worker counts its connection completed, then itself idle: wait
    // for both.
    until("the last connection is counted", || {
        let now = scrape(admin);
        get(&now, "rodizio_completed_total{service=\"default\"}")
            - get(&before, "rodizio_completed_total{service=\"default\"}")
            >= n as f64
            && get(&now, "rodizio_workers_busy") == 0.0
    });
    let after = scrape(admin);
    let moved = |name: &str| get(&after, name) - get(&before, name);
    assert_eq!(
        moved("rodizio_accepted_total{service=\"default\"}"),
        n as f64
    );
    assert_eq!(
        moved("rodizio_completed_total{service=\"default\"}"),
        n as f64
    );
    let backend_total = format!(
        "rodizio_backend_connections_total{{service=\"default\",backend=\"{}\"}}",
        backend.addr()
    );
    assert_eq!(moved(&backend_total), n as f64);
    assert_eq!(
        moved("rodizio_bytes_to_backends_total{service=\"default\"}"),
        (n as usize * len) as f64
    );
    assert_eq!(
        moved("rodizio_bytes_to_clients_total{service=\"default\"}"),
        (n as usize * len) as f64
    );
    assert_eq!(
        moved("rodizio_queue_wait_seconds_count{service=\"default\"}"),
        n as f64
    );
    assert_eq!(
        moved("rodizio_connection_duration_seconds_count{service=\"default\"}"),
        n as f64
    );
    assert_eq!(get(&after, "rodizio_active{service=\"default\"}"), 0.0);
    assert_eq!(get(&after, "rodizio_workers_busy"), 0.0);
    let active = format!(
        "rodizio_backend_connections_active{{service=\"default\",backend=\"{}\"}}",
        backend.addr()
    );
    assert_eq!(get(&after, &active), 0.0);
    assert_eq!(get(&after, "rodizio_queue_depth"), 0.0);
    lb.stop();
}

/// A client that resets mid-transfer and a backend that dies mid-transfer
/// each end their connection; the gauges come back to 0, and each
/// backend counts one reset among its errors by kind.
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
        get(&m, "rodizio_completed_total{service=\"default\"}") == 2.0
    });
    let text = scrape_text(admin);
    histograms(&text).unwrap_or_else(|err| panic!("{err}\n{text}"));
    let m = scrape(admin);
    assert_eq!(get(&m, "rodizio_active{service=\"default\"}"), 0.0);
    assert_eq!(get(&m, "rodizio_workers_busy"), 0.0);
    for b in [echo.addr(), dying.addr()] {
        let name =
            format!("rodizio_backend_connections_active{{service=\"default\",backend=\"{b}\"}}");
        assert_eq!(get(&m, &name), 0.0, "{name}");
        let name =
            format!("rodizio_backend_connections_total{{service=\"default\",backend=\"{b}\"}}");
        assert_eq!(get(&m, &name), 1.0, "{name}");
        // The stats page's figures: one connection at most, and the reset
        // counted on the backend it was with, as an error of that kind.
        let name =
            format!("rodizio_backend_connections_peak{{service=\"default\",backend=\"{b}\"}}");
        assert_eq!(get(&m, &name), 1.0, "{name}");
        for (kind, n) in [("connect", 0.0), ("reset", 1.0), ("timeout", 0.0)] {
            let name = format!(
                "rodizio_backend_errors_total{{service=\"default\",backend=\"{b}\",kind=\"{kind}\"}}"
            );
            assert_eq!(get(&m, &name), n, "{name}");
        }
    }
    lb.stop();
}

/// 20 short connections, made one after another, each timed from before
/// its connect until the balancer counted it completed: every histogram in
/// `/metrics` is consistent, the queue wait and the connection duration
/// count each connection exactly once, and every bucket whose bound is at
/// least the longest of those times holds exactly the 20 (a bucket cannot
/// hold an observation longer than its bound, nor lose one shorter).
#[test]
fn every_histogram_counts_each_observation_once() {
    let backend = TestBackend::echo();
    let mut config = admin_config(&[backend.addr()]);
    // Checks every 50 ms, so the check histogram has observations too.
    config.health = HealthConfig {
        interval: Duration::from_millis(50),
        timeout: Duration::from_millis(500),
        ..HealthConfig::default()
    };
    let lb = TestBalancer::start(config);
    let admin = lb.admin.expect("admin on");
    let n = 20;
    let mut longest = Duration::ZERO;
    for i in 0..n {
        let started = Instant::now();
        let data = Arc::new(test_data(1000, i));
        let back = echo_through(connect(lb.addr).unwrap(), Arc::clone(&data)).unwrap();
        assert!(back == *data);
        // The duration is observed before `completed` is raised: once it
        // is seen, this connection's observations are in.
        until("the connection is counted", || {
            lb.stats.snapshot().completed == i + 1
        });
        longest = longest.max(started.elapsed());
    }
    until("a few health checks are counted", || {
        let all = lb.stats.histogram_snapshots();
        all.iter()
            .any(|(name, _, h)| name.starts_with("health_check") && h.count >= 4)
    });
    let text = scrape_text(admin);
    let all = histograms(&text).unwrap_or_else(|err| panic!("{err}\n{text}"));
    for name in [
        "rodizio_queue_wait_seconds",
        "rodizio_connection_duration_seconds",
    ] {
        let h = &all[&of_default(name)];
        assert_eq!(h.count, n, "{name}: {h:?}");
        let covering: Vec<_> = h
            .buckets
            .iter()
            .filter(|(le, _)| *le >= longest.as_secs_f64())
            .collect();
        // The test's bound must leave some finite bucket to judge.
        assert!(covering.len() > 1, "{name}: longest {longest:?}: {h:?}");
        for &&(le, count) in &covering {
            assert_eq!(count, n, "{name}: le={le}, longest {longest:?}: {h:?}");
        }
        assert!(h.sum <= longest.as_secs_f64() * n as f64, "{name}: {h:?}");
    }
    let checks = &all[&of_default("rodizio_health_check_duration_seconds")];
    assert!(checks.count >= 4, "{checks:?}");
    assert_eq!(checks.at(f64::INFINITY), checks.count);
    println!("longest connection seen by the client: {longest:?}");
    lb.stop();
}

/// The checker itself: the text of a histogram cumulated twice (the values
/// a real scrape once showed: 20 connections, `le="60"` at 224), one with
/// no `+Inf`, one whose buckets go down and a bucket of an undeclared
/// family are each refused; the same histogram cumulated once passes.
#[test]
fn the_histogram_checker_refuses_inconsistent_text() {
    let text = |buckets: &[(&str, u64)], count: u64| {
        let mut t = String::from("# HELP h_seconds A test.\n# TYPE h_seconds histogram\n");
        t += &format!("h_seconds_sum 0.04\nh_seconds_count {count}\n");
        for (le, v) in buckets {
            t += &format!("h_seconds_bucket{{le=\"{le}\"}} {v}\n");
        }
        t
    };
    let refused = |text: &str, why: &str| match histograms(text) {
        Err(err) => assert!(err.contains(why), "{err}, not {why}"),
        Ok(h) => panic!("accepted: {h:?}\n{text}"),
    };
    let good = text(
        &[("0.001", 12), ("0.0025", 20), ("60", 20), ("+Inf", 20)],
        20,
    );
    let h = histograms(&good).unwrap();
    assert_eq!(h["h_seconds"].at(0.0025), 20);
    let twice = text(
        &[("0.001", 12), ("0.0025", 32), ("60", 224), ("+Inf", 20)],
        20,
    );
    refused(&twice, "less than the one below");
    let no_inf = text(&[("0.001", 12), ("0.0025", 20), ("60", 20)], 20);
    refused(&no_inf, "+Inf");
    let down = text(&[("0.001", 12), ("0.0025", 10), ("+Inf", 20)], 20);
    refused(&down, "less than the one below");
    let stray = format!("{good}other_bucket{{le=\"1\"}} 3\n");
    refused(&stray, "no declared histogram");
    let unlabelled = format!("{good}# TYPE g_seconds histogram\ng_seconds_count 0\n");
    refused(&unlabelled, "has no buckets");
}
