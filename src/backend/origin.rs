//! Where a backend came from: the configuration (`file`: the file or the
//! flags), the admin API (`api`), a host name looked up (`dns`), a DNS SRV
//! record (`srv`) or an etcd key (`etcd`). Shown by `/backends`, the stats
//! page and `check-config`; the metrics count each source's lookups and
//! errors.
//!
//! # Threads
//!
//! Fixed when the backend is made; read by anyone.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C's servers are typed in at start-up.

use std::sync::Arc;

use super::Backend;

impl Backend {
    /// The same backend, one of those `name` gives (a `srv:` name, an
    /// etcd prefix): the resolver follows that name's backends by it.
    pub fn with_source(mut self, origin: Origin, name: &str) -> Backend {
        self.origin = origin;
        self.source_name = Some(Arc::from(name));
        self
    }

    /// The `srv:` name (or etcd prefix) that gave it, if any.
    pub fn source_name(&self) -> Option<&str> {
        self.source_name.as_deref()
    }
}

/// Where a backend came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Origin {
    /// The configuration: the file, or the command line's flags.
    #[default]
    File,
    /// `POST /backends`.
    Api,
    /// The configuration, by a host name looked up (again at
    /// `resolve_interval`).
    Dns,
    /// One record of a `srv:` name.
    Srv,
    /// A key under a service's `backends_from` etcd prefix.
    Etcd,
}

impl Origin {
    /// Every origin, in the order the metrics list them.
    pub const ALL: [Origin; 5] = [
        Origin::File,
        Origin::Api,
        Origin::Dns,
        Origin::Srv,
        Origin::Etcd,
    ];

    /// Its word: `file`, `api`, `dns`, `srv`, `etcd`.
    pub fn name(self) -> &'static str {
        match self {
            Origin::File => "file",
            Origin::Api => "api",
            Origin::Dns => "dns",
            Origin::Srv => "srv",
            Origin::Etcd => "etcd",
        }
    }
}
