//! One check's conversation with a server: a stream, a deadline, and the
//! bytes read but not yet used, shared by every protocol's file.
//!
//! # Threads
//!
//! Used on the health checker's probe thread only. No C counterpart.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

use super::{MAX_DRAIN_BYTES, MAX_REPLY_BYTES};

/// One check's conversation: the stream, the deadline, and what has been
/// read but not yet used.
///
/// Reads go into `buf` and the protocol functions take from its front, so
/// a reply split over several TCP segments (or two replies in one) parses
/// the same way.
pub(super) struct Conn<'a> {
    stream: &'a mut TcpStream,
    deadline: Instant,
    /// Bytes received and not yet consumed.
    pub(super) buf: Vec<u8>,
    /// Bytes received in total, checked against a bound.
    received: usize,
}

impl<'a> Conn<'a> {
    pub(super) fn new(stream: &'a mut TcpStream, deadline: Instant) -> Conn<'a> {
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
    pub(super) fn left(&self, waiting_for: &str) -> Result<Duration, String> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            Err(format!("timed out waiting for {waiting_for}"))
        } else {
            Ok(left)
        }
    }

    /// Writes all of `bytes`, each `write` bounded by the time left.
    pub(super) fn send(&mut self, bytes: &[u8], what: &str) -> Result<(), String> {
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
    pub(super) fn fill(&mut self, waiting_for: &str, limit: usize) -> Result<(), String> {
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
    pub(super) fn take(&mut self, n: usize, waiting_for: &str) -> Result<Vec<u8>, String> {
        while self.buf.len() < n {
            self.fill(waiting_for, MAX_REPLY_BYTES)?;
        }
        Ok(self.buf.drain(..n).collect())
    }

    /// Takes one line (up to `\n`, without the line ending), reading as
    /// needed.
    pub(super) fn line(&mut self, waiting_for: &str) -> Result<String, String> {
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
    pub(super) fn finish(&mut self) {
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
pub(super) fn is_timeout(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// The first bytes of a reply, quoted for a log line: text as text, the
/// rest escaped, at most 60 bytes.
pub(super) fn preview(bytes: &[u8]) -> String {
    let shown = &bytes[..bytes.len().min(60)];
    let mut text = format!("\"{}\"", shown.escape_ascii());
    if bytes.len() > shown.len() {
        text.push_str("...");
    }
    text
}
