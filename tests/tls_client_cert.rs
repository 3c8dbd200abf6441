//! Client certificates and the files TLS reads, with certificates and CRLs
//! made by the real `openssl` (`openssl ca -revoke`, `-gencrl`): a
//! revoked client refused and logged with its subject, an accepted one's
//! subject in the access log, a new CRL taken by SIGHUP; hostile CRL
//! files (garbage, over the bound, another CA's) and chains (out of
//! order, with an unrelated certificate, cut short) refused at load and
//! by `check-config`, each with its reason.

mod child;
mod common;
mod tls_certs;

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use child::{Child, BIN};
use common::{wait_for, TestBackend};
use rodizio::tls_term::{CertList, CrlFiles, Terminator, TlsSettings};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tls_certs::{Certs, Pair};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run openssl (the Debian package `openssl`)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `openssl ca`'s database beside the test CA of `certs`.
fn ca_database(certs: &Certs) {
    fs::write(
        certs.dir.join("ca.cnf"),
        "[ca]\ndefault_ca = own\n[own]\ndatabase = index.txt\ncrlnumber = crlnumber\n\
         default_md = sha256\ndefault_crl_days = 30\ncertificate = ca.pem\n\
         private_key = ca.key\n",
    )
    .unwrap();
    fs::write(certs.dir.join("index.txt"), "").unwrap();
    fs::write(certs.dir.join("crlnumber"), "01\n").unwrap();
}

/// Revokes `pair`'s certificate in the CA's database.
fn revoke(certs: &Certs, pair: &Pair) {
    let cert = pair.cert.to_str().unwrap();
    openssl(&certs.dir, &["ca", "-config", "ca.cnf", "-revoke", cert]);
}

/// The CA's CRL now, written to `file`.
fn gencrl(certs: &Certs, file: &str) -> PathBuf {
    openssl(
        &certs.dir,
        &["ca", "-config", "ca.cnf", "-gencrl", "-out", file],
    );
    certs.dir.join(file)
}

/// A TLS client with `pair` as its certificate, trusting the CA of
/// `certs`, connected to `addr` (10 s timeouts); the handshake done as far
/// as the client can tell.
fn client_with(
    addr: std::net::SocketAddr,
    certs: &Certs,
    pair: &Pair,
) -> std::io::Result<tls_certs::Client> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(certs.ca()).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&pair.cert)
        .unwrap()
        .map(|c| c.unwrap())
        .collect();
    let key = PrivateKeyDer::from_pem_file(&pair.key).unwrap();
    let provider = Arc::new(rodizio::tls_term::crypto::provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .unwrap();
    let tcp = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    tcp.set_write_timeout(Some(Duration::from_secs(10)))?;
    let name = ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let mut stream = rustls::StreamOwned::new(conn, tcp);
    while stream.conn.is_handshaking() {
        stream.conn.complete_io(&mut stream.sock)?;
    }
    Ok(stream)
}

/// Whether a client with `pair` gets its bytes echoed back.
fn echoed(addr: std::net::SocketAddr, certs: &Certs, pair: &Pair) -> bool {
    let Ok(mut c) = client_with(addr, certs, pair) else {
        return false;
    };
    let mut buf = [0u8; 4];
    c.write_all(b"ping").is_ok() && c.read_exact(&mut buf).is_ok() && &buf == b"ping"
}

/// A revoked client is refused, and the line says revoked with its
/// subject and issuer; a good one is served, its subject in the access
/// log; a new CRL revoking it too is taken by SIGHUP.
#[test]
fn a_revoked_client_is_refused_and_a_new_crl_is_read_on_reload() {
    let certs = Certs::new();
    ca_database(&certs);
    let server = certs.issue("server", &["localhost"], 1);
    let good = certs.issue("good", &["good.test"], 2);
    let bad = certs.issue("bad", &["bad.test"], 3);
    revoke(&certs, &bad);
    let crl = gencrl(&certs, "crl.pem");
    let backend = TestBackend::echo();
    let log = certs.dir.join("access.log");
    let config = certs.dir.join("rodizio.json");
    fs::write(
        &config,
        format!(
            r#"{{"listen": "127.0.0.1:0", "backends": ["{}"], "tls_certs": [{}],
                "tls_client_ca": "{}", "tls_client_crl": "{}",
                "access_log": "text", "access_log_file": "{}"}}"#,
            backend.addr(),
            server.json(),
            certs.ca().display(),
            crl.display(),
            log.display()
        ),
    )
    .unwrap();
    let mut r = Child::balancer(&["-c", config.to_str().unwrap()]);
    assert!(echoed(r.addr, &certs, &good), "{}", r.log());
    assert!(!echoed(r.addr, &certs, &bad));
    let line = r.next_log("TLS client certificate refused");
    assert!(line.contains("revoked"), "{line}");
    assert!(line.contains("subject CN=bad.test"), "{line}");
    assert!(line.contains("issuer CN=rodizio test CA"), "{line}");
    assert!(
        wait_for(Duration::from_secs(10), || fs::read_to_string(&log)
            .unwrap_or_default()
            .contains(r#"tls_client="CN=good.test""#)
            || fs::read_to_string(&log)
                .unwrap_or_default()
                .contains("tls_client=CN=good.test")),
        "{}",
        fs::read_to_string(&log).unwrap_or_default()
    );
    // A garbage list at the same path: the reload fails, naming the key,
    // and the old list stays.
    fs::write(
        &crl,
        "-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n",
    )
    .unwrap();
    r.signal(libc::SIGHUP);
    let failed = r.next_log("tls_client_crl");
    assert!(failed.contains("crl.pem"), "{failed}");
    assert!(echoed(r.addr, &certs, &good), "{}", r.log());
    // The same path, a new list: good is revoked too.
    revoke(&certs, &good);
    gencrl(&certs, "crl.pem");
    r.signal(libc::SIGHUP);
    assert!(
        wait_for(Duration::from_secs(20), || !echoed(r.addr, &certs, &good)),
        "the new CRL was not read: {}",
        r.log()
    );
}

/// A client whose certificate another CA signed is refused, and the line
/// says why, with the certificate's subject and issuer (each refusal
/// test runs its own balancer: the lines are throttled per process).
#[test]
fn a_client_of_another_ca_is_refused_with_its_names() {
    let certs = Certs::new();
    let other = Certs::new();
    let server = certs.issue("server", &["localhost"], 1);
    let stranger = other.issue("stranger", &["stranger.test"], 2);
    let backend = TestBackend::echo();
    let ca = certs.ca();
    let mut r = Child::balancer(&[
        "-l",
        "127.0.0.1:0",
        "-b",
        &backend.addr().to_string(),
        "--tls-cert",
        &server.flag(),
        "--tls-client-ca",
        ca.to_str().unwrap(),
    ]);
    assert!(!echoed(r.addr, &certs, &stranger));
    let line = r.next_log("TLS client certificate refused");
    assert!(
        line.contains("refused: bad signature") || line.contains("refused: unknown issuer"),
        "{line}"
    );
    assert!(
        line.contains("(subject CN=stranger.test, issuer CN=rodizio test CA)"),
        "{line}"
    );
    assert!(line.contains("INFO") || line.contains("info"), "{line}");
}

/// The settings of a service terminating with `server`, asking clients
/// for the CA of `certs` and checking `crls`.
fn settings(certs: &Certs, server: &Pair, crls: &[PathBuf]) -> TlsSettings {
    TlsSettings {
        certs: CertList(vec![server.setting()]),
        client_ca: Some(certs.ca()),
        client_crl: CrlFiles(crls.to_vec()),
        ..TlsSettings::default()
    }
}

fn load_error(settings: &TlsSettings) -> String {
    match Terminator::load(settings) {
        Ok(_) => panic!("loaded: {settings:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn hostile_crl_files_are_refused_with_their_reason() {
    let certs = Certs::new();
    ca_database(&certs);
    let server = certs.issue("server", &["localhost"], 1);
    let good = gencrl(&certs, "crl.pem");
    assert!(Terminator::load(&settings(&certs, &server, std::slice::from_ref(&good))).is_ok());

    let garbage = certs.dir.join("garbage.pem");
    fs::write(
        &garbage,
        "-----BEGIN X509 CRL-----\nAAAAAAAAAAAA\n-----END X509 CRL-----\n",
    )
    .unwrap();
    let e = load_error(&settings(&certs, &server, std::slice::from_ref(&garbage)));
    assert!(e.contains("tls_client_crl"), "{e}");
    assert!(e.contains("garbage.pem"), "{e}");
    assert!(e.contains("not a CRL"), "{e}");

    let empty = certs.dir.join("empty.pem");
    fs::write(&empty, "no PEM here\n").unwrap();
    let e = load_error(&settings(&certs, &server, &[empty]));
    assert!(e.contains("holds no PEM CRL"), "{e}");

    // Over the bound: refused without being read whole.
    let huge = certs.dir.join("huge.pem");
    fs::File::create(&huge)
        .unwrap()
        .set_len(33 * 1024 * 1024)
        .unwrap();
    let e = load_error(&settings(&certs, &server, &[huge]));
    assert!(e.contains("over 32 MiB"), "{e}");

    // Another CA's list would revoke nothing of ours.
    let other = Certs::new();
    ca_database(&other);
    let foreign = gencrl(&other, "crl.pem");
    let e = load_error(&settings(&certs, &server, &[good.clone(), foreign]));
    // Its CA has our CA's name (the tests' CAs all do), not its key.
    assert!(e.contains("did not sign it"), "{e}");
    assert!(e.contains("tls_client_crl"), "{e}");

    // A CRL without tls_client_ca.
    let mut alone = settings(&certs, &server, &[good]);
    alone.client_ca = None;
    let e = load_error(&alone);
    assert!(e.contains("needs tls_client_ca"), "{e}");
}

/// `check-config` reads the CRL: a garbage one is exit 2, one line naming
/// the key and the path.
#[test]
fn check_config_refuses_a_garbage_crl() {
    let certs = Certs::new();
    let server = certs.issue("server", &["localhost"], 1);
    let garbage = certs.dir.join("garbage.pem");
    fs::write(&garbage, "-----BEGIN X509 CRL-----\nAAAA\n").unwrap();
    let config = certs.dir.join("rodizio.json");
    fs::write(
        &config,
        format!(
            r#"{{"listen": "127.0.0.1:0", "backends": ["127.0.0.1:1"], "tls_certs": [{}],
                "tls_client_ca": "{}", "tls_client_crl": ["{}"]}}"#,
            server.json(),
            certs.ca().display(),
            garbage.display()
        ),
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["check-config", config.to_str().unwrap()])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("tls_client_crl"), "{stderr}");
    assert!(stderr.contains("garbage.pem"), "{stderr}");
    assert!(stderr.contains("cut short"), "{stderr}");
    assert!(!stderr.contains('['), "{stderr}");
}

/// The chain of `pair` followed by `extra`, written to `file`.
fn chain_file(certs: &Certs, file: &str, parts: &[&Path]) -> PathBuf {
    let text: String = parts
        .iter()
        .map(|p| fs::read_to_string(p).unwrap())
        .collect();
    let path = certs.dir.join(file);
    fs::write(&path, text).unwrap();
    path
}

fn served_with(cert: PathBuf, key: &Path) -> TlsSettings {
    TlsSettings {
        certs: CertList(vec![rodizio::tls_term::CertPair {
            cert,
            key: key.to_path_buf(),
        }]),
        ..TlsSettings::default()
    }
}

#[test]
fn a_chain_out_of_order_or_with_an_unrelated_certificate_is_refused_with_its_reason() {
    let certs = Certs::new();
    let server = certs.issue("server", &["localhost"], 1);
    let ca = certs.ca();
    // The leaf, then its CA: as it should be.
    let right = chain_file(&certs, "right.pem", &[&server.cert, &ca]);
    assert!(Terminator::load(&served_with(right, &server.key)).is_ok());

    let reversed = chain_file(&certs, "reversed.pem", &[&ca, &server.cert]);
    let e = load_error(&served_with(reversed, &server.key));
    assert!(e.contains("wrong order"), "{e}");
    assert!(!e.contains("do not make a pair"), "{e}");

    let other = Certs::new();
    let unrelated = chain_file(&certs, "unrelated.pem", &[&server.cert, &other.ca()]);
    let e = load_error(&served_with(unrelated, &server.key));
    assert!(e.contains("unrelated"), "{e}");
    assert!(e.contains("certificate 2"), "{e}");

    // A key that is no certificate's of the chain is still a mismatch.
    let stranger = certs.issue("stranger", &["other.test"], 2);
    let e = load_error(&served_with(server.cert.clone(), &stranger.key));
    assert!(e.contains("do not make a pair"), "{e}");

    // Cut in the middle of its base64.
    let whole = fs::read_to_string(&server.cert).unwrap();
    let cut = certs.dir.join("cut.pem");
    fs::write(&cut, &whole[..whole.len() / 2]).unwrap();
    let e = load_error(&served_with(cut, &server.key));
    assert!(e.contains("cut short"), "{e}");
    assert!(!e.contains('['), "{e}");
}
