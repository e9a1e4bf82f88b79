//! The crash tests: each module kills an action at every fail point it passes (feature `failpoints`), runs it again
//! as KubeBlocks would, and checks that the cluster converges with no key lost. Each records its crash points as
//! trials for `scripts/test.sh`, which fails when a module recorded nothing.

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

mod crash_member_leave;
mod crash_pre_terminate;
mod crash_provision;
mod crash_scale_in;
mod crash_scale_many;
mod crash_watcher;
