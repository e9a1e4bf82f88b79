//! `switchover` gets one call: in a rolling update or a replica scale-in KubeBlocks ignores any failure, any exit
//! code and a timeout, and deletes the pod at once. Every path that used to end a run with exit 75 (run me again)
//! — a topology lock held by someone else, a promote Codis does not confirm, an answer that comes too late, an old
//! master that cannot be demoted in time — must end within the budget with exit 0 or 1, leaving Codis with one
//! master it routes to: either nothing changed and the old master still serves, or the new master serves and the
//! next transfer (or the restarting pod's rejoin) finishes the rest.

use crate::rollout;
use crate::support;

use std::time::Duration;

use rollout::{assert_one_master, bed_with_master, codis_master, pika_masters, promotes, switchover_env};
use support::{describe, eventually, Bed, NAMESPACE};
use testbed::{Fault, RedisServer};

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn quiet(bed: &Bed) {
    for pod in &bed.cluster.shards[0].pods {
        let _ = pod.redis.command(&["CONFIG", "SET", "repl-ping-replica-period", "30"]);
    }
}

fn with_etcd<T, F: std::future::Future<Output = T>>(
    bed: &Bed,
    f: impl FnOnce(pika_action::clients::etcd::Etcd, String) -> F,
) -> T {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let etcd = crate::support::connect_etcd(&bed.cluster.etcd.endpoint()).await.unwrap();
        f(etcd, pika_action::clients::etcd::cluster_prefix(NAMESPACE, &bed.cluster.name)).await
    })
}

fn fence(bed: &Bed) -> Option<String> {
    let gid = bed.gid(0).unwrap();
    with_etcd(bed, |etcd, prefix| async move {
        etcd.get(&pika_action::steps::transfer::fence_key(&prefix, gid)).await.unwrap().map(|e| e.value)
    })
}

/// Runs the switchover of pod `ordinal` with `budget` seconds; asserts it is not 75 and ended within the budget.
fn one_call(bed: &Bed, ordinal: u32, budget: u64) -> std::process::Output {
    let mut env = switchover_env(bed, ordinal, None);
    env.insert("ACTION_BUDGET_SECONDS".into(), budget.to_string());
    let out = support::run_time_boxed("switchover", &env, budget);
    assert_ne!(out.status.code(), Some(75), "switchover exited 75: {}", describe(&out));
    out
}

#[test]
fn a_topology_lock_held_elsewhere_is_exit_1_with_nothing_changed() {
    let bed = bed_with_master(3, 0);
    let key = with_etcd(&bed, |_, prefix| async move { format!("{prefix}/locks/topology") });
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let etcd = rt.block_on(crate::support::connect_etcd(&bed.cluster.etcd.endpoint())).unwrap();
    let mut held =
        rt.block_on(etcd.lock(&key, Duration::from_secs(60), Duration::from_secs(5), "a drain (test)")).expect("lock");
    for ordinal in [0, 2] {
        let out = one_call(&bed, ordinal, 4);
        if ordinal == 0 {
            assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
            let text = stderr(&out);
            assert!(text.contains("topology lock") && text.contains("nothing was changed"), "{text}");
        } else {
            // A replica that has nothing to repair needs no lock at all.
            assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        }
    }
    assert!(bed.mutations().is_empty(), "{:?}", bed.mutations());
    assert_eq!(fence(&bed), None);
    assert_one_master(&bed, 0);
    rt.block_on(held.release()).unwrap();
    let out = one_call(&bed, 0, 20);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_one_master(&bed, 2);
}

#[test]
fn a_promote_codis_keeps_refusing_is_exit_1_and_the_old_master_still_serves() {
    let bed = bed_with_master(3, 0);
    quiet(&bed);
    // Codis answers the promote as it does while a migration touches the group: retried until the budget ends.
    bed.codis.fail_next_on(
        "/api/topom/group/promote/",
        10_000,
        Fault::Status800("slots-migration is running = 1".into()),
    );
    let out = one_call(&bed, 0, 5);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let text = stderr(&out);
    assert!(text.contains("one call") && text.contains("still group"), "{text}");
    assert_eq!(codis_master(&bed), 0);
    assert_one_master(&bed, 0);
    // The fence it wrote only steers the next transfer to the same member.
    assert_eq!(fence(&bed), Some(bed.cluster.shards[0].pod(2).server()));
    bed.codis.clear_faults();
    let out = one_call(&bed, 0, 20);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_one_master(&bed, 2);
    assert_eq!(promotes(&bed), 1);
}

#[test]
fn a_promote_unanswered_within_the_budget_is_exit_1_and_codis_keeps_one_master_it_routes_to() {
    let mut bed = bed_with_master(3, 0);
    quiet(&bed);
    // The dashboard holds the promote past the budget. (Real Codis may still carry it out after the client gave up;
    // the double drops it with the connection. Either way Codis lists one master, and that pika is a master.)
    bed.codis.fail_next_on("/api/topom/group/promote/", 1, Fault::Timeout(Duration::from_secs(4)));
    let out = one_call(&bed, 0, 3);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(stderr(&out).contains("one call"), "{}", describe(&out));
    let gid = bed.gid(0).unwrap();
    let snap = bed.codis.snapshot();
    assert!(snap.group(gid).unwrap().promoting.state.is_nothing(), "no promote left hanging");
    let master = codis_master(&bed);
    assert!(master == 0 || master == 2, "codis lists {master}");
    assert_eq!(bed.cluster.shards[0].pod(master).redis.role(), "master", "the master codis routes to is one");
    // KubeBlocks deletes pod 0 anyway; it rejoins, and the next switchover of the group finishes what is left.
    rollout::restart(&mut bed, 0);
    let out = one_call(&bed, 1, 20);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let master = codis_master(&bed);
    assert_one_master(&bed, master);
}

#[test]
fn an_old_master_that_cannot_be_demoted_in_time_is_exit_1_with_codis_routing_to_the_new_master() {
    old_master_kept_by_a_stray_replica(false);
}

/// A leading failover watcher re-points a replaced master that still holds links of members that left it (pika
/// drops those only at the replica's next replication cron), so a transfer does not wait for it then; a replica
/// from outside the group is no such link, and the transfer still waits for it and reports it.
#[test]
fn with_a_watcher_leading_an_old_master_kept_by_a_replica_from_outside_is_still_exit_1() {
    old_master_kept_by_a_stray_replica(true);
}

fn old_master_kept_by_a_stray_replica(watcher_leads: bool) {
    let bed = bed_with_master(3, 0);
    quiet(&bed);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let _watcher = watcher_leads.then(|| {
        let etcd = rt.block_on(crate::support::connect_etcd(&bed.cluster.etcd.endpoint())).unwrap();
        let prefix = pika_action::clients::etcd::cluster_prefix(NAMESPACE, &bed.cluster.name);
        let key = pika_action::steps::transfer::watcher_key(&prefix);
        rt.block_on(etcd.lock(&key, Duration::from_secs(60), Duration::from_secs(5), "a watcher (test)")).expect("lock")
    });
    // Something outside the group replicates the old master, so it keeps a replica Codis cannot re-point: pika
    // (like redis here) is not demoted while it has one.
    let stray = RedisServer::start();
    let master_port = bed.cluster.shards[0].pod(0).redis.port().to_string();
    let _ = stray.command(&["SLAVEOF", "127.0.0.1", &master_port]);
    assert!(eventually(Duration::from_secs(10), || stray.master().is_some_and(|(_, _, up)| up)));
    let out = one_call(&bed, 0, 6);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let text = stderr(&out);
    assert!(text.contains("lose their replicas") && text.contains("routes group"), "{text}");
    assert_eq!(codis_master(&bed), 2, "the transfer happened in codis");
    let new_port = bed.cluster.shards[0].pod(2).redis.port();
    assert!(eventually(Duration::from_secs(10), || bed.cluster.shards[0]
        .pod(1)
        .redis
        .master()
        .is_some_and(|(_, p, _)| p == new_port)));
    assert_eq!(pika_masters(&bed), [0, 2].into(), "only the old master waits, outside codis' routing");

    // Once the stray replica lets go, the next switchover of the group finishes it.
    let _ = stray.command(&["SLAVEOF", "NO", "ONE"]);
    let out = one_call(&bed, 1, 20);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_one_master(&bed, 2);
    assert_eq!(promotes(&bed), 1);
}

#[test]
fn a_budget_too_short_for_a_transfer_is_exit_1_before_anything_is_written() {
    let bed = bed_with_master(3, 0);
    // The lock wait takes a third of the budget; a slow Kubernetes API (none here) or survey could take the rest.
    // With one second, less than the two fifths a transfer needs are left once the members were surveyed.
    bed.codis.fail_next_on("/api/topom/stats", 1, Fault::Timeout(Duration::from_millis(700)));
    let out = one_call(&bed, 0, 1);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(bed.mutations().is_empty(), "{:?}", bed.mutations());
    assert_eq!(fence(&bed), None, "nothing written");
    assert_one_master(&bed, 0);
}
