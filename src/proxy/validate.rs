//! Checking [`ProxyConfig`]'s values, each against its own range, before
//! they are used: at start-up, on a reload and on an admin change.
//!
//! # Threads
//!
//! Runs on whichever thread reads a configuration; reads nothing shared.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C takes its `#define`s as they are.

use std::time::Duration;

use super::{
    ProxyConfig, MAX_BUFFER_SIZE, MAX_RESOLVE_INTERVAL, MAX_TCP_KEEPALIVE, MIN_RESOLVE_INTERVAL,
};
use crate::error::{Error, Result};

impl ProxyConfig {
    /// Checks that every value is usable.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSetting`] naming the first bad setting.
    pub fn validate(&self) -> Result<()> {
        if self.buffer_size == 0 || self.buffer_size > MAX_BUFFER_SIZE {
            return Err(Error::setting(
                "buffer_size",
                format!(
                    "must be 1..{MAX_BUFFER_SIZE} bytes, got {}",
                    self.buffer_size
                ),
            ));
        }
        for (name, d) in [
            ("connect_timeout", self.connect_timeout),
            ("idle_timeout", self.idle_timeout),
            ("queue_timeout", self.queue_timeout),
        ] {
            if d.is_zero() {
                return Err(Error::setting(name, "must be more than 0"));
            }
        }
        if self.client_first_byte_timeout == Some(Duration::ZERO) {
            return Err(Error::setting(
                "client_first_byte_timeout",
                "must be more than 0",
            ));
        }
        if self.max_connections_per_client == Some(0) {
            return Err(Error::setting(
                "max_connections_per_client",
                "must be at least 1 (or off)",
            ));
        }
        if self.fin_timeout.is_some_and(|d| d.is_zero()) {
            return Err(Error::setting("fin_timeout", "must be more than 0"));
        }
        self.ends.validate()?;
        if let Some(idle) = self.tcp_keepalive {
            // The kernel counts these in whole seconds.
            if idle < Duration::from_secs(1) || idle > MAX_TCP_KEEPALIVE || idle.subsec_nanos() != 0
            {
                return Err(Error::setting(
                    "tcp_keepalive",
                    format!(
                        "must be 1s..{}s (whole seconds), got {idle:?}",
                        MAX_TCP_KEEPALIVE.as_secs()
                    ),
                ));
            }
        }
        if let Some(every) = self.resolve_interval {
            if !(MIN_RESOLVE_INTERVAL..=MAX_RESOLVE_INTERVAL).contains(&every) {
                return Err(Error::setting(
                    "resolve_interval",
                    format!(
                        "must be 1s..24h (or off), got {}",
                        crate::units::format_duration(every)
                    ),
                ));
            }
        }
        Ok(())
    }
}
