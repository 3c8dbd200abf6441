//! The config file through the real binary: `-c FILE`, one line and exit 2
//! for each kind of bad file, `check-config`, flags over the file, the
//! seed-style keys, settings checked before the prompt asks anything, and
//! `"mode": "backend"`.

mod child;
mod common;
mod tls_certs;

use std::net::TcpListener;
use std::time::Duration;

use child::{Child, Ended, Scratch};
use common::{http_get, wait_for};

const WAIT: Duration = Duration::from_secs(10);

/// A config file in a scratch directory of its own, removed on drop.
struct TempFile {
    /// Kept for its drop.
    _dir: Scratch,
    path: String,
}

impl TempFile {
    fn new(text: &str) -> TempFile {
        let dir = Scratch::new("config");
        let path = dir.file("rodizio.json", text);
        let path = path.to_str().unwrap().to_string();
        TempFile { _dir: dir, path }
    }

    fn path(&self) -> &str {
        &self.path
    }
}

/// Runs `rodizio ARGS` with `input` on standard input, killing it by its
/// PID (and failing the test) if it has not exited within [`WAIT`].
fn run(args: &[&str], input: &[u8]) -> Ended {
    // The tests run as root on CI; check-config's listing stays the file's.
    let root: &[&str] = if args.contains(&"check-config") {
        &[]
    } else {
        &["--allow-root"]
    };
    let mut command = child::command(&[root, args].concat());
    command.env("RUST_LOG", "warn");
    child::run_fed(&mut command, input.to_vec(), WAIT)
}

/// Runs `rodizio -c FILE` on `text` and checks it exits 2 with exactly one
/// line that names the file, asking nothing; returns that line.
fn refused(text: &str) -> String {
    let file = TempFile::new(text);
    let out = run(&["-c", file.path()], b"");
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert_eq!(out.stdout, "", "nothing asked, nothing printed");
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    let line = out.stderr.trim_end().to_string();
    let prefix = format!("rodizio: {}: ", file.path());
    assert!(line.starts_with(&prefix), "{line}");
    line[prefix.len()..].to_string()
}

/// An unknown key is named with its line and column, and with the closest
/// known key when it is a typo.
#[test]
fn an_unknown_key_exits_2_naming_it() {
    let line = refused("{\n  \"backends\": [\"127.0.0.1:1\"],\n  \"worker\": 4\n}");
    assert_eq!(
        line,
        "line 3, column 10: unknown key `worker` (did you mean `workers`?)"
    );
    let line = refused("{\"backends\": [{\"host\": \"127.0.0.1\", \"prot\": 1}]}");
    assert!(
        line.contains("unknown key `backends[0].prot` (did you mean `port`?)"),
        "{line}"
    );
}

/// A value of the wrong type names the key and where it is.
#[test]
fn a_wrong_type_exits_2_naming_the_key() {
    let line = refused("{\"backends\": [\"127.0.0.1:1\"],\n \"splice\": \"yes\"}");
    assert!(line.starts_with("line 2, column"), "{line}");
    assert!(
        line.contains("`splice`: invalid type: string \"yes\""),
        "{line}"
    );
}

/// Values out of range or that do not parse are worded as the file's key,
/// not as the flag.
#[test]
fn a_bad_value_exits_2_naming_the_key_not_the_flag() {
    let line = refused("{\"backends\": [\"127.0.0.1:1\"],\n \"workers\": 0}");
    assert_eq!(line, "line 2, column 2: `workers` must be 1..65536, got 0");
    let line = refused("{\"backends\": [\"127.0.0.1:1\"],\n \"connect_timeout\": \"3 parsecs\"}");
    assert!(line.starts_with("line 2, column"), "{line}");
    assert!(line.contains("`connect_timeout`: '3 parsecs'"), "{line}");
    assert!(!line.contains("--"), "{line}");
    let line = refused("{\"backends\": [\"127.0.0.1:99999\"]}");
    assert!(
        line.contains("`backends[0]`: '127.0.0.1:99999': port must be 1..65535"),
        "{line}"
    );
}

/// A file without backends (and no `-b`) is refused; the prompt is for
/// when there is no file.
#[test]
fn missing_backends_exits_2() {
    let line = refused("{\n  \"workers\": 4\n}");
    assert_eq!(
        line,
        "line 1, column 1: no backends: list them under `backends` (or `backend_servers`)"
    );
}

/// A JSON syntax error gives its line and column.
#[test]
fn a_syntax_error_exits_2_with_line_and_column() {
    let line = refused("{\n  \"workers\": 4,\n}");
    assert_eq!(line, "line 3, column 1: JSON syntax error: trailing comma");
    let line = refused("{\"workers\" 4}");
    assert!(
        line.starts_with("line 1, column 12: JSON syntax error"),
        "{line}"
    );
}

/// A file that cannot be read is named with the OS error.
#[test]
fn an_unreadable_file_exits_2_naming_it() {
    let out = run(&["-c", "/nonexistent/rodizio.json"], b"");
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        out.stderr.trim_end(),
        "rodizio: /nonexistent/rodizio.json: cannot be read: No such file or directory (os error 2)"
    );
    let dir = std::env::temp_dir();
    let out = run(&["check-config", dir.to_str().unwrap()], b"");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        out.stderr.contains("cannot be read: Is a directory"),
        "{}",
        out.stderr
    );
}

/// `--workers 0` is reported before the prompt asks its first question,
/// even with nothing on standard input.
#[test]
fn a_bad_flag_value_exits_2_before_any_question() {
    let out = run(&["--workers", "0", "-l", "127.0.0.1:0"], b"");
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        out.stderr.trim_end(),
        "rodizio: invalid configuration: --workers must be 1..65536, got 0"
    );
    assert!(!out.stdout.contains("Enter"), "asked: {}", out.stdout);
    assert_eq!(out.stdout, "");
}

/// A taken port exits 1 before the prompt asks anything.
#[test]
fn a_taken_port_exits_1_before_any_question() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = run(&["-l", &addr], b"1\n127.0.0.1\n8001\n");
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!("failed to listen on {addr}")),
        "{}",
        out.stderr
    );
    assert_eq!(out.stdout, "", "asked before binding");
}

/// The seed-style file is read as written, and check-config prints the
/// effective settings one `key = value` per line.
#[test]
fn check_config_prints_the_settings_of_the_seed_style_file() {
    let file = TempFile::new(
        r#"{ "mode": "load_balancer", "listen_port": 8080, "scheduling_algorithm": "least_connections",
  "health_check_interval_seconds": 5,
  "backend_servers": [ { "host": "127.0.0.1", "port": 8081 }, { "host": "127.0.0.1", "port": 8082 } ] }"#,
    );
    let out = run(&["check-config", file.path()], b"");
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    let lines: Vec<&str> = out.stdout.lines().collect();
    for want in [
        "mode = load_balancer",
        "listen = 0.0.0.0:8080",
        "backends = 127.0.0.1:8081 127.0.0.1:8082",
        "algorithm = least-connections",
        "health_interval = 5s",
        "workers = 4096",
        "rate_limit = off",
    ] {
        assert!(lines.contains(&want), "{want} missing:\n{}", out.stdout);
    }
    assert!(lines.iter().all(|l| l.contains(" = ")), "{}", out.stdout);
    assert!(out.stderr.contains("the configuration is valid"));
}

/// check-config exits 2 with the reason for a bad file, and prints no
/// settings then.
#[test]
fn check_config_refuses_a_bad_file() {
    let file = TempFile::new("{\"backends\": [\"127.0.0.1:1\"], \"fall\": 0}");
    let out = run(&["check-config", file.path()], b"");
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(out.stdout, "");
    assert!(
        out.stderr.contains("`fall` must be at least 1"),
        "{}",
        out.stderr
    );
    let file = TempFile::new("{\"backends\": [\"no-such-host.invalid:80\"]}");
    let out = run(&["check-config", file.path()], b"");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        out.stderr.contains("`backends`: 'no-such-host.invalid:80'"),
        "{}",
        out.stderr
    );
}

/// Flags win over the file, the file over the defaults; a bad value given
/// by a flag is worded as the flag.
#[test]
fn flags_win_over_the_file() {
    let file = TempFile::new(
        r#"{"backends": ["127.0.0.1:1"], "workers": 3, "fall": 5, "listen": "127.0.0.1:0"}"#,
    );
    let out = run(&["--workers", "7", "check-config", file.path()], b"");
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    assert!(out.stdout.contains("\nworkers = 7\n"), "{}", out.stdout);
    assert!(out.stdout.contains("\nfall = 5\n"), "{}", out.stdout);
    assert!(out.stdout.contains("\nrise = 2\n"), "{}", out.stdout);
    let out = run(&["--fall", "0", "check-config", file.path()], b"");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        out.stderr.contains("--fall must be at least 1"),
        "{}",
        out.stderr
    );
}

/// The shipped example of several services passes check-config, which
/// lists the process's settings, then each service's own.
#[test]
fn the_services_example_passes_check_config() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/services.json");
    let out = run(&["check-config", example], b"");
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    let sections: Vec<&str> = out.stdout.split("\n[service ").collect();
    assert_eq!(sections.len(), 4, "{}", out.stdout);
    assert!(sections[0].contains("workers = 4096"), "{}", out.stdout);
    assert!(!sections[0].contains("backends ="), "{}", out.stdout);
    assert!(
        sections[1].starts_with("web]\nlisten = 0.0.0.0:8080 [::]:8080\n"),
        "{}",
        sections[1]
    );
    assert!(
        sections[2].contains("max_connections = 200"),
        "{}",
        sections[2]
    );
    assert!(sections[2].contains("idle_timeout = 1h"), "{}", sections[2]);
    assert!(
        sections[3].contains("idle_timeout = 10m"),
        "{}",
        sections[3]
    );
    assert!(!sections[3].contains("workers ="), "{}", sections[3]);
}

/// The shipped example holds every key with its default, except
/// `kernel_relay: "auto"` (the operator's fast path where the program
/// loads; the default stays off for the article's copy pump), and passes
/// check-config.
#[test]
fn the_example_file_passes_check_config() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/rodizio.json");
    let out = run(&["check-config", example], b"");
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    let text = std::fs::read_to_string(example).unwrap();
    let settings = rodizio::Config {
        rate_limit: Some(rodizio::limiter::RateLimitConfig::new(
            rodizio::limiter::Rate::parse("1/1s").unwrap(),
        )),
        ..rodizio::Config::default()
    };
    for (key, _) in settings.describe() {
        assert!(text.contains(&format!("\"{key}\":")), "{key} missing");
    }
    // Every value is the default but `kernel_relay`: what it prints is
    // what the defaults describe, with its backends.
    let backends = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("backends = "))
        .expect("a backends line");
    let mut defaults = rodizio::Config {
        backends: backends
            .split(' ')
            .map(|s| rodizio::backend::BackendSpec::parse(s).unwrap())
            .collect(),
        ..rodizio::Config::default()
    };
    defaults.proxy.kernel_relay = rodizio::units::Switch::Auto;
    for (key, value) in defaults.describe() {
        let line = format!("{key} = {value}");
        assert!(out.stdout.lines().any(|l| l == line), "{line} missing");
    }
}

/// `"mode": "backend"` runs the demo backend on `listen`.
#[test]
fn backend_mode_runs_the_demo_backend() {
    let file = TempFile::new(r#"{"mode": "backend", "listen": "127.0.0.1:0"}"#);
    let mut command = child::command(&["-c", file.path()]);
    command.env("RUST_LOG", "warn");
    let mut demo = Child::spawn(&mut command);
    let addr = demo.printed("Demo backend listening on ");
    let reply = http_get(addr, "/").unwrap();
    assert!(reply.status.contains(" 200 "), "{}", reply.status);
    assert!(demo.stop().is_some_and(|status| status.success()));
}

/// `rodizio check-config FILE` on `text` with `flags` before it.
fn check(text: &str, flags: &[&str]) -> (Ended, TempFile) {
    let file = TempFile::new(text);
    let mut args = flags.to_vec();
    args.extend(["check-config", file.path()]);
    let out = run(&args, b"");
    (out, file)
}

/// `yield_before_poll` is `off` unless a file or the flag says otherwise:
/// the three words and the old `true`/`false` read back, the flag wins,
/// and any other value is one line naming the key, exit 2.
#[test]
fn yield_before_poll_reads_its_three_words_and_refuses_others() {
    let shown = |text: &str, flags: &[&str]| {
        let (out, _file) = check(text, flags);
        assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
        let line = out
            .stdout
            .lines()
            .find(|l| l.starts_with("yield_before_poll "));
        line.expect("a yield_before_poll line").to_string()
    };
    let plain = r#"{"backends": ["127.0.0.1:8001"]}"#;
    assert_eq!(shown(plain, &[]), "yield_before_poll = off");
    assert_eq!(
        shown(plain, &["--yield-before-poll"]),
        "yield_before_poll = on"
    );
    for (value, word) in [
        ("\"off\"", "off"),
        ("\"on\"", "on"),
        ("\"auto\"", "auto"),
        ("false", "off"),
        ("true", "on"),
    ] {
        let file = format!(r#"{{"backends": ["127.0.0.1:8001"], "yield_before_poll": {value}}}"#);
        assert_eq!(shown(&file, &[]), format!("yield_before_poll = {word}"));
        let flag = format!("--yield-before-poll={word}");
        assert_eq!(
            shown(plain, &[&flag]),
            format!("yield_before_poll = {word}")
        );
    }
    let off = r#"{"backends": ["127.0.0.1:8001"], "yield_before_poll": "off"}"#;
    assert_eq!(
        shown(off, &["--yield-before-poll=auto"]),
        "yield_before_poll = auto"
    );
    for bad in ["\"sometimes\"", "1", "\"\"", "[]"] {
        let file = format!(r#"{{"backends": ["127.0.0.1:8001"], "yield_before_poll": {bad}}}"#);
        let line = refused(&file);
        assert!(line.contains("`yield_before_poll`"), "{line}");
        assert!(line.contains("auto"), "the words are named: {line}");
    }
    let (out, _file) = check(plain, &["--yield-before-poll=maybe"]);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("'maybe': use off, on or auto"),
        "{}",
        out.stderr
    );
}

/// One backend written twice, under the same or another spelling that
/// reaches the same address, is refused naming both spellings and the
/// weight that gives a larger share.
#[test]
fn a_backend_listed_twice_is_refused() {
    for second in ["127.0.0.1:29001", "localhost:29001", " 127.0.0.1:29001"] {
        let line = refused(&format!(
            "{{\"listen\": \"127.0.0.1:0\", \"backends\": [\"127.0.0.1:29001\", \"{second}\"]}}"
        ));
        assert!(line.contains("`backends`"), "{line}");
        assert!(line.contains("'127.0.0.1:29001'"), "{line}");
        assert!(line.contains(&format!("'{}'", second.trim())), "{line}");
        assert!(line.contains("weight"), "{line}");
    }
    // Two ports of one host are two backends.
    let (out, _f) = check(
        "{\"backends\": [\"127.0.0.1:29001\", \"127.0.0.1:29002\"]}",
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
}

/// `access_log_file` without `access_log` would be ignored: refused.
#[test]
fn an_access_log_file_without_an_access_log_is_refused() {
    let line = refused(
        "{\"listen\": \"127.0.0.1:0\", \"backends\": [\"127.0.0.1:1\"],\n \"access_log_file\": \"/tmp/rodizio-x.log\"}",
    );
    assert!(
        line.contains("line 2, column 2: `access_log_file` needs `access_log`"),
        "{line}"
    );
}

/// `-b` beside a file that lists backends: one line says the flags win.
#[test]
fn flags_backends_over_the_files_say_which_wins() {
    let (out, file) = check(
        "{\"backends\": [\"127.0.0.1:29001\"]}",
        &["-b", "127.0.0.1:29002"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    assert!(
        out.stdout.contains("backends = 127.0.0.1:29002\n"),
        "{}",
        out.stdout
    );
    let said: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("win over"))
        .collect();
    assert_eq!(said.len(), 1, "{}", out.stderr);
    assert!(said[0].contains(file.path()), "{}", said[0]);
    assert!(said[0].contains("--backend"), "{}", said[0]);
    // Without `-b`, nothing is said.
    let (out, _f) = check("{\"backends\": [\"127.0.0.1:29001\"]}", &[]);
    assert!(!out.stderr.contains("win over"), "{}", out.stderr);
}

/// A bracketed IPv6 host in a backend object is the address inside.
#[test]
fn a_bracketed_ipv6_host_is_accepted() {
    let (out, _f) = check(
        "{\"backends\": [{\"host\": \"[::1]\", \"port\": 29003}]}",
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    assert!(
        out.stdout.contains("backends = [::1]:29003\n"),
        "{}",
        out.stdout
    );
    let line = refused("{\"backends\": [{\"host\": \"[::1\", \"port\": 29003}]}");
    assert!(line.contains("`backends[0]`"), "{line}");
    assert!(!line.contains("failed to lookup"), "{line}");
}

/// A UTF-8 byte order mark before the object is skipped.
#[test]
fn a_leading_byte_order_mark_is_skipped() {
    let (out, _f) = check("\u{feff}{\"backends\": [\"127.0.0.1:1\"]}", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
}

/// An empty file (or white space only) is called empty.
#[test]
fn an_empty_file_is_called_empty() {
    for text in ["", "  \n\t\n"] {
        let line = refused(text);
        assert!(line.contains("the file is empty"), "{line}");
        assert!(!line.contains("EOF"), "{line}");
    }
}

/// `listen` takes what `--listen` takes, and refuses it in the same words.
#[test]
fn listen_in_the_file_is_parsed_as_the_flag() {
    let line = refused("{\"backends\": [\"127.0.0.1:1\"], \"listen\": \"localhost:8080\"}");
    let flag = run(&["-b", "127.0.0.1:1", "-l", "localhost:8080"], b"");
    let reason = "'localhost:8080' is not a listening address: expected IP:PORT";
    assert!(line.contains(&format!("`listen`: {reason}")), "{line}");
    assert!(flag.stderr.contains(reason), "{}", flag.stderr);
    let line = refused("{\"backends\": [\"127.0.0.1:1\"], \"listen\": \"8080\"}");
    assert!(line.contains("e.g. 0.0.0.0:8080"), "{line}");
}

/// Numbers are described in words, never as Rust types, and a huge one
/// is not echoed digit by digit.
#[test]
fn numbers_are_refused_in_words() {
    for (key, value) in [
        ("workers", "-1"),
        ("workers", "1e300"),
        ("workers", "99999999999999999999999"),
        ("fall", "-1"),
        ("rise", "1.5"),
        ("passive_failures", "5000000000"),
        ("queue_capacity", "-3"),
        ("backlog", "-1"),
        ("backlog", "3000000000"),
        ("rate_limit_ipv6_prefix", "300"),
        ("listen_port", "70000"),
        ("connect_timeout", "1e300"),
        ("buffer_size", "-1"),
        ("buffer_size", "1e300"),
    ] {
        let line = refused(&format!(
            "{{\"backends\": [\"127.0.0.1:1\"], \"{key}\": {value}}}"
        ));
        assert!(line.contains(&format!("`{key}`")), "{line}");
        for rust in [
            "usize",
            "u64",
            "u32",
            "u16",
            "u8",
            "i32",
            "i64",
            "f64",
            "integer `",
            "floating point",
        ] {
            assert!(!line.contains(rust), "{key}={value}: {line}");
        }
        assert!(line.len() < 200, "{key}={value}: {line}");
    }
    let line = refused("{\"backends\": [\"127.0.0.1:1\"], \"workers\": -1}");
    assert!(line.contains("a whole number from 1 to 65536"), "{line}");
    let line = refused("{\"backends\": [{\"host\": \"127.0.0.1\", \"port\": 1, \"weight\": -2}]}");
    assert!(line.contains("`backends[0].weight`"), "{line}");
    assert!(line.contains("a whole number from 1 to 1000"), "{line}");
}

/// A send-expect check without `health_expect` names the file and key.
#[test]
fn send_expect_without_expect_names_the_file() {
    let line = refused("{\"backends\": [\"127.0.0.1:1\"],\n \"health_check\": \"send-expect\"}");
    assert!(line.starts_with("line 2, column 2: "), "{line}");
    assert!(line.contains("health_expect"), "{line}");
}

/// `-c FILE -b X` running: the line saying that the flags' backends win
/// is said at start-up, and again on each reload that reads the file's.
#[test]
fn which_backends_win_is_said_at_start_up_and_on_reload() {
    let file = TempFile::new(
        "{\"listen\": \"127.0.0.1:0\", \"health_check\": \"off\", \"backends\": [\"127.0.0.1:29001\"]}",
    );
    let rodizio = Child::spawn(&mut child::command(&[
        "--allow-root",
        "-c",
        file.path(),
        "-b",
        "127.0.0.1:29002",
    ]));
    let stderr = &rodizio.stderr;
    let said = || stderr.text().matches("win over the file's").count();
    // The listening line comes once SIGHUP reloads: a signal sent before
    // it would find no reload to run.
    let started = wait_for(WAIT, || {
        said() == 1 && rodizio.stdout.text().contains(child::LISTENING)
    });
    let reloads = || stderr.text().matches("reload: no change").count();
    let reloaded = started && {
        rodizio.signal(libc::SIGHUP);
        wait_for(WAIT, || reloads() == 1)
    };
    assert!(started, "{}", stderr.text());
    assert!(reloaded, "{}", stderr.text());
    assert_eq!(said(), 2, "{}", stderr.text());
}

/// `check-config` reads every file the settings name, as a start would: a
/// missing certificate, a key that is not the certificate's, a missing
/// `tls_client_ca`, `backend_tls_ca` or admin token file, and an empty
/// token file are each exit 2 with one line naming the key, its line in
/// the file and the path; the same files good are exit 0. A start on the
/// bad file says the same line.
#[test]
fn check_config_reads_every_file_the_settings_name() {
    let certs = tls_certs::Certs::new();
    let a = certs.issue("a", &["a.test"], 1);
    let b = certs.issue("b", &["b.test"], 2);
    let dir = Scratch::new("files");
    let token = dir.file("token", "s3cret\n");
    let empty = dir.file("empty", "  \n");
    let missing = dir.path("missing.pem");
    let ca = certs.ca();
    let pair = |cert: &std::path::Path, key: &std::path::Path| {
        format!(
            r#"[{{"cert": "{}", "key": "{}"}}]"#,
            cert.display(),
            key.display()
        )
    };
    // Each key on a line of its own, so that the line named is known.
    let file = |extra: &str| {
        format!(
            "{{\n  \"listen\": \"127.0.0.1:0\",\n  \"backends\": [\"127.0.0.1:1\"],\n  {extra}\n}}\n"
        )
    };
    let good = file(&format!(
        "\"tls_certs\": {},\n  \"tls_client_ca\": \"{}\",\n  \"backend_tls\": true,\n  \
         \"backend_tls_ca\": \"{}\",\n  \"admin_listen\": \"127.0.0.1:0\",\n  \
         \"admin_token_file\": \"{}\"",
        pair(&a.cert, &a.key),
        ca.display(),
        ca.display(),
        token.display()
    ));
    let file_ok = TempFile::new(&good);
    let out = run(&["check-config", file_ok.path()], b"");
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    let admin = |key: &str, path: &std::path::Path| {
        format!(
            "\"admin_listen\": \"127.0.0.1:0\",\n  \"{key}\": \"{}\"",
            path.display()
        )
    };
    let cases = [
        (
            format!("\"tls_certs\": {}", pair(&missing, &a.key)),
            "tls_certs",
            4,
            missing.display().to_string(),
        ),
        (
            format!("\"tls_certs\": {}", pair(&a.cert, &b.key)),
            "tls_certs",
            4,
            "key".to_string(),
        ),
        (
            format!(
                "\"tls_certs\": {},\n  \"tls_client_ca\": \"{}\"",
                pair(&a.cert, &a.key),
                missing.display()
            ),
            "tls_client_ca",
            5,
            missing.display().to_string(),
        ),
        (
            format!(
                "\"backend_tls\": true,\n  \"backend_tls_ca\": \"{}\"",
                missing.display()
            ),
            "backend_tls_ca",
            5,
            missing.display().to_string(),
        ),
        (
            admin("admin_token_file", &missing),
            "admin_token_file",
            5,
            missing.display().to_string(),
        ),
        (
            admin("admin_token_file", &empty),
            "admin_token_file",
            5,
            "empty".to_string(),
        ),
    ];
    for (extra, key, line, words) in cases {
        let bad = TempFile::new(&file(&extra));
        let checked = run(&["check-config", bad.path()], b"");
        assert_eq!(
            checked.status.code(),
            Some(2),
            "{extra}: {}",
            checked.stderr
        );
        assert_eq!(checked.stdout, "", "{extra}: nothing listed");
        let said = checked.stderr.trim_end();
        assert_eq!(said.lines().count(), 1, "{said}");
        assert!(
            said.contains(&format!("line {line}, ")) && said.contains(&format!("`{key}`")),
            "{extra}: {said}"
        );
        assert!(said.contains(&words), "{extra}: {said}");
        // A start says the same line, and starts nothing.
        let started = run(&["-c", bad.path()], b"");
        assert_eq!(started.status.code(), Some(2), "{}", started.stderr);
        assert!(
            started
                .stderr
                .contains(said.trim_start_matches("rodizio: ")),
            "{}",
            started.stderr
        );
    }
}

/// `null` for a key of the file or of a service is the key left out (the
/// flag's value, else the default); inside a backend's object it is
/// refused in one line naming the key, exit 2.
#[test]
fn null_is_a_key_left_out_except_in_a_backends_object() {
    let line = |text: &str, flags: &[&str], key: &str| {
        let (out, _file) = check(text, flags);
        assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
        let wanted = format!("{key} = ");
        let found = out.stdout.lines().find(|l| l.starts_with(&wanted));
        found
            .unwrap_or_else(|| panic!("no {key}: {}", out.stdout))
            .to_string()
    };
    let nulls = r#"{"backends": ["127.0.0.1:8001"], "workers": null, "connect_timeout": null}"#;
    let plain = r#"{"backends": ["127.0.0.1:8001"]}"#;
    for key in ["workers", "connect_timeout"] {
        assert_eq!(line(nulls, &[], key), line(plain, &[], key));
    }
    assert_eq!(line(nulls, &["--workers", "7"], "workers"), "workers = 7");
    let service = r#"{"services": [{"name": "a", "listen": "127.0.0.1:0",
        "backends": ["127.0.0.1:8001"], "algorithm": null}]}"#;
    let (out, _file) = check(service, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    let refusal = refused(r#"{"backends": [{"host": "127.0.0.1", "port": 8001, "weight": null}]}"#);
    assert!(refusal.contains("`backends[0].weight`"), "{refusal}");
    assert!(refusal.contains("null"), "{refusal}");
}
