//! Protocol-aware health checks: speak just enough of a backend's own
//! protocol that it sees a well-behaved client, not a broken one.
//!
//! A plain connect-and-close check is logged as an error by some servers
//! (MariaDB, sshd, iperf3). Each [`ProtocolCheck`] opens the conversation
//! the way a client would and ends it the way the protocol says a session
//! ends, as HAProxy's `redis-check`, `mysql-check` and the others do; one
//! file per protocol (`redis`, `tls`, `smtp`, `mysql`, `pgsql`,
//! `send_expect`), the shared conversation in `conn.rs`; `tls_verified`,
//! the `tls` check of a service that re-encrypts (a whole handshake).
//! `docs/health-checks.md` says which check suits which server and why.
//!
//! [`run`] takes a stream the caller has already connected and a deadline
//! for the whole conversation: every read and write sets its socket
//! timeout to the time left. It returns a short reason on failure.
//!
//! # Threads
//!
//! [`run`] is called on the health checker's thread (one short-lived
//! thread per probe of a round, see [`crate::health`]); it holds no lock and
//! touches no shared state, only the stream it is given. No C counterpart:
//! the C never checks a backend.

use std::net::TcpStream;
use std::time::Instant;

mod conn;
mod mysql;
mod pgsql;
mod redis;
mod send_expect;
mod smtp;
mod tls;
pub(crate) mod tls_verified;

use conn::Conn;
/// The `tls` check's ClientHello, also what the SNI parser's tests read.
#[cfg(test)]
pub(crate) use tls::client_hello;

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
    answer(check, stream, deadline).map(drop)
}

/// [`run`], saying on success what the server answered, in a few words:
/// `answered "+PONG"`, `greeting "220 mail.example ESMTP"`, `greeting from
/// "10.11.6-MariaDB"`, `asked a password of 'rodizio'` (`rodizio probe`
/// prints it).
///
/// # Errors
///
/// As [`run`].
pub fn answer(
    check: &ProtocolCheck,
    stream: &mut TcpStream,
    deadline: Instant,
) -> Result<String, String> {
    let mut conn = Conn::new(stream, deadline);
    let result = match check {
        ProtocolCheck::Redis => redis::redis(&mut conn),
        ProtocolCheck::Tls => tls::tls(&mut conn),
        ProtocolCheck::Smtp => smtp::smtp(&mut conn),
        ProtocolCheck::Mysql { user } => mysql::mysql(&mut conn, user.as_deref()),
        ProtocolCheck::Pgsql { user } => pgsql::pgsql(&mut conn, user),
        ProtocolCheck::SendExpect { send, expect } => {
            send_expect::send_expect(&mut conn, send, expect)
        }
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

#[cfg(test)]
mod tests;
