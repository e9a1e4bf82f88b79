//! `shard-add` (1.1+): the shard named by KB_ADD_SHARD_NAME registered as a group, then slots moved onto it with
//! the fewest moves.

use std::collections::BTreeMap;

use crate::cluster::{self, release, Session};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::rebalance;
use crate::register;

/// Runs the action.
pub async fn run(ctx: &Context) -> Result<String> {
    let Event::ShardAdd { shards, added, .. } = &ctx.event else {
        return Err(Error::Refused("shard-add got another action's event".into()));
    };
    let new = shards
        .iter()
        .find(|sh| &sh.name == added)
        .ok_or_else(|| Error::invalid(crate::vars::KB_ADD_SHARD_NAME, format!("{added} is not a listed shard")))?;
    let s = Session::open(ctx).await?;
    let mut lock = s.lock_topology().await?;
    let result = async {
        let reg = register::ensure_shard(&s, new, &new.pods).await?;
        // Every listed shard that is registered takes part; one still waiting for its own shardAdd joins then.
        let stats = s.stats().await?;
        let groups: BTreeMap<&str, u32> = shards
            .iter()
            .filter_map(|sh| cluster::group_of_shard(&stats, &sh.name).map(|g| (sh.name.as_str(), g.id)))
            .collect();
        let targets: Vec<u32> = groups.values().copied().collect();
        let outcome = rebalance::balance(&s, &targets, "rebalance").await?;
        Ok(format!(
            "{added} registered as group {} (master {}); {} slot(s) migrated onto {} group(s) (critical path {} \
             rounds, lower bound {})",
            reg.gid,
            reg.master,
            outcome.created,
            targets.len(),
            outcome.critical_path,
            outcome.lower_bound
        ))
    }
    .await;
    release(&mut lock).await;
    result
}
