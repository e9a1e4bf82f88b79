//! The real Helm on both charts: `helm lint --strict` for both lines and every value set, `helm package` of both,
//! a chart repository kbcli can pull the cluster chart from, values the charts refuse, and the install-time check
//! of the KubeBlocks line against a KubeBlocks API (`lookup`, served by a minimal API server).

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::support::{addon_cr, addon_dir, cluster_dir, ADDON_VALUE_SETS, CLUSTER_VALUE_SETS, LINES};
use chart_tests::helm::{helm, Options};
use chart_tests::manifest::str_at;
use serde_json::{json, Value};

#[test]
fn helm_lint_strict_passes_both_charts_for_both_lines_and_every_value_set() {
    let mut linted = 0;
    for line in LINES {
        for vs in ADDON_VALUE_SETS {
            let mut opts = Options::release("pika", "kb-system").set(&format!("kubeblocksLine={line}"));
            for s in vs.set {
                opts = opts.set(s);
            }
            let out = helm().lint(&addon_dir(), &opts).unwrap_or_else(|e| panic!("addon {line} {}: {e}", vs.name));
            assert!(out.contains("1 chart(s) linted, 0 chart(s) failed"), "{out}");
            linted += 1;
        }
    }
    for vs in CLUSTER_VALUE_SETS {
        let mut opts = Options::release("mycluster", "demo");
        for s in vs.set {
            opts = opts.set(s);
        }
        let out = helm().lint(&cluster_dir(), &opts).unwrap_or_else(|e| panic!("cluster chart {}: {e}", vs.name));
        assert!(out.contains("0 chart(s) failed"), "{out}");
        linted += 1;
    }
    eprintln!("helm {}: {linted} lint --strict runs", helm().version);
}

#[test]
fn helm_lint_strict_fails_on_a_broken_chart() {
    // The lint the test above relies on does catch values the chart's schema refuses. (A template's `fail` it only
    // logs: Helm lints in lint mode; `helm template` below stops at it.)
    let err = helm().lint(&addon_dir(), &Options::default().set("kubeblocksLine=2.0")).expect_err("line 2.0");
    assert!(err.contains("kubeblocksLine must be one of the following: \"1.0\", \"1.1\""), "{err}");
    let err = helm().lint(&cluster_dir(), &Options::default().set("shards=0")).expect_err("no shard");
    assert!(err.contains("shards: Must be greater than or equal to 1"), "{err}");
}

#[test]
fn values_the_charts_refuse_stop_the_rendering_with_a_message_naming_them() {
    let addon_err = |set: &[&str]| {
        let mut opts = Options::release("pika", "kb-system");
        for s in set {
            opts = opts.set(s);
        }
        helm().template(&addon_dir(), &opts).expect_err("the addon must refuse")
    };
    assert!(addon_err(&["kubeblocksLine=1.2"]).contains("kubeblocksLine"));
    assert!(addon_err(&["kubeblocksLine=1"]).contains("kubeblocksLine"), "--set makes 1 a number");
    assert!(addon_err(&["action.timeoutSeconds=40", "action.budgetSeconds=45"])
        .contains("action.budgetSeconds must stay below"));
    assert!(
        addon_err(&["action.timeoutSeconds=90"]).contains("action.timeoutSeconds: Must be less than or equal to 60")
    );
    assert!(addon_err(&["codis.logLevel=TRACE"]).contains("codis.logLevel"));
    let cluster_err = |set: &str| {
        helm().template(&cluster_dir(), &Options::release("pika-demo", "demo").set(set)).expect_err("refused")
    };
    assert!(cluster_err("shards=0").contains("shards: Must be greater than or equal to 1"));
    assert!(cluster_err("replicas=0").contains("replicas"));
    assert!(cluster_err("terminationPolicy=Halt").contains("terminationPolicy"));
}

#[test]
fn helm_package_builds_both_charts_into_a_repository_kbcli_pulls_the_cluster_chart_from() {
    let dir = tempfile::tempdir().expect("tempdir");
    let addon = helm().package(&addon_dir(), dir.path()).expect("addon packages");
    let cluster = helm().package(&cluster_dir(), dir.path()).expect("cluster chart packages");
    let cr = &addon_cr().object;
    let name = str_at(cr, "metadata.name");
    let version = cr["metadata"]["labels"]["addon.kubeblocks.io/version"].as_str().expect("version label");
    // The Addon's chart URL names the addon archive.
    let file = |p: &PathBuf| p.file_name().and_then(|f| f.to_str()).expect("file name").to_owned();
    assert!(str_at(cr, "spec.helm.chartLocationURL").ends_with(&format!("/{}", file(&addon))));
    // kbcli addon install / enable then pull `<addon>-cluster` at the addon's version (the label
    // addon.kubeblocks.io/version) from --cluster-chart-repo.
    assert_eq!(file(&cluster), format!("{name}-cluster-{version}.tgz"));
    let out =
        helm().run(&["repo".into(), "index".into(), dir.path().display().to_string()], &[]).expect("helm repo index");
    assert!(out.trim().is_empty(), "{out}");
    let index = helm().yaml_files(&[dir.path().join("index.yaml")]).expect("index.yaml").remove(0).object;
    for chart in [name.to_owned(), format!("{name}-cluster")] {
        let entries =
            index["entries"][&chart].as_array().unwrap_or_else(|| panic!("{chart} not in the index: {index}"));
        assert!(entries.iter().any(|e| e["version"] == version), "{chart} {version}: {entries:?}");
    }
    // An archive renders like the directory it came from.
    let from_archive = helm().render(&cluster, &Options::release("pika-demo", "demo")).expect("renders");
    let from_dir = helm().render(&cluster_dir(), &Options::release("pika-demo", "demo")).expect("renders");
    assert_eq!(
        from_archive.iter().map(|d| &d.object).collect::<Vec<_>>(),
        from_dir.iter().map(|d| &d.object).collect::<Vec<_>>()
    );
}

#[test]
fn the_addon_object_installs_itself_with_the_default_line() {
    let cr = &addon_cr().object;
    // KubeBlocks installs an Addon whose installable.autoInstall is true as soon as it exists, as upstream addons do.
    assert_eq!(cr["spec"]["installable"]["autoInstall"], true);
    let set: Vec<&str> = cr["spec"]["helm"]["installValues"]["setValues"]
        .as_array()
        .expect("setValues")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(set, ["kubeblocksLine=1.0"]);
    // kbcli's addon model label makes it an engine addon: install and enable register its cluster chart.
    assert!(cr["metadata"]["labels"].get("addon.kubeblocks.io/model").is_some());
}

/// A minimal Kubernetes API: what `helm template --dry-run=server` asks for a `lookup` of Deployments (discovery of
/// apps/v1, then the list), answering with the given Deployments of kb-system; 404 for anything else.
struct FakeApi {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    _dir: tempfile::TempDir,
    kubeconfig: PathBuf,
}

impl FakeApi {
    fn serve(deployments: Vec<Value>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(mut conn) = conn else { continue };
                let mut reader = BufReader::new(conn.try_clone().expect("clone"));
                let mut request = String::new();
                if reader.read_line(&mut request).is_err() {
                    continue;
                }
                // Drain the headers.
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    line.clear();
                }
                let path = request.split_whitespace().nth(1).unwrap_or("/").split('?').next().unwrap_or("/").to_owned();
                let (code, body) = match path.as_str() {
                    "/apis/apps/v1" => (
                        200,
                        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "apps/v1",
                        "resources": [{"name": "deployments", "singularName": "deployment", "namespaced": true,
                                       "kind": "Deployment", "verbs": ["get", "list"]}]}),
                    ),
                    "/apis/apps/v1/namespaces/kb-system/deployments" => (
                        200,
                        json!({"kind": "DeploymentList",
                        "apiVersion": "apps/v1", "metadata": {}, "items": deployments}),
                    ),
                    _ => (404, json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404})),
                };
                let body = body.to_string();
                let reason = if code == 200 { "OK" } else { "Not Found" };
                let _ = write!(
                    conn,
                    "HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: \"http://127.0.0.1:{port}\"}}}}]\n\
                 users: [{{name: u, user: {{}}}}]\ncontexts: [{{name: x, context: {{cluster: c, user: u}}}}]\ncurrent-context: x\n"
            ),
        )
        .expect("kubeconfig");
        Self { port, stop, thread: Some(thread), _dir: dir, kubeconfig }
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = std::net::TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn kubeblocks(version: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "kubeblocks", "namespace": "kb-system",
        "labels": {"app.kubernetes.io/name": "kubeblocks", "app.kubernetes.io/component": "apps",
                   "app.kubernetes.io/version": version}}})
}

/// `helm install pika addon -n kb-system --set kubeblocksLine=<line>` on a cluster running these Deployments.
fn install_on(line: &str, deployments: Vec<Value>) -> Result<String, String> {
    install_with(line, deployments, &[])
}

fn install_with(line: &str, deployments: Vec<Value>, set: &[&str]) -> Result<String, String> {
    let api = FakeApi::serve(deployments);
    let mut opts = Options::release("pika", "kb-system");
    for s in set {
        opts = opts.set(s);
    }
    let opts = opts.set(&format!("kubeblocksLine={line}")).arg("--dry-run=server").env("KUBECONFIG", &api.kubeconfig);
    helm().template(&addon_dir(), &opts)
}

#[test]
fn installing_the_addon_for_the_other_line_than_the_running_kubeblocks_fails_naming_the_fix() {
    for (line, version) in
        [("1.0", "1.0.2"), ("1.0", "1.0.3-beta.11"), ("1.1", "1.1.0-beta.9"), ("1.1", "1.2.0-alpha.3")]
    {
        install_on(line, vec![kubeblocks(version)]).unwrap_or_else(|e| panic!("{line} on KubeBlocks {version}: {e}"));
    }
    let err = install_on("1.0", vec![kubeblocks("1.1.0-beta.9")]).expect_err("a 1.0 chart on 1.1");
    assert!(
        err.contains("kubeblocksLine is \"1.0\" but KubeBlocks 1.1.0-beta.9 runs in kb-system")
            && err.contains("--set kubeblocksLine=1.1"),
        "{err}"
    );
    let err = install_on("1.1", vec![kubeblocks("v1.0.2")]).expect_err("a 1.1 chart on 1.0");
    assert!(err.contains("KubeBlocks 1.0.2") && err.contains("--set kubeblocksLine=1.0"), "{err}");
    let err = install_on("1.0", vec![kubeblocks("0.9.3")]).expect_err("0.9");
    assert!(err.contains("older than 1.0"), "{err}");
    // Not a KubeBlocks deployment (another component, or no labels), or none at all: nothing to check against.
    let mut dataprotection = kubeblocks("1.1.0");
    dataprotection["metadata"]["labels"]["app.kubernetes.io/component"] = json!("dataprotection");
    install_on("1.0", vec![dataprotection]).expect("not the apps deployment");
    install_on("1.0", vec![json!({"metadata": {"name": "other", "namespace": "kb-system"}})]).expect("no labels");
    install_on("1.1", vec![]).expect("no KubeBlocks here");
    // The check can be switched off (an installer that may not list Deployments); pika-action still refuses.
    install_with("1.0", vec![kubeblocks("1.1.0")], &["kubeblocksLineCheck=false"]).expect("check off");
}

#[test]
fn every_helm_install_and_upgrade_of_the_readme_renders() {
    let mut commands = crate::support::readme_commands("helm install");
    commands.extend(crate::support::readme_commands("helm upgrade"));
    assert!(commands.len() >= 4, "the README shows helm install and upgrade: {commands:?}");
    let root = chart_tests::repo_root();
    for words in commands {
        let mut args = vec!["template".to_owned()];
        for w in &words[2..] {
            match w.as_str() {
                // helm template has no stored release to reuse: the chart's values stand in for it.
                "--reuse-values" => {}
                chart if chart.starts_with("./") => args.push(root.join(&chart[2..]).display().to_string()),
                other => args.push(other.to_owned()),
            }
        }
        let out = helm().run(&args, &[]).unwrap_or_else(|e| panic!("{words:?}: {e}"));
        assert!(out.contains("kind: "), "{words:?} renders nothing");
    }
}
