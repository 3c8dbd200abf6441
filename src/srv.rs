//! A DNS SRV name's records: `srv:_http._tcp.example.com` asked of the
//! `resolvers` (or the system's nameservers, from `/etc/resolv.conf`), each
//! record's target looked up (A, then AAAA, unless the answer's additional
//! section carries them), as the backends of a `srv:` entry take them:
//! target and port, weight, priority.
//!
//! The messages are Hickory DNS's (`hickory-proto`: encoding, decoding,
//! names, compression); the transport is a blocking `UdpSocket` with a
//! deadline, and a `TcpStream` when an answer comes truncated. Bounds: an
//! answer of at most 65,535 bytes, the first [`MAX_RECORDS`] records (by
//! priority, target and port), [`LOOKUP_DEADLINE`] for one name with all its
//! targets, [`MAX_NAMESERVERS`] nameservers. An answer that does not decode
//! (garbage, lying lengths, a cut message), a wrong id, an error code or
//! silence is a failed lookup: the caller keeps its last good answer.
//!
//! # Threads
//!
//! Runs on the resolver thread (and once per `srv:` entry when a service
//! starts); shares nothing.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C's servers are typed in.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};

use crate::lookup::{self, MAX_ADDRESSES};

/// Most backends taken from one name: the first records by priority,
/// target and port. A name giving thousands is a mistake or an attack; a
/// few dozen servers behind one name is already a large pool.
pub const MAX_RECORDS: usize = 64;

/// Longest time for one name and its targets' addresses.
pub const LOOKUP_DEADLINE: Duration = Duration::from_secs(5);

/// Longest wait for one answer from one nameserver.
const QUERY_TIMEOUT: Duration = Duration::from_secs(2);

/// Most nameservers asked in turn (the system's or `resolvers`).
pub const MAX_NAMESERVERS: usize = 3;

/// Longest answer read (a DNS message's own limit).
const MAX_MESSAGE: usize = 65_535;

/// One record of a SRV name, its target looked up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The target, without its final dot (`a.example.com`).
    pub target: String,
    /// The port clients go to.
    pub port: u16,
    /// The record's weight (0..65535).
    pub weight: u16,
    /// The record's priority: lower is preferred.
    pub priority: u16,
    /// The target's addresses (IPv4 first, at most [`MAX_ADDRESSES`]).
    pub addrs: Vec<SocketAddr>,
}

/// What one lookup found: the records, and when to ask again (the
/// smallest TTL of the answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// At most [`MAX_RECORDS`], sorted by priority, target, port.
    pub records: Vec<Record>,
    /// The answer's smallest TTL.
    pub ttl: Duration,
    /// Records left out past [`MAX_RECORDS`].
    pub left_out: usize,
}

/// The `resolvers` setting: nameservers as `IP:PORT` (or `IP`, port
/// 53), comma-separated, at most [`MAX_NAMESERVERS`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nameservers(pub Vec<SocketAddr>);

impl std::str::FromStr for Nameservers {
    type Err = String;

    fn from_str(text: &str) -> Result<Nameservers, String> {
        let list = text
            .split(',')
            .map(|item| {
                let item = item.trim();
                item.parse::<SocketAddr>()
                    .or_else(|_| item.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
                    .map_err(|_| {
                        format!("'{item}' is not a nameserver (IP:PORT, e.g. 127.0.0.1:53)")
                    })
            })
            .collect::<Result<Vec<_>, String>>()?;
        if list.len() > MAX_NAMESERVERS {
            return Err(format!(
                "at most {MAX_NAMESERVERS} nameservers, got {}",
                list.len()
            ));
        }
        Ok(Nameservers(list))
    }
}

impl std::fmt::Display for Nameservers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let all: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&all.join(","))
    }
}

/// The system's nameservers: the `nameserver` lines of
/// `/etc/resolv.conf` (port 53), at most [`MAX_NAMESERVERS`];
/// `127.0.0.1:53` when there are none, as the C library does.
pub fn system_nameservers() -> Vec<SocketAddr> {
    let text = std::fs::read("/etc/resolv.conf").unwrap_or_default();
    let text = String::from_utf8_lossy(&text[..text.len().min(64 * 1024)]);
    let mut found: Vec<SocketAddr> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|rest| rest.trim().parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .take(MAX_NAMESERVERS)
        .collect();
    if found.is_empty() {
        found.push(SocketAddr::from(([127, 0, 0, 1], 53)));
    }
    found
}

/// Looks `name` (`_http._tcp.example.com`) up on `servers`, each tried
/// in turn until one answers, and each record's target after it.
/// Counted in [`lookup::SRV`].
///
/// # Errors
///
/// Why no answer could be used, in words.
pub fn lookup(name: &str, servers: &[SocketAddr]) -> Result<Answer, String> {
    let result = lookup_uncounted(name, servers);
    lookup::SRV.count(result.is_ok());
    result
}

fn lookup_uncounted(name: &str, servers: &[SocketAddr]) -> Result<Answer, String> {
    let deadline = Instant::now() + LOOKUP_DEADLINE;
    let qname = Name::from_ascii(name).map_err(|e| format!("'{name}' is not a DNS name: {e}"))?;
    let reply = ask(&qname, RecordType::SRV, servers, deadline)?;
    let mut ttl = u32::MAX;
    let mut records = Vec::new();
    for r in reply.answers() {
        if let Some(RData::SRV(srv)) = r.data() {
            ttl = ttl.min(r.ttl());
            let target = srv.target().to_ascii();
            let target = target.trim_end_matches('.');
            // A target of "." says "no such service here"; port 0 too.
            if target.is_empty() || srv.port() == 0 {
                continue;
            }
            records.push(Record {
                target: target.to_ascii_lowercase(),
                port: srv.port(),
                weight: srv.weight(),
                priority: srv.priority(),
                addrs: Vec::new(),
            });
        }
    }
    if records.is_empty() {
        return Err(format!("{name} has no SRV record"));
    }
    records.sort_by(|a, b| (a.priority, &a.target, a.port).cmp(&(b.priority, &b.target, b.port)));
    records.dedup_by(|a, b| a.target == b.target && a.port == b.port);
    let left_out = records.len().saturating_sub(MAX_RECORDS);
    records.truncate(MAX_RECORDS);
    let mut known: Vec<(String, Vec<IpAddr>)> = Vec::new();
    for r in reply.additionals() {
        let ip = match r.data() {
            Some(RData::A(a)) => IpAddr::V4(a.0),
            Some(RData::AAAA(a)) => IpAddr::V6(a.0),
            _ => continue,
        };
        let owner = r
            .name()
            .to_ascii()
            .trim_end_matches('.')
            .to_ascii_lowercase();
        match known.iter_mut().find(|(n, _)| *n == owner) {
            Some((_, ips)) => ips.push(ip),
            None => known.push((owner, vec![ip])),
        }
    }
    for record in &mut records {
        let ips = match known.iter().find(|(n, _)| *n == record.target) {
            Some((_, ips)) => ips.clone(),
            None => {
                let ips = addresses_of(&record.target, servers, deadline)?;
                known.push((record.target.clone(), ips.clone()));
                ips
            }
        };
        let mut addrs: Vec<SocketAddr> = ips
            .iter()
            .map(|ip| SocketAddr::new(*ip, record.port))
            .collect();
        addrs.sort_by_key(|a| a.is_ipv6());
        addrs.dedup();
        addrs.truncate(MAX_ADDRESSES);
        record.addrs = addrs;
    }
    Ok(Answer {
        records,
        ttl: Duration::from_secs(u64::from(ttl)),
        left_out,
    })
}

/// A target's addresses: A, then AAAA when it has no IPv4 address.
fn addresses_of(
    target: &str,
    servers: &[SocketAddr],
    deadline: Instant,
) -> Result<Vec<IpAddr>, String> {
    let name = Name::from_ascii(target).map_err(|e| format!("target '{target}': {e}"))?;
    let mut ips = Vec::new();
    for kind in [RecordType::A, RecordType::AAAA] {
        let reply = ask(&name, kind, servers, deadline)?;
        for r in reply.answers() {
            match r.data() {
                Some(RData::A(a)) => ips.push(IpAddr::V4(a.0)),
                Some(RData::AAAA(a)) => ips.push(IpAddr::V6(a.0)),
                _ => {}
            }
        }
        if !ips.is_empty() {
            return Ok(ips);
        }
    }
    Err(format!("target {target} has no address"))
}

/// Source of query ids: different for each question of the process.
static NEXT_ID: AtomicU16 = AtomicU16::new(0);

/// One question asked of each server in turn until one answers it.
fn ask(
    name: &Name,
    kind: RecordType,
    servers: &[SocketAddr],
    deadline: Instant,
) -> Result<Message, String> {
    // Not a secret (the nameservers are the operator's), only different
    // from one question to the next and from one process to another.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let seed = (std::process::id() as u16) ^ (nanos as u16);
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed).wrapping_mul(40_503) ^ seed;
    let mut query = Message::new();
    query
        .set_id(id)
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(true)
        .add_query(Query::query(name.clone(), kind));
    let bytes = query
        .to_vec()
        .map_err(|e| format!("encoding the question: {e}"))?;
    let mut last = "no nameserver".to_string();
    for server in servers.iter().take(MAX_NAMESERVERS) {
        match ask_one(*server, &bytes, id, deadline) {
            Ok(reply) => match reply.response_code() {
                ResponseCode::NoError => return Ok(reply),
                // The name does not exist: no other server will say more.
                ResponseCode::NXDomain => {
                    return Err(format!("{name} {kind}: no such name ({server})"))
                }
                code => last = format!("{name} {kind}: {server} answered {code}"),
            },
            Err(e) => last = format!("{name} {kind}: {server}: {e}"),
        }
    }
    Err(last)
}

/// The answer of `server` to `question` (id `id`): over UDP, and over TCP
/// when it comes truncated.
fn ask_one(
    server: SocketAddr,
    question: &[u8],
    id: u16,
    deadline: Instant,
) -> Result<Message, String> {
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .min(QUERY_TIMEOUT)
    };
    let local: SocketAddr = if server.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = UdpSocket::bind(local).map_err(|e| format!("socket: {e}"))?;
    socket
        .connect(server)
        .map_err(|e| format!("connect: {e}"))?;
    socket.send(question).map_err(|e| format!("send: {e}"))?;
    let mut buf = vec![0u8; MAX_MESSAGE];
    let until = Instant::now() + left();
    // Datagrams that are not the answer (a wrong id) are skipped, a few.
    for _ in 0..8 {
        let wait = until.saturating_duration_since(Instant::now());
        if wait.is_zero() {
            break;
        }
        socket
            .set_read_timeout(Some(wait))
            .map_err(|e| format!("socket: {e}"))?;
        let n = match socket.recv(&mut buf) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                break
            }
            Err(e) => return Err(format!("receive: {e}")),
        };
        let reply = Message::from_vec(&buf[..n])
            .map_err(|e| format!("an answer that does not decode: {e}"))?;
        if reply.id() != id || reply.message_type() != MessageType::Response {
            continue;
        }
        if reply.truncated() {
            return ask_tcp(server, question, id, until);
        }
        return Ok(reply);
    }
    Err(format!(
        "no answer within {:?}",
        QUERY_TIMEOUT.min(LOOKUP_DEADLINE)
    ))
}

/// The question again over TCP (an answer too long for UDP).
fn ask_tcp(
    server: SocketAddr,
    question: &[u8],
    id: u16,
    until: Instant,
) -> Result<Message, String> {
    let wait = until
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(10));
    let mut stream = TcpStream::connect_timeout(&server, wait)
        .map_err(|e| format!("truncated, then TCP: {e}"))?;
    let _ = stream.set_read_timeout(Some(wait));
    let _ = stream.set_write_timeout(Some(wait));
    let len = u16::try_from(question.len()).map_err(|_| "question too long".to_string())?;
    let mut out = len.to_be_bytes().to_vec();
    out.extend_from_slice(question);
    stream
        .write_all(&out)
        .map_err(|e| format!("TCP send: {e}"))?;
    let mut head = [0u8; 2];
    stream
        .read_exact(&mut head)
        .map_err(|e| format!("TCP receive: {e}"))?;
    let mut body = vec![0u8; usize::from(u16::from_be_bytes(head))];
    stream
        .read_exact(&mut body)
        .map_err(|e| format!("TCP receive: {e}"))?;
    let reply =
        Message::from_vec(&body).map_err(|e| format!("a TCP answer that does not decode: {e}"))?;
    if reply.id() != id {
        return Err("a TCP answer to another question".into());
    }
    Ok(reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nameservers_are_read_and_written_back() {
        let n: Nameservers = "127.0.0.1:5353, [::1]:53,10.0.0.1".parse().unwrap();
        assert_eq!(n.0[2], "10.0.0.1:53".parse().unwrap());
        assert_eq!(n.to_string(), "127.0.0.1:5353,[::1]:53,10.0.0.1:53");
        assert_eq!(n.to_string().parse::<Nameservers>().unwrap(), n);
        assert!("dns.example:53".parse::<Nameservers>().is_err());
        assert!("1.1.1.1,1.0.0.1,8.8.8.8,8.8.4.4"
            .parse::<Nameservers>()
            .is_err());
    }

    #[test]
    fn no_nameserver_answering_is_a_failure_within_the_deadline() {
        // A bound UDP socket that never answers.
        let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
        let started = Instant::now();
        let err = lookup("_http._tcp.example.test", &[silent.local_addr().unwrap()]).unwrap_err();
        assert!(err.contains("no answer"), "{err}");
        assert!(started.elapsed() < LOOKUP_DEADLINE + Duration::from_secs(1));
        assert!(lookup("bad name..", &[]).is_err());
    }
}
