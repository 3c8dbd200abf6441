//! The admin API's endpoints: a request's method, path and body in, a
//! status and a JSON value out. No HTTP here (that is `server.rs`'s), so
//! every answer can be tested by calling [`route`].
//!
//! Run by the admin handler threads, several at once: the changes to the
//! backend list (add, remove, reload) take turns on the state's `changes`
//! lock, so "is it there? then add it" cannot race another request. Reads
//! take nothing but the scheduler's snapshot and the backends' atomics.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C's server list is typed in at start-up and fixed.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::State;
use crate::backend::{cap, Backend, BackendSpec, Origin, Wanted};
use crate::config::settings::{self, Scope};
use crate::health::OwnCheck;
use crate::service::Service;

use super::services::{only_service, service_json, services};
use super::tools::{dry_run, query_flag, query_value, running_file, settings_now};
pub use super::views::backend_json;
use super::views::stats_page;

/// Most weight accepted, as `--backend HOST:PORT,weight=N` allows.
const MAX_WEIGHT: u32 = 1000;

/// One answer: the HTTP status and the JSON body.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// The HTTP status code.
    pub status: u16,
    /// The body.
    pub body: Value,
    /// For a 405: the methods the path takes (the `Allow` header).
    pub allow: Option<&'static str>,
    /// A body that is not JSON: its content type and text (`/metrics`,
    /// the stats page). `body` is then unused.
    pub text: Option<(&'static str, String)>,
}

impl Reply {
    /// A reply with this status and body.
    pub fn new(status: u16, body: Value) -> Reply {
        Reply {
            status,
            body,
            allow: None,
            text: None,
        }
    }

    /// A 200 with a body of `content_type`.
    pub fn text(content_type: &'static str, text: String) -> Reply {
        Reply {
            text: Some((content_type, text)),
            ..Reply::new(200, Value::Null)
        }
    }

    /// `{"error": message}` with this status.
    pub fn error(status: u16, message: impl Into<String>) -> Reply {
        Reply::new(status, json!({ "error": message.into() }))
    }

    fn method_not_allowed(method: &str, allow: &'static str) -> Reply {
        Reply {
            allow: Some(allow),
            ..Reply::error(
                405,
                format!("{method} is not allowed here (allowed: {allow})"),
            )
        }
    }
}

/// The body of `POST /backends`. `address` is a backend as the file and
/// `--backend` write it, options included (`HOST:PORT,backup`), read by
/// the same parser; each option may be a key instead, not both. Its other
/// keys are the backend's own check (`check_port`, `health_check`, ...),
/// as in the config file; anything else is refused in [`add`].
#[derive(Debug, Deserialize)]
struct NewBackend {
    address: String,
    /// 1 unless given (here or in `address`).
    weight: Option<u32>,
    #[serde(flatten)]
    check: Map<String, Value>,
    /// Its cap (`,max_connections=N`); none unless given.
    max_connections: Option<usize>,
    /// A backup, served only while no primary is available.
    backup: Option<bool>,
}

impl NewBackend {
    /// The backend `address` describes, with the keys laid over it.
    fn spec(self) -> Result<BackendSpec, String> {
        let mut spec = BackendSpec::parse(&self.address).map_err(|e| e.to_string())?;
        let options: Vec<&str> = self.address.split(',').skip(1).map(str::trim).collect();
        let in_address = |key: &str| options.iter().any(|o| o.split('=').next() == Some(key));
        let twice =
            |key: &str| format!("`{key}` is given twice, in `address` and as a key: keep one");
        if let Some(weight) = self.weight {
            if in_address("weight") {
                return Err(twice("weight"));
            }
            spec.weight = weight;
        }
        if let Some(n) = self.max_connections {
            if in_address("max_connections") {
                return Err(twice("max_connections"));
            }
            spec.max_connections = Some(n);
        }
        if let Some(backup) = self.backup {
            if in_address("backup") {
                return Err(twice("backup"));
            }
            spec.backup = backup;
        }
        let others = "`address`, `weight`, `max_connections`, `backup`";
        let check = OwnCheck::from_json(&self.check, others)?;
        if check != OwnCheck::default() {
            if spec.check != OwnCheck::default() {
                return Err(
                    "the backend's own check is given twice, in `address` and as keys: \
                            keep one"
                        .to_string(),
                );
            }
            spec.check = check;
        }
        Ok(spec)
    }
}

/// The body of `PUT /backends/{address}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Change {
    weight: Option<u32>,
    state: Option<Wanted>,
}

/// Answers one request. `path` may carry a query string (read only by
/// `POST /reload`, for `dry_run`; ignored elsewhere). `HEAD`
/// is answered as `GET` (the HTTP layer sends no body).
pub fn route(state: &State, method: &str, path: &str, body: &[u8]) -> Reply {
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    let method = if method == "HEAD" { "GET" } else { method };
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segments.as_slice() {
        ["services"] => match method {
            "GET" => Reply::new(200, services(state)),
            _ => Reply::method_not_allowed(method, "GET, HEAD"),
        },
        ["services", name, rest @ ..] => match state.running.find(name) {
            Some(service) => in_service(state, &service, method, rest, body),
            None => Reply::error(
                404,
                format!("no service {}", crate::config::shown_name(name)),
            ),
        },
        ["backends", ..] => match only_service(state) {
            Ok(service) => in_service(state, &service, method, &segments, body),
            Err(why) => Reply::error(409, why),
        },
        ["connections"] => match method {
            "GET" => answer(super::connections::list(query, owner(state))),
            _ => Reply::method_not_allowed(method, "GET, HEAD"),
        },
        ["connections", id] => match method {
            "DELETE" => answer(super::connections::kill(id, owner(state))),
            _ => Reply::method_not_allowed(method, "DELETE"),
        },
        ["reload"] => match method {
            "POST" => match query_flag(query, "dry_run") {
                Ok(false) => reload(state),
                Ok(true) => {
                    let (status, body) = dry_run(state);
                    Reply::new(status, body)
                }
                Err(why) => Reply::error(400, why),
            },
            _ => Reply::method_not_allowed(method, "POST"),
        },
        ["config"] => match method {
            "GET" => match query_value(query, "format") {
                None | Some("json") => Reply::new(200, config(state)),
                Some("file") => Reply::text("application/json", running_file(state)),
                Some(other) => Reply::error(
                    400,
                    format!(
                        "format={} is not json or file",
                        crate::config::shown_name(other)
                    ),
                ),
            },
            _ => Reply::method_not_allowed(method, "GET, HEAD"),
        },
        ["metrics"] => match method {
            "GET" => Reply::text(
                "text/plain; version=0.0.4; charset=utf-8",
                super::metrics::render(&state.sources),
            ),
            _ => Reply::method_not_allowed(method, "GET, HEAD"),
        },
        [""] => match method {
            "GET" => Reply::text("text/html; charset=utf-8", stats_page(state)),
            _ => Reply::method_not_allowed(method, "GET, HEAD"),
        },
        _ => Reply::error(404, format!("no such endpoint: {path}")),
    }
}

/// The endpoints of one service: `/services/{name}` and below, or
/// `/backends...` when only one service runs. `rest` is the path after
/// the service's name.
fn in_service(state: &State, service: &Service, method: &str, rest: &[&str], body: &[u8]) -> Reply {
    match rest {
        [] => match method {
            "GET" => Reply::new(200, service_json(state, service)),
            _ => Reply::method_not_allowed(method, "GET, HEAD"),
        },
        ["backends"] => match method {
            "GET" => list(service),
            "POST" => add(state, service, body),
            _ => Reply::method_not_allowed(method, "GET, HEAD, POST"),
        },
        ["backends", address] => {
            let Some(address) = percent_decode(address) else {
                return Reply::error(400, "the address in the path is not valid UTF-8");
            };
            match method {
                "GET" => find(service, &address)
                    .map_or_else(|r| r, |b| Reply::new(200, backend_json(&b))),
                "PUT" => change(state, service, &address, body),
                "DELETE" => delete(state, service, &address),
                _ => Reply::method_not_allowed(method, "GET, HEAD, PUT, DELETE"),
            }
        }
        ["backends", address, "connections"] => {
            let Some(address) = percent_decode(address) else {
                return Reply::error(400, "the address in the path is not valid UTF-8");
            };
            match method {
                "DELETE" => find(service, &address)
                    .map_or_else(|r| r, |b| answer(super::connections::kill_backend(&b))),
                _ => Reply::method_not_allowed(method, "DELETE"),
            }
        }
        _ => Reply::error(404, format!("no such endpoint: /{}", rest.join("/"))),
    }
}

/// `GET /backends`: each backend with its weight as the scheduler counts
/// it now (lower while slow start ramps it).
fn list(service: &Service) -> Reply {
    let scheduler = &service.live.scheduler;
    let list: Vec<Value> = scheduler
        .snapshot()
        .iter()
        .map(|b| {
            let mut json = backend_json(b);
            let (weight, ramping) = scheduler.effective_weight(b);
            json["effective_weight"] = json!(weight);
            json["ramping"] = json!(ramping);
            json
        })
        .collect();
    Reply::new(200, Value::Array(list))
}

/// Parses a JSON body, or says in one line what is wrong with it.
fn parse<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, Reply> {
    serde_json::from_slice(body).map_err(|e| {
        let words = crate::config::words::in_words(&e.to_string());
        Reply::error(400, format!("bad JSON body: {words}"))
    })
}

fn check_weight(weight: u32) -> Result<u32, Reply> {
    if (1..=MAX_WEIGHT).contains(&weight) {
        Ok(weight)
    } else {
        Err(Reply::error(
            400,
            format!("weight must be 1..{MAX_WEIGHT}, got {weight}"),
        ))
    }
}

/// `POST /backends`.
fn add(state: &State, service: &Service, body: &[u8]) -> Reply {
    let new: NewBackend = match parse(body) {
        Ok(new) => new,
        Err(reply) => return reply,
    };
    let spec = match new.spec() {
        Ok(spec) => spec,
        Err(words) => return Reply::error(400, words),
    };
    if let Err(reply) = check_weight(spec.weight) {
        return reply;
    }
    if spec
        .max_connections
        .is_some_and(|n| !(1..=cap::MAX_MAX_CONNECTIONS).contains(&n))
    {
        let most = cap::MAX_MAX_CONNECTIONS;
        return Reply::error(400, format!("max_connections must be 1..{most}"));
    }
    if let Err(err) = service
        .live
        .health
        .load()
        .for_backend(&spec.check)
        .validate()
    {
        return Reply::error(400, err.to_string());
    }
    // Resolving may wait for DNS: done before taking the lock.
    let send_proxy = spec.send_proxy.or(service.config.send_proxy);
    let backend = match Backend::from_spec(&spec) {
        Ok(b) => Arc::new(b.with_send_proxy(send_proxy).with_origin(Origin::Api)),
        Err(e) => return Reply::error(400, e.to_string()),
    };
    let _turn = state.changes.lock();
    // The same name, or another spelling of an address already served
    // (`localhost:8001` beside `127.0.0.1:8001`): the weight is how to
    // give a backend more share.
    let same = |b: &Backend| {
        b.name() == backend.name() || b.addrs().iter().any(|a| backend.addrs().contains(a))
    };
    if let Some(existing) = service.live.scheduler.find(same) {
        return Reply::error(
            409,
            format!(
                "backend {} exists already{}; change its weight to give it more share",
                backend.name(),
                if existing.name() == backend.name() {
                    String::new()
                } else {
                    format!(" as {}", existing.name())
                }
            ),
        );
    }
    service.live.scheduler.add(Arc::clone(&backend));
    log::info!(
        "admin: backend {} added (weight {}){}",
        backend.name(),
        spec.weight,
        whose(state, service)
    );
    Reply::new(201, backend_json(&backend))
}

fn find(service: &Service, address: &str) -> Result<Arc<Backend>, Reply> {
    service
        .live
        .scheduler
        .find(|b| b.name() == address)
        .ok_or_else(|| Reply::error(404, format!("no backend {address}")))
}

/// `PUT /backends/{address}`.
fn change(state: &State, service: &Service, address: &str, body: &[u8]) -> Reply {
    let change: Change = match parse(body) {
        Ok(c) => c,
        Err(reply) => return reply,
    };
    if change.weight.is_none() && change.state.is_none() {
        return Reply::error(400, "give \"weight\" or \"state\" (drain, maint, ready)");
    }
    let weight = match change.weight.map(check_weight).transpose() {
        Ok(w) => w,
        Err(reply) => return reply,
    };
    let backend = match find(service, address) {
        Ok(b) => b,
        Err(reply) => return reply,
    };
    if let Some(weight) = weight {
        let _turn = state.changes.lock();
        backend.set_weight(weight);
        service.live.scheduler.refresh();
        log::info!("admin: backend {address} weight is now {weight}");
    }
    if let Some(wanted) = change.state {
        backend.set_wanted(wanted);
        log::info!("admin: backend {address} is now {}", wanted.word());
    }
    Reply::new(200, backend_json(&backend))
}

/// `DELETE /backends/{address}`: drain now, removed by the reaper once no
/// connection is left.
fn delete(state: &State, service: &Service, address: &str) -> Reply {
    let backend = match find(service, address) {
        Ok(b) => b,
        Err(reply) => return reply,
    };
    backend.set_maint(false);
    backend.set_draining(true);
    if let Err(e) = state.reaper(service).watch(Arc::clone(&backend), None) {
        return Reply::error(503, e.to_string());
    }
    let left = backend.active() + backend.pending();
    log::info!(
        "admin: backend {address} draining, removed once its {} {}",
        crate::units::count(left as u64, "connection"),
        if left == 1 { "ends" } else { "end" }
    );
    let mut body = backend_json(&backend);
    body["removing"] = Value::Bool(true);
    Reply::new(202, body)
}

/// This balancer, as the connections' table knows it.
fn owner(state: &State) -> usize {
    super::connections::owner_of(&state.sources.stats)
}

/// A status and a JSON body as a reply.
fn answer((status, body): (u16, Value)) -> Reply {
    Reply::new(status, body)
}

/// ` (service NAME)` when several services run, for log lines.
fn whose(state: &State, service: &Service) -> String {
    if state.running.list().len() > 1 {
        format!(" (service {})", service.name())
    } else {
        String::new()
    }
}

/// `POST /reload`.
fn reload(state: &State) -> Reply {
    let Some(hook) = &state.reload else {
        return Reply::error(409, "no config file, reload not supported");
    };
    let _turn = state.changes.lock();
    // The reload logs what it did or why it refused, as for SIGHUP: the
    // line here says who asked, not the outcome a second time.
    log::info!("admin: POST /reload");
    match hook() {
        Ok(summary) => Reply::new(200, json!({ "summary": summary })),
        // The request was fine; the file it points at was refused.
        Err(error) => Reply::error(422, error),
    }
}

/// `GET /config`: [`crate::Config::describe`] of the settings in force:
/// those given at start-up, with the live ones (proxy, health, limiter,
/// algorithm, backend list) read as they are now. With several services,
/// the process's settings, then `services`: each service's own.
fn config(state: &State) -> Value {
    let services = state.running.list();
    if let [one] = services.as_slice() {
        let mut config = settings_now(one);
        // The process's settings as the admin API runs them.
        config.admin_listen = state.config.admin_listen;
        let mut out = described(&config, None);
        out["backends"] = backends_now(one);
        return out;
    }
    let mut out = described(&state.config, Some(Scope::Process));
    let list: Vec<Value> = services
        .iter()
        .map(|s| {
            let mut one = described(&settings_now(s), Some(Scope::Service));
            one["name"] = Value::String(s.name().to_string());
            one["backends"] = backends_now(s);
            one
        })
        .collect();
    out["services"] = Value::Array(list);
    out
}

/// A service's backends now, with their weights and caps.
fn backends_now(service: &Service) -> Value {
    let list = service.live.scheduler.snapshot();
    let list = list.iter().map(|b| {
        let cap = b.max_connections();
        json!({ "address": b.name(), "weight": b.weight(), "max_connections": cap, "backup": b.is_backup() })
    });
    Value::Array(list.collect())
}

/// `config`'s settings (of `scope`, or all) as a JSON object, the
/// backends as the scheduler has them now.
fn described(config: &crate::config::Config, scope: Option<Scope>) -> Value {
    let mut out = Map::new();
    for (name, value) in config.describe() {
        if scope.is_some_and(|s| settings::scope_of(name) != Some(s)) {
            continue;
        }
        out.insert(name.to_string(), typed(&value));
    }
    Value::Object(out)
}

/// A setting's text as JSON: whole numbers and `true`/`false` typed,
/// `off` and empty as `null`; the rest (durations, sizes, addresses, names) as the
/// text the config file takes.
fn typed(text: &str) -> Value {
    match text {
        "true" => Value::Bool(true),
        "false" => Value::Bool(false),
        "off" | "none" | "" => Value::Null,
        // A list the file writes as JSON (`tls_certs`): as JSON (an IPv6
        // address, `[::1]:80`, is no JSON and stays text).
        _ if text.starts_with("[{") => {
            serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string()))
        }
        _ => match text.parse::<u64>() {
            Ok(n) => Value::from(n),
            Err(_) => Value::String(text.to_string()),
        },
    }
}

/// `%XX` sequences decoded (an IPv6 backend is `%5B::1%5D:8001` in a URL),
/// a `%` not followed by two hex digits kept as it is; `None` when the
/// result is not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let decoded = percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .ok()?;
    Some(decoded.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn state(backends: Vec<Arc<Backend>>) -> State {
        state_of(vec![("default", backends)])
    }

    /// The admin state over services named as given, with these backends.
    fn state_of(services: Vec<(&str, Vec<Arc<Backend>>)>) -> State {
        let config = Config::default();
        let (running, stats) = crate::running::for_tests(services);
        let sources = crate::admin::metrics::Sources {
            stats,
            running: Arc::clone(&running),
            queued: Arc::new(|| 0),
            max_workers: config.workers,
        };
        State::new(running, config, None, sources, None)
    }

    #[test]
    fn each_service_has_its_paths_and_backends_needs_one_service() {
        let web = Arc::new(Backend::new("127.0.0.1:8001".into(), vec![], 1));
        let db = Arc::new(Backend::new("127.0.0.1:5432".into(), vec![], 1));
        let s = state_of(vec![("web", vec![web]), ("db", vec![db])]);
        let all = route(&s, "GET", "/services", b"");
        assert_eq!(all.status, 200);
        let names: Vec<&str> = all
            .body
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["web", "db"]);
        let one = route(&s, "GET", "/services/db/backends", b"");
        assert_eq!(one.body[0]["address"], "127.0.0.1:5432");
        assert_eq!(one.body.as_array().unwrap().len(), 1);
        let plain = route(&s, "GET", "/backends", b"");
        assert_eq!(plain.status, 409);
        assert!(
            plain.body["error"].as_str().unwrap().contains("web, db"),
            "{:?}",
            plain.body
        );
        let added = route(
            &s,
            "POST",
            "/services/db/backends",
            br#"{"address": "127.0.0.1:5433"}"#,
        );
        assert_eq!(added.status, 201, "{:?}", added.body);
        assert_eq!(
            route(&s, "GET", "/services/db/backends", b"")
                .body
                .as_array()
                .unwrap()
                .len(),
            2
        );
        assert_eq!(
            route(&s, "GET", "/services/web/backends", b"")
                .body
                .as_array()
                .unwrap()
                .len(),
            1
        );
        let got = route(&s, "GET", "/services/web/backends/127.0.0.1:8001", b"");
        assert_eq!(got.status, 200);
        assert_eq!(
            route(&s, "GET", "/services/web/backends/127.0.0.1:5432", b"").status,
            404
        );
        assert_eq!(route(&s, "GET", "/services/nope/backends", b"").status, 404);
        assert_eq!(route(&s, "GET", "/services/web/nothing", b"").status, 404);
        assert_eq!(route(&s, "DELETE", "/services", b"").status, 405);
        let config = route(&s, "GET", "/config", b"").body;
        assert_eq!(config["services"][1]["name"], "db");
        assert_eq!(
            config["services"][1]["backends"].as_array().unwrap().len(),
            2
        );
        assert!(config.get("workers").is_some());
        assert!(config["services"][0].get("workers").is_none());
        let (_, page) = route(&s, "GET", "/", b"").text.unwrap();
        assert!(page.contains("<h2>Service db</h2>"));
    }

    #[test]
    fn metrics_and_the_stats_page_are_served() {
        let b = Arc::new(Backend::new("127.0.0.1:8001".into(), vec![], 1));
        let s = state(vec![b]);
        let m = route(&s, "GET", "/metrics", b"");
        assert_eq!(m.status, 200);
        let (kind, text) = m.text.unwrap();
        assert!(kind.starts_with("text/plain; version=0.0.4"));
        assert!(text.contains(
            "rodizio_backend_up{service=\"default\",backend=\"127.0.0.1:8001\",state=\"up\"} 1"
        ));
        let p = route(&s, "GET", "/", b"");
        let (kind, html) = p.text.unwrap();
        assert!(kind.starts_with("text/html"));
        assert!(html.contains("data-backend=\"127.0.0.1:8001\""));
        assert_eq!(route(&s, "POST", "/metrics", b"").status, 405);
    }

    #[test]
    fn the_state_shown_puts_the_operator_first() {
        let b = Backend::new("b".into(), vec![], 1);
        assert_eq!(backend_json(&b)["state"], "up");
        b.set_healthy(false);
        assert_eq!(backend_json(&b)["state"], "down");
        b.set_draining(true);
        assert_eq!(backend_json(&b)["state"], "draining");
        b.set_maint(true);
        assert_eq!(backend_json(&b)["state"], "maint");
        assert!(!b.is_available());
    }

    #[test]
    fn paths_methods_and_query_strings() {
        let s = state(vec![Arc::new(Backend::new("[::1]:8001".into(), vec![], 1))]);
        assert_eq!(route(&s, "GET", "/backends?pretty=1", b"").status, 200);
        assert_eq!(route(&s, "GET", "/backends/", b"").status, 200);
        let r = route(
            &s,
            "PUT",
            "/backends/%5B::1%5D:8001",
            br#"{"state":"maint"}"#,
        );
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.body["state"], "maint");
        let r = route(&s, "HEAD", "/config", b"");
        assert_eq!(r.status, 200, "HEAD is answered as GET");
        let r = route(&s, "POST", "/config", b"");
        assert_eq!((r.status, r.allow), (405, Some("GET, HEAD")));
        let r = route(&s, "GET", "/backends/%5B::1%5D:8001", b"");
        assert_eq!((r.status, &r.body["address"]), (200, &json!("[::1]:8001")));
        assert_eq!(route(&s, "GET", "/backends/127.0.0.1:1", b"").status, 404);
        assert_eq!(route(&s, "GET", "/backendsx", b"").status, 404);
        assert_eq!(route(&s, "PUT", "/backends/%FF", b"{}").status, 400);
    }

    #[test]
    fn an_address_takes_the_options_the_file_takes() {
        let s = state(vec![Arc::new(Backend::new(
            "127.0.0.1:8001".into(),
            vec![],
            1,
        ))]);
        let r = route(
            &s,
            "POST",
            "/backends",
            br#"{"address": "127.0.0.1:8002,backup,weight=3,max_connections=5"}"#,
        );
        assert_eq!(r.status, 201, "{r:?}");
        assert_eq!(r.body["address"], "127.0.0.1:8002");
        assert_eq!(
            (
                &r.body["backup"],
                &r.body["weight"],
                &r.body["max_connections"]
            ),
            (&json!(true), &json!(3), &json!(5))
        );
        // As keys, the same; one option both ways is refused.
        let r = route(
            &s,
            "POST",
            "/backends",
            br#"{"address": "127.0.0.1:8003", "backup": true}"#,
        );
        assert_eq!((r.status, &r.body["backup"]), (201, &json!(true)), "{r:?}");
        for (body, says) in [
            (
                &br#"{"address": "127.0.0.1:8004,backup", "backup": false}"#[..],
                "`backup` is given twice",
            ),
            (
                br#"{"address": "127.0.0.1:8004,check_port=9", "check_port": 8}"#,
                "own check is given twice",
            ),
            (br#"{"address": "127.0.0.1:8004,color=red"}"#, "color"),
        ] {
            let r = route(&s, "POST", "/backends", body);
            assert_eq!(r.status, 400, "{r:?}");
            let error = r.body["error"].as_str().unwrap();
            assert!(error.contains(says), "{error}");
        }
    }

    #[test]
    fn another_spelling_of_a_backend_is_refused() {
        let addr: std::net::SocketAddr = "127.0.0.1:8001".parse().unwrap();
        let s = state(vec![Arc::new(Backend::new(
            "127.0.0.1:8001".into(),
            vec![addr],
            1,
        ))]);
        let r = route(&s, "POST", "/backends", br#"{"address": "localhost:8001"}"#);
        assert_eq!(r.status, 409, "{r:?}");
        assert!(
            r.body["error"]
                .as_str()
                .unwrap()
                .contains("as 127.0.0.1:8001"),
            "{r:?}"
        );
        assert_eq!(s.running.list()[0].live.scheduler.snapshot().len(), 1);
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("%5B::1%5D:80").unwrap(), "[::1]:80");
        assert_eq!(percent_decode("a%2").unwrap(), "a%2");
        assert_eq!(percent_decode("%zz").unwrap(), "%zz");
        assert!(percent_decode("%ff").is_none());
    }
}
