//! The rodizio binary as a child process with its admin API, for the tests
//! of the operator's tools (`tests/runtime_config.rs`, `tests/hostile/
//! tools.rs`): started with a config file, its ports learned from what it
//! prints (both are port 0), killed by its PID on drop; plain HTTP/1.1
//! calls to its admin API; and one-shot runs of the binary with a
//! deadline.

// Each test binary that includes it uses a part.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::common::{collect, connect, wait_for, Collected};

pub const BIN: &str = env!("CARGO_BIN_EXE_rodizio");
/// Longest a start, a call or a one-shot run may take (a loaded machine).
pub const WAIT: Duration = Duration::from_secs(30);

/// A directory of its own for one test's files, removed on drop.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(what: &str) -> Scratch {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "rodizio-{what}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    /// The path of `name` in the directory (written or not).
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// Writes `text` to `name` in the directory (whole, then renamed into
    /// place, as an editor does); its path.
    pub fn file(&self, name: &str, text: &[u8]) -> PathBuf {
        let path = self.0.join(name);
        let tmp = self.0.join(format!("{name}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The balancer binary, running; killed by its PID on drop.
pub struct Rodizio {
    child: Child,
    pub stderr: Collected,
    /// Where clients connect.
    pub addr: SocketAddr,
    /// Where its admin API listens.
    pub admin: SocketAddr,
}

impl Drop for Rodizio {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The address after `marker` in `text`, up to a space or `)`.
fn addr_after(text: &str, marker: &str) -> Option<SocketAddr> {
    let rest = &text[text.find(marker)? + marker.len()..];
    let end = rest.find([' ', ')', '\n']).unwrap_or(rest.len());
    rest[..end].parse().ok()
}

impl Rodizio {
    /// Starts `rodizio --allow-root ARGS -c CONFIG` (the file turns the
    /// admin API on, on port 0) and waits for both of its ports.
    pub fn start(config: &Path, args: &[&str]) -> Rodizio {
        let mut child = Command::new(BIN)
            .arg("--allow-root")
            .args(args)
            .arg("-c")
            .arg(config)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start rodizio");
        let stdout = collect(child.stdout.take().unwrap());
        let stderr = collect(child.stderr.take().unwrap());
        let mut ports = None;
        let up = wait_for(WAIT, || {
            let out = stdout.text();
            let addr = addr_after(&out, "Load balancer listening on port ").or_else(|| {
                // `... on port N (ADDR)`: the address in parentheses.
                addr_after(&out, "(")
            });
            let admin = addr_after(&stderr.text(), "admin API listening on ");
            ports = addr.zip(admin);
            ports.is_some() || matches!(child.try_wait(), Ok(Some(_)))
        });
        let Some((addr, admin)) = ports.filter(|_| up) else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("rodizio did not start: {}{}", stdout.text(), stderr.text());
        };
        Rodizio {
            child,
            stderr,
            addr,
            admin,
        }
    }

    /// `METHOD path` on the admin API with `body`: the status and the body.
    pub fn call(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        call(self.admin, method, path, body)
    }

    /// The process's ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// One HTTP/1.1 request with `Connection: close`; the status and the body
/// (`(0, why)` when it could not be made).
pub fn call(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let attempt = || -> std::io::Result<(u16, String)> {
        let mut s = connect(addr)?;
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )?;
        let mut raw = String::new();
        s.read_to_string(&mut raw)?;
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

/// How a one-shot run ended.
pub struct Ended {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `rodizio ARGS` to its end; killed by its PID, and the test failed,
/// past [`WAIT`].
pub fn run(args: &[&str]) -> Ended {
    let mut child = Command::new(BIN)
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rodizio");
    let stdout = collect(child.stdout.take().unwrap());
    let stderr = collect(child.stderr.take().unwrap());
    let mut code = None;
    let ended = wait_for(WAIT, || match child.try_wait() {
        Ok(Some(status)) => {
            code = status.code();
            true
        }
        _ => false,
    });
    if !ended {
        let _ = child.kill();
        let _ = child.wait();
        panic!("rodizio {args:?} still running after {WAIT:?}");
    }
    stdout.wait_end(WAIT);
    stderr.wait_end(WAIT);
    Ended {
        code,
        stdout: stdout.text(),
        stderr: stderr.text(),
    }
}
