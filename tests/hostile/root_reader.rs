//! The root reader and the link to it: the serving side's end
//! ([`Client`]) against a reader that lies about a length, announces a
//! huge reply, sends garbage, stalls, trickles or dies mid-reply; the
//! reader's loop ([`serve`]) against garbage requests, a lying path
//! length, files the settings do not name and a FIFO they do; and the
//! binary, started as root with `user nobody`, whose reader is killed:
//! the reload fails in one line, the running settings stay and clients
//! are served, and the next reload says the reader is gone.
//!
//! Each peer is a thread of the test on one end of a Unix stream pair,
//! every socket with a timeout; the binary is stopped by its PID.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use rodizio::files::protocol::{self, Client, Request};
use rodizio::files::reader::serve;
use rodizio::system::FileError;

use crate::child::{self, Child, Scratch};
use crate::common::wait_for;
use crate::tls_certs::{connect, subject_of, Certs};

/// How long the client waits for one answer in these tests.
const TIMEOUT: Duration = Duration::from_millis(300);
/// Longest any refusal here may take.
const WAIT: Duration = Duration::from_secs(10);

/// A client whose reader is `peer`, run on a thread with the other end
/// (its request already read); the client and the thread.
fn against(peer: impl FnOnce(UnixStream) + Send + 'static) -> (Client, thread::JoinHandle<()>) {
    let (ours, theirs) = UnixStream::pair().unwrap();
    theirs.set_read_timeout(Some(WAIT)).unwrap();
    theirs.set_write_timeout(Some(WAIT)).unwrap();
    let thread = thread::spawn(move || {
        let mut from = &theirs;
        assert!(matches!(
            protocol::read_request(&mut from),
            Ok(Some(Request::File { .. }))
        ));
        peer(theirs);
    });
    (Client::new(ours, None, TIMEOUT), thread)
}

/// The words of a failed read.
fn failure(read: Result<Vec<u8>, FileError>) -> String {
    match read {
        Err(FileError::Io(e)) => e.to_string(),
        other => panic!("not a failed link: {other:?}"),
    }
}

/// A first read of `client` fails within the deadline with `words`, and
/// every later one says the reader stopped.
fn fails_for_good(client: &Client, words: &str) {
    let started = Instant::now();
    let first = failure(client.read(Path::new("/etc/site.pem"), 100));
    assert!(first.contains(words), "{first}");
    assert!(first.contains("restart rodizio"), "{first}");
    assert!(started.elapsed() < TIMEOUT + Duration::from_secs(2));
    let later = failure(client.read(Path::new("/etc/site.pem"), 100));
    assert!(later.contains("stopped at an earlier reload"), "{later}");
}

/// Announces 100 bytes, sends 10, then holds the link open: the read
/// ends at the deadline, not when the peer pleases.
#[test]
fn a_reply_that_lies_about_its_length_ends_at_the_deadline() {
    let (client, peer) = against(|mut s| {
        let _ = s.write_all(&[0, 0, 0, 0, 100]);
        let _ = s.write_all(b"0123456789");
        let _ = s.read(&mut [0u8; 1]);
    });
    fails_for_good(&client, "did not answer in time");
    drop(client);
    peer.join().unwrap();
}

/// Announces 10 bytes and dies after 3: the link is closed, said so.
#[test]
fn a_reader_that_dies_mid_reply_is_told() {
    let (client, peer) = against(|mut s| {
        let _ = s.write_all(&[0, 0, 0, 0, 10, b'a', b'b', b'c']);
    });
    fails_for_good(&client, "closed the link");
    peer.join().unwrap();
}

/// A length of 4 GiB is refused from the header, nothing allocated, and
/// more than the size asked likewise.
#[test]
fn a_huge_reply_is_refused_from_its_header() {
    let (client, peer) = against(|mut s| {
        let _ = s.write_all(&[0, 0xff, 0xff, 0xff, 0xff]);
        let _ = s.read(&mut [0u8; 1]);
    });
    fails_for_good(&client, "announced 4294967295 bytes where at most 100");
    drop(client);
    peer.join().unwrap();
    let (client, peer) = against(|mut s| {
        let _ = s.write_all(&[0, 0, 0, 0, 101]);
        let _ = s.write_all(&[b'x'; 101]);
    });
    fails_for_good(&client, "announced 101 bytes");
    peer.join().unwrap();
}

/// Garbage for a reply: an unknown status, or an error too short to
/// hold its number.
#[test]
fn garbage_ends_the_link() {
    let (client, peer) = against(|mut s| {
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\n\r\n");
    });
    fails_for_good(&client, "garbage");
    peer.join().unwrap();
    let (client, peer) = against(|mut s| {
        let _ = s.write_all(&[1, 0, 0, 0, 2, 0, 0]);
    });
    fails_for_good(&client, "garbage");
    peer.join().unwrap();
}

/// A reader that reads the request and never answers, and one that
/// answers a byte every 50 ms: both end at the deadline.
#[test]
fn a_stalled_or_trickling_reader_ends_at_the_deadline() {
    let (client, peer) = against(|mut s| {
        let _ = s.read(&mut [0u8; 1]);
    });
    fails_for_good(&client, "did not answer in time");
    drop(client);
    peer.join().unwrap();
    let (client, peer) = against(|mut s| {
        let mut reply = vec![0, 0, 0, 0, 50];
        reply.extend([b'x'; 50]);
        for byte in reply {
            if s.write_all(&[byte]).is_err() {
                return;
            }
            thread::sleep(Duration::from_millis(50));
        }
    });
    fails_for_good(&client, "did not answer in time");
    drop(client);
    peer.join().unwrap();
}

/// The reader's loop on a thread: `serve` with `named` as the only file
/// the settings name; the serving side's end.
fn reader(named: &Path) -> (UnixStream, thread::JoinHandle<()>) {
    let (ours, theirs) = UnixStream::pair().unwrap();
    ours.set_read_timeout(Some(WAIT)).unwrap();
    ours.set_write_timeout(Some(WAIT)).unwrap();
    let named = named.to_path_buf();
    let thread = thread::spawn(move || serve(theirs, None, &move |p: &Path| p == named));
    (ours, thread)
}

/// Ends within [`WAIT`], or fails the test.
fn ends(thread: thread::JoinHandle<()>) {
    assert!(
        wait_for(WAIT, || thread.is_finished()),
        "the reader did not end"
    );
    thread.join().unwrap();
}

/// Garbage, an unknown kind and a lying path length end the reader
/// (nothing allocated for the 4 GiB path); a request cut short too.
#[test]
fn the_reader_ends_on_a_garbage_request() {
    let dir = Scratch::new("root-reader");
    let named = dir.file("site.pem", "PEM");
    let attacks: [&[u8]; 4] = [
        b"GET / HTTP/1.1\r\n\r\n",
        &[9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        &[2, 0, 0, 0, 0, 0, 0, 0, 100, 0xff, 0xff, 0xff, 0xff],
        &[2, 0, 0, 0],
    ];
    for attack in attacks {
        let (mut ours, thread) = reader(&named);
        ours.write_all(attack).unwrap();
        ours.shutdown(std::net::Shutdown::Write).unwrap();
        let mut rest = Vec::new();
        let _ = ours.read_to_end(&mut rest);
        assert!(rest.is_empty(), "{attack:?} was answered: {rest:?}");
        ends(thread);
    }
}

/// A file the settings do not name is refused and the reader stays; a
/// FIFO they name is refused as not a regular file without blocking; the
/// config file is refused when none was given at start.
#[test]
fn the_reader_refuses_what_the_settings_do_not_name() {
    let dir = Scratch::new("root-reader-refuses");
    let fifo = dir.fifo("site.pem");
    let secret = dir.file("shadow", "root:x");
    let (ours, thread) = reader(&fifo);
    let client = Client::new(ours, None, WAIT);
    let words = failure(client.read(&secret, 100));
    assert!(words.contains("not a file the settings name"), "{words}");
    let started = Instant::now();
    assert!(matches!(
        client.read(&fifo, 100),
        Err(FileError::NotRegular)
    ));
    assert!(started.elapsed() < WAIT);
    drop(client);
    ends(thread);
    let (ours, thread) = reader(&fifo);
    let config = dir.path("rodizio.json");
    let client = Client::new(ours, Some(config.clone()), WAIT);
    let words = failure(client.read(&config, 100));
    assert!(words.contains("without a config file"), "{words}");
    drop(client);
    ends(thread);
}

/// The balancer's root reader killed: the reload fails in one line
/// naming it, the running settings stay (the certificate served is the
/// old one) and clients are served; the next reload says the reader is
/// gone. Needs root, as giving root up does.
#[test]
fn a_dead_reader_fails_the_reload_in_one_line_and_serving_goes_on() {
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: reads the effective user id.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test needs root");
    let certs = Certs::new();
    let pair = certs.issue("site", &["one.localhost", "localhost"], 1);
    std::fs::set_permissions(&pair.key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let config = certs.dir.join("rodizio.json");
    std::fs::write(
        &config,
        format!(
            r#"{{"listen": "127.0.0.1:0", "backends": ["127.0.0.1:1"], "health_check": "off",
                "user": "nobody", "tls_certs": [{}]}}"#,
            pair.json()
        ),
    )
    .unwrap();
    let r = Child::start(child::command(&["-c"]).arg(&config));
    let pid = r.pid();
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
    let reader: libc::pid_t = children.trim().parse().expect("one child, the reader");
    // SAFETY: kills the balancer's reader by its PID.
    assert_eq!(unsafe { libc::kill(reader, libc::SIGKILL) }, 0);
    certs.issue("site", &["two.localhost", "localhost"], 2);
    let refusals = |log: &str| {
        log.lines()
            .filter(|l| l.contains("reload refused"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    r.signal(libc::SIGHUP);
    assert!(
        wait_for(WAIT, || refusals(&r.log()).len() == 1),
        "{}",
        r.log()
    );
    let first = refusals(&r.log()).remove(0);
    assert!(first.contains("root reader failed"), "{first}");
    assert!(first.contains("closed the link (did it die?)"), "{first}");
    let served = || subject_of(&connect(r.addr, "localhost", &certs.ca()).unwrap());
    assert!(served().contains("one.localhost"));
    r.signal(libc::SIGHUP);
    assert!(
        wait_for(WAIT, || refusals(&r.log()).len() == 2),
        "{}",
        r.log()
    );
    let second = refusals(&r.log()).remove(1);
    assert!(second.contains("stopped at an earlier reload"), "{second}");
    assert!(served().contains("one.localhost"));
    let errors = r.log().lines().filter(|l| l.contains("ERROR")).count();
    assert_eq!(errors, 2, "{}", r.log());
}
