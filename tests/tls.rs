//! TLS termination with real clients: curl, openssl s_client (TLS 1.2 and
//! 1.3, SNI), ab over TLS, a rustls client for half-close; certificates
//! swapped by SIGHUP while a connection stays open; a bad certificate at
//! start-up.

mod common;
mod tls_certs;

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{wait_for, Demo, TestBackend, TestBalancer};
use rodizio::tls_term::CertList;
use tls_certs::{connect, served, subject_of, Certs, Pair, Rodizio};

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
    let demos = [Demo::start("127.0.0.1:0", "one"), Demo::start("127.0.0.1:0", "two")];
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
        assert!(out.status.success(), "{body} {}", String::from_utf8_lossy(&out.stderr));
        seen.push(body);
    }
    assert!(seen.iter().any(|s| s.contains("one")), "{seen:?}");
    assert!(seen.iter().any(|s| s.contains("two")), "{seen:?}");
    assert!(wait_for(Duration::from_secs(10), || b.stats.snapshot().tls_handshakes == 4));
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
        assert!(got.contains(&format!("CN = {subject}")) || got.contains(&format!("CN={subject}")),
            "{name}: {got}");
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
        .args(["60", "ab", "-f", "TLS1.2", "-n", "200", "-c", "10", "-s", "20"])
        .arg(format!("https://127.0.0.1:{}/", b.addr.port()))
        .stdin(Stdio::null())
        .output()
        .expect("run ab");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{text} {}", String::from_utf8_lossy(&out.stderr));
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
    let r = Rodizio::start(&["-c", config.to_str().unwrap()]);
    let mut open = connect(r.addr(), "localhost", &certs.ca()).unwrap();
    assert!(subject_of(&open).contains("one.localhost"));
    let mut buf = [0u8; 5];
    open.write_all(b"first").unwrap();
    open.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"first");
    // certbot's way: new files at the same paths.
    certs.issue("site", &["two.localhost", "localhost"], 2);
    r.reload();
    assert!(
        wait_for(Duration::from_secs(20), || {
            connect(r.addr(), "localhost", &certs.ca())
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

/// A certificate that cannot be used stops the start in one line, exit 2.
#[test]
fn a_bad_certificate_at_start_up_exits_2_in_one_line() {
    let certs = Certs::new();
    let a = certs.issue("a", &["localhost"], 1);
    let b = certs.issue("b", &["localhost"], 2);
    let missing = certs.dir.join("missing.pem");
    let cases = [
        (format!("{},{}", missing.display(), a.key.display()), "cannot read"),
        (format!("{},{}", a.key.display(), a.key.display()), "holds no PEM certificate"),
        (format!("{},{}", a.cert.display(), a.cert.display()), "holds no PEM private key"),
        (format!("{},{}", a.cert.display(), b.key.display()), "do not make a pair"),
    ];
    for (flag, want) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_rodizio"))
            .args(["--allow-root", "-l", "127.0.0.1:0", "-b", "127.0.0.1:9", "--tls-cert", &flag])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(2), "{flag}: {err}");
        assert!(err.contains(want), "{flag}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}
