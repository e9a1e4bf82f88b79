//! Crash tests on the real servers (feature `failpoints`, issue 36): an action killed before each of its mutations
//! in turn — every Codis PUT, pika SLAVEOF and CONFIG REWRITE, etcd write — on real pika v4.0.1 and the fork's
//! dashboard and proxy, then run again as KubeBlocks' next call would, must converge with no key lost.
//!
//! One bed serves every crash point of a test (a bed and its cluster take most of a minute to start): each point
//! crashes the next operation on the cluster the previous rerun left, so each also starts from a state an earlier
//! crash and its recovery produced. The dead run's locks are removed before the rerun, as their lease's expiry
//! would remove them 15 s later (the wait for a held lock is tested on its own).

use std::collections::BTreeMap;
use std::time::Duration;

use testbed::real::bed::{Line, RealBed};
use testbed::real::pika::ReplicaState;

use super::{created, promotes, run_to_completion, with_etcd, Traffic};
use crate::summary::Category;
use crate::support::describe;

/// Points a master switchover has: the topology lock and the fence in etcd, the promote, SLAVEOF and CONFIG
/// REWRITE for the other replica and for the old master, the fence's removal.
const MINIMUM_POINTS: usize = 7;

/// The fence of shard `index`'s group in etcd (the switchover's target), if any.
fn fence(bed: &RealBed, index: usize) -> Option<String> {
    let gid = bed.topology().group_of(&bed.shards[index].pods[0].server()).expect("the shard's group").id;
    with_etcd(bed, async |etcd, prefix| {
        let key = pika_action::steps::transfer::fence_key(prefix, gid);
        etcd.get(&key).await.expect("read the fence").map(|e| e.value)
    })
}

/// What the lease of a killed run expiring does, without waiting its TTL (15 s) out: its lock keys go.
fn expire_locks(bed: &RealBed) {
    with_etcd(bed, async |etcd, prefix| {
        for (key, _) in etcd.list(prefix).await.expect("list the cluster's keys") {
            if key.contains("/locks/") {
                etcd.delete(&key).await.expect("delete a lock");
            }
        }
    });
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
        let env = bed.switchover_env(0);
        let Some(what) = crash_run(&bed, &["switchover"], &env, n) else {
            completed = true;
            assert_ne!(bed.master_ordinal(0), before, "the uncrashed switchover did not move the master");
            break;
        };
        let label = format!("crash point {n:>2}: before {what}");
        points.trial(&label, || {
            if what.contains("/group/promote/") {
                let target = fence(&bed, 0).expect("the fence is written before the promote");
                assert_ne!(target, bed.shards[0].pod(before).server(), "the fence names the master");
                assert_eq!(bed.master_ordinal(0), before, "promoted before the promote");
                assert_eq!(pika_masters(&bed, 0), vec![before], "a pika changed role before the promote");
                between_fence_and_promote = true;
            }
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

/// A switchover of shard 0 to pod `target`, a replica, as KubeBlocks' Switchover names a ready candidate: once the
/// candidate is in sync, and again when it was refused for a link that went down meanwhile (nothing changed then).
/// Seen in this bed: a pod joining with the address and name of a pod just deleted had its link dropped about 20 s
/// after it joined, when the master's keepalive timeout dropped the deleted pod's link, listed under the same
/// address.
fn switchover_to(bed: &RealBed, target: u32) {
    let pod = bed.shards[0].pod(target);
    let mut env = bed.switchover_env(0);
    env.insert("KB_SWITCHOVER_CANDIDATE_NAME".into(), pod.name.clone());
    env.insert("KB_SWITCHOVER_CANDIDATE_FQDN".into(), pod.fqdn.clone());
    for _ in 0..10 {
        let ready = || ReplicaState::of(&pod.info_replication()).is_some_and(|r| r.in_sync());
        let ready = testbed::cluster::eventually(Duration::from_secs(30), ready);
        assert!(ready, "{} never in sync:\n{}", pod.name, pod.report());
        let out = bed.run(&["switchover"], &env);
        match out.status.code() {
            Some(0) => return,
            Some(75) => {}
            Some(2) if String::from_utf8_lossy(&out.stderr).contains("replication link is down") => {
                let master = bed.shards[0].pod(bed.master_ordinal(0));
                eprintln!(
                    "the switchover to {} refused: {}\n{}\n{}",
                    pod.name,
                    describe(&out),
                    pod.report(),
                    master.report()
                );
            }
            _ => panic!("the switchover to {}: {}", pod.name, describe(&out)),
        }
    }
    panic!("the switchover to {} did not finish in 10 runs", pod.name);
}

/// `member-leave` of a replica, then of the master, killed before each of its mutations (the lock, the fence, the
/// promote, the other members' SLAVEOF and CONFIG REWRITE, the fence's removal, the `group/del`), then run again as
/// KubeBlocks requeues it, on one bed (after each leave a new pod joins, so the shard keeps three): the pod gone
/// from Codis, another pod the master Codis lists and the only pika master among the rest, every remaining pod in
/// sync, no fence, lock or other record of an operation under way left, a further run changing nothing; one
/// promote per master leaving and none per replica; every key acknowledged through the fork's proxy kept.
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
                switchover_to(&bed, target);
                assert_eq!(bed.master_ordinal(0), target, "the switchover to the candidate");
                switchovers += 1;
            }
            let master = bed.master_ordinal(0);
            let env = member_env(&bed, "LEAVE", leaving);
            let what = crash_run(&bed, &["member-leave"], &env, n);
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
                assert_eq!(records_under_way(&bed), Vec::<String>::new(), "records of an operation under way left");
                // KubeBlocks may call it again before it deletes the pod: nothing changes.
                let before = layout(&bed);
                run_to_completion(&bed, &["member-leave"], &env);
                assert_eq!(layout(&bed), before, "a further member-leave changed the cluster");
                traffic.assert_kept_so_far(&bed);
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

/// One run of `args` killed before its `n`-th mutation, resumed while it runs out of its budget (exit 75; each run
/// counts its mutations afresh): `Some(what)` it was killed before, or `None` when it finished with fewer.
fn crash_run(bed: &RealBed, args: &[&str], env: &BTreeMap<String, String>, n: usize) -> Option<String> {
    let mut crashing = env.clone();
    crashing.insert("PIKA_ACTION_CRASH_AT".into(), n.to_string());
    let marker = format!("crash point {n}: aborting before ");
    for _ in 0..10 {
        let out = bed.run(args, &crashing);
        match out.status.code() {
            Some(0) => return None,
            Some(75) => continue,
            _ => {}
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        let what = stderr.lines().find_map(|l| l.split_once(&marker).map(|(_, w)| w.to_owned()));
        return Some(
            what.unwrap_or_else(|| panic!("{args:?} run {n} neither finished nor crashed: {}", describe(&out))),
        );
    }
    panic!("{args:?} with a crash point at {n} ran out of its budget ten times");
}

/// [`crash_run`] at `crash`, or without a crash point to completion.
fn once(bed: &RealBed, args: &[&str], env: &BTreeMap<String, String>, crash: Option<usize>) -> Option<String> {
    match crash {
        Some(n) => crash_run(bed, args, env, n),
        None => {
            run_to_completion(bed, args, env);
            None
        }
    }
}

/// What a further run of a finished action must leave as it is.
#[derive(Debug, PartialEq, Eq)]
struct Layout {
    /// Each group's servers in Codis' order.
    groups: Vec<(u32, Vec<String>)>,
    /// Each slot's owner.
    slots: Vec<u32>,
    /// Each pod's name, role and the master it follows.
    pods: Vec<(String, String, String)>,
}

fn layout(bed: &RealBed) -> Layout {
    let topology = bed.topology();
    let groups = topology.groups.iter().map(|g| (g.id, g.servers.clone())).collect();
    let pods = bed
        .shards
        .iter()
        .flat_map(|s| &s.pods)
        .map(|p| {
            let follows = ReplicaState::of(&p.info_replication()).map(|r| r.master_host).unwrap_or_default();
            (p.name.clone(), p.role(), follows)
        })
        .collect();
    Layout { groups, slots: topology.slots, pods }
}

/// Every etcd key of the bed's cluster.
fn etcd_keys(bed: &RealBed) -> Vec<String> {
    let keys = with_etcd(bed, async |etcd, prefix| etcd.list(prefix).await.expect("list the cluster's keys"));
    keys.into_iter().map(|(k, _)| k).collect()
}

/// The cluster's etcd keys that only an operation under way holds: locks, fences, drains, leaving marks, paused
/// migrations.
fn records_under_way(bed: &RealBed) -> Vec<String> {
    let transient = ["/locks/", "/fence/", "/drains/", "/leaving/", "/migrations-paused/"];
    etcd_keys(bed).into_iter().filter(|k| transient.iter().any(|t| k.contains(t))).collect()
}

/// The group reservations etcd holds (`groups/<gid>`).
fn recorded_groups(bed: &RealBed) -> Vec<String> {
    etcd_keys(bed).into_iter().filter(|k| k.contains("/groups/")).collect()
}

/// Every etcd record of group `gid`: its reservation and its history (last failover and handover, held-data mark,
/// salvaged tail), all keyed `.../<gid>`.
fn records_of_group(bed: &RealBed, gid: u32) -> Vec<String> {
    let suffix = format!("/{gid}");
    etcd_keys(bed).into_iter().filter(|k| k.ends_with(&suffix)).collect()
}

/// After an action finished: the cluster healthy (every shard a group, its master a pika master, its replicas in
/// sync, the slots balanced), no pod holding a key of a slot its group does not own, nothing under way left in
/// etcd, one group record per shard, and one more run of the action changing nothing.
fn assert_settled(bed: &RealBed, args: &[&str], env: &BTreeMap<String, String>) {
    super::assert_healthy(bed);
    super::assert_owns_only(bed);
    assert_eq!(records_under_way(bed), Vec::<String>::new(), "records of an operation under way left in etcd");
    let groups = recorded_groups(bed);
    assert_eq!(groups.len(), bed.shards.len(), "etcd's group records {groups:?}");
    let before = layout(bed);
    run_to_completion(bed, args, env);
    assert_eq!(layout(bed), before, "a further {args:?} changed the cluster");
}

/// Which crash points one test of [`scale_killed_everywhere`] takes, so that the 1.1 points (about 40 of the
/// shardAdd's, 15 of the shardRemove's, half a minute each) are shared by two tests CI runs side by side.
struct Share {
    /// The scale-out's points, the first one on; `None`: none (uncrashed, on 1.0 and in the 1.1 share that crashes
    /// the scale-out's later points only from there).
    out: Option<std::ops::RangeInclusive<usize>>,
    /// Whether the scale-in is killed at every one of its points (else it runs uncrashed, to give the next point its
    /// cluster back).
    scale_in: bool,
    /// Mutations this share's scale-out points must include.
    needed: &'static [&'static str],
}

/// A scale-out by one shard of two pods and the scale-in of that shard, each killed before each of its mutations
/// that `share` takes in turn — on 1.1 the shardAdd (which splits the new shard off a donor: the new pods made to
/// forget their replication IDs, copied from the donor under an alias, the cutover's promote, the donor's cleanup of
/// the slots it gave) and the shardRemove (the drain's migrations, the group's removal); on 1.0 the leaving
/// component's preTerminate, the scale-out uncrashed — then run again as KubeBlocks calls it again, on one bed whose
/// cluster each point leaves to the next: after each, the cluster healthy and settled ([`assert_settled`]), no key
/// of a slot a group does not own on any pod; at the end every key acknowledged through the fork's proxy kept on
/// every pod.
fn scale_killed_everywhere(line: Line, share: &Share) {
    // Over the tier's 128 slots: each crash point is a mutation per group, slot range or batch of keys, never per
    // slot, so 1024 would add no kind of point, only each rebalance's and drain's waiting, a hundred-odd times.
    let mut bed = created(2, 2, line);
    // Each writer cycles through 500 keys: the data stays the same size over some fifty operations, and with it
    // the split's cleanup, whose every DEL of up to 1000 keys is a crash point.
    let traffic = Traffic::start_with(&bed, "crash-scale", Duration::from_millis(10), Some(500));
    let mut points = Category::new(format!("crash: scale-out and scale-in, real pika and fork ({line:?})"));
    // On 1.0 the new component's postProvision runs the very split 1.1's shardAdd runs (the same steps, crashed
    // there): here only its preTerminate, which 1.1 does not run, is crashed.
    let (mut out_done, mut in_done) = (share.out.is_none(), !share.scale_in);
    let (mut out_tried, mut in_tried) = (Vec::new(), Vec::new());
    let first = share.out.as_ref().map_or(1, |r| *r.start());
    for n in first..first + 100 {
        let crash_out = share.out.as_ref().filter(|r| r.contains(&n) && !out_done).map(|_| n);
        let crash_in = (!in_done).then_some(n);
        if crash_out.is_none() && crash_in.is_none() {
            break;
        }
        let index = bed.add_shard(2);
        let (out_args, out_env): (&[&str], _) = match line {
            Line::V1_1 => {
                run_to_completion(&bed, &["post-provision", "--own-shard"], &bed.env(index));
                let full = bed.shards[index].full.clone();
                (&["shard-add"], super::with(bed.env(0), &[("KB_ADD_SHARD_NAME", full)]))
            }
            Line::V1_0 => (&["post-provision"], bed.env(index)),
        };
        let crash = watched_trial(&bed, &mut points, ("scale-out", n), (out_args, &out_env), crash_out, || {
            assert_settled(&bed, out_args, &out_env);
        });
        match (crash_out, crash) {
            (None, _) => {}
            (Some(_), Some(what)) => out_tried.push(what),
            (Some(_), None) => out_done = true,
        }
        let (in_args, in_env): (&[&str], _) = match line {
            Line::V1_1 => {
                let full = bed.shards[index].full.clone();
                (&["shard-remove"], super::with(bed.env(0), &[("KB_REMOVE_SHARD_NAME", full)]))
            }
            Line::V1_0 => {
                let mut env = bed.env(index);
                env.extend(bed.legacy_env(&[index]));
                env.insert("KB_CLUSTER_COMPONENT_IS_SCALING_IN".into(), "true".into());
                (&["pre-terminate"], env)
            }
        };
        let gid = bed.topology().group_of(&bed.shards[index].pods[0].server()).map(|g| g.id);
        let crash = watched_trial(&bed, &mut points, ("scale-in", n), (in_args, &in_env), crash_in, || {
            let topology = bed.topology();
            for pod in &bed.shards[index].pods {
                assert!(topology.group_of(&pod.server()).is_none(), "{} is still in Codis: {topology:?}", pod.name);
            }
            let gid = gid.expect("the leaving shard had a group");
            assert!(topology.groups.iter().all(|g| g.id != gid), "group {gid} survived: {topology:?}");
            // Its id goes to the next shard: no record of its past may pass on to it.
            assert_eq!(records_of_group(&bed, gid), Vec::<String>::new(), "etcd keeps records of removed group {gid}");
            // A further run must change nothing, while the shard's pods still run (KubeBlocks deletes them after).
            let before = layout(&bed);
            run_to_completion(&bed, in_args, &in_env);
            assert_eq!(layout(&bed), before, "a further {in_args:?} changed the cluster");
        });
        bed.remove_shard(index);
        points.trial(format!("after scale-in {n}: the rest healthy and settled"), || {
            super::assert_healthy(&bed);
            super::assert_owns_only(&bed);
            assert_eq!(records_under_way(&bed), Vec::<String>::new(), "records of an operation under way left");
        });
        match (crash_in, crash) {
            (None, _) => {}
            (Some(_), Some(what)) => in_tried.push(what),
            (Some(_), None) => in_done = true,
        }
    }
    eprintln!("scale-out crash points: {out_tried:?}\nscale-in crash points: {in_tried:?}");
    assert!(in_done, "the scale-in never completed within 100 crash points");
    // The shares must meet: a bounded share crashes every point of its range (the scale-out does not complete
    // within it), the last share crashes at least one and sees the scale-out complete. Else the boundary is to move.
    match &share.out {
        Some(out) if *out.end() == usize::MAX => {
            assert!(!out_tried.is_empty(), "the scale-out has fewer than {} mutations: no crash point", out.start());
            assert!(out_done, "the scale-out never completed within 100 crash points");
        }
        Some(out) => assert!(
            !out_done && out_tried.len() == out.end() - out.start() + 1,
            "the scale-out did not reach past {out:?} (the later share would crash nothing): {out_tried:?}"
        ),
        None => {}
    }
    for needed in share.needed {
        assert!(
            out_tried.iter().any(|p| p.contains(needed)),
            "no scale-out crash point before {needed}: {out_tried:?}"
        );
    }
    if share.scale_in {
        assert!(
            in_tried.iter().any(|p| p.contains("/group/remove/")),
            "no scale-in crash point before the group's removal"
        );
    }
    points.trial("no acknowledged key lost over every crash and rerun, on every pod", || {
        let _ = traffic.finish_on_every_pod(&bed);
    });
    points.finish();
}

/// One run of `run` killed at `crash_at` (or uncrashed, to completion, when `None`) with the topology watched,
/// then one trial: nothing wrong seen while it went; when it was killed, run again to completion as KubeBlocks
/// calls it again (watched too) with the locks of the killed run expired; then `check`. Returns what it was killed
/// before.
fn watched_trial(
    bed: &RealBed,
    points: &mut Category,
    (what, n): (&str, usize),
    (args, env): (&[&str], &BTreeMap<String, String>),
    crash_at: Option<usize>,
    check: impl FnOnce(),
) -> Option<String> {
    let started = std::time::Instant::now();
    let (crash, crashing) = watching(bed, || once(bed, args, env, crash_at));
    let label = match (crash_at, crash.as_deref()) {
        (None, _) => format!("{what} {n:>2}, its points all tried"),
        (Some(_), killed) => format!("{what}, crash point {n:>2}: {}", killed.unwrap_or("no crash")),
    };
    points.trial(&label, || {
        assert_eq!(crashing, Vec::<String>::new(), "while the run went");
        if crash.is_some() {
            expire_locks(bed);
            let ((), rerun) = watching(bed, || {
                run_to_completion(bed, args, env);
            });
            assert_eq!(rerun, Vec::<String>::new(), "while it was run again");
        }
        check();
    });
    eprintln!("{label}: tried ({:?})", started.elapsed());
    crash
}

/// The scale-out's first 20 points (the new pods forgetting their history and copying the donor, the slots' assignment
/// to the new group under the alias) and every point of the scale-in.
#[test]
fn a_scale_out_and_in_on_1_1_killed_at_any_early_mutation_converge_on_real_pika_when_run_again() {
    let needed = &["SLAVEOF", "CLEARREPLICATIONID", "/slots/assign/"];
    scale_killed_everywhere(Line::V1_1, &Share { out: Some(1..=20), scale_in: true, needed });
}

/// The scale-out's points from the 21st on (the cutover's promote, the donor's cleanup, the rebalance), to its
/// completion.
#[test]
fn a_scale_out_on_1_1_killed_at_any_later_mutation_converges_on_real_pika_when_run_again() {
    let needed = &["/group/promote/", "DEL"];
    scale_killed_everywhere(Line::V1_1, &Share { out: Some(21..=usize::MAX), scale_in: false, needed });
}

#[test]
fn a_scale_out_and_in_on_1_0_killed_at_any_mutation_converge_on_real_pika_when_run_again() {
    scale_killed_everywhere(Line::V1_0, &Share { out: None, scale_in: true, needed: &[] });
}

/// `member-join` of a new, empty pod killed before each of its mutations in turn (the pod's SLAVEOF and CONFIG
/// REWRITE, its registration in Codis, etcd's records), then run again as KubeBlocks calls it again, on one bed
/// (after each join the pod leaves again): the pod in its shard's group, following the master in sync, nothing
/// under way left in etcd, the master unmoved, a further run changing nothing; every key acknowledged through the
/// fork's proxy on every pod at the end.
#[test]
fn member_join_killed_at_any_mutation_converges_on_real_pika_when_run_again() {
    let mut bed = created(1, 2, Line::V1_1);
    let traffic = Traffic::start(&bed, "crash-join");
    let mut points = Category::new("crash: member-join, real pika and fork");
    let mut tried = Vec::new();
    let mut completed = false;
    for n in 1..=40 {
        let master = bed.master_ordinal(0);
        let joined = bed.add_pod(0);
        let env = member_env(&bed, "JOIN", joined);
        let crash = crash_run(&bed, &["member-join"], &env, n);
        let label = format!("crash point {n:>2}: {}", crash.as_deref().unwrap_or("no crash"));
        points.trial(&label, || {
            if crash.is_some() {
                expire_locks(&bed);
                run_to_completion(&bed, &["member-join"], &env);
            }
            let topology = bed.topology();
            let group = topology.group_of(&bed.shards[0].pod(joined).server());
            assert!(group.is_some(), "the pod joined no group: {topology:?}");
            assert_eq!(bed.master_ordinal(0), master, "the master moved for a replica joining");
            assert_settled(&bed, &["member-join"], &env);
        });
        eprintln!("{label}: tried");
        run_to_completion(&bed, &["member-leave"], &member_env(&bed, "LEAVE", joined));
        bed.remove_pod(0, joined);
        match crash {
            Some(what) => tried.push(what),
            None => {
                completed = true;
                break;
            }
        }
    }
    assert!(completed, "member-join never completed within 40 crash points");
    for needed in ["SLAVEOF", "/group/add/"] {
        assert!(tried.iter().any(|p| p.contains(needed)), "no crash point before {needed}: {tried:?}");
    }
    points.trial("no acknowledged key lost over every crash and rerun, on every pod", || {
        let _ = traffic.finish_on_every_pod(&bed);
    });
    points.finish();
}

/// Whether the watcher marked group `gid` as holding data (what lets it judge replicas at offset 0).
fn held_data(bed: &RealBed, gid: u32) -> bool {
    with_etcd(bed, async |etcd, prefix| {
        let key = pika_action::steps::failover::held_data_key(prefix, gid);
        let mark = etcd.get(&key).await.expect("read the held-data mark");
        mark.is_some_and(|e| e.value != pika_action::steps::failover::NEVER_HELD)
    })
}

/// One failover of shard 0's master, killed with `kill -9`, by a watcher whose crash point is set by `var` = `value`;
/// when it crashed, a new watcher is started as the restarted container would be. Checks that the cluster
/// converged (another pod the master Codis lists and the only pika master among the live pods, the other replica
/// following it in sync, one promote, every key of `ledger` read back through the proxy), then brings the killed pod
/// back through rejoin. Returns the mutation the watcher was killed before, or `None` when it failed over whole.
fn watcher_trial(bed: &mut RealBed, ledger: &testbed::Ledger, var: &str, value: &str) -> Option<String> {
    let patience = Duration::from_secs(60);
    // Every replica holds every key first: a write no replica got is lost with the master whatever the product does.
    let everywhere = || {
        bed.shards[0].pods.iter().all(|pod| {
            let mut conn = pod.connect();
            ledger.acked.iter().all(|(k, v)| conn.command(&["GET", k]).ok().as_deref() == Some(v.as_str()))
        })
    };
    assert!(testbed::cluster::eventually(patience, everywhere), "replicas never caught up");
    let gid = bed.topology().group_of(&bed.shards[0].pods[0].server()).expect("the shard's group").id;
    let mut crashing = bed.start_watcher_with(&[(var, value)]);
    let ready = testbed::cluster::eventually(patience, || {
        crashing.exited() || (crashing.log().contains("leading") && held_data(bed, gid))
    });
    assert!(ready, "the watcher did not lead:\n{}", crashing.log());
    let promoted_before = promotes(bed);
    let old = bed.master_ordinal(0);
    bed.shards[0].pod_mut(old).kill();
    let acted = testbed::cluster::eventually(patience, || {
        let log = crashing.log();
        log.contains("crash point") || log.contains("failover done")
    });
    assert!(acted, "{var}={value}: the watcher neither crashed nor failed over:\n{}", crashing.log());
    let log = crashing.log();
    let marker = ": aborting before ";
    let what = log.lines().filter(|l| l.starts_with("crash point ")).find_map(|l| l.split_once(marker)).map(|(_, w)| w);
    let what = what.map(str::to_owned);
    let restarted = what.as_ref().map(|_| {
        assert!(testbed::cluster::eventually(patience, || crashing.exited()), "crashed but still running");
        bed.start_watcher()
    });
    let watcher = restarted.as_ref().unwrap_or(&crashing);
    let label = what.as_deref().unwrap_or("no crash");
    let master = super::failed_over(bed, old, watcher);
    let live = || {
        let pods = bed.shards[0].pods.iter().filter(|p| p.ordinal != old);
        pods.filter(|p| p.role() == "master").map(|p| p.ordinal).collect::<Vec<_>>()
    };
    let alone = testbed::cluster::eventually(patience, || live() == [master]);
    assert!(alone, "crash before {label}: pika masters {:?}, Codis lists {master}", live());
    let other = bed.shards[0].pods.iter().map(|p| p.ordinal).find(|&o| o != old && o != master).expect("a replica");
    let master_fqdn = bed.shards[0].pod(master).fqdn.clone();
    let follows =
        || ReplicaState::of(&bed.shards[0].pod(other).info_replication()).is_some_and(|s| s.in_sync_with(&master_fqdn));
    assert!(
        testbed::cluster::eventually(patience, follows),
        "crash before {label}: the other replica does not follow the new master in sync:\n{}",
        watcher.log()
    );
    assert_promotes(bed, promoted_before, 1);
    let back = ledger.verify_through_authed(bed.proxies[0].data_addr(), Some(&bed.password));
    assert!(back.is_clean(), "crash before {label}: keys lost: {}", back.summary());
    // The killed pod comes back (rejoin makes it follow the new master), with the watcher still running.
    bed.start_pod(0, old);
    super::assert_healthy(bed);
    drop(restarted);
    drop(crashing);
    what
}

/// The failover watcher killed before each of its mutations in turn — the election lock, the held-data mark, the
/// group's transfer lock, the fence, the promote, the other replica's SLAVEOF and CONFIG REWRITE, the fence's
/// removal, the failover record — while it replaces a master killed with `kill -9` on real pika, then replaced by a
/// new watcher as the restarted container: one new master, alone a pika master, the other replica following it in
/// sync, one promote (a crash after it is finished by repair, never by a second promote), every key written before
/// the kill read back through the fork's proxy; the killed pod back as a replica before the next point. The
/// watcher's own sweeps write at times of their own, so the promote, the SLAVEOF and the fence's write are crashed
/// before by name too when the numbers missed them.
#[test]
fn a_watcher_killed_at_any_step_of_a_failover_is_replaced_by_one_that_converges_on_real_pika() {
    let mut bed = created(1, 3, Line::V1_1);
    let keys: Vec<String> = (0..1000).map(|n| format!("watcher:{n}")).collect();
    let ledger = testbed::Ledger::write_keys_authed(bed.proxies[0].data_addr(), Some(&bed.password), &keys)
        .expect("preload through the proxy");
    assert_eq!(ledger.acked.len(), keys.len(), "preload: {:?}", ledger.errors);
    let mut points = Category::new("crash: failover watcher, real pika and fork");
    let mut tried: Vec<String> = Vec::new();
    let mut completed = false;
    for n in 1..=40 {
        let crash = n.to_string();
        let trial = || watcher_trial(&mut bed, &ledger, "PIKA_ACTION_CRASH_AT", &crash);
        // A point that did not converge leaves the bed in a state no later point can start from.
        let Some(what) = points.trial(format!("crash point {n:>2}"), trial) else { return points.finish() };
        eprintln!("watcher crash point {n:>2}: {}", what.as_deref().unwrap_or("no crash (it completed)"));
        match what {
            Some(what) => tried.push(what),
            None => {
                completed = true;
                break;
            }
        }
    }
    assert!(completed, "the failover never completed within 40 crash points");
    for needed in ["/group/promote/", "SLAVEOF", "etcd compare_and_put"] {
        if tried.iter().any(|p| p.contains(needed)) {
            continue;
        }
        let trial = || watcher_trial(&mut bed, &ledger, "PIKA_ACTION_CRASH_BEFORE", needed);
        let Some(what) = points.trial(format!("crash point before {needed}"), trial) else { return points.finish() };
        let what = what.unwrap_or_else(|| panic!("the failover completed with a crash point set before {needed}"));
        assert!(what.contains(needed), "asked to crash before {needed}, crashed before {what}");
        eprintln!("watcher crash point before {what} (by name)");
        tried.push(what);
    }
    assert!(tried.len() >= 6, "only {} crash points: {tried:?}", tried.len());
    points.finish();
}

/// Runs `f` while another thread reads the dashboard's topology over and over; returns what `f` gave and every
/// breach the reader saw: a slot that had an owner back at group 0 (lost), a slot owned by a group that does not
/// exist, a group owning slots with no server, a server in two groups.
fn watching<T>(bed: &RealBed, f: impl FnOnce() -> T) -> (T, Vec<String>) {
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        let reader = scope.spawn(|| {
            let mut breaches = Vec::new();
            let mut owned: std::collections::BTreeSet<usize> = std::collections::BTreeSet::new();
            loop {
                let stopping = stop.load(std::sync::atomic::Ordering::SeqCst);
                let t = bed.topology();
                for (slot, &gid) in t.slots.iter().enumerate() {
                    if gid == 0 {
                        if owned.contains(&slot) {
                            breaches.push(format!("slot {slot} lost its owner"));
                        }
                        continue;
                    }
                    owned.insert(slot);
                    match t.groups.iter().find(|g| g.id == gid) {
                        None => breaches.push(format!("slot {slot} owned by group {gid}, which does not exist")),
                        Some(g) if g.servers.is_empty() => breaches.push(format!("group {gid} owns slots, no server")),
                        Some(_) => {}
                    }
                }
                let mut servers: Vec<&String> = t.groups.iter().flat_map(|g| &g.servers).collect();
                servers.sort();
                for pair in servers.windows(2).filter(|w| w[0] == w[1]) {
                    breaches.push(format!("{} in two groups", pair[0]));
                }
                if stopping || breaches.len() > 20 {
                    breaches.dedup();
                    return breaches;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        let out = f();
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        (out, reader.join().expect("the topology reader"))
    })
}

/// The runs that create a cluster on `bed`'s line ([`super::create`]): on 1.1 each shard's `post-provision
/// --own-shard`, then the ShardingDefinition's `post-provision`; on 1.0 each shard's component `post-provision`.
fn creation(bed: &RealBed) -> Vec<(Vec<&'static str>, BTreeMap<String, String>)> {
    let mut runs: Vec<(Vec<&'static str>, BTreeMap<String, String>)> = Vec::new();
    for index in 0..bed.shards.len() {
        let args = if bed.line == Line::V1_1 { vec!["post-provision", "--own-shard"] } else { vec!["post-provision"] };
        runs.push((args, bed.env(index)));
    }
    if bed.line == Line::V1_1 {
        runs.push((vec!["post-provision"], bed.env(0)));
    }
    runs
}

/// Cluster creation with run `which` of [`creation`] killed before each of its mutations in turn, each point on a
/// new bed of two shards of two pods (a bed starts in seconds), then run again and the rest run: every shard a
/// group with its pods, its master a pika master, its replica in sync, the slots balanced, no stray group, nothing
/// under way left in etcd, a further run changing nothing; keys written through the fork's proxy afterwards read
/// back. Returns the points tried.
fn creation_killed_everywhere(line: Line, which: usize, points: &mut Category) -> Vec<String> {
    let mut tried = Vec::new();
    for n in 1..=60 {
        let bed = super::bed(2, 2, line, 1);
        let runs = creation(&bed);
        for (args, env) in &runs[..which] {
            run_to_completion(&bed, args, env);
        }
        let (args, env) = &runs[which];
        let crash = crash_run(&bed, args, env, n);
        let label = format!(
            "{line:?} {args:?}, creation run {which}, crash point {n:>2}: {}",
            crash.as_deref().unwrap_or("no crash")
        );
        points.trial(&label, || {
            if crash.is_some() {
                expire_locks(&bed);
                run_to_completion(&bed, args, env);
            }
            for (args, env) in &runs[which + 1..] {
                run_to_completion(&bed, args, env);
            }
            assert_eq!(bed.topology().groups.len(), bed.shards.len(), "stray groups: {:?}", bed.topology());
            assert_settled(&bed, args, env);
            let keys: Vec<String> = (0..200).map(|i| format!("created:{i}")).collect();
            let written = testbed::Ledger::write_keys_authed(bed.proxies[0].data_addr(), Some(&bed.password), &keys)
                .expect("write through the proxy");
            assert_eq!(written.acked.len(), keys.len(), "writes through the proxy: {:?}", written.errors);
            let back = written.verify_through_authed(bed.proxies[0].data_addr(), Some(&bed.password));
            assert!(back.is_clean(), "{}", back.summary());
        });
        eprintln!("{label}: tried");
        match crash {
            Some(what) => tried.push(what),
            None => return tried,
        }
    }
    panic!("{line:?} creation run {which} never completed within 60 crash points");
}

/// Cluster creation killed at any mutation, on both lines: on 1.1 a shard's own registration (`--own-shard`: its
/// group, its replica's SLAVEOF and CONFIG REWRITE, its servers' registration) and the slot assignment; on 1.0 the
/// first component's postProvision, which registers every shard and assigns the slots.
#[test]
fn cluster_creation_killed_at_any_mutation_converges_on_real_pika_when_run_again() {
    let mut points = Category::new("crash: cluster creation, real pika and fork");
    let own = creation_killed_everywhere(Line::V1_1, 0, &mut points);
    let assign = creation_killed_everywhere(Line::V1_1, 2, &mut points);
    let legacy = creation_killed_everywhere(Line::V1_0, 0, &mut points);
    eprintln!("1.1 own shard: {own:?}\n1.1 assignment: {assign:?}\n1.0: {legacy:?}");
    for (tried, needed) in [(&own, "/group/create/"), (&own, "SLAVEOF"), (&assign, "/slots/"), (&legacy, "SLAVEOF")] {
        assert!(tried.iter().any(|p| p.contains(needed)), "no crash point before {needed}: {tried:?}");
    }
    points.finish();
}
