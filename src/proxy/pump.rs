//! The duplex pump: moves the bytes of one connection both ways until both
//! sides are done, without ever blocking on either socket.
//!
//! # The pump
//!
//! A proxied connection is two independent byte streams: client → backend
//! and backend → client. Many protocols (HTTP keep-alive, Redis, PostgreSQL)
//! send in both directions at once or take turns many times, so the worker
//! must serve both without knowing which will speak next. It never blocks on
//! either socket (see `MSG_DONTWAIT` below) and waits on both with one
//! `poll(2)`:
//!
//! - Each direction has one buffer (4096 bytes by default). It is filled by
//!   one `read` and emptied by as many `write`s as the destination accepts;
//!   nothing more is read from that source until the buffer is empty. This
//!   bounds memory and passes the destination's back-pressure on to the
//!   source through TCP flow control.
//! - The two buffers belong to the worker thread, not the connection: they
//!   are mapped once per thread and reused by every connection it serves
//!   (nothing is allocated or zeroed per connection). When a connection has
//!   had both buffers empty for `RELEASE_AFTER` (half a second), their pages are handed
//!   back to the kernel with `madvise(MADV_DONTNEED)`, so an idle connection
//!   costs its thread's stack and its sockets but no buffer memory.
//! - Why not a blocking `write_all`: if the client is blocked writing a large
//!   request and not reading, while the backend is blocked writing a large
//!   reply to us, a worker stuck in `write_all` toward the client would never
//!   read the client's side again: a deadlock. With non-blocking writes a
//!   partial write just means "wait for POLLOUT on that socket" while the
//!   other direction goes on.
//! - A read is tried before any `poll`, and again after a successful one
//!   that filled the buffer, until it says `WouldBlock` or comes back short:
//!   when data is already there (a request that arrived with the
//!   connection) it costs no `poll` call, and a short read means the socket
//!   is drained, so no extra read is spent only to hear `WouldBlock`.
//! - A write of a chunk that filled the whole buffer passes `MSG_MORE`: the
//!   source is streaming, so the kernel may gather several 4096-byte chunks
//!   into one segment. Before the pump waits in `poll`, any such held bytes
//!   are pushed out (`TCP_NODELAY` set again), so nothing is delayed.
//! - The sockets stay in blocking mode; every `recv`/`send` passes
//!   `MSG_DONTWAIT` instead, which saves the `ioctl` per socket that
//!   switching modes costs.
//! - End of stream on one side is passed on as `shutdown(Write)` to the
//!   other once that direction's buffer has drained (a half-close), so a
//!   client that sends, shuts its write side and then reads still gets its
//!   whole reply. The connection ends when both directions have ended, on
//!   the first error, or when nothing moves for the idle timeout.
//! - With `--yield-before-poll` (off by default), a pump that has just moved
//!   bytes calls `sched_yield()` once, then `poll` with a zero timeout,
//!   before it sleeps. On small request/response traffic the other side is
//!   usually about to answer: a backend replying to the request just
//!   forwarded, a keep-alive client sending its next request. Yielding lets
//!   it run now, and when the answer is already there the worker skips the
//!   sleep in `poll` and the wake-up that would end it, which on this
//!   workload are most of the kernel's cost (docs/benchmarks.md has the
//!   measured gain on keep-alive HTTP and redis). It stays a flag because when
//!   the answer is slow the yield and the extra `poll` are spent for
//!   nothing, and on a busy machine the yield hands the CPU to unrelated
//!   work.
//!
//! With `--splice`, [`splice_pump`] runs the same loop but moves the bytes
//! with `splice(2)` through a pipe per direction, never through user memory
//! (there the sockets are switched to non-blocking mode, since `splice(2)`
//! has no per-call flag for the socket side).
//!
//! # Corresponds to the C article
//!
//! The copy loop of `proxy_function()`. The C reads one chunk
//! of the request (at most 4090 bytes), sends it with `strlen(buffer)` (so
//! binary data is cut at the first zero byte), then copies the reply until
//! the backend closes. It cannot serve a request larger than a chunk, a
//! second request on the same connection, or a protocol where the client
//! speaks again after the reply starts; and any read error calls `exit()`,
//! ending every other connection too. Here errors end only this connection,
//! and both directions stream for as long as either side has data. The final
//! `shutdown(SHUT_RDWR)` then `close()` on both sockets is the C's, kept on
//! every path.

use std::io::{self, ErrorKind};
use std::net::{Shutdown as Direction, TcpStream};
use std::os::unix::io::AsRawFd;
use std::time::Duration;

use super::conduit::{Buffers, Conduits, Pipe, Through, BUFFERS, PIPES, RELEASE_AFTER};

/// How one proxied connection went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Transfer {
    /// Bytes from the client delivered to the backend.
    pub to_backend: u64,
    /// Bytes from the backend delivered to the client.
    pub to_client: u64,
}

/// One direction of the pump: what we know of its buffer and both ends.
/// The buffer itself belongs to the thread's [`Buffers`] and is passed to
/// [`Half::step`].
struct Half {
    /// Bytes `buf[start..end]` are read but not yet written.
    start: usize,
    end: usize,
    /// The source said end of stream.
    eof: bool,
    /// We passed the end of stream on with `shutdown(Write)`.
    done: bool,
    /// The last read did not say `WouldBlock` (or poll said readable since).
    readable: bool,
    /// The last write did not say `WouldBlock` (or poll said writable since).
    writable: bool,
    /// The last write said "more is coming" (`MSG_MORE`): the kernel may
    /// hold its bytes to fill a bigger segment until [`uncork`] is called.
    corked: bool,
}

impl Half {
    fn new() -> Half {
        Half {
            start: 0,
            end: 0,
            eof: false,
            done: false,
            readable: true,
            writable: true,
            corked: false,
        }
    }

    fn pending(&self) -> bool {
        self.start < self.end
    }

    fn wants_read(&self) -> bool {
        !self.eof && !self.pending()
    }

    /// Moves what it can from `src` to `dst` through `via` without
    /// blocking. Returns the bytes written.
    fn step(&mut self, via: &mut Through, src: &TcpStream, dst: &TcpStream) -> io::Result<u64> {
        let mut moved = 0;
        loop {
            if self.wants_read() && self.readable {
                match via.fill(src) {
                    Ok(0) => self.eof = true,
                    Ok(n) => {
                        self.start = 0;
                        self.end = n;
                        // A stream socket fills the buffer when it can: a
                        // short read means its queue is empty now, so the
                        // read that would only say `WouldBlock` is skipped
                        // and `poll` tells when more comes. (Through a pipe
                        // a short read may also mean the pipe is full: the
                        // next `poll` then returns at once, no harm done.)
                        if n < via.capacity() {
                            self.readable = false;
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => self.readable = false,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
            }
            // A read that filled the whole buffer says the source is
            // streaming: tell the kernel more is coming, so it can send
            // full-sized segments instead of one per 4096-byte chunk (the
            // receiver then wakes once per segment, not per chunk).
            let more = self.end == via.capacity();
            while self.pending() && self.writable {
                match via.drain(dst, self.start, self.end, more) {
                    // Not seen from TCP or a pipe, but a write that takes
                    // nothing would otherwise spin here forever.
                    Ok(0) => {
                        return Err(io::Error::new(
                            ErrorKind::WriteZero,
                            "the destination took no byte",
                        ))
                    }
                    Ok(n) => {
                        self.corked = more;
                        self.start += n;
                        moved += n as u64;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => self.writable = false,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            if self.eof && !self.pending() && !self.done {
                self.done = true;
                // Half-close: tell the destination nothing more will come.
                // ENOTCONN only means the peer is gone already.
                if let Err(e) = dst.shutdown(Direction::Write) {
                    if e.kind() != ErrorKind::NotConnected {
                        return Err(e);
                    }
                }
            }
            // Go round again only while progress is possible without poll.
            if !(self.wants_read() && self.readable) {
                return Ok(moved);
            }
        }
    }
}

/// Copies bytes both ways between `client` and `backend` until both
/// directions reach end of stream, an error occurs, or nothing moves for
/// `idle_timeout`. Byte counts are written into `transfer` as they move, so
/// they are right even when an error ends the pump.
///
/// # Errors
///
/// The first I/O error of either socket, or `TimedOut` at the idle timeout.
pub fn pump(
    client: &TcpStream,
    backend: &TcpStream,
    buffer_size: usize,
    idle_timeout: Duration,
    yield_before_poll: bool,
    transfer: &mut Transfer,
) -> io::Result<()> {
    BUFFERS.with(|cell| {
        let mut cached = cell.borrow_mut();
        let buffers = match &mut *cached {
            Some(b) if b.size == buffer_size.max(1) => b,
            slot => slot.insert(Buffers::new(buffer_size)?),
        };
        pump_with(
            &mut Conduits::Buffers(buffers),
            client,
            backend,
            idle_timeout,
            yield_before_poll,
            transfer,
        )
    })
}

/// Like [`pump`], but moves the bytes with `splice(2)` through a pipe per
/// direction instead of reading them into user memory and writing them out
/// again (Linux only, the `--splice` flag). The kernel moves socket pages
/// into the pipe and on to the other socket: no copy through the process,
/// and up to a pipe's capacity (64 KiB) per call instead of 4096 bytes.
/// The pipes belong to the worker thread and serve each of its connections
/// in turn; after an error they may hold stale bytes, so they are closed
/// and made anew for the next connection.
///
/// # Errors
///
/// As [`pump`]; also the errors of `pipe2(2)` and `splice(2)`.
pub fn splice_pump(
    client: &TcpStream,
    backend: &TcpStream,
    idle_timeout: Duration,
    yield_before_poll: bool,
    transfer: &mut Transfer,
) -> io::Result<()> {
    // splice(2) honours SPLICE_F_NONBLOCK on the pipe side only: the
    // sockets themselves must be non-blocking.
    client.set_nonblocking(true)?;
    backend.set_nonblocking(true)?;
    PIPES.with(|cell| {
        let mut cached = cell.borrow_mut();
        let pipes = match &mut *cached {
            Some(p) => p,
            slot => slot.insert([Pipe::new()?, Pipe::new()?]),
        };
        let result = pump_with(
            &mut Conduits::Pipes(pipes),
            client,
            backend,
            idle_timeout,
            yield_before_poll,
            transfer,
        );
        if result.is_err() {
            *cached = None;
        }
        result
    })
}

fn pump_with(
    conduits: &mut Conduits,
    client: &TcpStream,
    backend: &TcpStream,
    idle_timeout: Duration,
    yield_before_poll: bool,
    transfer: &mut Transfer,
) -> io::Result<()> {
    let mut up = Half::new(); // client -> backend
    let mut down = Half::new(); // backend -> client
    let timeout_ms = i32::try_from(idle_timeout.as_millis()).unwrap_or(i32::MAX);
    let release_ms = i32::try_from(RELEASE_AFTER.as_millis()).unwrap_or(i32::MAX);
    loop {
        let (mut up_via, mut down_via) = conduits.halves();
        let to_backend = up.step(&mut up_via, client, backend)?;
        let to_client = down.step(&mut down_via, backend, client)?;
        transfer.to_backend += to_backend;
        transfer.to_client += to_client;
        crate::trace::pumped(to_backend, to_client, up.done, down.done);
        if up.done && down.done {
            return Ok(());
        }
        // About to wait: whatever a "more is coming" write left in the
        // kernel must leave now.
        if up.corked {
            up.corked = false;
            uncork(backend)?;
        }
        if down.corked {
            down.corked = false;
            uncork(client)?;
        }
        let mut fds = [
            watch(client, interest(&up, &down)),
            watch(backend, interest(&down, &up)),
        ];
        // Nothing waits in either buffer: if the wait is long, give their
        // pages back after RELEASE_AFTER, then wait out the rest.
        let idle = !up.pending() && !down.pending();
        // --yield-before-poll: bytes just went out, so the other side is
        // probably about to answer (a backend's reply to the request just
        // forwarded, a client's next request after a reply). Let it run
        // first, then look without waiting: if the answer is there, the
        // sleep in poll and the wake-up that ends it (the scheduler's two
        // most expensive paths on this workload) are skipped.
        let mut ready = 0;
        if yield_before_poll && to_backend + to_client > 0 {
            // SAFETY: no arguments; on Linux it always succeeds.
            unsafe { libc::sched_yield() };
            ready = poll(&mut fds, 0)?;
        }
        let ready = if ready > 0 {
            ready
        } else if idle && timeout_ms > release_ms {
            match poll(&mut fds, release_ms)? {
                0 => {
                    conduits.release();
                    poll(&mut fds, timeout_ms - release_ms)?
                }
                ready => ready,
            }
        } else {
            poll(&mut fds, timeout_ms)?
        };
        if ready == 0 {
            return Err(io::Error::new(ErrorKind::TimedOut, "idle timeout"));
        }
        // Errors and hang-ups count as "ready": the next read or write
        // reports them (or the end of stream) precisely.
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
}

/// `poll(2)` on `fds` for at most `timeout_ms`; returns how many are ready
/// (0 at the timeout). A signal restarts the wait with the whole timeout.
fn poll(fds: &mut [libc::pollfd; 2], timeout_ms: i32) -> io::Result<i32> {
    loop {
        // SAFETY: `fds` is a valid array of two pollfd for the whole call.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout_ms) };
        if ready >= 0 {
            return Ok(ready);
        }
        let err = io::Error::last_os_error();
        if err.kind() != ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Sends at once what `MSG_MORE` writes left waiting in `socket`: setting
/// `TCP_NODELAY` (again) pushes the pending segments out.
fn uncork(socket: &TcpStream) -> io::Result<()> {
    socket.set_nodelay(true)
}

/// A `pollfd` for `socket`. A socket with nothing to wait for gets fd -1,
/// which `poll(2)` skips: otherwise a hang-up on it (always reported, even
/// when not asked for) would wake every call at once and spin the CPU.
fn watch(socket: &TcpStream, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd: if events == 0 { -1 } else { socket.as_raw_fd() },
        events,
        revents: 0,
    }
}

/// Poll events for a socket that is the source of `from` and the destination
/// of `to`.
fn interest(from: &Half, to: &Half) -> libc::c_short {
    let mut events = 0;
    if from.wants_read() {
        events |= libc::POLLIN;
    }
    if to.pending() {
        events |= libc::POLLOUT;
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    /// A connected pair of sockets on loopback, with timeouts.
    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        for s in [&a, &b] {
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
        }
        (a, b)
    }

    #[test]
    fn pump_moves_both_ways_and_passes_half_close() {
        let (mut client, client_end) = pair();
        let (backend_end, mut backend) = pair();
        let t = std::thread::spawn(move || {
            let mut transfer = Transfer::default();
            pump(
                &client_end,
                &backend_end,
                7,
                Duration::from_secs(10),
                false,
                &mut transfer,
            )
            .map(|_| transfer)
        });
        client
            .write_all(b"hello\0world, more than seven bytes")
            .unwrap();
        client.shutdown(Direction::Write).unwrap();
        let mut got = Vec::new();
        backend.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"hello\0world, more than seven bytes");
        backend.write_all(b"reply").unwrap();
        backend.shutdown(Direction::Write).unwrap();
        let mut reply = Vec::new();
        client.read_to_end(&mut reply).unwrap();
        assert_eq!(reply, b"reply");
        let transfer = t.join().unwrap().unwrap();
        assert_eq!(transfer.to_backend, 34);
        assert_eq!(transfer.to_client, 5);
    }

    /// `len` bytes that differ from one seed to another and have no short
    /// period, so a lost, doubled or reordered chunk shows.
    fn pattern(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect()
    }

    /// Sends `up` from the client and `down` from the backend at the same
    /// time through a pump, and returns what each side received.
    fn through_pump(splice: bool, up: &[u8], down: &[u8]) -> (Vec<u8>, Vec<u8>, Transfer) {
        through_pump_with(splice, false, up, down)
    }

    /// [`through_pump`], with or without `--yield-before-poll`.
    fn through_pump_with(
        splice: bool,
        yield_first: bool,
        up: &[u8],
        down: &[u8],
    ) -> (Vec<u8>, Vec<u8>, Transfer) {
        let (mut client, client_end) = pair();
        let (backend_end, mut backend) = pair();
        let pump_thread = std::thread::spawn(move || {
            let mut transfer = Transfer::default();
            let timeout = Duration::from_secs(10);
            let result = if splice {
                splice_pump(
                    &client_end,
                    &backend_end,
                    timeout,
                    yield_first,
                    &mut transfer,
                )
            } else {
                pump(
                    &client_end,
                    &backend_end,
                    4096,
                    timeout,
                    yield_first,
                    &mut transfer,
                )
            };
            result.map(|_| transfer)
        });
        let mut client_w = client.try_clone().unwrap();
        let mut backend_w = backend.try_clone().unwrap();
        let (up, down) = (up.to_vec(), down.to_vec());
        let up_writer = std::thread::spawn(move || {
            client_w.write_all(&up).unwrap();
            client_w.shutdown(Direction::Write).unwrap();
        });
        let down_writer = std::thread::spawn(move || {
            backend_w.write_all(&down).unwrap();
            backend_w.shutdown(Direction::Write).unwrap();
        });
        let at_backend = std::thread::spawn(move || {
            let mut got = Vec::new();
            backend.read_to_end(&mut got).unwrap();
            got
        });
        let mut at_client = Vec::new();
        client.read_to_end(&mut at_client).unwrap();
        up_writer.join().unwrap();
        down_writer.join().unwrap();
        let at_backend = at_backend.join().unwrap();
        let transfer = pump_thread.join().unwrap().unwrap();
        (at_backend, at_client, transfer)
    }

    #[test]
    fn ten_mib_each_way_survive_byte_for_byte() {
        let up = pattern(10 << 20, 1);
        let down = pattern(10 << 20, 2);
        for splice in [false, true] {
            let (at_backend, at_client, transfer) = through_pump(splice, &up, &down);
            assert!(
                at_backend == up,
                "client -> backend differs (splice {splice})"
            );
            assert!(
                at_client == down,
                "backend -> client differs (splice {splice})"
            );
            assert_eq!(transfer.to_backend, 10 << 20);
            assert_eq!(transfer.to_client, 10 << 20);
        }
    }

    #[test]
    fn splice_pipes_serve_one_connection_after_another() {
        // One thread pumps two connections in turn: the second goes
        // through the pipes the first left (drained) behind, and each
        // passes its half-close on.
        let (tx, rx) = crossbeam_channel::unbounded::<(TcpStream, TcpStream)>();
        let worker = std::thread::spawn(move || {
            for _ in 0..2 {
                let (c, b) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
                let mut t = Transfer::default();
                splice_pump(&c, &b, Duration::from_secs(10), false, &mut t).unwrap();
            }
        });
        for i in 0..2u8 {
            let (mut client, client_end) = pair();
            let (backend_end, mut backend) = pair();
            tx.send((client_end, backend_end)).unwrap();
            client.write_all(&[b'q', i, 0]).unwrap();
            client.shutdown(Direction::Write).unwrap();
            let mut got = Vec::new();
            backend.read_to_end(&mut got).unwrap();
            assert_eq!(got, [b'q', i, 0]);
            backend.write_all(&[b'r', i]).unwrap();
            backend.shutdown(Direction::Write).unwrap();
            let mut reply = Vec::new();
            client.read_to_end(&mut reply).unwrap();
            assert_eq!(reply, [b'r', i]);
        }
        worker.join().unwrap();
    }

    #[test]
    fn yield_before_poll_moves_the_same_bytes() {
        // The yield and the look without waiting change when the worker
        // sleeps, never what it moves: 1 MiB each way, both pumps.
        let up = pattern(1 << 20, 3);
        let down = pattern(1 << 20, 4);
        for splice in [false, true] {
            let (at_backend, at_client, transfer) = through_pump_with(splice, true, &up, &down);
            assert!(at_backend == up, "splice={splice}: client->backend differs");
            assert!(
                at_client == down,
                "splice={splice}: backend->client differs"
            );
            assert_eq!(transfer.to_backend, up.len() as u64);
            assert_eq!(transfer.to_client, down.len() as u64);
        }
    }

    #[test]
    fn pump_ends_at_the_idle_timeout() {
        let (_client, client_end) = pair();
        let (backend_end, _backend) = pair();
        let mut transfer = Transfer::default();
        let err = pump(
            &client_end,
            &backend_end,
            4096,
            Duration::from_millis(50),
            false,
            &mut transfer,
        )
        .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::TimedOut);
    }
}
