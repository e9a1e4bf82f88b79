//! Fail points (built with `--features failpoints`): a master's `switchover` killed before each of its mutations in
//! turn — every Codis PUT, SLAVEOF, CONFIG REWRITE and etcd write — then run again as KubeBlocks' next call would,
//! must converge: exactly one master, the one Codis lists, every replica following it, and the master moved once;
//! every key acknowledged through a codis-proxy before and during the runs is still readable.
//!
//! One of the points must be "between the fence and the promote": the crash just before `PUT group/promote`, after
//! the fence was written. There the test also checks what the crash left: the fence naming the target in etcd,
//! Codis and the pikas untouched.

use crate::rollout;
use crate::summary;
use crate::support;

use rollout::{assert_one_master, bed_with_master, codis_master, pika_masters, promotes, switchover_env};
use summary::Category;
use support::{describe, run, run_to_completion, Bed};
use testbed::{Ledger, Workload, WorkloadOptions};

/// Points a master switchover has once every client calls the hook: the topology lock and the fence in etcd, the
/// promote, SLAVEOF and CONFIG REWRITE for the other replica and for the old master, the fence's removal.
const MINIMUM_POINTS: usize = 7;

fn fence(bed: &Bed) -> Option<String> {
    crate::attack::with_etcd(bed, |etcd, prefix| async move {
        let key = pika_action::steps::transfer::fence_key(&prefix, bed.gid(0).unwrap());
        etcd.get(&key).await.unwrap().map(|e| e.value)
    })
}

#[test]
fn a_master_switchover_killed_at_any_mutation_converges_when_run_again() {
    let mut points = Category::new("crash: switchover");
    let mut tried: Vec<(usize, String)> = Vec::new();
    let mut between_fence_and_promote = false;
    let mut completed = false;
    for n in 1..=40 {
        let bed = bed_with_master(3, 0);
        // Clients through a codis-proxy before and during the crashed run and its rerun: every acknowledged key must
        // be there afterwards.
        let proxy = bed.start_proxy();
        let mut ledger = Ledger::preload(&proxy.data_addr(), &format!("pre{n}"), 300).expect("preload");
        let writer = Workload::start(WorkloadOptions {
            prefix: format!("during{n}"),
            ..WorkloadOptions::through(&[proxy.data_addr()])
        });
        let mut env = switchover_env(&bed, 0, None);
        // Long enough that the rerun outwaits the dead run's topology lock in one go: a lock is waited for a third
        // of the budget, 25 s, against the lock's 15 s TTL plus etcd's own delay in revoking an expired lease (with
        // 50 s the wait was 16.7 s, and a loaded CI machine ran out of it twice).
        env.insert("ACTION_BUDGET_SECONDS".into(), "75".into());
        env.insert("PIKA_ACTION_CRASH_AT".into(), n.to_string());
        let out = run("switchover", &env);
        if out.status.code() == Some(0) {
            completed = true;
            assert_one_master(&bed, codis_master(&bed));
            ledger.merge(writer.stop());
            ledger.verify_kept(&proxy.data_addr(), &bed.codis).unwrap_or_else(|e| panic!("no crash: {e}"));
            break;
        }
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let marker = format!("crash point {n}: aborting before ");
        let what = stderr
            .lines()
            .find_map(|l| l.split_once(&marker).map(|(_, w)| w.to_owned()))
            .unwrap_or_else(|| panic!("run {n} neither finished nor crashed: {}", describe(&out)));
        let label = format!("crash point {n:>2}: before {what}");
        points.trial(&label, || {
            if what.contains("/group/promote/") {
                // The crash between the fence and the promote: only the fence is there.
                let target = fence(&bed).expect("the fence is written before the promote");
                assert_ne!(target, bed.cluster.shards[0].pod(0).server());
                assert_eq!(codis_master(&bed), 0, "nothing promoted yet");
                assert_eq!(pika_masters(&bed).len(), 1);
                between_fence_and_promote = true;
            }
            env.remove("PIKA_ACTION_CRASH_AT");
            run_to_completion("switchover", &env);
            let master = codis_master(&bed);
            assert_ne!(master, 0, "the master did not move");
            assert_one_master(&bed, master);
            assert_eq!(promotes(&bed), 1, "{:?}", bed.mutations());
            assert_eq!(fence(&bed), None, "the fence was left behind");
            ledger.merge(writer.stop());
            ledger.verify_kept(&proxy.data_addr(), &bed.codis).unwrap_or_else(|e| panic!("{what}: {e}"));
        });
        eprintln!("{label}: tried");
        tried.push((n, what));
    }
    assert!(completed, "the switchover never completed within 40 crash points");
    assert!(between_fence_and_promote, "no crash point between the fence and the promote: {tried:?}");
    assert!(
        tried.len() >= MINIMUM_POINTS,
        "only {} crash points ({tried:?}); every Codis, pika and etcd mutation must call failpoint::step",
        tried.len()
    );
    points.finish();
}
