//! Failover on the real servers, the product's watcher beside the fork's own HA: pika v4.0.1 pods (each in its own
//! network namespace, started by the chart's `pika-start.sh`), the dashboard and proxies of Pika's Codis fork with the
//! chart's configuration, real etcd. Each run starts a fresh bed (1.1, two pods per shard), registers it as the chart
//! does, keeps a writer going through proxy 0 (one `SET` after another, each timed), and kills a master with
//! SIGKILL once every replica is linked and in sync (for the product, also re-linked by the watcher after its first
//! full copy) and the writer has had 200 writes acknowledged. Reported: from
//! the kill to the first write sent after it and acknowledged (target ≤ 3 s for the product), and the acknowledged
//! writes not read back through the proxy afterwards (writes the killed master alone took go with it: replication
//! is asynchronous, and pika has no `WAIT`).
//!
//! Ways:
//! - **product**: the chart with `failover.enabled` (the fork's master failover dormant: a check an hour, 127 of
//!   them) and `pika-action watch` at its defaults (detection 2000 ms, probes every 500 ms, lease 5 s);
//! - **fork**: the chart with `failover.enabled=false`: no watcher, the fork's HA at the chart's values for it
//!   (master checks every 2 s, 10 of them), on the same bed.
//!
//! Cases: `plain` (one shard); `stale-proxy` (a second proxy killed with SIGKILL first, never offlined: Codis pushes
//! every promote to it); `migrating` (three shards; a slot of 300,000 keys migrating between the other two groups
//! when the third's master dies: Codis refuses promotes while a batch is on the wire); `stalled` (one shard, the
//! master stopped with SIGSTOP instead of killed, as a frozen process or a node gone without a reset: its connections
//! stay open, and a promote waits until the proxy gave up on the requests sent to it, `backend_recv_timeout`).
//!
//! `cargo bench -p pika-action --bench real_failover` (needs root and the servers `scripts/setup.sh` installs);
//! `REAL_FAILOVER_RUNS=n` (default 3) runs each case and way `n` times, `REAL_FAILOVER_ONLY=plain` (or `stale-proxy`,
//! `migrating`, `stalled`) one case, `REAL_FAILOVER_PATIENCE_SECONDS` (default 120) bounds the wait for a failover.

#[path = "support/real_bench.rs"]
mod real_bench;

use std::path::Path;
use std::time::{Duration, Instant};

use real_bench::{run_to_completion, Beat, Writer};
use testbed::real::bed::{Line, RealBed, RealBedOptions};
use testbed::Ledger;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Way {
    Product,
    Fork,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Case {
    Plain,
    StaleProxy,
    Migrating,
    Stalled,
}

impl Case {
    fn name(self) -> &'static str {
        match self {
            Self::Plain => "plain",
            Self::StaleProxy => "stale-proxy",
            Self::Migrating => "migrating",
            Self::Stalled => "stalled",
        }
    }
}

/// What one failover cost.
struct Outcome {
    /// From the kill to the first write sent after it and acknowledged; `None`: none within the patience.
    outage: Option<Duration>,
    lost: usize,
    acked: usize,
}

fn var(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let runs = var("REAL_FAILOVER_RUNS", 3);
    let only = std::env::var("REAL_FAILOVER_ONLY").ok();
    let patience = Duration::from_secs(var("REAL_FAILOVER_PATIENCE_SECONDS", 120));
    for case in [Case::Plain, Case::StaleProxy, Case::Migrating, Case::Stalled] {
        if only.as_deref().is_some_and(|o| o != case.name()) {
            continue;
        }
        let mut results: Vec<(Way, Outcome)> = Vec::new();
        for run in 1..=runs {
            for way in [Way::Product, Way::Fork] {
                let outcome = failover(case, way, patience);
                println!(
                    "{} run {run} {way:?}: kill -9 to first acknowledged write {}, {} of {} acknowledged writes lost",
                    case.name(),
                    outcome.outage.map_or_else(|| format!("none within {patience:?}"), |d| format!("{d:.2?}")),
                    outcome.lost,
                    outcome.acked
                );
                results.push((way, outcome));
            }
        }
        for way in [Way::Product, Way::Fork] {
            let mut times: Vec<Option<Duration>> =
                results.iter().filter(|(w, _)| *w == way).map(|(_, o)| o.outage).collect();
            times.sort_unstable_by_key(|t| t.unwrap_or(Duration::MAX));
            let median = times[times.len() / 2];
            let lost: usize = results.iter().filter(|(w, _)| *w == way).map(|(_, o)| o.lost).sum();
            println!(
                "{} {way:?}: median {} over {} runs, {lost} acknowledged writes lost in all",
                case.name(),
                median.map_or_else(|| "none within the patience".to_owned(), |d| format!("{d:.2?}")),
                times.len()
            );
        }
    }
}

fn failover(case: Case, way: Way, patience: Duration) -> Outcome {
    let dashboard_settings = match way {
        Way::Product => Vec::new(),
        // values.yaml with failover.enabled=false (dashboard.toml.tpl).
        Way::Fork => {
            vec![("sentinel_check_master_failover_interval", "\"2s\""), ("sentinel_master_dead_check_times", "10")]
        }
    };
    let shards = if case == Case::Migrating { 3 } else { 1 };
    let proxies = if case == Case::StaleProxy { 2 } else { 1 };
    let opts =
        RealBedOptions { shards, pods: 2, line: Line::V1_1, proxies, dashboard_settings, ..RealBedOptions::default() };
    let action = Path::new(env!("CARGO_BIN_EXE_pika-action"));
    // A port the bed picked may be taken meanwhile by another process: start again.
    let mut bed =
        std::panic::catch_unwind(|| RealBed::start(&opts, action)).unwrap_or_else(|_| RealBed::start(&opts, action));
    for index in 0..shards {
        run_to_completion(&bed, &["post-provision", "--own-shard"], &bed.env(index));
    }
    run_to_completion(&bed, &["post-provision"], &bed.env(0));
    // Every replica linked and in sync first: a replica still on its first sync has none of the writes yet.
    for index in 0..shards {
        bed.assert_registered(index, bed.master_ordinal(index));
    }
    let watcher = (way == Way::Product).then(|| bed.start_watcher());
    if way == Way::Product {
        // The watcher re-links each replica a while after its first full copy (pika leaves an rsync client idle
        // otherwise), and a replica's link is down for a moment then: measured once that is over, as in a cluster
        // that runs.
        let settled = Instant::now();
        while !relinks_done(&bed) {
            assert!(settled.elapsed() < Duration::from_secs(60), "the watcher never re-linked the replicas");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let mut index = 0;
    if case == Case::Migrating {
        index = start_large_migration(&bed);
    }
    // Writes into the migrating slot wait on the source's batch (one took 5 s here and held the writer back, past the
    // failover): the outage measured is the killed group's, so the writer leaves that slot out.
    let slots = bed.topology().slots.len();
    let big = pika_action::plan::keyslot::slot_of(b"{big}", slots);
    let migrating = case == Case::Migrating;
    let writer = Writer::start_skipping(&bed, move |key| {
        migrating && pika_action::plan::keyslot::slot_of(key.as_bytes(), slots) == big
    });
    let warm = Instant::now();
    while writer.acked() < 200 {
        assert!(warm.elapsed() < Duration::from_secs(30), "no write through the proxy");
        std::thread::sleep(Duration::from_millis(10));
    }
    if case == Case::StaleProxy {
        bed.proxies[1].kill();
    }
    let master = bed.master_ordinal(index);
    let dead = bed.shards[index].pod(master).server();
    // The outage is that of the killed master's slots: writes to other groups' slots go on meanwhile.
    let topology = bed.topology();
    let gid = topology.group_of(&dead).expect("the killed master's group").id;
    let owned: Vec<bool> = topology.slots.iter().map(|&g| g == gid).collect();
    let in_group = |key: &str| owned[pika_action::plan::keyslot::slot_of(key.as_bytes(), owned.len())];
    let killed = if case == Case::Stalled {
        // From the moment it is stopped: a write sent while `kill -STOP` starts is still answered.
        bed.shards[index].pod(master).freeze();
        Instant::now()
    } else {
        let killed = Instant::now();
        bed.shards[index].pod_mut(master).kill();
        killed
    };
    let failed_over =
        || bed.topology().group_of(&dead).and_then(|g| g.master().map(str::to_owned)).is_some_and(|m| m != dead);
    let mut moved = false;
    while killed.elapsed() < patience {
        if failed_over() {
            moved = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if moved {
        // A few writes after the new master took over, so the first one after the kill is among the beats.
        let acked = writer.acked();
        let resumed = Instant::now();
        while writer.acked() < acked + 100 && resumed.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let beats = writer.stop();
    let outage = beats
        .iter()
        .find(|b| b.sent >= killed && b.acked.is_some() && in_group(&b.key))
        .and_then(|b| b.acked)
        .map(|at| at - killed);
    // A run past the target shows why: the watcher's log, read before the bed goes.
    if let (Some(watcher), Some(took)) = (&watcher, outage) {
        if took > Duration::from_secs(3) {
            eprintln!("{case:?} took {took:.2?}; the watcher's log:\n{}", watcher.log());
            for b in beats.iter().filter(|b| b.sent + Duration::from_secs(1) >= killed) {
                let waited = b.acked.map(|at| at - b.sent);
                if waited.is_none_or(|w| w > Duration::from_millis(300)) {
                    let at = b.sent.saturating_duration_since(killed);
                    eprintln!(
                        "  write {} sent {at:.2?} after the kill, in the group {}: {waited:.2?}",
                        b.key,
                        in_group(&b.key)
                    );
                }
            }
        }
    }
    drop(watcher);
    let ledger = ledger_of(&beats);
    let acked = ledger.acked.len();
    let check = ledger.verify_through_authed(bed.proxies[0].data_addr(), Some(&bed.password));
    let before = beats.iter().filter(|b| b.acked.is_some_and(|at| at < killed)).count();
    let index_of = |key: &str| key.rsplit(':').next().and_then(|n| n.parse::<u64>().ok());
    let lost: Vec<u64> = check.lost.iter().filter_map(|k| index_of(k)).collect();
    println!(
        "  {before} writes acknowledged before the kill (the last bench:{}), lost bench:{:?}..={:?}, {} wrong (first \
         {:?}), {} read errors (first {:?})",
        before.saturating_sub(1),
        lost.iter().min(),
        lost.iter().max(),
        check.wrong.len(),
        check.wrong.first(),
        check.errors.len(),
        check.errors.first()
    );
    Outcome { outage: outage.filter(|_| moved), lost: check.lost.len() + check.wrong.len(), acked }
}

/// Whether no replica is marked for a re-link by the watcher any more.
fn relinks_done(bed: &RealBed) -> bool {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    rt.block_on(async {
        let endpoints = pika_action::input::address::Endpoints::parse(&bed.etcd.endpoint()).expect("an endpoint");
        let etcd = pika_action::clients::etcd::Etcd::connect(&endpoints, Duration::from_secs(5)).await.expect("etcd");
        let prefix = pika_action::clients::etcd::cluster_prefix(testbed::real::bed::NAMESPACE, &bed.name);
        pika_action::steps::transfer::relink_marks(&etcd, &prefix).await.expect("the re-link marks").is_empty()
    })
}

/// The writes acknowledged, as a ledger of `v-<key>` values.
fn ledger_of(beats: &[Beat]) -> Ledger {
    let mut ledger = Ledger::default();
    for beat in beats.iter().filter(|b| b.acked.is_some()) {
        ledger.acked.insert(beat.key.clone(), format!("v-{}", beat.key));
    }
    ledger
}

/// Preloads 300,000 keys into one slot and starts its migration to another group; returns the index of the shard of
/// the third group, whose master the case kills.
fn start_large_migration(bed: &RealBed) -> usize {
    let topology = bed.topology();
    let slot = pika_action::plan::keyslot::slot_of(b"{big}", topology.slots.len());
    let from = topology.slots[slot];
    let gids: Vec<u32> = topology.groups.iter().map(|g| g.id).collect();
    let to = *gids.iter().find(|&&g| g != from).expect("another group");
    let outside = *gids.iter().find(|&&g| g != from && g != to).expect("a third group");
    let big: Vec<String> = (0..300_000).map(|n| format!("{{big}}:{n}")).collect();
    let written = Ledger::write_keys_authed(bed.proxies[0].data_addr(), Some(&bed.password), &big).expect("preload");
    assert_eq!(written.acked.len(), big.len(), "preload: {:?}", written.errors);
    let out = bed.codis_admin(&["--slot-action", "--create", &format!("--sid={slot}"), &format!("--gid={to}")]);
    assert!(out.status.success(), "codis-admin: {}", String::from_utf8_lossy(&out.stderr));
    let began = Instant::now();
    while bed.topology().migrating == 0 {
        assert!(began.elapsed() < Duration::from_secs(20), "the slot never began to migrate");
        std::thread::sleep(Duration::from_millis(50));
    }
    (0..bed.shards.len())
        .find(|&i| topology.group_of(&bed.shards[i].pods[0].server()).is_some_and(|g| g.id == outside))
        .expect("the third group's shard")
}
