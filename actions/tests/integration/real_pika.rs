//! The real-pika tier: pika v4.0.1 pods (each in its own network namespace, started by the chart's own
//! `pika-start.sh` from the chart's own `pika.conf`), the dashboard and proxy of Pika's Codis fork, real etcd
//! (`testbed::real`). pika-action runs with the chart's environment and reaches pods by their FQDNs, as in a cluster.
//! Every outcome is read from the dashboard, the pikas and the proxy.

use std::path::Path;

use testbed::process::info_field;
use testbed::real::bed::{Line, RealBed, RealBedOptions};

use crate::support::describe;

fn action() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_pika-action"))
}

fn bed(shards: usize, pods: u32, line: Line, proxies: usize) -> RealBed {
    RealBed::start(&RealBedOptions { shards, pods, line, proxies }, action())
}

/// Runs the action until it exits 0, rerunning on 75 (as KubeBlocks requeues); panics on anything else.
fn run_to_completion(bed: &RealBed, args: &[&str], env: &std::collections::BTreeMap<String, String>) {
    for _ in 0..30 {
        let out = bed.run(args, env);
        match out.status.code() {
            Some(0) => return,
            Some(75) => continue,
            _ => panic!("{args:?} failed: {}\ndashboard log:\n{}", describe(&out), bed.dashboard.log()),
        }
    }
    panic!("{args:?} did not finish in 30 runs");
}

/// Writes `n` keys through the proxy; returns them.
fn write_through_proxy(bed: &RealBed, prefix: &str, n: usize) -> Vec<String> {
    let mut conn = bed.proxies[0].connect().expect("connect to codis-proxy");
    (0..n)
        .map(|i| {
            let key = format!("{prefix}:{i}");
            let reply = conn.command(&["SET", &key, &format!("v-{key}")]).expect("SET through codis-proxy");
            assert_eq!(reply, "+OK", "SET {key} through codis-proxy");
            key
        })
        .collect()
}

/// Every key of `keys` whose value read through the proxy is not the one written.
fn missing_through_proxy(bed: &RealBed, keys: &[String]) -> Vec<String> {
    let mut conn = bed.proxies[0].connect().expect("connect to codis-proxy");
    keys.iter().filter(|k| conn.command(&["GET", k]).ok().as_deref() != Some(&format!("v-{k}"))).cloned().collect()
}

#[test]
fn a_fresh_pod_of_the_chart_serves_on_an_empty_volume() {
    // No Codis registration: only the pika container's start on an empty volume, as a new pod of the chart.
    let bed = bed(1, 1, Line::V1_1, 0);
    let pod = bed.shards[0].pod(0);
    // The persisted config did not exist; pika-start.sh made it from the chart's template, and pika serves it.
    let persisted = std::fs::read_to_string(pod.volume().join("pika.conf")).expect("the persisted pika.conf");
    assert!(persisted.lines().any(|l| l.trim() == "slotmigrate : yes"), "{persisted}");
    let mut conn = pod.connect();
    for (key, expected) in [("slotmigrate", "yes"), ("default-slot-num", "1024"), ("databases", "1")] {
        let reply = conn.command(&["CONFIG", "GET", key]).expect("CONFIG GET");
        assert_eq!(reply.lines().nth(1), Some(expected), "CONFIG GET {key}: {reply}");
    }
    assert_eq!(info_field(&pod.info_replication(), "role").as_deref(), Some("master"));
    // The password protects it: a client without it is refused.
    let anonymous = testbed::process::RespConnection::connect(&pod.addr(), None, std::time::Duration::from_secs(5))
        .and_then(|mut c| c.command(&["SET", "k", "v"]))
        .expect("reach pika");
    assert!(anonymous.starts_with("-"), "pika took a write without the password: {anonymous}");
}

#[test]
fn post_provision_registers_a_shard_of_real_pikas_on_the_forks_dashboard() {
    let bed = bed(1, 2, Line::V1_1, 1);
    run_to_completion(&bed, &["post-provision"], &bed.env(0));
    let gid = bed.assert_registered(0, 0);
    let topology = bed.topology();
    assert_eq!(topology.groups.len(), 1, "{topology:?}");
    assert_eq!(topology.slots_of(gid), topology.slots.len(), "every slot to the one group: {topology:?}");
    assert_eq!(topology.slots.len(), 1024);

    let keys = write_through_proxy(&bed, "first", 200);
    assert_eq!(missing_through_proxy(&bed, &keys), Vec::<String>::new(), "keys lost through the proxy");
    // The replica holds them too, once its binlog is applied.
    let held =
        testbed::cluster::eventually(std::time::Duration::from_secs(20), || bed.missing_on(0, 1, &keys).is_empty());
    assert!(held, "the replica lacks {} of 200 keys", bed.missing_on(0, 1, &keys).len());

    // Running it again changes nothing.
    let out = bed.run(&["post-provision"], &bed.env(0));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(bed.topology(), topology);
}
