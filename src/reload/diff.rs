//! `rodizio check-config --diff OLD NEW`: what a reload from one config
//! file to another would do, with no balancer running. The same planning
//! and the same words as a reload's (`service.rs`), over the backends
//! `OLD` lists instead of a running scheduler's, so nothing is draining
//! and no connection is open (a drained backend says `0 connections`).
//! New addresses are not bound here: that a port is free is a fact of the
//! host the reload runs on (`POST /reload?dry_run=1` binds them).
//!
//! # Threads
//!
//! Runs on the caller's thread; touches nothing shared.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C reads its backends once, at the prompt.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::backend::Backend;
use crate::config::file::ConfigFile;
use crate::config::settings::{self, Scope};
use crate::config::{Config, Overrides};
use crate::error::Result;

use super::{service, ReloadReport, Services};

/// What reloading a balancer started with `old` (under `flags`) would do
/// when its file became `new`: the report the reload would give.
///
/// # Errors
///
/// Either file's error, as `check-config` words it (a bad value with its
/// key and line, a backend that does not resolve).
pub fn between(old: &ConfigFile, new: &ConfigFile, flags: &Overrides) -> Result<ReloadReport> {
    let from_file = !flags.given().contains(&"backends");
    let was = old.settle(flags)?;
    old.require_backends(&was)?;
    let mut now = new.settle(flags)?;
    new.require_backends(&now)?;
    let kept = settings::keep_restart_only_in(Scope::Process, &mut now, &was);
    let mut report = ReloadReport {
        needs_restart: kept.into_iter().map(String::from).collect(),
        ..ReloadReport::default()
    };
    settings::share_process(&mut now);
    // Refused by the reload, refused here.
    crate::config::sni_check::same_routing(&was, &now)?;
    if new.mode != old.mode {
        report.needs_restart.push("mode".into());
    }
    let several = now.services.len() > 1 || was.services.len() > 1;
    let old_list: Vec<Config> = was.service_list().into_iter().cloned().collect();
    let mut services = Services {
        removed: Vec::new(),
        changed: Vec::new(),
        added: Vec::new(),
    };
    for next in now.service_list() {
        let name = next.name.as_str();
        let Some(before) = old_list.iter().find(|o| o.name == name) else {
            for spec in &next.backends {
                spec.resolve()
                    .map_err(|e| new.error_at("backends", e.to_string()))?;
            }
            services.added.push((name.to_string(), next.listen_addrs()));
            continue;
        };
        let list = before
            .backends
            .iter()
            .filter(|spec| !spec.is_srv())
            .map(|spec| Backend::from_spec(spec).map(Arc::new))
            .collect::<Result<Vec<_>>>()
            .map_err(|e| old.error_at("backends", e.to_string()))?;
        let backends = service::plan_backends(&list, &[], before, next, new, from_file)?;
        let mut next = next.clone();
        let mut kept = settings::keep_restart_only_in(Scope::Service, &mut next, before);
        kept.extend(service::keep_tls_switch(before, &mut next));
        report.needs_restart.extend(kept.iter().map(|k| {
            if several {
                format!("{name}: {k}")
            } else {
                k.to_string()
            }
        }));
        let (a, b) = (before.listen_addrs(), next.listen_addrs());
        let gone: Vec<SocketAddr> = a.iter().filter(|x| !b.contains(x)).copied().collect();
        let more: Vec<SocketAddr> = b.iter().filter(|x| !a.contains(x)).copied().collect();
        let parts =
            service::describe_changes(&backends, before, &next, (&more, &gone), &mut report);
        services.changed.push((name.to_string(), parts));
    }
    let names: Vec<&str> = now.service_list().iter().map(|c| c.name.as_str()).collect();
    services.removed = old_list
        .iter()
        .filter(|o| !names.contains(&o.name.as_str()))
        .map(|o| (o.name.clone(), None))
        .collect();
    services.tell(several, &mut report);
    report.summary = report
        .summary
        .replacen("reload: ", "a reload would do: ", 1);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::file;

    /// A config file written to a temporary path and loaded.
    fn load(name: &str, text: &str) -> ConfigFile {
        let path =
            std::env::temp_dir().join(format!("rodizio-diff-{name}-{}.json", std::process::id()));
        std::fs::write(&path, text).unwrap();
        let file = file::load(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        file
    }

    #[test]
    fn added_removed_reweighted_and_restart_only() {
        let old = load(
            "old",
            r#"{"backends": ["127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:8003"]}"#,
        );
        let new = load(
            "new",
            r#"{"backends": ["127.0.0.1:8001,weight=3", "127.0.0.1:8002", "127.0.0.1:8004"],
                "algorithm": "least-connections", "workers": 8}"#,
        );
        let r = between(&old, &new, &Overrides::default()).unwrap();
        assert_eq!(
            r.changes,
            [
                "+1 backend (127.0.0.1:8004)",
                "weight 127.0.0.1:8001 1 → 3",
                "algorithm round-robin → least-connections",
                "draining 127.0.0.1:8003 (0 connections)",
            ]
        );
        assert_eq!(r.needs_restart, ["workers"]);
        assert_eq!((r.added, r.draining, r.reweighted), (1, 1, 1));
        let same = between(&old, &old, &Overrides::default()).unwrap();
        assert_eq!(same.summary, "a reload would do: no change");
        assert!(same.changes.is_empty() && same.needs_restart.is_empty());
    }

    /// Turning `tls_certs` on or off needs a restart, and names
    /// `tls_certs` alone, as the reload does (`keep_tls_switch`); the
    /// change is not listed as made.
    #[test]
    fn turning_tls_on_or_off_names_only_what_changed() {
        let plain = load("tls-plain", r#"{"backends": ["127.0.0.1:8001"]}"#);
        let tls = load(
            "tls-on",
            r#"{"backends": ["127.0.0.1:8001"],
                "tls_certs": [{"cert": "/etc/a.pem", "key": "/etc/a.key"}]}"#,
        );
        let backend = load(
            "tls-backend",
            r#"{"backends": ["127.0.0.1:8001"], "backend_tls": true}"#,
        );
        for (old, new, key) in [
            (&plain, &tls, "tls_certs"),
            (&tls, &plain, "tls_certs"),
            (&plain, &backend, "backend_tls"),
        ] {
            let r = between(old, new, &Overrides::default()).unwrap();
            assert_eq!(r.needs_restart, [key]);
            assert!(r.changes.is_empty(), "{:?}", r.changes);
        }
    }

    /// The services routed by SNI on an address are fixed at start-up:
    /// the reload refuses a change of them, and so does the diff.
    #[test]
    fn a_change_of_sni_routing_is_refused_as_by_the_reload() {
        let old = load(
            "sni-old",
            r#"{"services": [
                {"name": "a", "listen": "127.0.0.1:9443", "server_names": ["a.test"],
                 "backends": ["127.0.0.1:1"]},
                {"name": "b", "listen": "127.0.0.1:9443", "server_names": ["b.test"],
                 "backends": ["127.0.0.1:2"]}]}"#,
        );
        let new = load(
            "sni-new",
            r#"{"services": [
                {"name": "a", "listen": "127.0.0.1:9443", "server_names": ["a.test"],
                 "backends": ["127.0.0.1:1"]},
                {"name": "b", "listen": "127.0.0.1:9444", "server_names": ["b.test"],
                 "backends": ["127.0.0.1:2"]}]}"#,
        );
        let err = between(&old, &new, &Overrides::default()).unwrap_err();
        assert!(err.to_string().contains("server_names"), "{err}");
    }

    #[test]
    fn services_added_removed_and_changed_by_name() {
        let old = load(
            "svc-old",
            r#"{"services": [
                {"name": "a", "listen": "127.0.0.1:9001", "backends": ["127.0.0.1:1"]},
                {"name": "api", "listen": "127.0.0.1:9002", "backends": ["127.0.0.1:2"]}]}"#,
        );
        let new = load(
            "svc-new",
            r#"{"services": [
                {"name": "api", "listen": "127.0.0.1:9002", "backends": ["127.0.0.1:2"],
                 "algorithm": "least-connections", "send_proxy": "v2"},
                {"name": "c", "listen": "127.0.0.1:9003", "backends": ["127.0.0.1:3"]}]}"#,
        );
        let r = between(&old, &new, &Overrides::default()).unwrap();
        assert_eq!(
            r.changes,
            [
                "service a stopped",
                "service api: algorithm round-robin → least-connections",
                "service c started on 127.0.0.1:9003",
            ]
        );
        assert_eq!(r.needs_restart, ["api: send_proxy"]);
        assert_eq!((r.services_added, r.services_removed), (1, 1));
    }
}
