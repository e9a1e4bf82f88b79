//! The `post-provision` action.

use crate::context::Context;
use crate::error::{Error, Result};

/// Runs the action.
pub async fn run(ctx: &Context) -> Result<String> {
    let _ = ctx;
    Err(Error::Refused("post-provision is not implemented yet".into()))
}
