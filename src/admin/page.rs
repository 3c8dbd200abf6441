//! The stats page: one HTML page, rendered by the server, readable without
//! JavaScript, that refreshes itself, in the spirit of HAProxy's stats page.
//!
//! A table of the process (queue depth, workers, uptime, version), then
//! per service, as HAProxy's page has one table per proxy, a table of its
//! listener (addresses, accepted, refused, active, bytes, errors,
//! algorithm, rate limit), a chart of its connections per second and p99
//! connection time (inline SVG, `chart.rs`), and one table of its backends
//! (state in colour, weight, connections now, peak, total and per second,
//! bytes, errors by kind, the check's progress toward DOWN or UP, the last
//! check, when it ran and how long it took, the time since the last change
//! of state and the time down ever) with a totals row; at most
//! [`MAX_ROWS`] backend rows per service. The page is built from plain rows
//! ([`Process`], [`Section`], [`BackendRow`]) on the admin listener's
//! thread; every text is escaped.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C prints `### REQUEST FINISHED ###` per request.

use std::fmt::Write;
use std::time::Duration;

use super::chart::{self, Sample};

/// Seconds between two refreshes of the page (`<meta http-equiv="refresh">`).
pub const REFRESH_SECS: u32 = 2;

/// What the page shows of one backend.
#[derive(Debug, Clone, PartialEq)]
pub struct BackendRow {
    /// Its address as given.
    pub name: String,
    /// `up`, `down`, `draining` or `maint`.
    pub state: String,
    /// A backup, served only while no primary is available.
    pub backup: bool,
    /// Its weight.
    pub weight: u32,
    /// Connections now.
    pub active: u64,
    /// Its `max_connections`, shown as `active/limit`; `None`: no cap.
    pub max_connections: Option<usize>,
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
    /// The most connections at once.
    pub peak: u64,
    /// Connections per second over the sampler's last interval.
    pub rate: Option<f64>,
    /// Connections ended by a reset.
    pub resets: u64,
    /// Connections closed by the idle or fin timeout.
    pub timeouts: u64,
    /// The check's streak against its state and the length that flips
    /// it (`(2, 3)`), once a check ran.
    pub progress: Option<(u32, u32)>,
    /// Whether the streak leads up (the backend is down) or down.
    pub toward_up: bool,
    /// Time since the last check ended.
    pub checked_ago: Option<Duration>,
    /// Time down ever.
    pub downtime: Duration,
    /// Where it came from: `file`, `api`, `dns`, `srv`, `etcd`.
    pub origin: &'static str,
    /// What its agent last said (or why it was not heard), when it has
    /// one.
    pub agent: Option<String>,
}

/// The process's row: the pool shared by every service.
#[derive(Debug, Clone)]
pub struct Process {
    /// Clients waiting for a worker now.
    pub queued: u64,
    /// Workers serving a connection now.
    pub busy: u64,
    /// The most workers.
    pub max_workers: u64,
    /// Time since start.
    pub uptime: Duration,
    /// The oldest and busiest connections, as HTML tables (empty when
    /// none is open; `connections.rs`).
    pub connections: String,
}

/// One service's section: its listener row and its backends.
#[derive(Debug, Clone)]
pub struct Section {
    /// The service's name.
    pub name: String,
    /// The addresses clients connect to.
    pub listen: String,
    /// Clients accepted.
    pub accepted: u64,
    /// Clients refused (rate limit, no backend, queue timeout).
    pub refused: u64,
    /// Connections being served now.
    pub active: u64,
    /// Clients waiting for a slot under the backends' `max_connections`.
    pub queued: u64,
    /// The algorithm's name.
    pub algorithm: String,
    /// The rate limit (`20/10s`) or `off`.
    pub rate_limit: String,
    /// Bytes from its clients to backends.
    pub bytes_in: u64,
    /// Bytes from backends to its clients.
    pub bytes_out: u64,
    /// Connections that ended in an error, and accept(2) errors.
    pub errors: u64,
    /// Its chart's points, oldest first.
    pub chart: Vec<Sample>,
    /// Its backends.
    pub backends: Vec<BackendRow>,
    /// The certificates it serves (TLS termination), else none.
    pub certificates: Vec<super::certificates::CertRow>,
}

/// Escapes text for HTML.
pub(super) fn esc(text: &str) -> String {
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
pub fn render(process: &Process, sections: &[Section]) -> String {
    let rows: usize = sections.iter().map(|s| s.backends.len()).sum();
    let mut html = String::with_capacity(4096 + 512 * rows);
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta http-equiv=\"refresh\" content=\"{REFRESH_SECS}\">\
<title>rodizio stats</title><style>\
body{{font-family:sans-serif;margin:1.5em;color:#222}}\
table{{border-collapse:collapse;margin-bottom:1.5em}}\
th,td{{border:1px solid #bbb;padding:.3em .6em;text-align:right}}\
th{{background:#eee}}td.name,td.check{{text-align:left}}td{{white-space:nowrap}}td.check{{white-space:normal}}\
tr.up td.state{{background:#b6eab6}}tr.down td.state{{background:#f4a6a6}}\
tr.draining td.state{{background:#f6dc8c}}tr.maint td.state{{background:#a9c8f0}}\
tr.totals th{{background:#f4f4f4}}\
tr.near td.days{{background:#f6dc8c}}tr.expired td.days{{background:#f4a6a6}}div.chart{{margin-bottom:1em}}\
</style></head><body>\n<h1>rodizio {}</h1>\n",
        esc(env!("CARGO_PKG_VERSION"))
    );
    let p = process;
    let _ = write!(
        html,
        "<table id=\"process\"><tr><th>queued</th><th>workers busy / max</th>\
<th>uptime</th></tr>\n<tr><td>{}</td><td>{} / {}</td><td>{}</td></tr></table>\n",
        p.queued,
        p.busy,
        p.max_workers,
        ago(p.uptime),
    );
    html.push_str(&p.connections);
    let one = sections.len() == 1;
    for section in sections {
        self::section(&mut html, section, one);
    }
    let _ = write!(
        html,
        "<p>This page refreshes every {REFRESH_SECS} s. Metrics for Prometheus: \
<a href=\"/metrics\">/metrics</a>; services as JSON: <a href=\"/services\">/services</a>.</p>\n\
</body></html>\n"
    );
    html
}

/// One service's tables. With `one` service, they keep the plain ids
/// `listener` and `backends`; with several, the ids name the service.
fn section(html: &mut String, s: &Section, one: bool) {
    let name = esc(&s.name);
    let (listener_id, backends_id) = if one {
        ("listener".to_string(), "backends".to_string())
    } else {
        (format!("listener-{name}"), format!("backends-{name}"))
    };
    let _ = write!(
        html,
        "<h2>Service {name}</h2>\n<table id=\"{listener_id}\" data-service=\"{name}\">\
<tr><th>address</th><th>accepted</th><th>refused</th><th>active</th><th>waiting for a slot</th>\
<th>bytes in</th><th>bytes out</th><th>errors</th>\
<th>algorithm</th><th>rate limit</th></tr>\n<tr><td class=\"name\">{}</td><td>{}</td>\
<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr></table>\n",
        esc(&s.listen),
        s.accepted,
        s.refused,
        s.active,
        s.queued,
        bytes(s.bytes_in),
        bytes(s.bytes_out),
        s.errors,
        esc(&s.algorithm),
        esc(&s.rate_limit)
    );
    let _ = writeln!(
        html,
        "<div class=\"chart\" data-service=\"{name}\">{}</div>",
        chart::svg(&s.chart, &s.name, esc)
    );
    let _ = writeln!(
        html,
        "<table id=\"{backends_id}\" data-service=\"{name}\"><tr><th>backend</th>\
<th>state</th><th>weight</th><th>active</th><th>peak</th><th>total</th><th>rate/s</th>\
<th>bytes in</th><th>bytes out</th><th>connect failures</th><th>resets</th><th>timeouts</th>\
<th>check</th><th>last check</th><th>checked</th><th>check took</th><th>since change</th>\
<th>downtime</th></tr>",
    );
    let shown = s.backends.len().min(MAX_ROWS);
    for b in &s.backends[..shown] {
        backend(html, b);
    }
    if shown < s.backends.len() {
        let _ = writeln!(
            html,
            "<tr class=\"more\"><td class=\"name\" colspan=\"18\">{} more backends, \
not shown (all of them: <a href=\"/backends\">/backends</a>, <a href=\"/metrics\">/metrics</a>)\
</td></tr>",
            s.backends.len() - shown
        );
    }
    totals(html, &s.backends);
    html.push_str("</table>\n");
    let certs_id = if one {
        "certificates".to_string()
    } else {
        format!("certificates-{name}")
    };
    super::certificates::table(html, &s.certificates, &certs_id, esc);
}

/// The most backend rows a service's table shows; the totals row still
/// counts every backend. A page of thousands of rows is neither read nor
/// quick to build every [`REFRESH_SECS`].
pub const MAX_ROWS: usize = 200;

/// One backend's row.
fn backend(html: &mut String, b: &BackendRow) {
    let check = b.last_check.as_deref().unwrap_or("-");
    let took = b.check_duration.map_or("-".to_string(), |d| {
        format!("{:.1} ms", d.as_secs_f64() * 1000.0)
    });
    let since = b.since_change.map_or("-".to_string(), ago);
    let checked = b
        .checked_ago
        .map_or("-".to_string(), |d| format!("{} ago", ago(d)));
    let progress = b.progress.map_or("-".to_string(), |(run, needed)| {
        let toward = if b.toward_up { "UP" } else { "DOWN" };
        format!("{run}/{needed} toward {toward}")
    });
    let state = esc(&b.state);
    let _ = writeln!(
        html,
        "<tr class=\"{state}\" data-backend=\"{bname}\"><td class=\"name\">{bname}{mark} \
<small class=\"origin\">{origin}</small>{agent}</td>\
<td class=\"state\">{upper}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"progress\">{progress}</td>\
<td class=\"check\">{}</td><td>{checked}</td><td>{took}</td><td>{since}</td><td>{}</td></tr>",
        b.weight,
        b.max_connections
            .map_or(b.active.to_string(), |m| format!("{}/{m}", b.active)),
        b.peak,
        b.total,
        b.rate.map_or("-".to_string(), rate),
        bytes(b.bytes_in),
        bytes(b.bytes_out),
        b.connect_failures,
        b.resets,
        b.timeouts,
        esc(check),
        ago(b.downtime),
        bname = esc(&b.name),
        upper = state.to_uppercase(),
        mark = if b.backup {
            " <small>backup</small>"
        } else {
            ""
        },
        origin = b.origin,
        agent = b.agent.as_deref().map_or(String::new(), |a| {
            format!(" <small class=\"agent\">agent: {}</small>", esc(a))
        }),
    );
}

/// The totals row of a service's backends.
fn totals(html: &mut String, backends: &[BackendRow]) {
    let sum = |f: fn(&BackendRow) -> u64| backends.iter().map(f).sum::<u64>();
    let rates: f64 = backends.iter().filter_map(|b| b.rate).sum();
    let up = backends.iter().filter(|b| b.state == "up").count();
    let _ = writeln!(
        html,
        "<tr class=\"totals\"><th>total</th><th>{up}/{} up</th><th></th><th>{}</th><th></th>\
<th>{}</th><th>{}</th><th>{}</th><th>{}</th><th>{}</th><th>{}</th><th>{}</th>\
<th colspan=\"6\"></th></tr>",
        backends.len(),
        sum(|b| b.active),
        sum(|b| b.total),
        rate(rates),
        bytes(sum(|b| b.bytes_in)),
        bytes(sum(|b| b.bytes_out)),
        sum(|b| b.connect_failures),
        sum(|b| b.resets),
        sum(|b| b.timeouts),
    );
}

/// `12.4`: connections per second.
fn rate(r: f64) -> String {
    format!("{r:.1}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, state: &str) -> BackendRow {
        BackendRow {
            name: name.into(),
            state: state.into(),
            backup: false,
            weight: 1,
            active: 2,
            max_connections: None,
            total: 30,
            bytes_in: 1536,
            bytes_out: 3 << 20,
            connect_failures: 0,
            last_check: Some("ok".into()),
            origin: "file",
            agent: None,
            check_duration: Some(Duration::from_micros(1500)),
            since_change: Some(Duration::from_secs(125)),
            peak: 7,
            rate: Some(2.5),
            resets: 3,
            timeouts: 4,
            progress: Some((2, 3)),
            toward_up: false,
            checked_ago: Some(Duration::from_secs(1)),
            downtime: Duration::from_secs(65),
        }
    }

    fn process() -> Process {
        Process {
            queued: 0,
            busy: 2,
            max_workers: 4096,
            uptime: Duration::from_secs(3725),
            connections: String::new(),
        }
    }

    fn section(name: &str, backends: Vec<BackendRow>) -> Section {
        Section {
            name: name.into(),
            listen: "0.0.0.0:8080".into(),
            accepted: 100,
            refused: 1,
            active: 2,
            queued: 0,
            algorithm: "round-robin".into(),
            rate_limit: "off".into(),
            bytes_in: 2048,
            bytes_out: 4096,
            errors: 5,
            chart: vec![],
            backends,
            certificates: vec![],
        }
    }

    #[test]
    fn a_row_per_backend_with_its_state_and_numbers() {
        let html = render(
            &process(),
            &[section(
                "default",
                vec![row("127.0.0.1:8001", "up"), row("127.0.0.1:8002", "down")],
            )],
        );
        assert!(html.contains("<table id=\"listener\" data-service=\"default\">"));
        assert!(html.contains("<table id=\"backends\" data-service=\"default\">"));
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
    fn a_capped_backend_shows_active_over_its_cap_and_the_service_its_queue() {
        let mut capped = row("127.0.0.1:8001", "up");
        capped.max_connections = Some(5);
        let mut s = section("default", vec![capped, row("127.0.0.1:8002", "up")]);
        s.queued = 7;
        let html = render(&process(), &[s]);
        assert!(
            html.contains("<td>1</td><td>2/5</td><td>7</td><td>30</td>"),
            "{html}"
        );
        assert!(
            html.contains("<td>1</td><td>2</td><td>7</td><td>30</td>"),
            "{html}"
        );
        assert!(html.contains("<th>waiting for a slot</th>"), "{html}");
        assert!(html.contains("<td>2</td><td>7</td>"), "{html}");
    }

    #[test]
    fn a_backup_is_marked() {
        let mut backup = row("127.0.0.1:8003", "up");
        backup.backup = true;
        let rows = vec![row("127.0.0.1:8001", "up"), backup];
        let html = render(&process(), &[section("default", rows)]);
        assert!(
            html.contains(
                "127.0.0.1:8003 <small>backup</small> <small class=\"origin\">file</small></td>"
            ),
            "{html}"
        );
        assert_eq!(html.matches("<small>backup</small>").count(), 1);
        let mut srv = row("b.test:8004", "up");
        (srv.origin, srv.agent) = ("srv", Some("up 50% <".into()));
        let html = render(&process(), &[section("default", vec![srv])]);
        assert!(
            html.contains("<small class=\"origin\">srv</small> <small class=\"agent\">agent: up 50% &lt;</small>"),
            "{html}"
        );
    }

    #[test]
    fn text_is_escaped() {
        let mut bad = row("<b>x</b>", "up");
        bad.last_check = Some("GET /health answered \"500\" & <closed>".into());
        let html = render(&process(), &[section("a<b", vec![bad])]);
        assert!(html.contains("Service a&lt;b"));
        assert!(html.contains("&lt;b&gt;x&lt;/b&gt;"));
        assert!(html.contains("&quot;500&quot; &amp; &lt;closed&gt;"));
        assert!(!html.contains("<b>x</b>"));
    }

    #[test]
    fn one_section_per_service() {
        let html = render(
            &process(),
            &[
                section("web", vec![row("127.0.0.1:8001", "up")]),
                section(
                    "db",
                    vec![row("127.0.0.1:5432", "up"), row("127.0.0.1:5433", "maint")],
                ),
            ],
        );
        assert_eq!(html.matches("<h2>Service ").count(), 2);
        assert!(html.contains("<table id=\"backends-web\" data-service=\"web\">"));
        assert!(html.contains("<table id=\"listener-db\" data-service=\"db\">"));
        let db = html.split("<h2>Service db</h2>").nth(1).unwrap();
        assert_eq!(db.matches("data-backend=").count(), 2);
        assert!(!db.contains("127.0.0.1:8001"));
    }

    #[test]
    fn every_new_figure_a_totals_row_and_a_chart() {
        let mut down = row("127.0.0.1:8002", "down");
        down.toward_up = true;
        down.progress = Some((1, 2));
        down.rate = None;
        let mut s = section("default", vec![row("127.0.0.1:8001", "up"), down]);
        s.chart = (0..10)
            .map(|i| Sample {
                rate: i as f64,
                p99: Some(0.003),
            })
            .collect();
        let html = render(&process(), &[s]);
        assert!(html.contains("<th>peak</th>") && html.contains("<th>downtime</th>"));
        assert!(
            html.contains("<td>2</td><td>7</td><td>30</td><td>2.5</td>"),
            "{html}"
        );
        assert!(html.contains("<td>0</td><td>3</td><td>4</td>"), "{html}");
        assert!(html.contains("<td class=\"progress\">2/3 toward DOWN</td>"));
        assert!(html.contains("<td class=\"progress\">1/2 toward UP</td>"));
        assert!(html.contains("<td>1s ago</td>") && html.contains("<td>1m 5s</td></tr>"));
        assert!(
            html.contains(
                "<tr class=\"totals\"><th>total</th><th>1/2 up</th><th></th><th>4</th><th></th>\
<th>60</th><th>2.5</th><th>3.0 KiB</th><th>6.0 MiB</th><th>0</th><th>6</th><th>8</th>"
            ),
            "{html}"
        );
        assert!(
            html.contains("<td>2.0 KiB</td><td>4.0 KiB</td><td>5</td>"),
            "{html}"
        );
        assert_eq!(html.matches("<svg class=\"chart\"").count(), 1);
        assert_eq!(html.matches("<polyline").count(), 2);
        assert!(!html.contains("<script"));
    }

    #[test]
    fn a_service_of_many_backends_shows_at_most_max_rows() {
        let many: Vec<BackendRow> = (0..1000)
            .map(|i| row(&format!("10.0.{}.{}:80", i / 250, i % 250), "up"))
            .collect();
        let html = render(&process(), &[section("big", many)]);
        assert_eq!(html.matches("data-backend=").count(), MAX_ROWS);
        assert!(html.contains("800 more backends, not shown"), "{html}");
        assert!(html.contains("<th>1000/1000 up</th>"));
        assert!(html.len() < 200_000, "{}", html.len());
    }
}
