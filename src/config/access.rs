//! The access log's settings checked together: each needs `access_log`,
//! a file target its path, and interim lines a sane interval.
//!
//! Pure functions of a [`Config`], on the thread that validates it.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::time::Duration;

use super::Config;
use crate::access_log::Destination;
use crate::error::{Error, Result};

/// The shortest `access_log_interval`: thousands of connections writing
/// a line each every few milliseconds would be the balancer's whole work.
pub const MIN_ACCESS_LOG_INTERVAL: Duration = Duration::from_millis(100);

impl Config {
    /// Whether the access log writes to standard output.
    pub fn access_log_on_stdout(&self) -> bool {
        let syslog = self
            .access_log_target
            .as_ref()
            .is_some_and(|t| t.is_syslog());
        self.access_log.is_some() && self.access_log_file.is_none() && !syslog
    }

    /// The access log's settings: each needs `access_log` (it would be
    /// ignored otherwise), and the target its file.
    pub(super) fn validate_access_log(&self) -> Result<()> {
        let given = [
            ("access_log_file", self.access_log_file.is_some()),
            ("access_log_format", self.access_log_format.is_some()),
            ("access_log_target", self.access_log_target.is_some()),
            ("access_log_interval", self.access_log_interval.is_some()),
            ("access_log_at_connect", self.access_log_at_connect),
        ];
        if let Some((key, _)) = given.iter().find(|(_, on)| *on) {
            if self.access_log.is_none() {
                return Err(Error::setting(*key, "needs `access_log`"));
            }
        }
        if self
            .access_log_interval
            .is_some_and(|d| d < MIN_ACCESS_LOG_INTERVAL)
        {
            let why = "must be at least 100ms (or off)";
            return Err(Error::setting("access_log_interval", why));
        }
        match (&self.access_log_target, &self.access_log_file) {
            (Some(Destination::File), None) => Err(Error::setting(
                "access_log_target",
                "file needs `access_log_file`",
            )),
            (Some(Destination::Stdout | Destination::Syslog(_)), Some(_)) => Err(Error::setting(
                "access_log_file",
                "is not used with this `access_log_target` (give `file`, or leave it out)",
            )),
            _ => Ok(()),
        }
    }
}
