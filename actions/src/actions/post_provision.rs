//! `post-provision`: every shard registered as a Codis group, every slot assigned and balanced, proxies online.
//!
//! 1.1+: the ShardingDefinition's postProvision runs once and registers every shard. 1.0.x: each shard component
//! runs its own postProvision, in any order and possibly at once; each registers its own shard, and whichever finds
//! every shard of the cluster registered assigns the slots (on a fresh cluster) or moves slots onto the new shard
//! (a shard joining an existing cluster). The topology lock serialises them, so they converge in any order.
//!
//! On 1.0.x `ALL_SHARDS_POD_FQDNS` names the shard components that exist (a deleting one included), and the legacy
//! `KB_CLUSTER_COMPONENT_*` lists name the same Component objects by short name, with the deleting ones apart: a
//! shard whose Component KubeBlocks has not created yet is in neither. So "every shard" is the listed shards that are
//! not deleting, and on a fresh cluster the slots also wait for the Cluster's `spec.shardings[].shards` when the
//! Kubernetes API answers ([`bootstrap_waits`]).
//!
//! `--own-shard` (the 1.1 chart's component postProvision, on either line) registers this shard alone and moves no
//! slot.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::clients::codis::{Group, Stats};
use crate::clients::kube::Kube;
use crate::error::{Error, Result};
use crate::input::context::Context;
use crate::input::event::{Common, Legacy, Shard};
use crate::plan::Goal;
use crate::steps::cluster::{self, Session};
use crate::steps::rebalance::{self, Aim, Handoff, Own};
use crate::steps::register;
use crate::steps::split::{self, Start};

/// Longest the Cluster object may take to read; past that its shard count is not known.
const KUBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Why slots were not balanced.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Groups hold slots that no shard of this cluster owns: moving them is not this action's call.
    #[error("codis groups {gids:?} hold slots but serve no shard of this cluster; refusing to move their slots")]
    ForeignGroups {
        /// The groups.
        gids: Vec<u32>,
    },
}

/// Runs the action.
pub async fn run(ctx: &Context, event: &crate::input::event::PostProvision) -> Result<String> {
    let crate::input::event::PostProvision { common, shard, shards, legacy, own_shard, kube_api } = event;
    let desired = match (legacy, own_shard) {
        (Some(_), false) => desired_shards(ctx, common, &shard.name, kube_api.as_deref()).await,
        _ => None,
    };
    let s = Session::open(ctx, common).await?;
    match legacy {
        _ if *own_shard => provision_own(&s, shard).await,
        None => provision_all(&s, shards).await,
        Some(legacy) => provision_one(&s, shard, shards, legacy, desired).await,
    }
}

/// Registers `shard` under the topology lock, then waits for its replicas outside it.
async fn register_shard(s: &Session<'_>, shard: &Shard) -> Result<register::Registered> {
    let reg = s.under_topology_lock(async |_| register::register(s, shard, &shard.pods).await).await?;
    register::settle(s, &reg, &shard.pods).await?;
    Ok(reg)
}

async fn provision_own(s: &Session<'_>, shard: &Shard) -> Result<String> {
    let reg = register_shard(s, shard).await?;
    Ok(format!(
        "{} registered as group {} (master {}); no slot moved (--own-shard: the sharding's actions place the slots)",
        shard.name, reg.gid, reg.master
    ))
}

async fn provision_all(s: &Session<'_>, shards: &[Shard]) -> Result<String> {
    let registered = s
        .under_topology_lock(async |_| {
            let mut regs = Vec::new();
            for shard in shards {
                regs.push((shard, register::register(s, shard, &shard.pods).await?));
            }
            Ok(regs)
        })
        .await?;
    let mut groups = BTreeMap::new();
    for (shard, reg) in registered {
        register::settle(s, &reg, &shard.pods).await?;
        groups.insert(shard.name.clone(), reg.gid);
    }
    let targets: Vec<u32> = groups.values().copied().collect();
    finish(s, &groups, move |_, _| Aim { goal: Goal::new(targets.clone(), 0), own: Own::Everything }).await
}

/// A shard being deleted whose group still holds or receives slots (its drain has not finished), and that group.
fn still_draining<'a>(
    stats: &'a Stats,
    shards: &'a [Shard],
    deleting: &BTreeSet<String>,
) -> Option<(&'a str, &'a Group)> {
    shards.iter().filter(|sh| deleting.contains(&sh.name)).find_map(|sh| {
        cluster::group_of_shard(stats, &sh.name)
            .filter(|g| !stats.slots_of(g.id).is_empty() || !stats.slots_targeting(g.id).is_empty())
            .map(|g| (sh.name.as_str(), g))
    })
}

async fn provision_one(
    s: &Session<'_>,
    shard: &Shard,
    shards: &[Shard],
    legacy: &Legacy,
    desired: Option<u32>,
) -> Result<String> {
    let cluster = &s.common.cluster.name;
    let deleting: BTreeSet<String> = legacy.deleting.iter().map(|d| format!("{cluster}-{d}")).collect();
    let live: Vec<String> = shards.iter().filter(|sh| !deleting.contains(&sh.name)).map(|sh| sh.name.clone()).collect();
    // The final topology: every live listed shard, and as many more as the Cluster wants when its count is known (a
    // Component KubeBlocks has not created yet is listed nowhere).
    let missing = desired.map_or(0, |n| (n as usize).saturating_sub(live.len()));
    let goal_of = |stats: &Stats, leaving: &BTreeSet<String>| {
        let names: Vec<&String> = live.iter().filter(|n| !leaving.contains(*n)).collect();
        let receivers: Vec<u32> =
            names.iter().filter_map(|n| cluster::group_of_shard(stats, n)).map(|g| g.id).collect();
        let unregistered = names.len() - receivers.len() + missing;
        Goal::new(receivers, unregistered)
    };
    // A shard joining while no deleting shard still drains may split off a donor; its postProvision completes the
    // split before balancing (the other shards' postProvisions run at the same time on 1.0.x).
    if still_draining(&s.stats().await?, shards, &deleting).is_none() {
        let leaving = crate::steps::drain::recorded_leavers(s).await?;
        let start =
            s.under_topology_lock(async |_| split::register(s, shard, |stats| goal_of(stats, &leaving)).await).await?;
        if let Start::Splitting { gid, .. } = start {
            split::complete(s, shard, gid).await?;
        }
    }
    let reg = register_shard(s, shard).await?;
    let stats = s.stats().await?;
    // A shard being deleted keeps its slots until its own pre-terminate has drained them; balancing around it now
    // would move them twice (or fight the drain).
    if let Some((name, g)) = still_draining(&stats, shards, &deleting) {
        return Err(Error::InProgress {
            progress: format!(
                "registered {} as group {}; {name} (group {}) is being deleted and its drain has not finished: the \
                 slots are balanced once it has",
                shard.name, reg.gid, g.id
            ),
        });
    }
    let mut groups = BTreeMap::new();
    let mut registered = BTreeSet::new();
    for name in &live {
        if let Some(g) = cluster::group_of_shard(&stats, name) {
            groups.insert(name.clone(), g.id);
            registered.insert(name.clone());
        }
    }
    let fresh = stats.slots.iter().all(|sl| sl.group_id == 0 && sl.is_idle());
    if fresh {
        let waits = bootstrap_waits(cluster, &shard.name, shards, legacy, &registered, desired);
        if !waits.is_empty() {
            // Bootstrap: assigning now would hand every slot to the shards that happen to be first, only to migrate
            // them again; the last shard to register assigns them all.
            return Ok(format!(
                "registered {} as group {}; slots are assigned once {}",
                shard.name,
                reg.gid,
                waits.join(" and ")
            ));
        }
    }
    let own = reg.gid;
    let aim_of =
        move |stats: &Stats, leaving: &BTreeSet<String>| Aim { goal: goal_of(stats, leaving), own: Own::Receiver(own) };
    finish(s, &groups, aim_of).await
}

/// The sharding a shard belongs to: its full name `<cluster>-<sharding>-<id>` without the cluster and the id.
#[must_use]
pub fn sharding_of<'a>(cluster: &str, shard: &'a str) -> Option<&'a str> {
    shard.strip_prefix(cluster)?.strip_prefix('-')?.rsplit_once('-').map(|(sharding, _)| sharding)
}

/// Whether a component's short name is a shard of `sharding`: `<sharding>-<id>`, the id three lower-case letters or
/// digits as KubeBlocks generates them.
fn is_shard_of(sharding: &str, short: &str) -> bool {
    short
        .strip_prefix(sharding)
        .and_then(|rest| rest.strip_prefix('-'))
        .is_some_and(|id| id.len() == 3 && id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()))
}

/// What a 1.0.x bootstrap still waits for before the slots are assigned (nothing: assign now).
///
/// Every shard that is not being deleted must be registered (`registered` holds the full names Codis has a group
/// for): those listed in `ALL_SHARDS_POD_FQDNS`, and those the legacy component list names but the var does not
/// (KubeBlocks resolved the two a moment apart). When the Cluster's desired shard count is known, as many shards must
/// exist: a Component KubeBlocks has not created yet appears in neither list.
#[must_use]
pub fn bootstrap_waits(
    cluster: &str,
    shard: &str,
    shards: &[Shard],
    legacy: &Legacy,
    registered: &BTreeSet<String>,
    desired: Option<u32>,
) -> Vec<String> {
    let deleting: BTreeSet<String> = legacy.deleting.iter().map(|d| format!("{cluster}-{d}")).collect();
    let mut live: BTreeSet<String> =
        shards.iter().map(|sh| sh.name.clone()).filter(|name| !deleting.contains(name)).collect();
    if let Some(sharding) = sharding_of(cluster, shard) {
        live.extend(
            legacy
                .components
                .iter()
                .filter(|c| is_shard_of(sharding, c))
                .map(|c| format!("{cluster}-{c}"))
                .filter(|name| !deleting.contains(name)),
        );
    }
    let mut waits = Vec::new();
    let unregistered: Vec<&str> = live.iter().filter(|n| !registered.contains(*n)).map(String::as_str).collect();
    if !unregistered.is_empty() {
        waits.push(format!("{} register", unregistered.join(", ")));
    }
    if let Some(n) = desired.filter(|&n| live.len() < n as usize) {
        waits.push(format!("all {n} shards of the Cluster exist ({} do)", live.len()));
    }
    waits
}

/// The Cluster's desired number of shards in this shard's sharding, when the Kubernetes API answers in time.
pub async fn desired_shards(ctx: &Context, common: &Common, shard: &str, kube_api: Option<&str>) -> Option<u32> {
    let (namespace, name) = (&common.cluster.namespace, &common.cluster.name);
    let sharding = sharding_of(name, shard)?;
    let timeout = ctx.budget.cap(KUBE_TIMEOUT);
    let kube = Kube::reachable(kube_api, namespace, timeout).await?;
    match tokio::time::timeout(timeout + timeout, kube.cluster(namespace, name)).await {
        Ok(Ok(Some(facts))) => {
            let n = facts.shards.get(sharding).copied();
            tracing::info!(sharding, desired = ?n, "the Cluster's shard count");
            n
        }
        Ok(Ok(None)) => None,
        Ok(Err(e)) => {
            tracing::info!(error = %e, "the Cluster's shard count is not known");
            None
        }
        Err(_) => {
            tracing::info!("the Cluster's shard count is not known: the kubernetes api did not answer in time");
            None
        }
    }
}

/// Moves the slots toward what `aim_of` says (`groups`, shard → gid, are the shards registered now) and onlines
/// proxies; refuses when a group outside `groups` holds slots.
async fn finish(
    s: &Session<'_>,
    groups: &BTreeMap<String, u32>,
    mut aim_of: impl FnMut(&Stats, &BTreeSet<String>) -> Aim,
) -> Result<String> {
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
        return Err(Refusal::ForeignGroups { gids: strangers }.into());
    }
    let outcome =
        rebalance::converge(s, "rebalance", |stats, leaving| Ok(aim_of(stats, leaving)), Handoff::Wait).await?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(short: &str) -> Shard {
        Shard { name: format!("c1-{short}"), pods: Vec::new() }
    }

    fn legacy(components: &[&str], deleting: &[&str]) -> Legacy {
        let names = |l: &[&str]| l.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let undeleted = components.iter().filter(|c| !deleting.contains(c)).copied().collect::<Vec<_>>();
        Legacy { components: names(components), deleting: names(deleting), undeleted: names(&undeleted) }
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| format!("c1-{n}")).collect()
    }

    const OTHERS: [&str; 4] = ["etcd", "codis-dashboard", "codis-proxy", "codis-fe"];

    #[test]
    fn the_sharding_is_the_full_name_without_cluster_and_id() {
        assert_eq!(sharding_of("c1", "c1-pika-x7k"), Some("pika"));
        assert_eq!(sharding_of("c1", "c1-my-pika-x7k"), Some("my-pika"));
        assert_eq!(sharding_of("c1", "c2-pika-x7k"), None);
        assert!(
            is_shard_of("pika", "pika-x7k") && !is_shard_of("pika", "pika-x7kk") && !is_shard_of("pika", "codis-fe")
        );
        assert!(!is_shard_of("pika", "pika-X7k") && !is_shard_of("pika", "pikaa-x7k"));
    }

    #[test]
    fn a_bootstrap_waits_for_every_listed_shard_that_is_not_deleting() {
        let shards = [shard("pika-a1b"), shard("pika-c2d"), shard("pika-e3f")];
        let mut components = OTHERS.to_vec();
        components.extend(["pika-a1b", "pika-c2d", "pika-e3f"]);
        let l = legacy(&components, &[]);
        let waits = bootstrap_waits("c1", "c1-pika-a1b", &shards, &l, &set(&["pika-a1b"]), None);
        assert_eq!(waits, ["c1-pika-c2d, c1-pika-e3f register"]);
        assert!(bootstrap_waits("c1", "c1-pika-a1b", &shards, &l, &set(&["pika-a1b", "pika-c2d", "pika-e3f"]), None)
            .is_empty());
        // A deleting shard is not waited for.
        let l = legacy(&components, &["pika-e3f"]);
        assert!(bootstrap_waits("c1", "c1-pika-a1b", &shards, &l, &set(&["pika-a1b", "pika-c2d"]), None).is_empty());
    }

    #[test]
    fn a_shard_only_the_legacy_list_names_is_waited_for_and_other_components_are_not() {
        let shards = [shard("pika-a1b")];
        let mut components = OTHERS.to_vec();
        components.extend(["pika-a1b", "pika-c2d", "pikafe"]);
        let waits = bootstrap_waits("c1", "c1-pika-a1b", &shards, &legacy(&components, &[]), &set(&["pika-a1b"]), None);
        assert_eq!(waits, ["c1-pika-c2d register"]);
    }

    #[test]
    fn the_clusters_shard_count_holds_the_slots_until_that_many_shards_exist() {
        let shards = [shard("pika-a1b"), shard("pika-c2d")];
        let mut components = OTHERS.to_vec();
        components.extend(["pika-a1b", "pika-c2d"]);
        let l = legacy(&components, &[]);
        let all = set(&["pika-a1b", "pika-c2d"]);
        assert_eq!(
            bootstrap_waits("c1", "c1-pika-a1b", &shards, &l, &all, Some(3)),
            ["all 3 shards of the Cluster exist (2 do)"]
        );
        assert!(bootstrap_waits("c1", "c1-pika-a1b", &shards, &l, &all, Some(2)).is_empty());
        assert!(bootstrap_waits("c1", "c1-pika-a1b", &shards, &l, &all, None).is_empty());
    }
}
