//! Bad input against a live cluster: every action of the contract, run by the real binary next to a provisioned bed (2
//! shards of 2 pods, real etcd, real redis-servers, the Codis double), with each variable it reads missing, empty,
//! blank and malformed, plus the configuration mistakes an operator makes — a product name the dashboard does not
//! serve, an FQDN of another cluster, a pod that is not in the shard, an unknown KubeBlocks line, a template with a
//! syntax error. Every one must exit 2 naming the variable, print nothing on stdout, and change nothing: no PUT reached
//! the dashboard, etcd holds exactly the keys it held, every pika kept its role and `rejoin`'s config file is
//! untouched. (`render.rs` checks the exit code alone, with addresses that lead nowhere.)

use crate::attack;
use crate::summary;
use crate::support;

use std::collections::BTreeMap;

use attack::{etcd_entries, run_until_done, texts};
use summary::{Category, Kind};
use support::{run, Bed, NAMESPACE};

type Env = BTreeMap<String, String>;

/// One action's valid environment and the variables its template requires.
struct Base {
    /// The case's name in messages (`post-provision.1.0`).
    label: &'static str,
    /// The subcommand.
    action: &'static str,
    env: Env,
    required: &'static [&'static str],
}

const CLUSTER_VARS: &[&str] = &["CLUSTER_NAME", "CLUSTER_NAMESPACE", "CODIS_DASHBOARD_ADDR"];

fn with(mut env: Env, pairs: &[(&str, String)]) -> Env {
    for (k, v) in pairs {
        env.insert((*k).to_owned(), v.clone());
    }
    env
}

fn bases(bed: &Bed, config: &str) -> Vec<Base> {
    let c = &bed.cluster;
    let (s0, s1) = (&c.shards[0], &c.shards[1]);
    let mut scaling_in = bed.env_v1_0(1, &[1]);
    scaling_in.insert("KB_CLUSTER_COMPONENT_IS_SCALING_IN".into(), "true".into());
    let probe = Env::from([
        ("PIKA_HOST".to_owned(), "127.0.0.1".to_owned()),
        ("PIKA_PORT".to_owned(), s0.pod(0).redis.port().to_string()),
    ]);
    vec![
        Base {
            label: "post-provision.1.1",
            action: "post-provision",
            env: bed.env(0),
            required: &[
                "CLUSTER_NAME",
                "CLUSTER_NAMESPACE",
                "CODIS_DASHBOARD_ADDR",
                "ETCD_ENDPOINTS",
                "SHARD_NAME",
                "SHARD_POD_FQDNS",
                "ALL_SHARDS_POD_FQDNS",
            ],
        },
        Base {
            label: "post-provision.1.0",
            action: "post-provision",
            env: bed.env_v1_0(0, &[]),
            required: &[
                "CLUSTER_NAME",
                "CLUSTER_NAMESPACE",
                "CODIS_DASHBOARD_ADDR",
                "ETCD_ENDPOINTS",
                "SHARD_NAME",
                "SHARD_POD_FQDNS",
                "ALL_SHARDS_POD_FQDNS",
            ],
        },
        Base {
            label: "shard-add",
            action: "shard-add",
            env: with(bed.env(1), &[("KB_ADD_SHARD_NAME", s1.full.clone())]),
            required: &[
                "CLUSTER_NAME",
                "CLUSTER_NAMESPACE",
                "CODIS_DASHBOARD_ADDR",
                "ETCD_ENDPOINTS",
                "SHARD_NAME",
                "SHARD_POD_FQDNS",
                "ALL_SHARDS_POD_FQDNS",
                "KB_ADD_SHARD_NAME",
            ],
        },
        Base {
            label: "shard-remove",
            action: "shard-remove",
            env: with(bed.env(1), &[("KB_REMOVE_SHARD_NAME", s1.full.clone())]),
            required: &[
                "CLUSTER_NAME",
                "CLUSTER_NAMESPACE",
                "CODIS_DASHBOARD_ADDR",
                "ETCD_ENDPOINTS",
                "SHARD_NAME",
                "SHARD_POD_FQDNS",
                "ALL_SHARDS_POD_FQDNS",
                "KB_REMOVE_SHARD_NAME",
            ],
        },
        Base {
            label: "pre-terminate.1.0.scaling-in",
            action: "pre-terminate",
            env: scaling_in,
            required: &[
                "CLUSTER_NAME",
                "CLUSTER_NAMESPACE",
                "CODIS_DASHBOARD_ADDR",
                "ETCD_ENDPOINTS",
                "SHARD_NAME",
                "SHARD_POD_FQDNS",
                "ALL_SHARDS_POD_FQDNS",
            ],
        },
        Base {
            label: "member-join",
            action: "member-join",
            env: with(
                bed.env(0),
                &[
                    ("KB_JOIN_MEMBER_POD_NAME", s0.pod(1).name.clone()),
                    ("KB_JOIN_MEMBER_POD_FQDN", s0.pod(1).fqdn.clone()),
                ],
            ),
            required: &[
                "CLUSTER_NAME",
                "CLUSTER_NAMESPACE",
                "CODIS_DASHBOARD_ADDR",
                "ETCD_ENDPOINTS",
                "SHARD_NAME",
                "SHARD_POD_FQDNS",
                "KB_JOIN_MEMBER_POD_NAME",
                "KB_JOIN_MEMBER_POD_FQDN",
            ],
        },
        Base {
            label: "member-leave",
            action: "member-leave",
            env: with(
                bed.env(0),
                &[
                    ("KB_LEAVE_MEMBER_POD_NAME", s0.pod(1).name.clone()),
                    ("KB_LEAVE_MEMBER_POD_FQDN", s0.pod(1).fqdn.clone()),
                ],
            ),
            required: &[
                "CLUSTER_NAME",
                "CLUSTER_NAMESPACE",
                "CODIS_DASHBOARD_ADDR",
                "ETCD_ENDPOINTS",
                "SHARD_NAME",
                "SHARD_POD_FQDNS",
                "KB_LEAVE_MEMBER_POD_NAME",
                "KB_LEAVE_MEMBER_POD_FQDN",
            ],
        },
        Base {
            label: "switchover",
            action: "switchover",
            env: with(
                bed.env(0),
                &[
                    ("KB_SWITCHOVER_CURRENT_NAME", s0.pod(0).name.clone()),
                    ("KB_SWITCHOVER_CURRENT_FQDN", s0.pod(0).fqdn.clone()),
                    ("KB_SWITCHOVER_ROLE", "master".to_owned()),
                    ("KB_SWITCHOVER_CANDIDATE_NAME", s0.pod(1).name.clone()),
                    ("KB_SWITCHOVER_CANDIDATE_FQDN", s0.pod(1).fqdn.clone()),
                ],
            ),
            required: &[
                "CLUSTER_NAME",
                "CLUSTER_NAMESPACE",
                "CODIS_DASHBOARD_ADDR",
                "ETCD_ENDPOINTS",
                "SHARD_NAME",
                "SHARD_POD_FQDNS",
                "KB_SWITCHOVER_CURRENT_NAME",
                "KB_SWITCHOVER_CURRENT_FQDN",
            ],
        },
        Base {
            label: "rejoin",
            action: "rejoin",
            env: with(bed.env(0), &[("POD_NAME", s0.pod(1).name.clone()), ("PIKA_CONFIG_FILE", config.to_owned())]),
            required: &[
                "CLUSTER_NAME",
                "CLUSTER_NAMESPACE",
                "CODIS_DASHBOARD_ADDR",
                "SHARD_NAME",
                "SHARD_POD_FQDNS",
                "POD_NAME",
            ],
        },
        Base {
            // The 1.1 safety net, for the shard about to go.
            label: "pre-terminate.1.1",
            action: "pre-terminate",
            env: bed.env(1),
            required: &[
                "CLUSTER_NAME",
                "CLUSTER_NAMESPACE",
                "CODIS_DASHBOARD_ADDR",
                "SHARD_NAME",
                "SHARD_POD_FQDNS",
                "ALL_SHARDS_POD_FQDNS",
            ],
        },
        Base { label: "topology", action: "topology", env: bed.env(0), required: CLUSTER_VARS },
        Base { label: "role-probe", action: "role-probe", env: probe, required: &[] },
    ]
}

/// The variables an action's template reads and checks (from `templates/events/`), plus those every run checks
/// before rendering (`LOG_FORMAT`, `ACTION_TEMPLATES_DIR`).
fn reads(b: &Base) -> Vec<&'static str> {
    if b.action == "role-probe" {
        return vec![
            "PIKA_HOST",
            "PIKA_PORT",
            "PIKA_ADDRESS_OVERRIDES",
            "ACTION_BUDGET_SECONDS",
            "KUBEBLOCKS_LINE",
            "LOG_FORMAT",
            "ACTION_TEMPLATES_DIR",
        ];
    }
    let mut vars = vec![
        "CLUSTER_NAME",
        "CLUSTER_NAMESPACE",
        "CODIS_DASHBOARD_ADDR",
        "CODIS_PRODUCT_NAME",
        "PIKA_PORT",
        "PIKA_ADDRESS_OVERRIDES",
        "ACTION_BUDGET_SECONDS",
        "KUBEBLOCKS_LINE",
        "LOG_FORMAT",
        "ACTION_TEMPLATES_DIR",
        // Required by most, optional for rejoin, topology and the 1.1 pre-terminate: checked whenever set.
        "ETCD_ENDPOINTS",
    ];
    if b.action != "topology" {
        vars.extend(["SHARD_NAME", "SHARD_POD_FQDNS"]);
    }
    // The legacy lists exist on 1.0.x only (on 1.1 their presence is a line mismatch, named as such).
    if b.label.ends_with("1.0") || b.label.contains("1.0.") {
        vars.extend([
            "KB_CLUSTER_COMPONENT_LIST",
            "KB_CLUSTER_COMPONENT_DELETING_LIST",
            "KB_CLUSTER_COMPONENT_UNDELETED_LIST",
        ]);
    }
    if matches!(b.label, "post-provision.1.0" | "pre-terminate.1.1") {
        vars.push("KUBE_API_URL");
    }
    vars.extend(match b.action {
        "post-provision" | "topology" => &["ALL_SHARDS_POD_FQDNS"][..],
        "shard-add" => &["ALL_SHARDS_POD_FQDNS", "KB_ADD_SHARD_NAME"][..],
        "shard-remove" => &["ALL_SHARDS_POD_FQDNS", "KB_REMOVE_SHARD_NAME"][..],
        "pre-terminate" if b.label == "pre-terminate.1.1" => &["ALL_SHARDS_POD_FQDNS"][..],
        "pre-terminate" => &["ALL_SHARDS_POD_FQDNS", "KB_CLUSTER_COMPONENT_IS_SCALING_IN"][..],
        "member-join" => &["KB_JOIN_MEMBER_POD_NAME", "KB_JOIN_MEMBER_POD_FQDN"][..],
        "member-leave" => &["KB_LEAVE_MEMBER_POD_NAME", "KB_LEAVE_MEMBER_POD_FQDN"][..],
        "switchover" => &[
            "KB_SWITCHOVER_CURRENT_NAME",
            "KB_SWITCHOVER_CURRENT_FQDN",
            "KB_SWITCHOVER_CANDIDATE_NAME",
            "KB_SWITCHOVER_CANDIDATE_FQDN",
            "KUBE_API_URL",
        ][..],
        "rejoin" => &["POD_NAME"][..],
        _ => &[][..],
    });
    vars
}

/// One malformed value: `var=value` must be refused naming `names`, in every action that reads `var` (with `only`,
/// in those of them only).
struct Malformed {
    var: &'static str,
    value: String,
    names: &'static str,
    only: &'static [&'static str],
}

fn m(var: &'static str, value: impl Into<String>) -> Malformed {
    Malformed { var, value: value.into(), names: var, only: &[] }
}

fn m_as(var: &'static str, value: impl Into<String>, names: &'static str, only: &'static [&'static str]) -> Malformed {
    Malformed { var, value: value.into(), names, only }
}

fn malformed(bed: &Bed) -> Vec<Malformed> {
    let c = &bed.cluster;
    let (s0, s1) = (&c.shards[0], &c.shards[1]);
    // The same shard and pod names in another cluster, and this cluster's pods in another namespace.
    let other = format!("{}x", c.name);
    let foreign = |fqdn: &str| fqdn.replace(&c.name, &other);
    let elsewhere = |fqdn: &str| fqdn.replace(&format!(".{NAMESPACE}."), ".ns-elsewhere.");
    let all_foreign = c.all_shards().replace(&c.name, &other);
    let mut table = vec![
        m("CODIS_DASHBOARD_ADDR", "dashboard"),
        m("CODIS_DASHBOARD_ADDR", "dashboard:http"),
        m("CODIS_DASHBOARD_ADDR", "dashboard:0"),
        m("CODIS_DASHBOARD_ADDR", "dashboard:70000"),
        m("CODIS_DASHBOARD_ADDR", "user@dashboard:18080"),
        m("CODIS_DASHBOARD_ADDR", "http://dashboard:18080/admin"),
        m("PIKA_PORT", "92a1"),
        m("PIKA_PORT", "0"),
        m("PIKA_PORT", "70000"),
        m("PIKA_PORT", "-1"),
        m("ACTION_BUDGET_SECONDS", "soon"),
        m("ACTION_BUDGET_SECONDS", "0"),
        m("ACTION_BUDGET_SECONDS", "-5"),
        m("ACTION_BUDGET_SECONDS", "100000"),
        m("ACTION_BUDGET_SECONDS", "1e3"),
        m("KUBEBLOCKS_LINE", "0.9.3"),
        m("KUBEBLOCKS_LINE", "latest"),
        m("KUBEBLOCKS_LINE", "2.0"),
        m("PIKA_ADDRESS_OVERRIDES", "a:1"),
        m("PIKA_ADDRESS_OVERRIDES", "a:1=b"),
        m("PIKA_ADDRESS_OVERRIDES", "=127.0.0.1:1"),
        m("CLUSTER_NAME", "Tb_1"),
        m("CLUSTER_NAME", "tb.1"),
        m("CLUSTER_NAMESPACE", "NS-TB"),
        m("CLUSTER_NAMESPACE", "ns.tb"),
        m("CODIS_PRODUCT_NAME", "a/b"),
        m("CODIS_PRODUCT_NAME", "a b"),
        // A product the dashboard does not serve: found only by asking it, and still nothing may change.
        m("CODIS_PRODUCT_NAME", format!("{}-other", bed.codis.product())),
        m("SHARD_NAME", format!("{other}-{}", s0.short)),
        m("SHARD_NAME", "Pk_A"),
        m("SHARD_POD_FQDNS", "10.0.0.7"),
        m("SHARD_POD_FQDNS", s0.pod(0).name.clone()),
        m("SHARD_POD_FQDNS", ","),
        m("SHARD_POD_FQDNS", foreign(&s0.fqdns())),
        m("SHARD_POD_FQDNS", elsewhere(&s0.fqdns())),
        m("SHARD_POD_FQDNS", format!("{},{}", s0.fqdns(), s0.pod(0).fqdn)),
        m("ETCD_ENDPOINTS", "etcd"),
        m("ETCD_ENDPOINTS", ",,"),
        m("ETCD_ENDPOINTS", format!("{},etcd", c.etcd.endpoint())),
        m("ALL_SHARDS_POD_FQDNS", s0.short.clone()),
        m("ALL_SHARDS_POD_FQDNS", format!("{}:", s0.short)),
        m("ALL_SHARDS_POD_FQDNS", ";;"),
        m("ALL_SHARDS_POD_FQDNS", all_foreign),
        m("ALL_SHARDS_POD_FQDNS", format!("{};{}", c.all_shards(), c.all_shards_of(&[0]))),
        m("KB_CLUSTER_COMPONENT_IS_SCALING_IN", "yes"),
        m("KB_CLUSTER_COMPONENT_IS_SCALING_IN", "1"),
        m("KB_ADD_SHARD_NAME", format!("{}-pk-zzz", c.name)),
        m("KB_ADD_SHARD_NAME", s1.full.replace(&c.name, &other)),
        m("KB_REMOVE_SHARD_NAME", s1.full.replace(&c.name, &other)),
        m("KB_REMOVE_SHARD_NAME", "Pk"),
        // A pod that is not in the shard: another shard's, another cluster's, a name that is not the FQDN's.
        m_as("KB_JOIN_MEMBER_POD_FQDN", s1.pod(1).fqdn.clone(), "KB_JOIN_MEMBER_POD_NAME", &[]),
        m("KB_JOIN_MEMBER_POD_FQDN", foreign(&s0.pod(1).fqdn)),
        m("KB_JOIN_MEMBER_POD_FQDN", elsewhere(&s0.pod(1).fqdn)),
        m("KB_JOIN_MEMBER_POD_FQDN", "not a fqdn"),
        m("KB_JOIN_MEMBER_POD_NAME", s0.pod(0).name.clone()),
        m_as("KB_LEAVE_MEMBER_POD_FQDN", s1.pod(1).fqdn.clone(), "KB_LEAVE_MEMBER_POD_NAME", &[]),
        m("KB_LEAVE_MEMBER_POD_FQDN", elsewhere(&s0.pod(1).fqdn)),
        m("KB_LEAVE_MEMBER_POD_FQDN", foreign(&s0.pod(1).fqdn)),
        m("KB_LEAVE_MEMBER_POD_NAME", s0.pod(0).name.clone()),
        m_as("KB_SWITCHOVER_CURRENT_FQDN", s1.pod(0).fqdn.clone(), "KB_SWITCHOVER_CURRENT_NAME", &[]),
        m("KB_SWITCHOVER_CURRENT_FQDN", foreign(&s0.pod(0).fqdn)),
        m("KB_SWITCHOVER_CURRENT_FQDN", elsewhere(&s0.pod(0).fqdn)),
        m("KB_SWITCHOVER_CURRENT_NAME", s0.pod(1).name.clone()),
        m("KB_SWITCHOVER_CANDIDATE_FQDN", elsewhere(&s0.pod(1).fqdn)),
        m_as("KB_SWITCHOVER_CANDIDATE_FQDN", s1.pod(1).fqdn.clone(), "KB_SWITCHOVER_CANDIDATE_NAME", &[]),
        m("KB_SWITCHOVER_CANDIDATE_NAME", s0.pod(0).name.clone()),
        m("KB_SWITCHOVER_CANDIDATE_NAME", ""),
        m("KUBE_API_URL", "https://kubernetes.default.svc:443"),
        m("KUBE_API_URL", "127.0.0.1:8001"),
        // Values the templates used to accept and that failed only later, or were ignored: each changed nothing
        // but must be refused up front all the same.
        m("ETCD_ENDPOINTS", "etcd::2379"),
        m("ETCD_ENDPOINTS", "user@etcd:2379"),
        m("CODIS_DASHBOARD_ADDR", "dash::18080"),
        m("CODIS_DASHBOARD_ADDR", "dash_board:18080"),
        m("PIKA_ADDRESS_OVERRIDES", format!("{}=127.0.0.1::1", s0.pod(0).server())),
        m("PIKA_HOST", "pika host"),
        m("PIKA_HOST", "127.0.0.1:9221"),
        m("LOG_FORMAT", "xml"),
        m("LOG_FORMAT", "jsonl"),
        m("ACTION_TEMPLATES_DIR", "/nonexistent"),
        m("ACTION_TEMPLATES_DIR", "/etc/hostname"),
        m("KB_CLUSTER_COMPONENT_LIST", "etcd,Pk_X"),
        m("KB_CLUSTER_COMPONENT_DELETING_LIST", "Pk_X"),
        m("KB_CLUSTER_COMPONENT_UNDELETED_LIST", "etcd,codis dashboard"),
        m("POD_NAME", format!("{}-5", s0.full)),
        m("POD_NAME", s1.pod(0).name.clone()),
    ];
    // The candidate given as the current pod itself.
    table.push(m_as(
        "KB_SWITCHOVER_CANDIDATE_FQDN",
        s0.pod(0).fqdn.clone(),
        "KB_SWITCHOVER_CANDIDATE",
        &["switchover"],
    ));
    table
}

/// What must not change: Codis's groups and slots, etcd's keys and values, every pika's role, rejoin's config.
#[derive(Debug, PartialEq)]
struct World {
    groups: String,
    slots: Vec<u32>,
    etcd: BTreeMap<String, String>,
    roles: Vec<String>,
    config: String,
}

fn world(bed: &Bed, config: &str) -> World {
    let snap = bed.codis.snapshot();
    World {
        groups: format!(
            "{:?}",
            snap.groups
                .iter()
                .map(|g| (g.id, g.servers.iter().map(|s| s.server.clone()).collect::<Vec<_>>()))
                .collect::<Vec<_>>()
        ),
        slots: snap.slots.iter().map(|s| s.group_id).collect(),
        etcd: etcd_entries(bed),
        roles: bed.cluster.shards.iter().flat_map(|s| &s.pods).map(|p| p.redis.role()).collect(),
        config: std::fs::read_to_string(config).unwrap_or_default(),
    }
}

/// Runs `action` with `env`; the failure text when it is not exit 2 naming `names` with nothing on stdout and no
/// PUT sent.
fn refused(bed: &Bed, action: &str, env: &Env, names: &str) -> Result<(), String> {
    bed.codis.clear_requests();
    let out = run(action, env);
    let (stdout, stderr) = texts(&out);
    let puts = bed.mutations();
    if out.status.code() == Some(2) && stderr.contains(names) && stdout.is_empty() && puts.is_empty() {
        return Ok(());
    }
    Err(format!(
        "exit {:?} (wanted 2 naming {names}), stdout {stdout:?}, stderr {stderr:?}, PUTs {puts:?}",
        out.status.code()
    ))
}

#[test]
fn bad_input_to_any_action_of_a_live_cluster_is_exit_2_naming_the_variable_and_changes_nothing() {
    let bed = Bed::builder().shards(2).pods(2).bed_default();
    run_until_done("post-provision", &bed.env(0), 10).expect("post-provision");
    // rejoin edits a copy of pod 1's config, never its live one.
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("pika.conf").display().to_string();
    std::fs::copy(bed.cluster.shards[0].pod(1).redis.dir().join("redis.conf"), &config).expect("copy config");
    let before = world(&bed, &config);
    let bases = bases(&bed, &config);

    // Every base is valid: what follows is wrong only by the one variable it changes.
    for b in &bases {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_pika-action"))
            .args(["render", b.action])
            .env_clear()
            .envs(&b.env)
            .output()
            .expect("render");
        assert_eq!(out.status.code(), Some(0), "{}: the base environment does not render: {:?}", b.label, texts(&out));
    }

    let mut missing = Category::of(Kind::Check, "bad input: required variable missing, empty or blank");
    for b in &bases {
        for var in b.required {
            for (how, value) in [("missing", None), ("empty", Some("")), ("blank", Some("   "))] {
                let mut env = b.env.clone();
                match value {
                    None => env.remove(*var),
                    Some(v) => env.insert((*var).to_owned(), v.to_owned()),
                };
                let result = refused(&bed, b.action, &env, var);
                missing.judge(format!("{} {var} {how}", b.label), result.is_ok(), || result.unwrap_err());
            }
        }
    }

    let mut wrong = Category::of(Kind::Check, "bad input: malformed variable or wrong configuration");
    for bad in malformed(&bed) {
        for b in bases.iter().filter(|b| reads(b).contains(&bad.var)) {
            if !bad.only.is_empty() && !bad.only.contains(&b.action) {
                continue;
            }
            let mut env = b.env.clone();
            env.insert(bad.var.to_owned(), bad.value.clone());
            let result = refused(&bed, b.action, &env, bad.names);
            wrong.judge(format!("{} {}={:?}", b.label, bad.var, bad.value), result.is_ok(), || result.unwrap_err());
        }
    }

    // Unknown KubeBlocks lines for the 1.1-only actions, and a template with a syntax error in place of each.
    let mut config_errors = Category::of(Kind::Check, "bad input: template syntax error or action not on this line");
    let broken = tempfile::tempdir().expect("temp dir");
    for b in &bases {
        for name in [format!("{}.tera", b.action), format!("{}.1.0.tera", b.action), format!("{}.1.1.tera", b.action)] {
            std::fs::write(broken.path().join(name), "{ \"action\": {{ required(var=\"CLUSTER_NAME\" }} }")
                .expect("write");
        }
        let env = with(b.env.clone(), &[("ACTION_TEMPLATES_DIR", broken.path().display().to_string())]);
        let result = refused(&bed, b.action, &env, "ACTION_TEMPLATES_DIR");
        config_errors.judge(format!("{} template syntax error", b.label), result.is_ok(), || result.unwrap_err());
    }
    for b in bases.iter().filter(|b| matches!(b.action, "shard-add" | "shard-remove")) {
        let env = with(b.env.clone(), &[("KUBEBLOCKS_LINE", "1.0.2".to_owned())]);
        let result = refused(&bed, b.action, &env, "KUBEBLOCKS_LINE");
        config_errors.judge(format!("{} on KubeBlocks 1.0", b.label), result.is_ok(), || result.unwrap_err());
    }

    let after = world(&bed, &config);
    let unchanged = before == after;
    let mut world_check = Category::new("bad input: nothing changed afterwards (codis, etcd, pikas)");
    world_check.judge("after every bad input", unchanged, || format!("before {before:?}\nafter {after:?}"));
    missing.finish();
    wrong.finish();
    config_errors.finish();
    world_check.finish();
}
