//! A service's certificates: the PEM files read and checked (each key
//! must match its certificate), and the choice of one by the client's
//! server name (SNI), the first the default, then among those of one name
//! by the client's signature schemes (an RSA and an ECDSA certificate for
//! one name: each client gets one it can use, as HAProxy does). With
//! `tls_strict_sni`, a name no certificate covers is refused.
//!
//! # Threads
//!
//! Loaded by the thread that starts or reloads the balancer; the resolver
//! is then read by rustls on the worker threads, shared, never changed.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::path::Path;
use std::sync::Arc;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::SignatureScheme;
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
    /// `tls_strict_sni`: no certificate for a name none covers.
    strict: bool,
}

/// The error rustls gives when the resolver chose no certificate (it
/// then queues an `access_denied` alert, which the handshake replaces by
/// `unrecognized_name`): only `tls_strict_sni` chooses none.
pub(super) const NO_CERTIFICATE: &str = "no server certificate chain resolved";

/// One certificate and the DNS names it is valid for, read once when it
/// is loaded, so a handshake compares strings and parses no DER.
#[derive(Debug)]
struct Served {
    key: Arc<CertifiedKey>,
    /// Its `subjectAltName`s of type DNS, as written (`*.example.com`
    /// included).
    names: Vec<String>,
    /// Its file, as configured, for the load's warnings.
    file: String,
}

impl ByName {
    /// Reads every pair; the error is one line naming the file.
    pub(super) fn load(pairs: &[CertPair], strict: bool) -> Result<(ByName, Vec<Expiry>), String> {
        let provider = super::crypto::provider();
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
                file: pair.cert.display().to_string(),
            });
        }
        Ok((ByName { keys, strict }, expiry))
    }

    /// The certificate for `name`: the first valid for it whose key signs
    /// with one of `schemes` (the client's), else the first valid for it;
    /// `None` when none is. From the names read at load time, no parsing
    /// here.
    fn for_name(&self, name: &str, schemes: &[SignatureScheme]) -> Option<&Arc<CertifiedKey>> {
        let mut valid = self
            .keys
            .iter()
            .filter(|s| s.names.iter().any(|n| covers(n, name)));
        let first = valid.next()?;
        if usable(&first.key, schemes) {
            return Some(&first.key);
        }
        Some(
            valid
                .find(|s| usable(&s.key, schemes))
                .map_or(&first.key, |s| &s.key),
        )
    }

    /// The default certificate, for a client whose name none covers or
    /// who sends none: the first, or another for the first's name whose
    /// key the client can use (an ECDSA default beside an RSA one).
    fn default_for(&self, schemes: &[SignatureScheme]) -> Option<&Arc<CertifiedKey>> {
        let first = self.keys.first()?;
        match first.names.first() {
            Some(name) if !usable(&first.key, schemes) => self.for_name(name, schemes),
            _ => Some(&first.key),
        }
    }

    /// One sentence per certificate never served for a name because an
    /// earlier one of the same key type covers it: the second RSA
    /// certificate for `a.test` is dead weight (a renewal that kept the
    /// old file in the list, say).
    pub(super) fn shadowed(&self) -> Vec<String> {
        let mut words = Vec::new();
        for (j, later) in self.keys.iter().enumerate() {
            let kind = later.key.key.algorithm();
            for earlier in self.keys[..j]
                .iter()
                .filter(|e| e.key.key.algorithm() == kind)
            {
                let names: Vec<&str> = later
                    .names
                    .iter()
                    .filter(|name| {
                        earlier.names.iter().any(|p| {
                            p.eq_ignore_ascii_case(name)
                                || (!name.starts_with("*.") && covers(p, name))
                        })
                    })
                    .map(String::as_str)
                    .collect();
                if names.is_empty() {
                    continue;
                }
                let mut shown = names[..names.len().min(3)].join(", ");
                if names.len() > 3 {
                    shown.push_str(&format!(" and {} more", names.len() - 3));
                }
                words.push(format!(
                    "TLS certificates {} and {} are both {kind:?} for {shown}: \
                     only {} is served there",
                    earlier.file, later.file, earlier.file
                ));
            }
        }
        words
    }
}

/// Whether `key` signs with one of the client's `schemes` (rustls gives
/// the resolver those that fit the cipher suites both sides have).
fn usable(key: &CertifiedKey, schemes: &[SignatureScheme]) -> bool {
    key.key.choose_scheme(schemes).is_some()
}

impl ResolvesServerCert for ByName {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        if self.keys.len() == 1 && !self.strict {
            // Nothing to choose: a client that cannot use it fails anyway.
            return self.keys.first().map(|s| Arc::clone(&s.key));
        }
        let schemes = hello.signature_schemes();
        let named = hello.server_name().and_then(|n| self.for_name(n, schemes));
        match named {
            Some(key) => Some(Arc::clone(key)),
            None if self.strict => None,
            None => self.default_for(schemes).map(Arc::clone),
        }
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
    use crate::system::FileError;
    let shown = path.display();
    crate::files::read(path, max).map_err(|e| match e {
        FileError::Io(e) => format!("cannot read {shown}: {}", os_words(&e)),
        FileError::Directory => format!("cannot read {shown}: it is a directory"),
        FileError::NotRegular => {
            format!("cannot read {shown}: not a regular file (a pipe or a device?)")
        }
        FileError::TooLarge => format!("{shown} is over {} MiB: not {what}", max / (1024 * 1024)),
    })
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

    use rustls::SignatureAlgorithm as Alg;

    /// A key of type `Alg` that signs nothing: it says which schemes it
    /// would sign with, all the choice of a certificate asks.
    #[derive(Debug)]
    struct FakeKey(Alg);

    #[derive(Debug)]
    struct FakeSigner(SignatureScheme);

    impl rustls::sign::Signer for FakeSigner {
        fn sign(&self, _: &[u8]) -> Result<Vec<u8>, rustls::Error> {
            Err(rustls::Error::General("a fake key".into()))
        }

        fn scheme(&self) -> SignatureScheme {
            self.0
        }
    }

    impl rustls::sign::SigningKey for FakeKey {
        fn choose_scheme(
            &self,
            offered: &[SignatureScheme],
        ) -> Option<Box<dyn rustls::sign::Signer>> {
            let mine = match self.0 {
                Alg::RSA => SignatureScheme::RSA_PSS_SHA256,
                _ => SignatureScheme::ECDSA_NISTP256_SHA256,
            };
            offered
                .contains(&mine)
                .then(|| Box::new(FakeSigner(mine)) as Box<dyn rustls::sign::Signer>)
        }

        fn algorithm(&self) -> Alg {
            self.0
        }
    }

    const ECDSA: &[SignatureScheme] = &[SignatureScheme::ECDSA_NISTP256_SHA256];
    const RSA: &[SignatureScheme] = &[SignatureScheme::RSA_PSS_SHA256];
    const BOTH: &[SignatureScheme] = &[
        SignatureScheme::RSA_PSS_SHA256,
        SignatureScheme::ECDSA_NISTP256_SHA256,
    ];

    /// Certificates whose DER is one byte `i` (not a certificate at all)
    /// with the key types and names given: the choice uses only the names
    /// read at load and what the key says it can sign.
    fn typed(all: &[(Alg, &[&str])]) -> ByName {
        let keys = all
            .iter()
            .enumerate()
            .map(|(i, (alg, names))| Served {
                key: Arc::new(CertifiedKey::new(
                    vec![CertificateDer::from(vec![i as u8])],
                    Arc::new(FakeKey(*alg)),
                )),
                names: names.iter().map(|n| n.to_string()).collect(),
                file: format!("{i}.pem"),
            })
            .collect();
        ByName {
            keys,
            strict: false,
        }
    }

    /// ECDSA certificates with the names given.
    fn by_name(all: &[&[&str]]) -> ByName {
        let all: Vec<(Alg, &[&str])> = all.iter().map(|n| (Alg::ECDSA, *n)).collect();
        typed(&all)
    }

    fn chosen(certs: &ByName, name: &str) -> Option<u8> {
        chosen_for(certs, name, ECDSA)
    }

    fn chosen_for(certs: &ByName, name: &str, schemes: &[SignatureScheme]) -> Option<u8> {
        certs.for_name(name, schemes).map(|k| k.cert[0].as_ref()[0])
    }

    /// An RSA and an ECDSA certificate for one name: each client gets the
    /// one it can sign with, the first when it can use both (or neither);
    /// the default likewise among the certificates of the first's name.
    #[test]
    fn the_key_type_the_client_can_use_is_chosen() {
        let certs = typed(&[
            (Alg::RSA, &["a.test"]),
            (Alg::ECDSA, &["a.test", "b.test"]),
            (Alg::ECDSA, &["c.test"]),
        ]);
        assert_eq!(chosen_for(&certs, "a.test", RSA), Some(0));
        assert_eq!(chosen_for(&certs, "a.test", ECDSA), Some(1));
        assert_eq!(chosen_for(&certs, "a.test", BOTH), Some(0));
        assert_eq!(chosen_for(&certs, "a.test", &[]), Some(0));
        assert_eq!(chosen_for(&certs, "b.test", RSA), Some(1));
        assert_eq!(chosen_for(&certs, "c.test", ECDSA), Some(2));
        let default = |schemes| certs.default_for(schemes).map(|k| k.cert[0].as_ref()[0]);
        assert_eq!(default(RSA), Some(0));
        assert_eq!(default(ECDSA), Some(1));
        assert_eq!(default(&[]), Some(0));
    }

    /// Two certificates of one key type for one name: the later one is
    /// never served there, and the load says so once per pair; an RSA
    /// and an ECDSA one for a name are not warned of.
    #[test]
    fn two_certificates_of_one_type_for_a_name_are_warned_of() {
        let certs = typed(&[
            (Alg::ECDSA, &["a.test", "*.w.test"]),
            (Alg::RSA, &["a.test"]),
            (Alg::ECDSA, &["A.test", "x.w.test", "other.test"]),
            (Alg::ECDSA, &["*.a.test"]),
        ]);
        assert_eq!(
            certs.shadowed(),
            [
                "TLS certificates 0.pem and 2.pem are both ECDSA for A.test, x.w.test: \
              only 0.pem is served there"
            ]
        );
        assert!(by_name(&[&["a.test"], &["b.test"]]).shadowed().is_empty());
    }

    /// The error rustls gives when a strict resolver chooses nothing is
    /// the one the handshake turns into `unrecognized_name`; a name a
    /// certificate covers goes past the choice.
    #[test]
    fn a_strict_choice_of_nothing_is_the_error_the_handshake_expects() {
        let hello_for = |name: &str| {
            let mut certs = by_name(&[&["a.test"]]);
            certs.strict = true;
            let provider = Arc::new(crate::tls_term::crypto::provider());
            let server = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_cert_resolver(Arc::new(certs));
            let client = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth();
            let name = rustls_pki_types::ServerName::try_from(name.to_string()).unwrap();
            let mut client = rustls::ClientConnection::new(Arc::new(client), name).unwrap();
            let mut server = rustls::ServerConnection::new(Arc::new(server)).unwrap();
            let mut bytes = Vec::new();
            client.write_tls(&mut bytes).unwrap();
            server.read_tls(&mut &bytes[..]).unwrap();
            server.process_new_packets().err()
        };
        let refused = rustls::Error::General(NO_CERTIFICATE.into());
        assert_eq!(hello_for("other.test"), Some(refused.clone()));
        // An address: no server name sent at all.
        assert_eq!(hello_for("127.0.0.1"), Some(refused.clone()));
        // Chosen, then the fake key cannot sign: another error.
        assert_ne!(hello_for("a.test"), Some(refused));
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
