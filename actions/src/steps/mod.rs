//! Idempotent steps over the clients, each safe to run again after a crash at any point: the session and the
//! cluster's topology lock ([`cluster`]), registering shards ([`register`]), moving slots toward a topology
//! ([`rebalance`]), draining a leaving shard ([`drain`]), fenced master transfers ([`transfer`]) with the group's
//! writes held at the proxies while a planned one promotes ([`hold`]), the records of failovers ([`failover`]),
//! the migration executor paused for a promote ([`pause`]), the removal of proxies gone for good ([`proxies`]) and
//! the writes a failed-over master took last, salvaged from its binlog when it comes back ([`salvage`]).

pub mod cluster;
pub mod drain;
pub mod failover;
pub mod hold;
pub mod pause;
pub mod proxies;
pub mod rebalance;
pub mod register;
pub mod salvage;
pub mod split;
pub mod transfer;
