//! The deadlines' thread (`rodizio-conns`): a tenth of a second at a time,
//! it ends the connections whose deadline passed: the lifetime's two
//! steps (`max_connection_lifetime`: the client gets its FIN, then, a fin
//! timeout later, both sockets are shut down) and a removed backend's
//! drain (`removed_drain_timeout`).
//!
//! # Threads
//!
//! One thread, started with the first deadline and kept for the process's
//! life; it reads the slots' atomics and takes a slot's lock only for a
//! connection whose deadline passed.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Once;
use std::time::Duration;

use super::{now_ms, shutdown, Kill, Slot, TABLE};

/// How often the deadlines are looked at.
const TICK: Duration = Duration::from_millis(100);

/// Starts the thread, once.
pub(super) fn start() {
    static STARTED: Once = Once::new();
    STARTED.call_once(|| {
        let spawned = std::thread::Builder::new()
            .name("rodizio-conns".into())
            .stack_size(64 * 1024)
            .spawn(|| loop {
                std::thread::sleep(TICK);
                look(now_ms());
            });
        if let Err(e) = spawned {
            log::error!("cannot start the connections' deadline thread: {e}");
        }
    });
}

/// Ends what is due at `now`.
pub(super) fn look(now: u64) {
    for slot in TABLE.slots() {
        let life = slot.lifetime_at.load(Relaxed);
        if life != 0 && life <= now {
            lifetime(slot, now);
        }
        let cut = slot.cut_at.load(Relaxed);
        if cut != 0 && cut <= now {
            let id = slot.id.load(Relaxed);
            if TABLE.kill(id, Kill::Removed) {
                log::info!("connection {id} closed: its removed backend's drain timed out");
            }
            let _ = slot.cut_at.compare_exchange(cut, 0, Relaxed, Relaxed);
        }
    }
}

/// The lifetime of `slot`'s connection passed: its first step (the
/// client's FIN, the second step set a fin timeout later) or its second
/// (both sockets shut down). Under the slot's lock, so that a deadline
/// of a connection that just ended never touches the next one.
fn lifetime(slot: &Slot, now: u64) {
    let info = slot.info.lock();
    if info.id == 0 {
        return;
    }
    let [client, backend] = info.fds;
    let first = slot
        .kill
        .compare_exchange(0, Kill::MaxLifetime as u8, Relaxed, Relaxed)
        .is_ok();
    if first {
        shutdown(client, libc::SHUT_WR);
        let next = now + info.fin.as_millis() as u64;
        slot.lifetime_at.store(next.max(1), Relaxed);
        log::debug!(
            "connection {}: its lifetime is over, the client gets its FIN",
            info.id
        );
        return;
    }
    slot.lifetime_at.store(0, Relaxed);
    shutdown(client, libc::SHUT_RDWR);
    shutdown(backend, libc::SHUT_RDWR);
    if slot.kill.load(Relaxed) == Kill::MaxLifetime as u8 {
        TABLE.kills.fetch_add(1, Relaxed);
    }
}
