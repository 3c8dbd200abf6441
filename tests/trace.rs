//! `--trace`: one connection through a demo backend, narrated step by step
//! in the order of the data path, in English and in Portuguese.

mod child;
mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use child::Child;
use common::{connect, until, Demo, TestBalancer};
use rodizio::limiter::{Rate, RateLimitConfig};
use rodizio::trace::{self, Lang};

/// The trace is process-wide (one switch, one output): the tests of this
/// file take turns.
static TURN: Mutex<()> = Mutex::new(());

/// Every trace line of the process from now on, collected.
fn capture() -> Arc<Mutex<Vec<String>>> {
    let lines: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink = Arc::clone(&lines);
    trace::set_output(Some(Box::new(move |line: &str| {
        sink.lock().unwrap().push(line.to_string())
    })));
    lines
}

/// The lines of the connection whose accepted line names `client`, without
/// their `#id ` prefix, once its last line (the worker back to waiting,
/// which ends with `last`) has come.
fn lines_of(lines: &Mutex<Vec<String>>, client: SocketAddr, last: &str) -> Vec<String> {
    let needle = format!(" {client}");
    let id = || {
        let lines = lines.lock().unwrap();
        let line = lines.iter().find(|l| l.contains(&needle))?;
        Some(line.split(' ').next()?.to_string())
    };
    let mine = || -> Vec<String> {
        let Some(id) = id() else { return Vec::new() };
        let prefix = format!("{id} ");
        lines
            .lock()
            .unwrap()
            .iter()
            .filter_map(|l| l.strip_prefix(&prefix).map(str::to_string))
            .collect()
    };
    until("the connection's last trace line", || {
        mine().last().is_some_and(|l| l.contains(last))
    });
    mine()
}

/// Index of the first line containing `what`, after line `after`.
fn find(lines: &[String], what: &str, after: usize) -> usize {
    lines
        .iter()
        .enumerate()
        .skip(after)
        .find(|(_, l)| l.contains(what))
        .map(|(i, _)| i)
        .unwrap_or_else(|| panic!("no line with {what:?} after line {after} in {lines:#?}"))
}

/// The byte count of a flow line of direction `arrow`: the first number
/// after `arrow: `.
fn flow_bytes(line: &str, arrow: &str) -> Option<u64> {
    let rest = line.strip_prefix(&format!("{arrow}: "))?;
    rest.split(' ').find_map(|w| w.parse().ok())
}

/// A request with a 2 MiB body, through rate limiting and round robin to
/// the first of two demo backends: every step is told, in the order the
/// data goes, naming the backend that answered, and the bytes told each
/// way add up to what the client sent and received, in far fewer lines
/// than the pump's 4096-byte chunks.
#[test]
fn one_connection_is_narrated_in_the_order_of_the_data_path() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let lines = capture();
    let one = Demo::start("127.0.0.1:0", "one");
    let two = Demo::start("127.0.0.1:0", "two");
    let lb = TestBalancer::with(&[one.addr, two.addr], |c| {
        c.trace = true;
        c.trace_lang = Lang::En;
        c.rate_limit = Some(RateLimitConfig::new(Rate {
            limit: 10,
            window: Duration::from_secs(60),
        }));
    });

    let body = vec![b'x'; 2 << 20];
    let head = format!(
        "POST /upload HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let mut s = connect(lb.addr).unwrap();
    let client = s.local_addr().unwrap();
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(&body).unwrap();
    let mut reply = Vec::new();
    s.read_to_end(&mut reply).unwrap();
    drop(s);
    let sent = (head.len() + body.len()) as u64;
    let received = reply.len() as u64;
    let text = String::from_utf8_lossy(&reply);
    assert!(text.ends_with("Handled by server one\n"), "{text}");

    let l = lines_of(&lines, client, "goes back to waiting on the queue");
    let backend = one.addr.to_string();
    let mut at = 0;
    for step in [
        format!("accepted client {client}: accept() gave its socket, fd "),
        "rate limit: 127.0.0.1 allowed, 1 of 10 connections in this 1m window".into(),
        format!("round robin chose server_idx 0: backend {backend}"),
        "pushed (server_idx, client) into the queue, nobody ahead of it".into(),
        "taken by worker 1 (a new thread, its first client) after ".into(),
        format!("connected to backend {backend} in "),
        "client → backend: first ".into(),
        "backend → client: first ".into(),
        "the backend finished sending (read returned 0): half-close passed on, \
         shutdown(SHUT_WR) toward the client"
            .into(),
        // The client closes after reading the reply: a clean end, both
        // sockets read to their end, nothing left to shut down.
        format!(
            "close() on both sockets, each read to its end (no shutdown(SHUT_RDWR) left \
             to do): {sent} bytes went to the backend, {received} bytes to the client, in "
        ),
        "worker 1 goes back to waiting on the queue (1 client(s) served)".into(),
    ] {
        at = find(&l, &step, at);
    }
    assert!(!l.iter().any(|x| x.contains("failed")), "{l:#?}");

    let told = |arrow: &str| -> (u64, usize) {
        let counts: Vec<u64> = l.iter().filter_map(|x| flow_bytes(x, arrow)).collect();
        (counts.iter().sum(), counts.len())
    };
    let (up, up_lines) = told("client → backend");
    let (down, _) = told("backend → client");
    assert_eq!(up, sent, "{l:#?}");
    assert_eq!(down, received, "{l:#?}");
    // 2 MiB go through in about 512 chunks of 4096 bytes; the trace tells
    // them at most once per MiB or per 100 ms, plus the first chunk.
    assert!(
        up_lines < 40,
        "{up_lines} lines for the upload: not coalesced"
    );
    lb.stop();
}

/// The same steps in Portuguese (`--trace-lang pt`).
#[test]
fn the_trace_speaks_portuguese() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let lines = capture();
    let one = Demo::start("127.0.0.1:0", "um");
    let lb = TestBalancer::with(&[one.addr], |c| {
        c.trace = true;
        c.trace_lang = Lang::Pt;
    });
    let mut s = connect(lb.addr).unwrap();
    let client = s.local_addr().unwrap();
    let request = b"GET / HTTP/1.0\r\n\r\n";
    s.write_all(request).unwrap();
    let mut reply = Vec::new();
    s.read_to_end(&mut reply).unwrap();
    drop(s);

    let l = lines_of(&lines, client, "volta a esperar na fila");
    let mut at = 0;
    for step in [
        format!("cliente {client} aceito: o accept() devolveu o socket dele, fd "),
        format!("o round robin escolheu server_idx 0: backend {}", one.addr),
        format!("conectado ao backend {} em ", one.addr),
        format!(
            "cliente → backend: passaram os primeiros {} bytes",
            request.len()
        ),
        format!(
            "close() nos dois sockets, cada um lido até o fim (nenhum shutdown(SHUT_RDWR) a \
             fazer): {} bytes foram para o backend, {} bytes para o cliente, em ",
            request.len(),
            reply.len()
        ),
        "volta a esperar na fila (".into(),
    ] {
        at = find(&l, &step, at);
    }
    lb.stop();
}

/// `rodizio --allow-root ARGS` with `LANG=lang`, listening.
fn start(args: &[&str], lang: &str) -> Child {
    let mut command = child::command(&[&["--allow-root"], args].concat());
    Child::start(command.env("LANG", lang))
}

/// Its log's lines, to the first that contains `needle` (at least).
fn log_until(child: &mut Child, needle: &str) -> Vec<String> {
    child.next_log(needle);
    child.log().lines().map(String::from).collect()
}

/// SIGTERM, then all of its log up to the exit.
fn stop(mut child: Child) -> Vec<String> {
    assert!(child.stop().is_some(), "rodizio did not exit");
    child.log().lines().map(String::from).collect()
}

/// `LANG=pt_BR.UTF-8 rodizio --trace demo`: the binary narrates in
/// Portuguese without `--trace-lang`, as log lines of target
/// `rodizio::trace` on standard error; without `--trace` it tells nothing.
#[test]
fn the_binary_traces_on_stderr_in_the_language_of_lang() {
    let demo = ["demo", "--backends", "1", "--first-port", "0"];
    let mut traced = start(
        &[&["-l", "127.0.0.1:0", "--trace"], &demo[..]].concat(),
        "pt_BR.UTF-8",
    );
    let addr = traced.addr;
    let mut s = connect(addr).unwrap();
    let client = s.local_addr().unwrap();
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    drop(s);
    let err = log_until(&mut traced, "volta a esperar na fila");
    let accepted = err
        .iter()
        .find(|l| l.contains(&format!("cliente {client} aceito")))
        .unwrap_or_else(|| panic!("no accepted line: {err:#?}"));
    assert!(accepted.contains(" INFO  rodizio::trace] #"), "{accepted}");
    assert!(
        err.iter()
            .any(|l| l.contains("conectado ao backend 127.0.0.1:")),
        "{err:#?}"
    );
    stop(traced);

    let quiet = start(&[&["-l", "127.0.0.1:0"], &demo[..]].concat(), "pt_BR.UTF-8");
    let addr = quiet.addr;
    assert!(common::request(addr).is_ok());
    let err = stop(quiet);
    assert!(
        !err.iter().any(|l| l.contains("rodizio::trace")),
        "{err:#?}"
    );
    assert!(
        err.iter().any(|l| l.contains("all connections finished")),
        "the log was read to its end: {err:#?}"
    );
}

/// A client of an address routed by SNI that takes 1.2 s to send its
/// ClientHello (past the 1 s after which a wait in the queue is warned
/// about): one connection number from accept to close, the SNI line
/// included, and the hello's read is neither told nor logged as time in
/// the queue (the access log's `queue_us`), though the connection's
/// duration holds it.
#[test]
fn a_slow_hello_routed_by_sni_is_one_connection_and_no_queue_wait() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let lines = capture();
    let backend = common::TestBackend::echo();
    let dir = child::Scratch::new("trace-slow-hello");
    let log = dir.path("access.log");
    let lb = TestBalancer::with(&[backend.addr()], |c| {
        c.trace = true;
        c.trace_lang = Lang::En;
        c.sni.server_names = Some("a.test".parse().unwrap());
        c.access_log = Some(rodizio::access_log::Format::Json);
        c.access_log_file = Some(log.clone());
    });
    let mut s = connect(lb.addr).unwrap();
    let client = s.local_addr().unwrap();
    // The slow client under test: its hello comes 1.2 s after its connect.
    std::thread::sleep(Duration::from_millis(1200));
    let hello = rodizio::sni::client_hello::build(Some("a.test"), 0);
    s.write_all(&hello).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut back = Vec::new();
    s.read_to_end(&mut back).unwrap();
    assert_eq!(back, hello);
    drop(s);

    let l = lines_of(&lines, client, "goes back to waiting on the queue");
    let taken = find(&l, "taken by worker", 0);
    let sni = find(&l, "SNI: the ClientHello asks for a.test", taken);
    find(&l, "connected to backend", sni);
    assert!(
        !lines.lock().unwrap().iter().any(|x| x.starts_with("#0 ")),
        "a line without its connection's number"
    );
    until("the access log's line", || {
        std::fs::read_to_string(&log).is_ok_and(|t| t.contains("\"end\""))
    });
    let text = std::fs::read_to_string(&log).unwrap();
    let line: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    let queue = line["queue_us"].as_u64().unwrap();
    let duration = line["duration_us"].as_u64().unwrap();
    assert!(
        queue < 1_000_000,
        "the hello's read logged as queue: {line}"
    );
    // From the accept, which may come a little after the client's
    // connect returned: over a second, not necessarily over 1.2 s.
    assert!(duration >= 1_000_000, "{line}");
    lb.stop();
}
