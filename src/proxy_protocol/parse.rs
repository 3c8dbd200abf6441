//! Parsing a PROXY protocol header, version 1 or 2, at the start of a
//! buffer: bounded, and refusing garbage as soon as its bytes show it.
//!
//! # Threads
//!
//! A pure function, called by the worker reading a header. No C
//! counterpart.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::codec::{
    Header, HeaderError, Parsed, Version, V1_MAX_LEN, V1_PREFIX, V2_FIXED_LEN, V2_MAX_LEN,
    V2_SIGNATURE, V2_TCP4, V2_TCP6, V2_UNSPEC,
};

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
    complete(v2_addresses(command, family, payload))
}

/// What a complete version 2 header says, from its command, its family
/// and its payload (already checked to hold the family's address block):
/// the addresses of a PROXY over TCP, else [`Header::Local`].
fn v2_addresses(command: u8, family: u8, payload: &[u8]) -> Header {
    match (command, family) {
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
    }
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

#[cfg(test)]
mod tests {
    use super::super::codec::{ends, Ends, V1_PREFIX};
    use super::*;
    use crate::proxy_protocol::samples::{complete, proxy};
    use crate::proxy_protocol::{
        encode, Header, HeaderError, Parsed, Version, MAX_LEN, V1_MAX_LEN, V2_MAX_LEN, V2_SIGNATURE,
    };
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

    use proptest::prelude::*;

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

    // Errors, truncation, bounds.

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
