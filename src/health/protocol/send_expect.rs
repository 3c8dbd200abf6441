//! The send/expect check: write some bytes, read until others appear.
//!
//! # Threads
//!
//! Runs on the health checker's probe thread, on the stream it is given.
//! No C counterpart.

use super::conn::{preview, Conn};
use super::MAX_EXPECT_BYTES;

/// Send/expect: write `send`, then read until `expect` appears; then end
/// as the other checks do ([`Conn::finish`]: most servers close when they
/// read the end of the stream, so this costs one round trip). Healthy:
/// what was found.
pub(super) fn send_expect(conn: &mut Conn, send: &[u8], expect: &[u8]) -> Result<String, String> {
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
    Ok(format!("found {waiting_for}"))
}

/// Whether `needle` occurs in `haystack` (an empty needle always does).
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}
