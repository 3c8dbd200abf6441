//! A connection's place in the kernel's maps: its hand-over in (`insert`,
//! with the counters read at rest), the limits that bound what the kernel
//! holds (`raise_limits`), the way back to the copy pump after the bound
//! (`settle`: the sockets stay in the maps, their program keeping their
//! bytes), the way out of the maps (`unwind`, one direction at a time with
//! nothing lost, then `forget`), and what is left to delete when it ends
//! (`Drop`).
//!
//! # Threads
//!
//! The worker thread that owns the connection; the maps are the kernel's.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::io;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::Duration;

use super::bpf::{map_delete, map_lookup, map_update, Kernel, LATCHED};
use super::counts::{at_rest, cookie, push_queued, Counts, Way, TCP_ESTABLISHED};
use super::{Bases, Fault, BACKLOG_BOUND};

/// One connection's place in the maps.
pub(super) struct Link<'a> {
    pub(super) kernel: &'static Kernel,
    /// Client then backend.
    pub(super) sockets: [&'a TcpStream; 2],
    pub(super) cookies: [u64; 2],
    /// Which entries were made: `moved`, `peers` (keyed by the socket whose
    /// bytes go to the other), `verdicts`.
    pub(super) in_moved: [bool; 2],
    pub(super) in_limits: [bool; 2],
    pub(super) in_peers: [bool; 2],
    pub(super) in_verdicts: [bool; 2],
    /// The `limits` entries as last written.
    pub(super) limits: [u64; 2],
    /// The limits in force when the program was last found not latched:
    /// a latch since then means a socket received more than this.
    pub(super) floors: [u64; 2],
    /// Client → backend, backend → client.
    pub(super) ways: [Way; 2],
    /// The way whose end of stream was seen first.
    pub(super) first_eof: Option<usize>,
}

impl<'a> Link<'a> {
    pub(super) fn new(
        kernel: &'static Kernel,
        client: &'a TcpStream,
        backend: &'a TcpStream,
    ) -> Link<'a> {
        Link {
            kernel,
            sockets: [client, backend],
            cookies: [0; 2],
            in_moved: [false; 2],
            in_limits: [false; 2],
            in_peers: [false; 2],
            in_verdicts: [false; 2],
            limits: [BACKLOG_BOUND; 2],
            floors: [BACKLOG_BOUND; 2],
            ways: [Way::default(), Way::default()],
            first_eof: None,
        }
    }

    /// Puts both sockets into the maps: `moved`, `limits` and `peers`
    /// first, then `verdicts` (backend first, client last), then pushes
    /// bytes that were already queued through the program.
    pub(super) fn insert(&mut self) -> io::Result<()> {
        let (counts, unread) = self.start_counts()?;
        for c in &counts {
            if c.state != TCP_ESTABLISHED {
                return Err(io::Error::other("a socket is no longer ESTABLISHED"));
            }
        }
        for i in 0..2 {
            self.cookies[i] = cookie(self.sockets[i])?;
            // Bytes received but not yet read: the program takes them.
            self.ways[i] = Way::at_rest(i, &counts, &unread);
        }
        for i in 0..2 {
            map_update(&self.kernel.moved, self.cookies[i], 0)?;
            self.in_moved[i] = true;
            map_update(&self.kernel.limits, self.cookies[i], self.limits[i])?;
            self.in_limits[i] = true;
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

    /// Each way's bases, for a way whose end of stream the relay did not
    /// pass on (after it, its destination's count holds our FIN too).
    pub(super) fn bases(&self) -> Bases {
        Bases(self.ways.map(|w| (!w.done).then_some(w)))
    }

    /// What the program redirected from socket `i` (none once its entry is
    /// gone), and whether it latched (kept a socket's bytes past its
    /// limit).
    pub(super) fn taken(&self, i: usize) -> io::Result<(u64, bool)> {
        if !self.in_moved[i] {
            return Ok((0, false));
        }
        let n = map_lookup(&self.kernel.moved, self.cookies[i])?;
        Ok((n & (LATCHED - 1), n >= LATCHED))
    }

    /// Whether the program latched on either socket, from the counters
    /// just sampled, asking the map only when it may have: the program
    /// latches on a segment that would take its count past the limit, and
    /// that segment is received, so a socket that latched has received
    /// more than the limit then in force, which is at least its floor (the
    /// limits only rise). A quiet or keeping-up connection makes no call.
    /// (Waking on the kept bytes instead would wake the thread for every
    /// segment: the kernel wakes a socket's readers on each one.)
    pub(super) fn latched(&mut self, counts: &[Counts; 2]) -> io::Result<bool> {
        for (i, received) in counts.iter().enumerate() {
            if self.ways[i].taken(received) > self.floors[i] {
                if self.taken(i)?.1 {
                    return Ok(true);
                }
                self.floors[i] = self.limits[i];
            }
        }
        Ok(false)
    }

    /// Moves each direction's limit up with what the other side's send
    /// path took (`counts`, as just sampled): the program may redirect up
    /// to [`BACKLOG_BOUND`] beyond it. Written only once the limit would
    /// move by a quarter of the bound, so a quiet connection makes no call.
    /// Call [`Link::latched`] first: a latch is seen against the floors.
    pub(super) fn raise_limits(&mut self, counts: &[Counts; 2]) -> io::Result<()> {
        for i in 0..2 {
            let want = self.ways[i].sent(&counts[1 - i]) + BACKLOG_BOUND;
            if self.in_limits[i] && want >= self.limits[i] + BACKLOG_BOUND / 4 {
                map_update(&self.kernel.limits, self.cookies[i], want)?;
                self.limits[i] = want;
            }
        }
        Ok(())
    }

    /// Hands the connection back to the copy pump after the backlog bound
    /// with nothing lost, the sockets left in the maps: for each direction,
    /// the fuller first, takes its peer out of `peers` (the latch: from
    /// then on the program keeps that socket's bytes on the socket, where
    /// the pump reads them), waits for runs still in flight, and waits
    /// until what the program redirected before is in the other side's
    /// send path. The other direction is still relayed meanwhile (see
    /// [`Link::unwind`] for why one at a time). Nothing is taken off a
    /// socket, so no segment can meet a socket without its program; the
    /// sockets leave the maps when they close.
    pub(super) fn settle(
        &mut self,
        idle_timeout: Duration,
        moved: &mut [u64; 2],
    ) -> Result<(), Fault> {
        for i in self.fuller_first()? {
            if self.in_peers[i] {
                // Gone already when the other socket closed: its fault
                // shows in the samples below.
                let _ = map_delete(&self.kernel.peers, self.cookies[i]);
                self.in_peers[i] = false;
            }
            membarrier()?;
            let (taken, _) = self.taken(i)?;
            self.delivered(i, taken, idle_timeout)?;
            if !self.ways[i].done {
                moved[i] = taken;
            }
        }
        Ok(())
    }

    /// The two directions, the one with more bytes in the kernel first:
    /// the order in which the relay stops them (see [`Link::unwind`]).
    fn fuller_first(&mut self) -> Result<[usize; 2], Fault> {
        let counts = self.sample()?;
        let backlog = |i: usize| self.ways[i].backlog(&counts[i], &counts[1 - i]);
        Ok(if backlog(1) > backlog(0) {
            [1, 0]
        } else {
            [0, 1]
        })
    }

    /// Both sockets' counters with the bytes each holds unread, taken
    /// together at rest ([`at_rest`]).
    fn start_counts(&self) -> io::Result<([Counts; 2], [u64; 2])> {
        at_rest(self.sockets)?
            .ok_or_else(|| io::Error::other("bytes kept arriving while the counters were read"))
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
    ///
    /// Bytes the program already kept on a socket (its latch) would be
    /// thrown away with the socket's place in the maps: then the
    /// connection is settled instead ([`Link::settle`]), and `Ok(true)`
    /// says the sockets stay in the maps. While it leaves, no limit holds
    /// (the latch could not be undone).
    pub(super) fn unwind(
        &mut self,
        idle_timeout: Duration,
        moved: &mut [u64; 2],
    ) -> Result<bool, Fault> {
        if !self.in_verdicts.iter().any(|&v| v) {
            // The program never ran on either socket: nothing was taken,
            // and a socket's error is left for the copy pump to meet after
            // the bytes it still holds (a sample would take the error).
            self.forget();
            return Ok(false);
        }
        for i in 0..2 {
            if self.in_limits[i] {
                map_update(&self.kernel.limits, self.cookies[i], LATCHED - 1)?;
            }
        }
        membarrier()?;
        if self.taken(0)?.1 || self.taken(1)?.1 {
            return self.settle(idle_timeout, moved).map(|()| true);
        }
        let held = self.leave(idle_timeout, moved);
        for socket in self.sockets {
            hold(socket, false);
        }
        held.map(|()| false)
    }

    /// [`Link::unwind`]'s work; the sockets' receive low-water marks are
    /// put back by the caller whatever the outcome.
    fn leave(&mut self, idle_timeout: Duration, moved: &mut [u64; 2]) -> Result<(), Fault> {
        let order = self.fuller_first()?;
        for i in order {
            if self.in_verdicts[i] {
                // The kernel drops a segment that reaches the program's
                // socket while the program is being taken off it (the
                // segment is already out of the receive queue, and with no
                // program its verdict is "drop"). Arrivals wake the program
                // only past the receive low-water mark: raised to its
                // ceiling, they wait in the receive queue (until it nears
                // full), and a grace period lets a wake-up under way end.
                hold(self.sockets[i], true);
                membarrier()?;
                let deleted = map_delete(&self.kernel.verdicts, self.cookies[i]);
                self.in_verdicts[i] = false;
                match deleted {
                    // The kernel takes a socket out of a sockhash when it
                    // closes: a reset under way (its error may already be
                    // taken), the socket's fault, not the relay's.
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                        return Err(Fault(Some(i), io::ErrorKind::ConnectionReset.into()));
                    }
                    result => result?,
                }
            }
            // The program runs under RCU: after a grace period no run that
            // started before the delete can still be adding to `moved` or
            // queueing bytes.
            membarrier()?;
            let (taken, _) = self.taken(i)?;
            self.delivered(i, taken, idle_timeout)?;
            if !self.ways[i].done {
                moved[i] = taken;
            }
        }
        self.forget();
        // Plain sockets again, which say what left their receive queues.
        for i in order {
            if !self.ways[i].done {
                self.whole(i, moved[i])?;
            }
        }
        Ok(())
    }

    /// Checks that every byte taken out of socket `i`'s receive queue
    /// since the relay began went through the program (`taken`): the
    /// kernel may still drop one that arrived while the program was taken
    /// off (see [`Link::unwind`]), and a stream with a hole must not go on
    /// as if whole. Both peers then get a reset (`Fault::broken`), and one
    /// warning says why.
    fn whole(&self, i: usize, taken: u64) -> Result<(), Fault> {
        let Some(([counts], [left])) = at_rest([self.sockets[i]])? else {
            // Bytes kept arriving: the count could not be taken at rest.
            return Ok(());
        };
        let consumed = counts.data_in().saturating_sub(left);
        let through = consumed.saturating_sub(self.ways[i].in_base);
        if through == taken {
            return Ok(());
        }
        let side = ["client", "backend"][i];
        log::warn!(
            "kernel relay: the kernel dropped {} bytes from the {side} while the \
             connection left the relay ({through} read, {taken} relayed); the \
             connection ends with a reset",
            through.abs_diff(taken)
        );
        Err(Fault::broken(
            i,
            "bytes dropped by the kernel leaving the relay",
        ))
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
        self.forget_counts();
    }

    /// Deletes the connection's `moved` and `limits` entries. A program
    /// run still on its way finds none and keeps the bytes.
    fn forget_counts(&mut self) {
        for i in 0..2 {
            if self.in_moved[i] {
                let _ = map_delete(&self.kernel.moved, self.cookies[i]);
                self.in_moved[i] = false;
            }
            if self.in_limits[i] {
                let _ = map_delete(&self.kernel.limits, self.cookies[i]);
                self.in_limits[i] = false;
            }
        }
    }
}

impl Drop for Link<'_> {
    /// `moved` and `limits` entries go with the connection; `peers` and
    /// `verdicts` entries go by themselves when the sockets close, and
    /// deleting them here would throw away bytes the kernel still holds
    /// for a socket after an error (the copy pump loses its buffer the
    /// same way), or, after [`Link::settle`], bytes kept for the pump.
    fn drop(&mut self) {
        self.forget_counts();
    }
}

/// Raises (`true`) or puts back (`false`) the socket's receive low-water
/// mark (`SO_RCVLOWAT`): raised, the kernel caps it at half its largest
/// receive buffer and wakes the socket's reader (here the program) only
/// once that much is queued or the window nearly closed. Best effort: a
/// socket that refuses keeps its mark.
fn hold(socket: &TcpStream, raise: bool) {
    let value: libc::c_int = if raise { libc::c_int::MAX } else { 1 };
    // SAFETY: one int, valid for the call.
    unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            &value as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
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
