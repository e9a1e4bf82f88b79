//! Rendered objects, and the small lookups the cross-reference tests make on them.

use serde_json::Value;

/// One rendered (or converted) object and where it came from.
#[derive(Debug, Clone)]
pub struct Doc {
    /// `<chart>/templates/<file>` for rendered objects, the file path for converted ones.
    pub source: String,
    /// The document's position within its source.
    pub index: usize,
    /// The object, as kubectl would send it.
    pub object: Value,
}

impl Doc {
    /// `kind`, or "" when absent.
    #[must_use]
    pub fn kind(&self) -> &str {
        self.object["kind"].as_str().unwrap_or_default()
    }

    /// `apiVersion`, or "" when absent.
    #[must_use]
    pub fn api_version(&self) -> &str {
        self.object["apiVersion"].as_str().unwrap_or_default()
    }

    /// `metadata.name`, or "" when absent.
    #[must_use]
    pub fn name(&self) -> &str {
        self.object["metadata"]["name"].as_str().unwrap_or_default()
    }

    /// `metadata.namespace`, if set.
    #[must_use]
    pub fn namespace(&self) -> Option<&str> {
        self.object["metadata"]["namespace"].as_str()
    }

    /// The value at a dotted path (`spec.roles.0.name`), if present.
    #[must_use]
    pub fn at(&self, path: &str) -> Option<&Value> {
        at(&self.object, path)
    }
}

/// The value at a dotted path below `v`; numeric segments index arrays.
#[must_use]
pub fn at<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    if path.is_empty() {
        return Some(v);
    }
    path.split('.').try_fold(v, |cur, seg| match cur {
        Value::Object(m) => m.get(seg),
        Value::Array(a) => seg.parse::<usize>().ok().and_then(|i| a.get(i)),
        _ => None,
    })
}

/// The string at a dotted path, or "" when absent or not a string.
#[must_use]
pub fn str_at<'a>(v: &'a Value, path: &str) -> &'a str {
    at(v, path).and_then(Value::as_str).unwrap_or_default()
}

/// The array at a dotted path, or an empty slice.
#[must_use]
pub fn array_at<'a>(v: &'a Value, path: &str) -> &'a [Value] {
    at(v, path).and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

/// The documents of a kind.
pub fn of_kind<'a>(docs: &'a [Doc], kind: &'a str) -> impl Iterator<Item = &'a Doc> + 'a {
    docs.iter().filter(move |d| d.kind() == kind)
}

/// The one document of a kind with that name.
///
/// # Panics
/// When there is none, naming what there is.
#[must_use]
pub fn find<'a>(docs: &'a [Doc], kind: &str, name: &str) -> &'a Doc {
    docs.iter()
        .find(|d| d.kind() == kind && d.name() == name)
        .unwrap_or_else(|| panic!("no {kind} named {name} among:\n{}", crate::helm::summary(docs)))
}

/// Whether a ComponentDefinition (or ShardingDefinition) name matches a `compDef`-style reference the way KubeBlocks
/// matches them: the exact name, a name prefix, or a regular expression.
///
/// # Panics
/// When the reference is neither a prefix nor a valid regular expression.
#[must_use]
pub fn def_matches(reference: &str, name: &str) -> bool {
    if reference.is_empty() {
        return false;
    }
    if name == reference || name.starts_with(reference) {
        return true;
    }
    match regex::Regex::new(reference) {
        Ok(re) => re.is_match(name),
        Err(e) => panic!("compDef reference {reference:?} is not a valid regular expression: {e}"),
    }
}

/// Every exec action of a ComponentDefinition or ShardingDefinition: (action name, action object).
#[must_use]
pub fn exec_actions(def: &Value) -> Vec<(String, &Value)> {
    let mut out = Vec::new();
    if let Some(Value::Object(actions)) = at(def, "spec.lifecycleActions") {
        for (name, action) in actions {
            if action.get("exec").is_some() {
                out.push((name.clone(), action));
            }
        }
    }
    out
}

/// Every container of a ComponentDefinition's pod template, init containers first.
#[must_use]
pub fn containers(cmpd: &Value) -> Vec<&Value> {
    array_at(cmpd, "spec.runtime.initContainers").iter().chain(array_at(cmpd, "spec.runtime.containers")).collect()
}
