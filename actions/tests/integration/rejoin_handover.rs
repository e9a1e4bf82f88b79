//! `rejoin`, run by the pika container before pika starts: a pod that comes back never costs a key. Over the test
//! bed (real redis-servers standing in for pika, real etcd, the Codis double and a proxy double): a replica back on
//! an empty volume resyncs; a master back on an empty volume, or restarted in place with no switchover before,
//! hands mastership to the most advanced live replica first, and no acknowledged key is lost; a master with no
//! replica left starts with its data, or is refused when its volume is empty and its group held data; the dashboard
//! or etcd down fails closed. No watcher runs here: these are starts faster than any detection.
//!
//! An empty volume is the redis-server's config rewritten fresh and its append-only directory (what `PIKA_DATA_DIR`
//! names) removed; "restarted with its data" is a redis-server with an append-only file flushed at every write.

use crate::failover_bed;
use crate::support;

use failover_bed::{expect_ok, kill9, lag_now, sampling, EventsApi, FailoverBed, Options, PATIENCE};
use support::{describe, eventually};
use testbed::Ledger;

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Writes `n` keys through the proxy and waits until the replicas have all of them.
fn preload(fb: &FailoverBed, n: usize) -> Ledger {
    let ledger = Ledger::preload(&fb.proxy.data_addr(), "pre", n).expect("preload");
    assert_eq!(ledger.acked.len(), n, "{:?}", ledger.errors);
    let master = fb.codis_master(0);
    assert!(eventually(PATIENCE, || lag_now(fb, 0, master) == Some(0)), "replicas did not catch up");
    ledger
}

/// Every key of `ledger` is read back through the proxy and from the masters Codis lists.
fn assert_no_key_lost(fb: &FailoverBed, ledger: &Ledger) {
    ledger.verify_kept(&fb.proxy.data_addr(), &fb.bed.codis).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_replica_back_on_an_empty_volume_rejoins_and_resyncs_the_data() {
    let mut fb = FailoverBed::new(Options::default().shards(1).pods(3));
    let ledger = preload(&fb, 2000);
    fb.bed.codis.clear_requests();
    fb.lose_volume(0, 2);
    let out = fb.rejoin(0, 2, &[]);
    expect_ok("rejoin", &out);
    assert!(stdout(&out).contains("follows"), "{}", describe(&out));
    fb.pod_mut(0, 2).redis.restart();
    assert!(fb.wait_converged(0));
    assert_eq!(fb.codis_master(0), 0);
    assert_eq!(fb.promotes(), 0);
    // The replica has every key itself.
    let on_replica = ledger.verify_through(&fb.pods(0)[2].redis.addr());
    assert!(on_replica.is_clean(), "{}", on_replica.summary());
    assert_no_key_lost(&fb, &ledger);
}

#[test]
fn the_master_back_on_an_empty_volume_hands_over_first_and_no_key_is_lost() {
    let mut fb = FailoverBed::new(Options::default().shards(1).pods(3));
    let ledger = preload(&fb, 3000);
    fb.bed.codis.clear_requests();
    fb.lose_volume(0, 0);
    let old_server = fb.pods(0)[0].server();

    let (out, samples) = sampling(&fb, 0, || fb.rejoin(0, 0, &[]));
    expect_ok("rejoin of the master", &out);
    let new = fb.codis_master(0);
    assert_ne!(new, 0, "codis still lists the empty master: {}", describe(&out));
    assert_eq!(fb.promotes(), 1);
    let new_server = fb.pods(0)[new as usize].server();
    assert!(stdout(&out).contains(&format!("this pod starts as a replica of {new_server}")), "{}", describe(&out));
    // Before the empty pod's pika even starts, the other replica follows the new master: no replica is ever
    // pointed at an empty master.
    assert!(fb.wait_converged(0));
    assert!(samples.iter().all(|s| s.masters.len() <= 1), "two masters during the handover");
    let conf = std::fs::read_to_string(fb.pods(0)[0].redis.dir().join("redis.conf")).unwrap();
    let new_port = fb.pods(0)[new as usize].redis.port();
    assert!(conf.contains(&format!("replicaof 127.0.0.1 {new_port}")), "{conf}");

    fb.pod_mut(0, 0).redis.restart();
    assert!(fb.wait_converged(0));
    assert_no_key_lost(&fb, &ledger);
    let on_old = ledger.verify_through(&fb.pods(0)[0].redis.addr());
    assert!(on_old.is_clean(), "the old master resynced from the new one: {}", on_old.summary());

    // Recorded as a failover by rejoin, for topology; a rerun changes nothing.
    let text = stdout(&support::run("topology", &fb.env(0)));
    assert!(text.contains(&format!("{old_server} -> {new_server}")) && text.contains("by rejoin"), "{text}");
    fb.pod_mut(0, 0).redis.kill();
    fb.bed.codis.clear_requests();
    let again = fb.rejoin(0, 0, &[]);
    expect_ok("rejoin again", &again);
    assert!(fb.bed.mutations().is_empty(), "{:?}", fb.bed.mutations());
}

#[test]
fn the_master_restarted_in_place_with_its_data_and_no_switchover_hands_over_and_no_key_is_lost() {
    let mut fb = FailoverBed::new(Options::default().shards(1).pods(3));
    fb.persist(0, 0);
    let ledger = preload(&fb, 3000);
    fb.bed.codis.clear_requests();
    kill9(&fb.pods(0)[0]);
    fb.pod_mut(0, 0).redis.kill();
    assert!(std::fs::read_dir(fb.data_dir(0, 0)).unwrap().next().is_some(), "the volume keeps its data");

    let out = fb.rejoin(0, 0, &[]);
    expect_ok("rejoin of the master", &out);
    let new = fb.codis_master(0);
    assert_ne!(new, 0, "{}", describe(&out));
    assert_eq!(fb.promotes(), 1);
    assert!(stderr(&out).contains("handed over before starting"), "{}", describe(&out));
    fb.pod_mut(0, 0).redis.restart();
    assert!(fb.wait_converged(0));
    assert_eq!(fb.roles(0).values().filter(|r| *r == "master").count(), 1);
    assert_no_key_lost(&fb, &ledger);
}

#[test]
fn a_master_whose_replicas_are_all_down_starts_with_the_data_on_its_volume() {
    let mut fb = FailoverBed::new(Options::default().shards(1).pods(3));
    fb.persist(0, 0);
    let ledger = preload(&fb, 1000);
    for ordinal in [1, 2] {
        fb.pod_mut(0, ordinal).redis.kill();
    }
    fb.bed.codis.clear_requests();
    kill9(&fb.pods(0)[0]);
    fb.pod_mut(0, 0).redis.kill();
    let out = fb.rejoin(0, 0, &[]);
    expect_ok("rejoin", &out);
    assert!(stdout(&out).contains("starts with the data on this volume"), "{}", describe(&out));
    assert!(fb.bed.mutations().is_empty(), "{:?}", fb.bed.mutations());
    fb.pod_mut(0, 0).redis.restart();
    assert_eq!(fb.pods(0)[0].redis.role(), "master");
    let back = ledger.verify_through(&fb.proxy.data_addr());
    assert!(back.is_clean(), "{}", back.summary());
}

#[test]
fn an_empty_master_with_no_replica_left_is_refused_naming_its_group_when_the_group_held_data() {
    let mut fb = FailoverBed::new(Options::default().shards(1).pods(2));
    let gid = fb.gid(0);
    // The watcher marks the group as holding data once it sees its master take writes.
    let watcher = fb.watcher("watcher-a", &fb.watch_env("watcher-a", 1000));
    preload(&fb, 500);
    assert!(eventually(PATIENCE, || held_data(&fb, gid)), "never marked:\n{}", watcher.log());
    drop(watcher);

    fb.pod_mut(0, 1).redis.kill();
    fb.lose_volume(0, 0);
    fb.bed.codis.clear_requests();
    let api = EventsApi::start();
    let out = fb.rejoin(0, 0, &[("KUBE_API_URL", api.url())]);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let err = stderr(&out);
    assert!(err.contains(&format!("refusing to start {}", fb.pods(0)[0].name)), "{err}");
    assert!(err.contains(&format!("codis group {gid}'s master")) && err.contains("volume is empty"), "{err}");
    assert!(fb.bed.mutations().is_empty(), "{:?}", fb.bed.mutations());
    let event = api.wait_for("RefusedStart").expect("a RefusedStart event");
    assert_eq!(event["involvedObject"]["kind"], "Pod");
    assert_eq!(event["involvedObject"]["name"], fb.pods(0)[0].name.as_str());
    assert!(event["message"].as_str().unwrap_or_default().contains(&format!("group {gid}")), "{event}");
}

#[test]
fn an_empty_master_of_a_group_that_never_held_a_key_starts_and_without_a_watchers_word_is_refused() {
    // One pod, no writes, its slots assigned. No watcher ever looked: nobody can say the group is empty.
    let mut fb = FailoverBed::new(Options::default().shards(1).pods(1));
    let gid = fb.gid(0);
    fb.lose_volume(0, 0);
    let out = fb.rejoin(0, 0, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(stderr(&out).contains(&format!("codis group {gid}'s master")), "{}", describe(&out));

    // The watcher saw its master at offset 0: nothing to lose, it starts.
    fb.pod_mut(0, 0).redis.restart();
    let watcher = fb.watcher("watcher-a", &fb.watch_env("watcher-a", 1000));
    assert!(eventually(PATIENCE, || mark(&fb, gid).is_some()), "never marked:\n{}", watcher.log());
    assert_eq!(mark(&fb, gid).as_deref(), Some(pika_action::steps::failover::NEVER_HELD));
    assert!(!held_data(&fb, gid));
    drop(watcher);
    fb.lose_volume(0, 0);
    let out = fb.rejoin(0, 0, &[]);
    expect_ok("rejoin", &out);
    assert!(stdout(&out).contains("never held a key"), "{}", describe(&out));
}

fn mark(fb: &FailoverBed, gid: u32) -> Option<String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let etcd = crate::support::connect_etcd(&fb.bed.cluster.etcd.endpoint()).await.ok()?;
        let prefix = pika_action::clients::etcd::cluster_prefix(failover_bed::namespace(), &fb.bed.cluster.name);
        etcd.get(&pika_action::steps::failover::held_data_key(&prefix, gid)).await.ok()?.map(|e| e.value)
    })
}

#[test]
fn with_codis_unreachable_rejoin_fails_closed_and_never_starts_a_master() {
    let mut fb = FailoverBed::new(Options::default().shards(1).pods(2));
    kill9(&fb.pods(0)[0]);
    fb.pod_mut(0, 0).redis.kill();
    fb.pod_mut(0, 1).redis.kill();
    fb.bed.codis.pause();
    let budget = [("ACTION_BUDGET_SECONDS", "8".to_owned())];
    // The master's config names no master: it would start as one. Not without Codis.
    let out = fb.rejoin(0, 0, &budget);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(stderr(&out).contains("not starting until codis answers"), "{}", describe(&out));
    // The replica's config names its master: starting as that replica is safe.
    let out = fb.rejoin(0, 1, &budget);
    expect_ok("rejoin of the replica", &out);
    assert!(stdout(&out).contains("starting as the replica of"), "{}", describe(&out));
    fb.bed.codis.resume().expect("dashboard back");
}

#[test]
fn a_master_that_must_hand_over_while_etcd_is_down_does_not_start_until_it_can() {
    let mut fb = FailoverBed::new(Options::default().shards(1).pods(3));
    let ledger = preload(&fb, 500);
    fb.lose_volume(0, 0);
    fb.bed.cluster.etcd.stop();
    fb.bed.codis.clear_requests();
    let out = fb.rejoin(0, 0, &[("ACTION_BUDGET_SECONDS", "8".to_owned())]);
    assert_ne!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(stderr(&out).contains("etcd"), "{}", describe(&out));
    assert!(fb.bed.mutations().is_empty(), "nothing promoted without the fence: {:?}", fb.bed.mutations());
    assert_eq!(fb.codis_master(0), 0);

    fb.bed.cluster.etcd.resume();
    let out = fb.rejoin(0, 0, &[]);
    expect_ok("rejoin once etcd is back", &out);
    assert_ne!(fb.codis_master(0), 0);
    fb.pod_mut(0, 0).redis.restart();
    assert!(fb.wait_converged(0));
    assert_no_key_lost(&fb, &ledger);
}

fn held_data(fb: &FailoverBed, gid: u32) -> bool {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let Ok(etcd) =
            crate::support::connect_etcd(&fb.bed.cluster.etcd.endpoint()).await
        else {
            return false;
        };
        let prefix = pika_action::clients::etcd::cluster_prefix(failover_bed::namespace(), &fb.bed.cluster.name);
        matches!(etcd.get(&pika_action::steps::failover::held_data_key(&prefix, gid)).await, Ok(Some(e)) if e.value != pika_action::steps::failover::NEVER_HELD)
    })
}
