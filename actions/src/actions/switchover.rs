//! `switchover`: KubeBlocks calls it for every pod just before restarting or removing it, with no candidate (one
//! comes only from a Switchover OpsRequest), and ignores its errors. For a replica — or a pod Codis does not know —
//! nothing moves; for the group's master, mastership moves once, fenced and confirmed ([`crate::steps::transfer`]).
//!
//! Which replica: the candidate when given (exit 2 if it is not a healthy member of the same group); otherwise a
//! healthy one (link up, smallest lag) that the rollout in progress has already updated, so that the rollout moves the
//! master exactly once. "Already updated" comes from the InstanceSet's update revision and the pods' revision labels
//! when the Kubernetes API answers (the in-cluster one, or `KUBE_API_URL`); without it tidb-operator's ordinal rule
//! decides (highest ordinal above the master, else the lowest below), which under KubeBlocks' role-ordered rollout
//! (replicas first, the master last) also moves the master once.
//!
//! One call is all it gets: in a rolling update or a replica scale-in KubeBlocks ignores any failure, exit code or
//! timeout and deletes the pod at once. So every wait is bounded inside the budget and the run never ends with exit
//! 75: a topology lock held by someone else, a transfer that does not fit in what is left of the budget, a promote
//! Codis does not confirm, or a member that cannot be re-pointed in time end it with exit 1, saying what Codis was
//! left with ([`left_behind`]): the old master still serving with nothing changed, a promote for the next transfer
//! (or the restarting pod's `rejoin`) to resume with the same address, or the new master serving with some members
//! still to re-point.

use std::time::Duration;

use crate::clients::kube::{self, Kube};
use crate::error::{Error, Result};
use crate::input::context::Context;
use crate::input::event::{PodRef, Shard};
use crate::input::vars;
use crate::plan::{self, RolloutFacts};
use crate::steps::cluster::{release, Session};
use crate::steps::transfer::{self, Transfer};

/// Longest the rollout facts may take to read; past that the ordinal rule decides.
const KUBE_TIMEOUT: Duration = Duration::from_secs(3);

/// A switchover that did not finish in its one call. KubeBlocks calls it once and ignores its failure, so these
/// end with exit 1, never 75; each says what was left behind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unfinished {
    /// The budget ran out before the transfer began.
    #[error("switchover did not finish within its one call: {progress}")]
    OutOfTime {
        /// How far it got.
        progress: String,
    },
    /// The topology lock stayed busy.
    #[error(
        "switchover of {me} gave up {progress}: it gets one call, so nothing was changed and {} stays group {gid}'s \
         master",
        if *.is_master { "it" } else { "the current master" }
    )]
    TopologyBusy {
        /// The pod.
        me: String,
        /// The group.
        gid: u32,
        /// Whether the pod is the master.
        is_master: bool,
        /// What it waited for.
        progress: String,
    },
    /// The group's transfer lock stayed busy.
    #[error("switchover of {me} gave up {progress}: it gets one call, so nothing was changed")]
    GroupBusy {
        /// The pod.
        me: String,
        /// What it waited for.
        progress: String,
    },
    /// The transfer began and did not finish.
    #[error("switchover of {me} did not finish within its one call ({progress}); {state}")]
    Transfer {
        /// The pod.
        me: String,
        /// How far it got.
        progress: String,
        /// What Codis and the pikas were left with.
        state: String,
    },
}

/// Runs the action; whatever happens, never with exit 75 (KubeBlocks would not call it again).
pub async fn run(ctx: &Context, event: &crate::input::event::Switchover) -> Result<String> {
    switch(ctx, event).await.map_err(|e| match e {
        Error::InProgress { progress } => Unfinished::OutOfTime { progress }.into(),
        other => other,
    })
}

async fn switch(ctx: &Context, event: &crate::input::event::Switchover) -> Result<String> {
    let crate::input::event::Switchover { common, shard, current, role, candidate, kube_api, .. } = event;
    let s = Session::open(ctx, common).await?;
    let me = s.server(&current.fqdn);
    let stats = s.stats().await?;
    let Some(group) = stats.group_of_server(&me) else {
        return Ok(format!("{me} is in no codis group; nothing to do"));
    };
    let gid = group.id;
    let is_master = group.master().is_some_and(|m| m.eq_ignore_ascii_case(&me));
    tracing::info!(gid, pod = %current.name, role = role.as_deref().unwrap_or(""), is_master, "switchover");

    if !is_master {
        // Codis decides who is master, not KB_SWITCHOVER_ROLE. Still finish what an earlier transfer left undone.
        if transfer::is_converged(&s, group).await? {
            // A run that died after converging the group may have left its fence; it would expire, but a
            // converged group has no transfer in flight, so remove it if it names the master we all follow.
            if let Some(master) = group.master() {
                transfer::clear_fence(&s, gid, master).await;
            }
            return Ok(format!(
                "{me} is not group {gid}'s master ({}); nothing to move",
                group.master().unwrap_or("no master")
            ));
        }
    } else if group.servers.len() < 2 {
        tracing::warn!(gid, "the master is its group's only server; nothing to move");
        return Ok(format!("{me} is group {gid}'s only server; nothing to move"));
    } else if let Some(candidate) = candidate {
        // Refuse an unfit candidate before anything is written, even the lock.
        check_candidate(&s, group, &me, candidate).await?;
    }

    let rollout = if is_master && candidate.is_none() {
        rollout_facts(ctx, &common.cluster.namespace, &common.cluster.name, shard, kube_api.as_deref()).await
    } else {
        None
    };
    let mut lock = match s.lock_topology().await {
        Ok(lock) => lock,
        Err(Error::InProgress { progress }) => {
            return Err(Unfinished::TopologyBusy { me, gid, is_master, progress }.into());
        }
        Err(e) => return Err(e),
    };
    // Whoever held the lock before may have removed the group (a drain) or moved the master already.
    if s.stats().await?.group_of_server(&me).is_none() {
        release(&mut lock).await;
        return Ok(format!("{me} left codis while waiting for the topology lock; nothing to move"));
    }
    // The failover watcher or a restarting master's rejoin may be transferring this group right now.
    let mut group_lock = match transfer::lock_group(&s, gid, ctx.budget.cap(ctx.budget.remaining() / 3)).await {
        Ok(guard) => guard,
        Err(e) => {
            release(&mut lock).await;
            return Err(match e {
                Error::InProgress { progress } => Unfinished::GroupBusy { me, progress }.into(),
                other => other,
            });
        }
    };
    let t = Transfer {
        gid,
        from: me.clone(),
        candidate: candidate.as_ref().map(|c| (c.name.clone(), vars::KB_SWITCHOVER_CANDIDATE_FQDN)),
        rollout: rollout.as_ref(),
        unplanned: false,
    };
    // Every wait inside is bounded by the budget; this bounds the calls that began just before it ran out.
    let hard = ctx.budget.remaining() + OVERRUN;
    let result = match tokio::time::timeout(hard, transfer::move_master(&s, &[&lock, &group_lock], &t)).await {
        Ok(result) => result,
        Err(_) => {
            Err(Error::InProgress { progress: format!("the transfer did not finish within the budget of {me}'s call") })
        }
    };
    release(&mut group_lock).await;
    release(&mut lock).await;
    match result {
        Ok(outcome) => Ok(outcome.describe(&me)),
        Err(Error::InProgress { progress }) => {
            let state = left_behind(&s, gid, &me).await;
            Err(Unfinished::Transfer { me, progress, state }.into())
        }
        Err(e) => Err(e),
    }
}

/// Longest a Codis, pika or etcd call that started just before the budget ran out may run on (each has its own
/// timeout of at most this); the chart's `timeoutSeconds` leaves more than this above `ACTION_BUDGET_SECONDS`.
const OVERRUN: Duration = Duration::from_secs(5);
/// Longest the last look at the group may take, after the budget ran out.
const LAST_LOOK: Duration = Duration::from_secs(1);

/// What Codis was left with by a transfer that stopped short, for the operator reading KubeBlocks' event.
async fn left_behind(s: &Session<'_>, gid: u32, from: &str) -> String {
    let stats = match tokio::time::timeout(LAST_LOOK, s.stats()).await {
        Ok(Ok(stats)) => stats,
        _ => {
            return "codis could not be read afterwards; the next transfer, rejoin or member-leave of the group \
                     resumes from whatever it shows"
                .to_owned()
        }
    };
    let Some(group) = stats.group(gid) else { return format!("group {gid} is gone from codis") };
    let master = group.master().unwrap_or("nothing");
    if group.is_promoting() {
        format!(
            "codis is still promoting in group {gid} (state {}): the next transfer, member-leave or the restarting \
             pod's rejoin resumes that promote with the same address",
            group.promoting.state.as_deref().unwrap_or("started")
        )
    } else if master.eq_ignore_ascii_case(from) {
        format!("nothing was promoted: {from} is still group {gid}'s master and serves")
    } else {
        format!(
            "codis routes group {gid} to the new master {master}; members that still follow the old one are \
             re-pointed by the next switchover of the group, or by their rejoin when they restart"
        )
    }
}

/// Exit 2, nothing touched, unless the candidate is a healthy replica of `from` in the same group.
async fn check_candidate(
    s: &Session<'_>,
    group: &crate::clients::codis::Group,
    from: &str,
    candidate: &PodRef,
) -> Result<()> {
    let refuse =
        |reason: String| Error::invalid(vars::KB_SWITCHOVER_CANDIDATE_FQDN, format!("{reason}; nothing was changed"));
    let server = s.server(&candidate.fqdn);
    if group.server(&server).is_none() {
        return Err(refuse(format!("candidate {server} is not a member of group {} (the master's group)", group.id)));
    }
    let servers: Vec<String> = group.servers.iter().map(|gs| gs.server.clone()).collect();
    let infos = transfer::survey(s, &servers).await;
    let (current, members) = transfer::member_facts(group, from, &s.dial(from)?, &infos);
    plan::choose_new_master(&current, &members, Some(&candidate.name), None)
        .map(drop)
        .map_err(|e| refuse(e.to_string()))
}

/// Which pods of this shard the rollout in progress already updated, from the Kubernetes API; `None` (the ordinal
/// rule decides) when there is no API, it does not answer in time, or it reports no update revision.
async fn rollout_facts(
    ctx: &Context,
    namespace: &str,
    cluster: &str,
    shard: &Shard,
    kube_api: Option<&str>,
) -> Option<RolloutFacts> {
    let timeout = ctx.budget.cap(KUBE_TIMEOUT);
    let read = async {
        let kube = Kube::reachable(kube_api, namespace, timeout).await?;
        let pods = match kube.component_pods(namespace, cluster, &shard.name).await {
            Ok(pods) => pods,
            Err(e) => {
                tracing::warn!(error = %e, "no rollout facts: cannot list the shard's pods");
                return None;
            }
        };
        let revisions = match kube.instance_set_revisions(namespace, &shard.name).await {
            Ok(Some(r)) if r.update_revision.is_some() || !r.update_revisions.is_empty() => r,
            Ok(_) => {
                tracing::warn!(instanceset = %shard.name, "no rollout facts: the instanceset reports no update revision");
                return None;
            }
            Err(e) => {
                tracing::warn!(error = %e, "no rollout facts: cannot read the instanceset");
                return None;
            }
        };
        let updated = kube::updated_pods(&revisions, &pods);
        tracing::info!(updated = ?updated, "rollout facts: pods already on the update revision");
        Some(RolloutFacts { updated })
    };
    match tokio::time::timeout(timeout + timeout, read).await {
        Ok(facts) => {
            if facts.is_none() {
                tracing::info!("no rollout facts; the ordinal rule decides");
            }
            facts
        }
        Err(_) => {
            tracing::warn!("no rollout facts: the kubernetes api did not answer in time; the ordinal rule decides");
            None
        }
    }
}
