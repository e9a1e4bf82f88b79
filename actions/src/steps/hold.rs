//! Holding a group's writes at every proxy while its master changes hands, so that no write the old master
//! acknowledged is missing from the new one.
//!
//! pika has no `WAIT`, no `CLIENT PAUSE` and no `FAILOVER`, and Codis's promote does not wait for the new master to
//! catch up: it locks the group's slots in every proxy (its `prepared` state) and sends `SLAVEOF NO ONE` in the
//! same call, so writes the old master acknowledged just before the lock and had not yet sent on were lost. A
//! planned transfer therefore takes that lock itself first, the way the dashboard does (`fillslots` with the slot
//! `locked`): the proxy then holds new requests to those slots and answers only once every request already sent to
//! the old master came back (codis-proxy's per-slot reference count). From then on the old master's binlog does not
//! move; the transfer waits until the new master's position reaches it, and only then promotes. Codis's promote
//! unlocks the slots, now routed to the new master, in its `finished` state.
//!
//! Anything that stops the transfer in between releases the hold with a group resync: the dashboard pushes its own
//! view of the group's slots to every proxy, unlocked unless a promote or migration of its own holds them. A run
//! that crashes while holding leaves the group's fence in etcd; the next transfer of the group finds it and resyncs
//! before anything else ([`crate::steps::transfer::move_master`]).

use std::time::Duration;

use crate::clients::codis::{Proxy, ProxySlot, Stats};
use crate::error::Result;
use crate::input::address::HostPort;
use crate::input::replication::BinlogPosition;
use crate::steps::cluster::Session;

/// Longest the new master may take to reach the old one's binlog position while writes are held; past it the hold
/// is released and nothing is promoted. Writes wait this long at most, so it stays short.
pub const CATCH_UP_WHILE_HELD: Duration = Duration::from_millis(500);
/// How often positions are compared while writes are held.
const POLL_WHILE_HELD: Duration = Duration::from_millis(2);

/// What [`hold`] locked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// Proxies whose slots were locked.
    pub proxies: usize,
    /// Slots locked, over all of them.
    pub slots: usize,
}

/// Locks, in every registered proxy, the slots that route to `master`; returns once each proxy has answered every
/// request it had already sent there.
///
/// # Errors
/// A proxy that cannot be asked or refuses; the hold may then be partial, and the caller releases it.
pub async fn hold(s: &Session<'_>, stats: &Stats, master: &str) -> Result<Held> {
    let mut held = Held { proxies: 0, slots: 0 };
    for proxy in &stats.proxy.models {
        let (at, table) = routing_table(s, proxy).await?;
        let routed: Vec<ProxySlot> = table
            .into_iter()
            .filter(|slot| slot.backend_addr.eq_ignore_ascii_case(master))
            .map(|slot| ProxySlot { locked: true, ..slot })
            .collect();
        if routed.is_empty() {
            continue;
        }
        let auth = s.ctx.secrets.pika_password.as_deref().unwrap_or_default();
        s.dashboard.proxy_fill_slots(&at, &proxy.token, auth, &routed).await?;
        held.proxies += 1;
        held.slots += routed.len();
    }
    Ok(held)
}

/// Where `proxy`'s admin API is, and the slot table it routes by.
async fn routing_table(s: &Session<'_>, proxy: &Proxy) -> Result<(HostPort, Vec<ProxySlot>)> {
    let at = s.dial(&proxy.admin_addr)?;
    let auth = s.ctx.secrets.pika_password.as_deref().unwrap_or_default();
    let table = s.dashboard.proxy_slots(&at, &proxy.token, auth).await?;
    Ok((at, table))
}

/// Lets group `gid`'s held requests go, to wherever the dashboard now routes them. Never fails: a hold that cannot
/// be released now is released by the next transfer of the group, so the failure is logged.
pub async fn release(s: &Session<'_>, gid: u32) {
    if let Err(e) = s.dashboard.group_resync(gid).await {
        tracing::warn!(gid, error = %e, "could not release the proxies' hold on the group; the next transfer does");
    }
}

/// Releases a hold that nobody will finish: group `gid`'s idle slots locked in some proxy while the group has no
/// fence (no transfer under way: a transfer writes its fence before it holds, and the fence outlives any hold) and
/// no promote. What a transfer that was killed while holding, and never run again, leaves; the failover watcher
/// looks for it. Returns whether it released one.
pub async fn release_stale(s: &Session<'_>, stats: &Stats, gid: u32) -> bool {
    let Some(group) = stats.group(gid) else { return false };
    let Some(master) = group.master() else { return false };
    if group.is_promoting() {
        return false;
    }
    let idle: std::collections::BTreeSet<u32> =
        stats.slots_of(gid).into_iter().filter(|m| m.is_idle()).map(|m| m.id).collect();
    let mut locked = false;
    for proxy in &stats.proxy.models {
        match routing_table(s, proxy).await {
            Ok((_, table)) => {
                locked |= table.iter().any(|slot| {
                    slot.locked && idle.contains(&slot.id) && slot.backend_addr.eq_ignore_ascii_case(master)
                });
            }
            Err(e) => tracing::debug!(gid, proxy = %proxy.admin_addr, error = %e, "cannot read the proxy's slots"),
        }
    }
    tracing::debug!(gid, locked, idle = idle.len(), "looked for a hold nobody finishes");
    if !locked {
        return false;
    }
    let fenced = match s.etcd() {
        Ok(etcd) => etcd.get(&crate::steps::transfer::fence_key(&s.prefix(), gid)).await,
        Err(_) => return false,
    };
    if !matches!(fenced, Ok(None)) {
        return false;
    }
    tracing::warn!(gid, "proxies hold the group's writes and no transfer is under way: releasing them");
    release(s, gid).await;
    true
}

/// Waits, at most [`CATCH_UP_WHILE_HELD`], until `to`'s binlog has reached `master`'s (which no longer moves while
/// writes are held); returns the position reached, or `None` when it was not reached in time or could not be read.
pub async fn caught_up(s: &Session<'_>, master: &str, to: &str) -> Option<BinlogPosition> {
    let deadline = tokio::time::Instant::now() + CATCH_UP_WHILE_HELD;
    let target = s.replication(master).await.ok()?.position?;
    loop {
        let at = s.replication(to).await.ok()?.position?;
        if at >= target {
            return Some(at);
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(to, master_at = %target, at = %at, "the new master did not catch up while writes were held");
            return None;
        }
        tokio::time::sleep(POLL_WHILE_HELD).await;
    }
}
