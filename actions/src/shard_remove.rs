//! The `shard-remove` action.

use crate::context::Context;
use crate::error::{Error, Result};

/// Runs the action.
pub async fn run(ctx: &Context) -> Result<String> {
    let _ = ctx;
    Err(Error::Refused("shard-remove is not implemented yet".into()))
}
