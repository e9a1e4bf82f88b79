//! Kept on redis-server and the double while its real-pika version (`integration/real_pika/crash.rs`) is ignored
//! for the acknowledged keys it lost once in CI: member-leave stays crash-tested in every run meanwhile.
//!
//! Crash at every step of `member-leave`, built with `--features failpoints`: the run is aborted before its n-th
//! external mutation (`PIKA_ACTION_CRASH_AT=n`) for n = 1, 2, ... until it completes, in the two cases KubeBlocks
//! produces — the leaving pod is a replica, and it is still the master (KubeBlocks' switchover before it failed and was
//! ignored) so another member is promoted first. After each crash the dead run's lease is let expire and the action is
//! rerun as KubeBlocks requeues it; the group must converge: the pod gone from Codis, exactly one pika master and it
//! Codis's `servers[0]`, every remaining member following it, the master moved at most once, no fence or lock left, and
//! a further run changing nothing; every key acknowledged through a codis-proxy before and during the runs is still
//! readable, through the proxy and on the master.

use crate::attack;
use crate::rollout;
use crate::summary;
use crate::support;

use std::collections::BTreeSet;
use std::time::Duration;

use attack::{etcd_entries, expire_locks, run_until_done, watch};
use rollout::{bed_with_master, codis_master, leave_env, pika_masters, promotes};
use summary::Category;
use support::{describe, eventually, run, Bed};
use testbed::{Ledger, Workload, WorkloadOptions};

fn listed(bed: &Bed) -> BTreeSet<u32> {
    let snap = bed.codis.snapshot();
    bed.cluster.shards[0].pods.iter().filter(|p| snap.server(&p.server()).is_some()).map(|p| p.ordinal).collect()
}

/// Checks the converged group after `leaving` left, with one of `masters` at index 0.
fn assert_converged(bed: &Bed, leaving: u32, masters: &BTreeSet<u32>, label: &str) {
    let remaining: BTreeSet<u32> = (0..3).filter(|o| *o != leaving).collect();
    assert_eq!(listed(bed), remaining, "{label}: servers left in codis");
    let master = codis_master(bed);
    assert!(masters.contains(&master), "{label}: codis master {master}, expected one of {masters:?}");
    let masters: BTreeSet<u32> = pika_masters(bed).into_iter().filter(|o| remaining.contains(o)).collect();
    assert_eq!(masters, BTreeSet::from([master]), "{label}: pika masters among the remaining members");
    let port = bed.cluster.shards[0].pod(master).redis.port();
    for o in remaining.iter().filter(|o| **o != master) {
        let follows = eventually(Duration::from_secs(10), || {
            bed.cluster.shards[0].pod(*o).redis.master().is_some_and(|(h, p, up)| h == "127.0.0.1" && p == port && up)
        });
        assert!(follows, "{label}: pod {o} does not follow pod {master}");
    }
    let left: Vec<String> =
        etcd_entries(bed).into_keys().filter(|k| k.contains("/fence/") || k.contains("/locks/")).collect();
    assert!(left.is_empty(), "{label}: etcd records left: {left:?}");
    bed.codis.clear_requests();
    let out = run("member-leave", &leave_env(bed, leaving));
    assert_eq!(out.status.code(), Some(0), "{label}: {}", describe(&out));
    assert!(bed.mutations().is_empty(), "{label}: a rerun changed codis: {:?}", bed.mutations());
}

/// Crashes `member-leave` of pod `leaving` of a 3-pod group whose master is `master` at every mutation in turn.
fn crash_everywhere(points: &mut Category, master: u32, leaving: u32, expected_masters: &BTreeSet<u32>) {
    for n in 1..60 {
        let bed = bed_with_master(3, master);
        let env = leave_env(&bed, leaving);
        let mut crashing = env.clone();
        crashing.insert("PIKA_ACTION_CRASH_AT".into(), n.to_string());
        // Clients through a codis-proxy before and during the crashed run and its reruns.
        let proxy = bed.start_proxy();
        let mut ledger = Ledger::preload(&proxy.data_addr(), &format!("pre{n}"), 300).expect("preload");
        let writer = Workload::start(WorkloadOptions {
            prefix: format!("during{n}"),
            ..WorkloadOptions::through(&[proxy.data_addr()])
        });
        // One watch over the crashed run and the reruns: the old master may wait for its demotion across both.
        let ((out, rerun), watched) = watch(&bed, || {
            let out = run("member-leave", &crashing);
            if out.status.code() == Some(0) {
                return (out, None);
            }
            expire_locks(&bed);
            (out, Some(run_until_done("member-leave", &env, 10)))
        });
        ledger.merge(writer.stop());
        let Some(rerun) = rerun else {
            assert!(watched.violations.is_empty(), "crash-free run: {:?}", watched.violations);
            assert_converged(&bed, leaving, expected_masters, "crash-free run");
            ledger.verify_kept(&proxy.data_addr(), &bed.codis).unwrap_or_else(|e| panic!("crash-free run: {e}"));
            return;
        };
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let what = stderr.lines().find(|l| l.contains(&format!("crash point {n}:"))).map(str::to_owned);
        let label = format!("leaving {leaving} (master {master}), {}", what.as_deref().unwrap_or("no crash"));
        points.trial(&label, || {
            assert!(what.is_some(), "run {n} failed without crashing: {}", describe(&out));
            rerun.unwrap_or_else(|e| panic!("rerun: {e}"));
            let expected_promotes = usize::from(master == leaving);
            assert_eq!(promotes(&bed), expected_promotes, "promotes {:?}", bed.mutations());
            assert_converged(&bed, leaving, expected_masters, "converged");
            assert!(watched.violations.is_empty(), "{:?}", watched.violations);
            ledger.verify_kept(&proxy.data_addr(), &bed.codis).unwrap_or_else(|e| panic!("converged: {e}"));
        });
    }
    panic!("member-leave of {leaving} never completed without crashing");
}

#[test]
fn member_leave_converges_after_a_crash_before_any_of_its_steps() {
    let mut points = Category::new("crash: member-leave");
    // A replica leaves: one group/del under the lock.
    crash_everywhere(&mut points, 0, 2, &BTreeSet::from([0]));
    let replica_points = points.trials();
    // The master leaves: fence, promote, re-point the other replica and the old master, clear the fence, then the
    // del. The least lagging replica is promoted, the ordinal rule (nothing above 2, so the lowest below, 0) only
    // breaking ties; with the writer running either replica can be a few bytes behind when they are surveyed, so
    // either may be the new master. The rule itself is property-tested in plan.
    crash_everywhere(&mut points, 2, 2, &BTreeSet::from([0, 1]));
    assert!(replica_points >= 2, "only {replica_points} crash points for a replica: are the hooks wired?");
    assert!(
        points.trials() - replica_points >= 7,
        "only {} crash points for the master",
        points.trials() - replica_points
    );
    points.finish();
}
