//! The `rodizio` binary: flags and the config file → configuration,
//! validated → the port bound → the prompt when no backend is given →
//! [`Balancer::with_listener`] → root given up ([`privileges::drop_root`])
//! → [`Balancer::run`] → exit code. With a config file, SIGHUP reloads it
//! ([`Reloader`]).
//!
//! Exit codes, each with one line on standard error saying why when not 0:
//!
//! - 0: stopped by SIGINT/SIGTERM after a clean drain;
//! - 1: start-up failed (the port is taken, ...); `preflight` found a
//!   check that fails; `probe` found no check that passes;
//! - 2: usage error (bad flags, a bad config file, bad backends, input
//!   closed during the prompt, started as root with neither `user` nor
//!   `allow_root`);
//! - 3: the drain timeout cut connections still open;
//! - 128 + N: a second signal N (143 for SIGTERM, 130 for SIGINT) ended it
//!   at once.
//!
//! Nothing printed here panics: standard output may be a closed pipe
//! (`rodizio ... | head -1`), and a failed write is ignored, as the log on
//! standard error goes on.

use std::fmt::Display;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use rodizio::backend::{Backend, BackendSpec};
use rodizio::cli::{self, one_line, Cli, Command, DemoArgs, ProbeArgs, SimulateArgs};
use rodizio::config::file::{self, ConfigFile, Mode};
use rodizio::config::settings::{self, Scope};
use rodizio::config::Overrides;
use rodizio::demo::DemoBackend;
use rodizio::health::survey::{self, Finding};
use rodizio::health::HealthConfig;
use rodizio::preflight::{self, Verdict};
use rodizio::reload::Reloader;
use rodizio::signals::Signals;
use rodizio::upgrade::launch;
use rodizio::{privileges, prompt, signals, system, Balancer, Config, Error, Shutdown};

/// Exit code of a drain that had to cut connections.
const EXIT_DRAIN_CUT: u8 = 3;

fn main() {
    let cli = match cli::parse() {
        Ok(cli) => cli,
        Err(err) => {
            use clap::error::ErrorKind;
            if matches!(
                err.kind(),
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
            ) {
                let _ = err.print();
                signals::exit(0, false);
            }
            complain(one_line(&err).trim_start_matches("error: "));
            signals::exit(2, false);
        }
    };
    init_logging();
    let shutdown = Shutdown::new();
    let code = match start(cli, &shutdown) {
        Ok(code) => code,
        Err(err) => {
            complain(&err);
            if err.is_usage() {
                2
            } else {
                1
            }
        }
    };
    signals::exit(code, shutdown.is_triggered());
}

/// Set when the access log goes to standard output: every other line
/// (the listening line, the prompt, the demo's) then goes to standard
/// error, so that standard output is the access log alone.
static STDOUT_IS_ACCESS_LOG: AtomicBool = AtomicBool::new(false);

/// Where the lines for the operator go: standard output, or standard
/// error when standard output is the access log.
fn console() -> Box<dyn Write> {
    if STDOUT_IS_ACCESS_LOG.load(Ordering::Relaxed) {
        Box::new(io::stderr())
    } else {
        Box::new(io::stdout())
    }
}

/// Notes whether `config` writes its access log to standard output.
fn note_access_log(config: &Config) {
    STDOUT_IS_ACCESS_LOG.store(config.access_log_on_stdout(), Ordering::Relaxed);
}

/// One line to the [`console`]; a closed output is not an error here.
fn say(line: impl Display) {
    let _ = writeln!(console(), "{line}");
}

/// The article's line, with the address the port is on.
fn say_listening(line: String) {
    say(line);
    let _ = console().flush();
}

/// An admin address that cannot be bound, worded as the admin API's (the
/// balancer's own port is bound first, so the same words would point at
/// the wrong address); other errors unchanged.
fn admin_words(err: Error, admin: Option<SocketAddr>, flags: &Overrides) -> Error {
    match err {
        Error::Bind { addr, source } if Some(addr) == admin => {
            let given = if flags.admin_listen.is_some() {
                "--admin"
            } else {
                "`admin_listen`"
            };
            Error::io(
                format!("the admin API cannot listen on {addr} ({given})"),
                source,
            )
        }
        other => other,
    }
}

/// `rodizio: <what went wrong>` on standard error, never panicking.
fn complain(what: impl Display) {
    let _ = writeln!(io::stderr().lock(), "rodizio: {what}");
}

/// Logging to standard error, filtered by `RUST_LOG` (default `info`). A
/// filter that names neither a level nor a module of rodizio would
/// silence every line (env_logger takes `garbage` for a module name): it
/// is refused with a warning, and `info` used instead.
fn init_logging() {
    let spec = std::env::var("RUST_LOG").unwrap_or_default();
    let filter = if spec.trim().is_empty() {
        "info".to_string()
    } else if log_spec_is_valid(&spec) {
        spec
    } else {
        complain(format_args!(
            "warning: RUST_LOG={spec:?} is not a level (error, warn, info, debug, trace, off) \
             or MODULE=LEVEL; using info"
        ));
        "info".to_string()
    };
    let mut builder = env_logger::Builder::new();
    builder.parse_filters(&filter);
    if let Ok(style) = std::env::var("RUST_LOG_STYLE") {
        builder.parse_write_style(&style);
    }
    builder.init();
}

/// Whether every directive of a `RUST_LOG` value is a level, `TARGET=LEVEL`,
/// or a bare target inside rodizio.
fn log_spec_is_valid(spec: &str) -> bool {
    const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
    let is_level = |l: &str| LEVELS.contains(&l.trim().to_ascii_lowercase().as_str());
    let directives = spec.split('/').next().unwrap_or_default();
    directives
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .all(|d| match d.split_once('=') {
            Some((target, level)) => !target.trim().is_empty() && is_level(level),
            None => is_level(d) || d.starts_with("rodizio"),
        })
}

/// Runs the role the flags ask for; the exit code of a clean end.
fn start(cli: Cli, shutdown: &Shutdown) -> Result<u8, Error> {
    let flags = cli.balancer.overrides();
    let file = cli.balancer.config.as_deref().map(file::load).transpose()?;
    match cli.command {
        Some(Command::Backend(args)) => backend_role(args.listen, args.name, shutdown),
        Some(Command::CheckConfig(args)) => match &args.diff {
            Some(old) => check_diff(old, &args.file, &flags),
            None => check_config(&args.file, &flags),
        },
        Some(Command::Preflight(args)) => {
            let file = match args.file {
                Some(path) => Some(file::load(&path)?),
                None => file,
            };
            run_preflight(file.as_ref(), &flags)
        }
        Some(Command::Probe(args)) => probe(args),
        Some(Command::Simulate(args)) => {
            let file = match &args.file {
                Some(path) => Some(file::load(path)?),
                None => file,
            };
            simulate(file.as_ref(), &flags, args)
        }
        Some(Command::Demo(args)) => {
            let mut config = settle(file.as_ref(), &flags)?;
            let listen_given = flags.listen.is_some()
                || file.as_ref().is_some_and(|f| f.given().contains(&"listen"));
            if !listen_given {
                // The demo backends are on loopback only; so is the demo.
                config.listen = SocketAddr::from(([127, 0, 0, 1], rodizio::config::DEFAULT_PORT));
            }
            demo(config, args, &flags, shutdown)
        }
        Some(Command::Upgrade) => launch::command(&settle(file.as_ref(), &flags)?),
        None => balance(file, flags, shutdown),
    }
}

/// The defaults, the file, then the flags, validated except for the
/// backends: everything that can be checked before the prompt asks.
fn settle(file: Option<&ConfigFile>, flags: &Overrides) -> Result<Config, Error> {
    let mut config = match file {
        Some(file) => file.settle(flags)?,
        None => {
            let mut config = Config::default();
            flags.apply(&mut config).map_err(Error::worded_as_flag)?;
            config.validate_settings().map_err(Error::worded_as_flag)?;
            config
        }
    };
    let lang_given =
        flags.trace_lang.is_some() || file.is_some_and(|f| f.given().contains(&"trace_lang"));
    if !lang_given {
        // The trace speaks the user's language: `LANG=pt_BR.UTF-8` gives pt.
        let locale = std::env::var("LANG").unwrap_or_default();
        if let Some(lang) = rodizio::trace::Lang::from_locale(&locale) {
            config.trace_lang = lang;
        }
    }
    Ok(config)
}

/// Words a start-up error as the layer that gave the bad value: a backend
/// that does not resolve is the file's when the file named it.
fn blame(err: Error, file: Option<&ConfigFile>, flags: &Overrides) -> Error {
    match (err, file) {
        (Error::InvalidBackend(msg), Some(file)) if !flags.given().contains(&"backends") => {
            file.error_at("backends", msg)
        }
        (err @ Error::InvalidSetting { .. }, file) => blame_setting(err, file, flags),
        (err, _) => err.worded_as_flag(),
    }
}

/// Words an error about one setting as the layer that gave it: the file's
/// key and line when the file gave it and no flag did, else the flag.
fn blame_setting(err: Error, file: Option<&ConfigFile>, flags: &Overrides) -> Error {
    match (err, file) {
        (Error::InvalidSetting { setting, message }, Some(file))
            if file.given().contains(&setting.as_str())
                && !flags.given().contains(&setting.as_str()) =>
        {
            file.error_at(&setting, message)
        }
        (err, _) => err.worded_as_flag(),
    }
}

/// `rodizio check-config FILE`: the effective settings, or why not.
fn check_config(path: &Path, flags: &Overrides) -> Result<u8, Error> {
    let file = file::load(path)?;
    let config = settle(Some(&file), flags)?;
    let mut lines = vec![("mode", file.mode.name().to_string())];
    if file.mode == Mode::Backend {
        lines.push(("listen", config.listen.to_string()));
    } else {
        file.require_backends(&config)?;
        for service in config.service_list() {
            for spec in &service.backends {
                spec.resolve().map_err(|e| blame(e, Some(&file), flags))?;
            }
        }
        // The files it names, read as a start would read them.
        Balancer::check_files(&config).map_err(|e| blame(e, Some(&file), flags))?;
        let warn = |w: &String| complain(format_args!("warning: {w}"));
        config.unused_warnings().iter().for_each(warn);
        if config.services.is_empty() {
            lines.extend(config.describe());
            lines.push(("origins", BackendSpec::origins(&config.backends)));
        } else {
            lines.extend(described(&config, Scope::Process));
        }
    }
    for (key, value) in lines {
        say(format_args!("{key} = {value}"));
    }
    for service in &config.services {
        say(format_args!("\n[service {}]", service.name));
        for (key, value) in described(service, Scope::Service) {
            say(format_args!("{key} = {value}"));
        }
    }
    let _ = io::stdout().flush();
    complain(format_args!(
        "{}: the configuration is valid",
        path.display()
    ));
    Ok(0)
}

/// `rodizio check-config --diff OLD NEW`: what a reload from OLD to NEW
/// would do, one change a line, then the settings that need a restart.
fn check_diff(old: &Path, new: &Path, flags: &Overrides) -> Result<u8, Error> {
    let (old, new) = (file::load(old)?, file::load(new)?);
    let report = rodizio::reload::between(&old, &new, flags)?;
    for line in &report.changes {
        say(line);
    }
    if !report.needs_restart.is_empty() {
        say(format_args!(
            "needs a restart: {}",
            report.needs_restart.join(", ")
        ));
    }
    if report.changes.is_empty() && report.needs_restart.is_empty() {
        say("no change");
    }
    let _ = io::stdout().flush();
    Ok(0)
}

/// The settings of `config` of one scope, as `check-config` prints them.
/// A service's scope also says where its backends come from.
fn described(config: &Config, scope: Scope) -> Vec<(&'static str, String)> {
    let mut all = config.describe();
    all.push(("origins", BackendSpec::origins(&config.backends)));
    all.retain(|(key, _)| settings::scope_of(key).unwrap_or(Scope::Service) == scope);
    all
}

/// `rodizio preflight [FILE]`: this host against the settings, one line
/// per check; 1 when one fails.
fn run_preflight(file: Option<&ConfigFile>, flags: &Overrides) -> Result<u8, Error> {
    let config = settle(file, flags)?;
    let lines = preflight::run(&config);
    for line in &lines {
        say(line);
    }
    let _ = io::stdout().flush();
    Ok(match preflight::worst(&lines) {
        Verdict::Fail => 1,
        Verdict::Ok | Verdict::Warn => 0,
    })
}

/// `rodizio probe HOST:PORT`: every kind of check once, what each found,
/// and the kind to choose; 0 when one passed, 1 when none did.
fn probe(args: ProbeArgs) -> Result<u8, Error> {
    let defaults = HealthConfig::default();
    let config = HealthConfig {
        timeout: args.timeout.unwrap_or(defaults.timeout),
        path: args.path.unwrap_or(defaults.path.clone()),
        user: args.user,
        ..defaults
    };
    // Its flags are the health settings' names without `health_`.
    config.validate().map_err(|err| match err {
        Error::InvalidSetting { setting, message } => Error::InvalidConfig(format!(
            "--{} {message}",
            setting.trim_start_matches("health_")
        )),
        other => other,
    })?;
    let backend = Backend::from_spec(&args.server)?;
    if let Some(target) = backend.check_target() {
        say(format_args!(
            "checking {target}, the check target of {}",
            backend.name()
        ));
    }
    let findings = survey::survey(&backend, &config);
    for finding in &findings {
        say(finding);
    }
    say(survey::suggestion(&findings));
    let _ = io::stdout().flush();
    Ok(if findings.iter().any(Finding::passed) {
        0
    } else {
        1
    })
}

/// `rodizio simulate [FILE]`: each service's scheduler asked for
/// `--clients` picks, the shares printed.
fn simulate(file: Option<&ConfigFile>, flags: &Overrides, args: SimulateArgs) -> Result<u8, Error> {
    use rodizio::simulate::{self, Change};
    let config = settle(file, flags)?;
    if config.service_list().iter().all(|s| s.backends.is_empty()) {
        return Err(Error::InvalidConfig(
            "no backends to simulate (give a config file, or -b HOST:PORT before 'simulate')"
                .into(),
        ));
    }
    let change = match (args.remove, args.weight) {
        (Some(name), _) => Some(Change::Remove(name)),
        (None, Some((name, weight))) => Some(Change::Weight(name, weight)),
        (None, None) => None,
    };
    let outcomes = simulate::run(
        &config,
        args.clients,
        args.service.as_deref(),
        change.as_ref(),
    )?;
    for (i, outcome) in outcomes.iter().enumerate() {
        if i > 0 {
            say("");
        }
        let _ = write!(console(), "{outcome}");
    }
    let _ = console().flush();
    Ok(0)
}

/// The balancer: settings checked and the port bound before the prompt
/// asks anything, so a bad value or a taken port is reported at once.
fn balance(
    file: Option<ConfigFile>,
    mut flags: Overrides,
    shutdown: &Shutdown,
) -> Result<u8, Error> {
    let mut config = settle(file.as_ref(), &flags)?;
    if let Some(file) = &file {
        if file.mode == Mode::Backend {
            return backend_role(config.listen, None, shutdown);
        }
        file.require_backends(&config)?;
    }
    note_access_log(&config);
    privileges::refuse_root(config.user.as_deref(), config.allow_root)?;
    rodizio::reload::keep_root_reader(file.as_ref().map(|f| f.path.as_path()), &flags, &config)?;
    // Signals go to their thread before the port accepts anyone: a SIGTERM
    // sent as soon as the port answers drains instead of killing. The
    // prompt keeps the default (Ctrl-C ends it at once), so with a prompt
    // they are taken after it.
    let prompts = config.services.is_empty() && !config.names_backends();
    let early = if prompts {
        None
    } else {
        Some(prepare_process(shutdown)?)
    };
    let listener = Balancer::listen(&config)?;
    if prompts {
        let stdin = io::stdin();
        config.backends = prompt::servers_entry(&mut stdin.lock(), &mut console())?;
        // Typed once: a reload keeps them, as it keeps the flags.
        flags.backends = Some(config.backends.clone());
    }
    let signals = match early {
        Some(signals) => signals,
        None => prepare_process(shutdown)?,
    };
    let admin = config.admin_listen;
    let mut balancer = Balancer::with_listener(config, listener)
        .map_err(|e| blame(admin_words(e, admin, &flags), file.as_ref(), &flags))?;
    // Started: the open-files limit is raised, and no client is served yet.
    preflight::log_warnings(balancer.config());
    // Every socket bound, the access log open, the token read: root, if
    // that is who started it, is not needed any more.
    let c = balancer.config();
    privileges::drop_root(c.user.as_deref(), c.group.as_deref(), c.allow_root)
        .map_err(|e| blame_setting(e, file.as_ref(), &flags))?;
    if let Some(log) = balancer.access_log() {
        // logrotate renames the file, then sends SIGUSR1.
        signals.on_reopen(move || log.reopen());
    }
    // A language taken from LANG stays what it was at start-up.
    if !file
        .as_ref()
        .is_some_and(|f| f.given().contains(&"trace_lang"))
    {
        flags.trace_lang = Some(balancer.config().trace_lang);
    }
    // With a file, a reload reads it again; without one, what runs stays,
    // and the TLS files the flags name are read again.
    let reloader = match file {
        Some(file) => Reloader::new(file.path, flags, &balancer),
        None => Reloader::flags_only(flags, &balancer),
    };
    reloader.answer_for(&mut balancer, &signals);
    // Last: whoever waits for this line may signal at once (SIGHUP,
    // SIGUSR1), and finds every hook in place.
    say_listening(balancer.listening_line());
    run(balancer, shutdown)
}

/// What every role does before serving: signals handled by a thread of
/// their own (blocked before any other thread starts, so every thread
/// inherits the mask), and the open-files limit raised.
fn prepare_process(shutdown: &Shutdown) -> Result<Signals, Error> {
    let signals = signals::spawn(shutdown.clone())?;
    match system::raise_nofile_limit() {
        Ok(limit) => log::debug!("open files limit: {limit}"),
        Err(err) => log::warn!("could not raise the open files limit: {err}"),
    }
    Ok(signals)
}

/// Runs a bound balancer until the drain ends: 0, or
/// [`EXIT_DRAIN_CUT`] when the drain timeout cut connections.
fn run(balancer: Balancer, shutdown: &Shutdown) -> Result<u8, Error> {
    let stats = balancer.stats();
    balancer.run(shutdown)?;
    Ok(if stats.snapshot().drain_cut > 0 {
        EXIT_DRAIN_CUT
    } else {
        0
    })
}

/// `rodizio backend`, or a file's `"mode": "backend"`: one demo backend
/// until a signal.
fn backend_role(
    listen: SocketAddr,
    name: Option<String>,
    shutdown: &Shutdown,
) -> Result<u8, Error> {
    prepare_process(shutdown)?;
    let backend = DemoBackend::bind(listen, name)?;
    say(format_args!(
        "Demo backend listening on {}",
        backend.local_addr()?
    ));
    let _ = io::stdout().flush();
    backend.serve(shutdown);
    Ok(0)
}

/// `rodizio demo`: demo backends on loopback, the balancer in front.
fn demo(
    mut config: Config,
    args: DemoArgs,
    flags: &Overrides,
    shutdown: &Shutdown,
) -> Result<u8, Error> {
    note_access_log(&config);
    // Checked before any backend starts.
    if args.first_port != 0 && u32::from(args.first_port) + u32::from(args.backends) - 1 > 65535 {
        return Err(Error::setting(
            "first_port",
            format!(
                "{} is too high for {} backends (the last port would be {}; at most {})",
                args.first_port,
                args.backends,
                u32::from(args.first_port) + u32::from(args.backends) - 1,
                65536 - u32::from(args.backends)
            ),
        )
        .worded_as_flag());
    }
    prepare_process(shutdown)?;
    for i in 0..args.backends {
        let port = if args.first_port == 0 {
            0
        } else {
            args.first_port + i
        };
        let backend = DemoBackend::bind(SocketAddr::from(([127, 0, 0, 1], port)), None)?;
        let addr = backend.local_addr()?;
        backend.spawn(shutdown.clone())?;
        config.backends.push(BackendSpec::parse(&addr.to_string())?);
        say(format_args!("Demo backend {} listening on {addr}", i + 1));
    }
    let admin = config.admin_listen;
    let balancer =
        Balancer::bind(config).map_err(|e| admin_words(e, admin, flags).worded_as_flag())?;
    preflight::log_warnings(balancer.config());
    // A demo is how a first look is taken, often in a container run as
    // root: `user` is honoured, but root is not refused.
    let c = balancer.config();
    privileges::drop_root(c.user.as_deref(), c.group.as_deref(), true)
        .map_err(Error::worded_as_flag)?;
    let port = balancer.local_addr().port();
    say_listening(balancer.listening_line());
    say("");
    say("Try it (each reply names the backend that served it):");
    say(format_args!("  curl http://localhost:{port}/"));
    say(format_args!("  ab -n 1000 -c 100 http://localhost:{port}/"));
    say("Stop with Ctrl-C.");
    let _ = console().flush();
    run(balancer, shutdown)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_specs() {
        for good in [
            "info",
            "debug",
            "rodizio=debug",
            "warn,rodizio::proxy=trace",
            "OFF",
            "rodizio",
            "x=info/foo",
        ] {
            assert!(log_spec_is_valid(good), "{good}");
        }
        for bad in ["garbage", "rodizio=loud", "=info", "info,nonsense"] {
            assert!(!log_spec_is_valid(bad), "{bad}");
        }
    }
}
