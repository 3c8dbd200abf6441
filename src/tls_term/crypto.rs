//! The cryptography under rustls: one provider, AWS-LC (`aws-lc-rs`), for
//! the server side, the re-encryption's and etcd's client side, the
//! certificate checks at load and the ticket keys.
//!
//! Why AWS-LC and not *ring* (measured with `KEY=rsa|ec
//! scripts/bench-tls.sh`, three interleaved rounds, docs/tls.md "Which
//! cryptography"): an RSA-2048 handshake costs 712-724 µs of CPU against *ring*'s
//! 949-1,020 (HAProxy's 872-902); an ECDSA P-256 one costs the same with
//! both (299-351 µs against 306-326). AWS-LC also signs with P-521 keys,
//! which *ring* refuses. Its price: a C library compiled with the crate
//! (gcc, no CMake), and 6 KiB more resident memory per idle TLS
//! connection (36.7 KiB against 30.1).
//!
//! # Threads
//!
//! Called by the thread that loads or reloads the settings; the provider
//! is then shared, read-only, by the workers' handshakes.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C proxies plain TCP only.

use rustls::crypto::CryptoProvider;

/// The provider every rustls configuration of the process is built with.
pub fn provider() -> CryptoProvider {
    rustls::crypto::aws_lc_rs::default_provider()
}

/// A ticket maker for TLS 1.2 and 1.3 session tickets, its keys rotated
/// by rustls.
pub(super) fn ticketer(
) -> Result<std::sync::Arc<dyn rustls::server::ProducesTickets>, rustls::Error> {
    rustls::crypto::aws_lc_rs::Ticketer::new()
}
