//! What the integration tests share: the fixture cluster of the test bed, and running the real binary the way
//! kbagent does.
#![allow(dead_code, unused_imports)]

use std::collections::BTreeMap;
use std::process::{Command, Output};

pub use testbed::cluster::{
    eventually, minimum_moves, moved, Bed, ClusterBuilder, ClusterFixture, PodFixture, ShardFixture, NAMESPACE,
    PIKA_PORT,
};

/// A client of the test bed's etcd at `endpoint` (`host:port`), connected as the actions connect.
pub async fn connect_etcd(
    endpoint: &str,
) -> Result<pika_action::clients::etcd::Etcd, pika_action::clients::etcd::Error> {
    let endpoints =
        pika_action::input::address::Endpoints::parse(endpoint).expect("the test etcd's endpoint is host:port");
    pika_action::clients::etcd::Etcd::connect(&endpoints, std::time::Duration::from_secs(5)).await
}

/// Runs `pika-action <action>` the way kbagent does: no shell, working directory `/`, exactly `env` plus PATH.
pub fn run(action: &str, env: &BTreeMap<String, String>) -> Output {
    run_args(&[action], env)
}

/// Like [`run`], with options after the subcommand (`["post-provision", "--own-shard"]`).
pub fn run_args(args: &[&str], env: &BTreeMap<String, String>) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pika-action"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env)
        .current_dir("/")
        .output()
        .expect("run pika-action")
}

/// Runs `pika-action <action>` like [`run`] when its time box is what the test is about: the action must stop on
/// its own once `budget` (its `ACTION_BUDGET_SECONDS`) is used up. A run still going long after that (four times
/// the budget plus a minute, far beyond any slow machine's lag) is a hang, not slowness: it is killed and the
/// test fails saying so. How long a run took is never asserted.
pub fn run_time_boxed(action: &str, env: &BTreeMap<String, String>, budget: u64) -> Output {
    use std::time::{Duration, Instant};
    let hang = Duration::from_secs(budget * 4 + 60);
    let mut child = Command::new(env!("CARGO_BIN_EXE_pika-action"))
        .arg(action)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env)
        .current_dir("/")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run pika-action");
    // Drained while it runs, so that a chatty run never blocks on a full pipe and looks hung.
    let drain = |mut pipe: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = drain(Box::new(child.stdout.take().expect("stdout")));
    let stderr = drain(Box::new(child.stderr.take().expect("stderr")));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for pika-action") {
            break status;
        }
        if started.elapsed() > hang {
            let _ = child.kill();
            let status = child.wait().expect("reap pika-action");
            let out =
                Output { status, stdout: stdout.join().unwrap_or_default(), stderr: stderr.join().unwrap_or_default() };
            panic!(
                "{action} still ran {hang:?} after it started on a budget of {budget} s: not time-boxed\n{}",
                describe(&out)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Output { status, stdout: stdout.join().unwrap_or_default(), stderr: stderr.join().unwrap_or_default() }
}

/// Runs the action until it exits 0, rerunning on 75 (as KubeBlocks requeues); panics on anything else.
pub fn run_to_completion(action: &str, env: &BTreeMap<String, String>) -> Vec<Output> {
    let mut outputs = Vec::new();
    for _ in 0..30 {
        let out = run(action, env);
        let code = out.status.code();
        outputs.push(out);
        match code {
            Some(0) => return outputs,
            Some(75) => continue,
            _ => panic!("{action} failed: {}", describe(outputs.last().unwrap())),
        }
    }
    panic!("{action} did not finish in 30 runs");
}

/// Exit code, stdout and stderr of a run, for assertion messages.
pub fn describe(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
