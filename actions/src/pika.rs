//! Client for pika (to be filled in).

/// Failures talking to pika.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Placeholder.
    #[error("pika: {0}")]
    Other(String),
}
