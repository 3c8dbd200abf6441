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
//! A connection back from the relay is guarded ([`guard`]): each round
//! checks that no direction handed its destination more bytes than its
//! source received (the kernel's redirect has been seen to send a segment
//! twice, late), and a direction's end is passed on only after that
//! check, then checked once more with the FIN counted.
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

/// With `kernel_relay_after` 0, the hand-over from the start: before the
/// first byte is read, so that a peer that answers at once finds both
/// sockets on the kernel path. Nothing (two tests) otherwise.
#[inline]
pub(super) fn from_start(
    conduits: &Conduits,
    halves: [&mut Half; 2],
    story: &mut Story,
    sockets: [&TcpStream; 2],
    options: &PumpOptions,
    transfer: &mut Transfer,
) -> Option<Ended> {
    if !options.promote || options.promote_after != 0 {
        return None;
    }
    promote(conduits, halves, story, sockets, options, transfer, [0; 2])
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
        Relayed::Back { kept, bases } => {
            crate::connections::mode(crate::connections::Mode::Copy);
            // Every byte taken was delivered: the copy pump starts over
            // from empty buffers, reading what the sockets hold (kept on
            // them by the program when they stay in its maps), and
            // watches what the kernel may still do (`guard`).
            *up = Half::new();
            *down = Half::new();
            (up.guarded, down.guarded) = (true, true);
            story.kept = kept;
            story.guard = Some(Box::new(bases));
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

/// [`guard`] for a connection back from the kernel relay; nothing (one
/// test of a pointer) for the others.
#[inline]
pub(super) fn guarded(
    story: &mut Story,
    halves: [&mut Half; 2],
    sockets: [&TcpStream; 2],
) -> Option<Ended> {
    story.guard.as_ref()?;
    guard(story, halves, sockets)
}

/// After the kernel relay, each round: whether a direction handed its
/// destination more bytes than its source received (the kernel sending a
/// segment twice, late: `kernel_relay::Bases::doubled`), which ends the
/// connection with a reset to both peers, as the relay does; then the end
/// of stream a guarded half owes is passed on, after that check, so that
/// a peer never gets a whole-looking end of a doubled stream.
#[cold]
#[inline(never)]
pub(super) fn guard(
    story: &mut Story,
    halves: [&mut Half; 2],
    sockets: [&TcpStream; 2],
) -> Option<Ended> {
    let bases = **story.guard.as_ref()?;
    let sides = [Side::Client, Side::Backend];
    for (i, half) in halves.into_iter().enumerate() {
        if half.stopped || (half.done && !half.owed) {
            continue;
        }
        let mut doubled = bases.doubled(i, sockets, false);
        if doubled.is_none() && std::mem::take(&mut half.owed) {
            match sockets[1 - i].shutdown(std::net::Shutdown::Write) {
                // Once more with the FIN counted: a segment sent twice
                // since the check is in the count now (no byte can follow
                // the FIN); the other peer still learns it.
                Ok(()) => doubled = bases.doubled(i, sockets, true),
                Err(e) if e.kind() == std::io::ErrorKind::NotConnected => {}
                Err(e) => {
                    story.fault(sides[1 - i].write_failed(&e), Some(e));
                    half.stop();
                }
            }
        }
        if let Some(error) = doubled {
            story.fault(sides[i].read_failed(&error), Some(error));
            return Some(broken_end(story, sockets[i]));
        }
    }
    None
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::kernel_relay::Bases;
    use crate::proxy::pump::End;
    use crate::test_support::pair;
    use std::io::{Read, Write};
    use std::time::Duration;

    /// A guarded pump's two halves (back from the kernel relay) and its
    /// story, the sockets' counts as they stand for bases.
    fn guarded(client_end: &TcpStream, backend_end: &TcpStream) -> (Story, [Half; 2]) {
        let mut story = Story::default();
        story.guard = Some(Box::new(Bases::now([client_end, backend_end])));
        let (mut up, mut down) = (Half::new(), Half::new());
        (up.guarded, down.guarded) = (true, true);
        (story, [up, down])
    }

    /// The pump's work, by hand: five bytes read from the client and
    /// written to the backend, then the client's end owed by `up`.
    fn hello_then_owed(client: &mut TcpStream, mut ends: [&TcpStream; 2], up: &mut Half) {
        client.write_all(b"hello").unwrap();
        let mut hello = [0u8; 5];
        ends[0].read_exact(&mut hello).unwrap();
        ends[1].write_all(&hello).unwrap();
        (up.done, up.owed) = (true, true);
    }

    /// After the kernel relay, the pump's guard: a direction that handed
    /// on what its source received gets the end of stream its half owes,
    /// after the check; one that handed on more (what the kernel's late
    /// doubled segment does) ends the connection with a reset to both
    /// peers, the source's armed (`SO_LINGER` 0), and the end told as
    /// that source's reset.
    #[test]
    fn the_guard_after_the_relay_passes_a_whole_end_and_resets_a_doubled_stream() {
        let (mut client, client_end) = pair();
        let (backend_end, mut backend) = pair();
        let (mut story, [mut up, mut down]) = guarded(&client_end, &backend_end);
        hello_then_owed(&mut client, [&client_end, &backend_end], &mut up);
        let sockets = [&client_end, &backend_end];
        assert!(guard(&mut story, [&mut up, &mut down], sockets).is_none());
        assert!(!up.owed, "the owed end of stream was not passed on");
        let mut got = Vec::new();
        backend.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"hello");

        let (mut client, client_end) = pair();
        let (backend_end, _backend) = pair();
        let (mut story, [mut up, mut down]) = guarded(&client_end, &backend_end);
        let sockets = [&client_end, &backend_end];
        assert!(guard(&mut story, [&mut up, &mut down], sockets).is_none());
        // Three bytes reach the client's socket that the backend never sent.
        (&client_end).write_all(b"abc").unwrap();
        let Some((end, error, _, no_shutdown)) = guard(&mut story, [&mut up, &mut down], sockets)
        else {
            panic!("bytes handed on beyond those received went unseen");
        };
        assert_eq!(end, End::BackendReset);
        assert!(error
            .unwrap()
            .to_string()
            .contains("after the kernel relay"));
        assert_eq!(no_shutdown, [true; 2]);
        let linger = socket2::SockRef::from(&backend_end).linger().unwrap();
        assert_eq!(
            linger,
            Some(Duration::ZERO),
            "the source's reset is not armed"
        );
        let mut abc = [0u8; 3];
        client.read_exact(&mut abc).unwrap();
    }

    /// After the kernel relay, a backend that resets just as the guard is
    /// to pass on the client's owed end: the destination's counts after
    /// the reset are no doubled stream (no false alarm, no reset told as
    /// the kernel's), and the end is not owed twice; the pump meets the
    /// reset itself at its next read.
    #[test]
    fn a_backend_reset_before_the_owed_end_is_no_doubled_stream() {
        let (mut client, client_end) = pair();
        let (backend_end, backend) = pair();
        let (mut story, [mut up, mut down]) = guarded(&client_end, &backend_end);
        hello_then_owed(&mut client, [&client_end, &backend_end], &mut up);
        socket2::SockRef::from(&backend)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(backend);
        // The reset has arrived once a read on the backend's socket says so.
        let mut buf = [0u8; 1];
        let _ = (&backend_end).read(&mut buf);
        let sockets = [&client_end, &backend_end];
        let ended = guard(&mut story, [&mut up, &mut down], sockets);
        if let Some((_, error, _, _)) = ended {
            panic!("a reset taken for a doubled stream: {error:?}");
        }
        assert!(!up.owed, "the end is still owed after the guard");
        assert!(guard(&mut story, [&mut up, &mut down], sockets).is_none());
    }
}
