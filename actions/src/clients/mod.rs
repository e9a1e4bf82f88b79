//! Small typed clients, each owning its wire types and the meaning of its error texts: the codis-dashboard
//! ([`codis`]), pika over RESP ([`pika`]), etcd's locks, fences and records ([`etcd`]), the Kubernetes API ([`kube`]),
//! the one reader of the server addresses Codis lists ([`server`]), and pika's binlog on its stopped volume
//! ([`binlog`]).

pub mod binlog;
pub mod codis;
pub mod etcd;
pub mod kube;
pub mod pika;
pub mod server;
