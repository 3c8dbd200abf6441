//! The words between the serving process and the privileged reader, over
//! a Unix stream pair, and the serving side's end of it ([`Client`]).
//!
//! A request is a kind byte (1: the config file given at start, 2: a
//! file by its path), the most bytes wanted (u64, big-endian), then the
//! path's length (u32) and bytes (at most [`MAX_PATH`]). A reply is a
//! status byte (0: the bytes follow; 1: a system error; 2: a directory;
//! 3: not a regular file; 4: too large; 5: refused), a length (u32) and
//! that many bytes: the file, or for 1 the error number (i32) and the
//! system's words, for 5 the reason (at most [`MAX_WORDS`]). Every length
//! is checked before anything is allocated: a reply longer than what was
//! asked, an unknown status, a short read or no answer within the
//! deadline ends the link for good ([`Client`]).
//!
//! # Threads
//!
//! [`Client::read`] runs on the reading thread under the client's mutex;
//! the reader's side ([`read_request`], [`write_reply`]) on the reader's
//! only thread.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C reads no file.

use std::io::{self, Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::system::FileError;

/// The longest path a request may carry.
pub const MAX_PATH: usize = 4096;
/// The most bytes a reply may carry: the largest bound a file is read
/// with (a CRL file, 32 MiB).
pub const MAX_REPLY: u64 = 32 * 1024 * 1024;
/// The longest error text a reply may carry.
pub const MAX_WORDS: usize = 4096;
/// How long the reader may take to answer one request.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

const CONFIG: u8 = 1;
const FILE: u8 = 2;
const OK: u8 = 0;
const IO: u8 = 1;
const DIRECTORY: u8 = 2;
const NOT_REGULAR: u8 = 3;
const TOO_LARGE: u8 = 4;
const REFUSED: u8 = 5;

/// What the serving process asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// The config file given at start.
    Config {
        /// The most bytes wanted.
        max: u64,
    },
    /// A file by its path.
    File {
        /// The path, as the settings give it.
        path: PathBuf,
        /// The most bytes wanted.
        max: u64,
    },
}

/// Writes `request` in one write.
///
/// # Errors
///
/// The write's error; a path over [`MAX_PATH`] is `InvalidInput`.
pub fn write_request(to: &mut impl Write, request: &Request) -> io::Result<()> {
    let (kind, path, max) = match request {
        Request::Config { max } => (CONFIG, &[][..], *max),
        Request::File { path, max } => (FILE, path.as_os_str().as_bytes(), *max),
    };
    if path.len() > MAX_PATH {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a path of over {MAX_PATH} bytes"),
        ));
    }
    let mut frame = vec![kind];
    frame.extend_from_slice(&max.to_be_bytes());
    frame.extend_from_slice(&(path.len() as u32).to_be_bytes());
    frame.extend_from_slice(path);
    to.write_all(&frame)
}

/// The next request; `None` at the end of the stream.
///
/// # Errors
///
/// `InvalidData` for an unknown kind or a path over [`MAX_PATH`]; the
/// read's error.
pub fn read_request(from: &mut impl Read) -> io::Result<Option<Request>> {
    let mut kind = [0u8; 1];
    if from.read(&mut kind)? == 0 {
        return Ok(None);
    }
    let mut head = [0u8; 12];
    from.read_exact(&mut head)?;
    let max = u64::from_be_bytes(head[..8].try_into().unwrap_or_default());
    let len = u32::from_be_bytes(head[8..].try_into().unwrap_or_default()) as usize;
    if len > MAX_PATH {
        return Err(garbage(format!("a path of {len} bytes")));
    }
    let mut path = vec![0u8; len];
    from.read_exact(&mut path)?;
    match kind[0] {
        CONFIG if len == 0 => Ok(Some(Request::Config { max })),
        FILE if len > 0 => Ok(Some(Request::File {
            path: PathBuf::from(std::ffi::OsString::from_vec(path)),
            max,
        })),
        other => Err(garbage(format!("request kind {other}"))),
    }
}

fn garbage(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// Writes the answer to one request: the bytes, or why not.
///
/// # Errors
///
/// The write's error.
pub fn write_reply(to: &mut impl Write, answer: &Result<Vec<u8>, FileError>) -> io::Result<()> {
    let clip = |text: String| {
        let mut bytes = text.into_bytes();
        bytes.truncate(MAX_WORDS - 4);
        bytes
    };
    let (status, body) = match answer {
        Ok(bytes) => (OK, &bytes[..]),
        Err(FileError::Io(e)) => {
            let mut words = e.raw_os_error().unwrap_or(0).to_be_bytes().to_vec();
            if e.raw_os_error().is_none() {
                words.extend(clip(e.to_string()));
            }
            return write_frame(to, IO, &words);
        }
        Err(FileError::Directory) => (DIRECTORY, &[][..]),
        Err(FileError::NotRegular) => (NOT_REGULAR, &[][..]),
        Err(FileError::TooLarge) => (TOO_LARGE, &[][..]),
    };
    write_frame(to, status, body)
}

/// A status byte, the body's length, the body (a file's bytes are not
/// copied into the frame).
fn write_frame(to: &mut impl Write, status: u8, body: &[u8]) -> io::Result<()> {
    let mut head = vec![status];
    head.extend_from_slice(&(body.len() as u32).to_be_bytes());
    to.write_all(&head)?;
    to.write_all(body)
}

/// Writes a refusal: `why` the reader will not read what was asked.
///
/// # Errors
///
/// The write's error.
pub fn write_refusal(to: &mut impl Write, why: &str) -> io::Result<()> {
    let body = why.as_bytes();
    write_frame(to, REFUSED, &body[..body.len().min(MAX_WORDS)])
}

/// Reads one reply to a request for at most `max` bytes. The outer error
/// is the link's failure, in words: the stream can no longer be trusted.
///
/// # Errors
///
/// The words for a short read, a timeout, a length over what was asked,
/// an unknown status.
pub fn read_reply(from: &mut impl Read, max: u64) -> Result<Result<Vec<u8>, FileError>, String> {
    let mut head = [0u8; 5];
    from.read_exact(&mut head).map_err(|e| link_words(&e))?;
    let len = u32::from_be_bytes(head[1..].try_into().unwrap_or_default()) as u64;
    let bound = match head[0] {
        OK => max.min(MAX_REPLY),
        IO | REFUSED => MAX_WORDS as u64,
        DIRECTORY | NOT_REGULAR | TOO_LARGE => 0,
        other => return Err(format!("it answered garbage (status {other})")),
    };
    if len > bound {
        return Err(format!(
            "it announced {len} bytes where at most {bound} may come"
        ));
    }
    let mut body = vec![0u8; len as usize];
    from.read_exact(&mut body).map_err(|e| link_words(&e))?;
    Ok(match head[0] {
        OK => Ok(body),
        IO if body.len() >= 4 => {
            let code = i32::from_be_bytes(body[..4].try_into().unwrap_or_default());
            Err(FileError::Io(match code {
                0 => io::Error::other(String::from_utf8_lossy(&body[4..]).into_owned()),
                code => io::Error::from_raw_os_error(code),
            }))
        }
        IO => return Err("it answered garbage (a short error)".into()),
        DIRECTORY => Err(FileError::Directory),
        NOT_REGULAR => Err(FileError::NotRegular),
        TOO_LARGE => Err(FileError::TooLarge),
        _ => Err(FileError::Io(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "the root reader refused: {}",
                String::from_utf8_lossy(&body)
            ),
        ))),
    })
}

/// A read or write error on the link, in words.
fn link_words(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::ConnectionReset => "it closed the link (did it die?)".into(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => "it did not answer in time".into(),
        _ => format!("the link failed: {}", crate::system::error_words(e)),
    }
}

/// The serving process's end of the link to the privileged reader. A
/// failure of the link ends it for good: the reader, if still there, is
/// stopped, and every later read says why.
#[derive(Debug)]
pub struct Client {
    link: Mutex<Link>,
    /// The config file given at start: asked for as such.
    config: Option<PathBuf>,
    /// How long one answer may take.
    timeout: Duration,
    /// The reader's process, stopped and reaped when the link fails.
    pid: Option<libc::pid_t>,
}

#[derive(Debug)]
enum Link {
    Up(UnixStream),
    Gone(String),
}

impl Client {
    /// The end `stream` of a link to a reader; `config` is the config
    /// file given at start, `timeout` the longest one answer may take.
    pub fn new(stream: UnixStream, config: Option<PathBuf>, timeout: Duration) -> Client {
        Client {
            link: Mutex::new(Link::Up(stream)),
            config,
            timeout,
            pid: None,
        }
    }

    /// The same, for the reader process `pid`.
    pub fn for_process(mut self, pid: libc::pid_t) -> Client {
        self.pid = Some(pid);
        self
    }

    /// The bytes of `path`, at most `max`, as the reader read them.
    ///
    /// # Errors
    ///
    /// The reader's [`FileError`]; a failed link is a [`FileError::Io`]
    /// in words, now and at every later read.
    pub fn read(&self, path: &Path, max: u64) -> Result<Vec<u8>, FileError> {
        let mut link = self.link.lock();
        let stream = match &*link {
            Link::Up(stream) => stream,
            Link::Gone(why) => {
                return Err(FileError::Io(io::Error::other(format!(
                    "the root reader stopped at an earlier reload ({why}); restart \
                     rodizio to read root's files again"
                ))))
            }
        };
        let request = match &self.config {
            Some(config) if config == path => Request::Config { max },
            _ => Request::File {
                path: path.to_path_buf(),
                max,
            },
        };
        match self.exchange(stream, &request, max) {
            Ok(answer) => answer,
            Err(why) => {
                let _ = stream.shutdown(std::net::Shutdown::Both);
                self.stop_reader();
                *link = Link::Gone(why.clone());
                Err(FileError::Io(io::Error::other(format!(
                    "the root reader failed: {why}; it was stopped, restart rodizio to \
                     read root's files again"
                ))))
            }
        }
    }

    /// One request and its reply, within the deadline.
    fn exchange(
        &self,
        stream: &UnixStream,
        request: &Request,
        max: u64,
    ) -> Result<Result<Vec<u8>, FileError>, String> {
        let until = Instant::now() + self.timeout;
        let mut writer = stream;
        writer
            .set_write_timeout(Some(self.timeout))
            .and_then(|()| write_request(&mut writer, request))
            .map_err(|e| link_words(&e))?;
        read_reply(&mut Timed { stream, until }, max)
    }

    /// Stops the reader process, if known, and reaps it.
    fn stop_reader(&self) {
        if let Some(pid) = self.pid {
            // SAFETY: signals and waits for our own child, by its id.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
    }
}

/// A stream whose reads all end by `until`: a reader that trickles its
/// reply cannot stretch the deadline.
struct Timed<'a> {
    stream: &'a UnixStream,
    until: Instant,
}

impl Read for Timed<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        let mut stream = self.stream;
        stream.read(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_round_trip() {
        for request in [
            Request::Config { max: 7 },
            Request::File {
                path: "/etc/ssl/a.pem".into(),
                max: 1 << 20,
            },
        ] {
            let mut wire = Vec::new();
            write_request(&mut wire, &request).unwrap();
            let mut from = &wire[..];
            assert_eq!(read_request(&mut from).unwrap(), Some(request));
            assert_eq!(read_request(&mut from).unwrap(), None);
        }
        let mut wire = Vec::new();
        write_reply(&mut wire, &Ok(b"pem".to_vec())).unwrap();
        let denied = io::Error::from_raw_os_error(libc::EACCES);
        write_reply(&mut wire, &Err(FileError::Io(denied))).unwrap();
        write_reply(&mut wire, &Err(FileError::NotRegular)).unwrap();
        write_refusal(&mut wire, "not a file the settings name").unwrap();
        let mut from = &wire[..];
        assert_eq!(read_reply(&mut from, 3).unwrap().unwrap(), b"pem");
        let Err(FileError::Io(e)) = read_reply(&mut from, 3).unwrap() else {
            panic!("not an I/O error")
        };
        assert_eq!(e.raw_os_error(), Some(libc::EACCES));
        assert!(matches!(
            read_reply(&mut from, 3).unwrap(),
            Err(FileError::NotRegular)
        ));
        let Err(FileError::Io(e)) = read_reply(&mut from, 3).unwrap() else {
            panic!("not a refusal")
        };
        assert!(e.to_string().contains("settings name"), "{e}");
    }

    #[test]
    fn a_reply_over_the_bound_or_of_no_known_status_is_refused() {
        let mut wire = Vec::new();
        write_reply(&mut wire, &Ok(b"four".to_vec())).unwrap();
        let why = read_reply(&mut &wire[..], 3).unwrap_err();
        assert!(why.contains("announced 4 bytes"), "{why}");
        let why = read_reply(&mut &[9u8, 0, 0, 0, 0][..], 3).unwrap_err();
        assert!(why.contains("garbage"), "{why}");
        let bad = [7u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        assert!(read_request(&mut &bad[..]).is_err());
    }
}
