//! rodizio: a thread-per-connection TCP load balancer.
//!
//! A Rust port of the C load balancer of the article "como construir o seu
//! próprio balanceador de carga" (round robin, a FIFO queue, a pool of
//! fixed-stack threads), kept in the same shape and grown into a real TCP
//! proxy: full duplex, binary safe, half-close aware, failing over between
//! backends, and never letting one connection's failure touch another.
//!
//! It is blocking on purpose: one OS thread serves one connection from start
//! to end, exactly as in the article, so the code reads top to bottom like
//! the C it ports.
//!
//! ```text
//! client ──TCP──▶ accept loop, one per listening address of each service
//!                   (listener.rs: blocking accept, SO_REUSEADDR, backlog 4096)
//!                   │ proxy.admit(client, peer): allow/deny, per-client cap,
//!                   │   rate limit, scheduler.pick → Pick        (proxy/admission.rs)
//!                   │   refused ──▶ close (or 429/503), reported (proxy/refusal.rs)
//!                   │   (a PROXY header or SNI first: the worker admits it)
//!                   ▼
//!                 pool.submit(Job::new(proxy, client, peer, Picked(pick), ..))
//!                   │ → queue                                     (queue.rs: Mutex<VecDeque> + Condvar)
//!                   ▼
//!                 worker thread, 64 KiB stack, reused             (pool.rs)
//!                   │ queued too long? PROXY header? first byte?  (proxy/, proxy/header.rs)
//!                   │ backend.connect(), fail over to the next    (proxy/, backend.rs)
//!                   │ pump both ways in 4096-byte chunks, poll(2) (proxy/pump/, poll.rs)
//!                   │ shutdown(Both) then close, both sockets
//!                   │ → Outcome, counted and told once            (proxy/report.rs)
//!                   ▼
//!                 backend
//! ```
//!
//! # Map
//!
//! By directory: each directory's own doc (its `mod.rs`, or `backend.rs`
//! for `backend/`) lists its files. A test checks both levels.
//!
//! **The data path**, a client's bytes from accept to close:
//! - `listener`: the listening sockets, one accept loop per address.
//! - `queue`, `pool`: the article's FIFO and its fixed-stack worker threads.
//! - `proxy/`: one connection's life: the PROXY header, connect and
//!   fail-over, the wait for a backend slot, the pump (`pump/`,
//!   `kernel_relay/`) and the one report of how it ended.
//! - `conduit/`: a worker's buffers and pipes; what a pump is told and
//!   tells back.
//! - `tls_term/`: TLS termination: certificates, handshake, the TLS pump.
//! - `sni/`: a ClientHello's server name, parsed and peeked;
//!   `sni_router`: the worker's choice of a service by it.
//! - `proxy_protocol/`: the PROXY protocol, read and sent.
//! - `limiter/`: per-client rate limits and connection caps, at accept.
//! - `backend` (and `backend/`): one backend, its live state, its connect.
//! - `scheduler/`: which backend gets the next client, one file per algorithm.
//! - `access_log/`: one line per connection; `trace/`: `--trace`, the
//!   narrated life of every connection.
//!
//! **The control plane**, threads beside the data path:
//! - `health/`: the active checks (their thread) and the passive ones.
//! - `service`, `live`, `running`: one service at run time, its settings
//!   read live, the services running now.
//! - `balancer`: [`Balancer`] wires the parts together; the drain.
//! - `reload/`: the configuration applied again (SIGHUP), or compared.
//! - `admin/`: the admin API, the metrics and the stats page.
//! - `signals`, `systemd`: the signal thread; systemd's readiness,
//!   reload and stop notifications and the sockets it passes;
//!   `upgrade`: the listening sockets handed to a new process
//!   (`upgrade_socket`).
//! - `resolver`, `reaper`: backend names looked up again; drained
//!   backends removed once their last connection ends; `srv_follow`:
//!   a `srv:` entry's backends following its records; `etcd`,
//!   `etcd_conn`, `etcd_follow`: a service's backends following an etcd
//!   prefix (its HTTP client, its connection, plain or TLS, its thread).
//!
//! **Configuration**:
//! - `config/`: [`Config`], every setting declared once with its default
//!   (the C `#define`s), the file, the checks that span services.
//! - `cli`: the command-line flags (clap, only here); `prompt`: the
//!   article's interactive questions; `privileges`: `user` and `group`;
//!   `files/`: how a file an operator names is read (directly, or by the
//!   root reader kept when root is given up).
//!
//! **Tools**: `simulate` (the schedulers asked for N picks, no socket),
//! `preflight/` (this host's limits against the settings), `demo/` (the
//! built-in demo HTTP backend).
//!
//! **Leaves**, which import no module above them: `error` ([`Error`]),
//! `units` (durations, sizes and off/on/auto switches as people write them), `stats` (one table
//! of counters), `tally` (a backend's peak and errors by kind), `throttle`
//! (a log line at most once a second), `reply` (the 429/502/503 replies),
//! `poll` (`poll(2)` waits), `dial` (one bounded TCP connect), `system`
//! (the OS's limits, its errors in words), `kernel_sched` (the threads'
//! scheduling policy), `lookup` (a backend's host name and addresses),
//! `srv` (a DNS SRV name's records, for `srv:` backends),
//! `availability` (a backend's flips, told to the schedulers holding it),
//! `waitlist` (clients waiting for a backend slot), `connections` (the
//! live table of connections, a slot per worker), `slots` (a service's
//! `max_connections`), `pending` (the TLS handshakes and SNI peeks in
//! progress, bounded by `tls_max_pending`), `reserve` (descriptors kept
//! aside for when the process has none left), `shutdown` (the stop
//! trigger, [`Shutdown`]).
//!
//! # Layers
//!
//! Dependencies point one way: a module uses the modules of its own floor
//! or of the floors below it, never above, and no two modules of a floor
//! use each other in a circle. Each floor owns its settings types;
//! `config` (floor 6) gathers them into one [`Config`]. A test
//! (`the_layers_point_one_way`) reads this list and every `crate::` path of
//! `src/` outside the tests.
//!
//! 1. leaves: `error`, `units`, `stats`, `tally`, `throttle`, `reply`,
//!    `poll`, `dial`, `system`, `kernel_sched`, `lookup`, `availability`,
//!    `waitlist`, `slots`, `shutdown`, `queue`, `conduit`, `privileges`,
//!    `pending`, `files`, `connections`, `srv`, `reserve`
//! 2. the backend and its choice: `backend`, `scheduler`,
//!    `proxy_protocol` (the codec a backend's spec names)
//! 3. what the data path calls: `access_log`, `trace`, `limiter`,
//!    `reaper`, `resolver`, `srv_follow`, `systemd`
//! 4. protocol pieces and checks: `tls_term`, `sni`, `health`, and etcd's
//!    client over them: `etcd_conn`, `etcd`, `etcd_follow`
//! 5. the connection: `proxy`
//! 6. the settings gathered: `config`, `live`
//! 7. the article's machine: `listener`, `pool`
//! 8. a service at run time: `service`, `running`, `sni_router`
//! 9. the running balancer: `admin`, `balancer`, `reload`, `signals`,
//!    `upgrade`
//! 10. the program: `cli`, `prompt`, `preflight`, `simulate`, `demo`, `main`
//!
//! Every module is public, on purpose: this crate is also read as a
//! companion to the article, and its tests and readers reach every part
//! (a pump, a probe, the limiter's table) directly. What a program embedding
//! it needs is [`Config`], [`Balancer`], [`Shutdown`] and [`Error`].
//!
//! # The C article, function by function
//!
//! | C                              | Rust                                        |
//! |--------------------------------|---------------------------------------------|
//! | `queue.c`, `queue.h`, `queue_mutex` | [`queue::Queue`]                       |
//! | `struct server_info servers[]` | [`backend::Backend`]                        |
//! | `servers_entry()`              | [`prompt::servers_entry`]                   |
//! | `create_balancer_socket()`     | [`listener::bind`]                          |
//! | `get_next_server_id()`         | [`scheduler::Scheduler::pick`] (`scheduler/round_robin.rs`) |
//! | `get_next_thread()`, `threads[]`, `pthread_attr_setstacksize` | [`pool::Pool`] |
//! | `proxy_function()`             | [`proxy::Proxy::handle`], [`proxy::pump()`] |
//! | `get_final_server_socket()`    | [`backend::Backend::connect`]               |
//! | `main()`                       | [`Balancer::bind`], [`Balancer::run`], `main.rs` |
//! | `#define _PORT` etc.           | [`Config`]                                  |
//!
//! `docs/c-to-rust.md` tells what changed in each and why.
//!
//! # Example
//!
//! ```no_run
//! use rodizio::{backend::BackendSpec, Balancer, Config, Shutdown};
//!
//! # fn main() -> Result<(), rodizio::Error> {
//! let config = Config {
//!     listen: "127.0.0.1:8080".parse().unwrap(),
//!     backends: vec![BackendSpec::parse("127.0.0.1:8001")?],
//!     ..Config::default()
//! };
//! let balancer = Balancer::bind(config)?;
//! let shutdown = Shutdown::new();
//! // Another thread may call shutdown.trigger() to stop it.
//! balancer.run(&shutdown)?;
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

pub mod access_log;
pub mod admin;
pub(crate) mod availability;
pub mod backend;
pub mod balancer;
pub mod cli;
pub mod conduit;
pub mod config;
pub mod connections;
pub mod demo;
pub mod dial;
pub mod error;
pub mod etcd;
pub mod etcd_conn;
pub mod etcd_follow;
pub mod files;
pub mod health;
pub mod kernel_sched;
pub mod limiter;
pub mod listener;
pub mod live;
pub mod lookup;
pub mod pending;
pub mod poll;
pub mod pool;
pub mod preflight;
pub mod privileges;
pub mod prompt;
pub mod proxy;
pub mod proxy_protocol;
pub mod queue;
pub mod reaper;
pub mod reload;
pub mod reply;
pub mod reserve;
pub mod resolver;
pub mod running;
pub mod scheduler;
pub mod service;
pub mod shutdown;
pub mod signals;
pub mod simulate;
pub mod slots;
pub mod sni;
pub mod sni_router;
pub mod srv;
pub mod srv_follow;
pub mod stats;
pub mod system;
pub mod systemd;
pub mod tally;
pub mod throttle;
pub mod tls_term;
pub mod trace;
pub mod units;
pub mod upgrade;
pub mod waitlist;

/// What the unit tests share: a loopback pair of sockets.
#[cfg(test)]
mod test_support;

pub use balancer::Balancer;
pub use config::Config;
pub use error::{Error, Result};
pub use shutdown::Shutdown;

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::{Path, PathBuf};

    fn src() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
    }

    fn read(path: &Path) -> String {
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// The `//!` lines at the top of a module file, joined.
    fn inner_doc(path: &Path) -> String {
        read(path)
            .lines()
            .map(str::trim_start)
            .skip_while(|l| l.is_empty())
            .map_while(|l| l.strip_prefix("//!"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The lines of `doc` under `# title`, up to the next `# ` heading.
    fn section(doc: &str, title: &str) -> String {
        let text: Vec<&str> = doc
            .lines()
            .skip_while(|l| l.trim() != format!("# {title}"))
            .skip(1)
            .take_while(|l| !l.trim_start().starts_with("# "))
            .collect();
        assert!(!text.is_empty(), "no # {title} section in src/lib.rs");
        text.join("\n")
    }

    /// Whether `doc` names the module `part`: `` `part` ``, `` `part/` ``,
    /// `` `part.rs` `` or `` `mod@part` `` (an intra-doc link).
    fn names(doc: &str, part: &str) -> bool {
        ["", "mod@"].iter().any(|pre| {
            ["", "/", ".rs"]
                .iter()
                .any(|post| doc.contains(&format!("`{pre}{part}{post}`")))
        })
    }

    /// Every `.rs` file under `dir`, at any depth.
    fn rs_files(dir: &Path, all: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                rs_files(&path, all);
            } else if path.extension().is_some_and(|e| e == "rs") {
                all.push(path);
            }
        }
    }

    /// The modules only the tests compile (`#[cfg(test)] mod name;` in a
    /// file of `src/`), as the paths they may have: `name.rs` and `name/`.
    fn test_only() -> BTreeSet<PathBuf> {
        let mut all = Vec::new();
        rs_files(&src(), &mut all);
        let mut found = BTreeSet::new();
        for file in all {
            let text = read(&file);
            let mut lines = text.lines().map(str::trim);
            while let Some(line) = lines.next() {
                let Some(rest) = line.strip_prefix("#[cfg(test)]") else {
                    continue;
                };
                let item = Some(rest.trim())
                    .filter(|r| !r.is_empty())
                    .or_else(|| lines.by_ref().find(|l| !l.starts_with("#[")));
                let Some(name) = item
                    .filter(|l| l.contains("mod "))
                    .and_then(|l| l.strip_suffix(';'))
                    .and_then(|l| l.split_whitespace().last())
                else {
                    continue;
                };
                let stem = file.file_stem().unwrap().to_string_lossy();
                let base = if ["lib", "main", "mod"].contains(&stem.as_ref()) {
                    file.parent().unwrap().to_path_buf()
                } else {
                    file.with_extension("")
                };
                found.insert(base.join(format!("{name}.rs")));
                found.insert(base.join(name));
            }
        }
        found
    }

    /// The modules a directory holds: its `name.rs` files (not `mod.rs`,
    /// nor the crate roots) and its sub-directories, test-only modules
    /// (`tests.rs`, a test helper) aside.
    fn parts(dir: &Path) -> BTreeSet<String> {
        let skip = test_only();
        let mut parts = BTreeSet::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            if skip.contains(&path) {
                continue;
            }
            if path.is_dir()
                || path.extension().is_some_and(|e| e == "rs")
                    && !["lib", "main", "mod", "tests"].contains(&name.as_str())
            {
                parts.insert(name);
            }
        }
        parts
    }

    /// Every directory under `dir`, at any depth.
    fn directories(dir: &Path, all: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                all.push(path.clone());
                directories(&path, all);
            }
        }
    }

    /// The crate map (`# Map` in this file's doc) names every top-level
    /// module: a module added or renamed without its place in the map
    /// fails here. The files inside a directory are its own doc's to list.
    #[test]
    fn the_crate_map_names_every_top_level_module() {
        let map = section(&inner_doc(&src().join("lib.rs")), "Map");
        let missing: Vec<String> = parts(&src())
            .into_iter()
            .filter(|m| !names(&map, m))
            .collect();
        assert!(
            missing.is_empty(),
            "not in the crate map of src/lib.rs: {missing:?}"
        );
    }

    /// Each directory's own doc (`x/mod.rs`, or `x.rs` beside `x/`) names
    /// every file and sub-directory of `x/`.
    #[test]
    fn each_directory_doc_names_its_files() {
        let mut dirs = Vec::new();
        directories(&src(), &mut dirs);
        let mut missing = Vec::new();
        for dir in dirs {
            let own = match dir.join("mod.rs") {
                m if m.exists() => m,
                _ => dir.with_extension("rs"),
            };
            let doc = inner_doc(&own);
            for part in parts(&dir) {
                if !names(&doc, &part) {
                    missing.push(format!(
                        "{}: {part}",
                        own.strip_prefix(src()).unwrap().display()
                    ));
                }
            }
        }
        assert!(
            missing.is_empty(),
            "parts not named in their directory's doc: {missing:#?}"
        );
    }

    /// The floors of `# Layers` in this file's doc: module to floor number.
    fn floors() -> BTreeMap<String, usize> {
        let layers = section(&inner_doc(&src().join("lib.rs")), "Layers");
        let mut floors = BTreeMap::new();
        let mut floor = 0;
        for line in layers.lines().map(str::trim) {
            if let Some((n, _)) = line.split_once(". ") {
                if let Ok(n) = n.parse::<usize>() {
                    floor = n;
                }
            }
            if floor == 0 {
                continue; // the prose before the list
            }
            if line.is_empty() {
                break; // the list's end
            }
            for name in line.split('`').skip(1).step_by(2) {
                let name = name.trim_end_matches('/');
                let before = floors.insert(name.to_string(), floor);
                assert!(before.is_none(), "{name} is on two floors of # Layers");
            }
        }
        floors
    }

    /// `text` without its comments and its `#[cfg(test)]` items (a
    /// `mod tests;` line, or a block up to its closing brace).
    fn without_tests(text: &str) -> String {
        let mut out = String::new();
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            if let Some(rest) = line.trim_start().strip_prefix("#[cfg(test)]") {
                let (mut depth, mut opened) = (0i64, false);
                let same_line = Some(rest).filter(|r| !r.trim().is_empty());
                for item in same_line.into_iter().chain(lines.by_ref()) {
                    depth += item.matches('{').count() as i64;
                    depth -= item.matches('}').count() as i64;
                    opened |= item.contains('{');
                    if (!opened && item.trim_end().ends_with(';')) || (opened && depth <= 0) {
                        break;
                    }
                }
                continue;
            }
            out.push_str(line.split("//").next().unwrap_or(""));
            out.push('\n');
        }
        out
    }

    /// The top-level modules `text` uses: every `crate::name` path (an
    /// item the crate root re-exports, such as `crate::Config`, counts as
    /// its module).
    fn uses(text: &str, roots: &BTreeMap<String, String>) -> BTreeSet<(String, String)> {
        let prefix = "crate::";
        let mut found = BTreeSet::new();
        for (at, _) in text.match_indices(&prefix) {
            let rest = &text[at + prefix.len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let module = roots.get(&name).cloned().unwrap_or(name.clone());
            let path: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            found.insert((module, format!("{prefix}{path}")));
        }
        found
    }

    /// The items the crate root re-exports (`pub use config::Config;`):
    /// item name to module.
    fn root_exports() -> BTreeMap<String, String> {
        let mut roots = BTreeMap::new();
        for line in read(&src().join("lib.rs")).lines() {
            let Some(rest) = line.strip_prefix("pub use ") else {
                continue;
            };
            let Some((module, items)) = rest.split_once("::") else {
                continue;
            };
            for item in items.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
                if !item.is_empty() {
                    roots.insert(item.to_string(), module.to_string());
                }
            }
        }
        roots
    }

    /// Every file of `src/` with the top-level module it belongs to,
    /// test-only modules aside.
    fn files(
        dir: &Path,
        top: Option<&str>,
        skip: &BTreeSet<PathBuf>,
        all: &mut Vec<(String, PathBuf)>,
    ) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            let module = top.unwrap_or(&name).to_string();
            if skip.contains(&path) {
                continue;
            }
            if path.is_dir() {
                files(&path, Some(&module), skip, all);
            } else if path.extension().is_some_and(|e| e == "rs")
                && !["lib", "tests"].contains(&name.as_str())
            {
                all.push((module, path));
            }
        }
    }

    /// `# Layers` is true: every top-level module is on one floor, no
    /// code (tests aside) uses a module of a floor above its own, and the
    /// modules of a floor use each other without a circle.
    #[test]
    fn the_layers_point_one_way() {
        let floors = floors();
        let modules = parts(&src());
        let unplaced: Vec<&str> = modules
            .iter()
            .map(String::as_str)
            .chain(["main"])
            .filter(|m| !floors.contains_key(*m))
            .collect();
        assert!(unplaced.is_empty(), "on no floor of # Layers: {unplaced:?}");
        let stale: Vec<&String> = floors
            .keys()
            .filter(|m| *m != "main" && !modules.contains(*m))
            .collect();
        assert!(stale.is_empty(), "in # Layers, but no module: {stale:?}");

        let roots = root_exports();
        let mut all = Vec::new();
        files(&src(), None, &test_only(), &mut all);
        let mut upward = Vec::new();
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (module, path) in &all {
            for (used, import) in uses(&without_tests(&read(path)), &roots) {
                let (Some(&from), Some(&to)) = (floors.get(module), floors.get(&used)) else {
                    continue;
                };
                if to > from {
                    upward.push(format!(
                        "{} (floor {from}) uses {import} (floor {to})",
                        path.strip_prefix(src()).unwrap().display()
                    ));
                } else if to == from && used != *module {
                    graph.entry(module.clone()).or_default().insert(used);
                }
            }
        }
        assert!(
            upward.is_empty(),
            "imports against # Layers in src/lib.rs: {upward:#?}"
        );
        for start in graph.keys() {
            if let Some(path) = circle(&graph, start) {
                panic!("a circle on one floor of # Layers: {}", path.join(" -> "));
            }
        }
    }

    /// The code after a test item still counts: a block ends at its
    /// closing brace, a `mod tests;` at its line.
    #[test]
    fn without_tests_keeps_the_code_around_test_items() {
        let text = [
            "use a;",
            "#[cfg(test)]",
            "mod tests;",
            "use b;",
            "#[cfg(test)]",
            "fn f() {",
            "    g();",
            "}",
            "use c; // d",
            "#[cfg(test)] use e;",
            "use f;",
        ]
        .join("\n");
        let out = without_tests(&text);
        assert_eq!(
            out.lines().collect::<Vec<_>>(),
            ["use a;", "use b;", "use c; ", "use f;"]
        );
    }

    /// A path of `graph` from `start` back to it, if there is one.
    fn circle(graph: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
        let mut stack = vec![vec![start.to_string()]];
        let mut seen = BTreeSet::new();
        while let Some(path) = stack.pop() {
            let last = path.last().unwrap();
            for next in graph.get(last).into_iter().flatten() {
                if next == start {
                    let mut found = path.clone();
                    found.push(next.clone());
                    return Some(found);
                }
                if seen.insert(next.clone()) {
                    let mut longer = path.clone();
                    longer.push(next.clone());
                    stack.push(longer);
                }
            }
        }
        None
    }
}
