//! Protocol-aware health checks: speak just enough of a backend's own
//! protocol that it sees a well-behaved client, not a broken one.
//!
//! The plain TCP check (connect, then close) is invisible to most servers,
//! but some log every such connection as an error: MariaDB writes
//! `Aborted connection ... (This connection closed normally without
//! authentication)`, sshd `kex_exchange_identification: Connection closed
//! by remote host`, iperf3 `unable to receive parameters from client`.
//! With a check every few seconds per balancer, that buries the real
//! errors. Each
//! [`ProtocolCheck`] instead opens the conversation the way a client would
//! and ends it the way the protocol says a session ends (`QUIT`, `COM_QUIT`,
//! `Terminate`), as HAProxy's `redis-check`, `mysql-check`, `pgsql-check`,
//! `smtpchk`, `ssl-hello-chk` and `tcp-check send/expect` do.
//! `docs/health-checks.md` says which check suits which server.
//!
//! [`run`] takes a stream the caller has already connected (with its own
//! connect timeout) and a deadline for the whole conversation: every read
//! and every write sets its socket timeout to the time left, so a silent or
//! slow server costs at most the deadline. It returns a short reason on
//! failure, for the log line `backend X is now DOWN (reason)`.
//!
//! # Threads
//!
//! [`run`] is called on the health checker's thread (one short-lived
//! thread per probe of a round, see [`crate::health`]); it holds no lock and
//! touches no shared state, only the stream it is given.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C never checks a backend.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

/// The most bytes a send/expect check reads while looking for its
/// `expect` bytes. A banner or a status line fits many times over; a
/// server streaming data at us must not keep the check reading forever.
pub const MAX_EXPECT_BYTES: usize = 4096;

/// The most bytes any other check reads from one server (a greeting, a
/// reply line, PostgreSQL's parameter messages). Far above what a healthy
/// server sends, and a bound on what a confused one can make us buffer.
const MAX_REPLY_BYTES: usize = 16 * 1024;

/// The most bytes drained after a session has ended, while waiting for the
/// server to close first (see [`Conn::finish`]). A TLS server sends its
/// certificate chain, a few kilobytes.
const MAX_DRAIN_BYTES: usize = 64 * 1024;

/// A health check that speaks the backend's protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtocolCheck {
    /// Redis: `PING`, expecting `+PONG` (or `-NOAUTH`, which a server that
    /// requires a password answers: it is alive), then `QUIT`.
    Redis,
    /// TLS: a ClientHello (TLS 1.2 and 1.3), expecting a handshake record
    /// back (the ServerHello); an alert or anything else is unhealthy.
    Tls,
    /// SMTP: the greeting must be `220`; then `QUIT`.
    Smtp,
    /// MySQL and MariaDB: the server's greeting must be a protocol 10
    /// handshake (an error packet, such as "Too many connections", is
    /// unhealthy).
    Mysql {
        /// With a user: log in as that user with an empty password (the
        /// user needs no password and no privilege), expect OK, then
        /// `COM_QUIT`, so the server logs nothing. Without: close after the
        /// greeting; the server then logs an aborted connection, as for a
        /// plain TCP check.
        user: Option<String>,
    },
    /// PostgreSQL: a StartupMessage for `user` (database of the same name);
    /// an authentication request or an error answer both show a live server.
    Pgsql {
        /// The role to start a session as.
        user: String,
    },
    /// Any protocol: write `send` (may be empty), then read until `expect`
    /// appears, within [`MAX_EXPECT_BYTES`] and the deadline. Then the
    /// check half-closes and waits, within the deadline, for the server to
    /// close (most do at once), so that no reset reaches it.
    SendExpect {
        /// Bytes written first (nothing if empty).
        send: Vec<u8>,
        /// Bytes that must appear in what the server sends (healthy at once
        /// if empty).
        expect: Vec<u8>,
    },
}

impl ProtocolCheck {
    /// The check's short name, as it starts a failure reason (`redis`,
    /// `tls`, `smtp`, `mysql`, `pgsql`, `send/expect`).
    pub fn name(&self) -> &'static str {
        match self {
            ProtocolCheck::Redis => "redis",
            ProtocolCheck::Tls => "tls",
            ProtocolCheck::Smtp => "smtp",
            ProtocolCheck::Mysql { .. } => "mysql",
            ProtocolCheck::Pgsql { .. } => "pgsql",
            ProtocolCheck::SendExpect { .. } => "send/expect",
        }
    }
}

/// Runs `check` on `stream`, an already connected socket, finishing by
/// `deadline`.
///
/// Every read and write sets the socket's timeout to the time left before
/// `deadline`, so the whole check takes at most until then (plus one
/// scheduling delay). The stream is left for the caller to drop; when the
/// check succeeded and the protocol has a goodbye, it has been said, our
/// side is half-closed, and the server has usually closed its side too.
///
/// # Errors
///
/// A short reason, starting with the check's [`name`](ProtocolCheck::name):
/// `redis: answered "-ERR unknown command 'PING'"`, `tls: timed out
/// waiting for the ServerHello`, `mysql: server error 1040: Too many
/// connections`.
pub fn run(check: &ProtocolCheck, stream: &mut TcpStream, deadline: Instant) -> Result<(), String> {
    let mut conn = Conn::new(stream, deadline);
    let result = match check {
        ProtocolCheck::Redis => redis(&mut conn),
        ProtocolCheck::Tls => tls(&mut conn),
        ProtocolCheck::Smtp => smtp(&mut conn),
        ProtocolCheck::Mysql { user } => mysql(&mut conn, user.as_deref()),
        ProtocolCheck::Pgsql { user } => pgsql(&mut conn, user),
        ProtocolCheck::SendExpect { send, expect } => send_expect(&mut conn, send, expect),
    };
    result.map_err(|reason| format!("{}: {reason}", check.name()))
}

/// Parses the text of `--health-send` and `--health-expect` into bytes.
///
/// Either `hex:` followed by pairs of hex digits (`hex:0d0a`), or text
/// with these escapes: `\r`, `\n`, `\t`, `\0`, `\\` and `\xHH`. Any other
/// character stands for its UTF-8 bytes.
///
/// ```
/// use rodizio::health::protocol::parse_bytes;
/// assert_eq!(parse_bytes(r"PING\r\n").unwrap(), b"PING\r\n");
/// assert_eq!(parse_bytes("hex:53 53 48").unwrap_err(), "hex: ' ' is not a hex digit");
/// assert_eq!(parse_bytes("hex:535348").unwrap(), b"SSH");
/// ```
///
/// # Errors
///
/// What is wrong: an unknown escape, a `\x` without two hex digits, a
/// trailing `\`, an odd number of hex digits or a non-hex character.
pub fn parse_bytes(text: &str) -> Result<Vec<u8>, String> {
    if let Some(hex) = text.strip_prefix("hex:") {
        return parse_hex(hex).map_err(|e| format!("hex: {e}"));
    }
    let mut out = Vec::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            let mut utf8 = [0u8; 4];
            out.extend_from_slice(c.encode_utf8(&mut utf8).as_bytes());
            continue;
        }
        match chars.next() {
            Some('r') => out.push(b'\r'),
            Some('n') => out.push(b'\n'),
            Some('t') => out.push(b'\t'),
            Some('0') => out.push(0),
            Some('\\') => out.push(b'\\'),
            Some('x') => {
                let digits: String = chars.by_ref().take(2).collect();
                let byte = parse_hex(&digits)
                    .ok()
                    .filter(|b| b.len() == 1)
                    .ok_or_else(|| format!("\\x{digits}: expected two hex digits"))?;
                out.extend_from_slice(&byte);
            }
            Some(other) => {
                return Err(format!(
                    "unknown escape \\{other} (known: \\r \\n \\t \\0 \\\\ \\xHH)"
                ))
            }
            None => return Err("a trailing \\ escapes nothing (write \\\\)".into()),
        }
    }
    Ok(out)
}

/// Pairs of hex digits into bytes.
fn parse_hex(hex: &str) -> Result<Vec<u8>, String> {
    if let Some(bad) = hex.chars().find(|c| !c.is_ascii_hexdigit()) {
        return Err(format!("'{bad}' is not a hex digit"));
    }
    if hex.len() % 2 != 0 {
        return Err(format!("{} hex digits: need an even number", hex.len()));
    }
    // All ASCII, so byte slicing is on character boundaries.
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).map_err(|e| e.to_string()))
        .collect()
}

/// One check's conversation: the stream, the deadline, and what has been
/// read but not yet used.
///
/// Reads go into `buf` and the protocol functions take from its front, so
/// a reply split over several TCP segments (or two replies in one) parses
/// the same way.
struct Conn<'a> {
    stream: &'a mut TcpStream,
    deadline: Instant,
    /// Bytes received and not yet consumed.
    buf: Vec<u8>,
    /// Bytes received in total, checked against a bound.
    received: usize,
}

impl<'a> Conn<'a> {
    fn new(stream: &'a mut TcpStream, deadline: Instant) -> Conn<'a> {
        Conn {
            stream,
            deadline,
            buf: Vec::new(),
            received: 0,
        }
    }

    /// The time left, or an error once the deadline has passed. A zero
    /// timeout would mean "block forever" to the socket (std refuses it),
    /// so the deadline is checked here, before each call.
    fn left(&self, waiting_for: &str) -> Result<Duration, String> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            Err(format!("timed out waiting for {waiting_for}"))
        } else {
            Ok(left)
        }
    }

    /// Writes all of `bytes`, each `write` bounded by the time left.
    fn send(&mut self, bytes: &[u8], what: &str) -> Result<(), String> {
        let mut rest = bytes;
        while !rest.is_empty() {
            let left = self.left(&format!("the server to take {what}"))?;
            self.stream
                .set_write_timeout(Some(left))
                .map_err(|e| format!("sending {what}: {e}"))?;
            match self.stream.write(rest) {
                Ok(0) => return Err(format!("sending {what}: the server takes no more bytes")),
                Ok(n) => rest = &rest[n..],
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if is_timeout(&e) => {
                    return Err(format!("timed out waiting for the server to take {what}"))
                }
                Err(e) => return Err(format!("sending {what}: {e}")),
            }
        }
        Ok(())
    }

    /// Reads once more into `buf` (at least one byte), bounded by the time
    /// left and by `limit` bytes received in all.
    fn fill(&mut self, waiting_for: &str, limit: usize) -> Result<(), String> {
        if self.received >= limit {
            return Err(format!(
                "no {waiting_for} in the first {limit} bytes the server sent"
            ));
        }
        let mut chunk = [0u8; 4096];
        let room = chunk.len().min(limit - self.received);
        loop {
            let left = self.left(waiting_for)?;
            self.stream
                .set_read_timeout(Some(left))
                .map_err(|e| format!("waiting for {waiting_for}: {e}"))?;
            match self.stream.read(&mut chunk[..room]) {
                Ok(0) => {
                    return Err(if self.buf.is_empty() {
                        format!("the server closed the connection before {waiting_for}")
                    } else {
                        format!(
                            "the server closed the connection in the middle of {waiting_for} \
                             (after {})",
                            preview(&self.buf)
                        )
                    })
                }
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    self.received += n;
                    return Ok(());
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if is_timeout(&e) => {
                    return Err(format!("timed out waiting for {waiting_for}"))
                }
                Err(e) => return Err(format!("waiting for {waiting_for}: {e}")),
            }
        }
    }

    /// Takes exactly `n` bytes from the front, reading as needed.
    fn take(&mut self, n: usize, waiting_for: &str) -> Result<Vec<u8>, String> {
        while self.buf.len() < n {
            self.fill(waiting_for, MAX_REPLY_BYTES)?;
        }
        Ok(self.buf.drain(..n).collect())
    }

    /// Takes one line (up to `\n`, without the line ending), reading as
    /// needed.
    fn line(&mut self, waiting_for: &str) -> Result<String, String> {
        loop {
            if let Some(end) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=end).collect();
                let text = String::from_utf8_lossy(&line);
                return Ok(text.trim_end_matches(['\r', '\n']).to_string());
            }
            self.fill(waiting_for, MAX_REPLY_BYTES)?;
        }
    }

    /// Ends the conversation politely: half-closes our side (a FIN, not a
    /// reset) and reads until the server closes too, within the deadline.
    ///
    /// Why wait for the server: closing a socket that still has unread
    /// bytes makes the kernel send a reset, which some servers log as an
    /// error of their own; and the server closing first means it has done
    /// (and logged, if it logs anything) all it will do about this
    /// connection. The check has already succeeded, so any error here is
    /// ignored.
    fn finish(&mut self) {
        let _ = self.stream.shutdown(Shutdown::Write);
        self.buf.clear();
        self.received = 0;
        while self
            .fill("the end of the connection", MAX_DRAIN_BYTES)
            .is_ok()
        {
            self.buf.clear();
        }
    }
}

/// Whether a socket error is its timeout expiring (Linux reports
/// `EAGAIN`, which std maps to `WouldBlock`, for `SO_RCVTIMEO`).
fn is_timeout(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// The first bytes of a reply, quoted for a log line: text as text, the
/// rest escaped, at most 60 bytes.
fn preview(bytes: &[u8]) -> String {
    let shown = &bytes[..bytes.len().min(60)];
    let mut text = format!("\"{}\"", shown.escape_ascii());
    if bytes.len() > shown.len() {
        text.push_str("...");
    }
    text
}

/// Redis: an inline `PING` (the plain-text form every Redis and its forks
/// accept, no RESP framing needed), then `QUIT`.
fn redis(conn: &mut Conn) -> Result<(), String> {
    conn.send(b"PING\r\n", "PING")?;
    let reply = conn.line("the reply to PING")?;
    // `-NOAUTH Authentication required.`: the server is up and answering,
    // it just wants a password the balancer does not have.
    if !(reply.starts_with("+PONG") || reply.starts_with("-NOAUTH")) {
        return Err(format!("answered {}", preview(reply.as_bytes())));
    }
    // QUIT is allowed before AUTH; the server answers +OK and closes.
    let _ = conn.send(b"QUIT\r\n", "QUIT");
    conn.finish();
    Ok(())
}

/// The TLS record type of a handshake message.
const TLS_HANDSHAKE: u8 = 0x16;
/// The TLS record type of an alert.
const TLS_ALERT: u8 = 0x15;

/// TLS: send a ClientHello, want a handshake record (the ServerHello, or a
/// HelloRetryRequest, which is one too) in answer.
fn tls(conn: &mut Conn) -> Result<(), String> {
    conn.send(&client_hello(None), "the ClientHello")?;
    let header = conn.take(5, "the ServerHello")?;
    let (kind, major, minor) = (header[0], header[1], header[2]);
    if kind == TLS_HANDSHAKE && major == 3 && minor <= 4 {
        // Close as soon as the server has shown it speaks TLS: a client
        // that gives up after the ServerHello breaks no rule, and servers
        // log it below their default level (nginx: at `info`, "peer closed
        // connection in SSL handshake").
        conn.finish();
        return Ok(());
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
fn client_hello(server_name: Option<&str>) -> Vec<u8> {
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

/// SMTP: the greeting must be a 220 reply; then `QUIT`, whose 221 is read
/// if the server sends it (one that simply closes is fine too).
fn smtp(conn: &mut Conn) -> Result<(), String> {
    let (code, text) = smtp_reply(conn, "the greeting")?;
    if code != "220" {
        return Err(format!("greeting {}", preview(text.as_bytes())));
    }
    if conn.send(b"QUIT\r\n", "QUIT").is_ok() {
        let _ = smtp_reply(conn, "the reply to QUIT");
    }
    conn.finish();
    Ok(())
}

/// Reads one SMTP reply, which may span lines (`250-first`, `250 last`):
/// its code and its last line.
fn smtp_reply(conn: &mut Conn, what: &str) -> Result<(String, String), String> {
    loop {
        let line = conn.line(what)?;
        let code = line.get(..3).unwrap_or_default().to_string();
        if !code.bytes().all(|b| b.is_ascii_digit()) || code.len() < 3 {
            return Err(format!("not an SMTP reply: {}", preview(line.as_bytes())));
        }
        // "220-" continues on the next line; "220 " or a bare "220" ends.
        if line.as_bytes().get(3) != Some(&b'-') {
            return Ok((code, line));
        }
    }
}

/// MySQL capability flags used here.
mod client {
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
fn mysql(conn: &mut Conn, user: Option<&str>) -> Result<(), String> {
    let (_, greeting) = mysql_packet(conn, "the server greeting")?;
    match greeting.first() {
        Some(10) => {}
        Some(0xff) => return Err(mysql_error(&greeting)),
        Some(v) => return Err(format!("greeting with protocol version {v}, not 10")),
        None => return Err("an empty greeting".into()),
    }
    let Some(user) = user else {
        // Nothing a client can send without an account ends the session
        // without a log line (a bad handshake or an unknown user is logged
        // too, as worse), so close: MariaDB then logs "Aborted connection
        // ... (This connection closed normally without authentication)".
        return Ok(());
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
    Ok(())
}

/// What the check needs from a MySQL greeting (the "initial handshake
/// packet", protocol 10).
struct Greeting {
    /// The server's capability flags (the lower and upper 16 bits).
    capabilities: u32,
    /// The default authentication plugin, `mysql_native_password` if none
    /// is named.
    plugin: String,
}

impl Greeting {
    fn parse(p: &[u8]) -> Result<Greeting, String> {
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

/// The PostgreSQL protocol version 3.0, as a StartupMessage carries it.
const PG_PROTOCOL_3_0: u32 = 3 << 16;

/// PostgreSQL: a StartupMessage; an authentication request or an error
/// shows a live server.
fn pgsql(conn: &mut Conn, user: &str) -> Result<(), String> {
    let mut body = Vec::new();
    body.extend_from_slice(&PG_PROTOCOL_3_0.to_be_bytes());
    for (key, value) in [
        ("user", user),
        ("database", user),
        ("application_name", "rodizio-health"),
    ] {
        body.extend_from_slice(key.as_bytes());
        body.push(0);
        body.extend_from_slice(value.as_bytes());
        body.push(0);
    }
    body.push(0);
    let len = u32::try_from(body.len() + 4).unwrap_or(u32::MAX);
    let mut startup = len.to_be_bytes().to_vec();
    startup.extend_from_slice(&body);
    conn.send(&startup, "the StartupMessage")?;

    let (kind, message) = pg_message(conn, "the reply to the StartupMessage")?;
    match kind {
        b'R' if message.get(..4) == Some(&[0, 0, 0, 0]) => {
            // AuthenticationOk (a trusted user): the session starts; wait
            // for ReadyForQuery, then say goodbye with Terminate.
            loop {
                let (kind, message) = pg_message(conn, "ReadyForQuery")?;
                match kind {
                    b'Z' => break,
                    // A FATAL after authentication (no such database): still
                    // a server answering, and the session is over.
                    b'E' => return pg_error(&message),
                    _ => {}
                }
            }
            conn.send(&[b'X', 0, 0, 0, 4], "Terminate")?;
            conn.finish();
            Ok(())
        }
        b'R' => {
            // A password is wanted. Just close: the server expects a
            // password message now, and logs "expected password response,
            // got message type 88" for a Terminate, but nothing for a client
            // that leaves without offering one (psql does that every time
            // it prompts for a password).
            conn.finish();
            Ok(())
        }
        b'E' => pg_error(&message),
        other => Err(format!(
            "not a PostgreSQL reply: message type {}",
            preview(&[other])
        )),
    }
}

/// An ErrorResponse: the server is alive (it refused this user or
/// database, as pgsql-check in HAProxy accepts) unless it says it cannot
/// take connections at all: SQL states 57P01..57P03, shutting down,
/// crashed or starting up; and 53300, too many connections.
fn pg_error(message: &[u8]) -> Result<(), String> {
    let field = |code: u8| {
        message
            .split(|&b| b == 0)
            .find(|f| f.first() == Some(&code))
            .map(|f| String::from_utf8_lossy(&f[1..]).into_owned())
            .unwrap_or_default()
    };
    let state = field(b'C');
    if state.starts_with("57P") || state == "53300" {
        return Err(format!("server error {state}: {}", field(b'M')));
    }
    Ok(())
}

/// Reads one PostgreSQL backend message: a type byte, a 4-byte big-endian
/// length that counts itself, the body.
fn pg_message(conn: &mut Conn, what: &str) -> Result<(u8, Vec<u8>), String> {
    let header = conn.take(5, what)?;
    let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    if !(4..=MAX_REPLY_BYTES).contains(&len) {
        return Err(format!(
            "not a PostgreSQL message: {} for {what}",
            preview(&header)
        ));
    }
    let body = conn.take(len - 4, what)?;
    Ok((header[0], body))
}

/// Send/expect: write `send`, then read until `expect` appears; then end
/// as the other checks do ([`Conn::finish`]: most servers close when they
/// read the end of the stream, so this costs one round trip).
fn send_expect(conn: &mut Conn, send: &[u8], expect: &[u8]) -> Result<(), String> {
    if !send.is_empty() {
        conn.send(send, "the send bytes")?;
    }
    let waiting_for = preview(expect);
    while !contains(&conn.buf, expect) {
        conn.fill(&waiting_for, MAX_EXPECT_BYTES).map_err(|e| {
            if conn.buf.is_empty() {
                e
            } else {
                format!("{e}; got {}", preview(&conn.buf))
            }
        })?;
    }
    conn.finish();
    Ok(())
}

/// Whether `needle` occurs in `haystack` (an empty needle always does).
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::thread;

    /// A one-connection fake server: runs `serve` on the accepted stream in
    /// a thread, and returns the client side, connected.
    fn fake(serve: impl FnOnce(TcpStream) + Send + 'static) -> (TcpStream, thread::JoinHandle<()>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let handle = thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
            serve(s);
        });
        (client, handle)
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    #[test]
    fn parse_bytes_text_escapes_and_hex() {
        assert_eq!(parse_bytes("SSH-").unwrap(), b"SSH-");
        assert_eq!(
            parse_bytes(r"a\r\n\t\0\\\x41\xff").unwrap(),
            b"a\r\n\t\0\\A\xff"
        );
        assert_eq!(parse_bytes("é").unwrap(), "é".as_bytes());
        assert_eq!(parse_bytes("hex:0D0a00").unwrap(), b"\r\n\0");
        assert_eq!(parse_bytes("hex:").unwrap(), b"");
        assert_eq!(parse_bytes("").unwrap(), b"");
        assert!(parse_bytes(r"\q")
            .unwrap_err()
            .contains("unknown escape \\q"));
        assert!(parse_bytes("end\\").unwrap_err().contains("trailing"));
        assert!(parse_bytes(r"\x4").unwrap_err().contains("two hex digits"));
        assert!(parse_bytes(r"\xg0").unwrap_err().contains("two hex digits"));
        assert!(parse_bytes("hex:abc").unwrap_err().contains("even number"));
        assert!(parse_bytes("hex:zz").unwrap_err().contains("'z'"));
    }

    #[test]
    fn client_hello_lengths_add_up() {
        for sni in [None, Some("backend.example")] {
            let hello = client_hello(sni);
            assert_eq!(&hello[..3], &[0x16, 0x03, 0x01]);
            let record_len = usize::from(u16::from_be_bytes([hello[3], hello[4]]));
            assert_eq!(record_len, hello.len() - 5);
            assert_eq!(hello[5], 1, "ClientHello");
            let hs_len =
                usize::from(hello[6]) << 16 | usize::from(hello[7]) << 8 | usize::from(hello[8]);
            assert_eq!(hs_len, hello.len() - 9);
            // version, random, session id, suites, compression.
            let mut at = 9 + 2 + 32;
            assert_eq!(hello[at], 0);
            at += 1;
            let suites = usize::from(u16::from_be_bytes([hello[at], hello[at + 1]]));
            at += 2 + suites + 2;
            let ext_len = usize::from(u16::from_be_bytes([hello[at], hello[at + 1]]));
            assert_eq!(ext_len, hello.len() - at - 2);
            // Walk the extensions: each length must land exactly at the end.
            at += 2;
            let mut kinds = Vec::new();
            while at < hello.len() {
                kinds.push(u16::from_be_bytes([hello[at], hello[at + 1]]));
                at += 4 + usize::from(u16::from_be_bytes([hello[at + 2], hello[at + 3]]));
            }
            assert_eq!(at, hello.len());
            assert!(kinds.contains(&0x002b), "supported_versions");
            assert_eq!(kinds.contains(&0x0000), sni.is_some(), "SNI");
        }
        assert_ne!(
            client_hello(None)[11..43],
            client_hello(None)[11..43],
            "random"
        );
    }

    #[test]
    fn redis_pong_and_noauth_are_healthy_anything_else_is_not() {
        for (answer, ok) in [
            (&b"+PONG\r\n"[..], true),
            (b"-NOAUTH Authentication required.\r\n", true),
            (b"-ERR unknown command 'PING'\r\n", false),
            (b"-LOADING Redis is loading\r\n", false),
        ] {
            let (mut c, h) = fake(move |mut s| {
                let mut got = [0u8; 6];
                s.read_exact(&mut got).unwrap();
                assert_eq!(&got, b"PING\r\n");
                s.write_all(answer).unwrap();
                if ok {
                    s.read_exact(&mut got).unwrap();
                    assert_eq!(&got, b"QUIT\r\n");
                }
            });
            let r = run(&ProtocolCheck::Redis, &mut c, soon());
            assert_eq!(r.is_ok(), ok, "{answer:?}: {r:?}");
            if let Err(e) = r {
                assert!(e.starts_with("redis: answered \"-"), "{e}");
            }
            h.join().unwrap();
        }
    }

    #[test]
    fn a_reply_split_in_bytes_parses_the_same() {
        let (mut c, h) = fake(|mut s| {
            let mut got = [0u8; 6];
            s.read_exact(&mut got).unwrap();
            for b in b"+PONG\r\n" {
                s.write_all(&[*b]).unwrap();
                s.flush().unwrap();
            }
        });
        assert_eq!(run(&ProtocolCheck::Redis, &mut c, soon()), Ok(()));
        h.join().unwrap();
    }

    #[test]
    fn smtp_multiline_greeting_then_quit() {
        let (mut c, h) = fake(|mut s| {
            s.write_all(b"220-mail.example ESMTP\r\n220 ready\r\n")
                .unwrap();
            let mut got = [0u8; 6];
            s.read_exact(&mut got).unwrap();
            assert_eq!(&got, b"QUIT\r\n");
            s.write_all(b"221 bye\r\n").unwrap();
        });
        assert_eq!(run(&ProtocolCheck::Smtp, &mut c, soon()), Ok(()));
        h.join().unwrap();
        let (mut c, h) = fake(|mut s| s.write_all(b"554 no service here\r\n").unwrap());
        let e = run(&ProtocolCheck::Smtp, &mut c, soon()).unwrap_err();
        assert_eq!(e, "smtp: greeting \"554 no service here\"");
        h.join().unwrap();
    }

    #[test]
    fn mysql_error_greeting_is_unhealthy_with_its_message() {
        let (mut c, h) = fake(|mut s| {
            let mut p = vec![0xff, 0x10, 0x04];
            p.extend_from_slice(b"Too many connections");
            let mut packet = vec![p.len() as u8, 0, 0, 0];
            packet.extend_from_slice(&p);
            s.write_all(&packet).unwrap();
        });
        let check = ProtocolCheck::Mysql {
            user: Some("u".into()),
        };
        let e = run(&check, &mut c, soon()).unwrap_err();
        assert_eq!(e, "mysql: server error 1040: Too many connections");
        h.join().unwrap();
    }

    /// The greeting of MariaDB 10.11, as sent on the wire.
    const MARIADB_GREETING: &[u8] =
        b"d\x00\x00\x00\n5.5.5-10.11.19-MariaDB-0+deb12u1\x00\x19\x00\x00\x00\
        ic8,qw#E\x00\xfe\xf7\x08\x02\x00\xff\x81\x15\x00\x00\x00\x00\x00\x00\x1d\x00\x00\x00\
        q-(!kzE(4oR-\x00mysql_native_password\x00";

    fn read_packet(s: &mut TcpStream) -> (u8, Vec<u8>) {
        let mut header = [0u8; 4];
        s.read_exact(&mut header).unwrap();
        let len = usize::from(header[0]) | usize::from(header[1]) << 8;
        let mut payload = vec![0; len];
        s.read_exact(&mut payload).unwrap();
        (header[3], payload)
    }

    #[test]
    fn mysql_greeting_parses_and_a_plugin_switch_is_answered() {
        let g = Greeting::parse(&MARIADB_GREETING[4..]).unwrap();
        assert_eq!(g.plugin, "mysql_native_password");
        assert_eq!(g.capabilities & client::LONG_PASSWORD, 0, "MariaDB");
        assert_ne!(g.capabilities & client::PLUGIN_AUTH, 0);

        let (mut c, h) = fake(|mut s| {
            s.write_all(MARIADB_GREETING).unwrap();
            let (seq, login) = read_packet(&mut s);
            assert_eq!(seq, 1);
            let caps = u32::from_le_bytes(login[..4].try_into().unwrap());
            assert_ne!(caps & client::PROTOCOL_41, 0);
            assert_eq!(caps & client::LONG_PASSWORD, 0, "masked with the server's");
            let user_and_rest = &login[32..];
            assert!(user_and_rest.starts_with(b"check\0\0mysql_native_password\0"));
            // Ask for another plugin; the empty answer comes with seq 3.
            s.write_all(b"\x18\x00\x00\x02\xfeclient_ed25519\x00ABCDEFG\x00")
                .unwrap();
            assert_eq!(read_packet(&mut s), (3, vec![]));
            s.write_all(b"\x07\x00\x00\x04\x00\x00\x00\x02\x00\x00\x00")
                .unwrap();
            assert_eq!(read_packet(&mut s), (0, vec![0x01]), "COM_QUIT");
        });
        let check = ProtocolCheck::Mysql {
            user: Some("check".into()),
        };
        assert_eq!(run(&check, &mut c, soon()), Ok(()));
        h.join().unwrap();
    }

    #[test]
    fn tls_alert_is_unhealthy_and_named() {
        let (mut c, h) = fake(|mut s| {
            let mut hello = [0u8; 5];
            s.read_exact(&mut hello).unwrap();
            assert_eq!(hello[0], 0x16);
            s.write_all(&[0x15, 3, 3, 0, 2, 2, 40]).unwrap();
        });
        let e = run(&ProtocolCheck::Tls, &mut c, soon()).unwrap_err();
        assert_eq!(
            e,
            "tls: the server answered with an alert (level 2, description 40: handshake_failure)"
        );
        h.join().unwrap();
    }

    #[test]
    fn pgsql_errors_that_mean_no_connections_are_unhealthy() {
        let error = |state: &str| {
            let mut m = b"SFATAL\0C".to_vec();
            m.extend_from_slice(state.as_bytes());
            m.extend_from_slice(b"\0Mthe database system is starting up\0\0");
            m
        };
        assert!(pg_error(&error("28000")).is_ok());
        assert!(pg_error(&error("3D000")).is_ok());
        let e = pg_error(&error("57P03")).unwrap_err();
        assert_eq!(e, "server error 57P03: the database system is starting up");
        assert!(pg_error(&error("53300")).is_err());
    }

    #[test]
    fn send_expect_finds_bytes_across_reads_and_respects_the_bound() {
        let (mut c, h) = fake(|mut s| {
            let mut got = [0u8; 3];
            s.read_exact(&mut got).unwrap();
            assert_eq!(&got, b"hi\n");
            s.write_all(b"hello, ").unwrap();
            s.flush().unwrap();
            s.write_all(b"OK\n").unwrap();
        });
        let check = ProtocolCheck::SendExpect {
            send: b"hi\n".to_vec(),
            expect: b"OK".to_vec(),
        };
        assert_eq!(run(&check, &mut c, soon()), Ok(()));
        h.join().unwrap();

        let (mut c, h) = fake(|mut s| {
            let _ = s.write_all(&[b'x'; 10_000]);
        });
        let check = ProtocolCheck::SendExpect {
            send: vec![],
            expect: b"OK".to_vec(),
        };
        let e = run(&check, &mut c, soon()).unwrap_err();
        assert!(e.contains("in the first 4096 bytes"), "{e}");
        drop(c);
        h.join().unwrap();
    }

    #[test]
    fn a_past_deadline_fails_at_once() {
        let (mut c, h) = fake(|_| {});
        let e = run(&ProtocolCheck::Smtp, &mut c, Instant::now()).unwrap_err();
        assert_eq!(e, "smtp: timed out waiting for the greeting");
        h.join().unwrap();
    }
}
