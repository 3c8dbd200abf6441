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
use std::time::Duration;

use super::Config;
use crate::backend::BackendSpec;
use crate::error::{Error, Result};
use crate::health::CheckKind;
use crate::limiter::{Rate, RateLimitConfig, Reply, RuleKind};
use crate::scheduler::Algorithm;

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
        set(&mut config.backlog, &self.backlog);
        set(&mut config.drain_timeout, &self.drain_timeout);
        set(&mut config.defer_accept, &self.defer_accept);
        let p = &mut config.proxy;
        set(&mut p.buffer_size, &self.buffer_size);
        set(&mut p.connect_timeout, &self.connect_timeout);
        set(&mut p.idle_timeout, &self.idle_timeout);
        set(&mut p.splice, &self.splice);
        set(&mut p.yield_before_poll, &self.yield_before_poll);
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
