//! `shard-remove` (1.1+): before KubeBlocks deletes the shard named by KB_REMOVE_SHARD_NAME, every slot of its group
//! is migrated to the remaining shards and finished, then its servers and its group are removed from Codis
//! ([`drain`](crate::drain)). An error or exit 75 makes KubeBlocks skip the deletion and retry, which resumes here.

use crate::cluster::Session;
use crate::context::Context;
use crate::drain;
use crate::error::{Error, Result};
use crate::event::Event;

/// Runs the action.
pub async fn run(ctx: &Context) -> Result<String> {
    let Event::ShardRemove { shards, removed, .. } = &ctx.event else {
        return Err(Error::Refused("shard-remove got another action's event".into()));
    };
    let remaining = drain::remaining_after(removed, shards);
    let s = Session::open(ctx).await?;
    drain::remove_shard(&s, removed, &remaining).await
}
