//! `kernel_relay: auto`, `on` and `off`: the three words read from the flag
//! (bare `--kernel-relay` is `on`, `--kernel-relay=auto`) and the file
//! (`true` and `false` still read), a bad value refused in one line with
//! exit 2; `auto` as root loads the program and promotes; `auto` in a
//! process without CAP_BPF, CAP_NET_ADMIN and CAP_SYS_ADMIN (the binary
//! started under `setpriv`, util-linux) is off with one info line saying
//! why, and serves every connection on the copy pump with no fall-back
//! counted. The root tests need root, as CI runs them: they fail without
//! it, never pass on the copy pump.

mod child;
mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::process::{Command, Stdio};

use child::{run, Child, Scratch, BIN};
use common::{connect, is_closed, wait_for, TestBackend, TestBalancer};
use rodizio::units::Switch;

/// Fails the test at once unless it runs as root.
fn assert_root() {
    // SAFETY: reads the effective user id.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this test loads the kernel relay's program, or drops the capabilities \
         a root process has, and needs root (CI runs as root): run it with sudo"
    );
}

/// One request and its echo, checked byte for byte.
fn exchange(s: &mut TcpStream, n: usize) {
    let request = format!("request {n:04}\n");
    s.write_all(request.as_bytes()).unwrap();
    let mut reply = vec![0u8; request.len()];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(reply, request.as_bytes());
}

/// The `kernel_relay = ...` line `check-config FILE` prints with `flags`
/// before it; or the exit code and the error when it refuses.
fn shown(flags: &[&str], file: &str) -> Result<String, (Option<i32>, String)> {
    let scratch = Scratch::new("kernel-relay-auto");
    let path = scratch.file("c.json", file);
    let path = path.to_str().unwrap();
    let ended = run(&[flags, &["check-config", path]].concat());
    if ended.code != Some(0) {
        return Err((ended.code, ended.stderr));
    }
    Ok(ended
        .stdout
        .lines()
        .find(|l| l.starts_with("kernel_relay "))
        .unwrap_or_else(|| panic!("no kernel_relay line:\n{}", ended.stdout))
        .to_string())
}

#[test]
fn the_setting_reads_off_on_and_auto_from_the_flag_and_the_file() {
    let plain = r#"{"backends": ["127.0.0.1:8001"]}"#;
    assert_eq!(shown(&[], plain).unwrap(), "kernel_relay = off");
    assert_eq!(
        shown(&["--kernel-relay"], plain).unwrap(),
        "kernel_relay = on"
    );
    for word in ["off", "on", "auto"] {
        let flag = format!("--kernel-relay={word}");
        assert_eq!(
            shown(&[&flag], plain).unwrap(),
            format!("kernel_relay = {word}")
        );
        let file = format!(r#"{{"backends": ["127.0.0.1:8001"], "kernel_relay": "{word}"}}"#);
        assert_eq!(shown(&[], &file).unwrap(), format!("kernel_relay = {word}"));
    }
    for (value, word) in [("true", "on"), ("false", "off")] {
        let file = format!(r#"{{"backends": ["127.0.0.1:8001"], "kernel_relay": {value}}}"#);
        assert_eq!(shown(&[], &file).unwrap(), format!("kernel_relay = {word}"));
    }
    // The flag wins over the file.
    let auto = r#"{"backends": ["127.0.0.1:8001"], "kernel_relay": "auto"}"#;
    assert_eq!(
        shown(&["--kernel-relay=off"], auto).unwrap(),
        "kernel_relay = off"
    );
}

#[test]
fn a_bad_value_is_refused_in_one_line_with_exit_2() {
    let plain = r#"{"backends": ["127.0.0.1:8001"]}"#;
    let bad_files = [
        r#"{"backends": ["127.0.0.1:8001"], "kernel_relay": "sometimes"}"#,
        r#"{"backends": ["127.0.0.1:8001"], "kernel_relay": 1}"#,
    ];
    for file in bad_files {
        let (code, stderr) = shown(&[], file).unwrap_err();
        assert_eq!(code, Some(2), "{stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(stderr.contains("kernel_relay"), "{stderr}");
        assert!(stderr.contains("auto"), "the words are named: {stderr}");
    }
    let (code, stderr) = shown(&["--kernel-relay=sometimes"], plain).unwrap_err();
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("use off, on or auto"), "{stderr}");
}

/// As root the program loads: a chatty connection is promoted, and no
/// fall-back is counted.
#[test]
fn auto_as_root_loads_and_promotes() {
    assert_root();
    const AFTER: usize = 4;
    let backend = TestBackend::echo();
    let mut cfg = common::config(&[backend.addr()]);
    cfg.proxy.kernel_relay = Switch::Auto;
    cfg.proxy.kernel_relay_after = AFTER as u32;
    let lb = TestBalancer::start(cfg);
    let mut s = connect(lb.addr).unwrap();
    for i in 0..AFTER {
        exchange(&mut s, i);
    }
    let promoted = wait_for(child::WAIT, || lb.stats.snapshot().kernel_relayed == 1);
    assert!(promoted, "not promoted: {:?}", lb.stats.snapshot());
    for i in AFTER..3 * AFTER {
        exchange(&mut s, i);
    }
    s.shutdown(Shutdown::Write).unwrap();
    assert!(is_closed(&mut s));
    wait_for(child::WAIT, || lb.stats.snapshot().completed == 1);
    let st = lb.stats.snapshot();
    assert_eq!(
        (st.kernel_relayed, st.kernel_relay_fallbacks, st.errors),
        (1, 0, 0),
        "{st:?}"
    );
    lb.stop();
}

/// The binary, started as root but without the capabilities that load a
/// BPF program (`setpriv` takes them out of its bounding set, so the
/// exec'd binary never has them; CAP_SYS_ADMIN too, which the kernel also
/// accepts for both): `auto` logs one info line saying the relay is off
/// and why, and serves every connection on the copy pump, none counted as
/// a fall-back, even at `kernel_relay_after 0`.
#[test]
fn auto_without_the_capabilities_is_off_with_one_info_line() {
    assert_root();
    let backend = TestBackend::echo();
    let backend_addr = backend.addr().to_string();
    let mut command = Command::new("setpriv");
    command
        .args([
            "--inh-caps=-all",
            "--bounding-set=-bpf,-net_admin,-sys_admin",
            "--",
            BIN,
            "-l",
            "127.0.0.1:0",
            "--allow-root",
            "-b",
            &backend_addr,
            "--health-check",
            "off",
            "--kernel-relay=auto",
            "--kernel-relay-after",
            "0",
            "--admin",
            "127.0.0.1:0",
        ])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null());
    let mut lb = Child::start(&mut command);
    for _ in 0..3 {
        let mut s = connect(lb.addr).unwrap();
        for i in 0..5 {
            exchange(&mut s, i);
        }
        s.shutdown(Shutdown::Write).unwrap();
        assert!(is_closed(&mut s));
    }
    let served = wait_for(child::WAIT, || lb.metric("completed_total") == 3);
    assert!(served, "{}", lb.log());
    assert_eq!(lb.metric("kernel_relayed_total"), 0, "{}", lb.log());
    assert_eq!(lb.metric("kernel_relay_fallbacks_total"), 0, "{}", lb.log());
    let log = lb.log();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("kernel relay")).collect();
    assert_eq!(lines.len(), 1, "one line about the relay:\n{log}");
    assert!(lines[0].contains(" INFO "), "an info line: {}", lines[0]);
    assert!(lines[0].contains("(auto): off"), "{}", lines[0]);
    assert!(
        lines[0].contains("CAP_BPF and CAP_NET_ADMIN"),
        "{}",
        lines[0]
    );
    assert!(lines[0].contains("copy pump"), "{}", lines[0]);
    lb.stop();
}
