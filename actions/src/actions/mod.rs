//! One module per subcommand, each receiving its own event: the lifecycle actions KubeBlocks calls, `rejoin` (run
//! by the pika container before pika starts), `topology` (for people) and `watch` ([`watcher`], the long-running
//! failover watcher).

pub mod member_join;
pub mod member_leave;
pub mod post_provision;
pub mod pre_terminate;
pub mod rejoin;
pub mod role_probe;
pub mod shard_add;
pub mod shard_remove;
pub mod switchover;
pub mod topology;
pub mod watcher;
