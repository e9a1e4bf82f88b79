//! The crash tests that stay on redis-server and the Codis double (feature `failpoints`): each module kills an
//! action at every fail point it passes, runs it again as KubeBlocks would, and checks that the cluster converges
//! with no key lost. Each records its crash points as trials for `scripts/test.sh`, which fails when a module
//! recorded nothing. The others run on real pika and the fork (`integration/real_pika/crash.rs`); `crash_scale_many`
//! counts every slot move of a change, which only the double's request log records.

#[path = "../support/attack.rs"]
mod attack;
#[path = "../support/change.rs"]
mod change;
#[path = "../support/cluster_api.rs"]
mod cluster_api;
#[path = "../failover_bed/mod.rs"]
mod failover_bed;
#[path = "../rollout/mod.rs"]
mod rollout;
#[path = "../support/summary.rs"]
mod summary;
#[path = "../support/mod.rs"]
mod support;

mod crash_scale_many;
