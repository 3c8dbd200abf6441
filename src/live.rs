//! The settings a running balancer reads live, with the scheduler: what a
//! reload or the admin API changes without restarting a thread.
//!
//! Each setting is an `arc_swap::ArcSwap` (one atomic load to read, a
//! swap to change): the proxy's settings are read once per connection, the
//! health settings by the checker each round, the limiter by the accept
//! loop once per client. Built by [`crate::Balancer::bind`], handed to the
//! reloader and the admin API.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C's settings are compiled in.

use std::sync::Arc;

use arc_swap::{ArcSwap, ArcSwapOption};

use crate::health::HealthConfig;
use crate::limiter::Limiter;
use crate::proxy::ProxyConfig;
use crate::scheduler::Scheduler;

/// The settings a running balancer reads live, and the scheduler: what a
/// reload changes. Cheap to clone (reference counts).
#[derive(Debug, Clone)]
pub struct Live {
    /// The backend list and the algorithm.
    pub scheduler: Arc<Scheduler>,
    /// Chunk size, timeouts, splice: read once per connection.
    pub proxy: Arc<ArcSwap<ProxyConfig>>,
    /// Health settings: read by the checker each round and by the workers
    /// once per connection.
    pub health: Arc<ArcSwap<HealthConfig>>,
    /// The rate limiter, or none: read by the accept loop once per client.
    pub limiter: Arc<ArcSwapOption<Limiter>>,
    /// TLS termination, for a service started with `tls_certs`: a reload
    /// reads the certificates again and swaps it; `None` for plain TCP.
    pub tls: Option<Arc<ArcSwap<crate::tls_term::Terminator>>>,
}
