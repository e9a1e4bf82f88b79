//! Moving slots: turns a [`plan`](crate::plan) into Codis slot actions and waits for Codis to carry them out.
//!
//! Offline slots are assigned directly (no data to move); owned slots move through `create-range`, submitted in the
//! plan's round order so that Codis' executor, which starts the lowest-indexed pending action of every idle pair of
//! groups, runs disjoint pairs at once. Codis keeps the queue, so a run that ends for lack of budget leaves the work
//! going; the next run counts the in-flight actions and never plans them again.
//!
//! [`balance`] spreads the slots over target groups (`post-provision`, `shard-add`); [`drain`] does the same while
//! counting the slots of one leaving group, which is what its progress reports (`shard-remove`, `pre-terminate`).
//! While Codis migrates, the slot table is read at a pace derived from the progress seen so far (see
//! [`poll_interval`]): often enough to notice the end within a small fraction of one slot's migration time, rarely
//! enough that a long drain costs a few dozen reads of a ~100 KB table.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::cluster::Session;
use crate::codis::Stats;
use crate::error::{Error, Result};
use crate::plan::{self, Plan, PlanError, SlotState};

/// The shortest pause between two reads of the slot table while Codis migrates.
pub const MIN_POLL: Duration = Duration::from_millis(20);
/// The longest pause: Codis' own executor ticks once a second, and progress stays visible in the logs.
pub const MAX_POLL: Duration = Duration::from_secs(1);
/// How long one `[ERROR]` status may persist, with no slot finishing meanwhile, before the run stops with exit 1
/// instead of exit 75 (capped at half the budget). Codis retries a failed batch about every 6 s, so by then at least
/// one retry failed too.
pub const ERROR_PERSISTS: Duration = Duration::from_secs(10);

/// What one balancing run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Offline slots assigned directly.
    pub assigned: usize,
    /// Slot migrations this run created.
    pub created: usize,
    /// Slot migrations finished while this run watched (including earlier runs' in-flight ones).
    pub finished: usize,
    /// The first plan's critical path (rounds of parallel migrations) and its lower bound.
    pub critical_path: usize,
    /// Lower bound of the critical path.
    pub lower_bound: usize,
    /// Stats reads while waiting for Codis.
    pub polls: usize,
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

/// Balances every slot over `targets` (groups not listed end with none) and waits until Codis has done it.
/// `what` names the work in progress messages (`rebalance`).
///
/// # Errors
///
/// Exit 75 with the progress when the budget runs out; exit 1 when no balanced plan can be made, slot actions are
/// disabled, a migration error persists, or a Codis call fails.
pub async fn balance(s: &Session<'_>, targets: &[u32], what: &str) -> Result<Outcome> {
    run(s, targets, what, Count::InFlight).await
}

/// Moves every slot of group `leaving` (and of any other group not in `targets`) onto `targets`, balanced with the
/// fewest moves, and waits until Codis shows no slot owned by or migrating to it. `total` is how many slots the
/// drain had to move when it began, for the progress message `drain in progress: M/N slots moved`.
///
/// # Errors
///
/// As [`balance`].
pub async fn drain(s: &Session<'_>, leaving: u32, total: usize, targets: &[u32]) -> Result<Outcome> {
    run(s, targets, "drain", Count::Leaving { gid: leaving, total }).await
}

async fn run(s: &Session<'_>, targets: &[u32], what: &str, count: Count) -> Result<Outcome> {
    let mut outcome = Outcome::default();
    let mut first = true;
    loop {
        let stats = s.stats().await?;
        let states = slot_states(&stats);
        let planned = match count {
            Count::InFlight => plan::rebalance(&states, targets),
            Count::Leaving { gid, .. } => plan::drain(&states, gid, targets),
        };
        let in_flight = stats.slots.iter().filter(|sl| !sl.is_idle()).count();
        let plan = match planned {
            Ok(plan) => plan,
            // In-flight actions stand in the way of a balanced plan (one moves a slot into a group that must end
            // empty, or fills a group past its share); they cannot be re-planned, but once they finish their slots can.
            // In-flight actions stand in the way of a balanced plan (one moves a slot into a group that must end
            // empty, or fills a group past its share); they cannot be re-planned, but everything else can start now,
            // so that Codis keeps migrating even if this run ends before they finish. Once one of them has landed,
            // the plan is made again.
            Err(e @ (PlanError::InFlightToLeavingGroup { .. } | PlanError::PinnedOverQuota { .. }))
                if in_flight > 0 =>
            {
                let (partial, deferred) = plan::around_in_flight(&states, targets)
                    .map_err(|e| Error::Refused(format!("cannot plan the {what}: {e}")))?;
                let held: BTreeSet<u32> = deferred.into_iter().collect();
                tracing::info!(
                    what,
                    reason = %e,
                    in_flight,
                    startable = partial.moves.len() + partial.assign.len(),
                    waiting = held.len(),
                    "in-flight slot actions hold part of the plan: starting the rest now"
                );
                if !partial.assign.is_empty() {
                    s.dashboard.slots_assign(&partial.assign).await?;
                    outcome.assigned += partial.assign.len();
                }
                outcome.created += submit(s, &partial).await?;
                let wake = (!held.is_empty()).then_some(&held);
                outcome.finished += wait_idle(s, what, count, wake, &mut outcome.polls).await?;
                continue;
            }
            Err(e) => return Err(Error::Refused(format!("cannot plan the {what}: {e}"))),
        };
        if first {
            outcome.critical_path = plan.critical_path;
            outcome.lower_bound = plan.lower_bound;
            tracing::info!(
                what,
                assign = plan.assign.len(),
                moves = plan.moves.len(),
                in_flight,
                critical_path = plan.critical_path,
                lower_bound = plan.lower_bound,
                "slot plan"
            );
            first = false;
        }
        if plan.is_empty() && in_flight == 0 {
            return Ok(outcome);
        }
        if !plan.assign.is_empty() {
            s.dashboard.slots_assign(&plan.assign).await?;
            s.dashboard.group_resync_all().await?;
            outcome.assigned += plan.assign.len();
        }
        outcome.created += submit(s, &plan).await?;
        outcome.finished += wait_idle(s, what, count, None, &mut outcome.polls).await?;
    }
}

/// Creates the plan's migrations, whole ranges at a time, in round order.
async fn submit(s: &Session<'_>, plan: &Plan) -> Result<usize> {
    let round_of = |slot: u32| plan.rounds.iter().position(|r| r.iter().any(|m| m.slot == slot)).unwrap_or(0);
    let mut ranges = plan.ranges();
    ranges.sort_by_key(|r| (round_of(r.beg), r.beg));
    let mut created = 0;
    for r in ranges {
        s.ctx.budget.check(|| format!("creating slot migrations: {created}/{} created", plan.moves.len()))?;
        match s.dashboard.slot_action_create_range(r.beg, r.end, r.to).await {
            Ok(()) => created += (r.end - r.beg + 1) as usize,
            // Another run created some of them meanwhile: the next plan sees them in flight.
            Err(e) if e.cause().is_some_and(|c| c.contains("action already exists")) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(created)
}

/// Waits until no slot has an action (or, with `held`, until one of those slots has none: the plan they held can
/// then be made), reporting progress; the budget running out is exit 75 (or exit 1 when Codis keeps reporting the
/// same migration error with no progress, which will not fix itself).
async fn wait_idle(
    s: &Session<'_>,
    what: &str,
    count: Count,
    held: Option<&BTreeSet<u32>>,
    polls: &mut usize,
) -> Result<usize> {
    let started = Instant::now();
    let mut busy_at_start: Option<usize> = None;
    let mut error: Option<SeenError> = None;
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
        if busy == 0 {
            return Ok(at_start);
        }
        if held.is_some_and(|held| stats.slots.iter().any(|sl| sl.is_idle() && held.contains(&sl.id))) {
            return Ok(done);
        }
        if stats.slot_action.disabled {
            return Err(Error::Refused(format!(
                "{what} stopped: slot actions are disabled in codis ({busy} of {at_start} still queued); enable them \
                 (slots/action/disabled/0) and run again"
            )));
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
        Some(e) if now.saturating_duration_since(e.since) >= ERROR_PERSISTS.min(budget / 2) => Error::Refused(format!(
            "{progress}; codis keeps failing a migration ({}s without progress): {}",
            now.saturating_duration_since(e.since).as_secs(),
            e.status
        )),
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

/// The groups taking part in a migration now (for callers that must not disturb them).
#[must_use]
pub fn busy_groups(stats: &Stats) -> BTreeSet<u32> {
    stats
        .slots
        .iter()
        .filter(|sl| !sl.is_idle())
        .flat_map(|sl| [sl.group_id, sl.action.target_id.unwrap_or(0)])
        .filter(|&g| g != 0)
        .collect()
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
            .map(|id| crate::codis::SlotMapping { id, group_id: if id < 3 { 5 } else { 1 }, ..Default::default() })
            .collect();
        let stats = Stats { slots, ..Stats::default() };
        assert_eq!(Count::Leaving { gid: 5, total: 10 }.progress(&stats, 3, 3), (7, 10));
        // A total smaller than what is left (a lost record) never yields a negative count.
        assert_eq!(Count::Leaving { gid: 5, total: 1 }.progress(&stats, 3, 3), (0, 3));
        assert_eq!(Count::InFlight.progress(&stats, 10, 4), (6, 10));
    }
}
