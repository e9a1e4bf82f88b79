//! Pure planning: which slots move where, which replica becomes master. No I/O.
//!
//! The actions gather facts first (the Codis slot table, `INFO replication` of each member, the rollout's updated
//! pods), then ask this module what to do, then apply the answer through the Codis and pika clients. Keeping the
//! decision apart from the calls is what lets it be tested exhaustively: every function here is deterministic over
//! plain values, so the property tests below replay thousands of random topologies without a server.
//!
//! Slots: [`rebalance`] and [`drain`] compute the fewest migrations that leave the target groups within one slot of
//! each other, then schedule them in rounds that respect Codis' rule that a group takes part in one migration at a
//! time (its executor accepts a slot only when neither its source nor its target group is busy in that round).
//! [`toward`] (what the actions run) plans one step of a change of shard count toward its final topology, so that
//! additions and removals running in any order and overlap move no slot twice; [`rounds`] models how Codis's
//! executor takes a queue of actions and orders the creations so that it follows the plan's schedule.
//! Masters: [`choose_new_master`] picks whom a switchover promotes: the given candidate when it is fit, else the best
//! fit replica (already updated by the rollout, then the furthest binlog position, then the ordinal rule); [`resync`]
//! decides whether a member pointed at a new master may sync incrementally or must copy it in full.
//! Failovers: [`salvage`] sorts a failed-over master's binlog tail into each key's history, to write again where the
//! key is missing.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::input::replication::{BinlogPosition, SyncState};

pub mod detector;
pub mod keyslot;
pub mod proxies;
pub mod resync;
pub mod rounds;
pub mod salvage;
pub mod split;
mod toward;

pub use toward::{final_sizes, moves_left, toward, Goal, Step};

/// One slot as the dashboard reports it (`stats.slots[i]`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct SlotState {
    /// The group that owns the slot; `None` for an offline slot (Codis `group_id: 0`).
    pub owner: Option<u32>,
    /// The target group of the slot's action, if it has one in any state (`action.target_id`).
    pub in_flight_target: Option<u32>,
}

impl SlotState {
    /// A slot that no group owns and nothing migrates.
    #[must_use]
    pub const fn offline() -> Self {
        Self { owner: None, in_flight_target: None }
    }

    /// A slot owned by `gid` with no action.
    #[must_use]
    pub const fn owned(gid: u32) -> Self {
        Self { owner: Some(gid), in_flight_target: None }
    }

    /// A slot owned by `owner` (or offline) with an action towards `target`.
    #[must_use]
    pub const fn migrating(owner: Option<u32>, target: u32) -> Self {
        Self { owner, in_flight_target: Some(target) }
    }

    /// The group the slot counts for: the action's target once the action finishes, else the owner.
    #[must_use]
    pub const fn settled_owner(&self) -> Option<u32> {
        match self.in_flight_target {
            Some(gid) => Some(gid),
            None => self.owner,
        }
    }
}

/// One slot migration from group `from` to group `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Move {
    /// The slot id.
    pub slot: u32,
    /// The group that owns the slot now.
    pub from: u32,
    /// The group that owns it afterwards.
    pub to: u32,
}

/// Consecutive slots migrating between the same two groups: one `slots/action/create-range/{x}/{beg}/{end}/{to}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SlotRange {
    /// The source group.
    pub from: u32,
    /// The target group.
    pub to: u32,
    /// First slot id of the run.
    pub beg: u32,
    /// Last slot id of the run, inclusive as in Codis.
    pub end: u32,
}

/// The work that balances the slots over the target groups.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Offline slots handed straight to a group as `(slot, gid)`, ascending by slot: no data moves, so they go
    /// through `slots/assign` and cost no migration.
    pub assign: Vec<(u32, u32)>,
    /// The migrations, ascending by slot; as few as any balanced outcome allows.
    pub moves: Vec<Move>,
    /// The moves split into rounds in which no group appears twice, so one round can run at once under Codis' rule
    /// of one migration per group; every round is ascending by slot.
    pub rounds: Vec<Vec<Move>>,
    /// The most moves any one group takes part in, as source or target: the number of sequential rounds a perfect
    /// scheduler needs, and `rounds.len()`.
    pub critical_path: usize,
    /// The smallest critical path any plan with this many moves can have: a donor must send its surplus one slot at
    /// a time, and a receiver must take whatever part of its deficit the offline slots cannot fill.
    pub lower_bound: usize,
    /// How many slots each target group holds once the plan and the in-flight actions are done.
    pub sizes: BTreeMap<u32, usize>,
}

/// Why no slot plan could be made; nothing should be changed in Codis.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The slot table is empty.
    #[error("no slots to plan: the slot table is empty")]
    NoSlots,
    /// More slots than slot ids fit in 32 bits.
    #[error("{count} slots are more than codis can number")]
    TooManySlots {
        /// How many slots were given.
        count: usize,
    },
    /// The target set is empty.
    #[error("no group to hold slots")]
    NoTargetGroup,
    /// A group id appears twice in the target set.
    #[error("group {gid} is listed twice among the target groups")]
    DuplicateTarget {
        /// The repeated group id.
        gid: u32,
    },
    /// Group 0 was named as a target; Codis reads group 0 as "offline".
    #[error("group 0 cannot hold slots: codis reads group 0 as offline")]
    ZeroTarget,
    /// A slot names group 0 as owner or action target; the caller must pass offline slots as `None`.
    #[error("slot {slot} names group 0, which codis reads as offline")]
    ZeroGroupSlot {
        /// The slot id.
        slot: u32,
    },
    /// A slot is migrating to a group that must end empty; the action must finish (or be removed while pending)
    /// before the group can be drained.
    #[error("slot {slot} is migrating to group {gid}, which must end with no slots; wait for the action or remove it")]
    InFlightToLeavingGroup {
        /// The slot id.
        slot: u32,
        /// Its action's target group.
        gid: u32,
    },
    /// In-flight actions already give a group more slots than its balanced share, and those slots cannot be
    /// re-planned until their actions finish.
    #[error("group {gid} is owed {pinned} slots by in-flight actions, more than its share of {quota}; wait for them")]
    PinnedOverQuota {
        /// The group.
        gid: u32,
        /// Slots that count for it and cannot move.
        pinned: usize,
        /// The most it may hold in a balanced outcome.
        quota: usize,
    },
    /// [`drain`] was asked to keep the group it drains.
    #[error("group {gid} cannot both leave and remain")]
    LeavingGroupRemains {
        /// The group.
        gid: u32,
    },
}

/// Plans the fewest migrations that leave every slot in a target group and the target groups within one slot of
/// each other.
///
/// `slots[i]` is slot `i`; any number of slots works. Groups not in `targets` give away every slot they own, which
/// is how a drain is expressed. Slots with an action count for the action's target and are never re-planned.
///
/// How it chooses, and why that is optimal: with `k` targets and `N` slots the balanced sizes are `q = N / k` for
/// `k - r` groups and `q + 1` for `r = N % k` groups. A group over its size must give the excess away, so moves =
/// slots of non-target groups + Σ max(0, held − size). Giving a `q + 1` size to a group holding more than `q` saves
/// exactly one move, to any other group none, so the `r` larger sizes go to the groups holding the most (ties by
/// lower gid); that choice also keeps the busiest donor and receiver as idle as possible, which is what makes
/// `critical_path == lower_bound`. Offline slots fill the largest deficits first for the same reason. Donors give
/// their highest-numbered slots (as Codis does) and the outgoing slots, in ascending order, go to receivers in
/// ascending gid order, so contiguous runs stay together for `create-range` ([`Plan::ranges`]). The rounds are a
/// proper edge colouring of the donor–receiver multigraph with as many colours as its largest degree, which König's
/// theorem guarantees for bipartite graphs.
///
/// # Errors
///
/// [`PlanError`] when the input is malformed (no slots, no or duplicate targets, group 0) or when in-flight
/// actions make a balanced outcome impossible until they finish ([`PlanError::InFlightToLeavingGroup`],
/// [`PlanError::PinnedOverQuota`]).
pub fn rebalance(slots: &[SlotState], targets: &[u32]) -> Result<Plan, PlanError> {
    let mut tally = Tally::new(slots, targets)?;
    tally.set_quotas()?;

    // Donors: every slot of a non-target group, and each target group's excess, highest-numbered first.
    let mut outgoing: Vec<(u32, u32)> = Vec::new();
    let mut busiest_donor = 0;
    for (&gid, owned) in &tally.leaving {
        busiest_donor = busiest_donor.max(owned.len());
        outgoing.extend(owned.iter().map(|&slot| (slot, gid)));
    }
    for t in &tally.targets {
        let surplus = t.held.saturating_sub(t.quota);
        if surplus > 0 {
            busiest_donor = busiest_donor.max(surplus);
            let first = t.movable.len().saturating_sub(surplus);
            outgoing.extend(t.movable.iter().skip(first).map(|&slot| (slot, t.gid)));
        }
    }
    outgoing.sort_unstable();

    let deficits: Vec<usize> = tally.targets.iter().map(|t| t.quota.saturating_sub(t.held)).collect();
    let from_offline = water_fill(&deficits, tally.offline.len());

    // Receivers in ascending gid order take the offline slots, then the outgoing slots, both in ascending order.
    let mut offline = tally.offline.iter();
    let mut assign = Vec::with_capacity(tally.offline.len());
    let mut outgoing_iter = outgoing.iter();
    let mut moves = Vec::with_capacity(outgoing.len());
    let mut busiest_receiver = 0;
    for ((t, &deficit), &filled) in tally.targets.iter().zip(&deficits).zip(&from_offline) {
        let to = t.gid;
        assign.extend(offline.by_ref().take(filled).map(|&slot| (slot, to)));
        let by_move = deficit.saturating_sub(filled);
        busiest_receiver = busiest_receiver.max(by_move);
        moves.extend(outgoing_iter.by_ref().take(by_move).map(|&(slot, from)| Move { slot, from, to }));
    }
    assign.sort_unstable();
    moves.sort_unstable();

    let (rounds, critical_path) = schedule(&moves);
    let sizes = tally.targets.iter().map(|t| (t.gid, t.quota)).collect();
    Ok(Plan { assign, moves, rounds, critical_path, lower_bound: busiest_donor.max(busiest_receiver), sizes })
}

/// Plans the removal of every slot from group `leaving`, balancing them (and everything else) over `remaining`.
///
/// It is [`rebalance`] with `leaving` left out of the targets; any other group missing from `remaining` is drained
/// as well. With `c_g` the slots counting for group `g` (owned or arriving by an in-flight action), `k` remaining
/// groups, `q = N / k` and `r = N % k`, the number of moves is exactly
///
/// ```text
/// c_leaving + Σ_{g ∈ remaining} max(0, c_g − q − 1) + max(0, #{g ∈ remaining : c_g > q} − r)
/// ```
///
/// (plus the slots of any other non-remaining group). The extra terms are zero — the drain moves only the leaving
/// group's slots — whenever no remaining group holds more than `q + 1` and at most `r` hold `q + 1`, which is always
/// the case when the cluster was balanced before, over the remaining groups plus the leaving one.
///
/// # Errors
///
/// [`PlanError::LeavingGroupRemains`] when `remaining` contains `leaving`; otherwise as [`rebalance`].
pub fn drain(slots: &[SlotState], leaving: u32, remaining: &[u32]) -> Result<Plan, PlanError> {
    if remaining.contains(&leaving) {
        return Err(PlanError::LeavingGroupRemains { gid: leaving });
    }
    rebalance(slots, remaining)
}

/// What can start now when in-flight actions stand in the way of a [`rebalance`] ([`PlanError::InFlightToLeavingGroup`],
/// [`PlanError::PinnedOverQuota`]): every action is taken as done (its slot owned by its target), the rest is
/// planned as usual, and only the work on slots that have no action is kept. Also returns the slots whose work
/// had to wait (in flight now, to move again once landed), ascending.
///
/// So Codis is handed everything but the few slots still in flight and keeps migrating while those finish, instead
/// of idling until the next plan; once they have landed, a [`rebalance`] plans them (the kept moves are then in
/// flight and never fill a group beyond the size this plan gave it, so that plan succeeds).
///
/// # Errors
///
/// As [`rebalance`], except the two in-flight errors, which cannot arise once every action counts as done.
pub fn around_in_flight(slots: &[SlotState], targets: &[u32]) -> Result<(Plan, Vec<u32>), PlanError> {
    let settled: Vec<SlotState> =
        slots.iter().map(|s| SlotState { owner: s.settled_owner(), in_flight_target: None }).collect();
    let mut plan = rebalance(&settled, targets)?;
    let idle = |slot: u32| slots.get(slot as usize).is_some_and(|s| s.in_flight_target.is_none());
    let deferred: Vec<u32> = plan.moves.iter().map(|m| m.slot).filter(|&slot| !idle(slot)).collect();
    plan.moves.retain(|m| idle(m.slot));
    plan.assign.retain(|&(slot, _)| idle(slot));
    let (rounds, critical_path) = schedule(&plan.moves);
    plan.rounds = rounds;
    plan.critical_path = critical_path;
    plan.lower_bound = plan.lower_bound.min(critical_path);
    Ok((plan, deferred))
}

impl Plan {
    /// True when there is nothing to start: once the in-flight actions finish, every slot sits in a balanced
    /// target group.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.assign.is_empty() && self.moves.is_empty()
    }

    /// The moves as runs of consecutive slots with the same source and target, ascending by first slot, one
    /// `create-range` call each.
    #[must_use]
    pub fn ranges(&self) -> Vec<SlotRange> {
        let mut by_pair = self.moves.clone();
        by_pair.sort_unstable_by_key(|m| (m.from, m.to, m.slot));
        let mut ranges: Vec<SlotRange> = Vec::new();
        for m in by_pair {
            if let Some(last) = ranges.last_mut() {
                if last.from == m.from && last.to == m.to && last.end.checked_add(1) == Some(m.slot) {
                    last.end = m.slot;
                    continue;
                }
            }
            ranges.push(SlotRange { from: m.from, to: m.to, beg: m.slot, end: m.slot });
        }
        ranges.sort_unstable_by_key(|r| (r.beg, r.from, r.to));
        ranges
    }
}

/// The slot table sorted by what each group holds.
struct Tally {
    /// The target groups, ascending by gid.
    targets: Vec<Target>,
    /// Slots of groups outside the target set, ascending per group.
    leaving: BTreeMap<u32, Vec<u32>>,
    /// Offline slots without an action, ascending.
    offline: Vec<u32>,
    /// All slots.
    slots: usize,
}

/// One target group's part of the table.
struct Target {
    gid: u32,
    /// Slots counting for the group, including arrivals by in-flight actions.
    held: usize,
    /// Of those, the arrivals by in-flight actions, which cannot move again.
    pinned: usize,
    /// Slots the group owns without an action, ascending.
    movable: Vec<u32>,
    /// Its balanced size, once [`Tally::set_quotas`] has run.
    quota: usize,
}

impl Tally {
    fn new(slots: &[SlotState], targets: &[u32]) -> Result<Self, PlanError> {
        if slots.is_empty() {
            return Err(PlanError::NoSlots);
        }
        let count = u32::try_from(slots.len()).map_err(|_| PlanError::TooManySlots { count: slots.len() })?;
        if targets.is_empty() {
            return Err(PlanError::NoTargetGroup);
        }
        let mut gids = targets.to_vec();
        gids.sort_unstable();
        if gids.first() == Some(&0) {
            return Err(PlanError::ZeroTarget);
        }
        if let Some(pair) = gids.windows(2).find(|w| w[0] == w[1]) {
            return Err(PlanError::DuplicateTarget { gid: pair[0] });
        }
        let targets = gids.into_iter().map(|gid| Target { gid, held: 0, pinned: 0, movable: Vec::new(), quota: 0 });
        let mut tally =
            Self { targets: targets.collect(), leaving: BTreeMap::new(), offline: Vec::new(), slots: slots.len() };
        for (slot, state) in (0..count).zip(slots) {
            match (state.in_flight_target, state.owner) {
                (Some(0), _) | (_, Some(0)) => return Err(PlanError::ZeroGroupSlot { slot }),
                (Some(gid), _) => {
                    let t = tally.target(gid).ok_or(PlanError::InFlightToLeavingGroup { slot, gid })?;
                    t.held += 1;
                    t.pinned += 1;
                }
                (None, Some(gid)) => match tally.target(gid) {
                    Some(t) => {
                        t.held += 1;
                        t.movable.push(slot);
                    }
                    None => tally.leaving.entry(gid).or_default().push(slot),
                },
                (None, None) => tally.offline.push(slot),
            }
        }
        Ok(tally)
    }

    fn target(&mut self, gid: u32) -> Option<&mut Target> {
        let i = self.targets.binary_search_by_key(&gid, |t| t.gid).ok()?;
        self.targets.get_mut(i)
    }

    /// Gives each target group its balanced size, chosen for the fewest moves and then the shortest critical path.
    fn set_quotas(&mut self) -> Result<(), PlanError> {
        let k = self.targets.len();
        let (q, r) = (self.slots / k, self.slots % k);
        // The r sizes of q + 1 go to the groups holding the most. Groups that in-flight actions already fill beyond
        // q must get one; among groups holding the same number they come first, which costs nothing because the
        // saving per larger size is the same.
        let mut order: Vec<&mut Target> = self.targets.iter_mut().collect();
        order.sort_unstable_by_key(|t| (Reverse(t.pinned > q), Reverse(t.held), t.gid));
        for (rank, t) in order.iter_mut().enumerate() {
            t.quota = q + usize::from(rank < r);
        }
        match order.iter().find(|t| t.pinned > t.quota) {
            Some(t) => Err(PlanError::PinnedOverQuota { gid: t.gid, pinned: t.pinned, quota: t.quota }),
            None => Ok(()),
        }
    }
}

/// How many offline slots each receiver gets: the deficits are filled from the top down, so the part left for
/// migrations is as even as it can be and the busiest receiver is as idle as possible.
///
/// `supply` never exceeds the total deficit, because every slot ends in some target group.
fn water_fill(deficits: &[usize], supply: usize) -> Vec<usize> {
    let above = |level: usize| deficits.iter().map(|&d| d.saturating_sub(level)).sum::<usize>();
    // The lowest level L such that filling every deficit down to L needs no more than the supply.
    let (mut low, mut high) = (0, deficits.iter().copied().max().unwrap_or(0));
    while low < high {
        let mid = low + (high - low) / 2;
        if above(mid) <= supply {
            high = mid;
        } else {
            low = mid + 1;
        }
    }
    let level = low;
    let mut filled: Vec<usize> = deficits.iter().map(|&d| d.saturating_sub(level)).collect();
    // What is left is less than the number of receivers sitting at the level (L is the lowest), one slot each.
    let mut left = supply.saturating_sub(filled.iter().sum());
    for (fill, &d) in filled.iter_mut().zip(deficits) {
        if left == 0 {
            break;
        }
        if level > 0 && d >= level {
            *fill += 1;
            left -= 1;
        }
    }
    filled
}

/// Splits the moves into rounds where no group appears twice, as few as the busiest group allows; returns the
/// rounds and that busiest group's move count.
///
/// Alternating-path edge colouring of the bipartite donor–receiver multigraph: an edge takes a colour `a` free at its
/// donor; if `a` is taken at the receiver, the path of edges coloured `a`, `b`, `a`, … from the receiver (with `b`
/// free there) swaps its two colours. In a bipartite graph that path cannot reach the donor, so `a` is then free at
/// both ends and no more than max-degree colours are ever used.
fn schedule(moves: &[Move]) -> (Vec<Vec<Move>>, usize) {
    let mut gids: Vec<u32> = moves.iter().flat_map(|m| [m.from, m.to]).collect();
    gids.sort_unstable();
    gids.dedup();
    let vertex = |gid: u32| gids.binary_search(&gid).unwrap_or(0);
    let ends: Vec<(usize, usize)> = moves.iter().map(|m| (vertex(m.from), vertex(m.to))).collect();
    let mut degree = vec![0usize; gids.len()];
    for &(u, v) in &ends {
        degree[u] += 1;
        degree[v] += 1;
    }
    let width = degree.iter().copied().max().unwrap_or(0);
    let mut table = Incidence::new(gids.len(), width);
    let mut colour = vec![0usize; ends.len()];
    // Every colour below hint[x] is taken at x; kept by lowering it whenever a path swap frees a colour at x.
    let mut hint = vec![0usize; gids.len()];
    let mut path = Vec::new();
    for (e, &(u, v)) in ends.iter().enumerate() {
        let a = table.free(u, &mut hint[u]);
        let b = table.free(v, &mut hint[v]);
        if table.get(v, a).is_some() {
            path.clear();
            let (mut at, mut want) = (v, a);
            while let Some(f) = table.get(at, want) {
                path.push(f);
                let (x, y) = ends[f];
                at = if x == at { y } else { x };
                want = if want == a { b } else { a };
            }
            for &f in &path {
                let (x, y) = ends[f];
                table.clear(x, colour[f]);
                table.clear(y, colour[f]);
            }
            for &f in &path {
                colour[f] = if colour[f] == a { b } else { a };
                let (x, y) = ends[f];
                table.set(x, colour[f], f);
                table.set(y, colour[f], f);
            }
            // Inner vertices keep both colours, and `v` trades `a` for `b` only to take `a` back below; only the far
            // end really frees a colour (the one it had, not `want`). Lowering other hints would make busy groups
            // rescan thousands of colours per edge.
            let lost = if want == a { b } else { a };
            hint[at] = hint[at].min(lost);
        }
        colour[e] = a;
        table.set(u, a, e);
        table.set(v, a, e);
    }
    let mut rounds = vec![Vec::new(); width];
    for (m, &c) in moves.iter().zip(&colour) {
        rounds[c].push(*m);
    }
    (rounds, width)
}

/// Which edge holds each (group, colour) pair during [`schedule`].
enum Incidence {
    /// A `groups × colours` table holding edge + 1 (0 = free), zeroed in one allocation; the fast choice whenever it
    /// fits in a few megabytes.
    Dense { width: usize, cells: Vec<usize> },
    /// For many small groups beside one very busy group, where the table would be mostly empty and too large.
    Sparse(HashMap<(usize, usize), usize>),
}

impl Incidence {
    /// Above this many cells (16 MiB) the sparse form is used.
    const DENSE_CELLS: usize = 1 << 21;

    fn new(groups: usize, width: usize) -> Self {
        match groups.checked_mul(width) {
            Some(cells) if cells <= Self::DENSE_CELLS => Self::Dense { width, cells: vec![0; cells] },
            _ => Self::Sparse(HashMap::new()),
        }
    }

    fn get(&self, group: usize, colour: usize) -> Option<usize> {
        match self {
            Self::Dense { width, cells } if colour < *width => {
                cells.get(group * width + colour).and_then(|&cell| cell.checked_sub(1))
            }
            Self::Dense { .. } => None,
            Self::Sparse(map) => map.get(&(group, colour)).copied(),
        }
    }

    fn set(&mut self, group: usize, colour: usize, edge: usize) {
        match self {
            Self::Dense { width, cells } => {
                if let Some(cell) = cells.get_mut(group * *width + colour) {
                    *cell = edge + 1;
                }
            }
            Self::Sparse(map) => {
                map.insert((group, colour), edge);
            }
        }
    }

    fn clear(&mut self, group: usize, colour: usize) {
        match self {
            Self::Dense { width, cells } => {
                if let Some(cell) = cells.get_mut(group * *width + colour) {
                    *cell = 0;
                }
            }
            Self::Sparse(map) => {
                map.remove(&(group, colour));
            }
        }
    }

    /// The lowest colour free at `group`, scanning up from its hint.
    fn free(&self, group: usize, hint: &mut usize) -> usize {
        while self.get(group, *hint).is_some() {
            *hint += 1;
        }
        *hint
    }
}

/// What the switchover learned about one member of the group (Codis Stats and the member's `INFO replication`).
// One flag per observed fact, so a refusal can name the exact check that failed.
#[allow(clippy::struct_excessive_bools)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberFacts {
    /// Pod name, e.g. `pika-shard-x7k-2`.
    pub pod: String,
    /// The number after the pod name's last `-`.
    pub ordinal: u32,
    /// Answered `INFO` within the deadline.
    pub reachable: bool,
    /// `role:slave`.
    pub role_slave: bool,
    /// `master_host`/`master_port` name the current master.
    pub follows_current: bool,
    /// `master_link_status:up`.
    pub link_up: bool,
    /// How its data stands with its master, when it says.
    pub sync: Option<SyncState>,
    /// `is_eligible_for_master_election`, when the server reports it.
    pub eligible: Option<bool>,
    /// How far its binlog goes; `None` when unknown, ranked last.
    pub position: Option<BinlogPosition>,
    /// The dashboard's view of the server is fine (fork `state == 0`, or nothing reported).
    pub codis_state_ok: bool,
}

impl MemberFacts {
    /// Why this member may not become master, or `None` when it may.
    #[must_use]
    pub fn unfit_reason(&self) -> Option<&'static str> {
        if !self.reachable {
            Some("not reachable")
        } else if !self.role_slave {
            Some("not a slave")
        } else if !self.follows_current {
            Some("does not replicate the current master")
        } else if self.sync == Some(SyncState::Error) {
            // pika still reports such a replica eligible: its own flag cannot be trusted here.
            Some("in pika's replication error state: its history differs from the master's")
        } else if self.sync == Some(SyncState::FullSync) {
            Some("in a full sync: it holds no consistent copy yet")
        } else if !self.link_up {
            Some("replication link is down")
        } else if self.eligible == Some(false) {
            Some("not eligible for master election")
        } else if !self.codis_state_ok {
            Some("codis reports the server unhealthy")
        } else {
            None
        }
    }
}

impl MemberFacts {
    /// Whether it is unfit only for now: a replica of the current master, healthy in Codis's eyes and not in pika's
    /// error state, whose link is not up yet or that is still copying its master (a pod that just restarted).
    #[must_use]
    pub fn catching_up(&self) -> bool {
        self.unfit_reason().is_some()
            && self.reachable
            && self.role_slave
            && self.follows_current
            && self.codis_state_ok
            && self.sync != Some(SyncState::Error)
    }
}

/// What the switchover knows about the rolling update in progress, if any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RolloutFacts {
    /// Pods already on the update revision; they will not be restarted again by this rollout.
    pub updated: BTreeSet<String>,
}

/// The member to promote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// Its pod name.
    pub pod: String,
    /// Its ordinal.
    pub ordinal: u32,
    /// Why it was picked.
    pub basis: Basis,
}

/// Why [`choose_new_master`] picked a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Basis {
    /// It was the requested candidate and is healthy.
    Candidate,
    /// It ranked first among `healthy` healthy replicas (updated first, then binlog position, then the ordinal
    /// rule).
    Ranked {
        /// How many healthy replicas were ranked.
        healthy: usize,
    },
}

/// Why no member can be promoted; the switchover changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChoiceError {
    /// The requested candidate cannot take over; the action exits 2 without touching anything.
    #[error("candidate {pod} cannot become master: {reason}")]
    BadCandidate {
        /// The candidate's pod name.
        pod: String,
        /// What disqualifies it.
        reason: String,
    },
    /// No other member is healthy enough to take over; the dashboard's HA is the fallback.
    #[error("no healthy replica of {current} to promote among {members} other members")]
    NoHealthyReplica {
        /// The current master's pod name.
        current: String,
        /// How many other members were considered.
        members: usize,
    },
}

/// Picks the member to promote when `current` (the master) is about to restart.
///
/// With a `candidate` pod name, that member is chosen if it is healthy ([`MemberFacts::unfit_reason`]) and not the
/// current master. Without one, the healthy replicas are ranked by: already updated in this rollout (when `rollout`
/// is given), because a pod that will not restart again keeps the mastership for the rest of the rollout; then the
/// furthest binlog position (unknown last), so the fewest writes are at risk; then the ordinal rule of tidb-operator #5643 —
/// the highest ordinal above the current master's, else the lowest below — which under an ordinal-descending
/// rollout picks a pod already restarted, or failing that the one restarted last. The pod name breaks what ties
/// remain, so the choice is deterministic.
///
/// # Errors
///
/// [`ChoiceError::BadCandidate`] for a candidate that is unknown, the current master, or unhealthy;
/// [`ChoiceError::NoHealthyReplica`] when no candidate was given and no other member qualifies.
pub fn choose_new_master(
    current: &MemberFacts,
    members: &[MemberFacts],
    candidate: Option<&str>,
    rollout: Option<&RolloutFacts>,
) -> Result<Choice, ChoiceError> {
    if let Some(name) = candidate {
        let refuse = |reason: &str| ChoiceError::BadCandidate { pod: name.to_owned(), reason: reason.to_owned() };
        if name == current.pod {
            return Err(refuse("it is the current master"));
        }
        let member = members.iter().find(|m| m.pod == name).ok_or_else(|| refuse("not a member of the group"))?;
        if let Some(reason) = member.unfit_reason() {
            return Err(refuse(reason));
        }
        return Ok(Choice { pod: member.pod.clone(), ordinal: member.ordinal, basis: Basis::Candidate });
    }
    let others = members.iter().filter(|m| m.pod != current.pod);
    let healthy: Vec<&MemberFacts> = others.clone().filter(|m| m.unfit_reason().is_none()).collect();
    let best = healthy.iter().min_by_key(|m| {
        let stale = rollout.is_some_and(|r| !r.updated.contains(&m.pod));
        let behind = (m.position.is_none(), Reverse(m.position));
        // Above the master: highest first; below: lowest first, and every pod above ranks before every pod below.
        let side = if m.ordinal > current.ordinal { (0u8, u32::MAX - m.ordinal) } else { (1u8, m.ordinal) };
        (stale, behind, side, m.pod.as_str())
    });
    match best {
        Some(m) => {
            Ok(Choice { pod: m.pod.clone(), ordinal: m.ordinal, basis: Basis::Ranked { healthy: healthy.len() } })
        }
        None => Err(ChoiceError::NoHealthyReplica { current: current.pod.clone(), members: others.count() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use proptest::test_runner::TestCaseError;

    /// An executor that re-plans from a fresh slot table after each batch (the started moves then count as in-flight)
    /// would start these moves when the groups in `busy` are still migrating: walking the rounds in order, every move
    /// whose groups are neither busy nor already picked. With nothing busy the pick contains all of round 0, so every group on the critical path advances
    /// and the re-plan's critical path is one shorter: re-planning after each batch finishes in `critical_path`
    /// batches.
    fn next_round(plan: &Plan, busy: &BTreeSet<u32>) -> Vec<Move> {
        let mut taken: BTreeSet<u32> = BTreeSet::new();
        let mut picked = Vec::new();
        for m in plan.rounds.iter().flatten() {
            let idle = |gid: u32| !busy.contains(&gid) && !taken.contains(&gid);
            if idle(m.from) && idle(m.to) {
                taken.insert(m.from);
                taken.insert(m.to);
                picked.push(*m);
            }
        }
        picked.sort_unstable();
        picked
    }

    // ---------------------------------------------------------------------------------------------------------------
    // Fixtures. Group ids are spaced (3, 10, 17, …) so that mixing up a group's index and its id fails loudly.

    fn gid(i: usize) -> u32 {
        u32::try_from(7 * i + 3).unwrap()
    }

    /// `SplitMix64`: expands one proptest seed into a whole slot table, which keeps 16384-slot cases cheap to draw.
    struct Dice(u64);

    impl Dice {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }

        fn below(&mut self, n: usize) -> usize {
            usize::try_from(self.next() % u64::try_from(n).unwrap()).unwrap()
        }

        fn per_mille(&mut self, chance: u32) -> bool {
            self.below(1000) < chance as usize
        }

        fn pick<T: Copy>(&mut self, from: &[T]) -> T {
            from[self.below(from.len())]
        }
    }

    #[derive(Debug, Clone, Copy)]
    enum Layout {
        /// Every slot owned by a random group.
        Scattered,
        /// Random contiguous blocks, one per holding group.
        Blocks,
        /// Balanced the way Codis lays out a fresh cluster, over a random subset of the groups.
        Balanced,
        /// A fresh cluster.
        AllOffline,
    }

    #[derive(Debug, Clone)]
    struct Topology {
        slots: Vec<SlotState>,
        targets: Vec<u32>,
        universe: Vec<u32>,
    }

    #[derive(Debug, Clone, Copy)]
    struct Recipe {
        groups: usize,
        slots: usize,
        seed: u64,
        layout: Layout,
        offline_per_mille: u32,
        in_flight_per_mille: u32,
        stray_per_mille: u32,
    }

    fn contiguous(n: usize, holders: &[u32], sizes: &[usize]) -> Vec<Option<u32>> {
        holders
            .iter()
            .zip(sizes)
            .flat_map(|(&g, &s)| std::iter::repeat_n(Some(g), s))
            .chain(std::iter::repeat(None))
            .take(n)
            .collect()
    }

    fn build(r: Recipe) -> Topology {
        let mut dice = Dice(r.seed);
        let universe: Vec<u32> = (0..r.groups).map(gid).collect();
        let mut targets: Vec<u32> = universe.iter().copied().filter(|_| dice.per_mille(600)).collect();
        if targets.is_empty() {
            targets.push(dice.pick(&universe));
        }
        let mut holders: Vec<u32> = universe.iter().copied().filter(|_| dice.per_mille(700)).collect();
        if holders.is_empty() {
            holders.push(dice.pick(&universe));
        }
        let n = r.slots;
        let owners: Vec<Option<u32>> = match r.layout {
            Layout::Scattered => (0..n).map(|_| Some(dice.pick(&universe))).collect(),
            Layout::Blocks => {
                let mut cuts: Vec<usize> = (1..holders.len()).map(|_| dice.below(n + 1)).collect();
                cuts.push(0);
                cuts.push(n);
                cuts.sort_unstable();
                let sizes: Vec<usize> = cuts.windows(2).map(|w| w[1] - w[0]).collect();
                contiguous(n, &holders, &sizes)
            }
            Layout::Balanced => {
                let (q, rem) = (n / holders.len(), n % holders.len());
                let sizes: Vec<usize> = (0..holders.len()).map(|i| q + usize::from(i < rem)).collect();
                contiguous(n, &holders, &sizes)
            }
            Layout::AllOffline => vec![None; n],
        };
        let slots = owners
            .into_iter()
            .map(|owner| {
                let owner = if dice.per_mille(r.offline_per_mille) { None } else { owner };
                let in_flight_target = if dice.per_mille(r.in_flight_per_mille) {
                    Some(if dice.per_mille(r.stray_per_mille) { dice.pick(&universe) } else { dice.pick(&targets) })
                } else {
                    None
                };
                SlotState { owner, in_flight_target }
            })
            .collect();
        Topology { slots, targets, universe }
    }

    /// Tables of up to `max_slots` slots, one case in eight at exactly that size when it is 16384.
    fn recipe(max_groups: usize, max_slots: usize) -> impl Strategy<Value = Recipe> {
        let sizes = if max_slots >= 16384 {
            prop_oneof![4 => 1usize..=48, 3 => 49usize..=1100, 1 => Just(max_slots)].boxed()
        } else {
            prop_oneof![1usize..=48, 49..=max_slots].boxed()
        };
        (
            1..=max_groups,
            sizes,
            any::<u64>(),
            prop_oneof![
                Just(Layout::Scattered),
                Just(Layout::Blocks),
                Just(Layout::Balanced),
                Just(Layout::AllOffline)
            ],
            prop_oneof![2 => Just(0u32), 1 => 0u32..300],
            prop_oneof![3 => Just(0u32), 1 => 0u32..40],
            prop_oneof![3 => Just(0u32), 1 => 0u32..200],
        )
            .prop_map(|(groups, slots, seed, layout, offline, in_flight, stray)| Recipe {
                groups,
                slots,
                seed,
                layout,
                offline_per_mille: offline,
                in_flight_per_mille: in_flight,
                stray_per_mille: stray,
            })
    }

    fn topology() -> impl Strategy<Value = Topology> {
        recipe(64, 16384).prop_map(build)
    }

    /// Up to 300 slots, for tests that re-plan once per round.
    fn short_topology() -> impl Strategy<Value = Topology> {
        recipe(64, 300).prop_map(build)
    }

    /// At most 10 groups, so every quota assignment can be tried.
    fn small_topology() -> impl Strategy<Value = Topology> {
        recipe(10, 16384).prop_map(build)
    }

    /// Without in-flight actions or offline slots: plans always exist.
    fn settled_topology() -> impl Strategy<Value = Topology> {
        recipe(64, 16384).prop_map(|r| build(Recipe { offline_per_mille: 0, in_flight_per_mille: 0, ..r }))
    }

    // ---------------------------------------------------------------------------------------------------------------
    // Oracles, written apart from the planner.

    /// Per group: slots counting for it, and of those the ones arriving by in-flight actions.
    struct Counts {
        held: BTreeMap<u32, usize>,
        pinned: BTreeMap<u32, usize>,
        offline: usize,
        n: usize,
    }

    fn counts(slots: &[SlotState]) -> Counts {
        let mut c = Counts { held: BTreeMap::new(), pinned: BTreeMap::new(), offline: 0, n: slots.len() };
        for s in slots {
            match (s.owner, s.in_flight_target) {
                (_, Some(t)) => {
                    *c.held.entry(t).or_default() += 1;
                    *c.pinned.entry(t).or_default() += 1;
                }
                (Some(o), None) => *c.held.entry(o).or_default() += 1,
                (None, None) => c.offline += 1,
            }
        }
        c
    }

    fn get(map: &BTreeMap<u32, usize>, g: u32) -> usize {
        map.get(&g).copied().unwrap_or(0)
    }

    /// A balanced outcome exists iff no in-flight action targets a group outside the set, no group is owed more than
    /// ⌈N/k⌉ by actions, and no more than N mod k groups are owed more than ⌊N/k⌋.
    fn feasible(slots: &[SlotState], targets: &[u32]) -> bool {
        let c = counts(slots);
        let k = targets.len();
        let (q, r) = (c.n / k, c.n % k);
        let ceil = c.n.div_ceil(k);
        c.pinned.keys().all(|g| targets.contains(g))
            && targets.iter().all(|&g| get(&c.pinned, g) <= ceil)
            && targets.iter().filter(|&&g| get(&c.pinned, g) > q).count() <= r
    }

    /// The closed form of the minimum number of moves (see [`drain`]).
    fn formula_moves(slots: &[SlotState], targets: &[u32]) -> usize {
        let c = counts(slots);
        let k = targets.len();
        let (q, r) = (c.n / k, c.n % k);
        let leaving: usize = c.held.iter().filter(|(g, _)| !targets.contains(g)).map(|(_, &h)| h).sum();
        let over_q1: usize = targets.iter().map(|&g| get(&c.held, g).saturating_sub(q + 1)).sum();
        let above_q = targets.iter().filter(|&&g| get(&c.held, g) > q).count();
        leaving + over_q1 + above_q.saturating_sub(r)
    }

    /// Lowest L such that offline slots can bring every receiver's migrations down to L.
    fn receiver_level(deficits: &[usize], offline: usize) -> usize {
        let top = deficits.iter().copied().max().unwrap_or(0);
        (0..=top).find(|&l| deficits.iter().map(|&d| d.saturating_sub(l)).sum::<usize>() <= offline).unwrap()
    }

    /// Tries every quota assignment: `(fewest moves, shortest critical path among plans with that many)`, or `None`
    /// when in-flight actions rule out every balanced outcome.
    fn brute_force(slots: &[SlotState], targets: &[u32]) -> Option<(usize, usize)> {
        let c = counts(slots);
        let k = targets.len();
        assert!(k <= 12);
        let (q, r) = (c.n / k, c.n % k);
        if c.pinned.keys().any(|g| !targets.contains(g)) {
            return None;
        }
        let leaving: Vec<usize> = c.held.iter().filter(|(g, _)| !targets.contains(g)).map(|(_, &h)| h).collect();
        let mut best: Option<(usize, usize)> = None;
        for mask in 0u32..(1 << k) {
            if mask.count_ones() as usize != r {
                continue;
            }
            let quota: Vec<usize> = (0..k).map(|i| q + usize::from(mask & (1 << i) != 0)).collect();
            if targets.iter().zip(&quota).any(|(&g, &t)| get(&c.pinned, g) > t) {
                continue;
            }
            let surplus: Vec<usize> =
                targets.iter().zip(&quota).map(|(&g, &t)| get(&c.held, g).saturating_sub(t)).collect();
            let deficits: Vec<usize> =
                targets.iter().zip(&quota).map(|(&g, &t)| t.saturating_sub(get(&c.held, g))).collect();
            let moves = leaving.iter().sum::<usize>() + surplus.iter().sum::<usize>();
            let donors = leaving.iter().chain(&surplus).copied().max().unwrap_or(0);
            let path = donors.max(receiver_level(&deficits, c.offline));
            best = Some(best.map_or((moves, path), |b| b.min((moves, path))));
        }
        best
    }

    /// Carries out the plan on the table, checking every step; returns the final owners.
    fn apply(slots: &[SlotState], plan: &Plan) -> Result<Vec<u32>, TestCaseError> {
        let mut owner: Vec<Option<u32>> = slots.iter().map(SlotState::settled_owner).collect();
        let mut touched = vec![false; slots.len()];
        for &(slot, g) in &plan.assign {
            let s = slot as usize;
            prop_assert!(s < slots.len(), "assign of slot {} beyond the table", slot);
            prop_assert_eq!(slots[s], SlotState::offline(), "slot {} assigned but not offline", slot);
            prop_assert!(!touched[s], "slot {} planned twice", slot);
            touched[s] = true;
            owner[s] = Some(g);
        }
        for m in &plan.moves {
            let s = m.slot as usize;
            prop_assert!(s < slots.len(), "move of slot {} beyond the table", m.slot);
            prop_assert!(slots[s].in_flight_target.is_none(), "move {:?} touches a slot with an action", m);
            prop_assert_eq!(slots[s].owner, Some(m.from), "move {:?} does not start at the owner", m);
            prop_assert!(m.from != m.to, "move {:?} goes nowhere", m);
            prop_assert!(!touched[s], "slot {} planned twice", m.slot);
            touched[s] = true;
            owner[s] = Some(m.to);
        }
        owner
            .into_iter()
            .enumerate()
            .map(|(s, o)| o.ok_or_else(|| TestCaseError::fail(format!("slot {s} left offline"))))
            .collect()
    }

    /// Final sizes per target group, checking that every slot ended in one.
    fn final_sizes(slots: &[SlotState], targets: &[u32], plan: &Plan) -> Result<BTreeMap<u32, usize>, TestCaseError> {
        let owners = apply(slots, plan)?;
        let mut sizes: BTreeMap<u32, usize> = targets.iter().map(|&g| (g, 0)).collect();
        for (s, g) in owners.into_iter().enumerate() {
            let size = sizes
                .get_mut(&g)
                .ok_or_else(|| TestCaseError::fail(format!("slot {s} ends in group {g}, not a target")))?;
            *size += 1;
        }
        Ok(sizes)
    }

    fn participation(moves: &[Move]) -> BTreeMap<u32, usize> {
        let mut p: BTreeMap<u32, usize> = BTreeMap::new();
        for m in moves {
            *p.entry(m.from).or_default() += 1;
            *p.entry(m.to).or_default() += 1;
        }
        p
    }

    fn check_rounds(plan: &Plan) -> Result<(), TestCaseError> {
        let mut all: Vec<Move> = Vec::new();
        for (i, round) in plan.rounds.iter().enumerate() {
            prop_assert!(!round.is_empty(), "round {} is empty", i);
            let mut seen = BTreeSet::new();
            for m in round {
                prop_assert!(seen.insert(m.from), "group {} twice in round {}", m.from, i);
                prop_assert!(seen.insert(m.to), "group {} twice in round {}", m.to, i);
            }
            all.extend(round);
        }
        all.sort_unstable();
        prop_assert_eq!(&all, &plan.moves, "rounds are not a partition of the moves");
        let busiest = participation(&plan.moves).into_values().max().unwrap_or(0);
        prop_assert_eq!(plan.critical_path, busiest);
        prop_assert_eq!(plan.rounds.len(), plan.critical_path);
        Ok(())
    }

    fn balanced(sizes: &BTreeMap<u32, usize>) -> Result<(), TestCaseError> {
        let (lo, hi) = (sizes.values().min().copied().unwrap_or(0), sizes.values().max().copied().unwrap_or(0));
        prop_assert!(hi - lo <= 1, "sizes {:?} differ by more than one", sizes);
        Ok(())
    }

    fn shuffled(targets: &[u32], seed: u64) -> Vec<u32> {
        let mut dice = Dice(seed);
        let mut t = targets.to_vec();
        for i in (1..t.len()).rev() {
            t.swap(i, dice.below(i + 1));
        }
        t
    }

    // ---------------------------------------------------------------------------------------------------------------
    // Planning around in-flight actions that rule out a balanced plan.

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        #[test]
        fn work_around_in_flight_actions_starts_only_on_idle_slots_and_the_plan_after_them_succeeds(t in topology()) {
            let Ok((partial, deferred)) = around_in_flight(&t.slots, &t.targets) else {
                return Ok(());
            };
            let busy = |slot: u32| t.slots[slot as usize].in_flight_target.is_some();
            for m in &partial.moves {
                prop_assert!(!busy(m.slot), "move of slot {} that has an action", m.slot);
                prop_assert_eq!(Some(m.from), t.slots[m.slot as usize].owner);
            }
            for &(slot, _) in &partial.assign {
                prop_assert!(!busy(slot), "assignment of slot {} that has an action", slot);
            }
            prop_assert!(deferred.iter().all(|&slot| busy(slot)));
            // The in-flight actions land while the started work is still in flight: a plan can then be made.
            let after: Vec<SlotState> = t
                .slots
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let slot = i as u32;
                    if s.in_flight_target.is_some() {
                        SlotState::owned(s.in_flight_target.unwrap_or(0))
                    } else if let Some(m) = partial.moves.iter().find(|m| m.slot == slot) {
                        SlotState::migrating(s.owner, m.to)
                    } else if let Some(&(_, to)) = partial.assign.iter().find(|(a, _)| *a == slot) {
                        SlotState::owned(to)
                    } else {
                        *s
                    }
                })
                .collect();
            let next = rebalance(&after, &t.targets);
            prop_assert!(next.is_ok(), "the plan after the in-flight actions landed is refused: {:?}", next.err());
            let next = next.unwrap_or_default();
            let sizes = final_sizes(&after, &t.targets, &next)?;
            balanced(&sizes)?;
            // Only the deferred slots are left to move, or none at all when the table was feasible.
            prop_assert!(next.moves.len() <= deferred.len(), "{} moves after, {} deferred", next.moves.len(), deferred.len());
        }
    }

    #[test]
    fn a_slot_arriving_in_the_leaving_group_holds_back_only_itself() {
        // Group 3 leaves; slot 0 is migrating into it from group 1. The strict plan refuses; around it, every other
        // slot of group 3 goes now, and slot 0 is deferred.
        let mut slots = vec![SlotState::owned(1); 4];
        slots.extend([SlotState::owned(2); 4]);
        slots.extend([SlotState::owned(3); 4]);
        slots[0] = SlotState::migrating(Some(1), 3);
        assert!(matches!(drain(&slots, 3, &[1, 2]), Err(PlanError::InFlightToLeavingGroup { slot: 0, gid: 3 })));
        let (plan, deferred) = around_in_flight(&slots, &[1, 2]).unwrap();
        assert_eq!(deferred, [0]);
        let moved: Vec<u32> = plan.moves.iter().map(|m| m.slot).collect();
        assert_eq!(moved, [8, 9, 10, 11]);
        assert!(plan.moves.iter().all(|m| m.from == 3));
    }

    // ---------------------------------------------------------------------------------------------------------------
    // Slot plans: the acceptance criteria, each over random topologies.

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        #[test]
        fn every_slot_ends_in_exactly_one_target_group_and_sizes_differ_by_at_most_one(t in topology()) {
            match rebalance(&t.slots, &t.targets) {
                Ok(plan) => {
                    let sizes = final_sizes(&t.slots, &t.targets, &plan)?;
                    prop_assert_eq!(sizes.values().sum::<usize>(), t.slots.len());
                    balanced(&sizes)?;
                    prop_assert_eq!(&sizes, &plan.sizes);
                }
                Err(e) => prop_assert!(!feasible(&t.slots, &t.targets), "refused a feasible table: {}", e),
            }
        }

        #[test]
        fn refusals_happen_exactly_when_in_flight_actions_rule_out_balance(t in topology()) {
            let result = rebalance(&t.slots, &t.targets);
            prop_assert_eq!(result.is_ok(), feasible(&t.slots, &t.targets), "{:?}", result.err());
            if let Err(e) = result {
                let expected = matches!(e, PlanError::InFlightToLeavingGroup { .. } | PlanError::PinnedOverQuota { .. });
                prop_assert!(expected, "unexpected refusal {:?}", e);
            }
        }

        #[test]
        fn move_count_matches_the_closed_form_minimum(t in topology()) {
            if let Ok(plan) = rebalance(&t.slots, &t.targets) {
                prop_assert_eq!(plan.moves.len(), formula_moves(&t.slots, &t.targets));
                let offline = t.slots.iter().filter(|s| **s == SlotState::offline()).count();
                prop_assert_eq!(plan.assign.len(), offline, "every offline slot is assigned, none is moved");
            }
        }

        #[test]
        fn moves_start_at_the_current_owner_and_never_touch_a_slot_with_an_action(t in topology()) {
            if let Ok(plan) = rebalance(&t.slots, &t.targets) {
                apply(&t.slots, &plan)?;
            }
        }

        #[test]
        fn rounds_partition_the_moves_with_no_group_twice_and_meet_the_lower_bound(t in topology()) {
            if let Ok(plan) = rebalance(&t.slots, &t.targets) {
                check_rounds(&plan)?;
                prop_assert_eq!(plan.critical_path, plan.lower_bound);
            }
        }

        #[test]
        fn the_same_table_gives_the_same_plan_whatever_the_target_order(t in topology(), seed in any::<u64>()) {
            let first = rebalance(&t.slots, &t.targets);
            prop_assert_eq!(&first, &rebalance(&t.slots, &t.targets));
            prop_assert_eq!(&first, &rebalance(&t.slots, &shuffled(&t.targets, seed)));
        }

        #[test]
        fn donors_give_their_highest_numbered_movable_slots(t in topology()) {
            if let Ok(plan) = rebalance(&t.slots, &t.targets) {
                let mut moved: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
                for m in &plan.moves {
                    moved.entry(m.from).or_default().insert(m.slot);
                }
                for (g, out) in moved {
                    let lowest = out.first().copied().unwrap_or(0);
                    let kept_above: Vec<u32> = (0u32..)
                        .zip(&t.slots)
                        .filter(|&(s, state)| *state == SlotState::owned(g) && s > lowest && !out.contains(&s))
                        .map(|(s, _)| s)
                        .collect();
                    prop_assert!(kept_above.is_empty(), "group {} keeps {:?} above moved slot {}", g, kept_above, lowest);
                    if !t.targets.contains(&g) {
                        prop_assert_eq!(out.len(), get(&counts(&t.slots).held, g), "group {} must give everything", g);
                    }
                }
            }
        }

        #[test]
        fn ranges_cover_exactly_the_moves_and_cannot_be_merged(t in topology()) {
            if let Ok(plan) = rebalance(&t.slots, &t.targets) {
                let ranges = plan.ranges();
                let mut covered: Vec<Move> = ranges
                    .iter()
                    .flat_map(|r| (r.beg..=r.end).map(move |slot| Move { slot, from: r.from, to: r.to }))
                    .collect();
                covered.sort_unstable();
                prop_assert_eq!(&covered, &plan.moves);
                let ends: BTreeSet<(u32, u32, u32)> = ranges.iter().map(|r| (r.from, r.to, r.end)).collect();
                for r in &ranges {
                    prop_assert!(r.beg <= r.end);
                    let touching = r.beg.checked_sub(1).is_some_and(|e| ends.contains(&(r.from, r.to, e)));
                    prop_assert!(!touching, "range {:?} continues another", r);
                }
            }
        }

        #[test]
        fn next_round_never_picks_a_busy_group_or_a_group_twice(t in topology(), seed in any::<u64>()) {
            if let Ok(plan) = rebalance(&t.slots, &t.targets) {
                let mut dice = Dice(seed);
                let busy: BTreeSet<u32> = t.universe.iter().copied().filter(|_| dice.per_mille(300)).collect();
                let pick = next_round(&plan, &busy);
                let mut seen = BTreeSet::new();
                for m in &pick {
                    prop_assert!(plan.moves.contains(m));
                    prop_assert!(!busy.contains(&m.from) && !busy.contains(&m.to), "{:?} touches a busy group", m);
                    prop_assert!(seen.insert(m.from) && seen.insert(m.to), "{:?} reuses a group", m);
                }
                // Maximal: every move left out has a group that is busy or already picked.
                for m in &plan.moves {
                    let blocked = |g: u32| busy.contains(&g) || seen.contains(&g);
                    prop_assert!(pick.contains(m) || blocked(m.from) || blocked(m.to), "{:?} could have started", m);
                }
                if busy.is_empty() {
                    if let Some(first) = plan.rounds.first() {
                        prop_assert!(first.iter().all(|m| pick.contains(m)), "an idle cluster starts all of round 0");
                    }
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn moves_and_critical_path_are_the_minimum_over_every_quota_assignment(t in small_topology()) {
            match (rebalance(&t.slots, &t.targets), brute_force(&t.slots, &t.targets)) {
                (Ok(plan), Some((moves, path))) => {
                    prop_assert_eq!(plan.moves.len(), moves);
                    prop_assert_eq!(plan.lower_bound, path);
                    prop_assert_eq!(plan.critical_path, path);
                    prop_assert_eq!(plan.rounds.len(), path);
                }
                (Err(_), None) => {}
                (plan, bound) => prop_assert!(false, "planner {:?} but brute force {:?}", plan.map(|p| p.moves.len()), bound),
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn replanning_after_each_round_finishes_in_critical_path_rounds(t in short_topology()) {
            let Ok(first) = rebalance(&t.slots, &t.targets) else { return Ok(()) };
            let mut table = t.slots.clone();
            for &(slot, g) in &first.assign {
                table[slot as usize] = SlotState::owned(g);
            }
            let mut plan = rebalance(&table, &t.targets).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert!(plan.assign.is_empty());
            let mut batches = 0;
            while !plan.moves.is_empty() {
                let pick = next_round(&plan, &BTreeSet::new());
                prop_assert!(!pick.is_empty());
                for m in &pick {
                    table[m.slot as usize] = SlotState::owned(m.to);
                }
                batches += 1;
                prop_assert!(batches <= first.critical_path, "more batches than the critical path {}", first.critical_path);
                let next = rebalance(&table, &t.targets).map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(next.moves.len() + pick.len(), plan.moves.len(), "a re-plan must not add moves");
                plan = next;
            }
            prop_assert_eq!(batches, first.critical_path);
        }

        #[test]
        fn contiguous_layouts_need_at_most_donors_plus_receivers_minus_one_ranges(t in settled_topology()) {
            // Contiguous: every owner's slots form one run (as many runs as distinct owners).
            let runs = 1 + t.slots.windows(2).filter(|w| w[0].owner != w[1].owner).count();
            let owners: BTreeSet<Option<u32>> = t.slots.iter().map(|s| s.owner).collect();
            let contiguous = runs == owners.len();
            let plan = rebalance(&t.slots, &t.targets).map_err(|e| TestCaseError::fail(e.to_string()))?;
            if contiguous && !plan.moves.is_empty() {
                let donors: BTreeSet<u32> = plan.moves.iter().map(|m| m.from).collect();
                let receivers: BTreeSet<u32> = plan.moves.iter().map(|m| m.to).collect();
                prop_assert!(plan.ranges().len() < donors.len() + receivers.len(), "{:?}", plan.ranges());
            }
        }

        #[test]
        fn drain_empties_the_leaving_group_with_the_stated_number_of_moves(t in topology(), pick in any::<u64>()) {
            let leaving = Dice(pick).pick(&t.universe);
            let remaining: Vec<u32> = t.targets.iter().copied().filter(|&g| g != leaving).collect();
            prop_assume!(!remaining.is_empty());
            let Ok(plan) = drain(&t.slots, leaving, &remaining) else {
                prop_assert!(!feasible(&t.slots, &remaining));
                return Ok(());
            };
            let sizes = final_sizes(&t.slots, &remaining, &plan)?;
            prop_assert!(!sizes.contains_key(&leaving));
            balanced(&sizes)?;
            // The formula of the doc comment, spelled out again.
            let c = counts(&t.slots);
            let k = remaining.len();
            let (q, r) = (t.slots.len() / k, t.slots.len() % k);
            let others: usize = c.held.iter().filter(|(g, _)| !remaining.contains(g)).map(|(_, &h)| h).sum();
            let expected = others
                + remaining.iter().map(|&g| get(&c.held, g).saturating_sub(q + 1)).sum::<usize>()
                + remaining.iter().filter(|&&g| get(&c.held, g) > q).count().saturating_sub(r);
            prop_assert_eq!(plan.moves.len(), expected);
        }

        #[test]
        fn drain_of_a_balanced_cluster_moves_exactly_the_leaving_groups_slots(
            groups in 2usize..=64,
            n in prop_oneof![1usize..=2048, Just(16384usize)],
            seed in any::<u64>(),
        ) {
            let all: Vec<u32> = (0..groups).map(gid).collect();
            let mut dice = Dice(seed);
            // Balanced by the planner itself, then scattered: the claim must not depend on contiguity.
            let fresh = rebalance(&vec![SlotState::offline(); n], &shuffled(&all, seed)).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let mut owners: Vec<u32> = fresh.assign.iter().map(|&(_, g)| g).collect();
            if dice.per_mille(500) {
                for i in (1..owners.len()).rev() {
                    owners.swap(i, dice.below(i + 1));
                }
            }
            let slots: Vec<SlotState> = owners.into_iter().map(SlotState::owned).collect();
            let leaving = dice.pick(&all);
            let remaining: Vec<u32> = all.iter().copied().filter(|&g| g != leaving).collect();
            let plan = drain(&slots, leaving, &remaining).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let held = slots.iter().filter(|s| s.owner == Some(leaving)).count();
            prop_assert_eq!(plan.moves.len(), held);
            prop_assert!(plan.moves.iter().all(|m| m.from == leaving));
            balanced(&final_sizes(&slots, &remaining, &plan)?)?;
        }
    }

    /// Every table of up to 5 slots over three groups, each slot offline, owned, or migrating, against every target set.
    #[test]
    fn every_tiny_table_is_planned_minimally_or_refused_only_when_infeasible() {
        let groups = [gid(0), gid(1), gid(2)];
        let mut states = vec![SlotState::offline()];
        states.extend(groups.iter().map(|&g| SlotState::owned(g)));
        states.extend(
            groups.iter().zip(groups.iter().cycle().skip(1)).map(|(&to, &from)| SlotState::migrating(Some(from), to)),
        );
        let target_sets: Vec<Vec<u32>> = (1u32..8)
            .map(|mask| groups.iter().enumerate().filter(|(i, _)| mask & (1 << i) != 0).map(|(_, &g)| g).collect())
            .collect();
        let (mut planned, mut refused) = (0, 0);
        for n in 1..=5u32 {
            for code in 0..states.len().pow(n) {
                let mut rest = code;
                let slots: Vec<SlotState> = (0..n)
                    .map(|_| {
                        let s = states[rest % states.len()];
                        rest /= states.len();
                        s
                    })
                    .collect();
                for targets in &target_sets {
                    let result = rebalance(&slots, targets);
                    match (&result, brute_force(&slots, targets)) {
                        (Ok(plan), Some((moves, path))) => {
                            let sizes = final_sizes(&slots, targets, plan).unwrap();
                            balanced(&sizes).unwrap();
                            check_rounds(plan).unwrap();
                            assert_eq!(
                                (plan.moves.len(), plan.critical_path, plan.lower_bound),
                                (moves, path, path),
                                "{slots:?} {targets:?}"
                            );
                            planned += 1;
                        }
                        (Err(_), None) => refused += 1,
                        (r, b) => {
                            panic!("{slots:?} onto {targets:?}: planner {r:?}, brute force {b:?}")
                        }
                    }
                }
            }
        }
        // 7^1 + … + 7^5 tables × 7 target sets; about 42% of them can be balanced around their in-flight actions.
        assert_eq!(planned + refused, 19_607 * 7);
        assert!(planned > 50_000 && refused > 50_000, "{planned} planned, {refused} refused");
    }

    // ---------------------------------------------------------------------------------------------------------------
    // Slot plans: examples and refusals.

    #[test]
    fn a_fresh_cluster_is_assigned_like_codis_does_it() {
        let two = rebalance(&vec![SlotState::offline(); 1024], &[gid(1), gid(0)]).unwrap();
        assert!(two.moves.is_empty() && two.rounds.is_empty());
        assert_eq!((two.critical_path, two.lower_bound), (0, 0));
        assert!(two.assign.iter().all(|&(s, g)| g == if s < 512 { gid(0) } else { gid(1) }));
        let three = rebalance(&vec![SlotState::offline(); 1024], &[gid(0), gid(1), gid(2)]).unwrap();
        let owner = |s: u32| three.assign[s as usize].1;
        assert_eq!(
            [owner(0), owner(341), owner(342), owner(682), owner(683), owner(1023)],
            [gid(0), gid(0), gid(1), gid(1), gid(2), gid(2)]
        );
    }

    #[test]
    fn adding_a_group_takes_the_top_of_each_donor_block_in_one_range_each() {
        let slots: Vec<SlotState> =
            (0..1024).map(|s| SlotState::owned(if s < 512 { gid(0) } else { gid(1) })).collect();
        let plan = rebalance(&slots, &[gid(0), gid(1), gid(2)]).unwrap();
        assert_eq!(plan.moves.len(), 341);
        assert_eq!(
            plan.ranges(),
            [
                SlotRange { from: gid(0), to: gid(2), beg: 342, end: 511 },
                SlotRange { from: gid(1), to: gid(2), beg: 853, end: 1023 }
            ]
        );
        assert_eq!((plan.critical_path, plan.lower_bound, plan.rounds.len()), (341, 341, 341));
    }

    #[test]
    fn draining_a_block_splits_it_into_one_range_per_receiver_in_gid_order() {
        let slots: Vec<SlotState> = (0..1024).map(|s| SlotState::owned(gid(s / 256))).collect();
        let plan = drain(&slots, gid(0), &[gid(3), gid(1), gid(2)]).unwrap();
        assert_eq!(plan.moves.len(), 256);
        let ranges = plan.ranges();
        assert_eq!(ranges.len(), 3);
        assert!(ranges.iter().all(|r| r.from == gid(0)));
        assert_eq!(ranges.iter().map(|r| r.to).collect::<Vec<_>>(), [gid(1), gid(2), gid(3)]);
        assert_eq!(plan.critical_path, 256, "the leaving group sends one slot at a time");
    }

    #[test]
    fn independent_pairs_migrate_in_the_same_round() {
        // Groups 0 and 1 each hold 3 too many; 2 and 3 each lack 3: two disjoint pairs, so 3 rounds, not 6.
        let sizes = [(gid(0), 7), (gid(1), 7), (gid(2), 1), (gid(3), 1)];
        let slots: Vec<SlotState> =
            sizes.iter().flat_map(|&(g, n)| std::iter::repeat_n(SlotState::owned(g), n)).collect();
        let plan = rebalance(&slots, &[gid(0), gid(1), gid(2), gid(3)]).unwrap();
        assert_eq!((plan.moves.len(), plan.critical_path, plan.rounds.len()), (6, 3, 3));
        assert!(plan.rounds.iter().all(|r| r.len() == 2));
    }

    #[test]
    fn a_balanced_table_needs_no_work() {
        let slots: Vec<SlotState> = (0..10).map(|s| SlotState::owned(gid(s % 3))).collect();
        let plan = rebalance(&slots, &[gid(0), gid(1), gid(2)]).unwrap();
        assert!(plan.is_empty());
        assert_eq!(plan.sizes.values().copied().collect::<Vec<_>>(), [4, 3, 3]);
    }

    #[test]
    fn the_extra_slot_stays_with_the_group_that_holds_it() {
        // 5 slots over 2 groups: whichever holds 3 keeps them, so nothing moves.
        let slots = [gid(1), gid(1), gid(1), gid(0), gid(0)].map(SlotState::owned);
        assert!(rebalance(&slots, &[gid(0), gid(1)]).unwrap().is_empty());
    }

    #[test]
    fn a_sparse_incidence_table_schedules_like_the_dense_one() {
        // Many one-slot groups draining into one: groups × degree is past the dense limit.
        let n = 3000;
        let slots: Vec<SlotState> = (0..n).map(|s| SlotState::owned(gid(s + 1))).collect();
        assert!((n + 1) * n > Incidence::DENSE_CELLS);
        let plan = rebalance(&slots, &[gid(0)]).unwrap();
        assert_eq!((plan.moves.len(), plan.critical_path, plan.rounds.len()), (n, n, n));
        check_rounds(&plan).unwrap();
    }

    #[test]
    fn malformed_input_is_refused_with_a_reason() {
        let one = [SlotState::owned(gid(0))];
        assert_eq!(rebalance(&[], &[gid(0)]), Err(PlanError::NoSlots));
        assert_eq!(rebalance(&one, &[]), Err(PlanError::NoTargetGroup));
        assert_eq!(rebalance(&one, &[]).unwrap_err().to_string(), "no group to hold slots");
        assert_eq!(rebalance(&one, &[gid(0), 0]), Err(PlanError::ZeroTarget));
        assert_eq!(rebalance(&one, &[gid(1), gid(0), gid(1)]), Err(PlanError::DuplicateTarget { gid: gid(1) }));
        assert_eq!(rebalance(&[SlotState::owned(0)], &[gid(0)]), Err(PlanError::ZeroGroupSlot { slot: 0 }));
        assert_eq!(drain(&one, gid(0), &[gid(0), gid(1)]), Err(PlanError::LeavingGroupRemains { gid: gid(0) }));
    }

    #[test]
    fn a_slot_migrating_into_the_leaving_group_blocks_the_drain() {
        let slots = [SlotState::owned(gid(1)), SlotState::migrating(Some(gid(1)), gid(0))];
        let err = drain(&slots, gid(0), &[gid(1)]).unwrap_err();
        assert_eq!(err, PlanError::InFlightToLeavingGroup { slot: 1, gid: gid(0) });
        assert_eq!(
            err.to_string(),
            "slot 1 is migrating to group 3, which must end with no slots; wait for the action or remove it"
        );
    }

    #[test]
    fn in_flight_actions_past_a_groups_share_block_the_plan() {
        let to = |g: u32, n: usize| std::iter::repeat_n(SlotState::migrating(None, g), n);
        // 4 slots over 2 groups: nobody may hold 3.
        let slots: Vec<SlotState> = to(gid(0), 3).chain([SlotState::offline()]).collect();
        assert_eq!(
            rebalance(&slots, &[gid(0), gid(1)]),
            Err(PlanError::PinnedOverQuota { gid: gid(0), pinned: 3, quota: 2 })
        );
        // 7 slots over 3 groups: only one may hold 3, so the second (by gid) is refused.
        let slots: Vec<SlotState> = to(gid(0), 3).chain(to(gid(1), 3)).chain([SlotState::offline()]).collect();
        let err = rebalance(&slots, &[gid(0), gid(1), gid(2)]).unwrap_err();
        assert_eq!(err, PlanError::PinnedOverQuota { gid: gid(1), pinned: 3, quota: 2 });
        assert_eq!(
            err.to_string(),
            "group 10 is owed 3 slots by in-flight actions, more than its share of 2; wait for them"
        );
        // At the share exactly, the plan goes ahead around them.
        let slots: Vec<SlotState> = to(gid(0), 3).chain(to(gid(1), 2)).chain([SlotState::offline(); 2]).collect();
        let plan = rebalance(&slots, &[gid(0), gid(1), gid(2)]).unwrap();
        assert_eq!(plan.assign, [(5, gid(2)), (6, gid(2))]);
    }

    // ---------------------------------------------------------------------------------------------------------------
    // Master choice.

    fn pod(ordinal: u32) -> String {
        format!("pk-fixture-{ordinal}")
    }

    fn healthy(ordinal: u32) -> MemberFacts {
        MemberFacts {
            pod: pod(ordinal),
            ordinal,
            reachable: true,
            role_slave: true,
            follows_current: true,
            link_up: true,
            sync: Some(SyncState::Connected),
            eligible: Some(true),
            position: Some(behind(0)),
            codis_state_ok: true,
        }
    }

    /// The position of a replica `lag` bytes behind one at `1:1000`.
    fn behind(lag: u64) -> BinlogPosition {
        BinlogPosition::new(1, 1000 - lag)
    }

    fn master(ordinal: u32) -> MemberFacts {
        MemberFacts { role_slave: false, follows_current: false, link_up: false, ..healthy(ordinal) }
    }

    fn member(ordinal: u32) -> impl Strategy<Value = MemberFacts> {
        let flag = || prop::bool::weighted(0.9);
        (
            flag(),
            flag(),
            flag(),
            flag(),
            prop_oneof![Just(None), Just(Some(true)), Just(Some(false))],
            prop_oneof![1 => Just(None), 4 => (0u64..4).prop_map(|l| Some(behind(l)))],
            flag(),
            prop_oneof![
                6 => Just(Some(SyncState::Connected)),
                1 => Just(None),
                1 => Just(Some(SyncState::Connecting)),
                1 => Just(Some(SyncState::FullSync)),
                1 => Just(Some(SyncState::Error)),
            ],
        )
            .prop_map(
                move |(reachable, role_slave, follows_current, link_up, eligible, position, codis_state_ok, sync)| {
                    MemberFacts {
                        pod: pod(ordinal),
                        ordinal,
                        reachable,
                        role_slave,
                        follows_current,
                        link_up,
                        sync,
                        eligible,
                        position,
                        codis_state_ok,
                    }
                },
            )
    }

    #[derive(Debug, Clone)]
    struct Group {
        current: MemberFacts,
        members: Vec<MemberFacts>,
        candidate: Option<String>,
        rollout: Option<RolloutFacts>,
    }

    fn group() -> impl Strategy<Value = Group> {
        (prop::sample::subsequence((0u32..12).collect::<Vec<_>>(), 1..=7), any::<prop::sample::Index>())
            .prop_flat_map(|(ordinals, at)| {
                let x = ordinals[at.index(ordinals.len())];
                let others: Vec<_> = ordinals.iter().copied().filter(|&o| o != x).map(member).collect();
                let names: Vec<String> = ordinals.iter().map(|&o| pod(o)).collect();
                (
                    Just(master(x)),
                    others,
                    any::<bool>(),
                    prop_oneof![
                        2 => Just(None),
                        3 => prop::sample::select(names.clone()).prop_map(Some),
                        1 => Just(Some("pk-fixture-unknown".to_owned())),
                    ],
                    prop::option::of(prop::sample::subsequence(names.clone(), 0..=names.len())),
                )
            })
            .prop_map(|(current, mut members, listed, candidate, updated)| {
                // The caller may or may not list the current master among the members.
                if listed {
                    members.push(current.clone());
                }
                let rollout = updated.map(|u| RolloutFacts { updated: u.into_iter().collect() });
                Group { current, members, candidate, rollout }
            })
    }

    /// The ranking of the doc comment as a pairwise rule: does `a` rank strictly before `b`?
    fn ranks_before(a: &MemberFacts, b: &MemberFacts, x: u32, rollout: Option<&RolloutFacts>) -> bool {
        if let Some(r) = rollout {
            let (ua, ub) = (r.updated.contains(&a.pod), r.updated.contains(&b.pod));
            if ua != ub {
                return ua;
            }
        }
        match (a.position, b.position) {
            (Some(pa), Some(pb)) if pa != pb => return pa > pb,
            (Some(_), None) => return true,
            (None, Some(_)) => return false,
            _ => {}
        }
        let (above_a, above_b) = (a.ordinal > x, b.ordinal > x);
        if above_a != above_b {
            return above_a;
        }
        if a.ordinal != b.ordinal {
            return if above_a { a.ordinal > b.ordinal } else { a.ordinal < b.ordinal };
        }
        a.pod < b.pod
    }

    fn is_healthy(m: &MemberFacts) -> bool {
        m.reachable
            && m.role_slave
            && m.follows_current
            && m.link_up
            && !matches!(m.sync, Some(SyncState::Error | SyncState::FullSync))
            && m.eligible != Some(false)
            && m.codis_state_ok
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        #[test]
        fn the_chosen_member_is_healthy_and_never_the_current_master(g in group()) {
            if let Ok(choice) = choose_new_master(&g.current, &g.members, g.candidate.as_deref(), g.rollout.as_ref()) {
                prop_assert_ne!(&choice.pod, &g.current.pod);
                let chosen = g.members.iter().find(|m| m.pod == choice.pod);
                prop_assert!(chosen.is_some_and(is_healthy), "chose {:?}", chosen);
                prop_assert_eq!(chosen.map(|m| m.ordinal), Some(choice.ordinal));
            }
        }

        #[test]
        fn a_healthy_candidate_is_chosen_and_any_other_is_refused(g in group()) {
            let Some(name) = g.candidate.clone() else { return Ok(()) };
            let result = choose_new_master(&g.current, &g.members, Some(&name), g.rollout.as_ref());
            let fit = name != g.current.pod && g.members.iter().any(|m| m.pod == name && is_healthy(m));
            match result {
                Ok(choice) => {
                    prop_assert!(fit);
                    prop_assert_eq!(choice.pod, name);
                    prop_assert_eq!(choice.basis, Basis::Candidate);
                }
                Err(ChoiceError::BadCandidate { pod, .. }) => {
                    prop_assert!(!fit);
                    prop_assert_eq!(pod, name);
                }
                Err(e) => prop_assert!(false, "unexpected {:?}", e),
            }
        }

        #[test]
        fn without_a_candidate_no_healthy_replica_ranks_before_the_choice(g in group()) {
            let result = choose_new_master(&g.current, &g.members, None, g.rollout.as_ref());
            let fit: Vec<&MemberFacts> = g.members.iter().filter(|m| m.pod != g.current.pod && is_healthy(m)).collect();
            match result {
                Ok(choice) => {
                    let chosen = fit.iter().find(|m| m.pod == choice.pod).ok_or_else(|| TestCaseError::fail("chose an unfit member"))?;
                    for other in &fit {
                        prop_assert!(!ranks_before(other, chosen, g.current.ordinal, g.rollout.as_ref()), "{} ranks before {}", other.pod, chosen.pod);
                    }
                    prop_assert_eq!(choice.basis, Basis::Ranked { healthy: fit.len() });
                }
                Err(ChoiceError::NoHealthyReplica { current, .. }) => {
                    prop_assert!(fit.is_empty());
                    prop_assert_eq!(current, g.current.pod);
                }
                Err(e) => prop_assert!(false, "unexpected {:?}", e),
            }
        }
    }

    #[test]
    fn a_candidate_is_refused_for_each_failed_check_with_its_reason() {
        type Spoil = fn(&mut MemberFacts);
        let current = master(0);
        let cases: [(Spoil, &str); 8] = [
            (|m| m.reachable = false, "not reachable"),
            (|m| m.role_slave = false, "not a slave"),
            (|m| m.follows_current = false, "does not replicate the current master"),
            // Eligible by its own word and furthest ahead: pika's error state is still disqualifying.
            (
                |m| {
                    m.sync = Some(SyncState::Error);
                    m.position = Some(BinlogPosition::new(9, 0));
                },
                "in pika's replication error state: its history differs from the master's",
            ),
            (|m| m.sync = Some(SyncState::FullSync), "in a full sync: it holds no consistent copy yet"),
            (|m| m.link_up = false, "replication link is down"),
            (|m| m.eligible = Some(false), "not eligible for master election"),
            (|m| m.codis_state_ok = false, "codis reports the server unhealthy"),
        ];
        for (spoil, reason) in cases {
            let mut bad = healthy(1);
            spoil(&mut bad);
            let err =
                choose_new_master(&current, &[current.clone(), bad, healthy(2)], Some(&pod(1)), None).unwrap_err();
            assert_eq!(err.to_string(), format!("candidate {} cannot become master: {reason}", pod(1)));
        }
        let err = choose_new_master(&current, &[healthy(1)], Some(&pod(0)), None).unwrap_err();
        assert_eq!(err.to_string(), format!("candidate {} cannot become master: it is the current master", pod(0)));
        let unknown = MemberFacts { eligible: None, ..healthy(1) };
        assert_eq!(
            choose_new_master(&current, &[unknown], Some(&pod(1)), None).unwrap().pod,
            pod(1),
            "eligibility unknown is fine"
        );
    }

    #[test]
    fn the_ordinal_rule_picks_the_highest_above_else_the_lowest_below() {
        let members = [healthy(0), healthy(1), master(2), healthy(3), healthy(4)];
        assert_eq!(choose_new_master(&master(2), &members, None, None).unwrap().ordinal, 4);
        let members = [healthy(0), healthy(1), healthy(2), master(4)];
        assert_eq!(choose_new_master(&master(4), &members, None, None).unwrap().ordinal, 0);
        let lagging = [
            MemberFacts { position: Some(behind(9)), ..healthy(4) },
            healthy(0),
            MemberFacts { position: None, ..healthy(3) },
        ];
        assert_eq!(choose_new_master(&master(2), &lagging, None, None).unwrap().ordinal, 0, "lag before ordinal");
        let rollout = RolloutFacts { updated: [pod(4)].into() };
        assert_eq!(
            choose_new_master(&master(2), &lagging, None, Some(&rollout)).unwrap().ordinal,
            4,
            "updated before lag"
        );
        let err = choose_new_master(&master(2), &[master(2), MemberFacts { link_up: false, ..healthy(1) }], None, None)
            .unwrap_err();
        assert_eq!(err.to_string(), format!("no healthy replica of {} to promote among 1 other members", pod(2)));
    }

    #[derive(Debug, Clone)]
    enum Order {
        /// Role priorities as `KubeBlocks` applies them: replicas by descending ordinal, the master last, re-evaluated each step.
        RoleThenOrdinal,
        /// A StatefulSet-style rollout, highest ordinal first.
        OrdinalDescending,
        /// Any fixed order.
        Fixed(Vec<u32>),
    }

    /// Restarts pods 0..=k of one group with the master at `x`, calling the switchover whenever the pod about to
    /// restart is master; returns how many times the master moved.
    fn rollout_transfers(k: u32, x: u32, order: &Order, with_facts: bool, lags: &[Option<u64>]) -> usize {
        let mut master_at = x;
        let mut pending: BTreeSet<u32> = (0..=k).collect();
        let mut updated = RolloutFacts::default();
        let mut transfers = 0;
        let mut step = 0;
        while !pending.is_empty() {
            let next = match order {
                Order::RoleThenOrdinal => pending.iter().rev().copied().find(|&o| o != master_at).unwrap_or(master_at),
                Order::OrdinalDescending => pending.iter().next_back().copied().unwrap(),
                Order::Fixed(o) => o[step],
            };
            if next == master_at {
                let members: Vec<MemberFacts> = (0..=k)
                    .map(|o| {
                        if o == master_at {
                            master(o)
                        } else {
                            MemberFacts { position: lags[o as usize].map(behind), ..healthy(o) }
                        }
                    })
                    .collect();
                let choice =
                    choose_new_master(&master(master_at), &members, None, with_facts.then_some(&updated)).unwrap();
                assert_ne!(choice.ordinal, master_at);
                master_at = choice.ordinal;
                transfers += 1;
            }
            pending.remove(&next);
            updated.updated.insert(pod(next));
            step += 1;
        }
        transfers
    }

    #[test]
    fn a_role_ordered_rolling_restart_moves_the_master_exactly_once() {
        for k in 1..=4 {
            for x in 0..=k {
                for with_facts in [true, false] {
                    let lags = vec![Some(0); k as usize + 1];
                    assert_eq!(rollout_transfers(k, x, &Order::RoleThenOrdinal, with_facts, &lags), 1, "k={k} x={x}");
                }
            }
        }
    }

    #[test]
    fn an_ordinal_descending_restart_without_rollout_facts_matches_strategy_b() {
        for k in 1..=4u32 {
            let lags = vec![Some(0); k as usize + 1];
            let counts: Vec<usize> =
                (0..=k).map(|x| rollout_transfers(k, x, &Order::OrdinalDescending, false, &lags)).collect();
            eprintln!("ordinal-descending rollout, k={k}: transfers by master ordinal 0..={k}: {counts:?}");
            for (x, &count) in (0..=k).zip(&counts) {
                assert_eq!(count, if x < k { 1 } else { 2 }, "k={k} x={x}");
            }
            // tidb-operator's ordinal rule, fixed order: mean (k + 2) / (k + 1) over the k + 1 starting ordinals.
            assert_eq!(counts.iter().sum::<usize>(), k as usize + 2);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn a_role_ordered_rolling_restart_moves_the_master_once_whatever_the_lags(
            k in 1u32..=4,
            x in any::<prop::sample::Index>(),
            lags in prop::collection::vec(prop::option::of(0u64..5), 5),
        ) {
            let x = u32::try_from(x.index(k as usize + 1)).unwrap();
            prop_assert_eq!(rollout_transfers(k, x, &Order::RoleThenOrdinal, true, &lags), 1);
        }

        #[test]
        fn with_rollout_facts_any_restart_order_moves_the_master_once_unless_it_restarts_first(
            k in 1u32..=4,
            x in any::<prop::sample::Index>(),
            order in Just((0u32..=4).collect::<Vec<_>>()).prop_shuffle(),
            lags in prop::collection::vec(prop::option::of(0u64..5), 5),
        ) {
            let x = u32::try_from(x.index(k as usize + 1)).unwrap();
            let order: Vec<u32> = order.into_iter().filter(|&o| o <= k).collect();
            let expected = if order[0] == x { 2 } else { 1 };
            prop_assert_eq!(rollout_transfers(k, x, &Order::Fixed(order), true, &lags), expected);
        }
    }
}
