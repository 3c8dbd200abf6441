//! The error type of the balancer.
//!
//! Start-up and per-connection failures are [`Error`]s (the low-level socket
//! helpers return `io::Error` and their callers wrap or log it; the pump,
//! [`crate::proxy::pump()`], returns how the connection ended, with the
//! `io::Error` behind it, and never fails). The variants name
//! the cause (`Bind`, `BackendConnect`, ...) so that a log line or the one-line
//! message printed by `main` says what went wrong and where.
//!
//! Two kinds of error exist, and the difference is policy, not type:
//!
//! - **Start-up errors** (a bad flag, a backend that does not resolve, a port
//!   already in use) end [`crate::Balancer::bind`], and `main` turns them into an exit
//!   code: 2 for usage errors ([`Error::is_usage`]), 1 for the rest.
//! - **Per-connection errors** (a backend refusing, a client resetting) are
//!   logged by the worker and end only that one connection.
//!
//! # Corresponds to the C article
//!
//! The C's `perror(...)` then `exit(EXIT_FAILURE)` wherever anything fails,
//! even on the worker path; here the messages become values.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Everything that can go wrong in rodizio.
#[derive(Debug)]
pub enum Error {
    /// The listening socket could not be created, bound or put in listen mode.
    Bind {
        /// The address we tried to listen on.
        addr: SocketAddr,
        /// What the operating system said.
        source: io::Error,
    },
    /// No backend of the list could be reached for one connection.
    BackendConnect {
        /// The backend tried last.
        backend: String,
        /// What the last connect attempt said.
        source: io::Error,
    },
    /// A backend specification (`HOST:PORT[,weight=N]`) is not valid.
    InvalidBackend(String),
    /// A flag or configuration value is not valid (a message for the user).
    InvalidConfig(String),
    /// One setting's value is not valid. `setting` is its name as the
    /// config file writes it (`workers`, `health_interval`); the command
    /// line words it as the flag (`--workers`).
    InvalidSetting {
        /// The setting's name, snake_case.
        setting: String,
        /// What is wrong, for example `must be 1..65536, got 0`.
        message: String,
    },
    /// Standard input ended while the prompt was asking for backends.
    PromptEof,
    /// Any other I/O error, with what we were doing when it happened.
    Io {
        /// What we were doing.
        context: String,
        /// What the operating system said.
        source: io::Error,
    },
    /// A config file that cannot be read, is not valid JSON, or holds a
    /// key or value that is not valid.
    ConfigFile {
        /// The file, as given.
        path: PathBuf,
        /// Where in it, as `(line, column)` from 1, when known.
        position: Option<(usize, usize)>,
        /// What is wrong, naming the key as the file writes it.
        message: String,
    },
}

impl Error {
    /// Wraps an I/O error with a short description of what was being done.
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// An [`Error::InvalidSetting`].
    pub fn setting(setting: impl Into<String>, message: impl Into<String>) -> Self {
        Error::InvalidSetting {
            setting: setting.into(),
            message: message.into(),
        }
    }

    /// The same error with a setting's name worded as its command-line flag
    /// (`health_interval` → `--health-interval`), and so are the other
    /// settings its message names between backquotes; other errors
    /// unchanged.
    pub fn worded_as_flag(self) -> Self {
        let flag = flag_name;
        match self {
            Error::InvalidSetting { setting, message } => {
                let mut parts = message.split('`');
                let mut text = parts.next().unwrap_or_default().to_string();
                // A service's name (`service `web``, `services `a` and
                // `b``) is a name, not a setting: kept as written.
                let mut named = false;
                for (i, part) in parts.enumerate() {
                    if i % 2 == 1 {
                        text.push_str(part);
                        continue;
                    }
                    named = text.ends_with("service ")
                        || text.ends_with("services ")
                        || (named && text.ends_with("` and "));
                    if named {
                        text.push('`');
                        text.push_str(part);
                        text.push('`');
                    } else {
                        text.push_str(&flag(part));
                    }
                }
                Error::InvalidConfig(format!("{} {text}", flag(&setting)))
            }
            other => other,
        }
    }

    /// True for errors caused by what the user typed: `main` exits with 2.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            Error::InvalidBackend(_)
                | Error::InvalidConfig(_)
                | Error::InvalidSetting { .. }
                | Error::PromptEof
                | Error::ConfigFile { .. }
        )
    }
}

/// The command-line flag of a setting, as the operator types it: the
/// setting's name in kebab case, except where the flag is spelled
/// otherwise (`backends` is given with `--backend`, once per backend;
/// `admin_listen` with `--admin`, `tls_certs` with `--tls-cert`).
pub fn flag_name(setting: &str) -> String {
    match setting {
        "backends" => "--backend".to_string(),
        "admin_listen" => "--admin".to_string(),
        "tls_certs" => "--tls-cert".to_string(),
        // Keys of the file that no flag gives: the file's word.
        "services" | "name" | "mode" => format!("`{setting}`"),
        _ => format!("--{}", setting.replace('_', "-")),
    }
}

/// What went wrong, in one line: the values it echoes (a file's, a flag's,
/// a peer's) with their control characters escaped ([`crate::units::shown`]),
/// whichever of the start-up line, the log or the admin API's answer shows it.
impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crate::units::shown(&Words(self).to_string(), usize::MAX))
    }
}

/// An [`Error`]'s words as its parts give them, before they are shown.
struct Words<'a>(&'a Error);

impl fmt::Display for Words<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Error::Bind { addr, source } => write!(f, "failed to listen on {addr}: {source}"),
            Error::BackendConnect { backend, source } => {
                write!(f, "failed to connect to backend {backend}: {source}")
            }
            Error::InvalidBackend(msg) => write!(f, "invalid backend: {msg}"),
            Error::InvalidConfig(msg) => write!(f, "invalid configuration: {msg}"),
            Error::InvalidSetting { setting, message } => {
                write!(f, "invalid configuration: {setting} {message}")
            }
            Error::PromptEof => write!(
                f,
                "standard input ended before the backends were entered (give them with --backend)"
            ),
            Error::Io { context, source } => write!(f, "{context}: {source}"),
            Error::ConfigFile {
                path,
                position,
                message,
            } => match position {
                Some((line, column)) => write!(
                    f,
                    "{}: line {line}, column {column}: {message}",
                    path.display()
                ),
                None => write!(f, "{}: {message}", path.display()),
            },
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Bind { source, .. }
            | Error::BackendConnect { source, .. }
            | Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Shorthand for results in this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_a_message_echoes_are_shown_escaped() {
        let err = Error::setting("user", "\u{1b}[2J\0: no such user on this host");
        assert_eq!(
            err.to_string(),
            "invalid configuration: user \\u001b[2J\\u0000: no such user on this host"
        );
        let err = Error::ConfigFile {
            path: PathBuf::from("a\nb.json"),
            position: Some((1, 2)),
            message: "`kernel_relay`: 'on\r': use off, on or auto".into(),
        };
        assert_eq!(
            err.to_string(),
            "a\\u000ab.json: line 1, column 2: `kernel_relay`: 'on\\u000d': use off, on or auto"
        );
    }

    #[test]
    fn worded_as_flags_only_settings_with_a_flag_become_flags() {
        let words = |setting: &str, message: &str| {
            Error::setting(setting, message)
                .worded_as_flag()
                .to_string()
        };
        assert_eq!(
            words(
                "backends",
                "names the one service's; with `services` in the file"
            ),
            "invalid configuration: --backend names the one service's; with `services` in the file"
        );
        assert_eq!(
            words("sni_default", "service `default` needs `server_names`"),
            "invalid configuration: --sni-default service `default` needs --server-names"
        );
        assert_eq!(
            words(
                "sni_default",
                "services `a` and `b` are both the default; `idle_timeout`"
            ),
            "invalid configuration: --sni-default services `a` and `b` are both the default; \
             --idle-timeout"
        );
    }
}
