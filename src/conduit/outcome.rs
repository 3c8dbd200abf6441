//! What a pump is told and what it tells back, apart from the pumps
//! themselves so that every layer that speaks of a connection's end (the
//! access log, the TLS pump, the report) reads them from below: the
//! [`PumpOptions`] in, the [`Pumped`] out ([`Transfer`], [`End`]), and
//! the turn size [`TURN_BYTES`] both pumps share. The pumps are
//! [`mod@crate::proxy::pump`] (plain and splice) and `tls_term::pump`.
//!
//! # Threads
//!
//! Plain values, built and read on the worker thread that serves the
//! connection.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C's copy loop `exit()`s on any error and counts
//! nothing.

use std::fmt;
use std::io;
use std::time::Duration;

pub use crate::connections::Kill;

/// Bytes one direction may move in one turn before the other direction
/// gets its turn: 64 chunks of 4096 bytes, or four full pipes with
/// `--splice`. Small enough that the other direction never waits behind
/// more than a fraction of a millisecond of streaming; big enough that the
/// `poll` without waiting that may follow a turn (see [`pump`](crate::proxy::pump())) costs a
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
    /// Ended on purpose, and why (`DELETE /connections/{id}`, a backend's
    /// policy, the lifetime): whatever the pump saw after the shutdown.
    Killed(Kill),
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
            End::Killed(kill) => kill.word(),
        })
    }
}

/// What [`pump`](crate::proxy::pump()) and [`splice_pump`](crate::proxy::splice_pump) return.
#[derive(Debug)]
pub struct Pumped {
    /// The bytes moved, each successful write counted as it happened.
    pub transfer: Transfer,
    /// How it ended.
    pub end: End,
    /// The I/O error behind `end`, when there is one.
    pub error: Option<io::Error>,
    /// The sockets (client, backend) the close need not shut down first
    /// (see [`close`](crate::proxy::pump::close)): read to their end of
    /// stream (nothing is left unread in them, so their `close(2)` sends
    /// the FIN, if none went yet, as the shutdown would), or reset by their
    /// peer (closed by the kernel already: the shutdown could only fail
    /// with `ENOTCONN`). `false` where the pump does not know.
    pub no_shutdown: [bool; 2],
}

impl Pumped {
    pub(crate) fn failed(error: io::Error) -> Pumped {
        Pumped {
            transfer: Transfer::default(),
            end: End::Error,
            error: Some(error),
            no_shutdown: [false; 2],
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
    /// Yield once, then look without waiting, before a wait that follows
    /// moved bytes (`yield_before_poll`: `Auto` while it pays).
    pub yield_before_poll: crate::units::Switch,
    /// Most bytes a second read from the client (the service's upload
    /// rate); `None`: no cap.
    pub up_rate: Option<u64>,
    /// Most bytes a second read from the backend (the service's download
    /// rate); `None`: no cap.
    pub down_rate: Option<u64>,
    /// Hand the connection to the kernel relay once it has made
    /// [`promote_after`](Self::promote_after) exchanges (`kernel_relay`);
    /// the copy pump only, never the splice pump, and never with a rate.
    pub promote: bool,
    /// Exchanges (bytes toward the backend, then bytes back) before the
    /// hand-over (`kernel_relay_after`); 0: at once.
    pub promote_after: u32,
}
