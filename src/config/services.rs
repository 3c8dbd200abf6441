//! Several services in one process: the checks that span them (names,
//! listening addresses) and the view of a one-service configuration as a
//! list.
//!
//! A service is a whole [`Config`]: its per-service settings laid over
//! the file's top level, its process-wide ones copied from the top
//! (`settings::adopt_process`). The seed's flat file, the flags and the
//! prompt describe one service, named [`DEFAULT_NAME`].
//!
//! Pure functions, run on the thread that reads the configuration.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C serves one port.

use std::net::SocketAddr;

use super::Config;
use crate::error::{Error, Result};

/// The name of the one service of a configuration without `services`.
pub use crate::access_log::DEFAULT_SERVICE as DEFAULT_NAME;

/// Longest service name: it is a URL path segment and a metric label.
pub const MAX_NAME: usize = 64;

impl Config {
    /// Whether this service has a source of backends: its own list, or an
    /// etcd prefix to follow (`backends_from`), which may start empty and
    /// fill once etcd answers. The one place that decides whether a
    /// service without a `backends` list is whole.
    pub fn names_backends(&self) -> bool {
        !self.backends.is_empty() || self.proxy.backends_from.is_some()
    }

    /// The CA file an `etcds://` source of this service reads, if it
    /// names one (the root reader may read it on a reload).
    pub fn etcd_ca(&self) -> Option<std::path::PathBuf> {
        let tls = self.proxy.backends_from.as_ref()?.tls.as_ref()?;
        tls.ca.clone()
    }

    /// The services this configuration runs: its `services`, or itself
    /// as the one service.
    pub fn service_list(&self) -> Vec<&Config> {
        if self.services.is_empty() {
            vec![self]
        } else {
            self.services.iter().collect()
        }
    }

    /// The settings accepted that do nothing as they are, one line a
    /// service, for `check-config` and the start-up log: a weight with an
    /// algorithm that reads none. Warned, not refused: the algorithm is
    /// live on reload, and the weights count once it reads them.
    pub fn unused_warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        for s in self.service_list() {
            if s.algorithm.reads_weights() {
                continue;
            }
            let weighted: Vec<String> = s
                .backends
                .iter()
                .filter(|b| b.weight != 1)
                .map(|b| format!("{},weight={}", b.name(), b.weight))
                .collect();
            if let Some(first) = weighted.first() {
                out.push(format!(
                    "service `{}`: `weight` does nothing with `algorithm` {} ({first}{}): \
                     every backend gets the same share; weighted-round-robin gives shares \
                     by weight",
                    s.name,
                    s.algorithm,
                    if weighted.len() > 1 { ", ..." } else { "" }
                ));
            }
        }
        out
    }

    /// Every address this service accepts clients on.
    pub fn listen_addrs(&self) -> Vec<SocketAddr> {
        let mut all = vec![self.listen];
        all.extend(&self.listen_also);
        all
    }

    /// Checks what spans services: each name well formed and used once,
    /// each listening address used once (in a service or across them).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSetting`] on `services` (or `listen`), naming the
    /// service.
    pub fn validate_services(&self) -> Result<()> {
        let mut names: Vec<&str> = Vec::new();
        let mut addrs: Vec<(SocketAddr, &Config)> = Vec::new();
        for service in self.service_list() {
            check_name(&service.name)?;
            if names.contains(&service.name.as_str()) {
                return Err(Error::setting(
                    "services",
                    format!(
                        "the name `{}` is given twice: names are unique",
                        service.name
                    ),
                ));
            }
            names.push(&service.name);
            super::sni_check::service(service)?;
            for addr in service.listen_addrs() {
                let taken = addrs.iter().find(|(a, _)| same_port(*a, addr));
                if let Some((a, other)) = taken {
                    if *a == addr
                        && other.name != service.name
                        && super::sni_check::may_share(other, service)
                    {
                        // Shared by SNI: one service binds it.
                        continue;
                    }
                    let whose = if other.name == service.name {
                        format!("service `{}` lists it twice", other.name)
                    } else {
                        format!(
                            "services `{}` and `{}` both listen there",
                            other.name, service.name
                        )
                    };
                    return Err(Error::setting(
                        "listen",
                        format!(
                            "{addr} is used twice: {whose}; give each its own address \
                             (or, to route TLS clients by name, server_names to each)"
                        ),
                    ));
                }
                addrs.push((addr, service));
            }
        }
        super::sni_check::defaults(&self.service_list())?;
        super::sni_check::names_once(&self.service_list())
    }
}

/// Two addresses that cannot both be bound: equal, or on one port where
/// one is the wildcard of the same family.
fn same_port(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port()
        && a.port() != 0
        && a.is_ipv4() == b.is_ipv4()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// A service name: 1 to [`MAX_NAME`] of `A-Z a-z 0-9 _ . -`, so it can be
/// a path segment, a metric label and a log word as it is.
///
/// # Errors
///
/// [`Error::InvalidSetting`] on `services` saying what is wrong.
pub fn check_name(name: &str) -> Result<()> {
    let fine = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    if name.is_empty() || name.len() > MAX_NAME || !name.chars().all(fine) {
        return Err(Error::setting(
            "services",
            format!(
                "`{}` is not a service name: use 1 to {MAX_NAME} letters, digits, \
                 `_`, `.` or `-` (it appears in the admin API's paths and in metrics)",
                shown(name)
            ),
        ));
    }
    Ok(())
}

/// A name as an error message shows it: at most `MAX_NAME` (64) characters,
/// then `…`, with control characters escaped.
pub fn shown(name: &str) -> String {
    let mut out: String = name
        .chars()
        .take(MAX_NAME)
        .flat_map(char::escape_debug)
        .collect();
    if name.chars().count() > MAX_NAME {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(name: &str, listen: &str) -> Config {
        Config {
            name: name.into(),
            listen: listen.parse().unwrap(),
            ..Config::default()
        }
    }

    #[test]
    fn a_flat_configuration_is_one_service_named_default() {
        let c = Config::default();
        let list = c.service_list();
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].name, "default");
        c.validate_services().unwrap();
    }

    #[test]
    fn a_weight_the_algorithm_does_not_read_is_warned_of() {
        let mut c = Config {
            backends: [
                "127.0.0.1:1,weight=3",
                "127.0.0.1:2",
                "127.0.0.1:3,weight=2",
            ]
            .iter()
            .map(|b| crate::backend::BackendSpec::parse(b).unwrap())
            .collect(),
            ..Config::default()
        };
        assert_eq!(
            c.unused_warnings(),
            [
                "service `default`: `weight` does nothing with `algorithm` round-robin \
              (127.0.0.1:1,weight=3, ...): every backend gets the same share; \
              weighted-round-robin gives shares by weight"
            ]
        );
        c.algorithm = crate::scheduler::Algorithm::WeightedRoundRobin;
        assert!(c.unused_warnings().is_empty());
        c.algorithm = crate::scheduler::Algorithm::First;
        assert_eq!(c.unused_warnings().len(), 1);
    }

    #[test]
    fn names_are_unique_and_well_formed() {
        let mut c = Config {
            services: vec![service("web", "127.0.0.1:1"), service("web", "127.0.0.1:2")],
            ..Config::default()
        };
        let err = c.validate_services().unwrap_err().to_string();
        assert!(err.contains("`web` is given twice"), "{err}");
        for bad in ["", "a b", "é", "x/y", &"n".repeat(65)] {
            c.services = vec![service(bad, "127.0.0.1:1")];
            let err = c.validate_services().unwrap_err().to_string();
            assert!(err.contains("is not a service name"), "{bad:?}: {err}");
        }
        c.services = vec![service("web-1.a_b", "127.0.0.1:1")];
        c.validate_services().unwrap();
    }

    #[test]
    fn two_services_may_not_share_an_address() {
        let mut c = Config {
            services: vec![service("a", "127.0.0.1:9000"), service("b", "0.0.0.0:9000")],
            ..Config::default()
        };
        let err = c.validate_services().unwrap_err().to_string();
        assert!(
            err.contains("services `a` and `b` both listen there"),
            "{err}"
        );
        let mut one = service("a", "127.0.0.1:9000");
        one.listen_also = vec!["127.0.0.1:9000".parse().unwrap()];
        c.services = vec![one];
        let err = c.validate_services().unwrap_err().to_string();
        assert!(err.contains("lists it twice"), "{err}");
        // Other ports, other families, and port 0 (any free port) are fine.
        c.services = vec![
            service("a", "127.0.0.1:9000"),
            service("b", "[::1]:9000"),
            service("c", "127.0.0.1:0"),
            service("d", "127.0.0.1:0"),
        ];
        c.validate_services().unwrap();
    }
}
