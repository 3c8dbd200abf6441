//! The MySQL and MariaDB check: the greeting, and with a user a login
//! with an empty password and `COM_QUIT`.
//!
//! # Threads
//!
//! Runs on the health checker's probe thread, on the stream it is given.
//! No C counterpart.

use super::conn::{preview, Conn};
use super::MAX_REPLY_BYTES;

/// MySQL capability flags used here.
pub(super) mod client {
    /// The new (4.1+) password hash. MariaDB leaves it unset in its greeting
    /// (the bit means "MySQL" there), so it is masked with the server's.
    pub const LONG_PASSWORD: u32 = 0x0000_0001;
    /// The 4.1 protocol: the only one this check speaks.
    pub const PROTOCOL_41: u32 = 0x0000_0200;
    /// Transactions status in OK packets (every client sets it).
    pub const TRANSACTIONS: u32 = 0x0000_2000;
    /// The auth response is length-prefixed.
    pub const SECURE_CONNECTION: u32 = 0x0000_8000;
    /// The response names its authentication plugin; lets the server ask
    /// to switch plugins rather than fail.
    pub const PLUGIN_AUTH: u32 = 0x0008_0000;
}

/// MySQL / MariaDB: read the greeting; with a user, log in and `COM_QUIT`.
/// Healthy: the server's version, and the login if any.
pub(super) fn mysql(conn: &mut Conn, user: Option<&str>) -> Result<String, String> {
    let (_, greeting) = mysql_packet(conn, "the server greeting")?;
    match greeting.first() {
        Some(10) => {}
        Some(0xff) => return Err(mysql_error(&greeting)),
        Some(v) => return Err(format!("greeting with protocol version {v}, not 10")),
        None => return Err("an empty greeting".into()),
    }
    let version = server_version(&greeting);
    let Some(user) = user else {
        // Nothing a client can send without an account ends the session
        // without a log line (a bad handshake or an unknown user is logged
        // too, as worse), so close: MariaDB then logs "Aborted connection
        // ... (This connection closed normally without authentication)".
        return Ok(format!("greeting from {version}"));
    };
    let greeting = Greeting::parse(&greeting)?;
    if greeting.capabilities & client::PROTOCOL_41 == 0 {
        return Err("the server does not speak the 4.1 protocol".into());
    }
    let wanted = client::LONG_PASSWORD
        | client::PROTOCOL_41
        | client::TRANSACTIONS
        | client::SECURE_CONNECTION
        | client::PLUGIN_AUTH;
    let capabilities = wanted & greeting.capabilities;

    // HandshakeResponse41: capabilities, max packet size, character set,
    // 23 reserved bytes, the user, an empty auth response, the plugin.
    let mut response = Vec::new();
    response.extend_from_slice(&capabilities.to_le_bytes());
    response.extend_from_slice(&(1u32 << 24).to_le_bytes());
    response.push(33); // utf8_general_ci
    response.extend_from_slice(&[0; 23]);
    response.extend_from_slice(user.as_bytes());
    response.push(0);
    response.push(0); // auth response of length 0: the empty password
    if capabilities & client::PLUGIN_AUTH != 0 {
        response.extend_from_slice(greeting.plugin.as_bytes());
        response.push(0);
    }
    let mut seq = 1;
    mysql_send(conn, seq, &response, "the login")?;

    // The server may ask to switch authentication plugins (0xfe); for an
    // empty password every plugin's answer is empty. Once is enough.
    let mut switched = false;
    loop {
        let (got, reply) = mysql_packet(conn, "the reply to the login")?;
        match reply.first() {
            Some(0x00) => break,
            Some(0xff) => return Err(mysql_error(&reply)),
            Some(0xfe) if !switched => {
                switched = true;
                seq = got.wrapping_add(1);
                mysql_send(conn, seq, &[], "the plugin switch answer")?;
            }
            _ => {
                return Err(format!(
                    "the login for user '{user}' wants more than an empty password: {}",
                    preview(&reply)
                ))
            }
        }
    }
    // COM_QUIT, a new command, so sequence 0: the server closes the session
    // as a normal end, with nothing in its log.
    mysql_send(conn, 0, &[0x01], "COM_QUIT")?;
    conn.finish();
    Ok(format!("greeting from {version}, logged in as '{user}'"))
}

/// The server's version in a protocol 10 greeting: the text after the
/// version byte, up to its NUL (`10.11.6-MariaDB-0+deb12u1`), quoted.
fn server_version(greeting: &[u8]) -> String {
    let text = greeting.get(1..).unwrap_or_default();
    let end = text.iter().position(|&b| b == 0).unwrap_or(text.len());
    preview(&text[..end])
}

/// What the check needs from a MySQL greeting (the "initial handshake
/// packet", protocol 10).
pub(super) struct Greeting {
    /// The server's capability flags (the lower and upper 16 bits).
    pub(super) capabilities: u32,
    /// The default authentication plugin, `mysql_native_password` if none
    /// is named.
    pub(super) plugin: String,
}

impl Greeting {
    pub(super) fn parse(p: &[u8]) -> Result<Greeting, String> {
        let bad = || format!("a malformed greeting: {}", preview(p));
        // protocol version, server version up to its NUL.
        let version_end = p.iter().skip(1).position(|&b| b == 0).ok_or_else(bad)? + 1;
        // connection id (4), scramble part 1 (8), filler (1).
        let mut at = version_end + 1 + 4 + 8 + 1;
        let lower = match p.get(at..at + 2) {
            Some(b) => u16::from_le_bytes([b[0], b[1]]),
            None => return Err(bad()),
        };
        at += 2;
        // character set (1), status (2), then the upper capabilities.
        at += 1 + 2;
        let upper = match p.get(at..at + 2) {
            Some(b) => u16::from_le_bytes([b[0], b[1]]),
            None => 0,
        };
        let capabilities = u32::from(lower) | u32::from(upper) << 16;
        let mut plugin = String::from("mysql_native_password");
        if capabilities & client::PLUGIN_AUTH != 0 {
            // auth data length (1), reserved (10), scramble part 2.
            let data_len = usize::from(*p.get(at + 2).ok_or_else(bad)?);
            at += 2 + 1 + 10 + data_len.saturating_sub(8).max(13);
            if let Some(rest) = p.get(at..) {
                let name = rest.split(|&b| b == 0).next().unwrap_or_default();
                if !name.is_empty() {
                    plugin = String::from_utf8_lossy(name).into_owned();
                }
            }
        }
        Ok(Greeting {
            capabilities,
            plugin,
        })
    }
}

/// Reads one MySQL packet: a 3-byte little-endian length, a sequence id,
/// the payload. Returns the sequence id and the payload.
fn mysql_packet(conn: &mut Conn, what: &str) -> Result<(u8, Vec<u8>), String> {
    let header = conn.take(4, what)?;
    let len = usize::from(header[0]) | usize::from(header[1]) << 8 | usize::from(header[2]) << 16;
    if len > MAX_REPLY_BYTES {
        return Err(format!(
            "not a MySQL packet: a length of {len} bytes for {what} ({})",
            preview(&header)
        ));
    }
    let payload = conn.take(len, what)?;
    Ok((header[3], payload))
}

/// Writes one MySQL packet.
fn mysql_send(conn: &mut Conn, seq: u8, payload: &[u8], what: &str) -> Result<(), String> {
    let len = u32::try_from(payload.len())
        .unwrap_or(u32::MAX)
        .to_le_bytes();
    let mut packet = vec![len[0], len[1], len[2], seq];
    packet.extend_from_slice(payload);
    conn.send(&packet, what)
}

/// The reason in an error packet: 0xff, a 2-byte code, an optional
/// `#` and 5-character SQL state, the message.
fn mysql_error(p: &[u8]) -> String {
    let code = match p.get(1..3) {
        Some(b) => u16::from_le_bytes([b[0], b[1]]),
        None => return "an empty error packet".into(),
    };
    let mut message = &p[3..];
    if message.first() == Some(&b'#') && message.len() >= 6 {
        message = &message[6..];
    }
    format!("server error {code}: {}", String::from_utf8_lossy(message))
}
