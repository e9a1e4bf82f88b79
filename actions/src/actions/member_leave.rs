//! `member-leave`: the leaving pod's server is removed from its Codis group, so that it never stays listed in the
//! dashboard. KubeBlocks runs it on replica scale-in after `switchover` — whose errors it ignores — and requeues it
//! every second until it succeeds, so the leaving pod may still be the master, or already dead.
//!
//! A master is never deleted while it is one: the best replica is promoted first through the fenced transfer of
//! [`crate::steps::transfer`] (a dead master's most advanced replica), and a group's last server is deleted only when the
//! group owns no slots. Pika's Codis fork may fail a master over and reorder a group's servers at any time, so the
//! group is re-read before every step and the step chosen from what Codis says now. A pod Codis never knew is
//! success.

use crate::clients::codis::Stats;
use crate::error::{Error, Result};
use crate::input::context::Context;
use crate::steps::cluster::{release, Session};
use crate::steps::transfer::{self, Transfer};

/// Why a member was not removed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Removing the group's last server would leave its slots with no server.
    #[error(
        "{server} is the last server of group {gid}, which owns {owned} slot(s): a master is never deleted while \
         its group serves slots; remove the shard (drain it) instead"
    )]
    LastServerWithSlots {
        /// The leaving server.
        server: String,
        /// Its group.
        gid: u32,
        /// The slots the group owns.
        owned: usize,
    },
}

/// Runs the action.
pub async fn run(ctx: &Context, event: &crate::input::event::MemberLeave) -> Result<String> {
    let crate::input::event::MemberLeave { common, member, .. } = event;
    let s = Session::open(ctx, common).await?;
    let server = s.server(&member.fqdn);
    if s.stats().await?.group_of_server(&server).is_none() {
        return Ok(format!("{server} is in no codis group; nothing to do"));
    }
    s.under_topology_lock(async |lock| leave(&s, lock, &server).await).await
}

/// The steps, each chosen from a fresh read of the group.
async fn leave(s: &Session<'_>, lock: &crate::clients::etcd::LockGuard, server: &str) -> Result<String> {
    let mut notes = Vec::new();
    for _ in 0..20 {
        s.ctx.budget.check(|| format!("removing {server} from its group: {}", notes.join("; ")))?;
        let stats = s.stats().await?;
        let Some(group) = stats.group_of_server(server) else {
            notes.push(format!("{server} is no longer in any group"));
            return Ok(notes.join("; "));
        };
        let gid = group.id;
        let is_master = group.master().is_some_and(|m| m.eq_ignore_ascii_case(server));
        if group.is_promoting() || (is_master && group.servers.len() > 1) {
            // Promote another member first (or finish the promote in progress), then look again. A leaving master
            // that no longer answers is moved away from without asking it anything.
            let unplanned = is_master && s.replication(server).await.is_err();
            let t = Transfer { gid, from: server.to_owned(), candidate: None, rollout: None, unplanned };
            let mut group_lock = transfer::lock_group(s, gid, s.ctx.budget.cap(s.ctx.budget.remaining() / 3)).await?;
            let outcome = transfer::move_master(s, &[lock, &group_lock], &t).await;
            release(&mut group_lock).await;
            notes.push(outcome?.describe(server));
            continue;
        }
        if is_master {
            let owned = owned_slots(&stats, gid);
            if owned > 0 {
                return Err(Refusal::LastServerWithSlots { server: server.to_owned(), gid, owned }.into());
            }
        }
        if !is_master {
            // A transfer away from this server may have crashed before every member followed the new master:
            // finish it first, or a replica could be left following a pod that is gone.
            if !transfer::is_converged(s, group).await? {
                notes.push(transfer::converge(s, gid).await?.describe());
            }
            if let Some(master) = group.master() {
                transfer::clear_fence(s, gid, master).await;
            }
        }
        if let Some(g) = crate::steps::split::aliased_by(&stats, server) {
            return Err(Error::InProgress {
                progress: format!("{server} stays in group {gid} while group {} splits off it", g.id),
            });
        }
        tracing::info!(gid, server, "removing server from group");
        match s.dashboard.group_del(gid, server).await {
            Ok(()) => notes.push(format!("removed {server} from group {gid}")),
            // Codis changed under us (the fork's HA reordered the group, a promote started, someone removed it):
            // the next round reads it again.
            Err(e) if e.is_not_member() || e.is_promoting() || e.is_master_in_use() => {
                tracing::info!(gid, server, error = %e, "group changed; looking again");
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(Error::InProgress {
        progress: format!("{server} is still in a group that keeps changing: {}", notes.join("; ")),
    })
}

/// Slots the group owns or receives.
fn owned_slots(stats: &Stats, gid: u32) -> usize {
    stats.slots_of(gid).len() + stats.slots_targeting(gid).len()
}
