//! The PROXY protocol header as values: its versions, what it says, why one
//! is refused, and [`encode`], which writes one for a backend.
//!
//! # Threads
//!
//! Plain values and pure functions, used on the workers and by the health
//! checker. No C counterpart.

use std::fmt;
use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::time::Duration;

/// The longest version 1 header, `\r\n` included, as the specification fixes
/// it (`PROXY UNKNOWN` followed by two full-length IPv6 addresses and ports).
pub const V1_MAX_LEN: usize = 107;

/// The longest version 2 header accepted: its 16 fixed bytes plus at most
/// 520 bytes of addresses and TLVs.
///
/// The format allows up to 65535 bytes after the fixed part, but nothing this
/// balancer would do with a header needs that many: the largest address
/// block (two UNIX paths) is 216 bytes, leaving 304 for TLVs. 536 is also
/// TCP's default segment size (RFC 879), so a sender that writes its header
/// at once gets it there in one segment. A longer header is refused rather
/// than buffered, so a client cannot make a worker hold or wait for 64 KiB.
pub const V2_MAX_LEN: usize = 536;

/// The largest of the two bounds: what [`read_header`](super::read_header) may have to hold.
pub const MAX_LEN: usize = if V1_MAX_LEN > V2_MAX_LEN {
    V1_MAX_LEN
} else {
    V2_MAX_LEN
};

/// The 12 bytes that open every version 2 header. They were chosen so that no
/// text protocol begins with them (a `\0` inside, `\r\n\r\n` first).
pub const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";

/// How a version 1 header begins.
pub(super) const V1_PREFIX: &[u8] = b"PROXY ";

/// The fixed part of a version 2 header: signature, version and command,
/// family and transport, length.
pub(super) const V2_FIXED_LEN: usize = 16;

/// Which version of the protocol to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Version {
    /// The text line, `PROXY TCP4 ...\r\n`: readable in a packet capture,
    /// understood by every implementation (nginx, Postfix, ...).
    V1,
    /// The binary block: fixed offsets, cheaper to parse, able to carry TLVs.
    V2,
}

impl FromStr for Version {
    type Err = ParseError;

    /// Parses `v1` or `v2` (any case), as `--send-proxy` and the
    /// configuration file's `"send_proxy"` write it.
    fn from_str(text: &str) -> Result<Version, ParseError> {
        match text.trim().to_ascii_lowercase().as_str() {
            "v1" => Ok(Version::V1),
            "v2" => Ok(Version::V2),
            _ => Err(ParseError(format!(
                "'{text}': unknown PROXY protocol version (known: v1, v2)"
            ))),
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Version::V1 => "v1",
            Version::V2 => "v2",
        })
    }
}

/// What a header says about the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Header {
    /// No address is carried: the connection is the sender's own (a health
    /// check: version 2's LOCAL command), or its addresses are not TCP over
    /// IP (version 1's `PROXY UNKNOWN`, version 2's UNSPEC, UNIX or datagram
    /// families). The receiver uses the connection's real endpoints.
    Local,
    /// The client's connection as the sender saw it.
    Proxy {
        /// The client's address and port.
        source: SocketAddr,
        /// The address and port the client connected to.
        destination: SocketAddr,
    },
}

/// What [`parse`](fn@super::parse) found at the start of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parsed {
    /// The buffer is a strict prefix of a header that may still be valid: read
    /// more and parse again. Never returned once a bound is reached: by then
    /// the header is either complete or an error.
    Incomplete,
    /// A whole header.
    Complete {
        /// What it says.
        header: Header,
        /// How many bytes of the buffer it took: what follows is the client's.
        len: usize,
    },
}

/// Why a header was refused, or could not be read.
#[derive(Debug)]
pub enum HeaderError {
    /// The first bytes are neither `PROXY ` nor the version 2 signature: the
    /// peer is not sending a PROXY protocol header at all.
    NoSignature,
    /// The header is longer than the bound for its version.
    TooLong {
        /// The version the header claims to be.
        version: Version,
        /// The bound, in bytes ([`V1_MAX_LEN`] or [`V2_MAX_LEN`]).
        limit: usize,
    },
    /// A version 1 line that does not follow the grammar; the text says where.
    V1Syntax(String),
    /// A version 2 header whose version nibble is not 2.
    V2Version(u8),
    /// A version 2 command that is neither LOCAL (0) nor PROXY (1).
    V2Command(u8),
    /// A version 2 family and transport byte outside the specification.
    V2Family(u8),
    /// A version 2 length too short for the addresses of its family.
    V2Length {
        /// The length the header declares (after its 16 fixed bytes).
        declared: usize,
        /// The size of the family's address block.
        needed: usize,
    },
    /// A version 2 TLV that does not fit inside the header's length.
    V2Tlv {
        /// Where the TLV starts, counted from the start of the header.
        offset: usize,
    },
    /// The peer closed the connection before the header was complete.
    Closed {
        /// How many bytes of the header had arrived.
        received: usize,
    },
    /// The deadline passed before the header was complete.
    Timeout {
        /// How many bytes of the header had arrived.
        received: usize,
        /// The time allowed.
        timeout: Duration,
    },
    /// The socket failed (a reset, for instance).
    Io(io::Error),
}

impl fmt::Display for HeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeaderError::NoSignature => {
                f.write_str("not a PROXY protocol header (neither 'PROXY ' nor the v2 signature)")
            }
            HeaderError::TooLong { version, limit } => {
                write!(f, "PROXY protocol {version} header longer than {limit} bytes")
            }
            HeaderError::V1Syntax(what) => write!(f, "malformed PROXY protocol v1 header: {what}"),
            HeaderError::V2Version(version) => {
                write!(f, "PROXY protocol v2 header with version {version}, expected 2")
            }
            HeaderError::V2Command(command) => write!(
                f,
                "PROXY protocol v2 header with command {command}, expected LOCAL (0) or PROXY (1)"
            ),
            HeaderError::V2Family(byte) => write!(
                f,
                "PROXY protocol v2 header with family and transport byte {byte:#04x}, not a valid pair"
            ),
            HeaderError::V2Length { declared, needed } => write!(
                f,
                "PROXY protocol v2 header of length {declared}, too short for its {needed}-byte address block"
            ),
            HeaderError::V2Tlv { offset } => write!(
                f,
                "PROXY protocol v2 TLV at byte {offset} runs past the end of the header"
            ),
            HeaderError::Closed { received } => write!(
                f,
                "peer closed the connection after {received} bytes of a PROXY protocol header"
            ),
            HeaderError::Timeout { received, timeout } => write!(
                f,
                "no complete PROXY protocol header within {timeout:?} ({received} bytes received)"
            ),
            HeaderError::Io(err) => write!(f, "reading a PROXY protocol header: {err}"),
        }
    }
}

impl std::error::Error for HeaderError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            HeaderError::Io(err) => Some(err),
            _ => None,
        }
    }
}

/// A `--send-proxy` or `--accept-proxy-from` value that does not parse; the
/// message says what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError(pub(super) String);

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ParseError {}

/// Builds the header that tells a backend about `header`, in `version`.
///
/// Addresses are written in the narrowest family that holds both ends: an
/// IPv4-mapped IPv6 address (`::ffff:192.0.2.1`, how a dual-stack socket
/// shows an IPv4 client) is written as IPv4 when the other end is IPv4 or
/// mapped too, so the backend sees the client's IPv4 address. When one end
/// is IPv4 and the other a real IPv6 address, both are written as IPv6, the
/// IPv4 one mapped, since a header has one family for both.
pub fn encode(version: Version, header: &Header) -> Vec<u8> {
    // Room for the longest version 1 line, so that writing it never grows
    // the vector (a `realloc` deep in the formatting, on a worker's small
    // stack); version 2's TCP headers take at most 52 bytes.
    let mut out = Vec::with_capacity(V1_MAX_LEN);
    match version {
        Version::V1 => encode_v1(header, &mut out),
        Version::V2 => encode_v2(header, &mut out),
    }
    out
}

/// The two ends of a connection in one family, as [`encode`] writes them.
pub(super) enum Ends {
    V4([(Ipv4Addr, u16); 2]),
    V6([(Ipv6Addr, u16); 2]),
}

pub(super) fn ends(source: SocketAddr, destination: SocketAddr) -> Ends {
    fn as_v4(ip: IpAddr) -> Option<Ipv4Addr> {
        match ip {
            IpAddr::V4(v4) => Some(v4),
            IpAddr::V6(v6) => v6.to_ipv4_mapped(),
        }
    }
    fn as_v6(ip: IpAddr) -> Ipv6Addr {
        match ip {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        }
    }
    match (as_v4(source.ip()), as_v4(destination.ip())) {
        (Some(src), Some(dst)) => Ends::V4([(src, source.port()), (dst, destination.port())]),
        _ => Ends::V6([
            (as_v6(source.ip()), source.port()),
            (as_v6(destination.ip()), destination.port()),
        ]),
    }
}

fn encode_v1(header: &Header, out: &mut Vec<u8>) {
    // Written straight into `out`; writing into a `Vec` cannot fail.
    let _ = match *header {
        Header::Local => out.write_all(b"PROXY UNKNOWN\r\n"),
        Header::Proxy {
            source,
            destination,
        } => match ends(source, destination) {
            Ends::V4([(src, sport), (dst, dport)]) => {
                write!(out, "PROXY TCP4 {src} {dst} {sport} {dport}\r\n")
            }
            Ends::V6([(src, sport), (dst, dport)]) => {
                write!(out, "PROXY TCP6 {src} {dst} {sport} {dport}\r\n")
            }
        },
    };
}

/// Version 2's command nibbles (the high nibble is the version, 2).
pub(super) const V2_LOCAL: u8 = 0x20;
pub(super) const V2_PROXY: u8 = 0x21;
/// Version 2's family (high nibble) and transport (low nibble) pairs.
pub(super) const V2_UNSPEC: u8 = 0x00;
pub(super) const V2_TCP4: u8 = 0x11;
pub(super) const V2_TCP6: u8 = 0x21;

fn encode_v2(header: &Header, out: &mut Vec<u8>) {
    out.extend_from_slice(&V2_SIGNATURE);
    let Header::Proxy {
        source,
        destination,
    } = *header
    else {
        out.extend_from_slice(&[V2_LOCAL, V2_UNSPEC, 0, 0]);
        return;
    };
    match ends(source, destination) {
        Ends::V4([(src, sport), (dst, dport)]) => {
            out.extend_from_slice(&[V2_PROXY, V2_TCP4, 0, 12]);
            out.extend_from_slice(&src.octets());
            out.extend_from_slice(&dst.octets());
            out.extend_from_slice(&sport.to_be_bytes());
            out.extend_from_slice(&dport.to_be_bytes());
        }
        Ends::V6([(src, sport), (dst, dport)]) => {
            out.extend_from_slice(&[V2_PROXY, V2_TCP6, 0, 36]);
            out.extend_from_slice(&src.octets());
            out.extend_from_slice(&dst.octets());
            out.extend_from_slice(&sport.to_be_bytes());
            out.extend_from_slice(&dport.to_be_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy_protocol::samples::{complete, proxy};

    #[test]
    fn mapped_addresses_are_written_as_ipv4() {
        let header = proxy("[::ffff:192.0.2.1]:5000", "[::ffff:10.0.0.1]:80");
        assert_eq!(
            encode(Version::V1, &header),
            b"PROXY TCP4 192.0.2.1 10.0.0.1 5000 80\r\n"
        );
        let v2 = encode(Version::V2, &header);
        assert_eq!(&v2[13..16], b"\x11\x00\x0c");
        assert_eq!(complete(&v2).0, proxy("192.0.2.1:5000", "10.0.0.1:80"));
        // One end mapped, the other plain IPv4: still IPv4.
        let half = proxy("[::ffff:192.0.2.1]:5000", "10.0.0.1:80");
        assert_eq!(
            encode(Version::V1, &half),
            b"PROXY TCP4 192.0.2.1 10.0.0.1 5000 80\r\n"
        );
    }

    #[test]
    fn mixed_families_are_written_as_ipv6() {
        let header = proxy("192.0.2.1:5000", "[2001:db8::2]:80");
        assert_eq!(
            encode(Version::V1, &header),
            b"PROXY TCP6 ::ffff:192.0.2.1 2001:db8::2 5000 80\r\n"
        );
        let v2 = encode(Version::V2, &header);
        assert_eq!(v2[13], 0x21);
        assert_eq!(
            complete(&v2).0,
            proxy("[::ffff:192.0.2.1]:5000", "[2001:db8::2]:80")
        );
    }

    #[test]
    fn version_from_str() {
        assert_eq!("v1".parse::<Version>().unwrap(), Version::V1);
        assert_eq!("V2".parse::<Version>().unwrap(), Version::V2);
        let err = "v3".parse::<Version>().unwrap_err().to_string();
        assert!(err.contains("'v3'") && err.contains("v1, v2"), "{err}");
        assert_eq!(Version::V2.to_string(), "v2");
    }
}
