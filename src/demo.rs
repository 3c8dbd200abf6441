//! The built-in demo backend: a tiny HTTP server that says who it is.
//!
//! `rodizio demo` starts three of them so a reader can watch round robin
//! work with nothing else installed, and `rodizio backend --listen ADDR` runs
//! one alone: the "backend role" of the health-check article that came with it, where the same program is
//! either the balancer or one of the servers behind it.
//!
//! Every request gets `200 OK` with the body `Handled by server NAME\n`;
//! `GET /health` gets `200 OK` with `OK\n` (for health checks); `HEAD` gets
//! the same headers as `GET`, `Content-Length` included, and no body. It
//! speaks enough HTTP/1.x for `curl`, `ab` (with and without `-k`) and `wrk`:
//! keep-alive by default on HTTP/1.1 and on request for HTTP/1.0; a request
//! body, delimited by `Content-Length` or sent with `Transfer-Encoding:
//! chunked`, is read and discarded, so the next request on the connection is
//! read from where it starts.
//!
//! Nothing a client sends makes it hold more than one line: the request line
//! and each header line may be at most 8 KiB, the whole head at most 16 KiB,
//! and a chunked body's size lines and trailers have the same bounds. A
//! request it refuses gets its status and a close: `400` when it cannot be
//! parsed, `414` for a request line too long, `431` for a header line or a
//! head too long, `501` for a transfer coding other than `chunked`, `505` for
//! a version other than HTTP/1.x. One thread per connection, as in the
//! balancer, and at most [`DEFAULT_MAX_CONNECTIONS`] of them at once: a
//! client over that bound is answered `503` and closed by the accept
//! thread, with one non-blocking write, so idle clients cannot make it
//! start threads without end; a request, head and body, must arrive within
//! 60 s. An `accept(2)` error (out of descriptors)
//! is logged at most once a second and retried after a pause, not in a
//! busy loop.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the article uses `python3 -m http.server 8001` (and 8002,
//! 8003) as its backends. Those still work; this one only saves the setup.

use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::reply;
use crate::shutdown::Shutdown;
use crate::throttle::{self, LogThrottle};

/// Longest line read while looking for its newline, the newline included:
/// the request line, one header line, one chunk-size line. A client cannot
/// make the backend buffer more than this by never sending a newline.
const MAX_LINE: usize = 8 * 1024;
/// Longest head (request line and header lines), and longest trailer
/// section of a chunked body, in bytes.
const MAX_HEAD: usize = 16 * 1024;
/// A demo connection idle this long is closed, and a request, head and
/// body, must have arrived this long after the backend began waiting for
/// it (see [`DemoBackend::request_timeout`]): a client trickling a byte now
/// and then cannot keep a connection, and its thread, for ever.
const IDLE: Duration = Duration::from_secs(60);
/// After refusing a request, how long what the client still sends is read
/// and discarded before the socket is closed (see [`linger`]).
const LINGER: Duration = Duration::from_secs(2);

/// Most connections one demo backend serves at once, one thread each
/// (see [`DemoBackend::max_connections`]). 1024 is the usual soft limit of
/// open files (`ulimit -n`), which the process would reach about there
/// anyway, and far more than `ab -c` or `wrk -c` use in the article.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// Pause after an `accept(2)` error that is not the client's doing
/// (`EMFILE`): retrying at once would spin on it.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The answer to a client over [`DEFAULT_MAX_CONNECTIONS`].
const REPLY_BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
Content-Type: text/plain\r\nContent-Length: 29\r\nConnection: close\r\n\r\n\
too many connections, retry\r\n";

/// A bound demo backend, ready to [`serve`](DemoBackend::serve).
#[derive(Debug)]
pub struct DemoBackend {
    listener: TcpListener,
    name: Arc<str>,
    max_connections: usize,
    request_timeout: Duration,
}

/// One connection's place among the [`DemoBackend::max_connections`]:
/// given back when dropped, however its thread ends (or if it never
/// starts).
struct Slot(Arc<AtomicUsize>);

impl Slot {
    /// Takes a place if fewer than `max` are taken.
    fn take(open: &Arc<AtomicUsize>, max: usize) -> Option<Slot> {
        open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < max).then_some(n + 1)
        })
        .ok()
        .map(|_| Slot(Arc::clone(open)))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl DemoBackend {
    /// Binds the demo backend; `name` defaults to the bound address.
    ///
    /// # Errors
    ///
    /// [`Error::Bind`] when the address cannot be bound.
    pub fn bind(addr: SocketAddr, name: Option<String>) -> Result<DemoBackend> {
        let listener = TcpListener::bind(addr).map_err(|source| Error::Bind { addr, source })?;
        let local = listener
            .local_addr()
            .map_err(|e| Error::io("reading the demo backend's address", e))?;
        Ok(DemoBackend {
            listener,
            name: name.unwrap_or_else(|| local.to_string()).into(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            request_timeout: IDLE,
        })
    }

    /// Closes a connection whose next request has not wholly arrived (head
    /// and body) `timeout` after the backend began waiting for it, instead
    /// of 60 s.
    pub fn request_timeout(mut self, timeout: Duration) -> DemoBackend {
        self.request_timeout = timeout;
        self
    }

    /// Serves at most `n` connections at once (at least 1) instead of
    /// [`DEFAULT_MAX_CONNECTIONS`].
    pub fn max_connections(mut self, n: usize) -> DemoBackend {
        self.max_connections = n.max(1);
        self
    }

    /// The address it listens on.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] if the socket cannot say.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.listener
            .local_addr()
            .map_err(|e| Error::io("reading the demo backend's address", e))
    }

    /// Serves until `shutdown` is triggered.
    pub fn serve(self, shutdown: &Shutdown) {
        if let Ok(addr) = self.listener.local_addr() {
            shutdown.wake_on_trigger(addr);
        }
        let open = Arc::new(AtomicUsize::new(0));
        let errors_log = LogThrottle::new(Duration::from_secs(1));
        let busy_log = LogThrottle::new(Duration::from_secs(1));
        for conn in self.listener.incoming() {
            if shutdown.is_triggered() {
                break;
            }
            let stream = match conn {
                Ok(stream) => stream,
                Err(err) => {
                    if !matches!(
                        err.kind(),
                        io::ErrorKind::ConnectionAborted | io::ErrorKind::Interrupted
                    ) {
                        if let Some(others) = errors_log.event(Instant::now()) {
                            log::error!(
                                "demo backend: accept failed: {err}; retrying every \
                                 {ACCEPT_BACKOFF:?}{}",
                                throttle::more(others)
                            );
                        }
                        thread::sleep(ACCEPT_BACKOFF);
                    }
                    continue;
                }
            };
            let Some(slot) = Slot::take(&open, self.max_connections) else {
                if let Some(others) = busy_log.event(Instant::now()) {
                    log::warn!(
                        "demo backend {}: {} connections at once, the most it serves; \
                         answering 503{}",
                        self.name,
                        self.max_connections,
                        throttle::more(others)
                    );
                }
                reply::reply_at_once(&stream, REPLY_BUSY);
                continue;
            };
            let name = Arc::clone(&self.name);
            let timeout = self.request_timeout;
            let spawned = thread::Builder::new()
                .name("rodizio-demo".into())
                .stack_size(64 * 1024)
                .spawn(move || {
                    let _slot = slot;
                    if let Err(err) = serve_connection(stream, &name, timeout) {
                        log::debug!("demo backend {name}: {err}");
                    }
                });
            if let Err(err) = spawned {
                log::warn!("demo backend: cannot start a thread: {err}");
            }
        }
    }

    /// Serves on a thread of its own until `shutdown` is triggered.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when the thread cannot be started.
    pub fn spawn(self, shutdown: Shutdown) -> Result<thread::JoinHandle<()>> {
        thread::Builder::new()
            .name("rodizio-demo-accept".into())
            .spawn(move || self.serve(&shutdown))
            .map_err(|e| Error::io("starting a demo backend", e))
    }
}

/// A request line: `METHOD TARGET HTTP/1.MINOR`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RequestLine {
    /// `GET`, `HEAD`, `POST`...: any token, as sent.
    method: String,
    /// The path (or any other request target), as sent.
    target: String,
    /// The `x` of `HTTP/1.x`.
    minor: u8,
}

impl fmt::Display for RequestLine {
    /// The line as a client sends it, without its line ending.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} HTTP/1.{}", self.method, self.target, self.minor)
    }
}

/// How a request's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Body {
    /// No body.
    None,
    /// `Content-Length: N`.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// What the demo backend needs from a request head.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Head {
    request: RequestLine,
    /// `Connection: close` was sent.
    close: bool,
    /// `Connection: keep-alive` was sent (it matters on HTTP/1.0 only).
    keep_alive_asked: bool,
    body: Body,
}

impl Head {
    fn new(request: RequestLine) -> Head {
        Head {
            request,
            close: false,
            keep_alive_asked: false,
            body: Body::None,
        }
    }

    /// Whether the connection stays open after the answer: by default on
    /// HTTP/1.1, on request on HTTP/1.0, never after `Connection: close`.
    fn keep_alive(&self) -> bool {
        !self.close && (self.request.minor >= 1 || self.keep_alive_asked)
    }

    /// Takes one header line (without its line ending) into account.
    ///
    /// Two ways of delimiting the body, or two different lengths, are
    /// refused rather than guessed at: were the backend and a proxy in front
    /// of it to guess differently, they would disagree on where the next
    /// request starts.
    fn field(&mut self, line: &[u8]) -> std::result::Result<(), Reject> {
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
enum Reject {
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
    fn status(self) -> &'static str {
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
enum Stop {
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
struct Deadline {
    stream: TcpStream,
    until: Instant,
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

/// Answers requests on one connection until the client closes, asks to
/// close, sends something it refuses, or does not send a whole request
/// within `timeout`.
fn serve_connection(stream: TcpStream, name: &str, timeout: Duration) -> io::Result<()> {
    stream.set_write_timeout(Some(IDLE))?;
    stream.set_nodelay(true)?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(Deadline {
        stream,
        until: Instant::now(),
    });
    // One line buffer for the whole connection; it never grows past
    // MAX_LINE bytes of content.
    let mut line = Vec::new();
    loop {
        reader.get_mut().until = Instant::now() + timeout;
        match serve_request(&mut reader, &mut writer, &mut line, name) {
            Ok(true) => {}
            Ok(false) | Err(Stop::Closed) => return Ok(()),
            Err(Stop::Io(err)) => return Err(err),
            Err(Stop::Reject(reject)) => {
                let status = reject.status();
                respond(&mut writer, status, &format!("{status}\n"), false, true)?;
                linger(&writer);
                return Ok(());
            }
        }
    }
}

/// Reads one request, its body included, and answers it. Returns whether
/// the connection stays open for another.
fn serve_request<R: BufRead>(
    reader: &mut R,
    writer: &mut TcpStream,
    line: &mut Vec<u8>,
    name: &str,
) -> std::result::Result<bool, Stop> {
    let head = read_head(reader, line)?;
    skip_body(reader, head.body, line)?;
    let body = if head.request.target == "/health" {
        "OK\n".to_string()
    } else {
        format!("Handled by server {name}\n")
    };
    let keep_alive = head.keep_alive();
    let send_body = head.request.method != "HEAD";
    respond(writer, "200 OK", &body, keep_alive, send_body)?;
    Ok(keep_alive)
}

/// Writes one response. `send_body` is false for `HEAD`, which gets the
/// headers a `GET` would get, `Content-Length` included, and no body.
fn respond(
    out: &mut TcpStream,
    status: &str,
    body: &str,
    keep_alive: bool,
    send_body: bool,
) -> io::Result<()> {
    let connection = if keep_alive { "keep-alive" } else { "close" };
    let mut response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
         Connection: {connection}\r\n\r\n",
        body.len()
    );
    if send_body {
        response.push_str(body);
    }
    // One write for the whole response: headers and body in separate small
    // writes would wait on Nagle's algorithm at the client's end.
    out.write_all(response.as_bytes())?;
    if !keep_alive {
        let _ = out.shutdown(std::net::Shutdown::Write);
    }
    Ok(())
}

/// Reads and discards what the client still sends, until it closes or
/// [`LINGER`] has passed: see [`crate::reply::drain_until`].
fn linger(stream: &TcpStream) {
    crate::reply::drain_until(stream, Instant::now() + LINGER);
}

/// How a bounded line read ended, when the line did not end the input.
#[derive(Debug, PartialEq, Eq)]
enum Line {
    /// The line and its `\n` are in the buffer.
    Whole,
    /// The limit was reached with no `\n`.
    TooLong,
}

/// Reads one line, its `\n` included, into `line` (emptied first), taking
/// at most `limit` bytes from `input` whatever comes.
fn read_line<R: BufRead>(
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
fn read_head<R: BufRead>(input: &mut R, line: &mut Vec<u8>) -> std::result::Result<Head, Stop> {
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
fn parse_request_line(line: &[u8]) -> std::result::Result<RequestLine, Reject> {
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
fn skip_body<R: BufRead>(
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
fn skip<R: BufRead>(input: &mut R, n: u64) -> std::result::Result<(), Stop> {
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
fn skip_chunked<R: BufRead>(input: &mut R, line: &mut Vec<u8>) -> std::result::Result<(), Stop> {
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
fn parse_chunk_size(line: &[u8]) -> std::result::Result<u64, Reject> {
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
fn parse_length(value: &[u8]) -> std::result::Result<u64, Reject> {
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
fn strip_line_end(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// `bytes` without the spaces and tabs around it ("optional white space").
fn trim_ows(bytes: &[u8]) -> &[u8] {
    let is_ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = bytes.iter().position(|b| !is_ows(b)).unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| !is_ows(b))
        .map_or(start, |i| i + 1);
    &bytes[start..end]
}

/// A character allowed in a method or a header name (RFC 9110's `tchar`).
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Bytes already checked to be ASCII, as a `String`.
fn ascii(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| char::from(b)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::io::Cursor;

    /// Every socket in these tests gives up after this long.
    const TIMEOUT: Duration = Duration::from_secs(5);

    /// A demo backend named `A` on a free port, stopped when dropped.
    struct Server {
        addr: SocketAddr,
        shutdown: Shutdown,
        accept: Option<thread::JoinHandle<()>>,
    }

    impl Server {
        fn start() -> Server {
            let shutdown = Shutdown::new();
            let demo = DemoBackend::bind("127.0.0.1:0".parse().unwrap(), Some("A".into())).unwrap();
            let addr = demo.local_addr().unwrap();
            let accept = Some(demo.spawn(shutdown.clone()).unwrap());
            Server {
                addr,
                shutdown,
                accept,
            }
        }

        /// A connection to it, and a buffered reader on the same socket.
        fn connect(&self) -> (TcpStream, BufReader<TcpStream>) {
            let s = TcpStream::connect(self.addr).unwrap();
            s.set_read_timeout(Some(TIMEOUT)).unwrap();
            s.set_write_timeout(Some(TIMEOUT)).unwrap();
            let reader = BufReader::new(s.try_clone().unwrap());
            (s, reader)
        }
    }

    impl Drop for Server {
        fn drop(&mut self) {
            self.shutdown.trigger();
            if let Some(accept) = self.accept.take() {
                let _ = accept.join();
            }
        }
    }

    /// One response as a client reads it.
    #[derive(Debug)]
    struct Response {
        status: String,
        content_length: usize,
        connection: String,
        body: String,
    }

    /// Reads one response; its body is `Content-Length` bytes, or none at all
    /// when it answers a `HEAD`.
    fn read_response(reader: &mut BufReader<TcpStream>, head_only: bool) -> Response {
        let mut status = String::new();
        reader.read_line(&mut status).unwrap();
        let mut content_length = None;
        let mut connection = String::new();
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            let (key, value) = line.split_once(": ").expect(line);
            match key {
                "Content-Length" => content_length = Some(value.parse().unwrap()),
                "Connection" => connection = value.to_string(),
                _ => {}
            }
        }
        let content_length = content_length.expect("a Content-Length");
        let mut body = vec![0; if head_only { 0 } else { content_length }];
        reader.read_exact(&mut body).unwrap();
        Response {
            status: status.trim_end().to_string(),
            content_length,
            connection,
            body: String::from_utf8(body).unwrap(),
        }
    }

    /// Reads until the server closes: it must close, not wait for more.
    fn read_to_close(reader: &mut BufReader<TcpStream>) -> String {
        let mut rest = Vec::new();
        reader
            .read_to_end(&mut rest)
            .expect("the server closes in time");
        String::from_utf8_lossy(&rest).into_owned()
    }

    fn head_of(input: &[u8]) -> std::result::Result<Head, Stop> {
        read_head(&mut Cursor::new(input), &mut Vec::new())
    }

    fn rejected(result: std::result::Result<impl fmt::Debug, Stop>) -> Option<Reject> {
        match result {
            Err(Stop::Reject(reject)) => Some(reject),
            _ => None,
        }
    }

    #[test]
    fn answers_with_its_name_keeps_alive_and_serves_health() {
        let server = Server::start();
        let (mut s, mut reader) = server.connect();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let r = read_response(&mut reader, false);
        assert_eq!(r.status, "HTTP/1.1 200 OK");
        assert_eq!(r.connection, "keep-alive");
        assert_eq!(r.body, "Handled by server A\n");
        // Same connection, second request: health, then close.
        s.write_all(b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")
            .unwrap();
        let rest = read_to_close(&mut reader);
        assert!(rest.starts_with("HTTP/1.1 200 OK\r\n"), "{rest}");
        assert!(rest.ends_with("\r\n\r\nOK\n"), "{rest}");
    }

    /// Past `max_connections`, a client gets the whole `503` (its
    /// `Content-Length` right) and a close; a place freed is taken again.
    #[test]
    fn a_client_over_max_connections_gets_503() {
        let shutdown = Shutdown::new();
        let demo = DemoBackend::bind("127.0.0.1:0".parse().unwrap(), Some("A".into()))
            .unwrap()
            .max_connections(1);
        let addr = demo.local_addr().unwrap();
        let accept = demo.spawn(shutdown.clone()).unwrap();
        let server = Server {
            addr,
            shutdown,
            accept: Some(accept),
        };
        let (mut first, mut first_reader) = server.connect();
        first.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        assert_eq!(
            read_response(&mut first_reader, false).status,
            "HTTP/1.1 200 OK"
        );
        let (_, mut reader) = server.connect();
        let busy = read_response(&mut reader, false);
        assert_eq!(busy.status, "HTTP/1.1 503 Service Unavailable");
        assert_eq!(busy.body, "too many connections, retry\r\n");
        assert!(read_to_close(&mut reader).is_empty());
        drop((first, first_reader));
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let (mut s, mut reader) = server.connect();
            s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
            if read_response(&mut reader, false).status == "HTTP/1.1 200 OK" {
                break;
            }
            assert!(Instant::now() < deadline, "the freed place was not taken");
        }
    }

    /// `HEAD` gets the headers of `GET`, with the same `Content-Length`, and
    /// no body: the `GET` after it on the same connection reads correctly.
    #[test]
    fn head_gets_headers_and_no_body() {
        let server = Server::start();
        let (mut s, mut reader) = server.connect();
        s.write_all(b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let head = read_response(&mut reader, true);
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let get = read_response(&mut reader, false);
        assert_eq!(head.status, "HTTP/1.1 200 OK");
        assert_eq!(get.status, "HTTP/1.1 200 OK", "HEAD sent a body");
        assert_eq!(get.body, "Handled by server A\n");
        assert_eq!(head.content_length, get.content_length);
        assert_eq!(head.connection, "keep-alive");
    }

    /// A chunked body (with an extension and a trailer) is read to its end:
    /// the `GET` after it on the same connection is answered.
    #[test]
    fn chunked_body_is_consumed() {
        let server = Server::start();
        let (mut s, mut reader) = server.connect();
        s.write_all(
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
              5\r\nhello\r\n1A;name=value\r\nabcdefghijklmnopqrstuvwxyz\r\n\
              0\r\nTrailer-Field: x\r\n\r\n",
        )
        .unwrap();
        let post = read_response(&mut reader, false);
        s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let get = read_response(&mut reader, false);
        assert_eq!(post.status, "HTTP/1.1 200 OK");
        assert_eq!(post.body, "Handled by server A\n");
        assert_eq!(get.status, "HTTP/1.1 200 OK");
        assert_eq!(get.body, "OK\n");
    }

    /// A `Content-Length` body is read to its end: the `GET` after it on the
    /// same connection is answered.
    #[test]
    fn content_length_body_is_consumed() {
        let server = Server::start();
        let (mut s, mut reader) = server.connect();
        s.write_all(b"POST / HTTP/1.1\r\nContent-Length: 16\r\n\r\nGET / HTTP/1.1\r\n")
            .unwrap();
        let post = read_response(&mut reader, false);
        s.write_all(b"GET /health HTTP/1.1\r\n\r\n").unwrap();
        let get = read_response(&mut reader, false);
        assert_eq!(post.status, "HTTP/1.1 200 OK");
        assert_eq!(get.status, "HTTP/1.1 200 OK");
        assert_eq!(get.body, "OK\n");
    }

    /// A chunk size that is not hex gets `400` and a close.
    #[test]
    fn malformed_chunk_size_gets_400_and_close() {
        let server = Server::start();
        let (mut s, mut reader) = server.connect();
        s.write_all(
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
        )
        .unwrap();
        let reply = read_to_close(&mut reader);
        assert!(reply.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{reply}");
        assert!(reply.contains("Connection: close\r\n"), "{reply}");
    }

    /// A request line longer than `MAX_LINE` with no newline in sight gets
    /// `414` and a close, without the backend waiting for the newline.
    #[test]
    fn endless_request_line_gets_414_and_close() {
        let server = Server::start();
        let (mut s, mut reader) = server.connect();
        let mut request = b"GET /".to_vec();
        request.resize(8 * MAX_LINE, b'a');
        s.write_all(&request).unwrap();
        let reply = read_to_close(&mut reader);
        assert!(
            reply.starts_with("HTTP/1.1 414 URI Too Long\r\n"),
            "{reply}"
        );
    }

    /// A header line longer than `MAX_LINE` with no newline gets `431` and a
    /// close.
    #[test]
    fn endless_header_line_gets_431_and_close() {
        let server = Server::start();
        let (mut s, mut reader) = server.connect();
        let mut request = b"GET / HTTP/1.1\r\nX-Long: ".to_vec();
        request.resize(8 * MAX_LINE, b'a');
        s.write_all(&request).unwrap();
        let reply = read_to_close(&mut reader);
        assert!(
            reply.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"),
            "{reply}"
        );
    }

    #[test]
    fn reads_a_head() {
        let head = head_of(
            b"GET /x HTTP/1.0\r\nHost: h\r\ncontent-length:  12 \r\n\
              Connection: Upgrade, keep-alive\r\n\r\nbody",
        )
        .unwrap();
        assert_eq!(head.request.to_string(), "GET /x HTTP/1.0");
        assert_eq!(head.body, Body::Length(12));
        assert!(head.keep_alive());
        // Bare `\n` line endings are taken too.
        let head = head_of(b"POST / HTTP/1.1\nTransfer-Encoding: Chunked\n\n").unwrap();
        assert_eq!(head.body, Body::Chunked);
        assert!(head.keep_alive());
        let head = head_of(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n").unwrap();
        assert!(!head.keep_alive());
        let head = head_of(b"GET / HTTP/1.0\r\n\r\n").unwrap();
        assert!(!head.keep_alive());
        assert!(matches!(head_of(b""), Err(Stop::Closed)));
        assert!(matches!(
            head_of(b"GET / HTTP/1.1\r\nHost"),
            Err(Stop::Closed)
        ));
    }

    #[test]
    fn refuses_bad_heads() {
        use Reject::*;
        let long_line = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(MAX_LINE));
        let long_header = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(MAX_LINE));
        let many_headers = format!(
            "GET / HTTP/1.1\r\n{}\r\n",
            "X: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n".repeat(300)
        );
        let cases: &[(&[u8], Reject)] = &[
            (b"\r\n", BadRequest),
            (b"GET /\r\n\r\n", BadRequest),
            (b"GET  / HTTP/1.1\r\n\r\n", BadRequest),
            (b"GET / HTTP/1.1 x\r\n\r\n", BadRequest),
            (b"G(T / HTTP/1.1\r\n\r\n", BadRequest),
            (b"GET /\xff HTTP/1.1\r\n\r\n", BadRequest),
            (b"GET / HTTP/1.10\r\n\r\n", BadRequest),
            (b"GET / http/1.1\r\n\r\n", BadRequest),
            (b"GET / HTTP/2.0\r\n\r\n", VersionNotSupported),
            (b"GET / HTTP/1.1\r\nno colon\r\n\r\n", BadRequest),
            (b"GET / HTTP/1.1\r\nHost : x\r\n\r\n", BadRequest),
            (b"GET / HTTP/1.1\r\nA: b\r\n folded\r\n\r\n", BadRequest),
            (b"GET / HTTP/1.1\r\nContent-Length: +5\r\n\r\n", BadRequest),
            (
                b"GET / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n",
                BadRequest,
            ),
            (
                b"GET / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
                BadRequest,
            ),
            (
                b"GET / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
                BadRequest,
            ),
            (
                b"GET / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
                BadRequest,
            ),
            (
                b"GET / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
                NotImplemented,
            ),
            (long_line.as_bytes(), UriTooLong),
            (long_header.as_bytes(), HeaderTooLarge),
            (many_headers.as_bytes(), HeaderTooLarge),
        ];
        for (input, reject) in cases {
            let got = rejected(head_of(input));
            assert_eq!(got, Some(*reject), "{}", String::from_utf8_lossy(input));
        }
        // The same length twice is only redundant.
        let head = head_of(b"GET / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n");
        assert_eq!(head.unwrap().body, Body::Length(5));
    }

    #[test]
    fn skips_chunked_bodies_and_refuses_bad_ones() {
        let skip = |input: &[u8]| {
            let mut cursor = Cursor::new(input);
            let result = skip_chunked(&mut cursor, &mut Vec::new());
            (result, cursor.position())
        };
        let body = b"3\r\nabc\r\n10 ; a=b\r\n0123456789abcdef\r\n0\r\nT: x\r\n\r\nNEXT";
        let (result, read) = skip(body);
        assert!(result.is_ok());
        assert_eq!(read as usize, body.len() - 4);
        let (result, _) = skip(b"0\n\n");
        assert!(result.is_ok());
        for bad in [
            &b"zz\r\n"[..],
            b"\r\n",
            b"-1\r\n",
            b"12345678123456781\r\n",
            b"3\r\nabcd\r\n0\r\n\r\n",
            b"3\r\nabc\r0\r\n\r\n",
        ] {
            let (result, _) = skip(bad);
            assert_eq!(
                rejected(result),
                Some(Reject::BadRequest),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let (result, _) = skip(b"3\r\nab");
        assert!(matches!(result, Err(Stop::Closed)));
    }

    /// A method, as [`parse_request_line`] takes them.
    fn method() -> impl Strategy<Value = String> {
        prop_oneof![
            prop::sample::select(vec!["GET", "HEAD", "POST", "PUT", "OPTIONS"])
                .prop_map(String::from),
            "[!#$%&'*+.^_`|~0-9A-Za-z-]{1,20}",
        ]
    }

    /// A request target, as [`parse_request_line`] takes them.
    fn target() -> impl Strategy<Value = String> {
        prop_oneof!["/[!-~]{0,200}", "[!-~]{1,200}"]
    }

    /// Random bytes, up to `len` of them, repeated up to `times` times: long
    /// inputs, with their newlines, at a small cost.
    fn repeated(len: usize, times: usize) -> impl Strategy<Value = Vec<u8>> {
        (prop::collection::vec(any::<u8>(), 0..len), 0..=times).prop_map(|(b, n)| b.repeat(n))
    }

    proptest! {
        /// Any bytes: no panic, and never more than `MAX_HEAD` bytes read.
        #[test]
        fn any_bytes_read_at_most_the_bound(input in repeated(1000, 40)) {
            let mut cursor = Cursor::new(&input[..]);
            let _ = read_head(&mut cursor, &mut Vec::new());
            prop_assert!(cursor.position() as usize <= MAX_HEAD);
        }

        /// A valid request line then any header bytes, with newlines likely:
        /// no panic, and never more than `MAX_HEAD` bytes read.
        #[test]
        fn any_headers_read_at_most_the_bound(
            lines in prop::collection::vec(
                prop_oneof![
                    "[ -~]{0,100}",
                    ("[A-Za-z-]{1,20}", b' '..=b'~', 0..3000usize).prop_map(|(name, b, len)| {
                        format!("{name}: {}", char::from(b).to_string().repeat(len))
                    }),
                    repeated(100, 100).prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
                ],
                0..20,
            ),
        ) {
            let input = format!("GET / HTTP/1.1\r\n{}", lines.join("\r\n"));
            let mut cursor = Cursor::new(input.as_bytes());
            let _ = read_head(&mut cursor, &mut Vec::new());
            prop_assert!(cursor.position() as usize <= MAX_HEAD);
        }

        /// Any bytes as a chunked body: no panic.
        #[test]
        fn any_chunked_body_is_handled(input in prop::collection::vec(any::<u8>(), 0..2_000)) {
            let _ = skip_chunked(&mut Cursor::new(&input[..]), &mut Vec::new());
        }

        /// A well-formed request line, formatted, parses back equal, alone
        /// and at the head of a request.
        #[test]
        fn request_line_round_trips(method in method(), target in target(), minor in 0u8..=9) {
            let request = RequestLine { method, target, minor };
            let line = request.to_string();
            prop_assert_eq!(parse_request_line(line.as_bytes()), Ok(request.clone()));
            let head = head_of(format!("{line}\r\nHost: x\r\n\r\n").as_bytes());
            prop_assert_eq!(head.ok().map(|h| h.request), Some(request));
        }

        /// A chunked body with any chunk sizes and data is skipped to its
        /// exact end.
        #[test]
        fn chunked_bodies_skip_to_their_end(
            chunks in prop::collection::vec(prop::collection::vec(any::<u8>(), 1..300), 0..10),
            upper in any::<bool>(),
        ) {
            let mut body = Vec::new();
            for chunk in &chunks {
                let size = if upper { format!("{:X}", chunk.len()) } else { format!("{:x}", chunk.len()) };
                body.extend_from_slice(format!("{size}\r\n").as_bytes());
                body.extend_from_slice(chunk);
                body.extend_from_slice(b"\r\n");
            }
            body.extend_from_slice(b"0\r\n\r\n");
            let end = body.len();
            body.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
            let mut cursor = Cursor::new(&body[..]);
            prop_assert!(skip_chunked(&mut cursor, &mut Vec::new()).is_ok());
            prop_assert_eq!(cursor.position() as usize, end);
        }
    }
}
