//! The `role-probe` action.

use crate::context::Context;
use crate::error::{Error, Result};

/// Runs the action.
pub fn run(ctx: &Context) -> Result<String> {
    let _ = ctx;
    Err(Error::Refused("role-probe is not implemented yet".into()))
}
