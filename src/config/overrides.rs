//! A partial configuration: only the settings that one source gave (the
//! flags, and later a config file), laid over a [`Config`] in order.
//!
//! Every field is an `Option`: `None` means "not given here", so the value
//! underneath (the default, or a lower layer) stays. That is what lets flags
//! override a file that overrides the defaults, with each default written
//! once, in its settings type.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C's settings are compiled in.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::Config;
use crate::backend::BackendSpec;
use crate::error::{Error, Result};
use crate::health::CheckKind;
use crate::limiter::{
    FailurePolicy, Rate, RateLimitAlgorithm as RuleKind, RateLimitConfig, RateLimitReply as Reply,
};
use crate::proxy_protocol::{CidrList, Version};
use crate::scheduler::Algorithm;
use crate::trace::Lang;

/// The settings one source gave; see the module docs. Field names are the
/// settings' names.
#[allow(missing_docs)]
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    pub listen: Option<SocketAddr>,
    pub backends: Option<Vec<BackendSpec>>,
    pub algorithm: Option<Algorithm>,
    pub workers: Option<usize>,
    pub thread_stack: Option<usize>,
    pub queue_capacity: Option<usize>,
    /// `Some(None)`: given as `off`.
    pub worker_idle_timeout: Option<Option<Duration>>,
    pub backlog: Option<i32>,
    pub buffer_size: Option<usize>,
    pub connect_timeout: Option<Duration>,
    pub idle_timeout: Option<Duration>,
    pub drain_timeout: Option<Duration>,
    pub splice: Option<bool>,
    pub yield_before_poll: Option<bool>,
    pub defer_accept: Option<bool>,
    pub health_check: Option<CheckKind>,
    pub health_interval: Option<Duration>,
    pub health_timeout: Option<Duration>,
    pub health_path: Option<String>,
    pub fall: Option<u32>,
    pub rise: Option<u32>,
    pub passive_failures: Option<u32>,
    pub health_cooldown: Option<Duration>,
    pub http_replies: Option<bool>,
    pub rate_limit: Option<Rate>,
    pub rate_limit_algorithm: Option<RuleKind>,
    pub rate_limit_max_clients: Option<usize>,
    pub rate_limit_ipv6_prefix: Option<u8>,
    pub rate_limit_reply: Option<Reply>,
    pub health_user: Option<String>,
    pub health_send: Option<Vec<u8>>,
    pub health_expect: Option<Vec<u8>>,
    pub trace: Option<bool>,
    pub trace_lang: Option<Lang>,
    pub admin_listen: Option<SocketAddr>,
    pub admin_allow_remote: Option<bool>,
    pub admin_token_file: Option<PathBuf>,
    pub queue_timeout: Option<Duration>,
    pub client_first_byte_timeout: Option<Duration>,
    pub fin_timeout: Option<Duration>,
    pub tcp_keepalive: Option<Duration>,
    pub send_proxy: Option<Version>,
    pub accept_proxy: Option<bool>,
    pub accept_proxy_from: Option<CidrList>,
    pub accept_proxy_timeout: Option<Duration>,
    pub rate_limit_store: Option<String>,
    pub rate_limit_store_timeout: Option<Duration>,
    pub rate_limit_store_failure: Option<FailurePolicy>,
    pub reuse_port: Option<bool>,
    pub access_log: Option<crate::access_log::Format>,
    pub access_log_file: Option<PathBuf>,
}

/// Sets `*slot` to the given value, if one was given.
fn set<T: Clone>(slot: &mut T, given: &Option<T>) {
    if let Some(value) = given {
        *slot = value.clone();
    }
}

impl Overrides {
    /// Lays these settings over `config`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSetting`] when a `rate_limit_*` setting is given and
    /// no rate limit is on, neither here nor in `config`: it would be
    /// silently ignored.
    pub fn apply(&self, config: &mut Config) -> Result<()> {
        set(&mut config.listen, &self.listen);
        set(&mut config.backends, &self.backends);
        set(&mut config.algorithm, &self.algorithm);
        set(&mut config.workers, &self.workers);
        set(&mut config.thread_stack, &self.thread_stack);
        set(&mut config.queue_capacity, &self.queue_capacity);
        set(&mut config.worker_idle_timeout, &self.worker_idle_timeout);
        set(&mut config.backlog, &self.backlog);
        set(&mut config.drain_timeout, &self.drain_timeout);
        set(&mut config.defer_accept, &self.defer_accept);
        set(&mut config.trace, &self.trace);
        set(&mut config.trace_lang, &self.trace_lang);
        if self.admin_listen.is_some() {
            config.admin_listen = self.admin_listen;
        }
        set(&mut config.admin_allow_remote, &self.admin_allow_remote);
        if self.admin_token_file.is_some() {
            config.admin_token_file.clone_from(&self.admin_token_file);
        }
        let p = &mut config.proxy;
        set(&mut p.buffer_size, &self.buffer_size);
        set(&mut p.connect_timeout, &self.connect_timeout);
        set(&mut p.idle_timeout, &self.idle_timeout);
        set(&mut p.splice, &self.splice);
        set(&mut p.yield_before_poll, &self.yield_before_poll);
        set(&mut p.queue_timeout, &self.queue_timeout);
        if let Some(d) = self.client_first_byte_timeout {
            p.client_first_byte_timeout = Some(d);
        }
        if let Some(d) = self.fin_timeout {
            p.fin_timeout = Some(d);
        }
        if let Some(d) = self.tcp_keepalive {
            p.tcp_keepalive = Some(d);
        }
        let h = &mut config.health;
        set(&mut h.check, &self.health_check);
        set(&mut h.interval, &self.health_interval);
        set(&mut h.timeout, &self.health_timeout);
        set(&mut h.path, &self.health_path);
        set(&mut h.fall, &self.fall);
        set(&mut h.rise, &self.rise);
        set(&mut h.passive_failures, &self.passive_failures);
        set(&mut h.cooldown, &self.health_cooldown);
        set(&mut h.http_replies, &self.http_replies);
        if self.health_user.is_some() {
            h.user.clone_from(&self.health_user);
        }
        if self.health_send.is_some() {
            h.send.clone_from(&self.health_send);
        }
        if self.health_expect.is_some() {
            h.expect.clone_from(&self.health_expect);
        }
        if self.send_proxy.is_some() {
            config.send_proxy = self.send_proxy;
        }
        set(&mut config.accept_proxy, &self.accept_proxy);
        set(&mut config.accept_proxy_from, &self.accept_proxy_from);
        set(&mut config.accept_proxy_timeout, &self.accept_proxy_timeout);
        if !config.accept_proxy {
            // Given at their default values (as a file listing every key
            // does), they change nothing: only other values need it.
            let defaults = Config::default();
            let given = [
                (
                    "accept_proxy_from",
                    self.accept_proxy_from
                        .as_ref()
                        .is_some_and(|v| *v != defaults.accept_proxy_from),
                ),
                (
                    "accept_proxy_timeout",
                    self.accept_proxy_timeout
                        .is_some_and(|v| v != defaults.accept_proxy_timeout),
                ),
            ];
            if let Some((name, _)) = given.iter().find(|(_, is_given)| *is_given) {
                return Err(Error::setting(*name, "needs `accept_proxy`"));
            }
        }
        set(&mut config.reuse_port, &self.reuse_port);
        if self.access_log.is_some() {
            config.access_log = self.access_log;
        }
        if self.access_log_file.is_some() {
            config.access_log_file.clone_from(&self.access_log_file);
        }
        let store = &mut config.rate_limit_store;
        if self.rate_limit_store.is_some() {
            store.url.clone_from(&self.rate_limit_store);
        }
        set(&mut store.timeout, &self.rate_limit_store_timeout);
        set(&mut store.failure, &self.rate_limit_store_failure);
        if let Some(rate) = self.rate_limit {
            match &mut config.rate_limit {
                Some(r) => r.rate = rate,
                none => *none = Some(RateLimitConfig::new(rate)),
            }
        }
        let Some(r) = &mut config.rate_limit else {
            let given = [
                ("rate_limit_algorithm", self.rate_limit_algorithm.is_some()),
                (
                    "rate_limit_max_clients",
                    self.rate_limit_max_clients.is_some(),
                ),
                (
                    "rate_limit_ipv6_prefix",
                    self.rate_limit_ipv6_prefix.is_some(),
                ),
                ("rate_limit_reply", self.rate_limit_reply.is_some()),
                ("rate_limit_store", self.rate_limit_store.is_some()),
                (
                    "rate_limit_store_timeout",
                    self.rate_limit_store_timeout.is_some(),
                ),
                (
                    "rate_limit_store_failure",
                    self.rate_limit_store_failure.is_some(),
                ),
            ];
            return match given.iter().find(|(_, is_given)| *is_given) {
                Some((name, _)) => Err(Error::setting(*name, "needs `rate_limit` N/WINDOW")),
                None => Ok(()),
            };
        };
        set(&mut r.algorithm, &self.rate_limit_algorithm);
        set(&mut r.max_clients, &self.rate_limit_max_clients);
        set(&mut r.ipv6_prefix, &self.rate_limit_ipv6_prefix);
        set(&mut r.reply, &self.rate_limit_reply);
        Ok(())
    }
}

impl Overrides {
    /// The names of the settings given here, as [`Config::describe`] and
    /// the config file name them: to tell which layer gave a bad value.
    pub fn given(&self) -> Vec<&'static str> {
        let o = self;
        [
            ("listen", o.listen.is_some()),
            ("backends", o.backends.is_some()),
            ("algorithm", o.algorithm.is_some()),
            ("workers", o.workers.is_some()),
            ("thread_stack", o.thread_stack.is_some()),
            ("queue_capacity", o.queue_capacity.is_some()),
            ("worker_idle_timeout", o.worker_idle_timeout.is_some()),
            ("backlog", o.backlog.is_some()),
            ("buffer_size", o.buffer_size.is_some()),
            ("connect_timeout", o.connect_timeout.is_some()),
            ("idle_timeout", o.idle_timeout.is_some()),
            ("drain_timeout", o.drain_timeout.is_some()),
            ("splice", o.splice.is_some()),
            ("yield_before_poll", o.yield_before_poll.is_some()),
            ("defer_accept", o.defer_accept.is_some()),
            ("health_check", o.health_check.is_some()),
            ("health_interval", o.health_interval.is_some()),
            ("health_timeout", o.health_timeout.is_some()),
            ("health_path", o.health_path.is_some()),
            ("fall", o.fall.is_some()),
            ("rise", o.rise.is_some()),
            ("passive_failures", o.passive_failures.is_some()),
            ("health_cooldown", o.health_cooldown.is_some()),
            ("http_replies", o.http_replies.is_some()),
            ("rate_limit", o.rate_limit.is_some()),
            ("rate_limit_algorithm", o.rate_limit_algorithm.is_some()),
            ("rate_limit_max_clients", o.rate_limit_max_clients.is_some()),
            ("rate_limit_ipv6_prefix", o.rate_limit_ipv6_prefix.is_some()),
            ("rate_limit_reply", o.rate_limit_reply.is_some()),
            ("health_user", o.health_user.is_some()),
            ("health_send", o.health_send.is_some()),
            ("health_expect", o.health_expect.is_some()),
            ("trace", o.trace.is_some()),
            ("trace_lang", o.trace_lang.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, given)| given.then_some(name))
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_later_layer_wins_and_keeps_what_it_does_not_name() {
        let mut c = Config::default();
        let file = Overrides {
            workers: Some(8),
            rate_limit: Some(Rate::parse("10/1s").unwrap()),
            rate_limit_reply: Some(Reply::Http),
            ..Overrides::default()
        };
        let flags = Overrides {
            workers: Some(16),
            rate_limit: Some(Rate::parse("20/10s").unwrap()),
            ..Overrides::default()
        };
        file.apply(&mut c).unwrap();
        flags.apply(&mut c).unwrap();
        assert_eq!(c.workers, 16);
        let r = c.rate_limit.unwrap();
        assert_eq!(r.rate, Rate::parse("20/10s").unwrap());
        assert_eq!(r.reply, Reply::Http, "the file's reply stays");
    }

    #[test]
    fn a_rate_limit_detail_without_a_rate_limit_is_an_error() {
        let o = Overrides {
            rate_limit_reply: Some(Reply::Http),
            ..Overrides::default()
        };
        let err = o.apply(&mut Config::default()).unwrap_err();
        assert!(
            matches!(&err, Error::InvalidSetting { setting, .. } if setting == "rate_limit_reply"),
            "{err}"
        );
    }
}
