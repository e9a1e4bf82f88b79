//! Validation of objects against the CRD schemas, as the API server does it on create.
//!
//! Each object is matched to its CRD by group and kind, to the schema of its version (which must be served), and
//! validated in three passes:
//!
//! 1. JSON Schema (the `jsonschema` crate) over the `openAPIV3Schema` translated to draft 4: `nullable` becomes a
//!    `null` type, `x-kubernetes-int-or-string` an integer-or-string, and every object node that neither preserves
//!    unknown fields nor declares `additionalProperties` rejects fields it does not define (the API server prunes
//!    them, or with strict field validation, the kubectl default, rejects them: a misspelt field must fail);
//! 2. the Kubernetes extensions JSON Schema does not know: `x-kubernetes-list-type: map|set` uniqueness (with the
//!    schema defaults of missing keys) and the `x-kubernetes-validations` CEL rules ([`crate::cel`]);
//! 3. `metadata` as ObjectMeta: a DNS-subdomain name, well-formed label keys and values, string annotations.
//!
//! Core kinds (ConfigMap, Secret, Service, ...) have no CRD here; they must parse and name themselves.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

use jsonschema::{Draft, Validator};
use serde_json::{json, Map, Value};

use crate::cel::{self, Verdict};
use crate::manifest::Doc;
use crate::render::renderer;

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
        let docs = renderer().yaml_to_json(&files).unwrap_or_else(|e| panic!("CRDs of {version}: {e}"));
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

    /// Validates one object; every problem found, as `path: message` lines.
    ///
    /// # Errors
    /// The list of problems when there is at least one.
    pub fn validate(&self, obj: &Value) -> Result<(), Vec<String>> {
        let mut errors = Vec::new();
        let api_version = obj["apiVersion"].as_str().unwrap_or_default();
        let kind = obj["kind"].as_str().unwrap_or_default();
        if api_version.is_empty() || kind.is_empty() {
            return Err(vec!["apiVersion and kind are required".into()]);
        }
        check_metadata(obj, &mut errors);
        if self.has_crd(api_version, kind) {
            match self.compiled(api_version, kind) {
                Ok(c) => {
                    for e in c.validator.iter_errors(obj) {
                        errors.push(format!("{}: {e}", pointer(e.instance_path().as_str())));
                    }
                    k8s_extensions(&c.original, obj, "", &mut errors);
                }
                Err(e) => errors.push(e),
            }
        } else if !CORE_KINDS.contains(&kind) {
            errors.push(format!("no schema for {kind} ({api_version}) in KubeBlocks {}", self.version));
        } else if kind == "ConfigMap" {
            if let Some(data) = obj.get("data") {
                match data.as_object() {
                    Some(m) => errors.extend(
                        m.iter().filter(|(_, v)| !v.is_string()).map(|(k, _)| format!("data.{k}: not a string")),
                    ),
                    None => errors.push("data: not a map".into()),
                }
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }

    /// Validates documents; problems prefixed with the document, and the number validated against a CRD.
    #[must_use]
    pub fn validate_all(&self, docs: &[Doc]) -> (usize, Vec<String>) {
        let mut problems = Vec::new();
        let mut with_crd = 0;
        for d in docs {
            if self.has_crd(d.api_version(), d.kind()) {
                with_crd += 1;
            }
            if let Err(errs) = self.validate(&d.object) {
                for e in errs {
                    problems.push(format!("[{}] {}/{} ({}): {e}", self.version, d.kind(), d.name(), d.source));
                }
            }
        }
        (with_crd, problems)
    }
}

fn pointer(p: &str) -> String {
    if p.is_empty() {
        "(root)".into()
    } else {
        p.trim_start_matches('/').replace('/', ".")
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

/// Passes over the original schema and the object together for what JSON Schema cannot say.
fn k8s_extensions(schema: &Value, node: &Value, path: &str, errors: &mut Vec<String>) {
    let here = if path.is_empty() { "(root)" } else { path };
    if let Some(rules) = schema.get("x-kubernetes-validations").and_then(Value::as_array) {
        for rule in rules {
            let text = rule["rule"].as_str().unwrap_or_default();
            match cel::eval(text, node) {
                Ok(Verdict::Violated) => errors.push(format!(
                    "{here}: violates {:?}{}",
                    text,
                    rule["message"].as_str().map(|m| format!(" ({m})")).unwrap_or_default()
                )),
                Ok(Verdict::Holds | Verdict::Transition) => {}
                Err(rule) => errors.push(format!("{here}: CEL rule not implemented by the chart tests: {rule}")),
            }
        }
    }
    match node {
        Value::Object(m) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let extra = schema.get("additionalProperties").filter(|a| a.is_object());
            for (k, v) in m {
                let sub = props.and_then(|p| p.get(k)).or(extra);
                if let Some(sub) = sub {
                    let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                    k8s_extensions(sub, v, &p, errors);
                }
            }
        }
        Value::Array(items) => {
            let Some(item_schema) = schema.get("items") else { return };
            match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
                Some("map") => {
                    let keys: Vec<&str> = schema
                        .get("x-kubernetes-list-map-keys")
                        .and_then(Value::as_array)
                        .map(|k| k.iter().filter_map(Value::as_str).collect())
                        .unwrap_or_default();
                    let mut seen = HashSet::new();
                    for item in items {
                        let key: Vec<String> = keys
                            .iter()
                            .map(|k| {
                                item.get(*k)
                                    .or_else(|| item_schema["properties"][*k].get("default"))
                                    .map(Value::to_string)
                                    .unwrap_or_default()
                            })
                            .collect();
                        if !seen.insert(key.clone()) {
                            errors.push(format!("{here}: duplicate entry with {keys:?} = {key:?}"));
                        }
                    }
                }
                Some("set") => {
                    let mut seen = HashSet::new();
                    for item in items {
                        if !seen.insert(item.to_string()) {
                            errors.push(format!("{here}: duplicate set entry {item}"));
                        }
                    }
                }
                _ => {}
            }
            for (i, item) in items.iter().enumerate() {
                k8s_extensions(item_schema, item, &format!("{here}.{i}"), errors);
            }
        }
        _ => {}
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
