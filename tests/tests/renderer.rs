//! chart-render against outputs `helm template` is known to produce, on a tiny chart (tests/tests/fixtures/tiny).

use std::path::PathBuf;

use chart_tests::render::{renderer, Options, Renderer};

fn tiny() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny")
}

fn template(opts: &Options) -> String {
    renderer().template(&tiny(), opts).unwrap_or_else(|e| panic!("tiny chart: {e}"))
}

/// The lines of the document rendered from `file`, after its `# Source:` line.
fn document(out: &str, file: &str) -> String {
    let header = format!("# Source: tiny/templates/{file}\n");
    let start = out.find(&header).unwrap_or_else(|| panic!("no {file} in:\n{out}")) + header.len();
    let rest = &out[start..];
    rest[..rest.find("\n---\n").map_or(rest.len(), |e| e + 1)].to_owned()
}

#[test]
fn include_and_nindent_indent_a_named_template_like_helm() {
    let out = template(&Options::release("rel", "ns"));
    assert!(out.starts_with("---\n# Source: tiny/templates/configmap.yaml\n"), "{out}");
    assert!(out.contains("  labels:\n    app: demo\n    chart: tiny-1.2.3\n"), "{out}");
    assert!(out.contains("  name: rel-demo\n  namespace: ns\n"), "{out}");
}

#[test]
fn to_yaml_sorts_keys_and_writes_lists_as_helm_does() {
    let out = template(&Options::default());
    assert!(
        out.contains("  ports: |\n    - name: http\n      port: 80\n    - name: admin\n      port: 8080\n"),
        "{out}"
    );
    assert!(out.contains("  labels: |\n    a: one\n    b: two\n"), "{out}");
}

#[test]
fn values_are_float64_as_in_helm_so_big_numbers_print_in_exponent_form() {
    // Helm reads values.yaml through JSON: 268435456 becomes float64 and `{{ . }}` prints 2.68435456e+08.
    let out = template(&Options::default());
    assert!(out.contains("  big: \"2.68435456e+08\"\n"), "{out}");
    assert!(out.contains("  bigInt: \"268435456\"\n"), "{out}");
    assert!(out.contains("  replicas: \"3\"\n"), "{out}");
}

#[test]
fn missing_values_render_empty_and_default_fills_them() {
    let out = template(&Options::default());
    assert!(out.contains("  missing: \"\"\n"), "`<no value>` is removed as Helm does: {out}");
    assert!(out.contains("  fallback: dflt\n"), "{out}");
}

#[test]
fn required_fails_the_rendering_with_helms_message() {
    let err = renderer().template(&tiny(), &Options::default().set("check.value=")).expect_err("required");
    assert_eq!(err, "Error: execution error at (tiny/templates/required.yaml:2:10): check.value is required");
    let out = template(&Options::default().set("check.value=7"));
    assert_eq!(document(&out, "required.yaml"), "value: 7\n");
}

#[test]
fn chart_release_template_files_tpl_and_capabilities_are_available() {
    let out = template(&Options::default());
    assert!(out.contains("  app: \"9.8\"\n"), "{out}");
    assert!(out.contains("  template: tiny/templates/configmap.yaml\n"), "{out}");
    assert!(out.contains("  file: \"alpha\"\n"), "{out}");
    assert!(out.contains("  tpl: demo-x\n"), "{out}");
    assert!(out.contains("  kube: \"33\"\n"), "{out}");
    assert!(out.contains("data:\n  a.txt: |\n    alpha\n  b.txt: |\n    beta\n"), "Files.Glob.AsConfig: {out}");
}

#[test]
fn every_document_gets_its_source_line_and_partials_and_notes_are_not_rendered() {
    let out = template(&Options::default());
    assert_eq!(out.matches("# Source: tiny/templates/configmap.yaml\n").count(), 2, "{out}");
    assert!(out.contains("# Source: tiny/templates/configmap.yaml\n# a second document in the same file\n"), "{out}");
    assert!(!out.contains("_helpers.tpl") && !out.contains("NOTES"), "{out}");
    assert!(!out.contains("required.yaml"), "a template rendering to nothing is left out: {out}");
}

#[test]
fn set_values_are_typed_like_helm_and_values_files_merge() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("override.yaml");
    std::fs::write(&file, "labels:\n  c: three\nnested:\n  drop: null\n").expect("write");
    let docs = renderer()
        .render(&tiny(), &Options::default().set("replicas=5").set("name=007").values(&file))
        .expect("renders");
    let cm = &docs[0].object;
    assert_eq!(cm["data"]["replicas"], "5");
    assert_eq!(cm["metadata"]["name"], "release-name-007", "a leading zero keeps --set values strings");
    assert_eq!(cm["data"]["labels"], "a: one\nb: two\nc: three\n", "maps merge");
}

#[test]
fn json_output_is_what_kubectl_would_send() {
    let docs = renderer().render(&tiny(), &Options::default()).expect("renders");
    assert_eq!(docs.len(), 2);
    assert_eq!(docs[0].source, "tiny/templates/configmap.yaml");
    assert_eq!((docs[0].index, docs[1].index), (0, 1));
    assert_eq!(docs[1].object["metadata"]["name"], "second");
    // YAML 1.1 as Kubernetes reads it: an unquoted `0444` is octal.
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("m.yaml");
    std::fs::write(&f, "a: 0444\nb: \"0444\"\nc: 1.0\n---\n# only a comment\n").expect("write");
    let docs = renderer().yaml_to_json(&[f]).expect("converts");
    assert_eq!(docs.len(), 1, "a comment-only document is no object");
    assert_eq!(docs[0].object, serde_json::json!({"a": 292, "b": "0444", "c": 1}));
}

#[test]
fn a_machine_without_go_fails_with_what_to_install() {
    let err = Renderer::build_with(None).expect_err("no go");
    assert!(err.contains("scripts/setup.sh") && err.contains("golang-go"), "{err}");
}

#[test]
fn values_are_checked_against_values_schema_json_with_helms_message() {
    let chart = chart_tests::repo_root().join("clusterdefs");
    let err =
        renderer().template(&chart, &Options::default().set("shards=0").set("shard=3")).expect_err("invalid values");
    assert_eq!(
        err,
        "Error: values don't meet the specifications of the schema(s) in the following chart(s):\npika-cluster:\n\
         - (root): Additional property shard is not allowed\n- shards: Must be greater than or equal to 1"
    );
}
