//! Client for etcd (to be filled in).

/// Failures talking to etcd.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Placeholder.
    #[error("etcd: {0}")]
    Other(String),
}
