//! A [`Config`] written back as a config file (`GET /config?format=file`):
//! the settings that differ from the defaults, in the file's keys and the
//! flags' notation, the backends and the listening addresses always, and
//! with several services, the process's settings at the top and each
//! service's own in its `services` entry. Read again (`check-config`, a
//! reload, a start), it gives the same settings.
//!
//! Runs on whichever thread asks (an admin handler); reads only its
//! argument.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C has no file to write.

use serde_json::{Map, Value};

use super::settings::{self, Scope};
use super::Config;

/// `config` as the JSON object of a config file (see the module docs).
pub fn to_file(config: &Config) -> Value {
    if config.services.is_empty() {
        return Value::Object(settings_of(config, None));
    }
    let mut top = settings_of(config, Some(Scope::Process));
    let services = config
        .services
        .iter()
        .map(|s| {
            let mut one = Map::new();
            one.insert("name".into(), Value::String(s.name.clone()));
            one.extend(settings_of(s, Some(Scope::Service)));
            Value::Object(one)
        })
        .collect();
    top.insert("services".into(), Value::Array(services));
    Value::Object(top)
}

/// `config`'s settings (of `scope`, or all) that differ from the
/// defaults, with `listen` and `backends` always.
fn settings_of(config: &Config, scope: Option<Scope>) -> Map<String, Value> {
    let defaults = Config::default().describe();
    let mut out = Map::new();
    for (key, value) in config.describe() {
        if scope.is_some_and(|s| settings::scope_of(key) != Some(s)) {
            continue;
        }
        let value = match key {
            "listen" => listen(config),
            "backends" => {
                let list = config.backends.iter().map(|b| Value::String(b.to_string()));
                Value::Array(list.collect())
            }
            _ if defaults.iter().any(|(k, v)| *k == key && *v == value) => continue,
            "tls_certs" => certificates(config),
            _ => typed(value),
        };
        out.insert(key.to_string(), value);
    }
    out
}

/// `listen`: one address as a string, several as a list.
fn listen(config: &Config) -> Value {
    let all = config.listen_addrs();
    match all.as_slice() {
        [one] => Value::String(one.to_string()),
        _ => Value::Array(all.iter().map(|a| Value::String(a.to_string())).collect()),
    }
}

/// `tls_certs` as the file takes it: a list of `{"cert": FILE, "key":
/// FILE}`, as the setting's own text writes it (what `check-config`
/// prints too).
fn certificates(config: &Config) -> Value {
    serde_json::from_str(&config.tls.certs.to_string()).unwrap_or(Value::Null)
}

/// A setting's text as the file takes it: whole numbers and `true` /
/// `false` typed, the rest (durations, sizes, names, `off`) as text.
fn typed(text: String) -> Value {
    match text.as_str() {
        "true" => Value::Bool(true),
        "false" => Value::Bool(false),
        _ => match text.parse::<u64>() {
            Ok(n) => Value::from(n),
            Err(_) => Value::String(text),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::file;
    use crate::config::Overrides;
    use std::path::Path;

    /// `text` read as a file, settled; then written back and read again:
    /// both give the same settings.
    fn round_trip(text: &str) -> Value {
        let path = Path::new("test.json");
        let first = file::parse(path, text).unwrap();
        let config = first.settle(&Overrides::default()).unwrap();
        let written = to_file(&config);
        let again = file::parse(path, &serde_json::to_string_pretty(&written).unwrap())
            .unwrap_or_else(|e| panic!("{e}\n{written:#}"));
        let back = again.settle(&Overrides::default()).unwrap();
        // With services, the top level's own service settings serve no
        // service: its process settings and each service's are compared.
        let scope = (!config.services.is_empty()).then_some(Scope::Process);
        let of = |c: &Config| -> Vec<(&str, String)> {
            let all = c.describe().into_iter();
            all.filter(|(k, _)| scope.map_or(true, |s| settings::scope_of(k) == Some(s)))
                .collect()
        };
        assert_eq!(of(&back), of(&config), "{written:#}");
        for (a, b) in back.services.iter().zip(&config.services) {
            assert_eq!(a.name, b.name);
            assert_eq!(a.describe(), b.describe(), "{written:#}");
        }
        assert_eq!(back.services.len(), config.services.len());
        written
    }

    #[test]
    fn a_file_written_back_reads_the_same() {
        let w = round_trip(r#"{"backends": ["127.0.0.1:8001"]}"#);
        assert_eq!(
            w,
            serde_json::json!({"listen": "0.0.0.0:8080", "backends": ["127.0.0.1:8001"]})
        );
        round_trip(
            r#"{"listen": ["127.0.0.1:9000", "127.0.0.1:9001"], "workers": 8,
                "backends": ["127.0.0.1:8001,weight=3", "[::1]:8002,send-proxy-v2"],
                "algorithm": "least-connections", "connect_timeout": "1500ms",
                "worker_idle_timeout": "off", "rate_limit": "10/1s", "splice": true,
                "health_check": "http", "health_path": "/up", "fin_timeout": "5s",
                "allow": "10.0.0.0/8,192.168.0.0/16", "access_log": "json", "queue_timeout": "2s"}"#,
        );
    }

    #[test]
    fn services_keep_their_own_settings() {
        let w = round_trip(
            r#"{"workers": 16, "connect_timeout": "2s", "services": [
                {"name": "web", "listen": "127.0.0.1:9000", "backends": ["127.0.0.1:1"]},
                {"name": "db", "listen": "127.0.0.1:9001", "backends": ["127.0.0.1:2,weight=2"],
                 "algorithm": "ip-hash", "idle_timeout": "1h"}]}"#,
        );
        assert_eq!(w["workers"], 16);
        assert_eq!(w["services"][1]["algorithm"], "ip-hash");
        assert_eq!(w["services"][0]["connect_timeout"], "2s");
        assert!(w.get("connect_timeout").is_none(), "{w:#}");
    }
}
