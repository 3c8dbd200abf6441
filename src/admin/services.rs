//! The admin API's view of the services: `GET /services`, one service's
//! summary, and which service the paths without a name mean.
//!
//! Run by the admin handler threads; reads the running list and each
//! service's atomics.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C serves one port.

use std::sync::Arc;

use serde_json::{json, Value};

use super::State;
use crate::service::Service;

/// The one service, for the paths without a service's name; with
/// several, why not (a 409).
pub(super) fn only_service(state: &State) -> Result<Arc<Service>, String> {
    let services = state.running.list();
    match services.as_slice() {
        [one] => Ok(Arc::clone(one)),
        _ => {
            let names: Vec<&str> = services.iter().map(|s| s.name()).collect();
            Err(format!(
                "several services run here ({}): use /services/{{name}}/backends",
                names.join(", ")
            ))
        }
    }
}

/// `GET /services`.
pub(super) fn services(state: &State) -> Value {
    let list = state.running.list();
    let list: Vec<Value> = list.iter().map(|s| service_json(state, s)).collect();
    Value::Array(list)
}

/// A service as the API shows it.
pub(super) fn service_json(state: &State, service: &Service) -> Value {
    let own = service.stats.own();
    let backends = service.live.scheduler.snapshot();
    let up = backends.iter().filter(|b| b.state_name() == "up").count();
    let listen: Vec<String> = state
        .running
        .addrs(service.name())
        .iter()
        .map(|a| a.to_string())
        .collect();
    json!({
        "name": service.name(),
        "listen": listen,
        "algorithm": service.live.scheduler.algorithm().name(),
        "backends": backends.len(),
        "backends_up": up,
        "active": own.active,
        "accepted": own.accepted,
        "completed": own.completed,
        "max_connections": service.slots.as_ref().map(|s| s.limit()),
        "connections_held": service.slots.as_ref().map(|s| s.held()),
        "queued": own.queued,
        "max_queue": service.live.proxy.load().max_queue,
    })
}
