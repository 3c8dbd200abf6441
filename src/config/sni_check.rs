//! What a configuration with SNI routing must say: an address is shared
//! only by services that all claim server names, with at most one default
//! among them and no name claimed twice (unless `server_alpn` tells the
//! claims apart); and which service binds a shared address (the first one
//! listing it).
//!
//! # Threads
//!
//! Pure functions, on the thread that reads the configuration.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.
//!
//! The settings themselves are `sni`'s ([`crate::sni::SniConfig`]); their
//! rules sit here, with the [`Config`] they read, so that `sni` needs
//! nothing of `config` above it.

use std::net::SocketAddr;

use super::Config;
use crate::error::{Error, Result};

/// Checks one service's SNI settings against its others.
///
/// # Errors
///
/// [`Error::InvalidSetting`] naming the setting.
pub fn service(config: &Config) -> Result<()> {
    let sni = &config.sni;
    if sni.timeout.is_zero() {
        return Err(Error::setting("sni_timeout", "must be more than 0"));
    }
    if sni.server_names.is_none() {
        if !sni.alpn.0.is_empty() {
            return Err(Error::setting(
                "server_alpn",
                format!(
                    "service `{}` needs `server_names`: the protocols choose among the \
                     services of a name",
                    config.name
                ),
            ));
        }
        if sni.default {
            return Err(Error::setting(
                "sni_default",
                format!(
                    "service `{}` needs `server_names` to be the default of an address",
                    config.name
                ),
            ));
        }
        return Ok(());
    }
    if config.accept_proxy {
        return Err(Error::setting(
            "server_names",
            format!(
                "service `{}`: SNI routing and `accept_proxy` cannot be combined yet",
                config.name
            ),
        ));
    }
    if config.max_connections.is_some() {
        return Err(Error::setting(
            "server_names",
            format!(
                "service `{}`: SNI routing and `max_connections` cannot be combined yet",
                config.name
            ),
        ));
    }
    Ok(())
}

/// Whether services `a` and `b` may listen on one address: both claim
/// server names, so each client can be told apart.
pub fn may_share(a: &Config, b: &Config) -> bool {
    a.sni.server_names.is_some() && b.sni.server_names.is_some()
}

/// Checks that each shared address has at most one default service.
///
/// # Errors
///
/// [`Error::InvalidSetting`] on `sni_default`, naming both services.
pub fn defaults(services: &[&Config]) -> Result<()> {
    for (i, s) in services.iter().enumerate() {
        if !s.sni.default {
            continue;
        }
        for addr in s.listen_addrs() {
            let other = services[i + 1..]
                .iter()
                .find(|o| o.sni.default && o.listen_addrs().contains(&addr));
            if let Some(o) = other {
                return Err(Error::setting(
                    "sni_default",
                    format!(
                        "services `{}` and `{}` are both the default of {addr}: \
                         an address has at most one",
                        s.name, o.name
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Checks that no server name is claimed by two services on one address:
/// the router would send every client of it to one of them, and the
/// other's entry would do nothing. Two services may claim one name when
/// `server_alpn` tells them apart: one lists protocols and the other none,
/// or both list protocols and none in common.
///
/// # Errors
///
/// [`Error::InvalidSetting`] on `server_names` (or `server_alpn`, when
/// both list one protocol), naming both services.
pub fn names_once(services: &[&Config]) -> Result<()> {
    for (i, s) in services.iter().enumerate() {
        let Some(names) = &s.sni.server_names else {
            continue;
        };
        for o in &services[i + 1..] {
            let Some(theirs) = &o.sni.server_names else {
                continue;
            };
            // Port 0 is never shared: each service's is its own.
            let shared = s
                .listen_addrs()
                .into_iter()
                .find(|a| a.port() != 0 && o.listen_addrs().contains(a));
            let twice = names.names().iter().find(|n| theirs.names().contains(n));
            let (Some(addr), Some(name)) = (shared, twice) else {
                continue;
            };
            let (mine, other) = (&s.sni.alpn.0, &o.sni.alpn.0);
            if mine.is_empty() && other.is_empty() {
                return Err(Error::setting(
                    "server_names",
                    format!(
                        "services `{}` and `{}` both claim `{name}` on {addr}: \
                         a name goes to one service of an address (or, with \
                         `server_alpn`, to one per protocol)",
                        s.name, o.name
                    ),
                ));
            }
            if let Some(protocol) = mine.iter().find(|p| other.contains(p)) {
                return Err(Error::setting(
                    "server_alpn",
                    format!(
                        "services `{}` and `{}` both claim `{name}` for `{protocol}` on \
                         {addr}: a name and a protocol go to one service of an address",
                        s.name, o.name
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The addresses of `services[i]` that an earlier service binds (it
/// shares them, by SNI): the service does not bind them again.
pub fn bound_before(services: &[&Config], i: usize) -> Vec<SocketAddr> {
    let earlier = &services[..i.min(services.len())];
    services
        .get(i)
        .map(|s| s.listen_addrs())
        .unwrap_or_default()
        .into_iter()
        // Port 0 is "any free port": each service gets its own.
        .filter(|a| a.port() != 0 && earlier.iter().any(|e| e.listen_addrs().contains(a)))
        .collect()
}

/// Each address routed by SNI, with the names of the services on it
/// (sorted), in the order of the addresses' text.
fn routing(config: &Config) -> Vec<(SocketAddr, Vec<&str>)> {
    let mut out: Vec<(SocketAddr, Vec<&str>)> = Vec::new();
    for s in config.service_list() {
        if s.sni.server_names.is_none() {
            continue;
        }
        for addr in s.listen_addrs() {
            // Port 0 is never shared: each service's is its own.
            match out.iter_mut().find(|(a, _)| *a == addr && addr.port() != 0) {
                Some((_, names)) => names.push(&s.name),
                None => out.push((addr, vec![&s.name])),
            }
        }
    }
    for (_, names) in &mut out {
        names.sort_unstable();
    }
    out.sort_by_key(|(a, _)| a.to_string());
    out
}

/// Checks that a reload from `old` to `new` keeps the services routed by
/// SNI on each address: who binds a shared address and which router
/// serves it are fixed at start-up.
///
/// # Errors
///
/// [`Error::InvalidSetting`] on `server_names`, naming the address.
pub fn same_routing(old: &Config, new: &Config) -> Result<()> {
    let (was, now) = (routing(old), routing(new));
    if was == now {
        return Ok(());
    }
    // The first address whose services differ (there is one).
    let Some(addr) = was
        .iter()
        .chain(&now)
        .find(|entry| !was.contains(entry) || !now.contains(entry))
        .map(|(a, _)| *a)
    else {
        return Ok(());
    };
    let on = |r: &[(SocketAddr, Vec<&str>)]| {
        r.iter()
            .find(|(a, _)| *a == addr)
            .map_or_else(|| "none".to_string(), |(_, n)| n.join(", "))
    };
    Err(Error::setting(
        "server_names",
        format!(
            "the services routed by SNI on {addr} would change (from {} to {}): \
             that takes a restart; the running settings are kept",
            on(&was),
            on(&now)
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(name: &str, listen: &str, names: Option<&str>, default: bool) -> Config {
        let mut c = Config {
            name: name.into(),
            listen: listen.parse().unwrap(),
            backends: vec![crate::backend::BackendSpec::parse("127.0.0.1:1").unwrap()],
            ..Config::default()
        };
        c.sni.server_names = names.map(|n| n.parse().unwrap());
        c.sni.default = default;
        c
    }

    fn all(services: Vec<Config>) -> Config {
        Config {
            services,
            ..Config::default()
        }
    }

    #[test]
    fn an_address_is_shared_only_by_services_with_names() {
        let ok = all(vec![
            service("a", "127.0.0.1:9443", Some("a.test"), false),
            service("b", "127.0.0.1:9443", Some("b.test"), true),
        ]);
        ok.validate().unwrap();
        let list = ok.service_list();
        assert!(bound_before(&list, 0).is_empty());
        assert_eq!(
            bound_before(&list, 1),
            vec!["127.0.0.1:9443".parse().unwrap()]
        );
        let half = all(vec![
            service("a", "127.0.0.1:9443", Some("a.test"), false),
            service("b", "127.0.0.1:9443", None, false),
        ]);
        let err = half.validate().unwrap_err().to_string();
        assert!(err.contains("server_names"), "{err}");
        // A wildcard address and a specific one on the same port cannot
        // be bound both, names or not.
        let wild = all(vec![
            service("a", "127.0.0.1:9443", Some("a.test"), false),
            service("b", "0.0.0.0:9443", Some("b.test"), false),
        ]);
        assert!(wild.validate().is_err());
    }

    #[test]
    fn a_reload_keeps_who_shares_an_address() {
        let two = all(vec![
            service("a", "127.0.0.1:9443", Some("a.test"), false),
            service("b", "127.0.0.1:9443", Some("b.test"), false),
        ]);
        let mut renamed = two.clone();
        renamed.services[1].sni.server_names = Some("c.test".parse().unwrap());
        same_routing(&two, &renamed).unwrap();
        let mut three = two.clone();
        three
            .services
            .push(service("c", "127.0.0.1:9443", Some("c.test"), false));
        let err = same_routing(&two, &three).unwrap_err().to_string();
        assert!(
            err.contains("on 127.0.0.1:9443 would change (from a, b to a, b, c)"),
            "{err}"
        );
        // Port 0 (any free port) is never shared.
        let free = all(vec![
            service("a", "127.0.0.1:0", Some("a.test"), false),
            service("b", "127.0.0.1:0", Some("b.test"), true),
        ]);
        free.validate().unwrap();
        assert!(bound_before(&free.service_list(), 1).is_empty());
        let one = all(vec![service("a", "127.0.0.1:9443", Some("a.test"), false)]);
        assert!(same_routing(&two, &one).is_err());
    }

    #[test]
    fn one_default_per_address_and_no_default_without_names() {
        let two = all(vec![
            service("a", "127.0.0.1:9443", Some("a.test"), true),
            service("b", "127.0.0.1:9443", Some("b.test"), true),
        ]);
        let err = two.validate().unwrap_err().to_string();
        assert!(err.contains("both the default of 127.0.0.1:9443"), "{err}");
        let twice = all(vec![
            service("a", "127.0.0.1:9443", Some("a.test"), false),
            service("b", "127.0.0.1:9443", Some("b.test,A.test"), false),
        ]);
        let err = twice.validate().unwrap_err().to_string();
        assert!(
            err.contains("services `a` and `b` both claim `a.test` on 127.0.0.1:9443"),
            "{err}"
        );
        // On addresses of their own, one name is two services' to claim.
        let apart = all(vec![
            service("a", "127.0.0.1:9443", Some("a.test"), false),
            service("b", "127.0.0.1:9444", Some("a.test"), false),
        ]);
        apart.validate().unwrap();
        let bare = service("a", "127.0.0.1:9443", None, true);
        let err = bare.validate().unwrap_err().to_string();
        assert!(err.contains("needs `server_names`"), "{err}");
        let mut proxied = service("a", "127.0.0.1:9443", Some("a.test"), false);
        proxied.accept_proxy = true;
        assert!(proxied.validate().is_err());
        let mut zero = service("a", "127.0.0.1:9443", Some("a.test"), false);
        zero.sni.timeout = std::time::Duration::ZERO;
        assert!(zero.validate().is_err());
    }

    /// `service` with `server_alpn` set to `alpn`.
    fn with_alpn(name: &str, names: &str, alpn: &str) -> Config {
        let mut c = service(name, "127.0.0.1:9443", Some(names), false);
        c.sni.alpn = alpn.parse().unwrap();
        c
    }

    #[test]
    fn one_name_is_shared_only_by_services_told_apart_by_alpn() {
        // One with protocols and one without; two with protocols apart.
        all(vec![
            with_alpn("a", "a.test", "h2"),
            with_alpn("b", "a.test", "off"),
            with_alpn("c", "a.test,c.test", "imap,pop3"),
        ])
        .validate()
        .unwrap();
        let both_bare = all(vec![
            with_alpn("a", "a.test", "h2"),
            with_alpn("b", "a.test", "off"),
            with_alpn("c", "c.test,a.test", ""),
        ]);
        let err = both_bare.validate().unwrap_err().to_string();
        assert!(
            err.contains("services `b` and `c` both claim `a.test` on 127.0.0.1:9443"),
            "{err}"
        );
        let overlap = all(vec![
            with_alpn("a", "a.test", "h2,http/1.1"),
            with_alpn("b", "A.test", "http/1.1"),
        ]);
        let err = overlap.validate().unwrap_err().to_string();
        assert!(err.contains("server_alpn"), "{err}");
        assert!(
            err.contains("services `a` and `b` both claim `a.test` for `http/1.1` on"),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
        // server_alpn without server_names does nothing: refused.
        let mut bare = service("a", "127.0.0.1:9443", None, false);
        bare.sni.alpn = "h2".parse().unwrap();
        let err = bare.validate().unwrap_err().to_string();
        assert!(err.contains("server_alpn"), "{err}");
        assert!(err.contains("needs `server_names`"), "{err}");
    }
}
