//! The PROXY protocol, versions 1 and 2: telling a backend who the client is.
//!
//! A layer-4 proxy opens its own connection to the backend, so the backend
//! sees the balancer's address as the peer, not the client's. The PROXY
//! protocol (HAProxy's `proxy-protocol.txt`) fixes that with one header that
//! the proxy sends before the client's first byte: version 1 is a line of
//! text (`PROXY TCP4 192.0.2.1 198.51.100.7 51234 80\r\n`), version 2 a
//! binary block behind a 12-byte signature. This module is the protocol
//! alone, with no socket policy:
//!
//! - [`encode`] builds the header to send to a backend (`--send-proxy v1|v2`,
//!   [`Version`]).
//! - [`parse`] reads one from a buffer; it is bounded ([`V1_MAX_LEN`],
//!   [`V2_MAX_LEN`]) and says [`Parsed::Incomplete`] when more bytes are
//!   needed.
//! - [`read_header`] takes one off a client socket, and not one byte more,
//!   so the client's own first bytes stay in the socket for the proxy.
//! - [`CidrList`] says which peers are trusted to send a header
//!   (`--accept-proxy-from`, [`CidrList::loopback`] by default): a header from
//!   anyone else would let any client claim any address.
//!
//! Everything here runs on the worker thread that serves the connection:
//! waiting for a header can take up to its timeout, and the accept loop must
//! never wait on one client, so it hands the socket over first. Nothing is
//! shared between threads; the functions hold no state.
//!
//! # Corresponds to the C article
//!
//! No C counterpart. The C's `proxy_function()` sends the client's bytes
//! only, so the backend sees the balancer's address and never the client's.

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::str::FromStr;
use std::time::{Duration, Instant};

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

/// The largest of the two bounds: what [`read_header`] may have to hold.
pub const MAX_LEN: usize = if V1_MAX_LEN > V2_MAX_LEN {
    V1_MAX_LEN
} else {
    V2_MAX_LEN
};

/// The 12 bytes that open every version 2 header. They were chosen so that no
/// text protocol begins with them (a `\0` inside, `\r\n\r\n` first).
pub const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";

/// How a version 1 header begins.
const V1_PREFIX: &[u8] = b"PROXY ";

/// The fixed part of a version 2 header: signature, version and command,
/// family and transport, length.
const V2_FIXED_LEN: usize = 16;

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

/// What [`parse`] found at the start of a buffer.
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
pub struct ParseError(String);

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
    let mut out = Vec::with_capacity(64);
    match version {
        Version::V1 => encode_v1(header, &mut out),
        Version::V2 => encode_v2(header, &mut out),
    }
    out
}

/// The two ends of a connection in one family, as [`encode`] writes them.
enum Ends {
    V4([(Ipv4Addr, u16); 2]),
    V6([(Ipv6Addr, u16); 2]),
}

fn ends(source: SocketAddr, destination: SocketAddr) -> Ends {
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
    let line = match *header {
        Header::Local => "PROXY UNKNOWN\r\n".to_string(),
        Header::Proxy {
            source,
            destination,
        } => match ends(source, destination) {
            Ends::V4([(src, sport), (dst, dport)]) => {
                format!("PROXY TCP4 {src} {dst} {sport} {dport}\r\n")
            }
            Ends::V6([(src, sport), (dst, dport)]) => {
                format!("PROXY TCP6 {src} {dst} {sport} {dport}\r\n")
            }
        },
    };
    out.extend_from_slice(line.as_bytes());
}

/// Version 2's command nibbles (the high nibble is the version, 2).
const V2_LOCAL: u8 = 0x20;
const V2_PROXY: u8 = 0x21;
/// Version 2's family (high nibble) and transport (low nibble) pairs.
const V2_UNSPEC: u8 = 0x00;
const V2_TCP4: u8 = 0x11;
const V2_TCP6: u8 = 0x21;

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

/// Reads the PROXY protocol header, version 1 or 2, at the start of `buf`.
///
/// Only the header is looked at: whatever follows it (the client's own
/// bytes) is left alone, and [`Parsed::Complete`]'s `len` says where it
/// starts. Version 2 TLVs are checked to fit inside the header and then
/// skipped (their CRC32C, if any, is not verified). Version 2's LOCAL
/// command, UNSPEC family, UNIX family and datagram transports give
/// [`Header::Local`], as the specification lets a receiver that does not
/// support them do.
///
/// # Errors
///
/// A [`HeaderError`] naming what is wrong, as soon as the bytes seen can no
/// longer begin a valid header, including when a bound is exceeded.
pub fn parse(buf: &[u8]) -> Result<Parsed, HeaderError> {
    match buf.first() {
        None => Ok(Parsed::Incomplete),
        Some(b'P') => parse_v1(buf),
        Some(b'\r') => parse_v2(buf),
        Some(_) => Err(HeaderError::NoSignature),
    }
}

/// `buf` begins with `prefix`, or is itself the start of `prefix`.
fn matches_prefix(buf: &[u8], prefix: &[u8]) -> bool {
    let n = buf.len().min(prefix.len());
    buf[..n] == prefix[..n]
}

fn parse_v1(buf: &[u8]) -> Result<Parsed, HeaderError> {
    if !matches_prefix(buf, V1_PREFIX) {
        return Err(HeaderError::NoSignature);
    }
    let window = &buf[..buf.len().min(V1_MAX_LEN)];
    let Some(end) = window.windows(2).position(|pair| pair == b"\r\n") else {
        if buf.len() >= V1_MAX_LEN {
            return Err(HeaderError::TooLong {
                version: Version::V1,
                limit: V1_MAX_LEN,
            });
        }
        // Refuse an unknown protocol as soon as its word is complete, so
        // that a client sending something else is not waited for.
        if let Some(rest) = buf.get(V1_PREFIX.len()..) {
            if let Some(word_end) = rest.iter().position(|&b| matches!(b, b' ' | b'\r' | b'\n')) {
                let word = &rest[..word_end];
                check_v1_protocol(word)?;
                // No `\r\n` yet, so a `\n` here has no `\r` before it: no
                // TCP4 or TCP6 line holds one. Refuse it now rather than
                // wait the whole timeout for a `\r\n` that a client ending
                // its lines with `\n` alone never sends. (An UNKNOWN line is
                // to be ignored up to its `\r\n`, so that one is waited for.)
                if word != b"UNKNOWN" && window.contains(&b'\n') {
                    return Err(HeaderError::V1Syntax(
                        "a line ending in \\n without \\r (it must end in \\r\\n)".to_string(),
                    ));
                }
            }
        }
        return Ok(Parsed::Incomplete);
    };
    let header = parse_v1_line(&buf[V1_PREFIX.len().min(end)..end])?;
    Ok(Parsed::Complete {
        header,
        len: end + 2,
    })
}

fn check_v1_protocol(word: &[u8]) -> Result<(), HeaderError> {
    match word {
        b"TCP4" | b"TCP6" | b"UNKNOWN" => Ok(()),
        _ => Err(HeaderError::V1Syntax(format!(
            "protocol '{}', expected TCP4, TCP6 or UNKNOWN",
            String::from_utf8_lossy(word)
        ))),
    }
}

/// Parses what follows `PROXY ` up to (not including) the `\r\n`.
fn parse_v1_line(line: &[u8]) -> Result<Header, HeaderError> {
    let syntax = HeaderError::V1Syntax;
    let protocol_end = line.iter().position(|&b| b == b' ').unwrap_or(line.len());
    let protocol = &line[..protocol_end];
    check_v1_protocol(protocol)?;
    if protocol == b"UNKNOWN" {
        // "The receiver must ignore anything presented before the CRLF."
        return Ok(Header::Local);
    }
    let text = std::str::from_utf8(line).map_err(|_| syntax("not ASCII text".to_string()))?;
    let fields: Vec<&str> = text.split(' ').collect();
    let [_, src, dst, sport, dport] = fields[..] else {
        return Err(syntax(format!(
            "expected 5 fields separated by single spaces (protocol, source, destination, \
             source port, destination port), found {}",
            fields.len()
        )));
    };
    let ip = |field: &str, which: &str| -> Result<IpAddr, HeaderError> {
        let parsed = if protocol == b"TCP4" {
            field.parse::<Ipv4Addr>().map(IpAddr::V4).ok()
        } else {
            field.parse::<Ipv6Addr>().map(IpAddr::V6).ok()
        };
        parsed.ok_or_else(|| {
            syntax(format!(
                "{which} address '{field}' is not an {} address",
                if protocol == b"TCP4" { "IPv4" } else { "IPv6" }
            ))
        })
    };
    let port = |field: &str, which: &str| -> Result<u16, HeaderError> {
        // `u16::from_str` would also take a leading '+'.
        if field.is_empty() || field.len() > 5 || !field.bytes().all(|b| b.is_ascii_digit()) {
            return Err(syntax(format!(
                "{which} port '{field}' is not a number 0..65535"
            )));
        }
        field
            .parse::<u16>()
            .map_err(|_| syntax(format!("{which} port '{field}' is above 65535")))
    };
    Ok(Header::Proxy {
        source: SocketAddr::new(ip(src, "source")?, port(sport, "source")?),
        destination: SocketAddr::new(ip(dst, "destination")?, port(dport, "destination")?),
    })
}

fn parse_v2(buf: &[u8]) -> Result<Parsed, HeaderError> {
    if !matches_prefix(buf, &V2_SIGNATURE) {
        return Err(HeaderError::NoSignature);
    }
    // Check each fixed byte as soon as it is there, so garbage is refused
    // without waiting for the rest.
    let Some(&version_command) = buf.get(12) else {
        return Ok(Parsed::Incomplete);
    };
    if version_command >> 4 != 2 {
        return Err(HeaderError::V2Version(version_command >> 4));
    }
    let command = version_command & 0x0f;
    if command > 1 {
        return Err(HeaderError::V2Command(command));
    }
    let Some(&family) = buf.get(13) else {
        return Ok(Parsed::Incomplete);
    };
    // The size of the family's address block; None where addresses are to
    // be ignored (UNSPEC), and so is the whole block.
    let block = match family {
        V2_UNSPEC => None,
        0x11 | 0x12 => Some(12),
        0x21 | 0x22 => Some(36),
        0x31 | 0x32 => Some(216),
        // "The receiver must ... discard the protocol block including the
        // family which is ignored" for LOCAL.
        _ if command == 0 => None,
        _ => return Err(HeaderError::V2Family(family)),
    };
    let Some(length) = buf.get(14..16) else {
        return Ok(Parsed::Incomplete);
    };
    let declared = usize::from(u16::from_be_bytes([length[0], length[1]]));
    let total = V2_FIXED_LEN + declared;
    if total > V2_MAX_LEN {
        return Err(HeaderError::TooLong {
            version: Version::V2,
            limit: V2_MAX_LEN,
        });
    }
    let Some(payload) = buf.get(V2_FIXED_LEN..total) else {
        return Ok(Parsed::Incomplete);
    };
    let complete = |header| Ok(Parsed::Complete { header, len: total });
    let Some(block) = block else {
        return complete(Header::Local);
    };
    if declared < block {
        if command == 0 {
            return complete(Header::Local);
        }
        return Err(HeaderError::V2Length {
            declared,
            needed: block,
        });
    }
    check_tlvs(&payload[block..], V2_FIXED_LEN + block)?;
    let header = match (command, family) {
        (1, V2_TCP4) => {
            let ip = |at: usize| {
                Ipv4Addr::new(
                    payload[at],
                    payload[at + 1],
                    payload[at + 2],
                    payload[at + 3],
                )
            };
            let port = |at: usize| u16::from_be_bytes([payload[at], payload[at + 1]]);
            Header::Proxy {
                source: SocketAddr::new(IpAddr::V4(ip(0)), port(8)),
                destination: SocketAddr::new(IpAddr::V4(ip(4)), port(10)),
            }
        }
        (1, V2_TCP6) => {
            let ip = |at: usize| {
                let mut octets = [0u8; 16];
                octets.copy_from_slice(&payload[at..at + 16]);
                Ipv6Addr::from(octets)
            };
            let port = |at: usize| u16::from_be_bytes([payload[at], payload[at + 1]]);
            Header::Proxy {
                source: SocketAddr::new(IpAddr::V6(ip(0)), port(32)),
                destination: SocketAddr::new(IpAddr::V6(ip(16)), port(34)),
            }
        }
        _ => Header::Local,
    };
    complete(header)
}

/// Checks that `tlvs` is a whole sequence of type (1 byte), length (2 bytes,
/// big-endian), value; `offset` is where it starts in the header, for the
/// error.
fn check_tlvs(mut tlvs: &[u8], mut offset: usize) -> Result<(), HeaderError> {
    while !tlvs.is_empty() {
        let Some(length) = tlvs.get(1..3) else {
            return Err(HeaderError::V2Tlv { offset });
        };
        let size = 3 + usize::from(u16::from_be_bytes([length[0], length[1]]));
        let Some(rest) = tlvs.get(size..) else {
            return Err(HeaderError::V2Tlv { offset });
        };
        tlvs = rest;
        offset += size;
    }
    Ok(())
}

/// Reads one PROXY protocol header from `stream`, consuming exactly its bytes.
///
/// The client's first bytes often arrive in the same segment as the header
/// (a sender writes both at once), and they belong to the proxy, not to this
/// function. So it never reads blindly: it *peeks* (`recv` with `MSG_PEEK`)
/// at what is in the socket, asks [`parse`] how much of it is header, and
/// consumes that much only. Every byte consumed is known to be part of the
/// header, so once the header is complete nothing beyond it has been taken,
/// and while it is incomplete the socket is left empty, so `poll(2)` sleeps
/// until more arrives instead of reporting the same peeked bytes again.
///
/// It waits with `poll(2)` until the header is complete, the bound is
/// exceeded, the peer closes, or `timeout` has passed since the call: a
/// client that connects and says nothing costs a worker `timeout`, no more.
/// The socket stays blocking (`MSG_DONTWAIT` is used per call), and its own
/// read timeout is neither used nor changed.
///
/// # Errors
///
/// [`HeaderError::Timeout`], [`HeaderError::Closed`], [`HeaderError::Io`],
/// or what [`parse`] refuses.
pub fn read_header(stream: &TcpStream, timeout: Duration) -> Result<Header, HeaderError> {
    let deadline = Instant::now() + timeout;
    let fd = stream.as_raw_fd();
    let mut buf = [0u8; MAX_LEN];
    // Bytes of the header consumed from the socket so far, in buf[..have].
    let mut have = 0;
    loop {
        if let Parsed::Complete { header, .. } = parse(&buf[..have])? {
            return Ok(header);
        }
        // `parse` says Incomplete only below its bounds, and the buffer
        // holds the larger one, so there is always room; this only keeps a
        // broken promise from becoming a zero-length read that looks like a
        // close.
        let room = &mut buf[have..];
        if room.is_empty() {
            let (version, limit) = if buf[0] == b'P' {
                (Version::V1, V1_MAX_LEN)
            } else {
                (Version::V2, V2_MAX_LEN)
            };
            return Err(HeaderError::TooLong { version, limit });
        }
        let peeked = match recv(fd, room, libc::MSG_PEEK | libc::MSG_DONTWAIT) {
            Ok(0) => return Err(HeaderError::Closed { received: have }),
            Ok(n) => n,
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                wait_readable(fd, deadline, have, timeout)?;
                continue;
            }
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(HeaderError::Io(err)),
        };
        // How many of the peeked bytes are header: all of them while it is
        // incomplete, up to its end once it is complete.
        let take = match parse(&buf[..have + peeked])? {
            Parsed::Complete { len, .. } => len - have,
            Parsed::Incomplete => peeked,
        };
        // The bytes are in the socket (just peeked), so this does not wait;
        // it may in principle take fewer, and the loop then goes round again.
        match recv(fd, &mut buf[have..have + take], libc::MSG_DONTWAIT) {
            Ok(0) => return Err(HeaderError::Closed { received: have }),
            Ok(n) => have += n,
            Err(err)
                if matches!(
                    err.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) => {}
            Err(err) => return Err(HeaderError::Io(err)),
        }
    }
}

/// `recv(2)` into `buf` with `flags`.
fn recv(fd: libc::c_int, buf: &mut [u8], flags: libc::c_int) -> io::Result<usize> {
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the whole
    // call, and `fd` is an open socket borrowed from a live `TcpStream`.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), flags) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        // Non-negative and at most buf.len(), so it fits.
        Ok(n as usize)
    }
}

/// Waits until `fd` is readable (or hung up, or in error: the next `recv`
/// then says which) or `deadline` passes.
fn wait_readable(
    fd: libc::c_int,
    deadline: Instant,
    received: usize,
    timeout: Duration,
) -> Result<(), HeaderError> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(HeaderError::Timeout { received, timeout });
        }
        // Round up, so a wait of 0.3 ms does not become poll(0) and spin.
        let millis = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
        let mut pollfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, and the count says one.
        match unsafe { libc::poll(&mut pollfd, 1, millis) } {
            0 => continue, // the deadline check above ends it
            n if n > 0 => return Ok(()),
            _ => {
                let err = io::Error::last_os_error();
                if err.kind() != io::ErrorKind::Interrupted {
                    return Err(HeaderError::Io(err));
                }
            }
        }
    }
}

/// A block of addresses, `ADDRESS/PREFIX`: `127.0.0.0/8`, `::1/128`.
///
/// The address is kept with its host bits cleared, so `10.1.2.3/8` is
/// `10.0.0.0/8`. An IPv4-mapped IPv6 block (`::ffff:10.0.0.0/104`) is kept
/// as the IPv4 block it stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    /// The first address of the block.
    network: IpAddr,
    /// How many leading bits are fixed: 0..=32 for IPv4, 0..=128 for IPv6.
    prefix: u8,
}

impl Cidr {
    /// The block `network/prefix`, host bits cleared; `None` if `prefix` is
    /// longer than the address.
    pub fn new(network: IpAddr, prefix: u8) -> Option<Cidr> {
        match network {
            IpAddr::V4(v4) if prefix <= 32 => Some(Cidr {
                network: IpAddr::V4(Ipv4Addr::from(u32::from(v4) & mask32(prefix))),
                prefix,
            }),
            IpAddr::V6(v6) if prefix <= 128 => match v6.to_ipv4_mapped() {
                Some(v4) if prefix >= 96 => Cidr::new(IpAddr::V4(v4), prefix - 96),
                _ => Some(Cidr {
                    network: IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask128(prefix))),
                    prefix,
                }),
            },
            _ => None,
        }
    }

    /// Whether `ip` is in the block. An IPv4-mapped IPv6 address
    /// (`::ffff:127.0.0.1`, an IPv4 client on a dual-stack socket) is
    /// compared as the IPv4 address it maps, so IPv4 blocks match it; an IPv6
    /// block never matches an IPv4 client, not even `::/0` (write
    /// `0.0.0.0/0` for those).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            IpAddr::V4(_) => ip,
        };
        match (self.network, ip) {
            (IpAddr::V4(network), IpAddr::V4(ip)) => {
                u32::from(ip) & mask32(self.prefix) == u32::from(network)
            }
            (IpAddr::V6(network), IpAddr::V6(ip)) => {
                u128::from(ip) & mask128(self.prefix) == u128::from(network)
            }
            _ => false,
        }
    }
}

/// The netmask of an IPv4 `/prefix` (`prefix` at most 32).
fn mask32(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
}

/// The netmask of an IPv6 `/prefix` (`prefix` at most 128).
fn mask128(prefix: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0)
}

impl FromStr for Cidr {
    type Err = ParseError;

    /// Parses `ADDRESS/PREFIX`, or a bare address (a block of one: `/32`
    /// or `/128`).
    fn from_str(text: &str) -> Result<Cidr, ParseError> {
        let text = text.trim();
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text, None),
        };
        let network: IpAddr = address.parse().map_err(|_| {
            ParseError(format!(
                "'{text}': '{address}' is not an IPv4 or IPv6 address"
            ))
        })?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(prefix) => prefix
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max && prefix.bytes().all(|b| b.is_ascii_digit()))
                .ok_or_else(|| {
                    ParseError(format!("'{text}': the prefix length must be 0..={max}"))
                })?,
        };
        // The prefix was checked against the family just above.
        Cidr::new(network, prefix)
            .ok_or_else(|| ParseError(format!("'{text}': the prefix length must be 0..={max}")))
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// The peers trusted to send a PROXY protocol header: a list of [`Cidr`]s.
///
/// Only a peer in the list may tell the balancer who the client is; a header
/// from anyone else is refused, since believing it would let any client
/// pass for any address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CidrList(Vec<Cidr>);

impl CidrList {
    /// `127.0.0.0/8` and `::1/128`: this host only, the default of
    /// `--accept-proxy-from`.
    pub fn loopback() -> CidrList {
        CidrList(vec![
            Cidr {
                network: IpAddr::V4(Ipv4Addr::new(127, 0, 0, 0)),
                prefix: 8,
            },
            Cidr {
                network: IpAddr::V6(Ipv6Addr::LOCALHOST),
                prefix: 128,
            },
        ])
    }

    /// Whether `ip` is in any block of the list.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|cidr| cidr.contains(ip))
    }

    /// The blocks, in the order given.
    pub fn cidrs(&self) -> &[Cidr] {
        &self.0
    }
}

impl From<Vec<Cidr>> for CidrList {
    fn from(cidrs: Vec<Cidr>) -> CidrList {
        CidrList(cidrs)
    }
}

impl FromStr for CidrList {
    type Err = ParseError;

    /// Parses a comma-separated list, `127.0.0.0/8, 10.0.0.0/8,::1`; spaces
    /// around the commas are allowed, empty items are not.
    fn from_str(text: &str) -> Result<CidrList, ParseError> {
        if text.trim().is_empty() {
            return Err(ParseError(
                "an empty address list (expected e.g. 127.0.0.0/8,::1/128)".to_string(),
            ));
        }
        text.split(',')
            .map(|item| {
                if item.trim().is_empty() {
                    Err(ParseError(format!("'{text}': an empty item in the list")))
                } else {
                    item.parse()
                }
            })
            .collect::<Result<Vec<Cidr>, ParseError>>()
            .map(CidrList)
    }
}

impl fmt::Display for CidrList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, cidr) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{cidr}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener};
    use std::thread;

    use proptest::prelude::*;

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    fn proxy(source: &str, destination: &str) -> Header {
        Header::Proxy {
            source: addr(source),
            destination: addr(destination),
        }
    }

    fn complete(buf: &[u8]) -> (Header, usize) {
        match parse(buf) {
            Ok(Parsed::Complete { header, len }) => (header, len),
            other => panic!("expected a complete header, got {other:?}"),
        }
    }

    // ---- Known byte vectors -------------------------------------------

    /// A v2 TCP4 header, as HAProxy writes it: 172.19.0.1:42578 → 172.19.0.3:80.
    const V2_TCP4: &[u8] = b"\r\n\r\n\0\r\nQUIT\n\x21\x11\x00\x0c\
        \xac\x13\x00\x01\xac\x13\x00\x03\xa6\x52\x00\x50";

    #[test]
    fn v1_tcp4_known_bytes() {
        let header = proxy("192.0.2.1:51234", "198.51.100.7:80");
        let bytes = b"PROXY TCP4 192.0.2.1 198.51.100.7 51234 80\r\n";
        assert_eq!(encode(Version::V1, &header), bytes);
        assert_eq!(complete(bytes), (header, bytes.len()));
    }

    #[test]
    fn v1_tcp6_known_bytes() {
        let header = proxy("[2001:db8::1]:1", "[2001:db8::2]:65535");
        let bytes = b"PROXY TCP6 2001:db8::1 2001:db8::2 1 65535\r\n";
        assert_eq!(encode(Version::V1, &header), bytes);
        assert_eq!(complete(bytes), (header, bytes.len()));
    }

    #[test]
    fn v1_unknown_is_local_and_ignores_the_rest_of_the_line() {
        assert_eq!(encode(Version::V1, &Header::Local), b"PROXY UNKNOWN\r\n");
        assert_eq!(complete(b"PROXY UNKNOWN\r\n"), (Header::Local, 15));
        let line = b"PROXY UNKNOWN ffff::1 whatever 1 2\r\nGET /";
        assert_eq!(complete(line), (Header::Local, line.len() - 5));
    }

    #[test]
    fn v1_longest_line_is_accepted() {
        let mut line = b"PROXY UNKNOWN ".to_vec();
        line.resize(V1_MAX_LEN - 2, b'x');
        line.extend_from_slice(b"\r\n");
        assert_eq!(complete(&line), (Header::Local, V1_MAX_LEN));
    }

    #[test]
    fn v2_tcp4_known_bytes() {
        let header = proxy("172.19.0.1:42578", "172.19.0.3:80");
        assert_eq!(encode(Version::V2, &header), V2_TCP4);
        let mut with_data = V2_TCP4.to_vec();
        with_data.extend_from_slice(b"GET / HTTP/1.1\r\n");
        assert_eq!(complete(&with_data), (header, 28));
    }

    #[test]
    fn v2_tcp6_known_bytes() {
        let header = proxy("[2001:db8::1]:443", "[::1]:8080");
        let mut bytes = V2_SIGNATURE.to_vec();
        bytes.extend_from_slice(b"\x21\x21\x00\x24");
        bytes.extend_from_slice(b"\x20\x01\x0d\xb8\0\0\0\0\0\0\0\0\0\0\0\x01");
        bytes.extend_from_slice(b"\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\x01");
        bytes.extend_from_slice(b"\x01\xbb\x1f\x90");
        assert_eq!(encode(Version::V2, &header), bytes);
        assert_eq!(complete(&bytes), (header, 52));
    }

    #[test]
    fn v2_local_known_bytes() {
        let bytes = b"\r\n\r\n\0\r\nQUIT\n\x20\x00\x00\x00";
        assert_eq!(encode(Version::V2, &Header::Local), bytes);
        assert_eq!(complete(bytes), (Header::Local, 16));
        // LOCAL ignores whatever family and addresses it carries.
        let mut with_addresses = V2_TCP4.to_vec();
        with_addresses[12] = 0x20;
        assert_eq!(complete(&with_addresses), (Header::Local, 28));
        with_addresses[13] = 0x77;
        assert_eq!(complete(&with_addresses), (Header::Local, 28));
    }

    #[test]
    fn v2_tlvs_are_skipped() {
        let mut bytes = V2_TCP4.to_vec();
        // PP2_TYPE_ALPN "h2", then a 4-byte NOOP, then an empty NOOP.
        let tlvs = b"\x01\x00\x02h2\x04\x00\x04\0\0\0\0\x04\x00\x00";
        bytes[15] = 12 + tlvs.len() as u8;
        bytes.extend_from_slice(tlvs);
        bytes.extend_from_slice(b"client bytes");
        let (header, len) = complete(&bytes);
        assert_eq!(header, proxy("172.19.0.1:42578", "172.19.0.3:80"));
        assert_eq!(len, 28 + tlvs.len());
    }

    #[test]
    fn v2_unspec_unix_and_udp_are_local() {
        let mut unspec = V2_TCP4.to_vec();
        unspec[13] = 0x00;
        assert_eq!(complete(&unspec), (Header::Local, 28));
        let mut udp = V2_TCP4.to_vec();
        udp[13] = 0x12;
        assert_eq!(complete(&udp), (Header::Local, 28));
        let mut unix = V2_SIGNATURE.to_vec();
        unix.extend_from_slice(&[0x21, 0x31, 0x00, 216]);
        unix.extend_from_slice(&[b'/'; 216]);
        assert_eq!(complete(&unix), (Header::Local, 232));
    }

    // ---- IPv4-mapped addresses ----------------------------------------

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

    // ---- Errors, truncation, bounds -----------------------------------

    fn error(buf: &[u8]) -> HeaderError {
        match parse(buf) {
            Err(err) => err,
            Ok(parsed) => panic!("expected an error, got {parsed:?}"),
        }
    }

    #[test]
    fn errors_name_what_is_wrong() {
        assert!(matches!(
            error(b"GET / HTTP/1.1\r\n"),
            HeaderError::NoSignature
        ));
        assert!(matches!(error(b"PROXX"), HeaderError::NoSignature));
        assert!(matches!(error(b"\r\n\r\nX"), HeaderError::NoSignature));

        let cases: &[(&[u8], &str)] = &[
            (b"PROXY TCP5 1.2.3.4", "protocol 'TCP5'"),
            (b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n", "found 4"),
            (b"PROXY TCP4 1.2.3.4  5.6.7.8 1 2\r\n", "found 6"),
            (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 \r\n", "found 6"),
            (
                b"PROXY TCP4 1.2.3.4 5.6.7.8 1 123456\r\n",
                "'123456' is not a number",
            ),
            (b"PROXY TCP4 ::1 5.6.7.8 1 2\r\n", "source address '::1'"),
            (
                b"PROXY TCP6 ::1 5.6.7.8 1 2\r\n",
                "destination address '5.6.7.8'",
            ),
            (b"PROXY TCP4 1.2.3.4 5.6.7.8 +1 2\r\n", "source port '+1'"),
            (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 65536\r\n", "above 65535"),
            (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 \xff\r\n", "not ASCII"),
        ];
        for (bytes, expected) in cases {
            let message = error(bytes).to_string();
            assert!(
                message.contains(expected),
                "{:?}: '{message}' should say {expected}",
                String::from_utf8_lossy(bytes)
            );
        }

        let mut bad = V2_TCP4.to_vec();
        bad[12] = 0x11;
        assert!(matches!(error(&bad), HeaderError::V2Version(1)));
        bad[12] = 0x22;
        assert!(matches!(error(&bad), HeaderError::V2Command(2)));
        bad[12] = 0x21;
        bad[13] = 0x13;
        assert!(matches!(error(&bad), HeaderError::V2Family(0x13)));
        bad[13] = 0x21; // TCP6 needs 36 bytes, the header says 12
        assert!(matches!(
            error(&bad),
            HeaderError::V2Length {
                declared: 12,
                needed: 36
            }
        ));
        let mut tlv = V2_TCP4.to_vec();
        tlv[15] = 12 + 5;
        tlv.extend_from_slice(b"\x01\x00\x03h2"); // says 3 bytes, has 2
        assert!(matches!(error(&tlv), HeaderError::V2Tlv { offset: 28 }));
        tlv[15] = 12 + 2;
        tlv.truncate(30); // a TLV cut inside its length field
        assert!(matches!(error(&tlv), HeaderError::V2Tlv { offset: 28 }));
    }

    #[test]
    fn truncated_headers_are_incomplete() {
        assert_eq!(parse(b"").unwrap(), Parsed::Incomplete);
        assert_eq!(parse(b"PRO").unwrap(), Parsed::Incomplete);
        assert_eq!(parse(b"PROXY TCP4 1.2.3.4").unwrap(), Parsed::Incomplete);
        assert_eq!(parse(b"PROXY UNKNOWN\r").unwrap(), Parsed::Incomplete);
        assert_eq!(parse(&V2_TCP4[..5]).unwrap(), Parsed::Incomplete);
        assert_eq!(parse(&V2_TCP4[..16]).unwrap(), Parsed::Incomplete);
        assert_eq!(parse(&V2_TCP4[..27]).unwrap(), Parsed::Incomplete);
    }

    /// A `\n` with no `\r` before it is refused as soon as it comes,
    /// except in an UNKNOWN line, whose content is ignored up to `\r\n`.
    #[test]
    fn a_bare_line_feed_is_refused_at_once() {
        for line in [
            &b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n"[..],
            b"PROXY TCP6\n",
            b"PROXY TC\n",
        ] {
            assert!(matches!(error(line), HeaderError::V1Syntax(_)), "{line:?}");
        }
        assert_eq!(parse(b"PROXY UNKNOWN x\ny").unwrap(), Parsed::Incomplete);
    }

    #[test]
    fn oversized_headers_are_refused() {
        let mut line = b"PROXY UNKNOWN ".to_vec();
        line.resize(V1_MAX_LEN, b'x');
        assert!(matches!(
            error(&line),
            HeaderError::TooLong {
                version: Version::V1,
                limit: V1_MAX_LEN
            }
        ));
        // A line whose \r\n comes one byte past the bound.
        line.extend_from_slice(b"\r\n");
        assert!(matches!(error(&line), HeaderError::TooLong { .. }));

        // Refused from its length field alone, before the bytes arrive.
        let mut v2 = V2_TCP4[..16].to_vec();
        let declared = (V2_MAX_LEN - 16 + 1) as u16;
        v2[14..16].copy_from_slice(&declared.to_be_bytes());
        assert!(matches!(
            error(&v2),
            HeaderError::TooLong {
                version: Version::V2,
                limit: V2_MAX_LEN
            }
        ));
        // Exactly at the bound is fine.
        let mut at_bound = V2_SIGNATURE.to_vec();
        at_bound.extend_from_slice(&[0x21, 0x11]);
        at_bound.extend_from_slice(&((V2_MAX_LEN - 16) as u16).to_be_bytes());
        at_bound.extend_from_slice(&V2_TCP4[16..]);
        let noop = V2_MAX_LEN - at_bound.len() - 3;
        at_bound.extend_from_slice(&[0x04]);
        at_bound.extend_from_slice(&(noop as u16).to_be_bytes());
        at_bound.resize(V2_MAX_LEN, 0);
        assert_eq!(complete(&at_bound).1, V2_MAX_LEN);
    }

    // ---- Version, Cidr, CidrList --------------------------------------

    #[test]
    fn version_from_str() {
        assert_eq!("v1".parse::<Version>().unwrap(), Version::V1);
        assert_eq!("V2".parse::<Version>().unwrap(), Version::V2);
        let err = "v3".parse::<Version>().unwrap_err().to_string();
        assert!(err.contains("'v3'") && err.contains("v1, v2"), "{err}");
        assert_eq!(Version::V2.to_string(), "v2");
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn cidr_parses_and_contains() {
        let net: Cidr = "10.1.2.3/8".parse().unwrap();
        assert_eq!(net.to_string(), "10.0.0.0/8");
        assert!(net.contains(ip("10.255.0.1")));
        assert!(!net.contains(ip("11.0.0.1")));
        assert!(
            net.contains(ip("::ffff:10.9.9.9")),
            "mapped peers match IPv4 blocks"
        );
        assert!(!net.contains(ip("::1")));

        let one: Cidr = "192.0.2.7".parse().unwrap();
        assert_eq!(one.to_string(), "192.0.2.7/32");
        assert!(one.contains(ip("192.0.2.7")) && !one.contains(ip("192.0.2.8")));

        let v6: Cidr = "2001:db8::/32".parse().unwrap();
        assert!(v6.contains(ip("2001:db8:ffff::1")));
        assert!(!v6.contains(ip("2001:db9::1")));
        assert!(!v6.contains(ip("10.0.0.1")));
        assert_eq!("::1".parse::<Cidr>().unwrap().to_string(), "::1/128");

        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("255.255.255.255")));
        let mapped: Cidr = "::ffff:10.0.0.0/104".parse().unwrap();
        assert_eq!(mapped.to_string(), "10.0.0.0/8");

        for bad in [
            "10.0.0.0/33",
            "::/129",
            "10.0.0.0/",
            "10.0.0.0/+8",
            "localhost",
            "",
        ] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn cidr_list_parses_and_defaults_to_loopback() {
        let list: CidrList = "10.0.0.0/8, 192.0.2.1 ,::1".parse().unwrap();
        assert_eq!(list.to_string(), "10.0.0.0/8,192.0.2.1/32,::1/128");
        assert!(list.contains(ip("10.2.3.4")));
        assert!(list.contains(ip("::1")));
        assert!(!list.contains(ip("127.0.0.1")));
        assert!("10.0.0.0/8,,::1".parse::<CidrList>().is_err());
        assert!(" ".parse::<CidrList>().is_err());
        assert!("10.0.0.0/8,nope".parse::<CidrList>().is_err());

        let loopback = CidrList::loopback();
        assert_eq!(loopback.to_string(), "127.0.0.0/8,::1/128");
        assert!(loopback.contains(ip("127.0.0.1")));
        assert!(loopback.contains(ip("127.9.9.9")));
        assert!(loopback.contains(ip("::ffff:127.0.0.1")));
        assert!(loopback.contains(ip("::1")));
        assert!(!loopback.contains(ip("192.0.2.1")));
    }

    // ---- read_header over real sockets --------------------------------

    const SOCKET_TIMEOUT: Duration = Duration::from_secs(5);

    /// A connected pair on loopback: (the client's end, the server's end).
    fn socket_pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        for socket in [&client, &server] {
            socket.set_read_timeout(Some(SOCKET_TIMEOUT)).unwrap();
            socket.set_write_timeout(Some(SOCKET_TIMEOUT)).unwrap();
            socket.set_nodelay(true).unwrap();
        }
        (client, server)
    }

    /// The bytes after the header stay in the socket, for v1 and v2, sent
    /// together with the header in one write.
    #[test]
    fn read_header_leaves_the_clients_bytes() {
        for version in [Version::V1, Version::V2] {
            let (mut client, mut server) = socket_pair();
            let header = proxy("192.0.2.1:5000", "198.51.100.7:80");
            let mut bytes = encode(version, &header);
            bytes.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
            client.write_all(&bytes).unwrap();
            client.shutdown(Shutdown::Write).unwrap();

            assert_eq!(read_header(&server, SOCKET_TIMEOUT).unwrap(), header);
            let mut rest = Vec::new();
            server.read_to_end(&mut rest).unwrap();
            assert_eq!(rest, b"GET / HTTP/1.1\r\n\r\n", "{version}");
        }
    }

    /// A header sent one byte per write (one segment each, with
    /// TCP_NODELAY) is put together, and what follows it is left.
    #[test]
    fn read_header_assembles_a_header_sent_byte_by_byte() {
        for version in [Version::V1, Version::V2] {
            let (mut client, mut server) = socket_pair();
            let header = proxy("[2001:db8::1]:5000", "[2001:db8::2]:80");
            let mut bytes = encode(version, &header);
            bytes.extend_from_slice(b"hello");
            let writer = thread::spawn(move || {
                for byte in bytes {
                    client.write_all(&[byte]).unwrap();
                }
                client
            });
            assert_eq!(read_header(&server, SOCKET_TIMEOUT).unwrap(), header);
            let _client = writer.join().unwrap();
            let mut rest = [0u8; 5];
            server.read_exact(&mut rest).unwrap();
            assert_eq!(&rest, b"hello", "{version}");
        }
    }

    /// A client that connects and says nothing costs the timeout, no more.
    #[test]
    fn read_header_times_out_on_a_silent_client() {
        let (mut client, server) = socket_pair();
        client.write_all(b"PROXY TCP4 ").unwrap();
        let timeout = Duration::from_millis(200);
        let started = Instant::now();
        let err = read_header(&server, timeout).unwrap_err();
        let elapsed = started.elapsed();
        assert!(
            matches!(err, HeaderError::Timeout { received: 11, .. }),
            "{err}"
        );
        assert!(elapsed >= timeout, "returned after {elapsed:?}");
        assert!(elapsed < SOCKET_TIMEOUT, "returned after {elapsed:?}");
    }

    /// Headers over the bound are refused at once, not waited for.
    #[test]
    fn read_header_refuses_a_header_too_long() {
        let (mut client, server) = socket_pair();
        let mut line = b"PROXY UNKNOWN ".to_vec();
        line.resize(V1_MAX_LEN + 10, b'x');
        client.write_all(&line).unwrap();
        let err = read_header(&server, SOCKET_TIMEOUT).unwrap_err();
        assert!(matches!(err, HeaderError::TooLong { .. }), "{err}");

        let (mut client, server) = socket_pair();
        client.write_all(&V2_SIGNATURE).unwrap();
        client.write_all(&[0x21, 0x11, 0xff, 0xff]).unwrap();
        let err = read_header(&server, SOCKET_TIMEOUT).unwrap_err();
        assert!(matches!(err, HeaderError::TooLong { .. }), "{err}");
    }

    /// A client that closes mid-header, or sends no header, is told apart.
    #[test]
    fn read_header_reports_a_close_and_a_missing_header() {
        let (mut client, server) = socket_pair();
        client.write_all(&V2_TCP4[..20]).unwrap();
        client.shutdown(Shutdown::Write).unwrap();
        let err = read_header(&server, SOCKET_TIMEOUT).unwrap_err();
        assert!(matches!(err, HeaderError::Closed { received: 20 }), "{err}");

        let (mut client, server) = socket_pair();
        client.write_all(b"GET / HTTP/1.1\r\n").unwrap();
        let err = read_header(&server, SOCKET_TIMEOUT).unwrap_err();
        assert!(matches!(err, HeaderError::NoSignature), "{err}");
    }

    // ---- Properties ---------------------------------------------------

    fn any_ip() -> impl Strategy<Value = IpAddr> {
        prop_oneof![
            any::<[u8; 4]>().prop_map(|o| IpAddr::V4(Ipv4Addr::from(o))),
            any::<[u8; 16]>().prop_map(|o| IpAddr::V6(Ipv6Addr::from(o))),
            // IPv4-mapped, as a dual-stack socket shows IPv4 peers.
            any::<[u8; 4]>().prop_map(|o| IpAddr::V6(Ipv4Addr::from(o).to_ipv6_mapped())),
        ]
    }

    fn any_header() -> impl Strategy<Value = Header> {
        prop_oneof![
            1 => Just(Header::Local),
            8 => (any_ip(), any::<u16>(), any_ip(), any::<u16>()).prop_map(|(s, sp, d, dp)| {
                Header::Proxy {
                    source: SocketAddr::new(s, sp),
                    destination: SocketAddr::new(d, dp),
                }
            }),
        ]
    }

    fn any_version() -> impl Strategy<Value = Version> {
        prop_oneof![Just(Version::V1), Just(Version::V2)]
    }

    /// What a header reads back as: both ends in the family [`encode`] wrote.
    fn as_written(header: Header) -> Header {
        match header {
            Header::Local => Header::Local,
            Header::Proxy {
                source,
                destination,
            } => {
                let [source, destination] = match ends(source, destination) {
                    Ends::V4(ends) => ends.map(|(ip, port)| SocketAddr::new(IpAddr::V4(ip), port)),
                    Ends::V6(ends) => ends.map(|(ip, port)| SocketAddr::new(IpAddr::V6(ip), port)),
                };
                Header::Proxy {
                    source,
                    destination,
                }
            }
        }
    }

    /// Bytes that start like a header, so the parser gets past its first
    /// check and into the fields.
    fn header_like_bytes() -> impl Strategy<Value = Vec<u8>> {
        let tail = proptest::collection::vec(any::<u8>(), 0..700);
        prop_oneof![
            tail.clone(),
            tail.clone().prop_map(|t| [V1_PREFIX, &t].concat()),
            tail.clone()
                .prop_map(|t| [b"PROXY TCP4 ".as_slice(), &t].concat()),
            tail.clone()
                .prop_map(|t| [V2_SIGNATURE.as_slice(), &t].concat()),
            // A valid version and command, a likely family and a short
            // length, so that the address and TLV checks are reached.
            (
                prop_oneof![Just(0x20u8), Just(0x21)],
                prop_oneof![
                    Just(0x00u8),
                    Just(0x11),
                    Just(0x21),
                    Just(0x31),
                    any::<u8>()
                ],
                0u16..600,
                tail,
            )
                .prop_map(|(command, family, length, t)| {
                    let fixed = [command, family, (length >> 8) as u8, length as u8];
                    [V2_SIGNATURE.as_slice(), &fixed, &t].concat()
                }),
        ]
    }

    proptest! {
        /// Any bytes: no panic, and a length within the buffer and the bound.
        #[test]
        fn random_bytes_never_panic(buf in header_like_bytes()) {
            if let Ok(Parsed::Complete { len, .. }) = parse(&buf) {
                prop_assert!(len <= buf.len());
                prop_assert!(len <= MAX_LEN);
            }
            let bound = if buf.first() == Some(&b'P') { V1_MAX_LEN } else { V2_MAX_LEN };
            if buf.len() >= bound {
                prop_assert_ne!(parse(&buf).ok(), Some(Parsed::Incomplete));
            }
        }

        /// What is encoded parses back to the same header, whatever follows.
        #[test]
        fn encode_then_parse_round_trips(
            version in any_version(),
            header in any_header(),
            tail in proptest::collection::vec(any::<u8>(), 0..32),
        ) {
            let mut bytes = encode(version, &header);
            let len = bytes.len();
            prop_assert!(len <= MAX_LEN);
            bytes.extend_from_slice(&tail);
            prop_assert_eq!(
                parse(&bytes).unwrap(),
                Parsed::Complete { header: as_written(header), len }
            );
        }

        /// Every strict prefix of a valid header asks for more bytes.
        #[test]
        fn strict_prefixes_are_incomplete(version in any_version(), header in any_header()) {
            let bytes = encode(version, &header);
            for end in 0..bytes.len() {
                prop_assert_eq!(parse(&bytes[..end]).unwrap(), Parsed::Incomplete, "{} bytes", end);
            }
        }
    }
}
