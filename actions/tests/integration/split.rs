//! A split half-way, looked at from outside: after the shardAdd that began it has handed off (exit 75, another shard
//! of the change still to be filled), the new group lists its donor's master under the alias, already owns its
//! share and serves every key from the donor's pika, no slot has migrated, and a switchover of the donor's master is
//! refused (nothing promoted) meanwhile. Then the change completes as usual and the switchover goes through.

use std::collections::BTreeMap;

use crate::change::{self, Change};
use crate::support::{self, describe, run, run_to_completion};

const SLOTS: usize = 64;

fn add_env(c: &Change, index: usize) -> BTreeMap<String, String> {
    let mut env = c.env_1_1(index, &[0, 1, 2, 3]);
    env.insert("KB_ADD_SHARD_NAME".into(), c.bed.cluster.shards[index].full.clone());
    env
}

#[test]
fn a_split_half_way_serves_every_key_through_the_donor_and_holds_off_the_donors_switchover() {
    let mut c = Change::new(support::Bed::builder().shards(2).pods(2), SLOTS);
    run_to_completion("post-provision", &c.env_1_1(0, &[0, 1]));
    c.add_shard(2);
    c.add_shard(2);
    let (ledger, writer) = c.start_writing(300);
    let (rounds_before, _) = c.bed.codis.executor_rounds();

    let out = run("shard-add", &add_env(&c, 2));
    assert_eq!(out.status.code(), Some(75), "the split's first run hands off: {}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("splitting off its donor"), "{}", describe(&out));

    // Half-way: the alias is the new group's master, the share is the new group's, the donor's pika serves it.
    let snap = c.bed.codis.snapshot();
    let gid = c.bed.gid(2).expect("the new shard's group");
    let group = snap.groups.iter().find(|g| g.id == gid).expect("the group");
    let alias = group.servers[0].server.clone();
    assert!(change::is_alias(&alias), "the new group's master is {alias}, not an alias");
    let donor_master = alias.replacen(".:", ":", 1);
    let donor = snap.groups.iter().find(|g| g.servers[0].server == donor_master).expect("the donor group");
    let owned = c.bed.owners().iter().filter(|&&g| g == gid).count();
    assert_eq!(owned, SLOTS / 4, "the new group owns its final share at once");
    assert_eq!(c.bed.codis.real_addr(&alias), c.bed.codis.real_addr(&donor_master), "the alias dials the donor");
    assert_eq!(c.bed.codis.executor_rounds().0, rounds_before, "no slot migrated");

    // The donor's master stays where it is while the split copies it.
    let d = (0..2).find(|&i| c.bed.gid(i) == Some(donor.id)).expect("the donor shard");
    let pod = c.bed.cluster.shards[d].pods.iter().find(|p| p.server() == donor_master).expect("the donor's master pod");
    let mut env = c.bed.env(d);
    env.insert("KB_SWITCHOVER_CURRENT_NAME".into(), pod.name.clone());
    env.insert("KB_SWITCHOVER_CURRENT_FQDN".into(), pod.fqdn.clone());
    env.insert("KB_SWITCHOVER_ROLE".into(), "master".into());
    let out = run("switchover", &env);
    // A switchover has one call (switchover_one_call.rs): one that cannot finish is exit 1, nothing promoted.
    assert_eq!(out.status.code(), Some(1), "switchover of the donor's master mid-split: {}", describe(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("is splitting off") && stderr.contains("nothing was promoted"), "{}", describe(&out));
    assert_eq!(c.bed.codis.snapshot().master(donor.id), Some(donor_master.as_str()), "the donor's master moved");

    run_to_completion("shard-add", &add_env(&c, 3));
    run_to_completion("shard-add", &add_env(&c, 2));
    let gids = c.gids(&[0, 1, 2, 3]);
    c.assert_done(&gids, &[]);
    c.assert_no_stray_keys();
    assert_eq!(c.bed.codis.executor_rounds().0, rounds_before, "no slot migrated in the whole change");
    c.check_no_key_lost(ledger, writer);

    // Once the split is done, the same switchover goes through.
    let out = run("switchover", &env);
    assert_eq!(out.status.code(), Some(0), "switchover after the split: {}", describe(&out));
    assert_ne!(c.bed.codis.snapshot().master(donor.id), Some(donor_master.as_str()), "the donor's master stayed");
}

/// A new shard whose pod already holds a key (a disk that came back, a pod reused) is never overwritten by a copy of
/// its donor: it registers the usual way, its slots migrate onto it, and the key is still there.
#[test]
fn a_new_pod_that_holds_keys_is_registered_the_usual_way_and_keeps_them() {
    let mut c = Change::new(support::Bed::builder().shards(1).pods(1), SLOTS);
    run_to_completion("post-provision", &c.env_1_1(0, &[0]));
    let new = c.add_shard(1);
    let pod = &c.bed.cluster.shards[new].pods[0];
    assert!(pod.redis.command(&["SET", "left-behind", "1"]).starts_with("+OK"));
    let (ledger, writer) = c.start_writing(200);
    let (rounds_before, _) = c.bed.codis.executor_rounds();
    let mut env = c.env_1_1(new, &[0, 1]);
    env.insert("KB_ADD_SHARD_NAME".into(), c.bed.cluster.shards[new].full.clone());
    run_to_completion("shard-add", &env);
    assert!(c.bed.codis.executor_rounds().0 > rounds_before, "the slots were not migrated");
    let gids = c.gids(&[0, 1]);
    c.assert_done(&gids, &[]);
    c.check_no_key_lost(ledger, writer);
    let pod = &c.bed.cluster.shards[new].pods[0];
    assert_eq!(pod.redis.command(&["GET", "left-behind"]).lines().last(), Some("1"), "the pod's own key is gone");
}
