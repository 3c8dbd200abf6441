//! A service's server names (`server_names`): exact host names and
//! `*.` wildcards, and the choice among the services of one address:
//! an exact name first, then the longest wildcard, then the default; a
//! service that lists ALPN protocols only for a client offering one of
//! them, and before a service of the same name that lists none.
//!
//! # Threads
//!
//! Read from the configuration on the main thread; matched by workers,
//! read only (no lock).
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::fmt;
use std::str::FromStr;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

use super::alpn::AlpnList;
use super::client_hello::{protocols, MAX_NAME};

/// Most names one service may claim: a bound on the work per client.
pub const MAX_NAMES: usize = 1024;

/// The names one service answers to, lower case: `a.test`, or
/// `*.example.com` (any name ending in `.example.com`, at any depth, not
/// `example.com` itself, as nginx's `server_name` reads it).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServerNames(Vec<String>);

impl ServerNames {
    /// The names as written (lower case).
    pub fn names(&self) -> &[String] {
        &self.0
    }

    /// How well `host` (lower case) matches: `Some(usize::MAX)` for an
    /// exact name, `Some(n)` for a wildcard whose suffix is `n` bytes
    /// long, `None` for no match.
    pub fn score(&self, host: &str) -> Option<usize> {
        let mut best = None;
        for name in &self.0 {
            if let Some(suffix) = name.strip_prefix('*') {
                // `suffix` is `.example.com`: at least one label before it.
                if host.len() > suffix.len() && host.ends_with(suffix) {
                    best = best.max(Some(suffix.len()));
                }
            } else if name == host {
                return Some(usize::MAX);
            }
        }
        best
    }

    /// For the flag: names separated by commas.
    ///
    /// # Errors
    ///
    /// The first bad name, in words.
    pub fn parse_flag(text: &str) -> Result<ServerNames, String> {
        text.parse()
    }

    fn from_list<S: AsRef<str>>(list: &[S]) -> Result<ServerNames, String> {
        if list.is_empty() {
            return Err("give at least one server name".into());
        }
        if list.len() > MAX_NAMES {
            return Err(format!("at most {MAX_NAMES} server names per service"));
        }
        let mut names = Vec::with_capacity(list.len());
        for name in list {
            let name = check(name.as_ref())?;
            if !names.contains(&name) {
                names.push(name);
            }
        }
        Ok(ServerNames(names))
    }
}

/// One name, checked and put in lower case.
fn check(name: &str) -> Result<String, String> {
    let host = name.strip_prefix("*.").unwrap_or(name);
    let label_fine = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if name.len() > MAX_NAME || !host.split('.').all(label_fine) {
        // Shown clipped: the error is one short line, whatever was written.
        let mut shown: String = name.chars().take(64).flat_map(char::escape_debug).collect();
        if name.chars().count() > 64 {
            shown.push('…');
        }
        return Err(format!(
            "`{shown}` is not a server name: use a host name such as a.example.com, \
             or *.example.com for every name under example.com"
        ));
    }
    Ok(name.to_ascii_lowercase())
}

impl FromStr for ServerNames {
    type Err = String;

    fn from_str(text: &str) -> Result<ServerNames, String> {
        let list: Vec<&str> = text
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        ServerNames::from_list(&list)
    }
}

impl fmt::Display for ServerNames {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join(","))
    }
}

/// The file's `server_names`: a list of strings, or one string of names
/// separated by commas.
impl<'de> Deserialize<'de> for ServerNames {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ServerNames;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of server names, such as [\"a.test\", \"*.example.com\"]")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ServerNames, E> {
                v.parse().map_err(E::custom)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ServerNames, A::Error> {
                let mut list: Vec<String> = Vec::new();
                while let Some(name) = seq.next_element::<String>()? {
                    if list.len() >= MAX_NAMES {
                        return Err(de::Error::custom(format!(
                            "at most {MAX_NAMES} server names per service"
                        )));
                    }
                    list.push(name);
                }
                ServerNames::from_list(&list).map_err(de::Error::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// The file's `server_names`: names, or `"off"`, `"none"` or `""` (the
/// same as leaving the key out, as `check-config` prints it).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MaybeServerNames(pub Option<ServerNames>);

impl<'de> Deserialize<'de> for MaybeServerNames {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(d)?;
        if value
            .as_str()
            .is_some_and(|t| ["off", "none", ""].contains(&t))
        {
            return Ok(MaybeServerNames(None));
        }
        ServerNames::deserialize(value)
            .map(|n| MaybeServerNames(Some(n)))
            .map_err(de::Error::custom)
    }
}

/// How the service of a client was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chosen {
    /// Its name is one of the service's (exact or wildcard).
    Matched(usize),
    /// The default service, the name matching none (or there being none).
    Default(usize),
    /// No service: no name matched and there is no default.
    Nobody,
}

/// The service for a client asking for `host` and offering `offered` by
/// ALPN (the list as [`Hello::alpn`](super::client_hello::Hello::alpn)
/// holds it; empty: none), among the services whose `names` and `alpn`
/// are given in order (`alpn` may be shorter: the services past it list
/// no protocol).
///
/// A service is a candidate when one of its names matches and, if it
/// lists protocols, the client offers one of them. The best candidate: an
/// exact match, else the longest wildcard; on a tie, a service listing
/// protocols before one listing none, then the first. Else `default`.
///
/// The work is bounded by the hello (at most 16 KiB of offered names) times
/// the protocols a service may list, and done only for services whose
/// name matched.
pub fn choose(
    names: &[ServerNames],
    alpn: &[AlpnList],
    default: Option<usize>,
    host: Option<&str>,
    offered: &[u8],
) -> Chosen {
    let listed = |i: usize| alpn.get(i).map_or(&[][..], |l| &l.0[..]);
    let takes = |i: usize| {
        let mine = listed(i);
        mine.is_empty() || protocols(offered).any(|p| mine.iter().any(|m| m.as_bytes() == p))
    };
    let best = host.and_then(|host| {
        names
            .iter()
            .enumerate()
            .filter_map(|(i, n)| n.score(host).map(|s| (s, i)))
            .filter(|&(_, i)| takes(i))
            // The highest score; on a tie a service listing protocols
            // (the client offered one), then the first.
            .min_by_key(|&(s, i)| (std::cmp::Reverse(s), listed(i).is_empty(), i))
    });
    match (best, default) {
        (Some((_, i)), _) => Chosen::Matched(i),
        (None, Some(d)) => Chosen::Default(d),
        (None, None) => Chosen::Nobody,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(text: &str) -> ServerNames {
        text.parse().unwrap()
    }

    #[test]
    fn exact_first_then_the_longest_wildcard_then_the_default() {
        let a = names("a.test,*.example.com");
        let b = names("*.b.example.com");
        let c = names("x.b.example.com");
        let all = [a, b, c];
        assert_eq!(
            choose(&all, &[], None, Some("a.test"), &[]),
            Chosen::Matched(0)
        );
        assert_eq!(
            choose(&all, &[], None, Some("z.example.com"), &[]),
            Chosen::Matched(0)
        );
        assert_eq!(
            choose(&all, &[], None, Some("y.b.example.com"), &[]),
            Chosen::Matched(1)
        );
        assert_eq!(
            choose(&all, &[], None, Some("deep.y.b.example.com"), &[]),
            Chosen::Matched(1)
        );
        assert_eq!(
            choose(&all, &[], None, Some("x.b.example.com"), &[]),
            Chosen::Matched(2)
        );
        // A wildcard does not match the name it stands under.
        assert_eq!(
            choose(&all, &[], None, Some("example.com"), &[]),
            Chosen::Nobody
        );
        assert_eq!(
            choose(&all, &[], Some(2), Some("other.test"), &[]),
            Chosen::Default(2)
        );
        assert_eq!(choose(&all, &[], Some(1), None, &[]), Chosen::Default(1));
        assert_eq!(choose(&all, &[], None, None, &[]), Chosen::Nobody);
    }

    fn alpn(text: &str) -> AlpnList {
        text.parse().unwrap()
    }

    /// The ALPN list a hello offering `protocols` holds.
    fn offer(protocols: &[&str]) -> Vec<u8> {
        super::super::client_hello::alpn_body(protocols)[2..].to_vec()
    }

    #[test]
    fn a_name_with_alpn_wins_and_a_client_without_goes_to_the_plain_one() {
        // Service 0 takes a.test plainly; 1 takes it for h2; 2 for
        // imap only; 3 is *.test for h2.
        let all = [
            names("a.test"),
            names("a.test"),
            names("a.test"),
            names("*.test"),
        ];
        let lists = [alpn(""), alpn("h2"), alpn("imap"), alpn("h2")];
        let go = |host, offered: &[&str]| choose(&all, &lists, None, Some(host), &offer(offered));
        assert_eq!(go("a.test", &["h2", "http/1.1"]), Chosen::Matched(1));
        assert_eq!(go("a.test", &["http/1.1", "h2"]), Chosen::Matched(1));
        assert_eq!(go("a.test", &["http/1.1"]), Chosen::Matched(0));
        assert_eq!(go("a.test", &[]), Chosen::Matched(0));
        assert_eq!(go("a.test", &["imap"]), Chosen::Matched(2));
        // Offering both h2 and imap: on the tie, the first service.
        assert_eq!(go("a.test", &["imap", "h2"]), Chosen::Matched(1));
        // The wildcard lists h2: only for clients offering it.
        assert_eq!(go("b.test", &["h2"]), Chosen::Matched(3));
        assert_eq!(go("b.test", &["http/1.1"]), Chosen::Nobody);
        assert_eq!(
            choose(&all, &lists, Some(0), Some("b.test"), &[]),
            Chosen::Default(0)
        );
        // Without the plain one, a client not offering h2 falls past the
        // name to the default (or to nobody).
        let only = [names("a.test")];
        let h2 = [alpn("h2")];
        assert_eq!(
            choose(&only, &h2, None, Some("a.test"), &offer(&["http/1.1"])),
            Chosen::Nobody
        );
        assert_eq!(
            choose(&only, &h2, Some(0), Some("a.test"), &[]),
            Chosen::Default(0)
        );
        // Many names offered, one matching, at the end.
        let many: Vec<String> = (0..1000).map(|i| format!("p{i}")).collect();
        let mut refs: Vec<&str> = many.iter().map(String::as_str).collect();
        refs.push("h2");
        assert_eq!(go("a.test", &refs), Chosen::Matched(1));
    }

    #[test]
    fn names_are_checked_and_lowered() {
        assert_eq!(
            names(" A.Test , *.Example.COM,a.test").names(),
            ["a.test", "*.example.com"]
        );
        for bad in [
            "", "a..b", "*", "*.", "a.*.b", "a b", "é.test", "a/b", "-*.x",
        ] {
            assert!(bad.parse::<ServerNames>().is_err(), "{bad:?}");
        }
        let long = format!("{}.test", "a".repeat(64));
        assert!(long.parse::<ServerNames>().is_err());
        let list: ServerNames = serde_json::from_str(r#"["a.test", "*.b.test"]"#).unwrap();
        assert_eq!(list.names(), ["a.test", "*.b.test"]);
        let err = serde_json::from_str::<ServerNames>(r#"["a.test", "a b"]"#).unwrap_err();
        assert!(
            err.to_string().contains("`a b` is not a server name"),
            "{err}"
        );
        assert!(serde_json::from_str::<ServerNames>("[]").is_err());
        assert!(serde_json::from_str::<ServerNames>("3").is_err());
        for off in [r#""off""#, r#""none""#, r#""""#] {
            let m: MaybeServerNames = serde_json::from_str(off).unwrap();
            assert_eq!(m, MaybeServerNames(None));
        }
        let m: MaybeServerNames = serde_json::from_str(r#"["a.test"]"#).unwrap();
        assert_eq!(m.0.unwrap().names(), ["a.test"]);
    }
}
