//! The waits while the kernel relays: [`Link::run`] samples both sockets'
//! counters, raises the program's limits, passes each end of stream on
//! once its direction delivered everything, sees the program's latch, and
//! paces its looks by the rate seen so that a limit is raised before a
//! reader that keeps up meets it (`Watch`);
//! `deliver_from` and `delivered` wait for the last bytes of one direction
//! to reach the other side's send path, after a fault and on the way out.
//!
//! # Threads
//!
//! The worker thread that owns the connection.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::io::{self, ErrorKind};
use std::net::Shutdown as Direction;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::counts::{poll, Counts, TCP_CLOSE};
use super::link::Link;
use super::{
    Fault, Ran, BACKLOG_BOUND, FAULT_GRACE, MAX_CHECK, MAX_DELIVERY_CHECK, MAX_IDLE_CHECK,
    MIN_CHECK,
};

/// What [`Link::run`] remembers between two looks.
struct Watch {
    last: [Counts; 2],
    last_at: Instant,
    last_move: Instant,
    check: Duration,
    delivery_check: Duration,
}

impl Link<'_> {
    /// Waits while the kernel moves the bytes, passes each end of stream
    /// on once its direction has delivered everything, and watches the
    /// backlog and the timeouts (`[idle, fin]`).
    pub(super) fn run(
        &mut self,
        timeouts: [Duration; 2],
        moved: &mut [u64; 2],
    ) -> Result<Ran, Fault> {
        let start = Instant::now();
        let mut watch = Watch {
            last: [Counts::default(); 2],
            last_at: start,
            last_move: start,
            check: MIN_CHECK,
            delivery_check: Duration::ZERO,
        };
        loop {
            // A hand-over to a new process asks for the connection: the
            // copy pump takes it back first (a relaxed load otherwise).
            if crate::connections::carry::asked() {
                return Ok(Ran::Asked);
            }
            let counts = self.sample()?;
            let now = Instant::now();
            if self.latched(&counts)? {
                // The program met a limit and keeps a socket's bytes: the
                // one decision of the bound (a backlog sampled above it
                // without a latch is bytes the program has yet to see).
                return Ok(Ran::Backlog);
            }
            self.raise_limits(&counts)?;
            let worst_backlog = self.pass_on(&counts, moved)?;
            if self.ways[0].done && self.ways[1].done {
                return Ok(Ran::Finished {
                    client_first: self.first_eof != Some(1),
                });
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
    pub(super) fn sample(&mut self) -> Result<[Counts; 2], Fault> {
        let counts = [Counts::of(self.sockets[0])?, Counts::of(self.sockets[1])?];
        for (i, c) in counts.iter().enumerate() {
            if c.state == TCP_CLOSE {
                if let Some(e) = self.sockets[i].take_error()? {
                    return Err(Fault(Some(i), e));
                }
                if !self.ways[1 - i].done {
                    // Closed while its own way in still runs: not the end
                    // of a clean close (that needs our FIN, sent only
                    // once that way is done) but a reset whose error the
                    // program's redirect toward it already took. Its way
                    // in will never drain: the same fault as a reset seen.
                    return Err(Fault(Some(i), ErrorKind::ConnectionReset.into()));
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
            self.not_doubled(i, src, dst)?;
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
                match self.sockets[1 - i].shutdown(Direction::Write) {
                    Ok(()) => self.not_doubled_at_end(i)?,
                    Err(e) if e.kind() == ErrorKind::NotConnected => {}
                    Err(e) => return Err(Fault(Some(1 - i), e)),
                }
            }
        }
        Ok(worst_backlog)
    }

    /// Checks that way `i` handed its destination no more bytes than its
    /// source received. Under heavy load the kernel's redirect has been
    /// seen to send a segment twice (65,483 bytes more, once in about 500
    /// 10 MiB echoes each way, four at once beside a CPU hog): a stream
    /// that goes on after that is corrupt, so the connection ends with a
    /// reset to both peers, and one warning says why. The source is read
    /// again first: it was sampled before the destination, and bytes that
    /// arrived in between may already be in the destination's count.
    pub(super) fn not_doubled(&self, i: usize, src: &Counts, dst: &Counts) -> Result<(), Fault> {
        let way = &self.ways[i];
        if way.done || way.excess(src, dst, false).is_none() {
            return Ok(());
        }
        let now = Counts::of(self.sockets[i])?;
        match way.excess(&now, dst, false) {
            Some((sent, taken)) => Err(doubled(i, sent, taken)),
            None => Ok(()),
        }
    }

    /// The last check of way `i`, its FIN just passed on (it counts one
    /// in the destination's count): a segment the kernel sent twice
    /// between the look that found everything delivered and the FIN is in
    /// the count now, and no byte can follow the FIN. The other peer still
    /// learns it, with a reset.
    fn not_doubled_at_end(&self, i: usize) -> Result<(), Fault> {
        match self.ways[i].excess_now(i, self.sockets, true)? {
            Some((sent, taken)) => Err(doubled(i, sent, taken)),
            None => Ok(()),
        }
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
    /// would report `POLLRDHUP` on every call. Not `POLLIN`: the kernel
    /// wakes a relayed socket's readers for every segment it relays.
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

    /// After socket `i` failed (a reset), waits a little for what the
    /// program took from it to reach the other side's send path: a
    /// backend's early answer before its reset still reaches the client,
    /// as on the copy pump. Bounded by [`FAULT_GRACE`]; errors end it.
    /// `moved` then holds both ways' counts as the sockets last said.
    pub(super) fn deliver_from(&mut self, i: usize, moved: &mut [u64; 2]) {
        let deadline = Instant::now() + FAULT_GRACE;
        while Instant::now() < deadline {
            let (Ok(src), Ok(dst)) = (Counts::of(self.sockets[i]), Counts::of(self.sockets[1 - i]))
            else {
                return;
            };
            // The other way's count as the failed socket last took it:
            // the copy pump's counts stop there too.
            if !self.ways[1 - i].done {
                moved[1 - i] = self.ways[1 - i].sent(&src);
            }
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

    /// Waits until the `taken` bytes of way `i` are in the other side's
    /// send path (or the way was done before), at most `idle_timeout`
    /// without progress.
    pub(super) fn delivered(
        &mut self,
        i: usize,
        taken: u64,
        idle_timeout: Duration,
    ) -> Result<(), Fault> {
        let mut last = None;
        let mut last_move = Instant::now();
        let mut wait = Duration::from_micros(250);
        loop {
            let counts = self.sample()?;
            let way = &self.ways[i];
            if way.done {
                return Ok(());
            }
            // Nothing else writes to the destination yet: once the program
            // stopped, it gets exactly what the program took.
            let sent = way.sent(&counts[1 - i]);
            if sent > taken {
                return Err(doubled(i, sent, taken));
            }
            if sent == taken {
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
}

/// The fault of a direction `i` that handed on `sent` bytes having
/// received `taken` (fewer), with its one warning: the stream is broken,
/// and both peers get a reset.
fn doubled(i: usize, sent: u64, taken: u64) -> Fault {
    let side = ["client", "backend"][i];
    log::warn!(
        "kernel relay: the kernel sent {} bytes more than the {side} sent \
         ({sent} sent, {taken} received); the connection ends with a reset",
        sent - taken
    );
    Fault::broken(i, "bytes doubled by the kernel in the relay")
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
            // Streaming: look again (and raise the limits) before the
            // backlog could reach the program's limit at the rate just
            // seen, so that a reader that keeps up is never taken for a
            // slow one.
            let rate = moved as f64 / elapsed.as_secs_f64().max(1e-6);
            let room = BACKLOG_BOUND.saturating_sub(backlog) as f64;
            self.check = Duration::from_secs_f64(room / rate / 4.0).clamp(MIN_CHECK, MAX_CHECK);
            self.check
        } else {
            // Quiet: less and less often, down to once a second.
            self.check = (self.check * 2).min(MAX_IDLE_CHECK);
            self.check
        }
    }
}
