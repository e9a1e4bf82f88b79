//! `kbcli cluster create pika NAME [flags]`, as kbcli 1.0.2 runs it ([`chart_tests::kbcli`]): the flags it builds from
//! clusterdefs/values.schema.json, the values it then passes (every flag, given or not, plus its own), rendered by the
//! real Helm with the chart's schema checked, the same values checked by the schema alone, the Cluster validated
//! against the CRDs. Real mistakes must still be refused.

use std::path::{Path, PathBuf};

use crate::support::{cluster_dir, render_with};
use chart_tests::helm::{helm, Options};
use chart_tests::kbcli::{self, lower_camel_case, Flag};
use chart_tests::manifest::{at, find, Doc};
use chart_tests::schema::schemas;
use chart_tests::SCHEMA_VERSIONS;
use serde_json::{json, Value};

fn schema_of(chart: &Path) -> Value {
    let text = std::fs::read_to_string(chart.join("values.schema.json")).expect("values.schema.json");
    serde_json::from_str(&text).expect("values.schema.json is JSON")
}

fn flags() -> Vec<Flag> {
    kbcli::create_flags(&schema_of(&cluster_dir())).expect("kbcli builds flags from the schema")
}

/// What `kbcli cluster create pika <name> -n <namespace> --<flag>=<value>...` sends: the rendered objects, or the
/// first error kbcli would print.
fn kbcli_create(chart: &Path, name: &str, namespace: &str, given: &[(&str, &str)]) -> Result<Vec<Doc>, String> {
    let schema = schema_of(chart);
    let flags = kbcli::create_flags(&schema)?;
    let values = kbcli::values(&flags, given)?;
    // Complete: the chart rendered by Helm's install action with those values (the chart's schema checked on the
    // values merged with values.yaml).
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let file = dir.path().join("kbcli-values.json");
    std::fs::write(&file, values.to_string()).map_err(|e| e.to_string())?;
    let docs = helm().render(chart, &Options::release(name, namespace).values(&file))?;
    // Validate: the name, then the values as given against the schema alone.
    kbcli::validate_name(name)?;
    let validator = jsonschema::options()
        .with_draft(jsonschema::Draft::Draft4)
        .build(&schema)
        .map_err(|e| format!("values.schema.json: {e}"))?;
    let errors: Vec<String> = validator.iter_errors(&values).map(|e| format!("{}: {e}", e.instance_path())).collect();
    if !errors.is_empty() {
        return Err(errors.join("\n"));
    }
    Ok(docs)
}

fn values_yaml() -> Value {
    helm().yaml_files(&[cluster_dir().join("values.yaml")]).expect("values.yaml").remove(0).object
}

#[test]
fn every_flag_kbcli_builds_passes_what_values_yaml_holds_under_the_same_key() {
    let defaults = values_yaml();
    let built: Vec<Flag> = flags().into_iter().filter(|f| f.from_schema).collect();
    assert!(!built.is_empty(), "no flag from the schema");
    for f in &built {
        let key = lower_camel_case(&f.name);
        let in_values =
            at(&defaults, &key).unwrap_or_else(|| panic!("--{} passes {key}, which values.yaml lacks", f.name));
        assert_eq!(&f.default, in_values, "--{} passes {} by default; values.yaml says {in_values}", f.name, f.default);
    }
    // Every scalar of the schema has a flag, and kbcli passes it under the key the schema names.
    fn scalars(schema: &Value, prefix: &str, out: &mut Vec<String>) {
        for (k, p) in schema["properties"].as_object().into_iter().flatten() {
            let path = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
            match p["type"].as_str() {
                Some("object") => scalars(p, &path, out),
                _ => out.push(path),
            }
        }
    }
    let mut paths = Vec::new();
    scalars(&schema_of(&cluster_dir()), "", &mut paths);
    for p in paths {
        assert!(
            built.iter().any(|f| lower_camel_case(&f.name) == p),
            "{p} has no kbcli flag passing it back under its own name: {:?}",
            built.iter().map(|f| &f.name).collect::<Vec<_>>()
        );
    }
    eprintln!(
        "kbcli cluster create pika flags: {}",
        flags().iter().map(|f| format!("--{}={}", f.name, f.default)).collect::<Vec<_>>().join(" ")
    );
}

#[test]
fn kbcli_cluster_create_without_flags_creates_the_cluster_helm_install_creates() {
    let by_kbcli = kbcli_create(&cluster_dir(), "pika-demo", "demo", &[]).unwrap_or_else(|e| panic!("{e}"));
    let by_helm = render_with(&cluster_dir(), "pika-demo", "demo", &[]);
    assert_eq!(by_kbcli.len(), 1);
    assert_eq!(by_kbcli[0].object, by_helm[0].object, "kbcli's values change nothing");
    for version in SCHEMA_VERSIONS {
        schemas(version).validate(&by_kbcli[0].object).unwrap_or_else(|e| panic!("[{version}] {e:?}"));
    }
}

#[test]
fn kbcli_flags_reach_the_cluster() {
    let docs = kbcli_create(
        &cluster_dir(),
        "pika-big",
        "prod",
        &[
            ("shards", "8"),
            ("replicas", "3"),
            ("storage", "50Gi"),
            ("storage-class-name", "fast"),
            ("termination-policy", "WipeOut"),
            ("monitoring", "false"),
            ("etcd.replicas", "5"),
            ("etcd.storage", "2Gi"),
            ("codis-proxy.replicas", "4"),
            ("codis-fe.replicas", "0"),
            ("password-secret", "pika-big-password"),
            ("dry-run", "client"),
            ("output", "json"),
            ("tenancy", "DedicatedNode"),
            ("topology-keys", "kubernetes.io/hostname"),
        ],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let c = find(&docs, "Cluster", "pika-big");
    let want = [
        ("spec.terminationPolicy", json!("WipeOut")),
        ("spec.shardings.0.shards", json!(8)),
        ("spec.shardings.0.template.replicas", json!(3)),
        ("spec.shardings.0.template.disableExporter", json!(true)),
        ("spec.shardings.0.template.volumeClaimTemplates.0.spec.resources.requests.storage", json!("50Gi")),
        ("spec.shardings.0.template.volumeClaimTemplates.0.spec.storageClassName", json!("fast")),
        ("spec.componentSpecs.0.replicas", json!(5)),
        ("spec.componentSpecs.0.volumeClaimTemplates.0.spec.resources.requests.storage", json!("2Gi")),
        ("spec.componentSpecs.1.systemAccounts.0.secretRef.name", json!("pika-big-password")),
        ("spec.componentSpecs.2.replicas", json!(4)),
        ("spec.componentSpecs.3.replicas", json!(0)),
    ];
    for (path, v) in want {
        assert_eq!(c.at(path), Some(&v), "{path}");
    }
    assert_eq!(c.namespace(), Some("prod"));
    for version in SCHEMA_VERSIONS {
        schemas(version).validate(&c.object).unwrap_or_else(|e| panic!("[{version}] {e:?}"));
    }
}

fn refused(given: &[(&str, &str)], expect: &str) {
    let err = kbcli_create(&cluster_dir(), "pika-demo", "demo", given).expect_err("kbcli must refuse");
    assert!(err.contains(expect), "{given:?}: expected {expect:?} in:\n{err}");
}

#[test]
fn real_mistakes_are_still_refused() {
    refused(&[("shards", "0")], "shards");
    refused(&[("shards", "2000")], "shards");
    refused(&[("replicas", "17")], "replicas");
    refused(&[("storage", "20GB")], "storage");
    refused(&[("termination-policy", "Halt")], "terminationPolicy");
    refused(&[("etcd.replicas", "0")], "etcd.replicas");
    refused(&[("codis-proxy.replicas", "0")], "codisProxy.replicas");
    refused(&[("etcd.storage", "")], "etcd.storage");
    refused(&[("password-secret", "Not A Name")], "passwordSecret");
    refused(&[("tenancy", "Shared")], "tenancy");
    refused(&[("pod-anti-affinity", "Sometimes")], "podAntiAffinity");
    refused(&[("shard", "3")], "unknown flag: --shard");
    refused(&[("shards", "three")], "invalid argument");
    let long = kbcli_create(&cluster_dir(), "a-very-long-cluster-name", "demo", &[]).expect_err("long name");
    assert!(long.contains("longer than 16"), "{long}");
    // Helm users mistype keys kbcli never builds: still rejected at the root and in nested objects.
    let helm_err = |set: &str| {
        helm()
            .template(&cluster_dir(), &Options::release("pika-demo", "demo").set(set))
            .expect_err("the schema must refuse it")
    };
    assert!(helm_err("shard=3").contains("Additional property shard is not allowed"));
    assert!(helm_err("etcd.replica=3").contains("Additional property replica is not allowed"));
    assert!(helm_err("edit=yes").contains("edit"), "kbcli's keys are typed too");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir").filter_map(Result::ok) {
        let target = to.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).expect("copy");
        }
    }
}

/// The cluster chart with its schema changed by `edit`, in a temporary directory.
fn chart_with_schema(edit: impl Fn(&mut Value)) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let chart = dir.path().join("pika-cluster");
    copy_dir(&cluster_dir(), &chart);
    let mut schema = schema_of(&chart);
    edit(&mut schema);
    std::fs::write(chart.join("values.schema.json"), schema.to_string()).expect("write schema");
    (dir, chart)
}

#[test]
fn a_schema_kbcli_cannot_fill_fails_as_kbcli_fails() {
    // A root that admits none of kbcli's own keys: every create fails before anything is created.
    let (_dir, chart) = chart_with_schema(|s| {
        s.as_object_mut().expect("schema").remove("patternProperties");
    });
    let err = kbcli_create(&chart, "pika-demo", "demo", &[]).expect_err("kbcli's own flags are refused");
    assert!(err.contains("Additional property dryRun is not allowed"), "{err}");
    // A nested property without a default: kbcli passes its zero value and overrides values.yaml.
    let (_dir, chart) = chart_with_schema(|s| {
        s["properties"]["etcd"]["properties"]["replicas"].as_object_mut().expect("replicas").remove("default");
    });
    let err = kbcli_create(&chart, "pika-demo", "demo", &[]).expect_err("etcd.replicas=0");
    assert!(err.contains("etcd.replicas") && err.contains("greater than or equal to 1"), "{err}");
    let (_dir, chart) = chart_with_schema(|s| {
        s["properties"]["etcd"]["properties"]["storage"].as_object_mut().expect("storage").remove("default");
    });
    let err = kbcli_create(&chart, "pika-demo", "demo", &[]).expect_err("an empty etcd storage size");
    assert!(err.contains("etcd.storage"), "{err}");
}

#[test]
fn every_kbcli_cluster_create_of_the_readme_creates_a_valid_cluster() {
    let commands = crate::support::readme_commands("kbcli cluster create pika");
    assert!(commands.len() >= 2, "the README shows kbcli cluster create: {commands:?}");
    for words in commands {
        let name = words[4].as_str();
        let mut namespace = "default";
        let mut given: Vec<(&str, &str)> = Vec::new();
        let mut i = 5;
        while i < words.len() {
            match words[i].as_str() {
                "-n" | "--namespace" => {
                    namespace = &words[i + 1];
                    i += 1;
                }
                flag => {
                    let (k, v) = flag
                        .strip_prefix("--")
                        .and_then(|f| f.split_once('='))
                        .unwrap_or_else(|| panic!("README: write flags as --name=value: {flag}"));
                    given.push((k, v));
                }
            }
            i += 1;
        }
        let docs = kbcli_create(&cluster_dir(), name, namespace, &given).unwrap_or_else(|e| panic!("{words:?}: {e}"));
        let c = find(&docs, "Cluster", name);
        for version in SCHEMA_VERSIONS {
            schemas(version).validate(&c.object).unwrap_or_else(|e| panic!("{words:?} [{version}]: {e:?}"));
        }
    }
}
