//! The rodizio binary run with a hosts file the test controls: the child
//! runs in a user namespace of its own, where it is root, with a private
//! mount namespace (`unshare --user --map-root-user --mount`: no root
//! needed outside, none of the host's files touched) in which the test's
//! file is bind-mounted over `/etc/hosts` and an `nsswitch.conf` saying
//! `hosts: files` over `/etc/nsswitch.conf`, so its resolver
//! (`getaddrinfo`) reads names from that file only and never asks a DNS
//! server. The test rewrites the file in place (same inode, so the bind
//! mount sees it). Where user namespaces are not allowed, the child fails
//! to start and the test fails with what `unshare` said.

#![allow(dead_code)]

use std::io::Read;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crate::child::{Child, Scratch, BIN};
use crate::common::wait_for;

/// Longest wait for the child's start-up lines.
pub const WAIT: Duration = crate::child::WAIT;

/// A scratch directory with the hosts file, the nsswitch file and the
/// config file; removed on drop.
pub struct Files {
    scratch: Scratch,
}

impl Files {
    pub fn new(name: &str) -> Files {
        let scratch = Scratch::new(&format!("names-{name}"));
        std::fs::write(scratch.path("nsswitch.conf"), "hosts: files\n").unwrap();
        std::fs::write(scratch.path("hosts"), "").unwrap();
        Files { scratch }
    }

    pub fn hosts(&self) -> PathBuf {
        self.scratch.path("hosts")
    }

    pub fn config(&self) -> PathBuf {
        self.scratch.path("rodizio.json")
    }

    /// Rewrites the hosts file in place (truncate and write: the same
    /// inode, which the child's bind mount shows).
    pub fn set_hosts(&self, text: &str) {
        std::fs::write(self.hosts(), text).unwrap();
    }

    /// Writes the config file (read at start-up and at each reload).
    pub fn set_config(&self, text: &str) {
        std::fs::write(self.config(), text).unwrap();
    }
}

/// The command that runs rodizio `args` under the test's hosts file.
pub fn command(files: &Files, args: &[&str]) -> Command {
    let mut c = Command::new("unshare");
    c.args([
        "--user",
        "--map-root-user",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
    ])
    .arg(
        "mount --bind \"$1\" /etc/hosts && mount --bind \"$2\" /etc/nsswitch.conf \
         && shift 2 && exec \"$@\"",
    )
    .arg("sh")
    .arg(files.hosts())
    .arg(files.scratch.path("nsswitch.conf"))
    .arg(BIN)
    .args(args)
    .env("RUST_LOG", "info");
    c
}

/// The balancer, started with `-c CONFIG` under the hosts file; killed by
/// PID and reaped on drop. Its standard error is collected.
pub struct NamedBalancer {
    child: Child,
}

impl NamedBalancer {
    pub fn start(files: &Files) -> NamedBalancer {
        let config = files.config();
        let child = Child::start(&mut command(
            files,
            &["--allow-root", "-c", config.to_str().unwrap()],
        ));
        NamedBalancer { child }
    }

    pub fn addr(&self) -> SocketAddr {
        self.child.addr
    }

    pub fn pid(&self) -> i32 {
        self.child.pid() as i32
    }

    /// Every log line so far.
    pub fn log(&self) -> Vec<String> {
        self.child.log().lines().map(String::from).collect()
    }

    /// Log lines containing `needle`, so far.
    pub fn count(&self, needle: &str) -> usize {
        self.log().iter().filter(|l| l.contains(needle)).count()
    }

    /// Waits (bounded) for a log line containing `needle`.
    pub fn wait_log(&self, needle: &str, timeout: Duration) -> String {
        let mut line = None;
        wait_for(timeout, || {
            line = self.log().into_iter().find(|l| l.contains(needle));
            line.is_some()
        });
        line.unwrap_or_else(|| panic!("no {needle:?} in the log: {:#?}", self.log()))
    }

    /// The admin API's address, from its log line.
    pub fn admin(&self) -> SocketAddr {
        let line = self.wait_log("admin API listening on ", WAIT);
        let at = line.find("admin API listening on ").unwrap() + "admin API listening on ".len();
        line[at..].trim().parse().unwrap()
    }

    pub fn signal(&self, signal: libc::c_int) {
        self.child.signal(signal);
    }

    /// Resident memory of the child, in KiB (`VmRSS`).
    pub fn rss_kib(&self) -> u64 {
        self.child.rss_kib()
    }
}

/// Binds the same free port on each of `ips` (loopback addresses), for
/// backends behind one name; retries with another port when one is taken
/// on a later address.
pub fn same_port(ips: &[[u8; 4]]) -> Vec<std::net::TcpListener> {
    for _ in 0..50 {
        let first = std::net::TcpListener::bind(SocketAddr::from((ips[0], 0))).unwrap();
        let port = first.local_addr().unwrap().port();
        let mut all = vec![first];
        for ip in &ips[1..] {
            match std::net::TcpListener::bind(SocketAddr::from((*ip, port))) {
                Ok(l) => all.push(l),
                Err(_) => break,
            }
        }
        if all.len() == ips.len() {
            return all;
        }
    }
    panic!("no port free on every address of {ips:?}");
}

/// An echo backend on a listener the test bound (see [`same_port`]):
/// counts its connections; stopped and joined on drop.
pub struct Echo {
    addr: SocketAddr,
    accepted: Arc<std::sync::atomic::AtomicUsize>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Echo {
    pub fn on(listener: std::net::TcpListener) -> Echo {
        use std::sync::atomic::Ordering;
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (count, halt) = (Arc::clone(&accepted), Arc::clone(&stop));
        let thread = thread::spawn(move || {
            for stream in listener.incoming() {
                if halt.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                count.fetch_add(1, Ordering::SeqCst);
                let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
                let _ = stream.set_write_timeout(Some(Duration::from_secs(30)));
                thread::spawn(move || crate::common::echo(stream));
            }
        });
        Echo {
            addr,
            accepted,
            stop,
            thread: Some(thread),
        }
    }

    pub fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = std::net::TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One round trip through `addr`: connects, sends `text`, reads it back.
pub fn round_trip(addr: SocketAddr, text: &[u8]) -> std::io::Result<std::net::TcpStream> {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.set_write_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(text)?;
    let mut back = vec![0; text.len()];
    s.read_exact(&mut back)?;
    assert_eq!(back, text);
    Ok(s)
}
