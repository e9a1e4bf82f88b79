//! Many shards in one change: 4→8 and 8→4 over 1024 slots on both KubeBlocks lines, the additions or removals
//! started concurrently or one after another (as a 1.1 reconcile calls them), in shuffled order, with a writer going
//! through a proxy the whole time. Every slot move is counted from the double's state changes (a slot that moves
//! twice counts twice) and must add up to the one-step minimum over the final topology; the slots end balanced ±1
//! over the groups that stay, no slot action is left, the removed groups are gone, and every acknowledged key reads
//! back, through the proxy and from the owning group's master.

use crate::change;
use crate::cluster_api;
use crate::support;

use std::time::Duration;

use testbed::MigrationHold;

use change::{concurrently, one_after_another, recorded_leavers, shuffled, Change, Env, HeldLock};
use cluster_api::{ClusterAnswer, ClusterApi};
use support::{eventually, minimum_moves, run_to_completion, NAMESPACE};

const SLOTS: usize = 1024;
const PRELOAD: usize = 3000;

/// 4 shards of 2 pods provisioned on `line`, and 4 more shards whose Components exist now.
fn four_plus_four(line: &str) -> Change {
    grown(line, 4, 4)
}

/// `before` shards of 2 pods provisioned on `line`, and `added` more shards whose Components exist now.
fn grown(line: &str, before: usize, added: usize) -> Change {
    let t = std::time::Instant::now();
    let mut c = Change::new(support::Bed::builder().shards(before).pods(2), SLOTS);
    eprintln!("bed after {:.1?}", t.elapsed());
    let first: Vec<usize> = (0..before).collect();
    if line == "1.1" {
        run_to_completion("post-provision", &c.env_1_1(0, &first));
    } else {
        for i in 0..before {
            run_to_completion("post-provision", &c.env_1_0(i, &first, &[]));
        }
    }
    c.bed.assert_balanced(&c.gids(&first));
    eprintln!("provisioned after {:.1?}", t.elapsed());
    for _ in 0..added {
        c.add_shard(2);
    }
    eprintln!("shards added after {:.1?}", t.elapsed());
    c
}

/// Runs `change`, which doubles the shards, and checks that every new group was split off a donor of its own: not
/// one slot migrated.
fn by_splits(c: &Change, change: impl FnOnce()) {
    let (rounds_before, _) = c.bed.codis.executor_rounds();
    change();
    let (rounds_after, slots) = c.bed.codis.executor_rounds();
    assert_eq!(rounds_after, rounds_before, "{slots} slot(s) migrated where every new group splits off a donor");
}

/// 8 shards of one pod provisioned on 1.0.
fn eight() -> Change {
    let c = Change::new(support::Bed::builder().shards(8).pods(1), SLOTS);
    let all: Vec<usize> = (0..8).collect();
    for i in 0..8 {
        run_to_completion("post-provision", &c.env_1_0(i, &all, &[]));
    }
    c.bed.assert_balanced(&c.gids(&all));
    c
}

/// Runs `change` (the actions of one scale) with a writer going and checks the outcome.
fn scale(c: &Change, finals: &[usize], gone: &[usize], change: impl FnOnce()) {
    let before = c.bed.owners();
    let t = std::time::Instant::now();
    let (ledger, writer) = c.start_writing(PRELOAD);
    eprintln!("writing after {:.1?}", t.elapsed());
    c.count_moves();
    change();
    eprintln!("change done after {:.1?}", t.elapsed());
    let moves = c.moves();
    let gids = c.gids(finals);
    let minimum = minimum_moves(&before, &gids);
    eprintln!("{} slot moves for a minimum of {minimum}", moves);
    assert_eq!(moves, minimum, "slot moves over the whole change");
    c.assert_done(&gids, gone);
    c.assert_no_stray_keys();
    c.check_no_key_lost(ledger, writer);
}

fn add_env(c: &Change, index: usize) -> Env {
    let mut env = c.env_1_1(index, &(0..8).collect::<Vec<_>>());
    env.insert("KB_ADD_SHARD_NAME".into(), c.bed.cluster.shards[index].full.clone());
    env
}

fn remove_env(c: &Change, index: usize) -> Env {
    let mut env = c.env_1_1(index, &(0..8).collect::<Vec<_>>());
    env.insert("KB_REMOVE_SHARD_NAME".into(), c.bed.cluster.shards[index].full.clone());
    env
}

#[test]
fn four_to_eight_on_1_1_started_at_once_in_shuffled_order_moves_the_minimum() {
    let c = four_plus_four("1.1");
    let order = shuffled(&[4, 5, 6, 7], "shard-adds at once");
    let actions: Vec<(&str, Env)> = order.iter().map(|&i| ("shard-add", add_env(&c, i))).collect();
    by_splits(&c, || {
        scale(&c, &(0..8).collect::<Vec<_>>(), &[], || {
            let outs = concurrently(&actions, Duration::from_millis(40), Duration::from_millis(20));
            if std::env::var("SCALE_DEBUG").is_ok() {
                for o in outs.iter().flatten() {
                    eprintln!("---- {}", support::describe(o));
                }
            }
        })
    });
}

#[test]
fn four_to_eight_on_1_1_called_one_after_another_as_a_reconcile_does_moves_the_minimum() {
    let c = four_plus_four("1.1");
    let order = shuffled(&[4, 5, 6, 7], "shard-adds in turn");
    let actions: Vec<(&str, Env)> = order.iter().map(|&i| ("shard-add", add_env(&c, i))).collect();
    by_splits(&c, || {
        scale(&c, &(0..8).collect::<Vec<_>>(), &[], || {
            let reconciles = one_after_another(&actions);
            // Each call before the last begins its split and returns, so the next shard begins its own at once; the
            // second reconcile completes them.
            assert!(reconciles <= 3, "{reconciles} reconciles");
        })
    });
}

/// As the 1.1 chart runs a scale-out: each new shard's component postProvision registers its group first
/// (`--own-shard`, no slot moves), then a reconcile calls the shardAdds one after another. A registered group that
/// serves nothing is emptied and listed again behind its donor's alias, so each still splits.
#[test]
fn four_to_eight_on_1_1_with_every_group_registered_first_splits_each_new_shard_off_a_donor() {
    let c = four_plus_four("1.1");
    let all: Vec<usize> = (0..8).collect();
    for i in 4..8 {
        let out = support::run_args(&["post-provision", "--own-shard"], &c.env_1_1(i, &all));
        assert_eq!(out.status.code(), Some(0), "{}", support::describe(&out));
    }
    let order = shuffled(&[4, 5, 6, 7], "shard-adds in turn, all registered");
    let actions: Vec<(&str, Env)> = order.iter().map(|&i| ("shard-add", add_env(&c, i))).collect();
    by_splits(&c, || {
        scale(&c, &all, &[], || {
            one_after_another(&actions);
        });
    });
}

/// Codis takes one slot per group into a round, so a change that migrates needs as many rounds as the most slots one
/// group sends or receives, and the product must reach that: once every new group is registered, one run plans and
/// submits the whole change at once, and the disjoint pairs migrate side by side in every round. 3→5 over 1024 slots:
/// each new group takes 204 or 205 slots from two donors, and splits off the one feeding it the larger share (a
/// third or more of that donor); the rest migrates. The two new groups are registered first (`--own-shard`, no slot
/// moves), the shardAdds called one after another as a 1.1 reconcile does (so a run that submitted part of the change
/// and waited for it would serialise the rest), and every slot's migration held in the double until every move is
/// either handed over by a split or queued (the product sees slow migrations, not disabled ones, which it refuses to
/// wait for). The bound is measured: the most migrations one group took part in. Only the first round can be short,
/// formed while the actions were still being created.
#[test]
fn three_to_five_with_every_new_group_registered_splits_a_share_each_and_migrates_the_rest_in_as_few_rounds_as_codis_allows(
) {
    let c = grown("1.1", 3, 2);
    let all: Vec<usize> = (0..5).collect();
    for i in 3..5 {
        let out = support::run_args(&["post-provision", "--own-shard"], &c.env_1_1(i, &all));
        assert_eq!(out.status.code(), Some(0), "{}", support::describe(&out));
    }
    let before = c.bed.owners();
    let minimum = minimum_moves(&before, &c.gids(&all));
    let order = shuffled(&[3, 4], "shard-adds in turn, all registered");
    let add = |i: usize| {
        let mut env = c.env_1_1(i, &all);
        env.insert("KB_ADD_SHARD_NAME".into(), c.bed.cluster.shards[i].full.clone());
        ("shard-add", env)
    };
    let actions: Vec<(&str, Env)> = order.iter().map(|&i| add(i)).collect();
    let hold = |held: bool| {
        for sid in 0..SLOTS {
            if held {
                c.bed.codis.hold_migration(sid, MigrationHold::BeforeBatch { after: 0 });
            } else {
                c.bed.codis.release_migration(sid);
            }
        }
    };
    let (rounds_before, slots_before) = c.bed.codis.executor_rounds();
    let migrated_before = c.bed.codis.migrations_by_group();
    scale(&c, &all, &[], || {
        hold(true);
        std::thread::scope(|scope| {
            let runs = scope.spawn(|| one_after_another(&actions));
            // With every migration held, a slot whose owner changed was handed over by a split.
            let planned = eventually(Duration::from_secs(120), || {
                let handed_over = before.iter().zip(c.bed.owners()).filter(|(b, a)| **b != *a).count();
                handed_over + c.bed.codis.snapshot().with_action().len() == minimum
            });
            hold(false);
            assert!(planned, "the shardAdds never had all {minimum} moves handed over or queued at once");
            runs.join().expect("shard-adds");
        });
    });
    let (rounds_after, slots) = c.bed.codis.executor_rounds();
    let (rounds, slots) = (rounds_after - rounds_before, slots - slots_before);
    let migrated = c.bed.codis.migrations_by_group();
    let took_part =
        |gid: u32| migrated.get(&gid).copied().unwrap_or(0) - migrated_before.get(&gid).copied().unwrap_or(0);
    let snapshot = c.bed.codis.snapshot();
    for gid in c.gids(&[3, 4]) {
        let held = snapshot.slots_of(gid) as u64;
        assert!(took_part(gid) < held, "group {gid}: all {held} of its slots migrated, none split off a donor");
    }
    let bound = c.gids(&all).into_iter().map(took_part).max().unwrap_or(0);
    eprintln!("{rounds} executor rounds took {slots} slots; the bound is {bound}");
    assert!(bound < 204, "a group took part in {bound} migrations: the splits did not shorten the change");
    assert!(rounds <= bound + 1, "{rounds} executor rounds where {bound} suffice");
}

#[test]
fn four_to_eight_on_1_0_component_post_provisions_at_once_in_shuffled_order_move_the_minimum() {
    let c = four_plus_four("1.0");
    let all: Vec<usize> = (0..8).collect();
    let order = shuffled(&[4, 5, 6, 7], "post-provisions at once");
    let actions: Vec<(&str, Env)> = order.iter().map(|&i| ("post-provision", c.env_1_0(i, &all, &[]))).collect();
    by_splits(&c, || {
        scale(&c, &all, &[], || {
            concurrently(&actions, Duration::from_millis(40), Duration::from_millis(200));
        })
    });
}

#[test]
fn eight_to_four_on_1_0_pre_terminates_at_once_in_shuffled_order_move_the_minimum() {
    let c = eight();
    let all: Vec<usize> = (0..8).collect();
    let leaving = [4, 5, 6, 7];
    let order = shuffled(&leaving, "pre-terminates at once");
    let actions: Vec<(&str, Env)> = order
        .iter()
        .map(|&i| {
            let mut env = c.env_1_0(i, &all, &leaving);
            env.insert("KB_CLUSTER_COMPONENT_IS_SCALING_IN".into(), "true".into());
            ("pre-terminate", env)
        })
        .collect();
    scale(&c, &[0, 1, 2, 3], &leaving, || {
        concurrently(&actions, Duration::from_millis(40), Duration::from_millis(200));
    });
}

#[test]
fn eight_to_four_on_1_1_called_one_after_another_with_the_clusters_shard_count_moves_the_minimum() {
    let c = eight();
    let api = ClusterApi::start(NAMESPACE, &c.bed.cluster.name, ClusterAnswer::Stays(vec![("pk".into(), 4)]));
    // KubeBlocks removes the last names: shards 4..8 (their ids sort after those of 0..4).
    let order = shuffled(&[4, 5, 6, 7], "shard-removes in turn");
    let actions: Vec<(&str, Env)> = order
        .iter()
        .map(|&i| {
            let mut env = remove_env(&c, i);
            env.insert("KUBE_API_URL".into(), api.url());
            ("shard-remove", env)
        })
        .collect();
    scale(&c, &[0, 1, 2, 3], &[4, 5, 6, 7], || {
        one_after_another(&actions);
    });
    assert!(api.requests().iter().any(|r| r.contains("/clusters/")), "the Cluster was read");
}

#[test]
fn eight_to_four_on_1_1_started_at_once_without_an_api_drains_onto_the_shards_that_stay() {
    let c = eight();
    let order = shuffled(&[4, 5, 6, 7], "shard-removes at once");
    let actions: Vec<(&str, Env)> = order.iter().map(|&i| ("shard-remove", remove_env(&c, i))).collect();
    scale(&c, &[0, 1, 2, 3], &[4, 5, 6, 7], || {
        // Another action holds the topology lock while the four start: each records its shard as leaving before it
        // waits for the lock, so whichever plans first already knows all four.
        let lock = HeldLock::take(&c.bed);
        std::thread::scope(|scope| {
            let runs = scope.spawn(|| concurrently(&actions, Duration::from_millis(20), Duration::from_millis(20)));
            assert!(
                eventually(Duration::from_secs(20), || recorded_leavers(&c.bed).len() == 4),
                "recorded as leaving: {:?}",
                recorded_leavers(&c.bed)
            );
            assert!(c.bed.codis.snapshot().with_action().is_empty(), "a drain planned under another's lock");
            drop(lock);
            runs.join().expect("shard-removes");
        });
    });
    assert!(recorded_leavers(&c.bed).is_empty(), "leaving records left: {:?}", recorded_leavers(&c.bed));
}
