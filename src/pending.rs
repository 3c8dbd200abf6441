//! The TLS handshakes and SNI peeks in progress on a service, bounded
//! (`tls_max_pending`): a worker blocked reading a client's ClientHello or
//! finishing its handshake holds a [`Ticket`]; when a new one would pass
//! the bound, the one waiting longest is closed to make room
//! (`shutdown(2)` on its socket, from the thread that makes room, which
//! wakes its worker's `poll(2)`); that worker counts it
//! (`tls_pending_closed`) and logs it, at most once a second. A new client is never refused for it: a
//! flood of half-hellos then holds at most the bound's workers and is
//! recycled oldest first, while a real client's hello, arriving whole,
//! finishes in a few round trips.
//!
//! The longest waiting is the one accepted first: a handshake in progress
//! has made no progress the worker could hand on, so its age is how long
//! it has stalled. Accepted, not entered: workers take clients from the
//! queue in order but may enter a moment apart, and a real client must
//! not be closed for half-hellos that were queued before it.
//!
//! One short lock at the start and end of a handshake or peek (a binary
//! search, an insertion or a removal in a ring allocated once, kept in
//! the order of acceptance); nothing per byte,
//! and the plain TCP path never comes here. The socket is shut down under
//! the lock, and a worker leaves before it closes its socket (the ticket
//! borrows it), so a descriptor number is never shut down after it was
//! closed and given to another connection.
//!
//! A leaf: sockets, a lock and a log throttle.
//!
//! # Threads
//!
//! Shared by the workers of a service (or of an address shared by SNI);
//! any of them may close another's socket.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C reads no client bytes before the backend.

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::throttle::LogThrottle;

/// Default of `tls_max_pending`. A real handshake takes a few round trips
/// (milliseconds), so 1,024 at once is tens of thousands of handshakes a
/// second; it is a quarter of the default 4,096 workers, so a flood of
/// half-hellos leaves three quarters of them to the established
/// connections. It must stay under `workers` to take effect.
pub const DEFAULT_MAX_PENDING: usize = 1024;

/// The most entries allocated up front; a larger bound grows the ring
/// when reached (once: it never shrinks).
const PREALLOCATED: usize = 4096;

/// The handshakes and peeks in progress of one service; see the module
/// docs.
#[derive(Debug)]
pub struct Pending {
    /// The bound (`tls_max_pending`), at least 1.
    max: usize,
    /// The tickets held.
    inner: Mutex<Inner>,
    /// The "closed to make room" line, once a second at most.
    log: LogThrottle,
}

#[derive(Debug)]
struct Inner {
    /// The next ticket's id.
    next: u64,
    /// Acceptance time, id and socket of each ticket held, oldest first.
    order: VecDeque<(Instant, u64, RawFd)>,
}

/// A worker's place among the handshakes in progress, held while it
/// waits on `sock`; leaving (dropping it) takes it out.
#[derive(Debug)]
pub struct Ticket<'a> {
    pending: &'a Pending,
    id: u64,
    /// When its client was accepted.
    since: Instant,
    /// Tied to the socket: the ticket goes before the socket closes.
    _sock: PhantomData<&'a TcpStream>,
}

impl Pending {
    /// At most `max` at once (0 counts as 1).
    pub fn new(max: usize) -> Pending {
        let max = max.max(1);
        Pending {
            max,
            inner: Mutex::new(Inner {
                next: 0,
                // One more: a new ticket is in before the oldest goes.
                order: VecDeque::with_capacity(max.min(PREALLOCATED) + 1),
            }),
            log: LogThrottle::new(Duration::from_secs(1)),
        }
    }

    /// The bound.
    pub fn max(&self) -> usize {
        self.max
    }

    /// How many are in progress now.
    pub fn len(&self) -> usize {
        self.inner.lock().order.len()
    }

    /// Whether none is in progress.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Enters the handshake or peek of `sock`, a client accepted at
    /// `since`; at the bound, the one accepted first is shut down (its
    /// worker finds out when it leaves), or this one when it is older
    /// than all of them.
    pub fn enter<'a>(&'a self, sock: &'a TcpStream, since: Instant) -> Ticket<'a> {
        let mut inner = self.inner.lock();
        let id = inner.next;
        inner.next += 1;
        let fd = sock.as_raw_fd();
        let at = inner.order.partition_point(|e| (e.0, e.1) < (since, id));
        inner.order.insert(at, (since, id, fd));
        if inner.order.len() > self.max {
            if let Some((_, _, oldest)) = inner.order.pop_front() {
                // Under the lock: its worker cannot have closed it yet.
                shutdown(oldest);
            }
        }
        drop(inner);
        Ticket {
            pending: self,
            id,
            since,
            _sock: PhantomData,
        }
    }

    /// The throttled line for a client closed to make room.
    #[cold]
    #[inline(never)]
    fn tell(&self, waited: Duration, now: Instant) {
        if let Some(more) = self.log.event(now) {
            let also = if more > 0 {
                format!(" ({more} more since the last line)")
            } else {
                String::new()
            };
            log::warn!(
                "tls_max_pending ({}) handshakes or SNI peeks in progress: closed the one \
                 stalled longest ({} ms after it was accepted) to make room for a new \
                 client{also}",
                self.max,
                waited.as_millis()
            );
        }
    }
}

impl Ticket<'_> {
    /// Leaves; true when the ticket had been closed to make room (its
    /// socket shut down by another worker), then logged (throttled); the
    /// caller counts it (`tls_pending_closed`).
    pub fn leave(self) -> bool {
        let gone = self.take_out();
        if gone {
            let now = Instant::now();
            self.pending
                .tell(now.saturating_duration_since(self.since), now);
        }
        std::mem::forget(self);
        gone
    }

    /// Takes this ticket out of the ring: whether it was no longer there.
    fn take_out(&self) -> bool {
        let mut inner = self.pending.inner.lock();
        let at = inner
            .order
            .binary_search_by_key(&(self.since, self.id), |e| (e.0, e.1));
        match at {
            Ok(i) => {
                inner.order.remove(i);
                false
            }
            Err(_) => true,
        }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        self.take_out();
    }
}

/// `shutdown(SHUT_RDWR)` on a descriptor another thread owns: its
/// `poll(2)` wakes (end of stream), the client gets a FIN.
fn shutdown(fd: RawFd) {
    // SAFETY: `fd` is open: it is shut down under the lock, and its
    // worker leaves (taking the lock) before closing it. Errors (a peer
    // already gone) change nothing.
    unsafe {
        libc::shutdown(fd, libc::SHUT_RDWR);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::pair;
    use std::io::Read;

    #[test]
    fn at_the_bound_the_oldest_is_shut_down_and_the_new_one_enters() {
        let pending = Pending::new(2);
        let (_c1, s1) = pair();
        let (_c2, s2) = pair();
        let (_c3, s3) = pair();
        let t1 = pending.enter(&s1, Instant::now());
        let t2 = pending.enter(&s2, Instant::now());
        assert_eq!(pending.len(), 2);
        let t3 = pending.enter(&s3, Instant::now());
        assert_eq!(pending.len(), 2);
        // The oldest's socket reads its end at once; the others' do not.
        s1.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!((&s1).read(&mut [0; 8]).unwrap(), 0);
        assert!(t1.leave(), "the oldest was closed to make room");
        assert!(!t2.leave());
        drop(t3);
        assert!(pending.is_empty());
        s2.set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        assert!((&s2).read(&mut [0; 8]).is_err(), "still open, nothing came");
    }

    #[test]
    fn the_one_accepted_first_goes_whenever_it_entered() {
        let pending = Pending::new(1);
        let (_c1, s1) = pair();
        let (_c2, s2) = pair();
        let (_c3, s3) = pair();
        let early = Instant::now();
        let later = early + Duration::from_millis(5);
        let newer = pending.enter(&s1, later);
        // Accepted before the one inside, entering after it: it goes.
        let older = pending.enter(&s2, early);
        assert!(older.leave());
        assert_eq!(pending.len(), 1);
        let newest = pending.enter(&s3, later + Duration::from_millis(1));
        assert!(newer.leave());
        assert!(!newest.leave());
    }

    #[test]
    fn leaving_in_any_order_keeps_the_ring_in_order() {
        let pending = Pending::new(3);
        let pairs: Vec<_> = (0..4).map(|_| pair()).collect();
        let a = pending.enter(&pairs[0].1, Instant::now());
        let b = pending.enter(&pairs[1].1, Instant::now());
        let c = pending.enter(&pairs[2].1, Instant::now());
        assert!(!b.leave());
        let d = pending.enter(&pairs[3].1, Instant::now());
        assert_eq!(pending.len(), 3);
        // Room was there: nobody was closed.
        assert!(!a.leave());
        assert!(!d.leave());
        assert!(!c.leave());
        assert!(pending.is_empty());
        assert_eq!(Pending::new(0).max(), 1);
    }
}
