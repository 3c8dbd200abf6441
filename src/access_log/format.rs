//! The two line formats of the access log, text and JSON (see
//! [`Format`]). JSON strings, in both formats, are written by `serde_json`,
//! with one addition ([`Escaping`]): the control characters it leaves as
//! they are (DEL and the C1 controls) are escaped too, so that no line can
//! hide or rewrite what a terminal shows.
//!
//! # Threads
//!
//! The writer thread formats; nothing here is shared.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::fmt;
use std::io::{self, Write as _};
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Serialize, Serializer};

use super::Record;
use crate::error::{Error, Result};

/// How a [`Record`] is written: one line each, in either format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Format {
    /// Space-separated fields, always in this order:
    ///
    /// ```text
    /// TIME CLIENT backend=B queue=D connect=D duration=D failovers=N to_backend=N to_client=N end=E [reason=R]
    /// 2026-12-01T09:53:20.123Z 127.0.0.1:5000 backend=127.0.0.1:8001 queue=12us connect=85us duration=1.203ms failovers=0 to_backend=77 to_client=612 end=backend_closed
    /// ```
    ///
    /// `TIME` is RFC 3339 in UTC with milliseconds. A missing backend or
    /// connect time is `-`. Durations are `12us` below a millisecond,
    /// `1.203ms` below a second, `2.500s` from there on (truncated, not
    /// rounded). When `connect_retries` or `connect_retry_budget` ended
    /// the fail-over while backends were left untried, the count says so:
    /// `failovers=1/retries`, `failovers=3/budget`. `reason=` comes last and only with `end=error` and
    /// `end=connect_failed`. A value
    /// with a space, a quote, a backslash or a control character (a reason
    /// usually) is written in double quotes with JSON's escapes, so a line
    /// is always one line and splits on spaces outside quotes.
    ///
    /// A line written while the connection is open (at its connect, or
    /// every `access_log_interval`) has `end=- event=connect` (or
    /// `event=interim`) in place of its end.
    #[default]
    Text,
    /// One JSON object per line, with every key in every line:
    ///
    /// ```text
    /// {"time":"2026-12-01T09:53:20.123Z","client":"127.0.0.1:5000","backend":"127.0.0.1:8001","queue_us":12,"connect_us":85,"duration_us":1203,"failovers":0,"to_backend":77,"to_client":612,"end":"backend_closed","reason":null}
    /// ```
    ///
    /// Durations are integer microseconds; a missing backend, connect time
    /// or reason is `null`. `"failovers_ended":"retries"` (or `"budget"`)
    /// follows `failovers` only when a limit ended the fail-over. A line
    /// of a connection still open has `"end":null` and, after `reason`,
    /// `"event":"connect"` (or `"interim"`).
    Json,
}

impl Format {
    /// The line for `record`, without the newline.
    pub fn line(self, record: &Record) -> String {
        let mut line = Vec::with_capacity(256);
        self.write(record, &mut line);
        String::from_utf8(line)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    }

    /// Appends the line for `record` to `out`, without the newline.
    pub(super) fn write(self, record: &Record, out: &mut Vec<u8>) {
        // Writing into a `Vec` cannot fail, and every value here can be
        // serialized: the results say nothing.
        let _ = match self {
            Format::Text => text(record, out),
            Format::Json => json(record, out),
        };
    }
}

impl FromStr for Format {
    type Err = Error;

    /// `text` or `json`.
    fn from_str(text: &str) -> Result<Format> {
        match text {
            "text" => Ok(Format::Text),
            "json" => Ok(Format::Json),
            _ => Err(Error::InvalidConfig(format!(
                "access log format '{text}': expected text or json"
            ))),
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Format::Text => "text",
            Format::Json => "json",
        })
    }
}

/// The text line (see [`Format::Text`]).
fn text(r: &Record, out: &mut Vec<u8>) -> io::Result<()> {
    write!(out, "{} {} ", Rfc3339(r.time), r.client)?;
    if let Some(service) = &r.service {
        out.extend_from_slice(b"service=");
        text_value(out, service)?;
        out.push(b' ');
    }
    if let Some(sni) = &r.sni {
        out.extend_from_slice(b"sni=");
        text_value(out, sni)?;
        out.push(b' ');
    }
    out.extend_from_slice(b"backend=");
    match &r.backend {
        Some(backend) => text_value(out, backend)?,
        None => out.push(b'-'),
    }
    write!(out, " queue={} connect=", Short(r.queue_wait))?;
    match r.connect_time {
        Some(connect) => write!(out, "{}", Short(connect))?,
        None => out.push(b'-'),
    }
    write!(
        out,
        " duration={} failovers={}",
        Short(r.duration),
        r.failovers
    )?;
    if let Some(ended) = r.failovers_ended {
        write!(out, "/{}", ended.name())?;
    }
    write!(
        out,
        " to_backend={} to_client={} end=",
        r.bytes_to_backend, r.bytes_to_client
    )?;
    if !r.phase.is_end() {
        // A line of a connection still open: no end yet.
        write!(out, "- event={}", r.phase.name())?;
    } else {
        out.extend_from_slice(r.end.name().as_bytes());
        if let Some(reason) = r.end.reason() {
            out.extend_from_slice(b" reason=");
            text_value(out, reason)?;
        }
    }
    if let Some(tls) = &r.tls {
        write!(out, " tls={}", tls.version)?;
        // A client routed by SNI has its name written once, up front.
        if r.sni.is_none() {
            out.extend_from_slice(b" sni=");
            match &tls.sni {
                Some(name) => text_value(out, name)?,
                None => out.push(b'-'),
            }
        }
        if let Some(client) = &tls.client {
            out.extend_from_slice(b" tls_client=");
            text_value(out, client)?;
        }
    }
    Ok(())
}

/// A value of the text format: as it is when it needs no quoting, else a
/// JSON string (quoted, escaped), so it stays one field on one line.
pub(super) fn text_value(out: &mut Vec<u8>, value: &str) -> io::Result<()> {
    let plain = !value.is_empty()
        && value
            .chars()
            .all(|c| !c.is_whitespace() && !c.is_control() && c != '"' && c != '\\');
    if plain {
        out.extend_from_slice(value.as_bytes());
        Ok(())
    } else {
        value
            .serialize(&mut serde_json::Serializer::with_formatter(out, Escaping))
            .map_err(io::Error::from)
    }
}

/// The fields of a JSON line, in their order (see [`Format::Json`]).
#[derive(Serialize)]
struct JsonLine<'a> {
    #[serde(serialize_with = "as_text")]
    time: Rfc3339,
    #[serde(serialize_with = "as_text")]
    client: std::net::SocketAddr,
    #[serde(skip_serializing_if = "Option::is_none")]
    service: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sni: Option<&'a str>,
    backend: Option<&'a str>,
    queue_us: u64,
    connect_us: Option<u64>,
    duration_us: u64,
    failovers: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    failovers_ended: Option<&'static str>,
    to_backend: u64,
    to_client: u64,
    end: Option<&'static str>,
    reason: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    event: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tls: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_client: Option<&'a str>,
}

/// A field written as the string its `Display` makes.
fn as_text<T: fmt::Display, S: Serializer>(
    value: &T,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    s.collect_str(value)
}

/// The JSON line (see [`Format::Json`]).
fn json(r: &Record, out: &mut Vec<u8>) -> io::Result<()> {
    let line = JsonLine {
        time: Rfc3339(r.time),
        client: r.client,
        service: r.service.as_deref(),
        // Routed by SNI, or the name a terminated handshake asked for.
        sni: r
            .sni
            .as_deref()
            .or_else(|| r.tls.as_ref().and_then(|t| t.sni.as_deref())),
        backend: r.backend.as_deref(),
        queue_us: micros(r.queue_wait),
        connect_us: r.connect_time.map(micros),
        duration_us: micros(r.duration),
        failovers: r.failovers,
        failovers_ended: r.failovers_ended.map(super::TriesEnded::name),
        to_backend: r.bytes_to_backend,
        to_client: r.bytes_to_client,
        end: r.phase.is_end().then(|| r.end.name()),
        reason: r.end.reason().filter(|_| r.phase.is_end()),
        event: (!r.phase.is_end()).then(|| r.phase.name()),
        tls: r.tls.as_ref().map(|t| t.version),
        tls_client: r.tls.as_ref().and_then(|t| t.client.as_deref()),
    };
    line.serialize(&mut serde_json::Serializer::with_formatter(out, Escaping))
        .map_err(io::Error::from)
}

/// `serde_json`'s compact output, and `\uXXXX` for the control characters
/// it writes as they are (DEL, U+0080 to U+009F): `"`, `\\` and the C0
/// controls it escapes itself (RFC 8259 section 7).
struct Escaping;

impl serde_json::ser::Formatter for Escaping {
    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        out: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let mut rest = fragment;
        while let Some((i, c)) = rest.char_indices().find(|(_, c)| c.is_control()) {
            out.write_all(&rest.as_bytes()[..i])?;
            write!(out, "\\u{:04x}", u32::from(c))?;
            rest = &rest[i + c.len_utf8()..];
        }
        out.write_all(rest.as_bytes())
    }
}

/// Whole microseconds, saturating (a `u64` of them is 584 000 years).
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A duration for people: `12us`, `1.203ms`, `2.500s` (truncated).
pub(super) struct Short(pub(super) Duration);

impl fmt::Display for Short {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let us = micros(self.0);
        if us < 1_000 {
            write!(f, "{us}us")
        } else if us < 1_000_000 {
            write!(f, "{}.{:03}ms", us / 1_000, us % 1_000)
        } else {
            let ms = us / 1_000;
            write!(f, "{}.{:03}s", ms / 1_000, ms % 1_000)
        }
    }
}

/// A `SystemTime` as RFC 3339 in UTC with milliseconds:
/// `2026-12-01T09:53:20.123Z`. Truncated to the millisecond (rounding up
/// could turn 23:59:59.9999 into the next day), as jiff prints a
/// timestamp at a given precision; jiff keeps the calendar.
pub(super) struct Rfc3339(pub(super) SystemTime);

impl fmt::Display for Rfc3339 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // jiff covers the years -9999 to 9999; a clock outside them is
        // wrong anyway, and is printed as the nearest end of that range.
        let time = jiff::Timestamp::try_from(self.0).unwrap_or(if self.0 < UNIX_EPOCH {
            jiff::Timestamp::MIN
        } else {
            jiff::Timestamp::MAX
        });
        write!(f, "{time:.3}")
    }
}
