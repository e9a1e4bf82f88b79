//! The project's demo: a Pika cluster's life on loopback, run by `pika-action` exactly as KubeBlocks would run it.
//!
//! A real etcd, real redis-servers standing in for the pika pods, the Codis dashboard double and one proxy double.
//! It creates a 3-shard cluster (2 pods each), adds a shard, removes one, and switches a master, printing what each
//! action said and what Codis and the servers show afterwards. `scripts/demo.sh` builds and runs it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use testbed::cluster::Bed;
use testbed::{DoubleOptions, ProxyDouble};

fn main() -> ExitCode {
    let binary = std::env::args().nth(1).map_or_else(sibling_binary, PathBuf::from);
    // Actions run with working directory `/`, as under kbagent: the path must not be relative.
    let binary = std::fs::canonicalize(&binary).unwrap_or(binary);
    if !binary.exists() {
        eprintln!("demo: {} not found; build it first (cargo build --bins)", binary.display());
        return ExitCode::FAILURE;
    }
    println!("== starting etcd, 6 redis-servers (3 shards x 2 pods), the Codis dashboard double and a proxy");
    let opts = DoubleOptions { tick: Duration::from_millis(20), ..DoubleOptions::default() };
    let mut bed = Bed::builder().shards(3).pods(2).bed(opts);
    let proxy = ProxyDouble::start(bed.codis.product());
    let online = bed.codis.call("PUT", &format!("/api/topom/proxy/online/{{xauth}}/{}", proxy.admin_addr()));
    println!(
        "   dashboard {} (product {}), proxy {} online: {}",
        bed.codis.addr(),
        bed.codis.product(),
        proxy.admin_addr(),
        online.is_ok()
    );

    let mut failures = 0;
    let mut step = |title: &str, action: &str, env: BTreeMap<String, String>, bed: &Bed| {
        println!("\n== {title}\n$ pika-action {action}");
        if !run(&binary, action, &env) {
            failures += 1;
        }
        print_topology(bed);
    };

    step(
        "create the cluster: post-provision registers every shard and assigns the slots",
        "post-provision",
        bed.env(0),
        &bed,
    );

    let added = bed.add_shard(2);
    let mut env = bed.env(0);
    env.insert("KB_ADD_SHARD_NAME".into(), bed.cluster.shards[added].full.clone());
    step(
        "scale out to 4 shards: shard-add registers the new shard and moves the fewest slots onto it",
        "shard-add",
        env,
        &bed,
    );

    let removed = 1;
    let remaining: Vec<usize> = (0..bed.cluster.shards.len()).filter(|&i| i != removed).collect();
    let mut env = bed.env(0);
    env.insert("KB_REMOVE_SHARD_NAME".into(), bed.cluster.shards[removed].full.clone());
    env.insert("ALL_SHARDS_POD_FQDNS".into(), bed.cluster.all_shards_of(&remaining));
    step(
        "scale in to 3 shards: shard-remove drains the leaving shard's slots, then removes its group",
        "shard-remove",
        env,
        &bed,
    );

    let shard = &bed.cluster.shards[0];
    let master = shard.pod(0);
    let mut env = bed.env(0);
    env.insert("KB_SWITCHOVER_CURRENT_NAME".into(), master.name.clone());
    env.insert("KB_SWITCHOVER_CURRENT_FQDN".into(), master.fqdn.clone());
    env.insert("KB_SWITCHOVER_ROLE".into(), "master".into());
    step("restart the first shard's master: switchover moves mastership to its replica first", "switchover", env, &bed);

    drop(proxy);
    if failures == 0 {
        println!("\n== demo finished: every action succeeded");
        ExitCode::SUCCESS
    } else {
        println!("\n== demo finished: {failures} action(s) failed (see above)");
        ExitCode::FAILURE
    }
}

/// `pika-action` next to this executable (both are built into the same target directory).
fn sibling_binary() -> PathBuf {
    let me = std::env::current_exe().unwrap_or_default();
    me.with_file_name("pika-action")
}

/// Runs the action until it is done, as KubeBlocks would (reruns on exit 75); prints what it said.
fn run(binary: &PathBuf, action: &str, env: &BTreeMap<String, String>) -> bool {
    let started = Instant::now();
    for attempt in 1..=20 {
        let out = Command::new(binary)
            .arg(action)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(env)
            .current_dir("/")
            .output();
        let Ok(out) = out else {
            println!("   could not run {}", binary.display());
            return false;
        };
        let code = out.status.code();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr.lines().last().unwrap_or_default();
        match code {
            Some(0) => {
                println!(
                    "   exit 0 after {:.1}s ({attempt} run(s)): {}",
                    started.elapsed().as_secs_f64(),
                    stdout.trim()
                );
                return true;
            }
            Some(75) => println!("   exit 75 (budget used up, KubeBlocks reruns it): {last}"),
            other => {
                println!("   exit {other:?}: {last}");
                return false;
            }
        }
    }
    false
}

/// Codis's view, and what each server says about itself.
fn print_topology(bed: &Bed) {
    let snap = bed.codis.snapshot();
    for group in &snap.groups {
        let slots: Vec<usize> = snap.slots.iter().filter(|s| s.group_id == group.id).map(|s| s.id).collect();
        println!("   group {:>2}: {:>4} slots {}", group.id, slots.len(), ranges(&slots));
        for (i, server) in group.servers.iter().enumerate() {
            let pod = bed.cluster.shards.iter().flat_map(|s| &s.pods).find(|p| p.server() == server.server);
            let role = pod.map_or_else(|| "?".to_owned(), |p| p.redis.role());
            let short = server.server.split('.').next().unwrap_or_default();
            println!("      {} {short:<16} pika role: {role}", if i == 0 { "master " } else { "replica" });
        }
    }
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
