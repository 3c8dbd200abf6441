//! The TLS check: a ClientHello, expecting a handshake record back.
//!
//! # Threads
//!
//! Runs on the health checker's probe thread, on the stream it is given.
//! No C counterpart.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

use super::conn::{preview, Conn};

/// The TLS record type of a handshake message.
const TLS_HANDSHAKE: u8 = 0x16;
/// The TLS record type of an alert.
const TLS_ALERT: u8 = 0x15;

/// TLS: send a ClientHello, want a handshake record (the ServerHello, or a
/// HelloRetryRequest, which is one too) in answer. Healthy: said so.
pub(super) fn tls(conn: &mut Conn) -> Result<String, String> {
    conn.send(&client_hello(None), "the ClientHello")?;
    let header = conn.take(5, "the ServerHello")?;
    let (kind, major, minor) = (header[0], header[1], header[2]);
    if kind == TLS_HANDSHAKE && major == 3 && minor <= 4 {
        // Close as soon as the server has shown it speaks TLS: a client
        // that gives up after the ServerHello breaks no rule, and servers
        // log it below their default level (nginx: at `info`, "peer closed
        // connection in SSL handshake").
        conn.finish();
        return Ok("a handshake record (the ServerHello)".into());
    }
    if kind == TLS_ALERT && major == 3 {
        let alert = conn.take(2, "the alert").unwrap_or_default();
        return match alert[..] {
            [level, description] => Err(format!(
                "the server answered with an alert (level {level}, description {description}: \
                 {})",
                alert_name(description)
            )),
            _ => Err("the server answered with an alert".into()),
        };
    }
    Err(format!(
        "not a TLS handshake record: {}",
        preview(&[header, conn.buf.clone()].concat())
    ))
}

/// The name of the common TLS alerts (RFC 8446, section 6).
fn alert_name(description: u8) -> &'static str {
    match description {
        10 => "unexpected_message",
        40 => "handshake_failure",
        42 => "bad_certificate",
        47 => "illegal_parameter",
        50 => "decode_error",
        70 => "protocol_version",
        71 => "insufficient_security",
        80 => "internal_error",
        112 => "unrecognized_name",
        120 => "no_application_protocol",
        _ => "other",
    }
}

/// A TLS ClientHello that a TLS 1.2 or 1.3 server accepts: the common
/// cipher suites of both versions, the groups x25519, P-256 and P-384 with
/// an x25519 key share (so a TLS 1.3 server answers a ServerHello without
/// a round of HelloRetryRequest), the usual signature algorithms, and the
/// `supported_versions` extension offering 1.3 and 1.2. `server_name`,
/// when given, goes in the SNI extension (a host name, not an address).
///
/// The random and the key share are random bytes but need not be secret:
/// the check never completes the handshake or uses any key.
pub(crate) fn client_hello(server_name: Option<&str>) -> Vec<u8> {
    const CIPHER_SUITES: &[u16] = &[
        0x1301, // TLS_AES_128_GCM_SHA256 (1.3)
        0x1302, // TLS_AES_256_GCM_SHA384 (1.3)
        0x1303, // TLS_CHACHA20_POLY1305_SHA256 (1.3)
        0xc02b, // ECDHE-ECDSA-AES128-GCM-SHA256
        0xc02f, // ECDHE-RSA-AES128-GCM-SHA256
        0xc02c, // ECDHE-ECDSA-AES256-GCM-SHA384
        0xc030, // ECDHE-RSA-AES256-GCM-SHA384
        0xcca9, // ECDHE-ECDSA-CHACHA20-POLY1305
        0xcca8, // ECDHE-RSA-CHACHA20-POLY1305
        0x009c, // AES128-GCM-SHA256
        0x009d, // AES256-GCM-SHA384
        0x002f, // AES128-SHA
        0x0035, // AES256-SHA
    ];
    const GROUPS: &[u16] = &[0x001d, 0x0017, 0x0018]; // x25519, P-256, P-384
    const SIGNATURE_ALGORITHMS: &[u16] = &[
        0x0403, 0x0804, 0x0401, 0x0503, 0x0805, 0x0501, 0x0806, 0x0601, 0x0807, 0x0201,
    ];

    let mut extensions = Vec::new();
    if let Some(name) = server_name {
        let name = name.as_bytes();
        let mut list = vec![0]; // name type: host_name
        push_u16(&mut list, name.len());
        list.extend_from_slice(name);
        let mut body = Vec::new();
        push_u16(&mut body, list.len());
        body.extend_from_slice(&list);
        push_extension(&mut extensions, 0x0000, &body);
    }
    push_extension(&mut extensions, 0x000a, &u16_list(GROUPS, 2)); // supported_groups
    push_extension(&mut extensions, 0x000b, &[1, 0]); // ec_point_formats: uncompressed
    push_extension(&mut extensions, 0x000d, &u16_list(SIGNATURE_ALGORITHMS, 2));
    push_extension(&mut extensions, 0x002b, &u16_list(&[0x0304, 0x0303], 1)); // supported_versions
    let mut share = Vec::new(); // key_share: one x25519 public key
    push_u16(&mut share, 2 + 2 + 32);
    push_u16(&mut share, 0x001d);
    push_u16(&mut share, 32);
    share.extend_from_slice(&random_bytes(32));
    push_extension(&mut extensions, 0x0033, &share);

    let mut hello = vec![0x03, 0x03]; // legacy_version: TLS 1.2
    hello.extend_from_slice(&random_bytes(32));
    hello.push(0); // empty legacy_session_id
    hello.extend_from_slice(&u16_list(CIPHER_SUITES, 2));
    hello.extend_from_slice(&[1, 0]); // compression methods: null only
    push_u16(&mut hello, extensions.len());
    hello.extend_from_slice(&extensions);

    let mut handshake = vec![0x01]; // ClientHello
    let len = hello.len() as u32;
    handshake.extend_from_slice(&len.to_be_bytes()[1..]);
    handshake.extend_from_slice(&hello);

    // Record header: handshake, version 3.1 (what clients put in the first
    // record for compatibility), length.
    let mut record = vec![TLS_HANDSHAKE, 0x03, 0x01];
    push_u16(&mut record, handshake.len());
    record.extend_from_slice(&handshake);
    record
}

/// Appends `n` as two big-endian bytes. Every length in a ClientHello this
/// small fits; a larger one is an invariant broken here, not input.
fn push_u16(out: &mut Vec<u8>, n: usize) {
    let n = u16::try_from(n).unwrap_or(u16::MAX);
    out.extend_from_slice(&n.to_be_bytes());
}

/// A list of u16 values behind its length in bytes, itself on `len_bytes`
/// (1 or 2) bytes.
fn u16_list(values: &[u16], len_bytes: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let len = values.len() * 2;
    if len_bytes == 1 {
        out.push(u8::try_from(len).unwrap_or(u8::MAX));
    } else {
        push_u16(&mut out, len);
    }
    for v in values {
        out.extend_from_slice(&v.to_be_bytes());
    }
    out
}

/// Appends one extension: type, length, body.
fn push_extension(out: &mut Vec<u8>, kind: u16, body: &[u8]) {
    out.extend_from_slice(&kind.to_be_bytes());
    push_u16(out, body.len());
    out.extend_from_slice(body);
}

/// Unpredictable bytes without a dependency: std's `RandomState` is keyed
/// from the OS's random source, so hashing a counter with it gives bytes
/// nobody can guess (and that differ from one hello to the next).
fn random_bytes(n: usize) -> Vec<u8> {
    let state = RandomState::new();
    let mut out = Vec::with_capacity(n + 8);
    let mut counter = 0u64;
    while out.len() < n {
        let mut hasher = state.build_hasher();
        hasher.write_u64(counter);
        out.extend_from_slice(&hasher.finish().to_le_bytes());
        counter += 1;
    }
    out.truncate(n);
    out
}
