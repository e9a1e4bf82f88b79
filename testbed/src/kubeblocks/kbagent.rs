//! How KubeBlocks runs one exec action: which pods it targets, the environment, the timeout.
//!
//! Emulated (`pkg/controller/lifecycle/kbagent.go`, `pkg/kbagent/service/action_utils.go`,
//! `pkg/controller/component/kbagent.go`):
//! - parameters: the resolved non-credential vars, then the action's system variables for names the vars do not
//!   already set ("template vars take precedence");
//! - the process environment: the parameters first, then the kbagent container's own environment (frozen when the
//!   pod started: `KB_AGENT_*`, every var as it resolved then — credentials included — and the union of every
//!   action's `exec.env`, first declaration wins) for names the parameters do not set; probes get no parameters;
//! - argv: `command[0]` exec'd directly with `command[1..]` and `args`, no shell, working directory `/`;
//! - the timeout: unset or 0 → 30 s, > 0 → min(v, 60 s), < 0 → none; on expiry the child is killed (SIGKILL) and the
//!   call fails `timedOut`; a non-zero exit fails with `exit code: N, stderr: <stderr>`;
//! - target pods: no selector → the triggering pod, or `pods[0]` of an unordered listing; `Any` → a random pod;
//!   `All` → every pod, in turn, stopping at the first failure; `Role` → the pods labelled with `matchingKey` (none:
//!   "no available pod to execute action"); `Ordinal` → unsupported on 1.0, the pod with that ordinal on 1.1.
//!
//! Does NOT model: `http`/`grpc` actions, `nonBlocking` and `retryPolicy` (main only), main's killing of the whole
//! process group on a timeout (1.0 and release-1.1 kill the direct child only; pika-action starts no children),
//! kbagent's streaming and task APIs, the one-image/one-container rules. Two test-only variables are added to the
//! kbagent environment (`PIKA_ADDRESS_OVERRIDES`, `KUBE_API_URL`), and the emulated cluster network rewrites
//! service addresses (see [`crate::kubeblocks`]).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::chart::{Action, ComponentLifecycleActions, EnvEntry};
use super::Line;

/// kbagent's default call timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// kbagent's cap on a blocking call.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60);

/// The timeout of one call of `action`, `None` for none.
pub fn call_timeout(action: &Action) -> Option<Duration> {
    match action.timeout_seconds.unwrap_or(0) {
        0 => Some(DEFAULT_TIMEOUT),
        t if t > 0 => Some(Duration::from_secs(u64::try_from(t).unwrap_or(0)).min(MAX_TIMEOUT)),
        _ => None,
    }
}

/// The parameters of a call: the template vars, then the system variables for names they do not set.
pub fn parameters(
    template_vars: &BTreeMap<String, String>,
    system: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut m = template_vars.clone();
    for (k, v) in system {
        m.entry(k.clone()).or_insert_with(|| v.clone());
    }
    m
}

/// The process environment: parameters first, then the agent's environment for names they do not set.
pub fn process_env(
    parameters: &BTreeMap<String, String>,
    agent_env: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut env = parameters.clone();
    for (k, v) in agent_env {
        env.entry(k.clone()).or_insert_with(|| v.clone());
    }
    env
}

/// The union of the actions' `exec.env`, first declaration wins, in the order kbagent's container is built
/// (`mergedActionEnv4KBAgent`): the component actions, the role probe, then custom (sharding) actions.
pub fn exec_env_union(actions: &ComponentLifecycleActions, custom: &[(String, Action)]) -> Vec<EnvEntry> {
    let mut out: Vec<EnvEntry> = Vec::new();
    let mut add = |a: Option<&Action>| {
        for e in a.and_then(|a| a.exec.as_ref()).map(|x| x.env.as_slice()).unwrap_or_default() {
            if !out.iter().any(|o| o.name == e.name) {
                out.push(e.clone());
            }
        }
    };
    for a in [
        &actions.post_provision,
        &actions.pre_terminate,
        &actions.switchover,
        &actions.member_join,
        &actions.member_leave,
        &actions.readonly,
        &actions.readwrite,
    ] {
        add(a.as_ref());
    }
    add(actions.role_probe.as_ref());
    for (_, a) in custom {
        add(Some(a));
    }
    out
}

/// A pod as action targeting sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetPod {
    /// Name.
    pub name: String,
    /// Its role label.
    pub role: Option<String>,
}

/// The pods `action` runs on. `pods` is the component's pods in listing order, `triggering` the pod the action is
/// about (if any; else `pods[0]`). `pick` chooses for `Any`.
pub fn select_targets(
    line: Line,
    action: &Action,
    pods: &[TargetPod],
    triggering: Option<&TargetPod>,
    action_name: &str,
    pick: &mut dyn FnMut(usize) -> usize,
) -> Result<Vec<TargetPod>, String> {
    let mut selector = action.target_pod_selector.clone().unwrap_or_default();
    let mut key = action.matching_key.clone().unwrap_or_default();
    if selector.is_empty() {
        if let Some(exec) = &action.exec {
            selector = exec.target_pod_selector.clone().unwrap_or_default();
            key = exec.matching_key.clone().unwrap_or_default();
        }
    }
    let chosen: Vec<TargetPod> = match selector.as_str() {
        "" => match triggering.or(pods.first()) {
            Some(p) => vec![p.clone()],
            None => Vec::new(),
        },
        "Any" if pods.is_empty() => Vec::new(),
        "Any" => vec![pods[pick(pods.len())].clone()],
        "All" => pods.to_vec(),
        "Role" => pods.iter().filter(|p| p.role.as_deref() == Some(key.as_str())).cloned().collect(),
        "Ordinal" => match line {
            Line::V1_0 => return Err("ordinal selector is not supported".into()),
            Line::V1_1 => {
                let ordinal: i64 = key.parse().map_err(|_| format!("invalid ordinal matchingKey: {key}"))?;
                pods.iter()
                    .filter(|p| p.name.rsplit('-').next().and_then(|o| o.parse().ok()) == Some(ordinal))
                    .cloned()
                    .collect()
            }
        },
        other => return Err(format!("unknown pod selector: {other}")),
    };
    if chosen.is_empty() {
        return Err(format!("no available pod to execute action {action_name}"));
    }
    Ok(chosen)
}

/// How one call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// Non-zero exit.
    Failed {
        /// The exit code (`None`: killed by a signal).
        code: Option<i32>,
        /// Its stderr.
        stderr: String,
    },
    /// Killed at the timeout.
    TimedOut(Duration),
    /// Could not be started.
    Start(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Failed { code, stderr } => {
                write!(f, "exit code: {}", code.map_or("-1".to_owned(), |c| c.to_string()))?;
                if !stderr.is_empty() {
                    write!(f, ", stderr: {stderr}")?;
                }
                Ok(())
            }
            CallError::TimedOut(after) => write!(f, "timed out after {after:?}"),
            CallError::Start(e) => write!(f, "failed to start command: {e}"),
        }
    }
}

/// One finished call.
#[derive(Debug, Clone)]
pub struct CallOutput {
    /// Stdout (kept on failure too).
    pub stdout: String,
    /// Stderr.
    pub stderr: String,
    /// Exit code (`None`: killed).
    pub code: Option<i32>,
    /// Wall time.
    pub elapsed: Duration,
    /// `Ok` on exit 0.
    pub result: Result<(), CallError>,
}

/// Runs `argv` (already mapped to a local binary) with exactly `env`, in `/`, killing it at `timeout` (or when
/// `abort` is set: the emulation shutting down).
pub fn run(
    argv: &[String],
    env: &BTreeMap<String, String>,
    timeout: Option<Duration>,
    abort: Option<&AtomicBool>,
) -> CallOutput {
    let started = Instant::now();
    let fail = |e: String| CallOutput {
        stdout: String::new(),
        stderr: String::new(),
        code: None,
        elapsed: started.elapsed(),
        result: Err(CallError::Start(e)),
    };
    let Some((program, args)) = argv.split_first() else { return fail("empty command".into()) };
    let spawned = Command::new(program)
        .args(args)
        .env_clear()
        .envs(env)
        .current_dir(Path::new("/"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => return fail(e.to_string()),
    };
    // Drain the pipes on their own threads so that a chatty child never blocks on a full pipe.
    let mut out_pipe = child.stdout.take();
    let mut err_pipe = child.stderr.take();
    let out_thread = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(p) = out_pipe.as_mut() {
            let _ = p.read_to_string(&mut s);
        }
        s
    });
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(p) = err_pipe.as_mut() {
            let _ = p.read_to_string(&mut s);
        }
        s
    });
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) => {}
            Err(_) => break None,
        }
        if abort.is_some_and(|a| a.load(Ordering::SeqCst)) {
            let _ = child.kill();
            break child.wait().ok();
        }
        if timeout.is_some_and(|t| started.elapsed() >= t) {
            let _ = child.kill();
            timed_out = true;
            break child.wait().ok();
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let stdout = out_thread.join().unwrap_or_default();
    let stderr = err_thread.join().unwrap_or_default();
    let code = status.and_then(|s| s.code());
    let result = if timed_out {
        Err(CallError::TimedOut(timeout.unwrap_or_default()))
    } else if code == Some(0) {
        Ok(())
    } else {
        Err(CallError::Failed { code, stderr: stderr.trim_end().to_owned() })
    };
    CallOutput { stdout, stderr, code, elapsed: started.elapsed(), result }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn action(yaml: &str) -> Action {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn timeouts_default_to_30_s_and_are_capped_at_60_s() {
        assert_eq!(call_timeout(&action("exec: {command: [x]}")), Some(Duration::from_secs(30)));
        assert_eq!(call_timeout(&action("timeoutSeconds: 0")), Some(Duration::from_secs(30)));
        assert_eq!(call_timeout(&action("timeoutSeconds: 45")), Some(Duration::from_secs(45)));
        assert_eq!(call_timeout(&action("timeoutSeconds: 600")), Some(Duration::from_secs(60)));
        assert_eq!(call_timeout(&action("timeoutSeconds: -1")), None);
    }

    #[test]
    fn template_vars_win_over_system_variables_and_parameters_over_the_agent_env() {
        let vars = BTreeMap::from([("A".to_owned(), "var".to_owned()), ("KB_X".to_owned(), "from-var".to_owned())]);
        let system = BTreeMap::from([("KB_X".to_owned(), "system".to_owned()), ("KB_Y".to_owned(), "y".to_owned())]);
        let params = parameters(&vars, &system);
        assert_eq!(params["KB_X"], "from-var");
        assert_eq!(params["KB_Y"], "y");
        let agent = BTreeMap::from([
            ("A".to_owned(), "stale-from-pod-start".to_owned()),
            ("PIKA_PASSWORD".to_owned(), "secret".to_owned()),
        ]);
        let env = process_env(&params, &agent);
        assert_eq!(env["A"], "var", "a fresh parameter beats the frozen container env");
        assert_eq!(env["PIKA_PASSWORD"], "secret", "credentials come from the container env only");
    }

    #[test]
    fn the_exec_env_union_keeps_the_first_declaration_and_puts_the_probe_after_the_actions() {
        let actions: ComponentLifecycleActions = serde_saphyr::from_str(
            "roleProbe: {exec: {command: [p], env: [{name: H, value: probe}, {name: P, value: probe}]}}\nswitchover: {exec: {command: [s], env: [{name: H, value: switchover}]}}\n",
        )
        .unwrap();
        let custom = vec![(
            "udf-x".to_owned(),
            action("exec: {command: [c], env: [{name: C, value: custom}, {name: P, value: custom}]}"),
        )];
        let union: Vec<(String, String)> =
            exec_env_union(&actions, &custom).into_iter().map(|e| (e.name, e.value.unwrap_or_default())).collect();
        assert_eq!(
            union,
            vec![("H".into(), "switchover".into()), ("P".into(), "probe".into()), ("C".into(), "custom".into())]
        );
    }

    #[test]
    fn target_pods_per_selector() {
        let pods = vec![
            TargetPod { name: "c-p-0".into(), role: Some("slave".into()) },
            TargetPod { name: "c-p-1".into(), role: Some("master".into()) },
        ];
        let mut first = |_n: usize| 0;
        let none = action("exec: {command: [x]}");
        assert_eq!(select_targets(Line::V1_0, &none, &pods, None, "x", &mut first).unwrap(), vec![pods[0].clone()]);
        assert_eq!(
            select_targets(Line::V1_0, &none, &pods, Some(&pods[1]), "x", &mut first).unwrap(),
            vec![pods[1].clone()],
            "the triggering pod"
        );
        let role = action("targetPodSelector: Role\nmatchingKey: master");
        assert_eq!(select_targets(Line::V1_1, &role, &pods, None, "x", &mut first).unwrap(), vec![pods[1].clone()]);
        let legacy = action("exec: {targetPodSelector: Role, matchingKey: slave}");
        assert_eq!(select_targets(Line::V1_1, &legacy, &pods, None, "x", &mut first).unwrap(), vec![pods[0].clone()]);
        let nobody = action("targetPodSelector: Role\nmatchingKey: leader");
        assert_eq!(
            select_targets(Line::V1_0, &nobody, &pods, None, "shardAdd", &mut first).unwrap_err(),
            "no available pod to execute action shardAdd"
        );
        let ordinal = action("targetPodSelector: Ordinal\nmatchingKey: \"1\"");
        assert_eq!(
            select_targets(Line::V1_0, &ordinal, &pods, None, "x", &mut first).unwrap_err(),
            "ordinal selector is not supported"
        );
        assert_eq!(select_targets(Line::V1_1, &ordinal, &pods, None, "x", &mut first).unwrap(), vec![pods[1].clone()]);
        assert_eq!(
            select_targets(Line::V1_1, &action("targetPodSelector: All"), &pods, None, "x", &mut first).unwrap(),
            pods
        );
    }

    #[test]
    fn a_call_is_killed_at_its_timeout_and_failures_carry_exit_code_and_stderr() {
        let sh = |script: &str| vec!["/bin/sh".to_owned(), "-c".to_owned(), script.to_owned()];
        let env = BTreeMap::from([("GREETING".to_owned(), "hi".to_owned())]);
        let ok = run(&sh("echo $GREETING; pwd"), &env, Some(Duration::from_secs(5)), None);
        assert_eq!(ok.result, Ok(()));
        assert_eq!(ok.stdout, "hi\n/\n", "exactly the given env, working directory /");
        let failed = run(&sh("echo nope >&2; exit 75"), &env, Some(Duration::from_secs(5)), None);
        assert_eq!(failed.result, Err(CallError::Failed { code: Some(75), stderr: "nope".into() }));
        assert_eq!(failed.result.unwrap_err().to_string(), "exit code: 75, stderr: nope");
        let slow = run(&sh("exec sleep 5"), &env, Some(Duration::from_millis(200)), None);
        assert_eq!(slow.result, Err(CallError::TimedOut(Duration::from_millis(200))));
        assert!(slow.elapsed < Duration::from_secs(4), "killed, not waited for: {:?}", slow.elapsed);
    }
}
