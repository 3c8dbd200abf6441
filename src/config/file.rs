//! The config file: JSON read into [`Overrides`], the layer between the
//! defaults and the flags.
//!
//! Its keys come from the settings table (`config/table.rs`), read by
//! `values.rs`; a few aliases in the style of other
//! balancers' files (`listen_port`, `backend_servers`, ...) and `mode` are
//! read here. Every error is one line naming the file, the line and
//! column, and the key as written (see [`ConfigFile::settle`]);
//! `docs/operations.md` lists every key and every kind of bad file.
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

use super::entry::Backends;
use super::settings;
use super::settings::Raw;
pub use super::values::Mode;
use super::values::{Listen, RateSetting, Whole};
use super::words::{self, json_error, object_start, Place};
use super::{Config, Overrides};
use crate::error::{Error, Result};
use crate::limiter::RateLimitConfig;

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
    /// The addresses of `listen` after the first, when it is a list.
    listen_also: Vec<SocketAddr>,
    /// `name`: the service's name.
    name: Option<String>,
    /// `services`: each entry read as a file of its own (its keys laid
    /// over this file's top level).
    services: Vec<ConfigFile>,
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
        let mut config = self.layered(None, flags)?;
        config.listen_also.clone_from(&self.listen_also);
        if let Some(name) = &self.name {
            config.name.clone_from(name);
        }
        if self.services.is_empty() {
            config
                .validate_services()
                .map_err(|e| self.attribute(e, flags))?;
            return Ok(config);
        }
        for key in ["backends", "listen"] {
            if self.given().contains(&key) {
                return Err(self.error_at(
                    key,
                    "with `services`, each service gives its own: move it into one",
                ));
            }
        }
        if let Some(key) = ["backends", "listen"]
            .into_iter()
            .find(|k| flags.given().contains(k))
        {
            return Err(Error::setting(
                key,
                "names the one service's; with `services` in the file, give it in a service",
            )
            .worded_as_flag());
        }
        for service in &self.services {
            let name = service.name.clone().unwrap_or_default();
            let mut one = service
                .layered(Some(self), flags)
                .map_err(|e| in_service(e, &name))?;
            one.listen_also.clone_from(&service.listen_also);
            one.name = name;
            super::settings::adopt_process(&mut one, &config);
            let named = |message: String| Error::ConfigFile {
                path: self.path.clone(),
                position: service.start_of_name(),
                message: format!("service `{}`: {message}", one.name),
            };
            for key in ["backends", "listen"] {
                // An etcd prefix to follow stands for the list.
                let followed = key == "backends" && one.names_backends();
                if !service.given().contains(&key) && !followed {
                    return Err(named(format!("no `{key}`: every service gives its own")));
                }
            }
            config.services.push(one);
        }
        config
            .validate_services()
            .map_err(|e| self.attribute(e, flags))?;
        Ok(config)
    }

    /// Where this service's `name` is written (for a service's errors).
    fn start_of_name(&self) -> Option<(usize, usize)> {
        self.keys
            .iter()
            .find(|k| k.setting == "name")
            .and_then(|k| k.position)
    }

    /// The defaults, then `top` (the file's top level, for a service),
    /// then this file's settings, then `flags`, validated except for the
    /// backends.
    fn layered(&self, top: Option<&ConfigFile>, flags: &Overrides) -> Result<Config> {
        let mut config = Config::default();
        let off = self.rate_limit_off
            || (top.is_some_and(|t| t.rate_limit_off) && self.overrides.rate_limit.is_none());
        let mut file = self.overrides.clone();
        if let Some(top) = top {
            file = top.overrides.merged(&file);
        }
        if off && flags.rate_limit.is_none() {
            file.rate_limit = None;
            file.rate_limit_algorithm = None;
            file.rate_limit_max_clients = None;
            file.rate_limit_ipv6_prefix = None;
            file.rate_limit_reply = None;
            file.rate_limit_store = None;
            file.rate_limit_store_timeout = None;
            file.rate_limit_store_failure = None;
        }
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
        if config.services.is_empty() && !config.names_backends() {
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

/// `err`, found in the service `name`, saying so.
fn in_service(err: Error, name: &str) -> Error {
    match err {
        Error::ConfigFile {
            path,
            position,
            message,
        } => Error::ConfigFile {
            path,
            position,
            message: format!("service `{name}`: {message}"),
        },
        other => other,
    }
}

/// Turns a [`Raw`] into a [`ConfigFile`], noting where each key is.
struct Converter<'a> {
    path: &'a Path,
    text: &'a str,
    /// Where its keys are written: the top level, or one service.
    place: Place<'a>,
    keys: Vec<Key>,
}

impl<'a> Converter<'a> {
    fn new(path: &'a Path, text: &'a str) -> Self {
        Converter {
            path,
            text,
            place: Place::top(text),
            keys: Vec::new(),
        }
    }

    /// Notes that the file gave `setting` under the key `written`.
    fn note(&mut self, setting: &'static str, written: &'static str) {
        let position = self.place.key(written);
        self.keys.push(Key {
            setting,
            written,
            position,
        });
    }

    fn error(&self, key: &str, message: String) -> Error {
        Error::ConfigFile {
            path: self.path.to_path_buf(),
            position: self.place.key(key),
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

    fn convert(mut self, mut raw: Raw) -> Result<ConfigFile> {
        let mut o = Overrides::default();
        let mut noted = Vec::new();
        raw.lay_plain(&mut o, |key| noted.push(key));
        for key in noted {
            self.note(key, key);
        }
        let listen_also = self.listen(&mut raw, &mut o);
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
        let name_at = raw.name.as_deref().and_then(|n| self.place.name(n));
        if raw.name.is_some() {
            self.keys.push(Key {
                setting: "name",
                written: "name",
                position: name_at,
            });
        }
        let services = match raw.services.take() {
            Some(list) => self.services(list, raw.mode.is_some())?,
            None => Vec::new(),
        };
        let mode = raw.mode.map_or(Mode::default(), |m| m.0);
        Ok(ConfigFile {
            path: self.path.to_path_buf(),
            mode,
            overrides: o,
            rate_limit_off,
            keys: self.keys,
            start: object_start(self.text),
            listen_also,
            name: raw.name,
            services,
        })
    }

    /// `listen` (one address or several) and `listen_port` into `o`;
    /// gives back the addresses after the first.
    fn listen(&mut self, raw: &mut Raw, o: &mut Overrides) -> Vec<SocketAddr> {
        let mut listen_also = Vec::new();
        if let Some(Listen(mut addrs)) = raw.listen.take() {
            self.note("listen", "listen");
            o.listen = Some(addrs.remove(0));
            listen_also = addrs;
        }
        if let Some(Whole(port)) = raw.listen_port.take() {
            let listen_written = o.listen.is_some();
            let ip = o.listen.unwrap_or(Config::default().listen).ip();
            o.listen = Some(SocketAddr::new(ip, port));
            if !listen_written {
                self.note("listen", "listen_port");
            }
        }
        listen_also
    }

    /// Reads the entries of `services`: each a service's own keys, with a
    /// `name`; no process-wide key, no `mode`, no `services` inside.
    fn services(&self, list: Vec<Raw>, mode_given: bool) -> Result<Vec<ConfigFile>> {
        if list.is_empty() {
            return Err(self.error("services", "`services` is empty: list at least one".into()));
        }
        if mode_given {
            return Err(self.error(
                "mode",
                "`mode` describes one process: it cannot go with `services`".into(),
            ));
        }
        let mut services: Vec<ConfigFile> = Vec::new();
        let places = Place::services(self.text);
        for (i, raw) in list.into_iter().enumerate() {
            let place = places.get(i).cloned().unwrap_or_else(|| self.place.clone());
            let Some(name) = raw.name.clone() else {
                return Err(self.error(
                    "services",
                    format!("services[{i}] has no `name`: give every service one"),
                ));
            };
            // Checked first: every later message names the service.
            super::services::check_name(&name).map_err(|e| match e {
                Error::InvalidSetting { message, .. } => Error::ConfigFile {
                    path: self.path.to_path_buf(),
                    position: place.name(&name),
                    message: format!("services[{i}]: {message}"),
                },
                other => other,
            })?;
            let within = |message: String| Error::ConfigFile {
                path: self.path.to_path_buf(),
                position: place.name(&name),
                message: format!("service `{name}`: {message}"),
            };
            if services
                .iter()
                .any(|s| s.name.as_deref() == Some(name.as_str()))
            {
                // Here, where the second one is written, not later
                // without a place (`Config::validate_services` says the same).
                return Err(within(format!(
                    "the name `{name}` is given twice: names are unique"
                )));
            }
            if raw.services.is_some() || raw.mode.is_some() {
                let key = if raw.mode.is_some() {
                    "mode"
                } else {
                    "services"
                };
                return Err(within(format!(
                    "`{key}` goes at the top level of the file only"
                )));
            }
            let file = Converter {
                place: place.clone(),
                ..Converter::new(self.path, self.text)
            }
            .convert(raw)
            .map_err(|e| in_service(e, &name))?;
            if let Some(key) = file
                .keys
                .iter()
                .find(|k| settings::scope_of(k.setting) == Some(settings::Scope::Process))
            {
                return Err(within(format!(
                    "`{}` is one value for the whole process: set it at the top level \
                     of the file",
                    key.written
                )));
            }
            services.push(ConfigFile {
                name: Some(name),
                ..file
            });
        }
        Ok(services)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::words::{closest, edit_distance};
    use crate::limiter::{Rate, RateLimitReply};
    use crate::scheduler::Algorithm;
    use serde::Deserialize;
    use std::time::Duration;

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

    fn settled(text: &str) -> Config {
        parse_text(text)
            .unwrap()
            .settle(&Overrides::default())
            .unwrap()
    }

    #[test]
    fn services_take_the_top_level_as_defaults() {
        let c = settled(
            r#"{"workers": 64, "idle_timeout": "5s", "algorithm": "least-connections",
                "services": [
                  {"name": "web", "listen": ["127.0.0.1:0", "[::1]:0"],
                   "backends": ["127.0.0.1:8001"], "idle_timeout": "7s"},
                  {"name": "db", "listen": "127.0.0.1:5432", "backends": ["127.0.0.1:5433"],
                   "algorithm": "round-robin", "max_connections": 10}
                ]}"#,
        );
        assert_eq!(c.workers, 64);
        let [web, db] = &c.services[..] else {
            panic!("{:?}", c.services)
        };
        assert_eq!((web.name.as_str(), db.name.as_str()), ("web", "db"));
        assert_eq!(web.workers, 64, "process-wide values are the top's");
        assert_eq!(web.proxy.idle_timeout, Duration::from_secs(7));
        assert_eq!(db.proxy.idle_timeout, Duration::from_secs(5));
        assert_eq!(web.algorithm, Algorithm::LeastConnections);
        assert_eq!(db.algorithm, Algorithm::RoundRobin);
        assert_eq!(web.listen_addrs().len(), 2);
        assert_eq!(db.max_connections, Some(10));
        assert_eq!(web.max_connections, None);
        let names: Vec<&str> = c.service_list().iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["web", "db"]);
    }

    #[test]
    fn a_flat_file_is_one_service_named_default_or_as_named() {
        let c = settled(r#"{"listen": "127.0.0.1:0", "backends": ["127.0.0.1:8001"]}"#);
        assert!(c.services.is_empty());
        assert_eq!(c.service_list()[0].name, "default");
        let c = settled(r#"{"name": "web", "backends": ["127.0.0.1:8001"]}"#);
        assert_eq!(c.service_list()[0].name, "web");
    }

    #[test]
    fn bad_services_are_refused_in_words() {
        let one = |extra: &str| {
            format!(
                r#"{{"services": [{{"name": "web", "listen": "127.0.0.1:0",
                    "backends": ["127.0.0.1:8001"]{extra}}}]}}"#
            )
        };
        let cases = [
            (one(r#", "workers": 4"#), "service `web`: `workers` is one value for the whole process"),
            (one(r#", "mode": "backend""#), "service `web`: `mode` goes at the top level"),
            (one(r#", "buffer_size": 0"#), "service `web`: `buffer_size` must be"),
            (one(r#", "max_connections": 0"#), "service `web`: `max_connections`"),
            (one(r#", "listen": "x""#), "written twice"),
            (r#"{"services": []}"#.into(), "`services` is empty"),
            (r#"{"services": [{"listen": "127.0.0.1:0", "backends": ["127.0.0.1:1"]}]}"#.into(),
             "services[0] has no `name`"),
            (r#"{"services": [{"name": "a b", "listen": "127.0.0.1:0", "backends": ["127.0.0.1:1"]}]}"#.into(),
             "is not a service name"),
            (r#"{"services": [{"name": "a", "backends": ["127.0.0.1:1"]}]}"#.into(),
             "service `a`: no `listen`"),
            (r#"{"services": [{"name": "a", "listen": "127.0.0.1:0"}]}"#.into(),
             "service `a`: no `backends`"),
            (r#"{"backends": ["127.0.0.1:1"], "services": [{"name": "a", "listen": "127.0.0.1:0",
                "backends": ["127.0.0.1:1"]}]}"#.into(), "`backends`: with `services`"),
            (r#"{"services": [{"name": "a", "listen": "127.0.0.1:9", "backends": ["127.0.0.1:1"]},
                {"name": "b", "listen": "127.0.0.1:9", "backends": ["127.0.0.1:1"]}]}"#.into(),
             "services `a` and `b` both listen there"),
            (r#"{"services": [{"name": "a", "listen": [], "backends": ["127.0.0.1:1"]}]}"#.into(),
             "the list is empty"),
        ];
        for (text, want) in cases {
            let err = error_of(&text);
            assert!(err.contains(want), "{text}\n→ {err}\nwanted {want}");
        }
        let flags = Overrides {
            backends: Some(vec![
                crate::backend::BackendSpec::parse("127.0.0.1:1").unwrap()
            ]),
            ..Overrides::default()
        };
        let err = parse_text(&one(""))
            .unwrap()
            .settle(&flags)
            .unwrap_err()
            .to_string();
        assert!(err.contains("--backend"), "{err}");
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
    fn rate_limit_off_keeps_its_details_for_a_flag() {
        let text = r#"{"rate_limit": "off", "rate_limit_reply": "http"}"#;
        let f = parse_text(text).unwrap();
        assert_eq!(f.settle(&Overrides::default()).unwrap().rate_limit, None);
        let flags = Overrides {
            rate_limit: Some(Rate::parse("5/1s").unwrap()),
            ..Overrides::default()
        };
        let r = f.settle(&flags).unwrap().rate_limit.unwrap();
        assert_eq!(r.reply, RateLimitReply::Http);
        // A detail without any rate limit is still refused, at its key.
        let line = error_of("{\n\"rate_limit_reply\": \"http\"}");
        assert!(
            line.contains("line 2, column 1: `rate_limit_reply` needs `rate_limit`"),
            "{line}"
        );
    }

    #[test]
    fn a_setting_another_makes_do_nothing_is_refused_at_its_key() {
        for (text, words) in [
            (
                "{\n\"tls_client_ca\": \"/ca.pem\"}",
                "line 2, column 1: `tls_client_ca` needs `tls_certs`",
            ),
            (
                "{\n\"backend_tls_ca\": \"/ca.pem\"}",
                "line 2, column 1: `backend_tls_ca` needs `backend_tls`",
            ),
            (
                "{\"splice\": true,\n\"kernel_relay\": \"auto\"}",
                "line 2, column 1: `kernel_relay` does nothing with `splice`",
            ),
        ] {
            let line = error_of(text);
            assert!(line.contains(words), "{line}");
        }
        // With what they need, or `off`, they are accepted.
        for text in [
            r#"{"backend_tls": true, "backend_tls_ca": "/ca.pem"}"#,
            r#"{"splice": true, "kernel_relay": "off"}"#,
            r#"{"kernel_relay": "on"}"#,
        ] {
            parse_text(text)
                .unwrap()
                .settle(&Overrides::default())
                .unwrap();
        }
    }

    #[test]
    fn a_rate_may_be_a_number() {
        let c = parse_text(r#"{"rate_limit": 10, "upload_rate": 65536, "download_rate": 0}"#)
            .unwrap()
            .settle(&Overrides::default())
            .unwrap();
        assert_eq!(c.rate_limit.unwrap().rate, Rate::parse("10/1s").unwrap());
        assert_eq!(c.proxy.upload_rate, Some(crate::units::ByteRate(65536)));
        assert_eq!(c.proxy.download_rate.and_then(|r| r.per_second()), None);
        let line = error_of(r#"{"rate_limit": 1.5}"#);
        assert!(line.contains("'1.5' is not a rate"), "{line}");
        let line = error_of(r#"{"upload_rate": true}"#);
        assert!(line.contains("expected a string or a number"), "{line}");
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

    /// Every setting a flag gives is worded as that flag, also the ones
    /// listed late in the table (here `queue_timeout`).
    #[test]
    fn every_flag_that_gives_the_bad_value_is_worded_as_the_flag() {
        let f = parse_text(r#"{"workers": 8}"#).unwrap();
        let flags = Overrides {
            queue_timeout: Some(Duration::ZERO),
            ..Overrides::default()
        };
        let line = f.settle(&flags).unwrap_err().to_string();
        assert!(
            line.contains("--queue-timeout must be at least 1ms"),
            "{line}"
        );
    }

    #[test]
    fn missing_backends_is_an_error_of_the_file() {
        let line = error_of("\n  {\"workers\": 4}");
        assert!(line.contains("line 2, column 3: no backends"), "{line}");
        let line = error_of(r#"{"backends": []}"#);
        assert!(line.contains("`backends` is empty"), "{line}");
    }

    #[test]
    fn an_etcd_prefix_is_a_source_of_backends() {
        let only = r#"{"backends_from": "etcd://127.0.0.1:2379/lb/"}"#;
        let f = parse_text(only).unwrap();
        let c = f.settle(&Overrides::default()).unwrap();
        f.require_backends(&c).unwrap();
        c.validate().unwrap();
        assert!(c.backends.is_empty());
        // In a service too; a service with neither is still refused.
        let services = r#"{"services": [
            {"name": "a", "listen": "127.0.0.1:0", "backends_from": "etcd://127.0.0.1:2379/a/"},
            {"name": "b", "listen": "127.0.0.1:0", "backends": ["127.0.0.1:1"]}]}"#;
        let f = parse_text(services).unwrap();
        f.settle(&Overrides::default()).unwrap().validate().unwrap();
        let neither = services.replace(r#""backends": ["127.0.0.1:1"]"#, r#""algorithm": "p2c""#);
        let err = parse_text(&neither)
            .and_then(|f| f.settle(&Overrides::default()))
            .and_then(|c| c.validate())
            .expect_err("a service with no backends");
        assert!(
            err.to_string().contains("service `b`: no `backends`"),
            "{err}"
        );
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
        // Cut short after a line break: serde's column 0 is column 1.
        let line = error_of("{\n  \"workers\": 4,\n");
        assert!(
            line.starts_with(
                "test.json: line 3, column 1: JSON syntax error: the file ends too soon"
            ),
            "{line}"
        );
    }

    #[test]
    fn a_services_error_is_placed_in_that_service() {
        let text = "{\"workers\": 4, \"services\": [\n\
            {\"name\": \"web\", \"listen\": \"127.0.0.1:1\", \"backends\": [\"127.0.0.1:8001\"]},\n\
            {\"name\": \"db\", \"listen\": \"127.0.0.1:2\",\n  \"backends\": []},\n\
            {\"name\": \"web\", \"listen\": \"127.0.0.1:3\", \"backends\": [\"127.0.0.1:8003\"]}\n]}";
        let line = error_of(text);
        assert!(
            line.contains("line 4, column 3: service `db`: `backends` is empty"),
            "{line}"
        );
        let line =
            error_of(&text.replace("\"backends\": []", "\"backends\": [\"127.0.0.1:8002\"]"));
        assert!(
            line.contains("line 5, column 2: service `web`: the name `web` is given twice"),
            "{line}"
        );
        // The top level's keys are not looked for in the services.
        let line = error_of(
            "{\"services\": [{\"name\": \"a\", \"listen\": \"127.0.0.1:1\", \"backends\": \
             [\"127.0.0.1:1\"], \"idle_timeout\": \"5s\"}],\n\"idle_timeout\": \"0s\"}",
        );
        assert!(line.contains("line 2, column 1: `idle_timeout`"), "{line}");
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
        assert_eq!(words::key_position("{\n  \"a\" : 1}", "a"), Some((2, 3)));
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
