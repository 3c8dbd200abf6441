//! The rodizio binary as a child process, for every test that runs it:
//! [`BIN`] and [`command`] (the binary with its pipes set); [`Child`],
//! started (its standard output collected, or closed at once) and stopped
//! by its PID, its address learned from what it prints (`-l 127.0.0.1:0`)
//! or from `/proc` ([`listening_sockets`]), its log read in order, its
//! memory and descriptors read, and both of its outputs printed when the
//! test that started it fails; [`run`],
//! [`run_within`], [`run_fed`] and [`output`], one-shot runs with a
//! deadline; [`Scratch`], a directory of a test's own; and [`Rodizio`], a
//! child with its admin API and plain HTTP/1.1 calls to it.
//!
//! Every child is read by threads (`common::collect`) and waited for with
//! a deadline, so a child that hangs fails its test instead of the suite.
//! It needs `mod common;` beside it.

// Each test binary that includes it uses a part.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::common::{collect, connect, wait_for, Collected};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_rodizio");
/// Longest a start, a call or a one-shot run may take (a loaded machine).
pub const WAIT: Duration = Duration::from_secs(30);
/// The line the balancer prints on standard output once it listens:
/// `Load balancer listening on port N (ADDR)`.
pub const LISTENING: &str = "Load balancer listening on port ";

/// A directory of its own for one test's files, removed on drop.
pub struct Scratch(PathBuf);

impl Scratch {
    /// A new empty directory under the temporary directory, named after
    /// `what`, the process and a counter.
    pub fn new(what: &str) -> Scratch {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "rodizio-{what}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.0
    }

    /// The path of `name` in the directory (written or not).
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// Writes `text` to `name` in the directory (whole, then renamed into
    /// place, as an editor does); its path.
    pub fn file(&self, name: &str, text: impl AsRef<[u8]>) -> PathBuf {
        let path = self.0.join(name);
        let tmp = self.0.join(format!("{name}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        path
    }

    /// A FIFO called `name` that nobody writes to; its path.
    pub fn fifo(&self, name: &str) -> PathBuf {
        let path = self.0.join(name);
        let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path that lives across the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `rodizio ARGS` with standard input closed, both outputs piped and
/// `RUST_LOG=info` (a test adds to it, then hands it to [`Child::start`],
/// [`Child::spawn`] or [`run_command`]).
pub fn command(args: &[&str]) -> Command {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// `RODIZIO_TEST_KERNEL_RELAY=N` in the environment: the flags that turn
/// the kernel relay on after N exchanges, as `common::config` does for a
/// balancer in the test's process (the second pass of `make test`,
/// `scripts/kernel-relay-pass.sh`); none otherwise.
pub fn kernel_relay_flags() -> Vec<String> {
    match crate::common::kernel_relay_after_from_env() {
        Some(after) => vec![
            "--kernel-relay=on".to_string(),
            "--kernel-relay-after".to_string(),
            after.to_string(),
        ],
        None => Vec::new(),
    }
}

/// The address after `marker` in `text`, up to a space, `)` or the end of
/// the line.
pub fn addr_after(text: &str, marker: &str) -> Option<SocketAddr> {
    let rest = &text[text.find(marker)? + marker.len()..];
    let end = rest.find([' ', ')', '\n']).unwrap_or(rest.len());
    rest[..end].trim().parse().ok()
}

/// Where the balancer listens, from its `Load balancer listening on port
/// N (ADDR)` line in `stdout`: ADDR, or `127.0.0.1:N` when the line has no
/// address.
pub fn listening_addr(stdout: &str) -> Option<SocketAddr> {
    let line = stdout.lines().find_map(|l| l.strip_prefix(LISTENING))?;
    let addr = line
        .split_once('(')
        .and_then(|(_, rest)| rest.split(')').next()?.parse().ok());
    let port = line.split_whitespace().next()?.parse::<u16>().ok()?;
    Some(addr.unwrap_or(SocketAddr::from(([127, 0, 0, 1], port))))
}

/// The binary running as a child process: stopped (killed) by its PID and
/// reaped on drop; both outputs collected as they come, and printed when
/// the test that started it fails.
pub struct Child {
    process: std::process::Child,
    /// Its standard output so far.
    pub stdout: Collected,
    /// Its standard error (the log) so far.
    pub stderr: Collected,
    /// Where its balancer listens ([`Child::start`]; `0.0.0.0:0` after
    /// [`Child::spawn`] until [`Child::listening`]).
    pub addr: SocketAddr,
    /// How far [`Child::next_log`] has read the log.
    seen: usize,
}

impl Child {
    /// Spawns `command` (its outputs piped here, its standard input
    /// empty) without waiting for anything.
    pub fn spawn(command: &mut Command) -> Child {
        Child::spawn_fed(command, Vec::new())
    }

    /// Spawns `command` with its standard output closed at once (as `|
    /// head -0` would): whatever it prints meets a closed pipe.
    pub fn spawn_stdout_closed(command: &mut Command) -> Child {
        Child::spawned(command, None, false)
    }

    /// Spawns `command` with `input` on its standard input, written by a
    /// thread of the test and then closed (a failed write is fine: the
    /// child may exit before it reads it all).
    pub fn spawn_fed(command: &mut Command, input: Vec<u8>) -> Child {
        Child::spawned(command, Some(input), true)
    }

    /// Spawns `command`: `input` fed to its standard input (`None`: none),
    /// its standard output collected or closed at once, its log collected.
    fn spawned(command: &mut Command, input: Option<Vec<u8>>, stdout: bool) -> Child {
        let mut process = command
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start rodizio");
        if let (Some(mut stdin), Some(input)) = (process.stdin.take(), input) {
            std::thread::spawn(move || {
                let _ = stdin.write_all(&input);
            });
        }
        let out = process.stdout.take().unwrap();
        let stdout = if stdout {
            collect(out)
        } else {
            drop(out);
            collect(std::io::empty())
        };
        let stderr = collect(process.stderr.take().unwrap());
        Child {
            process,
            stdout,
            stderr,
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            seen: 0,
        }
    }

    /// Spawns `command` and waits (at most [`WAIT`]) for its listening
    /// line; fails the test with its output when it exits or stays silent.
    pub fn start(command: &mut Command) -> Child {
        let mut child = Child::spawn(command);
        child.listening();
        child
    }

    /// `rodizio --allow-root ARGS` ([`command`]) with
    /// [`kernel_relay_flags`], started.
    pub fn balancer(args: &[&str]) -> Child {
        let mut command = command(&[&["--allow-root"], args].concat());
        Child::start(command.args(kernel_relay_flags()))
    }

    /// `rodizio -l 127.0.0.1:0 --allow-root ARGS`, after `prepare` has
    /// adjusted the command (resource limits, say), started.
    pub fn on_loopback(args: &[&str], prepare: impl FnOnce(&mut Command)) -> Child {
        let mut command = command(&[&["-l", "127.0.0.1:0", "--allow-root"], args].concat());
        prepare(&mut command);
        Child::start(&mut command)
    }

    /// Waits (at most [`WAIT`]) for `marker ADDR` on its standard output
    /// (`Demo backend listening on `, say); ADDR, kept in [`Child::addr`].
    /// Fails the test with the output when the child exits or stays silent.
    pub fn printed(&mut self, marker: &str) -> SocketAddr {
        self.wait_addr(marker, |out| addr_after(out, marker))
    }

    /// Waits (at most [`WAIT`]) for the listening line; its address, kept
    /// in [`Child::addr`]. Fails the test with the output when the child
    /// exits or stays silent.
    pub fn listening(&mut self) -> SocketAddr {
        self.wait_addr(LISTENING, listening_addr)
    }

    /// Waits (at most [`WAIT`]) until `find` gives an address from its
    /// standard output; that address, kept in [`Child::addr`].
    fn wait_addr(&mut self, what: &str, find: impl Fn(&str) -> Option<SocketAddr>) -> SocketAddr {
        let mut addr = None;
        let up = wait_for(WAIT, || {
            addr = find(&self.stdout.text());
            addr.is_some() || !self.alive()
        });
        match addr.filter(|_| up) {
            Some(addr) => {
                self.addr = addr;
                addr
            }
            None => panic!(
                "no {what:?} from rodizio:\n{}{}",
                self.stdout.text(),
                self.stderr.text()
            ),
        }
    }

    /// Its process ID.
    pub fn pid(&self) -> u32 {
        self.process.id()
    }

    /// Sends `signal` to it, by its PID.
    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on the child this test started, by its PID.
        assert_eq!(unsafe { libc::kill(self.pid() as libc::pid_t, signal) }, 0);
    }

    /// Whether it is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.process.try_wait(), Ok(None))
    }

    /// Waits at most `timeout` for it to exit; how it ended, or `None`
    /// while it still runs.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let mut status = None;
        wait_for(timeout, || {
            status = self.process.try_wait().ok().flatten();
            status.is_some()
        });
        status
    }

    /// Waits (at most [`WAIT`]) for it to exit by itself, then for the end
    /// of both outputs (the test judges them next); how it ended. Fails the
    /// test with its output when it does not exit.
    pub fn exited(&mut self) -> ExitStatus {
        let status = self.wait_exit(WAIT);
        let Some(status) = status else {
            panic!("rodizio did not exit: {}", self.output());
        };
        assert!(
            self.stdout.wait_end(WAIT) && self.stderr.wait_end(WAIT),
            "its outputs did not end: {}",
            self.output()
        );
        status
    }

    /// SIGTERM, then waits (at most [`WAIT`]) for the exit, killing it by
    /// its PID past that, and for the end of both outputs; how it ended
    /// (`None`: it had to be killed).
    pub fn stop(&mut self) -> Option<ExitStatus> {
        if self.alive() {
            self.signal(libc::SIGTERM);
        }
        let status = self.wait_exit(WAIT);
        if status.is_none() {
            let _ = self.process.kill();
            let _ = self.process.wait();
        }
        self.stdout.wait_end(WAIT);
        self.stderr.wait_end(WAIT);
        status
    }

    /// Both of its outputs so far: standard output, then the log.
    pub fn output(&self) -> String {
        format!("{}{}", self.stdout.text(), self.stderr.text())
    }

    /// Its open descriptors now.
    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .unwrap()
            .count()
    }

    /// What its open descriptors point at now (`socket:[inode]`,
    /// `anon_inode:bpf-map`, a path), sorted: for a failure's message.
    pub fn fd_targets(&self) -> Vec<String> {
        let mut all: Vec<String> = std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .map(|t| t.display().to_string())
            .collect();
        all.sort();
        all
    }

    /// The loopback addresses its own sockets listen on now, read from
    /// `/proc` (its descriptors' socket inodes against the TCP table), so a
    /// test that closed its standard output still learns where it listens,
    /// and never mistakes another process's listener for it.
    pub fn listening_now(&self) -> Vec<SocketAddr> {
        listening_sockets(self.pid())
    }

    /// Its resident memory now, in KiB (`VmRSS`).
    pub fn rss_kib(&self) -> u64 {
        proc_status(self.pid(), "VmRSS")
    }

    /// Its threads now.
    pub fn threads(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/task", self.pid()))
            .unwrap()
            .count()
    }

    /// User plus system CPU time of the whole process so far, in clock
    /// ticks.
    pub fn cpu_ticks(&self) -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap();
        let rest = &stat[stat.rfind(')').unwrap() + 1..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
    }

    /// Where its admin API listens, as its log says (with `--admin`).
    pub fn admin(&self) -> SocketAddr {
        let mut admin = None;
        wait_for(WAIT, || {
            admin = addr_after(&self.log(), "admin API listening on ");
            admin.is_some()
        });
        admin.unwrap_or_else(|| panic!("no admin API address in the log: {}", self.log()))
    }

    /// One counter of its admin API's `/metrics` (`rodizio_NAME`).
    pub fn metric(&self, name: &str) -> u64 {
        let body = crate::common::http_get(self.admin(), "/metrics")
            .unwrap()
            .body;
        let wanted = format!("rodizio_{name}");
        body.lines()
            .filter(|l| !l.starts_with('#'))
            .find_map(|l| {
                let (key, value) = l.split_once(' ')?;
                (key.split('{').next()? == wanted).then(|| value.trim().parse().ok())?
            })
            .unwrap_or_else(|| panic!("no {wanted} in /metrics:\n{body}"))
    }

    /// What it wrote on standard error so far.
    pub fn log(&self) -> String {
        self.stderr.text()
    }

    /// The next whole log line, after those this has returned, that
    /// contains `needle`; fails the test after [`WAIT`].
    pub fn next_log(&mut self, needle: &str) -> String {
        let mut found = None;
        let seen = &mut self.seen;
        let stderr = &self.stderr;
        wait_for(WAIT, || {
            found = stderr.next_line(seen, needle);
            found.is_some()
        });
        found.unwrap_or_else(|| panic!("no {needle:?} in the log:\n{}", self.stderr.text()))
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if let Ok(None) = self.process.try_wait() {
            let _ = self.process.kill();
        }
        let _ = self.process.wait();
        if std::thread::panicking() {
            eprintln!(
                "--- rodizio (pid {}) stdout ---\n{}--- stderr ---\n{}---",
                self.process.id(),
                self.stdout.text(),
                self.stderr.text()
            );
        }
    }
}

/// How a one-shot run ended.
pub struct Ended {
    pub status: ExitStatus,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Ended {
    /// The same as the standard library's `Output` (for a test that reads
    /// the bytes).
    pub fn output(self) -> std::process::Output {
        std::process::Output {
            status: self.status,
            stdout: self.stdout.into_bytes(),
            stderr: self.stderr.into_bytes(),
        }
    }
}

/// Runs `rodizio ARGS` (with `RUST_LOG=warn`) to its end; see
/// [`run_command`].
pub fn run(args: &[&str]) -> Ended {
    run_command(command(args).env("RUST_LOG", "warn"))
}

/// Runs `command` to its end, with a deadline: killed by its PID, and the
/// test failed with what it wrote, past [`WAIT`].
pub fn run_command(command: &mut Command) -> Ended {
    run_within(command, WAIT)
}

/// `command.output()` with a deadline ([`run_command`]): standard input
/// empty, both outputs captured.
pub fn output(command: &mut Command) -> std::process::Output {
    run_command(command).output()
}

/// Runs `command` to its end, with a deadline: killed by its PID, and the
/// test failed with what it wrote, past `limit`.
pub fn run_within(command: &mut Command, limit: Duration) -> Ended {
    finish(Child::spawn(command), limit)
}

/// Runs `command` with `input` on its standard input (written by a thread,
/// then closed) to its end, with a deadline, as [`run_within`].
pub fn run_fed(command: &mut Command, input: Vec<u8>, limit: Duration) -> Ended {
    finish(Child::spawn_fed(command, input), limit)
}

/// Waits at most `limit` for `child` to exit, then for the end of its
/// outputs.
fn finish(mut child: Child, limit: Duration) -> Ended {
    let Some(status) = child.wait_exit(limit) else {
        panic!(
            "rodizio still running after {limit:?}:\n{}{}",
            child.stdout.text(),
            child.stderr.text()
        );
    };
    child.stdout.wait_end(WAIT);
    child.stderr.wait_end(WAIT);
    Ended {
        status,
        code: status.code(),
        stdout: child.stdout.text(),
        stderr: child.stderr.text(),
    }
}

/// The balancer binary with its admin API, running; killed by its PID on
/// drop.
pub struct Rodizio {
    child: Child,
    pub stderr: Collected,
    /// Where clients connect.
    pub addr: SocketAddr,
    /// Where its admin API listens.
    pub admin: SocketAddr,
}

impl Rodizio {
    /// Starts `rodizio --allow-root ARGS -c CONFIG` (the file turns the
    /// admin API on, on port 0) and waits for both of its ports.
    pub fn start(config: &Path, args: &[&str]) -> Rodizio {
        let mut command = command(&[&["--allow-root"], args, &["-c"]].concat());
        let child = Child::start(command.arg(config));
        let mut admin = None;
        let up = wait_for(WAIT, || {
            admin = addr_after(&child.log(), "admin API listening on ");
            admin.is_some()
        });
        let Some(admin) = admin.filter(|_| up) else {
            panic!("rodizio's admin API did not start: {}", child.log());
        };
        Rodizio {
            stderr: child.stderr.clone(),
            addr: child.addr,
            admin,
            child,
        }
    }

    /// `METHOD path` on the admin API with `body`: the status and the body.
    pub fn call(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        call(self.admin, method, path, body)
    }

    /// The process's ID.
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }
}

/// One HTTP/1.1 request with `Connection: close`; the status and the body
/// (`(0, why)` when it could not be made). The request goes out in one
/// write, and an answer is read even when the server closed before taking
/// all of it: a server that refuses a request line answers and closes at
/// once, and the rest of a request written piece by piece (or unread by
/// it) would meet a broken pipe or a reset, on a loaded machine only.
pub fn call(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let attempt = || -> std::io::Result<(u16, String)> {
        let mut s = connect(addr)?;
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let written = s.write_all(request.as_bytes());
        let mut raw = Vec::new();
        let read = s.read_to_end(&mut raw);
        if raw.is_empty() {
            written?;
            read?;
        }
        let raw = String::from_utf8_lossy(&raw);
        let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        Ok((status, body.to_string()))
    };
    attempt().unwrap_or_else(|e| (0, e.to_string()))
}

/// The IPv4 addresses process `pid`'s own sockets listen on now: the
/// inodes of its descriptors' sockets, looked up in `/proc/PID/net/tcp`
/// (state `0A`, listening). Empty when the process is gone.
pub fn listening_sockets(pid: u32) -> Vec<SocketAddr> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    let inodes: Vec<String> = fds
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|t| {
            let t = t.display().to_string();
            Some(t.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 || f[3] != "0A" || !inodes.iter().any(|i| i == f[9]) {
                return None;
            }
            let (ip, port) = f[1].split_once(':')?;
            let ip = u32::from_str_radix(ip, 16).ok()?;
            let port = u16::from_str_radix(port, 16).ok()?;
            // Printed as the in-memory (network order) word, read natively.
            let ip = std::net::Ipv4Addr::from(ip.to_ne_bytes());
            Some(SocketAddr::from((ip, port)))
        })
        .collect()
}

/// A number from `/proc/PID/status` (`VmRSS`, `Threads`: the first word
/// after `KEY:`). Fails the test when the process is gone or has no such
/// line.
pub fn proc_status(pid: u32, key: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {key} for process {pid}: {text}"))
}
