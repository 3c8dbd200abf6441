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
/// FILE}` (the flags' `CERT,KEY` notation is not a file's).
fn certificates(config: &Config) -> Value {
    let pairs = config.tls.certs.0.iter().map(|pair| {
        serde_json::json!({
            "cert": pair.cert.display().to_string(),
            "key": pair.key.display().to_string(),
        })
    });
    Value::Array(pairs.collect())
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

    /// Every setting the file takes, each at a value that is not its
    /// default (the process's settings and one service's): exported and
    /// read back, nothing changes. A setting added to the table without a
    /// line here fails the first assertion.
    #[test]
    fn every_setting_away_from_its_default_reads_back_the_same() {
        let text = r#"{
            "listen": "127.0.0.1:9100", "backends": ["127.0.0.1:8001,weight=2"],
            "algorithm": "least-connections", "thread_stack": "128k", "workers": 77,
            "max_connections": 500, "queue_capacity": 999, "worker_idle_timeout": "45s",
            "backlog": 77, "sched_policy": "batch", "buffer_size": "16k",
            "connect_timeout": "1500ms", "idle_timeout": "2m", "drain_timeout": "7s",
            "splice": true, "kernel_relay": true, "kernel_relay_after": 9,
            "defer_accept": true, "yield_before_poll": true, "health_check": "http",
            "health_interval": "3s", "health_timeout": "700ms", "health_path": "/up",
            "fall": 4, "rise": 5, "passive_failures": 6, "health_cooldown": "12s",
            "http_replies": true, "health_user": "checker", "health_send": "PING\\r\\n",
            "health_expect": "PONG", "rate_limit": "10/1s",
            "rate_limit_algorithm": "token-bucket", "rate_limit_max_clients": 5000,
            "rate_limit_ipv6_prefix": 48, "rate_limit_reply": "http", "trace": true,
            "trace_lang": "pt", "admin_listen": "127.0.0.1:9101", "admin_allow_remote": true,
            "admin_token_file": "/etc/rodizio/token", "queue_timeout": "2s", "max_queue": 17,
            "client_first_byte_timeout": "3s", "fin_timeout": "5s", "tcp_keepalive": "30s",
            "tcp_user_timeout": "20s", "resolve_interval": "30s", "slow_start": "10s",
            "allow": "10.0.0.0/8,192.168.0.0/16", "deny": "10.9.0.0/16",
            "max_connections_per_client": 9, "upload_rate": "1MB/s",
            "download_rate": "2MB/s",
            "tls_certs": [{"cert": "/etc/rodizio/a.pem", "key": "/etc/rodizio/a.key"},
                          {"cert": "/etc/rodizio/b.pem", "key": "/etc/rodizio/b.key"}],
            "tls_handshake_timeout": "4s", "tls_client_ca": "/etc/rodizio/clients.pem",
            "backend_tls": true, "backend_tls_ca": "/etc/rodizio/backends.pem",
            "backend_tls_server_name": "backend.test", "send_proxy": "v2",
            "accept_proxy": true, "accept_proxy_from": "127.0.0.0/8",
            "accept_proxy_timeout": "2s", "rate_limit_store": "redis://127.0.0.1:6379",
            "rate_limit_store_timeout": "150ms", "rate_limit_store_failure": "closed",
            "reuse_port": true, "access_log": "json", "access_log_file": "/var/log/r.log",
            "user": "nobody", "group": "nogroup", "allow_root": true
        }"#;
        // SNI routing does not go with `accept_proxy`: its settings in a
        // second file.
        let sni = r#"{"listen": "127.0.0.1:9102", "backends": ["127.0.0.1:8001"],
            "server_names": "a.test,*.b.test", "sni_default": true, "sni_timeout": "3s"}"#;
        let defaults = Config::default().describe();
        let mut given: Map<String, Value> = serde_json::from_str(text).unwrap();
        given.extend(serde_json::from_str::<Map<String, Value>>(sni).unwrap());
        let missing: Vec<&str> = defaults
            .iter()
            .map(|(k, _)| *k)
            .filter(|k| !given.contains_key(*k))
            .collect();
        assert!(missing.is_empty(), "no value here for {missing:?}");
        let settled = |text: &str| {
            let parsed = file::parse(Path::new("t.json"), text).unwrap();
            parsed.settle(&Overrides::default()).unwrap().describe()
        };
        let (all, sni_only) = (settled(text), settled(sni));
        let unchanged: Vec<&str> = all
            .iter()
            .zip(&sni_only)
            .zip(&defaults)
            .filter(|(((k, v), (_, s)), (_, d))| v == d && s == d && *k != "listen")
            .map(|(((k, _), _), _)| *k)
            .collect();
        assert!(unchanged.is_empty(), "still at the default: {unchanged:?}");
        round_trip(sni);
        let written = round_trip(text);
        assert_eq!(
            written["tls_certs"][1]["key"], "/etc/rodizio/b.key",
            "{written:#}"
        );
    }
}
