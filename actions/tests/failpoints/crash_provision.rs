//! Crash at every step of registration: the binary is built with `--features failpoints` and aborted before its n-th
//! external mutation (`PIKA_ACTION_CRASH_AT=n`), for every n until a run completes; each crash is followed by a normal
//! rerun that must converge to the same topology a crash-free run reaches.

use crate::attack;
use crate::summary;
use crate::support;

use std::collections::BTreeMap;

use support::{describe, run, run_to_completion, Bed};

/// Runs `action` with a crash before mutation n = 1, 2, ... on a fresh bed each time, reruns it to completion, and
/// checks the result; returns how many crash points were tried.
fn crash_everywhere(build: impl Fn() -> (Bed, BTreeMap<String, String>), action: &str, check: impl Fn(&Bed)) -> usize {
    let mut points = summary::Category::new(format!("crash: {action}"));
    for n in 1..200 {
        let (bed, env) = build();
        let mut crashing = env.clone();
        crashing.insert("PIKA_ACTION_CRASH_AT".into(), n.to_string());
        let out = run(action, &crashing);
        let stderr = String::from_utf8_lossy(&out.stderr);
        eprintln!("{action} crash at {n}: exit {:?}: {}", out.status.code(), stderr.lines().last().unwrap_or_default());
        if out.status.code() == Some(0) {
            // Fewer than n mutations: every crash point has been tried.
            check(&bed);
            let tried = points.trials();
            points.finish();
            return tried;
        }
        points.trial(format!("crash point {n}"), || {
            assert!(
                stderr.contains(&format!("crash point {n}")),
                "run {n} failed without crashing: {}",
                describe(&out)
            );
            // What the dead run's lease expiring does, without waiting its 15 s out.
            attack::expire_locks(&bed);
            run_to_completion(action, &env);
            check(&bed);
        });
    }
    panic!("{action} never completed without crashing");
}

fn all_gids(bed: &Bed) -> Vec<u32> {
    (0..bed.cluster.shards.len()).map(|i| bed.gid(i).expect("registered")).collect()
}

#[test]
fn post_provision_converges_after_a_crash_before_any_of_its_steps() {
    let tried = crash_everywhere(
        || {
            let bed = Bed::builder().shards(2).pods(2).bed_default();
            let env = bed.env(0);
            (bed, env)
        },
        "post-provision",
        |bed| {
            bed.assert_registered(0, 0);
            bed.assert_registered(1, 0);
            let gids = all_gids(bed);
            assert_eq!(gids.iter().collect::<std::collections::BTreeSet<_>>().len(), 2, "{gids:?}");
            bed.assert_balanced(&gids);
            assert_eq!(bed.codis.snapshot().groups.len(), 2, "a crash left a stray group");
        },
    );
    println!("post-provision: {tried} crash points tried, every one converged");
    assert!(tried >= 10, "only {tried} crash points: are the hooks wired?");
}

#[test]
fn shard_add_converges_after_a_crash_before_any_of_its_steps() {
    let tried = crash_everywhere(
        || {
            let mut bed = Bed::builder().shards(2).pods(1).bed_default();
            run_to_completion("post-provision", &bed.env(0));
            let added = bed.add_shard(2);
            let mut env = bed.env(0);
            env.insert("KB_ADD_SHARD_NAME".into(), bed.cluster.shards[added].full.clone());
            (bed, env)
        },
        "shard-add",
        |bed| {
            bed.assert_registered(2, 0);
            let gids = all_gids(bed);
            bed.assert_balanced(&gids);
            assert_eq!(bed.codis.snapshot().groups.len(), 3, "a crash left a stray group");
        },
    );
    println!("shard-add: {tried} crash points tried, every one converged");
    assert!(tried >= 5, "only {tried} crash points: are the hooks wired?");
}

#[test]
fn member_join_converges_after_a_crash_before_any_of_its_steps() {
    let tried = crash_everywhere(
        || {
            let mut bed = Bed::builder().shards(1).pods(1).bed_default();
            run_to_completion("post-provision", &bed.env(0));
            let ordinal = bed.add_pod(0);
            let pod = bed.cluster.shards[0].pod(ordinal);
            let mut env = bed.env(0);
            env.insert("KB_JOIN_MEMBER_POD_NAME".into(), pod.name.clone());
            env.insert("KB_JOIN_MEMBER_POD_FQDN".into(), pod.fqdn.clone());
            (bed, env)
        },
        "member-join",
        |bed| bed.assert_registered(0, 0),
    );
    println!("member-join: {tried} crash points tried, every one converged");
    assert!(tried >= 3, "only {tried} crash points: are the hooks wired?");
}
