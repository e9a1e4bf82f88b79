//! Cluster facts shared by the topology actions: the clients of one run, which Codis group is which shard, where a
//! server really is, the per-cluster topology lock, and the replication verbs every action needs.
//!
//! The shard ↔ group mapping is never stored locally: a group's servers are `<pod fqdn>:<port>` and a pod FQDN names
//! its shard's headless service, so Codis itself says which shard a group serves. Only a group that has no server
//! yet (a crash between creating it and adding its first server) needs the reservation kept in etcd.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::clients::codis::{Dashboard, Group, Stats};
use crate::clients::etcd::{self, Etcd, LockGuard};
use crate::clients::pika::{self, Pika, Replication};
use crate::clients::server::ServerAddr;
use crate::error::{Error, Result};
use crate::input::address::HostPort;
use crate::input::context::Context;
use crate::input::event::{Common, Pod};
use crate::input::vars;

/// How long one HTTP, RESP or etcd call may take before it counts as failed.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a topology lock outlives a holder that crashed.
pub const LOCK_TTL: Duration = Duration::from_secs(15);
/// How often replication and migration progress is polled.
pub const POLL: Duration = Duration::from_millis(100);

/// The clients of one run and what they were built from.
pub struct Session<'a> {
    /// The run's context.
    pub ctx: &'a Context,
    /// The event's common fields.
    pub common: &'a Common,
    /// The codis-dashboard.
    pub dashboard: Dashboard,
    /// etcd, when the action was given endpoints.
    pub etcd: Option<Etcd>,
}

impl std::fmt::Debug for Session<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("dashboard", &self.common.codis.dashboard).finish_non_exhaustive()
    }
}

/// etcd was needed and did not answer; nothing was changed.
#[derive(Debug, thiserror::Error)]
#[error("{purpose}, which needs etcd")]
pub struct EtcdNeeded {
    /// What the run had to do.
    pub purpose: String,
    /// Why etcd could not be used.
    #[source]
    pub source: etcd::Error,
}

/// etcd for `purpose`, connected within `timeout`. Which runs need etcd is decided by their callers; what its
/// absence means is decided here, once: no endpoints is a configuration error naming `ETCD_ENDPOINTS` (exit 2),
/// endpoints that do not answer are [`EtcdNeeded`].
pub async fn connect_etcd(common: &Common, purpose: &str, timeout: Duration) -> Result<Etcd> {
    if common.etcd.is_empty() {
        return Err(Error::invalid(vars::ETCD_ENDPOINTS, format!("is not set, and {purpose}; nothing was changed")));
    }
    Etcd::connect(&common.etcd, timeout)
        .await
        .map_err(|source| EtcdNeeded { purpose: purpose.to_owned(), source }.into())
}

impl<'a> Session<'a> {
    /// Connects to the dashboard (checking the product name) and, when endpoints are given, to etcd; etcd not
    /// answering fails the run (every topology change takes the lock there first).
    pub async fn open(ctx: &'a Context, common: &'a Common) -> Result<Self> {
        Self::connect(ctx, common, true).await
    }

    /// Like [`Session::open`] for subcommands that change nothing in etcd and only read it when it answers
    /// (`rejoin`, `topology`): etcd down is logged and the session has none, so that a pod restarting while etcd
    /// is down still rejoins its group's master instead of coming back with whatever role it persisted.
    pub async fn open_without_etcd_if_down(ctx: &'a Context, common: &'a Common) -> Result<Self> {
        Self::connect(ctx, common, false).await
    }

    async fn connect(ctx: &'a Context, common: &'a Common, etcd_required: bool) -> Result<Self> {
        let timeout = ctx.budget.cap(CALL_TIMEOUT);
        let dashboard = Dashboard::connect(&common.codis.dashboard, common.codis.product.as_deref(), timeout)
            .await
            .map_err(|e| match e {
                // The configuration names another product than the dashboard serves: invalid configuration (exit 2),
                // found before anything was changed, and no retry will fix it.
                crate::clients::codis::Error::ProductMismatch { expected, actual } => Error::invalid(
                    vars::CODIS_PRODUCT_NAME,
                    format!(
                        "is {expected:?} but the dashboard at {} serves product {actual:?}; nothing was changed",
                        common.codis.dashboard
                    ),
                ),
                other => other.into(),
            })?;
        let etcd = if common.etcd.is_empty() {
            None
        } else {
            match Etcd::connect(&common.etcd, ctx.budget.cap(CALL_TIMEOUT)).await {
                Ok(etcd) => Some(etcd),
                Err(e) if !etcd_required => {
                    tracing::warn!(error = %e, "etcd is not answering; going on without it");
                    None
                }
                Err(e) => return Err(e.into()),
            }
        };
        Ok(Self { ctx, common, dashboard, etcd })
    }

    /// etcd, which every topology change needs.
    pub fn etcd(&self) -> Result<&Etcd> {
        self.etcd.as_ref().ok_or_else(|| Error::invalid(vars::ETCD_ENDPOINTS, "is not set"))
    }

    /// etcd for `purpose`: the session's own connection when it has one, else a new one ([`connect_etcd`]), for a
    /// run that found out only now that it must change something.
    pub async fn etcd_for(&self, purpose: &str) -> Result<Etcd> {
        match &self.etcd {
            Some(etcd) => Ok(etcd.clone()),
            None => connect_etcd(self.common, purpose, self.ctx.budget.cap(CALL_TIMEOUT)).await,
        }
    }

    /// This session's clients with `etcd`.
    #[must_use]
    pub fn with_etcd(&self, etcd: Etcd) -> Self {
        Self { ctx: self.ctx, common: self.common, dashboard: self.dashboard.clone(), etcd: Some(etcd) }
    }

    /// This cluster's key prefix in etcd.
    #[must_use]
    pub fn prefix(&self) -> String {
        etcd::cluster_prefix(&self.common.cluster.namespace, &self.common.cluster.name)
    }

    /// Takes the cluster's topology lock so that topology changes of different actions never interleave.
    /// A lock held by someone else past a third of the budget ends the run with exit 75: KubeBlocks retries it.
    pub async fn lock_topology(&self) -> Result<LockGuard> {
        let key = format!("{}/locks/topology", self.prefix());
        let holder = format!("{} {}", self.ctx.action, std::process::id());
        let wait = self.ctx.budget.cap(self.ctx.budget.remaining() / 3);
        match self.etcd()?.lock(&key, LOCK_TTL, wait, &holder).await {
            Ok(guard) => Ok(guard),
            Err(etcd::Error::LockBusy { holder, .. }) => Err(Error::InProgress {
                progress: format!(
                    "waiting for the cluster's topology lock, held by {}",
                    holder.as_deref().unwrap_or("another action")
                ),
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// Runs `work` holding the cluster's topology lock ([`Session::lock_topology`]), and releases the lock whatever
    /// `work` returned: the one way every action changes the topology.
    pub async fn under_topology_lock<T>(&self, work: impl AsyncFnOnce(&LockGuard) -> Result<T>) -> Result<T> {
        let mut lock = self.lock_topology().await?;
        let result = work(&lock).await;
        release(&mut lock).await;
        result
    }

    /// The dashboard's current view.
    pub async fn stats(&self) -> Result<Stats> {
        Ok(self.dashboard.stats().await?)
    }

    /// The address Codis knows `pod` by: `<fqdn>:<PIKA_PORT>`.
    #[must_use]
    pub fn server(&self, pod: &Pod) -> String {
        pod.server(self.common.pika.port)
    }

    /// Where `server` really is (`PIKA_ADDRESS_OVERRIDES` applied).
    pub fn dial(&self, server: &str) -> Result<HostPort> {
        Ok(pika::dial_address(server, &self.common.pika.overrides)?)
    }

    /// A connection to the pika behind `server`.
    pub async fn pika(&self, server: &str) -> Result<Pika> {
        let at = self.dial(server)?;
        let timeout = self.ctx.budget.cap(CALL_TIMEOUT);
        Ok(Pika::connect(&at, self.ctx.secrets.pika_password.as_deref(), timeout).await?)
    }

    /// `INFO replication` of `server`.
    pub async fn replication(&self, server: &str) -> Result<Replication> {
        Ok(self.pika(server).await?.info_replication().await?)
    }

    /// Makes `replica` replicate `master` and persists it (SLAVEOF, then CONFIG REWRITE so a restart keeps the
    /// role). Nothing is sent when it already follows `master`: pika answers a repeated SLAVEOF with a full resync
    /// only when the spelling differs, but there is no reason to ask at all.
    pub async fn ensure_follows(&self, replica: &str, master: &str) -> Result<bool> {
        refuse_alias(replica)?;
        let master_at = self.dial(master)?;
        let conn = self.pika(replica).await?;
        let info = conn.info_replication().await?;
        if info.follows(&master_at) {
            return Ok(false);
        }
        tracing::info!(replica, master, "pointing replica at master");
        conn.slaveof(&master_at).await?;
        conn.config_rewrite().await?;
        Ok(true)
    }

    /// Makes `server` a master (SLAVEOF NO ONE, persisted) unless it already is one. An alias is only checked: the
    /// pika behind it is another group's, and is never commanded through this one.
    pub async fn ensure_master(&self, server: &str) -> Result<bool> {
        let conn = self.pika(server).await?;
        let info = conn.info_replication().await?;
        if info.role == pika::Role::Master {
            return Ok(false);
        }
        refuse_alias(server)?;
        tracing::info!(server, "making server a master");
        conn.slaveof_no_one().await?;
        conn.config_rewrite().await?;
        Ok(true)
    }

    /// Waits until `replica` follows `master` with its link up; the budget running out ends the run with exit 75.
    pub async fn wait_link_up(&self, replica: &str, master: &str) -> Result<()> {
        let master_at = self.dial(master)?;
        loop {
            match self.replication(replica).await {
                Ok(info) if info.follows(&master_at) && info.link_up => return Ok(()),
                Ok(_) => {}
                Err(e) => tracing::debug!(replica, error = %e, "replica not answering yet"),
            }
            self.ctx.budget.check(|| format!("waiting for {replica} to sync from {master}"))?;
            tokio::time::sleep(self.ctx.budget.cap(POLL)).await;
        }
    }
}

/// Refuses to command `server` when it is an alias ([`ServerAddr::is_alias`]).
fn refuse_alias(server: &str) -> Result<()> {
    if ServerAddr::of(server).is_alias() {
        return Err(crate::steps::split::Refusal::AliasCommanded { server: server.to_owned() }.into());
    }
    Ok(())
}

/// Releases the topology lock; a failure only delays the next holder until the lease expires, so it is logged.
pub async fn release(lock: &mut LockGuard) {
    if let Err(e) = lock.release().await {
        tracing::warn!(error = %e, "could not release the topology lock; it expires by itself");
    }
}

/// The group serving `shard`, recognised by its servers.
#[must_use]
pub fn group_of_shard<'s>(stats: &'s Stats, shard: &str) -> Option<&'s Group> {
    stats.group.models.iter().find(|g| g.servers.iter().any(|s| ServerAddr::of(&s.server).shard() == Some(shard)))
}

/// The shard each group with servers serves.
#[must_use]
pub fn shards_by_group(stats: &Stats) -> BTreeMap<u32, String> {
    stats
        .group
        .models
        .iter()
        .filter_map(|g| {
            g.servers.iter().find_map(|s| ServerAddr::of(&s.server).shard()).map(|shard| (g.id, shard.to_owned()))
        })
        .collect()
}

/// Group reservations kept in etcd: `<prefix>/groups/<gid>` → shard, written before the group is created.
pub async fn reservations(etcd: &Etcd, prefix: &str) -> Result<BTreeMap<u32, String>> {
    let dir = format!("{prefix}/groups/");
    let mut out = BTreeMap::new();
    for (key, entry) in etcd.list(&dir).await? {
        if let Some(gid) = key.strip_prefix(&dir).and_then(|g| g.parse().ok()) {
            out.insert(gid, entry.value);
        }
    }
    Ok(out)
}
