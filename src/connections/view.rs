//! What a reader sees of one connection ([`View`]), and the words of the
//! table: its phases, how bytes move, why a connection was ended on
//! purpose, and the policies for a backend that goes down or away.
//!
//! # Threads
//!
//! Built by the admin API's threads and the deadlines' thread from a
//! slot's atomics and, under the slot's lock, its set-once fields.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use super::Slot;

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// Taken by a worker: its first byte, its header, TLS, a slot.
    Waiting = 0,
    /// Connecting to a backend (fail-over included).
    Connecting = 1,
    /// Moving bytes.
    Pumping = 2,
    /// Its pump is over: what one side sent is still delivered to the
    /// other after a reset (`conduit::reset`).
    Closing = 3,
}

impl Phase {
    /// The word `GET /connections` shows.
    pub fn word(self) -> &'static str {
        match self {
            Phase::Waiting => "waiting",
            Phase::Connecting => "connecting",
            Phase::Pumping => "pumping",
            Phase::Closing => "closing",
        }
    }

    fn from_u8(n: u8) -> Phase {
        match n {
            1 => Phase::Connecting,
            2 => Phase::Pumping,
            3 => Phase::Closing,
            _ => Phase::Waiting,
        }
    }
}

/// How a connection's bytes move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    /// Read into a buffer and written out (the article's way).
    Copy = 0,
    /// `splice(2)` through a pipe.
    Splice = 1,
    /// Handed to the kernel relay.
    KernelRelay = 2,
    /// Through TLS on either side.
    Tls = 3,
}

impl Mode {
    /// The word `GET /connections` shows.
    pub fn word(self) -> &'static str {
        match self {
            Mode::Copy => "copy",
            Mode::Splice => "splice",
            Mode::KernelRelay => "kernel_relay",
            Mode::Tls => "tls",
        }
    }

    fn from_u8(n: u8) -> Mode {
        match n {
            1 => Mode::Splice,
            2 => Mode::KernelRelay,
            3 => Mode::Tls,
            _ => Mode::Copy,
        }
    }
}

/// Why a connection was ended on purpose; its access log `end=` word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kill {
    /// `DELETE /connections/{id}` or a backend's connections: `killed`.
    Killed = 1,
    /// Its backend was marked DOWN (`on_backend_down: close`):
    /// `killed_down`.
    Down = 2,
    /// Its backend was removed (`on_backend_removed: close`, or the end
    /// of `removed_drain_timeout`): `killed_removed`.
    Removed = 3,
    /// `max_connection_lifetime`: `max_lifetime`.
    MaxLifetime = 4,
    /// The drain's deadline (`drain_spread`): `drain_cut`.
    Drain = 5,
    /// Handed to a new process (`upgrade_socket`), which carries it on:
    /// `handed_over`.
    Carried = 6,
}

impl Kill {
    pub(super) fn from_u8(n: u8) -> Option<Kill> {
        Some(match n {
            1 => Kill::Killed,
            2 => Kill::Down,
            3 => Kill::Removed,
            4 => Kill::MaxLifetime,
            5 => Kill::Drain,
            6 => Kill::Carried,
            _ => return None,
        })
    }

    /// The access log's word.
    pub fn word(self) -> &'static str {
        match self {
            Kill::Killed => "killed",
            Kill::Down => "killed_down",
            Kill::Removed => "killed_removed",
            Kill::MaxLifetime => "max_lifetime",
            Kill::Drain => "drain_cut",
            Kill::Carried => "handed_over",
        }
    }
}

/// `on_backend_down`: what a backend marked DOWN does to its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnDown {
    /// They go on to their natural end (the default, as before).
    #[default]
    Keep,
    /// They are closed at once (`end=killed_down`).
    Close,
}

impl FromStr for OnDown {
    type Err = String;
    fn from_str(s: &str) -> Result<OnDown, String> {
        match s {
            "keep" => Ok(OnDown::Keep),
            "close" => Ok(OnDown::Close),
            _ => Err(format!("{s:?} is not keep or close")),
        }
    }
}

impl fmt::Display for OnDown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OnDown::Keep => "keep",
            OnDown::Close => "close",
        })
    }
}

/// `on_backend_removed`, the setting's word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Removal {
    /// Its connections go on (until `removed_drain_timeout`, if set).
    #[default]
    Drain,
    /// Its connections are closed at once.
    Close,
}

impl FromStr for Removal {
    type Err = String;
    fn from_str(s: &str) -> Result<Removal, String> {
        match s {
            "drain" => Ok(Removal::Drain),
            "close" => Ok(Removal::Close),
            _ => Err(format!("{s:?} is not drain or close")),
        }
    }
}

impl fmt::Display for Removal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Removal::Drain => "drain",
            Removal::Close => "close",
        })
    }
}

impl OnRemoved {
    /// The policy of `removal` with `removed_drain_timeout`.
    pub fn of(removal: Removal, timeout: Option<Duration>) -> OnRemoved {
        match removal {
            Removal::Drain => OnRemoved::Drain(timeout),
            Removal::Close => OnRemoved::Close,
        }
    }
}

/// `on_backend_removed` with `removed_drain_timeout`: what a removed
/// backend does to its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnRemoved {
    /// They drain: go on to their natural end, or are closed after the
    /// timeout when one is given (the default: drain, no timeout).
    Drain(Option<Duration>),
    /// They are closed at once (`end=killed_removed`).
    Close,
}

impl Default for OnRemoved {
    fn default() -> OnRemoved {
        OnRemoved::Drain(None)
    }
}

impl fmt::Display for OnRemoved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OnRemoved::Drain(_) => "drain",
            OnRemoved::Close => "close",
        })
    }
}

/// `drain_spread_order`: which connections the drain's spread closes
/// first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SpreadOrder {
    /// The longest open first (the default).
    #[default]
    Oldest,
    /// The longest silent first.
    Idlest,
}

impl FromStr for SpreadOrder {
    type Err = String;
    fn from_str(s: &str) -> Result<SpreadOrder, String> {
        match s {
            "oldest" => Ok(SpreadOrder::Oldest),
            "idlest" => Ok(SpreadOrder::Idlest),
            _ => Err(format!("{s:?} is not oldest or idlest")),
        }
    }
}

impl fmt::Display for SpreadOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SpreadOrder::Oldest => "oldest",
            SpreadOrder::Idlest => "idlest",
        })
    }
}

/// A service's settings that end its connections on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ends {
    /// `on_backend_down`. Default keep.
    pub on_backend_down: OnDown,
    /// `on_backend_removed`. Default drain.
    pub on_backend_removed: Removal,
    /// `removed_drain_timeout`: with drain, close what is left this long
    /// after the removal. Default `None` (off).
    pub removed_drain_timeout: Option<Duration>,
    /// `max_connection_lifetime` (Envoy's
    /// `max_downstream_connection_duration`): the client gets its FIN this
    /// long after a worker took it, both sides close a fin timeout later.
    /// Default `None`.
    pub max_connection_lifetime: Option<Duration>,
    /// `max_connection_lifetime_jitter`: each lifetime longer by up to
    /// this, spread by the connection's id. Default `None`.
    pub max_connection_lifetime_jitter: Option<Duration>,
}

impl Ends {
    /// Checks that every value is usable.
    ///
    /// # Errors
    ///
    /// [`crate::error::Error::InvalidSetting`] for a zero duration.
    pub fn validate(&self) -> crate::error::Result<()> {
        for (name, d) in [
            ("removed_drain_timeout", self.removed_drain_timeout),
            ("max_connection_lifetime", self.max_connection_lifetime),
        ] {
            if d.is_some_and(|d| d.is_zero()) {
                return Err(crate::error::Error::setting(name, "must be more than 0"));
            }
        }
        Ok(())
    }
}

/// A backend's own policies (`,on_backend_down=close`,
/// `,on_backend_removed=drain`), over its service's; `None`: the
/// service's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Own {
    /// Its own `on_backend_down`.
    pub on_down: Option<OnDown>,
    /// Its own `on_backend_removed`.
    pub on_removed: Option<Removal>,
}

impl Own {
    /// The two policies in one byte (two bits each, 0: the service's), for
    /// a backend that keeps them in an atomic a reload can change.
    pub fn bits(self) -> u8 {
        let down = self.on_down.map_or(0, |d| 1 + d as u8);
        let removed = self.on_removed.map_or(0, |r| 1 + r as u8);
        down | removed << 2
    }

    /// The policies [`Own::bits`] made this byte of.
    pub fn from_bits(bits: u8) -> Own {
        Own {
            on_down: match bits & 3 {
                1 => Some(OnDown::Keep),
                2 => Some(OnDown::Close),
                _ => None,
            },
            on_removed: match bits >> 2 & 3 {
                1 => Some(Removal::Drain),
                2 => Some(Removal::Close),
                _ => None,
            },
        }
    }

    /// Reads `key=value` when `key` is one of its two; `Ok(false)` for
    /// another key.
    ///
    /// # Errors
    ///
    /// The value's words when it is not one of the key's.
    pub fn set(&mut self, key: &str, value: &str) -> Result<bool, String> {
        match key {
            "on_backend_down" => self.on_down = Some(value.parse()?),
            "on_backend_removed" => self.on_removed = Some(value.parse()?),
            _ => return Ok(false),
        }
        Ok(true)
    }
}

impl fmt::Display for Own {
    /// `,on_backend_down=close` and the like, as a backend's options.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(on_down) = self.on_down {
            write!(f, ",on_backend_down={on_down}")?;
        }
        if let Some(on_removed) = self.on_removed {
            write!(f, ",on_backend_removed={on_removed}")?;
        }
        Ok(())
    }
}

/// A connection as a reader sees it.
#[derive(Debug, Clone)]
pub struct View {
    /// Unique in the process, growing.
    pub id: u64,
    /// The balancer it belongs to (see [`super::Begin::owner`]).
    pub owner: usize,
    /// Its service (`None`: the one service of a flat configuration).
    pub service: Option<String>,
    /// The client (after a PROXY header, the one it names).
    pub client: Option<SocketAddr>,
    /// The backend, once connected.
    pub backend: Option<String>,
    /// The backend's unique id, once connected.
    pub backend_id: Option<u64>,
    /// Since the worker took it.
    pub age: Duration,
    /// Since bytes last moved (or it was taken).
    pub idle: Duration,
    /// Bytes from the client the backend accepted (as of the pump's last
    /// round; frozen once on the kernel relay).
    pub to_backend: u64,
    /// Bytes from the backend the client accepted.
    pub to_client: u64,
    /// Where it is.
    pub phase: Phase,
    /// How its bytes move.
    pub mode: Mode,
    /// TLS: the server name asked for.
    pub sni: Option<String>,
    /// TLS: the version.
    pub tls_version: Option<&'static str>,
    /// TLS: the client certificate's subject.
    pub client_subject: Option<String>,
    /// Being ended on purpose, and why.
    pub ending: Option<Kill>,
    /// `on_backend_down: close` holds for it.
    pub down_close: bool,
    /// Its removed backend's policy.
    pub removed: OnRemoved,
}

impl View {
    /// The connection `slot` serves now, if any, as of `now` (ms).
    pub(super) fn of(slot: &Slot, now: u64) -> Option<View> {
        if slot.id.load(Relaxed) == 0 {
            return None;
        }
        let info = slot.info.lock();
        if info.id == 0 {
            return None;
        }
        let started = slot.started.load(Relaxed);
        let active = slot.active.load(Relaxed);
        let tls = info.tls.clone();
        Some(View {
            id: info.id,
            owner: info.owner,
            service: info.service.as_deref().map(str::to_string),
            client: info.client,
            backend: info.backend.as_ref().map(|b| b.peer_name().to_string()),
            backend_id: info.backend.as_ref().map(|b| b.peer_id()),
            age: Duration::from_millis(now.saturating_sub(started)),
            idle: Duration::from_millis(now.saturating_sub(active)),
            to_backend: slot.to_backend.load(Relaxed),
            to_client: slot.to_client.load(Relaxed),
            phase: Phase::from_u8(slot.phase.load(Relaxed)),
            mode: Mode::from_u8(slot.mode.load(Relaxed)),
            sni: tls.as_ref().and_then(|t| t.sni.clone()),
            tls_version: tls.as_ref().map(|t| t.version),
            client_subject: tls.and_then(|t| t.subject),
            ending: Kill::from_u8(slot.kill.load(Relaxed)),
            down_close: info.down_close,
            removed: info.removed,
        })
    }

    /// Bytes both ways.
    pub fn bytes(&self) -> u64 {
        self.to_backend.saturating_add(self.to_client)
    }
}

/// The jitter of connection `id`: spread evenly over `0..jitter` by a
/// hash of the id, so that connections opened together do not all reach
/// their lifetime together.
pub(super) fn jitter(id: u64, jitter: Option<Duration>) -> Duration {
    let Some(jitter) = jitter.filter(|j| !j.is_zero()) else {
        return Duration::ZERO;
    };
    // SplitMix64's finaliser: a cheap, well-spread hash of the id.
    let mut z = id.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    let ms = jitter.as_millis().min(u128::from(u64::MAX)) as u64;
    Duration::from_millis(z % ms.max(1))
}
