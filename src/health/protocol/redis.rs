//! The Redis check: an inline `PING`, then `QUIT`.
//!
//! # Threads
//!
//! Runs on the health checker's probe thread, on the stream it is given.
//! No C counterpart.

use super::conn::{preview, Conn};

/// Redis: an inline `PING` (the plain-text form every Redis and its forks
/// accept, no RESP framing needed), then `QUIT`. Healthy: what it answered
/// (`answered "+PONG"`).
pub(super) fn redis(conn: &mut Conn) -> Result<String, String> {
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
    Ok(format!("answered {}", preview(reply.as_bytes())))
}
