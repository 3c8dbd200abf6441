//! A list of ALPN protocol names (RFC 7301), as the settings give it: the
//! protocols a service terminating TLS offers (`tls_term`), and those that
//! choose a service routed by SNI (`names`). Kept here, below both, so that
//! SNI routing needs nothing of `tls_term`.
//!
//! # Threads
//!
//! Read from the configuration on the main thread; read only afterwards.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::fmt;
use std::str::FromStr;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

/// The most protocols a list may hold.
const MAX_PROTOCOLS: usize = 16;

/// A list of ALPN protocol names, the preferred first (`h2,http/1.1`);
/// empty: none. The protocols offered to the clients of a service that
/// terminates TLS, or those that choose a service routed by SNI.
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

/// The file's list of protocols: a list of strings, one string of protocols
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
}
