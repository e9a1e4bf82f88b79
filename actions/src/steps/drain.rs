//! Draining a shard before it goes: the body shared by `shard-remove` (1.1+) and `pre-terminate` when scaling in
//! (1.0.x), so that removing a shard never drops a slot Codis still routes to it.
//!
//! Pipeline: record the shard as leaving in etcd → under the topology lock, find the leaving group (by its servers,
//! else by its etcd reservation) and [`assess`] the cluster, refusing, changing nothing, whatever would make the drain
//! hang or lose data (last shard, unreachable proxy, slot actions disabled, a promotion, `slotmigrate` off) → move its
//! slots (and those of every other recorded leaver) to the groups that stay, balanced with the fewest moves, one step
//! at a time ([`rebalance::converge`]: planned under the lock, waited for outside it) until Codis shows none owned
//! by or migrating to it → under the lock again, delete its servers, replicas first and master last, re-reading the
//! group before each step because the Pika fork's HA may reorder it at any time ([`next_removal`]) → remove the
//! group and its etcd records. Every step reads Codis first and does only what is missing, so a run killed at any
//! point, or out of budget (exit 75), is finished by the next. Codis' own `slots/rebalance` is never used: it
//! refills a group that still has servers.
//!
//! The decisions are the pure functions of this module, tested without any server; [`remove_shard`] applies them.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::clients::codis::{Group, Stats};
use crate::clients::server::ServerAddr;
use crate::error::{Error, Result};
use crate::input::event::Shard;
use crate::plan::Goal;
use crate::steps::cluster::{self, Session};
use crate::steps::rebalance::{self, Aim, Handoff, Outcome, Own};

/// The pika setting that gates slot migration and per-slot key tracking; it must be `yes` on every pika.
pub const SLOTMIGRATE: &str = "slotmigrate";

/// Why a drain will not start. Nothing was changed; each is a state of the cluster that an operator can fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No other shard would be left to take the slots.
    #[error("{shard} is the last shard of the cluster (codis group {gid}): its slots would have nowhere to go; refusing to remove it")]
    LastShard {
        /// The leaving shard.
        shard: String,
        /// Its group.
        gid: u32,
    },
    /// Groups hold slots that no listed shard of this cluster owns: moving them is not this action's call.
    #[error(
        "codis groups {gids:?} hold slots but serve no shard of cluster {cluster}; refusing to drain while they do"
    )]
    ForeignGroups {
        /// The groups.
        gids: Vec<u32>,
        /// The cluster.
        cluster: String,
    },
    /// The dashboard would not start any migration.
    #[error("slot actions are disabled in codis, so the drain would never progress; enable them (slots/action/disabled/0) first")]
    SlotActionsDisabled,
    /// A group taking part is promoting: Codis pauses its migrations and refuses to change it.
    #[error("codis group {gid} is promoting a new master ({state}): migrations touching it pause and it cannot be changed; let the switchover finish first")]
    Promoting {
        /// The group.
        gid: u32,
        /// The promotion's state.
        state: String,
    },
    /// Codis cannot reach a registered proxy: every slot transition waits for every proxy, so the drain would hang.
    #[error("codis cannot reach proxy {addr} (token {token}): {why}; every slot migration waits for every proxy, so the drain would hang; bring it back or remove it (proxy/remove with force=1) first")]
    ProxyUnreachable {
        /// Its admin address.
        addr: String,
        /// Its token.
        token: String,
        /// What Codis reports.
        why: String,
    },
    /// pika would refuse to migrate (or would miss keys written while it was off).
    #[error("{SLOTMIGRATE} is {value:?} on {server}: pika refuses to migrate slots without it; set it (CONFIG SET slotmigrate yes, SLOTSRELOAD, CONFIG REWRITE) first")]
    SlotMigrateOff {
        /// The server (`<fqdn>:<port>`).
        server: String,
        /// What `CONFIG GET slotmigrate` answered.
        value: String,
    },
}

/// A drain that could not check what it must check, or was overtaken while it removed the group.
#[derive(Debug, thiserror::Error)]
pub enum Stopped {
    /// A master could not be asked for `slotmigrate`: draining without knowing could lose the keys pika skips.
    #[error("cannot check {SLOTMIGRATE} on {server} before draining")]
    Unchecked {
        /// The master.
        server: String,
        /// Why it could not be asked.
        #[source]
        source: Box<Error>,
    },
    /// A slot moved back onto the group after it was drained (another action's plan, or an operator).
    #[error("slot {slot} came back to group {gid} after the drain; run again to drain it")]
    SlotCameBack {
        /// The slot.
        slot: u32,
        /// The drained group.
        gid: u32,
    },
}

/// What the drain found before changing anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    /// The leaving group.
    pub gid: u32,
    /// The groups that take its slots, ascending.
    pub targets: Vec<u32>,
    /// Other groups of this cluster outside the targets that hold slots (shards being removed at the same time):
    /// the plan empties them too, so no slot moves twice.
    pub also_leaving: Vec<u32>,
    /// Slots the leaving group owns now, plus those already on their way into it.
    pub left: usize,
    /// Slots with a pending migration into the leaving group: cancelled.
    pub cancel: Vec<u32>,
    /// Slots whose migration into the leaving group is past pending: waited for, then drained.
    pub arriving: Vec<u32>,
    /// Whether any slot still has to move (or is moving); when not, only the servers and the group remain.
    pub migrating: bool,
    /// The masters that take part in the migration, sources first: their `slotmigrate` is checked.
    pub masters: Vec<String>,
}

/// The group of the leaving shard: the one whose servers are its pods, else a group with no servers that etcd
/// reserved for it (a crash after its servers were deleted). `None`: Codis does not know the shard (any more).
#[must_use]
pub fn leaving_group(stats: &Stats, shard: &str, reserved: &BTreeMap<u32, String>) -> Option<u32> {
    if let Some(group) = cluster::group_of_shard(stats, shard) {
        return Some(group.id);
    }
    reserved
        .iter()
        .find(|(gid, owner)| owner.as_str() == shard && stats.group(**gid).is_some_and(|g| g.servers.is_empty()))
        .map(|(gid, _)| *gid)
}

/// The groups of the `remaining` shards that Codis knows, ascending, without `leaving`.
#[must_use]
pub fn target_groups(stats: &Stats, remaining: &[String], leaving: u32) -> Vec<u32> {
    let gids: BTreeSet<u32> = remaining
        .iter()
        .filter_map(|shard| cluster::group_of_shard(stats, shard))
        .map(|g| g.id)
        .filter(|&gid| gid != leaving)
        .collect();
    gids.into_iter().collect()
}

/// Looks at the cluster as Codis shows it and decides what the drain must do, or why it must not start.
///
/// `cluster` and `namespace` tell this cluster's other groups (servers `<cluster>-…` pods in `namespace`, or an etcd
/// reservation) from foreign ones. The checks that could make a drain hang apply only while slots still have to
/// move; a promotion of the leaving group is refused in any case, since Codis would refuse to delete its servers.
///
/// # Errors
///
/// The first [`Refusal`] that applies, in the order of the enum.
pub fn assess(
    stats: &Stats,
    cluster: &str,
    namespace: &str,
    shard: &str,
    gid: u32,
    targets: &[u32],
    reserved: &BTreeMap<u32, String>,
) -> Result<Scope, Refusal> {
    let targets: Vec<u32> =
        targets.iter().copied().filter(|&g| g != gid).collect::<BTreeSet<_>>().into_iter().collect();
    if targets.is_empty() {
        return Err(Refusal::LastShard { shard: shard.to_owned(), gid });
    }

    let holders: BTreeSet<u32> = stats
        .slots
        .iter()
        .flat_map(|sl| [sl.group_id, if sl.is_idle() { 0 } else { sl.action.target_id.unwrap_or(0) }])
        .filter(|&g| g != 0 && g != gid && !targets.contains(&g))
        .collect();
    let ours = |g: u32| {
        reserved.contains_key(&g)
            || stats
                .group(g)
                .is_some_and(|group| group.servers.iter().any(|s| of_cluster(&s.server, cluster, namespace)))
    };
    let (also_leaving, foreign): (Vec<u32>, Vec<u32>) = holders.into_iter().partition(|&g| ours(g));
    if !foreign.is_empty() {
        return Err(Refusal::ForeignGroups { gids: foreign, cluster: cluster.to_owned() });
    }

    let mut cancel = Vec::new();
    let mut arriving = Vec::new();
    for sl in stats.slots.iter().filter(|sl| !sl.is_idle() && sl.action.target_id == Some(gid)) {
        if sl.action.state() == Some("pending") {
            cancel.push(sl.id);
        } else {
            arriving.push(sl.id);
        }
    }
    let left = stats.slots.iter().filter(|sl| sl.group_id == gid).count() + arriving.len();
    let states = rebalance::slot_states(stats);
    let migrating = stats.is_migrating() || crate::plan::drain(&states, gid, &targets).map_or(true, |p| !p.is_empty());

    let promoting = |g: u32| stats.group(g).filter(|group| group.is_promoting());
    if let Some(group) = promoting(gid) {
        return Err(promotion(group));
    }
    let mut masters = Vec::new();
    if migrating {
        if stats.slot_action.disabled {
            return Err(Refusal::SlotActionsDisabled);
        }
        if let Some(group) = also_leaving.iter().chain(&targets).find_map(|&g| promoting(g)) {
            return Err(promotion(group));
        }
        if let Some((proxy, why)) = stats.unreachable_proxy() {
            return Err(Refusal::ProxyUnreachable { addr: proxy.admin_addr.clone(), token: proxy.token.clone(), why });
        }
        masters = std::iter::once(gid)
            .chain(also_leaving.iter().copied())
            .chain(targets.iter().copied())
            .filter_map(|g| stats.group(g).and_then(Group::master).map(str::to_owned))
            .collect();
    }
    Ok(Scope { gid, targets, also_leaving, left, cancel, arriving, migrating, masters })
}

fn promotion(group: &Group) -> Refusal {
    let state = group.promoting.state.clone().filter(|s| !s.is_empty()).unwrap_or_else(|| "started".to_owned());
    Refusal::Promoting { gid: group.id, state }
}

/// Whether a registered server is a pod of this cluster: `<cluster>-<sharding>-<id>-<n>.<svc>.<namespace>…`.
fn of_cluster(server: &str, cluster: &str, namespace: &str) -> bool {
    let server = ServerAddr::of(server);
    server.namespace().is_some_and(|ns| ns.eq_ignore_ascii_case(namespace))
        && server.shard().is_some_and(|shard| shard.starts_with(&format!("{cluster}-")))
}

/// What `CONFIG GET slotmigrate` says about a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotMigrate {
    /// `yes`.
    On,
    /// The server has no such item: not pika (redis-server in tests), so nothing can be told.
    Unknown,
}

/// Judges one server's `slotmigrate`: `yes` passes, an absent item cannot be judged, anything else is refused.
///
/// # Errors
///
/// [`Refusal::SlotMigrateOff`] for any value but `yes`.
pub fn slotmigrate_verdict(server: &str, value: Option<&str>) -> Result<SlotMigrate, Refusal> {
    match value.map(str::trim) {
        None => Ok(SlotMigrate::Unknown),
        Some(v) if v.eq_ignore_ascii_case("yes") => Ok(SlotMigrate::On),
        Some(v) => Err(Refusal::SlotMigrateOff { server: server.to_owned(), value: v.to_owned() }),
    }
}

/// The next step of removing a drained group, from its current servers (index 0 is the master).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Removal {
    /// Delete this replica (the last listed: Codis refuses the master while replicas remain).
    Replica(String),
    /// Delete the master, the only server left.
    Master(String),
    /// No server is left: remove the group.
    Group,
}

/// Replicas first, the master last, then the group. Decided afresh before every step, from the group just read.
#[must_use]
pub fn next_removal(group: &Group) -> Removal {
    match group.servers.as_slice() {
        [] => Removal::Group,
        [master] => Removal::Master(master.server.clone()),
        [.., last] => Removal::Replica(last.server.clone()),
    }
}

/// What a 1.0.x `pre-terminate` must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LegacyDecision {
    /// Nothing: the cluster is being deleted (no scale-in flag, or every shard is deleting). Codis goes with it.
    Nothing(String),
    /// Drain `shard` onto the `remaining` shards (full names).
    Drain {
        /// The shards that stay.
        remaining: Vec<String>,
    },
}

/// Decides a 1.0.x `pre-terminate` from the event: only a scale-in drains, onto the shards that are not deleting
/// (`deleting` holds short names `<sharding>-<id>`, as `KB_CLUSTER_COMPONENT_DELETING_LIST` does).
#[must_use]
pub fn legacy_decision(
    cluster: &str,
    shard: &str,
    shards: &[Shard],
    deleting: &[String],
    scaling_in: bool,
) -> LegacyDecision {
    if !scaling_in {
        return LegacyDecision::Nothing(format!(
            "{shard} is terminating without a scale-in (cluster deletion): codis is left as it is"
        ));
    }
    let deleting: BTreeSet<String> = deleting.iter().map(|d| format!("{cluster}-{d}")).collect();
    if !shards.is_empty() && shards.iter().all(|s| deleting.contains(&s.name)) {
        return LegacyDecision::Nothing(format!(
            "every shard of {cluster} is being deleted (cluster deletion): codis is left as it is"
        ));
    }
    let remaining =
        shards.iter().filter(|s| s.name != shard && !deleting.contains(&s.name)).map(|s| s.name.clone()).collect();
    LegacyDecision::Drain { remaining }
}

/// The shards that stay when `removed` goes on 1.1+ (`ALL_SHARDS_POD_FQDNS` may or may not still list it).
#[must_use]
pub fn remaining_after(removed: &str, shards: &[Shard]) -> Vec<String> {
    shards.iter().filter(|s| s.name != removed).map(|s| s.name.clone()).collect()
}

/// The etcd record of a drain's size, `"<total> <shard>"`: lets every run report progress against the whole drain.
fn record_value(shard: &str, total: usize) -> String {
    format!("{total} {shard}")
}

/// The total of a drain record, when it is this shard's.
fn record_total(value: &str, shard: &str) -> Option<usize> {
    let (total, owner) = value.split_once(' ')?;
    (owner == shard).then(|| total.parse().ok()).flatten()
}

// ---- applying ------------------------------------------------------------------------------------------------------

/// How long a shard stays recorded as leaving after the last run of its removal wrote it: long enough to span
/// KubeBlocks' retries of one removal, short enough that a scale-in given up leaves no lasting mark.
pub const LEAVING_TTL: Duration = Duration::from_secs(180);

/// Drains `shard` onto the groups of the `remaining` shards and removes its group from Codis; idempotent.
///
/// Before anything else the shard is recorded as leaving in etcd (`<prefix>/leaving/<shard>`, for
/// [`LEAVING_TTL`]), so that every other drain or addition planning from then on leaves it out of its targets: on
/// KubeBlocks 1.1 nothing else tells one shardRemove about the others of the same scale-in. The drain itself is one
/// step after another toward the shards that stay ([`rebalance::converge`]), each planned under the topology lock and
/// waited for outside it, so removals of one scale-in drain side by side; each step also drains the other recorded
/// leavers, and removes pending migrations into them. The servers and the group are deleted under the lock again.
///
/// # Errors
///
/// A [`Refusal`] (exit 1, nothing changed), exit 75 with the drain's progress when the budget runs out, or the
/// failure of a Codis, pika or etcd call.
pub async fn remove_shard(s: &Session<'_>, shard: &str, remaining: &[String]) -> Result<String> {
    record_leaving(s, shard).await?;
    let prepared = s.under_topology_lock(async |_| prepare(s, shard, remaining).await).await;
    let Some(p) = prepared? else {
        return Ok(format!("{shard} has no codis group: nothing to drain"));
    };
    let gid = p.gid;
    let outcome = if p.migrating {
        let aim_of = |stats: &Stats, leavers: &BTreeSet<String>| -> Result<Aim> {
            let stay: Vec<String> = remaining.iter().filter(|r| !leavers.contains(*r)).cloned().collect();
            let receivers = target_groups(stats, &stay, gid);
            if receivers.is_empty() {
                return Err(Refusal::LastShard { shard: shard.to_owned(), gid }.into());
            }
            Ok(Aim { goal: Goal::new(receivers, 0), own: Own::Leaver { gid, total: p.total } })
        };
        rebalance::converge(s, "drain", aim_of, Handoff::Wait).await?
    } else {
        Outcome::default()
    };
    let deleted = s
        .under_topology_lock(async |_| {
            let deleted = remove_group(s, gid).await?;
            forget(s, gid, shard, p.reserved).await?;
            Ok(deleted)
        })
        .await?;
    Ok(format!(
        "{shard} drained and removed: group {gid} gave {} slot(s) to groups {:?} ({} migration(s) created by this \
         run, {} read(s) of the slot table); {deleted} server(s) deleted, group removed",
        p.total, p.targets, outcome.created, outcome.polls
    ))
}

/// What the drain found, under the lock, before moving anything.
struct Prepared {
    gid: u32,
    targets: Vec<u32>,
    total: usize,
    migrating: bool,
    /// Whether etcd reserves the group for this shard (its record is deleted with the group).
    reserved: bool,
}

/// Finds the leaving group and checks that a drain can proceed; `None` when Codis has no group for the shard (its
/// leftover records are deleted then).
async fn prepare(s: &Session<'_>, shard: &str, remaining: &[String]) -> Result<Option<Prepared>> {
    let etcd = s.etcd()?;
    let prefix = s.prefix();
    let mut stats = s.stats().await?;
    // Migrations paused for a promote resume within moments: wait, as for any batch, instead of refusing.
    while crate::steps::pause::paused_for_promote(s, &stats).await {
        s.ctx.budget.check(|| "drain waiting: migrations are paused for a promote".to_owned())?;
        tokio::time::sleep(s.ctx.budget.cap(cluster::POLL)).await;
        stats = s.stats().await?;
    }
    let reserved = cluster::reservations(etcd, &prefix).await?;
    let Some(gid) = leaving_group(&stats, shard, &reserved) else {
        // Already removed (or never registered): only etcd records of a run that crashed at the very end may be left.
        forget_stale(s, shard, &stats, &reserved).await?;
        return Ok(None);
    };
    let leavers = recorded_leavers(s).await?;
    let stay: Vec<String> = remaining.iter().filter(|r| !leavers.contains(*r)).cloned().collect();
    let targets = target_groups(&stats, &stay, gid);
    let cluster = &s.common.cluster;
    let scope = assess(&stats, &cluster.name, &cluster.namespace, shard, gid, &targets, &reserved)?;
    if !scope.also_leaving.is_empty() {
        tracing::info!(groups = ?scope.also_leaving, "groups of other leaving shards hold slots: draining them too");
    }
    if scope.migrating {
        check_slotmigrate(s, &scope.masters).await?;
    }
    tracing::info!(shard, gid, targets = ?scope.targets, left = scope.left, "draining group");
    let total = if scope.migrating {
        drain_total(s, gid, shard, scope.left).await?
    } else {
        // A rerun after the migrations: the record, if still there, says how many moved.
        recorded_total(s, gid, shard).await?.unwrap_or(scope.left)
    };
    Ok(Some(Prepared {
        gid,
        targets: scope.targets,
        total,
        migrating: scope.migrating,
        reserved: reserved.get(&gid).is_some_and(|owner| owner == shard),
    }))
}

/// The shards recorded as leaving (see [`remove_shard`]); none without etcd.
///
/// # Errors
///
/// etcd failing to answer.
pub async fn recorded_leavers(s: &Session<'_>) -> Result<BTreeSet<String>> {
    let Some(etcd) = &s.etcd else { return Ok(BTreeSet::new()) };
    let dir = leaving_dir(s);
    Ok(etcd.list(&dir).await?.into_iter().filter_map(|(key, _)| key.strip_prefix(&dir).map(str::to_owned)).collect())
}

/// Records `shard` as leaving, for [`LEAVING_TTL`] from now.
async fn record_leaving(s: &Session<'_>, shard: &str) -> Result<()> {
    s.etcd()?.put(&format!("{}{shard}", leaving_dir(s)), shard, Some(LEAVING_TTL)).await?;
    Ok(())
}

fn leaving_dir(s: &Session<'_>) -> String {
    format!("{}/leaving/", s.prefix())
}

/// Asks every master taking part for `slotmigrate`, refusing on the first that has it off. A master that does not
/// answer (dead, its failover not yet done) holds the drain back for a later run, which asks whichever master its
/// group has then.
async fn check_slotmigrate(s: &Session<'_>, masters: &[String]) -> Result<()> {
    for server in masters {
        let unchecked = |e: Error| match e {
            Error::Pika(e) if e.is_unreachable() => Error::InProgress {
                progress: format!(
                    "drain waiting: {e}; {SLOTMIGRATE} is checked on the group's master before any slot moves"
                ),
            },
            e => Stopped::Unchecked { server: server.clone(), source: Box::new(e) }.into(),
        };
        let value =
            s.pika(server).await.map_err(unchecked)?.config_get(SLOTMIGRATE).await.map_err(|e| unchecked(e.into()))?;
        if slotmigrate_verdict(server, value.as_deref())? == SlotMigrate::Unknown {
            tracing::info!(server, "{SLOTMIGRATE} is not a setting of this server (not pika?): cannot tell, going on");
        }
    }
    Ok(())
}

/// How many slots the drain of `gid` moves in all: recorded in etcd by the run that starts it, so that later runs
/// report progress against the same total.
async fn drain_total(s: &Session<'_>, gid: u32, shard: &str, left: usize) -> Result<usize> {
    if let Some(total) = recorded_total(s, gid, shard).await? {
        return Ok(total.max(left));
    }
    s.etcd()?.put(&drain_key(s, gid), &record_value(shard, left), None).await?;
    Ok(left)
}

/// The total recorded for the drain of `gid`, when the record is `shard`'s.
async fn recorded_total(s: &Session<'_>, gid: u32, shard: &str) -> Result<Option<usize>> {
    Ok(s.etcd()?.get(&drain_key(s, gid)).await?.and_then(|entry| record_total(&entry.value, shard)))
}

/// Deletes the drained group's servers, replicas first and master last, then the group; returns how many servers
/// this run deleted. The group is read again before every step.
async fn remove_group(s: &Session<'_>, gid: u32) -> Result<usize> {
    let mut deleted = 0;
    loop {
        s.ctx.budget.check(|| format!("drain done; removing the servers of group {gid}"))?;
        let stats = s.stats().await?;
        let Some(group) = stats.group(gid) else { return Ok(deleted) };
        if group.is_promoting() {
            return Err(promotion(group).into());
        }
        if let Some(sl) =
            stats.slots.iter().find(|sl| sl.group_id == gid || (!sl.is_idle() && sl.action.target_id == Some(gid)))
        {
            return Err(Stopped::SlotCameBack { slot: sl.id, gid }.into());
        }
        if let Some(g) = group.servers.iter().find_map(|gs| crate::steps::split::aliased_by(&stats, &gs.server)) {
            return Err(Error::InProgress {
                progress: format!("drain done; group {} is still splitting off group {gid}'s master", g.id),
            });
        }
        match next_removal(group) {
            Removal::Replica(server) | Removal::Master(server) => {
                tracing::info!(gid, server = server.as_str(), "deleting server");
                match s.dashboard.group_del(gid, &server).await {
                    Ok(()) => deleted += 1,
                    // Deleted meanwhile, or the fork moved it: the next read shows the group as it is.
                    Err(e) if e.is_not_member() || e.is_not_found() => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Removal::Group => {
                tracing::info!(gid, "removing group");
                return match s.dashboard.group_remove(gid).await {
                    Ok(()) => Ok(deleted),
                    Err(e) if e.is_not_found() => Ok(deleted),
                    Err(e) => Err(e.into()),
                };
            }
        }
    }
}

/// Deletes the etcd records of a removed group: its drain record, its history, then its reservation (when it names
/// `shard`). In this order, because a leftover reservation is what leads a rerun to [`forget_stale`].
async fn forget(s: &Session<'_>, gid: u32, shard: &str, reserved: bool) -> Result<()> {
    let etcd = s.etcd()?;
    let key = drain_key(s, gid);
    if let Some(entry) = etcd.get(&key).await?.filter(|entry| record_total(&entry.value, shard).is_some()) {
        etcd.delete_if_value(&key, &entry.value).await?;
    }
    // Before the reservation, which is what leads a rerun back here.
    crate::steps::register::forget_group_history(s, gid).await?;
    if reserved {
        etcd.delete_if_value(&format!("{}/groups/{gid}", s.prefix()), shard).await?;
    }
    forget_leaving(s, shard).await
}

/// Deletes the record of `shard` leaving: its group is gone, so no plan can target it any more.
async fn forget_leaving(s: &Session<'_>, shard: &str) -> Result<()> {
    let key = format!("{}{shard}", leaving_dir(s));
    if s.etcd()?.get(&key).await?.is_some() {
        s.etcd()?.delete_if_value(&key, shard).await?;
    }
    Ok(())
}

/// Deletes the records `shard` left for groups Codis no longer has: reservations and drain records.
async fn forget_stale(s: &Session<'_>, shard: &str, stats: &Stats, reserved: &BTreeMap<u32, String>) -> Result<()> {
    let etcd = s.etcd()?;
    let dir = format!("{}/drains/", s.prefix());
    let mut gids: BTreeSet<u32> =
        reserved.iter().filter(|(_, owner)| owner.as_str() == shard).map(|(g, _)| *g).collect();
    for (key, entry) in etcd.list(&dir).await? {
        if let Some(gid) = key.strip_prefix(&dir).and_then(|g| g.parse().ok()) {
            if record_total(&entry.value, shard).is_some() {
                gids.insert(gid);
            }
        }
    }
    for gid in gids.into_iter().filter(|&g| stats.group(g).is_none()) {
        tracing::info!(shard, gid, "deleting the etcd records of a removed group");
        forget(s, gid, shard, reserved.get(&gid).is_some_and(|owner| owner == shard)).await?;
    }
    forget_leaving(s, shard).await
}

fn drain_key(s: &Session<'_>, gid: u32) -> String {
    format!("{}/drains/{gid}", s.prefix())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::clients::codis::{GroupServer, Promoting, Proxy, SlotAction, SlotMapping, StatsEntry};

    const CLUSTER: &str = "tbx";
    const NS: &str = "ns-x";

    fn server(shard: &str, n: u32) -> String {
        format!("{CLUSTER}-{shard}-{n}.{CLUSTER}-{shard}-headless.{NS}.svc.cluster.local:9221")
    }

    fn group(gid: u32, shard: &str, pods: u32) -> Group {
        Group {
            id: gid,
            servers: (0..pods).map(|n| GroupServer { server: server(shard, n), ..GroupServer::default() }).collect(),
            ..Group::default()
        }
    }

    /// Groups `(gid, shard, pods)`, slots dealt round-robin in blocks over `owners`.
    fn stats(groups: &[(u32, &str, u32)], owners: &[u32], per: usize) -> Stats {
        let mut stats = Stats::default();
        stats.group.models = groups.iter().map(|&(g, sh, p)| group(g, sh, p)).collect();
        stats.slots = owners
            .iter()
            .flat_map(|&g| std::iter::repeat_n(g, per))
            .enumerate()
            .map(|(id, g)| SlotMapping { id: id as u32, group_id: g, action: SlotAction::default() })
            .collect();
        stats
    }

    fn four() -> Stats {
        stats(&[(1, "pk-a", 2), (2, "pk-b", 2), (3, "pk-c", 2), (4, "pk-d", 1)], &[1, 2, 3, 4], 4)
    }

    fn full(short: &str) -> String {
        format!("{CLUSTER}-{short}")
    }

    fn act(stats: &mut Stats, slot: usize, target: u32, state: &str) {
        stats.slots[slot].action = SlotAction { index: Some(1), state: Some(state.into()), target_id: Some(target) };
    }

    fn assess4(stats: &Stats, targets: &[u32]) -> Result<Scope, Refusal> {
        assess(stats, CLUSTER, NS, &full("pk-d"), 4, targets, &BTreeMap::new())
    }

    #[test]
    fn the_leaving_group_is_found_by_its_servers_then_by_its_reservation() {
        let mut stats = four();
        assert_eq!(leaving_group(&stats, &full("pk-d"), &BTreeMap::new()), Some(4));
        stats.group.models[3].servers.clear();
        let reserved = BTreeMap::from([(4, full("pk-d")), (9, full("pk-d"))]);
        assert_eq!(leaving_group(&stats, &full("pk-d"), &reserved), Some(4), "the empty group, not the missing one");
        assert_eq!(leaving_group(&stats, &full("pk-d"), &BTreeMap::new()), None);
        // A reservation never names a group that has another shard's servers.
        assert_eq!(leaving_group(&stats, &full("pk-d"), &BTreeMap::from([(3, full("pk-d"))])), None);
    }

    #[test]
    fn targets_are_the_remaining_shards_groups_whether_or_not_the_removed_one_is_listed() {
        let stats = four();
        let listed: Vec<String> = ["pk-a", "pk-b", "pk-c", "pk-d", "pk-new"].map(full).to_vec();
        assert_eq!(target_groups(&stats, &remaining_after(&full("pk-d"), &[]), 4), Vec::<u32>::new());
        assert_eq!(target_groups(&stats, &listed, 4), [1, 2, 3], "the leaving group and unregistered shards drop out");
    }

    #[test]
    fn a_quiet_balanced_cluster_drains_the_leaving_groups_slots_after_checking_every_master() {
        let scope = assess4(&four(), &[1, 2, 3]).unwrap();
        assert_eq!(scope.targets, [1, 2, 3]);
        assert_eq!(scope.left, 4);
        assert!(
            scope.migrating && scope.cancel.is_empty() && scope.arriving.is_empty() && scope.also_leaving.is_empty()
        );
        assert_eq!(scope.masters, [server("pk-d", 0), server("pk-a", 0), server("pk-b", 0), server("pk-c", 0)]);
    }

    #[test]
    fn the_last_shard_is_refused() {
        let stats = stats(&[(4, "pk-d", 1)], &[4], 8);
        let err = assess4(&stats, &[]).unwrap_err();
        assert_eq!(err, Refusal::LastShard { shard: full("pk-d"), gid: 4 });
        assert!(err.to_string().contains("last shard"), "{err}");
        assert!(matches!(assess4(&stats, &[4]), Err(Refusal::LastShard { .. })), "the leaving group is no target");
    }

    #[test]
    fn disabled_slot_actions_promotions_and_dead_proxies_are_refused_while_slots_must_move() {
        let mut disabled = four();
        disabled.slot_action.disabled = true;
        assert_eq!(assess4(&disabled, &[1, 2, 3]), Err(Refusal::SlotActionsDisabled));

        let mut promoting = four();
        promoting.group.models[1].promoting = Promoting { index: Some(1), state: Some("preparing".into()) };
        let err = assess4(&promoting, &[1, 2, 3]).unwrap_err();
        assert_eq!(err, Refusal::Promoting { gid: 2, state: "preparing".into() });

        let mut dead = four();
        dead.proxy.models = vec![
            Proxy { token: "t-ok".into(), admin_addr: "p0:11080".into(), ..Proxy::default() },
            Proxy { token: "t-dead".into(), admin_addr: "p1:11080".into(), ..Proxy::default() },
        ];
        dead.proxy
            .stats
            .insert("t-ok".into(), StatsEntry { stats: Some(serde_json::Map::new()), ..StatsEntry::default() });
        dead.proxy.stats.insert(
            "t-dead".into(),
            StatsEntry {
                error: Some(json!({"Cause": "dial tcp p1:11080: connect: connection refused"})),
                ..StatsEntry::default()
            },
        );
        let err = assess4(&dead, &[1, 2, 3]).unwrap_err();
        assert!(matches!(&err, Refusal::ProxyUnreachable { addr, .. } if addr == "p1:11080"), "{err:?}");
        assert!(err.to_string().contains("connection refused"), "{err}");
        dead.proxy.stats.insert("t-dead".into(), StatsEntry { timeout: Some(true), ..StatsEntry::default() });
        assert!(assess4(&dead, &[1, 2, 3]).unwrap_err().to_string().contains("timed out"));

        // Once nothing has to move, only the servers are left to delete: none of that matters any more.
        let drained = |mut s: Stats| {
            for sl in &mut s.slots {
                if sl.group_id == 4 {
                    sl.group_id = 1 + sl.id % 3;
                }
            }
            s
        };
        for s in [disabled, promoting, dead] {
            let scope = assess4(&drained(s), &[1, 2, 3]).unwrap();
            assert!(!scope.migrating && scope.masters.is_empty());
        }
    }

    #[test]
    fn a_promotion_of_the_leaving_group_is_refused_even_when_drained() {
        let mut stats = stats(&[(1, "pk-a", 1), (4, "pk-d", 2)], &[1], 4);
        stats.group.models[1].promoting = Promoting { index: Some(1), state: None };
        assert_eq!(assess4(&stats, &[1]), Err(Refusal::Promoting { gid: 4, state: "started".into() }));
    }

    #[test]
    fn migrations_into_the_leaving_group_are_cancelled_when_pending_and_awaited_otherwise() {
        let mut stats = four();
        act(&mut stats, 0, 4, "pending");
        act(&mut stats, 5, 4, "migrating");
        act(&mut stats, 9, 1, "pending");
        let scope = assess4(&stats, &[1, 2, 3]).unwrap();
        assert_eq!((scope.cancel, scope.arriving, scope.left), (vec![0], vec![5], 5));
    }

    #[test]
    fn other_groups_of_the_cluster_holding_slots_are_drained_along_and_foreign_ones_refused() {
        let mut stats = stats(&[(1, "pk-a", 1), (2, "pk-b", 1), (3, "pk-c", 1), (4, "pk-d", 1)], &[1, 2, 3, 4], 4);
        let scope = assess4(&stats, &[1, 2]).unwrap();
        assert_eq!(scope.also_leaving, [3]);
        assert_eq!(scope.masters.len(), 4);

        stats.group.models[2].servers[0].server = "10.0.0.3:9221".into();
        assert_eq!(assess4(&stats, &[1, 2]), Err(Refusal::ForeignGroups { gids: vec![3], cluster: CLUSTER.into() }));
        // Another namespace's cluster of the same name is foreign too.
        stats.group.models[2].servers[0].server = server("pk-c", 0).replace(NS, "elsewhere");
        assert!(matches!(assess4(&stats, &[1, 2]), Err(Refusal::ForeignGroups { .. })));
        // A reservation makes an empty-looking group ours.
        let reserved = BTreeMap::from([(3, full("pk-c"))]);
        assert!(assess(&stats, CLUSTER, NS, &full("pk-d"), 4, &[1, 2], &reserved).is_ok());
    }

    #[test]
    fn slotmigrate_must_be_yes_and_an_absent_item_cannot_be_judged() {
        assert_eq!(slotmigrate_verdict("a:9221", Some("yes")), Ok(SlotMigrate::On));
        assert_eq!(slotmigrate_verdict("a:9221", Some("YES ")), Ok(SlotMigrate::On));
        assert_eq!(slotmigrate_verdict("a:9221", None), Ok(SlotMigrate::Unknown));
        let err = slotmigrate_verdict("a:9221", Some("no")).unwrap_err();
        assert_eq!(err, Refusal::SlotMigrateOff { server: "a:9221".into(), value: "no".into() });
        assert_eq!(
            err.to_string(),
            "slotmigrate is \"no\" on a:9221: pika refuses to migrate slots without it; set it (CONFIG SET slotmigrate \
             yes, SLOTSRELOAD, CONFIG REWRITE) first"
        );
        assert!(slotmigrate_verdict("a:9221", Some("")).is_err());
    }

    #[test]
    fn servers_go_replicas_first_from_the_end_then_the_master_then_the_group() {
        let mut g = group(4, "pk-d", 3);
        assert_eq!(next_removal(&g), Removal::Replica(server("pk-d", 2)));
        // The fork swapped a replica into index 0: the old master is now just the last replica.
        g.servers.swap(0, 2);
        assert_eq!(next_removal(&g), Removal::Replica(server("pk-d", 0)));
        g.servers.truncate(1);
        assert_eq!(next_removal(&g), Removal::Master(server("pk-d", 2)));
        g.servers.clear();
        assert_eq!(next_removal(&g), Removal::Group);
    }

    fn shard(short: &str) -> Shard {
        Shard { name: full(short), pods: Vec::new() }
    }

    #[test]
    fn a_1_0_pre_terminate_drains_only_when_scaling_in_and_not_every_shard_is_deleting() {
        let shards = [shard("pk-a"), shard("pk-b"), shard("pk-c")];
        let d = |names: &[&str]| names.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert!(matches!(
            legacy_decision(CLUSTER, &full("pk-c"), &shards, &d(&["pk-c"]), false),
            LegacyDecision::Nothing(_)
        ));
        assert!(matches!(
            legacy_decision(CLUSTER, &full("pk-c"), &shards, &d(&["pk-a", "pk-b", "pk-c"]), true),
            LegacyDecision::Nothing(why) if why.contains("cluster deletion")
        ));
        assert_eq!(
            legacy_decision(CLUSTER, &full("pk-c"), &shards, &d(&["pk-c"]), true),
            LegacyDecision::Drain { remaining: vec![full("pk-a"), full("pk-b")] }
        );
        // Two shards leaving at once: neither takes the other's slots.
        assert_eq!(
            legacy_decision(CLUSTER, &full("pk-c"), &shards, &d(&["pk-b", "pk-c"]), true),
            LegacyDecision::Drain { remaining: vec![full("pk-a")] }
        );
        // Without a deleting list the shard itself still leaves.
        assert_eq!(
            legacy_decision(CLUSTER, &full("pk-c"), &shards, &[], true),
            LegacyDecision::Drain { remaining: vec![full("pk-a"), full("pk-b")] }
        );
        // The only shard, scaling in: the drain refuses it as the last shard.
        assert_eq!(
            legacy_decision(CLUSTER, &full("pk-a"), &shards[..1], &[], true),
            LegacyDecision::Drain { remaining: vec![] }
        );
    }

    #[test]
    fn the_drain_record_belongs_to_its_shard() {
        assert_eq!(record_total(&record_value(&full("pk-d"), 256), &full("pk-d")), Some(256));
        assert_eq!(record_total(&record_value(&full("pk-d"), 256), &full("pk-e")), None);
        assert_eq!(record_total("junk", &full("pk-d")), None);
    }
}
