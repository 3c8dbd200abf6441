//! SNI routing without terminating TLS, with real TLS peers: `openssl
//! s_client -servername a.test` and `b.test` on one port reach two
//! `openssl s_server`s with different certificates; a plain backend sees
//! the client's ClientHello byte for byte; clients with no name, an
//! unknown name or no TLS at all go to the default service, or are closed
//! and counted when there is none; one name is shared by two services
//! told apart by the ALPN protocols the client offers.

mod child;
mod common;
mod peers;

use std::io::{Read, Write};
use std::net::{Shutdown as Direction, SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use child::Scratch;
use common::{connect, until, TestBackend, TestBalancer, IO_TIMEOUT};
use peers::{free_port, free_ports, loopback, need, temp_dir, Peer};
use rodizio::config::{file, Overrides};
use rodizio::reload::Reloader;
use rodizio::sni::client_hello;
use rodizio::{Balancer, Config, Shutdown};

/// One service of a shared address: its name, server names, whether it
/// is the default, its backend.
struct Svc<'a>(&'a str, &'a str, bool, SocketAddr);

/// A balancer whose services all listen on one free loopback port, each
/// routed by its server names.
fn shared(services: &[Svc<'_>], timeout: Duration) -> TestBalancer {
    shared_with(services, timeout, |_| {})
}

/// [`shared`], with `tweak` applied to the whole configuration.
fn shared_with(
    services: &[Svc<'_>],
    timeout: Duration,
    tweak: impl FnOnce(&mut Config),
) -> TestBalancer {
    let listen = loopback(free_port());
    let services = services
        .iter()
        .map(|Svc(name, names, default, backend)| {
            let mut c = common::config(&[*backend]);
            c.name = (*name).into();
            c.listen = listen;
            c.health.interval = Duration::from_secs(3600);
            c.sni.server_names = Some(names.parse().unwrap());
            c.sni.default = *default;
            c.sni.timeout = timeout;
            c
        })
        .collect();
    let mut config = Config {
        services,
        drain_timeout: Duration::from_secs(5),
        ..Config::default()
    };
    tweak(&mut config);
    let lb = TestBalancer::start(config);
    assert_eq!(lb.addr, listen);
    lb
}

/// A self-signed certificate for `name` in `dir`: (cert, key).
fn certificate(dir: &Path, name: &str) -> (String, String) {
    let cert = dir.join(format!("{name}.crt")).display().to_string();
    let key = dir.join(format!("{name}.key")).display().to_string();
    let status = Command::new(need("openssl", "openssl"))
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"])
        .args([
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            &key,
            "-out",
            &cert,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "openssl req failed");
    (cert, key)
}

/// `openssl s_server` on `port` with a certificate for `name`.
fn tls_server(port: u16, name: &str) -> Peer {
    let dir = temp_dir(&format!("sni-{name}"));
    let (cert, key) = certificate(&dir, name);
    let mut cmd = Command::new(need("openssl", "openssl"));
    cmd.args(["s_server", "-accept", &format!("127.0.0.1:{port}")])
        .args(["-cert", &cert, "-key", &key, "-www", "-quiet"]);
    let mut peer = Peer::spawn(&format!("s_server-{name}"), cmd, libc::SIGTERM, &dir);
    peer.wait_listening(loopback(port));
    peer
}

/// The subject of the certificate `openssl s_client -servername name`
/// was shown through `addr`, or its output when it saw none.
fn subject_via(addr: SocketAddr, name: Option<&str>) -> Result<String, String> {
    match name {
        Some(n) => subject_via_args(addr, &["-servername", n]),
        None => subject_via_args(addr, &["-noservername"]),
    }
}

/// The subject `openssl s_client ARGS` was shown through `addr`, or its
/// output when it saw none.
fn subject_via_args(addr: SocketAddr, args: &[&str]) -> Result<String, String> {
    let mut cmd = Command::new(need("openssl", "openssl"));
    cmd.args(["s_client", "-connect", &addr.to_string()]);
    cmd.args(args);
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Closing its input ends s_client once the handshake is done.
    drop(child.stdin.take());
    let pid = child.id();
    let (done, ended) = crossbeam_channel::bounded::<()>(0);
    let guard = std::thread::spawn(move || {
        // A hung s_client is killed by its PID after the I/O timeout
        // (while it is still waited for, so the PID is still its own).
        if let Err(crossbeam_channel::RecvTimeoutError::Timeout) = ended.recv_timeout(IO_TIMEOUT) {
            // SAFETY: kill(2) on our own child's PID, not yet reaped.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    });
    let out = child.wait_with_output().unwrap();
    drop(done);
    let _ = guard.join();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix("subject="))
        .map(|s| s.replace(' ', ""))
        .ok_or(text)
}

/// Two `openssl s_server`s with certificates for a.test and b.test behind
/// one port: `s_client -servername` reaches each by its name (and
/// `*.b.test` by a wildcard); a name nobody claims, and no name, are
/// closed without a certificate (there is no default) and counted.
#[test]
fn openssl_clients_reach_two_services_on_one_port_by_name() {
    let ports = free_ports(2);
    let _a = tls_server(ports[0], "a.test");
    let _b = tls_server(ports[1], "b.test");
    let lb = shared(
        &[
            Svc("a", "a.test", false, loopback(ports[0])),
            Svc("b", "b.test,*.b.test", false, loopback(ports[1])),
        ],
        Duration::from_secs(5),
    );
    assert_eq!(subject_via(lb.addr, Some("a.test")).unwrap(), "CN=a.test");
    assert_eq!(subject_via(lb.addr, Some("b.test")).unwrap(), "CN=b.test");
    assert_eq!(subject_via(lb.addr, Some("X.B.Test")).unwrap(), "CN=b.test");
    assert!(subject_via(lb.addr, Some("c.test")).is_err());
    assert!(subject_via(lb.addr, None).is_err());
    let s = lb.stats.snapshot();
    assert_eq!(
        (s.sni_matched, s.sni_no_sni, s.sni_refused),
        (3, 1, 2),
        "{s:?}"
    );
    lb.stop();
}

/// A backend that keeps every byte it receives, until the client closes,
/// then answers `seen`.
fn recorder() -> (TestBackend, Arc<Mutex<Vec<Vec<u8>>>>) {
    recorder_saying(b"seen")
}

/// [`recorder`], answering `reply`.
fn recorder_saying(reply: &'static [u8]) -> (TestBackend, Arc<Mutex<Vec<Vec<u8>>>>) {
    let seen: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let keep = Arc::clone(&seen);
    let backend = TestBackend::start(Arc::new(move |mut s: TcpStream| {
        s.set_read_timeout(Some(IO_TIMEOUT))?;
        let mut got = Vec::new();
        s.read_to_end(&mut got)?;
        keep.lock().unwrap().push(got);
        s.write_all(reply)
    }));
    (backend, seen)
}

/// Sends `bytes`, closes its side, and returns what came back (nothing
/// when the balancer closed the connection; a write may then fail).
fn send(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = connect(addr).unwrap();
    let _ = s.write_all(bytes);
    let _ = s.shutdown(Direction::Write);
    let mut back = Vec::new();
    let _ = s.read_to_end(&mut back);
    back
}

/// Passthrough: the chosen backend receives the ClientHello and what
/// follows it byte for byte; a client with no name, one with a name no
/// service claims and one that is not TLS go to the default service,
/// their bytes untouched too; each is counted by how its hello went.
#[test]
fn backends_receive_the_original_bytes_and_the_default_takes_the_rest() {
    let (named, named_seen) = recorder();
    let (fallback, fallback_seen) = recorder();
    let lb = shared(
        &[
            Svc("named", "a.test", false, named.addr()),
            Svc("fallback", "z.test", true, fallback.addr()),
        ],
        Duration::from_secs(5),
    );
    let mut hello = client_hello::build(Some("a.test"), 700);
    hello.extend_from_slice(b"application bytes");
    assert_eq!(send(lb.addr, &hello), b"seen");
    until("the named backend saw it", || {
        named_seen.lock().unwrap().len() == 1
    });
    assert_eq!(named_seen.lock().unwrap()[0], hello);
    let others = [
        client_hello::build(None, 0),
        client_hello::build(Some("nobody.test"), 0),
        b"GET / HTTP/1.0\r\n\r\n".to_vec(),
    ];
    for bytes in &others {
        assert_eq!(send(lb.addr, bytes), b"seen");
    }
    until("the default saw them", || {
        fallback_seen.lock().unwrap().len() == 3
    });
    assert_eq!(*fallback_seen.lock().unwrap(), others);
    let s = lb.stats.snapshot();
    assert_eq!(
        (
            s.sni_matched,
            s.sni_no_sni,
            s.sni_default,
            s.sni_not_tls,
            s.sni_refused
        ),
        (1, 1, 1, 1, 0),
        "{s:?}"
    );
    lb.stop();
}

/// Each service of a shared address shows it as its own in `/services`,
/// and counts the clients its hello chose as accepted (the address's
/// first service counts those nobody took).
#[test]
fn each_service_of_a_shared_address_shows_it_and_counts_its_clients() {
    let (named, named_seen) = recorder();
    let (fallback, fallback_seen) = recorder();
    let lb = shared_with(
        &[
            Svc("named", "a.test", false, named.addr()),
            Svc("fallback", "z.test", true, fallback.addr()),
        ],
        Duration::from_secs(5),
        |c| c.admin_listen = Some("127.0.0.1:0".parse().unwrap()),
    );
    assert_eq!(
        send(lb.addr, &client_hello::build(Some("a.test"), 0)),
        b"seen"
    );
    for _ in 0..2 {
        assert_eq!(send(lb.addr, b"GET / HTTP/1.0\r\n\r\n"), b"seen");
    }
    until("both backends saw theirs", || {
        named_seen.lock().unwrap().len() == 1 && fallback_seen.lock().unwrap().len() == 2
    });
    let (status, body) = child::call(lb.admin.unwrap(), "GET", "/services", "");
    assert_eq!(status, 200, "{body}");
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    let shown: Vec<(String, serde_json::Value, u64)> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let name = s["name"].as_str().unwrap().to_string();
            (name, s["listen"].clone(), s["accepted"].as_u64().unwrap())
        })
        .collect();
    let addr = serde_json::json!([lb.addr.to_string()]);
    assert_eq!(
        shown,
        [
            ("named".to_string(), addr.clone(), 1),
            ("fallback".to_string(), addr, 2)
        ]
    );
    assert_eq!(lb.stats.snapshot().accepted, 3, "each client once");
    lb.stop();
}

/// The config file of two services sharing `port` (a.test and b.test),
/// and a third on it when `third` is set.
fn sharing_file(port: u16, a: SocketAddr, b: SocketAddr, b_names: &str, third: bool) -> String {
    let svc = |name: &str, names: &str, backend: SocketAddr| {
        format!(
            r#"{{"name": "{name}", "listen": "127.0.0.1:{port}", "backends": ["{backend}"],
              "server_names": "{names}", "health_check": "off"}}"#
        )
    };
    let mut list = vec![svc("a", "a.test", a), svc("b", b_names, b)];
    if third {
        list.push(svc("c", "c.test", b));
    }
    format!(r#"{{"services": [{}]}}"#, list.join(","))
}

/// A reload of an unchanged file keeps routing; a changed `server_names`
/// is reported as needing a restart and the running names stay; a third
/// service on the shared address fails the reload, which keeps
/// everything as it was.
#[test]
fn a_reload_keeps_the_routing_and_refuses_a_new_sharer() {
    let (a, _) = recorder_saying(b"from a");
    let (b, _) = recorder_saying(b"from b");
    let port = free_port();
    let dir = Scratch::new("sni-reload");
    let path = dir.path("rodizio.json");
    std::fs::write(
        &path,
        sharing_file(port, a.addr(), b.addr(), "b.test", false),
    )
    .unwrap();
    let config = file::load(&path)
        .unwrap()
        .settle(&Overrides::default())
        .unwrap();
    let balancer = Balancer::bind(config).expect("bind");
    let reloader = Reloader::new(&path, Overrides::default(), &balancer);
    let shutdown = Shutdown::new();
    let thread = {
        let shutdown = shutdown.clone();
        std::thread::spawn(move || balancer.run(&shutdown).unwrap())
    };
    let addr = loopback(port);
    let asks = |name: &str| {
        let Ok(mut s) = connect(addr) else {
            return Vec::new();
        };
        let _ = s.write_all(&client_hello::build(Some(name), 0));
        let _ = s.shutdown(Direction::Write);
        let mut back = Vec::new();
        let _ = s.read_to_end(&mut back);
        back
    };
    until("a routed", || asks("a.test") == b"from a");
    assert_eq!(asks("b.test"), b"from b");
    reloader.reload().expect("an unchanged file");
    assert_eq!(asks("b.test"), b"from b");

    std::fs::write(
        &path,
        sharing_file(port, a.addr(), b.addr(), "x.test", false),
    )
    .unwrap();
    let report = reloader.reload().expect("new names");
    assert_eq!(report.needs_restart, ["b: server_names"]);
    assert_eq!(asks("b.test"), b"from b");

    std::fs::write(
        &path,
        sharing_file(port, a.addr(), b.addr(), "b.test", true),
    )
    .unwrap();
    let err = reloader.reload().expect_err("a third service").to_string();
    assert!(err.contains("routed by SNI on 127.0.0.1:"), "{err}");
    assert!(err.contains("takes a restart"), "{err}");
    assert_eq!(asks("a.test"), b"from a");
    assert!(asks("c.test").is_empty());
    shutdown.trigger();
    thread.join().unwrap();
}

/// The access log names the server each client asked for: on the line of
/// a served client, and on the line of one no service took
/// (`no_service_for_sni`); a client with no name has no `sni` field.
#[test]
fn the_access_log_names_the_server_asked_for() {
    let (named, _) = recorder();
    let dir = Scratch::new("sni-access-log");
    let log = dir.path("access.log");
    let lb = shared_with(
        &[Svc("named", "a.test", false, named.addr())],
        Duration::from_secs(5),
        |c| {
            c.access_log = Some(rodizio::access_log::Format::Json);
            c.access_log_file = Some(log.clone());
        },
    );
    assert_eq!(
        send(lb.addr, &client_hello::build(Some("a.test"), 0)),
        b"seen"
    );
    assert!(send(lb.addr, &client_hello::build(Some("b.test"), 0)).is_empty());
    assert!(send(lb.addr, &client_hello::build(None, 0)).is_empty());
    let lines = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect::<Vec<_>>()
    };
    until("three lines", || lines().len() == 3);
    let all = lines();
    let line = |sni: &str| all.iter().find(|l| l.contains(sni)).cloned();
    let served = line(r#""sni":"a.test""#).expect("the served line");
    assert!(served.contains(r#""end":"client_closed""#), "{served}");
    let refused = line(r#""sni":"b.test""#).expect("the refused line");
    assert!(
        refused.contains(r#""end":"no_service_for_sni""#),
        "{refused}"
    );
    assert_eq!(all.iter().filter(|l| l.contains(r#""sni""#)).count(), 2);
    lb.stop();
}

/// The chosen service's own gates run once the name is read: service a
/// denies loopback and its clients are closed and counted as denied
/// there, while service b, on the same port, serves them.
#[test]
fn the_chosen_service_s_allow_and_deny_lists_apply() {
    let (a, a_seen) = recorder();
    let (b, _) = recorder();
    let listen = loopback(free_port());
    let service = |name: &str, names: &str, backend: SocketAddr| {
        let mut c = common::config(&[backend]);
        c.name = name.into();
        c.listen = listen;
        c.health.interval = Duration::from_secs(3600);
        c.sni.server_names = Some(names.parse().unwrap());
        c
    };
    let mut denying = service("a", "a.test", a.addr());
    denying.proxy.deny = Some("127.0.0.0/8".parse().unwrap());
    let config = Config {
        services: vec![denying, service("b", "b.test", b.addr())],
        ..Config::default()
    };
    let lb = TestBalancer::start(config);
    assert!(send(lb.addr, &client_hello::build(Some("a.test"), 0)).is_empty());
    assert_eq!(
        send(lb.addr, &client_hello::build(Some("b.test"), 0)),
        b"seen"
    );
    until("denied", || lb.stats.snapshot().denied == 1);
    assert!(a_seen.lock().unwrap().is_empty());
    assert_eq!(a.accepted(), 0);
    lb.stop();
}

/// The binary, from a config file, with two services on one port for the
/// same name a.test, `h2` with `"server_alpn": "h2"` and `plain` without:
/// a client offering h2 (and http/1.1 after it) reaches h2's backend, one
/// offering http/1.1 alone or no ALPN reaches plain's, each receiving the
/// ClientHello byte for byte, ALPN extension included. Then real clients:
/// `openssl s_client -alpn h2` and `-alpn http/1.1` against two
/// `s_server`s are shown the certificate of the one their protocol chose.
#[test]
fn one_name_two_services_chosen_by_the_alpn_offered() {
    let (h2, h2_seen) = recorder_saying(b"from h2");
    let (plain, plain_seen) = recorder_saying(b"from plain");
    let dir = Scratch::new("sni-alpn");
    let path = dir.path("rodizio.json");
    let port = free_port();
    let svc = |name: &str, backend: SocketAddr, alpn: &str| {
        format!(
            r#"{{"name": "{name}", "listen": "127.0.0.1:{port}", "backends": ["{backend}"],
              "server_names": "a.test", "health_check": "off"{alpn}}}"#
        )
    };
    let text = format!(
        r#"{{"services": [{}, {}]}}"#,
        svc("plain", plain.addr(), ""),
        svc("h2", h2.addr(), r#", "server_alpn": "h2""#)
    );
    std::fs::write(&path, text).unwrap();
    let mut rodizio = child::Child::start(child::command(&["--allow-root", "-c"]).arg(&path));
    let addr = rodizio.addr;
    let offering = |protocols: &[&str]| {
        let body = client_hello::alpn_body(protocols);
        client_hello::build_with_alpn(Some("a.test"), Some(&body), 100)
    };
    let to_h2 = offering(&["h2", "http/1.1"]);
    let to_plain = [
        offering(&["http/1.1"]),
        client_hello::build(Some("a.test"), 0),
    ];
    assert_eq!(send(addr, &to_h2), b"from h2", "{}", rodizio.log());
    for hello in &to_plain {
        assert_eq!(send(addr, hello), b"from plain", "{}", rodizio.log());
    }
    until("both backends saw theirs", || {
        h2_seen.lock().unwrap().len() == 1 && plain_seen.lock().unwrap().len() == 2
    });
    // Passthrough: the exact hello, its ALPN extension (type 16, then the
    // body offering h2 and http/1.1) in it.
    let got = h2_seen.lock().unwrap()[0].clone();
    assert_eq!(got, to_h2);
    let ext: Vec<u8> = [0, 16, 0, 14]
        .into_iter()
        .chain(client_hello::alpn_body(&["h2", "http/1.1"]))
        .collect();
    assert!(got.windows(ext.len()).any(|w| w == ext), "{got:?}");
    assert_eq!(*plain_seen.lock().unwrap(), to_plain);
    assert!(rodizio.alive());
    drop(rodizio);

    // Real TLS clients, through two s_servers with their own certificates.
    let ports = free_ports(2);
    let _h2_server = tls_server(ports[0], "h2.a.test");
    let _plain_server = tls_server(ports[1], "plain.a.test");
    let port = free_port();
    let svc = |name: &str, backend: u16, alpn: &str| {
        format!(
            r#"{{"name": "{name}", "listen": "127.0.0.1:{port}", "backends": ["127.0.0.1:{backend}"],
              "server_names": "a.test", "health_check": "off"{alpn}}}"#
        )
    };
    let text = format!(
        r#"{{"services": [{}, {}]}}"#,
        svc("h2", ports[0], r#", "server_alpn": ["h2"]"#),
        svc("plain", ports[1], "")
    );
    std::fs::write(&path, text).unwrap();
    let rodizio = child::Child::start(child::command(&["--allow-root", "-c"]).arg(&path));
    let subject = |alpn: &str| subject_with_alpn(rodizio.addr, "a.test", alpn);
    assert_eq!(subject("h2").unwrap(), "CN=h2.a.test", "{}", rodizio.log());
    assert_eq!(subject("http/1.1").unwrap(), "CN=plain.a.test");
    assert_eq!(subject("http/1.1,h2").unwrap(), "CN=h2.a.test");
}

/// The subject `openssl s_client -servername name -alpn alpn` was shown
/// through `addr`.
fn subject_with_alpn(addr: SocketAddr, name: &str, alpn: &str) -> Result<String, String> {
    subject_via_args(addr, &["-servername", name, "-alpn", alpn])
}
