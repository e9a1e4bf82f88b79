//! The stats loop: INFO of every server and stats of every proxy, refreshed every `stats_interval` (Codis: ~1 s),
//! plus what Codis does off the back of it — re-onlining restarted proxies and, in fork mode, the health checks and
//! automatic failover of a dead master to its most advanced eligible slave.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::task::JoinSet;

use super::api::{fetch_info_pooled, group_batches, push, reinit, set_master};
use super::model::{Proxy, ProxyStatsEntry, ServerAction, ServerActionState, ServerStats};
use super::proxy_client::ProxyClient;
use super::wire::{self, ApiError};
use super::Shared;

/// Refreshes stats every `stats_interval` until the runtime stops.
pub(crate) async fn run(shared: Arc<Shared>) {
    let mut ticker = tokio::time::interval(shared.opts.stats_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if shared.is_paused() || shared.state().stats_held {
            continue;
        }
        refresh(&shared).await;
    }
}

/// INFO of a server: `Some(map)`, or `None` when it could not be read (error or timeout).
type Reachability = BTreeMap<String, Option<BTreeMap<String, String>>>;

async fn refresh(sh: &Arc<Shared>) {
    let (generation, servers, proxies): (u64, Vec<String>, Vec<Proxy>) = {
        let st = sh.state();
        (
            st.generation,
            st.topo.groups.values().flat_map(|g| g.servers.iter().map(|s| s.server.clone())).collect(),
            st.topo.proxies.values().cloned().collect(),
        )
    };
    let timeout = sh.opts.stats_timeout;
    // Upstream shows the full INFO; the fork only `INFO replication`.
    let section = if sh.opts.fork { Some("replication") } else { None };
    let mut server_set = JoinSet::new();
    for addr in servers {
        let sh = sh.clone();
        server_set.spawn(async move {
            let r = tokio::time::timeout(timeout, fetch_info_pooled(&sh, &addr, section)).await;
            (addr, r)
        });
    }
    let mut proxy_set = JoinSet::new();
    for p in proxies {
        let sh = sh.clone();
        proxy_set.spawn(async move {
            let xauth = wire::proxy_xauth(&sh.opts.product, sh.auth(), &p.token);
            let client = ProxyClient::new(&sh.http, &sh.dial_target(&p.admin_addr), &xauth);
            let r = tokio::time::timeout(timeout, client.stats()).await;
            (p, r)
        });
    }
    let now = wire::unix_now();
    let mut server_stats = BTreeMap::new();
    let mut reach: Reachability = BTreeMap::new();
    while let Some(joined) = server_set.join_next().await {
        let Ok((addr, r)) = joined else { continue };
        let entry = match r {
            Ok(Ok(info)) => {
                reach.insert(addr.clone(), Some(info.clone()));
                ServerStats { stats: Some(info), unixtime: now, ..ServerStats::default() }
            }
            Ok(Err(e)) => {
                reach.insert(addr.clone(), None);
                ServerStats { error: Some(ApiError::traced(e).body()), unixtime: now, ..ServerStats::default() }
            }
            Err(_) => {
                reach.insert(addr.clone(), None);
                ServerStats { unixtime: now, timeout: true, ..ServerStats::default() }
            }
        };
        server_stats.insert(addr, entry);
    }
    let mut proxy_stats = BTreeMap::new();
    let mut to_reonline = Vec::new();
    while let Some(joined) = proxy_set.join_next().await {
        let Ok((p, r)) = joined else { continue };
        let entry = match r {
            Ok(Ok(stats)) => {
                if !stats.online && !stats.closed {
                    to_reonline.push(p.clone());
                }
                ProxyStatsEntry { stats: Some(stats), unixtime: now, ..ProxyStatsEntry::default() }
            }
            Ok(Err(e)) => {
                ProxyStatsEntry { error: Some(ApiError::traced(e).body()), unixtime: now, ..ProxyStatsEntry::default() }
            }
            Err(_) => ProxyStatsEntry { unixtime: now, timeout: true, ..ProxyStatsEntry::default() },
        };
        proxy_stats.insert(p.token, entry);
    }
    {
        let mut st = sh.state();
        if st.generation != generation {
            // Taken by a dashboard process that has been restarted since.
            return;
        }
        st.mem.server_stats = server_stats;
        // A proxy removed while its stats were on the wire must not come back.
        proxy_stats.retain(|token, _| st.topo.proxies.contains_key(token));
        st.mem.proxy_stats = proxy_stats;
    }
    if sh.opts.fork {
        health(sh, &reach).await;
    }
    for p in to_reonline {
        // Codis re-onlines a proxy that reports `online: false, closed: false` (it was restarted).
        let _op = sh.op.lock().await;
        if sh.state().topo.proxies.contains_key(&p.token) {
            if let Err(e) = reinit(sh, &p).await {
                tracing::warn!("proxy-[{}] re-online failed: {e}", p.token);
            }
        }
    }
    sh.state().refreshes += 1;
}

/// `(binlog file, offset)` from Pika's `db0:binlog_offset=<file> <offset>,...`, else redis-server's
/// `master_repl_offset` as the offset of file 0.
fn binlog(info: &BTreeMap<String, String>) -> (u64, u64) {
    if let Some(pos) = info.get("db0").and_then(|v| v.strip_prefix("binlog_offset=")) {
        let pos = pos.split(',').next().unwrap_or("");
        let mut parts = pos.split_whitespace().map(|p| p.parse::<u64>().unwrap_or(0));
        return (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    }
    (0, info.get("master_repl_offset").and_then(|v| v.parse().ok()).unwrap_or(0))
}

/// Fork health checks: refresh healthy servers in place, count failures, re-attach recovered offline slaves with
/// the forced `SLAVEOF h p -f` (which real backends reject, so they stay offline), and fail over dead masters.
async fn health(sh: &Shared, reach: &Reachability) {
    let _op = sh.op.lock().await;
    let dead_checks = sh.opts.dead_checks.max(1);
    let mut reattach: Vec<(u32, String, String)> = Vec::new();
    let mut failover: Vec<u32> = Vec::new();
    {
        let mut st = sh.state();
        let st = &mut *st;
        for g in st.topo.groups.values_mut() {
            let promoting = !g.promoting.state.is_nothing();
            let master = g.master().unwrap_or_default().to_owned();
            for (i, s) in g.servers.iter_mut().enumerate() {
                match reach.get(&s.server) {
                    None => {}
                    Some(Some(info)) => {
                        st.mem.fail_counts.remove(&s.server);
                        let (file, offset) = binlog(info);
                        s.role = Some(info.get("role").cloned().unwrap_or_default());
                        s.binlog_file_num = Some(file);
                        s.binlog_offset = Some(offset);
                        s.is_eligible_for_master_election =
                            Some(info.get("is_eligible_for_master_election").is_none_or(|v| v == "true"));
                        if s.state == Some(2) {
                            if i == 0 {
                                s.state = Some(0);
                            } else if !promoting {
                                reattach.push((g.id, s.server.clone(), master.clone()));
                            }
                        } else {
                            s.state = Some(0);
                            s.replica_group = true;
                            // Observed: healthy servers show `synced` even if never attached; running actions are
                            // left alone so the sync executor can finish them.
                            if !matches!(s.action.state, ServerActionState::Pending | ServerActionState::Syncing) {
                                s.action = ServerAction { index: 0, state: ServerActionState::Synced };
                            }
                        }
                    }
                    Some(None) => {
                        let count = st.mem.fail_counts.entry(s.server.clone()).or_insert(0);
                        *count += 1;
                        if *count >= dead_checks {
                            s.state = Some(2);
                            s.action = ServerAction::default();
                            s.replica_group = false;
                            if i == 0 && !promoting && !failover.contains(&g.id) {
                                failover.push(g.id);
                            }
                        } else if s.state == Some(0) {
                            s.state = Some(1);
                        }
                    }
                }
            }
        }
    }
    for (gid, addr, master) in reattach {
        let result = set_master(sh, &addr, Some(&master), true).await;
        let mut st = sh.state();
        if let Some(s) = st.topo.groups.get_mut(&gid).and_then(|g| g.servers.iter_mut().find(|s| s.server == addr)) {
            s.recall_times = Some(s.recall_times.unwrap_or(0) + 1);
            if result.is_ok() {
                s.state = Some(0);
            }
        }
    }
    for gid in failover {
        fail_over(sh, gid).await;
    }
}

/// Promotes the best reachable slave of a group whose master is offline: `SLAVEOF NO ONE` on it, swap it into
/// index 0, re-point the other normal slaves (plain `SLAVEOF`), push the group's slots.
async fn fail_over(sh: &Shared, gid: u32) {
    let plan = {
        let st = sh.state();
        let Some(g) = st.topo.groups.get(&gid) else {
            return;
        };
        if g.servers.first().and_then(|s| s.state) != Some(2) || !g.promoting.state.is_nothing() {
            return;
        }
        let best = g
            .servers
            .iter()
            .enumerate()
            .skip(1)
            .filter(|(_, s)| s.state == Some(0) && s.is_eligible_for_master_election != Some(false))
            .max_by_key(|(i, s)| (s.binlog_file_num.unwrap_or(0), s.binlog_offset.unwrap_or(0), std::cmp::Reverse(*i)));
        let Some((index, new_master)) = best else {
            tracing::warn!("group-[{gid}] master is offline and no slave can take over");
            return;
        };
        let others: Vec<String> = g
            .servers
            .iter()
            .enumerate()
            .skip(1)
            .filter(|(i, s)| *i != index && s.state == Some(0))
            .map(|(_, s)| s.server.clone())
            .collect();
        (index, new_master.server.clone(), others)
    };
    let (index, new_master, others) = plan;
    if let Err(e) = set_master(sh, &new_master, None, false).await {
        tracing::warn!("group-[{gid}] failover to {new_master} failed: {e}");
        return;
    }
    {
        let mut st = sh.state();
        let Some(g) = st.topo.groups.get_mut(&gid) else {
            return;
        };
        if g.servers.get(index).map(|s| s.server.as_str()) != Some(new_master.as_str()) {
            return;
        }
        g.servers.swap(0, index);
        g.servers[0].role = Some("master".into());
        // An HA switch sets out_of_sync; only a resync through the API clears it.
        g.out_of_sync = true;
    }
    for other in others {
        if let Err(e) = set_master(sh, &other, Some(&new_master), false).await {
            tracing::warn!("group-[{gid}] re-point {other} to {new_master} failed: {e}");
        }
    }
    let batch = group_batches(&sh.state().topo, gid);
    if let Err(e) = push(sh, batch).await {
        tracing::warn!("group-[{gid}] resync after failover failed: {e}");
    }
}
