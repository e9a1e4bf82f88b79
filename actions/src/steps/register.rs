//! Registering a shard as a Codis group: group, servers, one master, every replica replicating it.
//!
//! Every step reads Codis first and does only what is missing, so a run that crashed or ran out of budget at any
//! point is finished by the next one. Replication is wired by this binary (SLAVEOF + CONFIG REWRITE on the pika),
//! never by the dashboard's sync action: the Pika fork's dashboard sends a SLAVEOF form that pika rejects, and
//! upstream Codis does not persist the role in a way pika keeps. The dashboard is then checked to agree.

use std::time::Duration;

use crate::clients::codis::Stats;
use crate::clients::pika::ServerKind;
use crate::error::{Error, Result};
use crate::input::event::{Pod, Shard};
use crate::steps::cluster::{self, Session, POLL};
use crate::steps::transfer;

/// Codis group ids are 1..=9999.
pub const MAX_GROUP_ID: u32 = 9999;

/// How long the Pika fork's health loop may take to report a new replica as `slave` before we stop waiting for it.
const FORK_AGREEMENT_WAIT: Duration = Duration::from_secs(15);

/// Why a shard could not be registered as it stands; nothing more was changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The group disappeared from Codis between two reads of this run.
    #[error("group {gid} of {shard} vanished")]
    GroupVanished {
        /// The group.
        gid: u32,
        /// The shard it serves.
        shard: String,
    },
    /// The group disappeared from Codis while its replicas were being confirmed.
    #[error("group {gid} vanished")]
    GroupGone {
        /// The group.
        gid: u32,
    },
    /// The shard lists no pod, so no server can be its group's master.
    #[error("shard {shard} has no pods to register")]
    NoPods {
        /// The shard.
        shard: String,
    },
    /// The server is already a member of another group, which it must leave first.
    #[error("{server} is registered in group {registered} but belongs to group {gid}; remove it there first")]
    InOtherGroup {
        /// The server.
        server: String,
        /// The group Codis lists it in.
        registered: u32,
        /// Its shard's group.
        gid: u32,
    },
    /// Every Codis group id is taken.
    #[error("no free Codis group id for {shard}: all of 1..={MAX_GROUP_ID} are taken")]
    NoFreeGroupId {
        /// The shard to register.
        shard: String,
    },
    /// Someone else changed the group's master while this run registered its replicas.
    #[error("codis changed group {gid}'s master to {} while registering; run again", .now.as_deref().unwrap_or("nothing"))]
    MasterChanged {
        /// The group.
        gid: u32,
        /// Its master now, if any.
        now: Option<String>,
    },
}

/// What registering one shard found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    /// The shard's group.
    pub gid: u32,
    /// The group's master as Codis sees it.
    pub master: String,
    /// Whether anything was changed.
    pub changed: bool,
}

/// Ensures `shard` is a group whose servers include `pods`, each replica replicating the master with its link up
/// and Codis agreeing; returns its group id. [`register`] then [`settle`], for callers that hold the topology lock
/// throughout.
pub async fn ensure_shard(s: &Session<'_>, shard: &Shard, pods: &[Pod]) -> Result<Registered> {
    let reg = register(s, shard, pods).await?;
    settle(s, &reg, pods).await?;
    Ok(reg)
}

/// The changes of [`ensure_shard`]: the group, its master and every replica pointed at it and listed. Must be called
/// with the topology lock held; waits for nothing, so the lock is held briefly.
///
/// The master is whatever Codis already has at index 0; a group without servers gets the pod with the lowest
/// ordinal (ordinal 0 on a fresh cluster).
pub async fn register(s: &Session<'_>, shard: &Shard, pods: &[Pod]) -> Result<Registered> {
    let mut changed = false;
    let stats = s.stats().await?;
    let gid = match cluster::group_of_shard(&stats, &shard.name) {
        Some(group) => group.id,
        None => {
            let (gid, created) = ensure_group(s, &stats, &shard.name).await?;
            changed |= created;
            gid
        }
    };

    // The master: Codis's, or for an empty group the lowest ordinal, which must then really be a master.
    let stats = s.stats().await?;
    let group = stats.group(gid).ok_or_else(|| Refusal::GroupVanished { gid, shard: shard.name.clone() })?;
    let master = match group.master() {
        Some(m) => m.to_owned(),
        None => {
            let first =
                pods.iter().min_by_key(|p| p.ordinal()).ok_or_else(|| Refusal::NoPods { shard: shard.name.clone() })?;
            s.server(first)
        }
    };
    changed |= s.ensure_master(&master).await?;
    if group.server(&master).is_none() {
        add_server(s, gid, &master).await?;
        changed = true;
    }

    let mut replicas: Vec<&Pod> = pods.iter().filter(|p| !s.server(p).eq_ignore_ascii_case(&master)).collect();
    replicas.sort_by_key(|p| p.ordinal());
    for pod in &replicas {
        let server = s.server(pod);
        let stats = s.stats().await?;
        // Another group's server is never touched (add_server would refuse it too, but after the SLAVEOF).
        if let Some(other) = stats.group_of_server(&server).filter(|g| g.id != gid) {
            return Err(Refusal::InOtherGroup { server: server.clone(), registered: other.id, gid }.into());
        }
        // A replica first, then listed: Codis never lists a member of the group that is a master of its own (a fresh
        // pod is one until told otherwise), which readers of replicas and the Pika fork's health loop would see.
        // A pika that never replicated (no replication ID) copies its master in full: marked for its re-link.
        if let Ok(info) = s.replication(&server).await {
            let fresh = info.kind == ServerKind::Pika && info.replication_id.is_none();
            if fresh && !info.follows(&s.dial(&master)?) {
                transfer::mark_copied(s, &server).await;
            }
        }
        changed |= s.ensure_follows(&server, &master).await?;
        if stats.group(gid).is_none_or(|g| g.server(&server).is_none()) {
            add_server(s, gid, &server).await?;
            changed = true;
        }
    }
    Ok(Registered { gid, master, changed })
}

/// The waits of [`ensure_shard`]: every replica among `pods` follows the master with its link up, and Codis agrees.
/// Reads only, so it needs no lock.
pub async fn settle(s: &Session<'_>, reg: &Registered, pods: &[Pod]) -> Result<()> {
    let replicas: Vec<&Pod> = pods.iter().filter(|p| !s.server(p).eq_ignore_ascii_case(&reg.master)).collect();
    for pod in &replicas {
        s.wait_link_up(&s.server(pod), &reg.master).await?;
    }
    confirm(s, reg.gid, &reg.master, &replicas).await
}

/// Finds the group reserved for `shard` in etcd, or reserves and creates a new one.
pub(crate) async fn ensure_group(s: &Session<'_>, stats: &Stats, shard: &str) -> Result<(u32, bool)> {
    let etcd = s.etcd()?;
    let prefix = s.prefix();
    let reserved = cluster::reservations(etcd, &prefix).await?;
    let by_group = cluster::shards_by_group(stats);
    // A reservation counts only while its group is empty or missing: a group with servers speaks for itself.
    if let Some((&gid, _)) = reserved.iter().find(|(gid, owner)| owner.as_str() == shard && !by_group.contains_key(gid))
    {
        forget_group_history(s, gid).await?;
        if stats.group(gid).is_none() {
            create_group(s, gid).await?;
        }
        return Ok((gid, true));
    }
    for gid in 1..=MAX_GROUP_ID {
        if stats.group(gid).is_some() || reserved.contains_key(&gid) {
            continue;
        }
        // The reservation comes first: after a crash it is what ties the new, still empty group to this shard.
        let key = format!("{prefix}/groups/{gid}");
        if !etcd.put_if_absent(&key, shard, None).await? {
            continue;
        }
        forget_group_history(s, gid).await?;
        tracing::info!(shard, gid, "creating group");
        create_group(s, gid).await?;
        return Ok((gid, true));
    }
    Err(Refusal::NoFreeGroupId { shard: shard.to_owned() }.into())
}

/// Deletes what etcd keeps of the past of group `gid`, which has no servers: its last failover and handover, its
/// held-data mark, its salvaged tail. A group id is reused (the lowest free one is taken), so a removed group's
/// records would otherwise be read as the history of the next shard given its id (its replicas judged against
/// another group's replication ID, offset 0 taken for data lost). Reads first: a run with nothing to delete writes
/// nothing.
pub(crate) async fn forget_group_history(s: &Session<'_>, gid: u32) -> Result<()> {
    let etcd = s.etcd()?;
    let prefix = s.prefix();
    let keys = [
        crate::steps::failover::record_key(&prefix, gid),
        crate::steps::failover::held_data_key(&prefix, gid),
        transfer::handover_key(&prefix, gid),
        crate::steps::salvage::salvaged_key(&prefix, gid),
    ];
    for key in keys {
        if etcd.get(&key).await?.is_some() {
            tracing::info!(gid, key, "deleting the record of a group that no longer has servers");
            etcd.delete(&key).await?;
        }
    }
    Ok(())
}

async fn create_group(s: &Session<'_>, gid: u32) -> Result<()> {
    match s.dashboard.group_create(gid).await {
        Err(e) if e.is_already_exists() => Ok(()),
        other => Ok(other?),
    }
}

/// `group/add`, where "already exists" is success only if the server is in this very group.
pub(crate) async fn add_server(s: &Session<'_>, gid: u32, server: &str) -> Result<()> {
    tracing::info!(gid, server, "adding server to group");
    match s.dashboard.group_add(gid, server).await {
        Ok(()) => Ok(()),
        Err(e) if e.is_already_exists() => {
            let stats = s.stats().await?;
            match stats.group_of_server(server) {
                Some(g) if g.id == gid => Ok(()),
                Some(g) => Err(Refusal::InOtherGroup { server: server.to_owned(), registered: g.id, gid }.into()),
                None => Err(e.into()),
            }
        }
        Err(e) => Err(e.into()),
    }
}

/// Whether `replica` says it replicates `master` in sync. The fork's health loop marks a replica that missed one
/// check (pika answers nothing while it stops a replica's rsync client, about a second) as state 1 and, observed with
/// pika v4.0.1's fork, never clears the mark once the replica answers again; pika's own word counts then.
async fn replicates_in_sync(s: &Session<'_>, replica: &str, master: &str) -> bool {
    let Ok(master_at) = s.dial(master) else { return false };
    s.replication(replica).await.is_ok_and(|info| info.follows(&master_at) && info.in_sync())
}

/// Checks that Codis agrees: the master at index 0 and every replica listed; under the Pika fork, whose health loop
/// reports roles, also that the roles it reports match (bounded wait, then exit 75 to look again later).
async fn confirm(s: &Session<'_>, gid: u32, master: &str, replicas: &[&Pod]) -> Result<()> {
    let deadline = tokio::time::Instant::now() + s.ctx.budget.cap(FORK_AGREEMENT_WAIT);
    loop {
        let stats = s.stats().await?;
        let group = stats.group(gid).ok_or(Refusal::GroupGone { gid })?;
        if !group.master().is_some_and(|m| m.eq_ignore_ascii_case(master)) {
            return Err(Refusal::MasterChanged { gid, now: group.master().map(str::to_owned) }.into());
        }
        let mut disagree = Vec::new();
        for pod in replicas {
            let server = s.server(pod);
            match group.server(&server) {
                None => disagree.push(format!("{server} is not listed")),
                Some(gs) => {
                    // Only the fork reports roles; an empty role means its health loop has not looked yet.
                    if let Some(role) = gs.role.as_deref().filter(|r| !r.is_empty()) {
                        let state = gs.state.unwrap_or(0);
                        let agrees = role == "slave"
                            && (state == 0 || (state == 1 && replicates_in_sync(s, &server, master).await));
                        if !agrees {
                            disagree.push(format!("{server} is reported as {role} (state {state})"));
                        }
                    }
                }
            }
        }
        if disagree.is_empty() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline || s.ctx.budget.expired() {
            return Err(Error::InProgress {
                progress: format!("waiting for codis to agree on group {gid}: {}", disagree.join("; ")),
            });
        }
        tokio::time::sleep(s.ctx.budget.cap(POLL * 5)).await;
    }
}
