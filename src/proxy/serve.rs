//! A worker's chain for one client, the article's `proxy_function()`:
//! wait (queue timeout, first byte) → route (the pick made at accept
//! time, or, after a PROXY header or an SNI peek, the admission gate's,
//! `admission.rs`) → TLS (the client's handshake, for a service that
//! terminates it) → a slot (when every backend was at its
//! `max_connections`, `waiting.rs`) → connect (with fail-over, and the
//! backend's handshake when re-encrypting) → pump → close. Each step that
//! ends the client early says why in its [`Outcome`]; [`Proxy::handle`]
//! tells it.
//!
//! # Threads
//!
//! Worker threads, each on its own client. Settings are read once per
//! connection (an `ArcSwap` load); the pump's buffers are thread-local.
//! No lock is held on the plain path; the slot wait takes the service's
//! waitlist lock (`waiting.rs`), the gate the limiter's shard lock.
//!
//! # Corresponds to the C article
//!
//! `proxy_function()`: the C reads one chunk, sends it with
//! `strlen(buffer)` and copies the reply until the backend closes, and any
//! error `exit()`s the process. Here errors end only this connection, both
//! directions stream, and the final `shutdown(SHUT_RDWR)` then `close()` on
//! both sockets is the C's, kept on every path.

use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::connect::{Attempt, Connected, Tries};
use super::pumps;
use super::report::{Fate, Outcome, Refusal, Served};
use super::Admitted;
use super::{close, header, pump, Job, Proxy, ProxyConfig, Route, REPLY_LINGER};
use crate::access_log::TriesEnded;
use crate::backend::Backend;
use crate::error::Error;
use crate::health::HealthConfig;
use crate::limiter::Place;
use crate::reply;
use crate::scheduler::Pick;
use crate::trace;

/// A client connected to its backend: what the pump needs, and what the
/// connection's [`Outcome`] will say once it is over.
pub(super) struct Link {
    pub(super) client: TcpStream,
    pub(super) backend_sock: TcpStream,
    /// The backend that answered (the pick's, or one failed over to).
    pub(super) backend: Arc<Backend>,
    /// The scheduler's pick, held until the connection counts as active
    /// (none for a connection carried in).
    pub(super) pick: Option<Pick>,
    /// A place reserved on a capped backend failed over to, held as long.
    pub(super) held: Option<crate::backend::Reservation>,
    /// The settings, read once when the worker took the client.
    pub(super) settings: Arc<ProxyConfig>,
    /// When the worker took the client.
    pub(super) started: Instant,
    pub(super) connect_time: Duration,
    pub(super) failovers: u32,
    /// Its place under the per-client cap, held until it is closed.
    pub(super) place: Option<Place>,
    /// The client's TLS session, for a service that terminates TLS.
    pub(super) tls: Option<crate::tls_term::handshake::Session>,
    /// Carried in from the previous process: where its pump goes on from.
    pub(super) resumed: Option<Box<crate::connections::carry::State>>,
}

/// A client ready to be connected: routed, its TLS done, its pick made.
struct Ready {
    client: TcpStream,
    pick: Pick,
    origin: header::Origin,
    place: Option<Place>,
    tls: Option<crate::tls_term::handshake::Session>,
    started: Instant,
    queued_at: Instant,
}

impl Proxy {
    /// Serves one client: wait → route → connect → pump → close, and says
    /// in `outcome` how it ended, counted already (see
    /// [`super::report::Report::count`]).
    ///
    /// This frame stays on the worker's stack while the connection lasts,
    /// under the pump, so it holds little: the connected sockets and what
    /// the outcome will say. The steps before the pump run in
    /// [`Proxy::reach`], whose frame is gone once connected; `outcome` is
    /// the caller's, so that the one `Outcome` of the connection is never
    /// copied. (Every page of stack a worker touches stays resident while
    /// it lives: docs/internals.md, "The pool".)
    pub(super) fn serve(&self, job: Job, outcome: &mut Outcome) {
        let Some(Link {
            client,
            backend_sock,
            backend,
            pick,
            held,
            settings,
            started,
            connect_time,
            failovers,
            place,
            tls,
            resumed,
        }) = self.reach(job, outcome)
        else {
            return;
        };
        // The access log's lines while it lives, if asked for.
        let interim = self
            .report
            .opened(outcome, &backend, connect_time, failovers);
        let backend_active = backend.start_connection();
        // The peak: one load, a store only when it grows.
        backend.tally.note_active(backend.active());
        // Counted as active now: the pick's reservation (least connections'
        // count of clients on their way) is released.
        drop((pick, held));
        // Held by a guard, so that whatever ends the connection (a panic
        // included) takes it off the count.
        let active = self.stats.hold(&self.stats.active);
        #[cfg(test)]
        if backend.name() == super::PANIC_BACKEND {
            panic!("a test asked for a panic inside a connection");
        }
        let sockets = [&client, &backend_sock];
        let (pumped, tls) =
            pumps::moving(tls, resumed, sockets, &settings, outcome.peer, &self.stats);
        if interim {
            // A pump that never took its hook leaves it: not for the next.
            let _ = pump::interim::take_unused();
        }
        // Off the connections' table before the sockets close; ended on
        // purpose, it says why, whatever the pump saw after the shutdown.
        let mut pumped = pumped;
        if let Some(kill) = crate::connections::end() {
            pumped.end = pump::End::Killed(kill);
        }
        let (end, no_shutdown) = (pumped.end, pumped.no_shutdown);
        outcome.fate = Fate::Served(Served {
            backend: Arc::clone(&backend),
            pumped,
            connect_time,
            failovers,
            started,
            tls,
        });
        // Counters before the close, so that whoever sees this connection
        // close also sees it counted; `completed` and then the active
        // gauges last, so that whoever sees the connection completed (and
        // no longer active) sees how it ended and its bytes too.
        self.report.count(outcome);
        drop(active);
        drop(backend_active);
        // The article's ending: shutdown(SHUT_RDWR), then close(), on both
        // sockets. After an error or the idle timeout it cuts both
        // directions at once. A socket the pump read to its end needs no
        // shutdown (its close sends the FIN, the last one of a clean end
        // included), nor one its peer reset; a peer's reset is passed on
        // to the other peer as a reset (pump::close).
        pump::close(&client, &backend_sock, end, no_shutdown);
        if backend.is_capped() {
            // A slot freed: the first client waiting may take it.
            self.scheduler.waitlist().notify();
        }
        drop(place);
    }

    /// The steps before the pump: wait → route → connect. Gives the client
    /// connected to its backend; `None` when it was refused on the way
    /// (`outcome` then says why; counted and closed already).
    ///
    /// Never inlined, nor are the steps it calls, so that their locals (a
    /// refusal, its error and log line, the fail-over's list) stay out of
    /// [`Proxy::serve`]'s frame, which lasts through the pump.
    #[inline(never)]
    fn reach(&self, job: Job, outcome: &mut Outcome) -> Option<Link> {
        // Loaded here, in the shallower frame: a worker's first `ArcSwap`
        // load sets up its thread-local state, one of the deepest calls an
        // idle worker makes.
        let settings = self.settings.load_full();
        if matches!(job.route, Route::Carried(_)) {
            return self.resumed(job, settings);
        }
        let health = self.health.load_full();
        self.list(&job, &settings);
        let ready = self.ready(job, outcome, &settings, &health)?;
        self.link(ready, settings, &health, outcome)
    }

    /// The steps before the connect: wait → route → TLS → a slot. Not
    /// inlined, so that its locals are gone before the connect, the
    /// deepest point an idle worker's stack reaches.
    #[inline(never)]
    fn ready(
        &self,
        job: Job,
        outcome: &mut Outcome,
        settings: &ProxyConfig,
        health: &HealthConfig,
    ) -> Option<Box<Ready>> {
        let Job {
            route,
            client,
            peer,
            queued_at,
            place,
            ..
        } = job;
        // Routed by SNI, the worker took it before reading its hello.
        let (started, traced) = match route {
            Route::AfterSni(taken) => (taken, true),
            _ => (Instant::now(), false),
        };
        outcome.queue_wait = self.taken(&client, queued_at, started, traced);
        if self.turned_away(&client, queued_at, outcome, settings, health) {
            return None;
        }
        let (client, pick, origin, place) =
            self.route(route, client, peer, place, outcome, health)?;
        let tls = match self.tls {
            None => None,
            Some(_) => Some(self.terminate(&client, outcome)?),
        };
        let pick = match pick {
            Some(pick) => pick,
            None => {
                let source = origin.source;
                self.wait_for_slot(&client, source, queued_at, settings, health, outcome)?
            }
        };
        // Boxed: one small allocation keeps it out of the frames the
        // connect runs under.
        Some(Box::new(Ready {
            client,
            pick,
            origin,
            place,
            tls,
            started,
            queued_at,
        }))
    }

    /// The connect (with fail-over, and the backend's TLS handshake when
    /// the service speaks TLS to its backends): the client linked to its
    /// backend, or `None` when it was refused. Not inlined: the connect
    /// runs under its frame only.
    #[inline(never)]
    // Boxed on purpose: a `Ready` by value would be copied into this frame
    // and the caller's, under the connect (see `ready`).
    #[allow(clippy::boxed_local)]
    fn link(
        &self,
        mut ready: Box<Ready>,
        settings: Arc<ProxyConfig>,
        health: &HealthConfig,
        outcome: &mut Outcome,
    ) -> Option<Link> {
        let attempt = Attempt {
            client: &ready.client,
            origin: &ready.origin,
            settings: &settings,
            health,
            queued_at: ready.queued_at,
        };
        if let Some(kill) = crate::connections::killed() {
            // Ended while it waited: no backend is bothered.
            self.refuse(outcome, Refusal::Killed(kill), &ready.client, health);
            return None;
        }
        let mut tries = Tries::default();
        crate::connections::phase(crate::connections::Phase::Connecting);
        let connecting = Instant::now();
        let mut connected = self.connect(&ready.pick, &attempt, &mut tries);
        let connect_time = connecting.elapsed();
        if let Some(session) = ready.tls.as_mut() {
            connected = reach_tls(session, connected, connecting + settings.connect_timeout);
        }
        match connected {
            Ok(Connected(backend_sock, backend, held)) => {
                super::listed::linked(&backend, &backend_sock, &settings);
                let Ready {
                    client,
                    pick,
                    place,
                    tls,
                    started,
                    ..
                } = *ready;
                Some(Link {
                    client,
                    backend_sock,
                    backend,
                    pick: Some(pick),
                    held,
                    settings,
                    started,
                    connect_time,
                    failovers: tries.failed,
                    place,
                    tls,
                    resumed: None,
                })
            }
            Err(error) => {
                let failed = (error, tries.failed, tries.ended, connect_time);
                self.refuse_unreachable(outcome, &ready.pick, failed, tries.refused, &attempt);
                None
            }
        }
    }

    /// The TLS handshake with the client of a service that terminates TLS:
    /// its session, or `None` when it failed (counted by its kind and
    /// logged there, closed; `outcome` says so). Not inlined: the plain
    /// path's frame stays as it was.
    #[inline(never)]
    fn terminate(
        &self,
        client: &TcpStream,
        outcome: &mut Outcome,
    ) -> Option<crate::tls_term::handshake::Session> {
        let term = self.tls.as_ref()?.load_full();
        let session = crate::tls_term::handshake::serve(
            term,
            client,
            &self.stats,
            outcome.peer,
            outcome.queued_at,
        );
        if session.is_none() {
            outcome.fate = Fate::Refused(Refusal::TlsHandshake);
            self.report.count(outcome);
        }
        session
    }

    /// Every backend connect failed: the client is refused.
    #[cold]
    #[inline(never)]
    fn refuse_unreachable(
        &self,
        outcome: &mut Outcome,
        pick: &Pick,
        (error, failovers, ended, connect_time): (Error, u32, Option<TriesEnded>, Duration),
        waited: Option<Box<Refusal>>,
        attempt: &Attempt<'_>,
    ) {
        let refusal = match waited {
            // Fail-over waited for a full primary's slot, in vain.
            Some(refusal) => *refusal,
            None => Refusal::ConnectFailed {
                backend: Arc::clone(&pick.backend),
                error,
                failovers,
                ended,
                connect_time,
            },
        };
        self.refuse(outcome, refusal, attempt.client, attempt.health);
    }

    /// The waits before any backend (see [`wait`]): whether the client was
    /// refused there (then counted, answered if asked, and closed).
    #[inline(never)]
    fn turned_away(
        &self,
        client: &TcpStream,
        queued_at: Instant,
        outcome: &mut Outcome,
        settings: &ProxyConfig,
        health: &HealthConfig,
    ) -> bool {
        let Some(refusal) = wait(client, queued_at, outcome.queue_wait, settings) else {
            return false;
        };
        self.refuse(outcome, refusal, client, health);
        true
    }

    /// A worker took `client` at `started`: the trace says so (unless it
    /// `traced` it already, routing it by SNI), the queue wait is observed
    /// and, if long, warned about. Returns the wait. Not inlined: the
    /// warning's log line would sit in [`Proxy::reach`]'s frame, under the
    /// connect.
    #[inline(never)]
    fn taken(
        &self,
        client: &TcpStream,
        queued_at: Instant,
        started: Instant,
        traced: bool,
    ) -> Duration {
        if trace::on() && !traced {
            trace::taken(client.as_raw_fd(), trace::worker_number());
        }
        let queue_wait = started.saturating_duration_since(queued_at);
        self.stats.histograms.queue_wait.observe(queue_wait);
        self.report
            .busy(queue_wait, || self.queue_depth(), self.max_workers);
        queue_wait
    }

    /// The client's backend: the one picked at accept time, or the one the
    /// admission gate picks on this worker (after a PROXY header, or SNI);
    /// no pick when it is to wait for a slot (`None`: refused, `outcome`
    /// says why).
    #[inline(never)]
    fn route(
        &self,
        route: Route,
        client: TcpStream,
        peer: SocketAddr,
        place: Option<Place>,
        outcome: &mut Outcome,
        health: &HealthConfig,
    ) -> Option<(TcpStream, Option<Pick>, header::Origin, Option<Place>)> {
        let origin = header::Origin {
            source: peer,
            destination: None,
        };
        match route {
            Route::Picked(pick) => Some((client, Some(pick), origin, place)),
            Route::Waiting => Some((client, None, origin, place)),
            route => self.admit_here(route, client, origin, outcome, health),
        }
    }

    /// The admission gate on the worker, for a client queued unpicked:
    /// after its PROXY header, or routed by SNI. Refused, it is answered,
    /// closed and counted here, told by [`Proxy::handle`] as on the plain
    /// path. Not inlined: the plain path's frames stay as they were.
    #[cold]
    #[inline(never)]
    fn admit_here(
        &self,
        route: Route,
        client: TcpStream,
        origin: header::Origin,
        outcome: &mut Outcome,
        health: &HealthConfig,
    ) -> Option<(TcpStream, Option<Pick>, header::Origin, Option<Place>)> {
        let (origin, admitted) = match (route, &self.accept_proxy) {
            (Route::AfterHeader, Some(accept)) => self.after_header(accept, &client, origin.source),
            (Route::AfterSni(_), _) => (origin, self.admit(&client, origin.source)),
            // Unrouted (SNI not read), or a header with `--accept-proxy`
            // off: a bug, logged as an error by the report.
            _ => (origin, Err(Refusal::Misrouted)),
        };
        // From here on the client is who the header said.
        outcome.peer = origin.source;
        match admitted {
            Ok(Admitted { pick, place }) => Some((client, pick, origin, place)),
            Err(refusal) => {
                self.refuse(outcome, refusal, &client, health);
                None
            }
        }
    }

    /// Ends a client refused before any backend: counted, answered
    /// ([`Proxy::answer`]), closed. The caller tells it once closed.
    pub(super) fn refuse(
        &self,
        outcome: &mut Outcome,
        refusal: Refusal,
        client: &TcpStream,
        health: &HealthConfig,
    ) {
        outcome.fate = Fate::Refused(refusal);
        self.report.count(outcome);
        if let Fate::Refused(refusal) = &outcome.fate {
            answer(client, refusal, health.http_replies);
        }
        close(client);
    }
}

/// Answers a refused client as its refusal asks, before the close: the
/// rate limiter's 429 when its reply is HTTP; with `http_replies`, a 503
/// (queue timeout or full, no backend) or a 502 (no backend reached). Each
/// 503 and the 429 are one non-blocking write, on the accept loop as on a
/// worker (a worker that lingered there would make the backlog that
/// caused the wait grow); the 502 of an unreachable backend may linger a
/// little. The per-client cap answers its refusals itself (`per_client`).
pub(crate) fn answer(client: &TcpStream, refusal: &Refusal, http_replies: bool) {
    match refusal {
        Refusal::RateLimited {
            retry_after, reply, ..
        } => crate::limiter::refuse(client, *reply, *retry_after),
        Refusal::QueueTimeout { .. } if http_replies => {
            reply::reply_at_once(client, reply::REPLY_503_QUEUE)
        }
        Refusal::SlotTimeout { .. } | Refusal::QueueFull { .. } if http_replies => {
            reply::reply_at_once(client, reply::REPLY_503_FULL)
        }
        Refusal::NoBackend { .. } if http_replies => reply::reply_at_once(client, reply::REPLY_503),
        Refusal::ConnectFailed { .. } if http_replies => {
            reply::reply_and_linger(client, reply::REPLY_502, REPLY_LINGER)
        }
        _ => {}
    }
}

/// The waits before any backend: a client that waited in the queue longer
/// than `queue_timeout`, or (with `client_first_byte_timeout`) sent nothing
/// that long after it was accepted, is refused.
fn wait(
    client: &TcpStream,
    queued_at: Instant,
    queue_wait: Duration,
    settings: &ProxyConfig,
) -> Option<Refusal> {
    if queue_wait > settings.queue_timeout {
        return Some(Refusal::QueueTimeout {
            limit: settings.queue_timeout,
        });
    }
    let limit = settings.client_first_byte_timeout?;
    (!wait_readable(client, queued_at + limit)).then_some(Refusal::FirstByteTimeout { limit })
}

/// The TLS handshake with the backend just connected, when the service
/// speaks TLS to its backends (`backend_tls`), by `deadline`. Not inlined,
/// as [`Proxy::terminate`].
#[inline(never)]
fn reach_tls(
    session: &mut crate::tls_term::handshake::Session,
    connected: crate::error::Result<Connected>,
    deadline: Instant,
) -> crate::error::Result<Connected> {
    let Connected(sock, backend, held) = connected?;
    match session.reach_backend(&sock, backend.name(), deadline) {
        Ok(()) => Ok(Connected(sock, backend, held)),
        Err(e) => Err(Error::io(format!("connecting to {}", backend.name()), e)),
    }
}

/// Waits until `client` has something to read (bytes, or its end of
/// stream: the pump deals with both) or `deadline` passes; whether it
/// became readable. A client already past its deadline is looked at once,
/// without waiting: one that waited in the queue longer than the
/// first-byte timeout gets no second one. A `poll(2)` error on our own
/// socket counts as readable: the pump meets it and ends the connection.
fn wait_readable(client: &TcpStream, deadline: Instant) -> bool {
    crate::poll::readable_by(client.as_raw_fd(), deadline).unwrap_or(true)
}
