//! The hostile suite: every listener and every input rodizio has, attacked
//! the way a careless or malicious peer would: lying and huge lengths, slow
//! and partial requests, garbage, resets mid-way, many idle connections,
//! exhaustion of descriptors, threads and memory. Each module attacks one
//! listener or input; each test says what it shows and fails, not hangs,
//! when the defence is missing (every socket has a timeout, every loop a
//! bound in count and time).
//!
//! One test binary (`cargo test --test hostile`), so `make test` runs the
//! whole suite and a new listener gets its attacks beside the others.

#[path = "../child/mod.rs"]
mod child;
#[path = "../common/mod.rs"]
mod common;
#[path = "../common/names.rs"]
mod names;
#[path = "../peers/mod.rs"]
mod peers;
#[path = "../tls_certs/mod.rs"]
mod tls_certs;

mod access_log;
mod admin;
mod agent;
mod backup;
mod balancer_port;
mod cap;
mod check_port;
mod client_limits;
mod config_file;
mod connections;
mod demo_backend;
mod etcd;
mod failure;
mod half_hellos;
mod kernel_relay;
mod page;
mod prompt;
mod proxy_header;
mod resets;
mod resolve;
mod root_reader;
mod services;
mod sni;
mod srv;
mod tls;
mod tools;
mod upgrade;
mod upgrade_carry;
mod yields;
