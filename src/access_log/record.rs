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

use crate::proxy::pump;

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
    /// Bytes read from the client and written to the backend.
    pub bytes_to_backend: u64,
    /// Bytes read from the backend and written to the client.
    pub bytes_to_client: u64,
    /// How the connection ended.
    pub end: End,
    /// The client's TLS, when the balancer terminated it: the version
    /// negotiated and the server name it asked for.
    pub tls: Option<TlsNote>,
}

/// What the access log and the trace say of a terminated TLS client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsNote {
    /// `TLSv1.3` or `TLSv1.2`.
    pub version: &'static str,
    /// The server name (SNI) the client asked for, if any.
    pub sni: Option<String>,
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
    /// `queue_timeout`: waited in the queue for a worker too long.
    QueueTimeout,
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
            End::QueueTimeout => "queue_timeout",
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
