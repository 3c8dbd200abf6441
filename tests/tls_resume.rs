//! TLS resumption and tuning with real clients (openssl s_client, a
//! rustls client): a TLS 1.2 session resumed by its id after 300 other
//! handshakes and across a reload that changes no TLS setting, not after
//! one that changes the cache; TLS 1.2 tickets with the cache off; TLS 1.3
//! resumption across a reload; `tls_strict_sni` refusing an unknown name
//! and a missing one; `tls_alpn` negotiated; an RSA and an ECDSA
//! certificate for one name, each client served one it can use; the
//! warning for two certificates of one type on a name; the server's
//! cipher order; hostile `tls_alpn` and `tls_session_cache` values.

mod child;
mod common;
mod tls_certs;

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use child::Child;
use common::{TestBackend, TestBalancer};
use rodizio::tls_term::{AlpnList, CertList};
use tls_certs::{Certs, Pair};

/// `openssl s_client` to `port` for `name` with `args`, its input empty:
/// everything it printed, both outputs.
fn s_client(port: u16, name: Option<&str>, ca: &Path, args: &[&str]) -> String {
    let mut command = Command::new("timeout");
    command
        .args(["20", "openssl", "s_client", "-connect"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("-CAfile")
        .arg(ca);
    match name {
        Some(name) => command.args(["-servername", name]),
        None => command.arg("-noservername"),
    };
    let out = command
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run openssl s_client");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Whether s_client's output says the session was resumed.
fn reused(text: &str) -> bool {
    text.lines().any(|l| l.starts_with("Reused, "))
}

/// Whether s_client's output says a full handshake was made.
fn new_session(text: &str) -> bool {
    text.lines().any(|l| l.starts_with("New, "))
}

/// A rustls client configuration trusting `ca`, TLS 1.2 only when
/// `tls12`, with its own resumption store.
fn client(ca: &Path, tls12: bool) -> Arc<rustls::ClientConfig> {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rodizio::tls_term::crypto::provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider);
    let builder = if tls12 {
        builder.with_protocol_versions(&[&rustls::version::TLS12])
    } else {
        builder.with_protocol_versions(&[&rustls::version::TLS13])
    };
    let config = builder
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    Arc::new(config)
}

/// A handshake to `addr` for `name` with `config`, then 5 bytes echoed
/// (which also takes in TLS 1.3's tickets); how the handshake was made.
fn exchange(
    addr: std::net::SocketAddr,
    name: &str,
    config: &Arc<rustls::ClientConfig>,
) -> rustls::HandshakeKind {
    let tcp = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(10)).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    tcp.set_write_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let server = rustls_pki_types::ServerName::try_from(name.to_string()).unwrap();
    let conn = rustls::ClientConnection::new(Arc::clone(config), server).unwrap();
    let mut stream = rustls::StreamOwned::new(conn, tcp);
    stream.write_all(b"hello").unwrap();
    let mut buf = [0u8; 5];
    stream.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"hello");
    stream.conn.handshake_kind().unwrap()
}

/// A config file for `backends` and `pair`, with `extra` settings.
fn write_config(certs: &Certs, backends: &[&TestBackend], pair: &Pair, extra: &str) -> String {
    let backends: Vec<String> = backends
        .iter()
        .map(|b| format!("\"{}\"", b.addr()))
        .collect();
    let path = certs.dir.join("rodizio.json");
    let tmp = certs.dir.join("rodizio.json.tmp");
    std::fs::write(
        &tmp,
        format!(
            r#"{{"listen": "127.0.0.1:0", "backends": [{}], "tls_certs": [{}]{extra}}}"#,
            backends.join(", "),
            pair.json()
        ),
    )
    .unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    path.to_str().unwrap().to_string()
}

/// A TLS 1.2 session (by its id, no ticket) is resumed after 300 other
/// clients' sessions and after a reload that only adds a backend; a
/// reload that changes `tls_session_cache` starts afresh.
#[test]
fn a_tls12_session_resumes_after_300_others_and_a_reload() {
    let certs = Certs::new();
    let pair = certs.issue("a", &["a.test"], 1);
    let backend = TestBackend::echo();
    let other = TestBackend::echo();
    let config = write_config(&certs, &[&backend], &pair, "");
    let mut r = Child::balancer(&["-c", &config]);
    let port = r.addr.port();
    let session = certs.dir.join("session.pem");
    let session = session.to_str().unwrap();
    let id_only = ["-tls1_2", "-no_ticket"];
    let first = s_client(
        port,
        Some("a.test"),
        &certs.ca(),
        &[&id_only[..], &["-sess_out", session]].concat(),
    );
    assert!(new_session(&first), "{first}");
    // 300 other TLS 1.2 clients, each a new session in the cache.
    for _ in 0..300 {
        let fresh = client(&certs.ca(), true);
        assert_eq!(
            exchange(r.addr, "a.test", &fresh),
            rustls::HandshakeKind::Full
        );
    }
    let resume = [&id_only[..], &["-sess_in", session]].concat();
    let again = s_client(port, Some("a.test"), &certs.ca(), &resume);
    assert!(reused(&again), "{again}");
    // A reload that changes no TLS setting: the cache goes on.
    write_config(&certs, &[&backend, &other], &pair, "");
    r.signal(libc::SIGHUP);
    let line = r.next_log("reload: ");
    assert!(line.contains("+1 backend"), "{line}");
    let after = s_client(port, Some("a.test"), &certs.ca(), &resume);
    assert!(reused(&after), "{after}");
    // A reload that changes the cache: a new, empty one.
    write_config(&certs, &[&backend], &pair, r#", "tls_session_cache": 1000"#);
    r.signal(libc::SIGHUP);
    let line = r.next_log("reload: ");
    assert!(line.contains("tls_session_cache 20000 → 1000"), "{line}");
    let changed = s_client(port, Some("a.test"), &certs.ca(), &resume);
    assert!(new_session(&changed), "{changed}");
}

/// With the session cache off, a TLS 1.2 client resumes by its ticket,
/// also across a reload that changes no TLS setting; TLS 1.3 clients
/// resume across it too.
#[test]
fn tickets_resume_tls12_and_tls13_across_a_reload() {
    let certs = Certs::new();
    let pair = certs.issue("a", &["a.test"], 1);
    let backend = TestBackend::echo();
    let config = write_config(&certs, &[&backend], &pair, r#", "tls_session_cache": 0"#);
    let mut r = Child::balancer(&["-c", &config]);
    let port = r.addr.port();
    let session = certs.dir.join("ticket.pem");
    let session = session.to_str().unwrap();
    let first = s_client(
        port,
        Some("a.test"),
        &certs.ca(),
        &["-tls1_2", "-sess_out", session],
    );
    assert!(new_session(&first), "{first}");
    assert!(
        first.contains("TLS session ticket lifetime hint"),
        "{first}"
    );
    let resume = ["-tls1_2", "-sess_in", session];
    let again = s_client(port, Some("a.test"), &certs.ca(), &resume);
    assert!(reused(&again), "{again}");
    let tls13 = client(&certs.ca(), false);
    assert_eq!(
        exchange(r.addr, "a.test", &tls13),
        rustls::HandshakeKind::Full
    );
    assert_eq!(
        exchange(r.addr, "a.test", &tls13),
        rustls::HandshakeKind::Resumed
    );
    write_config(
        &certs,
        &[&backend],
        &pair,
        r#", "tls_session_cache": 0, "tls_handshake_timeout": "5s""#,
    );
    r.signal(libc::SIGHUP);
    r.next_log("reload: ");
    let after = s_client(port, Some("a.test"), &certs.ca(), &resume);
    assert!(reused(&after), "{after}");
    assert_eq!(
        exchange(r.addr, "a.test", &tls13),
        rustls::HandshakeKind::Resumed
    );
}

/// With `tls_strict_sni`, a name no certificate covers and a missing name
/// are refused with `unrecognized_name` (and counted); a covered name
/// is served.
#[test]
fn strict_sni_refuses_unknown_and_missing_names() {
    let certs = Certs::new();
    let pair = certs.issue("a", &["a.test", "*.w.test"], 1);
    let backend = TestBackend::echo();
    let b = TestBalancer::with(&[backend.addr()], |c| {
        c.tls.certs = CertList(vec![pair.setting()]);
        c.tls.strict_sni = true;
    });
    let port = b.addr.port();
    for version in ["-tls1_2", "-tls1_3"] {
        for name in ["a.test", "x.w.test"] {
            let out = s_client(port, Some(name), &certs.ca(), &[version]);
            assert!(out.contains("Verify return code: 0 (ok)"), "{name}: {out}");
        }
        for name in [Some("other.test"), Some("w.test"), None] {
            let out = s_client(port, name, &certs.ca(), &[version]);
            assert!(out.contains("unrecognized name"), "{name:?}: {out}");
            assert!(
                out.contains("no peer certificate available"),
                "{name:?}: {out}"
            );
        }
    }
    assert!(common::wait_for(Duration::from_secs(10), || {
        b.stats.snapshot().tls_handshake_failures_unknown_name == 6
    }));
}

/// `tls_alpn`: the server's preferred protocol among the client's; none
/// offered, none negotiated; only others offered, refused (RFC 7301).
#[test]
fn alpn_is_negotiated_in_the_servers_order() {
    let certs = Certs::new();
    let pair = certs.issue("a", &["a.test"], 1);
    let backend = TestBackend::echo();
    let b = TestBalancer::with(&[backend.addr()], |c| {
        c.tls.certs = CertList(vec![pair.setting()]);
        c.tls.alpn = "h2,http/1.1".parse::<AlpnList>().unwrap();
    });
    let port = b.addr.port();
    for (offered, chosen) in [
        ("http/1.1", "ALPN protocol: http/1.1"),
        ("http/1.1,h2", "ALPN protocol: h2"),
        ("spdy/3,h2", "ALPN protocol: h2"),
    ] {
        let out = s_client(port, Some("a.test"), &certs.ca(), &["-alpn", offered]);
        assert!(out.contains(chosen), "{offered}: {out}");
    }
    let none = s_client(port, Some("a.test"), &certs.ca(), &[]);
    assert!(none.contains("No ALPN negotiated"), "{none}");
    let other = s_client(port, Some("a.test"), &certs.ca(), &["-alpn", "imap"]);
    assert!(other.contains("no application protocol"), "{other}");
}

/// An RSA and an ECDSA certificate for `a.test`, in either order: a
/// client that signs only with RSA and one that signs only with ECDSA
/// both finish their handshake (TLS 1.2 and 1.3), each with its type.
#[test]
fn rsa_only_and_ecdsa_only_clients_both_get_a_certificate() {
    let certs = Certs::new();
    let rsa = certs.issue_rsa("rsa", &["a.test"], 1);
    let ecdsa = certs.issue("ecdsa", &["a.test"], 2);
    let backend = TestBackend::echo();
    for order in [[&rsa, &ecdsa], [&ecdsa, &rsa]] {
        let b = TestBalancer::with(&[backend.addr()], |c| {
            c.tls.certs = CertList(order.iter().map(|p| p.setting()).collect());
        });
        let port = b.addr.port();
        for (args, key) in [
            (
                &["-tls1_2", "-sigalgs", "RSA-PSS+SHA256:RSA+SHA256"][..],
                "2048 bit",
            ),
            (
                &["-tls1_2", "-cipher", "ECDHE-RSA-AES128-GCM-SHA256"][..],
                "2048 bit",
            ),
            (&["-tls1_2", "-sigalgs", "ECDSA+SHA256"][..], "256 bit"),
            (
                &["-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-GCM-SHA256"][..],
                "256 bit",
            ),
            (
                &["-tls1_3", "-sigalgs", "rsa_pss_rsae_sha256"][..],
                "2048 bit",
            ),
            (
                &["-tls1_3", "-sigalgs", "ecdsa_secp256r1_sha256"][..],
                "256 bit",
            ),
        ] {
            for name in [Some("a.test"), None] {
                let out = s_client(port, name, &certs.ca(), args);
                assert!(
                    out.contains("Verify return code: 0 (ok)"),
                    "{args:?}: {out}"
                );
                assert!(
                    out.contains(&format!("Server public key is {key}")),
                    "{args:?} {name:?}: {out}"
                );
            }
        }
    }
}

/// The larger keys a site may have: RSA-4096, ECDSA P-384 and P-521,
/// each serving TLS 1.2 and 1.3 handshakes through a worker (whose stack
/// holds the deepest signature), several in a row.
#[test]
fn rsa_4096_p384_and_p521_keys_are_served() {
    let certs = Certs::new();
    let backend = TestBackend::echo();
    for (file, newkey, key) in [
        ("rsa4096", &["-newkey", "rsa:4096"][..], "4096 bit"),
        (
            "p384",
            &["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-384"][..],
            "384 bit",
        ),
        (
            "p521",
            &["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-521"][..],
            "521 bit",
        ),
    ] {
        let pair = certs.issue_key(file, &["a.test"], 1, 30, newkey);
        let b = TestBalancer::with(&[backend.addr()], |c| {
            c.tls.certs = CertList(vec![pair.setting()]);
        });
        for version in ["-tls1_2", "-tls1_3", "-tls1_3"] {
            let out = s_client(b.addr.port(), Some("a.test"), &certs.ca(), &[version]);
            assert!(
                out.contains("Verify return code: 0 (ok)"),
                "{file} {version}: {out}"
            );
            assert!(
                out.contains(&format!("Server public key is {key}")),
                "{file}: {out}"
            );
        }
        b.stop();
    }
}

/// Two certificates of one key type for one name: the load says the
/// second is never served there; an RSA beside an ECDSA one is not
/// warned of.
#[test]
fn two_certificates_of_one_type_for_a_name_are_warned_of() {
    let certs = Certs::new();
    let one = certs.issue("one", &["a.test", "b.test"], 1);
    let two = certs.issue("two", &["a.test"], 2);
    let rsa = certs.issue_rsa("rsa", &["a.test"], 3);
    let backend = TestBackend::echo();
    let backend = backend.addr().to_string();
    let args = [
        "-b",
        &backend,
        "--tls-cert",
        &one.flag(),
        "--tls-cert",
        &rsa.flag(),
        "--tls-cert",
        &two.flag(),
    ];
    let r = Child::on_loopback(&args, |_| {});
    let log = r.log();
    let warned: Vec<&str> = log.lines().filter(|l| l.contains("are both")).collect();
    assert_eq!(warned.len(), 1, "{log}");
    assert!(
        warned[0].contains(&format!(
            "TLS certificates {} and {} are both ECDSA for a.test: only {} is served there",
            one.cert.display(),
            two.cert.display(),
            one.cert.display()
        )),
        "{log}"
    );
}

/// The server's cipher order wins over the client's: TLS 1.2 and 1.3
/// clients that prefer AES-128 get AES-256 when they offer it.
#[test]
fn the_servers_cipher_order_wins() {
    let certs = Certs::new();
    let pair = certs.issue("a", &["a.test"], 1);
    let backend = TestBackend::echo();
    let b = TestBalancer::with(&[backend.addr()], |c| {
        c.tls.certs = CertList(vec![pair.setting()]);
    });
    let port = b.addr.port();
    let tls12 = [
        "-tls1_2",
        "-cipher",
        "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384",
    ];
    let out = s_client(port, Some("a.test"), &certs.ca(), &tls12);
    assert!(
        out.contains("Cipher is ECDHE-ECDSA-AES256-GCM-SHA384"),
        "{out}"
    );
    let tls13 = [
        "-tls1_3",
        "-ciphersuites",
        "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384",
    ];
    let out = s_client(port, Some("a.test"), &certs.ca(), &tls13);
    assert!(out.contains("Cipher is TLS_AES_256_GCM_SHA384"), "{out}");
}

/// Hostile values of the new settings in a file: a huge or garbage ALPN
/// list, a cache size past the bound or negative; `check-config` exits 2
/// in one short line naming the key; 0 and the bound are fine.
#[test]
fn bad_alpn_lists_and_cache_sizes_are_refused_by_check_config() {
    let dir = child::Scratch::new("tls-tuning");
    let huge = "x".repeat(200_000);
    let many: Vec<String> = (0..5_000).map(|i| format!("\"p{i}\"")).collect();
    let many = format!("[{}]", many.join(","));
    let bad = [
        ("tls_alpn", format!("\"{huge}\"")),
        ("tls_alpn", many),
        ("tls_alpn", "\"h2,,http/1.1\"".to_string()),
        ("tls_alpn", "[\"h 2\"]".to_string()),
        ("tls_alpn", "{\"h2\": 1}".to_string()),
        ("tls_session_cache", "1000001".to_string()),
        ("tls_session_cache", "99999999999999999999999".to_string()),
        ("tls_session_cache", "-1".to_string()),
        ("tls_session_cache", "\"lots\"".to_string()),
    ];
    for (key, value) in bad {
        let file = dir.file(
            "bad.json",
            format!(r#"{{"backends": ["127.0.0.1:1"], "{key}": {value}}}"#),
        );
        let out = child::run(&["check-config", file.to_str().unwrap()]);
        assert_eq!(out.code, Some(2), "{key}: {}", out.stderr);
        assert!(out.stderr.contains(key), "{}", out.stderr);
        assert!(out.stderr.len() < 400, "{key}: {}", out.stderr.len());
    }
    for (key, value) in [("tls_session_cache", "0"), ("tls_session_cache", "1000000")] {
        let file = dir.file(
            "good.json",
            format!(r#"{{"backends": ["127.0.0.1:1"], "{key}": {value}}}"#),
        );
        let out = child::run(&["check-config", file.to_str().unwrap()]);
        assert_eq!(out.code, Some(0), "{key}: {}", out.stderr);
    }
}
