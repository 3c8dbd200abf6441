//! What the settings table makes: every setting is declared once, in the
//! spirit of `counters!` (`stats.rs`) and `algorithms!`
//! (`scheduler/mod.rs`); the lines are in `table.rs` and its `table_*.rs`
//! parts, and the macro that reads them is here.
//!
//! Each line gives the key (the config file's and [`Config::describe`]'s
//! name, the field of [`Overrides`]), the flag, the type, whether it is
//! process-wide or per service ([`Scope`]), where it is laid in a
//! [`Config`], what a reload does with it ([`Reload`]) and how
//! `check-config` prints it. From it come [`Overrides`], its `given` list
//! and the plain part of its layering, [`Config::describe`] and reload's
//! restart-only list. Its order is `check-config`'s order.
//!
//! Pure data and functions, read by whatever thread asks.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C's settings are `#define`s.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::entry::Backends;
use super::table::settings_table;
use super::values::{
    AllOr, Bytes, DefaultOr, FileValue, Listen, MaybeAddr, MaybeCount, MaybeParsed, MaybeSecs,
    Mode, OnOffAuto, Parsed, RateSetting, Secs, Size, Stdout, Store, Text, Whole,
};
use super::{show_bytes, Config};
use crate::backend::BackendSpec;
use crate::connections::{OnDown, Removal, SpreadOrder};
use crate::etcd::EtcdSource;
use crate::health::CheckKind;
use crate::kernel_sched::SchedPolicy;
use crate::limiter::{FailurePolicy, Rate, RateLimitAlgorithm, RateLimitReply, MAX_MAX_CLIENTS};
use crate::proxy_protocol::{CidrList, Version};
use crate::scheduler::Algorithm;
use crate::sni::names::MaybeServerNames;
use crate::sni::ServerNames;
use crate::srv::Nameservers;
use crate::tls_term::{CertList, CrlFiles};
use crate::trace::Lang;
use crate::units::{format_duration, format_size, ByteRate, Switch};

/// Where a setting applies once the balancer serves several services.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// One value for the whole process (the pool, the admin API, logs).
    Process,
    /// A value of each service (its listener, backends and data path).
    Service,
}

/// What a reload does with a changed setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reload {
    /// Applied to new connections at once.
    Live,
    /// Kept at its running value until a restart, with a warning.
    Restart,
}

/// One line of the table.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    /// The key, as the config file and `check-config` write it.
    pub key: &'static str,
    /// The long flag, without its `--`.
    pub flag: &'static str,
    /// Process-wide or per service.
    pub scope: Scope,
    /// Live or restart-only.
    pub reload: Reload,
    /// The value as `check-config` prints it; `None` when not listed (a
    /// rate limit's details while it is off).
    pub show: fn(&Config) -> Option<String>,
    /// For a restart-only setting: puts `old`'s value back in `new`, and
    /// says whether they differed.
    keep: fn(&mut Config, &Config) -> bool,
}

/// How a given value is laid into its place in a [`Config`].
macro_rules! lay {
    (set, $slot:expr, $given:expr) => {
        if let Some(v) = $given {
            $slot = v.clone();
        }
    };
    // The setting is off unless given: a given value turns it on.
    (some, $slot:expr, $given:expr) => {
        if let Some(v) = $given {
            $slot = Some(v.clone());
        }
    };
    // Laid by `Overrides::apply` itself (the rate limit and its details).
    (by_hand, $slot:expr, $given:expr) => {};
}

/// The `keep` function of a line: `restart FIELD` compares and restores
/// that field; `restart` alone is kept with another line's field.
macro_rules! keep {
    (restart $($field:ident).+) => {
        |new, old| {
            let differs = new.$($field).+ != old.$($field).+;
            if differs {
                new.$($field).+ = old.$($field).+.clone();
            }
            differs
        }
    };
    (restart) => {
        |_, _| false
    };
    (live) => {
        |_, _| false
    };
}

macro_rules! reload_of {
    (restart) => {
        Reload::Restart
    };
    (live) => {
        Reload::Live
    };
}

/// `always |c| ...` prints a `String`; `when |c| ...` an `Option`.
macro_rules! show {
    (always, $show:expr) => {
        |c| Some(($show)(c))
    };
    (when, $show:expr) => {
        |c| ($show)(c)
    };
}

/// How a key of the file is read: `take` as its [`FileValue`]; `hand`
/// by the file's converter (aliases, the rate limit's `off`).
macro_rules! read {
    (take, $raw:expr, $slot:expr, $ty:ty, $note:ident, $key:expr) => {
        if let Some(v) = $raw.take() {
            $slot = FileValue::<$ty>::given(v);
            $note($key);
        }
    };
    (hand, $raw:expr, $slot:expr, $ty:ty, $note:ident, $key:expr) => {};
}

macro_rules! settings {
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
        /// The settings one source gave (the flags, a config file, the
        /// prompt): `None` means "not given here", so the layer underneath
        /// stays. Field names are the settings' keys.
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        pub struct Overrides {
            $($(#[doc = $doc])* pub $key: Option<$ty>,)*
        }

        impl Overrides {
            /// The keys of the settings given here: to tell which layer
            /// gave a bad value.
            pub fn given(&self) -> Vec<&'static str> {
                let mut keys = Vec::new();
                $(if self.$key.is_some() {
                    keys.push(stringify!($key));
                })*
                keys
            }

            /// These settings with `over`'s laid on top: a service's
            /// own keys over the file's top level.
            pub fn merged(&self, over: &Overrides) -> Overrides {
                Overrides {
                    $($key: over.$key.clone().or_else(|| self.$key.clone()),)*
                }
            }

            /// Lays every setting given here that has a plain place in
            /// `config`; `apply` does the rest.
            pub(super) fn lay(&self, config: &mut Config) {
                $(lay!($how, config.$($place).+, &self.$key);)*
            }
        }

        /// The config file as serde reads it: one field per key, the
        /// file-only keys (aliases, `mode`) included.
        #[derive(Debug, Default, Deserialize)]
        #[serde(deny_unknown_fields, expecting = "an object of settings")]
        pub(super) struct Raw {
            $(pub(super) $key: Option<$file>,)*
            $(pub(super) $alias: Option<$alias_ty>,)*
        }

        impl Raw {
            /// Moves every key read as it is (`take`) into `o`, telling
            /// `note` each one; the keys read by hand stay.
            pub(super) fn lay_plain(
                &mut self,
                o: &mut Overrides,
                mut note: impl FnMut(&'static str),
            ) {
                $(read!($read, self.$key, o.$key, $ty, note, stringify!($key));)*
            }
        }

        /// Gives `service` the process-wide settings of `top` (the
        /// file's top level): a service may not set them itself.
        pub(super) fn adopt_process(service: &mut Config, top: &Config) {
            $(if Scope::$scope == Scope::Process {
                service.$($place).+ = top.$($place).+.clone();
            })*
        }

        /// The table, in `check-config`'s order.
        pub static SETTINGS: &[Setting] = &[$(Setting {
            key: stringify!($key),
            flag: $flag,
            scope: Scope::$scope,
            reload: reload_of!($reload),
            show: show!($shows, $show),
            keep: keep!($reload $($($kept).+)?),
        },)*];
    };
}

/// A file setting as `check-config` prints it: its path, or `none`.
fn path_or_none(path: &Option<std::path::PathBuf>) -> String {
    path.as_ref()
        .map_or_else(|| "none".into(), |p| p.display().to_string())
}

/// `off` for a setting that is not set.
fn or_off<T>(value: Option<T>, show: impl FnOnce(T) -> String) -> String {
    value.map_or_else(|| "off".to_string(), show)
}

settings_table!(settings);

/// The scope of the setting `key`, if it is one.
pub fn scope_of(key: &str) -> Option<Scope> {
    SETTINGS.iter().find(|s| s.key == key).map(|s| s.scope)
}

/// The keys a reload keeps at their running value until a restart.
pub fn restart_only() -> impl Iterator<Item = &'static str> {
    SETTINGS
        .iter()
        .filter(|s| s.reload == Reload::Restart)
        .map(|s| s.key)
}

/// Puts back in `new` the running value (`old`'s) of every restart-only
/// setting, and names those that differed, in the table's order.
pub fn keep_restart_only(new: &mut Config, old: &Config) -> Vec<&'static str> {
    SETTINGS
        .iter()
        .filter(|s| (s.keep)(new, old))
        .map(|s| s.key)
        .collect()
}

/// [`keep_restart_only`] for the settings of one `scope`: the process's
/// at the file's top level, a service's in each service.
pub fn keep_restart_only_in(scope: Scope, new: &mut Config, old: &Config) -> Vec<&'static str> {
    SETTINGS
        .iter()
        .filter(|s| s.scope == scope && (s.keep)(new, old))
        .map(|s| s.key)
        .collect()
}

/// Gives each of `config`'s services its process-wide settings again
/// (after a reload kept some at their running value).
pub fn share_process(config: &mut Config) {
    let top = Config {
        services: Vec::new(),
        ..config.clone()
    };
    for service in &mut config.services {
        adopt_process(service, &top);
    }
}

impl Config {
    /// Every setting with its value, as `(key, value)` in the config
    /// file's keys and the flags' notation (`3s`, `64k`): what `--help`
    /// shows as defaults and what `check-config` prints.
    pub fn describe(&self) -> Vec<(&'static str, String)> {
        SETTINGS
            .iter()
            .filter_map(|s| (s.show)(self).map(|v| (s.key, v)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key table of `docs/operations.md`, row by row: key, flag,
    /// default, reload.
    fn documented() -> Vec<Vec<String>> {
        let doc = include_str!("../../docs/operations.md");
        let table = doc
            .split("| key | flag | default | reload |")
            .nth(1)
            .expect("docs/operations.md has the key table");
        table
            .lines()
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .map(|l| {
                l.split(" | ")
                    .map(|c| c.trim_matches(['|', ' ']).to_string())
                    .collect()
            })
            .collect()
    }

    /// The first code span of a cell, without its JSON quotes.
    fn code(cell: &str) -> String {
        let inner = cell.split('`').nth(1).unwrap_or_default();
        inner.trim_matches('"').to_string()
    }

    /// The documented keys are the table's, in its order, with its flag,
    /// its default and what a reload does: the doc cannot drift.
    #[test]
    fn the_operations_doc_lists_the_table() {
        let rows: Vec<Vec<String>> = documented()
            .into_iter()
            .filter(|r| r[0] != "`mode`")
            .collect();
        let keys: Vec<String> = rows.iter().map(|r| code(&r[0])).collect();
        let table: Vec<&str> = SETTINGS.iter().map(|s| s.key).collect();
        assert_eq!(keys, table, "docs/operations.md's key table");
        let defaults = Config::default().describe();
        for (row, setting) in rows.iter().zip(SETTINGS) {
            let key = setting.key;
            let flag = format!("`--{}`", setting.flag);
            assert!(row[1].contains(&flag), "{key}: flag {flag} in {:?}", row[1]);
            let restart = setting.reload == Reload::Restart;
            assert_eq!(
                row[3].starts_with("restart"),
                restart,
                "{key}: {:?}",
                row[3]
            );
            if key == "backends" {
                continue;
            }
            // A rate limit's details are not listed while it is off.
            if let Some((_, default)) = defaults.iter().find(|(k, _)| *k == key) {
                assert_eq!(code(&row[2]), *default, "{key}: the default");
            }
        }
    }

    #[test]
    fn keys_and_flags_are_written_once() {
        for (i, s) in SETTINGS.iter().enumerate() {
            assert!(
                SETTINGS[i + 1..]
                    .iter()
                    .all(|t| t.key != s.key && t.flag != s.flag),
                "{}",
                s.key
            );
        }
        assert!(restart_only().any(|k| k == "workers"));
        assert!(!restart_only().any(|k| k == "connect_timeout"));
    }

    /// `tcp_user_timeout`: one line of the table gives its flag, its key,
    /// its listing and its reload; off by default, refused over 2^32 ms.
    #[test]
    fn tcp_user_timeout_comes_from_its_line() {
        use crate::cli::parse_from;
        let c = parse_from(["rodizio", "--tcp-user-timeout", "30s"]).unwrap();
        let config = c.balancer.to_config().unwrap();
        assert_eq!(config.proxy.tcp_user_timeout, Some(Duration::from_secs(30)));
        let get = |c: &Config, key: &str| {
            let d = c.describe();
            d.into_iter().find(|(k, _)| *k == key).unwrap().1
        };
        assert_eq!(get(&config, "tcp_user_timeout"), "30s");
        assert_eq!(get(&Config::default(), "tcp_user_timeout"), "off");
        let path = std::path::Path::new("t.json");
        let file = super::super::file::parse(path, r#"{"tcp_user_timeout": "1500ms"}"#).unwrap();
        let from_file = file.settle(&Overrides::default()).unwrap();
        assert_eq!(
            from_file.proxy.tcp_user_timeout,
            Some(Duration::from_millis(1500))
        );
        let off = super::super::file::parse(path, r#"{"tcp_user_timeout": "off"}"#).unwrap();
        let off = off.settle(&Overrides::default()).unwrap();
        assert_eq!(off.proxy.tcp_user_timeout, None);
        assert!(!restart_only().any(|k| k == "tcp_user_timeout"));
        let c = parse_from(["rodizio", "--tcp-user-timeout", "1200h"]).unwrap();
        let err = c.balancer.to_config().and_then(|c| {
            c.validate_settings()?;
            Ok(c)
        });
        let err = err.unwrap_err().worded_as_flag().to_string();
        assert!(err.contains("--tcp-user-timeout must be at most"), "{err}");
    }

    /// The README's flag table has a row for every flag of the table.
    #[test]
    fn the_readme_lists_every_flag() {
        let readme = include_str!("../../README.md");
        let rows: Vec<&str> = readme.lines().filter(|l| l.starts_with("| `-")).collect();
        for s in SETTINGS {
            let flag = format!("--{}", s.flag);
            let listed = rows.iter().any(|row| {
                let cell = row.split(" | ").next().unwrap_or_default();
                cell.match_indices(&flag).any(|(at, _)| {
                    let next = cell[at + flag.len()..].chars().next();
                    !next.is_some_and(|c| c.is_ascii_lowercase() || c == '-')
                })
            });
            assert!(listed, "README.md's flag table has no row for {flag}");
        }
    }

    /// The pool, the admin API, the logs and the shared store are the
    /// process's; a service's listener, backends and data path are its own.
    #[test]
    fn scopes_split_the_process_from_a_service() {
        let scope = |key: &str| SETTINGS.iter().find(|s| s.key == key).unwrap().scope;
        for key in [
            "workers",
            "worker_idle_timeout",
            "backlog",
            "sched_policy",
            "admin_listen",
            "admin_token_file",
            "access_log_file",
            "rate_limit_store",
            "drain_timeout",
            "user",
            "group",
            "allow_root",
        ] {
            assert_eq!(scope(key), Scope::Process, "{key}");
        }
        for key in [
            "listen",
            "backends",
            "algorithm",
            "connect_timeout",
            "tcp_user_timeout",
            "health_check",
            "rate_limit",
            "accept_proxy",
        ] {
            assert_eq!(scope(key), Scope::Service, "{key}");
        }
    }
}
