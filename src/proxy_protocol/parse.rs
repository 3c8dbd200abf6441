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
