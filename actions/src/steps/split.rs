//! Registering a new shard by splitting a donor group: its pods copy the donor's data by replication, and its share
//! of that donor's slots changes hands without a key being migrated ([`plan::split`] says when). Shares of other
//! donors, if the step has any (3→4), migrate once the split is done, in the same run.
//!
//! Codis keeps the state, so every run resumes from what the new group `G` lists:
//!
//! 1. **Begin** (under the topology lock): `G` gets the donor's master under its alias
//!    ([`ServerAddr::alias_of`]) as its master, one pod of the shard as a replica of it (the new master; a replica
//!    rather than a master that still lists replicas, which pika would refuse for seconds), and then, by
//!    `slots/assign`, its share of the donor's slots. The proxies route those slots to the same pika as before, so no
//!    write is refused and no read is stale. A pod carrying a replication ID of its own (the 1.1 chart registers a
//!    new shard on its own first, so its pods replicate their pod 0) would be refused by the donor: it follows nothing
//!    and forgets its ID first (`CLEARREPLICATIONID`), then copies the donor in full. The shard's other pods are left
//!    out until the promote: they must copy the new master in full then anyway.
//! 2. **Serving through the alias** (`servers[0]` is the alias): the pods catch up with the donor's master, and the
//!    new master, copied in full, is re-linked to it once (pika stops its idle rsync client at the next `SLAVEOF`,
//!    refusing writes meanwhile: better now than inside the cutover), under the group's transfer lock only, so the
//!    splits of one change do this at once. Then, under the topology lock and that one, the fenced cutover
//!    ([`transfer::promote_split`]): the proxies hold `G`'s slots, the donor's position is read after that, the new
//!    master must reach it, and only then does Codis promote it.
//! 3. **Promoted** (the alias listed after index 0): under the lock, the pods left out are pointed at the new master
//!    and listed, and any other pod of the group is pointed at it, to copy it in full (one that followed the donor,
//!    which went on taking writes for its own slots, holds no position known to be a prefix of the new master's);
//!    they are waited for, holding no lock, until in sync, while each side deletes the keys of the slots it no longer
//!    owns (through the binlog, which a pod still copying gets too); then, under the lock, the
//!    alias is removed. No slot moves onto the new group while it still holds copies of keys it does not own (a
//!    later migration would bring back a key deleted meanwhile): while the alias is listed no move touching the group
//!    is planned, and the donor's copies are of the new group's slots only. A crash leaves the alias listed, and the
//!    rerun cleans up again; other actions do not wait for the scans.
//!
//! A group of the shard that lists an alias but serves no slot is a begin that did not finish: it is emptied and
//! decided afresh. While a group lists an alias, the product never commands the pika behind it through that group,
//! never plans slot moves touching the group, and neither switches over nor removes the donor's master.
//!
//! Two runs of one split may overlap (KubeBlocks retries a call that timed out while the first still runs). A run
//! commands the shard's pods in step 2 only under the group's transfer lock, which the cutover takes too, and only
//! while the alias is still the group's master, so one that looked before the other's cutover never points the
//! promoted new master back at the donor.
//!
//! After the promote the new master rebuilds pika's per-slot key sets (`SLOTSRELOAD`, in the background), which a
//! pika replica may not keep. Deletes go through `DEL`, so they reach every replica by the binlog (pika's
//! `SLOTSCLEANUP` writes none).

use std::collections::BTreeSet;
use std::time::Duration;

use crate::clients::codis::{Group, Stats};
use crate::clients::server::ServerAddr;
use crate::error::{Error, Result};
use crate::input::event::{Pod, Shard};
use crate::input::replication::SyncState;
use crate::plan::{self, Goal};
use crate::steps::cluster::{Session, POLL};
use crate::steps::rebalance::slot_states;
use crate::steps::{register, transfer};

/// Keys read per `SCAN` while deleting the keys of slots a group no longer owns.
const SCAN_BATCH: usize = 1000;
/// Longest a begin waits for a pod's replicas to leave it (pika lets go of them within its 3 s replication cron).
const LEAVE_WAIT: Duration = Duration::from_secs(5);

/// Why a split cannot go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Something asked to command the pika behind an alias through the group that lists it.
    #[error("{server} is an alias of another group's master and is never commanded through the group listing it")]
    AliasCommanded {
        /// The alias.
        server: String,
    },
    /// The group vanished while splitting.
    #[error("group {gid} vanished while splitting {shard} off its donor")]
    GroupVanished {
        /// The group.
        gid: u32,
        /// The shard.
        shard: String,
    },
}

/// How a shard came to be registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// The usual way: its slots migrate onto it.
    Registered(register::Registered),
    /// By a split that [`complete`] finishes.
    Splitting {
        /// The shard's group.
        gid: u32,
        /// Whether this run began it (the slots were just handed over).
        began: bool,
    },
}

/// The alias `group` lists and where: `(index, alias)`.
#[must_use]
pub fn alias_in(group: &Group) -> Option<(usize, &str)> {
    group
        .servers
        .iter()
        .enumerate()
        .find(|(_, gs)| ServerAddr::of(&gs.server).is_alias())
        .map(|(i, gs)| (i, gs.server.as_str()))
}

/// The group that lists `server` under its alias (a split off it is under way).
#[must_use]
pub fn aliased_by<'s>(stats: &'s Stats, server: &str) -> Option<&'s Group> {
    let alias = ServerAddr::alias_of(server);
    stats.group.models.iter().find(|g| g.servers.iter().any(|gs| gs.server.eq_ignore_ascii_case(&alias)))
}

/// The first group that lists an alias, among `gids`.
#[must_use]
pub fn splitting_among(stats: &Stats, gids: impl IntoIterator<Item = u32>) -> Option<u32> {
    gids.into_iter().find(|&gid| stats.group(gid).is_some_and(|g| alias_in(g).is_some()))
}

/// Registers `shard`, splitting it off a donor when the step toward `goal_of`'s goal fills its group from one.
/// Must be called with the topology lock held.
pub async fn register(s: &Session<'_>, shard: &Shard, goal_of: impl Fn(&Stats) -> Goal) -> Result<Start> {
    let stats = s.stats().await?;
    let gid = match crate::steps::cluster::group_of_shard(&stats, &shard.name) {
        Some(g) => g.id,
        None => register::ensure_group(s, &stats, &shard.name).await?.0,
    };
    let stats = s.stats().await?;
    let group = stats.group(gid).ok_or_else(|| Refusal::GroupVanished { gid, shard: shard.name.clone() })?;
    let serves = stats.slots.iter().any(|sl| sl.group_id == gid || sl.action.target_id == Some(gid));
    if alias_in(group).is_some() && serves {
        return Ok(Start::Splitting { gid, began: false });
    }
    let fresh = !serves
        && group.servers.iter().all(|gs| ServerAddr::of(&gs.server).is_alias() || is_pod_of(shard, &gs.server, s));
    if fresh {
        if let Some((donor_master, slots)) = decide(s, &stats, shard, gid, &goal_of).await? {
            begin(s, shard, gid, &donor_master, &slots).await?;
            return Ok(Start::Splitting { gid, began: true });
        }
        // A split begun and abandoned (a crash, then a changed goal): the pods may hold a copy of the donor's data,
        // which the group, owning no slot yet, must not keep once it serves slots of its own.
        if alias_in(group).is_some() || copies_elsewhere(s, shard).await {
            if alias_in(group).is_some() {
                empty(s, gid).await?;
            }
            let reg = register::register(s, shard, &shard.pods).await?;
            delete_unowned(s, &reg.master, gid).await?;
            return Ok(Start::Registered(reg));
        }
    }
    Ok(Start::Registered(register::register(s, shard, &shard.pods).await?))
}

/// Whether a pod of `shard` replicates a server that is not a pod of `shard` (a split's copy).
async fn copies_elsewhere(s: &Session<'_>, shard: &Shard) -> bool {
    let own: Vec<_> = shard.pods.iter().filter_map(|p| s.dial(&s.server(p)).ok()).collect();
    for pod in &shard.pods {
        if let Ok(info) = s.replication(&s.server(pod)).await {
            if info.role.is_slave() && !own.iter().any(|at| info.follows(at)) {
                return true;
            }
        }
    }
    false
}

fn is_pod_of(shard: &Shard, server: &str, s: &Session<'_>) -> bool {
    shard.pods.iter().any(|p| s.server(p).eq_ignore_ascii_case(server))
}

/// The donor's master and the slots, when a split fills `gid`: the step toward the goal (with `gid` among the
/// receivers) fills it from one donor, whose master is idle and aliased nowhere, and every pod of the shard is empty
/// or already copies that master.
async fn decide(
    s: &Session<'_>,
    stats: &Stats,
    shard: &Shard,
    gid: u32,
    goal_of: &impl Fn(&Stats) -> Goal,
) -> Result<Option<(String, Vec<u32>)>> {
    let mut goal = goal_of(stats);
    if !goal.receivers.contains(&gid) {
        goal.receivers.push(gid);
        goal.unregistered = goal.unregistered.saturating_sub(1);
    }
    let states = slot_states(stats);
    let Ok(step) = plan::toward(&states, &goal) else { return Ok(None) };
    let Some(split) = plan::split::split_of(&states, &step, gid) else { return Ok(None) };
    let Some(donor) = stats.group(split.donor) else { return Ok(None) };
    let Some(master) = donor.master().map(str::to_owned) else { return Ok(None) };
    if donor.is_promoting() || alias_in(donor).is_some() || ServerAddr::of(&master).is_alias() {
        return Ok(None);
    }
    if aliased_by(stats, &master).is_some_and(|g| g.id != gid) {
        return Ok(None);
    }
    let master_at = s.dial(&master)?;
    for pod in &shard.pods {
        let conn = s.pika(&s.server(pod)).await?;
        if conn.info_replication().await?.follows(&master_at) {
            continue;
        }
        // A first page may come back empty with more to scan: only cursor 0 and no key says empty.
        let (next, keys) = conn.scan(0, 16).await?;
        if !keys.is_empty() || next != 0 {
            tracing::info!(pod = %pod.name(), "pod holds keys: registering it as usual rather than copying the donor");
            return Ok(None);
        }
    }
    tracing::info!(gid, donor = split.donor, slots = split.slots.len(), %master, "splitting the new shard off its donor");
    Ok(Some((master, split.slots)))
}

/// Step 1: the alias as master, one pod of the shard as its replica (the split's new master, [`copier`]), then the
/// slots. The shard's other pods are left as they are until the cutover ([`join_left_out`]): pointed at the donor,
/// each would copy it in full for nothing (after the promote it must copy the new master in full anyway, as the donor
/// went on taking writes of its own), the donor would serve one full copy per pod, and each would then pay for
/// stopping its idle rsync client at its next `SLAVEOF`, under the lock.
async fn begin(s: &Session<'_>, shard: &Shard, gid: u32, master: &str, slots: &[u32]) -> Result<()> {
    let alias = ServerAddr::alias_of(master);
    let stats = s.stats().await?;
    // The alias must be the master: a group registered the usual way (the 1.1 chart's own-shard postProvision does)
    // serves nothing yet, so it is emptied and listed again behind the alias.
    if stats
        .group(gid)
        .is_some_and(|g| !g.servers.is_empty() && !g.master().is_some_and(|m| m.eq_ignore_ascii_case(&alias)))
    {
        empty(s, gid).await?;
    }
    if s.stats().await?.group(gid).is_none_or(|g| g.server(&alias).is_none()) {
        register::add_server(s, gid, &alias).await?;
    }
    let donor_id = s.replication(&alias).await?.replication_id;
    let server = s.server(copier(s, shard, &alias).await?);
    wait_replicas_gone(s, &server).await?;
    forget_own_history(s, &server, &alias, donor_id.as_deref()).await?;
    match s.ensure_follows(&server, &alias).await {
        Err(Error::Pika(e)) if e.is_transient_slaveof_refusal() => {
            return Err(Error::InProgress {
                progress: format!("{server} cannot follow {alias} yet ({e}); the next run goes on with the split"),
            });
        }
        // An empty pod (a split begins on no other) copies the donor in full.
        Ok(true) => transfer::mark_copied(s, &server).await,
        other => {
            other?;
        }
    };
    if s.stats().await?.group(gid).is_none_or(|g| g.server(&server).is_none()) {
        register::add_server(s, gid, &server).await?;
    }
    let mapping: Vec<(u32, u32)> = slots.iter().map(|&sid| (sid, gid)).collect();
    s.dashboard.slots_assign(&mapping).await?;
    Ok(())
}

/// The pod of `shard` that copies the donor behind `alias` and becomes the split's new master: one that already
/// follows it (a begin that stopped midway), else a replica with none of its own (pika lets it follow another master
/// at once; a master that still lists replicas, as the 1.1 chart's own-shard registration leaves pod 0, is refused
/// until pika drops them at its 3 s replication cron), else the lowest ordinal.
async fn copier<'p>(s: &Session<'_>, shard: &'p Shard, alias: &str) -> Result<&'p Pod> {
    let alias_at = s.dial(alias)?;
    let mut ranked = Vec::new();
    for pod in &shard.pods {
        let info = s.replication(&s.server(pod)).await.ok();
        let follows = info.as_ref().is_some_and(|i| i.follows(&alias_at));
        let free_replica = info.as_ref().is_some_and(|i| i.role.is_slave() && i.connected_slaves == 0);
        ranked.push(((!follows, !free_replica, pod.ordinal()), pod));
    }
    ranked
        .into_iter()
        .min_by_key(|(rank, _)| *rank)
        .map(|(_, pod)| pod)
        .ok_or_else(|| Error::InProgress { progress: format!("{} lists no pod to copy its donor", shard.name) })
}

/// Readies `server` to copy the donor's master behind `alias`, whose replication ID is `donor_id`: a pika that
/// carries another, non-empty ID (the 1.1 chart registers a new shard on its own first, so its pods replicate their
/// pod 0 under an ID of their own) is refused by the donor, its link down for good, even once it follows the donor.
/// It is made to follow nothing and to forget its ID; then it adopts the donor's and copies it in full. A pod that
/// holds no key loses nothing (the split only begins on empty pods). A master still listing replicas is left alone:
/// pika refuses to re-point it, and [`begin`] waits for its replicas to leave first.
async fn forget_own_history(s: &Session<'_>, server: &str, alias: &str, donor_id: Option<&str>) -> Result<()> {
    let conn = s.pika(server).await?;
    let info = conn.info_replication().await?;
    if info.kind != crate::clients::pika::ServerKind::Pika {
        return Ok(());
    }
    if info.follows(&s.dial(alias)?) && info.link_up {
        return Ok(());
    }
    let Some(own) = info.replication_id.as_deref() else { return Ok(()) };
    if Some(own) == donor_id || (!info.role.is_slave() && info.connected_slaves > 0) {
        return Ok(());
    }
    tracing::info!(server, "forgetting the pod's own replication ID so that it can copy the donor");
    conn.slaveof_no_one().await?;
    conn.clear_replication_id().await?;
    conn.config_rewrite().await?;
    Ok(())
}

/// Waits (at most [`LEAVE_WAIT`]) until `server`, a master, lists no replica: pika drops a replica that left only at
/// that replica's 3 s replication cron, and refuses `SLAVEOF` until then.
async fn wait_replicas_gone(s: &Session<'_>, server: &str) -> Result<()> {
    let deadline = tokio::time::Instant::now() + s.ctx.budget.cap(LEAVE_WAIT);
    loop {
        let info = s.replication(server).await?;
        if info.role.is_slave() || info.connected_slaves == 0 || tokio::time::Instant::now() >= deadline {
            return Ok(());
        }
        tokio::time::sleep(s.ctx.budget.cap(POLL)).await;
    }
}

/// Deletes every server of `gid`, replicas first; the group serves no slot.
async fn empty(s: &Session<'_>, gid: u32) -> Result<()> {
    loop {
        let stats = s.stats().await?;
        let Some(group) = stats.group(gid) else { return Ok(()) };
        let Some(last) = group.servers.last() else { return Ok(()) };
        tracing::info!(gid, server = %last.server, "emptying a split that did not begin");
        match s.dashboard.group_del(gid, &last.server).await {
            Ok(()) => {}
            Err(e) if e.is_not_member() || e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// What finishing a split did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Finished {
    /// The donor group.
    pub donor: Option<u32>,
    /// Slots the group owns.
    pub slots: usize,
    /// Keys deleted on the new master and on the donor's master.
    pub deleted: (u64, u64),
}

/// Steps 2 and 3 for `gid`, from whatever state Codis shows; the budget running out is exit 75 and the rerun goes on.
pub async fn complete(s: &Session<'_>, shard: &Shard, gid: u32) -> Result<Finished> {
    let mut finished = Finished::default();
    loop {
        s.ctx.budget.check(|| format!("splitting {} (group {gid}) off its donor", shard.name))?;
        let stats = s.stats().await?;
        let group = stats.group(gid).ok_or_else(|| Refusal::GroupVanished { gid, shard: shard.name.clone() })?;
        match alias_in(group) {
            None => {
                finished.slots = stats.slots_of(gid).len();
                return Ok(finished);
            }
            Some((0, alias)) => {
                let alias = alias.to_owned();
                let to = new_master(s, shard, group)?;
                // Each of these gives up (false) once another run's cutover has begun: the loop reads Codis again.
                if !catch_up(s, shard, gid, &alias, &to).await? {
                    continue;
                }
                match relink_copied(s, gid, &alias, &to).await? {
                    Some(true) if !catch_up(s, shard, gid, &alias, &to).await? => continue,
                    None => continue,
                    Some(_) => {}
                }
                let cut = cutover(s, gid, &alias, &to).await;
                match cut {
                    Err(Error::Transfer(transfer::Refusal::NotCaughtUp { .. })) => {
                        tracing::info!(gid, to = %to, "the new master did not reach the donor while writes were held");
                    }
                    other => other?,
                }
            }
            Some((_, alias)) => {
                let alias = alias.to_owned();
                let donor_server = ServerAddr::unaliased(&alias).into_owned();
                finished.donor = stats.group_of_server(&donor_server).map(|g| g.id);
                // The deletes go through the binlog, so a pod still copying the new master in full gets them too.
                let pointed = repoint(s, shard, gid).await?;
                let (synced, deleted) =
                    tokio::join!(wait_pointed(s, shard, gid, pointed), clean_up(s, gid, &donor_server));
                synced?;
                finished.deleted = deleted?;
                reload_slots(s, gid).await?;
                s.under_topology_lock(async |_| remove_alias(s, shard, gid, &alias).await).await?;
            }
        }
    }
}

/// The fenced cutover of `gid` from `alias` to `to` ([`transfer::promote_split`]), or a promote left in progress
/// resumed, under the topology lock and the group's transfer lock (the split's commands to the shard's pods take only
/// the latter).
async fn cutover(s: &Session<'_>, gid: u32, alias: &str, to: &str) -> Result<()> {
    s.under_topology_lock(async |_| {
        transfer::under_group_lock(s, gid, async || {
            let stats = s.stats().await?;
            let Some(group) = stats.group(gid) else { return Ok(()) };
            if group.is_promoting() {
                // A promote left in progress by a run that stopped: resumed with its own address.
                return transfer::promote(s, gid, &transfer::promoting_target(group)?).await;
            }
            if group.master().is_some_and(|m| m.eq_ignore_ascii_case(alias)) {
                tracing::info!(gid, to = %to, "promoting the split's new master, the group's writes held");
                transfer::promote_split(s, gid, alias, to).await?;
            }
            Ok(())
        })
        .await
    })
    .await
}

/// The pod the split promotes: a member of the group, the lowest ordinal.
fn new_master(s: &Session<'_>, shard: &Shard, group: &Group) -> Result<String> {
    let mut pods: Vec<&Pod> = shard.pods.iter().filter(|p| group.server(&s.server(p)).is_some()).collect();
    pods.sort_by_key(|p| p.ordinal());
    pods.first().map(|p| s.server(p)).ok_or_else(|| Error::InProgress {
        progress: format!("group {}: no pod of {} is listed yet", group.id, shard.name),
    })
}

/// Whether `gid` still serves through `alias` as its master: no cutover has begun since (a promote under way or done
/// moves the alias off index 0).
fn serves_through(stats: &Stats, gid: u32, alias: &str) -> bool {
    stats.group(gid).is_some_and(|g| !g.is_promoting() && g.master().is_some_and(|m| m.eq_ignore_ascii_case(alias)))
}

/// Runs `work` (commands to the shard's pods) under `gid`'s transfer lock, which every cutover takes, and only while
/// `gid` still serves through `alias`; `None` when it no longer does. Two runs of one split can overlap: one that
/// looked at Codis before the other's cutover would otherwise point the promoted new master back at the donor, which
/// has deleted the split's slots by then. Not the topology lock: the splits of one change re-link and copy their new
/// masters at once (each re-link holds its lock 0.5 to 1.5 s while pika stops the rsync client).
async fn while_serving_through<T>(
    s: &Session<'_>,
    gid: u32,
    alias: &str,
    work: impl AsyncFnOnce() -> Result<T>,
) -> Result<Option<T>> {
    transfer::under_group_lock(s, gid, async || {
        if !serves_through(&s.stats().await?, gid, alias) {
            tracing::info!(gid, alias, "another run began the split's cutover: reading Codis again");
            return Ok(None);
        }
        work().await.map(Some)
    })
    .await
}

/// Waits until every listed pod follows the alias with its link up and `to` has everything the donor's master had
/// when the wait began; `false` when another run's cutover began meanwhile.
async fn catch_up(s: &Session<'_>, shard: &Shard, gid: u32, alias: &str, to: &str) -> Result<bool> {
    crate::failpoint::pause("split catch-up").await;
    let alias_at = s.dial(alias)?;
    let stats = s.stats().await?;
    for pod in &shard.pods {
        let server = s.server(pod);
        if stats.group_of_server(&server).is_none() {
            continue;
        }
        // Only a pod that does not follow the alias yet is commanded, under the lock; most already do.
        let follows = s.replication(&server).await.is_ok_and(|info| info.follows(&alias_at));
        if !follows
            && while_serving_through(s, gid, alias, async || s.ensure_follows(&server, alias).await).await?.is_none()
        {
            return Ok(false);
        }
        if !wait_copied(s, gid, &server, alias).await? {
            return Ok(false);
        }
    }
    let target = s.replication(alias).await?.offset;
    loop {
        let at = s.replication(to).await?.offset;
        match (target, at) {
            (Some(m), Some(t)) if t < m => {}
            _ => return Ok(true),
        }
        s.ctx.budget.check(|| format!("{to} is catching up with {alias}"))?;
        tokio::time::sleep(s.ctx.budget.cap(POLL)).await;
    }
}

/// Waits until `server` follows the donor's master behind `alias` with its link up; `false` when another run's
/// cutover began meanwhile. A pod that cannot get there by itself copies the donor again in full: one carrying a
/// replication ID that is not the donor's (the donor refuses it for good; a pod pointed at the donor before
/// forgetting its own stays so) or in pika's error state (which pika never leaves by itself). It is a copy of the
/// donor and serves nothing of its own, so nothing is lost. Its re-link mark is left as it is: a pod the re-link sent
/// into the error state is not re-linked again, and the cutover then pays for stopping its rsync client.
async fn wait_copied(s: &Session<'_>, gid: u32, server: &str, alias: &str) -> Result<bool> {
    let at = s.dial(alias)?;
    // The donor's ID, read once per wait (when the pod is first seen with its link down), not at every poll.
    let mut donor_id = None;
    let mut connecting_since = None;
    loop {
        match s.replication(server).await {
            Ok(info) if info.follows(&at) && info.link_up => return Ok(true),
            Ok(info) if info.follows(&at) && info.kind == crate::clients::pika::ServerKind::Pika => {
                if donor_id.is_none() {
                    donor_id = Some(s.replication(alias).await?.replication_id);
                }
                let donor_id = donor_id.clone().flatten();
                let refused = info.replication_id.is_some() && info.replication_id != donor_id;
                if info.sync != Some(SyncState::Connecting) || refused {
                    connecting_since = None;
                }
                if info.sync == Some(SyncState::Connecting) && !refused {
                    let since = *connecting_since.get_or_insert_with(tokio::time::Instant::now);
                    // The donor refused the link while it still listed an old one ("Slave AlreadyExist"), or dropped
                    // the new one at its cron with the old: pika tries again only about 10 s later (seen: 11 to 15 s
                    // to the link up). Once the donor lists no link of the pod, the pair is sent again, back to back.
                    if since.elapsed() >= transfer::LINK_STALL && !transfer::lists_replica(s, alias, server).await {
                        // A pod copied in full and not re-linked since was never refused a link: pika dropped the
                        // first one. Seen: the donor refused its acks after a session mismatch ("UpdateAckedInfo
                        // failed") and closed the link, and the pod, sent the pair, resumed past 35 writes it had
                        // never applied, which the promote then lost. Only a new copy can be trusted.
                        let marks = transfer::relink_marks(s.etcd()?, &s.prefix()).await?;
                        let fresh = marks.get(&server.to_ascii_lowercase()) == Some(&transfer::RelinkMark::Copied);
                        let again = async || {
                            if !fresh {
                                return transfer::relink_again(s, server, alias).await;
                            }
                            tracing::warn!(
                                server,
                                alias,
                                "the pod's first link after its full copy dropped: copying it again in full"
                            );
                            let conn = s.pika(server).await?;
                            transfer::copy_in_full(&conn, &at, &info, false).await?;
                            Ok(true)
                        };
                        if while_serving_through(s, gid, alias, again).await?.is_none() {
                            return Ok(false);
                        }
                        connecting_since = None;
                    }
                } else if refused || info.sync == Some(SyncState::Error) {
                    let why = if refused { "its replication ID is not the donor's" } else { "pika's error state" };
                    let copy = async || {
                        tracing::warn!(
                            server,
                            alias,
                            why,
                            "the pod cannot sync from the donor: copying it again in full"
                        );
                        let conn = s.pika(server).await?;
                        Ok(transfer::copy_in_full(&conn, &at, &info, refused).await?)
                    };
                    if while_serving_through(s, gid, alias, copy).await?.is_none() {
                        return Ok(false);
                    }
                }
            }
            // Not following the alias: being copied again by another run, or re-pointed after its cutover.
            Ok(_) if !serves_through(&s.stats().await?, gid, alias) => return Ok(false),
            Ok(_) => {}
            Err(e) => tracing::debug!(server, error = %e, "pod not answering yet"),
        }
        s.ctx.budget.check(|| format!("waiting for {server} to sync from {alias}"))?;
        tokio::time::sleep(s.ctx.budget.cap(POLL)).await;
    }
}

/// Re-links `to` to the donor's master behind `alias` when it was copied in full and not re-linked since
/// ([`transfer::relink_key`]); returns whether it did, `None` when another run's cutover began meanwhile. pika leaves
/// a replica copied in full with its rsync client idle but not stopped, and the next `SLAVEOF` it gets stops it,
/// refusing writes meanwhile (0.5 to 1.5 s): unpaid, that is the cutover's promote, with the split's slots held.
/// `to` takes no write but the donor's, so after `SLAVEOF NO ONE` and `SLAVEOF` the same master (once the donor
/// dropped the old link) it resumes incrementally; a run stopped in between leaves it a master that the next run
/// points at the donor again. Under the group's transfer lock only: the change's other splits re-link meanwhile.
async fn relink_copied(s: &Session<'_>, gid: u32, alias: &str, to: &str) -> Result<Option<bool>> {
    let etcd = s.etcd()?;
    let marks = transfer::relink_marks(etcd, &s.prefix()).await?;
    if marks.get(&to.to_ascii_lowercase()) != Some(&transfer::RelinkMark::Copied) {
        return Ok(Some(false));
    }
    let relinked = async || transfer::relink_following(s, to, alias).await;
    match while_serving_through(s, gid, alias, relinked).await? {
        None => return Ok(None),
        Some(transfer::Relink::Relinked) => {}
        Some(_) => return Ok(Some(false)),
    }
    tracing::info!(to, alias, "re-linked the split's new master to the donor, stopping pika's idle rsync client");
    let key = transfer::relink_key(&s.prefix(), to);
    etcd.put(&key, transfer::RelinkMark::Relinked.word(), None).await?;
    Ok(Some(true))
}

/// The split's group, when it is there and not promoting.
fn settled<'s>(stats: &'s Stats, shard: &Shard, gid: u32) -> Result<&'s Group> {
    let group = stats.group(gid).ok_or_else(|| Refusal::GroupVanished { gid, shard: shard.name.clone() })?;
    if group.is_promoting() {
        return Err(Error::InProgress { progress: format!("group {gid} is promoting; run again to resume it") });
    }
    Ok(group)
}

/// Step 3a: the shard's other pods follow the new master and are in sync with it. Those the begin left out are
/// pointed at it and listed ([`join_left_out`]); a listed one that followed the donor's master, which kept taking
/// writes for its own slots after the promote, and is past the new master's position at the promote (the
/// [`crate::plan::resync::Handover`] the cutover recorded) copies it in full, as pika's incremental sync would
/// otherwise leave it diverged or in its error state. They are pointed under the lock here, and waited for without it
/// ([`wait_pointed`]): a full copy takes seconds, and the other splits' cutovers need the lock meanwhile.
async fn repoint(s: &Session<'_>, shard: &Shard, gid: u32) -> Result<transfer::Converged> {
    loop {
        let (pointed, waiting) = s
            .under_topology_lock(async |_| {
                let stats = s.stats().await?;
                let master = settled(&stats, shard, gid)?.master().unwrap_or_default().to_owned();
                let waiting = join_left_out(s, shard, gid, &master).await?;
                Ok((transfer::point_members(s, gid).await?, waiting))
            })
            .await?;
        if waiting.is_empty() {
            return Ok(pointed);
        }
        s.ctx.budget.check(|| format!("group {gid}: waiting for {} to follow its new master", waiting.join(", ")))?;
        tokio::time::sleep(s.ctx.budget.cap(POLL)).await;
    }
}

/// Step 3a's wait, holding no lock: until every pod `pointed` left copying is in sync with the new master, pointing
/// them again (under the lock) whenever one needs a command.
async fn wait_pointed(s: &Session<'_>, shard: &Shard, gid: u32, mut pointed: transfer::Converged) -> Result<()> {
    while !pointed.syncing.is_empty() && !transfer::wait_in_sync(s, gid, &pointed.master).await? {
        pointed = repoint(s, shard, gid).await?;
    }
    tracing::info!(gid, converged = %pointed.describe(), "the split's group follows its new master");
    transfer::clear_fence(s, gid, &pointed.master).await;
    Ok(())
}

/// Points every pod of `shard` that no group lists (the begin left it out) at `master`, the split group's new master,
/// and lists it; returns those that cannot follow it yet (a master still listing replicas: replicas go first, and
/// pika drops them at its 3 s replication cron). Each copies `master` in full, forgetting its own replication ID
/// when it carries another (the 1.1 chart's own-shard registration gave it one; `master` carries the donor's, and
/// would refuse it for good). A pod that does not answer is waited for: listed as it is, it could start carrying its
/// own ID, which no later step clears. The caller holds the topology lock.
async fn join_left_out(s: &Session<'_>, shard: &Shard, gid: u32, master: &str) -> Result<Vec<String>> {
    let stats = s.stats().await?;
    let master_at = s.dial(master)?;
    let mut left_out = Vec::new();
    for pod in &shard.pods {
        let server = s.server(pod);
        if stats.group_of_server(&server).is_none() {
            let info = s.replication(&server).await.ok();
            left_out.push((info.as_ref().is_none_or(|i| !i.role.is_slave()), pod.ordinal(), server, info));
        }
    }
    if left_out.is_empty() {
        return Ok(Vec::new());
    }
    let master_id = s.replication(master).await?.replication_id;
    left_out.sort_by_key(|(master, ordinal, _, _)| (*master, *ordinal));
    let mut waiting = Vec::new();
    for (_, _, server, info) in left_out {
        let Some(info) = info else {
            waiting.push(format!("{server} (not answering)"));
            continue;
        };
        if !info.follows(&master_at) {
            let forget = info.replication_id.is_some() && info.replication_id != master_id;
            tracing::info!(
                server,
                master,
                forget,
                "pointing a pod the split left out at its new master, to copy it in full"
            );
            let copied = match s.pika(&server).await {
                Ok(conn) => transfer::copy_in_full(&conn, &master_at, &info, forget).await.map_err(Error::from),
                Err(e) => Err(e),
            };
            match copied {
                Ok(()) => transfer::mark_copied(s, &server).await,
                Err(Error::Pika(e)) if e.is_transient_slaveof_refusal() => {
                    waiting.push(format!("{server} ({e})"));
                    continue;
                }
                Err(e) => return Err(e),
            }
        }
        register::add_server(s, gid, &server).await?;
    }
    Ok(waiting)
}

/// Step 3b: both masters lose the keys of slots their group no longer owns, side by side; returns how many on the
/// new master and on the donor's. No lock is held through the scans, which take minutes on a large pika: while the
/// alias is listed no slot move touching the new group is planned, and each page re-reads what the group owns or
/// receives.
async fn clean_up(s: &Session<'_>, gid: u32, donor_server: &str) -> Result<(u64, u64)> {
    let stats = s.stats().await?;
    let master = stats.group(gid).and_then(Group::master).unwrap_or_default().to_owned();
    let donor = stats.group_of_server(donor_server).map(|g| (g.id, g.master().unwrap_or_default().to_owned()));
    let on_donor = async {
        match &donor {
            Some((dgid, dmaster)) if !dmaster.is_empty() => delete_unowned(s, dmaster, *dgid).await,
            _ => Ok(0),
        }
    };
    let (on_new, on_donor) = tokio::join!(delete_unowned(s, &master, gid), on_donor);
    Ok((on_new?, on_donor?))
}

/// Step 3c: the new master rebuilds pika's per-slot key sets, which a pika replica may not keep and which its slots
/// need before they can migrate. Only once its pods have copied it: pika skips `SLOTSRELOAD` during a bgsave, which a
/// full copy starts.
async fn reload_slots(s: &Session<'_>, gid: u32) -> Result<()> {
    let stats = s.stats().await?;
    let master = stats.group(gid).and_then(Group::master).unwrap_or_default().to_owned();
    if !s.pika(&master).await?.slots_reload().await? {
        tracing::debug!(server = %master, "no SLOTSRELOAD here (not pika): nothing to rebuild");
    }
    Ok(())
}

/// Step 3d, under the lock: the alias goes, which ends the split (a crash before leaves it listed, and the rerun
/// cleans up again).
async fn remove_alias(s: &Session<'_>, shard: &Shard, gid: u32, alias: &str) -> Result<()> {
    let stats = s.stats().await?;
    settled(&stats, shard, gid)?;
    tracing::info!(gid, alias, "removing the donor's alias");
    match s.dashboard.group_del(gid, alias).await {
        Ok(()) => Ok(()),
        Err(e) if e.is_not_member() || e.is_not_found() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Deletes on `server`, the master of `gid`, every key of a slot `gid` neither owns nor receives. No slot may start
/// moving onto `gid` meanwhile: the caller holds the topology lock, or a split's alias is listed (no such move is
/// planned then).
async fn delete_unowned(s: &Session<'_>, server: &str, gid: u32) -> Result<u64> {
    let conn = s.pika(server).await?;
    let mut deleted = 0;
    let mut cursor = 0;
    loop {
        let stats = s.stats().await?;
        let keep: BTreeSet<usize> = stats
            .slots
            .iter()
            .filter(|sl| sl.group_id == gid || sl.action.target_id == Some(gid))
            .map(|sl| sl.id as usize)
            .collect();
        let slots = stats.max_slot_num();
        let (next, keys) = conn.scan(cursor, SCAN_BATCH).await?;
        let strays: Vec<Vec<u8>> =
            keys.into_iter().filter(|k| !keep.contains(&plan::keyslot::slot_of(k, slots))).collect();
        deleted += conn.del(&strays).await?;
        if next == 0 {
            tracing::info!(server, gid, deleted, "deleted the keys of slots the group does not own");
            return Ok(deleted);
        }
        cursor = next;
        s.ctx
            .budget
            .check(|| format!("deleting on {server} the keys of slots group {gid} does not own: {deleted} so far"))?;
    }
}
