//! The admin API: JSON over HTTP for operators, the Prometheus metrics and
//! the stats page, on its own address
//! (`--admin ADDR`, off by default).
//!
//! | request                          | does                                        |
//! |----------------------------------|---------------------------------------------|
//! | `GET /backends`                  | every backend: state, counters, last check |
//! | `POST /backends` `{"address", "weight"}` | adds one (201; 409 if it exists)    |
//! | `PUT /backends/{address}` `{"weight"}` or `{"state": "drain"\|"maint"\|"ready"}` | changes one |
//! | `DELETE /backends/{address}`     | drains it, removes it once empty (202)      |
//! | `POST /reload`                   | reloads the config file (409 without one)   |
//! | `GET /config`                    | the settings in force                       |
//! | `GET /metrics`                   | Prometheus metrics, text format (`metrics.rs`) |
//! | `GET /`                          | the stats page, HTML (`page.rs`)            |
//!
//! Every error is `{"error": "..."}` with a 4xx or 5xx status; nothing an
//! admin request does can disturb the proxying (a panic in a handler is
//! caught and answered with a 500).
//!
//! Changes made here last until the next reload from the config file, which
//! sets the backend list the file says (HAProxy's runtime API documents the
//! same rule).
//!
//! # Threads
//!
//! HTTP is parsed by `tiny_http` (a small, blocking server: no hand-written
//! HTTP parsing here). Its accept thread and its connection threads read
//! requests and queue them; [`HANDLERS`] threads of ours (`rodizio-admin`)
//! take them from that queue and answer, so at most that many admin
//! requests are worked on at once. One more thread, the reaper
//! (`reaper.rs`), removes deleted backends once drained. On shutdown a hook
//! calls tiny_http's `unblock()` once per handler, each handler finishes
//! the request it has and exits, and the server is dropped with the last
//! of them.
//!
//! # Bounds
//!
//! - A body larger than [`MAX_BODY`] gets 413 (a `Content-Length` over it
//!   without reading a byte; a chunked body once that much was read).
//! - tiny_http has no per-request timeout and does not give out the socket,
//!   so a read timeout cannot be set on it. tiny_http itself reads bodies up
//!   to 1 KiB before queueing the request; a larger or chunked body is read
//!   by a helper thread while the handler waits at most [`BODY_DEADLINE`]:
//!   past it the handler moves on (counted in `admin_slow_bodies`), and
//!   the helper answers 408 if the body ever arrives. At most [`HANDLERS`] helpers exist at once; past that a
//!   request with such a body gets 503 at once.
//! - What no setting here can bound: a client that connects and never sends
//!   its request line holds one tiny_http connection thread until it
//!   closes. That is one reason the API listens on loopback only unless
//!   `--admin-allow-remote` is given.
//!
//! # Authentication
//!
//! With `--admin-token-file FILE`, each request needs
//! `Authorization: Bearer TOKEN` (TOKEN: the file's content, trimmed), or
//! gets 401. The comparison takes the same time wherever the first
//! difference is.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C's list is typed in at start-up and never
//! changes.

pub mod metrics;
pub mod page;
mod reaper;
pub mod routes;

use std::io::{self, Read};
use std::net::{SocketAddr, TcpListener};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use crossbeam_channel::Sender;
use parking_lot::Mutex;
use tiny_http::{Header, Request, Response, Server};

use crate::backend::Backend;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::live::Live;
use crate::shutdown::Shutdown;

pub use routes::{route, Reply};

/// Handler threads: admin requests worked on at once.
pub const HANDLERS: usize = 4;
/// Largest request body read.
pub const MAX_BODY: usize = 64 * 1024;
/// Longest a handler waits for a body that tiny_http did not read already.
pub const BODY_DEADLINE: Duration = Duration::from_secs(2);
/// Bodies up to this size are read by tiny_http before the request is
/// queued (its own rule).
const READ_AHEAD: usize = 1024;

/// What `POST /reload` calls: `Ok` with a one-line summary of what changed,
/// or `Err` with why nothing did.
pub type ReloadHook = Arc<dyn Fn() -> std::result::Result<String, String> + Send + Sync>;

/// The admin socket, bound at start-up with its token read, not yet
/// serving.
#[derive(Debug)]
pub struct AdminListener {
    listener: TcpListener,
    addr: SocketAddr,
    token: Option<String>,
}

impl AdminListener {
    /// Binds `config.admin_listen` and reads the token file, if the API is
    /// on.
    ///
    /// # Errors
    ///
    /// [`Error::Bind`] when the address cannot be listened on;
    /// [`Error::InvalidSetting`] (`admin_token_file`) when the token file
    /// cannot be read or is empty.
    pub fn bind(config: &Config) -> Result<Option<AdminListener>> {
        let Some(addr) = config.admin_listen else {
            return Ok(None);
        };
        let token = match &config.admin_token_file {
            None => None,
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    Error::setting("admin_token_file", format!("{}: {e}", path.display()))
                })?;
                let token = text.trim();
                if token.is_empty() {
                    return Err(Error::setting(
                        "admin_token_file",
                        format!("{} is empty", path.display()),
                    ));
                }
                Some(token.to_string())
            }
        };
        let listener = TcpListener::bind(addr).map_err(|source| Error::Bind { addr, source })?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::io("reading the admin address", e))?;
        Ok(Some(AdminListener {
            listener,
            addr,
            token,
        }))
    }

    /// The bound address (the real port when port 0 was asked).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

/// What the endpoints read and change.
pub struct State {
    /// The backend list and the live settings.
    pub live: Live,
    /// The settings given at start-up (the fixed ones are still in force).
    pub config: Config,
    /// `POST /reload`'s hook; `None` when there is no config file.
    pub reload: Option<ReloadHook>,
    /// What `/metrics` and the stats page read.
    pub sources: metrics::Sources,
    /// When the balancer started (the page's uptime).
    pub started: std::time::Instant,
    /// Changes to the list take turns on this (see `routes.rs`).
    pub(crate) changes: Mutex<()>,
    /// Where `DELETE` hands a backend to the reaper.
    pub(crate) reaper: Sender<Arc<Backend>>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("backends", &self.live.scheduler.snapshot().len())
            .field("reload", &self.reload.is_some())
            .finish()
    }
}

/// What the admin API is given by the balancer.
pub struct Parts {
    /// The backend list and the live settings.
    pub live: Live,
    /// The settings given at start-up.
    pub config: Config,
    /// `POST /reload`'s hook, if there is a config file.
    pub reload: Option<ReloadHook>,
    /// The counters.
    pub stats: Arc<crate::stats::Stats>,
    /// Clients in the queue now.
    pub queued: Arc<dyn Fn() -> usize + Send + Sync>,
}

/// The running admin API's threads.
#[derive(Debug)]
pub struct Admin {
    threads: Vec<JoinHandle<()>>,
}

impl Admin {
    /// Waits for the threads, which exit once the shutdown is triggered
    /// (each after the request it is answering).
    pub fn join(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Starts serving the admin API on `listener` until `shutdown`.
///
/// # Errors
///
/// [`Error::Io`] when tiny_http or a thread cannot be started.
pub fn spawn(listener: AdminListener, parts: Parts, shutdown: &Shutdown) -> Result<Admin> {
    let AdminListener {
        listener,
        addr,
        token,
    } = listener;
    let server = Server::from_listener(listener, None)
        .map(Arc::new)
        .map_err(|e| Error::io("starting the admin API", io::Error::other(e.to_string())))?;
    let (reaper_tx, reaper_rx) = crossbeam_channel::unbounded();
    // `GET /config` shows the address bound, with its real port.
    let mut config = parts.config;
    config.admin_listen = Some(addr);
    let sources = {
        let scheduler = Arc::clone(&parts.live.scheduler);
        let limiter = Arc::clone(&parts.live.limiter);
        metrics::Sources {
            stats: parts.stats,
            backends: Arc::new(move || scheduler.snapshot()),
            queued: parts.queued,
            max_workers: config.workers,
            limiter: Arc::new(move || limiter.load().as_ref().map(|l| (l.len(), l.capacity()))),
        }
    };
    let state = Arc::new(State {
        sources,
        started: std::time::Instant::now(),
        live: parts.live.clone(),
        config,
        reload: parts.reload,
        changes: Mutex::new(()),
        reaper: reaper_tx,
    });
    let mut threads = vec![reaper::spawn(
        Arc::clone(&parts.live.scheduler),
        reaper_rx,
        shutdown.clone(),
    )
    .map_err(|e| Error::io("starting the admin reaper thread", e))?];
    let http = Arc::new(Http {
        state,
        token,
        body_readers: AtomicUsize::new(0),
    });
    for _ in 0..HANDLERS {
        let (server, http) = (Arc::clone(&server), Arc::clone(&http));
        let handle = thread::Builder::new()
            .name("rodizio-admin".into())
            .stack_size(512 * 1024)
            .spawn(move || {
                // `recv` fails once `unblock` was called for this thread.
                while let Ok(request) = server.recv() {
                    http.handle(request);
                }
            })
            .map_err(|e| Error::io("starting an admin thread", e))?;
        threads.push(handle);
    }
    shutdown.on_trigger(move || {
        for _ in 0..HANDLERS {
            server.unblock();
        }
    });
    log::info!("admin API listening on {addr}");
    Ok(Admin { threads })
}

/// The HTTP side: authentication, bodies, replies.
struct Http {
    state: Arc<State>,
    token: Option<String>,
    /// Helper threads reading a body now.
    body_readers: AtomicUsize,
}

/// What is known of a request's body before reading it.
enum Body {
    /// Already in memory (or none).
    Ready,
    /// Still on the socket.
    Streamed,
    /// Announced larger than [`MAX_BODY`].
    TooLarge,
}

impl Http {
    fn handle(self: &Arc<Self>, mut request: Request) {
        if !self.authorized(&request) {
            let reply = Reply::error(401, "missing or wrong bearer token");
            return respond(request, &reply);
        }
        let body = match body_kind(&request) {
            Body::TooLarge => return respond(request, &too_large()),
            Body::Ready => match read_limited(request.as_reader()) {
                Ok(body) => body,
                Err(reply) => return respond(request, &reply),
            },
            Body::Streamed => match self.read_with_deadline(request) {
                Some((r, Ok(body))) => {
                    request = r;
                    body
                }
                Some((r, Err(reply))) => return respond(r, &reply),
                None => return,
            },
        };
        let method = request.method().as_str().to_string();
        let url = request.url().to_string();
        let reply = catch_unwind(AssertUnwindSafe(|| {
            route(&self.state, &method, &url, &body)
        }))
        .unwrap_or_else(|_| {
            log::error!("admin: a handler panicked on {method} {url}");
            Reply::error(500, "internal error")
        });
        respond(request, &reply);
    }

    fn authorized(&self, request: &Request) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        let given = request
            .headers()
            .iter()
            .find(|h| h.field.equiv("Authorization"))
            .and_then(|h| h.value.as_str().strip_prefix("Bearer "))
            .unwrap_or_default();
        same_bytes(given.trim().as_bytes(), token.as_bytes())
    }

    /// Reads the body on a helper thread, waiting at most
    /// [`BODY_DEADLINE`]. `None` when the deadline passed (the helper then
    /// answers the request itself, if the body ever comes).
    fn read_with_deadline(
        self: &Arc<Self>,
        mut request: Request,
    ) -> Option<(Request, std::result::Result<Vec<u8>, Reply>)> {
        if self.body_readers.fetch_add(1, Ordering::SeqCst) >= HANDLERS {
            self.body_readers.fetch_sub(1, Ordering::SeqCst);
            respond(
                request,
                &Reply::error(503, "too many request bodies in flight"),
            );
            return None;
        }
        // A rendezvous: the helper hands the request over only while this
        // handler still waits for it. Once the wait is over, its send
        // fails (at the latest when `rx` is dropped below) and the helper
        // answers 408 itself: a body that comes just at the deadline is
        // answered one way or the other, never lost in a buffer.
        let (tx, rx) = crossbeam_channel::bounded(0);
        let me = Arc::clone(self);
        let spawned = thread::Builder::new()
            .name("rodizio-admin-body".into())
            .stack_size(128 * 1024)
            .spawn(move || {
                let body = read_limited(request.as_reader());
                me.body_readers.fetch_sub(1, Ordering::SeqCst);
                if let Err(crossbeam_channel::SendError((request, _))) = tx.send((request, body)) {
                    respond(request, &Reply::error(408, "the body came too slowly"));
                }
            });
        if spawned.is_err() {
            self.body_readers.fetch_sub(1, Ordering::SeqCst);
            log::warn!("admin: could not start a thread to read a request body");
            // The request went with the closure; dropping it closes it.
            return None;
        }
        let got = rx.recv_timeout(BODY_DEADLINE).ok();
        if got.is_none() {
            drop(rx);
            crate::stats::Stats::incr(&self.state.sources.stats.admin_slow_bodies);
        }
        got
    }
}

/// Equal bytes, compared in a time that depends on the lengths only.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b) {
        diff |= x ^ y;
    }
    diff == 0
}

fn too_large() -> Reply {
    Reply::error(413, format!("the body is larger than {MAX_BODY} bytes"))
}

fn body_kind(request: &Request) -> Body {
    let has = |name: &'static str| request.headers().iter().any(|h| h.field.equiv(name));
    if has("Transfer-Encoding") {
        return Body::Streamed;
    }
    match request.body_length() {
        Some(n) if n > MAX_BODY => Body::TooLarge,
        Some(n) if n > READ_AHEAD || has("Expect") => Body::Streamed,
        _ => Body::Ready,
    }
}

/// Reads at most [`MAX_BODY`] bytes; more is a 413.
fn read_limited(reader: &mut dyn Read) -> std::result::Result<Vec<u8>, Reply> {
    let mut body = Vec::new();
    match reader.take(MAX_BODY as u64 + 1).read_to_end(&mut body) {
        Ok(_) if body.len() > MAX_BODY => Err(too_large()),
        Ok(_) => Ok(body),
        Err(e) => Err(Reply::error(400, format!("reading the body: {e}"))),
    }
}

/// Sends `reply` as JSON; a client gone meanwhile is only logged.
fn respond(request: Request, reply: &Reply) {
    let (content_type, text) = match &reply.text {
        Some((content_type, text)) => (*content_type, text.clone()),
        None => ("application/json", format!("{}\n", reply.body)),
    };
    let mut response = Response::from_string(text).with_status_code(reply.status);
    if let Ok(h) = Header::from_bytes("Content-Type", content_type) {
        response.add_header(h);
    }
    if let Some(allow) = reply.allow {
        if let Ok(h) = Header::from_bytes("Allow", allow) {
            response.add_header(h);
        }
    }
    if reply.status == 401 {
        if let Ok(h) = Header::from_bytes("WWW-Authenticate", "Bearer") {
            response.add_header(h);
        }
    }
    if let Err(e) = request.respond(response) {
        log::debug!("admin: could not send a reply: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        assert!(same_bytes(b"secret", b"secret"));
        assert!(!same_bytes(b"secret", b"secreT"));
        assert!(!same_bytes(b"secret", b"secret2"));
        assert!(!same_bytes(b"", b"x"));
    }

    #[test]
    fn bodies_are_bounded() {
        let mut small: &[u8] = b"{}";
        assert_eq!(read_limited(&mut small).unwrap(), b"{}");
        let big = vec![b' '; MAX_BODY + 1];
        let mut big: &[u8] = &big;
        assert_eq!(read_limited(&mut big).unwrap_err().status, 413);
        let exact = vec![b' '; MAX_BODY];
        let mut exact: &[u8] = &exact;
        assert_eq!(read_limited(&mut exact).unwrap().len(), MAX_BODY);
    }
}
