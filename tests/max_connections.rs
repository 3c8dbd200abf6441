//! A backend's `max_connections`, the service's queue and the `first`
//! algorithm, with real traffic: the backends count their own concurrent
//! connections, so a cap broken anywhere in the balancer shows at the
//! backend.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use rodizio::backend::BackendSpec;
use rodizio::scheduler::Algorithm;
use rodizio::Config;

use common::{connect, until, TestBackend, TestBalancer};

/// Connections open at the backend now, and the most seen at once.
#[derive(Default)]
struct Concurrency {
    now: AtomicUsize,
    peak: AtomicUsize,
}

impl Concurrency {
    fn enter(&self) {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
    }

    fn leave(&self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }

    fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }
}

/// A backend that reads one byte, works a little, says `ok` and closes.
/// It counts itself out before it answers: the balancer frees the slot
/// only after the answer and the close have passed, so the count it keeps
/// is never lower than the balancer's.
fn working_backend(count: Arc<Concurrency>) -> TestBackend {
    TestBackend::start(Arc::new(move |mut s: TcpStream| {
        count.enter();
        let mut b = [0u8];
        let read = s.read_exact(&mut b);
        // The work: long enough for the clients to pile up.
        thread::sleep(Duration::from_millis(5));
        count.leave();
        read?;
        s.write_all(b"ok")?;
        s.shutdown(Shutdown::Write)
    }))
}

/// A backend that writes the first byte it reads into `order`, then echoes
/// until its client closes: a connection held as long as the client wants.
fn held_backend(order: Arc<Mutex<Vec<u8>>>, count: Arc<Concurrency>) -> TestBackend {
    TestBackend::start(Arc::new(move |mut s: TcpStream| {
        count.enter();
        let mut b = [0u8];
        let got = s.read_exact(&mut b);
        if got.is_ok() {
            order.lock().unwrap().push(b[0]);
            let _ = s.write_all(&b);
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest);
        }
        count.leave();
        got
    }))
}

fn capped(backends: &[(std::net::SocketAddr, usize)]) -> Config {
    let mut cfg = common::config(&[]);
    cfg.backends = backends
        .iter()
        .map(|(a, n)| BackendSpec::parse(&format!("{a},max_connections={n}")).unwrap())
        .collect();
    cfg
}

/// A client that sends `id` and reads its echo: it holds a slot until
/// dropped.
fn holder(lb: &TestBalancer, id: u8) -> TcpStream {
    let mut s = connect(lb.addr).unwrap();
    s.write_all(&[id]).unwrap();
    let mut b = [0u8];
    s.read_exact(&mut b).unwrap();
    assert_eq!(b[0], id);
    s
}

/// 200 clients at once against a backend capped at 5: every one is served,
/// the backend never sees more than 5 at once (and does see 5), and once
/// they are gone nothing is left counted or waiting.
#[test]
fn a_capped_backend_is_never_over_its_cap_under_200_clients() {
    let count = Arc::new(Concurrency::default());
    let backend = working_backend(Arc::clone(&count));
    let lb = TestBalancer::start(capped(&[(backend.addr(), 5)]));
    let clients: Vec<_> = (0..200)
        .map(|_| {
            let addr = lb.addr;
            thread::spawn(move || {
                let mut s = connect(addr).unwrap();
                s.write_all(b"x").unwrap();
                let mut got = Vec::new();
                s.read_to_end(&mut got).unwrap();
                got
            })
        })
        .collect();
    for c in clients {
        assert_eq!(c.join().unwrap(), b"ok");
    }
    assert_eq!(backend.accepted(), 200);
    assert!(
        count.peak() <= 5,
        "the backend saw {} at once",
        count.peak()
    );
    assert_eq!(count.peak(), 5, "the cap was never reached: no test");
    let b = lb.backend(backend.addr());
    until("nothing left counted", || b.active() + b.pending() == 0);
    let s = lb.stats.snapshot();
    assert_eq!((s.queued, s.queue_full, s.queue_timeouts), (0, 0, 0));
    assert!(lb.scheduler.waitlist().is_empty());
    lb.stop();
}

/// Clients that arrive in order while the one slot is held are served in
/// that order as the holders leave one at a time.
#[test]
fn the_queue_drains_in_order() {
    let order = Arc::new(Mutex::new(Vec::new()));
    let count = Arc::new(Concurrency::default());
    let backend = held_backend(Arc::clone(&order), Arc::clone(&count));
    let lb = TestBalancer::start(capped(&[(backend.addr(), 1)]));
    let first = holder(&lb, 0);
    // Five more, each queued before the next connects.
    let mut waiting: Vec<TcpStream> = Vec::new();
    for id in 1..=5u8 {
        let mut s = connect(lb.addr).unwrap();
        s.write_all(&[id]).unwrap();
        waiting.push(s);
        until("the client waits in the queue", || {
            lb.stats.snapshot().queued == u64::from(id)
        });
    }
    let mut current = first;
    for id in 1..=5u8 {
        drop(current);
        let mut next = waiting.remove(0);
        let mut b = [0u8];
        next.read_exact(&mut b).unwrap();
        assert_eq!(b[0], id, "served out of order");
        current = next;
    }
    drop(current);
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3, 4, 5]);
    assert_eq!(count.peak(), 1);
    until("the queue is empty", || lb.stats.snapshot().queued == 0);
    lb.stop();
}

/// A client that waited `queue_timeout` for a slot gets the service's
/// refusal: a 503 with `http_replies`; counted, never sent to the backend.
#[test]
fn a_client_waiting_past_queue_timeout_gets_a_503() {
    let order = Arc::new(Mutex::new(Vec::new()));
    let count = Arc::new(Concurrency::default());
    let backend = held_backend(Arc::clone(&order), count);
    let mut cfg = capped(&[(backend.addr(), 1)]);
    cfg.proxy.queue_timeout = Duration::from_millis(300);
    cfg.health.http_replies = true;
    let lb = TestBalancer::start(cfg);
    let first = holder(&lb, 0);
    let mut late = connect(lb.addr).unwrap();
    late.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut got = String::new();
    late.read_to_string(&mut got).unwrap();
    assert!(got.starts_with("HTTP/1.1 503 "), "{got:?}");
    let s = lb.stats.snapshot();
    assert_eq!((s.queue_timeouts, s.queued), (1, 0));
    assert_eq!(backend.accepted(), 1);
    // The slot holder is still served; once it leaves, the next one is too.
    drop(first);
    drop(holder(&lb, 7));
    assert_eq!(*order.lock().unwrap(), [0, 7]);
    lb.stop();
}

/// `first` fills backend 1 up to its cap before backend 2 gets a client;
/// under the cap backend 2 gets nothing at all.
#[test]
fn first_fills_the_first_backend_to_its_cap_before_the_second() {
    let (c1, c2) = (Arc::default(), Arc::default());
    let order = Arc::new(Mutex::new(Vec::new()));
    let one = held_backend(Arc::clone(&order), Arc::clone(&c1));
    let two = held_backend(Arc::clone(&order), Arc::clone(&c2));
    let mut cfg = capped(&[(one.addr(), 3), (two.addr(), 3)]);
    cfg.algorithm = Algorithm::First;
    let lb = TestBalancer::start(cfg);
    // Below the cap: one client at a time (each over at the balancer
    // before the next), forty times.
    let b1 = lb.backend(one.addr());
    for i in 0..40 {
        drop(holder(&lb, i));
        until("the connection is over", || b1.active() + b1.pending() == 0);
    }
    assert_eq!((one.accepted(), two.accepted()), (40, 0));
    // Three held fill backend 1; the fourth goes to backend 2.
    let held: Vec<TcpStream> = (0..3).map(|i| holder(&lb, 100 + i)).collect();
    assert_eq!((one.accepted(), two.accepted()), (43, 0));
    let fourth = holder(&lb, 103);
    assert_eq!((one.accepted(), two.accepted()), (43, 1));
    assert_eq!((c1.peak(), c2.peak()), (3, 1));
    drop((held, fourth));
    lb.stop();
}

/// Every algorithm passes a full backend over: with round robin and
/// backend 1 capped at 2, the rest go to backend 2.
#[test]
fn round_robin_passes_a_full_backend_over() {
    let (c1, c2) = (Arc::new(Concurrency::default()), Arc::default());
    let order = Arc::new(Mutex::new(Vec::new()));
    let one = held_backend(Arc::clone(&order), Arc::clone(&c1));
    let two = held_backend(Arc::clone(&order), c2);
    let mut cfg = common::config(&[two.addr()]);
    cfg.backends.insert(
        0,
        BackendSpec::parse(&format!("{},max_connections=2", one.addr())).unwrap(),
    );
    let lb = TestBalancer::start(cfg);
    let held: Vec<TcpStream> = (0..10).map(|i| holder(&lb, i)).collect();
    assert_eq!((one.accepted(), two.accepted()), (2, 8));
    assert_eq!(c1.peak(), 2);
    drop(held);
    lb.stop();
}

/// A primary at its cap keeps its clients, a backup does not take them:
/// `A,max_connections=1`, `B` dead (a refusing port, not yet marked down)
/// and `C,backup`, with one connection held on A. Six new clients wait in
/// A's queue (those whose turn fell on B fail over to A's queue, not to
/// the backup), then A serves them one by one; the backup gets none.
/// With passive health on (3 failures) and off (0, B stays in rotation).
#[test]
fn a_full_primary_queues_its_clients_instead_of_the_backup() {
    for passive_failures in [3, 0] {
        let order = Arc::new(Mutex::new(Vec::new()));
        let on_backup = Arc::new(Mutex::new(Vec::new()));
        let a = held_backend(Arc::clone(&order), Arc::default());
        let c = held_backend(Arc::clone(&on_backup), Arc::default());
        let mut cfg = common::config(&[]);
        cfg.backends = vec![
            BackendSpec::parse(&format!("{},max_connections=1", a.addr())).unwrap(),
            BackendSpec::parse(&common::closed_port().to_string()).unwrap(),
            BackendSpec::parse(&format!("{},backup", c.addr())).unwrap(),
        ];
        cfg.health.passive_failures = passive_failures;
        let lb = TestBalancer::start(cfg);
        let first = holder(&lb, 0);
        let clients: Vec<_> = (1..=6u8)
            .map(|id| {
                let mut s = connect(lb.addr).unwrap();
                s.write_all(&[id]).unwrap();
                (id, s)
            })
            .collect();
        until("six clients wait in the queue", || {
            lb.stats.snapshot().queued == 6
        });
        assert_eq!(c.accepted(), 0, "the backup took a client");
        drop(first);
        // Each reads its echo and leaves, freeing A's slot for the next.
        let served: Vec<_> = clients
            .into_iter()
            .map(|(id, mut s)| {
                thread::spawn(move || {
                    let mut b = [0u8];
                    s.read_exact(&mut b).map(|()| b[0] == id)
                })
            })
            .collect();
        for (i, s) in served.into_iter().enumerate() {
            assert!(s.join().unwrap().unwrap(), "client {i} got another's echo");
        }
        let mut seen = order.lock().unwrap().clone();
        seen.sort_unstable();
        assert_eq!(
            seen,
            [0, 1, 2, 3, 4, 5, 6],
            "passive_failures {passive_failures}"
        );
        assert!(on_backup.lock().unwrap().is_empty());
        assert_eq!(c.accepted(), 0, "0 of 6 on the backup");
        lb.stop();
    }
}

/// A client failed over from a dead backend to a full primary waits in
/// its queue as any other, and past `queue_timeout` gets the queue's 503
/// (not the 502 of a backend that could not be reached); the backup gets
/// nothing.
#[test]
fn a_fail_over_that_waits_past_queue_timeout_gets_the_queue_s_503() {
    let order = Arc::new(Mutex::new(Vec::new()));
    let on_backup = Arc::new(Mutex::new(Vec::new()));
    let a = held_backend(Arc::clone(&order), Arc::default());
    let c = held_backend(Arc::clone(&on_backup), Arc::default());
    let dead = common::closed_port();
    let mut cfg = common::config(&[]);
    cfg.backends = vec![
        BackendSpec::parse(&format!("{},max_connections=1", a.addr())).unwrap(),
        BackendSpec::parse(&dead.to_string()).unwrap(),
        BackendSpec::parse(&format!("{},backup", c.addr())).unwrap(),
    ];
    cfg.health.passive_failures = 0;
    cfg.health.http_replies = true;
    cfg.proxy.queue_timeout = Duration::from_millis(300);
    let lb = TestBalancer::start(cfg);
    let first = holder(&lb, 0);
    // Round robin over A and B: two clients, so one of them is B's turn.
    for _ in 0..2 {
        let mut late = connect(lb.addr).unwrap();
        late.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
        let mut got = String::new();
        late.read_to_string(&mut got).unwrap();
        assert!(got.starts_with("HTTP/1.1 503 "), "{got:?}");
    }
    let s = lb.stats.snapshot();
    assert_eq!((s.queue_timeouts, s.queued), (2, 0));
    assert!(s.connect_failures >= 1, "no client had B's turn");
    assert_eq!(c.accepted(), 0, "the backup took a client");
    drop(first);
    lb.stop();
}
