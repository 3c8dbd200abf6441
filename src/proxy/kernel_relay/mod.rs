//! `kernel_relay`: the kernel moves a connection's bytes between its two
//! sockets (an eBPF sockmap program) while the worker only waits for the
//! end. A connection starts on the copy pump and is handed over here once
//! it has made `kernel_relay_after` exchanges (its promotion, decided by
//! the pump, `pump/promote.rs`); the worker still owns the connection and
//! closes it.
//!
//! # Why
//!
//! On small messages (keep-alive HTTP, redis) the copy pump's cost is not
//! the copy but the wake-ups: each message wakes the connection's thread
//! to read it, and the thread's write then wakes the peer. Here each socket
//! gets a tiny `sk_skb/stream_verdict` program (`bpf`): when a segment
//! arrives on one socket, the program looks up the other socket in a
//! `SOCKHASH` (keyed by the receiving socket's cookie, `SO_COOKIE`) and
//! hands the segment to its send path (`bpf_sk_redirect_hash`). No user
//! thread runs per message. Entering costs about 16 system calls, which a
//! short connection never earns back: hence the promotion.
//!
//! # The pitfalls, and what is done about each
//!
//! - Only `ESTABLISHED` sockets can be inserted: a socket that already
//!   half-closed stays on the copy pump (the pump does not promote then).
//! - Bytes already queued when a socket is inserted wait for the next
//!   segment; a `recv(MSG_PEEK | MSG_DONTWAIT)` after insertion pushes them
//!   through the program.
//! - A bare FIN arrives as a zero-length segment: the program drops it (the
//!   end of stream is still seen, as `POLLRDHUP`, by the thread).
//! - Deleting a socket from the maps, or closing it, throws away what the
//!   kernel still queues for it. So before the thread passes an end of
//!   stream on (`shutdown(SHUT_WR)` on the other socket), it waits until
//!   every byte received on one side reached the other's TCP send path
//!   (`TCP_INFO` and `SIOCOUTQ`, `counts`).
//! - Behind a slow reader the kernel's queue toward it has no bound of
//!   its own. The program enforces one: it redirects a socket's bytes
//!   only while its count stays under a limit its thread moves up as the
//!   other side's send path takes them ([`BACKLOG_BOUND`] ahead); past
//!   it, the program latches and keeps the socket's bytes on the socket,
//!   charged to its receive memory, so TCP's window holds the sender
//!   back, whether or not the thread gets the CPU. The thread, seeing at
//!   its next look that a socket received more than its limit (then it
//!   asks the map), hands the connection back to the copy pump
//!   with nothing lost, one direction at a time, the fuller first
//!   (`Link::settle`): the sockets stay in the maps, and the pump reads
//!   each socket's kept bytes from it.
//! - Taking the program off a socket while a segment arrives can drop
//!   that segment in the kernel (it is out of the receive queue already,
//!   and with no program its verdict is "drop"). Only a hand-over to a
//!   new process takes it off (`Link::unwind`); the backlog bound never
//!   does. Leaving raises the
//!   socket's receive low-water mark first, so that arrivals wait in the
//!   receive queue, and then checks that every byte that left the queue
//!   went through the program: a hole ends the connection with a reset,
//!   never a stream that goes on without it (`Link::unwind`).
//! - Under heavy load the kernel's redirect has been seen to send a whole
//!   segment twice (once in about 500 10 MiB echoes each way, four at once
//!   beside a CPU hog, with or without a fall-back; docs/moving-bytes.md).
//!   Each look checks that no direction handed on more bytes than it
//!   received (`Link::not_doubled`), and so do the wait for a stopped
//!   direction's last bytes (`Link::delivered`), the moment after a FIN
//!   is passed on, and the copy pump's rounds after the relay ([`Bases`]);
//!   one that did ends the connection with a reset, never a stream that
//!   goes on corrupt. The checks count from exact bases (`counts::at_rest`).
//! - Idle and fin timeouts: the thread sees no bytes, so it reads the same
//!   counters: when none moved for the timeout, the connection ends as the
//!   copy pump's would. A quiet connection's looks space out to one a
//!   second ([`MAX_IDLE_CHECK`]).
//!
//! The parts: `link` (the connection's hand-over in and out of the maps),
//! `run` (the waits while it is relayed: the end of stream passed on, the
//! backlog bound, the last bytes after a fault), `counts` (what the
//! sockets' counters say), `bpf` (the program and its maps).
//!
//! # Threads
//!
//! Only the worker thread that owns the connection runs this code; the maps
//! are shared by all (the kernel locks them), loaded once, on first use.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the article copies through a buffer, like the default
//! pump. The connection's life around it (connect, fail-over, the final
//! `shutdown(SHUT_RDWR)` and `close()`) is the same code as always.

use std::cell::RefCell;
use std::fmt;
use std::io;
use std::net::TcpStream;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use crate::stats::Stats;
use crate::units::Switch;

use bpf::{kernel, kernel_for};
use link::Link;

mod bpf;
mod counts;
mod link;
mod run;
#[cfg(test)]
mod tests;

/// Most bytes the kernel may hold for one socket (received on the other,
/// not yet in this one's send path) before the connection leaves the kernel
/// path for the copy pump. The sockets' own buffers come on top, as with
/// any pump.
pub const BACKLOG_BOUND: u64 = 4 << 20;

/// Longest pause between two looks at the counters while bytes move: it
/// bounds how long a limit the program met before its thread raised it
/// goes unraised (the connection then goes back to the copy pump, a
/// little early).
pub const MAX_CHECK: Duration = Duration::from_millis(100);

/// Longest pause between two looks once nothing has moved for a while
/// (the pause doubles from [`MAX_CHECK`] up to it): an idle relayed
/// connection wakes once a second, not ten times. Ends of stream, errors
/// and a hand-over's signal end the wait at once; what it delays is a
/// timeout (seen up to this much late) and the first raise of the limits
/// after a burst (a burst of more than [`BACKLOG_BOUND`] before it goes
/// back to the copy pump).
pub const MAX_IDLE_CHECK: Duration = Duration::from_secs(1);

/// Shortest pause between two looks while bytes stream.
const MIN_CHECK: Duration = Duration::from_millis(1);

/// Longest pause between two looks while an end of stream waits for the
/// last bytes to reach the other side.
const MAX_DELIVERY_CHECK: Duration = Duration::from_millis(20);

/// Tries at reading the counters at rest before the connection is left on
/// the copy pump (see `Link::start_counts`).
const START_TRIES: usize = 8;

/// Longest wait, after one socket failed, for the bytes the program took
/// from it to reach the other side.
const FAULT_GRACE: Duration = Duration::from_secs(1);

/// Whether a connection of a service with this `kernel_relay` tries the
/// promotion. `Auto` is what the shipped unit and the example config use:
/// only when the program loaded (root before the privilege drop, or
/// CAP_BPF and CAP_NET_ADMIN, and a kernel with sockmap; one atomic load,
/// the `OnceLock`'s, once it is settled), off otherwise with one info line.
/// `On` says the operator wants it: always (a program that cannot load is a
/// warning, and every promotion falls back, counted). `Off`, the default,
/// keeps the article's copy pump for every byte.
#[inline]
pub fn promotes(mode: Switch) -> bool {
    match mode {
        Switch::Off => false,
        Switch::On => true,
        Switch::Auto => kernel_for(true).is_some(),
    }
}

/// Loads the program if it is not loaded yet and logs, once, whether the
/// kernel path is available (a warning when `mode` is `On`, an info line
/// when it is `Auto`); whether it is. Called at start-up, before the
/// privilege drop, when a service asks for the kernel relay, so that the
/// program loads while the process may still load it and the operator
/// learns at start which path promoted connections take.
pub fn prepare(mode: Switch) -> bool {
    match mode {
        Switch::Off => false,
        Switch::On => kernel_for(false).is_some(),
        Switch::Auto => kernel_for(true).is_some(),
    }
}

/// How a connection handed to [`relay`] came back.
#[derive(Debug)]
pub enum Relayed {
    /// The kernel path could not take it (the program did not load, a
    /// socket was not `ESTABLISHED`, an insertion failed); it is as it was,
    /// and the copy pump goes on.
    NotTaken,
    /// It came back from the kernel path (the backlog bound, or a
    /// hand-over's ask) with nothing lost: the copy pump goes on from the
    /// byte counts given.
    Back {
        /// The sockets stay in the kernel's maps until they close, the
        /// program keeping each one's bytes on it for the pump to read
        /// (after the backlog bound): such a connection cannot be handed
        /// to another process.
        kept: bool,
        /// Where each direction's counts stood when the relay began: what
        /// the pump needs to see a stream doubled after it ([`Bases`]).
        bases: Bases,
    },
    /// Both directions passed their end of stream on; `client_first`: the
    /// client's came first.
    Finished {
        /// The client closed first.
        client_first: bool,
    },
    /// Nothing moved for the idle timeout (the fin timeout once one side
    /// had closed, then `half_closed`).
    TimedOut {
        /// One side had closed.
        half_closed: bool,
    },
    /// A socket failed: `Some(0)` the client's, `Some(1)` the backend's,
    /// `None` the relay's own calls.
    Failed {
        /// Which socket, when it is one.
        socket: Option<usize>,
        /// What failed.
        error: io::Error,
        /// The kernel broke the stream (a hole, or a segment sent twice):
        /// both peers are to learn it, with a reset.
        broken: bool,
    },
}

/// The error behind a stream the kernel broke ([`Relayed::Failed`]'s
/// `broken`).
#[derive(Debug)]
struct Broken(&'static str);

impl fmt::Display for Broken {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Broken {}

impl Fault {
    /// Socket `i`'s stream, broken by the kernel: `what` happened.
    fn broken(i: usize, what: &'static str) -> Fault {
        Fault(
            Some(i),
            io::Error::new(io::ErrorKind::ConnectionReset, Broken(what)),
        )
    }

    fn into_relayed(self) -> Relayed {
        let Fault(socket, error) = self;
        let broken = error.get_ref().is_some_and(|e| e.is::<Broken>());
        Relayed::Failed {
            socket,
            error,
            broken,
        }
    }
}

/// An error, and the socket it belongs to (`None`: the relay's own call).
struct Fault(Option<usize>, io::Error);

impl From<io::Error> for Fault {
    fn from(error: io::Error) -> Fault {
        Fault(None, error)
    }
}

thread_local! {
    /// The counters of the service whose connection this worker serves,
    /// when that service has `kernel_relay` on: set by [`count_for`]
    /// before the pump, read at a promotion or a fall-back (which are
    /// counted when they happen, so that a long-lived promoted connection
    /// shows at once). It keeps the last such service's table alive until
    /// the worker serves another: a few hundred bytes.
    static COUNTERS: RefCell<Option<Arc<Stats>>> = const { RefCell::new(None) };
}

/// Tells this worker thread which service's counters its promotions go
/// to (the service of the connection it is about to pump).
#[cold]
#[inline(never)]
pub fn count_for(stats: &Arc<Stats>) {
    COUNTERS.with(|c| *c.borrow_mut() = Some(Arc::clone(stats)));
}

/// Raises `kernel_relayed` or `kernel_relay_fallbacks` of the service.
fn count(counter: fn(&Stats) -> &AtomicU64) {
    COUNTERS.with(|c| {
        if let Some(stats) = &*c.borrow() {
            Stats::incr(counter(stats));
        }
    });
}

/// Moves the bytes between `client` and `backend` in the kernel until both
/// are done, a timeout, an error, or the backlog bound. `moved` gets the
/// bytes delivered since the call began: to the backend, to the client.
/// Both sockets must have nothing of this connection in user space (the
/// pump's buffers empty) and both must still be open both ways.
/// `exchanges`: those made on the copy pump, for the trace. The service's
/// counters and the trace are told here, the one place that knows.
pub fn relay(
    client: &TcpStream,
    backend: &TcpStream,
    timeouts: [Duration; 2],
    exchanges: u32,
    moved: &mut [u64; 2],
) -> Relayed {
    let Some(kernel) = kernel() else {
        count(|s| &s.kernel_relay_fallbacks);
        return Relayed::NotTaken;
    };
    let mut link = Link::new(kernel, client, backend);
    if let Err(e) = link.insert() {
        log::debug!("kernel relay: not taken ({e}); the copy pump goes on");
        count(|s| &s.kernel_relay_fallbacks);
        // Undo what was inserted; nothing moved yet that the pump must know.
        return match link.unwind(timeouts[0], moved) {
            Ok(false) => Relayed::NotTaken,
            Ok(true) => Relayed::Back {
                kept: true,
                bases: link.bases(),
            },
            Err(fault) => fault.into_relayed(),
        };
    }
    count(|s| &s.kernel_relayed);
    crate::trace::promoted(exchanges);
    match link.run(timeouts, moved) {
        Ok(Ran::Finished { client_first }) => Relayed::Finished { client_first },
        Ok(Ran::TimedOut { half_closed }) => Relayed::TimedOut { half_closed },
        Ok(ran @ (Ran::Backlog | Ran::Asked)) => {
            let back = if ran == Ran::Backlog {
                log::debug!("kernel relay: backlog bound passed; the copy pump goes on");
                count(|s| &s.kernel_relay_fallbacks);
                link.settle(timeouts[0], moved).map(|()| true)
            } else {
                link.unwind(timeouts[0], moved)
            };
            match back {
                Ok(kept) => Relayed::Back {
                    kept,
                    bases: link.bases(),
                },
                Err(fault) => {
                    // A reset met on the way out (a backend that answered
                    // early and reset under a full upload): what the other
                    // direction, still relayed, took from it before is
                    // waited for and counted, as after a reset met here.
                    if let Some(i) = fault.0 {
                        link.deliver_from(i, moved);
                    }
                    fault.into_relayed()
                }
            }
        }
        Err(fault) => {
            if let Some(i) = fault.0 {
                link.deliver_from(i, moved);
            }
            fault.into_relayed()
        }
    }
}

/// A connection back from the kernel path ([`Relayed::Back`]): per
/// direction the relay did not end (client to backend, backend to
/// client), its `Way`: its source's count of bytes received and its
/// destination's count of bytes handed when the relay began (exact:
/// `counts::at_rest`). The copy pump keeps them to check, each round,
/// that no direction hands on more than its source received
/// ([`Bases::doubled`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Bases([Option<counts::Way>; 2]);

impl Bases {
    /// Both sockets' counts as they stand, at rest, as the bases (for a
    /// connection whose pump holds no byte).
    #[cfg(test)]
    pub fn now(sockets: [&TcpStream; 2]) -> Bases {
        let (counts, unread) = counts::at_rest(sockets).unwrap().expect("at rest");
        Bases([0, 1].map(|i| Some(counts::Way::at_rest(i, &counts, &unread))))
    }

    /// Whether direction `i` (0: client to backend) handed its
    /// destination more bytes than its source received since the bases:
    /// the error that tells it, with its one warning. Under heavy load the
    /// kernel's redirect has been seen to send a segment twice, late
    /// enough to land after the relay was left, and a segment taken and
    /// kept twice would be read twice: either way the stream is broken,
    /// and the pump ends it with a reset rather than pass a whole-looking
    /// end on. The test is the relay's own (`Way::excess_now`). A socket
    /// that cannot say, or was reset, is left to the pump, which meets
    /// its error. `fin`: the direction's end was just passed on (its FIN
    /// counts one in the destination's count): the last check, for a
    /// segment sent twice between the one before and the FIN.
    #[cold]
    #[inline(never)]
    pub fn doubled(&self, i: usize, sockets: [&TcpStream; 2], fin: bool) -> Option<io::Error> {
        let (sent, received) = self.0[i]?.excess_now(i, sockets, fin).ok()??;
        let (from, to) = [("client", "backend"), ("backend", "client")][i];
        log::warn!(
            "kernel relay: after the relay, the {to} was handed {} bytes more than the {from} \
             sent ({sent} handed, {received} received); the connection ends with a reset",
            sent - received
        );
        let Fault(_, error) = Fault::broken(i, "bytes doubled after the kernel relay");
        Some(error)
    }
}

/// How [`Link::run`] ended without an error.
#[derive(Debug, PartialEq, Eq)]
enum Ran {
    Finished {
        client_first: bool,
    },
    TimedOut {
        half_closed: bool,
    },
    /// The program met a limit (the backlog bound) and latched: the copy
    /// pump goes on.
    Backlog,
    /// A hand-over to a new process (`upgrade_socket`) asks for the
    /// connection: the copy pump takes it back, and offers it.
    Asked,
}
