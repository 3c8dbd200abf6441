//! The `rodizio` binary: flags and the config file → configuration,
//! validated → the port bound → the prompt when no backend is given →
//! [`Balancer::with_listener`] → [`Balancer::run`] → exit code. With a
//! config file, SIGHUP reloads it ([`Reloader`]).
//!
//! Exit codes: 0 after a clean shutdown, 1 when start-up fails (the port is
//! taken, ...), 2 for usage errors (bad flags, a bad config file, bad
//! backends, input closed during the prompt), each with one line on
//! standard error saying why.

use std::io::{self, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;

use rodizio::backend::BackendSpec;
use rodizio::cli::{self, one_line, Cli, Command, DemoArgs};
use rodizio::config::file::{self, ConfigFile, Mode};
use rodizio::config::Overrides;
use rodizio::demo::DemoBackend;
use rodizio::reload::Reloader;
use rodizio::signals::Signals;
use rodizio::{prompt, signals, system, Balancer, Config, Error, Shutdown};

fn main() -> ExitCode {
    let cli = match cli::parse() {
        Ok(cli) => cli,
        Err(err) => {
            use clap::error::ErrorKind;
            if matches!(
                err.kind(),
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
            ) {
                let _ = err.print();
                return ExitCode::SUCCESS;
            }
            eprintln!("rodizio: {}", one_line(&err).trim_start_matches("error: "));
            return ExitCode::from(2);
        }
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    match start(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("rodizio: {err}");
            ExitCode::from(if err.is_usage() { 2 } else { 1 })
        }
    }
}

fn start(cli: Cli) -> Result<(), Error> {
    let flags = cli.balancer.overrides();
    let file = cli.balancer.config.as_deref().map(file::load).transpose()?;
    match cli.command {
        Some(Command::Backend(args)) => backend_role(args.listen, args.name),
        Some(Command::CheckConfig(args)) => check_config(&args.file, &flags),
        Some(Command::Demo(args)) => demo(settle(file.as_ref(), &flags)?, args),
        None => balance(file, flags),
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
        (err, _) => err.worded_as_flag(),
    }
}

/// `rodizio check-config FILE`: the effective settings, or why not.
fn check_config(path: &Path, flags: &Overrides) -> Result<(), Error> {
    let file = file::load(path)?;
    let config = settle(Some(&file), flags)?;
    let mut lines = vec![("mode", file.mode.name().to_string())];
    if file.mode == Mode::Backend {
        lines.push(("listen", config.listen.to_string()));
    } else {
        file.require_backends(&config)?;
        for spec in &config.backends {
            spec.resolve().map_err(|e| blame(e, Some(&file), flags))?;
        }
        lines.extend(config.describe());
    }
    for (key, value) in lines {
        println!("{key} = {value}");
    }
    let _ = io::stdout().flush();
    eprintln!("rodizio: {}: the configuration is valid", path.display());
    Ok(())
}

/// The balancer: settings checked and the port bound before the prompt
/// asks anything, so a bad value or a taken port is reported at once.
fn balance(file: Option<ConfigFile>, mut flags: Overrides) -> Result<(), Error> {
    let mut config = settle(file.as_ref(), &flags)?;
    if let Some(file) = &file {
        if file.mode == Mode::Backend {
            return backend_role(config.listen, None);
        }
        file.require_backends(&config)?;
    }
    let listener = Balancer::listen(&config)?;
    if config.backends.is_empty() {
        let stdin = io::stdin();
        config.backends = prompt::servers_entry(&mut stdin.lock(), &mut io::stdout())?;
        // Typed once: a reload keeps them, as it keeps the flags.
        flags.backends = Some(config.backends.clone());
    }
    let shutdown = Shutdown::new();
    let signals = prepare_process(&shutdown)?;
    let balancer =
        Balancer::with_listener(config, listener).map_err(|e| blame(e, file.as_ref(), &flags))?;
    println!(
        "Load balancer listening on port {}",
        balancer.local_addr().port()
    );
    let _ = io::stdout().flush();
    if let Some(file) = file {
        // A language taken from LANG stays what it was at start-up.
        if !file.given().contains(&"trace_lang") {
            flags.trace_lang = Some(balancer.config().trace_lang);
        }
        let reloader = Reloader::new(file.path, flags, &balancer);
        // The reloader logs what it did, or why it refused.
        signals.on_reload(move || {
            let _ = reloader.reload();
        });
    }
    balancer.run(&shutdown)
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

/// `rodizio backend`, or a file's `"mode": "backend"`: one demo backend
/// until a signal.
fn backend_role(listen: SocketAddr, name: Option<String>) -> Result<(), Error> {
    let shutdown = Shutdown::new();
    prepare_process(&shutdown)?;
    let backend = DemoBackend::bind(listen, name)?;
    println!("Demo backend listening on {}", backend.local_addr()?);
    let _ = io::stdout().flush();
    backend.serve(&shutdown);
    Ok(())
}

/// `rodizio demo`: demo backends on loopback, the balancer in front.
fn demo(mut config: Config, args: DemoArgs) -> Result<(), Error> {
    let shutdown = Shutdown::new();
    prepare_process(&shutdown)?;
    for i in 0..args.backends {
        let port = if args.first_port == 0 {
            0
        } else {
            args.first_port.checked_add(i).ok_or_else(|| {
                Error::InvalidConfig("--first-port is too high for that many backends".into())
            })?
        };
        let backend = DemoBackend::bind(SocketAddr::from(([127, 0, 0, 1], port)), None)?;
        let addr = backend.local_addr()?;
        backend.spawn(shutdown.clone())?;
        config.backends.push(BackendSpec::parse(&addr.to_string())?);
        println!("Demo backend {} listening on {addr}", i + 1);
    }
    let balancer = Balancer::bind(config).map_err(Error::worded_as_flag)?;
    let port = balancer.local_addr().port();
    println!("Load balancer listening on port {port}");
    println!();
    println!("Try it (each reply names the backend that served it):");
    println!("  curl http://localhost:{port}/");
    println!("  ab -n 1000 -c 100 http://localhost:{port}/");
    println!("Stop with Ctrl-C.");
    let _ = io::stdout().flush();
    balancer.run(&shutdown)
}
