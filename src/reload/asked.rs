//! Where a reload is asked from: SIGHUP, the admin API's `POST /reload`
//! and its dry run. One [`Reloader`] answers all three.
//!
//! # Threads
//!
//! Only wiring: each hook runs on the thread that asks (the signal thread,
//! an admin API thread).
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C reads its backends once, at the prompt.

use std::sync::Arc;

use super::Reloader;
use crate::admin::DryRun;
use crate::balancer::Balancer;
use crate::signals::Signals;

impl Reloader {
    /// Makes this reloader the one SIGHUP, `POST /reload` and the dry run
    /// call. The signal's reload logs what it did, or why it refused; the
    /// API's answer carries the same words.
    pub fn answer_for(self, balancer: &mut Balancer, signals: &Signals) {
        let for_api = self.clone();
        balancer.set_reload(Arc::new(move || {
            for_api
                .reload()
                .map(|report| report.summary)
                .map_err(|err| err.to_string())
        }));
        let for_dry_run = self.clone();
        balancer.set_dry_run(Arc::new(move || {
            for_dry_run
                .dry_run()
                .map(|report| DryRun {
                    changes: report.changes,
                    needs_restart: report.needs_restart,
                })
                .map_err(|err| err.to_string())
        }));
        signals.on_reload(move || {
            let _ = self.reload();
        });
    }
}
