//! Planning one step of a change of shard count toward its final topology.
//!
//! A user who scales 4 shards to 8 in one request gets four additions that run in any order, overlapping or one
//! after another, each while some of the new shards are not registered yet. Balancing each time over the groups
//! registered so far (4→5, 5→6, ...) moves slots onto a group only to move some of them off again when the next one
//! arrives. [`toward`] instead sizes every group for the final topology — the registered groups that stay plus the
//! shards of the final topology that have no group yet ([`Goal::unregistered`]) — moves slots only onto registered
//! groups and never beyond a group's final size, and leaves the rest for the shards still to come. Every move goes
//! from a group above its final size to one below it, so whatever the order and overlap of the steps, the moves of
//! the whole change add up to the one-step minimum `Σ max(0, held − final size)` (plus every slot of a leaving
//! group), as long as the final topology stays the same throughout.
//!
//! In-flight actions are never re-planned: a slot with an action counts for its target. A group that in-flight
//! arrivals take beyond its final size gives the excess once they land ([`Step::deferred`]); everything else starts
//! at once, so Codis keeps migrating while they finish.
//!
//! Which donor feeds which receiver is chosen for parallelism (Codis lets a group take part in one migration at a
//! time): groups already busy with queued actions are avoided, and each receiver is fed by as few donors as
//! possible, preferring a donor that can cover its whole need (best fit), so that receivers arriving one by one each
//! find a donor of their own and disjoint pairs migrate side by side.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use super::{schedule, water_fill, Move, Plan, PlanError, SlotState};

/// Where a change of shard count is heading.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Goal {
    /// The registered groups that stay, in any order: they may take slots now, up to their final size. Every other
    /// group holding slots is leaving and gives them all away.
    pub receivers: Vec<u32>,
    /// Shards of the final topology that have no group yet: they count for every group's final size and take the
    /// rest once they register.
    pub unregistered: usize,
}

impl Goal {
    /// A goal over `receivers` and `unregistered` shards still to register.
    #[must_use]
    pub fn new(receivers: impl IntoIterator<Item = u32>, unregistered: usize) -> Self {
        Self { receivers: receivers.into_iter().collect(), unregistered }
    }
}

/// One planning step toward a [`Goal`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Step {
    /// What can start now. `sizes` holds every receiver's final size.
    pub plan: Plan,
    /// Slots in flight now that count for a group above its final size: they move again once landed, ascending.
    pub deferred: Vec<u32>,
}

impl Step {
    /// Whether this step starts anything that involves `gid` (as source or target).
    #[must_use]
    pub fn touches(&self, gid: u32) -> bool {
        self.plan.assign.iter().any(|&(_, g)| g == gid) || self.plan.moves.iter().any(|m| m.from == gid || m.to == gid)
    }

    /// The final size of receiver `gid`, if it is one.
    #[must_use]
    pub fn final_size(&self, gid: u32) -> Option<usize> {
        self.plan.sizes.get(&gid).copied()
    }
}

/// Plans what can start now toward `goal`: offline slots assigned and slots migrated onto registered receivers, up to
/// their final sizes, from the groups above theirs (every group that is not a receiver is above its final size of 0).
///
/// Final sizes: with `k` = receivers + unregistered shards and `N` slots, `⌊N/k⌋`, and one more for the `N mod k`
/// receivers holding the most (ties by lower gid; shards still to register rank last among those holding as little),
/// which makes the total of moves the fewest possible. Donors give their highest-numbered movable slots; each
/// donor's outgoing slots, ascending, go to its receivers in ascending gid order, so runs stay contiguous for
/// `create-range`. The busiest group of the plan, counting the actions already queued in Codis, takes part in as few
/// migrations as any plan allows; `rounds` schedule the new moves as in [`super::rebalance`].
///
/// # Errors
///
/// [`PlanError`] for malformed input only (no slots, no or duplicate receivers, group 0): in-flight actions never
/// stop a step.
pub fn toward(slots: &[SlotState], goal: &Goal) -> Result<Step, PlanError> {
    let mut ledger = Ledger::new(slots, &goal.receivers)?;
    ledger.size_for(goal.unregistered);

    let mut deferred = Vec::new();
    let mut donors: Vec<Side> = Vec::new();
    let mut outgoing: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (&gid, book) in &ledger.books {
        let surplus = book.held.saturating_sub(book.size);
        if surplus == 0 {
            continue;
        }
        let movable = surplus.min(book.movable.len());
        // What in-flight arrivals owe beyond the final size waits for them to land.
        deferred.extend(book.inbound.iter().copied().take(surplus - movable));
        if movable > 0 {
            donors.push(Side { gid, amount: movable, load: book.load });
            outgoing.insert(gid, book.movable[book.movable.len() - movable..].to_vec());
        }
    }
    deferred.sort_unstable();

    let receivers: Vec<(u32, usize, usize)> = ledger
        .books
        .iter()
        .filter(|(_, b)| b.receiver && b.size > b.held)
        .map(|(&gid, b)| (gid, b.size - b.held, b.load))
        .collect();
    let deficits: Vec<usize> = receivers.iter().map(|r| r.1).collect();
    let supply = ledger.offline.len().min(deficits.iter().sum());
    let from_offline = water_fill(&deficits, supply);
    let mut offline = ledger.offline.iter();
    let mut assign = Vec::new();
    let mut needs = Vec::new();
    for (&(gid, deficit, load), &filled) in receivers.iter().zip(&from_offline) {
        assign.extend(offline.by_ref().take(filled).map(|&slot| (slot, gid)));
        if deficit > filled {
            needs.push(Side { gid, amount: deficit - filled, load });
        }
    }
    assign.sort_unstable();

    let pairing = pair(&donors, &needs);
    let mut moves = Vec::with_capacity(pairing.flows.iter().map(|f| f.2).sum());
    for (donor, slots) in &outgoing {
        let mut flows: Vec<(u32, usize)> =
            pairing.flows.iter().filter(|f| f.0 == *donor).map(|&(_, to, n)| (to, n)).collect();
        flows.sort_unstable();
        let given: usize = flows.iter().map(|f| f.1).sum();
        let mut out = slots[slots.len() - given..].iter();
        for (to, n) in flows {
            moves.extend(out.by_ref().take(n).map(|&slot| Move { slot, from: *donor, to }));
        }
    }
    moves.sort_unstable();
    let (rounds, critical_path) = schedule(&moves);
    let sizes = ledger.books.iter().filter(|(_, b)| b.receiver).map(|(&gid, b)| (gid, b.size)).collect();
    let plan = Plan { assign, moves, rounds, critical_path, lower_bound: pairing.lower_bound, sizes };
    Ok(Step { plan, deferred })
}

/// The final size of every receiver toward `goal`, as [`toward`] gives them.
///
/// # Errors
///
/// As [`toward`].
pub fn final_sizes(slots: &[SlotState], goal: &Goal) -> Result<BTreeMap<u32, usize>, PlanError> {
    let mut ledger = Ledger::new(slots, &goal.receivers)?;
    ledger.size_for(goal.unregistered);
    Ok(ledger.books.iter().filter(|(_, b)| b.receiver).map(|(&gid, b)| (gid, b.size)).collect())
}

/// The fewest migrations that take `slots` to `goal` once every unregistered shard has registered: every slot of a
/// leaving group plus `Σ max(0, held − final size)` over the receivers (in-flight slots count for their target).
///
/// # Errors
///
/// As [`toward`].
pub fn moves_left(slots: &[SlotState], goal: &Goal) -> Result<usize, PlanError> {
    let mut ledger = Ledger::new(slots, &goal.receivers)?;
    ledger.size_for(goal.unregistered);
    Ok(ledger.books.values().map(|b| b.held.saturating_sub(b.size)).sum())
}

/// One side of the pairing: a donor with `amount` slots to give or a receiver with `amount` to take, and the queued
/// actions it already takes part in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Side {
    gid: u32,
    amount: usize,
    load: usize,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Pairing {
    /// `(donor, receiver, slots)`.
    flows: Vec<(u32, u32, usize)>,
    /// The smallest busiest-group count any pairing of these amounts can have, queued actions aside.
    lower_bound: usize,
}

/// The lowest level `b` at which `Σ min(amount, max(0, b − load))` reaches `demand` (`demand` ≤ Σ amount).
fn level(sides: &[Side], demand: usize) -> usize {
    let room = |b: usize| sides.iter().map(|s| s.amount.min(b.saturating_sub(s.load))).sum::<usize>();
    let (mut low, mut high) = (0, sides.iter().map(|s| s.load + s.amount).max().unwrap_or(0));
    while low < high {
        let mid = low + (high - low) / 2;
        if room(mid) >= demand {
            high = mid;
        } else {
            low = mid + 1;
        }
    }
    low
}

/// How much each donor sends each receiver.
///
/// When donors cannot cover every need now (the rest is in flight), the needs are cut from the top so the busiest
/// receiver stays as idle as possible. Then every group's total (queued actions included) is held to the lowest
/// bound any pairing can reach, and within it receivers, largest need first, each take from the donor that covers
/// their remaining need most tightly, or failing any, from the one with the most to give: few pairs, each donor
/// kept whole for a receiver of its own where the amounts allow.
fn pair(donors: &[Side], needs: &[Side]) -> Pairing {
    let supply: usize = donors.iter().map(|d| d.amount).sum();
    let demand: usize = needs.iter().map(|r| r.amount).sum::<usize>().min(supply);
    if demand == 0 {
        return Pairing::default();
    }
    let mut needs = needs.to_vec();
    let top = level(&needs, demand);
    let mut cut: Vec<usize> = needs.iter().map(|r| r.amount.min(top.saturating_sub(r.load))).collect();
    let mut excess = cut.iter().sum::<usize>() - demand;
    for (c, r) in cut.iter_mut().zip(&needs) {
        if excess == 0 {
            break;
        }
        if *c > 0 && r.load + *c == top {
            *c -= 1;
            excess -= 1;
        }
    }
    for (r, c) in needs.iter_mut().zip(cut) {
        r.amount = c;
    }
    needs.retain(|r| r.amount > 0);

    let receivers_bound = needs.iter().map(|r| r.load + r.amount).max().unwrap_or(0);
    let bound = receivers_bound.max(level(donors, demand));
    let unloaded = |sides: &[Side]| sides.iter().map(|s| Side { load: 0, ..*s }).collect::<Vec<_>>();
    let lower_bound = needs.iter().map(|r| r.amount).max().unwrap_or(0).max(level(&unloaded(donors), demand));

    let mut caps: Vec<(Side, usize)> =
        donors.iter().map(|d| (*d, d.amount.min(bound.saturating_sub(d.load)))).collect();
    needs.sort_by_key(|r| (Reverse(r.amount), r.gid));
    let mut flows = Vec::new();
    for r in &needs {
        let mut need = r.amount;
        while need > 0 {
            let fit = caps
                .iter()
                .enumerate()
                .filter(|(_, (_, cap))| *cap >= need)
                .min_by_key(|(_, (d, cap))| (*cap, d.load, d.gid))
                .map(|(i, _)| i);
            let pick = fit.or_else(|| {
                caps.iter()
                    .enumerate()
                    .filter(|(_, (_, cap))| *cap > 0)
                    .max_by_key(|(_, (d, cap))| (*cap, Reverse(d.load), Reverse(d.gid)))
                    .map(|(i, _)| i)
            });
            // The bound leaves room for the whole demand, so a donor with room is always left.
            let Some(i) = pick else { break };
            let take = caps[i].1.min(need);
            caps[i].1 -= take;
            need -= take;
            flows.push((caps[i].0.gid, r.gid, take));
        }
    }
    Pairing { flows, lower_bound }
}

/// The slot table by group, for one step.
struct Ledger {
    /// Every group that holds a slot, has one arriving or takes part in an action, and every receiver.
    books: BTreeMap<u32, Book>,
    /// Offline slots without an action, ascending.
    offline: Vec<u32>,
    /// Receivers, in the order given.
    receivers: Vec<u32>,
    slots: usize,
}

#[derive(Debug, Clone, Default)]
struct Book {
    receiver: bool,
    /// Slots counting for the group: owned without an action, plus arriving by an action.
    held: usize,
    /// Owned without an action, ascending.
    movable: Vec<u32>,
    /// Arriving by an in-flight action, ascending.
    inbound: Vec<u32>,
    /// Queued or running actions it takes part in, as source or target.
    load: usize,
    /// Its final size (0 when leaving).
    size: usize,
}

impl Ledger {
    fn new(slots: &[SlotState], receivers: &[u32]) -> Result<Self, PlanError> {
        if slots.is_empty() {
            return Err(PlanError::NoSlots);
        }
        let count = u32::try_from(slots.len()).map_err(|_| PlanError::TooManySlots { count: slots.len() })?;
        if receivers.is_empty() {
            return Err(PlanError::NoTargetGroup);
        }
        let mut seen = BTreeSet::new();
        for &gid in receivers {
            if gid == 0 {
                return Err(PlanError::ZeroTarget);
            }
            if !seen.insert(gid) {
                return Err(PlanError::DuplicateTarget { gid });
            }
        }
        let mut books: BTreeMap<u32, Book> =
            receivers.iter().map(|&gid| (gid, Book { receiver: true, ..Book::default() })).collect();
        let mut offline = Vec::new();
        for (slot, state) in (0..count).zip(slots) {
            match (state.in_flight_target, state.owner) {
                (Some(0), _) | (_, Some(0)) => return Err(PlanError::ZeroGroupSlot { slot }),
                (Some(to), from) => {
                    let book = books.entry(to).or_default();
                    book.held += 1;
                    book.inbound.push(slot);
                    book.load += 1;
                    if let Some(from) = from {
                        books.entry(from).or_default().load += 1;
                    }
                }
                (None, Some(gid)) => {
                    let book = books.entry(gid).or_default();
                    book.held += 1;
                    book.movable.push(slot);
                }
                (None, None) => offline.push(slot),
            }
        }
        Ok(Self { books, offline, receivers: receivers.to_vec(), slots: slots.len() })
    }

    /// Gives every receiver its final size over the receivers plus `unregistered` shards still to come.
    fn size_for(&mut self, unregistered: usize) {
        let k = self.receivers.len() + unregistered;
        let (q, r) = (self.slots / k, self.slots % k);
        let mut order: Vec<(usize, u32)> =
            self.books.iter().filter(|(_, b)| b.receiver).map(|(&gid, b)| (b.held, gid)).collect();
        order.sort_unstable_by_key(|&(held, gid)| (Reverse(held), gid));
        for (rank, (_, gid)) in order.into_iter().enumerate() {
            if let Some(book) = self.books.get_mut(&gid) {
                book.size = q + usize::from(rank < r);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use proptest::test_runner::TestCaseError;

    use super::super::rounds::{enqueue, rounds, submission, Queued};
    use super::*;

    /// Group ids spaced out, so that an index mistaken for an id fails loudly.
    fn gid(i: usize) -> u32 {
        u32::try_from(7 * i + 3).unwrap()
    }

    fn blocks(sizes: &[(u32, usize)]) -> Vec<SlotState> {
        sizes.iter().flat_map(|&(g, n)| std::iter::repeat_n(SlotState::owned(g), n)).collect()
    }

    /// `k` groups holding `n` slots the way Codis lays out a fresh cluster: contiguous, the first `n % k` one larger.
    fn balanced(n: usize, k: usize) -> Vec<SlotState> {
        let sizes: Vec<(u32, usize)> = (0..k).map(|i| (gid(i), n / k + usize::from(i < n % k))).collect();
        blocks(&sizes)
    }

    /// A slot table with Codis's queue beside it: plans are applied as Codis would run them.
    #[derive(Debug, Clone)]
    struct World {
        slots: Vec<SlotState>,
        queue: Vec<Queued>,
        moved: usize,
    }

    impl World {
        fn new(slots: Vec<SlotState>) -> Self {
            Self { slots, queue: Vec::new(), moved: 0 }
        }

        /// Plans a step toward `goal`, checks it, assigns its offline slots and queues its moves.
        fn step(&mut self, goal: &Goal) -> Result<Step, TestCaseError> {
            let step = toward(&self.slots, goal).map_err(|e| TestCaseError::fail(e.to_string()))?;
            for &(slot, g) in &step.plan.assign {
                let s = &mut self.slots[slot as usize];
                prop_assert_eq!(*s, SlotState::offline(), "slot {} assigned but not offline", slot);
                prop_assert!(goal.receivers.contains(&g), "slot {} assigned to {}, not a receiver", slot, g);
                s.owner = Some(g);
            }
            for m in &step.plan.moves {
                let s = self.slots[m.slot as usize];
                prop_assert_eq!(s, SlotState::owned(m.from), "move {:?} of a slot not idle in its group", m);
                prop_assert!(goal.receivers.contains(&m.to), "move {:?} onto a group that is no receiver", m);
            }
            let ranges = submission(&step.plan, &self.queue, 100);
            self.queue = enqueue(&self.queue, &ranges);
            prop_assert_eq!(self.queue.len(), self.in_flight() + step.plan.moves.len(), "queued slots lost");
            for m in &step.plan.moves {
                self.slots[m.slot as usize].in_flight_target = Some(m.to);
            }
            // No receiver is taken past its final size.
            let held = self.held();
            for (&g, &size) in &step.plan.sizes {
                let h = held.get(&g).copied().unwrap_or(0);
                let filled = step.touches(g) && step.plan.moves.iter().any(|m| m.to == g);
                prop_assert!(!filled || h <= size, "group {} holds {} once this step lands, above its {}", g, h, size);
            }
            Ok(step)
        }

        /// A new group `g` registering toward `goal` takes its share by a split when its step allows one: the
        /// slots change owner at once, each counted as a move.
        fn split(&mut self, goal: &Goal, g: u32) -> Result<(), TestCaseError> {
            let step = toward(&self.slots, goal).map_err(|e| TestCaseError::fail(e.to_string()))?;
            if let Some(split) = super::super::split::split_of(&self.slots, &step, g) {
                for &slot in &split.slots {
                    let s = &mut self.slots[slot as usize];
                    prop_assert_eq!(*s, SlotState::owned(split.donor), "split of slot {} not idle in its donor", slot);
                    s.owner = Some(g);
                    self.moved += 1;
                }
            }
            Ok(())
        }

        fn in_flight(&self) -> usize {
            self.slots.iter().filter(|s| s.in_flight_target.is_some()).count()
        }

        /// Slots counting for each group (arrivals included).
        fn held(&self) -> BTreeMap<u32, usize> {
            let mut held = BTreeMap::new();
            for s in &self.slots {
                if let Some(g) = s.settled_owner() {
                    *held.entry(g).or_insert(0) += 1;
                }
            }
            held
        }

        /// Lets Codis run up to `n` rounds of its queue; returns how many it ran.
        fn run(&mut self, n: usize) -> usize {
            let plan = rounds(&self.queue, 100);
            let ran = plan.len().min(n);
            for round in &plan[..ran] {
                for &slot in round {
                    let s = &mut self.slots[slot as usize];
                    if s.owner.is_some() {
                        self.moved += 1;
                    }
                    s.owner = s.in_flight_target.take();
                }
            }
            let done: BTreeSet<u32> = plan[..ran].iter().flatten().copied().collect();
            self.queue.retain(|q| !done.contains(&q.slot));
            ran
        }
    }

    #[derive(Debug, Clone)]
    struct Change {
        slots: usize,
        before: usize,
        stay: Vec<u32>,
        added: Vec<u32>,
        /// How the additions and removals interleave with Codis's rounds: `(actor, rounds before it plans, plans
        /// again after that many rounds)`.
        script: Vec<(usize, usize, usize)>,
        layout: u8,
    }

    fn change() -> impl Strategy<Value = Change> {
        (1usize..=9, 0usize..=9, 0u8..3, prop_oneof![Just(1024usize), 16usize..=300])
            .prop_flat_map(|(before, added, layout, slots)| {
                let stay = prop::sample::subsequence((0..before).collect::<Vec<_>>(), 0..=before);
                (Just(before), Just(added), Just(layout), Just(slots), stay)
            })
            .prop_filter("a topology is left", |(_, added, _, _, stay)| added + stay.len() > 0)
            .prop_flat_map(|(before, added, layout, slots, stay)| {
                let actors = added + before - stay.len();
                let script = prop::collection::vec((0..actors.max(1), 0usize..40, 0usize..60), actors..=actors * 2);
                let order = Just((0..actors).collect::<Vec<_>>()).prop_shuffle();
                (Just(before), Just(added), Just(layout), Just(slots), Just(stay), script, order)
            })
            .prop_map(|(before, added, layout, slots, stay, mut script, order)| {
                // Every actor runs at least once, in shuffled order; the rest of the script reruns some of them.
                for (i, &actor) in order.iter().enumerate() {
                    if let Some(s) = script.get_mut(i) {
                        s.0 = actor;
                    }
                }
                Change {
                    slots,
                    before,
                    stay: stay.into_iter().map(gid).collect(),
                    added: (before..before + added).map(gid).collect(),
                    script,
                    layout,
                }
            })
    }

    fn initial(c: &Change) -> Vec<SlotState> {
        match c.layout {
            0 => balanced(c.slots, c.before),
            1 => {
                // Uneven contiguous blocks, as after earlier single-step changes.
                let mut sizes: Vec<(u32, usize)> = Vec::new();
                let mut left = c.slots;
                for i in 0..c.before {
                    let n = if i + 1 == c.before { left } else { (left * (i % 3 + 1)) / (c.before - i + 2) };
                    sizes.push((gid(i), n));
                    left -= n;
                }
                blocks(&sizes)
            }
            _ => (0..c.slots).map(|s| SlotState::owned(gid((s * 7919) % c.before))).collect(),
        }
    }

    /// Plays `c` against Codis's rounds and checks the whole change; `splits` hands a new group its slots by a split
    /// whenever [`split_of`](super::super::split::split_of) finds one, as the product's additions do.
    fn interleave(c: &Change, splits: bool) -> Result<(), TestCaseError> {
        let slots = initial(c);
        let finals: Vec<u32> = c.stay.iter().chain(&c.added).copied().collect();
        let minimum = moves_left(&slots, &Goal::new(finals.clone(), 0)).unwrap();
        let leaving: Vec<u32> = (0..c.before).map(gid).filter(|g| !c.stay.contains(g)).collect();
        let mut world = World::new(slots);
        let mut registered: BTreeSet<u32> = c.stay.iter().copied().collect();
        let goal = |registered: &BTreeSet<u32>| {
            Goal::new(registered.iter().copied(), c.added.iter().filter(|g| !registered.contains(g)).count())
        };
        for &(actor, wait, again) in &c.script {
            world.run(wait);
            // Actors are the additions first, then the removals; an addition registers its group first.
            if let Some(&g) = c.added.get(actor) {
                let new = registered.insert(g);
                if splits && new {
                    world.split(&goal(&registered), g)?;
                }
            } else {
                prop_assert!(leaving.get(actor - c.added.len()).is_some());
            }
            if registered.is_empty() {
                continue;
            }
            world.step(&goal(&registered))?;
            world.run(again);
            world.step(&goal(&registered))?;
        }
        // Whatever registered late finishes the change.
        registered.extend(&c.added);
        loop {
            let step = world.step(&goal(&registered))?;
            if world.queue.is_empty() && step.plan.is_empty() {
                prop_assert!(step.deferred.is_empty());
                break;
            }
            world.run(usize::MAX);
        }
        prop_assert_eq!(world.moved, minimum, "moves over the whole change");
        let held = world.held();
        prop_assert!(held.keys().all(|g| finals.contains(g)), "slots left outside the final groups: {:?}", held);
        let (lo, hi) = (finals.iter().map(|g| held.get(g).copied().unwrap_or(0)).min(), held.values().max());
        prop_assert!(hi.copied().unwrap_or(0) - lo.unwrap_or(0) <= 1, "unbalanced: {:?}", held);
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Additions and removals of one change, planned in any order and overlap with Codis's rounds, move exactly
        /// as many slots as the one-step plan over the final topology, and end balanced over it.
        #[test]
        fn any_interleaving_of_one_change_reaches_the_one_step_minimum(c in change()) {
            interleave(&c, false)?;
        }

        /// The same when every addition whose step fills it from one donor takes those slots by a split (handed
        /// over at once, no migration) instead.
        #[test]
        fn any_interleaving_with_splits_reaches_the_one_step_minimum(c in change()) {
            interleave(&c, true)?;
        }

        /// One step over every group at once is as few moves as the one-shot planner, and Codis's executor runs it
        /// in exactly as many rounds as its critical path, which is the lower bound.
        #[test]
        fn a_whole_change_at_once_is_the_fewest_moves_in_the_fewest_rounds(c in change()) {
            let slots = initial(&c);
            let finals: Vec<u32> = c.stay.iter().chain(&c.added).copied().collect();
            let step = toward(&slots, &Goal::new(finals.clone(), 0)).unwrap();
            let one_shot = super::super::rebalance(&slots, &finals).unwrap();
            prop_assert_eq!(step.plan.moves.len(), one_shot.moves.len());
            prop_assert!(step.deferred.is_empty());
            prop_assert_eq!(step.plan.critical_path, step.plan.lower_bound);
            let queue = enqueue(&[], &submission(&step.plan, &[], 100));
            prop_assert_eq!(rounds(&queue, 100).len(), step.plan.critical_path, "codis's rounds");
        }
    }

    #[test]
    fn four_to_eight_one_addition_at_a_time_pairs_each_new_group_with_a_donor_of_its_own() {
        let mut world = World::new(balanced(1024, 4));
        let mut registered: BTreeSet<u32> = (0..4).map(gid).collect();
        for (i, new) in (4..8).map(gid).enumerate() {
            registered.insert(new);
            let step = world.step(&Goal::new(registered.iter().copied(), 3 - i)).unwrap();
            let donors: BTreeSet<u32> = step.plan.moves.iter().map(|m| m.from).collect();
            assert_eq!(step.plan.moves.len(), 128, "addition {i}");
            assert_eq!(donors.len(), 1, "addition {i} takes from {donors:?}");
            assert!(step.plan.moves.iter().all(|m| m.to == new));
            // Codis runs a few rounds of the earlier additions meanwhile.
            if i < 3 {
                world.run(5);
            }
        }
        // Four disjoint pairs: each round of Codis's executor takes four slots until the first pairs are done.
        let rounds = rounds(&world.queue, 100);
        assert_eq!(rounds.len(), 128);
        let widths: Vec<usize> = rounds.iter().map(Vec::len).collect();
        assert!(widths[..113].iter().all(|&w| w == 4), "{widths:?}");
        while world.run(1) > 0 {}
        assert_eq!(world.moved, 512);
        assert!(world.held().values().all(|&h| h == 128), "{:?}", world.held());
    }

    #[test]
    fn eight_to_four_drains_each_leaving_group_into_one_group_that_stays() {
        let slots = balanced(1024, 8);
        let step = toward(&slots, &Goal::new((0..4).map(gid), 0)).unwrap();
        assert_eq!(step.plan.moves.len(), 512);
        let pairs: BTreeSet<(u32, u32)> = step.plan.moves.iter().map(|m| (m.from, m.to)).collect();
        assert_eq!(pairs.len(), 4, "{pairs:?}");
        assert_eq!(step.plan.critical_path, 128);
        assert_eq!(rounds(&enqueue(&[], &submission(&step.plan, &[], 100)), 100).len(), 128);
    }

    #[test]
    fn shards_still_to_register_keep_their_share_with_the_donors() {
        // 3 groups of 8 slots, 3 more shards coming: the one registered takes 4 and no more.
        let slots = balanced(24, 3);
        let step = toward(&slots, &Goal::new([gid(0), gid(1), gid(2), gid(3)], 2)).unwrap();
        assert_eq!(step.plan.moves.len(), 4);
        assert_eq!(step.final_size(gid(3)), Some(4));
        assert!(step.plan.moves.iter().all(|m| m.to == gid(3)));
        assert_eq!(moves_left(&slots, &Goal::new([gid(0), gid(1), gid(2), gid(3)], 2)).unwrap(), 12);
        // Offline slots are assigned to registered groups only, up to their final size.
        let slots = vec![SlotState::offline(); 12];
        let step = toward(&slots, &Goal::new([gid(0)], 2)).unwrap();
        assert_eq!(step.plan.assign, (0..4).map(|s| (s, gid(0))).collect::<Vec<_>>());
    }

    #[test]
    fn in_flight_arrivals_beyond_a_final_size_are_deferred_and_the_rest_starts() {
        // Group 3 has 6 arriving (planned when fewer shards were listed) but its final size is now 4: two wait.
        let mut slots = balanced(24, 3);
        for s in slots.iter_mut().take(6) {
            s.in_flight_target = Some(gid(3));
        }
        let step = toward(&slots, &Goal::new([gid(0), gid(1), gid(2), gid(3), gid(4)], 1)).unwrap();
        assert_eq!(step.deferred.len(), 2);
        assert_eq!(step.final_size(gid(3)), Some(4));
        // Group 4 still gets its 4, from the groups over theirs that can give now.
        assert_eq!(step.plan.moves.iter().filter(|m| m.to == gid(4)).count(), 4);
        assert!(step.plan.moves.iter().all(|m| m.from != gid(3)));
    }

    #[test]
    fn a_second_addition_avoids_the_donor_the_first_keeps_busy() {
        // 2 groups of 12 each, the first addition's 4 from group 0 are queued, and a second addition arrives.
        let mut slots = balanced(24, 2);
        for s in &mut slots[8..12] {
            s.in_flight_target = Some(gid(2));
        }
        let step = toward(&slots, &Goal::new([gid(0), gid(1), gid(2), gid(3)], 0)).unwrap();
        // The new group takes all of its 6 from the idle donor; the 2 that group 0 still has to give go where group
        // 0 is busy anyway.
        let pairs: Vec<(u32, u32)> = step.plan.moves.iter().map(|m| (m.from, m.to)).collect();
        assert_eq!(pairs.iter().filter(|p| **p == (gid(1), gid(3))).count(), 6, "{pairs:?}");
        assert_eq!(pairs.iter().filter(|p| **p == (gid(0), gid(2))).count(), 2, "{pairs:?}");
        assert_eq!(pairs.len(), 8);
    }

    #[test]
    fn malformed_goals_are_refused_and_in_flight_actions_never_are() {
        let slots = balanced(8, 2);
        assert_eq!(toward(&[], &Goal::new([gid(0)], 0)), Err(PlanError::NoSlots));
        assert_eq!(toward(&slots, &Goal::new([], 3)), Err(PlanError::NoTargetGroup));
        assert_eq!(toward(&slots, &Goal::new([0], 0)), Err(PlanError::ZeroTarget));
        assert_eq!(toward(&slots, &Goal::new([gid(0), gid(0)], 0)), Err(PlanError::DuplicateTarget { gid: gid(0) }));
        // Everything in flight into a leaving group: nothing to do but wait.
        let slots: Vec<SlotState> = (0..8).map(|_| SlotState::migrating(Some(gid(0)), gid(1))).collect();
        let step = toward(&slots, &Goal::new([gid(0)], 0)).unwrap();
        assert!(step.plan.is_empty());
        assert_eq!(step.deferred, (0..8).collect::<Vec<_>>());
    }
}
