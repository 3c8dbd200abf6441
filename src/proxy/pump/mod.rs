//! The duplex pump: moves the bytes of one connection both ways until both
//! sides are done, without ever blocking on either socket.
//!
//! Each direction has one buffer (4096 bytes by default) or, with
//! `--splice` ([`splice_pump`]), one pipe: filled by one read, emptied by
//! as many non-blocking writes as the destination accepts, and both
//! sockets waited on with one `poll(2)`. End of stream is passed on as a
//! half-close, a failed write stops only its own direction, and the
//! connection's [`End`] comes back with its exact [`Transfer`]. A peer's
//! reset before its end of stream reaches the other peer as a reset, after
//! the bytes received from the first (`reset`: `deliver`, [`close`]).
//! Why each
//! rule (no `write_all`, `MSG_MORE`, turns of [`TURN_BYTES`], idle buffers
//! handed back, `--yield-before-poll`): docs/moving-bytes.md, "The pump".
//! `half` holds one direction and its step, `wait` the `poll(2)` side,
//! `bucket` a direction's bandwidth cap, `carry` the connection offered
//! to a new process (`upgrade_socket`) and taken in, `promote` the hand-over to the
//! kernel relay, `interim` the access log's lines while it lives.
//!
//! # Threads
//!
//! Runs on the worker thread that serves the connection, with that
//! thread's own buffers or pipes; nothing is shared or locked.
//!
//! # Corresponds to the C article
//!
//! The copy loop of `proxy_function()`, which reads one chunk, cuts it at
//! the first zero byte and `exit()`s on any error (docs/c-to-rust.md). The
//! final `shutdown(SHUT_RDWR)` then `close()` on both sockets is the C's,
//! less the shutdowns that could only fail ([`close`]).

use std::io;
use std::net::TcpStream;
use std::time::Instant;

use super::conduit::{Buffers, Conduits, Pipe, BUFFERS, PIPES, RELEASE_AFTER};
pub use crate::conduit::outcome::{End, PumpOptions, Pumped, Transfer, TURN_BYTES};
use crate::poll::{millis, poll};
use half::{step_both, uncork_both, Half, Story};
use wait::{interest, learn, wait, watch, WaitFor, Yielder};

pub use crate::conduit::reset::close;
pub(crate) use crate::conduit::reset::deliver;

mod bucket;
mod carry;
mod half;
pub mod interim;
mod promote;
#[cfg(test)]
mod tests;
mod wait;

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
/// returned [`Pumped`], with the byte counts of what was moved up to then.
///
/// The end of stream of the direction that ends last is not passed on
/// here but by closing the sockets, which the caller does at once
/// ([`close`], then dropping them): a `shutdown` first would be one system
/// call more per connection.
pub fn pump(
    client: &TcpStream,
    backend: &TcpStream,
    buffer_size: usize,
    options: &PumpOptions,
) -> Pumped {
    pump_from(client, backend, buffer_size, options, None)
}

/// [`pump`], going on from where the process that handed the connection
/// over left it (`resumed`: the bytes waiting each way, the ends already
/// seen, the counters), when given. Its buffers hold at least what each
/// direction carries.
pub fn pump_from(
    client: &TcpStream,
    backend: &TcpStream,
    buffer_size: usize,
    options: &PumpOptions,
    resumed: Option<&crate::connections::carry::State>,
) -> Pumped {
    let size = resumed.map_or(buffer_size, |s| {
        buffer_size.max(s.up.bytes.len()).max(s.down.bytes.len())
    });
    BUFFERS.with(|cell| {
        let mut cached = cell.borrow_mut();
        let buffers = match &mut *cached {
            Some(b) if b.size == size.max(1) => b,
            slot => match Buffers::new(size) {
                Ok(b) => slot.insert(b),
                Err(e) => return Pumped::failed(e),
            },
        };
        let mut transfer = Transfer::default();
        let (end, error, _, no_shutdown) = pump_with(
            &mut Conduits::Buffers(buffers),
            [client, backend],
            options,
            &mut transfer,
            resumed,
        );
        deliver(end, [client, backend], options.fin_timeout);
        Pumped {
            transfer,
            end,
            error,
            no_shutdown,
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
pub fn splice_pump(client: &TcpStream, backend: &TcpStream, options: &PumpOptions) -> Pumped {
    // splice(2) honours SPLICE_F_NONBLOCK on the pipe side only: the
    // sockets themselves must be non-blocking.
    if let Err(e) = client
        .set_nonblocking(true)
        .and_then(|()| backend.set_nonblocking(true))
    {
        return Pumped::failed(e);
    }
    PIPES.with(|cell| {
        let mut cached = cell.borrow_mut();
        let pipes = match &mut *cached {
            Some(p) => p,
            slot => match Pipe::new().and_then(|up| Ok([up, Pipe::new()?])) {
                Ok(p) => slot.insert(p),
                Err(e) => return Pumped::failed(e),
            },
        };
        let mut transfer = Transfer::default();
        let (end, error, stale, no_shutdown) = pump_with(
            &mut Conduits::Pipes(pipes),
            [client, backend],
            options,
            &mut transfer,
            None,
        );
        if stale {
            *cached = None;
        }
        deliver(end, [client, backend], options.fin_timeout);
        Pumped {
            transfer,
            end,
            error,
            no_shutdown,
        }
    })
}

/// What [`pump_with`] returns: the end, its error, whether a buffer or
/// pipe was left holding bytes (dropped by a stopped direction), and the
/// sockets (client, backend) the close need not shut down
/// ([`Pumped::no_shutdown`]).
type Ended = (End, Option<io::Error>, bool, [bool; 2]);

/// The pump's loop: each round gives both directions their turn, notes
/// their ends, hands the connection to the kernel relay when it is due,
/// then waits for either socket ([`look`]) unless a half can go on at once.
fn pump_with(
    conduits: &mut Conduits,
    [client, backend]: [&TcpStream; 2],
    options: &PumpOptions,
    transfer: &mut Transfer,
    resumed: Option<&crate::connections::carry::State>,
) -> Ended {
    // Client to backend, backend to client: new, or as carried in.
    let [mut up, mut down] = carry::halves(conduits, options, resumed, transfer);
    let mut story = Story::default();
    let mut limits = Limits::of(options);
    let mut interim = interim::take();
    let (halves, sockets) = ([&mut up, &mut down], [client, backend]);
    if let Some(ended) =
        promote::from_start(conduits, halves, &mut story, sockets, options, transfer)
    {
        return ended;
    }
    loop {
        // Between two rounds every byte is in a buffer or a socket: a
        // hand-over may take the connection here (one relaxed load).
        if let Some(ended) = carry::if_asked(conduits, &up, &down, transfer, story.kept) {
            return ended;
        }
        let (up_before, down_before) = (transfer.to_backend, transfer.to_client);
        step_both(
            conduits, &mut up, &mut down, client, backend, transfer, &mut story,
        );
        let (halves, sockets) = ([&mut up, &mut down], [client, backend]);
        if let Some(ended) = promote::guarded(&mut story, halves, sockets) {
            return ended;
        }
        told(transfer, [up_before, down_before], &up, &down);
        if up.eof {
            story.closed(End::ClientClosed);
        }
        if down.eof {
            story.closed(End::BackendClosed);
        }
        if up.finished() && down.finished() {
            return finish(story, &up, &down, false);
        }
        uncork_both(&mut up, &mut down, client, backend, &mut story);
        if options.promote {
            let before = [up_before, down_before];
            let sockets = [client, backend];
            let halves = [&mut up, &mut down];
            let kernel = promote::promote(
                conduits, halves, &mut story, sockets, options, transfer, before,
            );
            if let Some(ended) = kernel {
                return ended;
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
        let moved = transfer.to_backend + transfer.to_client > up_before + down_before;
        let halves = [&mut up, &mut down];
        let lines = interim.as_deref_mut().map(|i| (i, &*transfer));
        let looked = look(
            conduits,
            halves,
            [client, backend],
            &mut limits,
            (busy, moved),
            lines,
        );
        if let Err(fault) = looked {
            story.fault(fault.end, fault.error);
            return finish(story, &up, &down, fault.stale);
        }
    }
}

/// A round told: to the trace, and to the connections' table when bytes
/// moved (relaxed stores, once a round). Not inlined: the pump's frame
/// stays as small as its own state, whatever the compiler decides
/// elsewhere (the idle worker's stack, docs/internals.md).
#[inline(never)]
fn told(transfer: &Transfer, before: [u64; 2], up: &Half, down: &Half) {
    let (to_backend, to_client) = (transfer.to_backend, transfer.to_client);
    let moved = [to_backend - before[0], to_client - before[1]];
    crate::trace::pumped(moved[0], moved[1], up.done, down.done);
    if moved != [0, 0] {
        crate::connections::moved(to_backend, to_client);
    }
}

/// The pump's waits, in milliseconds, read once per connection, and the
/// state of its yields.
struct Limits {
    idle_ms: i32,
    fin_ms: i32,
    release_ms: i32,
    yielder: Yielder,
}

impl Limits {
    fn of(options: &PumpOptions) -> Limits {
        Limits {
            idle_ms: millis(options.idle_timeout),
            fin_ms: millis(options.fin_timeout),
            release_ms: millis(RELEASE_AFTER),
            yielder: Yielder::new(options.yield_before_poll),
        }
    }
}

/// Why a [`look`] ended the connection.
struct Stop {
    end: End,
    error: Option<io::Error>,
    /// A conduit may hold bytes (the pump's own `poll` failed mid-way).
    stale: bool,
}

/// Waits for either socket (or, while a half is `busy`, only looks
/// without waiting, so that the waiting half learns what became ready),
/// and tells the halves what became ready. `moved`: this round moved
/// bytes (for `yield_before_poll`). `lines`: the access log's interim
/// lines, told while waiting. `Err`: the silence allowed passed, or
/// `poll` failed.
#[inline]
fn look(
    conduits: &mut Conduits,
    [up, down]: [&mut Half; 2],
    [client, backend]: [&TcpStream; 2],
    limits: &mut Limits,
    (busy, moved): (bool, bool),
    lines: Option<(&mut interim::Interim, &Transfer)>,
) -> Result<(), Stop> {
    // Once one side has closed (or one direction has stopped), the
    // silence allowed is the fin timeout.
    let half_closed = up.eof || down.eof || up.stopped || down.stopped;
    let silence_ms = if half_closed {
        limits.fin_ms
    } else {
        limits.idle_ms
    };
    let (timeout_ms, for_tokens) = wait_limit(up, down, silence_ms);
    let mut fds = [
        watch(client, interest(up, down)),
        watch(backend, interest(down, up)),
    ];
    let ready = if busy {
        poll(&mut fds, 0)
    } else {
        // After moved bytes, the answer may come while the CPU is given
        // away once (`yield_before_poll`: the connection's `Yielder` decides).
        let answered = if moved {
            limits.yielder.first(&mut fds)
        } else {
            Ok(0)
        };
        match answered {
            Ok(0) => {
                let how = WaitFor {
                    timeout_ms,
                    release_ms: limits.release_ms,
                    idle: !up.pending() && !down.pending(),
                };
                match lines {
                    None => wait(&mut fds, conduits, how),
                    Some((lines, transfer)) => {
                        interim::wait_for(&mut fds, conduits, how, lines, transfer)
                    }
                }
            }
            answered => answered,
        }
    };
    match ready {
        // A signal: a hand-over may ask for this connection (see `carry`).
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
        Err(e) => Err(Stop {
            end: End::Error,
            error: Some(e),
            stale: true,
        }),
        Ok(0) if for_tokens => Ok(()),
        Ok(0) if !busy => Err(Stop {
            end: if half_closed {
                End::FinTimeout
            } else {
                End::IdleTimeout
            },
            error: None,
            stale: false,
        }),
        Ok(_) => {
            learn(&fds, up, down);
            Ok(())
        }
    }
}

/// The wait before the next look: `silence_ms`, or, while a capped
/// direction is out of tokens, the time until they are back (then `true`:
/// that wait ending is no sign of silence, since it is the cap that holds
/// the bytes back; it is at most a second, a bucket's refill). Uncapped,
/// two flags read and nothing more.
#[inline]
fn wait_limit(up: &mut Half, down: &mut Half, silence_ms: i32) -> (i32, bool) {
    if !(up.throttled || down.throttled) {
        return (silence_ms, false);
    }
    match tokens_back(up, down) {
        Some(ms) => (ms, true),
        None => (silence_ms, false),
    }
}

/// Gives back the reads of throttled halves whose tokens are back; the
/// milliseconds until the first of the others gets its own, if any waits.
#[cold]
#[inline(never)]
fn tokens_back(up: &mut Half, down: &mut Half) -> Option<i32> {
    let now = Instant::now();
    match (up.refresh(now), down.refresh(now)) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The end `story` tells, its error, whether a conduit may hold bytes:
/// `stale`, or a half left holding some (dropped by a stopped direction),
/// and which sockets the close need not shut down: one read to its end of
/// stream (the client's by `up`, the backend's by `down`), or one whose
/// peer reset it (this pump says so only when a read or write on that
/// socket found `ECONNRESET` or `ECONNABORTED`). Not inlined, as
/// [`told`]: run once per connection, it need not sit in the loop's frame.
#[inline(never)]
fn finish(story: Story, up: &Half, down: &Half, stale: bool) -> Ended {
    let (end, error) = story.end();
    let stale = stale || up.start < up.end || down.start < down.end;
    let no_shutdown = [
        up.eof || end == End::ClientReset,
        down.eof || end == End::BackendReset,
    ];
    (end, error, stale, no_shutdown)
}
