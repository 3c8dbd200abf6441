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
use std::time::Duration;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::backend::BackendSpec;
use crate::config::{Config, Overrides};
use crate::error::{Error, Result};
use crate::health::CheckKind;
use crate::limiter::{Rate, Reply, RuleKind, MAX_MAX_CLIENTS};
use crate::scheduler::Algorithm;
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
    #[arg(short, long, default_value = "127.0.0.1:8001")]
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
    #[arg(short, long)]
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
    #[arg(long)]
    pub workers: Option<usize>,
    /// Stack size of each worker thread (e.g. 65536, 64k).
    #[arg(long, value_parser = parse_size)]
    pub thread_stack: Option<usize>,
    /// Most accepted connections waiting for a free worker.
    #[arg(long)]
    pub queue_capacity: Option<usize>,
    /// The listen(2) backlog.
    #[arg(long)]
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
    #[arg(long)]
    pub fall: Option<u32>,
    /// Successful checks in a row that mark a down backend up.
    #[arg(long)]
    pub rise: Option<u32>,
    /// Failed connects in a row on real traffic that mark a backend down at
    /// once (0: never).
    #[arg(long)]
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

fn parse_algorithm(text: &str) -> std::result::Result<Algorithm, String> {
    text.parse()
}

fn parse_check(text: &str) -> std::result::Result<CheckKind, String> {
    text.parse()
}

fn parse_rule(text: &str) -> std::result::Result<RuleKind, String> {
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
    let matches = command().try_get_matches()?;
    Cli::from_arg_matches(&matches)
}

/// The first line of a clap error, for the one-line message on bad flags
/// (clap's own message adds a usage block and a hint over several lines).
pub fn one_line(err: &clap::Error) -> String {
    let rendered = err.render().to_string();
    let mut lines = rendered.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next().unwrap_or("invalid arguments").to_string();
    // "the following required arguments were not provided:" lists them on
    // the next lines, up to the usage block: keep them on the same line.
    if first.ends_with(':') {
        let rest: Vec<&str> = lines.take_while(|l| !l.starts_with("Usage:")).collect();
        if !rest.is_empty() {
            return format!("{first} {}", rest.join(", "));
        }
    }
    first
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
        for name in [
            "round-robin",
            "weighted-round-robin",
            "least-connections",
            "ip-hash",
            "p2c",
        ] {
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
}
