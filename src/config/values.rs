//! The config file's values as serde reads them: durations (`"3s"` or
//! seconds), sizes (`"64k"` or bytes), whole numbers refused in words,
//! words that mean "off" (backends as strings or objects are
//! `entry.rs`'s); and [`FileValue`], which turns each into the value of
//! its setting.
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

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

use crate::health::protocol::parse_bytes;
use crate::limiter::Rate;
use crate::units::{parse_duration, parse_size, short_number, Switch};

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
as_is!(
    bool,
    String,
    crate::tls_term::CertList,
    crate::tls_term::AlpnList,
    crate::tls_term::CrlFiles
);

/// A value that is off unless given (`None`: a word for "off").
macro_rules! off_or {
    ($($v:ty => $t:ty),*) => {$(
        impl FileValue<$t> for $v {
            fn given(self) -> Option<$t> {
                self.0
            }
        }
    )*};
}
off_or!(
    MaybeSecs => Duration,
    crate::sni::names::MaybeServerNames => crate::sni::ServerNames,
    MaybeAddr => SocketAddr,
    Store => String,
    Text => String,
    Bytes => Vec<u8>,
    MaybeCount => usize,
    AllOr => u32
);

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

impl<T> FileValue<T> for MaybeParsed<T> {
    fn given(self) -> Option<T> {
        self.0
    }
}

impl FileValue<PathBuf> for Text {
    fn given(self) -> Option<PathBuf> {
        self.0.map(PathBuf::from)
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

/// A whole number from 0, or `"all"` (or one of [`NONE_WORDS`]): no
/// limit. `connect_retries`.
#[derive(Debug)]
pub(super) struct AllOr(pub(super) Option<u32>);

impl<'de> Deserialize<'de> for AllOr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(d)?;
        if value
            .as_str()
            .is_some_and(|t| t == "all" || NONE_WORDS.contains(&t))
        {
            return Ok(AllOr(None));
        }
        Whole::<u32, 0, { u32::MAX as u64 }>::deserialize(value)
            .map(|n| AllOr(Some(n.0)))
            .map_err(de::Error::custom)
    }
}

/// A value parsed with `FromStr`, or `"default"` (none, as
/// `check-config` prints it): `access_log_target`.
#[derive(Debug)]
pub(super) struct DefaultOr<T>(pub(super) Option<T>);

impl<'de, T> Deserialize<'de> for DefaultOr<T>
where
    T: FromStr,
    T::Err: fmt::Display,
{
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        if text == "default" {
            return Ok(DefaultOr(None));
        }
        text.parse()
            .map(|v| DefaultOr(Some(v)))
            .map_err(de::Error::custom)
    }
}

impl<T> FileValue<T> for DefaultOr<T> {
    fn given(self) -> Option<T> {
        self.0
    }
}

/// A value parsed with `FromStr`, or one of [`NONE_WORDS`] (none).
#[derive(Debug)]
pub(super) struct MaybeParsed<T>(pub(super) Option<T>);

/// A string, or a number read as the text of its digits (`"upload_rate":
/// 65536` is `"65536"`): the parser of the setting gives it its meaning,
/// as it does the flag's.
fn text_or_number<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<String, D::Error> {
    struct V;
    impl Visitor<'_> for V {
        type Value = String;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a string or a number")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<String, E> {
            Ok(v.to_string())
        }
    }
    d.deserialize_any(V)
}

impl<'de, T> Deserialize<'de> for MaybeParsed<T>
where
    T: FromStr,
    T::Err: fmt::Display,
{
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = text_or_number(d)?;
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

/// A [`Switch`] (`kernel_relay`, `yield_before_poll`): `"off"`, `"on"`,
/// `"auto"`, or `false` and `true` as files wrote them when the settings
/// had two values.
#[derive(Debug)]
pub(super) struct OnOffAuto(pub(super) Switch);

impl<'de> Deserialize<'de> for OnOffAuto {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = OnOffAuto;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("\"off\", \"on\" or \"auto\" (or true, false)")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> std::result::Result<OnOffAuto, E> {
                Ok(OnOffAuto(if v { Switch::On } else { Switch::Off }))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<OnOffAuto, E> {
                v.parse().map(OnOffAuto).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

impl FileValue<Switch> for OnOffAuto {
    fn given(self) -> Option<Switch> {
        Some(self.0)
    }
}

/// `rate_limit`: `"N/WINDOW"`, `N` (a number: per second), or `"off"`
/// (`None`).
#[derive(Debug)]
pub(super) struct RateSetting(pub(super) Option<Rate>);

impl<'de> Deserialize<'de> for RateSetting {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = text_or_number(d)?;
        if text.trim() == "off" {
            return Ok(RateSetting(None));
        }
        Rate::parse(&text)
            .map(|r| RateSetting(Some(r)))
            .map_err(de::Error::custom)
    }
}
