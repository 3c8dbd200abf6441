//! One active check of one backend: `tcp` (connect, close), `http` (`GET`
//! the health path, a 2xx or 3xx status is healthy), or one of the
//! [`protocol`] checks (redis, tls, smtp, mysql, pgsql, send-expect).
//!
//! A backend that takes the PROXY protocol refuses a connection without a
//! header and logs it as broken, so every check to it opens with one that
//! says "this connection is the balancer's own" (v2 `LOCAL`, v1 `PROXY
//! UNKNOWN`, HAProxy's `check-send-proxy`). A failure of this host (`EMFILE`
//! at the descriptor ceiling, `EADDRNOTAVAIL` out of ports) is told apart
//! here, where the I/O happens ([`CheckFailure::local`], from
//! [`system::is_local_failure`]), and not counted against the backend.
//!
//! # Threads
//!
//! Runs on the checker's short-lived probe threads, one per backend per
//! round; it shares nothing but the backend (read only).
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C never checks a backend.

use std::fmt;
use std::io::{self, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::protocol::{self, ProtocolCheck};
use super::{CheckKind, HealthConfig};
use crate::backend::Backend;
use crate::proxy_protocol::{self, Header};
use crate::system;
use crate::tls_term::backend::BackendTls;

/// Why a check failed, and whether the backend is to blame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckFailure {
    /// What went wrong, for the log: `connect: Connection refused (os
    /// error 111)`, `GET /health answered 500`.
    pub reason: String,
    /// True when it went wrong on this host ([`system::is_local_failure`]:
    /// no file descriptor, memory, buffer or local port left): the check
    /// says nothing about the backend then.
    pub local: bool,
}

impl CheckFailure {
    /// A failure of `context` with the I/O error `err`, local or not as
    /// the error says.
    fn io(context: impl fmt::Display, err: &io::Error) -> CheckFailure {
        CheckFailure {
            reason: format!("{context}: {err}"),
            local: system::is_local_failure(err),
        }
    }
}

/// What the backend did wrong (a refusal, a bad answer, silence).
impl From<String> for CheckFailure {
    fn from(reason: String) -> CheckFailure {
        CheckFailure {
            reason,
            local: false,
        }
    }
}

impl fmt::Display for CheckFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

/// Runs one active check of `backend`.
///
/// # Errors
///
/// Why the backend is considered unhealthy, for the log, or why the check
/// could not be made here ([`CheckFailure::local`]).
pub fn check(backend: &Backend, config: &HealthConfig) -> std::result::Result<(), CheckFailure> {
    answer(backend, config).map(drop)
}

/// [`check`] for a service that re-encrypts: its `tls` check is a whole
/// handshake with `tls`, the workers' client configuration toward the
/// backends ([`protocol::tls_verified`]). Without `tls`, [`check`].
pub(crate) fn check_with(
    backend: &Backend,
    config: &HealthConfig,
    tls: Option<&BackendTls>,
) -> std::result::Result<(), CheckFailure> {
    match tls {
        Some(tls) if config.check == CheckKind::Tls => {
            let deadline = Instant::now() + config.timeout;
            let mut stream = dial(backend, config.timeout)?;
            protocol::tls_verified::handshake(tls, backend.name(), &mut stream, deadline)
                .map(drop)
                .map_err(|reason| CheckFailure::from(format!("tls: {reason}")))
        }
        _ => check(backend, config),
    }
}

/// [`check`], saying on success what the backend answered, in a few
/// words: `connected`, `answered "HTTP/1.1 200 OK"`, or the [`protocol`]
/// check's ([`protocol::answer`]). `rodizio probe` prints it.
///
/// # Errors
///
/// As [`check`].
pub fn answer(
    backend: &Backend,
    config: &HealthConfig,
) -> std::result::Result<String, CheckFailure> {
    match config.check {
        CheckKind::Off => Ok("not checked".into()),
        CheckKind::Tcp => dial(backend, config.timeout).map(|_| "connected".into()),
        CheckKind::Http => check_http(backend, &config.path, config.timeout),
        kind => check_protocol(backend, kind, config),
    }
}

/// Connects, then runs the [`protocol`] check of `kind`, all within the
/// check's timeout.
fn check_protocol(
    backend: &Backend,
    kind: CheckKind,
    config: &HealthConfig,
) -> std::result::Result<String, CheckFailure> {
    let deadline = Instant::now() + config.timeout;
    let check = match kind {
        CheckKind::Redis => ProtocolCheck::Redis,
        CheckKind::Tls => ProtocolCheck::Tls,
        CheckKind::Smtp => ProtocolCheck::Smtp,
        CheckKind::Mysql => ProtocolCheck::Mysql {
            user: config.user.clone(),
        },
        CheckKind::Pgsql => ProtocolCheck::Pgsql {
            user: config.user.clone().unwrap_or_else(|| "rodizio".into()),
        },
        CheckKind::SendExpect => ProtocolCheck::SendExpect {
            send: config.send.clone().unwrap_or_default(),
            expect: config.expect.clone().unwrap_or_default(),
        },
        CheckKind::Tcp | CheckKind::Http | CheckKind::Off => return Ok("not checked".into()),
    };
    let mut stream = dial(backend, config.timeout)?;
    // Once connected, what goes wrong is the backend's answer (or its
    // silence): the protocol checks report it as text.
    protocol::answer(&check, &mut stream, deadline).map_err(CheckFailure::from)
}

/// Connects to `backend` within `timeout` and, if it takes the PROXY
/// protocol, sends the LOCAL header (see the module docs). A backend whose
/// own check names another port or address is checked there
/// ([`Backend::check_addrs`]), with no PROXY header: that is another
/// server (an HTTP status endpoint beside a database), which does not
/// take the header its clients' port does.
fn dial(backend: &Backend, timeout: Duration) -> std::result::Result<TcpStream, CheckFailure> {
    let elsewhere = backend.own_check().moves();
    let mut stream = if elsewhere {
        crate::dial::connect_any(&backend.check_addrs(), timeout)
    } else {
        backend.connect(timeout)
    }
    .map_err(|e| CheckFailure::io("connect", &e))?;
    if let Some(version) = backend.send_proxy().filter(|_| !elsewhere) {
        // The connect's write timeout (SO_SNDTIMEO) bounds this write.
        stream
            .write_all(&proxy_protocol::encode(version, &Header::Local))
            .map_err(|e| CheckFailure::io("sending the PROXY protocol header", &e))?;
    }
    Ok(stream)
}

/// `GET path` with `Connection: close`; healthy on a 2xx or 3xx status,
/// answered with the status line.
fn check_http(
    backend: &Backend,
    path: &str,
    timeout: Duration,
) -> std::result::Result<String, CheckFailure> {
    let deadline = Instant::now() + timeout;
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    let mut stream = dial(backend, timeout)?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: rodizio-health\r\nConnection: close\r\n\r\n",
        backend
            .check_target()
            .unwrap_or_else(|| backend.name().to_string())
    );
    let io_err = |e: io::Error| CheckFailure::io(format_args!("GET {path}"), &e);
    stream.set_write_timeout(Some(left())).map_err(io_err)?;
    stream.write_all(request.as_bytes()).map_err(io_err)?;
    // Only the status line matters: read until its end, at most 256 bytes.
    let mut head = [0u8; 256];
    let mut len = 0;
    while len < head.len() && !head[..len].contains(&b'\n') {
        stream.set_read_timeout(Some(left())).map_err(io_err)?;
        match stream.read(&mut head[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(io_err(e)),
        }
    }
    let line = String::from_utf8_lossy(&head[..len]);
    let line = line.lines().next().unwrap_or("");
    let status = parse_status(line)
        .ok_or_else(|| format!("GET {path}: not an HTTP status line: {:?}", truncate(line)))?;
    if (200..400).contains(&status) {
        Ok(format!("answered {:?}", truncate(line)))
    } else {
        Err(format!("GET {path} answered {status}").into())
    }
}

/// The code of an `HTTP/1.x NNN reason` line.
fn parse_status(line: &str) -> Option<u16> {
    let mut words = line.split_whitespace();
    if !words.next()?.starts_with("HTTP/") {
        return None;
    }
    words
        .next()?
        .parse()
        .ok()
        .filter(|c| (100..1000).contains(c))
}

fn truncate(line: &str) -> &str {
    match line.char_indices().nth(60) {
        Some((i, _)) => &line[..i],
        None => line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::thread;

    #[test]
    fn parses_status_lines() {
        assert_eq!(parse_status("HTTP/1.1 200 OK"), Some(200));
        assert_eq!(parse_status("HTTP/1.0 302 Found"), Some(302));
        assert_eq!(parse_status("SSH-2.0-OpenSSH"), None);
        assert_eq!(parse_status("HTTP/1.1 abc"), None);
        assert_eq!(parse_status(""), None);
    }

    /// A backend on a listener that answers each connection with `reply`.
    fn answering(reply: &'static str) -> (Backend, thread::JoinHandle<()>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut buf = [0u8; 512];
            let n = s.read(&mut buf).unwrap();
            assert!(buf[..n].starts_with(b"GET /health HTTP/1.1\r\n"));
            s.write_all(reply.as_bytes()).unwrap();
        });
        (Backend::new(addr.to_string(), vec![addr], 1), t)
    }

    fn http_config() -> HealthConfig {
        HealthConfig {
            check: CheckKind::Http,
            timeout: Duration::from_secs(2),
            ..HealthConfig::default()
        }
    }

    #[test]
    fn http_check_wants_2xx_or_3xx() {
        for (reply, healthy) in [
            ("HTTP/1.1 200 OK\r\n\r\n", true),
            ("HTTP/1.0 301 Moved\r\nLocation: /\r\n\r\n", true),
            ("HTTP/1.1 500 Internal Server Error\r\n\r\n", false),
            ("HTTP/1.1 404 Not Found\r\n\r\n", false),
            ("garbage\r\n", false),
        ] {
            let (b, t) = answering(reply);
            let result = check(&b, &http_config());
            assert_eq!(result.is_ok(), healthy, "{reply:?}: {result:?}");
            t.join().unwrap();
        }
        // What it answered, for `rodizio probe`.
        let (b, t) = answering("HTTP/1.1 204 No Content\r\n\r\n");
        assert_eq!(
            answer(&b, &http_config()),
            Ok("answered \"HTTP/1.1 204 No Content\"".into())
        );
        t.join().unwrap();
    }

    #[test]
    fn checks_to_a_proxy_protocol_backend_open_with_a_local_header() {
        use crate::proxy_protocol::Version;
        for (version, kind) in [
            (Version::V2, CheckKind::Tcp),
            (Version::V1, CheckKind::Http),
        ] {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let t = thread::spawn(move || {
                let (s, _) = l.accept().unwrap();
                let header = proxy_protocol::read_header(&s, Duration::from_secs(5)).unwrap();
                let mut rest = Vec::new();
                if kind == CheckKind::Http {
                    let mut buf = [0u8; 512];
                    let n = (&s).read(&mut buf).unwrap();
                    rest.extend_from_slice(&buf[..n]);
                    (&s).write_all(b"HTTP/1.1 200 OK\r\n\r\n").unwrap();
                }
                (header, rest)
            });
            let b = Backend::new(addr.to_string(), vec![addr], 1).with_send_proxy(Some(version));
            let c = HealthConfig {
                check: kind,
                ..http_config()
            };
            check(&b, &c).unwrap();
            let (header, rest) = t.join().unwrap();
            assert_eq!(header, Header::Local, "{version}");
            if kind == CheckKind::Http {
                assert!(rest.starts_with(b"GET /health HTTP/1.1\r\n"), "{rest:?}");
            }
        }
    }

    #[test]
    fn checks_fail_on_refused_and_on_silence() {
        // Refused: a port nobody listens on any more.
        let addr = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let gone = Backend::new("gone".into(), vec![addr], 1);
        for kind in [CheckKind::Tcp, CheckKind::Http] {
            let c = HealthConfig {
                check: kind,
                ..HealthConfig::default()
            };
            let failure = check(&gone, &c).unwrap_err();
            // Refused by the backend's host: the backend's fault.
            assert!(!failure.local, "{failure}");
        }
        // Silence: accepted (by the kernel) but never answered.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let mute = Backend::new("mute".into(), vec![addr], 1);
        let c = HealthConfig {
            timeout: Duration::from_millis(200),
            ..http_config()
        };
        let started = Instant::now();
        let err = check(&mute, &c).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(2), "{err}");
        // A TCP check passes on the same backend: it does connect.
        let tcp = HealthConfig {
            check: CheckKind::Tcp,
            ..c
        };
        assert!(check(&mute, &tcp).is_ok());
        drop(l);
    }

    #[test]
    fn a_failure_of_this_host_is_told_from_the_backends() {
        let os = io::Error::from_raw_os_error;
        for code in [
            libc::EMFILE,
            libc::ENFILE,
            libc::ENOBUFS,
            libc::EADDRNOTAVAIL,
        ] {
            let failure = CheckFailure::io("connect", &os(code));
            assert!(failure.local, "{failure}");
            assert!(failure.reason.starts_with("connect: "), "{failure}");
        }
        for code in [libc::ECONNREFUSED, libc::EHOSTUNREACH, libc::ECONNRESET] {
            assert!(!CheckFailure::io("connect", &os(code)).local);
        }
        // A bad answer is always the backend's.
        let answered = CheckFailure::from("GET /health answered 500".to_string());
        assert!(!answered.local);
        assert_eq!(answered.to_string(), "GET /health answered 500");
    }
}
