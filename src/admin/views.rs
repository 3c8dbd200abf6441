//! The admin API's views of what runs: a backend as JSON, a backend's
//! row and the sections of the stats page. Read only: each reads the
//! scheduler's snapshot and the backends' atomics, on the admin handler
//! thread that serves the request; the charts' lock is held only while a
//! section is built.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C shows nothing of its servers.

use std::time::UNIX_EPOCH;

use serde_json::{json, Value};

use super::State;
use crate::backend::Backend;

/// `GET /`: the stats page, one section per service.
pub(super) fn stats_page(state: &State) -> String {
    use super::page::{self, Process, Section};
    let stats = state.sources.stats.snapshot();
    let now = std::time::SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let sections: Vec<Section> = state
        .running
        .list()
        .iter()
        .map(|service| {
            let own = service.stats.own();
            let rate_limit = service
                .live
                .limiter
                .load()
                .as_ref()
                .map_or("off".to_string(), |l| l.config().rate.to_string());
            let listen: Vec<String> = state
                .running
                .addrs(service.name())
                .iter()
                .map(|a| a.to_string())
                .collect();
            let charts = state.charts.lock();
            Section {
                name: service.name().to_string(),
                listen: listen.join(" "),
                accepted: own.accepted,
                refused: own.rate_limited + own.no_backend + own.queue_timeouts + own.queue_full,
                active: own.active,
                queued: own.queued,
                algorithm: service.live.scheduler.algorithm().name().to_string(),
                rate_limit,
                bytes_in: own.bytes_to_backends,
                bytes_out: own.bytes_to_clients,
                errors: own.errors + own.accept_errors,
                chart: charts.points(service.name()),
                backends: service
                    .live
                    .scheduler
                    .snapshot()
                    .iter()
                    .map(|b| backend_row(b, charts.backend_rate(b.id())))
                    .collect(),
                certificates: service
                    .live
                    .tls
                    .as_ref()
                    .map(|t| super::certificates::rows(&t.load(), now))
                    .unwrap_or_default(),
            }
        })
        .collect();
    let process = Process {
        queued: (state.sources.queued)() as u64,
        busy: stats.workers_busy,
        max_workers: state.config.workers as u64,
        uptime: state.started.elapsed(),
        connections: super::connections::page_tables(super::connections::owner_of(
            &state.sources.stats,
        )),
    };
    page::render(&process, &sections)
}

/// A backend's row on the stats page, with its rate from the sampler.
fn backend_row(b: &Backend, rate: Option<f64>) -> super::page::BackendRow {
    let check = b.last_check();
    let tally = &b.tally;
    super::page::BackendRow {
        peak: tally.peak(),
        rate,
        resets: tally.resets(),
        timeouts: tally.timeouts(),
        progress: tally.progress(),
        toward_up: !b.is_healthy(),
        checked_ago: check.as_ref().map(|c| c.at.elapsed().unwrap_or_default()),
        downtime: b.tally.downtime(),
        origin: b.origin().name(),
        agent: agent_summary(b),
        name: b.name().to_string(),
        state: b.state_name().to_string(),
        backup: b.is_backup(),
        weight: b.weight(),
        active: b.active() as u64,
        max_connections: b.max_connections(),
        total: b.total(),
        bytes_in: b.bytes_to_backend(),
        bytes_out: b.bytes_to_client(),
        connect_failures: b.connect_failures_total(),
        last_check: check
            .as_ref()
            .map(|c| c.error.clone().unwrap_or_else(|| "ok".into())),
        check_duration: check.map(|c| c.took),
        since_change: Some(b.since_change()),
    }
}

/// What its agent last said, for the stats page (`up 50%`, `garbage:
/// ...`), when it has one.
fn agent_summary(b: &Backend) -> Option<String> {
    b.own_check().agent_port?;
    let said = match b.agent.last() {
        None => "not asked yet".to_string(),
        Some(last) => last.error.or(last.answer).unwrap_or_default(),
    };
    Some(said)
}

/// Its agent as the API shows it, when it has one.
fn agent_json(b: &Backend) -> Option<Value> {
    let port = b.own_check().agent_port?;
    let last = b.agent.last();
    Some(json!({
        "port": port,
        "state": if b.agent.says_down() { "down" } else { "up" },
        "weight_percent": b.agent.percent(),
        "answer": last.as_ref().and_then(|l| l.answer.clone()),
        "error": last.as_ref().and_then(|l| l.error.clone()),
        "at_unix_ms": last.map(|l| l.at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)),
    }))
}

/// A backend as the API shows it.
pub fn backend_json(b: &Backend) -> Value {
    let state = b.state_name();
    let last_check = b.last_check().map(|c| {
        json!({
            "result": if c.error.is_none() { "ok" } else { "failed" },
            "error": c.error,
            "at_unix_ms": c.at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
            // Whole microseconds, so the number prints short.
            "took_ms": c.took.as_micros() as f64 / 1000.0,
        })
    });
    let addresses: Vec<String> = b.addrs().iter().map(ToString::to_string).collect();
    let resolve = b.addresses().lookup().map(|l| {
        let last = l.last();
        json!({
            "name": l.host(),
            "result": last.as_ref().map(|r| if r.error.is_none() { "ok" } else { "failed" }),
            "error": last.as_ref().and_then(|r| r.error.clone()),
            "at_unix_ms": last.map(|r| r.at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)),
            "failures": l.failures(),
        })
    });
    let mut value = json!({
        "address": b.name(),
        "addresses": addresses,
        "resolve": resolve,
        "weight": b.weight(),
        "configured_weight": b.configured_weight(),
        "origin": b.origin().name(),
        "agent": agent_json(b),
        "backup": b.is_backup(),
        "state": state,
        "active": b.active(),
        "max_connections": b.max_connections(),
        "pending": b.pending(),
        "total": b.total(),
        "bytes_to_backend": b.bytes_to_backend(),
        "bytes_to_client": b.bytes_to_client(),
        "connect_failures": b.connect_failures_total(),
        "connect_failures_in_a_row": b.connect_failures_in_a_row(),
        "last_check": last_check,
    });
    // Where it is checked, and how, when that is its own.
    if let Some(target) = b.check_target() {
        value["check_target"] = json!(target);
    }
    let own = b.own_check();
    if !own.is_empty() {
        value["own_check"] = json!(own.to_string()[1..]);
    }
    value
}
