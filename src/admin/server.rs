//! The admin listener's HTTP server: hyper's HTTP/1 on a one-thread tokio
//! runtime of its own, so that nothing a client of the admin port sends can
//! crash the process or stall the proxying, and a slow or hostile client
//! holds one of a bounded number of connections for a bounded time. When
//! they are all taken, a new connection closes the oldest one still
//! waiting for its request head (a slow head, a keep-alive between two
//! requests), so that a flood of slow heads cannot keep the operator out.
//!
//! # Threads
//!
//! One thread (`rodizio-admin`) runs the runtime: the accept loop and every
//! connection, interleaved, none of them blocking. The endpoints ([`route`])
//! are plain blocking functions, so each request's runs on the runtime's
//! blocking pool: at most [`HANDLERS`] threads (`rodizio-admin-handler`),
//! started when needed and gone when idle. On shutdown the loop stops
//! accepting, connections finish the request they have (at most [`GRACE`]).
//!
//! # Bounds
//!
//! Each is a constant here ([`MAX_CONNECTIONS`], [`HEAD_DEADLINE`],
//! [`MAX_HEAD`], [`MAX_BODY`], [`BODY_DEADLINE`], [`IDLE_TIMEOUT`],
//! [`RESERVE`]), explained in docs/operations.md, "Bounds".
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::{Body as _, Bytes, Incoming};
use hyper::header::{
    HeaderValue, ALLOW, AUTHORIZATION, CONNECTION, CONTENT_TYPE, WWW_AUTHENTICATE,
};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use super::auth::Auth;
use super::routes::{route, Reply};
use super::State;
use crate::error::{Error, Result};
use crate::reserve::Reserve;
use crate::shutdown::Shutdown;
use crate::stats::Stats;
use crate::throttle::LogThrottle;

/// Threads answering requests at once (the runtime's blocking pool).
pub const HANDLERS: usize = 4;
/// Connections served at once; one more is answered 503 and closed.
pub const MAX_CONNECTIONS: usize = 256;
/// Largest request body read.
pub const MAX_BODY: usize = 64 * 1024;
/// Largest request head (request line and headers); hyper's smallest
/// read buffer is 8 KiB.
pub const MAX_HEAD: usize = 16 * 1024;
/// Longest a request head may take to arrive, from the connection's start
/// (hyper's header-read timeout).
pub const HEAD_DEADLINE: Duration = Duration::from_secs(5);
/// Longest a request body may take to arrive once its head is in.
pub const BODY_DEADLINE: Duration = Duration::from_secs(2);
/// A connection on which no byte moved for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(15);
/// On shutdown (or once idle), how long a connection may take to finish
/// the request it has.
pub const GRACE: Duration = Duration::from_secs(1);
/// File descriptors kept to accept admin clients when the process has no
/// other left.
pub const RESERVE: usize = 4;
/// How often a connection looks at its idle time and the stop flag.
const TICK: Duration = Duration::from_millis(250);
/// Longest the accept loop waits for the connection it closed to make
/// room (the same thread runs it: a few polls, in practice).
const ROOM_WAIT: Duration = Duration::from_millis(100);
/// What a client beyond [`MAX_CONNECTIONS`] gets before the close, when no
/// connection could be closed to make room for it (all of them busy with
/// a request).
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n\
Content-Length: 51\r\nConnection: close\r\n\r\n{\"error\": \"too many admin connections, try again\"}\n";

/// What every connection shares: the endpoints' state, the token, the
/// stop flag, the descriptor reserve and the connections open.
pub(crate) struct Http {
    pub(crate) state: Arc<State>,
    pub(crate) auth: Auth,
    stopping: AtomicBool,
    stop: Notify,
    reserve: Reserve,
    open: Open,
}

impl Http {
    pub(crate) fn new(state: Arc<State>, auth: Auth) -> Http {
        Http {
            state,
            auth,
            stopping: AtomicBool::new(false),
            stop: Notify::new(),
            reserve: Reserve::new(RESERVE),
            open: Open::default(),
        }
    }
}

/// Starts the runtime's thread serving `listener` until `shutdown`.
///
/// # Errors
///
/// [`Error::Io`] when the runtime or its thread cannot be started.
pub(crate) fn start(
    listener: std::net::TcpListener,
    http: Http,
    shutdown: &Shutdown,
) -> Result<JoinHandle<()>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .max_blocking_threads(HANDLERS)
        .thread_name("rodizio-admin-handler")
        .build()
        .map_err(|e| Error::io("starting the admin API", e))?;
    let listener = {
        let _context = runtime.enter();
        listener
            .set_nonblocking(true)
            .and_then(|()| TcpListener::from_std(listener))
            .map_err(|e| Error::io("starting the admin API", e))?
    };
    let http = Arc::new(http);
    let hook = Arc::clone(&http);
    shutdown.on_trigger(move || {
        hook.stopping.store(true, Ordering::SeqCst);
        hook.stop.notify_one();
    });
    thread::Builder::new()
        .name("rodizio-admin".into())
        .stack_size(1024 * 1024)
        .spawn(move || {
            runtime.block_on(accept_loop(listener, http));
            runtime.shutdown_timeout(GRACE);
        })
        .map_err(|e| Error::io("starting the admin thread", e))
}

/// Accepts until the stop, then waits (at most [`GRACE`] more than a
/// tick) for the connections to finish.
async fn accept_loop(listener: TcpListener, http: Arc<Http>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let errors = LogThrottle::new(Duration::from_secs(1));
    loop {
        let accepted = tokio::select! {
            _ = http.stop.notified() => break,
            accepted = listener.accept() => accepted,
        };
        let pause = match accepted {
            Ok((stream, _)) => {
                let slot = match Arc::clone(&slots).try_acquire_owned() {
                    Ok(slot) => Some(slot),
                    Err(_) => make_room(&http, &slots).await,
                };
                match slot {
                    Some(slot) => drop(tokio::spawn(serve(stream, Arc::clone(&http), slot))),
                    None => {
                        Stats::incr(&http.state.sources.stats.admin_connections_refused);
                        // Best effort and never waits: the answer fits in
                        // an empty socket buffer.
                        let _ = stream.try_write(BUSY);
                    }
                }
                http.reserve.refill();
                continue;
            }
            Err(e) if crate::system::is_out_of_descriptors(&e) && http.reserve.release() => {
                continue;
            }
            Err(e) => {
                if let Some(others) = errors.event(Instant::now()) {
                    log::warn!("admin: accept failed: {e} ({others} more since the last line)");
                }
                // Out of descriptors with none in reserve: they free up as
                // connections end; ten tries a second cost nothing.
                Duration::from_millis(100)
            }
        };
        tokio::select! {
            _ = http.stop.notified() => break,
            _ = tokio::time::sleep(pause) => {}
        }
    }
    http.stopping.store(true, Ordering::SeqCst);
    let all = MAX_CONNECTIONS as u32;
    let _ = tokio::time::timeout(GRACE + TICK, slots.acquire_many(all)).await;
}

/// Every connection is open: closes the oldest one waiting for a request
/// head and gives its slot, or `None` when each is busy with a request
/// (or the slot did not come back within [`ROOM_WAIT`]).
async fn make_room(http: &Http, slots: &Arc<Semaphore>) -> Option<OwnedSemaphorePermit> {
    let victim = http.open.oldest_waiting()?;
    Stats::incr(&http.state.sources.stats.admin_evictions);
    victim.close.notify_one();
    let freed = tokio::time::timeout(ROOM_WAIT, Arc::clone(slots).acquire_owned()).await;
    freed.ok()?.ok()
}

/// Serves one connection until it closes, goes quiet for
/// [`IDLE_TIMEOUT`], the API stops, or it is closed to make room (see
/// [`make_room`]).
async fn serve(stream: TcpStream, http: Arc<Http>, slot: OwnedSemaphorePermit) {
    let (id, me) = http.open.enter();
    serve_open(stream, &http, &me).await;
    http.open.leave(id);
    http.reserve.refill();
    drop(slot);
}

/// [`serve`], once the connection is listed among those open.
async fn serve_open(stream: TcpStream, http: &Arc<Http>, me: &Arc<Conn>) {
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Watched {
        stream,
        activity: Arc::clone(&activity),
    });
    let handler = Arc::clone(http);
    let conn = Arc::clone(me);
    let service = service_fn(move |request| {
        let http = Arc::clone(&handler);
        let conn = Arc::clone(&conn);
        async move {
            // Its head is in: not closed to make room until it is answered.
            let _busy = Busy::on(&conn);
            Ok::<_, Infallible>(answer(&http, request).await)
        }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_DEADLINE)
        .max_buf_size(MAX_HEAD)
        .title_case_headers(true);
    // Boxed, so that it can be dropped (closing the socket) before the
    // reserve is refilled.
    let mut connection = Box::pin(builder.serve_connection(io, service));
    let mut closing: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = connection.as_mut() => break,
            // Chosen to make room; a head that came in since is answered.
            _ = me.close.notified() => if !me.busy.load(Ordering::SeqCst) {
                break;
            },
            _ = tokio::time::sleep(TICK) => {}
        }
        match closing {
            None if activity.quiet_for() >= IDLE_TIMEOUT
                || http.stopping.load(Ordering::SeqCst) =>
            {
                if !http.stopping.load(Ordering::SeqCst) {
                    Stats::incr(&http.state.sources.stats.admin_idle_closes);
                }
                connection.as_mut().graceful_shutdown();
                closing = Some(Instant::now());
            }
            Some(since) if since.elapsed() >= GRACE => break,
            _ => {}
        }
    }
    // The socket is closed here (with the connection), then (in `serve`)
    // its descriptor's place is taken back into the reserve if it was used.
    drop(connection);
}

/// The connections open, in the order they came, for [`make_room`].
#[derive(Default)]
struct Open {
    /// By a number given in order: the first is the oldest.
    conns: Mutex<BTreeMap<u64, Arc<Conn>>>,
    next: AtomicU64,
}

/// One open connection, as [`make_room`] sees it.
#[derive(Default)]
struct Conn {
    /// A request is being answered (its head is in).
    busy: AtomicBool,
    /// Chosen to make room already: not chosen again.
    chosen: AtomicBool,
    /// Tells the connection to close.
    close: Notify,
}

impl Open {
    /// Lists a new connection; its number and its entry.
    fn enter(&self) -> (u64, Arc<Conn>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn::default());
        self.conns.lock().insert(id, Arc::clone(&conn));
        (id, conn)
    }

    /// Takes the connection `id` off the list.
    fn leave(&self, id: u64) {
        self.conns.lock().remove(&id);
    }

    /// The oldest connection waiting for a request head and not chosen
    /// yet, now chosen. At most [`MAX_CONNECTIONS`] to look through.
    fn oldest_waiting(&self) -> Option<Arc<Conn>> {
        let conns = self.conns.lock();
        let conn = conns
            .values()
            .find(|c| !c.busy.load(Ordering::SeqCst) && !c.chosen.swap(true, Ordering::SeqCst))?;
        Some(Arc::clone(conn))
    }
}

/// Marks a connection busy with a request while it lives.
struct Busy<'a>(&'a Conn);

impl<'a> Busy<'a> {
    fn on(conn: &'a Conn) -> Busy<'a> {
        conn.busy.store(true, Ordering::SeqCst);
        Busy(conn)
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        // Answered: it may be chosen again (a keep-alive gone quiet).
        self.0.chosen.store(false, Ordering::SeqCst);
        self.0.busy.store(false, Ordering::SeqCst);
    }
}

/// One request: the token, the body (bounded in size and time), the
/// endpoint on a blocking thread, the answer.
async fn answer(http: &Http, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let given = request
        .headers()
        .get(AUTHORIZATION)
        .map(HeaderValue::as_bytes);
    if !http.auth.allows(given) {
        let reply = Reply::error(
            401,
            "missing or wrong token: send Authorization: Bearer TOKEN, \
             or Basic authentication with the token as the password",
        );
        return respond(reply, true);
    }
    let (parts, body) = request.into_parts();
    let body = match read_body(http, body).await {
        Ok(body) => body,
        Err(reply) => return respond(reply, true),
    };
    let method = parts.method.as_str().to_string();
    let url = match parts.uri.query() {
        Some(query) => format!("{}?{query}", parts.uri.path()),
        None => parts.uri.path().to_string(),
    };
    let state = Arc::clone(&http.state);
    let work = move || {
        catch_unwind(AssertUnwindSafe(|| route(&state, &method, &url, &body))).unwrap_or_else(
            |_| {
                log::error!("admin: a handler panicked on {method} {url}");
                Reply::error(500, "internal error")
            },
        )
    };
    let reply = tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|_| Reply::error(500, "internal error"));
    respond(reply, false)
}

/// The whole body, or the reply that refuses it: 413 when it is (or is
/// announced) larger than [`MAX_BODY`], 408 when it is not all there within
/// [`BODY_DEADLINE`], 400 when the connection broke.
async fn read_body(http: &Http, body: Incoming) -> std::result::Result<Bytes, Reply> {
    let too_large = || Reply::error(413, format!("the body is larger than {MAX_BODY} bytes"));
    if body.size_hint().lower() > MAX_BODY as u64 {
        return Err(too_large());
    }
    let reading = Limited::new(body, MAX_BODY).collect();
    match tokio::time::timeout(BODY_DEADLINE, reading).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => Err(too_large()),
        Ok(Err(e)) => Err(Reply::error(400, format!("reading the body: {e}"))),
        Err(_) => {
            Stats::incr(&http.state.sources.stats.admin_slow_bodies);
            Err(Reply::error(
                408,
                format!("the body did not come within {} s", BODY_DEADLINE.as_secs()),
            ))
        }
    }
}

/// `reply` as an HTTP answer; `close` ends the connection after it (a
/// body left unread is never read).
fn respond(reply: Reply, close: bool) -> Response<Full<Bytes>> {
    let (content_type, text) = match reply.text {
        Some((content_type, text)) => (content_type, text),
        None => ("application/json", format!("{}\n", reply.body)),
    };
    let mut response = Response::new(Full::new(Bytes::from(text)));
    *response.status_mut() =
        StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    if let Some(allow) = reply.allow {
        headers.insert(ALLOW, HeaderValue::from_static(allow));
    }
    if reply.status == 401 {
        for challenge in Auth::CHALLENGES {
            headers.append(WWW_AUTHENTICATE, HeaderValue::from_static(challenge));
        }
    }
    if close {
        headers.insert(CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// When a byte last moved on a connection, in milliseconds since it began.
struct Activity {
    began: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            began: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let now = self.began.elapsed().as_millis() as u64;
        self.last_ms.store(now, Ordering::Relaxed);
    }

    fn quiet_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.began.elapsed().saturating_sub(last)
    }
}

/// The client's socket, noting every byte that moves.
struct Watched {
    stream: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut me.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            me.activity.touch();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        let polled = Pin::new(&mut me.stream).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = polled {
            if n > 0 {
                me.activity.touch();
            }
        }
        polled
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busy_answer_is_well_formed() {
        let text = std::str::from_utf8(BUSY).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(
            head.contains(&format!("Content-Length: {}", body.len())),
            "{text}"
        );
        assert!(serde_json::from_str::<serde_json::Value>(body).is_ok());
    }

    #[test]
    fn replies_carry_their_headers() {
        let r = respond(Reply::error(401, "no"), true);
        assert_eq!(r.status(), 401);
        assert_eq!(r.headers().get_all(WWW_AUTHENTICATE).iter().count(), 2);
        assert_eq!(r.headers()[CONNECTION], "close");
        let mut ok = Reply::text("text/plain", "x".into());
        ok.allow = Some("GET, HEAD");
        let r = respond(ok, false);
        assert_eq!(r.headers()[CONTENT_TYPE], "text/plain");
        assert_eq!(r.headers()[ALLOW], "GET, HEAD");
        assert!(r.headers().get(CONNECTION).is_none());
    }
}
