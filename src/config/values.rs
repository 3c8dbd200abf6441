//! The config file's values as serde reads them: durations (`"3s"` or
//! seconds), sizes (`"64k"` or bytes), whole numbers refused in words,
//! words that mean "off", backends as strings or objects; and
//! [`FileValue`], which turns each into the value of its setting.
//!
//! Pure functions, called on whatever thread reads a file.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C reads no file.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use crate::backend::BackendSpec;
use crate::error::Error;
use crate::health::{protocol::parse_bytes, OwnCheck};
use crate::limiter::Rate;
use crate::units::{parse_duration, parse_size, short_number};

/// What the process runs, the file's `mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Mode {
    /// The balancer (the default).
    #[default]
    LoadBalancer,
    /// The demo backend alone on `listen`, as `rodizio backend` runs it.
    Backend,
}

impl Mode {
    /// The name the file uses (`load_balancer`, `backend`).
    pub fn name(self) -> &'static str {
        match self {
            Mode::LoadBalancer => "load_balancer",
            Mode::Backend => "backend",
        }
    }
}

impl FromStr for Mode {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<Mode, String> {
        match text.trim().replace('-', "_").as_str() {
            "load_balancer" => Ok(Mode::LoadBalancer),
            "backend" => Ok(Mode::Backend),
            _ => Err(format!(
                "'{text}' is not a mode (use load_balancer or backend)"
            )),
        }
    }
}

/// A value read from the file, as the value of a setting of type `T`:
/// `None` when it is a word for "off" (the same as leaving the key out).
pub(super) trait FileValue<T> {
    fn given(self) -> Option<T>;
}

/// A value that is the setting's value as it is.
macro_rules! as_is {
    ($($t:ty),*) => {$(
        impl FileValue<$t> for $t {
            fn given(self) -> Option<$t> {
                Some(self)
            }
        }
    )*};
}
as_is!(bool, String, crate::tls_term::CertList);

impl<T> FileValue<T> for Parsed<T> {
    fn given(self) -> Option<T> {
        Some(self.0)
    }
}

impl<T, const LO: u64, const HI: u64> FileValue<T> for Whole<T, LO, HI> {
    fn given(self) -> Option<T> {
        Some(self.0)
    }
}

impl FileValue<Duration> for Secs {
    fn given(self) -> Option<Duration> {
        Some(self.0)
    }
}

impl FileValue<usize> for Size {
    fn given(self) -> Option<usize> {
        Some(self.0)
    }
}

/// On by default (`worker_idle_timeout`): `off` is a value, not the key
/// left out.
impl FileValue<Option<Duration>> for MaybeSecs {
    fn given(self) -> Option<Option<Duration>> {
        Some(self.0)
    }
}

/// Off unless given: `off` is the same as leaving the key out.
impl FileValue<Duration> for MaybeSecs {
    fn given(self) -> Option<Duration> {
        self.0
    }
}

impl FileValue<crate::sni::ServerNames> for crate::sni::names::MaybeServerNames {
    fn given(self) -> Option<crate::sni::ServerNames> {
        self.0
    }
}

impl<T> FileValue<T> for MaybeParsed<T> {
    fn given(self) -> Option<T> {
        self.0
    }
}

impl FileValue<SocketAddr> for MaybeAddr {
    fn given(self) -> Option<SocketAddr> {
        self.0
    }
}

impl FileValue<String> for Store {
    fn given(self) -> Option<String> {
        self.0
    }
}

impl FileValue<String> for Text {
    fn given(self) -> Option<String> {
        self.0
    }
}

impl FileValue<PathBuf> for Text {
    fn given(self) -> Option<PathBuf> {
        self.0.map(PathBuf::from)
    }
}

impl FileValue<Vec<u8>> for Bytes {
    fn given(self) -> Option<Vec<u8>> {
        self.0
    }
}

/// `access_log_file`: a path, or `"stdout"` (the default, as
/// `check-config` prints it), empty or `none`.
#[derive(Debug)]
pub(super) struct Stdout(pub(super) Option<String>);

impl<'de> Deserialize<'de> for Stdout {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let Text(path) = Text::deserialize(d)?;
        Ok(Stdout(path.filter(|p| p != "stdout")))
    }
}

impl FileValue<PathBuf> for Stdout {
    fn given(self) -> Option<PathBuf> {
        self.0.map(PathBuf::from)
    }
}

/// A value written as a string and parsed with `FromStr`.
#[derive(Debug)]
pub(super) struct Parsed<T>(pub(super) T);

impl<'de, T> Deserialize<'de> for Parsed<T>
where
    T: FromStr,
    T::Err: fmt::Display,
{
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map(Parsed).map_err(de::Error::custom)
    }
}

/// A duration: `"500ms"`, `"3s"`, or a number of seconds.
#[derive(Debug)]
pub(super) struct Secs(pub(super) Duration);

impl<'de> Deserialize<'de> for Secs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Secs;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration such as \"3s\" or \"500ms\", or a number of seconds")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Secs, E> {
                parse_duration(v).map(Secs).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<Secs, E> {
                if v > 1_000_000_000 {
                    return Err(E::custom(format!("{v} seconds is too long")));
                }
                Ok(Secs(Duration::from_secs(v)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<Secs, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::custom(format!("{v}: a duration cannot be negative"))),
                }
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<Secs, E> {
                if !(0.0..=1e9).contains(&v) {
                    return Err(E::custom(format!(
                        "{} is not a duration in seconds (0 to 1000000000)",
                        short_number(v)
                    )));
                }
                Ok(Secs(Duration::from_secs_f64(v)))
            }
        }
        d.deserialize_any(V)
    }
}

/// Words that mean "not set" for a setting that is off unless given, as
/// `Config::describe` prints them.
pub(super) const NONE_WORDS: [&str; 4] = ["off", "none", "same as idle_timeout", ""];

/// A duration, or one of [`NONE_WORDS`] (none).
#[derive(Debug)]
pub(super) struct MaybeSecs(pub(super) Option<Duration>);

impl<'de> Deserialize<'de> for MaybeSecs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(d)?;
        if value.as_str().is_some_and(|t| NONE_WORDS.contains(&t)) {
            return Ok(MaybeSecs(None));
        }
        Secs::deserialize(value)
            .map(|s| MaybeSecs(Some(s.0)))
            .map_err(de::Error::custom)
    }
}

/// A count of at least 1, or one of [`NONE_WORDS`] (no limit):
/// `max_connections`.
#[derive(Debug)]
pub(super) struct MaybeCount(pub(super) Option<usize>);

impl<'de> Deserialize<'de> for MaybeCount {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(d)?;
        if value.as_str().is_some_and(|t| NONE_WORDS.contains(&t)) {
            return Ok(MaybeCount(None));
        }
        Whole::<usize, 1, { usize::MAX as u64 }>::deserialize(value)
            .map(|n| MaybeCount(Some(n.0)))
            .map_err(de::Error::custom)
    }
}

impl FileValue<usize> for MaybeCount {
    fn given(self) -> Option<usize> {
        self.0
    }
}

/// A value parsed with `FromStr`, or one of [`NONE_WORDS`] (none).
#[derive(Debug)]
pub(super) struct MaybeParsed<T>(pub(super) Option<T>);

impl<'de, T> Deserialize<'de> for MaybeParsed<T>
where
    T: FromStr,
    T::Err: fmt::Display,
{
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        if NONE_WORDS.contains(&text.as_str()) {
            return Ok(MaybeParsed(None));
        }
        text.parse()
            .map(|v| MaybeParsed(Some(v)))
            .map_err(de::Error::custom)
    }
}

/// `rate_limit_store`: a `redis://` URL, or `"in-process"` (the default,
/// as `check-config` prints it) or one of [`NONE_WORDS`].
#[derive(Debug)]
pub(super) struct Store(pub(super) Option<String>);

impl<'de> Deserialize<'de> for Store {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        if text == "in-process" || NONE_WORDS.contains(&text.as_str()) {
            return Ok(Store(None));
        }
        Ok(Store(Some(text)))
    }
}

/// An address (`"127.0.0.1:9090"`), or one of [`NONE_WORDS`] (none).
#[derive(Debug)]
pub(super) struct MaybeAddr(pub(super) Option<SocketAddr>);

impl<'de> Deserialize<'de> for MaybeAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        if NONE_WORDS.contains(&text.as_str()) {
            return Ok(MaybeAddr(None));
        }
        super::parse_listen(&text)
            .map(|a| MaybeAddr(Some(a)))
            .map_err(de::Error::custom)
    }
}

/// `listen`: one address, or a list of them (a service listening on
/// several), parsed and refused in the words of `--listen`.
#[derive(Debug)]
pub(super) struct Listen(pub(super) Vec<SocketAddr>);

impl<'de> Deserialize<'de> for Listen {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(
            untagged,
            expecting = "an address (\"IP:PORT\") or a list of addresses"
        )]
        enum OneOrMany {
            One(String),
            Many(Vec<String>),
        }
        let texts = match OneOrMany::deserialize(d)? {
            OneOrMany::One(text) => vec![text],
            OneOrMany::Many(texts) if texts.is_empty() => {
                return Err(de::Error::custom(
                    "the list is empty: give at least one address",
                ))
            }
            OneOrMany::Many(texts) => texts,
        };
        texts
            .iter()
            .map(|t| super::parse_listen(t))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map(Listen)
            .map_err(de::Error::custom)
    }
}

/// A whole number up to `HI` (which fits `T`), refused in words ("a
/// whole number from 1 to 65536") rather than as serde names the Rust
/// type it is read into. `LO` is for the words only: a value under it
/// is the validation's to refuse, at the key, as for the flags.
#[derive(Debug)]
pub(super) struct Whole<T, const LO: u64, const HI: u64>(pub(super) T);

impl<'de, T: TryFrom<u64>, const LO: u64, const HI: u64> Deserialize<'de> for Whole<T, LO, HI> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V<T, const LO: u64, const HI: u64>(std::marker::PhantomData<T>);
        impl<T: TryFrom<u64>, const LO: u64, const HI: u64> Visitor<'_> for V<T, LO, HI> {
            type Value = Whole<T, LO, HI>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "a whole number from {LO} to {HI}")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<Self::Value, E> {
                match T::try_from(v) {
                    Ok(n) if v <= HI => Ok(Whole(n)),
                    _ => Err(E::custom(format!(
                        "expected a whole number from {LO} to {HI}, got {v}"
                    ))),
                }
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<Self::Value, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::custom(format!(
                        "expected a whole number from {LO} to {HI}, got {v}"
                    ))),
                }
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<Self::Value, E> {
                Err(E::custom(format!(
                    "expected a whole number from {LO} to {HI}, got {}",
                    short_number(v)
                )))
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// A size in bytes: `"64k"`, `"1m"`, or a number.
#[derive(Debug)]
pub(super) struct Size(pub(super) usize);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Size;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a size such as \"64k\", or a number of bytes")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Size, E> {
                parse_size(v).map(Size).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<Size, E> {
                usize::try_from(v)
                    .map(Size)
                    .map_err(|_| E::custom(format!("{v} is too large")))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<Size, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::custom(format!("{v}: a size cannot be negative"))),
                }
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<Size, E> {
                Err(E::custom(format!(
                    "{} is not a size: write a whole number of bytes, or \"64k\"",
                    short_number(v)
                )))
            }
        }
        d.deserialize_any(V)
    }
}

/// A string where empty (or `none`) means none: a user name, a path.
#[derive(Debug)]
pub(super) struct Text(pub(super) Option<String>);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Ok(Text((!text.is_empty() && text != "none").then_some(text)))
    }
}

/// Bytes in the notation of `--health-send` (`"PING\r\n"`, `"hex:0d0a"`);
/// empty means none.
#[derive(Debug)]
pub(super) struct Bytes(pub(super) Option<Vec<u8>>);

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        if text.is_empty() {
            return Ok(Bytes(None));
        }
        parse_bytes(&text)
            .map(|b| Bytes(Some(b)))
            .map_err(de::Error::custom)
    }
}

/// `rate_limit`: `"N/WINDOW"`, or `"off"` (`None`).
#[derive(Debug)]
pub(super) struct RateSetting(pub(super) Option<Rate>);

impl<'de> Deserialize<'de> for RateSetting {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        if text.trim() == "off" {
            return Ok(RateSetting(None));
        }
        Rate::parse(&text)
            .map(|r| RateSetting(Some(r)))
            .map_err(de::Error::custom)
    }
}

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
const ENTRY_KEYS: &[&str] = &["host", "port", "weight", "send_proxy", "max_connections", "backup", "check_port", "check_address",
    "health_check", "health_path", "health_interval", "rise", "fall"];

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
