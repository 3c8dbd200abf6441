//! The resolver thread: looks the backends' host names up again every
//! `resolve_interval` (nginx's `resolve`, HAProxy's `resolvers`), so a
//! backend whose name moved (a container restarted with a new address)
//! gets new connections at its new address while those in flight finish.
//!
//! # Threads
//!
//! One thread per process (`rodizio-resolve`), started the first time a
//! service has `resolve_interval` (at start-up or by a reload) and ending
//! at shutdown. It alone calls the resolver on a timer: a lookup may wait
//! seconds for a DNS server, which no worker and no accept loop should.
//! Each round it asks for the services' lists (`Watch`), looks up the
//! names that are due, then sleeps until the next one is due, or
//! [`IDLE_WAIT`] at most so a reload's new interval is seen soon. It also
//! follows the services' `srv:` entries (`srv_follow.rs`), whether or not
//! `resolve_interval` is set.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C resolves each server once, at the prompt.

use std::collections::HashMap;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::RecvTimeoutError;
use parking_lot::Mutex;

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::scheduler::Scheduler;
use crate::shutdown::Shutdown;
use crate::srv::Nameservers;
use crate::srv_follow::{self, Group};

/// The longest sleep between two rounds: how soon a reload that turns
/// `resolve_interval` on or shortens it is followed.
pub const IDLE_WAIT: Duration = Duration::from_secs(1);

/// One service's backends and how often their names are looked up.
pub(crate) struct Watched {
    /// The service's `resolve_interval`, if set.
    pub interval: Option<Duration>,
    /// Its backends now.
    pub backends: Arc<[Arc<Backend>]>,
    /// The service's name, which keys its `srv:` entries' state.
    pub service: String,
    /// Its scheduler, which `srv:` entries change.
    pub scheduler: Arc<Scheduler>,
    /// Its `srv:` entries.
    pub srv: Vec<srv_follow::Entry>,
    /// Its `resolvers`.
    pub resolvers: Option<Nameservers>,
}

/// What the thread asks each round: the services with `resolve_interval`
/// set or `srv:` entries, or `None` once the balancer is gone.
pub(crate) type Watch = Box<dyn Fn() -> Option<Vec<Watched>> + Send>;

/// The resolver thread of a process, once started.
#[derive(Debug, Default)]
pub(crate) struct Resolver {
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Resolver {
    /// Starts the thread unless it runs already or no service has
    /// `resolve_interval` (`watch` gives none); it stops on `stop`.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when the thread cannot be started.
    pub(crate) fn start_once(&self, stop: &Shutdown, watch: Watch) -> Result<()> {
        let mut thread = self.thread.lock();
        if thread.is_some() || watch().map_or(true, |list| list.is_empty()) {
            return Ok(());
        }
        let stop = stop.clone();
        let handle = std::thread::Builder::new()
            .name("rodizio-resolve".into())
            .spawn(move || run(&stop, &watch))
            .map_err(|e| Error::io("starting the resolver thread", e))?;
        *thread = Some(handle);
        Ok(())
    }
}

/// The thread's loop: a round, then a sleep cut short by the shutdown.
fn run(stop: &Shutdown, watch: &Watch) {
    let wake = stop.receiver();
    let mut groups: HashMap<String, Group> = HashMap::new();
    while !stop.is_triggered() {
        let Some(list) = watch() else {
            return;
        };
        let wait = round(&list).min(follow_srv(&list, &mut groups));
        match wake.recv_timeout(wait) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// Looks up every name that is due; returns how long until the next one
/// is (at most [`IDLE_WAIT`]).
fn round(list: &[Watched]) -> Duration {
    let mut next = IDLE_WAIT;
    for service in list {
        let Some(interval) = service.interval else {
            continue;
        };
        for b in service.backends.iter() {
            let Some(lookup) = b.addresses().lookup() else {
                continue;
            };
            let mut due = lookup.due_in(interval);
            if due.is_zero() {
                b.addresses().resolve_again(b.name());
                due = interval;
            }
            next = next.min(due);
        }
    }
    next
}

/// Follows every service's `srv:` entries that are due (`groups` keeps
/// each one's state, by service and name); returns how long until the
/// next is due (at most [`IDLE_WAIT`]).
fn follow_srv(list: &[Watched], groups: &mut HashMap<String, Group>) -> Duration {
    let mut next = Instant::now() + IDLE_WAIT;
    let mut seen = Vec::new();
    for service in list.iter().filter(|s| !s.srv.is_empty()) {
        let servers = srv_follow::servers(service.resolvers.as_ref());
        let most = service.interval.unwrap_or(srv_follow::MAX_AGAIN);
        for entry in &service.srv {
            let key = format!("{}\n{}", service.service, entry.spec.host);
            let group = groups.entry(key.clone()).or_default();
            next = next.min(srv_follow::follow(
                entry,
                &servers,
                &service.scheduler,
                group,
                most,
            ));
            seen.push(key);
        }
    }
    // Services and entries gone (a reload) are forgotten.
    groups.retain(|key, _| seen.contains(key));
    next.saturating_duration_since(Instant::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::BackendSpec;

    fn watched(interval: Duration, backends: Vec<Arc<Backend>>) -> Watched {
        Watched {
            interval: Some(interval),
            backends: backends.into(),
            service: "default".into(),
            scheduler: Arc::new(Scheduler::new(vec![])),
            srv: Vec::new(),
            resolvers: None,
        }
    }

    fn named(text: &str) -> Arc<Backend> {
        Arc::new(Backend::from_spec(&BackendSpec::parse(text).unwrap()).unwrap())
    }

    #[test]
    fn a_round_looks_up_only_names_that_are_due() {
        let name = named("localhost:8001");
        let literal = named("127.0.0.1:8002");
        assert!(literal.addresses().lookup().is_none());
        let list = [watched(
            Duration::from_secs(60),
            vec![Arc::clone(&name), literal],
        )];
        // Due at once, then not for a minute: the thread sleeps its most.
        assert_eq!(round(&list), IDLE_WAIT);
        let first = name.addresses().lookup().unwrap().last().unwrap();
        assert_eq!(first.error, None);
        round(&list);
        assert_eq!(
            name.addresses().lookup().unwrap().last().unwrap().at,
            first.at
        );
        // A short interval: the next round is that soon.
        let short = [Watched {
            interval: Some(Duration::from_millis(200)),
            ..watched(Duration::ZERO, vec![name])
        }];
        assert!(round(&short) <= Duration::from_millis(200));
    }

    #[test]
    fn nothing_to_watch_starts_no_thread() {
        let resolver = Resolver::default();
        let stop = Shutdown::new();
        resolver
            .start_once(&stop, Box::new(|| Some(Vec::new())))
            .unwrap();
        assert!(resolver.thread.lock().is_none());
        resolver
            .start_once(
                &stop,
                Box::new(|| Some(vec![watched(Duration::from_secs(60), Vec::new())])),
            )
            .unwrap();
        stop.trigger();
        let handle = resolver.thread.lock().take().unwrap();
        handle.join().unwrap();
    }
}
