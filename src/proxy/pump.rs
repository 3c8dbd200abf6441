//! The duplex pump: moves the bytes of one connection both ways until both
//! sides are done, without ever blocking on either socket.
//!
//! # The pump
//!
//! A proxied connection is two independent byte streams: client → backend
//! and backend → client. Many protocols (HTTP keep-alive, Redis, PostgreSQL)
//! send in both directions at once or take turns many times, so the worker
//! must serve both without knowing which will speak next. It never blocks on
//! either socket (see `MSG_DONTWAIT` below) and waits on both with one
//! `poll(2)`:
//!
//! - Each direction has one buffer (4096 bytes by default). It is filled by
//!   one `read` and emptied by as many `write`s as the destination accepts;
//!   nothing more is read from that source until the buffer is empty. This
//!   bounds memory and passes the destination's back-pressure on to the
//!   source through TCP flow control.
//! - The two buffers belong to the worker thread, not the connection: they
//!   are mapped once per thread and reused by every connection it serves
//!   (nothing is allocated or zeroed per connection). When a connection has
//!   had both buffers empty for `RELEASE_AFTER` (half a second), their pages are handed
//!   back to the kernel with `madvise(MADV_DONTNEED)`, so an idle connection
//!   costs its thread's stack and its sockets but no buffer memory.
//! - Why not a blocking `write_all`: if the client is blocked writing a large
//!   request and not reading, while the backend is blocked writing a large
//!   reply to us, a worker stuck in `write_all` toward the client would never
//!   read the client's side again: a deadlock. With non-blocking writes a
//!   partial write just means "wait for POLLOUT on that socket" while the
//!   other direction goes on.
//! - A read is tried before any `poll`, and again after a successful one
//!   that filled the buffer, until it says `WouldBlock` or comes back short:
//!   when data is already there (a request that arrived with the
//!   connection) it costs no `poll` call, and a short read means the socket
//!   is drained, so no extra read is spent only to hear `WouldBlock`.
//! - A write of a chunk that filled the whole buffer passes `MSG_MORE`: the
//!   source is streaming, so the kernel may gather several 4096-byte chunks
//!   into one segment. Before the pump waits in `poll`, any such held bytes
//!   are pushed out (`TCP_NODELAY` set again), so nothing is delayed.
//! - The sockets stay in blocking mode; every `recv`/`send` passes
//!   `MSG_DONTWAIT` instead, which saves the `ioctl` per socket that
//!   switching modes costs.
//! - Each direction gets a turn of at most [`TURN_BYTES`] (256 KiB) per
//!   round, then the other one goes: when both sides stream at once,
//!   neither waits behind more than that. When a turn is cut short and the
//!   other direction waits on `poll`, a `poll` that does not wait tells it
//!   what became ready.
//! - Each successful write is counted as it happens, so the [`Transfer`]
//!   is exact however the connection ends.
//! - End of stream on one side is passed on as `shutdown(Write)` to the
//!   other once that direction's buffer has drained (a half-close), so a
//!   client that sends, shuts its write side and then reads still gets its
//!   whole reply. From then on the silence allowed is the fin timeout (by
//!   default the idle timeout).
//! - A failed write stops only its direction (its buffer is dropped, its
//!   source is read no more); the other direction is still delivered until
//!   its source ends. A backend that answers `413` and closes in the middle
//!   of an upload gets its answer to the client. A failed read (a reset)
//!   means that socket is gone both ways, which ends both directions.
//! - The connection ends when both directions are over, or when nothing
//!   moves for the idle (or fin) timeout. How, and which side ended it, is
//!   the [`End`] returned with the byte counts.
//! - With `--yield-before-poll` (off by default), a pump that has just moved
//!   bytes calls `sched_yield()` once, then `poll` with a zero timeout,
//!   before it sleeps. On small request/response traffic the other side is
//!   usually about to answer: a backend replying to the request just
//!   forwarded, a keep-alive client sending its next request. Yielding lets
//!   it run now, and when the answer is already there the worker skips the
//!   sleep in `poll` and the wake-up that would end it, which on this
//!   workload are most of the kernel's cost (docs/benchmarks.md has the
//!   measured gain on keep-alive HTTP and redis). It stays a flag because when
//!   the answer is slow the yield and the extra `poll` are spent for
//!   nothing, and on a busy machine the yield hands the CPU to unrelated
//!   work.
//!
//! With `--splice`, [`splice_pump`] runs the same loop but moves the bytes
//! with `splice(2)` through a pipe per direction, never through user memory
//! (there the sockets are switched to non-blocking mode, since `splice(2)`
//! has no per-call flag for the socket side).
//!
//! # Corresponds to the C article
//!
//! The copy loop of `proxy_function()`. The C reads one chunk
//! of the request (at most 4090 bytes), sends it with `strlen(buffer)` (so
//! binary data is cut at the first zero byte), then copies the reply until
//! the backend closes. It cannot serve a request larger than a chunk, a
//! second request on the same connection, or a protocol where the client
//! speaks again after the reply starts; and any read error calls `exit()`,
//! ending every other connection too. Here errors end only this connection,
//! and both directions stream for as long as either side has data. The final
//! `shutdown(SHUT_RDWR)` then `close()` on both sockets is the C's, kept on
//! every path.

use std::fmt;
use std::io::{self, ErrorKind};
use std::net::{Shutdown as Direction, TcpStream};
use std::os::unix::io::AsRawFd;
use std::time::Duration;

use super::conduit::{Buffers, Conduits, Pipe, Through, BUFFERS, PIPES, RELEASE_AFTER};

/// Bytes one direction may move in one turn before the other direction
/// gets its turn: 64 chunks of 4096 bytes, or four full pipes with
/// `--splice`. Small enough that the other direction never waits behind
/// more than a fraction of a millisecond of streaming; big enough that the
/// `poll` without waiting that may follow a turn (see [`pump`]) costs a
/// streaming direction at most one system call per 256 KiB, and nothing
/// per chunk.
pub const TURN_BYTES: u64 = 256 * 1024;

/// How many bytes one proxied connection moved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Transfer {
    /// Bytes from the client the backend's socket accepted.
    pub to_backend: u64,
    /// Bytes from the backend the client's socket accepted.
    pub to_client: u64,
}

/// How a connection ended, and which side ended it.
///
/// When something went wrong (a reset, a failed write, a timeout, an
/// error), the first such event is the end, even if bytes still moved the
/// other way after it. Otherwise both sides closed, and the end names the
/// one whose end of stream came first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Both sides closed; the client closed its side first.
    ClientClosed,
    /// Both sides closed; the backend closed its side first.
    BackendClosed,
    /// The client reset the connection (`ECONNRESET`).
    ClientReset,
    /// The backend reset the connection (`ECONNRESET`).
    BackendReset,
    /// No byte moved for the idle timeout.
    IdleTimeout,
    /// One side had closed, and the other stayed silent for the fin
    /// timeout.
    FinTimeout,
    /// A write toward the client failed (other than a reset).
    WriteToClientFailed,
    /// A write toward the backend failed (other than a reset).
    WriteToBackendFailed,
    /// Any other error: a read error other than a reset, or the pump's own
    /// resources (its buffers, pipes or `poll`).
    Error,
}

impl End {
    /// Both sides closed: nothing went wrong.
    pub fn is_clean(self) -> bool {
        matches!(self, End::ClientClosed | End::BackendClosed)
    }

    /// A reset by either peer.
    pub fn is_reset(self) -> bool {
        matches!(self, End::ClientReset | End::BackendReset)
    }
}

impl fmt::Display for End {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            End::ClientClosed => "the client closed first",
            End::BackendClosed => "the backend closed first",
            End::ClientReset => "the client reset the connection",
            End::BackendReset => "the backend reset the connection",
            End::IdleTimeout => "idle timeout",
            End::FinTimeout => "fin timeout (one side closed, the other stayed silent)",
            End::WriteToClientFailed => "a write toward the client failed",
            End::WriteToBackendFailed => "a write toward the backend failed",
            End::Error => "error",
        })
    }
}

/// What [`pump`] and [`splice_pump`] return.
#[derive(Debug)]
pub struct Outcome {
    /// The bytes moved, each successful write counted as it happened.
    pub transfer: Transfer,
    /// How it ended.
    pub end: End,
    /// The I/O error behind `end`, when there is one.
    pub error: Option<io::Error>,
}

impl Outcome {
    fn failed(error: io::Error) -> Outcome {
        Outcome {
            transfer: Transfer::default(),
            end: End::Error,
            error: Some(error),
        }
    }
}

/// The pump's timing settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PumpOptions {
    /// Longest wait with no byte moving while both sides are open.
    pub idle_timeout: Duration,
    /// Longest wait with no byte moving once one side has closed (or one
    /// direction has stopped on a failed write).
    pub fin_timeout: Duration,
    /// Yield once, then look without waiting, before each wait that
    /// follows moved bytes (`--yield-before-poll`).
    pub yield_before_poll: bool,
}

/// The two sockets of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Client,
    Backend,
}

impl Side {
    /// The end when this side's socket reports `error`: a reset by this
    /// side, or, for a read, another error.
    fn read_failed(self, error: &io::Error) -> End {
        match (self, is_reset(error)) {
            (Side::Client, true) => End::ClientReset,
            (Side::Backend, true) => End::BackendReset,
            (_, false) => End::Error,
        }
    }

    /// The end when a write toward this side fails with `error`.
    fn write_failed(self, error: &io::Error) -> End {
        match (self, is_reset(error)) {
            (Side::Client, true) => End::ClientReset,
            (Side::Backend, true) => End::BackendReset,
            (Side::Client, false) => End::WriteToClientFailed,
            (Side::Backend, false) => End::WriteToBackendFailed,
        }
    }
}

fn is_reset(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted
    )
}

/// Why a [`Half::step`] stopped short.
enum Fault {
    /// Reading the source failed: that socket is gone, both ways.
    Read(io::Error),
    /// Writing (or half-closing) the destination failed.
    Write(io::Error),
}

/// One direction of the pump: what we know of its buffer and both ends.
/// The buffer itself belongs to the thread's [`Buffers`] and is passed to
/// [`Half::step`].
struct Half {
    /// Bytes `buf[start..end]` are read but not yet written.
    start: usize,
    end: usize,
    /// The source said end of stream.
    eof: bool,
    /// We passed the end of stream on with `shutdown(Write)`.
    done: bool,
    /// This direction is over without its end of stream: a write toward
    /// its destination failed, or one of its sockets is gone. What its
    /// buffer holds is dropped and its source is read no more.
    stopped: bool,
    /// The last read did not say `WouldBlock` (or poll said readable since).
    readable: bool,
    /// The last write did not say `WouldBlock` (or poll said writable since).
    writable: bool,
    /// The last write said "more is coming" (`MSG_MORE`): the kernel may
    /// hold its bytes to fill a bigger segment until [`uncork`] is called.
    corked: bool,
    /// The last step used up its turn ([`TURN_BYTES`]) while it could
    /// still have gone on: it goes on next round, after the other half.
    busy: bool,
}

impl Half {
    fn new() -> Half {
        Half {
            start: 0,
            end: 0,
            eof: false,
            done: false,
            stopped: false,
            readable: true,
            writable: true,
            corked: false,
            busy: false,
        }
    }

    fn pending(&self) -> bool {
        !self.stopped && self.start < self.end
    }

    fn wants_read(&self) -> bool {
        !self.eof && !self.stopped && self.start == self.end
    }

    /// Nothing more will move this way.
    fn finished(&self) -> bool {
        self.done || self.stopped
    }

    /// It can move bytes without waiting for `poll` first.
    fn can_go_on(&self) -> bool {
        (self.wants_read() && self.readable) || (self.pending() && self.writable)
    }

    /// Ends this direction where it is (see `stopped`).
    fn stop(&mut self) {
        self.stopped = true;
        self.corked = false;
        self.busy = false;
    }

    /// Moves what it can from `src` to `dst` through `via` without
    /// blocking, for at most one turn. Adds each write's bytes to `moved`
    /// as soon as it succeeds, so a later failure loses no count.
    fn step(
        &mut self,
        via: &mut Through,
        src: &TcpStream,
        dst: &TcpStream,
        moved: &mut u64,
    ) -> Result<(), Fault> {
        self.busy = false;
        let turn_ends = *moved + TURN_BYTES;
        loop {
            if self.wants_read() && self.readable {
                match via.fill(src) {
                    Ok(0) => self.eof = true,
                    Ok(n) => {
                        self.start = 0;
                        self.end = n;
                        // A stream socket fills the buffer when it can: a
                        // short read means its queue is empty now, so the
                        // read that would only say `WouldBlock` is skipped
                        // and `poll` tells when more comes. (Through a pipe
                        // a short read may also mean the pipe is full: the
                        // next `poll` then returns at once, no harm done.)
                        if n < via.capacity() {
                            self.readable = false;
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => self.readable = false,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) => return Err(Fault::Read(e)),
                }
            }
            // A read that filled the whole buffer says the source is
            // streaming: tell the kernel more is coming, so it can send
            // full-sized segments instead of one per 4096-byte chunk (the
            // receiver then wakes once per segment, not per chunk).
            let more = self.end == via.capacity();
            while self.pending() && self.writable {
                match via.drain(dst, self.start, self.end, more) {
                    // Not seen from TCP or a pipe, but a write that takes
                    // nothing would otherwise spin here forever.
                    Ok(0) => {
                        return Err(Fault::Write(io::Error::new(
                            ErrorKind::WriteZero,
                            "the destination took no byte",
                        )))
                    }
                    Ok(n) => {
                        self.corked = more;
                        self.start += n;
                        *moved += n as u64;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => self.writable = false,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Err(Fault::Write(e)),
                }
            }
            if self.eof && !self.pending() && !self.done {
                self.done = true;
                // Half-close: tell the destination nothing more will come.
                // ENOTCONN only means the peer is gone already.
                if let Err(e) = dst.shutdown(Direction::Write) {
                    if e.kind() != ErrorKind::NotConnected {
                        return Err(Fault::Write(e));
                    }
                }
            }
            // Go round again only while progress is possible without poll,
            // and only for one turn: then the other direction goes.
            if !(self.wants_read() && self.readable) {
                return Ok(());
            }
            if *moved >= turn_ends {
                self.busy = true;
                return Ok(());
            }
        }
    }
}

/// What one pump learned on its way: the first thing that went wrong, and
/// which side closed first.
#[derive(Default)]
struct Story {
    fault: Option<(End, Option<io::Error>)>,
    first_close: Option<End>,
}

impl Story {
    fn fault(&mut self, end: End, error: Option<io::Error>) {
        if self.fault.is_none() {
            self.fault = Some((end, error));
        }
    }

    fn closed(&mut self, end: End) {
        if self.first_close.is_none() {
            self.first_close = Some(end);
        }
    }

    fn end(self) -> (End, Option<io::Error>) {
        match (self.fault, self.first_close) {
            (Some(fault), _) => fault,
            (None, Some(close)) => (close, None),
            // Both halves finish only by their end of stream or by a fault.
            (None, None) => (End::Error, None),
        }
    }
}

/// Copies bytes both ways between `client` and `backend` until both
/// directions are over, or nothing moves for the idle (or fin) timeout.
/// `buffer_size` is the bytes per read in each direction.
///
/// A failed write stops only its own direction: what the other direction
/// still carries (a backend's early `413` while the client is still
/// uploading) is delivered until that source ends. A socket whose read
/// fails (a reset) is gone both ways, which ends both directions.
///
/// It never fails: every way a connection can end is an [`End`] in the
/// returned [`Outcome`], with the byte counts of what was moved up to then.
pub fn pump(
    client: &TcpStream,
    backend: &TcpStream,
    buffer_size: usize,
    options: &PumpOptions,
) -> Outcome {
    BUFFERS.with(|cell| {
        let mut cached = cell.borrow_mut();
        let buffers = match &mut *cached {
            Some(b) if b.size == buffer_size.max(1) => b,
            slot => match Buffers::new(buffer_size) {
                Ok(b) => slot.insert(b),
                Err(e) => return Outcome::failed(e),
            },
        };
        let mut transfer = Transfer::default();
        let (end, error, _) = pump_with(
            &mut Conduits::Buffers(buffers),
            client,
            backend,
            options,
            &mut transfer,
        );
        Outcome {
            transfer,
            end,
            error,
        }
    })
}

/// Like [`pump`], but moves the bytes with `splice(2)` through a pipe per
/// direction instead of reading them into user memory and writing them out
/// again (Linux only, the `--splice` flag). The kernel moves socket pages
/// into the pipe and on to the other socket: no copy through the process,
/// and up to a pipe's capacity (64 KiB) per call instead of 4096 bytes.
/// The pipes belong to the worker thread and serve each of its connections
/// in turn; when a connection ends with bytes left in one (a stopped
/// direction drops them), both are closed and made anew for the next.
///
/// The errors of `pipe2(2)` and of switching the sockets to non-blocking
/// mode end the connection as [`End::Error`].
pub fn splice_pump(client: &TcpStream, backend: &TcpStream, options: &PumpOptions) -> Outcome {
    // splice(2) honours SPLICE_F_NONBLOCK on the pipe side only: the
    // sockets themselves must be non-blocking.
    if let Err(e) = client
        .set_nonblocking(true)
        .and_then(|()| backend.set_nonblocking(true))
    {
        return Outcome::failed(e);
    }
    PIPES.with(|cell| {
        let mut cached = cell.borrow_mut();
        let pipes = match &mut *cached {
            Some(p) => p,
            slot => match Pipe::new().and_then(|up| Ok([up, Pipe::new()?])) {
                Ok(p) => slot.insert(p),
                Err(e) => return Outcome::failed(e),
            },
        };
        let mut transfer = Transfer::default();
        let (end, error, stale) = pump_with(
            &mut Conduits::Pipes(pipes),
            client,
            backend,
            options,
            &mut transfer,
        );
        if stale {
            *cached = None;
        }
        Outcome {
            transfer,
            end,
            error,
        }
    })
}

/// A duration as `poll(2)`'s milliseconds.
fn millis(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX)
}

/// The pump's loop. Returns the end, its error, and whether a buffer or
/// pipe was left holding bytes (dropped by a stopped direction).
fn pump_with(
    conduits: &mut Conduits,
    client: &TcpStream,
    backend: &TcpStream,
    options: &PumpOptions,
    transfer: &mut Transfer,
) -> (End, Option<io::Error>, bool) {
    let mut up = Half::new(); // client -> backend
    let mut down = Half::new(); // backend -> client
    let mut story = Story::default();
    let idle_ms = millis(options.idle_timeout);
    let fin_ms = millis(options.fin_timeout);
    let release_ms = millis(RELEASE_AFTER);
    loop {
        let (up_before, down_before) = (transfer.to_backend, transfer.to_client);
        let (mut up_via, mut down_via) = conduits.halves();
        if !up.finished() {
            match up.step(&mut up_via, client, backend, &mut transfer.to_backend) {
                Ok(()) => {}
                Err(Fault::Read(e)) => {
                    // The client's socket is gone: nothing more can go to
                    // it either.
                    story.fault(Side::Client.read_failed(&e), Some(e));
                    up.stop();
                    down.stop();
                }
                Err(Fault::Write(e)) => {
                    // Only this direction stops: the backend may still
                    // have something to say (an early reply).
                    story.fault(Side::Backend.write_failed(&e), Some(e));
                    up.stop();
                }
            }
        }
        if !down.finished() {
            match down.step(&mut down_via, backend, client, &mut transfer.to_client) {
                Ok(()) => {}
                Err(Fault::Read(e)) => {
                    story.fault(Side::Backend.read_failed(&e), Some(e));
                    down.stop();
                    up.stop();
                }
                Err(Fault::Write(e)) => {
                    story.fault(Side::Client.write_failed(&e), Some(e));
                    down.stop();
                }
            }
        }
        crate::trace::pumped(
            transfer.to_backend - up_before,
            transfer.to_client - down_before,
            up.done,
            down.done,
        );
        if up.eof {
            story.closed(End::ClientClosed);
        }
        if down.eof {
            story.closed(End::BackendClosed);
        }
        if up.finished() && down.finished() {
            let (end, error) = story.end();
            let stale = up.start < up.end || down.start < down.end;
            return (end, error, stale);
        }
        // About to wait, or to let the other half have its turn: whatever
        // a "more is coming" write left in the kernel must leave now,
        // unless more of the same stream follows at once.
        for (half, dst, side) in [
            (&mut up, backend, Side::Backend),
            (&mut down, client, Side::Client),
        ] {
            if half.corked && !half.busy {
                half.corked = false;
                if let Err(e) = uncork(dst) {
                    story.fault(side.write_failed(&e), Some(e));
                    half.stop();
                }
            }
        }
        let busy = up.busy || down.busy;
        // A half that used up its turn goes on next round. The other half
        // goes first if it can; if it waits for `poll`, it needs a look.
        let stalls =
            |turned: &Half, other: &Half| turned.busy && !other.finished() && !other.can_go_on();
        if busy && !stalls(&up, &down) && !stalls(&down, &up) {
            continue;
        }
        let mut fds = [
            watch(client, interest(&up, &down)),
            watch(backend, interest(&down, &up)),
        ];
        // Once one side has closed (or one direction has stopped), the
        // silence allowed is the fin timeout.
        let half_closed = up.eof || down.eof || up.stopped || down.stopped;
        let timeout_ms = if half_closed { fin_ms } else { idle_ms };
        let ready = if busy {
            // Look without waiting, so the waiting half learns what became
            // ready, then go round again.
            poll(&mut fds, 0)
        } else {
            wait(
                &mut fds,
                conduits,
                WaitFor {
                    timeout_ms,
                    release_ms,
                    idle: !up.pending() && !down.pending(),
                    yield_first: options.yield_before_poll
                        && transfer.to_backend + transfer.to_client > up_before + down_before,
                },
            )
            .map(|ready| {
                if ready == 0 {
                    let end = if half_closed {
                        End::FinTimeout
                    } else {
                        End::IdleTimeout
                    };
                    story.fault(end, None);
                }
                ready
            })
        };
        match ready {
            Err(e) => {
                story.fault(End::Error, Some(e));
                let (end, error) = story.end();
                return (end, error, true);
            }
            Ok(0) if !busy => {
                let (end, error) = story.end();
                let stale = up.start < up.end || down.start < down.end;
                return (end, error, stale);
            }
            Ok(_) => {}
        }
        // Errors and hang-ups count as "ready": the next read or write
        // reports them (or the end of stream) precisely.
        const ANY: libc::c_short = libc::POLLERR | libc::POLLHUP;
        if fds[0].revents & (libc::POLLIN | ANY) != 0 {
            up.readable = true;
        }
        if fds[0].revents & (libc::POLLOUT | ANY) != 0 {
            down.writable = true;
        }
        if fds[1].revents & (libc::POLLIN | ANY) != 0 {
            down.readable = true;
        }
        if fds[1].revents & (libc::POLLOUT | ANY) != 0 {
            up.writable = true;
        }
    }
}

/// How [`wait`] waits.
struct WaitFor {
    timeout_ms: i32,
    release_ms: i32,
    /// Nothing waits in either buffer (their pages may be given back).
    idle: bool,
    /// `--yield-before-poll`, and bytes moved this round.
    yield_first: bool,
}

/// Waits for one of `fds` to be ready, at most `timeout_ms`; returns how
/// many are (0 at the timeout).
fn wait(fds: &mut [libc::pollfd; 2], conduits: &mut Conduits, how: WaitFor) -> io::Result<i32> {
    // --yield-before-poll: bytes just went out, so the other side is
    // probably about to answer (a backend's reply to the request just
    // forwarded, a client's next request after a reply). Let it run first,
    // then look without waiting: if the answer is there, the sleep in poll
    // and the wake-up that ends it (the scheduler's two most expensive
    // paths on this workload) are skipped.
    if how.yield_first {
        // SAFETY: no arguments; on Linux it always succeeds.
        unsafe { libc::sched_yield() };
        let ready = poll(fds, 0)?;
        if ready > 0 {
            return Ok(ready);
        }
    }
    // Nothing waits in either buffer: if the wait is long, give their pages
    // back after RELEASE_AFTER, then wait out the rest.
    if how.idle && how.timeout_ms > how.release_ms {
        match poll(fds, how.release_ms)? {
            0 => {
                conduits.release();
                poll(fds, how.timeout_ms - how.release_ms)
            }
            ready => Ok(ready),
        }
    } else {
        poll(fds, how.timeout_ms)
    }
}

/// `poll(2)` on `fds` for at most `timeout_ms`; returns how many are ready
/// (0 at the timeout). A signal restarts the wait with the whole timeout.
fn poll(fds: &mut [libc::pollfd; 2], timeout_ms: i32) -> io::Result<i32> {
    loop {
        // SAFETY: `fds` is a valid array of two pollfd for the whole call.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout_ms) };
        if ready >= 0 {
            return Ok(ready);
        }
        let err = io::Error::last_os_error();
        if err.kind() != ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Sends at once what `MSG_MORE` writes left waiting in `socket`: setting
/// `TCP_NODELAY` (again) pushes the pending segments out.
fn uncork(socket: &TcpStream) -> io::Result<()> {
    socket.set_nodelay(true)
}

/// A `pollfd` for `socket`. A socket with nothing to wait for gets fd -1,
/// which `poll(2)` skips: otherwise a hang-up on it (always reported, even
/// when not asked for) would wake every call at once and spin the CPU.
fn watch(socket: &TcpStream, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd: if events == 0 { -1 } else { socket.as_raw_fd() },
        events,
        revents: 0,
    }
}

/// Poll events for a socket that is the source of `from` and the destination
/// of `to`.
fn interest(from: &Half, to: &Half) -> libc::c_short {
    let mut events = 0;
    if from.wants_read() {
        events |= libc::POLLIN;
    }
    if to.pending() {
        events |= libc::POLLOUT;
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    /// Pump options with this idle timeout (and the same fin timeout).
    fn options(idle_ms: u64) -> PumpOptions {
        PumpOptions {
            idle_timeout: Duration::from_millis(idle_ms),
            fin_timeout: Duration::from_millis(idle_ms),
            yield_before_poll: false,
        }
    }

    /// The buffered pump (4096-byte chunks), or the splicing one.
    fn run(
        splice: bool,
        client: &TcpStream,
        backend: &TcpStream,
        options: &PumpOptions,
    ) -> Outcome {
        if splice {
            splice_pump(client, backend, options)
        } else {
            pump(client, backend, 4096, options)
        }
    }

    /// A connected pair of sockets on loopback, with timeouts.
    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        for s in [&a, &b] {
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
        }
        (a, b)
    }

    #[test]
    fn pump_moves_both_ways_and_passes_half_close() {
        let (mut client, client_end) = pair();
        let (backend_end, mut backend) = pair();
        let t = std::thread::spawn(move || pump(&client_end, &backend_end, 7, &options(10_000)));
        client
            .write_all(b"hello\0world, more than seven bytes")
            .unwrap();
        client.shutdown(Direction::Write).unwrap();
        let mut got = Vec::new();
        backend.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"hello\0world, more than seven bytes");
        backend.write_all(b"reply").unwrap();
        backend.shutdown(Direction::Write).unwrap();
        let mut reply = Vec::new();
        client.read_to_end(&mut reply).unwrap();
        assert_eq!(reply, b"reply");
        let outcome = t.join().unwrap();
        assert_eq!(outcome.transfer.to_backend, 34);
        assert_eq!(outcome.transfer.to_client, 5);
        assert_eq!(outcome.end, End::ClientClosed);
        assert!(outcome.error.is_none());
    }

    /// `len` bytes that differ from one seed to another and have no short
    /// period, so a lost, doubled or reordered chunk shows.
    fn pattern(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect()
    }

    /// Sends `up` from the client and `down` from the backend at the same
    /// time through a pump, and returns what each side received.
    fn through_pump(splice: bool, up: &[u8], down: &[u8]) -> (Vec<u8>, Vec<u8>, Transfer) {
        through_pump_with(splice, false, up, down)
    }

    /// [`through_pump`], with or without `--yield-before-poll`.
    fn through_pump_with(
        splice: bool,
        yield_first: bool,
        up: &[u8],
        down: &[u8],
    ) -> (Vec<u8>, Vec<u8>, Transfer) {
        let (mut client, client_end) = pair();
        let (backend_end, mut backend) = pair();
        let pump_thread = std::thread::spawn(move || {
            let options = PumpOptions {
                yield_before_poll: yield_first,
                ..options(10_000)
            };
            run(splice, &client_end, &backend_end, &options)
        });
        let mut client_w = client.try_clone().unwrap();
        let mut backend_w = backend.try_clone().unwrap();
        let (up, down) = (up.to_vec(), down.to_vec());
        let up_writer = std::thread::spawn(move || {
            client_w.write_all(&up).unwrap();
            client_w.shutdown(Direction::Write).unwrap();
        });
        let down_writer = std::thread::spawn(move || {
            backend_w.write_all(&down).unwrap();
            backend_w.shutdown(Direction::Write).unwrap();
        });
        let at_backend = std::thread::spawn(move || {
            let mut got = Vec::new();
            backend.read_to_end(&mut got).unwrap();
            got
        });
        let mut at_client = Vec::new();
        client.read_to_end(&mut at_client).unwrap();
        up_writer.join().unwrap();
        down_writer.join().unwrap();
        let at_backend = at_backend.join().unwrap();
        let outcome = pump_thread.join().unwrap();
        assert!(outcome.end.is_clean(), "{outcome:?}");
        (at_backend, at_client, outcome.transfer)
    }

    #[test]
    fn ten_mib_each_way_survive_byte_for_byte() {
        let up = pattern(10 << 20, 1);
        let down = pattern(10 << 20, 2);
        for splice in [false, true] {
            let (at_backend, at_client, transfer) = through_pump(splice, &up, &down);
            assert!(
                at_backend == up,
                "client -> backend differs (splice {splice})"
            );
            assert!(
                at_client == down,
                "backend -> client differs (splice {splice})"
            );
            assert_eq!(transfer.to_backend, 10 << 20);
            assert_eq!(transfer.to_client, 10 << 20);
        }
    }

    #[test]
    fn splice_pipes_serve_one_connection_after_another() {
        // One thread pumps two connections in turn: the second goes
        // through the pipes the first left (drained) behind, and each
        // passes its half-close on.
        let (tx, rx) = crossbeam_channel::unbounded::<(TcpStream, TcpStream)>();
        let worker = std::thread::spawn(move || {
            for _ in 0..2 {
                let (c, b) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
                let outcome = splice_pump(&c, &b, &options(10_000));
                assert!(outcome.end.is_clean(), "{outcome:?}");
            }
        });
        for i in 0..2u8 {
            let (mut client, client_end) = pair();
            let (backend_end, mut backend) = pair();
            tx.send((client_end, backend_end)).unwrap();
            client.write_all(&[b'q', i, 0]).unwrap();
            client.shutdown(Direction::Write).unwrap();
            let mut got = Vec::new();
            backend.read_to_end(&mut got).unwrap();
            assert_eq!(got, [b'q', i, 0]);
            backend.write_all(&[b'r', i]).unwrap();
            backend.shutdown(Direction::Write).unwrap();
            let mut reply = Vec::new();
            client.read_to_end(&mut reply).unwrap();
            assert_eq!(reply, [b'r', i]);
        }
        worker.join().unwrap();
    }

    #[test]
    fn yield_before_poll_moves_the_same_bytes() {
        // The yield and the look without waiting change when the worker
        // sleeps, never what it moves: 1 MiB each way, both pumps.
        let up = pattern(1 << 20, 3);
        let down = pattern(1 << 20, 4);
        for splice in [false, true] {
            let (at_backend, at_client, transfer) = through_pump_with(splice, true, &up, &down);
            assert!(at_backend == up, "splice={splice}: client->backend differs");
            assert!(
                at_client == down,
                "splice={splice}: backend->client differs"
            );
            assert_eq!(transfer.to_backend, up.len() as u64);
            assert_eq!(transfer.to_client, down.len() as u64);
        }
    }

    #[test]
    fn pump_ends_at_the_idle_timeout() {
        let (_client, client_end) = pair();
        let (backend_end, _backend) = pair();
        let outcome = pump(&client_end, &backend_end, 4096, &options(50));
        assert_eq!(outcome.end, End::IdleTimeout);
    }
    /// The client sends `n` bytes and resets (SO_LINGER 0) before the pump
    /// starts; the backend reads what comes. The bytes written before the
    /// read that reports the reset are all counted.
    fn bytes_then_reset(splice: bool, n: usize, client_resets: bool) -> (Outcome, usize) {
        let (mut client, client_end) = pair();
        let (backend_end, mut backend) = pair();
        let data = pattern(n, 9);
        let (sender, receiver) = if client_resets {
            (&mut client, &mut backend)
        } else {
            (&mut backend, &mut client)
        };
        sender.write_all(&data).unwrap();
        socket2::SockRef::from(&*sender)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        let mut receiver = receiver.try_clone().unwrap();
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            // The pump closes nothing itself: the read ends at the
            // timeout below, or when the test drops the pump's sockets.
            let _ = receiver.read_to_end(&mut got);
            got.len()
        });
        drop(client);
        drop(backend);
        let outcome = run(splice, &client_end, &backend_end, &options(10_000));
        drop(client_end);
        drop(backend_end);
        (outcome, reader.join().unwrap())
    }

    #[test]
    fn bytes_before_a_reset_are_counted_exactly() {
        // On a pump that added its counts only after each step, the step
        // that met the reset lost every byte it had written. 64 KiB is 16
        // full chunks, or one full pipe: no read comes short, so the read
        // that reports the reset comes in the same step as the writes.
        let n = 64 * 1024;
        for splice in [false, true] {
            let (outcome, read) = bytes_then_reset(splice, n, true);
            assert_eq!(outcome.end, End::ClientReset, "splice={splice}");
            assert_eq!(read, n, "splice={splice}");
            assert_eq!(outcome.transfer.to_backend, n as u64, "splice={splice}");
            let (outcome, read) = bytes_then_reset(splice, n, false);
            assert_eq!(outcome.end, End::BackendReset, "splice={splice}");
            assert_eq!(read, n, "splice={splice}");
            assert_eq!(outcome.transfer.to_client, n as u64, "splice={splice}");
        }
    }

    const REPLY_413: &[u8] = b"HTTP/1.1 413 Too Large\r\n\r\n";

    #[test]
    fn a_failed_write_toward_the_backend_still_delivers_its_reply() {
        // The backend reads 1 KiB of an upload, answers and closes with the
        // rest unread (so its kernel resets): the pump's writes toward it
        // fail, and the reply must still reach the client.
        for splice in [false, true] {
            let (mut client, client_end) = pair();
            let (backend_end, mut backend) = pair();
            let pump_thread = std::thread::spawn(move || {
                run(splice, &client_end, &backend_end, &options(10_000))
            });
            let backend_thread = std::thread::spawn(move || {
                let mut head = [0u8; 1024];
                backend.read_exact(&mut head).unwrap();
                backend.write_all(REPLY_413).unwrap();
            });
            let mut reader = client.try_clone().unwrap();
            let reply = std::thread::spawn(move || {
                let mut got = Vec::new();
                let _ = reader.read_to_end(&mut got);
                got
            });
            let chunk = vec![7u8; 64 * 1024];
            for _ in 0..160 {
                if client.write_all(&chunk).is_err() {
                    break;
                }
            }
            drop(client);
            let got = reply.join().unwrap();
            assert!(
                got.starts_with(b"HTTP/1.1 413"),
                "splice={splice}: the client got {:?}",
                String::from_utf8_lossy(&got)
            );
            backend_thread.join().unwrap();
            let outcome = pump_thread.join().unwrap();
            assert_eq!(outcome.end, End::BackendReset, "splice={splice}");
            assert_eq!(
                outcome.transfer.to_client,
                REPLY_413.len() as u64,
                "splice={splice}"
            );
        }
    }

    #[test]
    fn the_fin_timeout_closes_a_half_closed_connection() {
        let (mut client, client_end) = pair();
        let (backend_end, mut backend) = pair();
        let options = PumpOptions {
            idle_timeout: Duration::from_secs(30),
            fin_timeout: Duration::from_millis(200),
            yield_before_poll: false,
        };
        client.write_all(b"bye").unwrap();
        client.shutdown(Direction::Write).unwrap();
        let started = std::time::Instant::now();
        let outcome = pump(&client_end, &backend_end, 4096, &options);
        let took = started.elapsed();
        assert_eq!(outcome.end, End::FinTimeout);
        assert!(took >= Duration::from_millis(190), "{took:?}");
        assert!(took < Duration::from_secs(10), "{took:?}");
        // The backend got the bytes and the end of stream, and said nothing.
        let mut got = Vec::new();
        backend.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"bye");
    }

    /// One side of [`neither_direction_starves_the_other`], on one thread:
    /// sends `total` bytes and reads what comes without blocking on either,
    /// and for each chunk received notes how far the other direction got
    /// since the previous one. Returns the largest such gap, in bytes, and
    /// the bytes received.
    fn stream_both_ways(
        socket: TcpStream,
        total: u64,
        mine: &AtomicU64,
        theirs: &AtomicU64,
        until: std::time::Instant,
    ) -> (u64, u64) {
        socket.set_nonblocking(true).unwrap();
        let mut socket = socket;
        let out = vec![5u8; 64 * 1024];
        let mut buf = vec![0u8; 64 * 1024];
        let (mut sent, mut got, mut shut, mut eof) = (0u64, 0u64, false, false);
        let mut seen = 0; // the other direction's count at my last chunk
        let mut worst = 0;
        while !(eof && shut) && std::time::Instant::now() < until {
            let mut moved = false;
            if sent < total {
                let n = out.len().min((total - sent) as usize);
                match socket.write(&out[..n]) {
                    Ok(n) => {
                        sent += n as u64;
                        moved = true;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(e) => panic!("write: {e}"),
                }
            } else if !shut {
                socket.shutdown(Direction::Write).unwrap();
                shut = true;
            }
            if !eof {
                match socket.read(&mut buf) {
                    Ok(0) => eof = true,
                    Ok(n) => {
                        // How far did the other direction go since this
                        // one's last chunk?
                        let now = theirs.load(Ordering::SeqCst);
                        worst = worst.max(now - seen);
                        seen = now;
                        got += n as u64;
                        mine.store(got, Ordering::SeqCst);
                        moved = true;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(e) => panic!("read: {e}"),
                }
            }
            if !moved && (!eof || !shut) {
                let mut events = 0;
                if !eof {
                    events |= libc::POLLIN;
                }
                if sent < total {
                    events |= libc::POLLOUT;
                }
                let mut fds = [watch(&socket, events), watch(&socket, 0)];
                poll(&mut fds, 100).unwrap();
            }
        }
        (worst, got)
    }

    #[test]
    fn neither_direction_starves_the_other() {
        // Both sides stream at once. Each reads and writes on one thread,
        // so when it is not scheduled it neither sends nor receives, and
        // small socket buffers keep what sits in between small: a gap
        // larger than a few MiB can only be the pump serving one direction
        // while the other had bytes ready.
        const TOTAL: u64 = 64 << 20;
        const MAX_GAP: u64 = 8 << 20;
        for splice in [false, true] {
            let (client, client_end) = pair();
            let (backend_end, backend) = pair();
            for s in [&client, &client_end, &backend_end, &backend] {
                let s = socket2::SockRef::from(s);
                s.set_send_buffer_size(256 * 1024).unwrap();
                s.set_recv_buffer_size(256 * 1024).unwrap();
            }
            let pump_thread = std::thread::spawn(move || {
                run(splice, &client_end, &backend_end, &options(10_000))
            });
            let at_client = Arc::new(AtomicU64::new(0));
            let at_backend = Arc::new(AtomicU64::new(0));
            let until = std::time::Instant::now() + Duration::from_secs(60);
            let backend_side = {
                let (mine, theirs) = (Arc::clone(&at_backend), Arc::clone(&at_client));
                std::thread::spawn(move || stream_both_ways(backend, TOTAL, &mine, &theirs, until))
            };
            let (down_gap, down) = stream_both_ways(client, TOTAL, &at_client, &at_backend, until);
            let (up_gap, up) = backend_side.join().unwrap();
            let outcome = pump_thread.join().unwrap();
            assert_eq!((up, down), (TOTAL, TOTAL), "splice={splice}: {outcome:?}");
            assert!(outcome.end.is_clean(), "{outcome:?}");
            assert!(
                up_gap < MAX_GAP && down_gap < MAX_GAP,
                "splice={splice}: client -> backend waited while the other way moved \
                 {up_gap} bytes; backend -> client waited while the other way moved {down_gap}"
            );
        }
    }
}
