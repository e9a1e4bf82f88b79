//! Changes of several shards at once over 1024 slots, through the real binary against the Codis double (its rounds,
//! batches and key movement), real redis-servers and real etcd, with keys preloaded through a proxy and a writer
//! going through it the whole time:
//!
//! - 4→8: the four shardAdds (1.1) started at once, against Codis's own procedure on the same bed and data path:
//!   register the four groups (`post-provision --own-shard`, which moves no slot) and one `slots/rebalance`;
//! - 3→4: one shardAdd against register + rebalance;
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
//! `SCALE_BENCH_TIMELINE=1` also prints when each group received its first and last slot.
//!
//! `cargo bench -p pika-action --bench scale`; `SCALE_BENCH_RUNS` (default 1) runs of each, `SCALE_BENCH_KEYS`
//! (default 10000) keys preloaded, `SCALE_BENCH_TICK_MS` (default 10) the double's Codis second scaled,
//! `SCALE_BENCH_SLOT_TICKS` (default 5) the fewest ticks one slot's migration takes: real Codis spends about 100 ms
//! per executor round on a loaded cluster (4→8 by its own rebalance, 128 rounds, took 12.4 s), so the rounds, not the
//! start-up of the action processes, dominate a change; with 1 tick the double migrates a slot in well under a
//! millisecond and the benchmark measures process start-up instead. `SCALE_BENCH_ONLY=4-8,8-4` runs only those
//! comparisons (`4-8`, `3-4`, `8-4`, `counts` for 8→16 and 16→8); `split` (only when named) runs an experiment that
//! is not the product: 4→8 with each new group filled by replication instead of migration ([`split_by_hand`]).

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
    let (acked, failed) = (writer.acked(), writer.failed());
    c.check_no_key_lost(ledger, writer);
    let after = c.bed.owners();
    let (minimum, bound) = (minimum_moves(&before, &gids), busiest(&before, &after));
    Sample { wall, moves, minimum, bound, acked, failed, rounds, round_slots }
}

/// When each group received its first and last slot (`SCALE_BENCH_TIMELINE`): how long the change took to reach its
/// full width, and whether every group was busy until the end.
fn print_timeline(trace: &[(Duration, Vec<u32>)]) {
    let mut per: BTreeMap<u32, (Duration, Duration, usize)> = BTreeMap::new();
    for (when, _, to) in slot_moves(trace) {
        let e = per.entry(to).or_insert((when, when, 0));
        e.1 = when;
        e.2 += 1;
    }
    for (gid, (first, last, n)) in per {
        println!(
            "    group {gid}: {n} slot(s) received from {:.2}s to {:.2}s",
            first.as_secs_f64(),
            last.as_secs_f64()
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

/// Not the product: an experiment for the design of a faster scale-out. Each new group is filled by replication
/// instead of slot migration, by hand, the four pairs at once (donor `i`, new shard `from + i`):
///
/// 1. the new group is created with the donor's master under an alias address as its master (the FQDN with the
///    root's dot, which resolves to the same pod) and the new pod as its replica, which then replicates the donor;
/// 2. once it has caught up, `slots/assign` remaps the donor's upper half to the new group: no data moves, and the
///    slots' master is still the donor's pika, so no write is refused and no read is stale;
/// 3. once caught up again, Codis promotes the new pod (the proxies hold the group's slots locked meanwhile) and the
///    alias is removed;
/// 4. each side deletes the keys of the slots it no longer owns.
///
/// Between the last catch-up and the promote's lock, a write the donor acknowledged may not have reached the new
/// master yet: the same window as any promote, and what `check_no_key_lost` would catch.
fn split_by_hand(s: &Settings, from: usize, to: usize) -> Sample {
    let c = bed(s, from, to - from);
    let all: Vec<usize> = (0..to).collect();
    let sample = measure(s, &c, &all, || {
        std::thread::scope(|scope| {
            for donor in 0..from {
                let c = &c;
                scope.spawn(move || split_one(c, donor, from + donor, (from + donor + 1) as u32));
            }
        });
    });
    // The cleanup left every master with the keys of its own slots only.
    let snap = c.bed.codis.snapshot();
    let owners = c.bed.owners();
    for g in &snap.groups {
        let master = c.bed.codis.real_addr(&g.servers[0].server);
        let pod = c.bed.cluster.shards.iter().flat_map(|sh| &sh.pods).find(|p| p.redis.addr() == master);
        let pod = pod.expect("each master is a pod");
        let foreign = keys_not_owned(&pod.redis, &owners, g.id).len();
        assert_eq!(foreign, 0, "group {} holds {foreign} key(s) of slots it does not own", g.id);
    }
    sample
}

fn split_one(c: &Change, donor: usize, new: usize, gid: u32) {
    let ok = |method: &str, path: &str, body: Option<&str>| {
        let reply = match body {
            Some(b) => c.bed.codis.call_with_body(method, path, b),
            None => c.bed.codis.call(method, path),
        };
        assert_eq!(reply.status, 200, "{path}: {}", reply.body);
    };
    let dgid = c.bed.gid(donor).expect("the donor's group");
    let master = c.bed.codis.snapshot().master(dgid).expect("the donor's master").to_owned();
    let dpod = c.bed.cluster.shards[donor].pods.iter().find(|p| p.server() == master).expect("the donor's pod");
    let npod = &c.bed.cluster.shards[new].pods[0];
    let alias = format!("{}.:{}", dpod.fqdn, master.rsplit_once(':').map_or("9221", |(_, p)| p));
    c.bed.codis.set_override(&alias, &dpod.redis.addr());
    c.proxy.set_override(&alias, &dpod.redis.addr());
    ok("PUT", &format!("/api/topom/group/create/{{xauth}}/{gid}"), None);
    ok("PUT", &format!("/api/topom/group/add/{{xauth}}/{gid}/{alias}"), None);
    ok("PUT", &format!("/api/topom/group/add/{{xauth}}/{gid}/{}", npod.server()), None);
    let port = dpod.redis.port().to_string();
    assert!(npod.redis.command(&["SLAVEOF", "127.0.0.1", &port]).starts_with("+OK"));
    catch_up(&dpod.redis, &npod.redis);
    let owned: Vec<usize> = c.bed.owners().iter().enumerate().filter(|(_, g)| **g == dgid).map(|(i, _)| i).collect();
    let moved = &owned[owned.len() / 2..];
    let body: Vec<String> =
        moved.iter().map(|sid| format!(r#"{{"id":{sid},"group_id":{gid},"action":{{}}}}"#)).collect();
    ok("PUT", "/api/topom/slots/assign/{xauth}", Some(&format!("[{}]", body.join(","))));
    catch_up(&dpod.redis, &npod.redis);
    ok("PUT", &format!("/api/topom/group/promote/{{xauth}}/{gid}/{}", npod.server()), None);
    ok("PUT", &format!("/api/topom/group/del/{{xauth}}/{gid}/{alias}"), None);
    let owners = c.bed.owners();
    delete_unowned(&npod.redis, &owners, gid);
    delete_unowned(&dpod.redis, &owners, dgid);
}

/// Waits until `replica` has everything `master` had produced when asked.
fn catch_up(master: &testbed::process::RedisServer, replica: &testbed::process::RedisServer) {
    let offset = |r: &testbed::process::RedisServer, field: &str| -> u64 {
        testbed::process::info_field(&r.info_replication(), field).and_then(|v| v.parse().ok()).unwrap_or(0)
    };
    let target = offset(master, "master_repl_offset");
    let caught = support::eventually(Duration::from_secs(30), || {
        replica.master().is_some_and(|(_, _, up)| up) && offset(replica, "slave_repl_offset") >= target
    });
    assert!(caught, "the replica did not catch up");
}

/// Deletes every key on `server` whose slot `owners` does not give to `gid`.
fn delete_unowned(server: &testbed::process::RedisServer, owners: &[u32], gid: u32) {
    for chunk in keys_not_owned(server, owners, gid).chunks(1000) {
        let mut args = vec!["DEL"];
        args.extend(chunk.iter().map(String::as_str));
        let deleted = server.command(&args);
        assert!(deleted.starts_with(':'), "DEL: {deleted}");
    }
}

/// The keys on `server` whose slot `owners` does not give to `gid`.
fn keys_not_owned(server: &testbed::process::RedisServer, owners: &[u32], gid: u32) -> Vec<String> {
    let mut found = Vec::new();
    let mut cursor = "0".to_owned();
    loop {
        let reply = server.command(&["SCAN", &cursor, "COUNT", "1000"]);
        let mut lines = reply.lines();
        cursor = lines.next().unwrap_or("0").to_owned();
        let slot = |k: &str| testbed::codis::slothash::slot_of(k.as_bytes(), owners.len());
        found.extend(lines.filter(|k| owners[slot(k)] != gid).map(str::to_owned));
        if cursor == "0" {
            return found;
        }
    }
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
    // The experiment runs only when named.
    if only.split(',').any(|k| k.trim() == "split") {
        let (a, b) = pair(&|| split_by_hand(&s, 4, 8), &|| register_then_rebalance(&s, 4, 8));
        let split = row("4→8 split by replication, by hand (NOT the product)", &a);
        let codis = row("4→8 register four + slots/rebalance (Codis)", &b);
        ratios.push(format!("4→8 split by hand: {:.2}× Codis's register-then-rebalance", ratio(split, codis)));
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
