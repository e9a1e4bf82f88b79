//! Client for kube (to be filled in).

/// Failures talking to kube.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Placeholder.
    #[error("kube: {0}")]
    Other(String),
}
