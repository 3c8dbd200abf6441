//! `rodizio preflight`: this host weighed against the settings before any
//! traffic: the open-files limit, the thread limits, the listen backlog's
//! cap, the local ports each backend can use, port sharing, and memory.
//! Each check is one [`Line`]: `ok`, `warn` or `fail`, the numbers, and
//! for the last two the command that fixes it.
//!
//! Two parts meet here: [`Demand`], what the settings ask at their fullest
//! (every worker busy, the queue full), and [`Host`], what the system
//! gives (`host`), read from `getrlimit(2)`, `/proc` and the cgroup files. The
//! checks ([`checks`]) take both as plain numbers and do no I/O, so their
//! tests feed them any host they like. The counts behind [`Demand`] are
//! explained in docs/operations.md, "`preflight`".
//!
//! # Threads
//!
//! Runs once on the main thread: for the `preflight` subcommand, and at
//! the balancer's start-up ([`log_warnings`]), after the open-files limit
//! is raised and before the first client; nothing here is shared.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C finds its limits by hitting them (`exit()` on
//! the first failed `pthread_create` or `accept`).

pub mod checks;
pub mod host;

use std::fmt;

use crate::admin::{HANDLERS, MAX_CONNECTIONS, RESERVE};
use crate::config::Config;
use crate::health::CheckKind;
use crate::listener;
use crate::pool::Sizing;

pub use host::{Cgroup, Host, Limit};

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    /// The host gives what the settings ask.
    Ok,
    /// It works, with a cost worth knowing (a capped backlog, a low rate
    /// of new connections per backend, memory that may run short).
    Warn,
    /// Under full load something will be refused: a thread, a descriptor,
    /// memory.
    Fail,
}

impl Verdict {
    /// `ok`, `warn` or `fail`, as the lines print it.
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Warn => "warn",
            Verdict::Fail => "fail",
        }
    }
}

/// One check's result, printed as one line:
/// `fail  open files (RLIMIT_NOFILE): soft 1024, hard 1024; 12584 needed  fix: ulimit -n 12584`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// How it came out.
    pub verdict: Verdict,
    /// What was checked, with the limit's own name (`RLIMIT_NOFILE`,
    /// `net.core.somaxconn`), so the operator can look it up.
    pub what: String,
    /// The numbers: what the host gives, what the settings need.
    pub numbers: String,
    /// The command that fixes it, when not ok and one exists.
    pub fix: Option<String>,
}

impl Line {
    /// An ok line (no fix).
    pub(crate) fn ok(what: impl Into<String>, numbers: impl Into<String>) -> Line {
        Line {
            verdict: Verdict::Ok,
            what: what.into(),
            numbers: numbers.into(),
            fix: None,
        }
    }

    /// A warn or fail line with its fix.
    pub(crate) fn bad(
        verdict: Verdict,
        what: impl Into<String>,
        numbers: impl Into<String>,
        fix: impl Into<String>,
    ) -> Line {
        Line {
            fix: Some(fix.into()),
            ..Line::ok(what, numbers).verdict(verdict)
        }
    }

    /// The same line with another verdict.
    pub(crate) fn verdict(self, verdict: Verdict) -> Line {
        Line { verdict, ..self }
    }
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:<4}  {}: {}",
            self.verdict.word(),
            self.what,
            self.numbers
        )?;
        match &self.fix {
            Some(fix) => write!(f, "  fix: {fix}"),
            None => Ok(()),
        }
    }
}

/// Descriptors of every connection a worker serves: the client's socket
/// and the backend's.
pub const PER_CONNECTION: u64 = 2;
/// Descriptors a worker keeps with `--splice`: its two pipes, one per
/// direction, two ends each (`conduit/mod.rs`, `Pipe`), made on its first
/// connection and kept while it lives.
pub const PER_SPLICE_WORKER: u64 = 4;
/// Descriptors open whatever the settings: standard input, output, error.
const STANDARD_STREAMS: u64 = 3;
/// Descriptors that come and go and are not counted one by one: a config
/// file read on reload, name lookups, the rate limiter's Redis connections
/// (at most 8 idle and those in use), `/proc` files read by the stats.
pub const DESCRIPTOR_MARGIN: u64 = 32;
/// Descriptors of the admin API beside its connections: its listener and
/// the runtime's `epoll` and waker.
const ADMIN_OWN: u64 = 3;

/// Threads whatever the settings: the main thread (the accept loop), the
/// signal thread, a reaper (removing drained backends), and the short-lived
/// thread that trims glibc's stack cache after a flood (`pool.rs`).
pub const FIXED_THREADS: u64 = 4;

/// What the kernel keeps per thread besides its user stack: the kernel
/// stack (16 KiB on x86-64 and arm64).
pub const KERNEL_STACK: u64 = 16 * 1024;
/// A pipe's capacity (`F_GETPIPE_SZ`, 64 KiB by default): with `--splice`
/// each direction's bytes wait there, in kernel pages, instead of a buffer.
pub const PIPE_CAPACITY: u64 = 64 * 1024;
/// The page size the buffers' mapping is rounded up to.
const PAGE: u64 = 4096;

/// What the settings ask of the host at their fullest: every worker busy
/// with a connection and the queue full. Plain numbers, so the checks can
/// be fed any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Demand {
    /// Most worker threads, hence connections at once.
    pub workers: u64,
    /// Each worker's stack, in bytes.
    pub stack: u64,
    /// Most clients waiting in the queue, one descriptor each.
    pub waiting: u64,
    /// Bytes per read in each direction (`buffer_size`).
    pub buffer: u64,
    /// `--splice`: pipes instead of buffers.
    pub splice: bool,
    /// The `listen(2)` backlog asked for.
    pub backlog: u64,
    /// The port is shared with other processes (`SO_REUSEPORT`).
    pub shares_port: bool,
    /// The admin API is on.
    pub admin: bool,
    /// An access log is written (a thread; with a file, one descriptor).
    pub access_log: bool,
    /// Backends known at start-up.
    pub backends: u64,
    /// Every backend known at start-up is on this host's loopback
    /// (`127.0.0.0/8`, `::1`, `localhost`): `tcp_tw_reuse=2`, the kernel's
    /// default, then lets their connects reuse ports in TIME_WAIT.
    pub loopback_backends: bool,
    /// Active health checks run: each round, one thread and one socket
    /// per backend.
    pub checks: bool,
}

/// Whether every backend of every service of `config` is written as a
/// loopback address or `localhost` (and there is at least one).
fn on_loopback(config: &Config) -> bool {
    let mut specs = config
        .service_list()
        .into_iter()
        .flat_map(|s| &s.backends)
        .peekable();
    specs.peek().is_some()
        && specs.all(|spec| {
            spec.host == "localhost"
                || spec
                    .host
                    .trim_matches(|c| c == '[' || c == ']')
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        })
}

impl Demand {
    /// What `config` asks for.
    pub fn of(config: &Config) -> Demand {
        let sizing = Sizing::of(config);
        Demand {
            workers: sizing.workers as u64,
            stack: sizing.stack_size as u64,
            waiting: sizing.waiting as u64,
            buffer: config.proxy.buffer_size as u64,
            splice: config.proxy.splice,
            backlog: u64::try_from(config.backlog).unwrap_or(0),
            shares_port: listener::shares_port(config),
            admin: config.admin_listen.is_some(),
            access_log: config.access_log.is_some(),
            backends: config.backends.len() as u64,
            loopback_backends: on_loopback(config),
            checks: config.health.check != CheckKind::Off,
        }
    }

    /// Descriptors held by the connections: two each, four more per worker
    /// with `--splice`, one per waiting client.
    pub fn connection_descriptors(&self) -> u64 {
        let per_worker = PER_CONNECTION + if self.splice { PER_SPLICE_WORKER } else { 0 };
        self.workers * per_worker + self.waiting
    }

    /// Descriptors of everything else: the standard streams, the
    /// listener (and its duplicate when the port is shared), the admin
    /// API's listener, runtime and connections (with the ones it keeps in
    /// reserve), a health check socket per backend, the access log's file,
    /// and [`DESCRIPTOR_MARGIN`].
    pub fn other_descriptors(&self) -> u64 {
        let listener = if self.shares_port { 2 } else { 1 };
        let admin = if self.admin {
            ADMIN_OWN + MAX_CONNECTIONS as u64 + RESERVE as u64
        } else {
            0
        };
        let checks = if self.checks { self.backends } else { 0 };
        let log = u64::from(self.access_log);
        STANDARD_STREAMS + listener + admin + checks + log + DESCRIPTOR_MARGIN
    }

    /// Descriptors the workers keep aside for their backend sockets
    /// (`crate::reserve`): one per worker, at most
    /// [`crate::reserve::MOST_FOR_WORKERS`].
    pub fn kept_descriptors(&self) -> u64 {
        self.workers.min(crate::reserve::MOST_FOR_WORKERS as u64)
    }

    /// Descriptors needed at the fullest.
    pub fn descriptors(&self) -> u64 {
        self.connection_descriptors() + self.kept_descriptors() + self.other_descriptors()
    }

    /// Threads besides the workers: [`FIXED_THREADS`], the health thread
    /// and its probes (one per backend per round), the admin API's thread
    /// and its handlers, the access log's writer.
    pub fn other_threads(&self) -> u64 {
        let health = 1 + if self.checks { self.backends } else { 0 };
        let admin = if self.admin { 1 + HANDLERS as u64 } else { 0 };
        FIXED_THREADS + health + admin + u64::from(self.access_log)
    }

    /// Threads needed at the fullest.
    pub fn threads(&self) -> u64 {
        self.workers + self.other_threads()
    }

    /// What one busy worker may hold in memory: its stack, what its bytes
    /// wait in (two buffers in one mapping rounded up to pages, or with
    /// `--splice` two pipes when full), and its kernel stack.
    pub fn memory_per_worker(&self) -> u64 {
        self.stack + self.conduit_bytes() + KERNEL_STACK
    }

    /// Two buffers rounded up to whole pages, or two full pipes.
    pub fn conduit_bytes(&self) -> u64 {
        if self.splice {
            2 * PIPE_CAPACITY
        } else {
            (2 * self.buffer).div_ceil(PAGE) * PAGE
        }
    }

    /// Memory the workers may hold at the fullest. An upper bound: a
    /// thread touches only the pages of its stack it uses.
    pub fn memory(&self) -> u64 {
        self.workers * self.memory_per_worker()
    }
}

/// Every check, in the order printed.
pub fn check(demand: &Demand, host: &Host) -> Vec<Line> {
    vec![
        checks::descriptors(demand, host),
        checks::user_threads(demand, host),
        checks::threads_max(demand, host),
        checks::pid_max(demand, host),
        checks::cgroup_tasks(demand, host),
        checks::backlog(demand, host),
        checks::local_ports(demand, host),
        checks::port_sharing(demand, host),
        checks::cgroup_memory(demand, host),
        checks::available_memory(demand, host),
    ]
}

/// The checks of `config` against this host, read now.
pub fn run(config: &Config) -> Vec<Line> {
    check(&Demand::of(config), &Host::read())
}

/// The worst verdict of `lines` (ok when there are none).
pub fn worst(lines: &[Line]) -> Verdict {
    lines.iter().map(|l| l.verdict).max().unwrap_or(Verdict::Ok)
}

/// At the balancer's start-up: each line that is not ok as one log
/// warning, then each setting accepted that does nothing as it is
/// ([`Config::unused_warnings`]). It never stops the start: a limit that
/// is too low costs only under a load that may never come, and the
/// operator decides.
pub fn log_warnings(config: &Config) {
    for line in run(config) {
        if line.verdict != Verdict::Ok {
            log::warn!("preflight: {line}");
        }
    }
    // With them, the settings accepted that do nothing as they are.
    for words in config.unused_warnings() {
        log::warn!("{words}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_reads_verdict_what_numbers_fix() {
        let line = Line::bad(
            Verdict::Fail,
            "open files (RLIMIT_NOFILE)",
            "soft 1024, hard 1024; 12584 needed",
            "ulimit -n 12584",
        );
        assert_eq!(
            line.to_string(),
            "fail  open files (RLIMIT_NOFILE): soft 1024, hard 1024; 12584 needed  fix: ulimit -n 12584"
        );
        let ok = Line::ok("listen backlog (net.core.somaxconn)", "4096, backlog 4096");
        assert_eq!(
            ok.to_string(),
            "ok    listen backlog (net.core.somaxconn): 4096, backlog 4096"
        );
        assert_eq!(worst(&[ok.clone(), line]), Verdict::Fail);
        assert_eq!(worst(&[ok]), Verdict::Ok);
        assert_eq!(worst(&[]), Verdict::Ok);
    }

    /// The defaults: 4096 workers, 4096 waiting, 64 KiB stacks, 4 KiB
    /// buffers, no admin API; counted as the module docs say.
    #[test]
    fn the_defaults_ask_for() {
        let d = Demand::of(&Config::default());
        assert_eq!(d.connection_descriptors(), 4096 * 2 + 4096);
        assert_eq!(d.other_descriptors(), 3 + 1 + DESCRIPTOR_MARGIN);
        assert_eq!(d.threads(), 4096 + FIXED_THREADS + 1);
        assert_eq!(d.memory_per_worker(), 64 * 1024 + 8 * 1024 + 16 * 1024);
        assert_eq!(d.memory(), 4096 * 88 * 1024);
    }

    #[test]
    fn splice_admin_checks_and_a_shared_port_add_their_part() {
        let mut config = Config {
            workers: 10,
            admin_listen: Some("127.0.0.1:9000".parse().unwrap()),
            backends: vec![
                crate::backend::BackendSpec::parse("127.0.0.1:1").unwrap(),
                crate::backend::BackendSpec::parse("127.0.0.1:2").unwrap(),
            ],
            ..Config::default()
        };
        config.proxy.splice = true;
        let d = Demand::of(&config);
        assert!(d.splice && d.admin && d.checks);
        assert_eq!(d.connection_descriptors(), 10 * 6 + 4096);
        let admin = ADMIN_OWN + MAX_CONNECTIONS as u64 + RESERVE as u64;
        assert_eq!(d.other_descriptors(), 3 + 1 + admin + 2 + DESCRIPTOR_MARGIN);
        assert_eq!(d.threads(), 10 + FIXED_THREADS + 3 + 1 + HANDLERS as u64);
        assert_eq!(d.conduit_bytes(), 2 * PIPE_CAPACITY);
        let shared = Demand {
            shares_port: true,
            ..d.clone()
        };
        assert_eq!(shared.descriptors(), d.descriptors() + 1);
        // An odd buffer size is rounded up to whole pages, both together.
        let odd = Demand {
            splice: false,
            buffer: 5000,
            ..d
        };
        assert_eq!(odd.conduit_bytes(), 12288);
    }
}
