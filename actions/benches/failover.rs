//! What a failover costs, with the watcher's default settings (`FAILOVER_DETECTION_MS` 2000,
//! `WATCH_PROBE_INTERVAL_MS` 500, `WATCH_LEASE_SECONDS` 5), over the test bed of the failover tests (real
//! redis-servers standing in for pika, real etcd, the Codis double with 1024 slots and a proxy double serving the
//! data port), and what the watcher costs while nothing fails.
//!
//! 1. **Failover** (`FAILOVER_BENCH_RUNS`, default 3): one shard of three pods, a workload and a writer through the
//!    proxy (one `SET` every 2 ms, each send and acknowledgement timed), the master killed with `kill -9`. Reported:
//!    from the kill to the first acknowledged write sent after it (target ≤ 5 s; the Pika fork's own HA takes about
//!    29 s); acknowledged writes not read back through the proxy afterwards, with the replication lag (master offset
//!    minus the best replica's, in bytes) sampled just before the kill; the most servers answering `role:master` at
//!    once over samples every 2 ms (must be 1).
//! 2. **Idle** (`FAILOVER_BENCH_GROUPS`, default 64 groups of two pods; `FAILOVER_BENCH_IDLE_SECONDS`, default 30):
//!    the leading watcher's CPU (utime + stime from `/proc/<pid>/stat` over the window, as a share of one core) and
//!    resident memory (`VmRSS`, `VmHWM`) while every master answers (targets ≤ 1 % of a core, ≤ 20 MiB).
//!
//! `cargo bench -p pika-action --bench failover` (release build of the binary, as shipped);
//! `FAILOVER_BENCH_SKIP_IDLE=1` or `FAILOVER_BENCH_SKIP_FAILOVER=1` runs one half.

#[path = "../tests/failover_bed/mod.rs"]
mod failover_bed;
#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use failover_bed::{distribution, kill9, lag_now, ledger_of, outage, sampling, FailoverBed, Options, Pulse, PATIENCE};
use support::eventually;
use testbed::{Workload, WorkloadOptions};

fn var(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The watcher's environment with the chart's defaults.
fn default_watch_env(fb: &FailoverBed, name: &str) -> std::collections::BTreeMap<String, String> {
    let mut env = fb.watch_env(name, 2000);
    env.insert("WATCH_PROBE_INTERVAL_MS".into(), "500".into());
    env.insert("WATCH_LEASE_SECONDS".into(), "5".into());
    env
}

fn main() {
    // `cargo test --benches` passes harness arguments; this bench takes none.
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if var("FAILOVER_BENCH_SKIP_FAILOVER", 0) == 0 {
        failover(usize::try_from(var("FAILOVER_BENCH_RUNS", 3)).unwrap_or(3));
    }
    if var("FAILOVER_BENCH_SKIP_IDLE", 0) == 0 {
        idle(usize::try_from(var("FAILOVER_BENCH_GROUPS", 64)).unwrap_or(64), var("FAILOVER_BENCH_IDLE_SECONDS", 30));
    }
}

fn failover(runs: usize) {
    let mut outages = Vec::new();
    let mut lost_total = 0;
    for run in 1..=runs {
        let mut fb = FailoverBed::new(Options::default().shards(1).pods(3));
        let watcher = fb.watcher("watcher-a", &default_watch_env(&fb, "watcher-a"));
        assert!(watcher.wait_log("leading", PATIENCE), "{}", watcher.log());
        let data = fb.proxy.data_addr();
        let workload = Workload::start(WorkloadOptions::through(std::slice::from_ref(&data)));
        let pulse = Pulse::start(&data, "pulse", Duration::from_millis(2));
        assert!(workload.wait_for_acked(300, PATIENCE));
        let old = fb.codis_master(0);
        let ((t0, lag), samples) = sampling(&fb, 0, || {
            let lag = lag_now(&fb, 0, old);
            let t0 = kill9(&fb.pods(0)[old as usize]);
            fb.wait_new_master(0, old).expect("a new master");
            let before = pulse.acked();
            assert!(eventually(PATIENCE, || pulse.acked() > before + 50), "writes did not resume");
            (t0, lag)
        });
        fb.pod_mut(0, old).redis.kill();
        let beats = pulse.stop();
        let mut ledger = workload.stop();
        ledger.merge(ledger_of(&beats));
        let took = outage(&beats, t0).expect("a write acknowledged after the kill");
        let check = ledger.verify_through(&data);
        assert!(check.errors.is_empty(), "{}", check.summary());
        let max_masters = samples.iter().map(|s| s.masters.len()).max().unwrap_or(0);
        println!(
            "failover run {run}: first write {} ms after the kill; {} acknowledged, {} lost; replication lag at the \
             kill {} bytes; at most {max_masters} role:master at once over {} samples",
            took.as_millis(),
            check.checked,
            check.lost.len(),
            lag.map_or_else(|| "unknown".to_owned(), |l| l.to_string()),
            samples.len()
        );
        outages.push(took.as_millis());
        lost_total += check.lost.len();
    }
    println!("failover, kill -9 to first acknowledged write (defaults): {}", distribution(outages));
    println!("failover, acknowledged writes lost over all runs: {lost_total}");
}

fn idle(groups: usize, seconds: u64) {
    let started = Instant::now();
    let fb = FailoverBed::new(Options::default().shards(groups).pods(2));
    println!("idle: {groups} groups of 2 pods provisioned in {} s", started.elapsed().as_secs());
    let watcher = fb.watcher("watcher-a", &default_watch_env(&fb, "watcher-a"));
    assert!(watcher.wait_log("leading", PATIENCE), "{}", watcher.log());
    let pid = watcher.pid().expect("running");
    // Let it settle: first probes, connections, held-data marks, a repair round.
    std::thread::sleep(Duration::from_secs(15));
    let ticks = 100.0; // USER_HZ on Linux
    let (cpu0, t0) = (cpu_ticks(pid), Instant::now());
    std::thread::sleep(Duration::from_secs(seconds));
    let (cpu1, t1) = (cpu_ticks(pid), Instant::now());
    let used = (cpu1 - cpu0) as f64 / ticks;
    let share = 100.0 * used / t1.duration_since(t0).as_secs_f64();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let field = |k: &str| status.lines().find(|l| l.starts_with(k)).map(|l| l.trim_start_matches(k).trim().to_owned());
    println!(
        "idle watcher over {groups} groups for {seconds} s: {share:.2} % of a core ({used:.2} s CPU); VmRSS {}, \
         VmHWM {}, threads {}",
        field("VmRSS:").unwrap_or_default(),
        field("VmHWM:").unwrap_or_default(),
        field("Threads:").unwrap_or_default(),
    );
    assert!(!watcher.log().contains("failing over"), "a failover while idle:\n{}", watcher.log());
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
}
