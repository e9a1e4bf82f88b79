//! Validation of objects against the CRD schemas, as the API server does it on create and on update.
//!
//! Each object is matched to its CRD by group and kind, to the schema of its version (which must be served),
//! defaulted from the schema's `default`s (the API server defaults before it validates, so rules see defaults), and
//! validated in three passes:
//!
//! 1. JSON Schema (the `jsonschema` crate) over the `openAPIV3Schema` translated to draft 4: `nullable` becomes a
//!    `null` type, `x-kubernetes-int-or-string` an integer-or-string, and every object node that neither preserves
//!    unknown fields nor declares `additionalProperties` rejects fields it does not define (the API server prunes
//!    them, or with strict field validation, the kubectl default, rejects them: a misspelt field must fail);
//! 2. the Kubernetes extensions JSON Schema does not know: `x-kubernetes-list-type: map|set` uniqueness (with the
//!    schema defaults of missing keys) and every `x-kubernetes-validations` CEL rule, evaluated by [`crate::cel`] on
//!    the node it is attached to (transition rules against the old object on an update);
//! 3. `metadata` as ObjectMeta: a DNS-subdomain name, well-formed label keys and values, string annotations.
//!
//! Core kinds (ConfigMap, Secret, Service, ...) have no CRD here; they must parse and name themselves.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

use jsonschema::{Draft, Validator};
use serde_json::{json, Map, Value};

use crate::cel::{Outcome, Rule};
use crate::helm::helm;
use crate::manifest::Doc;

/// Core kinds accepted without a CRD (their group is "" or a Kubernetes API group).
pub const CORE_KINDS: &[&str] =
    &["ConfigMap", "Secret", "Service", "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"];

/// The CRDs of one KubeBlocks release line, with compiled validators.
pub struct SchemaSet {
    /// `v1.0.2` or `main`.
    pub version: String,
    crds: HashMap<(String, String), Value>,
    compiled: Mutex<HashMap<(String, String), Arc<Compiled>>>,
}

struct Compiled {
    validator: Validator,
    original: Value,
}

/// One CEL rule evaluated on one node.
#[derive(Debug, Clone)]
pub struct CelCheck {
    /// `Kind/apiVersion` of the object.
    pub kind: String,
    /// Where the rule is attached, in the object (`spec.shardsLimit`, `spec.releases.0.images`).
    pub path: String,
    /// Where the rule is attached, in the schema (`spec.releases[].images`): the same for every object.
    pub schema_path: String,
    /// The rule's text.
    pub rule: String,
    /// What it said.
    pub outcome: Outcome,
}

/// Everything one validation found.
#[derive(Debug, Default)]
pub struct Report {
    /// Problems, as `path: message` lines.
    pub errors: Vec<String>,
    /// Every CEL rule evaluated (or skipped as a transition rule without an old value).
    pub cel: Vec<CelCheck>,
}

static SETS: OnceLock<Mutex<HashMap<String, &'static SchemaSet>>> = OnceLock::new();

/// The schema set of a release line (`v1.0.2` or `main`), loaded once per test binary.
///
/// # Panics
/// When the CRD directory is missing or a CRD does not parse.
#[must_use]
pub fn schemas(version: &str) -> &'static SchemaSet {
    let sets = SETS.get_or_init(|| Mutex::new(HashMap::new()));
    let mut sets = sets.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(s) = sets.get(version) {
        return s;
    }
    let set: &'static SchemaSet = Box::leak(Box::new(SchemaSet::load(version)));
    sets.insert(version.to_owned(), set);
    set
}

impl SchemaSet {
    fn load(version: &str) -> Self {
        let dir = crate::crds_dir(version);
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| {
                panic!("CRD schemas {}: {e} (the shared directory sits beside the repository)", dir.display())
            })
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
            .collect();
        files.sort();
        assert!(!files.is_empty(), "no CRDs in {}", dir.display());
        let docs = helm().yaml_files(&files).unwrap_or_else(|e| panic!("CRDs of {version}: {e}"));
        let mut crds = HashMap::new();
        for d in docs {
            let group = d.object["spec"]["group"].as_str().unwrap_or_default().to_owned();
            let kind = d.object["spec"]["names"]["kind"].as_str().unwrap_or_default().to_owned();
            crds.insert((group, kind), d.object);
        }
        Self { version: version.to_owned(), crds, compiled: Mutex::new(HashMap::new()) }
    }

    /// Whether this line has a CRD for that apiVersion's group and that kind.
    #[must_use]
    pub fn has_crd(&self, api_version: &str, kind: &str) -> bool {
        let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
        self.crds.contains_key(&(group.to_owned(), kind.to_owned()))
    }

    /// Every CRD of this line.
    pub fn crds(&self) -> impl Iterator<Item = &Value> {
        self.crds.values()
    }

    fn compiled(&self, api_version: &str, kind: &str) -> Result<Arc<Compiled>, String> {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let key = (api_version.to_owned(), kind.to_owned());
        if let Some(c) = self.compiled.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&key) {
            return Ok(Arc::clone(c));
        }
        let crd = self
            .crds
            .get(&(group.to_owned(), kind.to_owned()))
            .ok_or_else(|| format!("KubeBlocks {} has no CRD for {kind} in group {group}", self.version))?;
        let entry = crd["spec"]["versions"]
            .as_array()
            .and_then(|vs| vs.iter().find(|v| v["name"] == version))
            .ok_or_else(|| format!("KubeBlocks {} does not define {kind} {version}", self.version))?;
        if entry["served"] != json!(true) {
            return Err(format!("KubeBlocks {} does not serve {kind} {version}", self.version));
        }
        let original = entry["schema"]["openAPIV3Schema"].clone();
        let translated = translate(&original, true);
        let validator = jsonschema::options()
            .with_draft(Draft::Draft4)
            .should_validate_formats(false)
            .build(&translated)
            .map_err(|e| format!("schema of {kind} {version} ({}) does not compile: {e}", self.version))?;
        let compiled = Arc::new(Compiled { validator, original });
        self.compiled.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(key, Arc::clone(&compiled));
        Ok(compiled)
    }

    /// The schema of an object's kind and version, if this line serves it.
    #[must_use]
    pub fn schema_of(&self, obj: &Value) -> Option<Value> {
        let api_version = obj["apiVersion"].as_str().unwrap_or_default();
        let kind = obj["kind"].as_str().unwrap_or_default();
        self.compiled(api_version, kind).ok().map(|c| c.original.clone())
    }

    /// Validates one object as a create; every problem found and every CEL rule evaluated.
    #[must_use]
    pub fn check(&self, obj: &Value, old: Option<&Value>) -> Report {
        let mut report = Report::default();
        let api_version = obj["apiVersion"].as_str().unwrap_or_default();
        let kind = obj["kind"].as_str().unwrap_or_default();
        if api_version.is_empty() || kind.is_empty() {
            report.errors.push("apiVersion and kind are required".into());
            return report;
        }
        check_metadata(obj, &mut report.errors);
        if self.has_crd(api_version, kind) {
            match self.compiled(api_version, kind) {
                Ok(c) => {
                    let mut obj = obj.clone();
                    apply_defaults(&mut obj, &c.original);
                    let old = old.map(|o| {
                        let mut o = o.clone();
                        apply_defaults(&mut o, &c.original);
                        o
                    });
                    for e in c.validator.iter_errors(&obj) {
                        report.errors.push(format!("{}: {e}", pointer(e.instance_path().as_str())));
                    }
                    let mut walk = Walk { kind: format!("{kind}/{api_version}"), report: &mut report };
                    walk.node(&c.original, &obj, old.as_ref(), "", "", true);
                }
                Err(e) => report.errors.push(e),
            }
        } else if !CORE_KINDS.contains(&kind) {
            report.errors.push(format!("no schema for {kind} ({api_version}) in KubeBlocks {}", self.version));
        } else if kind == "ConfigMap" {
            if let Some(data) = obj.get("data") {
                match data.as_object() {
                    Some(m) => report.errors.extend(
                        m.iter().filter(|(_, v)| !v.is_string()).map(|(k, _)| format!("data.{k}: not a string")),
                    ),
                    None => report.errors.push("data: not a map".into()),
                }
            }
        }
        report
    }

    /// Validates one object as a create.
    ///
    /// # Errors
    /// The list of problems when there is at least one.
    pub fn validate(&self, obj: &Value) -> Result<(), Vec<String>> {
        let r = self.check(obj, None);
        if r.errors.is_empty() {
            Ok(())
        } else {
            Err(r.errors)
        }
    }

    /// Validates an update of `old` to `new`: everything a create checks, plus the transition rules.
    ///
    /// # Errors
    /// The list of problems when there is at least one.
    pub fn validate_update(&self, old: &Value, new: &Value) -> Result<(), Vec<String>> {
        let r = self.check(new, Some(old));
        if r.errors.is_empty() {
            Ok(())
        } else {
            Err(r.errors)
        }
    }

    /// Validates documents; problems prefixed with the document, the number validated against a CRD, and every CEL
    /// rule evaluated.
    #[must_use]
    pub fn validate_all(&self, docs: &[Doc]) -> (usize, Vec<String>, Vec<CelCheck>) {
        let mut problems = Vec::new();
        let mut cel = Vec::new();
        let mut with_crd = 0;
        for d in docs {
            if self.has_crd(d.api_version(), d.kind()) {
                with_crd += 1;
            }
            let r = self.check(&d.object, None);
            for e in r.errors {
                problems.push(format!("[{}] {}/{} ({}): {e}", self.version, d.kind(), d.name(), d.source));
            }
            cel.extend(r.cel);
        }
        (with_crd, problems, cel)
    }
}

fn pointer(p: &str) -> String {
    if p.is_empty() {
        "(root)".into()
    } else {
        p.trim_start_matches('/').replace('/', ".")
    }
}

/// Structural defaulting as the API server does it before validation: a missing property that has a `default` gets
/// it (and so does a null one that is not nullable), in objects, list items and map values that exist.
pub fn apply_defaults(node: &mut Value, schema: &Value) {
    match node {
        Value::Object(m) => {
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (k, sub) in props {
                    let Some(default) = sub.get("default") else { continue };
                    let nullable = sub.get("nullable") == Some(&Value::Bool(true));
                    match m.get(k) {
                        None => {
                            m.insert(k.clone(), default.clone());
                        }
                        Some(Value::Null) if !nullable => {
                            m.insert(k.clone(), default.clone());
                        }
                        Some(_) => {}
                    }
                }
                for (k, v) in m.iter_mut() {
                    if let Some(sub) = props.get(k) {
                        apply_defaults(v, sub);
                    }
                }
            } else if let Some(extra) = schema.get("additionalProperties").filter(|a| a.is_object()) {
                for v in m.values_mut() {
                    apply_defaults(v, extra);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for i in items {
                    apply_defaults(i, item_schema);
                }
            }
        }
        _ => {}
    }
}
/// OpenAPI v3 as Kubernetes uses it, to JSON Schema draft 4 with Kubernetes' pruning made strict.
#[must_use]
pub fn translate(s: &Value, root: bool) -> Value {
    let Value::Object(m) = s else { return s.clone() };
    let mut out = Map::new();
    for (k, v) in m {
        match k.as_str() {
            "description" | "format" | "default" | "example" | "nullable" => {}
            k if k.starts_with("x-kubernetes-") => {}
            "properties" | "patternProperties" => {
                let props = v
                    .as_object()
                    .map(|p| {
                        p.iter()
                            .map(|(name, sub)| {
                                // ObjectMeta is validated by check_metadata (the CRD says only `type: object`).
                                let sub = if root && name == "metadata" {
                                    json!({"type": "object"})
                                } else {
                                    translate(sub, false)
                                };
                                (name.clone(), sub)
                            })
                            .collect::<Map<_, _>>()
                    })
                    .unwrap_or_default();
                out.insert(k.clone(), Value::Object(props));
            }
            "items" | "not" => {
                out.insert(k.clone(), translate(v, false));
            }
            "additionalProperties" => {
                out.insert(k.clone(), if v.is_boolean() { v.clone() } else { translate(v, false) });
            }
            "allOf" | "anyOf" | "oneOf" => {
                let list = v.as_array().map(|a| a.iter().map(|x| translate(x, false)).collect()).unwrap_or_default();
                out.insert(k.clone(), Value::Array(list));
            }
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    let flag = |name: &str| m.get(name) == Some(&Value::Bool(true));
    if flag("x-kubernetes-int-or-string") {
        out.remove("type");
        out.entry("anyOf").or_insert_with(|| json!([{"type": "integer"}, {"type": "string"}]));
    }
    if flag("x-kubernetes-embedded-resource") {
        let props = out.entry("properties").or_insert_with(|| json!({}));
        if let Value::Object(p) = props {
            p.entry("apiVersion").or_insert_with(|| json!({"type": "string"}));
            p.entry("kind").or_insert_with(|| json!({"type": "string"}));
            p.entry("metadata").or_insert_with(|| json!({"type": "object"}));
        }
    }
    if flag("nullable") {
        if let Some(Value::String(t)) = out.get("type").cloned() {
            out.insert("type".into(), json!([t, "null"]));
        }
        if let Some(Value::Array(e)) = out.get_mut("enum") {
            e.push(Value::Null);
        }
    }
    let is_object = out.get("type") == Some(&json!("object")) || out.contains_key("properties");
    let preserves = flag("x-kubernetes-preserve-unknown-fields") || flag("x-kubernetes-embedded-resource");
    if is_object && !preserves && !out.contains_key("additionalProperties") {
        out.insert("additionalProperties".into(), Value::Bool(false));
    }
    Value::Object(out)
}

/// A pass over the original schema, the (defaulted) object and the old object together, for what JSON Schema cannot
/// say.
struct Walk<'r> {
    kind: String,
    report: &'r mut Report,
}

impl Walk<'_> {
    fn node(&mut self, schema: &Value, node: &Value, old: Option<&Value>, path: &str, schema_path: &str, root: bool) {
        let here = if path.is_empty() { "(root)" } else { path };
        if let Some(rules) = schema.get("x-kubernetes-validations").and_then(Value::as_array) {
            for rule in rules {
                let text = rule["rule"].as_str().unwrap_or_default();
                let outcome = match Rule::compile(text) {
                    Ok(r) => r.evaluate(node, schema, old, root),
                    Err(e) => Outcome::Failed(e),
                };
                let message = rule["message"].as_str().map(|m| format!(" ({m})")).unwrap_or_default();
                match &outcome {
                    Outcome::Holds | Outcome::NoOldSelf => {}
                    Outcome::Violated => self.report.errors.push(format!("{here}: violates {text:?}{message}")),
                    Outcome::Failed(e) => {
                        self.report.errors.push(format!("{here}: {text:?} cannot be evaluated: {e}{message}"));
                    }
                    Outcome::NotModelled(f) => self
                        .report
                        .errors
                        .push(format!("{here}: {text:?} calls {f}, which the chart tests' CEL does not model")),
                }
                self.report.cel.push(CelCheck {
                    kind: self.kind.clone(),
                    path: here.to_owned(),
                    schema_path: if schema_path.is_empty() { "(root)".into() } else { schema_path.to_owned() },
                    rule: text.to_owned(),
                    outcome,
                });
            }
        }
        let join = |base: &str, seg: &str| match seg {
            _ if base.is_empty() => seg.to_owned(),
            "[]" | "{}" => format!("{base}{seg}"),
            _ => format!("{base}.{seg}"),
        };
        match node {
            Value::Object(m) => {
                let props = schema.get("properties").and_then(Value::as_object);
                let extra = schema.get("additionalProperties").filter(|a| a.is_object());
                for (k, v) in m {
                    let (sub, seg) = match props.and_then(|p| p.get(k)) {
                        Some(s) => (Some(s), k.clone()),
                        None => (extra, "{}".to_owned()),
                    };
                    if let Some(sub) = sub {
                        // The metadata of embedded objects is ObjectMeta; its schema here is only `type: object`.
                        if root && k == "metadata" {
                            continue;
                        }
                        let old_v = old.and_then(|o| o.get(k));
                        self.node(sub, v, old_v, &join(path, k), &join(schema_path, &seg), false);
                    }
                }
            }
            Value::Array(items) => {
                let Some(item_schema) = schema.get("items") else { return };
                let list_type = schema.get("x-kubernetes-list-type").and_then(Value::as_str);
                let keys: Vec<&str> = schema
                    .get("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array)
                    .map(|k| k.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let key_of = |item: &Value| -> Vec<String> {
                    keys.iter()
                        .map(|k| {
                            item.get(*k)
                                .or_else(|| item_schema["properties"][*k].get("default"))
                                .map(Value::to_string)
                                .unwrap_or_default()
                        })
                        .collect()
                };
                match list_type {
                    Some("map") => {
                        let mut seen = HashSet::new();
                        for item in items {
                            let key = key_of(item);
                            if !seen.insert(key.clone()) {
                                self.report.errors.push(format!("{here}: duplicate entry with {keys:?} = {key:?}"));
                            }
                        }
                    }
                    Some("set") => {
                        let mut seen = HashSet::new();
                        for item in items {
                            if !seen.insert(item.to_string()) {
                                self.report.errors.push(format!("{here}: duplicate set entry {item}"));
                            }
                        }
                    }
                    _ => {}
                }
                for (i, item) in items.iter().enumerate() {
                    // Only items of map lists correlate with the old object (by their keys).
                    let old_item = match list_type {
                        Some("map") => {
                            old.and_then(Value::as_array).and_then(|o| o.iter().find(|x| key_of(x) == key_of(item)))
                        }
                        _ => None,
                    };
                    self.node(
                        item_schema,
                        item,
                        old_item,
                        &join(path, &i.to_string()),
                        &join(schema_path, "[]"),
                        false,
                    );
                }
            }
            _ => {}
        }
    }
}

/// The fields of ObjectMeta.
const OBJECT_META_FIELDS: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "labels",
    "annotations",
    "finalizers",
    "ownerReferences",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
];

/// ObjectMeta as the API server checks it on create.
fn check_metadata(obj: &Value, errors: &mut Vec<String>) {
    let Some(meta) = obj.get("metadata").and_then(Value::as_object) else {
        errors.push("metadata: missing".into());
        return;
    };
    for k in meta.keys() {
        if !OBJECT_META_FIELDS.contains(&k.as_str()) {
            errors.push(format!("metadata.{k}: unknown field"));
        }
    }
    match meta.get("name").and_then(Value::as_str) {
        Some(name) if is_dns_subdomain(name) => {}
        Some(name) => errors.push(format!("metadata.name: {name:?} is not a DNS-1123 subdomain")),
        None if meta.contains_key("generateName") => {}
        None => errors.push("metadata.name: missing".into()),
    }
    if let Some(ns) = meta.get("namespace") {
        if !ns.as_str().is_some_and(is_dns_label) {
            errors.push(format!("metadata.namespace: {ns} is not a DNS-1123 label"));
        }
    }
    let string_map = |field: &str, errors: &mut Vec<String>| -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        if let Some(v) = meta.get(field) {
            match v.as_object() {
                Some(m) => {
                    for (k, v) in m {
                        match v.as_str() {
                            Some(s) => {
                                out.insert(k.clone(), s.to_owned());
                            }
                            None => errors.push(format!("metadata.{field}.{k}: {v} is not a string")),
                        }
                    }
                }
                None => errors.push(format!("metadata.{field}: not a map")),
            }
        }
        out
    };
    for (k, v) in string_map("labels", errors) {
        if !is_qualified_name(&k) {
            errors.push(format!("metadata.labels: {k:?} is not a valid label key"));
        }
        if !is_label_value(&v) {
            errors.push(format!("metadata.labels.{k}: {v:?} is not a valid label value"));
        }
    }
    for k in string_map("annotations", errors).keys() {
        if !is_qualified_name(k) {
            errors.push(format!("metadata.annotations: {k:?} is not a valid annotation key"));
        }
    }
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

fn is_name_part(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
}

fn is_qualified_name(s: &str) -> bool {
    match s.split_once('/') {
        Some((prefix, name)) => is_dns_subdomain(prefix) && is_name_part(name),
        None => is_name_part(s),
    }
}

fn is_label_value(s: &str) -> bool {
    s.is_empty() || is_name_part(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int_or_string_accepts_both_and_nothing_else() {
        let schema = translate(
            &json!({"x-kubernetes-int-or-string": true, "anyOf": [{"type": "integer"}, {"type": "string"}]}),
            false,
        );
        let v = jsonschema::options().with_draft(Draft::Draft4).build(&schema).expect("compiles");
        assert!(v.is_valid(&json!(3)));
        assert!(v.is_valid(&json!("3")));
        assert!(!v.is_valid(&json!(true)));
    }

    #[test]
    fn objects_reject_undeclared_fields_unless_they_preserve_them() {
        let strict = translate(&json!({"type": "object", "properties": {"a": {"type": "string"}}}), false);
        let loose = translate(
            &json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true, "properties": {"a": {"type": "string"}}}),
            false,
        );
        let build = |s: &Value| jsonschema::options().with_draft(Draft::Draft4).build(s).expect("compiles");
        assert!(!build(&strict).is_valid(&json!({"a": "x", "b": 1})));
        assert!(build(&loose).is_valid(&json!({"a": "x", "b": 1})));
    }

    #[test]
    fn label_values_follow_the_api_servers_rules() {
        assert!(is_label_value("3.5.3"));
        assert!(is_label_value(""));
        assert!(!is_label_value("-x"));
        assert!(!is_qualified_name("Bad Key"));
        assert!(is_qualified_name("app.kubernetes.io/name"));
    }
}
