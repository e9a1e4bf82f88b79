//! `member-leave` on real pika with the Codis double in fork mode as the dashboard (its request log counts the
//! promotes and mutations, which the fork's dashboard does not record): the leaving pod's server leaves its group; a
//! master is replaced first (KubeBlocks' switchover before it may have failed, its error ignored); the last server of
//! a group that owns slots is never deleted; the fork may reorder the group by itself, so what Codis says now
//! decides each step. The same behaviour on the fork's own dashboard: `real_pika::a_replica_leaving_*` and the
//! emulation's replica scale-in.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use testbed::cluster::eventually;
use testbed::real::bed::RealBed;
use testbed::DoubleOptions;

use super::on_double::{bed_with_master, codis, codis_master, follows, mutations, pika_masters, promotes, stdout};
use super::{describe, with};

fn leave_env(bed: &RealBed, ordinal: u32) -> BTreeMap<String, String> {
    let pod = bed.shards[0].pod(ordinal);
    with(bed.env(0), &[("KB_LEAVE_MEMBER_POD_NAME", pod.name.clone()), ("KB_LEAVE_MEMBER_POD_FQDN", pod.fqdn.clone())])
}

/// The ordinals of shard 0's pods Codis lists in group `gid`.
fn listed(bed: &RealBed, gid: u32) -> BTreeSet<u32> {
    let snap = codis(bed).snapshot();
    let group = snap.group(gid).expect("group");
    bed.shards[0]
        .pods
        .iter()
        .filter(|p| group.servers.iter().any(|s| s.server == p.server()))
        .map(|p| p.ordinal)
        .collect()
}

#[test]
fn member_leave_of_a_replica_removes_it_and_a_rerun_changes_nothing() {
    let bed = bed_with_master(3, 0, DoubleOptions::default());
    let gid = bed.topology().group_of(&bed.shards[0].pods[0].server()).expect("a group").id;
    let out = bed.run(&["member-leave"], &leave_env(&bed, 2));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(listed(&bed, gid), BTreeSet::from([0, 1]));
    assert_eq!(codis_master(&bed), 0);
    assert_eq!(promotes(&bed), 0);

    codis(&bed).clear_requests();
    let out = bed.run(&["member-leave"], &leave_env(&bed, 2));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(stdout(&out).contains("no codis group"), "{}", describe(&out));
    assert!(mutations(&bed).is_empty(), "{:?}", mutations(&bed));
}

#[test]
fn member_leave_of_the_master_promotes_a_replica_first_then_removes_it() {
    // Scale-in removes the highest ordinal; here it is the master, and KubeBlocks' switchover did not run.
    let bed = bed_with_master(3, 2, DoubleOptions::default());
    let gid = bed.topology().group_of(&bed.shards[0].pods[0].server()).expect("a group").id;
    // Keys written through the fork's proxy, which the double pushes each change to.
    let proxy = bed.proxies[0].data_addr().to_owned();
    let keys: Vec<String> = (0..200).map(|n| format!("leave:{n}")).collect();
    let ledger = testbed::Ledger::write_keys_authed(&proxy, Some(&bed.password), &keys).expect("writes");
    assert_eq!(ledger.acked.len(), keys.len(), "{:?}", ledger.errors);
    let out = bed.run(&["member-leave"], &leave_env(&bed, 2));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let check = ledger.verify_through_authed(&proxy, Some(&bed.password));
    assert!(check.is_clean(), "keys lost through the proxy: {}", check.summary());
    assert_eq!(promotes(&bed), 1);
    assert_eq!(listed(&bed, gid), BTreeSet::from([0, 1]));
    // A replica whose binlog goes furthest first (the writes just before may leave one ahead for a moment on pika),
    // then the ordinal rule (nothing above 2, so the lowest below): either replica, never the leaving pod.
    let promoted = codis_master(&bed);
    assert!(promoted == 0 || promoted == 1, "pod {promoted} promoted");
    let other = 1 - promoted;
    assert!(follows(&bed, other, promoted), "pod {other} does not follow the new master");
    assert!(follows(&bed, 2, promoted), "the old master was not demoted before it left");
    assert_eq!(pika_masters(&bed), BTreeSet::from([promoted]));

    codis(&bed).clear_requests();
    assert_eq!(bed.run(&["member-leave"], &leave_env(&bed, 2)).status.code(), Some(0));
    assert!(mutations(&bed).is_empty(), "{:?}", mutations(&bed));
}

#[test]
fn member_leave_of_a_dead_master_promotes_a_replica_that_followed_it() {
    // The pod is already gone: no replica's link can be up, so the link is not required: the one whose binlog goes
    // furthest is promoted (ranked in unit tests of transfer.rs), and the other follows it.
    let mut bed = bed_with_master(3, 0, DoubleOptions::default());
    let gid = bed.topology().group_of(&bed.shards[0].pods[0].server()).expect("a group").id;
    assert_eq!(bed.shards[0].pod(0).command(&["SET", "k", "written-before-the-crash"]), "+OK");
    for ordinal in [1, 2] {
        assert!(eventually(Duration::from_secs(10), || {
            bed.shards[0].pod(ordinal).command(&["GET", "k"]).contains("written-before-the-crash")
        }));
    }
    bed.shards[0].pod_mut(0).kill();

    let out = bed.run(&["member-leave"], &leave_env(&bed, 0));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(listed(&bed, gid), BTreeSet::from([1, 2]));
    let promoted = codis_master(&bed);
    let other = if promoted == 1 { 2 } else { 1 };
    assert_eq!(pika_masters(&bed), BTreeSet::from([promoted]), "Codis's master is the one pika master");
    assert!(follows(&bed, other, promoted), "pod {other} does not follow the promoted pod {promoted}");
    assert!(bed.shards[0].pod(promoted).command(&["GET", "k"]).contains("written-before-the-crash"));
}

#[test]
fn member_leave_of_a_pod_codis_never_knew_is_success() {
    let mut bed = bed_with_master(2, 0, DoubleOptions::default());
    let stranger = bed.add_pod(0);
    let out = bed.run(&["member-leave"], &leave_env(&bed, stranger));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(stdout(&out).contains("no codis group"), "{}", describe(&out));
    assert!(mutations(&bed).is_empty(), "{:?}", mutations(&bed));
    assert_eq!(codis_master(&bed), 0);
    assert_eq!(bed.shards[0].pod(stranger).role(), "master", "the stranger was not touched");
}

#[test]
fn member_leave_never_deletes_the_master_of_a_group_that_owns_slots() {
    let bed = bed_with_master(1, 0, DoubleOptions::default());
    let gid = bed.topology().group_of(&bed.shards[0].pods[0].server()).expect("a group").id;
    let slots = bed.topology().slots_of(gid);
    let out = bed.run(&["member-leave"], &leave_env(&bed, 0));
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("owns {slots} slot(s)")) && stderr.contains("never deleted"), "{stderr}");
    assert_eq!(listed(&bed, gid), BTreeSet::from([0]));
    assert!(mutations(&bed).is_empty(), "{:?}", mutations(&bed));
}

#[test]
fn member_leave_follows_the_fork_when_it_fails_the_master_over_and_reorders_the_group() {
    // The fork's own HA, as the chart configures it with its failover off: a dead master is switched after a few
    // failed checks, on the double's clock.
    let mut bed = bed_with_master(3, 0, DoubleOptions { dead_checks: 3, ..DoubleOptions::default() });
    let gid = bed.topology().group_of(&bed.shards[0].pods[0].server()).expect("a group").id;
    // The master dies; the fork's HA swaps a replica into index 0 and re-points the other by itself.
    bed.shards[0].pod_mut(0).kill();
    assert!(eventually(Duration::from_secs(30), || codis_master(&bed) != 0), "the fork did not fail over");
    let promoted = codis_master(&bed);
    let other = if promoted == 1 { 2 } else { 1 };
    assert!(follows(&bed, other, promoted), "the fork did not re-point pod {other}");

    // KubeBlocks decided to remove `promoted` when it was a replica; Codis now says it is the master.
    codis(&bed).clear_requests();
    let out = bed.run(&["member-leave"], &leave_env(&bed, promoted));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(promotes(&bed), 1);
    assert_eq!(listed(&bed, gid), BTreeSet::from([0, other]), "the dead pod stays until it leaves itself");
    assert_eq!(codis_master(&bed), other);
    assert!(follows(&bed, promoted, other), "the leaving pod was not demoted");

    // The dead pod leaves too (it is no master: plain removal).
    let out = bed.run(&["member-leave"], &leave_env(&bed, 0));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(listed(&bed, gid), BTreeSet::from([other]));
}
