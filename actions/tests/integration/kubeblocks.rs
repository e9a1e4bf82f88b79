//! End to end through the KubeBlocks emulation (`testbed::kubeblocks`): the real charts, rendered by real Helm,
//! installed into an emulation of each KubeBlocks line, which runs the real `pika-action` for every action the chart
//! declares, over real etcd, real redis-servers (one per pod) and the Codis double.
//!
//! Every scenario runs on both lines and ends with the cluster's deletion. Each step must reach its end state within
//! the emulation's deadline (a hang detector: a step that would wait forever on real KubeBlocks fails with a
//! diagnosis). The end state is checked in Codis (one group per shard with exactly its pods, the master at index 0,
//! slots assigned and balanced, no slot action left, removed groups gone), in the redis-servers (every pod replicates
//! its group's master; every key acknowledged through codis-proxy, before or during the step, is still readable
//! through the proxy and from the master owning its slot) and in etcd (no lock left).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use testbed::kubeblocks::{KubeBlocks, Line, Options, ShardInfo};
use testbed::{Ledger, Workload, WorkloadOptions};

fn options(line: Line, name: &str) -> Options {
    let mut opts = Options::new(line, env!("CARGO_BIN_EXE_pika-action"));
    opts.cluster = format!("{name}{}", if line == Line::V1_0 { "a" } else { "b" });
    opts
}

fn install(line: Line, name: &str) -> KubeBlocks {
    KubeBlocks::install(options(line, name)).unwrap_or_else(|e| panic!("installing the addon chart: {e}"))
}

/// Runs a step and fails the test with the emulation's diagnosis when it does not reach its end state.
fn step(kb: &KubeBlocks, what: &str, result: Result<Duration, testbed::kubeblocks::Stuck>) -> Duration {
    match result {
        Ok(d) => {
            eprintln!("[{}] {what}: {:.1}s", kb.line().chart_value(), d.as_secs_f64());
            d
        }
        Err(stuck) => panic!("[KubeBlocks {}] {what}: {stuck}", kb.line().chart_value()),
    }
}

// ---- end-state checks ------------------------------------------------------------------------------------------

/// Asserts the end state of a Running cluster.
fn assert_converged(kb: &KubeBlocks, shards: usize, replicas: usize) {
    let line = kb.line().chart_value();
    let codis = kb.codis().expect("codis");
    let ok = codis.wait_for(Duration::from_secs(20), |s| s.with_action().is_empty()).is_some();
    if !ok {
        let snap = codis.snapshot();
        let left = snap.with_action();
        let first: Vec<String> = left
            .iter()
            .take(5)
            .map(|m| format!("slot {} group {} -> {} {:?}", m.id, m.group_id, m.action.target_id, m.action.state))
            .collect();
        panic!(
            "[{line}] {} slot actions left, e.g. {first:?}; groups {:?}",
            left.len(),
            snap.groups.iter().map(|g| g.id).collect::<Vec<_>>()
        );
    }
    let snap = codis.snapshot();
    let live: Vec<ShardInfo> = kb.shards().into_iter().filter(|s| !s.deleting).collect();
    assert_eq!(live.len(), shards, "[{line}] shards");
    let mut gids = BTreeSet::new();
    for shard in &live {
        assert_eq!(shard.pods.len(), replicas, "[{line}] pods of {}", shard.full);
        let first = &shard.pods[0].server;
        let (group, _) = snap.server(first).unwrap_or_else(|| panic!("[{line}] {} is in no Codis group", shard.full));
        let mut listed: Vec<&str> = group.servers.iter().map(|s| s.server.as_str()).collect();
        listed.sort_unstable();
        let mut expected: Vec<&str> = shard.pods.iter().map(|p| p.server.as_str()).collect();
        expected.sort_unstable();
        assert_eq!(listed, expected, "[{line}] group {} of {} lists exactly its pods", group.id, shard.full);
        assert!(gids.insert(group.id), "[{line}] group {} serves two shards", group.id);
        let master = group.master().expect("a master").to_owned();
        let master_pod = shard.pods.iter().find(|p| p.server == master).expect("master is a pod of the shard");
        let master_redis = kb.redis(&master_pod.name).expect("master volume");
        assert_eq!(master_redis.lock().unwrap().role(), "master", "[{line}] {} is a master", master_pod.name);
        for pod in shard.pods.iter().filter(|p| p.server != master) {
            let redis = kb.redis(&pod.name).expect("volume");
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let linked = redis.lock().unwrap().master();
                if linked.as_ref().is_some_and(|(h, p, up)| h == "127.0.0.1" && *p == master_pod.port && *up) {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "[{line}] {} does not replicate {}: {linked:?}",
                    pod.name,
                    master_pod.name
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    let all: BTreeSet<u32> = snap.groups.iter().map(|g| g.id).collect();
    assert_eq!(all, gids, "[{line}] no group but the shards' (removed groups gone)");
    let mut sizes: BTreeMap<u32, usize> = gids.iter().map(|g| (*g, 0)).collect();
    for slot in &snap.slots {
        *sizes
            .get_mut(&slot.group_id)
            .unwrap_or_else(|| panic!("[{line}] slot {} in group {}", slot.id, slot.group_id)) += 1;
    }
    let (max, min) = (sizes.values().max().copied().unwrap_or(0), sizes.values().min().copied().unwrap_or(0));
    assert!(max - min <= 1, "[{line}] slots balanced: {sizes:?}");
    assert_no_lock(kb);
}

fn etcd_keys(kb: &KubeBlocks) -> Vec<String> {
    let endpoint = kb.etcd_endpoint().expect("etcd");
    let (ns, name) = kb.view(|w| w.cluster.as_ref().map(|c| (c.namespace.clone(), c.name.clone()))).expect("cluster");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let etcd = crate::support::connect_etcd(&endpoint).await.expect("etcd");
        let prefix = pika_action::clients::etcd::cluster_prefix(&ns, &name);
        etcd.list(&prefix).await.expect("list").into_iter().map(|(k, _)| k).collect()
    })
}

fn assert_no_lock(kb: &KubeBlocks) {
    let locks: Vec<String> = etcd_keys(kb).into_iter().filter(|k| k.contains("/locks/")).collect();
    assert!(locks.is_empty(), "[{}] locks left in etcd: {locks:?}", kb.line().chart_value());
}

/// Writes `n` keys through a codis-proxy's data port, as clients do; every write must be acknowledged.
fn write_keys(kb: &KubeBlocks, prefix: &str, n: usize) -> Ledger {
    let proxy = kb.proxy_data_addrs().into_iter().next().expect("a codis-proxy");
    let ledger = Ledger::preload(&proxy, prefix, n).expect("write through the proxy");
    assert_eq!(ledger.acked.len(), n, "[{}] every write acknowledged: {:?}", kb.line().chart_value(), ledger.errors);
    ledger
}

/// Writes through every codis-proxy while `f` runs; returns `f`'s result and the acknowledged writes.
fn writing_during<T>(kb: &KubeBlocks, prefix: &str, f: impl FnOnce() -> T) -> (T, Ledger) {
    let opts = WorkloadOptions { prefix: prefix.to_owned(), ..WorkloadOptions::through(&kb.proxy_data_addrs()) };
    let workload = Workload::start(opts);
    let result = f();
    (result, workload.stop())
}

/// Every acknowledged key is still there: through each proxy and on the master owning its slot.
fn assert_keys_readable(kb: &KubeBlocks, ledger: &Ledger) {
    let line = kb.line().chart_value();
    let codis = kb.codis().expect("codis");
    let on_backends = ledger.verify_on_backends(&codis);
    if !on_backends.is_clean() {
        panic!(
            "[{line}] acknowledged keys missing on the masters owning their slots: {}\n{}",
            on_backends.summary(),
            action_log(kb)
        );
    }
    for proxy in kb.proxy_data_addrs() {
        let through = ledger.verify_through(&proxy);
        assert!(through.is_clean(), "[{line}] acknowledged keys missing through {proxy}: {}", through.summary());
    }
}

/// Deletes the cluster; it must go (a deletion that would hang fails here) and leave no lock.
fn delete(kb: &KubeBlocks) {
    assert_only_declared_actions(kb);
    let endpoint_ok = kb.etcd_endpoint().is_some();
    step(kb, "cluster deleted", kb.delete_cluster());
    if endpoint_ok {
        // The cluster object is gone; its etcd stand-in still runs and must hold no lock.
        let endpoint = kb.etcd_endpoint().expect("etcd");
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let keys: Vec<String> = rt.block_on(async {
            let etcd = crate::support::connect_etcd(&endpoint).await.expect("etcd");
            etcd.list("/").await.map(|v| v.into_iter().map(|(k, _)| k).collect()).unwrap_or_default()
        });
        let locks: Vec<&String> = keys.iter().filter(|k| k.contains("/locks/")).collect();
        assert!(locks.is_empty(), "[{}] locks left after deletion: {locks:?}", kb.line().chart_value());
    }
}

/// Every action run, one line each with its output: for failure messages.
fn action_log(kb: &KubeBlocks) -> String {
    let mut runs = kb.actions();
    runs.sort_by_key(|a| a.at);
    runs.iter()
        .map(|a| {
            let out = format!("{} {}", a.stdout.trim(), a.stderr.trim()).replace('\n', " | ");
            let out: String = out.chars().take(400).collect();
            format!("  {:>7.1?} {} on {} -> {:?}: {out}", a.at, a.action, a.pod, a.code)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every action the emulation ran is one the chart declares for this line (container start commands aside).
fn assert_only_declared_actions(kb: &KubeBlocks) {
    let addon = kb.addon();
    let mut declared: BTreeSet<String> = BTreeSet::new();
    for def in addon.comp_defs.values() {
        declared.extend(def.actions().all().into_iter().map(|(name, _)| name.to_owned()));
    }
    if kb.line() == Line::V1_1 {
        for def in addon.sharding_defs.values() {
            let a = def.actions();
            for (name, action) in [
                ("udf-shardingPostProvision", &a.post_provision),
                ("udf-shardingPreTerminate", &a.pre_terminate),
                ("udf-shardingShardAdd", &a.shard_add),
                ("udf-shardingShardRemove", &a.shard_remove),
            ] {
                if action.is_some() {
                    declared.insert(name.to_owned());
                }
            }
        }
    }
    for a in kb.actions() {
        if a.action.starts_with("container:") {
            continue;
        }
        assert!(
            declared.contains(&a.action),
            "[{}] {} ran but the chart does not declare it: {declared:?}",
            kb.line().chart_value(),
            a.action
        );
    }
}

/// The runs of `action` (KubeBlocks' name) so far.
fn runs(kb: &KubeBlocks, action: &str) -> Vec<testbed::kubeblocks::world::ActionRecord> {
    kb.actions().into_iter().filter(|a| a.action == action).collect()
}

/// Successful Codis promotes so far.
fn promotes(kb: &KubeBlocks) -> usize {
    let codis = kb.codis().expect("codis");
    codis
        .requests()
        .iter()
        .filter(|r| r.method == "PUT" && r.path.starts_with("/api/topom/group/promote/") && r.status == 200)
        .count()
}

// ---- scenarios -----------------------------------------------------------------------------------------------------

fn create_and_delete(line: Line, shards: u32) {
    let kb = install(line, &format!("c{shards}"));
    step(&kb, &format!("create {shards} shard(s)"), kb.create_cluster(shards, 2));
    assert_converged(&kb, shards as usize, 2);
    assert!(runs(&kb, "memberJoin").is_empty(), "memberJoin never runs for the initial replicas");
    delete(&kb);
}

fn scale_out(line: Line) {
    let kb = install(line, "so");
    step(&kb, "create 2 shards", kb.create_cluster(2, 2));
    assert_converged(&kb, 2, 2);
    let written = write_keys(&kb, "before", 2000);
    let old: BTreeSet<String> = kb.shards().into_iter().map(|s| s.full).collect();
    let (scaled, during) = writing_during(&kb, "during", || kb.scale_shards(3));
    step(&kb, "scale out to 3 shards", scaled);
    assert_converged(&kb, 3, 2);
    let new: Vec<String> = kb.shards().into_iter().map(|s| s.full).filter(|s| !old.contains(s)).collect();
    assert_eq!(new.len(), 1, "one new shard");
    match line {
        Line::V1_0 => {
            let ok = runs(&kb, "postProvision").iter().any(|a| a.component == new[0] && a.result.is_ok());
            assert!(ok, "[1.0] the new shard's component postProvision registered it");
        }
        Line::V1_1 => {
            let adds = runs(&kb, "udf-shardingShardAdd");
            assert!(
                adds.iter().any(|a| a.result.is_ok() && a.env.get("KB_ADD_SHARD_NAME") == Some(&new[0])),
                "[1.1] shardAdd ran for {} with KB_ADD_SHARD_NAME: {adds:?}",
                new[0]
            );
        }
    }
    assert_keys_readable(&kb, &written);
    assert_keys_readable(&kb, &during);
    eprintln!(
        "[{}] scale-out: {} keys before, {} acknowledged during",
        line.chart_value(),
        written.acked.len(),
        during.acked.len()
    );
    delete(&kb);
}

fn scale_in(line: Line, from: u32, to: u32) {
    let kb = install(line, &format!("si{from}{to}"));
    step(&kb, &format!("create {from} shards"), kb.create_cluster(from, 2));
    assert_converged(&kb, from as usize, 2);
    let written = write_keys(&kb, "before", 2000);
    let groups_before = kb.groups_by_shard();
    let (scaled, during) = writing_during(&kb, "during", || kb.scale_shards(to));
    step(&kb, &format!("scale in to {to} shard(s)"), scaled);
    assert_converged(&kb, to as usize, 2);
    let remaining: BTreeSet<String> = kb.shards().into_iter().map(|s| s.short).collect();
    let removed: Vec<&String> = groups_before.keys().filter(|s| !remaining.contains(*s)).collect();
    assert_eq!(removed.len(), (from - to) as usize, "removed shards");
    let codis = kb.codis().expect("codis");
    for short in &removed {
        assert!(codis.snapshot().group(groups_before[*short]).is_none(), "group of {short} is gone");
        let drained = match line {
            Line::V1_0 => runs(&kb, "preTerminate").into_iter().any(|a| {
                a.component.ends_with(short.as_str())
                    && a.result.is_ok()
                    && a.env.get("KB_CLUSTER_COMPONENT_IS_SCALING_IN").map(String::as_str) == Some("true")
            }),
            Line::V1_1 => runs(&kb, "udf-shardingShardRemove").into_iter().any(|a| {
                a.result.is_ok() && a.env.get("KB_REMOVE_SHARD_NAME").is_some_and(|n| n.ends_with(short.as_str()))
            }),
        };
        assert!(drained, "[{}] {short} was drained by its scale-in action", line.chart_value());
    }
    assert_keys_readable(&kb, &written);
    assert_keys_readable(&kb, &during);
    eprintln!(
        "[{}] scale-in {from}->{to}: {} keys before, {} acknowledged during",
        line.chart_value(),
        written.acked.len(),
        during.acked.len()
    );
    delete(&kb);
}

fn replicas_join_and_leave(line: Line) {
    let kb = install(line, "rj");
    step(&kb, "create 2 shards of 2", kb.create_cluster(2, 2));
    assert_converged(&kb, 2, 2);
    step(&kb, "scale out to 3 replicas", kb.scale_replicas(3));
    assert_converged(&kb, 2, 3);
    let joins: Vec<_> = runs(&kb, "memberJoin").into_iter().filter(|a| a.result.is_ok()).collect();
    let joined: BTreeSet<&str> = joins.iter().map(|a| a.pod.as_str()).collect();
    let expected: BTreeSet<String> = kb.shards().iter().map(|s| s.pods[2].name.clone()).collect();
    assert_eq!(
        joined,
        expected.iter().map(String::as_str).collect(),
        "memberJoin ran (once done) for each new pod only"
    );
    step(&kb, "scale in to 1 replica", kb.scale_replicas(1));
    assert_converged(&kb, 2, 1);
    let left: BTreeSet<String> =
        runs(&kb, "memberLeave").into_iter().filter(|a| a.result.is_ok()).map(|a| a.pod).collect();
    assert_eq!(left.len(), 4, "memberLeave for each removed pod: {left:?}");
    delete(&kb);
}

fn rolling_restart(line: Line) {
    let kb = install(line, "rr");
    step(&kb, "create 2 shards of 3", kb.create_cluster(2, 3));
    assert_converged(&kb, 2, 3);
    let written = write_keys(&kb, "before", 1000);
    let promotes_before = promotes(&kb);
    let (restarted, during) = writing_during(&kb, "during", || kb.rolling_restart());
    step(&kb, "rolling restart", restarted);
    assert_converged(&kb, 2, 3);
    let moved = promotes(&kb) - promotes_before;
    assert!(moved <= 2, "[{}] at most one master transfer per shard, saw {moved}", line.chart_value());
    let switchovers = runs(&kb, "switchover").len();
    assert_eq!(switchovers, 6, "switchover before each of the 6 pod recreations");
    assert_keys_readable(&kb, &written);
    assert_keys_readable(&kb, &during);
    delete(&kb);
}

fn switchover(line: Line) {
    let kb = install(line, "sw");
    step(&kb, "create 2 shards of 2", kb.create_cluster(2, 2));
    assert_converged(&kb, 2, 2);
    let shard = kb.shards().into_iter().next().expect("a shard");
    let codis = kb.codis().expect("codis");
    let gid = kb.groups_by_shard()[&shard.short];
    let master = codis.snapshot().master(gid).expect("master").to_owned();
    let from = shard.pods.iter().find(|p| p.server == master).expect("master pod").clone();
    let to = shard.pods.iter().find(|p| p.server != master).expect("a replica").clone();
    let written = write_keys(&kb, "before", 1000);
    let (switched, during) = writing_during(&kb, "during", || kb.switchover(&shard.full, &from.name, &to.name));
    step(&kb, "switchover OpsRequest", switched);
    assert_eq!(codis.snapshot().master(gid), Some(to.server.as_str()), "the candidate is Codis' master");
    assert_converged(&kb, 2, 2);
    assert_keys_readable(&kb, &written);
    assert_keys_readable(&kb, &during);
    delete(&kb);
}

/// A chart rendered for one line installed on the other must be refused loudly: an action fails with exit 2 naming
/// KUBEBLOCKS_LINE, and nothing is registered in Codis.
fn wrong_line(line: Line, chart_line: Line) {
    let mut opts = options(line, "wl");
    opts.chart_line = chart_line;
    opts.deadline = Duration::from_secs(60);
    let kb = KubeBlocks::install(opts).expect("install");
    let refused = |w: &testbed::kubeblocks::world::World| {
        w.actions.iter().any(|a| a.code == Some(2) && a.stderr.contains("KUBEBLOCKS_LINE"))
    };
    // Creation must not complete: it is started and watched for the refusal.
    let started = kb.request_cluster(2, 2);
    assert!(started.is_ok(), "{started:?}");
    let seen = kb.wait_for("a refusal naming KUBEBLOCKS_LINE", Duration::from_secs(60), refused);
    let running = kb.view(|w| w.cluster.as_ref().is_some_and(|c| c.phase == "Running"));
    assert!(
        seen.is_ok(),
        "[{}] the {}-line chart was not refused loudly (cluster Running: {running}): {}\n{}",
        line.chart_value(),
        chart_line.chart_value(),
        seen.as_ref().err().map_or(String::new(), ToString::to_string),
        action_log(&kb)
    );
    if let Some(codis) = kb.codis() {
        assert!(codis.snapshot().groups.is_empty(), "nothing registered in Codis: {:?}", codis.snapshot().groups);
    }
}

/// A shard removed while its registration is still under way (its slot moves out of budget, exit 75): on 1.1 its
/// shardAdd never succeeded, so KubeBlocks deletes it without shardRemove; on 1.0 its preTerminate runs while its
/// postProvision never finished. Either way its slots must come back before its pods go.
fn removed_while_registering(line: Line) {
    let mut opts = options(line, "rw");
    opts.var_overrides.insert("ACTION_BUDGET_SECONDS".into(), "2".into());
    // About 140 ms per slot: a third of the slots take far longer than one 2 s budget.
    opts.migration_ticks = Some(10);
    let kb = KubeBlocks::install(opts).expect("install");
    step(&kb, "create 2 shards", kb.create_cluster(2, 2));
    assert_converged(&kb, 2, 2);
    let written = write_keys(&kb, "before", 2000);
    // The new shard sorts last, so the scale-in removes it.
    kb.choose_next_shard_suffixes(&["zzz"]);
    kb.request_shards(3);
    let registering = |w: &testbed::kubeblocks::world::World| {
        w.actions.iter().any(|a| {
            a.component.ends_with("-zzz")
                && a.code == Some(75)
                && matches!(a.action.as_str(), "udf-shardingShardAdd" | "postProvision")
        })
    };
    step(
        &kb,
        "the new shard's registration out of budget mid-way",
        kb.wait_for("registration under way", Duration::from_secs(120), registering),
    );
    let moved_onto_it = {
        let codis = kb.codis().expect("codis");
        let snap = codis.snapshot();
        let zzz = kb.shards().into_iter().find(|s| s.short.ends_with("-zzz")).expect("the new shard");
        snap.server(&zzz.pods[0].server)
            .map_or(0, |(g, _)| snap.slots.iter().filter(|s| s.group_id == g.id || s.action.target_id == g.id).count())
    };
    eprintln!("[{}] slots on or moving to the new shard when the scale-in came: {moved_onto_it}", line.chart_value());
    step(&kb, "scale back in to 2 shards", kb.scale_shards(2));
    assert_converged(&kb, 2, 2);
    assert!(kb.shards().iter().all(|s| !s.short.ends_with("-zzz")), "the new shard went");
    if line == Line::V1_1 {
        let removes: Vec<_> = runs(&kb, "udf-shardingShardRemove");
        assert!(
            removes.iter().all(|a| !a.env.get("KB_REMOVE_SHARD_NAME").is_some_and(|n| n.ends_with("-zzz"))),
            "KubeBlocks 1.1 runs no shardRemove for a shard whose shardAdd never succeeded: {removes:?}"
        );
    }
    assert_keys_readable(&kb, &written);
    delete(&kb);
}

/// A rolling restart whose master switchover fails: KubeBlocks ignores it and recreates the master anyway; the pod's
/// start (rejoin) must then keep the shard to one master with its data.
fn rolling_restart_with_failed_switchover(line: Line) {
    let kb = install(line, "rf");
    step(&kb, "create 2 shards of 3", kb.create_cluster(2, 3));
    assert_converged(&kb, 2, 3);
    let written = write_keys(&kb, "before", 1000);
    let codis = kb.codis().expect("codis");
    codis.fail_next_on("/api/topom/group/promote", 1, testbed::Fault::Status500);
    step(&kb, "rolling restart", kb.rolling_restart());
    assert_converged(&kb, 2, 3);
    let failed: Vec<_> = runs(&kb, "switchover").into_iter().filter(|a| a.result.is_err()).collect();
    assert_eq!(
        failed.len(),
        1,
        "the master's switchover failed once (the fault was hit): {:?}",
        runs(&kb, "switchover")
    );
    assert_keys_readable(&kb, &written);
    delete(&kb);
}

#[test]
fn a_shard_removed_while_registering_on_1_0() {
    removed_while_registering(Line::V1_0);
}

#[test]
fn a_shard_removed_before_its_shard_add_succeeded_on_1_1() {
    removed_while_registering(Line::V1_1);
}

#[test]
fn rolling_restart_with_a_failed_switchover_on_1_0() {
    rolling_restart_with_failed_switchover(Line::V1_0);
}

#[test]
fn rolling_restart_with_a_failed_switchover_on_1_1() {
    rolling_restart_with_failed_switchover(Line::V1_1);
}

#[test]
fn create_with_one_shard_on_1_0() {
    create_and_delete(Line::V1_0, 1);
}

#[test]
fn create_with_one_shard_on_1_1() {
    create_and_delete(Line::V1_1, 1);
}

#[test]
fn create_with_three_shards_on_1_0() {
    create_and_delete(Line::V1_0, 3);
}

#[test]
fn create_with_three_shards_on_1_1() {
    create_and_delete(Line::V1_1, 3);
}

#[test]
fn scale_out_on_1_0() {
    scale_out(Line::V1_0);
}

#[test]
fn scale_out_on_1_1() {
    scale_out(Line::V1_1);
}

#[test]
fn scale_in_one_shard_on_1_0() {
    scale_in(Line::V1_0, 3, 2);
}

#[test]
fn scale_in_one_shard_on_1_1() {
    scale_in(Line::V1_1, 3, 2);
}

#[test]
fn scale_in_several_shards_on_1_0() {
    scale_in(Line::V1_0, 4, 2);
}

#[test]
fn scale_in_several_shards_on_1_1() {
    scale_in(Line::V1_1, 4, 2);
}

#[test]
fn replicas_join_and_leave_on_1_0() {
    replicas_join_and_leave(Line::V1_0);
}

#[test]
fn replicas_join_and_leave_on_1_1() {
    replicas_join_and_leave(Line::V1_1);
}

#[test]
fn rolling_restart_on_1_0() {
    rolling_restart(Line::V1_0);
}

#[test]
fn rolling_restart_on_1_1() {
    rolling_restart(Line::V1_1);
}

#[test]
fn switchover_ops_request_on_1_0() {
    switchover(Line::V1_0);
}

#[test]
fn switchover_ops_request_on_1_1() {
    switchover(Line::V1_1);
}

#[test]
fn a_1_1_chart_on_1_0_is_refused_loudly() {
    wrong_line(Line::V1_0, Line::V1_1);
}

#[test]
fn a_1_0_chart_on_1_1_is_refused_loudly() {
    wrong_line(Line::V1_1, Line::V1_0);
}
