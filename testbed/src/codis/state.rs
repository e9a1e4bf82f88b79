//! The dashboard's stored model and every check Codis makes before storing a mutation, as pure functions without I/O.
//!
//! [`Topo`] is what Codis keeps in its coordinator (groups, slots, proxies); each mutation here performs the checks
//! in Codis's order and returns the recorded `Cause` strings. The HTTP layer (`api`) wraps these with the I/O Codis
//! does around them (dialling a server, pushing slots to proxies), and the executors (`executor`) drive the state
//! machines. [`State`] adds what Codis keeps only in memory (stats, slot-action settings) and the double's knobs.

use std::collections::{BTreeMap, BTreeSet};

use super::model::{
    Group, GroupServer, Promoting, PromotingState, Proxy, ProxyStatsEntry, ServerAction, ServerActionState,
    ServerStats, Slot, SlotAction, SlotActionStats, SlotMapping, SlotState,
};
use super::rebalance;
use super::wire::ApiError;

/// Largest group id Codis accepts.
const MAX_GROUP_ID: i64 = 9999;

fn err(cause: String) -> ApiError {
    ApiError::traced(cause)
}

/// One element of a `slots/assign` body. Missing fields read as Go's zero values, like `encoding/json` does.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct AssignItem {
    pub(crate) id: i64,
    pub(crate) group_id: i64,
    pub(crate) action_state: String,
}

impl AssignItem {
    /// Parses a body the way martini's JSON binding does: anything that is not an array of objects is treated as
    /// empty, and fields of the wrong type read as zero (so a malformed body still returns `"OK"`).
    pub(crate) fn parse_body(body: &[u8]) -> Vec<Self> {
        let Ok(serde_json::Value::Array(items)) = serde_json::from_slice::<serde_json::Value>(body) else {
            return Vec::new();
        };
        items
            .iter()
            .map(|v| Self {
                id: v.get("id").and_then(serde_json::Value::as_i64).unwrap_or(0),
                group_id: v.get("group_id").and_then(serde_json::Value::as_i64).unwrap_or(0),
                action_state: v
                    .get("action")
                    .and_then(|a| a.get("state"))
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
            })
            .collect()
    }
}

/// The stored model: groups, slots, proxies.
#[derive(Clone, Debug)]
pub(crate) struct Topo {
    pub(crate) fork: bool,
    /// 1 for semi-async (the default), 0 for sync.
    pub(crate) forward_method: u32,
    pub(crate) groups: BTreeMap<u32, Group>,
    pub(crate) slots: Vec<SlotMapping>,
    /// By token.
    pub(crate) proxies: BTreeMap<String, Proxy>,
    /// A planted defect (conformance tests only).
    pub(crate) mutation: Option<Mutation>,
}

impl Topo {
    pub(crate) fn new(max_slot_num: usize, fork: bool, forward_method: u32) -> Self {
        Self {
            fork,
            forward_method,
            groups: BTreeMap::new(),
            slots: (0..max_slot_num).map(|id| SlotMapping { id, ..SlotMapping::default() }).collect(),
            proxies: BTreeMap::new(),
            mutation: None,
        }
    }

    fn gid(gid: i64) -> Option<u32> {
        u32::try_from(gid).ok()
    }

    pub(crate) fn group(&self, gid: i64) -> Result<&Group, ApiError> {
        Self::gid(gid).and_then(|g| self.groups.get(&g)).ok_or_else(|| err(format!("group-[{gid}] doesn't exist")))
    }

    fn group_mut(&mut self, gid: i64) -> Result<&mut Group, ApiError> {
        Self::gid(gid).and_then(|g| self.groups.get_mut(&g)).ok_or_else(|| err(format!("group-[{gid}] doesn't exist")))
    }

    pub(crate) fn index_in(g: &Group, addr: &str) -> Result<usize, ApiError> {
        g.index_of(addr).ok_or_else(|| err(format!("group-[{}] doesn't have server-[{addr}]", g.id)))
    }

    pub(crate) fn group_of_server(&self, addr: &str) -> Result<u32, ApiError> {
        self.groups
            .values()
            .find(|g| g.index_of(addr).is_some())
            .map(|g| g.id)
            .ok_or_else(|| err(format!("server-[{addr}] doesn't exist")))
    }

    fn slot_index(&self, sid: i64) -> Result<usize, ApiError> {
        usize::try_from(sid)
            .ok()
            .filter(|&s| s < self.slots.len())
            .ok_or_else(|| err(format!("slot-[{sid}] doesn't exist")))
    }

    /// A slot belongs to, or is moving into, the group.
    pub(crate) fn is_group_in_use(&self, gid: u32) -> bool {
        self.slots.iter().any(|m| m.group_id == gid || m.action.target_id == gid)
    }

    pub(crate) fn max_slot_action_index(&self) -> u32 {
        self.slots.iter().filter(|m| !m.action.state.is_nothing()).map(|m| m.action.index).max().unwrap_or(0)
    }

    /// Among pending sync actions only, as Codis counts.
    fn max_sync_action_index(&self) -> u32 {
        self.groups
            .values()
            .flat_map(|g| &g.servers)
            .filter(|s| s.action.state == ServerActionState::Pending)
            .map(|s| s.action.index)
            .max()
            .unwrap_or(0)
    }

    pub(crate) fn new_server(&self, addr: &str, datacenter: &str) -> GroupServer {
        let mut s =
            GroupServer { server: addr.to_owned(), datacenter: datacenter.to_owned(), ..GroupServer::default() };
        if self.fork {
            s.role = Some(String::new());
            s.binlog_file_num = Some(0);
            s.binlog_offset = Some(0);
            s.is_eligible_for_master_election = Some(false);
            s.state = Some(0);
            s.recall_times = Some(0);
        }
        s
    }

    /// `group/create`.
    pub(crate) fn create_group(&mut self, gid: i64) -> Result<(), ApiError> {
        if gid <= 0 || gid > MAX_GROUP_ID {
            return Err(err(format!("invalid group id = {gid}, out of range")));
        }
        let id = Self::gid(gid).ok_or_else(|| err(format!("invalid group id = {gid}, out of range")))?;
        if self.groups.contains_key(&id) {
            return Err(err(format!("group-[{gid}] already exists")));
        }
        self.groups.insert(id, Group { id, ..Group::default() });
        Ok(())
    }

    /// `group/remove`.
    pub(crate) fn remove_group(&mut self, gid: i64) -> Result<(), ApiError> {
        let g = self.group(gid)?;
        if !g.servers.is_empty() {
            return Err(err(format!("group-[{gid}] isn't empty")));
        }
        let id = g.id;
        self.groups.remove(&id);
        Ok(())
    }

    /// `group/add` after the dial check.
    pub(crate) fn group_add_server(&mut self, gid: i64, datacenter: &str, addr: &str) -> Result<(), ApiError> {
        if addr.is_empty() {
            return Err(err("invalid server address".to_owned()));
        }
        if self.groups.values().any(|g| g.index_of(addr).is_some()) {
            return Err(err(format!("server-[{addr}] already exists")));
        }
        let server = self.new_server(addr, datacenter);
        let g = self.group_mut(gid)?;
        if !g.promoting.state.is_nothing() {
            return Err(err(format!("group-[{}] is promoting", g.id)));
        }
        g.servers.push(server);
        Ok(())
    }

    /// `group/del`.
    pub(crate) fn group_del_server(&mut self, gid: i64, addr: &str) -> Result<(), ApiError> {
        let g = self.group(gid)?;
        let index = Self::index_in(g, addr)?;
        if !g.promoting.state.is_nothing() {
            return Err(err(format!("group-[{}] is promoting", g.id)));
        }
        if index == 0 && (g.servers.len() != 1 || self.is_group_in_use(g.id)) {
            return Err(err(format!("group-[{}] can't remove master, still in use", g.id)));
        }
        let g = self.group_mut(gid)?;
        if index != 0 && g.servers[index].replica_group {
            g.out_of_sync = true;
        }
        g.servers.remove(index);
        if g.servers.is_empty() {
            g.out_of_sync = false;
        }
        Ok(())
    }

    /// `group/replica-groups`.
    pub(crate) fn replica_groups(&mut self, gid: i64, addr: &str, value: bool) -> Result<(), ApiError> {
        let g = self.group(gid)?;
        let index = Self::index_in(g, addr)?;
        if !g.promoting.state.is_nothing() {
            return Err(err(format!("group-[{}] is promoting", g.id)));
        }
        let in_use = g.servers.len() != 1 && self.is_group_in_use(g.id);
        let g = self.group_mut(gid)?;
        if in_use {
            g.out_of_sync = true;
        }
        g.servers[index].replica_group = value;
        Ok(())
    }

    /// `group/replica-groups-all`.
    pub(crate) fn replica_groups_all(&mut self, value: bool) -> Result<(), ApiError> {
        if let Some(g) = self.groups.values().find(|g| !g.promoting.state.is_nothing()) {
            return Err(err(format!("group-[{}] is promoting", g.id)));
        }
        let in_use: BTreeSet<u32> =
            self.groups.values().filter(|g| g.servers.len() != 1 && self.is_group_in_use(g.id)).map(|g| g.id).collect();
        for g in self.groups.values_mut() {
            // Only a group whose flags change is touched.
            if g.servers.iter().all(|s| s.replica_group == value) {
                continue;
            }
            if in_use.contains(&g.id) {
                g.out_of_sync = true;
            }
            for s in &mut g.servers {
                s.replica_group = value;
            }
        }
        Ok(())
    }

    fn server_mut(&mut self, addr: &str) -> Result<(&mut Group, usize), ApiError> {
        let gid = self.group_of_server(addr)?;
        let g = self.groups.get_mut(&gid).ok_or_else(|| err(format!("server-[{addr}] doesn't exist")))?;
        if !g.promoting.state.is_nothing() {
            return Err(err(format!("group-[{}] is promoting", g.id)));
        }
        let index = Self::index_in(g, addr)?;
        Ok((g, index))
    }

    /// `group/action/create`.
    pub(crate) fn sync_create(&mut self, addr: &str) -> Result<(), ApiError> {
        let next = self.max_sync_action_index() + 1;
        let (g, index) = self.server_mut(addr)?;
        let action = &mut g.servers[index].action;
        if action.state == ServerActionState::Pending {
            return Err(err(format!("server-[{addr}] action already exist")));
        }
        *action = ServerAction { index: next, state: ServerActionState::Pending };
        Ok(())
    }

    /// `group/action/remove`.
    pub(crate) fn sync_remove(&mut self, addr: &str) -> Result<(), ApiError> {
        let (g, index) = self.server_mut(addr)?;
        let action = &mut g.servers[index].action;
        if action.state.is_nothing() {
            return Err(err(format!("server-[{addr}] action doesn't exist")));
        }
        *action = ServerAction::default();
        Ok(())
    }

    fn target_group(&self, gid: i64) -> Result<u32, ApiError> {
        let g = self.group(gid)?;
        if g.servers.is_empty() {
            return Err(err(format!("group-[{gid}] is empty")));
        }
        Ok(g.id)
    }

    fn start_action(&mut self, sid: usize, target: u32) {
        let index = self.max_slot_action_index() + 1;
        self.slots[sid].action = SlotAction { index, state: SlotState::Pending, target_id: target };
    }

    /// `slots/action/create`.
    pub(crate) fn slot_create(&mut self, sid: i64, gid: i64) -> Result<(), ApiError> {
        let target = self.target_group(gid)?;
        let s = self.slot_index(sid)?;
        let m = &self.slots[s];
        if !m.action.state.is_nothing() {
            return Err(err(format!("slot-[{sid}] action already exists")));
        }
        if m.group_id == target {
            return Err(err(format!("slot-[{sid}] already in group-[{gid}]")));
        }
        self.start_action(s, target);
        Ok(())
    }

    /// `slots/action/create-some`: only the destination is checked; up to `num` action-free slots of `src`, in
    /// ascending id order.
    pub(crate) fn slot_create_some(&mut self, src: i64, dst: i64, num: i64) -> Result<(), ApiError> {
        let target = self.target_group(dst)?;
        let eligible =
            |m: &&SlotMapping| m.action.state.is_nothing() && i64::from(m.group_id) == src && m.group_id != target;
        let num = usize::try_from(num).unwrap_or(0);
        let picked: Vec<usize> = if self.mutation == Some(Mutation::CreateSomeTakesHighestSlots) {
            self.slots.iter().rev().filter(eligible).map(|m| m.id).take(num).collect()
        } else {
            self.slots.iter().filter(eligible).map(|m| m.id).take(num).collect()
        };
        for sid in picked {
            self.start_action(sid, target);
        }
        Ok(())
    }

    /// `slots/action/create-range`: all or nothing.
    pub(crate) fn slot_create_range(&mut self, beg: i64, end: i64, gid: i64) -> Result<(), ApiError> {
        let n = i64::try_from(self.slots.len()).unwrap_or(i64::MAX);
        if !(0 <= beg && beg <= end && end < n) {
            return Err(err(format!("invalid slot range [{beg},{end}]")));
        }
        let target = self.target_group(gid)?;
        let mut picked = Vec::new();
        for sid in beg..=end {
            let s = self.slot_index(sid)?;
            let m = &self.slots[s];
            if !m.action.state.is_nothing() {
                return Err(err(format!("slot-[{sid}] action already exists")));
            }
            if m.group_id == target {
                return Err(err(format!("slot-[{sid}] already in group-[{gid}]")));
            }
            picked.push(s);
        }
        for s in picked {
            self.start_action(s, target);
        }
        Ok(())
    }

    /// `slots/action/remove`: only pending actions can be cancelled.
    pub(crate) fn slot_remove(&mut self, sid: i64) -> Result<(), ApiError> {
        let s = self.slot_index(sid)?;
        let m = &mut self.slots[s];
        if m.action.state.is_nothing() {
            return Err(err(format!("slot-[{sid}] action doesn't exist")));
        }
        if m.action.state != SlotState::Pending {
            return Err(err(format!("slot-[{sid}] action isn't pending")));
        }
        m.action = SlotAction::default();
        Ok(())
    }

    /// `slots/assign`: validates every item first, then stores; returns the slots to push to proxies.
    pub(crate) fn slots_assign(&mut self, items: &[AssignItem]) -> Result<Vec<usize>, ApiError> {
        for item in items {
            self.slot_index(item.id)?;
            let g = self.group(item.group_id)?;
            if g.servers.is_empty() {
                return Err(err(format!("group-[{}] is empty", g.id)));
            }
            if !item.action_state.is_empty() {
                return Err(err(format!("invalid slot-[{}] action = {}", item.id, item.action_state)));
            }
        }
        let mut touched = Vec::new();
        for item in items {
            let (Ok(s), Some(gid)) = (self.slot_index(item.id), Self::gid(item.group_id)) else {
                continue;
            };
            if self.mutation != Some(Mutation::AssignKeepsGroupsInSync) {
                if let Some(g) = self.groups.get_mut(&gid) {
                    g.out_of_sync = true;
                }
            }
            self.slots[s] = SlotMapping { id: s, group_id: gid, action: SlotAction::default() };
            touched.push(s);
        }
        Ok(touched)
    }

    /// `slots/assign/{x}/offline`.
    pub(crate) fn slots_assign_offline(&mut self, items: &[AssignItem]) -> Result<Vec<usize>, ApiError> {
        for item in items {
            self.slot_index(item.id)?;
            if item.group_id != 0 {
                return Err(err(format!("group of slot-[{}] should be 0", item.id)));
            }
        }
        let mut touched = Vec::new();
        for item in items {
            let Ok(s) = self.slot_index(item.id) else {
                continue;
            };
            self.slots[s] = SlotMapping { id: s, ..SlotMapping::default() };
            touched.push(s);
        }
        Ok(touched)
    }

    /// `slots/rebalance` plan.
    pub(crate) fn rebalance_plan(&self) -> Result<BTreeMap<usize, u32>, ApiError> {
        let groups: Vec<u32> = self.groups.values().filter(|g| !g.servers.is_empty()).map(|g| g.id).collect();
        rebalance::plan(&self.slots, &groups).ok_or_else(|| err("no valid group could be found".to_owned()))
    }

    /// `slots/rebalance` with confirm: pending actions in ascending slot order.
    pub(crate) fn rebalance_apply(&mut self, plan: &BTreeMap<usize, u32>) {
        for (&sid, &gid) in plan {
            if sid < self.slots.len() {
                self.start_action(sid, gid);
            }
        }
    }

    /// Slots owned by, or moving into, the group.
    pub(crate) fn slots_of_group(&self, gid: u32) -> Vec<usize> {
        self.slots.iter().filter(|m| m.group_id == gid || m.action.target_id == gid).map(|m| m.id).collect()
    }

    pub(crate) fn master_of(&self, gid: u32) -> String {
        self.groups.get(&gid).and_then(Group::master).unwrap_or_default().to_owned()
    }

    fn is_group_locked(&self, gid: u32) -> bool {
        self.groups.get(&gid).is_some_and(|g| g.promoting.state == PromotingState::Prepared)
    }

    pub(crate) fn is_group_promoting(&self, gid: u32) -> bool {
        self.groups.get(&gid).is_some_and(|g| !g.promoting.state.is_nothing())
    }

    fn is_slot_locked(&self, m: &SlotMapping) -> bool {
        match m.action.state {
            SlotState::Nothing | SlotState::Pending | SlotState::Preparing => self.is_group_locked(m.group_id),
            SlotState::Prepared => true,
            SlotState::Migrating => self.is_group_locked(m.group_id) || self.is_group_locked(m.action.target_id),
            SlotState::Finished => self.is_group_locked(m.action.target_id),
        }
    }

    /// Replica groups by priority: same datacenter and host as the proxy, same datacenter, others. (Codis compares
    /// resolved IPs; the double compares the host part of the addresses.)
    fn replica_groups_for(&self, gid: u32, proxy: Option<&Proxy>) -> Vec<Vec<String>> {
        let Some(g) = self.groups.get(&gid) else {
            return Vec::new();
        };
        if !g.promoting.state.is_nothing() || g.servers.len() <= 1 {
            return Vec::new();
        }
        let host = |addr: &str| addr.rsplit_once(':').map_or(addr, |(h, _)| h).to_owned();
        let mut by_priority: [Vec<String>; 3] = Default::default();
        // The fork also leaves out servers not in its state 0 (`toReplicaGroups`).
        for s in g.servers.iter().filter(|s| s.replica_group && s.state.unwrap_or(0) == 0) {
            let priority = match proxy {
                Some(p) if p.datacenter == s.datacenter => usize::from(host(&p.admin_addr) != host(&s.server)),
                _ => 2,
            };
            by_priority[priority].push(s.server.clone());
        }
        by_priority.into_iter().filter(|l| !l.is_empty()).collect()
    }

    /// The proxy's view of one slot mapping (which need not be the stored one: pushes are computed before storing).
    pub(crate) fn slot_view(&self, m: &SlotMapping, proxy: Option<&Proxy>) -> Slot {
        let mut slot = Slot { id: m.id, locked: self.is_slot_locked(m), ..Slot::default() };
        match m.action.state {
            SlotState::Nothing | SlotState::Pending => {
                slot.backend_addr = self.master_of(m.group_id);
                slot.backend_addr_group_id = m.group_id;
                slot.replica_groups = self.replica_groups_for(m.group_id, proxy);
            }
            SlotState::Preparing => {
                slot.backend_addr = self.master_of(m.group_id);
                slot.backend_addr_group_id = m.group_id;
            }
            SlotState::Prepared | SlotState::Migrating => {
                slot.backend_addr = self.master_of(m.action.target_id);
                slot.backend_addr_group_id = m.action.target_id;
                slot.migrate_from = self.master_of(m.group_id);
                slot.migrate_from_group_id = m.group_id;
            }
            SlotState::Finished => {
                slot.backend_addr = self.master_of(m.action.target_id);
                slot.backend_addr_group_id = m.action.target_id;
            }
        }
        slot.forward_method = self.forward_method;
        if self.mutation == Some(Mutation::MigratingSlotServedBySource) && !slot.migrate_from.is_empty() {
            std::mem::swap(&mut slot.backend_addr, &mut slot.migrate_from);
            std::mem::swap(&mut slot.backend_addr_group_id, &mut slot.migrate_from_group_id);
        }
        slot
    }

    /// Checks of `group/promote` in Codis's order; returns the group id and the index being promoted.
    pub(crate) fn promote_check(&self, gid: i64, addr: &str, executor: i64) -> Result<(u32, usize), ApiError> {
        let g = self.group(gid)?;
        let index = Self::index_in(g, addr)?;
        if g.promoting.state.is_nothing() {
            if index == 0 {
                return Err(err(format!("group-[{}] can't promote master", g.id)));
            }
        } else if u32::try_from(index).ok() != Some(g.promoting.index) {
            return Err(err(format!("group-[{}] is promoting index = {}", g.id, g.promoting.index)));
        }
        if executor != 0 && self.mutation != Some(Mutation::PromoteIgnoresRunningMigration) {
            return Err(err(format!("slots-migration is running = {executor}")));
        }
        Ok((g.id, index))
    }

    /// The reorder of a promote: `[servers[i], others..., old master]`, all server actions cleared, `finished`.
    pub(crate) fn promote_reorder(&mut self, gid: u32) -> Option<String> {
        let g = self.groups.get_mut(&gid)?;
        let index = usize::try_from(g.promoting.index).ok().filter(|&i| i < g.servers.len())?;
        let mut servers = Vec::with_capacity(g.servers.len());
        servers.push(g.servers[index].clone());
        servers.extend(g.servers.iter().enumerate().filter(|(i, _)| *i != index && *i != 0).map(|(_, s)| s.clone()));
        if index != 0 {
            servers.push(g.servers[0].clone());
        }
        for s in &mut servers {
            s.action = ServerAction::default();
        }
        g.servers = servers;
        g.promoting = Promoting { index: 0, state: PromotingState::Finished };
        g.servers.first().map(|s| s.server.clone())
    }
}

/// Where a held migration waits (test knob, see [`crate::codis::CodisDouble::hold_migration`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MigrationHold {
    /// Before the batch that follows `after` completed batches: `slot_action.executor` is 0, as between two
    /// throttled batches (or, with `after: 0`, right after the slot became `migrating`).
    BeforeBatch {
        /// Batches of this slot's migration to let through first.
        after: u32,
    },
    /// Inside the batch that follows `after` completed batches, before any key moves: `slot_action.executor` is 1,
    /// as while `SLOTSMGRTTAGSLOT-ASYNC` is on the wire.
    InBatch {
        /// Batches of this slot's migration to let through first.
        after: u32,
    },
}

/// A deliberate defect of the double, for proving that the conformance test catches it. Never set outside tests.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutation {
    /// `slots/action/create-some` takes the source's slots from the highest id down instead of the lowest up.
    CreateSomeTakesHighestSlots,
    /// `slots/assign` leaves `out_of_sync` alone.
    AssignKeepsGroupsInSync,
    /// A `prepared`/`migrating` slot is served with `backend_addr` and `migrate_from` swapped (traffic to the source).
    MigratingSlotServedBySource,
    /// `group/promote` ignores `slot_action.executor`.
    PromoteIgnoresRunningMigration,
}

/// What a test asked the executor to do to one slot's keys (see [`crate::codis::CodisDouble::drop_keys_of`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KeyFault {
    /// The batch deletes the keys on the source instead of moving them.
    Delete,
}

/// What Codis keeps only in memory (`Topom.action`, `Topom.stats`): lost on a restart.
#[derive(Debug, Default)]
pub(crate) struct Memory {
    pub(crate) slot_action: SlotActionStats,
    pub(crate) server_stats: BTreeMap<String, ServerStats>,
    pub(crate) proxy_stats: BTreeMap<String, ProxyStatsEntry>,
}

/// Everything the double holds: the stored model, what Codis keeps in memory, and test knobs.
#[derive(Debug)]
pub(crate) struct State {
    /// What Codis keeps in its coordinator: survives a restart.
    pub(crate) topo: Topo,
    /// What Codis keeps in memory.
    pub(crate) mem: Memory,
    pub(crate) loglevel: String,
    /// Bumped by every restart; executors started under an older generation stop touching anything.
    pub(crate) generation: u64,
    /// Completed stats refreshes.
    pub(crate) refreshes: u64,
    // ---- test knobs (not Codis state: they survive a restart) ----
    /// Injected migration errors by slot.
    pub(crate) slot_errors: BTreeMap<usize, String>,
    /// Fewest batches per slot (default below); padded batches last one tick each.
    pub(crate) migration_ticks: BTreeMap<usize, u32>,
    pub(crate) default_migration_ticks: u32,
    /// Holds by slot, and the slots waiting at one now.
    pub(crate) holds: BTreeMap<usize, MigrationHold>,
    pub(crate) held: BTreeSet<usize>,
    /// Key faults by slot.
    pub(crate) key_faults: BTreeMap<usize, KeyFault>,
    /// The sync-action executor and the stats loop skip their turns while set.
    pub(crate) sync_held: bool,
    pub(crate) stats_held: bool,
}

impl State {
    pub(crate) fn new(topo: Topo) -> Self {
        Self {
            topo,
            mem: Memory::default(),
            loglevel: "info".into(),
            generation: 0,
            refreshes: 0,
            slot_errors: BTreeMap::new(),
            migration_ticks: BTreeMap::new(),
            default_migration_ticks: 1,
            holds: BTreeMap::new(),
            held: BTreeSet::new(),
            key_faults: BTreeMap::new(),
            sync_held: false,
            stats_held: false,
        }
    }

    /// A dashboard restart: the model stays (it is in the coordinator), memory is lost, running executors of the
    /// old process stop.
    pub(crate) fn restart(&mut self) {
        self.mem = Memory::default();
        self.generation += 1;
        self.held.clear();
    }

    /// The next slot a round takes (`SlotActionPrepareFilter`): the lowest-index action already in progress,
    /// else (unless disabled) the lowest-index pending one, among the slots `accept` lets through: neither its
    /// group nor its target already in the round (`marks`; an offline source takes no group), not yet planned.
    pub(crate) fn pick_next(&self, marks: &BTreeSet<u32>, plans: &[usize]) -> Option<usize> {
        let slots = &self.topo.slots;
        let accept = |m: &SlotMapping| {
            !marks.contains(&m.group_id) && !marks.contains(&m.action.target_id) && !plans.contains(&m.id)
        };
        let min_index = |pending: bool| {
            slots
                .iter()
                .filter(|m| {
                    !m.action.state.is_nothing() && (m.action.state == SlotState::Pending) == pending && accept(m)
                })
                .min_by_key(|m| (m.action.index, m.id))
                .map(|m| m.id)
        };
        min_index(false).or_else(|| if self.mem.slot_action.disabled { None } else { min_index(true) })
    }

    /// The slots one round takes, in the order it takes them (the planning half of `ProcessSlotAction`).
    #[cfg(test)]
    pub(crate) fn plan_round(&self, parallel: usize) -> Vec<usize> {
        let mut marks = BTreeSet::new();
        let mut plans = Vec::new();
        while plans.len() < parallel.max(1) {
            let Some(sid) = self.pick_next(&marks, &plans) else {
                break;
            };
            mark(&mut marks, &self.topo.slots[sid]);
            plans.push(sid);
        }
        plans
    }

    /// Fewest batches configured for a slot.
    pub(crate) fn ticks_for(&self, sid: usize) -> u32 {
        self.migration_ticks.get(&sid).copied().unwrap_or(self.default_migration_ticks).max(1)
    }
}

/// Marks a planned slot's groups as taken for the rest of the round.
pub(crate) fn mark(marks: &mut BTreeSet<u32>, m: &SlotMapping) {
    if m.group_id != 0 {
        marks.insert(m.group_id);
    }
    marks.insert(m.action.target_id);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topo_with_groups(gids: &[u32]) -> Topo {
        let mut t = Topo::new(16, false, 1);
        for &g in gids {
            t.create_group(i64::from(g)).unwrap();
            t.group_add_server(i64::from(g), "", &format!("10.0.0.{g}:6379")).unwrap();
        }
        t
    }

    #[test]
    fn group_checks_use_the_recorded_causes_in_order() {
        let mut t = topo_with_groups(&[1]);
        assert_eq!(t.create_group(0).unwrap_err().cause, "invalid group id = 0, out of range");
        assert_eq!(t.create_group(10000).unwrap_err().cause, "invalid group id = 10000, out of range");
        assert_eq!(t.create_group(1).unwrap_err().cause, "group-[1] already exists");
        assert_eq!(t.remove_group(2).unwrap_err().cause, "group-[2] doesn't exist");
        assert_eq!(t.remove_group(1).unwrap_err().cause, "group-[1] isn't empty");
        assert_eq!(
            t.group_add_server(2, "", "10.0.0.1:6379").unwrap_err().cause,
            "server-[10.0.0.1:6379] already exists"
        );
        assert_eq!(t.group_add_server(2, "", "10.0.0.9:6379").unwrap_err().cause, "group-[2] doesn't exist");
    }

    #[test]
    fn the_master_is_refused_while_slaves_remain_or_slots_are_owned() {
        let mut t = topo_with_groups(&[1]);
        t.group_add_server(1, "", "10.0.0.2:6379").unwrap();
        assert_eq!(
            t.group_del_server(1, "10.0.0.1:6379").unwrap_err().cause,
            "group-[1] can't remove master, still in use"
        );
        assert_eq!(
            t.group_del_server(1, "10.0.0.3:6379").unwrap_err().cause,
            "group-[1] doesn't have server-[10.0.0.3:6379]"
        );
        t.group_del_server(1, "10.0.0.2:6379").unwrap();
        t.slots[3].group_id = 1;
        assert_eq!(
            t.group_del_server(1, "10.0.0.1:6379").unwrap_err().cause,
            "group-[1] can't remove master, still in use"
        );
        t.slots[3] = SlotMapping {
            id: 3,
            group_id: 0,
            action: SlotAction { index: 1, state: SlotState::Pending, target_id: 1 },
        };
        assert_eq!(
            t.group_del_server(1, "10.0.0.1:6379").unwrap_err().cause,
            "group-[1] can't remove master, still in use"
        );
        t.slots[3] = SlotMapping { id: 3, ..SlotMapping::default() };
        t.group_del_server(1, "10.0.0.1:6379").unwrap();
        t.remove_group(1).unwrap();
    }

    #[test]
    fn slot_action_checks_and_indexes() {
        let mut t = topo_with_groups(&[1, 2]);
        t.create_group(3).unwrap();
        assert_eq!(t.slot_create(0, 3).unwrap_err().cause, "group-[3] is empty");
        assert_eq!(t.slot_create(16, 1).unwrap_err().cause, "slot-[16] doesn't exist");
        t.slot_create(0, 1).unwrap();
        assert_eq!(t.slot_create(0, 2).unwrap_err().cause, "slot-[0] action already exists");
        t.slots[1].group_id = 1;
        assert_eq!(t.slot_create(1, 1).unwrap_err().cause, "slot-[1] already in group-[1]");
        assert_eq!(t.slot_create_range(-1, 3, 1).unwrap_err().cause, "invalid slot range [-1,3]");
        assert_eq!(t.slot_create_range(0, 16, 1).unwrap_err().cause, "invalid slot range [0,16]");
        assert_eq!(t.slot_create_range(2, 5, 7).unwrap_err().cause, "group-[7] doesn't exist");
        t.slot_create_range(2, 5, 2).unwrap();
        assert_eq!(t.slots[5].action, SlotAction { index: 5, state: SlotState::Pending, target_id: 2 });
        t.slot_create_some(0, 2, 3).unwrap();
        assert_eq!(t.slots.iter().filter(|m| m.action.target_id == 2).count(), 7);
        t.slot_create_some(2, 2, 3).unwrap();
        t.slot_create_some(42, 2, 3).unwrap();
        t.slot_create_some(0, 2, -1).unwrap();
        assert_eq!(t.slots.iter().filter(|m| m.action.target_id == 2).count(), 7);
        assert_eq!(t.slot_remove(1).unwrap_err().cause, "slot-[1] action doesn't exist");
        t.slots[0].action.state = SlotState::Migrating;
        assert_eq!(t.slot_remove(0).unwrap_err().cause, "slot-[0] action isn't pending");
        t.slot_remove(2).unwrap();
    }

    #[test]
    fn assign_reads_malformed_bodies_as_empty_and_checks_items() {
        assert!(AssignItem::parse_body(b"not json").is_empty());
        assert_eq!(AssignItem::parse_body(br#"[{"id":"x"}]"#), [AssignItem::default()]);
        let mut t = topo_with_groups(&[1]);
        let items = AssignItem::parse_body(br#"[{"id":4,"group_id":42}]"#);
        assert_eq!(t.slots_assign(&items).unwrap_err().cause, "group-[42] doesn't exist");
        let items = AssignItem::parse_body(br#"[{"id":4,"group_id":0}]"#);
        assert_eq!(t.slots_assign(&items).unwrap_err().cause, "group-[0] doesn't exist");
        let items = AssignItem::parse_body(br#"[{"id":4,"group_id":1,"action":{"state":"pending"}}]"#);
        assert_eq!(t.slots_assign(&items).unwrap_err().cause, "invalid slot-[4] action = pending");
        let items = AssignItem::parse_body(br#"[{"id":4,"group_id":1}]"#);
        assert_eq!(t.slots_assign(&items).unwrap(), [4]);
        assert!(t.groups[&1].out_of_sync);
        assert_eq!(t.slots_assign_offline(&items).unwrap_err().cause, "group of slot-[4] should be 0");
        assert_eq!(t.slots_assign_offline(&AssignItem::parse_body(br#"[{"id":4}]"#)).unwrap(), [4]);
        assert_eq!(t.slots[4].group_id, 0);
    }

    #[test]
    fn promote_reorders_new_master_first_and_old_master_last() {
        let mut t = topo_with_groups(&[1]);
        t.group_add_server(1, "", "b:1").unwrap();
        t.group_add_server(1, "", "c:1").unwrap();
        assert_eq!(t.promote_check(1, "10.0.0.1:6379", 0).unwrap_err().cause, "group-[1] can't promote master");
        assert_eq!(t.promote_check(1, "c:1", 3).unwrap_err().cause, "slots-migration is running = 3");
        let (gid, index) = t.promote_check(1, "c:1", 0).unwrap();
        t.groups.get_mut(&gid).unwrap().promoting =
            Promoting { index: u32::try_from(index).unwrap(), state: PromotingState::Preparing };
        assert_eq!(t.promote_check(1, "b:1", 0).unwrap_err().cause, "group-[1] is promoting index = 2");
        assert_eq!(t.group_add_server(1, "", "d:1").unwrap_err().cause, "group-[1] is promoting");
        assert_eq!(t.promote_reorder(1).unwrap(), "c:1");
        let order: Vec<&str> = t.groups[&1].servers.iter().map(|s| s.server.as_str()).collect();
        assert_eq!(order, ["c:1", "b:1", "10.0.0.1:6379"]);
    }

    #[test]
    fn slot_views_follow_the_action_state() {
        let mut t = topo_with_groups(&[1, 2]);
        t.slots[0] = SlotMapping {
            id: 0,
            group_id: 1,
            action: SlotAction { index: 1, state: SlotState::Migrating, target_id: 2 },
        };
        let v = t.slot_view(&t.slots[0], None);
        assert_eq!((v.backend_addr.as_str(), v.migrate_from.as_str()), ("10.0.0.2:6379", "10.0.0.1:6379"));
        assert!(!v.locked);
        let prepared =
            SlotMapping { action: SlotAction { state: SlotState::Prepared, ..t.slots[0].action }, ..t.slots[0] };
        assert!(t.slot_view(&prepared, None).locked);
        let offline = t.slot_view(&t.slots[1], None);
        assert_eq!(offline, Slot { id: 1, forward_method: 1, ..Slot::default() });
    }

    #[test]
    fn a_round_never_takes_a_group_twice() {
        let mut t = topo_with_groups(&[1, 2, 3]);
        for sid in 0..6 {
            t.slots[sid].group_id = 1;
        }
        t.slot_create_some(1, 2, 3).unwrap();
        t.slot_create_some(1, 3, 3).unwrap();
        t.slot_create(8, 2).unwrap();
        t.slot_create(9, 3).unwrap();
        let state = State::new(t);
        // Group 1 is the source of slots 0..6: one of them per round; offline slot 8 needs group 2, taken by slot 0,
        // while slot 9 (offline -> 3) is free to go, since an offline source takes no group.
        assert_eq!(state.plan_round(100), [0, 9]);
        assert_eq!(state.plan_round(1), [0]);
    }
}
