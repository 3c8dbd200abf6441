//! What a worker does with one connection: connect to the backend (failing
//! over to the next one), pump bytes both ways until both sides are done
//! ([`pump()`]), then shut down and close both sockets.
//!
//! Only worker threads run this code, each on its own connection. They share
//! the scheduler (read for fail-over), the counters (atomics) and the live
//! settings (an [`ArcSwap`], read once per connection: a connection keeps the
//! settings it started with, and a change applies to the next one). The
//! pump's buffers and pipes are thread-local, so nothing here takes a lock.
//!
//! # Parts
//!
//! - this file: [`Proxy::handle`], the connection's life and fail-over;
//! - [`mod@pump`]: the duplex state machine, copying or splicing;
//! - `conduit`: the thread's buffers and pipes the pump moves bytes through.
//!
//! # Corresponds to the C article
//!
//! `proxy_function()`. The C reads one chunk of the request (at most 4090
//! bytes), sends it with `strlen(buffer)` (so binary data is cut at the first
//! zero byte), then copies the reply until the backend closes. It cannot
//! serve a request larger than a chunk, a second request on the same
//! connection, or a protocol where the client speaks again after the reply
//! starts; and any read error calls `exit()`, ending every other connection
//! too. Here errors end only this connection, and both directions stream for
//! as long as either side has data. The final `shutdown(SHUT_RDWR)` then
//! `close()` on both sockets is the C's, kept on every path. Its
//! `get_final_server_socket()` is [`Backend::connect`].

mod conduit;
pub mod pump;

use std::net::{Shutdown as Direction, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::health::{self, HealthConfig};
use crate::reply;
use crate::scheduler::{Pick, Scheduler};
use crate::stats::Stats;

pub use pump::{pump, splice_pump, Transfer};

/// One accepted client, with the backend chosen for it at accept time: the
/// `(server_idx, client_sock)` pair of the C queue.
#[derive(Debug)]
pub struct Job {
    /// The backend picked by the scheduler.
    pub pick: Pick,
    /// The client's socket.
    pub client: TcpStream,
    /// The client's address.
    pub peer: SocketAddr,
}

/// How the workers connect and move bytes (a part of [`crate::Config`]).
/// Every field may change while the balancer runs; a connection keeps the
/// values it started with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyConfig {
    /// Bytes per read, each direction (`buffer_size`). Default 4096, the
    /// article's chunk.
    pub buffer_size: usize,
    /// Longest wait for one backend connect (`connect_timeout`). Default 3 s.
    pub connect_timeout: Duration,
    /// Longest time a connection may move no byte (`idle_timeout`).
    /// Default 10 min.
    pub idle_timeout: Duration,
    /// Move bytes with `splice(2)` ([`splice_pump`]) instead of buffers
    /// (`splice`). Default off: the article's pump copies through a buffer.
    pub splice: bool,
    /// Yield once before each wait that follows moved bytes
    /// (`yield_before_poll`). Default off.
    pub yield_before_poll: bool,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            buffer_size: 4096,
            connect_timeout: Duration::from_secs(3),
            idle_timeout: Duration::from_secs(600),
            splice: false,
            yield_before_poll: false,
        }
    }
}

/// The largest `buffer_size` accepted.
pub const MAX_BUFFER_SIZE: usize = 16 * 1024 * 1024;

impl ProxyConfig {
    /// Checks that every value is usable.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSetting`] naming the first bad setting.
    pub fn validate(&self) -> Result<()> {
        if self.buffer_size == 0 || self.buffer_size > MAX_BUFFER_SIZE {
            return Err(Error::setting(
                "buffer_size",
                format!(
                    "must be 1..{MAX_BUFFER_SIZE} bytes, got {}",
                    self.buffer_size
                ),
            ));
        }
        for (name, d) in [
            ("connect_timeout", self.connect_timeout),
            ("idle_timeout", self.idle_timeout),
        ] {
            if d.is_zero() {
                return Err(Error::setting(name, "must be more than 0"));
            }
        }
        Ok(())
    }
}

/// Longest a worker spends on a 502 reply (writing it, then waiting for the
/// client to close first so the reply is not destroyed by a reset).
const REPLY_LINGER: Duration = Duration::from_secs(1);

/// Settings and shared state the workers need for every connection.
#[derive(Debug)]
pub struct Proxy {
    /// Where fail-over finds the other backends.
    pub scheduler: Arc<Scheduler>,
    /// Counters.
    pub stats: Arc<Stats>,
    /// Timeouts, chunk size and the pump's flags, read once per connection.
    pub settings: Arc<ArcSwap<ProxyConfig>>,
    /// Passive health (`passive_failures`) and the 502 reply
    /// (`http_replies`), read once per connection.
    pub health: Arc<ArcSwap<HealthConfig>>,
}

/// With this backend name, [`Proxy::handle`] panics once connected: the
/// unit tests' way to show that a panic leaves no counter wrong.
#[cfg(test)]
const PANIC_BACKEND: &str = "panic.test:1";

impl Proxy {
    /// Serves one client from start to end. Never panics on I/O and never
    /// returns an error: whatever happens is logged and ends only this
    /// connection.
    pub fn handle(&self, job: Job) {
        let Job { pick, client, peer } = job;
        let started = Instant::now();
        let settings = self.settings.load_full();
        let health = self.health.load_full();
        let (backend_sock, backend) = match self.connect(&pick, &settings, &health) {
            Ok(found) => found,
            Err(err) => {
                Stats::incr(&self.stats.no_backend);
                log::warn!("closing client {peer}: no backend could be reached, last: {err}");
                if health.http_replies {
                    reply::reply_and_linger(&client, reply::REPLY_502, REPLY_LINGER);
                }
                close(&client);
                return;
            }
        };
        let backend_active = backend.start_connection();
        // Counted as active now: the pick's reservation (least connections'
        // count of clients on their way) is released.
        drop(pick);
        // Held by a guard, so that whatever ends the connection (a panic
        // included) takes it off the count.
        let active = self.stats.hold(&self.stats.active);
        #[cfg(test)]
        if backend.name() == PANIC_BACKEND {
            panic!("a test asked for a panic inside a connection");
        }
        let mut transfer = Transfer::default();
        let result = if settings.splice {
            splice_pump(
                &client,
                &backend_sock,
                settings.idle_timeout,
                settings.yield_before_poll,
                &mut transfer,
            )
        } else {
            pump(
                &client,
                &backend_sock,
                settings.buffer_size,
                settings.idle_timeout,
                settings.yield_before_poll,
                &mut transfer,
            )
        };
        // Counters first, so that whoever sees this connection close also
        // sees it counted.
        drop(active);
        drop(backend_active);
        Stats::incr(&self.stats.completed);
        Stats::add(&self.stats.bytes_to_backends, transfer.to_backend);
        Stats::add(&self.stats.bytes_to_clients, transfer.to_client);
        // The article's ending: shutdown(SHUT_RDWR), then close(), on both
        // sockets. After an error or the idle timeout it cuts both
        // directions at once; after a clean finish both FINs have already
        // passed and the call only returns ENOTCONN, a cheap system call
        // kept so every connection ends the same, visible way.
        close(&backend_sock);
        close(&client);
        drop(backend_sock);
        drop(client);
        let elapsed = started.elapsed();
        match result {
            Ok(()) => log::debug!(
                "connection finished: client {peer} backend {} sent {} received {} in {:?}",
                backend.name(),
                transfer.to_backend,
                transfer.to_client,
                elapsed
            ),
            Err(err) => {
                Stats::incr(&self.stats.errors);
                log::info!(
                    "connection ended by error: client {peer} backend {}: {err} \
                     (sent {} received {} in {:?})",
                    backend.name(),
                    transfer.to_backend,
                    transfer.to_client,
                    elapsed
                );
            }
        }
    }

    /// Connects to the picked backend or, failing that, to each other
    /// available backend once, in list order.
    ///
    /// Each attempt gets the whole `connect_timeout`, not a share of one
    /// total: a black-holed backend then costs a client one connect timeout,
    /// and the next backend still gets a full chance. (One total budget
    /// would let a single black hole use it all up and fail the client even
    /// though a live backend was next.) Passive health takes the black hole
    /// out after `passive_failures` such clients, so later ones pay nothing.
    fn connect(
        &self,
        pick: &Pick,
        settings: &ProxyConfig,
        health: &HealthConfig,
    ) -> Result<(TcpStream, Arc<Backend>)> {
        let mut last = match self.try_backend(&pick.backend, settings, health) {
            Ok(stream) => return Ok((stream, Arc::clone(&pick.backend))),
            Err(err) => err,
        };
        for backend in self.scheduler.failover_order(&pick.backend) {
            match self.try_backend(&backend, settings, health) {
                Ok(stream) => return Ok((stream, backend)),
                Err(err) => last = err,
            }
        }
        Err(last)
    }

    /// One connect attempt, counted in the stats and in the backend's
    /// passive health.
    fn try_backend(
        &self,
        backend: &Backend,
        settings: &ProxyConfig,
        health: &HealthConfig,
    ) -> Result<TcpStream> {
        match backend.connect(settings.connect_timeout) {
            Ok(stream) => {
                backend.record_connect_success();
                Ok(stream)
            }
            Err(source) => {
                Stats::incr(&self.stats.connect_failures);
                let failures = backend.record_connect_failure();
                log::warn!(
                    "backend {} connect failed ({failures} in a row): {source}",
                    backend.name()
                );
                health::connect_failed(backend, failures, health, &source);
                Err(Error::BackendConnect {
                    backend: backend.name().to_string(),
                    source,
                })
            }
        }
    }
}

/// `shutdown(SHUT_RDWR)` then close, as the C does; errors are irrelevant
/// here (the peer may be gone already), so they are ignored.
fn close(stream: &TcpStream) {
    let _ = stream.shutdown(Direction::Both);
    // The descriptor itself is closed when the `TcpStream` is dropped.
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::Pool;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    #[test]
    fn the_fast_paths_are_off_by_default() {
        let c = ProxyConfig::default();
        assert!(!c.splice);
        assert!(!c.yield_before_poll);
        assert_eq!(c.buffer_size, 4096);
    }

    #[test]
    fn a_panic_inside_a_connection_leaves_the_active_gauge_at_zero() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr().unwrap();
        let backend = Arc::new(Backend::new(PANIC_BACKEND.into(), vec![addr], 1));
        let scheduler = Arc::new(Scheduler::new(vec![Arc::clone(&backend)]));
        let stats = Arc::new(Stats::default());
        let proxy = Arc::new(Proxy {
            scheduler: Arc::clone(&scheduler),
            stats: Arc::clone(&stats),
            settings: Arc::new(ArcSwap::from_pointee(ProxyConfig::default())),
            health: Arc::new(ArcSwap::from_pointee(HealthConfig::default())),
        });
        let pool = Pool::new(
            1,
            256 * 1024,
            4,
            Arc::clone(&stats),
            Arc::new(move |job: Job| proxy.handle(job)),
        );
        let front = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(front.local_addr().unwrap()).unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let (accepted, peer) = front.accept().unwrap();
        let pick = scheduler.pick(peer.ip()).unwrap();
        pool.submit(Job {
            pick,
            client: accepted,
            peer,
        })
        .unwrap();
        // The worker connected, then panicked: the unwinding closed the
        // client, so its read ends.
        let (_at_backend, _) = server.accept().unwrap();
        client.write_all(b"x").ok();
        let mut buf = [0u8; 16];
        let _ = client.read(&mut buf);
        pool.close();
        assert_eq!(pool.wait_exit(Duration::from_secs(10)), 0);
        let s = stats.snapshot();
        assert_eq!(s.worker_panics, 1, "{s:?}");
        assert_eq!(s.active, 0, "{s:?}");
        assert_eq!(backend.active(), 0);
        assert_eq!(backend.total(), 1);
    }
}
