//! `member-leave` over the Codis double (upstream and Pika-fork behaviour), real redis-servers and real etcd: the
//! leaving pod's server leaves its group; a master is replaced first (KubeBlocks' switchover before it may have failed,
//! its error ignored); the last server of a group that owns slots is never deleted; the fork may reorder the group by
//! itself, so what Codis says now decides each step.

use crate::rollout;
use crate::support;

use std::collections::BTreeSet;
use std::time::Duration;

use rollout::{bed_with_master, codis_master, leave_env, pika_masters, promotes, stdout};
use support::{describe, eventually, run, run_to_completion, Bed};
use testbed::DoubleOptions;

/// The servers Codis lists in shard 0's group, by ordinal.
fn listed(bed: &Bed, gid: u32) -> BTreeSet<u32> {
    let snap = bed.codis.snapshot();
    let group = snap.group(gid).expect("group");
    bed.cluster.shards[0]
        .pods
        .iter()
        .filter(|p| group.servers.iter().any(|s| s.server == p.server()))
        .map(|p| p.ordinal)
        .collect()
}

fn follows(bed: &Bed, ordinal: u32, master: u32) -> bool {
    let port = bed.cluster.shards[0].pod(master).redis.port();
    eventually(Duration::from_secs(15), || {
        bed.cluster.shards[0].pod(ordinal).redis.master().is_some_and(|(h, p, up)| h == "127.0.0.1" && p == port && up)
    })
}

#[test]
fn member_leave_of_a_replica_removes_it_and_a_rerun_changes_nothing() {
    let bed = bed_with_master(3, 0);
    let gid = bed.gid(0).unwrap();
    let out = run("member-leave", &leave_env(&bed, 2));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(listed(&bed, gid), BTreeSet::from([0, 1]));
    assert_eq!(codis_master(&bed), 0);
    assert_eq!(promotes(&bed), 0);

    bed.codis.clear_requests();
    let out = run("member-leave", &leave_env(&bed, 2));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(stdout(&out).contains("no codis group"), "{}", describe(&out));
    assert!(bed.mutations().is_empty(), "{:?}", bed.mutations());
}

#[test]
fn member_leave_of_the_master_promotes_a_replica_first_then_removes_it() {
    // Scale-in removes the highest ordinal; here it is the master, and KubeBlocks' switchover did not run.
    let bed = bed_with_master(3, 2);
    let gid = bed.gid(0).unwrap();
    let out = run("member-leave", &leave_env(&bed, 2));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(promotes(&bed), 1);
    assert_eq!(listed(&bed, gid), BTreeSet::from([0, 1]));
    // The ordinal rule: nothing above 2, so the lowest below.
    assert_eq!(codis_master(&bed), 0);
    assert!(follows(&bed, 1, 0), "pod 1 does not follow the new master");
    assert!(follows(&bed, 2, 0), "the old master was not demoted before it left");
    assert_eq!(pika_masters(&bed), BTreeSet::from([0]));

    bed.codis.clear_requests();
    assert_eq!(run("member-leave", &leave_env(&bed, 2)).status.code(), Some(0));
    assert!(bed.mutations().is_empty(), "{:?}", bed.mutations());
}

#[test]
fn member_leave_of_a_dead_master_promotes_a_replica_that_followed_it() {
    // The pod is already gone: no replica's link can be up, so the link is not required (the one with the most
    // data ranks first: unit-tested in transfer.rs; here both have everything, and the ordinal rule picks 2).
    let mut bed = bed_with_master(3, 0);
    let gid = bed.gid(0).unwrap();
    let _ = bed.cluster.shards[0].pod(0).redis.command(&["SET", "k", "written-before-the-crash"]);
    for ordinal in [1, 2] {
        assert!(eventually(Duration::from_secs(5), || {
            bed.cluster.shards[0].pod(ordinal).redis.command(&["GET", "k"]).contains("written-before-the-crash")
        }));
    }
    bed.cluster.shards[0].pods.iter_mut().find(|p| p.ordinal == 0).unwrap().redis.kill();

    let out = run("member-leave", &leave_env(&bed, 0));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(listed(&bed, gid), BTreeSet::from([1, 2]));
    assert_eq!(codis_master(&bed), 2);
    assert!(follows(&bed, 1, 2));
    assert!(bed.cluster.shards[0].pod(2).redis.command(&["GET", "k"]).contains("written-before-the-crash"));
}

#[test]
fn member_leave_of_a_pod_codis_never_knew_is_success() {
    let mut bed = bed_with_master(2, 0);
    let stranger = bed.add_pod(0);
    let out = run("member-leave", &leave_env(&bed, stranger));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(stdout(&out).contains("no codis group"), "{}", describe(&out));
    assert!(bed.mutations().is_empty(), "{:?}", bed.mutations());
    assert_eq!(codis_master(&bed), 0);
    assert_eq!(bed.cluster.shards[0].pod(stranger).redis.role(), "master", "the stranger was not touched");
}

#[test]
fn member_leave_never_deletes_the_master_of_a_group_that_owns_slots() {
    let bed = Bed::builder().shards(1).pods(1).bed_default();
    run_to_completion("post-provision", &bed.env(0));
    let gid = bed.gid(0).unwrap();
    bed.codis.clear_requests();
    let out = run("member-leave", &leave_env(&bed, 0));
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("owns 1024 slot(s)") && stderr.contains("never deleted"), "{stderr}");
    assert_eq!(listed(&bed, gid), BTreeSet::from([0]));
    assert!(bed.mutations().is_empty(), "{:?}", bed.mutations());
}

#[test]
fn member_leave_follows_the_fork_when_it_fails_the_master_over_and_reorders_the_group() {
    let options = DoubleOptions { fork: true, dead_checks: 3, ..DoubleOptions::default() };
    let mut bed = Bed::builder().shards(1).pods(3).bed(options);
    run_to_completion("post-provision", &bed.env(0));
    let gid = bed.gid(0).unwrap();
    // The master dies; the fork's HA swaps a replica into index 0 and re-points the other by itself.
    bed.cluster.shards[0].pods.iter_mut().find(|p| p.ordinal == 0).unwrap().redis.kill();
    assert!(eventually(Duration::from_secs(20), || codis_master(&bed) != 0), "the fork did not fail over");
    let promoted = codis_master(&bed);
    let other = if promoted == 1 { 2 } else { 1 };
    assert!(follows(&bed, other, promoted), "the fork did not re-point pod {other}");

    // KubeBlocks decided to remove `promoted` when it was a replica; Codis now says it is the master.
    bed.codis.clear_requests();
    let out = run("member-leave", &leave_env(&bed, promoted));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(promotes(&bed), 1);
    assert_eq!(listed(&bed, gid), BTreeSet::from([0, other]), "the dead pod stays until it leaves itself");
    assert_eq!(codis_master(&bed), other);
    assert!(follows(&bed, promoted, other), "the leaving pod was not demoted");

    // The dead pod leaves too (it is no master: plain removal).
    let out = run("member-leave", &leave_env(&bed, 0));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(listed(&bed, gid), BTreeSet::from([other]));
}
