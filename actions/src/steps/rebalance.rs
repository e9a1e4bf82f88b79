//! Moving slots: turns [`plan::toward`] steps into Codis slot actions and waits for Codis to carry them out.
//!
//! [`converge`] is the loop every slot-moving action runs. Each pass takes the cluster's topology lock only to read
//! the slot table, plan one step toward the final topology and hand it to Codis (offline slots assigned directly,
//! migrations through `create-range` in an order that makes Codis's executor run disjoint pairs of groups at once,
//! see [`plan::rounds`]); then it waits for Codis *outside* the lock. Codis keeps the queue, so a second action
//! planning meanwhile sees the first one's migrations in flight, plans around them and picks idle donors, and a run
//! that ends for lack of budget leaves the work going inside Codis until the next run comes (KubeBlocks' backoff can
//! be long). A run is done when nothing is left to do for the group it is about ([`Own`]): Codis migrates the rest
//! of a step that other actions share on its own.
//!
//! While Codis migrates, the slot table is read at a pace derived from the progress seen so far (see
//! [`poll_interval`]): often enough to notice the end within a small fraction of one slot's migration time, rarely
//! enough that a long drain costs a few dozen reads of a ~100 KB table.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::clients::codis::Stats;
use crate::error::{Error, Result};
use crate::plan::rounds::{self, Queued};
use crate::plan::{self, Goal, Plan, SlotState, Step};
use crate::steps::cluster::Session;

/// Why slots stopped moving; what Codis has queued stays queued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No step toward the final topology moves what is left, and Codis migrates nothing.
    #[error(
        "cannot finish the {what}: no step toward groups {receivers:?} ({unregistered} shard(s) still to register) \
         moves what is left, and nothing migrates"
    )]
    Stuck {
        /// The change (`drain of <shard>`, `rebalance`, ...).
        what: String,
        /// The groups that may receive slots.
        receivers: Vec<u32>,
        /// How many shards of the final topology are not registered yet.
        unregistered: usize,
    },
    /// The slot table admits no plan.
    #[error("cannot plan the {what}: {source}")]
    Plan {
        /// The change.
        what: String,
        /// Why.
        #[source]
        source: plan::PlanError,
    },
    /// Someone disabled Codis's slot actions.
    #[error(
        "{what} stopped: slot actions are disabled in codis ({busy} of {at_start} still queued); enable them \
         (slots/action/disabled/0) and run again"
    )]
    ActionsDisabled {
        /// The change.
        what: String,
        /// Slots still queued.
        busy: usize,
        /// Slots queued when the wait began.
        at_start: usize,
    },
    /// Codis reports the same migration error with no progress for too long.
    #[error("{progress}; codis keeps failing a migration ({seconds}s without progress): {status}")]
    MigrationKeepsFailing {
        /// How far the change got.
        progress: String,
        /// For how long the error persisted.
        seconds: u64,
        /// Codis's `slot_action.progress.status`, verbatim.
        status: String,
    },
}

/// The shortest pause between two reads of the slot table while Codis migrates.
pub const MIN_POLL: Duration = Duration::from_millis(20);
/// The longest pause: Codis' own executor ticks once a second, and progress stays visible in the logs.
pub const MAX_POLL: Duration = Duration::from_secs(1);
/// How long one `[ERROR]` status may persist, with no slot finishing meanwhile, before the run stops with exit 1
/// instead of exit 75 (capped at half the budget). Codis retries a failed batch about every 6 s, so by then at least
/// one retry failed too.
pub const ERROR_PERSISTS: Duration = Duration::from_secs(10);
/// Codis's `migration_parallel_slots` default: the most slots one round of its executor takes.
pub const PARALLEL_SLOTS: usize = 100;

/// What one run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Offline slots assigned directly.
    pub assigned: usize,
    /// Slot migrations this run created.
    pub created: usize,
    /// Slot migrations finished while this run watched (including other runs' in-flight ones).
    pub finished: usize,
    /// The first step's critical path (rounds of parallel migrations).
    pub critical_path: usize,
    /// Lower bound of the critical path.
    pub lower_bound: usize,
    /// Stats reads while waiting for Codis.
    pub polls: usize,
    /// Pending migrations into leaving groups removed before they started.
    pub cancelled: usize,
}

/// The group a run is about: what it waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Own {
    /// A group that stays (an added shard): done once no migration involves it and no step has more for it.
    Receiver(u32),
    /// A leaving group: done once it owns no slot and none is on its way to it.
    Leaver {
        /// The group.
        gid: u32,
        /// How many slots it had to give away in all (across runs), for the progress message.
        total: usize,
    },
    /// The whole cluster (one action places every shard): done once nothing migrates and no step is left.
    Everything,
}

/// What a pass of [`converge`] aims at, decided under the lock from the slot table just read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Aim {
    /// The final topology as far as it is known.
    pub goal: Goal,
    /// The group this run waits for.
    pub own: Own,
}

/// How a run ends early after handing its step to Codis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handoff {
    /// Wait for the run's own group to be done (or the budget).
    Wait,
    /// Return exit 75 with this note as soon as a pass created migrations: a caller that runs the actions of one
    /// change one after another (KubeBlocks 1.1 runs a reconcile's shardAdds in turn) gets to the next one while Codis
    /// migrates, and the next run waits for what is left.
    ReturnAfterSubmitting(String),
}

/// What the progress messages count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// Slot actions queued or running when the wait began (a rebalance).
    InFlight,
    /// The slots of a leaving group: `total` when the drain began, minus what it still owns (a drain).
    Leaving {
        /// The leaving group.
        gid: u32,
        /// How many slots it had to give away in all (across runs).
        total: usize,
    },
}

impl Count {
    /// `(moved, total)` for the progress message.
    fn progress(self, stats: &Stats, busy_at_start: usize, busy: usize) -> (usize, usize) {
        match self {
            Self::InFlight => (busy_at_start.saturating_sub(busy), busy_at_start),
            Self::Leaving { gid, total } => {
                let left = stats.slots.iter().filter(|sl| sl.group_id == gid).count();
                let total = total.max(left);
                (total - left, total)
            }
        }
    }
}

impl Own {
    fn count(self) -> Count {
        match self {
            Self::Leaver { gid, total } => Count::Leaving { gid, total },
            Self::Receiver(_) | Self::Everything => Count::InFlight,
        }
    }

    /// Whether Codis still has work queued or running that this run waits for.
    fn waits_on(self, stats: &Stats) -> bool {
        match self {
            Self::Receiver(gid) => stats.slots.iter().any(|sl| !sl.is_idle() && involves(sl, gid)),
            Self::Leaver { gid, .. } => {
                stats.slots.iter().any(|sl| sl.group_id == gid || (!sl.is_idle() && sl.action.target_id == Some(gid)))
            }
            Self::Everything => stats.is_migrating(),
        }
    }

    /// Whether nothing is left for this run: Codis has nothing of it queued, the step just planned has nothing for it
    /// either, and no slot held in flight elsewhere is still owed to it.
    fn is_done(self, stats: &Stats, step: &Step) -> bool {
        !self.waits_on(stats)
            && match self {
                Self::Receiver(gid) => {
                    let held = stats.slots.iter().filter(|sl| sl.group_id == gid).count();
                    !step.touches(gid) && (step.deferred.is_empty() || step.final_size(gid) == Some(held))
                }
                Self::Leaver { gid, .. } => !step.touches(gid),
                Self::Everything => step.plan.is_empty() && step.deferred.is_empty(),
            }
    }
}

fn involves(sl: &crate::clients::codis::SlotMapping, gid: u32) -> bool {
    sl.group_id == gid || sl.action.target_id == Some(gid)
}

/// The slot table as the planner sees it.
#[must_use]
pub fn slot_states(stats: &Stats) -> Vec<SlotState> {
    stats
        .slots
        .iter()
        .map(|s| SlotState {
            owner: (s.group_id != 0).then_some(s.group_id),
            in_flight_target: if s.is_idle() { None } else { s.action.target_id },
        })
        .collect()
}

/// Codis's queue of slot actions, as its executor takes them.
#[must_use]
pub fn queue(stats: &Stats) -> Vec<Queued> {
    stats
        .slots
        .iter()
        .filter(|s| !s.is_idle())
        .filter_map(|s| {
            Some(Queued {
                slot: s.id,
                from: (s.group_id != 0).then_some(s.group_id),
                to: s.action.target_id?,
                index: s.action.index.unwrap_or(0),
                started: s.action.state() != Some("pending"),
            })
        })
        .collect()
}

/// Moves slots toward the final topology `aim_of` describes (asked afresh on every pass, under the lock, from the slot
/// table just read and the shards recorded as leaving) until nothing is left for the run's own group. `what` names the work in progress messages
/// (`rebalance`, `drain`).
///
/// Pending migrations into a group that is no receiver (a shard now known to be leaving) are removed before each
/// step: they have not started, so nothing is lost, and the step sends those slots where they stay.
///
/// # Errors
///
/// Exit 75 with the progress when the budget runs out (or at once after submitting, with
/// [`Handoff::ReturnAfterSubmitting`]); exit 1 when `aim_of` refuses, slot actions are disabled, a migration error
/// persists, or a Codis call fails.
pub async fn converge(
    s: &Session<'_>,
    what: &str,
    mut aim_of: impl FnMut(&Stats, &BTreeSet<String>) -> Result<Aim>,
    handoff: Handoff,
) -> Result<Outcome> {
    let mut outcome = Outcome::default();
    let mut first = true;
    let mut idle_passes = 0;
    loop {
        let cancelled = outcome.cancelled;
        let (aim, step, created, stats) =
            s.under_topology_lock(async |_| plan_and_submit(s, what, &mut aim_of, &mut outcome, first).await).await?;
        first = false;
        if aim.own.is_done(&stats, &step) {
            return Ok(outcome);
        }
        // A pass that changed nothing while nothing migrates would only repeat itself.
        let changed = created > 0 || !step.plan.assign.is_empty() || outcome.cancelled > cancelled;
        idle_passes = if changed || stats.is_migrating() { 0 } else { idle_passes + 1 };
        if idle_passes > 1 {
            return Err(Refusal::Stuck {
                what: what.to_owned(),
                receivers: aim.goal.receivers.clone(),
                unregistered: aim.goal.unregistered,
            }
            .into());
        }
        if let Handoff::ReturnAfterSubmitting(note) = &handoff {
            if created > 0 {
                return Err(Error::InProgress {
                    progress: format!("{what}: {created} slot migration(s) queued in codis; {note}"),
                });
            }
        }
        let deferred: BTreeSet<u32> = step.deferred.iter().copied().collect();
        outcome.finished += wait(s, what, aim.own, &deferred, &mut outcome.polls).await?;
    }
}

/// One pass under the lock: read, aim, cancel what must not start, plan, hand the step to Codis. Returns the aim,
/// the step, how many migrations it created and the slot table it planned from.
async fn plan_and_submit(
    s: &Session<'_>,
    what: &str,
    aim_of: &mut impl FnMut(&Stats, &BTreeSet<String>) -> Result<Aim>,
    outcome: &mut Outcome,
    first: bool,
) -> Result<(Aim, Step, usize, Stats)> {
    let leavers = crate::steps::drain::recorded_leavers(s).await?;
    let mut stats = s.stats().await?;
    let mut aim = aim_of(&stats, &leavers)?;
    let cancel: Vec<u32> = stats
        .slots
        .iter()
        .filter(|sl| sl.action.state() == Some("pending"))
        .filter(|sl| sl.action.target_id.is_some_and(|t| !aim.goal.receivers.contains(&t)))
        .map(|sl| sl.id)
        .collect();
    if !cancel.is_empty() {
        for &sid in &cancel {
            tracing::info!(slot = sid, "removing a pending migration into a leaving group");
            match s.dashboard.slot_action_remove(sid).await {
                Ok(()) => outcome.cancelled += 1,
                // Started meanwhile (it lands and moves again) or gone: the next read shows which.
                Err(e) if e.is_not_found() || e.is_not_pending() => {}
                Err(e) => return Err(e.into()),
            }
        }
        stats = s.stats().await?;
        aim = aim_of(&stats, &leavers)?;
    }
    let step = plan::toward(&slot_states(&stats), &aim.goal)
        .map_err(|source| Refusal::Plan { what: what.to_owned(), source })?;
    // A splitting group still holds copies of keys it does not own (or its donor's master does): no slot moves onto
    // or off it until the split has deleted them.
    let touched = step.plan.moves.iter().flat_map(|m| [m.from, m.to]).chain(step.plan.assign.iter().map(|a| a.1));
    if let Some(gid) = crate::steps::split::splitting_among(&stats, touched) {
        return Err(Error::InProgress {
            progress: format!("{what}: group {gid} is splitting off its donor; slots move once the split is done"),
        });
    }
    let in_flight = stats.slots.iter().filter(|sl| !sl.is_idle()).count();
    if first {
        outcome.critical_path = step.plan.critical_path;
        outcome.lower_bound = step.plan.lower_bound;
    }
    if !step.plan.is_empty() || first {
        tracing::info!(
            what,
            receivers = ?aim.goal.receivers,
            unregistered = aim.goal.unregistered,
            assign = step.plan.assign.len(),
            moves = step.plan.moves.len(),
            in_flight,
            deferred = step.deferred.len(),
            critical_path = step.plan.critical_path,
            lower_bound = step.plan.lower_bound,
            "slot plan"
        );
    }
    if !step.plan.assign.is_empty() {
        s.dashboard.slots_assign(&step.plan.assign).await?;
        s.dashboard.group_resync_all().await?;
        outcome.assigned += step.plan.assign.len();
    }
    let created = submit(s, &step.plan, &queue(&stats)).await?;
    outcome.created += created;
    Ok((aim, step, created, stats))
}

/// Creates the plan's migrations behind Codis's queue, in the order [`rounds::submission`] gives.
async fn submit(s: &Session<'_>, plan: &Plan, queued: &[Queued]) -> Result<usize> {
    let mut created = 0;
    for r in rounds::submission(plan, queued, PARALLEL_SLOTS) {
        s.ctx.budget.check(|| format!("creating slot migrations: {created}/{} created", plan.moves.len()))?;
        match s.dashboard.slot_action_create_range(r.beg, r.end, r.to).await {
            Ok(()) => created += (r.end - r.beg + 1) as usize,
            // Another run created some of them meanwhile: the next plan sees them in flight.
            Err(e) if e.is_already_exists() => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(created)
}

/// Waits, outside the lock, until Codis has nothing left that `own` waits on, or one of the `deferred` slots has
/// landed (the step they held back can then be planned), reporting progress; returns how many of the actions it
/// waited on finished. The budget running out is exit 75 (or exit 1 when Codis keeps reporting the same migration
/// error with no progress, which will not fix itself).
async fn wait(s: &Session<'_>, what: &str, own: Own, deferred: &BTreeSet<u32>, polls: &mut usize) -> Result<usize> {
    let started = Instant::now();
    let mut busy_at_start: Option<usize> = None;
    let mut error: Option<SeenError> = None;
    let count = own.count();
    loop {
        let stats = s.stats().await?;
        *polls += 1;
        let busy = stats.slots.iter().filter(|sl| !sl.is_idle()).count();
        let at_start = *busy_at_start.get_or_insert(busy);
        let done = at_start.saturating_sub(busy);
        let now = Instant::now();
        let status = &stats.slot_action.progress.status;
        error = observe(error, status, done, now);
        if let Some(seen) = error.as_ref().filter(|e| e.since == now) {
            tracing::warn!(status = seen.status.as_str(), "codis reports a failed slot migration");
        }
        if !own.waits_on(&stats) || stats.slots.iter().any(|sl| sl.is_idle() && deferred.contains(&sl.id)) {
            return Ok(done);
        }
        if busy == 0 {
            // Nothing migrates, yet the run's group is not done: a new step is needed.
            return Ok(done);
        }
        // Paused for a promote, they resume within moments: wait as for any batch.
        if stats.slot_action.disabled && !crate::steps::pause::paused_for_promote(s, &stats).await {
            return Err(Refusal::ActionsDisabled { what: what.to_owned(), busy, at_start }.into());
        }
        if s.ctx.budget.expired() {
            let (moved, total) = count.progress(&stats, at_start, busy);
            let budget = s.ctx.budget.elapsed() + s.ctx.budget.remaining();
            let mut progress = format!("{what} in progress: {moved}/{total} slots moved");
            if let Some(note) = proxy_note(&stats) {
                progress.push_str("; ");
                progress.push_str(&note);
            }
            return Err(out_of_budget(progress, error.as_ref(), now, budget));
        }
        tokio::time::sleep(s.ctx.budget.cap(poll_interval(started.elapsed(), done, busy))).await;
    }
}

/// How long to wait before reading the slot table again, from the progress seen since the wait began: `done` slot
/// actions finished in `elapsed`, `left` still queued or running.
///
/// An eighth of the estimated time left, between [`MIN_POLL`] and [`MAX_POLL`]: the reads thin out in the long
/// middle of a drain and close in on its end, so the end is noticed within about an eighth of one slot's migration
/// time, while the number of reads grows only with the logarithm of the slots moved. Before the first slot finishes
/// the pace is unknown and the pause grows with the time waited.
#[must_use]
pub fn poll_interval(elapsed: Duration, done: usize, left: usize) -> Duration {
    let wanted = if done == 0 {
        elapsed / 4
    } else {
        // elapsed × left / done / 8, in nanoseconds to stay exact and overflow-free.
        let nanos = elapsed.as_nanos().saturating_mul(left as u128) / (done as u128).saturating_mul(8);
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    };
    wanted.clamp(MIN_POLL, MAX_POLL)
}

/// An `[ERROR]` status Codis reported, since when, and how many slots had finished then.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SeenError {
    status: String,
    since: Instant,
    done: usize,
}

/// Tracks the migration error across reads: a new error text or any progress restarts its clock; an `[OK]` status
/// clears it; an empty status (between two slots) leaves it as it was.
fn observe(seen: Option<SeenError>, status: &str, done: usize, now: Instant) -> Option<SeenError> {
    if status.starts_with("[ERROR]") {
        match seen {
            Some(e) if e.status == status && e.done == done => Some(e),
            _ => Some(SeenError { status: status.to_owned(), since: now, done }),
        }
    } else if status.is_empty() {
        seen
    } else {
        None
    }
}

/// The error a run out of budget ends with: exit 75 with the progress (and the last migration error, if any), or
/// exit 1 when the same error has persisted with no progress for [`ERROR_PERSISTS`] or half the budget.
fn out_of_budget(progress: String, error: Option<&SeenError>, now: Instant, budget: Duration) -> Error {
    match error {
        Some(e) if now.saturating_duration_since(e.since) >= ERROR_PERSISTS.min(budget / 2) => {
            Refusal::MigrationKeepsFailing {
                progress,
                seconds: now.saturating_duration_since(e.since).as_secs(),
                status: e.status.clone(),
            }
            .into()
        }
        Some(e) => Error::InProgress { progress: format!("{progress}; codis reported: {}", e.status) },
        None => Error::InProgress { progress },
    }
}

/// Names the proxies Codis cannot reach: every slot transition waits for every proxy, so one dead proxy stalls a
/// migration.
fn proxy_note(stats: &Stats) -> Option<String> {
    let dead: Vec<String> = stats
        .proxy
        .models
        .iter()
        .filter(|p| stats.proxy.stats.get(&p.token).is_some_and(|e| !e.is_healthy()))
        .map(|p| p.admin_addr.clone())
        .collect();
    (!dead.is_empty()).then(|| {
        format!("codis cannot reach proxy {}: migrations wait for it (bring it back or remove it)", dead.join(", "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn polling_closes_in_on_the_end_of_the_migration() {
        // 100 ms per slot: with 200 left the pause is the longest; with one left, an eighth of a slot (12.5 ms),
        // raised to the shortest pause.
        assert_eq!(poll_interval(10_000 * MS, 100, 200), MAX_POLL);
        assert_eq!(poll_interval(10_000 * MS, 100, 1), MIN_POLL);
        assert_eq!(poll_interval(10_000 * MS, 100, 4), 50 * MS);
        // A real Codis: 2 s per slot, 10 left.
        assert_eq!(poll_interval(20_000 * MS, 10, 4), 1000 * MS);
        assert_eq!(poll_interval(20_000 * MS, 10, 2), 500 * MS);
        // Before any progress the pause grows with the wait.
        assert_eq!(poll_interval(Duration::ZERO, 0, 50), MIN_POLL);
        assert_eq!(poll_interval(400 * MS, 0, 50), 100 * MS);
        assert_eq!(poll_interval(Duration::from_secs(60), 0, 50), MAX_POLL);
        // Huge numbers do not overflow.
        assert_eq!(poll_interval(Duration::from_secs(u64::MAX / 2), 1, usize::MAX), MAX_POLL);
    }

    #[test]
    fn reads_over_a_long_drain_stay_few() {
        // Simulate a drain of 256 slots at 100 ms each, polled as poll_interval says: the end is seen within 25 ms
        // and the reads are a few dozen.
        let per_slot = 100 * MS;
        let slots = 256u32;
        let end = per_slot * slots;
        let mut now = Duration::ZERO;
        let mut reads = 0;
        loop {
            reads += 1;
            let done = (now.as_nanos() / per_slot.as_nanos()) as usize;
            if done >= slots as usize {
                break;
            }
            now += poll_interval(now, done, slots as usize - done);
        }
        assert!(now - end <= 25 * MS, "end noticed {:?} late", now - end);
        assert!(reads < 80, "{reads} reads");
    }

    fn error(text: &str) -> String {
        format!("[ERROR] Slot[0007]: {text}")
    }

    #[test]
    fn an_error_keeps_its_clock_until_progress_or_another_error() {
        let t0 = Instant::now();
        let seen = observe(None, &error("boom"), 3, t0).unwrap();
        assert_eq!(seen.since, t0);
        let later = t0 + 5 * MS;
        assert_eq!(observe(Some(seen.clone()), &error("boom"), 3, later).unwrap().since, t0);
        assert_eq!(observe(Some(seen.clone()), "", 3, later).unwrap().since, t0);
        assert_eq!(observe(Some(seen.clone()), &error("boom"), 4, later).unwrap().since, later, "progress resets");
        assert_eq!(observe(Some(seen.clone()), &error("other"), 3, later).unwrap().since, later);
        assert_eq!(observe(Some(seen), "[OK] Slot[0007]@DB[0]=3", 3, later), None);
    }

    #[test]
    fn a_persisting_error_fails_the_run_and_a_recent_one_is_reported_with_the_progress() {
        let t0 = Instant::now();
        let seen = SeenError { status: error("ERR target is read only"), since: t0, done: 0 };
        let progress = || "drain in progress: 3/10 slots moved".to_owned();
        let budget = Duration::from_secs(50);

        let recent = out_of_budget(progress(), Some(&seen), t0 + Duration::from_secs(2), budget);
        assert_eq!(recent.exit_code(), 75);
        assert_eq!(
            recent.to_string(),
            "drain in progress: 3/10 slots moved; codis reported: [ERROR] Slot[0007]: ERR target is read only"
        );

        let stuck = out_of_budget(progress(), Some(&seen), t0 + ERROR_PERSISTS, budget);
        assert_eq!(stuck.exit_code(), 1);
        assert!(stuck.to_string().contains("codis keeps failing a migration (10s without progress)"), "{stuck}");
        assert!(stuck.to_string().ends_with("ERR target is read only"), "{stuck}");

        // A short budget shortens the wait: half of it suffices.
        let short = out_of_budget(progress(), Some(&seen), t0 + Duration::from_secs(2), Duration::from_secs(4));
        assert_eq!(short.exit_code(), 1);

        let clean = out_of_budget(progress(), None, t0, budget);
        assert_eq!((clean.exit_code(), clean.to_string()), (75, progress()));
    }

    #[test]
    fn drain_progress_counts_the_leaving_groups_slots_across_runs() {
        let slots = (0..8u32)
            .map(|id| crate::clients::codis::SlotMapping {
                id,
                group_id: if id < 3 { 5 } else { 1 },
                ..Default::default()
            })
            .collect();
        let stats = Stats { slots, ..Stats::default() };
        assert_eq!(Count::Leaving { gid: 5, total: 10 }.progress(&stats, 3, 3), (7, 10));
        // A total smaller than what is left (a lost record) never yields a negative count.
        assert_eq!(Count::Leaving { gid: 5, total: 1 }.progress(&stats, 3, 3), (0, 3));
        assert_eq!(Count::InFlight.progress(&stats, 10, 4), (6, 10));
    }
}
