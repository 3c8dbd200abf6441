//! How the pump waits: what each socket is polled for, the `poll(2)` call,
//! what its answer tells each direction, and whether to give the CPU away
//! once before it (`yield_before_poll`: [`Yielder`], one per connection).
//!
//! # Threads
//!
//! Runs on the worker thread that serves the connection; shares nothing.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C blocks in `read()` on one socket at a time.

use std::io;
use std::net::TcpStream;
use std::os::unix::io::AsRawFd;

use super::half::Half;
use crate::poll::poll_once as poll;
use crate::proxy::conduit::Conduits;
use crate::units::Switch;

/// The credit a connection starts with: its first two rounds that moved
/// bytes yield whatever the peer turns out to be.
const FIRST_CREDIT: u8 = 2;

/// Most credit a connection's yields gather: after this many answers in a
/// row, as many empty looks in a row stop the yields.
const MAX_CREDIT: u8 = 8;

/// With no credit left, one round in this many that moved bytes tries a
/// yield again, in case the peer became quick.
const PROBE_EVERY: u16 = 128;

/// One connection's `yield_before_poll`: whether the pump gives the CPU
/// away once, then looks without waiting, before it sleeps in `poll` after
/// a round that moved bytes. Bytes just went out, so the other side is
/// probably about to answer (a backend's reply to the request just
/// forwarded, a client's next request after a reply). If the answer is
/// there after the yield, the sleep in `poll` and the wake-up that ends it
/// (the scheduler's two dearest paths on small messages) are skipped.
///
/// `Auto` yields while the answers come: each answer found after a yield
/// gains a credit (up to [`MAX_CREDIT`]), each empty look loses one. With
/// none left, one round in [`PROBE_EVERY`] tries again. A slow or distant
/// peer thus costs a few wasted yields at the start and one in 128 rounds
/// after. How long the CPU was away says nothing here: under load a yield
/// waits behind every thread ready to run (1.6 ms on average, measured with
/// 100 keep-alive clients on 2 cores, and the answer was there after 96 %
/// of them), and that wait is what spares the sleeps and the wake-ups.
/// `On` yields before every such wait, `Off` (the default) never.
///
/// The yield gives the CPU only to threads of the same scheduling group:
/// with the kernel's autogroups (a group per session) or cgroups, a peer
/// started apart (a service of its own, a container) does not run during
/// it, and the gain seen with the peer in the same group does not come
/// (docs/moving-bytes.md). Hence `Off` by default.
pub(super) struct Yielder {
    mode: Switch,
    credit: u8,
    rounds: u16,
}

impl Yielder {
    pub(super) fn new(mode: Switch) -> Yielder {
        Yielder {
            mode,
            credit: FIRST_CREDIT,
            rounds: 0,
        }
    }

    /// After a round that moved bytes: yields and looks without waiting,
    /// when the setting and the connection's credit say so; how many of
    /// `fds` are ready (0: none, or no yield, and the pump waits).
    pub(super) fn first(&mut self, fds: &mut [libc::pollfd; 2]) -> io::Result<usize> {
        if !self.wants() {
            return Ok(0);
        }
        // SAFETY: no arguments; on Linux it always succeeds.
        unsafe { libc::sched_yield() };
        let ready = poll(fds, 0)?;
        self.learn(ready > 0);
        Ok(ready)
    }

    /// Whether this round yields: the setting, the credit, or a probe due.
    fn wants(&mut self) -> bool {
        match self.mode {
            Switch::Off => false,
            Switch::On => true,
            Switch::Auto if self.credit > 0 => true,
            Switch::Auto => {
                self.rounds += 1;
                let probe = self.rounds >= PROBE_EVERY;
                if probe {
                    self.rounds = 0;
                }
                probe
            }
        }
    }

    /// Counts what one yield brought: the answer, or an empty look.
    fn learn(&mut self, answered: bool) {
        self.credit = if answered {
            (self.credit + 1).min(MAX_CREDIT)
        } else {
            self.credit.saturating_sub(1)
        };
    }
}

/// How [`wait`] waits.
pub(super) struct WaitFor {
    pub(super) timeout_ms: i32,
    pub(super) release_ms: i32,
    /// Nothing waits in either buffer (their pages may be given back).
    pub(super) idle: bool,
}

/// Waits for one of `fds` to be ready, at most `timeout_ms`; returns how
/// many are (0 at the timeout). A signal ends the wait
/// (`ErrorKind::Interrupted`): the pump looks whether a hand-over asks
/// for its connection, and waits again.
pub(super) fn wait(
    fds: &mut [libc::pollfd; 2],
    conduits: &mut Conduits,
    how: WaitFor,
) -> io::Result<usize> {
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

/// A `pollfd` for `socket`. A socket with nothing to wait for gets fd -1,
/// which `poll(2)` skips: otherwise a hang-up on it (always reported, even
/// when not asked for) would wake every call at once and spin the CPU.
pub(super) fn watch(socket: &TcpStream, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd: if events == 0 { -1 } else { socket.as_raw_fd() },
        events,
        revents: 0,
    }
}

/// Poll events for a socket that is the source of `from` and the destination
/// of `to`.
pub(super) fn interest(from: &Half, to: &Half) -> libc::c_short {
    let mut events = 0;
    if from.wants_read() {
        events |= libc::POLLIN;
    }
    if to.pending() {
        events |= libc::POLLOUT;
    }
    events
}

/// Marks ready what `poll` reported on `fds` (the client's, then the
/// backend's). Errors and hang-ups count as "ready": the next read or
/// write reports them (or the end of stream) precisely.
#[inline]
pub(super) fn learn(fds: &[libc::pollfd; 2], up: &mut Half, down: &mut Half) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Nothing to poll: a look without waiting finds nothing, at once.
    fn nothing() -> [libc::pollfd; 2] {
        [libc::pollfd {
            fd: -1,
            events: 0,
            revents: 0,
        }; 2]
    }

    /// How many of `rounds` rounds that moved bytes yielded, each yield
    /// quick and its look empty.
    fn yields_in(yielder: &mut Yielder, rounds: usize) -> usize {
        (0..rounds)
            .filter(|_| {
                let yields = yielder.wants();
                if yields {
                    yielder.learn(false);
                }
                yields
            })
            .count()
    }

    #[test]
    fn auto_stops_yielding_for_a_peer_that_never_answers_in_time() {
        let mut yielder = Yielder::new(Switch::Auto);
        // The two credits it starts with, then one probe in 128 rounds.
        assert_eq!(yields_in(&mut yielder, 2), 2);
        assert_eq!(yielder.credit, 0);
        assert_eq!(yields_in(&mut yielder, 127), 0);
        assert_eq!(yields_in(&mut yielder, 1), 1);
        assert_eq!(yields_in(&mut yielder, 1280), 10);
    }

    #[test]
    fn auto_keeps_yielding_while_answers_come() {
        let mut yielder = Yielder::new(Switch::Auto);
        for _ in 0..20 {
            assert!(yielder.wants());
            yielder.learn(true);
        }
        assert_eq!(yielder.credit, MAX_CREDIT);
        // One empty look in two still leaves credit: it keeps yielding.
        for _ in 0..50 {
            assert!(yielder.wants());
            yielder.learn(false);
            assert!(yielder.wants());
            yielder.learn(true);
        }
        // Empty looks in a row use the credit up: the peer became slow
        // (the ninth round is the first without a yield).
        assert_eq!(yields_in(&mut yielder, MAX_CREDIT as usize + 1), 8);
        assert_eq!(yielder.credit, 0);
        // A probe whose answer is there starts again.
        assert_eq!(yields_in(&mut yielder, PROBE_EVERY as usize - 2), 0);
        assert!(yielder.wants());
        yielder.learn(true);
        assert_eq!(yielder.credit, 1);
    }

    #[test]
    fn on_always_yields_and_off_never() {
        let mut on = Yielder::new(Switch::On);
        let mut off = Yielder::new(Switch::Off);
        let (mut fds_on, mut fds_off) = (nothing(), nothing());
        for _ in 0..300 {
            assert_eq!(on.first(&mut fds_on).unwrap(), 0);
            assert_eq!(off.first(&mut fds_off).unwrap(), 0);
        }
        // `On` learns like `Auto` but never stops: its credit ran out
        // long ago. `Off` never yielded, so it learned nothing.
        assert_eq!(on.credit, 0);
        assert_eq!(off.credit, FIRST_CREDIT);
    }
}
