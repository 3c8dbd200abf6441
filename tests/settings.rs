//! Flags and file keys are read and layered as the settings table says:
//! defaults < file < flags, each value landing in its own setting.

use std::path::Path;
use std::time::Duration;

use clap::Parser;
use rodizio::backend::BackendSpec;
use rodizio::cli::{command, one_line, Cli};
use rodizio::config::export;
use rodizio::config::file::{parse, ConfigFile};
use rodizio::config::{Config, Overrides};
use rodizio::error::Result;
use rodizio::health::CheckKind;
use rodizio::limiter::{FailurePolicy, Rate, RateLimitAlgorithm, RateLimitConfig, RateLimitReply};
use rodizio::proxy_protocol::{CidrList, Version};
use rodizio::scheduler::Algorithm;
use rodizio::trace::Lang;
use serde_json::{Map, Value};

fn parse_text(text: &str) -> Result<ConfigFile> {
    parse(Path::new("test.json"), text)
}

/// No flag gives the article's settings: the defaults.
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

/// The health flags land in the health settings.
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
    assert_eq!(c.check, CheckKind::Http);
    assert_eq!(c.path, "/ok");
    assert_eq!(c.interval, Duration::from_millis(100));
    assert_eq!(c.timeout, Duration::from_millis(50));
    assert_eq!((c.fall, c.rise, c.passive_failures), (2, 1, 0));
    assert_eq!(c.cooldown, Duration::from_secs(1));
    assert!(c.http_replies);
    assert!(c.validate().is_ok());
}

/// Each balancer flag lands in its own setting.
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

/// The socket-ending flags are off unless given, and read durations.
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

/// The PROXY protocol flags land in their settings; bad ones are usage errors.
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

/// The shared-store flags and `--reuse-port` land in their settings; the store needs a rate limit.
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

/// Each file key lands in its own setting.
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
          "trace": true, "trace_lang": "pt", "sched_policy": "batch"
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
    assert!(c.proxy.splice && c.defer_accept);
    assert_eq!(c.proxy.yield_before_poll, rodizio::units::Switch::On);
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
    assert_eq!(r.algorithm, RateLimitAlgorithm::TokenBucket);
    assert_eq!((r.max_clients, r.ipv6_prefix), (1000, 48));
    assert_eq!(r.reply, RateLimitReply::Http);
    assert_eq!(h.user.as_deref(), Some("monitor"));
    assert_eq!(h.send.as_deref(), Some(&b"PING\r\n"[..]));
    assert_eq!(h.expect.as_deref(), Some(&b"+PONG"[..]));
    assert!(c.trace);
    assert_eq!(c.trace_lang, Lang::Pt);
    assert_eq!(c.sched_policy, rodizio::kernel_sched::SchedPolicy::Batch);
}

/// What `check-config` lists reads back, as a file, into the same settings.
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
            | "max_queue"
            | "backlog"
            | "fall"
            | "rise"
            | "passive_failures"
            | "rate_limit_max_clients"
            | "rate_limit_ipv6_prefix"
            | "tls_max_pending"
            | "splice"
            | "kernel_relay_after"
            | "defer_accept"
            | "http_replies"
            | "trace"
            | "admin_allow_remote"
            | "accept_proxy"
            | "allow_root"
            | "sni_default"
            | "reuse_port"
            | "tls_session_cache"
            | "tls_strict_sni"
            | "backend_tls"
            | "access_log_at_connect" => value,
            _ => format!("\"{value}\""),
        };
        text.push_str(&format!("\"{key}\": {value}"));
    }
    text.push('}');
    let back = parse_text(&text).unwrap();
    assert_eq!(back.settle(&Overrides::default()).unwrap(), c);
}

/// Defaults < file < flags, each layer keeping what it does not name.
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

/// `check-config` lists each setting once, in the operator's words.
#[test]
fn describe_names_every_setting_once() {
    let d = Config::default().describe();
    let mut names: Vec<_> = d.iter().map(|(n, _)| *n).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), d.len());
    let get = |k: &str| d.iter().find(|(n, _)| *n == k).unwrap().1.clone();
    assert_eq!(get("thread_stack"), "64k");
    assert_eq!(get("connect_timeout"), "3s");
    assert_eq!(get("idle_timeout"), "10m");
    assert_eq!(get("algorithm"), "round-robin");
    assert_eq!(get("fin_timeout"), "same as idle_timeout");
    assert_eq!(get("tcp_keepalive"), "off");
    let mut c = Config::default();
    c.proxy.fin_timeout = Some(Duration::from_secs(30));
    c.proxy.tcp_keepalive = Some(Duration::from_secs(60));
    let d = c.describe();
    let get = |k: &str| d.iter().find(|(n, _)| *n == k).unwrap().1.clone();
    assert_eq!(get("fin_timeout"), "30s");
    assert_eq!(get("tcp_keepalive"), "1m");
}

/// A layer changes only the settings it gives.
#[test]
fn only_what_is_given_changes() {
    let mut c = Config::default();
    Overrides::default().apply(&mut c).unwrap();
    assert_eq!(c, Config::default());
    let o = Overrides {
        workers: Some(8),
        connect_timeout: Some(Duration::from_millis(500)),
        fall: Some(5),
        ..Overrides::default()
    };
    o.apply(&mut c).unwrap();
    assert_eq!(c.workers, 8);
    assert_eq!(c.proxy.connect_timeout, Duration::from_millis(500));
    assert_eq!(c.health.fall, 5);
    assert_eq!(c.thread_stack, Config::default().thread_stack);
}

/// The socket-ending settings are laid over like the others and stay when not given.
#[test]
fn fin_timeout_and_tcp_keepalive_are_laid_over() {
    let mut c = Config::default();
    let o = Overrides {
        fin_timeout: Some(Duration::from_secs(20)),
        tcp_keepalive: Some(Duration::from_secs(90)),
        ..Overrides::default()
    };
    o.apply(&mut c).unwrap();
    assert_eq!(c.proxy.fin_timeout, Some(Duration::from_secs(20)));
    assert_eq!(c.proxy.tcp_keepalive, Some(Duration::from_secs(90)));
    Overrides::default().apply(&mut c).unwrap();
    assert_eq!(c.proxy.fin_timeout, Some(Duration::from_secs(20)));
}

/// `text` read as a file and settled; then exported (`GET
/// /config?format=file`'s writer), read and settled again: the same
/// settings. Returns the export.
fn exported_reads_back(text: &str) -> Value {
    let config = parse_text(text)
        .unwrap()
        .settle(&Overrides::default())
        .unwrap();
    let written = export::to_file(&config);
    let again = parse_text(&serde_json::to_string_pretty(&written).unwrap())
        .unwrap_or_else(|e| panic!("{e}\n{written:#}"));
    let back = again.settle(&Overrides::default()).unwrap();
    assert_eq!(back.describe(), config.describe(), "{written:#}");
    written
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
        "drain_spread": "3s", "drain_spread_order": "idlest",
        "upgrade_socket": "/run/rodizio/upgrade.sock",
        "connect_retries": 2, "connect_retry_budget": "4s",
        "splice": true, "kernel_relay_after": 9,
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
        "on_backend_down": "close", "on_backend_removed": "close",
        "removed_drain_timeout": "20s", "max_connection_lifetime": "1h",
        "max_connection_lifetime_jitter": "5m",
        "tcp_user_timeout": "20s", "resolve_interval": "30s", "slow_start": "10s",
        "resolvers": "127.0.0.1:5353,[::1]:53", "backends_from": "etcd://127.0.0.1:2379/lb/web",
        "allow": "10.0.0.0/8,192.168.0.0/16", "deny": "10.9.0.0/16",
        "max_connections_per_client": 9, "upload_rate": "1MB/s",
        "download_rate": "2MB/s",
        "tls_certs": [{"cert": "/etc/rodizio/a.pem", "key": "/etc/rodizio/a.key"},
                      {"cert": "/etc/rodizio/b.pem", "key": "/etc/rodizio/b.key"}],
        "tls_handshake_timeout": "4s", "tls_max_pending": 77, "tls_client_ca": "/etc/rodizio/clients.pem",
        "tls_client_crl": "/etc/rodizio/clients.crl",
        "backend_tls": true, "backend_tls_ca": "/etc/rodizio/backends.pem",
        "backend_tls_server_name": "backend.test", "tls_session_cache": 500,
        "tls_strict_sni": true, "tls_alpn": ["h2", "http/1.1"], "send_proxy": "v2",
        "accept_proxy": true, "accept_proxy_from": "127.0.0.0/8",
        "accept_proxy_timeout": "2s", "rate_limit_store": "redis://127.0.0.1:6379",
        "rate_limit_store_timeout": "150ms", "rate_limit_store_failure": "closed",
        "reuse_port": true, "access_log": "json", "access_log_file": "/var/log/r.log",
        "access_log_format": "{client} {end}", "access_log_target": "file",
        "access_log_interval": "30s", "access_log_at_connect": true,
        "user": "nobody", "group": "nogroup", "allow_root": true
    }"#;
    // SNI routing does not go with `accept_proxy`, nor `kernel_relay`
    // with `splice`: those in a second file.
    let sni = r#"{"listen": "127.0.0.1:9102", "backends": ["127.0.0.1:8001"],
        "server_names": "a.test,*.b.test", "server_alpn": ["h2", "imap"], "sni_default": true,
        "sni_timeout": "3s", "kernel_relay": "auto"}"#;
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
        let parsed = parse(Path::new("t.json"), text).unwrap();
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
    exported_reads_back(sni);
    let written = exported_reads_back(text);
    assert_eq!(
        written["tls_certs"][1]["key"], "/etc/rodizio/b.key",
        "{written:#}"
    );
}
