//! The worker's side of `--accept-proxy`: whether a peer may send a PROXY
//! protocol header (`--accept-proxy-from`), reading it within
//! `--accept-proxy-timeout`, who the client then is ([`Origin`]), and the log
//! of refusals, one line per source at most once per [`REFUSAL_LOG_WINDOW`]
//! (the refusals in between are counted and given with the next line).
//!
//! # Threads
//!
//! Runs on the worker that took the client. The refusal log is the only
//! shared state: a small map behind a `parking_lot::Mutex`, held for a
//! lookup and never across I/O. No C counterpart: the C's clients connect
//! to it directly.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::{read_header, CidrList, Header, HeaderError};
use crate::throttle::LogThrottle;

/// How often one source's refused headers are logged, at most: once per
/// window, with the count of those refused silently since.
pub const REFUSAL_LOG_WINDOW: Duration = Duration::from_secs(10);

/// Most sources the refusal log remembers in one window. Past that, new
/// sources are counted and not logged until older ones age out, so a flood
/// from many addresses costs a bounded map, not an unbounded log.
const MAX_LOGGED_SOURCES: usize = 1024;

/// What `--accept-proxy` needs on the workers: who may send a header, how
/// long to wait for it, and the log of refusals.
#[derive(Debug)]
pub struct AcceptProxy {
    /// `--accept-proxy-from`: the peers allowed to send a header.
    pub trusted: CidrList,
    /// `--accept-proxy-timeout`: the longest wait for a complete header.
    pub timeout: Duration,
    log: RefusalLog,
}

impl AcceptProxy {
    /// The settings, with an empty refusal log.
    pub fn new(trusted: CidrList, timeout: Duration) -> AcceptProxy {
        AcceptProxy {
            trusted,
            timeout,
            log: RefusalLog::new(REFUSAL_LOG_WINDOW),
        }
    }

    /// Notes one refused header from `ip` at `now`: `Some(n)` when it is
    /// to be logged (`n` refusals from that source were silenced since its
    /// last line), `None` when it is only counted.
    pub(crate) fn note_refusal(&self, ip: IpAddr, now: Instant) -> Option<u64> {
        self.log.note(ip, now)
    }
}

/// Who the client is, as the backends taking the PROXY protocol are told:
/// the address the header gave (or the socket's peer), and the address it
/// connected to, read from the socket only when a backend needs it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Origin {
    /// The client's address.
    pub source: SocketAddr,
    /// The address the client connected to, when a header gave it.
    pub destination: Option<SocketAddr>,
}

impl Origin {
    /// The header to send a backend for this client.
    ///
    /// # Errors
    ///
    /// When the client socket's own address cannot be read.
    pub fn header(&self, client: &TcpStream) -> io::Result<Header> {
        let destination = match self.destination {
            Some(destination) => destination,
            None => client.local_addr()?,
        };
        Ok(Header::Proxy {
            source: self.source,
            destination,
        })
    }
}

/// Why a client behind `--accept-proxy` was closed before its header was
/// taken.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// Its peer is not in `--accept-proxy-from`.
    Untrusted,
    /// The header was malformed, too long, late, or the peer left.
    Header(HeaderError),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Untrusted => {
                f.write_str("not in --accept-proxy-from, so not trusted to send a PROXY header")
            }
            Refusal::Header(err) => write!(f, "{err}"),
        }
    }
}

/// Checks the peer, then reads its header (at most `accept.timeout`): who
/// the client is. A LOCAL header (the proxy's own health check) keeps the
/// connection's own endpoints.
///
/// # Errors
///
/// [`Refusal::Untrusted`] without reading anything, or the header's error.
pub(crate) fn receive(
    accept: &AcceptProxy,
    client: &TcpStream,
    peer: SocketAddr,
) -> Result<Origin, Refusal> {
    if !accept.trusted.contains(peer.ip()) {
        return Err(Refusal::Untrusted);
    }
    match read_header(client, accept.timeout).map_err(Refusal::Header)? {
        Header::Proxy {
            source,
            destination,
        } => Ok(Origin {
            source,
            destination: Some(destination),
        }),
        Header::Local => Ok(Origin {
            source: peer,
            destination: None,
        }),
    }
}

/// Remembers, per source address, a [`LogThrottle`] of one line per
/// window, so a source is logged at most once per window.
#[derive(Debug)]
struct RefusalLog {
    window: Duration,
    sources: Mutex<HashMap<IpAddr, LogThrottle>>,
}

impl RefusalLog {
    fn new(window: Duration) -> RefusalLog {
        RefusalLog {
            window,
            sources: Mutex::new(HashMap::new()),
        }
    }

    /// Notes one refusal from `ip` at `now`: `Some(n)` when it is to be
    /// logged (`n` refusals were silenced since the last line), `None` when
    /// it is only counted.
    fn note(&self, ip: IpAddr, now: Instant) -> Option<u64> {
        let mut sources = self.sources.lock();
        if let Some(throttle) = sources.get(&ip) {
            return throttle.event(now);
        }
        if sources.len() >= MAX_LOGGED_SOURCES {
            // A source whose window has passed would be logged again at
            // once: forgetting it loses only its silenced count.
            sources.retain(|_, throttle| !throttle.is_due(now));
            if sources.len() >= MAX_LOGGED_SOURCES {
                return None;
            }
        }
        let throttle = LogThrottle::since(self.window, now);
        let logged = throttle.event(now);
        sources.insert(ip, throttle);
        logged
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy_protocol::{encode, Version};
    use std::io::Write;
    use std::net::Ipv4Addr;

    use crate::test_support::pair;

    fn trusting_loopback(timeout: Duration) -> AcceptProxy {
        AcceptProxy::new(CidrList::loopback(), timeout)
    }

    #[test]
    fn a_trusted_header_gives_the_client_and_leaves_its_bytes() {
        let (mut c, s) = pair();
        let peer = c.local_addr().unwrap();
        c.write_all(b"PROXY TCP4 192.0.2.7 198.51.100.1 40000 443\r\nGET /")
            .unwrap();
        let origin = receive(&trusting_loopback(Duration::from_secs(5)), &s, peer).unwrap();
        assert_eq!(origin.source, "192.0.2.7:40000".parse().unwrap());
        assert_eq!(
            origin.destination,
            Some("198.51.100.1:443".parse().unwrap())
        );
        let mut rest = [0u8; 5];
        std::io::Read::read_exact(&mut &s, &mut rest).unwrap();
        assert_eq!(&rest, b"GET /");
        // What is passed on to a backend is the header's client.
        let header = origin.header(&s).unwrap();
        assert_eq!(
            encode(Version::V1, &header),
            b"PROXY TCP4 192.0.2.7 198.51.100.1 40000 443\r\n"
        );
    }

    #[test]
    fn a_local_header_keeps_the_connection_s_own_ends() {
        let (mut c, s) = pair();
        let peer = c.local_addr().unwrap();
        c.write_all(&encode(Version::V2, &Header::Local)).unwrap();
        let origin = receive(&trusting_loopback(Duration::from_secs(5)), &s, peer).unwrap();
        assert_eq!(origin.source, peer);
        assert_eq!(origin.destination, None);
        assert_eq!(
            origin.header(&s).unwrap(),
            Header::Proxy {
                source: peer,
                destination: s.local_addr().unwrap()
            }
        );
    }

    #[test]
    fn an_untrusted_peer_is_refused_before_anything_is_read() {
        let (mut c, s) = pair();
        let peer = c.local_addr().unwrap();
        c.write_all(b"PROXY TCP4 192.0.2.7 198.51.100.1 40000 443\r\n")
            .unwrap();
        let only_ten: CidrList = "10.0.0.0/8".parse().unwrap();
        let accept = AcceptProxy::new(only_ten, Duration::from_secs(5));
        let err = receive(&accept, &s, peer).unwrap_err();
        assert!(matches!(err, Refusal::Untrusted), "{err}");
        assert!(err.to_string().contains("--accept-proxy-from"));
    }

    #[test]
    fn a_malformed_or_oversized_header_is_refused() {
        let accept = trusting_loopback(Duration::from_secs(5));
        let (mut c, s) = pair();
        let peer = c.local_addr().unwrap();
        c.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        let err = receive(&accept, &s, peer).unwrap_err();
        assert!(
            matches!(err, Refusal::Header(HeaderError::NoSignature)),
            "{err}"
        );
        let (mut c, s) = pair();
        let peer = c.local_addr().unwrap();
        c.write_all(b"PROXY TCP4 192.0.2.7 nonsense 1 2\r\n")
            .unwrap();
        let err = receive(&accept, &s, peer).unwrap_err();
        assert!(
            matches!(err, Refusal::Header(HeaderError::V1Syntax(_))),
            "{err}"
        );
        let (mut c, s) = pair();
        let peer = c.local_addr().unwrap();
        let mut long = b"PROXY TCP4 ".to_vec();
        long.extend(std::iter::repeat(b'1').take(200));
        c.write_all(&long).unwrap();
        let err = receive(&accept, &s, peer).unwrap_err();
        assert!(
            matches!(err, Refusal::Header(HeaderError::TooLong { .. })),
            "{err}"
        );
    }

    #[test]
    fn a_silent_or_half_header_times_out_within_the_bound() {
        let accept = trusting_loopback(Duration::from_millis(200));
        let (mut c, s) = pair();
        let peer = c.local_addr().unwrap();
        c.write_all(b"PROXY TCP4 192.0").unwrap();
        let started = Instant::now();
        let err = receive(&accept, &s, peer).unwrap_err();
        let took = started.elapsed();
        assert!(
            matches!(
                err,
                Refusal::Header(HeaderError::Timeout { received: 16, .. })
            ),
            "{err}"
        );
        assert!(took >= Duration::from_millis(200), "{took:?}");
        assert!(took < Duration::from_secs(3), "{took:?}");
    }

    #[test]
    fn the_refusal_log_speaks_once_per_source_per_window() {
        let log = RefusalLog::new(Duration::from_secs(10));
        let t0 = Instant::now();
        let a = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
        let b = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3));
        assert_eq!(log.note(a, t0), Some(0));
        assert_eq!(log.note(a, t0 + Duration::from_secs(1)), None);
        assert_eq!(log.note(a, t0 + Duration::from_secs(2)), None);
        assert_eq!(
            log.note(b, t0 + Duration::from_secs(2)),
            Some(0),
            "another source"
        );
        // The next window logs again, with the count silenced meanwhile.
        assert_eq!(log.note(a, t0 + Duration::from_secs(10)), Some(2));
        assert_eq!(log.note(a, t0 + Duration::from_secs(11)), None);
    }

    #[test]
    fn the_refusal_log_stays_bounded() {
        let log = RefusalLog::new(Duration::from_secs(10));
        let t0 = Instant::now();
        for n in 0..MAX_LOGGED_SOURCES as u32 {
            assert_eq!(log.note(IpAddr::V4(Ipv4Addr::from(n)), t0), Some(0));
        }
        let late = IpAddr::V4(Ipv4Addr::new(10, 9, 9, 9));
        assert_eq!(log.note(late, t0), None, "full: counted only");
        assert_eq!(log.sources.lock().len(), MAX_LOGGED_SOURCES);
        // Once the window has passed, old entries make room.
        assert_eq!(log.note(late, t0 + Duration::from_secs(10)), Some(0));
        assert_eq!(log.sources.lock().len(), 1);
    }
}
