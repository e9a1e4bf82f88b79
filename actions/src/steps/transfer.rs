//! The fenced master transfer that `switchover`, `member-leave`, the failover watcher and `rejoin` share: choose a
//! new master, write it down as the group's expected master in etcd, promote it through Codis, re-point every other
//! member, and confirm.
//!
//! PD's expected-primary fence (tikv/pd), as PD later fixed its races, applied to a Codis group:
//!
//! 1. Every transfer holds its group's transfer lock ([`lock_group`]), so two transfers of one group never
//!    interleave. Planned ones (switchover, member-leave) take it inside the cluster's topology lock
//!    ([`Session::lock_topology`]), so they never interleave with registrations and drains either; unplanned ones
//!    (the failover watcher, `rejoin` handing over) take only the group lock, since a drain may hold the topology
//!    lock while it waits on the very group whose master is gone.
//! 2. **The fence** `<cluster prefix>/fence/<gid>` names the member being promoted. It is written *before* the promote
//!    (compare-and-put on the value read, so a fence that changed under us stops the transfer with nothing done),
//!    compared again right before acting, bound to a [`FENCE_TTL`] lease so a failed transfer never blocks the group,
//!    and deleted (only if it still names our target) once the group has converged. A run that finds a fence left by a
//!    crashed run adopts its target while that member is still fit, so a crash at any step followed by a rerun — or a
//!    lock holder that stalled and was replaced — promotes the same member, never a second one.
//! 3. A promote left half done (`promoting` not empty) is resumed with the same address before anything else.
//! 4. Codis's promote touches only the new master (`pkg/topom/topom_group.go`), so [`converge`] makes every other
//!    member follow Codis's `servers[0]`: plain replicas first, then any node that still has replicas of its own (the
//!    old master) once its `connected_slaves` is 0, because pika refuses SLAVEOF on a node with replicas
//!    (`already master of others`). That wait is a real, bounded step.
//! 5. The group is re-read before every step: Pika's Codis fork may fail a master over and reorder the servers by
//!    itself at any time.
//!
//! Between the promote and the old master's demotion both report `role:master` (pika gives no other order); Codis
//! routes to `servers[0]` only, so that window never has two masters that receive writes.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use crate::clients::codis::{Group, Stats};
use crate::clients::etcd::{Entry, LockGuard};
use crate::clients::pika::{self, Pika, Replication};
use crate::clients::server::ServerAddr;
use crate::error::{Error, Result};
use crate::input::address::HostPort;
use crate::input::replication::SyncState;
use crate::plan::resync::{self, Handover, MemberHistory, Resync};
use crate::plan::{self, Basis, ChoiceError, MemberFacts, RolloutFacts};
use crate::steps::cluster::{Session, CALL_TIMEOUT, POLL};

/// Why mastership was not moved; what the transfer had not yet done stays undone.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// Codis's view of the group changed at every look.
    #[error("group {gid} keeps changing under the transfer; run again")]
    KeepsChanging {
        /// The group.
        gid: u32,
    },
    /// The group has no server, so no master.
    #[error("group {gid} has no servers")]
    NoServers {
        /// The group.
        gid: u32,
    },
    /// The group is gone from Codis.
    #[error("group {gid} no longer exists in codis")]
    NoGroup {
        /// The group.
        gid: u32,
    },
    /// Codis promoted but still lists the old master first.
    #[error("codis still lists {master} as group {gid}'s master after the promote")]
    NotPromoted {
        /// The group.
        gid: u32,
        /// The master Codis lists.
        master: String,
    },
    /// Nobody to hand over to.
    #[error("{master} is group {gid}'s only server: there is no one to promote")]
    OnlyServer {
        /// The group.
        gid: u32,
        /// Its one server.
        master: String,
    },
    /// The chosen member left the group while the transfer chose it.
    #[error("{pod} vanished from group {gid}")]
    ChosenVanished {
        /// The group.
        gid: u32,
        /// The chosen pod.
        pod: String,
    },
    /// A promote pushes slots to every proxy; one that Codis cannot reach would leave the group stuck.
    #[error(
        "codis cannot reach proxy {proxy} ({why}): a promote of group {gid} would stall; bring the proxy back or \
         remove it first; nothing was changed"
    )]
    ProxyUnreachable {
        /// The group.
        gid: u32,
        /// The proxy's admin address.
        proxy: String,
        /// What Codis reports about it.
        why: String,
    },
    /// Another transfer's fence replaced ours before the promote.
    #[error("group {gid}'s fence now names {}, not {to}; nothing promoted", .now.as_deref().unwrap_or("nothing"))]
    FenceMoved {
        /// The group.
        gid: u32,
        /// Our target.
        to: String,
        /// What the fence names now.
        now: Option<String>,
    },
    /// A lock of this transfer expired before the promote.
    #[error("lost the lock {key} before promoting {to}; nothing promoted")]
    LockLost {
        /// The lock.
        key: String,
        /// The target.
        to: String,
    },
    /// The fence changed while the successor was being chosen.
    #[error("group {gid}'s fence changed to {now} while choosing (another transfer?); nothing promoted")]
    FenceChanged {
        /// The group.
        gid: u32,
        /// What it names now.
        now: String,
    },
    /// The fence could not be written in a few tries.
    #[error("could not write group {gid}'s fence; nothing promoted")]
    FenceNotWritten {
        /// The group.
        gid: u32,
    },
    /// With writes held, the new master did not reach the old one's binlog position in time.
    #[error(
        "group {gid}: {to} did not catch up with the master while writes were held; nothing promoted, writes released"
    )]
    NotCaughtUp {
        /// The group.
        gid: u32,
        /// The chosen member.
        to: String,
    },
    /// A promote in progress names an index the group does not have.
    #[error("group {gid} is promoting index {index}, which it does not have")]
    PromotingNowhere {
        /// The group.
        gid: u32,
        /// The index Codis reports.
        index: usize,
    },
    /// The requested candidate cannot take over.
    #[error(transparent)]
    Choice(ChoiceError),
    /// No member can take over; the reasons of each.
    #[error("{source} ({}); codis's own failover is the fallback", .unfit.join(", "))]
    NoSuccessor {
        /// The planner's refusal.
        source: ChoiceError,
        /// `<pod>: <why it is unfit>` for each other member.
        unfit: Vec<String>,
    },
}

/// How long a fence outlives the run that wrote it: long enough for one transfer, short enough that a failed one
/// never blocks the group for long.
pub const FENCE_TTL: Duration = Duration::from_secs(30);
/// Longest wait for a demoted master to lose its replicas (and for other refusals to clear) in one run.
pub const DEMOTE_WAIT: Duration = Duration::from_secs(15);
/// How often a node waiting to be demoted is asked whether it still has replicas.
const DEMOTE_POLL: Duration = Duration::from_millis(10);
/// Longest wait for the new master to catch up before the promote; the promote goes ahead afterwards regardless
/// (proxies hold requests while Codis promotes, so this only narrows the window of unreplicated writes).
pub const CATCH_UP_WAIT: Duration = Duration::from_secs(3);
/// Budget a transfer must still have before its fence is written: the catch-up wait, the promote and the re-pointing
/// of the members, with room for a slow dashboard.
pub const TRANSFER_RESERVE: Duration = Duration::from_secs(10);

/// What must be left of a run's budget to start a transfer: [`TRANSFER_RESERVE`], or two fifths of a shorter budget.
#[must_use]
pub fn transfer_reserve(budget: Duration) -> Duration {
    TRANSFER_RESERVE.min(budget * 2 / 5)
}

/// The etcd key of group `gid`'s last [`Handover`]: `<cluster prefix>/handover/<gid>`.
#[must_use]
pub fn handover_key(prefix: &str, gid: u32) -> String {
    format!("{}/handover/{gid}", prefix.trim_end_matches('/'))
}

/// The etcd key under which the failover watcher marks `server` as last seen out of sync with its master (pika's
/// error state or a full sync): `<cluster prefix>/distrust/<server>`.
#[must_use]
pub fn distrust_key(prefix: &str, server: &str) -> String {
    server_mark_key(prefix, DISTRUST, server)
}

/// The folders of the per-server marks, below the cluster prefix.
const DISTRUST: &str = "distrust";
const RELINK: &str = "relink";

/// `<cluster prefix>/<folder>/<server>`, the server in lower case.
fn server_mark_key(prefix: &str, folder: &str, server: &str) -> String {
    format!("{}/{folder}/{}", prefix.trim_end_matches('/'), server.to_ascii_lowercase())
}

/// The marks in `folder` under `prefix` by server, each value read by `parse` (a value it rejects is skipped).
async fn server_marks<T>(
    etcd: &crate::clients::etcd::Etcd,
    prefix: &str,
    folder: &str,
    parse: impl Fn(&str) -> Option<T>,
) -> Result<BTreeMap<String, T>, crate::clients::etcd::Error> {
    let dir = server_mark_key(prefix, folder, "");
    Ok(etcd
        .list(&dir)
        .await?
        .into_iter()
        .filter_map(|(k, e)| Some((k.strip_prefix(&dir)?.to_owned(), parse(&e.value)?)))
        .collect())
}

/// The servers marked out of sync under `prefix` ([`distrust_key`]), with the state each was seen in.
///
/// # Errors
/// etcd's.
pub async fn distrust_marks(
    etcd: &crate::clients::etcd::Etcd,
    prefix: &str,
) -> Result<BTreeMap<String, SyncState>, crate::clients::etcd::Error> {
    server_marks(etcd, prefix, DISTRUST, SyncState::parse).await
}

/// The etcd key marking `server` as copied in full from its master since it was last re-linked:
/// `<cluster prefix>/relink/<server>`. After a full sync pika leaves the replica's rsync client idle but not stopped;
/// the next `SLAVEOF` that replica gets stops it (`RsyncClient::Stop` joins its client thread: 0.5–0.9 s measured)
/// and pika refuses writes until that returns. Unpaid, that is the promote of the next switchover to it, with writes
/// held. The failover watcher re-links such a replica once it is in sync ([`relink`]), paying it off the write path.
#[must_use]
pub fn relink_key(prefix: &str, server: &str) -> String {
    server_mark_key(prefix, RELINK, server)
}

/// Where a replica copied in full stands: [`relink_key`]'s value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelinkMark {
    /// Copied in full; not re-linked since.
    Copied,
    /// Re-linked; the mark goes once it is seen in sync again.
    Relinked,
}

impl RelinkMark {
    /// The value stored in etcd.
    #[must_use]
    pub fn word(self) -> &'static str {
        match self {
            Self::Copied => "copied",
            Self::Relinked => "relinked",
        }
    }

    /// The mark a stored value stands for; an unknown value counts as [`RelinkMark::Copied`].
    #[must_use]
    pub fn parse(value: &str) -> Self {
        if value == Self::Relinked.word() {
            Self::Relinked
        } else {
            Self::Copied
        }
    }
}

/// The replicas marked under `prefix` ([`relink_key`]).
///
/// # Errors
/// etcd's.
pub async fn relink_marks(
    etcd: &crate::clients::etcd::Etcd,
    prefix: &str,
) -> Result<BTreeMap<String, RelinkMark>, crate::clients::etcd::Error> {
    server_marks(etcd, prefix, RELINK, |value| Some(RelinkMark::parse(value))).await
}

/// Marks `server` as about to be copied in full ([`relink_key`]); best effort: without the mark the only cost is
/// the slower first switchover to it.
pub async fn mark_copied(s: &Session<'_>, server: &str) {
    let Ok(etcd) = s.etcd() else { return };
    if let Err(e) = etcd.put(&relink_key(&s.prefix(), server), RelinkMark::Copied.word(), None).await {
        tracing::info!(server, error = %e, "could not mark the replica as copied in full");
    }
}

/// What [`relink`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relink {
    /// Sent `SLAVEOF NO ONE` and `SLAVEOF` to the same master.
    Relinked,
    /// The member is not in sync with the master Codis lists first yet: asked again later.
    NotYet,
    /// Nothing to do: the server left the group, became its master, or is not pika.
    Moot,
}

/// Re-links `server`, a replica of group `gid` that was copied in full, to the master it follows: `SLAVEOF NO ONE`
/// (which stops pika's idle rsync client, see [`relink_key`]) and `SLAVEOF` the same master ([`relink_following`]).
/// Its replication ID and binlog position are unchanged, so it resumes incrementally. The caller holds the group's
/// transfer lock. Codis never routes to the member in between. Not while a split of the group is
/// under way: its cutover waits for the member to be level with the donor.
///
/// # Errors
/// Codis', or pika's when a command is refused.
pub async fn relink(s: &Session<'_>, gid: u32, server: &str) -> Result<Relink> {
    let stats = s.stats().await?;
    let Some(group) = stats.group(gid) else { return Ok(Relink::Moot) };
    let Some(master) = group.master() else { return Ok(Relink::Moot) };
    if !group.servers.iter().skip(1).any(|gs| gs.server.eq_ignore_ascii_case(server)) {
        return Ok(Relink::Moot);
    }
    // A split under way (its alias listed as master) or a promote: the member must not drop out of sync now.
    if group.is_promoting() || ServerAddr::of(master).is_alias() {
        return Ok(Relink::NotYet);
    }
    let done = relink_following(s, server, master).await?;
    if done == Relink::Relinked {
        tracing::info!(server, master, "re-linked a replica copied in full, stopping pika's idle rsync client");
    }
    Ok(done)
}

/// The two commands of a re-link, sent to `server` only when it is a pika that follows `master` in sync (else
/// [`Relink::Moot`] for another server, [`Relink::NotYet`] for one not in sync). `SLAVEOF` waits (at most
/// [`LINK_DROP_WAIT`]) until `master` lists no link of `server`: pika's first try to link comes at once, and a master
/// still listing the old link refuses it ("Slave AlreadyExist"), after which pika tries again only about 10 s later
/// (seen: a split's cutover 11 s late).
///
/// # Errors
/// pika's, when a command is refused.
pub(crate) async fn relink_following(s: &Session<'_>, server: &str, master: &str) -> Result<Relink> {
    let master_at = s.dial(master)?;
    let conn = s.pika(server).await?;
    let info = conn.info_replication().await?;
    if info.kind != pika::ServerKind::Pika {
        return Ok(Relink::Moot);
    }
    if !info.follows(&master_at) || !info.in_sync() {
        return Ok(Relink::NotYet);
    }
    conn.slaveof_no_one().await?;
    await_link_dropped(s, &master_at, server).await;
    conn.slaveof(&master_at).await?;
    Ok(Relink::Relinked)
}

/// How often [`await_link_dropped`] asks whether the master dropped the old link.
const LINK_DROP_POLL: Duration = Duration::from_millis(50);

/// How long a re-link waits for the master to drop the old link: the replica closes it at its next 3 s replication
/// cron.
const LINK_DROP_WAIT: Duration = Duration::from_millis(3500);

/// How long a re-linked replica may try to link before the pair is sent again ([`relink_again`]).
pub const LINK_STALL: Duration = Duration::from_secs(4);

/// Sends the pair of a re-link again to `server`, which follows `master` and has been trying to link since (at least
/// [`LINK_STALL`], the caller's count): its master refused the new link while it still listed the old one ("Slave
/// AlreadyExist"), or dropped the new one at its cron with the old, and pika tries again only about 10 s later (seen:
/// 11 to 15 s to the link up). Only once `master` lists no link of it, and only while it still follows `master`
/// with its link down and connecting; returns whether it sent. The caller holds what guards the group's members.
///
/// # Errors
/// pika's, when a command is refused.
pub(crate) async fn relink_again(s: &Session<'_>, server: &str, master: &str) -> Result<bool> {
    if lists_replica(s, master, server).await {
        return Ok(false);
    }
    let at = s.dial(master)?;
    let conn = s.pika(server).await?;
    let now = conn.info_replication().await?;
    if !(now.follows(&at) && !now.link_up && now.sync == Some(SyncState::Connecting)) {
        return Ok(false);
    }
    conn.slaveof_no_one().await?;
    conn.slaveof(&at).await?;
    tracing::info!(server, master, "linked the replica to its master again: pika was to retry later");
    Ok(true)
}

/// Copies `server`, a replica of group `gid` copied in full and not re-linked since, in full again when its link is
/// down and its master lists no link of it: pika dropped its first link after the copy, which a refusal cannot
/// explain (nothing re-linked it). Seen in a split: the master refused the replica's acks after a session mismatch
/// ("UpdateAckedInfo failed") and closed the link, and the replica, linked again, resumed past 35 writes it had never
/// applied. Returns whether it copied. Not while the group is promoting or serves through a split's alias (the
/// split's runs see to its pods). The caller holds the group's transfer lock.
///
/// # Errors
/// Codis', or pika's when a command is refused.
pub async fn copy_again_if_dropped(s: &Session<'_>, gid: u32, server: &str) -> Result<bool> {
    let stats = s.stats().await?;
    let Some(group) = stats.group(gid) else { return Ok(false) };
    let Some(master) = group.master() else { return Ok(false) };
    let member = group.servers.iter().skip(1).any(|gs| gs.server.eq_ignore_ascii_case(server));
    if !member || group.is_promoting() || ServerAddr::of(master).is_alias() || lists_replica(s, master, server).await {
        return Ok(false);
    }
    let at = s.dial(master)?;
    let conn = s.pika(server).await?;
    let info = conn.info_replication().await?;
    let dropped = info.kind == pika::ServerKind::Pika
        && info.follows(&at)
        && !info.link_up
        && info.sync == Some(SyncState::Connecting);
    if !dropped {
        return Ok(false);
    }
    tracing::warn!(server, master, "the replica's first link after its full copy dropped: copying it again in full");
    copy_in_full(&conn, &at, &info, false).await?;
    Ok(true)
}

/// Waits, holding no lock, at most `wait`, until `server`, just re-linked to `master` (group `gid`'s), has its link
/// up again, sending the pair again under the group's transfer lock ([`relink_again`]) when pika stalls; gives up
/// quietly when the lock is busy, the group's master changed, or the replica left `master` or fell out of sync in
/// another way (the watcher's sweep sees to those).
///
/// # Errors
/// Codis's or etcd's, when they cannot be read.
pub async fn await_relinked(s: &Session<'_>, gid: u32, server: &str, master: &str, wait: Duration) -> Result<()> {
    let at = s.dial(master)?;
    let deadline = tokio::time::Instant::now() + wait;
    let mut since = tokio::time::Instant::now();
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(s.ctx.budget.cap(POLL)).await;
        let Ok(info) = s.replication(server).await else { continue };
        if !info.follows(&at) || info.link_up || info.sync != Some(SyncState::Connecting) {
            return Ok(());
        }
        if since.elapsed() < LINK_STALL {
            continue;
        }
        let mut lock = match lock_group(s, gid, Duration::ZERO).await {
            Ok(lock) => lock,
            Err(Error::InProgress { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        let sent = async {
            let stats = s.stats().await?;
            if !group_of(&stats, gid)?.master().is_some_and(|m| m.eq_ignore_ascii_case(master)) {
                return Ok(None);
            }
            relink_again(s, server, master).await.map(Some)
        }
        .await;
        crate::steps::cluster::release(&mut lock).await;
        match sent? {
            None => return Ok(()),
            Some(true) => since = tokio::time::Instant::now(),
            Some(false) => {}
        }
    }
    Ok(())
}

/// Whether `master` lists `server` among its replicas (a link of `server` it has not dropped yet); `true` when
/// that cannot be told.
pub(crate) async fn lists_replica(s: &Session<'_>, master: &str, server: &str) -> bool {
    let Ok(at) = s.dial(master) else { return true };
    let Some(links) = MasterLinks::open(s, &at, server).await else { return true };
    links.lists().await.unwrap_or(true)
}

/// Waits, at most [`LINK_DROP_WAIT`], until the pika at `master` lists no link of `server`; waits no more once that
/// cannot be told (a master that does not answer, as a dead old master, keeps no link anyone needs gone).
async fn await_link_dropped(s: &Session<'_>, master: &HostPort, server: &str) {
    let deadline = tokio::time::Instant::now() + s.ctx.budget.cap(LINK_DROP_WAIT);
    let Some(links) = MasterLinks::open(s, master, server).await else { return };
    while tokio::time::Instant::now() < deadline && links.lists().await == Some(true) {
        tokio::time::sleep(s.ctx.budget.cap(LINK_DROP_POLL)).await;
    }
}

/// One master's replica links, asked about one replica: the replica's addresses resolved once and one connection to
/// the master kept, so that a wait polling every [`LINK_DROP_POLL`] neither resolves nor dials and authenticates
/// each time.
struct MasterLinks {
    conn: Pika,
    /// The replica's socket addresses, as the master lists a link (IP and port).
    replica: Vec<std::net::SocketAddr>,
}

impl MasterLinks {
    /// `None` when `server` does not resolve or `master` cannot be reached in time.
    async fn open(s: &Session<'_>, master: &HostPort, server: &str) -> Option<Self> {
        let at = s.dial(server).ok()?;
        let lookup = tokio::net::lookup_host((at.host().to_owned(), at.port()));
        let replica = tokio::time::timeout(s.ctx.budget.cap(CALL_TIMEOUT), lookup).await.ok()?.ok()?.collect();
        let timeout = s.ctx.budget.cap(CALL_TIMEOUT);
        let conn = Pika::connect(master, s.ctx.secrets.pika_password.as_deref(), timeout).await.ok()?;
        Some(Self { conn, replica })
    }

    /// Whether the master lists a link of the replica; `None` when it does not answer.
    async fn lists(&self) -> Option<bool> {
        let info = self.conn.info_replication().await.ok()?;
        Some(info.replicas.iter().any(|r| {
            let ip = r.ip.parse::<std::net::IpAddr>().ok();
            self.replica.iter().any(|a| Some(a.ip()) == ip && a.port() == r.port)
        }))
    }
}

/// The servers the watcher last saw out of sync, with what it saw. Empty when etcd cannot say: the members' own
/// `INFO` still decides then.
async fn distrusted(s: &Session<'_>) -> BTreeMap<String, SyncState> {
    let Ok(etcd) = s.etcd() else { return BTreeMap::new() };
    match distrust_marks(etcd, &s.prefix()).await {
        Ok(marks) => marks,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read which members the watcher saw out of sync");
            BTreeMap::new()
        }
    }
}

/// What the watcher saw before the master died counts where the member's own `INFO` no longer can tell: pika turns
/// a replica's `error` into `no_connect` once its master is gone. A member in sync now is judged by what it says.
fn apply_distrust(members: &mut [MemberFacts], servers: &[String], seen: &BTreeMap<String, SyncState>) {
    for member in members.iter_mut().filter(|m| m.sync != Some(SyncState::Connected)) {
        let server = servers.iter().find(|srv| ServerAddr::of(srv).pod() == member.pod);
        if let Some(state) = server.and_then(|srv| seen.get(&srv.to_ascii_lowercase())) {
            member.sync = Some(member.sync.map_or(*state, |live| live.max(*state)));
        }
    }
}

/// The etcd key of group `gid`'s fence: `<cluster prefix>/fence/<gid>`.
#[must_use]
pub fn fence_key(prefix: &str, gid: u32) -> String {
    format!("{}/fence/{gid}", prefix.trim_end_matches('/'))
}

// ---- what to do with one member ----------------------------------------------------------------------------------

/// What [`converge`] does with one member, given its `INFO replication` and the master's dial address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberStep {
    /// It already replicates the master (the link may still be syncing).
    Follows,
    /// It must be pointed at the master now.
    Repoint,
    /// It must follow the master but still has this many replicas of its own: pika would refuse SLAVEOF
    /// (`already master of others`), so its replicas are re-pointed first and this one waits.
    WaitForReplicas(u32),
}

/// Decides [`MemberStep`] for a member whose `INFO replication` reads `info`.
#[must_use]
pub fn member_step(info: &Replication, master: &HostPort) -> MemberStep {
    if info.follows(master) {
        MemberStep::Follows
    } else if info.connected_slaves > 0 {
        MemberStep::WaitForReplicas(info.connected_slaves)
    } else {
        MemberStep::Repoint
    }
}

// ---- surveying a group --------------------------------------------------------------------------------------------

/// `INFO replication` of each of `servers`, asked concurrently (a dead pod costs one timeout, not one per member);
/// an error text for those that could not be asked.
pub async fn survey(s: &Session<'_>, servers: &[String]) -> BTreeMap<String, Result<Replication, String>> {
    survey_within(s, servers, CALL_TIMEOUT).await
}

/// [`survey`] with a shorter timeout per member: a failover asks only members that answer promptly.
pub async fn survey_within(
    s: &Session<'_>,
    servers: &[String],
    timeout: Duration,
) -> BTreeMap<String, Result<Replication, String>> {
    ask(s, servers, timeout)
        .await
        .into_iter()
        .map(|(server, asked)| (server, asked.map_err(Unanswered::text)))
        .collect()
}

/// The survey of an unplanned transfer: members get [`UNPLANNED_SURVEY_TIMEOUT`], and when none answered and some
/// only ran out of time, those are asked again within [`CALL_TIMEOUT`]. A pika replica stalls for seconds when its
/// master's connection drops (2.4 s measured after a SIGKILL of the master), which is when a member-leave of a dead
/// master asks; a failover that waited out its detection time finds them answering again.
pub async fn survey_unplanned(s: &Session<'_>, servers: &[String]) -> BTreeMap<String, Result<Replication, String>> {
    let first = ask(s, servers, UNPLANNED_SURVEY_TIMEOUT).await;
    let slow: Vec<String> = first
        .iter()
        .filter(|(_, asked)| matches!(asked, Err(Unanswered::Slow(_))))
        .map(|(server, _)| server.clone())
        .collect();
    let answered = first.values().any(Result::is_ok);
    let mut out: BTreeMap<_, _> =
        first.into_iter().map(|(server, asked)| (server, asked.map_err(Unanswered::text))).collect();
    if !answered && !slow.is_empty() {
        tracing::info!(members = slow.join(", "), "no member answered in time; asking the slow ones again");
        out.extend(survey(s, &slow).await);
    }
    out
}

/// Why a member gave no `INFO`.
enum Unanswered {
    /// It did not answer in time.
    Slow(String),
    /// Anything else: refused, failed, not resolvable.
    Failed(String),
}

impl Unanswered {
    fn text(self) -> String {
        match self {
            Self::Slow(e) | Self::Failed(e) => e,
        }
    }
}

/// `INFO replication` of each of `servers` within `timeout`, concurrently.
async fn ask(
    s: &Session<'_>,
    servers: &[String],
    timeout: Duration,
) -> BTreeMap<String, Result<Replication, Unanswered>> {
    let timeout = s.ctx.budget.cap(timeout);
    let mut tasks = tokio::task::JoinSet::new();
    for server in servers {
        let server = server.clone();
        let dial = s.dial(&server).map_err(|e| Unanswered::Failed(e.one_line()));
        let password = s.ctx.secrets.pika_password.clone();
        tasks.spawn(async move {
            let unanswered = |e: crate::clients::pika::Error| match e {
                crate::clients::pika::Error::Timeout { .. } => Unanswered::Slow(e.to_string()),
                e => Unanswered::Failed(e.to_string()),
            };
            let info = match dial {
                Err(e) => Err(e),
                Ok(at) => match Pika::connect(&at, password.as_deref(), timeout).await {
                    Ok(conn) => conn.info_replication().await.map_err(unanswered),
                    Err(e) => Err(unanswered(e)),
                },
            };
            (server, info)
        });
    }
    let mut out = BTreeMap::new();
    while let Some(joined) = tasks.join_next().await {
        if let Ok((server, info)) = joined {
            out.insert(server, info);
        }
    }
    out
}

/// The facts [`plan::choose_new_master`] ranks, for the master `from` and every other member of `group`.
///
/// Replicas rank by binlog position, compared as pairs. When the master cannot be asked (a member-leave of a dead
/// pod, a failover, a master restarting), no replica's link can be up, so the link is not required: the replica
/// with the most data is the one to promote. A replica that may hold nothing then counts as not eligible (see
/// [`member_facts_with`]): promoting it would make every other member resync from an empty master. Without knowing
/// better, the group is taken to have held data. A replica in pika's error state or in a full sync is unfit
/// whatever it says of its eligibility.
///
/// The fork's health `state` vetoes only `2` (offline): `1` (one missed check) is the fork's own stale guess, which
/// the fresh `INFO` asked here supersedes, and under this product's dormant fork settings it is not re-checked for
/// an hour.
#[must_use]
pub fn member_facts(
    group: &Group,
    from: &str,
    master_dial: &HostPort,
    infos: &BTreeMap<String, Result<Replication, String>>,
) -> (MemberFacts, Vec<MemberFacts>) {
    member_facts_with(group, from, master_dial, infos, true)
}

/// [`member_facts`], knowing whether the group ever held data (`held_data`, [`crate::steps::failover`]'s mark): with the
/// master gone, a replica at offset 0 is unfit only when the group held data, since then it cannot have it; a
/// replica whose link never came up since it started is unfit either way.
#[must_use]
pub fn member_facts_with(
    group: &Group,
    from: &str,
    master_dial: &HostPort,
    infos: &BTreeMap<String, Result<Replication, String>>,
    held_data: bool,
) -> (MemberFacts, Vec<MemberFacts>) {
    let master_down = infos.get(from).is_none_or(Result::is_err);
    let others: Vec<&str> =
        group.servers.iter().map(|gs| gs.server.as_str()).filter(|srv| !srv.eq_ignore_ascii_case(from)).collect();
    let facts = |srv: &str| {
        let info = infos.get(srv).and_then(|r| r.as_ref().ok());
        let state_ok = group.server(srv).is_none_or(|gs| gs.state.unwrap_or(0) != 2);
        let never_synced =
            master_down && info.is_some_and(|i| i.never_linked || (held_data && i.offset.unwrap_or(0) == 0));
        MemberFacts {
            pod: ServerAddr::of(srv).pod().to_owned(),
            ordinal: ServerAddr::of(srv).ordinal().unwrap_or(0),
            reachable: info.is_some(),
            role_slave: info.is_some_and(|i| i.role.is_slave()),
            follows_current: info.is_some_and(|i| i.follows(master_dial)),
            link_up: info.is_some_and(|i| i.link_up || master_down),
            sync: info.and_then(|i| i.sync),
            eligible: if never_synced { Some(false) } else { info.and_then(|i| i.eligible) },
            position: info.and_then(|i| i.position),
            codis_state_ok: state_ok,
        }
    };
    let current = MemberFacts { reachable: !master_down, ..facts(from) };
    (current, others.into_iter().map(facts).collect())
}

// ---- the transfer -------------------------------------------------------------------------------------------------

/// What to transfer.
#[derive(Debug, Clone)]
pub struct Transfer<'a> {
    /// The group.
    pub gid: u32,
    /// The server to move mastership away from (`<fqdn>:<port>`). When Codis no longer lists it at index 0 nothing
    /// is promoted: the group is only converged on its current master.
    pub from: String,
    /// The requested new master's pod name and the variable it came from (refusals name it, exit 2).
    pub candidate: Option<(String, &'static str)>,
    /// Which pods the rollout in progress already updated, when known.
    pub rollout: Option<&'a RolloutFacts>,
    /// The old master is gone or about to start empty (a failover, or `rejoin` handing over): it is not asked
    /// anything (it cannot answer, or would answer only after a timeout), nobody waits for replicas to catch up
    /// with it, members are given [`UNPLANNED_SURVEY_TIMEOUT`] to answer, and an unreachable proxy does not stop
    /// the promote (writes to the group fail anyway until it is done).
    pub unplanned: bool,
}

/// How long a member may take to answer `INFO` during an unplanned transfer.
pub const UNPLANNED_SURVEY_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a per-group transfer lock outlives a holder that crashed: short, because a failover waits for it.
pub const GROUP_LOCK_TTL: Duration = Duration::from_secs(6);

/// The etcd key of group `gid`'s transfer lock: `<cluster prefix>/locks/group-<gid>`.
#[must_use]
pub fn group_lock_key(prefix: &str, gid: u32) -> String {
    format!("{}/locks/group-{gid}", prefix.trim_end_matches('/'))
}

/// The etcd key the failover watchers elect their leader with: `<cluster prefix>/locks/watcher`.
#[must_use]
pub fn watcher_key(prefix: &str) -> String {
    format!("{}/locks/watcher", prefix.trim_end_matches('/'))
}

/// Whether a failover watcher leads now (someone holds or queues for [`watcher_key`]): then a member left a master
/// is re-pointed by its sweeps. `false` when etcd cannot say.
pub async fn watcher_leads(s: &Session<'_>) -> bool {
    let Ok(etcd) = s.etcd() else { return false };
    let queue = format!("{}/", watcher_key(&s.prefix()));
    etcd.list(&queue).await.is_ok_and(|held| !held.is_empty())
}

/// Takes group `gid`'s transfer lock, waiting at most `wait`.
///
/// Every transfer of a group's mastership holds it: switchover and member-leave (inside the topology lock), the
/// failover watcher and `rejoin` (without the topology lock, which a drain may hold for minutes while it waits on
/// the very group that lost its master). So two transfers of one group never interleave, and recovery never waits
/// behind a topology change.
///
/// # Errors
/// [`Error::InProgress`] when another holder kept it for the whole wait; etcd errors.
pub async fn lock_group(s: &Session<'_>, gid: u32, wait: Duration) -> Result<LockGuard> {
    let key = group_lock_key(&s.prefix(), gid);
    let holder = format!("{} {}", s.ctx.action, std::process::id());
    match s.etcd()?.lock(&key, GROUP_LOCK_TTL, wait, &holder).await {
        Ok(guard) => Ok(guard),
        Err(crate::clients::etcd::Error::LockBusy { holder, .. }) => Err(Error::InProgress {
            progress: format!(
                "waiting for group {gid}'s transfer lock, held by {}",
                holder.as_deref().unwrap_or("another transfer")
            ),
        }),
        Err(e) => Err(e.into()),
    }
}

/// Runs `work` holding group `gid`'s transfer lock ([`lock_group`], waiting at most a third of the budget left), and
/// releases the lock whatever `work` returned.
///
/// # Errors
/// [`lock_group`]'s, and `work`'s.
pub async fn under_group_lock<T>(s: &Session<'_>, gid: u32, work: impl AsyncFnOnce() -> Result<T>) -> Result<T> {
    let mut lock = lock_group(s, gid, s.ctx.budget.cap(s.ctx.budget.remaining() / 3)).await?;
    let result = work().await;
    crate::steps::cluster::release(&mut lock).await;
    result
}

/// What a transfer did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The group.
    pub gid: u32,
    /// Its master at the end (Codis's `servers[0]`, confirmed a master that every reachable member follows).
    pub master: String,
    /// Whether this run promoted (or finished promoting) a member.
    pub promoted: bool,
    /// Why that member, when this run chose one.
    pub basis: Option<String>,
    /// What converging the group did.
    pub converged: Converged,
}

impl Outcome {
    /// One line for stdout.
    #[must_use]
    pub fn describe(&self, from: &str) -> String {
        let what = if self.promoted {
            format!(
                "group {}: master moved from {from} to {}{}",
                self.gid,
                self.master,
                self.basis.as_ref().map(|b| format!(" ({b})")).unwrap_or_default()
            )
        } else if self.master.eq_ignore_ascii_case(from) {
            format!("group {}: {from} stays master", self.gid)
        } else {
            format!("group {}: master is {}", self.gid, self.master)
        };
        format!("{what}; {}", self.converged.describe())
    }
}

/// Moves group `t.gid`'s mastership away from `t.from` and converges the group; must run under `guards` (the
/// group's transfer lock, plus the topology lock or the watcher's election lease), every one of which is checked
/// to be still held right before the promote.
///
/// Idempotent: when Codis already lists another master (a previous run got that far, or the fork failed over) it
/// only converges; a promote left in progress is resumed with its own address; a fence left by a crashed run is
/// honoured while its member is still fit.
///
/// # Errors
/// [`Error::InvalidInput`] for an unfit candidate (nothing changed); a [`Refusal`] when no replica can take over
/// or the fence changed under us; [`Error::InProgress`] when the budget ran out (the rerun resumes).
pub async fn move_master(s: &Session<'_>, guards: &[&LockGuard], t: &Transfer<'_>) -> Result<Outcome> {
    let gid = t.gid;
    let mut promoted = false;
    let mut basis = None;
    let mut attempts = 0u32;
    let mut released_stale_hold = false;
    loop {
        s.ctx.budget.check(|| format!("transfer of group {gid}'s master away from {} in progress", t.from))?;
        attempts += 1;
        if attempts > 20 {
            return Err(Refusal::KeepsChanging { gid }.into());
        }
        let stats = s.stats().await?;
        let group = group_of(&stats, gid)?;
        if group.is_promoting() {
            let target = promoting_target(group)?;
            tracing::info!(gid, target = %target, "resuming a promote left in progress, with the same address");
            promote(s, gid, &target).await?;
            promoted = true;
            basis.get_or_insert_with(|| "resumed the promote left in progress".to_owned());
            continue;
        }
        let master = group.master().ok_or(Refusal::NoServers { gid })?.to_owned();
        if !master.eq_ignore_ascii_case(&t.from) {
            let converged = converge_after_transfer(s, gid).await?;
            clear_fence(s, gid, &converged.master).await;
            return Ok(Outcome { gid, master: converged.master.clone(), promoted, basis, converged });
        }
        if promoted {
            return Err(Refusal::NotPromoted { gid, master }.into());
        }
        // A split moves mastership itself; and the donor's master stays until the split no longer copies it.
        if !t.unplanned {
            let splitting = crate::steps::split::alias_in(group).map(|_| gid);
            if let Some(g) = splitting.or_else(|| crate::steps::split::aliased_by(&stats, &master).map(|g| g.id)) {
                return Err(Error::InProgress {
                    progress: format!("group {g} is splitting off {master}; the master moves once the split is done"),
                });
            }
        }
        if group.servers.len() < 2 {
            return Err(Refusal::OnlyServer { gid, master }.into());
        }

        // Choose, honouring a fence left by an earlier run.
        let servers: Vec<String> = group.servers.iter().map(|gs| gs.server.clone()).collect();
        let infos = if t.unplanned {
            let others: Vec<String> =
                servers.iter().filter(|srv| !srv.eq_ignore_ascii_case(&master)).cloned().collect();
            survey_unplanned(s, &others).await
        } else {
            survey(s, &servers).await
        };
        let master_at = s.dial(&master)?;
        let held_data =
            if infos.get(&master).is_some_and(Result::is_ok) { true } else { group_held_data(s, gid).await };
        let (current, mut members) = member_facts_with(group, &master, &master_at, &infos, held_data);
        apply_distrust(&mut members, &servers, &distrusted(s).await);
        let key = fence_key(&s.prefix(), gid);
        let fence = s.etcd()?.get(&key).await?;
        // A fence left by a run that stopped (this one holds the group's lock): it may have stopped while the proxies
        // held the group's writes, so the dashboard's view is pushed to them first.
        if fence.is_some() && !released_stale_hold {
            crate::steps::hold::release(s, gid).await;
            released_stale_hold = true;
        }
        let fenced = fence.as_ref().map(|e| ServerAddr::of(&e.value).pod().to_owned());
        let choice = match decide(&current, &members, t.candidate.as_ref(), fenced.as_deref(), t.rollout) {
            // A replica that just restarted is back in sync within moments: wait for it while the budget allows
            // (KubeBlocks deletes the master's pod whatever the switchover answers).
            Err(Error::Transfer(Refusal::NoSuccessor { .. }))
                if !t.unplanned
                    && members.iter().any(MemberFacts::catching_up)
                    && s.ctx.budget.remaining()
                        > transfer_reserve(s.ctx.budget.elapsed() + s.ctx.budget.remaining()) + POLL =>
            {
                tracing::info!(gid, "no replica is in sync yet; waiting for one that is catching up");
                attempts -= 1;
                tokio::time::sleep(s.ctx.budget.cap(POLL)).await;
                continue;
            }
            other => other?,
        };
        let to = servers
            .iter()
            .find(|srv| ServerAddr::of(srv).pod() == choice.pod)
            .cloned()
            .ok_or_else(|| Refusal::ChosenVanished { gid, pod: choice.pod.clone() })?;
        let why = describe_basis(&choice, t.rollout, fenced.as_deref());
        tracing::info!(gid, from = %master, to = %to, basis = %why, "transferring the master");

        // A promote pushes the group's slots to every proxy; one the dashboard cannot reach would leave it stuck in
        // `preparing` with the group locked. Refuse before anything is written.
        if let Some((proxy, why)) = stats.unreachable_proxy().filter(|_| !t.unplanned) {
            return Err(Refusal::ProxyUnreachable { gid, proxy: proxy.admin_addr.clone(), why: why.to_owned() }.into());
        }
        // Promoting and converging take a few seconds at most; a run with less left would stop halfway.
        let reserve = transfer_reserve(s.ctx.budget.elapsed() + s.ctx.budget.remaining());
        if s.ctx.budget.remaining() < reserve {
            return Err(Error::InProgress {
                progress: format!(
                    "only {:?} of the budget left, less than the {reserve:?} a transfer needs; nothing was promoted",
                    s.ctx.budget.remaining()
                ),
            });
        }
        delete_dumps_of(s, &to).await?;
        write_fence(s, gid, fence.as_ref(), &to).await?;
        if !t.unplanned {
            catch_up(s, &master, &to, CLOSE_ENOUGH_BYTES).await;
        }

        // Compare before acting: the fence still names our target, we still hold the lock, Codis has not moved.
        let now = s.etcd()?.get(&key).await?;
        if now.as_ref().map(|e| e.value.as_str()) != Some(to.as_str()) {
            return Err(Refusal::FenceMoved { gid, to, now: now.map(|e| e.value) }.into());
        }
        for guard in guards {
            if !guard.is_held().await {
                return Err(Refusal::LockLost { key: guard.key().to_owned(), to }.into());
            }
        }
        let fresh = s.stats().await?;
        let g = group_of(&fresh, gid)?;
        if g.is_promoting() || !g.master().is_some_and(|m| m.eq_ignore_ascii_case(&master)) || g.server(&to).is_none() {
            tracing::info!(gid, "group changed while preparing the transfer; looking again");
            continue;
        }
        if t.unplanned {
            record_handover(s, gid, &master, &to, true, None).await?;
            promote(s, gid, &to).await?;
        } else {
            match promote_held(s, &fresh, gid, &master, &to).await {
                Err(Error::Transfer(Refusal::NotCaughtUp { .. })) => continue,
                other => other?,
            }
        }
        promoted = true;
        basis = Some(why);
    }
}

/// A split's cutover: group `gid` serves its slots through `alias` (the donor's master, under its alias) and `to`,
/// a replica of the donor's master, takes them over. Fenced like a planned transfer: the fence names `to`, the
/// proxies hold the group's slots (and only those: the donor's own slots route to the unaliased address and keep
/// taking writes), the donor's binlog position is read after that, `to` must reach it, and only then does Codis
/// promote `to`. The [`Handover`] it records (from the alias) lets the shard's other pods re-point to `to` without a
/// full copy when their history goes no further than `to`'s at the promote. A fence left by a run that stopped may
/// leave the proxies holding: it is released first. The caller holds the topology lock; clears the fence once the
/// group converged ([`clear_fence`]).
///
/// # Errors
/// [`Refusal::NotCaughtUp`] when `to` did not reach the donor's position within [`crate::steps::hold::CATCH_UP_WHILE_HELD`]
/// (the hold is released, nothing promoted: try again); a fence that changed under us; Codis or pika errors.
pub async fn promote_split(s: &Session<'_>, gid: u32, alias: &str, to: &str) -> Result<()> {
    let key = fence_key(&s.prefix(), gid);
    let fence = s.etcd()?.get(&key).await?;
    if fence.is_some() {
        crate::steps::hold::release(s, gid).await;
    }
    delete_dumps_of(s, to).await?;
    write_fence(s, gid, fence.as_ref(), to).await?;
    catch_up(s, alias, to, CLOSE_ENOUGH_BYTES).await;
    let stats = s.stats().await?;
    promote_held(s, &stats, gid, alias, to).await
}

/// Deletes the dumps of `to`, a pika about to be promoted (`DELBACKUP`). A master answers a replica's full sync with
/// the dump it already has while that dump's binlog file exists (`PikaServer::TryDBSync`), without checking that its
/// data still comes from it; a pod's data is replaced whenever it copies a master in full (by the product, by a
/// split, or by pika on its own), and only masters serve copies: every pod the product makes a master passes here,
/// so none serves a dump from before its data was last replaced (seen: a pod joining got the empty dump of the
/// cluster's creation and lost 33,120 keys). A replica serves no copy, so nothing in use is deleted; the next copy
/// makes a new dump.
///
/// # Errors
/// pika's, when `to` does not answer or refuses.
async fn delete_dumps_of(s: &Session<'_>, to: &str) -> Result<()> {
    let conn = s.pika(to).await?;
    if conn.info_replication().await?.kind == pika::ServerKind::Pika {
        conn.delete_dumps().await?;
    }
    Ok(())
}

/// The promote of a planned transfer, with the group's writes held at the proxies ([`crate::steps::hold`]) from
/// before the new master's last catch-up to the end of the promote, so the new master has every write the old one
/// acknowledged. The hold is released if anything fails before Codis takes it over.
async fn promote_held(s: &Session<'_>, stats: &Stats, gid: u32, master: &str, to: &str) -> Result<()> {
    use crate::steps::hold;
    let result = async {
        let since = std::time::Instant::now();
        let held = hold::hold(s, stats, master).await?;
        tracing::info!(gid, proxies = held.proxies, slots = held.slots, "writes held at the proxies");
        let Some(at) = hold::caught_up(s, master, to).await else {
            return Err(Refusal::NotCaughtUp { gid, to: to.to_owned() }.into());
        };
        let caught_up_ms = since.elapsed().as_millis();
        record_handover(s, gid, master, to, false, Some(at)).await?;
        promote(s, gid, to).await?;
        // Codis's promote ends by routing the slots, unlocked, to the new master: the hold ends here.
        tracing::info!(gid, caught_up_ms, held_ms = since.elapsed().as_millis(), at = %at, "promoted with writes held");
        Ok(())
    }
    .await;
    if result.is_err() {
        hold::release(s, gid).await;
    }
    result
}

/// Writes the [`Handover`] of `to` replacing `from`, with `to`'s replication ID and its binlog position: `at` when
/// the caller measured it with writes held, else read now, before the promote (the position can only grow until
/// the promote, so members judged against it are never wrongly trusted). A record that names a promote which then
/// never happened only makes members resync in full.
async fn record_handover(
    s: &Session<'_>,
    gid: u32,
    from: &str,
    to: &str,
    unplanned: bool,
    at: Option<crate::input::replication::BinlogPosition>,
) -> Result<()> {
    let info = s.replication(to).await?;
    let record = Handover {
        to: to.to_owned(),
        from: from.to_owned(),
        unplanned,
        replication_id: info.replication_id,
        position: at.or(info.position).unwrap_or_default(),
        // A split promotes off its donor's master under its alias, which goes on serving the donor's own slots.
        from_kept_writing: ServerAddr::of(from).is_alias(),
    };
    // Strings and numbers only: serialising cannot fail, and an unreadable record only means full resyncs.
    let value = serde_json::to_string(&record).unwrap_or_default();
    s.etcd()?.put(&handover_key(&s.prefix(), gid), &value, None).await?;
    Ok(())
}

/// Group `gid`'s last [`Handover`]; `None` when there is none or it cannot be read (then members resync in full).
pub async fn read_handover(s: &Session<'_>, gid: u32) -> Option<Handover> {
    let etcd = s.etcd().ok()?;
    match etcd.get(&handover_key(&s.prefix(), gid)).await {
        Ok(entry) => entry.and_then(|e| serde_json::from_str(&e.value).ok()),
        Err(e) => {
            tracing::warn!(gid, error = %e, "cannot read the group's handover record; re-pointed members resync in full");
            None
        }
    }
}

/// Whether group `gid` held data, for judging replicas at replication offset 0: `true` once the watcher saw its
/// master above offset 0, or when etcd cannot say. Without a mark a replica at offset 0 that completed a sync still
/// counts as fit: it copied a master that had taken no write (a replica that never linked is unfit anyway).
pub async fn group_held_data(s: &Session<'_>, gid: u32) -> bool {
    let Ok(etcd) = s.etcd() else { return true };
    match etcd.get(&crate::steps::failover::held_data_key(&s.prefix(), gid)).await {
        Ok(mark) => {
            crate::steps::failover::HeldData::of(mark.as_ref().map(|e| e.value.as_str()))
                == crate::steps::failover::HeldData::Held
        }
        Err(_) => true,
    }
}

/// The choice: the candidate when given (refused with exit 2 naming its variable when unfit); else the fenced
/// member when it is still fit (a crashed run's target, so a rerun never promotes a second member); else the rule.
fn decide(
    current: &MemberFacts,
    members: &[MemberFacts],
    candidate: Option<&(String, &'static str)>,
    fenced: Option<&str>,
    rollout: Option<&RolloutFacts>,
) -> Result<plan::Choice> {
    if let Some((pod, var)) = candidate {
        return plan::choose_new_master(current, members, Some(pod), None).map_err(|e| match e {
            ChoiceError::BadCandidate { .. } => Error::invalid(*var, format!("{e}; nothing was changed")),
            other @ ChoiceError::NoHealthyReplica { .. } => Refusal::Choice(other).into(),
        });
    }
    if let Some(pod) = fenced.filter(|p| *p != current.pod) {
        if let Ok(choice) = plan::choose_new_master(current, members, Some(pod), None) {
            return Ok(choice);
        }
        tracing::info!(fenced = pod, "the fenced member can no longer take over; choosing again");
    }
    plan::choose_new_master(current, members, None, rollout).map_err(|e| {
        let detail: Vec<String> = members
            .iter()
            .filter(|m| m.pod != current.pod)
            .filter_map(|m| m.unfit_reason().map(|r| format!("{}: {r}", m.pod)))
            .collect();
        Refusal::NoSuccessor { source: e, unfit: detail }.into()
    })
}

fn describe_basis(choice: &plan::Choice, rollout: Option<&RolloutFacts>, fenced: Option<&str>) -> String {
    match choice.basis {
        Basis::Candidate if fenced == Some(choice.pod.as_str()) => {
            "the member an earlier run fenced for this transfer".to_owned()
        }
        Basis::Candidate => "the requested candidate".to_owned(),
        Basis::Ranked { healthy } => match rollout {
            Some(r) if r.updated.contains(&choice.pod) => {
                format!("healthy and already updated in this rollout, best of {healthy} healthy replica(s)")
            }
            Some(_) => format!("no healthy replica is updated yet; ordinal rule over {healthy} healthy replica(s)"),
            None => format!("no rollout facts; ordinal rule over {healthy} healthy replica(s)"),
        },
    }
}

/// Writes the fence naming `to`, comparing with the value read (`current`); a fence that changed in between means
/// another transfer is deciding too, and this one stops with nothing done.
async fn write_fence(s: &Session<'_>, gid: u32, current: Option<&Entry>, to: &str) -> Result<()> {
    let etcd = s.etcd()?;
    let key = fence_key(&s.prefix(), gid);
    let mut expected = current.map(|e| e.value.clone());
    for _ in 0..2 {
        if etcd.compare_and_put(&key, expected.as_deref(), to, Some(FENCE_TTL)).await? {
            return Ok(());
        }
        // The old fence may simply have expired between the read and the write: look once more.
        let now = etcd.get(&key).await?.map(|e| e.value);
        if now.is_some() && now != expected {
            return Err(Refusal::FenceChanged { gid, now: now.unwrap_or_default() }.into());
        }
        expected = now;
    }
    Err(Refusal::FenceNotWritten { gid }.into())
}

/// Deletes the fence if it still names `master` (a newer fence of someone else stays); failures only delay its
/// expiry, so they are logged.
pub async fn clear_fence(s: &Session<'_>, gid: u32, master: &str) {
    let Ok(etcd) = s.etcd() else { return };
    if let Err(e) = etcd.delete_if_value(&fence_key(&s.prefix(), gid), master).await {
        tracing::warn!(gid, error = %e, "could not delete the fence; it expires by itself");
    }
}

/// How far behind its master a replica may be for a planned transfer to hold writes: what it replicates within a few
/// milliseconds. Under a writer the replica is never exactly level until writes are held, so waiting for that here
/// would only spend [`CATCH_UP_WAIT`].
pub const CLOSE_ENOUGH_BYTES: u64 = 64 * 1024;

/// Waits (at most [`CATCH_UP_WAIT`]) until `to` is within `within` bytes of what `master` produced; never fails.
pub(crate) async fn catch_up(s: &Session<'_>, master: &str, to: &str, within: u64) {
    let deadline = tokio::time::Instant::now() + s.ctx.budget.cap(CATCH_UP_WAIT);
    loop {
        let (m, t) = (s.replication(master).await, s.replication(to).await);
        match (m.ok().and_then(|i| i.position), t.ok().and_then(|i| i.position)) {
            (Some(m), Some(t)) if m.bytes_after(t) <= within => return,
            (Some(m), Some(t)) if tokio::time::Instant::now() >= deadline => {
                tracing::warn!(to, master_at = %m, at = %t, "promoting before the new master caught up");
                return;
            }
            (None, _) | (_, None) => return,
            _ => tokio::time::sleep(s.ctx.budget.cap(POLL)).await,
        }
    }
}

/// `group/promote` of `to`, retried with the same address while the outcome is unknown or the promote is still in
/// progress; done when Codis lists `to` at index 0 with no promote left.
pub(crate) async fn promote(s: &Session<'_>, gid: u32, to: &str) -> Result<()> {
    let mut paused = None;
    let result = promote_pausing(s, gid, to, &mut paused).await;
    // Also a pause an earlier run of this group's transfer left when it stopped (this one holds the group's lock).
    if paused == Some(true) || crate::steps::pause::recorded(s, gid).await {
        crate::steps::pause::resume(s, gid).await;
    }
    result
}

/// How soon a promote refused for a migration batch on the wire is sent again once the executor is paused: the
/// batch ends within moments and no other starts.
const PAUSED_POLL: Duration = Duration::from_millis(10);

/// [`promote`]'s loop; pauses the migration executor when Codis refuses for a batch on the wire, and says in
/// `paused` whether it did (`Some(false)`: an operator had paused it) for the caller to resume it whatever happens.
async fn promote_pausing(s: &Session<'_>, gid: u32, to: &str, paused: &mut Option<bool>) -> Result<()> {
    loop {
        let err = s.dashboard.group_promote(gid, to).await.err();
        let stats = s.stats().await?;
        let group = group_of(&stats, gid)?;
        let done = group.master().is_some_and(|m| m.eq_ignore_ascii_case(to)) && !group.is_promoting();
        if done {
            return Ok(());
        }
        let mut pause = POLL;
        match err {
            Some(e) if group.is_promoting() && !promoting_target(group)?.eq_ignore_ascii_case(to) => {
                // Someone else's promote: the caller's loop resumes that one instead.
                tracing::warn!(gid, error = %e, "another promote is in progress");
                return Ok(());
            }
            Some(e) if e.is_master_already() => return Ok(()),
            // A batch on the wire: pause the executor so that no other follows it (large slots migrate batch after
            // batch with no gap), then try again as soon as it ends.
            Some(e) if e.is_migration_running() => {
                if paused.is_none() {
                    tracing::info!(gid, to, error = %e, "promote refused while a migration batch runs: pausing the migrations");
                    // Failing, it is tried again at the next refusal, sent after the usual pause.
                    match crate::steps::pause::pause(s, &stats, gid).await {
                        Ok(done) => *paused = Some(done),
                        Err(e) => tracing::warn!(gid, error = %e.one_line(), "could not pause the migrations"),
                    }
                }
                if paused.is_some() {
                    pause = PAUSED_POLL;
                }
            }
            Some(e)
                if e.cause().is_some() && !group.is_promoting() && !(e.is_migration_running() || e.is_promoting()) =>
            {
                return Err(e.into())
            }
            Some(e) => tracing::warn!(gid, to, error = %e, "promote not finished; retrying with the same address"),
            None => tracing::debug!(gid, to, "promote answered but codis has not settled yet"),
        }
        s.ctx.budget.check(|| format!("promoting {to} in group {gid}: codis has not finished the promote"))?;
        tokio::time::sleep(s.ctx.budget.cap(pause)).await;
    }
}

fn group_of(stats: &Stats, gid: u32) -> Result<&Group> {
    stats.group(gid).ok_or_else(|| Refusal::NoGroup { gid }.into())
}

/// The server a promote in progress is for: `servers[index]` (index 0 once `finished` reordered the group).
pub(crate) fn promoting_target(group: &Group) -> Result<String> {
    let index = group.promoting.index.unwrap_or(0);
    group
        .servers
        .get(index)
        .map(|gs| gs.server.clone())
        .ok_or_else(|| Refusal::PromotingNowhere { gid: group.id, index }.into())
}

// ---- converging a group on its master ----------------------------------------------------------------------------

/// What [`converge`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Converged {
    /// Codis's `servers[0]`, confirmed a master.
    pub master: String,
    /// Members pointed at it by this run.
    pub repointed: Vec<String>,
    /// Members that could not be asked (restarting pods: `rejoin` points them at the master when they start).
    pub unreachable: Vec<String>,
    /// Members left still holding a replica that has already left them (the replaced master, right after the
    /// promote), so pika refuses to re-point them yet; the failover watcher's sweep re-points them.
    pub demoting: Vec<String>,
    /// Members following it but not in sync yet: only [`point_members`] leaves any.
    pub syncing: Vec<String>,
}

impl Converged {
    /// A short summary.
    #[must_use]
    pub fn describe(&self) -> String {
        let mut text = if self.repointed.is_empty() {
            "every reachable member follows it".to_owned()
        } else {
            format!("re-pointed {} to it", self.repointed.join(", "))
        };
        if !self.unreachable.is_empty() {
            let _ = write!(text, "; not reachable (rejoin fixes them at start): {}", self.unreachable.join(", "));
        }
        if !self.syncing.is_empty() {
            let _ = write!(text, "; copying it: {}", self.syncing.join(", "));
        }
        if !self.demoting.is_empty() {
            let _ = write!(
                text,
                "; still masters of a replica that left them, which pika drops within its 3 s replication cron (the \
                 failover watcher then re-points them): {}",
                self.demoting.join(", ")
            );
        }
        text
    }
}

/// Makes every member of group `gid` follow Codis's `servers[0]` (persisted with CONFIG REWRITE) and that server a
/// master, and waits until each one it can reach is in sync with it. A member that still has replicas waits until it
/// has none. A member pointed elsewhere syncs incrementally only when the group's [`Handover`] shows its history is a
/// prefix of the master's ([`resync::resync_for`]), else it copies the master in full; a member in pika's error
/// state is resynced in full. Re-reads the group before every round.
///
/// # Errors
/// [`Error::InProgress`] when a member still has replicas or is not in sync after [`DEMOTE_WAIT`], or the budget ran
/// out (the rerun continues); pika errors other than the transient refusals; the master Codis lists being
/// unreachable.
pub async fn converge(s: &Session<'_>, gid: u32) -> Result<Converged> {
    converge_within(s, gid, DEMOTE_WAIT).await
}

/// How long a transfer waits, after its promote, for the replaced master to lose its last replica. pika drops a
/// replica that left only when that replica's replication client closes the old link, at its next 3 s cron
/// (`pika_rm.cc`: `PikaReplClient(3000, 60)`, `ClientThread::Close` defers to the cron): waiting for it would add
/// up to 3 s to every switchover while writes already go to the new master. A redis-server drops it at once.
pub const DEMOTE_GRACE: Duration = Duration::from_millis(300);

/// [`converge`] right after a transfer: when a failover watcher leads, the replaced master is left to its sweeps
/// once [`DEMOTE_GRACE`] has passed (see [`converge_within`]); without one, waited for as long as [`converge`] waits.
///
/// # Errors
/// As [`converge`].
pub async fn converge_after_transfer(s: &Session<'_>, gid: u32) -> Result<Converged> {
    if watcher_leads(s).await {
        converge_within(s, gid, DEMOTE_GRACE).await
    } else {
        converge(s, gid).await
    }
}

/// [`converge`], leaving members that still hold replicas after `demote_wait` in [`Converged::demoting`] instead of
/// waiting for them up to [`DEMOTE_WAIT`]; members being re-pointed are still waited for until they are in sync.
///
/// # Errors
/// As [`converge`].
pub async fn converge_within(s: &Session<'_>, gid: u32, demote_wait: Duration) -> Result<Converged> {
    converge_until(s, gid, demote_wait, Settled::InSync).await
}

/// [`converge`] up to the point where every reachable member follows the master: members still copying it are left
/// in [`Converged::syncing`], for [`wait_in_sync`] to wait for without holding the topology lock.
///
/// # Errors
/// As [`converge`].
pub async fn point_members(s: &Session<'_>, gid: u32) -> Result<Converged> {
    converge_until(s, gid, DEMOTE_WAIT, Settled::Pointed).await
}

/// Where [`converge_until`] stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settled {
    /// Every reachable member follows the master.
    Pointed,
    /// Every reachable member is in sync with it.
    InSync,
}

/// Waits, sending no command, until every reachable member of `gid` but an alias is in sync with `master`: `true`
/// then; `false` as soon as one needs a command (it follows another server or is in pika's error state) or `master`
/// is no longer the group's, for the caller to converge again under the lock.
///
/// # Errors
/// Codis's, when the group cannot be read; [`Error::InProgress`] when the budget ran out (the rerun continues).
pub async fn wait_in_sync(s: &Session<'_>, gid: u32, master: &str) -> Result<bool> {
    let master_at = s.dial(master)?;
    loop {
        let stats = s.stats().await?;
        let group = group_of(&stats, gid)?;
        if group.is_promoting() || !group.master().is_some_and(|m| m.eq_ignore_ascii_case(master)) {
            return Ok(false);
        }
        let others: Vec<String> = group
            .servers
            .iter()
            .skip(1)
            .filter(|gs| !ServerAddr::of(&gs.server).is_alias())
            .map(|gs| gs.server.clone())
            .collect();
        let mut copying = Vec::new();
        for (server, info) in survey(s, &others).await {
            // One that cannot be asked is left to rejoin, as converge leaves it.
            let Ok(info) = info else { continue };
            if !info.follows(&master_at) || info.sync == Some(SyncState::Error) {
                return Ok(false);
            }
            if !info.in_sync() {
                copying.push(server);
            }
        }
        if copying.is_empty() {
            return Ok(true);
        }
        s.ctx
            .budget
            .check(|| format!("group {gid}: waiting for {} to be in sync with {master}", copying.join(", ")))?;
        tokio::time::sleep(s.ctx.budget.cap(POLL)).await;
    }
}

async fn converge_until(s: &Session<'_>, gid: u32, demote_wait: Duration, until: Settled) -> Result<Converged> {
    let now = tokio::time::Instant::now();
    let deadline = now + s.ctx.budget.cap(DEMOTE_WAIT);
    let demote_deadline = (now + s.ctx.budget.cap(demote_wait)).min(deadline);
    let mut repointed: Vec<String> = Vec::new();
    let handover = read_handover(s, gid).await;
    loop {
        let stats = s.stats().await?;
        let group = group_of(&stats, gid)?;
        if group.is_promoting() {
            return Err(Error::InProgress { progress: format!("group {gid} is promoting; run again to resume it") });
        }
        let master = group.master().ok_or(Refusal::NoServers { gid })?.to_owned();
        s.ensure_master(&master).await?;
        let master_at = s.dial(&master)?;
        let replaced_at = match &handover {
            Some(h) => Some(s.dial(&h.from)?),
            None => None,
        };
        // An alias stands for another group's master: never re-pointed from here.
        let others: Vec<String> = group
            .servers
            .iter()
            .skip(1)
            .filter(|gs| !ServerAddr::of(&gs.server).is_alias())
            .map(|gs| gs.server.clone())
            .collect();
        let infos = survey(s, &others).await;
        let mut waiting = Vec::new();
        let mut syncing = Vec::new();
        let mut unreachable = Vec::new();
        for server in &others {
            let info = match infos.get(server) {
                Some(Ok(info)) => info,
                Some(Err(e)) => {
                    tracing::warn!(server, error = %e, "member not reachable; rejoin will point it at the master");
                    unreachable.push(server.clone());
                    continue;
                }
                None => {
                    unreachable.push(server.clone());
                    continue;
                }
            };
            let how = match member_step(info, &master_at) {
                MemberStep::Follows if info.in_sync() => continue,
                MemberStep::Follows if info.sync == Some(SyncState::Error) => {
                    Resync::Full("its master refused its binlog position")
                }
                // Its copy was cut off (its `SLAVEOF` sent again, say): it asks its master for the binlog from where
                // its empty one stands, which a master whose binlog starts later refuses every 10 s for good. One
                // pointed here this run is only connecting.
                MemberStep::Follows
                    if info.eligible == Some(false)
                        && info.sync == Some(SyncState::Connecting)
                        && !repointed.contains(server) =>
                {
                    Resync::Full("its full copy was cut off")
                }
                MemberStep::Follows => {
                    syncing.push(format!("{server} ({})", info.sync.unwrap_or(SyncState::Connecting).describe()));
                    continue;
                }
                MemberStep::WaitForReplicas(n) => {
                    waiting.push((server.clone(), format!("{n} replica(s)")));
                    continue;
                }
                MemberStep::Repoint => {
                    let history = MemberHistory {
                        replaced_master: handover.as_ref().is_some_and(|h| h.from.eq_ignore_ascii_case(server)),
                        follows_replaced: replaced_at.as_ref().is_some_and(|at| info.follows(at)),
                        replication_id: info.replication_id.clone(),
                        position: info.position,
                        sync: info.sync,
                        copy_unfinished: info.eligible == Some(false),
                    };
                    resync::resync_for(&master, handover.as_ref(), &history)
                }
            };
            match repoint(s, server, &master_at, how, info).await {
                Ok(()) => {
                    tracing::info!(server, master = %master, how = ?how, "pointed member at the master");
                    if !repointed.contains(server) {
                        repointed.push(server.clone());
                    }
                    syncing.push(format!("{server} (just pointed at it)"));
                }
                Err(e) if e.is_transient_slaveof_refusal() => waiting.push((server.clone(), e.to_string())),
                Err(e) => return Err(e.into()),
            }
        }
        if waiting.is_empty() && (syncing.is_empty() || until == Settled::Pointed) {
            return Ok(Converged { master, repointed, unreachable, demoting: Vec::new(), syncing });
        }
        if syncing.is_empty() && demote_deadline < deadline && tokio::time::Instant::now() >= demote_deadline {
            let mut members = vec![master.clone()];
            members.extend(others.iter().cloned());
            let mut all_departed = true;
            for (server, _) in &waiting {
                let info = infos.get(server).and_then(|r| r.as_ref().ok());
                all_departed &= match info {
                    Some(info) => holds_only_departed(s, server, info, &members, &infos, &repointed).await,
                    None => false,
                };
            }
            if all_departed {
                let demoting = waiting.into_iter().map(|(srv, _)| srv).collect();
                return Ok(Converged { master, repointed, unreachable, demoting, syncing: Vec::new() });
            }
        }
        let mut progress = format!("group {gid}:");
        if !waiting.is_empty() {
            let _ = write!(
                progress,
                " waiting for {} to lose their replicas before they can follow {master};",
                waiting.iter().map(|(srv, why)| format!("{srv} ({why})")).collect::<Vec<_>>().join(", ")
            );
        }
        if !syncing.is_empty() {
            let _ = write!(progress, " waiting for {} to be in sync with {master};", syncing.join(", "));
        }
        let progress = progress.trim_end_matches(';').to_owned();
        let out_of_time = || tokio::time::Instant::now() >= deadline || s.ctx.budget.expired();
        if out_of_time() {
            return Err(Error::InProgress { progress });
        }
        if waiting.is_empty() {
            tokio::time::sleep(s.ctx.budget.cap(POLL)).await;
            continue;
        }
        // The old master stays a master until it can be demoted: watch just the waiting ones closely, so that the
        // moment with two masters is as short as pika allows, then take the next round from a fresh read.
        let watched: Vec<String> = waiting.into_iter().map(|(srv, _)| srv).collect();
        let mut until = tokio::time::Instant::now() + Duration::from_secs(1);
        if syncing.is_empty() && demote_deadline < deadline {
            until = until.min(demote_deadline);
        }
        let mut freed = false;
        while tokio::time::Instant::now() < until.min(deadline) && !s.ctx.budget.expired() {
            let infos = survey(s, &watched).await;
            if infos.values().all(|i| i.as_ref().map_or(true, |i| i.connected_slaves == 0)) {
                freed = true;
                break;
            }
            tokio::time::sleep(s.ctx.budget.cap(DEMOTE_POLL)).await;
        }
        // Out of time with nobody freed: say what is waiting, rather than fail the next call for lack of time.
        if !freed && out_of_time() {
            return Err(Error::InProgress { progress });
        }
    }
}

/// Whether every replica that `held` (a member still a master, whose `INFO` reads `info`) lists is a member of its
/// group that has left it: the new master, a member just re-pointed, or one that follows another master. pika drops
/// those links on its own; a replica from outside the group, a member still following `held`, or one that cannot be
/// resolved may keep it a master for good.
async fn holds_only_departed(
    s: &Session<'_>,
    held: &str,
    info: &Replication,
    members: &[String],
    infos: &BTreeMap<String, Result<Replication, String>>,
    repointed: &[String],
) -> bool {
    let Ok(held_at) = s.dial(held) else { return false };
    let mut departed: Vec<std::net::SocketAddr> = Vec::new();
    for member in members.iter().filter(|m| !m.eq_ignore_ascii_case(held)) {
        let left = repointed.iter().any(|r| r.eq_ignore_ascii_case(member))
            || match infos.get(member) {
                Some(Ok(i)) => !i.follows(&held_at),
                Some(Err(_)) => false,
                // Not surveyed: the master Codis lists, just promoted.
                None => true,
            };
        let Ok(at) = s.dial(member) else { continue };
        if !left {
            continue;
        }
        let lookup = tokio::net::lookup_host((at.host().to_owned(), at.port()));
        if let Ok(Ok(addrs)) = tokio::time::timeout(s.ctx.budget.cap(CALL_TIMEOUT), lookup).await {
            departed.extend(addrs);
        }
    }
    info.replicas.len() == info.connected_slaves as usize
        && info.replicas.iter().all(|r| {
            let ip = r.ip.parse::<std::net::IpAddr>().ok();
            departed.iter().any(|a| Some(a.ip()) == ip && a.port() == r.port)
        })
}

/// Points `server` (whose `INFO` reads `info`) at `master` as `how` says, then CONFIG REWRITE so that a restart keeps
/// the role: SLAVEOF alone changes only pika's memory ([`copy_in_full`] for a full copy). A pika that follows
/// another master leaves it first ([`detach`]).
async fn repoint(
    s: &Session<'_>,
    server: &str,
    master: &HostPort,
    how: Resync,
    info: &Replication,
) -> Result<(), pika::Error> {
    let at = pika::dial_address(server, &s.common.pika.overrides)?;
    let conn = Pika::connect(&at, s.ctx.secrets.pika_password.as_deref(), s.ctx.budget.cap(CALL_TIMEOUT)).await?;
    detach(s, &conn, server, info, master).await?;
    match how {
        Resync::Incremental => conn.slaveof(master).await?,
        Resync::Full(why) => {
            tracing::info!(server, master = %master, why, "resyncing in full");
            mark_copied(s, server).await;
            return copy_in_full(&conn, master, info, false).await;
        }
    }
    conn.config_rewrite().await
}

/// Makes the pika behind `conn` (`server`, whose `INFO` reads `info`), a replica of another master than `to`, follow
/// nobody, and waits, at most [`LINK_DROP_WAIT`], until that master lists no link of it. pika closes the old link
/// only at its replication client's next 3 s cron, and a `SLAVEOF` sent before then let a message of the old
/// session reach the new one (a session mismatch logged right after the new `TrySync`): the replica then went on
/// past a batch of the new master's writes it never applied (33 to 35 writes, 3 of 5 runs of the member-leave crash
/// test). A master that cannot be asked is not waited for. Codis never routes to the member in between.
async fn detach(
    s: &Session<'_>,
    conn: &Pika,
    server: &str,
    info: &Replication,
    to: &HostPort,
) -> Result<(), pika::Error> {
    let (Some(host), Some(port)) = (&info.master_host, info.master_port) else { return Ok(()) };
    if info.kind != pika::ServerKind::Pika || !info.role.is_slave() || info.follows(to) {
        return Ok(());
    }
    let from = HostPort::new(host.clone(), port);
    conn.slaveof_no_one().await?;
    await_link_dropped(s, &from, server).await;
    tracing::info!(server, from = %from, "left its old master before following the new one");
    Ok(())
}

/// Makes the pika behind `conn` (whose `INFO` reads `info`) copy `master` in full, persisted with CONFIG REWRITE;
/// with `forget_id`, under `master`'s replication ID rather than its own (`CLEARREPLICATIONID`: a master refuses a
/// replica carrying another ID for good). A pika in its error state ignores `SLAVEOF … force` (observed, pika.md §8),
/// and one must follow nothing to forget its ID: it is made a master first, for the moment between the commands
/// (Codis never routes to it). One that follows `master` already answers OK and forces the copy at its next meta
/// sync (`SlaveofCmd::Do`); it is not sent `SLAVEOF NO ONE`, which blocks pika for seconds while an rsync of a full
/// copy stops (2.7 s measured, `PING` included).
///
/// # Errors
/// pika's, when a command is refused.
pub(crate) async fn copy_in_full(
    conn: &Pika,
    master: &HostPort,
    info: &Replication,
    forget_id: bool,
) -> Result<(), pika::Error> {
    if forget_id || info.sync == Some(SyncState::Error) {
        conn.slaveof_no_one().await?;
    }
    if forget_id {
        conn.clear_replication_id().await?;
    }
    conn.slaveof_full_sync(master, info.kind).await?;
    conn.config_rewrite().await
}

/// Whether every reachable member of `group` already follows `servers[0]`, which is a master: the cheap look a
/// replica's switchover takes before deciding whether it needs the lock at all.
///
/// # Errors
/// Only when the master's address cannot be dialled (a malformed override).
pub async fn is_converged(s: &Session<'_>, group: &Group) -> Result<bool> {
    is_converged_within(s, group, CALL_TIMEOUT, &BTreeSet::new()).await
}

/// [`is_converged`], giving each member `timeout` to answer (one that does not is skipped, as unreachable);
/// members in `copied` (lower case) were copied in full and not re-linked since ([`member_settled`]).
///
/// # Errors
/// Only when the master's address cannot be dialled (a malformed override).
pub async fn is_converged_within(
    s: &Session<'_>,
    group: &Group,
    timeout: Duration,
    copied: &BTreeSet<String>,
) -> Result<bool> {
    let Some(master) = group.master() else { return Ok(true) };
    if group.is_promoting() {
        return Ok(false);
    }
    let servers: Vec<String> = group.servers.iter().map(|gs| gs.server.clone()).collect();
    let infos = survey_within(s, &servers, timeout).await;
    let master_at = s.dial(master)?;
    if let Some(Ok(info)) = infos.get(master) {
        if info.role.is_slave() {
            return Ok(false);
        }
    }
    Ok(servers.iter().skip(1).all(|srv| match infos.get(srv) {
        Some(Ok(info)) => member_settled(info, &master_at, copied.contains(&srv.to_ascii_lowercase())),
        _ => true,
    }))
}

/// Whether a member reading `info` needs nothing from a repair: it follows `master` in sync, or, `copied` in full
/// and not re-linked since, it follows it with its link down. The watcher copies such a replica again (pika would
/// resume the link past writes it may never have applied); a repair would only wait on that link, holding the
/// group's lock the copy again takes.
#[must_use]
pub fn member_settled(info: &Replication, master: &HostPort, copied: bool) -> bool {
    let dropped = copied && !info.link_up && info.sync == Some(SyncState::Connecting);
    member_step(info, master) == MemberStep::Follows && (info.in_sync() || dropped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clients::codis::GroupServer;
    use crate::clients::pika::parse_replication;
    use crate::input::replication::BinlogPosition;

    const NEW: &str = "c1-pika-x7k-1.c1-pika-x7k-headless.prod.svc.cluster.local";

    fn at(host: &str, port: u16) -> HostPort {
        HostPort::new(host.to_owned(), port)
    }

    /// pika's layout of `INFO replication`, CRLF as sent.
    fn pika(text: &str) -> Replication {
        parse_replication(&text.replace('\n', "\r\n"))
    }

    #[test]
    fn a_demoted_pika_master_with_replicas_waits_and_follows_once_it_has_none() {
        // The old master right after the promote: its two replicas are still attached.
        let old = pika(
            "# Replication(MASTER)\nrole:master\nReplicationID:4f0c1ab9\nconnected_slaves:2\n\
             slave0:ip=10.244.1.17,port=9221,conn_fd=88,lag=(db0:0)\n\
             slave1:ip=10.244.2.9,port=9221,conn_fd=91,lag=(db0:0)\n\
             is_eligible_for_master_election:true\ndb0:binlog_offset=3 52428800,safety_purge=none\n",
        );
        assert_eq!(member_step(&old, &at(NEW, 9221)), MemberStep::WaitForReplicas(2));
        // Its replicas were re-pointed: pika clears the master bit with the last one, SLAVEOF is now accepted.
        let alone = pika("# Replication(MASTER)\nrole:master\nReplicationID:4f0c1ab9\nconnected_slaves:0\n");
        assert_eq!(member_step(&alone, &at(NEW, 9221)), MemberStep::Repoint);
    }

    #[test]
    fn a_chained_pika_replica_waits_for_its_own_replicas() {
        let chained = pika(
            "# Replication(Master && SLAVE)\nrole:master&&slave\nmaster_host:old-master\nmaster_port:9221\n\
             master_link_status:up\nconnected_slaves:1\nslave0:ip=10.0.0.9,port=9221,conn_fd=7,lag=(db0:0)\n",
        );
        assert_eq!(member_step(&chained, &at(NEW, 9221)), MemberStep::WaitForReplicas(1));
        // Following the new master already, chained or not, is done.
        let follows = pika(&format!(
            "# Replication(Master && SLAVE)\nrole:master&&slave\nmaster_host:{NEW}\nmaster_port:9221\n\
             master_link_status:up\nconnected_slaves:1\n"
        ));
        assert_eq!(member_step(&follows, &at(NEW, 9221)), MemberStep::Follows);
    }

    #[test]
    fn only_a_replica_copied_in_full_whose_link_to_the_master_dropped_is_left_to_its_copy_again() {
        let state = |host: &str, link: &str, db0: &str| {
            pika(&format!(
                "# Replication(SLAVE)\nrole:slave\nmaster_host:{host}\nmaster_port:9221\nmaster_link_status:{link}\n\
                 repl_connect_status:\ndb0:{db0}\n"
            ))
        };
        let master = at(NEW, 9221);
        let dropped = state(NEW, "down", "connecting");
        assert!(member_settled(&dropped, &master, true));
        assert!(!member_settled(&dropped, &master, false), "a replica never copied is repaired");
        assert!(member_settled(&state(NEW, "up", "connected"), &master, false));
        assert!(!member_settled(&state(NEW, "down", "error"), &master, true), "pika's error state is repaired");
        assert!(!member_settled(&state(NEW, "down", "syncing_full"), &master, true));
        assert!(!member_settled(&state("old-master", "down", "connecting"), &master, true), "pointed elsewhere");
    }

    #[test]
    fn a_pika_slave_of_the_old_master_is_repointed_and_one_of_the_new_is_left_alone() {
        let of_old = pika(
            "# Replication(SLAVE)\nrole:slave\nmaster_host:old-master\nmaster_port:9221\nmaster_link_status:up\n\
             repl_connect_status:\ndb0:connected\n",
        );
        assert_eq!(member_step(&of_old, &at(NEW, 9221)), MemberStep::Repoint);
        let syncing = pika(&format!(
            "# Replication(SLAVE)\nrole:slave\nmaster_host:{NEW}\nmaster_port:9221\nmaster_link_status:down\n\
             repl_connect_status:\ndb0:syncing_full\n"
        ));
        assert_eq!(member_step(&syncing, &at(&NEW.to_ascii_uppercase(), 9221)), MemberStep::Follows);
        assert_eq!(member_step(&syncing, &at(NEW, 9222)), MemberStep::Repoint);
    }

    fn server(ordinal: u32) -> String {
        format!("c1-pika-x7k-{ordinal}.c1-pika-x7k-headless.prod.svc.cluster.local:9221")
    }

    fn group(n: u32) -> Group {
        Group {
            id: 3,
            servers: (0..n).map(|o| GroupServer { server: server(o), ..GroupServer::default() }).collect(),
            ..Group::default()
        }
    }

    #[test]
    fn facts_carry_binlog_positions_and_the_furthest_replica_ranks_first_even_with_the_master_gone() {
        let g = group(3);
        // slave_repl_offset folds the pair and goes backwards at a roll: server 2 is further though its fold is less.
        let slave = |file: u64, offset: u64, up: &str| {
            let folded = file * 104_857_600 + offset;
            Ok(pika(&format!(
                "# Replication(SLAVE)\nrole:slave\nmaster_host:127.0.0.1\nmaster_port:7000\nmaster_link_status:{up}\n\
                 db0:binlog_offset={file} {offset},safety_purge=none\nslave_repl_offset:{folded}\n"
            )))
        };
        let mut infos = BTreeMap::from([
            (server(0), Ok(pika("# Replication(MASTER)\nrole:master\nconnected_slaves:2\nslave_repl_offset:100\n"))),
            (server(1), slave(0, 150_000_000, "up")),
            (server(2), slave(1, 90, "up")),
        ]);
        let (current, members) = member_facts(&g, &server(0), &at("127.0.0.1", 7000), &infos);
        assert_eq!((current.pod.as_str(), current.ordinal), ("c1-pika-x7k-0", 0));
        assert_eq!(
            members.iter().map(|m| m.position).collect::<Vec<_>>(),
            [Some(BinlogPosition::new(0, 150_000_000)), Some(BinlogPosition::new(1, 90))]
        );
        assert!(members.iter().all(|m| m.unfit_reason().is_none()));

        // The master is gone: links are down, yet the most advanced replica ranks first.
        infos.insert(server(0), Err("connection refused".into()));
        infos.insert(server(1), slave(0, 150_000_000, "down"));
        infos.insert(server(2), slave(1, 95, "down"));
        let (current, members) = member_facts(&g, &server(0), &at("127.0.0.1", 7000), &infos);
        assert!(!current.reachable);
        let choice = plan::choose_new_master(&current, &members, None, Some(&RolloutFacts::default())).unwrap();
        assert_eq!(choice.pod, "c1-pika-x7k-2");
        // The ordinal rule alone (server 1 is nearer) would not have picked it, had both been at one position.
        let even = BTreeMap::from([
            (server(0), Err("connection refused".into())),
            (server(1), slave(1, 95, "down")),
            (server(2), slave(1, 95, "down")),
        ]);
        let (current, members) = member_facts(&g, &server(0), &at("127.0.0.1", 7000), &even);
        let choice = plan::choose_new_master(&current, &members, None, None).unwrap();
        assert_eq!(choice.pod, "c1-pika-x7k-2");
    }

    #[test]
    fn a_replica_in_pikas_error_state_is_unfit_though_it_is_further_and_says_it_is_eligible() {
        let g = group(3);
        let slave = |offset: u64, state: &str| {
            Ok(pika(&format!(
                "# Replication(SLAVE)\nrole:slave\nmaster_host:127.0.0.1\nmaster_port:7000\nmaster_link_status:down\n\
                 repl_connect_status:\ndb0:{state}\nis_eligible_for_master_election:true\n\
                 db0:binlog_offset=1 {offset},safety_purge=none\n"
            )))
        };
        let infos = BTreeMap::from([
            (server(0), Err("connection refused".into())),
            (server(1), slave(50, "try_to_incr_sync")),
            (server(2), slave(90, "error")),
        ]);
        let (current, members) = member_facts(&g, &server(0), &at("127.0.0.1", 7000), &infos);
        assert_eq!(members[1].sync, Some(SyncState::Error));
        assert_eq!(
            members[1].unfit_reason(),
            Some("in pika's replication error state: its history differs from the master's")
        );
        let choice = plan::choose_new_master(&current, &members, None, None).unwrap();
        assert_eq!(choice.pod, "c1-pika-x7k-1");
    }

    #[test]
    fn with_the_master_gone_a_replica_that_may_hold_nothing_is_not_promoted() {
        let g = group(3);
        let replica = |offset: u64, down_since: &str| {
            Ok(parse_replication(&format!(
                "role:slave\r\nmaster_host:127.0.0.1\r\nmaster_port:7000\r\nmaster_link_status:down\r\n\
                 slave_repl_offset:{offset}\r\nmaster_link_down_since_seconds:{down_since}\r\n"
            )))
        };
        let infos = BTreeMap::from([
            (server(0), Err("connection refused".to_owned())),
            (server(1), replica(0, "4")),
            (server(2), replica(1, "-1")),
        ]);
        // Never linked since it started (a restart on an empty volume): unfit whatever its offset says.
        let (_, members) = member_facts_with(&g, &server(0), &at("127.0.0.1", 7000), &infos, false);
        assert_eq!(members[1].unfit_reason(), Some("not eligible for master election"));
        // Offset 0 is fine for a group that never held data, and unfit for one that did.
        assert_eq!(members[0].unfit_reason(), None);
        let (_, members) = member_facts_with(&g, &server(0), &at("127.0.0.1", 7000), &infos, true);
        assert_eq!(members[0].unfit_reason(), Some("not eligible for master election"));
    }

    #[test]
    fn a_fenced_member_is_kept_while_fit_and_a_candidate_overrides_it() {
        let g = group(3);
        let slave = Ok(pika("role:slave\nmaster_host:127.0.0.1\nmaster_port:7000\nmaster_link_status:up\n"));
        let infos = BTreeMap::from([
            (server(0), Ok(pika("role:master\nconnected_slaves:2\n"))),
            (server(1), slave.clone()),
            (server(2), slave),
        ]);
        let (current, members) = member_facts(&g, &server(0), &at("127.0.0.1", 7000), &infos);
        // The rule would pick ordinal 2; an earlier run fenced ordinal 1, so ordinal 1 it is.
        assert_eq!(decide(&current, &members, None, None, None).unwrap().pod, "c1-pika-x7k-2");
        assert_eq!(decide(&current, &members, None, Some("c1-pika-x7k-1"), None).unwrap().pod, "c1-pika-x7k-1");
        // A fence naming the master itself or a stranger is ignored.
        assert_eq!(decide(&current, &members, None, Some("c1-pika-x7k-0"), None).unwrap().pod, "c1-pika-x7k-2");
        assert_eq!(decide(&current, &members, None, Some("c1-pika-x7k-9"), None).unwrap().pod, "c1-pika-x7k-2");
        let candidate = ("c1-pika-x7k-2".to_owned(), "KB_SWITCHOVER_CANDIDATE_FQDN");
        assert_eq!(
            decide(&current, &members, Some(&candidate), Some("c1-pika-x7k-1"), None).unwrap().pod,
            "c1-pika-x7k-2"
        );
        let stranger = ("c1-pika-x7k-7".to_owned(), "KB_SWITCHOVER_CANDIDATE_FQDN");
        let err = decide(&current, &members, Some(&stranger), None, None).unwrap_err();
        assert!(matches!(&err, Error::InvalidInput { var, .. } if var == "KB_SWITCHOVER_CANDIDATE_FQDN"), "{err}");
    }

    #[test]
    fn names_come_from_the_registered_server() {
        assert_eq!(ServerAddr::of(&server(12)).pod(), "c1-pika-x7k-12");
        assert_eq!(ServerAddr::of(&server(12)).ordinal(), Some(12));
        assert_eq!(fence_key("/pika-kubeblocks/ns/c1/", 4), "/pika-kubeblocks/ns/c1/fence/4");
    }
}
