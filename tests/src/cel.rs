//! The CEL rules (`x-kubernetes-validations`) of the KubeBlocks CRDs, evaluated by a CEL interpreter (the `cel`
//! crate, formerly `cel-interpreter`) the way the API server binds them.
//!
//! What Kubernetes adds to plain CEL, and how it is modelled here:
//! - `self` is the node the rule is attached to, typed by its schema: `integer` → int, `number` → double (even when
//!   integral), `x-kubernetes-int-or-string` → int or string as given, objects with `properties` → a map of the
//!   declared properties only (unknown fields kept by `x-kubernetes-preserve-unknown-fields` are invisible to CEL),
//!   objects with `additionalProperties` → a map of every key. Property names are escaped as the API server escapes
//!   them (`__dash__`, `__dot__`, `__slash__`, `__underscores__`, `__<keyword>__`); a name that cannot be escaped is
//!   not visible. At the root, `metadata` shows only `name` and `generateName`.
//! - Lists with `x-kubernetes-list-type: set` or `map` compare equal regardless of order in Kubernetes; they are
//!   handed to CEL in a canonical order, so `==` agrees (no rule of these CRDs indexes such a list by position).
//! - A rule that reads `oldSelf` is a transition rule: evaluated only on an update, and only where the old object has
//!   a value at the same place (object fields by name, map values by key, items of `list-type: map` lists by their
//!   keys; items of other lists cannot be correlated and are skipped, as the API server skips them).
//! - A rule that does not return a bool, or fails (a missing field read without `has()`), is a validation failure,
//!   as in the API server.
//! - Functions: the rules of these CRDs use only CEL's operators, `has()`, `all()`, `filter()`, `size()`, `in` and
//!   `startsWith()`, all of which the interpreter implements with CEL's standard semantics; no Kubernetes library
//!   function (`isSorted`, `quantity`, `url`, `ip`, ...) occurs. A rule that calls a function outside [`MODELLED`] is
//!   reported as not modelled instead of being evaluated, so a CRD update cannot slip an unmodelled one through.
//!
//! Not modelled: the cost budget (estimated and runtime), `messageExpression`, `fieldPath`/`reason`,
//! `optionalOldSelf`, validation ratcheting of unchanged fields, and `format: date-time`/`duration`/`byte`
//! conversions (such fields stay strings; no rule reads one).

use std::collections::HashMap;
use std::sync::Arc;

use cel::objects::{Key, Map};
use cel::{Context, Program, Value as CelValue};
use serde_json::Value;

/// The CEL functions and operators whose semantics the interpreter implements as Kubernetes' cel-go does.
pub const MODELLED: &[&str] = &[
    "_&&_",
    "_||_",
    "!_",
    "_?_:_",
    "_==_",
    "_!=_",
    "_<_",
    "_<=_",
    "_>_",
    "_>=_",
    "_+_",
    "_-_",
    "_*_",
    "_/_",
    "_%_",
    "-_",
    "_[_]",
    "@in",
    "@not_strictly_false",
    "size",
    "startsWith",
    "endsWith",
    "contains",
    "matches",
];

/// CEL's reserved words: a property with one of these names is visible as `__<name>__`.
const RESERVED: &[&str] = &[
    "true",
    "false",
    "null",
    "in",
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
];

/// What one rule says about one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The rule returned true.
    Holds,
    /// The rule returned false.
    Violated,
    /// The rule could not be evaluated (a runtime error, a non-bool result); the API server rejects the object.
    Failed(String),
    /// A transition rule with no old value at this place: not evaluated.
    NoOldSelf,
    /// The rule calls a function these tests do not model.
    NotModelled(String),
}

/// A compiled rule.
pub struct Rule {
    program: Program,
    /// Whether it reads `oldSelf`.
    pub transition: bool,
    unmodelled: Vec<String>,
}

impl Rule {
    /// Parses a rule.
    ///
    /// # Errors
    /// The parser's message for a rule that is not valid CEL.
    pub fn compile(text: &str) -> Result<Self, String> {
        let program = Program::compile(text).map_err(|e| format!("{text}: {e}"))?;
        let refs = program.references();
        let transition = refs.has_variable("oldSelf");
        let mut unmodelled: Vec<String> =
            refs.functions().into_iter().filter(|f| !MODELLED.contains(f)).map(str::to_owned).collect();
        unmodelled.sort();
        Ok(Self { program, transition, unmodelled })
    }

    /// Evaluates the rule on `node` (described by `schema`), with the old value for a transition rule; `root` when
    /// the rule is attached to the object's root.
    #[must_use]
    pub fn evaluate(&self, node: &Value, schema: &Value, old: Option<&Value>, root: bool) -> Outcome {
        if !self.unmodelled.is_empty() {
            return Outcome::NotModelled(self.unmodelled.join(", "));
        }
        let mut ctx = Context::default();
        ctx.add_variable_from_value("self", to_cel(node, schema, root));
        if self.transition {
            match old {
                Some(old) => ctx.add_variable_from_value("oldSelf", to_cel(old, schema, root)),
                None => return Outcome::NoOldSelf,
            }
        }
        match self.program.execute(&ctx) {
            Ok(CelValue::Bool(true)) => Outcome::Holds,
            Ok(CelValue::Bool(false)) => Outcome::Violated,
            Ok(other) => Outcome::Failed(format!("the rule returned {other:?}, not a bool")),
            Err(e) => Outcome::Failed(e.to_string()),
        }
    }
}

/// Evaluates a rule text on a node: compile and evaluate in one step.
#[must_use]
pub fn eval(text: &str, node: &Value, schema: &Value, old: Option<&Value>, root: bool) -> Outcome {
    match Rule::compile(text) {
        Ok(rule) => rule.evaluate(node, schema, old, root),
        Err(e) => Outcome::Failed(e),
    }
}

/// A property name as CEL sees it, or None when Kubernetes cannot escape it (then it is not visible).
#[must_use]
pub fn escape(name: &str) -> Option<String> {
    if RESERVED.contains(&name) {
        return Some(format!("__{name}__"));
    }
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || "_.-/".contains(c));
    if !first_ok || !name.chars().all(|c| c.is_ascii_alphanumeric() || "_.-/".contains(c)) {
        return None;
    }
    Some(
        name.replace("__", "__underscores__")
            .replace('.', "__dot__")
            .replace('-', "__dash__")
            .replace('/', "__slash__"),
    )
}

fn cel_map(entries: impl IntoIterator<Item = (String, CelValue)>) -> CelValue {
    let map: HashMap<Key, CelValue> = entries.into_iter().map(|(k, v)| (Key::String(Arc::new(k)), v)).collect();
    CelValue::Map(Map { map: Arc::new(map) })
}

fn flag(schema: &Value, name: &str) -> bool {
    schema.get(name) == Some(&Value::Bool(true))
}

/// A JSON value as CEL sees it under its schema (see the module documentation).
#[must_use]
pub fn to_cel(v: &Value, schema: &Value, root: bool) -> CelValue {
    let ty = schema.get("type").and_then(Value::as_str);
    match v {
        Value::Null => CelValue::Null,
        Value::Bool(b) => CelValue::Bool(*b),
        Value::Number(n) => match (ty, n.as_i64()) {
            (Some("number"), _) | (_, None) => CelValue::Float(n.as_f64().unwrap_or_default()),
            (_, Some(i)) => CelValue::Int(i),
        },
        Value::String(s) => CelValue::String(Arc::new(s.clone())),
        Value::Array(items) => {
            let item_schema = schema.get("items").unwrap_or(&Value::Null);
            let mut list: Vec<(String, CelValue)> =
                items.iter().map(|i| (i.to_string(), to_cel(i, item_schema, false))).collect();
            if matches!(schema.get("x-kubernetes-list-type").and_then(Value::as_str), Some("set" | "map")) {
                list.sort_by(|a, b| a.0.cmp(&b.0));
            }
            CelValue::List(Arc::new(list.into_iter().map(|(_, v)| v).collect()))
        }
        Value::Object(m) => {
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                let visible = m.iter().filter_map(|(k, val)| {
                    let sub = props.get(k)?;
                    let name = escape(k)?;
                    let converted = if root && k == "metadata" {
                        let meta = val.as_object().cloned().unwrap_or_default();
                        let kept = ["name", "generateName"]
                            .iter()
                            .filter_map(|f| meta.get(*f).map(|x| ((*f).to_owned(), to_cel(x, &Value::Null, false))));
                        cel_map(kept)
                    } else {
                        to_cel(val, sub, false)
                    };
                    Some((name, converted))
                });
                let mut entries: Vec<(String, CelValue)> = visible.collect();
                if flag(schema, "x-kubernetes-embedded-resource") {
                    for f in ["apiVersion", "kind"] {
                        if let Some(s) = m.get(f) {
                            entries.push((f.to_owned(), to_cel(s, &Value::Null, false)));
                        }
                    }
                }
                cel_map(entries)
            } else if let Some(extra) = schema.get("additionalProperties").filter(|a| a.is_object()) {
                cel_map(m.iter().map(|(k, val)| (k.clone(), to_cel(val, extra, false))))
            } else if flag(schema, "x-kubernetes-preserve-unknown-fields") || schema.is_null() {
                // Untyped data: every key, values by their JSON type.
                cel_map(m.iter().map(|(k, val)| (k.clone(), to_cel(val, &Value::Null, false))))
            } else {
                cel_map(std::iter::empty())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object(props: &[&str]) -> Value {
        let p: serde_json::Map<String, Value> =
            props.iter().map(|n| ((*n).to_owned(), json!({"type": "string"}))).collect();
        json!({"type": "object", "properties": p})
    }

    #[test]
    fn has_sees_declared_fields_only() {
        let schema = object(&["componentName", "componentObjectName"]);
        let rule = "(has(self.componentName) && !has(self.componentObjectName)) || (!has(self.componentName) && \
                    has(self.componentObjectName))";
        assert_eq!(eval(rule, &json!({"componentName": "a"}), &schema, None, false), Outcome::Holds);
        assert_eq!(
            eval(rule, &json!({"componentName": "a", "componentObjectName": "b"}), &schema, None, false),
            Outcome::Violated
        );
        assert_eq!(eval(rule, &json!({}), &schema, None, false), Outcome::Violated);
        // An undeclared field (kept by preserve-unknown-fields) is invisible to CEL.
        let loose = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true, "properties": {"componentName": {"type": "string"}}});
        assert_eq!(eval(rule, &json!({"componentObjectName": "b"}), &loose, None, false), Outcome::Violated);
    }

    #[test]
    fn numbers_follow_the_schema_type() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "number"}}});
        assert_eq!(eval("self.a == 3", &json!({"a": 3}), &schema, None, false), Outcome::Holds);
        // A double compares with a double literal; the interpreter also compares numerically across int and double.
        assert_eq!(eval("self.b == 3.0", &json!({"b": 3}), &schema, None, false), Outcome::Holds);
        assert_eq!(eval("self.b > 2.5", &json!({"b": 3}), &schema, None, false), Outcome::Holds);
    }

    #[test]
    fn a_missing_field_read_without_has_fails_the_rule() {
        let schema = object(&["minShards", "maxShards"]);
        let outcome = eval("self.minShards <= self.maxShards", &json!({"minShards": "1"}), &schema, None, false);
        assert!(matches!(outcome, Outcome::Failed(_)), "{outcome:?}");
    }

    #[test]
    fn a_non_bool_result_fails_the_rule() {
        let outcome = eval("size(self)", &json!("abc"), &json!({"type": "string"}), None, false);
        assert!(matches!(outcome, Outcome::Failed(ref m) if m.contains("not a bool")), "{outcome:?}");
    }

    #[test]
    fn transition_rules_need_an_old_value() {
        let schema = json!({"type": "string"});
        assert_eq!(eval("self == oldSelf", &json!("x"), &schema, None, false), Outcome::NoOldSelf);
        assert_eq!(eval("self == oldSelf", &json!("x"), &schema, Some(&json!("x")), false), Outcome::Holds);
        assert_eq!(eval("self == oldSelf", &json!("x"), &schema, Some(&json!("y")), false), Outcome::Violated);
    }

    #[test]
    fn map_and_set_lists_compare_regardless_of_order() {
        let map_list = json!({"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
            "items": {"type": "object", "properties": {"name": {"type": "string"}}}});
        let a = json!([{"name": "a"}, {"name": "b"}]);
        let b = json!([{"name": "b"}, {"name": "a"}]);
        assert_eq!(eval("self == oldSelf", &a, &map_list, Some(&b), false), Outcome::Holds);
        let atomic = json!({"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}});
        assert_eq!(eval("self == oldSelf", &a, &atomic, Some(&b), false), Outcome::Violated);
    }

    #[test]
    fn maps_iterate_over_keys_and_strings_count_code_points() {
        let schema = json!({"type": "object", "additionalProperties": {"type": "string"}});
        let images = json!({"pika": "é".repeat(256), "exporter": "x"});
        assert_eq!(eval("self.all(key, size(self[key]) <= 256)", &images, &schema, None, false), Outcome::Holds);
        let images = json!({"a-container-name-longer-than-32-chars": "x"});
        assert_eq!(eval("self.all(key, size(key) <= 32)", &images, &schema, None, false), Outcome::Violated);
    }

    #[test]
    fn property_names_are_escaped_as_kubernetes_escapes_them() {
        assert_eq!(escape("namespace").as_deref(), Some("__namespace__"));
        assert_eq!(
            escape("x-kubernetes.io/a__b").as_deref(),
            Some("x__dash__kubernetes__dot__io__slash__a__underscores__b")
        );
        assert_eq!(escape("1abc"), None);
        assert_eq!(escape("a b"), None);
        let schema = json!({"type": "object", "properties": {"max-shards": {"type": "integer"}}});
        assert_eq!(
            eval("self.max__dash__shards == 2", &json!({"max-shards": 2}), &schema, None, false),
            Outcome::Holds
        );
    }

    #[test]
    fn root_metadata_shows_only_name_and_generate_name() {
        let schema = json!({"type": "object", "properties": {"metadata": {"type": "object"}}});
        let obj = json!({"metadata": {"name": "a", "labels": {"x": "y"}}});
        assert_eq!(
            eval("self.metadata.name == 'a' && !has(self.metadata.labels)", &obj, &schema, None, true),
            Outcome::Holds
        );
    }

    #[test]
    fn a_rule_calling_an_unmodelled_function_is_reported_not_evaluated() {
        let outcome = eval("self.isSorted()", &json!([1, 2]), &json!({"type": "array"}), None, false);
        assert_eq!(outcome, Outcome::NotModelled("isSorted".into()));
    }
}
