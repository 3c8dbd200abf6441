//! The built-in demo backend: a tiny HTTP server that says who it is.
//!
//! `rodizio demo` starts three of them so a reader can watch round robin
//! work with nothing else installed, and `rodizio backend --listen ADDR`
//! runs one alone (the "backend role" of the health-check article). Every
//! request gets `200 OK` with `Handled by server NAME\n`; `GET /health`
//! gets `OK\n`; `HEAD` gets the headers only. This file is the accept loop
//! and the answers; `request.rs` reads a request within its bounds (8 KiB a
//! line, 16 KiB a head) and refuses what it cannot read with `400`, `414`,
//! `431`, `501` or `505`. `docs/security.md` ("The demo backend") lists
//! its bounds.
//!
//! # Threads
//!
//! One accept thread, and one thread per connection as in the balancer, at
//! most [`DEFAULT_MAX_CONNECTIONS`] at once (a client over it gets `503`
//! from the accept thread, with one non-blocking write); a request must
//! arrive within 60 s. Accept errors are logged at most once a second.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the article uses `python3 -m http.server 8001` (and
//! 8002, 8003) as its backends. Those still work; this one saves the setup.

mod request;

use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::reply;
use crate::shutdown::Shutdown;
use crate::throttle::{self, LogThrottle};
use request::{read_head, skip_body, Deadline, Stop};

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

#[cfg(test)]
mod tests;
