//! The integration tests: each module drives the real `pika-action` binary with the environment KubeBlocks would
//! give it, over real etcd, real redis-servers and the Codis double (`testbed`), and checks Codis, redis and etcd
//! state afterwards. The reliability modules (`reliability_*`) record what they counted for `scripts/test.sh`.

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

mod drain_backoff;
mod failover;
mod failover_drain;
mod kubeblocks;
mod provision;
mod real_kubeblocks;
mod real_pika;
mod rejoin_handover;
mod reliability_concurrency;
mod reliability_faults;
mod reliability_fuzz;
mod reliability_input;
mod reliability_secrets;
mod render;
mod scale_in;
mod scale_many;
mod split;
mod switchover;
mod switchover_one_call;
