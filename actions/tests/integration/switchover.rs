//! `switchover` as KubeBlocks calls it — for every pod before it restarts, no candidate unless an
//! OpsRequest gives one, errors ignored — over the Codis double, real redis-servers (standing in for pika) and real
//! etcd; and `topology`, the read-only view for people. Every check reads Codis's own model and the redis-servers,
//! never the action's output alone. The tests of Codis misbehaving (a promote left in progress or answered late,
//! fences a crash left, a dead proxy) and of an explicit candidate moved to real pika (`real_pika::switchover`); what
//! stays here counts transfers across KubeBlocks' rollouts with a stand-in Kubernetes API, and races two calls.
//!
//! Transfer counts: KubeBlocks orders a rollout by role (replicas first, ties by ordinal descending, the master last),
//! which defers the master to the end — exactly 1 transfer whatever the master's ordinal, with or without rollout facts
//! — while an order that is not ordinal-descending needs the rollout facts to stay at 1 (the ordinal rule alone moves
//! the master twice there).

use crate::rollout;
use crate::support;

use std::collections::BTreeSet;
use std::time::Duration;

use rollout::{
    assert_one_master, bed_with_master, codis_master, observing, pika_masters, promotes, rolling_restart, stdout,
    switchover_env, FakeKube, Order,
};
use support::{describe, run, Bed};

/// Makes replication offsets stand still between writes: redis-server pings its replicas every second (which moves
/// the master's offset ahead of theirs for a moment) and pika does not, so a lag of a few bytes cannot decide a tie.
fn quiet(bed: &Bed) {
    for pod in &bed.cluster.shards[0].pods {
        let _ = pod.redis.command(&["CONFIG", "SET", "repl-ping-replica-period", "30"]);
    }
}

fn fence_key(bed: &Bed) -> String {
    let prefix = pika_action::clients::etcd::cluster_prefix(support::NAMESPACE, &bed.cluster.name);
    pika_action::steps::transfer::fence_key(&prefix, bed.gid(0).unwrap())
}

/// Reads (`None` value) or writes the group's fence in etcd, as a crashed run would have left it.
fn fence(bed: &Bed, write: Option<&str>) -> Option<String> {
    crate::attack::with_etcd(bed, |etcd, _| async move {
        if let Some(value) = write {
            etcd.put(&fence_key(bed), value, Some(Duration::from_secs(30))).await.unwrap();
        }
        etcd.get(&fence_key(bed)).await.unwrap().map(|e| e.value)
    })
}

fn server(bed: &Bed, ordinal: u32) -> String {
    bed.cluster.shards[0].pod(ordinal).server()
}

#[test]
fn switchover_of_a_replica_changes_nothing() {
    let bed = bed_with_master(3, 0);
    for ordinal in [2, 1] {
        let out = run("switchover", &switchover_env(&bed, ordinal, None));
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        assert!(stdout(&out).contains("nothing to move"), "{}", describe(&out));
    }
    // Even with a stale role label saying master: Codis decides.
    let mut env = switchover_env(&bed, 1, None);
    env.insert("KB_SWITCHOVER_ROLE".into(), "master".into());
    assert_eq!(run("switchover", &env).status.code(), Some(0));
    assert!(bed.mutations().is_empty(), "{:?}", bed.mutations());
    assert_one_master(&bed, 0);
}

#[test]
fn switchover_of_a_pod_codis_does_not_know_is_success_and_changes_nothing() {
    let mut bed = bed_with_master(2, 0);
    let stranger = bed.add_pod(0);
    let out = run("switchover", &switchover_env(&bed, stranger, None));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(stdout(&out).contains("no codis group"), "{}", describe(&out));
    assert!(bed.mutations().is_empty(), "{:?}", bed.mutations());
    assert_eq!(bed.cluster.shards[0].pod(stranger).redis.role(), "master", "the stranger was not touched");
}

#[test]
fn a_kubeblocks_rolling_restart_moves_the_master_exactly_once_wherever_it_starts() {
    // Without a Kubernetes API the ordinal rule chooses; KubeBlocks restarts the master last, when every replica is
    // already updated, so it costs 1 transfer for x = 0, 1, 2 (mean 1), and the rule's pick is the highest ordinal
    // above x, else the lowest below: 0 → 2, 1 → 2, 2 → 0.
    let mut counts = Vec::new();
    for (x, rule_pick) in [(0, 2), (1, 2), (2, 0)] {
        let mut bed = bed_with_master(3, x);
        quiet(&bed);
        let order = rolling_restart(&mut bed, &Order::KubeBlocks, None);
        assert_eq!(order.last(), Some(&x), "KubeBlocks restarts the master last: {order:?}");
        counts.push(promotes(&bed));
        assert_eq!(promotes(&bed), 1, "master at {x}: order {order:?}");
        assert_one_master(&bed, rule_pick);

        // Running the switchover of every replica again — the old master's included — changes nothing.
        bed.codis.clear_requests();
        for ordinal in (0..3).filter(|o| *o != rule_pick) {
            let out = run("switchover", &switchover_env(&bed, ordinal, None));
            assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        }
        assert!(bed.mutations().is_empty(), "{:?}", bed.mutations());
    }
    eprintln!("kubeblocks order, no rollout facts: transfers by master ordinal 0..=2: {counts:?}");
}

#[test]
fn with_rollout_facts_a_kubeblocks_rolling_restart_moves_the_master_once_for_every_master_ordinal() {
    let mut counts = Vec::new();
    for x in 0..3 {
        let mut bed = bed_with_master(3, x);
        quiet(&bed);
        let kube = FakeKube::start(&bed);
        rolling_restart(&mut bed, &Order::KubeBlocks, Some(&kube));
        counts.push(promotes(&bed));
        assert_eq!(promotes(&bed), 1, "master at {x}");
        assert!(
            kube.requests().iter().any(|r| r.contains("/instancesets/")),
            "facts never read: {:?}",
            kube.requests()
        );
        let master = codis_master(&bed);
        assert_ne!(master, x);
        assert_one_master(&bed, master);
    }
    eprintln!("kubeblocks order, rollout facts: transfers by master ordinal 0..=2: {counts:?}");
}

#[test]
fn rollout_facts_keep_the_master_on_an_updated_pod_where_the_ordinal_rule_moves_it_twice() {
    // An order that is not ordinal-descending (instance templates, offlineInstances, a missing role label): 0, 1, 2
    // with the master at 1. The ordinal rule sends it to 2, which restarts next (2 transfers); the rollout facts
    // send it to 0, already updated (1 transfer).
    let order = Order::Fixed(vec![0, 1, 2]);
    let mut bed = bed_with_master(3, 1);
    quiet(&bed);
    rolling_restart(&mut bed, &order, None);
    assert_eq!(promotes(&bed), 2, "ordinal rule");
    assert_one_master(&bed, 0);

    let mut bed = bed_with_master(3, 1);
    quiet(&bed);
    let kube = FakeKube::start(&bed);
    rolling_restart(&mut bed, &order, Some(&kube));
    assert_eq!(promotes(&bed), 1, "rollout facts");
    assert_one_master(&bed, 0);
}

#[test]
fn without_a_reachable_kubernetes_api_the_ordinal_rule_decides_within_the_budget() {
    // Nothing listening, then a listener that never answers.
    let closed = testbed::free_port();
    let silent = testbed::bind_loopback().unwrap();
    let silent_url = format!("http://{}", silent.local_addr().unwrap());
    for url in [format!("http://127.0.0.1:{closed}"), silent_url] {
        let bed = bed_with_master(3, 1);
        quiet(&bed);
        let mut env = switchover_env(&bed, 1, None);
        env.insert("KUBE_API_URL".into(), url.clone());
        let out = support::run_time_boxed("switchover", &env, 50);
        assert_eq!(out.status.code(), Some(0), "{url}: {}", describe(&out));
        assert!(String::from_utf8_lossy(&out.stderr).contains("no rollout facts"), "{}", describe(&out));
        assert_eq!(promotes(&bed), 1);
        assert_one_master(&bed, 2);
    }
}

#[test]
fn a_bad_candidate_is_exit_2_naming_the_variable_and_nothing_changes() {
    let mut bed = bed_with_master(3, 0);
    let stranger = bed.add_pod(0);
    let rogue = bed.cluster.shards[0].pod(stranger).redis.port().to_string();

    // Not in the group; replicating another server; unreachable.
    let mut cases: Vec<(u32, &str)> = vec![(stranger, "not a member")];
    let _ = bed.cluster.shards[0].pod(1).redis.command(&["SLAVEOF", "127.0.0.1", &rogue]);
    cases.push((1, "does not replicate the current master"));
    bed.cluster.shards[0].pods.iter_mut().find(|p| p.ordinal == 2).unwrap().redis.kill();
    cases.push((2, "not reachable"));
    for (candidate, why) in cases {
        let out = run("switchover", &switchover_env(&bed, 0, Some(candidate)));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "candidate {candidate}: {}", describe(&out));
        assert!(stderr.contains("KB_SWITCHOVER_CANDIDATE_FQDN") && stderr.contains(why), "{}", describe(&out));
        assert!(out.stdout.is_empty());
    }
    assert!(bed.mutations().is_empty(), "{:?}", bed.mutations());
    assert_eq!(codis_master(&bed), 0);
    assert_eq!(bed.cluster.shards[0].pod(0).redis.role(), "master");
    assert_eq!(fence(&bed, None), None, "nothing was written to etcd either");
}

#[test]
fn two_switchovers_of_the_master_at_once_promote_once_and_never_leave_two_masters() {
    // KubeBlocks' own call racing an OpsRequest's, and two OpsRequests with different candidates.
    for candidates in [[None, Some(1)], [Some(1), Some(2)]] {
        let bed = bed_with_master(3, 0);
        quiet(&bed);
        let envs: Vec<_> = candidates.iter().map(|c| switchover_env(&bed, 0, *c)).collect();
        let (outs, samples) = observing(&bed, || {
            let handles: Vec<_> =
                envs.into_iter().map(|env| std::thread::spawn(move || run("switchover", &env))).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
        });
        for out in &outs {
            assert_eq!(out.status.code(), Some(0), "{candidates:?}: {}", describe(out));
        }
        assert_eq!(promotes(&bed), 1, "{candidates:?}: {:?}", bed.mutations());
        let master = codis_master(&bed);
        assert_ne!(master, 0);
        // Pika cannot demote the old master before the new one is promoted (it refuses SLAVEOF while it has
        // replicas), so the pair (old, new) may both say master for a moment; never any other pod, never none.
        let allowed = BTreeSet::from([0, master]);
        assert!(samples.len() > 10, "too few observations: {}", samples.len());
        for sample in &samples {
            assert!(!sample.is_empty() && sample.is_subset(&allowed), "{candidates:?}: observed masters {sample:?}");
        }
        assert_one_master(&bed, master);
        eprintln!(
            "{candidates:?}: {} observations, {} with the old and new master both reporting master",
            samples.len(),
            samples.iter().filter(|s| s.len() == 2).count()
        );
    }
}

#[test]
fn topology_shows_every_group_flags_a_second_master_and_a_replica_switchover_repairs_it() {
    let bed = bed_with_master(3, 0);
    let gid = bed.gid(0).unwrap();
    let out = run("topology", &bed.env(0));
    let text = stdout(&out);
    eprintln!("{text}");
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(text.contains(&format!("group {gid}  shard {}", bed.cluster.shards[0].full)), "{text}");
    for ordinal in 0..3 {
        assert!(text.contains(&server(&bed, ordinal)), "{text}");
    }
    assert!(text.contains("pika slave of [0] link up") && text.contains("  ok"), "{text}");

    // Pod 2 is told to stop replicating: a second master Codis does not route to.
    let _ = bed.cluster.shards[0].pod(2).redis.command(&["SLAVEOF", "NO", "ONE"]);
    let out = run("topology", &bed.env(0));
    eprintln!("{}", describe(&out));
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(stdout(&out).contains("DISAGREE: [2] is a second pika master"), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("disagree"), "{}", describe(&out));
    assert!(bed.mutations().is_empty(), "topology is read-only: {:?}", bed.mutations());
    assert_eq!(pika_masters(&bed), BTreeSet::from([0, 2]));

    // The next replica's switchover finishes what is not converged; then topology agrees again.
    let out = run("switchover", &switchover_env(&bed, 1, None));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_one_master(&bed, 0);
    let out = run("topology", &bed.env(0));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
}
