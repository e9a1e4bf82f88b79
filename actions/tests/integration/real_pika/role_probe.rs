//! `role-probe` against real pika v4.0.1, run as kbagent runs it: inside the pod's network namespace, reaching its
//! pika at 127.0.0.1 with the component's variables. Replaces the redis-server version: what the probe reads is
//! pika's own `INFO replication`.

use std::collections::BTreeMap;
use std::process::Output;

use testbed::real::bed::{Line, RealBed};

use super::{created, switchover, with};
use crate::support::describe;

/// The probe's environment: the component's variables plus the `PIKA_HOST` the chart gives it.
fn probe_env(bed: &RealBed) -> BTreeMap<String, String> {
    with(bed.env(0), &[("PIKA_HOST", "127.0.0.1".to_owned())])
}

fn probe(bed: &RealBed, ordinal: u32, env: &BTreeMap<String, String>) -> Output {
    bed.run_in_pod(0, ordinal, &["role-probe"], env)
}

fn printed(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Each pod's probe prints its pika's role, exactly `master` or `slave`: the registered master and its replica,
/// then the two swapped by a switchover, and a replica whose master died still `slave` (KubeBlocks needs a role on
/// every pod; the failover is not the probe's to decide).
#[test]
fn role_probe_prints_each_pods_role_across_a_switchover_and_a_dead_master() {
    let mut bed = created(1, 2, Line::V1_1);
    let env = probe_env(&bed);
    let master = bed.master_ordinal(0);
    let replica = 1 - master;
    for (ordinal, role) in [(master, "master\n"), (replica, "slave\n")] {
        let out = probe(&bed, ordinal, &env);
        assert_eq!((out.status.code(), printed(&out).as_str()), (Some(0), role), "pod {ordinal}: {}", describe(&out));
    }
    switchover(&bed, 0);
    assert_eq!(bed.master_ordinal(0), replica, "the switchover did not move the master");
    for (ordinal, role) in [(replica, "master\n"), (master, "slave\n")] {
        let out = probe(&bed, ordinal, &env);
        assert_eq!((out.status.code(), printed(&out).as_str()), (Some(0), role), "pod {ordinal}: {}", describe(&out));
    }
    bed.shards[0].pod_mut(replica).kill();
    let down = testbed::cluster::eventually(std::time::Duration::from_secs(30), || {
        testbed::real::pika::ReplicaState::of(&bed.shards[0].pod(master).info_replication()).is_some_and(|s| !s.link_up)
    });
    assert!(down, "the replica never saw its master go");
    let out = probe(&bed, master, &env);
    assert_eq!((out.status.code(), printed(&out).as_str()), (Some(0), "slave\n"), "{}", describe(&out));
}

/// A pika that does not answer, or refuses the password: exit 1, nothing on stdout (KubeBlocks reads stdout as
/// the role), and a wrong password never printed.
#[test]
fn role_probe_of_an_unreachable_or_refusing_pika_is_exit_1_with_nothing_on_stdout_and_no_password() {
    let mut bed = created(1, 2, Line::V1_1);
    let mut env = probe_env(&bed);
    env.insert("PIKA_PASSWORD".into(), "wrong-secret-9".into());
    let out = probe(&bed, 0, &env);
    let all = format!("{}{}", printed(&out), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(out.stdout.is_empty(), "{all}");
    assert!(!all.contains("wrong-secret-9") && !all.contains(&bed.password), "a password reached the output: {all}");
    let env = probe_env(&bed);
    bed.shards[0].pod_mut(1).kill();
    let out = probe(&bed, 1, &env);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(out.stdout.is_empty(), "{}", describe(&out));
}
