//! The stats page: one HTML page, rendered by the server, readable without
//! JavaScript, that refreshes itself, in the spirit of HAProxy's stats page.
//!
//! A table of backends (state in colour, weight, connections, bytes,
//! connect failures, the last check and how long it took, the time since
//! the last change of state) and one of the listener (accepted, refused,
//! queue depth, workers, uptime, version, algorithm, rate limit). The page
//! is built from plain rows ([`BackendRow`], [`ListenerRow`]) on the admin
//! listener's thread; every text is escaped.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C prints `### REQUEST FINISHED ###` per request.

use std::fmt::Write;
use std::time::Duration;

/// Seconds between two refreshes of the page (`<meta http-equiv="refresh">`).
pub const REFRESH_SECS: u32 = 2;

/// What the page shows of one backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendRow {
    /// Its address as given.
    pub name: String,
    /// `up`, `down`, `draining` or `maint`.
    pub state: String,
    /// Its weight.
    pub weight: u32,
    /// Connections now.
    pub active: u64,
    /// Connections ever.
    pub total: u64,
    /// Bytes from clients to it.
    pub bytes_in: u64,
    /// Bytes from it to clients.
    pub bytes_out: u64,
    /// Failed connects to it.
    pub connect_failures: u64,
    /// The last check's result (`ok`, or why it failed), if any ran.
    pub last_check: Option<String>,
    /// How long the last check took.
    pub check_duration: Option<Duration>,
    /// Time since its state last changed.
    pub since_change: Option<Duration>,
}

/// What the page shows of the listener and the process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerRow {
    /// The address clients connect to.
    pub listen: String,
    /// Clients accepted.
    pub accepted: u64,
    /// Clients refused (rate limit, no backend, queue timeout).
    pub refused: u64,
    /// Clients waiting for a worker now.
    pub queued: u64,
    /// Workers serving a connection now.
    pub busy: u64,
    /// The most workers.
    pub max_workers: u64,
    /// Time since start.
    pub uptime: Duration,
    /// The algorithm's name.
    pub algorithm: String,
    /// The rate limit (`20/10s`) or `off`.
    pub rate_limit: String,
}

/// Escapes text for HTML.
fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `1.2 MiB`, `512 B`.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// `3d 4h`, `2h 5m`, `4m 10s`, `12s`.
fn ago(d: Duration) -> String {
    let s = d.as_secs();
    let (days, hours, mins, secs) = (s / 86400, s / 3600 % 24, s / 60 % 60, s % 60);
    if days > 0 {
        format!("{days}d {hours}h")
    } else if hours > 0 {
        format!("{hours}h {mins}m")
    } else if mins > 0 {
        format!("{mins}m {secs}s")
    } else {
        format!("{secs}s")
    }
}

/// The whole page.
pub fn render(listener: &ListenerRow, backends: &[BackendRow]) -> String {
    let mut html = String::with_capacity(4096 + 512 * backends.len());
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta http-equiv=\"refresh\" content=\"{REFRESH_SECS}\">\
<title>rodizio stats</title><style>\
body{{font-family:sans-serif;margin:1.5em;color:#222}}\
table{{border-collapse:collapse;margin-bottom:1.5em}}\
th,td{{border:1px solid #bbb;padding:.3em .6em;text-align:right}}\
th{{background:#eee}}td.name,td.check{{text-align:left}}\
tr.up td.state{{background:#b6eab6}}tr.down td.state{{background:#f4a6a6}}\
tr.draining td.state{{background:#f6dc8c}}tr.maint td.state{{background:#a9c8f0}}\
</style></head><body>\n<h1>rodizio {}</h1>\n",
        esc(env!("CARGO_PKG_VERSION"))
    );
    let l = listener;
    let _ = write!(
        html,
        "<h2>Listener</h2>\n<table id=\"listener\"><tr><th>address</th><th>accepted</th>\
<th>refused</th><th>queued</th><th>workers busy / max</th><th>uptime</th>\
<th>algorithm</th><th>rate limit</th></tr>\n<tr><td class=\"name\">{}</td><td>{}</td>\
<td>{}</td><td>{}</td><td>{} / {}</td><td>{}</td><td>{}</td><td>{}</td></tr></table>\n",
        esc(&l.listen),
        l.accepted,
        l.refused,
        l.queued,
        l.busy,
        l.max_workers,
        ago(l.uptime),
        esc(&l.algorithm),
        esc(&l.rate_limit)
    );
    html.push_str(
        "<h2>Backends</h2>\n<table id=\"backends\"><tr><th>backend</th><th>state</th>\
<th>weight</th><th>active</th><th>total</th><th>bytes in</th><th>bytes out</th>\
<th>connect failures</th><th>last check</th><th>check took</th><th>since change</th></tr>\n",
    );
    for b in backends {
        let check = b.last_check.as_deref().unwrap_or("-");
        let took = b.check_duration.map_or("-".to_string(), |d| {
            format!("{:.1} ms", d.as_secs_f64() * 1000.0)
        });
        let since = b.since_change.map_or("-".to_string(), ago);
        let state = esc(&b.state);
        let _ = writeln!(
            html,
            "<tr class=\"{state}\" data-backend=\"{name}\"><td class=\"name\">{name}</td>\
<td class=\"state\">{upper}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
<td>{}</td><td class=\"check\">{}</td><td>{took}</td><td>{since}</td></tr>",
            b.weight,
            b.active,
            b.total,
            bytes(b.bytes_in),
            bytes(b.bytes_out),
            b.connect_failures,
            esc(check),
            name = esc(&b.name),
            upper = state.to_uppercase(),
        );
    }
    let _ = write!(
        html,
        "</table>\n<p>This page refreshes every {REFRESH_SECS} s. Metrics for Prometheus: \
<a href=\"/metrics\">/metrics</a>; backends as JSON: <a href=\"/backends\">/backends</a>.</p>\n\
</body></html>\n"
    );
    html
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, state: &str) -> BackendRow {
        BackendRow {
            name: name.into(),
            state: state.into(),
            weight: 1,
            active: 2,
            total: 30,
            bytes_in: 1536,
            bytes_out: 3 << 20,
            connect_failures: 0,
            last_check: Some("ok".into()),
            check_duration: Some(Duration::from_micros(1500)),
            since_change: Some(Duration::from_secs(125)),
        }
    }

    fn listener() -> ListenerRow {
        ListenerRow {
            listen: "0.0.0.0:8080".into(),
            accepted: 100,
            refused: 1,
            queued: 0,
            busy: 2,
            max_workers: 4096,
            uptime: Duration::from_secs(3725),
            algorithm: "round-robin".into(),
            rate_limit: "off".into(),
        }
    }

    #[test]
    fn a_row_per_backend_with_its_state_and_numbers() {
        let html = render(
            &listener(),
            &[row("127.0.0.1:8001", "up"), row("127.0.0.1:8002", "down")],
        );
        assert!(html.contains("<meta http-equiv=\"refresh\" content=\"2\">"));
        assert_eq!(html.matches("data-backend=").count(), 2);
        assert!(html.contains("<tr class=\"down\" data-backend=\"127.0.0.1:8002\">"));
        assert!(html.contains("<td class=\"state\">DOWN</td>"));
        assert!(html.contains("<td>1.5 KiB</td><td>3.0 MiB</td>"), "{html}");
        assert!(html.contains("<td>1.5 ms</td><td>2m 5s</td>"), "{html}");
        assert!(html.contains("<td>2 / 4096</td><td>1h 2m</td>"), "{html}");
        assert!(!html.contains("<script"));
    }

    #[test]
    fn text_is_escaped() {
        let mut bad = row("<b>x</b>", "up");
        bad.last_check = Some("GET /health answered \"500\" & <closed>".into());
        let html = render(&listener(), &[bad]);
        assert!(html.contains("&lt;b&gt;x&lt;/b&gt;"));
        assert!(html.contains("&quot;500&quot; &amp; &lt;closed&gt;"));
        assert!(!html.contains("<b>x</b>"));
    }
}
