//! A backend as the user wrote it, [`BackendSpec`]: `HOST:PORT` and its
//! options, parsed, resolved and written back.
//!
//! Plain values: parsed at start-up, on a reload or by the admin API, on
//! the thread that reads the text; no worker parses a backend.
//!
//! # Corresponds to the C article
//!
//! `servers_entry()` reads each server's address and port; the options
//! after the port have no C counterpart.

use std::fmt;
use std::io::ErrorKind;
use std::net::SocketAddr;

use super::own_check::OwnCheck;
use super::{cap, standby};
use crate::error::{Error, Result};
use crate::lookup;
use crate::proxy_protocol::Version;

/// A backend as the user wrote it: `HOST:PORT` with optional `,weight=N`,
/// `,max_connections=N`, `,send-proxy` / `,send-proxy-v2`, `,backup` and
/// its own check's options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendSpec {
    /// The host name or address, as typed (`localhost`, `127.0.0.1`, `::1`).
    pub host: String,
    /// The TCP port, 1..=65535.
    pub port: u16,
    /// The relative weight for weighted algorithms; 1 unless given.
    pub weight: u32,
    /// Send this backend a PROXY protocol header before the client's bytes
    /// (`,send-proxy` is version 1, `,send-proxy-v2` version 2); `None`
    /// unless given, and then the balancer-wide `send_proxy` applies.
    pub send_proxy: Option<Version>,
    /// Its own check (`,check_port=N`, `,check_address=IP`, `,rise=N`,
    /// ...): empty unless given, and then the service's settings apply.
    pub check: OwnCheck,
    /// Most connections to it at once (`,max_connections=N`, HAProxy's
    /// server `maxconn`); `None` unless given: no cap.
    pub max_connections: Option<usize>,
    /// Served only while no other backend (a primary) is available
    /// (`,backup`; HAProxy's and nginx's `backup`). False unless given.
    pub backup: bool,
    /// Its own `on_backend_down` and `on_backend_removed`
    /// (`,on_backend_down=close`); the service's unless given.
    pub ends: crate::connections::Own,
}

impl BackendSpec {
    /// Where each backend of `list` comes from, for `check-config`:
    /// `127.0.0.1:8001 file, db.internal:5432 dns`.
    pub fn origins(list: &[BackendSpec]) -> String {
        let each: Vec<String> = list
            .iter()
            .map(|b| format!("{} {}", b.name(), b.origin().name()))
            .collect();
        each.join(", ")
    }

    /// Whether it is a `srv:` name: one backend per record, made by the
    /// service (and the resolver thread), never by [`Backend::from_spec`](super::Backend::from_spec).
    pub fn is_srv(&self) -> bool {
        self.host.starts_with(SRV_PREFIX)
    }

    /// The backend of one record of this `srv:` entry: its target and
    /// port, its weight (1..1000), a backup when its priority is not the
    /// best one; the entry's other options kept.
    pub fn for_record(&self, target: &str, port: u16, weight: u16, backup: bool) -> BackendSpec {
        BackendSpec {
            host: target.to_string(),
            port,
            weight: u32::from(weight).clamp(1, 1000),
            backup: backup || self.backup,
            ..self.clone()
        }
    }

    /// Where a backend made from it comes from, as far as the
    /// configuration tells: a host name is `dns`, an address `file`.
    pub fn origin(&self) -> super::Origin {
        if self.is_srv() {
            super::Origin::Srv
        } else if self.host.parse::<std::net::IpAddr>().is_ok() {
            super::Origin::File
        } else {
            super::Origin::Dns
        }
    }

    /// Parses `HOST:PORT[,weight=N][,max_connections=N][,send-proxy|,send-proxy-v2][,backup]`; IPv6
    /// addresses go in brackets (`[::1]:8001`). The option names are
    /// HAProxy's `server` keywords.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidBackend`] naming what is wrong.
    pub fn parse(text: &str) -> Result<BackendSpec> {
        let text = text.trim();
        if let Some(rest) = text.strip_prefix(SRV_PREFIX) {
            return parse_srv(text, rest);
        }
        let mut parts = text.split(',');
        let hostport = parts.next().unwrap_or_default();
        let (host, port) = split_host_port(hostport).ok_or_else(|| {
            let example = match hostport.rsplit_once(':') {
                // An IPv6 literal without brackets.
                Some((ip, port)) if ip.contains(':') => format!("[{ip}]:{port}"),
                _ => "127.0.0.1:8001".to_string(),
            };
            Error::InvalidBackend(format!("'{text}': expected HOST:PORT, e.g. {example}"))
        })?;
        if !host.is_empty()
            && host.chars().all(|c| c.is_ascii_digit() || c == '.')
            && host.parse::<std::net::Ipv4Addr>().is_err()
        {
            // getaddrinfo would take `3` for 0.0.0.3 and `10.1` for
            // 10.0.0.1: almost surely not what was meant.
            return Err(Error::InvalidBackend(format!(
                "'{text}': '{host}' is not an IPv4 address (four numbers, e.g. 127.0.0.1:8001)"
            )));
        }
        let port = parse_port(port)
            .ok_or_else(|| Error::InvalidBackend(format!("'{text}': port must be 1..65535")))?;
        let options = Options::parse(text, parts)?;
        if host.is_empty() {
            return Err(Error::InvalidBackend(format!(
                "'{text}': the host is empty"
            )));
        }
        Ok(options.spec(host.to_string(), port))
    }

    /// Resolves the host name into socket addresses, IPv4 first (see
    /// [`lookup::addresses`]; a backend keeps [`lookup::MAX_ADDRESSES`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidBackend`] when the name does not resolve.
    pub fn resolve(&self) -> Result<Vec<SocketAddr>> {
        if self.is_srv() {
            // Its records are looked up by the service that holds it, on
            // its `resolvers`.
            return Ok(Vec::new());
        }
        match lookup::addresses(&self.host, self.port) {
            Ok(addrs) => Ok(addrs),
            Err(e) if e.kind() == ErrorKind::NotFound => Err(Error::InvalidBackend(format!(
                "'{}' resolves to no address",
                self.name()
            ))),
            Err(e) => Err(Error::InvalidBackend(format!("'{}': {e}", self.name()))),
        }
    }

    /// The `HOST:PORT` form used in logs (brackets around IPv6 literals).
    pub fn name(&self) -> String {
        if self.is_srv() {
            self.host.clone()
        } else if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// How a DNS SRV name is written among the backends.
pub const SRV_PREFIX: &str = "srv:";

/// `srv:_service._proto.name[,options]`: the name checked (letters,
/// digits, `.`, `-`, `_`; at most 253), the options as a backend's.
fn parse_srv(text: &str, rest: &str) -> Result<BackendSpec> {
    let mut parts = rest.split(',');
    let name = parts.next().unwrap_or_default().trim();
    let good = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_');
    if name.is_empty() || name.len() > 253 || !name.chars().all(good) {
        return Err(Error::InvalidBackend(format!(
            "'{text}': expected srv:_service._proto.name, e.g. srv:_http._tcp.example.com"
        )));
    }
    let options = Options::parse(text, parts)?;
    Ok(options.spec(format!("{SRV_PREFIX}{name}"), 0))
}

impl fmt::Display for BackendSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())?;
        if self.weight != 1 {
            write!(f, ",weight={}", self.weight)?;
        }
        if let Some(n) = self.max_connections {
            write!(f, ",max_connections={n}")?;
        }
        match self.send_proxy {
            None => {}
            Some(Version::V1) => f.write_str(",send-proxy")?,
            Some(Version::V2) => f.write_str(",send-proxy-v2")?,
        }
        if self.backup {
            f.write_str(",backup")?;
        }
        write!(f, "{}{}", self.ends, self.check)
    }
}

/// Splits `host:port`, `[v6]:port`; returns `None` when there is no port.
fn split_host_port(text: &str) -> Option<(&str, &str)> {
    if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = after.strip_prefix(':')?;
        Some((host, port))
    } else {
        let (host, port) = text.rsplit_once(':')?;
        if host.contains(':') {
            // An IPv6 literal without brackets: ambiguous, refuse it.
            return None;
        }
        Some((host, port))
    }
}

/// Parses a TCP port, refusing 0 and anything above 65535.
pub(crate) fn parse_port(text: &str) -> Option<u16> {
    text.trim().parse::<u16>().ok().filter(|p| *p != 0)
}

/// The options a backend takes after `HOST:PORT`, as written (its own
/// check's are [`super::own_check::KEYS`], `=VALUE` each): the parser's
/// error and `--help` name them.
pub const OPTIONS: [&str; 7] = [
    "weight=N",
    "max_connections=N",
    "send-proxy",
    "send-proxy-v2",
    "backup",
    "on_backend_down=keep|close",
    "on_backend_removed=drain|close",
];

/// `--help`'s text for `-b/--backend`: every option of [`OPTIONS`] and
/// of a backend's own check, as the parser reads them.
pub fn help() -> String {
    let check: Vec<String> = super::own_check::KEYS
        .iter()
        .map(|k| {
            let value = match *k {
                "check_port" | "rise" | "fall" => "N",
                "check_address" => "IP",
                "health_check" => "KIND",
                "health_path" => "PATH",
                "health_interval" => "DUR",
                _ => "VALUE",
            };
            format!(",{k}={value}")
        })
        .collect();
    let own: Vec<String> = OPTIONS.iter().map(|o| format!(",{o}")).collect();
    format!(
        "A backend as HOST:PORT[,OPTION...]; repeat for more. Without any, rodizio asks for \
         them as the article's program does.\n\n\
         Options, after commas: {}; its own check: {}. weight is 1 to 1000 (round-robin and \
         first read no weight); a backup is served only while no other backend is \
         available. IPv6 in brackets: -b [::1]:8001,weight=2,backup.",
        own.join(" "),
        check.join(" ")
    )
}

/// The options after `HOST:PORT`, each at most once where that matters.
struct Options {
    weight: u32,
    send_proxy: Option<Version>,
    check: OwnCheck,
    max_connections: Option<usize>,
    backup: bool,
    ends: crate::connections::Own,
}

impl Options {
    /// The backend at `host:port` with these options.
    fn spec(self, host: String, port: u16) -> BackendSpec {
        BackendSpec {
            host,
            port,
            weight: self.weight,
            send_proxy: self.send_proxy,
            check: self.check,
            max_connections: self.max_connections,
            backup: self.backup,
            ends: self.ends,
        }
    }

    /// Reads the comma-separated options of the backend `text`.
    fn parse<'a>(text: &str, parts: impl Iterator<Item = &'a str>) -> Result<Options> {
        let mut weight = 1;
        let mut send_proxy = None;
        let mut check = OwnCheck::default();
        let mut max_connections = None;
        let mut backup = false;
        let mut ends = crate::connections::Own::default();
        for option in parts {
            if standby::backup_option(text, option, &mut backup)? {
                continue;
            }
            let version = match option.trim() {
                "send-proxy" => Some(Version::V1),
                "send-proxy-v2" => Some(Version::V2),
                _ => None,
            };
            if let Some(version) = version {
                if send_proxy.is_some() {
                    return Err(Error::InvalidBackend(format!(
                        "'{text}': send-proxy is given twice"
                    )));
                }
                send_proxy = Some(version);
                continue;
            }
            match option.split_once('=') {
                Some(("weight", value)) => {
                    weight = value
                        .parse::<u32>()
                        .ok()
                        .filter(|w| (1..=1000).contains(w))
                        .ok_or_else(|| {
                            Error::InvalidBackend(format!("'{text}': weight must be 1..1000"))
                        })?;
                }
                Some(("max_connections", value)) => {
                    max_connections = Some(cap::parse(text, value)?);
                }
                Some((key, value))
                    if ends
                        .set(key, value)
                        .map_err(|e| Error::InvalidBackend(format!("'{text}': {key}: {e}")))? => {}
                Some((key, value)) if OwnCheck::takes(key) => check
                    .set(key, value)
                    .map_err(|e| Error::InvalidBackend(format!("'{text}': {e}")))?,
                _ => {
                    return Err(Error::InvalidBackend(format!(
                        "'{text}': unknown option '{option}' (known: {}, and its own check's {})",
                        OPTIONS.join(", "),
                        super::own_check::KEYS.join(", ")
                    )))
                }
            }
        }
        Ok(Options {
            weight,
            send_proxy,
            check,
            max_connections,
            backup,
            ends,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Origin;

    #[test]
    fn a_srv_name_is_read_with_its_options_and_makes_its_records_backends() {
        let srv = BackendSpec::parse("srv:_pg._tcp.db.internal,max_connections=5,agent_port=9999")
            .unwrap();
        assert!(srv.is_srv());
        assert_eq!(srv.name(), "srv:_pg._tcp.db.internal");
        assert_eq!(srv.origin(), Origin::Srv);
        assert_eq!(
            srv.to_string(),
            "srv:_pg._tcp.db.internal,max_connections=5,agent_port=9999"
        );
        assert_eq!(BackendSpec::parse(&srv.to_string()).unwrap(), srv);
        assert!(crate::backend::Backend::from_spec(&srv).is_err());
        let one = srv.for_record("a.db.internal", 5432, 0, true);
        assert_eq!(one.name(), "a.db.internal:5432");
        assert_eq!(
            (one.weight, one.backup, one.max_connections),
            (1, true, Some(5))
        );
        assert_eq!(srv.for_record("b", 1, 60_000, false).weight, 1000);
        for bad in ["srv:", "srv:a b", "srv:x/y", "srv:_a._tcp.x,colour=red"] {
            assert!(BackendSpec::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            BackendSpec::parse("10.0.0.1:80").unwrap().origin(),
            Origin::File
        );
        assert_eq!(BackendSpec::parse("db:80").unwrap().origin(), Origin::Dns);
    }
}
