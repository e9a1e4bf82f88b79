//! What a planned switchover costs on the real servers: pika v4.0.1 pods (each in its own network namespace, started
//! by the chart's `pika-start.sh`), the dashboard and proxy of Pika's Codis fork, real etcd, the failover watcher
//! running beside the dashboard as the chart runs it.
//!
//! One shard of two pods, so every write goes to the group that switches. A writer sends `SET`s through the proxy
//! one after another, as fast as the proxy answers, and records when each was sent and acknowledged. Then
//! `SWITCHOVER_BENCH_RUNS` (default 5) switchovers of the shard's master, each run as KubeBlocks runs the action
//! (`pika-action switchover` with the 1.1 environment), each waiting until the old master replicates the new one in
//! sync before the next. Reported per run and as min / median / max:
//!
//! - **call**: the action's process from start to exit (target ≤ 0.5 s);
//! - **stall**: the longest a write waited for its answer while the call ran (target ≤ 0.2 s);
//! - **held** and **caught up**: what the action logged of the time writes were held at the proxies and of the part
//!   spent waiting for the new master to reach the old one's binlog position;
//! - **failed**: writes answered with an error or not at all while the call ran;
//! - **re-pointed after**: from the call's exit until the old master replicates the new one in sync (the watcher
//!   does that once pika lets the old master go of its replica).
//!
//! Afterwards every acknowledged key is read back through the proxy; a lost key fails the bench.
//!
//! `cargo bench -p pika-action --bench switchover` (needs root and the servers `scripts/setup.sh` installs).

#[path = "support/real_bench.rs"]
mod real_bench;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use real_bench::{logged, run_to_completion, summary, Beat, Writer};
use testbed::real::bed::{Line, RealBed, RealBedOptions};

/// What one switchover cost.
struct Run {
    call: Duration,
    stall: Duration,
    /// When the write that waited longest was sent, from the call's start (negative: before it).
    stall_sent_ms: i64,
    held_ms: Option<u64>,
    caught_up_ms: Option<u64>,
    failed: usize,
    repointed_after: Duration,
}

fn main() {
    // `cargo test --benches` passes harness arguments; this bench takes none.
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let runs: usize = std::env::var("SWITCHOVER_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(5);
    let action = Path::new(env!("CARGO_BIN_EXE_pika-action"));
    let bed =
        RealBed::start(&RealBedOptions { shards: 1, pods: 2, line: Line::V1_1, ..RealBedOptions::default() }, action);
    run_to_completion(&bed, &["post-provision", "--own-shard"], &bed.env(0));
    run_to_completion(&bed, &["post-provision"], &bed.env(0));
    bed.assert_registered(0, bed.master_ordinal(0));
    let _watcher = bed.start_watcher();
    let settled = Instant::now();
    wait_for_relinks(&bed);
    println!("replicas copied in full re-linked by the watcher {} ms after it started", settled.elapsed().as_millis());

    let writer = Writer::start(&bed);
    let started = Instant::now();
    while writer.acked() < 200 {
        assert!(started.elapsed() < Duration::from_secs(20), "the writer got no write through the proxy");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut windows = Vec::new();
    let mut outputs = Vec::new();
    for _ in 0..runs {
        std::thread::sleep(Duration::from_millis(500));
        let before = bed.master_ordinal(0);
        let begin = Instant::now();
        let out = bed.run(&["switchover"], &bed.switchover_env(0));
        let end = Instant::now();
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(0), "switchover failed: {said}");
        let after = bed.master_ordinal(0);
        assert_ne!(after, before, "the master did not move: {said}");
        // The next switchover needs the old master back in sync with the new one.
        bed.assert_registered(0, after);
        windows.push((begin, end, Instant::now()));
        outputs.push(said);
    }
    let beats = writer.stop();

    let results: Vec<Run> = windows
        .iter()
        .zip(&outputs)
        .map(|(&(begin, end, repointed), said)| {
            let during: Vec<&Beat> =
                beats.iter().filter(|b| b.sent < end && b.acked.is_none_or(|a| a > begin)).collect();
            let longest = during.iter().filter_map(|b| b.acked.map(|a| (a - b.sent, b.sent))).max();
            let (stall, stall_sent) = longest.unwrap_or((Duration::ZERO, begin));
            Run {
                call: end - begin,
                stall,
                stall_sent_ms: if stall_sent >= begin {
                    (stall_sent - begin).as_millis() as i64
                } else {
                    -((begin - stall_sent).as_millis() as i64)
                },
                held_ms: logged(said, "held_ms"),
                caught_up_ms: logged(said, "caught_up_ms"),
                failed: during.iter().filter(|b| b.acked.is_none()).count(),
                repointed_after: repointed - end,
            }
        })
        .collect();
    for (i, r) in results.iter().enumerate() {
        println!(
            "switchover {}: call {} ms, stall {} ms (write sent at {:+} ms), held {} ms (caught up after {} ms), failed {}, old master in sync \
             {} ms after the call",
            i + 1,
            r.call.as_millis(),
            r.stall.as_millis(),
            r.stall_sent_ms,
            r.held_ms.map_or("?".to_owned(), |v| v.to_string()),
            r.caught_up_ms.map_or("?".to_owned(), |v| v.to_string()),
            r.failed,
            r.repointed_after.as_millis()
        );
    }
    let logs = std::env::temp_dir().join("switchover-bench");
    let _ = std::fs::create_dir_all(&logs);
    for (i, said) in outputs.iter().enumerate() {
        let _ = std::fs::write(logs.join(format!("run-{}.log", i + 1)), said);
    }
    // The servers' own logs beside them, for reading where a slow run spent its time.
    let _ = std::fs::remove_dir_all(logs.join("bed"));
    let _ = std::process::Command::new("cp").arg("-r").arg(bed.dir()).arg(logs.join("bed")).status();
    println!("the action's logs, and the servers' under bed/: {}", logs.display());
    summary("call (ms)", results.iter().map(|r| r.call.as_millis() as u64).collect());
    summary("stall (ms)", results.iter().map(|r| r.stall.as_millis() as u64).collect());
    summary("held (ms)", results.iter().filter_map(|r| r.held_ms).collect());
    summary("re-pointed after (ms)", results.iter().map(|r| r.repointed_after.as_millis() as u64).collect());

    let acked: BTreeMap<&str, ()> = beats.iter().filter(|b| b.acked.is_some()).map(|b| (b.key.as_str(), ())).collect();
    let mut conn = bed.proxies[0].connect().expect("connect to the proxy");
    let lost: Vec<&str> = acked
        .keys()
        .filter(|k| conn.command(&["GET", k]).ok().as_deref() != Some(&format!("v-{k}")))
        .copied()
        .collect();
    println!("acknowledged writes: {}, lost: {}", acked.len(), lost.len());
    assert!(lost.is_empty(), "acknowledged keys lost: {:?}", &lost[..lost.len().min(10)]);
}

/// Waits (at most 60 s) until the watcher has re-linked every replica copied in full and seen it in sync again (no
/// `relink/` mark left in etcd), as in a cluster that has settled after its creation.
fn wait_for_relinks(bed: &RealBed) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let endpoints = pika_action::input::address::Endpoints::parse(&bed.etcd.endpoint()).expect("etcd's endpoint");
    let prefix = pika_action::clients::etcd::cluster_prefix(testbed::real::bed::NAMESPACE, &bed.name);
    let started = Instant::now();
    rt.block_on(async {
        let etcd = pika_action::clients::etcd::Etcd::connect(&endpoints, Duration::from_secs(5)).await.expect("etcd");
        loop {
            let marks = pika_action::steps::transfer::relink_marks(&etcd, &prefix).await.expect("read the marks");
            if marks.is_empty() {
                return;
            }
            assert!(started.elapsed() < Duration::from_secs(60), "replicas never re-linked: {marks:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
}
