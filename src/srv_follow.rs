//! A service's `srv:` entries followed: each looked up again at its
//! answer's TTL (at least 1 s, at most the service's `resolve_interval`,
//! or a day), and the service's backends changed in place to match: a new
//! record's backend added, a record gone drained (its connections go on)
//! and removed once its last one ends, a record back served again, a
//! changed weight, priority or address set on the same backend. A failed
//! lookup (silence, garbage, an error code) keeps the backends as they
//! are, is retried after [`RETRY`], and is warned about once an hour per
//! name ([`lookup::FAILURE_LOG_EVERY`]).
//!
//! # Threads
//!
//! Runs on the resolver thread (`resolver.rs`), which keeps each entry's
//! `Group`; `backends` also runs once per entry when a service starts.
//! Changes go through the scheduler (`add`, `remove`, `refresh`,
//! `set_backup`) and the backend's [`Backend::set_wanted`], as the admin
//! API's do.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C's servers are typed in.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::{Backend, BackendSpec, Origin, Wanted};
use crate::lookup;
use crate::proxy_protocol::Version;
use crate::scheduler::Scheduler;
use crate::srv::{self, Answer};
use crate::throttle::LogThrottle;

/// Soonest look-up again of a name: as `resolve_interval`'s lower limit.
pub const MIN_AGAIN: Duration = Duration::from_secs(1);

/// Latest, without `resolve_interval`: as its upper limit, a day.
pub const MAX_AGAIN: Duration = Duration::from_secs(24 * 3600);

/// Wait before asking again after a failed lookup.
pub const RETRY: Duration = Duration::from_secs(5);

/// One `srv:` entry of a service.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// The entry as written (`srv:NAME` and its options).
    pub spec: BackendSpec,
    /// The service's `send_proxy`, for the entry's backends.
    pub send_proxy: Option<Version>,
}

/// What the resolver thread keeps of one entry between rounds.
#[derive(Debug)]
pub(crate) struct Group {
    /// When it is next looked up.
    due: Instant,
    /// Its backends draining because their record went, by id.
    retiring: Vec<u64>,
    /// Failed lookups and cut answers: a line an hour.
    log: LogThrottle,
}

impl Default for Group {
    fn default() -> Self {
        Group {
            due: Instant::now(),
            retiring: Vec::new(),
            log: LogThrottle::new(lookup::FAILURE_LOG_EVERY),
        }
    }
}

/// The name of a `srv:` entry, without its prefix.
fn name(spec: &BackendSpec) -> &str {
    spec.host
        .strip_prefix(crate::backend::SRV_PREFIX)
        .unwrap_or(&spec.host)
}

/// The nameservers to ask: `resolvers`, or the system's.
pub(crate) fn servers(resolvers: Option<&srv::Nameservers>) -> Vec<SocketAddr> {
    resolvers.map_or_else(srv::system_nameservers, |n| n.0.clone())
}

/// Looks `entry` up and makes one backend per record (not yet in any
/// list); the best priority's are primaries, the others backups.
///
/// # Errors
///
/// The lookup's, in words.
pub(crate) fn backends(entry: &Entry, servers: &[SocketAddr]) -> Result<Vec<Arc<Backend>>, String> {
    let answer = srv::lookup(name(&entry.spec), servers)?;
    Ok(made(entry, &answer))
}

/// The backends of `answer`'s records.
fn made(entry: &Entry, answer: &Answer) -> Vec<Arc<Backend>> {
    let best = answer.records.first().map_or(0, |r| r.priority);
    answer
        .records
        .iter()
        .map(|r| {
            let spec = entry
                .spec
                .for_record(&r.target, r.port, r.weight, r.priority > best);
            let backend = Backend::new(spec.name(), r.addrs.clone(), spec.weight)
                .with_source(Origin::Srv, &entry.spec.host)
                .with_send_proxy(spec.send_proxy.or(entry.send_proxy))
                .with_own_check(spec.check.clone())
                .with_backup(spec.backup)
                .with_ends(spec.ends);
            backend.set_max_connections(spec.max_connections);
            Arc::new(backend)
        })
        .collect()
}

/// Looks `entry` up if it is due and applies the answer to `scheduler`;
/// removes its drained backends whose last connection ended. Returns
/// when it is next due. `most`: the longest wait between two lookups.
pub(crate) fn follow(
    entry: &Entry,
    servers: &[SocketAddr],
    scheduler: &Scheduler,
    group: &mut Group,
    most: Duration,
) -> Instant {
    reap(&entry.spec.host, scheduler, group);
    let now = Instant::now();
    if group.due > now {
        return group.due;
    }
    match srv::lookup(name(&entry.spec), servers) {
        Ok(answer) => {
            if answer.left_out > 0 {
                if let Some(missed) = group.log.event(now) {
                    log::warn!(
                        "{}: {} records past the first {} left out{}",
                        entry.spec.host,
                        answer.left_out,
                        srv::MAX_RECORDS,
                        crate::throttle::more(missed)
                    );
                }
            }
            apply(&entry.spec.host, scheduler, group, &made(entry, &answer));
            group.due = Instant::now() + answer.ttl.clamp(MIN_AGAIN, most.max(MIN_AGAIN));
        }
        Err(e) => {
            if let Some(missed) = group.log.event(now) {
                let kept = scheduler
                    .snapshot()
                    .iter()
                    .filter(|b| b.source_name() == Some(&entry.spec.host))
                    .count();
                log::warn!(
                    "{}: looking it up again failed: {e}; its {kept} backends stay as they are{}",
                    entry.spec.host,
                    crate::throttle::more(missed)
                );
            }
            group.due = Instant::now() + RETRY.min(most.max(MIN_AGAIN));
        }
    }
    group.due
}

/// Makes the backends of source `host` (a `srv:` name, an etcd source)
/// in `scheduler` those of `wanted`; `etcd_follow.rs` uses it too.
pub(crate) fn apply(host: &str, scheduler: &Scheduler, group: &mut Group, wanted: &[Arc<Backend>]) {
    let mine: Vec<Arc<Backend>> = scheduler
        .snapshot()
        .iter()
        .filter(|b| b.source_name() == Some(host))
        .cloned()
        .collect();
    for w in wanted {
        let Some(b) = mine.iter().find(|b| b.name() == w.name()) else {
            log::info!("{host}: backend {} added (weight {})", w.name(), w.weight());
            scheduler.add(Arc::clone(w));
            continue;
        };
        if b.addresses().replace(w.addrs().to_vec()) {
            log::info!(
                "{host}: backend {} now at {}",
                b.name(),
                lookup::list(&w.addrs())
            );
        }
        if b.configured_weight() != w.configured_weight() {
            b.set_weight(w.configured_weight());
            scheduler.refresh();
        }
        if b.is_backup() != w.is_backup() {
            scheduler.set_backup(b.id(), w.is_backup());
        }
        if let Some(pos) = group.retiring.iter().position(|id| *id == b.id()) {
            group.retiring.remove(pos);
            b.set_wanted(Wanted::Ready);
            log::info!(
                "{host}: backend {} is back in the records: serving it again",
                b.name()
            );
        }
    }
    for b in &mine {
        if wanted.iter().any(|w| w.name() == b.name()) || group.retiring.contains(&b.id()) {
            continue;
        }
        b.set_wanted(Wanted::Drain);
        group.retiring.push(b.id());
        log::info!(
            "{host}: backend {} is gone from the records: draining, removed once its connections end",
            b.name()
        );
    }
}

/// Removes the drained backends of source `host` that no connection uses
/// any more.
pub(crate) fn reap(host: &str, scheduler: &Scheduler, group: &mut Group) {
    group.retiring.retain(|id| {
        let Some(b) = scheduler.find(|b| b.id() == *id) else {
            return false;
        };
        if b.active() + b.pending() > 0 {
            return true;
        }
        scheduler.remove(*id);
        log::info!("{host}: backend {} removed", b.name());
        false
    });
}
