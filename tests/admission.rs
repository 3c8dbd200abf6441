//! The one admission gate (`src/proxy/admission.rs`): each refusal kind
//! (denied, too many connections per client, rate limited, no backend)
//! sent down each path (a plain client, a client behind a PROXY header, a
//! client routed by SNI, a client of a service that terminates TLS) comes
//! out the same way: the same counter, the same access log `end`, the same
//! trace sentence, the client closed without reaching a backend.

mod common;
mod tls_certs;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{connect, is_closed, wait_for, TestBackend, TestBalancer, IO_TIMEOUT};
use rodizio::access_log::Format;
use rodizio::limiter::{Rate, RateLimitConfig};
use rodizio::stats::StatsSnapshot as Snapshot;
use rodizio::tls_term::CertList;
use rodizio::trace::{self, Lang};
use rodizio::Config;
use serde_json::Value;

/// The trace is process-wide (one switch, one output): the tests of this
/// file take turns.
static TURN: Mutex<()> = Mutex::new(());

/// The client's address a header names, on the PROXY header path.
const HEADER_SOURCE: &str = "192.0.2.1:51234";

/// How a client reaches the service.
#[derive(Debug, Clone, Copy)]
enum Path_ {
    /// Straight to its address: the accept loop runs the gate.
    Plain,
    /// Behind `--accept-proxy`: a worker runs it after the header.
    ProxyHeader,
    /// On an address routed by SNI: a worker runs it after the peek.
    Sni,
    /// To a service that terminates TLS: the accept loop runs it, before
    /// any handshake.
    Tls,
}

/// Why the client is refused.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Denied,
    TooMany,
    RateLimited,
    NoBackend,
}

impl Kind {
    /// The access log's `end`.
    fn end(self) -> &'static str {
        match self {
            Kind::Denied => "denied",
            Kind::TooMany => "too_many_connections",
            Kind::RateLimited => "rate_limited",
            Kind::NoBackend => "no_backend",
        }
    }

    /// The counter it raises.
    fn counter(self, s: &Snapshot) -> u64 {
        match self {
            Kind::Denied => s.denied,
            Kind::TooMany => s.too_many_connections,
            Kind::RateLimited => s.rate_limited,
            Kind::NoBackend => s.no_backend,
        }
    }

    /// The trace sentence of its refusal.
    fn traced(self) -> Option<&'static str> {
        match self {
            Kind::RateLimited => Some(" refused, it already used its 1 connections"),
            Kind::NoBackend => Some("no backend is available (all down or draining)"),
            Kind::Denied => Some(" may not connect here; closed without a backend"),
            Kind::TooMany => Some(" already has its most connections open; closed"),
        }
    }
}

impl Path_ {
    /// What a client sends first on this path.
    fn opening(self) -> &'static [u8] {
        match self {
            Path_::Plain => b"",
            Path_::ProxyHeader => b"PROXY TCP4 192.0.2.1 198.51.100.7 51234 80\r\n",
            // Not TLS: the router sends it to the default service at once.
            Path_::Sni => b"hello, no TLS here\n",
            // Refused before its handshake: it need not start one.
            Path_::Tls => b"",
        }
    }

    /// The client the gate judges, as the access log names it.
    fn judged(self, socket: &TcpStream) -> String {
        match self {
            Path_::ProxyHeader => HEADER_SOURCE.to_string(),
            _ => socket.local_addr().unwrap().to_string(),
        }
    }
}

/// Every trace line of the process from now on, collected.
fn capture() -> Arc<Mutex<Vec<String>>> {
    let lines: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink = Arc::clone(&lines);
    trace::set_output(Some(Box::new(move |line: &str| {
        sink.lock().unwrap().push(line.to_string())
    })));
    lines
}

/// The trace lines (without their `#id `) of the newest connection whose
/// accepted line names `client` (an earlier case's client may have had
/// the same port).
fn lines_of(lines: &Mutex<Vec<String>>, client: SocketAddr) -> Vec<String> {
    let lines = lines.lock().unwrap();
    let needle = format!("accepted client {client}:");
    let Some(id) = lines
        .iter()
        .rev()
        .find(|l| l.contains(&needle))
        .and_then(|l| l.split(' ').next())
    else {
        return Vec::new();
    };
    let prefix = format!("{id} ");
    lines
        .iter()
        .filter_map(|l| l.strip_prefix(&prefix).map(str::to_string))
        .collect()
}

/// The access log's lines so far, parsed.
fn access_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

/// A balancer on `path` in front of `backend`, set up to refuse as `kind`,
/// logging to `log` and tracing.
fn balancer(
    path: Path_,
    kind: Kind,
    backend: SocketAddr,
    log: &Path,
    pair: &tls_certs::Pair,
) -> TestBalancer {
    let mut c = common::config(&[backend]);
    c.health.interval = Duration::from_secs(3600);
    c.access_log = Some(Format::Json);
    c.access_log_file = Some(log.to_path_buf());
    c.trace = true;
    c.trace_lang = Lang::En;
    match kind {
        Kind::Denied => c.proxy.deny = Some("127.0.0.0/8, 192.0.2.0/24".parse().unwrap()),
        Kind::TooMany => c.proxy.max_connections_per_client = Some(1),
        Kind::RateLimited => {
            c.rate_limit = Some(RateLimitConfig::new(Rate {
                limit: 1,
                window: Duration::from_secs(600),
            }))
        }
        Kind::NoBackend => {}
    }
    match path {
        Path_::Plain => TestBalancer::start(c),
        Path_::Tls => {
            c.tls.certs = CertList(vec![pair.setting()]);
            TestBalancer::start(c)
        }
        Path_::ProxyHeader => {
            c.accept_proxy = true;
            TestBalancer::start(c)
        }
        Path_::Sni => {
            // Port 0: the service alone on its address, routed by SNI.
            c.name = "only".into();
            c.sni.server_names = Some("a.test".parse().unwrap());
            c.sni.default = true;
            c.sni.timeout = IO_TIMEOUT;
            // The access log and the trace are the process's.
            TestBalancer::start(Config {
                access_log: c.access_log,
                access_log_file: c.access_log_file.clone(),
                trace: true,
                trace_lang: Lang::En,
                services: vec![c],
                drain_timeout: Duration::from_secs(5),
                ..Config::default()
            })
        }
    }
}

/// A client on `path` that is served: its opening, then an echo; held
/// open until dropped.
fn served(addr: SocketAddr, path: Path_, ca: &Path) -> Box<dyn std::any::Any> {
    if let Path_::Tls = path {
        let mut s = tls_certs::connect(addr, "a.test", ca).unwrap();
        s.write_all(b"ping").unwrap();
        let mut got = [0u8; 4];
        s.read_exact(&mut got).unwrap();
        return Box::new(s);
    }
    let mut s = connect(addr).unwrap();
    let mut sent = path.opening().to_vec();
    sent.extend(b"ping");
    s.write_all(&sent).unwrap();
    // The echo backend sends back all it got past the header.
    let back = if matches!(path, Path_::ProxyHeader) {
        b"ping".len()
    } else {
        sent.len()
    };
    let mut got = vec![0u8; back];
    s.read_exact(&mut got).unwrap();
    Box::new(s)
}

/// One refusal of `kind` on `path`: what the gate's report says of it.
struct Seen {
    counter: u64,
    end: String,
    client: String,
    backend_reached: usize,
    traced: Vec<String>,
}

fn refuse_one(
    path: Path_,
    kind: Kind,
    lines: &Arc<Mutex<Vec<String>>>,
    certs: &(tls_certs::Certs, tls_certs::Pair),
) -> Seen {
    let backend = TestBackend::echo();
    let log = std::env::temp_dir().join(format!(
        "rodizio-admission-{}-{path:?}-{kind:?}.log",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&log);
    let lb = balancer(path, kind, backend.addr(), &log, &certs.1);
    let ca = certs.0.ca();
    // What takes the client's one place, or spends its one connection.
    let mut held = None;
    match kind {
        Kind::TooMany => held = Some(served(lb.addr, path, &ca)),
        Kind::RateLimited => drop(served(lb.addr, path, &ca)),
        Kind::NoBackend => {
            lb.backend(backend.addr()).set_healthy(false);
        }
        Kind::Denied => {}
    }
    let reached = backend.accepted();
    let mut s = connect(lb.addr).unwrap();
    let client = s.local_addr().unwrap();
    let judged = path.judged(&s);
    let _ = s.write_all(path.opening());
    assert!(is_closed(&mut s), "{path:?} {kind:?}: the client is closed");
    // The served client behind a proxy has the same address: the line
    // wanted is the one that is not a served connection's.
    let mut line = None;
    let logged = wait_for(IO_TIMEOUT, || {
        line = access_lines(&log)
            .into_iter()
            .find(|l| l["client"] == judged.as_str() && l["backend"].is_null());
        line.is_some()
    });
    assert!(
        logged,
        "{path:?} {kind:?}: no refusal line for {judged}: {:?}",
        access_lines(&log)
    );
    let line = line.unwrap();
    if let Some(sentence) = kind.traced() {
        let traced = wait_for(IO_TIMEOUT, || {
            lines_of(lines, client).iter().any(|l| l.contains(sentence))
        });
        assert!(
            traced,
            "{path:?} {kind:?}: no trace line '{sentence}' for {client}: {:?}; all: {:?}",
            lines_of(lines, client),
            lines
                .lock()
                .unwrap()
                .iter()
                .rev()
                .take(30)
                .collect::<Vec<_>>()
        );
    }
    let seen = Seen {
        counter: kind.counter(&lb.stats.snapshot()),
        end: line["end"].as_str().unwrap_or_default().to_string(),
        client: line["client"].as_str().unwrap_or_default().to_string(),
        backend_reached: backend.accepted() - reached,
        traced: lines_of(lines, client),
    };
    drop(held);
    lb.stop();
    let _ = std::fs::remove_file(&log);
    seen
}

/// Each refusal kind down each path: counted once in its own counter,
/// access-logged with its `end` under the client the gate judged (the
/// header's address behind a proxy), its trace sentence told once in the
/// client's own trace lines, and no byte sent to a backend.
#[test]
fn each_refusal_comes_out_the_same_on_every_path() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let lines = capture();
    let certs = tls_certs::Certs::new();
    let pair = certs.issue("a", &["a.test"], 2);
    let certs = (certs, pair);
    for kind in [
        Kind::Denied,
        Kind::TooMany,
        Kind::RateLimited,
        Kind::NoBackend,
    ] {
        for path in [Path_::Plain, Path_::ProxyHeader, Path_::Sni, Path_::Tls] {
            let seen = refuse_one(path, kind, &lines, &certs);
            let what = format!("{path:?} {kind:?}: {:#?}", seen.traced);
            assert_eq!(seen.counter, 1, "{what}");
            assert_eq!(seen.end, kind.end(), "{what}");
            assert_eq!(seen.backend_reached, 0, "{what}");
            if matches!(path, Path_::ProxyHeader) {
                assert_eq!(seen.client, HEADER_SOURCE, "{what}");
            }
            if let Some(sentence) = kind.traced() {
                let told = seen.traced.iter().filter(|l| l.contains(sentence)).count();
                assert_eq!(told, 1, "{what}");
            }
            // Refused before any pick: no backend was chosen for it.
            assert!(
                !seen.traced.iter().any(|l| l.contains("chose server_idx")),
                "{what}"
            );
        }
    }
    trace::set_output(None);
}

/// The path of a scratch file for this test.
fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("rodizio-admission-{}-{name}", std::process::id()))
}

/// A PROXY header refused (an untrusted peer) is reported as the gate's
/// refusals are: counted, access-logged `proxy_header_refused` under the
/// peer, and closed.
#[test]
fn a_refused_proxy_header_goes_through_the_same_report() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let backend = TestBackend::echo();
    let log = scratch("header.log");
    let _ = std::fs::remove_file(&log);
    let lb = TestBalancer::with(&[backend.addr()], |c| {
        c.accept_proxy = true;
        c.accept_proxy_from = "10.0.0.0/8".parse().unwrap();
        c.health.interval = Duration::from_secs(3600);
        c.access_log = Some(Format::Json);
        c.access_log_file = Some(log.clone());
    });
    let mut s = connect(lb.addr).unwrap();
    let client = s.local_addr().unwrap().to_string();
    let _ = s.write_all(Path_::ProxyHeader.opening());
    assert!(is_closed(&mut s));
    let logged = wait_for(IO_TIMEOUT, || {
        access_lines(&log)
            .iter()
            .any(|l| l["client"] == client.as_str() && l["end"] == "proxy_header_refused")
    });
    assert!(logged, "{:?}", access_lines(&log));
    assert_eq!(lb.stats.snapshot().proxy_header_refused, 1);
    assert_eq!(backend.accepted(), 0);
    lb.stop();
    let _ = std::fs::remove_file(&log);
}

/// A client of a service that terminates TLS whose handshake fails (it
/// sends no TLS) is a refusal like the others: closed, counted by its
/// kind of failure, and access-logged as an error that says so.
#[test]
fn a_failed_tls_handshake_goes_through_the_same_report() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let certs = tls_certs::Certs::new();
    let pair = certs.issue("a", &["a.test"], 2);
    let backend = TestBackend::echo();
    let log = scratch("tls.log");
    let _ = std::fs::remove_file(&log);
    let lb = TestBalancer::with(&[backend.addr()], |c| {
        c.tls.certs = CertList(vec![pair.setting()]);
        c.health.interval = Duration::from_secs(3600);
        c.access_log = Some(Format::Json);
        c.access_log_file = Some(log.clone());
    });
    let mut s = connect(lb.addr).unwrap();
    let client = s.local_addr().unwrap().to_string();
    let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n");
    // It may get a TLS alert first, then the close.
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    let mut rest = Vec::new();
    let ended = s.read_to_end(&mut rest);
    assert!(
        ended.is_ok() || ended.is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "left open"
    );
    let mut line = None;
    let logged = wait_for(IO_TIMEOUT, || {
        line = access_lines(&log)
            .into_iter()
            .find(|l| l["client"] == client.as_str());
        line.is_some()
    });
    assert!(logged, "{:?}", access_lines(&log));
    let line = line.unwrap();
    assert_eq!(line["end"], "error", "{line}");
    assert_eq!(line["reason"], "tls handshake failed", "{line}");
    assert_eq!(line["backend"], Value::Null, "{line}");
    assert_eq!(backend.accepted(), 0);
    assert_eq!(lb.stats.snapshot().tls_handshakes, 0);
    lb.stop();
    let _ = std::fs::remove_file(&log);
}
