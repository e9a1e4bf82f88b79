//! `role-probe` against the usual shell probe, on the same redis-server (standing in for pika): median wall time
//! of a whole run as kbagent does it (fork, exec, answer, exit) and peak resident memory.
//!
//! `cargo bench -p pika-action --bench role_probe` (release build of the binary). Variables:
//! `ROLE_PROBE_BENCH_RUNS` (timed runs of each, default 200), `ROLE_PROBE_BENCH_RSS_RUNS` (memory samples, default
//! 30). The targets: faster than the shell probe, under 10 MiB.
//!
//! Wall time is measured around `spawn` … `wait` in this process, the runs of the two probes interleaved so that
//! machine noise hits both alike. Peak memory is `getrusage(RUSAGE_CHILDREN).ru_maxrss`, which only grows over a
//! process's life, so each sample is taken in a fresh copy of this bench (`--measure-one`) whose only child is the
//! probe; for the shell pipeline it is the largest of `sh`, `redis-cli` and `grep` (they run together, so their sum
//! is what the pod really pays: reported too, from one sample of each alone). The `pika-action` phases — start-up
//! and argument parsing (`--version`), plus configuration and the event template (`render role-probe`), plus the
//! probe itself — show where the time goes.
//!
//! The binary `cargo bench` builds has the features the dev-dependencies switch on in shared crates (tokio, serde
//! and others), so it is larger than the one the image ships (`cargo build --release -p pika-action --bin
//! pika-action`, as addon/Dockerfile does): measured with GNU time on one machine, a 6.9 MiB peak against 6.4 MiB.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::resource::{getrusage, UsageWho};
use testbed::RedisServer;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--measure-one") {
        measure_one(&args[2..]);
        return;
    }
    let runs = env_number("ROLE_PROBE_BENCH_RUNS", 200);
    let rss_runs = env_number("ROLE_PROBE_BENCH_RSS_RUNS", 30);
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_pika-action"));
    let redis_cli = which("redis-cli").expect("redis-cli (package redis-tools) is needed for the shell probe");
    let server = RedisServer::start();
    let port = server.port().to_string();

    let probe = Probe::new("pika-action role-probe", &binary, &["role-probe"])
        .env("PIKA_HOST", "127.0.0.1")
        .env("PIKA_PORT", &port)
        .expect("master");
    let shell_line = format!("{} -h 127.0.0.1 -p {port} info replication | grep role", redis_cli.display());
    let shell =
        Probe::new("sh -c 'redis-cli … info replication | grep role'", Path::new("/bin/sh"), &["-c", &shell_line])
            .expect("role:master");
    let phases = [
        Probe::new("  pika-action --version (start-up, arguments)", &binary, &["--version"]).expect("pika-action"),
        Probe::new("  pika-action render role-probe (+ config, template)", &binary, &["render", "role-probe"])
            .env("PIKA_PORT", &port)
            .expect("\"role-probe\""),
    ];
    let pieces = [
        Probe::new("  redis-cli alone", &redis_cli, &["-h", "127.0.0.1", "-p", &port, "info", "replication"])
            .expect("role:master"),
        Probe::new("  grep alone", Path::new("/bin/sh"), &["-c", "echo role:master | grep role"]).expect("role"),
    ];

    for p in [&probe, &shell] {
        for _ in 0..10 {
            p.run();
        }
    }
    // Round-robin, so that noise from other work on the machine hits every command alike.
    let (mut a, mut b) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
    let mut phase_times: Vec<Vec<Duration>> = vec![Vec::with_capacity(runs); phases.len()];
    for _ in 0..runs {
        a.push(probe.run());
        b.push(shell.run());
        for (p, times) in phases.iter().zip(&mut phase_times) {
            times.push(p.run());
        }
    }

    let rss = |p: &Probe| -> Vec<u64> { (0..rss_runs).map(|_| p.max_rss_kib()).collect() };
    let (ra, rb) = (rss(&probe), rss(&shell));
    let pieces_rss: Vec<u64> =
        pieces.iter().map(|p| median_u64(&(0..5).map(|_| p.max_rss_kib()).collect::<Vec<_>>())).collect();
    let sh_rss = median_u64(
        &(0..5).map(|_| Probe::new("sh", Path::new("/bin/sh"), &["-c", ":"]).max_rss_kib()).collect::<Vec<_>>(),
    );

    println!("role-probe benchmark: {runs} timed runs each (interleaved), {rss_runs} memory samples each, redis-server {port}");
    println!("binary: {}", binary.display());
    println!();
    println!("{:<58} {:>10} {:>10} {:>10} {:>12}", "probe", "median", "p10", "p90", "peak RSS");
    row(&probe.name, &a, Some(median_u64(&ra)));
    row(&shell.name, &b, Some(median_u64(&rb)));
    for (p, times) in phases.iter().zip(&phase_times) {
        row(&p.name, times, None);
    }
    println!(
        "{:<58} {:>10} {:>10} {:>10} {:>12}",
        "  shell pipeline, sh + redis-cli + grep alive together",
        "",
        "",
        "",
        format!("~{:.1} MiB", (sh_rss + pieces_rss[0] + pieces_rss[1]) as f64 / 1024.0)
    );
    println!();
    let (ma, mb) = (median(&a), median(&b));
    let mib = median_u64(&ra) as f64 / 1024.0;
    println!(
        "pika-action role-probe: {:.2} ms vs {:.2} ms for the shell probe ({:.0}% of it): {}; peak {mib:.1} MiB: {}",
        ms(ma),
        ms(mb),
        100.0 * ma.as_secs_f64() / mb.as_secs_f64(),
        if ma < mb { "faster (target met)" } else { "NOT faster (target missed)" },
        if mib < 10.0 { "under 10 MiB (target met)" } else { "NOT under 10 MiB (target missed)" },
    );
    drop(server);
}

/// Child mode: run the command once, silently, and print the peak RSS (KiB) of the largest process it involved.
fn measure_one(cmd: &[String]) {
    let status = Command::new(&cmd[0])
        .args(&cmd[1..])
        .env_clear()
        .envs(cmd_env())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("spawn");
    assert!(status.success(), "{cmd:?} failed: {status}");
    let usage = getrusage(UsageWho::RUSAGE_CHILDREN).expect("getrusage");
    // Linux reports ru_maxrss in KiB.
    println!("{}", usage.max_rss());
}

/// The environment a `--measure-one` child passes on: what the parent put in `BENCH_ENV_*`.
fn cmd_env() -> Vec<(String, String)> {
    std::env::vars().filter_map(|(k, v)| k.strip_prefix("BENCH_ENV_").map(|k| (k.to_owned(), v))).collect()
}

struct Probe {
    name: String,
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    expect: String,
}

impl Probe {
    fn new(name: &str, program: &Path, args: &[&str]) -> Self {
        Self {
            name: name.to_owned(),
            program: program.to_owned(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            env: vec![("PATH".into(), std::env::var("PATH").unwrap_or_default())],
            expect: String::new(),
        }
    }

    fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    fn expect(mut self, text: &str) -> Self {
        text.clone_into(&mut self.expect);
        self
    }

    /// One run, as kbagent does it: a fresh process, nothing inherited but what is given; checks the answer.
    fn run(&self) -> Duration {
        let started = Instant::now();
        let out = Command::new(&self.program)
            .args(&self.args)
            .env_clear()
            .envs(self.env.iter().cloned())
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .expect("spawn");
        let elapsed = started.elapsed();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && stdout.contains(&self.expect), "{}: {:?} {stdout:?}", self.name, out.status);
        elapsed
    }

    /// Peak RSS of one run, from a fresh copy of this bench.
    fn max_rss_kib(&self) -> u64 {
        let me = std::env::current_exe().expect("current exe");
        let out = Command::new(me)
            .arg("--measure-one")
            .arg(&self.program)
            .args(&self.args)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (format!("BENCH_ENV_{k}"), v.clone())))
            .output()
            .expect("spawn --measure-one");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{}: {}", self.name, String::from_utf8_lossy(&out.stderr)))
    }
}

fn row(name: &str, times: &[Duration], rss_kib: Option<u64>) {
    let mut sorted = times.to_vec();
    sorted.sort();
    let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
    println!(
        "{name:<58} {:>7.2} ms {:>7.2} ms {:>7.2} ms {:>12}",
        ms(at(0.5)),
        ms(at(0.1)),
        ms(at(0.9)),
        rss_kib.map_or_else(String::new, |k| format!("{:.1} MiB", k as f64 / 1024.0))
    );
}

fn median(times: &[Duration]) -> Duration {
    let mut sorted = times.to_vec();
    sorted.sort();
    sorted[sorted.len() / 2]
}

fn median_u64(values: &[u64]) -> u64 {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    sorted[sorted.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn env_number(var: &str, default: usize) -> usize {
    std::env::var(var).ok().and_then(|v| v.parse().ok()).filter(|n| *n > 0).unwrap_or(default)
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(program)).find(|p| p.is_file())
}
