//! Command-line flags, parsed with clap, turned into a [`Config`].
//!
//! `rodizio [FLAGS]` runs the balancer (asking for backends when no
//! `--backend` is given); `rodizio [FLAGS] demo` runs it in front of
//! built-in demo backends (three by default); `rodizio backend --listen ADDR` runs one demo
//! backend alone (the "backend role" of seed 001).
//!
//! Every default below is the article's value or is documented in the
//! README's flag table. Parsing runs once, on the main thread, before any
//! other thread exists: nothing here is shared.
//!
//! # Corresponds to the C article
//!
//! The C has no flags: its settings are `#define`s, changed by editing and
//! recompiling. The defaults here are those constants.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::backend::BackendSpec;
use crate::config::{parse_duration, parse_size, Config};
use crate::error::{Error, Result};
use crate::proxy::PumpOptions;

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

/// Flags of the balancer itself.
#[derive(Debug, Args)]
pub struct BalancerArgs {
    /// Address to accept clients on (IPv4 or IPv6, e.g. `[::]:8080`).
    #[arg(short, long, default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    /// A backend as HOST:PORT[,weight=N]; repeat for more. Without any,
    /// rodizio asks for them as the article's program does.
    #[arg(short, long = "backend", value_name = "HOST:PORT", value_parser = parse_backend)]
    pub backends: Vec<BackendSpec>,
    /// Most worker threads, hence most connections served at once.
    #[arg(long, default_value_t = 4096)]
    pub workers: usize,
    /// Stack size of each worker thread (e.g. 65536, 64k).
    #[arg(long, default_value = "64k", value_parser = parse_size)]
    pub thread_stack: usize,
    /// Most accepted connections waiting for a free worker.
    #[arg(long, default_value_t = 4096)]
    pub queue_capacity: usize,
    /// The listen(2) backlog.
    #[arg(long, default_value_t = 4096)]
    pub backlog: i32,
    /// Bytes per read in each direction (e.g. 4096, 16k).
    #[arg(long, default_value = "4096", value_parser = parse_size)]
    pub buffer_size: usize,
    /// Longest wait for a backend to accept a connection (e.g. 500ms, 3s).
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub connect_timeout: Duration,
    /// Close a connection after this long with no byte moving.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub idle_timeout: Duration,
    /// On SIGINT/SIGTERM, wait this long for connections in flight.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub drain_timeout: Duration,
    /// Per-client-IP rate limiting (`limiter.rs`).
    #[command(flatten)]
    pub rate_limit: crate::limiter::RateLimitArgs,
    /// How backends are chosen (`--algorithm`).
    #[command(flatten)]
    pub scheduling: crate::scheduler::SchedulingArgs,
    /// Health checks and replies when no backend can serve.
    #[command(flatten)]
    pub health: crate::health::HealthArgs,
    /// The pump's flags (--splice, --yield-before-poll).
    #[command(flatten)]
    pub pump: PumpOptions,
    /// The listener's flags (--defer-accept).
    #[command(flatten)]
    pub accept: crate::listener::AcceptOptions,
}

fn parse_backend(text: &str) -> std::result::Result<BackendSpec, String> {
    BackendSpec::parse(text).map_err(|e| match e {
        Error::InvalidBackend(msg) => msg,
        other => other.to_string(),
    })
}

impl BalancerArgs {
    /// The configuration these flags describe (backends may still be empty:
    /// the prompt fills them).
    ///
    /// # Errors
    ///
    /// A usage error ([`Error::is_usage`]) when flags contradict each other
    /// (for example `--rate-limit-reply` without `--rate-limit`).
    pub fn to_config(&self) -> Result<Config> {
        Ok(Config {
            listen: self.listen,
            backends: self.backends.clone(),
            workers: self.workers,
            thread_stack: self.thread_stack,
            queue_capacity: self.queue_capacity,
            backlog: self.backlog,
            buffer_size: self.buffer_size,
            connect_timeout: self.connect_timeout,
            idle_timeout: self.idle_timeout,
            drain_timeout: self.drain_timeout,
            rate_limit: self.rate_limit.to_config()?,
            scheduling: self.scheduling.to_config(),
            health: self.health.to_config(),
            pump: self.pump.clone(),
            accept: self.accept.clone(),
        })
    }
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
        assert_eq!(c.buffer_size, 4096);
        assert!(c.backends.is_empty());
        assert!(cli.command.is_none());
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
        assert_eq!(c.buffer_size, 16 * 1024);
        assert_eq!(c.connect_timeout, Duration::from_millis(500));
        assert_eq!(c.idle_timeout, Duration::from_secs(60));
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
        assert_eq!(cli.balancer.workers, 9);
        let cli =
            Cli::try_parse_from(["rodizio", "backend", "--listen", "127.0.0.1:9001"]).unwrap();
        match cli.command {
            Some(Command::Backend(b)) => assert_eq!(b.listen.port(), 9001),
            other => panic!("{other:?}"),
        }
    }
}
