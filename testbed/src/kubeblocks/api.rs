//! A minimal Kubernetes API server over plain HTTP, what `KUBE_API_URL` points the binary at (as `kubectl proxy`
//! would serve it): the emulated objects read-only, and `POST` of core Events, which are recorded.
//!
//! Serves `GET /api/v1/namespaces/{ns}/pods[?labelSelector=k=v,...]`, `GET /api/v1/namespaces/{ns}/pods/{name}`,
//! `GET /apis/workloads.kubeblocks.io/v1/namespaces/{ns}/instancesets/{name}`,
//! `GET /apis/apps.kubeblocks.io/v1/namespaces/{ns}/clusters/{name}` (with `metadata.deletionTimestamp` while the
//! cluster is being deleted, 404 once it is gone), `GET .../components/{name}`, and
//! `POST /api/v1/namespaces/{ns}/events`. Anything else is a Kubernetes-style 404 `Status`.
//!
//! Does NOT model: authentication and RBAC (the chart's policyRules are not enforced), watches, resource versions,
//! field selectors, set-based label selectors, PATCH/PUT/DELETE, the events.k8s.io API.

use std::collections::BTreeMap;
use std::io::BufReader;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use crate::http1;

/// What the API server serves, supplied by the emulation.
pub trait Backend: Send + Sync {
    /// A GET of `path` with the parsed query: `Some(object)` or `None` for 404.
    fn get(&self, path: &[&str], query: &BTreeMap<String, String>) -> Option<Value>;
    /// A created core Event in `namespace`.
    fn event(&self, namespace: &str, event: Value);
}

/// One request, as logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// `GET`, `POST`, ...
    pub method: String,
    /// Path with query.
    pub target: String,
    /// Answer status.
    pub status: u16,
}

/// A running API server; dropping it stops accepting connections.
pub struct ApiServer {
    url: String,
    requests: Arc<Mutex<Vec<Request>>>,
    stop: Arc<AtomicBool>,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer").field("url", &self.url).finish_non_exhaustive()
    }
}

impl ApiServer {
    /// Serves `backend` on a free loopback port.
    pub fn start(backend: Arc<dyn Backend>) -> std::io::Result<ApiServer> {
        Self::start_with(backend, crate::process::bind_loopback()?)
    }

    /// Serves `backend` on a free port of `host` (the real bed's node address, which its pods reach).
    pub fn start_at(backend: Arc<dyn Backend>, host: std::net::Ipv4Addr) -> std::io::Result<ApiServer> {
        Self::start_with(backend, std::net::TcpListener::bind((host, 0))?)
    }

    fn start_with(backend: Arc<dyn Backend>, listener: std::net::TcpListener) -> std::io::Result<ApiServer> {
        let url = format!("http://{}", listener.local_addr()?);
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (reqs, stopped) = (Arc::clone(&requests), Arc::clone(&stop));
        listener.set_nonblocking(true)?;
        std::thread::Builder::new().name("kbemu-api".into()).spawn(move || loop {
            if stopped.load(Ordering::SeqCst) {
                return;
            }
            match listener.accept() {
                Ok((stream, _)) => {
                    let (backend, reqs, stopped) = (Arc::clone(&backend), Arc::clone(&reqs), Arc::clone(&stopped));
                    let _ = stream.set_nonblocking(false);
                    std::thread::spawn(move || serve(stream, &*backend, &reqs, &stopped));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        })?;
        Ok(ApiServer { url, requests, stop })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Every request served so far.
    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn not_found(what: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": format!("{what} not found"), "reason": "NotFound", "code": 404})
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses `a=b&c=d` (percent-decoded).
pub fn parse_query(query: &str) -> BTreeMap<String, String> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

/// Whether `labels` satisfy an equality-based selector (`k=v,k2==v2,k3!=v3`).
pub fn selector_matches(selector: &str, labels: &BTreeMap<String, String>) -> bool {
    selector.split(',').map(str::trim).filter(|t| !t.is_empty()).all(|term| {
        if let Some((k, v)) = term.split_once("!=") {
            labels.get(k.trim()).map(String::as_str) != Some(v.trim())
        } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
            labels.get(k.trim()).map(String::as_str) == Some(v.trim())
        } else {
            labels.contains_key(term)
        }
    })
}

fn serve(stream: TcpStream, backend: &dyn Backend, requests: &Mutex<Vec<Request>>, stop: &AtomicBool) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let Ok(clone) = stream.try_clone() else { return };
    let mut reader = BufReader::new(clone);
    let mut writer = stream;
    loop {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Some(request) = http1::read_request(&mut reader) else { return };
        let path = request.path();
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let query = parse_query(request.query());
        let (status, reply) = match request.method.as_str() {
            "GET" => match backend.get(&segments, &query) {
                Some(v) => (200, v),
                None => (404, not_found(path)),
            },
            "POST" if segments.len() == 5 && segments[..2] == ["api", "v1"] && segments[4] == "events" => {
                let mut event: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
                if let Some(meta) = event.get_mut("metadata").and_then(Value::as_object_mut) {
                    if !meta.contains_key("name") {
                        let prefix = meta.get("generateName").and_then(Value::as_str).unwrap_or("event.").to_owned();
                        let n = requests.lock().map(|r| r.len()).unwrap_or(0);
                        meta.insert("name".into(), Value::String(format!("{prefix}{n:05}")));
                    }
                }
                backend.event(segments[3], event.clone());
                (201, event)
            }
            _ => (404, not_found(path)),
        };
        if let Ok(mut log) = requests.lock() {
            log.push(Request { method: request.method.clone(), target: request.target.clone(), status });
        }
        if http1::write_json(&mut writer, status, &reply.to_string()).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, Read, Write};

    use super::*;

    struct Fixed(Mutex<Vec<Value>>);

    impl Backend for Fixed {
        fn get(&self, path: &[&str], query: &BTreeMap<String, String>) -> Option<Value> {
            (path == ["api", "v1", "namespaces", "ns", "pods"])
                .then(|| json!({"kind": "PodList", "selector": query.get("labelSelector")}))
        }
        fn event(&self, _namespace: &str, event: Value) {
            self.0.lock().unwrap().push(event);
        }
    }

    fn http(url: &str, raw: &str) -> String {
        let addr = url.strip_prefix("http://").unwrap();
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(raw.as_bytes()).unwrap();
        let mut reader = BufReader::new(s);
        let mut out = String::new();
        let mut length = 0;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap();
            }
            out.push_str(&line);
            if line == "\r\n" {
                break;
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        out + &String::from_utf8(body).unwrap()
    }

    #[test]
    fn gets_are_routed_with_decoded_selectors_and_events_are_recorded() {
        let backend = Arc::new(Fixed(Mutex::new(Vec::new())));
        let api = ApiServer::start(backend.clone()).unwrap();
        let got = http(
            api.url(),
            "GET /api/v1/namespaces/ns/pods?labelSelector=app.kubernetes.io%2Finstance%3Dc1 HTTP/1.1\r\nHost: x\r\n\r\n",
        );
        assert!(got.starts_with("HTTP/1.1 200"), "{got}");
        assert!(got.contains(r#""selector":"app.kubernetes.io/instance=c1""#), "{got}");
        let missing = http(api.url(), "GET /apis/x HTTP/1.1\r\n\r\n");
        assert!(missing.starts_with("HTTP/1.1 404") && missing.contains("NotFound"), "{missing}");
        let body = r#"{"metadata":{"generateName":"pod-a."},"reason":"Drained"}"#;
        let posted = http(
            api.url(),
            &format!("POST /api/v1/namespaces/ns/events HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}", body.len()),
        );
        assert!(posted.starts_with("HTTP/1.1 201"), "{posted}");
        let events = backend.0.lock().unwrap().clone();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0]["reason"], "Drained");
        assert_eq!(api.requests().iter().map(|r| r.status).collect::<Vec<_>>(), vec![200, 404, 201]);
    }

    #[test]
    fn label_selectors_match_by_equality() {
        let labels = BTreeMap::from([("a".to_owned(), "1".to_owned()), ("b".to_owned(), "2".to_owned())]);
        assert!(selector_matches("a=1,b==2", &labels));
        assert!(selector_matches("a=1,c!=3", &labels));
        assert!(!selector_matches("a=1,b=3", &labels));
        assert!(selector_matches("b", &labels));
        assert!(selector_matches("", &labels));
    }
}
