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
//! - Behind a slow reader the kernel's queue toward it has no bound. The
//!   thread samples that queue and, above [`BACKLOG_BOUND`], leaves the
//!   kernel path with nothing lost, one direction at a time, the fuller
//!   first (`Link::unwind`), and hands the
//!   connection back to the copy pump, whose buffer bounds memory again.
//!   The sampling interval shrinks with the observed rate (1 ms at the
//!   fastest), so the queue overshoots the bound by about a millisecond's
//!   traffic; a burst after a quiet spell, by up to [`MAX_CHECK`]'s.
//! - Idle and fin timeouts: the thread sees no bytes, so it reads the same
//!   counters: when none moved for the timeout, the connection ends as the
//!   copy pump's would.
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
use std::io::{self, ErrorKind};
use std::net::{Shutdown as Direction, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::stats::Stats;

use bpf::{kernel, map_delete, map_lookup, map_update, Kernel};
use counts::{cookie, poll, push_queued, unread, Counts, Way, TCP_CLOSE, TCP_ESTABLISHED};

mod bpf;
mod counts;
#[cfg(test)]
mod tests;

/// Most bytes the kernel may hold for one socket (received on the other,
/// not yet in this one's send path) before the connection leaves the kernel
/// path for the copy pump. The sockets' own buffers come on top, as with
/// any pump.
pub const BACKLOG_BOUND: u64 = 4 << 20;

/// Longest pause between two looks at the counters while bytes move or
/// not: it bounds how late a timeout or a growing backlog is seen.
pub const MAX_CHECK: Duration = Duration::from_millis(100);

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

/// Loads the program if it is not loaded yet and logs, once, whether the
/// kernel path is available; whether it is. Called at start-up and on
/// reload when a service asks for the kernel relay, so that the operator
/// learns it then rather than at the first promotion.
pub fn prepare() -> bool {
    kernel().is_some()
}

/// How a connection handed to [`relay`] came back.
#[derive(Debug)]
pub enum Relayed {
    /// The kernel path could not take it (the program did not load, a
    /// socket was not `ESTABLISHED`, an insertion failed); it is as it was,
    /// and the copy pump goes on.
    NotTaken,
    /// It left the kernel path (the backlog bound) with nothing lost: the
    /// copy pump goes on from the byte counts given.
    Back,
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
    },
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
            Ok(()) => Relayed::NotTaken,
            Err(Fault(socket, error)) => Relayed::Failed { socket, error },
        };
    }
    count(|s| &s.kernel_relayed);
    crate::trace::promoted(exchanges);
    match link.run(timeouts, moved) {
        Ok(Ran::Finished { client_first }) => Relayed::Finished { client_first },
        Ok(Ran::TimedOut { half_closed }) => Relayed::TimedOut { half_closed },
        Ok(Ran::Backlog) => {
            log::debug!("kernel relay: backlog bound passed; the copy pump goes on");
            count(|s| &s.kernel_relay_fallbacks);
            match link.unwind(timeouts[0], moved) {
                Ok(()) => Relayed::Back,
                Err(Fault(socket, error)) => Relayed::Failed { socket, error },
            }
        }
        Err(Fault(socket, error)) => {
            if let Some(i) = socket {
                link.deliver_from(i, moved);
            }
            Relayed::Failed { socket, error }
        }
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
    /// A backlog passed [`BACKLOG_BOUND`]: the copy pump goes on.
    Backlog,
}

/// One connection's place in the maps.
struct Link<'a> {
    kernel: &'static Kernel,
    /// Client then backend.
    sockets: [&'a TcpStream; 2],
    cookies: [u64; 2],
    /// Which entries were made: `moved`, `peers` (keyed by the socket whose
    /// bytes go to the other), `verdicts`.
    in_moved: [bool; 2],
    in_peers: [bool; 2],
    in_verdicts: [bool; 2],
    /// Client → backend, backend → client.
    ways: [Way; 2],
    /// The way whose end of stream was seen first.
    first_eof: Option<usize>,
}

/// What [`Link::run`] remembers between two looks.
struct Watch {
    last: [Counts; 2],
    last_at: Instant,
    last_move: Instant,
    check: Duration,
    delivery_check: Duration,
}

impl<'a> Link<'a> {
    fn new(kernel: &'static Kernel, client: &'a TcpStream, backend: &'a TcpStream) -> Link<'a> {
        Link {
            kernel,
            sockets: [client, backend],
            cookies: [0; 2],
            in_moved: [false; 2],
            in_peers: [false; 2],
            in_verdicts: [false; 2],
            ways: [Way::default(), Way::default()],
            first_eof: None,
        }
    }

    /// Puts both sockets into the maps: `moved` and `peers` first, then
    /// `verdicts` (backend first, client last), then pushes bytes that were
    /// already queued through the program.
    fn insert(&mut self) -> io::Result<()> {
        let (counts, unread) = self.start_counts()?;
        for c in &counts {
            if c.state != TCP_ESTABLISHED {
                return Err(io::Error::other("a socket is no longer ESTABLISHED"));
            }
        }
        for i in 0..2 {
            self.cookies[i] = cookie(self.sockets[i])?;
            // Way i goes from socket i to socket 1 - i. Bytes received but
            // not yet read are still to be relayed: the program takes them.
            self.ways[i].in_base = counts[i].data_in() - unread[i].min(counts[i].data_in());
            self.ways[i].out_base = counts[1 - i].handed();
        }
        for i in 0..2 {
            map_update(&self.kernel.moved, self.cookies[i], 0)?;
            self.in_moved[i] = true;
        }
        for i in 0..2 {
            let peer = self.sockets[1 - i].as_raw_fd() as u64;
            map_update(&self.kernel.peers, self.cookies[i], peer)?;
            self.in_peers[i] = true;
        }
        for i in [1, 0] {
            let fd = self.sockets[i].as_raw_fd() as u64;
            map_update(&self.kernel.verdicts, self.cookies[i], fd)?;
            self.in_verdicts[i] = true;
        }
        for socket in self.sockets {
            push_queued(socket);
        }
        Ok(())
    }

    /// Both sockets' counters with the bytes each holds unread, taken
    /// together: the unread counts are read between two samples that
    /// agree on the bytes received, so no byte arrived in between.
    fn start_counts(&self) -> io::Result<([Counts; 2], [u64; 2])> {
        let [a, b] = self.sockets;
        for _ in 0..START_TRIES {
            let first = [Counts::of(a)?, Counts::of(b)?];
            let unread = [unread(a)?, unread(b)?];
            let then = [Counts::of(a)?, Counts::of(b)?];
            if (0..2).all(|i| first[i].received == then[i].received) {
                return Ok((then, unread));
            }
        }
        Err(io::Error::other(
            "bytes kept arriving while the counters were read",
        ))
    }

    /// After socket `i` failed (a reset), waits a little for what the
    /// program took from it to reach the other side's send path: a
    /// backend's early answer before its reset still reaches the client,
    /// as on the copy pump. Bounded by [`FAULT_GRACE`]; errors end it.
    fn deliver_from(&mut self, i: usize, moved: &mut [u64; 2]) {
        let deadline = Instant::now() + FAULT_GRACE;
        while Instant::now() < deadline {
            let (Ok(src), Ok(dst)) = (Counts::of(self.sockets[i]), Counts::of(self.sockets[1 - i]))
            else {
                return;
            };
            let way = &self.ways[i];
            moved[i] = way.sent(&dst);
            if way.backlog(&src, &dst) == 0 || dst.state == TCP_CLOSE {
                return;
            }
            let mut none = [libc::pollfd {
                fd: -1,
                events: 0,
                revents: 0,
            }; 2];
            let _ = poll(&mut none, MIN_CHECK);
        }
    }

    /// Waits while the kernel moves the bytes, passes each end of stream
    /// on once its direction has delivered everything, and watches the
    /// backlog and the timeouts (`[idle, fin]`).
    fn run(&mut self, timeouts: [Duration; 2], moved: &mut [u64; 2]) -> Result<Ran, Fault> {
        let start = Instant::now();
        let mut watch = Watch {
            last: [Counts::default(); 2],
            last_at: start,
            last_move: start,
            check: MIN_CHECK,
            delivery_check: Duration::ZERO,
        };
        loop {
            let counts = self.sample()?;
            let now = Instant::now();
            let worst_backlog = self.pass_on(&counts, moved)?;
            if self.ways[0].done && self.ways[1].done {
                return Ok(Ran::Finished {
                    client_first: self.first_eof != Some(1),
                });
            }
            if worst_backlog > BACKLOG_BOUND {
                return Ok(Ran::Backlog);
            }
            let half_closed = self.first_eof.is_some();
            let limit = timeouts[usize::from(half_closed)];
            let streamed = watch.note(&counts, now);
            let quiet = now - watch.last_move;
            if quiet >= limit {
                return Ok(Ran::TimedOut { half_closed });
            }
            let delivering = self.ways.iter().any(|w| w.eof && !w.done);
            let wait = watch.next(delivering, streamed, worst_backlog);
            self.wait(wait.min(limit - quiet))?;
        }
    }

    /// Both sockets' counters; a socket closed on an error is that error,
    /// and an end of stream that arrived is noted.
    fn sample(&mut self) -> Result<[Counts; 2], Fault> {
        let counts = [Counts::of(self.sockets[0])?, Counts::of(self.sockets[1])?];
        for (i, c) in counts.iter().enumerate() {
            if c.state == TCP_CLOSE {
                if let Some(e) = self.sockets[i].take_error()? {
                    return Err(Fault(Some(i), e));
                }
            }
            if c.fin_in() {
                self.saw_eof(i);
            }
        }
        Ok(counts)
    }

    fn saw_eof(&mut self, i: usize) {
        self.ways[i].eof = true;
        self.first_eof.get_or_insert(i);
    }

    /// Updates `moved`, passes each end of stream on whose bytes are all
    /// in the other side's send path; the larger of the two backlogs.
    fn pass_on(&mut self, counts: &[Counts; 2], moved: &mut [u64; 2]) -> Result<u64, Fault> {
        let mut worst_backlog = 0;
        for i in 0..2 {
            let (src, dst) = (&counts[i], &counts[1 - i]);
            let way = &mut self.ways[i];
            if !way.done {
                moved[i] = way.sent(dst);
            }
            let backlog = way.backlog(src, dst);
            worst_backlog = worst_backlog.max(backlog);
            if way.eof && !way.done && backlog == 0 {
                // Every byte of this direction is in the destination's
                // send path: the FIN can follow it.
                way.done = true;
                if let Err(e) = self.sockets[1 - i].shutdown(Direction::Write) {
                    if e.kind() != ErrorKind::NotConnected {
                        return Err(Fault(Some(1 - i), e));
                    }
                }
            }
        }
        Ok(worst_backlog)
    }

    /// Waits at most `wait` for an end of stream or an error on either
    /// socket; what poll saw counts too, so that a hang-up or an error the
    /// next sample would not show cannot make the loop spin.
    fn wait(&mut self, wait: Duration) -> Result<(), Fault> {
        let mut fds = [self.watch(0), self.watch(1)];
        if wait.is_zero() {
            // SAFETY: no arguments; on Linux it always succeeds.
            unsafe { libc::sched_yield() };
        } else {
            poll(&mut fds, wait)?;
        }
        for (i, fd) in fds.iter().enumerate() {
            if fd.revents & libc::POLLERR != 0 {
                if let Some(e) = self.sockets[i].take_error()? {
                    return Err(Fault(Some(i), e));
                }
            }
            if fd.revents & (libc::POLLRDHUP | libc::POLLHUP) != 0 {
                self.saw_eof(i);
            }
        }
        Ok(())
    }

    /// A `pollfd` that wakes on the end of stream (or an error) of socket
    /// `i`, or nothing (fd -1) once its end was seen: a half-closed socket
    /// would report `POLLRDHUP` on every call.
    fn watch(&self, i: usize) -> libc::pollfd {
        libc::pollfd {
            fd: if self.ways[i].eof {
                -1
            } else {
                self.sockets[i].as_raw_fd()
            },
            events: libc::POLLRDHUP,
            revents: 0,
        }
    }

    /// Takes the connection out of the kernel path with nothing lost, one
    /// direction at a time, the one with more bytes in flight first: stops
    /// the program on that direction's source, waits for runs still in
    /// flight, waits until what the program took from it is in the other
    /// side's send path, then does the same for the other direction, and
    /// drops the sockets' kernel state. The copy pump can go on from
    /// there, and `moved` then says what was delivered.
    ///
    /// Why one at a time: a peer that echoes (or any peer whose writes
    /// hold up its reads) stops reading while its own bytes toward us are
    /// not taken. With both directions stopped at once, the bytes still on
    /// their way to it could never be delivered; with the other direction
    /// still relayed by the kernel, its writes flow and it reads on.
    fn unwind(&mut self, idle_timeout: Duration, moved: &mut [u64; 2]) -> Result<(), Fault> {
        let counts = self.sample()?;
        let backlog = |i: usize| self.ways[i].backlog(&counts[i], &counts[1 - i]);
        let order = if backlog(1) > backlog(0) {
            [1, 0]
        } else {
            [0, 1]
        };
        for i in order {
            if self.in_verdicts[i] {
                map_delete(&self.kernel.verdicts, self.cookies[i])?;
                self.in_verdicts[i] = false;
            }
            // The program runs under RCU: after a grace period no run that
            // started before the delete can still be adding to `moved` or
            // queueing bytes.
            membarrier()?;
            let taken = if self.in_moved[i] {
                map_lookup(&self.kernel.moved, self.cookies[i])?
            } else {
                0
            };
            self.delivered(i, taken, idle_timeout)?;
            if !self.ways[i].done {
                moved[i] = taken;
            }
        }
        self.forget();
        Ok(())
    }

    /// Waits until the `taken` bytes of way `i` are in the other side's
    /// send path (or the way was done before), at most `idle_timeout`
    /// without progress.
    fn delivered(&mut self, i: usize, taken: u64, idle_timeout: Duration) -> Result<(), Fault> {
        let mut last = None;
        let mut last_move = Instant::now();
        let mut wait = Duration::from_micros(250);
        loop {
            let counts = self.sample()?;
            let way = &self.ways[i];
            if way.done || way.sent(&counts[1 - i]) >= taken {
                return Ok(());
            }
            let now_key = counts.map(|c| (c.acked, c.outq));
            if last != Some(now_key) {
                last = Some(now_key);
                last_move = Instant::now();
            } else if last_move.elapsed() >= idle_timeout {
                return Err(io::Error::new(ErrorKind::TimedOut, "idle timeout").into());
            }
            let mut none = [libc::pollfd {
                fd: -1,
                events: 0,
                revents: 0,
            }; 2];
            poll(&mut none, wait)?;
            wait = (wait * 2).min(MAX_DELIVERY_CHECK);
        }
    }

    /// Deletes what is left of the connection in the maps. Once both
    /// sockets are out of `peers` and `verdicts`, the kernel drops their
    /// sockmap state and they are plain TCP sockets again.
    fn forget(&mut self) {
        for i in 0..2 {
            if self.in_verdicts[i] {
                let _ = map_delete(&self.kernel.verdicts, self.cookies[i]);
                self.in_verdicts[i] = false;
            }
        }
        for i in 0..2 {
            if self.in_peers[i] {
                let _ = map_delete(&self.kernel.peers, self.cookies[i]);
                self.in_peers[i] = false;
            }
        }
        for i in 0..2 {
            if self.in_moved[i] {
                let _ = map_delete(&self.kernel.moved, self.cookies[i]);
                self.in_moved[i] = false;
            }
        }
    }
}

impl Watch {
    /// Notes the counters seen at `now`; the bytes seen moving since the
    /// last look (and whether anything moved, for the timeouts).
    fn note(&mut self, counts: &[Counts; 2], now: Instant) -> (u64, Duration) {
        let moved: u64 = (0..2)
            .map(|i| {
                let (a, b) = (&counts[i], &self.last[i]);
                (a.received + a.acked).saturating_sub(b.received + b.acked)
            })
            .sum();
        let changed = counts
            .iter()
            .zip(&self.last)
            .any(|(a, b)| (a.received, a.acked) != (b.received, b.acked));
        if changed {
            self.last_move = now;
        }
        let elapsed = now - self.last_at;
        self.last = *counts;
        self.last_at = now;
        (moved, elapsed)
    }

    /// How long until the next look.
    fn next(&mut self, delivering: bool, streamed: (u64, Duration), backlog: u64) -> Duration {
        let (moved, elapsed) = streamed;
        if delivering {
            // The last bytes are on their way through the kernel's work
            // queue: look again soon, then less and less often.
            let wait = self.delivery_check;
            self.delivery_check = (self.delivery_check * 2)
                .max(Duration::from_micros(250))
                .min(MAX_DELIVERY_CHECK);
            wait
        } else if moved > 0 {
            // Streaming: look again before the backlog could reach the
            // bound at the rate just seen.
            let rate = moved as f64 / elapsed.as_secs_f64().max(1e-6);
            let room = BACKLOG_BOUND.saturating_sub(backlog) as f64;
            self.check = Duration::from_secs_f64(room / rate / 4.0).clamp(MIN_CHECK, MAX_CHECK);
            self.check
        } else {
            self.check = (self.check * 2).min(MAX_CHECK);
            self.check
        }
    }
}

impl Drop for Link<'_> {
    /// `moved` entries go with the connection; `peers` and `verdicts`
    /// entries go by themselves when the sockets close, and deleting them
    /// here would throw away bytes the kernel still holds for a socket
    /// after an error (the copy pump loses its buffer the same way).
    fn drop(&mut self) {
        for i in 0..2 {
            if self.in_moved[i] {
                let _ = map_delete(&self.kernel.moved, self.cookies[i]);
            }
        }
    }
}

/// Returns after an RCU grace period (`membarrier(MEMBARRIER_CMD_GLOBAL)`).
fn membarrier() -> io::Result<()> {
    /// `MEMBARRIER_CMD_GLOBAL`.
    const GLOBAL: libc::c_int = 1;
    // SAFETY: MEMBARRIER_CMD_GLOBAL takes no pointer.
    if unsafe { libc::syscall(libc::SYS_membarrier, GLOBAL, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
