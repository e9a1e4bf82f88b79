//! `shard-add` (1.1+): the shard named by KB_ADD_SHARD_NAME registered as a group, then slots moved onto it with the
//! fewest moves over the whole change.
//!
//! Its share is its size in the final topology: every shard `ALL_SHARDS_POD_FQDNS` lists counts, registered or not
//! (KubeBlocks lists a scale-out's new shards as soon as their Components exist), minus those recorded as leaving. So
//! four shards added in one request move exactly the slots one rebalance over all eight would, whatever order and
//! overlap their shardAdds run in; one whose group is not there yet takes the rest when it registers.
//!
//! When that step feeds the new shard a large enough share of one donor (4→8, 8→16, 2→4, 1→2: half of one old shard's
//! slots, its whole fill; 3→4, 2→3: a quarter or a third of one donor, part of it), the shard takes that share by a
//! split ([`split`]): its pods copy the donor's master by replication and the slots change hands without a key
//! migrated, so that share costs a replica's sync instead of Codis's executor rounds. The rest migrates once the
//! split is done; small shares (4→5) only migrate.
//!
//! KubeBlocks 1.1 runs the shardAdds of one reconcile one after another, each call blocking, so a call that waited
//! for its own migrations would hold back the next shard's registration and serialise the change. While other listed
//! shards have no group yet, a call therefore hands its migrations to Codis and exits 75 at once; the next call (the
//! next reconcile) waits for what is left. The last shard to register waits, beside everyone else's migrations. A
//! split is handed off the same way while other shards of the change are still to be filled: its pods keep copying
//! the donor in the meantime, and the next run promotes and cleans up. That run completes, beside its own, every other
//! split of the change under way, so the splits of a 4→8 overlap instead of taking one shardAdd each in turn.

use std::collections::BTreeSet;

use crate::error::{Error, Result};
use crate::input::context::Context;
use crate::input::event::Shard;
use crate::plan::Goal;
use crate::steps::cluster::{self, Session};
use crate::steps::drain;
use crate::steps::rebalance::{self, Aim, Handoff, Own};
use crate::steps::register;
use crate::steps::split::{self, Start};

/// Runs the action.
pub async fn run(ctx: &Context, event: &crate::input::event::ShardAdd) -> Result<String> {
    let crate::input::event::ShardAdd { common, shards, added, .. } = event;
    let new = shards.iter().find(|sh| &sh.name == added).ok_or_else(|| {
        Error::invalid(crate::input::vars::KB_ADD_SHARD_NAME, format!("{added} is not a listed shard"))
    })?;
    let s = Session::open(ctx, common).await?;
    let leaving = drain::recorded_leavers(&s).await?;
    let staying = |leaving: &BTreeSet<String>| -> Vec<&str> {
        shards.iter().map(|sh| sh.name.as_str()).filter(|n| !leaving.contains(*n)).collect()
    };
    let goal_of = |stats: &crate::clients::codis::Stats, leaving: &BTreeSet<String>| -> Goal {
        let names = staying(leaving);
        let receivers: Vec<u32> =
            names.iter().filter_map(|n| cluster::group_of_shard(stats, n)).map(|g| g.id).collect();
        let unregistered = names.len() - receivers.len();
        Goal::new(receivers, unregistered)
    };
    let start =
        s.under_topology_lock(async |_| split::register(&s, new, |stats| goal_of(stats, &leaving)).await).await?;
    let split = match start {
        Start::Registered(reg) => {
            // Replication catches up outside the lock: other shards of the change register and plan meanwhile.
            register::settle(&s, &reg, &new.pods).await?;
            None
        }
        Start::Splitting { gid, began } => {
            // Other shards of the change still to be filled begin their own split (or migrations) in the next
            // shardAdd while this one's pods copy the donor; the next run of this one completes it. Only the run
            // that began the split hands off, as a run hands off only the migrations it created.
            let stats = s.stats().await?;
            let unfilled = staying(&leaving)
                .iter()
                .filter(|n| **n != added)
                .filter(|n| cluster::group_of_shard(&stats, n).is_none_or(|g| stats.slots_of(g.id).is_empty()))
                .count();
            if began && unfilled > 0 {
                return Err(Error::InProgress {
                    progress: format!(
                        "{added} (group {gid}) is splitting off its donor; {unfilled} other shard(s) of this change are \
                         not filled yet: returning so that their shardAdd can run; the next run completes the split"
                    ),
                });
            }
            Some(complete_splits(&s, new, gid, shards, &staying(&leaving)).await?)
        }
    };
    let reg = s.under_topology_lock(async |_| register::register(&s, new, &new.pods).await).await?;
    register::settle(&s, &reg, &new.pods).await?;

    let first = s.stats().await?;
    let leaving = drain::recorded_leavers(&s).await?;
    let others_unregistered =
        staying(&leaving).iter().filter(|n| **n != added && cluster::group_of_shard(&first, n).is_none()).count();
    let handoff = match others_unregistered {
        0 => Handoff::Wait,
        n => Handoff::ReturnAfterSubmitting(format!(
            "{n} other shard(s) of this change have no group yet: returning so that their shardAdd can run; the next \
             run waits for these migrations"
        )),
    };
    let aim_of = |stats: &crate::clients::codis::Stats, leaving: &BTreeSet<String>| -> Result<Aim> {
        Ok(Aim { goal: goal_of(stats, leaving), own: Own::Receiver(reg.gid) })
    };
    let outcome = rebalance::converge(&s, "rebalance", aim_of, handoff).await?;
    let stats = s.stats().await?;
    let names = staying(&drain::recorded_leavers(&s).await?);
    let groups = names.iter().filter(|n| cluster::group_of_shard(&stats, n).is_some()).count();
    let copied = split.map_or_else(String::new, |f| {
        format!(
            "; split off group {} by replication: {} slot(s) handed over, {} + {} key(s) of slots not owned deleted",
            f.donor.map_or_else(|| "?".to_owned(), |d| d.to_string()),
            f.slots,
            f.deleted.0,
            f.deleted.1
        )
    });
    Ok(format!(
        "{added} registered as group {} (master {}){copied}; {} slot(s) migrated onto {} group(s) of {} in the final \
         topology (critical path {} rounds, lower bound {})",
        reg.gid,
        reg.master,
        outcome.created,
        groups,
        names.len(),
        outcome.critical_path,
        outcome.lower_bound
    ))
}

/// Completes the split of `new` (group `gid`) and, at the same time, every other split of the change under way: a
/// group of a shard among `names` that lists an alias and serves slots (begun by its own shardAdd). KubeBlocks runs
/// the shardAdds one after another, each call blocking, so a call that completed only its own split would serialise
/// the change's splits; their waits (copies, re-links, cleanups) overlap instead, and the topology lock still orders
/// their cutovers. Another shard's split that does not finish here is left to its own shardAdd, which reports it.
async fn complete_splits(
    s: &Session<'_>,
    new: &Shard,
    gid: u32,
    shards: &[Shard],
    names: &[&str],
) -> Result<split::Finished> {
    let stats = s.stats().await?;
    let others: Vec<(&Shard, u32)> = shards
        .iter()
        .filter(|sh| sh.name != new.name && names.contains(&sh.name.as_str()))
        .filter_map(|sh| {
            let group = cluster::group_of_shard(&stats, &sh.name)?;
            (split::alias_in(group).is_some() && !stats.slots_of(group.id).is_empty()).then_some((sh, group.id))
        })
        .collect();
    if !others.is_empty() {
        tracing::info!(gid, others = others.len(), "completing the change's other splits beside this one");
    }
    let theirs = futures_util::future::join_all(others.iter().map(|&(sh, g)| split::complete(s, sh, g)));
    let (own, theirs) = tokio::join!(split::complete(s, new, gid), theirs);
    for ((sh, g), result) in others.iter().zip(theirs) {
        if let Err(e) = result {
            tracing::info!(shard = %sh.name, gid = g, error = %e.one_line(), "that split goes on in its own shardAdd");
        }
    }
    own
}
