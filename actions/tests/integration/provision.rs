//! Codis registration and minimal-move rebalance on cluster create, shard scale-out and replica scale-out, checked
//! against Codis itself (the double's own model) and the redis-servers, never against our bookkeeping.

use crate::support;

use std::collections::BTreeMap;
use std::thread;

use support::{describe, minimum_moves, moved, run, run_to_completion, Bed};

fn all_gids(bed: &Bed) -> Vec<u32> {
    (0..bed.cluster.shards.len()).map(|i| bed.gid(i).expect("registered")).collect()
}

#[test]
fn post_provision_registers_three_shards_of_two_and_balances_every_slot() {
    let bed = Bed::builder().shards(3).pods(2).bed_default();
    let out = run("post-provision", &bed.env(0));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    for i in 0..3 {
        bed.assert_registered(i, 0);
    }
    let gids = all_gids(&bed);
    let mut distinct = gids.clone();
    distinct.dedup();
    assert_eq!(distinct.len(), 3);
    let sizes = bed.assert_balanced(&gids);
    assert_eq!(sizes.values().copied().collect::<Vec<_>>(), vec![342, 341, 341]);

    // Running it again changes nothing in Codis.
    bed.codis.clear_requests();
    let out = run("post-provision", &bed.env(1));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(bed.mutations().is_empty(), "a rerun changed Codis: {:?}", bed.mutations());
}

#[test]
fn shard_add_scales_three_to_four_to_eight_moving_the_fewest_slots() {
    let mut bed = Bed::builder().shards(3).pods(1).bed_default();
    run_to_completion("post-provision", &bed.env(0));
    for target in [4, 8] {
        while bed.cluster.shards.len() < target {
            let before = bed.owners();
            let index = bed.add_shard(2);
            let mut env = bed.env(0);
            env.insert("KB_ADD_SHARD_NAME".into(), bed.cluster.shards[index].full.clone());
            run_to_completion("shard-add", &env);
            bed.assert_registered(index, 0);
            let gids = all_gids(&bed);
            bed.assert_balanced(&gids);
            let after = bed.owners();
            assert_eq!(moved(&before, &after), minimum_moves(&before, &gids), "not the fewest moves");
        }
    }
}

#[test]
fn member_join_adds_a_replica_of_the_current_master() {
    let mut bed = Bed::builder().shards(2).pods(2).bed_default();
    run_to_completion("post-provision", &bed.env(0));
    // Codis moved shard 0's master to ordinal 1 (a switchover earlier): the new pod must follow ordinal 1.
    let gid = bed.gid(0).unwrap();
    let new_master = bed.cluster.shards[0].pod(1).server();
    assert!(bed
        .codis
        .call("PUT", &format!("/api/topom/group/promote/{}/{gid}/{new_master}", bed.codis.xauth()))
        .is_ok());
    let old = bed.cluster.shards[0].pod(0);
    let _ = old.redis.command(&["SLAVEOF", "127.0.0.1", &bed.cluster.shards[0].pod(1).redis.port().to_string()]);

    let ordinal = bed.add_pod(0);
    let shard = &bed.cluster.shards[0];
    let mut env = bed.env(0);
    env.insert("KB_JOIN_MEMBER_POD_NAME".into(), shard.pod(ordinal).name.clone());
    env.insert("KB_JOIN_MEMBER_POD_FQDN".into(), shard.pod(ordinal).fqdn.clone());
    run_to_completion("member-join", &env);
    bed.assert_registered(0, 1);
    // Idempotent.
    bed.codis.clear_requests();
    assert_eq!(run("member-join", &env).status.code(), Some(0));
    assert!(bed.mutations().is_empty(), "{:?}", bed.mutations());
}

#[test]
fn two_shard_adds_at_once_get_distinct_groups_and_a_balanced_table() {
    let mut bed = Bed::builder().shards(2).pods(1).bed_default();
    run_to_completion("post-provision", &bed.env(0));
    let a = bed.add_shard(1);
    let b = bed.add_shard(1);
    let envs: Vec<BTreeMap<String, String>> = [a, b]
        .iter()
        .map(|&i| {
            let mut env = bed.env(i);
            env.insert("KB_ADD_SHARD_NAME".into(), bed.cluster.shards[i].full.clone());
            env
        })
        .collect();
    let handles: Vec<_> =
        envs.into_iter().map(|env| thread::spawn(move || run_to_completion("shard-add", &env))).collect();
    for h in handles {
        h.join().expect("shard-add thread");
    }
    let gids = all_gids(&bed);
    assert_eq!(gids.len(), 4);
    assert!(gids.iter().collect::<std::collections::BTreeSet<_>>().len() == 4, "{gids:?}");
    bed.assert_balanced(&gids);
}

#[test]
fn post_provisions_of_kubeblocks_1_0_converge_in_any_order_and_at_once() {
    for order in [[2usize, 0, 1], [1, 2, 0]] {
        let bed = Bed::builder().shards(3).pods(2).bed_default();
        // Two run together, then the third.
        let first: Vec<_> = order[..2]
            .iter()
            .map(|&i| {
                let env = bed.env_v1_0(i, &[]);
                thread::spawn(move || run_to_completion("post-provision", &env))
            })
            .collect();
        for h in first {
            h.join().expect("post-provision thread");
        }
        let snapshot = bed.codis.snapshot();
        assert!(snapshot.slots.iter().all(|s| s.group_id == 0), "slots assigned before every shard registered");
        run_to_completion("post-provision", &bed.env_v1_0(order[2], &[]));
        for i in 0..3 {
            bed.assert_registered(i, 0);
        }
        let gids = all_gids(&bed);
        bed.assert_balanced(&gids);
        // No slot ever migrated on a fresh cluster: they were assigned once.
        assert!(!bed.codis.requests().iter().any(|r| r.path.contains("slots/action/create")));
    }
}

#[test]
fn a_run_out_of_budget_exits_75_with_progress_and_the_next_run_finishes_without_redoing_anything() {
    let mut bed = Bed::builder().shards(2).pods(1).bed_default();
    run_to_completion("post-provision", &bed.env(0));
    bed.codis.set_default_migration_ticks(40);
    let index = bed.add_shard(1);
    let mut env = bed.env(0);
    env.insert("KB_ADD_SHARD_NAME".into(), bed.cluster.shards[index].full.clone());
    env.insert("ACTION_BUDGET_SECONDS".into(), "2".into());
    let before = bed.owners();
    let out = run("shard-add", &env);
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("rebalance in progress:") && stderr.contains("slots moved"), "{stderr}");
    bed.codis.set_default_migration_ticks(1);
    let created_before: usize = bed.codis.requests().iter().filter(|r| r.path.contains("slots/action/create")).count();
    env.insert("ACTION_BUDGET_SECONDS".into(), "40".into());
    run_to_completion("shard-add", &env);
    let created_after: usize = bed.codis.requests().iter().filter(|r| r.path.contains("slots/action/create")).count();
    assert_eq!(created_before, created_after, "the rerun planned migrations again");
    let gids = all_gids(&bed);
    bed.assert_balanced(&gids);
    assert_eq!(moved(&before, &bed.owners()), minimum_moves(&before, &gids));
}

#[test]
fn an_unreachable_pika_fails_clearly_and_a_rerun_finishes_the_job() {
    let mut bed = Bed::builder().shards(2).pods(2).bed_default();
    let env = bed.env(0);
    bed.cluster.shards[1].pods[1].redis.kill();
    let out = run("post-provision", &env);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&bed.cluster.shards[1].pods[1].fqdn) || stderr.contains("127.0.0.1"), "{stderr}");
    bed.cluster.shards[1].pods[1].redis.restart();
    run_to_completion("post-provision", &env);
    bed.assert_registered(0, 0);
    bed.assert_registered(1, 0);
    let gids = all_gids(&bed);
    bed.assert_balanced(&gids);
}

#[test]
fn a_dashboard_error_is_reported_with_its_cause_and_a_rerun_finishes() {
    let bed = Bed::builder().shards(2).pods(1).bed_default();
    bed.codis.fail_next_on("/api/topom/group/add", 1, testbed::Fault::Status800("injected cause for the test".into()));
    let out = run("post-provision", &bed.env(0));
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("injected cause for the test"));
    run_to_completion("post-provision", &bed.env(0));
    let gids = all_gids(&bed);
    bed.assert_balanced(&gids);
}

#[test]
fn a_replica_that_never_syncs_ends_the_run_with_75_naming_it() {
    let cluster = support::ClusterFixture::builder().shards(1).pods(2).password("cluster-secret-3").build();
    // The replica presents the wrong password to its master, so its link never comes up.
    let _ = cluster.shards[0].pods[1].redis.command(&["CONFIG", "SET", "masterauth", "not-the-password"]);
    let replica = cluster.shards[0].pods[1].fqdn.clone();
    let bed = Bed::with(cluster, testbed::DoubleOptions::default());
    let mut env = bed.env(0);
    env.insert("ACTION_BUDGET_SECONDS".into(), "3".into());
    let out = run("post-provision", &env);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    assert!(stderr.contains(&replica) && stderr.contains("to sync"), "{stderr}");
    assert!(!stderr.contains("cluster-secret-3"), "password leaked: {stderr}");
    // Codis stays consistent: the group exists with its master first, and no slot was handed out.
    let snap = bed.codis.snapshot();
    assert_eq!(snap.groups.len(), 1);
    assert_eq!(snap.groups[0].master(), Some(bed.cluster.shards[0].pods[0].server().as_str()));
    assert!(snap.slots.iter().all(|s| s.group_id == 0));
}

#[test]
fn rejoin_makes_a_pod_on_an_empty_volume_a_replica_of_the_current_master() {
    let mut bed = Bed::builder().shards(1).pods(3).bed_default();
    run_to_completion("post-provision", &bed.env(0));
    let shard_index = 0;
    let pod = &mut bed.cluster.shards[shard_index].pods[2];
    pod.redis.kill();
    pod.redis.reset_config();
    let mut env = bed.env(shard_index);
    env.insert("POD_NAME".into(), bed.cluster.shards[shard_index].pods[2].name.clone());
    env.insert(
        "PIKA_CONFIG_FILE".into(),
        bed.cluster.shards[shard_index].pods[2].redis.dir().join("redis.conf").display().to_string(),
    );
    let out = run("rejoin", &env);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    bed.cluster.shards[shard_index].pods[2].redis.restart();
    bed.assert_registered(shard_index, 0);

    // The master itself, restarted with no switchover before it (its config even, wrongly, names a replica): it may
    // have lost its last writes, so mastership first moves to a live replica and the old master comes back as its
    // replica.
    let master = &mut bed.cluster.shards[shard_index].pods[0];
    master.redis.kill();
    let conf = master.redis.dir().join("redis.conf");
    let text = std::fs::read_to_string(&conf).unwrap();
    std::fs::write(&conf, format!("{text}\nreplicaof 127.0.0.1 1\n")).unwrap();
    env.insert("POD_NAME".into(), master.name.clone());
    env.insert("PIKA_CONFIG_FILE".into(), conf.display().to_string());
    let out = run("rejoin", &env);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    bed.cluster.shards[shard_index].pods[0].redis.restart();
    let snap = bed.codis.snapshot();
    let now = snap.master(bed.gid(shard_index).expect("registered")).expect("a master").to_owned();
    let new_master = bed.cluster.shards[shard_index].pods.iter().find(|p| p.server() == now).expect("a pod").ordinal;
    assert_ne!(new_master, 0, "the master restarted with no switchover kept mastership");
    bed.assert_registered(shard_index, new_master);
}

#[test]
fn rejoin_on_a_fresh_cluster_changes_nothing() {
    let bed = Bed::builder().shards(1).pods(2).bed_default();
    let pod = &bed.cluster.shards[0].pods[1];
    let conf = pod.redis.dir().join("redis.conf");
    let before = std::fs::read_to_string(&conf).unwrap();
    let mut env = bed.env(0);
    env.insert("POD_NAME".into(), pod.name.clone());
    env.insert("PIKA_CONFIG_FILE".into(), conf.display().to_string());
    let out = run("rejoin", &env);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), before);
    assert!(bed.mutations().is_empty());
}

#[test]
fn under_the_pika_fork_registration_waits_until_the_dashboard_reports_the_replicas_as_slaves() {
    // The fork's health loop fills each server's role and state; registration is done only when they agree with
    // what the pikas report (master at index 0, replicas `slave` in state 0).
    let opts = testbed::DoubleOptions { fork: true, ..testbed::DoubleOptions::default() };
    let bed = Bed::builder().shards(2).pods(2).bed(opts);
    run_to_completion("post-provision", &bed.env(0));
    for i in 0..2 {
        bed.assert_registered(i, 0);
        let gid = bed.gid(i).unwrap();
        let snap = bed.codis.snapshot();
        let group = snap.group(gid).unwrap();
        for server in &group.servers[1..] {
            assert_eq!(server.role.as_deref(), Some("slave"), "{}", server.server);
            assert_eq!(server.state, Some(0), "{}", server.server);
        }
    }
    let gids = all_gids(&bed);
    bed.assert_balanced(&gids);
}
