//! `pre-terminate` (1.0.x): a shard component about to be deleted. With `KB_CLUSTER_COMPONENT_IS_SCALING_IN=true`
//! the shard is drained and removed from Codis exactly as `shard-remove` does ([`drain`](crate::drain)), onto the
//! shards that are not being deleted; otherwise the whole cluster is going, and nothing is touched: the action
//! returns at once, without even connecting to Codis.

use crate::cluster::Session;
use crate::context::Context;
use crate::drain::{self, LegacyDecision};
use crate::error::{Error, Result};
use crate::event::Event;

/// Runs the action.
pub async fn run(ctx: &Context) -> Result<String> {
    let Event::PreTerminate { common, shard, shards, legacy, scaling_in } = &ctx.event else {
        return Err(Error::Refused("pre-terminate got another action's event".into()));
    };
    match drain::legacy_decision(&common.cluster.name, &shard.name, shards, &legacy.deleting, *scaling_in) {
        LegacyDecision::Nothing(why) => Ok(why),
        LegacyDecision::Drain { remaining } => {
            let s = Session::open(ctx).await?;
            drain::remove_shard(&s, &shard.name, &remaining).await
        }
    }
}
