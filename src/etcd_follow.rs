//! A service's `backends_from: etcd://...` followed: every key under the
//! prefix read once, then a watch from the read's revision + 1 so no
//! change is missed; each change applied to the service's scheduler in
//! place, as `srv:` records are (`srv_follow::apply`): a new key's
//! backend added, a deleted key's drained and removed once its last
//! connection ends, a changed value's backend replaced (or reweighed).
//! A key's value is `HOST:PORT[,OPTION...]` as `-b` takes it
//! ([`BackendSpec::parse`]), or empty: the key's last segment is
//! `HOST:PORT`. etcd unreachable or answering garbage: the backends stay
//! as they are, a warning a minute, a new try after a backoff (100 ms
//! doubling to 5 s), then a whole read again; a compacted revision too.
//!
//! # Threads
//!
//! One thread per such service (`rodizio-etcd`), ending at shutdown
//! (each read waits [`IDLE_WAIT`] at most, then looks at the shutdown).
//! Its backends carry [`Origin::Etcd`]; only it changes them (a reload
//! and the file leave them alone).
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C's servers are typed in.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::backend::{Backend, BackendSpec, Origin};
use crate::error::{Error, Result};
use crate::etcd::{self, EtcdSource, Event, WatchMessage};
use crate::lookup;
use crate::proxy_protocol::Version;
use crate::scheduler::Scheduler;
use crate::shutdown::Shutdown;
use crate::srv_follow::{self, Group};
use crate::throttle::LogThrottle;

/// Longest wait of one watch read before the shutdown is looked at.
pub const IDLE_WAIT: Duration = Duration::from_millis(500);

/// First wait after a failure; it doubles up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// Longest wait between two tries.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Keys that are not backends said one by one; past them, one line.
const TOLD_KEYS: usize = 3;

/// Longest account of one such key.
const TOLD_CHARS: usize = 200;

/// One warning line at most this often.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// What the thread follows, for one service.
pub(crate) struct Follower {
    /// The setting.
    pub source: EtcdSource,
    /// The service's scheduler.
    pub scheduler: Arc<Scheduler>,
    /// The service's `send_proxy`.
    pub send_proxy: Option<Version>,
}

/// Starts the thread; it ends when `stop` is triggered.
///
/// # Errors
///
/// [`Error::Io`] when the thread cannot be started.
pub(crate) fn start(follower: Follower, stop: &Shutdown) -> Result<JoinHandle<()>> {
    let stop = stop.clone();
    std::thread::Builder::new()
        .name("rodizio-etcd".into())
        .spawn(move || follower.run(&stop))
        .map_err(|e| Error::io("starting the etcd thread", e))
}

/// The backend spec of one key and its value.
///
/// # Errors
///
/// The value (or key) is not a backend, in words.
pub fn spec_of(key: &str, value: &str) -> std::result::Result<BackendSpec, String> {
    let text = if value.trim().is_empty() {
        key.rsplit('/').next().unwrap_or(key)
    } else {
        value.trim()
    };
    BackendSpec::parse(text)
        .map_err(|e| format!("key {key}: {e}"))
        .and_then(|s| {
            if s.is_srv() {
                Err(format!("key {key}: srv: is not taken from etcd"))
            } else {
                Ok(s)
            }
        })
}

impl Follower {
    fn run(&self, stop: &Shutdown) {
        let name = self.source.to_string();
        let mut group = Group::default();
        let warn = LogThrottle::new(WARN_EVERY);
        let mut backoff = FIRST_BACKOFF;
        let wake = stop.receiver();
        while !stop.is_triggered() {
            match self.session(&name, &mut group, stop) {
                Ok(()) => backoff = FIRST_BACKOFF,
                Err(e) => {
                    if let Some(missed) = warn.event(Instant::now()) {
                        let kept = self
                            .scheduler
                            .snapshot()
                            .iter()
                            .filter(|b| b.source_name() == Some(&name))
                            .count();
                        log::warn!(
                            "{name}: {e}; its {kept} backends stay as they are{}",
                            crate::throttle::more(missed)
                        );
                    }
                    if wake.recv_timeout(backoff).is_ok() {
                        return;
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    /// One whole read, then the watch until it fails or is cancelled
    /// (`Ok`: read everything again at once).
    fn session(
        &self,
        name: &str,
        group: &mut Group,
        stop: &Shutdown,
    ) -> std::result::Result<(), String> {
        let read = etcd::range(&self.source);
        lookup::ETCD.count(read.is_ok());
        let read = read?;
        if read.left_out > 0 {
            log::warn!(
                "{name}: {} keys past the first {} left out",
                read.left_out,
                etcd::MAX_KEYS
            );
        }
        let mut keys: BTreeMap<String, String> =
            read.pairs.into_iter().map(|p| (p.key, p.value)).collect();
        let mut told = BTreeSet::new();
        self.apply(name, group, &keys, &mut told);
        // A watch that cannot start or breaks is a failed lookup too.
        let failed = |e: String| {
            lookup::ETCD.count(false);
            e
        };
        let mut answer = etcd::watch(&self.source, read.revision + 1, IDLE_WAIT).map_err(failed)?;
        let mut pending = Vec::new();
        while !stop.is_triggered() {
            srv_follow::reap(name, &self.scheduler, group);
            let line = match answer.next_line(&mut pending) {
                Ok(line) => line,
                Err(e) if e == etcd::IDLE => continue,
                Err(e) => return Err(failed(format!("the watch: {e}"))),
            };
            let message = etcd::parse_watch(&line);
            lookup::ETCD.count(message.is_ok());
            match message? {
                WatchMessage::Cancelled => return Ok(()),
                WatchMessage::Events(events, _) => {
                    if events.is_empty() {
                        continue;
                    }
                    for event in events {
                        match event {
                            Event::Put(p) => {
                                if keys.len() < etcd::MAX_KEYS || keys.contains_key(&p.key) {
                                    keys.insert(p.key, p.value);
                                }
                            }
                            Event::Delete(k) => {
                                keys.remove(&k);
                            }
                        }
                    }
                    self.apply(name, group, &keys, &mut told);
                }
            }
        }
        Ok(())
    }

    /// Makes the source's backends those of `keys`; a key that is not a
    /// backend is left out, and said once while it stays so (`told`: the
    /// keys said), in at most [`TOLD_KEYS`] lines of at most
    /// [`TOLD_CHARS`] characters and one line for the rest.
    fn apply(
        &self,
        name: &str,
        group: &mut Group,
        keys: &BTreeMap<String, String>,
        told: &mut BTreeSet<String>,
    ) {
        let mut wanted: Vec<Arc<Backend>> = Vec::new();
        let (mut bad, mut new) = (BTreeSet::new(), Vec::new());
        for (key, value) in keys {
            let made = spec_of(key, value).and_then(|spec| {
                let backend = Backend::from_spec(&spec).map_err(|e| format!("key {key}: {e}"))?;
                Ok(backend
                    .with_source(Origin::Etcd, name)
                    .with_send_proxy(spec.send_proxy.or(self.send_proxy)))
            });
            match made {
                Ok(b) if wanted.iter().all(|w| w.name() != b.name()) => wanted.push(Arc::new(b)),
                Ok(_) => {}
                Err(e) => {
                    if !told.contains(key) {
                        new.push(e);
                    }
                    bad.insert(key.clone());
                }
            }
        }
        for e in new.iter().take(TOLD_KEYS) {
            log::warn!("{name}: {}; left out", crate::units::shown(e, TOLD_CHARS));
        }
        if new.len() > TOLD_KEYS {
            let more = new.len() - TOLD_KEYS;
            log::warn!("{name}: {more} more keys are not backends; left out");
        }
        *told = bad;
        srv_follow::reap(name, &self.scheduler, group);
        srv_follow::apply(name, &self.scheduler, group, &wanted);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_and_its_value_make_a_backend() {
        let s = spec_of("/lb/a", "10.0.0.3:80,weight=2,backup").unwrap();
        assert_eq!((s.weight, s.backup), (2, true));
        let s = spec_of("/lb/127.0.0.1:81", "").unwrap();
        assert_eq!(s.name(), "127.0.0.1:81");
        assert!(spec_of("/lb/x", "not a backend").is_err());
        assert!(spec_of("/lb/x", "srv:_a._tcp.b").is_err());
    }
}
