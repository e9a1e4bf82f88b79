//! Fail points (built with `--features failpoints`): `rejoin` of a master back on an empty volume, killed before
//! each of its mutations in turn — the group's transfer lock, the fence, the promote, the replicas' SLAVEOF and
//! CONFIG REWRITE, the fence's removal, the failover record, the config file — then run again as the restarted
//! container would: the handover completes exactly once (one promote), the empty pod's config follows the new master,
//! and once it starts no acknowledged key is lost and only one server answers `role:master`.

use crate::failover_bed;
use crate::summary;
use crate::support;

use failover_bed::{kill9, lag_now, FailoverBed, Options, PATIENCE};
use support::{describe, eventually};
use testbed::Ledger;

#[test]
fn an_empty_masters_rejoin_killed_at_any_step_converges_when_run_again() {
    // A crash point that does not converge panics in the loop: the category, dropped unfinished, counts it failed.
    let mut category = summary::Category::new("crash: rejoin handover");
    let mut tried: Vec<(usize, String)> = Vec::new();
    let mut completed = false;
    for n in 1..=40 {
        let mut fb = FailoverBed::new(Options::default().shards(1).pods(3));
        let ledger = Ledger::preload(&fb.proxy.data_addr(), "pre", 300).expect("preload");
        assert!(eventually(PATIENCE, || lag_now(&fb, 0, 0) == Some(0)), "replicas did not catch up");
        kill9(&fb.pods(0)[0]);
        let pod = fb.pod_mut(0, 0);
        pod.redis.kill();
        pod.redis.reset_config();
        let _ = std::fs::remove_dir_all(pod.redis.dir().join("appendonlydir"));
        fb.bed.codis.clear_requests();

        let out = fb.rejoin(0, 0, &[("PIKA_ACTION_CRASH_AT", n.to_string())]);
        let what = if out.status.code() == Some(0) {
            completed = true;
            None
        } else {
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            let marker = format!("crash point {n}: aborting before ");
            Some(
                stderr
                    .lines()
                    .find_map(|l| l.split_once(&marker).map(|(_, w)| w.to_owned()))
                    .unwrap_or_else(|| panic!("run {n} neither finished nor crashed: {}", describe(&out))),
            )
        };
        let label = what.clone().unwrap_or_else(|| "nothing (it completed)".to_owned());
        if what.is_some() {
            let again = fb.rejoin(0, 0, &[]);
            assert_eq!(again.status.code(), Some(0), "crash before {label}: rerun: {}", describe(&again));
        }
        let master = fb.codis_master(0);
        assert_ne!(master, 0, "crash before {label}: the empty pod is still the master");
        assert_eq!(fb.promotes(), 1, "crash before {label}: {:?}", fb.bed.mutations());
        let conf = std::fs::read_to_string(fb.pods(0)[0].redis.dir().join("redis.conf")).expect("config");
        let port = fb.pods(0)[master as usize].redis.port();
        assert!(conf.contains(&format!("replicaof 127.0.0.1 {port}")), "crash before {label}: {conf}");
        fb.pod_mut(0, 0).redis.restart();
        assert!(fb.wait_converged(0), "crash before {label}: not converged");
        let masters: Vec<u32> = fb.roles(0).into_iter().filter(|(_, r)| r == "master").map(|(o, _)| o).collect();
        assert_eq!(masters, [master], "crash before {label}");
        let back = ledger.verify_through(&fb.proxy.data_addr());
        assert!(back.is_clean(), "crash before {label}: {}", back.summary());
        eprintln!("rejoin crash point {n:>2}: before {label} -> converged");
        match what {
            Some(what) => {
                category.judge(format!("crash point {n}: before {what}"), true, String::new);
                tried.push((n, what));
            }
            None => break,
        }
    }
    assert!(completed, "rejoin never completed within 40 crash points");
    let points: Vec<&str> = tried.iter().map(|(_, w)| w.as_str()).collect();
    for needed in ["/group/promote/", "SLAVEOF", "write pika config"] {
        assert!(points.iter().any(|p| p.contains(needed)), "no crash point before {needed}: {points:?}");
    }
    category.finish();
}
