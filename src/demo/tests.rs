//! Unit tests of the demo backend: through a real socket on loopback, and
//! of the request reader on in-memory input.

use super::request::*;
use super::*;
use proptest::prelude::*;
use std::fmt;
use std::io::Cursor;
use std::io::Read;

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
        let shutdown = Shutdown::new();
        let demo = DemoBackend::bind("127.0.0.1:0".parse().unwrap(), Some("A".into())).unwrap();
        let addr = demo.local_addr().unwrap();
        let accept = Some(demo.spawn(shutdown.clone()).unwrap());
        Server {
            addr,
            shutdown,
            accept,
        }
    }

    /// A connection to it, and a buffered reader on the same socket.
    fn connect(&self) -> (TcpStream, BufReader<TcpStream>) {
        let s = TcpStream::connect(self.addr).unwrap();
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        s.set_write_timeout(Some(TIMEOUT)).unwrap();
        let reader = BufReader::new(s.try_clone().unwrap());
        (s, reader)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown.trigger();
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

/// One response as a client reads it.
#[derive(Debug)]
struct Response {
    status: String,
    content_length: usize,
    connection: String,
    body: String,
}

/// Reads one response; its body is `Content-Length` bytes, or none at all
/// when it answers a `HEAD`.
fn read_response(reader: &mut BufReader<TcpStream>, head_only: bool) -> Response {
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
    Response {
        status: status.trim_end().to_string(),
        content_length,
        connection,
        body: String::from_utf8(body).unwrap(),
    }
}

/// Reads until the server closes: it must close, not wait for more.
fn read_to_close(reader: &mut BufReader<TcpStream>) -> String {
    let mut rest = Vec::new();
    reader
        .read_to_end(&mut rest)
        .expect("the server closes in time");
    String::from_utf8_lossy(&rest).into_owned()
}

fn head_of(input: &[u8]) -> std::result::Result<Head, Stop> {
    read_head(&mut Cursor::new(input), &mut Vec::new())
}

fn rejected(result: std::result::Result<impl fmt::Debug, Stop>) -> Option<Reject> {
    match result {
        Err(Stop::Reject(reject)) => Some(reject),
        _ => None,
    }
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
    assert!(rest.starts_with("HTTP/1.1 200 OK\r\n"), "{rest}");
    assert!(rest.ends_with("\r\n\r\nOK\n"), "{rest}");
}

/// Past `max_connections`, a client gets the whole `503` (its
/// `Content-Length` right) and a close; a place freed is taken again.
#[test]
fn a_client_over_max_connections_gets_503() {
    let shutdown = Shutdown::new();
    let demo = DemoBackend::bind("127.0.0.1:0".parse().unwrap(), Some("A".into()))
        .unwrap()
        .max_connections(1);
    let addr = demo.local_addr().unwrap();
    let accept = demo.spawn(shutdown.clone()).unwrap();
    let server = Server {
        addr,
        shutdown,
        accept: Some(accept),
    };
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
    let (mut s, mut reader) = server.connect();
    s.write_all(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n")
        .unwrap();
    let reply = read_to_close(&mut reader);
    assert!(reply.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{reply}");
    assert!(reply.contains("Connection: close\r\n"), "{reply}");
}

/// A request line longer than `MAX_LINE` with no newline in sight gets
/// `414` and a close, without the backend waiting for the newline.
#[test]
fn endless_request_line_gets_414_and_close() {
    let server = Server::start();
    let (mut s, mut reader) = server.connect();
    let mut request = b"GET /".to_vec();
    request.resize(8 * MAX_LINE, b'a');
    s.write_all(&request).unwrap();
    let reply = read_to_close(&mut reader);
    assert!(
        reply.starts_with("HTTP/1.1 414 URI Too Long\r\n"),
        "{reply}"
    );
}

/// A header line longer than `MAX_LINE` with no newline gets `431` and a
/// close.
#[test]
fn endless_header_line_gets_431_and_close() {
    let server = Server::start();
    let (mut s, mut reader) = server.connect();
    let mut request = b"GET / HTTP/1.1\r\nX-Long: ".to_vec();
    request.resize(8 * MAX_LINE, b'a');
    s.write_all(&request).unwrap();
    let reply = read_to_close(&mut reader);
    assert!(
        reply.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"),
        "{reply}"
    );
}

#[test]
fn reads_a_head() {
    let head = head_of(
        b"GET /x HTTP/1.0\r\nHost: h\r\ncontent-length:  12 \r\n\
          Connection: Upgrade, keep-alive\r\n\r\nbody",
    )
    .unwrap();
    assert_eq!(head.request.to_string(), "GET /x HTTP/1.0");
    assert_eq!(head.body, Body::Length(12));
    assert!(head.keep_alive());
    // Bare `\n` line endings are taken too.
    let head = head_of(b"POST / HTTP/1.1\nTransfer-Encoding: Chunked\n\n").unwrap();
    assert_eq!(head.body, Body::Chunked);
    assert!(head.keep_alive());
    let head = head_of(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n").unwrap();
    assert!(!head.keep_alive());
    let head = head_of(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    assert!(!head.keep_alive());
    assert!(matches!(head_of(b""), Err(Stop::Closed)));
    assert!(matches!(
        head_of(b"GET / HTTP/1.1\r\nHost"),
        Err(Stop::Closed)
    ));
}

#[test]
fn refuses_bad_heads() {
    use Reject::*;
    let long_line = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(MAX_LINE));
    let long_header = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(MAX_LINE));
    let many_headers = format!(
        "GET / HTTP/1.1\r\n{}\r\n",
        "X: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n".repeat(300)
    );
    let cases: &[(&[u8], Reject)] = &[
        (b"\r\n", BadRequest),
        (b"GET /\r\n\r\n", BadRequest),
        (b"GET  / HTTP/1.1\r\n\r\n", BadRequest),
        (b"GET / HTTP/1.1 x\r\n\r\n", BadRequest),
        (b"G(T / HTTP/1.1\r\n\r\n", BadRequest),
        (b"GET /\xff HTTP/1.1\r\n\r\n", BadRequest),
        (b"GET / HTTP/1.10\r\n\r\n", BadRequest),
        (b"GET / http/1.1\r\n\r\n", BadRequest),
        (b"GET / HTTP/2.0\r\n\r\n", VersionNotSupported),
        (b"GET / HTTP/1.1\r\nno colon\r\n\r\n", BadRequest),
        (b"GET / HTTP/1.1\r\nHost : x\r\n\r\n", BadRequest),
        (b"GET / HTTP/1.1\r\nA: b\r\n folded\r\n\r\n", BadRequest),
        (b"GET / HTTP/1.1\r\nContent-Length: +5\r\n\r\n", BadRequest),
        (
            b"GET / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n",
            BadRequest,
        ),
        (
            b"GET / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
            BadRequest,
        ),
        (
            b"GET / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            BadRequest,
        ),
        (
            b"GET / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
            BadRequest,
        ),
        (
            b"GET / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
            NotImplemented,
        ),
        (long_line.as_bytes(), UriTooLong),
        (long_header.as_bytes(), HeaderTooLarge),
        (many_headers.as_bytes(), HeaderTooLarge),
    ];
    for (input, reject) in cases {
        let got = rejected(head_of(input));
        assert_eq!(got, Some(*reject), "{}", String::from_utf8_lossy(input));
    }
    // The same length twice is only redundant.
    let head = head_of(b"GET / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n");
    assert_eq!(head.unwrap().body, Body::Length(5));
}

#[test]
fn skips_chunked_bodies_and_refuses_bad_ones() {
    let skip = |input: &[u8]| {
        let mut cursor = Cursor::new(input);
        let result = skip_chunked(&mut cursor, &mut Vec::new());
        (result, cursor.position())
    };
    let body = b"3\r\nabc\r\n10 ; a=b\r\n0123456789abcdef\r\n0\r\nT: x\r\n\r\nNEXT";
    let (result, read) = skip(body);
    assert!(result.is_ok());
    assert_eq!(read as usize, body.len() - 4);
    let (result, _) = skip(b"0\n\n");
    assert!(result.is_ok());
    for bad in [
        &b"zz\r\n"[..],
        b"\r\n",
        b"-1\r\n",
        b"12345678123456781\r\n",
        b"3\r\nabcd\r\n0\r\n\r\n",
        b"3\r\nabc\r0\r\n\r\n",
    ] {
        let (result, _) = skip(bad);
        assert_eq!(
            rejected(result),
            Some(Reject::BadRequest),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
    let (result, _) = skip(b"3\r\nab");
    assert!(matches!(result, Err(Stop::Closed)));
}

/// A method, as [`parse_request_line`] takes them.
fn method() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec!["GET", "HEAD", "POST", "PUT", "OPTIONS"]).prop_map(String::from),
        "[!#$%&'*+.^_`|~0-9A-Za-z-]{1,20}",
    ]
}

/// A request target, as [`parse_request_line`] takes them.
fn target() -> impl Strategy<Value = String> {
    prop_oneof!["/[!-~]{0,200}", "[!-~]{1,200}"]
}

/// Random bytes, up to `len` of them, repeated up to `times` times: long
/// inputs, with their newlines, at a small cost.
fn repeated(len: usize, times: usize) -> impl Strategy<Value = Vec<u8>> {
    (prop::collection::vec(any::<u8>(), 0..len), 0..=times).prop_map(|(b, n)| b.repeat(n))
}

proptest! {
    /// Any bytes: no panic, and never more than `MAX_HEAD` bytes read.
    #[test]
    fn any_bytes_read_at_most_the_bound(input in repeated(1000, 40)) {
        let mut cursor = Cursor::new(&input[..]);
        let _ = read_head(&mut cursor, &mut Vec::new());
        prop_assert!(cursor.position() as usize <= MAX_HEAD);
    }

    /// A valid request line then any header bytes, with newlines likely:
    /// no panic, and never more than `MAX_HEAD` bytes read.
    #[test]
    fn any_headers_read_at_most_the_bound(
        lines in prop::collection::vec(
            prop_oneof![
                "[ -~]{0,100}",
                ("[A-Za-z-]{1,20}", b' '..=b'~', 0..3000usize).prop_map(|(name, b, len)| {
                    format!("{name}: {}", char::from(b).to_string().repeat(len))
                }),
                repeated(100, 100).prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
            ],
            0..20,
        ),
    ) {
        let input = format!("GET / HTTP/1.1\r\n{}", lines.join("\r\n"));
        let mut cursor = Cursor::new(input.as_bytes());
        let _ = read_head(&mut cursor, &mut Vec::new());
        prop_assert!(cursor.position() as usize <= MAX_HEAD);
    }

    /// Any bytes as a chunked body: no panic.
    #[test]
    fn any_chunked_body_is_handled(input in prop::collection::vec(any::<u8>(), 0..2_000)) {
        let _ = skip_chunked(&mut Cursor::new(&input[..]), &mut Vec::new());
    }

    /// A well-formed request line, formatted, parses back equal, alone
    /// and at the head of a request.
    #[test]
    fn request_line_round_trips(method in method(), target in target(), minor in 0u8..=9) {
        let request = RequestLine { method, target, minor };
        let line = request.to_string();
        prop_assert_eq!(parse_request_line(line.as_bytes()), Ok(request.clone()));
        let head = head_of(format!("{line}\r\nHost: x\r\n\r\n").as_bytes());
        prop_assert_eq!(head.ok().map(|h| h.request), Some(request));
    }

    /// A chunked body with any chunk sizes and data is skipped to its
    /// exact end.
    #[test]
    fn chunked_bodies_skip_to_their_end(
        chunks in prop::collection::vec(prop::collection::vec(any::<u8>(), 1..300), 0..10),
        upper in any::<bool>(),
    ) {
        let mut body = Vec::new();
        for chunk in &chunks {
            let size = if upper { format!("{:X}", chunk.len()) } else { format!("{:x}", chunk.len()) };
            body.extend_from_slice(format!("{size}\r\n").as_bytes());
            body.extend_from_slice(chunk);
            body.extend_from_slice(b"\r\n");
        }
        body.extend_from_slice(b"0\r\n\r\n");
        let end = body.len();
        body.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        let mut cursor = Cursor::new(&body[..]);
        prop_assert!(skip_chunked(&mut cursor, &mut Vec::new()).is_ok());
        prop_assert_eq!(cursor.position() as usize, end);
    }
}
