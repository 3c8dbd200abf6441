//! Protocol-aware health checks against the real servers: redis-server,
//! nginx with TLS, MariaDB and PostgreSQL, each started by this file as a
//! child process on loopback and a free port, plus a fake SMTP server.
//! Each check must call a healthy server healthy, leave nothing in its log
//! (MariaDB, PostgreSQL), and give a reason when it fails.
//!
//! The servers are started once for the whole file (one `OnceLock` each,
//! on first use) and stopped by PID when the test process exits (an
//! `atexit` hook, which also removes their temporary directories); a
//! server whose start-up fails is stopped at once by its guard, and one
//! whose test process is killed outright is killed by the kernel
//! (`PR_SET_PDEATHSIG`). Nothing is installed here: a missing program fails the tests
//! that need it, naming the Debian package; `scripts/install-test-tools.sh`
//! installs them all. Finding programs, temporary directories, free
//! ports and reading logs are `tests/peers`' helpers.

mod child;
mod common;
mod peers;

use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex, Once, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use peers::{find, free_port, free_ports, loopback, make_temp_dir, read};
use rodizio::health::protocol::{parse_bytes, run, ProtocolCheck};

/// The longest a server may take to start (MariaDB's first start is the
/// slowest: a few seconds).
const STARTUP: Duration = Duration::from_secs(60);
/// The deadline of a check against a healthy server.
const CHECK: Duration = Duration::from_secs(5);
/// The deadline of a check that is expected to time out.
const SHORT: Duration = Duration::from_millis(300);
/// Time allowed beyond a deadline for the check to notice it.
const SLACK: Duration = Duration::from_millis(700);

// ---------------------------------------------------------------------
// Child processes: started, registered, stopped by PID.
// ---------------------------------------------------------------------

/// Every server still running, with the signal that stops it cleanly and
/// its temporary directory, for the exit hook.
static RUNNING: Mutex<Vec<(i32, i32, PathBuf)>> = Mutex::new(Vec::new());

/// Stops every registered server; runs when the test process exits.
extern "C" fn stop_all() {
    let running = match RUNNING.lock() {
        Ok(mut r) => std::mem::take(&mut *r),
        Err(_) => return,
    };
    for (pid, signal, dir) in running {
        stop(pid, signal);
        let _ = fs::remove_dir_all(dir);
    }
}

/// Sends `signal` to `pid`, waits (at most 15 s) for it to exit, then
/// kills it.
fn stop(pid: i32, signal: i32) {
    // SAFETY: plain system calls on a PID this process started and has not
    // reaped yet, so it cannot belong to another process.
    unsafe {
        libc::kill(pid, signal);
        let until = Instant::now() + Duration::from_secs(15);
        let mut status = 0;
        while Instant::now() < until {
            if libc::waitpid(pid, &mut status, libc::WNOHANG) != 0 {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, &mut status, 0);
    }
}

/// A started server: stopped when dropped, unless it was handed to the
/// exit hook by [`Guard::keep`].
struct Guard {
    pid: i32,
    signal: i32,
    dir: PathBuf,
    kept: bool,
}

impl Guard {
    /// Spawns `cmd` with its output into `log`.
    fn spawn(mut cmd: Command, signal: i32, dir: &Path, log: &Path) -> Result<Guard, String> {
        let out = File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        let what = format!("{cmd:?}");
        let child = spawn_with_death_signal(cmd).map_err(|e| format!("starting {what}: {e}"))?;
        Ok(Guard {
            pid: child.id() as i32,
            signal,
            dir: dir.to_path_buf(),
            kept: false,
        })
    }

    /// Whether the process has exited (it is then reaped).
    fn exited(&self) -> bool {
        let mut status = 0;
        // SAFETY: see `stop`.
        unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) != 0 }
    }

    /// Hands the server to the exit hook: it runs until the tests end.
    fn keep(mut self) {
        static HOOK: Once = Once::new();
        HOOK.call_once(|| {
            // SAFETY: registers a plain `extern "C" fn` with no arguments.
            unsafe { libc::atexit(stop_all) };
        });
        RUNNING
            .lock()
            .unwrap()
            .push((self.pid, self.signal, self.dir.clone()));
        self.kept = true;
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if !self.kept {
            stop(self.pid, self.signal);
        }
    }
}

/// Spawns `cmd` with `PR_SET_PDEATHSIG`, so the kernel kills the server
/// if this process dies without running its exit hook (killed by a
/// signal). The signal fires when the *thread* that forked the child
/// exits, so the fork happens on a thread that lives as long as the
/// process, not on the test's own thread.
fn spawn_with_death_signal(mut cmd: Command) -> io::Result<Child> {
    type Request = (Command, mpsc::Sender<io::Result<Child>>);
    static KEEPER: OnceLock<Mutex<mpsc::Sender<Request>>> = OnceLock::new();
    let keeper = KEEPER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        thread::Builder::new()
            .name("server-keeper".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .unwrap();
        Mutex::new(tx)
    });
    // SAFETY: prctl is async-signal-safe, as a pre_exec closure must be.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let (tx, rx) = mpsc::channel();
    keeper.lock().unwrap().send((cmd, tx)).unwrap();
    rx.recv().unwrap()
}

/// Connects (1 s timeout) and runs `check` with `timeout` for the rest.
fn check(addr: SocketAddr, check: &ProtocolCheck, timeout: Duration) -> Result<(), String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1))
        .map_err(|e| format!("connect: {e}"))?;
    run(check, &mut stream, Instant::now() + timeout)
}

/// Polls `addr` with `probe` until it is healthy, the server exits, or
/// [`STARTUP`] passes. A probe that speaks the protocol, rather than a bare
/// connect, so that waiting leaves no protocol error in the server's log
/// (only what a server says to any client while it starts, such as
/// PostgreSQL's "the database system is starting up").
fn wait_ready(
    name: &str,
    guard: &Guard,
    addr: SocketAddr,
    probe: &ProtocolCheck,
    log: &Path,
) -> Result<(), String> {
    let until = Instant::now() + STARTUP;
    let mut last = String::new();
    while Instant::now() < until {
        if guard.exited() {
            return Err(format!(
                "{name} exited at start-up; its log:\n{}",
                read(log)
            ));
        }
        match check(addr, probe, Duration::from_secs(2)) {
            Ok(()) => return Ok(()),
            Err(e) => last = e,
        }
        thread::sleep(Duration::from_millis(50));
    }
    Err(format!(
        "{name} not ready after {STARTUP:?} ({last}); its log:\n{}",
        read(log)
    ))
}

/// Runs a set-up command to its end; its output goes to `log`.
fn run_to_end(cmd: &mut Command, log: &Path) -> Result<(), String> {
    let out = File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    let status = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .status()
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed ({status}):\n{}", read(log)))
    }
}

/// A started server, shared by the tests of this file.
struct Server {
    /// The TCP port(s) it listens on, on 127.0.0.1.
    ports: Vec<u16>,
    /// The log it writes.
    log: PathBuf,
}

impl Server {
    fn addr(&self) -> SocketAddr {
        loopback(self.ports[0])
    }
}

/// The server in `cell`, started on first use; a start-up failure fails
/// every test that needs it, with the same message.
fn get(
    cell: &'static OnceLock<Result<Server, String>>,
    start: fn() -> Result<Server, String>,
) -> &'static Server {
    match cell.get_or_init(start) {
        Ok(server) => server,
        Err(e) => panic!("{e}"),
    }
}

// ---------------------------------------------------------------------
// The servers.
// ---------------------------------------------------------------------

/// Two redis-servers: the first open, the second with a password (it
/// answers `-NOAUTH` to a `PING`). Log level `verbose`, so the log shows
/// each connection.
fn redis() -> &'static Server {
    static CELL: OnceLock<Result<Server, String>> = OnceLock::new();
    get(&CELL, || {
        let bin = find("redis-server", "redis-server")?;
        let dir = make_temp_dir("redis")?;
        let mut ports = Vec::new();
        for password in [None, Some("secret")] {
            let port = free_port();
            let log = dir.join(format!("redis-{port}.log"));
            let mut cmd = Command::new(&bin);
            cmd.args(["--bind", "127.0.0.1", "--port", &port.to_string()])
                .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                .args(["--loglevel", "verbose"])
                .arg("--dir")
                .arg(&dir);
            if let Some(p) = password {
                cmd.args(["--requirepass", p]);
            }
            let guard = Guard::spawn(cmd, libc::SIGTERM, &dir, &log)?;
            wait_ready(
                "redis-server",
                &guard,
                loopback(port),
                &ProtocolCheck::Redis,
                &log,
            )?;
            guard.keep();
            ports.push(port);
        }
        Ok(Server {
            log: dir.join(format!("redis-{}.log", ports[0])),
            ports,
        })
    })
}

/// nginx: TLS (1.2 and 1.3) on the first port, TLS 1.2 only on the second,
/// plain HTTP on the third; a self-signed P-256 certificate made here with
/// `openssl req`. Error log at `info`, its most verbose level short of debug.
fn nginx() -> &'static Server {
    static CELL: OnceLock<Result<Server, String>> = OnceLock::new();
    get(&CELL, || {
        let bin = find("nginx", "nginx")?;
        let openssl = find("openssl", "openssl")?;
        let dir = make_temp_dir("nginx")?;
        run_to_end(
            Command::new(openssl)
                .args([
                    "req",
                    "-x509",
                    "-nodes",
                    "-days",
                    "1",
                    "-subj",
                    "/CN=localhost",
                ])
                .args(["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"])
                .arg("-keyout")
                .arg(dir.join("key.pem"))
                .arg("-out")
                .arg(dir.join("cert.pem")),
            &dir.join("openssl.log"),
        )?;
        let ports = free_ports(3);
        let d = dir.display();
        let (tls, tls12, http) = (ports[0], ports[1], ports[2]);
        let conf = format!(
            "daemon off;\nmaster_process off;\npid {d}/nginx.pid;\nerror_log {d}/error.log info;\n\
             events {{ worker_connections 64; }}\n\
             http {{\n  access_log {d}/access.log;\n\
               client_body_temp_path {d}/body; proxy_temp_path {d}/proxy;\n\
               fastcgi_temp_path {d}/fastcgi; uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;\n\
               ssl_certificate {d}/cert.pem; ssl_certificate_key {d}/key.pem;\n\
               server {{ listen 127.0.0.1:{tls} ssl; ssl_protocols TLSv1.2 TLSv1.3; return 200 \"ok\\n\"; }}\n\
               server {{ listen 127.0.0.1:{tls12} ssl; ssl_protocols TLSv1.2; return 200 \"ok\\n\"; }}\n\
               server {{ listen 127.0.0.1:{http}; return 200 \"ok\\n\"; }}\n}}\n"
        );
        let conf_path = dir.join("nginx.conf");
        fs::write(&conf_path, conf).map_err(|e| e.to_string())?;
        let log = dir.join("error.log");
        let mut cmd = Command::new(bin);
        cmd.arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(&conf_path)
            .arg("-e")
            .arg(&log);
        let guard = Guard::spawn(cmd, libc::SIGTERM, &dir, &dir.join("nginx.out"))?;
        wait_ready(
            "nginx",
            &guard,
            loopback(ports[0]),
            &ProtocolCheck::Tls,
            &log,
        )?;
        guard.keep();
        Ok(Server { ports, log })
    })
}

/// The MariaDB user the check logs in as: no password, no privilege.
const MARIADB_USER: &str = "rodizio_check";

/// mariadbd on a fresh data directory (`mariadb-install-db`), run as root
/// (`--user=root`: the tests run as root), compiled-in defaults only
/// (`--no-defaults`: `log_warnings` is 2). The check user is created by
/// `--init-file` before the first client is served, so waiting for the
/// server logs nothing.
fn mariadb() -> &'static Server {
    static CELL: OnceLock<Result<Server, String>> = OnceLock::new();
    get(&CELL, || {
        let install = find("mariadb-install-db", "mariadb-server")?;
        let bin = find("mariadbd", "mariadb-server")?;
        let dir = make_temp_dir("mariadb")?;
        let data = dir.join("data");
        run_to_end(
            Command::new(install)
                .arg("--no-defaults")
                .arg(format!("--datadir={}", data.display()))
                .args([
                    "--user=root",
                    "--skip-test-db",
                    "--auth-root-authentication-method=socket",
                ]),
            &dir.join("install.log"),
        )?;
        let init = dir.join("init.sql");
        fs::write(
            &init,
            format!("CREATE USER IF NOT EXISTS '{MARIADB_USER}'@'127.0.0.1';\n"),
        )
        .map_err(|e| e.to_string())?;
        let port = free_port();
        let log = dir.join("error.log");
        let mut cmd = Command::new(bin);
        cmd.arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--socket={}", dir.join("mariadb.sock").display()))
            .arg(format!("--pid-file={}", dir.join("mariadb.pid").display()))
            .arg(format!("--log-error={}", log.display()))
            .arg(format!("--init-file={}", init.display()))
            .arg(format!("--port={port}"))
            .args([
                "--bind-address=127.0.0.1",
                "--user=root",
                "--skip-name-resolve",
            ])
            .args(["--innodb-buffer-pool-size=16M", "--max-connections=20"]);
        let guard = Guard::spawn(cmd, libc::SIGTERM, &dir, &dir.join("mariadbd.out"))?;
        let probe = ProtocolCheck::Mysql {
            user: Some(MARIADB_USER.into()),
        };
        wait_ready("mariadbd", &guard, loopback(port), &probe, &log)?;
        guard.keep();
        Ok(Server {
            ports: vec![port],
            log,
        })
    })
}

/// postgres on a fresh cluster (`initdb`), run as the `postgres` user
/// (PostgreSQL refuses root): the set-uid is std's `Command::uid`, the
/// same as `setpriv`, so the PID is the server's own. `pg_hba.conf`: the
/// role `postgres` is trusted, `blocked` is rejected, any other role needs
/// a SCRAM password.
fn postgres() -> &'static Server {
    static CELL: OnceLock<Result<Server, String>> = OnceLock::new();
    get(&CELL, || {
        let initdb = find("initdb", "postgresql")?;
        let bin = find("postgres", "postgresql")?;
        let (uid, gid) = user_ids("postgres")?;
        let dir = make_temp_dir("postgres")?;
        let data = dir.join("data");
        let sockets = dir.join("sockets");
        fs::create_dir_all(&sockets).map_err(|e| e.to_string())?;
        for d in [&dir, &sockets] {
            std::os::unix::fs::chown(d, Some(uid), Some(gid)).map_err(|e| e.to_string())?;
            fs::set_permissions(d, fs::Permissions::from_mode(0o700)).map_err(|e| e.to_string())?;
        }
        run_to_end(
            Command::new(initdb)
                .uid(uid)
                .gid(gid)
                .arg("-D")
                .arg(&data)
                .args([
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "--no-sync",
                    "-E",
                    "UTF8",
                    "--locale=C",
                ]),
            &dir.join("initdb.log"),
        )?;
        // Overwriting keeps the file's owner (postgres).
        fs::write(
            data.join("pg_hba.conf"),
            "local all all trust\n\
             host all blocked 127.0.0.1/32 reject\n\
             host all postgres 127.0.0.1/32 trust\n\
             host all all 127.0.0.1/32 scram-sha-256\n",
        )
        .map_err(|e| e.to_string())?;
        let port = free_port();
        let log = dir.join("postgres.log");
        let mut cmd = Command::new(bin);
        cmd.uid(uid)
            .gid(gid)
            .arg("-D")
            .arg(&data)
            .arg("-k")
            .arg(&sockets)
            .args(["-p", &port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
            .args(["-c", "max_connections=20", "-c", "shared_buffers=16MB"]);
        // SIGINT: PostgreSQL's "fast" shutdown (SIGTERM waits for clients).
        let guard = Guard::spawn(cmd, libc::SIGINT, &dir, &log)?;
        let probe = ProtocolCheck::Pgsql {
            user: "postgres".into(),
        };
        wait_ready("postgres", &guard, loopback(port), &probe, &log)?;
        guard.keep();
        Ok(Server {
            ports: vec![port],
            log,
        })
    })
}

/// The uid and gid of a system user.
fn user_ids(name: &str) -> Result<(u32, u32), String> {
    let c_name = std::ffi::CString::new(name).map_err(|e| e.to_string())?;
    // SAFETY: getpwnam returns null or a pointer to a static record, read
    // at once; the tests call it from one thread (inside a OnceLock).
    unsafe {
        let pw = libc::getpwnam(c_name.as_ptr());
        if pw.is_null() {
            return Err(format!(
                "no system user `{name}`: install the Debian package `postgresql`"
            ));
        }
        Ok(((*pw).pw_uid, (*pw).pw_gid))
    }
}

/// A fake SMTP server: a multi-line 220 greeting, `221` to `QUIT`, `502`
/// to anything else. Records each command it receives.
struct FakeSmtp {
    addr: SocketAddr,
    commands: Arc<Mutex<Vec<String>>>,
}

impl FakeSmtp {
    fn start(greeting: &'static str) -> FakeSmtp {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let commands = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&commands);
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let seen = Arc::clone(&seen);
                thread::spawn(move || {
                    stream
                        .set_read_timeout(Some(Duration::from_secs(10)))
                        .unwrap();
                    stream
                        .set_write_timeout(Some(Duration::from_secs(10)))
                        .unwrap();
                    if stream.write_all(greeting.as_bytes()).is_err() {
                        return;
                    }
                    let mut lines = BufReader::new(stream.try_clone().unwrap());
                    let mut line = String::new();
                    while lines.read_line(&mut line).unwrap_or(0) > 0 {
                        let command = line.trim_end().to_string();
                        seen.lock().unwrap().push(command.clone());
                        if command == "QUIT" {
                            let _ = stream.write_all(b"221 2.0.0 bye\r\n");
                            return;
                        }
                        let _ = stream.write_all(b"502 5.5.2 what?\r\n");
                        line.clear();
                    }
                });
            }
        });
        FakeSmtp { addr, commands }
    }
}

/// A port that accepts and closes at once.
fn closes_at_once() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
        for stream in listener.incoming() {
            drop(stream);
        }
    });
    addr
}

/// A port that accepts and then says nothing, keeping every connection
/// open until the tests end.
fn silent() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream);
        }
    });
    addr
}

/// The lines of `path` that contain `needle`.
fn lines_with(path: &Path, needle: &str) -> Vec<String> {
    read(path)
        .lines()
        .filter(|l| l.contains(needle))
        .map(String::from)
        .collect()
}

/// Polls until `path` has `n` lines containing `needle` (at most 10 s);
/// returns those lines.
fn wait_for_lines(path: &Path, needle: &str, n: usize) -> Vec<String> {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let lines = lines_with(path, needle);
        if lines.len() >= n || Instant::now() > until {
            return lines;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

fn all_checks() -> Vec<ProtocolCheck> {
    vec![
        ProtocolCheck::Redis,
        ProtocolCheck::Tls,
        ProtocolCheck::Smtp,
        ProtocolCheck::Mysql {
            user: Some("u".into()),
        },
        ProtocolCheck::Mysql { user: None },
        ProtocolCheck::Pgsql { user: "u".into() },
        ProtocolCheck::SendExpect {
            send: b"hello\r\n".to_vec(),
            expect: b"OK".to_vec(),
        },
    ]
}

// ---------------------------------------------------------------------
// The tests.
// ---------------------------------------------------------------------

/// Redis: PONG from an open server, NOAUTH from one with a password, both
/// healthy, both ended by QUIT; the same through send/expect. At log
/// level `verbose` Redis logs "Client closed connection" for a client that
/// leaves without QUIT (a plain TCP check), and nothing for these.
#[test]
fn redis_answers_ping_and_quit() {
    let redis = redis();
    for _ in 0..3 {
        assert_eq!(check(redis.addr(), &ProtocolCheck::Redis, CHECK), Ok(()));
    }
    assert_eq!(
        check(loopback(redis.ports[1]), &ProtocolCheck::Redis, CHECK),
        Ok(()),
        "-NOAUTH is alive"
    );
    let ping = ProtocolCheck::SendExpect {
        send: parse_bytes(r"PING\r\nQUIT\r\n").unwrap(),
        expect: parse_bytes("+PONG").unwrap(),
    };
    assert_eq!(check(redis.addr(), &ping, CHECK), Ok(()));
    // The marker: a plain TCP check, whose line must be the only one.
    drop(TcpStream::connect(redis.addr()).unwrap());
    let closed = wait_for_lines(&redis.log, "Client closed connection", 1);
    assert_eq!(closed.len(), 1, "only the marker's:\n{}", read(&redis.log));
}

/// TLS: nginx answers the ClientHello with a handshake record, with TLS
/// 1.3 and with TLS 1.2 only; nginx logs nothing at level `error` or above.
#[test]
fn tls_hello_gets_a_server_hello_from_nginx() {
    let nginx = nginx();
    for port in [nginx.ports[0], nginx.ports[1]] {
        for _ in 0..3 {
            assert_eq!(check(loopback(port), &ProtocolCheck::Tls, CHECK), Ok(()));
        }
    }
    let log = read(&nginx.log);
    let errors: Vec<&str> = log
        .lines()
        .filter(|l| {
            ["[error]", "[crit]", "[alert]", "[emerg]"]
                .iter()
                .any(|k| l.contains(k))
        })
        .collect();
    assert!(
        errors.is_empty(),
        "nginx logged errors:\n{}",
        errors.join("\n")
    );
    let info: Vec<&str> = log.lines().filter(|l| l.contains("[info]")).collect();
    eprintln!("nginx logged, at level info:\n{}", info.join("\n"));
}

/// MariaDB: the check with a user logs in and sends COM_QUIT: nothing in
/// the error log. A plain TCP check and the check without a user each
/// leave an `Aborted connection` warning, as the module docs say.
#[test]
fn mariadb_logs_nothing_for_the_check_with_a_user() {
    let mariadb = mariadb();
    let with_user = ProtocolCheck::Mysql {
        user: Some(MARIADB_USER.into()),
    };
    for _ in 0..5 {
        assert_eq!(check(mariadb.addr(), &with_user, CHECK), Ok(()));
    }
    // An unknown user is refused with the server's message.
    let unknown = ProtocolCheck::Mysql {
        user: Some("nobody_here".into()),
    };
    let e = check(mariadb.addr(), &unknown, CHECK).unwrap_err();
    assert!(
        e.starts_with("mysql: server error 1045: Access denied for user 'nobody_here'"),
        "{e}"
    );

    // Then what the two other ways of checking leave, as a marker: the
    // server has written these lines, so it has written any line about the
    // checks above too.
    drop(TcpStream::connect(mariadb.addr()).unwrap());
    assert_eq!(
        check(mariadb.addr(), &ProtocolCheck::Mysql { user: None }, CHECK),
        Ok(())
    );
    let aborted = wait_for_lines(&mariadb.log, "Aborted connection", 2);
    eprintln!("mariadbd logged:\n{}", aborted.join("\n"));
    assert_eq!(
        aborted.len(),
        2,
        "one line for the TCP check, one without a user: {aborted:#?}"
    );
    for line in &aborted {
        assert!(
            line.contains("user: 'unauthenticated'")
                && line.contains("This connection closed normally without authentication"),
            "{line}"
        );
    }
    assert!(
        lines_with(&mariadb.log, MARIADB_USER).is_empty(),
        "{}",
        read(&mariadb.log)
    );
    assert_eq!(
        lines_with(&mariadb.log, "Access denied").len(),
        1,
        "only nobody_here"
    );
}

/// PostgreSQL: a trusted role gets a whole session (AuthenticationOk,
/// ReadyForQuery, Terminate); a role that needs a password, and one that
/// pg_hba rejects, show a live server too. None of them leaves an
/// "incomplete startup packet" or a protocol error in the log. (Nor does a
/// plain TCP check, in PostgreSQL 15: it stays silent about a connection
/// closed before its first byte.)
#[test]
fn postgres_logs_nothing_for_the_check() {
    let pg = postgres();
    drop(TcpStream::connect(pg.addr()).unwrap());
    for user in ["postgres", "app", "blocked"] {
        let pgsql = ProtocolCheck::Pgsql { user: user.into() };
        for _ in 0..3 {
            assert_eq!(check(pg.addr(), &pgsql, CHECK), Ok(()), "{user}");
        }
    }
    // The marker: a startup packet cut short, which the server does log.
    // Once its line is there, the lines about the checks above are too.
    let mut cut = TcpStream::connect(pg.addr()).unwrap();
    cut.write_all(&[0, 0, 0, 8]).unwrap();
    drop(cut);
    let incomplete = wait_for_lines(&pg.log, "incomplete startup packet", 1);
    let log = read(&pg.log);
    assert_eq!(incomplete.len(), 1, "only the marker's:\n{log}");
    for bad in [
        "expected password response",
        "unexpected EOF",
        "could not receive data",
        "invalid",
    ] {
        assert!(!log.contains(bad), "{bad}:\n{log}");
    }
    // The wait for the server may have met "the database system is
    // starting up" (a FATAL line, sometimes logged just after "ready to
    // accept connections"): not one of the checks'.
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("FATAL") && !l.contains("is starting up"))
            .count(),
        3,
        "the 3 rejected ones:\n{log}"
    );
    eprintln!("postgres logged:\n{log}");
}

/// SMTP: a 220 greeting (on two lines) is healthy and the check says QUIT;
/// a 554 greeting is not.
#[test]
fn smtp_greeting_and_quit() {
    let smtp = FakeSmtp::start("220-fake.example ESMTP\r\n220 ready\r\n");
    assert_eq!(check(smtp.addr, &ProtocolCheck::Smtp, CHECK), Ok(()));
    assert_eq!(*smtp.commands.lock().unwrap(), ["QUIT"]);
    let banner = ProtocolCheck::SendExpect {
        send: vec![],
        expect: b"220 ".to_vec(),
    };
    assert_eq!(check(smtp.addr, &banner, CHECK), Ok(()));

    let refusing = FakeSmtp::start("554 5.3.2 not now\r\n");
    let e = check(refusing.addr, &ProtocolCheck::Smtp, CHECK).unwrap_err();
    assert_eq!(e, "smtp: greeting \"554 5.3.2 not now\"");
}

/// The wrong protocol fails, with a reason that shows what came back.
#[test]
fn wrong_protocol_is_unhealthy_with_a_reason() {
    let nginx = nginx();
    let redis = redis();
    let http = loopback(nginx.ports[2]);
    let e = check(http, &ProtocolCheck::Redis, CHECK).unwrap_err();
    assert!(
        e.starts_with("redis: answered \"HTTP/1.1 400 Bad Request"),
        "{e}"
    );
    let e = check(http, &ProtocolCheck::Tls, CHECK).unwrap_err();
    assert!(
        e.starts_with("tls: not a TLS handshake record: \"HTTP/1.1 400"),
        "{e}"
    );
    let e = check(redis.addr(), &ProtocolCheck::Tls, CHECK).unwrap_err();
    assert!(e.starts_with("tls: "), "{e}");
    // A greeting where a PostgreSQL message was expected.
    let smtp = FakeSmtp::start("220 fake.example ESMTP\r\n");
    let pgsql = ProtocolCheck::Pgsql { user: "u".into() };
    let e = check(smtp.addr, &pgsql, CHECK).unwrap_err();
    assert!(
        e.starts_with("pgsql: not a PostgreSQL message: \"220 f\""),
        "{e}"
    );
    // Redis waits for a newline the StartupMessage does not have, and sends
    // nothing first: checks that wait for an answer time out.
    let started = Instant::now();
    let e = check(redis.addr(), &pgsql, SHORT).unwrap_err();
    assert_eq!(
        e,
        "pgsql: timed out waiting for the reply to the StartupMessage"
    );
    assert!(started.elapsed() < SHORT + SLACK);
    let started = Instant::now();
    let e = check(redis.addr(), &ProtocolCheck::Mysql { user: None }, SHORT).unwrap_err();
    assert_eq!(e, "mysql: timed out waiting for the server greeting");
    assert!(started.elapsed() < SHORT + SLACK);
    let e = check(nginx.addr(), &ProtocolCheck::Redis, CHECK).unwrap_err();
    assert!(e.starts_with("redis: "), "{e}");
}

/// A server that closes at once fails every check, quickly, saying so.
#[test]
fn a_server_that_closes_at_once_is_unhealthy() {
    let addr = closes_at_once();
    for c in all_checks() {
        let started = Instant::now();
        let e = check(addr, &c, CHECK).unwrap_err();
        assert!(e.starts_with(&format!("{}: ", c.name())), "{e}");
        assert!(
            e.contains("closed the connection") || e.contains("reset") || e.contains("Broken pipe"),
            "{e}"
        );
        assert!(started.elapsed() < Duration::from_secs(1), "{e}");
    }
}

/// A silent server fails every check at its deadline, not later.
#[test]
fn a_silent_server_costs_one_deadline() {
    let addr = silent();
    for c in all_checks() {
        let started = Instant::now();
        let e = check(addr, &c, SHORT).unwrap_err();
        let took = started.elapsed();
        assert!(e.starts_with(&format!("{}: timed out", c.name())), "{e}");
        assert!(took >= SHORT - Duration::from_millis(20), "{c:?}: {took:?}");
        assert!(took < SHORT + SLACK, "{c:?}: {took:?}");
    }
}

/// A program that is not installed fails the tests that need it, naming
/// the package to install.
#[test]
fn a_missing_program_names_its_package() {
    let e = find("rodizio-no-such-server", "rodizio-no-such-package").unwrap_err();
    assert!(
        e.contains("`rodizio-no-such-server` not found: install the Debian package `rodizio-no-such-package`"),
        "{e}"
    );
}

/// The flag's way in: `--health-check redis` (through `HealthConfig`) calls
/// a real redis-server healthy and an nginx TLS port unhealthy, with the
/// same checker the health thread runs.
#[test]
fn the_health_check_setting_runs_the_protocol_checks() {
    use rodizio::backend::Backend;
    use rodizio::health::{check as run_check, CheckKind, HealthConfig};
    let config = |kind: CheckKind| HealthConfig {
        check: kind,
        timeout: Duration::from_secs(3),
        ..HealthConfig::default()
    };
    let redis = redis().addr();
    let tls = nginx().addr();
    let backend = |addr: SocketAddr| Backend::new(addr.to_string(), vec![addr], 1);
    assert_eq!(
        run_check(&backend(redis), &config(CheckKind::Redis)),
        Ok(())
    );
    assert!(run_check(&backend(tls), &config(CheckKind::Redis)).is_err());
    assert_eq!(run_check(&backend(tls), &config(CheckKind::Tls)), Ok(()));
    let send_expect = HealthConfig {
        send: Some(b"PING\r\n".to_vec()),
        expect: Some(b"+PONG".to_vec()),
        ..config(CheckKind::SendExpect)
    };
    assert_eq!(run_check(&backend(redis), &send_expect), Ok(()));
}

// ---------------------------------------------------------------------
// `rodizio probe` against the same servers.
// ---------------------------------------------------------------------

/// What a `rodizio probe` run printed, and its exit code.
struct Probed {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Probed {
    /// The line of the check `kind`.
    fn line(&self, kind: &str) -> &str {
        self.stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(kind))
            .unwrap_or_else(|| panic!("no {kind} line:\n{}", self.stdout))
    }
}

/// Runs `rodizio probe ARGS` to its end (stopped by PID, failing the
/// test, past 30 s).
fn probe(args: &[&str]) -> Probed {
    let mut command = child::command(&[&["probe"], args].concat());
    command.env_remove("RUST_LOG");
    let out = child::run_within(&mut command, Duration::from_secs(30));
    Probed {
        code: out.code,
        stdout: out.stdout,
        stderr: out.stderr,
    }
}

/// The redis-server with a password (the one whose log no test reads):
/// redis passes with what it answered, tcp passes, the others fail, pgsql
/// at its timeout (Redis waits for a newline the StartupMessage does not
/// have); redis is suggested; exit 0. All in about one timeout, not seven.
#[test]
fn probe_finds_redis_in_a_redis_server() {
    let addr = loopback(redis().ports[1]).to_string();
    let started = Instant::now();
    let out = probe(&[&addr, "--timeout", "1s"]);
    let took = started.elapsed();
    assert_eq!(out.code, Some(0), "{}{}", out.stdout, out.stderr);
    assert!(
        out.line("redis")
            .starts_with("redis   pass  answered \"-NOAUTH Authentication required.\""),
        "{}",
        out.stdout
    );
    assert!(out.line("tcp").starts_with("tcp     pass  connected"));
    assert_eq!(
        out.line("pgsql").split(" (").next().unwrap_or_default(),
        "pgsql   fail  timed out waiting for the reply to the StartupMessage"
    );
    for kind in ["http", "tls", "smtp", "mysql"] {
        assert!(
            out.line(kind).contains("  fail  "),
            "{kind}: {}",
            out.stdout
        );
    }
    assert_eq!(
        out.stdout.lines().last(),
        Some("suggested: --health-check redis; passed: tcp, redis")
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
}

/// nginx's plain HTTP port: http passes with its status line and is the
/// kind suggested; a fake SMTP server: smtp passes with its greeting.
#[test]
fn probe_finds_http_in_nginx_and_smtp_in_a_mail_server() {
    let http = loopback(nginx().ports[2]).to_string();
    let out = probe(&[&http, "--timeout", "1s", "--path", "/"]);
    assert_eq!(out.code, Some(0), "{}{}", out.stdout, out.stderr);
    assert!(
        out.line("http")
            .starts_with("http    pass  answered \"HTTP/1.1 200 OK\""),
        "{}",
        out.stdout
    );
    assert_eq!(
        out.stdout.lines().last(),
        Some("suggested: --health-check http; passed: tcp, http")
    );

    let smtp = FakeSmtp::start("220-fake.example ESMTP\r\n220 ready\r\n");
    let out = probe(&[&smtp.addr.to_string(), "--timeout", "1s"]);
    assert_eq!(out.code, Some(0), "{}{}", out.stdout, out.stderr);
    assert!(
        out.line("smtp")
            .starts_with("smtp    pass  greeting \"220 ready\""),
        "{}",
        out.stdout
    );
    assert!(out
        .stdout
        .ends_with("suggested: --health-check smtp; passed: tcp, smtp\n"));
}

/// A port where nothing listens: every kind fails, refused, and the exit
/// code is 1. A bad address is a usage error: exit 2, one line.
#[test]
fn probe_of_a_closed_port_fails_every_kind_and_exits_1() {
    let closed = loopback(free_port()).to_string();
    let out = probe(&[&closed, "--timeout", "1s"]);
    assert_eq!(out.code, Some(1), "{}{}", out.stdout, out.stderr);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 8, "{}", out.stdout);
    for l in &lines[..7] {
        assert!(l.contains("  fail  connect: Connection refused"), "{l}");
    }
    assert_eq!(lines[7], "no check passed");

    for bad in [vec!["6379"], vec![closed.as_str(), "--timeout", "0s"]] {
        let out = probe(&bad);
        assert_eq!(out.code, Some(2), "{bad:?}: {}", out.stderr);
        assert_eq!(out.stderr.lines().count(), 1, "{bad:?}: {}", out.stderr);
        assert!(out.stdout.is_empty(), "{bad:?}: {}", out.stdout);
    }
}
