//! Pausing Codis's migration executor for a promote.
//!
//! Codis refuses every promote while any migration batch is on the wire ("slots-migration is running"), and a large
//! slot's batches follow each other with no gap, so a failover could wait for a whole migration. A promote refused
//! for that pauses the executor (`slots/action/disabled`): the batch on the wire finishes, no other starts, the
//! promote goes through, and the executor resumes.
//!
//! Each pause is recorded in etcd first (`<prefix>/migrations-paused/<gid>`, one key per group promoting), so that
//! a run that crashes in between leaves a record and the failover watcher's periodic round resumes the executor
//! ([`resume_left`]); the executor resumes only when no record is left, so two promotes at once never resume it
//! under each other. A pause an operator made (the executor found disabled with no record) is never touched.
//! Drains and rebalances wait while the executor is paused for a promote instead of refusing ([`paused_for_promote`]).

use std::time::Duration;

use crate::clients::codis::Stats;
use crate::error::Result;
use crate::steps::cluster::{release, Session};
use crate::steps::transfer;

/// The etcd directory of the pause records.
fn dir(prefix: &str) -> String {
    format!("{}/migrations-paused/", prefix.trim_end_matches('/'))
}

/// The pause record of group `gid`'s promote.
#[must_use]
pub fn record_key(prefix: &str, gid: u32) -> String {
    format!("{}{gid}", dir(prefix))
}

/// Pauses the migration executor for group `gid`'s promote; `false` when an operator paused it already (then
/// nothing is recorded or changed: the batch on the wire finishes and the promote goes through all the same).
///
/// # Errors
/// etcd or the dashboard fail (the promote is retried, so is this).
pub async fn pause(s: &Session<'_>, stats: &Stats, gid: u32) -> Result<bool> {
    let etcd = s.etcd()?;
    if stats.slot_action.disabled && etcd.list(&dir(&s.prefix())).await?.is_empty() {
        tracing::info!(gid, "the migration executor is paused by an operator; waiting for the batch on the wire");
        return Ok(false);
    }
    etcd.put(&record_key(&s.prefix(), gid), &format!("{} {}", s.ctx.action, std::process::id()), None).await?;
    s.dashboard.slot_actions_disabled(true).await?;
    tracing::info!(gid, "migrations paused for the promote");
    Ok(true)
}

/// Removes group `gid`'s pause record and resumes the executor when no other promote holds it paused. Never fails:
/// what cannot be done now is done by the watcher's next round ([`resume_left`]), so the failure is logged.
pub async fn resume(s: &Session<'_>, gid: u32) {
    let result: Result<()> = async {
        let etcd = s.etcd()?;
        let prefix = s.prefix();
        let others = etcd.list(&dir(&prefix)).await?;
        let key = record_key(&prefix, gid);
        if others.iter().all(|(k, _)| *k == key) {
            s.dashboard.slot_actions_disabled(false).await?;
            tracing::info!(gid, "migrations resumed after the promote");
        }
        etcd.delete(&key).await?;
        Ok(())
    }
    .await;
    if let Err(e) = result {
        tracing::warn!(gid, error = %e.one_line(), "could not resume the migrations after the promote; the failover watcher does");
    }
}

/// Whether group `gid` has a pause record (`true` when etcd cannot say, so that the caller resumes).
pub async fn recorded(s: &Session<'_>, gid: u32) -> bool {
    let Ok(etcd) = s.etcd() else { return false };
    !matches!(etcd.get(&record_key(&s.prefix(), gid)).await, Ok(None))
}

/// Resumes the executor for a pause record of group `gid` that no promote holds any more: a run that crashed while
/// migrations were paused for it. Taken under the group's transfer lock (every promote holds it), so a record found
/// then is left over. Returns whether one was.
pub async fn resume_left(s: &Session<'_>, gid: u32) -> Result<bool> {
    let etcd = s.etcd()?;
    if etcd.get(&record_key(&s.prefix(), gid)).await?.is_none() {
        return Ok(false);
    }
    let mut lock = match transfer::lock_group(s, gid, Duration::ZERO).await {
        Ok(lock) => lock,
        Err(crate::error::Error::InProgress { .. }) => return Ok(false),
        Err(e) => return Err(e),
    };
    let left = etcd.get(&record_key(&s.prefix(), gid)).await?.is_some();
    if left {
        tracing::warn!(gid, "a promote left the migrations paused; resuming them");
        resume(s, gid).await;
    }
    release(&mut lock).await;
    Ok(left)
}

/// Whether the executor is paused for a promote (disabled, with a pause record, or enabled again since `stats` was
/// read): a drain or rebalance waits then, as it waits for any batch.
pub async fn paused_for_promote(s: &Session<'_>, stats: &Stats) -> bool {
    if !stats.slot_action.disabled {
        return false;
    }
    let Ok(etcd) = s.etcd() else { return false };
    if etcd.list(&dir(&s.prefix())).await.is_ok_and(|records| !records.is_empty()) {
        return true;
    }
    // A promote resumes the executor before it deletes its record, so `stats`, read before the record went, may
    // still show its pause (seen: a drain refused beside a split's promote). Only an executor still disabled now,
    // with no record, is an operator's pause; one enabled again counts as a pause just ended, and the caller looks
    // again.
    s.stats().await.is_ok_and(|now| !now.slot_action.disabled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_group_has_its_own_record_under_the_cluster_prefix() {
        assert_eq!(record_key("/pika-kubeblocks/ns/c1/", 3), "/pika-kubeblocks/ns/c1/migrations-paused/3");
        assert!(record_key("/pika-kubeblocks/ns/c1", 12).starts_with(&dir("/pika-kubeblocks/ns/c1/")));
        assert_ne!(record_key("/p/", 1), record_key("/p/", 11));
    }
}
