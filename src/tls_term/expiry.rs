//! A certificate's `notAfter` (RFC 5280, 4.1), read with x509-cert.
//!
//! # Threads
//!
//! Pure functions, called when certificates are loaded.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use x509_cert::der::Decode;
use x509_cert::Certificate;

/// The `notAfter` of a DER certificate, in seconds since the Unix epoch;
/// `None` when the bytes are not one certificate.
pub(super) fn not_after(der: &[u8]) -> Option<i64> {
    let cert = Certificate::from_der(der).ok()?;
    let not_after = cert.tbs_certificate.validity.not_after;
    i64::try_from(not_after.to_unix_duration().as_secs()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;

    /// Self-signed P-256 certificates made with `openssl req -x509`:
    /// `notAfter` 2036-11-30T19:27:59Z, a UTCTime.
    const UTC_TIME: &str = "\
-----BEGIN CERTIFICATE-----
MIIBgjCCASegAwIBAgIUfwj1rNXlxJ1S4BknhEG1QIA6jzAwCgYIKoZIzj0EAwIw
FjEUMBIGA1UEAwwLZXhwaXJ5LnRlc3QwHhcNMjYxMjAzMTkyNzU5WhcNMzYxMTMw
MTkyNzU5WjAWMRQwEgYDVQQDDAtleHBpcnkudGVzdDBZMBMGByqGSM49AgEGCCqG
SM49AwEHA0IABJo+2WVWUk334KSjOy1RsEMsvBU//Z/s2JRbzi6j/hxB9Og4YRzC
tU+nc0IbsoIX6PWAkMRNLIYniPskGgvqXlGjUzBRMB0GA1UdDgQWBBTQTLoTdJ66
lfRb3Kqr4cq7kxjvAzAfBgNVHSMEGDAWgBTQTLoTdJ66lfRb3Kqr4cq7kxjvAzAP
BgNVHRMBAf8EBTADAQH/MAoGCCqGSM49BAMCA0kAMEYCIQDaxXrDr/KlH+UNJbCu
kJWgrURLClao4c9pqbyC0YfVngIhAL2jlAiUtVB2s/KH2oE5VncCuW/EDOTfLH/r
oXwiv4QA
-----END CERTIFICATE-----";
    /// `notAfter` 2109-01-22T19:27:59Z, a GeneralizedTime (after 2049).
    const GENERALIZED_TIME: &str = "\
-----BEGIN CERTIFICATE-----
MIIBgzCCASmgAwIBAgIUGPu+BXpwkk9K+09m04uWhf9FKNIwCgYIKoZIzj0EAwIw
FjEUMBIGA1UEAwwLZXhwaXJ5LnRlc3QwIBcNMjYxMjAzMTkyNzU5WhgPMjEwOTAx
MjIxOTI3NTlaMBYxFDASBgNVBAMMC2V4cGlyeS50ZXN0MFkwEwYHKoZIzj0CAQYI
KoZIzj0DAQcDQgAECm+NnMlhYFmIiceyxmR7moy5T60HMqqUUIqLqazR1o0MvXAO
pwVDktaRfCGlFnIoA5mPmAdNY00VR1I6NScUSqNTMFEwHQYDVR0OBBYEFIm/d2Q4
Gq5eKWdQgSZ6+eXvFeI+MB8GA1UdIwQYMBaAFIm/d2Q4Gq5eKWdQgSZ6+eXvFeI+
MA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZIzj0EAwIDSAAwRQIgGf9MwPW11Nq3hEjs
ZAAOvV88MVUfASb5y6EUe/oGfGQCIQCoXEHW5myO2vDXuRChvoYfy0V2hzkhpha/
Nr8Tdv15BQ==
-----END CERTIFICATE-----";

    fn der(pem: &str) -> Vec<u8> {
        CertificateDer::from_pem_slice(pem.as_bytes())
            .unwrap()
            .to_vec()
    }

    #[test]
    fn dates_in_both_notations() {
        assert_eq!(not_after(&der(UTC_TIME)), Some(2_111_686_079));
        assert_eq!(not_after(&der(GENERALIZED_TIME)), Some(4_388_326_079));
    }

    proptest::proptest! {
        /// Any bytes, and a certificate-shaped sequence with lying lengths
        /// inside, give a date or None: no panic, no read past the end.
        #[test]
        fn any_bytes_give_a_date_or_none(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = not_after(&bytes);
            let mut wrapped = vec![0x30, 0x82, 0xff, 0xff, 0x30, 0x84, 0x7f, 0xff, 0xff, 0xff];
            wrapped.extend_from_slice(&bytes);
            proptest::prop_assert_eq!(not_after(&wrapped), None);
        }

        /// A real certificate cut anywhere, or with any one byte changed:
        /// a date or None, no panic.
        #[test]
        fn a_damaged_certificate_gives_a_date_or_none(
            at in 0usize..1000,
            byte in proptest::num::u8::ANY,
        ) {
            let cert = der(UTC_TIME);
            let at = at % cert.len();
            proptest::prop_assert_eq!(not_after(&cert[..at]), None);
            let mut changed = cert.clone();
            changed[at] = byte;
            let _ = not_after(&changed);
        }
    }

    #[test]
    fn garbage_and_truncated_der_give_none() {
        assert_eq!(not_after(&[]), None);
        assert_eq!(not_after(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
        assert_eq!(not_after(&[0x30, 0x03, 0x30, 0x01]), None);
        assert_eq!(not_after(&[0x02, 0x01, 0x00]), None);
    }
}
