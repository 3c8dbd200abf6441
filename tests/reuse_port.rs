//! The zero-downtime upgrade with the real binary: under a steady load, a
//! second rodizio starts on the same port (`--reuse-port`), the first is
//! sent SIGTERM and drains, and no request fails.
//!
//! Connections waiting in the accept queue of a listener that closes are
//! reset by the kernel unless `net.ipv4.tcp_migrate_req` is 1 (Linux
//! 5.14+), which moves them to another listener of the port. The test sets
//! it for its network namespace while it runs and puts the old value back
//! (docs/scaling.md tells what happens without it).

mod child;
mod common;
mod peers;

use std::fs;
use std::net::SocketAddr;
use std::time::Duration;

use child::Child;
use common::{Load, TestBackend};
use peers::{free_port, loopback};

const MIGRATE: &str = "/proc/sys/net/ipv4/tcp_migrate_req";

/// Sets `net.ipv4.tcp_migrate_req` to 1 and puts the old value back when
/// dropped.
struct MigrateReq(String);

impl MigrateReq {
    fn on() -> MigrateReq {
        let old = fs::read_to_string(MIGRATE).unwrap_or_else(|e| {
            panic!("{MIGRATE}: {e} (the kernel needs to be 5.14 or later; see docs/scaling.md)")
        });
        fs::write(MIGRATE, "1").unwrap_or_else(|e| panic!("setting {MIGRATE} to 1: {e}"));
        MigrateReq(old.trim().to_string())
    }
}

impl Drop for MigrateReq {
    fn drop(&mut self) {
        let _ = fs::write(MIGRATE, &self.0);
    }
}

/// A rodizio process on `port` with `--reuse-port`, ready to serve.
fn rodizio(port: u16, backend: SocketAddr) -> Child {
    Child::start(&mut child::command(&[
        "--allow-root",
        "-l",
        &format!("127.0.0.1:{port}"),
        "-b",
        &backend.to_string(),
        "--reuse-port",
        "--health-check",
        "off",
        "--drain-timeout",
        "5s",
    ]))
}

/// Under a steady load of sequential requests, a second process takes the
/// port with `--reuse-port`, the first is sent SIGTERM, drains and exits
/// 0, and not one request fails.
#[test]
fn a_second_process_takes_over_without_a_failed_request() {
    let _migrate = MigrateReq::on();
    let web = TestBackend::http(1);
    let port = free_port();
    let addr = loopback(port);
    let mut old = rodizio(port, web.addr());

    let load = Load::start(addr);
    load.more(200);
    let new = rodizio(port, web.addr());
    load.more(500);
    old.signal(libc::SIGTERM);
    let status = old
        .wait_exit(Duration::from_secs(15))
        .expect("the old process did not exit");
    assert!(status.success(), "old process: {status}\n{}", old.output());
    load.more(500);
    let total = load.none_failed(&format!("old:\n{}\nnew:\n{}", old.output(), new.output()));
    eprintln!("{total} requests, none failed");
    drop(new);
}
