//! Open connections carried through the upgrade socket (`upgrade_socket`),
//! attacked from both ends once the listening sockets have gone over.
//!
//! A fake running process in front of a real new one, after its `OK`:
//! garbage instead of `C`, too few words, one descriptor, descriptors that
//! are not connected TCP sockets (a file, a pipe, a listener, UDP, one
//! never connected, one its client reset mid-way), a client socket that
//! lies about its peer, a service
//! or backend the new one does not have, a length over 16 MiB, byte counts
//! that would overflow the pump's sums, data cut
//! short, data with a descriptor, data where a line belongs, silence, a
//! close, `TOOK` answered with garbage or a close instead of `GO`. The new
//! process answers `NO` or says why in one line, serves on, pumps nothing
//! it was not told `GO` for, and closes every descriptor it was sent. A
//! well-formed `C` with bytes (and an end of stream) waiting is carried
//! and delivered in order.
//!
//! A fake new process in front of a real running one with open
//! connections: it takes the first `C`, then closes, says garbage, says
//! `TOOK` and vanishes (before or after `GO` is there), or says `NO`. The
//! running one serves on, the connections it kept echo byte for byte (one
//! whose `GO` went out is gone whole, never served twice), and a real
//! upgrade afterwards carries every one left.
//!
//! A real new process out of descriptors in the middle of the hand-over:
//! it keeps what it took, the old one keeps the rest, nothing is lost.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::Duration;

use rodizio::upgrade::{wire, HELLO};
use socket2::{Domain, SockAddr, Socket, Type};

use crate::child::{self, Child, Scratch};
use crate::common::{connect, is_closed, test_data, wait_for, TestBackend};

/// Longest wait for a step of a hand-over (the processes wait 5 s a
/// message).
const WAIT: Duration = Duration::from_secs(15);

/// A `SOCK_SEQPACKET` socket with every wait bounded.
fn seqpacket() -> Socket {
    let socket = Socket::new(Domain::UNIX, Type::SEQPACKET, None).unwrap();
    socket.set_read_timeout(Some(WAIT)).unwrap();
    socket.set_write_timeout(Some(WAIT)).unwrap();
    socket
}

/// One echo through the balancer at `addr`, on a new connection.
fn echoes(addr: SocketAddr) -> bool {
    let data = std::sync::Arc::new(b"still here".to_vec());
    connect(addr)
        .and_then(|s| crate::common::echo_through(s, data))
        .is_ok_and(|got| got == b"still here")
}

/// `data` sent on an open connection comes back byte for byte.
fn echo_open(s: &mut TcpStream, data: &[u8]) -> bool {
    let mut back = vec![0u8; data.len()];
    s.write_all(data).is_ok() && s.read_exact(&mut back).is_ok() && back == data
}

/// A client connection as a running process holds it: the client's end
/// (the test's), the accepted end (the client socket to hand over, whose
/// peer is the client's address) and a socket connected to `backend`.
fn open_pair(backend: SocketAddr) -> (TcpStream, TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let client = connect(listener.local_addr().unwrap()).unwrap();
    // Already in the queue: the accept returns at once.
    let (accepted, _) = listener.accept().unwrap();
    accepted.set_read_timeout(Some(WAIT)).unwrap();
    accepted.set_write_timeout(Some(WAIT)).unwrap();
    (client, accepted, connect(backend).unwrap())
}

/// The `C` line of connection `id` of `client` (`SERVICE BACKEND`
/// `names`), `lens` bytes to follow each way.
fn offer(id: u32, names: &str, client: SocketAddr, lens: [usize; 2]) -> String {
    let [up, down] = lens;
    format!("C {id} {names} {client} 1500 6 6 - - {up} {down}")
}

/// `default ECHO`: the one service and its backend.
fn ours(echo: SocketAddr) -> String {
    format!("default {echo}")
}

/// [`offer`] for a real pair (`acc`, `back`), sent with both sockets.
fn send_pair(
    c: &Socket,
    id: u32,
    echo: SocketAddr,
    pair: (&TcpStream, &TcpStream),
    lens: [usize; 2],
) {
    let line = offer(id, &ours(echo), pair.0.peer_addr().unwrap(), lens);
    wire::send_fds(c, &line, &[pair.0.as_raw_fd(), pair.1.as_raw_fd()]).unwrap();
}

/// A real new rodizio that took its address from a fake running process
/// and said `OK`; the fake's side of the hand-over.
struct Handed {
    new: Child,
    conn: Socket,
    addr: SocketAddr,
    /// The new process's descriptors when it said `OK`.
    fds: usize,
}

/// Starts a new rodizio (in front of `echo`) against a fake running
/// process at `path`, which hands it a listening socket of its own, the
/// upgrade socket and `END`, and waits for `OK`.
fn hand_to_new(path: &Path, echo: SocketAddr) -> Handed {
    let old = seqpacket();
    old.bind(&SockAddr::unix(path).unwrap()).unwrap();
    old.listen(16).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut command = child::command(&["--allow-root", "--health-check", "off"]);
    command.args(["-l", &addr.to_string(), "-b", &echo.to_string()]);
    let mut new = Child::spawn(command.arg("--upgrade-socket").arg(path));
    let (conn, _) = old.accept().unwrap();
    conn.set_read_timeout(Some(WAIT)).unwrap();
    conn.set_write_timeout(Some(WAIT)).unwrap();
    assert_eq!(wire::recv(&conn).unwrap().0, HELLO);
    wire::send(&conn, &format!("L {addr}"), Some(listener.as_raw_fd())).unwrap();
    wire::send(&conn, "U", Some(old.as_raw_fd())).unwrap();
    wire::send(&conn, "END", None).unwrap();
    let (ok, fd) = wire::recv(&conn).unwrap();
    assert!(ok == "OK" && fd.is_none(), "{ok}");
    assert_eq!(new.listening(), addr);
    let fds = new.open_fds();
    Handed {
        new,
        conn,
        addr,
        fds,
    }
}

type Attack = Box<dyn FnOnce(&mut Handed)>;

/// `send`, then the new process's line saying `why`.
fn said(why: &'static str, send: impl FnOnce(&Socket) + 'static) -> Attack {
    Box::new(move |h: &mut Handed| {
        send(&h.conn);
        h.new.next_log(why);
    })
}

/// `line` with `fds` is answered `NO ID why` (the id `line` names); the
/// `BYE` after it is taken, the refusal counted.
fn answered_no(h: &mut Handed, line: &str, fds: &[RawFd], why: &str) {
    wire::send_fds(&h.conn, line, fds).unwrap();
    let id = line.split(' ').nth(1).unwrap();
    let (answer, fd) = wire::recv(&h.conn).unwrap();
    assert!(
        answer.starts_with(&format!("NO {id} ")) && answer.contains(why) && fd.is_none(),
        "wanted NO {id} ... {why}: {answer}"
    );
    wire::send(&h.conn, "BYE", None).unwrap();
    h.new.next_log("1 left with it");
}

/// A `C` line and descriptors from `make`, the first two sent (the others
/// held meanwhile), answered `NO ID why`.
fn no(why: &'static str, make: impl FnOnce() -> (String, Vec<OwnedFd>) + 'static) -> Attack {
    Box::new(move |h: &mut Handed| {
        let (line, fds) = make();
        let raw: Vec<RawFd> = fds.iter().take(2).map(AsRawFd::as_raw_fd).collect();
        answered_no(h, &line, &raw, why);
    })
}

/// A `C` for a real connection whose service or backend (`names`) the
/// new process does not have: refused, its copies closed
/// untouched (the connection still works end to end through the fake's).
fn refused(h: &mut Handed, echo: SocketAddr, id: u32, names: &str, why: &str) {
    let (mut client, mut acc, back) = open_pair(echo);
    let line = offer(id, names, acc.peer_addr().unwrap(), [0, 0]);
    answered_no(h, &line, &[acc.as_raw_fd(), back.as_raw_fd()], why);
    client.write_all(b"ping").unwrap();
    let mut got = [0u8; 4];
    acc.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"ping");
}

/// A `C` the new process takes (`TOOK`), then `then` instead of `GO` (a
/// close when `None`): it says why, and closes its copies without pumping:
/// its descriptors come back while the fake still holds its own, the
/// client's bytes sent before the offer are still unread, and once the
/// fake closes its copies the client sees the end.
fn took_no_go(h: &mut Handed, echo: SocketAddr, id: u32, then: Option<&str>) {
    let (mut client, mut acc, back) = open_pair(echo);
    client.write_all(b"ping").unwrap();
    send_pair(&h.conn, id, echo, (&acc, &back), [0, 0]);
    assert_eq!(wire::recv(&h.conn).unwrap().0, format!("TOOK {id}"));
    match then {
        Some(line) => {
            wire::send(&h.conn, line, None).unwrap();
            h.new.next_log(&format!("not GO {id}"));
        }
        None => {
            h.conn.shutdown(Shutdown::Both).unwrap();
            h.new
                .next_log("the previous rodizio: the other process closed");
        }
    }
    let back_to_ok = wait_for(WAIT, || h.new.open_fds() <= h.fds);
    assert!(back_to_ok, "the new process kept the sockets");
    let mut got = [0u8; 4];
    acc.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"ping", "the new process read the client");
    drop((acc, back));
    assert!(is_closed(&mut client), "the connection outlived every copy");
}

/// A well-formed `C` with bytes waiting each way (`hello` for the backend,
/// in two pieces, `world` for the client), `TOOK`, `GO`: the client gets
/// `world`, then the echo of `hello`, then the echo of what it sends, and
/// the end of stream after its own.
fn carried(h: &mut Handed, echo: SocketAddr) {
    let (mut client, acc, back) = open_pair(echo);
    send_pair(&h.conn, 12, echo, (&acc, &back), [5, 5]);
    for piece in [&b"hel"[..], b"lo", b"world"] {
        wire::send_data(&h.conn, piece).unwrap();
    }
    assert_eq!(wire::recv(&h.conn).unwrap().0, "TOOK 12");
    wire::send(&h.conn, "GO 12", None).unwrap();
    // As the running process would after GO.
    drop((acc, back));
    let mut got = [0u8; 10];
    client.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"worldhello", "{}", String::from_utf8_lossy(&got));
    assert!(echo_open(&mut client, b"again"));
    wire::send(&h.conn, "BYE", None).unwrap();
    h.new.next_log("1 open connection carried over");
    client.shutdown(Shutdown::Write).unwrap();
    assert_eq!(client.read(&mut got).unwrap(), 0, "no end of stream");
}

/// A `C` whose client's end of stream was seen (`e`) with `bye` before it,
/// not yet passed on: once carried, the backend gets both (the echo comes
/// back, then its end).
fn carried_end(h: &mut Handed, echo: SocketAddr) {
    let (mut client, mut acc, back) = open_pair(echo);
    client.write_all(b"bye").unwrap();
    client.shutdown(Shutdown::Write).unwrap();
    // Read as the running process had read them.
    acc.read_to_end(&mut Vec::new()).unwrap();
    let line = format!(
        "C 20 {} {} 9 3 0 e - 3 0",
        ours(echo),
        acc.peer_addr().unwrap()
    );
    wire::send_fds(&h.conn, &line, &[acc.as_raw_fd(), back.as_raw_fd()]).unwrap();
    wire::send_data(&h.conn, b"bye").unwrap();
    assert_eq!(wire::recv(&h.conn).unwrap().0, "TOOK 20");
    wire::send(&h.conn, "GO 20", None).unwrap();
    drop((acc, back));
    let mut got = Vec::new();
    client.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"bye");
}

/// Attacks a real new process, after its `OK`, with hostile connection
/// messages from a fake running process, each case against a fresh one:
/// it answers `NO` or names what was wrong in one line, never pumps what
/// it was not told `GO` for, serves new clients throughout, and once the
/// fake closed its descriptors are back to where they were at `OK` (none
/// of those it was sent kept). A well-formed `C` is carried with the bytes
/// waiting each way.
#[test]
fn a_hostile_running_process_cannot_break_or_leak_the_new_one() {
    let echo = TestBackend::echo();
    let e = echo.addr();
    let scratch = Scratch::new("carry-fake-old");
    let lying = "127.0.0.1:1".parse().unwrap();
    let text = |line: &'static str| move |c: &Socket| wire::send(c, line, None).unwrap();
    let cases: Vec<Attack> = vec![
        said(r#"said "GET / HTTP/1.1""#, text("GET / HTTP/1.1")),
        said(
            r#"said "C 2 default 127.0.0.1:1""#,
            text("C 2 default 127.0.0.1:1"),
        ),
        said(r#"said "C 3 default"#, move |c| {
            let (_client, acc, _back) = open_pair(e);
            let line = offer(3, &ours(e), acc.peer_addr().unwrap(), [0, 0]);
            wire::send_fds(c, &line, &[acc.as_raw_fd()]).unwrap();
        }),
        no("the client's socket is not a socket", move || {
            let null = std::fs::File::open("/dev/null").unwrap();
            let (pipe, _) = std::io::pipe().unwrap();
            (
                offer(4, &ours(e), lying, [0, 0]),
                vec![null.into(), pipe.into()],
            )
        }),
        no("the client's socket is listening", move || {
            let listening = TcpListener::bind("127.0.0.1:0").unwrap();
            let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
            (
                offer(5, &ours(e), lying, [0, 0]),
                vec![listening.into(), udp.into()],
            )
        }),
        no(
            "the backend's socket is a socket of another kind",
            move || {
                let (client, acc, _) = open_pair(e);
                let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
                udp.connect(e).unwrap();
                let line = offer(6, &ours(e), acc.peer_addr().unwrap(), [0, 0]);
                (line, vec![acc.into(), udp.into(), client.into()])
            },
        ),
        no(
            "the backend's socket is not a connected TCP socket",
            move || {
                let (client, acc, _) = open_pair(e);
                let unconnected = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
                let line = offer(7, &ours(e), acc.peer_addr().unwrap(), [0, 0]);
                (line, vec![acc.into(), unconnected.into(), client.into()])
            },
        ),
        // The client reset its connection while it was being handed over:
        // the socket the new process gets is no longer connected.
        no(
            "the client's socket is not a connected TCP socket",
            move || {
                let (client, acc, back) = open_pair(e);
                let line = offer(23, &ours(e), acc.peer_addr().unwrap(), [0, 0]);
                socket2::SockRef::from(&client)
                    .set_linger(Some(Duration::ZERO))
                    .unwrap();
                drop(client);
                assert!(is_closed(&mut acc.try_clone().unwrap()), "no reset seen");
                (line, vec![acc.into(), back.into()])
            },
        ),
        no(", not 127.0.0.1:1", move || {
            let (client, acc, back) = open_pair(e);
            let line = offer(8, &ours(e), lying, [0, 0]);
            (line, vec![acc.into(), back.into(), client.into()])
        }),
        said(r#"said "C 9 default"#, move |c| {
            let (_client, acc, back) = open_pair(e);
            send_pair(c, 9, e, (&acc, &back), [16 * 1024 * 1024 + 1, 0]);
        }),
        // Byte counts near the top of u64: the pump's sums would overflow.
        said(r#"said "C 22 default"#, move |c| {
            let (_client, acc, back) = open_pair(e);
            let line = offer(22, &ours(e), acc.peer_addr().unwrap(), [0, 0]).replace(
                " 1500 6 6 ",
                " 1500 9223372036854775808 9223372036854775808 ",
            );
            wire::send_fds(c, &line, &[acc.as_raw_fd(), back.as_raw_fd()]).unwrap();
        }),
        said(
            "the previous rodizio's data: the other process closed",
            move |c| {
                let (_client, acc, back) = open_pair(e);
                send_pair(c, 16, e, (&acc, &back), [1000, 0]);
                wire::send_data(c, &[b'x'; 10]).unwrap();
                c.shutdown(Shutdown::Both).unwrap();
            },
        ),
        said("a data message with a descriptor", move |c| {
            let (_client, acc, back) = open_pair(e);
            send_pair(c, 17, e, (&acc, &back), [6, 0]);
            wire::send(c, "hello", Some(acc.as_raw_fd())).unwrap();
        }),
        said("not one line of text", |c| {
            wire::send_data(c, &[0, 1, 2, 0xff, b'\n']).unwrap()
        }),
        said("drains; 0 open connections carried over", |c| {
            c.shutdown(Shutdown::Both).unwrap()
        }),
        // Silence: the new process's wait for a message (5 s) ends.
        said("the previous rodizio: no answer in time", |_| {}),
        Box::new(move |h| refused(h, e, 10, &format!("nope {e}"), "no service nope")),
        Box::new(move |h| refused(h, e, 11, "default 127.0.0.1:1", "no backend 127.0.0.1:1")),
        Box::new(move |h| took_no_go(h, e, 13, Some("GO 999"))),
        Box::new(move |h| took_no_go(h, e, 14, None)),
        Box::new(move |h| carried(h, e)),
        Box::new(move |h| carried_end(h, e)),
    ];
    for (name, attack) in cases.into_iter().enumerate() {
        eprintln!("case {name}");
        let mut h = hand_to_new(&scratch.path(&format!("{name}.sock")), e);
        attack(&mut h);
        assert!(h.new.alive(), "{name}");
        assert!(echoes(h.addr), "{name}: no echo through the new process");
        drop(h.conn);
        let (new, fds) = (&mut h.new, h.fds);
        let back = wait_for(WAIT, || new.open_fds() <= fds);
        assert!(back, "{name}: {} descriptors, {fds} at OK", new.open_fds());
        assert!(new.stop().is_some_and(|s| s.success()), "{name}");
    }
}

/// The fake new process's side up to the first offer: the hand-over of
/// the listening sockets (kept, as a new process would), `OK`, then the
/// first `C` with its two sockets and its data. The line's words and the
/// descriptors received.
fn first_offer(path: &Path) -> (Socket, Vec<String>, Vec<OwnedFd>) {
    let c = seqpacket();
    c.connect(&SockAddr::unix(path).unwrap()).unwrap();
    wire::send(&c, HELLO, None).unwrap();
    let mut kept = Vec::new();
    for _ in 0..8 {
        let (line, fd) = wire::recv(&c).unwrap();
        kept.extend(fd);
        if line == "END" {
            break;
        }
    }
    assert_eq!(kept.len(), 2, "a listening socket and the upgrade socket");
    wire::send(&c, "OK", None).unwrap();
    let (line, fds) = wire::recv_fds(&c).unwrap();
    let words: Vec<String> = line.split(' ').map(String::from).collect();
    let well_formed = words.len() == 12 && words[0] == "C" && fds.len() == 2;
    assert!(well_formed, "{line}");
    let len: usize = words[10].parse::<usize>().unwrap() + words[11].parse::<usize>().unwrap();
    let mut data = 0;
    while data < len {
        data += wire::recv_data(&c, len - data).unwrap().len();
    }
    kept.extend(fds);
    (c, words, kept)
}

/// Attacks a real running process with three open connections from a fake
/// new process that takes the first offered connection, then (a new
/// attempt each round) closes without answering, answers garbage, answers
/// `TOOK` and vanishes (racing the `GO`, then once `GO` is there unread),
/// or answers `NO`. After each round the running process serves on, says
/// `no hand-over`, its descriptors come back, and every open connection it
/// kept echoes byte for byte (one whose `GO` went out is gone whole, as its
/// log says). Then a real upgrade carries every open connection left.
#[test]
fn a_hostile_new_process_leaves_the_open_connections_serving() {
    let echo = TestBackend::echo();
    let scratch = Scratch::new("carry-fake-new");
    let path = scratch.path("up.sock");
    let echo_s = echo.addr().to_string();
    let args = format!(
        "-b {echo_s} --health-check off --upgrade-socket {}",
        path.display()
    );
    let args: Vec<&str> = args.split(' ').collect();
    let mut old = Child::on_loopback(&args, |_| {});
    let addr = old.addr;
    let mut open: Vec<TcpStream> = (0..3).map(|_| connect(addr).unwrap()).collect();
    let data = |round: u64, i: usize| test_data(20_000, round * 10 + i as u64);
    for (i, s) in open.iter_mut().enumerate() {
        assert!(echo_open(s, &data(0, i)));
    }
    let baseline = old.open_fds();
    for (round, attack) in ["close", "garbage", "took", "took, GO unread", "no"]
        .into_iter()
        .enumerate()
    {
        eprintln!("round {attack}");
        let (c, words, fds) = first_offer(&path);
        let (id, client) = (&words[1], &words[4]);
        // Its own service and backend; idle, nothing waiting either way.
        let names = [2, 3, 10, 11].map(|i| words[i].as_str());
        assert_eq!(names, ["default", &echo_s, "0", "0"], "{words:?}");
        let offered = open
            .iter()
            .position(|s| s.local_addr().unwrap().to_string() == *client)
            .unwrap_or_else(|| panic!("offered {client}, not an open connection"));
        match attack {
            "close" => drop(c),
            "garbage" => wire::send(&c, &format!("TAKEN {id}"), None).unwrap(),
            "took" => {
                wire::send(&c, &format!("TOOK {id}"), None).unwrap();
                drop(c);
            }
            "took, GO unread" => {
                wire::send(&c, &format!("TOOK {id}"), None).unwrap();
                // GO is there, not read: the close loses the connection.
                let mut p = libc::pollfd {
                    fd: c.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: poll(2) on one live descriptor.
                let ready = unsafe { libc::poll(&mut p, 1, WAIT.as_millis() as i32) };
                assert_eq!(ready, 1, "no GO");
                drop(c);
            }
            _ => {
                wire::send(&c, &format!("NO {id} because"), None).unwrap();
                drop(c);
                old.next_log(&format!("not take connection {id} of {client}"));
            }
        }
        drop(fds);
        let handed = old.next_log("to the new rodizio in");
        let why = old.next_log("no hand-over");
        let said = match attack {
            "close" => "the other process closed the socket",
            "garbage" => r#"said "TAKEN"#,
            _ => "the new process",
        };
        assert!(why.contains(said), "round {attack}: {why}");
        assert!(old.alive(), "round {attack}");
        assert!(echoes(addr), "round {attack}: no echo for a new client");
        let gone = handed.contains("handed 1 open connection ");
        let maybe = attack == "took";
        assert!(gone == (attack == "took, GO unread") || maybe, "{handed}");
        if gone {
            // GO went out before the close: the connection went with the
            // fake, which closed it; never served twice.
            assert!(is_closed(&mut open.remove(offered)), "round {attack}");
        }
        for (i, s) in open.iter_mut().enumerate() {
            assert!(
                echo_open(s, &data(round as u64 + 1, i)),
                "round {attack}: connection {i}"
            );
        }
        let back = wait_for(WAIT, || old.open_fds() <= baseline);
        assert!(back, "round {attack}: {} descriptors", old.open_fds());
    }
    assert!(!open.is_empty());
    let mut new = Child::start(&mut child::command(
        &[&["--allow-root", "-l", &addr.to_string()], &args[..]].concat(),
    ));
    let status = old.wait_exit(WAIT);
    assert!(status.is_some_and(|s| s.success()), "{}", old.output());
    let carried = format!("{} open connection", open.len());
    let handed = old.next_log("to the new rodizio in");
    assert!(handed.contains(&format!("handed {carried}")), "{handed}");
    assert!(new.next_log("carried over").contains(&carried));
    for (i, s) in open.iter_mut().enumerate() {
        assert!(echo_open(s, &data(9, i)), "connection {i} after");
    }
    assert!(echoes(addr));
    // Each ends as any other: the end of stream passed both ways.
    for (i, s) in open.iter_mut().enumerate() {
        s.shutdown(Shutdown::Write).unwrap();
        assert!(is_closed(s), "connection {i} did not end");
    }
    assert!(new.stop().is_some_and(|s| s.success()), "{}", new.output());
}

/// A new process out of descriptors (at most 64) while 60 connections
/// are handed to it: the kernel cannot give it a message's descriptors
/// (`MSG_CTRUNC`), so it stops taking, keeps those it took, and says so;
/// the old one sees the hand-over break, keeps the rest and goes on
/// accepting. Every connection still echoes, byte for byte, through one
/// process or the other; neither exits.
#[test]
fn a_new_process_out_of_descriptors_takes_what_it_can_and_the_old_keeps_the_rest() {
    let echo = TestBackend::echo();
    let scratch = Scratch::new("carry-new-emfile");
    let path = scratch.path("up.sock");
    let (backend, up) = (echo.addr().to_string(), path.to_str().unwrap().to_string());
    let args = [
        "-b",
        &backend,
        "--health-check",
        "off",
        "--upgrade-socket",
        &up,
    ];
    let mut old = Child::on_loopback(&args, |_| {});
    let addr = old.addr;
    let data = test_data(20_000, 7);
    let mut open: Vec<TcpStream> = (0..60).map(|_| connect(addr).unwrap()).collect();
    for s in &mut open {
        assert!(echo_open(s, &data));
    }
    let here = addr.to_string();
    let mut command = child::command(&[&["--allow-root", "-l", &here][..], &args].concat());
    crate::common::limit_in_child(&mut command, libc::RLIMIT_NOFILE, 64);
    let mut new = Child::start(&mut command);
    old.next_log("no hand-over");
    new.next_log("it keeps the others and serves on");
    let carried: usize = new
        .log()
        .split(" open connection")
        .next()
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(
        carried > 0 && carried < 60,
        "{carried} carried:\n{}",
        new.log()
    );
    eprintln!("{carried} of 60 carried before the new process ran out of descriptors");
    assert!(old.alive() && new.alive());
    for (i, s) in open.iter_mut().enumerate() {
        assert!(
            echo_open(s, &data),
            "connection {i} lost:\n{}\n{}",
            old.log(),
            new.log()
        );
    }
    drop(open);
    new.stop();
    old.stop();
}
