//! `switchover` where Codis misbehaves, on real pika with the Codis double in fork mode as the dashboard (the faults
//! are the double's: a promote left in progress, a promote answered after the client gave up) and etcd fences a
//! crashed run left; the fork's codis-proxy beside it, and one that died registered. The transfers themselves on the
//! fork's own dashboard: `real_pika::switchover_on_*`, the emulation's Switchover OpsRequest and the crash test of a
//! master switchover.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use testbed::real::bed::RealBed;
use testbed::{DoubleOptions, Fault};

use super::on_double::{bed_with_master, candidate, codis, codis_master, mutations, pika_masters, promotes, stdout};
use super::{describe, with_etcd};

/// The etcd key of shard 0's group fence.
fn fence_key(prefix: &str, bed: &RealBed) -> String {
    let gid = bed.topology().group_of(&bed.shards[0].pods[0].server()).expect("a group").id;
    pika_action::steps::transfer::fence_key(prefix, gid)
}

/// Reads (`None` value) or writes the group's fence in etcd, as a crashed run would have left it.
fn fence(bed: &RealBed, write: Option<&str>) -> Option<String> {
    with_etcd(bed, async |etcd, prefix| {
        let key = fence_key(prefix, bed);
        if let Some(value) = write {
            etcd.put(&key, value, Some(Duration::from_secs(30))).await.expect("write the fence");
        }
        etcd.get(&key).await.expect("read the fence").map(|e| e.value)
    })
}

fn server(bed: &RealBed, ordinal: u32) -> String {
    bed.shards[0].pod(ordinal).server()
}

/// The environment of `switchover` for pod `ordinal` of shard 0 with the role its probe gives it.
fn switchover_env(bed: &RealBed, ordinal: u32) -> BTreeMap<String, String> {
    let pod = bed.shards[0].pod(ordinal);
    let role = if codis_master(bed) == ordinal { "master" } else { "slave" };
    let mut env = bed.env(0);
    env.insert("KB_SWITCHOVER_CURRENT_NAME".into(), pod.name.clone());
    env.insert("KB_SWITCHOVER_CURRENT_FQDN".into(), pod.fqdn.clone());
    env.insert("KB_SWITCHOVER_ROLE".into(), role.into());
    env
}

/// Codis lists `master` first and the pikas agree: one pika master, every other pod replicating it in sync.
fn assert_one_master(bed: &RealBed, master: u32) {
    bed.assert_registered(0, master);
    assert_eq!(pika_masters(bed), BTreeSet::from([master]), "pika masters");
}

#[test]
fn a_fence_left_by_a_crash_before_the_promote_is_honoured_by_the_rerun() {
    // A run that crashed between writing the fence and promoting leaves the fence and nothing else. The rule would
    // pick ordinal 2 (equal binlogs, the ordinal rule); the fence names 1, so the rerun promotes 1, and no second
    // member is ever promoted.
    let bed = bed_with_master(3, 0, DoubleOptions::default());
    let target = server(&bed, 1);
    assert_eq!(fence(&bed, Some(&target)), Some(target.clone()));
    let out = bed.run(&["switchover"], &switchover_env(&bed, 0));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(stdout(&out).contains("earlier run fenced"), "{}", describe(&out));
    assert_eq!(promotes(&bed), 1);
    assert_one_master(&bed, 1);
    assert_eq!(fence(&bed, None), None);
}

#[test]
fn a_fence_naming_a_member_that_can_no_longer_take_over_is_replaced() {
    let mut bed = bed_with_master(3, 0, DoubleOptions::default());
    fence(&bed, Some(&server(&bed, 1)));
    bed.shards[0].pod_mut(1).kill();
    let out = bed.run(&["switchover"], &switchover_env(&bed, 0));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(codis_master(&bed), 2);
    assert_eq!(fence(&bed, None), None);
    // Pod 1 comes back through rejoin (the chart's start), as a replica of the new master.
    bed.start_pod(0, 1);
    assert_one_master(&bed, 2);
}

#[test]
fn a_promote_left_in_progress_is_resumed_with_the_same_address() {
    for (caller, what) in [(0, "the master's switchover"), (2, "a replica's switchover")] {
        let bed = bed_with_master(3, 0, DoubleOptions::default());
        let gid = bed.topology().group_of(&server(&bed, 0)).expect("a group").id;
        // The rule would pick 2; Codis was left promoting 1 (a proxy push failed mid-promote).
        codis(&bed).promote_in_progress(gid, &server(&bed, 1)).expect("a promote left in progress");
        let out = bed.run(&["switchover"], &switchover_env(&bed, caller));
        // With no record of how the left promote was made, the members are re-pointed with a full resync; on pika
        // that can outlast the call, which then says so (KubeBlocks ignores a failed switchover) and leaves Codis
        // routing to the resumed target, the members converging by themselves.
        let unfinished = String::from_utf8_lossy(&out.stderr)
            .contains(&format!("did not finish within its one call (group {gid}: waiting for"))
            && String::from_utf8_lossy(&out.stderr)
                .contains(&format!("codis routes group {gid} to the new master {}", server(&bed, 1)));
        assert!(
            out.status.code() == Some(0) || (out.status.code() == Some(1) && unfinished),
            "{what}: {}",
            describe(&out)
        );
        let promoted: BTreeSet<String> = codis(&bed)
            .requests()
            .into_iter()
            .filter(|r| r.path.starts_with("/api/topom/group/promote/"))
            .map(|r| r.path.rsplit('/').next().unwrap_or_default().to_owned())
            .collect();
        assert_eq!(promoted, BTreeSet::from([server(&bed, 1)]), "{what}");
        assert_one_master(&bed, 1);
    }
}

#[test]
fn a_promote_whose_answer_is_lost_is_confirmed_before_it_is_sent_again() {
    let bed = bed_with_master(3, 0, DoubleOptions::default());
    // The dashboard answers the first promote only after the client gave up (5 s), then performs it anyway.
    codis(&bed).fail_next_on("/api/topom/group/promote/", 1, Fault::Timeout(Duration::from_secs(6)));
    let out = bed.run(&["switchover"], &switchover_env(&bed, 0));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let master = codis_master(&bed);
    assert_ne!(master, 0, "{}", describe(&out));
    assert_one_master(&bed, master);
}

#[test]
fn a_proxy_codis_cannot_reach_refuses_the_transfer_before_anything_is_written() {
    // A promote pushes the group's slots to every proxy; with one dead it would stall in `preparing`.
    let mut bed = bed_with_master(2, 0, DoubleOptions::default());
    let (token, admin) = bed.topology().proxies.first().cloned().expect("the fork's proxy registered");
    bed.proxies[0].kill();
    let dead = testbed::cluster::eventually(Duration::from_secs(10), || {
        codis(&bed).call("GET", "/topom/stats").body.contains("connection refused")
    });
    assert!(dead, "the double never saw the proxy die");
    codis(&bed).clear_requests();
    let out = bed.run(&["switchover"], &switchover_env(&bed, 0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(stderr.contains(&admin) && stderr.contains("nothing was changed"), "{stderr}");
    assert!(mutations(&bed).is_empty(), "{:?}", mutations(&bed));
    assert_eq!(fence(&bed, None), None);
    assert_eq!(codis_master(&bed), 0);

    // Once the dead proxy is removed, the same call transfers the master.
    let removed = codis(&bed).call("PUT", &format!("/api/topom/proxy/remove/{{xauth}}/{token}/1"));
    assert!(removed.is_ok(), "{removed:?}");
    let out = bed.run(&["switchover"], &switchover_env(&bed, 0));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(codis_master(&bed), 1);
}

#[test]
fn an_explicit_candidate_becomes_master_where_the_rule_would_choose_another() {
    let bed = bed_with_master(3, 0, DoubleOptions::default());
    let out = bed.run(&["switchover"], &candidate(switchover_env(&bed, 0), &bed, 1));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(stdout(&out).contains("the requested candidate"), "{}", describe(&out));
    assert_eq!(promotes(&bed), 1);
    assert_one_master(&bed, 1);
    assert_eq!(fence(&bed, None), None, "the fence is removed once the group converged");

    // The same request again (KubeBlocks retries, or the OpsRequest is re-run): pod 0 is a replica now, nothing moves.
    codis(&bed).clear_requests();
    let out = bed.run(&["switchover"], &candidate(switchover_env(&bed, 0), &bed, 1));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(mutations(&bed).is_empty(), "{:?}", mutations(&bed));
}
