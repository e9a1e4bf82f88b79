//! Crash at every step of a KubeBlocks 1.0.x scale-in: `pre-terminate` with `KB_CLUSTER_COMPONENT_IS_SCALING_IN=true`,
//! built with `--features failpoints` and aborted before its n-th external mutation (`PIKA_ACTION_CRASH_AT=n`: a Codis
//! PUT, SLAVEOF, CONFIG REWRITE or etcd write), for n = 1, 2, ... until a run completes without crashing. After each
//! crash the lease of the dead run is let expire and the action is rerun until it finishes, as KubeBlocks retries a
//! failed preTerminate; the cluster must have converged exactly as a crash-free run leaves it, with no slot ever lost
//! or owned by a removed group on the way (watched while it runs), and one more run must change nothing.

use crate::attack;
use crate::summary;
use crate::support;

use std::collections::BTreeMap;

use attack::{etcd_entries, expire_locks, run_until_done, watch};
use summary::Category;
use support::{describe, run, Bed};
use testbed::{Ledger, Workload, WorkloadOptions};

/// A 1.0.x scale-in about to happen: 3 shards of 2 pods over Codis's 1024 slots holding keys, the middle one
/// leaving.
struct Case {
    bed: Bed,
    proxy: testbed::ProxyDouble,
    ledger: Ledger,
    env: BTreeMap<String, String>,
    leaving: u32,
    remaining: Vec<u32>,
}

fn case() -> Case {
    let bed = Bed::builder().shards(3).pods(2).bed_default();
    run_until_done("post-provision", &bed.env(0), 10).expect("post-provision");
    let proxy = bed.start_proxy();
    let ledger = Ledger::preload(&proxy.data_addr(), "before", 600).expect("preload through the proxy");
    let mut env = bed.env_v1_0(1, &[1]);
    env.insert("KB_CLUSTER_COMPONENT_IS_SCALING_IN".into(), "true".into());
    let leaving = bed.gid(1).expect("registered");
    let remaining = vec![bed.gid(0).expect("registered"), bed.gid(2).expect("registered")];
    Case { bed, proxy, ledger, env, leaving, remaining }
}

fn assert_converged(c: &Case, n: usize) {
    let snap = c.bed.codis.snapshot();
    assert!(snap.group(c.leaving).is_none(), "crash point {n}: group {} survived", c.leaving);
    for pod in &c.bed.cluster.shards[1].pods {
        assert!(snap.server(&pod.server()).is_none(), "crash point {n}: {} still registered", pod.name);
    }
    c.bed.assert_balanced(&c.remaining);
    for index in [0, 2] {
        c.bed.assert_registered(index, 0);
    }
    let stale: Vec<String> = etcd_entries(&c.bed)
        .into_keys()
        .filter(|k| k.ends_with(&format!("/groups/{}", c.leaving)) || k.contains("/drains/") || k.contains("/locks/"))
        .collect();
    assert!(stale.is_empty(), "crash point {n}: etcd records left: {stale:?}");
    c.ledger.verify_kept(&c.proxy.data_addr(), &c.bed.codis).unwrap_or_else(|e| panic!("crash point {n}: {e}"));
    c.bed.codis.clear_requests();
    let out = run("pre-terminate", &c.env);
    assert_eq!(out.status.code(), Some(0), "crash point {n}: {}", describe(&out));
    assert!(c.bed.mutations().is_empty(), "crash point {n}: a rerun changed codis: {:?}", c.bed.mutations());
}

#[test]
fn pre_terminate_scaling_in_converges_after_a_crash_before_any_of_its_steps() {
    let mut points = Category::new("crash: pre-terminate (1.0 scale-in)");
    let mut completed = false;
    for n in 1..200 {
        let mut c = case();
        let mut crashing = c.env.clone();
        crashing.insert("PIKA_ACTION_CRASH_AT".into(), n.to_string());
        let writer = Workload::start(WorkloadOptions {
            prefix: format!("during-{n}"),
            ..WorkloadOptions::through(&[c.proxy.data_addr()])
        });
        let (out, crashed) = watch(&c.bed, || run("pre-terminate", &crashing));
        if out.status.code() == Some(0) {
            c.ledger.merge(writer.stop());
            // Fewer than n mutations: every crash point has been tried; the crash-free run converges too.
            assert_converged(&c, n);
            completed = true;
            break;
        }
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let what = stderr.lines().find(|l| l.contains(&format!("crash point {n}:"))).map(str::to_owned);
        points.trial(format!("crash point {n} ({})", what.as_deref().unwrap_or("?")), || {
            assert!(what.is_some(), "run {n} failed without crashing: {}", describe(&out));
            assert!(crashed.violations.is_empty(), "while crashing: {:?}", crashed.violations);
            expire_locks(&c.bed);
            let (done, watched) = watch(&c.bed, || run_until_done("pre-terminate", &c.env, 10));
            done.unwrap_or_else(|e| panic!("rerun: {e}"));
            assert!(watched.violations.is_empty(), "{:?}", watched.violations);
            c.ledger.merge(writer.stop());
            assert_converged(&c, n);
        });
    }
    assert!(completed, "pre-terminate never completed without crashing");
    assert!(points.trials() >= 8, "only {} crash points: are the hooks wired?", points.trials());
    points.finish();
}
