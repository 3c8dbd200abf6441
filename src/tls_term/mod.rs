//! TLS at the edge: a service with `tls_certs` takes TLS from its clients
//! and speaks to its backends in plain bytes, or, with `backend_tls`, in a
//! TLS session of its own to each (re-encryption). The admission gate
//! (`proxy/admission.rs`) runs before the client's handshake, so a refused
//! client costs none; a failed handshake is a refusal reported as the
//! others (`proxy/refusal.rs`).
//!
//! - this file: the settings ([`TlsSettings`], [`CertPair`]) and the
//!   [`Terminator`] built from them, swapped whole by a reload;
//! - `backend`: re-encryption, TLS from the worker to the backends;
//! - `client_cert`: the client certificates' verifier (`tls_client_ca`,
//!   `tls_client_crl`), the line a refused one leaves, the accepted one's
//!   subject;
//! - `crl`: reading `tls_client_crl`;
//! - `chain`: a certificate file's chain checked (order, unrelated ones);
//! - `words`: rustls's and PEM errors in words;
//! - `certs`: reading the PEM files, the choice of a certificate by the
//!   client's server name (SNI), and each certificate's `notAfter`, read
//!   by `expiry`;
//! - `handshake`: the worker's blocking handshake, bounded by
//!   `tls_handshake_timeout`, and why one failed;
//! - `pump`: the TLS-aware pump, beside the plain and splice ones of
//!   [`mod@crate::proxy::pump`];
//! - `tuning`: resumption (session cache, tickets) kept across reloads,
//!   the ALPN list, the server's cipher order.
//! - `crypto`: the one cryptography provider under rustls (AWS-LC), and
//!   why.
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

pub mod backend;
mod certs;
mod chain;
pub(crate) mod client_cert;
mod crl;
pub mod crypto;
mod expiry;
pub(crate) mod handshake;
pub(crate) mod pump;
mod tuning;
pub(crate) mod words;

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::error::{Error, Result};

pub use certs::{Expiry, NEAR_DAYS};
pub use crl::CrlFiles;
pub use tuning::{AlpnList, DEFAULT_SESSION_CACHE, MAX_SESSION_CACHE};

/// Default of `tls_handshake_timeout`: 10 s, nginx's
/// `ssl_handshake_timeout` default is 60 s and HAProxy bounds it with
/// `timeout client`; a real client finishes in a few round trips, so
/// anything slower is a client that holds a worker for nothing.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The least stack a worker gets when any service speaks TLS: a
/// handshake (certificate verification, key exchange) runs much deeper
/// than the plain path. Address space only: a page is resident once
/// touched, so plain connections cost what they did.
pub const TLS_WORKER_STACK: usize = 256 * 1024;

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
/// file, or `"off"`; `--tls-cert CERT,KEY` repeated on the command line).
/// Empty: the service does not terminate TLS.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CertList(pub Vec<CertPair>);

impl<'de> Deserialize<'de> for CertList {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(
            untagged,
            expecting = "a list of {\"cert\": FILE, \"key\": FILE}, or \"off\""
        )]
        enum Given {
            List(Vec<CertPair>),
            Word(String),
        }
        match Given::deserialize(d)? {
            Given::List(pairs) => Ok(CertList(pairs)),
            Given::Word(w) if w == "off" => Ok(CertList::default()),
            Given::Word(w) => Err(serde::de::Error::custom(format!(
                "expected a list of {{\"cert\": FILE, \"key\": FILE}}, or \"off\", got {:?}",
                w.chars().take(80).collect::<String>()
            ))),
        }
    }
}

/// As the file takes it, `[{"cert": "a.pem", "key": "a.key"}, ...]`, or
/// `off`: what `check-config`, `GET /config` and the export print (the
/// flags' `CERT,KEY` is not a file's).
impl fmt::Display for CertList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("off");
        }
        let text = |p: &std::path::Path| {
            serde_json::to_string(&p.display().to_string()).unwrap_or_default()
        };
        let all: Vec<String> = self
            .0
            .iter()
            .map(|p| format!(r#"{{"cert": {}, "key": {}}}"#, text(&p.cert), text(&p.key)))
            .collect();
        write!(f, "[{}]", all.join(", "))
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
    /// The most handshakes (and SNI peeks) in progress at once
    /// (`tls_max_pending`). Default [`crate::pending::DEFAULT_MAX_PENDING`].
    pub max_pending: usize,
    /// Ask every client for a certificate signed by these CAs (a PEM
    /// file; `tls_client_ca`, mutual TLS). Default `None`: none asked.
    pub client_ca: Option<PathBuf>,
    /// Refuse clients whose certificate these CRLs revoke (PEM files;
    /// `tls_client_crl`, with `tls_client_ca`). Default none.
    pub client_crl: CrlFiles,
    /// Speak TLS to the backends (`backend_tls`). Default off.
    pub backend: bool,
    /// The CAs that sign the backends' certificates (`backend_tls_ca`).
    /// Default `None`: [`backend::SYSTEM_CA_BUNDLE`].
    pub backend_ca: Option<PathBuf>,
    /// The name sent to and verified in every backend's certificate
    /// (`backend_tls_server_name`). Default `None`: each backend's host.
    pub backend_server_name: Option<String>,
    /// Most TLS 1.2 sessions kept for resumption by session id
    /// (`tls_session_cache`); 0: none. Default [`DEFAULT_SESSION_CACHE`].
    pub session_cache: usize,
    /// Refuse a client whose server name no certificate covers, or who
    /// sends none (`tls_strict_sni`). Default off: it gets the first.
    pub strict_sni: bool,
    /// Protocols offered by ALPN (`tls_alpn`). Default none.
    pub alpn: AlpnList,
}

impl Default for TlsSettings {
    fn default() -> Self {
        TlsSettings {
            certs: CertList::default(),
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            max_pending: crate::pending::DEFAULT_MAX_PENDING,
            client_ca: None,
            client_crl: CrlFiles::default(),
            backend: false,
            backend_ca: None,
            backend_server_name: None,
            session_cache: DEFAULT_SESSION_CACHE,
            strict_sni: false,
            alpn: AlpnList::default(),
        }
    }
}

impl TlsSettings {
    /// Whether the service terminates TLS.
    pub fn terminates(&self) -> bool {
        !self.certs.0.is_empty()
    }

    /// Whether the service speaks TLS on either side.
    pub fn on(&self) -> bool {
        self.terminates() || self.backend
    }

    /// Every file these settings have read: the certificates and keys,
    /// the client CA and CRLs, the backends' CA (the system's bundle when
    /// none is given). What the root reader may read for them.
    pub fn files(&self) -> Vec<PathBuf> {
        let mut files = Vec::new();
        for pair in &self.certs.0 {
            files.extend([pair.cert.clone(), pair.key.clone()]);
        }
        files.extend(self.client_ca.iter().cloned());
        files.extend(self.client_crl.0.iter().cloned());
        if self.backend {
            files.push(
                self.backend_ca
                    .clone()
                    .unwrap_or_else(|| backend::SYSTEM_CA_BUNDLE.into()),
            );
        }
        files
    }
}

/// What a worker needs for a service's TLS: the rustls server
/// configuration (certificates loaded, chosen by SNI) and the handshake
/// timeout, and the client configuration toward the backends. Built
/// again, files read again, by every reload.
#[derive(Debug)]
pub struct Terminator {
    /// rustls's server side, TLS 1.2 and 1.3 with the provider of `crypto`;
    /// `None` when only the backends get TLS.
    pub(crate) config: Option<Arc<rustls::ServerConfig>>,
    /// TLS toward the backends, when `backend_tls` is on.
    pub(crate) backend: Option<backend::BackendTls>,
    /// `tls_handshake_timeout`.
    pub(crate) handshake_timeout: Duration,
    /// The client handshakes in progress (`tls_max_pending`).
    pub(crate) pending: crate::pending::Pending,
    /// Each certificate's name and `notAfter`, for `/metrics`.
    pub(crate) expiry: Vec<Expiry>,
    /// The session cache and ticket keys, for the next reload to keep.
    resumption: Option<tuning::Resumption>,
}

impl Terminator {
    /// Reads every certificate and key of `settings` and builds the
    /// terminator; `None` when the service has no certificate.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSetting`] (`tls_certs`) in one line for a file that
    /// cannot be read, is not PEM, holds no certificate or key, a key
    /// that does not match its certificate, or a chain out of order or
    /// with an unrelated certificate; `tls_client_ca`, `tls_client_crl`
    /// (see `crl`) and `backend_tls_ca` likewise.
    pub fn load(settings: &TlsSettings) -> Result<Option<Terminator>> {
        Terminator::load_after(settings, None)
    }

    /// [`Terminator::load`] for a reload: the session cache and ticket
    /// keys of `previous` (the running terminator) are kept when no TLS
    /// setting changed, so clients resume across the reload.
    ///
    /// # Errors
    ///
    /// As [`Terminator::load`].
    pub fn load_after(
        settings: &TlsSettings,
        previous: Option<&Terminator>,
    ) -> Result<Option<Terminator>> {
        if !settings.on() {
            return Ok(None);
        }
        if settings.handshake_timeout.is_zero() {
            return Err(Error::setting(
                "tls_handshake_timeout",
                "must be more than 0",
            ));
        }
        if settings.client_ca.is_none() && !settings.client_crl.0.is_empty() {
            return Err(Error::setting(
                "tls_client_crl",
                "needs tls_client_ca: only clients asked for a certificate have one to revoke",
            ));
        }
        let backend = settings
            .backend
            .then(|| {
                backend::BackendTls::load(
                    settings.backend_ca.as_deref(),
                    settings.backend_server_name.as_deref(),
                )
            })
            .transpose()
            .map_err(|m| Error::setting("backend_tls_ca", m))?;
        let mut terminator = Terminator {
            config: None,
            backend,
            handshake_timeout: settings.handshake_timeout,
            pending: crate::pending::Pending::new(settings.max_pending),
            expiry: Vec::new(),
            resumption: None,
        };
        if settings.terminates() {
            let (resolver, expiry) = certs::ByName::load(&settings.certs.0, settings.strict_sni)
                .map_err(|m| Error::setting("tls_certs", m))?;
            for words in resolver.shadowed() {
                log::warn!("{words}");
            }
            let resumption = tuning::Resumption::for_settings(
                settings,
                previous.and_then(|p| p.resumption.as_ref()),
            )
            .map_err(|m| Error::setting("tls_session_cache", m))?;
            let provider = Arc::new(crypto::provider());
            let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
                .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
                .map_err(|e| Error::setting("tls_certs", e.to_string()))?;
            let builder = match &settings.client_ca {
                None => builder.with_no_client_auth(),
                Some(ca) => builder.with_client_cert_verifier(client_cert::verifier(
                    ca,
                    &settings.client_crl.0,
                    provider,
                )?),
            };
            let mut config = builder.with_cert_resolver(Arc::new(resolver));
            resumption.tune(&mut config);
            terminator.config = Some(Arc::new(config));
            terminator.resumption = Some(resumption);
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64);
            for words in certs::expiring(&expiry, now) {
                log::warn!("{words}");
            }
            terminator.expiry = expiry;
        }
        Ok(Some(terminator))
    }

    /// Each certificate's first name and the Unix time of its `notAfter`.
    pub fn expiry(&self) -> &[Expiry] {
        &self.expiry
    }
}

#[cfg(test)]
mod tests;
