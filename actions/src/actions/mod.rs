//! One module per subcommand, each receiving its own event: the lifecycle actions KubeBlocks calls, `rejoin` and
//! `pre-stop` (the pika container's start and its preStop hook), `topology` (for people) and `watch` ([`watcher`],
//! the long-running failover watcher).

pub mod member_join;
pub mod member_leave;
pub mod post_provision;
pub mod pre_stop;
pub mod pre_terminate;
pub mod rejoin;
pub mod role_probe;
pub mod shard_add;
pub mod shard_remove;
pub mod switchover;
pub mod topology;
pub mod watcher;
