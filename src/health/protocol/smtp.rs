//! The SMTP check: the greeting must be `220`, then `QUIT`.
//!
//! # Threads
//!
//! Runs on the health checker's probe thread, on the stream it is given.
//! No C counterpart.

use super::conn::{preview, Conn};

/// SMTP: the greeting must be a 220 reply; then `QUIT`, whose 221 is read
/// if the server sends it (one that simply closes is fine too). Healthy:
/// the greeting's last line.
pub(super) fn smtp(conn: &mut Conn) -> Result<String, String> {
    let (code, text) = smtp_reply(conn, "the greeting")?;
    if code != "220" {
        return Err(format!("greeting {}", preview(text.as_bytes())));
    }
    if conn.send(b"QUIT\r\n", "QUIT").is_ok() {
        let _ = smtp_reply(conn, "the reply to QUIT");
    }
    conn.finish();
    Ok(format!("greeting {}", preview(text.as_bytes())))
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
