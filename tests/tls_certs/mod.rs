//! Certificates for the TLS tests, made with the real `openssl` in a temp
//! dir: a CA, and server certificates it signs for given names. Removed
//! with the dir when dropped.

#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A temp dir with a test CA (`ca.pem`).
pub struct Certs {
    pub dir: PathBuf,
}

/// A certificate and its key.
#[derive(Clone, Debug)]
pub struct Pair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Pair {
    /// `CERT,KEY`, as `--tls-cert` takes it.
    pub fn flag(&self) -> String {
        format!("{},{}", self.cert.display(), self.key.display())
    }

    /// `{"cert": ..., "key": ...}` for a config file.
    pub fn json(&self) -> String {
        format!(
            r#"{{"cert": "{}", "key": "{}"}}"#,
            self.cert.display(),
            self.key.display()
        )
    }

    /// As the library's setting.
    pub fn setting(&self) -> rodizio::tls_term::CertPair {
        rodizio::tls_term::CertPair {
            cert: self.cert.clone(),
            key: self.key.clone(),
        }
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let status = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run openssl (the Debian package `openssl`)");
    assert!(status.success(), "openssl {args:?}");
}

impl Certs {
    /// A new dir with a new CA.
    pub fn new() -> Certs {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "rodizio-tls-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        openssl(
            &dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "30",
                "-subj",
                "/CN=rodizio test CA",
            ],
        );
        Certs { dir }
    }

    /// The CA's certificate.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// A server certificate `file`.pem (key `file`.key) for `names`
    /// (its subject is the first, its serial `serial`), signed by the CA.
    pub fn issue(&self, file: &str, names: &[&str], serial: u32) -> Pair {
        self.issue_for_days(file, names, serial, 30)
    }

    /// [`Certs::issue`], valid for `days` days from now.
    pub fn issue_for_days(&self, file: &str, names: &[&str], serial: u32, days: u32) -> Pair {
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"];
        self.issue_key(file, names, serial, days, &ec)
    }

    /// [`Certs::issue`] with an RSA key (2048 bits).
    pub fn issue_rsa(&self, file: &str, names: &[&str], serial: u32) -> Pair {
        self.issue_key(file, names, serial, 30, &["-newkey", "rsa:2048"])
    }

    /// [`Certs::issue_for_days`] with the key `openssl req` makes from
    /// `newkey` (its `-newkey` arguments).
    pub fn issue_key(
        &self,
        file: &str,
        names: &[&str],
        serial: u32,
        days: u32,
        newkey: &[&str],
    ) -> Pair {
        let key = format!("{file}.key");
        let csr = format!("{file}.csr");
        let cert = format!("{file}.pem");
        let ext = format!("{file}.ext");
        // A name that is an address is an IP entry (as an endpoint
        // `127.0.0.1:PORT` is verified), any other a DNS one.
        let sans: Vec<String> = names
            .iter()
            .map(|n| match n.parse::<std::net::IpAddr>() {
                Ok(_) => format!("IP:{n}"),
                Err(_) => format!("DNS:{n}"),
            })
            .collect();
        fs::write(
            self.dir.join(&ext),
            format!("subjectAltName={}\n", sans.join(",")),
        )
        .unwrap();
        let subject = format!("/CN={}", names[0]);
        let mut req = vec!["req"];
        req.extend_from_slice(newkey);
        req.extend_from_slice(&["-nodes", "-keyout", &key, "-out", &csr, "-subj", &subject]);
        openssl(&self.dir, &req);
        let serial = serial.to_string();
        let days = days.to_string();
        openssl(
            &self.dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-set_serial",
                &serial,
                "-out",
                &cert,
                "-days",
                &days,
                "-extfile",
                &ext,
            ],
        );
        Pair {
            cert: self.dir.join(cert),
            key: self.dir.join(key),
        }
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// The subject and serial of the certificate the server at `port` sends
/// for `name` (SNI), as `openssl s_client` shows them: `(subject line,
/// serial)`.
pub fn served(port: u16, name: &str, ca: &Path, version: &str) -> (String, String, String) {
    let out = Command::new("timeout")
        .args(["20", "openssl", "s_client", version, "-connect"])
        .arg(format!("127.0.0.1:{port}"))
        .args(["-servername", name, "-CAfile"])
        .arg(ca)
        .stdin(Stdio::null())
        .output()
        .expect("run openssl s_client");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let subject = text
        .lines()
        .find(|l| l.starts_with("subject="))
        .unwrap_or_default()
        .to_string();
    let protocol = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Protocol  : "))
        .or_else(|| {
            text.lines()
                .find_map(|l| l.strip_prefix("New, ").and_then(|r| r.split(',').next()))
        })
        .unwrap_or_default()
        .to_string();
    let verify = text
        .lines()
        .find(|l| l.trim_start().starts_with("Verify return code"))
        .unwrap_or_default()
        .trim()
        .to_string();
    (subject, protocol, verify)
}

/// A TLS client stream (rustls) over TCP.
pub type Client = rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream>;

/// A rustls client configuration trusting only `ca`.
pub fn client_config(ca: &Path) -> std::sync::Arc<rustls::ClientConfig> {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = std::sync::Arc::new(rodizio::tls_term::crypto::provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    std::sync::Arc::new(config)
}

/// A TLS connection to `addr` for `name`, handshake done (10 s timeouts).
pub fn connect(addr: std::net::SocketAddr, name: &str, ca: &Path) -> std::io::Result<Client> {
    let tcp = std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(10))?;
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    tcp.set_write_timeout(Some(std::time::Duration::from_secs(10)))?;
    let server = rustls_pki_types::ServerName::try_from(name.to_string()).unwrap();
    let conn = rustls::ClientConnection::new(client_config(ca), server).unwrap();
    let mut stream = rustls::StreamOwned::new(conn, tcp);
    while stream.conn.is_handshaking() {
        stream.conn.complete_io(&mut stream.sock)?;
    }
    Ok(stream)
}

/// The subject line openssl gives for the certificate `stream` was served.
pub fn subject_of(stream: &Client) -> String {
    let der = stream.conn.peer_certificates().unwrap()[0].to_vec();
    let dir = std::env::temp_dir().join(format!("rodizio-tls-peer-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!(
        "{}.der",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    fs::write(&file, der).unwrap();
    let out = Command::new("openssl")
        .args(["x509", "-inform", "der", "-noout", "-subject", "-in"])
        .arg(&file)
        .output()
        .unwrap();
    let _ = fs::remove_file(&file);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
