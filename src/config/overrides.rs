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

use super::{Config, Overrides};
use crate::error::{Error, Result};
use crate::limiter::RateLimitConfig;

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
        self.lay(config);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Rate, RateLimitReply};

    #[test]
    fn a_later_layer_wins_and_keeps_what_it_does_not_name() {
        let mut c = Config::default();
        let file = Overrides {
            workers: Some(8),
            rate_limit: Some(Rate::parse("10/1s").unwrap()),
            rate_limit_reply: Some(RateLimitReply::Http),
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
        assert_eq!(r.reply, RateLimitReply::Http, "the file's reply stays");
    }

    #[test]
    fn a_rate_limit_detail_without_a_rate_limit_is_an_error() {
        let o = Overrides {
            rate_limit_reply: Some(RateLimitReply::Http),
            ..Overrides::default()
        };
        let err = o.apply(&mut Config::default()).unwrap_err();
        assert!(
            matches!(&err, Error::InvalidSetting { setting, .. } if setting == "rate_limit_reply"),
            "{err}"
        );
    }
}
