//! TLS termination at the edge: a service with `tls_certs` takes TLS
//! from its clients and speaks plain bytes to its backends.
//!
//! - this file: the settings ([`TlsSettings`], [`CertPair`]) and the
//!   [`Terminator`] built from them, swapped whole by a reload;
//! - `certs`: reading the PEM files, the choice of a certificate by the
//!   client's server name (SNI), and each certificate's `notAfter`;
//! - `handshake`: the worker's blocking handshake, bounded by
//!   `tls_handshake_timeout`, and why one failed;
//! - `pump`: the TLS-aware pump, beside the plain and splice ones of
//!   [`crate::proxy::pump`].
//!
//! # Threads
//!
//! A [`Terminator`] is built by the thread that starts the balancer or
//! reloads it, then read by the worker threads (one `ArcSwap` load per
//! TLS connection); each worker does its own client's handshake and pump.
//! A service without `tls_certs` has no terminator and pays nothing.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C proxies plain TCP only.

mod certs;
mod expiry;
pub(crate) mod handshake;
pub(crate) mod pump;

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::error::{Error, Result};

pub use certs::Expiry;

/// Default of `tls_handshake_timeout`: 10 s, nginx's
/// `ssl_handshake_timeout` default is 60 s and HAProxy bounds it with
/// `timeout client`; a real client finishes in a few round trips, so
/// anything slower is a client that holds a worker for nothing.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// One certificate chain and its private key, both PEM files.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertPair {
    /// The certificate chain: the server's certificate first, then the
    /// intermediates.
    pub cert: PathBuf,
    /// The private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

impl FromStr for CertPair {
    type Err = String;

    /// `CERT.pem,KEY.pem`, as `--tls-cert` takes it.
    fn from_str(text: &str) -> std::result::Result<Self, Self::Err> {
        match text.split_once(',') {
            Some((cert, key)) if !cert.is_empty() && !key.is_empty() => Ok(CertPair {
                cert: cert.into(),
                key: key.into(),
            }),
            _ => {
                let shown: String = text.chars().take(80).collect();
                Err(format!("expected CERT,KEY (two PEM files), got {shown:?}"))
            }
        }
    }
}

impl fmt::Display for CertPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{},{}", self.cert.display(), self.key.display())
    }
}

/// The certificates of a service, the first the default: the value of
/// `tls_certs` (`"tls_certs": [{"cert": "a.pem", "key": "a.key"}]` in the
/// file, `--tls-cert CERT,KEY` repeated on the command line). Empty: the
/// service does not terminate TLS.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct CertList(pub Vec<CertPair>);

impl fmt::Display for CertList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("off");
        }
        let all: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&all.join(" "))
    }
}

/// A service's TLS settings (a part of [`crate::Config`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// Its certificates (`tls_certs`). Default none: plain TCP.
    pub certs: CertList,
    /// Longest time a client may take to finish its handshake
    /// (`tls_handshake_timeout`). Default [`DEFAULT_HANDSHAKE_TIMEOUT`].
    pub handshake_timeout: Duration,
}

impl Default for TlsSettings {
    fn default() -> Self {
        TlsSettings {
            certs: CertList::default(),
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
        }
    }
}

impl TlsSettings {
    /// Whether the service terminates TLS.
    pub fn on(&self) -> bool {
        !self.certs.0.is_empty()
    }
}

/// What a worker needs to terminate TLS for a service: the rustls
/// configuration (certificates loaded, chosen by SNI) and the handshake
/// timeout. Built again, files read again, by every reload.
#[derive(Debug)]
pub struct Terminator {
    /// rustls's server side, TLS 1.2 and 1.3 with the `ring` provider.
    pub(crate) config: Arc<rustls::ServerConfig>,
    /// `tls_handshake_timeout`.
    pub(crate) handshake_timeout: Duration,
    /// Each certificate's name and `notAfter`, for `/metrics`.
    pub(crate) expiry: Vec<Expiry>,
}

impl Terminator {
    /// Reads every certificate and key of `settings` and builds the
    /// terminator; `None` when the service has no certificate.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSetting`] (`tls_certs`) in one line for a file that
    /// cannot be read, is not PEM, holds no certificate or key, or a key
    /// that does not match its certificate.
    pub fn load(settings: &TlsSettings) -> Result<Option<Terminator>> {
        if !settings.on() {
            return Ok(None);
        }
        if settings.handshake_timeout.is_zero() {
            return Err(Error::setting("tls_handshake_timeout", "must be more than 0"));
        }
        let (resolver, expiry) =
            certs::ByName::load(&settings.certs.0).map_err(|m| Error::setting("tls_certs", m))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| Error::setting("tls_certs", e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(resolver));
        Ok(Some(Terminator {
            config: Arc::new(config),
            handshake_timeout: settings.handshake_timeout,
            expiry,
        }))
    }

    /// Each certificate's first name and the Unix time of its `notAfter`.
    pub fn expiry(&self) -> &[Expiry] {
        &self.expiry
    }
}

#[cfg(test)]
mod tests;
