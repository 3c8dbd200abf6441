//! The `rodizio` binary: flags → configuration (the prompt when no backend
//! is given) → [`Balancer::bind`] → [`Balancer::run`] → exit code.
//!
//! Exit codes: 0 after a clean shutdown, 1 when start-up fails (the port is
//! taken, ...), 2 for usage errors (bad flags, bad backends, input closed
//! during the prompt), each with one line on standard error saying why.

use std::io::{self, Write};
use std::net::SocketAddr;
use std::process::ExitCode;

use rodizio::backend::BackendSpec;
use rodizio::cli::{self, one_line, BackendArgs, Cli, Command, DemoArgs};
use rodizio::demo::DemoBackend;
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
    let mut config = cli.balancer.to_config()?;
    if cli.balancer.trace_lang.is_none() {
        // The trace speaks the user's language: `LANG=pt_BR.UTF-8` gives pt.
        let locale = std::env::var("LANG").unwrap_or_default();
        if let Some(lang) = rodizio::trace::Lang::from_locale(&locale) {
            config.trace_lang = lang;
        }
    }
    match cli.command {
        Some(Command::Backend(args)) => backend_role(args),
        Some(Command::Demo(args)) => demo(config, args),
        None => {
            if config.backends.is_empty() {
                let stdin = io::stdin();
                config.backends = prompt::servers_entry(&mut stdin.lock(), &mut io::stdout())?;
            }
            balance(config, Shutdown::new())
        }
    }
}

/// What every role does before serving: signals handled by a thread of
/// their own (blocked before any other thread starts, so every thread
/// inherits the mask), and the open-files limit raised.
fn prepare_process(shutdown: &Shutdown) -> Result<(), Error> {
    signals::spawn(shutdown.clone())?;
    match system::raise_nofile_limit() {
        Ok(limit) => log::debug!("open files limit: {limit}"),
        Err(err) => log::warn!("could not raise the open files limit: {err}"),
    }
    Ok(())
}

/// Runs the balancer with signals handled, after printing the article's line.
fn balance(config: Config, shutdown: Shutdown) -> Result<(), Error> {
    prepare_process(&shutdown)?;
    let balancer = Balancer::bind(config).map_err(Error::worded_as_flag)?;
    println!(
        "Load balancer listening on port {}",
        balancer.local_addr().port()
    );
    let _ = io::stdout().flush();
    balancer.run(&shutdown)
}

/// `rodizio backend`: one demo backend until a signal.
fn backend_role(args: BackendArgs) -> Result<(), Error> {
    let shutdown = Shutdown::new();
    prepare_process(&shutdown)?;
    let backend = DemoBackend::bind(args.listen, args.name)?;
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
