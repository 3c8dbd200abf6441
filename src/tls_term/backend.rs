//! Re-encryption: TLS from the worker to the backend (`backend_tls`),
//! verified against a CA file (`backend_tls_ca`, by default the system's
//! bundle), with the server name `backend_tls_server_name` or else the
//! backend's host.
//!
//! # Threads
//!
//! Built by the thread that starts or reloads the balancer; read by the
//! workers, shared, never changed.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, ServerName};
use rustls_pki_types::pem::PemObject;

/// Debian's bundle of the system's trusted CAs (the package
/// `ca-certificates`), used when `backend_tls_ca` is not given.
pub const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The client side of re-encryption.
#[derive(Debug)]
pub(crate) struct BackendTls {
    pub(crate) config: Arc<rustls::ClientConfig>,
    /// `backend_tls_server_name`, when set.
    server_name: Option<ServerName<'static>>,
}

impl BackendTls {
    /// Reads the CA file and builds the client configuration.
    pub(super) fn load(ca: Option<&Path>, server_name: Option<&str>) -> Result<BackendTls, String> {
        let config = client_config(ca)?;
        let server_name = server_name
            .map(|n| {
                ServerName::try_from(n.to_string())
                    .map_err(|_| format!("{n:?} is not a host name or an address"))
            })
            .transpose()?;
        Ok(BackendTls {
            config,
            server_name,
        })
    }

    /// The name to send and verify for the backend `HOST:PORT`: the
    /// configured one, else its host.
    pub(crate) fn name_for(&self, backend: &str) -> Option<ServerName<'static>> {
        if let Some(name) = &self.server_name {
            return Some(name.clone());
        }
        let host = backend.rsplit_once(':').map_or(backend, |(h, _)| h);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        ServerName::try_from(host.to_string()).ok()
    }
}

/// A TLS client (1.2 or 1.3, no client certificate) that trusts the CAs
/// of `ca`, by default the system's bundle: the backends' re-encryption,
/// and `etcds://`.
///
/// # Errors
///
/// The file cannot be read or holds no usable certificate, in words.
pub(crate) fn client_config(ca: Option<&Path>) -> Result<Arc<rustls::ClientConfig>, String> {
    let path: PathBuf = ca.map_or_else(|| SYSTEM_CA_BUNDLE.into(), Path::to_path_buf);
    let roots = read_roots(&path)?;
    let provider = Arc::new(super::crypto::provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// The CA certificates of a PEM file, at least one.
pub(super) fn read_roots(path: &Path) -> Result<rustls::RootCertStore, String> {
    let bytes = super::certs::read_pem(path)?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&bytes) {
        let cert = cert.map_err(|e| super::words::pem(path, &e))?;
        roots
            .add(cert)
            .map_err(|e| format!("{}: a certificate is not usable: {e}", path.display()))?;
    }
    if roots.is_empty() {
        return Err(format!("{} holds no PEM certificate", path.display()));
    }
    Ok(roots)
}
