//! What a scale-out costs on the real servers, the product's way against Codis's own: pika v4.0.1 pods (each in its
//! own network namespace, started by the chart's `pika-start.sh`), the dashboard and proxy of Pika's Codis fork with
//! the chart's migration settings, real etcd, the failover watcher running as the chart runs it.
//!
//! Each comparison starts two fresh beds of the same shape (1.1, two pods per shard), preloads `SPLIT_BENCH_KEYS`
//! (default 20000) keys through the proxy and keeps a writer going through it, sending `SET`s one after another as
//! fast as the proxy answers and timing each one. Both ways first register every new shard on its own (component
//! postProvision `--own-shard`, which moves no slot). Then:
//!
//! - **product**: the ShardingDefinition's shardAdd for each new shard, as a 1.1 reconcile calls them: each once, in
//!   turn, those that exit 75 again in the next reconcile.
//!   A new shard the planner splits off a donor copies it by replication (a full sync copies RocksDB files) and takes
//!   its slots at a fenced cutover; the rest migrates;
//! - **codis**: `codis-admin --rebalance --confirm`, Codis's own procedure, every slot migrated key by key by its
//!   executor.
//!
//! Each time runs from the first registration's start until every action exited 0 and Codis holds no slot action.
//! Reported: both times and their ratio (targets: 4→8 at most 0.6, 3→4 at most 1.0), the longest a write waited
//! while the change ran, the writes refused, and for the product each cutover's hold as the action logged it
//! (target: at most 0.2 s). Afterwards every acknowledged key must read back through the proxy and no master may hold
//! a key of a slot its group does not own; either failing fails the bench.
//!
//! `cargo bench -p pika-action --bench split` (needs root and the servers `scripts/setup.sh` installs);
//! `SPLIT_BENCH_ONLY=4-8` or `3-4` runs one comparison, `SPLIT_BENCH_RUNS=n` runs each `n` times, the two ways
//! alternating, and compares the medians (Codis's own time varies by a factor of three from run to run here: pika's
//! migration refuses a batch now and then, "may be currently migrating", and Codis tries the slot again seconds
//! later).

#[path = "support/real_bench.rs"]
mod real_bench;

use std::path::Path;
use std::time::{Duration, Instant};

use real_bench::{logged, reconcile, run_to_completion, Beat, Writer};
use testbed::real::bed::{Line, RealBed, RealBedOptions};

/// What one way of scaling cost.
struct Outcome {
    took: Duration,
    stall: Duration,
    failed: usize,
    /// Each cutover's hold, in milliseconds, as the action logged it (the product's way only).
    holds: Vec<u64>,
    acked: usize,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    Product,
    Codis,
}

impl Way {
    fn name(self) -> &'static str {
        match self {
            Self::Product => "product",
            Self::Codis => "codis",
        }
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let keys: usize = std::env::var("SPLIT_BENCH_KEYS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let runs: usize = std::env::var("SPLIT_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(1).max(1);
    let only = std::env::var("SPLIT_BENCH_ONLY").unwrap_or_default();
    for (from, to, target) in [(4usize, 8usize, 0.6f64), (3, 4, 1.0)] {
        if !only.is_empty() && only != format!("{from}-{to}") {
            continue;
        }
        // The two ways alternate, so that whatever drifts on the machine touches both alike.
        let (mut products, mut codises) = (Vec::new(), Vec::new());
        for run in 1..=runs {
            let product = scale(Way::Product, from, to, keys, run);
            let codis = scale(Way::Codis, from, to, keys, run);
            for (name, o) in [(Way::Product.name(), &product), (Way::Codis.name(), &codis)] {
                println!(
                    "{from}->{to} {name}: {} ms, longest write {} ms, writes refused {}, acknowledged {}{}",
                    o.took.as_millis(),
                    o.stall.as_millis(),
                    o.failed,
                    o.acked,
                    if o.holds.is_empty() { String::new() } else { format!(", cutover holds (ms) {:?}", o.holds) }
                );
            }
            products.push(product.took);
            codises.push(codis.took);
        }
        let median = |v: &mut Vec<Duration>| {
            v.sort_unstable();
            v[v.len() / 2]
        };
        let (p, c) = (median(&mut products), median(&mut codises));
        let ratio = p.as_secs_f64() / c.as_secs_f64();
        println!(
            "{from}->{to}: product / codis = {ratio:.2} (medians of {runs}: {} ms / {} ms; target at most {target})",
            p.as_millis(),
            c.as_millis()
        );
    }
}

/// One scale-out from `from` to `to` shards on a fresh bed, the given way, with `keys` keys preloaded and a writer
/// going, its logs kept under `split-bench/<from>-<to>-<way>-<run>` in the temporary directory; panics when an acknowledged key is lost or a master keeps a key of a slot its group does not own.
fn scale(way: Way, from: usize, to: usize, keys: usize, run: usize) -> Outcome {
    let action = Path::new(env!("CARGO_BIN_EXE_pika-action"));
    let mut bed = RealBed::start(
        &RealBedOptions { shards: from, pods: 2, line: Line::V1_1, ..RealBedOptions::default() },
        action,
    );
    for index in 0..from {
        run_to_completion(&bed, &["post-provision", "--own-shard"], &bed.env(index));
    }
    run_to_completion(&bed, &["post-provision"], &bed.env(0));
    let names: Vec<String> = (0..keys).map(|n| format!("pre:{n}")).collect();
    let preloaded = testbed::Ledger::write_keys_authed(bed.proxies[0].data_addr(), Some(&bed.password), &names)
        .expect("preload through the proxy");
    assert_eq!(preloaded.acked.len(), keys, "preload: {:?}", preloaded.errors);
    let _watcher = bed.start_watcher();
    let writer = Writer::start(&bed);
    let started = Instant::now();
    while writer.acked() < 200 {
        assert!(started.elapsed() < Duration::from_secs(20), "the writer got no write through the proxy");
        std::thread::sleep(Duration::from_millis(10));
    }

    // The new pods start first: KubeBlocks creates them either way, and a pika takes seconds to start, which would
    // only dilute the comparison. The clock starts at the first registration.
    let added: Vec<usize> = (from..to).map(|_| bed.add_shard(2)).collect();
    let begin = Instant::now();
    for &index in &added {
        run_to_completion(&bed, &["post-provision", "--own-shard"], &bed.env(index));
    }
    let mut said = Vec::new();
    match way {
        Way::Product => {
            let envs: Vec<_> = added
                .iter()
                .map(|&index| {
                    let mut env = bed.env(0);
                    env.insert("KB_ADD_SHARD_NAME".into(), bed.shards[index].full.clone());
                    env
                })
                .collect();
            said = reconcile(&bed, &["shard-add"], &envs);
        }
        Way::Codis => {
            let out = bed.codis_admin(&["--rebalance", "--confirm"]);
            assert!(out.status.success(), "codis-admin --rebalance: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
    let settled = || {
        let t = bed.topology();
        t.migrating == 0 && t.groups.iter().all(|g| t.slots_of(g.id) > 0)
    };
    while !settled() {
        assert!(begin.elapsed() < Duration::from_secs(900), "the scale-out did not settle: {:?}", bed.topology());
        std::thread::sleep(Duration::from_millis(50));
    }
    let end = Instant::now();
    let beats = writer.stop();
    // The action's logs, and the servers' under bed/, for reading where a slow run spent its time.
    let logs = std::env::temp_dir().join("split-bench").join(format!("{from}-{to}-{}-{run}", way.name()));
    let _ = std::fs::remove_dir_all(&logs);
    let _ = std::fs::create_dir_all(&logs);
    for (i, text) in said.iter().enumerate() {
        let _ = std::fs::write(logs.join(format!("run-{}.log", i + 1)), text);
    }
    let _ = std::process::Command::new("cp").arg("-r").arg(bed.dir()).arg(logs.join("bed")).status();

    // A write refused before the change began (the writer's first seconds on a new bed) is not the change's.
    let during: Vec<&Beat> =
        beats.iter().filter(|b| b.sent < end && b.acked.map_or(b.sent >= begin, |a| a > begin)).collect();
    let stall = during.iter().filter_map(|b| b.acked.map(|a| a - b.sent)).max().unwrap_or_default();
    let holds: Vec<u64> = said
        .iter()
        .flat_map(|s| s.lines())
        .filter(|l| l.contains("promoted with writes held"))
        .filter_map(|l| logged(l, "held_ms"))
        .collect();
    let outcome = Outcome {
        took: end - begin,
        stall,
        failed: during.iter().filter(|b| b.acked.is_none()).count(),
        holds,
        acked: beats.iter().filter(|b| b.acked.is_some()).count(),
    };

    let mut conn = bed.proxies[0].connect().expect("connect to the proxy");
    let mut lost: Vec<String> = beats
        .iter()
        .filter(|b| b.acked.is_some())
        .filter(|b| conn.command(&["GET", &b.key]).ok().as_deref() != Some(&format!("v-{}", b.key)))
        .map(|b| b.key.clone())
        .collect();
    lost.extend(preloaded.verify_through_authed(bed.proxies[0].data_addr(), Some(&bed.password)).lost);
    assert!(lost.is_empty(), "acknowledged keys lost: {} (first: {:?})", lost.len(), &lost[..lost.len().min(10)]);
    assert_no_strays(&bed);
    outcome
}

/// No master holds a key of a slot its group does not own.
fn assert_no_strays(bed: &RealBed) {
    let topology = bed.topology();
    let count = topology.slots.len();
    for shard in &bed.shards {
        let group = topology.group_of(&shard.pods[0].server()).expect("every shard has a group");
        let master = shard.pods.iter().find(|p| group.master() == Some(p.server().as_str())).expect("a master");
        let strays = master
            .keys()
            .iter()
            .filter(|k| topology.slots[pika_action::plan::keyslot::slot_of(k.as_bytes(), count)] != group.id)
            .count();
        assert_eq!(strays, 0, "{} holds {strays} keys of slots group {} does not own", master.name, group.id);
    }
}
