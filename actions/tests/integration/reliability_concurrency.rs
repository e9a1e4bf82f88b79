//! Topology actions launched at once: two `pika-action` processes started together, as KubeBlocks may (two shards added
//! in one OpsRequest, a shard added while another is removed, an OpsRequest's switchover racing KubeBlocks' own, a
//! restart during a scale-in), each rerun on exit 75 as KubeBlocks requeues it, every pair repeated. While they run, a
//! watcher reads Codis and the redis-servers every few milliseconds: no slot lost or owned by a group that does not
//! exist, no group removed while it owned a slot, no pika master Codis never listed; at the end every group has exactly
//! one master, Codis's `servers[0]`, slots are balanced, and a steady writer's acknowledged writes (replicated to every
//! replica, `WAIT`) are all on the group's master.

use crate::attack;
use crate::rollout;
use crate::summary;
use crate::support;

use std::collections::BTreeMap;
use std::process::Output;
use std::sync::Barrier;
use std::time::Duration;

use attack::{resp, run_until_done, settled, watch, Watched, Writer};
use rollout::{bed_with_master, codis_master, promotes, switchover_env};
use summary::Category;
use support::Bed;
use testbed::{Ledger, Workload, WorkloadOptions};

type Env = BTreeMap<String, String>;

/// Starts every action at the same instant, each in its own thread running the real binary until it exits 0
/// (rerunning on 75); returns each one's outcome.
fn at_once(actions: &[(&str, Env)]) -> Vec<Result<Vec<Output>, String>> {
    let barrier = Barrier::new(actions.len());
    std::thread::scope(|scope| {
        let handles: Vec<_> = actions
            .iter()
            .map(|(action, env)| {
                let barrier = &barrier;
                scope.spawn(move || {
                    barrier.wait();
                    run_until_done(action, env, 15)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("action thread")).collect()
    })
}

fn all_done(outcomes: &[Result<Vec<Output>, String>]) {
    for outcome in outcomes {
        if let Err(e) = outcome {
            panic!("{e}");
        }
    }
}

fn clean(watched: &Watched) {
    assert!(watched.violations.is_empty(), "{:?}", watched.violations);
}

fn env_with(bed: &Bed, index: usize, listed: &[usize], pairs: &[(&str, String)]) -> Env {
    let mut env = bed.env(index);
    env.insert("ALL_SHARDS_POD_FQDNS".into(), bed.cluster.all_shards_of(listed));
    for (k, v) in pairs {
        env.insert((*k).to_owned(), v.clone());
    }
    env
}

fn add_env(bed: &Bed, index: usize, listed: &[usize]) -> Env {
    env_with(bed, index, listed, &[("KB_ADD_SHARD_NAME", bed.cluster.shards[index].full.clone())])
}

fn remove_env(bed: &Bed, index: usize, listed: &[usize]) -> Env {
    env_with(bed, index, listed, &[("KB_REMOVE_SHARD_NAME", bed.cluster.shards[index].full.clone())])
}

fn gids(bed: &Bed, shards: &[usize]) -> Vec<u32> {
    shards.iter().map(|&i| bed.gid(i).unwrap_or_else(|| panic!("shard {i} is not registered"))).collect()
}

/// Exactly one pika master in shard `index`'s group, Codis's `servers[0]`, every other member following it.
fn one_master(bed: &Bed, index: usize) {
    assert!(settled(bed, index, Duration::from_secs(15)), "shard {index}'s group did not settle on one master");
    let gid = bed.gid(index).expect("registered");
    let snap = bed.codis.snapshot();
    let group = snap.group(gid).expect("group");
    let overrides = bed.cluster.overrides();
    let masters: Vec<&str> = group
        .servers
        .iter()
        .filter(|s| {
            overrides.get(&s.server).and_then(|a| attack::role_at(a, bed.cluster.password.as_deref()).ok()).as_deref()
                == Some("master")
        })
        .map(|s| s.server.as_str())
        .collect();
    assert_eq!(masters, [group.master().expect("a master")], "shard {index}: pika masters");
}

#[test]
fn two_shard_adds_then_two_shard_removes_at_once_lose_no_slot_and_end_balanced() {
    let mut bed = Bed::builder().shards(2).pods(2).bed_default();
    run_until_done("post-provision", &bed.env(0), 10).expect("post-provision");
    let live = vec![0, 1];
    let mut adds = Category::new("concurrent: shard-add with shard-add (two shards)");
    let mut removes = Category::new("concurrent: shard-remove with shard-remove (two shards)");
    for rep in 0..2 {
        let (c, d) = (bed.add_shard(1), bed.add_shard(1));
        let listed: Vec<usize> = live.iter().copied().chain([c, d]).collect();
        let pair = [("shard-add", add_env(&bed, c, &listed)), ("shard-add", add_env(&bed, d, &listed))];
        let ok = adds.trial(format!("round {rep}"), || {
            let (outcomes, watched) = watch(&bed, || at_once(&pair));
            all_done(&outcomes);
            clean(&watched);
            bed.assert_registered(c, 0);
            bed.assert_registered(d, 0);
            bed.assert_balanced(&gids(&bed, &listed));
            assert_eq!(bed.codis.snapshot().groups.len(), listed.len(), "a stray group");
        });
        if ok.is_none() {
            break;
        }
        // KubeBlocks removes both from the spec: each removal lists only the shards that stay.
        let pair = [("shard-remove", remove_env(&bed, c, &live)), ("shard-remove", remove_env(&bed, d, &live))];
        let ok = removes.trial(format!("round {rep}"), || {
            let (outcomes, watched) = watch(&bed, || at_once(&pair));
            all_done(&outcomes);
            clean(&watched);
            assert_eq!((bed.gid(c), bed.gid(d)), (None, None), "a removed shard is still registered");
            bed.assert_balanced(&gids(&bed, &live));
            assert_eq!(bed.codis.snapshot().groups.len(), live.len(), "a stray group");
        });
        if ok.is_none() {
            break;
        }
    }
    adds.finish();
    removes.finish();
}

#[test]
fn the_same_shard_added_twice_at_once_and_a_shard_added_while_another_is_removed_converge() {
    let mut bed = Bed::builder().shards(2).pods(2).bed_default();
    run_until_done("post-provision", &bed.env(0), 10).expect("post-provision");
    let mut live = vec![0, 1];
    let mut twice = Category::new("concurrent: shard-add with shard-add (same shard)");
    let mut add_remove = Category::new("concurrent: shard-add with shard-remove");
    for rep in 0..2 {
        let c = bed.add_shard(1);
        let listed: Vec<usize> = live.iter().copied().chain([c]).collect();
        let env = add_env(&bed, c, &listed);
        let ok = twice.trial(format!("round {rep}"), || {
            let (outcomes, watched) =
                watch(&bed, || at_once(&[("shard-add", env.clone()), ("shard-add", env.clone())]));
            all_done(&outcomes);
            clean(&watched);
            bed.assert_registered(c, 0);
            bed.assert_balanced(&gids(&bed, &listed));
            assert_eq!(bed.codis.snapshot().groups.len(), listed.len(), "the shard got two groups");
        });
        if ok.is_none() {
            break;
        }
        // Another shard joins while c leaves: both see the spec without c.
        let d = bed.add_shard(1);
        let next: Vec<usize> = live.iter().copied().chain([d]).collect();
        let pair = [("shard-add", add_env(&bed, d, &next)), ("shard-remove", remove_env(&bed, c, &next))];
        let ok = add_remove.trial(format!("round {rep}"), || {
            let (outcomes, watched) = watch(&bed, || at_once(&pair));
            all_done(&outcomes);
            clean(&watched);
            assert_eq!(bed.gid(c), None, "the removed shard is still registered");
            bed.assert_registered(d, 0);
            bed.assert_balanced(&gids(&bed, &next));
            assert_eq!(bed.codis.snapshot().groups.len(), next.len(), "a stray group");
        });
        if ok.is_none() {
            break;
        }
        live = next;
    }
    twice.finish();
    add_remove.finish();
}

/// Keys written and acknowledged, lost, per round: for the summary and the messages.
fn writes_kept(bed: &Bed, index: usize, prefix: &str, writer: Writer) -> (usize, Vec<u64>) {
    let written = writer.stop();
    let lost = Writer::lost(bed, index, prefix, &written);
    println!(
        "writer {prefix}: {} sent, {} acknowledged, {} of those lost",
        written.sent,
        written.acked.len(),
        lost.len()
    );
    (written.acked.len(), lost)
}

#[test]
fn two_switchovers_of_one_group_at_once_move_the_master_once_and_lose_no_acknowledged_write() {
    let bed = bed_with_master(3, 0);
    let mut pairs = Category::new("concurrent: switchover with switchover (same group)");
    let mut writes = Category::new("writer: acked writes kept, concurrent switchovers");
    // KubeBlocks' own call twice; an OpsRequest's candidate racing KubeBlocks'; two OpsRequests' candidates.
    let variants: [[Option<usize>; 2]; 3] = [[None, None], [None, Some(0)], [Some(0), Some(1)]];
    for (rep, variant) in variants.iter().enumerate() {
        let master = codis_master(&bed);
        let others: Vec<u32> = (0..3).filter(|o| *o != master).collect();
        let envs: Vec<(&str, Env)> =
            variant.iter().map(|c| ("switchover", switchover_env(&bed, master, c.map(|i| others[i])))).collect();
        bed.codis.clear_requests();
        let prefix = format!("switch{rep}");
        let writer = Writer::start(&bed, 0, &prefix);
        std::thread::sleep(Duration::from_millis(300));
        let outcome = pairs.trial(format!("round {rep}: candidates {variant:?}"), || {
            let (outcomes, watched) = watch(&bed, || at_once(&envs));
            all_done(&outcomes);
            clean(&watched);
            assert_eq!(promotes(&bed), 1, "{:?}", bed.mutations());
            let now = codis_master(&bed);
            assert_ne!(now, master, "the master did not move");
            one_master(&bed, 0);
            println!(
                "round {rep}: {} observations, {} with two pika masters",
                watched.observations, watched.two_masters
            );
        });
        std::thread::sleep(Duration::from_millis(300));
        let (acked, lost) = writes_kept(&bed, 0, &prefix, writer);
        writes.judge(format!("round {rep}: {acked} acknowledged"), acked > 0 && lost.is_empty(), || {
            format!("{} of {acked} acknowledged writes lost: {lost:?}", lost.len())
        });
        if outcome.is_none() {
            break;
        }
    }
    pairs.finish();
    writes.finish();
}

/// Drains shard 2 of a fresh 3 × 2 bed while the master of shard `switched` gets its switchover, with a steady
/// writer on shard 0; `rounds` times.
fn switchover_during_drain(switched: usize, rounds: usize) {
    let mut pairs = Category::new(format!("concurrent: switchover (shard {switched} master) with drain of shard 2"));
    let mut writes = Category::new("writer: acked writes kept, switchover during a drain");
    for rep in 0..rounds {
        let bed = Bed::builder().shards(3).pods(2).bed_default();
        run_until_done("post-provision", &bed.env(0), 10).expect("post-provision");
        bed.codis.set_default_migration_ticks(8);
        let shard = &bed.cluster.shards[switched];
        let mut switchover = bed.env(switched);
        switchover.insert("KB_SWITCHOVER_CURRENT_NAME".into(), shard.pod(0).name.clone());
        switchover.insert("KB_SWITCHOVER_CURRENT_FQDN".into(), shard.pod(0).fqdn.clone());
        switchover.insert("KB_SWITCHOVER_ROLE".into(), "master".into());
        let pair = [("shard-remove", remove_env(&bed, 2, &[0, 1])), ("switchover", switchover)];
        let prefix = format!("drain{switched}-{rep}");
        let writer = Writer::start(&bed, 0, &prefix);
        // And clients of every shard through a codis-proxy: keys that move with the drained slots, read back after.
        let proxy = bed.start_proxy();
        let mut ledger = Ledger::preload(&proxy.data_addr(), &format!("{prefix}-pre"), 1000).expect("preload");
        let clients = Workload::start(WorkloadOptions {
            prefix: format!("{prefix}-proxy"),
            ..WorkloadOptions::through(&[proxy.data_addr()])
        });
        std::thread::sleep(Duration::from_millis(300));
        let leaving = bed.gid(2).expect("registered");
        pairs.trial(format!("round {rep}"), || {
            let (outcomes, watched) = watch(&bed, || at_once(&pair));
            all_done(&outcomes);
            clean(&watched);
            assert!(bed.codis.snapshot().group(leaving).is_none(), "the drained group is still there");
            bed.assert_balanced(&gids(&bed, &[0, 1]));
            one_master(&bed, 0);
            one_master(&bed, 1);
            if switched == 0 {
                assert_eq!(codis_master_of(&bed, 0), 1, "shard 0's master did not move");
            }
        });
        std::thread::sleep(Duration::from_millis(300));
        let (acked, lost) = writes_kept(&bed, 0, &prefix, writer);
        writes.judge(format!("round {rep}: {acked} acknowledged"), acked > 0 && lost.is_empty(), || {
            format!("{} of {acked} acknowledged writes lost: {lost:?}", lost.len())
        });
        ledger.merge(clients.stop());
        let kept = ledger.verify_kept(&proxy.data_addr(), &bed.codis);
        writes.judge(format!("round {rep}: {} keys through the proxy", ledger.acked.len()), kept.is_ok(), || {
            kept.clone().unwrap_err()
        });
    }
    writes.finish();
    pairs.finish();
}

#[test]
fn a_switchover_of_a_remaining_groups_master_during_a_drain_loses_no_slot_and_no_acknowledged_write() {
    switchover_during_drain(0, 2);
}

#[test]
fn a_switchover_of_the_draining_groups_master_during_its_drain_succeeds_whichever_runs_first() {
    // KubeBlocks restarts a pod of the shard being removed: the switchover may get the lock only once the drain has
    // removed the group, and must then find nothing to move (exit 0), not fail.
    switchover_during_drain(2, 2);
}

/// The ordinal Codis lists at index 0 of shard `index`'s group.
fn codis_master_of(bed: &Bed, index: usize) -> u32 {
    let snap = bed.codis.snapshot();
    let master = snap.master(bed.gid(index).expect("registered")).expect("a master").to_owned();
    bed.cluster.shards[index].pods.iter().find(|p| p.server() == master).expect("a pod").ordinal
}

#[test]
fn the_writer_really_writes_through_codis_masters() {
    // The steady writer's own check: with no action running, every write is acknowledged and found.
    let bed = bed_with_master(2, 0);
    let writer = Writer::start(&bed, 0, "idle");
    // Progress, not time: wait until the master holds more than ten of the writer's keys (a loaded machine may take
    // long; the deadline only catches a writer that never writes).
    let master = bed.cluster.shards[0].pod(0).redis.addr();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while resp(&master, None, &["DBSIZE"]).ok().and_then(|n| n.trim_start_matches(':').parse::<u64>().ok()).unwrap_or(0)
        <= 10
    {
        assert!(std::time::Instant::now() < deadline, "the writer wrote nothing in 60 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (acked, lost) = writes_kept(&bed, 0, "idle", writer);
    assert!(acked > 10, "only {acked} writes acknowledged");
    assert!(lost.is_empty(), "{lost:?}");
    let addr = bed.cluster.shards[0].pod(1).redis.addr();
    assert!(resp(&addr, None, &["GET", "idle:1"]).is_ok_and(|v| v == "1"), "the replica does not have the writes");
}
