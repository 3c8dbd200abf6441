//! Helpers shared by the integration tests: backends (test handlers or the
//! demo backend) and a balancer on `127.0.0.1:0`, clients with timeouts, a
//! small HTTP client, polling with a deadline, test data.
//!
//! Everything started here is stopped and joined when its handle is dropped,
//! so a test never leaks a thread or a socket, even when it fails half-way.

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{self, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};
use rodizio::backend::{Backend, BackendSpec};
use rodizio::demo::DemoBackend;
use rodizio::proxy::ProxyConfig;
use rodizio::scheduler::Scheduler;
use rodizio::stats::Stats;
use rodizio::{Balancer, Config, Shutdown};

/// Read and write timeout of every test socket: a bug fails a test instead
/// of hanging it.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// What a test backend does with each connection.
pub type Handler = dyn Fn(TcpStream) -> io::Result<()> + Send + Sync + 'static;

/// One test backend on `127.0.0.1:0`: an accept thread and a thread per
/// connection running its handler. It counts the connections it accepted.
pub struct TestBackend {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    accept_thread: Option<JoinHandle<()>>,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl TestBackend {
    /// Starts a backend on `127.0.0.1:0` that runs `handler` on every
    /// connection.
    pub fn start(handler: Arc<Handler>) -> TestBackend {
        TestBackend::start_on("127.0.0.1:0".parse().unwrap(), handler)
    }

    /// Starts a backend on `addr` that runs `handler` on every connection.
    pub fn start_on(addr: SocketAddr, handler: Arc<Handler>) -> TestBackend {
        let listener = TcpListener::bind(addr).expect("bind test backend");
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let accept_thread = {
            let (accepted, stop, conns) = (accepted.clone(), stop.clone(), conns.clone());
            thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    accepted.fetch_add(1, Ordering::SeqCst);
                    let _ = stream.set_read_timeout(Some(IO_TIMEOUT));
                    let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
                    let handler = handler.clone();
                    let conn = thread::spawn(move || {
                        let _ = handler(stream);
                    });
                    let mut conns = conns.lock().unwrap();
                    conns.retain(|c| !c.is_finished());
                    conns.push(conn);
                }
            })
        };
        TestBackend {
            addr,
            accepted,
            stop,
            accept_thread: Some(accept_thread),
            conns,
        }
    }

    /// An echo backend: sends back every byte, passes the end of stream on.
    pub fn echo() -> TestBackend {
        TestBackend::start(Arc::new(echo))
    }

    /// A backend that reads until the client's end of stream, and only then
    /// replies with what [`after_eof_reply`] makes of it.
    pub fn reply_after_eof() -> TestBackend {
        TestBackend::start(Arc::new(|mut stream: TcpStream| {
            let mut got = Vec::new();
            stream.read_to_end(&mut got)?;
            stream.write_all(&after_eof_reply(&got))?;
            stream.shutdown(net::Shutdown::Write)
        }))
    }

    /// A minimal keep-alive HTTP backend answering `backend N` as the body.
    pub fn http(n: usize) -> TestBackend {
        TestBackend::start(Arc::new(move |stream| serve_http(stream, n)))
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for TestBackend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept so it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.accept_thread.take() {
            let _ = t.join();
        }
        let conns = std::mem::take(&mut *self.conns.lock().unwrap());
        for c in conns {
            let _ = c.join();
        }
    }
}

/// Echoes until end of stream, then half-closes.
pub fn echo(mut stream: TcpStream) -> io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return stream.shutdown(net::Shutdown::Write);
        }
        stream.write_all(&buf[..n])?;
    }
}

/// The reply of [`TestBackend::reply_after_eof`]: the length as 8 bytes
/// then the bytes reversed, so a lost, added or reordered byte shows.
pub fn after_eof_reply(got: &[u8]) -> Vec<u8> {
    let mut reply = (got.len() as u64).to_be_bytes().to_vec();
    reply.extend(got.iter().rev());
    reply
}

/// Serves HTTP/1.1 requests (no body) with keep-alive until the client
/// closes or asks to close.
fn serve_http(stream: TcpStream, n: usize) -> io::Result<()> {
    let mut out = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    loop {
        let mut close = false;
        let mut first = true;
        loop {
            line.clear();
            if reader.read_line(&mut line)? == 0 {
                return Ok(());
            }
            if first && !line.starts_with("GET ") {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "not a GET"));
            }
            first = false;
            if line.to_ascii_lowercase().starts_with("connection: close") {
                close = true;
            }
            if line == "\r\n" {
                break;
            }
        }
        let body = format!("backend {n}\n");
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: {}\r\n\r\n{body}",
            body.len(),
            if close { "close" } else { "keep-alive" }
        );
        out.write_all(response.as_bytes())?;
        if close {
            return out.shutdown(net::Shutdown::Write);
        }
    }
}

/// `n` backends started by `make`.
pub fn backends(n: usize, make: impl Fn(usize) -> TestBackend) -> Vec<TestBackend> {
    (0..n).map(make).collect()
}

/// A port on loopback where nothing listens: connecting to it is refused
/// at once. The port stays taken for the life of the test process (a socket
/// bound without `SO_REUSEADDR`, never listening), so no other test's
/// listener can be given it and turn a dead backend alive.
pub fn closed_port() -> SocketAddr {
    use socket2::{Domain, Socket, Type};
    static HELD: Mutex<Vec<Socket>> = Mutex::new(Vec::new());
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    socket
        .bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .unwrap();
    let addr = socket.local_addr().unwrap().as_socket().unwrap();
    HELD.lock().unwrap().push(socket);
    addr
}

/// Makes a loopback port that completes no handshake: a socket listening
/// with a backlog of 0 whose queue is filled and never accepted. Returns it
/// with the fillers, which must stay open.
pub fn black_hole() -> (socket2::Socket, SocketAddr, Vec<TcpStream>) {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    socket
        .bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
        .unwrap();
    socket.listen(0).unwrap();
    let addr = socket.local_addr().unwrap().as_socket().unwrap();
    let mut fillers = Vec::new();
    for _ in 0..64 {
        match TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            Ok(s) => fillers.push(s),
            Err(_) => return (socket, addr, fillers),
        }
    }
    panic!("could not fill the backlog of {addr}");
}

/// The backend specs of these addresses, weight 1 each.
pub fn specs(backends: &[SocketAddr]) -> Vec<BackendSpec> {
    backends
        .iter()
        .map(|a| BackendSpec::parse(&a.to_string()).unwrap())
        .collect()
}

/// `RODIZIO_TEST_KERNEL_RELAY=N`: `kernel_relay` on, after N exchanges.
fn kernel_relay_from_env(proxy: &mut ProxyConfig) {
    if let Some(after) = kernel_relay_after_from_env() {
        proxy.kernel_relay = rodizio::units::Switch::On;
        proxy.kernel_relay_after = after;
    }
}

/// N of `RODIZIO_TEST_KERNEL_RELAY=N`, once the kernel relay's program is
/// loaded in this process (it stays loaded, as in the balancer: a test
/// that counts descriptors calls this before it counts). A pass that
/// asks for the relay where it cannot load fails here rather than pass on
/// the copy pump.
pub fn kernel_relay_after_from_env() -> Option<u32> {
    let after = std::env::var("RODIZIO_TEST_KERNEL_RELAY")
        .ok()
        .filter(|v| !v.is_empty())?;
    let after = after
        .parse()
        .unwrap_or_else(|_| panic!("RODIZIO_TEST_KERNEL_RELAY={after:?}: not a number"));
    assert!(
        rodizio::proxy::kernel_relay::prepare(rodizio::units::Switch::On),
        "RODIZIO_TEST_KERNEL_RELAY is set but the kernel relay's program does not load \
         here (it needs root, or CAP_BPF and CAP_NET_ADMIN)"
    );
    Some(after)
}

/// A config for tests: listens on `127.0.0.1:0`, short timeouts, the
/// article's defaults otherwise. `RODIZIO_TEST_KERNEL_RELAY=N` in the
/// environment turns `kernel_relay` on with `kernel_relay_after` N, to run
/// the pump's tests with the kernel relay (`make test-kernel-relay`).
pub fn config(backends: &[SocketAddr]) -> Config {
    let mut proxy = ProxyConfig {
        connect_timeout: Duration::from_secs(2),
        idle_timeout: Duration::from_secs(30),
        ..ProxyConfig::default()
    };
    kernel_relay_from_env(&mut proxy);
    Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        backends: specs(backends),
        drain_timeout: Duration::from_secs(10),
        proxy,
        ..Config::default()
    }
}

/// A balancer running in-process on its own thread.
pub struct TestBalancer {
    /// Where clients connect.
    pub addr: SocketAddr,
    /// Its live counters.
    pub stats: Arc<Stats>,
    /// Its backend list, to find, drain, add or remove backends.
    pub scheduler: Arc<Scheduler>,
    /// Its live settings, to change them as a reload would.
    pub live: rodizio::balancer::Live,
    /// Its stop button.
    pub shutdown: Shutdown,
    /// Where its admin API listens, when the config turned it on.
    pub admin: Option<SocketAddr>,
    stopped: Receiver<rodizio::Result<()>>,
    thread: Option<JoinHandle<()>>,
}

impl TestBalancer {
    /// Binds and runs a balancer with `config`.
    pub fn start(config: Config) -> TestBalancer {
        TestBalancer::start_with_reload(config, None)
    }

    /// Binds and runs a balancer with `config`, its admin API's reload
    /// calling `reload` (when given).
    pub fn start_with_reload(
        config: Config,
        reload: Option<rodizio::admin::ReloadHook>,
    ) -> TestBalancer {
        let mut balancer = Balancer::bind(config).expect("bind balancer");
        if let Some(hook) = reload {
            balancer.set_reload(hook);
        }
        let admin = balancer.admin_addr();
        let addr = balancer.local_addr();
        let stats = balancer.stats();
        let scheduler = balancer.scheduler();
        let live = balancer.live();
        let shutdown = Shutdown::new();
        let (tx, stopped) = crossbeam_channel::bounded(1);
        let thread = {
            let shutdown = shutdown.clone();
            thread::spawn(move || {
                let _ = tx.send(balancer.run(&shutdown));
            })
        };
        TestBalancer {
            addr,
            stats,
            scheduler,
            live,
            shutdown,
            admin,
            stopped,
            thread: Some(thread),
        }
    }

    /// Waits at most 5 s until `ok` holds for the connections each of
    /// `backends` (the balancer's whole list, all up) took from the
    /// balancer's clients: what it accepted less the balancer's active
    /// health checks, one per backend per round. The first round comes one
    /// interval (5 s by default) after start, so only a test that takes
    /// longer sees any. Returns whether `ok` held, and the last counts.
    pub fn proxied(
        &self,
        backends: &[&TestBackend],
        ok: impl Fn(&[usize]) -> bool,
    ) -> (bool, Vec<usize>) {
        let mut seen = Vec::new();
        let held = wait_for(Duration::from_secs(5), || {
            let checks = self.stats.histograms.health_check.snapshot().count as usize;
            let each = checks / backends.len();
            seen = backends
                .iter()
                .map(|b| b.accepted().saturating_sub(each))
                .collect();
            // A round half observed is not a count to judge.
            checks % backends.len() == 0 && ok(&seen)
        });
        (held, seen)
    }

    /// A balancer with the test [`config`] in front of `backends`.
    pub fn over(backends: &[SocketAddr]) -> TestBalancer {
        TestBalancer::start(config(backends))
    }

    /// A balancer in front of `backends` with the article's defaults (and a
    /// drain timeout of 5 s), after `tweak` has adjusted the config.
    pub fn with(backends: &[SocketAddr], tweak: impl FnOnce(&mut Config)) -> TestBalancer {
        let mut config = Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            backends: specs(backends),
            drain_timeout: Duration::from_secs(5),
            ..Config::default()
        };
        kernel_relay_from_env(&mut config.proxy);
        tweak(&mut config);
        if config.proxy.splice {
            // The kernel relay pass's `kernel_relay` does nothing with
            // splice, and is refused beside it: the splice pump is tested.
            config.proxy.kernel_relay = rodizio::units::Switch::Off;
        }
        TestBalancer::start(config)
    }

    /// The backend listening on `addr`, as the balancer's list holds it.
    pub fn backend(&self, addr: SocketAddr) -> Arc<Backend> {
        let name = addr.to_string();
        self.scheduler.find(|b| b.name() == name).unwrap()
    }

    /// Waits at most `timeout` for `run` to return; `true` if it did (and
    /// returned `Ok`).
    pub fn wait_stopped(&self, timeout: Duration) -> bool {
        match self.stopped.recv_timeout(timeout) {
            Ok(result) => {
                result.expect("run returned an error");
                true
            }
            Err(RecvTimeoutError::Timeout) => false,
            Err(RecvTimeoutError::Disconnected) => panic!("the balancer thread died"),
        }
    }

    /// Triggers shutdown and waits for `run` to return (bounded).
    pub fn stop(mut self) {
        self.shutdown.trigger();
        assert!(
            self.wait_stopped(Duration::from_secs(15)),
            "run did not return after shutdown"
        );
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }

    /// Waits until connections in flight (as the balancer counts them) are
    /// `n`, at most `timeout`.
    pub fn wait_active(&self, n: u64, timeout: Duration) -> bool {
        wait_for(timeout, || self.stats.snapshot().active == n)
    }

    /// Waits until `n` proxied connections have ended (`completed`) and
    /// none is active, at most `timeout`.
    pub fn wait_ended(&self, n: u64, timeout: Duration) -> bool {
        wait_for(timeout, || {
            let s = self.stats.snapshot();
            s.completed == n && s.active == 0
        })
    }
}

impl Drop for TestBalancer {
    fn drop(&mut self) {
        self.shutdown.trigger();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Polls `cond` every 2 ms until it holds or `limit` passes; returns how
/// long it took. The one polling loop of the tests: [`until`] and
/// [`wait_for`] are this with another way to report.
pub fn time_until(limit: Duration, mut cond: impl FnMut() -> bool) -> Option<Duration> {
    let started = Instant::now();
    loop {
        if cond() {
            return Some(started.elapsed());
        }
        if started.elapsed() >= limit {
            return None;
        }
        thread::sleep(Duration::from_millis(2));
    }
}

/// Polls until `cond` holds, failing the test (naming `what`) after
/// [`IO_TIMEOUT`].
pub fn until(what: &str, cond: impl Fn() -> bool) {
    assert!(time_until(IO_TIMEOUT, cond).is_some(), "timed out: {what}");
}

/// One `GET /` through `addr` (`Connection: close`) to a
/// [`TestBackend::http`]`(1)`: `Ok` when a whole 200 from backend 1 came back.
pub fn get_backend_1(addr: SocketAddr) -> Result<(), String> {
    let mut s = connect(addr).map_err(|e| format!("connect: {e}"))?;
    s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .map_err(|e| format!("write: {e}"))?;
    let mut reply = String::new();
    s.read_to_string(&mut reply)
        .map_err(|e| format!("read: {e}"))?;
    if reply.starts_with("HTTP/1.1 200") && reply.ends_with("backend 1\n") {
        Ok(())
    } else {
        Err(format!("reply {reply:?}"))
    }
}

/// Sequential requests to `addr` on a thread, bounded in count (50,000)
/// and time (90 s), each failure kept.
pub struct Load {
    done: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    failed: Arc<Mutex<Vec<String>>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Load {
    /// Starts the requests ([`get_backend_1`]) on a thread.
    pub fn start(addr: SocketAddr) -> Load {
        let done = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let failed = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (done, stop, failed) = (done.clone(), stop.clone(), failed.clone());
            thread::spawn(move || {
                let started = Instant::now();
                while !stop.load(Ordering::SeqCst)
                    && done.load(Ordering::SeqCst) < 50_000
                    && started.elapsed() < Duration::from_secs(90)
                {
                    if let Err(e) = get_backend_1(addr) {
                        failed.lock().unwrap().push(e);
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                }
            })
        };
        Load {
            done,
            stop,
            failed,
            thread: Some(thread),
        }
    }

    /// Waits until `n` more requests are done.
    pub fn more(&self, n: usize) {
        let target = self.done.load(Ordering::SeqCst) + n;
        assert!(
            wait_for(Duration::from_secs(30), || self.done.load(Ordering::SeqCst)
                >= target),
            "the load stalled"
        );
    }

    /// Stops the load and fails the test, with `context`, if any request
    /// failed; how many were done.
    pub fn none_failed(mut self, context: &str) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().unwrap().join().unwrap();
        let failed = self.failed.lock().unwrap().clone();
        let total = self.done.load(Ordering::SeqCst);
        assert!(
            failed.is_empty(),
            "{} of {total} requests failed: {:?}\n{context}",
            failed.len(),
            &failed[..failed.len().min(5)]
        );
        total
    }
}

/// Polls `cond` until it holds or `timeout` passes; whether it held.
pub fn wait_for(timeout: Duration, cond: impl FnMut() -> bool) -> bool {
    time_until(timeout, cond).is_some()
}

/// Connects with the read and write timeouts set.
pub fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    Ok(s)
}

/// The demo backend (`rodizio backend`) on its own thread, stoppable.
pub struct Demo {
    /// Where it listens.
    pub addr: SocketAddr,
    shutdown: Shutdown,
    thread: Option<JoinHandle<()>>,
}

impl Demo {
    /// Starts a demo backend called `name` on `addr` (`127.0.0.1:0`, or a
    /// port to reuse).
    pub fn start(addr: &str, name: &str) -> Demo {
        let backend = DemoBackend::bind(addr.parse().unwrap(), Some(name.into())).unwrap();
        let addr = backend.local_addr().unwrap();
        let shutdown = Shutdown::new();
        let thread = Some(backend.spawn(shutdown.clone()).unwrap());
        Demo {
            addr,
            shutdown,
            thread,
        }
    }

    /// Stops accepting and closes the listening socket (connections already
    /// accepted finish on their own threads).
    pub fn stop(&mut self) {
        self.shutdown.trigger();
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One HTTP/1.0 request through `addr`; returns the name of the demo
/// backend that answered.
pub fn request(addr: SocketAddr) -> io::Result<String> {
    let mut s = connect(addr)?;
    s.write_all(b"GET / HTTP/1.0\r\n\r\n")?;
    let mut reply = String::new();
    s.read_to_string(&mut reply)?;
    // The demo backend answers an HTTP/1.0 request in HTTP/1.0.
    let body = reply
        .strip_prefix("HTTP/1.0 200 OK\r\n")
        .or_else(|| reply.strip_prefix("HTTP/1.1 200 OK\r\n"))
        .and_then(|r| r.split_once("\r\n\r\n"))
        .and_then(|(_, body)| body.strip_prefix("Handled by server "))
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("{reply:?}")))?;
    Ok(body.trim_end().to_string())
}

/// One HTTP response: status line and body.
#[derive(Debug)]
pub struct Response {
    /// `HTTP/1.1 200 OK`
    pub status: String,
    /// The body, as text.
    pub body: String,
}

/// Reads one response with a `Content-Length` from `reader`.
pub fn read_response(reader: &mut impl BufRead) -> io::Result<Response> {
    let mut status = String::new();
    if reader.read_line(&mut status)? == 0 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "no response"));
    }
    let mut length = None;
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "cut headers"));
        }
        if line == "\r\n" {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse::<usize>().ok();
            }
        }
    }
    let length =
        length.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no content-length"))?;
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    Ok(Response {
        status: status.trim_end().to_string(),
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// `GET path` on a new connection with `Connection: close`; the response
/// must be complete and followed by the end of stream.
pub fn http_get(addr: SocketAddr, path: &str) -> io::Result<Response> {
    let mut s = connect(addr)?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes())?;
    let mut reader = BufReader::new(s);
    let response = read_response(&mut reader)?;
    let mut rest = Vec::new();
    reader.read_to_end(&mut rest)?;
    if !rest.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "extra bytes"));
    }
    Ok(response)
}

/// `len` pseudo-random bytes from `seed` (xorshift), with runs of zero
/// bytes mixed in: the C's `strlen` cut data at the first zero.
pub fn test_data(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut data = Vec::with_capacity(len);
    while data.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data.extend_from_slice(&x.to_le_bytes());
    }
    data.truncate(len);
    for i in (0..len).step_by(4099) {
        let end = (i + 37).min(len);
        data[i..end].fill(0);
    }
    data
}

/// A streaming backend's writes: `total` bytes to `s`, byte `at` being
/// `byte(at)`, 64 KiB at most per write, `written` counting what each
/// write took (so that a writer a slow reader holds back shows where).
pub fn stream_out(
    s: &mut TcpStream,
    total: u64,
    byte: impl Fn(u64) -> u8,
    written: &AtomicU64,
) -> io::Result<()> {
    let mut chunk = vec![0u8; 64 * 1024];
    let mut at = 0u64;
    while at < total {
        let n = chunk.len().min((total - at) as usize);
        for (k, b) in chunk[..n].iter_mut().enumerate() {
            *b = byte(at + k as u64);
        }
        at += s.write(&chunk[..n])? as u64;
        written.store(at, Ordering::SeqCst);
    }
    Ok(())
}

/// Whether `written` (a [`stream_out`] count) stopped growing for half a
/// second within `within`: the writer is held back.
pub fn held_back(written: &AtomicU64, within: Duration) -> bool {
    let (mut last, mut same_since) = (u64::MAX, Instant::now());
    wait_for(within, || {
        let now = written.load(Ordering::SeqCst);
        if now != last {
            (last, same_since) = (now, Instant::now());
        }
        same_since.elapsed() > Duration::from_millis(500)
    })
}

/// Reads `s` to its end, asserting that byte `at` is `byte(at)`; how many
/// bytes came.
pub fn read_checked(s: &mut TcpStream, byte: impl Fn(u64) -> u8) -> u64 {
    let mut buf = vec![0u8; 256 * 1024];
    let mut at = 0u64;
    loop {
        let n = s.read(&mut buf).unwrap();
        if n == 0 {
            return at;
        }
        for (k, &b) in buf[..n].iter().enumerate() {
            assert_eq!(b, byte(at + k as u64), "byte {}", at + k as u64);
        }
        at += n as u64;
    }
}

/// Sends `data` through `stream` and reads the same amount back at the same
/// time, on two threads; returns what came back. The write side is shut
/// when all is sent.
pub fn echo_through(stream: TcpStream, data: Arc<Vec<u8>>) -> io::Result<Vec<u8>> {
    let mut writer = stream.try_clone()?;
    let sender = {
        let data = data.clone();
        thread::spawn(move || -> io::Result<()> {
            for chunk in data.chunks(16 * 1024) {
                writer.write_all(chunk)?;
            }
            writer.shutdown(net::Shutdown::Write)
        })
    };
    let mut reader = stream;
    let mut back = Vec::with_capacity(data.len());
    let read = reader.read_to_end(&mut back);
    let sent = sender.join().expect("writer thread panicked");
    sent?;
    read?;
    Ok(back)
}

/// Whether `stream` is closed by the peer: a read sees end of stream or a
/// reset (not a timeout, not data).
pub fn is_closed(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    match stream.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => matches!(
            e.kind(),
            io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted
        ),
    }
}

/// Sets `resource` (a `libc::RLIMIT_*`) to `value`, soft and hard, in the
/// child `command` starts, between fork and exec.
pub fn limit_in_child(
    command: &mut std::process::Command,
    resource: libc::__rlimit_resource_t,
    value: libc::rlim_t,
) {
    use std::os::unix::process::CommandExt;
    // SAFETY: setrlimit is async-signal-safe; nothing else runs in the
    // child between fork and exec.
    unsafe {
        command.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: value,
                rlim_max: value,
            };
            if libc::setrlimit(resource, &limit) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// What [`collect`] has gathered so far, and whether the pipe has ended.
#[derive(Clone, Default)]
pub struct Collected {
    text: Arc<Mutex<String>>,
    ended: Arc<AtomicBool>,
}

impl Collected {
    /// Everything read so far.
    pub fn text(&self) -> String {
        self.text.lock().unwrap().clone()
    }

    /// Waits at most `timeout` for the end of the pipe (the child exited
    /// and everything it wrote is in); whether it came.
    pub fn wait_end(&self, timeout: Duration) -> bool {
        wait_for(timeout, || self.ended.load(Ordering::SeqCst))
    }

    /// The first whole line past byte `from` that contains `needle`, if
    /// one has come; `from` moves past it (and past every whole line
    /// looked at), so lines are taken in order, each once.
    pub fn next_line(&self, from: &mut usize, needle: &str) -> Option<String> {
        let text = self.text.lock().unwrap();
        for line in text[*from..].split_inclusive('\n') {
            if !line.ends_with('\n') {
                break;
            }
            *from += line.len();
            if line.contains(needle) {
                return Some(line.trim_end().to_string());
            }
        }
        None
    }
}

/// Collects everything `pipe` gives (a child's standard error, say) on a
/// thread of its own, for the test to read at any time.
pub fn collect(mut pipe: impl Read + Send + 'static) -> Collected {
    let collected = Collected::default();
    let sink = collected.clone();
    thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = pipe.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.text
                .lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        sink.ended.store(true, Ordering::SeqCst);
    });
    collected
}
