//! Backup backends (HAProxy's and nginx's `backup`): which backends are in
//! the rotation a snapshot picks from. Primaries while any is available;
//! otherwise the backups, in their own rotation with the same algorithm.
//! A primary coming back flips its availability, which rebuilds the
//! snapshot with the primaries again: new clients go to them at once,
//! while those on a backup finish there.
//!
//! Runs where a snapshot is built (a writer, the thread that flipped a
//! backend, a worker's fail-over: `failover.rs`), never per pick.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the C's servers are all alike.

use std::sync::Arc;

use super::Scheduler;
use crate::backend::Backend;

impl Scheduler {
    /// Makes the backend with this id a backup (`true`) or a primary (a
    /// reload that changed its `backup`); picks from now on follow.
    /// Returns it, or `None` if it is not in the list.
    pub fn set_backup(&self, id: u64, backup: bool) -> Option<Arc<Backend>> {
        let mut found = None;
        self.change(|list| {
            if let Some(b) = list.iter().find(|b| b.id() == id) {
                b.set_backup(backup);
                found = Some(Arc::clone(b));
            }
        });
        found
    }
}

/// A list of backends, as a snapshot holds it.
type List = Arc<[Arc<Backend>]>;

/// The backends in rotation out of `all`, with their positions in `all`
/// (`None`: the rotation is `all` itself, the common case of a list
/// without backups, which costs a scan and nothing else).
pub(crate) fn rotation(all: &List) -> (List, Option<Box<[usize]>>) {
    if !all.iter().any(|b| b.is_backup()) {
        return (Arc::clone(all), None);
    }
    let primaries: Vec<usize> = (0..all.len()).filter(|&i| !all[i].is_backup()).collect();
    let backups: Vec<usize> = (0..all.len()).filter(|&i| all[i].is_backup()).collect();
    let up = |set: &[usize]| set.iter().any(|&i| all[i].is_available());
    // When none at all is available, the primaries (if any) stay in
    // rotation: the first to come back, primary or backup, rebuilds it.
    let chosen = if up(&primaries) || (!up(&backups) && !primaries.is_empty()) {
        primaries
    } else {
        backups
    };
    let list: List = chosen.iter().map(|&i| Arc::clone(&all[i])).collect();
    (list, Some(chosen.into_boxed_slice()))
}

#[cfg(test)]
mod tests {
    use super::super::tests::{tally, OUT, PEER};
    use super::super::{Algorithm, Scheduler};
    use super::*;

    fn mixed(backup: &[bool]) -> Vec<Arc<Backend>> {
        backup
            .iter()
            .enumerate()
            .map(|(i, &bk)| Arc::new(Backend::new(format!("b{i}"), vec![], 1).with_backup(bk)))
            .collect()
    }

    #[test]
    fn backups_serve_only_while_no_primary_is_available() {
        for algorithm in Algorithm::ALL.iter().copied() {
            for (why, set_out) in OUT {
                let list = mixed(&[false, false, true, true]);
                let s = Scheduler::with_algorithm(list.clone(), algorithm);
                let what = format!("{algorithm}, {why}");
                let counts = tally(&s, 400);
                assert_eq!(counts[2] + counts[3], 0, "{what}: {counts:?}");
                set_out(&list[0], true);
                let counts = tally(&s, 400);
                assert_eq!(counts[1], 400, "{what}: one primary left: {counts:?}");
                set_out(&list[1], true);
                let counts = tally(&s, 400);
                assert_eq!(counts[0] + counts[1], 0, "{what}: {counts:?}");
                // ip-hash keeps a client's backup; first fills the first.
                if !matches!(algorithm, Algorithm::IpHash | Algorithm::First) {
                    assert!(counts[2] > 100 && counts[3] > 100, "{what}: {counts:?}");
                }
                set_out(&list[3], true);
                assert_eq!(tally(&s, 50)[2], 50, "{what}");
                set_out(&list[1], false);
                assert_eq!(tally(&s, 50)[1], 50, "{what}: the primary is back");
            }
        }
    }

    #[test]
    fn nothing_available_gives_no_pick_and_a_backup_back_serves() {
        let list = mixed(&[false, true]);
        let s = Scheduler::new(list.clone());
        list[0].set_healthy(false);
        list[1].set_healthy(false);
        assert!(s.pick(PEER).is_none());
        list[1].set_healthy(true);
        assert_eq!(s.pick(PEER).unwrap().server_idx, 1);
    }

    #[test]
    fn a_list_of_backups_only_is_served() {
        let list = mixed(&[true, true]);
        let s = Scheduler::new(list);
        assert_eq!(tally(&s, 10), vec![5, 5]);
    }
}
