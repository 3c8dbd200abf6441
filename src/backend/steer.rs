//! Who steers a backend besides its health checks: the operator's
//! [`Wanted`] state (drain, maintenance, ready), asked through the admin
//! API or by the backend's own agent, and the agent's view ([`AgentView`]:
//! its "down", its weight as a share of the configured one, its last
//! answer).
//!
//! One decision, one place: the admin API's `PUT /backends/{address}` and
//! the agent check (`health/agent.rs`) both call [`Backend::set_wanted`];
//! a backend's weight is decided by [`Backend::weight`] alone (the
//! configured weight scaled by the agent's percentage); the agent's "down"
//! counts in [`Backend::is_available`] beside the checks' opinion, so
//! neither undoes the other (HAProxy's `agent-check`: a server is up when
//! its health check and its agent both say so).
//!
//! # Threads
//!
//! Atomics, set by the admin handlers and the health thread, read by the
//! accept loops' schedulers; the agent's last answer sits behind a lock
//! taken once per agent check and per `/backends` listing.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C's servers are always in rotation.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use serde::Deserialize;

use super::Backend;
use crate::throttle::LogThrottle;

/// The states an operator (or an agent) may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Wanted {
    /// No new clients; connections in flight finish.
    Drain,
    /// As drain, and no health checks.
    Maint,
    /// Back in rotation (clears drain and maintenance).
    Ready,
}

impl Wanted {
    /// The word the API and the logs use.
    pub fn word(self) -> &'static str {
        match self {
            Wanted::Drain => "draining",
            Wanted::Maint => "in maintenance",
            Wanted::Ready => "ready",
        }
    }
}

/// The agent's last answer, as the admin API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentRecord {
    /// The line it sent (printable characters only, at most 80), or
    /// `None` when it sent none.
    pub answer: Option<String>,
    /// Why the answer was not applied (no connection, a timeout, garbage),
    /// or `None` when it was.
    pub error: Option<String>,
    /// When the exchange ended.
    pub at: SystemTime,
    /// How long it took.
    pub took: Duration,
}

/// What the backend's agent last said of it: kept on the backend.
#[derive(Debug)]
pub struct AgentView {
    /// True while the agent says `down` (or `fail`, `stopped`).
    down: AtomicBool,
    /// Its weight as a percentage of the configured one (`NN%`); 100
    /// until an agent says otherwise.
    percent: AtomicU32,
    /// The last exchange, for `/backends` and the stats page.
    last: Mutex<Option<AgentRecord>>,
    /// Its failed or refused answers: one warning a second at most.
    pub(crate) log: LogThrottle,
}

impl Default for AgentView {
    fn default() -> Self {
        AgentView {
            down: AtomicBool::new(false),
            percent: AtomicU32::new(100),
            last: Mutex::new(None),
            log: LogThrottle::new(Duration::from_secs(1)),
        }
    }
}

impl AgentView {
    /// Whether the agent says the backend is down.
    pub fn says_down(&self) -> bool {
        self.down.load(Ordering::Relaxed)
    }

    /// The weight's percentage the agent asked for (100 by default).
    pub fn percent(&self) -> u32 {
        self.percent.load(Ordering::Relaxed)
    }

    /// Sets the percentage; true when it changed (the scheduler then has
    /// to be refreshed: it precomputes from the weights).
    pub fn set_percent(&self, percent: u32) -> bool {
        self.percent.swap(percent, Ordering::Relaxed) != percent
    }

    /// `configured` scaled by the agent's percentage, at least 1 (a
    /// weight of 0 is not a weight: `drain` stops new connections).
    pub(super) fn scale(&self, configured: u32) -> u32 {
        let scaled = u64::from(configured) * u64::from(self.percent()) / 100;
        u32::try_from(scaled).unwrap_or(u32::MAX).max(1)
    }

    /// Keeps the last exchange.
    pub fn record(&self, record: AgentRecord) {
        *self.last.lock() = Some(record);
    }

    /// The last exchange, if an agent was asked.
    pub fn last(&self) -> Option<AgentRecord> {
        self.last.lock().clone()
    }
}

impl Backend {
    /// Puts it in the state an operator or its agent asked for: the one
    /// place where drain and maintenance are set together.
    pub fn set_wanted(&self, wanted: Wanted) {
        let (draining, maint) = match wanted {
            Wanted::Drain => (true, false),
            Wanted::Maint => (false, true),
            Wanted::Ready => (false, false),
        };
        self.set_draining(draining);
        self.set_maint(maint);
    }

    /// Records the agent's `down` (true) or `up` (false); true when it
    /// changed. Told to the schedulers like any flip of its state.
    pub fn set_agent_down(&self, down: bool) -> bool {
        let changed = self.agent.down.swap(down, Ordering::Relaxed) != down;
        if changed {
            self.changed();
        }
        changed
    }

    /// The weight as configured (the file, `PUT /backends`, a reload),
    /// before the agent's percentage.
    pub fn configured_weight(&self) -> u32 {
        self.weight.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_scales_the_configured_weight_and_its_down_counts() {
        let b = Backend::new("b".into(), vec![], 10);
        assert_eq!((b.weight(), b.configured_weight()), (10, 10));
        assert!(b.agent.set_percent(50));
        assert!(!b.agent.set_percent(50));
        assert_eq!((b.weight(), b.configured_weight()), (5, 10));
        b.agent.set_percent(0);
        assert_eq!(b.weight(), 1, "never 0");
        b.agent.set_percent(100);
        assert!(b.set_agent_down(true));
        assert!(!b.is_available() && b.is_healthy());
        assert_eq!(b.state_name(), "down");
        assert!(b.set_agent_down(false));
        assert!(b.is_available());
        b.set_wanted(Wanted::Maint);
        assert!(b.is_maint() && !b.is_draining());
        b.set_wanted(Wanted::Drain);
        assert!(!b.is_maint() && b.is_draining());
        b.set_wanted(Wanted::Ready);
        assert!(b.is_available());
    }
}
