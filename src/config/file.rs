//! The config file: JSON read into [`Overrides`], the layer between the
//! defaults and the flags.
//!
//! Its keys are the settings' names as [`Config::describe`] writes them
//! (`listen`, `backends`, `workers`, `connect_timeout`, ...), plus a few
//! aliases in the style of other balancers' files (`listen_port`,
//! `scheduling_algorithm`, `health_check_interval_seconds`,
//! `backend_servers`) and `mode` (`load_balancer` or `backend`). Durations
//! are strings such as `"3s"` or numbers of seconds; sizes are strings such
//! as `"64k"` or numbers of bytes; a backend is `"HOST:PORT[,weight=N]"` or
//! `{"host": ..., "port": ..., "weight": ...}`. `docs/operations.md` lists
//! every key.
//!
//! Every error is one line naming the file, the line and column, and the
//! key as the file writes it: an unknown key (with the closest known one
//! when it is near), a value of the wrong type or that does not parse, a
//! value out of range (found once the layers are merged, see
//! [`ConfigFile::settle`]), missing backends, and JSON syntax errors.
//!
//! Read on the main thread at start-up, and on the thread that asks for a
//! reload (the signal thread, an admin request); nothing here is shared.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C's settings are compiled in and its backends are
//! typed at the prompt.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::{words, Config, Overrides};
use crate::backend::BackendSpec;
use crate::error::{Error, Result};
use crate::health::protocol::parse_bytes;
use crate::health::CheckKind;
use crate::limiter::{
    FailurePolicy, Rate, RateLimitAlgorithm as RuleKind, RateLimitConfig, RateLimitReply as Reply,
    MAX_MAX_CLIENTS,
};
use crate::proxy_protocol::{CidrList, Version};
use crate::scheduler::Algorithm;
use crate::trace::Lang;
use crate::units::{parse_duration, parse_size, short_number};

/// What the process runs, the file's `mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Mode {
    /// The balancer (the default).
    #[default]
    LoadBalancer,
    /// The demo backend alone on `listen`, as `rodizio backend` runs it.
    Backend,
}

impl Mode {
    /// The name the file uses (`load_balancer`, `backend`).
    pub fn name(self) -> &'static str {
        match self {
            Mode::LoadBalancer => "load_balancer",
            Mode::Backend => "backend",
        }
    }
}

impl FromStr for Mode {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<Mode, String> {
        match text.trim().replace('-', "_").as_str() {
            "load_balancer" => Ok(Mode::LoadBalancer),
            "backend" => Ok(Mode::Backend),
            _ => Err(format!(
                "'{text}' is not a mode (use load_balancer or backend)"
            )),
        }
    }
}

/// A config file, read and checked key by key.
#[derive(Debug, Clone)]
pub struct ConfigFile {
    /// The file, as given.
    pub path: PathBuf,
    /// What the file asks the process to run.
    pub mode: Mode,
    /// The settings the file gives.
    pub overrides: Overrides,
    /// `"rate_limit": "off"` was written: the other `rate_limit_*` keys
    /// then wait for a rate limit turned on by a flag.
    rate_limit_off: bool,
    /// The settings the file gives: the setting's name, the key as written,
    /// and where it is.
    keys: Vec<Key>,
    /// Where the top-level object opens.
    start: (usize, usize),
}

/// One setting given by the file.
#[derive(Debug, Clone)]
struct Key {
    setting: &'static str,
    written: &'static str,
    position: Option<(usize, usize)>,
}

/// Reads and parses the config file at `path`.
///
/// # Errors
///
/// [`Error::ConfigFile`] when it cannot be read (naming the OS error),
/// is not a regular file, is over 1 MiB or is not UTF-8, or is not valid
/// (see [`parse`]).
pub fn load(path: &Path) -> Result<ConfigFile> {
    let text = super::read::read_capped(path).map_err(|message| Error::ConfigFile {
        path: path.to_path_buf(),
        position: None,
        message,
    })?;
    parse(path, &text)
}

/// Parses the text of a config file; `path` is for messages.
///
/// # Errors
///
/// [`Error::ConfigFile`] with the line and column of the first problem:
/// JSON syntax, an unknown key, a value of the wrong type or that does not
/// parse, a key given twice under two names.
pub fn parse(path: &Path, text: &str) -> Result<ConfigFile> {
    // A byte order mark, as some editors write, is skipped as most
    // tools skip it.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    if text.trim().is_empty() {
        return Err(Error::ConfigFile {
            path: path.to_path_buf(),
            position: None,
            message: "the file is empty: write an object of settings, \
                      e.g. {\"backends\": [\"127.0.0.1:8001\"]}"
                .into(),
        });
    }
    // serde would also read a struct from a list of its values, in field
    // order: a file is an object, nothing else.
    if let Some(first) = text.trim_start().chars().next().filter(|c| *c != '{') {
        let before = &text[..text.len() - text.trim_start().len()];
        let line = before.matches('\n').count() + 1;
        let column = before.len() - before.rfind('\n').map_or(0, |n| n + 1) + 1;
        return Err(Error::ConfigFile {
            path: path.to_path_buf(),
            position: Some((line, column)),
            message: format!(
                "expected an object of settings, found {}",
                words::shown(first)
            ),
        });
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let raw: Raw = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let at = e.path().to_string();
        json_error(path, text, &at, e.into_inner())
    })?;
    de.end().map_err(|e| json_error(path, text, ".", e))?;
    Converter::new(path, text).convert(raw)
}

impl ConfigFile {
    /// The configuration of the defaults, this file, then `flags` over
    /// both, validated except for the backends (the prompt may still fill
    /// them: see [`ConfigFile::require_backends`]).
    ///
    /// # Errors
    ///
    /// A bad value: worded as the flag when a flag gave it, as the file's
    /// key with its line and column ([`Error::ConfigFile`]) when the file
    /// did.
    pub fn settle(&self, flags: &Overrides) -> Result<Config> {
        let mut file = self.overrides.clone();
        if self.rate_limit_off && flags.rate_limit.is_none() {
            file.rate_limit_algorithm = None;
            file.rate_limit_max_clients = None;
            file.rate_limit_ipv6_prefix = None;
            file.rate_limit_reply = None;
            file.rate_limit_store = None;
            file.rate_limit_store_timeout = None;
            file.rate_limit_store_failure = None;
        }
        let mut config = Config::default();
        if let (Some(rate), None) = (flags.rate_limit, file.rate_limit) {
            // A rate limit turned on by a flag makes the file's details
            // meaningful: lay it first, so the file's `rate_limit_*` apply.
            config.rate_limit = Some(RateLimitConfig::new(rate));
        }
        if flags.backends.is_some() && file.backends.is_some() {
            let key = self.keys.iter().find(|k| k.setting == "backends");
            let (written, line) = key.map_or(("backends", None), |k| (k.written, k.position));
            let place = line.map_or(String::new(), |(l, _)| format!(" (line {l})"));
            log::warn!(
                "{}: `{written}`{place} is not used: the backends given at start-up \
                 (--backend, or typed at the prompt) win over the file's, also on reload",
                self.path.display()
            );
        }
        let blame = |e| self.attribute(e, flags);
        file.apply(&mut config).map_err(blame)?;
        flags.apply(&mut config).map_err(blame)?;
        config.validate_settings().map_err(blame)?;
        Ok(config)
    }

    /// Checks that `config` (from [`ConfigFile::settle`]) has backends.
    ///
    /// # Errors
    ///
    /// [`Error::ConfigFile`] when neither the file nor a flag named one.
    pub fn require_backends(&self, config: &Config) -> Result<()> {
        if config.backends.is_empty() {
            return Err(Error::ConfigFile {
                path: self.path.clone(),
                position: Some(self.start),
                message: "no backends: list them under `backends` (or `backend_servers`)".into(),
            });
        }
        Ok(())
    }

    /// An error about `setting` as this file gives it: its key as written
    /// and where it is (for errors found later, such as a backend that
    /// does not resolve).
    pub fn error_at(&self, setting: &str, message: impl fmt::Display) -> Error {
        let key = self.keys.iter().find(|k| k.setting == setting);
        Error::ConfigFile {
            path: self.path.clone(),
            position: key.and_then(|k| k.position),
            message: format!("`{}`: {message}", key.map_or(setting, |k| k.written)),
        }
    }

    /// The names of the settings this file gives.
    pub fn given(&self) -> Vec<&'static str> {
        self.keys.iter().map(|k| k.setting).collect()
    }

    /// Words a validation error as the layer that gave the bad value.
    fn attribute(&self, err: Error, flags: &Overrides) -> Error {
        let Error::InvalidSetting { setting, message } = err else {
            return err;
        };
        if flags.given().contains(&setting.as_str()) {
            return Error::setting(setting, message).worded_as_flag();
        }
        if let Some(key) = self.keys.iter().find(|k| k.setting == setting) {
            return Error::ConfigFile {
                path: self.path.clone(),
                position: key.position,
                message: format!("`{}` {message}", key.written),
            };
        }
        // Missing here, but asked for by another setting the message names
        // (`health_expect` ... with `health_check` send-expect): that one's
        // place, in this file or on the command line.
        let named: Vec<&str> = message.split('`').skip(1).step_by(2).collect();
        if let Some(key) = self.keys.iter().find(|k| named.contains(&k.setting)) {
            return Error::ConfigFile {
                path: self.path.clone(),
                position: key.position,
                message: format!("`{setting}` {message}"),
            };
        }
        if named.iter().any(|n| flags.given().contains(n)) {
            return Error::setting(setting, message).worded_as_flag();
        }
        Error::ConfigFile {
            path: self.path.clone(),
            position: None,
            message: format!("`{setting}` {message}"),
        }
    }
}

/// The file as serde reads it: one field per key, aliases included.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "an object of settings")]
struct Raw {
    mode: Option<Parsed<Mode>>,
    listen: Option<Listen>,
    listen_port: Option<Whole<u16, 0, 65535>>,
    backends: Option<Backends>,
    backend_servers: Option<Backends>,
    algorithm: Option<Parsed<Algorithm>>,
    scheduling_algorithm: Option<Parsed<Algorithm>>,
    workers: Option<Whole<usize, 1, { super::MAX_WORKERS as u64 }>>,
    thread_stack: Option<Size>,
    queue_capacity: Option<Whole<usize, 1, { usize::MAX as u64 }>>,
    worker_idle_timeout: Option<MaybeSecs>,
    backlog: Option<Whole<i32, 1, { i32::MAX as u64 }>>,
    buffer_size: Option<Size>,
    connect_timeout: Option<Secs>,
    idle_timeout: Option<Secs>,
    drain_timeout: Option<Secs>,
    splice: Option<bool>,
    defer_accept: Option<bool>,
    yield_before_poll: Option<bool>,
    health_check: Option<Parsed<CheckKind>>,
    health_interval: Option<Secs>,
    health_check_interval_seconds: Option<Secs>,
    health_timeout: Option<Secs>,
    health_path: Option<String>,
    fall: Option<Whole<u32, 1, { u32::MAX as u64 }>>,
    rise: Option<Whole<u32, 1, { u32::MAX as u64 }>>,
    passive_failures: Option<Whole<u32, 0, { u32::MAX as u64 }>>,
    health_cooldown: Option<Secs>,
    http_replies: Option<bool>,
    rate_limit: Option<RateSetting>,
    rate_limit_algorithm: Option<Parsed<RuleKind>>,
    rate_limit_max_clients: Option<Whole<usize, 1, { MAX_MAX_CLIENTS as u64 }>>,
    rate_limit_ipv6_prefix: Option<Whole<u8, 1, 128>>,
    rate_limit_reply: Option<Parsed<Reply>>,
    health_user: Option<Text>,
    health_send: Option<Bytes>,
    health_expect: Option<Bytes>,
    trace: Option<bool>,
    trace_lang: Option<Parsed<Lang>>,
    admin_listen: Option<MaybeAddr>,
    admin_allow_remote: Option<bool>,
    admin_token_file: Option<Text>,
    queue_timeout: Option<Secs>,
    client_first_byte_timeout: Option<MaybeSecs>,
    fin_timeout: Option<MaybeSecs>,
    tcp_keepalive: Option<MaybeSecs>,
    send_proxy: Option<MaybeParsed<Version>>,
    accept_proxy: Option<bool>,
    accept_proxy_from: Option<Parsed<CidrList>>,
    accept_proxy_timeout: Option<Secs>,
    rate_limit_store: Option<Store>,
    rate_limit_store_timeout: Option<Secs>,
    rate_limit_store_failure: Option<Parsed<FailurePolicy>>,
    reuse_port: Option<bool>,
    access_log: Option<MaybeParsed<crate::access_log::Format>>,
    access_log_file: Option<Text>,
}

/// Turns a [`Raw`] into a [`ConfigFile`], noting where each key is.
struct Converter<'a> {
    path: &'a Path,
    text: &'a str,
    keys: Vec<Key>,
}

impl<'a> Converter<'a> {
    fn new(path: &'a Path, text: &'a str) -> Self {
        Converter {
            path,
            text,
            keys: Vec::new(),
        }
    }

    /// Notes that the file gave `setting` under the key `written`.
    fn note(&mut self, setting: &'static str, written: &'static str) {
        let position = key_position(self.text, written);
        self.keys.push(Key {
            setting,
            written,
            position,
        });
    }

    fn error(&self, key: &str, message: String) -> Error {
        Error::ConfigFile {
            path: self.path.to_path_buf(),
            position: key_position(self.text, key),
            message,
        }
    }

    /// The value of a setting that has two names; an error if both are
    /// written.
    fn either<T>(
        &mut self,
        setting: &'static str,
        (first, a): (&'static str, Option<T>),
        (second, b): (&'static str, Option<T>),
    ) -> Result<Option<T>> {
        match (a, b) {
            (Some(_), Some(_)) => Err(self.error(
                second,
                format!("`{second}` and `{first}` are the same setting: write only one"),
            )),
            (Some(v), None) => {
                self.note(setting, first);
                Ok(Some(v))
            }
            (None, Some(v)) => {
                self.note(setting, second);
                Ok(Some(v))
            }
            (None, None) => Ok(None),
        }
    }

    fn convert(mut self, raw: Raw) -> Result<ConfigFile> {
        let mut o = Overrides::default();
        macro_rules! take {
            ($($field:ident $(. $inner:tt)?),* $(,)?) => {$(
                if let Some(v) = raw.$field {
                    o.$field = Some(v $(. $inner)?);
                    self.note(stringify!($field), stringify!($field));
                }
            )*};
        }
        take!(
            workers.0,
            thread_stack.0,
            queue_capacity.0,
            backlog.0,
            buffer_size.0,
            connect_timeout.0,
            idle_timeout.0,
            drain_timeout.0,
            splice,
            yield_before_poll,
            defer_accept,
            health_check.0,
            health_timeout.0,
            health_path,
            fall.0,
            rise.0,
            passive_failures.0,
            health_cooldown.0,
            http_replies,
            rate_limit_algorithm.0,
            rate_limit_max_clients.0,
            rate_limit_ipv6_prefix.0,
            rate_limit_reply.0,
            trace,
            trace_lang.0,
            admin_allow_remote,
            queue_timeout.0,
            accept_proxy,
            accept_proxy_from.0,
            accept_proxy_timeout.0,
            rate_limit_store_timeout.0,
            rate_limit_store_failure.0,
            reuse_port,
        );
        // Settings that are off unless given: a word such as "off" in the
        // file is the same as leaving the key out.
        macro_rules! maybe {
            ($($field:ident),* $(,)?) => {$(
                if let Some(v) = raw.$field {
                    if let Some(v) = v.0 {
                        o.$field = Some(v.into());
                    }
                    self.note(stringify!($field), stringify!($field));
                }
            )*};
        }
        maybe!(
            admin_listen,
            admin_token_file,
            client_first_byte_timeout,
            fin_timeout,
            tcp_keepalive,
            send_proxy,
            rate_limit_store,
            access_log,
        );
        // On by default: "off" is a value here, not the key left out.
        if let Some(MaybeSecs(idle)) = raw.worker_idle_timeout {
            o.worker_idle_timeout = Some(idle);
            self.note("worker_idle_timeout", "worker_idle_timeout");
        }
        if let Some(Text(path)) = raw.access_log_file {
            if let Some(path) = path.filter(|p| p != "stdout") {
                o.access_log_file = Some(path.into());
            }
            self.note("access_log_file", "access_log_file");
        }
        // An empty string is "none", as `Config::describe` prints it.
        if let Some(Text(user)) = raw.health_user {
            o.health_user = user;
            self.note("health_user", "health_user");
        }
        if let Some(Bytes(send)) = raw.health_send {
            o.health_send = send;
            self.note("health_send", "health_send");
        }
        if let Some(Bytes(expect)) = raw.health_expect {
            o.health_expect = expect;
            self.note("health_expect", "health_expect");
        }
        if let Some(Listen(listen)) = raw.listen {
            o.listen = Some(listen);
            self.note("listen", "listen");
        }
        if let Some(Whole(port)) = raw.listen_port {
            let ip = o.listen.unwrap_or(Config::default().listen).ip();
            o.listen = Some(SocketAddr::new(ip, port));
            if raw.listen.is_none() {
                self.note("listen", "listen_port");
            }
        }
        let backends = self.either(
            "backends",
            ("backends", raw.backends),
            ("backend_servers", raw.backend_servers),
        )?;
        if let Some(Backends(list)) = backends {
            if list.is_empty() {
                let key = self.keys.last().map_or("backends", |k| k.written);
                return Err(self.error(key, format!("`{key}` is empty: name at least one backend")));
            }
            o.backends = Some(list);
        }
        o.algorithm = self
            .either(
                "algorithm",
                ("algorithm", raw.algorithm),
                ("scheduling_algorithm", raw.scheduling_algorithm),
            )?
            .map(|p| p.0);
        o.health_interval = self
            .either(
                "health_interval",
                ("health_interval", raw.health_interval),
                (
                    "health_check_interval_seconds",
                    raw.health_check_interval_seconds,
                ),
            )?
            .map(|s| s.0);
        let mut rate_limit_off = false;
        match raw.rate_limit {
            Some(RateSetting(Some(rate))) => o.rate_limit = Some(rate),
            Some(RateSetting(None)) => rate_limit_off = true,
            None => {}
        }
        if raw.rate_limit.is_some() {
            self.note("rate_limit", "rate_limit");
        }
        let mode = raw.mode.map_or(Mode::default(), |m| m.0);
        Ok(ConfigFile {
            path: self.path.to_path_buf(),
            mode,
            overrides: o,
            rate_limit_off,
            keys: self.keys,
            start: object_start(self.text),
        })
    }
}

/// Turns serde's error into one line with the line, column and key.
fn json_error(path: &Path, text: &str, at: &str, inner: serde_json::Error) -> Error {
    let (line, column) = (inner.line(), inner.column());
    let full = inner.to_string();
    let suffix = format!(" at line {line} column {column}");
    let bare = full.strip_suffix(&suffix).unwrap_or(&full).to_string();
    let message = match inner.classify() {
        serde_json::error::Category::Syntax if bare == "recursion limit exceeded" => {
            "JSON nested too deeply (at most 128 levels of [ and {)".to_string()
        }
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
            format!("JSON syntax error: {bare}")
        }
        serde_json::error::Category::Io => format!("cannot be read: {bare}"),
        serde_json::error::Category::Data => match bare.strip_prefix("unknown field ") {
            Some(rest) => unknown_key(at, rest),
            None if bare.starts_with("duplicate field ") => {
                let key = bare.split('`').nth(1).unwrap_or_default();
                format!("`{key}` is written twice: keep one")
            }
            None if at == "." || at.is_empty() => bare,
            None => format!("`{at}`: {bare}"),
        },
    };
    let position = if line == 0 {
        // Errors raised outside the parser (none today) carry no place.
        key_position(text, at)
    } else {
        Some((line, column))
    };
    Error::ConfigFile {
        path: path.to_path_buf(),
        position,
        message: words::clip(&words::in_words(&message)),
    }
}

/// `unknown key `x` (did you mean `y`?)` from serde's "`x`, expected one
/// of `a`, `b`" (`rest`), where `at` is the path serde was at.
fn unknown_key(at: &str, rest: &str) -> String {
    // Between backquotes: the unknown key first, then the known ones.
    let quoted: Vec<&str> = rest.split('`').skip(1).step_by(2).collect();
    let Some((key, known)) = quoted.split_first() else {
        return format!("unknown key {rest}");
    };
    let full = if at == "." || at.is_empty() || at == *key {
        key.to_string()
    } else if at.ends_with(&format!(".{key}")) {
        at.to_string()
    } else {
        format!("{at}.{key}")
    };
    match closest(key, known) {
        Some(near) => format!("unknown key `{full}` (did you mean `{near}`?)"),
        None => format!("unknown key `{full}`"),
    }
}

/// The known key nearest to `key`, if it is near enough to be a typo: at
/// most two edits, or a quarter of the key's length for long keys.
fn closest<'a>(key: &str, known: &[&'a str]) -> Option<&'a str> {
    let length = key.chars().count();
    if length > 64 {
        // No known key is that long, and the distance costs its length
        // times theirs: a key of a megabyte would take seconds.
        return None;
    }
    let limit = 2.max(length / 4);
    known
        .iter()
        .map(|k| (edit_distance(key, k), *k))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance: insertions, deletions and substitutions.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// Where `"key":` is written in `text`, as (line, column) from 1.
fn key_position(text: &str, key: &str) -> Option<(usize, usize)> {
    let quoted = format!("\"{key}\"");
    for (n, line) in text.lines().enumerate() {
        let mut from = 0;
        while let Some(found) = line[from..].find(&quoted) {
            let at = from + found;
            let after = line[at + quoted.len()..].trim_start();
            if after.starts_with(':') {
                return Some((n + 1, line[..at].chars().count() + 1));
            }
            from = at + quoted.len();
        }
    }
    None
}

/// Where the first `{` is, as (line, column) from 1; (1, 1) if none.
fn object_start(text: &str) -> (usize, usize) {
    text.lines()
        .enumerate()
        .find_map(|(n, line)| line.find('{').map(|at| (n + 1, at + 1)))
        .unwrap_or((1, 1))
}

/// A value written as a string and parsed with `FromStr`.
#[derive(Debug)]
struct Parsed<T>(T);

impl<'de, T> Deserialize<'de> for Parsed<T>
where
    T: FromStr,
    T::Err: fmt::Display,
{
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map(Parsed).map_err(de::Error::custom)
    }
}

/// A duration: `"500ms"`, `"3s"`, or a number of seconds.
#[derive(Debug)]
struct Secs(Duration);

impl<'de> Deserialize<'de> for Secs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Secs;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration such as \"3s\" or \"500ms\", or a number of seconds")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Secs, E> {
                parse_duration(v).map(Secs).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<Secs, E> {
                if v > 1_000_000_000 {
                    return Err(E::custom(format!("{v} seconds is too long")));
                }
                Ok(Secs(Duration::from_secs(v)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<Secs, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::custom(format!("{v}: a duration cannot be negative"))),
                }
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<Secs, E> {
                if !(0.0..=1e9).contains(&v) {
                    return Err(E::custom(format!(
                        "{} is not a duration in seconds (0 to 1000000000)",
                        short_number(v)
                    )));
                }
                Ok(Secs(Duration::from_secs_f64(v)))
            }
        }
        d.deserialize_any(V)
    }
}

/// Words that mean "not set" for a setting that is off unless given, as
/// `Config::describe` prints them.
const NONE_WORDS: [&str; 4] = ["off", "none", "same as idle_timeout", ""];

/// A duration, or one of [`NONE_WORDS`] (none).
#[derive(Debug)]
struct MaybeSecs(Option<Duration>);

impl<'de> Deserialize<'de> for MaybeSecs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(d)?;
        if value.as_str().is_some_and(|t| NONE_WORDS.contains(&t)) {
            return Ok(MaybeSecs(None));
        }
        Secs::deserialize(value)
            .map(|s| MaybeSecs(Some(s.0)))
            .map_err(de::Error::custom)
    }
}

/// A value parsed with `FromStr`, or one of [`NONE_WORDS`] (none).
#[derive(Debug)]
struct MaybeParsed<T>(Option<T>);

impl<'de, T> Deserialize<'de> for MaybeParsed<T>
where
    T: FromStr,
    T::Err: fmt::Display,
{
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        if NONE_WORDS.contains(&text.as_str()) {
            return Ok(MaybeParsed(None));
        }
        text.parse()
            .map(|v| MaybeParsed(Some(v)))
            .map_err(de::Error::custom)
    }
}

/// `rate_limit_store`: a `redis://` URL, or `"in-process"` (the default,
/// as `check-config` prints it) or one of [`NONE_WORDS`].
#[derive(Debug)]
struct Store(Option<String>);

impl<'de> Deserialize<'de> for Store {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        if text == "in-process" || NONE_WORDS.contains(&text.as_str()) {
            return Ok(Store(None));
        }
        Ok(Store(Some(text)))
    }
}

/// An address (`"127.0.0.1:9090"`), or one of [`NONE_WORDS`] (none).
#[derive(Debug)]
struct MaybeAddr(Option<SocketAddr>);

impl<'de> Deserialize<'de> for MaybeAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        if NONE_WORDS.contains(&text.as_str()) {
            return Ok(MaybeAddr(None));
        }
        super::parse_listen(&text)
            .map(|a| MaybeAddr(Some(a)))
            .map_err(de::Error::custom)
    }
}

/// `listen`: parsed and refused in the words of `--listen`.
#[derive(Debug)]
struct Listen(SocketAddr);

impl<'de> Deserialize<'de> for Listen {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        super::parse_listen(&text)
            .map(Listen)
            .map_err(de::Error::custom)
    }
}

/// A whole number up to `HI` (which fits `T`), refused in words ("a
/// whole number from 1 to 65536") rather than as serde names the Rust
/// type it is read into. `LO` is for the words only: a value under it
/// is the validation's to refuse, at the key, as for the flags.
#[derive(Debug)]
struct Whole<T, const LO: u64, const HI: u64>(T);

impl<'de, T: TryFrom<u64>, const LO: u64, const HI: u64> Deserialize<'de> for Whole<T, LO, HI> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V<T, const LO: u64, const HI: u64>(std::marker::PhantomData<T>);
        impl<T: TryFrom<u64>, const LO: u64, const HI: u64> Visitor<'_> for V<T, LO, HI> {
            type Value = Whole<T, LO, HI>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "a whole number from {LO} to {HI}")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<Self::Value, E> {
                match T::try_from(v) {
                    Ok(n) if v <= HI => Ok(Whole(n)),
                    _ => Err(E::custom(format!(
                        "expected a whole number from {LO} to {HI}, got {v}"
                    ))),
                }
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<Self::Value, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::custom(format!(
                        "expected a whole number from {LO} to {HI}, got {v}"
                    ))),
                }
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<Self::Value, E> {
                Err(E::custom(format!(
                    "expected a whole number from {LO} to {HI}, got {}",
                    short_number(v)
                )))
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// A size in bytes: `"64k"`, `"1m"`, or a number.
#[derive(Debug)]
struct Size(usize);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Size;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a size such as \"64k\", or a number of bytes")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Size, E> {
                parse_size(v).map(Size).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<Size, E> {
                usize::try_from(v)
                    .map(Size)
                    .map_err(|_| E::custom(format!("{v} is too large")))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<Size, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::custom(format!("{v}: a size cannot be negative"))),
                }
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<Size, E> {
                Err(E::custom(format!(
                    "{} is not a size: write a whole number of bytes, or \"64k\"",
                    short_number(v)
                )))
            }
        }
        d.deserialize_any(V)
    }
}

/// A string where empty means none (`health_user`).
#[derive(Debug)]
struct Text(Option<String>);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Ok(Text((!text.is_empty() && text != "none").then_some(text)))
    }
}

/// Bytes in the notation of `--health-send` (`"PING\r\n"`, `"hex:0d0a"`);
/// empty means none.
#[derive(Debug)]
struct Bytes(Option<Vec<u8>>);

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        if text.is_empty() {
            return Ok(Bytes(None));
        }
        parse_bytes(&text)
            .map(|b| Bytes(Some(b)))
            .map_err(de::Error::custom)
    }
}

/// `rate_limit`: `"N/WINDOW"`, or `"off"` (`None`).
#[derive(Debug)]
struct RateSetting(Option<Rate>);

impl<'de> Deserialize<'de> for RateSetting {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        if text.trim() == "off" {
            return Ok(RateSetting(None));
        }
        Rate::parse(&text)
            .map(|r| RateSetting(Some(r)))
            .map_err(de::Error::custom)
    }
}

/// The backend list: strings or objects.
#[derive(Debug)]
struct Backends(Vec<BackendSpec>);

impl<'de> Deserialize<'de> for Backends {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Backends;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of backends")
            }
            fn visit_seq<A: SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<Backends, A::Error> {
                let mut list = Vec::new();
                while let Some(Entry(spec)) = seq.next_element()? {
                    list.push(spec);
                }
                Ok(Backends(list))
            }
        }
        d.deserialize_seq(V)
    }
}

/// One backend: `"HOST:PORT[,weight=N]"` or `{"host", "port", "weight"}`.
struct Entry(BackendSpec);

/// The keys of a backend written as an object.
const ENTRY_KEYS: &[&str] = &["host", "port", "weight", "send_proxy"];

impl<'de> Deserialize<'de> for Entry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Entry;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a backend: \"HOST:PORT[,weight=N]\" or {\"host\": ..., \"port\": ...}")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Entry, E> {
                BackendSpec::parse(v).map(Entry).map_err(|e| match e {
                    Error::InvalidBackend(msg) => E::custom(msg),
                    other => E::custom(other),
                })
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Entry, A::Error> {
                let mut host = None::<String>;
                let mut port = None::<Whole<u16, 1, 65535>>;
                let mut weight = None::<Whole<u32, 1, 1000>>;
                let mut send_proxy = None;
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "host" => host = Some(map.next_value()?),
                        "port" => port = Some(map.next_value()?),
                        "weight" => weight = Some(map.next_value()?),
                        "send_proxy" => {
                            let text: String = map.next_value()?;
                            send_proxy = match text.as_str() {
                                "off" | "none" | "" => None,
                                _ => Some(text.parse().map_err(de::Error::custom)?),
                            };
                        }
                        other => return Err(de::Error::unknown_field(other, ENTRY_KEYS)),
                    }
                }
                let host = host.ok_or_else(|| de::Error::missing_field("host"))?;
                let port = port.ok_or_else(|| de::Error::missing_field("port"))?.0;
                let host = entry_host(&host).map_err(de::Error::custom)?;
                let weight = weight.map_or(1, |w| w.0);
                // `Whole` leaves the lower bound to the caller.
                if port == 0 {
                    return Err(de::Error::custom("port must be 1..65535, got 0"));
                }
                if weight == 0 {
                    return Err(de::Error::custom("weight must be 1..1000, got 0"));
                }
                Ok(Entry(BackendSpec {
                    host,
                    port,
                    weight,
                    send_proxy,
                }))
            }
        }
        d.deserialize_any(V)
    }
}

/// The `host` of a backend object: a name or an IP address; an IPv6
/// address may come in brackets, as in `"[::1]:8001"`.
fn entry_host(text: &str) -> std::result::Result<String, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("the host is empty".into());
    }
    let inner = text
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or(text);
    let is_ipv6 = inner.parse::<std::net::Ipv6Addr>().is_ok();
    if !is_ipv6 && inner.contains([':', '[', ']']) {
        return Err(format!(
            "host '{text}' is neither a name nor an IP address \
             (an IPv6 address is written \"::1\" or \"[::1]\"; the port goes in \"port\")"
        ));
    }
    Ok(inner.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_text(text: &str) -> Result<ConfigFile> {
        parse(Path::new("test.json"), text)
    }

    fn error_of(text: &str) -> String {
        let err = parse_text(text)
            .and_then(|f| {
                let c = f.settle(&Overrides::default())?;
                f.require_backends(&c)
            })
            .expect_err("should be refused");
        assert!(err.is_usage(), "{err}");
        let line = err.to_string();
        assert!(!line.contains('\n'), "{line}");
        line
    }

    #[test]
    fn the_seed_style_example_is_read_as_written() {
        let f = parse_text(
            r#"{ "mode": "load_balancer", "listen_port": 8080, "scheduling_algorithm": "least_connections",
                 "health_check_interval_seconds": 5,
                 "backend_servers": [ { "host": "127.0.0.1", "port": 8081 }, { "host": "127.0.0.1", "port": 8082 } ] }"#,
        )
        .unwrap();
        assert_eq!(f.mode, Mode::LoadBalancer);
        let c = f.settle(&Overrides::default()).unwrap();
        assert_eq!(c.listen, "0.0.0.0:8080".parse().unwrap());
        assert_eq!(c.algorithm, Algorithm::LeastConnections);
        assert_eq!(c.health.interval, Duration::from_secs(5));
        let names: Vec<String> = c.backends.iter().map(|b| b.to_string()).collect();
        assert_eq!(names, ["127.0.0.1:8081", "127.0.0.1:8082"]);
        let given = f.given();
        for k in ["listen", "algorithm", "health_interval", "backends"] {
            assert!(given.contains(&k), "{k}");
        }
    }

    #[test]
    fn every_key_in_its_own_name() {
        let f = parse_text(
            r#"{
              "listen": "127.0.0.1:9000", "backends": ["127.0.0.1:8001", "127.0.0.1:8002,weight=3",
                 {"host": "::1", "port": 8003, "weight": 2}],
              "algorithm": "weighted-round-robin", "workers": 8, "thread_stack": "128k",
              "queue_capacity": 10, "backlog": 16, "buffer_size": 16384,
              "connect_timeout": "500ms", "idle_timeout": 60, "drain_timeout": 1.5,
              "splice": true, "defer_accept": true, "yield_before_poll": true,
              "health_check": "http", "health_interval": "1s", "health_timeout": "200ms",
              "health_path": "/ok", "fall": 4, "rise": 5, "passive_failures": 0,
              "health_cooldown": "2s", "http_replies": true,
              "rate_limit": "20/10s", "rate_limit_algorithm": "token_bucket",
              "rate_limit_max_clients": 1000, "rate_limit_ipv6_prefix": 48,
              "rate_limit_reply": "http",
              "health_user": "monitor", "health_send": "PING\\r\\n", "health_expect": "hex:2b504f4e47",
              "trace": true, "trace_lang": "pt"
            }"#,
        )
        .unwrap();
        let c = f.settle(&Overrides::default()).unwrap();
        c.validate().unwrap();
        assert_eq!(c.listen, "127.0.0.1:9000".parse().unwrap());
        assert_eq!(c.backends.len(), 3);
        assert_eq!(c.backends[1].weight, 3);
        assert_eq!(c.backends[2].name(), "[::1]:8003");
        assert_eq!(c.backends[2].weight, 2);
        assert_eq!(c.algorithm, Algorithm::WeightedRoundRobin);
        assert_eq!((c.workers, c.thread_stack), (8, 128 * 1024));
        assert_eq!((c.queue_capacity, c.backlog), (10, 16));
        assert_eq!(c.proxy.buffer_size, 16384);
        assert_eq!(c.proxy.connect_timeout, Duration::from_millis(500));
        assert_eq!(c.proxy.idle_timeout, Duration::from_secs(60));
        assert_eq!(c.drain_timeout, Duration::from_millis(1500));
        assert!(c.proxy.splice && c.defer_accept && c.proxy.yield_before_poll);
        let h = &c.health;
        assert_eq!(h.check, CheckKind::Http);
        assert_eq!(h.interval, Duration::from_secs(1));
        assert_eq!(h.timeout, Duration::from_millis(200));
        assert_eq!(h.path, "/ok");
        assert_eq!((h.fall, h.rise, h.passive_failures), (4, 5, 0));
        assert_eq!(h.cooldown, Duration::from_secs(2));
        assert!(h.http_replies);
        let r = c.rate_limit.unwrap();
        assert_eq!(r.rate, Rate::parse("20/10s").unwrap());
        assert_eq!(r.algorithm, RuleKind::TokenBucket);
        assert_eq!((r.max_clients, r.ipv6_prefix), (1000, 48));
        assert_eq!(r.reply, Reply::Http);
        assert_eq!(h.user.as_deref(), Some("monitor"));
        assert_eq!(h.send.as_deref(), Some(&b"PING\r\n"[..]));
        assert_eq!(h.expect.as_deref(), Some(&b"+PONG"[..]));
        assert!(c.trace);
        assert_eq!(c.trace_lang, Lang::Pt);
    }

    #[test]
    fn what_describe_prints_reads_back() {
        let c = Config {
            backends: vec![BackendSpec::parse("127.0.0.1:8001,weight=2").unwrap()],
            rate_limit: Some(RateLimitConfig::new(Rate::parse("100/1s").unwrap())),
            ..Config::default()
        };
        let mut text = String::from("{");
        for (i, (key, value)) in c.describe().into_iter().enumerate() {
            if i > 0 {
                text.push(',');
            }
            let value = match key {
                "backends" => format!("[\"{value}\"]"),
                "workers"
                | "queue_capacity"
                | "backlog"
                | "fall"
                | "rise"
                | "passive_failures"
                | "rate_limit_max_clients"
                | "rate_limit_ipv6_prefix"
                | "splice"
                | "defer_accept"
                | "yield_before_poll"
                | "http_replies"
                | "trace"
                | "admin_allow_remote"
                | "accept_proxy"
                | "reuse_port" => value,
                _ => format!("\"{value}\""),
            };
            text.push_str(&format!("\"{key}\": {value}"));
        }
        text.push('}');
        let back = parse_text(&text).unwrap();
        assert_eq!(back.settle(&Overrides::default()).unwrap(), c);
    }

    #[test]
    fn flags_win_over_the_file_and_the_file_over_the_defaults() {
        let f = parse_text(r#"{"listen_port": 9000, "workers": 8, "fall": 7}"#).unwrap();
        let flags = Overrides {
            workers: Some(16),
            ..Overrides::default()
        };
        let c = f.settle(&flags).unwrap();
        assert_eq!(c.workers, 16);
        assert_eq!(c.health.fall, 7);
        assert_eq!(c.listen, "0.0.0.0:9000".parse().unwrap());
        assert_eq!(c.thread_stack, Config::default().thread_stack);
        // listen_port keeps the address of listen.
        let f = parse_text(r#"{"listen": "127.0.0.1:1", "listen_port": 9001}"#).unwrap();
        let c = f.settle(&Overrides::default()).unwrap();
        assert_eq!(c.listen, "127.0.0.1:9001".parse().unwrap());
    }

    #[test]
    fn rate_limit_off_keeps_its_details_for_a_flag() {
        let text = r#"{"rate_limit": "off", "rate_limit_reply": "http"}"#;
        let f = parse_text(text).unwrap();
        assert_eq!(f.settle(&Overrides::default()).unwrap().rate_limit, None);
        let flags = Overrides {
            rate_limit: Some(Rate::parse("5/1s").unwrap()),
            ..Overrides::default()
        };
        let r = f.settle(&flags).unwrap().rate_limit.unwrap();
        assert_eq!(r.reply, Reply::Http);
        // A detail without any rate limit is still refused, at its key.
        let line = error_of("{\n\"rate_limit_reply\": \"http\"}");
        assert!(
            line.contains("line 2, column 1: `rate_limit_reply` needs `rate_limit`"),
            "{line}"
        );
    }

    #[test]
    fn an_unknown_key_is_named_with_the_closest_known_one() {
        let line = error_of("{\n  \"listne\": \"0.0.0.0:1\"\n}");
        assert!(line.starts_with("test.json: line 2, column"), "{line}");
        assert!(
            line.contains("unknown key `listne` (did you mean `listen`?)"),
            "{line}"
        );
        let line = error_of(r#"{"nothing_like_it": 1}"#);
        assert!(line.contains("unknown key `nothing_like_it`"), "{line}");
        assert!(!line.contains("did you mean"), "{line}");
        let line = error_of(r#"{"backends": [{"hots": "a", "port": 1}]}"#);
        assert!(
            line.contains("unknown key `backends[0].hots` (did you mean `host`?)"),
            "{line}"
        );
    }

    #[test]
    fn a_wrong_type_names_the_key_and_where() {
        let line = error_of("{\n  \"workers\": \"many\"\n}");
        assert!(line.contains("line 2, column"), "{line}");
        assert!(
            line.contains("`workers`: invalid type: string \"many\""),
            "{line}"
        );
        let line = error_of(r#"{"backends": [{"host": "a", "port": "x"}]}"#);
        assert!(line.contains("`backends[0].port`: invalid type"), "{line}");
        let line = error_of("[1, 2]");
        assert!(line.contains("expected an object of settings"), "{line}");
    }

    #[test]
    fn a_bad_value_names_the_key_not_the_flag() {
        let line = error_of("{\"backends\": [\"127.0.0.1:1\"],\n \"workers\": 0}");
        assert_eq!(
            line,
            "test.json: line 2, column 2: `workers` must be 1..65536, got 0"
        );
        assert!(!line.contains("--"), "{line}");
        let line = error_of(r#"{"connect_timeout": "3 parsecs"}"#);
        assert!(line.contains("`connect_timeout`: '3 parsecs'"), "{line}");
        let line = error_of(r#"{"backends": ["nope"]}"#);
        assert!(
            line.contains("`backends[0]`: 'nope': expected HOST:PORT"),
            "{line}"
        );
        let line = error_of(r#"{"algorithm": "random"}"#);
        assert!(line.contains("is not an algorithm"), "{line}");
        let line =
            error_of("{\"backends\": [\"127.0.0.1:1\"],\n\"health_check_interval_seconds\": 0}");
        assert!(
            line.contains("line 2, column 1: `health_check_interval_seconds` must be at least 1ms"),
            "{line}"
        );
        let line = error_of(r#"{"backends": ["a:1"], "backend_servers": ["b:2"]}"#);
        assert!(
            line.contains("`backend_servers` and `backends` are the same"),
            "{line}"
        );
    }

    #[test]
    fn a_flag_that_gives_the_bad_value_is_worded_as_the_flag() {
        let f = parse_text(r#"{"workers": 8}"#).unwrap();
        let flags = Overrides {
            workers: Some(0),
            ..Overrides::default()
        };
        let line = f.settle(&flags).unwrap_err().to_string();
        assert!(line.contains("--workers must be 1..65536"), "{line}");
    }

    #[test]
    fn missing_backends_is_an_error_of_the_file() {
        let line = error_of("\n  {\"workers\": 4}");
        assert!(line.contains("line 2, column 3: no backends"), "{line}");
        let line = error_of(r#"{"backends": []}"#);
        assert!(line.contains("`backends` is empty"), "{line}");
    }

    #[test]
    fn a_syntax_error_has_its_line_and_column() {
        let line = error_of("{\n  \"workers\": 4,\n}");
        assert!(
            line.starts_with("test.json: line 3, column 1: JSON syntax error: trailing comma"),
            "{line}"
        );
        let line = error_of("{\"workers\": 4} extra");
        assert!(
            line.contains("JSON syntax error: trailing characters"),
            "{line}"
        );
        let line = error_of("");
        assert!(line.contains("the file is empty"), "{line}");
    }

    #[test]
    fn an_unreadable_file_names_the_file_and_the_os_error() {
        let err = load(Path::new("/nonexistent/rodizio.json")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "/nonexistent/rodizio.json: cannot be read: No such file or directory (os error 2)"
        );
        assert!(err.is_usage());
    }

    /// serde's words for Rust types become the operator's, as the admin
    /// API's bodies show them too.
    #[test]
    fn rust_type_names_are_put_in_words() {
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Body {
            weight: u32,
        }
        for body in [
            r#"{"weight": -1}"#,
            r#"{"weight": 1e300}"#,
            r#"{"weight": "x"}"#,
        ] {
            let err = serde_json::from_str::<Body>(body).unwrap_err().to_string();
            let words = words::in_words(&err);
            assert!(!words.contains("u32"), "{words}");
            assert!(!words.contains("integer `"), "{words}");
            assert!(!words.contains("floating point"), "{words}");
            assert!(
                words.contains("a whole number from 0 to 4294967295"),
                "{words}"
            );
        }
    }

    #[test]
    fn mode_and_edit_distance() {
        assert_eq!(
            parse_text(r#"{"mode": "backend"}"#).unwrap().mode,
            Mode::Backend
        );
        let line = error_of(r#"{"mode": "proxy"}"#);
        assert!(line.contains("'proxy' is not a mode"), "{line}");
        assert_eq!(edit_distance("listne", "listen"), 2);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("workers", "workers"), 0);
        assert_eq!(closest("worker", &["workers", "backlog"]), Some("workers"));
        assert_eq!(closest("zzz", &["workers", "backlog"]), None);
        assert_eq!(key_position("{\n  \"a\" : 1}", "a"), Some((2, 3)));
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Random text never panics the loader: it is a file or one
            /// error line.
            #[test]
            fn random_text_never_panics(text in ".{0,200}") {
                if let Err(err) = parse_text(&text) {
                    prop_assert!(!err.to_string().contains('\n'));
                }
            }

            /// JSON-shaped text with known and unknown keys and values of
            /// every kind never panics either, and settles or errs in one
            /// line.
            #[test]
            fn json_shaped_text_never_panics(
                key in prop::sample::select(vec![
                    "workers", "listen", "backends", "backend_servers", "rate_limit",
                    "health_interval", "connect_timeout", "algorithm", "mode",
                    "send_proxy", "admin_listen", "nope", "listen_port",
                ]),
                value in prop::sample::select(vec![
                    "0", "1", "-3", "1.5", "\"3s\"", "\"x\"", "null", "true", "[]",
                    "[\"127.0.0.1:1\"]", "{}", "[{\"host\": \"a\", \"port\": 0}]",
                    "\"off\"", "99999999999999999999",
                ]),
            ) {
                let text = format!("{{\"{key}\": {value}}}");
                match parse_text(&text).and_then(|f| f.settle(&Overrides::default())) {
                    Ok(_) => {}
                    Err(err) => prop_assert!(!err.to_string().contains('\n'), "{err}"),
                }
            }
        }
    }

    #[test]
    fn worker_idle_timeout_is_a_duration_or_off_and_a_flag_wins() {
        let settle = |text: &str, flags: &Overrides| parse_text(text).unwrap().settle(flags);
        let none = Overrides::default();
        let c = settle(r#"{"worker_idle_timeout": "2m"}"#, &none).unwrap();
        assert_eq!(c.worker_idle_timeout, Some(Duration::from_secs(120)));
        let c = settle(r#"{"worker_idle_timeout": "off"}"#, &none).unwrap();
        assert_eq!(
            c.worker_idle_timeout, None,
            "off is a value, not the default"
        );
        let flags = Overrides {
            worker_idle_timeout: Some(None),
            ..Overrides::default()
        };
        let c = settle(r#"{"worker_idle_timeout": 30}"#, &flags).unwrap();
        assert_eq!(c.worker_idle_timeout, None);
        let err = settle("{\n \"worker_idle_timeout\": 0}", &none).unwrap_err();
        assert_eq!(
            err.to_string(),
            "test.json: line 2, column 2: `worker_idle_timeout` must be at least 1ms, \
             got 0ns (off keeps every worker)"
        );
    }
}
