//! The sampler: a small thread (`rodizio-sampler`) that fills the stats
//! page's [`Charts`] every [`SAMPLE_EVERY`] while the admin API runs.
//!
//! It only reads counters and histograms the workers keep anyway, so the
//! data path pays nothing for the charts; it takes the charts' lock for
//! the few microseconds a sample takes, and the page takes it to copy.
//! It stops when the shutdown is triggered.
//!
//! # Corresponds to the C article
//!
//! No C counterpart.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::RecvTimeoutError;
use parking_lot::Mutex;

use super::chart::{Charts, SAMPLE_EVERY};
use crate::running::Running;
use crate::shutdown::Shutdown;

/// Starts the sampler over `running`'s services.
///
/// # Errors
///
/// When the thread cannot be started.
pub fn spawn(
    running: Arc<Running>,
    charts: Arc<Mutex<Charts>>,
    shutdown: &Shutdown,
) -> std::io::Result<JoinHandle<()>> {
    let stop = shutdown.receiver();
    std::thread::Builder::new()
        .name("rodizio-sampler".into())
        .spawn(move || {
            let mut last = Instant::now();
            loop {
                let services = running.list();
                let now = Instant::now();
                charts.lock().sample(&services, now - last);
                last = now;
                match stop.recv_timeout(SAMPLE_EVERY) {
                    Err(RecvTimeoutError::Timeout) => {}
                    // Disconnected: the shutdown was triggered.
                    _ => return,
                }
            }
        })
}
