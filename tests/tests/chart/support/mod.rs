//! Renderings shared by the chart tests, each made once per test binary.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

use chart_tests::helm::{helm, Options};
use chart_tests::manifest::Doc;
use chart_tests::repo_root;

/// The addon chart's directory.
pub fn addon_dir() -> PathBuf {
    repo_root().join("addon")
}

/// The cluster chart's directory.
pub fn cluster_dir() -> PathBuf {
    repo_root().join("clusterdefs")
}

/// The KubeBlocks lines the addon renders for.
pub const LINES: [&str; 2] = ["1.0", "1.1"];

/// The addon rendered for a KubeBlocks line, as `helm install pika addon -n kb-system --set kubeblocksLine=<line>`.
pub fn addon(line: &str) -> &'static [Doc] {
    static V10: OnceLock<Vec<Doc>> = OnceLock::new();
    static V11: OnceLock<Vec<Doc>> = OnceLock::new();
    let cell = match line {
        "1.0" => &V10,
        "1.1" => &V11,
        other => panic!("no KubeBlocks line {other}"),
    };
    cell.get_or_init(|| {
        helm()
            .render(&addon_dir(), &Options::release("pika", "kb-system").set(&format!("kubeblocksLine={line}")))
            .unwrap_or_else(|e| panic!("addon ({line}) does not render: {e}"))
    })
}

/// The cluster chart with its default values, as `helm install mycluster clusterdefs -n demo`.
pub fn cluster() -> &'static [Doc] {
    static DOCS: OnceLock<Vec<Doc>> = OnceLock::new();
    DOCS.get_or_init(|| {
        helm()
            .render(&cluster_dir(), &Options::release("mycluster", "demo"))
            .unwrap_or_else(|e| panic!("cluster chart does not render: {e}"))
    })
}

/// Every example manifest of clusterdefs/examples.
pub fn examples() -> &'static [Doc] {
    static DOCS: OnceLock<Vec<Doc>> = OnceLock::new();
    DOCS.get_or_init(|| {
        let mut files: Vec<PathBuf> = std::fs::read_dir(cluster_dir().join("examples"))
            .expect("clusterdefs/examples")
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
            .collect();
        files.sort();
        helm().yaml_files(&files).unwrap_or_else(|e| panic!("examples do not parse: {e}"))
    })
}

/// The Addon object of addon/kubeblocks-addon.yaml.
pub fn addon_cr() -> &'static Doc {
    static DOC: OnceLock<Doc> = OnceLock::new();
    DOC.get_or_init(|| {
        let docs = helm()
            .yaml_files(&[addon_dir().join("kubeblocks-addon.yaml")])
            .unwrap_or_else(|e| panic!("kubeblocks-addon.yaml: {e}"));
        assert_eq!(docs.len(), 1, "kubeblocks-addon.yaml holds one object");
        docs.into_iter().next().expect("one object")
    })
}

/// The one ComponentDefinition whose name starts with `prefix` in a rendering.
pub fn cmpd<'a>(docs: &'a [Doc], prefix: &str) -> &'a Doc {
    let found: Vec<&Doc> =
        docs.iter().filter(|d| d.kind() == "ComponentDefinition" && d.name().starts_with(prefix)).collect();
    assert_eq!(found.len(), 1, "expected one ComponentDefinition named {prefix}*, found {}", found.len());
    found[0]
}

/// A named set of values for one of the charts.
pub struct ValueSet {
    /// What it is, for messages.
    pub name: &'static str,
    /// `--set` assignments.
    pub set: &'static [&'static str],
}

/// Value sets of the addon chart, each rendered for both lines.
pub const ADDON_VALUE_SETS: &[ValueSet] = &[
    ValueSet { name: "defaults", set: &[] },
    ValueSet {
        name: "own registry and image tags",
        set: &[
            "image.registry=registry.example.com",
            "image.action.tag=0.1.0-rc.1",
            "image.etcd.registry=mirror.example.com",
        ],
    },
    ValueSet { name: "shorter actions", set: &["action.timeoutSeconds=40", "action.budgetSeconds=30"] },
    ValueSet { name: "debug logs", set: &["codis.logLevel=DEBUG", "exporter.logLevel=debug", "etcd.logLevel=debug"] },
];

/// Value sets of the cluster chart (release `mycluster` in `demo`).
pub const CLUSTER_VALUE_SETS: &[ValueSet] = &[
    ValueSet { name: "defaults", set: &[] },
    ValueSet {
        name: "one shard of one pod",
        set: &["shards=1", "replicas=1", "etcd.replicas=1", "codisProxy.replicas=1"],
    },
    ValueSet {
        name: "many shards",
        set: &[
            "shards=64",
            "replicas=3",
            "storage=100Gi",
            "storageClassName=fast",
            "etcd.replicas=5",
            "etcd.storage=2Gi",
            "codisProxy.replicas=4",
            "codisFe.replicas=0",
            "monitoring=false",
        ],
    },
    ValueSet {
        name: "password from a Secret",
        set: &["passwordSecret=mycluster-password", "terminationPolicy=WipeOut"],
    },
    ValueSet { name: "name override", set: &["nameOverride=pika-prod"] },
];

/// A chart rendered with a value set, as `helm template <release> <chart> -n <namespace> --set ...`.
pub fn render_with(chart: &std::path::Path, release: &str, namespace: &str, set: &[&str]) -> Vec<Doc> {
    let mut opts = Options::release(release, namespace);
    for s in set {
        opts = opts.set(s);
    }
    helm().render(chart, &opts).unwrap_or_else(|e| panic!("{} with {set:?} does not render: {e}", chart.display()))
}

/// The KubeBlocks CRD schemas a line's rendering is for: v1.0.2 for 1.0, main for 1.1.
pub fn schema_version_of(line: &str) -> &'static str {
    match line {
        "1.0" => "v1.0.2",
        "1.1" => "main",
        other => panic!("no KubeBlocks line {other}"),
    }
}

/// The shell commands of addon/README.md's code blocks that start with `prefix`, continuation lines joined and
/// trailing comments dropped, split into words.
pub fn readme_commands(prefix: &str) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(addon_dir().join("README.md")).expect("addon/README.md");
    let mut in_block = false;
    let mut joined: Vec<String> = Vec::new();
    let mut pending = String::new();
    for line in text.lines() {
        if line.starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if !in_block {
            continue;
        }
        let code = line.split(" #").next().unwrap_or_default().trim_end();
        if let Some(head) = code.strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        pending.push_str(code);
        joined.push(std::mem::take(&mut pending));
    }
    joined
        .into_iter()
        .flat_map(|l| l.split("&&").map(str::trim).map(str::to_owned).collect::<Vec<_>>())
        .filter(|l| l.starts_with(prefix))
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect()
}
