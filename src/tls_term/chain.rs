//! A certificate file's chain checked when it is loaded: each certificate
//! issued by the next (RFC 8446 4.4.2: the server's first, then each one's
//! issuer), so a chain in the wrong order or with an unrelated certificate
//! is refused with that reason at start, reload and `check-config`, not
//! served to clients that then fail, nor called a key mismatch.
//!
//! # Threads
//!
//! Pure functions, called by the thread that loads the certificates.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::path::Path;

use rustls::crypto::CryptoProvider;
use rustls::sign::CertifiedKey;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use x509_cert::der::asn1::BitString;
use x509_cert::der::{Decode, Encode};
use x509_cert::spki::AlgorithmIdentifierOwned;
use x509_cert::Certificate;

/// Checks that each certificate of `chain` (from the file `path`) was
/// issued by the one after it.
///
/// # Errors
///
/// One line naming the file and the certificates (numbered from 1) out of
/// order, unrelated, or not X.509.
pub(super) fn check(path: &Path, chain: &[CertificateDer<'_>]) -> Result<(), String> {
    let shown = path.display();
    let certs = chain
        .iter()
        .enumerate()
        .map(|(i, der)| {
            Certificate::from_der(der.as_ref())
                .map_err(|_| format!("{shown}: certificate {} is not X.509 (bad DER)", i + 1))
        })
        .collect::<Result<Vec<_>, _>>()?;
    for (i, pair) in certs.windows(2).enumerate() {
        let issuer = &pair[0].tbs_certificate.issuer;
        if *issuer == pair[1].tbs_certificate.subject && issued(&pair[0], &pair[1]) {
            continue;
        }
        let (n, next) = (i + 1, i + 2);
        if let Some(j) = certs
            .iter()
            .position(|c| c.tbs_certificate.subject == *issuer && issued(&pair[0], c))
        {
            return Err(format!(
                "{shown}: the chain is out of order: certificate {n}'s issuer ({issuer}) is \
                 certificate {}, it must come right after it (the server's certificate first, \
                 then each one's issuer)",
                j + 1
            ));
        }
        return Err(format!(
            "{shown}: certificate {next} ({}) is unrelated: it did not sign certificate {n} \
             (issued by {issuer}); remove it, or put the right intermediate in its place",
            pair[1].tbs_certificate.subject
        ));
    }
    Ok(())
}

/// Whether `by` signed `cert` (true when that cannot be told).
fn issued(cert: &Certificate, by: &Certificate) -> bool {
    cert.tbs_certificate.to_der().is_ok_and(|tbs| {
        signed(&tbs, &cert.signature_algorithm, &cert.signature, by).unwrap_or(true)
    })
}

/// Whether `by`'s key made `signature` (with `algorithm`) of the DER
/// `tbs`: with the verification algorithms of the process's provider,
/// the one whose identifiers are the signature's algorithm and `by`'s key
/// type. `None` when no algorithm there has those identifiers (RSA-PSS
/// parameters written another way, say): the load does not refuse what
/// it cannot tell, the handshake's verification still runs.
pub(super) fn signed(
    tbs: &[u8],
    algorithm: &AlgorithmIdentifierOwned,
    signature: &BitString,
    by: &Certificate,
) -> Option<bool> {
    let spki = &by.tbs_certificate.subject_public_key_info;
    let (Ok(sig_alg), Ok(key_alg)) = (algorithm.to_der(), spki.algorithm.to_der()) else {
        return Some(false);
    };
    let (Some(key), Some(signature)) = (spki.subject_public_key.as_bytes(), signature.as_bytes())
    else {
        return Some(false);
    };
    let provider = super::crypto::provider();
    let mut known = false;
    for alg in provider.signature_verification_algorithms.all {
        if contents(&sig_alg) == alg.signature_alg_id().as_ref()
            && contents(&key_alg) == alg.public_key_alg_id().as_ref()
        {
            known = true;
            if alg.verify_signature(key, tbs, signature).is_ok() {
                return Some(true);
            }
        }
    }
    known.then_some(false)
}

/// A DER value without its tag and length (pki-types writes algorithm
/// identifiers so).
fn contents(der: &[u8]) -> &[u8] {
    let skip = match der.get(1) {
        Some(&len) if len < 0x80 => 2,
        Some(&len) => 2 + usize::from(len & 0x7f),
        None => return &[],
    };
    der.get(skip..).unwrap_or(&[])
}

/// Why `key` is not the first certificate's: the chain in the wrong
/// order when it is another certificate's of the chain, else `None`.
pub(super) fn misplaced_key(
    path: &Path,
    chain: &[CertificateDer<'static>],
    key: &PrivateKeyDer<'static>,
    provider: &CryptoProvider,
) -> Option<String> {
    let at = (1..chain.len()).find(|&i| {
        CertifiedKey::from_der(vec![chain[i].clone()], key.clone_key(), provider).is_ok()
    })?;
    Some(format!(
        "{}: the chain is in the wrong order: the key is certificate {}'s, and the \
         server's certificate must come first, then each one's issuer",
        path.display(),
        at + 1
    ))
}
