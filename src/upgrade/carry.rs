//! The open connections of a hand-over (`upgrade_socket`): after the new
//! process said `OK` and this one stopped accepting, each connection on
//! the copy pump, on pipes (empty at that instant) or on the kernel relay
//! (which hands it back to the copy pump first) goes over:
//!
//! ```text
//! old → new   C ID SERVICE BACKEND CLIENT AGE_MS TO_BACKEND TO_CLIENT UP DOWN UP_LEN DOWN_LEN
//!             + the client's and the backend's sockets (SCM_RIGHTS)
//!             then UP_LEN, then DOWN_LEN bytes, in data messages of at most 64 KiB
//! new → old   TOOK ID              it can serve it (it holds the sockets, pumps nothing yet)
//!          or NO ID WHY            it cannot (another service, no such backend): the old one keeps it
//! old → new   GO ID                the new one pumps it; the old one closes its copies
//! ...
//! old → new   PING / new → old PONG   still there: the old one stops accepting
//!             (then the connections its queue still held, the same way)
//! old → new   BYE
//! ```
//!
//! `UP` and `DOWN` say what each direction saw: `e` its end of stream,
//! `d` that end passed on, `-` neither. The decision is the old process's:
//! the worker, paused since its offer, pumps on unless it sent `GO`; the
//! new process pumps nothing without `GO` (a `GO` lost with the old
//! process loses that connection, never doubles it: two processes never
//! read the same socket). A new process that goes silent or says anything
//! else ends the carrying; what was not sent stays and drains here.
//!
//! # Threads
//!
//! The old side runs on the upgrade thread, asking each worker in turn
//! (`connections::carry`); the new side in `Upgrade::serve`, once this
//! process accepts, handing each connection taken to the pool.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::collections::HashSet;
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use socket2::{SockRef, Socket, Type};

use super::{wire, words};
use crate::connections::carry::{self, Offer, Pending, State};
use crate::units::shown;

/// Longest wait for a worker's offer: one stopped elsewhere than in its
/// pump's wait (a TLS pump that was not one yet, a write in a `deliver`)
/// stays here.
const ASK_WAIT: Duration = Duration::from_millis(500);
/// The largest count (bytes moved, age in ms) a `C` message may give:
/// 2^56, far past anything real, far from the overflow of the pump's sums.
const MAX_COUNT: u64 = 1 << 56;
/// The most bytes a direction may carry: the largest `buffer_size`.
const MAX_PENDING: usize = crate::proxy::MAX_BUFFER_SIZE;

/// What a new process does with a connection it can serve: `Ok` with
/// what hands it to a worker once the old process says `GO` (dropped
/// without a call, the sockets are closed, untouched); `Err` in words.
pub type Carrier = Box<
    dyn Fn(TcpStream, TcpStream, State) -> std::result::Result<Box<dyn FnOnce() + Send>, String>
        + Send,
>;

/// The new process's [`Carrier`]: the service the state names, among
/// those `running` serves, makes the job (`Proxy::carried`: its backend
/// of that name), which goes to the pool at `GO`.
pub fn carrier(running: std::sync::Arc<crate::running::Running>) -> Carrier {
    Box::new(move |client, socket, state| {
        let name = state
            .service
            .as_deref()
            .unwrap_or(crate::config::DEFAULT_SERVICE);
        let service = running
            .find(name)
            .ok_or_else(|| format!("no service {name}"))?;
        let job = service.proxy.carried(client, socket, state)?;
        let pool = std::sync::Arc::clone(&running.pool);
        Ok(Box::new(move || {
            if let Err(job) = pool.submit(job) {
                log::warn!(
                    "a connection of {} carried over was closed: stopping",
                    job.peer
                );
            }
        }))
    })
}

/// How the carrying went.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Taken by the other process.
    pub carried: usize,
    /// Refused by it, or not offered in time: they end here.
    pub stayed: usize,
}

/// The old side, after `OK`: offers every connection it may carry to the
/// new process on `conn`, each once (`seen`). With `settle` (this process
/// no longer accepts), it also waits, at most a second (`SETTLE`), for the
/// connections its workers are still connecting. `Err` (in words) when
/// the new process stopped answering or said what is not the hand-over;
/// what it had not taken stays here.
///
/// # Errors
///
/// As above; the worker of the connection then offered pumps on.
pub fn send_all(
    conn: &Socket,
    seen: &mut HashSet<u64>,
    settle: bool,
) -> std::result::Result<(), String> {
    carry::begin();
    let started = Instant::now();
    let mut done = Counts::default();
    let result = rounds(conn, seen, settle, &mut done);
    carry::done();
    if done.carried + done.stayed > 0 {
        log::info!(
            "handed {} to the new rodizio in {:?}; {} stay here",
            crate::units::count(done.carried as u64, "open connection"),
            started.elapsed(),
            done.stayed
        );
    }
    result
}

/// Longest wait for connections still on their way to a backend once
/// this process no longer accepts.
const SETTLE: Duration = Duration::from_secs(1);

/// [`send_all`]'s rounds over the table.
fn rounds(
    conn: &Socket,
    seen: &mut HashSet<u64>,
    settle: bool,
    done: &mut Counts,
) -> std::result::Result<(), String> {
    let started = Instant::now();
    loop {
        let ids: Vec<u64> = carry::candidates()
            .into_iter()
            .filter(|id| seen.insert(*id))
            .collect();
        if ids.is_empty() {
            if !settle || carry::on_their_way() == 0 || started.elapsed() > SETTLE {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        round(conn, &ids, done)?;
    }
}

/// One round: the workers of `ids` asked at once, each offer sent over as
/// it comes; those that neither offer nor decline within [`ASK_WAIT`]
/// stay.
fn round(conn: &Socket, ids: &[u64], done: &mut Counts) -> std::result::Result<(), String> {
    const AGAIN: Duration = Duration::from_millis(20);
    let (to, offers) = crossbeam_channel::unbounded();
    let mut waiting = carry::ask_all(ids, &to);
    // The slots hold the only senders: once each has offered or
    // declined, the channel says so.
    drop(to);
    let mut last = Instant::now();
    let mut broken = None;
    while broken.is_none() && !waiting.is_empty() && last.elapsed() < ASK_WAIT {
        match offers.recv_timeout(AGAIN) {
            Ok(offer) => {
                last = Instant::now();
                waiting.retain(|&id| id != offer.state.id);
                broken = send_and_answer(conn, offer, done).err();
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => waiting = carry::wake(&waiting),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
        }
    }
    carry::cancel(&waiting);
    // Offers made before the asks were taken back: sent, unless the new
    // process is gone (then kept).
    while let Ok(offer) = offers.try_recv() {
        waiting.retain(|&id| id != offer.state.id);
        match broken {
            None => broken = send_and_answer(conn, offer, done).err(),
            Some(_) => {
                offer.answer(false);
                done.stayed += 1;
            }
        }
    }
    done.stayed += waiting.iter().filter(|&&id| carry::is_open(id)).count();
    broken.map_or(Ok(()), Err)
}

/// One offer sent over and its worker told the verdict.
fn send_and_answer(
    conn: &Socket,
    offer: Offer,
    done: &mut Counts,
) -> std::result::Result<(), String> {
    match send_one(conn, &offer) {
        Ok(taken) => {
            offer.answer(taken);
            if taken {
                done.carried += 1;
            } else {
                done.stayed += 1;
            }
            Ok(())
        }
        Err(why) => {
            offer.answer(false);
            done.stayed += 1;
            Err(why)
        }
    }
}

/// The old side, before it stops accepting: whether the new process is
/// still there (`PING`, answered `PONG`). One that went away after its
/// last answer would otherwise leave nobody accepting.
///
/// # Errors
///
/// In words, when it does not answer `PONG`.
pub fn confirm(conn: &Socket) -> std::result::Result<(), String> {
    let said = |e: io::Error| format!("the new process: {}", words(&e));
    wire::send(conn, "PING", None).map_err(said)?;
    match wire::recv(conn).map_err(said)? {
        (pong, None) if pong == "PONG" => Ok(()),
        (other, _) => Err(format!(
            "the new process said {:?}, not PONG",
            shown(&other, 80)
        )),
    }
}

/// One connection offered: whether the new process took it (`GO` sent).
fn send_one(conn: &Socket, offer: &Offer) -> std::result::Result<bool, String> {
    let s = &offer.state;
    let said = |e: io::Error| format!("the new process: {}", words(&e));
    let line = format!(
        "C {} {} {} {} {} {} {} {} {} {} {}",
        s.id,
        s.service
            .as_deref()
            .unwrap_or(crate::config::DEFAULT_SERVICE),
        s.backend,
        s.client,
        s.age_ms,
        s.to_backend,
        s.to_client,
        flags(&s.up),
        flags(&s.down),
        s.up.bytes.len(),
        s.down.bytes.len()
    );
    wire::send_fds(conn, &line, &offer.fds).map_err(said)?;
    for piece in
        s.up.bytes
            .chunks(wire::MAX_DATA)
            .chain(s.down.bytes.chunks(wire::MAX_DATA))
    {
        wire::send_data(conn, piece).map_err(said)?;
    }
    let (answer, fd) = wire::recv(conn).map_err(said)?;
    let (word, rest) = answer.split_once(' ').unwrap_or((answer.as_str(), ""));
    let id = s.id.to_string();
    match word {
        _ if fd.is_some() => Err("the new process sent a descriptor".into()),
        "TOOK" if rest == id => {
            // Not sent, the new process pumps nothing: this one goes on.
            Ok(wire::send(conn, &format!("GO {id}"), None).is_ok())
        }
        "NO" if rest.split(' ').next() == Some(&id) => {
            log::info!(
                "the new rodizio does not take connection {id} of {}: {}; it stays here",
                s.client,
                shown(rest.split_once(' ').map_or("", |r| r.1), 120)
            );
            Ok(false)
        }
        _ => Err(format!("the new process said {:?}", shown(&answer, 80))),
    }
}

/// A direction's ends as a word: `e` end of stream seen, `d` passed on.
fn flags(p: &Pending) -> &'static str {
    match (p.eof, p.done) {
        (false, false) => "-",
        (true, false) => "e",
        (false, true) => "d",
        (true, true) => "ed",
    }
}

/// The new side, after `OK`: takes the connections the previous process
/// offers on `conn` until its `BYE` (or its end), each to `carrier`,
/// counted in `done`.
///
/// # Errors
///
/// In words, when the previous process said what is not the hand-over;
/// the connections it offered since are its own.
pub fn take_all(
    conn: &Socket,
    carrier: &Carrier,
    done: &mut Counts,
) -> std::result::Result<(), String> {
    let said = |e: io::Error| format!("the previous rodizio: {}", words(&e));
    loop {
        let (line, fds) = match wire::recv_fds(conn) {
            Ok(message) => message,
            // It ended after its last connection.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(said(e)),
        };
        if line == "BYE" && fds.is_empty() {
            return Ok(());
        }
        if line == "PING" && fds.is_empty() {
            wire::send(conn, "PONG", None).map_err(said)?;
            continue;
        }
        let (state, [client, backend]) = read_offer(conn, &line, fds)?;
        let id = state.id;
        let checked = connected(&client, Some(state.client))
            .map_err(|why| format!("the client's socket {why}"))
            .and_then(|()| {
                connected(&backend, None).map_err(|why| format!("the backend's socket {why}"))
            });
        let taken = checked
            .and_then(|()| carrier(TcpStream::from(client), TcpStream::from(backend), state));
        match taken {
            Err(why) => {
                let why = shown(&why, 200);
                wire::send(conn, &format!("NO {id} {why}"), None).map_err(said)?;
                done.stayed += 1;
            }
            Ok(start) => {
                wire::send(conn, &format!("TOOK {id}"), None).map_err(said)?;
                let (go, fd) = wire::recv(conn).map_err(said)?;
                if go != format!("GO {id}") || fd.is_some() {
                    return Err(format!(
                        "the previous rodizio said {:?}, not GO {id}",
                        shown(&go, 80)
                    ));
                }
                start();
                done.carried += 1;
            }
        }
    }
}

/// A `C` message, its two descriptors and the data that follows: the
/// state, the client's descriptor and the backend's (checked by the
/// caller: one that is not what it should be refuses that connection,
/// not the hand-over).
fn read_offer(
    conn: &Socket,
    line: &str,
    fds: Vec<OwnedFd>,
) -> std::result::Result<(State, [OwnedFd; 2]), String> {
    let bad = || format!("the previous rodizio said {:?}", shown(line, 80));
    let words: Vec<&str> = line.split(' ').collect();
    let [c, id, service, backend, client, age, to_b, to_c, up, down, up_len, down_len] = words[..]
    else {
        return Err(bad());
    };
    let Ok([client_fd, backend_fd]) = <[OwnedFd; 2]>::try_from(fds) else {
        return Err(bad());
    };
    // Counts a connection could reach: far from overflowing a pump's sums.
    let num = |w: &str| {
        w.parse::<u64>()
            .ok()
            .filter(|&n| n <= MAX_COUNT)
            .ok_or_else(bad)
    };
    let len = |w: &str| {
        w.parse::<usize>()
            .ok()
            .filter(|&n| n <= MAX_PENDING)
            .ok_or_else(bad)
    };
    let client: SocketAddr = client.parse().map_err(|_| bad())?;
    if c != "C" || service.is_empty() || backend.is_empty() {
        return Err(bad());
    }
    let (up_len, down_len) = (len(up_len)?, len(down_len)?);
    let mut state = State {
        id: num(id)?,
        service: Some(service.to_string()),
        backend: backend.to_string(),
        client,
        age_ms: num(age)?,
        to_backend: num(to_b)?,
        to_client: num(to_c)?,
        up: pending(up).ok_or_else(bad)?,
        down: pending(down).ok_or_else(bad)?,
    };
    state.up.bytes = read_bytes(conn, up_len)?;
    state.down.bytes = read_bytes(conn, down_len)?;
    Ok((state, [client_fd, backend_fd]))
}

/// A direction's ends from its word (see [`flags`]).
fn pending(word: &str) -> Option<Pending> {
    let (eof, done) = match word {
        "-" => (false, false),
        "e" => (true, false),
        "d" => (false, true),
        "ed" => (true, true),
        _ => return None,
    };
    Some(Pending {
        bytes: Vec::new(),
        eof,
        done,
    })
}

/// `len` bytes in data messages.
fn read_bytes(conn: &Socket, len: usize) -> std::result::Result<Vec<u8>, String> {
    let mut bytes = Vec::with_capacity(len.min(wire::MAX_DATA));
    while bytes.len() < len {
        let piece = wire::recv_data(conn, len - bytes.len())
            .map_err(|e| format!("the previous rodizio's data: {}", words(&e)))?;
        bytes.extend_from_slice(&piece);
    }
    Ok(bytes)
}

/// Whether `fd` is a connected TCP socket (with `peer` at the other end,
/// when given).
fn connected(fd: &OwnedFd, peer: Option<SocketAddr>) -> std::result::Result<(), String> {
    let socket = SockRef::from(fd);
    match socket.r#type() {
        Ok(Type::STREAM) => {}
        Ok(_) => return Err("is a socket of another kind".into()),
        Err(_) => return Err("is not a socket".into()),
    }
    if socket.is_listener().unwrap_or(true) {
        return Err("is listening".into());
    }
    let at = socket.peer_addr().ok().and_then(|a| a.as_socket());
    match (at, peer) {
        (None, _) => Err("is not a connected TCP socket".into()),
        (Some(at), Some(peer)) if at != peer => Err(format!("is connected to {at}, not {peer}")),
        _ => Ok(()),
    }
}
