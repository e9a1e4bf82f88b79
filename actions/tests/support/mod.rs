//! What the integration tests share: the fixture cluster of the test bed, and running the real binary the way
//! kbagent does.
#![allow(dead_code, unused_imports)]

use std::collections::BTreeMap;
use std::process::{Command, Output};

pub use testbed::cluster::{
    eventually, minimum_moves, moved, Bed, ClusterFixture, PodFixture, ShardFixture, NAMESPACE, PIKA_PORT,
};

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
