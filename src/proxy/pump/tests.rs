use super::*;
use std::io::{ErrorKind, Read, Write};
use std::net;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::test_support::pair;
use crate::units::Switch;

/// Pump options with this idle timeout (and the same fin timeout).
fn options(idle_ms: u64) -> PumpOptions {
    PumpOptions {
        idle_timeout: Duration::from_millis(idle_ms),
        fin_timeout: Duration::from_millis(idle_ms),
        yield_before_poll: Switch::Off,
        up_rate: None,
        down_rate: None,
        promote: false,
        promote_after: 0,
    }
}

/// The buffered pump (4096-byte chunks), or the splicing one.
fn run(splice: bool, client: &TcpStream, backend: &TcpStream, options: &PumpOptions) -> Pumped {
    if splice {
        splice_pump(client, backend, options)
    } else {
        pump(client, backend, 4096, options)
    }
}

#[test]
fn pump_moves_both_ways_and_passes_half_close() {
    let (mut client, client_end) = pair();
    let (backend_end, mut backend) = pair();
    let t = std::thread::spawn(move || pump(&client_end, &backend_end, 7, &options(10_000)));
    client
        .write_all(b"hello\0world, more than seven bytes")
        .unwrap();
    client.shutdown(net::Shutdown::Write).unwrap();
    let mut got = Vec::new();
    backend.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"hello\0world, more than seven bytes");
    backend.write_all(b"reply").unwrap();
    backend.shutdown(net::Shutdown::Write).unwrap();
    let mut reply = Vec::new();
    client.read_to_end(&mut reply).unwrap();
    assert_eq!(reply, b"reply");
    let outcome = t.join().unwrap();
    assert_eq!(outcome.transfer.to_backend, 34);
    assert_eq!(outcome.transfer.to_client, 5);
    assert_eq!(outcome.end, End::ClientClosed);
    assert!(outcome.error.is_none());
}

/// A clean end costs one `shutdown(2)` in all (docs/internals.md, "What
/// a connection costs"): the first end of stream is passed on at once,
/// while the other direction still flows; the last is left to the close
/// (the pump returns with the backend's socket not yet shut: its peer
/// reads no end of stream until then), and the close shuts neither
/// socket, both read to their end. Both peers still get every byte and
/// their end of stream.
#[test]
fn a_clean_end_leaves_the_last_fin_to_the_close() {
    for splice in [false, true] {
        let (mut client, client_end) = pair();
        let (backend_end, mut backend) = pair();
        let pump_thread = std::thread::spawn(move || {
            let pumped = run(splice, &client_end, &backend_end, &options(10_000));
            (pumped, client_end, backend_end)
        });
        client.write_all(b"ping").unwrap();
        let mut got = [0; 4];
        backend.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"ping");
        // The backend answers and closes first, as an HTTP/1.0 server does.
        backend.write_all(b"pong").unwrap();
        backend.shutdown(net::Shutdown::Write).unwrap();
        let mut reply = Vec::new();
        client.read_to_end(&mut reply).unwrap();
        assert_eq!(reply, b"pong", "splice={splice}");
        client.shutdown(net::Shutdown::Write).unwrap();
        let (pumped, client_end, backend_end) = pump_thread.join().unwrap();
        assert_eq!(pumped.end, End::BackendClosed, "splice={splice}");
        assert_eq!(pumped.no_shutdown, [true, true], "splice={splice}");
        // No FIN went toward the backend yet: nothing to read, no end.
        backend.set_nonblocking(true).unwrap();
        let early = backend.read(&mut got).map_err(|e| e.kind());
        assert_eq!(early, Err(ErrorKind::WouldBlock), "splice={splice}");
        backend.set_nonblocking(false).unwrap();
        close(&client_end, &backend_end, pumped.end, pumped.no_shutdown);
        drop((client_end, backend_end));
        let mut rest = Vec::new();
        backend.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "splice={splice}");
    }
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
    through_pump_with(splice, Switch::Off, up, down)
}

/// [`through_pump`], with `yield_before_poll` as given.
fn through_pump_with(
    splice: bool,
    yield_first: Switch,
    up: &[u8],
    down: &[u8],
) -> (Vec<u8>, Vec<u8>, Transfer) {
    let (mut client, client_end) = pair();
    let (backend_end, mut backend) = pair();
    let pump_thread = std::thread::spawn(move || {
        let options = PumpOptions {
            yield_before_poll: yield_first,
            ..options(10_000)
        };
        run(splice, &client_end, &backend_end, &options)
    });
    let mut client_w = client.try_clone().unwrap();
    let mut backend_w = backend.try_clone().unwrap();
    let (up, down) = (up.to_vec(), down.to_vec());
    let up_writer = std::thread::spawn(move || {
        client_w.write_all(&up).unwrap();
        client_w.shutdown(net::Shutdown::Write).unwrap();
    });
    let down_writer = std::thread::spawn(move || {
        backend_w.write_all(&down).unwrap();
        backend_w.shutdown(net::Shutdown::Write).unwrap();
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
    let outcome = pump_thread.join().unwrap();
    assert!(outcome.end.is_clean(), "{outcome:?}");
    (at_backend, at_client, outcome.transfer)
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
            let outcome = splice_pump(&c, &b, &options(10_000));
            assert!(outcome.end.is_clean(), "{outcome:?}");
        }
    });
    for i in 0..2u8 {
        let (mut client, client_end) = pair();
        let (backend_end, mut backend) = pair();
        tx.send((client_end, backend_end)).unwrap();
        client.write_all(&[b'q', i, 0]).unwrap();
        client.shutdown(net::Shutdown::Write).unwrap();
        let mut got = Vec::new();
        backend.read_to_end(&mut got).unwrap();
        assert_eq!(got, [b'q', i, 0]);
        backend.write_all(&[b'r', i]).unwrap();
        backend.shutdown(net::Shutdown::Write).unwrap();
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
    for (splice, mode) in [
        (false, Switch::On),
        (false, Switch::Auto),
        (true, Switch::On),
    ] {
        let (at_backend, at_client, transfer) = through_pump_with(splice, mode, &up, &down);
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
    let outcome = pump(&client_end, &backend_end, 4096, &options(50));
    assert_eq!(outcome.end, End::IdleTimeout);
}
/// The client sends `n` bytes and resets (SO_LINGER 0) before the pump
/// starts; the backend reads what comes. The bytes written before the
/// read that reports the reset are all counted.
fn bytes_then_reset(splice: bool, n: usize, client_resets: bool) -> (Pumped, usize) {
    let (mut client, client_end) = pair();
    let (backend_end, mut backend) = pair();
    let data = pattern(n, 9);
    let (sender, receiver) = if client_resets {
        (&mut client, &mut backend)
    } else {
        (&mut backend, &mut client)
    };
    sender.write_all(&data).unwrap();
    socket2::SockRef::from(&*sender)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    let mut receiver = receiver.try_clone().unwrap();
    let reader = std::thread::spawn(move || {
        let mut got = Vec::new();
        // The pump closes nothing itself: the read ends at the
        // timeout below, or when the test drops the pump's sockets.
        let _ = receiver.read_to_end(&mut got);
        got.len()
    });
    drop(client);
    drop(backend);
    let outcome = run(splice, &client_end, &backend_end, &options(10_000));
    drop(client_end);
    drop(backend_end);
    (outcome, reader.join().unwrap())
}

#[test]
fn bytes_before_a_reset_are_counted_exactly() {
    // On a pump that added its counts only after each step, the step
    // that met the reset lost every byte it had written. 64 KiB is 16
    // full chunks, or one full pipe: no read comes short, so the read
    // that reports the reset comes in the same step as the writes.
    let n = 64 * 1024;
    for splice in [false, true] {
        let (outcome, read) = bytes_then_reset(splice, n, true);
        assert_eq!(outcome.end, End::ClientReset, "splice={splice}");
        // The client's socket is gone: the close does not shut it.
        assert_eq!(outcome.no_shutdown, [true, false], "splice={splice}");
        assert_eq!(read, n, "splice={splice}");
        assert_eq!(outcome.transfer.to_backend, n as u64, "splice={splice}");
        let (outcome, read) = bytes_then_reset(splice, n, false);
        assert_eq!(outcome.end, End::BackendReset, "splice={splice}");
        assert_eq!(outcome.no_shutdown, [false, true], "splice={splice}");
        assert_eq!(read, n, "splice={splice}");
        assert_eq!(outcome.transfer.to_client, n as u64, "splice={splice}");
    }
}

const REPLY_413: &[u8] = b"HTTP/1.1 413 Too Large\r\n\r\n";

#[test]
fn a_failed_write_toward_the_backend_still_delivers_its_reply() {
    // The backend reads 1 KiB of an upload, answers and closes with the
    // rest unread (so its kernel resets): the pump's writes toward it
    // fail, and the reply must still reach the client.
    for splice in [false, true] {
        let (mut client, client_end) = pair();
        let (backend_end, mut backend) = pair();
        let pump_thread =
            std::thread::spawn(move || run(splice, &client_end, &backend_end, &options(10_000)));
        let backend_thread = std::thread::spawn(move || {
            let mut head = [0u8; 1024];
            backend.read_exact(&mut head).unwrap();
            backend.write_all(REPLY_413).unwrap();
        });
        let mut reader = client.try_clone().unwrap();
        let reply = std::thread::spawn(move || {
            let mut got = Vec::new();
            let _ = reader.read_to_end(&mut got);
            got
        });
        let chunk = vec![7u8; 64 * 1024];
        for _ in 0..160 {
            if client.write_all(&chunk).is_err() {
                break;
            }
        }
        drop(client);
        let got = reply.join().unwrap();
        assert!(
            got.starts_with(b"HTTP/1.1 413"),
            "splice={splice}: the client got {:?}",
            String::from_utf8_lossy(&got)
        );
        backend_thread.join().unwrap();
        let outcome = pump_thread.join().unwrap();
        assert_eq!(outcome.end, End::BackendReset, "splice={splice}");
        assert_eq!(
            outcome.transfer.to_client,
            REPLY_413.len() as u64,
            "splice={splice}"
        );
    }
}

#[test]
fn the_fin_timeout_closes_a_half_closed_connection() {
    let (mut client, client_end) = pair();
    let (backend_end, mut backend) = pair();
    let options = PumpOptions {
        idle_timeout: Duration::from_secs(30),
        fin_timeout: Duration::from_millis(200),
        yield_before_poll: Switch::Off,
        up_rate: None,
        down_rate: None,
        promote: false,
        promote_after: 0,
    };
    client.write_all(b"bye").unwrap();
    client.shutdown(net::Shutdown::Write).unwrap();
    let started = std::time::Instant::now();
    let outcome = pump(&client_end, &backend_end, 4096, &options);
    let took = started.elapsed();
    assert_eq!(outcome.end, End::FinTimeout);
    assert!(took >= Duration::from_millis(190), "{took:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    // The backend got the bytes and the end of stream, and said nothing.
    let mut got = Vec::new();
    backend.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"bye");
}

/// One side of [`neither_direction_starves_the_other`], on one thread:
/// sends `total` bytes and reads what comes without blocking on either,
/// and for each chunk received notes how far the other direction got
/// since the previous one. Returns the largest such gap, in bytes, and
/// the bytes received.
fn stream_both_ways(
    socket: TcpStream,
    total: u64,
    mine: &AtomicU64,
    theirs: &AtomicU64,
    until: std::time::Instant,
) -> (u64, u64) {
    socket.set_nonblocking(true).unwrap();
    let mut socket = socket;
    let out = vec![5u8; 64 * 1024];
    let mut buf = vec![0u8; 64 * 1024];
    let (mut sent, mut got, mut shut, mut eof) = (0u64, 0u64, false, false);
    let mut seen = 0; // the other direction's count at my last chunk
    let mut worst = 0;
    while !(eof && shut) && std::time::Instant::now() < until {
        let mut moved = false;
        if sent < total {
            let n = out.len().min((total - sent) as usize);
            match socket.write(&out[..n]) {
                Ok(n) => {
                    sent += n as u64;
                    moved = true;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => panic!("write: {e}"),
            }
        } else if !shut {
            socket.shutdown(net::Shutdown::Write).unwrap();
            shut = true;
        }
        if !eof {
            match socket.read(&mut buf) {
                Ok(0) => eof = true,
                Ok(n) => {
                    // How far did the other direction go since this
                    // one's last chunk?
                    let now = theirs.load(Ordering::SeqCst);
                    worst = worst.max(now - seen);
                    seen = now;
                    got += n as u64;
                    mine.store(got, Ordering::SeqCst);
                    moved = true;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => panic!("read: {e}"),
            }
        }
        if !moved && (!eof || !shut) {
            let mut events = 0;
            if !eof {
                events |= libc::POLLIN;
            }
            if sent < total {
                events |= libc::POLLOUT;
            }
            let mut fds = [watch(&socket, events), watch(&socket, 0)];
            poll(&mut fds, 100).unwrap();
        }
    }
    (worst, got)
}

#[test]
fn neither_direction_starves_the_other() {
    // Both sides stream at once. Each reads and writes on one thread,
    // so when it is not scheduled it neither sends nor receives, and
    // small socket buffers keep what sits in between small: a gap
    // larger than a few MiB can only be the pump serving one direction
    // while the other had bytes ready.
    const TOTAL: u64 = 64 << 20;
    const MAX_GAP: u64 = 8 << 20;
    for splice in [false, true] {
        let (client, client_end) = pair();
        let (backend_end, backend) = pair();
        for s in [&client, &client_end, &backend_end, &backend] {
            let s = socket2::SockRef::from(s);
            s.set_send_buffer_size(256 * 1024).unwrap();
            s.set_recv_buffer_size(256 * 1024).unwrap();
        }
        let pump_thread =
            std::thread::spawn(move || run(splice, &client_end, &backend_end, &options(10_000)));
        let at_client = Arc::new(AtomicU64::new(0));
        let at_backend = Arc::new(AtomicU64::new(0));
        let until = std::time::Instant::now() + Duration::from_secs(60);
        let backend_side = {
            let (mine, theirs) = (Arc::clone(&at_backend), Arc::clone(&at_client));
            std::thread::spawn(move || stream_both_ways(backend, TOTAL, &mine, &theirs, until))
        };
        let (down_gap, down) = stream_both_ways(client, TOTAL, &at_client, &at_backend, until);
        let (up_gap, up) = backend_side.join().unwrap();
        let outcome = pump_thread.join().unwrap();
        assert_eq!((up, down), (TOTAL, TOTAL), "splice={splice}: {outcome:?}");
        assert!(outcome.end.is_clean(), "{outcome:?}");
        assert!(
            up_gap < MAX_GAP && down_gap < MAX_GAP,
            "splice={splice}: client -> backend waited while the other way moved \
             {up_gap} bytes; backend -> client waited while the other way moved {down_gap}"
        );
    }
}

/// A direction capped so low that its tokens come back more slowly than
/// the idle timeout: the wait for them is not silence, and every byte gets
/// through, at the rate, through either pump.
#[test]
fn a_throttled_direction_is_not_idle_and_keeps_its_rate() {
    for splice in [false, true] {
        let (mut client, client_end) = pair();
        let (backend_end, mut backend) = pair();
        let capped = PumpOptions {
            down_rate: Some(100),
            ..options(30)
        };
        let t = std::thread::spawn(move || run(splice, &client_end, &backend_end, &capped));
        let started = std::time::Instant::now();
        backend.write_all(&[b'd'; 40]).unwrap();
        backend.shutdown(net::Shutdown::Write).unwrap();
        let mut got = Vec::new();
        client.read_to_end(&mut got).unwrap();
        let took = started.elapsed();
        client.shutdown(net::Shutdown::Write).unwrap();
        let outcome = t.join().unwrap();
        assert_eq!(got.len(), 40, "splice {splice}");
        assert_eq!(outcome.end, End::BackendClosed, "splice {splice}");
        // 40 bytes at 100 a second, the first 10 at once: 0.3 s.
        assert!(
            took >= Duration::from_millis(280) && took < Duration::from_secs(3),
            "splice {splice}: {took:?}"
        );
    }
}

/// A backend that answers and resets while the client is still uploading:
/// whichever of the pump's write toward it or its read from it meets the
/// reset first, the client gets the answer and then no end of stream
/// (the close is to send it a reset instead), and the end is a backend
/// reset.
#[test]
fn a_reset_met_by_a_write_passes_no_end_of_stream_on() {
    for splice in [false, true] {
        let (mut client, client_end) = pair();
        let (backend_end, mut backend) = pair();
        let pumped = std::thread::spawn(move || {
            let outcome = run(splice, &client_end, &backend_end, &options(10_000));
            (outcome, client_end)
        });
        let mut writer = client.try_clone().unwrap();
        let upload = std::thread::spawn(move || {
            let chunk = [b'x'; 16 * 1024];
            for _ in 0..256 {
                if writer.write_all(&chunk).is_err() {
                    break;
                }
            }
        });
        let mut head = [0u8; 1024];
        backend.read_exact(&mut head).unwrap();
        backend.write_all(b"reply").unwrap();
        socket2::SockRef::from(&backend)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(backend);
        let (outcome, client_end) = pumped.join().unwrap();
        assert_eq!(outcome.end, End::BackendReset, "splice={splice}");
        let mut got = [0u8; 5];
        client.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"reply");
        client.set_nonblocking(true).unwrap();
        let more = client.read(&mut [0u8; 1]).map_err(|e| e.kind());
        assert_eq!(more, Err(ErrorKind::WouldBlock), "splice={splice}");
        // Closed with the upload unread: the writer's next write fails.
        drop(client_end);
        upload.join().unwrap();
    }
}
