//! Giving up root, through the binary: started as root (as CI runs the
//! tests), rodizio serves as the `--user` it is given, every thread of it,
//! with only that user's group; without `--user` or `--allow-root` it
//! refuses to serve at all. A reload still reads root-only files (the
//! config file, a certbot key mode 600, the admin token) through the root
//! reader kept for it, and a renewed certificate is served. These tests
//! need root and say so when run without it.

mod child;
mod common;
mod tls_certs;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use child::{Child, BIN};
use common::{request, time_until, Demo};
use tls_certs::{connect, subject_of, Certs};

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
        let mut command = child::command(&[
            "-l",
            "127.0.0.1:0",
            "-b",
            &backend.to_string(),
            "--health-check",
            "off",
        ]);
        command.args(extra).env("RUST_LOG", "warn");
        let child = Child::start(&mut command);
        let addr = child.addr;
        Rodizio { child, addr }
    }

    /// The `Uid:`, `Gid:` and `Groups:` lines of `/proc/PID/status`, and
    /// the `Uid:` line of every thread's.
    fn ids(&self) -> (String, Vec<String>) {
        let pid = self.child.pid();
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
        self.child.signal(libc::SIGTERM);
        let status = self.child.wait_exit(WAIT);
        status.expect("rodizio did not exit after SIGTERM").code()
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
    let out = child::output(
        Command::new(BIN)
            .args([
                "-l",
                "127.0.0.1:0",
                "-b",
                "127.0.0.1:1",
                "--health-check",
                "off",
            ])
            .stdin(Stdio::null()),
    );
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

/// After the switch, a reload reads the config file through the root
/// reader kept for it: a file only root may read reloads, and the reader
/// is a process of its own that stays root while every thread serving
/// clients is nobody; it ends with the balancer.
#[test]
fn a_reload_reads_a_root_only_file_through_the_root_reader() {
    use std::os::unix::fs::PermissionsExt;
    assert_root();
    let path = std::env::temp_dir().join(format!("rodizio-user-{}.json", std::process::id()));
    std::fs::write(
        &path,
        r#"{"listen": "127.0.0.1:0", "backends": ["127.0.0.1:1"], "health_check": "off",
            "user": "nobody"}"#,
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut rodizio = Child::start(child::command(&["-c"]).arg(&path));
    let log = rodizio.stderr.clone();
    let said = |what: &str| time_until(WAIT, || log.text().contains(what)).is_some();
    assert!(said("running as user nobody"), "{}", log.text());
    let reader = reader_of(rodizio.pid());
    let status = std::fs::read_to_string(format!("/proc/{reader}/status")).unwrap();
    assert!(status.contains("Name:\trodizio-reader"), "{status}");
    assert!(status.contains("Uid:\t0\t0\t0\t0"), "{status}");
    rodizio.signal(libc::SIGHUP);
    assert!(said("reload: no change"), "{}", log.text());
    assert!(!log.text().contains("refused"), "{}", log.text());
    rodizio.signal(libc::SIGTERM);
    let ended = rodizio.wait_exit(WAIT);
    let _ = std::fs::remove_file(&path);
    assert_eq!(ended.expect("rodizio did not exit").code(), Some(0));
    assert!(
        time_until(WAIT, || !running(reader)).is_some(),
        "the root reader {reader} outlived the balancer"
    );
}

/// The root reader of the balancer `pid`: its only child process.
fn reader_of(pid: u32) -> u32 {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
    let list: Vec<u32> = children
        .split_whitespace()
        .map(|c| c.parse().unwrap())
        .collect();
    assert_eq!(list.len(), 1, "children of {pid}: {list:?}");
    list[0]
}

/// Whether process `pid` runs (neither gone nor a zombie).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
        !s.lines()
            .any(|l| l.starts_with("State:") && l.contains('Z'))
    })
}

/// certbot's renewal with root given up: the key mode 600 in a root-only
/// directory, the config file and the admin token root-only too, rodizio
/// started as root with `user nobody`. The certificate renewed in place
/// and SIGHUP: the next client is served the new one. A reload that
/// changes no TLS setting (a backend added, by the admin API) reads the
/// files again and never fails on them; a new admin token is read by it.
/// The reader is single-threaded and dies with the balancer.
#[test]
fn a_renewed_root_only_certificate_is_served_after_sighup_as_nobody() {
    use std::os::unix::fs::PermissionsExt;
    assert_root();
    let certs = Certs::new();
    let live = certs.dir.join("live");
    std::fs::create_dir(&live).unwrap();
    let mode = |path: &std::path::Path, m| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(m)).unwrap()
    };
    mode(&live, 0o700);
    let renew = |names: &[&str], serial| {
        let pair = certs.issue("site", names, serial);
        std::fs::copy(&pair.cert, live.join("fullchain.pem")).unwrap();
        std::fs::copy(&pair.key, live.join("privkey.pem")).unwrap();
        mode(&live.join("privkey.pem"), 0o600);
    };
    renew(&["one.localhost", "localhost"], 1);
    let token = live.join("token");
    std::fs::write(&token, "first\n").unwrap();
    mode(&token, 0o600);
    let demo = Demo::start("127.0.0.1:0", "A");
    let config = live.join("rodizio.json");
    let write_config = |backends: &str| {
        let text = format!(
            r#"{{"listen": "127.0.0.1:0", "backends": [{backends}], "health_check": "off",
                "user": "nobody", "admin_listen": "127.0.0.1:0",
                "admin_token_file": "{}",
                "tls_certs": [{{"cert": "{}", "key": "{}"}}]}}"#,
            token.display(),
            live.join("fullchain.pem").display(),
            live.join("privkey.pem").display()
        );
        std::fs::write(&config, text).unwrap();
        mode(&config, 0o600);
    };
    write_config(&format!("\"{}\"", demo.addr));
    let rodizio = Child::start(child::command(&["-c"]).arg(&config));
    let log = rodizio.stderr.clone();
    let said = |what: &str| time_until(WAIT, || log.text().contains(what)).is_some();
    assert!(said("running as user nobody"), "{}", log.text());
    let mut admin = None;
    time_until(WAIT, || {
        admin = child::addr_after(&log.text(), "admin API listening on ");
        admin.is_some()
    });
    let admin = admin.expect("the admin API listens");
    let subject = || subject_of(&connect(rodizio.addr, "localhost", &certs.ca()).unwrap());
    assert!(subject().contains("one.localhost"), "{}", subject());
    renew(&["two.localhost", "localhost"], 2);
    rodizio.signal(libc::SIGHUP);
    assert!(
        time_until(WAIT, || subject().contains("two.localhost")).is_some(),
        "the renewed certificate was not served: {}",
        log.text()
    );
    // A reload that changes no TLS setting: a backend more, by the API.
    write_config(&format!("\"{}\", \"127.0.0.1:1\"", demo.addr));
    std::fs::write(&token, "second\n").unwrap();
    let reload = |token: &str| {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect_timeout(&admin, WAIT).unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        s.set_write_timeout(Some(WAIT)).unwrap();
        write!(
            s,
            "POST /reload HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {token}\r\n\
             Connection: close\r\nContent-Length: 0\r\n\r\n"
        )
        .unwrap();
        let mut reply = String::new();
        let _ = s.read_to_string(&mut reply);
        reply
    };
    let reply = reload("first");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}\n{}", log.text());
    assert!(said("+1 backend"), "{}", log.text());
    assert!(!log.text().contains("refused"), "{}", log.text());
    // The token file was read again: the old token no longer opens it.
    assert!(reload("first").starts_with("HTTP/1.1 401"));
    assert!(reload("second").starts_with("HTTP/1.1 200"));
    // The reader was forked before any thread: it has one. Killed with
    // the balancer (SIGKILL, no drain), it goes too.
    let reader = reader_of(rodizio.pid());
    let threads = std::fs::read_dir(format!("/proc/{reader}/task"))
        .unwrap()
        .count();
    assert_eq!(threads, 1, "the root reader has {threads} threads");
    drop(rodizio);
    assert!(
        time_until(WAIT, || !running(reader)).is_some(),
        "the root reader {reader} outlived the balancer killed"
    );
}

/// A user this host does not know is refused before anything is bound.
#[test]
fn an_unknown_user_is_refused_in_one_line() {
    let out = child::output(
        Command::new(BIN)
            .args([
                "-l",
                "127.0.0.1:0",
                "-b",
                "127.0.0.1:1",
                "--user",
                "no-such-user-here",
            ])
            .stdin(Stdio::null()),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        "rodizio: invalid configuration: --user no-such-user-here: no such user on this host"
    );
}
