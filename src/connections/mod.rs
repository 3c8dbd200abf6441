//! The live table of connections: one slot per worker thread, written by
//! the worker that serves the connection, read by the admin API
//! (`GET /connections`, the stats page) and by whoever ends connections on
//! purpose (`DELETE /connections/{id}`, a backend marked DOWN or removed,
//! `max_connection_lifetime`, the drain's spread).
//!
//! # Threads
//!
//! A worker claims a slot the first time it serves a client and keeps it
//! until the thread exits; the pool is bounded, so the table is too. What
//! changes while bytes move (the bytes each way, the last activity, the
//! state) are relaxed atomics the worker stores without a lock: the pump
//! pays at most three relaxed stores and a coarse clock read per round
//! that moved bytes ([`moved`]). What is set once per connection (the
//! service, the client, the backend, TLS, the sockets' descriptors) sits
//! behind the slot's own small mutex, taken by its worker a few times per
//! connection and by admin reads: never per chunk.
//!
//! Ending a connection ([`Table::kill`]) takes the slot's mutex, checks
//! the id, records why and shuts both sockets down (`shutdown(2)`), which
//! wakes the worker wherever it waits (`poll(2)` on the sockets). The
//! descriptors are cleared under that mutex before the worker closes its
//! sockets ([`end`]), so a shutdown never reaches a descriptor number
//! reused by another connection. The deadlines (`max_connection_lifetime`,
//! `removed_drain_timeout`) are kept in the slots and enforced by one
//! thread (`watch.rs`), started with the first deadline.
//!
//! # Parts
//!
//! - this file: the table, its slots, what a worker writes;
//! - `view`: what a reader sees of a slot ([`View`]), and the ends on
//!   purpose ([`Kill`]) and the policies ([`OnDown`], [`OnRemoved`]);
//! - `watch`: the deadlines' thread;
//! - `carry`: a connection handed to a new process (`upgrade_socket`).
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C's threads are not listed anywhere.

use std::cell::Cell;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;

pub mod carry;
mod view;
mod watch;

pub use view::{Ends, Kill, Mode, OnDown, OnRemoved, Own, Phase, Removal, SpreadOrder, View};

/// Slots per chunk; chunks are made as workers come.
const CHUNK: usize = 256;
/// Chunks at most: room for 65,536 workers (the most `workers` allows).
const CHUNKS: usize = 256;

/// A backend as the table knows it: its name and its unique id. Held by
/// the slot while the connection lasts (one reference count).
pub trait Peer: Send + Sync {
    /// `HOST:PORT` as configured.
    fn peer_name(&self) -> &str;
    /// The backend's unique id.
    fn peer_id(&self) -> u64;
}

/// What a worker sets once per connection, behind the slot's mutex.
#[derive(Default)]
struct Info {
    /// The connection's id; 0 while the slot serves none.
    id: u64,
    /// The balancer it belongs to ([`Begin::owner`]).
    owner: usize,
    service: Option<Arc<str>>,
    client: Option<SocketAddr>,
    backend: Option<Arc<dyn Peer>>,
    tls: Option<Tls>,
    /// The client's and the backend's descriptors, -1 when none: cleared
    /// before the worker closes them.
    fds: [RawFd; 2],
    /// `on_backend_down: close` for this connection.
    down_close: bool,
    /// `on_backend_removed` and `removed_drain_timeout` for it.
    removed: OnRemoved,
    /// The fin timeout, for the second step of the lifetime's end.
    fin: Duration,
    /// The worker thread, for the hand-over's wake-up (`carry`); cleared
    /// under this lock before the thread exits.
    thread: Option<libc::pthread_t>,
    /// Where the worker sends its offer when a hand-over asks for it.
    ask: Option<crossbeam_channel::Sender<carry::Offer>>,
}

/// The client's TLS, for a service that terminates it.
#[derive(Debug, Clone, Default)]
struct Tls {
    sni: Option<String>,
    version: &'static str,
    subject: Option<String>,
}

/// One worker's slot.
pub struct Slot {
    /// Held by a worker thread.
    taken: AtomicBool,
    /// The connection's id (0: none), mirrored from [`Info`] for scans.
    id: AtomicU64,
    phase: AtomicU8,
    mode: AtomicU8,
    /// [`now_ms`] when the worker took the client.
    started: AtomicU64,
    /// [`now_ms`] when bytes last moved (or the client was taken).
    active: AtomicU64,
    to_backend: AtomicU64,
    to_client: AtomicU64,
    /// Why it is being ended on purpose ([`Kill`] as a number), 0: not.
    kill: AtomicU8,
    /// [`now_ms`] of the lifetime's end (its first step, then its second),
    /// 0: none.
    lifetime_at: AtomicU64,
    /// [`now_ms`] when a removed backend's drain ends for it, 0: none.
    cut_at: AtomicU64,
    /// A hand-over asks for its connection (`carry`).
    asked: AtomicBool,
    info: Mutex<Info>,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            taken: AtomicBool::new(false),
            id: AtomicU64::new(0),
            phase: AtomicU8::new(0),
            mode: AtomicU8::new(0),
            started: AtomicU64::new(0),
            active: AtomicU64::new(0),
            to_backend: AtomicU64::new(0),
            to_client: AtomicU64::new(0),
            kill: AtomicU8::new(0),
            lifetime_at: AtomicU64::new(0),
            cut_at: AtomicU64::new(0),
            asked: AtomicBool::new(false),
            info: Mutex::new(Info {
                fds: [-1, -1],
                ..Info::default()
            }),
        }
    }

    /// Records `why` (the first reason wins) and shuts the connection
    /// down: both ways of both sockets, or, for the lifetime's first step,
    /// only the write side toward the client. Under the slot's lock, with
    /// the id checked: `false` when the slot no longer serves `id`.
    fn end_with(&self, id: u64, why: Kill, only_client_write: bool) -> bool {
        let info = self.info.lock();
        if info.id != id || id == 0 {
            return false;
        }
        let _ = self.kill.compare_exchange(0, why as u8, Relaxed, Relaxed);
        let [client, backend] = info.fds;
        if only_client_write {
            shutdown(client, libc::SHUT_WR);
        } else {
            shutdown(client, libc::SHUT_RDWR);
            shutdown(backend, libc::SHUT_RDWR);
        }
        true
    }
}

/// `shutdown(2)` of `fd` when it is one; errors (a peer gone) are moot.
fn shutdown(fd: RawFd, how: libc::c_int) {
    if fd >= 0 {
        // SAFETY: `fd` is open: the caller holds the slot's lock, and the
        // worker clears it there before closing it.
        unsafe { libc::shutdown(fd, how) };
    }
}

/// The table: every slot, made in chunks as workers come.
pub struct Table {
    chunks: [OnceLock<Box<[Slot]>>; CHUNKS],
    /// Slots handed out so far (the next one's index).
    made: AtomicUsize,
    next_id: AtomicU64,
    /// Slots given back by exited workers, reused first.
    free: Mutex<Vec<&'static Slot>>,
    /// Connections ended on purpose, ever.
    kills: AtomicU64,
}

/// A chunk not made yet (a `const` item, so that the array repeats it).
#[allow(clippy::declare_interior_mutable_const)]
const UNMADE: OnceLock<Box<[Slot]>> = OnceLock::new();

static TABLE: Table = Table {
    chunks: [UNMADE; CHUNKS],
    made: AtomicUsize::new(0),
    next_id: AtomicU64::new(1),
    free: Mutex::new(Vec::new()),
    kills: AtomicU64::new(0),
};

/// The process's table.
pub fn table() -> &'static Table {
    &TABLE
}

/// Milliseconds on the coarse monotonic clock (a few ms of resolution, no
/// system call): the table's one clock.
pub fn now_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    (ts.tv_sec as u64) * 1000 + (ts.tv_nsec as u64) / 1_000_000
}

impl Table {
    /// Every slot made so far, in order.
    fn slots(&self) -> impl Iterator<Item = &'static Slot> {
        let made = TABLE.made.load(Relaxed).min(CHUNK * CHUNKS);
        (0..made.div_ceil(CHUNK))
            .filter_map(|c| TABLE.chunks[c].get())
            .flat_map(|chunk| chunk.iter())
            .take(made)
    }

    /// A slot for a new worker thread: one given back, or the next one;
    /// `None` past the table's size (the connection is then not listed).
    fn claim(&self) -> Option<&'static Slot> {
        if let Some(slot) = self.free.lock().pop() {
            slot.taken.store(true, Relaxed);
            return Some(slot);
        }
        let i = self.made.fetch_add(1, Relaxed);
        if i >= CHUNK * CHUNKS {
            self.made.fetch_sub(1, Relaxed);
            return None;
        }
        let chunk =
            TABLE.chunks[i / CHUNK].get_or_init(|| (0..CHUNK).map(|_| Slot::new()).collect());
        let slot = &chunk[i % CHUNK];
        slot.taken.store(true, Relaxed);
        Some(slot)
    }

    /// Every connection open now, oldest first.
    pub fn list(&self) -> Vec<View> {
        let now = now_ms();
        let mut all: Vec<View> = self.slots().filter_map(|s| View::of(s, now)).collect();
        all.sort_by_key(|v| v.id);
        all
    }

    /// Ends connection `id` on purpose: `true` when it was open.
    pub fn kill(&self, id: u64, why: Kill) -> bool {
        if id == 0 {
            return false;
        }
        let ended = self
            .slots()
            .any(|s| s.id.load(Relaxed) == id && s.end_with(id, why, false));
        if ended {
            self.kills.fetch_add(1, Relaxed);
        }
        ended
    }

    /// Ends every connection `pick` chooses (it sees each one's view);
    /// how many were.
    pub fn kill_where(&self, why: Kill, pick: impl Fn(&View) -> bool) -> usize {
        let now = now_ms();
        let chosen: Vec<u64> = self
            .slots()
            .filter_map(|s| View::of(s, now))
            .filter(|v| pick(v))
            .map(|v| v.id)
            .collect();
        chosen.into_iter().filter(|&id| self.kill(id, why)).count()
    }

    /// Backend `backend` was marked DOWN: its connections whose service
    /// (or the backend itself) says `on_backend_down: close` end now.
    pub fn backend_down(&self, backend: u64) -> usize {
        self.kill_where(Kill::Down, |v| {
            v.backend_id == Some(backend) && v.down_close
        })
    }

    /// Backend `backend` was removed: its connections that say
    /// `on_backend_removed: close` end now, and those that drain with a
    /// `removed_drain_timeout` get their deadline.
    pub fn backend_removed(&self, backend: u64) -> usize {
        let now = now_ms();
        let mut closed = 0;
        for slot in self.slots() {
            let Some(v) = View::of(slot, now) else {
                continue;
            };
            if v.backend_id != Some(backend) {
                continue;
            }
            match v.removed {
                OnRemoved::Close => closed += usize::from(self.kill(v.id, Kill::Removed)),
                OnRemoved::Drain(Some(after)) => {
                    let at = now + after.as_millis() as u64;
                    let _ = slot.cut_at.compare_exchange(0, at.max(1), Relaxed, Relaxed);
                    watch::start();
                }
                OnRemoved::Drain(None) => {}
            }
        }
        closed
    }

    /// Connections ended on purpose, ever (every reason).
    pub fn kills(&self) -> u64 {
        self.kills.load(Relaxed)
    }
}

/// The thread's slot; given back when the thread exits.
struct Held(Cell<Option<&'static Slot>>);

impl Drop for Held {
    fn drop(&mut self) {
        let _ = FAST.try_with(|f| f.set(None));
        if let Some(slot) = self.0.take() {
            // Under the lock: a hand-over signals this thread only while
            // it is listed there.
            slot.info.lock().thread = None;
            slot.taken.store(false, Relaxed);
            TABLE.free.lock().push(slot);
        }
    }
}

thread_local! {
    /// The thread's slot, given back when the thread exits.
    static MINE: Held = const { Held(Cell::new(None)) };
    /// The same slot, for the pump's per-round stores: a plain `Cell`
    /// with no destructor, so that reading it is one thread-local load
    /// (no check of a destructor's registration).
    static FAST: Cell<Option<&'static Slot>> = const { Cell::new(None) };
}

/// The calling thread's slot while it serves a connection.
#[inline]
fn mine() -> Option<&'static Slot> {
    FAST.with(Cell::get)
}

/// What the worker knows of a connection when it takes the client.
#[derive(Debug, Clone, Default)]
pub struct Begin {
    /// The balancer that serves it (a process may run several, as the
    /// tests do): the address of its process-wide counters.
    pub owner: usize,
    /// Its service's name.
    pub service: Option<Arc<str>>,
    /// Its lifetime and the jitter spread over it
    /// (`max_connection_lifetime`, `..._jitter`).
    pub lifetime: Option<(Duration, Option<Duration>)>,
    /// The fin timeout, between the lifetime's two steps.
    pub fin: Duration,
    /// `on_backend_down` of the service.
    pub on_down: OnDown,
    /// `on_backend_removed` of the service.
    pub on_removed: OnRemoved,
}

/// A worker took `client` (descriptor `fd`): the connection is listed from
/// now on, waiting. Its id is new.
pub fn begin(client: SocketAddr, fd: RawFd, how: Begin) {
    let slot = match MINE.try_with(|h| match h.0.get() {
        Some(s) => Some(s),
        None => {
            let s = TABLE.claim();
            h.0.set(s);
            FAST.with(|f| f.set(s));
            s
        }
    }) {
        Ok(Some(slot)) => slot,
        _ => return,
    };
    let now = now_ms();
    let id = TABLE.next_id.fetch_add(1, Relaxed);
    let mut info = slot.info.lock();
    *info = Info {
        id,
        owner: how.owner,
        service: how.service,
        client: Some(client),
        backend: None,
        tls: None,
        fds: [fd, -1],
        down_close: how.on_down == OnDown::Close,
        removed: how.on_removed,
        fin: how.fin,
        // SAFETY: pthread_self cannot fail.
        thread: Some(unsafe { libc::pthread_self() }),
        ask: None,
    };
    slot.kill.store(0, Relaxed);
    slot.asked.store(false, Relaxed);
    slot.phase.store(Phase::Waiting as u8, Relaxed);
    slot.mode.store(Mode::Copy as u8, Relaxed);
    slot.started.store(now, Relaxed);
    slot.active.store(now, Relaxed);
    slot.to_backend.store(0, Relaxed);
    slot.to_client.store(0, Relaxed);
    slot.cut_at.store(0, Relaxed);
    let lifetime = how.lifetime.map_or(0, |(life, jitter)| {
        now + (life + view::jitter(id, jitter)).as_millis() as u64
    });
    slot.lifetime_at.store(lifetime, Relaxed);
    slot.id.store(id, Relaxed);
    drop(info);
    if lifetime != 0 {
        watch::start();
    }
}

/// The connection's phase now.
pub fn phase(phase: Phase) {
    if let Some(slot) = mine() {
        slot.phase.store(phase as u8, Relaxed);
    }
}

/// How its bytes move now.
pub fn mode(mode: Mode) {
    if let Some(slot) = mine() {
        slot.mode.store(mode as u8, Relaxed);
    }
}

/// Connected to `backend` on descriptor `fd`; `down_close` overrides the
/// service's `on_backend_down` when the backend has its own, as
/// `removed` does `on_backend_removed`.
pub fn linked(backend: Arc<dyn Peer>, fd: RawFd, own: (Option<OnDown>, Option<OnRemoved>)) {
    let Some(slot) = mine() else {
        return;
    };
    let mut info = slot.info.lock();
    info.backend = Some(backend);
    info.fds[1] = fd;
    if let Some(on_down) = own.0 {
        info.down_close = on_down == OnDown::Close;
    }
    if let Some(removed) = own.1 {
        info.removed = removed;
    }
    drop(info);
    slot.phase.store(Phase::Pumping as u8, Relaxed);
}

/// The client's TLS: its server name, version and certificate subject.
pub fn tls(sni: Option<String>, version: &'static str, subject: Option<String>) {
    if let Some(slot) = mine() {
        slot.info.lock().tls = Some(Tls {
            sni,
            version,
            subject,
        });
    }
}

/// Bytes moved so far, each way: the pump's per-round call, once a round
/// that moved bytes. Relaxed stores and the coarse clock, nothing more.
#[inline]
pub fn moved(to_backend: u64, to_client: u64) {
    if let Some(slot) = mine() {
        slot.to_backend.store(to_backend, Relaxed);
        slot.to_client.store(to_client, Relaxed);
        slot.active.store(now_ms(), Relaxed);
    }
}

/// Why the calling worker's connection is being ended on purpose, if it
/// is.
pub fn killed() -> Option<Kill> {
    mine().and_then(|s| Kill::from_u8(s.kill.load(Relaxed)))
}

/// The connection is about to close: it leaves the table (its
/// descriptors first, under the lock), and why it was ended on purpose,
/// if it was. Called before the sockets close; a second call, or one on a
/// thread that serves none, does nothing.
pub fn end() -> Option<Kill> {
    let slot = mine()?;
    if slot.id.load(Relaxed) == 0 {
        return None;
    }
    let mut info = slot.info.lock();
    let backend = info.backend.take();
    let service = info.service.take();
    info.id = 0;
    info.fds = [-1, -1];
    info.tls = None;
    slot.id.store(0, Relaxed);
    slot.lifetime_at.store(0, Relaxed);
    slot.cut_at.store(0, Relaxed);
    drop(info);
    // The references go outside the lock.
    drop((backend, service));
    Kill::from_u8(slot.kill.swap(0, Relaxed))
}

#[cfg(test)]
mod tests;
