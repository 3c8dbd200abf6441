//! The PostgreSQL check: a StartupMessage; an authentication request or
//! an error shows a live server.
//!
//! # Threads
//!
//! Runs on the health checker's probe thread, on the stream it is given.
//! No C counterpart.

use super::conn::{preview, Conn};
use super::MAX_REPLY_BYTES;

/// The PostgreSQL protocol version 3.0, as a StartupMessage carries it.
const PG_PROTOCOL_3_0: u32 = 3 << 16;

/// PostgreSQL: a StartupMessage; an authentication request or an error
/// shows a live server. Healthy: which of them.
pub(super) fn pgsql(conn: &mut Conn, user: &str) -> Result<String, String> {
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
            Ok(format!("a session for '{user}' (trusted), ended"))
        }
        b'R' => {
            // A password is wanted. Just close: the server expects a
            // password message now, and logs "expected password response,
            // got message type 88" for a Terminate, but nothing for a client
            // that leaves without offering one (psql does that every time
            // it prompts for a password).
            conn.finish();
            Ok(format!("asked a password of '{user}'"))
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
/// crashed or starting up; and 53300, too many connections. Alive: the
/// error, as the answer.
pub(super) fn pg_error(message: &[u8]) -> Result<String, String> {
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
    Ok(format!("answered error {state}: {}", field(b'M')))
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
