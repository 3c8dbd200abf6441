//! The TLS-aware pump: the plain pump's rules (never block, `poll(2)` on
//! both sockets, half-close passed on, idle and fin timeouts) with rustls
//! between a socket and its bytes, on the client's side (termination),
//! the backend's (re-encryption) or both.
//!
//! Each [`Side`] reads and writes plain bytes: a plain socket directly; a
//! TLS one through rustls (`read_tls` when the socket is readable,
//! `process_new_packets`, its reader; its writer, then `write_tls` when
//! the socket is writable). A side's end (its `close_notify`, or its end
//! of stream) is passed on to the other as `shutdown(Write)`, or as a
//! `close_notify` then `shutdown(Write)` once it has left.
//!
//! Unlike the plain pump, any fault ends both directions: a TLS stream
//! that has failed cannot carry the other direction's bytes either. A
//! peer's reset still reaches the other peer as a reset (no
//! `close_notify`, no FIN), after what was on its way to it
//! ([`salvage`], then the plain pump's `deliver` and `close`).
//!
//! # Threads
//!
//! The worker thread serving the connection. The two buffers (16 KiB
//! each) are the thread's, one mapping kept for every TLS connection it
//! serves, apart from the plain path's (whose size is the service's
//! `buffer_size`). Their pages go back to the kernel when the connection
//! has been idle for the plain pump's `RELEASE_AFTER` and when it ends,
//! and the stack pages the handshakes touched go back before the first
//! byte moves (`conduit/stack.rs`): an idle TLS connection keeps neither.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::cell::RefCell;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;

use rustls::Connection;

use crate::conduit::outcome::{End, PumpOptions, Pumped, Transfer, TURN_BYTES};
use crate::conduit::reset::deliver;
use crate::conduit::{Buffers, RELEASE_AFTER};
use crate::poll::{millis, poll};

/// Bytes per read each way: one TLS record's worth of plain bytes.
const CHUNK: usize = 16 * 1024;

thread_local! {
    /// This thread's TLS pump buffers, one per direction, kept for every
    /// TLS connection it serves.
    static BUFFERS: RefCell<Option<Buffers>> = const { RefCell::new(None) };
}

/// One direction's place in its buffer: bytes `start..end` wait to be
/// written.
#[derive(Default)]
struct Buf {
    start: usize,
    end: usize,
}

impl Buf {
    fn pending(&self) -> bool {
        self.start < self.end
    }
}

/// One socket of the connection, with its TLS session when it has one.
pub(crate) struct Side<'a> {
    sock: &'a TcpStream,
    tls: Option<&'a mut Connection>,
    /// Which side it is, for the ends its faults make.
    client: bool,
    readable: bool,
    writable: bool,
    /// It said it is done (`close_notify`, or its end of stream).
    eof: bool,
    /// Its `close_notify` is queued.
    closing: bool,
    /// We are done writing to it: `shutdown(Write)` made.
    shut: bool,
}

type Fault = (End, Option<io::Error>);

impl<'a> Side<'a> {
    /// The client's socket, `tls` when its TLS is terminated here.
    pub(crate) fn client(sock: &'a TcpStream, tls: Option<&'a mut Connection>) -> Side<'a> {
        Side::new(sock, tls, true)
    }

    /// The backend's socket, `tls` when it is re-encrypted.
    pub(crate) fn backend(sock: &'a TcpStream, tls: Option<&'a mut Connection>) -> Side<'a> {
        Side::new(sock, tls, false)
    }

    fn new(sock: &'a TcpStream, tls: Option<&'a mut Connection>, client: bool) -> Side<'a> {
        Side {
            sock,
            tls,
            client,
            readable: true,
            writable: true,
            eof: false,
            closing: false,
            shut: false,
        }
    }

    fn read_failed(&self, e: io::Error) -> Fault {
        let end = match (self.client, super::handshake::is_gone(&e)) {
            (true, true) => End::ClientReset,
            (false, true) => End::BackendReset,
            _ => End::Error,
        };
        (end, Some(e))
    }

    fn write_failed(&self, e: io::Error) -> Fault {
        let end = match (self.client, super::handshake::is_gone(&e)) {
            (true, true) => End::ClientReset,
            (false, true) => End::BackendReset,
            (true, false) => End::WriteToClientFailed,
            (false, false) => End::WriteToBackendFailed,
        };
        (end, Some(e))
    }

    fn wants_write(&self) -> bool {
        self.tls.as_ref().is_some_and(|c| c.wants_write())
    }

    /// Sends what rustls holds for the socket, while it takes it.
    fn flush(&mut self) -> Result<(), Fault> {
        let Some(conn) = self.tls.as_mut() else {
            return Ok(());
        };
        let mut sock = self.sock;
        while conn.wants_write() && self.writable {
            match conn.write_tls(&mut sock) {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => self.writable = false,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.write_failed(e)),
            }
        }
        Ok(())
    }

    /// Writes plain bytes; `Ok(0)`: none taken now (wait for writable).
    fn write_plain(&mut self, bytes: &[u8]) -> Result<usize, Fault> {
        let written = match self.tls.as_mut() {
            None if !self.writable => return Ok(0),
            None => (&mut &*self.sock).write(bytes),
            Some(conn) => conn.writer().write(bytes),
        };
        match written {
            Ok(n) => Ok(n),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                self.writable = false;
                Ok(0)
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => Ok(0),
            Err(e) => Err(self.write_failed(e)),
        }
    }

    /// Reads plain bytes: `Ok(None)` when none can come now, `Ok(Some(0))`
    /// at its end.
    fn read_plain(&mut self, buf: &mut [u8]) -> Result<Option<usize>, Fault> {
        loop {
            let Some(conn) = self.tls.as_mut() else {
                if !self.readable {
                    return Ok(None);
                }
                return match (&mut &*self.sock).read(buf) {
                    Ok(n) => Ok(Some(n)),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        self.readable = false;
                        Ok(None)
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) => Err(self.read_failed(e)),
                };
            };
            match conn.reader().read(buf) {
                Ok(n) => return Ok(Some(n)),
                // Its end of stream without a close_notify: ended all the same.
                Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(Some(0)),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return Err((End::Error, Some(e))),
            }
            if !self.readable {
                return Ok(None);
            }
            let mut sock = self.sock;
            match conn.read_tls(&mut sock) {
                Ok(0) => return Ok(Some(0)),
                Ok(_) => {
                    if let Err(e) = conn.process_new_packets() {
                        let _ = conn.write_tls(&mut sock);
                        let error = io::Error::new(ErrorKind::InvalidData, e.to_string());
                        return Err((End::Error, Some(error)));
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => self.readable = false,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.read_failed(e)),
            }
        }
    }

    /// Passes the other side's end on: `close_notify` first on TLS, then
    /// `shutdown(Write)` once everything has left.
    fn close_write(&mut self) -> Result<(), Fault> {
        if let Some(conn) = self.tls.as_mut() {
            if !self.closing {
                conn.send_close_notify();
                self.closing = true;
            }
            self.flush()?;
            if self.wants_write() {
                return Ok(());
            }
        }
        self.shut = true;
        match self.sock.shutdown(Shutdown::Write) {
            Err(e) if e.kind() != ErrorKind::NotConnected => Err(self.write_failed(e)),
            _ => Ok(()),
        }
    }

    /// Poll events for this socket: read when `more` (its direction wants
    /// bytes) and it said it has none; write when bytes wait for it.
    fn watch(&self, more: bool, toward: &Buf) -> libc::pollfd {
        let mut events = 0;
        if more && !self.eof && !self.readable {
            events |= libc::POLLIN;
        }
        if !self.writable && (self.wants_write() || (toward.pending() && !self.shut)) {
            events |= libc::POLLOUT;
        }
        libc::pollfd {
            fd: if events == 0 {
                -1
            } else {
                self.sock.as_raw_fd()
            },
            events,
            revents: 0,
        }
    }

    fn learn(&mut self, fd: &libc::pollfd) {
        const ANY: libc::c_short = libc::POLLERR | libc::POLLHUP;
        self.readable |= fd.revents & (libc::POLLIN | ANY) != 0;
        self.writable |= fd.revents & (libc::POLLOUT | ANY) != 0;
    }
}

/// Moves the bytes of one connection both ways until both sides are done
/// or nothing moves for the idle (or fin) timeout. Both sockets are made
/// non-blocking. Never fails: every end is an [`End`].
pub(crate) fn pump(mut client: Side<'_>, mut backend: Side<'_>, options: &PumpOptions) -> Pumped {
    crate::conduit::stack::trim();
    let mut transfer = Transfer::default();
    let (end, error) = match client
        .sock
        .set_nonblocking(true)
        .and_then(|()| backend.sock.set_nonblocking(true))
    {
        Ok(()) => BUFFERS.with(|cell| {
            let mut cached = cell.borrow_mut();
            let buffers = match &mut *cached {
                Some(b) => b,
                slot => match Buffers::new(CHUNK) {
                    Ok(b) => slot.insert(b),
                    Err(e) => return (End::Error, Some(e)),
                },
            };
            let ended = run(&mut client, &mut backend, buffers, options, &mut transfer);
            buffers.release();
            let sockets = [client.sock, backend.sock];
            deliver(ended.0, sockets, options.fin_timeout);
            ended
        }),
        Err(e) => (End::Error, Some(e)),
    };
    Pumped {
        transfer,
        end,
        error,
        // The TLS pump does not track it: each socket is shut as before.
        no_shutdown: [false; 2],
    }
}

fn run(
    client: &mut Side<'_>,
    backend: &mut Side<'_>,
    buffers: &mut Buffers,
    options: &PumpOptions,
    transfer: &mut Transfer,
) -> Fault {
    let (mut up, mut down) = (Buf::default(), Buf::default());
    let mut first_close = None;
    let (idle_ms, fin_ms) = (millis(options.idle_timeout), millis(options.fin_timeout));
    loop {
        let before = transfer.to_backend + transfer.to_client;
        let (up_bytes, down_bytes) = buffers.halves();
        let stepped =
            step(client, backend, &mut up, up_bytes, &mut transfer.to_backend).and_then(|b| {
                Ok(b | step(
                    backend,
                    client,
                    &mut down,
                    down_bytes,
                    &mut transfer.to_client,
                )?)
            });
        let busy = match stepped {
            Ok(busy) => {
                if transfer.to_backend + transfer.to_client != before {
                    // The connections' table: relaxed stores, once a round.
                    crate::connections::moved(transfer.to_backend, transfer.to_client);
                }
                busy
            }
            Err(fault) => {
                // A reset: what the peer that reset sent on its way to
                // the other leaves first, as far as it can.
                let (up_bytes, down_bytes) = buffers.halves();
                match fault.0 {
                    End::BackendReset => salvage(client, &mut down, down_bytes, fin_ms),
                    End::ClientReset => salvage(backend, &mut up, up_bytes, fin_ms),
                    _ => {}
                }
                return fault;
            }
        };
        if client.eof {
            first_close.get_or_insert(End::ClientClosed);
        }
        if backend.eof {
            first_close.get_or_insert(End::BackendClosed);
        }
        if client.shut && backend.shut {
            return (first_close.unwrap_or(End::ClientClosed), None);
        }
        let mut fds = [
            client.watch(!up.pending(), &down),
            backend.watch(!down.pending(), &up),
        ];
        let half_closed = client.eof || backend.eof;
        let timeout = match (busy, half_closed) {
            (true, _) => 0,
            (false, true) => fin_ms,
            (false, false) => idle_ms,
        };
        let idle = !busy && !up.pending() && !down.pending();
        match wait(&mut fds, timeout, idle.then_some(&mut *buffers)) {
            Err(e) => return (End::Error, Some(e)),
            Ok(0) if !busy => {
                let end = if half_closed {
                    End::FinTimeout
                } else {
                    End::IdleTimeout
                };
                return (end, None);
            }
            Ok(_) => {
                client.learn(&fds[0]);
                backend.learn(&fds[1]);
            }
        }
    }
}

/// `poll(2)` for at most `timeout_ms`; with `idle` buffers (both empty),
/// after [`RELEASE_AFTER`] of silence their pages go back to the kernel
/// and the wait goes on for the rest of the time.
fn wait(
    fds: &mut [libc::pollfd],
    timeout_ms: i32,
    idle: Option<&mut Buffers>,
) -> io::Result<usize> {
    let release_ms = millis(RELEASE_AFTER);
    let Some(buffers) = idle.filter(|_| timeout_ms > release_ms) else {
        return poll(fds, timeout_ms);
    };
    match poll(fds, release_ms)? {
        0 => {
            buffers.release();
            poll(fds, timeout_ms - release_ms)
        }
        n => Ok(n),
    }
}

/// Moves bytes from `src` to `dst` through `buf` (its place in `bytes`)
/// for at most one turn; whether the turn was used up (go on without
/// waiting).
fn step(
    src: &mut Side<'_>,
    dst: &mut Side<'_>,
    buf: &mut Buf,
    bytes: &mut [u8],
    moved: &mut u64,
) -> Result<bool, Fault> {
    let turn_ends = *moved + TURN_BYTES;
    loop {
        dst.flush()?;
        if buf.pending() {
            let n = dst.write_plain(&bytes[buf.start..buf.end])?;
            buf.start += n;
            *moved += n as u64;
            if n == 0 && !(dst.wants_write() && dst.writable) {
                return Ok(false);
            }
            continue;
        }
        if dst.shut {
            return Ok(false);
        }
        if src.eof {
            dst.close_write()?;
            return Ok(false);
        }
        if *moved >= turn_ends {
            return Ok(true);
        }
        match src.read_plain(bytes)? {
            None => return Ok(false),
            Some(0) => src.eof = true,
            Some(n) => (buf.start, buf.end) = (0, n),
        }
    }
}

/// After a reset by one peer: what is on its way to the other, `dst`
/// (plain bytes read into `buf` but not yet written, records rustls
/// holds), leaves as far as that socket takes it, waiting for room at most
/// `patience_ms` at a time. No `close_notify`: the peer is to learn of the
/// reset, which the close sends (`crate::proxy::pump::close`).
#[cold]
#[inline(never)]
fn salvage(dst: &mut Side<'_>, buf: &mut Buf, bytes: &[u8], patience_ms: i32) {
    loop {
        while buf.pending() {
            match dst.write_plain(&bytes[buf.start..buf.end]) {
                Ok(0) => break,
                Ok(n) => buf.start += n,
                Err(_) => return,
            }
        }
        if dst.flush().is_err() || !(buf.pending() || dst.wants_write()) {
            return;
        }
        let mut fds = [libc::pollfd {
            fd: dst.sock.as_raw_fd(),
            events: libc::POLLOUT,
            revents: 0,
        }];
        match poll(&mut fds, patience_ms) {
            Ok(n) if n > 0 => dst.writable = true,
            _ => return,
        }
    }
}
