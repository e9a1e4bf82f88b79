//! How kbcli 1.0.2 runs `kbcli cluster create <engine> NAME [flags]` against a cluster chart, emulated from its source
//! (apecloud/kbcli v1.0.2) so that the chart tests can run what kbcli would run, with the real Helm.
//!
//! The steps, and where they come from:
//! 1. The command's flags: `--edit` (bool, false), `--dry-run` (string, "none"), `--output`/`-o` (its own type
//!    `format`, YAML), then one flag per property of `values.schema.json` (`pkg/util/flags/flags.go`
//!    `BuildFlagsBySchema`/`buildOneFlag`), then `--pod-anti-affinity` (string, "Preferred"), `--topology-keys`
//!    (stringArray, none), `--node-labels` (stringToString), `--tolerations` (stringSlice) and `--tenancy` (string,
//!    "SharedNode"), each only if the schema did not already make a flag of that name
//!    (`pkg/cmd/cluster/create_subcmds.go`). A flag whose name exists already is not built again.
//! 2. A schema property becomes a flag named by go-strcase's `KebabCase` of its name; an object recurses into its
//!    `properties` as `<parent>.<child>` (an object without properties makes no flag); an array makes one flag of
//!    its item type, a slice whose default is `[<item default or zero>]`; a missing `type` is a string. The default
//!    is the property's `default`, or the type's zero value when there is none (`castOrZero`): 0, "", false.
//! 3. The values (`create_util.go` `getValuesFromFlags`): **every** local flag but `help`, given or not, keyed by
//!    go-strcase's `LowerCamelCase` of the flag name and split into nested maps at each `.`. Bool, int, float64,
//!    stringArray and the slices are read with their own getter; every other type through `GetString`, which fails
//!    for a flag that is not a string and yields "" (so `output`, `nodeLabels` and `tolerations` are always "").
//! 4. The chart is rendered by Helm's install action in client-only dry-run mode with those values, the schema
//!    checked (`cluster_chart.go` `GetManifests`), release name = NAME, namespace = `-n`; then the same values, as
//!    given (not merged with values.yaml), are validated against values.schema.json by kube-openapi
//!    (`ValidateValues`), and NAME must match `^[a-z]([-a-z0-9]*[a-z0-9])?$` and be at most 16 characters.
//!
//! Not modelled: kbcli's scheduling policy (`--tolerations`, `--node-labels`, `--topology-keys` add a
//! `schedulingPolicy` to each component; without them nothing is added, which is what the tests run), sub-charts
//! (the pika cluster chart has none), `--edit`, and the `Required` marks of `schema.required` (the chart has none).
//! kbcli 1.0.2 links Helm v3.18.5 and kube-openapi for the two validations; the tests run Helm v3.17.2 and the
//! `jsonschema` crate (draft 4, the base of kube-openapi's validator).

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

/// A pflag value type, as `Value.Type()` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagType {
    /// `string`.
    String,
    /// `int`.
    Int,
    /// `float64`.
    Float64,
    /// `bool`.
    Bool,
    /// `stringArray`.
    StringArray,
    /// `intSlice`.
    IntSlice,
    /// `float64Slice`.
    Float64Slice,
    /// `boolSlice`.
    BoolSlice,
    /// kbcli's `format` (`--output`).
    Format,
    /// `stringToString` (`--node-labels`).
    StringToString,
    /// `stringSlice` (`--tolerations`).
    StringSlice,
}

/// One flag of `kbcli cluster create <engine>`.
#[derive(Debug, Clone, PartialEq)]
pub struct Flag {
    /// The flag's name, without `--`.
    pub name: String,
    /// Its pflag type.
    pub ty: FlagType,
    /// The value kbcli passes when the flag is not given, as `getValuesFromFlags` reads it.
    pub default: Value,
    /// Whether it was built from the chart's schema (else it is one of kbcli's own).
    pub from_schema: bool,
}

fn is_lower(c: char) -> bool {
    c.is_ascii_lowercase()
}

fn is_upper(c: char) -> bool {
    c.is_ascii_uppercase()
}

fn is_delimiter(c: char) -> bool {
    c == '-' || c == '_' || c == ' ' || c == '\t' || c == '\n' || c == '\r'
}

/// go-strcase v1.2.0 `KebabCase`: a delimiter before each upper-case letter that follows a lower-case one (or that
/// starts a word after an upper-case run), runs of delimiters collapsed to one `-`, ASCII lower-cased; `.` and digits
/// are kept as they are.
#[must_use]
pub fn kebab_case(s: &str) -> String {
    let s = s.trim();
    let mut out = String::new();
    let mut prev = '\0';
    let mut curr = '\0';
    for next in s.chars() {
        if is_delimiter(curr) {
            if !is_delimiter(prev) {
                out.push('-');
            }
        } else if is_upper(curr) {
            if is_lower(prev) || (is_upper(prev) && is_lower(next)) {
                out.push('-');
            }
            out.push(curr.to_ascii_lowercase());
        } else if curr != '\0' {
            out.push(curr.to_ascii_lowercase());
        }
        prev = curr;
        curr = next;
    }
    if !s.is_empty() {
        if is_upper(curr) && is_lower(prev) && prev != '\0' {
            out.push('-');
        }
        out.push(curr.to_ascii_lowercase());
    }
    out
}

/// go-strcase v1.2.0 `LowerCamelCase`: delimiters dropped, the letter after one upper-cased, a letter after a
/// lower-case one kept, any other lower-cased.
#[must_use]
pub fn lower_camel_case(s: &str) -> String {
    let chars: Vec<char> = s.trim().chars().collect();
    let mut out = String::new();
    for (i, &curr) in chars.iter().enumerate() {
        let prev = if i == 0 { '\0' } else { chars[i - 1] };
        if is_delimiter(curr) {
            continue;
        }
        if is_delimiter(prev) {
            out.push(curr.to_ascii_uppercase());
        } else if is_lower(prev) {
            out.push(curr);
        } else {
            out.push(curr.to_ascii_lowercase());
        }
    }
    out
}

fn schema_type(s: &Value) -> &str {
    match s.get("type") {
        Some(Value::String(t)) => t,
        Some(Value::Array(ts)) => ts.first().and_then(Value::as_str).unwrap_or("string"),
        _ => "string",
    }
}

/// Go's `castOrZero[T]` of a JSON default: the value when it has that type, else the zero value. JSON numbers are
/// float64 in Go, so an integer flag reads its default as float64 and truncates it.
fn default_of(s: &Value, ty: &str) -> Value {
    let d = s.get("default");
    match ty {
        "integer" => json!(d.and_then(Value::as_f64).map_or(0, |f| f as i64)),
        "number" => json!(d.and_then(Value::as_f64).unwrap_or(0.0)),
        "boolean" => json!(d.and_then(Value::as_bool).unwrap_or(false)),
        _ => json!(d.and_then(Value::as_str).unwrap_or_default()),
    }
}

fn build_one(flags: &mut Vec<Flag>, key: &str, s: &Value, is_array: bool) -> Result<(), String> {
    let name = kebab_case(key);
    if flags.iter().any(|f| f.name == name) {
        return Ok(());
    }
    let ty = schema_type(s);
    let push = |flags: &mut Vec<Flag>, ty: FlagType, default: Value| {
        flags.push(Flag { name: name.clone(), ty, default, from_schema: true });
    };
    match (ty, is_array) {
        ("object", _) => {
            // Go ranges over a map: the order of the sub-flags is unspecified, their set is not.
            if let Some(props) = s.get("properties").and_then(Value::as_object) {
                for (sub, prop) in props {
                    build_one(flags, &format!("{name}.{sub}"), prop, is_array)?;
                }
            }
        }
        ("array", true) => return Err("unsupported build flags for object with array nested within an array".into()),
        ("array", false) => {
            let items = s.get("items").ok_or_else(|| format!("{key}: an array without items"))?;
            build_one(flags, key, items, true)?;
        }
        ("null", _) => {}
        ("string", false) => push(flags, FlagType::String, default_of(s, ty)),
        ("integer", false) => push(flags, FlagType::Int, default_of(s, ty)),
        ("number", false) => push(flags, FlagType::Float64, default_of(s, ty)),
        ("boolean", false) => push(flags, FlagType::Bool, default_of(s, ty)),
        ("string", true) => push(flags, FlagType::StringArray, json!([default_of(s, ty)])),
        ("integer", true) => push(flags, FlagType::IntSlice, json!([default_of(s, ty)])),
        ("number", true) => push(flags, FlagType::Float64Slice, json!([default_of(s, ty)])),
        ("boolean", true) => push(flags, FlagType::BoolSlice, json!([default_of(s, ty)])),
        (other, _) => return Err(format!("unsupported json schema type {other}")),
    }
    Ok(())
}

/// The flags of `kbcli cluster create <engine>` for a chart with that `values.schema.json`, in the order kbcli adds
/// them (schema flags sorted by name, since Go's map order is unspecified).
///
/// # Errors
/// A schema kbcli cannot build flags from (its own error message).
pub fn create_flags(schema: &Value) -> Result<Vec<Flag>, String> {
    let own = |name: &str, ty: FlagType, default: Value| Flag { name: name.into(), ty, default, from_schema: false };
    let mut flags = vec![
        own("edit", FlagType::Bool, json!(false)),
        own("dry-run", FlagType::String, json!("none")),
        own("output", FlagType::Format, json!("")),
    ];
    let mut from_schema = Vec::new();
    // Flags of the same name as kbcli's own are not built again.
    from_schema.extend(flags.iter().cloned());
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (k, prop) in props {
            build_one(&mut from_schema, k, prop, false)?;
        }
    }
    let mut built: Vec<Flag> = from_schema.into_iter().filter(|f| f.from_schema).collect();
    built.sort_by(|a, b| a.name.cmp(&b.name));
    flags.extend(built);
    for (name, ty, default) in [
        ("pod-anti-affinity", FlagType::String, json!("Preferred")),
        ("topology-keys", FlagType::StringArray, json!([])),
        ("node-labels", FlagType::StringToString, json!("")),
        ("tolerations", FlagType::StringSlice, json!("")),
        ("tenancy", FlagType::String, json!("SharedNode")),
    ] {
        if !flags.iter().any(|f| f.name == name) {
            flags.push(own(name, ty, default));
        }
    }
    Ok(flags)
}

fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Go's `strconv.ParseInt(s, 0, 64)`: decimal, or 0x/0o/0b (and a leading 0 for octal), `_` between digits.
fn parse_go_int(s: &str) -> Option<i64> {
    let (neg, body) = s.strip_prefix('-').map_or((false, s.strip_prefix('+').unwrap_or(s)), |b| (true, b));
    let lower = body.to_ascii_lowercase();
    let (radix, digits) = if let Some(d) = lower.strip_prefix("0x") {
        (16, d)
    } else if let Some(d) = lower.strip_prefix("0o") {
        (8, d)
    } else if let Some(d) = lower.strip_prefix("0b") {
        (2, d)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, &lower[1..])
    } else {
        (10, lower.as_str())
    };
    let digits = digits.replace('_', "");
    let v = i64::from_str_radix(&digits, radix).ok()?;
    Some(if neg { -v } else { v })
}

/// The values kbcli passes to the chart when run with `given` flags (`name`, value as typed after `--name=`).
///
/// # Errors
/// An unknown flag or a value its type does not parse (pflag's error).
pub fn values(flags: &[Flag], given: &[(&str, &str)]) -> Result<Value, String> {
    let mut current: BTreeMap<&str, Value> = flags.iter().map(|f| (f.name.as_str(), f.default.clone())).collect();
    let mut touched: Vec<&str> = Vec::new();
    for (name, raw) in given {
        let flag = flags.iter().find(|f| f.name == *name).ok_or_else(|| format!("unknown flag: --{name}"))?;
        let bad = || format!("invalid argument {raw:?} for \"--{name}\" flag");
        let first = !touched.contains(name);
        touched.push(flag.name.as_str());
        let v = match flag.ty {
            FlagType::String => json!(raw),
            FlagType::Int => json!(parse_go_int(raw).ok_or_else(bad)?),
            FlagType::Float64 => json!(raw.parse::<f64>().map_err(|_| bad())?),
            FlagType::Bool => json!(parse_bool(raw).ok_or_else(bad)?),
            FlagType::Format => {
                if !["table", "json", "yaml", "wide"].contains(raw) {
                    return Err(bad());
                }
                // Read through GetString, which fails for a `format` flag: "".
                json!("")
            }
            FlagType::StringToString | FlagType::StringSlice => json!(""),
            FlagType::StringArray => {
                let mut list = if first {
                    Vec::new()
                } else {
                    current[flag.name.as_str()].as_array().cloned().unwrap_or_default()
                };
                list.push(json!(raw));
                Value::Array(list)
            }
            FlagType::IntSlice | FlagType::Float64Slice | FlagType::BoolSlice => {
                let mut list = if first {
                    Vec::new()
                } else {
                    current[flag.name.as_str()].as_array().cloned().unwrap_or_default()
                };
                for part in raw.split(',') {
                    list.push(match flag.ty {
                        FlagType::IntSlice => json!(part.parse::<i64>().map_err(|_| bad())?),
                        FlagType::Float64Slice => json!(part.parse::<f64>().map_err(|_| bad())?),
                        _ => json!(parse_bool(part).ok_or_else(bad)?),
                    });
                }
                Value::Array(list)
            }
        };
        current.insert(flag.name.as_str(), v);
    }
    let mut out = Map::new();
    for (name, v) in current {
        let key = lower_camel_case(name);
        let parts: Vec<&str> = key.split('.').collect();
        let mut node = &mut out;
        for p in &parts[..parts.len() - 1] {
            let entry = node.entry((*p).to_owned()).or_insert_with(|| json!({}));
            if !entry.is_object() {
                *entry = json!({});
            }
            node = entry.as_object_mut().expect("an object");
        }
        node.insert(parts[parts.len() - 1].to_owned(), v);
    }
    Ok(Value::Object(out))
}

/// kbcli's own check of the cluster name (`CreateSubCmdsOptions.Validate`).
///
/// # Errors
/// kbcli's message.
pub fn validate_name(name: &str) -> Result<(), String> {
    let re = regex::Regex::new(r"^[a-z]([-a-z0-9]*[a-z0-9])?$").expect("regex");
    if !re.is_match(name) {
        return Err(
            "cluster name must begin with a letter and can only contain lowercase letters, numbers, and '-'".into()
        );
    }
    if name.len() > 16 {
        return Err("cluster name should be less than 16 characters".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kebab_and_camel_case_are_go_strcase() {
        assert_eq!(kebab_case("storageClassName"), "storage-class-name");
        assert_eq!(kebab_case("codis-proxy.replicas"), "codis-proxy.replicas");
        assert_eq!(kebab_case("dryRun"), "dry-run");
        assert_eq!(kebab_case("codisFE"), "codis-fe");
        assert_eq!(kebab_case("HTTPServer"), "http-server");
        assert_eq!(kebab_case("s3Bucket"), "s3bucket");
        assert_eq!(lower_camel_case("dry-run"), "dryRun");
        assert_eq!(lower_camel_case("codis-proxy.replicas"), "codisProxy.replicas");
        assert_eq!(lower_camel_case("storage-class-name"), "storageClassName");
        // Not every name survives the round trip: kbcli passes these under another key.
        assert_eq!(lower_camel_case(&kebab_case("codisFE")), "codisFe");
        assert_eq!(lower_camel_case(&kebab_case("s3Bucket")), "s3bucket");
    }

    #[test]
    fn a_nested_property_without_a_default_is_passed_as_the_zero_value() {
        let schema = json!({"properties": {
            "etcd": {"type": "object", "properties": {"replicas": {"type": "integer"}, "storage": {"type": "string"}}},
            "shards": {"type": "integer", "default": 3},
            "resources": {"type": "object"},
            "names": {"type": "array", "items": {"type": "string"}},
            "untyped": {}
        }});
        let flags = create_flags(&schema).expect("flags");
        let v = values(&flags, &[]).expect("values");
        assert_eq!(v["etcd"], json!({"replicas": 0, "storage": ""}));
        assert_eq!(v["shards"], json!(3));
        assert!(v.get("resources").is_none(), "an object without properties makes no flag");
        assert_eq!(v["names"], json!([""]), "an array flag defaults to one zero item");
        assert_eq!(v["untyped"], json!(""), "no type is a string");
    }

    #[test]
    fn kbcli_passes_its_own_flags_as_values() {
        let v = values(&create_flags(&json!({})).expect("flags"), &[]).expect("values");
        assert_eq!(
            v,
            json!({"edit": false, "dryRun": "none", "output": "", "podAntiAffinity": "Preferred", "topologyKeys": [],
                   "nodeLabels": "", "tolerations": "", "tenancy": "SharedNode"})
        );
        let v = values(
            &create_flags(&json!({})).expect("flags"),
            &[("output", "json"), ("node-labels", "a=b"), ("topology-keys", "zone"), ("topology-keys", "host")],
        )
        .expect("values");
        assert_eq!(v["output"], "", "a format flag read through GetString");
        assert_eq!(v["nodeLabels"], "");
        assert_eq!(v["topologyKeys"], json!(["zone", "host"]));
    }

    #[test]
    fn a_schema_property_named_like_a_kbcli_flag_replaces_only_the_later_ones() {
        let schema = json!({"properties": {"tenancy": {"type": "string", "default": "DedicatedNode"},
                                           "edit": {"type": "string", "default": "x"}}});
        let flags = create_flags(&schema).expect("flags");
        let tenancy: Vec<&Flag> = flags.iter().filter(|f| f.name == "tenancy").collect();
        assert_eq!(tenancy.len(), 1);
        assert!(tenancy[0].from_schema && tenancy[0].default == "DedicatedNode");
        let edit = flags.iter().find(|f| f.name == "edit").expect("edit");
        assert!(!edit.from_schema && edit.ty == FlagType::Bool, "--edit exists before the schema flags");
    }

    #[test]
    fn given_flags_parse_as_pflag_does() {
        let schema = json!({"properties": {"shards": {"type": "integer", "default": 3}, "on": {"type": "boolean"}}});
        let flags = create_flags(&schema).expect("flags");
        assert_eq!(values(&flags, &[("shards", "0x10")]).expect("hex")["shards"], 16);
        assert_eq!(values(&flags, &[("on", "T")]).expect("bool")["on"], true);
        assert!(values(&flags, &[("shards", "three")]).is_err());
        assert!(values(&flags, &[("shard", "3")]).expect_err("unknown").contains("unknown flag: --shard"));
    }

    #[test]
    fn cluster_names_follow_kbcli() {
        assert!(validate_name("pika-demo").is_ok());
        assert!(validate_name("Pika").is_err());
        assert!(validate_name("a-very-long-cluster-name").is_err());
    }
}
