//! `access_log_format`: a line of the operator's own, written as a
//! template over the record's fields, `{client} {backend} {end}`. Checked
//! when the configuration is read: an unknown field, an unclosed brace or
//! a template too long is refused there, with the field named, never at
//! the first connection.
//!
//! Each `{field}` is written as the text format writes it (a value with a
//! space, a quote or a control character in JSON quotes, a missing one as
//! `-`), so a line stays one line; `{{` and `}}` are literal braces.
//!
//! # Threads
//!
//! Parsed on the main thread; the writer thread renders.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::fmt;
use std::io::{self, Write as _};
use std::str::FromStr;

use super::format::{text_value, Rfc3339, Short};
use super::Record;
use crate::error::{Error, Result};

/// The longest template accepted, in bytes: a line is for reading, and a
/// longer one is a mistake (a file pasted in) rather than a format.
pub const MAX_TEMPLATE: usize = 4096;

/// The fields a template may name, in the text format's order.
pub const FIELDS: [&str; 16] = [
    "time",
    "client",
    "service",
    "sni",
    "backend",
    "queue",
    "connect",
    "duration",
    "failovers",
    "to_backend",
    "to_client",
    "end",
    "reason",
    "tls",
    "tls_client",
    "event",
];

/// A parsed `access_log_format`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    /// As written, for `check-config`.
    source: String,
    pieces: Vec<Piece>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    /// An index into [`FIELDS`].
    Field(usize),
}

impl FromStr for Template {
    type Err = Error;

    fn from_str(source: &str) -> Result<Template> {
        let bad = |why: String| Error::InvalidConfig(format!("access log format: {why}"));
        if source.len() > MAX_TEMPLATE {
            return Err(bad(format!(
                "{} bytes, at most {MAX_TEMPLATE}",
                source.len()
            )));
        }
        if source.trim().is_empty() {
            return Err(bad("empty: name at least one field, e.g. {client}".into()));
        }
        let mut pieces = Vec::new();
        let mut text = String::new();
        let mut rest = source;
        while let Some(c) = rest.chars().next() {
            if rest.starts_with("{{") || rest.starts_with("}}") {
                text.push(c);
                rest = &rest[2..];
            } else if c == '{' {
                let Some(end) = rest.find('}') else {
                    return Err(bad(format!("'{{' without its '}}' in {rest:.40}")));
                };
                let name = &rest[1..end];
                let Some(at) = FIELDS.iter().position(|f| *f == name) else {
                    return Err(bad(format!(
                        "unknown field {{{name:.40}}}; the fields are {}",
                        FIELDS.join(", ")
                    )));
                };
                if !text.is_empty() {
                    pieces.push(Piece::Text(std::mem::take(&mut text)));
                }
                pieces.push(Piece::Field(at));
                rest = &rest[end + 1..];
            } else if c == '}' {
                return Err(bad("a lone '}' (write '}}' for a brace)".into()));
            } else if c.is_control() {
                return Err(bad("a control character (a line must stay one line)".into()));
            } else {
                text.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
        if !text.is_empty() {
            pieces.push(Piece::Text(text));
        }
        Ok(Template {
            source: source.to_string(),
            pieces,
        })
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

impl Template {
    /// Appends the line for `r` to `out`, without the newline.
    pub(super) fn write(&self, r: &Record, out: &mut Vec<u8>) {
        for piece in &self.pieces {
            // Writing into a `Vec` cannot fail.
            let _ = match piece {
                Piece::Text(text) => {
                    out.extend_from_slice(text.as_bytes());
                    Ok(())
                }
                Piece::Field(at) => field(r, FIELDS[*at], out),
            };
        }
    }
}

/// One field of `r` as the text format writes it; `-` when it has none.
fn field(r: &Record, name: &str, out: &mut Vec<u8>) -> io::Result<()> {
    let text = |out: &mut Vec<u8>, value: Option<&str>| match value {
        Some(value) => text_value(out, value),
        None => {
            out.push(b'-');
            Ok(())
        }
    };
    let tls = r.tls.as_ref();
    match name {
        "time" => write!(out, "{}", Rfc3339(r.time)),
        "client" => write!(out, "{}", r.client),
        "service" => text(out, r.service.as_deref()),
        "sni" => text(
            out,
            r.sni
                .as_deref()
                .or_else(|| tls.and_then(|t| t.sni.as_deref())),
        ),
        "backend" => text(out, r.backend.as_deref()),
        "queue" => write!(out, "{}", Short(r.queue_wait)),
        "connect" => match r.connect_time {
            Some(d) => write!(out, "{}", Short(d)),
            None => text(out, None),
        },
        "duration" => write!(out, "{}", Short(r.duration)),
        "failovers" => {
            write!(out, "{}", r.failovers)?;
            match r.failovers_ended {
                Some(ended) => write!(out, "/{}", ended.name()),
                None => Ok(()),
            }
        }
        "to_backend" => write!(out, "{}", r.bytes_to_backend),
        "to_client" => write!(out, "{}", r.bytes_to_client),
        "end" => text(out, r.phase.is_end().then(|| r.end.name())),
        "reason" => text(out, r.end.reason().filter(|_| r.phase.is_end())),
        "tls" => text(out, tls.map(|t| t.version)),
        "tls_client" => text(out, tls.and_then(|t| t.client.as_deref())),
        _ => text(out, Some(r.phase.name())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access_log::{End, Phase, TlsNote, TriesEnded};
    use std::time::{Duration, UNIX_EPOCH};

    fn record() -> Record {
        Record {
            time: UNIX_EPOCH + Duration::from_millis(1_796_118_800_123),
            client: "127.0.0.1:5000".parse().unwrap(),
            service: None,
            sni: None,
            backend: Some("127.0.0.1:8001".into()),
            queue_wait: Duration::from_micros(12),
            connect_time: Some(Duration::from_micros(85)),
            duration: Duration::from_micros(1_203),
            failovers: 0,
            failovers_ended: None,
            bytes_to_backend: 77,
            bytes_to_client: 612,
            end: End::Error("a \"b\"\n".into()),
            phase: Phase::End,
            tls: None,
        }
    }

    fn line(template: &str, r: &Record) -> String {
        let t: Template = template.parse().unwrap();
        let mut out = Vec::new();
        t.write(r, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn every_field_is_written_as_the_text_line_writes_it() {
        let all: Vec<String> = FIELDS.iter().map(|f| format!("{{{f}}}")).collect();
        let mut r = record();
        assert_eq!(
            line(&all.join(" "), &r),
            "2026-12-01T09:53:20.123Z 127.0.0.1:5000 - - 127.0.0.1:8001 12us 85us 1.203ms 0 \
             77 612 error \"a \\\"b\\\"\\n\" - - end"
        );
        r.failovers = 2;
        r.failovers_ended = Some(TriesEnded::Budget);
        r.tls = Some(TlsNote {
            version: "TLSv1.3",
            sni: Some("a.test".into()),
            client: Some("CN=a b".into()),
        });
        r.phase = Phase::Interim;
        assert_eq!(
            line(
                "{failovers} {sni} {tls} {tls_client} {end} {reason} {event}",
                &r
            ),
            "2/budget a.test TLSv1.3 \"CN=a b\" - - interim"
        );
        assert_eq!(line("{{{client}}} 100%", &r), "{127.0.0.1:5000} 100%");
    }

    #[test]
    fn bad_templates_are_refused_naming_what_is_wrong() {
        for (bad, says) in [
            ("{client} {bytes}", "unknown field {bytes}"),
            ("{client", "without its"),
            ("client}", "lone '}'"),
            ("", "empty"),
            ("   ", "empty"),
            ("{client}\n{end}", "control character"),
            ("{}", "unknown field {}"),
        ] {
            let err = bad.parse::<Template>().unwrap_err().to_string();
            assert!(err.contains(says), "{bad:?}: {err}");
        }
        let unknown = "{nope}".parse::<Template>().unwrap_err().to_string();
        assert!(unknown.contains("the fields are time, client"), "{unknown}");
    }

    /// A template past [`MAX_TEMPLATE`] is refused at once, whatever it
    /// holds; one at the limit parses and prints back as written.
    #[test]
    fn huge_templates_are_refused() {
        let huge = "{client}".repeat(1_000_000);
        let started = std::time::Instant::now();
        let err = huge.parse::<Template>().unwrap_err().to_string();
        assert!(err.contains("at most 4096"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(1));
        let unknown = format!("{{{}}}", "x".repeat(MAX_TEMPLATE - 2));
        let err = unknown.parse::<Template>().unwrap_err().to_string();
        assert!(err.len() < 400, "the error is clipped: {}", err.len());
        let most = "{end}".repeat(MAX_TEMPLATE / 5);
        let t: Template = most.parse().unwrap();
        assert_eq!(t.to_string(), most);
    }
}
