//! The config file: hostile and malformed files, at start-up and on reload.
//!
//! Each file is given to `rodizio check-config` (or `-c`) as a child
//! process with a deadline and a cap on its address space, so a reader
//! that hangs or grows fails the test instead of the machine; each child is
//! killed by its PID if it outlives the deadline. The reload tests run a
//! balancer with a good file, replace it with each bad one, send SIGHUP,
//! and check that the old settings stay while traffic flows.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::child::{self, Child, Ended, Scratch};
use crate::common::{connect, limit_in_child, wait_for, TestBackend};

/// Longest a refusal may take: reading and refusing a file is quick.
const WAIT: Duration = Duration::from_secs(10);
/// The child's address space: far above what rodizio needs to read a
/// config file, far below what an unbounded read of a device would take.
const ADDRESS_SPACE: u64 = 512 << 20;

/// Runs `rodizio ARGS` to its end with the address space capped; kills it
/// by its PID and fails if it is still running after [`WAIT`].
fn run(args: &[&str]) -> Ended {
    let mut command = child::command(args);
    command.env("RUST_LOG", "warn");
    limit_in_child(&mut command, libc::RLIMIT_AS, ADDRESS_SPACE);
    child::run_within(&mut command, WAIT)
}

/// `rodizio check-config PATH`: it must exit 2 with one line naming the
/// file; that line.
pub(crate) fn refused(path: &Path) -> String {
    let path = path.to_str().unwrap();
    let out = run(&["check-config", path]);
    assert_eq!(out.status.code(), Some(2), "{path}: {}", out.stderr);
    assert_eq!(out.stderr.lines().count(), 1, "{path}: {}", out.stderr);
    assert!(
        out.stderr.starts_with(&format!("rodizio: {path}: ")),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains('\0'), "{:?}", out.stderr);
    out.stderr
}

/// A file far over the size cap is refused at once, in bounded memory.
#[test]
fn a_huge_file_is_refused_without_reading_it_all() {
    let dir = Scratch::new("hostile-config");
    let mut spaces = vec![b' '; 50 << 20];
    spaces[0] = b'{';
    let path = dir.file("huge.json", &spaces);
    let started = Instant::now();
    let line = refused(&path);
    assert!(line.contains("is larger than 1024 KiB"), "{line}");
    assert!(started.elapsed() < WAIT, "{:?}", started.elapsed());
}

/// A string or a key of most of a megabyte is refused with a short line.
#[test]
fn a_huge_string_is_echoed_short() {
    let dir = Scratch::new("hostile-config");
    let long = "a".repeat(900 << 10);
    for text in [
        format!("{{\"{long}\": 1}}"),
        format!("{{\"workers\": \"{long}\"}}"),
        format!("{{\"backends\": [\"{long}\"]}}"),
        format!("{{\"listen\": \"{long}\"}}"),
    ] {
        let line = refused(&dir.file("long.json", text.as_bytes()));
        assert!(line.len() < 400, "{} bytes: {}", line.len(), &line[..400]);
    }
}

/// Nesting 100,000 deep is a clear error, not a stack overflow.
#[test]
fn deep_nesting_is_an_error_not_a_crash() {
    let dir = Scratch::new("hostile-config");
    let deep = 100_000;
    for text in [
        "[".repeat(deep),
        format!("{{\"backends\": {}", "[".repeat(deep)),
        format!("{{\"workers\": {}", "{\"a\":".repeat(deep)),
    ] {
        refused(&dir.file("deep.json", text.as_bytes()));
    }
    // A value read whole before it is judged meets serde_json's depth
    // limit: named as such.
    let text = format!("{{\"fin_timeout\": {}", "[".repeat(deep));
    let line = refused(&dir.file("deep.json", text.as_bytes()));
    assert!(line.contains("nested too deeply"), "{line}");
}

/// NUL bytes and invalid UTF-8, anywhere, are one line each.
#[test]
fn nul_bytes_and_invalid_utf8_are_refused() {
    let dir = Scratch::new("hostile-config");
    let cases: [&[u8]; 5] = [
        b"{\"backends\": [\"127.0.0.1:1\"]}\0",
        b"\0{\"backends\": [\"127.0.0.1:1\"]}",
        b"{\"health_path\": \"/\0\", \"backends\": [\"127.0.0.1:1\"]}",
        b"{\"backends\": [\"127.0.0.1:1\xff\"]}",
        b"\xfe\xff{}",
    ];
    for bytes in cases {
        let line = refused(&dir.file("bad.json", bytes));
        assert!(line.len() < 300, "{line}");
    }
    let line = refused(&dir.file("bad.json", b"{\"backends\": [\"\xc3(\"]}"));
    assert!(line.contains("not UTF-8"), "{line}");
}

/// A byte order mark is skipped; a second one, invisible, is named.
#[test]
fn byte_order_marks() {
    let dir = Scratch::new("hostile-config");
    let good = "\u{feff}{\"backends\": [\"127.0.0.1:1\"]}";
    let out = run(&[
        "check-config",
        dir.file("bom.json", good.as_bytes()).to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    let twice = format!("\u{feff}{good}");
    let line = refused(&dir.file("bom2.json", twice.as_bytes()));
    assert!(line.contains("U+FEFF"), "{line}");
}

/// A key written twice, and unknown keys, are named.
#[test]
fn duplicate_and_unknown_keys_are_named() {
    let dir = Scratch::new("hostile-config");
    let line = refused(&dir.file(
        "dup.json",
        b"{\"backends\": [\"127.0.0.1:1\"], \"workers\": 4, \"workers\": 8}",
    ));
    assert!(line.contains("`workers` is written twice"), "{line}");
    let line = refused(&dir.file(
        "unknown.json",
        b"{\"backends\": [\"127.0.0.1:1\"], \"\": 1}",
    ));
    assert!(line.contains("unknown key"), "{line}");
}

/// Every numeric key, given numbers far too big, negative, fractional or
/// huge in exponent notation: one short line naming the key, no Rust type.
#[test]
fn huge_and_negative_numbers_for_every_numeric_key() {
    let dir = Scratch::new("hostile-config");
    let keys = [
        "workers",
        "queue_capacity",
        "backlog",
        "fall",
        "rise",
        "passive_failures",
        "rate_limit_max_clients",
        "rate_limit_ipv6_prefix",
        "listen_port",
        "thread_stack",
        "buffer_size",
        "connect_timeout",
        "idle_timeout",
        "drain_timeout",
        "health_interval",
        "health_timeout",
        "queue_timeout",
        "fin_timeout",
        "tcp_keepalive",
        "tcp_user_timeout",
        "worker_idle_timeout",
    ];
    let values = [
        "-1",
        "-1e300",
        "1e300",
        "1.5e10",
        "18446744073709551616",
        "99999999999999999999999999999999",
        "-9223372036854775809",
    ];
    for key in keys {
        for value in values {
            let text = format!(
                "{{\"backends\": [\"127.0.0.1:1\"], \"rate_limit\": \"10/1s\", \"{key}\": {value}}}"
            );
            let line = refused(&dir.file("n.json", text.as_bytes()));
            assert!(line.contains(&format!("`{key}`")), "{line}");
            assert!(line.len() < 250, "{key}={value}: {line}");
            for rust in ["usize", "u64", "u32", "u16", "u8", "i32", "i64", "f64"] {
                assert!(!line.contains(rust), "{key}={value}: {line}");
            }
        }
    }
    for (key, value) in [
        ("port", "-1"),
        ("port", "70000"),
        ("weight", "1e300"),
        ("weight", "-5"),
    ] {
        let text = format!(
            "{{\"backends\": [{{\"host\": \"127.0.0.1\", \"port\": 1, \"{key}\": {value}}}]}}"
        )
        .replace("\"port\": 1, \"port\"", "\"port\"");
        let line = refused(&dir.file("n.json", text.as_bytes()));
        assert!(line.contains(&format!("backends[0].{key}")), "{line}");
        assert!(!line.contains("u16") && !line.contains("u32"), "{line}");
    }
}

/// Paths that are not a readable regular file: a directory, a FIFO that
/// nobody writes to, devices that never end, a missing file. Each is
/// refused at once; none hangs or grows.
#[test]
fn paths_that_are_not_a_regular_file_are_refused_at_once() {
    let dir = Scratch::new("hostile-config");
    let fifo = dir.fifo("fifo.json");
    let missing = dir.path("missing.json");
    for (path, why) in [
        (dir.dir().to_path_buf(), "Is a directory"),
        (fifo, "not a regular file"),
        (PathBuf::from("/dev/zero"), "not a regular file"),
        (PathBuf::from("/dev/urandom"), "not a regular file"),
        (missing, "No such file or directory"),
    ] {
        let line = refused(&path);
        assert!(line.contains(why), "{line}");
    }
    // Through -c as well, before anything listens.
    let out = run(&["-c", "/dev/zero", "-l", "127.0.0.1:0"]);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
}

/// The files a setting names (a certificate, a key, `tls_client_ca`,
/// `tls_client_crl`, `backend_tls_ca`, the admin token) given as a FIFO,
/// `/dev/zero`, `/dev/urandom` or a directory: `check-config` and a start
/// refuse each at once in one line naming the key and the path, never
/// blocking on the FIFO nor reading the device, under the address-space
/// cap. A reload of a running balancer whose certificate path became a
/// FIFO is refused the same way and the balancer goes on serving.
#[test]
fn files_a_setting_names_that_are_not_regular_are_refused_at_once() {
    let certs = crate::tls_certs::Certs::new();
    let pair = certs.issue("a", &["localhost"], 1);
    let dir = Scratch::new("hostile-files");
    let fifo = dir.fifo("fifo.pem");
    let ca = certs.ca();
    let (cert, key) = (pair.cert.display(), pair.key.display());
    for bad in [
        fifo.clone(),
        PathBuf::from("/dev/zero"),
        PathBuf::from("/dev/urandom"),
        dir.dir().to_path_buf(),
    ] {
        let b = bad.display();
        let why = if bad.is_dir() {
            "directory"
        } else {
            "not a regular file"
        };
        for (key_name, settings) in [
            (
                "tls_certs",
                format!(r#""tls_certs": [{{"cert": "{b}", "key": "{key}"}}]"#),
            ),
            (
                "tls_certs",
                format!(r#""tls_certs": [{{"cert": "{cert}", "key": "{b}"}}]"#),
            ),
            (
                "tls_client_ca",
                format!(r#""tls_certs": [{}], "tls_client_ca": "{b}""#, pair.json()),
            ),
            (
                "tls_client_crl",
                format!(
                    r#""tls_certs": [{}], "tls_client_ca": "{}", "tls_client_crl": "{b}""#,
                    pair.json(),
                    ca.display()
                ),
            ),
            (
                "backend_tls_ca",
                format!(r#""backend_tls": true, "backend_tls_ca": "{b}""#),
            ),
            (
                "admin_token_file",
                format!(r#""admin_listen": "127.0.0.1:0", "admin_token_file": "{b}""#),
            ),
        ] {
            let text =
                format!(r#"{{"listen": "127.0.0.1:0", "backends": ["127.0.0.1:1"], {settings}}}"#);
            let path = dir.file("files.json", text.as_bytes());
            let line = refused(&path);
            assert!(
                line.contains(&format!("`{key_name}`")) && line.contains(why),
                "{settings}: {line}"
            );
            let started = run(&["--allow-root", "-c", path.to_str().unwrap()]);
            assert_eq!(started.status.code(), Some(2), "{}", started.stderr);
        }
    }
    // A running balancer: the certificate's path becomes a FIFO, SIGHUP.
    let backend = TestBackend::echo();
    let served = dir.path("served.pem");
    std::fs::copy(&pair.cert, &served).unwrap();
    let text = format!(
        r#"{{"listen": "127.0.0.1:0", "backends": ["{}"],
            "tls_certs": [{{"cert": "{}", "key": "{key}"}}]}}"#,
        backend.addr(),
        served.display()
    );
    let path = dir.file("running.json", text.as_bytes());
    let mut balancer = start(&path);
    std::fs::remove_file(&served).unwrap();
    let fifo_again = dir.fifo("served.pem");
    assert_eq!(fifo_again, served);
    let line = reload_refused(&balancer, 1);
    assert!(line.contains("not a regular file"), "{line}");
    // The reload lock was not held by a blocked read: the next one runs.
    let line = reload_refused(&balancer, 2);
    assert!(line.contains("not a regular file"), "{line}");
    assert!(balancer.alive(), "{}", balancer.log());
    // The same with flags alone (no config file): the reload reads the
    // certificate the flag names, refuses the FIFO, and serves on.
    let flagged = dir.path("flagged.pem");
    std::fs::copy(&pair.cert, &flagged).unwrap();
    let b = backend.addr().to_string();
    let tls = format!("{},{key}", flagged.display());
    let mut command = child::command(&["--allow-root", "-l", "127.0.0.1:0", "-b", &b]);
    command.args(["--tls-cert", &tls]);
    let mut by_flags = Child::start(&mut command);
    std::fs::remove_file(&flagged).unwrap();
    assert_eq!(dir.fifo("flagged.pem"), flagged);
    for n in 1..=2 {
        let line = reload_refused(&by_flags, n);
        assert!(line.contains("not a regular file"), "{line}");
    }
    assert!(by_flags.alive(), "{}", by_flags.log());
}

/// A balancer started with a good file.
fn start(config: &Path) -> Child {
    let mut command = child::command(&["--allow-root", "-c", config.to_str().unwrap()]);
    Child::start(&mut command)
}

/// SIGHUP, then waits for the reload's `n`th refusal; that line.
fn reload_refused(balancer: &Child, n: usize) -> String {
    balancer.signal(libc::SIGHUP);
    let refusals = || {
        balancer
            .log()
            .lines()
            .filter(|l| l.contains("reload refused"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert!(
        wait_for(WAIT, || refusals().len() >= n),
        "no refusal {n} in time: {}",
        balancer.log()
    );
    refusals()[n - 1].clone()
}

/// SIGHUP, then waits until the log says `said` (the reload taken).
fn reload_taken(balancer: &Child, said: &str) {
    balancer.signal(libc::SIGHUP);
    assert!(
        wait_for(WAIT, || balancer.stderr.text().contains(said)),
        "no {said:?} in time: {}",
        balancer.stderr.text()
    );
}

/// Sends a few bytes through the balancer and reads them back.
fn echo_through(addr: SocketAddr) {
    let mut client = connect(addr).expect("connect to the balancer");
    client.write_all(b"still here").unwrap();
    let mut got = [0u8; 10];
    client.read_exact(&mut got).expect("the echo");
    assert_eq!(&got, b"still here");
}

/// Each bad file on SIGHUP: refused in one log line, the old settings
/// kept, traffic served throughout; the FIFO and the devices do not block
/// the reload, so the next one still runs.
#[test]
fn a_reload_with_each_bad_file_keeps_the_old_settings() {
    let dir = Scratch::new("hostile-config");
    let backend = TestBackend::echo();
    let good = format!(
        "{{\"listen\": \"127.0.0.1:0\", \"backends\": [\"{}\"]}}",
        backend.addr()
    );
    let path = dir.file("rodizio.json", good.as_bytes());
    let balancer = start(&path);
    echo_through(balancer.addr);
    // Clients all along, bounded in count and time.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let traffic = {
        let (stop, addr) = (stop.clone(), balancer.addr);
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut served = 0;
            while !stop.load(Ordering::SeqCst) && served < 100_000 && Instant::now() < deadline {
                echo_through(addr);
                served += 1;
            }
            served
        })
    };
    let duplicate = format!(
        "{{\"listen\": \"127.0.0.1:0\", \"backends\": [\"{0}\", \"localhost:{1}\"]}}",
        backend.addr(),
        backend.addr().port()
    );
    let mut huge = vec![b' '; 5 << 20];
    huge[0] = b'{';
    let bad: Vec<(&str, Vec<u8>)> = vec![
        ("", Vec::new()),
        ("syntax", b"{\"backends\": [".to_vec()),
        ("deep", "[".repeat(100_000).into_bytes()),
        ("nul", b"{\"workers\": 4}\0".to_vec()),
        ("utf8", b"{\"health_path\": \"\xff\"}".to_vec()),
        (
            "numbers",
            b"{\"backends\": [\"127.0.0.1:1\"], \"workers\": -1}".to_vec(),
        ),
        ("duplicate", duplicate.into_bytes()),
        ("huge", huge),
    ];
    let mut n = 0;
    for (what, bytes) in bad {
        std::fs::write(&path, &bytes).unwrap();
        n += 1;
        let line = reload_refused(&balancer, n);
        assert!(line.len() < 400, "{what}: {line}");
        if what == "duplicate" {
            assert!(line.contains("names one server twice"), "{line}");
        }
        echo_through(balancer.addr);
    }
    // Paths that are not a regular file: swapped in under the same name.
    std::fs::remove_file(&path).unwrap();
    let fifo = dir.fifo("rodizio.json");
    n += 1;
    assert!(reload_refused(&balancer, n).contains("not a regular file"));
    echo_through(balancer.addr);
    std::fs::remove_file(&fifo).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
    n += 1;
    assert!(reload_refused(&balancer, n).contains("not a regular file"));
    echo_through(balancer.addr);
    std::fs::remove_file(&path).unwrap();
    std::fs::create_dir(&path).unwrap();
    n += 1;
    assert!(reload_refused(&balancer, n).contains("Is a directory"));
    echo_through(balancer.addr);
    // The good file back: the reload is taken, with nothing to change.
    std::fs::remove_dir(&path).unwrap();
    std::fs::write(&path, good.as_bytes()).unwrap();
    reload_taken(&balancer, "reload: no change");
    echo_through(balancer.addr);
    stop.store(true, Ordering::SeqCst);
    let served = traffic.join().expect("every client served");
    assert!(served > 0);
}

/// The three-way switches (`kernel_relay`, `yield_before_poll`) read by
/// their own parser: odd, huge, nested and non-text values in the file, on
/// the flag and on a reload are one short line naming the key; exit 2 at
/// start, the old settings kept on a reload.
#[test]
fn the_switches_refuse_odd_huge_and_nested_values_in_one_line() {
    let dir = Scratch::new("hostile-switch");
    let long = "o".repeat(900 << 10);
    let odd = [
        format!("\"{long}\""),
        "[".repeat(100_000),
        "\"on\\u0000\"".to_string(),
        "\"ON\"".to_string(),
        "\"auto on\"".to_string(),
        "2".to_string(),
        "\"\\u001b[2J\"".to_string(),
        "{\"on\": true}".to_string(),
    ];
    for key in ["kernel_relay", "yield_before_poll"] {
        for value in &odd {
            let text = format!("{{\"backends\": [\"127.0.0.1:9\"], \"{key}\": {value}}}");
            let line = refused(&dir.file("switch.json", text.as_bytes()));
            assert!(line.len() < 400, "{key}: {} bytes: {line:.400}", line.len());
            assert!(!line.contains('\u{1b}'), "{key}: {line:?}");
            let named = line.contains(key) || line.contains("nested too deeply");
            assert!(named, "{key} = {:.40}: {line}", value);
        }
        // The flag: the same parser, the same short line.
        let flag = format!("--{}", key.replace('_', "-"));
        for value in [
            format!("={}", "o".repeat(100 << 10)),
            "=".to_string(),
            "=of".to_string(),
        ] {
            let arg = format!("{flag}{value}");
            let out = run(&[
                "--allow-root",
                "-l",
                "127.0.0.1:0",
                "-b",
                "127.0.0.1:9",
                &arg,
            ]);
            assert_eq!(
                out.status.code(),
                Some(2),
                "{flag}{value:.20}: {}",
                out.stderr
            );
            assert!(out.stderr.len() < 600, "{flag}: {} bytes", out.stderr.len());
            assert!(out.stderr.contains("use off, on or auto"), "{}", out.stderr);
        }
        // Not text at all: refused, not a crash.
        let mut arg = flag.clone().into_bytes();
        arg.extend_from_slice(b"=\xff\xfe");
        let arg: std::ffi::OsString = std::os::unix::ffi::OsStringExt::from_vec(arg);
        let mut command =
            child::command(&["--allow-root", "-l", "127.0.0.1:0", "-b", "127.0.0.1:9"]);
        let out = child::run_within(command.arg(arg), WAIT);
        assert_eq!(out.status.code(), Some(2), "{flag}: {}", out.stderr);
        assert!(out.stderr.len() < 600, "{flag}: {}", out.stderr);
    }
    // A value judged after the file is read (the user looked up on the
    // host) echoes its control characters escaped too.
    let text = "{\"backends\": [\"127.0.0.1:9\"], \"user\": \"\\u001b[2J\\u0007\"}";
    let line = refused(&dir.file("user.json", text.as_bytes()));
    assert!(line.contains("\\u001b[2J\\u0007"), "{line:?}");
    assert!(!line.contains(['\u{1b}', '\u{7}']), "{line:?}");
    // A health check's path would carry them into its request line.
    let text = "{\"backends\": [\"127.0.0.1:9\"], \"health_path\": \"/up\\u001b[2J\"}";
    let line = refused(&dir.file("path.json", text.as_bytes()));
    assert!(line.contains("control characters"), "{line:?}");
    // On a reload: each odd value refused in one line, the old settings
    // serving; then a good value is taken.
    let backend = TestBackend::echo();
    let good = |extra: &str| {
        format!(
            "{{\"listen\": \"127.0.0.1:0\", \"backends\": [\"{}\"]{extra}}}",
            backend.addr()
        )
    };
    let path = dir.file("rodizio.json", good("").as_bytes());
    let mut balancer = start(&path);
    echo_through(balancer.addr);
    let mut n = 0;
    for key in ["kernel_relay", "yield_before_poll"] {
        for value in &odd {
            std::fs::write(&path, good(&format!(", \"{key}\": {value}"))).unwrap();
            n += 1;
            let line = reload_refused(&balancer, n);
            assert!(line.len() < 400, "{key}: {line}");
            assert!(!line.contains('\u{1b}'), "{key}: {line:?}");
            echo_through(balancer.addr);
        }
    }
    std::fs::write(&path, good(", \"yield_before_poll\": \"auto\"")).unwrap();
    reload_taken(&balancer, "reload: yield_before_poll off → auto");
    echo_through(balancer.addr);
    assert!(balancer.alive(), "{}", balancer.log());
}
