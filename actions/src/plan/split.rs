//! Filling a new group by copying one donor instead of migrating slots onto it.
//!
//! Codis migrates a slot key by key, one slot per group at a time, so a new group that takes `n` slots from its
//! donor waits `n` migrations. When a step of a change fills a new group from a single donor that stays, the same
//! slots can change hands without moving a key: the new pods replicate the donor's master, Codis remaps the slots,
//! the new master is promoted and each side deletes the keys of the slots it no longer owns
//! ([`crate::steps::split`]). The slots are exactly those the step would have migrated, so the change still moves
//! the fewest slots: 4→8, 8→16, 2→4 and 1→2 split every new group, while 3→4 (each new group takes from three donors)
//! migrates.

use super::{SlotState, Step};

/// A new group filled from one donor: the slots it takes, ascending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// The group that gives the slots; it stays.
    pub donor: u32,
    /// The slots the step would migrate from `donor` to the new group.
    pub slots: Vec<u32>,
}

/// The split that `step` amounts to for `gid`: when `gid` holds nothing and nothing is on its way to it, and the step
/// fills it to its final size with migrations from one donor that stays, those slots from that donor.
#[must_use]
pub fn split_of(slots: &[SlotState], step: &Step, gid: u32) -> Option<Split> {
    if slots.iter().any(|s| s.owner == Some(gid) || s.in_flight_target == Some(gid)) {
        return None;
    }
    if step.plan.assign.iter().any(|&(_, g)| g == gid) {
        return None;
    }
    let onto: Vec<u32> = step.plan.moves.iter().filter(|m| m.to == gid).map(|m| m.slot).collect();
    let donor = step.plan.moves.iter().find(|m| m.to == gid)?.from;
    let one_donor = step.plan.moves.iter().filter(|m| m.to == gid).all(|m| m.from == donor);
    let filled = step.final_size(gid) == Some(onto.len());
    let donor_stays = step.final_size(donor).is_some();
    (one_donor && filled && donor_stays).then_some(Split { donor, slots: onto })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{toward, Goal};

    fn balanced(n: usize, k: u32) -> Vec<SlotState> {
        (0..n).map(|s| SlotState::owned(1 + (s * k as usize / n) as u32)).collect()
    }

    #[test]
    fn doubling_splits_every_new_group_off_a_donor_of_its_own() {
        for k in [1u32, 2, 4, 8] {
            let mut slots = balanced(1024, k);
            let mut donors = Vec::new();
            for i in 0..k {
                let new = k + 1 + i;
                let receivers: Vec<u32> = (1..=new).collect();
                let step = toward(&slots, &Goal::new(receivers, (k - 1 - i) as usize)).unwrap();
                let split = split_of(&slots, &step, new).unwrap_or_else(|| panic!("{k}→{}: group {new}", 2 * k));
                assert_eq!(split.slots.len(), 1024 / (2 * k as usize));
                assert!(split.slots.iter().all(|&s| slots[s as usize] == SlotState::owned(split.donor)));
                for &s in &split.slots {
                    slots[s as usize] = SlotState::owned(new);
                }
                donors.push(split.donor);
            }
            donors.sort_unstable();
            donors.dedup();
            assert_eq!(donors.len(), k as usize, "{k}→{}: one donor each", 2 * k);
        }
    }

    #[test]
    fn a_new_group_fed_by_several_donors_or_already_fed_migrates() {
        // 3→4: the new group takes about 85 slots from each of three donors.
        let slots = balanced(1024, 3);
        let step = toward(&slots, &Goal::new([1, 2, 3, 4], 0)).unwrap();
        assert_eq!(split_of(&slots, &step, 4), None);
        // A group that already holds or receives a slot is not split again.
        let mut slots = balanced(64, 1);
        slots[63] = SlotState::migrating(Some(1), 2);
        let step = toward(&slots, &Goal::new([1, 2], 0)).unwrap();
        assert_eq!(split_of(&slots, &step, 2), None);
        slots[63] = SlotState::owned(2);
        let step = toward(&slots, &Goal::new([1, 2], 0)).unwrap();
        assert_eq!(split_of(&slots, &step, 2), None);
        // A donor that is leaving (its slots all go) is drained, not copied.
        let slots = balanced(64, 1);
        let step = toward(&slots, &Goal::new([2], 0)).unwrap();
        assert_eq!(split_of(&slots, &step, 2), None);
        // A group filled partly now and partly later (offline slots assigned) is not split either.
        let mut slots = balanced(64, 1);
        slots[0] = SlotState::offline();
        let step = toward(&slots, &Goal::new([1, 2], 0)).unwrap();
        assert_eq!(split_of(&slots, &step, 2), None);
    }
}
