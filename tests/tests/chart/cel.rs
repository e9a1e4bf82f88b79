//! The CEL rules of the KubeBlocks CRDs, evaluated by a CEL interpreter on every object the charts render, every
//! example and the Addon object, at the schema location each rule is attached to; transition rules on an upgrade of
//! a rendered Cluster and on edits of the example OpsRequests. Every rule that applies to these objects is broken
//! once on a real object and must be reported.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

use crate::support::{
    addon, addon_cr, addon_dir, cluster_dir, cmpd, examples, render_with, ADDON_VALUE_SETS, CLUSTER_VALUE_SETS, LINES,
};
use chart_tests::cel::{Outcome, Rule};
use chart_tests::manifest::{find, Doc};
use chart_tests::schema::{schemas, CelCheck};
use chart_tests::SCHEMA_VERSIONS;
use serde_json::{json, Value};

/// Every object these tests validate: both lines of the addon with every value set, the cluster chart with every
/// value set, the examples and the Addon object.
fn everything() -> &'static [Doc] {
    static DOCS: OnceLock<Vec<Doc>> = OnceLock::new();
    DOCS.get_or_init(render_everything)
}

fn render_everything() -> Vec<Doc> {
    let mut docs = Vec::new();
    for line in LINES {
        for vs in ADDON_VALUE_SETS {
            let mut set = vec![format!("kubeblocksLine={line}")];
            set.extend(vs.set.iter().map(|s| (*s).to_owned()));
            let set: Vec<&str> = set.iter().map(String::as_str).collect();
            docs.extend(render_with(&addon_dir(), "pika", "kb-system", &set));
        }
    }
    for vs in CLUSTER_VALUE_SETS {
        docs.extend(render_with(&cluster_dir(), "mycluster", "demo", vs.set));
    }
    // Backup and Restore (dataprotection) have no CRD in the shared directory.
    docs.extend(examples().iter().filter(|d| schemas("main").has_crd(d.api_version(), d.kind())).cloned());
    docs.push(addon_cr().clone());
    docs
}

/// Every rule of a schema: (schema path, rule text).
fn rules_in(schema: &Value, path: &str, out: &mut Vec<(String, String)>) {
    let Value::Object(m) = schema else { return };
    for r in m.get("x-kubernetes-validations").and_then(Value::as_array).into_iter().flatten() {
        out.push((
            if path.is_empty() { "(root)".into() } else { path.to_owned() },
            r["rule"].as_str().unwrap_or_default().into(),
        ));
    }
    let join = |seg: &str| match seg {
        _ if path.is_empty() => seg.to_owned(),
        "[]" | "{}" => format!("{path}{seg}"),
        _ => format!("{path}.{seg}"),
    };
    for (k, sub) in m.get("properties").and_then(Value::as_object).into_iter().flatten() {
        rules_in(sub, &join(k), out);
    }
    if let Some(items) = m.get("items") {
        rules_in(items, &join("[]"), out);
    }
    if let Some(extra) = m.get("additionalProperties").filter(|a| a.is_object()) {
        rules_in(extra, &join("{}"), out);
    }
}

#[test]
fn every_rule_of_both_crd_versions_compiles_and_calls_only_modelled_functions() {
    let mut total = 0;
    for version in SCHEMA_VERSIONS {
        for crd in schemas(version).crds() {
            for v in crd["spec"]["versions"].as_array().into_iter().flatten() {
                let mut rules = Vec::new();
                rules_in(&v["schema"]["openAPIV3Schema"], "", &mut rules);
                for (path, text) in rules {
                    let rule = Rule::compile(&text).unwrap_or_else(|e| panic!("[{version}] {path}: {e}"));
                    let outcome = rule.evaluate(&json!({}), &json!({"type": "object"}), Some(&json!({})), false);
                    assert!(!matches!(outcome, Outcome::NotModelled(_)), "[{version}] {path}: {text}: {outcome:?}");
                    total += 1;
                }
            }
        }
    }
    eprintln!("{total} CEL rules in the CRDs of {SCHEMA_VERSIONS:?}");
    assert!(total >= 70, "the CRDs hold {total} rules");
}

/// Outcomes of rules by (schema version, kind, schema path, rule).
type Outcomes = BTreeMap<(String, String, String, String), Vec<Outcome>>;

/// The rules evaluated on create, with their outcomes.
fn creates() -> &'static Outcomes {
    static SEEN: OnceLock<Outcomes> = OnceLock::new();
    SEEN.get_or_init(evaluate_creates)
}

fn evaluate_creates() -> Outcomes {
    let docs = everything();
    let mut seen = Outcomes::new();
    for version in SCHEMA_VERSIONS {
        let (_, problems, cel) = schemas(version).validate_all(docs);
        assert!(problems.is_empty(), "{}", problems.join("\n"));
        for CelCheck { kind, schema_path, rule, outcome, .. } in cel {
            seen.entry((version.to_owned(), kind, schema_path, rule)).or_default().push(outcome);
        }
    }
    seen
}

#[test]
fn every_rule_at_a_place_the_charts_fill_holds() {
    let seen = creates();
    let evaluations: usize = seen.values().map(Vec::len).sum();
    for ((version, kind, path, rule), outcomes) in seen {
        for o in outcomes {
            assert!(matches!(o, Outcome::Holds | Outcome::NoOldSelf), "[{version}] {kind} {path}: {rule}: {o:?}");
        }
    }
    let applied: BTreeSet<&str> =
        seen.iter().filter(|(_, o)| o.contains(&Outcome::Holds)).map(|((_, _, _, rule), _)| rule.as_str()).collect();
    eprintln!(
        "{evaluations} CEL evaluations on create ({} distinct rule placements, {} distinct rules hold)",
        seen.len(),
        applied.len()
    );
    // The definitions, the Cluster, the Addon and the OpsRequest examples each meet rules of their CRDs.
    for kind in ["ComponentDefinition", "ComponentVersion", "ShardingDefinition", "Cluster", "Addon", "OpsRequest"] {
        assert!(seen.keys().any(|(_, k, _, _)| k.starts_with(kind)), "no rule of {kind} was evaluated");
    }
}

/// One object broken on purpose: the rule it must then violate, where, and how.
struct Breakage {
    rule: &'static str,
    path: &'static str,
    object: fn() -> Value,
    old: Option<fn() -> Value>,
    edit: fn(&mut Value),
}

fn etcd_cmpd() -> Value {
    cmpd(addon("1.0"), "pika-etcd-").object.clone()
}
fn pika_cmpv() -> Value {
    find(addon("1.1"), "ComponentVersion", "pika-group").object.clone()
}
fn sharding() -> Value {
    find(addon("1.1"), "ShardingDefinition", "pika-sharding-0.1.0").object.clone()
}
fn addon_object() -> Value {
    addon_cr().object.clone()
}
fn the_cluster() -> Value {
    render_with(&cluster_dir(), "mycluster", "demo", &[]).remove(0).object
}
fn the_cluster_with_password() -> Value {
    render_with(&cluster_dir(), "mycluster", "demo", CLUSTER_VALUE_SETS[3].set).remove(0).object
}
fn example(ty: &str) -> Value {
    examples()
        .iter()
        .find(|d| d.kind() == "OpsRequest" && d.object["spec"]["type"] == ty)
        .unwrap_or_else(|| panic!("no OpsRequest example of type {ty}"))
        .object
        .clone()
}
fn switchover() -> Value {
    example("Switchover")
}
fn switchover_not_forced() -> Value {
    let mut o = switchover();
    o["spec"]["force"] = json!(false);
    o
}
fn scale_shards() -> Value {
    examples()
        .iter()
        .find(|d| d.object["spec"]["horizontalScaling"][0]["shards"].is_u64())
        .expect("the shard scaling example")
        .object
        .clone()
}
fn restart() -> Value {
    example("Restart")
}
fn reconfigure() -> Value {
    example("Reconfiguring")
}
fn backup() -> Value {
    example("Backup")
}
fn restore() -> Value {
    example("Restore")
}

const BREAKAGES: &[Breakage] = &[
    Breakage {
        rule: "self.minReplicas >= 0 && self.maxReplicas <= 16384",
        path: "spec.replicasLimit",
        object: etcd_cmpd,
        old: None,
        edit: |o| o["spec"]["replicasLimit"]["maxReplicas"] = json!(20000),
    },
    Breakage {
        rule: "self.minReplicas <= self.maxReplicas",
        path: "spec.replicasLimit",
        object: etcd_cmpd,
        old: None,
        edit: |o| o["spec"]["replicasLimit"] = json!({"minReplicas": 5, "maxReplicas": 3}),
    },
    Breakage {
        rule: "self.all(key, size(key) <= 32)",
        path: "spec.releases[].images",
        object: pika_cmpv,
        old: None,
        edit: |o| o["spec"]["releases"][0]["images"]["a-container-name-longer-than-32-chars"] = json!("x"),
    },
    Breakage {
        rule: "self.all(key, size(self[key]) <= 256)",
        path: "spec.releases[].images",
        object: pika_cmpv,
        old: None,
        edit: |o| o["spec"]["releases"][0]["images"]["pika"] = json!(format!("docker.io/{}:1", "p".repeat(250))),
    },
    Breakage {
        rule: "self.minShards >= 0 && self.maxShards <= 2048",
        path: "spec.shardsLimit",
        object: sharding,
        old: None,
        edit: |o| o["spec"]["shardsLimit"]["maxShards"] = json!(4096),
    },
    Breakage {
        rule: "self.minShards <= self.maxShards",
        path: "spec.shardsLimit",
        object: sharding,
        old: None,
        edit: |o| o["spec"]["shardsLimit"] = json!({"minShards": 4, "maxShards": 2}),
    },
    Breakage {
        rule: "has(self.type) && self.type == 'Helm' ?  has(self.helm) : !has(self.helm)",
        path: "spec",
        object: addon_object,
        old: None,
        edit: |o| {
            o["spec"].as_object_mut().expect("spec").remove("helm");
        },
    },
    Breakage {
        rule: "self.chartLocationURL.startsWith('file://') ? has(self.chartsImage) : true",
        path: "spec.helm",
        object: addon_object,
        old: None,
        edit: |o| o["spec"]["helm"]["chartLocationURL"] = json!("file:///charts/pika-0.1.0.tgz"),
    },
    Breakage {
        rule: "self.all(x, size(self.filter(c, c.name == x.name)) == 1)",
        path: "spec.componentSpecs",
        object: the_cluster,
        old: None,
        edit: |o| {
            let first = o["spec"]["componentSpecs"][0].clone();
            o["spec"]["componentSpecs"].as_array_mut().expect("componentSpecs").push(first);
        },
    },
    Breakage {
        rule: "self.all(x, size(self.filter(c, has(c.componentDef))) == 0) || self.all(x, size(self.filter(c, \
               has(c.componentDef))) == size(self))",
        path: "spec.componentSpecs",
        object: the_cluster,
        old: None,
        edit: |o| o["spec"]["componentSpecs"][0]["componentDef"] = json!("pika-etcd-0.1.0"),
    },
    Breakage {
        rule: "!has(self.secretRefRevision) || size(self.secretRefRevision) == 0 || has(self.secretRef)",
        path: "spec.componentSpecs[].systemAccounts[]",
        object: the_cluster_with_password,
        old: None,
        edit: |o| {
            o["spec"]["componentSpecs"][1]["systemAccounts"][0] = json!({"name": "default", "secretRefRevision": "2"})
        },
    },
    Breakage {
        rule: "(has(self.componentName) && !has(self.componentObjectName)) || (!has(self.componentName) && \
               has(self.componentObjectName))",
        path: "spec.switchover[]",
        object: switchover,
        old: None,
        edit: |o| o["spec"]["switchover"][0]["componentName"] = json!("pika"),
    },
    Breakage {
        rule: "has(self.shards) ? (!has(self.scaleOut) && !has(self.scaleIn)) : true",
        path: "spec.horizontalScaling[]",
        object: scale_shards,
        old: None,
        edit: |o| o["spec"]["horizontalScaling"][0]["scaleOut"] = json!({"replicaChanges": 1}),
    },
    Breakage {
        rule: "has(self.cancel) && self.cancel ? (self.type in ['VerticalScaling', 'HorizontalScaling']) : true",
        path: "spec",
        object: switchover,
        old: None,
        edit: |o| o["spec"]["cancel"] = json!(true),
    },
    // Transition rules: an update of the rendered Cluster or of an example OpsRequest.
    Breakage {
        rule: "self == oldSelf",
        path: "spec.clusterDef",
        object: the_cluster,
        old: Some(the_cluster),
        edit: |o| o["spec"]["clusterDef"] = json!("redis"),
    },
    Breakage {
        rule: "self == oldSelf",
        path: "spec.topology",
        object: the_cluster,
        old: Some(the_cluster),
        edit: |o| o["spec"]["topology"] = json!("pika-only"),
    },
    Breakage {
        rule: "!has(oldSelf.topology) || has(self.topology)",
        path: "spec",
        object: the_cluster,
        old: Some(the_cluster),
        edit: |o| {
            o["spec"].as_object_mut().expect("spec").remove("topology");
        },
    },
    Breakage {
        rule: "self == oldSelf",
        path: "spec.type",
        object: switchover,
        old: Some(switchover),
        edit: |o| o["spec"]["type"] = json!("Restart"),
    },
    Breakage {
        rule: "self == oldSelf",
        path: "spec.clusterName",
        object: switchover,
        old: Some(switchover),
        edit: |o| o["spec"]["clusterName"] = json!("another"),
    },
    Breakage {
        rule: "self == oldSelf",
        path: "spec.force",
        object: switchover_not_forced,
        old: Some(switchover_not_forced),
        edit: |o| o["spec"]["force"] = json!(true),
    },
    Breakage {
        rule: "self == oldSelf",
        path: "spec.switchover",
        object: switchover,
        old: Some(switchover),
        edit: |o| o["spec"]["switchover"][0]["candidateName"] = json!("pika-demo-pika-x7k-2"),
    },
    Breakage {
        rule: "self == oldSelf",
        path: "spec.horizontalScaling",
        object: scale_shards,
        old: Some(scale_shards),
        edit: |o| o["spec"]["horizontalScaling"][0]["shards"] = json!(6),
    },
    Breakage {
        rule: "self == oldSelf",
        path: "spec.restart",
        object: restart,
        old: Some(restart),
        edit: |o| o["spec"]["restart"][0]["componentName"] = json!("codis-proxy"),
    },
    Breakage {
        rule: "self == oldSelf",
        path: "spec.reconfigures",
        object: reconfigure,
        old: Some(reconfigure),
        edit: |o| o["spec"]["reconfigures"][0]["parameters"][0]["value"] = json!("12345"),
    },
    Breakage {
        rule: "has(oldSelf.parameters) == has(self.parameters)",
        path: "spec.backup",
        object: backup,
        old: Some(backup),
        edit: |o| o["spec"]["backup"]["parameters"] = json!([{"name": "compress", "value": "true"}]),
    },
    Breakage {
        rule: "has(oldSelf.parameters) == has(self.parameters)",
        path: "spec.restore",
        object: restore,
        old: Some(restore),
        edit: |o| o["spec"]["restore"]["parameters"] = json!([{"name": "compress", "value": "true"}]),
    },
];

/// Whether a CEL check of that rule at that schema path violated it.
fn reported(cel: &[CelCheck], rule: &str, path: &str) -> bool {
    cel.iter().any(|c| c.rule == rule && c.schema_path == path && c.outcome == Outcome::Violated)
}

#[test]
fn every_rule_the_charts_meet_is_reported_when_an_object_breaks_it() {
    let mut negative = 0;
    for b in BREAKAGES {
        let old = b.old.map(|f| f());
        let mut obj = (b.object)();
        (b.edit)(&mut obj);
        let mut applies = 0;
        for version in SCHEMA_VERSIONS {
            let set = schemas(version);
            let placed = set.schema_of(&obj).is_some_and(|s| {
                let mut rules = Vec::new();
                rules_in(&s, "", &mut rules);
                rules.iter().any(|(p, r)| p == b.path && r == b.rule)
            });
            if !placed {
                continue; // This version's CRD has no such rule there (e.g. OpsRequest cancel on main).
            }
            applies += 1;
            let report = set.check(&obj, old.as_ref());
            assert!(
                reported(&report.cel, b.rule, b.path),
                "[{version}] breaking {:?} at {} was not reported; errors: {:?}",
                b.rule,
                b.path,
                report.errors
            );
            assert!(
                report.errors.iter().any(|e| e.contains(b.rule)),
                "[{version}] the violation of {:?} is not among the errors: {:?}",
                b.rule,
                report.errors
            );
            // The unbroken object (and its update to itself) meets the rule.
            let clean = set.check(&(b.object)(), old.as_ref());
            assert!(clean.errors.is_empty(), "[{version}] {:?}", clean.errors);
            assert!(
                clean.cel.iter().any(|c| c.rule == b.rule && c.schema_path == b.path && c.outcome == Outcome::Holds),
                "[{version}] {:?} at {} is not evaluated on the unbroken object",
                b.rule,
                b.path
            );
            negative += 1;
        }
        assert!(applies > 0, "{:?} at {} is in neither CRD version", b.rule, b.path);
    }
    eprintln!("{negative} negative cases ({} breakages over {SCHEMA_VERSIONS:?})", BREAKAGES.len());
}

#[test]
fn every_rule_that_holds_on_a_rendered_object_has_a_negative_case() {
    let covered: BTreeSet<(&str, &str)> = BREAKAGES.iter().map(|b| (b.path, b.rule)).collect();
    for ((version, kind, path, rule), outcomes) in creates() {
        if outcomes.contains(&Outcome::Holds) {
            assert!(
                covered.contains(&(path.as_str(), rule.as_str())),
                "[{version}] {kind}: {rule:?} at {path} holds on the charts' objects but no test breaks it"
            );
        }
    }
    // Transition rules: each one evaluated on an update of these objects to themselves has a negative case too.
    let updates: Vec<Value> =
        vec![the_cluster(), switchover(), scale_shards(), restart(), reconfigure(), backup(), restore()];
    for version in SCHEMA_VERSIONS {
        for obj in &updates {
            let report = schemas(version).check(obj, Some(obj));
            assert!(report.errors.is_empty(), "[{version}] {:?}", report.errors);
            for c in report.cel.iter().filter(|c| c.outcome == Outcome::Holds) {
                let transition = Rule::compile(&c.rule).expect("compiles").transition;
                // A map-list item's `name == oldSelf` cannot be broken by an update: a renamed item is another item.
                let unbreakable = c.schema_path.ends_with("[].name");
                if transition && !unbreakable {
                    assert!(
                        covered.contains(&(c.schema_path.as_str(), c.rule.as_str())),
                        "[{version}] {}: transition rule {:?} at {} holds on an update but no test breaks it",
                        c.kind,
                        c.rule,
                        c.schema_path
                    );
                }
            }
        }
    }
}

#[test]
fn an_upgrade_of_the_cluster_meets_every_transition_rule() {
    // helm upgrade mycluster clusterdefs --set shards=64 ...: the API server sees an update of the same Cluster.
    let old = the_cluster();
    let new = render_with(&cluster_dir(), "mycluster", "demo", CLUSTER_VALUE_SETS[2].set).remove(0).object;
    for version in SCHEMA_VERSIONS {
        let report = schemas(version).check(&new, Some(&old));
        assert!(report.errors.is_empty(), "[{version}] {:?}", report.errors);
        let transitions: Vec<&CelCheck> =
            report.cel.iter().filter(|c| Rule::compile(&c.rule).is_ok_and(|r| r.transition)).collect();
        let evaluated: BTreeSet<&str> =
            transitions.iter().filter(|c| c.outcome == Outcome::Holds).map(|c| c.schema_path.as_str()).collect();
        for path in ["spec", "spec.clusterDef", "spec.topology", "spec.shardings[].name"] {
            assert!(
                evaluated.contains(path),
                "[{version}] the transition rule at {path} was not evaluated: {evaluated:?}"
            );
        }
        // On a create there is no old object: the same rules are not evaluated.
        let created = schemas(version).check(&new, None);
        assert!(created
            .cel
            .iter()
            .filter(|c| Rule::compile(&c.rule).is_ok_and(|r| r.transition))
            .all(|c| c.outcome == Outcome::NoOldSelf));
        eprintln!("[{version}] cluster upgrade: {} transition rules evaluated", evaluated.len());
    }
}
