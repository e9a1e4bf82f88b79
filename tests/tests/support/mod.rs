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
