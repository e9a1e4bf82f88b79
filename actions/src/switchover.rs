//! `switchover`: KubeBlocks calls it for every pod just before restarting or removing it, with no candidate (one
//! comes only from a Switchover OpsRequest), and ignores its errors. For a replica — or a pod Codis does not know —
//! nothing moves; for the group's master, mastership moves once, fenced and confirmed ([`crate::transfer`]).
//!
//! Which replica: the candidate when given (exit 2 if it is not a healthy member of the same group); otherwise a
//! healthy one (link up, smallest lag) that the rollout in progress has already updated, so that the rollout moves
//! the master exactly once. "Already updated" comes from the InstanceSet's update revision and the pods' revision
//! labels when the Kubernetes API answers (the in-cluster one, or `KUBE_API_URL`); without it the ordinal rule of
//! reference/primary-transfer.md §4 decides (highest ordinal above the master, else the lowest below), which under
//! KubeBlocks' role-ordered rollout (replicas first, the master last) also moves the master once.

use std::time::Duration;

use crate::cluster::{release, Session};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::event::{Event, PodRef, Shard};
use crate::kube::{self, Kube};
use crate::plan::{self, RolloutFacts};
use crate::transfer::{self, Transfer};
use crate::vars;

/// Longest the rollout facts may take to read; past that the ordinal rule decides.
const KUBE_TIMEOUT: Duration = Duration::from_secs(3);

/// Runs the action.
pub async fn run(ctx: &Context) -> Result<String> {
    let Event::Switchover { common, shard, current, role, candidate, kube_api, .. } = &ctx.event else {
        return Err(Error::Refused("switchover got another action's event".into()));
    };
    let s = Session::open(ctx).await?;
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
    let mut lock = s.lock_topology().await?;
    // Whoever held the lock before may have removed the group (a drain) or moved the master already.
    if s.stats().await?.group_of_server(&me).is_none() {
        release(&mut lock).await;
        return Ok(format!("{me} left codis while waiting for the topology lock; nothing to move"));
    }
    let t = Transfer {
        gid,
        from: me.clone(),
        candidate: candidate.as_ref().map(|c| (c.name.clone(), vars::KB_SWITCHOVER_CANDIDATE_FQDN)),
        rollout: rollout.as_ref(),
    };
    let result = transfer::move_master(&s, &lock, &t).await;
    release(&mut lock).await;
    Ok(result?.describe(&me))
}

/// Exit 2, nothing touched, unless the candidate is a healthy replica of `from` in the same group.
async fn check_candidate(s: &Session<'_>, group: &crate::codis::Group, from: &str, candidate: &PodRef) -> Result<()> {
    let refuse =
        |reason: String| Error::invalid(vars::KB_SWITCHOVER_CANDIDATE_FQDN, format!("{reason}; nothing was changed"));
    let server = s.server(&candidate.fqdn);
    if group.server(&server).is_none() {
        return Err(refuse(format!("candidate {server} is not a member of group {} (the master's group)", group.id)));
    }
    let servers: Vec<String> = group.servers.iter().map(|gs| gs.server.clone()).collect();
    let infos = transfer::survey(s, &servers).await;
    let (host, port) = s.dial(from)?;
    let (current, members) = transfer::member_facts(group, from, (&host, port), &infos);
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
        let kube = match kube_api {
            Some(url) => proxy_client(url, namespace, timeout)?,
            None => Kube::in_cluster(timeout).await?,
        };
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

/// A client of the plain-http API proxy at `url` (`kubectl proxy`, or a test's stand-in): no credentials.
fn proxy_client(url: &str, namespace: &str, timeout: Duration) -> Option<Kube> {
    let uri = match url.parse() {
        Ok(uri) => uri,
        Err(e) => {
            tracing::warn!(url, error = %e, "KUBE_API_URL is not a url");
            return None;
        }
    };
    let mut config = ::kube::Config::new(uri);
    config.default_namespace = namespace.to_owned();
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
    match ::kube::Client::try_from(config) {
        Ok(client) => Some(Kube::from_client(client, namespace).with_timeout(timeout)),
        Err(e) => {
            tracing::warn!(error = %e, "cannot build a client for KUBE_API_URL");
            None
        }
    }
}
