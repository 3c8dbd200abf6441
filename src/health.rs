//! Backend health: active checks on a thread of their own, passive checks on
//! real traffic, and what a client gets when no backend can serve it.
//!
//! # Active checks
//!
//! One thread (`rodizio-health`) probes every backend each
//! `--health-interval` (default 5 s): `--health-check tcp` (the default)
//! opens a TCP connection and closes it; `http` sends `GET /health`
//! (`--health-path`) and wants a 2xx or 3xx status line; `off` sends
//! nothing. Each probe has `--health-timeout` (default 2 s). The probes of
//! one round run in parallel (one short-lived thread each), so a black-holed
//! backend delays the others by nothing and a round lasts at most one
//! timeout.
//!
//! One lost probe must not flap a backend, so each has a [`Probe`], a small
//! state machine: it goes down after `--fall` (default 3) failures in a row
//! and up after `--rise` (default 2) successes in a row. Each change is
//! logged once, as `backend 127.0.0.1:8002 is now DOWN (reason)` or
//! `... is now UP`.
//!
//! Between rounds the thread sleeps in `crossbeam_channel::select!` on a
//! `tick` and on [`Shutdown::receiver`], so a shutdown wakes it at once
//! (or, mid-round, as soon as the round's probes return: at most one
//! timeout).
//!
//! # Passive checks
//!
//! Workers count connect failures on real traffic
//! ([`Backend::record_connect_failure`]). After `--passive-failures`
//! (default 3) in a row, [`connect_failed`] marks the backend down at once,
//! without waiting for the next probe; the active checks then bring it back
//! (after `--rise` successes). With `--health-check off` nothing would ever
//! bring it back, so the thread instead retries a down backend after
//! `--health-cooldown` (default 10 s): it is marked up, and one more connect
//! failure marks it down again (the failure count is not reset).
//!
//! # Health is not draining
//!
//! Health is the probes' opinion ([`Backend::is_healthy`]); draining is the
//! operator's ([`Backend::is_draining`], see [`crate::scheduler`]). They are
//! separate flags: a draining backend is still probed, and a backend coming
//! back up does not end its draining.
//!
//! # When no backend can serve
//!
//! When every backend is down or draining, the accept loop closes a new
//! client at once; with `--http-replies` it first answers
//! `HTTP/1.1 503 Service Unavailable` ([`reply_at_once`]: one non-blocking
//! write, so the accept loop never waits for a client; the rate limiter's
//! 429 goes out the same way). When the pick
//! succeeded but every connect failed, the worker closes the client, or
//! answers `HTTP/1.1 502 Bad Gateway` ([`reply_and_linger`]). Either way the
//! log says why.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C sends clients to a dead backend forever, and
//! `exit()`s the whole balancer on the first failed connect.

use std::collections::HashMap;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown as Direction, TcpStream};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{select, tick};

use crate::backend::Backend;
use crate::config::parse_duration;
use crate::error::{Error, Result};
use crate::proxy::connect_backend;
use crate::scheduler::Scheduler;
use crate::shutdown::Shutdown;

/// The kind of active check.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum CheckKind {
    /// Open a TCP connection, then close it.
    #[default]
    Tcp,
    /// `GET` the health path; a 2xx or 3xx status is healthy.
    Http,
    /// No active check (passive checks and the cool-down still apply).
    Off,
}

/// Health flags, flattened into the balancer's flags.
#[derive(Debug, Clone, clap::Args)]
pub struct HealthArgs {
    /// Active health check: tcp (connect), http (GET --health-path), or off.
    #[arg(long, value_enum, default_value_t = CheckKind::Tcp)]
    pub health_check: CheckKind,
    /// Time between two rounds of active checks.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub health_interval: Duration,
    /// Longest wait for one check.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub health_timeout: Duration,
    /// Path requested by the http check.
    #[arg(long, default_value = "/health")]
    pub health_path: String,
    /// Failed checks in a row that mark a backend down.
    #[arg(long, default_value_t = 3)]
    pub fall: u32,
    /// Successful checks in a row that mark a down backend up.
    #[arg(long, default_value_t = 2)]
    pub rise: u32,
    /// Failed connects in a row on real traffic that mark a backend down at
    /// once (0: never).
    #[arg(long, default_value_t = 3)]
    pub passive_failures: u32,
    /// With --health-check off, how long a backend marked down by real
    /// traffic rests before it is tried again.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub health_cooldown: Duration,
    /// Answer clients that no backend can serve with HTTP 503 (none
    /// available) or 502 (none reachable) instead of just closing.
    #[arg(long)]
    pub http_replies: bool,
}

impl HealthArgs {
    /// The configuration these flags describe.
    pub fn to_config(&self) -> HealthConfig {
        HealthConfig {
            check: self.health_check,
            interval: self.health_interval,
            timeout: self.health_timeout,
            path: self.health_path.clone(),
            fall: self.fall,
            rise: self.rise,
            passive_failures: self.passive_failures,
            cooldown: self.health_cooldown,
            http_replies: self.http_replies,
        }
    }
}

/// Health settings (a part of [`crate::Config`]); the defaults are the flags'.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthConfig {
    /// The active check. Default tcp.
    pub check: CheckKind,
    /// Time between rounds of checks. Default 5 s.
    pub interval: Duration,
    /// Longest wait for one check. Default 2 s.
    pub timeout: Duration,
    /// Path of the http check. Default `/health`.
    pub path: String,
    /// Failures in a row to go down. Default 3.
    pub fall: u32,
    /// Successes in a row to come back up. Default 2.
    pub rise: u32,
    /// Connect failures in a row on real traffic to go down; 0 disables.
    /// Default 3.
    pub passive_failures: u32,
    /// With checks off, rest before retrying a down backend. Default 10 s.
    pub cooldown: Duration,
    /// Answer 503/502 instead of closing silently. Default false.
    pub http_replies: bool,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            check: CheckKind::Tcp,
            interval: Duration::from_secs(5),
            timeout: Duration::from_secs(2),
            path: "/health".into(),
            fall: 3,
            rise: 2,
            passive_failures: 3,
            cooldown: Duration::from_secs(10),
            http_replies: false,
        }
    }
}

impl HealthConfig {
    /// Checks that every value is usable.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the first bad value.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: &str| Err(Error::InvalidConfig(msg.into()));
        if self.interval.is_zero() || self.timeout.is_zero() || self.cooldown.is_zero() {
            return bad(
                "--health-interval, --health-timeout and --health-cooldown must be more than 0",
            );
        }
        if self.fall == 0 || self.rise == 0 {
            return bad("--fall and --rise must be at least 1");
        }
        if !self.path.starts_with('/') || self.path.chars().any(|c| c.is_whitespace()) {
            return bad("--health-path must start with / and contain no spaces");
        }
        Ok(())
    }
}

/// A change of state decided by a [`Probe`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// The backend is now down.
    Down,
    /// The backend is now up.
    Up,
}

/// The rise/fall state machine of one backend, fed one check result at a
/// time. No clock and no I/O: the thread feeds it, tests feed it directly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    fall: u32,
    rise: u32,
    up: bool,
    /// Results in a row that disagree with `up` (failures while up,
    /// successes while down).
    run: u32,
}

impl Probe {
    /// A probe that starts up (backends are trusted until shown otherwise).
    pub fn new(fall: u32, rise: u32) -> Probe {
        Probe {
            fall: fall.max(1),
            rise: rise.max(1),
            up: true,
            run: 0,
        }
    }

    /// Whether the probe thinks the backend is up.
    pub fn is_up(&self) -> bool {
        self.up
    }

    /// Feeds one check result; returns the transition it causes, if any.
    pub fn observe(&mut self, success: bool) -> Option<Transition> {
        if success == self.up {
            // The result agrees with the state: any streak is broken.
            self.run = 0;
            return None;
        }
        self.run += 1;
        let needed = if self.up { self.fall } else { self.rise };
        if self.run < needed {
            return None;
        }
        self.up = !self.up;
        self.run = 0;
        Some(if self.up {
            Transition::Up
        } else {
            Transition::Down
        })
    }

    /// Aligns the probe with a state decided elsewhere (passive checks, an
    /// operator): a backend marked down needs `rise` successes from now on.
    pub fn sync(&mut self, up: bool) {
        if self.up != up {
            self.up = up;
            self.run = 0;
        }
    }
}

/// Runs one active check of `backend`.
///
/// # Errors
///
/// Why the backend is considered unhealthy, for the log.
pub fn check(backend: &Backend, config: &HealthConfig) -> std::result::Result<(), String> {
    match config.check {
        CheckKind::Off => Ok(()),
        CheckKind::Tcp => connect_backend(backend, config.timeout)
            .map(drop)
            .map_err(|e| format!("connect: {e}")),
        CheckKind::Http => check_http(backend, &config.path, config.timeout),
    }
}

/// `GET path` with `Connection: close`; healthy on a 2xx or 3xx status.
fn check_http(backend: &Backend, path: &str, timeout: Duration) -> std::result::Result<(), String> {
    let deadline = Instant::now() + timeout;
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    let mut stream = connect_backend(backend, timeout).map_err(|e| format!("connect: {e}"))?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: rodizio-health\r\nConnection: close\r\n\r\n",
        backend.name()
    );
    let io_err = |e: io::Error| format!("GET {path}: {e}");
    stream.set_write_timeout(Some(left())).map_err(io_err)?;
    stream.write_all(request.as_bytes()).map_err(io_err)?;
    // Only the status line matters: read until its end, at most 256 bytes.
    let mut head = [0u8; 256];
    let mut len = 0;
    while len < head.len() && !head[..len].contains(&b'\n') {
        stream.set_read_timeout(Some(left())).map_err(io_err)?;
        match stream.read(&mut head[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(io_err(e)),
        }
    }
    let line = String::from_utf8_lossy(&head[..len]);
    let line = line.lines().next().unwrap_or("");
    let status = parse_status(line)
        .ok_or_else(|| format!("GET {path}: not an HTTP status line: {:?}", truncate(line)))?;
    if (200..400).contains(&status) {
        Ok(())
    } else {
        Err(format!("GET {path} answered {status}"))
    }
}

/// The code of an `HTTP/1.x NNN reason` line.
fn parse_status(line: &str) -> Option<u16> {
    let mut words = line.split_whitespace();
    if !words.next()?.starts_with("HTTP/") {
        return None;
    }
    words
        .next()?
        .parse()
        .ok()
        .filter(|c| (100..1000).contains(c))
}

fn truncate(line: &str) -> &str {
    match line.char_indices().nth(60) {
        Some((i, _)) => &line[..i],
        None => line,
    }
}

/// Marks `backend` down (logging it once) and returns `true` when it is
/// healthy now, so this change is the first.
fn mark_down(backend: &Backend, reason: &str) -> bool {
    let was_up = backend.set_healthy(false);
    if was_up {
        log::warn!("backend {} is now DOWN ({reason})", backend.name());
    }
    was_up
}

/// Marks `backend` up (logging it once).
fn mark_up(backend: &Backend, reason: &str) {
    if !backend.set_healthy(true) {
        log::info!("backend {} is now UP ({reason})", backend.name());
    }
}

/// Passive health: called by a worker after a failed connect to `backend`,
/// the `failures`-th in a row. Marks it down once the threshold is reached.
pub fn connect_failed(backend: &Backend, failures: u32, config: &HealthConfig, err: &io::Error) {
    if config.passive_failures > 0 && failures >= config.passive_failures {
        mark_down(
            backend,
            &format!("{failures} connect failures in a row on client traffic: {err}"),
        );
    }
}

/// Starts the health thread if the configuration needs one (active checks,
/// or passive checks that need the cool-down); returns its handle. The
/// thread exits when `shutdown` is triggered.
///
/// # Errors
///
/// [`Error::Io`] when the thread cannot be started.
pub fn spawn(
    scheduler: Arc<Scheduler>,
    config: HealthConfig,
    shutdown: Shutdown,
) -> Result<Option<JoinHandle<()>>> {
    if config.check == CheckKind::Off && config.passive_failures == 0 {
        return Ok(None);
    }
    thread::Builder::new()
        .name("rodizio-health".into())
        .spawn(move || Checker::new(config).run(&scheduler, &shutdown))
        .map(Some)
        .map_err(|e| Error::io("starting the health thread", e))
}

/// The health thread's state: one [`Probe`] per backend, by id.
struct Checker {
    config: HealthConfig,
    probes: HashMap<u64, Probe>,
    /// With checks off: when each down backend was first seen down.
    down_since: HashMap<u64, Instant>,
}

impl Checker {
    fn new(config: HealthConfig) -> Checker {
        Checker {
            config,
            probes: HashMap::new(),
            down_since: HashMap::new(),
        }
    }

    fn run(mut self, scheduler: &Scheduler, shutdown: &Shutdown) {
        let period = if self.config.check == CheckKind::Off {
            // Only the cool-down to watch: look often enough for it.
            self.config.interval.min(self.config.cooldown)
        } else {
            self.config.interval
        };
        let ticker = tick(period);
        let stop = shutdown.receiver();
        log::debug!("health checks: {:?} every {:?}", self.config.check, period);
        loop {
            // The first round comes one interval after start-up, like every
            // other: the `fall`-th failed check of a backend dead from the
            // start is then at `fall × interval`, and a short-lived balancer
            // (a test, a one-off run) probes nothing.
            select! {
                recv(stop) -> _ => return,
                recv(ticker) -> _ => {}
            }
            if shutdown.is_triggered() {
                return;
            }
            self.round(scheduler);
        }
    }

    /// One round: probe every backend of the current list.
    fn round(&mut self, scheduler: &Scheduler) {
        let list = scheduler.snapshot();
        // Forget backends that were removed.
        self.probes
            .retain(|id, _| list.iter().any(|b| b.id() == *id));
        self.down_since
            .retain(|id, _| list.iter().any(|b| b.id() == *id));
        if self.config.check == CheckKind::Off {
            self.cooldown(&list);
            return;
        }
        let results = probe_all(&list, &self.config);
        for (backend, result) in list.iter().zip(results) {
            let (fall, rise) = (self.config.fall, self.config.rise);
            let probe = self
                .probes
                .entry(backend.id())
                .or_insert_with(|| Probe::new(fall, rise));
            // Passive checks may have marked it down since the last round.
            probe.sync(backend.is_healthy());
            match (probe.observe(result.is_ok()), result) {
                (Some(Transition::Down), Err(reason)) => {
                    mark_down(
                        backend,
                        &format!("{fall} failed checks in a row, last: {reason}"),
                    );
                }
                (Some(Transition::Up), _) => {
                    // A fresh start for the passive count too.
                    backend.record_connect_success();
                    mark_up(backend, &format!("{rise} checks passed in a row"));
                }
                _ => {}
            }
        }
    }

    /// Checks off: a backend down for `cooldown` is tried again.
    fn cooldown(&mut self, list: &[Arc<Backend>]) {
        let now = Instant::now();
        for backend in list {
            if backend.is_healthy() {
                self.down_since.remove(&backend.id());
                continue;
            }
            let since = *self.down_since.entry(backend.id()).or_insert(now);
            if now.duration_since(since) >= self.config.cooldown {
                self.down_since.remove(&backend.id());
                mark_up(
                    backend,
                    &format!(
                        "cool-down of {:?} over, trying it again",
                        self.config.cooldown
                    ),
                );
            }
        }
    }
}

/// Probes every backend in parallel, one short-lived thread each; returns
/// the results in list order. A thread that cannot be started is replaced
/// by probing inline.
fn probe_all(list: &[Arc<Backend>], config: &HealthConfig) -> Vec<std::result::Result<(), String>> {
    thread::scope(|scope| {
        let handles: Vec<_> = list
            .iter()
            .map(|backend| {
                thread::Builder::new()
                    .name("rodizio-probe".into())
                    .stack_size(128 * 1024)
                    .spawn_scoped(scope, move || check(backend, config))
                    .map_err(|_| backend)
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h {
                Ok(handle) => handle
                    .join()
                    .unwrap_or_else(|_| Err("the check panicked".into())),
                Err(backend) => check(backend, config),
            })
            .collect()
    })
}

/// `HTTP/1.1 503 Service Unavailable`, for clients no backend is available
/// for.
pub const REPLY_503: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
Content-Type: text/plain\r\nContent-Length: 29\r\nConnection: close\r\n\r\n\
no backend server available\r\n";

/// `HTTP/1.1 502 Bad Gateway`, for clients whose every backend connect
/// failed.
pub const REPLY_502: &[u8] = b"HTTP/1.1 502 Bad Gateway\r\n\
Content-Type: text/plain\r\nContent-Length: 29\r\nConnection: close\r\n\r\n\
no backend server reachable\r\n";

/// Best-effort reply from the accept loop, which must never wait for a
/// client (the 503 here, the 429 of [`crate::limiter::refuse`]): the socket
/// is made non-blocking and gets one write of `reply` (a short reply fits
/// an empty send buffer, so it goes out whole in practice; if it does not,
/// the client gets less, never the accept loop stuck), then
/// `shutdown(Write)`, then a few non-blocking reads of what the client
/// already sent (closing with unread data makes the kernel send a reset,
/// which can destroy the reply before the client reads it). The caller then
/// closes.
pub fn reply_at_once(client: &TcpStream, reply: &[u8]) {
    if client.set_nonblocking(true).is_err() {
        return;
    }
    if let Err(err) = (&*client).write(reply) {
        log::debug!("reply not sent: {err}");
    }
    let _ = client.shutdown(Direction::Write);
    let mut sink = [0u8; 2048];
    for _ in 0..4 {
        match (&*client).read(&mut sink) {
            Ok(n) if n > 0 => {}
            _ => break,
        }
    }
}

/// Reply from a worker, which may wait a little: write `reply` (at most
/// `timeout`), shut the write side, then read and discard until the client
/// closes or `timeout` passes ("lingering close": closing with unread data
/// would make the kernel send a reset, which can destroy the reply before
/// the client reads it).
pub fn reply_and_linger(client: &TcpStream, reply: &[u8], timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let _ = client.set_nonblocking(false);
    let _ = client.set_write_timeout(Some(timeout));
    if (&*client).write_all(reply).is_err() {
        return;
    }
    let _ = client.shutdown(Direction::Write);
    let mut sink = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || client.set_read_timeout(Some(left)).is_err() {
            return;
        }
        match (&*client).read(&mut sink) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{SocketAddr, TcpListener};

    #[test]
    fn goes_down_after_fall_failures_in_a_row() {
        let mut p = Probe::new(3, 2);
        assert!(p.is_up());
        assert_eq!(p.observe(false), None);
        assert_eq!(p.observe(false), None);
        // One success breaks the streak: no flapping on a lost probe.
        assert_eq!(p.observe(true), None);
        assert_eq!(p.observe(false), None);
        assert_eq!(p.observe(false), None);
        assert_eq!(p.observe(false), Some(Transition::Down));
        assert!(!p.is_up());
        // Logged once: more failures change nothing.
        assert_eq!(p.observe(false), None);
        assert_eq!(p.observe(false), None);
    }

    #[test]
    fn comes_up_after_rise_successes_in_a_row() {
        let mut p = Probe::new(1, 2);
        assert_eq!(p.observe(false), Some(Transition::Down));
        assert_eq!(p.observe(true), None);
        assert_eq!(p.observe(false), None);
        assert_eq!(p.observe(true), None);
        assert_eq!(p.observe(true), Some(Transition::Up));
        assert_eq!(p.observe(true), None);
        assert!(p.is_up());
    }

    #[test]
    fn sync_with_a_passive_down_needs_rise_successes() {
        let mut p = Probe::new(3, 2);
        p.sync(false);
        assert!(!p.is_up());
        assert_eq!(p.observe(true), None);
        assert_eq!(p.observe(true), Some(Transition::Up));
        p.sync(true);
        assert_eq!(p.observe(true), None);
    }

    #[test]
    fn flags_and_defaults() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            h: HealthArgs,
        }
        let c = Cli::try_parse_from(["x"]).unwrap().h.to_config();
        assert_eq!(c, HealthConfig::default());
        assert_eq!(c.interval, Duration::from_secs(5));
        assert_eq!(c.timeout, Duration::from_secs(2));
        let c = Cli::try_parse_from([
            "x",
            "--health-check",
            "http",
            "--health-path",
            "/ok",
            "--health-interval",
            "100ms",
            "--health-timeout",
            "50ms",
            "--fall",
            "2",
            "--rise",
            "1",
            "--passive-failures",
            "0",
            "--health-cooldown",
            "1s",
            "--http-replies",
        ])
        .unwrap()
        .h
        .to_config();
        assert_eq!(c.check, CheckKind::Http);
        assert_eq!(c.path, "/ok");
        assert_eq!(c.interval, Duration::from_millis(100));
        assert_eq!((c.fall, c.rise, c.passive_failures), (2, 1, 0));
        assert!(c.http_replies);
        assert!(c.validate().is_ok());
        assert!(HealthConfig {
            fall: 0,
            ..HealthConfig::default()
        }
        .validate()
        .is_err());
        assert!(HealthConfig {
            path: "health".into(),
            ..HealthConfig::default()
        }
        .validate()
        .is_err());
    }

    #[test]
    fn parses_status_lines() {
        assert_eq!(parse_status("HTTP/1.1 200 OK"), Some(200));
        assert_eq!(parse_status("HTTP/1.0 302 Found"), Some(302));
        assert_eq!(parse_status("SSH-2.0-OpenSSH"), None);
        assert_eq!(parse_status("HTTP/1.1 abc"), None);
        assert_eq!(parse_status(""), None);
    }

    /// A backend on a listener that answers each connection with `reply`.
    fn answering(reply: &'static str) -> (Backend, thread::JoinHandle<()>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut buf = [0u8; 512];
            let n = s.read(&mut buf).unwrap();
            assert!(buf[..n].starts_with(b"GET /health HTTP/1.1\r\n"));
            s.write_all(reply.as_bytes()).unwrap();
        });
        (Backend::new(addr.to_string(), vec![addr], 1), t)
    }

    fn http_config() -> HealthConfig {
        HealthConfig {
            check: CheckKind::Http,
            timeout: Duration::from_secs(2),
            ..HealthConfig::default()
        }
    }

    #[test]
    fn http_check_wants_2xx_or_3xx() {
        for (reply, healthy) in [
            ("HTTP/1.1 200 OK\r\n\r\n", true),
            ("HTTP/1.0 301 Moved\r\nLocation: /\r\n\r\n", true),
            ("HTTP/1.1 500 Internal Server Error\r\n\r\n", false),
            ("HTTP/1.1 404 Not Found\r\n\r\n", false),
            ("garbage\r\n", false),
        ] {
            let (b, t) = answering(reply);
            let result = check(&b, &http_config());
            assert_eq!(result.is_ok(), healthy, "{reply:?}: {result:?}");
            t.join().unwrap();
        }
    }

    #[test]
    fn checks_fail_on_refused_and_on_silence() {
        // Refused: a port nobody listens on any more.
        let addr = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let gone = Backend::new("gone".into(), vec![addr], 1);
        for kind in [CheckKind::Tcp, CheckKind::Http] {
            let c = HealthConfig {
                check: kind,
                ..HealthConfig::default()
            };
            assert!(check(&gone, &c).is_err());
        }
        // Silence: accepted (by the kernel) but never answered.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let mute = Backend::new("mute".into(), vec![addr], 1);
        let c = HealthConfig {
            timeout: Duration::from_millis(200),
            ..http_config()
        };
        let started = Instant::now();
        let err = check(&mute, &c).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(2), "{err}");
        // A TCP check passes on the same backend: it does connect.
        let tcp = HealthConfig {
            check: CheckKind::Tcp,
            ..c
        };
        assert!(check(&mute, &tcp).is_ok());
        drop(l);
    }

    /// Polls `cond` every few milliseconds until it holds or `limit` passes.
    fn wait_for(limit: Duration, cond: impl Fn() -> bool) -> Option<Duration> {
        let started = Instant::now();
        while started.elapsed() < limit {
            if cond() {
                return Some(started.elapsed());
            }
            thread::sleep(Duration::from_millis(5));
        }
        None
    }

    #[test]
    fn the_thread_marks_down_and_up_and_stops_on_shutdown() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr: SocketAddr = l.local_addr().unwrap();
        let b = Arc::new(Backend::new(addr.to_string(), vec![addr], 1));
        let s = Arc::new(Scheduler::new(vec![Arc::clone(&b)]));
        let config = HealthConfig {
            interval: Duration::from_millis(50),
            timeout: Duration::from_millis(200),
            ..HealthConfig::default()
        };
        let shutdown = Shutdown::new();
        let handle = spawn(Arc::clone(&s), config, shutdown.clone())
            .unwrap()
            .unwrap();
        drop(l);
        wait_for(Duration::from_secs(5), || !b.is_healthy()).expect("marked down");
        let l = socket2_rebind(addr);
        wait_for(Duration::from_secs(5), || b.is_healthy()).expect("marked up");
        // A passive down is brought back by the checks too.
        b.set_healthy(false);
        wait_for(Duration::from_secs(5), || b.is_healthy()).expect("back up");
        let started = Instant::now();
        shutdown.trigger();
        handle.join().unwrap();
        assert!(started.elapsed() < Duration::from_secs(1));
        drop(l);
    }

    fn socket2_rebind(addr: SocketAddr) -> TcpListener {
        // std sets SO_REUSEADDR on Unix, so the port is free again at once.
        TcpListener::bind(addr).unwrap()
    }

    #[test]
    fn cooldown_brings_a_backend_back_with_checks_off() {
        let b = Arc::new(Backend::new("b".into(), vec![], 1));
        let s = Arc::new(Scheduler::new(vec![Arc::clone(&b)]));
        let config = HealthConfig {
            check: CheckKind::Off,
            interval: Duration::from_millis(20),
            cooldown: Duration::from_millis(100),
            ..HealthConfig::default()
        };
        let shutdown = Shutdown::new();
        let handle = spawn(s, config, shutdown.clone()).unwrap().unwrap();
        let err = io::Error::from(ErrorKind::ConnectionRefused);
        connect_failed(&b, 2, &HealthConfig::default(), &err);
        assert!(b.is_healthy(), "below the threshold");
        connect_failed(&b, 3, &HealthConfig::default(), &err);
        assert!(!b.is_healthy());
        let took = wait_for(Duration::from_secs(5), || b.is_healthy()).expect("retried");
        assert!(took >= Duration::from_millis(80), "{took:?}");
        shutdown.trigger();
        handle.join().unwrap();
        // No thread at all when nothing needs it.
        let off = HealthConfig {
            check: CheckKind::Off,
            passive_failures: 0,
            ..HealthConfig::default()
        };
        let s = Arc::new(Scheduler::new(vec![]));
        assert!(spawn(s, off, Shutdown::new()).unwrap().is_none());
    }

    #[test]
    fn replies_reach_the_client() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let (server, _) = l.accept().unwrap();
        reply_at_once(&server, REPLY_503);
        drop(server);
        let mut got = String::new();
        c.read_to_string(&mut got).unwrap();
        assert!(
            got.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{got}"
        );
        assert!(got.ends_with("\r\n\r\nno backend server available\r\n"));

        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let (server, _) = l.accept().unwrap();
        c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let t = thread::spawn(move || reply_and_linger(&server, REPLY_502, Duration::from_secs(5)));
        let mut got = String::new();
        c.read_to_string(&mut got).unwrap();
        assert!(got.starts_with("HTTP/1.1 502 Bad Gateway\r\n"), "{got}");
        assert!(got.ends_with("\r\n\r\nno backend server reachable\r\n"));
        drop(c);
        t.join().unwrap();
    }
}
