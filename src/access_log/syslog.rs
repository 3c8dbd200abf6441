//! The access log to a syslog daemon (`access_log_target: syslog:ADDR`):
//! each line one datagram, framed as RFC 5424 says, over UDP or a Unix
//! datagram socket (`/dev/log`, or rsyslog's `imuxsock` socket of one's
//! own).
//!
//! Sends never block: the socket is non-blocking, so a receiver that is
//! gone (`ECONNREFUSED`, `ENOENT`), full or slow (`EAGAIN`) costs the line,
//! counted as undelivered by the writer, and never a wait. The workers do
//! not send at all: they queue to the writer thread (`writer.rs`).
//!
//! # Threads
//!
//! Only the writer thread sends.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::fmt;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::SystemTime;

use super::format::Rfc3339;
use crate::error::{Error, Result};

/// The longest datagram sent: a line beyond it is cut (at a character's
/// edge). RFC 5424 asks receivers to take 2048 bytes and allows more;
/// rsyslog takes 8 KiB by default.
pub const MAX_DATAGRAM: usize = 8 * 1024;

/// `<PRI>` of every line: facility local0 (16), severity informational
/// (6), as HAProxy's logs default to a local facility.
const PRI: u8 = 16 * 8 + 6;

/// Where the syslog daemon listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyslogAddr {
    /// A UDP address, `127.0.0.1:514`.
    Udp(SocketAddr),
    /// A Unix datagram socket's path, `/dev/log`.
    Unix(PathBuf),
}

impl FromStr for SyslogAddr {
    type Err = Error;

    /// An absolute path (a Unix datagram socket) or `HOST:PORT` (UDP,
    /// an IP address: no name is looked up).
    fn from_str(text: &str) -> Result<SyslogAddr> {
        if text.starts_with('/') {
            return Ok(SyslogAddr::Unix(PathBuf::from(text)));
        }
        text.parse().map(SyslogAddr::Udp).map_err(|_| {
            Error::InvalidConfig(format!(
                "syslog address '{text}': expected IP:PORT (UDP) or an absolute path \
                 (a Unix datagram socket)"
            ))
        })
    }
}

impl fmt::Display for SyslogAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SyslogAddr::Udp(addr) => write!(f, "{addr}"),
            SyslogAddr::Unix(path) => write!(f, "{}", path.display()),
        }
    }
}

/// A non-blocking sender of framed lines to one syslog address.
pub(super) struct Syslog {
    socket: Socket,
    addr: SyslogAddr,
    /// `HOSTNAME APP-NAME PROCID MSGID STRUCTURED-DATA`, the same on every
    /// line.
    header: String,
    /// The datagram being framed, reused.
    datagram: Vec<u8>,
}

enum Socket {
    Udp(UdpSocket),
    Unix(UnixDatagram),
}

impl Syslog {
    /// A socket for `addr`, non-blocking; nothing is sent yet, so a
    /// daemon not yet started is no error here.
    pub(super) fn open(addr: &SyslogAddr) -> io::Result<Syslog> {
        let socket = match addr {
            SyslogAddr::Udp(to) => {
                let any: SocketAddr = if to.is_ipv4() {
                    "0.0.0.0:0".parse().unwrap_or(*to)
                } else {
                    "[::]:0".parse().unwrap_or(*to)
                };
                let socket = UdpSocket::bind(any)?;
                socket.connect(to)?;
                socket.set_nonblocking(true)?;
                Socket::Udp(socket)
            }
            SyslogAddr::Unix(_) => {
                let socket = UnixDatagram::unbound()?;
                socket.set_nonblocking(true)?;
                Socket::Unix(socket)
            }
        };
        Ok(Syslog {
            socket,
            addr: addr.clone(),
            header: format!("{} rodizio {} access -", hostname(), std::process::id()),
            datagram: Vec::with_capacity(MAX_DATAGRAM),
        })
    }

    /// Sends `line` (without its newline) as one RFC 5424 message:
    /// `<134>1 TIME HOST rodizio PID access - LINE`. An error is the
    /// line lost (the receiver gone, full or slow).
    pub(super) fn send(&mut self, line: &[u8]) -> io::Result<()> {
        self.datagram.clear();
        let head = format!("<{PRI}>1 {} {} ", Rfc3339(SystemTime::now()), self.header);
        self.datagram.extend_from_slice(head.as_bytes());
        let room = MAX_DATAGRAM.saturating_sub(self.datagram.len());
        self.datagram.extend_from_slice(cut(line, room));
        let sent = match (&self.socket, &self.addr) {
            (Socket::Udp(socket), _) => socket.send(&self.datagram),
            (Socket::Unix(socket), SyslogAddr::Unix(path)) => socket.send_to(&self.datagram, path),
            (Socket::Unix(_), SyslogAddr::Udp(_)) => {
                Err(io::Error::other("a Unix socket for a UDP address"))
            }
        };
        sent.map(drop)
    }

    /// The address, for the log's lines.
    pub(super) fn addr(&self) -> &SyslogAddr {
        &self.addr
    }
}

/// `line` cut to at most `room` bytes, at a UTF-8 character's edge.
fn cut(line: &[u8], room: usize) -> &[u8] {
    if line.len() <= room {
        return line;
    }
    let mut end = room;
    // Step back over continuation bytes (10xxxxxx).
    while end > 0 && line[end] & 0xC0 == 0x80 {
        end -= 1;
    }
    &line[..end]
}

/// This host's name for the HOSTNAME field (printable ASCII, at most
/// 255 bytes, as RFC 5424 wants), or `-` when it has none.
fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at
    // most that many bytes.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name: String = buf[..len]
        .iter()
        .filter(|b| b.is_ascii_graphic())
        .map(|&b| char::from(b))
        .collect();
    if rc != 0 || name.is_empty() {
        "-".into()
    } else {
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn addresses_parse_and_print_back() {
        for text in ["127.0.0.1:514", "[::1]:5514", "/dev/log", "/tmp/a b"] {
            assert_eq!(text.parse::<SyslogAddr>().unwrap().to_string(), text);
        }
        for bad in ["localhost:514", "514", "", "dev/log", "udp://1.2.3.4:5"] {
            let err = bad.parse::<SyslogAddr>().unwrap_err();
            assert!(err.to_string().contains("IP:PORT"), "{bad}: {err}");
        }
    }

    #[test]
    fn lines_are_cut_at_a_character_edge() {
        assert_eq!(cut(b"abc", 5), b"abc");
        assert_eq!(cut("aé".as_bytes(), 2), b"a");
        assert_eq!(cut("aéb".as_bytes(), 3), "aé".as_bytes());
        assert_eq!(cut(b"abc", 0), b"");
    }

    /// A fake receiver on UDP gets one RFC 5424 datagram per line, with
    /// its parts in order; a huge line is cut to [`MAX_DATAGRAM`].
    #[test]
    fn udp_lines_are_framed_as_rfc_5424() {
        let receiver = UdpSocket::bind("127.0.0.1:0").unwrap();
        receiver
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let addr = SyslogAddr::Udp(receiver.local_addr().unwrap());
        let mut syslog = Syslog::open(&addr).unwrap();
        syslog.send(b"127.0.0.1:5000 end=client_closed").unwrap();
        let mut buf = vec![0u8; 65536];
        let n = receiver.recv(&mut buf).unwrap();
        let got = std::str::from_utf8(&buf[..n]).unwrap();
        let parts: Vec<&str> = got.splitn(8, ' ').collect();
        assert_eq!(parts[0], "<134>1", "{got}");
        assert!(parts[1].ends_with('Z') && parts[1].contains('T'), "{got}");
        assert_eq!(
            parts[3..7],
            ["rodizio", &std::process::id().to_string(), "access", "-"]
        );
        assert_eq!(parts[7], "127.0.0.1:5000 end=client_closed");
        syslog.send(&vec![b'x'; 100_000]).unwrap();
        let n = receiver.recv(&mut buf).unwrap();
        assert_eq!(n, MAX_DATAGRAM);
    }

    /// A Unix receiver that is gone, then one that never reads: every
    /// send returns at once with an error (the line lost), never blocks.
    #[test]
    fn a_gone_or_full_unix_receiver_costs_the_line_not_a_wait() {
        let dir = std::env::temp_dir().join(format!("rodizio-syslog-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let path = dir.join("log.sock");
        let addr = SyslogAddr::Unix(path.clone());
        let mut syslog = Syslog::open(&addr).unwrap();
        assert!(syslog.send(b"nobody there").is_err());
        let receiver = UnixDatagram::bind(&path).unwrap();
        let started = std::time::Instant::now();
        let (mut sent, mut lost) = (0, 0);
        for _ in 0..10_000 {
            match syslog.send(&[b'y'; 1000]) {
                Ok(()) => sent += 1,
                Err(_) => lost += 1,
            }
        }
        assert!(sent > 0 && lost > 0, "sent {sent}, lost {lost}");
        assert!(started.elapsed() < Duration::from_secs(5));
        drop(receiver);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
