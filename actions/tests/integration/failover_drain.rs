//! A group's master killed while a scale-in drains another shard onto it: the drain holds the cluster's topology
//! lock and waits on that very group, so the failover must not wait for the lock; Codis refuses a promote while a
//! migration batch is on the wire and accepts it between two, so the promote is retried into a gap. 1024 slots, the
//! migration throttled (several batches per slot), keys preloaded and written throughout; afterwards the drain
//! finishes, the leaving shard is gone, and every acknowledged key is read back through the proxy and from the
//! masters Codis lists.

use crate::failover_bed;
use crate::support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use failover_bed::{kill9, ledger_of, outage, FailoverBed, Options, Pulse, PATIENCE};
use support::{describe, eventually, run};
use testbed::codis::slothash::slot_of;
use testbed::codis::SlotState;
use testbed::{Ledger, MigrationHold, Workload, WorkloadOptions};

/// Keys of the first 512 slots: the staying group's from the start.
fn in_staying_group(key: &str) -> bool {
    slot_of(key.as_bytes(), 1024) < 512
}

#[test]
fn a_master_killed_while_a_drain_migrates_onto_its_group_is_replaced_and_the_drain_finishes_losing_nothing() {
    let mut fb = FailoverBed::new(Options::default().shards(2).pods(2));
    let staying = fb.gid(0);
    let leaving = fb.gid(1);
    assert_eq!(fb.bed.codis.snapshot().slots_of(staying), 512);
    let data = fb.proxy.data_addr();
    let mut ledger = Ledger::preload(&data, "pre", 10_000).expect("preload");
    assert_eq!(ledger.acked.len(), 10_000);

    let watcher = fb.watcher("watcher-a", &fb.watch_env("watcher-a", 1000));
    assert!(watcher.wait_log("leading", PATIENCE), "{}", watcher.log());
    let workload = Workload::start(WorkloadOptions::through(std::slice::from_ref(&data)));
    let pulse = Pulse::start_keys(&data, "pulse", Duration::from_millis(2), in_staying_group);
    // Several batches per slot: the drain of 512 slots takes far longer than the failover.
    fb.bed.codis.set_default_migration_ticks(4);
    fb.bed.codis.clear_requests();

    let mut env = fb.env(1);
    env.insert("KB_REMOVE_SHARD_NAME".into(), fb.bed.cluster.shards[1].full.clone());
    env.insert("ALL_SHARDS_POD_FQDNS".into(), fb.bed.cluster.all_shards_of(&[0]));
    env.insert("ACTION_BUDGET_SECONDS".into(), "20".into());
    let old = fb.codis_master(0);
    let drain_done = AtomicBool::new(false);
    let (t0, new, runs) = std::thread::scope(|scope| {
        // KubeBlocks reruns shard-remove until it succeeds.
        let drain = scope.spawn(|| {
            let mut runs = Vec::new();
            for _ in 0..40 {
                let out = run("shard-remove", &env);
                let code = out.status.code();
                runs.push(out);
                if code == Some(0) {
                    drain_done.store(true, Ordering::SeqCst);
                    break;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            runs
        });
        // Kill the staying group's master in the middle of the drain, with a slot migrating onto it.
        let moving = eventually(PATIENCE, || {
            let snap = fb.bed.codis.snapshot();
            snap.slots_of(staying) > 560 && snap.with_action().iter().any(|s| s.action.target_id == staying)
        });
        assert!(moving, "the drain did not get going");
        // Hold one migrating slot with its batch on the wire, as Codis is at that instant: the promote is refused
        // ("slots-migration is running") until the batch ends, and must then go through.
        let held = (0..50)
            .find_map(|_| {
                let snap = fb.bed.codis.snapshot();
                let slot = snap
                    .with_action()
                    .iter()
                    .find(|s| s.action.target_id == staying && s.action.state == SlotState::Migrating)
                    .map(|s| s.id)?;
                fb.bed.codis.hold_migration(slot, MigrationHold::InBatch { after: 0 });
                if eventually(Duration::from_secs(2), || fb.bed.codis.is_migration_held(slot)) {
                    Some(slot)
                } else {
                    // It finished before its next batch: take the next one.
                    fb.bed.codis.release_migration(slot);
                    None
                }
            })
            .expect("a slot held with its batch on the wire");
        let t0 = kill9(&fb.pods(0)[old as usize]);
        assert!(
            watcher.wait_log("slots-migration is running", PATIENCE),
            "the promote was never refused for the batch on the wire:\n{}",
            watcher.log()
        );
        assert_eq!(fb.codis_master(0), old, "promoted while a batch was on the wire");
        fb.bed.codis.release_migration(held);
        let new = fb.wait_new_master(0, old).unwrap_or_else(|| panic!("no new master:\n{}", watcher.log()));
        let at_failover = fb.bed.codis.snapshot().slots_of(leaving);
        assert!(at_failover > 0, "the drain finished before the failover: nothing was tested");
        let runs = drain.join().expect("drain");
        (t0, new, runs)
    });
    fb.pod_mut(0, old).redis.kill();
    assert!(
        drain_done.load(Ordering::SeqCst),
        "the drain never finished: {}",
        runs.iter().map(describe).collect::<Vec<_>>().join("\n")
    );
    let beats = pulse.stop();
    ledger.merge(workload.stop());
    ledger.merge(ledger_of(&beats));

    let snap = fb.bed.codis.snapshot();
    assert!(snap.group(leaving).is_none(), "the leaving group is still there");
    assert_eq!(snap.slots_of(staying), 1024);
    assert_ne!(new, old);
    assert!(fb.wait_converged(0));
    assert!(fb.promotes() >= 1);
    let refused = fb
        .bed
        .codis
        .requests()
        .iter()
        .filter(|r| r.path.starts_with("/api/topom/group/promote/") && r.status == 800)
        .count();
    assert!(refused >= 1, "no promote was refused while the batch ran");

    // Nothing acknowledged is lost, save what was acknowledged within the replication lag before the kill.
    let through = ledger.verify_through(&data);
    assert!(through.errors.is_empty() && through.wrong.is_empty(), "{}", through.summary());
    let pulse_lost: Vec<String> = through.lost.iter().filter(|k| beats.iter().any(|b| &b.key == *k)).cloned().collect();
    failover_bed::assert_lost_only_a_tail(&beats, &pulse_lost, t0);
    assert!(through.lost.len() <= 20, "{}", through.summary());
    let direct = ledger.verify_on_backends(&fb.bed.codis);
    assert_eq!(direct.lost, through.lost, "{}", direct.summary());
    eprintln!(
        "master killed during a drain of 512 slots onto its group: first write to its slots {} ms after; {} shard-remove \
         runs; {} keys checked, {} lost ({:?}); promote requests refused while a batch ran: {refused}",
        outage(&beats, t0).map_or(0, |d| d.as_millis()),
        runs.len(),
        through.checked,
        through.lost.len(),
        through.lost.iter().take(5).collect::<Vec<_>>(),
    );
}
