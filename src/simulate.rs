//! `rodizio simulate`: the real scheduler, with no socket, asked for a
//! backend N times; each backend's share of the picks, and, for a change
//! (`--remove BACKEND`, `--weight BACKEND=W`), the shares after it and the
//! share of clients that land on another backend (what ip-hash is for).
//!
//! Each simulated client comes from its own IPv4 address (10.0.0.0 and
//! up), so ip-hash spreads them as it would spread that many visitors. A
//! connection ends before the next is picked: least-connections and
//! power-of-two see no load here and take turns, weighted by nothing; the
//! shares they give under load depend on how long connections last, which
//! a simulation does not know.
//!
//! A backup (`,backup`) is a backup here too: the scheduler the balancer
//! runs decides, so it gets no pick while a primary is up, and takes the
//! clients of the primaries `--remove` takes away.
//!
//! # Threads
//!
//! Runs on the caller's thread, with schedulers of its own.
//!
//! # Corresponds to the C article
//!
//! No C counterpart; it runs the article's `get_next_server_id()` (round
//! robin) as the balancer does, without the network.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use crate::backend::Backend;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::scheduler::{Algorithm, Scheduler};

/// Most clients one simulation picks for: a million ip-hash picks take
/// about a second, and give each share to a tenth of a percent.
pub const MAX_CLIENTS: u64 = 1_000_000;

/// A change to one backend, to see where its clients go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The backend leaves the list.
    Remove(String),
    /// The backend gets another weight.
    Weight(String, u32),
}

impl Change {
    /// The backend it names.
    fn backend(&self) -> &str {
        match self {
            Change::Remove(name) | Change::Weight(name, _) => name,
        }
    }
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::Remove(name) => write!(f, "--remove {name}"),
            Change::Weight(name, w) => write!(f, "--weight {name}={w}"),
        }
    }
}

/// One backend's picks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    /// Its name, as configured.
    pub name: String,
    /// Its weight.
    pub weight: u32,
    /// A backup (`,backup`): picked only while no primary is available.
    pub backup: bool,
    /// How many clients it was picked for.
    pub picks: u64,
}

/// What one service's simulation found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Simulated {
    /// The service's name.
    pub service: String,
    /// Its algorithm.
    pub algorithm: Algorithm,
    /// How many clients were picked for.
    pub clients: u64,
    /// Each backend's picks, in the configured order.
    pub shares: Vec<Share>,
    /// With a change: the change, each backend's picks after it, and how
    /// many clients went to another backend than before.
    pub after: Option<(Change, Vec<Share>, u64)>,
}

/// Simulates `clients` picks in each service of `config` (the one named
/// `service`, when given), and `change` after them.
///
/// # Errors
///
/// [`Error::InvalidConfig`] when `clients` is 0 or above [`MAX_CLIENTS`],
/// when `service` names no service, or `change` no backend of any
/// service simulated.
pub fn run(
    config: &Config,
    clients: u64,
    service: Option<&str>,
    change: Option<&Change>,
) -> Result<Vec<Simulated>> {
    if clients == 0 || clients > MAX_CLIENTS {
        return Err(Error::InvalidConfig(format!(
            "--clients {clients} is not between 1 and {MAX_CLIENTS}"
        )));
    }
    let list: Vec<&Config> = config
        .service_list()
        .into_iter()
        .filter(|s| service.map_or(true, |name| s.name == name))
        .collect();
    if list.is_empty() {
        return Err(Error::InvalidConfig(format!(
            "--service: no service {}",
            crate::config::shown_name(service.unwrap_or_default())
        )));
    }
    if let Some(change) = change {
        let known = |s: &&Config| s.backends.iter().any(|b| b.name() == change.backend());
        if !list.iter().any(known) {
            return Err(Error::InvalidConfig(format!(
                "{change}: no such backend (backends are named as configured, HOST:PORT)"
            )));
        }
    }
    Ok(list
        .into_iter()
        .map(|s| one_service(s, clients, change))
        .collect())
}

/// One simulated backend: what of its spec the scheduler reads.
#[derive(Clone)]
struct Sim {
    name: String,
    weight: u32,
    backup: bool,
}

/// The simulation of one service.
fn one_service(config: &Config, clients: u64, change: Option<&Change>) -> Simulated {
    let backends: Vec<Sim> = config
        .backends
        .iter()
        .map(|b| Sim {
            name: b.name(),
            weight: b.weight,
            backup: b.backup,
        })
        .collect();
    let before = picks(&backends, config.algorithm, clients);
    let after = change
        .filter(|c| backends.iter().any(|b| b.name == c.backend()))
        .map(|c| {
            let changed: Vec<Sim> = match c {
                Change::Remove(name) => backends
                    .iter()
                    .filter(|b| &b.name != name)
                    .cloned()
                    .collect(),
                Change::Weight(name, w) => backends
                    .iter()
                    .map(|b| Sim {
                        weight: if &b.name == name { *w } else { b.weight },
                        ..b.clone()
                    })
                    .collect(),
            };
            let now = picks(&changed, config.algorithm, clients);
            let moved = before
                .chosen
                .iter()
                .zip(&now.chosen)
                .filter(|(a, b)| {
                    changed.get(usize::from(**b)).map(|x| &x.name)
                        != backends.get(usize::from(**a)).map(|x| &x.name)
                })
                .count() as u64;
            (c.clone(), now.shares, moved)
        });
    Simulated {
        service: config.name.clone(),
        algorithm: config.algorithm,
        clients,
        shares: before.shares,
        after,
    }
}

/// The picks of one run: each backend's count, and each client's choice
/// (its position in the list; `u16::MAX` when none was available).
struct Picks {
    shares: Vec<Share>,
    chosen: Vec<u16>,
}

/// Asks a scheduler over `backends` for `clients` picks, one client
/// address each. The backups are marked as such: which tier serves is the
/// scheduler's decision (`scheduler/backup.rs`), as in the balancer.
fn picks(backends: &[Sim], algorithm: Algorithm, clients: u64) -> Picks {
    // No address: nothing connects to them.
    let list: Vec<Arc<Backend>> = backends
        .iter()
        .map(|b| Arc::new(Backend::new(b.name.clone(), Vec::new(), b.weight).with_backup(b.backup)))
        .collect();
    let scheduler = Scheduler::with_algorithm(list.clone(), algorithm);
    let mut counts = vec![0u64; list.len()];
    // The moved share needs each client's choice; only ip-hash's means
    // anything, and it is kept whatever the algorithm (a byte or two per
    // client, within MAX_CLIENTS).
    let mut chosen = Vec::with_capacity(usize::try_from(clients).unwrap_or(0));
    for i in 0..clients {
        let peer = IpAddr::V4(Ipv4Addr::from(0x0A00_0000u32.wrapping_add(i as u32)));
        let at = scheduler.pick(peer).map(|pick| {
            let id = pick.backend.id();
            list.iter().position(|b| b.id() == id).unwrap_or(0)
        });
        if let Some(at) = at {
            counts[at] += 1;
        }
        chosen.push(at.and_then(|a| u16::try_from(a).ok()).unwrap_or(u16::MAX));
    }
    let shares = backends
        .iter()
        .zip(counts)
        .map(|(b, picks)| Share {
            name: b.name.clone(),
            weight: b.weight.max(1),
            backup: b.backup,
            picks,
        })
        .collect();
    Picks { shares, chosen }
}

/// `part` of `whole` in percent, to two decimals.
fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// The table of shares, one backend a line.
fn write_shares(f: &mut fmt::Formatter<'_>, shares: &[Share], clients: u64) -> fmt::Result {
    let width = shares.iter().map(|s| s.name.len()).max().unwrap_or(0);
    for s in shares {
        write!(
            f,
            "  {:<width$}  weight {:>4}  {:>9}  {:6.2}%",
            s.name,
            s.weight,
            s.picks,
            percent(s.picks, clients)
        )?;
        writeln!(f, "{}", if s.backup { "  backup" } else { "" })?;
    }
    Ok(())
}

impl fmt::Display for Simulated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "service {}: {}, {} clients",
            self.service, self.algorithm, self.clients
        )?;
        write_shares(f, &self.shares, self.clients)?;
        if let Some((change, shares, moved)) = &self.after {
            writeln!(f, "after {change}:")?;
            write_shares(f, shares, self.clients)?;
            write!(
                f,
                "clients on another backend than before: {moved} of {} ({:.2}%)",
                self.clients,
                percent(*moved, self.clients)
            )?;
            if self.algorithm != Algorithm::IpHash {
                write!(f, " ({} keeps no client on a backend)", self.algorithm)?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::BackendSpec;

    fn config(algorithm: Algorithm, backends: &[&str]) -> Config {
        Config {
            algorithm,
            backends: backends
                .iter()
                .map(|b| BackendSpec::parse(b).unwrap())
                .collect(),
            ..Config::default()
        }
    }

    fn picks_of(outcome: &Simulated) -> Vec<u64> {
        outcome.shares.iter().map(|s| s.picks).collect()
    }

    #[test]
    fn round_robin_and_weights_give_exact_shares() {
        let c = config(
            Algorithm::RoundRobin,
            &["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"],
        );
        let out = run(&c, 3000, None, None).unwrap();
        assert_eq!(picks_of(&out[0]), [1000, 1000, 1000]);
        let c = config(
            Algorithm::WeightedRoundRobin,
            &["10.0.0.1:80,weight=1", "10.0.0.2:80,weight=3"],
        );
        let out = run(&c, 2000, None, None).unwrap();
        assert_eq!(picks_of(&out[0]), [500, 1500]);
        let text = out[0].to_string();
        assert!(
            text.contains("10.0.0.2:80  weight    3       1500   75.00%"),
            "{text}"
        );
    }

    #[test]
    fn ip_hash_moves_only_the_removed_backends_clients() {
        let c = config(
            Algorithm::IpHash,
            &["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80", "10.0.0.4:80"],
        );
        let change = Change::Remove("10.0.0.2:80".into());
        let out = run(&c, 100_000, None, Some(&change)).unwrap();
        let (_, after, moved) = out[0].after.clone().unwrap();
        // Exactly the removed backend's clients move, none of the others'.
        assert_eq!(moved, out[0].shares[1].picks);
        assert_eq!(after.len(), 3);
        for s in &out[0].shares {
            assert!((23_000..27_000).contains(&s.picks), "{s:?}");
        }
        // Reweighting one backend moves clients only onto it.
        let change = Change::Weight("10.0.0.1:80".into(), 3);
        let out = run(&c, 100_000, None, Some(&change)).unwrap();
        let (_, after, moved) = out[0].after.clone().unwrap();
        assert_eq!(moved, after[0].picks - out[0].shares[0].picks);
    }

    #[test]
    fn a_backup_gets_nothing_while_a_primary_is_up() {
        // The balancer gives 100/0 here; the backup takes over only when
        // the primary leaves.
        for algorithm in [Algorithm::RoundRobin, Algorithm::IpHash, Algorithm::First] {
            let c = config(algorithm, &["10.0.0.1:80", "10.0.0.2:80,backup"]);
            let change = Change::Remove("10.0.0.1:80".into());
            let out = run(&c, 1000, None, Some(&change)).unwrap();
            assert_eq!(picks_of(&out[0]), [1000, 0], "{algorithm}");
            let (_, after, moved) = out[0].after.clone().unwrap();
            assert_eq!(after[0].picks, 1000, "{algorithm}");
            assert_eq!(moved, 1000, "{algorithm}");
            let text = out[0].to_string();
            assert!(text.contains("0.00%  backup"), "{text}");
        }
    }

    #[test]
    fn absurd_requests_are_refused() {
        let c = config(Algorithm::RoundRobin, &["10.0.0.1:80"]);
        for n in [0, MAX_CLIENTS + 1, 1_000_000_000_000] {
            let err = run(&c, n, None, None).unwrap_err().to_string();
            assert!(err.contains("is not between 1 and"), "{err}");
        }
        let err = run(&c, 10, Some("nope"), None).unwrap_err().to_string();
        assert!(err.contains("no service"), "{err}");
        let err = run(&c, 10, None, Some(&Change::Remove("10.9.9.9:1".into())));
        assert!(err.unwrap_err().to_string().contains("no such backend"));
    }
}
