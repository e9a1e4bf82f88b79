//! Recorded Codis HTTP exchanges (`shared/codis-transcripts/NNN.json`) and the comparison that decides whether a
//! double answered like the recording.
//!
//! The comparison is deliberately structural: the same status code and `Content-Type`; for JSON the same set of
//! field-name paths (object keys recursively, arrays as the union over their elements); `"OK"` bodies, error `Cause`
//! strings and 404 bodies verbatim; `Stack` null exactly where the recording has null. Values are not compared, since
//! they carry times, pids, tokens and ports. The one relaxation is INFO maps (`group/info` and
//! `stats.group.stats.<server>.stats`): their keys come from the backend's INFO, which differs between the recorded
//! codis-server 3.2 and the redis-server the double drives, so only the keys clients rely on are compared both ways,
//! the recorded ones must all be present except known version gaps, and extra backend keys are ignored.

use std::collections::BTreeSet;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

/// One recorded request/response pair.
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
    /// Recorded status.
    pub status: u16,
    /// Recorded response headers (only `Content-Type` is recorded).
    #[serde(default)]
    pub response_headers: std::collections::BTreeMap<String, String>,
    /// Raw response body.
    #[serde(default)]
    pub response_body: String,
}

impl Exchange {
    /// The recorded `Content-Type`, if any.
    #[must_use]
    pub fn content_type(&self) -> Option<&str> {
        self.response_headers
            .get("Content-Type")
            .map(String::as_str)
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
        let ex: Exchange = serde_json::from_str(&text).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        })?;
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
                    out.info_maps
                        .entry(prefix.clone())
                        .or_default()
                        .extend(map.keys().cloned());
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

fn compare_info(
    path: &[String],
    recorded: &BTreeSet<String>,
    actual: &BTreeSet<String>,
    out: &mut Vec<String>,
) {
    for key in recorded.difference(actual) {
        if !INFO_VERSION_GAPS.contains(&key.as_str()) {
            out.push(format!(
                "INFO map {}: recorded key {key:?} missing",
                show(path)
            ));
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
        out.push(format!(
            "status: recorded {}, got {}",
            recorded.status, actual.status
        ));
        return out;
    }
    if let Some(ct) = recorded.content_type() {
        if actual.content_type.as_deref() != Some(ct) {
            out.push(format!(
                "content-type: recorded {ct:?}, got {:?}",
                actual.content_type
            ));
        }
    }
    let json = recorded
        .content_type()
        .is_some_and(|c| c.starts_with("application/json"));
    if !json || recorded.response_body == "\"OK\"" {
        if recorded.response_body != actual.body {
            out.push(format!(
                "body: recorded {:?}, got {:?}",
                recorded.response_body, actual.body
            ));
        }
        return out;
    }
    let (rec, act) = match (
        serde_json::from_str::<Value>(&recorded.response_body),
        serde_json::from_str::<Value>(&actual.body),
    ) {
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
            out.push(format!(
                "Cause: recorded {:?}, got {:?}",
                cause(&rec),
                cause(&act)
            ));
        }
        let stack_kind = |v: &Value| match v.get("Stack") {
            None => "absent",
            Some(Value::Null) => "null",
            Some(Value::Array(_)) => "array",
            Some(_) => "other",
        };
        if stack_kind(&rec) != stack_kind(&act) {
            out.push(format!(
                "Stack: recorded {}, got {}",
                stack_kind(&rec),
                stack_kind(&act)
            ));
        }
        // Stack frames name Go functions and files: only the error's own keys are compared.
        let keys = |v: &Value| {
            v.as_object()
                .map(|m| m.keys().cloned().collect::<BTreeSet<_>>())
                .unwrap_or_default()
        };
        if keys(&rec) != keys(&act) {
            out.push(format!(
                "error keys: recorded {:?}, got {:?}",
                keys(&rec),
                keys(&act)
            ));
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
            status,
            response_headers: [(
                "Content-Type".to_owned(),
                "application/json; charset=utf-8".to_owned(),
            )]
            .into(),
            response_body: body.into(),
        }
    }

    fn answer(status: u16, body: &str) -> Answer {
        Answer {
            status,
            content_type: Some("application/json; charset=utf-8".into()),
            body: body.into(),
        }
    }

    const MODEL: &str = r#"{"token": "a", "start_time": "t", "admin_addr": "x:1", "product_name": "p", "pid": 1,
        "pwd": "/", "sys": "s", "list": [{"id": 1}, {"id": 2, "extra": {"deep": 1}}]}"#;
    const ERROR: &str = r#"{"Cause": "group-[1] already exists", "Stack": [{"Name": "n", "File": "f", "Line": 1}]}"#;

    #[test]
    fn an_identical_shape_with_other_values_conforms() {
        let other = MODEL
            .replace("\"pid\": 1", "\"pid\": 42")
            .replace("x:1", "y:2");
        assert!(compare(&exchange("/topom/model", 200, MODEL), &answer(200, &other)).is_empty());
    }

    #[test]
    fn a_renamed_recorded_field_is_a_mismatch() {
        let recorded = exchange(
            "/topom/model",
            200,
            &MODEL.replace("\"token\"", "\"tokenx\""),
        );
        let m = compare(&recorded, &answer(200, MODEL));
        assert!(
            m.iter().any(|x| x.contains("missing field tokenx")),
            "{m:?}"
        );
        assert!(
            m.iter().any(|x| x.contains("unexpected field token")),
            "{m:?}"
        );
        let nested = exchange(
            "/topom/model",
            200,
            &MODEL.replace("\"deep\"", "\"deeper\""),
        );
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
        assert_eq!(
            compare(&recorded, &answer(800, null)),
            ["Stack: recorded array, got null"]
        );
    }

    #[test]
    fn a_different_status_ok_body_or_404_body_is_a_mismatch() {
        let ok = exchange("/api/topom/xping/x", 200, "\"OK\"");
        assert_eq!(
            compare(&ok, &answer(800, ERROR)),
            ["status: recorded 200, got 800"]
        );
        assert!(!compare(&ok, &answer(200, "\"KO\"")).is_empty());
        let mut nf = exchange("/nope", 404, "404 page not found\n");
        nf.response_headers
            .insert("Content-Type".into(), "text/plain; charset=utf-8".into());
        let plain = |b: &str| Answer {
            status: 404,
            content_type: Some("text/plain; charset=utf-8".into()),
            body: b.into(),
        };
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
        assert!(!compare(
            &exchange("/topom/stats", 200, &unknown_key),
            &answer(200, act)
        )
        .is_empty());
    }
}
