//! A service's certificates: the PEM files read and checked (each key
//! must match its certificate), and the choice of one by the client's
//! server name (SNI), the first the default.
//!
//! # Threads
//!
//! Loaded by the thread that starts or reloads the balancer; the resolver
//! is then read by rustls on the worker threads, shared, never changed.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use super::expiry::not_after;
use super::CertPair;

/// The largest PEM file read: a chain of a few certificates is a few KiB,
/// so anything this big is not one (and is not read whole into memory).
const MAX_PEM_BYTES: u64 = 1024 * 1024;

/// One certificate's name (its file) and when it expires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expiry {
    /// The certificate file, as configured.
    pub file: String,
    /// Its `notAfter`, in seconds since the Unix epoch (`None`: the date
    /// could not be read).
    pub not_after: Option<i64>,
}

/// The certificates of a service, chosen by the client's server name.
#[derive(Debug)]
pub(super) struct ByName {
    keys: Vec<Arc<CertifiedKey>>,
}

impl ByName {
    /// Reads every pair; the error is one line naming the file.
    pub(super) fn load(pairs: &[CertPair]) -> Result<(ByName, Vec<Expiry>), String> {
        let provider = rustls::crypto::ring::default_provider();
        let mut keys = Vec::with_capacity(pairs.len());
        let mut expiry = Vec::with_capacity(pairs.len());
        for pair in pairs {
            let chain = read_chain(&pair.cert)?;
            let key = read_key(&pair.key)?;
            let certified = CertifiedKey::from_der(chain, key, &provider).map_err(|e| {
                format!(
                    "{} and {} do not make a pair: {}",
                    pair.cert.display(),
                    pair.key.display(),
                    words(&e)
                )
            })?;
            expiry.push(Expiry {
                file: pair.cert.display().to_string(),
                not_after: certified.cert.first().and_then(|c| not_after(c)),
            });
            keys.push(Arc::new(certified));
        }
        Ok((ByName { keys }, expiry))
    }

    /// The first certificate valid for `name`, if any.
    fn for_name(&self, name: &str) -> Option<&Arc<CertifiedKey>> {
        let name = ServerName::try_from(name).ok()?;
        self.keys.iter().find(|k| {
            k.cert.first().is_some_and(|der| {
                webpki::EndEntityCert::try_from(der)
                    .is_ok_and(|ee| ee.verify_is_valid_for_subject_name(&name).is_ok())
            })
        })
    }
}

impl ResolvesServerCert for ByName {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        if self.keys.len() > 1 {
            if let Some(key) = hello.server_name().and_then(|n| self.for_name(n)) {
                return Some(Arc::clone(key));
            }
        }
        self.keys.first().cloned()
    }
}

/// A rustls error in words, without its type's name.
fn words(error: &rustls::Error) -> String {
    match error {
        rustls::Error::InconsistentKeys(_) => "the key is not the certificate's".into(),
        other => other.to_string(),
    }
}

/// Reads `path`, at most [`MAX_PEM_BYTES`].
pub(super) fn read_pem(path: &Path) -> Result<Vec<u8>, String> {
    let shown = path.display();
    let file = File::open(path).map_err(|e| format!("cannot read {shown}: {}", os_words(&e)))?;
    let mut bytes = Vec::new();
    file.take(MAX_PEM_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {shown}: {}", os_words(&e)))?;
    if bytes.len() as u64 > MAX_PEM_BYTES {
        return Err(format!(
            "{shown} is over 1 MiB: not a PEM certificate or key"
        ));
    }
    Ok(bytes)
}

/// An I/O error in words, without Rust's " (os error N)".
fn os_words(error: &std::io::Error) -> String {
    let text = error.to_string();
    match text.find(" (os error") {
        Some(at) => text[..at].to_string(),
        None => text,
    }
}

/// The certificates of a PEM file, at least one.
fn read_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let bytes = read_pem(path)?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{} is not PEM: {e}", path.display()))?;
    if chain.is_empty() {
        return Err(format!("{} holds no PEM certificate", path.display()));
    }
    Ok(chain)
}

/// The private key of a PEM file.
fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    let bytes = read_pem(path)?;
    PrivateKeyDer::from_pem_slice(&bytes)
        .map_err(|_| format!("{} holds no PEM private key", path.display()))
}
