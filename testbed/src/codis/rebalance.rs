//! The rebalance planner (Codis's `pkg/topom/topom_slots.go`), a pure function of the slot table and the groups that
//! have servers.
//!
//! Kept apart from the HTTP layer so the recorded cases can be checked without a server.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::model::SlotMapping;

/// Plans `slot id -> target gid` for `groups` (the gids that have at least one server). `None` when `groups` is
/// empty (`no valid group could be found`).
pub(crate) fn plan(slots: &[SlotMapping], groups: &[u32]) -> Option<BTreeMap<usize, u32>> {
    let gids: Vec<u32> = groups.iter().copied().collect::<BTreeSet<_>>().into_iter().collect();
    if gids.is_empty() {
        return None;
    }
    let n = i64::try_from(slots.len()).unwrap_or(i64::MAX);
    let count = i64::try_from(gids.len()).unwrap_or(i64::MAX);
    let mut assigned: HashMap<u32, i64> = HashMap::new();
    let mut pendings: HashMap<u32, Vec<usize>> = HashMap::new();
    let mut moveout: HashMap<u32, i64> = HashMap::new();
    let mut docking: Vec<usize> = Vec::new();
    let size = |assigned: &HashMap<u32, i64>, pendings: &HashMap<u32, Vec<usize>>, moveout: &HashMap<u32, i64>, g| {
        assigned.get(&g).copied().unwrap_or(0)
            + pendings.get(&g).map_or(0, |p| i64::try_from(p.len()).unwrap_or(i64::MAX))
            - moveout.get(&g).copied().unwrap_or(0)
    };

    // Slots already moving count for their target and are never re-planned.
    for m in slots.iter().filter(|m| !m.action.state.is_nothing()) {
        *assigned.entry(m.action.target_id).or_default() += 1;
    }
    let lower = n / count;
    // An owner below the lower bound keeps its slots; above it, its slots (in id order) become movable.
    for m in slots.iter().filter(|m| m.action.state.is_nothing() && m.group_id != 0) {
        if size(&assigned, &pendings, &moveout, m.group_id) < lower {
            *assigned.entry(m.group_id).or_default() += 1;
        } else {
            pendings.entry(m.group_id).or_default().push(m.id);
        }
    }
    // Ordered by (size, gid), like Codis's red-black tree; an entry is removed before its size changes.
    let mut tree: BTreeSet<(i64, u32)> = gids.iter().map(|&g| (size(&assigned, &pendings, &moveout, g), g)).collect();
    for m in slots.iter().filter(|m| m.action.state.is_nothing() && m.group_id == 0) {
        let Some(&(s, dest)) = tree.iter().next() else {
            break;
        };
        tree.remove(&(s, dest));
        docking.push(m.id);
        *moveout.entry(dest).or_default() -= 1;
        tree.insert((size(&assigned, &pendings, &moveout, dest), dest));
    }
    let upper = (n + count - 1) / count;
    while tree.len() >= 2 {
        let Some(&(fs_key, from)) = tree.iter().next_back() else {
            break;
        };
        tree.remove(&(fs_key, from));
        let movable = pendings.get(&from).map_or(0, |p| i64::try_from(p.len()).unwrap_or(i64::MAX));
        if movable == moveout.get(&from).copied().unwrap_or(0) {
            continue;
        }
        let Some(&(ds_key, dest)) = tree.iter().next() else {
            break;
        };
        tree.remove(&(ds_key, dest));
        let from_size = size(&assigned, &pendings, &moveout, from);
        let dest_size = size(&assigned, &pendings, &moveout, dest);
        if from_size <= lower || dest_size >= upper || from_size - dest_size <= 1 {
            break;
        }
        *moveout.entry(from).or_default() += 1;
        *moveout.entry(dest).or_default() -= 1;
        tree.insert((size(&assigned, &pendings, &moveout, from), from));
        tree.insert((size(&assigned, &pendings, &moveout, dest), dest));
    }
    // Donors give their highest-numbered movable slots.
    let donors: Vec<(u32, i64)> = moveout.iter().filter(|(_, &n)| n >= 0).map(|(&g, &n)| (g, n)).collect();
    for (gid, out) in donors {
        if out > 0 {
            let mut sids = pendings.remove(&gid).unwrap_or_default();
            sids.sort_unstable_by(|a, b| b.cmp(a));
            let k = usize::try_from(out).unwrap_or(0).min(sids.len());
            docking.extend(sids.drain(..k));
            pendings.insert(gid, sids);
        }
        moveout.remove(&gid);
    }
    docking.sort_unstable();
    let mut docking = docking.into_iter();
    let mut plans = BTreeMap::new();
    for gid in &gids {
        let incoming = -moveout.get(gid).copied().unwrap_or(0);
        for _ in 0..incoming.max(0) {
            let Some(sid) = docking.next() else { break };
            plans.insert(sid, *gid);
        }
    }
    Some(plans)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codis::model::{SlotAction, SlotState};

    fn offline(n: usize) -> Vec<SlotMapping> {
        (0..n).map(|id| SlotMapping { id, ..SlotMapping::default() }).collect()
    }

    fn ranges(plan: &BTreeMap<usize, u32>) -> Vec<(usize, usize, u32)> {
        let mut out: Vec<(usize, usize, u32)> = Vec::new();
        for (&sid, &gid) in plan {
            match out.last_mut() {
                Some(last) if last.2 == gid && last.1 + 1 == sid => last.1 = sid,
                _ => out.push((sid, sid, gid)),
            }
        }
        out
    }

    #[test]
    fn two_groups_split_1024_offline_slots_in_halves_as_recorded() {
        let plan = plan(&offline(1024), &[2, 1]).unwrap();
        assert_eq!(ranges(&plan), [(0, 511, 1), (512, 1023, 2)]);
    }

    #[test]
    fn three_groups_get_342_341_341_as_recorded() {
        let plan = plan(&offline(1024), &[1, 2, 3]).unwrap();
        assert_eq!(ranges(&plan), [(0, 341, 1), (342, 682, 2), (683, 1023, 3)]);
    }

    #[test]
    fn no_group_means_no_plan_and_a_balanced_table_means_an_empty_plan() {
        assert!(plan(&offline(16), &[]).is_none());
        let mut slots = offline(16);
        for m in &mut slots {
            m.group_id = if m.id < 8 { 1 } else { 2 };
        }
        assert!(plan(&slots, &[1, 2]).unwrap().is_empty());
    }

    #[test]
    fn a_new_empty_group_receives_the_highest_slots_of_the_donors() {
        let mut slots = offline(12);
        for m in &mut slots {
            m.group_id = if m.id < 6 { 1 } else { 2 };
        }
        let plan = plan(&slots, &[1, 2, 3]).unwrap();
        assert_eq!(plan.len(), 4);
        assert_eq!(plan.values().copied().collect::<BTreeSet<_>>(), BTreeSet::from([3]));
        assert_eq!(plan.keys().copied().collect::<Vec<_>>(), [4, 5, 10, 11]);
    }

    #[test]
    fn slots_with_an_action_count_for_their_target_and_are_not_replanned() {
        let mut slots = offline(4);
        slots[0].group_id = 1;
        slots[0].action = SlotAction { index: 1, state: SlotState::Pending, target_id: 2 };
        let plan = plan(&slots, &[1, 2]).unwrap();
        assert!(!plan.contains_key(&0));
        assert_eq!(plan.values().filter(|&&g| g == 1).count(), 2);
        assert_eq!(plan.values().filter(|&&g| g == 2).count(), 1);
    }
}
