//! The access log: one line per client connection, written when it ends, in
//! the spirit of HAProxy's `option tcplog`.
//!
//! Whoever ends a connection hands a [`Record`] to [`AccessLog::log`]: the
//! reporter of a worker (`proxy/report.rs`) or the accept loop, for a client
//! it refuses. `log` never blocks: it tries a bounded channel and counts the
//! record as dropped when the writer has fallen behind. One writer thread
//! (`writer`) formats ([`Format`]) and writes the lines.
//!
//! - `record`: what a line says, and [`End`], how a connection ended;
//! - `format`: the text and JSON lines (JSON through `serde_json`);
//! - `template`: `access_log_format`, a line of the operator's own;
//! - `syslog`: RFC 5424 datagrams to a syslog daemon, never blocking;
//! - `writer`: the thread, its file, reopening after logrotate.
//!
//! # Threads
//!
//! Workers and the accept loop call [`AccessLog::log`] (a lock-free
//! `try_send`); only the writer thread touches the file.
//!
//! # Corresponds to the C article
//!
//! The C prints `### REQUEST FINISHED ###` at the end of `proxy_function()`,
//! from each worker, with nothing about who, where or how: this is the same
//! moment with the facts in it, written by one thread.

mod format;
mod record;
mod syslog;
mod template;
mod writer;

use std::fmt;
use std::io::{self, BufWriter};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use crossbeam_channel::{Sender, TrySendError};
use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::throttle::LogThrottle;

pub use format::Format;
pub use record::{
    current_sni, set_sni, with_sni, End, Phase, Record, SniGuard, TlsNote, TriesEnded,
};
pub use syslog::SyslogAddr;
pub use template::{Template, FIELDS, MAX_TEMPLATE};
use writer::{open, Sink, Writer};

/// Most records waiting for the writer; one more is dropped and counted.
///
/// 8192 lines absorb a burst of several thousand connections ending at once
/// (a drain, a backend going down) while the disk catches up. The channel
/// allocates all its slots at start-up: about 200 bytes each, under 2 MiB.
pub const CHANNEL_CAPACITY: usize = 8192;

/// The name of the one service of a configuration without `services`
/// (`config::DEFAULT_SERVICE` re-exports it). Its lines carry no service
/// name ([`Record::service`]): a flat configuration's log reads as before
/// services existed. Declared here, below the connection's report and the
/// configuration that both name it.
pub const DEFAULT_SERVICE: &str = "default";

/// The writer's buffer: lines are collected here and written in one call.
const WRITE_BUFFER: usize = 64 * 1024;

/// Shortest time between two warnings about dropped lines (or two errors
/// about failed writes): a disk that cannot keep up must not also flood the
/// error log.
const REPORT_INTERVAL: Duration = Duration::from_secs(60);

/// Where the lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Standard output ([`AccessLog::reopen`] does nothing).
    Stdout,
    /// A file, created if missing and appended to.
    File(PathBuf),
    /// A syslog daemon, one RFC 5424 datagram per line (`syslog.rs`).
    Syslog(SyslogAddr),
}

/// `access_log_target`: where the operator sends the lines; the file's
/// path is `access_log_file`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// `stdout`.
    Stdout,
    /// `file`: `access_log_file`.
    File,
    /// `syslog:ADDR`: `syslog:127.0.0.1:514`, `syslog:/dev/log`.
    Syslog(SyslogAddr),
}

impl std::str::FromStr for Destination {
    type Err = Error;

    fn from_str(text: &str) -> Result<Destination> {
        match text {
            "stdout" => Ok(Destination::Stdout),
            "file" => Ok(Destination::File),
            _ => match text.strip_prefix("syslog:") {
                Some(addr) => addr.parse().map(Destination::Syslog),
                None => Err(Error::InvalidConfig(format!(
                    "access log target '{text}': expected stdout, file, syslog:IP:PORT \
                     or syslog:/PATH"
                ))),
            },
        }
    }
}

impl Destination {
    /// Whether the lines go to a syslog daemon.
    pub fn is_syslog(&self) -> bool {
        matches!(self, Destination::Syslog(_))
    }
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Destination::Stdout => f.write_str("stdout"),
            Destination::File => f.write_str("file"),
            Destination::Syslog(addr) => write!(f, "syslog:{addr}"),
        }
    }
}

/// What an access log is started with besides its target.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Text or JSON.
    pub format: Format,
    /// `access_log_format`: the line's template, in place of `format`'s.
    pub template: Option<Template>,
    /// `access_log_interval`: an interim line for each connection open
    /// longer, every so often.
    pub interval: Option<Duration>,
    /// `access_log_at_connect`: a line when the backend is connected.
    pub at_connect: bool,
}

/// The handle the workers and the accept loop log through.
///
/// Cheap to clone (an `Arc`). When the last clone is dropped, or at
/// [`close`](Self::close), the writer writes what is queued, flushes and
/// exits, and the caller waits for it.
#[derive(Clone)]
pub struct AccessLog {
    inner: Arc<Inner>,
}

struct Inner {
    /// Where `log` puts records; the writer holds the other end.
    records: Sender<Record>,
    /// Requests to the writer that must not be lost when `records` is full.
    control: Sender<Control>,
    counters: Arc<Counters>,
    /// `access_log_interval`.
    interval: Option<Duration>,
    /// `access_log_at_connect`.
    at_connect: bool,
    /// The writer thread, taken by the first `close`.
    writer: Mutex<Option<JoinHandle<()>>>,
}

/// What the handles ask of the writer besides writing.
enum Control {
    /// Open the file again at the same path.
    Reopen,
    /// Write what is queued, flush and exit.
    Close,
}

#[derive(Debug, Default)]
struct Counters {
    /// Lines handed to the file (or to standard output).
    written: AtomicU64,
    /// Records dropped because the channel was full or the log closed.
    dropped: AtomicU64,
    /// Lines the target did not take: a failed write, a syslog receiver
    /// gone, full or slow.
    undelivered: AtomicU64,
}

impl fmt::Debug for AccessLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AccessLog")
            .field("queued", &self.inner.records.len())
            .field("written", &self.written())
            .field("dropped", &self.dropped())
            .finish()
    }
}

impl AccessLog {
    /// Opens the target and starts the writer thread (`rodizio-access-log`).
    ///
    /// The file is opened here, not in the writer, so that a bad path is a
    /// start-up error and not a log line nobody reads.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when the file cannot be opened or the thread not spawned.
    pub fn start(format: Format, target: Target) -> Result<AccessLog> {
        let options = Options {
            format,
            ..Options::default()
        };
        AccessLog::open(options, target)
    }

    /// Opens the target and starts the writer thread with `options`.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start); a syslog socket that cannot be made.
    pub fn open(options: Options, target: Target) -> Result<AccessLog> {
        let sink = match target {
            Target::Syslog(addr) => Sink::Syslog(
                syslog::Syslog::open(&addr)
                    .map_err(|e| Error::io(format!("opening the access log's syslog {addr}"), e))?,
            ),
            Target::Stdout => Sink::Stdout(BufWriter::with_capacity(WRITE_BUFFER, io::stdout())),
            Target::File(path) => {
                let file = open(&path).map_err(|e| {
                    Error::io(format!("opening the access log {}", path.display()), e)
                })?;
                Sink::File {
                    out: BufWriter::with_capacity(WRITE_BUFFER, file),
                    path,
                }
            }
        };
        let (records, records_rx) = crossbeam_channel::bounded(CHANNEL_CAPACITY);
        // Unbounded, but only a signal or `close` ever sends on it, and the
        // writer reads it before every record.
        let (control, control_rx) = crossbeam_channel::unbounded();
        let counters = Arc::new(Counters::default());
        let writer = Writer {
            format: options.format,
            template: options.template,
            records: records_rx,
            control: control_rx,
            counters: Arc::clone(&counters),
            sink,
            line: Vec::with_capacity(512),
            closing: false,
            drops: LogThrottle::new(REPORT_INTERVAL),
            reported_drops: 0,
            errors: LogThrottle::new(REPORT_INTERVAL),
            lost: 0,
        };
        let handle = thread::Builder::new()
            .name("rodizio-access-log".into())
            .spawn(move || writer.run())
            .map_err(|e| Error::io("starting the access log writer", e))?;
        Ok(AccessLog {
            inner: Arc::new(Inner {
                records,
                control,
                counters,
                interval: options.interval,
                at_connect: options.at_connect,
                writer: Mutex::new(Some(handle)),
            }),
        })
    }

    /// Queues `record` for the writer; never blocks.
    ///
    /// When the channel is full (the writer fell behind) or the log is
    /// closed, the record is dropped and counted in [`dropped`](Self::dropped).
    /// Returns whether the record was queued (false: dropped and counted).
    pub fn log(&self, record: Record) -> bool {
        match self.inner.records.try_send(record) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.inner.counters.dropped.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Asks the writer to open the file again at the same path (after
    /// logrotate renamed it). Every line logged after this call returns goes
    /// to the new file; lines still queued may go to either.
    ///
    /// Does not wait for the writer. If the file cannot be opened, the
    /// writer logs the error and keeps writing to the old one. Nothing
    /// happens for [`Target::Stdout`] or after [`close`](Self::close).
    pub fn reopen(&self) {
        let _ = self.inner.control.send(Control::Reopen);
    }

    /// Writes every record queued so far, flushes, and stops the writer;
    /// returns once it has exited. Later records are dropped and counted.
    ///
    /// Dropping the last handle does the same. Either blocks for as long as
    /// the last writes take: a writer stuck on a pipe nobody reads keeps it
    /// waiting.
    pub fn close(&self) {
        self.inner.close();
    }

    /// Lines written so far (handed to the file, perhaps not yet flushed).
    pub fn written(&self) -> u64 {
        self.inner.counters.written.load(Ordering::Relaxed)
    }

    /// Records dropped so far: the channel was full, or the log was closed.
    pub fn dropped(&self) -> u64 {
        self.inner.counters.dropped.load(Ordering::Relaxed)
    }

    /// Lines the target did not take so far (a failed write; a syslog
    /// receiver gone, full or slow): formatted, then lost.
    pub fn undelivered(&self) -> u64 {
        self.inner.counters.undelivered.load(Ordering::Relaxed)
    }

    /// `access_log_interval`: how often a connection open longer gets an
    /// interim line; `None`: never.
    pub fn interval(&self) -> Option<Duration> {
        self.inner.interval
    }

    /// `access_log_at_connect`: whether a line is written at the connect.
    pub fn at_connect(&self) -> bool {
        self.inner.at_connect
    }
}

impl Inner {
    fn close(&self) {
        // The lock is held while joining, so that a second `close` running
        // at the same time returns only once the writer is gone, too.
        let mut writer = self.writer.lock();
        if let Some(handle) = writer.take() {
            let _ = self.control.send(Control::Close);
            if handle.join().is_err() {
                log::error!("access log: the writer thread panicked");
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {

    use super::format::{Rfc3339, Short};
    use super::*;
    use crate::proxy::pump;
    use std::fs::File;
    use std::io::Read;
    use std::net::SocketAddr;
    use std::net::{IpAddr, Ipv4Addr};
    use std::path::Path;
    use std::sync::atomic::AtomicUsize;
    use std::time::{Instant, SystemTime, UNIX_EPOCH};

    fn at(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(ms)
    }

    fn rfc3339(t: SystemTime) -> String {
        Rfc3339(t).to_string()
    }

    /// 2026-12-01T09:53:20.123Z
    const T: u64 = 1_796_118_800_123;

    fn client() -> SocketAddr {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 5000)
    }

    /// A record as a worker would fill it for `end`: no backend and no
    /// connect for the ends that happen before one is reached.
    fn record(end: End) -> Record {
        let (backend, connect, failovers) = match end {
            End::NoBackend | End::RateLimited | End::QueueTimeout => (None, None, 0),
            End::ConnectFailed(_) => (Some("127.0.0.1:8003"), None, 3),
            End::FailedOver => (Some("127.0.0.1:8002"), Some(3_085), 1),
            _ => (Some("127.0.0.1:8001"), Some(85), 0),
        };
        let moved = connect.is_some();
        Record {
            time: at(T),
            client: client(),
            service: None,
            sni: None,
            backend: backend.map(String::from),
            queue_wait: Duration::from_micros(12),
            connect_time: connect.map(Duration::from_micros),
            duration: Duration::from_micros(1_203),
            failovers,
            failovers_ended: None,
            phase: Phase::End,
            bytes_to_backend: if moved { 77 } else { 0 },
            bytes_to_client: if moved { 612 } else { 0 },
            end,
            tls: None,
        }
    }

    fn every_end() -> Vec<End> {
        vec![
            End::Pumped(pump::End::ClientClosed),
            End::Pumped(pump::End::BackendClosed),
            End::Pumped(pump::End::ClientReset),
            End::Pumped(pump::End::BackendReset),
            End::Pumped(pump::End::IdleTimeout),
            End::ConnectFailed("refused".into()),
            End::FailedOver,
            End::NoBackend,
            End::RateLimited,
            End::QueueTimeout,
            End::DrainCut,
            End::Error("Broken pipe (os error 32)".into()),
        ]
    }

    // ---- time ----

    fn is_leap(y: i64) -> bool {
        (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
    }

    fn month_len(y: i64, m: u32) -> u32 {
        match m {
            2 if is_leap(y) => 29,
            2 => 28,
            4 | 6 | 9 | 11 => 30,
            _ => 31,
        }
    }

    /// The date printed agrees with a calendar walked one day at a time,
    /// 400 years each way from 1970 (a whole era, so every leap rule is
    /// crossed), at the day's first and last millisecond.
    #[test]
    fn dates_match_a_day_by_day_walk() {
        let day = |days: i64, ms_of_day: u64| {
            let start = Duration::from_secs(days.unsigned_abs() * 86_400);
            let midnight = if days < 0 {
                UNIX_EPOCH - start
            } else {
                UNIX_EPOCH + start
            };
            rfc3339(midnight + Duration::from_millis(ms_of_day))
        };
        for (range, step) in [(0..=146_097i64, 1), (-146_097..=0, -1)] {
            let (mut y, mut m, mut d) = (1970, 1, 1);
            let days: Vec<i64> = if step > 0 {
                range.collect()
            } else {
                range.rev().collect()
            };
            for days in days {
                let date = format!("{y:04}-{m:02}-{d:02}");
                assert_eq!(day(days, 0), format!("{date}T00:00:00.000Z"));
                assert_eq!(day(days, 86_399_999), format!("{date}T23:59:59.999Z"));
                if step > 0 {
                    d += 1;
                    if d > month_len(y, m) {
                        (d, m) = (1, m + 1);
                        if m > 12 {
                            (m, y) = (1, y + 1);
                        }
                    }
                } else {
                    d -= 1;
                    if d == 0 {
                        m -= 1;
                        if m == 0 {
                            (m, y) = (12, y - 1);
                        }
                        d = month_len(y, m);
                    }
                }
            }
        }
    }

    /// A named service is on both formats' lines, right after the client;
    /// the one service of a flat configuration is not named.
    #[test]
    fn a_named_service_is_on_the_line() {
        let mut r = record(End::Pumped(pump::End::ClientClosed));
        let plain = Format::Text.line(&r);
        assert!(!plain.contains("service"), "{plain}");
        r.service = Some("web".into());
        let text = Format::Text.line(&r);
        assert!(
            text.contains(&format!("{} service=web backend=", client())),
            "{text}"
        );
        let json = Format::Json.line(&r);
        assert!(json.contains(r#","service":"web","backend":"#), "{json}");
        r.service = Some("a b".into());
        let text = Format::Text.line(&r);
        assert!(text.contains(r#" service="a b" backend="#), "{text}");
    }

    /// Known instants, a leap day among them, and times before 1970.
    #[test]
    fn formats_known_instants() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(at(1_709_251_199_999)), "2024-02-29T23:59:59.999Z");
        assert_eq!(rfc3339(at(1_709_164_800_000)), "2024-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(at(T)), "2026-12-01T09:53:20.123Z");
        assert_eq!(rfc3339(at(951_868_800_000)), "2000-03-01T00:00:00.000Z");
        assert_eq!(rfc3339(at(4_107_499_200_000)), "2100-02-28T12:00:00.000Z");
        // Truncated, never rounded up into the next second or day.
        assert_eq!(
            rfc3339(at(1_709_251_199_999) + Duration::from_micros(999)),
            "2024-02-29T23:59:59.999Z"
        );
        assert_eq!(
            rfc3339(UNIX_EPOCH - Duration::from_millis(1)),
            "1969-12-31T23:59:59.999Z"
        );
        assert_eq!(
            rfc3339(UNIX_EPOCH - Duration::from_micros(1)),
            "1969-12-31T23:59:59.999Z"
        );
        assert_eq!(
            rfc3339(UNIX_EPOCH - Duration::from_secs(86_400)),
            "1969-12-31T00:00:00.000Z"
        );
    }

    #[test]
    fn short_durations() {
        let cases = [
            (0, "0us"),
            (12, "12us"),
            (999, "999us"),
            (1_000, "1.000ms"),
            (1_203, "1.203ms"),
            (999_999, "999.999ms"),
            (1_000_000, "1.000s"),
            (2_500_999, "2.500s"),
            (3_723_004_000, "3723.004s"),
        ];
        for (us, text) in cases {
            assert_eq!(Short(Duration::from_micros(us)).to_string(), text);
        }
        assert_eq!(Short(Duration::from_nanos(999)).to_string(), "0us");
    }

    // ---- formats ----

    /// The text line of a record for each end, field by field.
    #[test]
    fn text_lines_for_every_end() {
        let t = "2026-12-01T09:53:20.123Z 127.0.0.1:5000";
        let served = "backend=127.0.0.1:8001 queue=12us connect=85us duration=1.203ms failovers=0 to_backend=77 to_client=612";
        let unserved =
            "backend=- queue=12us connect=- duration=1.203ms failovers=0 to_backend=0 to_client=0";
        let expected = [
            format!("{t} {served} end=client_closed"),
            format!("{t} {served} end=backend_closed"),
            format!("{t} {served} end=client_reset"),
            format!("{t} {served} end=backend_reset"),
            format!("{t} {served} end=idle_timeout"),
            format!("{t} backend=127.0.0.1:8003 queue=12us connect=- duration=1.203ms failovers=3 to_backend=0 to_client=0 end=connect_failed reason=refused"),
            format!("{t} backend=127.0.0.1:8002 queue=12us connect=3.085ms duration=1.203ms failovers=1 to_backend=77 to_client=612 end=failed_over"),
            format!("{t} {unserved} end=no_backend"),
            format!("{t} {unserved} end=rate_limited"),
            format!("{t} {unserved} end=queue_timeout"),
            format!("{t} {served} end=drain_cut"),
            format!("{t} {served} end=error reason=\"Broken pipe (os error 32)\""),
        ];
        let ends = every_end();
        assert_eq!(ends.len(), expected.len());
        for (end, expected) in ends.into_iter().zip(expected) {
            assert_eq!(Format::Text.line(&record(end)), expected);
        }
        // The line of the format's documentation.
        assert_eq!(
            Format::Text.line(&record(End::Pumped(pump::End::BackendClosed))),
            "2026-12-01T09:53:20.123Z 127.0.0.1:5000 backend=127.0.0.1:8001 queue=12us connect=85us duration=1.203ms failovers=0 to_backend=77 to_client=612 end=backend_closed"
        );
    }

    /// The JSON line of a record for each end, and each parses back.
    #[test]
    fn json_lines_for_every_end() {
        let t = r#"{"time":"2026-12-01T09:53:20.123Z","client":"127.0.0.1:5000""#;
        let served = r#""backend":"127.0.0.1:8001","queue_us":12,"connect_us":85,"duration_us":1203,"failovers":0,"to_backend":77,"to_client":612"#;
        let unserved = r#""backend":null,"queue_us":12,"connect_us":null,"duration_us":1203,"failovers":0,"to_backend":0,"to_client":0"#;
        let expected = [
            format!(r#"{t},{served},"end":"client_closed","reason":null}}"#),
            format!(r#"{t},{served},"end":"backend_closed","reason":null}}"#),
            format!(r#"{t},{served},"end":"client_reset","reason":null}}"#),
            format!(r#"{t},{served},"end":"backend_reset","reason":null}}"#),
            format!(r#"{t},{served},"end":"idle_timeout","reason":null}}"#),
            format!(
                r#"{t},"backend":"127.0.0.1:8003","queue_us":12,"connect_us":null,"duration_us":1203,"failovers":3,"to_backend":0,"to_client":0,"end":"connect_failed","reason":"refused"}}"#
            ),
            format!(
                r#"{t},"backend":"127.0.0.1:8002","queue_us":12,"connect_us":3085,"duration_us":1203,"failovers":1,"to_backend":77,"to_client":612,"end":"failed_over","reason":null}}"#
            ),
            format!(r#"{t},{unserved},"end":"no_backend","reason":null}}"#),
            format!(r#"{t},{unserved},"end":"rate_limited","reason":null}}"#),
            format!(r#"{t},{unserved},"end":"queue_timeout","reason":null}}"#),
            format!(r#"{t},{served},"end":"drain_cut","reason":null}}"#),
            format!(r#"{t},{served},"end":"error","reason":"Broken pipe (os error 32)"}}"#),
        ];
        let ends = every_end();
        assert_eq!(ends.len(), expected.len());
        for (end, expected) in ends.into_iter().zip(expected) {
            let r = record(end);
            let line = Format::Json.line(&r);
            assert_eq!(line, expected);
            let fields = parse_object(&line);
            let keys: Vec<&str> = fields.iter().map(|(k, _)| k.as_str()).collect();
            assert_eq!(
                keys,
                [
                    "time",
                    "client",
                    "backend",
                    "queue_us",
                    "connect_us",
                    "duration_us",
                    "failovers",
                    "to_backend",
                    "to_client",
                    "end",
                    "reason"
                ]
            );
            let get = |key: &str| &fields.iter().find(|(k, _)| k == key).unwrap().1;
            assert_eq!(get("end"), &Json::Str(r.end.name().into()));
            assert_eq!(get("to_client"), &Json::Num(r.bytes_to_client));
            match r.end.reason() {
                Some(reason) => assert_eq!(get("reason"), &Json::Str(reason.into())),
                None => assert_eq!(get("reason"), &Json::Null),
            }
        }
    }

    /// Quotes, backslashes and control characters cannot break a line or a
    /// field, in either format.
    #[test]
    fn escapes_reasons_and_backends() {
        let reason = "bad \"peer\"\\ said:\nhi\r\t\u{1}\u{7f} ã\u{8}\u{c}";
        let mut r = record(End::Error(reason.into()));
        r.backend = Some("my backend".into());
        let escaped = r#""bad \"peer\"\\ said:\nhi\r\t\u0001\u007f ã\b\f""#;

        let text = Format::Text.line(&r);
        assert!(!text.contains('\n') && !text.contains('\r'));
        assert!(text.contains(r#" backend="my backend" "#), "{text}");
        assert!(
            text.ends_with(&format!(" end=error reason={escaped}")),
            "{text}"
        );

        let json = Format::Json.line(&r);
        assert!(json.ends_with(&format!(r#","end":"error","reason":{escaped}}}"#)));
        let fields = parse_object(&json);
        assert!(fields.contains(&("reason".into(), Json::Str(reason.into()))));
        assert!(fields.contains(&("backend".into(), Json::Str("my backend".into()))));

        // An empty reason is still a field.
        let empty = Format::Text.line(&record(End::Error(String::new())));
        assert!(empty.ends_with(" end=error reason=\"\""), "{empty}");
    }

    /// A limit that ended the fail-over is named after the count, in
    /// both formats; without one the lines are as before.
    #[test]
    fn a_limit_that_ended_the_tries_is_named() {
        let mut r = record(End::ConnectFailed("timeout".into()));
        assert!(Format::Text.line(&r).contains(" failovers=3 to_backend="));
        assert!(!Format::Json.line(&r).contains("failovers_ended"));
        for (ended, word) in [
            (TriesEnded::Retries, "retries"),
            (TriesEnded::Budget, "budget"),
        ] {
            r.failovers_ended = Some(ended);
            let text = Format::Text.line(&r);
            assert!(
                text.contains(&format!(" failovers=3/{word} to_backend=")),
                "{text}"
            );
            let json = Format::Json.line(&r);
            assert!(
                json.contains(&format!(r#""failovers":3,"failovers_ended":"{word}","#)),
                "{json}"
            );
        }
    }

    #[test]
    fn ipv6_clients_and_long_durations() {
        let mut r = record(End::Pumped(pump::End::ClientClosed));
        r.client = "[2001:db8::1]:40000".parse().unwrap();
        r.duration = Duration::from_secs(601);
        let text = Format::Text.line(&r);
        assert!(text.starts_with("2026-12-01T09:53:20.123Z [2001:db8::1]:40000 "));
        assert!(text.contains(" duration=601.000s "));
        let json = Format::Json.line(&r);
        assert!(json.contains(r#""client":"[2001:db8::1]:40000""#));
        assert!(json.contains(r#""duration_us":601000000,"#));
    }

    #[test]
    fn end_names_are_unique_snake_case() {
        let names: Vec<&str> = every_end().iter().map(End::name).collect();
        for name in &names {
            assert!(name.chars().all(|c| c.is_ascii_lowercase() || c == '_'));
            assert_eq!(names.iter().filter(|n| *n == name).count(), 1, "{name}");
        }
        assert_eq!(End::DrainCut.to_string(), "drain_cut");
    }

    #[test]
    fn format_from_str() {
        assert_eq!("text".parse::<Format>().unwrap(), Format::Text);
        assert_eq!("json".parse::<Format>().unwrap(), Format::Json);
        let err = "xml".parse::<Format>().unwrap_err();
        assert!(err.is_usage());
        assert!(err.to_string().contains("expected text or json"), "{err}");
        assert_eq!(Format::default().to_string(), "text");
    }

    #[test]
    fn throttle_says_yes_at_most_once_per_interval() {
        // The writer's throttle is `LogThrottle`, created before any `now`
        // it is told.
        let t = LogThrottle::new(Duration::from_secs(60));
        let start = Instant::now();
        assert_eq!(t.wait(start), Duration::ZERO);
        assert!(t.event(start).is_some());
        assert!(t.event(start + Duration::from_secs(59)).is_none());
        assert_eq!(
            t.wait(start + Duration::from_secs(59)),
            Duration::from_secs(1)
        );
        assert!(t.event(start + Duration::from_secs(60)).is_some());
        assert!(t.event(start + Duration::from_secs(61)).is_none());
        assert!(t.event(start + Duration::from_secs(200)).is_some());
    }

    // ---- the writer ----

    /// A path under the temp directory, unique to this test run; the file
    /// (or directory) is removed on drop.
    struct TempPath(PathBuf);

    impl TempPath {
        fn new(name: &str) -> TempPath {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            TempPath(std::env::temp_dir().join(format!(
                "rodizio-access-log-{}-{n}-{name}",
                std::process::id()
            )))
        }
    }

    impl Drop for TempPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
            let _ = std::fs::remove_dir(&self.0);
        }
    }

    /// A terminated TLS client's line says its version and server name;
    /// a plain one's says nothing of TLS.
    #[test]
    fn tls_version_and_server_name_on_both_formats() {
        let mut r = record(End::Pumped(pump::End::ClientClosed));
        let line = |r: &Record, f: Format| {
            let mut out = Vec::new();
            f.write(r, &mut out);
            String::from_utf8(out).unwrap()
        };
        assert!(!line(&r, Format::Text).contains("tls="));
        assert!(!line(&r, Format::Json).contains("\"tls\""));
        r.tls = Some(TlsNote {
            version: "TLSv1.3",
            sni: Some("a.test".into()),
            client: None,
        });
        assert!(
            line(&r, Format::Text).contains(" tls=TLSv1.3 sni=a.test"),
            "{}",
            line(&r, Format::Text)
        );
        let json = line(&r, Format::Json);
        assert!(json.contains(r#""sni":"a.test""#), "{json}");
        assert!(json.contains(r#""tls":"TLSv1.3""#), "{json}");
        r.tls = Some(TlsNote {
            version: "TLSv1.2",
            sni: None,
            client: None,
        });
        assert!(line(&r, Format::Text).contains(" tls=TLSv1.2 sni=-"));
        assert!(!line(&r, Format::Text).contains("tls_client"));
        assert!(!line(&r, Format::Json).contains("tls_client"));
        // The accepted client certificate's subject, quoted in the text
        // line when it has a space.
        r.tls = Some(TlsNote {
            version: "TLSv1.3",
            sni: None,
            client: Some("CN=alice,O=Example Org".into()),
        });
        let text = line(&r, Format::Text);
        assert!(
            text.ends_with(r#" tls=TLSv1.3 sni=- tls_client="CN=alice,O=Example Org""#),
            "{text}"
        );
        let json = line(&r, Format::Json);
        assert!(
            json.contains(r#""tls_client":"CN=alice,O=Example Org""#),
            "{json}"
        );
    }

    fn numbered(i: u64) -> Record {
        let mut r = record(End::Pumped(pump::End::ClientClosed));
        r.bytes_to_backend = i;
        r
    }

    fn read_lines(path: &Path) -> Vec<String> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect()
    }

    /// Polls `path` until it holds `n` lines, for at most 10 seconds.
    fn wait_for_lines(path: &Path, n: usize) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let lines = read_lines(path);
            if lines.len() >= n {
                return lines;
            }
            assert!(
                Instant::now() < deadline,
                "{} has {} lines, expected {n}",
                path.display(),
                lines.len()
            );
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// The `to_backend` numbers of text lines written from `numbered`.
    fn numbers(lines: &[String]) -> Vec<u64> {
        lines
            .iter()
            .map(|line| {
                let field = line.split(' ').find(|f| f.starts_with("to_backend="));
                field.unwrap()["to_backend=".len()..].parse().unwrap()
            })
            .collect()
    }

    /// Every line from several threads arrives, each thread's in order, and
    /// lines show up without a close (the writer flushes when idle).
    #[test]
    fn writes_every_line_to_a_file_in_order() {
        let path = TempPath::new("order.log");
        let log = AccessLog::start(Format::Text, Target::File(path.0.clone())).unwrap();
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let log = log.clone();
                thread::spawn(move || {
                    for i in 0..250 {
                        log.log(numbered(t * 1_000 + i));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let lines = wait_for_lines(&path.0, 1_000);
        assert_eq!(lines.len(), 1_000);
        assert_eq!(log.written(), 1_000);
        assert_eq!(log.dropped(), 0);
        let numbers = numbers(&lines);
        for t in 0..4 {
            let mine: Vec<u64> = numbers.iter().copied().filter(|n| n / 1_000 == t).collect();
            assert_eq!(mine, (t * 1_000..t * 1_000 + 250).collect::<Vec<_>>());
        }
        log.close();
    }

    /// After a rename and `reopen`, new lines go to a new file at the old
    /// path and the lines before stay in the renamed one.
    #[test]
    fn reopen_after_rename_starts_a_new_file() {
        let path = TempPath::new("rotate.log");
        let rotated = TempPath::new("rotate.log.1");
        let log = AccessLog::start(Format::Json, Target::File(path.0.clone())).unwrap();
        for i in 0..3 {
            log.log(numbered(i));
        }
        wait_for_lines(&path.0, 3);
        std::fs::rename(&path.0, &rotated.0).unwrap();
        log.reopen();
        for i in 3..5 {
            log.log(numbered(i));
        }
        wait_for_lines(&path.0, 2);
        log.close();
        let old = read_lines(&rotated.0);
        let new = read_lines(&path.0);
        let to_backend = |lines: &[String]| -> Vec<u64> {
            lines
                .iter()
                .map(|l| match &parse_object(l)[7] {
                    (k, Json::Num(n)) if k == "to_backend" => *n,
                    other => panic!("{other:?}"),
                })
                .collect()
        };
        assert_eq!(to_backend(&old), [0, 1, 2]);
        assert_eq!(to_backend(&new), [3, 4]);
        assert_eq!(log.written(), 5);
    }

    /// When the path cannot be opened again, the writer keeps the old file.
    #[test]
    fn failed_reopen_keeps_the_old_file() {
        let path = TempPath::new("stuck.log");
        let rotated = TempPath::new("stuck.log.1");
        let log = AccessLog::start(Format::Text, Target::File(path.0.clone())).unwrap();
        log.log(numbered(0));
        wait_for_lines(&path.0, 1);
        std::fs::rename(&path.0, &rotated.0).unwrap();
        // A directory where the file was: opening it for writing fails.
        std::fs::create_dir(&path.0).unwrap();
        log.reopen();
        log.log(numbered(1));
        let lines = wait_for_lines(&rotated.0, 2);
        assert_eq!(numbers(&lines), [0, 1]);
        log.close();
    }

    /// `close`, and dropping the last handle, write out everything queued.
    #[test]
    fn close_and_drop_flush_everything() {
        let path = TempPath::new("close.log");
        let log = AccessLog::start(Format::Text, Target::File(path.0.clone())).unwrap();
        for i in 0..2_000 {
            log.log(numbered(i));
        }
        let other = log.clone();
        log.close();
        assert_eq!(log.written(), 2_000);
        assert_eq!(
            numbers(&read_lines(&path.0)),
            (0..2_000).collect::<Vec<_>>()
        );
        // After close: dropped and counted, nothing written.
        other.log(numbered(2_000));
        other.reopen();
        assert_eq!(other.dropped(), 1);
        other.close();

        let dropped = TempPath::new("drop.log");
        let log = AccessLog::start(Format::Json, Target::File(dropped.0.clone())).unwrap();
        let clone = log.clone();
        for i in 0..500 {
            clone.log(numbered(i));
        }
        drop(log);
        drop(clone);
        assert_eq!(read_lines(&dropped.0).len(), 500);
    }

    #[test]
    fn start_fails_on_a_path_that_cannot_be_opened() {
        let dir = TempPath::new("missing-dir");
        let err =
            AccessLog::start(Format::Text, Target::File(dir.0.join("access.log"))).unwrap_err();
        assert!(matches!(err, Error::Io { .. }), "{err:?}");
        assert!(err.to_string().contains("opening the access log"), "{err}");
    }

    #[test]
    fn stdout_starts_and_closes() {
        let log = AccessLog::start(Format::Text, Target::Stdout).unwrap();
        log.reopen();
        log.close();
        assert_eq!((log.written(), log.dropped()), (0, 0));
    }

    /// With the writer blocked on a pipe nobody reads, `log` keeps
    /// returning at once: records beyond the channel's capacity are dropped
    /// and counted. Once the reader reads, everything queued arrives, in
    /// order, and every record is either written or dropped.
    #[test]
    fn a_full_channel_drops_and_counts_instead_of_blocking() {
        const RECORDS: u64 = 20_000;
        let fifo = TempPath::new("fifo");
        let c_path = std::ffi::CString::new(fifo.0.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo only reads it.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);

        // Opening a FIFO blocks until both ends are open: the reader opens
        // in its own thread and reads only when told to.
        let (go, go_rx) = crossbeam_channel::bounded::<()>(1);
        let reader = thread::spawn({
            let path = fifo.0.clone();
            move || {
                let mut file = File::open(path).unwrap();
                let _ = go_rx.recv();
                let mut all = String::new();
                file.read_to_string(&mut all).unwrap();
                all
            }
        });
        let log = AccessLog::start(Format::Text, Target::File(fifo.0.clone())).unwrap();

        let (done, done_rx) = crossbeam_channel::bounded(1);
        let logger = thread::spawn({
            let log = log.clone();
            move || {
                for i in 0..RECORDS {
                    log.log(numbered(i));
                }
                let _ = done.send(());
            }
        });
        let finished = done_rx.recv_timeout(Duration::from_secs(20)).is_ok();
        let dropped = log.dropped();
        // Let the writer go before asserting, so a failure cannot hang.
        go.send(()).unwrap();
        assert!(finished, "log() blocked behind a stuck writer");
        assert!(dropped > 0, "nothing dropped with the writer stuck");
        logger.join().unwrap();

        log.close();
        let lines: Vec<String> = reader.join().unwrap().lines().map(String::from).collect();
        assert_eq!(log.written() + log.dropped(), RECORDS);
        assert_eq!(lines.len() as u64, log.written());
        let numbers = numbers(&lines);
        assert!(numbers.windows(2).all(|w| w[0] < w[1]), "out of order");
    }

    /// A line of a connection still open says so instead of an end, in
    /// both formats.
    #[test]
    fn connect_and_interim_lines_have_no_end() {
        let mut r = record(End::Pumped(pump::End::ClientClosed));
        for phase in [Phase::Connect, Phase::Interim] {
            r.phase = phase;
            let text = Format::Text.line(&r);
            assert!(
                text.ends_with(&format!(" to_client=612 end=- event={}", phase.name())),
                "{text}"
            );
            let json = Format::Json.line(&r);
            assert!(
                json.ends_with(&format!(
                    r#""end":null,"reason":null,"event":"{}"}}"#,
                    phase.name()
                )),
                "{json}"
            );
        }
    }

    /// A syslog receiver that is not there, then one that never reads:
    /// every line is written or counted as undelivered, `close` returns at
    /// once (the writer never waits on the receiver), nothing is dropped
    /// from the channel for it.
    #[test]
    fn a_gone_or_full_syslog_receiver_costs_lines_not_waits() {
        const LINES: u64 = 5_000;
        let dir = TempPath::new("syslog");
        std::fs::create_dir(&dir.0).unwrap();
        let path = dir.0.join("log.sock");
        let target = || Target::Syslog(SyslogAddr::Unix(path.clone()));
        let log = AccessLog::start(Format::Text, target()).unwrap();
        for i in 0..100 {
            log.log(numbered(i));
        }
        log.close();
        assert_eq!((log.written(), log.undelivered()), (0, 100));

        let receiver = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        let log = AccessLog::start(Format::Text, target()).unwrap();
        let started = Instant::now();
        for i in 0..LINES {
            while !log.log(numbered(i)) {
                // The channel is full: the writer is behind, not stuck.
                assert!(started.elapsed() < Duration::from_secs(20), "stuck");
                thread::yield_now();
            }
        }
        log.close();
        assert!(started.elapsed() < Duration::from_secs(20));
        assert_eq!(log.written() + log.undelivered(), LINES);
        assert!(log.written() > 0 && log.undelivered() > 0, "{log:?}");
        drop(receiver);
        let _ = std::fs::remove_file(&path);
    }

    // ---- a small JSON reader, enough to parse our lines back ----

    #[derive(Debug, PartialEq)]
    enum Json {
        Str(String),
        Num(u64),
        Null,
    }

    /// Parses one flat JSON object of strings, unsigned integers and nulls,
    /// strictly: anything else (a raw control character in a string, a
    /// stray character, trailing text) panics.
    fn parse_object(line: &str) -> Vec<(String, Json)> {
        let mut it = line.chars().peekable();
        let mut fields = Vec::new();
        assert_eq!(it.next(), Some('{'));
        loop {
            let key = parse_string(&mut it);
            assert_eq!(it.next(), Some(':'), "after {key}");
            let value = match it.peek() {
                Some('"') => Json::Str(parse_string(&mut it)),
                Some('n') => {
                    let word: String = (&mut it).take(4).collect();
                    assert_eq!(word, "null");
                    Json::Null
                }
                Some(c) if c.is_ascii_digit() => {
                    let mut digits = String::new();
                    while let Some(c) = it.peek().filter(|c| c.is_ascii_digit()) {
                        digits.push(*c);
                        it.next();
                    }
                    Json::Num(digits.parse().unwrap())
                }
                other => panic!("unexpected {other:?} in {line}"),
            };
            fields.push((key, value));
            match it.next() {
                Some(',') => continue,
                Some('}') => break,
                other => panic!("unexpected {other:?} in {line}"),
            }
        }
        assert_eq!(it.next(), None, "trailing text in {line}");
        fields
    }

    fn parse_string(it: &mut std::iter::Peekable<std::str::Chars<'_>>) -> String {
        assert_eq!(it.next(), Some('"'));
        let mut s = String::new();
        loop {
            match it.next().expect("unterminated string") {
                '"' => return s,
                '\\' => match it.next().unwrap() {
                    '"' => s.push('"'),
                    '\\' => s.push('\\'),
                    '/' => s.push('/'),
                    'n' => s.push('\n'),
                    'r' => s.push('\r'),
                    't' => s.push('\t'),
                    'b' => s.push('\u{8}'),
                    'f' => s.push('\u{c}'),
                    'u' => {
                        let hex: String = it.take(4).collect();
                        let code = u32::from_str_radix(&hex, 16).unwrap();
                        s.push(char::from_u32(code).unwrap());
                    }
                    other => panic!("bad escape \\{other}"),
                },
                c if u32::from(c) < 0x20 => panic!("raw control character {c:?}"),
                c => s.push(c),
            }
        }
    }
}
