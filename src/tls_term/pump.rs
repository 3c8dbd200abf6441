//! The TLS-aware pump: the plain pump's rules (never block, `poll(2)` on
//! both sockets, half-close passed on, idle and fin timeouts) with rustls
//! between the client's socket and the bytes.
//!
//! Client to backend: `read_tls` when the client's socket is readable,
//! `process_new_packets`, then the plain bytes from rustls's reader into
//! a buffer and on to the backend. The client's `close_notify` (or its
//! end of stream) becomes `shutdown(Write)` toward the backend.
//!
//! Backend to client: a read into a buffer, into rustls's writer, then
//! `write_tls` when the client's socket is writable. The backend's end of
//! stream becomes a `close_notify` to the client, then `shutdown(Write)`.
//!
//! Unlike the plain pump, any fault ends both directions: a TLS stream
//! that has failed cannot carry the other direction's bytes either.
//!
//! # Threads
//!
//! The worker thread serving the connection. The two buffers are its own
//! (16 KiB each, on the heap, made once per TLS connection): the plain
//! path's thread-local buffers are left alone.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;

use rustls::ServerConnection;

use crate::poll::{millis, poll};
use crate::proxy::pump::{End, Outcome, PumpOptions, Transfer, TURN_BYTES};

/// Bytes per read each way: one TLS record's worth of plain bytes.
const CHUNK: usize = 16 * 1024;

/// One direction's buffer: bytes `start..end` wait to be written.
struct Buf {
    bytes: Box<[u8]>,
    start: usize,
    end: usize,
}

impl Buf {
    fn new() -> Buf {
        Buf {
            bytes: vec![0; CHUNK].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    fn pending(&self) -> bool {
        self.start < self.end
    }
}

/// Where the connection stands.
struct State {
    up: Buf,
    down: Buf,
    /// The client said it is done (`close_notify`, or its end of stream).
    client_eof: bool,
    /// The backend was told (`shutdown(Write)`).
    up_done: bool,
    backend_eof: bool,
    /// `close_notify` queued for the client.
    close_sent: bool,
    /// Sent, and the client's socket shut for writing.
    down_done: bool,
    client_readable: bool,
    client_writable: bool,
    backend_readable: bool,
    backend_writable: bool,
    /// A direction used up its turn: go round again without waiting.
    busy: bool,
    first_close: Option<End>,
}

type Fault = (End, Option<io::Error>);

/// Moves the bytes of one terminated connection both ways until both
/// sides are done or nothing moves for the idle (or fin) timeout. Both
/// sockets are made non-blocking. Never fails: every end is an [`End`].
pub(crate) fn pump(
    conn: &mut ServerConnection,
    client: &TcpStream,
    backend: &TcpStream,
    options: &PumpOptions,
) -> Outcome {
    let mut transfer = Transfer::default();
    let (end, error) = match client
        .set_nonblocking(true)
        .and_then(|()| backend.set_nonblocking(true))
    {
        Ok(()) => run(conn, client, backend, options, &mut transfer),
        Err(e) => (End::Error, Some(e)),
    };
    Outcome {
        transfer,
        end,
        error,
    }
}

fn run(
    conn: &mut ServerConnection,
    client: &TcpStream,
    backend: &TcpStream,
    options: &PumpOptions,
    transfer: &mut Transfer,
) -> Fault {
    let mut s = State {
        up: Buf::new(),
        down: Buf::new(),
        client_eof: false,
        up_done: false,
        backend_eof: false,
        close_sent: false,
        down_done: false,
        client_readable: true,
        client_writable: true,
        backend_readable: true,
        backend_writable: true,
        busy: false,
        first_close: None,
    };
    let (idle_ms, fin_ms) = (millis(options.idle_timeout), millis(options.fin_timeout));
    loop {
        s.busy = false;
        if let Err(fault) = up(&mut s, conn, client, backend, &mut transfer.to_backend)
            .and_then(|()| down(&mut s, conn, client, backend, &mut transfer.to_client))
        {
            return fault;
        }
        if s.up_done && s.down_done {
            return (s.first_close.unwrap_or(End::ClientClosed), None);
        }
        let mut fds = [
            watch(
                client,
                (!s.client_eof && !s.up.pending() && !s.client_readable, libc::POLLIN),
                (conn.wants_write() && !s.client_writable, libc::POLLOUT),
            ),
            watch(
                backend,
                (!s.backend_eof && !s.down.pending() && !s.backend_readable, libc::POLLIN),
                (s.up.pending() && !s.backend_writable, libc::POLLOUT),
            ),
        ];
        let half_closed = s.client_eof || s.backend_eof;
        let timeout = match (s.busy, half_closed) {
            (true, _) => 0,
            (false, true) => fin_ms,
            (false, false) => idle_ms,
        };
        match poll(&mut fds, timeout) {
            Err(e) => return (End::Error, Some(e)),
            Ok(0) if !s.busy => {
                let end = if half_closed {
                    End::FinTimeout
                } else {
                    End::IdleTimeout
                };
                return (end, None);
            }
            Ok(_) => learn(&fds, &mut s),
        }
    }
}

/// A `pollfd` asking for the events whose condition holds (fd -1, skipped,
/// when none does).
fn watch(
    socket: &TcpStream,
    a: (bool, libc::c_short),
    b: (bool, libc::c_short),
) -> libc::pollfd {
    let events = if a.0 { a.1 } else { 0 } | if b.0 { b.1 } else { 0 };
    libc::pollfd {
        fd: if events == 0 { -1 } else { socket.as_raw_fd() },
        events,
        revents: 0,
    }
}

fn learn(fds: &[libc::pollfd; 2], s: &mut State) {
    const ANY: libc::c_short = libc::POLLERR | libc::POLLHUP;
    s.client_readable |= fds[0].revents & (libc::POLLIN | ANY) != 0;
    s.client_writable |= fds[0].revents & (libc::POLLOUT | ANY) != 0;
    s.backend_readable |= fds[1].revents & (libc::POLLIN | ANY) != 0;
    s.backend_writable |= fds[1].revents & (libc::POLLOUT | ANY) != 0;
}

/// A reset, or another failure, of `side`.
fn failed(error: io::Error, reset: End, other: End) -> Fault {
    let end = if super::handshake::is_gone(&error) {
        reset
    } else {
        other
    };
    (end, Some(error))
}

/// Client to backend, for at most one turn.
fn up(
    s: &mut State,
    conn: &mut ServerConnection,
    client: &TcpStream,
    backend: &TcpStream,
    moved: &mut u64,
) -> Result<(), Fault> {
    let turn_ends = *moved + TURN_BYTES;
    loop {
        while s.up.pending() && s.backend_writable {
            match (&mut &*backend).write(&s.up.bytes[s.up.start..s.up.end]) {
                Ok(n) => {
                    s.up.start += n;
                    *moved += n as u64;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => s.backend_writable = false,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(failed(e, End::BackendReset, End::WriteToBackendFailed)),
            }
        }
        if s.up.pending() || s.up_done {
            return Ok(());
        }
        if s.client_eof {
            s.up_done = true;
            s.first_close.get_or_insert(End::ClientClosed);
            return match backend.shutdown(Shutdown::Write) {
                Err(e) if e.kind() != ErrorKind::NotConnected => {
                    Err(failed(e, End::BackendReset, End::WriteToBackendFailed))
                }
                _ => Ok(()),
            };
        }
        if *moved >= turn_ends {
            s.busy = true;
            return Ok(());
        }
        match conn.reader().read(&mut s.up.bytes) {
            Ok(0) => s.client_eof = true,
            Ok(n) => (s.up.start, s.up.end) = (0, n),
            // Its end of stream without a close_notify: ended all the same.
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => s.client_eof = true,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if !s.client_readable {
                    return Ok(());
                }
                read_tls(s, conn, client)?;
            }
            Err(e) => return Err((End::Error, Some(e))),
        }
    }
}

/// One `read_tls` from the client and the records it brought.
fn read_tls(s: &mut State, conn: &mut ServerConnection, client: &TcpStream) -> Result<(), Fault> {
    let mut sock = client;
    match conn.read_tls(&mut sock) {
        Ok(0) => s.client_eof = true,
        Ok(_) => {
            if let Err(e) = conn.process_new_packets() {
                let _ = conn.write_tls(&mut sock);
                let error = io::Error::new(ErrorKind::InvalidData, e.to_string());
                return Err((End::Error, Some(error)));
            }
        }
        Err(e) if e.kind() == ErrorKind::WouldBlock => s.client_readable = false,
        Err(e) if e.kind() == ErrorKind::Interrupted => {}
        Err(e) => return Err(failed(e, End::ClientReset, End::Error)),
    }
    Ok(())
}

/// Backend to client, for at most one turn.
fn down(
    s: &mut State,
    conn: &mut ServerConnection,
    client: &TcpStream,
    backend: &TcpStream,
    moved: &mut u64,
) -> Result<(), Fault> {
    let turn_ends = *moved + TURN_BYTES;
    let mut sock = client;
    loop {
        while conn.wants_write() && s.client_writable {
            match conn.write_tls(&mut sock) {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => s.client_writable = false,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(failed(e, End::ClientReset, End::WriteToClientFailed)),
            }
        }
        if s.down_done {
            return Ok(());
        }
        if s.close_sent {
            if !conn.wants_write() {
                s.down_done = true;
                let _ = client.shutdown(Shutdown::Write);
            }
            return Ok(());
        }
        if s.down.pending() {
            let n = conn
                .writer()
                .write(&s.down.bytes[s.down.start..s.down.end])
                .map_err(|e| (End::Error, Some(e)))?;
            s.down.start += n;
            *moved += n as u64;
            if n == 0 && !s.client_writable {
                return Ok(());
            }
            continue;
        }
        if s.backend_eof {
            s.first_close.get_or_insert(End::BackendClosed);
            conn.send_close_notify();
            s.close_sent = true;
            continue;
        }
        if !s.backend_readable {
            return Ok(());
        }
        if *moved >= turn_ends {
            s.busy = true;
            return Ok(());
        }
        match (&mut &*backend).read(&mut s.down.bytes) {
            Ok(0) => s.backend_eof = true,
            Ok(n) => (s.down.start, s.down.end) = (0, n),
            Err(e) if e.kind() == ErrorKind::WouldBlock => s.backend_readable = false,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(failed(e, End::BackendReset, End::Error)),
        }
    }
}
