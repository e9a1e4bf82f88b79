//! `watch`: the failover watcher, a long-running `pika-action` beside the codis-dashboard.
//!
//! KubeBlocks has no failover for this engine and deletes a pod even when its switchover failed, and the Pika fork's
//! own dashboard HA takes about 30 s and is not fenced; so this process replaces a dead master:
//!
//! 1. **Election.** Every copy campaigns for the lock `<cluster prefix>/locks/watcher` in etcd (lease of
//!    `WATCH_LEASE_SECONDS`, renewed in the background). Exactly one leads; the others wait in the lock's queue and
//!    take over when the leader's lease ends (released on SIGTERM, expired after a crash or a partition). A leader
//!    that cannot confirm its lease stops acting at once, and every promote checks the lease right before it is
//!    sent ([`transfer::move_master`]), so a watcher that lost its lease never acts.
//! 2. **Detection** ([`Detector`]). The leader probes each group's master (Codis's `servers[0]`) with `INFO
//!    replication` every `WATCH_PROBE_INTERVAL_MS` over a kept connection, each probe waiting up to half of
//!    `FAILOVER_DETECTION_MS` (a failed probe's connection is dropped, so the next one dials anew: a connection pika
//!    dropped without a reset fails one probe, never the master). A master whose every probe failed for the
//!    detection time is dead; one that answers within the probe deadline is not. A master new to its group starts
//!    with a clean record, so a probe sent before its promotion never fails it back. A split's alias listed as a
//!    group's master that answers as a replica counts as failing too: its donor's master was handed over meanwhile,
//!    and the split's slots go to a pika refusing writes.
//! 3. **Failover.** For a dead master of a group with replicas: take the group's transfer lock (never the topology
//!    lock, which a drain may hold while it waits on this very group), then the fenced, unplanned transfer of
//!    [`transfer`]: the most advanced replica that completed a sync is fenced in etcd, promoted through Codis
//!    (the migration executor paused for the promote when a batch is on the wire, [`crate::steps::pause`]), the
//!    other replicas follow it, and the old master is left for `rejoin` to re-point when its pod restarts. Replicas
//!    that are down are left alone: no server is ever deleted from Codis, no pod is shut down. The change is logged, stored ([`failover`]) for `topology`, and
//!    recorded as a Kubernetes Event on the Cluster when an API is reachable.
//! 4. **Repair.** The old master may come back without restarting (a network partition that heals, a frozen
//!    process): it still says `role:master`, though Codis routes to the new one. It is probed like a master, and the
//!    moment it answers its group is converged, which makes it follow the new master. Every group is also checked
//!    for members that do not follow Codis's `servers[0]` every [`REPAIR_EVERY`] and converged under the group lock;
//!    a member that a sweep (5.) finds answering as a master is converged at once: the master a switchover replaced,
//!    which pika lets go of its last replica only after the switchover has returned.
//! 5. **Replicas out of sync.** Every replica is asked each tick how its data stands. One in pika's error state
//!    or in a full sync is marked in etcd ([`transfer::distrust_key`]) and, in error, its group repaired (a full
//!    resync); the mark goes once it is seen in sync. A transfer never promotes a marked replica that is not in sync
//!    by its own word: once its master is gone, pika reports a replica that was in error like any other.
//!    A replica marked as copied in full ([`transfer::relink_key`]; the sweep marks one it sees in a full sync) is
//!    re-linked once it is in sync ([`transfer::relink`]), so that pika stops its idle rsync client now rather than
//!    inside the promote of the next switchover to it, with writes held.
//! 6. **Proxies gone for good.** Codis pushes every promote and slot change to every registered proxy and fails when
//!    one does not answer, and a proxy whose pod died without its preStop stays registered for ever. Every proxy is
//!    probed at its admin API like a master (which token answers there, within the probe deadline); one that failed
//!    every probe for the detection time is judged ([`crate::plan::proxies`]) and, when the dashboard cannot reach
//!    it either and its process is known gone (another token answers at its address, or the Kubernetes API says its
//!    pod is gone or runs no proxy container), removed with Codis's force removal, logged and announced. A failover
//!    whose promote waits on such a proxy goes through the moment it is removed.
//! 7. **Data marks.** A master first seen with replication offset zero marks its group as never having held data; one
//!    seen above zero, as having held data. `rejoin` starts an empty master with no replica left only over the first
//!    mark, and refuses otherwise (no mark: nobody can say).
//!
//! Everything the leader does is one of the crash-safe, idempotent steps of [`transfer`]: a watcher killed at any
//! point is replaced by one that finds the fence, the promote in progress or the unconverged group and finishes it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use std::time::Instant;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::budget::Budget;
use crate::clients::codis::{Dashboard, Group};
use crate::clients::etcd::{self, Etcd, LockGuard};
use crate::clients::kube::ObjectRef;
use crate::clients::pika::{self, Pika, Replication};
use crate::clients::server::ServerAddr;
use crate::error::{Error, Result};
use crate::input::address::HostPort;
use crate::input::context::Context;
use crate::input::event::Common;
use crate::input::replication::{BinlogPosition, SyncState};
use crate::plan::detector::{Detector, Verdict};
use crate::steps::cluster::{self, release, Session, CALL_TIMEOUT};
use crate::steps::failover::{self, FailoverRecord};
use crate::steps::proxies::{self, Removal};
use crate::steps::transfer::{self, RelinkMark, Transfer};

/// How often every group is checked for members that do not follow its master.
pub const REPAIR_EVERY: Duration = Duration::from_secs(30);
/// The least time between two repairs of one group that sweeps asked for.
const SWEEP_REPAIR_PACE: Duration = Duration::from_secs(1);
/// How long a failover waits for its group's transfer lock before it tries again on a later tick.
const GROUP_LOCK_WAIT: Duration = Duration::from_millis(300);
/// The first pause before a failover that failed is tried again; it doubles up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(500);
/// The longest pause between two failover attempts of one group.
const RETRY_MAX: Duration = Duration::from_secs(30);
/// The least time between two judgements of one unreachable proxy that was kept (or could not be judged).
const PROXY_JUDGE_PACE: Duration = Duration::from_secs(5);

/// The watcher's settings, from its event.
#[derive(Debug, Clone)]
struct Settings {
    detection: Duration,
    interval: Duration,
    lease: Duration,
    identity: String,
    kube_api: Option<String>,
}

impl Settings {
    fn of(event: &crate::input::event::Watch) -> Self {
        let crate::input::event::Watch { detection_ms, probe_interval_ms, lease_seconds, pod, kube_api, .. } = event;
        Self {
            detection: Duration::from_millis(*detection_ms),
            interval: Duration::from_millis(*probe_interval_ms),
            lease: Duration::from_secs(*lease_seconds),
            identity: pod.clone().unwrap_or_else(|| format!("pid-{}", std::process::id())),
            kube_api: kube_api.clone(),
        }
    }

    /// How often the leader looks at its clock: fine enough that detection is late by little.
    fn tick(&self) -> Duration {
        (self.interval / 5).clamp(Duration::from_millis(10), Duration::from_millis(50))
    }

    /// How often Codis's topology is read again: its stats carry every slot and every server's INFO, the bulk of the
    /// watcher's idle cost. A master moved by someone else is found by then; a failover re-reads before it acts.
    fn refresh(&self) -> Duration {
        (self.interval * 6).max(Duration::from_secs(3))
    }
}

/// This watcher lost its election lease mid-work: another watcher decides now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the election lease is gone; another watcher decides")]
pub struct LeaseGone;

/// Runs the watcher until SIGTERM or SIGINT.
pub async fn run(ctx: &Context, event: &crate::input::event::Watch) -> Result<String> {
    let settings = Settings::of(event);
    let common = &event.common;
    let (stop_tx, stop) = watch::channel(false);
    tokio::spawn(async move {
        wait_for_signal().await;
        let _ = stop_tx.send(true);
    });
    tracing::info!(
        identity = %settings.identity,
        detection_ms = settings.detection.as_millis(),
        probe_interval_ms = settings.interval.as_millis(),
        lease_s = settings.lease.as_secs(),
        "failover watcher starting"
    );
    let ctx = Arc::new(ctx.clone());
    let mut quiet = false;
    while !*stop.borrow() {
        match serve(&ctx, common, &settings, stop.clone()).await {
            Ok(()) => quiet = false,
            Err(e) => {
                if !quiet {
                    tracing::warn!(error = %e.one_line(), "watcher cannot work now; retrying");
                }
                quiet = true;
                let mut stop = stop.clone();
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = stop.changed() => {}
                }
            }
        }
    }
    Ok("failover watcher stopped".to_owned())
}

#[cfg(unix)]
async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("signal received; the watcher stops");
}

#[cfg(not(unix))]
async fn wait_for_signal() {
    let _ = tokio::signal::ctrl_c().await;
}

/// One term: connect, campaign, lead until the lease is lost or a stop is asked.
async fn serve(
    ctx: &Arc<Context>,
    common: &Common,
    settings: &Settings,
    mut stop: watch::Receiver<bool>,
) -> Result<()> {
    let etcd = cluster::connect_etcd(common, "the watchers elect their leader", CALL_TIMEOUT).await?;
    let dashboard = Dashboard::connect(&common.codis.dashboard, common.codis.product.as_deref(), CALL_TIMEOUT)
        .await
        .map_err(|e| match e {
            crate::clients::codis::Error::ProductMismatch { expected, actual } => Error::invalid(
                crate::input::vars::CODIS_PRODUCT_NAME,
                format!("is {expected:?} but the dashboard serves product {actual:?}"),
            ),
            other => other.into(),
        })?;
    let prefix = etcd::cluster_prefix(&common.cluster.namespace, &common.cluster.name);
    let key = transfer::watcher_key(&prefix);
    let holder = format!("watcher {} pid {}", settings.identity, std::process::id());
    let mut announced = false;
    let guard = loop {
        tokio::select! {
            _ = stop.changed() => return Ok(()),
            taken = etcd.lock(&key, settings.lease, settings.lease * 4, &holder) => match taken {
                Ok(guard) => break guard,
                Err(etcd::Error::LockBusy { holder, .. }) => {
                    if !announced {
                        tracing::info!(leader = holder.as_deref().unwrap_or("unknown"), "standing by: another watcher leads");
                        announced = true;
                    }
                }
                Err(e) => return Err(e.into()),
            },
        }
    };
    tracing::info!(lock = %key, "leading: this watcher acts on failed masters");
    let leader = Arc::new(guard);
    let result = Leader::new(ctx, settings, dashboard, etcd, Arc::clone(&leader), prefix).lead(stop).await;
    // Jobs still holding the lease are aborted by now; if one has not let go yet, dropping it revokes in the
    // background, and otherwise the lease simply expires.
    if let Ok(mut guard) = Arc::try_unwrap(leader) {
        if let Err(e) = guard.release().await {
            tracing::info!(error = %e, "could not release the election lease; it expires by itself");
        }
    }
    tracing::info!("no longer leading");
    result
}

/// What the leader knows of one group.
#[derive(Debug, Clone)]
struct GroupView {
    master: String,
    servers: usize,
    promoting: bool,
    /// The group as Codis last listed it, for the periodic convergence check.
    model: Group,
}

/// A job's result, by group.
enum JobDone {
    Failover(u32, Result<Option<FailoverRecord>>),
    Repair(u32, Result<bool>),
    Relink(String, Result<transfer::Relink>),
    CopiedAgain(String, Result<bool>),
    Proxy(String, Result<Removal>),
}

/// A replica's `INFO`, asked to learn how its data stands (never to judge whether it is alive).
struct SweepDone {
    gid: u32,
    server: String,
    result: std::result::Result<(Pika, Replication), String>,
}

/// A proxy probe's result: the token that answered at the proxy's admin address, or why none did.
struct ProxyProbeDone {
    token: String,
    sent: Instant,
    answered: Instant,
    answer: std::result::Result<String, String>,
}

/// A probe's result.
struct ProbeDone {
    server: String,
    sent: Instant,
    /// When the answer (or the failure) came: the loop may take it up later, and its delay is not the server's.
    answered: Instant,
    result: std::result::Result<(Pika, Replication), String>,
}

/// A read of the world in the background: the loop never waits on the dashboard or etcd, whose stalls (the fork's
/// dashboard hangs its whole API for most of a minute while it removes a proxy that accepts connections and never
/// answers) would otherwise hold back the probes' results until they look like a dead master.
struct Refreshed {
    lease_held: bool,
    watched: std::result::Result<crate::clients::codis::Watched, String>,
    relinks: Option<BTreeMap<String, RelinkMark>>,
}

/// The leader's state.
struct Leader<'a> {
    ctx: &'a Arc<Context>,
    settings: &'a Settings,
    dashboard: Dashboard,
    etcd: Etcd,
    lease: Arc<LockGuard>,
    prefix: String,
    detector: Detector,
    conns: BTreeMap<String, Pika>,
    groups: BTreeMap<u32, GroupView>,
    /// Old masters replaced by a failover, by group: repaired the moment they answer.
    deposed: BTreeMap<String, u32>,
    offsets: BTreeMap<String, u64>,
    positions: BTreeMap<String, BinlogPosition>,
    /// Held-data marks written or read, by group: whether the group held data.
    marked: BTreeMap<u32, bool>,
    failing_over: BTreeSet<u32>,
    repairing: BTreeSet<u32>,
    /// Replicas being asked, their kept connections, and those last seen out of sync (as marked in etcd).
    sweeping: BTreeSet<String>,
    sweep_conns: BTreeMap<String, Pika>,
    distrusted: BTreeMap<String, SyncState>,
    retry: BTreeMap<u32, (Instant, Duration)>,
    /// When a sweep may next start a repair of each group: a member that stays wrong is not repaired every tick.
    sweep_repair_after: BTreeMap<u32, Instant>,
    /// Replicas copied in full and not yet seen in sync after their re-link (as marked in etcd), and those being
    /// re-linked now.
    relinks: BTreeMap<String, RelinkMark>,
    relinking: BTreeSet<String>,
    /// When each replica was first seen in sync, since it last was not.
    in_sync_since: BTreeMap<String, Instant>,
    /// When each replica copied in full and not re-linked since was first seen trying to link, since it last was not.
    connecting_since: BTreeMap<String, Instant>,
    no_replica_warned: BTreeSet<u32>,
    /// The admin address of each registered proxy, by token; probed there like masters (a proxy gone without its
    /// preStop stays registered, and every promote waits for it). The judgement reads the dashboard's word afresh.
    proxies: BTreeMap<String, String>,
    proxy_detector: Detector,
    /// Proxies whose address last answered under another token, those being judged now, and when one kept may be
    /// judged again.
    replaced_proxies: BTreeSet<String>,
    judging_proxies: BTreeSet<String>,
    judge_proxy_after: BTreeMap<String, Instant>,
    kept_proxies_told: BTreeSet<String>,
}

impl<'a> Leader<'a> {
    fn new(
        ctx: &'a Arc<Context>,
        settings: &'a Settings,
        dashboard: Dashboard,
        etcd: Etcd,
        lease: Arc<LockGuard>,
        prefix: String,
    ) -> Self {
        Self {
            ctx,
            settings,
            dashboard,
            etcd,
            lease,
            prefix,
            detector: Detector::new(settings.detection, settings.interval),
            conns: BTreeMap::new(),
            groups: BTreeMap::new(),
            deposed: BTreeMap::new(),
            offsets: BTreeMap::new(),
            positions: BTreeMap::new(),
            marked: BTreeMap::new(),
            failing_over: BTreeSet::new(),
            repairing: BTreeSet::new(),
            sweeping: BTreeSet::new(),
            sweep_conns: BTreeMap::new(),
            distrusted: BTreeMap::new(),
            retry: BTreeMap::new(),
            sweep_repair_after: BTreeMap::new(),
            relinks: BTreeMap::new(),
            relinking: BTreeSet::new(),
            in_sync_since: BTreeMap::new(),
            connecting_since: BTreeMap::new(),
            no_replica_warned: BTreeSet::new(),
            proxies: BTreeMap::new(),
            proxy_detector: Detector::new(settings.detection, settings.interval),
            replaced_proxies: BTreeSet::new(),
            judging_proxies: BTreeSet::new(),
            judge_proxy_after: BTreeMap::new(),
            kept_proxies_told: BTreeSet::new(),
        }
    }

    async fn lead(mut self, mut stop: watch::Receiver<bool>) -> Result<()> {
        self.load_marks().await;
        let mut probes: JoinSet<ProbeDone> = JoinSet::new();
        let mut sweeps: JoinSet<SweepDone> = JoinSet::new();
        let mut jobs: JoinSet<JobDone> = JoinSet::new();
        let mut proxy_probes: JoinSet<ProxyProbeDone> = JoinSet::new();
        let mut refreshes: JoinSet<Refreshed> = JoinSet::new();
        let mut ticker = tokio::time::interval(self.settings.tick());
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut next_refresh = Instant::now();
        // A new leader checks every group at once, once it has read Codis: a watcher that died after a promote left
        // its group for the next one to converge.
        let mut next_repair: Option<Instant> = None;
        loop {
            tokio::select! {
                // Results before the clock: after any pause of this loop, what the probes found is taken up before
                // a probe still counted in flight could be judged overdue.
                biased;
                _ = stop.changed() => return Ok(()),
                Some(done) = probes.join_next(), if !probes.is_empty() => {
                    if let Ok(done) = done {
                        self.probed(done, &mut jobs).await;
                    }
                }
                Some(done) = proxy_probes.join_next(), if !proxy_probes.is_empty() => {
                    if let Ok(done) = done {
                        self.proxy_probed(done);
                    }
                }
                Some(done) = sweeps.join_next(), if !sweeps.is_empty() => {
                    if let Ok(done) = done {
                        self.swept(done, &mut jobs).await;
                    }
                }
                Some(done) = jobs.join_next(), if !jobs.is_empty() => {
                    if let Ok(done) = done {
                        // A failover moved (or tried to move) a master: read Codis again at once. A repair changes
                        // no master, and a round of them would otherwise re-read it once per group.
                        if matches!(done, JobDone::Failover(..) | JobDone::Proxy(_, Ok(Removal::Removed { .. }))) {
                            next_refresh = Instant::now();
                        }
                        self.job_done(done);
                    }
                }
                Some(done) = refreshes.join_next(), if !refreshes.is_empty() => {
                    let Ok(done) = done else { continue };
                    if !done.lease_held {
                        tracing::warn!("the election lease is gone (etcd unreachable or expired): standing down");
                        return Ok(());
                    }
                    self.refreshed(done);
                    next_repair.get_or_insert_with(Instant::now);
                }
                _ = ticker.tick() => {
                    let now = Instant::now();
                    if now >= next_refresh && refreshes.is_empty() {
                        next_refresh = now + self.settings.refresh();
                        self.start_refresh(&mut refreshes);
                    }
                    self.start_probes(&mut probes);
                    self.start_proxy_probes(&mut proxy_probes);
                    self.start_sweeps(&mut sweeps);
                    self.start_proxy_judgements(&mut jobs, now);
                    self.start_failovers(&mut jobs, now);
                    if next_repair.is_some_and(|at| now >= at) {
                        next_repair = Some(now + REPAIR_EVERY);
                        let gids: Vec<u32> = self.groups.keys().copied().collect();
                        for gid in gids {
                            self.start_repair(&mut jobs, gid, true);
                        }
                    }
                }
            }
        }
    }

    /// Checks the lease and reads Codis and the re-link marks, in the background ([`Refreshed`]).
    fn start_refresh(&self, refreshes: &mut JoinSet<Refreshed>) {
        let (lease, dashboard, etcd, prefix) =
            (Arc::clone(&self.lease), self.dashboard.clone(), self.etcd.clone(), self.prefix.clone());
        refreshes.spawn(async move {
            let lease_held = lease.is_held().await;
            let watched = dashboard.watched().await.map_err(|e| e.to_string());
            let relinks = transfer::relink_marks(&etcd, &prefix).await.ok();
            Refreshed { lease_held, watched, relinks }
        });
    }

    /// Asks every replica of every group (one question at a time each) how its data stands.
    fn start_sweeps(&mut self, sweeps: &mut JoinSet<SweepDone>) {
        let replicas: Vec<(u32, String)> = self
            .groups
            .iter()
            .flat_map(|(gid, view)| {
                view.model.servers.iter().skip(1).map(move |gs| (*gid, gs.server.to_ascii_lowercase()))
            })
            .filter(|(_, server)| !ServerAddr::of(server).is_alias())
            .collect();
        for (gid, server) in replicas {
            if !self.sweeping.insert(server.clone()) {
                continue;
            }
            let conn = self.sweep_conns.remove(&server);
            let asked = self.timed_probe(&server, conn);
            sweeps.spawn(async move { SweepDone { gid, result: asked.await, server } });
        }
    }

    /// Keeps the etcd marks of replicas out of sync up to date: a replica seen in pika's error state or a full sync
    /// is marked (and its group repaired), one seen in sync is cleared. A failover reads the marks, because once the
    /// master is gone pika reports such a replica like any other.
    async fn swept(&mut self, done: SweepDone, jobs: &mut JoinSet<JobDone>) {
        self.sweeping.remove(&done.server);
        let Ok((conn, info)) = done.result else { return };
        self.sweep_conns.insert(done.server.clone(), conn);
        // A member Codis does not list first that answers as a plain master: the master a transfer replaced, which
        // pika let go of its last replica only after the transfer had finished (its 3 s replication cron). Not one
        // this watcher is re-linking, a master for the moment between the two commands (pika takes a second or two
        // to stop its rsync client): the repair would hold the group's lock until its link is up again, which pika
        // may retry only 10 s later, and the re-link job could not send the pair again meanwhile.
        if info.role == pika::Role::Master && !self.relinking.contains(&done.server) {
            self.sweep_repair(jobs, done.gid);
        }
        let key = transfer::distrust_key(&self.prefix, &done.server);
        match info.sync {
            Some(state @ (SyncState::Error | SyncState::FullSync)) => {
                if self.distrusted.get(&done.server) != Some(&state) {
                    match self.etcd.put(&key, state.word(), None).await {
                        Ok(_) => {
                            tracing::warn!(server = %done.server, gid = done.gid, state = state.describe(), "replica out of sync: never promoted until it is in sync again");
                            self.distrusted.insert(done.server.clone(), state);
                        }
                        Err(e) => {
                            tracing::warn!(server = %done.server, error = %e, "could not mark the replica out of sync")
                        }
                    }
                }
                if state == SyncState::Error {
                    self.sweep_repair(jobs, done.gid);
                }
                if state == SyncState::FullSync && !self.relinks.contains_key(&done.server) {
                    let key = transfer::relink_key(&self.prefix, &done.server);
                    if self.etcd.put(&key, RelinkMark::Copied.word(), None).await.is_ok() {
                        self.relinks.insert(done.server.clone(), RelinkMark::Copied);
                    }
                }
            }
            _ if info.in_sync() && self.distrusted.contains_key(&done.server) => match self.etcd.delete(&key).await {
                Ok(_) => {
                    tracing::info!(server = %done.server, "replica in sync again");
                    self.distrusted.remove(&done.server);
                }
                Err(e) => tracing::warn!(server = %done.server, error = %e, "could not clear the replica's mark"),
            },
            _ => {}
        }
        let copied = self.relinks.get(&done.server) == Some(&RelinkMark::Copied);
        if copied && !info.link_up && info.sync == Some(SyncState::Connecting) {
            // Its first link after the copy dropped (nothing re-linked it): the copy is not trusted, and pika's own
            // retry about 10 s later would resume it past writes it may never have applied.
            let since = *self.connecting_since.entry(done.server.clone()).or_insert_with(Instant::now);
            if since.elapsed() >= transfer::LINK_STALL {
                self.start_copy_again(jobs, done.gid, &done.server);
            }
        } else {
            self.connecting_since.remove(&done.server);
        }
        if !info.in_sync() {
            self.in_sync_since.remove(&done.server);
        } else {
            let since = *self.in_sync_since.entry(done.server.clone()).or_insert_with(Instant::now);
            match self.relinks.get(&done.server) {
                // Left to settle first: the change that just copied it (a split's join, a shardAdd) is usually still
                // waiting on it, and pika may take 10 s to link again after the pair.
                Some(RelinkMark::Copied) if since.elapsed() < RELINK_SETTLE => {}
                Some(RelinkMark::Copied) => self.start_relink(jobs, done.gid, &done.server),
                Some(RelinkMark::Relinked) => {
                    // Only its own mark: a split that began since marks the pod copied again, for its own re-link.
                    let key = transfer::relink_key(&self.prefix, &done.server);
                    if self.etcd.delete_if_value(&key, RelinkMark::Relinked.word()).await.is_ok() {
                        tracing::info!(server = %done.server, "re-linked replica in sync again");
                        self.relinks.remove(&done.server);
                    }
                }
                None => {}
            }
        }
    }

    /// Re-links `server`, a replica of group `gid` copied in full and now in sync ([`transfer::relink`]), unless
    /// its group is being failed over or repaired.
    fn start_relink(&mut self, jobs: &mut JoinSet<JobDone>, gid: u32, server: &str) {
        if let Some(job) = self.replica_job(gid, server) {
            let server = server.to_owned();
            jobs.spawn(async move { JobDone::Relink(server, job.run().await) });
        }
    }

    /// Copies `server`, a replica of group `gid` whose first link after its full copy dropped, in full again
    /// ([`transfer::copy_again_if_dropped`]), unless its group is being failed over or repaired.
    fn start_copy_again(&mut self, jobs: &mut JoinSet<JobDone>, gid: u32, server: &str) {
        if let Some(job) = self.replica_job(gid, server) {
            let server = server.to_owned();
            jobs.spawn(async move { JobDone::CopiedAgain(server, job.copy_again().await) });
        }
    }

    /// A job on `server`, a replica of group `gid`, recorded as under way; `None` while one already is, or while its
    /// group is being failed over or repaired.
    fn replica_job(&mut self, gid: u32, server: &str) -> Option<RelinkJob> {
        if self.relinking.contains(server) || self.repairing.contains(&gid) || self.failing_over.contains(&gid) {
            return None;
        }
        self.relinking.insert(server.to_owned());
        Some(RelinkJob {
            ctx: Arc::clone(self.ctx),
            dashboard: self.dashboard.clone(),
            etcd: self.etcd.clone(),
            lease: Arc::clone(&self.lease),
            gid,
            server: server.to_owned(),
        })
    }

    /// Repairs group `gid` from a fresh read for what a sweep found, at most once every [`SWEEP_REPAIR_PACE`].
    fn sweep_repair(&mut self, jobs: &mut JoinSet<JobDone>, gid: u32) {
        let now = Instant::now();
        if self.sweep_repair_after.get(&gid).is_some_and(|after| now < *after) {
            return;
        }
        self.sweep_repair_after.insert(gid, now + SWEEP_REPAIR_PACE);
        self.start_repair(jobs, gid, false);
    }

    /// Groups with a held-data mark already, so each is written once; replicas marked out of sync.
    async fn load_marks(&mut self) {
        let dir = format!("{}/held-data/", self.prefix.trim_end_matches('/'));
        if let Ok(list) = self.etcd.list(&dir).await {
            self.marked = list
                .iter()
                .filter_map(|(k, e)| {
                    let gid = k.strip_prefix(&dir)?.parse().ok()?;
                    Some((gid, failover::HeldData::of(Some(&e.value)) == failover::HeldData::Held))
                })
                .collect();
        }
        if let Ok(marks) = transfer::distrust_marks(&self.etcd, &self.prefix).await {
            self.distrusted = marks;
        }
    }

    fn refreshed(&mut self, done: Refreshed) {
        // Transfers mark the replicas they resync in full; this is where the leader learns of them.
        if let Some(marks) = done.relinks {
            self.relinks = marks;
        }
        let (models, proxies) = match done.watched {
            Ok(watched) => (watched.groups, watched.proxies),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read codis; probing the masters known so far");
                return;
            }
        };
        let before: BTreeMap<u32, String> = self.groups.iter().map(|(gid, g)| (*gid, g.master.clone())).collect();
        self.groups = models
            .iter()
            .filter_map(|g| {
                Some((
                    g.id,
                    GroupView {
                        master: g.master()?.to_ascii_lowercase(),
                        servers: g.servers.len(),
                        promoting: g.is_promoting(),
                        model: g.clone(),
                    },
                ))
            })
            .collect();
        // A deposed master no longer in its group (or the group gone) needs nothing more.
        self.deposed.retain(|server, gid| {
            models.iter().find(|g| g.id == *gid).is_some_and(|g| {
                g.server(server).is_some() && !g.master().is_some_and(|m| m.eq_ignore_ascii_case(server))
            })
        });
        let watched: Vec<String> =
            self.groups.values().map(|g| g.master.clone()).chain(self.deposed.keys().cloned()).collect();
        let known: BTreeSet<String> = self.detector.servers().map(str::to_owned).collect();
        for server in watched.iter().filter(|s| !known.contains(*s)) {
            tracing::info!(server = %server, "probing a master");
        }
        self.detector.watch(watched);
        // A master new to its group starts with a clean record: no probe it failed as something else counts.
        for (gid, view) in &self.groups {
            if before.get(gid).is_some_and(|m| *m != view.master) {
                self.detector.restart(&view.master);
            }
        }
        let watched: BTreeSet<String> = self.detector.servers().map(str::to_owned).collect();
        self.conns.retain(|s, _| watched.contains(s));
        let replicas: BTreeSet<String> =
            models.iter().flat_map(|g| g.servers.iter().skip(1).map(|gs| gs.server.to_ascii_lowercase())).collect();
        self.sweep_conns.retain(|s, _| replicas.contains(s));
        self.proxies = proxies.into_iter().map(|p| (p.proxy.token, p.proxy.admin_addr)).collect();
        self.proxy_detector.watch(self.proxies.keys().cloned());
        let listed = |token: &String| self.proxies.contains_key(token);
        self.replaced_proxies.retain(listed);
        self.judge_proxy_after.retain(|token, _| listed(token));
        self.kept_proxies_told.retain(listed);
        // The stats just read and dropped were most of what this process ever allocated.
        crate::allocator::give_back_free_memory();
    }

    /// Whether `server` is a split's alias listed as its group's master.
    fn is_split_master(&self, server: &str) -> bool {
        ServerAddr::of(server).is_alias() && self.master_of(server).is_some()
    }

    fn master_of(&self, server: &str) -> Option<u32> {
        self.groups.iter().find(|(_, g)| g.master.eq_ignore_ascii_case(server)).map(|(gid, _)| *gid)
    }

    fn start_probes(&mut self, probes: &mut JoinSet<ProbeDone>) {
        let now = Instant::now();
        for server in self.detector.due(now) {
            let asked = self.timed_probe(&server, self.conns.get(&server).cloned());
            probes.spawn(async move {
                let result = asked.await;
                ProbeDone { result, server, sent: now, answered: Instant::now() }
            });
        }
    }

    /// `INFO replication` of `server` over `conn` (or a new connection), within the probe deadline (half the
    /// detection time): a connection the server dropped without a reset fails this probe, not the server.
    fn timed_probe(
        &self,
        server: &str,
        conn: Option<Pika>,
    ) -> impl std::future::Future<Output = std::result::Result<(Pika, Replication), String>> + Send + 'static {
        let dial = pika::dial_address(server, &self.ctx_common().pika.overrides).map_err(|e| e.to_string());
        let password = self.ctx.secrets.pika_password.clone();
        let timeout = self.detector.deadline();
        async move {
            tokio::time::timeout(timeout, probe(conn, dial, password, timeout))
                .await
                .unwrap_or_else(|_| Err(format!("no answer within {} ms", timeout.as_millis())))
        }
    }

    fn ctx_common(&self) -> &Common {
        // The event is a watch event, which has common fields (checked in `run`).
        self.ctx.event.common().unwrap_or_else(|| unreachable!("watch events carry common fields"))
    }

    async fn probed(&mut self, done: ProbeDone, jobs: &mut JoinSet<JobDone>) {
        let now = done.answered;
        match done.result {
            // A split's alias that answers as a replica: its donor's master was handed over (by `rejoin`) while the
            // split went on, so the proxies send the split's slots to a pika that refuses writes. Nothing but a new
            // master of the new group serves them again; to the failover it is as gone as a dead master.
            Ok((conn, info)) if info.role.is_slave() && self.is_split_master(&done.server) => {
                self.conns.insert(done.server.clone(), conn);
                let why = "the alias of the donor's master names a replica now: the donor's master moved".to_owned();
                self.detector.report(&done.server, done.sent, Err(why), now);
            }
            Ok((conn, info)) => {
                let was_failing = self.detector.is_failing(&done.server);
                self.detector.report(&done.server, done.sent, Ok(()), now);
                self.conns.insert(done.server.clone(), conn);
                if was_failing {
                    tracing::info!(server = %done.server, "answers again");
                }
                if let Some(position) = info.position {
                    self.positions.insert(done.server.clone(), position);
                }
                if let Some(offset) = info.offset {
                    self.offsets.insert(done.server.clone(), offset);
                    if let Some(gid) = self.master_of(&done.server) {
                        let known = self.marked.get(&gid).copied();
                        let key = failover::held_data_key(&self.prefix, gid);
                        if offset > 0 && known != Some(true) {
                            match self.etcd.put(&key, &format!("{} offset {offset}", done.server), None).await {
                                Ok(_) => {
                                    self.marked.insert(gid, true);
                                }
                                Err(e) => tracing::debug!(gid, error = %e, "could not mark the group as holding data"),
                            }
                        } else if offset == 0 && known.is_none() {
                            // Never over a mark of data: another leader may have seen a write this one did not.
                            match self.etcd.put_if_absent(&key, failover::NEVER_HELD, None).await {
                                Ok(_) => {
                                    self.marked.insert(gid, false);
                                }
                                Err(e) => tracing::debug!(gid, error = %e, "could not mark the group as empty"),
                            }
                        }
                    }
                }
                // A replaced master that answers again still thinks it is one: make it follow now.
                if let Some(&gid) = self.deposed.get(&done.server) {
                    if info.role == pika::Role::Master {
                        self.start_repair(jobs, gid, false);
                    }
                }
            }
            Err(error) => {
                self.detector.report(&done.server, done.sent, Err(error), now);
                self.conns.remove(&done.server);
            }
        }
    }

    /// Asks every registered proxy due for a probe which token answers at its admin address, within the probe
    /// deadline.
    fn start_proxy_probes(&mut self, probes: &mut JoinSet<ProxyProbeDone>) {
        let now = Instant::now();
        for token in self.proxy_detector.due(now) {
            let Some(admin_addr) = self.proxies.get(&token) else { continue };
            let at = pika::dial_address(admin_addr, &self.ctx_common().pika.overrides).map_err(|e| e.to_string());
            let dashboard = self.dashboard.clone();
            let timeout = self.proxy_detector.deadline();
            probes.spawn(async move {
                let answer = match at {
                    Ok(at) => match tokio::time::timeout(timeout, dashboard.proxy_token_at(&at)).await {
                        Ok(answer) => answer.map_err(|e| e.to_string()),
                        Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
                    },
                    Err(e) => Err(e),
                };
                ProxyProbeDone { token, sent: now, answered: Instant::now(), answer }
            });
        }
    }

    fn proxy_probed(&mut self, done: ProxyProbeDone) {
        let outcome = match done.answer {
            Ok(answering) if answering == done.token => {
                self.replaced_proxies.remove(&done.token);
                if self.kept_proxies_told.remove(&done.token) {
                    tracing::info!(token = %done.token, "proxy answers again");
                }
                Ok(())
            }
            Ok(answering) => {
                self.replaced_proxies.insert(done.token.clone());
                Err(format!("another proxy (token {answering}) answers at its address"))
            }
            Err(e) => {
                self.replaced_proxies.remove(&done.token);
                Err(e)
            }
        };
        self.proxy_detector.report(&done.token, done.sent, outcome, done.answered);
    }

    /// Judges each proxy that failed every probe for the detection time ([`proxies::remove_if_gone`]), at most once
    /// every [`PROXY_JUDGE_PACE`] while it is kept.
    fn start_proxy_judgements(&mut self, jobs: &mut JoinSet<JobDone>, now: Instant) {
        for Verdict { server: token, since, error } in self.proxy_detector.dead(now) {
            if self.judging_proxies.contains(&token) || self.judge_proxy_after.get(&token).is_some_and(|at| now < *at) {
                continue;
            }
            let Some(admin_addr) = self.proxies.get(&token).cloned() else { continue };
            self.judging_proxies.insert(token.clone());
            let job = ProxyJob {
                ctx: Arc::clone(self.ctx),
                dashboard: self.dashboard.clone(),
                etcd: self.etcd.clone(),
                lease: Arc::clone(&self.lease),
                token: token.clone(),
                admin_addr,
                replaced: self.replaced_proxies.contains(&token),
                why: format!("no answer for {} ms ({error})", now.saturating_duration_since(since).as_millis()),
                kube_api: self.settings.kube_api.clone(),
            };
            jobs.spawn(async move { JobDone::Proxy(token, job.run().await) });
        }
    }

    fn start_failovers(&mut self, jobs: &mut JoinSet<JobDone>, now: Instant) {
        for Verdict { server, since, error } in self.detector.dead(now) {
            let Some(gid) = self.master_of(&server) else { continue };
            if self.failing_over.contains(&gid) || self.retry.get(&gid).is_some_and(|(at, _)| now < *at) {
                continue;
            }
            let Some(view) = self.groups.get(&gid) else { continue };
            if view.servers < 2 {
                if self.no_replica_warned.insert(gid) {
                    tracing::warn!(gid, master = %server, error = %error, "the master of a group without replicas is gone; nothing to promote");
                }
                continue;
            }
            let why =
                format!("no answer for {} ms ({error})", Instant::now().saturating_duration_since(since).as_millis());
            tracing::warn!(gid, master = %server, why = %why, "master gone: failing over");
            self.failing_over.insert(gid);
            let job = FailoverJob {
                ctx: Arc::clone(self.ctx),
                dashboard: self.dashboard.clone(),
                etcd: self.etcd.clone(),
                lease: Arc::clone(&self.lease),
                prefix: self.prefix.clone(),
                gid,
                dead: server.clone(),
                why,
                found: since,
                confirm: self.detector.deadline() / 2,
                last_position: self.positions.get(&server).copied(),
                identity: self.settings.identity.clone(),
                kube_api: self.settings.kube_api.clone(),
            };
            jobs.spawn(async move { JobDone::Failover(gid, job.run().await) });
        }
    }

    /// Checks group `gid`'s convergence, from the last listing when `from_listing` (the periodic round), else from
    /// a fresh read (a deposed master answering: the listing may predate its failover).
    fn start_repair(&mut self, jobs: &mut JoinSet<JobDone>, gid: u32, from_listing: bool) {
        let Some(view) = self.groups.get(&gid) else { return };
        if self.repairing.contains(&gid) || self.failing_over.contains(&gid) || self.detector.is_failing(&view.master) {
            return;
        }
        if view.servers < 2 && !view.promoting {
            return;
        }
        // A split serving through its alias: its runs command the new pods, under the group's transfer lock, which
        // a repair would hold through their whole copy (seen: a re-link's second pair held back 10 s).
        if self.is_split_master(&view.master) && !view.promoting {
            return;
        }
        self.repairing.insert(gid);
        let job = RepairJob {
            ctx: Arc::clone(self.ctx),
            dashboard: self.dashboard.clone(),
            etcd: self.etcd.clone(),
            lease: Arc::clone(&self.lease),
            gid,
            listed: from_listing.then(|| view.model.clone()),
            copied: self.relinks.iter().filter(|(_, m)| **m == RelinkMark::Copied).map(|(s, _)| s.clone()).collect(),
        };
        jobs.spawn(async move { JobDone::Repair(gid, job.run().await) });
    }

    fn job_done(&mut self, done: JobDone) {
        match done {
            JobDone::Failover(gid, result) => {
                self.failing_over.remove(&gid);
                match result {
                    Ok(Some(record)) => {
                        self.retry.remove(&gid);
                        self.deposed.insert(record.from.to_ascii_lowercase(), gid);
                        if let Some(view) = self.groups.get_mut(&gid) {
                            view.master = record.to.to_ascii_lowercase();
                        }
                        // Watched from the next read of Codis, with a clean record: a probe it failed before its
                        // promotion (a replica busy with the handover) must not fail it back.
                        self.detector.restart(&record.to);
                    }
                    Ok(None) => {
                        self.retry.remove(&gid);
                    }
                    Err(e) => {
                        let pause = self.retry.get(&gid).map_or(RETRY_FIRST, |(_, p)| (*p * 2).min(RETRY_MAX));
                        tracing::warn!(gid, error = %e.one_line(), retry_in_ms = pause.as_millis(), "failover did not complete");
                        self.retry.insert(gid, (Instant::now() + pause, pause));
                    }
                }
            }
            JobDone::Relink(server, result) => {
                self.relinking.remove(&server);
                match result {
                    Ok(transfer::Relink::Relinked) => {
                        self.relinks.insert(server, RelinkMark::Relinked);
                    }
                    Ok(transfer::Relink::Moot) => {
                        self.relinks.remove(&server);
                    }
                    Ok(transfer::Relink::NotYet) => {}
                    Err(e) => tracing::info!(server, error = %e.one_line(), "replica not re-linked yet"),
                }
            }
            JobDone::CopiedAgain(server, result) => {
                self.relinking.remove(&server);
                self.connecting_since.remove(&server);
                if let Err(e) = result {
                    tracing::info!(server, error = %e.one_line(), "replica not copied again yet");
                }
            }
            JobDone::Proxy(token, result) => {
                self.judging_proxies.remove(&token);
                let pace = match &result {
                    // Gone from the listing at the next read of Codis, which comes at once.
                    Ok(Removal::Removed { .. } | Removal::NotListed) => self.settings.refresh(),
                    Ok(Removal::Kept(why)) => {
                        if self.kept_proxies_told.insert(token.clone()) {
                            tracing::warn!(token, why, "proxy unreachable but kept: it may be alive");
                        }
                        PROXY_JUDGE_PACE
                    }
                    Err(e) => {
                        tracing::info!(token, error = %e.one_line(), "could not judge the unreachable proxy yet");
                        PROXY_JUDGE_PACE
                    }
                };
                self.judge_proxy_after.insert(token, Instant::now() + pace);
            }
            JobDone::Repair(gid, result) => {
                self.repairing.remove(&gid);
                match result {
                    Ok(true) => {
                        tracing::info!(gid, "group converged on its master");
                        self.deposed.retain(|_, g| *g != gid);
                    }
                    Ok(false) => {}
                    Err(e) => tracing::info!(gid, error = %e.one_line(), "group not converged yet"),
                }
            }
        }
    }
}

/// One probe: `INFO replication` over the kept connection, or a new one.
async fn probe(
    conn: Option<Pika>,
    dial: std::result::Result<HostPort, String>,
    password: Option<String>,
    timeout: Duration,
) -> std::result::Result<(Pika, Replication), String> {
    let conn = match conn {
        Some(conn) => conn,
        None => Pika::connect(&dial?, password.as_deref(), timeout).await.map_err(|e| e.to_string())?,
    };
    let info = conn.info_replication().await.map_err(|e| e.to_string())?;
    Ok((conn, info))
}

/// Records `line` as a warning Event on the watched Cluster, when an API is reachable ([`failover::announce`]).
async fn warn_on_cluster(kube_api: Option<&str>, common: &Common, reason: &str, line: &str) {
    let cluster = ObjectRef::cluster(&common.cluster.name);
    failover::announce(kube_api, &common.cluster.namespace, &cluster, reason, line, true).await;
}

/// A fresh context for one job: the run's own budget (`ACTION_BUDGET_SECONDS`) starts now.
fn job_context(base: &Context) -> Context {
    Context { budget: Budget::new(base.event.budget_seconds()), ..base.clone() }
}

struct FailoverJob {
    ctx: Arc<Context>,
    dashboard: Dashboard,
    etcd: Etcd,
    lease: Arc<LockGuard>,
    prefix: String,
    gid: u32,
    dead: String,
    why: String,
    found: Instant,
    /// How long the master may take to answer on a new connection right before the promote.
    confirm: Duration,
    last_position: Option<BinlogPosition>,
    identity: String,
    kube_api: Option<String>,
}

impl FailoverJob {
    /// `Ok(None)`: nothing to do any more (someone else moved the master, or holds the group now).
    async fn run(self) -> Result<Option<FailoverRecord>> {
        let ctx = job_context(&self.ctx);
        let Some(common) = ctx.event.common() else { return Ok(None) };
        let s = Session { ctx: &ctx, common, dashboard: self.dashboard.clone(), etcd: Some(self.etcd.clone()) };
        let gid = self.gid;
        crate::failpoint::step("watcher failover");
        let mut group_lock = match transfer::lock_group(&s, gid, GROUP_LOCK_WAIT).await {
            Ok(guard) => guard,
            Err(Error::InProgress { progress }) => {
                tracing::info!(gid, progress, "another transfer of the group is under way; looking again later");
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        let result = self.transfer(&s, &group_lock).await;
        release(&mut group_lock).await;
        let record = match result? {
            Some(record) => record,
            None => return Ok(None),
        };
        let line = record.describe();
        tracing::warn!(gid, from = %record.from, to = %record.to, took_ms = record.took_ms, "failover done: {line}");
        failover::store(&self.etcd, &self.prefix, &record).await;
        warn_on_cluster(self.kube_api.as_deref(), common, failover::REASON_FAILOVER, &line).await;
        Ok(Some(record))
    }

    async fn transfer(&self, s: &Session<'_>, group_lock: &LockGuard) -> Result<Option<FailoverRecord>> {
        let gid = self.gid;
        if !self.lease.is_held().await {
            return Err(LeaseGone.into());
        }
        let stats = s.stats().await?;
        let Some(group) = stats.group(gid) else { return Ok(None) };
        let still_master = group.master().is_some_and(|m| m.eq_ignore_ascii_case(&self.dead));
        if !still_master && !group.is_promoting() {
            let master = group.master().unwrap_or("");
            if let Some(record) = self.unrecorded_promote(s, master).await {
                return Ok(Some(record));
            }
            tracing::info!(gid, master, "the master was already replaced");
            return Ok(None);
        }
        if still_master && self.answers_as_master(s).await {
            tracing::info!(gid, master = %self.dead, "the master answers on a new connection: not failing it over");
            return Ok(None);
        }
        let from = group.master().unwrap_or(&self.dead).to_owned();
        let t = Transfer { gid, from: from.clone(), candidate: None, rollout: None, unplanned: true };
        let outcome = transfer::move_master(s, &[&self.lease, group_lock], &t).await?;
        if !outcome.promoted {
            return Ok(None);
        }
        // Where the new master stood at its promotion, as the transfer measured it just before.
        let promoted_at = transfer::read_handover(s, gid)
            .await
            .filter(|h| h.to.eq_ignore_ascii_case(&outcome.master))
            .map(|h| h.position);
        Ok(Some(FailoverRecord {
            gid,
            at: failover::now_rfc3339(),
            from,
            to: outcome.master.clone(),
            why: format!("{}; {}", self.why, outcome.basis.clone().unwrap_or_default()),
            by: format!("watcher {}", self.identity),
            took_ms: u64::try_from(self.found.elapsed().as_millis()).unwrap_or(u64::MAX),
            lag_bytes: match (self.last_position, promoted_at) {
                (Some(old), Some(new)) => Some(old.bytes_after(new)),
                _ => None,
            },
            promoted_at,
        }))
    }
}

impl FailoverJob {
    /// The record of this outage's promote when it went through unrecorded: a try whose promote call the dashboard
    /// answered too late (it hangs while a proxy waits out requests sent to a stalled master) failed, and the next
    /// try finds the master replaced. The handover record says who replaced whom; without the failover record, the
    /// old master's return would salvage nothing.
    async fn unrecorded_promote(&self, s: &Session<'_>, master: &str) -> Option<FailoverRecord> {
        let handover = transfer::read_handover(s, self.gid)
            .await
            .filter(|h| h.unplanned && h.from.eq_ignore_ascii_case(&self.dead) && h.to.eq_ignore_ascii_case(master))?;
        let last = failover::last_failover(&self.etcd, &self.prefix, self.gid).await.ok()?;
        if last.is_some_and(|r| r.from.eq_ignore_ascii_case(&self.dead) && r.to.eq_ignore_ascii_case(master)) {
            return None;
        }
        Some(FailoverRecord {
            gid: self.gid,
            at: failover::now_rfc3339(),
            from: handover.from,
            to: handover.to,
            why: format!("{}; the promote went through while the dashboard did not answer", self.why),
            by: format!("watcher {}", self.identity),
            took_ms: u64::try_from(self.found.elapsed().as_millis()).unwrap_or(u64::MAX),
            lag_bytes: self.last_position.map(|old| old.bytes_after(handover.position)),
            promoted_at: Some(handover.position),
        })
    }

    /// Whether the master judged dead answers as a master on a new connection within [`FailoverJob::confirm`]: the
    /// last word before a promote, so that neither a pause of the watcher nor a connection dropped on the way
    /// replaces a master that serves. A master gone refuses at once (no delay), one cut off costs the confirm time.
    async fn answers_as_master(&self, s: &Session<'_>) -> bool {
        let dial = pika::dial_address(&self.dead, &s.common.pika.overrides).map_err(|e| e.to_string());
        let password = s.ctx.secrets.pika_password.clone();
        let ask = probe(None, dial, password, self.confirm);
        matches!(tokio::time::timeout(self.confirm, ask).await, Ok(Ok((_, info))) if info.role == pika::Role::Master)
    }
}

struct RepairJob {
    ctx: Arc<Context>,
    dashboard: Dashboard,
    etcd: Etcd,
    lease: Arc<LockGuard>,
    gid: u32,
    /// The group as last listed, to check without reading Codis again; `None`: read it.
    listed: Option<Group>,
    /// Replicas copied in full and not re-linked since: one whose link dropped is left to its copy again.
    copied: BTreeSet<String>,
}

impl RepairJob {
    /// `Ok(true)` when the group is converged (it was, or this made it so).
    async fn run(self) -> Result<bool> {
        let ctx = job_context(&self.ctx);
        let Some(common) = ctx.event.common() else { return Ok(false) };
        let s = Session { ctx: &ctx, common, dashboard: self.dashboard, etcd: Some(self.etcd) };
        let gid = self.gid;
        // The periodic round also frees writes a killed transfer left held at the proxies, and resumes migrations
        // a killed promote left paused.
        if self.listed.is_some() {
            if let Ok(stats) = s.stats().await {
                crate::steps::hold::release_stale(&s, &stats, gid).await;
            }
            if let Err(e) = crate::steps::pause::resume_left(&s, gid).await {
                tracing::info!(gid, error = %e.one_line(), "could not check for migrations left paused");
            }
        }
        let group = match self.listed {
            Some(group) => group,
            None => match s.stats().await?.group(gid) {
                Some(group) => group.clone(),
                None => return Ok(true),
            },
        };
        if !group.is_promoting()
            && transfer::is_converged_within(&s, &group, transfer::UNPLANNED_SURVEY_TIMEOUT, &self.copied).await?
        {
            return Ok(true);
        }
        // Someone holding the group is converging it already.
        let mut lock = match transfer::lock_group(&s, gid, Duration::ZERO).await {
            Ok(lock) => lock,
            Err(Error::InProgress { .. }) => return Ok(false),
            Err(e) => return Err(e),
        };
        let result = async {
            if !self.lease.is_held().await {
                return Err(LeaseGone.into());
            }
            let stats = s.stats().await?;
            let Some(group) = stats.group(gid) else { return Ok(true) };
            if group.is_promoting() {
                // A promote left half done (a crashed switchover or watcher): resume it with its own address.
                let from = group.master().unwrap_or_default().to_owned();
                let t = Transfer { gid, from, candidate: None, rollout: None, unplanned: false };
                transfer::move_master(&s, &[&self.lease, &lock], &t).await?;
                return Ok(true);
            }
            let converged = transfer::converge(&s, gid).await?;
            transfer::clear_fence(&s, gid, &converged.master).await;
            if !converged.repointed.is_empty() {
                tracing::warn!(gid, master = %converged.master, "repaired: {}", converged.describe());
            }
            Ok(converged.unreachable.is_empty())
        }
        .await;
        release(&mut lock).await;
        result
    }
}

/// The judgement of one proxy that failed every probe for the detection time.
struct ProxyJob {
    ctx: Arc<Context>,
    dashboard: Dashboard,
    etcd: Etcd,
    lease: Arc<LockGuard>,
    token: String,
    admin_addr: String,
    replaced: bool,
    why: String,
    kube_api: Option<String>,
}

impl ProxyJob {
    /// Removes the proxy if it is gone ([`proxies::remove_if_gone`]); logs and announces a removal.
    async fn run(self) -> Result<Removal> {
        let ctx = job_context(&self.ctx);
        let Some(common) = ctx.event.common() else { return Ok(Removal::Kept("no cluster to act on")) };
        let s = Session { ctx: &ctx, common, dashboard: self.dashboard, etcd: Some(self.etcd) };
        if !self.lease.is_held().await {
            return Err(LeaseGone.into());
        }
        let removal = proxies::remove_if_gone(&s, &self.token, self.replaced, self.kube_api.as_deref()).await?;
        if let Removal::Removed { why, .. } = &removal {
            let line = format!(
                "codis-proxy {} (token {}) removed from Codis: {why}; {}. Every promote and slot change waited for it",
                self.admin_addr, self.token, self.why
            );
            tracing::warn!(proxy = %self.admin_addr, token = %self.token, "proxy gone: removed: {line}");
            warn_on_cluster(self.kube_api.as_deref(), common, proxies::REASON_PROXY_REMOVED, &line).await;
        }
        Ok(removal)
    }
}

/// How long a replica copied in full stays in sync before the watcher re-links it.
const RELINK_SETTLE: Duration = Duration::from_secs(10);

/// Longest a re-link job watches its replica link up again.
const RELINK_WATCH: Duration = Duration::from_secs(15);

/// One re-link of a replica copied in full, under its group's transfer lock; the mark records it.
struct RelinkJob {
    ctx: Arc<Context>,
    dashboard: Dashboard,
    etcd: Etcd,
    lease: Arc<LockGuard>,
    gid: u32,
    server: String,
}

impl RelinkJob {
    /// The copy again of a replica whose first link after its full copy dropped, under the group's transfer lock
    /// (busy: a transfer re-points members itself; a later sweep tries again).
    async fn copy_again(self) -> Result<bool> {
        let ctx = job_context(&self.ctx);
        let Some(common) = ctx.event.common() else { return Ok(false) };
        let s = Session { ctx: &ctx, common, dashboard: self.dashboard, etcd: Some(self.etcd) };
        let mut lock = match transfer::lock_group(&s, self.gid, Duration::ZERO).await {
            Ok(lock) => lock,
            Err(Error::InProgress { .. }) => return Ok(false),
            Err(e) => return Err(e),
        };
        let result = async {
            if !self.lease.is_held().await {
                return Err(LeaseGone.into());
            }
            transfer::copy_again_if_dropped(&s, self.gid, &self.server).await
        }
        .await;
        release(&mut lock).await;
        result
    }

    async fn run(self) -> Result<transfer::Relink> {
        let ctx = job_context(&self.ctx);
        let Some(common) = ctx.event.common() else { return Ok(transfer::Relink::NotYet) };
        let s = Session { ctx: &ctx, common, dashboard: self.dashboard, etcd: Some(self.etcd.clone()) };
        // A transfer of the group under way re-points members itself: try again on a later sweep.
        let mut lock = match transfer::lock_group(&s, self.gid, Duration::ZERO).await {
            Ok(lock) => lock,
            Err(Error::InProgress { .. }) => return Ok(transfer::Relink::NotYet),
            Err(e) => return Err(e),
        };
        let result = async {
            if !self.lease.is_held().await {
                return Err(LeaseGone.into());
            }
            let done = transfer::relink(&s, self.gid, &self.server).await?;
            let key = transfer::relink_key(&s.prefix(), &self.server);
            match done {
                transfer::Relink::Relinked => {
                    self.etcd.put(&key, RelinkMark::Relinked.word(), None).await?;
                }
                transfer::Relink::Moot => {
                    self.etcd.delete(&key).await?;
                }
                transfer::Relink::NotYet => {}
            }
            Ok(done)
        }
        .await;
        release(&mut lock).await;
        // Watched with the lock released: pika may take 10 s to link again, and a transfer of the group must not
        // wait for that (a shardAdd's settle did, seen at 10 s).
        if matches!(result, Ok(transfer::Relink::Relinked)) {
            let master = s.stats().await?.group(self.gid).and_then(|g| g.master()).map(str::to_owned);
            if let Some(master) = master {
                transfer::await_relinked(&s, self.gid, &self.server, &master, RELINK_WATCH).await?;
            }
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_election_lives_under_the_cluster_prefix() {
        assert_eq!(transfer::watcher_key("/pika-kubeblocks/ns/c1/"), "/pika-kubeblocks/ns/c1/locks/watcher");
        assert_ne!(
            transfer::watcher_key("/pika-kubeblocks/ns/c1/"),
            transfer::group_lock_key("/pika-kubeblocks/ns/c1/", 1)
        );
    }
}
