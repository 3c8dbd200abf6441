//! The rate limiter's settings: the rate, the algorithm, the reply to a
//! refused client and the table's bounds, with their defaults, their
//! parsing from flags and keys, and their validation.
//!
//! # Threads
//!
//! Plain values, built at start-up or on reload and copied into the
//! [`Limiter`](super::Limiter); no shared state. No C counterpart.

use std::fmt;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::units::parse_duration;

/// Default of `--rate-limit-max-clients`.
pub const DEFAULT_MAX_CLIENTS: usize = 65536;
/// Largest `--rate-limit-max-clients`: 16 Mi clients, about 900 MB of table.
pub const MAX_MAX_CLIENTS: usize = 1 << 24;
/// Default of `--rate-limit-ipv6-prefix`: one host usually owns a `/64`.
pub const DEFAULT_IPV6_PREFIX: u8 = 64;
/// Largest `N` of `--rate-limit N/WINDOW` (the counters are 31 bits).
pub const MAX_LIMIT: u32 = 1_000_000_000;
/// Shortest `WINDOW` of `--rate-limit N/WINDOW`.
pub const MIN_WINDOW: Duration = Duration::from_millis(1);

/// How connections are counted (`rate_limit_algorithm`); see
/// `docs/rate-limiting.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RateLimitAlgorithm {
    /// `N` per window; a window opens at a client's first connection.
    #[default]
    FixedWindow,
    /// HAProxy's two-counter estimate of the rate over the last window.
    SlidingWindow,
    /// A bucket of `N` tokens refilled at `N` per window.
    TokenBucket,
}

impl RateLimitAlgorithm {
    /// Every kind, in the order the help lists them.
    pub const ALL: [RateLimitAlgorithm; 3] = [
        RateLimitAlgorithm::FixedWindow,
        RateLimitAlgorithm::SlidingWindow,
        RateLimitAlgorithm::TokenBucket,
    ];
}

impl std::str::FromStr for RateLimitAlgorithm {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<Self, String> {
        let wanted = text.replace('_', "-");
        RateLimitAlgorithm::ALL
            .into_iter()
            .find(|k| k.to_string() == wanted)
            .ok_or_else(|| {
                format!("'{text}' is not a rate-limit algorithm (use fixed-window, sliding-window or token-bucket)")
            })
    }
}

impl fmt::Display for RateLimitAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            RateLimitAlgorithm::FixedWindow => "fixed-window",
            RateLimitAlgorithm::SlidingWindow => "sliding-window",
            RateLimitAlgorithm::TokenBucket => "token-bucket",
        })
    }
}

/// What a refused client gets before it is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RateLimitReply {
    /// Nothing: the connection is closed at once.
    #[default]
    Close,
    /// `HTTP/1.1 429 Too Many Requests` with `Retry-After` and
    /// `Connection: close`, written once without blocking, then closed.
    Http,
}

/// `N` connections per `WINDOW`, as in `--rate-limit 100/1s`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Connections allowed per window, 1 to [`MAX_LIMIT`].
    pub limit: u32,
    /// The window, at least [`MIN_WINDOW`].
    pub window: Duration,
}

impl Rate {
    /// Parses `N/WINDOW`: `100/1s`, `20/10s`, `5/500ms`; a bare unit means
    /// one of it (`100/s`, `10/m`), and a bare number is per second (`10`
    /// is `10/1s`, as HAProxy's `rate-limit sessions` and most rates people
    /// write are).
    ///
    /// # Errors
    ///
    /// A one-line message saying what is wrong, for clap to print.
    pub fn parse(text: &str) -> std::result::Result<Rate, String> {
        let usage = || format!("'{text}' is not a rate (examples: 100/1s, 20/10s, 5/500ms, 100)");
        let trimmed = text.trim();
        let (n, w) = match trimmed.split_once('/') {
            Some(parts) => parts,
            None if trimmed.parse::<u32>().is_ok() => (trimmed, "1s"),
            None => return Err(usage()),
        };
        let limit: u32 = n.trim().parse().map_err(|_| usage())?;
        let w = w.trim();
        let window = if w.starts_with(|c: char| c.is_ascii_alphabetic()) {
            parse_duration(&format!("1{w}")).map_err(|_| usage())?
        } else {
            parse_duration(w)?
        };
        let rate = Rate { limit, window };
        rate.check().map_err(|e| format!("'{text}': {e}"))?;
        Ok(rate)
    }

    /// Whether the numbers are in range.
    ///
    /// # Errors
    ///
    /// What is out of range.
    pub fn check(&self) -> std::result::Result<(), String> {
        if self.limit == 0 || self.limit > MAX_LIMIT {
            return Err(format!(
                "the number of connections must be 1..{MAX_LIMIT}, got {}",
                self.limit
            ));
        }
        if self.window < MIN_WINDOW {
            return Err(format!("the window must be at least {MIN_WINDOW:?}"));
        }
        Ok(())
    }
}

impl RateLimitReply {
    /// The name used in flags and the config file (`close`, `http`).
    pub fn name(self) -> &'static str {
        match self {
            RateLimitReply::Close => "close",
            RateLimitReply::Http => "http",
        }
    }
}

impl std::str::FromStr for RateLimitReply {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<Self, String> {
        match text {
            "close" => Ok(RateLimitReply::Close),
            "http" => Ok(RateLimitReply::Http),
            _ => Err(format!("'{text}' is not a reply (use close or http)")),
        }
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{:?}", self.limit, self.window)
    }
}

/// Everything the limiter needs; `Config::rate_limit` holds one when rate
/// limiting is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitConfig {
    /// `N` per `WINDOW`.
    pub rate: Rate,
    /// How to count. Default: fixed window.
    pub algorithm: RateLimitAlgorithm,
    /// Most clients tracked at once. Default [`DEFAULT_MAX_CLIENTS`].
    pub max_clients: usize,
    /// IPv6 clients are keyed by this many leading bits (1 to 128).
    /// Default [`DEFAULT_IPV6_PREFIX`].
    pub ipv6_prefix: u8,
    /// What a refused client gets. Default: closed at once.
    pub reply: RateLimitReply,
}

impl RateLimitConfig {
    /// `rate` with every other setting at its default.
    pub fn new(rate: Rate) -> RateLimitConfig {
        RateLimitConfig {
            rate,
            algorithm: RateLimitAlgorithm::default(),
            max_clients: DEFAULT_MAX_CLIENTS,
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
            reply: RateLimitReply::default(),
        }
    }

    /// Checks that every value is usable.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSetting`] naming the first bad setting.
    pub fn validate(&self) -> Result<()> {
        if let Err(msg) = self.rate.check() {
            return Err(Error::setting("rate_limit", msg));
        }
        if self.max_clients == 0 || self.max_clients > MAX_MAX_CLIENTS {
            return Err(Error::setting(
                "rate_limit_max_clients",
                format!("must be 1..{MAX_MAX_CLIENTS}, got {}", self.max_clients),
            ));
        }
        if self.ipv6_prefix == 0 || self.ipv6_prefix > 128 {
            return Err(Error::setting(
                "rate_limit_ipv6_prefix",
                format!("must be 1..128, got {}", self.ipv6_prefix),
            ));
        }
        Ok(())
    }
}
