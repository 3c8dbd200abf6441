//! Promotion to the kernel relay (`kernel_relay`): the copy pump counts a
//! connection's exchanges and, once it has made `kernel_relay_after` of
//! them, hands its two sockets to [`crate::proxy::kernel_relay`], which
//! moves the bytes in the kernel until the end. Short connections never
//! pay the hand-over's system calls; long, chatty ones stop waking the
//! worker for every message.
//!
//! An exchange is bytes toward the backend followed by bytes back toward
//! the client: a request and its reply. A connection is handed over only
//! between two rounds of the pump with both buffers empty, neither side
//! closed nor a direction stopped, and no rate on either direction (a
//! capped direction keeps its bucket on the copy pump). The splice pump
//! never promotes. When the kernel path cannot take the connection, or
//! gives it back (its backlog bound), the copy pump goes on with it, and
//! no second hand-over is tried. After the backlog bound the sockets stay
//! in the kernel's maps, their program keeping their bytes on them for
//! the pump to read; such a connection is not handed to a new process.
//!
//! Everything here is off the pump's usual path: the pump calls
//! [`promote`] only when the setting is on, and it is never inlined, so
//! the pump's own stack frame stays as it was.
//!
//! # Threads
//!
//! Runs on the worker thread that serves the connection; shares nothing.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::net::TcpStream;

use super::half::{Half, Side, Story};
use super::{End, Ended, PumpOptions, Transfer};
use crate::proxy::conduit::Conduits;
use crate::proxy::kernel_relay::{relay, Relayed};

/// Counts the exchange the last round may have completed (`before`: the
/// byte counts when it began) and, when the connection is due and ready,
/// hands it to the kernel relay. `Some`: the connection ended there;
/// `None`: the copy pump goes on.
#[cold]
#[inline(never)]
pub(super) fn promote(
    conduits: &Conduits,
    halves: [&mut Half; 2],
    story: &mut Story,
    sockets: [&TcpStream; 2],
    options: &PumpOptions,
    transfer: &mut Transfer,
    before: [u64; 2],
) -> Option<Ended> {
    if story.tried {
        return None;
    }
    if transfer.to_backend > before[0] {
        story.asked = true;
    }
    if transfer.to_client > before[1] && story.asked {
        story.exchanges = story.exchanges.saturating_add(1);
        story.asked = false;
    }
    let [up, down] = halves;
    if story.exchanges < options.promote_after || !ready(conduits, up, down) {
        return None;
    }
    hand_over(up, down, story, sockets, options, transfer)
}

/// Whether the connection can leave the copy pump now: buffers, both
/// directions open, no rate, no write waiting for `MSG_MORE`'s end.
fn ready(conduits: &Conduits, up: &Half, down: &Half) -> bool {
    let quiet = |h: &Half| {
        h.start == h.end && !h.eof && !h.done && !h.stopped && !h.corked && h.bucket.is_none()
    };
    matches!(conduits, Conduits::Buffers(_)) && quiet(up) && quiet(down)
}

/// Hands the sockets to the kernel relay and reads what came back: the
/// connection's end, or the copy pump going on from fresh halves.
fn hand_over(
    up: &mut Half,
    down: &mut Half,
    story: &mut Story,
    sockets: [&TcpStream; 2],
    options: &PumpOptions,
    transfer: &mut Transfer,
) -> Option<Ended> {
    let timeouts = [options.idle_timeout, options.fin_timeout];
    let mut moved = [0u64; 2];
    story.tried = true;
    crate::connections::mode(crate::connections::Mode::KernelRelay);
    let relayed = relay(
        sockets[0],
        sockets[1],
        timeouts,
        story.exchanges,
        &mut moved,
    );
    transfer.to_backend += moved[0];
    transfer.to_client += moved[1];
    crate::connections::moved(transfer.to_backend, transfer.to_client);
    match relayed {
        Relayed::NotTaken => {
            crate::connections::mode(crate::connections::Mode::Copy);
            return None;
        }
        Relayed::Back { kept } => {
            crate::connections::mode(crate::connections::Mode::Copy);
            // Every byte taken was delivered: the copy pump starts over
            // from empty buffers, reading what the sockets hold (kept on
            // them by the program when they stay in its maps).
            *up = Half::new();
            *down = Half::new();
            story.kept = kept;
            return None;
        }
        Relayed::Finished { client_first } => {
            story.closed(if client_first {
                End::ClientClosed
            } else {
                End::BackendClosed
            });
        }
        Relayed::TimedOut { half_closed } => {
            let end = if half_closed {
                End::FinTimeout
            } else {
                End::IdleTimeout
            };
            story.fault(end, None);
        }
        Relayed::Failed {
            socket,
            error,
            broken,
        } => {
            let end = match socket {
                Some(0) => Side::Client.read_failed(&error),
                Some(_) => Side::Backend.read_failed(&error),
                None => End::Error,
            };
            story.fault(end, Some(error));
            if let (true, Some(i)) = (broken, socket) {
                return Some(broken_end(story, sockets[i]));
            }
        }
    }
    let (end, error) = std::mem::take(story).end();
    // What the relay read of each socket is its own: both are shut the
    // article's way at the close.
    Some((end, error, false, [false; 2]))
}

/// The end of a connection whose stream the kernel broke, told as a reset
/// of `source` (the side whose bytes were lost or doubled): the other
/// side gets a reset at the close, as after a peer's reset, and `source`
/// gets one too (`SO_LINGER` 0 and no shutdown), so that neither peer
/// takes a cut or doubled stream for a whole one.
#[cold]
fn broken_end(story: &mut Story, source: &TcpStream) -> Ended {
    crate::conduit::reset::arm(source);
    let (end, error) = std::mem::take(story).end();
    (end, error, false, [true; 2])
}
