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
//!                   │ the admission gate: allow/deny, per-client cap, limiter, pick
//!                   │   refused ──▶ close (or 429/503), one Report (proxy/admission.rs)
//!                   │ scheduler.pick(peer) → Pick (the backend)   (scheduler/: round robin, ...)
//!                   │   (--accept-proxy, SNI: no pick yet, the worker runs the gate)
//!                   ▼
//!                 pool.submit(Job::new(service, client, peer, Picked(pick), ..))
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
//! # Layout
//!
//! Dependencies point one way, from the top of this list to the bottom:
//! `main` → `cli`/`config` → `balancer` → `listener` → `pool`/`queue` →
//! `proxy` → `health`, `scheduler`, `backend` → the leaves (`reply`,
//! `units`, `stats`, `error`), which any module may use. Every module file
//! of `src/` is named here (a test checks it).
//!
//! - `cli`: command-line flags (clap, and only here) into [`config::Overrides`].
//! - `config/`: [`Config`], the settings and their defaults (the C
//!   `#define`s); `table` (every setting declared once: key, flag, scope,
//!   reload), `settings` (what the table generates), `overrides` (the
//!   [`config::Overrides`] laid over the defaults), `file` (the JSON config
//!   file), `services` (what spans services: names, addresses), `values`
//!   (the file's value types), `entry` (a backend in the file: a string
//!   or an object), `read` (reading it,
//!   bounded), `words` (errors and values in the operator's words),
//!   `export` (a configuration written back as a file).
//! - `prompt`: [`prompt::servers_entry`], the article's interactive questions.
//! - `balancer`: [`Balancer`] wires the parts together; the drain.
//! - `service`: one service at run time (its listeners, live settings,
//!   counters); `slots`, its `max_connections`; `running`, the services
//!   running now with their accept loops and health threads.
//! - `live`: the settings read live (`ArcSwap`s) and the scheduler.
//! - `listener`: the listening socket and the accept loop.
//! - `limiter/`: per-client-IP rate limiting at accept time (off by
//!   default): the facade, `settings` (rate, algorithm, reply), `rule`
//!   (three ways to count), `table` (the bounded table), `store` (the
//!   counts kept in Redis, shared by several balancers), `conns` (the
//!   connections open per client address, for its cap).
//! - `queue`: the FIFO between the accept loop and the workers.
//! - `pool`: the worker threads.
//! - `proxy/`: a connection's life: `admission` (the one gate every client
//!   passes, on any path), `serve` (wait, route, connect, pump,
//!   close, into one `Outcome`), `connect` (fail-over), `waiting` (a
//!   client waiting for a backend slot), `report` (the one
//!   place an outcome becomes counters, access log, trace and log lines),
//!   `refusal` (why a client was refused, and each refusal's rows);
//!   `pump` (the duplex copy, with `half`, one direction, `wait`, its
//!   `poll(2)` side, `bucket`, a direction's bandwidth cap, and `promote`,
//!   the hand-over to the kernel relay); `kernel_relay/` (an eBPF sockmap
//!   program moves a promoted connection's bytes: `bpf`, the program and
//!   its maps, `counts`, the sockets' `TCP_INFO` counters); `conduit` (the thread's buffers and pipes); `header`
//!   (a client behind `--accept-proxy`: its header, then the gate); `per_client` (the cap on connections open per client
//!   address).
//! - `proxy_protocol/`: the PROXY protocol, `codec` (types, encode),
//!   `parse`, `read` (off a socket), `cidr` (trusted peers), `accept` and
//!   `send` (the worker's side of `--accept-proxy` and `--send-proxy`).
//! - `sni/`: routing TLS clients by the server name of their ClientHello,
//!   without decrypting (services sharing an address): `client_hello`
//!   (the parser), `names` (the names and the choice), `peek` (reading it
//!   off the socket without consuming it), `check` (the configuration's
//!   rules), `router` (the worker's side).
//! - `poll`: `poll(2)` waits, written once.
//! - `access_log/`: one line per connection: `record` (what it says, how
//!   it ended), `format` (text or JSON), `writer` (the thread that writes).
//! - `trace/`: `--trace`, the narrated trace of every connection (off by
//!   default); `text`, its sentences in both languages, one table.
//! - `health/`: the checks; `checker` (the thread), `probe` (rise/fall),
//!   `check` (tcp, http), `protocol/` (checks that speak the backend's
//!   protocol, one file each: `redis`, `tls`, `smtp`, `mysql`, `pgsql`,
//!   `send_expect`, and `conn`, the conversation they share;
//!   `tls_verified`, the `tls` check of a service with `backend_tls`: a
//!   whole handshake); `survey`
//!   (`rodizio probe`: every kind once against one server); `kind` (the
//!   kinds of check); `own` (a backend's own check: `check_port`,
//!   `check_address`, its `rise`, `fall`, ...); `target` (where a
//!   backend's checks go).
//! - `scheduler/`: which backend gets the next client; the backend list,
//!   changeable at run time; one file per algorithm: `round_robin`,
//!   `weighted`, `least_connections`, `power_of_two`, `ip_hash`, `first`;
//!   `backup` (the backends in rotation: primaries, else backups), `ramp`
//!   (slow start), `snapshot` (one version of the list, with what the
//!   algorithms precompute from it).
//! - `backend`: one backend, its live state, and [`backend::Backend::connect`];
//!   `spec` (in `backend/`), the backend as written (`HOST:PORT` and its
//!   options); `cap`, its slots: the clients on their way to it and
//!   its `max_connections`; `standby` (backup or primary, and when it
//!   came back, for slow start).
//! - `tally`: a backend's peak, errors by kind, time down and check
//!   progress, for the stats page and the metrics.
//! - `dial`: one TCP connect bounded by a timeout (a worker's, a check's).
//! - `waitlist`: a service's line of clients waiting for a backend slot
//!   when every backend is at its `max_connections`.
//! - `availability`: how a backend tells the schedulers holding it that it
//!   left the rotation or came back (a leaf: no import of its own).
//! - `lookup`: a backend's host name and its lookups (IPv4 first, at most
//!   16 addresses, the last result); `resolver`, the thread that looks
//!   the names up again every `resolve_interval`.
//! - `reaper`: removes drained backends once their last connection ends.
//! - `reload/`: [`reload::Reloader`], the config file applied again to a
//!   running balancer (SIGHUP), or only described (a dry run); `service`
//!   (one service's part), `diff` (`check-config --diff OLD NEW`, two
//!   files compared with the same words).
//! - `admin/`: the admin API (`--admin`): JSON over HTTP to list, add,
//!   drain and remove backends, reload, and show the settings; `routes`
//!   (the endpoints), `server` (hyper on its own thread, every bound),
//!   `auth` (the token), `metrics` (Prometheus), `process` (its
//!   `process_*` series, from `/proc/self`), `page` (the stats page), `certificates` (its table of served
//!   certificates and their expiry),
//!   `tools` (the reload's dry run, the running configuration as a file),
//!   `chart` (the stats page's charts, inline SVG), `sampler` (the
//!   thread that fills them) and `views` (a backend as JSON, its row on
//!   the stats page, the page's sections).
//! - `reply`: the 429/502/503 replies, written without blocking.
//! - `stats`: one table of counters and gauges.
//! - `tls_term/`: TLS termination (off by default): the settings and the
//!   terminator, `certs` (the PEM files, the choice by SNI), `expiry`
//!   (a certificate's `notAfter`), `handshake` (the worker's, bounded),
//!   `pump` (the TLS-aware pump beside the plain and splice ones),
//!   `stack` (the stack pages a handshake touched, handed back after it).
//! - `throttle`: a log line at most once a second for events that repeat.
//! - `units`: durations and sizes as people write them.
//! - `signals`: the signal thread (SIGINT/SIGTERM drain, SIGHUP, SIGUSR1).
//! - `shutdown`: the stop trigger.
//! - `demo/`: the built-in demo HTTP backend; `request` reads a request
//!   within bounds.
//! - `system`: process settings taken from the OS at start-up (the open
//!   files limit) and OS errors in words.
//! - `kernel_sched`: the kernel's scheduling policy for
//!   every thread (`batch`: no wake-up preemption).
//! - `simulate`: `rodizio simulate`, the schedulers asked for N picks
//!   with no socket; each backend's share, and the clients a change moves.
//! - `preflight/`: `rodizio preflight`, this host's limits against the
//!   settings (also logged at start-up); `host` (what the system gives,
//!   read once), `checks` (one line each, from plain numbers).
//! - `systemd`: running as a systemd service: readiness, reload and stop
//!   notifications (`NOTIFY_SOCKET`) and the listening sockets it passes
//!   (`LISTEN_FDS`).
//! - `privileges`: `user` and `group`, taken once every socket is bound;
//!   no serving as root unless told to.
//! - `error`: [`Error`].
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
pub mod config;
pub mod demo;
pub mod dial;
pub mod error;
pub mod health;
pub mod kernel_sched;
pub mod limiter;
pub mod listener;
pub mod live;
pub mod lookup;
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
pub mod resolver;
pub mod running;
pub mod scheduler;
pub mod service;
pub mod shutdown;
pub mod signals;
pub mod simulate;
pub mod slots;
pub mod sni;
pub mod stats;
pub mod system;
pub mod systemd;
pub mod tally;
pub mod throttle;
pub mod tls_term;
pub mod trace;
pub mod units;
pub mod waitlist;

pub use balancer::Balancer;
pub use config::Config;
pub use error::{Error, Result};
pub use shutdown::Shutdown;

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    /// The names of the module files under `dir`: `name.rs` and `name/`
    /// (with its `mod.rs`), not `lib.rs`, `main.rs` nor `tests.rs`.
    fn module_names(dir: &Path, names: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                names.insert(name);
                module_names(&path, names);
            } else if path.extension().is_some_and(|e| e == "rs")
                && !["lib", "main", "mod", "tests"].contains(&name.as_str())
            {
                names.insert(name);
            }
        }
    }

    /// The crate map (`# Layout` in this file's doc) names every module
    /// file of `src/`, as `` `name` `` or `` `name/` ``: a module added or
    /// renamed without its line in the map fails here.
    #[test]
    fn the_crate_map_names_every_module() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
        let map: String = lib
            .lines()
            .filter_map(|l| l.strip_prefix("//!"))
            .skip_while(|l| l.trim() != "# Layout")
            .skip(1)
            .take_while(|l| !l.trim_start().starts_with("# "))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(map.contains("- `cli`"), "no # Layout section found");
        let mut names = BTreeSet::new();
        module_names(&src, &mut names);
        let missing: Vec<&String> = names
            .iter()
            .filter(|n| !map.contains(&format!("`{n}`")) && !map.contains(&format!("`{n}/`")))
            .collect();
        assert!(
            missing.is_empty(),
            "not in the crate map of src/lib.rs: {missing:?}"
        );
    }
}
