//! The admin API's tools beyond the backend list: `POST /reload?dry_run=1`
//! (what a reload would do, applying nothing) and `GET /config?format=file`
//! (the running configuration as a config file), and the query strings
//! they read. `routes.rs` routes to them.
//!
//! Run by the admin handler threads; the dry run takes its turn on the
//! state's `changes` lock, as a reload does.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use serde_json::{json, Value};

use super::State;
use crate::backend::BackendSpec;
use crate::health::OwnCheck;
use crate::service::Service;

/// `POST /reload?dry_run=1`: what a reload would do, applying nothing.
pub(super) fn dry_run(state: &State) -> (u16, Value) {
    let Some(hook) = &state.dry_run else {
        return (
            409,
            json!({"error": "no config file, reload not supported"}),
        );
    };
    // In turn with the changes, so what it reads is not half changed.
    let _turn = state.changes.lock();
    match hook() {
        Ok(plan) => (
            200,
            json!({
                "dry_run": true,
                "changes": plan.changes,
                "needs_restart": plan.needs_restart,
            }),
        ),
        // The reload would be refused: the file's error, nothing applied.
        Err(error) => (422, json!({ "dry_run": true, "error": error })),
    }
}

/// The value of `name` in the query string, if given.
pub(super) fn query_value<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

/// `GET /config?format=file`: the configuration running now as a config
/// file (`config/export.rs`): the settings as `GET /config` shows them,
/// each service's backends as its list holds them now (added by the API
/// or a reload, with their weights now), those draining out (`DELETE`, a
/// reload, `state: drain`) left out. Health, drain and maintenance are
/// states, not settings: a backend in maintenance is written as any other.
pub(super) fn running_file(state: &State) -> String {
    let services = state.running.list();
    let mut config = match services.as_slice() {
        [one] => file_settings(one),
        _ => crate::config::Config {
            services: services.iter().map(|s| file_settings(s)).collect(),
            ..state.config.clone()
        },
    };
    config.admin_listen = state.config.admin_listen;
    let text = serde_json::to_string_pretty(&crate::config::export::to_file(&config));
    text.unwrap_or_default() + "\n"
}

/// A service's settings now, its backend list included.
fn file_settings(service: &Service) -> crate::config::Config {
    let mut config = settings_now(service);
    let list = service.live.scheduler.snapshot();
    config.backends = list
        .iter()
        .filter(|b| !b.is_draining())
        .filter_map(|b| {
            let mut spec = BackendSpec::parse(b.name()).ok()?;
            spec.weight = b.configured_weight();
            spec.max_connections = b.max_connections();
            spec.backup = b.is_backup();
            spec.check = OwnCheck::clone(&b.own_check());
            // The service's `send_proxy` is written once, not per backend.
            spec.send_proxy = b.send_proxy().filter(|v| Some(*v) != config.send_proxy);
            Some(spec)
        })
        .collect();
    config
}

/// Whether the query string asks for `name` (`name=1`, `name=true`, or
/// `name` alone; the words in any case: `TRUE`, `Yes`, `on`); an error
/// for another value.
pub(super) fn query_flag(query: &str, name: &str) -> Result<bool, String> {
    for pair in query.split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, "1"));
        if key != name {
            continue;
        }
        return match value.to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(true),
            "0" | "false" | "no" | "off" => Ok(false),
            _ => Err(format!(
                "{name}={} is not true or false (or 1, 0, on, off)",
                crate::config::shown_name(value)
            )),
        };
    }
    Ok(false)
}

/// A service's settings, the live ones read as they are now.
pub(super) fn settings_now(service: &Service) -> crate::config::Config {
    let live = &service.live;
    let mut config = service.config.clone();
    config.proxy = (**live.proxy.load()).clone();
    config.health = (**live.health.load()).clone();
    config.rate_limit = live.limiter.load().as_ref().map(|l| l.config().clone());
    config.algorithm = live.scheduler.algorithm();
    crate::service::tuned(&live.scheduler, &mut config);
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_strings() {
        assert_eq!(query_flag("", "dry_run"), Ok(false));
        assert_eq!(query_flag("dry_run", "dry_run"), Ok(true));
        assert_eq!(query_flag("a=b&dry_run=1", "dry_run"), Ok(true));
        assert_eq!(query_flag("dry_run=false", "dry_run"), Ok(false));
        for (value, wanted) in [
            ("TRUE", true),
            ("Yes", true),
            ("on", true),
            ("False", false),
        ] {
            let query = format!("dry_run={value}");
            assert_eq!(query_flag(&query, "dry_run"), Ok(wanted), "{value}");
        }
        let err = query_flag("dry_run=maybe", "dry_run").unwrap_err();
        assert!(err.contains("is not true or false"), "{err}");
        let long = format!("dry_run={}", "x".repeat(5000));
        let err = query_flag(&long, "dry_run").unwrap_err();
        assert!(err.len() < 120, "{err}");
        assert_eq!(query_value("format=file&x=1", "format"), Some("file"));
        assert_eq!(query_value("formats=file", "format"), None);
    }
}
