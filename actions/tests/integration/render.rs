//! The event templates, driven through the real binary the way KubeBlocks runs it: a realistic environment in, the
//! exact event out (golden files), and every kind of bad input rejected with exit 2 naming the variable.
//!
//! Regenerate the golden files after an intended change with `UPDATE_GOLDEN=1 cargo test -p pika-action --test integration render`,
//! then read the diff value by value and update `tests/golden/REVIEW.md` (the files were reviewed by hand).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const SECRET: &str = "golden-secret-pw";

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn read_env(path: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap();
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

/// Runs `pika-action <args>` with exactly `env` (plus PATH), as kbagent does: no shell, nothing inherited.
fn run(args: &[&str], env: &BTreeMap<String, String>) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pika-action"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env)
        .current_dir("/")
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn env_of(case: &str) -> BTreeMap<String, String> {
    read_env(&golden_dir().join(format!("{case}.env")))
}

#[test]
fn every_template_renders_its_golden_event() {
    let mut cases: Vec<PathBuf> = std::fs::read_dir(golden_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "env"))
        .collect();
    cases.sort();
    assert!(cases.len() >= 15, "golden cases went missing: {cases:?}");
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    let mut failures = Vec::new();
    for case in &cases {
        let stem = case.file_stem().unwrap().to_string_lossy().into_owned();
        let action = stem.split('.').next().unwrap();
        // `<case>.args`: command-line options of the subcommand, one per line.
        let options = std::fs::read_to_string(case.with_extension("args")).unwrap_or_default();
        let mut args = vec!["render", action];
        args.extend(options.lines().map(str::trim).filter(|l| !l.is_empty()));
        let out = run(&args, &read_env(case));
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{stem}: {}", text(&out.stderr));
        assert!(!stdout.contains(SECRET) && !text(&out.stderr).contains(SECRET), "{stem} leaked the password");
        let golden = case.with_extension("json");
        if update {
            std::fs::write(&golden, &stdout).unwrap();
            continue;
        }
        let expected = std::fs::read_to_string(&golden).unwrap_or_default();
        if expected != stdout {
            failures.push(format!("{stem}: expected\n{expected}\ngot\n{stdout}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_action_has_a_template_on_the_lines_it_runs_on() {
    // Actions that exist on both lines render on both; the 1.1-only sharding actions refuse 1.0 by name.
    for action in ["member-join", "member-leave", "switchover", "role-probe", "rejoin", "topology"] {
        for line in ["1.0", "1.1"] {
            let out = run(&["render", action], &env_of(&format!("{action}.{line}")));
            assert_eq!(out.status.code(), Some(0), "{action} on {line}: {}", text(&out.stderr));
            assert!(text(&out.stdout).contains(&format!("\"kubeblocks\": \"{line}\"")));
        }
    }
    for action in ["shard-add", "shard-remove"] {
        let mut env = env_of(&format!("{action}.1.1"));
        env.insert("KUBEBLOCKS_LINE".into(), "1.0.2".into());
        let out = run(&["render", action], &env);
        assert_eq!(out.status.code(), Some(2));
        assert!(text(&out.stderr).contains("KUBEBLOCKS_LINE"), "{}", text(&out.stderr));
    }
    // pre-terminate runs on both lines: the 1.0 component action with the legacy lists, the 1.1 safety net without.
    for case in ["pre-terminate.1.0.scaling-in", "pre-terminate.1.1"] {
        let out = run(&["render", "pre-terminate"], &env_of(case));
        assert_eq!(out.status.code(), Some(0), "{case}: {}", text(&out.stderr));
    }
}

#[test]
fn a_kubeblocks_line_the_environment_contradicts_is_exit_2_saying_how_to_fix_it() {
    // An addon installed for 1.1 on a KubeBlocks 1.0.x (which sets the legacy lists), and the other way round.
    let cases = [
        ("post-provision.1.0", "1.1", None, "kubeblocksLine=1.0"),
        ("pre-terminate.1.0.scaling-in", "1.1", None, "kubeblocksLine=1.0"),
        ("post-provision.1.1", "1.0", None, "kubeblocksLine=1.1"),
        ("pre-terminate.1.1", "1.0", None, "kubeblocksLine=1.1"),
        ("post-provision.1.0.own-shard", "1.1", Some("--own-shard"), "kubeblocksLine=1.0"),
        ("post-provision.1.1.own-shard", "1.0.2", Some("--own-shard"), "kubeblocksLine=1.1"),
    ];
    for (case, line, option, fix) in cases {
        let mut env = env_of(case);
        env.insert("KUBEBLOCKS_LINE".into(), line.into());
        let action = case.split('.').next().unwrap();
        for mut args in [vec!["render", action], vec![action]] {
            args.extend(option);
            let out = run(&args, &env);
            let stderr = text(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{case} with KUBEBLOCKS_LINE={line}: {stderr}");
            assert!(stderr.contains("KUBEBLOCKS_LINE") && stderr.contains(fix), "{case}: {stderr}");
            assert!(out.stdout.is_empty(), "{case}");
        }
    }
    // Unset, the line is detected: the same environments render on the line they are from.
    for case in ["post-provision.1.0", "pre-terminate.1.0.scaling-in", "post-provision.1.1", "pre-terminate.1.1"] {
        let mut env = env_of(case);
        env.remove("KUBEBLOCKS_LINE");
        let out = run(&["render", case.split('.').next().unwrap()], &env);
        assert_eq!(out.status.code(), Some(0), "{case} without KUBEBLOCKS_LINE: {}", text(&out.stderr));
    }
}

/// One bad input: start from a valid case, change one variable, expect exit 2 naming `names`.
struct Bad {
    case: &'static str,
    var: &'static str,
    value: Option<&'static str>,
    names: &'static str,
}

const fn bad(case: &'static str, var: &'static str, value: Option<&'static str>, names: &'static str) -> Bad {
    Bad { case, var, value, names }
}

const OTHER_CLUSTER: &str = "c2-pika-x7k-0.c2-pika-x7k-headless.prod.svc.cluster.local";
const OTHER_NAMESPACE: &str = "c1-pika-x7k-0.c1-pika-x7k-headless.staging.svc.cluster.local";

fn bad_inputs() -> Vec<Bad> {
    let mut table = Vec::new();
    // Every required variable missing and empty, for each action.
    let required: &[(&str, &[&str])] = &[
        (
            "post-provision.1.1",
            &[
                "CLUSTER_NAME",
                "CLUSTER_NAMESPACE",
                "CODIS_DASHBOARD_ADDR",
                "ETCD_ENDPOINTS",
                "SHARD_NAME",
                "SHARD_POD_FQDNS",
                "ALL_SHARDS_POD_FQDNS",
            ],
        ),
        ("shard-add.1.1", &["KB_ADD_SHARD_NAME", "ALL_SHARDS_POD_FQDNS", "ETCD_ENDPOINTS"]),
        ("shard-remove.1.1", &["KB_REMOVE_SHARD_NAME", "ALL_SHARDS_POD_FQDNS"]),
        ("pre-terminate.1.0.scaling-in", &["SHARD_NAME", "SHARD_POD_FQDNS", "ETCD_ENDPOINTS", "ALL_SHARDS_POD_FQDNS"]),
        ("member-join.1.1", &["KB_JOIN_MEMBER_POD_NAME", "KB_JOIN_MEMBER_POD_FQDN", "SHARD_POD_FQDNS"]),
        ("member-leave.1.1", &["KB_LEAVE_MEMBER_POD_NAME", "KB_LEAVE_MEMBER_POD_FQDN"]),
        ("switchover.1.1", &["KB_SWITCHOVER_CURRENT_NAME", "KB_SWITCHOVER_CURRENT_FQDN", "CODIS_DASHBOARD_ADDR"]),
        ("rejoin.1.1", &["POD_NAME", "SHARD_POD_FQDNS", "CODIS_DASHBOARD_ADDR"]),
        ("pre-stop.1.1", &["POD_NAME", "SHARD_POD_FQDNS", "CODIS_DASHBOARD_ADDR", "ETCD_ENDPOINTS"]),
        ("topology.1.1", &["CLUSTER_NAME", "CLUSTER_NAMESPACE", "CODIS_DASHBOARD_ADDR"]),
    ];
    for (case, vars) in required {
        for var in *vars {
            table.push(bad(case, var, None, var));
            table.push(bad(case, var, Some(""), var));
            table.push(bad(case, var, Some("  "), var));
        }
    }
    table.extend([
        bad("post-provision.1.1", "PIKA_PORT", Some("92a1"), "PIKA_PORT"),
        bad("post-provision.1.1", "PIKA_PORT", Some("70000"), "PIKA_PORT"),
        bad("post-provision.1.1", "PIKA_PORT", Some("0"), "PIKA_PORT"),
        bad("post-provision.1.1", "ACTION_BUDGET_SECONDS", Some("soon"), "ACTION_BUDGET_SECONDS"),
        bad("post-provision.1.1", "ACTION_BUDGET_SECONDS", Some("0"), "ACTION_BUDGET_SECONDS"),
        bad("post-provision.1.1", "CODIS_DASHBOARD_ADDR", Some("dashboard"), "CODIS_DASHBOARD_ADDR"),
        bad("post-provision.1.1", "CODIS_DASHBOARD_ADDR", Some("dashboard:http"), "CODIS_DASHBOARD_ADDR"),
        bad("post-provision.1.1", "ETCD_ENDPOINTS", Some("etcd:2379,etcd"), "ETCD_ENDPOINTS"),
        bad("post-provision.1.1", "ETCD_ENDPOINTS", Some(",,"), "ETCD_ENDPOINTS"),
        bad("post-provision.1.1", "SHARD_POD_FQDNS", Some("c1-pika-x7k-0"), "SHARD_POD_FQDNS"),
        bad("post-provision.1.1", "SHARD_POD_FQDNS", Some("10.0.0.7"), "SHARD_POD_FQDNS"),
        bad("post-provision.1.1", "SHARD_POD_FQDNS", Some(","), "SHARD_POD_FQDNS"),
        bad("post-provision.1.1", "SHARD_POD_FQDNS", Some(OTHER_CLUSTER), "SHARD_POD_FQDNS"),
        bad("post-provision.1.1", "SHARD_POD_FQDNS", Some(OTHER_NAMESPACE), "SHARD_POD_FQDNS"),
        bad(
            "post-provision.1.1",
            "SHARD_POD_FQDNS",
            Some("c1-pika-b2c-0.c1-pika-b2c-headless.prod.svc.cluster.local"),
            "SHARD_POD_FQDNS",
        ),
        bad("post-provision.1.1", "SHARD_NAME", Some("c2-pika-x7k"), "SHARD_NAME"),
        bad("post-provision.1.1", "SHARD_NAME", Some("C1_PIKA"), "SHARD_NAME"),
        bad("post-provision.1.1", "ALL_SHARDS_POD_FQDNS", Some("pika-x7k"), "ALL_SHARDS_POD_FQDNS"),
        bad("post-provision.1.1", "ALL_SHARDS_POD_FQDNS", Some("pika-x7k:"), "ALL_SHARDS_POD_FQDNS"),
        bad("post-provision.1.1", "ALL_SHARDS_POD_FQDNS", Some(";;"), "ALL_SHARDS_POD_FQDNS"),
        bad(
            "post-provision.1.1",
            "ALL_SHARDS_POD_FQDNS",
            Some("pika-b2c:c1-pika-b2c-0.c1-pika-b2c-headless.prod.svc"),
            "SHARD_NAME",
        ),
        bad("post-provision.1.1", "CLUSTER_NAME", Some("c1.prod"), "CLUSTER_NAME"),
        bad("post-provision.1.1", "KUBEBLOCKS_LINE", Some("0.9.3"), "KUBEBLOCKS_LINE"),
        bad("post-provision.1.1", "KUBEBLOCKS_LINE", Some("latest"), "KUBEBLOCKS_LINE"),
        bad("post-provision.1.1", "PIKA_ADDRESS_OVERRIDES", Some("a:1"), "PIKA_ADDRESS_OVERRIDES"),
        bad("post-provision.1.1", "CODIS_PRODUCT_NAME", Some("a/b"), "CODIS_PRODUCT_NAME"),
        bad("shard-add.1.1", "KB_ADD_SHARD_NAME", Some("c1-pika-zzz"), "KB_ADD_SHARD_NAME"),
        bad("shard-add.1.1", "KB_ADD_SHARD_NAME", Some("c2-pika-q9z"), "KB_ADD_SHARD_NAME"),
        bad("shard-remove.1.1", "KB_REMOVE_SHARD_NAME", Some("other-pika-q9z"), "KB_REMOVE_SHARD_NAME"),
        bad(
            "pre-terminate.1.0.scaling-in",
            "KB_CLUSTER_COMPONENT_IS_SCALING_IN",
            Some("yes"),
            "KB_CLUSTER_COMPONENT_IS_SCALING_IN",
        ),
        bad(
            "member-join.1.1",
            "KB_JOIN_MEMBER_POD_FQDN",
            Some("c1-pika-x7k-7.c1-pika-x7k-headless.prod.svc.cluster.local"),
            "KB_JOIN_MEMBER_POD_NAME",
        ),
        bad("member-join.1.1", "KB_JOIN_MEMBER_POD_NAME", Some("c1-pika-x7k-9"), "KB_JOIN_MEMBER_POD_NAME"),
        bad("member-join.1.1", "KB_JOIN_MEMBER_POD_FQDN", Some("not a fqdn"), "KB_JOIN_MEMBER_POD_FQDN"),
        bad(
            "member-leave.1.1",
            "KB_LEAVE_MEMBER_POD_FQDN",
            Some("c1-pika-b2c-2.c1-pika-b2c-headless.prod.svc.cluster.local"),
            "KB_LEAVE_MEMBER_POD_NAME",
        ),
        bad(
            "switchover.1.1.candidate",
            "KB_SWITCHOVER_CANDIDATE_FQDN",
            Some("c1-pika-b2c-1.c1-pika-b2c-headless.prod.svc.cluster.local"),
            "KB_SWITCHOVER_CANDIDATE_NAME",
        ),
        bad(
            "switchover.1.1.candidate",
            "KB_SWITCHOVER_CANDIDATE_NAME",
            Some("c1-pika-x7k-0"),
            "KB_SWITCHOVER_CANDIDATE_NAME",
        ),
        bad("switchover.1.1.candidate", "KB_SWITCHOVER_CANDIDATE_NAME", Some(""), "KB_SWITCHOVER_CANDIDATE_NAME"),
        bad("rejoin.1.1", "POD_NAME", Some("c1-pika-x7k-5"), "POD_NAME"),
        bad("pre-stop.1.1", "POD_NAME", Some("c1-pika-x7k-5"), "POD_NAME"),
        bad("pre-stop.1.1", "PRE_STOP_BUDGET_SECONDS", Some("0"), "PRE_STOP_BUDGET_SECONDS"),
        bad("pre-stop.1.1", "PRE_STOP_BUDGET_SECONDS", Some("soon"), "PRE_STOP_BUDGET_SECONDS"),
        bad("switchover.1.1.kube-api", "KUBE_API_URL", Some("https://kubernetes.default.svc:443"), "KUBE_API_URL"),
        bad("switchover.1.1.kube-api", "KUBE_API_URL", Some("127.0.0.1:8001"), "KUBE_API_URL"),
        bad("switchover.1.1.kube-api", "KUBE_API_URL", Some("http://proxy"), "KUBE_API_URL"),
        bad("topology.1.1", "ALL_SHARDS_POD_FQDNS", Some("pika-x7k"), "ALL_SHARDS_POD_FQDNS"),
        bad(
            "topology.1.1",
            "ALL_SHARDS_POD_FQDNS",
            Some("pika-b2c:c1-pika-x7k-0.c1-pika-x7k-headless.prod.svc"),
            "ALL_SHARDS_POD_FQDNS",
        ),
        bad("topology.1.1", "CODIS_DASHBOARD_ADDR", Some("dashboard"), "CODIS_DASHBOARD_ADDR"),
        bad("role-probe.1.1", "PIKA_PORT", Some("port"), "PIKA_PORT"),
        bad("role-probe.1.1", "PIKA_HOST", Some("pika host"), "PIKA_HOST"),
        bad("role-probe.1.1", "LOG_FORMAT", Some("xml"), "LOG_FORMAT"),
        bad("post-provision.1.1", "ETCD_ENDPOINTS", Some("etcd::2379"), "ETCD_ENDPOINTS"),
        bad("post-provision.1.1", "CODIS_DASHBOARD_ADDR", Some("dash:board:18080"), "CODIS_DASHBOARD_ADDR"),
        bad("post-provision.1.1", "LOG_FORMAT", Some("xml"), "LOG_FORMAT"),
        bad("post-provision.1.1", "ACTION_TEMPLATES_DIR", Some("/nonexistent"), "ACTION_TEMPLATES_DIR"),
        bad(
            "post-provision.1.0",
            "KB_CLUSTER_COMPONENT_DELETING_LIST",
            Some("Pika_X"),
            "KB_CLUSTER_COMPONENT_DELETING_LIST",
        ),
        bad(
            "post-provision.1.0",
            "ALL_SHARDS_POD_FQDNS",
            Some("c2-pika-x7k-0.c2-pika-x7k-headless.prod.svc"),
            "ALL_SHARDS_POD_FQDNS",
        ),
        bad(
            "post-provision.1.0",
            "ALL_SHARDS_POD_FQDNS",
            Some("c1-pika-x7k-0.c1-pika-x7k-headless.prod.svc,c1-pika-b2c-0.c1-pika-b2c-headless.prod.svc"),
            "ALL_SHARDS_POD_FQDNS",
        ),
        bad("pre-terminate.1.0.deletion", "ETCD_ENDPOINTS", Some("etcd::2379"), "ETCD_ENDPOINTS"),
        bad("pre-terminate.1.1", "KUBE_API_URL", Some("https://kubernetes.default.svc"), "KUBE_API_URL"),
        bad("pre-terminate.1.1", "ALL_SHARDS_POD_FQDNS", Some(";"), "ALL_SHARDS_POD_FQDNS"),
        bad("pre-terminate.1.1", "ETCD_ENDPOINTS", Some("etcd"), "ETCD_ENDPOINTS"),
        bad("rejoin.1.1", "ETCD_ENDPOINTS", Some("etcd::2379"), "ETCD_ENDPOINTS"),
        bad("topology.1.1", "ETCD_ENDPOINTS", Some("etcd"), "ETCD_ENDPOINTS"),
    ]);
    table
}

#[test]
fn bad_input_is_exit_2_naming_the_variable_before_anything_is_contacted() {
    let mut failures = Vec::new();
    let table = bad_inputs();
    for b in &table {
        let mut env = env_of(b.case);
        match b.value {
            Some(v) => env.insert(b.var.to_owned(), v.to_owned()),
            None => env.remove(b.var),
        };
        // The addresses lead nowhere: if validation did not come first, the run would fail with exit 1 instead.
        let action = b.case.split('.').next().unwrap();
        for args in [vec!["render", action], vec![action]] {
            let out = run(&args, &env);
            let stderr = text(&out.stderr);
            if out.status.code() != Some(2) || !stderr.contains(b.names) || stderr.contains(SECRET) {
                failures.push(format!(
                    "{:?} {}={:?}: exit {:?}, stderr {stderr:?} (wanted 2 naming {})",
                    args,
                    b.var,
                    b.value,
                    out.status.code(),
                    b.names
                ));
            }
            if !out.stdout.is_empty() {
                failures.push(format!("{args:?} {}={:?} printed on stdout", b.var, b.value));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} bad inputs mishandled:\n{}",
        failures.len(),
        table.len(),
        failures.join("\n")
    );
}

#[test]
fn a_template_directory_replaces_the_built_in_template_it_holds() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("role-probe.tera"),
        r#"{% import "common.tera" as common -%}
{"action": "role-probe", "kubeblocks": "1.1", "host": "pika.local", "pika": {{ common::pika() }}, "budget_seconds": 3}"#,
    )
    .unwrap();
    let mut env = env_of("role-probe.1.1");
    env.insert("ACTION_TEMPLATES_DIR".into(), dir.path().display().to_string());
    let out = run(&["render", "role-probe"], &env);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("\"host\": \"pika.local\""));
    // Templates it does not hold stay built in.
    let out = run(&["render", "rejoin"], &{
        let mut e = env_of("rejoin.1.1");
        e.insert("ACTION_TEMPLATES_DIR".into(), dir.path().display().to_string());
        e
    });
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

#[test]
fn a_broken_template_is_exit_2_naming_the_template_directory() {
    let broken: &[(&str, &str)] = &[
        ("syntax error", "{{ required(var=\"CLUSTER_NAME\" }}"),
        ("not JSON", "action: role-probe"),
        ("wrong action", r#"{"action": "switchover"}"#),
        ("missing field", r#"{"action": "role-probe", "kubeblocks": "1.1"}"#),
        ("renders a secret", r#"{"action": "role-probe", "x": {{ required(var="PIKA_PASSWORD") | json_encode() }}}"#),
    ];
    for (what, source) in broken {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("role-probe.tera"), source).unwrap();
        let mut env = env_of("role-probe.1.1");
        env.insert("ACTION_TEMPLATES_DIR".into(), dir.path().display().to_string());
        for args in [vec!["render", "role-probe"], vec!["role-probe"]] {
            let out = run(&args, &env);
            let stderr = text(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{what}: {stderr}");
            assert!(stderr.contains("ACTION_TEMPLATES_DIR"), "{what}: {stderr}");
            assert!(!stderr.contains(SECRET) && out.stdout.is_empty(), "{what}: leaked or printed");
        }
    }
    // A directory that is not there would silently leave the built-in templates in place.
    let file = tempfile::NamedTempFile::new().unwrap();
    for dir in ["/nonexistent/templates".to_owned(), file.path().display().to_string()] {
        let mut env = env_of("role-probe.1.1");
        env.insert("ACTION_TEMPLATES_DIR".into(), dir.clone());
        for args in [vec!["render", "role-probe"], vec!["role-probe"]] {
            let out = run(&args, &env);
            let stderr = text(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{dir}: {stderr}");
            assert!(stderr.contains("ACTION_TEMPLATES_DIR"), "{dir}: {stderr}");
        }
    }
}

#[test]
fn every_subcommand_documents_its_variables_in_help() {
    let expect: &[(&str, &[&str])] = &[
        (
            "post-provision",
            &[
                "CODIS_DASHBOARD_ADDR",
                "ETCD_ENDPOINTS",
                "ALL_SHARDS_POD_FQDNS",
                "KB_CLUSTER_COMPONENT_LIST",
                "ACTION_BUDGET_SECONDS",
            ],
        ),
        ("shard-add", &["KB_ADD_SHARD_NAME", "ALL_SHARDS_POD_FQDNS"]),
        ("shard-remove", &["KB_REMOVE_SHARD_NAME"]),
        ("pre-terminate", &["KB_CLUSTER_COMPONENT_IS_SCALING_IN"]),
        ("member-join", &["KB_JOIN_MEMBER_POD_NAME", "KB_JOIN_MEMBER_POD_FQDN"]),
        ("member-leave", &["KB_LEAVE_MEMBER_POD_NAME", "KB_LEAVE_MEMBER_POD_FQDN"]),
        (
            "switchover",
            &["KB_SWITCHOVER_CURRENT_FQDN", "KB_SWITCHOVER_CANDIDATE_FQDN", "KB_SWITCHOVER_ROLE", "KUBE_API_URL"],
        ),
        ("role-probe", &["PIKA_HOST", "PIKA_PORT", "PIKA_PASSWORD"]),
        ("rejoin", &["POD_NAME", "SHARD_POD_FQDNS"]),
        ("pre-stop", &["POD_NAME", "PRE_STOP_BUDGET_SECONDS", "ETCD_ENDPOINTS", "KUBE_API_URL"]),
        ("topology", &["CODIS_DASHBOARD_ADDR", "ALL_SHARDS_POD_FQDNS", "PIKA_ADDRESS_OVERRIDES", "ETCD_ENDPOINTS"]),
    ];
    let env = BTreeMap::from([("PIKA_PASSWORD".to_owned(), SECRET.to_owned())]);
    for (sub, vars) in expect {
        let out = run(&[sub, "--help"], &env);
        let help = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0));
        for var in *vars {
            assert!(help.contains(var), "{sub} --help does not mention {var}");
        }
        assert!(!help.contains(SECRET), "{sub} --help shows the password");
    }
}
