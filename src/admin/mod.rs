//! The admin API: JSON over HTTP for operators, the Prometheus metrics and
//! the stats page, on its own address (`--admin ADDR`, off by default).
//!
//! The endpoints (`routes.rs`, listed in docs/operations.md, "Admin API") list,
//! add, reweigh, drain and remove backends, reload the config file, show the
//! settings, `/metrics` (`metrics.rs`) and the stats page (`page.rs`, with
//! its charts, `chart.rs`, filled by `sampler.rs`);
//! `services.rs` lists the services and picks the one a path means. Every
//! error is `{"error": "..."}` with a 4xx or 5xx status, and `HEAD` is
//! answered wherever `GET` is. Nothing an admin request does can disturb the
//! proxying (a panic in a handler is answered 500). Changes last until the
//! next reload from the config file, as with HAProxy's runtime API. Who may
//! call it: `auth.rs`.
//!
//! The other parts: `process.rs` (the `process_*` series, from
//! `/proc/self`), `certificates.rs` (the table of served certificates and
//! their expiry), `tools.rs` (the reload's dry run, the running
//! configuration as a file), `views.rs` (a backend as JSON, its row on
//! the stats page, the page's sections) and `connections.rs` (the
//! connections' table: listed, ended, on the stats page).
//!
//! # Threads
//!
//! HTTP is hyper's, on a one-thread runtime of its own (`server.rs`, with its
//! bounds); the endpoints run on at most [`server::HANDLERS`] threads; a
//! sampler thread takes the page's chart samples. The
//! crate's reaper removes deleted backends once drained.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

mod auth;
pub mod certificates;
pub mod chart;
pub mod connections;
pub mod metrics;
pub mod page;
pub mod process;
pub mod routes;
mod sampler;
mod server;
mod services;
mod tools;
mod views;

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::reaper::{Owner, Reaper, Reapers};
use crate::running::Running;
use crate::service::Service;
use crate::shutdown::Shutdown;

pub use auth::Token;
pub use routes::{route, Reply};
pub use server::{
    BODY_DEADLINE, HANDLERS, HEAD_DEADLINE, IDLE_TIMEOUT, MAX_BODY, MAX_CONNECTIONS, MAX_HEAD,
    RESERVE,
};

/// What `POST /reload` calls: `Ok` with a one-line summary of what changed,
/// or `Err` with why nothing did.
pub type ReloadHook = Arc<dyn Fn() -> std::result::Result<String, String> + Send + Sync>;

/// What `POST /reload?dry_run=1` calls: `Ok` with what a reload would do
/// now, or `Err` with why it would be refused. Nothing is applied.
pub type DryRunHook = Arc<dyn Fn() -> std::result::Result<DryRun, String> + Send + Sync>;

/// What a reload would do, as a dry run tells it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DryRun {
    /// Each change, in the words of the reload's log line.
    pub changes: Vec<String>,
    /// The settings that differ but need a restart.
    pub needs_restart: Vec<String>,
}

/// The admin socket, bound at start-up with its token read, not yet
/// serving.
#[derive(Debug)]
pub struct AdminListener {
    listener: TcpListener,
    addr: SocketAddr,
    token: Token,
}

impl AdminListener {
    /// Binds `config.admin_listen` and reads the token file, if the API is
    /// on.
    ///
    /// # Errors
    ///
    /// [`Error::Bind`] when the address cannot be listened on;
    /// [`Error::InvalidSetting`] (`admin_token_file`) when the token file
    /// cannot be read or is empty.
    pub fn bind(config: &Config) -> Result<Option<AdminListener>> {
        let Some(addr) = config.admin_listen else {
            return Ok(None);
        };
        let token = config
            .admin_token_file
            .as_deref()
            .map(read_token)
            .transpose()?;
        let listener = match crate::systemd::inherited(addr) {
            Some(listener) => listener,
            None => TcpListener::bind(addr).map_err(|source| Error::Bind { addr, source })?,
        };
        let addr = listener
            .local_addr()
            .map_err(|e| Error::io("reading the admin address", e))?;
        Ok(Some(AdminListener {
            listener,
            addr,
            token: Token::new(token),
        }))
    }

    /// The bound address (the real port when port 0 was asked).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The token the API checks, which a reload replaces when it reads
    /// `admin_token_file` again.
    pub fn token(&self) -> Token {
        self.token.clone()
    }
}

/// What the endpoints read and change.
pub struct State {
    /// The services, their backend lists and live settings.
    pub running: Arc<Running>,
    /// The settings given at start-up (the fixed ones are still in force).
    pub config: Config,
    /// `POST /reload`'s hook; `None` when there is no config file.
    pub reload: Option<ReloadHook>,
    /// `POST /reload?dry_run=1`'s hook; `None` when there is no config
    /// file ([`State::new`] leaves it so).
    pub dry_run: Option<DryRunHook>,
    /// What `/metrics` and the stats page read.
    pub sources: metrics::Sources,
    /// When the balancer started (the page's uptime).
    pub started: std::time::Instant,
    /// Changes to the lists take turns on this (see `routes.rs`).
    pub(crate) changes: Mutex<()>,
    /// The page's charts and backend rates, filled by the sampler.
    pub(crate) charts: Arc<Mutex<chart::Charts>>,
    /// Per service (by its scheduler): where `DELETE` hands a backend to
    /// be removed once drained.
    reapers: Reapers,
}

impl State {
    /// The state over `running`, with `config` as given at start-up.
    pub fn new(
        running: Arc<Running>,
        config: Config,
        reload: Option<ReloadHook>,
        sources: metrics::Sources,
        shutdown: Option<Shutdown>,
    ) -> State {
        State {
            running,
            config,
            reload,
            dry_run: None,
            sources,
            started: std::time::Instant::now(),
            changes: Mutex::new(()),
            charts: Arc::default(),
            reapers: Reapers::new(Owner::Admin, shutdown),
        }
    }

    /// The reaper of `service`'s deleted backends.
    pub(crate) fn reaper(&self, service: &Service) -> Reaper {
        let running = self.running.schedulers();
        self.reapers.of(&service.live.scheduler, &running)
    }
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("services", &self.running.list().len())
            .field("reload", &self.reload.is_some())
            .finish()
    }
}

/// What the admin API is given by the balancer.
pub struct Parts {
    /// The services.
    pub running: Arc<Running>,
    /// The settings given at start-up.
    pub config: Config,
    /// `POST /reload`'s hook, if there is a config file.
    pub reload: Option<ReloadHook>,
    /// `POST /reload?dry_run=1`'s hook, if there is a config file.
    pub dry_run: Option<DryRunHook>,
    /// The process's counters (every service's added).
    pub stats: Arc<crate::stats::Stats>,
    /// Clients in the queue now.
    pub queued: Arc<dyn Fn() -> usize + Send + Sync>,
}

/// The running admin API's threads.
#[derive(Debug)]
pub struct Admin {
    threads: Vec<JoinHandle<()>>,
}

impl Admin {
    /// Waits for the threads, which exit once the shutdown is triggered
    /// (each after the request it is answering).
    pub fn join(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Starts serving the admin API on `listener` until `shutdown`.
///
/// # Errors
///
/// [`Error::Io`] when the runtime or a thread cannot be started.
pub fn spawn(listener: AdminListener, parts: Parts, shutdown: &Shutdown) -> Result<Admin> {
    let AdminListener {
        listener,
        addr,
        token,
    } = listener;
    // `GET /config` shows the address bound, with its real port.
    let mut config = parts.config;
    config.admin_listen = Some(addr);
    let sources = metrics::Sources {
        stats: parts.stats,
        running: Arc::clone(&parts.running),
        queued: parts.queued,
        max_workers: config.workers,
    };
    let mut state = State::new(
        parts.running,
        config,
        parts.reload,
        sources,
        Some(shutdown.clone()),
    );
    state.dry_run = parts.dry_run;
    let state = Arc::new(state);
    let charts = Arc::clone(&state.charts);
    let running = Arc::clone(&state.running);
    let http = server::Http::new(state, auth::Auth::new(token));
    let server = server::start(listener, http, shutdown)?;
    let sampler = sampler::spawn(running, charts, shutdown)
        .map_err(|e| Error::io("starting the stats page's sampler thread", e))?;
    log::info!("admin API listening on {addr}");
    Ok(Admin {
        threads: vec![server, sampler],
    })
}

/// The most bytes an admin token file may hold: a token is a line.
const MAX_TOKEN_FILE: u64 = 4096;

/// The admin API's bearer token, read from `path` (`admin_token_file`):
/// its text without the surrounding white space.
///
/// # Errors
///
/// [`Error::InvalidSetting`] (`admin_token_file`) when the file cannot be
/// read or holds only white space.
pub fn read_token(path: &std::path::Path) -> Result<String> {
    use crate::system::FileError;
    let shown = path.display();
    let bytes = crate::files::read(path, MAX_TOKEN_FILE).map_err(|e| {
        let why = match e {
            FileError::Io(e) => e.to_string(),
            FileError::Directory => "a directory, not a file".into(),
            FileError::NotRegular => "not a regular file (a pipe or a device?)".into(),
            FileError::TooLarge => format!("larger than {MAX_TOKEN_FILE} bytes"),
        };
        Error::setting("admin_token_file", format!("{shown}: {why}"))
    })?;
    let text = String::from_utf8(bytes)
        .map_err(|_| Error::setting("admin_token_file", format!("{shown} is not UTF-8 text")))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(Error::setting(
            "admin_token_file",
            format!("{} is empty", path.display()),
        ));
    }
    Ok(token.to_string())
}
