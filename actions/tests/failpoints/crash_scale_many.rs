//! Crash at every step of a change of several shards at once: 2→4 by two shardAdds and 4→2 by two shardRemoves
//! (1.1, called one after another as a reconcile does). The binary is built with `--features failpoints`; for each
//! action of the change and each n = 1, 2, ... the change is replayed on a fresh bed with that action aborted before
//! its n-th external mutation (`PIKA_ACTION_CRASH_AT=n`), the dead run's lock expired, and the change carried on
//! (the crashed action rerun to its end, then the rest, then every action once more as later reconciles would).
//! Every replay must end where a crash-free change does — balanced ±1 over the shards that stay, no slot action
//! left, the removed groups gone, no alias listed, every key written before the change read back and no master
//! holding a key of a slot it does not own — with the slot moves of the whole change, counted from every state
//! change of the double, equal to the one-step minimum: a crash never makes a slot move twice. 2→4 over 64 slots
//! splits each new shard off a donor, so its crash points include every step of a split.

use crate::attack;
use crate::change;
use crate::cluster_api;
use crate::summary;
use crate::support;

use change::{Change, Env};
use cluster_api::{ClusterAnswer, ClusterApi};
use support::{describe, minimum_moves, run, run_to_completion, NAMESPACE};

/// Few slots keep each replay short; the moves still go many to many.
const SLOTS: usize = 64;
/// Keys written through the proxy before the change: every one must read back, and every master must hold the keys
/// of its own slots only (a split copies its donor and then deletes what it does not own).
const KEYS: usize = 300;

/// One replay's bed and the change's actions, in the order KubeBlocks calls them.
struct Case {
    change: Change,
    actions: Vec<(&'static str, Env)>,
    /// Shards that stay, and the shards removed.
    stay: Vec<usize>,
    gone: Vec<usize>,
    /// Kept alive for the removals' reads of the Cluster.
    _api: Option<ClusterApi>,
}

/// 2 shards provisioned, 2 more whose Components exist: their shardAdds.
fn two_to_four() -> Case {
    let mut change = Change::new(support::Bed::builder().shards(2).pods(1), SLOTS);
    run_to_completion("post-provision", &change.env_1_1(0, &[0, 1]));
    change.add_shard(1);
    change.add_shard(1);
    let all = [0, 1, 2, 3];
    let actions = [2, 3]
        .iter()
        .map(|&i| {
            let mut env = change.env_1_1(i, &all);
            env.insert("KB_ADD_SHARD_NAME".into(), change.bed.cluster.shards[i].full.clone());
            ("shard-add", env)
        })
        .collect();
    Case { change, actions, stay: all.to_vec(), gone: Vec::new(), _api: None }
}

/// 4 shards provisioned, the Cluster scaled to 2: the shardRemoves of the last two names.
fn four_to_two() -> Case {
    let change = Change::new(support::Bed::builder().shards(4).pods(1), SLOTS);
    let all = [0, 1, 2, 3];
    run_to_completion("post-provision", &change.env_1_1(0, &all));
    let api = ClusterApi::start(NAMESPACE, &change.bed.cluster.name, ClusterAnswer::Stays(vec![("pk".into(), 2)]));
    let actions = [2, 3]
        .iter()
        .map(|&i| {
            let mut env = change.env_1_1(i, &all);
            env.insert("KB_REMOVE_SHARD_NAME".into(), change.bed.cluster.shards[i].full.clone());
            env.insert("KUBE_API_URL".into(), api.url());
            ("shard-remove", env)
        })
        .collect();
    Case { change, actions, stay: vec![0, 1], gone: vec![2, 3], _api: Some(api) }
}

/// Replays the change with action `k` aborted before its mutation `n`; `None` when that run made fewer than `n`
/// mutations (every crash point of action `k` has been tried).
fn replay(build: &dyn Fn() -> Case, k: usize, n: usize, points: &mut summary::Category) -> Option<()> {
    let c = build();
    let before = c.change.bed.owners();
    let ledger = testbed::Ledger::preload(&c.change.proxy.data_addr(), "pre", KEYS).expect("preload through the proxy");
    c.change.count_moves();
    for (action, env) in &c.actions[..k] {
        run_to_completion(action, env);
    }
    let (action, env) = &c.actions[k];
    let mut crashing = env.clone();
    crashing.insert("PIKA_ACTION_CRASH_AT".into(), n.to_string());
    let out = run(action, &crashing);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let crashed = stderr.contains(&format!("crash point {n}"));
    if !crashed {
        eprintln!("{action} {k} ran to its end at crash point {n}: {}", describe(&out));
        assert!(matches!(out.status.code(), Some(0 | 75)), "{action} {k} without a crash: {}", describe(&out));
    }
    points.trial(format!("{action} {k} crash point {n}"), || {
        if let Some(line) = stderr.lines().find(|l| l.contains("crash point")) {
            println!("{action} {k}: {line}");
        }
        attack::expire_locks(&c.change.bed);
        for (action, env) in &c.actions[k..] {
            run_to_completion(action, env);
        }
        // Later reconciles: a rerun of every action finds its work done or waits for what Codis still migrates.
        for (action, env) in &c.actions {
            run_to_completion(action, env);
        }
        let gids = c.change.gids(&c.stay);
        let minimum = minimum_moves(&before, &gids);
        let moves = c.change.moves();
        assert_eq!(moves, minimum, "{action} {k} crash point {n}: slot moves over the whole change");
        c.change.assert_done(&gids, &c.gone);
        c.change.assert_no_stray_keys();
        ledger.verify_kept(&c.change.proxy.data_addr(), &c.change.bed.codis).unwrap_or_else(|e| panic!("{e}"));
    });
    crashed.then_some(())
}

fn crash_everywhere(what: &str, build: &dyn Fn() -> Case) {
    let mut points = summary::Category::new(format!("crash: {what}"));
    let actions = build().actions.len();
    for k in 0..actions {
        let mut n = 1;
        while replay(build, k, n, &mut points).is_some() {
            n += 1;
            assert!(n < 300, "{what}: action {k} never completed without crashing");
        }
        assert!(n > 3, "{what}: action {k} crashed at only {} point(s): are the fail point hooks wired?", n - 1);
    }
    println!("{what}: {} replays, every one converged with the fewest moves", points.trials());
    points.finish();
}

#[test]
fn two_shard_adds_converge_with_the_fewest_moves_after_a_crash_at_any_step() {
    crash_everywhere("2→4 by shard-add", &two_to_four);
}

#[test]
fn two_shard_removes_converge_with_the_fewest_moves_after_a_crash_at_any_step() {
    crash_everywhere("4→2 by shard-remove", &four_to_two);
}

/// The split's cleanup (a `SCAN` and `DEL` over all of both masters, minutes on a large pika) holds no lock: a run
/// killed in the middle of it leaves the topology lock free, so other actions go on at once, and the rerun cleans up
/// the rest.
#[test]
fn a_run_killed_in_the_splits_cleanup_leaves_the_topology_lock_free() {
    for n in 1..300 {
        // A fresh bed per crash point, so that the n-th mutation is always the same one.
        let c = two_to_four();
        let ledger =
            testbed::Ledger::preload(&c.change.proxy.data_addr(), "pre", KEYS).expect("preload through the proxy");
        let (action, env) = &c.actions[0];
        // The run that begins the split hands off; the next one completes it, cleanup included.
        let began = run(action, env);
        assert_eq!(began.status.code(), Some(75), "the split's first run: {}", describe(&began));
        let mut crashing = env.clone();
        crashing.insert("PIKA_ACTION_CRASH_AT".into(), n.to_string());
        let out = run(action, &crashing);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(stderr.contains(&format!("crash point {n}")), "{action} ran past its cleanup: {}", describe(&out));
        if !stderr.contains(&format!("crash point {n}: aborting before DEL")) {
            continue;
        }
        let held = attack::held_locks(&c.change.bed);
        assert!(held.is_empty(), "a run killed in the split's cleanup left these locks held: {held:?}");
        for (action, env) in &c.actions {
            run_to_completion(action, env);
        }
        c.change.assert_done(&c.change.gids(&c.stay), &c.gone);
        c.change.assert_no_stray_keys();
        ledger.verify_kept(&c.change.proxy.data_addr(), &c.change.bed.codis).unwrap_or_else(|e| panic!("{e}"));
        return;
    }
    panic!("the split never reached its cleanup");
}
