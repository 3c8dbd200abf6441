//! The agent check (HAProxy's `agent-check`): each backend's agent, asked
//! on its `agent_port`, steers it through the admin API's own state and
//! weight paths: `drain` stops new connections (the ones in flight go
//! on), `50%` halves its share of a weighted round robin, `down` takes it
//! out and `up` brings it back, and `/backends` shows what it said.

mod child;
mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use common::{connect, http_get, time_until, TestBackend, TestBalancer};
use rodizio::backend::BackendSpec;
use rodizio::health::{CheckKind, HealthConfig};
use rodizio::scheduler::Algorithm;

/// An agent answering each connection with the line it is told.
struct Agent {
    line: Arc<Mutex<String>>,
    server: TestBackend,
}

impl Agent {
    fn start(line: &str) -> Agent {
        let line = Arc::new(Mutex::new(line.to_string()));
        let said = Arc::clone(&line);
        let server = TestBackend::start(Arc::new(move |mut stream: TcpStream| {
            let text = format!("{}\n", said.lock());
            stream.write_all(text.as_bytes())
        }));
        Agent { line, server }
    }

    fn say(&self, line: &str) {
        *self.line.lock() = line.to_string();
    }

    fn port(&self) -> u16 {
        self.server.addr().port()
    }
}

/// `n` one-byte echoes through the balancer at `lb`, each on a connection
/// of its own.
fn echo_through(lb: SocketAddr, n: usize) {
    for i in 0..n {
        let mut s = connect(lb).unwrap();
        s.write_all(&[i as u8]).unwrap();
        let mut b = [0u8];
        s.read_exact(&mut b).unwrap();
        assert_eq!(b[0], i as u8);
    }
}

/// Two echo backends of weight 4 under weighted round robin, each with an
/// agent asked every 50 ms; service checks off.
fn setup() -> (TestBackend, TestBackend, Agent, Agent, TestBalancer) {
    let (a, b) = (TestBackend::echo(), TestBackend::echo());
    let (agent_a, agent_b) = (Agent::start("up 100%"), Agent::start("up"));
    let spec = |db: &TestBackend, agent: &Agent| {
        BackendSpec::parse(&format!(
            "{},weight=4,agent_port={},agent_interval=50ms",
            db.addr(),
            agent.port()
        ))
        .unwrap()
    };
    let lb = TestBalancer::with(&[], |config| {
        config.backends = vec![spec(&a, &agent_a), spec(&b, &agent_b)];
        config.algorithm = Algorithm::WeightedRoundRobin;
        config.health = HealthConfig {
            check: CheckKind::Off,
            timeout: Duration::from_millis(500),
            ..HealthConfig::default()
        };
        config.admin_listen = Some("127.0.0.1:0".parse().unwrap());
    });
    (a, b, agent_a, agent_b, lb)
}

const LIMIT: Duration = Duration::from_secs(20);

#[test]
fn drain_stops_new_connections_and_ready_brings_them_back() {
    let (a, b, agent_a, _agent_b, lb) = setup();
    let ba = lb.backend(a.addr());
    time_until(LIMIT, || ba.agent.last().is_some()).expect("the agent asked");
    // A connection to `a` in flight before the drain (weights 4 and 4
    // interleave: one of the first few lands there).
    let mut others = Vec::new();
    let mut held = None;
    for _ in 0..4 {
        let mut s = connect(lb.addr).unwrap();
        s.write_all(b"y").unwrap();
        let mut byte = [0u8];
        s.read_exact(&mut byte).unwrap();
        if ba.active() == 1 && held.is_none() {
            held = Some(s);
        } else {
            others.push(s);
        }
    }
    let mut held = held.expect("a connection to a");
    drop(others);
    agent_a.say("drain");
    time_until(LIMIT, || ba.state_name() == "draining").expect("drained by its agent");
    let before = (a.accepted(), b.accepted());
    echo_through(lb.addr, 40);
    assert_eq!(
        a.accepted(),
        before.0,
        "no new connection to a drained backend"
    );
    assert_eq!(b.accepted(), before.1 + 40);
    // The one in flight goes on.
    held.write_all(b"x").unwrap();
    let mut byte = [0u8];
    held.read_exact(&mut byte).unwrap();
    assert_eq!(&byte, b"x");
    drop(held);
    // `/backends` says what it said.
    let list = http_get(lb.admin.unwrap(), "/backends").unwrap().body;
    let list: serde_json::Value = serde_json::from_str(&list).unwrap();
    assert_eq!(list[0]["state"], "draining", "{list}");
    assert_eq!(list[0]["agent"]["answer"], "drain", "{list}");
    assert_eq!(list[0]["agent"]["port"], agent_a.port(), "{list}");
    assert_eq!(list[0]["origin"], "file", "{list}");
    agent_a.say("ready");
    time_until(LIMIT, || ba.state_name() == "up").expect("ready again");
    let before = a.accepted();
    echo_through(lb.addr, 40);
    assert!(a.accepted() >= before + 15, "serving again");
}

#[test]
fn fifty_percent_halves_the_share_and_down_then_up_restores() {
    let (a, b, agent_a, _agent_b, lb) = setup();
    let ba = lb.backend(a.addr());
    time_until(LIMIT, || ba.agent.last().is_some()).expect("the agent asked");
    echo_through(lb.addr, 400);
    let even = a.accepted();
    assert!(
        (170..=230).contains(&even),
        "weights 4 and 4: {even} of 400"
    );
    agent_a.say("up 50%");
    time_until(LIMIT, || ba.weight() == 2).expect("halved by its agent");
    assert_eq!(ba.configured_weight(), 4);
    let (a0, b0) = (a.accepted(), b.accepted());
    echo_through(lb.addr, 400);
    let (da, db) = (a.accepted() - a0, b.accepted() - b0);
    eprintln!("after 50%: {da} and {db} of 400");
    // Weights 2 and 4: a third.
    assert!((110..=160).contains(&da), "{da} of 400");
    assert_eq!(da + db, 400);
    agent_a.say("down 100%");
    time_until(LIMIT, || ba.state_name() == "down").expect("down by its agent");
    let a0 = a.accepted();
    echo_through(lb.addr, 20);
    assert_eq!(
        a.accepted(),
        a0,
        "no client to a backend its agent says down"
    );
    agent_a.say("up");
    time_until(LIMIT, || ba.state_name() == "up").expect("up again");
    let a0 = a.accepted();
    echo_through(lb.addr, 40);
    assert!(a.accepted() - a0 >= 15, "{} of 40", a.accepted() - a0);
}
