//! `pre-stop`: the pika container's preStop hook. The kubelet runs it before it sends pika SIGTERM, whoever deletes
//! the pod (a user, a node drain, an eviction, KubeBlocks), and waits for it within the pod's grace period.
//!
//! Why: pika v4.0.1 stops its replication manager before its client dispatcher on SIGTERM, so a master stopped while
//! it serves acknowledges writes for its 4-15 s shutdown that no replica gets (seen: about 400 keys lost once the pod
//! came back on an empty volume and rejoin handed mastership to the replica). KubeBlocks' own `switchover` precedes
//! only the restarts KubeBlocks makes; this hook covers every other deletion.
//!
//! What: exactly `switchover` for this pod with no candidate ([`crate::actions::switchover`]): nothing for a replica or
//! a pod Codis does not know, otherwise mastership moves once, fenced and confirmed, to a healthy replica, within
//! `PRE_STOP_BUDGET_SECONDS`, in one call (the kubelet never calls it again). When the Kubernetes API says the
//! Cluster is being deleted, nothing moves: every pod is going. A failed hand-over ends with exit 1 and leaves what
//! `switchover` leaves; the pod then stops as it would have without the hook, and its `rejoin` or the failover
//! watcher takes it from there.

use crate::actions::pre_terminate::{cluster_fate, ClusterFate};
use crate::actions::switchover;
use crate::error::{Error, Result};
use crate::input::context::Context;
use crate::input::event::{PodRef, PreStop, Switchover};
use crate::input::vars;

/// Runs the action.
pub async fn run(ctx: &Context, event: &PreStop) -> Result<String> {
    let PreStop { common, shard, pod, kube_api } = event;
    let me = shard
        .pods
        .iter()
        .find(|p| p.name() == pod)
        .ok_or_else(|| Error::invalid(vars::POD_NAME, format!("{pod} is not a pod of {}", shard.name)))?;
    match cluster_fate(ctx, common, kube_api.as_deref()).await {
        ClusterFate::Deleting(why) => return Ok(format!("{why}: {pod} stops without handing anything over")),
        ClusterFate::Stays => {}
        ClusterFate::Unknown(why) => {
            tracing::info!(
                why = why.as_str(),
                "cannot tell whether the cluster is going; handing over if this is the master"
            );
        }
    }
    let as_switchover = Switchover {
        common: common.clone(),
        shard: shard.clone(),
        current: PodRef { name: pod.clone(), fqdn: me.clone() },
        role: None,
        candidate: None,
        kube_api: kube_api.clone(),
    };
    switchover::run(ctx, &as_switchover).await
}
