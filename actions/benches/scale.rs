//! Changes of several shards at once over 1024 slots, through the real binary against the Codis double (its rounds,
//! batches and key movement), real redis-servers and real etcd, with keys preloaded through a proxy and a writer
//! going through it the whole time:
//!
//! - 4→8: the four shardAdds (1.1) started at once, and as the 1.1 chart runs them (each group registered by its
//!   component's `post-provision --own-shard`, then the shardAdds one after another), against Codis's own procedure
//!   on the same bed and data path: register the four groups (`--own-shard`, which moves no slot) and one
//!   `slots/rebalance`. The product splits each new shard off a donor of its own (replication, then the slots
//!   remapped), so it runs no executor round at all;
//! - 3→4: one shardAdd against register + rebalance; the product splits the new shard's largest share (a quarter of
//!   one donor) off that donor and migrates the rest, so it runs fewer rounds than `bound` (which counts every slot
//!   that changes owner as a migration);
//! - 8→4: the four shardRemoves (1.1, the Cluster's shard count readable) called one after another as a reconcile
//!   does, against the drain of the busiest leaving group alone (one shardRemove of 8→7);
//! - slot moves of 3→4, 4→8, 8→16, 8→4 and 16→8 counted from every state change of the double (a slot that moves
//!   twice counts twice), against the one-step minimum over the final topology.
//!
//! Each time runs from the first action's start to the moment every action has exited 0 and Codis holds no slot
//! action. `bound` is the most slots any one group sends or receives: Codis's executor takes at most one slot per
//! group into a round (as source or target) and waits for the whole round, and a pika source migrates one slot at a
//! time whatever Codis does (its migrate thread refuses a batch for another slot or target while one runs), so no
//! sequence of slot actions finishes in fewer rounds. `rounds` is how many the double's executor ran for the change
//! and `width` the slots per round on average: a change that reaches `bound` rounds is as parallel as Codis allows.
//! `SCALE_BENCH_TIMELINE=1` also prints, per receiving group, when its slots landed: how many at its first landing
//! (a split's share lands at once), its last, and the median time between two landings (one executor round).
//!
//! `cargo bench -p pika-action --bench scale`; `SCALE_BENCH_RUNS` (default 1) runs of each, `SCALE_BENCH_KEYS`
//! (default 10000) keys preloaded, `SCALE_BENCH_TICK_MS` (default 10) the double's Codis second scaled,
//! `SCALE_BENCH_SLOT_TICKS` (default 5) the fewest ticks one slot's migration takes: real Codis spends about 100 ms
//! per executor round on a loaded cluster (4→8 by its own rebalance, 128 rounds, took 12.4 s), so the rounds, not the
//! start-up of the action processes, dominate a change; with 1 tick the double migrates a slot in well under a
//! millisecond and the benchmark measures process start-up instead. `SCALE_BENCH_ONLY=4-8,8-4` runs only those
//! comparisons (`4-8`, `4-8-1.1`, `3-4`, `8-4`, `counts` for 8→16 and 16→8).
//!
//! Every row also checks that no master holds a key of a slot its group does not own (what a split leaves behind
//! when its cleanup fails) and that every acknowledged key reads back.

#[path = "../tests/support/change.rs"]
mod change;
#[path = "../tests/support/cluster_api.rs"]
mod cluster_api;
#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use change::{busiest, concurrently, one_after_another, slot_moves, Change, Env};
use cluster_api::{ClusterAnswer, ClusterApi};
use support::{minimum_moves, run_args, run_to_completion, ClusterFixture, NAMESPACE};
use testbed::DoubleOptions;

fn var(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

struct Settings {
    keys: usize,
    tick: Duration,
    slot_ticks: u32,
}

/// One measured change.
struct Sample {
    wall: Duration,
    moves: usize,
    minimum: usize,
    bound: usize,
    /// Writes the writer had acknowledged and seen fail (refused or unanswered) when the change ended.
    acked: usize,
    failed: usize,
    /// Executor rounds the change took, and the slots they took (a slot in two rounds counts twice).
    rounds: u64,
    round_slots: u64,
}

/// `shards` provisioned shards of one pod over 1024 slots (1.1), then `added` more whose Components exist.
fn bed(s: &Settings, shards: usize, added: usize) -> Change {
    let opts = DoubleOptions { max_slot_num: 1024, tick: s.tick, ..DoubleOptions::default() };
    let mut c = Change::with(ClusterFixture::builder().shards(shards).pods(1).build(), opts);
    c.bed.codis.set_default_migration_ticks(s.slot_ticks);
    let first: Vec<usize> = (0..shards).collect();
    run_to_completion("post-provision", &c.env_1_1(0, &first));
    for _ in 0..added {
        c.add_shard(1);
    }
    c
}

/// Times `change` on `c` with the writer going; checks the outcome (balanced over `stay`, every key readable).
fn measure(s: &Settings, c: &Change, stay: &[usize], change: impl FnOnce()) -> Sample {
    let before = c.bed.owners();
    let (ledger, writer) = c.start_writing(s.keys);
    c.count_moves();
    let rounds_before = c.bed.codis.executor_rounds();
    let started = Instant::now();
    change();
    while !c.bed.codis.snapshot().with_action().is_empty() {
        std::thread::sleep(Duration::from_millis(2));
    }
    let wall = started.elapsed();
    let (rounds, round_slots) = {
        let (r, n) = c.bed.codis.executor_rounds();
        (r - rounds_before.0, n - rounds_before.1)
    };
    let trace = c.bed.codis.take_owner_trace();
    let moves = slot_moves(&trace).count();
    if std::env::var_os("SCALE_BENCH_TIMELINE").is_some() {
        print_timeline(&trace);
    }
    let gids = c.gids(stay);
    c.bed.assert_balanced(&gids);
    c.assert_no_stray_keys();
    let (acked, failed) = (writer.acked(), writer.failed());
    c.check_no_key_lost(ledger, writer);
    let after = c.bed.owners();
    let (minimum, bound) = (minimum_moves(&before, &gids), busiest(&before, &after));
    Sample { wall, moves, minimum, bound, acked, failed, rounds, round_slots }
}

/// When each group received its first and last slot (`SCALE_BENCH_TIMELINE`): how long the change took to reach its
/// full width, and whether every group was busy until the end.
fn print_timeline(trace: &[(Duration, Vec<u32>)]) {
    // Per receiving group, the instants its slots landed: a split's assignment lands many at once, a migration one.
    let mut per: BTreeMap<u32, Vec<(Duration, usize)>> = BTreeMap::new();
    for (when, _, to) in slot_moves(trace) {
        let landings = per.entry(to).or_default();
        match landings.last_mut() {
            Some((at, n)) if *at == when => *n += 1,
            _ => landings.push((when, 1)),
        }
    }
    for (gid, landings) in per {
        let n: usize = landings.iter().map(|l| l.1).sum();
        let mut gaps: Vec<Duration> = landings.windows(2).map(|w| w[1].0 - w[0].0).collect();
        gaps.sort_unstable();
        let median_gap = gaps.get(gaps.len() / 2).copied().unwrap_or_default();
        let (first, last) = (landings[0], landings[landings.len() - 1]);
        println!(
            "    group {gid}: {n} slot(s) in {} landing(s) from {:.2}s ({} at once) to {:.2}s, {:.1} ms apart (median)",
            landings.len(),
            first.0.as_secs_f64(),
            first.1,
            last.0.as_secs_f64(),
            median_gap.as_secs_f64() * 1000.0
        );
    }
}

fn add_env(c: &Change, index: usize, listed: &[usize]) -> Env {
    let mut env = c.env_1_1(index, listed);
    env.insert("KB_ADD_SHARD_NAME".into(), c.bed.cluster.shards[index].full.clone());
    env
}

/// The product: the shardAdds of `from`→`to` started at once.
fn add_at_once(s: &Settings, from: usize, to: usize) -> Sample {
    let c = bed(s, from, to - from);
    let all: Vec<usize> = (0..to).collect();
    let actions: Vec<(&str, Env)> = (from..to).map(|i| ("shard-add", add_env(&c, i, &all))).collect();
    measure(s, &c, &all, || {
        concurrently(&actions, Duration::ZERO, Duration::from_millis(5));
    })
}

/// Codis's own procedure: register every new group (no slot moves), then one `slots/rebalance`.
fn register_then_rebalance(s: &Settings, from: usize, to: usize) -> Sample {
    let c = bed(s, from, to - from);
    let all: Vec<usize> = (0..to).collect();
    measure(s, &c, &all, || {
        for i in from..to {
            let out = run_args(&["post-provision", "--own-shard"], &c.env_1_1(i, &all));
            assert_eq!(out.status.code(), Some(0), "{}", support::describe(&out));
        }
        let reply = c.bed.codis.call("PUT", "/api/topom/slots/rebalance/{xauth}/1");
        assert_eq!(reply.status, 200, "rebalance: {}", reply.body);
    })
}

/// The product as the 1.1 chart runs it: each new shard's component postProvision registers its group
/// (`--own-shard`, no slot moves), then a reconcile calls the shardAdds one after another.
fn register_then_add_in_turn(s: &Settings, from: usize, to: usize) -> Sample {
    let c = bed(s, from, to - from);
    let all: Vec<usize> = (0..to).collect();
    let actions: Vec<(&str, Env)> = (from..to).map(|i| ("shard-add", add_env(&c, i, &all))).collect();
    measure(s, &c, &all, || {
        for i in from..to {
            let out = run_args(&["post-provision", "--own-shard"], &c.env_1_1(i, &all));
            assert_eq!(out.status.code(), Some(0), "{}", support::describe(&out));
        }
        one_after_another(&actions);
    })
}

fn remove_env(c: &Change, index: usize, listed: &[usize], api: &ClusterApi) -> Env {
    let mut env = c.env_1_1(index, listed);
    env.insert("KB_REMOVE_SHARD_NAME".into(), c.bed.cluster.shards[index].full.clone());
    env.insert("KUBE_API_URL".into(), api.url());
    env
}

/// The product: the shardRemoves of `from`→`to` one after another, the Cluster saying `to` shards.
fn remove_in_turn(s: &Settings, from: usize, to: usize) -> Sample {
    let c = bed(s, from, 0);
    let all: Vec<usize> = (0..from).collect();
    let api = ClusterApi::start(NAMESPACE, &c.bed.cluster.name, ClusterAnswer::Stays(vec![("pk".into(), to as u32)]));
    let actions: Vec<(&str, Env)> = (to..from).rev().map(|i| ("shard-remove", remove_env(&c, i, &all, &api))).collect();
    measure(s, &c, &(0..to).collect::<Vec<_>>(), || {
        one_after_another(&actions);
    })
}

/// The busiest leaving group of `from`→`to` drained alone: one shardRemove, `from`→`from − 1`.
fn drain_one(s: &Settings, from: usize) -> Sample {
    let c = bed(s, from, 0);
    let all: Vec<usize> = (0..from).collect();
    let api =
        ClusterApi::start(NAMESPACE, &c.bed.cluster.name, ClusterAnswer::Stays(vec![("pk".into(), from as u32 - 1)]));
    let action = [("shard-remove", remove_env(&c, from - 1, &all, &api))];
    measure(s, &c, &all[..from - 1], || {
        one_after_another(&action);
    })
}

fn row(name: &str, samples: &[Sample]) -> Duration {
    let mut walls: Vec<Duration> = samples.iter().map(|s| s.wall).collect();
    walls.sort_unstable();
    let median = walls[walls.len() / 2];
    let s = &samples[0];
    let all_min = samples.iter().all(|x| x.moves == x.minimum);
    let failed: usize = samples.iter().map(|x| x.failed).sum();
    let acked: usize = samples.iter().map(|x| x.acked).sum();
    println!(
        "{name:<52} {:>8.2}s {:>6} {:>7} {:>6} {:>6} {:>5.2} {:>8} {:>6} {}",
        median.as_secs_f64(),
        s.moves,
        s.minimum,
        s.bound,
        s.rounds,
        s.round_slots as f64 / s.rounds.max(1) as f64,
        acked,
        failed,
        if all_min { "= minimum" } else { "ABOVE the minimum" }
    );
    median
}

fn main() {
    let s = Settings {
        keys: usize::try_from(var("SCALE_BENCH_KEYS", 10_000)).unwrap_or(10_000),
        tick: Duration::from_millis(var("SCALE_BENCH_TICK_MS", 10)),
        slot_ticks: u32::try_from(var("SCALE_BENCH_SLOT_TICKS", 5)).unwrap_or(5),
    };
    let runs = usize::try_from(var("SCALE_BENCH_RUNS", 1).max(1)).unwrap_or(1);
    // The two sides of a comparison alternate run by run, so that drift of the machine's speed hits both alike.
    let pair = |a: &dyn Fn() -> Sample, b: &dyn Fn() -> Sample| -> (Vec<Sample>, Vec<Sample>) {
        (0..runs).map(|_| (a(), b())).unzip()
    };
    println!(
        "changes of shard count over 1024 slots, {} keys preloaded + a writer, double tick {:?}, each slot's \
         migration at least {} tick(s), {runs} run(s)",
        s.keys, s.tick, s.slot_ticks
    );
    println!(
        "{:<52} {:>9} {:>6} {:>7} {:>6} {:>6} {:>5} {:>8} {:>6}",
        "change", "median", "moves", "minimum", "bound", "rounds", "width", "acked", "failed"
    );

    let only = std::env::var("SCALE_BENCH_ONLY").unwrap_or_default();
    let wanted = |key: &str| only.is_empty() || only.split(',').any(|k| k.trim() == key);
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    let mut ratios = Vec::new();
    if wanted("4-8") {
        let (a, b) = pair(&|| add_at_once(&s, 4, 8), &|| register_then_rebalance(&s, 4, 8));
        let product = row("4→8 four shard-adds at once", &a);
        let codis = row("4→8 register four + slots/rebalance (Codis)", &b);
        ratios.push(format!("4→8: {:.2}× Codis's register-then-rebalance (target ≤ 0.60×)", ratio(product, codis)));
    }
    if wanted("4-8-1.1") {
        let (a, b) = pair(&|| register_then_add_in_turn(&s, 4, 8), &|| register_then_rebalance(&s, 4, 8));
        let product = row("4→8 own-shard registered, shard-adds in turn (1.1)", &a);
        let codis = row("4→8 register four + slots/rebalance (Codis)", &b);
        ratios.push(format!(
            "4→8 as the 1.1 chart runs it: {:.2}× Codis's register-then-rebalance (target ≤ 0.60×)",
            ratio(product, codis)
        ));
    }
    if wanted("3-4") {
        let (a, b) = pair(&|| add_at_once(&s, 3, 4), &|| register_then_rebalance(&s, 3, 4));
        let product = row("3→4 one shard-add", &a);
        let codis = row("3→4 register + slots/rebalance (Codis)", &b);
        ratios.push(format!("3→4: {:.2}× Codis's register-then-rebalance (target ≤ 1.00×)", ratio(product, codis)));
    }
    if wanted("8-4") {
        let (a, b) = pair(&|| remove_in_turn(&s, 8, 4), &|| drain_one(&s, 8));
        let drain = row("8→4 four shard-removes in turn", &a);
        let alone = row("8→7 the busiest leaving group drained alone", &b);
        ratios.push(format!(
            "8→4: {:.2}× draining the busiest leaving group alone (target ≤ 1.00×)",
            ratio(drain, alone)
        ));
    }
    if wanted("counts") {
        row("8→16 eight shard-adds at once", &[add_at_once(&s, 8, 16)]);
        row("16→8 eight shard-removes in turn", &[remove_in_turn(&s, 16, 8)]);
    }
    println!();
    for r in ratios {
        println!("{r}");
    }
}
