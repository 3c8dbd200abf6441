//! The pump's side of a hand-over to a new process (`upgrade_socket`,
//! `connections::carry`): what a pump holds offered at a safe point (the
//! top of a wait, every byte either in a buffer or in a socket), and a
//! carried connection's state put back into a pump.
//!
//! # Threads
//!
//! Runs on the worker thread that serves the connection; the offer waits
//! for the upgrade thread's verdict.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use super::half::Half;
use super::{End, Ended, PumpOptions, Transfer};
use crate::connections::carry::{self, Pending, State};
use crate::connections::Kill;
use crate::proxy::conduit::{Conduit, Conduits};

/// [`offer`], when a hand-over asks for the connection (one relaxed load
/// otherwise). `kept`: the sockets are still in the kernel relay's maps
/// (`Story::kept`), which another process could not read them through.
#[inline]
pub(super) fn if_asked(
    conduits: &mut Conduits,
    up: &Half,
    down: &Half,
    transfer: &Transfer,
    kept: bool,
) -> Option<Ended> {
    if !carry::asked() {
        return None;
    }
    if kept {
        carry::decline();
        return None;
    }
    offer(conduits, up, down, transfer)
}

/// The pump's two halves, capped as `options` say: new, or as a carried
/// connection left them (`resumed`, its counters put in `transfer`).
pub(super) fn halves(
    conduits: &mut Conduits,
    options: &PumpOptions,
    resumed: Option<&State>,
    transfer: &mut Transfer,
) -> [Half; 2] {
    let mut up = Half::capped(options.up_rate);
    let mut down = Half::capped(options.down_rate);
    if let Some(state) = resumed {
        preload(conduits, [&mut up, &mut down], state, transfer);
    }
    [up, down]
}

/// Offers the connection when a hand-over asks: `Some` (its end,
/// `handed_over`, with no shutdown of either socket) when the new
/// process took it; `None` to pump on. A direction already stopped or
/// cut, or bytes inside a pipe, decline: such a connection ends in this
/// process.
#[cold]
#[inline(never)]
fn offer(conduits: &mut Conduits, up: &Half, down: &Half, transfer: &Transfer) -> Option<Ended> {
    let faulted = |h: &Half| h.stopped || h.cut;
    let (up_buf, down_buf) = conduits.halves();
    let pending = |h: &Half, conduit: &Conduit| match conduit {
        Conduit::Buffer(buf) => Some(Pending {
            bytes: buf[h.start..h.end].to_vec(),
            eof: h.eof,
            done: h.done,
        }),
        Conduit::Pipe(_) if h.start == h.end => Some(Pending {
            bytes: Vec::new(),
            eof: h.eof,
            done: h.done,
        }),
        Conduit::Pipe(_) => None,
    };
    let both = (pending(up, &up_buf), pending(down, &down_buf));
    let (Some(up_now), Some(down_now)) = both else {
        carry::decline();
        return None;
    };
    if faulted(up) || faulted(down) {
        carry::decline();
        return None;
    }
    let counts = [transfer.to_backend, transfer.to_client];
    carry::offer(up_now, down_now, counts).then_some((
        End::Killed(Kill::Carried),
        None,
        false,
        [true, true],
    ))
}

/// Puts a carried connection's state into a new pump: the bytes each way
/// in the buffers, the ends already seen, the counters. The buffers hold
/// at least as much as each direction carries (the caller made them so).
fn preload(
    conduits: &mut Conduits,
    [up, down]: [&mut Half; 2],
    state: &State,
    transfer: &mut Transfer,
) {
    let (up_buf, down_buf) = conduits.halves();
    for (half, conduit, pending) in [(up, up_buf, &state.up), (down, down_buf, &state.down)] {
        if let Conduit::Buffer(buf) = conduit {
            let n = pending.bytes.len().min(buf.len());
            buf[..n].copy_from_slice(&pending.bytes[..n]);
            half.start = 0;
            half.end = n;
        }
        half.eof = pending.eof;
        half.done = pending.done;
    }
    transfer.to_backend = state.to_backend;
    transfer.to_client = state.to_client;
}
