//! A nameserver of `srv:` backends (a UDP socket of the test) that turns
//! hostile after a good answer: it answers garbage, sets the truncated
//! bit (and has no TCP), cuts its answer short, claims 10,000 records it
//! does not carry, or stops answering. Each lookup fails within its
//! deadline, and the backends stay as the last good answer made them. An
//! answer of 1,500 real records (about what one UDP message holds, targets uncompressed) gives
//! the first 64 backends only (`srv::MAX_RECORDS`), and a good answer
//! after it brings the list back to its one backend.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType};
use hickory_proto::rr::rdata::{A, SRV};
use hickory_proto::rr::{Name, RData, Record};

use crate::common::{time_until, TestBalancer};
use rodizio::backend::BackendSpec;
use rodizio::health::{CheckKind, HealthConfig};
use rodizio::srv::{Nameservers, MAX_RECORDS};

const NAME: &str = "_h._tcp.hostile.test";
const GOOD: u8 = 0;
const GARBAGE: u8 = 1;
const TRUNCATED: u8 = 2;
const CUT: u8 = 3;
const LIES: u8 = 4;
const MANY: u8 = 5;
const SILENT: u8 = 6;

/// The test's nameserver: answers each question as `mode` says.
struct FakeDns {
    addr: SocketAddr,
    mode: Arc<AtomicU8>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// The answer to `query`: `n` SRV records to `t.hostile.test`, ports
/// 9000.., and its address in the additional section.
fn answer(query: &Message, n: u16) -> Vec<u8> {
    let target = Name::from_ascii("t.hostile.test.").unwrap();
    let mut m = Message::new();
    m.set_id(query.id()).set_message_type(MessageType::Response);
    m.add_queries(query.queries().to_vec());
    let owner = query.queries()[0].name().clone();
    for i in 0..n {
        m.add_answer(Record::from_rdata(
            owner.clone(),
            1,
            RData::SRV(SRV::new(0, 5, 9000 + i, target.clone())),
        ));
    }
    m.add_additional(Record::from_rdata(
        target,
        1,
        RData::A(A::new(127, 0, 0, 1)),
    ));
    m.to_vec().unwrap()
}

impl FakeDns {
    fn start() -> FakeDns {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let addr = socket.local_addr().unwrap();
        let mode = Arc::new(AtomicU8::new(GOOD));
        let stop = Arc::new(AtomicBool::new(false));
        let (m, s) = (Arc::clone(&mode), Arc::clone(&stop));
        let thread = thread::spawn(move || {
            let mut buf = [0u8; 512];
            while !s.load(Ordering::SeqCst) {
                let Ok((n, from)) = socket.recv_from(&mut buf) else {
                    continue;
                };
                let Ok(query) = Message::from_vec(&buf[..n]) else {
                    continue;
                };
                let good = answer(&query, 1);
                let reply = match m.load(Ordering::SeqCst) {
                    GARBAGE => b"\x12\x34\xff\xff garbage, not DNS at all".to_vec(),
                    TRUNCATED => {
                        let mut r = good;
                        r[2] |= 0x02;
                        r
                    }
                    CUT => good[..good.len() - 7].to_vec(),
                    LIES => {
                        let mut r = good;
                        r[6..8].copy_from_slice(&10_000u16.to_be_bytes());
                        r
                    }
                    MANY => answer(&query, 1500),
                    SILENT => continue,
                    _ => good,
                };
                let _ = socket.send_to(&reply, from);
            }
        });
        FakeDns {
            addr,
            mode,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for FakeDns {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn a_hostile_nameserver_leaves_the_last_good_list() {
    let dns = FakeDns::start();
    let lb = TestBalancer::with(&[], |config| {
        config.backends = vec![BackendSpec::parse(&format!("srv:{NAME}")).unwrap()];
        config.proxy.resolvers = Some(Nameservers(vec![dns.addr]));
        config.health = HealthConfig {
            check: CheckKind::Off,
            ..HealthConfig::default()
        };
    });
    let s = Arc::clone(&lb.scheduler);
    let names = || -> Vec<String> { s.snapshot().iter().map(|b| b.name().to_string()).collect() };
    assert_eq!(names(), vec!["t.hostile.test:9000".to_string()]);
    let limit = Duration::from_secs(30);
    for mode in [GARBAGE, TRUNCATED, CUT, LIES, SILENT] {
        dns.mode.store(mode, Ordering::SeqCst);
        let errors = rodizio::lookup::SRV.errors();
        time_until(limit, || rodizio::lookup::SRV.errors() > errors)
            .unwrap_or_else(|| panic!("mode {mode}: no failed lookup"));
        assert_eq!(
            names(),
            vec!["t.hostile.test:9000".to_string()],
            "mode {mode}"
        );
        assert!(s.snapshot()[0].is_available(), "mode {mode}");
    }
    dns.mode.store(MANY, Ordering::SeqCst);
    time_until(limit, || s.snapshot().len() == MAX_RECORDS).expect("the first 64 records taken");
    assert_eq!(s.snapshot().len(), MAX_RECORDS);
    dns.mode.store(GOOD, Ordering::SeqCst);
    time_until(limit, || names() == vec!["t.hostile.test:9000".to_string()])
        .expect("back to the one record, the others drained and removed");
}
