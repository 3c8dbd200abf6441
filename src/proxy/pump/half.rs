//! One direction of the pump: its state, its step (read, then write what
//! was read, for at most one turn) and how a fault ends it.
//!
//! # Threads
//!
//! Runs on the worker thread that serves the connection; shares nothing.
//!
//! # Corresponds to the C article
//!
//! The body of the copy loop of `proxy_function()`; see the pump's doc.

use std::io::{self, ErrorKind};
use std::net::{self, TcpStream};

use std::time::Instant;

use super::bucket::Bucket;
use super::{End, Transfer, TURN_BYTES};
use crate::proxy::conduit::{Conduit, Conduits};

/// The two sockets of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    Client,
    Backend,
}

impl Side {
    /// The end when this side's socket reports `error`: a reset by this
    /// side, or, for a read, another error.
    pub(super) fn read_failed(self, error: &io::Error) -> End {
        match (self, is_reset(error)) {
            (Side::Client, true) => End::ClientReset,
            (Side::Backend, true) => End::BackendReset,
            (_, false) => End::Error,
        }
    }

    /// The end when a write toward this side fails with `error`.
    pub(super) fn write_failed(self, error: &io::Error) -> End {
        match (self, is_reset(error)) {
            (Side::Client, true) => End::ClientReset,
            (Side::Backend, true) => End::BackendReset,
            (Side::Client, false) => End::WriteToClientFailed,
            (Side::Backend, false) => End::WriteToBackendFailed,
        }
    }
}

/// A reset (or an abort) by the peer.
fn is_reset(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted
    )
}

/// Why a [`Half::step`] stopped short.
pub(super) enum Fault {
    /// Reading the source failed: that socket is gone, both ways.
    Read(io::Error),
    /// Writing (or half-closing) the destination failed.
    Write(io::Error),
}

/// One direction of the pump: what we know of its buffer and both ends.
/// The buffer itself belongs to the thread's `Buffers` and is passed to
/// [`Half::step`].
pub(super) struct Half {
    /// Bytes `buf[start..end]` are read but not yet written.
    pub(super) start: usize,
    pub(super) end: usize,
    /// The source said end of stream.
    pub(super) eof: bool,
    /// We passed the end of stream on: with `shutdown(Write)`, or, when
    /// this direction ended last, by leaving it to the close that follows
    /// at once (see [`Half::step`]).
    pub(super) done: bool,
    /// This direction is over without its end of stream: a write toward
    /// its destination failed, or one of its sockets is gone. What its
    /// buffer holds is dropped and its source is read no more.
    pub(super) stopped: bool,
    /// Its source reset the connection (as a write toward it found): what
    /// it still reads from there is delivered, but its end of stream is
    /// not passed on, since its destination is to get a reset instead.
    pub(super) cut: bool,
    /// The last read did not say `WouldBlock` (or poll said readable since).
    pub(super) readable: bool,
    /// The last write did not say `WouldBlock` (or poll said writable since).
    pub(super) writable: bool,
    /// The last write said "more is coming" (`MSG_MORE`): the kernel may
    /// hold its bytes to fill a bigger segment until [`uncork`] is called.
    pub(super) corked: bool,
    /// The last step used up its turn ([`TURN_BYTES`]) while it could
    /// still have gone on: it goes on next round, after the other half.
    pub(super) busy: bool,
    /// Its bandwidth cap, when it has one (boxed: an uncapped connection
    /// carries only the pointer's room on the worker's stack).
    pub(super) bucket: Option<Box<Bucket>>,
    /// Out of tokens: it reads nothing until its bucket has a chunk's
    /// worth again (see [`Half::refresh`]).
    pub(super) throttled: bool,
    /// Back from the kernel relay: its end of stream is passed on by the
    /// pump's loop, once the destination's count was checked
    /// (`promote::guard`), not here.
    pub(super) guarded: bool,
    /// A guarded half reached its end of stream: the FIN is owed.
    pub(super) owed: bool,
}

impl Half {
    pub(super) fn new() -> Half {
        Half {
            start: 0,
            end: 0,
            eof: false,
            done: false,
            stopped: false,
            cut: false,
            readable: true,
            writable: true,
            corked: false,
            busy: false,
            bucket: None,
            throttled: false,
            guarded: false,
            owed: false,
        }
    }

    /// A half capped at `rate` bytes a second (`None`: uncapped).
    pub(super) fn capped(rate: Option<u64>) -> Half {
        Half {
            bucket: rate.map(|r| Box::new(Bucket::new(r, Instant::now()))),
            ..Half::new()
        }
    }

    /// For a throttled half: whether its tokens are back at `now` (it may
    /// read again), else how many milliseconds until they are.
    pub(super) fn refresh(&mut self, now: Instant) -> Option<i32> {
        let bucket = self.bucket.as_mut()?;
        if !self.throttled {
            return None;
        }
        if bucket.ready(now) {
            self.throttled = false;
            return None;
        }
        Some(bucket.wait_ms(now))
    }

    pub(super) fn pending(&self) -> bool {
        !self.stopped && self.start < self.end
    }

    pub(super) fn wants_read(&self) -> bool {
        !self.eof && !self.stopped && !self.throttled && self.start == self.end
    }

    /// Nothing more will move this way.
    pub(super) fn finished(&self) -> bool {
        self.done || self.stopped
    }

    /// It can move bytes without waiting for `poll` first.
    pub(super) fn can_go_on(&self) -> bool {
        (self.wants_read() && self.readable) || (self.pending() && self.writable)
    }

    /// Ends this direction where it is (see `stopped`).
    pub(super) fn stop(&mut self) {
        self.stopped = true;
        self.corked = false;
        self.busy = false;
    }

    /// One read from `src` into the empty conduit, of no more bytes than
    /// the bucket (if any) allows. `Ok(false)`: out of tokens, read
    /// nothing, and now throttled.
    #[inline]
    fn read(&mut self, conduit: &mut Conduit, src: &TcpStream) -> Result<bool, Fault> {
        let max = match self.bucket.as_mut() {
            None => conduit.capacity(),
            Some(bucket) => bucket.allowance(Instant::now(), conduit.capacity()),
        };
        if max == 0 {
            self.throttled = true;
            return Ok(false);
        }
        loop {
            match conduit.fill(src, max) {
                Ok(0) => self.eof = true,
                Ok(n) => {
                    if let Some(bucket) = self.bucket.as_mut() {
                        bucket.spend(n);
                    }
                    self.start = 0;
                    self.end = n;
                    // A stream socket fills the buffer when it can: a short
                    // read means its queue is empty now, so the read that
                    // would only say `WouldBlock` is skipped and `poll`
                    // tells when more comes. (Through a pipe a short read
                    // may also mean the pipe is full: the next `poll` then
                    // returns at once, no harm done.)
                    if n < max {
                        self.readable = false;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => self.readable = false,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(Fault::Read(e)),
            }
            return Ok(true);
        }
    }

    /// Moves what it can from `src` to `dst` through `conduit` without
    /// blocking, for at most one turn. Adds each write's bytes to `moved`
    /// as soon as it succeeds, so a later failure loses no count.
    ///
    /// `last`: the other direction is over, so once this one reaches its
    /// end of stream the pump returns and the connection is closed. Its
    /// end of stream is then not passed on here but by that close: a
    /// socket's `close(2)` sends the same FIN a `shutdown(Write)` would
    /// (nothing is left unread in it: the other direction read it to its
    /// end, or the close's own `shutdown` sends it first), and the
    /// `shutdown` would be one system call more per connection.
    pub(super) fn step(
        &mut self,
        conduit: &mut Conduit,
        [src, dst]: [&TcpStream; 2],
        moved: &mut u64,
        last: bool,
    ) -> Result<(), Fault> {
        self.busy = false;
        let turn_ends = *moved + TURN_BYTES;
        loop {
            if self.wants_read() && self.readable && !self.read(conduit, src)? {
                // Out of tokens: no read until they are back.
                return Ok(());
            }
            // A read that filled the whole buffer says the source is
            // streaming: tell the kernel more is coming, so it can send
            // full-sized segments instead of one per 4096-byte chunk (the
            // receiver then wakes once per segment, not per chunk).
            let more = self.end == conduit.capacity();
            while self.pending() && self.writable {
                match conduit.drain(dst, self.start, self.end, more) {
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
                if self.cut {
                    // No FIN after a reset: the pump's close sends one.
                    self.stop();
                    return Ok(());
                }
                self.done = true;
                // Half-close: tell the destination nothing more will come
                // (unless the close at once will, see `last`). ENOTCONN
                // only means the peer is gone already.
                if self.guarded {
                    self.owed = true;
                } else if !last {
                    if let Err(e) = dst.shutdown(net::Shutdown::Write) {
                        if e.kind() != ErrorKind::NotConnected {
                            return Err(Fault::Write(e));
                        }
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
pub(super) struct Story {
    fault: Option<(End, Option<io::Error>)>,
    first_close: Option<End>,
    /// With `kernel_relay`: exchanges completed so far (see
    /// `promote.rs`), whether bytes went toward the backend since the last
    /// ones back, and whether the hand-over was tried. Small enough to sit
    /// in the room the fields above leave.
    pub(super) exchanges: u32,
    pub(super) asked: bool,
    pub(super) tried: bool,
    /// The sockets came back from the kernel relay still in its maps
    /// (`Relayed::Back { kept }`): the connection ends in this process.
    pub(super) kept: bool,
    /// Back from the kernel relay: where each direction's counts stood
    /// when the relay began (`promote::guard`). Boxed: the pump's frame
    /// grows by a pointer.
    pub(super) guard: Option<Box<crate::proxy::kernel_relay::Bases>>,
}

impl Story {
    pub(super) fn fault(&mut self, end: End, error: Option<io::Error>) {
        if self.fault.is_none() {
            self.fault = Some((end, error));
        }
    }

    pub(super) fn closed(&mut self, end: End) {
        if self.first_close.is_none() {
            self.first_close = Some(end);
        }
    }

    pub(super) fn end(self) -> (End, Option<io::Error>) {
        match (self.fault, self.first_close) {
            (Some(fault), _) => fault,
            (None, Some(close)) => (close, None),
            // Both halves finish only by their end of stream or by a fault.
            (None, None) => (End::Error, None),
        }
    }
}

/// Gives each direction that is not over its turn, and notes in `story`
/// what went wrong and which directions that stops.
#[inline]
pub(super) fn step_both(
    conduits: &mut Conduits,
    up: &mut Half,
    down: &mut Half,
    client: &TcpStream,
    backend: &TcpStream,
    transfer: &mut Transfer,
    story: &mut Story,
) {
    let (mut up_conduit, mut down_conduit) = conduits.halves();
    if !up.finished() {
        let last = down.finished();
        match up.step(
            &mut up_conduit,
            [client, backend],
            &mut transfer.to_backend,
            last,
        ) {
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
                let end = Side::Backend.write_failed(&e);
                down.cut |= end.is_reset();
                story.fault(end, Some(e));
                up.stop();
            }
        }
    }
    if !down.finished() {
        let last = up.finished();
        match down.step(
            &mut down_conduit,
            [backend, client],
            &mut transfer.to_client,
            last,
        ) {
            Ok(()) => {}
            Err(Fault::Read(e)) => {
                story.fault(Side::Backend.read_failed(&e), Some(e));
                down.stop();
                up.stop();
            }
            Err(Fault::Write(e)) => {
                let end = Side::Client.write_failed(&e);
                up.cut |= end.is_reset();
                story.fault(end, Some(e));
                down.stop();
            }
        }
    }
}

/// About to wait, or to let the other half have its turn: whatever a
/// "more is coming" write left in the kernel must leave now, unless more
/// of the same stream follows at once.
#[inline]
pub(super) fn uncork_both(
    up: &mut Half,
    down: &mut Half,
    client: &TcpStream,
    backend: &TcpStream,
    story: &mut Story,
) {
    for (half, dst, side) in [(up, backend, Side::Backend), (down, client, Side::Client)] {
        if half.corked && !half.busy {
            half.corked = false;
            if let Err(e) = uncork(dst) {
                story.fault(side.write_failed(&e), Some(e));
                half.stop();
            }
        }
    }
}

/// Sends at once what `MSG_MORE` writes left waiting in `socket`: setting
/// `TCP_NODELAY` (again) pushes the pending segments out.
fn uncork(socket: &TcpStream) -> io::Result<()> {
    socket.set_nodelay(true)
}
