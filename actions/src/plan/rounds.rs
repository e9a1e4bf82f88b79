//! What Codis's slot-action executor makes of a queue of actions, round by round, and the order to create a plan's
//! migrations in so that it follows the plan's schedule.
//!
//! Codis's `ProcessSlotAction` (pkg/topom/topom_action.go) runs in rounds: a round takes the action already past
//! `pending` with the lowest `index`, else the pending one with the lowest index, skipping any whose source or target
//! group the round already has (an offline source is exempt), up to `migration_parallel_slots`; then it migrates them
//! together and waits for every one before the next round. `index` is the largest index queued plus one, given slot by
//! slot in ascending order within one `create-range`. So the creation order decides the rounds: created pair by pair,
//! one group's actions can crowd out a disjoint pair that could have run beside them.

use std::collections::BTreeSet;

use super::{Plan, SlotRange};

/// One slot action in Codis's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Queued {
    /// The slot.
    pub slot: u32,
    /// Its group; `None` for an offline slot.
    pub from: Option<u32>,
    /// The action's target group.
    pub to: u32,
    /// `action.index`.
    pub index: u64,
    /// Past `pending`: the executor takes these first.
    pub started: bool,
}

/// The rounds Codis's executor runs over `queue`, each the slots it takes in the order it takes them, when every slot
/// of a round finishes within the round (no errors, no promotions).
#[must_use]
pub fn rounds(queue: &[Queued], parallel: usize) -> Vec<Vec<u32>> {
    let mut left: Vec<Queued> = queue.to_vec();
    left.sort_by_key(|q| (!q.started, q.index, q.slot));
    let mut out = Vec::new();
    while !left.is_empty() {
        let mut busy: BTreeSet<u32> = BTreeSet::new();
        let mut taken = Vec::new();
        let mut rest = Vec::with_capacity(left.len());
        for q in left {
            let free = q.from.is_none_or(|g| !busy.contains(&g)) && !busy.contains(&q.to);
            if taken.len() < parallel.max(1) && free {
                busy.extend(q.from);
                busy.insert(q.to);
                taken.push(q.slot);
            } else {
                rest.push(q);
            }
        }
        out.push(taken);
        left = rest;
    }
    out
}

/// `queue` after creating `ranges` in order, as Codis numbers them; a slot already queued keeps its action
/// (`create-range` skips it).
#[must_use]
pub fn enqueue(queue: &[Queued], ranges: &[SlotRange]) -> Vec<Queued> {
    let mut out = queue.to_vec();
    let mut queued: BTreeSet<u32> = queue.iter().map(|q| q.slot).collect();
    let mut next = queue.iter().map(|q| q.index).max().unwrap_or(0) + 1;
    for r in ranges {
        for slot in r.beg..=r.end {
            if queued.insert(slot) {
                out.push(Queued { slot, from: Some(r.from), to: r.to, index: next, started: false });
                next += 1;
            }
        }
    }
    out
}

/// The `create-range` calls that queue `plan`'s moves behind `queue` so that Codis runs them in as few rounds as the
/// plan's schedule: its runs of consecutive slots in the order of their rounds, or, when Codis would then need more
/// rounds than with every slot created alone in round order, the slots alone (one call each).
#[must_use]
pub fn submission(plan: &Plan, queue: &[Queued], parallel: usize) -> Vec<SlotRange> {
    let round_of = |slot: u32| plan.rounds.iter().position(|r| r.iter().any(|m| m.slot == slot)).unwrap_or(0);
    let mut runs = plan.ranges();
    runs.sort_by_key(|r| (round_of(r.beg), r.beg));
    if runs.len() == plan.moves.len() {
        return runs;
    }
    let mut alone: Vec<SlotRange> =
        plan.moves.iter().map(|m| SlotRange { from: m.from, to: m.to, beg: m.slot, end: m.slot }).collect();
    alone.sort_by_key(|r| (round_of(r.beg), r.beg));
    let by_runs = rounds(&enqueue(queue, &runs), parallel).len();
    let by_slot = rounds(&enqueue(queue, &alone), parallel).len();
    if by_runs <= by_slot {
        runs
    } else {
        alone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(slot: u32, from: u32, to: u32, index: u64) -> Queued {
        Queued { slot, from: Some(from), to, index, started: false }
    }

    #[test]
    fn a_round_takes_started_actions_first_then_the_lowest_indexes_of_idle_pairs() {
        let queue = [
            q(1, 1, 5, 1),
            q(2, 1, 5, 2),
            q(3, 2, 6, 3),
            Queued { started: true, ..q(4, 2, 7, 9) },
            Queued { from: None, ..q(5, 0, 8, 4) },
            Queued { from: None, ..q(6, 0, 8, 5) },
        ];
        let r = rounds(&queue, 100);
        // Slot 4 is in progress, so it runs first and keeps group 2 from slot 3; an offline source is exempt but the
        // target is not.
        assert_eq!(r, vec![vec![4, 1, 5], vec![2, 3, 6]]);
        assert_eq!(rounds(&queue, 1).len(), 6, "one slot per round when parallel is 1");
    }

    #[test]
    fn enqueue_numbers_after_the_queue_and_skips_queued_slots() {
        let queue = [q(3, 1, 2, 7)];
        let ranges = [SlotRange { from: 1, to: 4, beg: 2, end: 4 }];
        let out = enqueue(&queue, &ranges);
        assert_eq!(out.iter().map(|q| (q.slot, q.index)).collect::<Vec<_>>(), vec![(3, 7), (2, 8), (4, 9)]);
    }
}
