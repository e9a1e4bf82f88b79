//! Fail points (built with `--features failpoints`): the failover watcher killed before each of its mutations in
//! turn (the election lock, the held-data mark, the group's transfer lock, the fence's compare-and-put, the promote,
//! SLAVEOF and CONFIG REWRITE of the other replica, the fence's removal, the failover record) while it replaces a
//! master killed with `kill -9`; then a new watcher, started as the restarted container would be, must converge:
//! Codis lists a new master, it is the only server answering `role:master`, the other live replica follows it, the
//! promote was sent exactly once (a crash after it is finished by repair, never by a second promote), and every key
//! written before the kill is read back through the proxy. The points are numbered (`PIKA_ACTION_CRASH_AT`); the
//! fence's write, the promote and the SLAVEOF, when background work moved them off the numbers tried, are crashed
//! before by name (`PIKA_ACTION_CRASH_BEFORE`).

use crate::failover_bed;
use crate::summary;
use crate::support;

use failover_bed::{held_data, kill9, lag_now, FailoverBed, Options, PATIENCE};
use support::eventually;
use testbed::Ledger;

#[test]
fn a_watcher_killed_at_any_step_of_a_failover_is_replaced_by_one_that_converges_on_one_master() {
    // A crash point that does not converge panics in a trial: the category, dropped unfinished, counts it failed.
    let mut category = summary::Category::new("crash: failover watcher");
    let mut tried: Vec<String> = Vec::new();
    let mut completed = false;
    for n in 1..=40 {
        let Some(what) = trial("PIKA_ACTION_CRASH_AT", &n.to_string()) else {
            // Past every point of the failover: it completed without crashing.
            completed = true;
            break;
        };
        eprintln!("watcher crash point {n:>2}: before {what} -> converged after the restart");
        category.judge(format!("crash point {n}: before {what}"), true, String::new);
        tried.push(what);
    }
    assert!(completed, "the failover never completed within 40 crash points");
    // The watcher's sweeps and repairs write to etcd too, at times of their own: a mutation of the failover may go
    // unnumbered in one run. Those that must be crashed before are then crashed before by name.
    for needed in ["/group/promote/", "SLAVEOF", "etcd compare_and_put"] {
        if tried.iter().any(|p| p.contains(needed)) {
            continue;
        }
        let what = trial("PIKA_ACTION_CRASH_BEFORE", needed)
            .unwrap_or_else(|| panic!("the failover completed with a crash point set before {needed}"));
        assert!(what.contains(needed), "asked to crash before {needed}, crashed before {what}");
        eprintln!("watcher crash point before {what} (by name) -> converged after the restart");
        category.judge(format!("crash point by name: before {what}"), true, String::new);
        tried.push(what);
    }
    category.finish();
}

/// One failover with the watcher's crash point set by `var` = `value`: returns the mutation it crashed before, once a
/// restarted watcher converged ([`assert_converged`]), or `None` when it failed over without crashing.
fn trial(var: &str, value: &str) -> Option<String> {
    let mut fb = FailoverBed::new(Options::default().shards(1).pods(3));
    let gid = fb.gid(0);
    let ledger = Ledger::preload(&fb.proxy.data_addr(), "pre", 300).expect("preload");
    assert!(eventually(PATIENCE, || lag_now(&fb, 0, 0) == Some(0)), "replicas did not catch up");
    let mut env = fb.watch_env("watcher-a", 800);
    env.insert(var.into(), value.into());
    let mut crashing = fb.watcher("watcher-a", &env);
    // Up and leading with the group marked, or already dead at an earlier point.
    assert!(
        eventually(PATIENCE, || crashing.exited().is_some()
            || (crashing.log().contains("leading") && held_data(&fb, gid))),
        "{}",
        crashing.log()
    );
    fb.bed.codis.clear_requests();
    let old = fb.codis_master(0);
    kill9(&fb.pods(0)[old as usize]);
    fb.pod_mut(0, old).redis.kill();
    assert!(
        eventually(PATIENCE, || crashing.log().contains("crash point") || crashing.log().contains("failover done")),
        "{var}={value}: neither crashed nor failed over:\n{}",
        crashing.log()
    );
    let log = crashing.log();
    let Some(what) = log
        .lines()
        .filter(|l| l.starts_with("crash point "))
        .find_map(|l| l.split_once(": aborting before ").map(|(_, w)| w.to_owned()))
    else {
        crashing.terminate();
        assert_converged(&fb, old, &ledger, "no crash");
        return None;
    };
    // (`exited` reports an exit once; a reaped watcher has no process id left.)
    assert!(
        eventually(PATIENCE, || crashing.pid().is_none() || crashing.exited().is_some()),
        "crashed but still running"
    );

    let restarted = fb.watcher("watcher-b", &fb.watch_env("watcher-b", 800));
    assert!(
        eventually(PATIENCE, || fb.codis_master(0) != old && fb.wait_converged(0)),
        "crash before {what}: not converged:\n{}",
        restarted.log()
    );
    assert_converged(&fb, old, &ledger, &what);
    Some(what)
}

/// One new master, the only `role:master`, every live replica following it, promoted once, no key lost.
fn assert_converged(fb: &FailoverBed, old: u32, ledger: &Ledger, what: &str) {
    assert!(fb.wait_converged(0), "crash before {what}: the group did not converge");
    let master = fb.codis_master(0);
    assert_ne!(master, old, "crash before {what}: the dead master is still listed");
    let masters: Vec<u32> = fb.roles(0).into_iter().filter(|(_, r)| r == "master").map(|(o, _)| o).collect();
    assert_eq!(masters, [master], "crash before {what}: masters answering");
    assert_eq!(fb.promotes(), 1, "crash before {what}: {:?}", fb.bed.mutations());
    let back = ledger.verify_through(&fb.proxy.data_addr());
    assert!(back.is_clean(), "crash before {what}: {}", back.summary());
}
