//! A backend's agent (`agent_port`) that trickles, never ends its line,
//! sends a megabyte, garbage, resets, or never answers: each exchange is
//! cut at `health_timeout` or at 512 bytes, the backend stays as it was
//! (up, its configured weight), its agent's error says why, and the
//! warnings come at most once a second per backend.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::child::Child;
use crate::common::{http_get, time_until, TestBackend};

/// An agent running `then` on each connection.
fn agent(
    then: impl Fn(&mut TcpStream) -> std::io::Result<()> + Send + Sync + 'static,
) -> TestBackend {
    TestBackend::start(Arc::new(move |mut stream: TcpStream| then(&mut stream)))
}

/// Holds the connection until the balancer closes it (the stream has a
/// timeout).
fn hold(s: &mut TcpStream) -> std::io::Result<()> {
    let mut rest = [0u8; 64];
    while s.read(&mut rest)? > 0 {}
    Ok(())
}

#[test]
fn hostile_agents_leave_their_backends_as_they_were() {
    let trickle = agent(|s| {
        for b in b"drain 50%\n" {
            s.write_all(&[*b])?;
            thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    });
    let endless = agent(|s| {
        s.write_all(b"drain 50% and more")?;
        hold(s)
    });
    let huge = agent(|s| s.write_all(&vec![b'd'; 1 << 20]));
    let binary = agent(|s| s.write_all(b"\x00\xffdrain\x16\x03\n"));
    let words = agent(|s| s.write_all(b"drain sideways 50%\n"));
    let percent = agent(|s| s.write_all(b"down 5000%\n"));
    let reset = agent(|s| {
        socket2::SockRef::from(&*s).set_linger(Some(Duration::ZERO))?;
        Ok(())
    });
    let silent = agent(hold);
    let agents = [
        (&trickle, "no whole line"),
        (&endless, "no whole line"),
        (&huge, "512 bytes"),
        (&binary, "garbage: byte 0x00"),
        (&words, "garbage: unknown word 'sideways'"),
        (&percent, "garbage: unknown word '5000%'"),
        (&reset, ""),
        (&silent, "no whole line"),
    ];
    let dbs: Vec<TestBackend> = agents.iter().map(|_| TestBackend::echo()).collect();
    let mut args = vec![
        "-l".to_string(),
        "127.0.0.1:0".into(),
        "--health-check".into(),
        "off".into(),
        "--health-timeout".into(),
        "300ms".into(),
        "--admin".into(),
        "127.0.0.1:0".into(),
    ];
    for (db, (agent, _)) in dbs.iter().zip(&agents) {
        args.push("-b".into());
        args.push(format!(
            "{},weight=4,agent_port={},agent_interval=50ms",
            db.addr(),
            agent.addr().port()
        ));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let lb = Child::balancer(&args);
    let admin = lb.admin();
    let started = Instant::now();
    // Every agent asked several times.
    let asked = time_until(Duration::from_secs(30), || {
        agents.iter().all(|(a, _)| a.accepted() >= 4)
    });
    asked.expect("every agent asked four times");
    let list = http_get(admin, "/backends").unwrap().body;
    let list: serde_json::Value = serde_json::from_str(&list).unwrap();
    for (i, (_, why)) in agents.iter().enumerate() {
        let b = &list[i];
        assert_eq!(b["state"], "up", "{b}");
        assert_eq!(b["weight"], 4, "{b}");
        let error = b["agent"]["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{b}"));
        assert!(error.contains(why), "{why:?}: {b}");
        if let Some(answer) = b["agent"]["answer"].as_str() {
            assert!(answer.len() <= 80, "{answer}");
        }
    }
    // At most one warning a second per backend (and one more at the edge).
    let secs = started.elapsed().as_secs() + 2;
    let log = lb.log();
    for db in &dbs {
        let name = format!("agent of backend {}", db.addr());
        let lines = log.lines().filter(|l| l.contains(&name)).count() as u64;
        assert!(
            (1..=secs + 1).contains(&lines),
            "{lines} lines for {name} in {secs} s"
        );
    }
    let megabyte_sent = huge.accepted();
    assert!(megabyte_sent >= 4);
}
