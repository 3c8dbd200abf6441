//! The `tls` check of a service that re-encrypts (`backend_tls`): a whole
//! rustls handshake with the client configuration the workers use toward
//! the backends (the CAs of `backend_tls_ca` or the system's bundle, the
//! name of `backend_tls_server_name` or the backend's host), so a backend
//! whose certificate the workers would refuse (untrusted, expired, for
//! another name) is marked down before a client meets it.
//!
//! Without `backend_tls` the `tls` check stays the lighter one of
//! `tls.rs` (a ClientHello, a ServerHello back).
//!
//! # Threads
//!
//! Runs on the health checker's probe thread, on the stream it is given;
//! shares only the client configuration (read-only). No C counterpart.

use std::io::{self, ErrorKind};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::{CertificateError, ClientConnection};

use crate::tls_term::backend::BackendTls;

/// A verified handshake with the backend `name` (`HOST:PORT` as written)
/// on `stream`, by `deadline`; then a `close_notify`, and the stream
/// half-closed. Healthy: the version and the name verified.
///
/// Every read and write is bounded by the time left, so a server that
/// stalls or trickles its bytes holds the check until `deadline` at most.
///
/// # Errors
///
/// Why, in words: `certificate verification failed: not signed by a
/// trusted CA`, `timed out waiting for the TLS handshake`.
pub(crate) fn handshake(
    tls: &BackendTls,
    name: &str,
    stream: &mut TcpStream,
    deadline: Instant,
) -> Result<String, String> {
    let Some(server) = tls.name_for(name) else {
        return Err(format!(
            "no server name for TLS to {name}: set backend_tls_server_name"
        ));
    };
    let shown = server.to_str().into_owned();
    let mut conn = ClientConnection::new(Arc::clone(&tls.config), server)
        .map_err(|e| format!("cannot start the handshake: {}", words(&e)))?;
    while conn.is_handshaking() {
        if conn.wants_write() {
            set_timeout(stream, deadline, true)?;
            conn.write_tls(stream)
                .map_err(|e| io_words(&e, "sending"))?;
            continue;
        }
        set_timeout(stream, deadline, false)?;
        match conn.read_tls(stream) {
            Ok(0) => return Err("the server closed the connection during the handshake".into()),
            Ok(_) => {}
            Err(e) => return Err(io_words(&e, "reading")),
        }
        if let Err(e) = conn.process_new_packets() {
            // The alert rustls queued for the server, if it takes it now.
            let _ = conn.write_tls(stream);
            return Err(words(&e));
        }
    }
    let version = match conn.protocol_version() {
        Some(rustls::ProtocolVersion::TLSv1_3) => "TLSv1.3",
        Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2",
        _ => "TLS",
    };
    // Say goodbye as a client does: close_notify, then our side closed.
    conn.send_close_notify();
    if set_timeout(stream, deadline, true).is_ok() {
        let _ = conn.write_tls(stream);
    }
    let _ = stream.shutdown(Shutdown::Write);
    Ok(format!(
        "a verified handshake ({version}, certificate valid for {shown})"
    ))
}

/// Sets the read (or write) timeout to the time left before `deadline`;
/// an error once it has passed (a zero timeout would block forever).
fn set_timeout(stream: &TcpStream, deadline: Instant, write: bool) -> Result<(), String> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left < Duration::from_millis(1) {
        return Err("timed out waiting for the TLS handshake".into());
    }
    let set = if write {
        stream.set_write_timeout(Some(left))
    } else {
        stream.set_read_timeout(Some(left))
    };
    set.map_err(|e| format!("cannot set the socket's timeout: {e}"))
}

/// An I/O error of the handshake, in words.
fn io_words(error: &io::Error, doing: &str) -> String {
    match error.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => {
            "timed out waiting for the TLS handshake".into()
        }
        ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe => {
            "the server closed the connection during the handshake".into()
        }
        // rustls's own limits (a message too large) come as InvalidData.
        ErrorKind::InvalidData => format!("a malformed TLS message: {error}"),
        _ => format!("{doing} the handshake: {error}"),
    }
}

/// A rustls error of the client side, in the operator's words.
fn words(error: &rustls::Error) -> String {
    use rustls::InvalidMessage as M;
    match error {
        rustls::Error::InvalidCertificate(e) => {
            format!("certificate verification failed: {}", certificate_words(e))
        }
        rustls::Error::InvalidMessage(M::InvalidContentType | M::UnknownProtocolVersion) => {
            "the server does not speak TLS (its first bytes are not a TLS record)".into()
        }
        rustls::Error::InvalidMessage(_) => "a malformed TLS message from the server".into(),
        rustls::Error::AlertReceived(alert) => format!(
            "the server refused the handshake (alert: {})",
            spaced(&format!("{alert:?}"))
        ),
        rustls::Error::PeerIncompatible(_) => "no TLS version or cipher in common".into(),
        rustls::Error::NoCertificatesPresented => "the server presented no certificate".into(),
        other => format!("a TLS protocol error: {other}"),
    }
}

/// Why a certificate was refused, in the words the workers use.
fn certificate_words(error: &CertificateError) -> String {
    crate::tls_term::words::certificate(error, "backend_tls_ca")
}

/// `HandshakeFailure` as `handshake failure`, as the workers word it.
fn spaced(camel: &str) -> String {
    crate::tls_term::words::spaced(camel)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_read_as_words() {
        assert_eq!(spaced("HandshakeFailure"), "handshake failure");
        assert_eq!(spaced("Other(OtherError)"), "other");
        let e = rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer);
        assert!(words(&e).contains("unknown issuer"), "{}", words(&e));
        let e = rustls::Error::InvalidCertificate(CertificateError::Expired);
        assert_eq!(words(&e), "certificate verification failed: expired");
        // A self-signed backend certificate with CA:TRUE.
        let e = rustls::Error::InvalidCertificate(CertificateError::Other(rustls::OtherError(
            Arc::new(webpki::Error::CaUsedAsEndEntity),
        )));
        assert!(words(&e).contains("CA:TRUE"), "{}", words(&e));
        assert!(!words(&e).ends_with("other"), "{}", words(&e));
        let e = rustls::Error::AlertReceived(rustls::AlertDescription::BadCertificate);
        assert!(
            words(&e).ends_with("(alert: bad certificate)"),
            "{}",
            words(&e)
        );
        let e = io::Error::from(ErrorKind::WouldBlock);
        assert_eq!(
            io_words(&e, "reading"),
            "timed out waiting for the TLS handshake"
        );
    }
}
