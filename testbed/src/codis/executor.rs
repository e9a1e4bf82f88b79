//! The background executors of slot actions and sync actions, modelled on codis-dashboard's `ProcessSlotAction`,
//! `processSlotAction` and `ProcessSyncAction` (pkg/topom/topom_action.go) and the loops of `Topom.Start`
//! (pkg/topom/topom.go).
//!
//! Slot actions run in **rounds**. A round takes slots one at a time (`SlotActionPrepareFilter`): the lowest-index
//! action already in progress, else the lowest-index pending one, skipping a slot whose group or target group the
//! round already has, at most `migration_parallel_slots`; taking a slot walks it through `preparing → prepared →
//! migrating` with a push to every proxy at each step (a failed push ends the round with that error). Then every
//! slot of the round is processed concurrently and the round waits for all of them: a slot migrates in batches on
//! its source master (`slot_action.executor` counts the batches on the wire, `interval` is slept between two), its
//! progress is `[OK] Slot[NNNN]@DB[0]=<keys left>`, and an error ends the slot with `[ERROR] Slot[NNNN]: <error>`
//! and the round with that error, after which the executor sleeps 5 s + 1 s. While disabled, or while the slot's
//! group or target group is promoting, a `migrating` slot waits (1 s at a time) and holds the whole round.
//!
//! Every Codis delay is scaled by one factor, [`super::DoubleOptions::tick`] / 1 s (see [`Shared::scaled`]).

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;

use super::api::{batches, push, set_master};
use super::model::{ServerAction, ServerActionState, SlotAction, SlotMapping, SlotState};
use super::resp::{Conn, Reply};
use super::slotkeys;
use super::state::{mark, KeyFault, MigrationHold};
use super::wire::ApiError;
use super::Shared;

/// Codis's `migration_async_numkeys` default: keys per `SLOTSMGRTTAGSLOT-ASYNC` batch.
pub(crate) const NUMKEYS: usize = 500;
/// Codis's `migration_async_maxbulks` and `migration_async_maxbytes` defaults (sent to a real codis-server).
const MAXBULKS: &str = "200";
const MAXBYTES: &str = "33554432";
/// `min(5 s, migration_timeout)`: the batch timeout Codis sends.
const BATCH_TIMEOUT_MS: &str = "5000";

/// The slot-action loop of `Topom.Start`: a burst of rounds, then 1 s; after an error 5 s more.
pub(crate) async fn run_slots(shared: Arc<Shared>) {
    loop {
        let generation = shared.state().generation;
        if shared.is_online(generation) {
            if let Err(e) = process_slot_actions(&shared, generation).await {
                tracing::warn!("process slot action failed: {e}");
                shared.pause_for(Duration::from_secs(5)).await;
            }
        }
        shared.pause_for(Duration::from_secs(1)).await;
    }
}

/// The sync-action loop of `Topom.Start`: one sync action per turn, then 1 s; after an error 5 s more.
pub(crate) async fn run_syncs(shared: Arc<Shared>) {
    loop {
        let generation = shared.state().generation;
        if shared.is_online(generation) && !shared.state().sync_held {
            if let Err(e) = process_sync_action(&shared).await {
                tracing::warn!("process sync action failed: {e}");
                shared.pause_for(Duration::from_secs(5)).await;
            }
        }
        shared.pause_for(Duration::from_secs(1)).await;
    }
}

/// `ProcessSlotAction`: rounds until one finds nothing to do.
async fn process_slot_actions(sh: &Arc<Shared>, generation: u64) -> Result<(), ApiError> {
    while sh.is_online(generation) {
        let mut marks = BTreeSet::new();
        let mut plans: Vec<usize> = Vec::new();
        while plans.len() < sh.opts.migration_parallel_slots.max(1) {
            match prepare_next(sh, &mut marks, &mut plans).await? {
                Some(sid) => plans.push(sid),
                None => break,
            }
        }
        if plans.is_empty() {
            return Ok(());
        }
        sh.rounds.fetch_add(1, Ordering::SeqCst);
        sh.round_slots.fetch_add(plans.len() as u64, Ordering::SeqCst);
        let mut set = JoinSet::new();
        for sid in plans {
            let sh = sh.clone();
            set.spawn(async move {
                let result = process_slot(&sh, sid, generation).await;
                let mut st = sh.state();
                if st.generation == generation {
                    st.mem.slot_action.progress.status = match &result {
                        Err(e) => format!("[ERROR] Slot[{sid:04}]: {e}"),
                        Ok(()) => String::new(),
                    };
                }
                result
            });
        }
        let mut first_error = None;
        while let Some(joined) = set.join_next().await {
            if let Ok(Err(e)) = joined {
                first_error.get_or_insert(e);
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        sh.pause_for(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// `SlotActionPrepareFilter`: picks the round's next slot and walks it to `migrating`, pushing each step.
async fn prepare_next(sh: &Shared, marks: &mut BTreeSet<u32>, plans: &mut [usize]) -> Result<Option<usize>, ApiError> {
    let _op = sh.op.lock().await;
    let sid = {
        let mut st = sh.state();
        let Some(sid) = st.pick_next(marks, plans) else {
            return Ok(None);
        };
        mark(marks, &st.topo.slots[sid]);
        if st.topo.slots[sid].action.state == SlotState::Pending {
            st.topo.slots[sid].action.state = SlotState::Preparing;
        }
        sid
    };
    let state_of = |sh: &Shared| sh.state().topo.slots[sid].action.state;
    if state_of(sh) == SlotState::Preparing {
        // Pushed locked; on failure Codis rolls the proxies back to `preparing` and keeps it.
        let (forward, back) = {
            let st = sh.state();
            let now = st.topo.slots[sid];
            let next = with_state(now, SlotState::Prepared);
            (batches(&st.topo, &[next]), batches(&st.topo, &[now]))
        };
        if let Err(e) = push(sh, forward).await {
            let _ = push(sh, back).await;
            return Err(e);
        }
        sh.state().topo.slots[sid].action.state = SlotState::Prepared;
    }
    if state_of(sh) == SlotState::Prepared {
        let forward = {
            let st = sh.state();
            batches(&st.topo, &[with_state(st.topo.slots[sid], SlotState::Migrating)])
        };
        push(sh, forward).await?;
        sh.state().topo.slots[sid].action.state = SlotState::Migrating;
    }
    Ok(Some(sid))
}

fn with_state(mut m: SlotMapping, state: SlotState) -> SlotMapping {
    m.action.state = state;
    m
}

/// One step `newSlotActionExecutor` hands to `processSlotAction`.
enum Step {
    /// Disabled, or a group promoting: wait 1 s and ask again.
    Wait,
    /// `finished`: nothing left to move.
    Done,
    /// One batch from `from` to `dest` (registered addresses); `from` empty for an offline slot.
    Batch { from: String, dest: String },
}

/// `newSlotActionExecutor`: what to do next for `sid`; a batch increments `slot_action.executor`.
fn next_step(sh: &Shared, sid: usize, generation: u64) -> Result<Step, ApiError> {
    let mut st = sh.state();
    if st.generation != generation {
        return Ok(Step::Wait);
    }
    let m = st.topo.slots[sid];
    match m.action.state {
        SlotState::Migrating => {
            if st.mem.slot_action.disabled
                || st.topo.is_group_promoting(m.group_id)
                || st.topo.is_group_promoting(m.action.target_id)
            {
                return Ok(Step::Wait);
            }
            let from = st.topo.master_of(m.group_id);
            let dest = st.topo.master_of(m.action.target_id);
            st.mem.slot_action.executor += 1;
            Ok(Step::Batch { from, dest })
        }
        SlotState::Finished => Ok(Step::Done),
        _ => Err(ApiError::traced(format!("slot-[{sid}] action state is invalid"))),
    }
}

/// `processSlotAction`: batches until the slot is empty on its source, then `SlotActionComplete`.
async fn process_slot(sh: &Shared, sid: usize, generation: u64) -> Result<(), ApiError> {
    let mut done: u32 = 0;
    while sh.is_online(generation) {
        wait_hold(sh, sid, done, false, generation).await;
        match next_step(sh, sid, generation)? {
            Step::Wait => sh.pause_for(Duration::from_secs(1)).await,
            Step::Done => return complete(sh, sid).await,
            Step::Batch { from, dest } => {
                let result = batch(sh, sid, done, &from, &dest, generation).await;
                let interval = {
                    // The batch leaves the wire and its progress shows in one step.
                    let mut st = sh.state();
                    if st.generation == generation {
                        st.mem.slot_action.executor -= 1;
                        if let Ok(&left) = result.as_ref() {
                            if left > 0 {
                                st.mem.slot_action.progress.status = format!("[OK] Slot[{sid:04}]@DB[0]={left}");
                            }
                        }
                    }
                    st.mem.slot_action.interval
                };
                let left = result.map_err(ApiError::traced)?;
                done += 1;
                if left == 0 {
                    return complete(sh, sid).await;
                }
                if interval > 0 {
                    let us = u64::try_from(interval).unwrap_or(0);
                    sh.pause_for(Duration::from_micros(us)).await;
                }
            }
        }
    }
    Ok(())
}

/// Waits while a test holds `sid` at this point (`in_batch` tells which point this is).
async fn wait_hold(sh: &Shared, sid: usize, done: u32, in_batch: bool, generation: u64) {
    loop {
        {
            let mut st = sh.state();
            let holding = match st.holds.get(&sid) {
                Some(MigrationHold::BeforeBatch { after }) => !in_batch && done >= *after,
                Some(MigrationHold::InBatch { after }) => in_batch && done >= *after,
                None => false,
            };
            if !holding || st.generation != generation {
                st.held.remove(&sid);
                return;
            }
            st.held.insert(sid);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// `SlotActionComplete`: `migrating → finished`, the finished view pushed, then the slot handed to its target.
async fn complete(sh: &Shared, sid: usize) -> Result<(), ApiError> {
    let _op = sh.op.lock().await;
    let forward = {
        let mut st = sh.state();
        let m = &mut st.topo.slots[sid];
        match m.action.state {
            SlotState::Migrating | SlotState::Finished => m.action.state = SlotState::Finished,
            _ => return Err(ApiError::traced(format!("slot-[{sid}] action state is invalid"))),
        }
        let now = st.topo.slots[sid];
        batches(&st.topo, &[now])
    };
    push(sh, forward).await?;
    let mut st = sh.state();
    let m = st.topo.slots[sid];
    st.topo.slots[sid] = SlotMapping { id: sid, group_id: m.action.target_id, action: SlotAction::default() };
    // What the slot's goroutine stores right after (`status.Store("")`), in the same step.
    st.mem.slot_action.progress.status = String::new();
    drop(st);
    let mut migrated = sh.migrated.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    for gid in [m.group_id, m.action.target_id].into_iter().filter(|&g| g != 0) {
        *migrated.entry(gid).or_default() += 1;
    }
    Ok(())
}

/// One batch of `sid` from `from` to `dest`: what `SLOTSMGRTTAGSLOT-ASYNC` does on codis-server, emulated on a
/// redis-server stand-in (or sent as is to a real codis-server). Returns what codis-server answers: the slot's
/// key count on the source before this batch's keys are released (0: nothing left).
async fn batch(sh: &Shared, sid: usize, done: u32, from: &str, dest: &str, generation: u64) -> Result<usize, String> {
    wait_hold(sh, sid, done, true, generation).await;
    let (error, fault, ticks) = {
        let st = sh.state();
        (st.slot_errors.get(&sid).cloned(), st.key_faults.get(&sid).copied(), st.ticks_for(sid))
    };
    if let Some(e) = error {
        return Err(e);
    }
    let left = if from.is_empty() {
        // An offline slot has no keys to move.
        0
    } else {
        let (from_real, dest_real) = (sh.dial_target(from), sh.dial_target(dest));
        let mut conn = sh.action_conn(&from_real).await?;
        let left = if sh.opts.redis_stand_ins {
            emulated_batch(sh, &mut conn, sid, &from_real, &dest_real, fault).await?
        } else {
            native_batch(&mut conn, sid, &sh.told_target(dest)).await?
        };
        sh.return_action_conn(&from_real, conn);
        left
    };
    if ticks <= 1 {
        return Ok(left);
    }
    // A slot stretched to `ticks` batches behaves like a bigger one: each batch spends a tick on the wire and the
    // count it reports stays above zero until the last.
    tokio::time::sleep(sh.opts.tick).await;
    let batches_left = usize::try_from(ticks.saturating_sub(done + 1)).unwrap_or(usize::MAX);
    Ok(left.max(batches_left))
}

/// `SLOTSMGRTTAGSLOT-ASYNC` emulated: the next keys of the slot on the source (from the slot index) go to the target
/// with `MIGRATE ... REPLACE KEYS`, which redis runs atomically (the source answers no command in between, and drops
/// the keys once the target has them), like codis-server's batch with its blocked keys.
async fn emulated_batch(
    sh: &Shared,
    conn: &mut Conn,
    sid: usize,
    from_real: &str,
    dest_real: &str,
    fault: Option<KeyFault>,
) -> Result<usize, String> {
    let nslots = sh.opts.max_slot_num;
    slotkeys::ensure_fresh(conn, from_real, nslots, sh.password()).await?;
    if from_real == dest_real {
        // Two registered names for one server: the keys are already where they go.
        slotkeys::clear_slot(from_real, nslots, sid);
        return Ok(0);
    }
    // codis-server answers a batch with the slot's size before the batch's keys are released (073 of the second
    // recording: a 21-key slot shows `=21` after its one batch, then one empty batch ends it), so that is the count.
    let before = slotkeys::count(from_real, nslots, sid);
    let keys = slotkeys::take(from_real, nslots, sid, NUMKEYS);
    if keys.is_empty() {
        return Ok(0);
    }
    let reply = if fault == Some(KeyFault::Delete) {
        let mut args: Vec<&[u8]> = vec![b"DEL"];
        args.extend(keys.iter().map(Vec::as_slice));
        conn.request(&args).await
    } else {
        let (host, port) = split_host_port(dest_real);
        let mut args: Vec<&[u8]> =
            vec![b"MIGRATE", host.as_bytes(), port.as_bytes(), b"", b"0", BATCH_TIMEOUT_MS.as_bytes(), b"REPLACE"];
        if let Some(pw) = sh.password().filter(|p| !p.is_empty()) {
            args.extend([b"AUTH".as_slice(), pw.as_bytes()]);
        }
        args.push(b"KEYS");
        args.extend(keys.iter().map(Vec::as_slice));
        conn.request(&args).await
    };
    match reply {
        Ok(Reply::Error(e)) => {
            slotkeys::put_back(from_real, nslots, keys);
            Err(e)
        }
        Err(e) => {
            slotkeys::put_back(from_real, nslots, keys);
            Err(e)
        }
        // The target's index (if the double watches it) learns the keys from its keyspace events.
        Ok(_) => Ok(before),
    }
}

/// `SLOTSMGRTTAGSLOT-ASYNC` sent to a real codis-server; its reply is `[moved, left]`.
async fn native_batch(conn: &mut Conn, sid: usize, dest_real: &str) -> Result<usize, String> {
    let (host, port) = split_host_port(dest_real);
    let slot = sid.to_string();
    let numkeys = NUMKEYS.to_string();
    let reply = conn
        .request(&[
            b"SLOTSMGRTTAGSLOT-ASYNC",
            host.as_bytes(),
            port.as_bytes(),
            BATCH_TIMEOUT_MS.as_bytes(),
            MAXBULKS.as_bytes(),
            MAXBYTES.as_bytes(),
            slot.as_bytes(),
            numkeys.as_bytes(),
        ])
        .await?;
    match &reply {
        Reply::Error(e) => Err(e.clone()),
        Reply::Array(Some(p)) if p.len() == 2 => {
            p[1].as_int().and_then(|n| usize::try_from(n).ok()).ok_or_else(|| format!("invalid response = {reply:?}"))
        }
        _ => Err(format!("invalid response = {reply:?}")),
    }
}

/// `host:port` (or `[v6]:port`) into its parts.
pub(crate) fn split_host_port(addr: &str) -> (String, String) {
    match addr.rsplit_once(':') {
        Some((h, p)) => (h.trim_matches(['[', ']']).to_owned(), p.to_owned()),
        None => (addr.to_owned(), String::new()),
    }
}

/// `ProcessSyncAction`: the lowest-index pending sync action (unless its group is promoting) becomes `syncing`, its
/// server gets `SLAVEOF` (the group's master, or `NO ONE` at index 0), and the result is stored.
async fn process_sync_action(sh: &Shared) -> Result<(), ApiError> {
    let job = {
        let _op = sh.op.lock().await;
        let mut st = sh.state();
        let pending = st
            .topo
            .groups
            .values()
            .flat_map(|g| {
                g.servers
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.action.state == ServerActionState::Pending)
                    .map(move |(i, s)| (g.id, i, s.server.clone(), s.action.index))
            })
            .min_by_key(|(_, _, _, index)| *index);
        let Some((gid, index, addr, _)) = pending else {
            return Ok(());
        };
        let Some(g) = st.topo.groups.get_mut(&gid) else {
            return Ok(());
        };
        if !g.promoting.state.is_nothing() {
            return Ok(());
        }
        g.servers[index].action = ServerAction { index: 0, state: ServerActionState::Syncing };
        let master = if index == 0 { None } else { g.master().map(str::to_owned) };
        (gid, addr, master)
    };
    let (gid, addr, master) = job;
    // A plain `SLAVEOF h p`, in the fork too (its `updateMasterToNewOne`); only its re-attach of a recovered offline
    // server forces one with `-f`.
    let result = set_master(sh, &addr, master.as_deref(), false).await;
    if let Err(e) = &result {
        tracing::warn!("redis {addr} set master failed: {e}");
    }
    let _op = sh.op.lock().await;
    let mut st = sh.state();
    let fork = st.topo.fork;
    let Some(g) = st.topo.groups.get_mut(&gid) else {
        return Ok(());
    };
    if !g.promoting.state.is_nothing() {
        return Ok(());
    }
    let Some(index) = g.index_of(&addr) else {
        return Ok(());
    };
    let server = &mut g.servers[index];
    if server.action.state != ServerActionState::Syncing {
        return Ok(());
    }
    let state = if result.is_ok() { ServerActionState::Synced } else { ServerActionState::SyncedFailed };
    server.action = ServerAction { index: 0, state };
    if fork && index != 0 {
        // The fork marks a server whose sync action completed as offline (state 2).
        server.state = Some(2);
    }
    Ok(())
}
