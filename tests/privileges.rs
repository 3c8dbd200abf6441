//! Giving up root, through the binary: started as root (as CI runs the
//! tests), rodizio serves as the `--user` it is given, every thread of it,
//! with only that user's group; without `--user` or `--allow-root` it
//! refuses to serve at all. These tests need root and say so when run
//! without it.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{request, time_until, Demo};

const BIN: &str = env!("CARGO_BIN_EXE_rodizio");
const WAIT: Duration = Duration::from_secs(10);

/// Fails the test at once unless it runs as root: what it checks is what
/// happens to a process started as root.
fn assert_root() {
    // SAFETY: reads the effective user id.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this test starts rodizio as root and needs root itself (CI runs as root): \
         run it with sudo"
    );
}

/// A user's id and group id, from the user database.
fn ids_of(name: &str) -> (u32, u32) {
    let cname = std::ffi::CString::new(name).unwrap();
    // SAFETY: getpwnam returns a pointer into static storage or null; read
    // at once, on this thread.
    let entry = unsafe { libc::getpwnam(cname.as_ptr()) };
    assert!(!entry.is_null(), "no user {name} on this host");
    // SAFETY: not null, just checked.
    unsafe { ((*entry).pw_uid, (*entry).pw_gid) }
}

/// A group's id.
fn gid_of(name: &str) -> u32 {
    let cname = std::ffi::CString::new(name).unwrap();
    // SAFETY: as in ids_of, with getgrnam.
    let entry = unsafe { libc::getgrnam(cname.as_ptr()) };
    assert!(!entry.is_null(), "no group {name} on this host");
    // SAFETY: not null, just checked.
    unsafe { (*entry).gr_gid }
}

/// rodizio in front of `backend` with `extra` flags; killed by its PID on
/// drop if still running.
struct Rodizio {
    child: Child,
    addr: SocketAddr,
}

impl Rodizio {
    fn start(backend: SocketAddr, extra: &[&str]) -> Rodizio {
        let mut child = Command::new(BIN)
            .args(["-l", "127.0.0.1:0", "-b", &backend.to_string()])
            .args(["--health-check", "off"])
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start rodizio");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = crossbeam_channel::bounded(1);
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(WAIT).expect("the listening line");
        let addr = line
            .split(['(', ')'])
            .nth(1)
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no address in {line:?}"));
        Rodizio { child, addr }
    }

    /// The `Uid:`, `Gid:` and `Groups:` lines of `/proc/PID/status`, and
    /// the `Uid:` line of every thread's.
    fn ids(&self) -> (String, Vec<String>) {
        let pid = self.child.id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let lines: Vec<&str> = status
            .lines()
            .filter(|l| l.starts_with("Uid:") || l.starts_with("Gid:") || l.starts_with("Groups:"))
            .collect();
        let mut threads = Vec::new();
        for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
            let status = std::fs::read_to_string(task.unwrap().path().join("status")).unwrap();
            let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
            threads.push(uid.split_whitespace().collect::<Vec<_>>().join(" "));
        }
        let words = lines
            .iter()
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect::<Vec<_>>()
            .join("\n");
        (words, threads)
    }

    fn stop(mut self) -> Option<i32> {
        // SAFETY: kill(2) on our own child's PID.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let ended = time_until(WAIT, || matches!(self.child.try_wait(), Ok(Some(_))));
        assert!(ended.is_some(), "rodizio did not exit after SIGTERM");
        self.child.wait().unwrap().code()
    }
}

impl Drop for Rodizio {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// With `--user nobody`, once it answers, the process and each of its
/// threads (the signal thread and the workers started before and after the
/// switch) run as nobody: real, effective, saved and filesystem ids, with
/// nobody's group as the only one.
#[test]
fn root_is_given_up_for_the_user_named() {
    assert_root();
    let (uid, gid) = ids_of("nobody");
    let demo = Demo::start("127.0.0.1:0", "A");
    let rodizio = Rodizio::start(demo.addr, &["--user", "nobody"]);
    assert_eq!(request(rodizio.addr).expect("served"), "A");
    let (ids, threads) = rodizio.ids();
    assert_eq!(
        ids,
        format!("Uid: {uid} {uid} {uid} {uid}\nGid: {gid} {gid} {gid} {gid}\nGroups: {gid}")
    );
    assert!(threads.len() > 1, "{threads:?}");
    for thread in &threads {
        assert_eq!(*thread, format!("Uid: {uid} {uid} {uid} {uid}"));
    }
    assert_eq!(rodizio.stop(), Some(0));
}

/// `--group` gives another group than the user's own.
#[test]
fn the_group_named_replaces_the_users_own() {
    assert_root();
    let (uid, _) = ids_of("nobody");
    let gid = gid_of("daemon");
    let demo = Demo::start("127.0.0.1:0", "A");
    let rodizio = Rodizio::start(demo.addr, &["--user", "nobody", "--group", "daemon"]);
    assert_eq!(request(rodizio.addr).expect("served"), "A");
    let (ids, _) = rodizio.ids();
    assert_eq!(
        ids,
        format!("Uid: {uid} {uid} {uid} {uid}\nGid: {gid} {gid} {gid} {gid}\nGroups: {gid}")
    );
    assert_eq!(rodizio.stop(), Some(0));
}

/// Started as root with neither `--user` nor `--allow-root`: one line
/// naming both, exit 2, before anything is bound or asked (standard
/// output, where the prompt and the listening line go, stays empty).
#[test]
fn root_with_no_user_is_refused() {
    assert_root();
    let out = Command::new(BIN)
        .args([
            "-l",
            "127.0.0.1:0",
            "-b",
            "127.0.0.1:1",
            "--health-check",
            "off",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run rodizio");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("--user") && stderr.contains("--allow-root"),
        "{stderr}"
    );
    assert!(
        out.stdout.is_empty(),
        "it said it listens: {:?}",
        out.stdout
    );
}

/// After the switch, a reload reads the config file as the new user: a
/// file only root may read fails the reload (and changes nothing), the
/// same file made readable reloads.
#[test]
fn a_reload_reads_the_file_as_the_new_user() {
    use std::os::unix::fs::PermissionsExt;
    assert_root();
    let path = std::env::temp_dir().join(format!("rodizio-user-{}.json", std::process::id()));
    std::fs::write(
        &path,
        r#"{"listen": "127.0.0.1:0", "backends": ["127.0.0.1:1"], "health_check": "off",
            "user": "nobody"}"#,
    )
    .unwrap();
    let mode = |m| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(m)).unwrap();
    mode(0o600);
    let mut child = Command::new(BIN)
        .arg("-c")
        .arg(&path)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rodizio");
    let out = common::collect(child.stdout.take().unwrap());
    let log = common::collect(child.stderr.take().unwrap());
    let said = |what: &str| time_until(WAIT, || log.text().contains(what)).is_some();
    let signal = |signo| {
        // SAFETY: kill(2) on our own child's PID.
        unsafe { libc::kill(child.id() as libc::pid_t, signo) };
    };
    // The listening line comes once SIGHUP reloads.
    let listening = time_until(WAIT, || out.text().contains("listening on port"));
    assert!(listening.is_some(), "{}", log.text());
    // Its own pipe, read by its own thread: it may come a little after.
    assert!(said("running as user nobody"), "{}", log.text());
    signal(libc::SIGHUP);
    assert!(said("Permission denied"), "{}", log.text());
    assert!(log
        .text()
        .contains("reload refused, the running settings stay"));
    mode(0o644);
    signal(libc::SIGHUP);
    assert!(said("reload: no change"), "{}", log.text());
    signal(libc::SIGTERM);
    let ended = time_until(WAIT, || matches!(child.try_wait(), Ok(Some(_))));
    let _ = std::fs::remove_file(&path);
    assert!(ended.is_some(), "rodizio did not exit");
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

/// A user this host does not know is refused before anything is bound.
#[test]
fn an_unknown_user_is_refused_in_one_line() {
    let out = Command::new(BIN)
        .args([
            "-l",
            "127.0.0.1:0",
            "-b",
            "127.0.0.1:1",
            "--user",
            "no-such-user-here",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run rodizio");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        "rodizio: invalid configuration: --user no-such-user-here: no such user on this host"
    );
}
