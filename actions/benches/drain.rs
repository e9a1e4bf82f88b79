//! What `shard-remove` costs on top of the migrations themselves: the drain of one of four shards (1024 slots, so
//! 256 leave) through the real binary against the Codis double, whose executor runs one state step per tick
//! (`DRAIN_BENCH_TICK_MS`, default 20 ms), timed against the double's own migration time.
//!
//! The double's time is taken by a watcher polling its model every 2 ms: from the first slot action it sees to the
//! moment the last one is gone. The action's wall time runs from spawning the binary to its exit, so the difference
//! is everything the action adds: start-up, lock, preflight (stats, `CONFIG GET slotmigrate`), planning and
//! `create-range`, the lag of noticing the end, deleting the servers and the group, etcd clean-up. It also prints how
//! many times the action read the slot table (`GET stats`, ~100 KB each) while Codis worked.
//!
//! Needs processes (etcd, redis-server), hence a plain `main` (`harness = false`):
//! `cargo bench -p pika-action --bench drain` (or `cargo test -p pika-action --bench drain` for a debug build).
//! `DRAIN_BENCH_RUNS` (default 3) sets the number of runs.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use testbed::cluster::Bed;
use testbed::DoubleOptions;

fn var(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn run(action: &str, env: &BTreeMap<String, String>) -> std::process::Output {
    let out = Command::new(env!("CARGO_BIN_EXE_pika-action"))
        .arg(action)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env)
        .current_dir("/")
        .output()
        .expect("run pika-action");
    assert_eq!(out.status.code(), Some(0), "{action}: {}", String::from_utf8_lossy(&out.stderr));
    out
}

/// One measured drain.
struct Sample {
    wall: Duration,
    codis: Duration,
    before_first: Duration,
    after_last: Duration,
    polls: usize,
    stats_bytes: usize,
}

fn sample(tick: Duration) -> Sample {
    let bed = Bed::builder().shards(4).pods(1).bed(DoubleOptions { tick, ..DoubleOptions::default() });
    run("post-provision", &bed.env(0));
    let leaving = bed.gid(3).expect("registered");
    let stats_bytes = bed.codis.call("GET", "/api/topom/stats/{xauth}").body.len();
    let mut env = bed.env(3);
    env.insert("KB_REMOVE_SHARD_NAME".into(), bed.cluster.shards[3].full.clone());
    env.insert("ACTION_BUDGET_SECONDS".into(), "600".into());
    bed.codis.clear_requests();

    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let (wall, (first, last)) = std::thread::scope(|scope| {
        let watcher = scope.spawn(|| {
            let (mut first, mut last) = (None, None);
            while !stop.load(Ordering::SeqCst) {
                let snap = bed.codis.snapshot();
                let busy = !snap.with_action().is_empty();
                let now = started.elapsed();
                if busy && first.is_none() {
                    first = Some(now);
                }
                if first.is_some() && !busy && last.is_none() && snap.slots_of(leaving) == 0 {
                    last = Some(now);
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            (first.expect("no migration seen"), last.expect("the migrations never ended"))
        });
        run("shard-remove", &env);
        let wall = started.elapsed();
        stop.store(true, Ordering::SeqCst);
        (wall, watcher.join().expect("watcher"))
    });
    assert!(bed.codis.snapshot().group(leaving).is_none(), "the group was not removed");
    let polls =
        bed.codis.requests().iter().filter(|r| r.method == "GET" && r.path.starts_with("/api/topom/stats/")).count();
    Sample { wall, codis: last - first, before_first: first, after_last: wall - last, polls, stats_bytes }
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing special: both run the measurement.
    let tick = Duration::from_millis(var("DRAIN_BENCH_TICK_MS", 20));
    let runs = var("DRAIN_BENCH_RUNS", 3).max(1);
    println!("drain of 1 of 4 shards, 1024 slots (256 leave), double tick {tick:?}, {runs} run(s)");
    println!(
        "{:>4} {:>9} {:>9} {:>9} {:>8} {:>9} {:>9} {:>6} {:>10}",
        "run", "action", "codis", "overhead", "%", "before", "after", "reads", "read KB"
    );
    let mut overheads = Vec::new();
    for i in 1..=runs {
        let s = sample(tick);
        let overhead = s.wall.saturating_sub(s.codis);
        let pct = overhead.as_secs_f64() / s.codis.as_secs_f64() * 100.0;
        overheads.push(pct);
        println!(
            "{i:>4} {:>8.2}s {:>8.2}s {:>8.3}s {:>7.2}% {:>8.3}s {:>8.3}s {:>6} {:>10}",
            s.wall.as_secs_f64(),
            s.codis.as_secs_f64(),
            overhead.as_secs_f64(),
            pct,
            s.before_first.as_secs_f64(),
            s.after_last.as_secs_f64(),
            s.polls,
            s.polls * s.stats_bytes / 1024,
        );
    }
    overheads.sort_by(f64::total_cmp);
    println!("median overhead: {:.2}% of the double's own migration time", overheads[overheads.len() / 2]);
}
