//! The PROXY protocol, versions 1 and 2: telling a backend who the client is.
//!
//! A layer-4 proxy opens its own connection to the backend, so the backend
//! sees the balancer's address as the peer. The PROXY protocol (HAProxy's
//! `proxy-protocol.txt`) sends one header before the client's first byte:
//! a text line in version 1, a binary block in version 2. One file per
//! part: `codec` (types, errors, [`encode`]), `parse` ([`parse`], bounded
//! by [`V1_MAX_LEN`] and [`V2_MAX_LEN`]), `read` ([`read_header`], which
//! takes a header off a socket and not one byte more), `cidr` ([`CidrList`],
//! the peers trusted to send one), `accept` and `send` (the worker's side
//! of `--accept-proxy` and `--send-proxy`).
//!
//! # Threads
//!
//! All of it runs on the worker that serves the connection (the accept
//! loop never waits on a client's bytes); the only shared state is the
//! refusal log of [`AcceptProxy`], behind a lock held for a lookup.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C's backends see the balancer's address.

mod accept;
mod cidr;
mod codec;
mod parse;
mod read;
mod send;

pub(crate) use accept::{receive, Origin, Refusal};
pub use accept::{AcceptProxy, REFUSAL_LOG_WINDOW};
pub use cidr::{Cidr, CidrList};
pub use codec::{
    encode, Header, HeaderError, ParseError, Parsed, Version, MAX_LEN, V1_MAX_LEN, V2_MAX_LEN,
    V2_SIGNATURE,
};
pub use parse::parse;
pub use read::read_header;
pub(crate) use send::send;

/// What the unit tests of these modules share: addresses and headers
/// written as text, and a header parsed whole.
#[cfg(test)]
mod samples {
    use std::net::SocketAddr;

    use super::{parse, Header, Parsed};

    /// `text` as an address.
    pub(super) fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    /// A PROXY header from `source` to `destination`.
    pub(super) fn proxy(source: &str, destination: &str) -> Header {
        Header::Proxy {
            source: addr(source),
            destination: addr(destination),
        }
    }

    /// `buf` parsed, which must hold a whole header: it and its length.
    pub(super) fn complete(buf: &[u8]) -> (Header, usize) {
        match parse(buf) {
            Ok(Parsed::Complete { header, len }) => (header, len),
            other => panic!("expected a complete header, got {other:?}"),
        }
    }
}
