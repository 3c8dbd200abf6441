//! The agent check, HAProxy's `agent-check`: a backend with an
//! `agent_port` is asked, each `agent_interval`, how it is. The balancer
//! connects to the port (at the backend's address, or its
//! `check_address`), sends `agent_send` if given, and reads one line:
//! words separated by spaces, tabs or commas, anything after `#` a
//! comment:
//!
//! - `up`, or `down` (also `fail`, `stopped`): the agent's opinion of its
//!   health, counted beside the checks' (the backend is up when both say
//!   so);
//! - `ready`, `drain`, `maint`: the operator's states, set as
//!   `PUT /backends/{address}` sets them;
//! - `NN%` (0 to 1000): its weight as a percentage of the configured one.
//!
//! Several words may be given (`up 50%`, `drain,75%`); of two of a kind
//! the last counts. The whole line is applied, or none of it: an unknown
//! word, a bad percentage, a byte that is not printable ASCII, an empty
//! line, or no line end within [`MAX_LINE`] bytes is **garbage**, and
//! garbage, like a refused connection, a reset or a silence past
//! `health_timeout` (or `agent_interval`, if shorter), leaves the backend as it was; it is kept as the
//! agent's error (`/backends`) and warned about at most once a second per
//! backend.
//!
//! # Threads
//!
//! Asked by the health thread in its rounds, each agent on a short-lived
//! thread of its own (as the probes are); the answer is applied there,
//! through [`Backend::set_wanted`], [`Backend::set_agent_down`] and the
//! scheduler's [`Scheduler::refresh`] after a weight change.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C never asks a backend anything.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use crate::backend::{AgentRecord, Backend, Wanted};
use crate::dial;
use crate::scheduler::Scheduler;
use crate::throttle;

/// Most bytes read from an agent: a line longer than this is garbage, and
/// an agent sending a megabyte costs this much and no more.
pub const MAX_LINE: usize = 512;

/// Highest percentage an agent may ask for.
const MAX_PERCENT: u32 = 1000;

/// An agent thread's stack: a connect, a read and a parse.
const AGENT_STACK: usize = 64 * 1024;

/// What one line says; `None` where it says nothing of that kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Answer {
    /// `Some(true)` for `down`, `fail`, `stopped`; `Some(false)` for `up`.
    pub down: Option<bool>,
    /// `ready`, `drain` or `maint`.
    pub wanted: Option<Wanted>,
    /// `NN%`.
    pub percent: Option<u32>,
}

/// Reads one agent line (without its line end).
///
/// # Errors
///
/// Why the line is garbage, in a few words.
pub fn parse(line: &[u8]) -> Result<Answer, String> {
    if let Some(bad) = line
        .iter()
        .find(|b| !(b.is_ascii_graphic() || **b == b' ' || **b == b'\t'))
    {
        return Err(format!("byte 0x{bad:02x} is not printable text"));
    }
    // Checked above: ASCII only.
    let text = String::from_utf8_lossy(line);
    let said = text.split('#').next().unwrap_or("");
    let mut answer = Answer::default();
    let mut words = 0;
    for word in said.split([' ', '\t', ',']).filter(|w| !w.is_empty()) {
        words += 1;
        match word.to_ascii_lowercase().as_str() {
            "up" => answer.down = Some(false),
            "down" | "fail" | "stopped" => answer.down = Some(true),
            "ready" => answer.wanted = Some(Wanted::Ready),
            "drain" => answer.wanted = Some(Wanted::Drain),
            "maint" => answer.wanted = Some(Wanted::Maint),
            other => {
                let percent = other
                    .strip_suffix('%')
                    .and_then(|n| n.parse::<u32>().ok())
                    .filter(|n| *n <= MAX_PERCENT);
                match percent {
                    Some(p) => answer.percent = Some(p),
                    None => return Err(format!("unknown word '{}'", clip(word))),
                }
            }
        }
    }
    if words == 0 {
        return Err("an empty line".into());
    }
    Ok(answer)
}

/// The first 40 characters of `text`, for an error line.
fn clip(text: &str) -> String {
    text.chars().take(40).collect()
}

/// Asks the agent at `addr`: connects, sends `send`, reads one line, all
/// within `timeout` (a trickling agent is cut at the deadline, however
/// often it sends a byte). Returns the line without its end.
///
/// # Errors
///
/// The connect or read error, the timeout, or a line too long.
pub fn ask(addr: SocketAddr, send: Option<&str>, timeout: Duration) -> Result<Vec<u8>, String> {
    let deadline = Instant::now() + timeout;
    let mut stream: TcpStream =
        dial::connect_one(addr, timeout).map_err(|e| format!("connect {addr}: {e}"))?;
    let left = || deadline.saturating_duration_since(Instant::now());
    if let Some(send) = send {
        let _ = stream.set_write_timeout(Some(left().max(Duration::from_millis(1))));
        stream
            .write_all(send.as_bytes())
            .map_err(|e| format!("send: {e}"))?;
    }
    let mut buf = [0u8; MAX_LINE];
    let mut len = 0;
    loop {
        let wait = left();
        if wait.is_zero() {
            return Err(format!("no whole line within {timeout:?}"));
        }
        let _ = stream.set_read_timeout(Some(wait));
        match stream.read(&mut buf[len..]) {
            // Closed: what came is the line (HAProxy takes it too).
            Ok(0) => return Ok(buf[..len].to_vec()),
            Ok(n) => {
                len += n;
                if let Some(end) = buf[..len].iter().position(|b| *b == b'\n') {
                    let line = &buf[..end];
                    return Ok(line.strip_suffix(b"\r").unwrap_or(line).to_vec());
                }
                if len == MAX_LINE {
                    return Err(format!("no line end within {MAX_LINE} bytes"));
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(format!("no whole line within {timeout:?}"));
            }
            Err(e) => return Err(format!("read: {e}")),
        }
    }
}

/// Applies `answer` to `backend`, refreshing `scheduler` when its weight
/// changed. Each change is logged once.
pub fn apply(backend: &Backend, scheduler: &Scheduler, answer: Answer) {
    if let Some(down) = answer.down {
        if backend.set_agent_down(down) {
            let word = if down { "DOWN" } else { "UP" };
            log::warn!("backend {}: its agent says {word}", backend.name());
        }
    }
    if let Some(wanted) = answer.wanted {
        let was = backend.state_name();
        backend.set_wanted(wanted);
        if backend.state_name() != was {
            log::info!(
                "backend {} is now {} (its agent says so)",
                backend.name(),
                wanted.word()
            );
        }
    }
    if let Some(percent) = answer.percent {
        if backend.agent.set_percent(percent) {
            scheduler.refresh();
            log::info!(
                "backend {} weight is now {} ({percent}% of {}, its agent says so)",
                backend.name(),
                backend.weight(),
                backend.configured_weight()
            );
        }
    }
}

/// Asks `backend`'s agent on `port` and applies a good answer; keeps the
/// exchange on the backend either way, and warns of a failure at most
/// once a second.
pub fn check(backend: &Backend, scheduler: &Scheduler, port: u16, timeout: Duration) {
    let own = backend.own_check();
    let Some(addr) = backend
        .check_addrs()
        .first()
        .map(|a| SocketAddr::new(a.ip(), port))
    else {
        return;
    };
    let started = Instant::now();
    let line = ask(addr, own.agent_send.as_deref(), timeout);
    let printable = |l: &[u8]| -> String {
        l.iter()
            .take(80)
            .map(|b| {
                if b.is_ascii_graphic() || *b == b' ' {
                    *b as char
                } else {
                    '?'
                }
            })
            .collect()
    };
    let (answer, error) = match &line {
        Ok(l) => match parse(l) {
            Ok(a) => (Some(printable(l)), Ok(a)),
            Err(e) => (Some(printable(l)), Err(format!("garbage: {e}"))),
        },
        Err(e) => (None, Err(e.clone())),
    };
    backend.agent.record(AgentRecord {
        answer,
        error: error.as_ref().err().cloned(),
        at: SystemTime::now(),
        took: started.elapsed(),
    });
    match error {
        Ok(a) => apply(backend, scheduler, a),
        Err(e) => {
            if let Some(others) = backend.agent.log.event(Instant::now()) {
                log::warn!(
                    "agent of backend {} ({addr}): {e}; its state is left as it was{}",
                    backend.name(),
                    throttle::more(others)
                );
            }
        }
    }
}

/// Asks every agent of `list` (a backend, its agent port, the timeout) at
/// once, one short-lived thread each; one that cannot be started is asked
/// on this thread.
pub(super) fn check_all(list: &[(std::sync::Arc<Backend>, u16, Duration)], scheduler: &Scheduler) {
    thread::scope(|scope| {
        for (backend, port, timeout) in list {
            let spawned = thread::Builder::new()
                .name("rodizio-agent".into())
                .stack_size(AGENT_STACK)
                .spawn_scoped(scope, move || check(backend, scheduler, *port, *timeout));
            if spawned.is_err() {
                check(backend, scheduler, *port, *timeout);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn words_are_read_as_haproxy_reads_them() {
        let a = parse(b"up 50%").unwrap();
        assert_eq!((a.down, a.percent, a.wanted), (Some(false), Some(50), None));
        let a = parse(b"DRAIN,75%\t# busy").unwrap();
        assert_eq!((a.wanted, a.percent), (Some(Wanted::Drain), Some(75)));
        assert_eq!(parse(b"stopped").unwrap().down, Some(true));
        assert_eq!(
            parse(b"down up").unwrap().down,
            Some(false),
            "the last counts"
        );
        assert_eq!(parse(b"maint").unwrap().wanted, Some(Wanted::Maint));
        assert_eq!(parse(b"ready 0%").unwrap().percent, Some(0));
        for garbage in [
            &b""[..],
            b"   ",
            b"# only a comment",
            b"upp",
            b"50",
            b"1001%",
            b"-5%",
            b"up\x00",
            b"\xff\xfe",
            b"x%",
        ] {
            assert!(parse(garbage).is_err(), "{garbage:?}");
        }
    }

    fn agent(reply: &'static [u8]) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let _ = s.write_all(reply);
            // Held open a moment: the line must end it, not the close.
            let mut sink = [0u8; 16];
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let _ = s.read(&mut sink);
        });
        addr
    }

    #[test]
    fn one_line_is_read_and_no_more() {
        let t = Duration::from_secs(2);
        assert_eq!(ask(agent(b"up 50%\r\nmore"), None, t).unwrap(), b"up 50%");
        let long = Box::leak(vec![b'a'; 4096].into_boxed_slice());
        let err = ask(agent(long), None, t).unwrap_err();
        assert!(err.contains("512 bytes"), "{err}");
        let err = ask(agent(b"up"), None, Duration::from_millis(300)).unwrap_err();
        assert!(err.contains("no whole line"), "{err}");
    }
}
