//! etcd's v3 JSON gateway, asked by a small blocking HTTP/1.1 client over
//! a `TcpStream`, or TLS over it for `etcds://` (`etcd_conn`):
//! `POST /v3/kv/range` (every key under a prefix, and the revision read
//! at) and the streaming `POST /v3/watch` (each change after it), each
//! after `POST /v3/auth/authenticate` when the source names a user. Keys
//! and values come base64-encoded.
//!
//! hyper's client would need its `client` feature and a runtime on this
//! thread; a request a few lines long, one answer bounded by
//! [`MAX_BODY`] and a deadline, is simpler to read and to bound. A
//! lying `Content-Length`, a huge or endless body, garbage or bad base64
//! is an error, never memory: the caller keeps its last list.
//!
//! # Threads
//!
//! Runs on a service's `rodizio-etcd` thread (`etcd_follow.rs`); shares
//! nothing.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C's servers are typed in.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use crate::etcd_conn::{Conn, EtcdTls};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde::Deserialize;

/// Largest answer (or one watch message) read: past it, an error.
pub const MAX_BODY: usize = 4 * 1024 * 1024;

/// Most keys taken from a prefix; the others are left out.
pub const MAX_KEYS: usize = 1024;

/// Longest wait to connect, send, or read one range answer.
pub const TIMEOUT: Duration = Duration::from_secs(3);

/// The error of a watch read that found nothing new within its wait.
pub const IDLE: &str = "idle";

fn timed_out(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// Longest head line or header read.
const MAX_LINE: usize = 8 * 1024;

/// Where the backends come from:
/// `etcd://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/PREFIX`, or
/// `etcds://...[?ca=PATH]` over TLS. Its `Debug` is its `Display`: the
/// password never shows.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdSource {
    /// The endpoints, tried in turn.
    pub endpoints: Vec<String>,
    /// The key prefix (with its leading `/`).
    pub prefix: String,
    /// The user and password etcd's authentication asks for, if on.
    pub user: Option<(String, String)>,
    /// `etcds://`: TLS, and the CA it trusts.
    pub tls: Option<EtcdTls>,
}

impl std::str::FromStr for EtcdSource {
    type Err = String;

    fn from_str(text: &str) -> Result<EtcdSource, String> {
        let (rest, secure) = match (text.strip_prefix("etcd://"), text.strip_prefix("etcds://")) {
            (Some(rest), _) => (rest, false),
            (_, Some(rest)) => (rest, true),
            _ => return Err("not etcd://HOST:PORT/PREFIX (or etcds:// for TLS)".into()),
        };
        // `?ca=PATH` ends an etcds:// source: the CA file, read now.
        let (rest, ca) = match rest.rsplit_once("?ca=") {
            Some((rest, ca)) if secure => (rest, Some(std::path::PathBuf::from(ca))),
            Some(_) => return Err("?ca= goes with etcds:// (TLS)".into()),
            None => (rest, None),
        };
        let tls = secure.then(|| EtcdTls::load(ca.as_deref())).transpose()?;
        let (hosts, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        // The password is never repeated in an error: only the endpoints.
        let (user, hosts) = match hosts.rsplit_once('@') {
            None => (None, hosts),
            Some((userinfo, hosts)) => match userinfo.split_once(':') {
                Some((name, password)) if !name.is_empty() => {
                    (Some((name.to_string(), password.to_string())), hosts)
                }
                _ => return Err("the user is written USER:PASSWORD@ before the hosts".into()),
            },
        };
        let endpoints: Vec<String> = hosts.split(',').map(|h| h.trim().to_string()).collect();
        for e in &endpoints {
            let ok = e
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
            if !ok {
                return Err(format!("'{e}' is not an etcd endpoint (HOST:PORT)"));
            }
        }
        Ok(EtcdSource {
            endpoints,
            prefix: format!("/{prefix}"),
            user,
            tls,
        })
    }
}

impl std::fmt::Debug for EtcdSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")
    }
}

/// The source as written, its password shown as `***` (settings listings,
/// logs and the admin API never show it).
impl std::fmt::Display for EtcdSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.tls.is_some() { "etcds" } else { "etcd" };
        write!(f, "{scheme}://")?;
        if let Some((name, _)) = &self.user {
            write!(f, "{name}:***@")?;
        }
        write!(f, "{}{}", self.endpoints.join(","), self.prefix)?;
        match self.tls.as_ref().and_then(|t| t.ca.as_ref()) {
            Some(ca) => write!(f, "?ca={}", ca.display()),
            None => Ok(()),
        }
    }
}

/// One key and its value, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pair {
    /// The whole key.
    pub key: String,
    /// Its value (empty: the key's last segment is the backend).
    pub value: String,
}

/// A whole read of the prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    /// The keys, at most [`MAX_KEYS`].
    pub pairs: Vec<Pair>,
    /// The revision read at: the watch starts after it.
    pub revision: i64,
    /// Keys past [`MAX_KEYS`] left out.
    pub left_out: usize,
}

/// One change a watch tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A key put (new or changed).
    Put(Pair),
    /// A key deleted.
    Delete(String),
}

/// One message of a watch's stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchMessage {
    /// Changes, and the revision they bring the prefix to.
    Events(Vec<Event>, i64),
    /// The watch ended (the revision was compacted, or etcd cancelled it):
    /// read everything again.
    Cancelled,
}

#[derive(Deserialize)]
struct RawKv {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Deserialize, Default)]
struct RawHeader {
    #[serde(default)]
    revision: Num,
}

/// etcd's gateway writes 64-bit numbers as strings.
#[derive(Deserialize, Default)]
#[serde(untagged)]
enum Num {
    Text(String),
    Int(i64),
    #[default]
    None,
}

impl Num {
    fn get(&self) -> Result<i64, String> {
        match self {
            Num::Text(t) => t.parse().map_err(|_| format!("'{t}' is not a revision")),
            Num::Int(n) => Ok(*n),
            Num::None => Ok(0),
        }
    }
}

#[derive(Deserialize)]
struct RawRange {
    header: RawHeader,
    #[serde(default)]
    kvs: Vec<RawKv>,
    #[serde(default)]
    count: Num,
}

#[derive(Deserialize)]
struct RawEvent {
    #[serde(default, rename = "type")]
    kind: String,
    kv: RawKv,
}

#[derive(Deserialize, Default)]
struct RawWatch {
    #[serde(default)]
    header: RawHeader,
    #[serde(default)]
    events: Vec<RawEvent>,
    #[serde(default)]
    canceled: bool,
    #[serde(default)]
    compact_revision: Num,
}

#[derive(Deserialize)]
struct RawWatchLine {
    result: Option<RawWatch>,
    error: Option<serde_json::Value>,
}

fn text(b64: &str, what: &str) -> Result<String, String> {
    let bytes = STANDARD
        .decode(b64)
        .map_err(|e| format!("{what} is not base64: {e}"))?;
    String::from_utf8(bytes).map_err(|_| format!("{what} is not UTF-8"))
}

fn pair(kv: &RawKv) -> Result<Pair, String> {
    Ok(Pair {
        key: text(&kv.key, "a key")?,
        value: text(&kv.value, "a value")?,
    })
}

/// Reads a range answer's JSON.
///
/// # Errors
///
/// Garbage, a missing header, bad base64, in words.
pub fn parse_range(body: &[u8]) -> Result<Range, String> {
    let raw: RawRange = serde_json::from_slice(body)
        .map_err(|e| format!("a range answer that is not etcd's: {e}"))?;
    let total = usize::try_from(raw.count.get()?.max(0)).unwrap_or(usize::MAX);
    let pairs = raw
        .kvs
        .iter()
        .take(MAX_KEYS)
        .map(pair)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Range {
        left_out: total.max(raw.kvs.len()).saturating_sub(pairs.len()),
        pairs,
        revision: raw.header.revision.get()?,
    })
}

/// Reads one message of a watch's stream (one line of JSON).
///
/// # Errors
///
/// Garbage, an error message, bad base64, in words.
pub fn parse_watch(line: &[u8]) -> Result<WatchMessage, String> {
    let raw: RawWatchLine = serde_json::from_slice(line)
        .map_err(|e| format!("a watch message that is not etcd's: {e}"))?;
    if let Some(e) = raw.error {
        return Err(format!("the watch failed: {e}"));
    }
    let w = raw.result.unwrap_or_default();
    if w.canceled || w.compact_revision.get()? > 0 {
        return Ok(WatchMessage::Cancelled);
    }
    let events = w
        .events
        .iter()
        .map(|e| {
            Ok(match e.kind.as_str() {
                "DELETE" => Event::Delete(text(&e.kv.key, "a key")?),
                _ => Event::Put(pair(&e.kv)?),
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(WatchMessage::Events(events, w.header.revision.get()?))
}

/// The end of a prefix's key range: the prefix with its last byte plus one.
fn range_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// An answer's body, read: the stream positioned after the head.
pub struct Answer {
    reader: BufReader<Conn>,
    chunked: bool,
    /// Bytes of the current chunk not yet read.
    chunk_left: usize,
    length: Option<usize>,
}

fn line(reader: &mut BufReader<Conn>) -> Result<String, String> {
    let mut buf = Vec::new();
    match reader
        .by_ref()
        .take(MAX_LINE as u64)
        .read_until(b'\n', &mut buf)
    {
        Err(e) if timed_out(&e) && buf.is_empty() => return Err(IDLE.into()),
        Err(e) => return Err(format!("reading: {e}")),
        Ok(_) => {}
    }
    if !buf.ends_with(b"\n") {
        return Err("a line cut short or too long".into());
    }
    Ok(String::from_utf8_lossy(&buf).trim_end().to_string())
}

/// Sends `body` to `path` of the first of `source`'s endpoints that takes
/// it and reads the answer's head; with a user, authenticated first on
/// that endpoint (a token is good on the member that gave it).
///
/// # Errors
///
/// No endpoint answered 200, in words.
pub fn post(source: &EtcdSource, path: &str, body: &str, read: Duration) -> Result<Answer, String> {
    let mut last = "no endpoint".to_string();
    for e in &source.endpoints {
        let token = match &source.user {
            None => Ok(None),
            Some((name, password)) => authenticate(source, e, name, password).map(Some),
        };
        let to = (e.as_str(), source.tls.as_ref());
        match token.and_then(|t| post_one(to, path, body, read, t.as_deref())) {
            Ok(a) => return Ok(a),
            Err(err) => last = format!("{e}: {err}"),
        }
    }
    Err(last)
}

#[derive(Deserialize)]
struct RawToken {
    token: String,
}

/// `POST /v3/auth/authenticate`: the token for `name` on `endpoint`.
fn authenticate(
    source: &EtcdSource,
    endpoint: &str,
    name: &str,
    password: &str,
) -> Result<String, String> {
    let body = serde_json::json!({"name": name, "password": password}).to_string();
    let path = "/v3/auth/authenticate";
    let to = (endpoint, source.tls.as_ref());
    let said = |e: String| format!("authenticating as {name}: {e}");
    let answer = post_one(to, path, &body, TIMEOUT, None).map_err(said)?;
    let raw: RawToken = serde_json::from_slice(&answer.body().map_err(said)?)
        .map_err(|e| said(format!("not etcd's answer ({e})")))?;
    if raw.token.is_empty() || raw.token.len() > MAX_LINE / 2 || raw.token.contains(['\r', '\n']) {
        return Err(format!("authenticating as {name}: not a token"));
    }
    Ok(raw.token)
}

/// One request to one endpoint (`to`: it, and TLS if `etcds://`).
fn post_one(
    (endpoint, tls): (&str, Option<&EtcdTls>),
    path: &str,
    body: &str,
    read: Duration,
    token: Option<&str>,
) -> Result<Answer, String> {
    let addrs: Vec<SocketAddr> = endpoint
        .to_socket_addrs()
        .map_err(|e| format!("resolving: {e}"))?
        .collect();
    let addr = addrs.first().ok_or("no address")?;
    let stream =
        TcpStream::connect_timeout(addr, TIMEOUT).map_err(|e| format!("connecting: {e}"))?;
    stream
        .set_write_timeout(Some(TIMEOUT))
        .and_then(|()| stream.set_read_timeout(Some(read)))
        .map_err(|e| format!("socket: {e}"))?;
    let authorization = token.map_or(String::new(), |t| format!("Authorization: {t}\r\n"));
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {endpoint}\r\n{authorization}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut conn = Conn::open(stream, tls, endpoint)?;
    conn.write_all(request.as_bytes())
        .and_then(|()| conn.flush())
        .map_err(|e| format!("sending: {e}"))?;
    let mut reader = BufReader::new(conn);
    let status = line(&mut reader)?;
    if status.split(' ').nth(1) != Some("200") {
        return Err(format!("answered '{status}'"));
    }
    let (mut chunked, mut length) = (false, None);
    for _ in 0..100 {
        let header = line(&mut reader)?;
        if header.is_empty() {
            return Ok(Answer {
                reader,
                chunked,
                chunk_left: 0,
                length,
            });
        }
        let (name, value) = header.split_once(':').unwrap_or((&header, ""));
        let value = value.trim();
        if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.eq_ignore_ascii_case("chunked");
        } else if name.eq_ignore_ascii_case("content-length") {
            let n: usize = value.parse().map_err(|_| "a bad Content-Length")?;
            if n > MAX_BODY {
                return Err(format!("an answer of {n} bytes, over {MAX_BODY}"));
            }
            length = Some(n);
        }
    }
    Err("too many headers".into())
}

impl Answer {
    /// The whole body (not chunked, or chunked to its end), at most [`MAX_BODY`].
    ///
    /// # Errors
    ///
    /// Too long, cut short, a bad chunk, in words.
    pub fn body(mut self) -> Result<Vec<u8>, String> {
        if let Some(n) = self.length.filter(|_| !self.chunked) {
            let mut body = vec![0u8; n];
            self.reader
                .read_exact(&mut body)
                .map_err(|e| format!("reading the body: {e}"))?;
            return Ok(body);
        }
        if !self.chunked {
            return Err("an answer with neither length nor chunks".into());
        }
        let mut body = Vec::new();
        while self.more(&mut body, MAX_BODY)? {}
        Ok(body)
    }

    /// Reads the next piece of a chunked body onto `out`; false at its end.
    fn more(&mut self, out: &mut Vec<u8>, most: usize) -> Result<bool, String> {
        if self.chunk_left == 0 {
            let size = line(&mut self.reader)?;
            let size = size.split(';').next().unwrap_or("").trim();
            let n = usize::from_str_radix(size, 16).map_err(|_| "a bad chunk size")?;
            if n == 0 {
                return Ok(false);
            }
            self.chunk_left = n;
        }
        let room = most.saturating_sub(out.len());
        if room == 0 {
            return Err(format!("a message over {most} bytes"));
        }
        let want = self.chunk_left.min(room).min(64 * 1024);
        let start = out.len();
        out.resize(start + want, 0);
        let got = self.reader.read(&mut out[start..]);
        let got = match got {
            Ok(0) => {
                out.truncate(start);
                return Err("the stream ended".into());
            }
            Ok(n) => n,
            Err(e) => {
                out.truncate(start);
                if timed_out(&e) {
                    return Err(IDLE.into());
                }
                return Err(format!("reading: {e}"));
            }
        };
        out.truncate(start + got);
        self.chunk_left -= got;
        if self.chunk_left == 0 {
            let end = line(&mut self.reader)?;
            if !end.is_empty() {
                return Err("a chunk not ended by CRLF".into());
            }
        }
        Ok(true)
    }

    /// The next line of a chunked stream (a watch message), at most
    /// [`MAX_BODY`]; `pending` keeps what came after it.
    ///
    /// # Errors
    ///
    /// The stream ended, timed out or went over the bound.
    pub fn next_line(&mut self, pending: &mut Vec<u8>) -> Result<Vec<u8>, String> {
        loop {
            if let Some(pos) = pending.iter().position(|b| *b == b'\n') {
                let rest = pending.split_off(pos + 1);
                let mut line = std::mem::replace(pending, rest);
                line.pop();
                return Ok(line);
            }
            if !self.chunked {
                return Err("a watch that is not a stream".into());
            }
            if !self.more(pending, MAX_BODY)? {
                return Err("the watch ended".into());
            }
        }
    }
}

/// Reads every key under `source`'s prefix (at most [`MAX_KEYS`] + 1 asked).
///
/// # Errors
///
/// No endpoint answered, or the answer is not etcd's, in words.
pub fn range(source: &EtcdSource) -> Result<Range, String> {
    let body = serde_json::json!({
        "key": STANDARD.encode(&source.prefix),
        "range_end": STANDARD.encode(range_end(&source.prefix)),
        "limit": MAX_KEYS + 1,
    });
    let answer = post(source, "/v3/kv/range", &body.to_string(), TIMEOUT)?;
    parse_range(&answer.body()?)
}

/// Starts a watch of `source`'s prefix from `revision`; read its
/// messages with [`Answer::next_line`] and [`parse_watch`]. `idle`: the
/// longest wait for one read.
///
/// # Errors
///
/// No endpoint answered, in words.
pub fn watch(source: &EtcdSource, revision: i64, idle: Duration) -> Result<Answer, String> {
    let body = serde_json::json!({"create_request": {
        "key": STANDARD.encode(&source.prefix),
        "range_end": STANDARD.encode(range_end(&source.prefix)),
        "start_revision": revision,
    }});
    post(source, "/v3/watch", &body.to_string(), idle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        STANDARD.encode(s)
    }

    #[test]
    fn a_source_is_read_and_written_back() {
        let s: EtcdSource = "etcd://h1:2379,127.0.0.1:2380/lb/web".parse().unwrap();
        assert_eq!(s.endpoints, ["h1:2379", "127.0.0.1:2380"]);
        assert_eq!(s.prefix, "/lb/web");
        assert_eq!(s.to_string().parse::<EtcdSource>().unwrap(), s);
        assert!("http://h:1/x".parse::<EtcdSource>().is_err());
        assert!("etcd://h/x".parse::<EtcdSource>().is_err());
        assert_eq!(range_end("/a/"), b"/a0");
    }

    #[test]
    fn a_tls_source_needs_a_readable_ca() {
        let err = "etcds://h:1/x?ca=/no/such/ca.pem"
            .parse::<EtcdSource>()
            .unwrap_err();
        assert!(err.contains("/no/such/ca.pem"), "{err}");
        let err = "etcd://h:1/x?ca=/etc/hostname"
            .parse::<EtcdSource>()
            .unwrap_err();
        assert!(err.contains("etcds://"), "{err}");
        let err = "http://h:1/x".parse::<EtcdSource>().unwrap_err();
        assert!(err.contains("etcds:// for TLS"), "{err}");
    }

    proptest::proptest! {
        /// Any text: parsed or refused, never a panic; a source with a
        /// user never shows its password, in an error or written back.
        #[test]
        fn any_source_text_is_parsed_or_refused_and_hides_its_password(
            user in "[a-z]{1,8}",
            password in "[A-Za-z0-9:!]{6,16}",
            hosts in "[a-z0-9.:,@\\[\\]]{0,40}",
            prefix in "\\PC{0,40}",
        ) {
            let text = format!("etcd://{user}:{password}@{hosts}/{prefix}");
            match text.parse::<EtcdSource>() {
                Ok(s) => {
                    let (shown, debug) = (s.to_string(), format!("{:?}", s));
                    proptest::prop_assert!(!shown.contains(&password));
                    proptest::prop_assert!(!debug.contains(&password));
                }
                Err(e) => proptest::prop_assert!(!e.contains(&password), "{}", e),
            }
            let _ = format!("{hosts}/{prefix}").parse::<EtcdSource>();
            let _ = format!("etcds://{hosts}/{prefix}").parse::<EtcdSource>();
        }
    }

    #[test]
    fn a_user_is_read_and_its_password_never_shown() {
        let s: EtcdSource = "etcd://lb:s3cr:et@h1:2379/lb/".parse().unwrap();
        assert_eq!(s.user, Some(("lb".into(), "s3cr:et".into())));
        assert_eq!(s.endpoints, ["h1:2379"]);
        assert_eq!(s.to_string(), "etcd://lb:***@h1:2379/lb/");
        assert_eq!(format!("{s:?}"), s.to_string());
        for bad in ["etcd://lb@h1:2379/x", "etcd://:pw@h1:2379/x"] {
            let err = bad.parse::<EtcdSource>().unwrap_err();
            assert!(err.contains("USER:PASSWORD@"), "{err}");
        }
        let err = "etcd://lb:pw@h1/x".parse::<EtcdSource>().unwrap_err();
        assert!(!err.contains("pw"), "{err}");
    }

    #[test]
    fn a_range_answer_is_parsed() {
        let body = format!(
            r#"{{"header":{{"revision":"7"}},"kvs":[{{"key":"{}","value":"{}"}},{{"key":"{}"}}],"count":"2"}}"#,
            b64("/lb/a"),
            b64("10.0.0.3:80,weight=2,backup"),
            b64("/lb/127.0.0.1:81")
        );
        let r = parse_range(body.as_bytes()).unwrap();
        assert_eq!(r.revision, 7);
        assert_eq!(r.left_out, 0);
        assert_eq!(r.pairs[0].value, "10.0.0.3:80,weight=2,backup");
        assert_eq!(r.pairs[1].value, "");
        // An empty prefix: no kvs at all.
        let empty = parse_range(br#"{"header":{"revision":"3"}}"#).unwrap();
        assert!(empty.pairs.is_empty());
        assert!(parse_range(b"garbage").is_err());
        assert!(parse_range(br#"{"header":{},"kvs":[{"key":"!!!"}]}"#).is_err());
        let over = parse_range(br#"{"header":{"revision":"1"},"count":"5000"}"#).unwrap();
        assert_eq!(over.left_out, 5000);
    }

    #[test]
    fn watch_messages_are_parsed() {
        let put = format!(
            r#"{{"result":{{"header":{{"revision":"9"}},"events":[{{"kv":{{"key":"{}","value":"{}"}}}},{{"type":"DELETE","kv":{{"key":"{}"}}}}]}}}}"#,
            b64("/lb/a"),
            b64("127.0.0.1:80"),
            b64("/lb/b")
        );
        assert_eq!(
            parse_watch(put.as_bytes()).unwrap(),
            WatchMessage::Events(
                vec![
                    Event::Put(Pair {
                        key: "/lb/a".into(),
                        value: "127.0.0.1:80".into()
                    }),
                    Event::Delete("/lb/b".into())
                ],
                9
            )
        );
        // The creation message: no events.
        assert_eq!(
            parse_watch(br#"{"result":{"header":{"revision":"9"},"created":true}}"#).unwrap(),
            WatchMessage::Events(vec![], 9)
        );
        assert_eq!(
            parse_watch(br#"{"result":{"compact_revision":"4","canceled":true}}"#).unwrap(),
            WatchMessage::Cancelled
        );
        assert!(parse_watch(br#"{"error":{"code":14}}"#).is_err());
        assert!(parse_watch(b"{").is_err());
    }
}
