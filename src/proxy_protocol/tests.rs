//! Unit tests of the PROXY protocol codec and reader: known bytes from
//! HAProxy and the specification, errors, bounds, and properties.

use super::codec::{ends, Ends, V1_PREFIX};
use super::*;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::thread;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use crate::test_support::pair;

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

/// The bytes after the header stay in the socket, for v1 and v2, sent
/// together with the header in one write.
#[test]
fn read_header_leaves_the_clients_bytes() {
    for version in [Version::V1, Version::V2] {
        let (mut client, mut server) = pair();
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
        let (mut client, mut server) = pair();
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
    let (mut client, server) = pair();
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
    let (mut client, server) = pair();
    let mut line = b"PROXY UNKNOWN ".to_vec();
    line.resize(V1_MAX_LEN + 10, b'x');
    client.write_all(&line).unwrap();
    let err = read_header(&server, SOCKET_TIMEOUT).unwrap_err();
    assert!(matches!(err, HeaderError::TooLong { .. }), "{err}");

    let (mut client, server) = pair();
    client.write_all(&V2_SIGNATURE).unwrap();
    client.write_all(&[0x21, 0x11, 0xff, 0xff]).unwrap();
    let err = read_header(&server, SOCKET_TIMEOUT).unwrap_err();
    assert!(matches!(err, HeaderError::TooLong { .. }), "{err}");
}

/// A client that closes mid-header, or sends no header, is told apart.
#[test]
fn read_header_reports_a_close_and_a_missing_header() {
    let (mut client, server) = pair();
    client.write_all(&V2_TCP4[..20]).unwrap();
    client.shutdown(Shutdown::Write).unwrap();
    let err = read_header(&server, SOCKET_TIMEOUT).unwrap_err();
    assert!(matches!(err, HeaderError::Closed { received: 20 }), "{err}");

    let (mut client, server) = pair();
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
