//! Which pump moves a connection's bytes, once it is connected: the copy
//! pump or pipes (`pump_both`, after the sockets' keep-alive), TLS on
//! either side (`pump_tls`), or, for a connection carried in from the
//! previous process, the copy pump from its state (`pump_resumed`).
//!
//! # Threads
//!
//! The worker thread that serves the connection.
//!
//! # Corresponds to the C article
//!
//! The copy loop's start in `proxy_function()`.

use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

use super::{pump, splice_pump, ProxyConfig};
use crate::stats::Stats;

/// The pump for a connection with the client's TLS session `tls` (if the
/// service terminates TLS) or carried in at `resumed` (if it was), or
/// else [`pump_both`]; what it moved, and what the access log says of the
/// client's TLS.
pub(super) fn moving(
    tls: Option<crate::tls_term::handshake::Session>,
    resumed: Option<Box<crate::connections::carry::State>>,
    [client, backend]: [&TcpStream; 2],
    settings: &ProxyConfig,
    peer: SocketAddr,
    stats: &Arc<Stats>,
) -> (pump::Pumped, Option<Box<crate::access_log::TlsNote>>) {
    match (tls, resumed) {
        (Some(session), _) => pump_tls(session, client, backend, settings, peer),
        (None, Some(state)) => (pump_resumed(client, backend, settings, &state), None),
        (None, None) => (pump_both(client, backend, settings, peer, stats), None),
    }
}

/// Keep-alive on both sockets when asked, then the pump, copying or
/// splicing, until both sides are done.
fn pump_both(
    client: &TcpStream,
    backend: &TcpStream,
    settings: &ProxyConfig,
    peer: SocketAddr,
    stats: &Arc<Stats>,
) -> pump::Pumped {
    settings.keep_alive(client, backend, peer);
    let options = settings.pump_options();
    if settings.splice {
        crate::connections::mode(crate::connections::Mode::Splice);
    }
    if options.promote {
        super::kernel_relay::count_for(stats);
    }
    if settings.splice {
        splice_pump(client, backend, &options)
    } else {
        pump::pump(client, backend, settings.buffer_size, &options)
    }
}

/// The pump of a connection carried in from the previous process: the
/// copy pump, from its state (never the kernel relay, whose hand-over
/// expects empty buffers; nor pipes, which it did not bring). Not
/// inlined, as [`pump_tls`].
#[cold]
#[inline(never)]
fn pump_resumed(
    client: &TcpStream,
    backend: &TcpStream,
    settings: &ProxyConfig,
    state: &crate::connections::carry::State,
) -> pump::Pumped {
    let mut options = settings.pump_options();
    options.promote = false;
    crate::connections::mode(crate::connections::Mode::Copy);
    pump::pump_from(client, backend, settings.buffer_size, &options, Some(state))
}

/// [`pump_both`] for a connection with TLS on either side, and what the
/// access log says of the client's TLS. Not inlined: the plain path's
/// frame stays as it was.
#[inline(never)]
fn pump_tls(
    mut session: crate::tls_term::handshake::Session,
    client: &TcpStream,
    backend: &TcpStream,
    settings: &ProxyConfig,
    peer: SocketAddr,
) -> (pump::Pumped, Option<Box<crate::access_log::TlsNote>>) {
    use crate::tls_term::pump::{pump, Side};
    settings.keep_alive(client, backend, peer);
    let sessions = &mut *session;
    let note = sessions.note();
    crate::connections::mode(crate::connections::Mode::Tls);
    if let Some(note) = &note {
        crate::connections::tls(note.sni.clone(), note.version, note.client.clone());
    }
    let pumped = pump(
        Side::client(client, sessions.client.as_mut()),
        Side::backend(backend, sessions.backend.as_mut()),
        &settings.pump_options(),
    );
    (pumped, note)
}
