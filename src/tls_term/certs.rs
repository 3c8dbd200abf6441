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
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

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
    /// Its first DNS name (`subjectAltName`), when it has one.
    pub name: Option<String>,
    /// Its `notAfter`, in seconds since the Unix epoch (`None`: the date
    /// could not be read).
    pub not_after: Option<i64>,
}

/// The certificates of a service, chosen by the client's server name.
#[derive(Debug)]
pub(super) struct ByName {
    keys: Vec<Served>,
}

/// One certificate and the DNS names it is valid for, read once when it
/// is loaded, so a handshake compares strings and parses no DER.
#[derive(Debug)]
struct Served {
    key: Arc<CertifiedKey>,
    /// Its `subjectAltName`s of type DNS, as written (`*.example.com`
    /// included).
    names: Vec<String>,
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
            let certified = CertifiedKey::from_der(chain.clone(), key.clone_key(), &provider)
                .map_err(|e| {
                    super::chain::misplaced_key(&pair.cert, &chain, &key, &provider).unwrap_or_else(
                        || {
                            format!(
                                "{} and {} do not make a pair: {}",
                                pair.cert.display(),
                                pair.key.display(),
                                words(&e)
                            )
                        },
                    )
                })?;
            super::chain::check(&pair.cert, &chain)?;
            let names = certified.cert.first().map(dns_names).unwrap_or_default();
            expiry.push(Expiry {
                file: pair.cert.display().to_string(),
                name: names.first().cloned(),
                not_after: certified.cert.first().and_then(|c| not_after(c)),
            });
            keys.push(Served {
                key: Arc::new(certified),
                names,
            });
        }
        Ok((ByName { keys }, expiry))
    }

    /// The first certificate valid for `name`, if any: from the names
    /// read at load time, no parsing here.
    fn for_name(&self, name: &str) -> Option<&Arc<CertifiedKey>> {
        self.keys
            .iter()
            .find(|s| s.names.iter().any(|n| covers(n, name)))
            .map(|s| &s.key)
    }
}

impl ResolvesServerCert for ByName {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        if self.keys.len() > 1 {
            if let Some(key) = hello.server_name().and_then(|n| self.for_name(n)) {
                return Some(Arc::clone(key));
            }
        }
        self.keys.first().map(|s| Arc::clone(&s.key))
    }
}

/// The DNS names of a certificate's `subjectAltName`, wildcards included;
/// none when its DER cannot be read. Only to choose which certificate to
/// serve: the client verifies the one it gets.
fn dns_names(der: &CertificateDer<'_>) -> Vec<String> {
    webpki::EndEntityCert::try_from(der)
        .map(|ee| ee.valid_dns_names().map(str::to_string).collect())
        .unwrap_or_default()
}

/// Whether the certificate name `pattern` covers the host `name`, as a
/// TLS client checks it (RFC 6125): equal without regard to ASCII case,
/// or `*.example.com` for exactly one label more (`a.example.com`, not
/// `example.com` nor `a.b.example.com`).
fn covers(pattern: &str, name: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(suffix) => name
            .split_once('.')
            .is_some_and(|(label, rest)| !label.is_empty() && rest.eq_ignore_ascii_case(suffix)),
        None => pattern.eq_ignore_ascii_case(name),
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
    read_at_most(path, MAX_PEM_BYTES, "a PEM certificate or key")
}

/// Reads `path`, at most `max` bytes (never more into memory): a larger
/// file is not `what`.
pub(super) fn read_at_most(path: &Path, max: u64, what: &str) -> Result<Vec<u8>, String> {
    let shown = path.display();
    let file = File::open(path).map_err(|e| format!("cannot read {shown}: {}", os_words(&e)))?;
    let mut bytes = Vec::new();
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {shown}: {}", os_words(&e)))?;
    if bytes.len() as u64 > max {
        return Err(format!(
            "{shown} is over {} MiB: not {what}",
            max / (1024 * 1024)
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
        .map_err(|e| super::words::pem(path, &e))?;
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

/// Under this many days left, a certificate is warned of when loaded and
/// marked on the stats page: about when certbot renews (30 days before)
/// has failed twice over.
pub const NEAR_DAYS: i64 = 14;

/// Seconds in a day.
const DAY: i64 = 24 * 3600;

/// What a load says of certificates that have expired or expire within
/// [`NEAR_DAYS`] at `now` (Unix seconds): one sentence each.
pub(super) fn expiring(expiry: &[Expiry], now: i64) -> Vec<String> {
    let mut words = Vec::new();
    for cert in expiry {
        let Some(end) = cert.not_after else { continue };
        let name = cert.name.as_deref().unwrap_or("no DNS name");
        let left = end - now;
        if left <= 0 {
            words.push(format!(
                "TLS certificate {} ({name}) expired {} day(s) ago: clients will refuse it",
                cert.file,
                -left / DAY
            ));
        } else if left < NEAR_DAYS * DAY {
            words.push(format!(
                "TLS certificate {} ({name}) expires in {} day(s): renew it",
                cert.file,
                left / DAY
            ));
        }
    }
    words
}

#[cfg(test)]
mod tests {
    /// A certificate past its date or within [`NEAR_DAYS`] of it is
    /// worded; one further away, or with no date read, is not.
    #[test]
    fn expired_and_near_certificates_are_worded_at_load() {
        let cert = |file: &str, not_after| Expiry {
            file: file.into(),
            name: Some("a.test".into()),
            not_after,
        };
        let now = 1_000_000_000;
        let words = super::expiring(
            &[
                cert("old.pem", Some(now - 3 * DAY)),
                cert("near.pem", Some(now + 5 * DAY)),
                cert("fine.pem", Some(now + NEAR_DAYS * DAY)),
                cert("unread.pem", None),
            ],
            now,
        );
        assert_eq!(
            words,
            [
                "TLS certificate old.pem (a.test) expired 3 day(s) ago: clients will refuse it",
                "TLS certificate near.pem (a.test) expires in 5 day(s): renew it",
            ]
        );
    }

    use super::*;

    /// A key that signs nothing: the choice of a certificate never signs.
    #[derive(Debug)]
    struct NoKey;

    impl rustls::sign::SigningKey for NoKey {
        fn choose_scheme(
            &self,
            _: &[rustls::SignatureScheme],
        ) -> Option<Box<dyn rustls::sign::Signer>> {
            None
        }

        fn algorithm(&self) -> rustls::SignatureAlgorithm {
            rustls::SignatureAlgorithm::ECDSA
        }
    }

    /// Certificates whose DER is one byte `i` (not a certificate at all)
    /// with the names given: the choice uses only the names read at load.
    fn by_name(all: &[&[&str]]) -> ByName {
        let keys = all
            .iter()
            .enumerate()
            .map(|(i, names)| Served {
                key: Arc::new(CertifiedKey::new(
                    vec![CertificateDer::from(vec![i as u8])],
                    Arc::new(NoKey),
                )),
                names: names.iter().map(|n| n.to_string()).collect(),
            })
            .collect();
        ByName { keys }
    }

    fn chosen(certs: &ByName, name: &str) -> Option<u8> {
        certs.for_name(name).map(|k| k.cert[0].as_ref()[0])
    }

    #[test]
    fn the_first_certificate_whose_names_cover_the_name_is_chosen() {
        let certs = by_name(&[
            &["a.test"],
            &["b.test", "*.b.test"],
            &["*.b.test", "c.test"],
        ]);
        assert_eq!(chosen(&certs, "a.test"), Some(0));
        assert_eq!(chosen(&certs, "A.Test"), Some(0));
        assert_eq!(chosen(&certs, "b.test"), Some(1));
        assert_eq!(chosen(&certs, "x.b.test"), Some(1));
        assert_eq!(chosen(&certs, "c.test"), Some(2));
        assert_eq!(chosen(&certs, "y.x.b.test"), None);
        assert_eq!(chosen(&certs, "other.test"), None);
        assert_eq!(chosen(&certs, ""), None);
    }

    #[test]
    fn a_wildcard_covers_one_label() {
        assert!(covers("*.example.com", "a.example.com"));
        assert!(covers("*.example.com", "A.EXAMPLE.com"));
        assert!(!covers("*.example.com", "example.com"));
        assert!(!covers("*.example.com", ".example.com"));
        assert!(!covers("*.example.com", "a.b.example.com"));
        assert!(!covers("example.com", "a.example.com"));
        assert!(covers("example.com", "Example.COM"));
        assert!(!covers("a.test", "a.test."));
    }

    #[test]
    fn names_of_garbage_der_are_none() {
        assert!(dns_names(&CertificateDer::from(vec![0x30, 0x01])).is_empty());
    }
}
