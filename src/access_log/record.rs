//! What one access log line says: a [`Record`], and [`End`], how the
//! connection ended, with its stable snake_case name.
//!
//! # Threads
//!
//! Plain values: built by a worker or the accept loop, sent to the writer.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C's `### REQUEST FINISHED ###` says none of this.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use crate::conduit::outcome as pump;

thread_local! {
    /// The server name of the client this worker serves now, set by SNI
    /// routing for the connection's lifetime (off the worker's stack).
    static SNI: std::cell::RefCell<Option<Box<str>>> = const { std::cell::RefCell::new(None) };
}

/// Puts the server name back to none when dropped, a panic included, so
/// that the thread's next client never inherits it.
#[must_use = "the server name lasts as long as the guard"]
#[derive(Debug)]
pub struct SniGuard(());

impl Drop for SniGuard {
    fn drop(&mut self) {
        SNI.with(|s| s.borrow_mut().take());
    }
}

/// Names `sni` on the access log lines this thread writes until the guard
/// is dropped (SNI routing names the client's server).
pub fn set_sni(sni: Option<Box<str>>) -> SniGuard {
    SNI.with(|s| *s.borrow_mut() = sni);
    SniGuard(())
}

/// Runs `serve` with `sni` as the server name of the access log lines
/// this thread writes meanwhile.
pub fn with_sni<R>(sni: Option<Box<str>>, serve: impl FnOnce() -> R) -> R {
    let _guard = set_sni(sni);
    serve()
}

/// The server name set by [`with_sni`] on this thread, if any.
pub fn current_sni() -> Option<Box<str>> {
    SNI.with(|s| s.borrow().clone())
}

/// What is known about one client connection when it ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// When the client was accepted (as HAProxy's accept date); the line is
    /// written `duration` later.
    pub time: SystemTime,
    /// The client's address and port.
    pub client: SocketAddr,
    /// The service the client came to, when the process names its
    /// services (not on the one service of a flat configuration).
    pub service: Option<std::sync::Arc<str>>,
    /// The server name the client's TLS ClientHello asked for, on an
    /// address routed by SNI (see [`with_sni`]); `None` elsewhere.
    pub sni: Option<Box<str>>,
    /// The backend that served the client, or the one tried last when none
    /// could be reached; `None` when no backend was picked at all.
    pub backend: Option<String>,
    /// From the accept to a worker taking the client from the queue.
    pub queue_wait: Duration,
    /// From the first connect attempt to the backend connection that served
    /// the client, failed attempts included; `None` when no backend was
    /// connected.
    pub connect_time: Option<Duration>,
    /// From the accept to the end of the connection: queue, connect and
    /// transfer together.
    pub duration: Duration,
    /// Backend connects that failed for this client before the one that
    /// served it (or before giving up, for [`End::ConnectFailed`]).
    pub failovers: u32,
    /// What ended the tries before every candidate backend was tried:
    /// `connect_retries` or `connect_retry_budget`; `None` when they ran
    /// their course (one answered, or none was left).
    pub failovers_ended: Option<TriesEnded>,
    /// Bytes read from the client and written to the backend.
    pub bytes_to_backend: u64,
    /// Bytes read from the backend and written to the client.
    pub bytes_to_client: u64,
    /// How the connection ended (on an [`Phase::End`] line; the others
    /// carry a placeholder, unwritten).
    pub end: End,
    /// Which line this is: the end (the only one by default), the
    /// connect (`access_log_at_connect`) or an interim one
    /// (`access_log_interval`, with the bytes since the line before).
    pub phase: Phase,
    /// The client's TLS, when the balancer terminated it: the version
    /// negotiated and the server name it asked for.
    pub tls: Option<TlsNote>,
}

/// Which of a connection's lines a [`Record`] is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Phase {
    /// `end`: the connection is over (the one line written by default).
    #[default]
    End,
    /// `connect`: its backend was just connected.
    Connect,
    /// `interim`: it is still open; the bytes are those since its last line.
    Interim,
}

impl Phase {
    /// `end`, `connect` or `interim`.
    pub fn name(self) -> &'static str {
        match self {
            Phase::End => "end",
            Phase::Connect => "connect",
            Phase::Interim => "interim",
        }
    }

    /// Whether this is the line at the end.
    pub fn is_end(self) -> bool {
        self == Phase::End
    }
}

/// What ended a client's fail-over while untried backends were left,
/// written after the count of failovers: `failovers=1/retries`,
/// `failovers=3/budget`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TriesEnded {
    /// `retries`: `connect_retries` other backends were tried.
    Retries,
    /// `budget`: `connect_retry_budget` was spent.
    Budget,
}

impl TriesEnded {
    /// `retries` or `budget`.
    pub fn name(self) -> &'static str {
        match self {
            TriesEnded::Retries => "retries",
            TriesEnded::Budget => "budget",
        }
    }
}

/// What the access log and the trace say of a terminated TLS client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsNote {
    /// `TLSv1.3` or `TLSv1.2`.
    pub version: &'static str,
    /// The server name (SNI) the client asked for, if any.
    pub sni: Option<String>,
    /// The subject of the client's certificate (`tls_client_ca`), RFC
    /// 4514 (`CN=alice,O=Example`); `None` when none was asked for.
    pub client: Option<String>,
}

/// How a connection ended. Each has a stable snake_case name, written in
/// both formats ([`End::name`]).
///
/// A connection has one end, the first that happened: a client reset after a
/// fail-over is `client_reset` (with [`Record::failovers`] still counted);
/// `failed_over` is a connection that was served after failed connects and
/// then closed cleanly by either side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// A served connection that ended as the pump saw it end, named by
    /// `pumped_name`: `client_closed`, `backend_closed`, `client_reset`,
    /// `backend_reset`, `idle_timeout`, `fin_timeout`. A failed write or
    /// another error of the pump is [`End::Error`], built by
    /// [`End::pumped`].
    Pumped(pump::End),
    /// `first_byte_timeout`: the client sent nothing within
    /// `--client-first-byte-timeout`.
    FirstByteTimeout,
    /// `proxy_header_refused`: with `--accept-proxy`, no valid PROXY
    /// protocol header from a trusted peer in time.
    ProxyHeaderRefused,
    /// `connect_failed`: no backend could be reached (every connect failed),
    /// with why the last one failed in a word or two (`refused`,
    /// `timeout`, `unreachable`, or the system's words: see
    /// [`crate::system::error_words`]).
    ConnectFailed(String),
    /// `failed_over`: served by a backend after one or more failed connects
    /// ([`Record::failovers`] says how many), then closed cleanly.
    FailedOver,
    /// `no_backend`: no backend was available (all down or drained).
    NoBackend,
    /// `rate_limited`: refused by the per-IP rate limiter at accept time.
    RateLimited,
    /// `denied`: refused by the `allow` and `deny` lists.
    Denied,
    /// `too_many_connections`: its address had as many connections
    /// open as the per-client cap allows.
    TooManyConnections,
    /// `queue_timeout`: waited in the queue for a worker, or for a backend
    /// slot, too long.
    QueueTimeout,
    /// `queue_full`: every backend was at its `max_connections` and the
    /// service's queue held `max_queue` clients already.
    QueueFull,
    /// `no_service_for_sni`: on an address shared by SNI, no service
    /// claims the name the client asked for (or it sent none, or no
    /// ClientHello in time) and none is the default.
    NoServiceForSni,
    /// `drain_cut`: still in flight at the end of `--drain-timeout`, and cut.
    DrainCut,
    /// `error`: any other failure, with a short reason (one line, e.g. the
    /// `io::Error` message).
    Error(String),
}

/// The access log's name of each way the pump ends; `None` for the ends
/// logged as `error` with a reason (a failed write, the pump's own error).
pub fn pumped_name(end: pump::End) -> Option<&'static str> {
    match end {
        pump::End::ClientClosed => Some("client_closed"),
        pump::End::BackendClosed => Some("backend_closed"),
        pump::End::ClientReset => Some("client_reset"),
        pump::End::BackendReset => Some("backend_reset"),
        pump::End::IdleTimeout => Some("idle_timeout"),
        pump::End::FinTimeout => Some("fin_timeout"),
        pump::End::Killed(kill) => Some(kill.word()),
        pump::End::WriteToClientFailed | pump::End::WriteToBackendFailed | pump::End::Error => None,
    }
}

impl End {
    /// The end of a served connection the pump ended with `end` (and
    /// `error`, the I/O error behind it, if any).
    pub fn pumped(end: pump::End, error: Option<&io::Error>) -> End {
        match (pumped_name(end), error) {
            (Some(_), _) => End::Pumped(end),
            (None, Some(err)) => End::Error(format!("{end}: {err}")),
            (None, None) => End::Error(end.to_string()),
        }
    }

    /// The stable snake_case name: `client_closed`, `backend_closed`, ...
    pub fn name(&self) -> &'static str {
        match self {
            End::Pumped(end) => pumped_name(*end).unwrap_or("error"),
            End::FirstByteTimeout => "first_byte_timeout",
            End::ProxyHeaderRefused => "proxy_header_refused",
            End::ConnectFailed(_) => "connect_failed",
            End::FailedOver => "failed_over",
            End::NoBackend => "no_backend",
            End::RateLimited => "rate_limited",
            End::Denied => "denied",
            End::TooManyConnections => "too_many_connections",
            End::QueueTimeout => "queue_timeout",
            End::QueueFull => "queue_full",
            End::NoServiceForSni => "no_service_for_sni",
            End::DrainCut => "drain_cut",
            End::Error(_) => "error",
        }
    }

    /// The reason of [`End::Error`] and [`End::ConnectFailed`]; `None` for
    /// the other ends.
    pub fn reason(&self) -> Option<&str> {
        match self {
            End::Error(reason) | End::ConnectFailed(reason) => Some(reason),
            _ => None,
        }
    }
}

impl fmt::Display for End {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_name_lasts_the_call_only_even_through_a_panic() {
        assert_eq!(current_sni(), None);
        let inside = with_sni(Some("a.test".into()), current_sni);
        assert_eq!(inside.as_deref(), Some("a.test"));
        assert_eq!(current_sni(), None);
        let caught = std::panic::catch_unwind(|| with_sni(Some("b.test".into()), || panic!("x")));
        assert!(caught.is_err());
        assert_eq!(current_sni(), None);
    }
}
