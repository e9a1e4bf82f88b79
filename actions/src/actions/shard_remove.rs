//! `shard-remove` (1.1+): before KubeBlocks deletes the shard named by KB_REMOVE_SHARD_NAME, every slot of its group
//! is migrated to the remaining shards and finished, then its servers and its group are removed from Codis
//! ([`drain`](crate::steps::drain)). An error or exit 75 makes KubeBlocks skip the deletion and retry, which resumes here.
//!
//! A scale-in by several shards runs one shardRemove per shard, and on 1.1 KubeBlocks runs them one after another:
//! nothing in this one's variables says which others follow (`ALL_SHARDS_POD_FQDNS` still lists them all). When the
//! Kubernetes API answers, the Cluster's shard count says it: KubeBlocks keeps the lexicographically first names of
//! the sharding and deletes the rest ([`victims`]), so those are left out of the targets and drained along, and every
//! slot moves once, onto a shard that stays. Without the API, the shards recorded as leaving in etcd by their own
//! shardRemove are left out ([`drain::remove_shard`]); one whose shardRemove has not started yet can then still
//! receive slots that move again when it goes.

use std::collections::BTreeSet;

use crate::actions::post_provision::{desired_shards, sharding_of};
use crate::error::Result;
use crate::input::context::Context;
use crate::input::event::Shard;
use crate::steps::cluster::Session;
use crate::steps::drain;

/// Runs the action.
pub async fn run(ctx: &Context, event: &crate::input::event::ShardRemove) -> Result<String> {
    let crate::input::event::ShardRemove { common, shards, removed, kube_api, .. } = event;
    let mut remaining = drain::remaining_after(removed, shards);
    if let Some(n) = desired_shards(ctx, common, removed, kube_api.as_deref()).await {
        let leaving = victims(&common.cluster.name, removed, shards, n as usize);
        if leaving.contains(removed) {
            tracing::info!(leaving = ?leaving, "the cluster's shard count says which shards this scale-in removes");
            remaining.retain(|r| !leaving.contains(r));
        } else if !leaving.is_empty() {
            tracing::warn!(
                removed = removed.as_str(),
                predicted = ?leaving,
                "the shard removed is not among those the cluster's shard count predicts: ignoring the prediction"
            );
        }
    }
    let s = Session::open(ctx, common).await?;
    drain::remove_shard(&s, removed, &remaining).await
}

/// The shards of `removed`'s sharding that a scale-in to `desired` shards deletes: KubeBlocks sorts the shards of
/// a shard template that are neither being deleted nor `offline` by name and keeps the first `desired`, per template;
/// nothing when `desired` keeps them all. Shards already being deleted were the last names of an earlier pass, so
/// counting them changes nothing while the count stays. Shard templates and `offline` shards are not modelled: the
/// caller checks that the prediction names the shard being removed before trusting it.
#[must_use]
pub fn victims(cluster: &str, removed: &str, shards: &[Shard], desired: usize) -> BTreeSet<String> {
    let Some(sharding) = sharding_of(cluster, removed) else { return BTreeSet::new() };
    let mut names: Vec<&str> =
        shards.iter().map(|s| s.name.as_str()).filter(|n| sharding_of(cluster, n) == Some(sharding)).collect();
    if !names.contains(&removed) {
        names.push(removed);
    }
    names.sort_unstable();
    names.dedup();
    names.iter().skip(desired).map(|n| (*n).to_owned()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shards(ids: &[&str]) -> Vec<Shard> {
        ids.iter().map(|id| Shard { name: format!("c1-pika-{id}"), pods: Vec::new() }).collect()
    }

    #[test]
    fn a_scale_in_removes_the_last_names_of_the_sharding() {
        let all = shards(&["x7k", "a2b", "q9z", "m00", "b11"]);
        let v = victims("c1", "c1-pika-q9z", &all, 3);
        assert_eq!(v, ["c1-pika-q9z", "c1-pika-x7k"].map(str::to_owned).into());
        assert!(victims("c1", "c1-pika-q9z", &all, 5).is_empty(), "no scale-in");
        // The removed shard is counted even when the var no longer lists it.
        let v = victims("c1", "c1-pika-zzz", &all, 5);
        assert_eq!(v, ["c1-pika-zzz".to_owned()].into());
        // Other shardings' shards do not count.
        let mut mixed = all.clone();
        mixed.push(Shard { name: "c1-other-zzz".into(), pods: Vec::new() });
        assert_eq!(victims("c1", "c1-pika-q9z", &mixed, 3), victims("c1", "c1-pika-q9z", &all, 3));
    }
}
