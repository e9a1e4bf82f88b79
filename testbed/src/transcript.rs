//! Recorded Codis HTTP exchanges (`shared/codis-transcripts/NNN.json`, and the sequences of the second recording)
//! and the comparisons that decide whether a double answered like the recording.
//!
//! Three checks, all of which a conformance run applies:
//! - [`compare`], the shape: the same status code and `Content-Type`; for JSON the same set of field-name paths
//!   (object keys recursively, arrays as the union over their elements); `"OK"` bodies, error `Cause` strings and
//!   404 bodies verbatim; `Stack` null exactly where the recording has null. INFO maps (`group/info` and
//!   `stats.group.stats.<server>.stats`) come from the backend (codis-server 3.2 recorded, redis-server 7 here):
//!   the keys clients rely on are compared both ways, every recorded key must be present except known version gaps.
//! - [`compare_values`], the values: every leaf of the recorded JSON against the answer, array element by array
//!   element, after [`Normaliser`] has put the registered addresses back where the double dialled real ones. Only
//!   what is genuinely run-specific is left out, each with its reason ([`IGNORED`]): process identity (dashboard
//!   token, start times, pids, working directory, uname, host name, the dashboard's own listen port), timestamps,
//!   traffic counters and resource usage, stack frames, the coordinator the double does not have, the build
//!   strings, INFO values other than the ones clients read, and the key count in `[OK] Slot[NNNN]@DB[0]=<n>`.
//! - [`check_order`], for a recorded sequence of samples: the double's states, traced at every change, pass
//!   through the recorded states in the recorded order.

use std::collections::BTreeSet;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

/// One sample of a recorded sequence.
#[derive(Clone, Debug, Deserialize)]
pub struct Sample {
    /// Milliseconds since the sequence started.
    pub t_ms: u64,
    /// Status.
    pub status: u16,
    /// Body (trimmed as the sequence's title says).
    pub response_body: String,
}

/// One recorded request/response pair, or (`kind: "sequence"`) repeated samples of one GET.
#[derive(Clone, Debug, Deserialize)]
pub struct Exchange {
    /// `001`, `002`, ...
    pub id: String,
    /// What the exchange shows.
    #[serde(default)]
    pub title: String,
    /// `dashboard`, `proxy-admin` or `fe`.
    pub service: String,
    /// HTTP method.
    pub method: String,
    /// Path (and query) as sent.
    pub path: String,
    /// Request body, if any.
    #[serde(default)]
    pub request_body: Option<String>,
    /// `sequence` for repeated samples, else empty.
    #[serde(default)]
    pub kind: String,
    /// Recorded status (0 for a sequence).
    #[serde(default)]
    pub status: u16,
    /// Recorded response headers (only `Content-Type` is recorded).
    #[serde(default)]
    pub response_headers: std::collections::BTreeMap<String, String>,
    /// Raw response body.
    #[serde(default)]
    pub response_body: String,
    /// The samples of a sequence.
    #[serde(default)]
    pub exchanges: Vec<Sample>,
}

impl Exchange {
    /// Whether this is a sequence of samples rather than one exchange.
    #[must_use]
    pub fn is_sequence(&self) -> bool {
        self.kind == "sequence"
    }

    /// The recorded `Content-Type`, if any.
    #[must_use]
    pub fn content_type(&self) -> Option<&str> {
        self.response_headers.get("Content-Type").map(String::as_str)
    }
}

/// Loads every `*.json` exchange of `dir`, in id order.
///
/// # Errors
/// When the directory or a file cannot be read or parsed.
pub fn load_dir(dir: &Path) -> std::io::Result<Vec<Exchange>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let text = std::fs::read_to_string(&path)?;
        let ex: Exchange = serde_json::from_str(&text)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: {e}", path.display())))?;
        out.push(ex);
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}

/// What a double answered.
#[derive(Clone, Debug, Default)]
pub struct Answer {
    /// Status code.
    pub status: u16,
    /// `Content-Type` header, if any.
    pub content_type: Option<String>,
    /// Body text.
    pub body: String,
}

/// INFO keys clients read or the dashboard adds: compared both ways.
const CONTRACT_INFO_KEYS: &[&str] = &[
    "role",
    "master_addr",
    "master_host",
    "master_port",
    "master_link_status",
    "maxmemory",
    "connected_slaves",
    "slave0",
    "db0",
];

/// Keys codis-server 3.2.11 (redis 3.2) prints that redis-server 7 no longer does (renamed in redis 5).
const INFO_VERSION_GAPS: &[&str] = &["client_biggest_input_buf", "client_longest_output_list"];

type KeyPath = Vec<String>;

fn is_info_map(exchange_path: &str, path: &[String]) -> bool {
    if path.is_empty() {
        return exchange_path.starts_with("/api/topom/group/info/");
    }
    let n = path.len();
    n >= 4 && path[n - 4] == "group" && path[n - 3] == "stats" && path[n - 1] == "stats"
}

#[derive(Default)]
struct Shape {
    paths: BTreeSet<KeyPath>,
    info_maps: std::collections::BTreeMap<KeyPath, BTreeSet<String>>,
}

fn shape(exchange_path: &str, value: &Value) -> Shape {
    fn walk(exchange_path: &str, v: &Value, prefix: &mut KeyPath, out: &mut Shape) {
        match v {
            Value::Object(map) => {
                if is_info_map(exchange_path, prefix) {
                    out.info_maps.entry(prefix.clone()).or_default().extend(map.keys().cloned());
                    return;
                }
                for (k, x) in map {
                    prefix.push(k.clone());
                    out.paths.insert(prefix.clone());
                    walk(exchange_path, x, prefix, out);
                    prefix.pop();
                }
            }
            Value::Array(items) => {
                prefix.push("[]".into());
                for x in items {
                    walk(exchange_path, x, prefix, out);
                }
                prefix.pop();
            }
            _ => {}
        }
    }
    let mut out = Shape::default();
    walk(exchange_path, value, &mut Vec::new(), &mut out);
    out
}

fn show(path: &[String]) -> String {
    if path.is_empty() {
        "(root)".into()
    } else {
        path.join(".").replace(".[]", "[]")
    }
}

fn compare_info(path: &[String], recorded: &BTreeSet<String>, actual: &BTreeSet<String>, out: &mut Vec<String>) {
    for key in recorded.difference(actual) {
        if !INFO_VERSION_GAPS.contains(&key.as_str()) {
            out.push(format!("INFO map {}: recorded key {key:?} missing", show(path)));
        }
    }
    for key in actual.difference(recorded) {
        if CONTRACT_INFO_KEYS.contains(&key.as_str()) {
            out.push(format!("INFO map {}: unexpected key {key:?}", show(path)));
        }
    }
}

/// Compares an answer with a recording; the mismatches, empty when the answer conforms.
#[must_use]
pub fn compare(recorded: &Exchange, actual: &Answer) -> Vec<String> {
    let mut out = Vec::new();
    if recorded.status != actual.status {
        out.push(format!("status: recorded {}, got {}", recorded.status, actual.status));
        return out;
    }
    if let Some(ct) = recorded.content_type() {
        if actual.content_type.as_deref() != Some(ct) {
            out.push(format!("content-type: recorded {ct:?}, got {:?}", actual.content_type));
        }
    }
    let json = recorded.content_type().is_some_and(|c| c.starts_with("application/json"));
    if !json || recorded.response_body == "\"OK\"" {
        if recorded.response_body != actual.body {
            out.push(format!("body: recorded {:?}, got {:?}", recorded.response_body, actual.body));
        }
        return out;
    }
    let (rec, act) =
        match (serde_json::from_str::<Value>(&recorded.response_body), serde_json::from_str::<Value>(&actual.body)) {
            (Ok(r), Ok(a)) => (r, a),
            (Err(e), _) => {
                out.push(format!("recorded body is not JSON: {e}"));
                return out;
            }
            (_, Err(e)) => {
                out.push(format!("body is not JSON ({e}): {:?}", actual.body));
                return out;
            }
        };
    if recorded.status == 800 {
        let cause = |v: &Value| v.get("Cause").and_then(Value::as_str).map(str::to_owned);
        if cause(&rec) != cause(&act) {
            out.push(format!("Cause: recorded {:?}, got {:?}", cause(&rec), cause(&act)));
        }
        let stack_kind = |v: &Value| match v.get("Stack") {
            None => "absent",
            Some(Value::Null) => "null",
            Some(Value::Array(_)) => "array",
            Some(_) => "other",
        };
        if stack_kind(&rec) != stack_kind(&act) {
            out.push(format!("Stack: recorded {}, got {}", stack_kind(&rec), stack_kind(&act)));
        }
        // Stack frames name Go functions and files: only the error's own keys are compared.
        let keys = |v: &Value| v.as_object().map(|m| m.keys().cloned().collect::<BTreeSet<_>>()).unwrap_or_default();
        if keys(&rec) != keys(&act) {
            out.push(format!("error keys: recorded {:?}, got {:?}", keys(&rec), keys(&act)));
        }
        return out;
    }
    let path = recorded.path.split('?').next().unwrap_or(&recorded.path);
    let (r, a) = (shape(path, &rec), shape(path, &act));
    for p in r.paths.difference(&a.paths) {
        out.push(format!("missing field {}", show(p)));
    }
    for p in a.paths.difference(&r.paths) {
        out.push(format!("unexpected field {}", show(p)));
    }
    let empty = BTreeSet::new();
    for (p, keys) in &r.info_maps {
        compare_info(p, keys, a.info_maps.get(p).unwrap_or(&empty), &mut out);
    }
    for (p, keys) in &a.info_maps {
        if !r.info_maps.contains_key(p) {
            compare_info(p, &empty, keys, &mut out);
        }
    }
    out
}

// ---- values ------------------------------------------------------------------------------------------------------

/// What the value comparison leaves out, and why: `(rule, reason)`.
pub const IGNORED: &[(&str, &str)] = &[
    (
        "dashboard model token, start_time, pid, pwd, sys, admin_addr",
        "process identity and the listen port of this run",
    ),
    ("proxy model start_time, pid, pwd, sys, hostname", "process identity of this run"),
    ("unixtime", "a timestamp"),
    ("proxy stats ops, sessions, rusage, runtime", "traffic counters and resource usage of this run"),
    ("Stack frames", "Go function and file names (the Stack kind is compared by the shape check)"),
    (
        "config coordinator_name, coordinator_addr, coordinator_auth, admin_addr",
        "the double has no coordinator; the listen port of this run",
    ),
    ("version, compile", "the build strings of the binary that answered"),
    (
        "INFO values other than role, master_*, connected_slaves, maxmemory",
        "server version, memory, offsets, uptime and key counts of this run's backends",
    ),
    ("the <n> of [OK] Slot[NNNN]@DB[0]=<n>", "keys left depend on the keys this run wrote"),
];

/// INFO keys whose values clients read: compared by value.
const INFO_VALUE_KEYS: &[&str] =
    &["role", "master_addr", "master_host", "master_port", "master_link_status", "connected_slaves", "maxmemory"];

/// Puts a run's real addresses back to the registered ones the recording shows.
#[derive(Clone, Debug, Default)]
pub struct Normaliser {
    /// `(real, registered)`, longest real first so `127.0.0.1:1234` is not replaced inside `127.0.0.1:12345`.
    addresses: Vec<(String, String)>,
}

impl Normaliser {
    /// From `registered → real` overrides.
    #[must_use]
    pub fn new(overrides: &std::collections::BTreeMap<String, String>) -> Self {
        let mut addresses: Vec<(String, String)> =
            overrides.iter().map(|(reg, real)| (real.clone(), reg.clone())).collect();
        addresses.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
        Self { addresses }
    }

    /// `text` with every real address replaced by its registered spelling (whole `host:port` tokens only).
    #[must_use]
    pub fn apply(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for (real, registered) in &self.addresses {
            let mut result = String::with_capacity(out.len());
            let mut rest = out.as_str();
            while let Some(pos) = rest.find(real.as_str()) {
                let end = pos + real.len();
                let next_is_digit = rest[end..].chars().next().is_some_and(|c| c.is_ascii_digit());
                result.push_str(&rest[..pos]);
                result.push_str(if next_is_digit { real } else { registered });
                rest = &rest[end..];
            }
            result.push_str(rest);
            out = result;
        }
        out
    }
}

/// The outcome of [`compare_values`].
#[derive(Clone, Debug, Default)]
pub struct ValueReport {
    /// Leaf values compared.
    pub compared: usize,
    /// Differences, `path: recorded X, got Y`.
    pub mismatches: Vec<String>,
}

fn is_dashboard_model(exchange_path: &str, path: &[String]) -> bool {
    match path {
        [k] => {
            (exchange_path == "/topom/model" || exchange_path == "/api/topom/model")
                && ["token", "start_time", "pid", "pwd", "sys", "admin_addr"].contains(&k.as_str())
        }
        [m, k] => m == "model" && ["token", "start_time", "pid", "pwd", "sys", "admin_addr"].contains(&k.as_str()),
        _ => false,
    }
}

fn is_proxy_identity(exchange_path: &str, path: &[String]) -> bool {
    const KEYS: &[&str] = &["start_time", "pid", "pwd", "sys", "hostname"];
    match path {
        [k] => (exchange_path == "/api/proxy/model" || exchange_path == "/proxy/model") && KEYS.contains(&k.as_str()),
        [.., p, m, i, k] => p == "proxy" && m == "models" && i == "[]" && KEYS.contains(&k.as_str()),
        _ => false,
    }
}

fn is_proxy_counters(exchange_path: &str, path: &[String]) -> bool {
    const KEYS: &[&str] = &["ops", "sessions", "rusage", "runtime"];
    match path {
        [k] => {
            (exchange_path == "/proxy/stats" || exchange_path.starts_with("/api/proxy/stats/"))
                && KEYS.contains(&k.as_str())
        }
        [.., p, st, _, st2, k] => p == "proxy" && st == "stats" && st2 == "stats" && KEYS.contains(&k.as_str()),
        _ => false,
    }
}

fn ignored(exchange_path: &str, path: &[String]) -> bool {
    let last = path.last().map(String::as_str);
    last == Some("unixtime")
        || last == Some("Stack")
        || is_dashboard_model(exchange_path, path)
        || is_proxy_identity(exchange_path, path)
        || is_proxy_counters(exchange_path, path)
        || (exchange_path == "/topom" && matches!(path, [k] if k == "version" || k == "compile"))
        || matches!(path, [c, k] if c == "config"
            && ["coordinator_name", "coordinator_addr", "coordinator_auth", "admin_addr"].contains(&k.as_str()))
}

/// `[OK] Slot[0100]@DB[0]=17519` → `[OK] Slot[0100]@DB[0]=<n>`.
#[must_use]
pub fn normalise_status(status: &str) -> String {
    match status.strip_prefix("[OK] ").and_then(|r| r.rsplit_once('=')) {
        Some((head, n)) if n.chars().all(|c| c.is_ascii_digit()) => format!("[OK] {head}=<n>"),
        _ => status.to_owned(),
    }
}

/// Compares every recorded value with the answer (see the module doc for what is left out). Statuses and shapes
/// are [`compare`]'s; this looks at JSON bodies only (non-JSON bodies are compared verbatim by [`compare`]).
#[must_use]
pub fn compare_values(recorded: &Exchange, actual: &Answer, norm: &Normaliser) -> ValueReport {
    let mut report = ValueReport::default();
    let (Ok(rec), Ok(act)) = (
        serde_json::from_str::<Value>(&recorded.response_body),
        serde_json::from_str::<Value>(&norm.apply(&actual.body)),
    ) else {
        return report;
    };
    let exchange_path = recorded.path.split('?').next().unwrap_or(&recorded.path);
    walk_values(exchange_path, &rec, &act, &mut Vec::new(), &mut report);
    report
}

fn show_value(v: &Value) -> String {
    let text = v.to_string();
    if text.len() > 120 {
        format!("{}…", &text[..text.char_indices().nth(117).map_or(text.len(), |(i, _)| i)])
    } else {
        text
    }
}

fn walk_values(exchange_path: &str, rec: &Value, act: &Value, path: &mut Vec<String>, out: &mut ValueReport) {
    if ignored(exchange_path, path) {
        return;
    }
    let here = |path: &[String]| if path.is_empty() { "(root)".to_owned() } else { path.join(".") };
    if is_info_map(exchange_path, path) {
        for key in INFO_VALUE_KEYS {
            let (r, a) = (rec.get(*key), act.get(*key));
            if r.is_none() && a.is_none() {
                continue;
            }
            out.compared += 1;
            if r != a {
                out.mismatches.push(format!(
                    "{}.{key}: recorded {}, got {}",
                    here(path),
                    r.map_or("absent".into(), show_value),
                    a.map_or("absent".into(), show_value)
                ));
            }
        }
        return;
    }
    match (rec, act) {
        (Value::Object(r), Value::Object(a)) => {
            for (k, rv) in r {
                path.push(k.clone());
                match a.get(k) {
                    Some(av) => walk_values(exchange_path, rv, av, path, out),
                    None => {
                        if !ignored(exchange_path, path) {
                            out.mismatches.push(format!("{}: recorded {}, got absent", here(path), show_value(rv)));
                        }
                    }
                }
                path.pop();
            }
            for (k, av) in a {
                if !r.contains_key(k) {
                    path.push(k.clone());
                    if !ignored(exchange_path, path) {
                        out.mismatches.push(format!("{}: recorded absent, got {}", here(path), show_value(av)));
                    }
                    path.pop();
                }
            }
        }
        (Value::Array(r), Value::Array(a)) => {
            if r.len() != a.len() {
                out.mismatches.push(format!("{}: recorded {} elements, got {}", here(path), r.len(), a.len()));
            }
            for (i, (rv, av)) in r.iter().zip(a).enumerate() {
                path.push("[]".into());
                let before = out.mismatches.len();
                walk_values(exchange_path, rv, av, path, out);
                path.pop();
                // Name the element in what was found.
                let (prefix, named) = if path.is_empty() {
                    ("[]".to_owned(), format!("[{i}]"))
                } else {
                    (format!("{}.[]", here(path)), format!("{}[{i}]", here(path)))
                };
                for m in &mut out.mismatches[before..] {
                    if let Some(rest) = m.strip_prefix(&prefix) {
                        *m = format!("{named}{rest}");
                    }
                }
            }
        }
        (Value::String(r), Value::String(a)) if path.last().is_some_and(|k| k == "status") => {
            out.compared += 1;
            if normalise_status(r) != normalise_status(a) {
                out.mismatches.push(format!("{}: recorded {r:?}, got {a:?}", here(path)));
            }
        }
        (r, a) => {
            out.compared += 1;
            if r != a {
                out.mismatches.push(format!("{}: recorded {}, got {}", here(path), show_value(r), show_value(a)));
            }
        }
    }
}

// ---- orderings ---------------------------------------------------------------------------------------------------

/// The outcome of [`check_order`].
#[derive(Clone, Debug, Default)]
pub struct OrderReport {
    /// The recorded states, consecutive repeats collapsed.
    pub recorded: Vec<Value>,
    /// The double's states from its first match of the first recorded one, repeats collapsed.
    pub observed: Vec<Value>,
    /// Why the orderings disagree; empty when they agree.
    pub mismatches: Vec<String>,
}

fn collapse(states: impl IntoIterator<Item = Value>) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for s in states {
        if out.last() != Some(&s) {
            out.push(s);
        }
    }
    out
}

/// Checks that the double went through the recorded states in the recorded order. `recorded` are the projected
/// samples (a sampled recording misses short states), `observed` the double's projected states at every change.
/// The recorded states, repeats collapsed, must appear in the observed ones in order, starting with the first and
/// ending with the last; an observed state that the recording does not have is allowed only when `transient` says
/// the recording's sampling could have missed it (it must say why, in the code that calls this).
#[must_use]
pub fn check_order(
    recorded: impl IntoIterator<Item = Value>,
    observed: impl IntoIterator<Item = Value>,
    transient: impl Fn(&Value) -> bool,
) -> OrderReport {
    let recorded = collapse(recorded);
    let all = collapse(observed);
    let mut report = OrderReport { recorded: recorded.clone(), ..OrderReport::default() };
    let Some(first) = recorded.first() else {
        report.mismatches.push("the recording has no state".into());
        return report;
    };
    let Some(start) = all.iter().position(|s| s == first) else {
        report.observed = all;
        report.mismatches.push(format!("the double never showed the first recorded state {first}"));
        return report;
    };
    report.observed = all[start..].to_vec();
    let mut next = 0;
    for (i, s) in report.observed.iter().enumerate() {
        if next < recorded.len() && *s == recorded[next] {
            next += 1;
        } else if !recorded.contains(s) && !transient(s) {
            report.mismatches.push(format!("observed state #{i} is not a recorded one: {s}"));
        }
    }
    if next < recorded.len() {
        report.mismatches.push(format!("recorded state #{next} never followed in order: {}", recorded[next]));
    }
    if report.observed.last() != recorded.last() {
        report.mismatches.push(format!(
            "the double ended in {}, the recording in {}",
            report.observed.last().map_or("nothing".into(), Value::to_string),
            recorded.last().map_or("nothing".into(), Value::to_string)
        ));
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exchange(path: &str, status: u16, body: &str) -> Exchange {
        Exchange {
            id: "t".into(),
            title: String::new(),
            service: "dashboard".into(),
            method: "GET".into(),
            path: path.into(),
            request_body: None,
            kind: String::new(),
            exchanges: Vec::new(),
            status,
            response_headers: [("Content-Type".to_owned(), "application/json; charset=utf-8".to_owned())].into(),
            response_body: body.into(),
        }
    }

    fn answer(status: u16, body: &str) -> Answer {
        Answer { status, content_type: Some("application/json; charset=utf-8".into()), body: body.into() }
    }

    const MODEL: &str = r#"{"token": "a", "start_time": "t", "admin_addr": "x:1", "product_name": "p", "pid": 1,
        "pwd": "/", "sys": "s", "list": [{"id": 1}, {"id": 2, "extra": {"deep": 1}}]}"#;
    const ERROR: &str = r#"{"Cause": "group-[1] already exists", "Stack": [{"Name": "n", "File": "f", "Line": 1}]}"#;

    #[test]
    fn an_identical_shape_with_other_values_conforms() {
        let other = MODEL.replace("\"pid\": 1", "\"pid\": 42").replace("x:1", "y:2");
        assert!(compare(&exchange("/topom/model", 200, MODEL), &answer(200, &other)).is_empty());
    }

    #[test]
    fn a_renamed_recorded_field_is_a_mismatch() {
        let recorded = exchange("/topom/model", 200, &MODEL.replace("\"token\"", "\"tokenx\""));
        let m = compare(&recorded, &answer(200, MODEL));
        assert!(m.iter().any(|x| x.contains("missing field tokenx")), "{m:?}");
        assert!(m.iter().any(|x| x.contains("unexpected field token")), "{m:?}");
        let nested = exchange("/topom/model", 200, &MODEL.replace("\"deep\"", "\"deeper\""));
        assert!(!compare(&nested, &answer(200, MODEL)).is_empty());
    }

    #[test]
    fn a_removed_recorded_field_is_a_mismatch() {
        let recorded = exchange("/topom/model", 200, &MODEL.replace("\"pid\": 1,", ""));
        let m = compare(&recorded, &answer(200, MODEL));
        assert_eq!(m, ["unexpected field pid"]);
    }

    #[test]
    fn a_different_cause_or_stack_kind_is_a_mismatch() {
        let recorded = exchange("/api/topom/group/create/x/1", 800, ERROR);
        assert!(compare(&recorded, &answer(800, ERROR)).is_empty());
        let other = ERROR.replace("group-[1]", "group-[2]");
        assert_eq!(compare(&recorded, &answer(800, &other)).len(), 1);
        let null = r#"{"Cause": "group-[1] already exists", "Stack": null}"#;
        assert_eq!(compare(&recorded, &answer(800, null)), ["Stack: recorded array, got null"]);
    }

    #[test]
    fn a_different_status_ok_body_or_404_body_is_a_mismatch() {
        let ok = exchange("/api/topom/xping/x", 200, "\"OK\"");
        assert_eq!(compare(&ok, &answer(800, ERROR)), ["status: recorded 200, got 800"]);
        assert!(!compare(&ok, &answer(200, "\"KO\"")).is_empty());
        let mut nf = exchange("/nope", 404, "404 page not found\n");
        nf.response_headers.insert("Content-Type".into(), "text/plain; charset=utf-8".into());
        let plain =
            |b: &str| Answer { status: 404, content_type: Some("text/plain; charset=utf-8".into()), body: b.into() };
        assert!(compare(&nf, &plain("404 page not found\n")).is_empty());
        assert!(!compare(&nf, &plain("not found")).is_empty());
        assert!(!compare(&nf, &answer(404, "404 page not found\n")).is_empty());
    }

    #[test]
    fn info_maps_tolerate_backend_extras_but_not_missing_or_renamed_keys() {
        let rec = r#"{"group": {"stats": {"10.0.0.1:6379": {"stats": {"role": "master", "maxmemory": "0",
            "client_biggest_input_buf": "0", "uptime_in_days": "0"}, "unixtime": 1}}}}"#;
        let act = r#"{"group": {"stats": {"10.0.0.1:6379": {"stats": {"role": "master", "maxmemory": "0",
            "uptime_in_days": "0", "io_threads_active": "0"}, "unixtime": 2}}}}"#;
        assert!(compare(&exchange("/topom/stats", 200, rec), &answer(200, act)).is_empty());
        let renamed = rec.replace("\"role\"", "\"rolex\"");
        assert!(!compare(&exchange("/topom/stats", 200, &renamed), &answer(200, act)).is_empty());
        let removed = rec.replace("\"role\": \"master\",", "");
        assert!(!compare(&exchange("/topom/stats", 200, &removed), &answer(200, act)).is_empty());
        let unknown_key = rec.replace("\"client_biggest_input_buf\": \"0\"", "\"x\": \"0\"");
        assert!(!compare(&exchange("/topom/stats", 200, &unknown_key), &answer(200, act)).is_empty());
    }

    #[test]
    fn values_are_compared_leaf_by_leaf_and_run_specific_ones_are_left_out() {
        let rec = r#"{"model": {"token": "a", "pid": 1, "product_name": "p"}, "slots": [{"id": 0, "group_id": 1}],
            "unixtime": 5, "slot_action": {"progress": {"status": "[OK] Slot[0100]@DB[0]=17519"}}}"#;
        let same = r#"{"model": {"token": "b", "pid": 2, "product_name": "p"}, "slots": [{"id": 0, "group_id": 1}],
            "unixtime": 9, "slot_action": {"progress": {"status": "[OK] Slot[0100]@DB[0]=3"}}}"#;
        let norm = Normaliser::default();
        let r = compare_values(&exchange("/topom", 200, rec), &answer(200, same), &norm);
        assert!(r.mismatches.is_empty(), "{:?}", r.mismatches);
        assert_eq!(r.compared, 4);
        let other_owner = same.replace("\"group_id\": 1", "\"group_id\": 2");
        let r = compare_values(&exchange("/topom", 200, rec), &answer(200, &other_owner), &norm);
        assert_eq!(r.mismatches, ["slots[0].group_id: recorded 1, got 2"]);
        let other_slot = same.replace("Slot[0100]", "Slot[0101]");
        assert_eq!(compare_values(&exchange("/topom", 200, rec), &answer(200, &other_slot), &norm).mismatches.len(), 1);
        let fewer = same.replace("[{\"id\": 0, \"group_id\": 1}]", "[]");
        assert!(!compare_values(&exchange("/topom", 200, rec), &answer(200, &fewer), &norm).mismatches.is_empty());
    }

    #[test]
    fn real_addresses_are_put_back_whole() {
        let norm = Normaliser::new(&[("127.0.0.1:6381".to_owned(), "127.0.0.1:4000".to_owned())].into());
        assert_eq!(
            norm.apply("dial tcp 127.0.0.1:4000: refused, not 127.0.0.1:40001"),
            "dial tcp 127.0.0.1:6381: refused, not 127.0.0.1:40001"
        );
    }

    #[test]
    fn an_ordering_must_contain_the_recorded_states_in_order() {
        let v = |x: &str| Value::String(x.into());
        let rec = [v("a"), v("a"), v("b"), v("c")];
        let ok = check_order(rec.clone(), [v("x"), v("a"), v("t"), v("b"), v("c")], |s| *s == v("t"));
        assert!(ok.mismatches.is_empty(), "{:?}", ok.mismatches);
        let swapped = check_order(rec.clone(), [v("a"), v("c"), v("b"), v("c")], |_| false);
        assert!(swapped.mismatches.is_empty(), "b then c still appears in order: {:?}", swapped.mismatches);
        let missing = check_order(rec.clone(), [v("a"), v("c")], |_| false);
        assert!(!missing.mismatches.is_empty());
        let unknown = check_order(rec.clone(), [v("a"), v("z"), v("b"), v("c")], |_| false);
        assert!(!unknown.mismatches.is_empty());
        let wrong_end = check_order(rec, [v("a"), v("b"), v("c"), v("b")], |_| false);
        assert!(!wrong_end.mismatches.is_empty());
    }
}
