//! What no schema can see: the rendered objects agree with each other, with the cluster chart, with pika-action's
//! command line and environment, with the Dockerfile and with the shipped files.

use std::collections::{BTreeMap, BTreeSet};

use crate::support::{addon, addon_cr, addon_dir, cluster, cluster_dir, cmpd, examples, LINES};
use chart_tests::helm::{helm, Options};
use chart_tests::manifest::{array_at, containers, def_matches, exec_actions, find, of_kind, str_at, Doc};
use clap::CommandFactory;
use serde_json::Value;

/// Where the Dockerfile puts pika-action, and where every action runs it from.
const ACTION_BIN: &str = "/bin/pika-action";

/// Variables pika-action reads that the chart leaves unset on purpose: test and port-forward hooks
/// (PIKA_ADDRESS_OVERRIDES must never be set in a cluster), template overrides, log format, and the API proxy URL
/// (in a pod the service account is used).
const LEFT_UNSET: &[&str] = &["PIKA_ADDRESS_OVERRIDES", "ACTION_TEMPLATES_DIR", "LOG_FORMAT", "KUBE_API_URL"];

/// The subcommand each lifecycle action runs.
const ACTION_SUBCOMMANDS: &[(&str, &str)] = &[
    ("roleProbe", "role-probe"),
    ("switchover", "switchover"),
    ("memberJoin", "member-join"),
    ("memberLeave", "member-leave"),
    ("postProvision", "post-provision"),
    ("preTerminate", "pre-terminate"),
    ("shardAdd", "shard-add"),
    ("shardRemove", "shard-remove"),
];

/// What KubeBlocks itself puts in an action's environment (kbagent's variables for the action, and on 1.0 the legacy
/// `KB_CLUSTER_COMPONENT_*` lists), per line.
fn provided_by_kubeblocks(action: &str, line: &str) -> &'static [&'static str] {
    const LEGACY: &[&str] =
        &["KB_CLUSTER_COMPONENT_LIST", "KB_CLUSTER_COMPONENT_DELETING_LIST", "KB_CLUSTER_COMPONENT_UNDELETED_LIST"];
    match (action, line) {
        ("memberJoin", _) => &["KB_JOIN_MEMBER_POD_NAME", "KB_JOIN_MEMBER_POD_FQDN"],
        ("memberLeave", _) => &["KB_LEAVE_MEMBER_POD_NAME", "KB_LEAVE_MEMBER_POD_FQDN"],
        ("switchover", _) => &[
            "KB_SWITCHOVER_CURRENT_NAME",
            "KB_SWITCHOVER_CURRENT_FQDN",
            "KB_SWITCHOVER_ROLE",
            "KB_SWITCHOVER_CANDIDATE_NAME",
            "KB_SWITCHOVER_CANDIDATE_FQDN",
        ],
        ("postProvision", "1.0") => LEGACY,
        ("preTerminate", "1.0") => &[
            "KB_CLUSTER_COMPONENT_LIST",
            "KB_CLUSTER_COMPONENT_DELETING_LIST",
            "KB_CLUSTER_COMPONENT_UNDELETED_LIST",
            "KB_CLUSTER_COMPONENT_IS_SCALING_IN",
        ],
        ("shardAdd", _) => &["KB_ADD_SHARD_NAME"],
        ("shardRemove", _) => &["KB_REMOVE_SHARD_NAME"],
        _ => &[],
    }
}

/// The subcommands of pika-action, from its own command line.
fn subcommands() -> BTreeSet<String> {
    pika_action::input::cli::Cli::command().get_subcommands().map(|c| c.get_name().to_owned()).collect()
}

/// The environment variables a subcommand reads, from its clap arguments.
fn reads(subcommand: &str) -> BTreeSet<String> {
    let cli = pika_action::input::cli::Cli::command();
    let sub = cli
        .get_subcommands()
        .find(|c| c.get_name() == subcommand)
        .unwrap_or_else(|| panic!("pika-action has no subcommand {subcommand}"));
    sub.get_arguments().filter_map(|a| a.get_env()).map(|e| e.to_string_lossy().into_owned()).collect()
}

fn var_names(cmpd: &Value) -> BTreeSet<String> {
    array_at(cmpd, "spec.vars").iter().map(|v| str_at(v, "name").to_owned()).collect()
}

fn var<'a>(cmpd: &'a Value, name: &str) -> &'a Value {
    array_at(cmpd, "spec.vars")
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("{} declares no var {name}", str_at(cmpd, "metadata.name")))
}

fn env_names(env: &[Value]) -> BTreeSet<String> {
    env.iter().map(|e| str_at(e, "name").to_owned()).collect()
}

fn container<'a>(cmpd: &'a Value, name: &str) -> &'a Value {
    containers(cmpd)
        .into_iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("{} has no container {name}", str_at(cmpd, "metadata.name")))
}

fn strings(v: &[Value]) -> Vec<&str> {
    v.iter().filter_map(Value::as_str).collect()
}

/// Every `compDef`-style reference in a rendering: (where, reference, exact-name-only).
fn compdef_references(docs: &[Doc]) -> Vec<(String, String, bool)> {
    let mut refs = Vec::new();
    for d in docs {
        let here = |what: &str| format!("{}/{} {what}", d.kind(), d.name());
        match d.kind() {
            "ClusterDefinition" => {
                for t in array_at(&d.object, "spec.topologies") {
                    for c in array_at(t, "components") {
                        refs.push((
                            here(&format!("component {}", str_at(c, "name"))),
                            str_at(c, "compDef").into(),
                            false,
                        ));
                    }
                }
            }
            "ShardingDefinition" => {
                refs.push((here("template"), str_at(&d.object, "spec.template.compDef").into(), false));
            }
            "ComponentVersion" => {
                for r in array_at(&d.object, "spec.compatibilityRules") {
                    for c in strings(array_at(r, "compDefs")) {
                        refs.push((here("compatibilityRules"), c.into(), false));
                    }
                }
            }
            "BackupPolicyTemplate" => {
                for c in strings(array_at(&d.object, "spec.compDefs")) {
                    refs.push((here("compDefs"), c.into(), false));
                }
            }
            "ParamConfigRenderer" => {
                refs.push((here("componentDef"), str_at(&d.object, "spec.componentDef").into(), true));
            }
            "ComponentDefinition" => {
                for v in array_at(&d.object, "spec.vars") {
                    if let Some(Value::Object(from)) = v.get("valueFrom") {
                        for r in from.values() {
                            if let Some(c) = r.get("compDef").and_then(Value::as_str) {
                                refs.push((here(&format!("var {}", str_at(v, "name"))), c.into(), false));
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }
    refs
}

#[test]
fn every_compdef_reference_matches_exactly_one_rendered_component_definition() {
    for line in LINES {
        let docs = addon(line);
        let cmpds: Vec<&str> = of_kind(docs, "ComponentDefinition").map(Doc::name).collect();
        let refs = compdef_references(docs);
        assert!(refs.len() >= 20, "line {line}: only {} references found", refs.len());
        for (place, reference, exact) in refs {
            let matched: Vec<&&str> =
                cmpds.iter().filter(|n| if exact { **n == reference } else { def_matches(&reference, n) }).collect();
            assert_eq!(matched.len(), 1, "line {line}: {place}: {reference:?} matches {matched:?} among {cmpds:?}");
        }
    }
}

#[test]
fn the_topology_the_sharding_definition_and_the_cluster_chart_agree() {
    for line in LINES {
        let docs = addon(line);
        let cd = of_kind(docs, "ClusterDefinition").next().expect("a ClusterDefinition");
        let topologies = array_at(&cd.object, "spec.topologies");
        assert_eq!(topologies.iter().filter(|t| t["default"] == true).count(), 1, "one default topology");
        let sharding_defs: Vec<&Doc> = of_kind(docs, "ShardingDefinition").collect();
        for t in topologies {
            let components: BTreeSet<&str> = array_at(t, "components").iter().map(|c| str_at(c, "name")).collect();
            let shardings: BTreeSet<&str> = array_at(t, "shardings").iter().map(|s| str_at(s, "name")).collect();
            for c in &components {
                assert!(c.len() <= 16, "component name {c} longer than 16");
            }
            for s in array_at(t, "shardings") {
                let name = str_at(s, "name");
                assert!(name.len() <= 15, "sharding name {name} longer than 15");
                let def = str_at(s, "shardingDef");
                let matched: Vec<&str> =
                    sharding_defs.iter().map(|d| d.name()).filter(|n| def_matches(def, n)).collect();
                assert_eq!(matched.len(), 1, "sharding {name}: {def} matches {matched:?}");
            }
            let named: BTreeSet<&str> = components.union(&shardings).copied().collect();
            for order in ["provision", "terminate", "update"] {
                let stages: Vec<&str> = strings(array_at(t, &format!("orders.{order}")));
                let mut listed = BTreeSet::new();
                for stage in stages {
                    for n in stage.split(',') {
                        assert!(named.contains(n), "order {order} names {n}, not in the topology {named:?}");
                        assert!(listed.insert(n), "order {order} names {n} twice");
                    }
                }
                assert_eq!(listed, named, "order {order} must name every component and sharding once");
            }
        }
        let topo = topologies.iter().find(|t| t["name"] == "pika-codis").expect("topology pika-codis");
        let provision: Vec<&str> = strings(array_at(topo, "orders.provision"));
        assert_eq!(provision, ["etcd", "codis-dashboard", "pika", "codis-proxy,codis-fe"], "provision order");

        // The cluster chart and the example Cluster use exactly the topology's names.
        let clusters: Vec<&Doc> = of_kind(cluster(), "Cluster").chain(of_kind(examples(), "Cluster")).collect();
        assert_eq!(clusters.len(), 2);
        for c in clusters {
            assert_eq!(str_at(&c.object, "spec.clusterDef"), cd.name(), "{}", c.source);
            let t = topologies
                .iter()
                .find(|t| t["name"] == *str_at(&c.object, "spec.topology"))
                .unwrap_or_else(|| panic!("{}: topology {} is not defined", c.source, c.object["spec"]["topology"]));
            let want: BTreeSet<&str> = array_at(t, "components").iter().map(|x| str_at(x, "name")).collect();
            let have: BTreeSet<&str> =
                array_at(&c.object, "spec.componentSpecs").iter().map(|x| str_at(x, "name")).collect();
            assert_eq!(have, want, "{}: componentSpecs", c.source);
            let want: BTreeSet<&str> = array_at(t, "shardings").iter().map(|x| str_at(x, "name")).collect();
            let have: BTreeSet<&str> =
                array_at(&c.object, "spec.shardings").iter().map(|x| str_at(x, "name")).collect();
            assert_eq!(have, want, "{}: shardings", c.source);
            for s in array_at(&c.object, "spec.shardings") {
                assert_eq!(
                    s["template"]["name"], s["name"],
                    "{}: the shard template is named after its sharding",
                    c.source
                );
            }
        }
        // OpsRequests name components and shardings of the topology.
        for ops in of_kind(examples(), "OpsRequest") {
            for list in ["horizontalScaling", "restart", "verticalScaling", "reconfigures"] {
                for item in array_at(&ops.object, &format!("spec.{list}")) {
                    let n = str_at(item, "componentName");
                    assert!(
                        topo["shardings"][0]["name"] == n
                            || array_at(topo, "components").iter().any(|c| c["name"] == n),
                        "{}: {n} is not a component or sharding of the topology",
                        ops.source
                    );
                }
            }
        }
    }
}

/// The arguments each action passes after its subcommand (decision: the 1.1 component postProvision registers only
/// its own shard).
fn action_arguments(def_kind: &str, action: &str, line: &str) -> &'static [&'static str] {
    match (def_kind, action, line) {
        ("ComponentDefinition", "postProvision", "1.1") => &["--own-shard"],
        _ => &[],
    }
}

#[test]
fn every_lifecycle_action_runs_a_real_pika_action_subcommand_in_one_image() {
    let subs = subcommands();
    for line in LINES {
        let docs = addon(line);
        let group = &cmpd(docs, "pika-group-").object;
        let sharding = &of_kind(docs, "ShardingDefinition").next().expect("ShardingDefinition").object;
        let budget: i64 = str_at(var(group, "ACTION_BUDGET_SECONDS"), "value").parse().expect("a number");
        let mut images = BTreeSet::new();
        let mut exec_containers = BTreeSet::new();
        let mut seen = BTreeSet::new();
        for def in [group, sharding] {
            let def_kind = str_at(def, "kind");
            for (name, action) in exec_actions(def) {
                let command = strings(array_at(action, "exec.command"));
                let (_, want) = ACTION_SUBCOMMANDS
                    .iter()
                    .find(|(a, _)| *a == name)
                    .unwrap_or_else(|| panic!("line {line}: unexpected action {name}"));
                let mut argv = vec![ACTION_BIN, *want];
                argv.extend(action_arguments(def_kind, &name, line));
                assert_eq!(
                    command,
                    argv,
                    "line {line}: {def_kind} {name} must run `pika-action {}`",
                    argv[1..].join(" ")
                );
                assert!(subs.contains(*want), "line {line}: pika-action has no subcommand {want}: {subs:?}");
                // The binary accepts exactly this command line.
                if let Err(e) = <pika_action::input::cli::Cli as clap::Parser>::try_parse_from(&command) {
                    panic!("line {line}: {def_kind} {name}: pika-action refuses {command:?}: {e}");
                }
                assert!(array_at(action, "exec.args").is_empty(), "{name}: no extra arguments");
                images.insert(str_at(action, "exec.image").to_owned());
                if let Some(c) = action["exec"].get("container") {
                    exec_containers.insert(c.to_string());
                }
                let timeout = action["timeoutSeconds"].as_i64().unwrap_or(0);
                if name == "roleProbe" {
                    let period = action["periodSeconds"].as_i64().unwrap_or(60);
                    assert!((1..=2).contains(&period), "roleProbe every {period}s: must be 1-2 s");
                    assert!((1..=period + 2).contains(&timeout), "roleProbe timeout {timeout}s");
                } else {
                    // KubeBlocks: 0 means 30 s and a blocking call is cut at 60 s; the budget ends the work first.
                    assert!((1..=60).contains(&timeout), "line {line}: {name} timeout {timeout}s not within 1-60 s");
                    assert!(
                        budget < timeout && budget >= timeout - 15,
                        "line {line}: budget {budget}s vs timeout {timeout}s of {name}"
                    );
                    assert!(action.get("retryPolicy").is_none(), "{name}: retryPolicy is ignored before main");
                }
                if name == "switchover" {
                    // Switchover gets one call: its whole budget, with room to confirm the transfer, fits in it.
                    assert!(budget + 5 <= timeout, "line {line}: switchover budget {budget}s in a {timeout}s call");
                }
                let pre = str_at(action, "preCondition");
                if ["memberJoin", "memberLeave", "switchover"].contains(&name.as_str()) {
                    assert_eq!(
                        pre, "",
                        "line {line}: {name} must have no preCondition (ComponentReady never passes then)"
                    );
                }
                assert_ne!(pre, "ClusterReady", "line {line}: {name}: ClusterReady cannot be met by sharding actions");
                assert!(seen.insert(format!("{def_kind}.{name}")), "line {line}: {def_kind} {name} defined twice");
            }
        }
        assert_eq!(images.len(), 1, "line {line}: one exec image per component, sharding actions included: {images:?}");
        assert!(exec_containers.len() <= 1, "line {line}: one exec container: {exec_containers:?}");
        let image = images.into_iter().next().expect("an image");
        assert_eq!(str_at(container(group, "install-pika-action"), "image"), image, "the binary copied for rejoin");
        let component = ["roleProbe", "switchover", "memberJoin", "memberLeave", "postProvision", "preTerminate"]
            .map(|a| format!("ComponentDefinition.{a}"));
        let expected: BTreeSet<String> = match line {
            "1.0" => component.into_iter().collect(),
            _ => component
                .into_iter()
                .chain(["postProvision", "shardAdd", "shardRemove"].map(|a| format!("ShardingDefinition.{a}")))
                .collect(),
        };
        assert_eq!(seen, expected, "line {line}: actions");
        let sharding_actions: BTreeSet<String> = exec_actions(sharding).into_iter().map(|(n, _)| n).collect();
        // The shard's own postProvision waits for its pods on both lines; so do the sharding actions on 1.1.
        assert_eq!(group["spec"]["lifecycleActions"]["postProvision"]["preCondition"], "RuntimeReady");
        if line == "1.0" {
            assert!(sharding_actions.is_empty(), "1.0.x runs no sharding action: {sharding_actions:?}");
        } else {
            for a in ["shardAdd", "postProvision"] {
                assert_eq!(sharding["spec"]["lifecycleActions"][a]["preCondition"], "RuntimeReady", "{a}");
            }
        }
        // Roles: lower-case master/slave, the master updated last.
        let roles: BTreeMap<&str, i64> = array_at(group, "spec.roles")
            .iter()
            .map(|r| (str_at(r, "name"), r["updatePriority"].as_i64().unwrap_or(0)))
            .collect();
        assert_eq!(roles.keys().copied().collect::<Vec<_>>(), ["master", "slave"]);
        assert!(roles["master"] > roles["slave"], "the master is updated last");
        assert_eq!(group["spec"]["updateStrategy"], "Serial");
    }
}

/// The variables each action can see: its parameters (vars + exec.env) or, for probes, the kbagent environment.
fn visible(group: &Value, action: &str, action_obj: &Value, line: &str) -> BTreeSet<String> {
    let mut names = var_names(group);
    if action == "roleProbe" {
        // Probes get no parameters: only the kbagent container's env, which is every var plus every exec.env.
        for (_, a) in exec_actions(group) {
            names.extend(env_names(array_at(a, "exec.env")));
        }
    } else {
        names.extend(env_names(array_at(action_obj, "exec.env")));
    }
    names.extend(provided_by_kubeblocks(action, line).iter().map(|s| (*s).to_owned()));
    names
}

#[test]
fn every_variable_a_subcommand_reads_is_declared_where_it_runs() {
    for line in LINES {
        let docs = addon(line);
        let group = &cmpd(docs, "pika-group-").object;
        let sharding = &of_kind(docs, "ShardingDefinition").next().expect("ShardingDefinition").object;
        // Sharding actions run in a shard's kbagent with that shard's vars.
        for (action, obj) in exec_actions(group).into_iter().chain(exec_actions(sharding)) {
            let sub = str_at(obj, "exec.command.1");
            let can_see = visible(group, &action, obj, line);
            for name in reads(sub) {
                if LEFT_UNSET.contains(&name.as_str()) {
                    continue;
                }
                if name.starts_with("KB_") && !can_see.contains(&name) {
                    // A KubeBlocks variable of another line (the legacy list on 1.1): absent there, and pika-action
                    // picks its event template by KUBEBLOCKS_LINE.
                    continue;
                }
                assert!(
                    can_see.contains(&name),
                    "line {line}: `pika-action {sub}` ({action}) reads {name}, which is not declared"
                );
            }
        }
        // rejoin and pre-stop run in the pika container: vars (all in the container env) plus its own env.
        let mut in_pika = var_names(group);
        in_pika.extend(env_names(array_at(container(group, "pika"), "env")));
        for sub in ["rejoin", "pre-stop"] {
            for name in reads(sub) {
                if !LEFT_UNSET.contains(&name.as_str()) {
                    assert!(
                        in_pika.contains(&name),
                        "line {line}: `pika-action {sub}` reads {name}, not in the pika container"
                    );
                }
            }
        }
        let pod_name =
            array_at(container(group, "pika"), "env").iter().find(|e| e["name"] == "POD_NAME").expect("POD_NAME");
        assert_eq!(str_at(pod_name, "valueFrom.fieldRef.fieldPath"), "metadata.name");
        assert_eq!(str_at(var(group, "KUBEBLOCKS_LINE"), "value"), line);
    }
}

#[test]
fn the_shard_definition_declares_exactly_the_contracts_variables() {
    for line in LINES {
        let group = &cmpd(addon(line), "pika-group-").object;
        let mut read = BTreeSet::new();
        for sub in [
            "post-provision",
            "shard-add",
            "shard-remove",
            "pre-terminate",
            "member-join",
            "member-leave",
            "switchover",
            "role-probe",
            "rejoin",
        ] {
            read.extend(reads(sub).into_iter().filter(|n| !n.starts_with("KB_") && !LEFT_UNSET.contains(&n.as_str())));
        }
        // PIKA_HOST is the role probe's exec.env, POD_NAME the pika container's: both container-specific.
        read.remove("PIKA_HOST");
        read.remove("POD_NAME");
        assert_eq!(var_names(group), read, "line {line}: the shard's vars are exactly what pika-action reads");

        // How each is resolved.
        assert!(var(group, "PIKA_PASSWORD")["valueFrom"]["credentialVarRef"]["password"] == "Required");
        assert_eq!(var(group, "SHARD_NAME")["valueFrom"]["componentVarRef"]["componentName"], "Required");
        assert_eq!(var(group, "SHARD_POD_FQDNS")["valueFrom"]["componentVarRef"]["podFQDNs"], "Required");
        for v in ["SHARD_NAME", "SHARD_POD_FQDNS"] {
            assert!(var(group, v)["valueFrom"]["componentVarRef"].get("compDef").is_none(), "{v} is this shard's own");
        }
        let all = &var(group, "ALL_SHARDS_POD_FQDNS")["valueFrom"]["componentVarRef"];
        assert_eq!(all["podFQDNs"], "Required");
        assert!(def_matches(
            all["compDef"].as_str().unwrap_or_default(),
            group["metadata"]["name"].as_str().unwrap_or_default()
        ));
        let option = &all["multipleClusterObjectOption"];
        assert_eq!(option["strategy"], "combined");
        assert_eq!(option["combinedOption"]["flattenFormat"]["delimiter"], ";", "shards separated by ;");
        assert_eq!(option["combinedOption"]["flattenFormat"]["keyValueDelimiter"], ":", "<shard>:<fqdns>");
        assert!(option["combinedOption"].get("newVarSuffix").is_none(), "the combined value is the variable itself");
        let role_probe_env = env_names(array_at(&group["spec"]["lifecycleActions"]["roleProbe"], "exec.env"));
        assert!(role_probe_env.contains("PIKA_HOST"), "role-probe is told where pika is");
    }
}

#[test]
fn pika_address_overrides_is_never_set() {
    for line in LINES {
        for d in addon(line) {
            assert!(
                !d.object.to_string().contains("PIKA_ADDRESS_OVERRIDES"),
                "{} sets PIKA_ADDRESS_OVERRIDES",
                d.source
            );
        }
    }
}

/// `$(NAME)` references in a container's command, args and env values.
fn dollar_refs(c: &Value) -> BTreeSet<String> {
    let re = regex::Regex::new(r"\$\(([A-Z0-9_]+)\)").expect("regex");
    let mut texts: Vec<&str> = strings(array_at(c, "command"));
    texts.extend(strings(array_at(c, "args")));
    texts.extend(array_at(c, "env").iter().filter_map(|e| e["value"].as_str()));
    texts.iter().flat_map(|t| re.captures_iter(t).map(|m| m[1].to_owned()).collect::<Vec<_>>()).collect()
}

#[test]
fn no_definition_declares_a_variable_nothing_uses() {
    let docs = addon("1.0");
    let scripts = of_kind(docs, "ConfigMap").find(|d| d.name().starts_with("pika-scripts-")).expect("scripts");
    let script_text: String =
        scripts.object["data"].as_object().expect("data").values().filter_map(Value::as_str).collect();
    let mut binary_reads = BTreeSet::new();
    for sub in subcommands() {
        if sub != "render" {
            binary_reads.extend(reads(&sub));
        }
    }
    for d in of_kind(docs, "ComponentDefinition") {
        let mut used: BTreeSet<String> = BTreeSet::new();
        for c in containers(&d.object) {
            used.extend(dollar_refs(c));
        }
        let runs_pika_action = exec_actions(&d.object).iter().any(|(_, a)| str_at(a, "exec.command.0") == ACTION_BIN);
        for name in var_names(&d.object) {
            let in_scripts = script_text.contains(&format!("${name}")) || script_text.contains(&format!("${{{name}"));
            let in_expressions = array_at(&d.object, "spec.vars")
                .iter()
                .any(|v| v["name"] != name.as_str() && str_at(v, "expression").contains(&format!(".{name}")));
            let by_binary = runs_pika_action && binary_reads.contains(&name);
            assert!(
                used.contains(&name) || in_scripts || in_expressions || by_binary,
                "{} declares {name}, which nothing reads",
                d.name()
            );
        }
        for name in &used {
            let env: BTreeSet<String> =
                containers(&d.object).iter().flat_map(|c| env_names(array_at(c, "env"))).collect();
            assert!(
                var_names(&d.object).contains(name) || env.contains(name),
                "{} uses $({name}), never declared",
                d.name()
            );
        }
    }
}

#[test]
fn the_exporter_scrape_port_is_a_port_of_the_exporter_container() {
    for line in LINES {
        let group = &cmpd(addon(line), "pika-group-").object;
        let exporter = &group["spec"]["exporter"];
        let c = container(group, str_at(exporter, "containerName"));
        let port = str_at(exporter, "scrapePort");
        let p = array_at(c, "ports")
            .iter()
            .find(|p| p["name"] == port || p["containerPort"].as_i64().is_some_and(|n| n.to_string() == port))
            .unwrap_or_else(|| panic!("scrapePort {port} is not a port of {}", c["name"]));
        let number = p["containerPort"].as_i64().expect("containerPort");
        let args = strings(array_at(c, "args"));
        assert!(
            args.contains(&format!("-web.listen-address=:{number}").as_str()),
            "the exporter listens on {number}: {args:?}"
        );
        assert!(args.contains(&format!("-web.telemetry-path={}", str_at(exporter, "scrapePath")).as_str()));
        let pika_port = str_at(var(group, "PIKA_PORT"), "value");
        assert!(args.contains(&format!("-pika.addr=127.0.0.1:{pika_port}").as_str()), "scrapes the local pika");
    }
}

#[test]
fn every_config_and_script_a_definition_names_is_rendered_and_mounted() {
    for line in LINES {
        let docs = addon(line);
        for d in of_kind(docs, "ComponentDefinition") {
            let mounts: BTreeSet<&str> = containers(&d.object)
                .iter()
                .flat_map(|c| array_at(c, "volumeMounts"))
                .map(|m| str_at(m, "name"))
                .collect();
            let runtime_volumes: BTreeSet<&str> =
                array_at(&d.object, "spec.runtime.volumes").iter().map(|v| str_at(v, "name")).collect();
            let mut files_at: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            for kind in ["configs", "scripts"] {
                for t in array_at(&d.object, &format!("spec.{kind}")) {
                    let cm = find(docs, "ConfigMap", str_at(t, "template"));
                    assert_eq!(
                        cm.namespace(),
                        Some(str_at(t, "namespace")),
                        "{}: {kind} {} namespace",
                        d.name(),
                        t["name"]
                    );
                    let volume = str_at(t, "volumeName");
                    assert!(mounts.contains(volume), "{}: {kind} volume {volume} is mounted by no container", d.name());
                    assert!(!runtime_volumes.contains(volume), "{}: {volume} is also a runtime volume", d.name());
                    let keys: BTreeSet<String> = cm.object["data"].as_object().expect("data").keys().cloned().collect();
                    for c in containers(&d.object) {
                        for m in array_at(c, "volumeMounts").iter().filter(|m| m["name"] == volume) {
                            files_at.entry(str_at(m, "mountPath").to_owned()).or_default().extend(keys.iter().cloned());
                        }
                    }
                    // KubeBlocks renders config and script templates as Go templates: none may contain a stray {{.
                    for (k, v) in cm.object["data"].as_object().expect("data") {
                        assert!(!v.as_str().unwrap_or_default().contains("{{"), "{}: {k} contains {{{{", cm.name());
                    }
                }
            }
            // Every file a command, a hook or an action names under a template mount exists in that template.
            let mut paths: Vec<String> = Vec::new();
            for c in containers(&d.object) {
                paths.extend(strings(array_at(c, "command")).iter().map(|s| (*s).to_owned()));
                paths.extend(strings(array_at(c, "args")).iter().map(|s| (*s).to_owned()));
                paths.extend(strings(array_at(c, "lifecycle.preStop.exec.command")).iter().map(|s| (*s).to_owned()));
            }
            for (_, a) in exec_actions(&d.object) {
                paths.extend(strings(array_at(a, "exec.command")).iter().map(|s| (*s).to_owned()));
            }
            let mut checked = 0;
            for p in paths {
                let p = p.split_once('=').map_or(p.as_str(), |(_, v)| v).to_owned();
                for (mount, files) in &files_at {
                    if let Some(file) = p.strip_prefix(&format!("{mount}/")) {
                        assert!(files.contains(file), "{}: {p} is not in the template mounted at {mount}", d.name());
                        checked += 1;
                    }
                }
            }
            if !files_at.is_empty() && d.name().starts_with("pika-group") {
                assert!(checked >= 2, "{}: pika-start.sh and the exporter's info file are checked", d.name());
            }
        }
    }
}

#[test]
fn the_parameter_and_backup_definitions_point_at_what_the_shards_have() {
    for line in LINES {
        let docs = addon(line);
        // Parameters: the PCR's definitions and files exist, the PD's file is the template's.
        let pcr = of_kind(docs, "ParamConfigRenderer").next().expect("PCR");
        let group = find(docs, "ComponentDefinition", str_at(&pcr.object, "spec.componentDef"));
        for pd_name in strings(array_at(&pcr.object, "spec.parametersDefs")) {
            let pd = find(docs, "ParametersDefinition", pd_name);
            for cfg in array_at(&pcr.object, "spec.configs") {
                let tpl = array_at(&group.object, "spec.configs")
                    .iter()
                    .find(|c| c["name"] == cfg["templateName"])
                    .unwrap_or_else(|| {
                        panic!("PCR config template {} is not a config of {}", cfg["templateName"], group.name())
                    });
                let cm = find(docs, "ConfigMap", str_at(tpl, "template"));
                assert!(
                    cm.object["data"].get(str_at(cfg, "name")).is_some(),
                    "PCR file {} not in {}",
                    cfg["name"],
                    cm.name()
                );
                assert_eq!(str_at(&pd.object, "spec.fileName"), str_at(cfg, "name"));
            }
        }

        // Backup: the ActionSet exists, the target role, container, port and volume are the shard's.
        let bpt = of_kind(docs, "BackupPolicyTemplate").next().expect("BPT");
        let roles: BTreeSet<&str> = array_at(&group.object, "spec.roles").iter().map(|r| str_at(r, "name")).collect();
        assert!(roles.contains(str_at(&bpt.object, "spec.target.role")));
        assert!(roles.contains(str_at(&bpt.object, "spec.target.fallbackRole")));
        let target = container(&group.object, str_at(&bpt.object, "spec.target.containerPort.containerName"));
        assert!(array_at(target, "ports")
            .iter()
            .any(|p| p["name"] == bpt.object["spec"]["target"]["containerPort"]["portName"]));
        let volumes: BTreeSet<&str> =
            array_at(&group.object, "spec.volumes").iter().map(|v| str_at(v, "name")).collect();
        for m in array_at(&bpt.object, "spec.backupMethods") {
            if let Some(set) = m.get("actionSetName").and_then(Value::as_str) {
                let _ = find(docs, "ActionSet", set);
            }
            for vm in array_at(m, "targetVolumes.volumeMounts") {
                assert!(volumes.contains(str_at(vm, "name")), "backup mounts {}", vm["name"]);
            }
        }
        for s in array_at(&bpt.object, "spec.schedules") {
            assert!(array_at(&bpt.object, "spec.backupMethods").iter().any(|m| m["name"] == s["backupMethod"]));
        }
    }
}

#[test]
fn component_versions_cover_every_container_and_name_the_definitions_action_image() {
    for line in LINES {
        let docs = addon(line);
        for cmpv in of_kind(docs, "ComponentVersion") {
            let releases = array_at(&cmpv.object, "spec.releases");
            for rule in array_at(&cmpv.object, "spec.compatibilityRules") {
                let listed: BTreeSet<&str> = strings(array_at(rule, "releases")).into_iter().collect();
                for r in &listed {
                    assert!(releases.iter().any(|x| x["name"] == *r), "{}: release {r} is not defined", cmpv.name());
                }
                for pattern in strings(array_at(rule, "compDefs")) {
                    for def in of_kind(docs, "ComponentDefinition").filter(|d| def_matches(pattern, d.name())) {
                        let sv = str_at(&def.object, "spec.serviceVersion");
                        let default =
                            releases.iter().find(|x| x["serviceVersion"] == sv && listed.contains(str_at(x, "name")));
                        let default = default.unwrap_or_else(|| {
                            panic!("{}: no release for {} serviceVersion {sv}", cmpv.name(), def.name())
                        });
                        for r in releases.iter().filter(|x| listed.contains(str_at(x, "name"))) {
                            for c in containers(&def.object) {
                                let name = str_at(c, "name");
                                assert!(
                                    r["images"].get(name).is_some(),
                                    "{} release {}: no image for container {name} of {}",
                                    cmpv.name(),
                                    r["name"],
                                    def.name()
                                );
                            }
                            for (action, a) in exec_actions(&def.object) {
                                if let Some(img) = r["images"].get(&action) {
                                    assert_eq!(
                                        img,
                                        &a["exec"]["image"],
                                        "{}: {action} image differs from the definition's",
                                        cmpv.name()
                                    );
                                }
                            }
                            for key in r["images"].as_object().expect("images").keys() {
                                let known = containers(&def.object).iter().any(|c| c["name"] == key.as_str())
                                    || exec_actions(&def.object).iter().any(|(a, _)| a == key);
                                assert!(
                                    known,
                                    "{}: image {key} names no container or action of {}",
                                    cmpv.name(),
                                    def.name()
                                );
                            }
                        }
                        // The definition's own images are the default release's.
                        for c in containers(&def.object) {
                            assert_eq!(
                                &c["image"],
                                &default["images"][str_at(c, "name")],
                                "{}: {} image",
                                def.name(),
                                c["name"]
                            );
                        }
                    }
                }
            }
        }
        let group = &cmpd(docs, "pika-group-").object;
        let cmpv = find(docs, "ComponentVersion", "pika-group");
        for (action, _) in exec_actions(group) {
            assert!(
                cmpv.object["spec"]["releases"][0]["images"].get(&action).is_some(),
                "line {line}: cmpv names the {action} image"
            );
        }
    }
}

fn redis_format(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (k, v) = l.split_once(char::is_whitespace).unwrap_or((l, ""));
            (k.to_owned(), v.trim().to_owned())
        })
        .collect()
}

fn toml_value(text: &str, key: &str) -> String {
    text.lines()
        .find_map(|l| {
            l.split_once('=').filter(|(k, _)| k.trim() == key).map(|(_, v)| v.trim().trim_matches('"').to_owned())
        })
        .unwrap_or_else(|| panic!("{key} not set"))
}

#[test]
fn pika_is_configured_for_codis_slot_migration_and_persists_its_config_on_the_data_volume() {
    let docs = addon("1.0");
    let group = &cmpd(docs, "pika-group-").object;
    let cfg = find(docs, "ConfigMap", "pika-group-config-0.1.0");
    let conf = redis_format(cfg.object["data"]["pika.conf"].as_str().expect("pika.conf"));
    assert_eq!(conf["slotmigrate"], "yes", "Codis slot moves need slotmigrate yes from the start");
    assert_eq!(conf["daemonize"], "no");
    assert_eq!(conf["port"], str_at(var(group, "PIKA_PORT"), "value"));
    assert!(!conf.contains_key("slaveof") && !conf.contains_key("replication-id"), "pika owns those");
    let codis = find(docs, "ConfigMap", "pika-codis-config-0.1.0");
    for file in ["dashboard.toml", "proxy.toml"] {
        let text = codis.object["data"][file].as_str().expect(file);
        assert_eq!(toml_value(text, "max_slot_num"), conf["default-slot-num"], "{file}: slots = pika default-slot-num");
    }
    // Every data path is on the data volume, where the persisted pika.conf lives too.
    let data =
        array_at(container(group, "pika"), "volumeMounts").iter().find(|m| m["name"] == "data").expect("data mount");
    let mount = str_at(data, "mountPath");
    for key in ["db-path", "log-path", "dump-path", "db-sync-path", "pidfile"] {
        assert!(conf[key].starts_with(&format!("{mount}/")), "{key} {} is not under {mount}", conf[key]);
    }
    assert!(str_at(var(group, "PIKA_CONFIG_FILE"), "value").starts_with(&format!("{mount}/")));
    // rejoin tells an empty volume by pika's own data directory.
    assert_eq!(str_at(var(group, "PIKA_DATA_DIR"), "value"), conf["db-path"].trim_end_matches('/'));
    // Parameters: every changeable one is in the CUE schema, slotmigrate and the layout are immutable.
    let pd = of_kind(docs, "ParametersDefinition").next().expect("PD");
    let cue = str_at(&pd.object, "spec.parametersSchema.cue");
    for p in strings(array_at(&pd.object, "spec.staticParameters")) {
        assert!(
            cue.contains(&format!("\"{p}\"?:")) || cue.contains(&format!("\t{p}?:")),
            "{p} is not in the CUE schema"
        );
        assert!(
            conf.contains_key(p)
                || ["compact-cron", "compact-interval", "slotmigrate-thread-num", "thread-migrate-keys-num"]
                    .contains(&p),
            "{p} not in pika.conf"
        );
    }
    let immutable = strings(array_at(&pd.object, "spec.immutableParameters"));
    for p in ["slotmigrate", "port", "default-slot-num", "databases", "db-path"] {
        assert!(immutable.contains(&p), "{p} must be immutable");
    }
    // No component logs at DEBUG by default.
    for line in LINES {
        for d in addon(line) {
            let text = d.object.to_string();
            assert!(!text.contains("log-level=DEBUG") && !text.contains("\"DEBUG\""), "{} logs at DEBUG", d.source);
        }
    }
}

#[test]
fn etcd_serves_the_v2_api_and_its_membership_follows_the_pods() {
    let docs = addon("1.0");
    let etcd = &cmpd(docs, "pika-etcd-").object;
    let scripts = of_kind(docs, "ConfigMap").find(|d| d.name().starts_with("pika-scripts-")).expect("scripts");
    let start = scripts.object["data"]["etcd-start.sh"].as_str().expect("etcd-start.sh");
    assert!(start.contains("--enable-v2=true"), "Codis 3.2 needs the v2 API");
    assert!(
        start.contains("--initial-cluster-state=\"$state\"") && start.contains("state=existing"),
        "joins use existing"
    );
    let tag = str_at(etcd, "spec.serviceVersion");
    assert!(tag.starts_with("3.5."), "etcd 3.5 (3.6 has no v2 API): {tag}");
    assert_eq!(str_at(etcd, "spec.lifecycleActions.memberLeave.exec.command.1"), "/scripts/etcd-member-leave.sh");
    let text = etcd.to_string();
    assert!(
        !text.contains("initial-cluster=") && !text.contains("ETCD_INITIAL_CLUSTER"),
        "no member list in the definition"
    );
    let peers = var(etcd, "PEER_FQDNS");
    assert_eq!(peers["valueFrom"]["componentVarRef"]["podFQDNs"], "Required", "members come from the pods");
}

#[test]
fn codis_proxies_register_a_stable_address_and_leave_the_dashboard_when_they_stop() {
    for line in LINES {
        let docs = addon(line);
        let proxy = &cmpd(docs, "pika-codis-proxy-").object;
        let c = container(proxy, "codis-proxy");
        let args = strings(array_at(c, "args"));
        assert!(args.contains(&"--dashboard=$(CODIS_DASHBOARD_ADDR)"), "it comes online by itself: {args:?}");
        assert!(args.contains(&"--host-admin=$(PROXY_ADMIN_ADDR)"));
        let env: BTreeMap<&str, &Value> = array_at(c, "env").iter().map(|e| (str_at(e, "name"), e)).collect();
        assert!(str_at(env["PROXY_FQDN"], "value").contains("$(POD_NAME).$(PROXY_COMPONENT_NAME)-headless."));
        for d in docs {
            assert!(!d.object.to_string().contains("status.podIP"), "{}: nothing registers a pod IP", d.source);
        }
        assert_eq!(strings(array_at(c, "lifecycle.preStop.exec.command")), ["/bin/sh", "/scripts/codis-proxy-stop.sh"]);
        let fe = container(&cmpd(docs, "pika-codis-fe-").object, "codis-fe");
        assert!(
            strings(array_at(fe, "args")).contains(&"--etcd=$(ETCD_ENDPOINTS)"),
            "codis-fe finds the dashboard in etcd"
        );
        let dashboard = container(&cmpd(docs, "pika-codis-dashboard-").object, "codis-dashboard");
        let args = strings(array_at(dashboard, "args"));
        assert!(args.contains(&"--product_name=$(CLUSTER_NAME)"), "product name from the cluster");
        assert!(args.contains(&"--etcd=$(ETCD_ENDPOINTS)"), "etcd coordinator");
    }
}

#[test]
fn a_pika_master_hands_over_before_the_kubelet_stops_it_within_the_grace_period() {
    for line in LINES {
        let docs = addon(line);
        let group = &cmpd(docs, "pika-group-").object;
        let pika = container(group, "pika");
        let hook = strings(array_at(pika, "lifecycle.preStop.exec.command"));
        assert_eq!(hook, ["/tools/pika-action", "pre-stop"], "line {line}");
        assert!(subcommands().contains("pre-stop"));
        // The binary the hook runs is the one the init container copies beside pika.
        let init = array_at(group, "spec.runtime.initContainers");
        assert!(init.iter().any(|c| strings(array_at(c, "command")).contains(&"/tools/pika-action")), "line {line}");
        let budget: u64 = array_at(pika, "env")
            .iter()
            .find(|e| e["name"] == "PRE_STOP_BUDGET_SECONDS")
            .map(|e| str_at(e, "value").parse().expect("a number"))
            .expect("PRE_STOP_BUDGET_SECONDS in the pika container");
        let grace = group.pointer("/spec/runtime/terminationGracePeriodSeconds").and_then(Value::as_u64);
        // pika stops in 4 to 15 s after SIGTERM (measured in the real bed): the grace leaves it that after the hook.
        assert!(grace.is_some_and(|g| g >= budget + 15), "line {line}: grace {grace:?} for a hook of {budget} s");
    }
}

#[test]
fn clusters_are_named_after_their_release_and_coexist_in_and_across_namespaces() {
    let render = |name: &str, ns: &str| {
        helm().render(&cluster_dir(), &Options::release(name, ns)).unwrap_or_else(|e| panic!("{e}"))
    };
    let mut seen = BTreeSet::new();
    for (name, ns) in [("alpha", "team-a"), ("beta", "team-a"), ("alpha", "team-b")] {
        for d in render(name, ns) {
            assert_eq!(d.namespace(), Some(ns), "{}: every object is in the release namespace", d.source);
            assert!(d.name().starts_with(name), "{}: {} is not named after the release", d.source, d.name());
            assert!(
                seen.insert((d.kind().to_owned(), ns.to_owned(), d.name().to_owned())),
                "{}/{} collides",
                ns,
                d.name()
            );
        }
    }
    let long = helm().render(&cluster_dir(), &Options::release("a-very-long-cluster-name", "x"));
    assert!(long.is_err_and(|e| e.contains("longer than 16")), "long names are refused at render time");
    let upper = helm().render(&cluster_dir(), &Options::release("Pika", "x"));
    assert!(upper.is_err(), "upper-case names are refused");
    // The addon's namespaced objects are in the release namespace; its definitions are cluster-scoped.
    for d in addon("1.0") {
        let namespaced = d.kind() == "ConfigMap";
        assert_eq!(d.namespace().is_some(), namespaced, "{}/{}", d.kind(), d.name());
    }
}

#[test]
fn the_dockerfile_builds_pika_action_where_the_chart_runs_it() {
    let text = std::fs::read_to_string(addon_dir().join("Dockerfile")).expect("addon/Dockerfile");
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
    let stages: Vec<(usize, &str)> =
        lines.iter().enumerate().filter(|(_, l)| l.starts_with("FROM ")).map(|(i, l)| (i, *l)).collect();
    assert!(stages.len() >= 2, "a multi-stage build");
    let (last_at, last) = *stages.last().expect("a final stage");
    assert!(last == "FROM scratch" || last.contains("distroless"), "minimal final stage: {last}");
    let builder = stages.iter().find(|(_, l)| l.contains(" AS builder")).expect("a builder stage").1;
    assert!(builder.contains("rust") && builder.contains("alpine"), "musl (static) Rust builder: {builder}");
    assert!(
        lines.iter().any(|l| l.contains("cargo build --release --locked -p pika-action")),
        "builds the pika-action package"
    );
    let final_stage = &lines[last_at..];
    assert!(
        final_stage.contains(&format!("COPY --from=builder /pika-action {ACTION_BIN}").as_str()),
        "binary at {ACTION_BIN}"
    );
    assert!(
        final_stage.iter().any(|l| l.starts_with("COPY --from=busybox /bin/busybox /bin/cp")),
        "a static cp for the init container"
    );
    assert!(final_stage.iter().any(|l| l.contains(&format!("ENTRYPOINT [\"{ACTION_BIN}\"]"))));
    let group = &cmpd(addon("1.0"), "pika-group-").object;
    let install = container(group, "install-pika-action");
    assert_eq!(strings(array_at(install, "command")), ["/bin/cp", ACTION_BIN, "/tools/pika-action"]);
    let env: BTreeMap<&str, &str> =
        array_at(container(group, "pika"), "env").iter().map(|e| (str_at(e, "name"), str_at(e, "value"))).collect();
    assert_eq!(env["PIKA_ACTION"], "/tools/pika-action", "pika-start.sh runs the copied binary");
}

#[test]
fn the_grafana_dashboard_queries_only_metrics_pika_exporter_exports() {
    // What pika_exporter (`tools/pika_exporter`) exports, each prefixed `pika_` by its default namespace `pika`.
    const METRICS: &[&str] = &[
        "up",
        "build_info",
        "server_info",
        "uptime_in_seconds",
        "thread_num",
        "sync_thread_num",
        "connected_clients",
        "db_size",
        "log_size",
        "used_memory",
        "db_memtable_usage",
        "db_tablereader_usage",
        "db_fatal",
        "total_connections_received",
        "instantaneous_ops_per_sec",
        "total_commands_processed",
        "total_net_input_bytes",
        "total_net_output_bytes",
        "total_net_repl_input_bytes",
        "total_net_repl_output_bytes",
        "instantaneous_input_kbps",
        "instantaneous_output_kbps",
        "is_bgsaving",
        "is_scaning_keyspace",
        "compact",
        "slow_logs_count",
        "keys",
        "expire_keys",
        "invalid_keys",
        "connected_slaves",
        "slave_state",
        "slave_lag",
        "master_link_status",
        "repl_state",
        "slave_read_only",
        "slave_priority",
        "used_cpu_sys",
        "used_cpu_user",
        "used_cpu_sys_children",
        "used_cpu_user_children",
    ];
    let file = std::fs::read_to_string(addon_dir().join("dashboards/pika.json")).expect("dashboards/pika.json");
    let dash: Value = serde_json::from_str(&file).expect("the dashboard is valid JSON");
    let re = regex::Regex::new(r"\bpika_[a-z_]+").expect("regex");
    let mut queried = BTreeSet::new();
    for panel in array_at(&dash, "panels") {
        for t in array_at(panel, "targets") {
            for m in re.find_iter(str_at(t, "expr")) {
                queried.insert(m.as_str().trim_start_matches("pika_").to_owned());
            }
        }
    }
    for t in array_at(&dash, "templating.list") {
        for m in re.find_iter(str_at(t, "query")) {
            queried.insert(m.as_str().trim_start_matches("pika_").to_owned());
        }
    }
    assert!(queried.len() >= 15, "the dashboard covers the exporter: {queried:?}");
    for m in &queried {
        assert!(METRICS.contains(&m.as_str()), "pika_{m} is not a pika_exporter metric");
    }
    let cm = find(addon("1.0"), "ConfigMap", "pika-grafana-dashboard");
    assert_eq!(cm.object["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(
        cm.object["data"]["pika.json"].as_str().map(str::trim),
        Some(file.trim()),
        "the ConfigMap ships the file"
    );
}

#[test]
fn every_helper_is_named_after_its_chart_and_documented() {
    let define = regex::Regex::new(r#"\{\{-? define "([^"]+)" -?\}\}"#).expect("regex");
    for (chart, dir) in [("pika", addon_dir()), ("pika-cluster", cluster_dir())] {
        let text = std::fs::read_to_string(dir.join("templates/_helpers.tpl")).expect("_helpers.tpl");
        let mut count = 0;
        for m in define.captures_iter(&text) {
            let name = &m[1];
            assert!(name.starts_with(&format!("{chart}.")), "{chart}: helper {name} is not named {chart}.<thing>");
            let before = text[..m.get(0).expect("match").start()].trim_end();
            assert!(before.ends_with("*/}}"), "{chart}: helper {name} has no doc comment");
            let comment = before[before.rfind("{{/*").expect("comment start") + 4..].trim_start();
            assert!(
                comment.starts_with(&format!("{name}: ")),
                "{chart}: the comment above {name} does not open with `{name}: `"
            );
            count += 1;
        }
        assert!(count >= 3, "{chart}: helpers found: {count}");
    }
}

#[test]
fn the_addon_object_installs_this_chart_version() {
    let chart = helm().yaml_files(&[addon_dir().join("Chart.yaml")]).expect("Chart.yaml");
    let chart = &chart[0].object;
    let cr = &addon_cr().object;
    let version = str_at(chart, "version");
    assert_eq!(str_at(cr, "metadata.name"), str_at(chart, "name"));
    assert_eq!(str_at(cr, "spec.version"), version);
    assert_eq!(cr["metadata"]["labels"]["addon.kubeblocks.io/version"], version);
    assert_eq!(cr["metadata"]["labels"]["addon.kubeblocks.io/name"], str_at(chart, "name"));
    assert_eq!(
        cr["metadata"]["annotations"]["addon.kubeblocks.io/kubeblocks-version"],
        chart["annotations"]["addon.kubeblocks.io/kubeblocks-version"]
    );
    let url = str_at(cr, "spec.helm.chartLocationURL");
    assert!(url.ends_with(&format!("/{}-{version}.tgz", str_at(chart, "name"))), "chart URL {url}");
    for set in strings(array_at(cr, "spec.helm.installValues.setValues")) {
        let ok = helm().render(&addon_dir(), &Options::default().set(set));
        assert!(ok.is_ok(), "installValues {set}: {ok:?}");
    }
}

#[test]
fn the_action_set_runs_the_tested_backup_and_restore_scripts() {
    let set = of_kind(addon("1.0"), "ActionSet").next().expect("ActionSet");
    for (path, file) in
        [("spec.backup.backupData.command", "pika-backup.sh"), ("spec.restore.prepareData.command", "pika-restore.sh")]
    {
        let command = strings(array_at(&set.object, path));
        assert_eq!(&command[..2], ["bash", "-c"], "{path}");
        let shipped = std::fs::read_to_string(addon_dir().join("dataprotection").join(file)).expect(file);
        assert_eq!(command[2].trim(), shipped.trim(), "{path} runs dataprotection/{file} verbatim");
    }
}

#[test]
fn the_addon_readme_documents_every_operation_with_existing_files() {
    let readme = std::fs::read_to_string(addon_dir().join("README.md")).expect("addon/README.md");
    for needle in [
        "kbcli addon install",
        "helm install",
        "kbcli cluster create",
        "HorizontalScaling",
        "shards",
        "Switchover",
        "Restart",
        "vertical scal",
        "Backup",
        "Restore",
        "grafana",
        "kubeblocksLine",
    ] {
        assert!(readme.to_lowercase().contains(&needle.to_lowercase()), "README.md does not mention {needle}");
    }
    let re = regex::Regex::new(r"clusterdefs/examples/[a-z0-9-]+\.yaml").expect("regex");
    let mut mentioned = 0;
    for m in re.find_iter(&readme) {
        assert!(
            chart_tests::repo_root().join(m.as_str()).is_file(),
            "README names {} which does not exist",
            m.as_str()
        );
        mentioned += 1;
    }
    let examples_count = std::fs::read_dir(cluster_dir().join("examples")).expect("examples").count();
    assert!(mentioned >= examples_count, "README mentions {mentioned} example files of {examples_count}");
}

#[test]
fn every_kubeblocks_definition_names_the_api_version_it_was_written_for() {
    // KubeBlocks reconciles a ClusterDefinition, ComponentDefinition, ComponentVersion or ShardingDefinition only
    // when its annotation kubeblocks.io/crd-api-version is set (to the API it was written for).
    const RECONCILED: &[&str] = &["ClusterDefinition", "ComponentDefinition", "ComponentVersion", "ShardingDefinition"];
    for line in LINES {
        let mut checked = 0;
        for d in addon(line).iter().filter(|d| RECONCILED.contains(&d.kind())) {
            assert_eq!(
                d.object["metadata"]["annotations"]["kubeblocks.io/crd-api-version"].as_str(),
                Some(d.api_version()),
                "line {line}: {}/{} ({})",
                d.kind(),
                d.name(),
                d.source
            );
            checked += 1;
        }
        assert_eq!(
            checked, 12,
            "line {line}: 1 ClusterDefinition, 5 ComponentDefinitions, 5 ComponentVersions, 1 ShardingDefinition"
        );
    }
}

#[test]
fn no_var_on_the_1_0_line_requires_all_component_objects() {
    // On 1.0.x requireAllComponentObjects wants exactly as many components as the Cluster's spec: a scale-in (the
    // leaving shard still exists) or a deletion never resolves the var, and the shard's preTerminate never runs.
    for line in LINES {
        for d in of_kind(addon(line), "ComponentDefinition") {
            for v in array_at(&d.object, "spec.vars") {
                let Some(Value::Object(from)) = v.get("valueFrom") else { continue };
                for r in from.values() {
                    let require = &r["multipleClusterObjectOption"]["requireAllComponentObjects"];
                    if line == "1.0" {
                        assert!(
                            require.is_null() || require == false,
                            "line 1.0: {} var {} requires all component objects",
                            d.name(),
                            v["name"]
                        );
                    }
                }
            }
        }
        let group = &cmpd(addon(line), "pika-group-").object;
        let all = &var(group, "ALL_SHARDS_POD_FQDNS")["valueFrom"]["componentVarRef"]["multipleClusterObjectOption"];
        match line {
            "1.0" => assert!(all.get("requireAllComponentObjects").is_none(), "line 1.0: {all}"),
            _ => assert_eq!(all["requireAllComponentObjects"], true, "line {line}: every shard is awaited"),
        }
    }
}

#[test]
fn the_pika_pods_may_read_what_pika_action_asks_kubernetes_and_nothing_more() {
    for line in LINES {
        let group = &cmpd(addon(line), "pika-group-").object;
        let mut rules: BTreeSet<(String, String, String)> = BTreeSet::new();
        for r in array_at(group, "spec.policyRules") {
            for g in strings(array_at(r, "apiGroups")) {
                for res in strings(array_at(r, "resources")) {
                    for verb in strings(array_at(r, "verbs")) {
                        rules.insert((g.to_owned(), res.to_owned(), verb.to_owned()));
                    }
                }
            }
        }
        let want: BTreeSet<(String, String, String)> = [
            // pre-terminate: is the Cluster being deleted (deletionTimestamp, or gone)?
            ("apps.kubeblocks.io", "clusters", "get"),
            // switchover and member-leave: rollout facts of the shard's pods.
            ("", "pods", "get"),
            ("", "pods", "list"),
            ("workloads.kubeblocks.io", "instancesets", "get"),
            // Events for operators.
            ("", "events", "create"),
        ]
        .into_iter()
        .map(|(g, r, v)| (g.to_owned(), r.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(rules, want, "line {line}: policyRules");
    }
}

#[test]
fn every_var_naming_another_component_resolves_while_the_shards_are_created_and_deleted() {
    // A non-optional var of another component resolves only while that component exists: it must be provisioned
    // before the shards (else the shards wait for it forever) and terminated after them (else a shard's
    // preTerminate, which resolves every var, never runs and the deletion stalls).
    for line in LINES {
        let docs = addon(line);
        let cd = of_kind(docs, "ClusterDefinition").next().expect("ClusterDefinition");
        let topo = array_at(&cd.object, "spec.topologies").iter().find(|t| t["default"] == true).expect("default");
        let stage = |order: &str, name: &str| -> usize {
            strings(array_at(topo, &format!("orders.{order}")))
                .iter()
                .position(|s| s.split(',').any(|n| n == name))
                .unwrap_or_else(|| panic!("{name} is not in the {order} order"))
        };
        // Which topology component a ComponentDefinition name plays.
        let role_of = |cmpd_name: &str| -> String {
            array_at(topo, "components")
                .iter()
                .find(|c| def_matches(str_at(c, "compDef"), cmpd_name))
                .map(|c| str_at(c, "name").to_owned())
                .unwrap_or_else(|| "pika".to_owned())
        };
        let group = &cmpd(docs, "pika-group-").object;
        let mut checked = 0;
        for v in array_at(group, "spec.vars") {
            let Some(Value::Object(from)) = v.get("valueFrom") else { continue };
            for r in from.values() {
                let Some(pattern) = r.get("compDef").and_then(Value::as_str) else { continue };
                let target: Vec<&str> =
                    of_kind(docs, "ComponentDefinition").map(Doc::name).filter(|n| def_matches(pattern, n)).collect();
                assert_eq!(target.len(), 1, "{}: {pattern}", v["name"]);
                let other = role_of(target[0]);
                if other == "pika" {
                    continue; // ALL_SHARDS_POD_FQDNS: the shards themselves.
                }
                assert!(r["optional"] != true, "{}: optional refs resolve to nothing", v["name"]);
                assert!(
                    stage("provision", &other) < stage("provision", "pika"),
                    "line {line}: {} needs {other} first",
                    v["name"]
                );
                assert!(
                    stage("terminate", &other) > stage("terminate", "pika"),
                    "line {line}: {} reads {other}, which is deleted before the shards",
                    v["name"]
                );
                checked += 1;
            }
        }
        assert!(checked >= 3, "line {line}: the dashboard address, etcd endpoints and password: {checked}");
    }
}

#[test]
fn the_failover_watcher_runs_beside_the_dashboard_sees_what_it_reads_and_the_forks_ha_stays_dormant() {
    for line in LINES {
        let docs = addon(line);
        let dashboard = &cmpd(docs, "pika-codis-dashboard-").object;
        let watcher = container(dashboard, "failover-watcher");
        assert_eq!(strings(array_at(watcher, "command")), [ACTION_BIN, "watch"]);
        let group = &cmpd(docs, "pika-group-").object;
        assert_eq!(watcher["image"], container(group, "install-pika-action")["image"], "the one pika-action image");
        // Vars are in every container's environment; the container adds its own.
        let mut visible = var_names(dashboard);
        visible.extend(env_names(array_at(watcher, "env")));
        for name in reads("watch") {
            if !LEFT_UNSET.contains(&name.as_str()) {
                assert!(visible.contains(&name), "line {line}: `pika-action watch` reads {name}, not in its container");
            }
        }
        let env = array_at(watcher, "env");
        let value = |name: &str| str_at(env.iter().find(|e| e["name"] == name).expect(name), "value").to_owned();
        assert_eq!(value("KUBEBLOCKS_LINE"), line);
        assert_eq!(value("CODIS_PRODUCT_NAME"), "$(CLUSTER_NAME)", "the product the dashboard serves");
        assert_eq!(value("PIKA_PORT"), str_at(var(group, "PIKA_PORT"), "value"));
        let detection: u64 = value("FAILOVER_DETECTION_MS").parse().expect("a number");
        let interval: u64 = value("WATCH_PROBE_INTERVAL_MS").parse().expect("a number");
        assert!(interval < detection, "a master would be failed over on one missed probe");
        let rules = array_at(dashboard, "spec.policyRules");
        assert!(
            rules.iter().any(|r| strings(array_at(r, "resources")) == ["events"]
                && strings(array_at(r, "verbs")).contains(&"create")),
            "line {line}: the watcher records failovers as Events"
        );
        // Only one failover acts: the fork's own is pushed out of reach (an hour per check, 127 checks).
        let codis = find(docs, "ConfigMap", "pika-codis-config-0.1.0");
        let toml = codis.object["data"]["dashboard.toml"].as_str().expect("dashboard.toml");
        assert_eq!(toml_value(toml, "sentinel_check_master_failover_interval"), "3600s");
        assert_eq!(toml_value(toml, "sentinel_master_dead_check_times"), "127");
    }
    // Disabled: no watcher, and the fork's HA is on.
    let docs = helm()
        .render(
            &addon_dir(),
            &Options::release("pika", "kb-system").set("kubeblocksLine=1.0").set("failover.enabled=false"),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let dashboard = &cmpd(&docs, "pika-codis-dashboard-").object;
    assert!(containers(dashboard).iter().all(|c| c["name"] != "failover-watcher"));
    let codis = find(&docs, "ConfigMap", "pika-codis-config-0.1.0");
    let toml = codis.object["data"]["dashboard.toml"].as_str().expect("dashboard.toml");
    assert_eq!(toml_value(toml, "sentinel_check_master_failover_interval"), "2s");
    // A probe interval not below the detection time is refused at render time.
    let refused = helm().render(
        &addon_dir(),
        &Options::release("pika", "kb-system").set("failover.detectionMs=500").set("failover.probeIntervalMs=500"),
    );
    assert!(refused.is_err_and(|e| e.to_string().contains("probeIntervalMs")), "not refused");
}
