//! SNI routing without terminating TLS (nginx's `ssl_preread` with a
//! `map`, HAProxy's `req.ssl_sni`, Traefik's `HostSNI`): several services
//! share one listening address, each claiming server names, and the
//! worker that takes a client reads the name its TLS ClientHello asks for
//! to choose the service. The hello is only peeked: the backend receives
//! every byte untouched and does the TLS itself.
//!
//! # Parts
//!
//! - this file: [`SniConfig`], a service's settings (`server_names`,
//!   its ALPN protocols, `sni_default`, `sni_timeout`);
//! - `alpn`: a list of ALPN protocol names, as the settings give them;
//! - `client_hello`: the parser, bounds checked, with property tests;
//! - `names`: the names a service claims, and the choice among services
//!   (by name, then by the protocols the client offers by ALPN);
//! - `peek`: reading the hello off the socket without consuming it.
//!
//! The worker's side, from the peeked name to the chosen service's usual
//! path, is [`crate::sni_router`], above the services it chooses among;
//! what the configuration must say (who may share an address) is
//! [`crate::config::sni_check`], beside the configuration it reads.
//!
//! # Threads
//!
//! The accept loop of a shared address queues each client unrouted; the
//! worker that takes it peeks, chooses and serves (`sni_router`). Nothing here
//! takes a lock.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C serves one port with one list of backends.

pub mod alpn;
pub mod client_hello;
pub mod names;
pub mod peek;

use std::time::Duration;

pub use names::ServerNames;

use alpn::AlpnList;

/// Default of `sni_timeout`: the longest wait for a complete ClientHello.
/// A real client sends it in its first packet; five seconds cover a slow
/// link without letting a silent client hold a worker long.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// A service's SNI settings (a part of [`crate::Config`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SniConfig {
    /// The names this service answers to (`server_names`). Default
    /// `None`: the service does no SNI routing and owns its addresses.
    pub server_names: Option<ServerNames>,
    /// With `server_names`: this service takes only the clients that
    /// offer one of these protocols by ALPN, and takes them before a
    /// service of the same name that lists none. Default empty: it takes
    /// its names' clients whatever they offer.
    pub alpn: AlpnList,
    /// This service takes the clients of its addresses whose name matches
    /// no service, who send none, who send nothing by the timeout, or
    /// whose first bytes are no ClientHello (`sni_default`); never a
    /// hello begun and stalled. Default false: those are closed.
    pub default: bool,
    /// The longest wait for a complete ClientHello (`sni_timeout`); the
    /// longest of the services sharing an address applies there.
    pub timeout: Duration,
}

impl Default for SniConfig {
    fn default() -> Self {
        SniConfig {
            server_names: None,
            alpn: AlpnList::default(),
            default: false,
            timeout: DEFAULT_TIMEOUT,
        }
    }
}
