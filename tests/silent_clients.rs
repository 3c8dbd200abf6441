//! Silent clients (slowloris): 2,000 clients that connect and send nothing,
//! then 200 normal requests, through 256 workers. Without
//! `client_first_byte_timeout` the silent ones hold every worker until the
//! idle timeout and the normal ones wait; with it, the normal ones are
//! served at once. A test binary of its own: it holds about 4,500
//! descriptors.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::{config, until, wait_for, TestBackend, TestBalancer};

const SILENT: usize = 2000;
const NORMAL: usize = 200;
const WORKERS: usize = 256;

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect_timeout(&addr, common::IO_TIMEOUT).unwrap();
    s.set_read_timeout(Some(common::IO_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(common::IO_TIMEOUT)).unwrap();
    s
}

/// Starts a balancer with 256 workers over an echo backend, opens 2,000
/// silent connections (kept open by the caller), waits until they are all
/// accepted, then sends 200 one-byte requests and reads each reply until
/// `within` has passed. Returns the silent connections, the balancer and
/// how many of the 200 were served, and the time the last one took (and
/// the backend, to drop last).
fn silent_then_normal(
    first_byte_timeout: Option<Duration>,
    within: Duration,
) -> (Vec<TcpStream>, TestBalancer, usize, Duration, TestBackend) {
    // Both tests of this binary at once hold about 9,000 descriptors.
    let limit = rodizio::system::raise_nofile_limit().expect("raise the open files limit");
    assert!(
        limit >= 10_000,
        "this test needs an open files limit of at least 10000 (ulimit -Hn), got {limit}"
    );
    let backend = TestBackend::echo();
    let mut cfg = config(&[backend.addr()]);
    cfg.workers = WORKERS;
    cfg.proxy.client_first_byte_timeout = first_byte_timeout;
    let lb = TestBalancer::start(cfg);
    let silent: Vec<TcpStream> = (0..SILENT).map(|_| connect(lb.addr)).collect();
    until("every silent client accepted", || {
        lb.stats.snapshot().accepted == SILENT as u64
    });
    let started = Instant::now();
    let mut normal: Vec<TcpStream> = (0..NORMAL)
        .map(|i| {
            let mut s = connect(lb.addr);
            s.write_all(&[i as u8]).unwrap();
            s
        })
        .collect();
    let mut served = 0;
    let mut last = Duration::ZERO;
    for (i, s) in normal.iter_mut().enumerate() {
        let left = within.saturating_sub(started.elapsed());
        if left.is_zero() {
            break;
        }
        s.set_read_timeout(Some(left)).unwrap();
        let mut b = [0u8];
        if s.read_exact(&mut b).is_ok() && b[0] == i as u8 {
            served += 1;
            last = started.elapsed();
        }
    }
    (silent, lb, served, last, backend)
}

/// Today's behaviour, measured: with the timeout off, the 2,000 silent
/// clients hold all 256 workers (for the idle timeout, 30 s here) and none
/// of the 200 normal requests is served within 3 s.
#[test]
fn without_the_timeout_silent_clients_starve_everyone() {
    let (silent, lb, served, _, backend) = silent_then_normal(None, Duration::from_secs(3));
    eprintln!("first-byte timeout off: {served}/{NORMAL} normal requests served within 3 s");
    assert_eq!(served, 0);
    assert_eq!(lb.stats.snapshot().workers_busy, WORKERS as u64);
    drop(silent);
    lb.stop();
    drop(backend);
}

/// With a 300 ms first-byte timeout, every normal request is served within
/// 5 s while the silent clients are still held open by the test, and every
/// silent client is closed and counted.
#[test]
fn with_the_timeout_normal_requests_are_served() {
    let limit = Duration::from_millis(300);
    let (silent, lb, served, last, backend) =
        silent_then_normal(Some(limit), Duration::from_secs(5));
    eprintln!(
        "first-byte timeout {limit:?}: {served}/{NORMAL} normal requests served, the last after {last:?}"
    );
    assert_eq!(served, NORMAL);
    assert!(
        wait_for(Duration::from_secs(10), || lb
            .stats
            .snapshot()
            .first_byte_timeouts
            == SILENT as u64),
        "{} silent clients closed",
        lb.stats.snapshot().first_byte_timeouts
    );
    drop(silent);
    lb.stop();
    drop(backend);
}
