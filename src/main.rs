//! The `rodizio` binary: flags → configuration (the prompt when no backend
//! is given) → [`Balancer::bind`] → [`Balancer::run`] → exit code.
//!
//! Exit codes, each with one line on standard error saying why when not 0:
//!
//! - 0: stopped by SIGINT/SIGTERM after a clean drain;
//! - 1: start-up failed (the port is taken, ...);
//! - 2: usage error (bad flags, bad backends, input closed during the
//!   prompt);
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

use rodizio::backend::BackendSpec;
use rodizio::cli::{self, one_line, BackendArgs, Cli, Command, DemoArgs};
use rodizio::demo::DemoBackend;
use rodizio::{prompt, signals, system, Balancer, Config, Error, Shutdown};

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

/// One line to standard output; a closed output is not an error here.
fn say(line: impl Display) {
    let _ = writeln!(io::stdout().lock(), "{line}");
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
    let mut config = cli.balancer.to_config()?;
    if cli.balancer.trace_lang.is_none() {
        // The trace speaks the user's language: `LANG=pt_BR.UTF-8` gives pt.
        let locale = std::env::var("LANG").unwrap_or_default();
        if let Some(lang) = rodizio::trace::Lang::from_locale(&locale) {
            config.trace_lang = lang;
        }
    }
    match cli.command {
        Some(Command::Backend(args)) => backend_role(args, shutdown),
        Some(Command::Demo(args)) => {
            if cli.balancer.listen.is_none() {
                // The demo backends are on loopback only; so is the demo.
                config.listen = SocketAddr::from(([127, 0, 0, 1], rodizio::config::DEFAULT_PORT));
            }
            demo(config, args, shutdown)
        }
        None => {
            if config.backends.is_empty() {
                let stdin = io::stdin();
                config.backends = prompt::servers_entry(&mut stdin.lock(), &mut io::stdout())?;
            }
            balance(config, shutdown)
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

/// Runs the balancer with signals handled, after printing the article's line.
fn balance(config: Config, shutdown: &Shutdown) -> Result<u8, Error> {
    prepare_process(shutdown)?;
    let balancer = Balancer::bind(config).map_err(Error::worded_as_flag)?;
    say(format_args!(
        "Load balancer listening on port {}",
        balancer.local_addr().port()
    ));
    let _ = io::stdout().flush();
    run(balancer, shutdown)
}

/// `rodizio backend`: one demo backend until a signal.
fn backend_role(args: BackendArgs, shutdown: &Shutdown) -> Result<u8, Error> {
    prepare_process(shutdown)?;
    let backend = DemoBackend::bind(args.listen, args.name)?;
    say(format_args!(
        "Demo backend listening on {}",
        backend.local_addr()?
    ));
    let _ = io::stdout().flush();
    backend.serve(shutdown);
    Ok(0)
}

/// `rodizio demo`: demo backends on loopback, the balancer in front.
fn demo(mut config: Config, args: DemoArgs, shutdown: &Shutdown) -> Result<u8, Error> {
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
    let balancer = Balancer::bind(config).map_err(Error::worded_as_flag)?;
    let port = balancer.local_addr().port();
    say(format_args!("Load balancer listening on port {port}"));
    say("");
    say("Try it (each reply names the backend that served it):");
    say(format_args!("  curl http://localhost:{port}/"));
    say(format_args!("  ab -n 1000 -c 100 http://localhost:{port}/"));
    say("Stop with Ctrl-C.");
    let _ = io::stdout().flush();
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
