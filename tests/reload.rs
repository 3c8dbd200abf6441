//! Reloading the config file under load, through the real binary and
//! SIGHUP: backends added, removed and reweighed, a bad file refused, while
//! 30 clients keep connecting; no request fails, a removed backend gets no
//! new connection, and a connection in flight on it finishes byte for byte.

mod child;
mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use child::{Child, Scratch, WAIT};
use common::{connect, request, test_data, wait_for, Demo, Handler, TestBackend};

/// Requests in all, and clients sending them at once.
const REQUESTS: usize = 3000;
const CLIENTS: usize = 30;
/// Longest the whole load may take.
const LOAD_LIMIT: Duration = Duration::from_secs(120);
/// The slow stream: this many bytes before the reloads, as many after.
const HALF: usize = 64 * 1024;

/// The balancer binary with `-c CONFIG` (and the kernel relay in the
/// second pass of `make test`: `child::kernel_relay_flags`).
fn start(config: &Path) -> Child {
    let mut command = child::command(&["--allow-root", "-c"]);
    Child::start(command.arg(config).args(child::kernel_relay_flags()))
}

/// A backend that answers like the demo backend (`Handled by server
/// NAME`), notes when its first connection arrived, and on `GET /stream`
/// sends [`HALF`] bytes, waits for `gate`, then sends [`HALF`] more.
fn named_backend(
    name: &'static str,
    first: Arc<OnceLock<Instant>>,
    gate: Option<Receiver<()>>,
    data: Arc<Vec<u8>>,
) -> TestBackend {
    let handler: Arc<Handler> = Arc::new(move |stream: TcpStream| {
        first.get_or_init(Instant::now);
        let mut reader = BufReader::new(stream.try_clone()?);
        let mut request_line = String::new();
        reader.read_line(&mut request_line)?;
        let mut line = String::new();
        while reader.read_line(&mut line)? > 2 && line.len() < 16 * 1024 {
            line.clear();
        }
        let mut stream = stream;
        match &gate {
            Some(gate) if request_line.starts_with("GET /stream ") => {
                stream
                    .write_all(format!("HTTP/1.1 200 OK\r\nX-Stream: {name}\r\n\r\n").as_bytes())?;
                stream.write_all(&data[..HALF])?;
                let _ = gate.recv_timeout(WAIT);
                stream.write_all(&data[HALF..])?;
            }
            _ => {
                let body = format!("Handled by server {name}\n");
                stream.write_all(
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                )?;
            }
        }
        stream.shutdown(std::net::Shutdown::Write)
    });
    TestBackend::start(handler)
}

/// Opens `GET /stream` through the balancer until it lands on the
/// streaming backend; returns the connection after its first [`HALF`]
/// bytes, checked.
fn open_stream(balancer: SocketAddr, data: &[u8]) -> BufReader<TcpStream> {
    for _ in 0..10 {
        let mut s = connect(balancer).unwrap();
        s.write_all(b"GET /stream HTTP/1.1\r\nHost: test\r\n\r\n")
            .unwrap();
        let mut reader = BufReader::new(s);
        let mut head = String::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
                break;
            }
            head.push_str(&line);
        }
        if head.contains("X-Stream: B") {
            let mut got = vec![0; HALF];
            reader.read_exact(&mut got).unwrap();
            assert!(got == data[..HALF], "the stream's first half differs");
            return reader;
        }
    }
    panic!("no connection reached the streaming backend");
}

/// One client's results.
#[derive(Default)]
struct Results {
    /// (when the request started, which backend answered)
    answers: Vec<(Instant, String)>,
    failures: Vec<String>,
}

/// Three backends, four reloads (one refused) under 3,000 requests from
/// 30 clients: no request fails; once the reload that removes B is logged,
/// no new request reaches B; the stream in flight on B finishes byte for
/// byte, then B leaves the list; the new backend C gets its first
/// connection soon after the SIGHUP that adds it.
#[test]
fn reloads_under_load_lose_nothing() {
    let dir = Scratch::new("reload");
    let path = dir.path("rodizio.json");
    let data = Arc::new(test_data(2 * HALF, 7));

    let a = Demo::start("127.0.0.1:0", "A");
    let (release, gate): (Sender<()>, Receiver<()>) = crossbeam_channel::bounded(1);
    let b_first = Arc::new(OnceLock::new());
    let b = named_backend("B", b_first, Some(gate), Arc::clone(&data));
    let c_first = Arc::new(OnceLock::new());
    let c = named_backend("C", Arc::clone(&c_first), None, Arc::clone(&data));
    let (a_addr, b_addr, c_addr) = (a.addr, b.addr(), c.addr());
    let file = |backends: &str, algorithm: &str| {
        format!(
            r#"{{"listen": "127.0.0.1:0", "health_check": "off", "algorithm": "{algorithm}",
                 "backends": [{backends}]}}"#
        )
    };

    dir.file(
        "rodizio.json",
        file(
            &format!(r#""{a_addr}", "{b_addr}""#),
            "weighted-round-robin",
        ),
    );
    let mut balancer = start(&path);
    let addr = balancer.addr;
    let mut stream = open_stream(addr, &data);

    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let results = Arc::new(Mutex::new(Results::default()));
    let deadline = Instant::now() + LOAD_LIMIT;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (next, done, results) = (next.clone(), done.clone(), results.clone());
            thread::spawn(move || {
                while next.fetch_add(1, Ordering::SeqCst) < REQUESTS && Instant::now() < deadline {
                    let started = Instant::now();
                    let outcome = request(addr);
                    let mut r = results.lock().unwrap();
                    match outcome {
                        Ok(name) => r.answers.push((started, name)),
                        Err(e) => r.failures.push(e.to_string()),
                    }
                    drop(r);
                    done.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    let at = |n: usize| {
        assert!(
            wait_for(LOAD_LIMIT, || done.load(Ordering::SeqCst) >= n),
            "the load stalled before {n} requests"
        );
    };

    // 1. C added, A's weight changed.
    at(500);
    dir.file(
        "rodizio.json",
        file(
            &format!(r#""{a_addr},weight=2", "{b_addr}", "{c_addr}""#),
            "weighted-round-robin",
        ),
    );
    let hup = Instant::now();
    balancer.signal(libc::SIGHUP);
    let line = balancer.next_log("reload: ");
    assert!(line.contains(&format!("+1 backend ({c_addr})")), "{line}");
    assert!(line.contains(&format!("weight {a_addr} 1 → 2")), "{line}");
    assert!(
        wait_for(WAIT, || c_first.get().is_some()),
        "C got no connection"
    );
    let to_first = *c_first.get().unwrap() - hup;

    // 2. B removed while the stream is in flight on it.
    at(1000);
    dir.file(
        "rodizio.json",
        file(
            &format!(r#""{a_addr},weight=2", "{c_addr}""#),
            "weighted-round-robin",
        ),
    );
    balancer.signal(libc::SIGHUP);
    let line = balancer.next_log("reload: ");
    assert!(line.contains(&format!("draining {b_addr} (")), "{line}");
    let b_drained = Instant::now();

    // 3. A bad file: refused, nothing changes.
    at(1500);
    dir.file("rodizio.json", "{\n  \"backends\": [\"127.0.0.1:1\"],,\n}");
    balancer.signal(libc::SIGHUP);
    let line = balancer.next_log("reload refused");
    assert!(line.contains("line 2, column"), "{line}");

    // 4. Weights changed again, and the algorithm.
    at(2000);
    dir.file(
        "rodizio.json",
        file(
            &format!(r#""{a_addr}", "{c_addr},weight=3""#),
            "least_connections",
        ),
    );
    balancer.signal(libc::SIGHUP);
    let line = balancer.next_log("reload: ");
    assert!(line.contains(&format!("weight {c_addr} 1 → 3")), "{line}");
    assert!(
        line.contains("algorithm weighted-round-robin → least-connections"),
        "{line}"
    );

    // The stream on B, in flight through every reload, finishes.
    release.send(()).unwrap();
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).unwrap();
    assert_eq!(rest.len(), HALF, "the stream's second half");
    assert!(rest == data[HALF..], "the stream's second half differs");
    // B has half-closed; the connection ends when the client closes too.
    drop(stream);
    balancer.next_log(&format!("reload: {b_addr} drained and removed"));

    for client in clients {
        client.join().unwrap();
    }
    let r = results.lock().unwrap();
    assert!(
        r.failures.is_empty(),
        "{} failed: {:?}",
        r.failures.len(),
        &r.failures[..r.failures.len().min(5)]
    );
    assert_eq!(r.answers.len(), REQUESTS);
    let late_b = r
        .answers
        .iter()
        .filter(|(t, name)| *t > b_drained && name == "B")
        .count();
    assert_eq!(late_b, 0, "requests started after B's drain reached B");
    let count = |n: &str| r.answers.iter().filter(|(_, name)| name == n).count();
    assert!(count("A") > 0 && count("B") > 0 && count("C") > 0);
    eprintln!(
        "reload under load: {REQUESTS} requests, 0 failed (A {}, B {}, C {}); \
         SIGHUP to C's first connection: {to_first:?}",
        count("A"),
        count("B"),
        count("C")
    );
    assert!(to_first < Duration::from_secs(5), "{to_first:?}");

    balancer.signal(libc::SIGTERM);
    assert!(balancer.wait_exit(WAIT).is_some(), "did not stop");
}
