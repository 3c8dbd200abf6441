//! TLS termination with real clients: curl, openssl s_client (TLS 1.2 and
//! 1.3, SNI), ab over TLS, a rustls client for half-close; certificates
//! swapped by SIGHUP while a connection stays open; a bad certificate at
//! start-up; re-encryption to `openssl s_server`, and `redis-cli --tls`
//! to a TLS-only redis-server; the `tls` health check verifying backends
//! with the re-encryption's settings, also after a reload; the stats
//! page's certificates.

mod child;
mod common;
mod peers;
mod tls_certs;

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use child::Child;
use child::BIN;
use common::{wait_for, Demo, TestBackend, TestBalancer};
use rodizio::tls_term::CertList;
use tls_certs::{connect, served, subject_of, Certs, Pair};

/// A balancer in front of `backends` terminating TLS with `pairs`.
fn balancer(backends: &[std::net::SocketAddr], pairs: &[&Pair]) -> TestBalancer {
    TestBalancer::with(backends, |c| {
        c.tls.certs = CertList(pairs.iter().map(|p| p.setting()).collect());
    })
}

/// `curl --cacert` over terminated TLS reaches both plain demo backends in
/// turn, and every handshake is counted.
#[test]
fn curl_reaches_plain_backends_over_terminated_tls() {
    let certs = Certs::new();
    let pair = certs.issue("a", &["localhost"], 1);
    let demos = [
        Demo::start("127.0.0.1:0", "one"),
        Demo::start("127.0.0.1:0", "two"),
    ];
    let b = balancer(&[demos[0].addr, demos[1].addr], &[&pair]);
    let mut seen = Vec::new();
    for _ in 0..4 {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "20", "--cacert"])
            .arg(certs.ca())
            .arg(format!("https://localhost:{}/", b.addr.port()))
            .stdin(Stdio::null())
            .output()
            .expect("run curl");
        let body = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{body} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        seen.push(body);
    }
    assert!(seen.iter().any(|s| s.contains("one")), "{seen:?}");
    assert!(seen.iter().any(|s| s.contains("two")), "{seen:?}");
    assert!(wait_for(Duration::from_secs(10), || b
        .stats
        .snapshot()
        .tls_handshakes
        == 4));
}

/// openssl s_client negotiates TLS 1.2 and TLS 1.3, and the server name
/// picks the certificate (an unknown one gets the first, the default).
#[test]
fn s_client_gets_both_versions_and_the_certificate_of_its_name() {
    let certs = Certs::new();
    let a = certs.issue("a", &["a.test"], 1);
    let b_pair = certs.issue("b", &["b.test", "*.b.test"], 2);
    let backend = TestBackend::echo();
    let b = balancer(&[backend.addr()], &[&a, &b_pair]);
    let port = b.addr.port();
    for (name, version, subject, protocol) in [
        ("a.test", "-tls1_2", "a.test", "TLSv1.2"),
        ("b.test", "-tls1_3", "b.test", "TLSv1.3"),
        ("x.b.test", "-tls1_3", "b.test", "TLSv1.3"),
        ("other.test", "-tls1_2", "a.test", "TLSv1.2"),
    ] {
        let (got, proto, verify) = served(port, name, &certs.ca(), version);
        assert!(
            got.contains(&format!("CN = {subject}")) || got.contains(&format!("CN={subject}")),
            "{name}: {got}"
        );
        assert_eq!(proto, protocol, "{name}");
        assert!(verify.contains("0 (ok)"), "{name}: {verify}");
    }
}

/// ab over TLS 1.2: 200 requests, 10 at once, none failed.
#[test]
fn ab_over_tls() {
    let certs = Certs::new();
    let pair = certs.issue("a", &["localhost"], 1);
    let demo = Demo::start("127.0.0.1:0", "one");
    let b = balancer(&[demo.addr], &[&pair]);
    let out = Command::new("timeout")
        .args([
            "60", "ab", "-f", "TLS1.2", "-n", "200", "-c", "10", "-s", "20",
        ])
        .arg(format!("https://127.0.0.1:{}/", b.addr.port()))
        .stdin(Stdio::null())
        .output()
        .expect("run ab");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("Complete requests:      200"), "{text}");
    assert!(text.contains("Failed requests:        0"), "{text}");
}

/// Half-close through TLS: the client's close_notify reaches the backend
/// as its end of stream; the backend's reply after it comes back, then
/// its own end as a close_notify.
#[test]
fn close_notify_both_ways() {
    let certs = Certs::new();
    let pair = certs.issue("a", &["localhost"], 1);
    let backend = TestBackend::reply_after_eof();
    let b = balancer(&[backend.addr()], &[&pair]);
    let mut client = connect(b.addr, "localhost", &certs.ca()).unwrap();
    client.write_all(b"the whole request").unwrap();
    client.conn.send_close_notify();
    client.flush().unwrap();
    let mut reply = Vec::new();
    client.read_to_end(&mut reply).unwrap();
    assert_eq!(reply, common::after_eof_reply(b"the whole request"));
}

/// A backend that sends 200 KB and then resets (SO_LINGER 0) before its
/// end of stream, behind terminated TLS: twenty clients at once read to
/// the end and at least 19 learn of the reset (ECONNRESET), not a
/// `close_notify` nor a bare end of stream, after every byte the balancer
/// counts as sent to them.
#[test]
fn a_backend_reset_reaches_a_tls_client_as_a_reset() {
    const CLIENTS: usize = 20;
    let certs = Certs::new();
    let pair = certs.issue("a", &["localhost"], 1);
    let backend = TestBackend::start(std::sync::Arc::new(|mut stream: std::net::TcpStream| {
        let mut ask = [0u8; 3];
        stream.read_exact(&mut ask)?;
        stream.write_all(&vec![b'd'; 200 * 1000])?;
        socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO))?;
        Ok(())
    }));
    let b = balancer(&[backend.addr()], &[&pair]);
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (addr, ca) = (b.addr, certs.ca());
            std::thread::spawn(move || {
                let mut client = connect(addr, "localhost", &ca).unwrap();
                client.write_all(b"go\n").unwrap();
                client.flush().unwrap();
                let mut buf = vec![0u8; 64 * 1024];
                let mut got = 0u64;
                loop {
                    match client.read(&mut buf) {
                        Ok(0) => return (got, "end of stream".to_string()),
                        Ok(n) => got += n as u64,
                        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                            return (got, "reset".to_string())
                        }
                        Err(e) => return (got, e.to_string()),
                    }
                }
            })
        })
        .collect();
    let ends: Vec<(u64, String)> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    let resets = ends.iter().filter(|(_, end)| end == "reset").count();
    assert!(resets >= CLIENTS - 1, "{resets} of {CLIENTS}: {ends:?}");
    assert!(
        b.wait_ended(CLIENTS as u64, Duration::from_secs(10)),
        "{:?}",
        b.stats.snapshot()
    );
    let snap = b.stats.snapshot();
    assert_eq!(snap.ended_backend_reset, CLIENTS as u64, "{snap:?}");
    let got: u64 = ends.iter().map(|(n, _)| n).sum();
    assert_eq!(snap.bytes_to_clients, got);
}

/// A certificate renewed in place and SIGHUP: the next client gets the new
/// one, while a connection opened before goes on with its bytes.
#[test]
fn sighup_serves_the_new_certificate_and_keeps_open_connections() {
    let certs = Certs::new();
    let old = certs.issue("site", &["one.localhost", "localhost"], 1);
    let backend = TestBackend::echo();
    let config = certs.dir.join("rodizio.json");
    std::fs::write(
        &config,
        format!(
            r#"{{"listen": "127.0.0.1:0", "backends": ["{}"], "tls_certs": [{}]}}"#,
            backend.addr(),
            old.json()
        ),
    )
    .unwrap();
    let r = Child::balancer(&["-c", config.to_str().unwrap()]);
    let mut open = connect(r.addr, "localhost", &certs.ca()).unwrap();
    assert!(subject_of(&open).contains("one.localhost"));
    let mut buf = [0u8; 5];
    open.write_all(b"first").unwrap();
    open.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"first");
    // certbot's way: new files at the same paths.
    certs.issue("site", &["two.localhost", "localhost"], 2);
    r.signal(libc::SIGHUP);
    assert!(
        wait_for(Duration::from_secs(20), || {
            connect(r.addr, "localhost", &certs.ca())
                .map(|c| subject_of(&c).contains("two.localhost"))
                .unwrap_or(false)
        }),
        "the new certificate was not served: {}",
        r.log()
    );
    open.write_all(b"again").unwrap();
    open.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"again");
}

/// Started with flags alone (no `-c`): a certificate renewed in place and
/// SIGHUP, and the next client gets the new one; a certificate that
/// expires within two weeks is warned of at start and at the reload.
#[test]
fn sighup_without_a_config_file_reads_the_certificates_again() {
    let certs = Certs::new();
    let old = certs.issue_for_days("site", &["one.localhost", "localhost"], 1, 5);
    let backend = TestBackend::echo();
    let backend_addr = backend.addr().to_string();
    let r = Child::balancer(&["-b", &backend_addr, "--tls-cert", &old.flag()]);
    assert!(
        subject_of(&connect(r.addr, "localhost", &certs.ca()).unwrap()).contains("one.localhost")
    );
    certs.issue("site", &["two.localhost", "localhost"], 2);
    r.signal(libc::SIGHUP);
    assert!(
        wait_for(Duration::from_secs(20), || {
            connect(r.addr, "localhost", &certs.ca())
                .map(|c| subject_of(&c).contains("two.localhost"))
                .unwrap_or(false)
        }),
        "the new certificate was not served: {}",
        r.log()
    );
    let log = r.log();
    assert!(
        log.contains("site.pem (one.localhost) expires in "),
        "{log}"
    );
}

/// A certificate that cannot be used stops the start in one line, exit 2.
#[test]
fn a_bad_certificate_at_start_up_exits_2_in_one_line() {
    let certs = Certs::new();
    let a = certs.issue("a", &["localhost"], 1);
    let b = certs.issue("b", &["localhost"], 2);
    let missing = certs.dir.join("missing.pem");
    let cases = [
        (
            format!("{},{}", missing.display(), a.key.display()),
            "cannot read",
        ),
        (
            format!("{},{}", a.key.display(), a.key.display()),
            "holds no PEM certificate",
        ),
        (
            format!("{},{}", a.cert.display(), a.cert.display()),
            "holds no PEM private key",
        ),
        (
            format!("{},{}", a.cert.display(), b.key.display()),
            "do not make a pair",
        ),
    ];
    for (flag, want) in cases {
        let out = child::output(
            Command::new(BIN)
                .args([
                    "--allow-root",
                    "-l",
                    "127.0.0.1:0",
                    "-b",
                    "127.0.0.1:9",
                    "--tls-cert",
                    &flag,
                ])
                .stdin(Stdio::null()),
        );
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(2), "{flag}: {err}");
        assert!(err.contains(want), "{flag}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}

/// `openssl s_server -www` on a free port with `pair`, listening.
fn s_server(certs: &Certs, pair: &Pair) -> (peers::Peer, std::net::SocketAddr) {
    let port = peers::free_port();
    let mut cmd = Command::new(peers::need("openssl", "openssl"));
    cmd.args(["s_server", "-www", "-accept"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("-cert")
        .arg(&pair.cert)
        .arg("-key")
        .arg(&pair.key);
    let mut peer = peers::Peer::spawn("s_server", cmd, libc::SIGTERM, &certs.dir);
    let addr = peers::loopback(port);
    peer.wait_listening(addr);
    (peer, addr)
}

/// Re-encryption: curl over terminated TLS, then TLS again to `openssl
/// s_server -www`, whose certificate is verified for the configured name;
/// a backend whose certificate is not for the name it is reached by is
/// refused, and the client closed.
#[test]
fn re_encryption_to_openssl_s_server() {
    let certs = Certs::new();
    let front = certs.issue("front", &["localhost"], 1);
    let back = certs.issue("back", &["backend.test"], 2);
    let (_server, addr) = s_server(&certs, &back);
    let b = TestBalancer::with(&[addr], |c| {
        c.tls.certs = CertList(vec![front.setting()]);
        c.tls.backend = true;
        c.tls.backend_ca = Some(certs.ca());
        c.tls.backend_server_name = Some("backend.test".into());
    });
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "20", "--cacert"])
        .arg(certs.ca())
        .arg(format!("https://localhost:{}/", b.addr.port()))
        .stdin(Stdio::null())
        .output()
        .expect("run curl");
    let body = String::from_utf8_lossy(&out.stdout).to_string();
    // s_server -www describes the session it had: with rodizio, over TLS.
    assert!(
        body.contains("Ciphers supported in s_server binary"),
        "{body}"
    );
    assert!(body.contains("Protocol  : TLSv1.3"), "{body}");
    // The same backend reached by its address: the name does not match.
    let wrong = TestBalancer::with(&[addr], |c| {
        c.tls.backend = true;
        c.tls.backend_ca = Some(certs.ca());
    });
    let mut s = common::connect(wrong.addr).unwrap();
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    assert!(wait_for(Duration::from_secs(10), || wrong
        .stats
        .snapshot()
        .no_backend
        + wrong.stats.snapshot().connect_failures
        >= 1));
}

/// What is seen of TLS: the access log line says the version and the
/// server name, the handshakes and failures are counted in /metrics, and
/// each certificate's seconds until notAfter (30 days here) are there.
#[test]
fn access_log_and_metrics_tell_the_tls() {
    let certs = Certs::new();
    let pair = certs.issue("a", &["a.test"], 1);
    let backend = TestBackend::echo();
    let log = certs.dir.join("access.log");
    let b = TestBalancer::with(&[backend.addr()], |c| {
        c.tls.certs = CertList(vec![pair.setting()]);
        c.admin_listen = Some("127.0.0.1:0".parse().unwrap());
        c.access_log = Some(rodizio::access_log::Format::Json);
        c.access_log_file = Some(log.clone());
    });
    let mut c = connect(b.addr, "a.test", &certs.ca()).unwrap();
    c.write_all(b"hi").unwrap();
    let mut buf = [0u8; 2];
    c.read_exact(&mut buf).unwrap();
    c.conn.send_close_notify();
    c.flush().unwrap();
    let _ = c.read_to_end(&mut Vec::new());
    let mut garbage = common::connect(b.addr).unwrap();
    garbage.write_all(b"SSH-2.0-x\r\n").unwrap();
    let _ = garbage.read_to_end(&mut Vec::new());
    assert!(
        wait_for(Duration::from_secs(10), || std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains(r#""sni":"a.test","backend""#)
            && std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains(r#""tls":"TLSv1.3""#)),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let metrics = common::http_get(b.admin.unwrap(), "/metrics").unwrap().body;
    assert!(
        metrics.contains("rodizio_tls_handshakes_total{service=\"default\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("rodizio_tls_handshake_failures_not_tls_total{service=\"default\"} 1"),
        "{metrics}"
    );
    let expiry: i64 = metrics
        .lines()
        .find(|l| l.starts_with("rodizio_tls_certificate_expiry_seconds{"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{metrics}"));
    let days = expiry / 86_400;
    assert!((29..=30).contains(&days), "{expiry}");
}

/// Mutual TLS: with tls_client_ca, curl with a certificate the CA signed
/// is served; curl without one is refused, counted as such.
#[test]
fn client_certificates_with_tls_client_ca() {
    let certs = Certs::new();
    let pair = certs.issue("a", &["localhost"], 1);
    let client = certs.issue("client", &["client.test"], 2);
    let demo = Demo::start("127.0.0.1:0", "one");
    let b = TestBalancer::with(&[demo.addr], |c| {
        c.tls.certs = CertList(vec![pair.setting()]);
        c.tls.client_ca = Some(certs.ca());
    });
    let curl = |with_cert: bool| {
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "--max-time", "20", "--cacert"])
            .arg(certs.ca());
        if with_cert {
            cmd.arg("--cert")
                .arg(&client.cert)
                .arg("--key")
                .arg(&client.key);
        }
        cmd.arg(format!("https://localhost:{}/", b.addr.port()))
            .stdin(Stdio::null())
            .output()
            .expect("run curl")
    };
    let ok = curl(true);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("one"));
    let refused = curl(false);
    assert!(!refused.status.success());
    assert!(
        wait_for(Duration::from_secs(10), || {
            b.stats.snapshot().tls_handshake_failures_client_certificate == 1
        }),
        "{:?}",
        b.stats.snapshot()
    );
}

/// The TLS settings are per service: in a `services` file, check-config
/// shows each service's own (one terminating, one plain with the defaults).
#[test]
fn tls_settings_per_service() {
    let certs = Certs::new();
    let pair = certs.issue("a", &["localhost"], 1);
    let backend = TestBackend::echo();
    let file = certs.dir.join("services.json");
    std::fs::write(
        &file,
        format!(
            r#"{{"services": [
              {{"name": "web", "listen": "127.0.0.1:0", "backends": ["{b}"],
                "tls_certs": [{pair}], "tls_handshake_timeout": "3s"}},
              {{"name": "plain", "listen": "127.0.0.1:0", "backends": ["{b}"]}}
            ]}}"#,
            b = backend.addr(),
            pair = pair.json()
        ),
    )
    .unwrap();
    let out = child::output(
        Command::new(BIN)
            .arg("check-config")
            .arg(&file)
            .stdin(Stdio::null()),
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let web = text.split("[service plain]").next().unwrap();
    let plain = text.split("[service plain]").nth(1).unwrap();
    assert!(
        web.contains(&format!("tls_certs = [{}]", pair.json())),
        "{text}"
    );
    assert!(web.contains("tls_handshake_timeout = 3s"), "{text}");
    assert!(plain.contains("tls_certs = off"), "{text}");
    assert!(plain.contains("tls_handshake_timeout = 10s"), "{text}");
}

/// A balancer re-encrypting to `addr` (CAs `ca`, name `name`), its `tls`
/// check every 200 ms, one result enough to flip the backend.
fn tls_checked(addr: std::net::SocketAddr, ca: &std::path::Path, name: &str) -> TestBalancer {
    TestBalancer::with(&[addr], |c| {
        c.tls.backend = true;
        c.tls.backend_ca = Some(ca.to_path_buf());
        c.tls.backend_server_name = Some(name.into());
        c.health.check = rodizio::health::CheckKind::Tls;
        c.health.interval = Duration::from_millis(200);
        c.health.timeout = Duration::from_secs(3);
        c.health.fall = 1;
        c.health.rise = 1;
    })
}

/// Waits until the last check of the backend `addr` of `b` has `ok`
/// (`None`: passed; `Some(reason)`); that last result.
fn last_check_until(
    b: &TestBalancer,
    addr: std::net::SocketAddr,
    ok: impl Fn(&Option<String>) -> bool,
) -> Option<String> {
    let backend = b.backend(addr);
    let mut last = None;
    let held = wait_for(Duration::from_secs(20), || {
        last = backend.last_check().map(|r| r.error);
        last.as_ref().is_some_and(&ok)
    });
    assert!(held, "last check: {last:?}");
    last.flatten()
}

/// The `tls` check against `addr`, verified with `ca` for `name`: its last
/// check gives a reason containing `wanted`, and the backend goes down.
fn refused_by_the_check(
    addr: std::net::SocketAddr,
    ca: &std::path::Path,
    name: &str,
    wanted: &str,
) {
    let lb = tls_checked(addr, ca, name);
    let reason = last_check_until(&lb, addr, Option::is_some).unwrap();
    assert!(reason.contains(wanted), "{reason}");
    assert!(wait_for(Duration::from_secs(10), || !lb
        .backend(addr)
        .is_healthy()));
}

/// With `backend_tls`, the `tls` check is a whole handshake verified as the
/// re-encryption verifies it: `openssl s_server` with a certificate of the
/// CA for the name is up; one of another CA, or for another name, is down
/// with the reason in its last check; without `backend_tls` the same
/// foreign server passes the lighter check (a ServerHello is enough).
#[test]
fn the_tls_check_verifies_the_backend_as_re_encryption_does() {
    let certs = Certs::new();
    let other = Certs::new();
    let good = certs.issue("back", &["backend.test"], 2);
    let foreign = other.issue("back", &["backend.test"], 3);
    let (_good_server, good_addr) = s_server(&certs, &good);
    let (_foreign_server, foreign_addr) = s_server(&other, &foreign);

    let up = tls_checked(good_addr, &certs.ca(), "backend.test");
    last_check_until(&up, good_addr, Option::is_none);
    assert!(up.backend(good_addr).is_healthy());

    // Both test CAs have one name: the other's signature is found bad.
    let wanted = "certificate verification failed: bad signature";
    refused_by_the_check(foreign_addr, &certs.ca(), "backend.test", wanted);
    let wanted = "not valid for the name other.test";
    refused_by_the_check(good_addr, &certs.ca(), "other.test", wanted);

    let light = TestBalancer::with(&[foreign_addr], |c| {
        c.health.check = rodizio::health::CheckKind::Tls;
        c.health.interval = Duration::from_millis(200);
    });
    last_check_until(&light, foreign_addr, Option::is_none);
}

/// A reload that changes `backend_tls_ca` changes what the `tls` check
/// trusts: the backend, down while the CA was another, comes back up.
#[test]
fn a_reload_of_backend_tls_ca_applies_to_the_checks() {
    let certs = Certs::new();
    let other = Certs::new();
    let back = certs.issue("back", &["backend.test"], 2);
    let (_server, addr) = s_server(&certs, &back);
    let config = certs.dir.join("rodizio.json");
    let write = |ca: &std::path::Path| {
        std::fs::write(
            &config,
            format!(
                r#"{{"listen": "127.0.0.1:0", "backends": ["{addr}"],
                    "backend_tls": true, "backend_tls_ca": "{}",
                    "backend_tls_server_name": "backend.test",
                    "health_check": "tls", "health_interval": "200ms",
                    "fall": 1, "rise": 1}}"#,
                ca.display()
            ),
        )
        .unwrap()
    };
    write(&other.ca());
    let r = Child::balancer(&["-c", config.to_str().unwrap()]);
    assert!(
        wait_for(Duration::from_secs(20), || r.log().contains(
            "is now DOWN (1 failed check, last: tls: certificate verification failed"
        )),
        "{}",
        r.log()
    );
    write(&certs.ca());
    r.signal(libc::SIGHUP);
    assert!(
        wait_for(Duration::from_secs(20), || r.log().contains("is now UP")),
        "{}",
        r.log()
    );
}

/// The stats page lists the served certificates: each one's name and the
/// days left until its notAfter (29 or 30 for a fresh 30-day one), and one
/// with 5 days left is marked; the page has no script.
#[test]
fn the_stats_page_shows_each_certificate_and_its_days_left() {
    let certs = Certs::new();
    let fresh = certs.issue("fresh", &["fresh.test"], 1);
    let near = certs.issue_for_days("near", &["near.test", "*.near.test"], 2, 5);
    let backend = TestBackend::echo();
    let b = TestBalancer::with(&[backend.addr()], |c| {
        c.tls.certs = CertList(vec![fresh.setting(), near.setting()]);
        c.admin_listen = Some("127.0.0.1:0".parse().unwrap());
    });
    let page = common::http_get(b.admin.unwrap(), "/").unwrap().body;
    assert!(page.contains("<table id=\"certificates\""), "{page}");
    let row = |name: &str| {
        page.lines()
            .find(|l| l.contains(&format!(">{name}</td>")))
            .unwrap_or_else(|| panic!("no row for {name}: {page}"))
            .to_string()
    };
    let fresh_row = row("fresh.test");
    assert!(
        fresh_row.contains(">29 days</td>") || fresh_row.contains(">30 days</td>"),
        "{fresh_row}"
    );
    assert!(fresh_row.contains(&fresh.cert.display().to_string()));
    assert!(!fresh_row.contains("renew soon"), "{fresh_row}");
    let near_row = row("near.test");
    assert!(near_row.contains("class=\"cert near\""), "{near_row}");
    assert!(
        near_row.contains("4 days <strong>renew soon</strong>")
            || near_row.contains("5 days <strong>renew soon</strong>"),
        "{near_row}"
    );
    assert!(!page.contains("<script"), "{page}");
}

/// `redis-cli --tls` through termination and re-encryption to a
/// redis-server that speaks only TLS (`--port 0 --tls-port`): SET then GET
/// come back; the `tls` check, a verified handshake with the same
/// settings, keeps the backend up.
#[test]
fn redis_cli_over_tls_through_re_encryption_to_redis_server() {
    let certs = Certs::new();
    let front = certs.issue("front", &["localhost"], 1);
    let back = certs.issue("redis", &["redis.test"], 2);
    let port = peers::free_port();
    let mut cmd = Command::new(peers::need("redis-server", "redis-server"));
    cmd.args(["--port", "0", "--bind", "127.0.0.1", "--tls-port"])
        .arg(port.to_string())
        .arg("--tls-cert-file")
        .arg(&back.cert)
        .arg("--tls-key-file")
        .arg(&back.key)
        .arg("--tls-ca-cert-file")
        .arg(certs.ca())
        .args([
            "--tls-auth-clients",
            "no",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(&certs.dir);
    let mut redis = peers::Peer::spawn("redis-server", cmd, libc::SIGTERM, &certs.dir);
    let addr = peers::loopback(port);
    redis.wait_listening(addr);
    let b = TestBalancer::with(&[addr], |c| {
        c.tls.certs = CertList(vec![front.setting()]);
        c.tls.backend = true;
        c.tls.backend_ca = Some(certs.ca());
        c.tls.backend_server_name = Some("redis.test".into());
        c.health.check = rodizio::health::CheckKind::Tls;
        c.health.interval = Duration::from_millis(200);
    });
    let cli = |args: &[&str]| {
        let out = Command::new("timeout")
            .arg("20")
            .arg(peers::need("redis-cli", "redis-tools"))
            .args(["--tls", "--sni", "localhost", "--cacert"])
            .arg(certs.ca())
            .args(["-h", "127.0.0.1", "-p", &b.addr.port().to_string()])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli");
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(
            out.status.success(),
            "{text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    assert_eq!(cli(&["SET", "greeting", "olá, rodizio"]), "OK");
    assert_eq!(cli(&["GET", "greeting"]), "olá, rodizio");
    last_check_until(&b, addr, Option::is_none);
    assert!(b.backend(addr).is_healthy());
}
