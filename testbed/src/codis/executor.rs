//! The background executors: slot actions (reference §6) and sync actions (§9), one state step per tick.
//!
//! Codis runs both loops every second and does several states in one go; the double advances each picked slot by
//! exactly one state per tick so tests can observe every state, and retries a failed push on the next tick.

use std::sync::Arc;

use super::api::{batches, push, set_master};
use super::model::{ServerAction, ServerActionState, SlotAction, SlotMapping, SlotState};
use super::state::State;
use super::Shared;

/// Runs both executors every `tick` until the runtime stops.
pub(crate) async fn run(shared: Arc<Shared>) {
    let mut ticker = tokio::time::interval(shared.opts.tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if shared.is_paused() {
            continue;
        }
        slot_tick(&shared).await;
        sync_tick(&shared).await;
    }
}

/// One migration "batch" of a migrating slot: pauses while disabled or a group promotes, reports an injected
/// error, otherwise counts down the slot's migrating ticks and finishes it.
fn migrate_batch(st: &mut State, sid: usize) {
    let m = st.topo.slots[sid];
    if st.slot_action.disabled
        || st.topo.is_group_promoting(m.group_id)
        || st.topo.is_group_promoting(m.action.target_id)
    {
        return;
    }
    if let Some(e) = st.slot_errors.get(&sid) {
        st.slot_action.progress.status = format!("[ERROR] Slot[{sid:04}]: {e}");
        return;
    }
    let total = st.ticks_for(sid);
    let done = {
        let d = st.migrated.entry(sid).or_insert(0);
        *d += 1;
        *d
    };
    // "Keys left" after this batch: the double counts ticks instead of keys.
    let remaining = total.saturating_sub(done);
    st.slot_action.progress.status = format!("[OK] Slot[{sid:04}]@DB[0]={remaining}");
    if remaining == 0 {
        st.topo.slots[sid].action.state = SlotState::Finished;
        st.migrated.remove(&sid);
    }
}

/// One executor round of slot actions.
pub(crate) async fn slot_tick(sh: &Shared) {
    let _op = sh.op.lock().await;
    let mut to_prepared = Vec::new();
    let mut to_migrating = Vec::new();
    let mut to_done = Vec::new();
    {
        let mut st = sh.state();
        let plan = st.plan_round(sh.opts.migration_parallel_slots);
        for sid in plan {
            match st.topo.slots[sid].action.state {
                SlotState::Pending => st.topo.slots[sid].action.state = SlotState::Preparing,
                SlotState::Preparing => to_prepared.push(sid),
                SlotState::Prepared => to_migrating.push(sid),
                SlotState::Migrating => migrate_batch(&mut st, sid),
                SlotState::Finished => to_done.push(sid),
                SlotState::Nothing => {}
            }
        }
    }
    if !to_prepared.is_empty() {
        // preparing -> prepared: push the locked view; on failure roll the proxies back and stay preparing.
        let (forward, back) = {
            let st = sh.state();
            let next: Vec<SlotMapping> = to_prepared
                .iter()
                .map(|&s| with_state(st.topo.slots[s], SlotState::Prepared))
                .collect();
            let now: Vec<SlotMapping> = to_prepared.iter().map(|&s| st.topo.slots[s]).collect();
            (batches(&st.topo, &next), batches(&st.topo, &now))
        };
        if push(sh, forward).await.is_ok() {
            set_states(sh, &to_prepared, SlotState::Preparing, SlotState::Prepared);
        } else {
            let _ = push(sh, back).await;
        }
    }
    if !to_migrating.is_empty() {
        // prepared -> migrating: on failure Codis keeps `prepared` and retries.
        let forward = {
            let st = sh.state();
            let next: Vec<SlotMapping> = to_migrating
                .iter()
                .map(|&s| with_state(st.topo.slots[s], SlotState::Migrating))
                .collect();
            batches(&st.topo, &next)
        };
        if push(sh, forward).await.is_ok() {
            set_states(sh, &to_migrating, SlotState::Prepared, SlotState::Migrating);
        }
    }
    if !to_done.is_empty() {
        // finished -> none: push the finished view, then hand the slot to its target.
        let forward = {
            let st = sh.state();
            let now: Vec<SlotMapping> = to_done.iter().map(|&s| st.topo.slots[s]).collect();
            batches(&st.topo, &now)
        };
        match push(sh, forward).await {
            Ok(()) => {
                let mut st = sh.state();
                for &sid in &to_done {
                    let m = st.topo.slots[sid];
                    if m.action.state == SlotState::Finished {
                        st.topo.slots[sid] = SlotMapping {
                            id: sid,
                            group_id: m.action.target_id,
                            action: SlotAction::default(),
                        };
                    }
                }
                st.slot_action.progress.status = String::new();
            }
            Err(e) => {
                if let Some(sid) = to_done.first() {
                    sh.state().slot_action.progress.status = format!("[ERROR] Slot[{sid:04}]: {e}");
                }
            }
        }
    }
}

fn with_state(mut m: SlotMapping, state: SlotState) -> SlotMapping {
    m.action.state = state;
    m
}

fn set_states(sh: &Shared, sids: &[usize], from: SlotState, to: SlotState) {
    let mut st = sh.state();
    for &sid in sids {
        if st.topo.slots[sid].action.state == from {
            st.topo.slots[sid].action.state = to;
        }
    }
}

/// One executor round of sync actions: a `syncing` server gets its SLAVEOF; otherwise the lowest-index `pending`
/// server becomes `syncing` (unless its group is promoting). One server per tick.
pub(crate) async fn sync_tick(sh: &Shared) {
    let _op = sh.op.lock().await;
    let job = {
        let mut st = sh.state();
        let candidates = st.topo.groups.values().flat_map(|g| {
            g.servers
                .iter()
                .enumerate()
                .filter(|(_, s)| {
                    matches!(
                        s.action.state,
                        ServerActionState::Pending | ServerActionState::Syncing
                    )
                })
                .map(move |(i, s)| (g.id, i, s.server.clone(), s.action))
        });
        let Some((gid, index, addr, action)) =
            candidates.min_by_key(|(_, _, _, a)| (a.state != ServerActionState::Syncing, a.index))
        else {
            return;
        };
        let Some(g) = st.topo.groups.get_mut(&gid) else {
            return;
        };
        if !g.promoting.state.is_nothing() {
            return;
        }
        if action.state == ServerActionState::Pending {
            g.servers[index].action.state = ServerActionState::Syncing;
            return;
        }
        let master = if index == 0 {
            None
        } else {
            g.master().map(str::to_owned)
        };
        (gid, addr, master)
    };
    let (gid, addr, master) = job;
    // The fork forces the resync with `-f`, which real Pika and redis-server reject as a wrong number of arguments.
    let result = set_master(sh, &addr, master.as_deref(), sh.opts.fork).await;
    if let Err(e) = &result {
        tracing::warn!("sync-[{addr}] set master failed: {e}");
    }
    let mut st = sh.state();
    let fork = st.topo.fork;
    let Some(g) = st.topo.groups.get_mut(&gid) else {
        return;
    };
    if !g.promoting.state.is_nothing() {
        return;
    }
    let Some(index) = g.index_of(&addr) else {
        return;
    };
    let server = &mut g.servers[index];
    if server.action.state != ServerActionState::Syncing {
        return;
    }
    let state = if result.is_ok() {
        ServerActionState::Synced
    } else {
        ServerActionState::SyncedFailed
    };
    server.action = ServerAction { index: 0, state };
    if fork && index != 0 {
        // The fork marks a server whose sync action completed as offline (state 2); see reference §14.5.
        server.state = Some(2);
    }
}
