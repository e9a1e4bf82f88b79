//! `rejoin`: run by the pika container before pika starts serving, so that a pod that comes back — restarted,
//! rescheduled, on an empty volume — never costs a key and never becomes a second master.
//!
//! Pika is not running yet, so the role is set where pika reads it at boot: the `slaveof` item of its config file (only
//! `CONFIG REWRITE` puts a `SLAVEOF` there). The file is edited in place: the one replication line is replaced,
//! everything else is kept, except that a pod told to follow a master other than the one its config names gets its
//! `replication-id` emptied: pika then copies the master in full at boot, since nothing here can show that this pod's
//! history is a prefix of the master's (after a failover it may hold writes the master never got, and pika's
//! incremental sync would keep them or stop in its error state). redis-server's `replicaof <host> <port>` syntax is
//! handled too, since it stands in for pika in tests; redis resyncs in full by itself when the histories differ.
//!
//! What Codis says decides ([`decide`]):
//!
//! - **Codis lists another pod as the group's master**: follow it.
//! - **Codis still lists this pod as the master.** Then no switchover preceded this start (it would have moved the
//!   master), so this pika may have lost its last writes, or all of its data when the volume is empty. If a live
//!   replica completed a sync (a replication offset above zero, eligible, following this pod), mastership first
//!   moves to the most advanced one through the fenced, unplanned transfer of [`crate::steps::transfer`] (under the group's
//!   transfer lock, never the topology lock), the other replicas follow it, and only then is the local pika made its
//!   replica: replicas are never pointed at an empty master. With no such replica: a volume with data starts as the
//!   master; an empty one starts only if the group never held a key (it owns no slots, or the failover watcher saw its
//!   master with offset zero and never above, [`crate::steps::failover`]), and is otherwise refused — exit 1, a message naming the
//!   group, a Kubernetes Event on the pod — rather than serve an empty group in silence.
//!
//! The volume is **empty** when pika's data directory (`PIKA_DATA_DIR`, by default the config's `db-path`) is absent
//! or has no entries. Every step is idempotent and crash-safe (a rerun after the promote finds another master and
//! follows it), bounded by `ACTION_BUDGET_SECONDS`. The dashboard or etcd down: retried within the budget, then
//! **fail closed** — start only as the replica the config already names, never as a master.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::clients::codis::{Group, Stats};
use crate::clients::kube::ObjectRef;
use crate::clients::pika::Replication;
use crate::clients::server::ServerAddr;
use crate::error::{Error, Result};
use crate::input::address::HostPort;
use crate::input::context::Context;
use crate::input::event::Common;
use crate::steps::cluster::{Session, CALL_TIMEOUT};
use crate::steps::failover::{self, FailoverRecord};
use crate::steps::salvage;
use crate::steps::transfer::{self, Transfer};

/// Pause between two attempts at something that is not reachable yet.
const RETRY_PAUSE: Duration = Duration::from_secs(1);

/// How long a master back on its pod asks its group's members again while none answers.
const SILENT_MEMBERS_GRACE: Duration = Duration::from_secs(10);

/// What [`decide`] concluded for a pod Codis names as its group's master.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AsMaster {
    /// Hand mastership to a live replica with data first (or finish the promote left in progress).
    HandOver,
    /// Start as the master with what the volume holds.
    StartWithData,
    /// Start as the master of a group that never held a key, on an empty volume.
    StartEmpty(&'static str),
    /// Do not start: the group held data, the volume is empty and no replica with data is live.
    Refuse,
}

/// The decision for a pod Codis lists as its group's master: whether a live replica with data exists (or a promote
/// is already under way), whether the local volume has data, and whether the group never held a key (`None`: not
/// known yet, asked only when it matters).
#[must_use]
pub fn decide(live_replica: bool, promoting: bool, has_data: bool, never_held: Option<&'static str>) -> AsMaster {
    if live_replica || promoting {
        AsMaster::HandOver
    } else if has_data {
        AsMaster::StartWithData
    } else if let Some(why) = never_held {
        AsMaster::StartEmpty(why)
    } else {
        AsMaster::Refuse
    }
}

/// Why this pod does not start. pika stays down and KubeBlocks restarts the container, which asks again.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// Codis's master on an empty volume, and no replica with the data is live: starting would serve the group empty.
    #[error(
        "refusing to start {pod}: it is codis group {gid}'s master, its volume is empty ({} has no data), the group \
         held data (or etcd cannot say it did not) and no replica with data is live ({}); starting it would serve \
         group {gid} empty. Bring back a replica that has the data (this pod then hands over to it), or restore a \
         backup",
        .data_dir.display(),
        if .unfit.is_empty() { "the group has no other member".to_owned() } else { .unfit.join("; ") }
    )]
    EmptyMaster {
        /// This pod.
        pod: String,
        /// Its group.
        gid: u32,
        /// pika's data directory.
        data_dir: PathBuf,
        /// `<pod>: <why it cannot take over>` for each other member.
        unfit: Vec<String>,
    },
    /// Codis could not be asked and the config would start a master.
    #[error(
        "{why}; {} makes this pika a master, which could be a second master of its group: not starting until codis \
         answers",
        .config.display()
    )]
    WouldStartAsMaster {
        /// Why Codis could not be asked.
        why: String,
        /// pika's config file.
        config: PathBuf,
    },
    /// Members still follow this empty pod and could not be re-pointed.
    #[error(
        "group {gid}'s members {followers:?} still follow this pod, whose volume is empty, and could not be \
         re-pointed at codis's master; not starting, or they would resync from an empty pika"
    )]
    FollowersLeft {
        /// The group.
        gid: u32,
        /// The members still following.
        followers: Vec<String>,
        /// Why they could not be re-pointed.
        #[source]
        source: Box<Error>,
    },
    /// The handover ended with this pod still Codis's master.
    #[error("codis still lists {server} as group {gid}'s master; not starting")]
    StillMaster {
        /// This pod's server.
        server: String,
        /// Its group.
        gid: u32,
    },
    /// The data directory cannot be read, so whether this volume has data is unknown.
    #[error("cannot read pika's data directory {} ({source}): cannot tell whether this volume has data", .dir.display())]
    DataDirUnreadable {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// pika's config could not be rewritten.
    #[error("cannot write {} ({source})", .path.display())]
    ConfigUnwritable {
        /// The config file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Runs the action.
pub async fn run(ctx: &Context, event: &crate::input::event::Rejoin) -> Result<String> {
    let crate::input::event::Rejoin { common, shard, pod, config_file, data_dir, kube_api } = event;
    let me =
        shard.pods.iter().find(|p| p.name() == pod).ok_or_else(|| {
            Error::invalid(crate::input::vars::POD_NAME, format!("{pod} is not a pod of {}", shard.name))
        })?;
    let config = Path::new(config_file);
    let data = data_dir.as_ref().map_or_else(|| data_dir_of(config), PathBuf::from);

    let s = match open_session(ctx, common).await {
        Ok(s) => s,
        Err(e @ Error::InvalidInput { .. }) => return Err(e),
        Err(e) => return fail_closed(config, &format!("codis unreachable ({})", e.one_line())),
    };
    let server = s.server(me);
    let stats = match retry(ctx, "read codis", || s.stats()).await {
        Ok(stats) => stats,
        Err(e) => return fail_closed(config, &format!("codis unreachable ({})", e.one_line())),
    };
    let Some(group) = stats.group_of_server(&server) else {
        return Ok(format!("{server} is not in any codis group yet; nothing to do"));
    };
    let gid = group.id;
    let Some(master) = group.master() else {
        return Ok(format!("group {gid} has no master; nothing to do"));
    };
    if !master.eq_ignore_ascii_case(&server) {
        repoint_followers(&s, group, &server, &data).await?;
        salvage_tail(&s, gid, &server, config, volume_has_data(&data)?, kube_api.as_deref()).await?;
        let said = follow(&s, config, &server, master, gid)?;
        if std::fs::read_to_string(config).is_ok_and(|text| copies_in_full(&text)) {
            transfer::mark_copied(&s, &server).await;
        }
        return Ok(said);
    }

    // Codis names this pod the master; this pika is not running, so it is not asked anything.
    let has_data = volume_has_data(&data)?;
    let others: Vec<String> =
        group.servers.iter().map(|gs| gs.server.clone()).filter(|srv| !srv.eq_ignore_ascii_case(&server)).collect();
    let mut infos = transfer::survey_within(&s, &others, transfer::UNPLANNED_SURVEY_TIMEOUT).await;
    // Every member silent: they may only be busy (seen: AUTH unanswered for over 1 s on both replicas right after
    // their master was killed); ask again for a while before deciding without them.
    let deadline = tokio::time::Instant::now() + ctx.budget.cap(SILENT_MEMBERS_GRACE);
    while !infos.is_empty() && infos.values().all(Result::is_err) && tokio::time::Instant::now() < deadline {
        for (member, error) in infos.iter().filter_map(|(m, i)| i.as_ref().err().map(|e| (m, e))) {
            tracing::warn!(gid, member, error, "member not reachable; asking again");
        }
        tokio::time::sleep(ctx.budget.cap(RETRY_PAUSE)).await;
        infos = transfer::survey_within(&s, &others, transfer::UNPLANNED_SURVEY_TIMEOUT).await;
    }
    for (member, error) in infos.iter().filter_map(|(m, i)| i.as_ref().err().map(|e| (m, e))) {
        tracing::warn!(gid, member, error, "member not reachable");
    }
    let own_at = s.dial(&server)?;
    let held_data = transfer::group_held_data(&s, gid).await;
    let (_, members) = transfer::member_facts_with(group, &server, &own_at, &infos, held_data);
    let live: Vec<&str> = members.iter().filter(|m| m.unfit_reason().is_none()).map(|m| m.pod.as_str()).collect();
    let unfit: Vec<String> =
        members.iter().filter_map(|m| m.unfit_reason().map(|r| format!("{}: {r}", m.pod))).collect();
    let never_held = if !live.is_empty() || group.is_promoting() || has_data {
        None
    } else {
        never_held_a_key(&s, &stats, group).await?
    };
    let volume = if has_data { "data" } else { "an empty volume" };
    tracing::info!(gid, %server, volume, live = ?live, unfit = ?unfit, "codis still lists this pod as the group's master");
    match decide(!live.is_empty(), group.is_promoting(), has_data, never_held) {
        AsMaster::HandOver => hand_over(&s, config, &server, gid, has_data, kube_api.as_deref()).await,
        AsMaster::StartWithData => {
            tracing::warn!(gid, unfit = ?unfit, "no live replica with data: starting as the master with this volume's data");
            start_as_master(
                config,
                &format!(
                "{server} is group {gid}'s master; no live replica has data ({}), so it starts with the data on this \
                 volume",
                if unfit.is_empty() { "it has none".to_owned() } else { unfit.join("; ") }
            ),
            )
        }
        AsMaster::StartEmpty(why) => start_as_master(
            config,
            &format!("{server} is group {gid}'s master on an empty volume; the group never held a key ({why})"),
        ),
        AsMaster::Refuse => {
            let refusal = Refusal::EmptyMaster { pod: pod.clone(), gid, data_dir: data.clone(), unfit };
            let message = refusal.to_string();
            tracing::error!(gid, pod = %pod, "{message}");
            failover::announce(
                kube_api.as_deref(),
                &s.common.cluster.namespace,
                &ObjectRef::pod(pod, None),
                failover::REASON_REFUSED_START,
                &message,
                true,
            )
            .await;
            Err(refusal.into())
        }
    }
}

/// The session, retried within the budget while the dashboard cannot be reached; etcd is joined when it answers.
async fn open_session<'a>(ctx: &'a Context, common: &'a Common) -> Result<Session<'a>> {
    loop {
        match Session::open_without_etcd_if_down(ctx, common).await {
            Ok(s) => return Ok(s),
            // A configuration error (the dashboard serves another product) does not fix itself: say so now.
            Err(e @ Error::InvalidInput { .. }) => return Err(e),
            Err(e) if ctx.budget.remaining() > CALL_TIMEOUT + RETRY_PAUSE => {
                tracing::warn!(error = %e.one_line(), "codis not reachable yet; retrying");
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// `f` retried within the budget.
async fn retry<T, F, Fut>(ctx: &Context, what: &str, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e @ Error::InvalidInput { .. }) => return Err(e),
            Err(e) if ctx.budget.remaining() > CALL_TIMEOUT + RETRY_PAUSE => {
                tracing::warn!(error = %e.one_line(), "cannot {what} yet; retrying");
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Codis could not be asked: start only as the replica the config already names, never as a master.
fn fail_closed(config: &Path, why: &str) -> Result<String> {
    let text = std::fs::read_to_string(config).map_err(|e| {
        Error::invalid(crate::input::vars::PIKA_CONFIG_FILE, format!("cannot read {}: {e}", config.display()))
    })?;
    match persisted_master(&text) {
        Some(master) => Ok(format!("{why}; starting as the replica of {master} that {} names", config.display())),
        None => Err(Refusal::WouldStartAsMaster { why: why.to_owned(), config: config.to_owned() }.into()),
    }
}

/// Members that still replicate this pod although Codis lists another master, or follow nobody: a handover or
/// failover stopped after its promote, or between a member's `SLAVEOF NO ONE` and its `SLAVEOF` (a member leaves its
/// old master before it follows the new one). They are re-pointed at Codis's master, under the group's transfer
/// lock, before this pod starts, so that none resyncs from it while it is empty and none is left a master Codis does
/// not route to. A failure is fatal only when this volume is empty; with data here, a member left following this pod
/// is merely chained behind a replica until the watcher's repair re-points it.
async fn repoint_followers(s: &Session<'_>, group: &Group, server: &str, data: &Path) -> Result<()> {
    let gid = group.id;
    let own_at = s.dial(server)?;
    let master = group.master().unwrap_or_default();
    // An alias stands for another group's master during a split: never re-pointed from here.
    let others: Vec<String> = group
        .servers
        .iter()
        .map(|gs| gs.server.clone())
        .filter(|m| !m.eq_ignore_ascii_case(server) && !ServerAddr::of(m).is_alias())
        .collect();
    let infos = transfer::survey_within(s, &others, transfer::UNPLANNED_SURVEY_TIMEOUT).await;
    let left_behind = |m: &String, i: &Replication| {
        i.follows(&own_at) || (!i.role.is_slave() && !m.eq_ignore_ascii_case(master) && i.connected_slaves == 0)
    };
    let followers: Vec<&String> =
        infos.iter().filter(|(m, i)| i.as_ref().is_ok_and(|i| left_behind(m, i))).map(|(m, _)| m).collect();
    if followers.is_empty() {
        return Ok(());
    }
    tracing::warn!(gid, followers = ?followers, "members still follow this pod, no longer codis's master: re-pointing them first");
    let result = async {
        let s = s.with_etcd(s.etcd_for(&format!("members of group {gid} must be re-pointed first")).await?);
        let mut lock = transfer::lock_group(&s, gid, s.ctx.budget.cap(s.ctx.budget.remaining() / 3)).await?;
        let converged = transfer::converge(&s, gid).await;
        if let Ok(c) = &converged {
            transfer::clear_fence(&s, gid, &c.master).await;
        }
        crate::steps::cluster::release(&mut lock).await;
        converged.map(|_| ())
    }
    .await;
    match result {
        Ok(()) => Ok(()),
        Err(e) if volume_has_data(data).unwrap_or(false) => {
            tracing::warn!(gid, error = %e.one_line(), "could not re-point them; the watcher's repair will");
            Ok(())
        }
        Err(e) => Err(Refusal::FollowersLeft {
            gid,
            followers: followers.into_iter().cloned().collect(),
            source: Box::new(e),
        }
        .into()),
    }
}

fn follow(s: &Session<'_>, config: &Path, server: &str, master: &str, gid: u32) -> Result<String> {
    let changed = set_replication(config, Some(&s.dial(master)?))?;
    Ok(written(format!("{server} follows {master} in group {gid}"), config, changed))
}

fn start_as_master(config: &Path, what: &str) -> Result<String> {
    let changed = set_replication(config, None)?;
    Ok(written(what.to_owned(), config, changed))
}

fn written(what: String, config: &Path, changed: bool) -> String {
    if changed {
        format!("{what}; {} updated", config.display())
    } else {
        format!("{what}; {} already says so", config.display())
    }
}

/// Writes again what this pod took last as its group's master and the new master never got
/// ([`salvage::salvage`]), when the group's last failover replaced this pod and measured where the new master stood.
/// Before the config makes it a replica: its first sync wipes the volume.
async fn salvage_tail(
    s: &Session<'_>,
    gid: u32,
    server: &str,
    config: &Path,
    has_data: bool,
    kube_api: Option<&str>,
) -> Result<()> {
    // Only a pika that last ran as a master has writes of its own: a replica's restart needs no etcd. Failovers are
    // recorded in etcd only; without it configured there is no record to go by.
    let text = std::fs::read_to_string(config).unwrap_or_default();
    if persisted_master(&text).is_some() || s.common.etcd.is_empty() {
        return Ok(());
    }
    let purpose = "salvage a failed-over master's last writes";
    let etcd = if has_data {
        // Waited for within the budget, then the start fails and is retried: starting as a replica would wipe the
        // only copy of the tail.
        retry(s.ctx, "reach etcd", || s.etcd_for(purpose)).await?
    } else {
        // An empty volume has no tail; the failover is marked salvaged when etcd answers, so that this pod, once it
        // holds a later history, never reads it from the old record's position.
        match s.etcd_for(purpose).await {
            Ok(etcd) => etcd,
            Err(_) => return Ok(()),
        }
    };
    let s = s.with_etcd(etcd.clone());
    let record =
        failover::last_failover(&etcd, &s.prefix(), gid).await?.filter(|r| r.from.eq_ignore_ascii_case(server));
    let Some((record, from)) = record.and_then(|r| r.promoted_at.map(|at| (r, at))) else { return Ok(()) };
    match salvage::salvage(&s, &record, from, &binlog_dir_of(config)).await? {
        salvage::Outcome::Done(done) => {
            let line =
                format!("{server}, failed over at {}, came back with its binlog: {}", record.at, done.describe());
            tracing::warn!(gid, "salvaged: {line}");
            if done.written > 0 {
                let pod = crate::clients::server::ServerAddr::of(server).pod().to_owned();
                failover::announce(
                    kube_api,
                    &s.common.cluster.namespace,
                    &ObjectRef::pod(&pod, None),
                    failover::REASON_SALVAGED,
                    &line,
                    true,
                )
                .await;
            }
        }
        salvage::Outcome::AlreadyDone => tracing::info!(gid, "the failed-over tail was salvaged already"),
        salvage::Outcome::NoTail(why) => tracing::info!(gid, why, "no binlog tail to salvage"),
    }
    Ok(())
}

/// Moves mastership to the best live replica (or finishes the promote under way), then makes this pod its replica.
async fn hand_over(
    s: &Session<'_>,
    config: &Path,
    server: &str,
    gid: u32,
    has_data: bool,
    kube_api: Option<&str>,
) -> Result<String> {
    let ctx = s.ctx;
    let purpose = format!("group {gid}'s mastership must move before this pod starts");
    let etcd = retry(ctx, "reach etcd", || s.etcd_for(&purpose)).await?;
    let s = s.with_etcd(etcd.clone());
    let mut lock = retry(ctx, "take the group's transfer lock", || {
        transfer::lock_group(&s, gid, ctx.budget.cap(ctx.budget.remaining() / 3))
    })
    .await?;
    let t = Transfer { gid, from: server.to_owned(), candidate: None, rollout: None, unplanned: true };
    let result = transfer::move_master(&s, &[&lock], &t).await;
    crate::steps::cluster::release(&mut lock).await;
    let outcome = result?;
    if outcome.master.eq_ignore_ascii_case(server) {
        return Err(Refusal::StillMaster { server: server.to_owned(), gid }.into());
    }
    if outcome.promoted {
        let record = FailoverRecord {
            gid,
            at: failover::now_rfc3339(),
            from: server.to_owned(),
            to: outcome.master.clone(),
            why: format!(
                "its pod restarted {} with no switchover before; {}",
                if has_data { "with its data" } else { "on an empty volume" },
                outcome.basis.clone().unwrap_or_default()
            ),
            by: format!("rejoin {}", crate::clients::server::ServerAddr::of(server).pod()),
            took_ms: u64::try_from(ctx.budget.elapsed().as_millis()).unwrap_or(u64::MAX),
            lag_bytes: None,
            promoted_at: transfer::read_handover(&s, gid)
                .await
                .filter(|h| h.to.eq_ignore_ascii_case(&outcome.master))
                .map(|h| h.position),
        };
        let line = record.describe();
        tracing::warn!(gid, from = %server, to = %outcome.master, "handed over before starting: {line}");
        failover::store(&etcd, &s.prefix(), &record).await;
        failover::announce(
            kube_api,
            &s.common.cluster.namespace,
            &ObjectRef::cluster(&s.common.cluster.name),
            failover::REASON_FAILOVER,
            &line,
            true,
        )
        .await;
        // Before the config names the new master: a rerun after a crash here finds this pod deposed and salvages.
        salvage_tail(&s, gid, server, config, has_data, kube_api).await?;
    }
    let changed = set_replication(config, Some(&s.dial(&outcome.master)?))?;
    Ok(written(
        format!("{}; this pod starts as a replica of {}", outcome.describe(server), outcome.master),
        config,
        changed,
    ))
}

/// Why the group never held a key, or `None` when it did (or that cannot be known: etcd unreachable).
async fn never_held_a_key(s: &Session<'_>, stats: &Stats, group: &Group) -> Result<Option<&'static str>> {
    if stats.slots_of(group.id).is_empty() && stats.slots_targeting(group.id).is_empty() {
        return Ok(Some("it owns no slots"));
    }
    let key = failover::held_data_key(&s.prefix(), group.id);
    let read = retry(s.ctx, "read etcd", || async {
        let etcd = s.etcd_for("whether the group ever held data is recorded there").await?;
        Ok(etcd.get(&key).await?)
    })
    .await;
    match read {
        Ok(mark) if failover::HeldData::of(mark.as_ref().map(|e| e.value.as_str())) == failover::HeldData::Never => {
            Ok(Some("the failover watcher saw its master with replication offset 0 and never above"))
        }
        Ok(_) => Ok(None),
        Err(e) => {
            tracing::warn!(gid = group.id, error = %e.one_line(), "cannot tell whether the group held data");
            Ok(None)
        }
    }
}

/// pika's data directory according to its config: `db-path` (relative to the file's directory), else `<dir>/db`.
#[must_use]
pub fn data_dir_of(config: &Path) -> PathBuf {
    config_path(config, "db-path", "db")
}

/// pika's binlog of `db0` according to its config: `<log-path>/log_db0` (`log-path` as [`data_dir_of`] reads
/// `db-path`, else `<dir>/log`).
#[must_use]
pub fn binlog_dir_of(config: &Path) -> PathBuf {
    config_path(config, "log-path", "log").join("log_db0")
}

/// The directory `key` of the config names, relative to the file's directory, else `<dir>/<default>`.
fn config_path(config: &Path, key: &str, default: &str) -> PathBuf {
    let base = config.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    let text = std::fs::read_to_string(config).unwrap_or_default();
    let value = text.lines().find_map(|line| {
        let line = line.trim();
        let rest = line.strip_prefix(key)?;
        let value = rest.trim_start().strip_prefix(':').unwrap_or(rest).trim();
        (!value.is_empty() && !line.starts_with('#')).then(|| value.to_owned())
    });
    match value {
        Some(p) if Path::new(&p).is_absolute() => PathBuf::from(p),
        Some(p) => base.join(p),
        None => base.join(default),
    }
}

/// Whether `dir` holds anything: absent or without entries is an empty volume.
///
/// # Errors
/// The directory exists but cannot be read (then nothing can be concluded, and the start is refused).
pub fn volume_has_data(dir: &Path) -> Result<bool> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => Ok(entries.next().is_some()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(Refusal::DataDirUnreadable { dir: dir.to_owned(), source }.into()),
    }
}

/// The master a config's replication line names (pika `slaveof : host:port`, redis `replicaof host port`).
#[must_use]
pub fn persisted_master(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let line = line.trim();
        if line.starts_with('#') {
            return None;
        }
        let key = line.split([' ', ':', '\t']).next().unwrap_or_default().to_ascii_lowercase();
        if key != "slaveof" && key != "replicaof" {
            return None;
        }
        let value = line[key.len()..].trim_start().trim_start_matches(':').trim();
        let value = value.split_whitespace().collect::<Vec<_>>().join(":");
        (!value.is_empty()).then_some(value)
    })
}

/// Sets (or clears, for `None`) the replication line of the config file; returns whether the file changed.
pub fn set_replication(path: &Path, master: Option<&HostPort>) -> Result<bool> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::invalid(crate::input::vars::PIKA_CONFIG_FILE, format!("cannot read {}: {e}", path.display()))
    })?;
    let updated = with_replication(&text, master);
    if updated == text {
        return Ok(false);
    }
    crate::failpoint::step("write pika config");
    // Write beside and rename, so a crash never leaves pika a half-written config.
    let tmp = path.with_extension("rejoin.tmp");
    std::fs::write(&tmp, &updated)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|source| Refusal::ConfigUnwritable { path: path.to_owned(), source })?;
    Ok(true)
}

/// Whether pika started on this config copies its master in full: pika's syntax, a master named, and no
/// `replication-id` (a new volume, or one [`with_replication`] pointed at another master).
#[must_use]
pub fn copies_in_full(text: &str) -> bool {
    let replication_id = text.lines().map(str::trim).filter(|l| !l.starts_with('#')).find_map(|l| {
        let (key, value) = l.split_once(':')?;
        key.trim().eq_ignore_ascii_case("replication-id").then(|| value.trim())
    });
    is_pika_syntax(text) && persisted_master(text).is_some() && replication_id.is_none_or(str::is_empty)
}

/// Whether a config is in pika's `key : value` syntax rather than redis's `key value`.
fn is_pika_syntax(text: &str) -> bool {
    text.lines().any(|l| {
        let l = l.trim_start();
        !l.starts_with('#') && l.split_once(':').is_some_and(|(k, _)| !k.trim().is_empty() && k.ends_with(' '))
    })
}

/// The config text with its replication line replaced. Pika's syntax is `key : value`; redis's is `key value`. A pika
/// config that named another master (or none) also gets an empty `replication-id`, which makes pika copy the new
/// master in full when it connects.
#[must_use]
pub fn with_replication(text: &str, master: Option<&HostPort>) -> String {
    let pika_syntax = is_pika_syntax(text);
    let is_replication_line = |line: &str| {
        let key = line.trim_start().split([' ', ':', '\t']).next().unwrap_or_default().to_ascii_lowercase();
        !line.trim_start().starts_with('#') && (key == "slaveof" || key == "replicaof")
    };
    let another_master = master.is_some_and(|m| {
        persisted_master(text).is_none_or(|p| !p.eq_ignore_ascii_case(&format!("{}:{}", m.host(), m.port())))
    });
    let is_replication_id = |line: &str| {
        let l = line.trim_start();
        !l.starts_with('#')
            && l.split([' ', ':', '\t']).next().unwrap_or_default().eq_ignore_ascii_case("replication-id")
    };
    let mut out: Vec<String> = text
        .lines()
        .filter(|l| !is_replication_line(l))
        .map(|l| {
            if pika_syntax && another_master && is_replication_id(l) {
                "replication-id : ".to_owned()
            } else {
                l.to_owned()
            }
        })
        .collect();
    match (master, pika_syntax) {
        (Some(master), true) => out.push(format!("slaveof : {}:{}", master.host(), master.port())),
        (Some(master), false) => out.push(format!("replicaof {} {}", master.host(), master.port())),
        // Pika keeps an explicit empty item; redis simply has no line.
        (None, true) => out.push("slaveof : ".to_owned()),
        (None, false) => {}
    }
    let mut joined = out.join("\n");
    joined.push('\n');
    joined
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pika_config_gets_its_slaveof_item_replaced_and_everything_else_kept() {
        let conf = "port : 9221\nslaveof : new-master.svc:9221\nreplication-id : abc\n";
        let same = HostPort::new("new-master.svc".to_owned(), 9221);
        let out = with_replication(conf, Some(&same));
        assert_eq!(
            out, "port : 9221\nreplication-id : abc\nslaveof : new-master.svc:9221\n",
            "the same master keeps the ID"
        );
        assert_eq!(with_replication(&out, Some(&same)), out, "idempotent");
        assert_eq!(with_replication(&out, None), "port : 9221\nreplication-id : abc\nslaveof : \n");
    }

    #[test]
    fn a_pika_config_naming_a_master_with_no_replication_id_copies_it_in_full() {
        assert!(copies_in_full("port : 9221\nslaveof : m.svc:9221\nreplication-id : \n"));
        assert!(copies_in_full("port : 9221\nslaveof : m.svc:9221\n"));
        assert!(!copies_in_full("port : 9221\nslaveof : m.svc:9221\nreplication-id : abc\n"));
        assert!(!copies_in_full("port : 9221\nslaveof : \nreplication-id : \n"));
        assert!(!copies_in_full("port 9221\nreplicaof m.svc 9221\n"));
    }

    #[test]
    fn a_pika_config_pointed_at_another_master_loses_its_replication_id_so_pika_copies_the_master_in_full() {
        let new = HostPort::new("new-master.svc".to_owned(), 9221);
        let conf = "port : 9221\nslaveof : old-master:9221\nreplication-id : abc\n";
        let out = with_replication(conf, Some(&new));
        assert_eq!(out, "port : 9221\nreplication-id : \nslaveof : new-master.svc:9221\n");
        assert_eq!(with_replication(&out, Some(&new)), out, "idempotent: the next run keeps what the first wrote");
        // A master (no slaveof) that is to follow: the failover case, never trusted.
        let conf = "replication-id : abc\nslaveof : \n";
        assert_eq!(with_replication(conf, Some(&new)), "replication-id : \nslaveof : new-master.svc:9221\n");
    }

    #[test]
    fn redis_config_uses_replicaof() {
        let conf = "port 7001\n# slaveof a b\nslaveof 127.0.0.1 7000\n";
        assert_eq!(
            with_replication(conf, Some(&HostPort::new("127.0.0.1".to_owned(), 7002))),
            "port 7001\n# slaveof a b\nreplicaof 127.0.0.1 7002\n"
        );
        assert_eq!(with_replication(conf, None), "port 7001\n# slaveof a b\n");
    }

    #[test]
    fn the_persisted_master_is_read_in_both_syntaxes() {
        assert_eq!(persisted_master("port : 9221\nslaveof : m.svc:9221\n").as_deref(), Some("m.svc:9221"));
        assert_eq!(persisted_master("port 1\nreplicaof 127.0.0.1 7000\n").as_deref(), Some("127.0.0.1:7000"));
        assert_eq!(persisted_master("port : 9221\nslaveof : \n"), None);
        assert_eq!(persisted_master("# replicaof a 1\nport 1\n"), None);
    }

    #[test]
    fn the_data_directory_comes_from_db_path_relative_to_the_config() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("pika.conf");
        std::fs::write(&conf, "port : 9221\ndb-path : /data/db/\n").unwrap();
        assert_eq!(data_dir_of(&conf), PathBuf::from("/data/db/"));
        std::fs::write(&conf, "db-path ./db2/\n").unwrap();
        assert_eq!(data_dir_of(&conf), dir.path().join("./db2/"));
        std::fs::write(&conf, "port 1\n").unwrap();
        assert_eq!(data_dir_of(&conf), dir.path().join("db"));
    }

    #[test]
    fn the_binlog_directory_is_log_db0_under_log_path() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("pika.conf");
        std::fs::write(&conf, "log-path /data/log/\ndb-path /data/db/\n").unwrap();
        assert_eq!(binlog_dir_of(&conf), PathBuf::from("/data/log/log_db0"));
        std::fs::write(&conf, "# log-path : /elsewhere/\nport : 1\n").unwrap();
        assert_eq!(binlog_dir_of(&conf), dir.path().join("log").join("log_db0"));
    }

    #[test]
    fn an_absent_or_empty_data_directory_is_an_empty_volume() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("db");
        assert!(!volume_has_data(&db).unwrap(), "absent");
        std::fs::create_dir(&db).unwrap();
        assert!(!volume_has_data(&db).unwrap(), "empty");
        std::fs::create_dir(db.join("db0")).unwrap();
        assert!(volume_has_data(&db).unwrap(), "an entry");
    }

    #[test]
    fn a_master_hands_over_whenever_a_replica_with_data_lives_and_starts_empty_only_over_an_empty_group() {
        // A live replica with data, or a promote under way: hand over, data or not.
        for has_data in [true, false] {
            assert_eq!(decide(true, false, has_data, None), AsMaster::HandOver);
            assert_eq!(decide(false, true, has_data, None), AsMaster::HandOver);
        }
        assert_eq!(decide(false, false, true, None), AsMaster::StartWithData);
        assert_eq!(decide(false, false, false, Some("it owns no slots")), AsMaster::StartEmpty("it owns no slots"));
        assert_eq!(decide(false, false, false, None), AsMaster::Refuse);
    }
}
