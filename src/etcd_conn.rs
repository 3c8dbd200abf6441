//! The connection under etcd's HTTP client (`etcd.rs`): plain TCP for
//! `etcd://`, TLS for `etcds://` (rustls, the same client side as the
//! backends' re-encryption: TLS 1.2 or 1.3, verified against a CA file,
//! by default the system's bundle, for the endpoint's host name or
//! address).
//!
//! The CA is read once, where the source is parsed (at start-up and on a
//! reload, before privileges are given up): a missing or empty file is an
//! error of the setting then, not a failure of every later read.
//!
//! # Threads
//!
//! A service's `rodizio-etcd` thread; the rustls configuration is shared
//! read-only between the connections it opens.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::ServerName;

/// `etcds://`: TLS toward etcd, verified against `ca`.
#[derive(Clone)]
pub struct EtcdTls {
    /// The CA file given (`?ca=PATH`), or none for the system's bundle.
    pub ca: Option<PathBuf>,
    config: Arc<rustls::ClientConfig>,
}

impl EtcdTls {
    /// Reads the CA file (or the system's bundle) and builds the client.
    ///
    /// # Errors
    ///
    /// The file cannot be read or holds no usable certificate, in words.
    pub fn load(ca: Option<&Path>) -> Result<EtcdTls, String> {
        let config = crate::tls_term::backend::client_config(ca)?;
        Ok(EtcdTls {
            ca: ca.map(Path::to_path_buf),
            config,
        })
    }
}

/// Two sources are the same when they name the same CA file.
impl PartialEq for EtcdTls {
    fn eq(&self, other: &EtcdTls) -> bool {
        self.ca == other.ca
    }
}

impl Eq for EtcdTls {}

/// One connection to an endpoint.
pub enum Conn {
    /// `etcd://`.
    Plain(TcpStream),
    /// `etcds://`; the handshake runs with the first read or write.
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Conn {
    /// `stream` as is, or wrapped in TLS for `endpoint`'s host.
    ///
    /// # Errors
    ///
    /// The host is not a name or an address, or rustls refused to start.
    pub fn open(stream: TcpStream, tls: Option<&EtcdTls>, endpoint: &str) -> Result<Conn, String> {
        let Some(tls) = tls else {
            return Ok(Conn::Plain(stream));
        };
        let host = endpoint.rsplit_once(':').map_or(endpoint, |(h, _)| h);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name = ServerName::try_from(host.to_string())
            .map_err(|_| format!("'{host}' is not a host name or an address for TLS"))?;
        let client = rustls::ClientConnection::new(tls.config.clone(), name)
            .map_err(|e| format!("TLS: {e}"))?;
        Ok(Conn::Tls(Box::new(rustls::StreamOwned::new(
            client, stream,
        ))))
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Plain(s) => s.read(buf),
            Conn::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Plain(s) => s.write(buf),
            Conn::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Conn::Plain(s) => s.flush(),
            Conn::Tls(s) => s.flush(),
        }
    }
}
