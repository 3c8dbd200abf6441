//! Where a backend's health is checked: its own addresses, or the check
//! target its own check names (`check_port`, `check_address`); read by the
//! checks, shown by `/backends` and `rodizio probe`, replaced by a reload.
//!
//! # Threads
//!
//! The health thread and its probe threads read a backend's [`OwnCheck`]
//! (an `ArcSwap` load, no lock); the reloading thread replaces it. No
//! worker touches it, so a balancer without own checks pays nothing on
//! the data path.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C never checks a backend.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use super::own::OwnCheck;
use crate::backend::Backend;

impl Backend {
    /// Its own check settings, as they are now.
    pub fn own_check(&self) -> Arc<OwnCheck> {
        self.own_check.load_full()
    }

    /// Replaces its own check settings (a reload); the health thread uses
    /// them from its next check of this backend.
    pub fn set_own_check(&self, own: OwnCheck) {
        self.own_check.store(Arc::new(own));
    }

    /// The addresses its checks go to, in the order they are tried: its
    /// own, with the check port and address put in.
    pub fn check_addrs(&self) -> Vec<SocketAddr> {
        let own = self.own_check.load();
        let mut addrs: Vec<SocketAddr> = self.addrs().iter().map(|a| own.target(*a)).collect();
        // One check address for a name of several addresses.
        addrs.dedup();
        addrs
    }

    /// Where its checks go, as `HOST:PORT`, when that is not where its
    /// clients go (`None` otherwise): `db1:8008` for `db1:5432` with
    /// `check_port=8008`, `127.0.0.2:5432` with `check_address=127.0.0.2`.
    pub fn check_target(&self) -> Option<String> {
        let own = self.own_check.load();
        if !own.moves() {
            return None;
        }
        let (host, port) = self.name().rsplit_once(':')?;
        let port = own.port.map_or(port.to_string(), |p| p.to_string());
        let target = match own.address {
            Some(IpAddr::V4(ip)) => ip.to_string(),
            Some(IpAddr::V6(ip)) => format!("[{ip}]"),
            None => host.to_string(),
        };
        let target = format!("{target}:{port}");
        (target != self.name()).then_some(target)
    }
}

#[cfg(test)]
mod tests {
    use crate::backend::{Backend, BackendSpec};

    fn backend(text: &str) -> Backend {
        Backend::from_spec(&BackendSpec::parse(text).unwrap()).unwrap()
    }

    #[test]
    fn the_check_target_is_named_when_it_differs() {
        let plain = backend("127.0.0.1:5432");
        assert_eq!(plain.check_target(), None);
        assert_eq!(plain.check_addrs(), *plain.addrs());
        let port = backend("127.0.0.1:5432,check_port=8008");
        assert_eq!(port.check_target().as_deref(), Some("127.0.0.1:8008"));
        assert_eq!(port.check_addrs(), ["127.0.0.1:8008".parse().unwrap()]);
        let v6 = backend("[::1]:5432,check_address=::2,check_port=8008");
        assert_eq!(v6.check_target().as_deref(), Some("[::2]:8008"));
        let same = backend("127.0.0.1:5432,check_port=5432");
        assert_eq!(same.check_target(), None);
        let name = backend("localhost:5432,check_port=8008");
        assert_eq!(name.check_target().as_deref(), Some("localhost:8008"));
        assert!(name.check_addrs().iter().all(|a| a.port() == 8008));
        let moved = backend("localhost:5432,check_address=127.0.0.2");
        assert_eq!(moved.check_addrs(), ["127.0.0.2:5432".parse().unwrap()]);
        // A reload replaces it.
        plain.set_own_check(port.own_check().as_ref().clone());
        assert_eq!(plain.check_target().as_deref(), Some("127.0.0.1:8008"));
    }
}
