//! A split half-way, looked at from outside: after the shardAdd that began it has handed off (exit 75, another shard
//! of the change still to be filled), the new group lists its donor's master under the alias, already owns its
//! share and serves every key from the donor's pika, no slot has migrated, and a switchover of the donor's master is
//! refused (nothing promoted) meanwhile. Then the change completes as usual (the other shard's shardAdd completes
//! both splits) and the switchover goes through.

use std::collections::BTreeMap;

use crate::change::{self, Change};
use crate::failover_bed::{self, kill9, FailoverBed, Options, PATIENCE};
use crate::support::PodFixture;
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
    let mut env = c.env(d);
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
    // The run that completed shard 3's split completed shard 2's beside it, before KubeBlocks calls shard 2's again.
    let snap = c.bed.codis.snapshot();
    let servers = &snap.groups.iter().find(|g| g.id == gid).expect("the group").servers;
    assert!(
        servers.iter().all(|gs| !change::is_alias(&gs.server)),
        "shard 2's split was left to its own shardAdd: {servers:?}"
    );
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

/// Two shards of two pods over [`SLOTS`] slots, two more added; the first new shard's split begun and handed off
/// (its alias the new group's master), keys preloaded before and written through the alias after, and every
/// replica caught up with the donor's master. Returns the bed, the keys, the donor shard and its master's ordinal.
fn half_way_split() -> (FailoverBed, testbed::Ledger, usize, u32) {
    let double = testbed::DoubleOptions { max_slot_num: SLOTS, ..testbed::DoubleOptions::default() };
    let mut fb = FailoverBed::new(Options { double, ..Options::default().shards(2).pods(2) });
    for _ in 0..2 {
        fb.bed.add_shard(2);
    }
    for (server, real) in fb.bed.cluster.overrides() {
        fb.proxy.set_override(&server, &real);
    }
    let mut ledger = testbed::Ledger::preload(&fb.proxy.data_addr(), "pre", 300).expect("preload");

    let out = run("shard-add", &shard_add_env(&fb, 2));
    assert_eq!(out.status.code(), Some(75), "the split's first run hands off: {}", describe(&out));
    let alias = fb.bed.codis.snapshot().master(fb.gid(2)).expect("the new group's master").to_owned();
    assert!(change::is_alias(&alias), "the new group's master is {alias}, not an alias");
    let donor_master = alias.replacen(".:", ":", 1);
    let d = (0..2).find(|&i| fb.pods(i).iter().any(|p| p.server() == donor_master)).expect("the donor shard");
    let old = fb.codis_master(d);
    // Keys of every slot, the split's share among them, written through the alias to the donor's pika.
    ledger.merge(testbed::Ledger::preload(&fb.proxy.data_addr(), "mid", 300).expect("writes mid-split"));

    // Everything acknowledged reaches every copy before the master goes: these tests are about the split, not the
    // replication lag any failover may lose.
    let master = fb.pods(d).iter().find(|p| p.ordinal == old).expect("the donor's master pod");
    let target = testbed::process::info_field(&master.redis.info_replication(), "master_repl_offset");
    // The split's pods that copy the donor: those the new group lists (the begin leaves the others out).
    let snapshot = fb.bed.codis.snapshot();
    let copies: Vec<&PodFixture> = fb
        .pods(d)
        .iter()
        .chain(fb.pods(2).iter().filter(|p| snapshot.server(&p.server()).is_some()))
        .filter(|p| p.server() != donor_master)
        .collect();
    assert!(copies.len() > fb.pods(d).len() - 1, "no pod of the new shard copies the donor");
    assert!(
        support::eventually(PATIENCE, || copies
            .iter()
            .all(|p| { testbed::process::info_field(&p.redis.info_replication(), "slave_repl_offset") == target })),
        "the copies did not catch up with the donor's master"
    );
    (fb, ledger, d, old)
}

/// The donor's master (pod `old` of shard `d`) killed and back on an empty volume, as its pika container starts it:
/// `rejoin` (which must succeed), then the server; returns what `rejoin` printed.
fn back_on_an_empty_volume(fb: &mut FailoverBed, d: usize, old: u32) -> std::process::Output {
    fb.lose_volume(d, old);
    let out = fb.rejoin(d, old, &[]);
    assert_eq!(out.status.code(), Some(0), "rejoin of the donor's master: {}", describe(&out));
    fb.pod_mut(d, old).redis.restart();
    out
}

fn shard_add_env(fb: &FailoverBed, index: usize) -> BTreeMap<String, String> {
    let mut env = fb.env(index);
    env.insert("KB_ADD_SHARD_NAME".into(), fb.bed.cluster.shards[index].full.clone());
    env
}

/// Completes the change begun by [`half_way_split`] and checks it: no alias left, balanced, no master holding a key
/// of a slot its group does not own, every key read back through the proxy and from its group's master.
fn finish_and_check(fb: &FailoverBed, ledger: &testbed::Ledger, log: &dyn Fn() -> String) {
    run_to_completion("shard-add", &shard_add_env(fb, 3));
    run_to_completion("shard-add", &shard_add_env(fb, 2));
    let snap = fb.bed.codis.snapshot();
    for g in &snap.groups {
        assert!(g.servers.iter().all(|gs| !change::is_alias(&gs.server)), "group {} lists an alias", g.id);
    }
    let gids: Vec<u32> = (0..4).map(|i| fb.gid(i)).collect();
    fb.bed.assert_balanced(&gids);
    let owners = fb.bed.owners();
    for &g in &gids {
        let real = fb.bed.codis.real_addr(snap.master(g).expect("a master"));
        let pod = fb.bed.cluster.shards.iter().flat_map(|s| &s.pods).find(|p| p.redis.addr() == real).expect("a pod");
        let strays = change::keys_not_owned(&pod.redis, &owners, g);
        assert!(strays.is_empty(), "group {g} holds {} key(s) of slots it does not own", strays.len());
    }
    ledger.verify_kept(&fb.proxy.data_addr(), &fb.bed.codis).unwrap_or_else(|e| panic!("{e}\n{}", log()));
}

/// The donor's master dies half-way through a split and stays dead, the watcher running: it replaces the donor's
/// master with its replica and the new group's (the alias, dead with it) with the most advanced pod copying it; the
/// change then completes, and every key written before the kill, including those written to the split's slots
/// through the alias, is still there, on the group that owns its slot and nowhere else.
#[test]
fn a_donor_master_killed_half_way_through_a_split_is_failed_over_in_both_groups_and_no_key_is_lost() {
    let (mut fb, ledger, d, old) = half_way_split();
    let watcher = fb.watcher("watcher-a", &fb.watch_env("watcher-a", 800));
    assert!(watcher.wait_log("leading", PATIENCE), "{}", watcher.log());
    kill9(&fb.pods(d)[old as usize]);
    fb.pod_mut(d, old).redis.kill();
    assert!(fb.wait_new_master(d, old).is_some(), "the donor's master was not replaced:\n{}", watcher.log());
    assert!(
        support::eventually(PATIENCE, || !change::is_alias(fb.bed.codis.snapshot().master(fb.gid(2)).unwrap_or(""))),
        "the new group still has the dead alias as its master:\n{}",
        watcher.log()
    );
    finish_and_check(&fb, &ledger, &|| watcher.log());
}

/// The donor's master comes back on an empty volume half-way through a split, before any watcher acted: `rejoin`
/// hands the donor group to its replica and the pod restarts as that replica's replica, so the alias now names a
/// replica. The split must not promote a copy that is behind the donor's new master, nor lose the keys the donor
/// holds for the split's slots; the change completes with every key kept.
#[test]
fn a_donor_master_back_on_an_empty_volume_half_way_through_a_split_loses_no_key() {
    let (mut fb, ledger, d, old) = half_way_split();
    let out = back_on_an_empty_volume(&mut fb, d, old);
    assert_ne!(fb.codis_master(d), old, "codis still lists the empty master: {}", describe(&out));
    finish_and_check(&fb, &ledger, &|| String::new());
}

/// As above, with the watcher running: the alias answers again, but as a replica (writes to the split's slots are
/// refused), and the watcher fails the new group over to its most advanced pod as it would a dead master, so writes
/// to the split's slots resume before any run of the split; then the change completes with every key kept.
#[test]
fn with_the_watcher_a_split_whose_alias_names_a_replica_is_failed_over_and_takes_writes_before_its_next_run() {
    let (mut fb, mut ledger, d, old) = half_way_split();
    let watcher = fb.watcher("watcher-a", &fb.watch_env("watcher-a", 800));
    assert!(watcher.wait_log("leading", PATIENCE), "{}", watcher.log());
    // Gone and back before the watcher's detection time: only rejoin acts on the donor.
    back_on_an_empty_volume(&mut fb, d, old);

    let gid = fb.gid(2);
    assert!(
        support::eventually(PATIENCE, || !change::is_alias(fb.bed.codis.snapshot().master(gid).unwrap_or(""))),
        "the new group's master is still the alias, which names a replica:\n{}",
        watcher.log()
    );
    assert!(watcher.log().contains("names a replica"), "{}", watcher.log());
    // A key of the split's share takes a write through the proxy now, before the split's next run.
    let owners = fb.bed.owners();
    let key = (0..)
        .map(|i| format!("after-{i}"))
        .find(|k| owners[testbed::codis::slothash::slot_of(k.as_bytes(), owners.len())] == gid)
        .expect("a key of the split's share");
    let written = support::eventually(PATIENCE, || {
        testbed::Ledger::write_keys(&fb.proxy.data_addr(), std::slice::from_ref(&key)).is_ok_and(|l| {
            let ok = l.acked.len() == 1;
            if ok {
                ledger.merge(l);
            }
            ok
        })
    });
    assert!(written, "no write to the split's share got through:\n{}", watcher.log());
    finish_and_check(&fb, &ledger, &|| watcher.log());
}

/// A healthy split with the watcher running: the alias answers as the master it stands for, so the watcher marks the
/// new group as holding data through it, fails neither group over, and the change completes beside it (promote and
/// cleanup included) with every key kept. A watcher that took every split's alias for a failing master would never
/// mark the group through the alias, and would replace it.
#[test]
fn the_watcher_leaves_a_healthy_split_alone_and_the_change_completes_beside_it() {
    let (fb, ledger, d, old) = half_way_split();
    let gid = fb.gid(2);
    let alias = fb.bed.codis.snapshot().master(gid).expect("the new group's master").to_owned();
    let watcher = fb.watcher("watcher-a", &fb.watch_env("watcher-a", 800));
    assert!(watcher.wait_log("leading", PATIENCE), "{}", watcher.log());
    assert!(
        support::eventually(PATIENCE, || failover_bed::held_data(&fb, gid)),
        "the watcher never saw the alias answer as the new group's master:\n{}",
        watcher.log()
    );
    assert_eq!(
        fb.bed.codis.snapshot().master(gid),
        Some(alias.as_str()),
        "the watcher replaced a healthy split's alias:\n{}",
        watcher.log()
    );
    assert_eq!(fb.codis_master(d), old, "the watcher replaced the donor's master:\n{}", watcher.log());
    finish_and_check(&fb, &ledger, &|| watcher.log());
    assert!(!watcher.log().contains("failing over"), "the watcher failed a group over:\n{}", watcher.log());
}
