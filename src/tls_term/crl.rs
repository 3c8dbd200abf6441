//! `tls_client_crl`: the certificate revocation lists (PEM, `-----BEGIN
//! X509 CRL-----`) a service checks its clients' certificates against,
//! read with a bound, each parsed and matched to a CA of `tls_client_ca`
//! when loaded, so a garbage file or another CA's list stops the start
//! (or the reload, which keeps the old) instead of refusing every client.
//!
//! # Threads
//!
//! Read by the thread that starts or reloads the balancer.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::fmt;
use std::path::{Path, PathBuf};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, CertificateRevocationListDer};
use serde::Deserialize;
use x509_cert::crl::CertificateList;
use x509_cert::der::{Decode, Encode};
use x509_cert::Certificate;

/// The largest CRL file read: a big public CA's list is a few MiB; past
/// this it is not read into memory at all.
pub(super) const MAX_CRL_BYTES: u64 = 32 * 1024 * 1024;

/// The value of `tls_client_crl`: PEM files of CRLs, none by default.
/// In the file one path, `"a.pem,b.pem"`, a list, or `"none"`; on the
/// command line `--tls-client-crl FILE` repeated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CrlFiles(pub Vec<PathBuf>);

impl<'de> Deserialize<'de> for CrlFiles {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged, expecting = "a PEM file, a list of them, or \"none\"")]
        enum Given {
            List(Vec<PathBuf>),
            Word(String),
        }
        Ok(match Given::deserialize(d)? {
            Given::List(files) => CrlFiles(files),
            Given::Word(w) if w.is_empty() || w == "none" || w == "off" => CrlFiles::default(),
            // What `Display` writes for several, so an export reads back.
            Given::Word(w) => CrlFiles(w.split(',').map(PathBuf::from).collect()),
        })
    }
}

impl fmt::Display for CrlFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        let all: Vec<String> = self.0.iter().map(|p| p.display().to_string()).collect();
        f.write_str(&all.join(","))
    }
}

/// Every CRL of `files`, each issued by a CA of the PEM file `ca`.
///
/// # Errors
///
/// One line naming the file: unreadable, over [`MAX_CRL_BYTES`], no CRL
/// in it, one that is not DER, or one issued (named and signed) by no CA
/// of `ca`.
pub(super) fn read(
    files: &[PathBuf],
    ca: &Path,
) -> Result<Vec<CertificateRevocationListDer<'static>>, String> {
    let cas = ca_certificates(ca)?;
    let mut all = Vec::new();
    for path in files {
        let bytes = super::certs::read_at_most(path, MAX_CRL_BYTES, "a PEM CRL")?;
        let before = all.len();
        for crl in CertificateRevocationListDer::pem_slice_iter(&bytes) {
            let crl = crl.map_err(|e| super::words::pem(path, &e))?;
            let n = all.len() - before + 1;
            let list = CertificateList::from_der(crl.as_ref()).map_err(|_| {
                format!("{}: CRL number {n} is not a CRL (bad DER)", path.display())
            })?;
            let issuer = &list.tbs_cert_list.issuer;
            let named: Vec<&Certificate> = cas
                .iter()
                .filter(|c| c.tbs_certificate.subject == *issuer)
                .collect();
            if named.is_empty() {
                return Err(format!(
                    "{}: CRL number {n} was issued by {issuer}, not by a CA of tls_client_ca ({})",
                    path.display(),
                    ca.display()
                ));
            }
            if !named.iter().any(|c| signed_by(&list, c)) {
                return Err(format!(
                    "{}: CRL number {n} names {issuer} as its issuer, but that CA of \
                     tls_client_ca ({}) did not sign it: another CA of the same name",
                    path.display(),
                    ca.display()
                ));
            }
            all.push(crl);
        }
        if all.len() == before {
            return Err(format!(
                "{} holds no PEM CRL (-----BEGIN X509 CRL-----)",
                path.display()
            ));
        }
    }
    Ok(all)
}

/// Every certificate of the CA file that x509-cert reads.
fn ca_certificates(ca: &Path) -> Result<Vec<Certificate>, String> {
    let bytes = super::certs::read_pem(ca)?;
    let mut all = Vec::new();
    for cert in CertificateDer::pem_slice_iter(&bytes) {
        let cert = cert.map_err(|e| super::words::pem(ca, &e))?;
        if let Ok(cert) = Certificate::from_der(cert.as_ref()) {
            all.push(cert);
        }
    }
    Ok(all)
}

/// Whether `ca`'s key signed `list` (true when that cannot be told: the
/// handshake's check of the CRL still runs).
fn signed_by(list: &CertificateList, ca: &Certificate) -> bool {
    list.tbs_cert_list.to_der().is_ok_and(|tbs| {
        super::chain::signed(&tbs, &list.signature_algorithm, &list.signature, ca).unwrap_or(true)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_file_several_or_none_read_back_from_their_words() {
        for text in [r#""none""#, r#""a.pem""#, r#""a.pem,b.pem""#] {
            let files: CrlFiles = serde_json::from_str(text).unwrap();
            assert_eq!(format!("\"{files}\""), text);
        }
        let files: CrlFiles = serde_json::from_str(r#"["a.pem", "b.pem"]"#).unwrap();
        assert_eq!(files.to_string(), "a.pem,b.pem");
        assert!(serde_json::from_str::<CrlFiles>("3").is_err());
    }
}
