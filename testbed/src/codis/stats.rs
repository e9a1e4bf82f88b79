//! The stats loop: INFO of every server and stats of every proxy, refreshed every `stats_interval` (Codis: ~1 s),
//! plus what Codis does off the back of it — re-onlining restarted proxies and, in fork mode, the health checks and
//! automatic failover of a dead master to its most advanced eligible slave.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::task::JoinSet;

use super::api::{fetch_info_pooled, group_batches, info_of, push, reinit, set_master};
use super::model::{Proxy, ProxyStatsEntry, ServerAction, ServerActionState, ServerStats};
use super::resp::Conn;
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
            let client = sh.proxy_client(&p);
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

/// The fork's three check loops, each on its own period, until the runtime stops: each reads `INFO replication`
/// of the servers in its state on a fresh connection, waiting as long as the fork does (10 s for servers in state
/// 0, 5 s for the others), apart from the stats refresh (whose 1 s timeout would take a slow pika for a dead one).
pub(crate) async fn run_health(shared: Arc<Shared>) {
    let o = &shared.opts;
    let period = o.server_check_interval.min(o.failover_check_interval).min(o.offline_check_interval);
    let mut ticker = tokio::time::interval(period.max(std::time::Duration::from_millis(1)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last: [Option<tokio::time::Instant>; 3] = [None; 3];
    loop {
        ticker.tick().await;
        if shared.is_paused() || shared.state().stats_held {
            continue;
        }
        let now = tokio::time::Instant::now();
        let periods = [o.server_check_interval, o.failover_check_interval, o.offline_check_interval];
        let mut due = [false; 3];
        for (k, every) in periods.iter().enumerate() {
            due[k] = last[k].is_none_or(|t| now.duration_since(t) >= *every);
            if due[k] {
                last[k] = Some(now);
            }
        }
        if due.iter().any(|d| *d) {
            check(&shared, due).await;
        }
    }
}

/// One round of the check loops that are `due` (by state 0, 1, 2).
async fn check(sh: &Arc<Shared>, due: [bool; 3]) {
    let servers: Vec<(String, u64)> = {
        let st = sh.state();
        st.topo
            .groups
            .values()
            .flat_map(|g| g.servers.iter())
            .filter_map(|s| {
                let state = usize::try_from(s.state.unwrap_or(0)).ok()?;
                due.get(state).copied().unwrap_or(false).then(|| (s.server.clone(), if state == 0 { 10 } else { 5 }))
            })
            .collect()
    };
    if servers.is_empty() {
        return;
    }
    let mut set = JoinSet::new();
    for (addr, secs) in servers {
        let sh = sh.clone();
        set.spawn(async move {
            let read = async {
                let mut conn = Conn::dial(&sh.dial_target(&addr), sh.password(), sh.opts.dial_timeout).await?;
                info_of(&sh, &mut conn, Some("replication")).await
            };
            let r = tokio::time::timeout(std::time::Duration::from_secs(secs), read).await;
            (addr, r.ok().and_then(Result::ok))
        });
    }
    let mut reach: Reachability = BTreeMap::new();
    while let Some(joined) = set.join_next().await {
        if let Ok((addr, info)) = joined {
            reach.insert(addr, info);
        }
    }
    health(sh, &reach).await;
}

/// The fork's `CheckStateAndSwitchSlavesAndMasters` over the servers just read (`None`: no answer in time): a reachable server in state 0 or 1 is refreshed in place; an
/// unreachable one goes to state 1, then counts `recall_times` until `dead_checks`, then is offline (state 2); a
/// group with a server down is marked out of sync and its slots pushed again; a dead master is failed over; a
/// reachable offline server is re-attached (`tryFixReplicationRelationship`).
async fn health(sh: &Shared, reach: &Reachability) {
    let _op = sh.op.lock().await;
    let dead_checks = i64::from(sh.opts.dead_checks.max(1));
    let mut slave_offline: Vec<u32> = Vec::new();
    let mut master_offline: Vec<u32> = Vec::new();
    let mut recovered: Vec<(u32, usize, BTreeMap<String, String>)> = Vec::new();
    {
        let mut st = sh.state();
        let st = &mut *st;
        for g in st.topo.groups.values_mut() {
            for (i, s) in g.servers.iter_mut().enumerate() {
                let state = s.state.unwrap_or(0);
                match reach.get(&s.server) {
                    None => {}
                    Some(Some(info)) if state == 2 => recovered.push((g.id, i, info.clone())),
                    Some(Some(info)) => {
                        refresh_server(s, info);
                    }
                    Some(None) if state == 0 => s.state = Some(1),
                    Some(None) => {
                        let recalls = s.recall_times.unwrap_or(0) + 1;
                        s.recall_times = Some(recalls);
                        if recalls >= dead_checks {
                            s.state = Some(2);
                            s.action = ServerAction::default();
                            s.replica_group = false;
                        }
                        let list = if s.state == Some(2) && i == 0 { &mut master_offline } else { &mut slave_offline };
                        if !list.contains(&g.id) {
                            list.push(g.id);
                        }
                    }
                }
            }
        }
    }
    for gid in slave_offline {
        // Out of sync until a later check brings the server back: the fork never clears it here.
        set_out_of_sync(sh, gid, true);
        resync(sh, gid).await;
    }
    let masters_down = master_offline.len();
    for gid in master_offline {
        set_out_of_sync(sh, gid, true);
        if fail_over(sh, gid).await && resync(sh, gid).await {
            set_out_of_sync(sh, gid, false);
        }
    }
    for (gid, index, info) in recovered {
        set_out_of_sync(sh, gid, true);
        if reattach(sh, gid, index, &info, masters_down).await && resync(sh, gid).await {
            set_out_of_sync(sh, gid, false);
        }
    }
}

/// A reachable server's fields from its INFO, as the fork's checks refresh them.
fn refresh_server(s: &mut super::model::GroupServer, info: &BTreeMap<String, String>) {
    let (file, offset) = binlog(info);
    s.state = Some(0);
    s.recall_times = Some(0);
    s.replica_group = true;
    s.role = Some(info.get("role").cloned().unwrap_or_default());
    s.binlog_file_num = Some(file);
    s.binlog_offset = Some(offset);
    s.is_eligible_for_master_election = Some(info.get("is_eligible_for_master_election").is_none_or(|v| v == "true"));
    // Even over a pending or running sync action, as the fork does.
    s.action = ServerAction { index: 0, state: ServerActionState::Synced };
}

/// Pushes group `gid`'s slots to every proxy; whether all took them.
async fn resync(sh: &Shared, gid: u32) -> bool {
    let batches = group_batches(&sh.state().topo, gid);
    match push(sh, batches).await {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!("group-[{gid}] notify all proxy failed: {e}");
            false
        }
    }
}

fn set_out_of_sync(sh: &Shared, gid: u32, value: bool) {
    if let Some(g) = sh.state().topo.groups.get_mut(&gid) {
        g.out_of_sync = value;
    }
}

/// The fork's `tryFixReplicationRelationship` for server `index` of group `gid`, offline and answering again:
/// `true` when it returned no error (the group's slots are then pushed and the group back in sync). A master is
/// left alone while another group's master is down, else told `SLAVEOF NO ONE`; a replica already following the
/// master is left offline (never, in fact: the fork reads `master_host` and `master_port` swapped), else is sent the
/// forced `SLAVEOF h p -f`, which pika and redis-server reject. Only a command that went through brings it back.
async fn reattach(sh: &Shared, gid: u32, index: usize, info: &BTreeMap<String, String>, masters_down: usize) -> bool {
    let (addr, master) = {
        let st = sh.state();
        let Some(g) = st.topo.groups.get(&gid) else { return false };
        let Some(s) = g.servers.get(index) else { return false };
        (s.server.clone(), g.master().unwrap_or_default().to_owned())
    };
    let result = if index == 0 {
        if info.get("role").is_some_and(|r| r == "master") && masters_down > 0 {
            return true;
        }
        set_master(sh, &addr, None, false).await
    } else {
        let (host, port) = (info.get("master_port"), info.get("master_host"));
        let follows = match (host, port) {
            (Some(h), Some(p)) if !h.is_empty() => format!("{h}:{p}") == master,
            _ => false,
        };
        if follows {
            return true;
        }
        set_master(sh, &addr, Some(&master), true).await
    };
    if let Err(e) = result {
        tracing::warn!("group-[{gid}] fix server[{addr}] replication relationship failed: {e}");
        return false;
    }
    let mut st = sh.state();
    if let Some(s) = st.topo.groups.get_mut(&gid).and_then(|g| g.servers.get_mut(index)).filter(|s| s.server == addr) {
        refresh_server(s, info);
    }
    true
}

/// The fork's `trySwitchGroupMaster` for a group whose master is offline: the first state-0 eligible replica with
/// the highest (binlog file, offset) is told `SLAVEOF NO ONE` and swapped into index 0; every other state-0 server
/// is pointed at it (a forced `SLAVEOF h p -f` for one not eligible), and one that refuses goes offline. `true` when
/// the switch went through (the caller then pushes the group's slots).
async fn fail_over(sh: &Shared, gid: u32) -> bool {
    let plan = {
        let st = sh.state();
        let Some(g) = st.topo.groups.get(&gid) else {
            return false;
        };
        let mut best: Option<(usize, &super::model::GroupServer)> = None;
        for (i, s) in g.servers.iter().enumerate().skip(1) {
            if s.state != Some(0) || s.is_eligible_for_master_election != Some(true) {
                continue;
            }
            let position =
                |s: &super::model::GroupServer| (s.binlog_file_num.unwrap_or(0), s.binlog_offset.unwrap_or(0));
            if best.is_none_or(|(_, b)| position(s) > position(b)) {
                best = Some((i, s));
            }
        }
        let Some((index, new_master)) = best else {
            tracing::warn!("group {gid} don't has any slaves to switch master");
            return false;
        };
        (index, new_master.server.clone())
    };
    let (index, new_master) = plan;
    if let Err(e) = set_master(sh, &new_master, None, false).await {
        tracing::warn!("group-[{gid}] promote server[{new_master}] to new master failed: {e}");
        return false;
    }
    let others: Vec<(String, bool)> = {
        let mut st = sh.state();
        let Some(g) = st.topo.groups.get_mut(&gid) else {
            return false;
        };
        if g.servers.get(index).map(|s| s.server.as_str()) != Some(new_master.as_str()) {
            return false;
        }
        g.servers[index].role = Some("master".into());
        g.servers[index].action = ServerAction { index: 0, state: ServerActionState::Synced };
        g.servers.swap(0, index);
        g.servers
            .iter()
            .filter(|s| s.state == Some(0) && s.server != new_master)
            .map(|s| (s.server.clone(), s.is_eligible_for_master_election == Some(true)))
            .collect()
    };
    for (other, eligible) in others {
        if let Err(e) = set_master(sh, &other, Some(&new_master), !eligible).await {
            tracing::warn!("group-[{gid}] re-point {other} to {new_master} failed: {e}");
            let mut st = sh.state();
            if let Some(s) = st.topo.groups.get_mut(&gid).and_then(|g| g.servers.iter_mut().find(|s| s.server == other))
            {
                s.action = ServerAction { index: 0, state: ServerActionState::SyncedFailed };
                s.state = Some(2);
            }
        }
    }
    true
}
