//! A backend in the config file, as serde reads it: a string
//! (`"HOST:PORT[,weight=N][,backup]"`, parsed as `--backend` is) or an
//! object (`{"host", "port", "weight", "backup", ...}`), and the list of
//! them.
//!
//! Pure functions, called on whatever thread reads a file.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C reads its servers at the prompt
//! (`servers_entry()`), not from a file.

use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::values::Whole;
use crate::backend::BackendSpec;
use crate::error::Error;
use crate::health::OwnCheck;

/// The backend list: strings or objects.
#[derive(Debug)]
pub(super) struct Backends(pub(super) Vec<BackendSpec>);

impl<'de> Deserialize<'de> for Backends {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Backends;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of backends")
            }
            fn visit_seq<A: SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<Backends, A::Error> {
                let mut list = Vec::new();
                while let Some(Entry(spec)) = seq.next_element()? {
                    list.push(spec);
                }
                Ok(Backends(list))
            }
        }
        d.deserialize_seq(V)
    }
}

/// One backend: `"HOST:PORT[,weight=N][,backup]"` or `{"host", "port",
/// "weight", "backup", ...}`.
pub(super) struct Entry(pub(super) BackendSpec);

/// The keys of a backend written as an object (and its own check's).
#[rustfmt::skip]
const ENTRY_KEYS: &[&str] = &["host", "port", "weight", "send_proxy", "max_connections", "backup", "on_backend_down", "on_backend_removed", "check_port", "check_address",
    "health_check", "health_path", "health_interval", "rise", "fall", "agent_port", "agent_interval", "agent_send"];

/// A backend's own `on_backend_down` or `on_backend_removed`, read into
/// `ends`.
fn own_end<'de, A: MapAccess<'de>>(
    ends: &mut crate::connections::Own,
    key: &str,
    map: &mut A,
) -> std::result::Result<(), A::Error> {
    let value: String = map.next_value()?;
    ends.set(key, &value).map(drop).map_err(de::Error::custom)
}

impl<'de> Deserialize<'de> for Entry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Entry;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a backend: \"HOST:PORT[,weight=N]\" or {\"host\": ..., \"port\": ...}")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Entry, E> {
                BackendSpec::parse(v).map(Entry).map_err(|e| match e {
                    Error::InvalidBackend(msg) => E::custom(msg),
                    other => E::custom(other),
                })
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Entry, A::Error> {
                let mut host = None::<String>;
                let mut port = None::<Whole<u16, 1, 65535>>;
                let mut weight = None::<Whole<u32, 1, 1000>>;
                let mut send_proxy = None;
                let mut check = OwnCheck::default();
                let mut max_connections =
                    None::<Whole<usize, 1, { crate::backend::cap::MAX_MAX_CONNECTIONS as u64 }>>;
                let mut backup = None::<bool>;
                let mut ends = crate::connections::Own::default();
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "host" => host = Some(map.next_value()?),
                        "port" => port = Some(map.next_value()?),
                        "weight" => weight = Some(map.next_value()?),
                        "max_connections" => max_connections = Some(map.next_value()?),
                        "backup" if backup.is_some() => {
                            return Err(de::Error::duplicate_field("backup"))
                        }
                        "backup" => backup = Some(map.next_value()?),
                        "send_proxy" => {
                            let text: String = map.next_value()?;
                            send_proxy = match text.as_str() {
                                "off" | "none" | "" => None,
                                _ => Some(text.parse().map_err(de::Error::custom)?),
                            };
                        }
                        key @ ("on_backend_down" | "on_backend_removed") => {
                            own_end(&mut ends, key, &mut map)?
                        }
                        key if OwnCheck::takes(key) => check
                            .set_value(key, &map.next_value()?)
                            .map_err(de::Error::custom)?,
                        other => return Err(de::Error::unknown_field(other, ENTRY_KEYS)),
                    }
                }
                let host = host.ok_or_else(|| de::Error::missing_field("host"))?;
                let port = port.ok_or_else(|| de::Error::missing_field("port"))?.0;
                let host = entry_host(&host).map_err(de::Error::custom)?;
                let weight = weight.map_or(1, |w| w.0);
                // `Whole` leaves the lower bound to the caller.
                if port == 0 {
                    return Err(de::Error::custom("port must be 1..65535, got 0"));
                }
                if weight == 0 {
                    return Err(de::Error::custom("weight must be 1..1000, got 0"));
                }
                if max_connections.as_ref().is_some_and(|n| n.0 == 0) {
                    return Err(de::Error::custom("max_connections must be 1 or more"));
                }
                Ok(Entry(BackendSpec {
                    host,
                    port,
                    weight,
                    send_proxy,
                    check,
                    max_connections: max_connections.map(|n| n.0),
                    backup: backup.unwrap_or(false),
                    ends,
                }))
            }
        }
        d.deserialize_any(V)
    }
}

/// The `host` of a backend object: a name or an IP address; an IPv6
/// address may come in brackets, as in `"[::1]:8001"`.
fn entry_host(text: &str) -> std::result::Result<String, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("the host is empty".into());
    }
    let inner = text
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or(text);
    let is_ipv6 = inner.parse::<std::net::Ipv6Addr>().is_ok();
    if !is_ipv6 && inner.contains([':', '[', ']']) {
        return Err(format!(
            "host '{text}' is neither a name nor an IP address \
             (an IPv6 address is written \"::1\" or \"[::1]\"; the port goes in \"port\")"
        ));
    }
    Ok(inner.to_string())
}
