//! Optional client for the Kubernetes API: what KubeBlocks knows about the pods of a component.
//!
//! The actions get everything they must have from the contract's variables, Codis, pika and etcd; the API server
//! only adds facts that make decisions better (which pods a rolling update already replaced, which role labels
//! KubeBlocks sees) and a place to leave events for operators. So this client is optional twice over:
//! [`Kube::in_cluster`] returns [`None`] outside a cluster or without a usable service account, and callers treat
//! every [`Error`] here as "no extra facts", never as a reason to fail. Every call is bounded by the client's
//! timeout, since the action's whole run must fit KubeBlocks' 60 s limit.
//!
//! Reads are pure data ([`PodFacts`], [`Revisions`]) and the decision over them ([`updated_pods`]) is a plain
//! function, testable without any API.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::time::Duration;

use ::kube::api::{Api, ApiResource, DynamicObject, ListParams, PostParams};
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde_json::Value;

/// Label holding the revision of the template a pod was created from (set by the InstanceSet controller).
pub const REVISION_LABEL: &str = "controller-revision-hash";
/// Label holding the role the last role probe reported.
pub const ROLE_LABEL: &str = "kubeblocks.io/role";
/// Label holding the Cluster name.
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";
/// Label holding the component's short name (`<sharding>-<id>` for a shard).
pub const COMPONENT_LABEL: &str = "apps.kubeblocks.io/component-name";
/// Timeout of [`Kube::from_client`] until [`Kube::with_timeout`] sets another.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// The component name events are reported under.
pub const EVENT_SOURCE: &str = "pika-action";
/// Longest event message kept (bytes): the API server rejects longer notes from new-style reporters.
pub const MAX_EVENT_MESSAGE: usize = 1024;
/// The key under which KubeBlocks stores a zstd-compressed revision map instead of a plain one.
const COMPRESSED_REVISIONS_KEY: &str = "zstd";

/// Failures talking to the Kubernetes API.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server did not answer in time.
    #[error("kubernetes api: no answer within {after:?} to {step} {target}")]
    Timeout {
        /// What was being done.
        step: &'static str,
        /// What it was done to (namespace, name, selector).
        target: String,
        /// The timeout that ran out.
        after: Duration,
    },
    /// Listing pods failed.
    #[error("kubernetes api: cannot list pods in {namespace} matching {selector}")]
    ListPods {
        /// The namespace.
        namespace: String,
        /// The label selector.
        selector: String,
        /// The API's answer.
        #[source]
        source: Box<::kube::Error>,
    },
    /// Reading an InstanceSet failed (other than "not found").
    #[error("kubernetes api: cannot read instanceset {namespace}/{name}")]
    GetInstanceSet {
        /// The namespace.
        namespace: String,
        /// The InstanceSet.
        name: String,
        /// The API's answer.
        #[source]
        source: Box<::kube::Error>,
    },
    /// Reading the Cluster object failed (other than "not found").
    #[error("kubernetes api: cannot read cluster {namespace}/{name}")]
    GetCluster {
        /// The namespace.
        namespace: String,
        /// The Cluster.
        name: String,
        /// The API's answer.
        #[source]
        source: Box<::kube::Error>,
    },
    /// Reading a pod failed (other than "not found").
    #[error("kubernetes api: cannot read pod {namespace}/{name}")]
    GetPod {
        /// The namespace.
        namespace: String,
        /// The pod.
        name: String,
        /// The API's answer.
        #[source]
        source: Box<::kube::Error>,
    },
    /// Creating an event failed.
    #[error("kubernetes api: cannot record event {reason} on {kind} {namespace}/{name}")]
    RecordEvent {
        /// The namespace.
        namespace: String,
        /// Kind of the object the event is about.
        kind: String,
        /// Name of the object the event is about.
        name: String,
        /// The event's reason.
        reason: String,
        /// The API's answer.
        #[source]
        source: Box<::kube::Error>,
    },
    /// A component's full name does not belong to the cluster it was given with.
    #[error("component {component} is not part of cluster {cluster}: its name must start with \"{cluster}-\"")]
    ComponentName {
        /// The cluster.
        cluster: String,
        /// The component's full name.
        component: String,
    },
}

/// What the actions need to know about one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFacts {
    /// Pod name, `<cluster>-<component>-<ordinal>`.
    pub name: String,
    /// Revision of the template the pod was created from ([`REVISION_LABEL`]).
    pub revision: Option<String>,
    /// Role KubeBlocks last recorded ([`ROLE_LABEL`]).
    pub role: Option<String>,
    /// Whether the pod's `Ready` condition is true.
    pub ready: bool,
}

impl PodFacts {
    fn from_pod(pod: &Pod) -> Option<Self> {
        let name = pod.metadata.name.clone()?;
        let label = |key: &str| pod.metadata.labels.as_ref().and_then(|labels| labels.get(key)).cloned();
        let ready = pod
            .status
            .as_ref()
            .and_then(|status| status.conditions.as_ref())
            .is_some_and(|conditions| conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        Some(Self { name, revision: label(REVISION_LABEL), role: label(ROLE_LABEL), ready })
    }
}

/// What the API says of one container of one pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerLife {
    /// No such pod (any more).
    PodGone,
    /// The pod is being deleted.
    PodTerminating,
    /// The pod exists and the container is not running (waiting to start, terminated, or not listed).
    NotRunning,
    /// The container is running.
    Running,
}

impl ContainerLife {
    fn of(pod: &Pod, container: &str) -> Self {
        if pod.metadata.deletion_timestamp.is_some() {
            return Self::PodTerminating;
        }
        let running = pod
            .status
            .as_ref()
            .and_then(|status| status.container_statuses.as_ref())
            .and_then(|statuses| statuses.iter().find(|c| c.name == container))
            .and_then(|c| c.state.as_ref())
            .is_some_and(|state| state.running.is_some());
        if running {
            Self::Running
        } else {
            Self::NotRunning
        }
    }
}

/// The revisions an InstanceSet's status records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Revisions {
    /// `status.updateRevision`: the revision of the InstanceSet's default template that pods are updated to.
    pub update_revision: Option<String>,
    /// `status.currentRevision`: the revision pods had before the update.
    pub current_revision: Option<String>,
    /// `status.updateRevisions`: pod name → the revision that pod must have. Empty when KubeBlocks stored the map
    /// compressed (it does past `MAX_PLAIN_REVISION_COUNT` pods); then [`Revisions::update_revision`] stands in.
    pub update_revisions: BTreeMap<String, String>,
}

impl Revisions {
    fn from_status(status: &Value) -> Self {
        let text = |field: &str| status.get(field).and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_owned);
        let mut update_revisions: BTreeMap<String, String> = status
            .get("updateRevisions")
            .and_then(Value::as_object)
            .map(|map| map.iter().filter_map(|(pod, rev)| Some((pod.clone(), rev.as_str()?.to_owned()))).collect())
            .unwrap_or_default();
        if update_revisions.contains_key(COMPRESSED_REVISIONS_KEY) {
            tracing::debug!("instanceset keeps its per-pod revisions compressed; comparing with updateRevision");
            update_revisions.clear();
        }
        Self { update_revision: text("updateRevision"), current_revision: text("currentRevision"), update_revisions }
    }

    /// The revision `pod` must have once updated: its own entry in `updateRevisions`, else `updateRevision`.
    #[must_use]
    pub fn target_for(&self, pod: &str) -> Option<&str> {
        self.update_revisions.get(pod).or(self.update_revision.as_ref()).map(String::as_str)
    }
}

/// The pods that already run the revision the InstanceSet updates to.
///
/// KubeBlocks labels each pod with the revision of the template it was built from, and records per pod (in
/// `status.updateRevisions`) the revision it must have, since instance templates give pods different revisions; a pod
/// whose label equals its entry is updated. Without an entry (compressed map, pod unknown to the status) the
/// InstanceSet-wide `updateRevision` is used. A pod without a revision label, or a status without revisions, yields
/// nothing: unknown counts as not updated.
#[must_use]
pub fn updated_pods(revisions: &Revisions, pods: &[PodFacts]) -> BTreeSet<String> {
    pods.iter()
        .filter(|pod| pod.revision.is_some() && pod.revision.as_deref() == revisions.target_for(&pod.name))
        .map(|pod| pod.name.clone())
        .collect()
}

/// The short name of a component (`<comp>`, what [`COMPONENT_LABEL`] holds) from its full name `<cluster>-<comp>`.
pub fn component_short_name<'a>(cluster: &str, component_full_name: &'a str) -> Result<&'a str, Error> {
    component_full_name
        .strip_prefix(cluster)
        .and_then(|rest| rest.strip_prefix('-'))
        .filter(|short| !short.is_empty())
        .ok_or_else(|| Error::ComponentName { cluster: cluster.to_owned(), component: component_full_name.to_owned() })
}

/// What the Cluster object says about the cluster's fate and shape.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterFacts {
    /// `metadata.deletionTimestamp` is set: the whole cluster is being deleted.
    pub deleting: bool,
    /// `spec.shardings[].shards` by sharding name: how many shards each sharding is meant to have.
    pub shards: BTreeMap<String, u32>,
}

impl ClusterFacts {
    fn from_object(cluster: &DynamicObject) -> Self {
        let shards = cluster
            .data
            .pointer("/spec/shardings")
            .and_then(Value::as_array)
            .map(|list| {
                list.iter()
                    .filter_map(|s| {
                        let name = s.get("name")?.as_str()?.to_owned();
                        let count = u32::try_from(s.get("shards")?.as_u64()?).ok()?;
                        Some((name, count))
                    })
                    .collect()
            })
            .unwrap_or_default();
        Self { deleting: cluster.metadata.deletion_timestamp.is_some(), shards }
    }
}

/// The object an event is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectRef {
    /// Its kind, e.g. `Pod`.
    pub kind: String,
    /// Its name.
    pub name: String,
    /// Its API version, e.g. `v1`.
    pub api_version: String,
    /// Its UID, when known (ties the event to this incarnation of the object).
    pub uid: Option<String>,
}

impl ObjectRef {
    /// A pod.
    #[must_use]
    pub fn pod(name: &str, uid: Option<String>) -> Self {
        Self { kind: "Pod".into(), name: name.into(), api_version: "v1".into(), uid }
    }

    /// A KubeBlocks Cluster.
    #[must_use]
    pub fn cluster(name: &str) -> Self {
        Self { kind: "Cluster".into(), name: name.into(), api_version: "apps.kubeblocks.io/v1".into(), uid: None }
    }
}

/// The KubeBlocks InstanceSet, read untyped: only a few status fields are needed.
fn instance_set_resource() -> ApiResource {
    ApiResource {
        group: "workloads.kubeblocks.io".into(),
        version: "v1".into(),
        api_version: "workloads.kubeblocks.io/v1".into(),
        kind: "InstanceSet".into(),
        plural: "instancesets".into(),
    }
}

/// The KubeBlocks Cluster, read untyped: its deletion mark and shard counts are all that is needed.
fn cluster_resource() -> ApiResource {
    ApiResource {
        group: "apps.kubeblocks.io".into(),
        version: "v1".into(),
        api_version: "apps.kubeblocks.io/v1".into(),
        kind: "Cluster".into(),
        plural: "clusters".into(),
    }
}

/// A Kubernetes API client with a timeout on every call.
#[derive(Clone)]
pub struct Kube {
    client: ::kube::Client,
    namespace: String,
    timeout: Duration,
}

impl fmt::Debug for Kube {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kube")
            .field("namespace", &self.namespace)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Kube {
    /// The client of the pod's service account, or [`None`] when not running in a cluster (no
    /// `KUBERNETES_SERVICE_HOST`, no service account files) or when the client cannot be built; why is logged at
    /// debug level. Async because the client's worker task needs the runtime.
    ///
    /// `timeout` bounds connecting, every read and write, and every call as a whole.
    #[allow(clippy::unused_async)] // see above: async on purpose
    pub async fn in_cluster(timeout: Duration) -> Option<Kube> {
        let mut config = match ::kube::Config::incluster() {
            Ok(config) => config,
            Err(e) => {
                tracing::debug!("no kubernetes api: not in a cluster with a service account ({e})");
                return None;
            }
        };
        config.connect_timeout = Some(timeout);
        config.read_timeout = Some(timeout);
        config.write_timeout = Some(timeout);
        let namespace = config.default_namespace.clone();
        match ::kube::Client::try_from(config) {
            Ok(client) => Some(Kube { client, namespace, timeout }),
            Err(e) => {
                tracing::debug!("no kubernetes api: cannot build the client ({e})");
                None
            }
        }
    }

    /// The client of `url` when given (a plain-http API proxy such as `kubectl proxy`, used unauthenticated), else
    /// the in-cluster one; [`None`] when neither can be built (why is logged).
    pub async fn reachable(url: Option<&str>, namespace: &str, timeout: Duration) -> Option<Kube> {
        let Some(url) = url else { return Self::in_cluster(timeout).await };
        let uri = match url.parse() {
            Ok(uri) => uri,
            Err(e) => {
                tracing::warn!(url, error = %e, "KUBE_API_URL is not a url");
                return None;
            }
        };
        let mut config = ::kube::Config::new(uri);
        config.default_namespace = namespace.to_owned();
        config.connect_timeout = Some(timeout);
        config.read_timeout = Some(timeout);
        config.write_timeout = Some(timeout);
        match ::kube::Client::try_from(config) {
            Ok(client) => Some(Kube::from_client(client, namespace).with_timeout(timeout)),
            Err(e) => {
                tracing::warn!(error = %e, "cannot build a client for KUBE_API_URL");
                None
            }
        }
    }

    /// Wraps a client built elsewhere (tests hand in a mock service); the timeout is [`DEFAULT_TIMEOUT`].
    #[must_use]
    pub fn from_client(client: ::kube::Client, namespace: &str) -> Kube {
        Kube { client, namespace: namespace.to_owned(), timeout: DEFAULT_TIMEOUT }
    }

    /// The same client with another timeout per call.
    #[must_use]
    pub fn with_timeout(self, timeout: Duration) -> Kube {
        Kube { timeout, ..self }
    }

    /// The namespace of the service account (or the one given to [`Kube::from_client`]).
    #[must_use]
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Facts about the pods in `namespace` matching `label_selector`, ordered by name (ordinals numerically).
    pub async fn pods(&self, namespace: &str, label_selector: &str) -> Result<Vec<PodFacts>, Error> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let params = ListParams::default().labels(label_selector);
        let target = || format!("{namespace} matching {label_selector}");
        let list = self.bounded("list pods in", target, api.list(&params)).await?.map_err(|source| {
            let source = Box::new(source);
            Error::ListPods { namespace: namespace.to_owned(), selector: label_selector.to_owned(), source }
        })?;
        let mut pods: Vec<PodFacts> = list.items.iter().filter_map(PodFacts::from_pod).collect();
        pods.sort_by(|a, b| pod_order(&a.name).cmp(&pod_order(&b.name)));
        Ok(pods)
    }

    /// The pods of one component, by its full name `<cluster>-<comp>` (that is also its InstanceSet's name).
    pub async fn component_pods(
        &self,
        namespace: &str,
        cluster: &str,
        component_full_name: &str,
    ) -> Result<Vec<PodFacts>, Error> {
        let short = component_short_name(cluster, component_full_name)?;
        self.pods(namespace, &format!("{INSTANCE_LABEL}={cluster},{COMPONENT_LABEL}={short}")).await
    }

    /// Whether `container` of pod `name` runs (`GET /api/v1/namespaces/{namespace}/pods/{name}`).
    pub async fn container_life(&self, namespace: &str, name: &str, container: &str) -> Result<ContainerLife, Error> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let found = self.bounded("read pod", || format!("{namespace}/{name}"), api.get_opt(name)).await?;
        let found = found.map_err(|source| Error::GetPod {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            source: Box::new(source),
        })?;
        Ok(found.map_or(ContainerLife::PodGone, |pod| ContainerLife::of(&pod, container)))
    }

    /// The revisions recorded by the InstanceSet `name` (a component's full name); [`None`] when there is no such
    /// InstanceSet, or the API does not serve `workloads.kubeblocks.io/v1` (KubeBlocks before 1.0).
    pub async fn instance_set_revisions(&self, namespace: &str, name: &str) -> Result<Option<Revisions>, Error> {
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), namespace, &instance_set_resource());
        let found = self.bounded("read instanceset", || format!("{namespace}/{name}"), api.get_opt(name)).await?;
        let found = found.map_err(|source| Error::GetInstanceSet {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            source: Box::new(source),
        })?;
        Ok(found.map(|its| its.data.get("status").map(Revisions::from_status).unwrap_or_default()))
    }

    /// The Cluster `name` (`GET /apis/apps.kubeblocks.io/v1/namespaces/{namespace}/clusters/{name}`); [`None`]
    /// when it does not exist (any more).
    pub async fn cluster(&self, namespace: &str, name: &str) -> Result<Option<ClusterFacts>, Error> {
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), namespace, &cluster_resource());
        let found = self.bounded("read cluster", || format!("{namespace}/{name}"), api.get_opt(name)).await?;
        let found = found.map_err(|source| Error::GetCluster {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            source: Box::new(source),
        })?;
        Ok(found.as_ref().map(ClusterFacts::from_object))
    }

    /// Records a core/v1 Event about `involved` in `namespace`, `Warning` or `Normal`.
    ///
    /// Best effort: callers log and ignore the error. The message passes through [`crate::redact::scrub`] and is
    /// cut to [`MAX_EVENT_MESSAGE`] bytes, so a secret echoed in an error never reaches the API.
    pub async fn record_event(
        &self,
        namespace: &str,
        involved: &ObjectRef,
        reason: &str,
        message: &str,
        warning: bool,
    ) -> Result<(), Error> {
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let event = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}.", involved.name)),
                namespace: Some(namespace.to_owned()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                api_version: Some(involved.api_version.clone()),
                kind: Some(involved.kind.clone()),
                name: Some(involved.name.clone()),
                namespace: Some(namespace.to_owned()),
                uid: involved.uid.clone(),
                ..ObjectReference::default()
            },
            reason: Some(crate::redact::scrub(reason).into_owned()),
            message: Some(truncate(&crate::redact::scrub(message), MAX_EVENT_MESSAGE).to_owned()),
            type_: Some(if warning { "Warning" } else { "Normal" }.to_owned()),
            source: Some(EventSource { component: Some(EVENT_SOURCE.to_owned()), host: None }),
            reporting_component: Some(EVENT_SOURCE.to_owned()),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            count: Some(1),
            ..Event::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        let target = || format!("{} {namespace}/{}", involved.kind, involved.name);
        let created = self.bounded("record an event on", target, api.create(&PostParams::default(), &event)).await?;
        created.map(drop).map_err(|source| Error::RecordEvent {
            namespace: namespace.to_owned(),
            kind: involved.kind.clone(),
            name: involved.name.clone(),
            reason: reason.to_owned(),
            source: Box::new(source),
        })
    }

    /// Runs one API call within the timeout; the outer error is the timeout, the inner one the API's.
    async fn bounded<T>(
        &self,
        step: &'static str,
        target: impl FnOnce() -> String,
        call: impl Future<Output = T>,
    ) -> Result<T, Error> {
        tokio::time::timeout(self.timeout, call).await.map_err(|_| Error::Timeout {
            step,
            target: target(),
            after: self.timeout,
        })
    }
}

/// Sort key that puts `x-2` before `x-10`.
fn pod_order(name: &str) -> (&str, Option<u64>, &str) {
    match name.rsplit_once('-') {
        Some((base, ordinal)) => (base, ordinal.parse().ok(), name),
        None => (name, None, name),
    }
}

/// `text` cut to at most `max` bytes at a character boundary.
fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::kube::client::Body;
    use http::{Method, Request, Response, StatusCode};
    use serde_json::json;

    type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

    /// What the mock API server saw of one request.
    struct Seen {
        method: Method,
        path: String,
        query: String,
        body: Value,
    }

    fn mock_api() -> (Kube, Handle) {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let kube = Kube::from_client(::kube::Client::new(service, "test-default-ns"), "test-default-ns");
        (kube.with_timeout(Duration::from_secs(2)), handle)
    }

    /// Answers the next request with `status` and `body`, and returns what was asked.
    async fn serve(handle: &mut Handle, status: StatusCode, body: Value) -> Seen {
        let (request, respond) = handle.next_request().await.expect("the client sent a request");
        let (parts, request_body) = request.into_parts();
        let bytes = request_body.collect_bytes().await.expect("request body");
        let seen = Seen {
            method: parts.method,
            path: parts.uri.path().to_owned(),
            query: percent_decode(parts.uri.query().unwrap_or_default()),
            body: if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).expect("json body") },
        };
        let response = Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(&body).expect("json")))
            .expect("response");
        respond.send_response(response);
        seen
    }

    /// Asserts that the client sends nothing more.
    async fn no_more_requests(handle: &mut Handle) {
        let next = tokio::time::timeout(Duration::from_millis(50), handle.next_request()).await;
        assert!(!matches!(next, Ok(Some(_))), "unexpected extra request");
    }

    fn percent_decode(text: &str) -> String {
        let bytes = text.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'%' && i + 2 < bytes.len() {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).expect("ascii");
                out.push(u8::from_str_radix(hex, 16).expect("hex"));
                i += 3;
            } else {
                out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
                i += 1;
            }
        }
        String::from_utf8(out).expect("utf-8")
    }

    fn pod(name: &str, revision: Option<&str>, role: Option<&str>, ready: bool) -> Value {
        let mut labels = json!({ INSTANCE_LABEL: "tc", COMPONENT_LABEL: "grp-x7q" });
        if let Some(revision) = revision {
            labels[REVISION_LABEL] = json!(revision);
        }
        if let Some(role) = role {
            labels[ROLE_LABEL] = json!(role);
        }
        json!({
            "metadata": { "name": name, "namespace": "test-ns", "labels": labels },
            "status": { "conditions": [
                { "type": "PodScheduled", "status": "True" },
                { "type": "Ready", "status": if ready { "True" } else { "False" } },
            ] },
        })
    }

    fn facts(name: &str, revision: Option<&str>) -> PodFacts {
        PodFacts { name: name.into(), revision: revision.map(str::to_owned), role: None, ready: true }
    }

    #[tokio::test]
    async fn component_pods_are_listed_by_cluster_and_short_name_with_revision_role_and_readiness() {
        let (kube, mut handle) = mock_api();
        let list = json!({
            "apiVersion": "v1", "kind": "PodList", "metadata": { "resourceVersion": "7" },
            "items": [
                pod("tc-grp-x7q-10", Some("rev-new"), Some("slave"), true),
                pod("tc-grp-x7q-2", Some("rev-old"), Some("master"), true),
                pod("tc-grp-x7q-1", None, None, false),
            ],
        });
        let (pods, seen) = tokio::time::timeout(Duration::from_secs(5), async {
            tokio::join!(kube.component_pods("test-ns", "tc", "tc-grp-x7q"), serve(&mut handle, StatusCode::OK, list))
        })
        .await
        .expect("scenario finished");
        assert_eq!(seen.method, Method::GET);
        assert_eq!(seen.path, "/api/v1/namespaces/test-ns/pods");
        assert!(
            seen.query
                .contains("labelSelector=app.kubernetes.io/instance=tc,apps.kubeblocks.io/component-name=grp-x7q"),
            "{}",
            seen.query
        );
        let pods = pods.expect("pods");
        assert_eq!(
            pods,
            vec![
                PodFacts { name: "tc-grp-x7q-1".into(), revision: None, role: None, ready: false },
                PodFacts {
                    name: "tc-grp-x7q-2".into(),
                    revision: Some("rev-old".into()),
                    role: Some("master".into()),
                    ready: true,
                },
                PodFacts {
                    name: "tc-grp-x7q-10".into(),
                    revision: Some("rev-new".into()),
                    role: Some("slave".into()),
                    ready: true,
                },
            ]
        );
        no_more_requests(&mut handle).await;
    }

    #[tokio::test]
    async fn component_pods_of_another_cluster_are_refused_without_a_request() {
        let (kube, mut handle) = mock_api();
        let err = kube.component_pods("test-ns", "tc", "other-grp-x7q").await.expect_err("wrong cluster");
        assert!(matches!(err, Error::ComponentName { .. }), "{err:?}");
        no_more_requests(&mut handle).await;
    }

    #[tokio::test]
    async fn a_failed_pod_list_names_namespace_and_selector() {
        let (kube, mut handle) = mock_api();
        let forbidden = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "pods is forbidden", "reason": "Forbidden", "code": 403,
        });
        let (result, _) =
            tokio::join!(kube.pods("test-ns", "a=b"), serve(&mut handle, StatusCode::FORBIDDEN, forbidden));
        let err = result.expect_err("forbidden");
        assert!(
            matches!(&err, Error::ListPods { namespace, selector, .. } if namespace == "test-ns" && selector == "a=b")
        );
        assert_eq!(err.to_string(), "kubernetes api: cannot list pods in test-ns matching a=b");
    }

    #[tokio::test]
    async fn a_containers_life_is_read_from_its_pod() {
        let pod = |deleting: bool, state: Value| {
            let mut metadata = json!({ "name": "tc-proxy-1", "namespace": "test-ns" });
            if deleting {
                metadata["deletionTimestamp"] = json!("2026-12-06T07:00:00Z");
            }
            json!({
                "apiVersion": "v1", "kind": "Pod", "metadata": metadata,
                "status": { "containerStatuses": [
                    { "name": "other", "ready": true, "restartCount": 0, "image": "x", "imageID": "x",
                      "state": { "running": {} } },
                    { "name": "codis-proxy", "ready": false, "restartCount": 1, "image": "x", "imageID": "x",
                      "state": state },
                ] },
            })
        };
        let not_found = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "pods \"tc-proxy-1\" not found", "reason": "NotFound", "code": 404,
        });
        let cases = [
            (
                StatusCode::OK,
                pod(false, json!({ "running": { "startedAt": "2026-12-06T07:00:00Z" } })),
                ContainerLife::Running,
            ),
            (
                StatusCode::OK,
                pod(false, json!({ "waiting": { "reason": "CrashLoopBackOff" } })),
                ContainerLife::NotRunning,
            ),
            (StatusCode::OK, pod(false, json!({ "terminated": { "exitCode": 137 } })), ContainerLife::NotRunning),
            (StatusCode::OK, pod(true, json!({ "running": {} })), ContainerLife::PodTerminating),
            (StatusCode::NOT_FOUND, not_found, ContainerLife::PodGone),
        ];
        for (status, body, expected) in cases {
            let (kube, mut handle) = mock_api();
            let (life, seen) = tokio::join!(
                kube.container_life("test-ns", "tc-proxy-1", "codis-proxy"),
                serve(&mut handle, status, body)
            );
            assert_eq!(seen.path, "/api/v1/namespaces/test-ns/pods/tc-proxy-1");
            assert_eq!(life.expect("read"), expected);
        }
        let (kube, mut handle) = mock_api();
        let forbidden = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "pods is forbidden", "reason": "Forbidden", "code": 403,
        });
        let (life, _) = tokio::join!(
            kube.container_life("test-ns", "tc-proxy-1", "codis-proxy"),
            serve(&mut handle, StatusCode::FORBIDDEN, forbidden)
        );
        assert_eq!(life.expect_err("forbidden").to_string(), "kubernetes api: cannot read pod test-ns/tc-proxy-1");
    }

    #[tokio::test]
    async fn instance_set_revisions_are_read_from_its_status() {
        let (kube, mut handle) = mock_api();
        let its = json!({
            "apiVersion": "workloads.kubeblocks.io/v1", "kind": "InstanceSet",
            "metadata": { "name": "tc-grp-x7q", "namespace": "test-ns" },
            "spec": { "replicas": 3 },
            "status": {
                "updateRevision": "rev-new", "currentRevision": "rev-old",
                "updateRevisions": { "tc-grp-x7q-0": "rev-new", "tc-grp-x7q-1": "rev-tpl" },
                "currentRevisions": { "tc-grp-x7q-0": "rev-old" },
            },
        });
        let (revisions, seen) =
            tokio::join!(kube.instance_set_revisions("test-ns", "tc-grp-x7q"), serve(&mut handle, StatusCode::OK, its));
        assert_eq!(seen.method, Method::GET);
        assert_eq!(seen.path, "/apis/workloads.kubeblocks.io/v1/namespaces/test-ns/instancesets/tc-grp-x7q");
        let revisions = revisions.expect("read").expect("found");
        assert_eq!(revisions.update_revision.as_deref(), Some("rev-new"));
        assert_eq!(revisions.current_revision.as_deref(), Some("rev-old"));
        assert_eq!(revisions.target_for("tc-grp-x7q-1"), Some("rev-tpl"));
        assert_eq!(revisions.target_for("tc-grp-x7q-9"), Some("rev-new"));
        no_more_requests(&mut handle).await;
    }

    #[tokio::test]
    async fn a_missing_instance_set_is_none() {
        let (kube, mut handle) = mock_api();
        let not_found = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "instancesets.workloads.kubeblocks.io \"tc-grp-x7q\" not found",
            "reason": "NotFound", "details": { "name": "tc-grp-x7q", "kind": "instancesets" }, "code": 404,
        });
        let (revisions, _) = tokio::join!(
            kube.instance_set_revisions("test-ns", "tc-grp-x7q"),
            serve(&mut handle, StatusCode::NOT_FOUND, not_found)
        );
        assert_eq!(revisions.expect("not found is not an error"), None);
    }

    #[tokio::test]
    async fn an_instance_set_without_status_has_no_revisions() {
        let (kube, mut handle) = mock_api();
        let its =
            json!({ "apiVersion": "workloads.kubeblocks.io/v1", "kind": "InstanceSet", "metadata": { "name": "n" } });
        let (revisions, _) =
            tokio::join!(kube.instance_set_revisions("test-ns", "n"), serve(&mut handle, StatusCode::OK, its));
        assert_eq!(revisions.expect("read"), Some(Revisions::default()));
    }

    #[tokio::test]
    async fn a_forbidden_instance_set_read_is_an_error_not_absence() {
        let (kube, mut handle) = mock_api();
        let forbidden = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "forbidden", "reason": "Forbidden", "code": 403,
        });
        let (revisions, _) = tokio::join!(
            kube.instance_set_revisions("test-ns", "tc-grp-x7q"),
            serve(&mut handle, StatusCode::FORBIDDEN, forbidden)
        );
        assert!(matches!(revisions, Err(Error::GetInstanceSet { .. })), "{revisions:?}");
    }

    #[tokio::test]
    async fn record_event_posts_a_scrubbed_event_about_the_object() {
        crate::redact::register("test-secret-9f3");
        let (kube, mut handle) = mock_api();
        let involved = ObjectRef::pod("tc-grp-x7q-1", Some("uid-1".into()));
        let long = "x".repeat(2 * MAX_EVENT_MESSAGE);
        let message = format!("promote failed: auth test-secret-9f3 rejected {long}");
        let (result, seen) = tokio::join!(
            kube.record_event("test-ns", &involved, "SwitchoverFailed", &message, true),
            serve(&mut handle, StatusCode::CREATED, json!({ "metadata": { "name": "tc-grp-x7q-1.abc" } }))
        );
        result.expect("recorded");
        assert_eq!(seen.method, Method::POST);
        assert_eq!(seen.path, "/api/v1/namespaces/test-ns/events");
        let event = seen.body;
        assert_eq!(event["reason"], "SwitchoverFailed");
        assert_eq!(event["type"], "Warning");
        assert_eq!(event["source"]["component"], EVENT_SOURCE);
        assert_eq!(event["metadata"]["generateName"], "tc-grp-x7q-1.");
        assert_eq!(
            event["involvedObject"],
            json!({ "apiVersion": "v1", "kind": "Pod", "name": "tc-grp-x7q-1", "namespace": "test-ns", "uid": "uid-1" })
        );
        let sent = event["message"].as_str().expect("message");
        assert!(sent.starts_with("promote failed: auth [redacted] rejected x"), "{sent}");
        assert!(!sent.contains("test-secret-9f3"));
        assert_eq!(sent.len(), MAX_EVENT_MESSAGE);
        no_more_requests(&mut handle).await;
    }

    #[tokio::test]
    async fn a_normal_event_is_not_a_warning() {
        let (kube, mut handle) = mock_api();
        let cluster = ObjectRef::cluster("tc");
        let (result, seen) = tokio::join!(
            kube.record_event("test-ns", &cluster, "SlotsBalanced", "done", false),
            serve(&mut handle, StatusCode::CREATED, json!({}))
        );
        result.expect("recorded");
        assert_eq!(seen.body["type"], "Normal");
        assert_eq!(seen.body["involvedObject"]["apiVersion"], "apps.kubeblocks.io/v1");
        assert_eq!(seen.body["involvedObject"]["kind"], "Cluster");
    }

    #[tokio::test]
    async fn a_hung_api_server_is_bounded_by_the_timeout() {
        let (kube, mut handle) = mock_api();
        let kube = kube.with_timeout(Duration::from_millis(200));
        // The request arrives and is never answered.
        let hold = tokio::spawn(async move {
            let pending = handle.next_request().await;
            tokio::time::sleep(Duration::from_secs(30)).await;
            drop(pending);
        });
        let started = std::time::Instant::now();
        let err = kube.pods("test-ns", "a=b").await.expect_err("no answer");
        assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
        assert!(matches!(&err, Error::Timeout { step: "list pods in", .. }), "{err:?}");
        assert!(err.to_string().contains("test-ns matching a=b"), "{err}");
        let err = kube.instance_set_revisions("test-ns", "n").await.expect_err("no answer");
        assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
        hold.abort();
    }

    #[tokio::test]
    async fn outside_a_cluster_there_is_no_client() {
        if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
            // Running inside a pod: the negative case cannot be observed without changing the process environment.
            return;
        }
        assert!(Kube::in_cluster(Duration::from_secs(1)).await.is_none());
    }

    #[test]
    fn updated_pods_compare_each_pod_with_its_own_target_revision() {
        let revisions = Revisions {
            update_revision: Some("rev-new".into()),
            current_revision: Some("rev-old".into()),
            update_revisions: [("p-0", "rev-new"), ("p-1", "rev-tpl")]
                .into_iter()
                .map(|(p, r)| (p.to_owned(), r.to_owned()))
                .collect(),
        };
        let pods = [
            facts("p-0", Some("rev-new")),
            facts("p-1", Some("rev-new")), // its template wants rev-tpl
            facts("p-2", Some("rev-new")), // not in the map: the default template's revision applies
            facts("p-3", Some("rev-old")),
            facts("p-4", None),
        ];
        let updated: Vec<_> = updated_pods(&revisions, &pods).into_iter().collect();
        assert_eq!(updated, ["p-0", "p-2"]);
    }

    #[test]
    fn without_known_revisions_no_pod_counts_as_updated() {
        let pods = [facts("p-0", Some("rev-new"))];
        assert!(updated_pods(&Revisions::default(), &pods).is_empty());
    }

    #[test]
    fn a_compressed_revision_map_falls_back_to_the_update_revision() {
        let status = json!({ "updateRevision": "rev-new", "updateRevisions": { "zstd": "KLUv/QBYAA==" } });
        let revisions = Revisions::from_status(&status);
        assert!(revisions.update_revisions.is_empty());
        let pods = [facts("p-0", Some("rev-new")), facts("p-1", Some("rev-old"))];
        let updated: Vec<_> = updated_pods(&revisions, &pods).into_iter().collect();
        assert_eq!(updated, ["p-0"]);
    }

    #[test]
    fn short_names_come_from_full_names_of_the_same_cluster() {
        assert_eq!(component_short_name("tc", "tc-grp-x7q").expect("ok"), "grp-x7q");
        assert!(component_short_name("tc", "tc2-grp-x7q").is_err());
        assert!(component_short_name("tc", "tc-").is_err());
        assert!(component_short_name("tc", "tc").is_err());
    }

    #[test]
    fn long_messages_are_cut_at_a_character_boundary() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("héllo", 3), "hé");
        assert_eq!(truncate("abc", 10), "abc");
    }

    #[test]
    fn pods_sort_by_numeric_ordinal() {
        let mut names = vec!["c-g-10", "c-g-2", "c-g-1"];
        names.sort_by(|a, b| pod_order(a).cmp(&pod_order(b)));
        assert_eq!(names, ["c-g-1", "c-g-2", "c-g-10"]);
    }
}
