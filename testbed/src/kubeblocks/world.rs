//! The emulated API server's objects (Cluster, Components, InstanceSets, Pods), what each controller's workqueue
//! knows about a key, and the JSON the minimal API serves for them.
//!
//! Emulated: the fields KubeBlocks' decisions read (phases, deletion timestamps, the post-provision/pre-terminate/
//! scale-in/sharding-add annotations, the InstanceSet's replicas status and revisions, pod readiness and role
//! labels) and the labels and status fields the binary reads through the API (`app.kubernetes.io/instance`,
//! `apps.kubeblocks.io/component-name`, `kubeblocks.io/role`, `controller-revision-hash`, `updateRevision`,
//! `currentRevision`, `updateRevisions`, `deletionTimestamp`).
//!
//! Does NOT model: resource versions, owner references, finalizers, conditions, Services/Secrets/ConfigMaps/PVCs
//! as objects, timestamps (a deletion timestamp is a fixed instant).

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

use super::chart::{Action, ClusterSpec};
use super::retry::Backoff;

/// The role label.
pub const ROLE_LABEL: &str = "kubeblocks.io/role";
/// Marks a done component postProvision.
pub const POST_PROVISION_DONE: &str = "kubeblocks.io/post-provision-done";
/// Marks a done component preTerminate.
pub const PRE_TERMINATE_DONE: &str = "kubeblocks.io/pre-terminate-done";
/// Set on a shard deleted by a scale-in.
pub const SCALE_IN: &str = "apps.kubeblocks.io/component-scale-in";
/// 1.1: set on a shard created by a scale-out until its shardAdd succeeded.
pub const SHARD_ADD_PENDING: &str = "kubeblocks.io/sharding-add-shard";
/// Skips a component's preTerminate.
pub const SKIP_PRE_TERMINATE: &str = "apps.kubeblocks.io/skip-pre-terminate";

/// A component's phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Not yet Running once.
    Creating,
    /// Everything ready.
    Running,
    /// Was Running, is changing.
    Updating,
    /// Being deleted.
    Deleting,
}

impl Phase {
    /// The API spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Creating => "Creating",
            Phase::Running => "Running",
            Phase::Updating => "Updating",
            Phase::Deleting => "Deleting",
        }
    }
}

/// Status of a sharding lifecycle action (1.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActionPhase {
    /// Scheduled.
    Pending,
    /// Done.
    Succeeded,
    /// Not defined.
    Skipped,
    /// Last call failed: why.
    Failed(String),
}

/// The Cluster.
#[derive(Debug, Clone)]
pub struct ClusterObj {
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// UID.
    pub uid: String,
    /// Spec, as rendered by the cluster chart and patched by operations.
    pub spec: ClusterSpec,
    /// Bumped by every spec change.
    pub generation: u64,
    /// Has a deletion timestamp.
    pub deleting: bool,
    /// `status.phase`.
    pub phase: String,
    /// 1.1: `status.shardings[<name>].postProvision`.
    pub sharding_post_provision: BTreeMap<String, ActionPhase>,
    /// 1.1: `status.shardings[<name>].preTerminate`.
    pub sharding_pre_terminate: BTreeMap<String, ActionPhase>,
}

/// A Component.
#[derive(Debug, Clone)]
pub struct CompObj {
    /// `<cluster>-<short>`.
    pub full: String,
    /// Short name.
    pub short: String,
    /// Its ComponentDefinition.
    pub comp_def: String,
    /// The sharding it belongs to.
    pub sharding: Option<String>,
    /// A stand-in for a component whose workload is a test-bed process (etcd, Codis), not emulated pods.
    pub stand_in: bool,
    /// `spec.replicas`.
    pub replicas: u32,
    /// Has a deletion timestamp.
    pub deleting: bool,
    /// `status.phase`.
    pub phase: Phase,
    /// Whether it has been Running once.
    pub was_running: bool,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
    /// Restart generation (a rolling restart bumps it; the InstanceSet template follows).
    pub restarts: u64,
    /// System accounts: name → password.
    pub accounts: BTreeMap<String, String>,
    /// 1.1: the ShardingDefinition's actions injected as custom actions (`udf-sharding*`), sorted by name.
    pub custom_actions: Vec<(String, Action)>,
    /// Set once its sub-resources are gone and the final deletion round is due.
    pub sub_resources_deleted: bool,
}

/// A replica's entry in the InstanceSet's `replicas-status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaStatus {
    /// Created once.
    pub provisioned: bool,
    /// `None`: no join needed (initial replica or no memberJoin); `Some(false)`: join pending.
    pub member_joined: Option<bool>,
}

/// An InstanceSet (one per pika component).
#[derive(Debug, Clone)]
pub struct ItsObj {
    /// Name = the component's full name.
    pub name: String,
    /// The component it belongs to.
    pub comp: String,
    /// `spec.replicas`.
    pub replicas: u32,
    /// The template revision pods are updated to.
    pub revision: u64,
    /// The revision every pod had before the update in progress.
    pub current_revision: u64,
    /// `spec.templateVars`: what rolling-update switchovers get as parameters.
    pub template_vars: BTreeMap<String, String>,
    /// Per replica.
    pub replicas_status: BTreeMap<String, ReplicaStatus>,
    /// Every var (credentials included) as last resolved: what new pods' containers get.
    pub env_vars: BTreeMap<String, String>,
    /// Being deleted by its component.
    pub deleting: bool,
    /// What the component saw of its status last (a change wakes the component).
    pub status_seen: String,
}

impl ItsObj {
    /// `controller-revision-hash` of a template revision.
    pub fn revision_hash(&self, revision: u64) -> String {
        format!("{}-{:08x}", self.name, revision.wrapping_mul(0x9E37_79B9).wrapping_add(0x5bd1_e995) & 0xffff_ffff)
    }
}

/// A Pod.
#[derive(Debug, Clone)]
pub struct PodObj {
    /// Name.
    pub name: String,
    /// Its component's full name.
    pub comp: String,
    /// Ordinal.
    pub ordinal: u32,
    /// The template revision it was created from.
    pub revision: u64,
    /// Its role label.
    pub role: Option<String>,
    /// Ready condition.
    pub ready: bool,
    /// Since when it is ready (emulated time).
    pub ready_since: Option<Duration>,
    /// Being deleted.
    pub terminating: bool,
    /// UID (new per incarnation).
    pub uid: String,
    /// `status.podIP`.
    pub ip: String,
    /// `spec.nodeName`.
    pub node: String,
    /// `status.hostIP`.
    pub host_ip: String,
    /// The kbagent container's environment, frozen when the pod was created.
    pub agent_env: BTreeMap<String, String>,
    /// The pika container's environment, frozen when the pod was created.
    pub container_env: BTreeMap<String, String>,
    /// Incarnation counter (a recreated pod gets a new one).
    pub incarnation: u64,
}

/// A workqueue key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Key {
    /// The cluster controller.
    Cluster,
    /// The component controller, for one component.
    Component(String),
    /// The InstanceSet controller, for one InstanceSet.
    InstanceSet(String),
}

/// What a key's workqueue entry holds.
#[derive(Debug, Clone, Default)]
pub struct KeyState {
    /// A watched object changed: reconcile at once.
    pub dirty: bool,
    /// A requeue is due at this emulated time.
    pub due: Option<Duration>,
    /// Rate limiter.
    pub backoff: Backoff,
    /// The last error and when.
    pub last_error: Option<(Duration, String)>,
    /// What the last reconcile asked for, for diagnostics.
    pub last_next: String,
    /// Reconciles so far.
    pub reconciles: u64,
    /// The last failure and how many reconciles in a row ended with exactly it.
    pub streak: Option<(String, u32)>,
}

/// How many identical refusals in a row mean a key will never progress (see [`KeyState::never_progresses`]).
pub const HOPELESS_STREAK: u32 = 15;

impl KeyState {
    /// Records how a reconcile ended for the streak of identical failures.
    pub fn note(&mut self, failure: Option<&str>) {
        self.streak = match (failure, self.streak.take()) {
            (None, _) => None,
            (Some(f), Some((last, n))) if last == f => Some((last, n + 1)),
            (Some(f), _) => Some((f.to_owned(), 1)),
        };
    }

    /// The failure this key keeps hitting without any change, when it is one KubeBlocks would retry forever to no
    /// avail: a refusal of bad input (exit 2: nothing changes between runs) or vars that do not resolve, repeated
    /// [`HOPELESS_STREAK`] times in a row.
    pub fn never_progresses(&self) -> Option<&str> {
        let (failure, n) = self.streak.as_ref()?;
        let permanent = failure.contains("exit code: 2,")
            || failure.contains("when resolving vars")
            || failure.contains("to resolve vars");
        (*n >= HOPELESS_STREAK && permanent).then_some(failure.as_str())
    }
}

/// One KubeBlocks Warning event (what `kubectl describe` would show on the object).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// Emulated time.
    pub at: Duration,
    /// `Component/<name>` or `Cluster/<name>`.
    pub object: String,
    /// Message.
    pub message: String,
}

/// One action KubeBlocks ran.
#[derive(Debug, Clone)]
pub struct ActionRecord {
    /// Emulated start time.
    pub at: Duration,
    /// KubeBlocks' name of the action (`postProvision`, `udf-shardingShardAdd`, `switchover`, ...).
    pub action: String,
    /// The component (full name) whose definition declared it.
    pub component: String,
    /// The pod it ran on.
    pub pod: String,
    /// argv as the chart declares it.
    pub argv: Vec<String>,
    /// The environment it got, credentials replaced by `<redacted>`.
    pub env: BTreeMap<String, String>,
    /// Exit code (`None`: killed or not started).
    pub code: Option<i32>,
    /// `Ok` or the error KubeBlocks reports.
    pub result: Result<(), String>,
    /// Stdout.
    pub stdout: String,
    /// Stderr.
    pub stderr: String,
    /// Wall time.
    pub elapsed: Duration,
}

/// Everything the emulated API server holds.
#[derive(Debug, Default)]
pub struct World {
    /// The Cluster, while it exists.
    pub cluster: Option<ClusterObj>,
    /// Components by full name.
    pub components: BTreeMap<String, CompObj>,
    /// InstanceSets by name.
    pub instance_sets: BTreeMap<String, ItsObj>,
    /// Pods by name.
    pub pods: BTreeMap<String, PodObj>,
    /// Events the binary posted.
    pub events: Vec<Value>,
    /// KubeBlocks' warning events.
    pub warnings: Vec<Warning>,
    /// Every action run.
    pub actions: Vec<ActionRecord>,
    /// Workqueues.
    pub keys: BTreeMap<Key, KeyState>,
    /// Counter for IPs and UIDs.
    pub serial: u64,
    /// A fatal condition KubeBlocks would never get past (e.g. definitions it never reconciles).
    pub fatal: Option<String>,
}

impl World {
    /// Marks `key` for an immediate reconcile (a watched object changed).
    pub fn touch(&mut self, key: &Key) {
        if let Some(state) = self.keys.get_mut(key) {
            state.dirty = true;
        }
    }

    /// A fresh number.
    pub fn next_serial(&mut self) -> u64 {
        self.serial += 1;
        self.serial
    }

    /// The pods of a component, by ordinal.
    pub fn pods_of(&self, comp: &str) -> Vec<&PodObj> {
        let mut pods: Vec<&PodObj> = self.pods.values().filter(|p| p.comp == comp).collect();
        pods.sort_by_key(|p| p.ordinal);
        pods
    }

    /// The shard components of a sharding (those being deleted included), by name.
    pub fn shards_of(&self, sharding: &str) -> Vec<&CompObj> {
        self.components.values().filter(|c| c.sharding.as_deref() == Some(sharding)).collect()
    }

    fn labels(&self, pod: &PodObj) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::new();
        let comp = self.components.get(&pod.comp);
        if let Some(cluster) = &self.cluster {
            labels.insert("app.kubernetes.io/instance".to_owned(), cluster.name.clone());
        }
        labels.insert("app.kubernetes.io/managed-by".to_owned(), "kubeblocks".to_owned());
        if let Some(comp) = comp {
            labels.insert("apps.kubeblocks.io/component-name".to_owned(), comp.short.clone());
            if let Some(s) = &comp.sharding {
                labels.insert("apps.kubeblocks.io/sharding-name".to_owned(), s.clone());
            }
        }
        labels.insert("workloads.kubeblocks.io/instance".to_owned(), pod.comp.clone());
        if let Some(its) = self.instance_sets.get(&pod.comp) {
            labels.insert("controller-revision-hash".to_owned(), its.revision_hash(pod.revision));
        }
        if let Some(role) = &pod.role {
            labels.insert(ROLE_LABEL.to_owned(), role.clone());
        }
        labels
    }

    fn pod_json(&self, namespace: &str, pod: &PodObj) -> Value {
        let mut meta = json!({"name": pod.name, "namespace": namespace, "uid": pod.uid, "labels": self.labels(pod)});
        if pod.terminating {
            meta["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": pod.node},
            "status": {
                "phase": "Running", "podIP": pod.ip, "hostIP": pod.host_ip,
                "conditions": [{"type": "Ready", "status": if pod.ready { "True" } else { "False" }}]
            }
        })
    }

    /// A GET of the minimal API.
    pub fn api_get(&self, path: &[&str], query: &BTreeMap<String, String>) -> Option<Value> {
        let cluster = self.cluster.as_ref()?;
        let ns = cluster.namespace.as_str();
        match path {
            ["api", "v1", "namespaces", n, "pods"] if *n == ns => {
                let selector = query.get("labelSelector").map(String::as_str).unwrap_or_default();
                let items: Vec<Value> = self
                    .pods
                    .values()
                    .filter(|p| super::api::selector_matches(selector, &self.labels(p)))
                    .map(|p| self.pod_json(ns, p))
                    .collect();
                Some(
                    json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": items}),
                )
            }
            ["api", "v1", "namespaces", n, "pods", name] if *n == ns => {
                self.pods.get(*name).map(|p| self.pod_json(ns, p))
            }
            ["apis", "workloads.kubeblocks.io", "v1", "namespaces", n, "instancesets", name] if *n == ns => {
                let its = self.instance_sets.get(*name)?;
                let pods = self.pods_of(&its.name);
                let updated = pods.iter().filter(|p| p.revision == its.revision).count();
                let ready = pods.iter().filter(|p| p.ready).count();
                let per_pod: BTreeMap<String, String> =
                    (0..its.replicas).map(|i| (format!("{}-{i}", its.name), its.revision_hash(its.revision))).collect();
                Some(json!({
                    "apiVersion": "workloads.kubeblocks.io/v1", "kind": "InstanceSet",
                    "metadata": {"name": its.name, "namespace": ns},
                    "spec": {"replicas": its.replicas},
                    "status": {
                        "replicas": pods.len(), "readyReplicas": ready, "updatedReplicas": updated,
                        "updateRevision": its.revision_hash(its.revision),
                        "currentRevision": its.revision_hash(its.current_revision),
                        "updateRevisions": per_pod,
                    }
                }))
            }
            ["apis", "apps.kubeblocks.io", "v1", "namespaces", n, "clusters", name] if *n == ns => {
                if *name != cluster.name {
                    return None;
                }
                let mut meta = json!({"name": cluster.name, "namespace": ns, "uid": cluster.uid,
                                      "generation": cluster.generation});
                if cluster.deleting {
                    meta["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
                }
                Some(json!({"apiVersion": "apps.kubeblocks.io/v1", "kind": "Cluster", "metadata": meta,
                            "status": {"phase": cluster.phase}}))
            }
            ["apis", "apps.kubeblocks.io", "v1", "namespaces", n, "components", name] if *n == ns => {
                let comp = self.components.get(*name)?;
                let mut meta = json!({"name": comp.full, "namespace": ns, "annotations": comp.annotations});
                if comp.deleting {
                    meta["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
                }
                Some(json!({"apiVersion": "apps.kubeblocks.io/v1", "kind": "Component", "metadata": meta,
                            "spec": {"compDef": comp.comp_def, "replicas": comp.replicas},
                            "status": {"phase": comp.phase.as_str()}}))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_same_permanent_failure_repeated_is_hopeless() {
        let mut st = KeyState::default();
        let refusal = "action: postProvision, error: exit code: 2, stderr: invalid input: X";
        for _ in 0..HOPELESS_STREAK - 1 {
            st.note(Some(refusal));
        }
        assert_eq!(st.never_progresses(), None);
        st.note(Some(refusal));
        assert_eq!(st.never_progresses(), Some(refusal));
        // Progress (exit 75 with another count) or a success breaks the streak.
        st.note(Some("action: shardRemove, error: exit code: 75, stderr: drain in progress: 3/512"));
        assert_eq!(st.never_progresses(), None);
        for _ in 0..HOPELESS_STREAK * 2 {
            st.note(Some("precondition failed: runtime is not ready"));
        }
        assert_eq!(st.never_progresses(), None, "waiting for readiness is not hopeless");
        for _ in 0..HOPELESS_STREAK {
            st.note(Some("resolving vars from Component object  error: insufficient component objects to resolve vars, expected: 2, actual: 3"));
        }
        assert!(st.never_progresses().is_some());
        st.note(None);
        assert_eq!(st.streak, None);
    }
}
