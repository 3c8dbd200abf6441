//! Command-line flags, parsed with clap, turned into [`Overrides`] laid over
//! the defaults. clap lives here only: the settings types know nothing of it.
//!
//! `rodizio [FLAGS]` runs the balancer (asking for backends when no
//! `--backend` is given); `rodizio [FLAGS] demo` runs it in front of demo
//! backends (three by default); `rodizio backend --listen ADDR` runs one
//! alone (the "backend role": the same program as a balancer or a server).
//!
//! The balancer's flags come from the settings table (`config/table.rs` and
//! its `table_*.rs` parts, read by `config/settings.rs`): each line there
//! gives a flag's help, type and clap attributes.
//!
//! No default is written here: each flag is optional, and `--help` shows
//! the default from [`Config::default`]. Parsing runs once, on the main thread, before any
//! other thread exists: nothing here is shared.
//!
//! # Corresponds to the C article
//!
//! The C has no flags: its settings are `#define`s, changed by editing and
//! recompiling. The defaults here are those constants.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::backend::BackendSpec;
use crate::config::table::settings_table;
use crate::config::{parse_listen, Config, Overrides, MAX_WORKERS};
use crate::connections::{OnDown, Removal, SpreadOrder};
use crate::error::{Error, Result};
use crate::etcd::EtcdSource;
use crate::health::CheckKind;
use crate::kernel_sched::SchedPolicy;
use crate::limiter::{FailurePolicy, Rate, RateLimitAlgorithm, RateLimitReply, MAX_MAX_CLIENTS};
use crate::proxy_protocol::{CidrList, Version};
use crate::scheduler::Algorithm;
use crate::sni::ServerNames;
use crate::srv::Nameservers;
use crate::tls_term::{CertList, CertPair, CrlFiles};
use crate::trace::Lang;
use crate::units::{parse_duration, parse_size, ByteRate, Switch};

/// rodizio: a thread-per-connection TCP load balancer (round robin by default).
#[derive(Debug, Parser)]
#[command(name = "rodizio", version, about, long_about = None)]
pub struct Cli {
    /// Balancer settings.
    #[command(flatten)]
    pub balancer: BalancerArgs,
    /// What to run; the balancer when omitted.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start demo HTTP backends on loopback (three by default) and the
    /// balancer in front of them (the balancer flags go before `demo`).
    Demo(DemoArgs),
    /// Run one demo HTTP backend: it answers every request with a body
    /// naming itself, and `GET /health` with 200.
    Backend(BackendArgs),
    /// Check a config file: print the settings it gives (with the flags
    /// before `check-config` over it), one `key = value` per line; exit 0
    /// when valid, 2 with the reason when not. With `--diff OLD`, what a
    /// reload from OLD to it would do.
    CheckConfig(CheckConfigArgs),
    /// Check this host against the settings (the config file, with the
    /// flags before `preflight` over it): open files, threads, the backlog,
    /// local ports, memory; one ok/warn/fail line each, with the command
    /// that fixes it; exit 0, or 1 when a check fails.
    Preflight(PreflightArgs),
    /// Run every kind of health check once against a server and print what
    /// it answered, which kinds pass, and the one to choose; exit 0 when
    /// one passes, 1 when none does.
    Probe(ProbeArgs),
    /// Run the scheduler of each service (the config file, with the flags
    /// before `simulate` over it) for N clients, with no socket, and print
    /// each backend's share; with `--remove` or `--weight`, the shares
    /// after that change and how many clients land on another backend.
    Simulate(SimulateArgs),
    /// Start a new rodizio with the flags before it, to take over at `upgrade_socket`.
    Upgrade,
}

/// Arguments of `rodizio check-config`.
#[derive(Debug, Args)]
pub struct CheckConfigArgs {
    /// The JSON config file to check.
    pub file: PathBuf,
    /// Print instead what a reload from OLD to FILE would do (backends
    /// added, drained, reweighted; settings changed; those that need a
    /// restart), one change a line; nothing runs or changes.
    #[arg(long, value_name = "OLD")]
    pub diff: Option<PathBuf>,
}

/// Arguments of `rodizio preflight`.
#[derive(Debug, Args)]
pub struct PreflightArgs {
    /// The JSON config file whose settings to weigh (or `-c FILE` before
    /// `preflight`; without either, the defaults and the flags).
    pub file: Option<PathBuf>,
}

/// Arguments of `rodizio probe`. Without a flag, each takes the health
/// check's default.
#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// The server, as a backend is written (`,send-proxy` opens each check
    /// with a PROXY protocol header).
    #[arg(value_name = "HOST:PORT", value_parser = parse_backend)]
    pub server: BackendSpec,
    /// Longest wait for each check [default: the health checks' 2s].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    /// Path of the http check [default: /health].
    #[arg(long)]
    pub path: Option<String>,
    /// User of the mysql and pgsql checks [default: none for mysql, rodizio
    /// for pgsql].
    #[arg(long)]
    pub user: Option<String>,
}

/// Arguments of `rodizio simulate`.
#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// The JSON config file whose services to simulate (or `-c FILE`
    /// before `simulate`; without either, the flags: `-b`, `--algorithm`).
    pub file: Option<PathBuf>,
    /// How many clients (picks), each from its own address [at most
    /// 1000000].
    #[arg(long, default_value_t = 10_000, value_name = "N")]
    pub clients: u64,
    /// Only the service of this name.
    #[arg(long, value_name = "NAME")]
    pub service: Option<String>,
    /// Then remove this backend (HOST:PORT as configured) and show where
    /// its clients go.
    #[arg(long, value_name = "BACKEND", conflicts_with = "weight")]
    pub remove: Option<String>,
    /// Then give this backend another weight (HOST:PORT=W).
    #[arg(long, value_name = "BACKEND=W", value_parser = parse_reweight)]
    pub weight: Option<(String, u32)>,
}

/// `HOST:PORT=W` for `simulate --weight`, W from 1 to 1000 as a backend's
/// `weight=`.
fn parse_reweight(text: &str) -> std::result::Result<(String, u32), String> {
    let (name, weight) = text
        .rsplit_once('=')
        .ok_or_else(|| format!("'{text}' is not HOST:PORT=WEIGHT (e.g. 127.0.0.1:8001=3)"))?;
    match weight.trim().parse::<u32>() {
        Ok(w) if (1..=1000).contains(&w) => Ok((name.trim().to_string(), w)),
        _ => Err(format!(
            "weight '{weight}' is not a whole number from 1 to 1000"
        )),
    }
}

/// Flags of `rodizio demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// How many demo backends to start.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=10))]
    pub backends: u16,
    /// Port of the first demo backend on 127.0.0.1; the others follow it
    /// (0 picks free ports).
    #[arg(long, default_value_t = 8001)]
    pub first_port: u16,
}

/// Flags of `rodizio backend`.
#[derive(Debug, Args)]
pub struct BackendArgs {
    /// Address to listen on.
    #[arg(short, long, default_value = "127.0.0.1:8001", value_parser = parse_listen)]
    pub listen: SocketAddr,
    /// Name in the reply body (default: the listening address).
    #[arg(long)]
    pub name: Option<String>,
}

/// Reads the settings table (`config/settings.rs`) for the flags: each
/// setting's help, long flag, type and clap attributes. What a flag gives
/// becomes its [`Overrides`] field through [`FlagValue`].
macro_rules! balancer_args {
    ($(
        $(#[doc = $doc:literal])*
        $key:ident: $ty:ty, $flag:literal, $scope:ident,
        $how:ident($($place:ident).+), $reload:ident $([$($kept:ident).+])?,
        file $file:ty => $read:ident,
        flag $cli:ty $([$($arg:tt)*])?,
        $shows:ident $show:expr;
    )*
    @file_only { $($alias:ident: $alias_ty:ty,)* }
    ) => {
        /// Flags of the balancer itself. Each is optional: what is not
        /// given keeps the value underneath (the default, or a config
        /// file). The defaults shown by `--help` come from
        /// [`Config::default`] (see [`command`]).
        #[derive(Debug, Args)]
        pub struct BalancerArgs {
            $(
                $(#[doc = $doc])*
                #[arg(long = $flag $(, $($arg)*)?)]
                pub $key: $cli,
            )*
            /// Read settings from this JSON file (flags win over it); SIGHUP
            /// reads it again. See docs/operations.md.
            #[arg(short = 'c', long = "config", value_name = "FILE")]
            pub config: Option<PathBuf>,
        }

        impl BalancerArgs {
            /// The settings these flags give, to lay over the defaults and
            /// a config file.
            pub fn overrides(&self) -> Overrides {
                Overrides {
                    $($key: FlagValue::<$ty>::given(&self.$key),)*
                }
            }
        }
    };
}

settings_table!(balancer_args);

/// A flag's value as the value of its setting of type `T`; `None` when
/// the flag was not given.
trait FlagValue<T> {
    fn given(&self) -> Option<T>;
}

impl<T: Clone> FlagValue<T> for Option<T> {
    fn given(&self) -> Option<T> {
        self.clone()
    }
}

/// A switch given is `true`; not given is `None`, not `false` (a flag
/// cannot say "off": that is the default, or a config file's word).
impl FlagValue<bool> for bool {
    fn given(&self) -> Option<bool> {
        self.then_some(true)
    }
}

/// `-b` repeated: the list, if any was given.
impl FlagValue<Vec<BackendSpec>> for Vec<BackendSpec> {
    fn given(&self) -> Option<Vec<BackendSpec>> {
        (!self.is_empty()).then(|| self.clone())
    }
}

impl FlagValue<CertList> for Vec<CertPair> {
    fn given(&self) -> Option<CertList> {
        (!self.is_empty()).then(|| CertList(self.clone()))
    }
}

impl FlagValue<CrlFiles> for Vec<PathBuf> {
    fn given(&self) -> Option<CrlFiles> {
        (!self.is_empty()).then(|| CrlFiles(self.clone()))
    }
}

impl FlagValue<Option<Duration>> for Option<DurationOrOff> {
    fn given(&self) -> Option<Option<Duration>> {
        self.map(|d| d.0)
    }
}

impl FlagValue<usize> for Option<u32> {
    fn given(&self) -> Option<usize> {
        self.map(|n| n as usize)
    }
}

/// A duration, or `off`: the value of a flag that is on by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurationOrOff(pub Option<Duration>);

fn parse_duration_or_off(text: &str) -> std::result::Result<DurationOrOff, String> {
    if text.trim() == "off" {
        return Ok(DurationOrOff(None));
    }
    parse_duration(text)
        .map(|d| DurationOrOff(Some(d)))
        .map_err(|e| format!("{e}; or off, to keep every worker"))
}

fn parse_access_log(text: &str) -> std::result::Result<crate::access_log::Format, String> {
    text.parse()
        .map_err(|e: Error| e.to_string().replace("invalid configuration: ", ""))
}

fn parse_failure(text: &str) -> std::result::Result<FailurePolicy, String> {
    text.parse()
}

fn parse_proxy_version(text: &str) -> std::result::Result<Version, String> {
    text.parse()
        .map_err(|e: crate::proxy_protocol::ParseError| e.to_string())
}

fn parse_nameservers(text: &str) -> std::result::Result<Nameservers, String> {
    text.parse()
}

fn parse_cidrs(text: &str) -> std::result::Result<CidrList, String> {
    text.parse()
        .map_err(|e: crate::proxy_protocol::ParseError| e.to_string())
}

fn parse_health_bytes(text: &str) -> std::result::Result<Vec<u8>, String> {
    crate::health::protocol::parse_bytes(text)
}

fn parse_backend(text: &str) -> std::result::Result<BackendSpec, String> {
    BackendSpec::parse(text).map_err(|e| match e {
        Error::InvalidBackend(msg) => msg,
        other => other.to_string(),
    })
}

/// A whole number up to `HI`, refused in words ("expected a whole number
/// from 1 to 65536") as the config file refuses it. `LO` is for the words:
/// a value under it is refused by the validation, which names the setting.
fn whole<T: TryFrom<u64>, const LO: u64, const HI: u64>(
    text: &str,
) -> std::result::Result<T, String> {
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|n| *n <= HI)
        .and_then(|n| T::try_from(n).ok())
        .ok_or_else(|| {
            let shown: String = text.chars().take(40).collect();
            let cut = if shown.len() < text.len() { "..." } else { "" };
            format!("expected a whole number from {LO} to {HI}, got '{shown}{cut}'")
        })
}

fn parse_algorithm(text: &str) -> std::result::Result<Algorithm, String> {
    text.parse()
}

fn parse_check(text: &str) -> std::result::Result<CheckKind, String> {
    text.parse()
}

fn parse_rule(text: &str) -> std::result::Result<RateLimitAlgorithm, String> {
    text.parse()
}

fn parse_sched_policy(text: &str) -> std::result::Result<SchedPolicy, String> {
    text.parse()
}

fn parse_switch(text: &str) -> std::result::Result<Switch, String> {
    text.parse()
}

fn parse_on_down(text: &str) -> std::result::Result<OnDown, String> {
    text.parse()
}

fn parse_spread_order(text: &str) -> std::result::Result<SpreadOrder, String> {
    text.parse()
}

fn parse_removal(text: &str) -> std::result::Result<Removal, String> {
    text.parse()
}

fn parse_lang(text: &str) -> std::result::Result<Lang, String> {
    text.parse()
}

fn parse_reply(text: &str) -> std::result::Result<RateLimitReply, String> {
    text.parse()
}

impl BalancerArgs {
    /// The configuration these flags describe over the defaults (backends
    /// may still be empty: the prompt fills them). Errors name the flags.
    ///
    /// # Errors
    ///
    /// A usage error ([`Error::is_usage`]) when flags contradict each other
    /// (for example `--rate-limit-reply` without `--rate-limit`).
    pub fn to_config(&self) -> Result<Config> {
        let mut config = Config::default();
        self.overrides()
            .apply(&mut config)
            .map_err(Error::worded_as_flag)?;
        Ok(config)
    }
}

/// The clap command, with each balancer flag's help ending in its default
/// as [`Config::default`] describes it: the defaults are written once, in
/// the settings types, and shown from there.
pub fn command() -> clap::Command {
    let mut cmd = Cli::command();
    // Every flag that takes a value takes it even when it starts with a
    // hyphen, so `--connect-timeout -1s` reaches the value parser, which
    // refuses it naming the flag, instead of clap saying "unexpected
    // argument '-1'" without naming any.
    let valued: Vec<clap::Id> = cmd
        .get_arguments()
        .filter(|a| a.get_action().takes_values() && !a.is_positional())
        .map(|a| a.get_id().clone())
        .collect();
    for id in valued {
        cmd = cmd.mut_arg(id, |arg| arg.allow_hyphen_values(true));
    }
    for (name, value) in Config::default().describe() {
        if value.is_empty() || !cmd.get_arguments().any(|a| a.get_id() == name) {
            continue;
        }
        cmd = cmd.mut_arg(name, |arg| {
            let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
            arg.help(format!("{help} [default: {value}]"))
        });
    }
    cmd
}

/// Parses the process's arguments with [`command`].
///
/// # Errors
///
/// clap's error for bad arguments (and for `--help`/`--version`, which it
/// reports as errors of those kinds).
pub fn parse() -> std::result::Result<Cli, clap::Error> {
    parse_from(std::env::args_os())
}

/// Parses `args` (the program name first) as [`parse`] does: with
/// [`command`], and refusing balancer flags given with the `backend` and
/// `probe` subcommands, which run no balancer (`rodizio -l ADDR backend`
/// would otherwise listen on the backend's default address and say
/// nothing).
///
/// # Errors
///
/// As [`parse`].
pub fn parse_from<I, T>(args: I) -> std::result::Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let mut cmd = command();
    let args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
    let matches = cmd
        .try_get_matches_from_mut(args.clone())
        .map_err(|err| match err.kind() {
            clap::error::ErrorKind::UnknownArgument => {
                flags_after_demo(&mut cmd, &args).unwrap_or(err)
            }
            _ => err,
        })?;
    // Subcommands that run no balancer, with an example of their own flags.
    let runs_no_balancer = match matches.subcommand_name() {
        Some("backend") => Some(("backend", "rodizio backend --listen 127.0.0.1:8001")),
        Some("probe") => Some(("probe", "rodizio probe 127.0.0.1:6379 --timeout 1s")),
        _ => None,
    };
    if let Some((name, example)) = runs_no_balancer {
        // Named as typed: `-b` is `--backend`, whose id is `backends`.
        let flags: Vec<(clap::Id, String)> = cmd
            .get_arguments()
            .map(|a| {
                let long = a.get_long().unwrap_or(a.get_id().as_str());
                (a.get_id().clone(), format!("--{long}"))
            })
            .collect();
        let given: Vec<String> = matches
            .ids()
            .filter(|id| {
                matches.value_source(id.as_str()) == Some(clap::parser::ValueSource::CommandLine)
            })
            .filter_map(|id| flags.iter().find(|(f, _)| f == id).map(|(_, n)| n.clone()))
            .collect();
        if !given.is_empty() {
            return Err(cmd.error(
                clap::error::ErrorKind::ArgumentConflict,
                format!(
                    "{} given before '{name}': balancer flags, and '{name}' runs no \
                     balancer; its own flags go after it ({example})",
                    given.join(", ")
                ),
            ));
        }
    }
    Cli::from_arg_matches(&matches)
}

/// For `rodizio demo -l ADDR`: an error saying that balancer flags go
/// before `demo`, with the command line put right; `None` when no balancer
/// flag follows `demo`.
fn flags_after_demo(cmd: &mut clap::Command, args: &[std::ffi::OsString]) -> Option<clap::Error> {
    let words: Vec<String> = args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let demo = words.iter().position(|w| w == "demo")?;
    // A balancer flag as typed (`-l`, `--listen`, `--listen=ADDR`), and
    // how many words it takes.
    let flag_at = |w: &str| {
        let name = w.split('=').next().unwrap_or(w);
        cmd.get_arguments().find_map(|a| {
            let long = a.get_long().map(|l| format!("--{l}"));
            let short = a.get_short().map(|c| format!("-{c}"));
            let hit = long.as_deref() == Some(name) || short.as_deref() == Some(name);
            let takes = a.get_action().takes_values() && !w.contains('=');
            hit.then_some(if takes { 2 } else { 1 })
        })
    };
    let (at, len) = words
        .iter()
        .enumerate()
        .skip(demo + 1)
        .find_map(|(i, w)| flag_at(w).map(|len| (i, len)))?;
    let end = (at + len).min(words.len());
    let mut fixed: Vec<&str> = vec!["rodizio"];
    fixed.extend(words[1..demo].iter().map(String::as_str));
    fixed.extend(words[at..end].iter().map(String::as_str));
    fixed.push("demo");
    fixed.extend(words[demo + 1..at].iter().map(String::as_str));
    fixed.extend(words[end..].iter().map(String::as_str));
    Some(cmd.error(
        clap::error::ErrorKind::UnknownArgument,
        format!(
            "'{}' after 'demo': balancer flags go before 'demo' ({})",
            words[at],
            fixed.join(" ")
        ),
    ))
}

/// The first line of a clap error, for the one-line message on bad flags
/// (clap's own message adds a usage block and a hint over several lines).
pub fn one_line(err: &clap::Error) -> String {
    clip_quoted(&one_line_whole(err))
}

/// Every quoted value (`'...'`) of `line` cut to 64 characters and `…`:
/// clap quotes the value it refused whole, and a value of a megabyte
/// would make a line no one reads.
fn clip_quoted(line: &str) -> String {
    const MAX: usize = 64;
    let mut out = String::with_capacity(line.len().min(1024));
    for (i, part) in line.split('\'').enumerate() {
        if i > 0 {
            out.push('\'');
        }
        if i % 2 == 1 && part.chars().count() > MAX {
            out.extend(part.chars().take(MAX));
            out.push('…');
        } else {
            out.push_str(part);
        }
    }
    out
}

/// [`one_line`] before its values are clipped.
fn one_line_whole(err: &clap::Error) -> String {
    let rendered = err.render().to_string();
    let mut lines = rendered.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next().unwrap_or("invalid arguments").to_string();
    let rest: Vec<&str> = lines
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .collect();
    // "the following required arguments were not provided:" lists them on
    // the next lines, up to the usage block: keep them on the same line.
    if first.ends_with(':') && !rest.is_empty() {
        return format!("{first} {}", rest.join(", "));
    }
    // What clap adds below the first line and is worth keeping: the
    // accepted values and its tips ("a similar argument exists: ...").
    let kept: Vec<&str> = rest
        .into_iter()
        .filter(|l| l.starts_with("tip:") || l.starts_with("[possible values:"))
        .collect();
    if kept.is_empty() {
        first
    } else {
        format!("{first} ({})", kept.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn refused_values_are_shown_clipped() {
        let long = "9".repeat(5000);
        let err = parse_from(["rodizio", "--workers", &long]).unwrap_err();
        let line = one_line(&err);
        assert!(line.len() < 300 && line.contains("99…'"), "{line}");
        assert_eq!(clip_quoted("a 'b' c"), "a 'b' c");
    }

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn help_shows_the_defaults_of_the_settings() {
        let help = command().render_help().to_string();
        for shown in [
            "[default: 0.0.0.0:8080]",
            "[default: 64k]",
            "[default: 3s]",
            "[default: 10m]",
            "[default: round-robin]",
            "[default: tcp]",
            "[default: /health]",
        ] {
            assert!(help.contains(shown), "{shown} missing from --help");
        }
    }

    #[test]
    fn the_backend_help_lists_every_option_the_parser_takes() {
        let help = command().render_long_help().to_string();
        let at = help.find("--backend <HOST:PORT>").unwrap();
        let text: String = help[at..].split_whitespace().collect::<Vec<_>>().join(" ");
        let options = crate::backend::BACKEND_OPTIONS
            .iter()
            .map(|o| o.to_string())
            .chain(
                crate::backend::own_check::KEYS
                    .iter()
                    .map(|k| format!("{k}=")),
            );
        for option in options {
            assert!(
                text.contains(&format!(",{option}")),
                ",{option} missing from --help"
            );
        }
        // The short help keeps to one line.
        let short = command().render_help().to_string();
        assert!(!short.contains(",check_port"), "{short}");
    }

    #[test]
    fn splice_and_yield_are_off_by_default() {
        let off = Cli::try_parse_from(["rodizio"]).unwrap();
        let c = off.balancer.to_config().unwrap();
        assert!(!c.proxy.splice);
        assert_eq!(c.proxy.yield_before_poll, Switch::Off);
        let on = Cli::try_parse_from(["rodizio", "--splice", "--yield-before-poll"]).unwrap();
        let c = on.balancer.to_config().unwrap();
        assert!(c.proxy.splice);
        assert_eq!(c.proxy.yield_before_poll, Switch::On);
        let auto = Cli::try_parse_from(["rodizio", "--yield-before-poll=auto"]).unwrap();
        let c = auto.balancer.to_config().unwrap();
        assert_eq!(c.proxy.yield_before_poll, Switch::Auto);
        let bad = Cli::try_parse_from(["rodizio", "--yield-before-poll=sometimes"]);
        let Err(refused) = bad else {
            panic!("--yield-before-poll=sometimes was taken")
        };
        let message = refused.to_string();
        assert!(
            message.contains("'sometimes': use off, on or auto"),
            "{message}"
        );
    }

    #[test]
    fn algorithm_flag() {
        let c = Cli::try_parse_from(["rodizio"]).unwrap();
        assert_eq!(
            c.balancer.to_config().unwrap().algorithm,
            Algorithm::RoundRobin
        );
        // Every algorithm by its name (the names themselves are pinned in
        // the scheduler's tests).
        for name in Algorithm::ALL.iter().map(|a| a.name()) {
            let c = Cli::try_parse_from(["rodizio", "--algorithm", name]).unwrap();
            assert_eq!(c.balancer.algorithm.unwrap().name(), name);
        }
        assert!(Cli::try_parse_from(["rodizio", "--algorithm", "random"]).is_err());
    }

    #[test]
    fn bad_flags_give_one_clear_line() {
        for args in [
            vec!["rodizio", "--workers", "many"],
            vec!["rodizio", "-b", "nope"],
            vec!["rodizio", "--connect-timeout", "3 parsecs"],
            vec!["rodizio", "--no-such-flag"],
            vec!["rodizio", "backend", "--listen"],
        ] {
            let err = Cli::try_parse_from(&args).unwrap_err();
            let line = one_line(&err);
            assert!(line.starts_with("error:"), "{args:?}: {line}");
            assert!(!line.contains('\n'));
        }
    }

    #[test]
    fn admin_flags_build_the_admin_settings() {
        let c = Cli::try_parse_from(["rodizio"]).unwrap();
        let c = c.balancer.to_config().unwrap();
        assert_eq!(c.admin_listen, None);
        let help = command().render_help().to_string();
        let admin = &help[help.find("--admin <ADDR>").unwrap()..];
        let admin = &admin[..admin.find("--admin-allow-remote\n").unwrap()];
        assert!(admin.contains("[default: off]"), "{admin}");
        let cli = Cli::try_parse_from([
            "rodizio",
            "--admin",
            "127.0.0.1:9000",
            "--admin-token-file",
            "/etc/rodizio/token",
            "--admin-allow-remote",
        ])
        .unwrap();
        let c = cli.balancer.to_config().unwrap();
        assert_eq!(c.admin_listen, Some("127.0.0.1:9000".parse().unwrap()));
        assert_eq!(c.admin_token_file, Some("/etc/rodizio/token".into()));
        assert!(c.admin_allow_remote);
        // The name validation words it as: the alias works too.
        let cli = Cli::try_parse_from(["rodizio", "--admin-listen", "[::1]:9000"]).unwrap();
        assert!(cli.balancer.admin_listen.is_some());
        let err = Cli::try_parse_from(["rodizio", "--admin", "localhost"]).unwrap_err();
        assert!(one_line(&err).starts_with("error:"));
    }

    #[test]
    fn preflight_and_probe_subcommands() {
        let cli = Cli::try_parse_from(["rodizio", "--workers", "9", "preflight"]).unwrap();
        assert!(matches!(
            cli.command,
            Some(Command::Preflight(PreflightArgs { file: None }))
        ));
        assert_eq!(cli.balancer.workers, Some(9));
        let cli = Cli::try_parse_from(["rodizio", "preflight", "a.json"]).unwrap();
        match cli.command {
            Some(Command::Preflight(args)) => assert_eq!(args.file, Some("a.json".into())),
            other => panic!("{other:?}"),
        }
        let cli = parse_from([
            "rodizio",
            "probe",
            "127.0.0.1:6379",
            "--timeout",
            "500ms",
            "--user",
            "app",
        ])
        .unwrap();
        match cli.command {
            Some(Command::Probe(args)) => {
                assert_eq!(args.server.name(), "127.0.0.1:6379");
                assert_eq!(args.timeout, Some(Duration::from_millis(500)));
                assert_eq!(args.user.as_deref(), Some("app"));
                assert_eq!(args.path, None);
            }
            other => panic!("{other:?}"),
        }
        for bad in [
            vec!["rodizio", "probe"],
            vec!["rodizio", "probe", "6379"],
            vec!["rodizio", "probe", "127.0.0.1:6379", "--timeout", "soon"],
        ] {
            let err = parse_from(&bad).unwrap_err();
            assert!(one_line(&err).starts_with("error:"), "{bad:?}");
        }
        let err = parse_from(["rodizio", "--workers", "3", "probe", "127.0.0.1:1"]).unwrap_err();
        let line = one_line(&err);
        assert!(line.contains("--workers given before 'probe'"), "{line}");
    }

    #[test]
    fn subcommands() {
        let cli = Cli::try_parse_from(["rodizio", "--workers", "9", "demo"]).unwrap();
        assert!(matches!(
            cli.command,
            Some(Command::Demo(DemoArgs {
                backends: 3,
                first_port: 8001
            }))
        ));
        assert_eq!(cli.balancer.workers, Some(9));
        let cli =
            Cli::try_parse_from(["rodizio", "backend", "--listen", "127.0.0.1:9001"]).unwrap();
        match cli.command {
            Some(Command::Backend(b)) => assert_eq!(b.listen.port(), 9001),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn rate_limit_flags_build_the_config() {
        use crate::limiter::RateLimitConfig;
        const S: Duration = Duration::from_secs(1);
        let cli = Cli::try_parse_from(["rodizio"]).unwrap();
        assert!(cli.balancer.to_config().unwrap().rate_limit.is_none());
        let cli = Cli::try_parse_from([
            "rodizio",
            "--rate-limit",
            "20/10s",
            "--rate-limit-algorithm",
            "token-bucket",
            "--rate-limit-max-clients",
            "1000",
            "--rate-limit-ipv6-prefix",
            "128",
            "--rate-limit-reply",
            "http",
        ])
        .unwrap();
        let rl = cli.balancer.to_config().unwrap().rate_limit.unwrap();
        assert_eq!(
            rl,
            RateLimitConfig {
                rate: Rate {
                    limit: 20,
                    window: 10 * S
                },
                algorithm: RateLimitAlgorithm::TokenBucket,
                max_clients: 1000,
                ipv6_prefix: 128,
                reply: RateLimitReply::Http,
            }
        );
        assert!(rl.validate().is_ok());
        let cli = Cli::try_parse_from(["rodizio", "--rate-limit", "100/1s"]).unwrap();
        assert_eq!(
            cli.balancer.to_config().unwrap().rate_limit,
            Some(RateLimitConfig::new(Rate {
                limit: 100,
                window: S
            }))
        );
        for args in [
            vec!["rodizio", "--rate-limit", "lots"],
            vec!["rodizio", "--rate-limit", "0/1s"],
            vec!["rodizio", "--rate-limit-algorithm", "leaky"],
            vec!["rodizio", "--rate-limit-max-clients", "0"],
            vec!["rodizio", "--rate-limit-ipv6-prefix", "129"],
            vec!["rodizio", "--rate-limit-reply", "teapot"],
        ] {
            let err = Cli::try_parse_from(&args).unwrap_err();
            let line = crate::cli::one_line(&err);
            assert!(line.starts_with("error:"), "{args:?}: {line}");
        }
        // The other flags mean nothing without a limit: a usage error.
        let cli = Cli::try_parse_from(["rodizio", "--rate-limit-reply", "http"]).unwrap();
        let err = cli.balancer.to_config().unwrap_err();
        assert!(err.is_usage());
        assert!(err
            .to_string()
            .contains("--rate-limit-reply needs --rate-limit"));
    }

    #[test]
    fn config_file_flag_and_check_config() {
        let cli = Cli::try_parse_from(["rodizio", "-c", "/etc/rodizio.json"]).unwrap();
        assert_eq!(
            cli.balancer.config,
            Some(PathBuf::from("/etc/rodizio.json"))
        );
        let cli = Cli::try_parse_from(["rodizio", "--config", "a.json", "--workers", "3"]).unwrap();
        assert_eq!(cli.balancer.config, Some(PathBuf::from("a.json")));
        assert_eq!(cli.balancer.overrides().workers, Some(3));
        let cli = Cli::try_parse_from(["rodizio", "check-config", "b.json"]).unwrap();
        match cli.command {
            Some(Command::CheckConfig(args)) => assert_eq!(args.file, PathBuf::from("b.json")),
            other => panic!("{other:?}"),
        }
        assert!(Cli::try_parse_from(["rodizio", "check-config"]).is_err());
    }

    #[test]
    fn trace_flags() {
        use crate::trace::Lang;
        let c = Cli::try_parse_from(["rodizio"]).unwrap();
        let c = c.balancer.to_config().unwrap();
        assert!(!c.trace);
        assert_eq!(c.trace_lang, Lang::En);
        let c = Cli::try_parse_from(["rodizio", "--trace", "--trace-lang", "pt"]).unwrap();
        let c = c.balancer.to_config().unwrap();
        assert!(c.trace);
        assert_eq!(c.trace_lang, Lang::Pt);
        let err = Cli::try_parse_from(["rodizio", "--trace-lang", "fr"]).unwrap_err();
        assert!(one_line(&err).contains("fr"), "{}", one_line(&err));
        let help = command().render_help().to_string();
        assert!(help.contains("--trace-lang"));
    }

    #[test]
    fn queue_timeout_flag() {
        let c = Cli::try_parse_from(["rodizio"]).unwrap();
        let c = c.balancer.to_config().unwrap();
        assert_eq!(c.proxy.queue_timeout, Duration::from_secs(30));
        let c = Cli::try_parse_from(["rodizio", "--queue-timeout", "250ms"]).unwrap();
        let c = c.balancer.to_config().unwrap();
        assert_eq!(c.proxy.queue_timeout, Duration::from_millis(250));
        assert!(command()
            .render_help()
            .to_string()
            .contains("[default: 30s]"));
        assert!(Cli::try_parse_from(["rodizio", "--queue-timeout", "soon"]).is_err());
    }

    #[test]
    fn client_first_byte_timeout_flag_is_off_by_default() {
        let c = Cli::try_parse_from(["rodizio"]).unwrap();
        let c = c.balancer.to_config().unwrap();
        assert_eq!(c.proxy.client_first_byte_timeout, None);
        let c = Cli::try_parse_from(["rodizio", "--client-first-byte-timeout", "2s"]).unwrap();
        let c = c.balancer.to_config().unwrap();
        assert_eq!(
            c.proxy.client_first_byte_timeout,
            Some(Duration::from_secs(2))
        );
        let d = Config::default().describe();
        assert!(d.contains(&("client_first_byte_timeout", "off".to_string())));
    }

    #[test]
    fn one_line_keeps_clap_tips() {
        let err = parse_from(["rodizio", "--worker", "3"]).unwrap_err();
        let line = one_line(&err);
        assert!(
            line.contains("tip: a similar argument exists: '--workers'"),
            "{line}"
        );
        assert!(!line.contains('\n'));
        let err = parse_from(["rodizio", "--algorithm", "rr"]).unwrap_err();
        let line = one_line(&err);
        assert!(line.contains("round-robin, weighted-round-robin"), "{line}");
    }

    #[test]
    fn negative_values_reach_the_value_parser_and_name_the_flag() {
        for (flag, value) in [
            ("--connect-timeout", "-1s"),
            ("--workers", "-3"),
            ("--thread-stack", "-64k"),
            ("--backlog", "-1"),
        ] {
            let err = parse_from(["rodizio", flag, value]).unwrap_err();
            let line = one_line(&err);
            assert!(line.contains(flag), "{flag} {value}: {line}");
            assert!(line.contains(value), "{flag} {value}: {line}");
        }
    }

    #[test]
    fn the_backlog_range_is_1_to_i32_max() {
        let err = parse_from(["rodizio", "--backlog", "2147483648"]).unwrap_err();
        let line = one_line(&err);
        assert!(line.contains("1..=2147483647"), "{line}");
        assert!(parse_from(["rodizio", "--backlog", "2147483647"]).is_ok());
        assert!(parse_from(["rodizio", "--backlog", "0"]).is_err());
    }

    #[test]
    fn balancer_flags_with_the_backend_subcommand_are_refused() {
        let err = parse_from(["rodizio", "-l", "127.0.0.1:18101", "backend"]).unwrap_err();
        let line = one_line(&err);
        assert!(line.contains("--listen given before 'backend'"), "{line}");
        // After it, --listen is the backend's own.
        let cli = parse_from(["rodizio", "backend", "-l", "127.0.0.1:18101"]).unwrap();
        assert!(matches!(cli.command, Some(Command::Backend(b)) if b.listen.port() == 18101));
        // With demo the balancer flags are valid and stay.
        let cli = parse_from(["rodizio", "-l", "127.0.0.1:18101", "demo"]).unwrap();
        assert_eq!(cli.balancer.listen.unwrap().port(), 18101);
    }

    /// Balancer flags after `demo` get a hint with the command put right;
    /// `demo --help` and demo's own flags are left alone.
    #[test]
    fn balancer_flags_after_demo_are_moved_in_the_hint() {
        let err =
            parse_from(["rodizio", "demo", "--backends", "2", "-l", "127.0.0.1:0"]).unwrap_err();
        let line = one_line(&err);
        assert!(
            line.contains(
                "balancer flags go before 'demo' (rodizio -l 127.0.0.1:0 demo --backends 2)"
            ),
            "{line}"
        );
        for help in ["--help", "-h"] {
            let err = parse_from(["rodizio", "demo", help]).unwrap_err();
            assert_eq!(err.kind(), clap::error::ErrorKind::DisplayHelp);
        }
        assert!(parse_from(["rodizio", "demo", "--backends", "2"]).is_ok());
    }

    /// Whole-number flags say the range in words, not the parser's
    /// ("invalid digit found in string", "too large to fit in target type").
    #[test]
    fn whole_number_flags_are_refused_in_words() {
        for (flag, value, range) in [
            ("--workers", "-1", "from 1 to 65536"),
            ("--workers", "99999999999999999999999", "from 1 to 65536"),
            ("--fall", "1.5", "from 1 to 4294967295"),
            ("--rise", "x", "from 1 to 4294967295"),
            ("--passive-failures", "-2", "from 0 to 4294967295"),
            ("--queue-capacity", "-3", "a whole number from 1"),
        ] {
            let err = parse_from(["rodizio", flag, value]).unwrap_err();
            let line = one_line(&err);
            assert!(line.contains(range), "{line}");
            assert!(
                !line.contains("digit") && !line.contains("target type"),
                "{line}"
            );
        }
        let cli = parse_from(["rodizio", "--workers", "8", "--fall", "3"]).unwrap();
        assert_eq!(
            (cli.balancer.workers, cli.balancer.fall),
            (Some(8), Some(3))
        );
    }

    /// The refusal names the flags as typed: `-b` is `--backend` and the
    /// admin address `--admin`, not their settings' names.
    #[test]
    fn flags_before_backend_are_named_as_typed() {
        let err = parse_from(["rodizio", "-b", "127.0.0.1:1", "backend"]).unwrap_err();
        let line = one_line(&err);
        assert!(line.contains("--backend given before 'backend'"), "{line}");
        let err = parse_from(["rodizio", "--admin", "127.0.0.1:9", "backend"]).unwrap_err();
        let line = one_line(&err);
        assert!(line.contains("--admin given before 'backend'"), "{line}");
    }

    #[test]
    fn addresses_are_refused_with_an_example_of_the_right_form() {
        for (args, wanted) in [
            (["rodizio", "-l", "8080"], "127.0.0.1:8080"),
            (["rodizio", "-l", "::1:8001"], "[::1]:8001"),
            (["rodizio", "-b", "::1:8001"], "[::1]:8001"),
            (["rodizio", "-b", "3:8001"], "'3' is not an IPv4 address"),
            (["rodizio", "-b", "3"], "expected HOST:PORT"),
        ] {
            let err = parse_from(args).unwrap_err();
            let line = one_line(&err);
            assert!(line.contains(wanted), "{args:?}: {line}");
        }
    }

    #[test]
    fn worker_idle_timeout_flag_takes_a_duration_or_off() {
        let config = |args: &[&str]| {
            let mut all = vec!["rodizio"];
            all.extend_from_slice(args);
            Cli::try_parse_from(all)
                .unwrap()
                .balancer
                .to_config()
                .unwrap()
        };
        assert_eq!(
            config(&[]).worker_idle_timeout,
            Some(Duration::from_secs(60))
        );
        let c = config(&["--worker-idle-timeout", "5s"]);
        assert_eq!(c.worker_idle_timeout, Some(Duration::from_secs(5)));
        assert_eq!(
            config(&["--worker-idle-timeout", "off"]).worker_idle_timeout,
            None
        );
        let err = parse_from(["rodizio", "--worker-idle-timeout", "soon"]).unwrap_err();
        let line = one_line(&err);
        assert!(line.contains("or off, to keep every worker"), "{line}");
        let zero = config(&["--worker-idle-timeout", "0"]);
        let err = zero.validate_settings().unwrap_err().worded_as_flag();
        assert!(
            err.to_string().contains(
                "--worker-idle-timeout must be at least 1ms, got 0ns (off keeps every worker)"
            ),
            "{err}"
        );
        assert!(command()
            .render_help()
            .to_string()
            .contains("keeps every worker started [default: 1m]"));
    }
}
