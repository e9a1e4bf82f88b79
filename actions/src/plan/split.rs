//! Filling a new group, in whole or in part, by copying one donor instead of migrating slots onto it.
//!
//! Codis migrates a slot key by key, one slot per group at a time, so a new group that takes `n` slots waits `n`
//! migrations however many donors feed it. When a step of a change moves slots from a donor that stays onto a new,
//! empty group, that donor's share can change hands without moving a key: the new pods replicate the donor's master,
//! Codis remaps the slots, the new master is promoted and each side deletes the keys of the slots it no longer owns
//! ([`crate::steps::split`]); once the split is done, the shares of the other donors, if any, migrate as usual. The
//! slots are exactly those the step would have migrated, so the change still moves the fewest slots.
//!
//! The copy brings the donor's whole data set to keep the share, so a split is taken only when the share is at least
//! [`WORTH_OF_DONOR`] of what the donor holds (the copy brings at most 4½ keys per key kept): 4→8, 8→16, 2→4 and 1→2
//! split every new group off a donor of its own (half its slots), 2→3 and 3→4 split the largest share (a third and
//! a quarter of one donor) and migrate the rest, while 4→5 or 16→17 (a fifth, a seventeenth) migrate.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use super::{SlotState, Step};

/// The least share of its donor's slots, as `(numerator, denominator)`, that a new group splits off rather than
/// migrates: between a quarter (3→4) and a fifth (4→5), clear of rounding either way.
pub const WORTH_OF_DONOR: (usize, usize) = (2, 9);

/// A new group's share of one donor, handed over by a split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// The group that gives the slots; it stays.
    pub donor: u32,
    /// The slots the step would migrate from `donor` to the new group, ascending.
    pub slots: Vec<u32>,
}

/// The split that `step` amounts to for `gid`: when `gid` holds nothing and nothing is on its way to it, the donor
/// that stays and that the step moves the most slots from onto `gid` (ties: the lower gid), if the share is worth a
/// copy ([`WORTH_OF_DONOR`]). Slots the step moves onto `gid` from other donors, leaving ones included, migrate once
/// the split is done.
#[must_use]
pub fn split_of(slots: &[SlotState], step: &Step, gid: u32) -> Option<Split> {
    if slots.iter().any(|s| s.owner == Some(gid) || s.in_flight_target == Some(gid)) {
        return None;
    }
    if step.plan.assign.iter().any(|&(_, g)| g == gid) {
        return None;
    }
    let mut shares: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for m in step.plan.moves.iter().filter(|m| m.to == gid) {
        shares.entry(m.from).or_default().push(m.slot);
    }
    // A leaving donor's slots all migrate, so only a donor that stays can be copied.
    let (donor, share) = shares
        .into_iter()
        .filter(|(donor, _)| step.final_size(*donor).is_some())
        .max_by_key(|(donor, share)| (share.len(), Reverse(*donor)))?;
    let held = slots.iter().filter(|s| s.owner == Some(donor)).count();
    let (num, den) = WORTH_OF_DONOR;
    (share.len() * den >= held * num).then_some(Split { donor, slots: share })
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
    fn a_new_group_splits_the_largest_share_worth_a_copy_and_migrates_the_rest() {
        // k→k+1: the new group takes about a (k+1)-th of each donor; 2→3 and 3→4 split one share, 4→5 and 16→17 do not.
        for (k, splits) in [(2u32, true), (3, true), (4, false), (5, false), (16, false)] {
            let slots = balanced(1024, k);
            let step = toward(&slots, &Goal::new(1..=k + 1, 0)).unwrap();
            let onto: Vec<_> = step.plan.moves.iter().filter(|m| m.to == k + 1).collect();
            let split = split_of(&slots, &step, k + 1);
            assert_eq!(split.is_some(), splits, "{k}→{}: {split:?}", k + 1);
            let Some(split) = split else { continue };
            let largest = (1..=k).map(|d| onto.iter().filter(|m| m.from == d).count()).max().unwrap();
            assert_eq!(split.slots.len(), largest, "{k}→{}: the largest share", k + 1);
            let mut expected: Vec<u32> = onto.iter().filter(|m| m.from == split.donor).map(|m| m.slot).collect();
            expected.sort_unstable();
            assert_eq!(split.slots, expected, "{k}→{}: exactly the donor's planned moves, ascending", k + 1);
            assert!(split.slots.len() < onto.len(), "{k}→{}: the other donors' shares are left to migrate", k + 1);
        }
        // 3→5: each new group splits the share of the donor feeding it most.
        let mut slots = balanced(1024, 3);
        for new in [4u32, 5] {
            let receivers: Vec<u32> = (1..=new).collect();
            let step = toward(&slots, &Goal::new(receivers, (5 - new) as usize)).unwrap();
            let split = split_of(&slots, &step, new).unwrap_or_else(|| panic!("3→5: group {new}"));
            for &s in &split.slots {
                assert_eq!(slots[s as usize], SlotState::owned(split.donor));
                slots[s as usize] = SlotState::owned(new);
            }
        }
        // A share worth less than a copy of its donor migrates even when that donor is the only one: 1000 slots in
        // group 1 and 24 in group 2 heading for eight groups, the first new one takes 128 of group 1's 1000.
        let slots: Vec<SlotState> = (0..1024).map(|s| SlotState::owned(if s < 1000 { 1 } else { 2 })).collect();
        let step = toward(&slots, &Goal::new([1, 2, 3], 5)).unwrap();
        let onto: Vec<u32> = step.plan.moves.iter().filter(|m| m.to == 3).map(|m| m.from).collect();
        assert_eq!(onto, vec![1; 128], "group 3 takes its 128 from group 1 alone");
        assert_eq!(split_of(&slots, &step, 3), None, "128 of 1000 is not worth a copy");
    }

    #[test]
    fn a_group_already_fed_or_fed_by_a_leaving_donor_migrates() {
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
        // Fed by a leaving group (324 slots) and by one that stays (188 of its 700): the one that stays is copied.
        let slots: Vec<SlotState> = (0..1024).map(|s| SlotState::owned(if s < 700 { 1 } else { 2 })).collect();
        let step = toward(&slots, &Goal::new([1, 3], 0)).unwrap();
        let from = |d: u32| step.plan.moves.iter().filter(|m| m.to == 3 && m.from == d).count();
        assert_eq!((from(1), from(2)), (188, 324));
        let split = split_of(&slots, &step, 3).expect("a split off group 1");
        assert_eq!((split.donor, split.slots.len()), (1, 188));
        // A group filled partly now and partly later (offline slots assigned) is not split either.
        let mut slots = balanced(64, 1);
        slots[0] = SlotState::offline();
        let step = toward(&slots, &Goal::new([1, 2], 0)).unwrap();
        assert_eq!(split_of(&slots, &step, 2), None);
    }
}
