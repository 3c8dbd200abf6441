//! `rodizio preflight` on this machine, through the binary: with the
//! open-files limit lowered in the child (`setrlimit` between fork and
//! exec) the descriptors check fails and the exit code is 1; with the
//! limit it has and few workers every check passes or warns and the exit
//! code is 0; a bad file exits 2. The balancer started under the low limit
//! logs the failing line as a warning and starts anyway.

mod child;
mod common;

use std::time::Duration;

use child::{Child, Ended};
use common::{closed_port, limit_in_child, wait_for};

/// Longest a run may take: preflight reads a few files and exits.
const TIMEOUT: Duration = Duration::from_secs(30);
/// The low limit: far below what 4096 workers need.
const LOW: libc::rlim_t = 256;

/// Runs `rodizio ARGS` with `RLIMIT_NOFILE` set to `nofile` (soft and
/// hard) in the child; kills it by PID, failing the test, if it outlives
/// [`TIMEOUT`].
fn run(args: &[&str], nofile: libc::rlim_t) -> Ended {
    let mut command = child::command(args);
    command.env("RUST_LOG", "warn");
    limit_in_child(&mut command, libc::RLIMIT_NOFILE, nofile);
    child::run_within(&mut command, TIMEOUT)
}

/// This process's hard open-files limit: a child may be given it without
/// any privilege.
fn hard_nofile() -> libc::rlim_t {
    // SAFETY: rlimit is plain data, filled by getrlimit.
    unsafe {
        let mut limit: libc::rlimit = std::mem::zeroed();
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        limit.rlim_max
    }
}

/// The line of `stdout` about `what`.
fn line<'a>(stdout: &'a str, what: &str) -> &'a str {
    stdout
        .lines()
        .find(|l| l.contains(what))
        .unwrap_or_else(|| panic!("no line about {what}:\n{stdout}"))
}

/// 4096 workers need 4096 × 2 descriptors, 4096 for the waiting clients,
/// 64 kept aside for their backend sockets and 36 others: 12388, far over
/// 256. The line says so, with the fix,
/// and the exit code is 1.
#[test]
fn a_low_open_files_limit_fails_and_exits_1() {
    let out = run(&["--workers", "4096", "preflight"], LOW);
    assert_eq!(out.code, Some(1), "{}\n{}", out.stdout, out.stderr);
    let nofile = line(&out.stdout, "RLIMIT_NOFILE");
    assert!(
        nofile.starts_with(
            "fail  open files (RLIMIT_NOFILE): soft 256, hard 256; 12388 needed \
             (4096 workers × 2, 4096 waiting clients, 64 kept aside, 36 others)"
        ),
        "{nofile}"
    );
    assert!(
        nofile.ends_with("fix: ulimit -n 12388 (LimitNOFILE=12388 in a systemd unit)"),
        "{nofile}"
    );
}

/// With the limit this process has and 8 workers (16 + 64 + 8 + 36
/// descriptors), the descriptors line is ok, no line fails, and the exit
/// code is 0. Every check prints one line, each starting with its verdict.
#[test]
fn enough_descriptors_for_few_workers_pass_and_exit_0() {
    let out = run(
        &["--workers", "8", "--queue-capacity", "64", "preflight"],
        hard_nofile(),
    );
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    let nofile = line(&out.stdout, "RLIMIT_NOFILE");
    assert!(nofile.starts_with("ok    open files"), "{nofile}");
    assert!(
        nofile.contains("124 needed (8 workers × 2, 64 waiting clients, 8 kept aside, 36 others)"),
        "{nofile}"
    );
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 10, "{}", out.stdout);
    for l in lines {
        assert!(
            l.starts_with("ok    ") || l.starts_with("warn  "),
            "{l}\n{}",
            out.stdout
        );
    }
}

/// The settings come from a file too (given after `preflight`), and a bad
/// one exits 2 with one line.
#[test]
fn a_config_file_is_weighed_and_a_bad_one_exits_2() {
    let dir = std::env::temp_dir();
    let good = dir.join(format!("rodizio-preflight-{}.json", std::process::id()));
    std::fs::write(&good, "{\"workers\": 1000, \"splice\": true}").unwrap();
    let out = run(&["preflight", good.to_str().unwrap()], LOW);
    let nofile = line(&out.stdout, "RLIMIT_NOFILE");
    assert!(
        nofile.contains("(1000 workers × 2 + 4 for its pipes, 4096 waiting clients"),
        "{nofile}"
    );
    assert_eq!(out.code, Some(1));
    std::fs::write(&good, "{\"workers\": 0}").unwrap();
    let out = run(&["preflight", good.to_str().unwrap()], LOW);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    assert!(out.stdout.is_empty(), "{}", out.stdout);
    std::fs::remove_file(&good).unwrap();
}

/// The balancer under the low limit logs the failing line as a warning
/// and starts all the same: the listening line comes.
#[test]
fn the_balancer_logs_the_failing_line_at_start_up_and_starts() {
    let backend = closed_port().to_string();
    let mut command = child::command(&[
        "-l",
        "127.0.0.1:0",
        "--health-check",
        "off",
        "-b",
        &backend,
        "--allow-root",
    ]);
    command.env("RUST_LOG", "warn");
    limit_in_child(&mut command, libc::RLIMIT_NOFILE, LOW);
    let mut rodizio = Child::start(&mut command);
    let started = wait_for(TIMEOUT, || {
        rodizio.log().contains("preflight: fail  open files")
    });
    let code = rodizio.stop().and_then(|status| status.code());
    let err = rodizio.log();
    assert!(started, "stdout: {}\nstderr: {err}", rodizio.stdout.text());
    assert_eq!(code, Some(0), "{err}");
    let warned: Vec<&str> = err.lines().filter(|l| l.contains("preflight: ")).collect();
    assert!(
        warned.iter().all(|l| l.contains("WARN")),
        "warnings only: {warned:#?}"
    );
    assert!(
        warned.iter().all(|l| !l.contains("preflight: ok")),
        "no ok line: {warned:#?}"
    );
}
