//! The admin API's view of the connections' table
//! ([`crate::connections`]): `GET /connections` (filtered, paged,
//! bounded), `DELETE /connections/{id}`, `DELETE
//! /services/{service}/backends/{backend}/connections`, and the stats
//! page's oldest and busiest connections.
//!
//! # Threads
//!
//! The admin handler threads: each request reads the table (a slot's
//! lock for its set-once fields) or ends connections through it.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::fmt::Write;
use std::time::Duration;

use serde_json::{json, Value};

use crate::backend::Backend;
use crate::connections::{table, Kill, View};

/// Connections one `GET /connections` lists when no `limit` is given.
pub const DEFAULT_LIMIT: usize = 100;
/// The most connections one `GET /connections` lists (`limit` above it
/// is refused): the answer stays bounded however many are open.
pub const MAX_LIMIT: usize = 1000;
/// Longest query value read; longer is refused (no filter needs more).
const MAX_VALUE: usize = 256;
/// Connections the stats page shows in each of its two tables.
const PAGE_ROWS: usize = 5;

/// What `GET /connections` keeps.
#[derive(Debug, Default)]
struct Filter {
    service: Option<String>,
    backend: Option<String>,
    client: Option<String>,
    min_age: Option<Duration>,
    idle_for: Option<Duration>,
    limit: usize,
    after: u64,
}

impl Filter {
    /// The filter of `query`, or a 400 saying which value is wrong.
    fn parse(query: &str) -> Result<Filter, Answer> {
        let mut f = Filter {
            limit: DEFAULT_LIMIT,
            ..Filter::default()
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, raw) = pair.split_once('=').unwrap_or((pair, ""));
            if raw.len() > MAX_VALUE {
                return Err(bad(key, "is too long"));
            }
            let value = percent_encoding::percent_decode_str(raw)
                .decode_utf8()
                .map_err(|_| bad(key, "is not valid UTF-8"))?
                .into_owned();
            match key {
                "service" => f.service = Some(value),
                "backend" => f.backend = Some(value),
                "client" => f.client = Some(value),
                "min_age" => f.min_age = Some(duration(key, &value)?),
                "idle_for" => f.idle_for = Some(duration(key, &value)?),
                "limit" => {
                    f.limit = match value.parse::<usize>() {
                        Ok(n @ 1..=MAX_LIMIT) => n,
                        _ => return Err(bad(key, &format!("must be 1..{MAX_LIMIT}"))),
                    }
                }
                "after" => {
                    f.after = whole(&value).ok_or_else(|| bad(key, "must be a connection id"))?;
                }
                _ => {
                    return Err(error(
                        400,
                        format!(
                            "unknown filter {}: service, backend, client, min_age, \
                             idle_for, limit, after",
                            crate::config::shown_name(key)
                        ),
                    ))
                }
            }
        }
        Ok(f)
    }

    fn keeps(&self, v: &View, owner: usize) -> bool {
        let service = v
            .service
            .as_deref()
            .unwrap_or(crate::config::DEFAULT_SERVICE);
        v.owner == owner
            && v.id > self.after
            && self.service.as_deref().map_or(true, |s| s == service)
            && self
                .backend
                .as_deref()
                .map_or(true, |b| v.backend.as_deref() == Some(b))
            && self.client.as_deref().map_or(true, |c| {
                v.client
                    .is_some_and(|a| a.to_string() == c || a.ip().to_string() == c)
            })
            && self.min_age.map_or(true, |d| v.age >= d)
            && self.idle_for.map_or(true, |d| v.idle >= d)
    }
}

fn bad(key: &str, why: &str) -> Answer {
    error(400, format!("{} {why}", crate::config::shown_name(key)))
}

/// A status and its JSON body.
type Answer = (u16, Value);

/// `{"error": message}` with this status.
fn error(status: u16, message: String) -> Answer {
    (status, json!({ "error": message }))
}

/// A duration filter: `30s`, `5m`, `500ms`, or seconds.
fn duration(key: &str, value: &str) -> Result<Duration, Answer> {
    let parsed = match whole(value) {
        Some(secs) if secs <= 1_000_000_000 => Ok(Duration::from_secs(secs)),
        Some(_) => Err("is too long".to_string()),
        None => crate::units::parse_duration(value),
    };
    parsed.map_err(|why| bad(key, &format!("is not a duration: {why}")))
}

/// A whole number written in plain digits (no sign, no spaces), that fits.
fn whole(text: &str) -> Option<u64> {
    if text.is_empty() || text.len() > 20 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// The connections of the balancer `owner` (the address of its
/// process-wide counters, [`owner_of`]).
fn mine(owner: usize) -> Vec<View> {
    let mut all = table().list();
    all.retain(|v| v.owner == owner);
    all
}

/// The owner of the balancer whose process-wide counters are `stats`.
pub fn owner_of(stats: &std::sync::Arc<crate::stats::Stats>) -> usize {
    std::sync::Arc::as_ptr(stats) as usize
}

/// One connection as JSON.
pub fn connection_json(v: &View) -> Value {
    json!({
        "id": v.id,
        "service": v.service.as_deref().unwrap_or(crate::config::DEFAULT_SERVICE),
        "client": v.client.map(|a| a.to_string()),
        "backend": v.backend,
        "age_ms": v.age.as_millis() as u64,
        "idle_ms": v.idle.as_millis() as u64,
        "bytes_to_backend": v.to_backend,
        "bytes_to_client": v.to_client,
        "state": v.phase.word(),
        "mode": v.mode.word(),
        "sni": v.sni,
        "tls_version": v.tls_version,
        "client_certificate": v.client_subject,
        "ending": v.ending.map(Kill::word),
    })
}

/// `GET /connections?...`: the open connections the filters keep, by id,
/// at most `limit`; `next` is the `after` of the next page.
pub(super) fn list(query: &str, owner: usize) -> Answer {
    let filter = match Filter::parse(query) {
        Ok(f) => f,
        Err(reply) => return reply,
    };
    let all = mine(owner);
    let open = all.len();
    let kept: Vec<&View> = all.iter().filter(|v| filter.keeps(v, owner)).collect();
    let page = &kept[..kept.len().min(filter.limit)];
    let next = (kept.len() > page.len()).then(|| page.last().map(|v| v.id));
    let connections: Vec<Value> = page.iter().map(|v| connection_json(v)).collect();
    (
        200,
        json!({
            "open": open,
            "matched": kept.len(),
            "connections": connections,
            "next": next.flatten(),
        }),
    )
}

/// `DELETE /connections/{id}`: both ends shut down, `end=killed`.
pub(super) fn kill(id: &str, owner: usize) -> Answer {
    let Some(id) = whole(id) else {
        return error(
            400,
            "a connection id is a whole number (see GET /connections)".into(),
        );
    };
    // Only this balancer's: its id checked under the slot's lock.
    if table().kill_where(Kill::Killed, |v| v.id == id && v.owner == owner) == 1 {
        log::info!("admin: connection {id} closed");
        (200, json!({ "killed": id }))
    } else {
        error(404, format!("no open connection {id}"))
    }
}

/// `DELETE .../backends/{backend}/connections`: every connection to it.
pub(super) fn kill_backend(backend: &Backend) -> Answer {
    let id = backend.id();
    let killed = table().kill_where(Kill::Killed, |v| v.backend_id == Some(id));
    log::info!(
        "admin: {} to backend {} closed",
        crate::units::count(killed as u64, "connection"),
        backend.name()
    );
    (200, json!({ "backend": backend.name(), "killed": killed }))
}

/// The stats page's two tables: the oldest connections and the busiest
/// (most bytes), a few each; empty when none is open.
pub(super) fn page_tables(owner: usize) -> String {
    let mut all = mine(owner);
    if all.is_empty() {
        return String::new();
    }
    let mut html = String::new();
    all.sort_by_key(|v| std::cmp::Reverse(v.age));
    rows(&mut html, "oldest", "Oldest connections", &all);
    all.sort_by_key(|v| std::cmp::Reverse(v.bytes()));
    rows(&mut html, "busiest", "Busiest connections", &all);
    html
}

fn rows(html: &mut String, id: &str, title: &str, views: &[View]) {
    let _ = write!(
        html,
        "<h2>{title}</h2>\n<table id=\"{id}\"><tr><th>id</th><th>service</th><th>client</th>\
<th>backend</th><th>age</th><th>idle</th><th>bytes in</th><th>bytes out</th><th>how</th></tr>\n"
    );
    for v in views.iter().take(PAGE_ROWS) {
        let _ = writeln!(
            html,
            "<tr><td>{}</td><td class=\"name\">{}</td><td class=\"name\">{}</td>\
<td class=\"name\">{}</td><td>{:.1?}</td><td>{:.1?}</td><td>{}</td><td>{}</td><td>{} {}</td></tr>",
            v.id,
            super::page::esc(
                v.service
                    .as_deref()
                    .unwrap_or(crate::config::DEFAULT_SERVICE)
            ),
            v.client.map(|a| a.to_string()).unwrap_or_default(),
            super::page::esc(v.backend.as_deref().unwrap_or("")),
            v.age,
            v.idle,
            v.to_backend,
            v.to_client,
            v.phase.word(),
            v.mode.word(),
        );
    }
    html.push_str("</table>\n");
}
