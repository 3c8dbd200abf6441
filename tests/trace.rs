//! `--trace`: one connection through a demo backend, narrated step by step
//! in the order of the data path, in English and in Portuguese.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
        format!(
            "shutdown(SHUT_RDWR) then close() on both sockets: {sent} bytes went to the \
             backend, {received} bytes to the client, in "
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
            "shutdown(SHUT_RDWR) e depois close() nos dois sockets: {} bytes foram para o \
             backend, {} bytes para o cliente, em ",
            request.len(),
            reply.len()
        ),
        "volta a esperar na fila (".into(),
    ] {
        at = find(&l, &step, at);
    }
    lb.stop();
}

/// The binary: standard output and standard error of a `rodizio` run,
/// read by threads into one channel each, killed on drop if still alive.
struct Run {
    child: std::process::Child,
    out: crossbeam_channel::Receiver<String>,
    err: crossbeam_channel::Receiver<String>,
}

impl Run {
    fn start(args: &[&str], lang: &str) -> Run {
        use std::io::{BufRead, BufReader};
        use std::process::{Command, Stdio};
        let mut child = Command::new(env!("CARGO_BIN_EXE_rodizio"))
            // The tests run as root on CI.
            .arg("--allow-root")
            .args(args)
            .env("LANG", lang)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start rodizio");
        let lines = |pipe: Box<dyn std::io::Read + Send>| {
            let (tx, rx) = crossbeam_channel::unbounded();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
            rx
        };
        let out = lines(Box::new(child.stdout.take().unwrap()));
        let err = lines(Box::new(child.stderr.take().unwrap()));
        Run { child, out, err }
    }

    /// The balancer's address, from its `Load balancer listening` line.
    fn balancer(&self) -> SocketAddr {
        loop {
            let line = self
                .out
                .recv_timeout(common::IO_TIMEOUT)
                .expect("the listening line in time");
            if let Some(rest) = line.strip_prefix("Load balancer listening on port ") {
                let port = rest.split(' ').next().unwrap_or_default();
                return format!("127.0.0.1:{port}").parse().unwrap();
            }
        }
    }

    /// Standard error until a line contains `needle` (bounded).
    fn err_until(&self, needle: &str) -> Vec<String> {
        let mut got = Vec::new();
        while !got.last().is_some_and(|l: &String| l.contains(needle)) {
            match self.err.recv_timeout(common::IO_TIMEOUT) {
                Ok(line) => got.push(line),
                Err(_) => panic!("no {needle:?} on stderr in time: {got:#?}"),
            }
        }
        got
    }

    /// SIGTERM, then all of standard error up to the exit (bounded).
    fn stop(mut self) -> Vec<String> {
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: signalling the child this test started, by its PID.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        let mut got = Vec::new();
        while let Ok(line) = self.err.recv_timeout(common::IO_TIMEOUT) {
            got.push(line);
        }
        assert!(
            common::wait_for(common::IO_TIMEOUT, || self
                .child
                .try_wait()
                .is_ok_and(|s| s.is_some())),
            "rodizio did not exit"
        );
        got
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `LANG=pt_BR.UTF-8 rodizio --trace demo`: the binary narrates in
/// Portuguese without `--trace-lang`, as log lines of target
/// `rodizio::trace` on standard error; without `--trace` it tells nothing.
#[test]
fn the_binary_traces_on_stderr_in_the_language_of_lang() {
    let demo = ["demo", "--backends", "1", "--first-port", "0"];
    let traced = Run::start(
        &[&["-l", "127.0.0.1:0", "--trace"], &demo[..]].concat(),
        "pt_BR.UTF-8",
    );
    let addr = traced.balancer();
    let mut s = connect(addr).unwrap();
    let client = s.local_addr().unwrap();
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    drop(s);
    let err = traced.err_until("volta a esperar na fila");
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
    traced.stop();

    let quiet = Run::start(&[&["-l", "127.0.0.1:0"], &demo[..]].concat(), "pt_BR.UTF-8");
    let addr = quiet.balancer();
    assert!(common::request(addr).is_ok());
    let err = quiet.stop();
    assert!(
        !err.iter().any(|l| l.contains("rodizio::trace")),
        "{err:#?}"
    );
    assert!(
        err.iter().any(|l| l.contains("all connections finished")),
        "the log was read to its end: {err:#?}"
    );
}
