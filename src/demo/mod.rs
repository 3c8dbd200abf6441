//! The built-in demo backend: a tiny HTTP server that says who it is.
//!
//! `rodizio demo` starts three of them so a reader can watch round robin
//! work with nothing else installed, and `rodizio backend --listen ADDR`
//! runs one alone (the "backend role" of the health-check article). Every
//! request gets `200 OK` with `Handled by server NAME\n`; `GET /health`
//! gets `OK\n`; `HEAD` gets the headers only. HTTP/1 is hyper's, as on the
//! admin listener: it reads each head within [`MAX_HEAD`] and answers what
//! it cannot read with `400` or `431`; this file accepts, bounds and
//! answers. `docs/security.md` ("The demo backend") lists its bounds.
//!
//! # Threads
//!
//! One thread (`rodizio-demo`) runs a one-thread tokio runtime: the accept
//! loop and every connection, interleaved, none of them blocking; at most
//! [`DEFAULT_MAX_CONNECTIONS`] connections at once (a client over it gets
//! `503` from the accept loop, with one non-blocking write). A request's
//! head must arrive within 60 s, and its body within 60 s more; answers
//! the client takes no byte of for 60 s end its connection. Accept errors are
//! logged at most once a second. On shutdown the listener closes and the
//! connections already accepted finish on a thread of their own
//! (`rodizio-demo-rest`).
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the article uses `python3 -m http.server 8001` (and
//! 8002, 8003) as its backends. Those still work; this one saves the setup.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode, Version};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;

use crate::error::{Error, Result};
use crate::reply;
use crate::shutdown::Shutdown;
use crate::throttle::{self, LogThrottle};

/// How long a request's head may take to arrive, counted from when the
/// backend begins waiting for it (a keep-alive connection idle that long
/// is closed), its body after the head, and an answer to be taken by the
/// client (see [`DemoBackend::request_timeout`]). A client trickling a
/// byte now and then, or never reading, cannot keep a connection for ever.
const IDLE: Duration = Duration::from_secs(60);
/// After a connection ends, how long what the client still sends is read
/// and discarded before the socket is closed (see [`linger`]).
const LINGER: Duration = Duration::from_secs(2);

/// Largest request head (request line and header lines), and largest
/// trailer section of a chunked body, in bytes; also the most a connection
/// buffers (hyper's smallest read buffer is 8 KiB).
pub const MAX_HEAD: usize = 16 * 1024;

/// Most connections one demo backend serves at once (see
/// [`DemoBackend::max_connections`]). 1024 is the usual soft limit of open
/// files (`ulimit -n`), which the process would reach about there anyway,
/// and far more than `ab -c` or `wrk -c` use in the article.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// Stack of the thread that runs the runtime: hyper's state lives in the
/// tasks, on the heap, but is polled on this stack (as the admin thread's).
const STACK: usize = 1024 * 1024;

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
    listener: std::net::TcpListener,
    name: Arc<str>,
    max_connections: usize,
    request_timeout: Duration,
}

impl DemoBackend {
    /// Binds the demo backend; `name` defaults to the bound address.
    ///
    /// # Errors
    ///
    /// [`Error::Bind`] when the address cannot be bound.
    pub fn bind(addr: SocketAddr, name: Option<String>) -> Result<DemoBackend> {
        let listener =
            std::net::TcpListener::bind(addr).map_err(|source| Error::Bind { addr, source })?;
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

    /// Closes a connection whose next request head has not wholly arrived
    /// `timeout` after the backend began waiting for it, whose body has not
    /// `timeout` after its head, or whose client has taken no byte of its
    /// answers for `timeout`, instead of 60 s.
    pub fn request_timeout(mut self, timeout: Duration) -> DemoBackend {
        self.request_timeout = timeout;
        self
    }

    /// Serves at most `n` connections at once (at least 1) instead of
    /// [`DEFAULT_MAX_CONNECTIONS`].
    pub fn max_connections(mut self, n: usize) -> DemoBackend {
        // A semaphore's and `acquire_many`'s own bounds, far above any
        // number of descriptors.
        self.max_connections = n.clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize));
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

    /// Serves until `shutdown` is triggered; the connections already
    /// accepted then finish on a thread of their own.
    pub fn serve(self, shutdown: &Shutdown) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build();
        let runtime = match runtime {
            Ok(runtime) => runtime,
            Err(err) => {
                log::error!("demo backend {}: cannot start: {err}", self.name);
                return;
            }
        };
        let stop = Arc::new(Notify::new());
        let hook = Arc::clone(&stop);
        // `notify_one` keeps its wake-up for a loop not waiting yet.
        shutdown.on_trigger(move || hook.notify_one());
        let slots = Arc::new(Semaphore::new(self.max_connections));
        let all = self.max_connections as u32;
        runtime.block_on(self.accept_loop(&stop, &slots));
        let rest = move || {
            runtime.block_on(async move {
                let _ = slots.acquire_many(all).await;
            });
        };
        let finishing = thread::Builder::new()
            .name("rodizio-demo-rest".into())
            .stack_size(STACK)
            .spawn(rest);
        if let Err(err) = finishing {
            log::debug!("demo backend: its open connections are cut: {err}");
        }
    }

    /// Serves on a thread of its own until `shutdown` is triggered.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when the thread cannot be started.
    pub fn spawn(self, shutdown: Shutdown) -> Result<thread::JoinHandle<()>> {
        thread::Builder::new()
            .name("rodizio-demo".into())
            .stack_size(STACK)
            .spawn(move || self.serve(&shutdown))
            .map_err(|e| Error::io("starting a demo backend", e))
    }

    /// Accepts until `stop`, each connection a task holding one of
    /// `slots`; the listener is closed on return.
    async fn accept_loop(self, stop: &Notify, slots: &Arc<Semaphore>) {
        let listener = match self
            .listener
            .set_nonblocking(true)
            .and_then(|()| TcpListener::from_std(self.listener))
        {
            Ok(listener) => listener,
            Err(err) => {
                log::error!("demo backend {}: cannot listen: {err}", self.name);
                return;
            }
        };
        let site = Arc::new(Site {
            name: self.name,
            request_timeout: self.request_timeout,
        });
        let errors_log = LogThrottle::new(Duration::from_secs(1));
        let busy_log = LogThrottle::new(Duration::from_secs(1));
        loop {
            let accepted = tokio::select! {
                () = stop.notified() => return,
                accepted = listener.accept() => accepted,
            };
            let err = match accepted {
                Ok((stream, _)) => {
                    match Arc::clone(slots).try_acquire_owned() {
                        Ok(slot) => drop(tokio::spawn(serve_connection(
                            stream,
                            Arc::clone(&site),
                            slot,
                        ))),
                        Err(_) => {
                            if let Some(others) = busy_log.event(Instant::now()) {
                                log::warn!(
                                    "demo backend {}: {} connections at once, the most it \
                                     serves; answering 503{}",
                                    site.name,
                                    self.max_connections,
                                    throttle::more(others)
                                );
                            }
                            if let Ok(stream) = stream.into_std() {
                                reply::reply_at_once(&stream, REPLY_BUSY);
                            }
                        }
                    }
                    continue;
                }
                Err(err) => err,
            };
            if matches!(
                err.kind(),
                io::ErrorKind::ConnectionAborted | io::ErrorKind::Interrupted
            ) {
                continue;
            }
            if let Some(others) = errors_log.event(Instant::now()) {
                log::error!(
                    "demo backend: accept failed: {err}; retrying every \
                     {ACCEPT_BACKOFF:?}{}",
                    throttle::more(others)
                );
            }
            tokio::select! {
                () = stop.notified() => return,
                () = tokio::time::sleep(ACCEPT_BACKOFF) => {}
            }
        }
    }
}

/// What every connection of one demo backend shares.
struct Site {
    name: Arc<str>,
    request_timeout: Duration,
}

/// Serves one connection with hyper until the client closes, asks to
/// close, sends something refused, or is too slow; then lingers.
async fn serve_connection(stream: TcpStream, site: Arc<Site>, _slot: OwnedSemaphorePermit) {
    // Small answers, each written whole: they should not wait on Nagle's
    // algorithm at the client's end.
    let _ = stream.set_nodelay(true);
    let timeout = site.request_timeout;
    let mut client = Client {
        stream,
        timeout,
        stalled: None,
    };
    let name = Arc::clone(&site.name);
    let service = service_fn(move |request| {
        let site = Arc::clone(&site);
        async move { answer(&site, request).await }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(timeout)
        .max_buf_size(MAX_HEAD)
        .max_header_size(MAX_HEAD)
        .title_case_headers(true)
        .auto_date_header(false);
    let served = builder
        .serve_connection(TokioIo::new(&mut client), service)
        .await;
    if let Err(err) = served {
        log::debug!("demo backend {name}: {err}");
    }
    linger(&mut client.stream).await;
}

/// One request: its body read and discarded (so that the next request is
/// read from where it starts), then the answer. An `Err` closes the
/// connection without one: the client left, or was too slow.
async fn answer(site: &Site, request: Request<Incoming>) -> io::Result<Response<Full<Bytes>>> {
    let keep_alive = keeps_alive(&request);
    let health = request.uri() == "/health";
    let mut body = request.into_body();
    let skip = async {
        while let Some(frame) = body.frame().await {
            frame?;
        }
        Ok::<(), hyper::Error>(())
    };
    match tokio::time::timeout(site.request_timeout, skip).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) if is_malformed(&err) => {
            return Ok(respond(StatusCode::BAD_REQUEST, None, false));
        }
        Ok(Err(err)) => return Err(io::Error::other(err)),
        Err(_) => {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the request body did not arrive in time",
            ))
        }
    }
    let text = if health {
        "OK\n".to_string()
    } else {
        format!("Handled by server {}\n", site.name)
    };
    // hyper sends no body to a `HEAD`; the `Content-Length` set here stays.
    Ok(respond(StatusCode::OK, Some(text), keep_alive))
}

/// Whether a body error is the client's bytes (a bad chunk), answered
/// `400`, rather than the connection ending or failing.
fn is_malformed(err: &hyper::Error) -> bool {
    let source = std::error::Error::source(err);
    source
        .and_then(|s| s.downcast_ref::<io::Error>())
        .is_some_and(|e| {
            matches!(
                e.kind(),
                io::ErrorKind::InvalidInput | io::ErrorKind::InvalidData
            )
        })
}

/// Whether the connection stays open after the answer: by default on
/// HTTP/1.1, on request on HTTP/1.0, never after `Connection: close`.
fn keeps_alive(request: &Request<Incoming>) -> bool {
    let (mut close, mut asked) = (false, false);
    let values = request.headers().get_all(CONNECTION).into_iter();
    for value in values.filter_map(|v| v.to_str().ok()) {
        for option in value.split(',').map(str::trim) {
            close |= option.eq_ignore_ascii_case("close");
            asked |= option.eq_ignore_ascii_case("keep-alive");
        }
    }
    !close && (request.version() >= Version::HTTP_11 || asked)
}

/// An answer with `text` (or the status line's words and a newline), as
/// plain text, with its length and the `Connection` it keeps.
fn respond(status: StatusCode, text: Option<String>, keep_alive: bool) -> Response<Full<Bytes>> {
    let text = text.unwrap_or_else(|| format!("{status}\n"));
    let length = text.len();
    let mut response = Response::new(Full::new(Bytes::from(text)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    headers.insert(CONTENT_LENGTH, HeaderValue::from(length));
    let connection = if keep_alive { "keep-alive" } else { "close" };
    headers.insert(CONNECTION, HeaderValue::from_static(connection));
    response
}

/// Shuts the write side, then reads and discards what the client still
/// sends, until it closes or [`LINGER`] has passed: closing with unread
/// bytes would make the kernel send a reset, which can destroy the last
/// answer (a refusal, most often) before the client reads it.
async fn linger(stream: &mut TcpStream) {
    let _ = socket2::SockRef::from(&*stream).shutdown(std::net::Shutdown::Write);
    let mut sink = [0u8; 2048];
    let drain = async {
        while stream.readable().await.is_ok() {
            match stream.try_read(&mut sink) {
                Ok(0) => break,
                Ok(_) => {}
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => break,
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

/// The client's socket as hyper sees it: a write (or flush) that makes no
/// progress for the request timeout fails, so a client that sends requests and never
/// reads the answers cannot hold its connection for ever.
struct Client {
    stream: TcpStream,
    timeout: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl Client {
    /// The socket could not take more: waits, up to `timeout` since it first
    /// could not.
    fn stall<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(self.timeout)));
        match stalled.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client has not read its answers",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for Client {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Client {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        match Pin::new(&mut me.stream).poll_write(cx, buf) {
            Poll::Pending => me.stall(cx),
            done => {
                me.stalled = None;
                done
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        match Pin::new(&mut me.stream).poll_flush(cx) {
            Poll::Pending => me.stall(cx),
            done => {
                me.stalled = None;
                done
            }
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests;
