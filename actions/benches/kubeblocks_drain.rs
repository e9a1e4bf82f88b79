//! How long KubeBlocks 1.1 takes to remove a shard holding 512 slots when every run of shardRemove is cut at a 2 s
//! budget and the runs are retried with controller-runtime's backoff, in real time, through the KubeBlocks
//! emulation of the test bed (the chart rendered by real Helm, the real binary, real etcd and redis-servers, the
//! Codis double). The figure behind the choice of handing Codis the whole remaining plan: backoff delays the
//! group's removal, not the data movement.
//!
//! `cargo bench -p pika-action --bench kubeblocks_drain`. `KBEMU_MEASURE_TICK_MS` sets the double's tick (what
//! Codis's 1 s becomes; 1000 is Codis's own pace) and `KBEMU_MEASURE_TICKS` stretches each slot's migration over
//! that many batches, for a longer drain.

use std::time::{Duration, Instant};

use testbed::kubeblocks::{KubeBlocks, Line, Options};

fn step(what: &str, result: Result<Duration, testbed::kubeblocks::Stuck>) -> Duration {
    result.unwrap_or_else(|stuck| panic!("{what}: {stuck}"))
}

/// The figure behind the choice of retry strategy: how long KubeBlocks 1.1 takes to remove a shard holding 512
/// slots when every run of shardRemove is cut at a 2 s budget and the runs are retried with controller-runtime's
/// backoff, in real time (the emulation's clock is switched to real time before the scale-in). Printed, not
/// asserted: speed belongs in measurements.
fn main() {
    let mut opts = Options::new(Line::V1_1, env!("CARGO_BIN_EXE_pika-action"));
    opts.cluster = "mdb".into();
    opts.var_overrides.insert("ACTION_BUDGET_SECONDS".into(), "2".into());
    opts.deadline = Duration::from_secs(1800);
    // KBEMU_MEASURE_TICK_MS sets the double's tick (what Codis's 1 s becomes; 1000 is Codis's own pace) and
    // KBEMU_MEASURE_TICKS stretches each slot's migration over that many batches, for a longer drain.
    let ticks: Option<u32> = std::env::var("KBEMU_MEASURE_TICKS").ok().and_then(|t| t.parse().ok());
    opts.migration_ticks = ticks;
    if let Some(ms) = std::env::var("KBEMU_MEASURE_TICK_MS").ok().and_then(|t| t.parse().ok()) {
        opts.codis_tick = Duration::from_millis(ms);
    }
    let tick = opts.codis_tick;
    let kb = KubeBlocks::install(opts).expect("install");
    step("create 2 shards", kb.create_cluster(2, 2));
    let codis = kb.codis().expect("codis");
    let groups = kb.groups_by_shard();
    let victim = kb.shards().into_iter().map(|s| s.short).max().expect("a shard");
    let gid = groups[&victim];
    let slots = codis.snapshot().slots_of(gid);
    kb.clock().set_scale(1);
    let started = Instant::now();
    // Watch the slot count of the leaving group to time the migrations themselves.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (codis, stop) = (codis.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut last_moved = None;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let snap = codis.snapshot();
                let left = snap.slots.iter().filter(|s| s.group_id == gid || s.action.target_id == gid).count();
                if left == 0 && last_moved.is_none() {
                    last_moved = Some(started.elapsed());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            last_moved
        })
    };
    let done = step("scale in to 1 shard", kb.scale_shards(1));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let migrated_at = watcher.join().expect("watcher");
    let removes: Vec<_> = kb.actions().into_iter().filter(|a| a.action == "udf-shardingShardRemove").collect();
    let gaps: Vec<String> = removes
        .windows(2)
        .map(|w| format!("{:.2}", (w[1].at.saturating_sub(w[0].at + w[0].elapsed * kb.clock().scale())).as_secs_f64()))
        .collect();
    let per_slot = migrated_at.map(|t| t / u32::try_from(slots).unwrap_or(1));
    eprintln!("MEASURE drain of {slots} slots, ACTION_BUDGET_SECONDS=2, KubeBlocks 1.1 backoff, real time");
    let parallel = codis.options().migration_parallel_slots;
    eprintln!(
        "MEASURE   the double: tick {tick:?} (Codis's 1 s), up to {parallel} slots per round, each over at least {} \
         batch(es): {per_slot:.1?} per slot on average",
        ticks.unwrap_or(1)
    );
    eprintln!("MEASURE   all slots off the group after {migrated_at:.1?}; shard removed after {done:.1?}");
    eprintln!(
        "MEASURE   {} shardRemove runs, exit codes {:?}",
        removes.len(),
        removes.iter().map(|a| a.code).collect::<Vec<_>>()
    );
    eprintln!("MEASURE   waits between runs (s): {gaps:?}");
    step("cluster deleted", kb.delete_cluster());
}
