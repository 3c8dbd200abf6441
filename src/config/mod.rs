//! The balancer's settings, in one validated value.
//!
//! [`Config`] is what [`crate::Balancer::bind`] takes. [`Config::default`]
//! holds the article's values, so a test or a reader changes only what it
//! cares about; each part's defaults are written once, in that part's
//! settings type ([`ProxyConfig`], [`HealthConfig`], [`RateLimitConfig`]).
//!
//! The binary lays [`Overrides`] over the defaults: a config file
//! (`file.rs`), the flags (`cli.rs`) and the prompt's backends; each
//! setting is one line of the settings table (`table.rs`, read by
//! `settings.rs`). Built and validated on the main thread before anything
//! starts; [`crate::Balancer::bind`] then shares the parts that may change
//! as live values.
//!
//! # Parts
//!
//! - this file: [`Config`], its defaults (the C `#define`s) and validation;
//! - `access`: the access log's settings checked together;
//! - `table`: every setting declared once (key, flag, scope, reload),
//!   SNI routing's in `table_sni`, the access log's in `table_log`, the
//!   ends on purpose in `table_ends`;
//!   `settings`: what the table generates; `overrides`: the [`Overrides`]
//!   laid over the defaults;
//! - `file`: the JSON config file; `values`: its value types; `entry`: a
//!   backend in the file (a string or an object); `read`: reading it,
//!   bounded;
//! - `services`: what spans services (names, addresses); `sni_check`: the
//!   rules of SNI routing (who may share an address);
//! - `words`: errors and values in the operator's words; `export`: a
//!   configuration written back as a file.
//!
//! Each part of the balancer owns its settings type, below this module;
//! `config` gathers them (see `# Layers` in the crate doc).
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
//! | `_BUFFER_SIZE 4100` (reads of 4096) | `proxy.buffer_size` (4096)  |
//! | `_MAX_SERVERS 10`           | [`MAX_PROMPT_SERVERS`] (prompt only; flags take any number) |

mod access;
mod entry;
pub mod export;
pub mod file;
mod overrides;
mod read;
mod services;
pub mod settings;
pub mod sni_check;
pub use access::MIN_ACCESS_LOG_INTERVAL;
pub(crate) mod table;
pub(crate) mod table_ends;
pub(crate) mod table_log;
pub(crate) mod table_sni;
mod values;
pub mod words;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use crate::backend::BackendSpec;
use crate::error::{Error, Result};
use crate::health::HealthConfig;
use crate::kernel_sched::SchedPolicy;
use crate::limiter::{RateLimitConfig, StoreConfig};
use crate::proxy::ProxyConfig;
use crate::proxy_protocol::{AcceptProxy, CidrList, Version};
use crate::scheduler::Algorithm;
use crate::trace::Lang;
use crate::units::format_size;

pub use services::{shown as shown_name, DEFAULT_NAME as DEFAULT_SERVICE};
pub use settings::Overrides;

/// The article's `_PORT`.
pub const DEFAULT_PORT: u16 = 8080;
/// The article's `_MAX_SERVERS`: the prompt accepts 1 to 10 backends.
pub const MAX_PROMPT_SERVERS: usize = 10;
/// Most worker threads accepted.
pub const MAX_WORKERS: usize = 65536;
/// Smallest worker stack accepted: below, logging or a panic could overflow.
pub const MIN_THREAD_STACK: usize = 32 * 1024;
/// Largest worker stack accepted: 1 GiB, far above any need (default 64
/// KiB) and far from where rounding it up to whole pages would overflow.
pub const MAX_THREAD_STACK: usize = 1 << 30;
/// Shortest duration any duration setting accepts: below a millisecond a
/// timeout cuts every connection at once, and `poll(2)` counts in
/// milliseconds anyway.
pub const MIN_DURATION: Duration = Duration::from_millis(1);

/// Longest `tcp_user_timeout`: `TCP_USER_TIMEOUT` is an unsigned 32-bit
/// count of milliseconds.
pub const MAX_TCP_USER_TIMEOUT: Duration = Duration::from_millis(u32::MAX as u64);

/// Longest slow start: an hour. A ramp is for a cold cache or a JIT to
/// warm up; longer, and a typo (`30m` for `30s`) would starve a backend.
pub const MAX_SLOW_START: Duration = Duration::from_secs(3600);

/// Default of `worker_idle_timeout`: a minute. Traffic that comes back
/// within a minute finds its threads still there; a flood's threads are
/// gone a minute after it ends. (Apache's worker MPM looks once a second
/// and stops spare threads above `MaxSpareThreads`, with no idle time.)
pub const DEFAULT_WORKER_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Everything the balancer needs to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Where to accept clients (`listen`). Default `0.0.0.0:8080`.
    pub listen: SocketAddr,
    /// The backends, in round-robin order (`backends`).
    pub backends: Vec<BackendSpec>,
    /// How backends are chosen (`algorithm`). Default: round robin.
    pub algorithm: Algorithm,
    /// Most worker threads, hence most connections served at once
    /// (`workers`). Default 4096.
    pub workers: usize,
    /// Stack size of each worker thread, in bytes (`thread_stack`).
    /// Default 65536.
    pub thread_stack: usize,
    /// Most accepted connections waiting for a worker (`queue_capacity`).
    /// Default 4096.
    pub queue_capacity: usize,
    /// A worker that waited this long for a client exits, down to
    /// [`crate::pool::WORKER_FLOOR`] workers (`worker_idle_timeout`), so
    /// the threads of a past flood do not stay for ever. `None` (`off`):
    /// the pool never shrinks. Default 60 s.
    pub worker_idle_timeout: Option<Duration>,
    /// The `listen(2)` backlog (`backlog`). Default 4096.
    pub backlog: i32,
    /// The kernel's scheduling policy for every thread (`sched_policy`).
    /// Default [`SchedPolicy::Normal`]: as started.
    pub sched_policy: SchedPolicy,
    /// Longest wait for connections in flight after a shutdown
    /// (`drain_timeout`). Default 30 s.
    pub drain_timeout: Duration,
    /// At the drain timeout, close the connections left over this window,
    /// one after another, instead of all at once (`drain_spread`). Default
    /// `None`: all at once.
    pub drain_spread: Option<Duration>,
    /// Which the spread closes first (`drain_spread_order`). Default oldest.
    pub drain_spread_order: crate::connections::SpreadOrder,
    /// Where a new process takes the listening sockets ([`crate::upgrade`]).
    pub upgrade_socket: Option<PathBuf>,
    /// Hand a client over only once its first bytes arrived
    /// (`defer_accept`, `TCP_DEFER_ACCEPT`). Default off.
    pub defer_accept: bool,
    /// Connecting and moving bytes: chunk size, timeouts, splice.
    pub proxy: ProxyConfig,
    /// TLS termination (`tls_certs`, `tls_handshake_timeout`). Default
    /// off: plain TCP.
    pub tls: crate::tls_term::TlsSettings,
    /// Health checks (active and passive) and replies when no backend can
    /// serve. Defaults: tcp checks every 5 s.
    pub health: HealthConfig,
    /// Per-client-IP rate limiting at accept time (`rate_limit`). Default
    /// `None` (off).
    pub rate_limit: Option<RateLimitConfig>,
    /// Narrate every connection's steps (`trace`, see [`crate::trace`]).
    /// Default off.
    pub trace: bool,
    /// The language of the trace (`trace_lang`). Default English.
    pub trace_lang: Lang,
    /// Where the admin API listens (`admin_listen`, the `--admin` flag).
    /// Default `None` (off). See [`crate::admin`].
    pub admin_listen: Option<SocketAddr>,
    /// Let the admin API listen on an address that is not loopback
    /// (`admin_allow_remote`). Default false.
    pub admin_allow_remote: bool,
    /// A file holding the admin API's bearer token (`admin_token_file`).
    /// Default `None`: no token asked.
    pub admin_token_file: Option<PathBuf>,
    /// Send every backend a PROXY protocol header of this version before
    /// the client's bytes (`send_proxy`), unless its own spec says
    /// `,send-proxy` or `,send-proxy-v2`. Default `None` (off).
    pub send_proxy: Option<Version>,
    /// Expect a PROXY protocol header from every client (`accept_proxy`):
    /// the balancer sits behind another proxy. Default off.
    pub accept_proxy: bool,
    /// The peers trusted to send that header (`accept_proxy_from`).
    /// Default loopback only.
    pub accept_proxy_from: CidrList,
    /// Longest wait for a complete header (`accept_proxy_timeout`).
    /// Default 5 s.
    pub accept_proxy_timeout: Duration,
    /// Where the rate limiter keeps its counts: in this process (the
    /// default) or in Redis, shared by several balancers
    /// (`rate_limit_store`, `rate_limit_store_timeout`,
    /// `rate_limit_store_failure`).
    pub rate_limit_store: StoreConfig,
    /// Set `SO_REUSEPORT` on the listening socket (`reuse_port`), so that
    /// several balancers listen on one port. Default off.
    pub reuse_port: bool,
    /// One line per connection when it ends (`access_log`: text or json).
    /// Default `None` (off).
    pub access_log: Option<crate::access_log::Format>,
    /// Where the access log goes (`access_log_file`); reopened on SIGUSR1.
    /// Default `None`: standard output.
    pub access_log_file: Option<PathBuf>,
    /// The access log's line as a template (`access_log_format`).
    /// Default `None`: `access_log`'s own line.
    pub access_log_format: Option<crate::access_log::Template>,
    /// Where the access log goes (`access_log_target`). Default `None`:
    /// `access_log_file` when given, else standard output.
    pub access_log_target: Option<crate::access_log::Destination>,
    /// Interim lines for connections open longer (`access_log_interval`).
    /// Default `None` (off).
    pub access_log_interval: Option<Duration>,
    /// A line at each connect too (`access_log_at_connect`). Default off.
    pub access_log_at_connect: bool,
    /// The service's name (`name`, in a `services` entry): in the admin
    /// API's paths, the `service` label of `/metrics`, logs and the
    /// access log. Default `default`.
    pub name: String,
    /// More addresses the service accepts clients on, besides `listen`
    /// (the file's `listen` as a list). Default none.
    pub listen_also: Vec<SocketAddr>,
    /// Ramp the share of a backend back in rotation from about 5% to all
    /// of its weight over this long (`slow_start`, HAProxy's `slowstart`).
    /// Default `None` (off).
    pub slow_start: Option<Duration>,
    /// Most clients of this service held at once, queued or served
    /// (`max_connections`, HAProxy's frontend `maxconn`): past it the
    /// service stops accepting and new clients wait in the kernel's
    /// backlog. Default `None`: only `workers` bounds it.
    pub max_connections: Option<usize>,
    /// The services, when the file lists them (`services`): each a whole
    /// configuration whose process-wide settings are this one's. Empty:
    /// this configuration is the one service, `default`.
    pub services: Vec<Config>,
    /// The user to run as once every socket is bound (`user`): a name or a
    /// number. Default `None`: stay who started it. See
    /// [`crate::privileges`].
    pub user: Option<String>,
    /// The group to run as with it (`group`). Default `None`: the user's own.
    pub group: Option<String>,
    /// Started as root, go on as root when no `user` is given
    /// (`allow_root`). Default false: refused.
    pub allow_root: bool,
    /// SNI routing (`server_names` and its ALPN protocols, `sni_default`,
    /// `sni_timeout`): see
    /// [`crate::sni`]. Default off.
    pub sni: crate::sni::SniConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), DEFAULT_PORT),
            backends: Vec::new(),
            algorithm: Algorithm::default(),
            workers: 4096,
            thread_stack: 65536,
            queue_capacity: 4096,
            worker_idle_timeout: Some(DEFAULT_WORKER_IDLE_TIMEOUT),
            backlog: 4096,
            sched_policy: SchedPolicy::Normal,
            drain_timeout: Duration::from_secs(30),
            drain_spread: None,
            drain_spread_order: crate::connections::SpreadOrder::Oldest,
            upgrade_socket: None,
            defer_accept: false,
            proxy: ProxyConfig::default(),
            tls: crate::tls_term::TlsSettings::default(),
            health: HealthConfig::default(),
            rate_limit: None,
            trace: false,
            trace_lang: Lang::En,
            admin_listen: None,
            admin_allow_remote: false,
            admin_token_file: None,
            send_proxy: None,
            accept_proxy: false,
            accept_proxy_from: CidrList::loopback(),
            accept_proxy_timeout: Duration::from_secs(5),
            rate_limit_store: StoreConfig::default(),
            reuse_port: false,
            access_log: None,
            access_log_file: None,
            access_log_format: None,
            access_log_target: None,
            access_log_interval: None,
            access_log_at_connect: false,
            name: services::DEFAULT_NAME.to_string(),
            listen_also: Vec::new(),
            max_connections: None,
            slow_start: None,
            services: Vec::new(),
            user: None,
            group: None,
            allow_root: false,
            sni: crate::sni::SniConfig::default(),
        }
    }
}

impl Config {
    /// What the workers need to read a PROXY protocol header when
    /// `accept_proxy` is on: the trusted peers and the longest wait.
    pub fn header_acceptor(&self) -> Option<AcceptProxy> {
        self.accept_proxy
            .then(|| AcceptProxy::new(self.accept_proxy_from.clone(), self.accept_proxy_timeout))
    }

    /// Checks that every value is usable.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSetting`] naming the first bad setting.
    pub fn validate(&self) -> Result<()> {
        if self.services.is_empty() && !self.names_backends() {
            return Err(Error::setting("backends", "must name at least one backend"));
        }
        for service in &self.services {
            if !service.names_backends() {
                return Err(Error::setting(
                    "backends",
                    format!("service `{}` must name at least one backend", service.name),
                ));
            }
            service.validate_settings()?;
        }
        self.validate_settings()?;
        self.validate_services()
    }

    /// Each backend's own check laid over the health settings is valid
    /// too (a `send-expect` of its own needs the service's
    /// `health_expect`).
    fn validate_own_checks(&self) -> Result<()> {
        for spec in &self.backends {
            if let Err(err) = self.health.for_backend(&spec.check).validate() {
                let words = match err {
                    Error::InvalidSetting { setting, message } => format!("{setting} {message}"),
                    other => other.to_string(),
                };
                return Err(Error::InvalidBackend(format!("'{spec}': {words}")));
            }
        }
        Ok(())
    }

    /// [`Config::validate`] without the backends, which the prompt may
    /// still fill in: what is checked before the first question.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSetting`] naming the first bad setting.
    pub fn validate_settings(&self) -> Result<()> {
        if self.workers == 0 || self.workers > MAX_WORKERS {
            return Err(Error::setting(
                "workers",
                format!("must be 1..{MAX_WORKERS}, got {}", self.workers),
            ));
        }
        if self.thread_stack < MIN_THREAD_STACK {
            return Err(Error::setting(
                "thread_stack",
                format!(
                    "must be at least {MIN_THREAD_STACK} bytes, got {}",
                    self.thread_stack
                ),
            ));
        }
        if self.thread_stack > MAX_THREAD_STACK {
            return Err(Error::setting(
                "thread_stack",
                format!(
                    "must be at most {} (1 GiB), got {}",
                    format_size(MAX_THREAD_STACK),
                    self.thread_stack
                ),
            ));
        }
        self.check_durations()?;
        if self.queue_capacity == 0 {
            return Err(Error::setting("queue_capacity", "must be at least 1"));
        }
        if self.backlog < 1 {
            return Err(Error::setting(
                "backlog",
                format!("must be at least 1, got {}", self.backlog),
            ));
        }
        if self.accept_proxy_timeout.is_zero() {
            return Err(Error::setting(
                "accept_proxy_timeout",
                "must be more than 0",
            ));
        }
        self.rate_limit_store.validate()?;
        self.proxy.validate()?;
        if let Some(rate_limit) = &self.rate_limit {
            rate_limit.validate()?;
        }
        self.health.validate()?;
        self.validate_own_checks()?;
        self.validate_access_log()?;
        self.check_unused()?;
        self.check_duplicate_backends()?;
        if self.max_connections == Some(0) {
            return Err(Error::setting("max_connections", "must be at least 1"));
        }
        crate::privileges::Identity::of(self.user.as_deref(), self.group.as_deref())?;
        self.validate_admin()
    }

    /// Refuses a setting that another one makes do nothing: it would be
    /// silently ignored, as `access_log_file` without `access_log` would.
    fn check_unused(&self) -> Result<()> {
        if self.tls.client_ca.is_some() && !self.tls.terminates() {
            // Only a service that terminates TLS asks for a certificate.
            return Err(Error::setting("tls_client_ca", "needs `tls_certs`"));
        }
        if self.tls.backend_ca.is_some() && !self.tls.backend {
            return Err(Error::setting("backend_tls_ca", "needs `backend_tls`"));
        }
        if self.proxy.splice && self.proxy.kernel_relay != crate::units::Switch::Off {
            // The splice pump never hands a connection to the kernel.
            return Err(Error::setting(
                "kernel_relay",
                "does nothing with `splice`: choose one (splice copies in the kernel \
                 from the start, kernel_relay after a few exchanges)",
            ));
        }
        Ok(())
    }

    /// Refuses two backends that reach the same address: `-b A -b A`, or
    /// `localhost:8001` beside `127.0.0.1:8001`, would give that server a
    /// double share without a word, the admin API would act on the first
    /// copy only, and `/metrics` would repeat its series (Prometheus
    /// refuses duplicate samples). The weight is how to give more share.
    /// A backend that does not resolve is left for the caller that
    /// resolves it to report.
    fn check_duplicate_backends(&self) -> Result<()> {
        let mut seen: Vec<(&BackendSpec, Vec<SocketAddr>)> = Vec::new();
        for spec in &self.backends {
            let Ok(addrs) = spec.resolve() else {
                continue;
            };
            let twin = seen
                .iter()
                .find_map(|(s, a)| addrs.iter().find(|x| a.contains(x)).map(|x| (s, x)));
            if let Some((first, shared)) = twin {
                let (a, b) = (first.name(), spec.name());
                let spelled = if a == b {
                    format!("'{a}' is listed twice")
                } else {
                    format!("'{a}' and '{b}' both reach {shared}")
                };
                return Err(Error::setting(
                    "backends",
                    format!(
                        "names one server twice: {spelled}; list it once, and give it a \
                         larger share with a weight (e.g. {a},weight=2, with `algorithm` \
                         weighted-round-robin)"
                    ),
                ));
            }
            seen.push((spec, addrs));
        }
        Ok(())
    }

    /// The admin API's settings: loopback only unless allowed, and no
    /// admin detail without the API itself.
    fn validate_admin(&self) -> Result<()> {
        let Some(addr) = self.admin_listen else {
            if self.admin_token_file.is_some() {
                return Err(Error::setting("admin_token_file", "needs `admin_listen`"));
            }
            if self.admin_allow_remote {
                return Err(Error::setting("admin_allow_remote", "needs `admin_listen`"));
            }
            return Ok(());
        };
        if !addr.ip().is_loopback() && !self.admin_allow_remote {
            return Err(Error::setting(
                "admin_listen",
                format!(
                    "{addr} is not a loopback address: the admin API changes the \
                     backends, so it listens on loopback unless `admin_allow_remote` is given"
                ),
            ));
        }
        Ok(())
    }

    /// Refuses any duration setting under [`MIN_DURATION`] (this is where
    /// the floor is checked, for the flags and any other source alike).
    fn check_durations(&self) -> Result<()> {
        let p = &self.proxy;
        let h = &self.health;
        let mut durations = vec![
            ("connect_timeout", p.connect_timeout),
            ("idle_timeout", p.idle_timeout),
            ("queue_timeout", p.queue_timeout),
            ("drain_timeout", self.drain_timeout),
            ("health_interval", h.interval),
            ("health_timeout", h.timeout),
            ("health_cooldown", h.cooldown),
        ];
        let e = &p.ends;
        for (name, d) in [
            ("client_first_byte_timeout", p.client_first_byte_timeout),
            ("connect_retry_budget", p.connect_retry_budget),
            ("access_log_interval", self.access_log_interval),
            ("removed_drain_timeout", e.removed_drain_timeout),
            ("max_connection_lifetime", e.max_connection_lifetime),
            ("drain_spread", self.drain_spread),
        ] {
            durations.extend(d.map(|d| (name, d)));
        }
        if let Some(d) = p.tcp_user_timeout {
            // The kernel takes it as a 32-bit count of milliseconds.
            if d > MAX_TCP_USER_TIMEOUT {
                return Err(Error::setting(
                    "tcp_user_timeout",
                    format!("must be at most 4294967295ms (about 49 days), got {d:?}"),
                ));
            }
            durations.push(("tcp_user_timeout", d));
        }
        if let Some(d) = self.slow_start {
            // 0 is a common way to write "none" elsewhere: say the word.
            if d < MIN_DURATION || d > MAX_SLOW_START {
                return Err(Error::setting(
                    "slow_start",
                    format!("must be 1ms..1h, got {d:?}; leave it out (or \"off\" in a file) to turn it off"),
                ));
            }
        }
        if let Some(d) = self.worker_idle_timeout {
            if d < MIN_DURATION {
                // 0 is a common way to write "never" elsewhere: say the word.
                return Err(Error::setting(
                    "worker_idle_timeout",
                    format!("must be at least 1ms, got {d:?} (off keeps every worker)"),
                ));
            }
        }
        for (name, d) in durations {
            if d < MIN_DURATION {
                return Err(Error::setting(
                    name,
                    format!("must be at least 1ms, got {d:?}"),
                ));
            }
        }
        Ok(())
    }
}

/// A listening address, `IP:PORT`, for `--listen`, `--admin` and the
/// file's `listen` and `admin_listen`, with an example of the right form in
/// the error: `8080` or `::1:8080` alone are common slips.
pub fn parse_listen(text: &str) -> std::result::Result<SocketAddr, String> {
    let text = text.trim();
    if let Ok(addr) = text.parse() {
        return Ok(addr);
    }
    let hint = if text.parse::<u16>().is_ok() {
        format!("an address and a port are needed, e.g. 0.0.0.0:{text} or 127.0.0.1:{text}")
    } else if text.matches(':').count() > 1 && !text.starts_with('[') {
        match text.rsplit_once(':') {
            Some((ip, port)) => {
                format!("an IPv6 address goes in brackets before the port, e.g. [{ip}]:{port}")
            }
            None => "e.g. [::1]:8080".to_string(),
        }
    } else {
        "expected IP:PORT, e.g. 127.0.0.1:8080 or [::]:8080 (a numeric IP, not a name)".to_string()
    };
    Err(format!("'{text}' is not a listening address: {hint}"))
}

/// Bytes as `health_send` takes them: printable ASCII as it is, the rest
/// escaped (`\r`, `\n`, `\xHH`).
fn show_bytes(bytes: &[u8]) -> String {
    let mut out = String::new();
    for &b in bytes {
        match b {
            b'\r' => out.push_str("\\r"),
            b'\n' => out.push_str("\\n"),
            b'\\' => out.push_str("\\\\"),
            0x20..=0x7e => out.push(char::from(b)),
            _ => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    out
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
        assert_eq!(c.proxy.buffer_size, 4096);
        assert_eq!(c.algorithm, Algorithm::RoundRobin);
    }

    #[test]
    fn validation_names_the_bad_setting() {
        let mut c = Config {
            backends: vec![BackendSpec::parse("127.0.0.1:1").unwrap()],
            ..Config::default()
        };
        assert!(c.validate().is_ok());
        c.thread_stack = 1000;
        let err = c.validate().unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("thread_stack"), "{msg}");
        let flag = err.worded_as_flag().to_string();
        assert!(flag.contains("--thread-stack must be at least"), "{flag}");
        c.thread_stack = 65536;
        c.proxy.idle_timeout = Duration::ZERO;
        let flag = c.validate().unwrap_err().worded_as_flag().to_string();
        assert!(
            flag.contains("--idle-timeout must be at least 1ms"),
            "{flag}"
        );
    }

    #[test]
    fn the_admin_api_is_loopback_only_unless_allowed() {
        let mut c = Config {
            backends: vec![BackendSpec::parse("127.0.0.1:1").unwrap()],
            ..Config::default()
        };
        assert!(c.describe().iter().any(|(n, _)| *n == "admin_token_file"));
        c.admin_listen = Some("[::1]:9000".parse().unwrap());
        assert!(c.validate().is_ok());
        c.admin_listen = Some("0.0.0.0:9000".parse().unwrap());
        let flag = c.validate().unwrap_err().worded_as_flag().to_string();
        assert!(
            flag.contains("--admin 0.0.0.0:9000 is not a loopback"),
            "{flag}"
        );
        assert!(flag.contains("--admin-allow-remote is given"), "{flag}");
        c.admin_allow_remote = true;
        assert!(c.validate().is_ok());
        c.admin_listen = None;
        c.admin_token_file = Some("token".into());
        let err = c.validate().unwrap_err();
        assert!(
            err.to_string()
                .contains("admin_token_file needs `admin_listen`"),
            "{err}"
        );
    }

    #[test]
    fn durations_under_a_millisecond_are_refused() {
        let ok = Config {
            backends: vec![BackendSpec::parse("127.0.0.1:1").unwrap()],
            ..Config::default()
        };
        let mut c = ok.clone();
        c.proxy.connect_timeout = Duration::from_micros(500);
        let flag = c.validate().unwrap_err().worded_as_flag().to_string();
        assert!(
            flag.contains("--connect-timeout must be at least 1ms"),
            "{flag}"
        );
        let mut c = ok.clone();
        c.health.cooldown = Duration::from_micros(999);
        assert!(c.validate().is_err());
        let mut c = ok.clone();
        c.drain_timeout = Duration::ZERO;
        assert!(c.validate().is_err());
        let mut c = ok;
        c.proxy.idle_timeout = Duration::from_millis(1);
        assert!(c.validate().is_ok());
    }

    #[test]
    fn a_stack_over_1_gib_is_refused() {
        let mut c = Config {
            backends: vec![BackendSpec::parse("127.0.0.1:1").unwrap()],
            ..Config::default()
        };
        c.thread_stack = usize::MAX;
        let flag = c.validate().unwrap_err().worded_as_flag().to_string();
        assert!(flag.contains("--thread-stack must be at most"), "{flag}");
    }
}
