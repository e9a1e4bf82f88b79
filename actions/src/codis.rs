//! Client for codis (to be filled in).

/// Failures talking to codis.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Placeholder.
    #[error("codis: {0}")]
    Other(String),
}
