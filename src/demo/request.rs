//! Reading one request of the demo backend, within bounds: the request
//! line, the header lines and the body (by `Content-Length` or chunked,
//! read and discarded), never holding more than one line, and the status a
//! request gets when it cannot be read.
//!
//! # Threads
//!
//! Runs on the connection's own thread; no shared state. No C
//! counterpart.

use std::fmt;
use std::io::{self, BufRead, Read};
use std::net::TcpStream;
use std::time::Instant;

/// Longest line read while looking for its newline, the newline included:
/// the request line, one header line, one chunk-size line. A client cannot
/// make the backend buffer more than this by never sending a newline.
pub(super) const MAX_LINE: usize = 8 * 1024;
/// Longest head (request line and header lines), and longest trailer
/// section of a chunked body, in bytes.
pub(super) const MAX_HEAD: usize = 16 * 1024;

/// A request line: `METHOD TARGET HTTP/1.MINOR`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RequestLine {
    /// `GET`, `HEAD`, `POST`...: any token, as sent.
    pub(super) method: String,
    /// The path (or any other request target), as sent.
    pub(super) target: String,
    /// The `x` of `HTTP/1.x`.
    pub(super) minor: u8,
}

impl fmt::Display for RequestLine {
    /// The line as a client sends it, without its line ending.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} HTTP/1.{}", self.method, self.target, self.minor)
    }
}

/// How a request's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Body {
    /// No body.
    None,
    /// `Content-Length: N`.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// What the demo backend needs from a request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Head {
    pub(super) request: RequestLine,
    /// `Connection: close` was sent.
    pub(super) close: bool,
    /// `Connection: keep-alive` was sent (it matters on HTTP/1.0 only).
    pub(super) keep_alive_asked: bool,
    pub(super) body: Body,
}

impl Head {
    pub(super) fn new(request: RequestLine) -> Head {
        Head {
            request,
            close: false,
            keep_alive_asked: false,
            body: Body::None,
        }
    }

    /// Whether the connection stays open after the answer: by default on
    /// HTTP/1.1, on request on HTTP/1.0, never after `Connection: close`.
    pub(super) fn keep_alive(&self) -> bool {
        !self.close && (self.request.minor >= 1 || self.keep_alive_asked)
    }

    /// Takes one header line (without its line ending) into account.
    ///
    /// Two ways of delimiting the body, or two different lengths, are
    /// refused rather than guessed at: were the backend and a proxy in front
    /// of it to guess differently, they would disagree on where the next
    /// request starts.
    pub(super) fn field(&mut self, line: &[u8]) -> std::result::Result<(), Reject> {
        let colon = line
            .iter()
            .position(|&b| b == b':')
            .ok_or(Reject::BadRequest)?;
        let (name, value) = (&line[..colon], trim_ows(&line[colon + 1..]));
        // An empty name, a space before the colon or a folded line (one
        // that starts with a space) are all refused, as RFC 9112 asks.
        if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
            return Err(Reject::BadRequest);
        }
        if name.eq_ignore_ascii_case(b"content-length") {
            let n = parse_length(value)?;
            self.body = match self.body {
                Body::None => Body::Length(n),
                Body::Length(m) if m == n => Body::Length(n),
                _ => return Err(Reject::BadRequest),
            };
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            if !value.eq_ignore_ascii_case(b"chunked") {
                return Err(Reject::NotImplemented);
            }
            self.body = match self.body {
                Body::None => Body::Chunked,
                _ => return Err(Reject::BadRequest),
            };
        } else if name.eq_ignore_ascii_case(b"connection") {
            for option in value.split(|&b| b == b',').map(trim_ows) {
                if option.eq_ignore_ascii_case(b"close") {
                    self.close = true;
                } else if option.eq_ignore_ascii_case(b"keep-alive") {
                    self.keep_alive_asked = true;
                }
            }
        }
        Ok(())
    }
}

/// Why a request is refused. Each is answered with its status and the
/// connection is closed: after a request that could not be read, where the
/// next one would start is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reject {
    /// `400`: not HTTP, a bad header, a bad length or chunk.
    BadRequest,
    /// `414`: a request line longer than [`MAX_LINE`].
    UriTooLong,
    /// `431`: a header line longer than [`MAX_LINE`], or a head (or
    /// trailer section) longer than [`MAX_HEAD`].
    HeaderTooLarge,
    /// `501`: a transfer coding other than `chunked`.
    NotImplemented,
    /// `505`: `HTTP/2.0` and other versions than HTTP/1.x.
    VersionNotSupported,
}

impl Reject {
    pub(super) fn status(self) -> &'static str {
        match self {
            Reject::BadRequest => "400 Bad Request",
            Reject::UriTooLong => "414 URI Too Long",
            Reject::HeaderTooLarge => "431 Request Header Fields Too Large",
            Reject::NotImplemented => "501 Not Implemented",
            Reject::VersionNotSupported => "505 HTTP Version Not Supported",
        }
    }
}

/// Why reading a request stopped before it was whole.
#[derive(Debug)]
pub(super) enum Stop {
    /// The client closed first (before the request began, or in the
    /// middle): there is no one to answer.
    Closed,
    /// Reading or writing failed (a timeout, a reset): no answer either.
    Io(io::Error),
    /// The request is refused with this status.
    Reject(Reject),
}

impl From<io::Error> for Stop {
    fn from(err: io::Error) -> Stop {
        Stop::Io(err)
    }
}

impl From<Reject> for Stop {
    fn from(reject: Reject) -> Stop {
        Stop::Reject(reject)
    }
}

/// The connection as the request reader sees it: no read waits past the
/// deadline of the request being read.
pub(super) struct Deadline {
    pub(super) stream: TcpStream,
    pub(super) until: Instant,
}

impl Read for Deadline {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the request did not arrive in time",
            ));
        }
        // A per-read timeout alone would let a byte every 59 s go on for
        // ever; the deadline is the request's, however its bytes come.
        self.stream.set_read_timeout(Some(left))?;
        self.stream.read(buf)
    }
}

/// How a bounded line read ended, when the line did not end the input.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Line {
    /// The line and its `\n` are in the buffer.
    Whole,
    /// The limit was reached with no `\n`.
    TooLong,
}

/// Reads one line, its `\n` included, into `line` (emptied first), taking
/// at most `limit` bytes from `input` whatever comes.
pub(super) fn read_line<R: BufRead>(
    input: &mut R,
    limit: usize,
    line: &mut Vec<u8>,
) -> std::result::Result<Line, Stop> {
    line.clear();
    // `take` is what bounds the read: `read_until` alone would keep
    // reading (and growing `line`) until a newline that may never come.
    (&mut *input).take(limit as u64).read_until(b'\n', line)?;
    if line.last() == Some(&b'\n') {
        Ok(Line::Whole)
    } else if line.len() >= limit {
        Ok(Line::TooLong)
    } else {
        Err(Stop::Closed)
    }
}

/// Reads one request head, request line to blank line, taking at most
/// [`MAX_HEAD`] bytes from `input` and never more than [`MAX_LINE`] for one
/// line. Header lines are parsed as they come; only what [`Head`] keeps is
/// kept.
pub(super) fn read_head<R: BufRead>(
    input: &mut R,
    line: &mut Vec<u8>,
) -> std::result::Result<Head, Stop> {
    if read_line(input, MAX_LINE, line)? == Line::TooLong {
        return Err(Reject::UriTooLong.into());
    }
    let mut used = line.len();
    let mut head = Head::new(parse_request_line(strip_line_end(line))?);
    loop {
        let limit = MAX_LINE.min(MAX_HEAD.saturating_sub(used));
        if read_line(input, limit, line)? == Line::TooLong {
            return Err(Reject::HeaderTooLarge.into());
        }
        used += line.len();
        let field = strip_line_end(line);
        if field.is_empty() {
            return Ok(head);
        }
        head.field(field)?;
    }
}

/// Parses a request line given without its line ending: three parts with
/// one space between them, a method that is a token, a target of visible
/// ASCII, and `HTTP/1.x`.
pub(super) fn parse_request_line(line: &[u8]) -> std::result::Result<RequestLine, Reject> {
    let mut parts = line.split(|&b| b == b' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Reject::BadRequest);
    };
    let method_ok = !method.is_empty() && method.iter().all(|&b| is_tchar(b));
    let target_ok = !target.is_empty() && target.iter().all(u8::is_ascii_graphic);
    if !method_ok || !target_ok {
        return Err(Reject::BadRequest);
    }
    let minor = match *version {
        [b'H', b'T', b'T', b'P', b'/', major, b'.', minor]
            if major.is_ascii_digit() && minor.is_ascii_digit() =>
        {
            if major != b'1' {
                return Err(Reject::VersionNotSupported);
            }
            minor - b'0'
        }
        _ => return Err(Reject::BadRequest),
    };
    Ok(RequestLine {
        method: ascii(method),
        target: ascii(target),
        minor,
    })
}

/// Reads and discards a request body, so that the next request is read from
/// where it starts.
pub(super) fn skip_body<R: BufRead>(
    input: &mut R,
    body: Body,
    line: &mut Vec<u8>,
) -> std::result::Result<(), Stop> {
    match body {
        Body::None => Ok(()),
        Body::Length(n) => skip(input, n),
        Body::Chunked => skip_chunked(input, line),
    }
}

/// Reads and discards `n` bytes: streamed through a small buffer, whatever
/// the length.
pub(super) fn skip<R: BufRead>(input: &mut R, n: u64) -> std::result::Result<(), Stop> {
    let copied = io::copy(&mut (&mut *input).take(n), &mut io::sink())?;
    if copied < n {
        return Err(Stop::Closed);
    }
    Ok(())
}

/// Reads and discards a chunked body (RFC 9112, 7.1): chunks of
/// `SIZE[;extensions]` then the data and a line ending, up to a chunk of
/// size 0, then trailer lines up to a blank one. Size lines are bounded by
/// [`MAX_LINE`], the trailers by [`MAX_HEAD`]; the data is streamed.
pub(super) fn skip_chunked<R: BufRead>(
    input: &mut R,
    line: &mut Vec<u8>,
) -> std::result::Result<(), Stop> {
    loop {
        if read_line(input, MAX_LINE, line)? == Line::TooLong {
            return Err(Reject::BadRequest.into());
        }
        let size = parse_chunk_size(strip_line_end(line))?;
        if size == 0 {
            break;
        }
        skip(input, size)?;
        // The data's line ending: two bytes at most ("\r\n", or "\n").
        if read_line(input, 2, line)? == Line::TooLong || !strip_line_end(line).is_empty() {
            return Err(Reject::BadRequest.into());
        }
    }
    let mut used = 0;
    loop {
        let limit = MAX_LINE.min(MAX_HEAD.saturating_sub(used));
        if read_line(input, limit, line)? == Line::TooLong {
            return Err(Reject::HeaderTooLarge.into());
        }
        used += line.len();
        if strip_line_end(line).is_empty() {
            return Ok(());
        }
    }
}

/// The size of a chunk from its size line (without the line ending):
/// 1 to 16 hex digits, so that it fits a `u64`, then optional extensions
/// after `;`, which are ignored.
pub(super) fn parse_chunk_size(line: &[u8]) -> std::result::Result<u64, Reject> {
    let digits = match line.iter().position(|&b| b == b';') {
        Some(semicolon) => trim_ows(&line[..semicolon]),
        None => line,
    };
    if digits.is_empty() || digits.len() > 16 {
        return Err(Reject::BadRequest);
    }
    digits
        .iter()
        .try_fold(0u64, |size, &b| {
            let digit = char::from(b).to_digit(16)?;
            Some(size << 4 | u64::from(digit))
        })
        .ok_or(Reject::BadRequest)
}

/// A `Content-Length` value: decimal digits only (no sign, no list), that
/// fit a `u64`.
pub(super) fn parse_length(value: &[u8]) -> std::result::Result<u64, Reject> {
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return Err(Reject::BadRequest);
    }
    value
        .iter()
        .try_fold(0u64, |n, &b| {
            n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        })
        .ok_or(Reject::BadRequest)
}

/// `line` without its `\n` or `\r\n`.
pub(super) fn strip_line_end(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// `bytes` without the spaces and tabs around it ("optional white space").
pub(super) fn trim_ows(bytes: &[u8]) -> &[u8] {
    let is_ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = bytes.iter().position(|b| !is_ows(b)).unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| !is_ows(b))
        .map_or(start, |i| i + 1);
    &bytes[start..end]
}

/// A character allowed in a method or a header name (RFC 9110's `tchar`).
pub(super) fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Bytes already checked to be ASCII, as a `String`.
pub(super) fn ascii(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| char::from(b)).collect()
}
