//! An open connection handed to a new process (`upgrade_socket`): the
//! worker that serves it is asked, stops its pump where both buffers are
//! known, offers what it holds ([`Offer`]: the two descriptors, the bytes
//! read but not yet written each way, the ends already seen, the
//! counters) and waits for the verdict: taken (it closes its copies of
//! the descriptors, no `shutdown(2)`, and ends `handed_over`) or kept (it
//! pumps on, as if nothing happened).
//!
//! # Threads
//!
//! The upgrade thread asks every connection at once ([`ask_all`]): it
//! leaves a channel in each slot, sets the slot's flag and sends the
//! worker `SIGURG` (a no-op handler, installed once, without
//! `SA_RESTART`), which ends the pump's `poll(2)` with `EINTR`; it sends
//! the signal again ([`wake`]) while a worker has not answered, since one
//! that arrives just before the `poll` is lost. The offers come as the
//! workers get the CPU, and go over one at a time. The pump reads one process-wide flag per round ([`asked`]): a
//! relaxed load, `false` but during a hand-over. While a connection is
//! offered its descriptors are out of the slot, so no kill (a
//! `shutdown(2)`) reaches sockets the new process may already hold.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Once;

use crossbeam_channel::{bounded, Sender};

use super::{mine, now_ms, shutdown, Kill, Mode, Phase, Slot, TABLE};

/// One direction at the hand-over.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pending {
    /// Read from its source, not yet written to its destination.
    pub bytes: Vec<u8>,
    /// Its source said end of stream.
    pub eof: bool,
    /// That end of stream was passed on (`shutdown(Write)`).
    pub done: bool,
}

/// A connection at the hand-over, its descriptors aside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    /// Its id in the process that hands it over.
    pub id: u64,
    /// Its service's name (`None`: a flat configuration's one service).
    pub service: Option<String>,
    /// The backend's name, `HOST:PORT` as configured.
    pub backend: String,
    /// The client's address.
    pub client: SocketAddr,
    /// Milliseconds since its worker took the client.
    pub age_ms: u64,
    /// Bytes the backend's socket accepted so far.
    pub to_backend: u64,
    /// Bytes the client's socket accepted so far.
    pub to_client: u64,
    /// Client to backend.
    pub up: Pending,
    /// Backend to client.
    pub down: Pending,
}

/// What a worker offers: the state, the client's and the backend's
/// descriptors (still its own until the verdict), and where the verdict
/// goes.
#[derive(Debug)]
pub struct Offer {
    /// The connection's state.
    pub state: State,
    /// The client's and the backend's descriptors.
    pub fds: [RawFd; 2],
    verdict: Sender<bool>,
}

impl Offer {
    /// Tells the worker: `true`, the new process has the connection (the
    /// worker closes its copies and ends it); `false`, it pumps on.
    pub fn answer(self, taken: bool) {
        let _ = self.verdict.send(taken);
    }
}

/// During a hand-over: the pumps look at their slot's flag.
static ASKING: AtomicBool = AtomicBool::new(false);

/// Whether the calling worker's connection is asked for: one relaxed
/// load, and the slot's own flag only during a hand-over.
#[inline]
pub fn asked() -> bool {
    ASKING.load(Relaxed) && mine().is_some_and(|s| s.asked.load(Relaxed))
}

/// The worker's side: offers its connection with what its pump holds,
/// and waits for the verdict; whether it was taken.
#[cold]
#[inline(never)]
pub fn offer(up: Pending, down: Pending, transfer: [u64; 2]) -> bool {
    let Some(slot) = mine() else {
        return false;
    };
    slot.asked.store(false, Relaxed);
    let mut info = slot.info.lock();
    let (Some(ask), Some(backend), Some(client)) =
        (info.ask.take(), info.backend.clone(), info.client)
    else {
        return false;
    };
    let fds = info.fds;
    let state = State {
        id: info.id,
        service: info.service.as_deref().map(str::to_string),
        backend: backend.peer_name().to_string(),
        client,
        age_ms: now_ms().saturating_sub(slot.started.load(Relaxed)),
        to_backend: transfer[0],
        to_client: transfer[1],
        up,
        down,
    };
    // Out of a kill's reach while the new process may hold them.
    info.fds = [-1, -1];
    drop(info);
    let (verdict, heard) = bounded(1);
    let offer = Offer {
        state,
        fds,
        verdict,
    };
    let taken = ask.send(offer).is_ok() && heard.recv().unwrap_or(false);
    if taken {
        slot.kill.store(Kill::Carried as u8, Relaxed);
        return true;
    }
    let mut info = slot.info.lock();
    info.fds = fds;
    // Killed while offered: the shutdown it could not make.
    if slot.kill.load(Relaxed) != 0 {
        shutdown(fds[0], libc::SHUT_RDWR);
        shutdown(fds[1], libc::SHUT_RDWR);
    }
    false
}

/// The worker's side when its connection cannot be offered now (bytes in
/// a pipe, a direction already stopped): the asker hears at once.
#[cold]
pub fn decline() {
    if let Some(slot) = mine() {
        slot.asked.store(false, Relaxed);
        slot.info.lock().ask = None;
    }
}

/// The connections a hand-over may carry now: moving bytes on the copy
/// pump, through pipes or on the kernel relay (which hands them back to
/// the copy pump first), not through TLS; by id.
pub fn candidates() -> Vec<u64> {
    TABLE
        .slots()
        .filter(|s| s.phase.load(Relaxed) == Phase::Pumping as u8)
        .filter(|s| s.mode.load(Relaxed) != Mode::Tls as u8)
        .map(|s| s.id.load(Relaxed))
        .filter(|&id| id != 0)
        .collect()
}

/// Whether connection `id` is still open here.
pub fn is_open(id: u64) -> bool {
    TABLE.slots().any(|s| s.id.load(Relaxed) == id)
}

/// Connections on their way to a backend: taken by a worker, not yet
/// moving bytes.
pub fn on_their_way() -> usize {
    TABLE
        .slots()
        .filter(|s| s.id.load(Relaxed) != 0)
        .filter(|s| s.phase.load(Relaxed) < Phase::Pumping as u8)
        .count()
}

/// A hand-over is on: pumps look at their flags until [`done`].
pub fn begin() {
    install_wake();
    ASKING.store(true, Relaxed);
}

/// The hand-over is over.
pub fn done() {
    ASKING.store(false, Relaxed);
}

/// The slots serving `ids` now, each with its id.
fn slots_of(ids: &[u64]) -> Vec<(&'static Slot, u64)> {
    let wanted: std::collections::HashSet<u64> = ids.iter().copied().collect();
    TABLE
        .slots()
        .filter_map(|s| {
            let id = s.id.load(Relaxed);
            wanted.contains(&id).then_some((s, id))
        })
        .collect()
}

/// Asks the workers of connections `ids`, all at once, for their offers
/// (sent to `to`), and wakes them; the ids asked (those still open).
pub fn ask_all(ids: &[u64], to: &Sender<Offer>) -> Vec<u64> {
    let mut asked = Vec::new();
    for (slot, id) in slots_of(ids) {
        let mut info = slot.info.lock();
        if info.id != id {
            continue;
        }
        info.ask = Some(to.clone());
        slot.asked.store(true, Relaxed);
        signal(&info);
        asked.push(id);
    }
    asked
}

/// Wakes again the workers of `ids` still asked (a signal that came just
/// before their `poll(2)` was lost); the ids still waiting for an answer.
pub fn wake(ids: &[u64]) -> Vec<u64> {
    let mut waiting = Vec::new();
    for (slot, id) in slots_of(ids) {
        let info = slot.info.lock();
        if info.id == id && info.ask.is_some() {
            signal(&info);
            waiting.push(id);
        }
    }
    waiting
}

/// Takes the asks of `ids` back: their workers pump on.
pub fn cancel(ids: &[u64]) {
    for (slot, id) in slots_of(ids) {
        let mut info = slot.info.lock();
        if info.id == id {
            info.ask = None;
            slot.asked.store(false, Relaxed);
        }
    }
}

/// Sends SIGURG to the worker of the slot whose `info` is held.
fn signal(info: &super::Info) {
    if let Some(thread) = info.thread {
        // SAFETY: the thread is alive: it gives its slot back under this
        // lock, held by the caller, before it exits (`Held`), and serves a
        // connection now. SIGURG's handler does nothing.
        unsafe { libc::pthread_kill(thread, libc::SIGURG) };
    }
}

/// A handler for SIGURG that does nothing, without `SA_RESTART`: the
/// signal only ends a worker's `poll(2)`. (Its default is to be ignored,
/// which would not end the wait.)
fn install_wake() {
    static ONCE: Once = Once::new();
    extern "C" fn nothing(_: libc::c_int) {}
    ONCE.call_once(|| {
        // SAFETY: a zeroed sigaction with a handler that touches nothing
        // is valid; sigaction only reads it.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = nothing as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut action.sa_mask);
            action.sa_flags = 0;
            libc::sigaction(libc::SIGURG, &action, std::ptr::null_mut());
        }
    });
}

/// A connection carried in from the previous process, on the calling
/// worker: listed with its age and its bytes so far (its lifetime counted
/// from its first start).
pub fn carried_in(age_ms: u64, to_backend: u64, to_client: u64) {
    if let Some(slot) = mine() {
        let back = |at: u64| at.saturating_sub(age_ms).max(1);
        slot.started
            .store(back(slot.started.load(Relaxed)), Relaxed);
        let life = slot.lifetime_at.load(Relaxed);
        if life != 0 {
            slot.lifetime_at.store(back(life), Relaxed);
        }
        slot.to_backend.store(to_backend, Relaxed);
        slot.to_client.store(to_client, Relaxed);
    }
}
