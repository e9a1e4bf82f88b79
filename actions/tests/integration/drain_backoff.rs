//! A long drain under KubeBlocks' retries: 1.0.x preTerminate and every 1.1+ sharding action are requeued with
//! controller-runtime's per-item exponential backoff (5 ms, doubling, at most 1000 s), so a drain that needs many
//! exit-75 runs waits longer and longer between them. The migration must go on inside Codis while no run is there —
//! every run hands Codis the whole remaining plan — so that the backoff only delays the final removal of the group,
//! never the data movement. Watched through the Codis double, whose executor migrates on its own clock.

use crate::support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use support::{describe, minimum_moves, moved, run, run_to_completion, Bed};
use testbed::DoubleOptions;

/// controller-runtime's `ItemExponentialFailureRateLimiter` as KubeBlocks uses it: the pause before the n-th retry
/// (n from 0) is 5 ms · 2ⁿ, at most 1000 s.
fn backoff(failures: u32) -> Duration {
    Duration::from_millis(5).saturating_mul(2u32.saturating_pow(failures)).min(Duration::from_secs(1000))
}

/// Slots migrated by `create-range` requests, summed from the double's request log.
fn slots_created(bed: &Bed) -> usize {
    bed.mutations()
        .iter()
        .filter_map(|p| p.strip_prefix("/api/topom/slots/action/create-range/{xauth}/"))
        .map(|rest| {
            let parts: Vec<usize> = rest.split('/').map(|n| n.parse().unwrap()).collect();
            parts[1] - parts[0] + 1
        })
        .sum()
}

fn remove_env(bed: &Bed, index: usize, budget: u64) -> BTreeMap<String, String> {
    let mut env = bed.env(index);
    env.insert("KB_REMOVE_SHARD_NAME".into(), bed.cluster.shards[index].full.clone());
    env.insert("ACTION_BUDGET_SECONDS".into(), budget.to_string());
    env
}

/// One pause between two runs: how long, and how many slots left the draining group meanwhile.
struct Pause {
    after_run: usize,
    length: Duration,
    left_before: usize,
    moved: usize,
}

#[test]
fn a_drain_of_512_slots_under_kubeblocks_backoff_keeps_migrating_while_no_run_is_there() {
    // Three shards of 512 slots (1536 in all, not Codis's 1024, so that exactly 512 leave and two groups receive):
    // the third leaves, 256 slots to each of the others, two migrations at a time.
    let bed = Bed::builder().shards(3).pods(1).bed(DoubleOptions { max_slot_num: 1536, ..DoubleOptions::default() });
    run_to_completion("post-provision", &bed.env(0));
    let leaving = bed.gid(2).unwrap();
    let remaining = [bed.gid(0).unwrap(), bed.gid(1).unwrap()];
    assert_eq!(bed.codis.snapshot().slots_of(leaving), 512);
    let before = bed.owners();
    // About 100 ms per slot (10 ms ticks): the drain takes far longer than one 2 s budget.
    bed.codis.set_default_migration_ticks(6);
    bed.codis.clear_requests();
    let env = remove_env(&bed, 2, 2);

    let started = Instant::now();
    // When Codis had moved the last slot, seen from outside every run.
    let watching = AtomicBool::new(true);
    let (runs, running, pauses, drained_at) = std::thread::scope(|scope| {
        let watcher = scope.spawn(|| {
            while watching.load(Ordering::SeqCst) {
                let snap = bed.codis.snapshot();
                if snap.slots_of(leaving) == 0 && snap.with_action().is_empty() {
                    return Some(started.elapsed());
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            None
        });
        // Stops the watcher even when a check below panics, or the scope would wait for it forever.
        struct StopOnDrop<'a>(&'a AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::SeqCst);
            }
        }
        let guard = StopOnDrop(&watching);
        let (runs, running, pauses) = run_under_backoff(&bed, &env, leaving, remaining.len());
        drop(guard);
        (runs, running, pauses, watcher.join().unwrap())
    });
    let wall = started.elapsed();

    // The end state: every slot moved once, with the fewest moves, each migration created once (never re-planned).
    let snap = bed.codis.snapshot();
    assert!(snap.group(leaving).is_none(), "group {leaving} is still there");
    bed.assert_balanced(&remaining);
    assert_eq!(moved(&before, &bed.owners()), 512);
    assert_eq!(moved(&before, &bed.owners()), minimum_moves(&before, &remaining));
    assert_eq!(slots_created(&bed), 512, "every migration was handed to codis exactly once");
    let long = pauses.iter().filter(|p| p.length >= LONG && p.left_before > 0).count();
    assert!(long > 0, "no long pause happened mid-drain; the test did not exercise the backoff");

    let paused: Duration = pauses.iter().map(|p| p.length).sum();
    let moved_in_pauses: usize = pauses.iter().map(|p| p.moved).sum();
    eprintln!(
        "drain of 512 slots, 2 s budget, KubeBlocks backoff: {runs} runs, wall {wall:.1?} = {running:.1?} in runs + \
         {paused:.1?} of backoff; codis had moved every slot at {:.1?} (the rest waited for the next run to remove \
         the group); {moved_in_pauses} slots moved while no run was there",
        drained_at.unwrap_or(wall)
    );
}

/// A pause this long between runs must see the drain move on.
const LONG: Duration = Duration::from_millis(500);

/// Runs shard-remove as KubeBlocks requeues it until it exits 0, pausing by [`backoff`] after each exit 75 and
/// checking after every long pause that Codis moved slots meanwhile: more than one round of the plan (one slot per
/// target) could account for. Returns the runs, the time spent in them and the pauses.
fn run_under_backoff(
    bed: &Bed,
    env: &BTreeMap<String, String>,
    leaving: u32,
    targets: usize,
) -> (usize, Duration, Vec<Pause>) {
    let mut running = Duration::ZERO;
    let mut pauses = Vec::new();
    for runs in 1.. {
        let run_started = Instant::now();
        let out = run("shard-remove", env);
        running += run_started.elapsed();
        match out.status.code() {
            Some(0) => return (runs, running, pauses),
            Some(75) => {}
            _ => panic!("run {runs}: {}", describe(&out)),
        }
        let pause = backoff(u32::try_from(runs - 1).unwrap());
        // A drain that stood still between runs would only meet ever longer pauses: give up rather than wait them.
        assert!(pause < Duration::from_secs(30), "the drain still runs after {runs} runs: {}", describe(&out));
        let left_before = bed.codis.snapshot().slots_of(leaving);
        std::thread::sleep(pause);
        let left_after = bed.codis.snapshot().slots_of(leaving);
        let p = Pause { after_run: runs, length: pause, left_before, moved: left_before - left_after };
        if p.length >= LONG && p.left_before > 0 {
            assert!(
                p.moved > targets + 1,
                "after run {}: {} slot(s) moved during a pause of {:?} with {} left",
                p.after_run,
                p.moved,
                p.length,
                p.left_before
            );
        }
        pauses.push(p);
    }
    unreachable!()
}

#[test]
fn a_drain_that_starts_beside_a_migration_into_the_leaving_group_hands_codis_everything_else_at_once() {
    let bed = Bed::builder().shards(3).pods(1).bed_default();
    run_to_completion("post-provision", &bed.env(0));
    let (g0, leaving) = (bed.gid(0).unwrap(), bed.gid(2).unwrap());
    // A slot of group 0 is migrating into the leaving group and stays in `migrating` for a long while (a shardAdd
    // of the shard now being removed never finished); pending ones behind it are cancelled by the drain.
    let a = bed.codis.snapshot().slots.iter().find(|s| s.group_id == g0).unwrap().id;
    bed.codis.set_migration_ticks(a, 400);
    let x = bed.codis.xauth().to_owned();
    assert!(bed.codis.call("PUT", &format!("/api/topom/slots/action/create/{x}/{a}/{leaving}")).is_ok());
    assert!(bed
        .codis
        .wait_for(Duration::from_secs(5), |s| s.slots[a].action.state == testbed::codis::SlotState::Migrating)
        .is_some());
    bed.codis.set_default_migration_ticks(4);

    let out = run("shard-remove", &remove_env(&bed, 2, 2));
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    // Everything the leaving group owns is queued in Codis already, though the plan could not be made in full.
    let snap = bed.codis.snapshot();
    let idle: Vec<usize> =
        snap.slots.iter().filter(|s| s.group_id == leaving && s.action.state.is_nothing()).map(|s| s.id).collect();
    assert!(idle.is_empty(), "slots of the leaving group left without a migration: {idle:?}");
    assert!(!snap.slots[a].action.state.is_nothing(), "slot {a} is still arriving");
    // Codis lets a group take part in one migration at a time, so nothing leaves until the arriving slot has
    // landed; then the queue moves on with no run there.
    assert!(bed.codis.wait_for(Duration::from_secs(15), |s| s.slots[a].action.state.is_nothing()).is_some());
    let left = bed.codis.snapshot().slots_of(leaving);
    std::thread::sleep(Duration::from_millis(800));
    assert!(bed.codis.snapshot().slots_of(leaving) + 2 < left, "codis stood still between runs");

    bed.codis.set_migration_ticks(a, 1);
    run_to_completion("shard-remove", &remove_env(&bed, 2, 40));
    let snap = bed.codis.snapshot();
    assert!(snap.group(leaving).is_none());
    assert_ne!(snap.slots[a].group_id, leaving);
    bed.assert_balanced(&[g0, bed.gid(1).unwrap()]);
}
