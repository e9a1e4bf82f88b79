//! Crash tests on the real servers (feature `failpoints`, issue 36): an action killed before each of its mutations
//! in turn — every Codis PUT, pika SLAVEOF and CONFIG REWRITE, etcd write — on real pika v4.0.1 and the fork's
//! dashboard and proxy, then run again as KubeBlocks' next call would, must converge with no key lost.
//!
//! One bed serves every crash point of a test (a bed and its cluster take most of a minute to start): each point
//! crashes the next operation on the cluster the previous rerun left, so each also starts from a state an earlier
//! crash and its recovery produced. The dead run's locks are removed before the rerun, as their lease's expiry
//! would remove them 15 s later (the wait for a held lock is tested on its own).

use std::time::Duration;

use testbed::real::bed::{Line, RealBed};

use super::{created, run_to_completion, Traffic};
use crate::summary::Category;
use crate::support::describe;

/// Points a master switchover has: the topology lock and the fence in etcd, the promote, SLAVEOF and CONFIG
/// REWRITE for the other replica and for the old master, the fence's removal.
const MINIMUM_POINTS: usize = 7;

/// The fence of shard `index`'s group in etcd (the switchover's target), if any.
fn fence(bed: &RealBed, index: usize) -> Option<String> {
    let gid = bed.topology().group_of(&bed.shards[index].pods[0].server()).expect("the shard's group").id;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    rt.block_on(async {
        let etcd = crate::support::connect_etcd(&bed.etcd.endpoint()).await.expect("etcd");
        let prefix = pika_action::clients::etcd::cluster_prefix(testbed::real::bed::NAMESPACE, &bed.name);
        let key = pika_action::steps::transfer::fence_key(&prefix, gid);
        etcd.get(&key).await.expect("read the fence").map(|e| e.value)
    })
}

/// What the lease of a killed run expiring does, without waiting its TTL (15 s) out: its lock keys go.
fn expire_locks(bed: &RealBed) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    rt.block_on(async {
        let etcd = crate::support::connect_etcd(&bed.etcd.endpoint()).await.expect("etcd");
        let prefix = pika_action::clients::etcd::cluster_prefix(testbed::real::bed::NAMESPACE, &bed.name);
        for (key, _) in etcd.list(&prefix).await.expect("list the cluster's keys") {
            if key.contains("/locks/") {
                etcd.delete(&key).await.expect("delete a lock");
            }
        }
    });
}

/// Promotes the dashboard ran so far: each logs "resync to prepared" once (`topom_group.go`). Not its last line,
/// "resync to finished": the dashboard's logger holds its latest line until the next one (seen held over 60 s).
fn promotes(bed: &RealBed) -> usize {
    bed.dashboard.whole_log().lines().filter(|l| l.contains("resync to prepared")).count()
}

/// Checks that the dashboard ran exactly `expected` promotes since its log counted `since` (waiting for its log,
/// which reaches its file a line late).
fn assert_promotes(bed: &RealBed, since: usize, expected: usize) {
    let counted = testbed::cluster::eventually(Duration::from_secs(60), || promotes(bed) - since >= expected);
    let log = bed.dashboard.whole_log();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("resync to") || l.contains("/group/promote/")).collect();
    let found = promotes(bed) - since;
    assert!(counted && found == expected, "{found} promotes, {expected} expected:\n{}", lines.join("\n"));
}

/// The ordinals of shard `index` whose pika says `role:master`.
fn pika_masters(bed: &RealBed, index: usize) -> Vec<u32> {
    bed.shards[index].pods.iter().filter(|p| p.role() == "master").map(|p| p.ordinal).collect()
}

/// A master switchover killed before each of its mutations, then run again: the master moved exactly once to
/// another pod, which alone is a pika master, every other pod follows it in sync, the fence is gone; the crash just
/// before the promote left the fence naming the target and Codis and the pikas untouched; every key acknowledged
/// through the fork's proxy before and during the runs is still readable.
#[test]
fn a_master_switchover_killed_at_any_mutation_converges_on_real_pika_when_run_again() {
    let bed = created(1, 3, Line::V1_1);
    let traffic = Traffic::start(&bed, "crash-switchover");
    let mut points = Category::new("crash: switchover, real pika and fork");
    let promoted_at_start = promotes(&bed);
    let mut tried: Vec<(usize, String)> = Vec::new();
    let mut between_fence_and_promote = false;
    let mut completed = false;
    for n in 1..=40 {
        let before = bed.master_ordinal(0);
        let mut env = bed.switchover_env(0);
        env.insert("PIKA_ACTION_CRASH_AT".into(), n.to_string());
        let out = bed.run(&["switchover"], &env);
        if out.status.code() == Some(0) {
            completed = true;
            assert_ne!(bed.master_ordinal(0), before, "the uncrashed switchover did not move the master");
            break;
        }
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let marker = format!("crash point {n}: aborting before ");
        let what = stderr
            .lines()
            .find_map(|l| l.split_once(&marker).map(|(_, w)| w.to_owned()))
            .unwrap_or_else(|| panic!("run {n} neither finished nor crashed: {}", describe(&out)));
        let label = format!("crash point {n:>2}: before {what}");
        points.trial(&label, || {
            if what.contains("/group/promote/") {
                let target = fence(&bed, 0).expect("the fence is written before the promote");
                assert_ne!(target, bed.shards[0].pod(before).server(), "the fence names the master");
                assert_eq!(bed.master_ordinal(0), before, "promoted before the promote");
                assert_eq!(pika_masters(&bed, 0), vec![before], "a pika changed role before the promote");
                between_fence_and_promote = true;
            }
            env.remove("PIKA_ACTION_CRASH_AT");
            expire_locks(&bed);
            run_to_completion(&bed, &["switchover"], &env);
            let master = bed.master_ordinal(0);
            assert_ne!(master, before, "the master did not move");
            assert_eq!(fence(&bed, 0), None, "the fence was left behind");
            super::assert_healthy(&bed);
            let settled = testbed::cluster::eventually(Duration::from_secs(30), || pika_masters(&bed, 0) == [master]);
            assert!(settled, "pika masters {:?}, Codis lists {master}", pika_masters(&bed, 0));
        });
        eprintln!("{label}: tried");
        tried.push((n, what));
    }
    assert!(completed, "the switchover never completed within 40 crash points");
    assert!(between_fence_and_promote, "no crash point between the fence and the promote: {tried:?}");
    assert!(
        tried.len() >= MINIMUM_POINTS,
        "only {} crash points ({tried:?}); every Codis, pika and etcd mutation must call failpoint::step",
        tried.len()
    );
    // Counted once, at the end: the dashboard's log reaches its file a line late.
    points.trial("one promote per switchover", || assert_promotes(&bed, promoted_at_start, tried.len() + 1));
    points.trial("no acknowledged key lost over every crash and rerun", || {
        let _ = traffic.finish(&bed);
    });
    points.finish();
}

/// `rejoin` of a master back on an empty volume (no failover ran meanwhile), killed before each of its mutations —
/// the group's transfer lock, the fence, the promote, the replicas' SLAVEOF and CONFIG REWRITE, the fence's removal,
/// the failover record, the config file — then started again as the kubelet restarts the container: another pod is
/// the master Codis lists and the only pika master, the empty pod follows it in sync, no key written before is
/// lost, one promote per handover.
#[test]
fn an_empty_masters_rejoin_killed_at_any_mutation_converges_on_real_pika_when_started_again() {
    let mut bed = created(1, 3, Line::V1_1);
    let keys: Vec<String> = (0..2000).map(|n| format!("rejoin:{n}")).collect();
    let ledger = testbed::Ledger::write_keys_authed(bed.proxies[0].data_addr(), Some(&bed.password), &keys)
        .expect("preload through the proxy");
    assert_eq!(ledger.acked.len(), keys.len(), "preload: {:?}", ledger.errors);
    let mut points = Category::new("crash: rejoin handover, real pika and fork");
    let promoted_at_start = promotes(&bed);
    let mut tried: Vec<(usize, String)> = Vec::new();
    let mut completed = false;
    for n in 1..=40 {
        // Every replica holds every key before the master's volume goes: a write no replica applied yet is lost
        // with the volume whatever the product does (asynchronous replication).
        super::assert_healthy(&bed);
        let everywhere = || {
            bed.shards[0].pods.iter().all(|pod| {
                let mut conn = pod.connect();
                ledger.acked.iter().all(|(k, v)| conn.command(&["GET", k]).ok().as_deref() == Some(v.as_str()))
            })
        };
        assert!(testbed::cluster::eventually(Duration::from_secs(60), everywhere), "replicas never caught up");
        let before = bed.master_ordinal(0);
        bed.shards[0].pod_mut(before).lose_volume();
        let crash = n.to_string();
        let what = match bed.start_pod_with(0, before, &[("PIKA_ACTION_CRASH_AT", &crash)]) {
            Ok(()) => None,
            Err(log) => {
                let marker = format!("crash point {n}: aborting before ");
                let what = log.lines().find_map(|l| l.split_once(&marker).map(|(_, w)| w.to_owned()));
                Some(what.unwrap_or_else(|| panic!("start {n} neither served nor crashed:\n{log}")))
            }
        };
        let label = what.as_ref().map_or_else(|| "no crash (it completed)".to_owned(), |w| format!("before {w}"));
        points.trial(format!("crash point {n:>2}: {label}"), || {
            if what.is_some() {
                expire_locks(&bed);
                bed.start_pod(0, before);
            }
            let master = bed.master_ordinal(0);
            assert_ne!(master, before, "the empty pod is still the master");
            super::assert_healthy(&bed);
            let settled = testbed::cluster::eventually(Duration::from_secs(30), || pika_masters(&bed, 0) == [master]);
            assert!(settled, "pika masters {:?}, Codis lists {master}", pika_masters(&bed, 0));
            let back = ledger.verify_through_authed(bed.proxies[0].data_addr(), Some(&bed.password));
            assert!(back.is_clean(), "keys lost: {}", back.summary());
        });
        eprintln!("rejoin crash point {n:>2}: {label}");
        match what {
            Some(what) => tried.push((n, what)),
            None => {
                completed = true;
                break;
            }
        }
    }
    assert!(completed, "rejoin never completed within 40 crash points");
    let seen: Vec<&str> = tried.iter().map(|(_, w)| w.as_str()).collect();
    for needed in ["/group/promote/", "SLAVEOF", "write pika config"] {
        assert!(seen.iter().any(|p| p.contains(needed)), "no crash point before {needed}: {seen:?}");
    }
    points.trial("one promote per handover", || assert_promotes(&bed, promoted_at_start, tried.len() + 1));
    points.finish();
}

/// The variables of `member-leave` (or `member-join`, with `kind` "JOIN") of pod `ordinal` of shard 0.
fn member_env(bed: &RealBed, kind: &str, ordinal: u32) -> std::collections::BTreeMap<String, String> {
    let pod = bed.shards[0].pod(ordinal);
    let extra = [
        (format!("KB_{kind}_MEMBER_POD_NAME"), pod.name.clone()),
        (format!("KB_{kind}_MEMBER_POD_FQDN"), pod.fqdn.clone()),
    ];
    let mut env = bed.env(0);
    env.extend(extra);
    env
}

/// `member-leave` of a replica, then of the master, killed before each of its mutations (the lock, the fence, the
/// promote, the other members' SLAVEOF and CONFIG REWRITE, the fence's removal, the `group/del`), then run again as
/// KubeBlocks requeues it, on one bed (after each leave a new pod joins, so the shard keeps three): the pod gone
/// from Codis, another pod the master Codis lists and the only pika master among the rest, every remaining pod in
/// sync, no fence left; one promote per master leaving and none per replica; every key acknowledged through the
/// fork's proxy kept.
#[test]
fn member_leave_killed_at_any_mutation_converges_on_real_pika_when_run_again() {
    let mut bed = created(1, 3, Line::V1_1);
    let traffic = Traffic::start(&bed, "crash-leave");
    let mut points = Category::new("crash: member-leave, real pika and fork");
    let promoted_at_start = promotes(&bed);
    let mut masters_left = 0;
    let mut switchovers = 0;
    for master_leaves in [false, true] {
        let mut completed = false;
        for n in 1..=40 {
            // KubeBlocks removes the highest ordinal (and, to scale in a master, switches it over first); the next
            // pod to join takes the ordinal again, so the bed's ordinals stay within three.
            let leaving = bed.shards[0].pods.iter().map(|p| p.ordinal).max().expect("pods");
            let is_master = bed.master_ordinal(0) == leaving;
            if master_leaves != is_master {
                let target = if master_leaves {
                    leaving
                } else {
                    bed.shards[0].pods.iter().map(|p| p.ordinal).find(|&o| o != leaving).expect("another pod")
                };
                let pod = bed.shards[0].pod(target);
                let mut env = bed.switchover_env(0);
                env.insert("KB_SWITCHOVER_CANDIDATE_NAME".into(), pod.name.clone());
                env.insert("KB_SWITCHOVER_CANDIDATE_FQDN".into(), pod.fqdn.clone());
                run_to_completion(&bed, &["switchover"], &env);
                assert_eq!(bed.master_ordinal(0), target, "the switchover to the candidate");
                switchovers += 1;
            }
            let master = bed.master_ordinal(0);
            let env = member_env(&bed, "LEAVE", leaving);
            let mut crashing = env.clone();
            crashing.insert("PIKA_ACTION_CRASH_AT".into(), n.to_string());
            let out = bed.run(&["member-leave"], &crashing);
            let marker = format!("crash point {n}: aborting before ");
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            let what = stderr.lines().find_map(|l| l.split_once(&marker).map(|(_, w)| w.to_owned()));
            if out.status.code() != Some(0) && what.is_none() {
                panic!("run {n} neither finished nor crashed: {}", describe(&out));
            }
            let who = if master_leaves { "the master" } else { "a replica" };
            let label = format!("{who} leaving, crash point {n:>2}: {}", what.as_deref().unwrap_or("no crash"));
            points.trial(&label, || {
                if what.is_some() {
                    expire_locks(&bed);
                    run_to_completion(&bed, &["member-leave"], &env);
                }
                let topology = bed.topology();
                let group = topology.group_of(&bed.shards[0].pod(master).server()).or_else(|| {
                    let other = bed.shards[0].pods.iter().find(|p| p.ordinal != leaving).expect("another pod");
                    topology.group_of(&other.server())
                });
                let group = group.expect("the shard's group");
                let gone = bed.shards[0].pod(leaving).server();
                assert!(!group.servers.contains(&gone), "the pod is still in Codis: {group:?}");
                let now = bed.shards[0].pods.iter().find(|p| Some(p.server().as_str()) == group.master());
                let now = now.expect("a master of the shard's pods").ordinal;
                if master_leaves {
                    assert_ne!(now, leaving, "the leaving master is still the master");
                } else {
                    assert_eq!(now, master, "the master moved for a replica leaving");
                }
                assert_eq!(fence(&bed, 0), None, "the fence was left behind");
                let rest = || pika_masters(&bed, 0).into_iter().filter(|&o| o != leaving).collect::<Vec<_>>();
                let settled = testbed::cluster::eventually(Duration::from_secs(30), || rest() == [now]);
                assert!(settled, "pika masters among the rest {:?}, Codis lists {now}", rest());
            });
            eprintln!("{label}: tried");
            if master_leaves {
                masters_left += 1;
            }
            // The pod goes, as KubeBlocks deletes it, and a new one joins so the next point starts from three.
            bed.remove_pod(0, leaving);
            let joined = bed.add_pod(0);
            run_to_completion(&bed, &["member-join"], &member_env(&bed, "JOIN", joined));
            super::assert_healthy(&bed);
            if what.is_none() {
                completed = true;
                break;
            }
        }
        assert!(completed, "member-leave never completed within 40 crash points");
    }
    points.trial("one promote per master leaving or switchover, none per replica", || {
        assert_promotes(&bed, promoted_at_start, masters_left + switchovers);
    });
    points.trial("no acknowledged key lost over every crash and rerun", || {
        let _ = traffic.finish(&bed);
    });
    points.finish();
}
