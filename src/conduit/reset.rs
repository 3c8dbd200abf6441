//! A reset passed on: when one peer resets the connection before its end
//! of stream, the other peer is not sent an end of stream (a FIN, which a
//! client reading to the end takes for a complete reply) but a reset too,
//! once the bytes already received from the first have reached it as far
//! as they can. As talking to the peer directly: the bytes, then
//! `ECONNRESET`.
//!
//! The pump ends as it always did ([`End::BackendReset`],
//! [`End::ClientReset`]); then `deliver`, the connection still counted
//! active, waits until the other socket's send queue has been taken by its
//! peer (a close with a reset drops what the queue still holds), and
//! [`close`] ends the connection: that socket with `SO_LINGER` 0 and no
//! shutdown, so that its close sends the reset; everything else the
//! article's way, less the shutdowns that could only fail. Any other
//! end costs nothing here but a comparison.
//!
//! # Threads
//!
//! The worker thread that served the connection.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C `exit()`s on any error. Its final
//! `shutdown(SHUT_RDWR)` then `close()` is [`close`]'s ordinary path.

use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::thread;
use std::time::{Duration, Instant};

use socket2::SockRef;

use super::outcome::End;

/// The first pause between two looks at a send queue being taken; it
/// doubles up to [`MAX_PAUSE`]. On loopback a reading peer takes 200 KB
/// well within the first.
const FIRST_PAUSE: Duration = Duration::from_micros(200);

/// The longest pause between two looks.
const MAX_PAUSE: Duration = Duration::from_millis(20);

/// The socket whose peer must learn of the other peer's reset: the
/// client's (0) when the backend reset, the backend's (1) when the client
/// did; none for any other end.
fn toward(end: End) -> Option<usize> {
    match end {
        End::BackendReset => Some(0),
        End::ClientReset => Some(1),
        _ => None,
    }
}

/// Makes `socket`'s close send a reset (`SO_LINGER` 0), for a close with
/// no shutdown before it; whether it took.
pub(crate) fn arm(socket: &TcpStream) -> bool {
    SockRef::from(socket)
        .set_linger(Some(Duration::ZERO))
        .is_ok()
}

/// After a peer's reset, waits until what the other socket (of
/// `[client, backend]`) still holds toward its own peer (the bytes
/// received from the one that reset) has been taken, or until none was
/// taken for `patience` (the fin timeout: one side is gone, the other
/// stays silent). Nothing for any other end.
#[inline]
pub(crate) fn deliver(end: End, sockets: [&TcpStream; 2], patience: Duration) {
    if let Some(i) = toward(end) {
        drain(sockets[i], patience);
    }
}

/// Waits until `socket`'s send queue is empty (every byte acknowledged:
/// `SIOCOUTQ` 0), the socket is gone, or nothing moved for `patience`.
/// There is no `poll(2)` event for an empty send queue: it is looked at,
/// less and less often, only on this path.
#[cold]
#[inline(never)]
fn drain(socket: &TcpStream, patience: Duration) {
    // The connections' table shows it closing while it lingers here.
    crate::connections::phase(crate::connections::Phase::Closing);
    // Whatever a "more is coming" write (`MSG_MORE`) left waiting leaves
    // now, as the pump's uncork does.
    let _ = socket.set_nodelay(true);
    let Some(mut left) = unacknowledged(socket) else {
        return;
    };
    let mut last_move = Instant::now();
    let mut pause = FIRST_PAUSE;
    while left > 0 {
        thread::sleep(pause);
        pause = (pause * 2).min(MAX_PAUSE);
        let Some(now) = unacknowledged(socket) else {
            return;
        };
        if now < left {
            last_move = Instant::now();
        } else if last_move.elapsed() >= patience {
            return;
        }
        left = now;
    }
}

/// Bytes in `socket`'s send queue, sent or not, not yet acknowledged
/// (`SIOCOUTQ`); `None` when it cannot be read.
fn unacknowledged(socket: &TcpStream) -> Option<u64> {
    let mut outq: libc::c_int = 0;
    // SAFETY: SIOCOUTQ (TIOCOUTQ's number) writes one int to the pointer.
    let ret = unsafe { libc::ioctl(socket.as_raw_fd(), libc::TIOCOUTQ, &mut outq) };
    (ret == 0).then_some(outq.max(0) as u64)
}

/// Closes both sockets of a connection the pump is done with: the
/// article's `shutdown(SHUT_RDWR)` on each (dropping them then closes
/// them), except
///
/// - the one whose peer must learn of the other's reset (`end`, see
///   `deliver`): no shutdown, whose FIN that peer would take for an
///   ordinary end, but `SO_LINGER` 0, so that its close sends a reset;
/// - those the pump found nothing to shut in (`no_shutdown`, client then
///   backend, see [`Pumped::no_shutdown`](super::outcome::Pumped)): read
///   to their end of stream, their `close(2)` sends the FIN if none went
///   yet, as the shutdown would; reset by their peer, the shutdown could
///   only fail. After a clean end both FINs have passed and each shutdown
///   would fail with `ENOTCONN`: two system calls fewer per connection.
#[inline(never)]
pub fn close(client: &TcpStream, backend: &TcpStream, end: End, no_shutdown: [bool; 2]) {
    let reset = toward(end);
    for (i, socket) in [(1, backend), (0, client)] {
        if reset == Some(i) && arm(socket) {
            continue;
        }
        if !no_shutdown[i] {
            let _ = socket.shutdown(Shutdown::Both);
        }
    }
}
