//! A stand-in for the one Kubernetes API call `pre-terminate` (1.1) and `post-provision` (1.0) make, served over
//! plain http as `KUBE_API_URL` expects: `GET /apis/apps.kubeblocks.io/v1/namespaces/{ns}/clusters/{name}`.
//!
//! It answers the way the API server does for a KubeBlocks Cluster: 200 with the object (`metadata.deletionTimestamp`
//! when deleting, `spec.shardings[].shards`), 404 or 403 with a `Status` body, or never (a hung API). It does not
//! model anything else: every other path is 404, there is no auth, no watch, no resourceVersion.
//!
//! Declared with `#[path = "support/cluster_api.rs"] mod cluster_api;` next to `mod support;`.
#![allow(dead_code)]

use std::io::BufReader;
use std::net::TcpStream;
use std::sync::{Arc, Mutex};

/// What the API says about the Cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterAnswer {
    /// The Cluster exists, not being deleted, with these shard counts by sharding name.
    Stays(Vec<(String, u32)>),
    /// The Cluster exists with a deletionTimestamp.
    Deleting,
    /// 404: the Cluster is gone.
    Gone,
    /// 403: the service account may not read it.
    Forbidden,
    /// The connection is accepted and never answered.
    Hang,
}

/// The fake API; dropping it leaves the listener thread behind (tests are short-lived processes).
pub struct ClusterApi {
    url: String,
    answer: Arc<Mutex<ClusterAnswer>>,
    requests: Arc<Mutex<Vec<String>>>,
}

impl ClusterApi {
    /// Serves `answer` for Cluster `name` in `namespace`.
    pub fn start(namespace: &str, name: &str, answer: ClusterAnswer) -> Self {
        let listener = testbed::bind_loopback().expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let answer = Arc::new(Mutex::new(answer));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let path = format!("/apis/apps.kubeblocks.io/v1/namespaces/{namespace}/clusters/{name}");
        let (a, r, ns, n) = (Arc::clone(&answer), Arc::clone(&requests), namespace.to_owned(), name.to_owned());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (a, r, path, ns, n) = (Arc::clone(&a), Arc::clone(&r), path.clone(), ns.clone(), n.clone());
                std::thread::spawn(move || serve(stream, &a, &r, &path, &ns, &n));
            }
        });
        Self { url, answer, requests }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// Changes the answer from now on.
    pub fn set(&self, answer: ClusterAnswer) {
        *self.answer.lock().unwrap() = answer;
    }

    /// The request lines served (or left hanging) so far.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

fn serve(
    stream: TcpStream,
    answer: &Mutex<ClusterAnswer>,
    requests: &Mutex<Vec<String>>,
    path: &str,
    namespace: &str,
    name: &str,
) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut writer = stream;
    while let Some(request) = testbed::http1::read_request(&mut reader) {
        requests.lock().unwrap().push(request.line.clone());
        let Some((status, json)) = answer_to(&request, answer, path, namespace, name) else { return };
        if testbed::http1::write_json(&mut writer, status, &json.to_string()).is_err() {
            return;
        }
    }
}

/// The answer to `request`; `None` for one that never comes (the answer hangs).
fn answer_to(
    request: &testbed::http1::HttpRequest,
    answer: &Mutex<ClusterAnswer>,
    path: &str,
    namespace: &str,
    name: &str,
) -> Option<(u16, serde_json::Value)> {
    let target = request.path();
    let current = answer.lock().unwrap().clone();
    let (status, json) = if target != path {
        (404, status_body(404, "NotFound", &format!("the server could not find the requested resource {target}")))
    } else {
        match current {
            ClusterAnswer::Hang => {
                std::thread::sleep(std::time::Duration::from_secs(600));
                return None;
            }
            ClusterAnswer::Gone => {
                (404, status_body(404, "NotFound", &format!("clusters.apps.kubeblocks.io \"{name}\" not found")))
            }
            ClusterAnswer::Forbidden => (
                403,
                status_body(
                    403,
                    "Forbidden",
                    &format!(
                        "clusters.apps.kubeblocks.io \"{name}\" is forbidden: User \"system:serviceaccount:{namespace}:\
                         kb-{name}\" cannot get resource \"clusters\" in API group \"apps.kubeblocks.io\""
                    ),
                ),
            ),
            ClusterAnswer::Deleting => (200, cluster_body(namespace, name, true, &[])),
            ClusterAnswer::Stays(shards) => (200, cluster_body(namespace, name, false, &shards)),
        }
    };
    Some((status, json))
}

fn status_body(code: u16, reason: &str, message: &str) -> serde_json::Value {
    serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code
    })
}

fn cluster_body(namespace: &str, name: &str, deleting: bool, shards: &[(String, u32)]) -> serde_json::Value {
    let mut metadata = serde_json::json!({
        "name": name, "namespace": namespace, "uid": "5d0c6a0e-0000-4000-8000-000000000001",
        "resourceVersion": "4711", "finalizers": ["cluster.kubeblocks.io/finalizer"]
    });
    if deleting {
        metadata["deletionTimestamp"] = serde_json::json!("2026-03-01T10:00:00Z");
        metadata["deletionGracePeriodSeconds"] = serde_json::json!(0);
    }
    let shardings: Vec<serde_json::Value> =
        shards.iter().map(|(n, count)| serde_json::json!({"name": n, "shards": count, "template": {}})).collect();
    serde_json::json!({
        "apiVersion": "apps.kubeblocks.io/v1",
        "kind": "Cluster",
        "metadata": metadata,
        "spec": {"clusterDef": "pika", "topology": "pika-codis", "terminationPolicy": "Delete", "shardings": shardings},
        "status": {"phase": if deleting { "Deleting" } else { "Running" }}
    })
}
