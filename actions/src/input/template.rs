//! Stage two of configuration: render the action's Tera template over the variables into an event document.
//!
//! Templates are built in (from `templates/events/` at the top of the repository) and may be replaced at run time by
//! files of the same name in `ACTION_TEMPLATES_DIR`. The functions below are the only way a template reads a
//! variable; each validates its variable and, when it is missing or malformed, fails naming it, so that the caller
//! can report exit 2 with the variable's name.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::input::address::{check_fqdn, check_host, check_host_port, check_label};
use crate::input::line::KbLine;
use crate::input::vars::{self, VarMap};

macro_rules! builtin {
    ($($name:literal),* $(,)?) => {
        /// The built-in templates, by file name.
        pub const BUILTIN: &[(&str, &str)] = &[$(($name, include_str!(concat!("../../../templates/events/", $name)))),*];
    };
}

builtin!(
    "post-provision.1.0.tera",
    "post-provision.1.1.tera",
    "pre-terminate.1.0.tera",
    "pre-terminate.1.1.tera",
    "shard-add.1.1.tera",
    "shard-remove.1.1.tera",
    "member-join.tera",
    "member-leave.tera",
    "switchover.tera",
    "role-probe.tera",
    "rejoin.tera",
    "pre-stop.tera",
    "topology.tera",
    "watch.tera",
    "common.tera",
);

/// A template function's refusal of a variable. It travels inside Tera's error as its source, so that the render's
/// caller can name the variable: Tera's own text says only which function failed.
#[derive(Debug, thiserror::Error)]
#[error("{var}: {reason}")]
struct Rejected {
    var: String,
    reason: String,
}

fn reject(var: &str, reason: impl Into<String>) -> tera::Error {
    let rejected = Rejected { var: var.to_owned(), reason: reason.into() };
    tera::Error::chain(rejected.to_string(), rejected)
}

/// The variable a failed render rejected, found in the error's chain of causes.
fn rejected(err: &tera::Error) -> Option<Error> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(cause) = source {
        if let Some(r) = cause.downcast_ref::<Rejected>() {
            return Some(Error::invalid(r.var.clone(), r.reason.clone()));
        }
        source = cause.source();
    }
    None
}

/// Renders the event document for `action` on `line` from `vars`; `options` are the command-line options the
/// subcommand was given (`own-shard`), which a template reads with `option(name=...)`.
pub fn render(action: &str, line: KbLine, vars: &VarMap, options: &[&str]) -> Result<Value> {
    let dir = templates_dir(vars)?;
    if action == "role-probe" && dir.is_none() {
        return role_probe_event(vars, line);
    }
    render_template(action, line, vars, options, dir.as_ref())
}

/// The built-in `role-probe.tera` evaluated without Tera: the same functions with the same arguments, in the
/// template's order, so the same event or the same first rejection. The probe runs every few seconds in every pod,
/// and Tera's parser is most of what its process would otherwise map (the tests check both ways agree).
fn role_probe_event(vars: &VarMap, line: KbLine) -> Result<Value> {
    let s = scope(vars, line, &[]);
    let call = |f: Function, args: Value| -> tera::Result<Value> {
        let args: Args = match args {
            Value::Object(map) => map.into_iter().collect(),
            _ => Args::new(),
        };
        f(&s, &args)
    };
    let doc = (|| -> tera::Result<Value> {
        Ok(json!({
            "action": "role-probe",
            "kubeblocks": call(fn_kubeblocks_line, json!({}))?,
            "host": call(fn_host, json!({"var": vars::PIKA_HOST, "default": "127.0.0.1"}))?,
            "pika": {
                "port": call(fn_number, json!({"var": vars::PIKA_PORT, "default": 9221, "min": 1, "max": 65535}))?,
                "auth": call(fn_secret_set, json!({"var": vars::PIKA_PASSWORD}))?,
                "overrides": call(fn_overrides, json!({"var": vars::PIKA_ADDRESS_OVERRIDES}))?,
            },
            "budget_seconds": call(
                fn_number,
                json!({"var": vars::ACTION_BUDGET_SECONDS, "default": 50, "min": 1, "max": 86400})
            )?,
        }))
    })();
    doc.map_err(|e| {
        rejected(&e).unwrap_or_else(|| Error::invalid("template", format!("template role-probe.tera: {}", chain(&e))))
    })
}

/// Renders `<action>[.<line>].tera` with Tera.
fn render_template(action: &str, line: KbLine, vars: &VarMap, options: &[&str], dir: Option<&String>) -> Result<Value> {
    let (name, source) = select(action, line, dir.map(Path::new))?;
    // Parsing the shared macros is most of a render's cost (about 1 ms of role-probe's 5): only when imported.
    let common = if source.contains("common.tera") {
        load("common.tera", dir.map(Path::new))?.unwrap_or_default()
    } else {
        String::new()
    };
    let mut templates = vec![(name.as_str(), source.as_str())];
    if !common.is_empty() {
        templates.insert(0, ("common.tera", common.as_str()));
    }

    let mut tera = tera::Tera::default();
    tera.autoescape_on(vec![]);
    register_functions(&mut tera, vars, line, options);
    tera.add_raw_templates(templates)
        .map_err(|e| Error::invalid(template_var(dir), format!("template {name}: {}", chain(&e))))?;

    let text = tera.render(&name, &tera::Context::new()).map_err(|e| {
        rejected(&e).unwrap_or_else(|| Error::invalid(template_var(dir), format!("template {name}: {}", chain(&e))))
    })?;
    serde_json::from_str(&text)
        .map_err(|e| Error::invalid(template_var(dir), format!("template {name} did not render a JSON event: {e}")))
}

/// `ACTION_TEMPLATES_DIR` when set: it must be a directory this process can read, or the built-in templates would
/// silently stand in for the ones the operator meant to use.
fn templates_dir(vars: &VarMap) -> Result<Option<String>> {
    let Some(dir) = vars.get(vars::ACTION_TEMPLATES_DIR).map(|d| d.trim()).filter(|d| !d.is_empty()) else {
        return Ok(None);
    };
    match std::fs::read_dir(dir) {
        Ok(_) => Ok(Some(dir.to_owned())),
        Err(e) => Err(Error::invalid(vars::ACTION_TEMPLATES_DIR, format!("{dir:?} is not a readable directory: {e}"))),
    }
}

fn template_var(dir: Option<&String>) -> &'static str {
    if dir.is_some() {
        vars::ACTION_TEMPLATES_DIR
    } else {
        "template"
    }
}

fn chain(err: &tera::Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Picks `<action>.<line>.tera`, else `<action>.tera`, from the directory first, then the built-ins.
fn select(action: &str, line: KbLine, dir: Option<&Path>) -> Result<(String, String)> {
    for name in [format!("{action}.{}.tera", line.as_str()), format!("{action}.tera")] {
        if let Some(source) = load(&name, dir)? {
            return Ok((name, source));
        }
    }
    Err(Error::invalid(
        vars::KUBEBLOCKS_LINE,
        format!("{action} has no event template for KubeBlocks {}: it does not run on that line", line.as_str()),
    ))
}

fn load(name: &str, dir: Option<&Path>) -> Result<Option<String>> {
    if let Some(dir) = dir {
        let path = dir.join(name);
        match std::fs::read_to_string(&path) {
            Ok(text) => return Ok(Some(text)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(Error::invalid(vars::ACTION_TEMPLATES_DIR, format!("cannot read {}: {e}", path.display())));
            }
        }
    }
    Ok(BUILTIN.iter().find(|(n, _)| *n == name).map(|(_, s)| (*s).to_owned()))
}

fn arg_str<'a>(args: &'a HashMap<String, Value>, key: &str) -> tera::Result<&'a str> {
    args.get(key).and_then(Value::as_str).ok_or_else(|| tera::Error::msg(format!("missing argument `{key}`")))
}

/// What a template function sees: the variables, the line, the command-line options.
struct Scope {
    vars: VarMap,
    line: KbLine,
    options: Vec<String>,
}

type Args = HashMap<String, Value>;

/// A template function.
type Function = fn(&Scope, &Args) -> tera::Result<Value>;

/// The functions templates call, by name. Each is a plain function so that a built-in template can also be
/// evaluated without Tera ([`role_probe_event`]).
const FUNCTIONS: &[(&str, Function)] = &[
    ("required", fn_required),
    ("optional", fn_optional),
    ("is_set", fn_is_set),
    ("number", fn_number),
    ("flag", fn_flag),
    ("host_port", fn_host_port),
    ("host_ports", fn_host_ports),
    ("fqdn", fn_fqdn),
    ("fqdns", fn_fqdns),
    ("shard_map", fn_shard_map),
    ("names", fn_names),
    ("host_ports_if_set", fn_host_ports_if_set),
    ("host", fn_host),
    ("option", fn_option),
    ("overrides", fn_overrides),
    ("secret_set", fn_secret_set),
    ("kubeblocks_line", fn_kubeblocks_line),
];

fn register_functions(tera: &mut tera::Tera, vars: &VarMap, line: KbLine, options: &[&str]) {
    let scope = Arc::new(scope(vars, line, options));
    for &(name, f) in FUNCTIONS {
        let s = Arc::clone(&scope);
        tera.register_function(name, move |args: &Args| f(&s, args));
    }
}

fn scope(vars: &VarMap, line: KbLine, options: &[&str]) -> Scope {
    Scope { vars: vars.clone(), line, options: options.iter().map(|o| (*o).to_owned()).collect() }
}

// required(var): a non-empty string.
fn fn_required(s: &Scope, args: &Args) -> tera::Result<Value> {
    let v = &s.vars;
    let var = arg_str(args, "var")?;
    required(v, var).map(Value::from)
}

// optional(var, default=null): the value, or the default when unset or empty.
fn fn_optional(s: &Scope, args: &Args) -> tera::Result<Value> {
    let v = &s.vars;
    let var = arg_str(args, "var")?;
    Ok(match v.get(var).map(|s| s.trim()).filter(|s| !s.is_empty()) {
        Some(s) => Value::from(s),
        None => args.get("default").cloned().unwrap_or(Value::Null),
    })
}

// is_set(var): whether the variable is set and non-empty.
fn fn_is_set(s: &Scope, args: &Args) -> tera::Result<Value> {
    let v = &s.vars;
    let var = arg_str(args, "var")?;
    Ok(Value::Bool(v.get(var).is_some_and(|s| !s.trim().is_empty())))
}

// number(var, default, min, max): an integer in range.
fn fn_number(s: &Scope, args: &Args) -> tera::Result<Value> {
    let v = &s.vars;
    let var = arg_str(args, "var")?;
    let min = args.get("min").and_then(Value::as_u64).unwrap_or(0);
    let max = args.get("max").and_then(Value::as_u64).unwrap_or(u64::MAX);
    let raw = match v.get(var).map(|s| s.trim()).filter(|s| !s.is_empty()) {
        Some(s) => s,
        None => {
            return args.get("default").cloned().ok_or_else(|| reject(var, "is not set"));
        }
    };
    let n: u64 = raw.parse().map_err(|_| reject(var, format!("{raw:?} is not a number")))?;
    if n < min || n > max {
        return Err(reject(var, format!("{n} is out of range {min}..={max}")));
    }
    Ok(Value::from(n))
}

// flag(var): `true` or `false` (unset = false).
fn fn_flag(s: &Scope, args: &Args) -> tera::Result<Value> {
    let v = &s.vars;
    let var = arg_str(args, "var")?;
    match v.get(var).map(|s| s.trim().to_ascii_lowercase()).as_deref() {
        None | Some("" | "false") => Ok(Value::Bool(false)),
        Some("true") => Ok(Value::Bool(true)),
        Some(other) => Err(reject(var, format!("{other:?} is neither true nor false"))),
    }
}

// host_port(var): one `host:port`.
fn fn_host_port(s: &Scope, args: &Args) -> tera::Result<Value> {
    let v = &s.vars;
    let var = arg_str(args, "var")?;
    let raw = required(v, var)?;
    check_host_port(&raw).map_err(|e| reject(var, e))?;
    Ok(Value::from(raw))
}

// host_ports(var): a non-empty comma-separated list of `host:port`.
fn fn_host_ports(s: &Scope, args: &Args) -> tera::Result<Value> {
    let v = &s.vars;
    let var = arg_str(args, "var")?;
    let raw = required(v, var)?;
    let list = split_list(&raw, ',');
    if list.is_empty() {
        return Err(reject(var, "lists no endpoint"));
    }
    for item in &list {
        check_host_port(item).map_err(|e| reject(var, e))?;
    }
    Ok(json!(list))
}

// fqdn(var): one pod FQDN.
fn fn_fqdn(s: &Scope, args: &Args) -> tera::Result<Value> {
    let v = &s.vars;
    let var = arg_str(args, "var")?;
    let raw = required(v, var)?;
    check_fqdn(&raw).map_err(|e| reject(var, e))?;
    Ok(Value::from(raw.to_ascii_lowercase()))
}

// fqdns(var): a non-empty comma-separated list of pod FQDNs.
fn fn_fqdns(s: &Scope, args: &Args) -> tera::Result<Value> {
    let v = &s.vars;
    let var = arg_str(args, "var")?;
    let raw = required(v, var)?;
    fqdn_list(&raw).map(|l| json!(l)).map_err(|e| reject(var, e))
}

// shard_map(var): `[{"short": "<sharding>-<id>", "pods": [fqdn, ...]}, ...]` from `a:f1,f2;b:f3`, or from a
// bare `f1,f2`, which is what KubeBlocks gives when exactly one shard exists.
fn fn_shard_map(s: &Scope, args: &Args) -> tera::Result<Value> {
    let v = &s.vars;
    let var = arg_str(args, "var")?;
    let raw = required(v, var)?;
    let entries = split_list(&raw, ';');
    if let [only] = entries.as_slice() {
        if !only.contains(':') {
            let cluster = required(v, vars::CLUSTER_NAME)?;
            let pods = fqdn_list(only).map_err(|e| reject(var, e))?;
            let short = bare_shard(&cluster, &pods).map_err(|e| reject(var, e))?;
            return Ok(json!([{"short": short, "pods": pods}]));
        }
    }
    let mut shards = Vec::new();
    for entry in entries {
        let (short, pods) =
            entry.split_once(':').ok_or_else(|| reject(var, format!("entry {entry:?} is not <shard>:<fqdn>,...")))?;
        let short = short.trim();
        check_label(short).map_err(|e| reject(var, format!("shard name {short:?}: {e}")))?;
        let pods = fqdn_list(pods).map_err(|e| reject(var, format!("shard {short}: {e}")))?;
        if shards.iter().any(|s: &Value| s["short"] == short) {
            return Err(reject(var, format!("shard {short} is listed twice")));
        }
        shards.push(json!({"short": short, "pods": pods}));
    }
    if shards.is_empty() {
        return Err(reject(var, "lists no shard"));
    }
    Ok(Value::Array(shards))
}

// names(var): a comma-separated list (possibly empty) of component names, each a DNS label.
fn fn_names(s: &Scope, args: &Args) -> tera::Result<Value> {
    let v = &s.vars;
    let var = arg_str(args, "var")?;
    let list = v.get(var).map(|s| split_list(s, ',')).unwrap_or_default();
    for name in &list {
        check_label(name).map_err(|e| reject(var, e))?;
    }
    Ok(json!(list))
}

// host_ports_if_set(var): like host_ports, but unset or empty is an empty list (the action may do without).
fn fn_host_ports_if_set(s: &Scope, args: &Args) -> tera::Result<Value> {
    let v = &s.vars;
    let var = arg_str(args, "var")?;
    let raw = v.get(var).map(|s| s.trim()).unwrap_or_default();
    let list = split_list(raw, ',');
    if list.is_empty() && !raw.is_empty() {
        return Err(reject(var, "lists no endpoint"));
    }
    for item in &list {
        check_host_port(item).map_err(|e| reject(var, e))?;
    }
    Ok(json!(list))
}

// host(var, default): one host name or address.
fn fn_host(s: &Scope, args: &Args) -> tera::Result<Value> {
    let v = &s.vars;
    let var = arg_str(args, "var")?;
    match v.get(var).map(|s| s.trim()).filter(|s| !s.is_empty()) {
        Some(host) => {
            check_host(host).map_err(|e| reject(var, e))?;
            Ok(Value::from(host))
        }
        None => args.get("default").cloned().ok_or_else(|| reject(var, "is not set")),
    }
}

// option(name): whether the subcommand was given the command-line option `--<name>`.
fn fn_option(s: &Scope, args: &Args) -> tera::Result<Value> {
    let options = &s.options;
    let name = arg_str(args, "name")?;
    Ok(Value::Bool(options.iter().any(|o| o == name)))
}

// overrides(var): `{"<server>": "<host:port>"}` from `a:9221=127.0.0.1:7001,...` (unset = {}).
fn fn_overrides(s: &Scope, args: &Args) -> tera::Result<Value> {
    let v = &s.vars;
    let var = arg_str(args, "var")?;
    let mut map = serde_json::Map::new();
    for pair in v.get(var).map(|s| split_list(s, ',')).unwrap_or_default() {
        let (from, to) =
            pair.split_once('=').ok_or_else(|| reject(var, format!("{pair:?} is not <server>=<host:port>")))?;
        check_host_port(from).map_err(|e| reject(var, e))?;
        check_host_port(to).map_err(|e| reject(var, e))?;
        map.insert(from.to_ascii_lowercase(), Value::from(to));
    }
    Ok(Value::Object(map))
}

// secret_set(var): whether a secret is given; its value never enters a template.
fn fn_secret_set(s: &Scope, args: &Args) -> tera::Result<Value> {
    let v = &s.vars;
    let var = arg_str(args, "var")?;
    Ok(Value::Bool(v.get(var).is_some_and(|s| !s.is_empty())))
}

fn fn_kubeblocks_line(s: &Scope, _: &Args) -> tera::Result<Value> {
    Ok(Value::from(s.line.as_str()))
}

fn required(vars: &VarMap, var: &str) -> tera::Result<String> {
    if vars::SECRETS.contains(&var) {
        return Err(tera::Error::msg(format!("{var} is a secret and cannot be rendered")));
    }
    match vars.get(var) {
        None => Err(reject(var, "is not set")),
        Some(v) if v.trim().is_empty() => Err(reject(var, "is empty")),
        Some(v) => Ok(v.trim().to_owned()),
    }
}

fn split_list(raw: &str, sep: char) -> Vec<String> {
    raw.split(sep).map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned).collect()
}

/// The short name `<sharding>-<id>` of the one shard whose pods a bare `ALL_SHARDS_POD_FQDNS` lists, from their
/// headless service `<cluster>-<sharding>-<id>-headless`.
fn bare_shard(cluster: &str, pods: &[String]) -> std::result::Result<String, String> {
    let service = |fqdn: &str| crate::clients::server::ServerAddr::of(fqdn).service().unwrap_or_default().to_owned();
    let first = service(&pods[0]);
    if let Some(other) = pods.iter().find(|p| service(p) != first) {
        return Err(format!(
            "without <shard>: keys it must list one shard's pods, but {} and {other} are in different services",
            pods[0]
        ));
    }
    let short = first
        .strip_suffix("-headless")
        .and_then(|s| s.strip_prefix(cluster))
        .and_then(|s| s.strip_prefix('-'))
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            format!("{} is not a pod of a shard of cluster {cluster} (service <cluster>-<shard>-headless)", pods[0])
        })?;
    check_label(short)?;
    Ok(short.to_owned())
}

fn fqdn_list(raw: &str) -> std::result::Result<Vec<String>, String> {
    let list = split_list(raw, ',');
    if list.is_empty() {
        return Err("lists no pod".into());
    }
    let mut out: Vec<String> = Vec::with_capacity(list.len());
    for item in list {
        check_fqdn(&item)?;
        let item = item.to_ascii_lowercase();
        if out.contains(&item) {
            return Err(format!("{item} is listed twice"));
        }
        out.push(item);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every environment of the probe evaluates to what Tera renders from the built-in template: the same event,
    /// or a refusal naming the same variable for the same reason.
    #[test]
    fn the_role_probe_event_without_tera_is_the_built_in_templates() {
        let cases: &[&[(&str, &str)]] = &[
            &[],
            &[("PIKA_HOST", "pika.local"), ("PIKA_PORT", " 9300 "), ("KUBEBLOCKS_LINE", "1.0")],
            &[("PIKA_PASSWORD", "s3cret"), ("ACTION_BUDGET_SECONDS", "3"), ("KUBEBLOCKS_LINE", "1.1")],
            &[("PIKA_ADDRESS_OVERRIDES", "P-0.svc:9221=127.0.0.1:7001, b.svc:9221=127.0.0.1:7002")],
            &[("PIKA_HOST", "[::1]"), ("PIKA_PORT", ""), ("PIKA_PASSWORD", "")],
            &[("PIKA_PORT", "port")],
            &[("PIKA_PORT", "0")],
            &[("PIKA_PORT", "65536")],
            &[("PIKA_HOST", "pika host")],
            &[("PIKA_HOST", "user@pika"), ("PIKA_PORT", "x")],
            &[("PIKA_ADDRESS_OVERRIDES", "a.svc:9221")],
            &[("PIKA_ADDRESS_OVERRIDES", "a.svc:9221=local")],
            &[("ACTION_BUDGET_SECONDS", "0")],
            &[("ACTION_BUDGET_SECONDS", "86401"), ("PIKA_PORT", "1")],
        ];
        for case in cases {
            let vars: VarMap = case.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
            let line = KbLine::from_vars(&vars).unwrap();
            let native = role_probe_event(&vars, line);
            let tera = render_template("role-probe", line, &vars, &[], None);
            match (&native, &tera) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "{case:?}"),
                (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{case:?}"),
                _ => panic!("{case:?}: without Tera {native:?}, with Tera {tera:?}"),
            }
        }
        // The refusals name their variable.
        let vars: VarMap = [("PIKA_PORT".to_owned(), "port".to_owned())].into();
        let err = role_probe_event(&vars, KbLine::V1_1).unwrap_err().to_string();
        assert!(err.contains("PIKA_PORT"), "{err}");
    }

    /// A template function's refusal reaches the caller as the variable at fault, by Tera and without it: not as
    /// the template, which is what the exit-2 message would otherwise blame.
    #[test]
    fn a_rejected_variable_is_the_one_named() {
        let vars: VarMap = [("PIKA_PORT".to_owned(), "port".to_owned())].into();
        for (how, result) in [
            ("without Tera", role_probe_event(&vars, KbLine::V1_1)),
            ("with Tera", render_template("role-probe", KbLine::V1_1, &vars, &[], None)),
        ] {
            match result {
                Err(Error::InvalidInput { var, reason }) => {
                    assert_eq!(var, "PIKA_PORT", "{how}: {reason}");
                    assert_eq!(reason, "\"port\" is not a number", "{how}");
                }
                other => panic!("{how}: {other:?}"),
            }
        }
    }

    fn render_shards(all: &str) -> Result<Value> {
        let vars: VarMap = [
            ("CLUSTER_NAME", "c1"),
            ("CLUSTER_NAMESPACE", "prod"),
            ("CODIS_DASHBOARD_ADDR", "dash:18080"),
            ("ETCD_ENDPOINTS", "etcd:2379"),
            ("SHARD_NAME", "c1-pika-x7k"),
            ("SHARD_POD_FQDNS", "c1-pika-x7k-0.c1-pika-x7k-headless.prod.svc"),
            ("ALL_SHARDS_POD_FQDNS", all),
            ("KB_REMOVE_SHARD_NAME", "c1-pika-x7k"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        render("shard-remove", KbLine::V1_1, &vars, &[]).map(|doc| doc["shards"].clone())
    }

    #[test]
    fn a_bare_all_shards_value_is_the_one_shard_its_pods_name() {
        let pods = "c1-pika-x7k-0.c1-pika-x7k-headless.prod.svc,c1-pika-x7k-1.c1-pika-x7k-headless.prod.svc";
        let shards = render_shards(pods).unwrap();
        assert_eq!(shards[0]["name"], "c1-pika-x7k");
        assert_eq!(shards[0]["pods"].as_array().map(Vec::len), Some(2));
        assert_eq!(shards.as_array().map(Vec::len), Some(1));
        // Two services without keys, another cluster's pods, a bare entry beside keyed ones: refused by name.
        for bad in [
            "c1-pika-x7k-0.c1-pika-x7k-headless.prod.svc,c1-pika-b2c-0.c1-pika-b2c-headless.prod.svc",
            "c2-pika-x7k-0.c2-pika-x7k-headless.prod.svc",
            "c1-pika-x7k-0.c1-pika-x7k.prod.svc",
            "pika-b2c:c1-pika-b2c-0.c1-pika-b2c-headless.prod.svc;c1-pika-x7k-0.c1-pika-x7k-headless.prod.svc",
        ] {
            let err = render_shards(bad).unwrap_err();
            assert!(matches!(&err, Error::InvalidInput { var, .. } if var == "ALL_SHARDS_POD_FQDNS"), "{bad}: {err}");
        }
    }
}
