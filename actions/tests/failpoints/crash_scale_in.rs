//! Crash at every step of a scale-in: the binary is built with `--features failpoints` and aborted before its n-th
//! external mutation (`PIKA_ACTION_CRASH_AT=n`: a Codis PUT, a SLAVEOF or CONFIG REWRITE, an etcd write), for n = 1, 2,
//! ... until a run completes without crashing. After each crash the action is rerun normally until it finishes, and the
//! cluster must have converged: the leaving group gone with its servers and etcd records, every slot owned by a
//! remaining group, balanced, none lost; a further run changes nothing. Keys written through a codis-proxy before the
//! scale-in and while the crashed run and its rerun work are all read back afterwards, through the proxy and from the
//! masters owning their slots.

use crate::attack;
use crate::summary;
use crate::support;

use std::collections::BTreeMap;

use support::{describe, run, run_to_completion, Bed};
use testbed::{Ledger, ProxyDouble, Workload, WorkloadOptions};

/// A scale-in about to happen: 3 shards of 2 pods over Codis's 1024 slots holding keys, the last one leaving.
struct Case {
    bed: Bed,
    proxy: ProxyDouble,
    ledger: Ledger,
    env: BTreeMap<String, String>,
    leaving: u32,
    remaining: Vec<u32>,
}

fn case() -> Case {
    let bed = Bed::builder().shards(3).pods(2).bed_default();
    run_to_completion("post-provision", &bed.env(0));
    let proxy = bed.start_proxy();
    let ledger = Ledger::preload(&proxy.data_addr(), "before", 600).expect("preload through the proxy");
    assert_eq!(ledger.acked.len(), 600, "the preload was not acknowledged: {:?}", ledger.errors);
    let mut env = bed.env(2);
    env.insert("KB_REMOVE_SHARD_NAME".into(), bed.cluster.shards[2].full.clone());
    let leaving = bed.gid(2).expect("registered");
    let remaining = vec![bed.gid(0).expect("registered"), bed.gid(1).expect("registered")];
    Case { bed, proxy, ledger, env, leaving, remaining }
}

fn assert_converged(c: &Case, n: usize) {
    let snap = c.bed.codis.snapshot();
    assert!(snap.group(c.leaving).is_none(), "crash point {n}: group {} survived", c.leaving);
    for pod in &c.bed.cluster.shards[2].pods {
        assert!(snap.server(&pod.server()).is_none(), "crash point {n}: {} still registered", pod.name);
    }
    // Every slot in a remaining group (none lost, none offline), none migrating, ±1.
    c.bed.assert_balanced(&c.remaining);
    let stale: Vec<String> = attack::etcd_entries(&c.bed)
        .into_keys()
        .filter(|k| k.ends_with(&format!("/groups/{}", c.leaving)) || k.contains("/drains/"))
        .collect();
    assert!(stale.is_empty(), "crash point {n}: etcd records left: {stale:?}");
    c.ledger.verify_kept(&c.proxy.data_addr(), &c.bed.codis).unwrap_or_else(|e| panic!("crash point {n}: {e}"));
    // And it stays converged: one more run changes nothing.
    c.bed.codis.clear_requests();
    let out = run("shard-remove", &c.env);
    assert_eq!(out.status.code(), Some(0), "crash point {n}: {}", describe(&out));
    assert!(c.bed.mutations().is_empty(), "crash point {n}: a rerun changed codis: {:?}", c.bed.mutations());
}

#[test]
fn shard_remove_converges_after_a_crash_before_any_of_its_steps() {
    let mut points = summary::Category::new("crash: shard-remove");
    for n in 1..200 {
        let mut c = case();
        let mut crashing = c.env.clone();
        crashing.insert("PIKA_ACTION_CRASH_AT".into(), n.to_string());
        let writer = Workload::start(WorkloadOptions {
            prefix: format!("during-{n}"),
            ..WorkloadOptions::through(&[c.proxy.data_addr()])
        });
        let out = run("shard-remove", &crashing);
        if out.status.code() == Some(0) {
            // Fewer than n mutations: every crash point has been tried.
            c.ledger.merge(writer.stop());
            assert_converged(&c, n);
            break;
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        if let Some(line) = stderr.lines().find(|l| l.contains("crash point")) {
            println!("{line}");
        }
        points.trial(format!("crash point {n}"), || {
            assert!(
                stderr.contains(&format!("crash point {n}")),
                "run {n} failed without crashing: {}",
                describe(&out)
            );
            attack::expire_locks(&c.bed);
            run_to_completion("shard-remove", &c.env);
            c.ledger.merge(writer.stop());
            assert_converged(&c, n);
        });
    }
    let tried = points.trials();
    println!("shard-remove: {tried} crash points tried, every one converged");
    assert!(tried >= 5, "only {tried} crash points were tried: are the fail point hooks wired?");
    points.finish();
}
