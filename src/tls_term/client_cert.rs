//! Client certificates (`tls_client_ca`, `tls_client_crl`): the verifier
//! built from the CA file and the CRLs, the line a refused client leaves
//! (info, throttled: the reason, the presented certificate's subject and
//! issuer), and the accepted client's subject for the access log.
//!
//! # Threads
//!
//! The verifier is built by the thread that starts or reloads the
//! balancer, then called by rustls on the worker threads during their
//! handshakes. A refused certificate's names are kept in a thread-local
//! until the same worker logs the failure: a worker does its client's
//! handshake from start to end on its own thread, and a handshake leaves
//! the verifier's error, not the certificate, to its caller.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use x509_cert::der::Decode;
use x509_cert::Certificate;

use crate::error::{Error, Result};
use crate::throttle::{self, LogThrottle};

/// At most one refused client's line per this, the others counted in it.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(1);

thread_local! {
    /// The subject and issuer of the certificate this thread's verifier
    /// last refused, until the handshake's failure is logged. Boxed: a
    /// pointer in every thread's thread-locals, which sit at the top of
    /// each worker's small stack (docs/internals.md, "The pool").
    static REFUSED: RefCell<Option<Box<Names>>> = const { RefCell::new(None) };
}

/// A certificate's subject and issuer, as RFC 4514 strings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Names {
    pub(crate) subject: String,
    pub(crate) issuer: String,
}

/// The names of a DER certificate; `None` when it is not one.
pub(crate) fn names(der: &[u8]) -> Option<Names> {
    let cert = Certificate::from_der(der).ok()?;
    Some(Names {
        subject: cert.tbs_certificate.subject.to_string(),
        issuer: cert.tbs_certificate.issuer.to_string(),
    })
}

/// The verifier of a service's clients: the CAs of `ca`, the CRLs of
/// `crls` (each issued by one of them).
///
/// # Errors
///
/// [`Error::InvalidSetting`] naming `tls_client_ca` or `tls_client_crl`.
pub(super) fn verifier(
    ca: &Path,
    crls: &[PathBuf],
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>> {
    let roots = super::backend::read_roots(ca).map_err(|m| Error::setting("tls_client_ca", m))?;
    let mut builder =
        rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
    if !crls.is_empty() {
        let lists = super::crl::read(crls, ca).map_err(|m| Error::setting("tls_client_crl", m))?;
        // The client's own certificate is looked up in the CRLs, as
        // OpenSSL's CRL_CHECK (HAProxy's crl-file): one whose issuer has
        // no CRL there is refused, "status unknown".
        builder = builder.with_crls(lists).only_check_end_entity_revocation();
    }
    let inner = builder
        .build()
        .map_err(|e| Error::setting("tls_client_crl", e.to_string()))?;
    Ok(Arc::new(Noting { inner }))
}

/// rustls's verifier, noting the names of a certificate it refuses.
#[derive(Debug)]
struct Noting {
    inner: Arc<dyn ClientCertVerifier>,
}

impl ClientCertVerifier for Noting {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> std::result::Result<ClientCertVerified, rustls::Error> {
        let verdict = self
            .inner
            .verify_client_cert(end_entity, intermediates, now);
        if verdict.is_err() {
            REFUSED.with(|r| *r.borrow_mut() = names(end_entity.as_ref()).map(Box::new));
        }
        verdict
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The names this thread's verifier noted, forgotten once taken.
pub(super) fn take_refused() -> Option<Names> {
    REFUSED.with(|r| r.borrow_mut().take().map(|names| *names))
}

/// Why a client's certificate was refused, in words; `None` when the
/// error is not about its certificate.
pub(super) fn reason(error: &rustls::Error) -> Option<String> {
    match error {
        rustls::Error::NoCertificatesPresented => {
            Some("no certificate presented (tls_client_ca asks for one)".into())
        }
        rustls::Error::InvalidCertificate(e) => Some(super::words::certificate(e, "tls_client_ca")),
        _ => None,
    }
}

/// The line of a refused client, without the throttle's tail.
pub(super) fn refusal_line(peer: SocketAddr, reason: &str, names: Option<&Names>) -> String {
    match names {
        Some(n) => format!(
            "client {peer}: TLS client certificate refused: {reason} (subject {}, issuer {})",
            n.subject, n.issuer
        ),
        None => format!("client {peer}: TLS client certificate refused: {reason}"),
    }
}

/// Logs a refused client at info, at most one line per
/// [`REFUSAL_LOG_EVERY`] for the process, with the count of the others.
pub(super) fn log_refusal(peer: SocketAddr, reason: &str, names: Option<&Names>) {
    static THROTTLE: OnceLock<LogThrottle> = OnceLock::new();
    let throttle = THROTTLE.get_or_init(|| LogThrottle::new(REFUSAL_LOG_EVERY));
    if let Some(unlogged) = throttle.event(Instant::now()) {
        log::info!(
            "{}{}",
            refusal_line(peer, reason, names),
            throttle::more(unlogged)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_line_has_the_reason_subject_and_issuer() {
        let peer: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        let names = Names {
            subject: "CN=alice".into(),
            issuer: "CN=Test CA".into(),
        };
        let reason = reason(&rustls::Error::InvalidCertificate(
            rustls::CertificateError::Revoked,
        ))
        .unwrap();
        assert_eq!(
            refusal_line(peer, &reason, Some(&names)),
            "client 127.0.0.1:4000: TLS client certificate refused: revoked (tls_client_crl) \
             (subject CN=alice, issuer CN=Test CA)"
        );
        let none = super::reason(&rustls::Error::NoCertificatesPresented).unwrap();
        assert_eq!(
            refusal_line(peer, &none, None),
            "client 127.0.0.1:4000: TLS client certificate refused: \
             no certificate presented (tls_client_ca asks for one)"
        );
        assert!(super::reason(&rustls::Error::DecryptError).is_none());
    }

    #[test]
    fn names_of_garbage_are_none() {
        assert_eq!(names(&[0x30, 0x01]), None);
    }
}
