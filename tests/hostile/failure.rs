//! Failure under pressure: dead backends, exhausted descriptors and threads, the pool after a flood.

// ---------------------------------------------------------------------------
// Health checks at the descriptor ceiling. A check that cannot even open its
// socket (EMFILE) failed because of this host, not because of the backend:
// it must not take a healthy backend out of the rotation.
// ---------------------------------------------------------------------------

/// Active health checks while the balancer is out of file descriptors.
mod checks_at_the_descriptor_ceiling {
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpStream};
    use std::process::Command;
    use std::time::Duration;

    use crate::common::{self, wait_for, TestBackend};
    use crate::peers::{self, Peer};

    const BIN: &str = env!("CARGO_BIN_EXE_rodizio");
    /// Small enough for a few dozen clients to use every descriptor.
    const NOFILE: libc::rlim_t = 64;
    /// More clients than the limit lets in: the others wait in the backlog.
    const FLOOD: usize = 120;
    /// Longest wait for anything the test polls for.
    const TIMEOUT: Duration = Duration::from_secs(20);
    /// Words of the throttled warning about a check that failed here.
    const LOCAL_WARNING: &str = "not counted against the backend";

    /// The binary with `RLIMIT_NOFILE` at [`NOFILE`] (soft and hard, so it
    /// cannot raise it) and a check every 100 ms that takes a backend out
    /// at the first failure; returns it with the port it listens on.
    fn start(backend: SocketAddr) -> (Peer, SocketAddr) {
        let dir = peers::temp_dir("checks-at-the-ceiling");
        let mut cmd = Command::new(BIN);
        cmd.args(["-l", "127.0.0.1:0", "-b", &backend.to_string()])
            .args(["--health-interval", "100ms", "--health-timeout", "1s"])
            .args(["--fall", "1", "--rise", "1"])
            .env("RUST_LOG", "info");
        common::limit_in_child(&mut cmd, libc::RLIMIT_NOFILE, NOFILE);
        let rodizio = Peer::spawn("rodizio", cmd, libc::SIGTERM, &dir);
        let mut port = None;
        let found = wait_for(TIMEOUT, || {
            port = rodizio
                .output()
                .lines()
                .find_map(|l| l.strip_prefix("Load balancer listening on port "))
                .and_then(|p| p.trim().parse::<u16>().ok());
            port.is_some()
        });
        assert!(found, "no listening line:\n{}", rodizio.output());
        (rodizio, peers::loopback(port.unwrap_or_default()))
    }

    /// One byte through the balancer and back from the echo backend.
    fn served(addr: SocketAddr) -> bool {
        let Ok(mut s) = common::connect(addr) else {
            return false;
        };
        let mut b = [0u8];
        s.write_all(b"h").is_ok() && s.read_exact(&mut b).is_ok() && b == *b"h"
    }

    /// A flood of held clients uses every descriptor of a balancer checking
    /// its one healthy backend every 100 ms with `--fall 1`. Each check then
    /// fails with EMFILE: the balancer says so in a throttled warning (seen
    /// twice, so at least a second and about ten rounds pass under the
    /// flood), never marks the backend DOWN, and serves clients again once
    /// the flood is released.
    #[test]
    fn checks_failing_for_want_of_descriptors_do_not_mark_a_backend_down() {
        let backend = TestBackend::echo();
        let (mut rodizio, addr) = start(backend.addr());
        assert!(served(addr), "not served before the flood");
        let flood: Vec<TcpStream> = (0..FLOOD)
            .map(|i| common::connect(addr).unwrap_or_else(|e| panic!("client {i}: {e}")))
            .collect();
        let down = |log: &str| log.contains("is now DOWN");
        // Two warnings: the first, and one a second later with the count
        // of the checks in between.
        let rounds_seen = |log: &str| {
            log.lines()
                .filter(|l| l.contains(LOCAL_WARNING))
                .any(|l| l.contains("more since the last such line"))
        };
        wait_for(TIMEOUT, || {
            let log = rodizio.output();
            down(&log) || rounds_seen(&log)
        });
        let log = rodizio.output();
        assert!(!down(&log), "a healthy backend went DOWN:\n{log}");
        assert!(
            rounds_seen(&log),
            "no repeated warning about checks failing here:\n{log}"
        );
        drop(flood);
        let mut tries = 0;
        let back = wait_for(TIMEOUT, || {
            tries += 1;
            tries <= 1000 && served(addr)
        });
        let log = rodizio.output();
        assert!(back, "not served after the flood:\n{log}");
        assert!(!down(&log), "a healthy backend went DOWN:\n{log}");
        rodizio.stop();
        let log = rodizio.output();
        eprintln!("{log}");
        assert!(!log.contains("panicked"), "{log}");
    }
}
