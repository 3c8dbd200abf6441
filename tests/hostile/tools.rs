//! The operator's tools, given bad input: `check-config --diff` with a
//! missing, garbage or huge file; `POST /reload?dry_run=1` with a bad file
//! on disk (nothing applied, nothing counted, the backends unchanged);
//! `GET /config?format=` with garbage; `simulate` with absurd client
//! counts and garbage flags. Every refusal is one line and exit 2 (or a
//! 4xx with a JSON error); every run has a deadline.

use std::time::{Duration, Instant};

use crate::child::{run, Ended, Rodizio, Scratch};
use crate::common::TestBackend;

/// `rodizio ARGS` refused: exit 2, one line on standard error, starting
/// `rodizio: `; that line.
fn refused(args: &[&str]) -> String {
    let out: Ended = run(args);
    assert_eq!(out.code, Some(2), "{args:?}: {}{}", out.stdout, out.stderr);
    assert_eq!(out.stderr.lines().count(), 1, "{args:?}: {}", out.stderr);
    assert!(out.stderr.starts_with("rodizio: "), "{}", out.stderr);
    assert!(
        out.stderr.len() < 400,
        "{args:?}: {} bytes",
        out.stderr.len()
    );
    out.stderr
}

/// `check-config --diff` with either file missing, garbage, huge, a
/// directory, or invalid: exit 2 and one line naming the file.
#[test]
fn check_config_diff_refuses_bad_files_in_one_line() {
    let dir = Scratch::new("hostile-diff");
    let good = dir.file("good.json", br#"{"backends": ["127.0.0.1:8001"]}"#);
    let garbage = dir.file("garbage.json", b"\x00\xff{{{ not json");
    let mut big = vec![b' '; 8 << 20];
    big[0] = b'{';
    let huge = dir.file("huge.json", &big);
    let invalid = dir.file(
        "invalid.json",
        br#"{"backends": ["127.0.0.1:8001"], "workers": -1}"#,
    );
    let lying = dir.file(
        "lying.json",
        br#"{"backends": ["no.such.host.invalid:80"]}"#,
    );
    let missing = dir.path("missing.json");
    let good = good.to_str().unwrap();
    for bad in [&garbage, &huge, &invalid, &missing] {
        let bad = bad.to_str().unwrap();
        for args in [
            ["check-config", "--diff", good, bad],
            ["check-config", "--diff", bad, good],
        ] {
            let started = Instant::now();
            let line = refused(&args);
            assert!(line.contains(bad), "{line}");
            assert!(started.elapsed() < Duration::from_secs(20));
        }
    }
    // A new backend that does not resolve: refused, as a reload would.
    let line = refused(&["check-config", "--diff", good, lying.to_str().unwrap()]);
    assert!(line.contains("no.such.host.invalid"), "{line}");
    let dir_path = dir.path("");
    refused(&["check-config", "--diff", dir_path.to_str().unwrap(), good]);
    refused(&["check-config", "--diff"]);
}

/// A dry run with a bad file on disk: 422 with a JSON error, and nothing
/// applied or counted: the backends and `reloads_failed` as they were.
/// A bad `dry_run=` value is 400; `GET /config?format=` garbage is 400.
#[test]
fn a_dry_run_of_a_bad_file_applies_nothing() {
    let a = TestBackend::echo();
    let dir = Scratch::new("hostile-dry");
    let good = format!(
        r#"{{"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0", "health_check": "off",
            "backends": ["{}"]}}"#,
        a.addr()
    );
    let path = dir.file("rodizio.json", good.as_bytes());
    let r = Rodizio::start(&path, &[]);
    let (_, before) = r.call("GET", "/backends", "");
    let mut huge = vec![b' '; 4 << 20];
    huge[0] = b'{';
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let bind_fails = format!(
        r#"{{"services": [{{"name": "x", "listen": "{}", "backends": ["127.0.0.1:1"]}}]}}"#,
        taken.local_addr().unwrap()
    );
    let bad_files: [&[u8]; 6] = [
        b"{\"backends\": [\"127.0.0.1:2\"],,}",
        b"\x00\x01garbage",
        &huge,
        b"{\"backends\": [\"127.0.0.1:2\"], \"workers\": 0}",
        b"{\"backends\": [\"no.such.host.invalid:80\"]}",
        bind_fails.as_bytes(),
    ];
    for bad in bad_files {
        dir.file("rodizio.json", bad);
        let (status, body) = r.call("POST", "/reload?dry_run=1", "");
        assert_eq!(status, 422, "{body}");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["dry_run"], true, "{body}");
        let error = json["error"].as_str().unwrap();
        assert!(!error.contains('\n') && error.len() < 400, "{error}");
        assert_eq!(r.call("GET", "/backends", "").1, before);
    }
    std::fs::remove_file(&path).unwrap();
    let (status, body) = r.call("POST", "/reload?dry_run=1", "");
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("cannot be read"), "{body}");
    let (_, metrics) = r.call("GET", "/metrics", "");
    assert!(
        metrics.contains("\nrodizio_reloads_failed_total 0\n"),
        "{metrics}"
    );
    for query in [
        "dry_run=maybe",
        "dry_run=%00%ff",
        &format!("dry_run={}", "9".repeat(5000)),
    ] {
        let (status, body) = r.call("POST", &format!("/reload?{query}"), "");
        assert_eq!(status, 400, "{query}: {body}");
        assert!(body.len() < 400, "{} bytes", body.len());
    }
    for query in ["format=xml", "format=", "format=%ff%fe"] {
        let (status, body) = r.call("GET", &format!("/config?{query}"), "");
        assert_eq!(status, 400, "{query}: {body}");
    }
    assert_eq!(r.call("GET", "/backends", "").1, before);
}

/// `simulate` with absurd client counts (0, 10^12, negative, not a
/// number, a thousand digits) and garbage flags: exit 2 in one line, at
/// once; the largest count allowed ends within the deadline.
#[test]
fn simulate_refuses_absurd_requests() {
    let b = [
        "-b",
        "10.0.0.1:80",
        "-b",
        "10.0.0.2:80",
        "--algorithm",
        "ip-hash",
    ];
    let with = |more: &[&str]| -> Vec<String> {
        b.iter()
            .chain(["simulate"].iter())
            .chain(more)
            .map(|s| s.to_string())
            .collect()
    };
    let digits = "9".repeat(1000);
    let cases: Vec<Vec<&str>> = vec![
        vec!["--clients", "0"],
        vec!["--clients", "1000000000000"],
        vec!["--clients", "-1"],
        vec!["--clients", "lots"],
        vec!["--clients", &digits],
        vec!["--weight", "garbage"],
        vec!["--weight", "10.0.0.1:80=0"],
        vec!["--weight", "10.0.0.1:80=99999999999"],
        vec!["--remove", "10.9.9.9:1"],
        vec!["--remove", "10.0.0.1:80", "--weight", "10.0.0.2:80=2"],
        vec!["--service", "nope"],
        vec!["--frobnicate"],
    ];
    for more in cases {
        let args = with(&more);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let started = Instant::now();
        refused(&args);
        assert!(started.elapsed() < Duration::from_secs(20), "{args:?}");
    }
    refused(&["simulate"]);
    let args = with(&["--clients", "1000000", "--remove", "10.0.0.1:80"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run(&args);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stdout.contains("1000000 clients"), "{}", out.stdout);
}

/// Sixteen clients asking for dry runs at once (all sent before any
/// answer is read, from one thread, so the test adds no thread to its
/// process), five times over, against a file that adds a backend: each is
/// told the same change, none applies it, and the API keeps answering
/// (each dry run reads and checks the whole file under the reloader's
/// lock).
#[test]
fn many_dry_runs_at_once_apply_nothing() {
    use std::io::{Read, Write};
    let (a, b) = (TestBackend::echo(), TestBackend::echo());
    let dir = Scratch::new("hostile-dry-many");
    let text = |backends: &str| {
        format!(
            r#"{{"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0", "health_check": "off",
                "backends": [{backends}]}}"#
        )
    };
    let path = dir.file(
        "rodizio.json",
        text(&format!("\"{}\"", a.addr())).as_bytes(),
    );
    let r = Rodizio::start(&path, &[]);
    let (_, before) = r.call("GET", "/backends", "");
    dir.file(
        "rodizio.json",
        text(&format!("\"{}\", \"{}\"", a.addr(), b.addr())).as_bytes(),
    );
    let started = Instant::now();
    for _ in 0..5 {
        let mut asked: Vec<std::net::TcpStream> = (0..16)
            .map(|_| {
                let mut s = std::net::TcpStream::connect(r.admin).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
                s.write_all(
                    b"POST /reload?dry_run=1 HTTP/1.1\r\nHost: test\r\n\
                      Connection: close\r\nContent-Length: 0\r\n\r\n",
                )
                .unwrap();
                s
            })
            .collect();
        assert_eq!(r.call("GET", "/backends", "").0, 200);
        for s in &mut asked {
            let mut answer = String::new();
            s.read_to_string(&mut answer).unwrap();
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
            assert!(answer.contains(&b.addr().to_string()), "{answer}");
        }
    }
    assert!(started.elapsed() < Duration::from_secs(60));
    assert_eq!(r.call("GET", "/backends", "").1, before);
    let (_, metrics) = r.call("GET", "/metrics", "");
    assert!(
        metrics.contains("\nrodizio_reloads_ok_total 0\n"),
        "{metrics}"
    );
}
