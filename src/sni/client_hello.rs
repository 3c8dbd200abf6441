//! The TLS ClientHello, read without a TLS library: record header →
//! handshake header → the ClientHello's fields → its extensions → the
//! `server_name` extension (RFC 8446 §4.1.2 and §4.2, RFC 6066 §3) and the
//! `application_layer_protocol_negotiation` one (ALPN, RFC 7301 §3.1).
//!
//! Every length is checked against what is left before it is used; the
//! parser never indexes past its input. A ClientHello is one record in
//! practice, read where it lies, without a copy; a hello split over
//! several records (TLS allows it, and a client or a middlebox may do it)
//! is reassembled into the caller's buffer, as nginx's `ssl_preread`
//! does: at most [`MAX_RECORD`] bytes of hello in all, over at most
//! [`MAX_WIRE`] bytes of records, or it is refused as [`Parsed::NotTls`].
//!
//! A malformed ALPN extension (a list length that is not the extension's,
//! a name running past the list, an empty list or an empty name) makes the
//! whole hello malformed, as a malformed `server_name` does: [`Parsed::NotTls`],
//! never "no ALPN". A hello whose lengths lie is not one a TLS server would
//! take either, and reading it as another client's would let it pick a
//! route that the backend's own parser sees differently. So does a second
//! `server_name` or ALPN extension (RFC 8446 §4.2: one of each type).
//!
//! # Threads
//!
//! Pure functions, called by a worker on the bytes it peeked.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C reads no client bytes before the backend.

/// Bytes of a TLS record header: type, version, length.
pub const RECORD_HEADER: usize = 5;

/// The largest record payload a peer may send (RFC 8446 §5.1: 2^14).
pub const MAX_RECORD: usize = 16 * 1024;

/// The bytes of one full record.
pub const MAX_HELLO: usize = RECORD_HEADER + MAX_RECORD;

/// The most bytes ever needed to read a ClientHello: records carrying at
/// most [`MAX_RECORD`] bytes of hello in all, with their headers. Twice a
/// full record lets a hello of a few KiB come in records of a few bytes,
/// and keeps what a peek holds in the socket bounded.
pub const MAX_WIRE: usize = 2 * MAX_HELLO;

/// The longest host name in `server_name` (RFC 1035: 255 bytes).
pub const MAX_NAME: usize = 255;

/// What the bytes peeked so far say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed<'a> {
    /// Not enough yet: the record is this many bytes long in all (or,
    /// before its header is complete, at least this many).
    NeedMore(usize),
    /// A complete ClientHello: the name it asks for and the protocols
    /// it offers.
    Hello(Hello<'a>),
    /// Not a TLS ClientHello (or one this parser refuses): why, in words.
    NotTls(&'static str),
}

/// What a complete ClientHello asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello<'a> {
    /// The host name it asks for, if any (lower case, without a trailing
    /// dot, left to the caller).
    pub name: Option<&'a str>,
    /// The ALPN extension's protocol list as sent, checked: each name
    /// behind its one-byte length, the client's preferred first (walk it
    /// with [`protocols`]). Empty when the hello has no ALPN extension.
    pub alpn: &'a [u8],
}

/// The protocol names of an ALPN list as [`Hello::alpn`] holds it. Safe on
/// any bytes: a length running past the end ends the walk.
pub fn protocols(list: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = Reader { bytes: list };
    std::iter::from_fn(move || rest.vector(1).map(|name| name.bytes))
}

/// A cursor over a byte slice whose every read checks its bounds.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.bytes.len() {
            return None;
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| usize::from(b[0]))
    }

    fn u16(&mut self) -> Option<usize> {
        self.take(2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }

    fn u24(&mut self) -> Option<usize> {
        self.take(3)
            .map(|b| (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]))
    }

    /// A vector behind a length of `len_bytes` (1 or 2) bytes.
    fn vector(&mut self, len_bytes: usize) -> Option<Reader<'a>> {
        let len = if len_bytes == 1 {
            self.u8()?
        } else {
            self.u16()?
        };
        self.take(len).map(|bytes| Reader { bytes })
    }
}

/// Reads `bytes`, the start of what a client sent: a complete ClientHello
/// with its name, "need more" with the length to wait for, or why it is
/// not one. A hello over several records is copied into `joined` (which
/// is left alone otherwise). Never panics, whatever the bytes.
pub fn parse<'a>(bytes: &'a [u8], joined: &'a mut Vec<u8>) -> Parsed<'a> {
    let len = match record_header(bytes) {
        Ok(len) => len,
        Err(parsed) => return parsed,
    };
    let total = RECORD_HEADER + len;
    if bytes.len() < total {
        return Parsed::NeedMore(total);
    }
    let payload = &bytes[RECORD_HEADER..total];
    if payload[0] == 1 && !handshake_len(payload).is_some_and(|n| n <= payload.len()) {
        return reassemble(bytes, joined);
    }
    let mut record = Reader { bytes: payload };
    match handshake(&mut record) {
        Ok(hello) => Parsed::Hello(hello),
        Err(why) => Parsed::NotTls(why),
    }
}

/// The length of the record starting `bytes`, or what to answer: not TLS,
/// or wait for its header.
fn record_header(bytes: &[u8]) -> Result<usize, Parsed<'static>> {
    if bytes.len() < RECORD_HEADER {
        // The bytes seen so far must still be the start of a header.
        if !bytes.is_empty() && bytes[0] != 0x16 {
            return Err(Parsed::NotTls("not a TLS handshake record"));
        }
        if bytes.len() >= 2 && bytes[1] != 3 {
            return Err(Parsed::NotTls("not a TLS record version"));
        }
        return Err(Parsed::NeedMore(RECORD_HEADER));
    }
    if bytes[0] != 0x16 {
        return Err(Parsed::NotTls("not a TLS handshake record"));
    }
    if bytes[1] != 3 {
        return Err(Parsed::NotTls("not a TLS record version"));
    }
    let len = usize::from(u16::from_be_bytes([bytes[3], bytes[4]]));
    if len == 0 || len > MAX_RECORD {
        return Err(Parsed::NotTls("a TLS record length out of bounds"));
    }
    Ok(len)
}

/// The whole handshake message's length (its 4-byte header included),
/// once its header is there.
fn handshake_len(message: &[u8]) -> Option<usize> {
    let head = message.get(..4)?;
    Some(4 + ((usize::from(head[1]) << 16) | (usize::from(head[2]) << 8) | usize::from(head[3])))
}

/// A ClientHello over several records: their payloads joined in `joined`
/// until the hello is whole. Each record is checked as the first was.
#[cold]
#[inline(never)]
fn reassemble<'a>(bytes: &'a [u8], joined: &'a mut Vec<u8>) -> Parsed<'a> {
    joined.clear();
    let mut at = 0;
    let whole = loop {
        if let Some(n) = handshake_len(joined) {
            if n > MAX_RECORD {
                return Parsed::NotTls("a ClientHello over 16 KiB");
            }
            if joined.len() >= n {
                break n;
            }
        }
        let len = match record_header(&bytes[at..]) {
            Ok(len) => len,
            Err(Parsed::NeedMore(n)) => return need(at + n),
            Err(Parsed::NotTls(_)) => {
                return Parsed::NotTls("a ClientHello broken by another record")
            }
            Err(other) => return other,
        };
        let end = at + RECORD_HEADER + len;
        if bytes.len() < end || end > MAX_WIRE {
            return need(end);
        }
        joined.extend_from_slice(&bytes[at + RECORD_HEADER..end]);
        at = end;
    };
    let joined: &'a [u8] = &joined[..whole];
    match handshake(&mut Reader { bytes: joined }) {
        Ok(hello) => Parsed::Hello(hello),
        Err(why) => Parsed::NotTls(why),
    }
}

/// Wait for `total` bytes, when no more than [`MAX_WIRE`].
fn need(total: usize) -> Parsed<'static> {
    if total > MAX_WIRE {
        return Parsed::NotTls("a ClientHello over too many records");
    }
    Parsed::NeedMore(total)
}

/// The handshake message in the record: a ClientHello that fits in it.
fn handshake<'a>(record: &mut Reader<'a>) -> Result<Hello<'a>, &'static str> {
    const SHORT: &str = "a ClientHello cut short";
    if record.u8().ok_or(SHORT)? != 1 {
        return Err("a handshake message other than a ClientHello");
    }
    let len = record.u24().ok_or(SHORT)?;
    if len > record.bytes.len() {
        return Err("a ClientHello longer than its record");
    }
    let mut hello = Reader {
        bytes: record.take(len).ok_or(SHORT)?,
    };
    let _version = hello.take(2).ok_or(SHORT)?;
    let _random = hello.take(32).ok_or(SHORT)?;
    let session = hello.vector(1).ok_or(SHORT)?;
    if session.bytes.len() > 32 {
        return Err("a session id longer than 32 bytes");
    }
    let _suites = hello.vector(2).ok_or(SHORT)?;
    let _compression = hello.vector(1).ok_or(SHORT)?;
    let mut found = Hello {
        name: None,
        alpn: &[],
    };
    if hello.bytes.is_empty() {
        // No extensions at all (an old client): no name, no ALPN.
        return Ok(found);
    }
    const TWICE: &str = "a ClientHello with an extension given twice";
    let mut extensions = hello.vector(2).ok_or(SHORT)?;
    let mut alpn_seen = false;
    while !extensions.bytes.is_empty() {
        let kind = extensions.u16().ok_or(SHORT)?;
        let body = extensions.vector(2).ok_or(SHORT)?;
        match kind {
            0 if found.name.is_some() => return Err(TWICE),
            0 => found.name = Some(server_name(body)?),
            16 if alpn_seen => return Err(TWICE),
            16 => {
                found.alpn = alpn(body)?;
                alpn_seen = true;
            }
            _ => {}
        }
    }
    Ok(found)
}

/// The ALPN extension's body: its `protocol_name_list`, whose length
/// must be the rest of the body exactly, holding at least one name, each
/// 1 to 255 bytes that end inside the list (RFC 7301 §3.1). One pass over
/// the list, however many names it holds: the record bounds it.
fn alpn(mut body: Reader<'_>) -> Result<&[u8], &'static str> {
    const BAD: &str = "a malformed ALPN extension";
    let list = body.vector(2).ok_or(BAD)?.bytes;
    if list.is_empty() || !body.bytes.is_empty() {
        return Err(BAD);
    }
    let mut names = Reader { bytes: list };
    while !names.bytes.is_empty() {
        if names.vector(1).ok_or(BAD)?.bytes.is_empty() {
            return Err(BAD);
        }
    }
    Ok(list)
}

/// The `server_name` extension's body: the first `host_name` entry.
fn server_name(mut body: Reader<'_>) -> Result<&str, &'static str> {
    const BAD: &str = "a malformed server_name extension";
    let mut list = body.vector(2).ok_or(BAD)?;
    while !list.bytes.is_empty() {
        let kind = list.u8().ok_or(BAD)?;
        let name = list.vector(2).ok_or(BAD)?.bytes;
        if kind != 0 {
            continue;
        }
        let fine = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_');
        if name.is_empty() || name.len() > MAX_NAME || !name.iter().all(fine) {
            return Err("a server name that is not a host name");
        }
        // ASCII only, checked just above.
        return std::str::from_utf8(name).map_err(|_| BAD);
    }
    Err(BAD)
}

/// A ClientHello asking for `server_name` (when given), with a `padding`
/// extension (RFC 7685) of `padding` bytes: what tests send. Lengths past
/// a record's are clipped to their field (the result is then not TLS).
pub fn build(server_name: Option<&str>, padding: usize) -> Vec<u8> {
    build_with_alpn(server_name, None, padding)
}

/// [`build`], offering `alpn` (when given: the extension's body as is,
/// from [`alpn_body`] or made up by a test).
pub fn build_with_alpn(server_name: Option<&str>, alpn: Option<&[u8]>, padding: usize) -> Vec<u8> {
    fn push_u16(out: &mut Vec<u8>, n: usize) {
        out.extend_from_slice(&u16::try_from(n).unwrap_or(u16::MAX).to_be_bytes());
    }
    fn extension(out: &mut Vec<u8>, kind: u16, body: &[u8]) {
        out.extend_from_slice(&kind.to_be_bytes());
        push_u16(out, body.len());
        out.extend_from_slice(body);
    }
    let mut extensions = Vec::new();
    if let Some(name) = server_name {
        let mut list = vec![0];
        push_u16(&mut list, name.len());
        list.extend_from_slice(name.as_bytes());
        let mut body = Vec::new();
        push_u16(&mut body, list.len());
        body.extend_from_slice(&list);
        extension(&mut extensions, 0x0000, &body);
    }
    // supported_versions: TLS 1.3 and 1.2.
    extension(&mut extensions, 0x002b, &[4, 3, 4, 3, 3]);
    if let Some(body) = alpn {
        extension(&mut extensions, 0x0010, body);
    }
    if padding > 0 {
        extension(&mut extensions, 0x0015, &vec![0; padding]);
    }
    let mut hello = vec![3, 3];
    hello.extend_from_slice(&[0x5a; 32]);
    hello.push(0);
    hello.extend_from_slice(&[0, 2, 0x13, 0x01]); // one suite
    hello.extend_from_slice(&[1, 0]); // null compression
    push_u16(&mut hello, extensions.len());
    hello.extend_from_slice(&extensions);
    let mut handshake = vec![1];
    handshake.extend_from_slice(&(hello.len() as u32).to_be_bytes()[1..]);
    handshake.extend_from_slice(&hello);
    let mut record = vec![0x16, 3, 1];
    push_u16(&mut record, handshake.len());
    record.extend_from_slice(&handshake);
    record
}

/// The ALPN extension's body offering `protocols`, the first preferred
/// (what tests send; a name over 255 bytes gets a length that lies).
pub fn alpn_body(protocols: &[&str]) -> Vec<u8> {
    let list: Vec<u8> = protocols
        .iter()
        .flat_map(|p| std::iter::once(p.len() as u8).chain(p.bytes()))
        .collect();
    let mut body = u16::try_from(list.len())
        .unwrap_or(u16::MAX)
        .to_be_bytes()
        .to_vec();
    body.extend_from_slice(&list);
    body
}

/// [`build`], padded to `len` bytes in all when it can be (at least the
/// unpadded hello's length plus the padding extension's 4 bytes).
pub fn build_of_len(server_name: Option<&str>, len: usize) -> Vec<u8> {
    let bare = build(server_name, 0).len();
    build(server_name, len.saturating_sub(bare + 4))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// [`parse`] with a buffer of its own.
    fn read(bytes: &[u8]) -> Parsed<'_> {
        parse(bytes, Box::leak(Box::default()))
    }

    /// A hello asking for `name`, offering no ALPN.
    fn named(name: Option<&str>) -> Parsed<'_> {
        Parsed::Hello(Hello { name, alpn: &[] })
    }

    /// The protocols `bytes` offers, when it is a hello.
    fn offered(bytes: &[u8]) -> Result<Vec<String>, Parsed<'_>> {
        match read(bytes) {
            Parsed::Hello(h) => Ok(protocols(h.alpn)
                .map(|p| String::from_utf8_lossy(p).into_owned())
                .collect()),
            other => Err(other),
        }
    }

    const BAD_ALPN: Parsed<'static> = Parsed::NotTls("a malformed ALPN extension");

    #[test]
    fn alpn_is_read_beside_the_name() {
        let body = alpn_body(&["h2", "http/1.1"]);
        let hello = build_with_alpn(Some("a.test"), Some(&body), 100);
        let Parsed::Hello(h) = read(&hello) else {
            panic!("{:?}", read(&hello));
        };
        assert_eq!(h.name, Some("a.test"));
        assert_eq!(h.alpn, &body[2..]);
        assert_eq!(offered(&hello).unwrap(), ["h2", "http/1.1"]);
        // Without a name, and without the extension.
        let bare = build_with_alpn(None, Some(&alpn_body(&["h2"])), 0);
        assert_eq!(offered(&bare).unwrap(), ["h2"]);
        assert!(offered(&build(Some("a.test"), 0)).unwrap().is_empty());
        // openssl's and the health check's real hellos read as well.
        let real = crate::health::protocol::client_hello(Some("b.example.com"));
        assert!(matches!(
            read(&real),
            Parsed::Hello(Hello { name: Some(_), .. })
        ));
    }

    #[test]
    fn a_malformed_alpn_extension_makes_a_malformed_hello() {
        let lied = |body: &[u8]| read(Vec::leak(build_with_alpn(Some("a.test"), Some(body), 0)));
        // The list's length longer, then shorter, than the extension.
        assert_eq!(lied(&[0, 4, 2, b'h', b'2']), BAD_ALPN);
        assert_eq!(lied(&[0, 2, 2, b'h', b'2']), BAD_ALPN);
        assert_eq!(lied(&[0, 3, 2, b'h', b'2', 0]), BAD_ALPN);
        assert_eq!(lied(&[0xff, 0xff, 2, b'h', b'2']), BAD_ALPN);
        // A name's length running past the list.
        assert_eq!(lied(&[0, 3, 9, b'h', b'2']), BAD_ALPN);
        assert_eq!(lied(&[0, 4, 2, b'h', b'2', 5]), BAD_ALPN);
        // An empty list, an empty name, a body too short for a length.
        assert_eq!(lied(&[0, 0]), BAD_ALPN);
        assert_eq!(lied(&[]), BAD_ALPN);
        assert_eq!(lied(&[0]), BAD_ALPN);
        assert_eq!(lied(&[0, 3, 0, 1, b'x']), BAD_ALPN);
        // Garbage.
        assert_eq!(lied(&[0x41; 40]), BAD_ALPN);
        // A second ALPN extension is refused, as a second name is.
        let mut twice = build_with_alpn(Some("a.test"), Some(&alpn_body(&["h2"])), 0);
        let ext: Vec<u8> = [0, 16, 0, 5]
            .into_iter()
            .chain(alpn_body(&["h2"]))
            .collect();
        append_extension(&mut twice, &ext);
        assert_eq!(
            read(&twice),
            Parsed::NotTls("a ClientHello with an extension given twice")
        );
        // The walk over a list stops at a lying length, whatever the bytes.
        assert_eq!(protocols(&[2, b'h', b'2', 9, b'x']).count(), 1);
        assert_eq!(protocols(&[]).count(), 0);
    }

    /// Adds the extension `ext` (type, length, body) at the end of
    /// `hello`, fixing the three lengths before it.
    fn append_extension(hello: &mut Vec<u8>, ext: &[u8]) {
        let grow = |at: &mut [u8], by: usize| {
            let n = usize::from(u16::from_be_bytes([at[0], at[1]])) + by;
            at.copy_from_slice(&(n as u16).to_be_bytes());
        };
        hello.extend_from_slice(ext);
        grow(&mut hello[3..5], ext.len());
        grow(&mut hello[7..9], ext.len()); // the u24's low bytes
                                           // The extensions' length: after version, random, session,
                                           // suites (4 bytes) and compression (2).
        let at = RECORD_HEADER + 4 + 2 + 32 + 1 + 4 + 2;
        grow(&mut hello[at..at + 2], ext.len());
    }

    #[test]
    fn a_thousand_protocols_are_read_in_one_pass_within_the_record() {
        let names: Vec<String> = (0..1000).map(|i| format!("p{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let hello = build_with_alpn(Some("a.test"), Some(&alpn_body(&refs)), 0);
        let got = offered(&hello).unwrap();
        assert_eq!(got.len(), 1000);
        assert_eq!(got.last().map(String::as_str), Some("p999"));
        // A list past the record's 16 KiB is never read at all.
        let long: Vec<String> = (0..5000).map(|i| format!("p{i}")).collect();
        let refs: Vec<&str> = long.iter().map(String::as_str).collect();
        let over = build_with_alpn(Some("a.test"), Some(&alpn_body(&refs)), 0);
        assert!(
            matches!(read(&over), Parsed::NotTls(_)),
            "{:?}",
            read(&over)
        );
    }

    /// `hello`'s handshake message cut into records at `cuts` (offsets in
    /// the message).
    fn split(hello: &[u8], cuts: &[usize]) -> Vec<u8> {
        let message = &hello[RECORD_HEADER..];
        let mut out = Vec::new();
        let mut from = 0;
        for &to in cuts.iter().chain([message.len()].iter()) {
            out.extend_from_slice(&[0x16, 3, 1]);
            out.extend_from_slice(&((to - from) as u16).to_be_bytes());
            out.extend_from_slice(&message[from..to]);
            from = to;
        }
        out
    }

    #[test]
    fn a_hello_over_several_records_is_reassembled() {
        let hello = build(Some("a.test"), 3000);
        // In two, the name in the second; in three, the cut inside the
        // handshake header and inside the name.
        let two = split(&hello, &[100]);
        assert_eq!(read(&two), named(Some("a.test")));
        let at_name = hello.windows(6).position(|w| w == b"a.test").unwrap() - RECORD_HEADER;
        let three = split(&hello, &[2, at_name + 3]);
        assert_eq!(read(&three), named(Some("a.test")));
        // Every cut of the two-record hello waits for exactly its records.
        for cut in 0..two.len() {
            match read(&two[..cut]) {
                Parsed::NeedMore(n) => assert!(n > cut && n <= two.len(), "{cut}: {n}"),
                other => panic!("cut at {cut}: {other:?}"),
            }
        }
        // A hello of 16 KiB in all over two records reads; one byte more is refused.
        let big = build_of_len(Some("a.test"), MAX_HELLO);
        assert_eq!(read(&split(&big, &[9000])), named(Some("a.test")));
        let mut over = split(&big, &[9000]);
        over[6..9].copy_from_slice(&((MAX_RECORD - 3) as u32).to_be_bytes()[1..]);
        assert_eq!(read(&over), Parsed::NotTls("a ClientHello over 16 KiB"));
    }

    #[test]
    fn records_of_other_kinds_or_too_many_are_refused() {
        let hello = build(Some("a.test"), 200);
        let mut two = split(&hello, &[50]);
        let second = RECORD_HEADER + 50;
        two[second] = 0x17; // application data in the middle of a hello
        assert_eq!(
            read(&two),
            Parsed::NotTls("a ClientHello broken by another record")
        );
        // A 16 KiB hello a byte a record is past what a peek may hold.
        let big = build_of_len(Some("a.test"), MAX_HELLO);
        let cuts: Vec<usize> = (1..big.len() - RECORD_HEADER).collect();
        let trickled = split(&big, &cuts);
        assert_eq!(
            read(&trickled),
            Parsed::NotTls("a ClientHello over too many records")
        );
    }

    #[test]
    fn a_built_hello_gives_its_name_and_none_without() {
        let hello = build(Some("a.test"), 0);
        assert_eq!(read(&hello), named(Some("a.test")));
        assert_eq!(read(&build(None, 100)), named(None));
        // The health check's ClientHello, a full modern one, reads too.
        let real = crate::health::protocol::client_hello(Some("b.example.com"));
        assert_eq!(read(&real), named(Some("b.example.com")));
    }

    #[test]
    fn the_largest_record_is_read_and_one_byte_more_is_refused() {
        let hello = build_of_len(Some("a.test"), MAX_HELLO);
        assert_eq!(hello.len(), MAX_HELLO);
        assert_eq!(read(&hello), named(Some("a.test")));
        let mut over = hello.clone();
        over[3..5].copy_from_slice(&((MAX_RECORD + 1) as u16).to_be_bytes());
        assert!(matches!(read(&over), Parsed::NotTls(_)));
    }

    #[test]
    fn garbage_and_lies_are_told_apart() {
        assert!(matches!(read(b"GET / HTTP/1.1\r\n"), Parsed::NotTls(_)));
        assert!(matches!(read(b"G"), Parsed::NotTls(_)));
        assert_eq!(read(b""), Parsed::NeedMore(RECORD_HEADER));
        // A header that claims 16 KiB: wait for all of it.
        assert_eq!(read(&[0x16, 3, 1, 0x40, 0]), Parsed::NeedMore(MAX_HELLO));
        // A handshake length larger than its record.
        let mut hello = build(Some("a.test"), 0);
        hello[6] = 0xff;
        assert_eq!(read(&hello), Parsed::NotTls("a ClientHello over 16 KiB"));
        // A name with a byte no host name has.
        let bad = build(Some("a\0b"), 0);
        assert!(matches!(read(&bad), Parsed::NotTls(_)));
    }

    proptest! {
        #[test]
        fn any_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = read(&bytes);
        }

        #[test]
        fn any_bytes_behind_a_handshake_header_never_panic(
            body in proptest::collection::vec(any::<u8>(), 0..600)
        ) {
            let mut bytes = vec![0x16, 3, 1];
            bytes.extend_from_slice(&(body.len() as u16).to_be_bytes());
            bytes.push(1);
            bytes.extend_from_slice(&body);
            let _ = read(&bytes);
        }

        #[test]
        fn a_built_name_round_trips(
            name in "[a-z0-9]{1,20}(\\.[a-z0-9-]{1,20}){0,4}",
            padding in 0usize..2000,
        ) {
            let hello = build(Some(&name), padding);
            prop_assert_eq!(read(&hello), named(Some(name.as_str())));
        }

        #[test]
        fn every_truncation_needs_more(
            name in "[a-z]{1,30}",
            padding in 0usize..300,
            cut in 0usize..1000,
        ) {
            let hello = build(Some(&name), padding);
            let cut = cut % hello.len();
            match read(&hello[..cut]) {
                Parsed::NeedMore(n) => prop_assert!(n > cut && n <= hello.len()),
                other => prop_assert!(false, "cut at {}: {:?}", cut, other),
            }
        }

        #[test]
        fn any_alpn_body_never_panics(body in proptest::collection::vec(any::<u8>(), 0..300)) {
            let hello = build_with_alpn(Some("x.test"), Some(&body), 0);
            if let Parsed::Hello(h) = read(&hello) {
                prop_assert!(protocols(h.alpn).all(|p| !p.is_empty()));
            }
        }

        #[test]
        fn a_flipped_byte_never_panics(
            padding in 0usize..100,
            at in 0usize..400,
            value in any::<u8>(),
        ) {
            let mut hello = build(Some("x.test"), padding);
            let at = at % hello.len();
            hello[at] = value;
            let _ = read(&hello);
        }
    }
}
