//! `post-provision`: every shard registered as a Codis group, every slot assigned and balanced, proxies online.
//!
//! 1.1+: the ShardingDefinition's postProvision runs once and registers every shard. 1.0.x: each shard component
//! runs its own postProvision, in any order and possibly at once; each registers its own shard, and whichever finds
//! every shard of the cluster registered assigns the slots (on a fresh cluster) or moves slots onto the new shard
//! (a shard joining an existing cluster). The topology lock serialises them, so they converge in any order.

use std::collections::BTreeMap;

use crate::cluster::{self, release, Session};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::event::{Event, Legacy, Shard};
use crate::rebalance;
use crate::register;

/// Runs the action.
pub async fn run(ctx: &Context) -> Result<String> {
    let Event::PostProvision { shard, shards, legacy, .. } = &ctx.event else {
        return Err(Error::Refused("post-provision got another action's event".into()));
    };
    let s = Session::open(ctx).await?;
    let mut lock = s.lock_topology().await?;
    let result = match legacy {
        None => provision_all(&s, shards).await,
        Some(legacy) => provision_one(&s, shard, shards, legacy).await,
    };
    release(&mut lock).await;
    result
}

async fn provision_all(s: &Session<'_>, shards: &[Shard]) -> Result<String> {
    let mut groups = BTreeMap::new();
    for shard in shards {
        let reg = register::ensure_shard(s, shard, &shard.pods).await?;
        groups.insert(shard.name.clone(), reg.gid);
    }
    finish(s, &groups).await
}

async fn provision_one(s: &Session<'_>, shard: &Shard, shards: &[Shard], legacy: &Legacy) -> Result<String> {
    let reg = register::ensure_shard(s, shard, &shard.pods).await?;
    let stats = s.stats().await?;
    // Shards being deleted take no slots; KB_CLUSTER_COMPONENT_DELETING_LIST holds short names.
    let cluster = &s.common.cluster.name;
    let live: Vec<&Shard> =
        shards.iter().filter(|sh| !legacy.deleting.iter().any(|d| sh.name == format!("{cluster}-{d}"))).collect();
    let mut groups = BTreeMap::new();
    let mut waiting = Vec::new();
    for sh in &live {
        match cluster::group_of_shard(&stats, &sh.name) {
            Some(g) => {
                groups.insert(sh.name.clone(), g.id);
            }
            None => waiting.push(sh.name.clone()),
        }
    }
    let fresh = stats.slots.iter().all(|sl| sl.group_id == 0 && sl.is_idle());
    if fresh && !waiting.is_empty() {
        // Bootstrap: assigning now would hand every slot to the shards that happen to be first, only to migrate
        // them again; the last shard to register assigns them all.
        return Ok(format!(
            "registered {} as group {}; slots are assigned once {} register",
            shard.name,
            reg.gid,
            waiting.join(", ")
        ));
    }
    finish(s, &groups).await
}

/// Balances the slots over `groups` (shard → gid) and onlines proxies; refuses when a group outside them holds slots.
async fn finish(s: &Session<'_>, groups: &BTreeMap<String, u32>) -> Result<String> {
    let stats = s.stats().await?;
    let targets: Vec<u32> = groups.values().copied().collect();
    let strangers: Vec<u32> = stats
        .slots
        .iter()
        .flat_map(|sl| [sl.group_id, sl.action.target_id.unwrap_or(0)])
        .filter(|g| *g != 0 && !targets.contains(g))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    if !strangers.is_empty() {
        return Err(Error::Refused(format!(
            "codis groups {strangers:?} hold slots but serve no shard of this cluster; refusing to move their slots"
        )));
    }
    let outcome = rebalance::balance(s, &targets, "rebalance").await?;
    let proxies = ensure_proxies_online(s).await?;
    Ok(format!(
        "{} shard(s) registered as groups {:?}; {} slot(s) assigned, {} migrated (critical path {} rounds, lower \
         bound {}); {proxies} proxy(ies) online",
        groups.len(),
        targets,
        outcome.assigned,
        outcome.created,
        outcome.critical_path,
        outcome.lower_bound,
    ))
}

/// Brings back online every registered proxy that reports itself offline but alive; counts the online ones.
pub async fn ensure_proxies_online(s: &Session<'_>) -> Result<usize> {
    let stats = s.stats().await?;
    let mut online = 0;
    for proxy in &stats.proxy.models {
        let healthy = stats.proxy.stats.get(&proxy.token).is_some_and(|e| e.is_healthy());
        let is_online =
            stats.proxy.stats.get(&proxy.token).and_then(|e| e.get("online")).and_then(|v| v.as_bool()) == Some(true);
        if healthy && !is_online {
            s.dashboard.proxy_online(&proxy.admin_addr).await?;
        }
        if healthy {
            online += 1;
        }
    }
    Ok(online)
}
