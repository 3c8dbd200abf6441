//! rustls's and pki-types' errors in an operator's words: why a
//! certificate was refused (by a client's, a backend's or a check's
//! handshake), and why a PEM file could not be read. Their own `Display`
//! prints Rust types (`Other(OtherError(CaUsedAsEndEntity))`) and byte
//! arrays (`end_marker: [45, 45, ...]`).
//!
//! # Threads
//!
//! Pure functions, called by whichever thread words an error.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use rustls::CertificateError;
use rustls_pki_types::pem;

/// Why a certificate was refused; `ca_key` names the setting whose CAs it
/// was checked against (`backend_tls_ca`, `tls_client_ca`).
pub(crate) fn certificate(error: &CertificateError, ca_key: &str) -> String {
    match error {
        CertificateError::UnknownIssuer => {
            format!("unknown issuer: not signed by a CA of {ca_key}")
        }
        CertificateError::Expired | CertificateError::ExpiredContext { .. } => "expired".into(),
        CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
            "not valid yet".into()
        }
        CertificateError::NotValidForName => "not valid for the name asked".into(),
        CertificateError::NotValidForNameContext {
            expected,
            presented,
        } => format!(
            "not valid for the name {} (it names {})",
            expected.to_str(),
            if presented.is_empty() {
                "none".into()
            } else {
                let names: Vec<String> = presented.iter().map(|n| bare(n)).collect();
                names.join(", ")
            }
        ),
        CertificateError::BadSignature => {
            "bad signature: not signed by the trusted CA of its issuer's name".into()
        }
        CertificateError::Revoked => "revoked (tls_client_crl)".into(),
        CertificateError::UnknownRevocationStatus => {
            "its revocation status is unknown: no CRL of its issuer in tls_client_crl".into()
        }
        CertificateError::ExpiredRevocationList
        | CertificateError::ExpiredRevocationListContext { .. } => {
            "the CRL of its issuer is past its nextUpdate".into()
        }
        CertificateError::InvalidPurpose | CertificateError::InvalidPurposeContext { .. } => {
            "not meant for this use (its extended key usage does not allow it)".into()
        }
        CertificateError::BadEncoding => "badly encoded (not DER X.509)".into(),
        CertificateError::Other(other) => match other.0.downcast_ref::<webpki::Error>() {
            Some(e) => webpki_words(e, ca_key),
            None => format!("{}", other.0),
        },
        other => spaced(&format!("{other:?}")),
    }
}

/// A presented name as webpki debug-prints it (`DnsName("a.test")`,
/// `IpAddress(10.0.0.1)`, ...), in words: `a.test`, `IP 10.0.0.1`.
fn bare(name: &str) -> String {
    let inner = |prefix: &str| {
        name.strip_prefix(prefix)
            .and_then(|n| n.strip_suffix(')'))
            .map(|n| n.trim_matches('"').to_string())
    };
    if let Some(dns) = inner("DnsName(") {
        return dns;
    }
    if let Some(ip) = inner("IpAddress(") {
        return format!("IP {ip}");
    }
    if let Some(uri) = inner("UniformResourceIdentifier(") {
        return format!("URI {uri}");
    }
    match name {
        "DirectoryName" => "a directory name".into(),
        _ if name.starts_with("Unsupported(") => "a name of a kind rustls does not read".into(),
        _ => name.to_string(),
    }
}

/// The webpki errors rustls passes on as `Other`.
fn webpki_words(error: &webpki::Error, ca_key: &str) -> String {
    use webpki::Error as E;
    match error {
        E::CaUsedAsEndEntity => format!(
            "a CA certificate (CA:TRUE, self-signed?) presented as the peer's own: \
             a peer needs a certificate a CA signed; to trust a self-signed one, \
             make it without CA:TRUE and put it in {ca_key}"
        ),
        E::EndEntityUsedAsCa => {
            "a certificate that is not a CA (CA:FALSE) signed another in its chain".into()
        }
        E::UnsupportedCertVersion => {
            "an X.509 v1 certificate: only v3 certificates are accepted".into()
        }
        E::ExtensionValueInvalid => "an extension's value is not valid".into(),
        E::UnsupportedCriticalExtension => "an unknown critical extension".into(),
        E::PathLenConstraintViolated => "its chain is longer than a CA allows".into(),
        E::NameConstraintViolation => "a name its CA may not sign".into(),
        E::MaximumPathDepthExceeded | E::MaximumPathBuildCallsExceeded => {
            "its chain is too long to verify".into()
        }
        other => spaced(&format!("{other:?}")),
    }
}

/// Why the PEM file `path` could not be read.
pub(crate) fn pem(path: &std::path::Path, error: &pem::Error) -> String {
    let shown = path.display();
    match error {
        pem::Error::MissingSectionEnd { end_marker } => format!(
            "{shown} is cut short: a PEM section has no end line (-----END {}-----)",
            String::from_utf8_lossy(&end_marker[..end_marker.len().min(80)]).trim()
        ),
        pem::Error::IllegalSectionStart { line } => format!(
            "{shown} is not PEM: a bad section start line ({})",
            String::from_utf8_lossy(&line[..line.len().min(80)]).trim()
        ),
        pem::Error::Base64Decode(_) => {
            format!("{shown} is not PEM: a section's base64 is damaged")
        }
        pem::Error::SectionTooLarge => format!("{shown} is not PEM: a section is too large"),
        pem::Error::NoItemsFound => format!("{shown} holds nothing of the kind asked"),
        other => format!("{shown} is not PEM: {other}"),
    }
}

/// `HandshakeFailure` as `handshake failure`.
pub(crate) fn spaced(camel: &str) -> String {
    let word: String = camel.chars().take_while(|c| c.is_alphanumeric()).collect();
    let mut out = String::new();
    for (i, c) in word.chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            out.push(' ');
        }
        out.extend(c.to_lowercase());
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use rustls::{CertificateError, OtherError};
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;

    use super::*;

    /// A self-signed certificate with CA:TRUE, presented as a server's:
    /// webpki's `CaUsedAsEndEntity`, which rustls passes on as `Other`.
    #[test]
    fn a_ca_presented_as_a_peer_is_said_so_not_other() {
        let e = CertificateError::Other(OtherError(Arc::new(webpki::Error::CaUsedAsEndEntity)));
        let words = certificate(&e, "backend_tls_ca");
        assert!(words.contains("CA:TRUE"), "{words}");
        assert!(words.contains("backend_tls_ca"), "{words}");
        assert!(!words.contains("other"), "{words}");
    }

    #[test]
    fn a_v1_certificate_is_said_so() {
        let e =
            CertificateError::Other(OtherError(Arc::new(webpki::Error::UnsupportedCertVersion)));
        assert!(certificate(&e, "tls_client_ca").contains("v1"));
    }

    #[test]
    fn the_ca_and_the_name_are_told_apart() {
        let ca = certificate(&CertificateError::UnknownIssuer, "backend_tls_ca");
        assert_eq!(ca, "unknown issuer: not signed by a CA of backend_tls_ca");
        let name = certificate(
            &CertificateError::NotValidForNameContext {
                expected: rustls_pki_types::ServerName::try_from("b.test").unwrap(),
                presented: vec!["DnsName(\"a.test\")".into()],
            },
            "backend_tls_ca",
        );
        assert_eq!(name, "not valid for the name b.test (it names a.test)");
        // Every kind of name webpki prints, in words.
        let name = certificate(
            &CertificateError::NotValidForNameContext {
                expected: rustls_pki_types::ServerName::try_from("10.0.0.2").unwrap(),
                presented: vec![
                    "DnsName(\"a.test\")".into(),
                    "IpAddress(10.0.0.1)".into(),
                    "UniformResourceIdentifier(\"https://a.test\")".into(),
                    "DirectoryName".into(),
                    "Unsupported(0x66)".into(),
                ],
            },
            "backend_tls_ca",
        );
        assert_eq!(
            name,
            "not valid for the name 10.0.0.2 (it names a.test, IP 10.0.0.1, \
             URI https://a.test, a directory name, a name of a kind rustls does not read)"
        );
        assert_eq!(
            certificate(&CertificateError::Revoked, "tls_client_ca"),
            "revoked (tls_client_crl)"
        );
    }

    /// A PEM file cut in the middle of a certificate: its words name the
    /// missing end line, not a byte array.
    #[test]
    fn a_cut_pem_is_said_cut_not_printed_as_bytes() {
        let cut = b"-----BEGIN CERTIFICATE-----\nMIIBgjCCASegAwIBAgIUfwj1rNXlxJ1S4BknhEG1QIA6jzAwCgYIKoZIzj0EAwIw\n";
        let e = CertificateDer::pem_slice_iter(cut)
            .next()
            .unwrap()
            .unwrap_err();
        let words = pem(Path::new("/etc/a.pem"), &e);
        assert_eq!(
            words,
            "/etc/a.pem is cut short: a PEM section has no end line (-----END CERTIFICATE-----)"
        );
        assert!(!words.contains('['), "{words}");
    }

    #[test]
    fn camel_case_reads_as_words() {
        assert_eq!(spaced("HandshakeFailure"), "handshake failure");
        assert_eq!(spaced("Other(OtherError)"), "other");
    }
}
