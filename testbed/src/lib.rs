//! The test bed every pika-action test stands on: real etcd and real redis-server processes on free loopback ports
//! in temporary directories, always stopped on drop, and a Codis dashboard double (see [`codis`]).
//!
//! [`real`] runs the servers the addon ships instead: real pika v4.0.1 pods, each in its own network namespace,
//! and the real dashboard and proxy of Pika's Codis fork.
//!
//! Elsewhere, redis-server stands in for pika: both speak RESP and answer `INFO replication`, `SLAVEOF`, `CONFIG REWRITE`.
//! Nothing here is part of `pika-action`.
#![warn(missing_docs)]

pub mod cluster;
pub mod codis;
pub mod dns;
pub mod forwarder;
pub mod http1;
mod httpd;
pub mod kubeblocks;
pub mod process;
pub mod proxy;
pub mod real;
pub mod transcript;
pub mod workload;

pub use codis::{CodisDouble, DoubleOptions, Fault, MigrationHold, Snapshot};
pub use forwarder::Forwarder;
pub use process::{bind_loopback, free_port, EtcdServer, RedisServer};
pub use proxy::{ProxyDouble, ProxyOptions};
pub use workload::{Ledger, Verification, Workload, WorkloadOptions};
