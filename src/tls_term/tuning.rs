//! The server side's tuning: resumption (the session cache,
//! `tls_session_cache`, and TLS 1.2/1.3 tickets with rotating keys), kept
//! across reloads that change no TLS setting; the ALPN list offered
//! (`tls_alpn`); the server's cipher order.
//!
//! # Threads
//!
//! Built by the thread that starts or reloads the balancer; the cache and
//! the ticket keys are then shared by rustls on every worker thread (the
//! cache behind rustls's own lock).
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use rustls::server::{NoServerSessionStorage, ProducesTickets, StoresServerSessions};
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

use super::TlsSettings;

/// Default of `tls_session_cache`: HAProxy's `tune.ssl.cachesize`.
pub const DEFAULT_SESSION_CACHE: usize = 20_000;

/// The most sessions `tls_session_cache` may keep: rustls reserves room
/// for every entry when the cache is made (about 72 bytes each, touched
/// only as sessions come), and a full entry is a few hundred bytes, so a
/// million is some hundreds of MB at worst.
pub const MAX_SESSION_CACHE: usize = 1_000_000;

/// The most protocols `tls_alpn` may list.
const MAX_PROTOCOLS: usize = 16;

/// What resumption needs that outlives one terminator: the session cache
/// and the ticket keys, handed to the next terminator by a reload that
/// changes no TLS setting, so clients resume across it.
#[derive(Debug, Clone)]
pub(super) struct Resumption {
    /// The settings these were made for: another terminator takes them
    /// only when its settings are the same.
    settings: TlsSettings,
    cache: Arc<dyn StoresServerSessions>,
    tickets: Arc<dyn ProducesTickets>,
}

impl Resumption {
    /// The resumption of `previous` when it was made for settings that
    /// match `settings`, else a new one: an empty cache of
    /// `tls_session_cache` entries and new ticket keys.
    ///
    /// With `tls_client_ca`, never the previous one: a session carries
    /// the client's verified certificate, and a client the new files no
    /// longer trust must not resume past them.
    ///
    /// # Errors
    ///
    /// No randomness for the ticket keys, in words.
    pub(super) fn for_settings(
        settings: &TlsSettings,
        previous: Option<&Resumption>,
    ) -> Result<Resumption, String> {
        if let Some(previous) = previous {
            if settings.client_ca.is_none() && same_but_timeout(&previous.settings, settings) {
                return Ok(previous.clone());
            }
        }
        let cache: Arc<dyn StoresServerSessions> = match settings.session_cache {
            0 => Arc::new(NoServerSessionStorage {}),
            n => rustls::server::ServerSessionMemoryCache::new(n.min(MAX_SESSION_CACHE)),
        };
        // Keys rotated every 6 hours, a ticket good for 12.
        let tickets = rustls::crypto::ring::Ticketer::new()
            .map_err(|e| format!("cannot make TLS ticket keys: {e}"))?;
        Ok(Resumption {
            settings: settings.clone(),
            cache,
            tickets,
        })
    }

    /// Puts the cache, the ticket keys, the ALPN list and the server's
    /// cipher order in `config`.
    pub(super) fn tune(&self, config: &mut rustls::ServerConfig) {
        config.session_storage = Arc::clone(&self.cache);
        config.ticketer = Arc::clone(&self.tickets);
        // The server's order of cipher suites, not the client's: the
        // provider lists the strongest first.
        config.ignore_client_order = true;
        config.alpn_protocols = self
            .settings
            .alpn
            .0
            .iter()
            .map(|p| p.clone().into_bytes())
            .collect();
    }
}

/// Whether `a` and `b` are the same settings but for the handshake's
/// timeout, which no session depends on.
fn same_but_timeout(a: &TlsSettings, b: &TlsSettings) -> bool {
    let b = TlsSettings {
        handshake_timeout: a.handshake_timeout,
        ..b.clone()
    };
    *a == b
}

/// `tls_alpn`: the protocols offered to clients by ALPN, the preferred
/// first (`h2,http/1.1`); empty: no ALPN.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AlpnList(pub Vec<String>);

impl AlpnList {
    /// For the flag: protocols separated by commas, or `off`.
    ///
    /// # Errors
    ///
    /// The first bad protocol name, in words.
    pub fn parse_flag(text: &str) -> Result<AlpnList, String> {
        text.parse()
    }

    fn from_list<S: AsRef<str>>(list: &[S]) -> Result<AlpnList, String> {
        if list.len() > MAX_PROTOCOLS {
            return Err(format!("at most {MAX_PROTOCOLS} ALPN protocols"));
        }
        let mut protocols: Vec<String> = Vec::with_capacity(list.len());
        for p in list {
            let p = check(p.as_ref())?;
            if !protocols.contains(&p) {
                protocols.push(p);
            }
        }
        Ok(AlpnList(protocols))
    }
}

/// One protocol name: printable ASCII without spaces or commas, 1 to 255
/// bytes (the wire's limit), as the IANA registry's names are (`h2`,
/// `http/1.1`, `imap`).
fn check(name: &str) -> Result<String, String> {
    let fine = |b: u8| b.is_ascii_graphic() && b != b',';
    if name.is_empty() || name.len() > 255 || !name.bytes().all(fine) {
        let mut shown: String = name.chars().take(40).flat_map(char::escape_debug).collect();
        if name.chars().count() > 40 {
            shown.push('…');
        }
        return Err(format!(
            "`{shown}` is not an ALPN protocol name: use names such as h2 or http/1.1"
        ));
    }
    Ok(name.to_string())
}

impl FromStr for AlpnList {
    type Err = String;

    fn from_str(text: &str) -> Result<AlpnList, String> {
        let text = text.trim();
        if ["off", "none", ""].contains(&text) {
            return Ok(AlpnList::default());
        }
        let list: Vec<&str> = text.split(',').map(str::trim).collect();
        AlpnList::from_list(&list)
    }
}

impl fmt::Display for AlpnList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("off");
        }
        f.write_str(&self.0.join(","))
    }
}

/// The file's `tls_alpn`: a list of strings, one string of protocols
/// separated by commas, or `"off"`.
impl<'de> Deserialize<'de> for AlpnList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = AlpnList;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of ALPN protocols, such as [\"h2\", \"http/1.1\"], or \"off\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<AlpnList, E> {
                v.parse().map_err(E::custom)
            }
            // A protocol named by digits alone, as the export writes it.
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<AlpnList, E> {
                self.visit_str(&v.to_string())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<AlpnList, A::Error> {
                let mut list: Vec<String> = Vec::new();
                while let Some(p) = seq.next_element::<String>()? {
                    if list.len() >= MAX_PROTOCOLS {
                        return Err(de::Error::custom(format!(
                            "at most {MAX_PROTOCOLS} ALPN protocols"
                        )));
                    }
                    list.push(p);
                }
                AlpnList::from_list(&list).map_err(de::Error::custom)
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alpn_lists_are_read_checked_and_printed_back() {
        let list: AlpnList = "h2, http/1.1,h2".parse().unwrap();
        assert_eq!(list.0, ["h2", "http/1.1"]);
        assert_eq!(list.to_string(), "h2,http/1.1");
        assert_eq!(list.to_string().parse::<AlpnList>().unwrap(), list);
        for off in ["off", "none", ""] {
            assert_eq!(off.parse::<AlpnList>().unwrap(), AlpnList::default());
        }
        assert_eq!(AlpnList::default().to_string(), "off");
        let from_file: AlpnList = serde_json::from_str(r#"["h2", "http/1.1"]"#).unwrap();
        assert_eq!(from_file.0, ["h2", "http/1.1"]);
        let off: AlpnList = serde_json::from_str(r#""off""#).unwrap();
        assert!(off.0.is_empty());
    }

    /// Hostile values: each refused in one short line, whatever its size.
    #[test]
    fn garbage_and_huge_alpn_values_are_refused_in_a_short_line() {
        let huge = "x".repeat(100_000);
        let many = vec!["p"; 10_000]
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{p}{i}"))
            .collect::<Vec<_>>()
            .join(",");
        for bad in [
            huge.as_str(),
            many.as_str(),
            "h2,,http/1.1",
            "h 2",
            "é",
            "h2\u{0}",
            "\u{7f}",
        ] {
            let err = bad.parse::<AlpnList>().unwrap_err();
            assert!(err.len() < 200, "{err}");
        }
        let json_many = format!(
            "[{}]",
            (0..100_000)
                .map(|i| format!("\"p{i}\""))
                .collect::<Vec<_>>()
                .join(",")
        );
        let err = serde_json::from_str::<AlpnList>(&json_many).unwrap_err();
        assert!(err.to_string().contains("at most 16"), "{err}");
        assert_eq!(serde_json::from_str::<AlpnList>("3").unwrap().0, ["3"]);
        for bad in ["-3", "{}", "[1]", "[\"\"]", "true"] {
            assert!(serde_json::from_str::<AlpnList>(bad).is_err(), "{bad}");
        }
        let longest = "y".repeat(255);
        assert!(longest.parse::<AlpnList>().is_ok());
        assert!(format!("{longest}y").parse::<AlpnList>().is_err());
    }

    /// The cache and the ticket keys pass to the next terminator when only
    /// the handshake's timeout changed; any other change, or mutual TLS,
    /// makes new ones.
    #[test]
    fn resumption_is_kept_only_for_the_same_settings() {
        let base = TlsSettings::default();
        let first = Resumption::for_settings(&base, None).unwrap();
        let kept = |s: &TlsSettings| {
            let next = Resumption::for_settings(s, Some(&first)).unwrap();
            Arc::ptr_eq(&next.cache, &first.cache) && Arc::ptr_eq(&next.tickets, &first.tickets)
        };
        assert!(kept(&base));
        assert!(kept(&TlsSettings {
            handshake_timeout: std::time::Duration::from_secs(3),
            ..base.clone()
        }));
        assert!(!kept(&TlsSettings {
            session_cache: 5,
            ..base.clone()
        }));
        assert!(!kept(&TlsSettings {
            strict_sni: true,
            ..base.clone()
        }));
        let mutual = TlsSettings {
            client_ca: Some("ca.pem".into()),
            ..base.clone()
        };
        let with_ca = Resumption::for_settings(&mutual, None).unwrap();
        let again = Resumption::for_settings(&mutual, Some(&with_ca)).unwrap();
        assert!(!Arc::ptr_eq(&again.tickets, &with_ca.tickets));
    }

    /// Size 0 stores nothing; a huge size is an entry count, capped, and
    /// costs nothing until sessions come.
    #[test]
    fn cache_sizes_zero_and_huge() {
        let off = Resumption::for_settings(
            &TlsSettings {
                session_cache: 0,
                ..TlsSettings::default()
            },
            None,
        )
        .unwrap();
        assert!(!off.cache.can_cache());
        assert!(!off.cache.put(vec![1], vec![2]));
        let huge = Resumption::for_settings(
            &TlsSettings {
                session_cache: usize::MAX,
                ..TlsSettings::default()
            },
            None,
        )
        .unwrap();
        assert!(huge.cache.put(vec![1], vec![2]));
        assert_eq!(huge.cache.get(&[1]), Some(vec![2]));
    }

    /// A small cache keeps the newest sessions and forgets the oldest.
    #[test]
    fn many_sessions_keep_the_newest() {
        let r = Resumption::for_settings(
            &TlsSettings {
                session_cache: 300,
                ..TlsSettings::default()
            },
            None,
        )
        .unwrap();
        for i in 0..10_000u32 {
            r.cache.put(i.to_be_bytes().to_vec(), vec![0; 100]);
        }
        assert!(r.cache.get(&9_999u32.to_be_bytes()).is_some());
        assert!(r.cache.get(&0u32.to_be_bytes()).is_none());
    }
}
