//! Real programs as test peers (nginx, HAProxy, redis-server, openssl
//! s_server), started as children on loopback and stopped by PID. The
//! rodizio binary itself goes through `tests/child` instead.
//!
//! A [`Peer`] is the guard of one child: dropping it sends the child its
//! stop signal, waits for it (bounded), kills it if it is still there, and
//! removes its temporary directory. So a test that fails half-way leaves no
//! process behind. A test process killed outright takes its children with
//! it too: each is started with `PR_SET_PDEATHSIG`.
//!
//! Nothing is installed here: a missing program fails the test, naming its
//! Debian package (`scripts/install-test-tools.sh` installs them all).

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::fs::{self, File};
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// redis-server on `port`, with no persistence, its files in a temporary
/// directory named after `name`; listening when this returns.
pub fn redis_server(port: u16, name: &str) -> Peer {
    let bin = need("redis-server", "redis-server");
    let dir = temp_dir(name);
    let mut cmd = Command::new(bin);
    cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(&dir);
    let mut peer = Peer::spawn("redis-server", cmd, libc::SIGTERM, &dir);
    peer.wait_listening(loopback(port));
    peer
}

/// rsyslogd with a private configuration: listening on a 127.0.0.1 UDP
/// port and on a Unix datagram socket in its own directory, writing every
/// message it parses to `Rsyslog::out`, one line each as
/// `VERSION APP-NAME PROCID MSGID MSG`. Ready when this returns (a probe
/// sent over UDP is in the file).
pub fn rsyslogd(name: &str) -> Rsyslog {
    let bin = need("rsyslogd", "rsyslog");
    let dir = temp_dir(name);
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = udp.local_addr().unwrap().port();
    drop(udp);
    let socket = dir.join("log.sock");
    let out = dir.join("messages.log");
    let conf = format!(
        r#"global(workDirectory="{dir}")
module(load="imudp")
module(load="imuxsock" SysSock.Use="off")
input(type="imudp" address="127.0.0.1" port="{port}")
input(type="imuxsock" Socket="{socket}" RateLimit.Interval="0" UseSpecialParser="off" ParseHostname="on")
template(name="raw" type="string" string="%protocol-version% %app-name% %procid% %msgid% %msg%\n")
*.* action(type="omfile" file="{out}" template="raw")
"#,
        dir = dir.display(),
        socket = socket.display(),
        out = out.display()
    );
    let conf_path = dir.join("rsyslog.conf");
    fs::write(&conf_path, conf).unwrap();
    let mut cmd = Command::new(bin);
    cmd.arg("-n").arg("-f").arg(&conf_path);
    cmd.arg("-i").arg(dir.join("rsyslogd.pid"));
    let mut peer = Peer::spawn("rsyslogd", cmd, libc::SIGTERM, &dir);
    let udp = loopback(port);
    let probe = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let until = Instant::now() + STARTUP;
    loop {
        if peer.exited() {
            panic!("rsyslogd exited at start-up:\n{}", peer.output());
        }
        let _ = probe.send_to(b"<134>1 - - probe 1 ready - ready", udp);
        if read(&out).contains("probe 1 ready") && socket.exists() {
            break;
        }
        assert!(
            Instant::now() < until,
            "rsyslogd not ready:\n{}",
            peer.output()
        );
        thread::sleep(Duration::from_millis(50));
    }
    Rsyslog {
        peer,
        udp,
        socket,
        out,
    }
}

/// A running [`rsyslogd`]: where it listens, and the file it writes.
pub struct Rsyslog {
    /// The daemon (stopped by its PID when dropped).
    pub peer: Peer,
    /// Its UDP address.
    pub udp: SocketAddr,
    /// Its Unix datagram socket.
    pub socket: PathBuf,
    /// Where it writes what it receives.
    pub out: PathBuf,
}

impl Rsyslog {
    /// The lines it wrote from `app` (its APP-NAME), waiting (bounded by
    /// [`STARTUP`]) until there are at least `n`.
    pub fn lines_from(&self, app: &str, n: usize) -> Vec<String> {
        let until = Instant::now() + STARTUP;
        loop {
            let lines: Vec<String> = read(&self.out)
                .lines()
                .filter(|l| l.split(' ').nth(1) == Some(app))
                .map(String::from)
                .collect();
            if lines.len() >= n || Instant::now() >= until {
                return lines;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

/// How long a peer may take to start listening.
pub const STARTUP: Duration = Duration::from_secs(20);

/// One running child; stopped when dropped (see the module docs).
pub struct Peer {
    /// What it is, for messages.
    pub name: String,
    /// Its process id.
    pub pid: i32,
    /// Its temporary directory (config, logs), removed on drop.
    pub dir: PathBuf,
    /// Where its standard output and error go.
    pub out: PathBuf,
    signal: i32,
    child: Child,
    reaped: bool,
    status: Option<ExitStatus>,
}

impl Peer {
    /// Starts `cmd` with its output into `dir/NAME.out`, stopped by
    /// `signal` when dropped.
    pub fn spawn(name: &str, mut cmd: Command, signal: i32, dir: &Path) -> Peer {
        let out = dir.join(format!("{name}.out"));
        let file = File::create(&out).expect("create the peer's output file");
        let err = file.try_clone().expect("clone a file handle");
        cmd.stdin(Stdio::null()).stdout(file).stderr(err);
        // SAFETY: prctl is async-signal-safe, as a pre_exec closure must be.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name} ({cmd:?}): {e}"));
        Peer {
            name: name.to_string(),
            pid: child.id() as i32,
            dir: dir.to_path_buf(),
            out,
            signal,
            child,
            reaped: false,
            status: None,
        }
    }

    /// Whether it has exited (it is then reaped).
    pub fn exited(&mut self) -> bool {
        if self.reaped {
            return true;
        }
        match self.child.try_wait() {
            Ok(None) => {}
            Ok(Some(status)) => {
                self.status = Some(status);
                self.reaped = true;
            }
            Err(_) => self.reaped = true,
        }
        self.reaped
    }

    /// Sends `signal` (SIGTERM, SIGSTOP...) without waiting.
    pub fn signal(&self, signal: i32) {
        if !self.reaped {
            // SAFETY: a plain kill(2) on our own unreaped child.
            unsafe { libc::kill(self.pid, signal) };
        }
    }

    /// Waits at most `timeout` for it to exit; whether it did.
    pub fn wait_exit(&mut self, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        while Instant::now() < until {
            if self.exited() {
                return true;
            }
            thread::sleep(Duration::from_millis(10));
        }
        self.exited()
    }

    /// How it exited, once it has.
    pub fn status(&mut self) -> Option<ExitStatus> {
        self.exited();
        self.status
    }

    /// Stops it now (its signal, then SIGKILL after 10 s); idempotent.
    pub fn stop(&mut self) {
        if self.exited() {
            return;
        }
        self.signal(libc::SIGCONT);
        self.signal(self.signal);
        if !self.wait_exit(Duration::from_secs(10)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
            self.reaped = true;
        }
    }

    /// Its output so far.
    pub fn output(&self) -> String {
        read(&self.out)
    }

    /// Waits until `addr` accepts a connection, failing the test with the
    /// peer's output if it exits or [`STARTUP`] passes first.
    pub fn wait_listening(&mut self, addr: SocketAddr) {
        let until = Instant::now() + STARTUP;
        while Instant::now() < until {
            if self.exited() {
                panic!("{} exited at start-up:\n{}", self.name, self.output());
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "{} not listening on {addr} after {STARTUP:?}:\n{}",
            self.name,
            self.output()
        );
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.stop();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A program's path, or an error naming the Debian package that provides
/// it. Looks in PATH, the sbin directories and Debian's PostgreSQL
/// directories (which keep the server programs out of PATH; the newest
/// version first).
pub fn find(program: &str, package: &str) -> Result<PathBuf, String> {
    let path = std::env::var("PATH").unwrap_or_default();
    let dirs = path
        .split(':')
        .map(PathBuf::from)
        .chain(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(PathBuf::from))
        .chain(postgres_bin_dirs());
    for dir in dirs {
        let candidate = dir.join(program);
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    Err(format!(
        "`{program}` not found: install the Debian package `{package}` \
         (scripts/install-test-tools.sh installs every test tool)"
    ))
}

/// [`find`], failing the test when the program is missing.
pub fn need(program: &str, package: &str) -> PathBuf {
    find(program, package).unwrap_or_else(|e| panic!("{e}"))
}

/// `/usr/lib/postgresql/*/bin`, the newest version first.
fn postgres_bin_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = fs::read_dir("/usr/lib/postgresql")
        .map(|d| d.flatten().map(|e| e.path().join("bin")).collect())
        .unwrap_or_default();
    dirs.sort();
    dirs.reverse();
    dirs
}

/// A new empty directory under the system temp dir, or why it could not
/// be made.
pub fn make_temp_dir(name: &str) -> Result<PathBuf, String> {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "rodizio-{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir)
}

/// [`make_temp_dir`], failing the test when it cannot.
pub fn temp_dir(name: &str) -> PathBuf {
    make_temp_dir(name).unwrap_or_else(|e| panic!("create a temp dir: {e}"))
}

/// A port free now on 127.0.0.1: bound by the kernel's choice, then
/// released for the peer to take.
pub fn free_port() -> u16 {
    free_ports(1)[0]
}

/// `n` different ports free now on 127.0.0.1: all bound at once, so that
/// the kernel cannot hand out the same one twice, then released. (One
/// [`free_port`] after another may return a port just released.)
pub fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    held.iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

/// `127.0.0.1:port`.
pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A file's text, or a note saying why it could not be read.
pub fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| format!("({}: {e})", path.display()))
}

/// Connects to `to` from the loopback address `from` (any of
/// 127.0.0.0/8 is this host), with read and write timeouts.
pub fn connect_from(from: [u8; 4], to: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
    socket.bind(&SocketAddr::from((from, 0)).into())?;
    socket.connect_timeout(&to.into(), timeout)?;
    let stream: TcpStream = socket.into();
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    Ok(stream)
}

/// Runs `ab` (one connection per request) against `addr`; returns
/// (complete, failed). ab may open up to `c` connections more than `n`
/// (the last round's), so counts through the balancer are checked within
/// `n..=n + c`.
pub fn ab(addr: SocketAddr, n: usize, c: usize) -> (usize, usize) {
    ab_with(addr, &["-n", &n.to_string(), "-c", &c.to_string()])
}

/// Runs `ab` for `secs` seconds (at most a million requests) with `c` at
/// once against `addr`; returns (complete, failed).
pub fn ab_for(addr: SocketAddr, secs: u64, c: usize) -> (usize, usize) {
    let t = secs.to_string();
    ab_with(addr, &["-t", &t, "-n", "1000000", "-c", &c.to_string()])
}

fn ab_with(addr: SocketAddr, args: &[&str]) -> (usize, usize) {
    let bin = need("ab", "apache2-utils");
    let out: Output = Command::new("timeout")
        .arg("60")
        .arg(bin)
        .arg("-q")
        .args(args)
        .args(["-s", "10"])
        .arg(format!("http://{addr}/"))
        .output()
        .expect("run ab");
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| {
                let err = String::from_utf8_lossy(&out.stderr);
                panic!("no {name} in ab's output:\n{text}\n{err}")
            })
    };
    (field("Complete requests:"), field("Failed requests:"))
}
