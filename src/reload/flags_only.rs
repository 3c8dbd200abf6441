//! The reload of a balancer started without a config file, and what
//! every reload reads again besides the file: the TLS files and the admin
//! token. Settings stay as they run (the admin API's changes too).
//!
//! # Threads
//!
//! Runs on the reloading thread, under the reloader's lock.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C reads its backends once, at the prompt.

use std::sync::Arc;

use crate::config::Config;
use crate::error::Result;
use crate::stats::Stats;
use crate::tls_term::Terminator;

use super::{ReloadReport, Reloader, State};

impl Reloader {
    /// A reload without a config file: every setting stays as it runs
    /// (the admin API's changes too); each service's TLS files (the
    /// certificates and keys, its CAs and CRLs) and the admin token file
    /// are read again, all of them before any is swapped, so a bad file
    /// changes nothing.
    pub(super) fn reload_files(&self, state: &State) -> Result<ReloadReport> {
        let inner = &self.inner;
        let mut loaded = Vec::new();
        for config in state.config.service_list() {
            let Some(service) = inner.running.find(&config.name) else {
                continue;
            };
            let Some(running) = &service.live.tls else {
                continue;
            };
            match Terminator::load_after(&config.tls, Some(&running.load())) {
                Ok(Some(terminator)) => loaded.push((Arc::clone(running), terminator)),
                Ok(None) => {}
                Err(err) => {
                    Stats::incr(&inner.stats.reloads_failed);
                    log::error!("reload refused, the running settings stay: {err}");
                    return Err(err);
                }
            }
        }
        let token = match self.read_token(&state.config) {
            Ok(token) => token,
            Err(err) => {
                Stats::incr(&inner.stats.reloads_failed);
                log::error!("reload refused, the running settings stay: {err}");
                return Err(err);
            }
        };
        let summary = if loaded.is_empty() {
            "reload: no change"
        } else {
            "reload: certificates read again"
        };
        for (running, terminator) in loaded {
            running.store(Arc::new(terminator));
        }
        if let (Some(cell), Some(token)) = (&inner.token, token) {
            cell.set(token);
        }
        Stats::incr(&inner.stats.reloads_ok);
        log::info!("{summary}");
        Ok(ReloadReport {
            summary: summary.to_string(),
            ..ReloadReport::default()
        })
    }

    /// The admin token, its file (`admin_token_file`, restart-only: the
    /// running one) read again, when the API checks one: a rotated token
    /// takes effect at the reload.
    pub(super) fn read_token(&self, running: &Config) -> Result<Option<String>> {
        match (&self.inner.token, &running.admin_token_file) {
            (Some(_), Some(path)) => crate::admin::read_token(path).map(Some),
            _ => Ok(None),
        }
    }
}
