//! The dashboard's routes (Codis's `pkg/topom/topom_api.go`) and the I/O Codis does around each stored mutation:
//! dialling servers, pushing slots to proxies, sending SLAVEOF.
//!
//! Routing is done here rather than with axum's path patterns because Codis's router (martini) has rules axum does
//! not: an optional trailing slash, 404 instead of 405 for a wrong method, raw `:` in segments, and an optional last
//! segment (`group/add/.../{datacenter}`). Every API call checks the xauth before parsing any other parameter.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{Method, Response, Uri};
use serde::Serialize;
use tokio::task::JoinSet;

use super::model::{
    Group, Promoting, PromotingState, Proxy, ProxyStatsEntry, ServerStats, Slot, SlotActionStats, SlotMapping,
    TopomModel,
};
use super::proxy_client::ProxyClient;
use super::resp::Conn;
use super::slotkeys;
use super::state::{AssignItem, Topo};
use super::wire::{self, ApiError};
use super::Shared;

/// Go's `strconv.Atoi` failure as Codis reports it: `invalid <param>`, untraced.
fn int(text: &str, name: &str) -> Result<i64, ApiError> {
    text.parse::<i64>().map_err(|_| ApiError::plain(format!("invalid {name}")))
}

fn authed(shared: &Shared, x: &str) -> Result<(), ApiError> {
    if x == shared.xauth {
        Ok(())
    } else {
        Err(ApiError::plain("invalid xauth, please check product name & auth"))
    }
}

/// The axum fallback handler: every request lands here.
pub(crate) async fn dispatch(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    body: Bytes,
) -> Response<Body> {
    let Some(segs) = wire::segments(uri.path()) else {
        return wire::not_found();
    };
    let s: Vec<&str> = segs.iter().map(String::as_str).collect();
    let get = method == Method::GET;
    let put = method == Method::PUT;
    let sh = shared.as_ref();
    let result = match s.as_slice() {
        [] if get => Ok(wire::redirect("/topom")),
        ["topom"] if get => Ok(wire::ok_json(&overview(sh))),
        ["topom", "model"] | ["api", "topom", "model"] if get => Ok(wire::ok_json(&topom(sh))),
        ["topom", "stats"] if get => Ok(wire::ok_json(&stats(sh))),
        ["topom", "slots"] if get => Ok(wire::ok_json(&slots(sh))),
        ["api", "topom", "group", "info", addr] if get => group_info(sh, addr).await,
        ["api", "topom", rest @ ..] if get => match rest {
            ["xping", x] => authed(sh, x).map(|()| wire::ok()),
            ["stats", x] => authed(sh, x).map(|()| wire::ok_json(&stats(sh))),
            ["slots", x] => authed(sh, x).map(|()| wire::ok_json(&slots(sh))),
            _ => return wire::not_found(),
        },
        ["api", "topom", rest @ ..] if put => match put_route(&shared, rest, &body).await {
            Some(r) => r,
            None => return wire::not_found(),
        },
        _ => return wire::not_found(),
    };
    wire::reply(result)
}

/// The PUT routes under `/api/topom/`; `None` when no route matches.
async fn put_route(shared: &Arc<Shared>, rest: &[&str], body: &[u8]) -> Option<Result<Response<Body>, ApiError>> {
    let sh = shared.as_ref();
    let ok = |r: Result<(), ApiError>| r.map(|()| wire::ok());
    Some(match rest {
        ["reload", x] => authed(sh, x).map(|()| wire::ok()),
        ["shutdown", x] => authed(sh, x).map(|()| {
            sh.shutdown_soon();
            wire::ok()
        }),
        ["loglevel", x, level] => ok(loglevel(sh, x, level)),
        ["proxy", "create", x, addr] => ok(proxy_create(sh, x, addr, false).await),
        ["proxy", "online", x, addr] => ok(proxy_create(sh, x, addr, true).await),
        ["proxy", "reinit", x, token] => ok(proxy_reinit(sh, x, token).await),
        ["proxy", "remove", x, token, force] => ok(proxy_remove(sh, x, token, force).await),
        ["group", "create", x, gid] => ok(stored(sh, x, |t| t.create_group(int(gid, "gid")?)).await),
        ["group", "remove", x, gid] => ok(stored(sh, x, |t| t.remove_group(int(gid, "gid")?)).await),
        ["group", "resync", x, gid] => ok(group_resync(sh, x, Some(gid)).await),
        ["group", "resync-all", x] => ok(group_resync(sh, x, None).await),
        ["group", "add", x, gid, addr] => ok(group_add(sh, x, gid, addr, "").await),
        ["group", "add", x, gid, addr, dc] => ok(group_add(sh, x, gid, addr, dc).await),
        ["group", "del", x, gid, addr] => ok(stored(sh, x, |t| t.group_del_server(int(gid, "gid")?, addr)).await),
        ["group", "promote", x, gid, addr] => ok(group_promote(sh, x, gid, addr).await),
        ["group", "replica-groups", x, gid, addr, value] => ok(stored(sh, x, |t| {
            let gid = int(gid, "gid")?;
            let value = int(value, "value")?;
            t.replica_groups(gid, addr, value != 0)
        })
        .await),
        ["group", "replica-groups-all", x, value] => {
            ok(stored(sh, x, |t| t.replica_groups_all(int(value, "value")? != 0)).await)
        }
        ["group", "action", "create", x, addr] => ok(stored(sh, x, |t| t.sync_create(addr)).await),
        ["group", "action", "remove", x, addr] => ok(stored(sh, x, |t| t.sync_remove(addr)).await),
        ["slots", "action", "create", x, sid, gid] => ok(stored(sh, x, |t| {
            let sid = int(sid, "sid")?;
            t.slot_create(sid, int(gid, "gid")?)
        })
        .await),
        ["slots", "action", "create-some", x, src, dst, num] => ok(stored(sh, x, |t| {
            let (src, dst) = (int(src, "src")?, int(dst, "dst")?);
            t.slot_create_some(src, dst, int(num, "num")?)
        })
        .await),
        ["slots", "action", "create-range", x, beg, end, gid] => ok(stored(sh, x, |t| {
            let (beg, end) = (int(beg, "beg")?, int(end, "end")?);
            t.slot_create_range(beg, end, int(gid, "gid")?)
        })
        .await),
        ["slots", "action", "remove", x, sid] => ok(stored(sh, x, |t| t.slot_remove(int(sid, "sid")?)).await),
        ["slots", "action", "interval", x, value] => ok(authed(sh, x).and_then(|()| {
            let us = int(value, "value")?.clamp(0, 1_000_000);
            sh.state().mem.slot_action.interval = us;
            Ok(())
        })),
        ["slots", "action", "disabled", x, value] => ok(authed(sh, x).and_then(|()| {
            let value = int(value, "value")?;
            sh.state().mem.slot_action.disabled = value != 0;
            Ok(())
        })),
        ["slots", "assign", x] => ok(slots_assign(sh, x, body, false).await),
        ["slots", "assign", x, "offline"] => ok(slots_assign(sh, x, body, true).await),
        ["slots", "rebalance", x, confirm] => rebalance(sh, x, confirm).await,
        _ => return None,
    })
}

/// A mutation with no I/O: xauth, then the check-and-store under the op lock.
async fn stored(sh: &Shared, x: &str, f: impl FnOnce(&mut Topo) -> Result<(), ApiError>) -> Result<(), ApiError> {
    authed(sh, x)?;
    let _op = sh.op.lock().await;
    let mut st = sh.state();
    f(&mut st.topo)
}

fn loglevel(sh: &Shared, x: &str, level: &str) -> Result<(), ApiError> {
    authed(sh, x)?;
    let level = level.to_ascii_lowercase();
    if !["error", "debug", "warn", "warning", "info", "none"].contains(&level.as_str()) {
        return Err(ApiError::plain("invalid loglevel"));
    }
    sh.state().loglevel = level;
    Ok(())
}

#[derive(Serialize)]
struct SentinelModel {
    out_of_sync: bool,
}

#[derive(Serialize)]
struct Sentinels {
    model: SentinelModel,
    stats: BTreeMap<String, String>,
    masters: BTreeMap<String, String>,
}

#[derive(Serialize)]
struct GroupStats {
    models: Vec<Group>,
    stats: BTreeMap<String, ServerStats>,
}

#[derive(Serialize)]
struct ProxyStatsOut {
    models: Vec<Proxy>,
    stats: BTreeMap<String, ProxyStatsEntry>,
}

/// `Stats` as Codis serialises it.
#[derive(Serialize)]
pub(crate) struct Stats {
    closed: bool,
    slots: Vec<SlotMapping>,
    group: GroupStats,
    proxy: ProxyStatsOut,
    slot_action: SlotActionStats,
    sentinels: Sentinels,
}

fn stats(sh: &Shared) -> Stats {
    let st = sh.state();
    let mut proxies: Vec<Proxy> = st.topo.proxies.values().cloned().collect();
    proxies.sort_by_key(|p| p.id);
    Stats {
        closed: false,
        slots: st.topo.slots.clone(),
        group: GroupStats { models: st.topo.groups.values().cloned().collect(), stats: st.mem.server_stats.clone() },
        proxy: ProxyStatsOut { models: proxies, stats: st.mem.proxy_stats.clone() },
        slot_action: st.mem.slot_action.clone(),
        sentinels: Sentinels {
            model: SentinelModel { out_of_sync: false },
            stats: BTreeMap::new(),
            masters: BTreeMap::new(),
        },
    }
}

fn slots(sh: &Shared) -> Vec<Slot> {
    let st = sh.state();
    st.topo.slots.iter().map(|m| st.topo.slot_view(m, None)).collect()
}

/// Upstream dashboard config, in Codis's serialisation order.
#[derive(Serialize)]
struct UpstreamConfig {
    coordinator_name: String,
    coordinator_addr: String,
    coordinator_auth: String,
    admin_addr: String,
    product_name: String,
    migration_method: String,
    migration_parallel_slots: usize,
    migration_async_maxbulks: u32,
    migration_async_maxbytes: String,
    migration_async_numkeys: u32,
    migration_timeout: String,
    sentinel_client_timeout: String,
    sentinel_quorum: u32,
    sentinel_parallel_syncs: u32,
    sentinel_down_after: String,
    sentinel_failover_timeout: String,
    sentinel_notification_script: String,
    sentinel_client_reconfig_script: String,
}

/// Fork dashboard config: no `sentinel_client_timeout`, `max_slot_num` and the HA settings added.
#[derive(Serialize)]
struct ForkConfig {
    coordinator_name: String,
    coordinator_addr: String,
    coordinator_auth: String,
    admin_addr: String,
    product_name: String,
    migration_method: String,
    migration_parallel_slots: usize,
    migration_async_maxbulks: u32,
    migration_async_maxbytes: String,
    migration_async_numkeys: u32,
    migration_timeout: String,
    max_slot_num: usize,
    sentinel_quorum: u32,
    sentinel_parallel_syncs: u32,
    sentinel_down_after: String,
    sentinel_failover_timeout: String,
    sentinel_notification_script: String,
    sentinel_client_reconfig_script: String,
    sentinel_check_master_failover_interval: String,
    sentinel_master_dead_check_times: u32,
    sentinel_check_offline_server_interval: String,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Config {
    Upstream(UpstreamConfig),
    Fork(ForkConfig),
}

fn config(sh: &Shared) -> Config {
    let o = &sh.opts;
    let ms = |d: std::time::Duration| format!("{}ms", d.as_millis());
    if o.fork {
        Config::Fork(ForkConfig {
            coordinator_name: "memory".into(),
            coordinator_addr: String::new(),
            coordinator_auth: String::new(),
            admin_addr: topom(sh).admin_addr,
            product_name: o.product.clone(),
            migration_method: o.migration_method.clone(),
            migration_parallel_slots: o.migration_parallel_slots,
            migration_async_maxbulks: 200,
            migration_async_maxbytes: "32mb".into(),
            migration_async_numkeys: 500,
            migration_timeout: "30s".into(),
            max_slot_num: o.max_slot_num,
            sentinel_quorum: 2,
            sentinel_parallel_syncs: 1,
            sentinel_down_after: "30s".into(),
            sentinel_failover_timeout: "5m".into(),
            sentinel_notification_script: String::new(),
            sentinel_client_reconfig_script: String::new(),
            sentinel_check_master_failover_interval: ms(o.failover_check_interval),
            sentinel_master_dead_check_times: o.dead_checks,
            sentinel_check_offline_server_interval: ms(o.offline_check_interval),
        })
    } else {
        Config::Upstream(UpstreamConfig {
            coordinator_name: "memory".into(),
            coordinator_addr: String::new(),
            coordinator_auth: String::new(),
            admin_addr: topom(sh).admin_addr,
            product_name: o.product.clone(),
            migration_method: o.migration_method.clone(),
            migration_parallel_slots: o.migration_parallel_slots,
            migration_async_maxbulks: 200,
            migration_async_maxbytes: "32mb".into(),
            migration_async_numkeys: 500,
            migration_timeout: "30s".into(),
            sentinel_client_timeout: "10s".into(),
            sentinel_quorum: 2,
            sentinel_parallel_syncs: 1,
            sentinel_down_after: "30s".into(),
            sentinel_failover_timeout: "5m".into(),
            sentinel_notification_script: String::new(),
            sentinel_client_reconfig_script: String::new(),
        })
    }
}

#[derive(Serialize)]
struct Overview {
    version: &'static str,
    compile: &'static str,
    config: Config,
    model: TopomModel,
    stats: Stats,
}

fn topom(sh: &Shared) -> TopomModel {
    sh.topom.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
}

fn overview(sh: &Shared) -> Overview {
    Overview {
        version: if sh.opts.fork {
            "testbed codis-double (pika fork of codis @218b68bb)"
        } else {
            "testbed codis-double (codis 3.2.2-12 @de1ad026)"
        },
        compile: "testbed",
        config: config(sh),
        model: topom(sh),
        stats: stats(sh),
    }
}

/// INFO of a backend as the dashboard shows it, with `master_*` mapped back to registered spellings.
pub(crate) async fn fetch_info(
    sh: &Shared,
    addr: &str,
    section: Option<&str>,
) -> Result<BTreeMap<String, String>, String> {
    let target = sh.dial_target(addr);
    let mut conn = Conn::dial(&target, sh.password(), sh.opts.dial_timeout).await?;
    info_of(sh, &mut conn, section).await
}

/// INFO over the stats loop's pooled connection to `addr`, as Codis's stats pool does: a connection that fails is
/// dropped (so a server that killed its clients shows one `EOF` error, then answers again on a new connection).
pub(crate) async fn fetch_info_pooled(
    sh: &Shared,
    addr: &str,
    section: Option<&str>,
) -> Result<BTreeMap<String, String>, String> {
    let target = sh.dial_target(addr);
    let pooled = {
        let mut pool = sh.stats_pool.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        pool.get_mut(&target).and_then(Vec::pop)
    };
    let mut conn = match pooled {
        // Go's client writes INFO on the dead connection and reads the server's FIN.
        Some(c) if c.peer_closed() => return Err("EOF".into()),
        Some(c) => c,
        None => Conn::dial(&target, sh.password(), sh.opts.dial_timeout).await?,
    };
    let info = info_of(sh, &mut conn, section).await?;
    sh.stats_pool.lock().unwrap_or_else(std::sync::PoisonError::into_inner).entry(target).or_default().push(conn);
    Ok(info)
}

pub(crate) async fn info_of(
    sh: &Shared,
    conn: &mut Conn,
    section: Option<&str>,
) -> Result<BTreeMap<String, String>, String> {
    let mut info = conn.info(section).await?;
    if let Some(real) = info.get("master_addr").cloned() {
        if let Some(name) = sh.registered_name(&real) {
            if let Some((host, port)) = name.rsplit_once(':') {
                info.insert("master_host".into(), host.trim_matches(['[', ']']).to_owned());
                info.insert("master_port".into(), port.to_owned());
            }
            info.insert("master_addr".into(), name);
        }
    }
    Ok(info)
}

async fn group_info(sh: &Shared, addr: &str) -> Result<Response<Body>, ApiError> {
    let info = fetch_info(sh, addr, None).await.map_err(ApiError::traced)?;
    Ok(wire::ok_json(&info))
}

async fn group_add(sh: &Shared, x: &str, gid: &str, addr: &str, dc: &str) -> Result<(), ApiError> {
    authed(sh, x)?;
    let gid = int(gid, "gid")?;
    if addr.is_empty() {
        return Err(ApiError::plain("missing addr"));
    }
    // Codis checks the server with SLOTSINFO. redis-server has no such command: for a stand-in the double computes
    // the same answer (keys per slot) itself, which also primes its slot index of that server.
    let real = sh.dial_target(addr);
    let mut conn = Conn::dial(&real, sh.password(), sh.opts.dial_timeout).await.map_err(ApiError::traced)?;
    if sh.opts.redis_stand_ins {
        slotkeys::slots_info(&mut conn, &real, sh.opts.max_slot_num, sh.password()).await.map_err(ApiError::traced)?;
    } else {
        conn.call(&["SLOTSINFO"]).await.map_err(ApiError::traced)?;
    }
    drop(conn);
    let _op = sh.op.lock().await;
    sh.state().topo.group_add_server(gid, dc, addr)
}

/// Per-proxy views of every slot of group `gid`, ready to push: what a resync of that group sends.
pub(crate) fn group_batches(topo: &Topo, gid: u32) -> Vec<(Proxy, Vec<Slot>)> {
    let mappings: Vec<SlotMapping> = topo.slots_of_group(gid).into_iter().map(|s| topo.slots[s]).collect();
    batches(topo, &mappings)
}

/// Per-proxy views of `mappings` in `topo`, ready to push.
pub(crate) fn batches(topo: &Topo, mappings: &[SlotMapping]) -> Vec<(Proxy, Vec<Slot>)> {
    topo.proxies.values().map(|p| (p.clone(), mappings.iter().map(|m| topo.slot_view(m, Some(p))).collect())).collect()
}

/// Pushes slots to every proxy in parallel; the first failing token (in token order) is the error, as
/// `proxy-[t] resync slots failed`. Nothing to push means no proxy is contacted.
pub(crate) async fn push(sh: &Shared, batches: Vec<(Proxy, Vec<Slot>)>) -> Result<(), ApiError> {
    if batches.iter().all(|(_, slots)| slots.is_empty()) {
        return Ok(());
    }
    let mut set = JoinSet::new();
    for (p, slots) in batches {
        let client = sh.proxy_client(&p);
        set.spawn(async move { (p.token, client.fill_slots(&slots).await) });
    }
    let mut failed: Vec<String> = Vec::new();
    while let Some(joined) = set.join_next().await {
        if let Ok((token, Err(_))) = joined {
            failed.push(token);
        }
    }
    failed.sort();
    match failed.first() {
        Some(t) => Err(ApiError::traced(format!("proxy-[{t}] resync slots failed"))),
        None => Ok(()),
    }
}

async fn group_resync(sh: &Shared, x: &str, gid: Option<&str>) -> Result<(), ApiError> {
    authed(sh, x)?;
    let gids: Vec<u32> = match gid {
        Some(g) => {
            let g = int(g, "gid")?;
            vec![sh.state().topo.group(g)?.id]
        }
        None => sh.state().topo.groups.keys().copied().collect(),
    };
    let _op = sh.op.lock().await;
    for gid in gids {
        let batch = group_batches(&sh.state().topo, gid);
        push(sh, batch).await?;
        if let Some(g) = sh.state().topo.groups.get_mut(&gid) {
            g.out_of_sync = false;
        }
    }
    Ok(())
}

/// Tells `addr` to replicate `master` (registered spelling) or to become a master (`None`), the way the dashboard
/// does: upstream in one `MULTI` with `CONFIG SET masterauth`, `CONFIG REWRITE` and `CLIENT KILL TYPE normal`; the
/// fork with separate commands and a forced `SLAVEOF h p -f` when `force` is set.
pub(crate) async fn set_master(sh: &Shared, addr: &str, master: Option<&str>, force: bool) -> Result<(), String> {
    let mut conn = Conn::dial(&sh.dial_target(addr), sh.password(), sh.opts.dial_timeout).await?;
    let real = master.map(|m| sh.told_target(m));
    let (host, port) = match &real {
        Some(r) => r
            .rsplit_once(':')
            .map(|(h, p)| (h.trim_matches(['[', ']']).to_owned(), p.to_owned()))
            .unwrap_or_else(|| (r.clone(), String::new())),
        None => ("NO".to_owned(), "ONE".to_owned()),
    };
    let auth = sh.auth();
    if sh.opts.fork {
        conn.call(&["CONFIG", "SET", "masterauth", auth]).await?;
        if force && real.is_some() {
            conn.call(&["SLAVEOF", &host, &port, "-f"]).await?;
        } else {
            conn.call(&["SLAVEOF", &host, &port]).await?;
        }
        conn.call(&["CONFIG", "REWRITE"]).await?;
        Ok(())
    } else {
        conn.transaction(&[
            &["CONFIG", "SET", "masterauth", auth],
            &["SLAVEOF", &host, &port],
            &["CONFIG", "REWRITE"],
            &["CLIENT", "KILL", "TYPE", "normal"],
        ])
        .await
    }
}

async fn group_promote(sh: &Shared, x: &str, gid: &str, addr: &str) -> Result<(), ApiError> {
    authed(sh, x)?;
    let gid = int(gid, "gid")?;
    let _op = sh.op.lock().await;
    let gid = {
        let mut st = sh.state();
        let executor = st.mem.slot_action.executor;
        let (gid, index) = st.topo.promote_check(gid, addr, executor)?;
        if let Some(g) = st.topo.groups.get_mut(&gid) {
            if g.promoting.state.is_nothing() {
                g.promoting =
                    Promoting { index: u32::try_from(index).unwrap_or(u32::MAX), state: PromotingState::Preparing };
            }
        }
        gid
    };
    let state_of =
        |sh: &Shared| sh.state().topo.groups.get(&gid).map_or(PromotingState::Nothing, |g| g.promoting.state);
    if state_of(sh) == PromotingState::Preparing {
        // Push the group's slots locked, computed on a copy: the store changes only after every proxy took it.
        let (locked, unlocked) = {
            let st = sh.state();
            let mut tmp = st.topo.clone();
            if let Some(g) = tmp.groups.get_mut(&gid) {
                g.promoting.state = PromotingState::Prepared;
            }
            let mappings: Vec<SlotMapping> = tmp.slots_of_group(gid).into_iter().map(|s| tmp.slots[s]).collect();
            (batches(&tmp, &mappings), batches(&st.topo, &mappings))
        };
        if let Err(e) = push(sh, locked).await {
            let _ = push(sh, unlocked).await;
            return Err(e);
        }
        if let Some(g) = sh.state().topo.groups.get_mut(&gid) {
            g.promoting.state = PromotingState::Prepared;
        }
    }
    if state_of(sh) == PromotingState::Prepared {
        let master = sh.state().topo.promote_reorder(gid);
        if let Some(master) = master {
            // Codis logs and ignores a failure here; the promote goes on.
            if let Err(e) = set_master(sh, &master, None, false).await {
                tracing::warn!("redis {master} set master to NO:ONE failed: {e}");
            }
        }
    }
    if state_of(sh) == PromotingState::Finished {
        let batch = group_batches(&sh.state().topo, gid);
        push(sh, batch).await?;
        if let Some(g) = sh.state().topo.groups.get_mut(&gid) {
            g.promoting = Promoting::default();
            g.out_of_sync = false;
        }
    }
    Ok(())
}

async fn slots_assign(sh: &Shared, x: &str, body: &[u8], offline: bool) -> Result<(), ApiError> {
    authed(sh, x)?;
    let items = AssignItem::parse_body(body);
    let _op = sh.op.lock().await;
    let batch = {
        let mut st = sh.state();
        let touched = if offline { st.topo.slots_assign_offline(&items)? } else { st.topo.slots_assign(&items)? };
        let mappings: Vec<SlotMapping> = touched.iter().map(|&s| st.topo.slots[s]).collect();
        batches(&st.topo, &mappings)
    };
    push(sh, batch).await
}

async fn rebalance(sh: &Shared, x: &str, confirm: &str) -> Result<Response<Body>, ApiError> {
    authed(sh, x)?;
    let confirm = int(confirm, "confirm")? != 0;
    let _op = sh.op.lock().await;
    let mut st = sh.state();
    let plan = st.topo.rebalance_plan()?;
    if confirm {
        st.topo.rebalance_apply(&plan);
    }
    // Go marshals map[int]int with the keys as strings in lexicographic order.
    let out: BTreeMap<String, u32> = plan.iter().map(|(s, g)| (s.to_string(), *g)).collect();
    Ok(wire::ok_json(&out))
}

/// Fillslots with the whole table, start, and (upstream) sentinels: Codis's `reinitProxy`.
pub(crate) async fn reinit(sh: &Shared, p: &Proxy) -> Result<(), ApiError> {
    let client = sh.proxy_client(p);
    let slots: Vec<Slot> = {
        let st = sh.state();
        st.topo.slots.iter().map(|m| st.topo.slot_view(m, Some(p))).collect()
    };
    client.fill_slots(&slots).await.map_err(|_| ApiError::traced(format!("proxy-[{}] fillslots failed", p.token)))?;
    client.start().await.map_err(|_| ApiError::traced(format!("proxy-[{}] start failed", p.token)))?;
    if !sh.opts.fork {
        client
            .set_sentinels()
            .await
            .map_err(|_| ApiError::traced(format!("proxy-[{}] set sentinels failed", p.token)))?;
    }
    Ok(())
}

/// `proxy/create` (`online == false`) and `proxy/online`.
async fn proxy_create(sh: &Shared, x: &str, addr: &str, online: bool) -> Result<(), ApiError> {
    authed(sh, x)?;
    let target = sh.dial_target(addr);
    let suffix = |e: String| {
        if online {
            String::new()
        } else {
            format!(", {e}")
        }
    };
    let mut p = ProxyClient::model(&sh.http, addr, &target)
        .await
        .map_err(|e| ApiError::traced(format!("proxy@{addr} fetch model failed{}", suffix(e))))?;
    let client = sh.proxy_client(&p);
    client.xping().await.map_err(|e| ApiError::traced(format!("proxy@{addr} check xauth failed{}", suffix(e))))?;
    let _op = sh.op.lock().await;
    {
        let mut st = sh.state();
        let max_id = st.topo.proxies.values().map(|p| p.id).max().unwrap_or(0);
        match st.topo.proxies.get(&p.token) {
            Some(_) if !online => {
                return Err(ApiError::traced(format!("proxy-[{}] already exists", p.token)));
            }
            Some(existing) => p.id = existing.id,
            None => p.id = max_id + 1,
        }
        st.topo.proxies.insert(p.token.clone(), p.clone());
    }
    reinit(sh, &p).await
}

async fn proxy_reinit(sh: &Shared, x: &str, token: &str) -> Result<(), ApiError> {
    authed(sh, x)?;
    let _op = sh.op.lock().await;
    let p = sh
        .state()
        .topo
        .proxies
        .get(token)
        .cloned()
        .ok_or_else(|| ApiError::traced(format!("proxy-[{token}] doesn't exist")))?;
    reinit(sh, &p).await
}

async fn proxy_remove(sh: &Shared, x: &str, token: &str, force: &str) -> Result<(), ApiError> {
    authed(sh, x)?;
    let force = int(force, "force")? != 0;
    let _op = sh.op.lock().await;
    let p = sh
        .state()
        .topo
        .proxies
        .get(token)
        .cloned()
        .ok_or_else(|| ApiError::traced(format!("proxy-[{token}] doesn't exist")))?;
    let client = sh.proxy_client(&p);
    if let Err(e) = client.shutdown().await {
        tracing::warn!("proxy-[{token}] shutdown failed, force remove = {force}: {e}");
        if !force {
            return Err(ApiError::traced(format!("proxy-[{token}] shutdown failed")));
        }
    }
    // The stats entry stays until the next refresh rebuilds the map, as in Codis.
    sh.state().topo.proxies.remove(token);
    Ok(())
}
