//! Command-line flags, parsed with clap, turned into [`Overrides`] laid over
//! the defaults. clap lives here only: the settings types know nothing of it.
//!
//! `rodizio [FLAGS]` runs the balancer (asking for backends when no
//! `--backend` is given); `rodizio [FLAGS] demo` runs it in front of
//! built-in demo backends (three by default); `rodizio backend --listen ADDR` runs one demo
//! backend alone (the "backend role": the same program as the balancer or as a
//! server behind it).
//!
//! No default is written here: each flag is optional, and `--help` shows
//! the default from [`Config::default`]. Parsing runs once, on the main thread, before any
//! other thread exists: nothing here is shared.
//!
//! # Corresponds to the C article
//!
//! The C has no flags: its settings are `#define`s, changed by editing and
//! recompiling. The defaults here are those constants.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::backend::BackendSpec;
use crate::config::{parse_listen, Config, Overrides, MAX_WORKERS};
use crate::error::{Error, Result};
use crate::health::CheckKind;
use crate::limiter::{
    FailurePolicy, Rate, RateLimitAlgorithm as RuleKind, RateLimitReply as Reply, MAX_MAX_CLIENTS,
};
use crate::proxy_protocol::{CidrList, Version};
use crate::scheduler::Algorithm;
use crate::trace::Lang;
use crate::units::{parse_duration, parse_size};

/// rodizio: a thread-per-connection TCP load balancer (round robin by default).
#[derive(Debug, Parser)]
#[command(name = "rodizio", version, about, long_about = None)]
pub struct Cli {
    /// Balancer settings.
    #[command(flatten)]
    pub balancer: BalancerArgs,
    /// What to run; the balancer when omitted.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start demo HTTP backends on loopback (three by default) and the
    /// balancer in front of them (the balancer flags go before `demo`).
    Demo(DemoArgs),
    /// Run one demo HTTP backend: it answers every request with a body
    /// naming itself, and `GET /health` with 200.
    Backend(BackendArgs),
    /// Check a config file: print the settings it gives (with the flags
    /// before `check-config` over it), one `key = value` per line; exit 0
    /// when valid, 2 with the reason when not.
    CheckConfig(CheckConfigArgs),
}

/// Arguments of `rodizio check-config`.
#[derive(Debug, Args)]
pub struct CheckConfigArgs {
    /// The JSON config file to check.
    pub file: PathBuf,
}

/// Flags of `rodizio demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// How many demo backends to start.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=10))]
    pub backends: u16,
    /// Port of the first demo backend on 127.0.0.1; the others follow it
    /// (0 picks free ports).
    #[arg(long, default_value_t = 8001)]
    pub first_port: u16,
}

/// Flags of `rodizio backend`.
#[derive(Debug, Args)]
pub struct BackendArgs {
    /// Address to listen on.
    #[arg(short, long, default_value = "127.0.0.1:8001", value_parser = parse_listen)]
    pub listen: SocketAddr,
    /// Name in the reply body (default: the listening address).
    #[arg(long)]
    pub name: Option<String>,
}

/// Flags of the balancer itself. Each is optional: what is not given keeps
/// the value underneath (the default; later, a config file). The defaults
/// shown by `--help` come from [`Config::default`] (see [`command`]).
#[derive(Debug, Args)]
pub struct BalancerArgs {
    /// Address to accept clients on (IPv4 or IPv6, e.g. `[::]:8080`).
    #[arg(short, long, value_parser = parse_listen)]
    pub listen: Option<SocketAddr>,
    /// A backend as HOST:PORT[,weight=N]; repeat for more. Without any,
    /// rodizio asks for them as the article's program does.
    #[arg(short, long = "backend", value_name = "HOST:PORT", value_parser = parse_backend)]
    pub backends: Vec<BackendSpec>,
    /// How to choose the backend for each new client: round-robin,
    /// weighted-round-robin, least-connections, ip-hash, p2c.
    #[arg(long, value_name = "ALGORITHM", value_parser = parse_algorithm)]
    pub algorithm: Option<Algorithm>,
    /// Most worker threads, hence most connections served at once.
    #[arg(long, value_parser = whole::<usize, 1, { MAX_WORKERS as u64 }>)]
    pub workers: Option<usize>,
    /// Stack size of each worker thread (e.g. 65536, 64k).
    #[arg(long, value_parser = parse_size)]
    pub thread_stack: Option<usize>,
    /// Most accepted connections waiting for a free worker.
    #[arg(long, value_parser = whole::<usize, 1, { usize::MAX as u64 }>)]
    pub queue_capacity: Option<usize>,
    /// A worker thread that waited this long for a client exits, down to a
    /// floor of a few (e.g. 30s, 10m); `off` keeps every worker started.
    #[arg(long, value_name = "DUR", value_parser = parse_duration_or_off)]
    pub worker_idle_timeout: Option<DurationOrOff>,
    /// The listen(2) backlog.
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..))]
    pub backlog: Option<i32>,
    /// Bytes per read in each direction (e.g. 4096, 16k).
    #[arg(long, value_parser = parse_size)]
    pub buffer_size: Option<usize>,
    /// Longest wait for a backend to accept a connection (e.g. 500ms, 3s).
    #[arg(long, value_parser = parse_duration)]
    pub connect_timeout: Option<Duration>,
    /// Close a connection after this long with no byte moving.
    #[arg(long, value_parser = parse_duration)]
    pub idle_timeout: Option<Duration>,
    /// On SIGINT/SIGTERM, wait this long for connections in flight.
    #[arg(long, value_parser = parse_duration)]
    pub drain_timeout: Option<Duration>,
    /// Move bytes with splice(2) through a pipe per direction (Linux, zero
    /// copy, up to 64 KiB per call) instead of 4096-byte reads and writes;
    /// --buffer-size is then unused. Off by default: the article's pump
    /// copies through a buffer.
    #[arg(long)]
    pub splice: bool,
    /// After moving bytes, give the CPU away once (sched_yield) and check
    /// again without waiting before sleeping in poll(2): the peer often
    /// answers meanwhile, and the worker is spared a sleep and a wake-up.
    /// Off by default: it trades a little CPU for it when the answer is slow.
    #[arg(long)]
    pub yield_before_poll: bool,
    /// Hand a client to a worker only once its first bytes have arrived
    /// (TCP_DEFER_ACCEPT): fewer wake-ups per short connection. Off by
    /// default: clients of protocols where the server speaks first (SMTP,
    /// FTP, MySQL) would wait about a second before being served.
    #[arg(long)]
    pub defer_accept: bool,
    /// Active health check: tcp (connect), http (GET --health-path), off, or
    /// one that speaks the backend's protocol so it logs nothing: redis,
    /// tls, smtp, mysql, pgsql, send-expect (see docs/health-checks.md).
    #[arg(long, value_name = "KIND", value_parser = parse_check)]
    pub health_check: Option<CheckKind>,
    /// Time between two rounds of active checks.
    #[arg(long, value_parser = parse_duration)]
    pub health_interval: Option<Duration>,
    /// Longest wait for one check.
    #[arg(long, value_parser = parse_duration)]
    pub health_timeout: Option<Duration>,
    /// Path requested by the http check.
    #[arg(long)]
    pub health_path: Option<String>,
    /// Failed checks in a row that mark a backend down.
    #[arg(long, value_parser = whole::<u32, 1, { u32::MAX as u64 }>)]
    pub fall: Option<u32>,
    /// Successful checks in a row that mark a down backend up.
    #[arg(long, value_parser = whole::<u32, 1, { u32::MAX as u64 }>)]
    pub rise: Option<u32>,
    /// Failed connects in a row on real traffic that mark a backend down at
    /// once (0: never).
    #[arg(long, value_parser = whole::<u32, 0, { u32::MAX as u64 }>)]
    pub passive_failures: Option<u32>,
    /// With --health-check off, how long a backend marked down by real
    /// traffic rests before it is tried again.
    #[arg(long, value_parser = parse_duration)]
    pub health_cooldown: Option<Duration>,
    /// Answer clients that no backend can serve with HTTP 503 (none
    /// available) or 502 (none reachable) instead of just closing.
    #[arg(long)]
    pub http_replies: bool,
    /// Limit each client IP to N new connections per WINDOW (e.g. 100/1s,
    /// 20/10s). Off by default.
    #[arg(long, value_name = "N/WINDOW", value_parser = Rate::parse)]
    pub rate_limit: Option<Rate>,
    /// How connections are counted: fixed-window, sliding-window,
    /// token-bucket.
    #[arg(long, value_name = "ALGORITHM", value_parser = parse_rule)]
    pub rate_limit_algorithm: Option<RuleKind>,
    /// Most client IPs tracked at once; the table is allocated at start-up,
    /// about 54 bytes per client.
    #[arg(
        long,
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..=MAX_MAX_CLIENTS as i64)
    )]
    pub rate_limit_max_clients: Option<u32>,
    /// IPv6 clients are limited per prefix of this many bits; 128 limits
    /// each address.
    #[arg(
        long,
        value_name = "BITS",
        value_parser = clap::value_parser!(u8).range(1..=128)
    )]
    pub rate_limit_ipv6_prefix: Option<u8>,
    /// What a refused client gets: `close` (closed at once) or `http` (a
    /// minimal 429 reply, then closed).
    #[arg(long, value_name = "REPLY", value_parser = parse_reply)]
    pub rate_limit_reply: Option<Reply>,
    /// Read settings from this JSON file (flags win over it); SIGHUP
    /// reads it again. See docs/operations.md.
    #[arg(short = 'c', long = "config", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// User of the mysql check (it then logs in and quits, so the server
    /// logs nothing) and of the pgsql check (default rodizio).
    #[arg(long, value_name = "USER")]
    pub health_user: Option<String>,
    /// Bytes the send-expect check sends: text with \r \n \xHH escapes,
    /// or hex:0d0a.
    #[arg(long, value_name = "BYTES", value_parser = parse_health_bytes)]
    pub health_send: Option<Vec<u8>>,
    /// Bytes the send-expect check wants in the reply (same notation).
    #[arg(long, value_name = "BYTES", value_parser = parse_health_bytes)]
    pub health_expect: Option<Vec<u8>>,
    /// Narrate each step of every connection (accepted, the choice of
    /// backend, the queue, the worker, connect, bytes each way, the
    /// half-closes and the close), as info lines with the log target
    /// rodizio::trace.
    #[arg(long)]
    pub trace: bool,
    /// The language of --trace: en or pt (Brazilian Portuguese). When not
    /// given: pt if LANG starts with pt.
    #[arg(long, value_name = "LANG", value_parser = parse_lang)]
    pub trace_lang: Option<Lang>,
    /// Serve the admin API (JSON over HTTP: list, add, drain, remove
    /// backends; reload; settings) on this address; loopback only unless
    /// --admin-allow-remote. Off by default.
    #[arg(long = "admin", visible_alias = "admin-listen", value_name = "ADDR", value_parser = parse_listen)]
    pub admin_listen: Option<SocketAddr>,
    /// Let --admin listen on an address that is not loopback.
    #[arg(long)]
    pub admin_allow_remote: bool,
    /// Ask admin API requests for `Authorization: Bearer TOKEN`, TOKEN
    /// being this file's content (trimmed).
    #[arg(long, value_name = "FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// Close a client that waited longer than this for a free worker (503
    /// with --http-replies) instead of serving it late (HAProxy's `timeout
    /// queue`).
    #[arg(long, value_parser = parse_duration)]
    pub queue_timeout: Option<Duration>,
    /// Close a client that sends nothing within this time of being accepted
    /// (silent clients holding workers). Off by default: in protocols where
    /// the server speaks first the client is silent until greeted.
    #[arg(long, value_parser = parse_duration)]
    pub client_first_byte_timeout: Option<Duration>,
    /// Once one side of a connection has closed its write side, close the
    /// connection when the other stays silent this long.
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub fin_timeout: Option<Duration>,
    /// Turn on TCP keep-alive on both sockets of each connection: first
    /// probe after IDLE without traffic, then every IDLE/3 (at least 1s),
    /// dropped after 3 unanswered (e.g. 60s).
    #[arg(long, value_name = "IDLE", value_parser = parse_duration)]
    pub tcp_keepalive: Option<Duration>,
    /// Send every backend a PROXY protocol header (v1 or v2) with the
    /// client's address before its bytes; one backend alone takes
    /// `-b HOST:PORT,send-proxy` or `,send-proxy-v2`.
    #[arg(long, value_name = "VERSION", value_parser = parse_proxy_version)]
    pub send_proxy: Option<Version>,
    /// Expect a PROXY protocol header (v1 or v2) from every client: for a
    /// balancer behind another proxy (HAProxy's send-proxy, nginx's
    /// proxy_protocol on). The header's address is then the client's.
    #[arg(long)]
    pub accept_proxy: bool,
    /// The peers allowed to send that header, as CIDR[,CIDR...]; a client
    /// connecting from elsewhere is closed.
    #[arg(long, value_name = "CIDR,...", value_parser = parse_cidrs)]
    pub accept_proxy_from: Option<CidrList>,
    /// Longest wait for a complete PROXY protocol header; a client that
    /// sends none in time is closed.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub accept_proxy_timeout: Option<Duration>,
    /// Keep the rate limit's counts in Redis (redis://HOST:PORT/DB), shared
    /// by every balancer pointed at it, instead of in this process.
    #[arg(long, value_name = "URL")]
    pub rate_limit_store: Option<String>,
    /// Longest wait for Redis on one check (connect, read, write).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub rate_limit_store_timeout: Option<Duration>,
    /// When Redis fails or is slow: `open` serves the client unchecked,
    /// `closed` refuses it.
    #[arg(long, value_name = "POLICY", value_parser = parse_failure)]
    pub rate_limit_store_failure: Option<FailurePolicy>,
    /// Set SO_REUSEPORT on the listening socket, so several rodizio
    /// processes listen on the same port (a new version starts before the
    /// old one drains; see docs/scaling.md). Off by default.
    #[arg(long)]
    pub reuse_port: bool,
    /// Write one line per connection when it ends, as text or json (client,
    /// backend, queue and connect times, duration, bytes, how it ended);
    /// refused clients get a line too. Off by default.
    #[arg(long, value_name = "FORMAT", value_parser = parse_access_log)]
    pub access_log: Option<crate::access_log::Format>,
    /// Where --access-log writes (default: standard output); reopened on
    /// SIGUSR1, for logrotate.
    #[arg(long, value_name = "PATH")]
    pub access_log_file: Option<PathBuf>,
}

/// A duration, or `off`: the value of a flag that is on by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurationOrOff(pub Option<Duration>);

fn parse_duration_or_off(text: &str) -> std::result::Result<DurationOrOff, String> {
    if text.trim() == "off" {
        return Ok(DurationOrOff(None));
    }
    parse_duration(text)
        .map(|d| DurationOrOff(Some(d)))
        .map_err(|e| format!("{e}; or off, to keep every worker"))
}

fn parse_access_log(text: &str) -> std::result::Result<crate::access_log::Format, String> {
    text.parse()
        .map_err(|e: Error| e.to_string().replace("invalid configuration: ", ""))
}

fn parse_failure(text: &str) -> std::result::Result<FailurePolicy, String> {
    text.parse()
}

fn parse_proxy_version(text: &str) -> std::result::Result<Version, String> {
    text.parse()
        .map_err(|e: crate::proxy_protocol::ParseError| e.to_string())
}

fn parse_cidrs(text: &str) -> std::result::Result<CidrList, String> {
    text.parse()
        .map_err(|e: crate::proxy_protocol::ParseError| e.to_string())
}

fn parse_health_bytes(text: &str) -> std::result::Result<Vec<u8>, String> {
    crate::health::protocol::parse_bytes(text)
}

fn parse_backend(text: &str) -> std::result::Result<BackendSpec, String> {
    BackendSpec::parse(text).map_err(|e| match e {
        Error::InvalidBackend(msg) => msg,
        other => other.to_string(),
    })
}

/// A whole number up to `HI`, refused in words ("expected a whole number
/// from 1 to 65536") as the config file refuses it. `LO` is for the words:
/// a value under it is refused by the validation, which names the setting.
fn whole<T: TryFrom<u64>, const LO: u64, const HI: u64>(
    text: &str,
) -> std::result::Result<T, String> {
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|n| *n <= HI)
        .and_then(|n| T::try_from(n).ok())
        .ok_or_else(|| {
            let shown: String = text.chars().take(40).collect();
            let cut = if shown.len() < text.len() { "..." } else { "" };
            format!("expected a whole number from {LO} to {HI}, got '{shown}{cut}'")
        })
}

fn parse_algorithm(text: &str) -> std::result::Result<Algorithm, String> {
    text.parse()
}

fn parse_check(text: &str) -> std::result::Result<CheckKind, String> {
    text.parse()
}

fn parse_rule(text: &str) -> std::result::Result<RuleKind, String> {
    text.parse()
}

fn parse_lang(text: &str) -> std::result::Result<Lang, String> {
    text.parse()
}

fn parse_reply(text: &str) -> std::result::Result<Reply, String> {
    text.parse()
}

/// `Some(true)` for a flag that was given, `None` for one that was not (a
/// flag cannot say "off": that is the default, or a config file's word).
fn given(flag: bool) -> Option<bool> {
    flag.then_some(true)
}

impl BalancerArgs {
    /// The settings these flags give, to lay over the defaults (and, later,
    /// a config file).
    pub fn overrides(&self) -> Overrides {
        Overrides {
            listen: self.listen,
            backends: (!self.backends.is_empty()).then(|| self.backends.clone()),
            algorithm: self.algorithm,
            workers: self.workers,
            thread_stack: self.thread_stack,
            queue_capacity: self.queue_capacity,
            worker_idle_timeout: self.worker_idle_timeout.map(|d| d.0),
            backlog: self.backlog,
            buffer_size: self.buffer_size,
            connect_timeout: self.connect_timeout,
            idle_timeout: self.idle_timeout,
            drain_timeout: self.drain_timeout,
            splice: given(self.splice),
            yield_before_poll: given(self.yield_before_poll),
            defer_accept: given(self.defer_accept),
            health_check: self.health_check,
            health_interval: self.health_interval,
            health_timeout: self.health_timeout,
            health_path: self.health_path.clone(),
            fall: self.fall,
            rise: self.rise,
            passive_failures: self.passive_failures,
            health_cooldown: self.health_cooldown,
            http_replies: given(self.http_replies),
            rate_limit: self.rate_limit,
            rate_limit_algorithm: self.rate_limit_algorithm,
            rate_limit_max_clients: self.rate_limit_max_clients.map(|n| n as usize),
            rate_limit_ipv6_prefix: self.rate_limit_ipv6_prefix,
            rate_limit_reply: self.rate_limit_reply,
            health_user: self.health_user.clone(),
            health_send: self.health_send.clone(),
            health_expect: self.health_expect.clone(),
            trace: given(self.trace),
            trace_lang: self.trace_lang,
            admin_listen: self.admin_listen,
            admin_allow_remote: given(self.admin_allow_remote),
            admin_token_file: self.admin_token_file.clone(),
            queue_timeout: self.queue_timeout,
            client_first_byte_timeout: self.client_first_byte_timeout,
            fin_timeout: self.fin_timeout,
            tcp_keepalive: self.tcp_keepalive,
            send_proxy: self.send_proxy,
            accept_proxy: given(self.accept_proxy),
            accept_proxy_from: self.accept_proxy_from.clone(),
            accept_proxy_timeout: self.accept_proxy_timeout,
            rate_limit_store: self.rate_limit_store.clone(),
            rate_limit_store_timeout: self.rate_limit_store_timeout,
            rate_limit_store_failure: self.rate_limit_store_failure,
            reuse_port: given(self.reuse_port),
            access_log: self.access_log,
            access_log_file: self.access_log_file.clone(),
        }
    }

    /// The configuration these flags describe over the defaults (backends
    /// may still be empty: the prompt fills them). Errors name the flags.
    ///
    /// # Errors
    ///
    /// A usage error ([`Error::is_usage`]) when flags contradict each other
    /// (for example `--rate-limit-reply` without `--rate-limit`).
    pub fn to_config(&self) -> Result<Config> {
        let mut config = Config::default();
        self.overrides()
            .apply(&mut config)
            .map_err(Error::worded_as_flag)?;
        Ok(config)
    }
}

/// The clap command, with each balancer flag's help ending in its default
/// as [`Config::default`] describes it: the defaults are written once, in
/// the settings types, and shown from there.
pub fn command() -> clap::Command {
    let mut cmd = Cli::command();
    // Every flag that takes a value takes it even when it starts with a
    // hyphen, so `--connect-timeout -1s` reaches the value parser, which
    // refuses it naming the flag, instead of clap saying "unexpected
    // argument '-1'" without naming any.
    let valued: Vec<clap::Id> = cmd
        .get_arguments()
        .filter(|a| a.get_action().takes_values() && !a.is_positional())
        .map(|a| a.get_id().clone())
        .collect();
    for id in valued {
        cmd = cmd.mut_arg(id, |arg| arg.allow_hyphen_values(true));
    }
    for (name, value) in Config::default().describe() {
        if value.is_empty() || !cmd.get_arguments().any(|a| a.get_id() == name) {
            continue;
        }
        cmd = cmd.mut_arg(name, |arg| {
            let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
            arg.help(format!("{help} [default: {value}]"))
        });
    }
    cmd
}

/// Parses the process's arguments with [`command`].
///
/// # Errors
///
/// clap's error for bad arguments (and for `--help`/`--version`, which it
/// reports as errors of those kinds).
pub fn parse() -> std::result::Result<Cli, clap::Error> {
    parse_from(std::env::args_os())
}

/// Parses `args` (the program name first) as [`parse`] does: with
/// [`command`], and refusing balancer flags given with the `backend`
/// subcommand, which runs no balancer (`rodizio -l ADDR backend` would
/// otherwise listen on the backend's default address and say nothing).
///
/// # Errors
///
/// As [`parse`].
pub fn parse_from<I, T>(args: I) -> std::result::Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let mut cmd = command();
    let args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
    let matches = cmd
        .try_get_matches_from_mut(args.clone())
        .map_err(|err| match err.kind() {
            clap::error::ErrorKind::UnknownArgument => {
                flags_after_demo(&mut cmd, &args).unwrap_or(err)
            }
            _ => err,
        })?;
    if matches.subcommand_name() == Some("backend") {
        // Named as typed: `-b` is `--backend`, whose id is `backends`.
        let flags: Vec<(clap::Id, String)> = cmd
            .get_arguments()
            .map(|a| {
                let long = a.get_long().unwrap_or(a.get_id().as_str());
                (a.get_id().clone(), format!("--{long}"))
            })
            .collect();
        let given: Vec<String> = matches
            .ids()
            .filter(|id| {
                matches.value_source(id.as_str()) == Some(clap::parser::ValueSource::CommandLine)
            })
            .filter_map(|id| flags.iter().find(|(f, _)| f == id).map(|(_, n)| n.clone()))
            .collect();
        if !given.is_empty() {
            return Err(cmd.error(
                clap::error::ErrorKind::ArgumentConflict,
                format!(
                    "{} given before 'backend': balancer flags, and 'backend' runs no \
                     balancer; its own flags go after it (rodizio backend --listen 127.0.0.1:8001)",
                    given.join(", ")
                ),
            ));
        }
    }
    Cli::from_arg_matches(&matches)
}

/// For `rodizio demo -l ADDR`: an error saying that balancer flags go
/// before `demo`, with the command line put right; `None` when no balancer
/// flag follows `demo`.
fn flags_after_demo(cmd: &mut clap::Command, args: &[std::ffi::OsString]) -> Option<clap::Error> {
    let words: Vec<String> = args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let demo = words.iter().position(|w| w == "demo")?;
    // A balancer flag as typed (`-l`, `--listen`, `--listen=ADDR`), and
    // how many words it takes.
    let flag_at = |w: &str| {
        let name = w.split('=').next().unwrap_or(w);
        cmd.get_arguments().find_map(|a| {
            let long = a.get_long().map(|l| format!("--{l}"));
            let short = a.get_short().map(|c| format!("-{c}"));
            let hit = long.as_deref() == Some(name) || short.as_deref() == Some(name);
            let takes = a.get_action().takes_values() && !w.contains('=');
            hit.then_some(if takes { 2 } else { 1 })
        })
    };
    let (at, len) = words
        .iter()
        .enumerate()
        .skip(demo + 1)
        .find_map(|(i, w)| flag_at(w).map(|len| (i, len)))?;
    let end = (at + len).min(words.len());
    let mut fixed: Vec<&str> = vec!["rodizio"];
    fixed.extend(words[1..demo].iter().map(String::as_str));
    fixed.extend(words[at..end].iter().map(String::as_str));
    fixed.push("demo");
    fixed.extend(words[demo + 1..at].iter().map(String::as_str));
    fixed.extend(words[end..].iter().map(String::as_str));
    Some(cmd.error(
        clap::error::ErrorKind::UnknownArgument,
        format!(
            "'{}' after 'demo': balancer flags go before 'demo' ({})",
            words[at],
            fixed.join(" ")
        ),
    ))
}

/// The first line of a clap error, for the one-line message on bad flags
/// (clap's own message adds a usage block and a hint over several lines).
pub fn one_line(err: &clap::Error) -> String {
    let rendered = err.render().to_string();
    let mut lines = rendered.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next().unwrap_or("invalid arguments").to_string();
    let rest: Vec<&str> = lines
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .collect();
    // "the following required arguments were not provided:" lists them on
    // the next lines, up to the usage block: keep them on the same line.
    if first.ends_with(':') && !rest.is_empty() {
        return format!("{first} {}", rest.join(", "));
    }
    // What clap adds below the first line and is worth keeping: the
    // accepted values and its tips ("a similar argument exists: ...").
    let kept: Vec<&str> = rest
        .into_iter()
        .filter(|l| l.starts_with("tip:") || l.starts_with("[possible values:"))
        .collect();
    if kept.is_empty() {
        first
    } else {
        format!("{first} ({})", kept.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_match_the_article() {
        let cli = Cli::try_parse_from(["rodizio"]).unwrap();
        let c = cli.balancer.to_config().unwrap();
        assert_eq!(c.listen.port(), 8080);
        assert_eq!(c.thread_stack, 65536);
        assert_eq!(c.proxy.buffer_size, 4096);
        assert!(c.backends.is_empty());
        assert!(cli.command.is_none());
        assert_eq!(c, Config::default());
    }

    #[test]
    fn help_shows_the_defaults_of_the_settings() {
        let help = command().render_help().to_string();
        for shown in [
            "[default: 0.0.0.0:8080]",
            "[default: 64k]",
            "[default: 3s]",
            "[default: 10m]",
            "[default: round-robin]",
            "[default: tcp]",
            "[default: /health]",
        ] {
            assert!(help.contains(shown), "{shown} missing from --help");
        }
    }

    #[test]
    fn splice_and_yield_are_flags_off_by_default() {
        let off = Cli::try_parse_from(["rodizio"]).unwrap();
        let c = off.balancer.to_config().unwrap();
        assert!(!c.proxy.splice && !c.proxy.yield_before_poll);
        let on = Cli::try_parse_from(["rodizio", "--splice", "--yield-before-poll"]).unwrap();
        let c = on.balancer.to_config().unwrap();
        assert!(c.proxy.splice && c.proxy.yield_before_poll);
    }

    #[test]
    fn health_flags_build_the_health_settings() {
        let c = Cli::try_parse_from([
            "rodizio",
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
        .balancer
        .to_config()
        .unwrap()
        .health;
        assert_eq!(c.check, crate::health::CheckKind::Http);
        assert_eq!(c.path, "/ok");
        assert_eq!(c.interval, Duration::from_millis(100));
        assert_eq!(c.timeout, Duration::from_millis(50));
        assert_eq!((c.fall, c.rise, c.passive_failures), (2, 1, 0));
        assert_eq!(c.cooldown, Duration::from_secs(1));
        assert!(c.http_replies);
        assert!(c.validate().is_ok());
    }

    #[test]
    fn algorithm_flag() {
        let c = Cli::try_parse_from(["rodizio"]).unwrap();
        assert_eq!(
            c.balancer.to_config().unwrap().algorithm,
            Algorithm::RoundRobin
        );
        // Every algorithm by its name (the names themselves are pinned in
        // the scheduler's tests).
        for name in Algorithm::ALL.iter().map(|a| a.name()) {
            let c = Cli::try_parse_from(["rodizio", "--algorithm", name]).unwrap();
            assert_eq!(c.balancer.algorithm.unwrap().name(), name);
        }
        assert!(Cli::try_parse_from(["rodizio", "--algorithm", "random"]).is_err());
    }

    #[test]
    fn parses_every_flag() {
        let cli = Cli::try_parse_from([
            "rodizio",
            "-l",
            "[::1]:9000",
            "-b",
            "127.0.0.1:8001",
            "--backend",
            "localhost:8002,weight=3",
            "--workers",
            "8",
            "--thread-stack",
            "128k",
            "--queue-capacity",
            "10",
            "--backlog",
            "16",
            "--buffer-size",
            "16k",
            "--connect-timeout",
            "500ms",
            "--idle-timeout",
            "1m",
            "--drain-timeout",
            "2s",
        ])
        .unwrap();
        let c = cli.balancer.to_config().unwrap();
        assert_eq!(c.listen, "[::1]:9000".parse().unwrap());
        assert_eq!(c.backends.len(), 2);
        assert_eq!(c.backends[1].weight, 3);
        assert_eq!(c.workers, 8);
        assert_eq!(c.thread_stack, 128 * 1024);
        assert_eq!(c.proxy.buffer_size, 16 * 1024);
        assert_eq!(c.proxy.connect_timeout, Duration::from_millis(500));
        assert_eq!(c.proxy.idle_timeout, Duration::from_secs(60));
        assert_eq!(c.drain_timeout, Duration::from_secs(2));
    }

    #[test]
    fn bad_flags_give_one_clear_line() {
        for args in [
            vec!["rodizio", "--workers", "many"],
            vec!["rodizio", "-b", "nope"],
            vec!["rodizio", "--connect-timeout", "3 parsecs"],
            vec!["rodizio", "--no-such-flag"],
            vec!["rodizio", "backend", "--listen"],
        ] {
            let err = Cli::try_parse_from(&args).unwrap_err();
            let line = one_line(&err);
            assert!(line.starts_with("error:"), "{args:?}: {line}");
            assert!(!line.contains('\n'));
        }
    }

    #[test]
    fn admin_flags_build_the_admin_settings() {
        let c = Cli::try_parse_from(["rodizio"]).unwrap();
        let c = c.balancer.to_config().unwrap();
        assert_eq!(c.admin_listen, None);
        let help = command().render_help().to_string();
        let admin = &help[help.find("--admin <ADDR>").unwrap()..];
        let admin = &admin[..admin.find("--admin-allow-remote\n").unwrap()];
        assert!(admin.contains("[default: off]"), "{admin}");
        let cli = Cli::try_parse_from([
            "rodizio",
            "--admin",
            "127.0.0.1:9000",
            "--admin-token-file",
            "/etc/rodizio/token",
            "--admin-allow-remote",
        ])
        .unwrap();
        let c = cli.balancer.to_config().unwrap();
        assert_eq!(c.admin_listen, Some("127.0.0.1:9000".parse().unwrap()));
        assert_eq!(c.admin_token_file, Some("/etc/rodizio/token".into()));
        assert!(c.admin_allow_remote);
        // The name validation words it as: the alias works too.
        let cli = Cli::try_parse_from(["rodizio", "--admin-listen", "[::1]:9000"]).unwrap();
        assert!(cli.balancer.admin_listen.is_some());
        let err = Cli::try_parse_from(["rodizio", "--admin", "localhost"]).unwrap_err();
        assert!(one_line(&err).starts_with("error:"));
    }

    #[test]
    fn subcommands() {
        let cli = Cli::try_parse_from(["rodizio", "--workers", "9", "demo"]).unwrap();
        assert!(matches!(
            cli.command,
            Some(Command::Demo(DemoArgs {
                backends: 3,
                first_port: 8001
            }))
        ));
        assert_eq!(cli.balancer.workers, Some(9));
        let cli =
            Cli::try_parse_from(["rodizio", "backend", "--listen", "127.0.0.1:9001"]).unwrap();
        match cli.command {
            Some(Command::Backend(b)) => assert_eq!(b.listen.port(), 9001),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn rate_limit_flags_build_the_config() {
        use crate::limiter::RateLimitConfig;
        const S: Duration = Duration::from_secs(1);
        let cli = Cli::try_parse_from(["rodizio"]).unwrap();
        assert!(cli.balancer.to_config().unwrap().rate_limit.is_none());
        let cli = Cli::try_parse_from([
            "rodizio",
            "--rate-limit",
            "20/10s",
            "--rate-limit-algorithm",
            "token-bucket",
            "--rate-limit-max-clients",
            "1000",
            "--rate-limit-ipv6-prefix",
            "128",
            "--rate-limit-reply",
            "http",
        ])
        .unwrap();
        let rl = cli.balancer.to_config().unwrap().rate_limit.unwrap();
        assert_eq!(
            rl,
            RateLimitConfig {
                rate: Rate {
                    limit: 20,
                    window: 10 * S
                },
                algorithm: RuleKind::TokenBucket,
                max_clients: 1000,
                ipv6_prefix: 128,
                reply: Reply::Http,
            }
        );
        assert!(rl.validate().is_ok());
        let cli = Cli::try_parse_from(["rodizio", "--rate-limit", "100/1s"]).unwrap();
        assert_eq!(
            cli.balancer.to_config().unwrap().rate_limit,
            Some(RateLimitConfig::new(Rate {
                limit: 100,
                window: S
            }))
        );
        for args in [
            vec!["rodizio", "--rate-limit", "lots"],
            vec!["rodizio", "--rate-limit", "0/1s"],
            vec!["rodizio", "--rate-limit-algorithm", "leaky"],
            vec!["rodizio", "--rate-limit-max-clients", "0"],
            vec!["rodizio", "--rate-limit-ipv6-prefix", "129"],
            vec!["rodizio", "--rate-limit-reply", "teapot"],
        ] {
            let err = Cli::try_parse_from(&args).unwrap_err();
            let line = crate::cli::one_line(&err);
            assert!(line.starts_with("error:"), "{args:?}: {line}");
        }
        // The other flags mean nothing without a limit: a usage error.
        let cli = Cli::try_parse_from(["rodizio", "--rate-limit-reply", "http"]).unwrap();
        let err = cli.balancer.to_config().unwrap_err();
        assert!(err.is_usage());
        assert!(err
            .to_string()
            .contains("--rate-limit-reply needs --rate-limit"));
    }

    #[test]
    fn config_file_flag_and_check_config() {
        let cli = Cli::try_parse_from(["rodizio", "-c", "/etc/rodizio.json"]).unwrap();
        assert_eq!(
            cli.balancer.config,
            Some(PathBuf::from("/etc/rodizio.json"))
        );
        let cli = Cli::try_parse_from(["rodizio", "--config", "a.json", "--workers", "3"]).unwrap();
        assert_eq!(cli.balancer.config, Some(PathBuf::from("a.json")));
        assert_eq!(cli.balancer.overrides().workers, Some(3));
        let cli = Cli::try_parse_from(["rodizio", "check-config", "b.json"]).unwrap();
        match cli.command {
            Some(Command::CheckConfig(args)) => assert_eq!(args.file, PathBuf::from("b.json")),
            other => panic!("{other:?}"),
        }
        assert!(Cli::try_parse_from(["rodizio", "check-config"]).is_err());
    }

    #[test]
    fn trace_flags() {
        use crate::trace::Lang;
        let c = Cli::try_parse_from(["rodizio"]).unwrap();
        let c = c.balancer.to_config().unwrap();
        assert!(!c.trace);
        assert_eq!(c.trace_lang, Lang::En);
        let c = Cli::try_parse_from(["rodizio", "--trace", "--trace-lang", "pt"]).unwrap();
        let c = c.balancer.to_config().unwrap();
        assert!(c.trace);
        assert_eq!(c.trace_lang, Lang::Pt);
        let err = Cli::try_parse_from(["rodizio", "--trace-lang", "fr"]).unwrap_err();
        assert!(one_line(&err).contains("fr"), "{}", one_line(&err));
        let help = command().render_help().to_string();
        assert!(help.contains("--trace-lang"));
    }

    #[test]
    fn queue_timeout_flag() {
        let c = Cli::try_parse_from(["rodizio"]).unwrap();
        let c = c.balancer.to_config().unwrap();
        assert_eq!(c.proxy.queue_timeout, Duration::from_secs(30));
        let c = Cli::try_parse_from(["rodizio", "--queue-timeout", "250ms"]).unwrap();
        let c = c.balancer.to_config().unwrap();
        assert_eq!(c.proxy.queue_timeout, Duration::from_millis(250));
        assert!(command()
            .render_help()
            .to_string()
            .contains("[default: 30s]"));
        assert!(Cli::try_parse_from(["rodizio", "--queue-timeout", "soon"]).is_err());
    }

    #[test]
    fn client_first_byte_timeout_flag_is_off_by_default() {
        let c = Cli::try_parse_from(["rodizio"]).unwrap();
        let c = c.balancer.to_config().unwrap();
        assert_eq!(c.proxy.client_first_byte_timeout, None);
        let c = Cli::try_parse_from(["rodizio", "--client-first-byte-timeout", "2s"]).unwrap();
        let c = c.balancer.to_config().unwrap();
        assert_eq!(
            c.proxy.client_first_byte_timeout,
            Some(Duration::from_secs(2))
        );
        let d = Config::default().describe();
        assert!(d.contains(&("client_first_byte_timeout", "off".to_string())));
    }

    #[test]
    fn one_line_keeps_clap_tips() {
        let err = parse_from(["rodizio", "--worker", "3"]).unwrap_err();
        let line = one_line(&err);
        assert!(
            line.contains("tip: a similar argument exists: '--workers'"),
            "{line}"
        );
        assert!(!line.contains('\n'));
        let err = parse_from(["rodizio", "--algorithm", "rr"]).unwrap_err();
        let line = one_line(&err);
        assert!(line.contains("round-robin, weighted-round-robin"), "{line}");
    }

    #[test]
    fn negative_values_reach_the_value_parser_and_name_the_flag() {
        for (flag, value) in [
            ("--connect-timeout", "-1s"),
            ("--workers", "-3"),
            ("--thread-stack", "-64k"),
            ("--backlog", "-1"),
        ] {
            let err = parse_from(["rodizio", flag, value]).unwrap_err();
            let line = one_line(&err);
            assert!(line.contains(flag), "{flag} {value}: {line}");
            assert!(line.contains(value), "{flag} {value}: {line}");
        }
    }

    #[test]
    fn the_backlog_range_is_1_to_i32_max() {
        let err = parse_from(["rodizio", "--backlog", "2147483648"]).unwrap_err();
        let line = one_line(&err);
        assert!(line.contains("1..=2147483647"), "{line}");
        assert!(parse_from(["rodizio", "--backlog", "2147483647"]).is_ok());
        assert!(parse_from(["rodizio", "--backlog", "0"]).is_err());
    }

    #[test]
    fn balancer_flags_with_the_backend_subcommand_are_refused() {
        let err = parse_from(["rodizio", "-l", "127.0.0.1:18101", "backend"]).unwrap_err();
        let line = one_line(&err);
        assert!(line.contains("--listen given before 'backend'"), "{line}");
        // After it, --listen is the backend's own.
        let cli = parse_from(["rodizio", "backend", "-l", "127.0.0.1:18101"]).unwrap();
        assert!(matches!(cli.command, Some(Command::Backend(b)) if b.listen.port() == 18101));
        // With demo the balancer flags are valid and stay.
        let cli = parse_from(["rodizio", "-l", "127.0.0.1:18101", "demo"]).unwrap();
        assert_eq!(cli.balancer.listen.unwrap().port(), 18101);
    }

    /// Balancer flags after `demo` get a hint with the command put right;
    /// `demo --help` and demo's own flags are left alone.
    #[test]
    fn balancer_flags_after_demo_are_moved_in_the_hint() {
        let err =
            parse_from(["rodizio", "demo", "--backends", "2", "-l", "127.0.0.1:0"]).unwrap_err();
        let line = one_line(&err);
        assert!(
            line.contains(
                "balancer flags go before 'demo' (rodizio -l 127.0.0.1:0 demo --backends 2)"
            ),
            "{line}"
        );
        for help in ["--help", "-h"] {
            let err = parse_from(["rodizio", "demo", help]).unwrap_err();
            assert_eq!(err.kind(), clap::error::ErrorKind::DisplayHelp);
        }
        assert!(parse_from(["rodizio", "demo", "--backends", "2"]).is_ok());
    }

    /// Whole-number flags say the range in words, not the parser's
    /// ("invalid digit found in string", "too large to fit in target type").
    #[test]
    fn whole_number_flags_are_refused_in_words() {
        for (flag, value, range) in [
            ("--workers", "-1", "from 1 to 65536"),
            ("--workers", "99999999999999999999999", "from 1 to 65536"),
            ("--fall", "1.5", "from 1 to 4294967295"),
            ("--rise", "x", "from 1 to 4294967295"),
            ("--passive-failures", "-2", "from 0 to 4294967295"),
            ("--queue-capacity", "-3", "a whole number from 1"),
        ] {
            let err = parse_from(["rodizio", flag, value]).unwrap_err();
            let line = one_line(&err);
            assert!(line.contains(range), "{line}");
            assert!(
                !line.contains("digit") && !line.contains("target type"),
                "{line}"
            );
        }
        let cli = parse_from(["rodizio", "--workers", "8", "--fall", "3"]).unwrap();
        assert_eq!(
            (cli.balancer.workers, cli.balancer.fall),
            (Some(8), Some(3))
        );
    }

    /// The refusal names the flags as typed: `-b` is `--backend` and the
    /// admin address `--admin`, not their settings' names.
    #[test]
    fn flags_before_backend_are_named_as_typed() {
        let err = parse_from(["rodizio", "-b", "127.0.0.1:1", "backend"]).unwrap_err();
        let line = one_line(&err);
        assert!(line.contains("--backend given before 'backend'"), "{line}");
        let err = parse_from(["rodizio", "--admin", "127.0.0.1:9", "backend"]).unwrap_err();
        let line = one_line(&err);
        assert!(line.contains("--admin given before 'backend'"), "{line}");
    }

    #[test]
    fn addresses_are_refused_with_an_example_of_the_right_form() {
        for (args, wanted) in [
            (["rodizio", "-l", "8080"], "127.0.0.1:8080"),
            (["rodizio", "-l", "::1:8001"], "[::1]:8001"),
            (["rodizio", "-b", "::1:8001"], "[::1]:8001"),
            (["rodizio", "-b", "3:8001"], "'3' is not an IPv4 address"),
            (["rodizio", "-b", "3"], "expected HOST:PORT"),
        ] {
            let err = parse_from(args).unwrap_err();
            let line = one_line(&err);
            assert!(line.contains(wanted), "{args:?}: {line}");
        }
    }

    #[test]
    fn fin_timeout_and_tcp_keepalive_flags() {
        let c = Cli::try_parse_from(["rodizio"])
            .unwrap()
            .balancer
            .to_config()
            .unwrap();
        assert_eq!((c.proxy.fin_timeout, c.proxy.tcp_keepalive), (None, None));
        let c = Cli::try_parse_from(["rodizio", "--fin-timeout", "30s", "--tcp-keepalive", "1m"])
            .unwrap()
            .balancer
            .to_config()
            .unwrap();
        assert_eq!(c.proxy.fin_timeout, Some(Duration::from_secs(30)));
        assert_eq!(c.proxy.tcp_keepalive, Some(Duration::from_secs(60)));
        assert!(Cli::try_parse_from(["rodizio", "--fin-timeout", "soon"]).is_err());
        let help = command().render_help().to_string();
        assert!(help.contains("[default: same as idle_timeout]"), "{help}");
        assert!(help.contains("--tcp-keepalive"), "{help}");
    }

    #[test]
    fn proxy_protocol_flags_build_the_config() {
        let c = Cli::try_parse_from(["rodizio"]).unwrap();
        let c = c.balancer.to_config().unwrap();
        assert_eq!(c.send_proxy, None);
        assert!(!c.accept_proxy);
        assert_eq!(c.accept_proxy_from, CidrList::loopback());
        assert_eq!(c.accept_proxy_timeout, Duration::from_secs(5));
        let c = Cli::try_parse_from([
            "rodizio",
            "-b",
            "127.0.0.1:8001,send-proxy",
            "--send-proxy",
            "v2",
            "--accept-proxy",
            "--accept-proxy-from",
            "10.0.0.0/8, ::1",
            "--accept-proxy-timeout",
            "250ms",
        ])
        .unwrap()
        .balancer
        .to_config()
        .unwrap();
        assert_eq!(c.backends[0].send_proxy, Some(Version::V1));
        assert_eq!(c.send_proxy, Some(Version::V2));
        assert!(c.accept_proxy);
        assert_eq!(c.accept_proxy_from.to_string(), "10.0.0.0/8,::1/128");
        assert_eq!(c.accept_proxy_timeout, Duration::from_millis(250));
        for args in [
            vec!["rodizio", "--send-proxy", "v3"],
            vec![
                "rodizio",
                "--accept-proxy",
                "--accept-proxy-from",
                "10.0.0.0/33",
            ],
            vec!["rodizio", "--accept-proxy", "--accept-proxy-from", ""],
            vec!["rodizio", "-b", "127.0.0.1:1,send-proxy-v9"],
        ] {
            let err = Cli::try_parse_from(&args).unwrap_err();
            assert!(one_line(&err).starts_with("error:"), "{args:?}");
        }
        // The details mean nothing without --accept-proxy: a usage error.
        let cli = Cli::try_parse_from(["rodizio", "--accept-proxy-timeout", "1s"]).unwrap();
        let err = cli.balancer.to_config().unwrap_err();
        assert!(err.is_usage());
        assert!(
            err.to_string()
                .contains("--accept-proxy-timeout needs --accept-proxy"),
            "{err}"
        );
    }

    #[test]
    fn rate_limit_store_flags_build_the_config() {
        let c = Cli::try_parse_from(["rodizio"]).unwrap();
        let store = c.balancer.to_config().unwrap().rate_limit_store;
        assert_eq!(store.url, None);
        assert_eq!(store.timeout, Duration::from_millis(50));
        assert_eq!(store.failure, FailurePolicy::Open);
        let c = Cli::try_parse_from([
            "rodizio",
            "--rate-limit",
            "20/10s",
            "--rate-limit-store",
            "redis://127.0.0.1:6379/2",
            "--rate-limit-store-timeout",
            "20ms",
            "--rate-limit-store-failure",
            "closed",
        ])
        .unwrap();
        let store = c.balancer.to_config().unwrap().rate_limit_store;
        assert_eq!(store.url.as_deref(), Some("redis://127.0.0.1:6379/2"));
        assert_eq!(store.timeout, Duration::from_millis(20));
        assert_eq!(store.failure, FailurePolicy::Closed);
        assert!(Cli::try_parse_from(["rodizio", "--rate-limit-store-failure", "ajar"]).is_err());
        let c = Cli::try_parse_from(["rodizio", "--reuse-port"]).unwrap();
        assert!(c.balancer.to_config().unwrap().reuse_port);
        assert!(!Config::default().reuse_port);
        let cli = Cli::try_parse_from(["rodizio", "--rate-limit-store", "redis://h:1/0"]).unwrap();
        let err = cli.balancer.to_config().unwrap_err();
        assert!(
            err.to_string()
                .contains("--rate-limit-store needs --rate-limit"),
            "{err}"
        );
    }

    #[test]
    fn worker_idle_timeout_flag_takes_a_duration_or_off() {
        let config = |args: &[&str]| {
            let mut all = vec!["rodizio"];
            all.extend_from_slice(args);
            Cli::try_parse_from(all)
                .unwrap()
                .balancer
                .to_config()
                .unwrap()
        };
        assert_eq!(
            config(&[]).worker_idle_timeout,
            Some(Duration::from_secs(60))
        );
        let c = config(&["--worker-idle-timeout", "5s"]);
        assert_eq!(c.worker_idle_timeout, Some(Duration::from_secs(5)));
        assert_eq!(
            config(&["--worker-idle-timeout", "off"]).worker_idle_timeout,
            None
        );
        let err = parse_from(["rodizio", "--worker-idle-timeout", "soon"]).unwrap_err();
        let line = one_line(&err);
        assert!(line.contains("or off, to keep every worker"), "{line}");
        let zero = config(&["--worker-idle-timeout", "0"]);
        let err = zero.validate_settings().unwrap_err().worded_as_flag();
        assert!(
            err.to_string().contains(
                "--worker-idle-timeout must be at least 1ms, got 0ns (off keeps every worker)"
            ),
            "{err}"
        );
        assert!(command()
            .render_help()
            .to_string()
            .contains("keeps every worker started [default: 1m]"));
    }
}
