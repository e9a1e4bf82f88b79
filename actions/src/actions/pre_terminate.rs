//! `pre-terminate`: a shard component about to be deleted.
//!
//! **1.0.x** (the chart's component preTerminate is how a scale-in drains there): with
//! `KB_CLUSTER_COMPONENT_IS_SCALING_IN=true` the shard is drained and removed from Codis exactly as `shard-remove`
//! does ([`drain`](crate::steps::drain)), onto the shards that are not being deleted; otherwise the whole cluster is going,
//! and nothing is touched: the action returns at once, without even connecting to Codis.
//!
//! **1.1+** (the safety net behind the ShardingDefinition's shardRemove, which KubeBlocks skips for a shard whose
//! shardAdd never succeeded): first the Kubernetes API is asked whether the Cluster itself is going
//! ([`ClusterFate`]); a Cluster being deleted, or gone, ends the run at once, without contacting Codis. A Cluster
//! that stays means this shard is leaving it: whatever Codis still has of it is drained and removed exactly as
//! `shard-remove` does; a shard Codis does not know (shardRemove did its work, or it never registered) is done at
//! once. When no API answers, Codis' own state decides ([`without_api`]); see there for the one case that is
//! decided wrongly.

use std::time::Duration;

use crate::clients::codis::Stats;
use crate::clients::kube::Kube;
use crate::error::Result;
use crate::input::context::Context;
use crate::input::event::{Common, Shard};
use crate::steps::cluster::{self, Session};
use crate::steps::drain::{self, LegacyDecision};

/// Longest the Cluster object may take to read; past that the API counts as not answering.
const KUBE_TIMEOUT: Duration = Duration::from_secs(3);

/// Runs the action.
pub async fn run(ctx: &Context, event: &crate::input::event::PreTerminate) -> Result<String> {
    let crate::input::event::PreTerminate { common, shard, shards, legacy, scaling_in, kube_api } = event;
    match (legacy, scaling_in) {
        (Some(legacy), Some(scaling_in)) => {
            match drain::legacy_decision(&common.cluster.name, &shard.name, shards, &legacy.deleting, *scaling_in) {
                LegacyDecision::Nothing(why) => Ok(why),
                LegacyDecision::Drain { remaining } => {
                    let s = Session::open(ctx, common).await?;
                    drain::remove_shard(&s, &shard.name, &remaining).await
                }
            }
        }
        _ => safety_net(ctx, common, shard, shards, kube_api.as_deref()).await,
    }
}

/// What the Kubernetes API says about the Cluster a 1.1+ pre-terminate runs in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterFate {
    /// The Cluster is being deleted (`metadata.deletionTimestamp` set) or no longer exists.
    Deleting(String),
    /// The Cluster exists and is not being deleted: only this shard is going.
    Stays,
    /// No API answered (none reachable, a timeout, an error such as missing rights): why.
    Unknown(String),
}

/// What Codis shows of the leaving shard, for the decision without an API.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CodisView {
    /// The shard's group, when Codis has one.
    pub gid: Option<u32>,
    /// Slots the group owns plus those migrating onto it.
    pub slots: usize,
    /// Whether another listed shard of the cluster has a group the slots could go to.
    pub others_registered: bool,
    /// Proxies registered in Codis.
    pub proxies: usize,
    /// Of those, the ones Codis cannot reach.
    pub proxies_unreachable: usize,
}

impl CodisView {
    /// Reads the view from the dashboard's stats and the etcd reservations.
    #[must_use]
    pub fn of(
        stats: &Stats,
        shard: &str,
        remaining: &[String],
        reserved: &std::collections::BTreeMap<u32, String>,
    ) -> Self {
        let gid = drain::leaving_group(stats, shard, reserved);
        let slots = gid.map_or(0, |gid| {
            stats
                .slots
                .iter()
                .filter(|sl| sl.group_id == gid || (!sl.is_idle() && sl.action.target_id == Some(gid)))
                .count()
        });
        let others_registered = !drain::target_groups(stats, remaining, gid.unwrap_or(0)).is_empty();
        let proxies = stats.proxy.models.len();
        let proxies_unreachable = stats
            .proxy
            .models
            .iter()
            .filter(|p| stats.proxy.stats.get(&p.token).is_some_and(|e| !e.is_healthy()))
            .count();
        Self { gid, slots, others_registered, proxies, proxies_unreachable }
    }
}

/// What a 1.1+ pre-terminate does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SafetyNet {
    /// Nothing: exit 0 with this explanation.
    Nothing(String),
    /// Drain the shard and remove it from Codis, as `shard-remove` does.
    Drain,
}

/// The decision when the Cluster stays: whatever Codis has of the shard goes, through the drain.
#[must_use]
pub fn with_cluster_staying(shard: &str, view: &CodisView) -> SafetyNet {
    match view.gid {
        None => SafetyNet::Nothing(format!(
            "{shard} leaves a cluster that stays, and codis has no group for it (shardRemove drained it, or it never \
             registered): nothing to drain"
        )),
        Some(_) => SafetyNet::Drain,
    }
}

/// The decision when no Kubernetes API answered, from Codis alone.
///
/// Safe either way: a shard Codis does not know is done, and a group holding no slot is removed (harmless if the
/// cluster is going too). A group that still holds slots is drained, except in the two states only a cluster
/// deletion produces: it is the cluster's last registered shard (the sharding keeps at least one shard, so a
/// scale-in never removes the last), or Codis reaches none of its proxies (the addon's ClusterDefinition terminates
/// the proxies before the shards). The residual case is a scale-in while no API answers **and** Codis reaches none of
/// its registered proxies: that shard's slots are not drained. Every other undecidable case is retried by KubeBlocks
/// (a drain refused or not finished), never skipped; a cluster deletion is never held for longer than it takes the
/// proxies to go.
#[must_use]
pub fn without_api(shard: &str, view: &CodisView, why: &str) -> SafetyNet {
    let Some(gid) = view.gid else {
        return SafetyNet::Nothing(format!(
            "{shard}: codis has no group for it, so nothing is lost whatever is happening ({why})"
        ));
    };
    if view.slots == 0 {
        return SafetyNet::Drain;
    }
    if !view.others_registered {
        return SafetyNet::Nothing(format!(
            "{shard} (group {gid}, {} slot(s)) is the cluster's last registered shard: a scale-in always keeps one, \
             so the cluster is being deleted; codis is left as it is ({why})",
            view.slots
        ));
    }
    if view.proxies > 0 && view.proxies_unreachable == view.proxies {
        return SafetyNet::Nothing(format!(
            "{shard} (group {gid}, {} slot(s)): codis reaches none of its {} proxies, which a cluster deletion removes \
             before the shards; taking this for a cluster deletion and leaving codis as it is ({why})",
            view.slots, view.proxies
        ));
    }
    SafetyNet::Drain
}

/// Asks the Kubernetes API whether the Cluster is going (also `pre-stop`'s question).
pub async fn cluster_fate(ctx: &Context, common: &Common, kube_api: Option<&str>) -> ClusterFate {
    let (namespace, name) = (&common.cluster.namespace, &common.cluster.name);
    let timeout = ctx.budget.cap(KUBE_TIMEOUT);
    let Some(kube) = Kube::reachable(kube_api, namespace, timeout).await else {
        return ClusterFate::Unknown(
            "no kubernetes api: KUBE_API_URL is unset and the pod has no service account".into(),
        );
    };
    match tokio::time::timeout(timeout + timeout, kube.cluster(namespace, name)).await {
        Err(_) => ClusterFate::Unknown(format!("the kubernetes api did not answer within {timeout:?}")),
        Ok(Err(e)) => ClusterFate::Unknown(crate::error::Error::from(e).one_line()),
        Ok(Ok(None)) => ClusterFate::Deleting(format!("cluster {namespace}/{name} no longer exists")),
        Ok(Ok(Some(facts))) if facts.deleting => {
            ClusterFate::Deleting(format!("cluster {namespace}/{name} is being deleted"))
        }
        Ok(Ok(Some(_))) => ClusterFate::Stays,
    }
}

async fn safety_net(
    ctx: &Context,
    common: &Common,
    shard: &Shard,
    shards: &[Shard],
    kube_api: Option<&str>,
) -> Result<String> {
    let fate = cluster_fate(ctx, common, kube_api).await;
    tracing::info!(shard = %shard.name, fate = ?fate, "pre-terminate: what the cluster is doing");
    let no_api = match fate {
        ClusterFate::Deleting(why) => return Ok(format!("{why}: {} goes with it; codis is left as it is", shard.name)),
        ClusterFate::Stays => None,
        ClusterFate::Unknown(why) => {
            tracing::warn!(why = why.as_str(), "cannot tell from the kubernetes api whether the cluster is going");
            Some(why)
        }
    };
    let remaining = drain::remaining_after(&shard.name, shards);
    let s = Session::open_without_etcd_if_down(ctx, common).await?;
    let stats = s.stats().await?;
    let reserved = match &s.etcd {
        Some(etcd) => cluster::reservations(etcd, &s.prefix()).await?,
        None => std::collections::BTreeMap::new(),
    };
    let view = CodisView::of(&stats, &shard.name, &remaining, &reserved);
    let decision = match &no_api {
        None => with_cluster_staying(&shard.name, &view),
        Some(why) => without_api(&shard.name, &view, why),
    };
    match decision {
        SafetyNet::Nothing(why) => {
            if no_api.is_some() && view.slots > 0 {
                tracing::warn!("{why}");
            }
            Ok(why)
        }
        SafetyNet::Drain => {
            // A drain needs etcd (its lock and records): missing or down, it fails here, before anything changed.
            let s = s.with_etcd(s.etcd_for(&format!("{} must be drained", shard.name)).await?);
            drain::remove_shard(&s, &shard.name, &remaining).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHARD: &str = "c1-pika-q9z";

    fn view(gid: Option<u32>, slots: usize, others: bool, proxies: usize, unreachable: usize) -> CodisView {
        CodisView { gid, slots, others_registered: others, proxies, proxies_unreachable: unreachable }
    }

    #[test]
    fn with_the_cluster_staying_whatever_codis_has_of_the_shard_is_drained() {
        assert_eq!(with_cluster_staying(SHARD, &view(Some(3), 100, true, 2, 0)), SafetyNet::Drain);
        // No slot left: the drain only removes the servers and the group.
        assert_eq!(with_cluster_staying(SHARD, &view(Some(3), 0, true, 2, 2)), SafetyNet::Drain);
        // Even the last shard and dead proxies go to the drain, which refuses them (exit 1) until fixed.
        assert_eq!(with_cluster_staying(SHARD, &view(Some(3), 9, false, 1, 1)), SafetyNet::Drain);
        assert!(matches!(
            with_cluster_staying(SHARD, &view(None, 0, true, 2, 0)),
            SafetyNet::Nothing(why) if why.contains("nothing to drain")
        ));
    }

    #[test]
    fn without_an_api_only_states_a_scale_in_cannot_produce_skip_a_drain() {
        let why = "no api";
        assert!(matches!(without_api(SHARD, &view(None, 0, true, 2, 0), why), SafetyNet::Nothing(_)));
        assert_eq!(without_api(SHARD, &view(Some(3), 0, true, 2, 2), why), SafetyNet::Drain, "empty: remove it");
        // Slots, other shards registered, proxies reachable: could be a scale-in, so drain.
        assert_eq!(without_api(SHARD, &view(Some(3), 50, true, 2, 0), why), SafetyNet::Drain);
        assert_eq!(without_api(SHARD, &view(Some(3), 50, true, 2, 1), why), SafetyNet::Drain, "one proxy is alive");
        assert_eq!(without_api(SHARD, &view(Some(3), 50, true, 0, 0), why), SafetyNet::Drain, "no proxy at all");
        // The last registered shard: only a cluster deletion removes it.
        assert!(matches!(
            without_api(SHARD, &view(Some(3), 50, false, 2, 0), why),
            SafetyNet::Nothing(w) if w.contains("last registered shard") && w.contains(why)
        ));
        // Every proxy gone: the cluster deletion's first stage.
        assert!(matches!(
            without_api(SHARD, &view(Some(3), 50, true, 2, 2), why),
            SafetyNet::Nothing(w) if w.contains("none of its 2 proxies")
        ));
    }
}
