//! The balancer's settings, in one validated value.
//!
//! [`Config`] is what [`crate::run`] takes. The binary builds it from flags
//! (`cli.rs`) and, when no backend was given, from the interactive prompt
//! (`prompt.rs`); tests build it directly. [`Config::default`] holds the
//! article's values, so a test or a reader changes only what it cares about.
//!
//! A `Config` is built and validated on one thread before anything starts;
//! [`crate::Balancer::bind`] then gives each part a copy of the settings it
//! needs, so no thread shares or locks it.
//!
//! # Corresponds to the C article
//!
//! The `#define`s at the top of the C file:
//!
//! | C constant                  | field                               |
//! |-----------------------------|-------------------------------------|
//! | `_PORT 8080`                | `listen` (`0.0.0.0:8080`)           |
//! | `_BACKLOG 4096`             | `backlog`                           |
//! | `_MAX_THREAD_NUM 4096`      | `workers`                           |
//! | `_THREAD_STACK_SIZE 65536`  | `thread_stack`                      |
//! | `_BUFFER_SIZE 4100` (reads of 4096) | `buffer_size` (4096)        |
//! | `_MAX_SERVERS 10`           | [`MAX_PROMPT_SERVERS`] (prompt only; flags take any number) |

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use crate::backend::BackendSpec;
use crate::error::{Error, Result};
use crate::limiter::RateLimitConfig;
use crate::proxy::PumpOptions;

/// The article's `_PORT`.
pub const DEFAULT_PORT: u16 = 8080;
/// The article's `_MAX_SERVERS`: the prompt accepts 1 to 10 backends.
pub const MAX_PROMPT_SERVERS: usize = 10;

/// Everything the balancer needs to run.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where to accept clients. Default `0.0.0.0:8080`.
    pub listen: SocketAddr,
    /// The backends, in round-robin order.
    pub backends: Vec<BackendSpec>,
    /// Most worker threads, hence most connections served at once. Default 4096.
    pub workers: usize,
    /// Stack size of each worker thread, in bytes. Default 65536.
    pub thread_stack: usize,
    /// Most accepted connections waiting for a worker. Default 4096.
    pub queue_capacity: usize,
    /// The `listen(2)` backlog. Default 4096.
    pub backlog: i32,
    /// Bytes per read, each direction. Default 4096.
    pub buffer_size: usize,
    /// Longest wait for one backend connect. Default 3 s.
    pub connect_timeout: Duration,
    /// Longest time a connection may move no byte. Default 10 min.
    pub idle_timeout: Duration,
    /// Longest wait for connections in flight after a shutdown. Default 30 s.
    pub drain_timeout: Duration,
    /// Per-client-IP rate limiting at accept time. Default `None` (off).
    pub rate_limit: Option<RateLimitConfig>,
    /// How backends are chosen. Default: round robin.
    pub scheduling: crate::scheduler::SchedulingConfig,
    /// Health checks (active and passive) and replies when no backend can
    /// serve. Defaults: tcp checks every 5 s.
    pub health: crate::health::HealthConfig,
    /// How the pump moves bytes (`--splice`). Default: through buffers.
    pub pump: PumpOptions,
    /// The listener's flags (`--defer-accept`). Default: off.
    pub accept: crate::listener::AcceptOptions,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), DEFAULT_PORT),
            backends: Vec::new(),
            workers: 4096,
            thread_stack: 65536,
            queue_capacity: 4096,
            backlog: 4096,
            buffer_size: 4096,
            connect_timeout: Duration::from_secs(3),
            idle_timeout: Duration::from_secs(600),
            drain_timeout: Duration::from_secs(30),
            rate_limit: None,
            scheduling: Default::default(),
            health: Default::default(),
            pump: PumpOptions::default(),
            accept: Default::default(),
        }
    }
}

/// Smallest worker stack accepted: below this, a worker could overflow
/// while logging or unwinding a panic.
pub const MIN_THREAD_STACK: usize = 32 * 1024;

impl Config {
    /// Checks that every value is usable.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the first bad value.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::InvalidConfig(msg));
        if self.backends.is_empty() {
            return bad("no backend given".into());
        }
        if self.workers == 0 || self.workers > 65536 {
            return bad(format!("--workers must be 1..65536, got {}", self.workers));
        }
        if self.thread_stack < MIN_THREAD_STACK {
            return bad(format!(
                "--thread-stack must be at least {MIN_THREAD_STACK} bytes, got {}",
                self.thread_stack
            ));
        }
        if self.queue_capacity == 0 {
            return bad("--queue-capacity must be at least 1".into());
        }
        if self.backlog < 1 {
            return bad(format!(
                "--backlog must be at least 1, got {}",
                self.backlog
            ));
        }
        if self.buffer_size == 0 || self.buffer_size > 16 * 1024 * 1024 {
            return bad(format!(
                "--buffer-size must be 1..16777216 bytes, got {}",
                self.buffer_size
            ));
        }
        for (name, d) in [
            ("--connect-timeout", self.connect_timeout),
            ("--idle-timeout", self.idle_timeout),
        ] {
            if d.is_zero() {
                return bad(format!("{name} must be more than 0"));
            }
        }
        if let Some(rate_limit) = &self.rate_limit {
            rate_limit.validate()?;
        }
        self.health.validate()
    }
}

/// Parses a duration: a number followed by `ms`, `s`, `m` or `h`
/// (`500ms`, `3s`, `10m`, `1h`); a bare number means seconds.
///
/// # Errors
///
/// A message saying what is wrong, for clap to print.
pub fn parse_duration(text: &str) -> std::result::Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("'{text}' is not a duration (examples: 500ms, 3s, 10m)"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => {
            return Err(format!(
                "'{text}': unknown unit '{unit}' (use ms, s, m or h)"
            ))
        }
    };
    if !seconds.is_finite() || seconds > 1e9 {
        return Err(format!("'{text}' is too long"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// Parses a byte size: a number with an optional `k` or `m` suffix
/// (`65536`, `64k`, `1m`), powers of 1024.
///
/// # Errors
///
/// A message saying what is wrong, for clap to print.
pub fn parse_size(text: &str) -> std::result::Result<usize, String> {
    let lower = text.trim().to_ascii_lowercase();
    let lower = lower.strip_suffix('b').unwrap_or(&lower);
    let (number, factor) = if let Some(n) = lower.strip_suffix('k') {
        (n, 1024)
    } else if let Some(n) = lower.strip_suffix('m') {
        (n, 1024 * 1024)
    } else {
        (lower, 1)
    };
    number
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(factor))
        .ok_or_else(|| format!("'{text}' is not a size (examples: 4096, 64k, 1m)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_articles() {
        let c = Config::default();
        assert_eq!(c.listen.port(), 8080);
        assert_eq!(c.workers, 4096);
        assert_eq!(c.thread_stack, 65536);
        assert_eq!(c.backlog, 4096);
        assert_eq!(c.buffer_size, 4096);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("3s"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        for bad in ["", "s", "3x", "-1s", "abc"] {
            assert!(parse_duration(bad).is_err(), "accepted {bad:?}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("65536"), Ok(65536));
        assert_eq!(parse_size("64k"), Ok(65536));
        assert_eq!(parse_size("64KiB".trim_end_matches("iB")), Ok(65536));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert!(parse_size("lots").is_err());
    }

    #[test]
    fn validation_names_the_bad_value() {
        let mut c = Config {
            backends: vec![BackendSpec::parse("127.0.0.1:1").unwrap()],
            ..Config::default()
        };
        assert!(c.validate().is_ok());
        c.thread_stack = 1000;
        let msg = c.validate().unwrap_err().to_string();
        assert!(msg.contains("--thread-stack"), "{msg}");
    }
}
