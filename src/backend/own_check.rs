//! A backend's own check: where its health is asked when that is not
//! where its clients go (`check_port`, `check_address`), and the health
//! settings it sets for itself (`health_check`, `health_path`,
//! `health_interval`, `rise`, `fall`), each one left out meaning "the
//! service's".
//!
//! The Patroni (or Galera) case: the database listens on 5432, and an
//! HTTP endpoint on 8008 answers 200 on the primary and 503 on a replica;
//! `127.0.0.1:5432,check_port=8008,health_check=http,health_path=/primary`
//! sends clients to 5432 of whichever server says 200 on 8008.
//!
//! Its agent (`agent_port`, `agent_interval`, `agent_send`; HAProxy's
//! `agent-check`) is asked too: `health/agent.rs`.
//!
//! Plain values, parsed from a backend's options (string form) or its keys
//! (object form, in the config file) by the one [`OwnCheck::set`]; the
//! health thread lays them over the service's settings
//! ([`crate::health::HealthConfig::for_backend`]).
//!
//! # Threads
//!
//! Pure functions, on whatever thread parses a backend. A running backend
//! keeps its [`OwnCheck`] behind an `ArcSwap`, read by the health thread
//! once per check and replaced by a reload.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C never checks a backend. HAProxy's `server`
//! keywords `port`, `addr`, `inter`, `rise`, `fall` (with `check`), and
//! nginx Plus's `health_check port=`.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use super::check_kind::CheckKind;
use crate::units::{format_duration, parse_duration};

/// The keys of a backend's own check, in the order they are written out.
pub const KEYS: [&str; 10] = [
    "check_port",
    "check_address",
    "health_check",
    "health_path",
    "health_interval",
    "rise",
    "fall",
    "agent_port",
    "agent_interval",
    "agent_send",
];

/// Longest `agent_send`, in bytes once its escapes are read.
pub const MAX_AGENT_SEND: usize = 256;

/// Most failures (or successes) in a row a backend's `rise` or `fall` may
/// ask for: beyond it, a typo rather than a wish.
const MAX_STREAK: u32 = 1000;

/// A backend's own check settings; `None` everywhere (the default) is
/// "checked like the service says, where its clients go".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnCheck {
    /// The port checked instead of the backend's (HAProxy `port`).
    pub port: Option<u16>,
    /// The address checked instead of the backend's (HAProxy `addr`): an
    /// IP address, not a name (a name would be looked up by the health
    /// thread, and a slow resolver would hold every check back).
    pub address: Option<IpAddr>,
    /// The kind of check (`health_check`).
    pub kind: Option<CheckKind>,
    /// The path of the http check (`health_path`).
    pub path: Option<String>,
    /// Time between its checks (`health_interval`; HAProxy `inter`).
    pub interval: Option<Duration>,
    /// Passed checks in a row to come back up.
    pub rise: Option<u32>,
    /// Failed checks in a row to go down.
    pub fall: Option<u32>,
    /// The port of its agent (HAProxy `agent-port`): asked for one line
    /// (`up`, `down`, `drain`, `maint`, `ready`, `NN%`) each
    /// `agent_interval`. None: no agent.
    pub agent_port: Option<u16>,
    /// Time between two questions to its agent; default its (or the
    /// service's) `health_interval`.
    pub agent_interval: Option<Duration>,
    /// What is sent to the agent once connected (`\n`, `\r`, `\t` and
    /// `\\` read as escapes); default nothing.
    pub agent_send: Option<String>,
}

impl OwnCheck {
    /// Whether `key` is one of [`KEYS`].
    pub fn takes(key: &str) -> bool {
        KEYS.contains(&key)
    }

    /// Whether nothing is set: checked as the service says.
    pub fn is_empty(&self) -> bool {
        *self == OwnCheck::default()
    }

    /// Whether the check goes somewhere else than the clients do.
    pub fn moves(&self) -> bool {
        self.port.is_some() || self.address.is_some()
    }

    /// Where the check of a backend reached at `addr` goes.
    pub fn target(&self, addr: SocketAddr) -> SocketAddr {
        SocketAddr::new(
            self.address.unwrap_or(addr.ip()),
            self.port.unwrap_or(addr.port()),
        )
    }

    /// Sets `key` (one of [`KEYS`]) from its text, as written after the
    /// `=` of a backend's option, or as the config file's value (a number
    /// written out).
    ///
    /// # Errors
    ///
    /// One line in the operator's words: an unknown key, a bad value, or a
    /// key given twice.
    pub fn set(&mut self, key: &str, text: &str) -> Result<(), String> {
        let text = text.trim();
        let bad = |what: &str| format!("{key} must be {what}, got '{}'", clip(text));
        let given = match key {
            "check_port" => {
                let port = text.parse::<u16>().ok().filter(|p| *p != 0);
                put(&mut self.port, port.ok_or_else(|| bad("a port, 1..65535"))?)
            }
            "agent_port" | "agent_interval" | "agent_send" => self.set_agent(key, text)?,
            "check_address" => {
                let inner = text
                    .strip_prefix('[')
                    .and_then(|t| t.strip_suffix(']'))
                    .unwrap_or(text);
                let ip = inner.parse::<IpAddr>().map_err(|_| {
                    bad("an IP address such as 127.0.0.2 or ::1 \
                         (not a name, and no port: that is check_port)")
                })?;
                put(&mut self.address, ip)
            }
            "health_check" => put(&mut self.kind, text.parse::<CheckKind>()?),
            "health_path" => {
                if !usable_path(text) {
                    return Err(bad(
                        "a path starting with / and without spaces or control characters",
                    ));
                }
                put(&mut self.path, text.to_string())
            }
            "health_interval" => put(&mut self.interval, interval(key, text)?),
            "rise" | "fall" => {
                let n = text
                    .parse::<u32>()
                    .ok()
                    .filter(|n| (1..=MAX_STREAK).contains(n))
                    .ok_or_else(|| bad(&format!("a whole number from 1 to {MAX_STREAK}")))?;
                put(
                    if key == "rise" {
                        &mut self.rise
                    } else {
                        &mut self.fall
                    },
                    n,
                )
            }
            _ => {
                return Err(format!(
                    "unknown option '{}' (known: {})",
                    clip(key),
                    KEYS.join(", ")
                ))
            }
        };
        if given {
            Ok(())
        } else {
            Err(format!("{key} is given twice"))
        }
    }

    /// Sets one of the agent's keys; false when it was given already.
    fn set_agent(&mut self, key: &str, text: &str) -> Result<bool, String> {
        let bad = |what: &str| format!("{key} must be {what}, got '{}'", clip(text));
        Ok(match key {
            "agent_port" => {
                let port = text.parse::<u16>().ok().filter(|p| *p != 0);
                put(
                    &mut self.agent_port,
                    port.ok_or_else(|| bad("a port, 1..65535"))?,
                )
            }
            "agent_interval" => put(&mut self.agent_interval, interval(key, text)?),
            _ => {
                let bytes = unescape(text);
                if bytes.is_empty() || bytes.len() > MAX_AGENT_SEND {
                    return Err(bad(&format!("1 to {MAX_AGENT_SEND} bytes")));
                }
                put(&mut self.agent_send, bytes)
            }
        })
    }

    /// Sets `key` from a config file's value: a string, or a number for
    /// the ports, counts and the interval (seconds).
    ///
    /// # Errors
    ///
    /// As [`OwnCheck::set`], and for a value neither string nor number.
    pub fn set_value(&mut self, key: &str, value: &serde_json::Value) -> Result<(), String> {
        match value {
            serde_json::Value::String(text) => self.set(key, text),
            serde_json::Value::Number(n) => self.set(key, &n.to_string()),
            _ => Err(format!("{key} must be a string or a number, got {value}")),
        }
    }

    /// Reads the keys of a JSON object left over by its caller (the admin
    /// API's `POST /backends`, which took `others`), refusing any that is
    /// not one of [`KEYS`].
    ///
    /// # Errors
    ///
    /// As [`OwnCheck::set_value`], and for an unknown key.
    pub fn from_json(
        rest: &serde_json::Map<String, serde_json::Value>,
        others: &str,
    ) -> Result<OwnCheck, String> {
        let mut own = OwnCheck::default();
        for (key, value) in rest {
            if !OwnCheck::takes(key) {
                return Err(format!(
                    "unknown field `{}`, expected {others} or one of {}",
                    clip(key),
                    KEYS.join(", ")
                ));
            }
            own.set_value(key, value)?;
        }
        Ok(own)
    }
}

/// An interval option's value: a duration of more than 0.
fn interval(key: &str, text: &str) -> Result<Duration, String> {
    let interval = parse_duration(text).map_err(|e| format!("{key}: {e}"))?;
    if interval.is_zero() {
        return Err(format!("{key} must be more than 0, got '{}'", clip(text)));
    }
    Ok(interval)
}

/// Stores `value` in an empty `slot`; false when it held one already.
fn put<T>(slot: &mut Option<T>, value: T) -> bool {
    let was_empty = slot.is_none();
    *slot = Some(value);
    was_empty
}

/// `agent_send` as written, its escapes read (`\n`, `\r`, `\t`, `\\`;
/// any other backslash kept as it is).
fn unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('t') => out.push('\t'),
            Some('\\') => out.push('\\'),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

/// Whether `path` can be the http check's `GET` path (`health_path`, for
/// every backend or one): it starts with `/` and holds no space or control
/// character, which would end or break the request line.
pub fn usable_path(path: &str) -> bool {
    path.starts_with('/') && !path.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// `agent_send` written back, its escapes made again.
fn escape(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('\n', "\\n")
        .replace('\r', "\\r")
        .replace('\t', "\\t")
}

/// At most 40 characters of what an operator wrote, for an error line.
fn clip(text: &str) -> String {
    match text.char_indices().nth(40) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text.to_string(),
    }
}

/// The string form's options, each with its leading comma
/// (`,check_port=8008,rise=1`); nothing when empty. [`OwnCheck::set`]
/// parses each back.
impl fmt::Display for OwnCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(port) = self.port {
            write!(f, ",check_port={port}")?;
        }
        if let Some(ip) = self.address {
            write!(f, ",check_address={ip}")?;
        }
        if let Some(kind) = self.kind {
            write!(f, ",health_check={}", kind.name())?;
        }
        if let Some(path) = &self.path {
            write!(f, ",health_path={path}")?;
        }
        if let Some(interval) = self.interval {
            write!(f, ",health_interval={}", format_duration(interval))?;
        }
        if let Some(rise) = self.rise {
            write!(f, ",rise={rise}")?;
        }
        if let Some(fall) = self.fall {
            write!(f, ",fall={fall}")?;
        }
        if let Some(port) = self.agent_port {
            write!(f, ",agent_port={port}")?;
        }
        if let Some(interval) = self.agent_interval {
            write!(f, ",agent_interval={}", format_duration(interval))?;
        }
        if let Some(send) = &self.agent_send {
            write!(f, ",agent_send={}", escape(send))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(options: &[(&str, &str)]) -> Result<OwnCheck, String> {
        let mut own = OwnCheck::default();
        for (key, value) in options {
            own.set(key, value)?;
        }
        Ok(own)
    }

    #[test]
    fn every_key_is_parsed_and_written_back() {
        let own = parsed(&[
            ("check_port", "8008"),
            ("check_address", "[::1]"),
            ("health_check", "http"),
            ("health_path", "/primary"),
            ("health_interval", "500ms"),
            ("rise", "1"),
            ("fall", "2"),
            ("agent_port", "9999"),
            ("agent_interval", "2s"),
            ("agent_send", "hello\\r\\n"),
        ])
        .unwrap();
        assert_eq!(own.agent_port, Some(9999));
        assert_eq!(own.agent_send.as_deref(), Some("hello\r\n"));
        assert_eq!(own.port, Some(8008));
        assert_eq!(own.address, Some("::1".parse().unwrap()));
        assert_eq!(own.kind, Some(CheckKind::Http));
        assert_eq!(own.interval, Some(Duration::from_millis(500)));
        assert_eq!((own.rise, own.fall), (Some(1), Some(2)));
        let text = own.to_string();
        let back: Vec<(&str, &str)> = text
            .split(',')
            .skip(1)
            .map(|o| o.split_once('=').unwrap())
            .collect();
        assert_eq!(parsed(&back).unwrap(), own);
        assert!(OwnCheck::default().is_empty() && OwnCheck::default().to_string().is_empty());
    }

    #[test]
    fn the_target_takes_the_port_and_address_given() {
        let addr: SocketAddr = "127.0.0.1:5432".parse().unwrap();
        let port = parsed(&[("check_port", "8008")]).unwrap();
        assert!(port.moves());
        assert_eq!(port.target(addr), "127.0.0.1:8008".parse().unwrap());
        let ip = parsed(&[("check_address", "127.0.0.2")]).unwrap();
        assert_eq!(ip.target(addr), "127.0.0.2:5432".parse().unwrap());
        let kind = parsed(&[("health_check", "redis")]).unwrap();
        assert!(!kind.moves());
        assert_eq!(kind.target(addr), addr);
    }

    #[test]
    fn bad_values_are_refused_in_one_line() {
        for (key, value, words) in [
            ("check_port", "0", "1..65535"),
            ("check_port", "70000", "1..65535"),
            ("check_port", "http", "1..65535"),
            ("check_address", "db.example", "IP address"),
            ("check_address", "127.0.0.1:8008", "IP address"),
            ("health_check", "ping", "not a health check"),
            ("health_path", "health", "starting with /"),
            ("health_path", "/a\u{1b}[2J", "control characters"),
            ("health_path", "/a\u{0}", "control characters"),
            ("health_interval", "0s", "more than 0"),
            ("health_interval", "soon", "use ms, s, m or h"),
            ("rise", "0", "1 to 1000"),
            ("fall", "-1", "1 to 1000"),
            ("colour", "red", "unknown option"),
        ] {
            let err = parsed(&[(key, value)]).unwrap_err();
            assert!(err.contains(words), "{key}={value}: {err}");
            assert!(!err.contains('\n'), "{err}");
        }
        let err = parsed(&[("check_port", "1"), ("check_port", "2")]).unwrap_err();
        assert_eq!(err, "check_port is given twice");
    }

    #[test]
    fn file_values_may_be_numbers() {
        let mut own = OwnCheck::default();
        own.set_value("check_port", &serde_json::json!(8008))
            .unwrap();
        own.set_value("health_interval", &serde_json::json!(0.5))
            .unwrap();
        assert_eq!(own.interval, Some(Duration::from_millis(500)));
        let err = own.set_value("rise", &serde_json::json!(true)).unwrap_err();
        assert!(err.contains("string or a number"), "{err}");
    }
}
