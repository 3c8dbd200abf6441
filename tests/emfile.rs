//! Out of file descriptors: the binary started with `RLIMIT_NOFILE` 256 (a
//! limit it cannot raise) and 400 clients at once. Accept errors are
//! logged at most once a second with the count of the others, the accept
//! loop backs off instead of spinning, every client is served as
//! descriptors free up, and the descriptor count comes back to where it
//! was. A test binary of its own: it measures the child's CPU time.

mod child;
mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

use std::thread;
use std::time::{Duration, Instant};

use child::Child;
use common::{wait_for, TestBackend};

const NOFILE: libc::rlim_t = 256;
const CLIENTS: usize = 400;
const TIMEOUT: Duration = Duration::from_secs(30);

/// `rodizio -l 127.0.0.1:0 -b BACKEND` with the open-files limit set to
/// [`NOFILE`] (soft and hard) between fork and exec; returns it with the
/// address it listens on.
fn start(backend: SocketAddr) -> (Child, SocketAddr) {
    // No active checks: their sockets would come and go while the
    // descriptors are counted.
    let rodizio = Child::on_loopback(
        &["--health-check", "off", "-b", &backend.to_string()],
        |command| {
            command.env("RUST_LOG", "warn");
            // With RODIZIO_TEST_KERNEL_RELAY (make test's second pass), the
            // connections are promoted to the kernel relay.
            command.args(child::kernel_relay_flags());
            common::limit_in_child(command, libc::RLIMIT_NOFILE, NOFILE);
        },
    );
    let addr = rodizio.addr;
    (rodizio, addr)
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect_timeout(&addr, TIMEOUT).unwrap();
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    s.set_write_timeout(Some(TIMEOUT)).unwrap();
    s
}

fn round_trip(s: &mut TcpStream, byte: u8) -> bool {
    let mut b = [0u8];
    s.write_all(&[byte]).is_ok() && s.read_exact(&mut b).is_ok() && b[0] == byte
}

/// How many lines of `log` contain `needle`.
fn lines_with(log: &str, needle: &str) -> usize {
    log.lines().filter(|l| l.contains(needle)).count()
}

/// Reads each client's echo as it comes, in whatever order the balancer
/// serves them (which worker gets a freed descriptor first is not fixed),
/// and closes each once echoed, freeing its descriptors for the others.
/// How many got their own byte back before `deadline`; each one not served
/// is named.
fn serve_all(clients: Vec<TcpStream>, deadline: Instant) -> usize {
    use std::os::fd::AsRawFd;
    let mut open: Vec<(usize, TcpStream)> = clients.into_iter().enumerate().collect();
    let mut served = 0;
    while !open.is_empty() && Instant::now() < deadline {
        let mut fds: Vec<libc::pollfd> = open
            .iter()
            .map(|(_, s)| libc::pollfd {
                fd: s.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` is a live array of `fds.len()` pollfd entries.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 100) };
        assert!(ready >= 0, "poll: {}", std::io::Error::last_os_error());
        let mut still = Vec::with_capacity(open.len());
        for ((i, mut s), fd) in open.into_iter().zip(&fds) {
            if fd.revents == 0 {
                still.push((i, s));
                continue;
            }
            let mut b = [0u8];
            if s.read_exact(&mut b).is_ok() && b[0] == i as u8 {
                served += 1;
            } else {
                eprintln!("client {i} not served");
            }
        }
        open = still;
    }
    for (i, _) in &open {
        eprintln!("client {i} not served before the deadline");
    }
    served
}

/// 400 clients connect at once to a balancer limited to 256 descriptors;
/// each has sent a byte. Each is closed once echoed, so descriptors free
/// up one connection at a time.
#[test]
fn out_of_descriptors_logs_little_spins_never_and_serves_everyone() {
    let backend = TestBackend::echo();
    let (mut rodizio, addr) = start(backend.addr());
    // Served as usual before the flood. The baseline is counted while this
    // first connection is served (its two sockets, the client's and the
    // backend's, left out): by then the accept loop runs and holds all it
    // keeps, which the start-up line does not wait for.
    let mut first = connect(addr);
    assert!(round_trip(&mut first, b'w'));
    let baseline = rodizio.open_fds() - 2;
    let baseline_targets = rodizio.fd_targets();
    drop(first);

    let started = Instant::now();
    let clients: Vec<TcpStream> = (0..CLIENTS)
        .map(|i| {
            let mut s = connect(addr);
            s.write_all(&[i as u8]).unwrap();
            s
        })
        .collect();
    assert!(
        wait_for(TIMEOUT, || rodizio.log().contains("Too many open files")),
        "never ran out of descriptors; stderr: {}",
        rodizio.log()
    );
    // Stuck at the limit for a second: the back-off keeps the CPU idle.
    let before = rodizio.cpu_ticks();
    let window = Instant::now();
    thread::sleep(Duration::from_secs(1));
    let ticks = rodizio.cpu_ticks() - before;
    let window = window.elapsed();
    eprintln!("CPU while out of descriptors: {ticks} ticks in {window:?}");

    let served = serve_all(clients, started + 3 * TIMEOUT);
    let elapsed = started.elapsed();
    let log = rodizio.log();
    let accept_lines = lines_with(&log, "accept failed");
    eprintln!(
        "served {served}/{CLIENTS} in {elapsed:?}; {accept_lines} accept-error lines, {} log lines in all",
        log.lines().count()
    );
    eprintln!("log:\n{log}");
    assert_eq!(served, CLIENTS);
    assert!(
        ticks <= 10,
        "{ticks} ticks of CPU in {window:?} while stuck"
    );
    // At most one line a second from each of the two places that can run
    // out (accept, a worker's backend connect), plus the first of each.
    let most = elapsed.as_secs() as usize + 2;
    assert!(
        accept_lines <= most,
        "{accept_lines} accept-error lines in {elapsed:?}"
    );
    let out_of_fds_lines = lines_with(&log, "Too many open files");
    assert!(
        (1..=2 * most).contains(&out_of_fds_lines),
        "{out_of_fds_lines} lines about descriptors in {elapsed:?}"
    );
    assert!(
        wait_for(TIMEOUT, || rodizio.open_fds() == baseline),
        "descriptors: {} now {:?}, {baseline} before (with the first connection's two: {baseline_targets:?})",
        rodizio.open_fds(),
        rodizio.fd_targets()
    );
    assert!(rodizio.alive());
}
