//! The worker's TLS handshake with its client: blocking in spirit (one
//! thread per connection, nothing else to do meanwhile), on a non-blocking
//! socket with `poll(2)` so that the whole handshake is bounded by
//! `tls_handshake_timeout`, however the client trickles its bytes, and
//! counted among the service's handshakes in progress (`tls_max_pending`,
//! [`crate::pending`]): at the bound, the one stalled longest is closed.
//!
//! # Threads
//!
//! The worker thread serving the client; shares only the terminator's
//! configuration (read-only).
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::fmt;
use std::io::{self, ErrorKind, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

use rustls::{Connection, ServerConnection};

use super::Terminator;
use crate::access_log::TlsNote;
use crate::poll::{millis_rounded_up, poll, readable_by};
use crate::stats::Stats;
use crate::trace;

/// Why a handshake failed: each has its counter
/// (`tls_handshake_failures_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// It did not finish within `tls_handshake_timeout`.
    Timeout,
    /// The client closed (or reset) before it finished.
    Closed,
    /// What came was not TLS (a plain HTTP request, say).
    NotTls,
    /// No version, cipher suite or group in common.
    Incompatible,
    /// The client refused our certificate (an alert).
    Refused,
    /// The client's certificate was missing or not trusted
    /// (`tls_client_ca`).
    ClientCertificate,
    /// Any other breach of the protocol.
    Protocol,
    /// No certificate covers the client's server name, or it sent none
    /// (`tls_strict_sni`): refused with `unrecognized_name`.
    UnknownName,
    /// Closed, stalled longest, to make room for a new client at
    /// `tls_max_pending`.
    MadeRoom,
}

impl Failure {
    /// Its counter in `stats`.
    pub(crate) fn counter(self, stats: &Stats) -> &AtomicU64 {
        match self {
            Failure::Timeout => &stats.tls_handshake_failures_timeout,
            Failure::Closed => &stats.tls_handshake_failures_closed,
            Failure::NotTls => &stats.tls_handshake_failures_not_tls,
            Failure::Incompatible => &stats.tls_handshake_failures_incompatible,
            Failure::Refused => &stats.tls_handshake_failures_refused,
            Failure::ClientCertificate => &stats.tls_handshake_failures_client_certificate,
            Failure::Protocol => &stats.tls_handshake_failures_protocol,
            Failure::UnknownName => &stats.tls_handshake_failures_unknown_name,
            Failure::MadeRoom => &stats.tls_pending_closed,
        }
    }

    /// A rustls error as one of these.
    fn of(error: &rustls::Error) -> Failure {
        use rustls::InvalidMessage as M;
        match error {
            rustls::Error::InvalidMessage(M::InvalidContentType | M::UnknownProtocolVersion) => {
                Failure::NotTls
            }
            rustls::Error::PeerIncompatible(_) | rustls::Error::NoApplicationProtocol => {
                Failure::Incompatible
            }
            rustls::Error::General(m) if m == super::certs::NO_CERTIFICATE => Failure::UnknownName,
            rustls::Error::AlertReceived(_) => Failure::Refused,
            rustls::Error::NoCertificatesPresented | rustls::Error::InvalidCertificate(_) => {
                Failure::ClientCertificate
            }
            _ => Failure::Protocol,
        }
    }
}

impl Failure {
    /// In words, when the peer is a backend (re-encryption): the words of
    /// [`fmt::Display`] name the client.
    fn backend_words(self) -> &'static str {
        match self {
            Failure::Timeout => "the handshake did not finish in time",
            Failure::Closed => "the backend closed during the handshake",
            Failure::NotTls => "the backend does not speak TLS",
            Failure::Incompatible => "no TLS version or cipher in common",
            Failure::Refused => "the backend refused the handshake",
            Failure::ClientCertificate => {
                "the backend's certificate is not trusted (backend_tls_ca) \
                 or does not name it (backend_tls_server_name)"
            }
            Failure::Protocol => "a TLS protocol error",
            Failure::UnknownName => "no certificate for the backend's name",
            Failure::MadeRoom => "closed to make room for a new handshake (tls_max_pending)",
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Failure::Timeout => "the handshake did not finish in time",
            Failure::Closed => "the client closed during the handshake",
            Failure::NotTls => "the client does not speak TLS",
            Failure::Incompatible => "no TLS version or cipher in common",
            Failure::Refused => "the client refused the handshake",
            Failure::ClientCertificate => "the client's certificate is missing or not trusted",
            Failure::Protocol => "a TLS protocol error",
            Failure::UnknownName => "no certificate for the client's server name (tls_strict_sni)",
            Failure::MadeRoom => {
                "closed, stalled longest, to make room for a new client (tls_max_pending)"
            }
        })
    }
}

/// A connection's TLS sessions, on the heap (the worker's stack frames
/// under the pump stay as small as the plain path's): the client's when
/// its TLS is terminated here, the backend's when it is re-encrypted.
pub(crate) struct Sessions {
    /// The service's TLS as it was when the client came.
    pub(crate) edge: Arc<Terminator>,
    pub(crate) client: Option<Connection>,
    pub(crate) backend: Option<Connection>,
}

/// A fatal `unrecognized_name` alert (RFC 6066 §3), in clear: nothing was
/// sent to the client before its certificate was chosen.
const UNRECOGNIZED_NAME: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x70];

/// Boxed [`Sessions`].
pub(crate) type Session = Box<Sessions>;

impl Failed {
    /// In words, the peer a backend: for a refused certificate, why (its
    /// CA, `backend_tls_ca`, or its name, `backend_tls_server_name`).
    fn backend_words(&self) -> String {
        match &self.error {
            Some(rustls::Error::InvalidCertificate(e)) => format!(
                "the backend's certificate was refused: {}",
                super::words::certificate(e, "backend_tls_ca")
            ),
            _ => self.kind.backend_words().to_string(),
        }
    }
}

/// A failed handshake: its kind, and rustls's error when it had one (why
/// a certificate was refused, in detail).
struct Failed {
    kind: Failure,
    error: Option<rustls::Error>,
}

impl From<Failure> for Failed {
    fn from(kind: Failure) -> Failed {
        Failed { kind, error: None }
    }
}

/// Does one side's handshake on `sock` (made non-blocking here, as the
/// pump wants it) by `deadline`.
///
/// # Errors
///
/// Why it failed; any alert rustls has for the peer was sent (one try,
/// without waiting).
fn complete(conn: &mut Connection, sock: &TcpStream, deadline: Instant) -> Result<(), Failed> {
    sock.set_nonblocking(true).map_err(|_| Failure::Closed)?;
    let mut io = sock;
    while conn.is_handshaking() {
        if conn.wants_write() {
            match conn.write_tls(&mut io) {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => writable_by(sock, deadline)?,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return Err(Failure::Closed.into()),
            }
            continue;
        }
        match conn.read_tls(&mut io) {
            Ok(0) => return Err(Failure::Closed.into()),
            Ok(_) => {
                if let Err(e) = conn.process_new_packets() {
                    let failure = Failure::of(&e);
                    // The alert rustls queued, if the socket takes it now;
                    // for a name no certificate covers, the one the RFC
                    // names instead of rustls's access_denied.
                    let _ = match failure {
                        Failure::UnknownName => io.write(&UNRECOGNIZED_NAME),
                        _ => conn.write_tls(&mut io),
                    };
                    return Err(Failed {
                        kind: failure,
                        error: Some(e),
                    });
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                match readable_by(sock.as_raw_fd(), deadline) {
                    Ok(true) => {}
                    Ok(false) => return Err(Failure::Timeout.into()),
                    Err(_) => return Err(Failure::Closed.into()),
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Err(Failure::Closed.into()),
        }
    }
    Ok(())
}

/// The TLS of a worker's client, for a service with TLS on either side:
/// the client's handshake done (when terminated here), counted
/// (`tls_handshakes`, or the failure's counter) and, when it failed,
/// logged (debug; a refused client certificate at info, throttled, by
/// `client_cert`) with the client closed; `None` then. `queued_at`, when
/// it was accepted, orders it among the handshakes in progress.
#[cold]
#[inline(never)]
pub(crate) fn serve(
    edge: Arc<Terminator>,
    client: &TcpStream,
    stats: &Stats,
    peer: std::net::SocketAddr,
    queued_at: Instant,
) -> Option<Session> {
    let mut sessions = Box::new(Sessions {
        edge,
        client: None,
        backend: None,
    });
    let Some(config) = &sessions.edge.config else {
        return Some(sessions);
    };
    let deadline = Instant::now() + sessions.edge.handshake_timeout;
    // Among the handshakes in progress (`tls_max_pending`) until it ends.
    let ticket = sessions.edge.pending.enter(client, queued_at);
    let done = ServerConnection::new(Arc::clone(config))
        .map_err(|e| Failed {
            kind: Failure::of(&e),
            error: Some(e),
        })
        .and_then(|conn| {
            let conn = sessions.client.insert(Connection::Server(conn));
            complete(conn, client, deadline)
        });
    let done = match (done, ticket.leave()) {
        (_, true) => Err(Failure::MadeRoom.into()),
        (done, _) => done,
    };
    match done {
        Ok(()) => {
            Stats::incr(&stats.tls_handshakes);
            if trace::on() {
                if let Some(note) = sessions.note() {
                    trace::event(trace::Event::TlsHandshake {
                        version: note.version,
                        sni: note.sni.as_deref(),
                    });
                }
            }
            Some(sessions)
        }
        Err(Failed {
            kind: failure,
            error,
        }) => {
            Stats::incr(failure.counter(stats));
            // Taken whatever the failure, so none is left for the next.
            let names = super::client_cert::take_refused();
            match error.as_ref().and_then(super::client_cert::reason) {
                Some(why) => super::client_cert::log_refusal(peer, &why, names.as_ref()),
                None => log::debug!("client {peer}: TLS handshake failed: {failure}"),
            }
            let _ = client.shutdown(std::net::Shutdown::Both);
            None
        }
    }
}

impl Sessions {
    /// The client's TLS, for the access log: `None` when not terminated.
    pub(crate) fn note(&self) -> Option<Box<TlsNote>> {
        let Some(Connection::Server(conn)) = &self.client else {
            return None;
        };
        Some(Box::new(TlsNote {
            version: version(conn),
            sni: conn.server_name().map(str::to_string),
            client: conn
                .peer_certificates()
                .and_then(|chain| chain.first())
                .and_then(|cert| super::client_cert::names(cert.as_ref()))
                .map(|names| names.subject),
        }))
    }

    /// Re-encryption: the handshake with the backend `name` on `sock`, by
    /// `deadline`, when the service asks for it.
    ///
    /// # Errors
    ///
    /// Why it failed, in words.
    #[cold]
    #[inline(never)]
    pub(crate) fn reach_backend(
        &mut self,
        sock: &TcpStream,
        name: &str,
        deadline: Instant,
    ) -> io::Result<()> {
        let Some(tls) = &self.edge.backend else {
            return Ok(());
        };
        let Some(server) = tls.name_for(name) else {
            return Err(io::Error::new(
                ErrorKind::InvalidInput,
                format!("no server name for TLS to {name}: set backend_tls_server_name"),
            ));
        };
        let conn = rustls::ClientConnection::new(Arc::clone(&tls.config), server)
            .map_err(|e| io::Error::other(e.to_string()))?;
        let conn = self.backend.insert(Connection::Client(conn));
        complete(conn, sock, deadline).map_err(|f| {
            io::Error::other(format!(
                "TLS handshake with the backend failed: {}",
                f.backend_words()
            ))
        })
    }
}

/// Waits until `client` takes bytes again, or the deadline.
fn writable_by(client: &TcpStream, deadline: Instant) -> Result<(), Failure> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut fds = [libc::pollfd {
            fd: client.as_raw_fd(),
            events: libc::POLLOUT,
            revents: 0,
        }];
        match poll(&mut fds, millis_rounded_up(left)) {
            Ok(0) if Instant::now() >= deadline => return Err(Failure::Timeout),
            Ok(0) => continue,
            Ok(_) => return Ok(()),
            Err(_) => return Err(Failure::Closed),
        }
    }
}

/// The negotiated version, in the access log's words (`TLSv1.3`).
pub(crate) fn version(conn: &ServerConnection) -> &'static str {
    match conn.protocol_version() {
        Some(rustls::ProtocolVersion::TLSv1_3) => "TLSv1.3",
        Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2",
        _ => "-",
    }
}

/// An I/O error kind that means the peer went away.
pub(super) fn is_gone(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe
    )
}

#[cfg(test)]
mod tests {
    use super::{Failed, Failure};
    use rustls::CertificateError;

    /// A backend's refused certificate says whether its CA or its name
    /// was wrong.
    #[test]
    fn a_refused_backend_certificate_names_the_ca_or_the_name() {
        let failed = |e: CertificateError| Failed {
            kind: Failure::ClientCertificate,
            error: Some(rustls::Error::InvalidCertificate(e)),
        };
        let ca = failed(CertificateError::UnknownIssuer).backend_words();
        assert_eq!(
            ca,
            "the backend's certificate was refused: unknown issuer: \
             not signed by a CA of backend_tls_ca"
        );
        let name = failed(CertificateError::NotValidForNameContext {
            expected: rustls::pki_types::ServerName::try_from("b.test").unwrap(),
            presented: vec!["DnsName(\"a.test\")".into()],
        })
        .backend_words();
        assert!(
            name.contains("not valid for the name b.test (it names"),
            "{name}"
        );
        assert!(!name.contains("backend_tls_ca"), "{name}");
        let closed = Failed::from(Failure::Closed).backend_words();
        assert_eq!(closed, "the backend closed during the handshake");
    }

    /// A failed handshake with a backend is told in the backend's words,
    /// not the client's.
    #[test]
    fn a_backend_failure_names_the_backend() {
        for f in [
            Failure::Closed,
            Failure::NotTls,
            Failure::Refused,
            Failure::ClientCertificate,
        ] {
            let words = f.backend_words();
            assert!(words.contains("backend"), "{words}");
            assert!(!words.contains("client"), "{words}");
        }
    }
}
