//! Scale-in without losing a key. `shard-remove` (1.1+) and `pre-terminate` with
//! KB_CLUSTER_COMPONENT_IS_SCALING_IN=true (1.0.x) drain the leaving shard's slots onto the remaining shards, balanced
//! with the fewest moves, and only then delete its servers (replicas first, master last) and its group; what would make
//! the drain hang or lose data is refused up front, changing nothing. Checked against the Codis double's own model, the
//! request log and etcd, never against the action's bookkeeping.

use crate::support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use support::{describe, eventually, minimum_moves, moved, run, run_to_completion, Bed};
use testbed::codis::SlotState;
use testbed::DoubleOptions;

/// A bed of `shards` × `pods` whose slots are assigned and balanced (no migration: assignment of a fresh table).
fn provisioned(shards: usize, pods: usize, opts: DoubleOptions) -> Bed {
    let bed = Bed::builder().shards(shards).pods(pods).bed(opts);
    run_to_completion("post-provision", &bed.env(0));
    bed
}

/// shard-remove of shard `index` as KubeBlocks 1.1 runs it: in the removed shard's kbagent, with
/// ALL_SHARDS_POD_FQDNS listing `listed`.
fn remove_env(bed: &Bed, index: usize, listed: &[usize]) -> BTreeMap<String, String> {
    let mut env = bed.env(index);
    env.insert("KB_REMOVE_SHARD_NAME".into(), bed.cluster.shards[index].full.clone());
    env.insert("ALL_SHARDS_POD_FQDNS".into(), bed.cluster.all_shards_of(listed));
    env
}

fn gids(bed: &Bed, shards: &[usize]) -> Vec<u32> {
    shards.iter().map(|&i| bed.gid(i).expect("registered")).collect()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// What a finished removal of shard `index` (which had group `gid`) onto `remaining` must leave: the group gone, none
/// of its pods in any group, no slot in it or migrating to it, every slot owned by a remaining group, balanced, and
/// its etcd records deleted.
fn assert_removed(bed: &Bed, index: usize, gid: u32, remaining: &[u32]) {
    let snap = bed.codis.snapshot();
    assert!(snap.group(gid).is_none(), "group {gid} is still there: {:?}", snap.group(gid));
    for pod in &bed.cluster.shards[index].pods {
        assert!(snap.server(&pod.server()).is_none(), "{} is still registered", pod.name);
    }
    bed.assert_balanced(remaining);
    let stale: Vec<String> = crate::attack::etcd_entries(bed)
        .into_keys()
        .filter(|k| k.ends_with(&format!("/groups/{gid}")) || k.contains("/drains/"))
        .collect();
    assert!(stale.is_empty(), "etcd records left behind: {stale:?}");
}

/// Watches the double while `f` runs and fails if the leaving group ever lost a server while a slot was still
/// owned by it or migrating to it: that is the moment a key could be lost.
fn watching_for_early_deletes<T>(bed: &Bed, gid: u32, f: impl FnOnce() -> T) -> T {
    let servers = bed.codis.snapshot().group(gid).map_or(0, |g| g.servers.len());
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let watcher = scope.spawn(|| {
            let mut violations = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let snap = bed.codis.snapshot();
                let in_use = snap.slots.iter().filter(|s| s.group_id == gid || s.action.target_id == gid).count();
                let listed = snap.group(gid).map_or(0, |g| g.servers.len());
                if in_use > 0 && listed < servers {
                    violations.push(format!("{listed}/{servers} servers left while {in_use} slot(s) still use it"));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            violations
        });
        let result = f();
        stop.store(true, Ordering::SeqCst);
        let violations = watcher.join().expect("watcher");
        assert!(violations.is_empty(), "servers deleted before the drain finished: {violations:?}");
        result
    })
}

/// The `group/del` requests for `gid`, in order, as the servers they named.
fn deleted_servers(bed: &Bed, gid: u32) -> Vec<String> {
    let prefix = format!("/api/topom/group/del/{{xauth}}/{gid}/");
    bed.codis
        .requests()
        .into_iter()
        .filter(|r| r.status == 200)
        .filter_map(|r| r.path.strip_prefix(&prefix).map(str::to_owned))
        .collect()
}

#[test]
fn shard_remove_drains_one_of_four_shards_with_the_fewest_moves_then_deletes_replicas_master_and_group() {
    let bed = provisioned(4, 2, DoubleOptions::default());
    let leaving = bed.gid(3).unwrap();
    let remaining = gids(&bed, &[0, 1, 2]);
    let before = bed.owners();
    bed.codis.clear_requests();

    let outputs = watching_for_early_deletes(&bed, leaving, || {
        run_to_completion("shard-remove", &remove_env(&bed, 3, &[0, 1, 2, 3]))
    });
    let out = outputs.last().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("drained and removed"), "{}", describe(out));

    assert_removed(&bed, 3, leaving, &remaining);
    let after = bed.owners();
    assert_eq!(moved(&before, &after), 256, "exactly the leaving group's slots moved");
    assert_eq!(moved(&before, &after), minimum_moves(&before, &remaining));
    // Replicas first, the master last, then the group; all after the last migration was created.
    let master = bed.cluster.shards[3].pod(0).server();
    assert_eq!(deleted_servers(&bed, leaving), [bed.cluster.shards[3].pod(1).server(), master]);
    let log: Vec<String> = bed.mutations();
    let last_create = log.iter().rposition(|p| p.contains("/slots/action/create")).expect("migrations created");
    let first_del = log.iter().position(|p| p.contains("/group/del/")).expect("servers deleted");
    assert!(first_del > last_create);
    assert!(log.last().unwrap().ends_with(&format!("/group/remove/{{xauth}}/{leaving}")), "{log:?}");
    assert!(!log.iter().any(|p| p.contains("/slots/rebalance/")), "codis' rebalance refills a group: never used");

    // Done is done: a rerun finds nothing to do and changes nothing.
    bed.codis.clear_requests();
    let out = run("shard-remove", &remove_env(&bed, 3, &[0, 1, 2, 3]));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing to drain"), "{}", describe(&out));
    assert!(bed.mutations().is_empty(), "{:?}", bed.mutations());
}

#[test]
fn shard_remove_drains_as_well_when_all_shards_no_longer_lists_the_removed_shard() {
    let bed = provisioned(3, 1, DoubleOptions::default());
    let leaving = bed.gid(2).unwrap();
    let remaining = gids(&bed, &[0, 1]);
    let before = bed.owners();
    run_to_completion("shard-remove", &remove_env(&bed, 2, &[0, 1]));
    assert_removed(&bed, 2, leaving, &remaining);
    assert_eq!(moved(&before, &bed.owners()), minimum_moves(&before, &remaining));
}

#[test]
fn pre_terminate_drains_the_shard_when_kubeblocks_1_0_scales_in() {
    let bed = provisioned(3, 2, DoubleOptions::default());
    let leaving = bed.gid(1).unwrap();
    let remaining = gids(&bed, &[0, 2]);
    let before = bed.owners();
    let mut env = bed.env_v1_0(1, &[1]);
    env.insert("KB_CLUSTER_COMPONENT_IS_SCALING_IN".into(), "true".into());
    watching_for_early_deletes(&bed, leaving, || run_to_completion("pre-terminate", &env));
    assert_removed(&bed, 1, leaving, &remaining);
    assert_eq!(moved(&before, &bed.owners()), minimum_moves(&before, &remaining));
}

#[test]
fn pre_terminate_on_cluster_deletion_does_nothing_to_codis_and_returns_at_once() {
    let bed = provisioned(2, 1, DoubleOptions::default());
    let snapshot = bed.codis.snapshot();
    // Even a dashboard that is gone does not matter: nothing is asked of it.
    bed.codis.pause();
    bed.codis.clear_requests();
    let mut flagged = bed.env_v1_0(1, &[0, 1]);
    flagged.insert("KB_CLUSTER_COMPONENT_IS_SCALING_IN".into(), "true".into());
    let mut unflagged = bed.env_v1_0(1, &[0, 1]);
    unflagged.remove("ETCD_ENDPOINTS");
    for env in [unflagged, flagged] {
        // The dashboard refuses connections: a run that asked it anything could not exit 0.
        let out = run("pre-terminate", &env);
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        assert!(String::from_utf8_lossy(&out.stdout).contains("cluster deletion"), "{}", describe(&out));
    }
    bed.codis.resume().unwrap();
    assert!(bed.codis.requests().is_empty(), "{:?}", bed.codis.requests());
    assert_eq!(bed.codis.snapshot().groups, snapshot.groups);
}

#[test]
fn a_drain_out_of_budget_exits_75_with_its_progress_and_the_next_runs_resume_it_without_replanning() {
    let bed = provisioned(3, 1, DoubleOptions::default());
    let leaving = bed.gid(2).unwrap();
    let remaining = gids(&bed, &[0, 1]);
    let before = bed.owners();
    let holding = before.iter().filter(|g| **g == leaving).count().to_string();
    // 341 slots leave, each over 20 ticks: far longer than two budgets of 2 s.
    bed.codis.set_default_migration_ticks(20);
    let mut env = remove_env(&bed, 2, &[0, 1, 2]);
    env.insert("ACTION_BUDGET_SECONDS".into(), "2".into());
    let mut seen = Vec::new();
    for _ in 0..2 {
        let out = run("shard-remove", &env);
        assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
        let text = stderr(&out);
        let progress = text.split("drain in progress: ").nth(1).unwrap_or_else(|| panic!("{text}"));
        let (moved_so_far, total) = progress.split_once(" slots moved").unwrap().0.split_once('/').unwrap();
        seen.push((moved_so_far.parse::<usize>().unwrap(), total.to_owned()));
    }
    assert_eq!(seen[0].1, holding);
    assert_eq!(seen[1].1, holding, "the total is the whole drain's, not the second run's");
    assert!(seen[1].0 > seen[0].0, "{seen:?}");
    let created = bed.mutations().iter().filter(|p| p.contains("/slots/action/create")).count();

    bed.codis.set_default_migration_ticks(1);
    env.insert("ACTION_BUDGET_SECONDS".into(), "40".into());
    run_to_completion("shard-remove", &env);
    assert_eq!(bed.mutations().iter().filter(|p| p.contains("/slots/action/create")).count(), created, "re-planned");
    assert_removed(&bed, 2, leaving, &remaining);
    assert_eq!(moved(&before, &bed.owners()), minimum_moves(&before, &remaining));
}

#[test]
fn a_drain_while_slots_are_migrating_cancels_pending_moves_into_the_leaving_group_and_waits_for_running_ones() {
    let bed = provisioned(4, 1, DoubleOptions::default());
    let (g0, g1, g2, leaving) = (bed.gid(0).unwrap(), bed.gid(1).unwrap(), bed.gid(2).unwrap(), bed.gid(3).unwrap());
    let snap = bed.codis.snapshot();
    let of = |g: u32| snap.slots.iter().filter(|s| s.group_id == g).map(|s| s.id).collect::<Vec<_>>();
    let (a, b, c) = (of(g0)[0], of(g0)[1], of(g1)[0]);
    // a: g0 → leaving, held migrating for a while; b: g0 → leaving, pending behind it; c: g1 → g2, running beside.
    for slot in [a, c] {
        bed.codis.set_migration_ticks(slot, 150);
    }
    let x = bed.codis.xauth().to_owned();
    // Created while disabled, so that one executor round takes a and c together (Codis runs a round to the end).
    let put = |path: String| {
        let reply = bed.codis.call("PUT", &path);
        assert!(reply.is_ok(), "{path}: {reply:?}");
    };
    put(format!("/api/topom/slots/action/disabled/{x}/1"));
    for (slot, to) in [(a, leaving), (c, g2), (b, leaving)] {
        put(format!("/api/topom/slots/action/create/{x}/{slot}/{to}"));
    }
    put(format!("/api/topom/slots/action/disabled/{x}/0"));
    let running = |s: &testbed::Snapshot| {
        s.slots[a].action.state == SlotState::Migrating && s.slots[c].action.state == SlotState::Migrating
    };
    assert!(bed.codis.wait_for(Duration::from_secs(5), running).is_some());
    assert_eq!(bed.codis.snapshot().slots[b].action.state, SlotState::Pending);
    bed.codis.clear_requests();

    run_to_completion("shard-remove", &remove_env(&bed, 3, &[0, 1, 2, 3]));
    let log = bed.mutations();
    assert!(log.contains(&format!("/api/topom/slots/action/remove/{{xauth}}/{b}")), "{log:?}");
    assert!(!log.contains(&format!("/api/topom/slots/action/remove/{{xauth}}/{a}")), "{log:?}");
    assert_removed(&bed, 3, leaving, &[g0, g1, g2]);
}

#[test]
fn a_failed_migration_is_reported_with_codis_error_text_and_a_rerun_after_the_fix_finishes() {
    let bed = provisioned(3, 1, DoubleOptions::default());
    let leaving = bed.gid(2).unwrap();
    let remaining = gids(&bed, &[0, 1]);
    let snap = bed.codis.snapshot();
    let slots: Vec<usize> = snap.slots.iter().filter(|s| s.group_id == leaving).map(|s| s.id).collect();
    for &slot in &slots {
        bed.codis.set_slot_error(slot, "ERR slotsmgrt target refused the batch (injected)");
    }
    let mut env = remove_env(&bed, 2, &[0, 1, 2]);
    env.insert("ACTION_BUDGET_SECONDS".into(), "4".into());
    let out = run("shard-remove", &env);
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(text.contains(&format!("drain in progress: 0/{} slots moved", slots.len())), "{text}");
    assert!(text.contains("codis keeps failing a migration"), "{text}");
    assert!(
        text.contains("[ERROR] Slot[") && text.contains("ERR slotsmgrt target refused the batch (injected)"),
        "{text}"
    );
    // Nothing was deleted meanwhile.
    assert_eq!(bed.codis.snapshot().group(leaving).map(|g| g.servers.len()), Some(1));

    for &slot in &slots {
        bed.codis.clear_slot_error(slot);
    }
    env.insert("ACTION_BUDGET_SECONDS".into(), "40".into());
    run_to_completion("shard-remove", &env);
    assert_removed(&bed, 2, leaving, &remaining);
}

/// Runs a removal that must be refused: exit 1 naming `why`, and not one change to Codis.
fn assert_refused(bed: &Bed, env: &BTreeMap<String, String>, why: &[&str]) {
    bed.codis.clear_requests();
    let before = bed.codis.snapshot();
    let out = run("shard-remove", env);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let text = stderr(&out);
    for w in why {
        assert!(text.contains(w), "{w:?} not in {text}");
    }
    assert!(bed.mutations().is_empty(), "a refusal changed codis: {:?}", bed.mutations());
    let after = bed.codis.snapshot();
    assert_eq!((after.groups, after.slots), (before.groups, before.slots));
}

#[test]
fn removing_the_last_shard_is_refused() {
    let bed = provisioned(1, 2, DoubleOptions::default());
    assert_refused(&bed, &remove_env(&bed, 0, &[0]), &["last shard", &bed.cluster.shards[0].full]);
}

#[test]
fn an_unreachable_proxy_is_refused_naming_it_and_once_it_is_removed_the_drain_goes_ahead() {
    let bed = provisioned(2, 1, DoubleOptions::default());
    let proxy = crate::attack::dead_proxy(&bed);
    let (x, token) = (bed.codis.xauth().to_owned(), proxy.token());
    let env = remove_env(&bed, 1, &[0, 1]);
    assert_refused(&bed, &env, &["proxy", &proxy.admin_addr(), "would hang"]);

    assert!(bed.codis.call("PUT", &format!("/api/topom/proxy/remove/{x}/{token}/1")).is_ok());
    let leaving = bed.gid(1).unwrap();
    run_to_completion("shard-remove", &env);
    assert_removed(&bed, 1, leaving, &gids(&bed, &[0]));
}

#[test]
fn disabled_slot_actions_are_refused() {
    let bed = provisioned(2, 1, DoubleOptions::default());
    assert!(bed.codis.call("PUT", &format!("/api/topom/slots/action/disabled/{}/1", bed.codis.xauth())).is_ok());
    assert_refused(&bed, &remove_env(&bed, 1, &[0, 1]), &["slot actions are disabled"]);
}

#[test]
fn a_promotion_in_progress_is_refused() {
    let bed = provisioned(2, 2, DoubleOptions::default());
    let gid = bed.gid(0).unwrap();
    bed.codis.promote_in_progress(gid, &bed.cluster.shards[0].pod(1).server()).unwrap();
    assert_refused(&bed, &remove_env(&bed, 1, &[0, 1]), &[&format!("group {gid} is promoting")]);
}

#[test]
fn under_the_pika_fork_a_master_failover_during_the_drain_is_followed_when_deleting_servers() {
    let opts = DoubleOptions { fork: true, dead_checks: 3, ..DoubleOptions::default() };
    let mut bed = provisioned(2, 3, opts);
    let leaving = bed.gid(1).unwrap();
    let old_master = bed.cluster.shards[1].pod(0).server();
    assert_eq!(bed.codis.snapshot().master(leaving), Some(old_master.as_str()));
    // Hold the drain with a failing migration so that the failover happens while the action runs.
    let slots: Vec<usize> = bed.codis.snapshot().slots.iter().filter(|s| s.group_id == leaving).map(|s| s.id).collect();
    for &slot in &slots {
        bed.codis.set_slot_error(slot, "held by the test");
    }
    let env = remove_env(&bed, 1, &[0, 1]);
    let action = std::thread::spawn(move || run_to_completion("shard-remove", &env));
    assert!(eventually(Duration::from_secs(10), || bed
        .codis
        .snapshot()
        .slot_action
        .progress
        .status
        .contains("held by the test")));
    bed.cluster.shards[1].pods[0].redis.kill();
    assert!(
        bed.codis.wait_for(Duration::from_secs(10), |s| s.master(leaving).is_some_and(|m| m != old_master)).is_some(),
        "the fork did not fail the master over"
    );
    let new_master = bed.codis.snapshot().master(leaving).unwrap().to_owned();
    for &slot in &slots {
        bed.codis.clear_slot_error(slot);
    }
    action.join().expect("shard-remove");
    let deleted = deleted_servers(&bed, leaving);
    assert_eq!(deleted.len(), 3, "{deleted:?}");
    assert_eq!(deleted.last(), Some(&new_master), "the master Codis has now goes last: {deleted:?}");
    assert!(bed.codis.snapshot().group(leaving).is_none());
    bed.assert_balanced(&gids(&bed, &[0]));
}
