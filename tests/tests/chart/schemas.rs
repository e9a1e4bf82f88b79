//! Every object both charts render, the example manifests and the Addon object, validated against the KubeBlocks CRD
//! schemas of v1.0.2 and main; and proof that the validation catches what the API server would reject.

use std::collections::BTreeMap;

use crate::support::{
    addon, addon_cr, addon_dir, cluster_dir, cmpd, examples, render_with, schema_version_of, ADDON_VALUE_SETS,
    CLUSTER_VALUE_SETS, LINES,
};
use chart_tests::helm::summary;
use chart_tests::manifest::{find, Doc};
use chart_tests::schema::schemas;
use chart_tests::SCHEMA_VERSIONS;
use serde_json::{json, Value};

fn assert_valid(what: &str, docs: &[Doc]) -> BTreeMap<&'static str, usize> {
    let mut counts = BTreeMap::new();
    let mut problems = Vec::new();
    for version in SCHEMA_VERSIONS {
        let (with_crd, p, _) = schemas(version).validate_all(docs);
        counts.insert(version, with_crd);
        problems.extend(p);
    }
    assert!(problems.is_empty(), "{what}: {} problems:\n{}", problems.len(), problems.join("\n"));
    eprintln!("{what}: {} objects, validated against a CRD schema: {counts:?}", docs.len());
    counts
}

fn kinds(docs: &[Doc]) -> BTreeMap<String, usize> {
    let mut k = BTreeMap::new();
    for d in docs {
        *k.entry(d.kind().to_owned()).or_default() += 1;
    }
    k
}

#[test]
fn the_addon_renders_every_definition_for_both_kubeblocks_lines() {
    for line in LINES {
        let k = kinds(addon(line));
        let expected = [
            ("ClusterDefinition", 1),
            ("ComponentDefinition", 5),
            ("ShardingDefinition", 1),
            ("ComponentVersion", 5),
            ("ParametersDefinition", 1),
            ("ParamConfigRenderer", 1),
            ("ActionSet", 1),
            ("BackupPolicyTemplate", 1),
            ("ConfigMap", 4),
        ];
        for (kind, n) in expected {
            assert_eq!(k.get(kind).copied(), Some(n), "line {line}: {kind} count in\n{}", summary(addon(line)));
        }
        assert_eq!(k.values().sum::<usize>(), 20, "line {line}: unexpected objects:\n{}", summary(addon(line)));
    }
}

#[test]
fn every_addon_object_of_both_lines_validates_against_both_schema_versions() {
    for line in LINES {
        let counts = assert_valid(&format!("addon (kubeblocksLine {line})"), addon(line));
        for (version, n) in counts {
            assert_eq!(n, 16, "{version}: every non-ConfigMap object has a CRD");
        }
    }
}

#[test]
fn every_value_set_of_the_addon_validates_against_the_schema_of_its_line() {
    for line in LINES {
        for vs in ADDON_VALUE_SETS {
            let mut set = vec![format!("kubeblocksLine={line}")];
            set.extend(vs.set.iter().map(|s| (*s).to_owned()));
            let set: Vec<&str> = set.iter().map(String::as_str).collect();
            let docs = render_with(&addon_dir(), "pika", "kb-system", &set);
            let version = schema_version_of(line);
            let (with_crd, problems, cel) = schemas(version).validate_all(&docs);
            assert!(problems.is_empty(), "line {line}, {}: {}", vs.name, problems.join("\n"));
            assert_eq!(with_crd, 16, "line {line}, {}", vs.name);
            eprintln!(
                "addon line {line} ({}): {} objects against {version}, {} CEL rule evaluations",
                vs.name,
                docs.len(),
                cel.len()
            );
        }
    }
}

#[test]
fn every_value_set_of_the_cluster_chart_validates_against_both_schema_versions() {
    for vs in CLUSTER_VALUE_SETS {
        let docs = render_with(&cluster_dir(), "mycluster", "demo", vs.set);
        assert_eq!(docs.len(), 1, "{}: one Cluster:\n{}", vs.name, summary(&docs));
        assert_valid(&format!("clusterdefs ({})", vs.name), &docs);
    }
    let many = render_with(&cluster_dir(), "big", "prod", CLUSTER_VALUE_SETS[2].set);
    let c = find(&many, "Cluster", "big");
    assert_eq!(c.at("spec.shardings.0.shards"), Some(&json!(64)));
    assert_eq!(c.at("spec.shardings.0.template.replicas"), Some(&json!(3)));
    assert_eq!(c.at("spec.shardings.0.template.disableExporter"), Some(&json!(true)));
    assert_eq!(c.at("spec.shardings.0.template.volumeClaimTemplates.0.spec.storageClassName"), Some(&json!("fast")));
    assert_eq!(
        c.at("spec.componentSpecs.0.volumeClaimTemplates.0.spec.resources.requests.storage"),
        Some(&json!("2Gi"))
    );
    let one = render_with(&cluster_dir(), "one", "demo", CLUSTER_VALUE_SETS[1].set);
    assert_eq!(find(&one, "Cluster", "one").at("spec.shardings.0.shards"), Some(&json!(1)));
    let pw = render_with(&cluster_dir(), "mycluster", "demo", CLUSTER_VALUE_SETS[3].set);
    let dashboard = &find(&pw, "Cluster", "mycluster").object["spec"]["componentSpecs"][1];
    assert_eq!(dashboard["name"], "codis-dashboard");
    assert_eq!(
        dashboard["systemAccounts"],
        json!([{"name": "default", "secretRef": {"name": "mycluster-password", "namespace": "demo", "password": "password"}}]),
        "the password account is codis-dashboard's `default`, whose password every pika and proxy uses"
    );
    let renamed = render_with(&cluster_dir(), "mycluster", "demo", CLUSTER_VALUE_SETS[4].set);
    let _ = find(&renamed, "Cluster", "pika-prod");
}

#[test]
fn every_example_validates_where_its_crd_is_present_and_parses_otherwise() {
    let docs = examples();
    assert!(docs.len() >= 10, "examples:\n{}", summary(docs));
    let mut problems = Vec::new();
    for version in SCHEMA_VERSIONS {
        let set = schemas(version);
        for d in docs {
            if !set.has_crd(d.api_version(), d.kind()) {
                // dataprotection Backup/Restore: no CRD in the shared directory; parsing and naming is all we can do.
                assert!(!d.name().is_empty() && d.object["spec"].is_object(), "{}: {}", d.source, d.object);
                continue;
            }
            if let Err(errs) = set.validate(&d.object) {
                problems.extend(errs.into_iter().map(|e| format!("[{version}] {}: {e}", d.source)));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let ops: Vec<&str> =
        docs.iter().filter(|d| d.kind() == "OpsRequest").filter_map(|d| d.object["spec"]["type"].as_str()).collect();
    for ty in ["HorizontalScaling", "Switchover", "Restart", "VerticalScaling", "Reconfiguring", "Backup", "Restore"] {
        assert!(ops.contains(&ty), "no OpsRequest example of type {ty}");
    }
    let shards = docs
        .iter()
        .filter(|d| d.kind() == "OpsRequest")
        .any(|d| d.object["spec"]["horizontalScaling"][0]["shards"].is_u64());
    assert!(shards, "an example scales the number of shards");
}

#[test]
fn the_addon_object_validates_against_both_schema_versions() {
    assert_valid("kubeblocks-addon.yaml", std::slice::from_ref(addon_cr()));
}

/// A rendered pika ComponentDefinition, changed by `edit`, must fail validation with a message naming `expect`.
fn rejected(edit: impl Fn(&mut Value), expect: &str) {
    let mut obj = cmpd(addon("1.1"), "pika-group-").object.clone();
    edit(&mut obj);
    for version in SCHEMA_VERSIONS {
        let errs = schemas(version).validate(&obj).expect_err("the edited object must be rejected");
        assert!(
            errs.iter().any(|e| e.contains(expect)),
            "[{version}] expected an error mentioning {expect:?}, got:\n{}",
            errs.join("\n")
        );
    }
}

#[test]
fn a_misspelt_field_is_rejected_at_any_depth() {
    rejected(|o| o["spec"]["updateStratgy"] = json!("Serial"), "updateStratgy");
    rejected(|o| o["spec"]["lifecycleActions"]["roleProbe"]["exec"]["comand"] = json!(["/bin/pika-action"]), "comand");
    rejected(|o| o["spec"]["vars"][0]["valueFrom"]["clusterVarRef"]["clusterNmae"] = json!("Required"), "clusterNmae");
    rejected(|o| o["spek"] = json!({}), "spek");
}

#[test]
fn a_wrong_type_or_value_is_rejected() {
    rejected(|o| o["spec"]["lifecycleActions"]["switchover"]["timeoutSeconds"] = json!("60"), "timeoutSeconds");
    rejected(|o| o["spec"]["roles"][0]["updatePriority"] = json!("high"), "updatePriority");
    rejected(|o| o["spec"]["updateStrategy"] = json!("Sometimes"), "updateStrategy");
    rejected(|o| o["spec"]["vars"][0]["valueFrom"]["clusterVarRef"]["clusterName"] = json!("Yes"), "clusterName");
}

#[test]
fn a_missing_required_field_is_rejected() {
    rejected(
        |o| {
            o["spec"]["roles"][0].as_object_mut().expect("role").remove("name");
        },
        "name",
    );
    rejected(
        |o| {
            o["spec"]["runtime"].as_object_mut().expect("runtime").remove("containers");
        },
        "containers",
    );
}

#[test]
fn kubernetes_list_maps_reject_duplicate_keys() {
    // Two ports of one container with the same (containerPort, protocol): protocol defaults to TCP.
    rejected(
        |o| {
            let port = o["spec"]["runtime"]["containers"][0]["ports"][0].clone();
            let mut dup = port.clone();
            dup["name"] = json!("other");
            o["spec"]["runtime"]["containers"][0]["ports"].as_array_mut().expect("ports").push(dup);
        },
        "duplicate",
    );
}

#[test]
fn the_crds_cel_rules_are_enforced() {
    let mut ops =
        examples().iter().find(|d| d.object["spec"]["type"] == "Switchover").expect("switchover").object.clone();
    ops["spec"]["switchover"][0]["componentName"] = json!("pika");
    for version in SCHEMA_VERSIONS {
        let errs = schemas(version).validate(&ops).expect_err("componentName and componentObjectName together");
        assert!(errs.iter().any(|e| e.contains("componentObjectName")), "{errs:?}");
    }
    let mut sharding = find(addon("1.1"), "ShardingDefinition", "pika-sharding-0.1.0").object.clone();
    sharding["spec"]["shardsLimit"] = json!({"minShards": 4, "maxShards": 2});
    for version in SCHEMA_VERSIONS {
        let errs = schemas(version).validate(&sharding).expect_err("min above max");
        assert!(errs.iter().any(|e| e.contains("minShards <= self.maxShards")), "{errs:?}");
    }
}

#[test]
fn invalid_object_metadata_is_rejected() {
    rejected(|o| o["metadata"]["name"] = json!("Pika_Group"), "metadata.name");
    rejected(|o| o["metadata"]["labels"]["app.kubernetes.io/version"] = json!("-3.5"), "label value");
    rejected(|o| o["metadata"]["lables"] = json!({}), "metadata.lables");
}

#[test]
fn an_apiversion_a_line_does_not_serve_is_rejected() {
    let mut obj = cmpd(addon("1.0"), "pika-group-").object.clone();
    obj["apiVersion"] = json!("apps.kubeblocks.io/v1alpha1");
    let errs = schemas("main").validate(&obj).expect_err("main serves apps.kubeblocks.io/v1 only");
    assert!(errs.iter().any(|e| e.contains("v1alpha1")), "{errs:?}");
}

#[test]
fn the_api_servers_defaults_fill_required_fields_before_validation() {
    // Cluster componentSpecs[].replicas is required and defaults to 1: the API server accepts a component without.
    let mut cluster = crate::support::cluster()[0].object.clone();
    cluster["spec"]["componentSpecs"][1].as_object_mut().expect("codis-dashboard").remove("replicas");
    // flattenFormat.keyValueDelimiter is required and defaults to ":".
    let mut group = cmpd(addon("1.0"), "pika-group-").object.clone();
    let all = group["spec"]["vars"]
        .as_array_mut()
        .expect("vars")
        .iter_mut()
        .find(|v| v["name"] == "ALL_SHARDS_POD_FQDNS")
        .expect("ALL_SHARDS_POD_FQDNS");
    all["valueFrom"]["componentVarRef"]["multipleClusterObjectOption"]["combinedOption"]["flattenFormat"]
        .as_object_mut()
        .expect("flattenFormat")
        .remove("keyValueDelimiter");
    for version in SCHEMA_VERSIONS {
        for obj in [&cluster, &group] {
            schemas(version).validate(obj).unwrap_or_else(|e| panic!("[{version}] {}: {e:?}", obj["kind"]));
        }
    }
    // A required field without a default is still required.
    let mut no_name = cluster.clone();
    no_name["spec"]["componentSpecs"][1].as_object_mut().expect("codis-dashboard").remove("name");
    for version in SCHEMA_VERSIONS {
        assert!(schemas(version).validate(&no_name).is_err(), "[{version}] a component without a name");
    }
}
