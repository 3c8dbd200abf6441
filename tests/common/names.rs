//! The rodizio binary run with a hosts file the test controls: the child
//! runs in a private mount namespace (`unshare --mount`, root only) where
//! the test's file is bind-mounted over `/etc/hosts` and an
//! `nsswitch.conf` saying `hosts: files` over `/etc/nsswitch.conf`, so its
//! resolver (`getaddrinfo`) reads names from that file only, never asks a
//! DNS server, and the host's own files are not touched. The test rewrites
//! the file in place (same inode, so the bind mount sees it).

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_rodizio");
/// Longest wait for the child's start-up lines.
pub const WAIT: Duration = Duration::from_secs(30);

/// Whether this test can run: mount namespaces need root. Not root: the
/// test says so and passes without running (CI runs as root).
pub fn can_run() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: a private mount namespace needs root");
        return false;
    }
    true
}

/// A scratch directory with the hosts file, the nsswitch file and the
/// config file; removed on drop.
pub struct Files {
    pub dir: PathBuf,
}

impl Files {
    pub fn new(name: &str) -> Files {
        let dir = std::env::temp_dir().join(format!("rodizio-names-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("nsswitch.conf"), "hosts: files\n").unwrap();
        std::fs::write(dir.join("hosts"), "").unwrap();
        Files { dir }
    }

    pub fn hosts(&self) -> PathBuf {
        self.dir.join("hosts")
    }

    pub fn config(&self) -> PathBuf {
        self.dir.join("rodizio.json")
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

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The command that runs rodizio `args` under the test's hosts file.
pub fn command(files: &Files, args: &[&str]) -> Command {
    let mut c = Command::new("unshare");
    c.args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(
            "mount --bind \"$1\" /etc/hosts && mount --bind \"$2\" /etc/nsswitch.conf \
             && shift 2 && exec \"$@\"",
        )
        .arg("sh")
        .arg(files.hosts())
        .arg(files.dir.join("nsswitch.conf"))
        .arg(BIN)
        .args(args);
    c
}

/// The balancer, started with `-c CONFIG` under the hosts file; killed by
/// PID and reaped on drop. Its standard error is collected.
pub struct NamedBalancer {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
    pub port: u16,
}

impl NamedBalancer {
    pub fn start(files: &Files) -> NamedBalancer {
        let config = files.config();
        let mut child = command(files, &["--allow-root", "-c", config.to_str().unwrap()])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start unshare");
        let log = lines(child.stderr.take().unwrap());
        let mut balancer = NamedBalancer {
            child,
            log,
            port: 0,
        };
        let mut stdout = BufReader::new(balancer.child.stdout.take().unwrap());
        let (tx, rx) = crossbeam_channel::bounded(1);
        thread::spawn(move || {
            let mut first = String::new();
            let _ = stdout.read_line(&mut first);
            let _ = tx.send(first);
            // Keep reading, so the child never blocks on a full pipe.
            let _ = std::io::copy(&mut stdout, &mut std::io::sink());
        });
        let first = rx.recv_timeout(WAIT).unwrap_or_default();
        balancer.port = first
            .strip_prefix("Load balancer listening on port ")
            .and_then(|rest| rest.split(' ').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no listening line: {first:?}; log {:#?}", balancer.log()));
        balancer
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Every log line so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// Log lines containing `needle`, so far.
    pub fn count(&self, needle: &str) -> usize {
        self.log().iter().filter(|l| l.contains(needle)).count()
    }

    /// Waits (bounded) for a log line containing `needle`.
    pub fn wait_log(&self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(line) = self.log().into_iter().find(|l| l.contains(needle)) {
                return line;
            }
            assert!(
                Instant::now() < deadline,
                "no {needle:?} in the log: {:#?}",
                self.log()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// The admin API's address, from its log line.
    pub fn admin(&self) -> SocketAddr {
        let line = self.wait_log("admin API listening on ", WAIT);
        let at = line.find("admin API listening on ").unwrap() + "admin API listening on ".len();
        line[at..].trim().parse().unwrap()
    }

    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on the child this test started.
        assert_eq!(unsafe { libc::kill(self.pid(), signal) }, 0);
    }

    /// Resident memory of the child, in KiB (`VmRSS`).
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }
}

impl Drop for NamedBalancer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// Collects each line `pipe` yields.
fn lines(pipe: impl Read + Send + 'static) -> Arc<Mutex<Vec<String>>> {
    let out: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink = Arc::clone(&out);
    thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            sink.lock().unwrap().push(line);
        }
    });
    out
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
