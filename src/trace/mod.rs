//! `--trace`: a narrated trace of every connection, for readers of the
//! article who want to watch the data path happen (English by default,
//! Portuguese with `--trace-lang pt`). Each step is an [`Event`], told when
//! it happens; lines of one connection share an id (`#17`). The words are
//! data, one table of sentences in both languages (`text.rs`).
//!
//! Off by default, and then every hook costs one relaxed load ([`on`]):
//! nothing is built, formatted, locked or allocated. Lines go through the
//! `log` crate at info level, target [`TARGET`], so they interleave with
//! the balancer's other lines; tests catch them with [`set_output`].
//! docs/c-to-rust.md ("A narrated trace") has the whole story.
//!
//! # Threads
//!
//! The accept thread tells the first steps, a worker the rest. The id
//! travels between them in a small table keyed by the client's descriptor
//! (filled at queueing, emptied when a worker takes it); the rest of a
//! connection's state is the worker's own, in a thread-local.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the article explains these steps in prose
//! (`server_idx`, `queue_insert`, `proxy_function()`, `shutdown`, `close`).

mod text;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

pub use text::text;

/// The `log` target of the trace lines.
pub const TARGET: &str = "rodizio::trace";

/// A direction's bytes are told again after this much time...
pub const FLOW_EVERY: Duration = Duration::from_millis(100);
/// ...or after this many bytes, whichever comes first, so that a bulk
/// transfer does not print a line per chunk.
pub const FLOW_BYTES: u64 = 1024 * 1024;

/// The language of the trace (`trace_lang`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Lang {
    /// English (`en`), the default.
    #[default]
    En,
    /// Brazilian Portuguese (`pt`).
    Pt,
}

impl Lang {
    /// The name on the command line and in the config file.
    pub fn name(self) -> &'static str {
        match self {
            Lang::En => "en",
            Lang::Pt => "pt",
        }
    }

    /// The language a locale value such as `LANG=pt_BR.UTF-8` asks for:
    /// `Pt` when it starts with `pt`, `En` for any other non-empty value,
    /// `None` when it is empty.
    pub fn from_locale(value: &str) -> Option<Lang> {
        if value.is_empty() {
            None
        } else if value.starts_with("pt") {
            Some(Lang::Pt)
        } else {
            Some(Lang::En)
        }
    }
}

impl fmt::Display for Lang {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

impl FromStr for Lang {
    type Err = String;

    fn from_str(text: &str) -> Result<Lang, String> {
        match text {
            "en" => Ok(Lang::En),
            "pt" | "pt-BR" | "pt_BR" => Ok(Lang::Pt),
            other => Err(format!("unknown language `{other}` (en or pt)")),
        }
    }
}

/// One end of a proxied connection: where bytes come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The client's socket.
    Client,
    /// The backend's socket.
    Backend,
}

/// One step of a connection, with what a reader needs to follow it.
#[derive(Debug, Clone, Copy)]
pub enum Event<'a> {
    /// `accept(2)` returned a new client.
    Accepted {
        /// The client's address.
        peer: SocketAddr,
        /// The client socket's file descriptor.
        fd: RawFd,
    },
    /// The rate limiter let the client through.
    RateAllowed {
        /// The client's address.
        ip: IpAddr,
        /// Connections counted for it in this window, this one included.
        used: u32,
        /// The limit per window.
        limit: u32,
        /// The window.
        window: Duration,
    },
    /// The rate limiter refused the client: it is closed here.
    RateRefused {
        /// The client's address.
        ip: IpAddr,
        /// The limit per window.
        limit: u32,
        /// The window.
        window: Duration,
        /// When it may try again.
        retry_after: Duration,
    },
    /// The `allow` and `deny` lists refused the client: it is closed here.
    Denied {
        /// The client's address (behind a PROXY header, the header's).
        ip: IpAddr,
    },
    /// The client's address had as many connections open as
    /// `max_connections_per_client` allows: it is closed here.
    TooManyConnections {
        /// The client's address (behind a PROXY header, the header's).
        ip: IpAddr,
    },
    /// The scheduler chose the backend (the article's `server_idx`).
    Picked {
        /// The algorithm's name (`round-robin`, ...).
        algorithm: &'a str,
        /// The backend's position in the list.
        server_idx: usize,
        /// The backend's name.
        backend: &'a str,
        /// The service, when services are named (not the one service of a
        /// flat configuration).
        service: Option<&'a str>,
    },
    /// No backend is available: the client is closed.
    NoBackend,
    /// SNI routing read the client's ClientHello and chose its service.
    Sni {
        /// The server name asked for, if any.
        name: Option<&'a str>,
        /// Why there was no name, in words (empty when there was one).
        why: &'a str,
        /// The service chosen; `None`: no service, the client is closed.
        service: Option<&'a str>,
    },
    /// The `(server_idx, client)` pair goes into the queue.
    Queued {
        /// Clients already waiting in the queue before this one.
        ahead: usize,
    },
    /// A worker took the client out of the queue.
    Taken {
        /// The worker's number (1 for the first thread the pool started).
        worker: usize,
        /// Whether this is the worker's first client (a new thread) or it
        /// served others before (a reused thread).
        first: bool,
        /// Time the client spent in the queue.
        waited: Duration,
    },
    /// One connect attempt failed.
    ConnectFailed {
        /// The backend tried.
        backend: &'a str,
        /// Why.
        reason: &'a io::Error,
        /// Failed connects in a row to it now.
        failures: u32,
    },
    /// The client's TLS handshake finished (the balancer terminates it).
    TlsHandshake {
        /// The version negotiated (`TLSv1.3`).
        version: &'a str,
        /// The server name it asked for (SNI), if any.
        sni: Option<&'a str>,
    },
    /// Fail-over: the next backend is tried.
    FailOver {
        /// The backend tried next.
        backend: &'a str,
    },
    /// Connected to the backend.
    Connected {
        /// The backend.
        backend: &'a str,
        /// The backend socket's file descriptor.
        fd: RawFd,
        /// Time `connect` took.
        took: Duration,
    },
    /// No backend could be reached: the client is closed.
    Unreachable,
    /// The first bytes of one direction went through.
    FirstBytes {
        /// Where they came from.
        from: Side,
        /// How many.
        bytes: u64,
    },
    /// More bytes of one direction went through (told at most every
    /// [`FLOW_EVERY`] or [`FLOW_BYTES`]).
    Flow {
        /// Where they came from.
        from: Side,
        /// Bytes since the last line of this direction.
        bytes: u64,
        /// Turns of the pump that moved them.
        rounds: u64,
        /// Bytes of this direction so far.
        total: u64,
    },
    /// One side ended its stream (`read` returned 0) and the other was
    /// told: with `shutdown(SHUT_WR)`, or by the close (`last`).
    HalfClose {
        /// The side that finished sending.
        from: Side,
        /// The other way had finished: the close that follows tells it.
        last: bool,
    },
    /// The copy pump handed the connection to the kernel relay
    /// (`kernel_relay`).
    Promoted {
        /// Exchanges it had made on the copy pump.
        exchanges: u32,
    },
    /// `shutdown(SHUT_RDWR)` (unless `unshut`) then `close` on both sockets.
    Closed {
        /// Bytes delivered to the backend.
        to_backend: u64,
        /// Bytes delivered to the client.
        to_client: u64,
        /// The whole connection, from the worker taking it.
        took: Duration,
        /// What ended it, when not both sides finishing.
        error: Option<&'a io::Error>,
        /// Both sockets were read to their end: closed, not shut down.
        unshut: bool,
    },
    /// The worker goes back to wait on the queue.
    Waiting {
        /// The worker's number.
        worker: usize,
        /// Clients it has served so far.
        served: u64,
    },
}

// ---------------------------------------------------------------------------
// The switch, the output, the per-connection state.

static ON: AtomicBool = AtomicBool::new(false);
static LANG: AtomicU8 = AtomicU8::new(0);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Where lines go instead of the log, when a test set it.
type Output = Box<dyn Fn(&str) + Send + Sync>;
static OUTPUT: RwLock<Option<Output>> = RwLock::new(None);

/// Clients in the queue: their fd → (their id, when they went in).
fn queued_table() -> &'static Mutex<HashMap<RawFd, (u64, Instant)>> {
    static TABLE: OnceLock<Mutex<HashMap<RawFd, (u64, Instant)>>> = OnceLock::new();
    TABLE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// What this thread knows of the connection it is telling.
#[derive(Default)]
struct Conn {
    /// The connection's id; 0 before the first.
    id: u64,
    /// When the worker took it.
    taken: Option<Instant>,
    /// The worker's number and how many clients it took so far.
    worker: usize,
    served: u64,
    /// Per direction (client → backend, backend → client).
    flows: [Flow; 2],
}

/// One direction's bytes not yet told.
#[derive(Default)]
struct Flow {
    seen: bool,
    done: bool,
    pending: u64,
    rounds: u64,
    total: u64,
    told_at: Option<Instant>,
}

thread_local! {
    /// This thread's connection, as the trace knows it. Boxed (allocated
    /// the first time the trace is on): a pointer in every thread's
    /// thread-locals, which sit at the top of each worker's small stack
    /// (docs/internals.md, "The pool").
    static CONN: RefCell<Box<Conn>> = RefCell::new(Box::default());
    /// This thread's worker number; 0 on a thread that is not a worker.
    static WORKER_NUMBER: Cell<usize> = const { Cell::new(0) };
}

/// The number of the worker thread calling it (1 for the first worker a
/// pool started, 2 for the next, ...), or 0 on any other thread. The
/// trace uses it to say which worker took a client.
pub fn worker_number() -> usize {
    WORKER_NUMBER.with(Cell::get)
}

/// Numbers the calling thread as worker `number` (the pool's workers, once
/// each at their start).
pub(crate) fn set_worker_number(number: usize) {
    WORKER_NUMBER.with(|n| n.set(number));
}

/// Whether tracing is on: one relaxed load, the only cost of a hook when
/// it is off.
#[inline(always)]
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Turns tracing on, in `lang`, for the whole process (see the module
/// docs). It stays on.
pub fn enable(lang: Lang) {
    set_lang(lang);
    ON.store(true, Ordering::Relaxed);
}

/// Changes the language of the lines from now on.
pub fn set_lang(lang: Lang) {
    LANG.store(lang as u8, Ordering::Relaxed);
}

fn lang() -> Lang {
    if LANG.load(Ordering::Relaxed) == Lang::Pt as u8 {
        Lang::Pt
    } else {
        Lang::En
    }
}

/// Sends the lines to `output` instead of the log (`None`: back to the
/// log). For tests, which read what a connection told.
pub fn set_output(output: Option<Output>) {
    *OUTPUT.write() = output;
}

/// Writes one line for connection `id`.
#[cold]
#[inline(never)]
fn write(id: u64, event: &Event<'_>) {
    let line = format!("#{id} {}", text(lang(), event));
    match &*OUTPUT.read() {
        Some(output) => output(&line),
        None => log::info!(target: TARGET, "{line}"),
    }
}

fn current_id() -> u64 {
    CONN.with(|c| c.borrow().id)
}

/// Tells `event` as a step of this thread's current connection.
#[inline]
pub fn event(event: Event<'_>) {
    if on() {
        write(current_id(), &event);
    }
}

/// `accept(2)` returned client `fd` from `peer`: a new connection id,
/// current on this (the accept) thread.
#[inline]
pub fn accepted(peer: SocketAddr, fd: RawFd) {
    if on() {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        CONN.with(|c| c.borrow_mut().id = id);
        write(id, &Event::Accepted { peer, fd });
    }
}

/// Client `fd` goes into the queue behind `ahead` others. Told before the
/// push, so that the worker's line cannot come first.
#[inline]
pub fn queued(fd: RawFd, ahead: usize) {
    if on() {
        let id = current_id();
        queued_table().lock().insert(fd, (id, Instant::now()));
        write(id, &Event::Queued { ahead });
    }
}

/// Worker `worker` took client `fd` out of the queue: its connection
/// becomes this thread's current one.
#[inline]
pub fn taken(fd: RawFd, worker: usize) {
    if on() {
        taken_slow(fd, worker);
    }
}

#[cold]
fn taken_slow(fd: RawFd, worker: usize) {
    let now = Instant::now();
    let (id, waited) = match queued_table().lock().remove(&fd) {
        Some((id, at)) => (id, now.saturating_duration_since(at)),
        // Queued before tracing was on: a new id.
        None => (NEXT_ID.fetch_add(1, Ordering::Relaxed), Duration::ZERO),
    };
    let first = CONN.with(|c| {
        let mut c = c.borrow_mut();
        let served = c.served;
        **c = Conn {
            id,
            taken: Some(now),
            worker,
            served: served + 1,
            flows: Default::default(),
        };
        served == 0
    });
    write(
        id,
        &Event::Taken {
            worker,
            first,
            waited,
        },
    );
}

/// One turn of the pump moved `to_backend` and `to_client` bytes; `up_done`
/// and `down_done` say whether each direction has passed its end of stream
/// on. Coalesces the bytes into a line per direction at most every
/// [`FLOW_EVERY`] or [`FLOW_BYTES`] (the first bytes of each direction get
/// a line at once), and tells each half-close once. Bytes held back are
/// told with the next bytes of their direction that come after
/// [`FLOW_EVERY`], or at the latest when that direction ends or the
/// connection closes: a keep-alive connection gone quiet right after a
/// burst tells the burst's tail only then.
#[inline]
pub fn pumped(to_backend: u64, to_client: u64, up_done: bool, down_done: bool) {
    if on() {
        pumped_slow([to_backend, to_client], [up_done, down_done]);
    }
}

#[cold]
fn pumped_slow(moved: [u64; 2], done: [bool; 2]) {
    let sides = [Side::Client, Side::Backend];
    CONN.with(|c| {
        let mut c = c.borrow_mut();
        let id = c.id;
        for i in 0..2 {
            let last = c.flows[1 - i].done; // the close tells this one's end
            let flow = &mut c.flows[i];
            let n = moved[i];
            if n > 0 {
                flow.total += n;
                let now = Instant::now();
                if !flow.seen {
                    flow.seen = true;
                    flow.told_at = Some(now);
                    write(
                        id,
                        &Event::FirstBytes {
                            from: sides[i],
                            bytes: n,
                        },
                    );
                } else {
                    flow.pending += n;
                    flow.rounds += 1;
                    let due = flow
                        .told_at
                        .map_or(true, |t| now.saturating_duration_since(t) >= FLOW_EVERY);
                    if due || flow.pending >= FLOW_BYTES {
                        flow.told_at = Some(now);
                        tell_flow(id, sides[i], flow);
                    }
                }
            }
            if done[i] && !flow.done {
                flow.done = true;
                tell_flow(id, sides[i], flow);
                let from = sides[i];
                write(id, &Event::HalfClose { from, last });
            }
        }
    });
}

/// Tells the bytes of `flow` not yet told, if any.
fn tell_flow(id: u64, from: Side, flow: &mut Flow) {
    if flow.pending > 0 {
        write(
            id,
            &Event::Flow {
                from,
                bytes: flow.pending,
                rounds: flow.rounds,
                total: flow.total,
            },
        );
        flow.pending = 0;
        flow.rounds = 0;
    }
}

/// The copy pump handed the connection to the kernel relay after
/// `exchanges` exchanges. Told once per connection, off the pump's path.
#[cold]
pub fn promoted(exchanges: u32) {
    if on() {
        let id = CONN.with(|c| {
            let mut c = c.borrow_mut();
            let id = c.id;
            for (flow, side) in c.flows.iter_mut().zip([Side::Client, Side::Backend]) {
                tell_flow(id, side, flow);
            }
            id
        });
        write(id, &Event::Promoted { exchanges });
    }
}

/// Both sockets were closed (shut down first unless `unshut`) after
/// `to_backend` and `to_client` bytes; `error` ended it, if anything did.
#[inline]
pub fn closed(to_backend: u64, to_client: u64, error: Option<&io::Error>, unshut: bool) {
    if on() {
        closed_slow(to_backend, to_client, error, unshut);
    }
}

#[cold]
fn closed_slow(to_backend: u64, to_client: u64, error: Option<&io::Error>, unshut: bool) {
    let sides = [Side::Client, Side::Backend];
    let (id, took) = CONN.with(|c| {
        let mut c = c.borrow_mut();
        let id = c.id;
        for (flow, side) in c.flows.iter_mut().zip(sides) {
            tell_flow(id, side, flow);
        }
        (id, c.taken.map_or(Duration::ZERO, |t| t.elapsed()))
    });
    write(
        id,
        &Event::Closed {
            to_backend,
            to_client,
            took,
            error,
            unshut,
        },
    );
}

/// The worker is done with its connection and waits on the queue again.
#[inline]
pub fn waiting() {
    if on() {
        let (id, worker, served) = CONN.with(|c| {
            let c = c.borrow();
            (c.id, c.worker, c.served)
        });
        write(id, &Event::Waiting { worker, served });
    }
}

#[cfg(test)]
mod tests {
    use super::text::Dur;
    use super::*;

    #[test]
    fn languages_and_locales() {
        assert_eq!("en".parse::<Lang>(), Ok(Lang::En));
        assert_eq!("pt".parse::<Lang>(), Ok(Lang::Pt));
        assert!("fr".parse::<Lang>().is_err());
        assert_eq!(Lang::from_locale("pt_BR.UTF-8"), Some(Lang::Pt));
        assert_eq!(Lang::from_locale("pt_PT"), Some(Lang::Pt));
        assert_eq!(Lang::from_locale("C.UTF-8"), Some(Lang::En));
        assert_eq!(Lang::from_locale(""), None);
        assert_eq!(Lang::default(), Lang::En);
    }

    #[test]
    fn every_event_has_both_languages() {
        let err = io::Error::from(io::ErrorKind::ConnectionRefused);
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let window = Duration::from_secs(1);
        let events = [
            Event::Accepted {
                peer: "127.0.0.1:5000".parse().unwrap(),
                fd: 9,
            },
            Event::RateAllowed {
                ip,
                used: 1,
                limit: 10,
                window,
            },
            Event::RateRefused {
                ip,
                limit: 10,
                window,
                retry_after: Duration::from_millis(300),
            },
            Event::Picked {
                algorithm: "round-robin",
                server_idx: 1,
                backend: "127.0.0.1:8002",
                service: None,
            },
            Event::NoBackend,
            Event::Queued { ahead: 0 },
            Event::Queued { ahead: 2 },
            Event::Taken {
                worker: 1,
                first: true,
                waited: Duration::from_micros(42),
            },
            Event::ConnectFailed {
                backend: "127.0.0.1:8001",
                reason: &err,
                failures: 1,
            },
            Event::FailOver {
                backend: "127.0.0.1:8002",
            },
            Event::Connected {
                backend: "127.0.0.1:8002",
                fd: 10,
                took: Duration::from_micros(1500),
            },
            Event::Unreachable,
            Event::FirstBytes {
                from: Side::Client,
                bytes: 78,
            },
            Event::Flow {
                from: Side::Backend,
                bytes: 4096,
                rounds: 1,
                total: 8192,
            },
            Event::HalfClose {
                from: Side::Backend,
                last: false,
            },
            Event::HalfClose {
                from: Side::Client,
                last: true,
            },
            Event::Promoted { exchanges: 4 },
            Event::Closed {
                to_backend: 78,
                to_client: 160,
                took: Duration::from_millis(2),
                error: Some(&err),
                unshut: false,
            },
            Event::Closed {
                to_backend: 78,
                to_client: 160,
                took: Duration::from_millis(2),
                error: None,
                unshut: true,
            },
            Event::Waiting {
                worker: 1,
                served: 1,
            },
            Event::Sni {
                name: Some("a.test"),
                why: "",
                service: Some("a"),
            },
            Event::Sni {
                name: None,
                why: "not a TLS handshake record",
                service: None,
            },
            Event::TlsHandshake {
                version: "TLSv1.3",
                sni: Some("a.test"),
            },
            Event::Denied { ip },
            Event::TooManyConnections { ip },
            Event::Picked {
                algorithm: "least-connections",
                server_idx: 0,
                backend: "127.0.0.1:5432",
                service: Some("db"),
            },
        ];
        for e in &events {
            let (en, pt) = (text(Lang::En, e), text(Lang::Pt, e));
            assert!(!en.is_empty() && !pt.is_empty());
            assert_ne!(en, pt, "{e:?} has one text for both languages");
        }
        assert_eq!(
            text(Lang::Pt, &events[10]),
            "conectado ao backend 127.0.0.1:8002 em 1,5 ms: o socket dele é o fd 10"
        );
        assert_eq!(
            text(Lang::En, &events[13]),
            "backend → client: 4096 more bytes in 1 turn(s) of the pump, 8192 so far"
        );
        // A named service is said; the flat configuration's one is not.
        let last = events.last().unwrap();
        assert_eq!(
            text(Lang::En, last),
            "least-connections chose server_idx 0: backend 127.0.0.1:5432 (service db)"
        );
        assert!(text(Lang::Pt, last).ends_with("(serviço db)"));
        assert!(!text(Lang::En, &events[3]).contains("service"));
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(
            Dur(Duration::from_micros(42), Lang::En).to_string(),
            "42 µs"
        );
        assert_eq!(
            Dur(Duration::from_micros(1250), Lang::En).to_string(),
            "1.2 ms"
        );
        assert_eq!(
            Dur(Duration::from_millis(2050), Lang::Pt).to_string(),
            "2,05 s"
        );
    }
}
