//! Moving slots: turns a [`plan`](crate::plan) into Codis slot actions and waits for Codis to carry them out.
//!
//! Offline slots are assigned directly (no data to move); owned slots move through `create-range`, submitted in the
//! plan's round order so that Codis' executor, which starts the lowest-indexed pending action of every idle pair of
//! groups, runs disjoint pairs at once. Codis keeps the queue, so a run that ends for lack of budget leaves the work
//! going; the next run counts the in-flight actions and never plans them again.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::cluster::Session;
use crate::codis::Stats;
use crate::error::{Error, Result};
use crate::plan::{self, Plan, SlotState};

/// How often the slot table is read while Codis migrates: a small fraction of Codis' own one-second executor tick.
pub const MIGRATION_POLL: Duration = Duration::from_millis(200);

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
/// `what` names the work in progress messages (`rebalance`, `drain`).
pub async fn balance(s: &Session<'_>, targets: &[u32], what: &str) -> Result<Outcome> {
    let mut outcome = Outcome::default();
    let mut first = true;
    loop {
        let stats = s.stats().await?;
        let plan = plan::rebalance(&slot_states(&stats), targets)
            .map_err(|e| Error::Refused(format!("cannot plan the {what}: {e}")))?;
        if first {
            outcome.critical_path = plan.critical_path;
            outcome.lower_bound = plan.lower_bound;
            tracing::info!(
                what,
                assign = plan.assign.len(),
                moves = plan.moves.len(),
                critical_path = plan.critical_path,
                lower_bound = plan.lower_bound,
                "slot plan"
            );
            first = false;
        }
        let in_flight = stats.slots.iter().filter(|sl| !sl.is_idle()).count();
        if plan.is_empty() && in_flight == 0 {
            return Ok(outcome);
        }
        if !plan.assign.is_empty() {
            s.dashboard.slots_assign(&plan.assign).await?;
            s.dashboard.group_resync_all().await?;
            outcome.assigned += plan.assign.len();
        }
        outcome.created += submit(s, &plan).await?;
        outcome.finished += wait_idle(s, what).await?;
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

/// Waits until no slot has an action, reporting progress; the budget running out is exit 75 (or exit 1 when Codis
/// keeps reporting a migration error, which will not fix itself).
async fn wait_idle(s: &Session<'_>, what: &str) -> Result<usize> {
    let mut busy_at_start: Option<usize> = None;
    let mut last_error: Option<String> = None;
    loop {
        let stats = s.stats().await?;
        let busy = stats.slots.iter().filter(|sl| !sl.is_idle()).count();
        let total = *busy_at_start.get_or_insert(busy);
        let status = &stats.slot_action.progress.status;
        if status.starts_with("[ERROR]") {
            if last_error.as_deref() != Some(status.as_str()) {
                tracing::warn!(status = status.as_str(), "codis reports a failed slot migration");
            }
            last_error = Some(status.clone());
        } else if !status.is_empty() {
            last_error = None;
        }
        if busy == 0 {
            return Ok(total);
        }
        if stats.slot_action.disabled {
            return Err(Error::Refused(format!(
                "{what} stopped: slot actions are disabled in codis ({} of {total} still queued)",
                busy
            )));
        }
        if s.ctx.budget.expired() {
            let moved = total.saturating_sub(busy);
            return Err(match last_error {
                Some(err) => Error::Refused(format!("{what} in progress: {moved}/{total} slots moved; codis: {err}")),
                None => Error::InProgress { progress: format!("{what} in progress: {moved}/{total} slots moved") },
            });
        }
        tokio::time::sleep(s.ctx.budget.cap(MIGRATION_POLL)).await;
    }
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
