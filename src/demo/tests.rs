//! Unit tests of the demo backend, through a real socket on loopback.

use super::*;
use proptest::prelude::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;

/// Every socket in these tests gives up after this long.
const TIMEOUT: Duration = Duration::from_secs(5);

/// A demo backend named `A` on a free port, stopped when dropped.
struct Server {
    addr: SocketAddr,
    shutdown: Shutdown,
    accept: Option<thread::JoinHandle<()>>,
}

impl Server {
    fn start() -> Server {
        Server::of(|demo| demo)
    }

    /// One adjusted by `adjust` before it starts.
    fn of(adjust: impl FnOnce(DemoBackend) -> DemoBackend) -> Server {
        let shutdown = Shutdown::new();
        let demo = DemoBackend::bind("127.0.0.1:0".parse().unwrap(), Some("A".into())).unwrap();
        let demo = adjust(demo);
        let addr = demo.local_addr().unwrap();
        let accept = Some(demo.spawn(shutdown.clone()).unwrap());
        Server {
            addr,
            shutdown,
            accept,
        }
    }

    /// A connection to it, and a buffered reader on the same socket.
    fn connect(&self) -> (std::net::TcpStream, BufReader<std::net::TcpStream>) {
        let s = std::net::TcpStream::connect_timeout(&self.addr, TIMEOUT).unwrap();
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        s.set_write_timeout(Some(TIMEOUT)).unwrap();
        let reader = BufReader::new(s.try_clone().unwrap());
        (s, reader)
    }

    /// Stops accepting, as `Drop` does, and waits for the accept thread.
    fn stop(&mut self) {
        self.shutdown.trigger();
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One response as a client reads it.
#[derive(Debug)]
struct Answer {
    status: String,
    content_length: usize,
    connection: String,
    body: String,
}

/// Reads one response; its body is `Content-Length` bytes, or none at all
/// when it answers a `HEAD`.
fn read_response(reader: &mut BufReader<std::net::TcpStream>, head_only: bool) -> Answer {
    let mut status = String::new();
    reader.read_line(&mut status).unwrap();
    let mut content_length = None;
    let mut connection = String::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (key, value) = line.split_once(": ").expect(line);
        match key {
            "Content-Length" => content_length = Some(value.parse().unwrap()),
            "Connection" => connection = value.to_string(),
            _ => {}
        }
    }
    let content_length = content_length.expect("a Content-Length");
    let mut body = vec![0; if head_only { 0 } else { content_length }];
    reader.read_exact(&mut body).unwrap();
    Answer {
        status: status.trim_end().to_string(),
        content_length,
        connection,
        body: String::from_utf8(body).unwrap(),
    }
}

/// Reads until the server closes: it must close, not wait for more.
fn read_to_close(reader: &mut BufReader<std::net::TcpStream>) -> String {
    let mut rest = Vec::new();
    reader
        .read_to_end(&mut rest)
        .expect("the server closes in time");
    String::from_utf8_lossy(&rest).into_owned()
}

/// Sends `bytes` on a new connection and reads until the server closes.
fn exchange(server: &Server, bytes: &[u8]) -> String {
    let (mut s, mut reader) = server.connect();
    s.write_all(bytes).unwrap();
    read_to_close(&mut reader)
}

#[test]
fn answers_with_its_name_keeps_alive_and_serves_health() {
    let server = Server::start();
    let (mut s, mut reader) = server.connect();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let r = read_response(&mut reader, false);
    assert_eq!(r.status, "HTTP/1.1 200 OK");
    assert_eq!(r.connection, "keep-alive");
    assert_eq!(r.body, "Handled by server A\n");
    // Same connection, second request: health, then close.
    s.write_all(b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")
        .unwrap();
    let rest = read_to_close(&mut reader);
    assert_eq!(
        rest,
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\
         Connection: close\r\n\r\nOK\n"
    );
}

/// HTTP/1.0 closes unless asked to keep alive; `Connection: close` closes
/// either version, whatever else the header says.
#[test]
fn keep_alive_by_version_and_connection_header() {
    let server = Server::start();
    for (request, keep_alive) in [
        ("GET / HTTP/1.0\r\n\r\n", false),
        ("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", true),
        (
            "GET / HTTP/1.0\r\nConnection: Upgrade, Keep-Alive\r\n\r\n",
            true,
        ),
        ("GET / HTTP/1.1\r\n\r\n", true),
        (
            "GET / HTTP/1.1\r\nConnection: keep-alive, close\r\n\r\n",
            false,
        ),
    ] {
        let (mut s, mut reader) = server.connect();
        s.write_all(request.as_bytes()).unwrap();
        let r = read_response(&mut reader, false);
        assert_eq!(r.body, "Handled by server A\n", "{request}");
        if keep_alive {
            assert_eq!(r.connection, "keep-alive", "{request}");
            s.write_all(request.as_bytes()).unwrap();
            assert_eq!(read_response(&mut reader, false).body, r.body);
        } else {
            assert_eq!(r.connection, "close", "{request}");
            assert_eq!(read_to_close(&mut reader), "", "{request}");
        }
    }
}

/// Past `max_connections`, a client gets the whole `503` (its
/// `Content-Length` right) and a close; a place freed is taken again.
#[test]
fn a_client_over_max_connections_gets_503() {
    let server = Server::of(|demo| demo.max_connections(1));
    let (mut first, mut first_reader) = server.connect();
    first.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    assert_eq!(
        read_response(&mut first_reader, false).status,
        "HTTP/1.1 200 OK"
    );
    let (_, mut reader) = server.connect();
    let busy = read_response(&mut reader, false);
    assert_eq!(busy.status, "HTTP/1.1 503 Service Unavailable");
    assert_eq!(busy.body, "too many connections, retry\r\n");
    assert!(read_to_close(&mut reader).is_empty());
    drop((first, first_reader));
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let (mut s, mut reader) = server.connect();
        s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        if read_response(&mut reader, false).status == "HTTP/1.1 200 OK" {
            break;
        }
        assert!(Instant::now() < deadline, "the freed place was not taken");
    }
}

/// `HEAD` gets the headers of `GET`, with the same `Content-Length`, and
/// no body: the `GET` after it on the same connection reads correctly.
#[test]
fn head_gets_headers_and_no_body() {
    let server = Server::start();
    let (mut s, mut reader) = server.connect();
    s.write_all(b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let head = read_response(&mut reader, true);
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let get = read_response(&mut reader, false);
    assert_eq!(head.status, "HTTP/1.1 200 OK");
    assert_eq!(get.status, "HTTP/1.1 200 OK", "HEAD sent a body");
    assert_eq!(get.body, "Handled by server A\n");
    assert_eq!(head.content_length, get.content_length);
    assert_eq!(head.connection, "keep-alive");
}

/// A chunked body (with an extension and a trailer) is read to its end:
/// the `GET` after it on the same connection is answered.
#[test]
fn chunked_body_is_consumed() {
    let server = Server::start();
    let (mut s, mut reader) = server.connect();
    s.write_all(
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
          5\r\nhello\r\n1A;name=value\r\nabcdefghijklmnopqrstuvwxyz\r\n\
          0\r\nTrailer-Field: x\r\n\r\n",
    )
    .unwrap();
    let post = read_response(&mut reader, false);
    s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let get = read_response(&mut reader, false);
    assert_eq!(post.status, "HTTP/1.1 200 OK");
    assert_eq!(post.body, "Handled by server A\n");
    assert_eq!(get.status, "HTTP/1.1 200 OK");
    assert_eq!(get.body, "OK\n");
}

/// A `Content-Length` body is read to its end: the `GET` after it on the
/// same connection is answered.
#[test]
fn content_length_body_is_consumed() {
    let server = Server::start();
    let (mut s, mut reader) = server.connect();
    s.write_all(b"POST / HTTP/1.1\r\nContent-Length: 16\r\n\r\nGET / HTTP/1.1\r\n")
        .unwrap();
    let post = read_response(&mut reader, false);
    s.write_all(b"GET /health HTTP/1.1\r\n\r\n").unwrap();
    let get = read_response(&mut reader, false);
    assert_eq!(post.status, "HTTP/1.1 200 OK");
    assert_eq!(get.status, "HTTP/1.1 200 OK");
    assert_eq!(get.body, "OK\n");
}

/// A chunk size that is not hex gets `400` and a close.
#[test]
fn malformed_chunk_size_gets_400_and_close() {
    let server = Server::start();
    let reply = exchange(
        &server,
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
    );
    assert!(reply.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{reply}");
    assert!(reply.contains("Connection: close\r\n"), "{reply}");
}

/// A request line, or a header line, longer than `MAX_HEAD` with no
/// newline in sight gets `431` and a close, without the backend waiting
/// for the newline.
#[test]
fn endless_lines_get_431_and_close() {
    let server = Server::start();
    for start in [&b"GET /"[..], b"GET / HTTP/1.1\r\nX-Long: "] {
        let mut request = start.to_vec();
        request.resize(4 * MAX_HEAD, b'a');
        let reply = exchange(&server, &request);
        assert!(
            reply.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"),
            "{reply}"
        );
    }
}

/// Heads that cannot be read, and lengths that lie, each get their status
/// and a close; a request that is only redundant is answered.
#[test]
fn refuses_bad_heads() {
    let server = Server::start();
    let many_headers = format!(
        "GET / HTTP/1.1\r\n{}\r\n",
        "X: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n".repeat(300)
    );
    let few_but_long = format!(
        "GET / HTTP/1.1\r\n{}\r\n",
        format!("X: {}\r\n", "a".repeat(MAX_HEAD / 4)).repeat(5)
    );
    let cases: &[(&[u8], &str)] = &[
        (b"\r\nGET\r\n\r\n", "400"),
        (b"GET /\r\n\r\n", "400"),
        (b"GET  / HTTP/1.1\r\n\r\n", "400"),
        (b"GET / HTTP/1.1 x\r\n\r\n", "400"),
        (b"G(T / HTTP/1.1\r\n\r\n", "400"),
        (b"GET /\xff HTTP/1.1\r\n\r\n", "400"),
        (b"GET / HTTP/1.10\r\n\r\n", "400"),
        (b"GET / http/1.1\r\n\r\n", "400"),
        (b"GET / HTTP/2.0\r\n\r\n", "400"),
        (b"GET / HTTP/1.1\r\nno colon\r\n\r\n", "400"),
        (b"GET / HTTP/1.1\r\nHost : x\r\n\r\n", "400"),
        (b"GET / HTTP/1.1\r\nA: b\r\n folded\r\n\r\n", "400"),
        (b"GET / HTTP/1.1\r\nContent-Length: +5\r\n\r\n", "400"),
        (b"GET / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n", "400"),
        (
            b"GET / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
            "400",
        ),
        (
            b"GET / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            "400",
        ),
        (b"GET / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", "400"),
        (
            b"GET / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            "400",
        ),
        (many_headers.as_bytes(), "431"),
        (few_but_long.as_bytes(), "431"),
    ];
    for (input, status) in cases {
        let reply = exchange(&server, input);
        assert!(
            reply.starts_with(&format!("HTTP/1.1 {status} ")),
            "{}: {reply}",
            String::from_utf8_lossy(input)
        );
    }
    // Empty lines before a request are skipped (RFC 9112, 2.2); the same
    // length twice is only redundant.
    for redundant in [
        &b"\r\n\r\nPOST / HTTP/1.1\r\n\r\n"[..],
        b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
    ] {
        let (mut s, mut reader) = server.connect();
        s.write_all(redundant).unwrap();
        assert_eq!(read_response(&mut reader, false).status, "HTTP/1.1 200 OK");
    }
    // Both lengths: the chunked body is read, and the connection closed
    // after the answer (RFC 9112, 6.1), so no second request can hide in
    // what another reader would take for the body.
    let reply = exchange(
        &server,
        b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n\
          0\r\n\r\nGET /health HTTP/1.1\r\n\r\n",
    );
    // hyper adds `close` to the `Connection` header (the read ended by
    // the server's close is what matters).
    assert!(reply.starts_with("HTTP/1.1 200 OK\r\n"), "{reply}");
    assert!(reply.contains("close\r\n"), "{reply}");
    assert_eq!(reply.matches("HTTP/1.1").count(), 1, "{reply}");
}

/// After shutdown the listener is closed, and a connection already
/// accepted is still served until it ends.
#[test]
fn accepted_connections_outlive_the_listener() {
    let mut server = Server::start();
    let (mut s, mut reader) = server.connect();
    s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    assert_eq!(read_response(&mut reader, false).status, "HTTP/1.1 200 OK");
    server.stop();
    assert!(TcpStream::connect_timeout(&server.addr, TIMEOUT).is_err());
    s.write_all(b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")
        .unwrap();
    assert_eq!(read_response(&mut reader, false).body, "OK\n");
    assert_eq!(read_to_close(&mut reader), "");
}

/// A client that pipelines requests and never reads the answers is cut
/// once its answers have found no room for the request timeout, instead of
/// holding its connection for ever.
#[test]
fn a_client_that_never_reads_is_cut() {
    let server = Server::of(|demo| demo.request_timeout(Duration::from_secs(1)));
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    // Small buffers fill in a few thousand answers.
    socket.set_recv_buffer_size(4096).unwrap();
    socket.set_send_buffer_size(4096).unwrap();
    socket
        .connect_timeout(&server.addr.into(), TIMEOUT)
        .unwrap();
    let mut s: TcpStream = socket.into();
    // The cut comes after the stall (1 s) and the linger (2 s): on a
    // loaded machine a write may wait longer than TIMEOUT for it.
    s.set_write_timeout(Some(4 * TIMEOUT)).unwrap();
    let batch = b"GET / HTTP/1.1\r\n\r\n".repeat(1000);
    let started = Instant::now();
    let cut = loop {
        if let Err(err) = s.write_all(&batch) {
            break err;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "still taking requests after 30 s"
        );
    };
    assert!(
        !matches!(
            cut.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ),
        "{cut}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Any bytes, then the end of the client's stream: the backend closes,
    /// having answered `400` or `431` or nothing (never a `200` to bytes
    /// that are no request), and serves the next client.
    #[test]
    fn any_bytes_get_a_refusal_or_a_close(
        bytes in prop::collection::vec(any::<u8>(), 0..3000),
        heads in 0usize..3,
    ) {
        thread_local! {
            static SERVER: Server = Server::start();
        }
        SERVER.with(|server| {
            let mut input = bytes.clone();
            input.extend(b"\r\n\r\n".repeat(heads));
            let (mut s, mut reader) = server.connect();
            let _ = s.write_all(&input);
            let _ = s.shutdown(std::net::Shutdown::Write);
            let reply = read_to_close(&mut reader);
            let status = reply.lines().next().unwrap_or("");
            prop_assert!(
                status.is_empty()
                    || status.starts_with("HTTP/1.1 400 ")
                    || status.starts_with("HTTP/1.1 431 "),
                "{status:?}"
            );
            let (mut s, mut reader) = server.connect();
            s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
            prop_assert_eq!(read_response(&mut reader, false).body, "Handled by server A\n");
            Ok(())
        })?;
    }
}
