//! The access log's writer thread (`rodizio-access-log`): it takes the
//! records off the channel, formats them and writes them to standard
//! output, a file or a syslog daemon (`syslog.rs`).
//!
//! Formatting happens here, not in the workers. Lines go through a
//! `BufWriter` flushed whenever the channel is empty: one `write(2)` per
//! burst of connections, and yet every line is in the file as soon as the
//! writer is idle. A reopen request (after logrotate renamed the file)
//! comes on a channel of its own, so the thread that receives SIGUSR1
//! never waits on the disk. Dropped lines are reported in one warning at
//! most once a minute, write errors in one error line at most as often.
//!
//! # Threads
//!
//! Only the writer thread runs this code; it shares the counters (atomics)
//! with the handles.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C prints from every worker.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Stdout, Write as _};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver};

use super::syslog::Syslog;
use super::{Control, Counters, Format, Record, Template, REPORT_INTERVAL, WRITE_BUFFER};
use crate::throttle::LogThrottle;

/// Opens (or creates) the log file for appending: `O_APPEND` keeps lines
/// whole even if another program writes to the same file.
pub(super) fn open(path: &std::path::Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

/// Where the writer writes.
pub(super) enum Sink {
    Stdout(BufWriter<Stdout>),
    File {
        out: BufWriter<File>,
        path: PathBuf,
    },
    /// A syslog daemon: one datagram per line, never buffered.
    Syslog(Syslog),
}

impl Sink {
    /// Writes one line, its newline included (a datagram goes without).
    fn write_all(&mut self, line: &[u8]) -> io::Result<()> {
        match self {
            Sink::Stdout(out) => out.write_all(line),
            Sink::File { out, .. } => out.write_all(line),
            Sink::Syslog(syslog) => syslog.send(line.strip_suffix(b"\n").unwrap_or(line)),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Sink::Stdout(out) => out.flush(),
            Sink::File { out, .. } => out.flush(),
            Sink::Syslog(_) => Ok(()),
        }
    }

    /// Opens the file again at its path; on success the old one is flushed
    /// and closed. On failure nothing changes.
    fn reopen(&mut self) -> io::Result<()> {
        let Sink::File { out, path } = self else {
            return Ok(());
        };
        let file = open(path)?;
        let old = std::mem::replace(out, BufWriter::with_capacity(WRITE_BUFFER, file));
        old.into_inner().map(drop).map_err(|e| e.into_error())
    }
}

impl fmt::Display for Sink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Sink::Stdout(_) => f.write_str("standard output"),
            Sink::File { path, .. } => write!(f, "{}", path.display()),
            Sink::Syslog(syslog) => write!(f, "syslog at {}", syslog.addr()),
        }
    }
}

/// The writer thread's state.
pub(super) struct Writer {
    pub(super) format: Format,
    /// `access_log_format`, in place of `format`'s line when given.
    pub(super) template: Option<Template>,
    pub(super) records: Receiver<Record>,
    pub(super) control: Receiver<Control>,
    pub(super) counters: Arc<Counters>,
    pub(super) sink: Sink,
    /// The line being formatted, reused so that writing allocates nothing.
    pub(super) line: Vec<u8>,
    /// A `Close` was received: exit once the channel is empty.
    pub(super) closing: bool,
    pub(super) drops: LogThrottle,
    /// `dropped` as of the last warning.
    pub(super) reported_drops: u64,
    pub(super) errors: LogThrottle,
    /// Lines lost to write errors since the last error report.
    pub(super) lost: u64,
}

impl Writer {
    pub(super) fn run(mut self) {
        // Clones (cheap handles) so that `select!` borrows these, not `self`,
        // which its arms need mutably.
        let records = self.records.clone();
        let control = self.control.clone();
        while !self.closing {
            let wait = self.report_wait(Instant::now());
            select! {
                recv(records) -> record => match record {
                    Ok(record) => {
                        self.write(record);
                        self.drain();
                    }
                    Err(_) => self.closing = true,
                },
                recv(control) -> control => match control {
                    Ok(control) => self.apply(control),
                    Err(_) => self.closing = true,
                },
                default(wait) => {}
            }
            self.report(Instant::now(), false);
        }
        // Records sent before the `Close`, still queued.
        self.drain();
        self.report(Instant::now(), true);
        if self.lost > 0 {
            // Lost since the last (throttled) error line: said once more.
            log::error!(
                "access log: {} lines lost writing to {}",
                self.lost,
                self.sink
            );
        }
    }

    /// Writes every queued record, then flushes: the channel is empty, so
    /// this is the moment to hand the buffered lines to the kernel.
    fn drain(&mut self) {
        while let Ok(record) = self.records.try_recv() {
            self.write(record);
        }
        if let Err(err) = self.sink.flush() {
            self.write_failed(&err, 0);
        }
    }

    fn write(&mut self, record: Record) {
        // A `reopen` returned before this record was sent, so its request is
        // already in `control`: looking there first puts every record logged
        // after `reopen` in the new file.
        while let Ok(control) = self.control.try_recv() {
            self.apply(control);
        }
        self.line.clear();
        match &self.template {
            Some(template) => template.write(&record, &mut self.line),
            None => self.format.write(&record, &mut self.line),
        }
        self.line.push(b'\n');
        match self.sink.write_all(&self.line) {
            Ok(()) => {
                self.counters.written.fetch_add(1, Ordering::Relaxed);
            }
            Err(err) => {
                self.counters.undelivered.fetch_add(1, Ordering::Relaxed);
                self.write_failed(&err, 1);
            }
        }
    }

    fn apply(&mut self, control: Control) {
        match control {
            Control::Reopen => {
                // Several requests in a row need one reopen.
                let mut close = false;
                while let Ok(next) = self.control.try_recv() {
                    close |= matches!(next, Control::Close);
                }
                if let Err(err) = self.sink.flush() {
                    self.write_failed(&err, 0);
                }
                match self.sink.reopen() {
                    Ok(()) => log::debug!("access log: reopened {}", self.sink),
                    Err(err) => log::error!(
                        "access log: reopening {} failed, still writing to the old file: {err}",
                        self.sink
                    ),
                }
                self.closing |= close;
            }
            Control::Close => self.closing = true,
        }
    }

    fn write_failed(&mut self, err: &io::Error, lines: u64) {
        self.lost += lines;
        if self.errors.event(Instant::now()).is_some() {
            log::error!(
                "access log: writing to {} failed: {err} ({} lines lost)",
                self.sink,
                self.lost
            );
            self.lost = 0;
        }
    }

    /// How long the writer may sleep: until the next warning is due when
    /// drops wait to be reported, else a full interval.
    fn report_wait(&self, now: Instant) -> Duration {
        if self.counters.dropped.load(Ordering::Relaxed) > self.reported_drops {
            self.drops.wait(now)
        } else {
            REPORT_INTERVAL
        }
    }

    /// Warns about drops not reported yet, at most once per
    /// [`REPORT_INTERVAL`], or in any case when `last` (at close).
    fn report(&mut self, now: Instant, last: bool) {
        let dropped = self.counters.dropped.load(Ordering::Relaxed);
        if dropped > self.reported_drops && (last || self.drops.event(now).is_some()) {
            log::warn!(
                "access log: {} lines dropped, the writer fell behind",
                dropped - self.reported_drops
            );
            self.reported_drops = dropped;
        }
    }
}
