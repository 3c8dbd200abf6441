//! `backends_from: etcd://...` with a real etcd on loopback: three rodizio
//! processes with no backend of their own follow one prefix; a key put
//! makes all three serve its backend within a second, a key deleted
//! drains it; with etcd killed the list stays and clients are served
//! without one failure, and once etcd is back on the same data directory
//! and port a key put after the restart is followed.

mod child;
mod common;
mod peers;
mod tls_certs;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use child::{Child, Scratch};
use common::{connect, time_until, TestBackend};
use peers::{need, temp_dir, Peer};
use rodizio::etcd::EtcdSource;
use tls_certs::{Certs, Pair};

const PREFIX: &str = "/lb/web/";

/// etcd on `client` (peers on `peer`) over `data`, ready when this
/// returns (a range read answers); stopped by SIGKILL.
fn etcd(client: u16, peer: u16, data: &Path) -> Peer {
    etcd_with(client, peer, data, None)
}

/// Where a test's etcd lives: its client and peer ports and its data
/// directory, kept for a restart on the same data.
struct Place {
    client: u16,
    peer: u16,
    data: Scratch,
}

impl Place {
    fn new() -> Place {
        let ports = peers::free_ports(2);
        Place {
            client: ports[0],
            peer: ports[1],
            data: Scratch::new("etcd-data"),
        }
    }

    /// etcd here, ready; again on the same data after a stop.
    fn start(&self) -> Peer {
        etcd(self.client, self.peer, &self.data.path("d"))
    }
}

/// [`etcd`], serving its clients over TLS with `tls` (and trusted by the
/// test through `ca`) when given.
fn etcd_with(client: u16, peer: u16, data: &Path, tls: Option<(&Pair, &Path)>) -> Peer {
    let bin = need("etcd", "etcd-server");
    let mut cmd = Command::new(bin);
    let scheme = if tls.is_some() { "https" } else { "http" };
    let (c, p) = (
        format!("{scheme}://127.0.0.1:{client}"),
        format!("http://127.0.0.1:{peer}"),
    );
    if let Some((pair, _)) = tls {
        cmd.arg("--cert-file").arg(&pair.cert);
        cmd.arg("--key-file").arg(&pair.key);
    }
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
    let source: EtcdSource = match tls {
        None => source(client),
        Some((_, ca)) => format!("etcds://127.0.0.1:{client}{PREFIX}?ca={}", ca.display())
            .parse()
            .unwrap(),
    };
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

/// A balancer following `client`'s prefix, beside the file's backend
/// `fixed` if any (with none, etcd is its only source of backends).
fn rodizio(client: u16, fixed: Option<&TestBackend>) -> Child {
    let source = source(client).to_string();
    let mut args = vec!["--admin", "127.0.0.1:0", "--backends-from", &source];
    let fixed = fixed.map(|f| f.addr().to_string());
    if let Some(f) = &fixed {
        args.extend(["-b", f]);
    }
    Child::on_loopback(&args, |_| {})
}

/// Three balancers with no backend of their own follow one prefix: a put
/// serves in all three within a second, a delete drains it in all three,
/// and a compaction in the middle leaves their watches following.
#[test]
fn three_balancers_follow_one_prefix() {
    let place = Place::new();
    let _etcd = place.start();
    let ports = [place.client];
    let (a, b) = (TestBackend::echo(), TestBackend::echo());
    // A key whose value is the backend, with an option.
    etcdctl(
        ports[0],
        &[
            "put",
            &format!("{PREFIX}a"),
            &format!("{},weight=1", a.addr()),
        ],
    );
    let mut lbs: Vec<Child> = (0..3).map(|_| rodizio(ports[0], None)).collect();
    let addrs: Vec<SocketAddr> = lbs.iter_mut().map(|lb| lb.listening()).collect();
    for &lb in &addrs {
        assert!(
            reaches(lb, &a, Duration::from_secs(10)),
            "a from the first read"
        );
    }
    // A key with no value: its last segment is the backend. The second
    // counts from the put's return, for all three together.
    etcdctl(ports[0], &["put", &format!("{PREFIX}{}", b.addr()), ""]);
    let put = std::time::Instant::now();
    for &lb in &addrs {
        let left = Duration::from_secs(1).saturating_sub(put.elapsed());
        assert!(reaches(lb, &b, left), "b within a second of the put");
    }
    etcdctl(ports[0], &["del", &format!("{PREFIX}{}", b.addr())]);
    let del = std::time::Instant::now();
    for &lb in &addrs {
        let limit = Duration::from_secs(1).saturating_sub(del.elapsed());
        assert!(left(lb, &b, limit), "b drained within a second");
        assert!(reaches(lb, &a, Duration::from_secs(1)), "a still serves");
    }
    for lb in &mut lbs {
        assert!(lb.log().contains("draining"), "{}", lb.log());
    }
    // A compaction up to the newest revision while the watches run: they
    // go on, and the next put is followed as before.
    let revision = rodizio::etcd::range(&source(ports[0])).unwrap().revision;
    etcdctl(ports[0], &["compact", &revision.to_string()]);
    let c = TestBackend::echo();
    etcdctl(
        ports[0],
        &["put", &format!("{PREFIX}c"), &c.addr().to_string()],
    );
    for &lb in &addrs {
        assert!(
            reaches(lb, &c, Duration::from_secs(1)),
            "c after the compaction"
        );
    }
}

/// One byte echoed through `lb`, or why not.
fn try_echo(lb: SocketAddr) -> std::io::Result<()> {
    let mut s = connect(lb)?;
    s.write_all(b"x")?;
    let mut b = [0u8];
    s.read_exact(&mut b)
}

/// Clients of `lb` one after the other, at most 500 a second (the
/// machine's ports are shared with the other tests), until `stop` (at
/// most 20,000 or a minute), each one served counted in `served` as it
/// goes: how many failed.
fn clients(
    lb: SocketAddr,
    served: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> thread::JoinHandle<u64> {
    thread::spawn(move || {
        let mut failed = 0;
        let began = std::time::Instant::now();
        while !stop.load(Ordering::Relaxed)
            && served.load(Ordering::Relaxed) + failed < 20_000
            && began.elapsed() < Duration::from_secs(60)
        {
            match try_echo(lb) {
                Ok(()) => _ = served.fetch_add(1, Ordering::Relaxed),
                Err(_) => failed += 1,
            }
            thread::sleep(Duration::from_millis(2));
        }
        failed
    })
}

/// Whether `n` more clients are counted in `served` within 10 s.
fn served_more(served: &AtomicU64, n: u64) -> bool {
    let from = served.load(Ordering::Relaxed);
    time_until(Duration::from_secs(10), || {
        served.load(Ordering::Relaxed) >= from + n
    })
    .is_some()
}

/// `ab` against `lb` in runs of 200 requests (2 at once, one connection
/// each) until `stop`, at most 40 runs: the runs made, and the requests
/// complete and failed in all. Short runs bound the ports the load takes
/// from the machine to the time it is needed.
fn ab_until(lb: SocketAddr, stop: Arc<AtomicBool>) -> thread::JoinHandle<(usize, usize, usize)> {
    thread::spawn(move || {
        let (mut runs, mut complete, mut failed) = (0, 0, 0);
        while !stop.load(Ordering::Relaxed) && runs < 40 {
            let (c, f) = peers::ab(lb, 200, 2);
            (runs, complete, failed) = (runs + 1, complete + c, failed + f);
        }
        (runs, complete, failed)
    })
}

/// etcd killed: the list stays and serves; etcd back: followed again.
/// Clients are served all along, none fails.
#[test]
fn an_etcd_restart_keeps_the_list_then_follows_again() {
    let place = Place::new();
    let mut server = place.start();
    let ports = [place.client];
    let (fixed, a, c) = (
        TestBackend::echo(),
        TestBackend::echo(),
        TestBackend::echo(),
    );
    etcdctl(
        ports[0],
        &["put", &format!("{PREFIX}a"), &a.addr().to_string()],
    );
    let mut lb = rodizio(ports[0], Some(&fixed));
    let addr = lb.listening();
    assert!(reaches(addr, &a, Duration::from_secs(10)));
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicU64::new(0));
    let load = clients(addr, served.clone(), stop.clone());
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
    assert!(served_more(&served, 50), "served while etcd was gone");
    let _back = place.start();
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
    assert!(served_more(&served, 50), "served once etcd was back");
    stop.store(true, Ordering::Relaxed);
    let failed = load.join().unwrap();
    let served = served.load(Ordering::Relaxed);
    assert_eq!(failed, 0, "{served} served, {failed} failed");
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

/// A balancer with etcd as its only source starts while etcd is down: it
/// runs with no backend (clients are closed, none hangs), and serves once
/// etcd comes up with a key under the prefix.
#[test]
fn an_etcd_only_service_starts_with_etcd_down_and_serves_once_it_is_up() {
    let place = Place::new();
    let a = TestBackend::echo();
    let mut lb = rodizio(place.client, None);
    let addr = lb.listening();
    for _ in 0..3 {
        assert!(try_echo(addr).is_err(), "served with no backend");
    }
    let _etcd = place.start();
    etcdctl(
        place.client,
        &["put", &format!("{PREFIX}a"), &a.addr().to_string()],
    );
    // Refused until the follower's next try (a backoff of at most 5 s).
    time_until(Duration::from_secs(15), || try_echo(addr).is_ok())
        .unwrap_or_else(|| panic!("not served once etcd is up: {}", lb.log()));
    assert!(reaches(addr, &a, Duration::from_secs(2)));
}

/// Three balancers with etcd as their only source, each under `ab` (one
/// connection per request, in runs of 200) while etcd is killed,
/// restarted on its data, and a second backend put: not one request
/// fails, and all three serve the new backend while `ab` still runs.
#[test]
fn three_balancers_under_ab_lose_no_request_across_an_etcd_restart() {
    let place = Place::new();
    let mut server = place.start();
    let ports = [place.client];
    let (a, b) = (
        common::Demo::start("127.0.0.1:0", "a"),
        common::Demo::start("127.0.0.1:0", "b"),
    );
    etcdctl(
        ports[0],
        &["put", &format!("{PREFIX}a"), &a.addr.to_string()],
    );
    let mut lbs: Vec<Child> = (0..3).map(|_| rodizio(ports[0], None)).collect();
    let addrs: Vec<SocketAddr> = lbs.iter_mut().map(|lb| lb.listening()).collect();
    for &lb in &addrs {
        time_until(Duration::from_secs(10), || {
            common::http_get(lb, "/").is_ok_and(|r| r.status.contains("200"))
        })
        .expect("served from etcd's first read");
    }
    let stop = Arc::new(AtomicBool::new(false));
    let loads: Vec<_> = addrs.iter().map(|&lb| ab_until(lb, stop.clone())).collect();
    server.stop();
    let _back = place.start();
    etcdctl(
        ports[0],
        &["put", &format!("{PREFIX}b"), &b.addr.to_string()],
    );
    let from_b =
        |lb| common::http_get(lb, "/").is_ok_and(|r| r.body.contains("Handled by server b"));
    time_until(Duration::from_secs(15), || {
        addrs.iter().all(|&lb| (0..4).any(|_| from_b(lb)))
    })
    .expect("b followed by all three");
    let running = loads.iter().all(|l| !l.is_finished());
    stop.store(true, Ordering::Relaxed);
    for load in loads {
        let (runs, complete, failed) = load.join().unwrap();
        assert_eq!(
            failed, 0,
            "{complete} complete, {failed} failed in {runs} runs"
        );
        assert!(
            runs >= 1 && complete >= 200 * runs,
            "{runs} runs, {complete} complete"
        );
    }
    assert!(running, "ab ended (40 runs) before b was followed");
}

/// With etcd's authentication on, a balancer given `USER:PASSWORD@`
/// follows the prefix; one given a wrong password serves nothing and says
/// why in its log. Neither password is ever shown: not in the log, not in
/// the admin API's `/config`.
#[test]
fn a_user_and_password_are_sent_and_never_shown() {
    let place = Place::new();
    let _etcd = place.start();
    let p = place.client;
    let root = "--user=root:root-pw";
    etcdctl(
        p,
        &[
            "user",
            "add",
            "root",
            "--new-user-password=root-pw",
            "--interactive=false",
        ],
    );
    etcdctl(p, &["user", "grant-role", "root", "root"]);
    etcdctl(p, &["auth", "enable"]);
    etcdctl(
        p,
        &[
            root,
            "user",
            "add",
            "lb",
            "--new-user-password=lb-s3cret",
            "--interactive=false",
        ],
    );
    etcdctl(p, &[root, "role", "add", "reader"]);
    let grant = [
        "role",
        "grant-permission",
        "reader",
        "--prefix=true",
        "read",
        PREFIX,
    ];
    etcdctl(p, &[&[root][..], &grant[..]].concat());
    etcdctl(p, &[root, "user", "grant-role", "lb", "reader"]);
    let a = TestBackend::echo();
    etcdctl(
        p,
        &[root, "put", &format!("{PREFIX}a"), &a.addr().to_string()],
    );
    let with = |password: &str| {
        let url = format!("etcd://lb:{password}@127.0.0.1:{p}{PREFIX}");
        Child::on_loopback(&["--admin", "127.0.0.1:0", "--backends-from", &url], |_| {})
    };
    let (mut good, mut bad) = (with("lb-s3cret"), with("wrong-pw"));
    let (g, b) = (good.listening(), bad.listening());
    time_until(Duration::from_secs(10), || try_echo(g).is_ok())
        .unwrap_or_else(|| panic!("not served: {}", good.log()));
    assert!(reaches(g, &a, Duration::from_secs(2)));
    time_until(Duration::from_secs(10), || {
        bad.log().contains("authenticating as lb")
    })
    .unwrap_or_else(|| panic!("no word of the refusal: {}", bad.log()));
    assert!(try_echo(b).is_err(), "served with no backend");
    for (lb, password) in [(&mut good, "lb-s3cret"), (&mut bad, "wrong-pw")] {
        let config = common::http_get(lb.admin(), "/config").unwrap().body;
        assert!(config.contains("etcd://lb:***@"), "{config}");
        for text in [config, lb.log()] {
            assert!(!text.contains(password), "the password shown: {text}");
        }
    }
}

/// `etcds://`: etcd serving its clients over TLS with a certificate for
/// 127.0.0.1 from the test's CA. A balancer given that CA (`?ca=`) follows
/// the prefix, its watch too; one trusting only the system's CAs serves
/// nothing and names the certificate; a plain `etcd://` to the TLS port
/// fails too, neither hangs.
#[test]
fn etcd_over_tls_is_followed_with_its_ca_and_refused_without() {
    let certs = Certs::new();
    let pair = certs.issue("etcd", &["127.0.0.1"], 7);
    let place = Place::new();
    let ca = certs.ca();
    let _etcd = etcd_with(
        place.client,
        place.peer,
        &place.data.path("d"),
        Some((&pair, &ca)),
    );
    let p = place.client;
    let put = |key: &str, value: &str| {
        let bin = need("etcdctl", "etcd-client");
        let out = Command::new(bin)
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints=https://127.0.0.1:{p}"))
            .arg(format!("--cacert={}", ca.display()))
            .args([
                "--dial-timeout=3s",
                "--command-timeout=5s",
                "put",
                key,
                value,
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "etcdctl put: {out:?}");
    };
    let (a, b) = (TestBackend::echo(), TestBackend::echo());
    put(&format!("{PREFIX}a"), &a.addr().to_string());
    let with = |url: String| {
        Child::on_loopback(&["--admin", "127.0.0.1:0", "--backends-from", &url], |_| {})
    };
    let mut good = with(format!("etcds://127.0.0.1:{p}{PREFIX}?ca={}", ca.display()));
    let mut untrusted = with(format!("etcds://127.0.0.1:{p}{PREFIX}"));
    let mut plain = with(format!("etcd://127.0.0.1:{p}{PREFIX}"));
    let g = good.listening();
    time_until(Duration::from_secs(10), || try_echo(g).is_ok())
        .unwrap_or_else(|| panic!("not served over TLS: {}", good.log()));
    put(&format!("{PREFIX}b"), &b.addr().to_string());
    assert!(reaches(g, &b, Duration::from_secs(1)), "b, from the watch");
    time_until(Duration::from_secs(10), || {
        untrusted.log().contains("certificate")
    })
    .unwrap_or_else(|| panic!("no word of the certificate: {}", untrusted.log()));
    time_until(Duration::from_secs(10), || {
        plain.log().contains("stay as they are")
    })
    .unwrap_or_else(|| panic!("no word of the failure: {}", plain.log()));
    for lb in [&mut untrusted, &mut plain] {
        let addr = lb.listening();
        assert!(try_echo(addr).is_err(), "served with no backend");
    }
    let config = common::http_get(good.admin(), "/config").unwrap().body;
    assert!(config.contains("etcds://127.0.0.1"), "{config}");
}

/// `key` = `value` put through etcd's JSON gateway (faster than one
/// etcdctl process a key).
fn put_raw(client: u16, key: &str, value: &str) {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let body = format!(r#"{{"key":"{}","value":"{}"}}"#, b64(key), b64(value));
    let timeout = rodizio::etcd::TIMEOUT;
    let answer = rodizio::etcd::post(&source(client), "/v3/kv/put", &body, timeout);
    answer.and_then(|a| a.body()).expect("put");
}

/// Hostile keys in a real etcd: 300 values that are not backends
/// (garbage, terminal escapes and line breaks, `srv:` names) and a 1 MiB
/// value beside one good key. The good key serves; the others are said
/// in at most four short lines with no control character, and not again
/// when other keys change.
#[test]
fn hostile_keys_are_left_out_in_a_few_short_lines() {
    let place = Place::new();
    let _etcd = place.start();
    let p = place.client;
    let (a, b) = (TestBackend::echo(), TestBackend::echo());
    put_raw(p, &format!("{PREFIX}a"), &a.addr().to_string());
    for i in 0..300 {
        let value = match i % 3 {
            0 => format!("not a backend {i}"),
            1 => format!("\u{1b}[31m\r\nforged log line {i}"),
            _ => format!("srv:_x._tcp.y{i}"),
        };
        put_raw(p, &format!("{PREFIX}bad{i}"), &value);
    }
    put_raw(p, &format!("{PREFIX}huge"), &"h".repeat(1 << 20));
    let mut lb = rodizio(p, None);
    let addr = lb.listening();
    time_until(Duration::from_secs(10), || try_echo(addr).is_ok())
        .unwrap_or_else(|| panic!("not served: {}", lb.log()));
    for i in 0..5 {
        put_raw(
            p,
            &format!("{PREFIX}b"),
            &format!("{},weight={}", b.addr(), i + 1),
        );
    }
    assert!(reaches(addr, &b, Duration::from_secs(2)), "b");
    let log = lb.log();
    let told: Vec<&str> = log.lines().filter(|l| l.contains("left out")).collect();
    assert!(!told.is_empty() && told.len() <= 4, "{told:#?}");
    assert!(
        told.iter()
            .any(|l| l.contains("more keys are not backends")),
        "{told:#?}"
    );
    for line in log.lines() {
        assert!(line.len() < 400, "a line of {} bytes", line.len());
        assert!(
            !line.contains('\u{1b}') && !line.starts_with("forged"),
            "{line}"
        );
    }
}
