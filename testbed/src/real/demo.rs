//! The project's demo: a Pika cluster's life on the servers the chart ships, run by `pika-action` as KubeBlocks
//! would run it.
//!
//! Real pika v4.0.1 pods (each in its own network namespace, started by the chart's own `pika-start.sh` from the
//! chart's own `pika.conf`), the dashboard and a proxy of Pika's Codis fork, real etcd ([`super::bed`]), the
//! actions of KubeBlocks 1.0.x (the chart's default line). It creates 3 shards of 2 pods, writes, adds a shard,
//! removes one, switches a master over, then kills a master and lets the failover watcher replace it, and brings
//! the killed pod back. After each step it prints what Codis and each pika say and reads every key written so far
//! back through the proxy. `scripts/demo.sh` runs it (the `demo` binary); a test runs it too. Everything it starts
//! is gone when it returns.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use super::bed::{Line, RealBed, RealBedOptions};
use super::pika::ReplicaState;
use crate::process::{info_field, RespConnection};

/// Prints one line of the demo's output.
macro_rules! say {
    ($demo:expr, $($arg:tt)*) => {
        $demo.say(&format!($($arg)*))
    };
}

/// Runs the demo with `action` as pika-action, printing to `out`; returns how many problems it showed (an action
/// that failed, a key that did not read back, a failover that did not happen).
///
/// # Panics
/// When the bed cannot start (the real servers not installed, no network namespaces).
pub fn run(action: &Path, out: &mut dyn Write) -> usize {
    let started = Instant::now();
    let mut demo = Demo { keys: Vec::new(), failures: 0, out };
    say!(
        demo,
        "== starting etcd, codis-dashboard and codis-proxy (Pika's fork), and 6 pika v4.0.1 pods (3 shards x 2)"
    );
    let opts = RealBedOptions { shards: 3, pods: 2, line: Line::V1_0, proxies: 1, ..RealBedOptions::default() };
    let mut bed = RealBed::start(&opts, action);
    say!(demo, "   product {}, dashboard {}, proxy {}", bed.name, bed.dashboard.addr(), bed.proxies[0].data_addr());

    say!(demo, "\n== create the cluster: each shard's postProvision registers the shards and assigns the slots");
    for index in 0..bed.shards.len() {
        demo.action(&bed, &["post-provision"], &bed.env(index));
    }
    demo.write(&bed, "created", 1000);
    demo.show(&bed);

    say!(
        demo,
        "\n== scale out to 4 shards: the new shard's postProvision registers it and moves the fewest slots onto it"
    );
    demo.write(&bed, "before-add", 200);
    let added = bed.add_shard(2);
    demo.action(&bed, &["post-provision"], &bed.env(added));
    demo.show(&bed);

    say!(demo, "\n== scale in to 3 shards: the leaving shard's preTerminate drains its slots, then removes its group");
    demo.write(&bed, "before-remove", 200);
    let removed = 1;
    let mut env = bed.env(removed);
    env.extend(bed.legacy_env(&[removed]));
    env.insert("KB_CLUSTER_COMPONENT_IS_SCALING_IN".into(), "true".into());
    demo.action(&bed, &["pre-terminate"], &env);
    bed.remove_shard(removed);
    demo.show(&bed);

    say!(demo, "\n== switch the first shard's master over: switchover promotes its replica through Codis");
    demo.write(&bed, "before-switchover", 200);
    demo.action(&bed, &["switchover"], &bed.switchover_env(0));
    demo.show(&bed);

    say!(demo, "\n== kill the first shard's master (SIGKILL); the failover watcher beside the dashboard replaces it");
    demo.write(&bed, "before-kill", 200);
    let watcher = bed.start_watcher();
    let master = bed.master_ordinal(0);
    let killed = bed.shards[0].pod(master).server();
    // Keys written just before the kill may not have reached the replica (replication is asynchronous): give it
    // the time a real client's writes would have had.
    std::thread::sleep(Duration::from_secs(1));
    bed.shards[0].pod_mut(master).kill();
    say!(demo, "   killed {}", short(&killed));
    let deadline = Instant::now() + Duration::from_secs(60);
    let kill_time = Instant::now();
    while Instant::now() < deadline && bed.topology().group_of(&killed).and_then(|g| g.master()) == Some(&killed) {
        std::thread::sleep(Duration::from_millis(200));
    }
    match bed.topology().group_of(&killed).and_then(|g| g.master().map(str::to_owned)) {
        Some(m) if m != killed => {
            say!(demo, "   Codis lists {} as master {:.1}s after the kill", short(&m), secs(kill_time))
        }
        _ => {
            say!(demo, "   no failover within 60 s; the watcher said:\n{}", indent(&watcher.log()));
            demo.failures += 1;
        }
    }
    demo.show(&bed);

    say!(
        demo,
        "\n== the killed pod comes back: its start (pika-start.sh, rejoin first) makes it a replica of the new master"
    );
    bed.start_pod(0, master);
    demo.show(&bed);
    drop(watcher);

    let failures = demo.failures;
    drop(bed);
    say!(demo, "\n== demo finished in {:.0}s; every process, namespace and file it made is gone", secs(started));
    if failures == 0 {
        say!(demo, "   every action succeeded and every key written was read back");
    } else {
        say!(demo, "   {failures} problem(s), shown above");
    }
    failures
}

struct Demo<'a> {
    /// Every key written so far, its value `v-<key>`.
    keys: Vec<String>,
    failures: usize,
    out: &'a mut dyn Write,
}

impl Demo<'_> {
    fn say(&mut self, line: &str) {
        // The demo's output is what it is for: a closed output ends nothing else.
        let _ = writeln!(self.out, "{line}");
        let _ = self.out.flush();
    }

    /// Runs an action until it is done, as KubeBlocks would (rerunning on exit 75); prints what it said.
    fn action(&mut self, bed: &RealBed, args: &[&str], env: &BTreeMap<String, String>) {
        say!(self, "$ pika-action {}", args.join(" "));
        let started = Instant::now();
        for run in 1..=10 {
            let out = bed.run(args, env);
            let stderr = String::from_utf8_lossy(&out.stderr);
            let last = stderr.lines().last().unwrap_or_default();
            match out.status.code() {
                Some(0) => {
                    let said = String::from_utf8_lossy(&out.stdout);
                    say!(self, "   exit 0 after {:.1}s ({run} run(s)) {}", secs(started), said.trim());
                    return;
                }
                Some(75) => say!(self, "   exit 75 (its time budget used up; KubeBlocks reruns it): {last}"),
                other => {
                    say!(self, "   exit {other:?}: {last}");
                    self.failures += 1;
                    return;
                }
            }
        }
        say!(self, "   still not done after 10 runs");
        self.failures += 1;
    }

    /// Writes `n` keys through the proxy.
    fn write(&mut self, bed: &RealBed, prefix: &str, n: usize) {
        let Ok(mut conn) = bed.proxies[0].connect() else {
            say!(self, "   cannot reach the proxy");
            self.failures += 1;
            return;
        };
        let mut written = 0;
        for i in 0..n {
            let key = format!("{prefix}:{i}");
            if conn.command(&["SET", &key, &format!("v-{key}")]).as_deref() == Ok("+OK") {
                self.keys.push(key);
                written += 1;
            }
        }
        say!(self, "   wrote {written} of {n} keys \"{prefix}:*\" through the proxy");
        if written < n {
            self.failures += 1;
        }
    }

    /// What Codis and each pika say once every replica Codis lists is in sync (or after 20 s, saying so), and
    /// every key written so far read back through the proxy.
    fn show(&mut self, bed: &RealBed) {
        let waited = Instant::now();
        let in_sync = |bed: &RealBed| {
            let topology = bed.topology();
            topology.groups.iter().flat_map(|g| g.servers.iter().skip(1)).all(|s| {
                let says = pika_says(bed, s);
                says == "unreachable" || (says.contains("link up") && says.ends_with("db0 connected"))
            })
        };
        while !in_sync(bed) && waited.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(200));
        }
        if in_sync(bed) {
            say!(self, "   every reachable replica in sync {:.1}s after the step", secs(waited));
        } else {
            say!(self, "   not every replica in sync 20 s after the step");
        }
        let topology = bed.topology();
        say!(self, "   Codis: {} groups, {} slots migrating", topology.groups.len(), topology.migrating);
        for group in &topology.groups {
            let slots: Vec<usize> = (0..topology.slots.len()).filter(|&s| topology.slots[s] == group.id).collect();
            say!(self, "   group {:>2}: {:>4} slots {}", group.id, slots.len(), ranges(&slots));
            for (i, server) in group.servers.iter().enumerate() {
                let listed = if i == 0 { "master " } else { "replica" };
                say!(self, "      {listed} {:<14} pika says: {}", short(server), pika_says(bed, server));
            }
        }
        let mut conn = bed.proxies[0].connect().ok();
        let read = self
            .keys
            .iter()
            .filter(|k| conn.as_mut().and_then(|c| c.command(&["GET", k]).ok()).is_some_and(|v| v == format!("v-{k}")))
            .count();
        say!(self, "   keys: {} written so far, {read} read back through the proxy", self.keys.len());
        if read < self.keys.len() {
            self.failures += 1;
        }
    }
}

/// A pod's own account of its role, from `INFO replication`.
fn pika_says(bed: &RealBed, server: &str) -> String {
    let Some(pod) = bed.shards.iter().flat_map(|s| &s.pods).find(|p| p.server() == server) else {
        return "(not a pod of the cluster)".to_owned();
    };
    let info = RespConnection::connect(&pod.addr(), Some(&bed.password), Duration::from_secs(1))
        .and_then(|mut c| c.command(&["INFO", "replication"]));
    let Ok(info) = info else {
        return "unreachable".to_owned();
    };
    match ReplicaState::of(&info) {
        Some(r) => {
            let of = bed
                .shards
                .iter()
                .flat_map(|s| &s.pods)
                .find(|p| p.addr().starts_with(&format!("{}:", r.master_host)))
                .map_or(r.master_host.clone(), |p| p.name.clone());
            let link = if r.link_up { "up" } else { "down" };
            format!("slave of {}, link {link}, db0 {}", short(&of), r.db0)
        }
        None => {
            let slaves = info_field(&info, "connected_slaves").unwrap_or_default();
            format!("{}, {} connected slave(s)", info_field(&info, "role").unwrap_or_default(), slaves.trim())
        }
    }
}

/// A pod's name, from its server address or name.
fn short(server: &str) -> String {
    server.split('.').next().unwrap_or_default().to_owned()
}

fn secs(since: Instant) -> f64 {
    since.elapsed().as_secs_f64()
}

fn indent(text: &str) -> String {
    text.lines().rev().take(15).collect::<Vec<_>>().into_iter().rev().map(|l| format!("      {l}\n")).collect()
}

fn ranges(slots: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut iter = slots.iter().copied().peekable();
    while let Some(start) = iter.next() {
        let mut end = start;
        while iter.peek() == Some(&(end + 1)) {
            end = iter.next().unwrap_or(end);
        }
        out.push(if start == end { format!("{start}") } else { format!("{start}-{end}") });
    }
    if out.len() > 4 {
        format!("[{} ... {}] ({} ranges)", out[0], out[out.len() - 1], out.len())
    } else {
        format!("[{}]", out.join(", "))
    }
}
