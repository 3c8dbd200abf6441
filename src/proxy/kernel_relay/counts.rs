//! What the kernel relay knows of its two sockets: `TCP_INFO` and
//! `SIOCOUTQ` counters ([`Counts`]), one direction's bytes measured from
//! them ([`Way`]), and the small socket calls around them.
//!
//! # Threads
//!
//! Runs on the worker thread that owns the connection; shares nothing.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::io::{self, ErrorKind};
use std::mem;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::Duration;

/// `getsockopt(SOL_SOCKET, SO_COOKIE)`: the socket's unique 64-bit id.
const SO_COOKIE: libc::c_int = 57;

/// What `TCP_INFO` and `SIOCOUTQ` say of one socket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Counts {
    /// `tcpi_bytes_received`: bytes received in order (a FIN counts one).
    pub(super) received: u64,
    /// `tcpi_bytes_acked`: bytes sent and acknowledged (our SYN and FIN
    /// count one each).
    pub(super) acked: u64,
    /// `SIOCOUTQ`: bytes in the send queue, sent or not, not yet acked.
    pub(super) outq: u64,
    /// `tcpi_state`.
    pub(super) state: u8,
}

// `tcpi_state` values (the kernel's `TCP_*` states).
pub(super) const TCP_ESTABLISHED: u8 = 1;
pub(super) const TCP_TIME_WAIT: u8 = 6;
pub(super) const TCP_CLOSE: u8 = 7;
pub(super) const TCP_CLOSE_WAIT: u8 = 8;
pub(super) const TCP_LAST_ACK: u8 = 9;
pub(super) const TCP_CLOSING: u8 = 11;

impl Counts {
    pub(super) fn of(socket: &TcpStream) -> io::Result<Counts> {
        let fd = socket.as_raw_fd();
        // SAFETY: zero is a valid `tcp_info`; the kernel fills at most `len`.
        let mut info: libc::tcp_info = unsafe { mem::zeroed() };
        let mut len = mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        // SAFETY: `info` and `len` are valid for the call.
        let ret = unsafe {
            libc::getsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                &mut info as *mut libc::tcp_info as *mut libc::c_void,
                &mut len,
            )
        };
        if ret != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut outq: libc::c_int = 0;
        // SAFETY: SIOCOUTQ (TIOCOUTQ's number) writes one int.
        if unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut outq) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Counts {
            received: info.tcpi_bytes_received,
            acked: info.tcpi_bytes_acked,
            outq: outq.max(0) as u64,
            state: info.tcpi_state,
        })
    }

    /// The peer's FIN has arrived (it counts one in `received`).
    pub(super) fn fin_in(&self) -> bool {
        matches!(
            self.state,
            TCP_CLOSE_WAIT | TCP_LAST_ACK | TCP_CLOSING | TCP_TIME_WAIT | TCP_CLOSE
        )
    }

    /// Data bytes received since the start (FIN left out).
    pub(super) fn data_in(&self) -> u64 {
        self.received - u64::from(self.fin_in() && self.received > 0)
    }

    /// Bytes handed to this socket's send path since the start. Two calls
    /// make it (`TCP_INFO`, then `SIOCOUTQ`): an acknowledgement between
    /// them makes it short, never long; [`at_rest`] gives an exact one.
    pub(super) fn handed(&self) -> u64 {
        self.acked + self.outq
    }
}

/// One direction: bytes from `src` to `dst`.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Way {
    /// `src`'s [`Counts::data_in`] when the relay started.
    pub(super) in_base: u64,
    /// `dst`'s [`Counts::handed`] when the relay started (an active
    /// socket's SYN counts one there).
    pub(super) out_base: u64,
    /// The source's end of stream was seen.
    pub(super) eof: bool,
    /// It was passed on: `shutdown(SHUT_WR)` on the destination.
    pub(super) done: bool,
}

impl Way {
    /// Way `i` (from socket `i` to socket `1 - i`) as it starts from both
    /// sockets' counters taken at rest ([`at_rest`]) with the bytes each
    /// holds unread: those are still to be relayed, so they are not in
    /// the base.
    pub(super) fn at_rest(i: usize, counts: &[Counts; 2], unread: &[u64; 2]) -> Way {
        let data_in = counts[i].data_in();
        Way {
            in_base: data_in - unread[i].min(data_in),
            out_base: counts[1 - i].handed(),
            ..Way::default()
        }
    }

    pub(super) fn taken(&self, src: &Counts) -> u64 {
        src.data_in().saturating_sub(self.in_base)
    }

    pub(super) fn sent(&self, dst: &Counts) -> u64 {
        dst.handed().saturating_sub(self.out_base)
    }

    /// Bytes the kernel holds between the two.
    pub(super) fn backlog(&self, src: &Counts, dst: &Counts) -> u64 {
        self.taken(src).saturating_sub(self.sent(dst))
    }

    /// The one test of a doubled segment, for every check of it (the
    /// relay's, at its looks and after a FIN; the copy pump's guard after
    /// the relay): `(sent, received)` when the destination was handed more
    /// bytes than the source received, both since the bases. `fin`: the
    /// direction's end was just passed on, and counts one in the
    /// destination's count. A count can only be short (see
    /// [`Counts::handed`]), so more sent is never a false alarm once the
    /// source is read after the destination.
    pub(super) fn excess(&self, src: &Counts, dst: &Counts, fin: bool) -> Option<(u64, u64)> {
        let sent = self.sent(dst).saturating_sub(u64::from(fin));
        let received = self.taken(src);
        (sent > received).then_some((sent, received))
    }

    /// [`Way::excess`] read from the sockets now, `i` the source (0: the
    /// client): the destination first, as that order needs. `None` also
    /// when the source is closed (reset, or closed both ways: the pump or
    /// the next sample meets which).
    pub(super) fn excess_now(
        &self,
        i: usize,
        sockets: [&TcpStream; 2],
        fin: bool,
    ) -> io::Result<Option<(u64, u64)>> {
        let dst = Counts::of(sockets[1 - i])?;
        let src = Counts::of(sockets[i])?;
        if src.state == TCP_CLOSE {
            return Ok(None);
        }
        Ok(self.excess(&src, &dst, fin))
    }
}

/// The sockets' counters with the bytes each holds unread, taken at rest:
/// the unread counts are read between two samples that agree on the bytes
/// received, so no byte arrived in between, and on the bytes acknowledged,
/// so that the first sample's [`Counts::handed`] is exact (its two calls
/// saw the same acknowledgements: one that came between them would make
/// the sum short by what it acknowledged, and a base short by a reply
/// would read as that reply sent twice). The first sample is returned.
/// `None` when bytes or acknowledgements kept arriving for
/// [`START_TRIES`](super::START_TRIES) tries.
pub(super) fn at_rest<const N: usize>(
    sockets: [&TcpStream; N],
) -> io::Result<Option<([Counts; N], [u64; N])>> {
    for _ in 0..super::START_TRIES {
        let (mut first, mut left, mut then) =
            ([Counts::default(); N], [0; N], [Counts::default(); N]);
        for (i, socket) in sockets.iter().enumerate() {
            first[i] = Counts::of(socket)?;
        }
        for (i, socket) in sockets.iter().enumerate() {
            left[i] = unread(socket)?;
        }
        for (i, socket) in sockets.iter().enumerate() {
            then[i] = Counts::of(socket)?;
        }
        let still =
            |i: usize| (first[i].received, first[i].acked) == (then[i].received, then[i].acked);
        if (0..N).all(still) {
            return Ok(Some((first, left)));
        }
    }
    Ok(None)
}

/// Bytes received on `socket` and not yet read (`FIONREAD`).
pub(super) fn unread(socket: &TcpStream) -> io::Result<u64> {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int.
    if unsafe { libc::ioctl(socket.as_raw_fd(), libc::FIONREAD, &mut n) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n.max(0) as u64)
}

/// The socket's cookie (`SO_COOKIE`), its key in the maps.
pub(super) fn cookie(socket: &TcpStream) -> io::Result<u64> {
    let mut value = 0u64;
    let mut len = mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: `value` and `len` are valid for the call.
    let ret = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_COOKIE,
            &mut value as *mut u64 as *mut libc::c_void,
            &mut len,
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(value)
}

/// Bytes that were queued before the socket got the program wait for the
/// next segment; a non-blocking peek makes the kernel pass them through
/// the program now (it says `EAGAIN`, having found nothing left to peek).
pub(super) fn push_queued(socket: &TcpStream) {
    let mut byte = 0u8;
    // SAFETY: one byte of valid memory; the result is not needed.
    unsafe {
        libc::recv(
            socket.as_raw_fd(),
            &mut byte as *mut u8 as *mut libc::c_void,
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
}

/// `poll(2)` for at most `wait`; a signal just ends the wait early.
pub(super) fn poll(fds: &mut [libc::pollfd; 2], wait: Duration) -> io::Result<()> {
    let ms = i32::try_from(wait.as_millis().max(1)).unwrap_or(i32::MAX);
    // SAFETY: `fds` is a valid array of two pollfd for the whole call.
    let ret = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
    if ret < 0 {
        let err = io::Error::last_os_error();
        if err.kind() != ErrorKind::Interrupted {
            return Err(err);
        }
    }
    Ok(())
}
