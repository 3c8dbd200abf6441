use super::*;
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;

/// A connected pair on loopback: (ours, the peer's).
fn pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let ours = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (theirs, _) = listener.accept().unwrap();
    theirs
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    (ours, theirs)
}

fn find(id: u64) -> Option<View> {
    table().list().into_iter().find(|v| v.id == id)
}

/// This thread's connection id now.
fn my_id() -> u64 {
    mine().map_or(0, |s| s.id.load(Relaxed))
}

#[test]
fn a_connection_is_listed_while_it_lives_and_a_kill_reaches_its_socket() {
    let (ours, mut theirs) = pair();
    let client = ours.peer_addr().unwrap();
    let how = Begin {
        service: Some("web".into()),
        ..Begin::default()
    };
    begin(client, ours.as_raw_fd(), how);
    let id = my_id();
    assert!(id > 0);
    moved(10, 20);
    let v = find(id).expect("listed");
    assert_eq!(
        (v.to_backend, v.to_client, v.phase),
        (10, 20, Phase::Waiting)
    );
    assert_eq!(v.service.as_deref(), Some("web"));
    assert_eq!(v.client, Some(client));
    assert!(!table().kill(id + 1_000_000, Kill::Killed), "no such id");
    assert!(!table().kill(0, Kill::Killed));
    assert!(table().kill(id, Kill::Killed));
    // The peer sees the end of stream at once: the socket was shut down.
    let mut buf = [0u8; 1];
    assert_eq!(theirs.read(&mut buf).unwrap(), 0);
    assert_eq!(killed(), Some(Kill::Killed));
    assert_eq!(end(), Some(Kill::Killed));
    assert!(find(id).is_none(), "off the table once ended");
    assert_eq!(end(), None, "a second end does nothing");
    assert!(!table().kill(id, Kill::Killed), "ended already");
}

#[test]
fn a_backend_down_ends_only_the_connections_whose_policy_says_close() {
    let (ours, _theirs) = pair();
    struct B;
    impl Peer for B {
        fn peer_name(&self) -> &str {
            "b:1"
        }
        fn peer_id(&self) -> u64 {
            u64::MAX - 7
        }
    }
    let run = |on_down| {
        let fd = ours.as_raw_fd();
        let client = ours.peer_addr().unwrap();
        std::thread::scope(|s| {
            s.spawn(move || {
                let how = Begin {
                    on_down,
                    ..Begin::default()
                };
                begin(client, -1, how);
                linked(Arc::new(B), fd, (None, None));
                // Shut down nothing real: the descriptors are cleared
                // before any kill (this test only counts).
                mine().unwrap().info.lock().fds = [-1, -1];
                let closed = table().backend_down(u64::MAX - 7);
                let why = end();
                (closed, why)
            })
            .join()
            .unwrap()
        })
    };
    assert_eq!(run(OnDown::Keep), (0, None));
    assert_eq!(run(OnDown::Close), (1, Some(Kill::Down)));
}

#[test]
fn the_lifetime_first_sends_the_client_its_fin_then_ends_both_ways() {
    let (ours, mut theirs) = pair();
    let how = Begin {
        lifetime: Some((Duration::from_millis(1), None)),
        fin: Duration::from_millis(50),
        ..Begin::default()
    };
    begin(ours.peer_addr().unwrap(), ours.as_raw_fd(), how);
    let slot = mine().unwrap();
    let at = slot.lifetime_at.load(Relaxed);
    watch::look(at);
    let mut buf = [0u8; 1];
    assert_eq!(theirs.read(&mut buf).unwrap(), 0, "the client got its FIN");
    assert_eq!(killed(), Some(Kill::MaxLifetime));
    let second = slot.lifetime_at.load(Relaxed);
    assert!(second >= at + 50, "{second} {at}");
    watch::look(second);
    assert_eq!(slot.lifetime_at.load(Relaxed), 0);
    assert_eq!(end(), Some(Kill::MaxLifetime));
}

#[test]
fn the_jitter_stays_within_its_bound_and_spreads() {
    let j = Some(Duration::from_secs(10));
    let all: Vec<Duration> = (1..200).map(|id| view::jitter(id, j)).collect();
    assert!(all.iter().all(|d| *d < Duration::from_secs(10)));
    let distinct: std::collections::HashSet<_> = all.iter().collect();
    assert!(distinct.len() > 150, "{}", distinct.len());
    assert_eq!(view::jitter(5, None), Duration::ZERO);
}

/// A backend's own policies survive the byte a reload stores them in,
/// every one of the nine pairs, "the service's" included.
#[test]
fn own_policies_round_trip_through_their_byte() {
    let downs = [None, Some(OnDown::Keep), Some(OnDown::Close)];
    let removals = [None, Some(Removal::Drain), Some(Removal::Close)];
    let mut seen = std::collections::HashSet::new();
    for on_down in downs {
        for on_removed in removals {
            let own = Own {
                on_down,
                on_removed,
            };
            assert_eq!(Own::from_bits(own.bits()), own);
            assert!(seen.insert(own.bits()), "{own:?} shares its byte");
        }
    }
    assert_eq!(Own::default().bits(), 0);
}
