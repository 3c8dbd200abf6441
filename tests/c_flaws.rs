//! Each flaw of the article's C program, shown not to happen here.
//!
//! One test per flaw, named after what rodizio does instead; the guides
//! (`docs/c-to-rust.md`, `docs/pt-BR/guia.md`) index them in a table, and
//! `scripts/compare-c.sh` runs the same checks against the C itself.

mod common;

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{
    closed_port, connect, echo_through, read_response, test_data, wait_for, TestBackend,
    TestBalancer,
};
use socket2::SockRef;

/// The C sends what it read with `strlen(buffer)` as the length, so it
/// stops at the first zero byte. Here a request that starts with a few
/// bytes and a zero, and 256 KiB of bytes full of zeros, come back whole.
#[test]
fn binary_data_with_a_zero_byte_passes() {
    let backend = TestBackend::echo();
    let lb = TestBalancer::over(&[backend.addr()]);
    // What the C would cut to "GET": three bytes.
    let short = b"GET\0/ HTTP/1.0\r\n\r\n".to_vec();
    let back = echo_through(connect(lb.addr).unwrap(), Arc::new(short.clone())).unwrap();
    assert_eq!(back, short);
    let data = test_data(256 * 1024, 12);
    assert!(data.contains(&0), "the test data has zero bytes");
    let back = echo_through(connect(lb.addr).unwrap(), Arc::new(data.clone())).unwrap();
    assert_eq!(back.len(), data.len());
    assert!(back == data, "bytes changed on the way");
    lb.stop();
}

/// The C reads one request, then copies the reply until the backend
/// closes: a keep-alive backend never does, so the second request on the
/// connection is never read. Here 100 requests on one client connection
/// are all answered, by one backend connection.
#[test]
fn keep_alive_serves_many_requests() {
    let backend = TestBackend::http(1);
    let lb = TestBalancer::over(&[backend.addr()]);
    let stream = connect(lb.addr).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    for i in 0..100 {
        let request = format!("GET /{i} HTTP/1.1\r\nHost: test\r\n\r\n");
        writer.write_all(request.as_bytes()).unwrap();
        let response = read_response(&mut reader)
            .unwrap_or_else(|e| panic!("request {i} on the same connection: {e}"));
        assert_eq!(response.status, "HTTP/1.1 200 OK");
        assert_eq!(response.body, "backend 1\n");
    }
    assert_eq!(backend.accepted(), 1, "one backend connection for all");
    drop(writer);
    drop(reader);
    lb.stop();
}

/// A tiny Redis-like server, one command per line: `SET key value` answers
/// `+OK`, `GET key` answers `$value` (or `$-1`), `PING` answers `+PONG`.
fn redis_like(stream: TcpStream) -> io::Result<()> {
    let mut out = stream.try_clone()?;
    let mut store: HashMap<String, String> = HashMap::new();
    for line in BufReader::new(stream).lines() {
        let line = line?;
        let mut words = line.split_whitespace();
        let reply = match (words.next(), words.next(), words.next()) {
            (Some("SET"), Some(key), Some(value)) => {
                store.insert(key.to_string(), value.to_string());
                "+OK".to_string()
            }
            (Some("GET"), Some(key), None) => match store.get(key) {
                Some(value) => format!("${value}"),
                None => "$-1".to_string(),
            },
            (Some("PING"), None, None) => "+PONG".to_string(),
            _ => "-ERR unknown command".to_string(),
        };
        out.write_all(format!("{reply}\r\n").as_bytes())?;
    }
    out.shutdown(Shutdown::Write)
}

/// Redis clients keep one connection and take turns with the server; the
/// C forwards the first command and never reads the second. Here a
/// session of 500 round trips (SET, GET, PING) on one connection gets
/// every answer, in order.
#[test]
fn a_redis_like_session_of_many_round_trips_works() {
    let backend = TestBackend::start(Arc::new(redis_like));
    let lb = TestBalancer::over(&[backend.addr()]);
    let stream = connect(lb.addr).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    let mut ask = |command: String| -> String {
        writer
            .write_all(format!("{command}\r\n").as_bytes())
            .unwrap();
        let mut reply = String::new();
        let n = reader
            .read_line(&mut reply)
            .unwrap_or_else(|e| panic!("no reply to {command:?}: {e}"));
        assert!(
            n > 0,
            "the connection ended before the reply to {command:?}"
        );
        reply.trim_end().to_string()
    };
    assert_eq!(ask("GET missing".into()), "$-1");
    for i in 0..166 {
        assert_eq!(ask(format!("SET key{i} value{i}")), "+OK");
        assert_eq!(ask(format!("GET key{i}")), format!("$value{i}"));
        assert_eq!(ask("PING".into()), "+PONG");
    }
    assert_eq!(ask("GET key0".into()), "$value0");
    assert_eq!(backend.accepted(), 1);
    lb.stop();
}

/// One echo round trip on a new connection: sends `msg`, shuts the write
/// side, reads to the end.
fn round_trip(addr: SocketAddr, msg: &[u8]) -> io::Result<Vec<u8>> {
    let mut s = connect(addr)?;
    s.write_all(msg)?;
    s.shutdown(Shutdown::Write)?;
    let mut back = Vec::new();
    s.read_to_end(&mut back)?;
    Ok(back)
}

/// The C `exit()`s when a backend refuses the connection, ending every
/// client's connection with it. Here the first backend refuses and the
/// balancer goes on: 12 clients in a row, the first of them sent to the
/// refusing backend by round robin, are all served by the other one, and
/// the balancer is still running afterwards.
#[test]
fn a_refused_backend_does_not_stop_the_balancer() {
    let good = TestBackend::echo();
    let lb = TestBalancer::over(&[closed_port(), good.addr()]);
    for i in 0..12u8 {
        let msg = [b'c', i];
        let back = round_trip(lb.addr, &msg).unwrap_or_else(|e| panic!("client {i}: {e}"));
        assert_eq!(back, msg, "client {i}");
    }
    assert_eq!(good.accepted(), 12);
    assert!(
        !lb.wait_stopped(Duration::ZERO),
        "the balancer stopped after a refused connect"
    );
    lb.stop();
}

/// The C joins thread slot `i % 4096` from its 4096th connection on, and
/// that slot never held a thread: `pthread_join` fails and the program
/// exits. Here 4097 connections in a row are all served, the 4096th and
/// 4097th included, in bounded time. Without active checks: on a loaded
/// machine a check that times out after its connect would count as one
/// more connection to the backend.
#[test]
fn connection_4097_is_served() {
    let backend = TestBackend::echo();
    let lb = TestBalancer::with(&[backend.addr()], |c| {
        c.health.check = rodizio::health::CheckKind::Off;
    });
    let started = Instant::now();
    for i in 1..=4097u32 {
        let msg = i.to_be_bytes();
        let back = round_trip(lb.addr, &msg).unwrap_or_else(|e| panic!("connection {i}: {e}"));
        assert_eq!(back, msg, "connection {i}");
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "only {i} connections in 60 s"
        );
    }
    let (held, seen) = lb.proxied(&[&backend], |c| c == [4097]);
    assert!(held, "the backend took {seen:?} connections");
    assert!(wait_for(Duration::from_secs(5), || {
        lb.stats.snapshot().completed == 4097
    }));
    lb.stop();
}

/// In the C a failed read calls `exit()`, and a write to a reset client
/// raises SIGPIPE: either way one client's reset ends the program and
/// every transfer in flight. Here a client resets mid-transfer while
/// another transfer is half done; the reset is counted as one error, the
/// other transfer finishes byte for byte, and a new client is served.
#[test]
fn a_client_reset_mid_transfer_touches_only_its_connection() {
    const FIRST: usize = 64 * 1024;
    let backend = TestBackend::echo();
    let lb = TestBalancer::over(&[backend.addr()]);
    // The good transfer: its first 64 KiB are echoed before the reset.
    let data = test_data(1024 * 1024, 40);
    let mut good = connect(lb.addr).unwrap();
    good.write_all(&data[..FIRST]).unwrap();
    let mut first = vec![0; FIRST];
    good.read_exact(&mut first).unwrap();
    assert!(first == data[..FIRST]);
    // The bad client: sends, reads part of the echo, sends more, resets.
    let mut bad = connect(lb.addr).unwrap();
    let junk = test_data(2 * FIRST, 41);
    bad.write_all(&junk[..FIRST]).unwrap();
    let mut some = vec![0; 1000];
    bad.read_exact(&mut some).unwrap();
    bad.write_all(&junk[FIRST..]).unwrap();
    SockRef::from(&bad)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(bad);
    assert!(
        wait_for(Duration::from_secs(5), || lb.stats.snapshot().errors == 1),
        "the reset was not seen as one connection error"
    );
    // The good transfer goes on after it.
    let rest = Arc::new(data[FIRST..].to_vec());
    let back = echo_through(good, rest.clone()).expect("transfer after the reset");
    assert_eq!(back.len(), rest.len());
    assert!(back == *rest, "the transfer in flight was corrupted");
    // And a new client is served.
    let back = round_trip(lb.addr, b"after").unwrap();
    assert_eq!(back, b"after");
    assert_eq!(lb.stats.snapshot().errors, 1);
    lb.stop();
}
