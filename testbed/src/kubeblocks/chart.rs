//! The charts as KubeBlocks receives them: `helm template` of the addon chart and of the cluster chart (real Helm),
//! parsed into the few typed definitions the emulation acts on. Everything the emulation does is driven from these
//! objects: vars, lifecycle actions, roles, update strategy, topology orders, services, system accounts.
//!
//! Emulates: what the definition controllers make of the objects, as far as a Cluster depends on it. A
//! ClusterDefinition, ComponentDefinition or ComponentVersion whose `kubeblocks.io/crd-api-version` annotation does
//! not name a served API version (`apps.kubeblocks.io/v1` or `workloads.kubeblocks.io/v1`) is never reconciled by
//! its controller (`ObjectAPIVersionSupported`, `pkg/controllerutil/predicate.go`), so it never becomes Available
//! and a Cluster using it never gets past validation; [`Addon::unavailable`] lists them. Same on every line.
//!
//! Does NOT model: CRD schema validation (the chart-tests crate does that), the immutability check, ComponentVersion
//! compatibility rules and image resolution (only its availability counts), config/script templates (except that
//! the scripts ConfigMap is read to find what the pika container runs before pika serves), ParametersDefinition,
//! backup objects.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_json::Value;

/// The annotation a definition needs before KubeBlocks reconciles it.
pub const CRD_API_VERSION_ANNOTATION: &str = "kubeblocks.io/crd-api-version";
/// The API versions KubeBlocks serves (`supportedAPIVersions`); the annotation must name one.
pub const SERVED_API_VERSIONS: &[&str] = &["apps.kubeblocks.io/v1", "workloads.kubeblocks.io/v1"];

/// Failures loading a chart.
#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    /// `helm` could not be run.
    #[error("cannot run helm (is it installed? scripts/setup.sh installs v3.17.2): {0}")]
    Helm(std::io::Error),
    /// `helm template` refused.
    #[error("helm template {chart} failed: {stderr}")]
    Template {
        /// The chart directory.
        chart: String,
        /// Helm's message.
        stderr: String,
    },
    /// The rendered YAML does not parse.
    #[error("rendered {chart} is not YAML: {message}")]
    Yaml {
        /// The chart directory.
        chart: String,
        /// The parser's message.
        message: String,
    },
    /// An object does not have the shape KubeBlocks' CRD gives it.
    #[error("{kind} {name}: {message}")]
    Shape {
        /// Its kind.
        kind: String,
        /// Its name.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// The rendered chart lacks an object the emulation needs.
    #[error("{0}")]
    Missing(String),
}

/// A value given to `helm template`.
#[derive(Debug, Clone)]
pub enum HelmValue {
    /// `--set-string`.
    Text(String),
    /// `--set` of a number.
    Number(u64),
}

/// Runs `helm template <release> <chart>` with `--set`/`--set-string` values and returns every non-empty document.
pub fn helm_template(
    chart: &Path,
    release: &str,
    namespace: &str,
    values: &[(&str, HelmValue)],
) -> Result<Vec<Value>, ChartError> {
    let mut cmd = Command::new("helm");
    cmd.arg("template").arg(release).arg(chart).arg("--namespace").arg(namespace);
    for (key, value) in values {
        match value {
            HelmValue::Text(t) => cmd.arg("--set-string").arg(format!("{key}={t}")),
            HelmValue::Number(n) => cmd.arg("--set").arg(format!("{key}={n}")),
        };
    }
    let out = cmd.output().map_err(ChartError::Helm)?;
    let chart_name = chart.display().to_string();
    if !out.status.success() {
        return Err(ChartError::Template {
            chart: chart_name,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    let text = String::from_utf8_lossy(&out.stdout);
    parse_documents(&text).map_err(|message| ChartError::Yaml { chart: chart_name, message })
}

/// Every non-empty YAML document of `text`.
pub fn parse_documents(text: &str) -> Result<Vec<Value>, String> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| e.to_string())?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// `metadata` of any object.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Metadata {
    /// Name.
    #[serde(default)]
    pub name: String,
    /// Namespace, when namespaced.
    #[serde(default)]
    pub namespace: Option<String>,
    /// Annotations.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// Labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// `name: value` of an action's `exec.env` or a container's `env`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvEntry {
    /// Name.
    pub name: String,
    /// Literal value (a `valueFrom` entry has none).
    #[serde(default)]
    pub value: Option<String>,
    /// `valueFrom` (only `fieldRef: metadata.name` is understood).
    #[serde(default)]
    pub value_from: Option<Value>,
}

/// `exec` of an action.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecAction {
    /// The image (one per component).
    #[serde(default)]
    pub image: Option<String>,
    /// argv[0] and following.
    #[serde(default)]
    pub command: Vec<String>,
    /// Appended after `command[1..]`.
    #[serde(default)]
    pub args: Vec<String>,
    /// Added to the kbagent container's environment (the union over every action, first wins).
    #[serde(default)]
    pub env: Vec<EnvEntry>,
    /// Legacy selector, used when the action-level one is empty.
    #[serde(default)]
    pub target_pod_selector: Option<String>,
    /// Legacy matching key.
    #[serde(default)]
    pub matching_key: Option<String>,
}

/// An `Action` (also the body of a `ShardingAction` and of a `Probe`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Action {
    /// The command; `http`/`grpc` actions are not supported by the emulation.
    #[serde(default)]
    pub exec: Option<ExecAction>,
    /// `Any | All | Role | Ordinal`.
    #[serde(default)]
    pub target_pod_selector: Option<String>,
    /// The role or ordinal for `Role`/`Ordinal`.
    #[serde(default)]
    pub matching_key: Option<String>,
    /// 0 → 30 s, >0 → min(v, 60 s), <0 → none.
    #[serde(default)]
    pub timeout_seconds: Option<i32>,
    /// `Immediately | RuntimeReady | ComponentReady | ClusterReady`; unset means no check.
    #[serde(default)]
    pub pre_condition: Option<String>,
    /// `Any | All` (sharding actions).
    #[serde(default)]
    pub target_shard_selector: Option<String>,
    /// Probe period (probes only; default 60).
    #[serde(default)]
    pub period_seconds: Option<i32>,
    /// Present on any action that declares one; ignored by kbagent on 1.0 and 1.1.
    #[serde(default)]
    pub retry_policy: Option<Value>,
    /// Anything else (`http`, `grpc`, `nonBlocking`, ...), refused when set.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// `spec.lifecycleActions` of a ComponentDefinition.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ComponentLifecycleActions {
    /// Once per component after its workload exists.
    pub post_provision: Option<Action>,
    /// Once on component deletion.
    pub pre_terminate: Option<Action>,
    /// Periodic in every pod.
    pub role_probe: Option<Action>,
    /// Before a pod is recreated, on scale-in, or by OpsRequest.
    pub switchover: Option<Action>,
    /// For replicas added by a scale-out.
    pub member_join: Option<Action>,
    /// For replicas removed by a scale-in.
    pub member_leave: Option<Action>,
    /// Declared but never invoked by KubeBlocks.
    pub readonly: Option<Action>,
    /// Declared but never invoked by KubeBlocks.
    pub readwrite: Option<Action>,
    /// Any other action (dataDump, dataLoad, reconfigure, accountProvision, availableProbe): not emulated.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

impl ComponentLifecycleActions {
    /// Every declared action with its name, in a fixed order (what the exec-env union walks).
    pub fn all(&self) -> Vec<(&'static str, &Action)> {
        [
            ("postProvision", &self.post_provision),
            ("preTerminate", &self.pre_terminate),
            ("roleProbe", &self.role_probe),
            ("switchover", &self.switchover),
            ("memberJoin", &self.member_join),
            ("memberLeave", &self.member_leave),
            ("readonly", &self.readonly),
            ("readwrite", &self.readwrite),
        ]
        .into_iter()
        .filter_map(|(n, a)| a.as_ref().map(|a| (n, a)))
        .collect()
    }
}

/// A role of `spec.roles`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Role {
    /// Name (matched lower-cased).
    pub name: String,
    /// Lower is updated first.
    #[serde(default)]
    pub update_priority: i32,
}

/// A container of `spec.runtime`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Container {
    /// Name.
    pub name: String,
    /// Command.
    #[serde(default)]
    pub command: Vec<String>,
    /// Args.
    #[serde(default)]
    pub args: Vec<String>,
    /// Env.
    #[serde(default)]
    pub env: Vec<EnvEntry>,
    /// Ports.
    #[serde(default)]
    pub ports: Vec<ContainerPort>,
    /// Volume mounts.
    #[serde(default)]
    pub volume_mounts: Vec<VolumeMount>,
}

/// A container port.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerPort {
    /// Name.
    #[serde(default)]
    pub name: Option<String>,
    /// Number.
    pub container_port: u16,
}

/// A volume mount.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeMount {
    /// Volume name.
    pub name: String,
    /// Where it is mounted.
    pub mount_path: String,
}

/// `spec.runtime` (a PodSpec; only containers are read).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Runtime {
    /// Containers.
    #[serde(default)]
    pub containers: Vec<Container>,
}

/// A service of `spec.services`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ComponentService {
    /// The name vars refer to.
    pub name: String,
    /// The suffix of the Service object's name (`<cluster>-<comp>[-<serviceName>]`).
    #[serde(default)]
    pub service_name: Option<String>,
    /// The Service spec (ports are read).
    #[serde(default)]
    pub spec: Value,
}

impl ComponentService {
    /// The port numbers the service exposes.
    pub fn ports(&self) -> Vec<u16> {
        self.spec
            .get("ports")
            .and_then(Value::as_array)
            .map(|ports| ports.iter().filter_map(|p| p.get("port")?.as_u64()?.try_into().ok()).collect())
            .unwrap_or_default()
    }
}

/// A system account.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SystemAccount {
    /// Name.
    pub name: String,
}

/// `spec` of a ComponentDefinition.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ComponentDefinitionSpec {
    /// `serviceKind` (which stand-in serves a component: etcd, codis-dashboard, codis-proxy).
    #[serde(default)]
    pub service_kind: Option<String>,
    /// Roles.
    #[serde(default)]
    pub roles: Vec<Role>,
    /// `Serial | BestEffortParallel | Parallel`.
    #[serde(default)]
    pub update_strategy: Option<String>,
    /// A pod counts as available this long after it became ready.
    #[serde(default)]
    pub min_ready_seconds: Option<i64>,
    /// Vars.
    #[serde(default)]
    pub vars: Vec<crate::kubeblocks::vars::VarDef>,
    /// Lifecycle actions.
    #[serde(default)]
    pub lifecycle_actions: Option<ComponentLifecycleActions>,
    /// Pod template.
    #[serde(default)]
    pub runtime: Runtime,
    /// Services.
    #[serde(default)]
    pub services: Vec<ComponentService>,
    /// System accounts.
    #[serde(default)]
    pub system_accounts: Vec<SystemAccount>,
}

/// A ComponentDefinition.
#[derive(Debug, Clone, Deserialize)]
pub struct ComponentDefinition {
    /// Metadata.
    pub metadata: Metadata,
    /// Spec.
    #[serde(default)]
    pub spec: ComponentDefinitionSpec,
}

impl ComponentDefinition {
    /// Its lifecycle actions (an empty set when none are declared).
    pub fn actions(&self) -> ComponentLifecycleActions {
        self.spec.lifecycle_actions.clone().unwrap_or_default()
    }
}

/// `spec.lifecycleActions` of a ShardingDefinition.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShardingLifecycleActions {
    /// Once per sharding after its shards exist.
    pub post_provision: Option<Action>,
    /// Once on sharding deletion.
    pub pre_terminate: Option<Action>,
    /// For each shard added by a scale-out.
    pub shard_add: Option<Action>,
    /// For each shard removed by a scale-in.
    pub shard_remove: Option<Action>,
}

/// `spec` of a ShardingDefinition.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShardingDefinitionSpec {
    /// `template.compDef`: the shards' ComponentDefinition (name, prefix or regex).
    #[serde(default)]
    pub template: Value,
    /// Actions (run from 1.1 on only).
    #[serde(default)]
    pub lifecycle_actions: Option<ShardingLifecycleActions>,
}

/// A ShardingDefinition.
#[derive(Debug, Clone, Deserialize)]
pub struct ShardingDefinition {
    /// Metadata.
    pub metadata: Metadata,
    /// Spec.
    #[serde(default)]
    pub spec: ShardingDefinitionSpec,
}

impl ShardingDefinition {
    /// The shards' ComponentDefinition pattern.
    pub fn comp_def_pattern(&self) -> Option<&str> {
        self.spec.template.get("compDef").and_then(Value::as_str)
    }

    /// Its actions (an empty set when none are declared).
    pub fn actions(&self) -> ShardingLifecycleActions {
        self.spec.lifecycle_actions.clone().unwrap_or_default()
    }
}

/// A component or sharding entry of a topology.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TopologyEntry {
    /// Name.
    pub name: String,
    /// Definition pattern (components).
    #[serde(default)]
    pub comp_def: Option<String>,
    /// Definition pattern (shardings).
    #[serde(default)]
    pub sharding_def: Option<String>,
}

/// `orders` of a topology: stages, each a comma-separated list of entity names.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Orders {
    /// Creation stages.
    #[serde(default)]
    pub provision: Vec<String>,
    /// Deletion stages.
    #[serde(default)]
    pub terminate: Vec<String>,
    /// Update stages.
    #[serde(default)]
    pub update: Vec<String>,
}

/// A topology.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Topology {
    /// Name.
    pub name: String,
    /// Whether it is the default.
    #[serde(default)]
    pub default: bool,
    /// Components.
    #[serde(default)]
    pub components: Vec<TopologyEntry>,
    /// Shardings.
    #[serde(default)]
    pub shardings: Vec<TopologyEntry>,
    /// Orders.
    #[serde(default)]
    pub orders: Option<Orders>,
}

/// A ClusterDefinition.
#[derive(Debug, Clone, Deserialize)]
pub struct ClusterDefinition {
    /// Metadata.
    pub metadata: Metadata,
    /// Spec.
    pub spec: ClusterDefinitionSpec,
}

/// `spec` of a ClusterDefinition.
#[derive(Debug, Clone, Deserialize)]
pub struct ClusterDefinitionSpec {
    /// Topologies.
    #[serde(default)]
    pub topologies: Vec<Topology>,
}

/// A component of `spec.componentSpecs`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterComponentSpec {
    /// Name.
    #[serde(default)]
    pub name: String,
    /// Replicas.
    #[serde(default)]
    pub replicas: u32,
    /// Explicit definition (else from the topology).
    #[serde(default)]
    pub component_def: Option<String>,
}

/// A sharding of `spec.shardings`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSharding {
    /// Name.
    pub name: String,
    /// Shard count.
    pub shards: u32,
    /// The template of every shard.
    pub template: ClusterComponentSpec,
    /// Explicit ShardingDefinition (else from the topology).
    #[serde(default)]
    pub sharding_def: Option<String>,
}

/// `spec` of a Cluster.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSpec {
    /// ClusterDefinition name.
    #[serde(default)]
    pub cluster_def: Option<String>,
    /// Topology name.
    #[serde(default)]
    pub topology: Option<String>,
    /// `Delete | WipeOut | DoNotTerminate`.
    #[serde(default)]
    pub termination_policy: Option<String>,
    /// Components.
    #[serde(default)]
    pub component_specs: Vec<ClusterComponentSpec>,
    /// Shardings.
    #[serde(default)]
    pub shardings: Vec<ClusterSharding>,
}

/// A Cluster.
#[derive(Debug, Clone, Deserialize)]
pub struct Cluster {
    /// Metadata.
    pub metadata: Metadata,
    /// Spec.
    pub spec: ClusterSpec,
}

/// The rendered addon chart: the definitions by name.
#[derive(Debug, Clone)]
pub struct Addon {
    /// Every rendered object.
    pub objects: Vec<Value>,
    /// ComponentDefinitions.
    pub comp_defs: BTreeMap<String, ComponentDefinition>,
    /// ShardingDefinitions.
    pub sharding_defs: BTreeMap<String, ShardingDefinition>,
    /// ClusterDefinitions.
    pub cluster_defs: BTreeMap<String, ClusterDefinition>,
    /// ComponentVersions (kept as metadata only).
    pub comp_versions: BTreeMap<String, Metadata>,
    /// ConfigMaps by name: `data`.
    pub config_maps: BTreeMap<String, BTreeMap<String, String>>,
}

fn typed<T: serde::de::DeserializeOwned>(kind: &str, obj: &Value) -> Result<T, ChartError> {
    serde_json::from_value(obj.clone()).map_err(|e| ChartError::Shape {
        kind: kind.to_owned(),
        name: obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("?").to_owned(),
        message: e.to_string(),
    })
}

impl Addon {
    /// Renders `chart` (the addon chart directory) with `kubeblocksLine=<line>` and parses it.
    pub fn render(chart: &Path, kubeblocks_line: &str) -> Result<Addon, ChartError> {
        let objects = helm_template(
            chart,
            "pika",
            "kb-system",
            &[("kubeblocksLine", HelmValue::Text(kubeblocks_line.to_owned()))],
        )?;
        Addon::from_objects(objects)
    }

    /// Parses rendered objects.
    pub fn from_objects(objects: Vec<Value>) -> Result<Addon, ChartError> {
        let mut addon = Addon {
            objects: Vec::new(),
            comp_defs: BTreeMap::new(),
            sharding_defs: BTreeMap::new(),
            cluster_defs: BTreeMap::new(),
            comp_versions: BTreeMap::new(),
            config_maps: BTreeMap::new(),
        };
        for obj in &objects {
            let kind = obj.get("kind").and_then(Value::as_str).unwrap_or_default();
            match kind {
                "ComponentDefinition" => {
                    let d: ComponentDefinition = typed(kind, obj)?;
                    addon.comp_defs.insert(d.metadata.name.clone(), d);
                }
                "ShardingDefinition" => {
                    let d: ShardingDefinition = typed(kind, obj)?;
                    addon.sharding_defs.insert(d.metadata.name.clone(), d);
                }
                "ClusterDefinition" => {
                    let d: ClusterDefinition = typed(kind, obj)?;
                    addon.cluster_defs.insert(d.metadata.name.clone(), d);
                }
                "ComponentVersion" => {
                    let m: Metadata = typed(kind, obj.get("metadata").unwrap_or(&Value::Null))?;
                    addon.comp_versions.insert(m.name.clone(), m);
                }
                "ConfigMap" => {
                    let m: Metadata = typed(kind, obj.get("metadata").unwrap_or(&Value::Null))?;
                    let data = obj
                        .get("data")
                        .and_then(Value::as_object)
                        .map(|d| d.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned()))).collect())
                        .unwrap_or_default();
                    addon.config_maps.insert(m.name, data);
                }
                _ => {}
            }
        }
        addon.objects = objects;
        Ok(addon)
    }

    /// The definitions KubeBlocks would never reconcile (kind, name, what the annotation says).
    pub fn unavailable(&self) -> Vec<(String, String, Option<String>)> {
        let check = |kind: &str, meta: &Metadata| {
            let value = meta.annotations.get(CRD_API_VERSION_ANNOTATION).cloned();
            let served = value.as_deref().is_some_and(|v| SERVED_API_VERSIONS.contains(&v));
            (!served).then(|| (kind.to_owned(), meta.name.clone(), value))
        };
        let mut out = Vec::new();
        out.extend(self.cluster_defs.values().filter_map(|d| check("ClusterDefinition", &d.metadata)));
        out.extend(self.comp_defs.values().filter_map(|d| check("ComponentDefinition", &d.metadata)));
        out.extend(self.comp_versions.values().filter_map(|m| check("ComponentVersion", m)));
        out
    }

    /// The available ComponentDefinition a pattern resolves to (KubeBlocks picks among matches the latest; with one
    /// chart version installed there is one).
    pub fn resolve_comp_def(&self, pattern: &str) -> Option<&ComponentDefinition> {
        let unavailable = self.unavailable();
        self.comp_defs
            .values()
            .filter(|d| crate::kubeblocks::vars::prefix_or_regex_matched(&d.metadata.name, pattern))
            .filter(|d| !unavailable.iter().any(|(k, n, _)| k == "ComponentDefinition" && *n == d.metadata.name))
            .max_by(|a, b| a.metadata.name.cmp(&b.metadata.name))
    }

    /// The ShardingDefinition a pattern resolves to.
    pub fn resolve_sharding_def(&self, pattern: &str) -> Option<&ShardingDefinition> {
        self.sharding_defs
            .values()
            .filter(|d| crate::kubeblocks::vars::prefix_or_regex_matched(&d.metadata.name, pattern))
            .max_by(|a, b| a.metadata.name.cmp(&b.metadata.name))
    }

    /// The commands the pika container's start script runs through pika-action before it execs the server, in
    /// order: the subcommands of every line calling `"$action" <subcommand>` where `action` is what the container's
    /// `PIKA_ACTION` names. Read from the scripts ConfigMap the container mounts.
    pub fn start_script_actions(&self, container: &Container) -> Result<Vec<String>, ChartError> {
        let script_path = container
            .command
            .iter()
            .chain(&container.args)
            .find(|a| a.ends_with(".sh"))
            .ok_or_else(|| ChartError::Missing(format!("container {} runs no script", container.name)))?;
        let file = Path::new(script_path).file_name().and_then(|f| f.to_str()).unwrap_or_default().to_owned();
        let script = self
            .config_maps
            .values()
            .find_map(|data| data.get(&file))
            .ok_or_else(|| ChartError::Missing(format!("no ConfigMap holds {file}")))?;
        let mut actions = Vec::new();
        for line in script.lines() {
            let line = line.trim();
            if line.starts_with('#') {
                continue;
            }
            if let Some(rest) = line.strip_prefix("\"$action\" ") {
                if let Some(sub) = rest.split_whitespace().next() {
                    actions.push(sub.to_owned());
                }
            }
        }
        Ok(actions)
    }
}

/// The chart directories of this repository, found from the testbed crate's own location.
pub fn repo_chart(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(name)
}

/// Renders the cluster chart for a cluster of `shards` shards of `replicas` pods named `name` in `namespace`.
pub fn render_cluster(
    chart: &Path,
    name: &str,
    namespace: &str,
    shards: u32,
    replicas: u32,
) -> Result<Cluster, ChartError> {
    let objects = helm_template(
        chart,
        name,
        namespace,
        &[("shards", HelmValue::Number(shards.into())), ("replicas", HelmValue::Number(replicas.into()))],
    )?;
    let cluster = objects
        .iter()
        .find(|o| o.get("kind").and_then(Value::as_str) == Some("Cluster"))
        .ok_or_else(|| ChartError::Missing(format!("{} renders no Cluster", chart.display())))?;
    typed("Cluster", cluster)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFS: &str = r#"
apiVersion: apps.kubeblocks.io/v1
kind: ClusterDefinition
metadata:
  name: demo
  annotations:
    kubeblocks.io/crd-api-version: apps.kubeblocks.io/v1
spec:
  topologies:
    - name: t
      components: [{name: a, compDef: "^demo-a-"}]
---
apiVersion: apps.kubeblocks.io/v1
kind: ComponentDefinition
metadata:
  name: demo-a-1.0
spec:
  roles: [{name: leader, updatePriority: 2}]
---
apiVersion: apps.kubeblocks.io/v1
kind: ComponentDefinition
metadata:
  name: demo-b-1.0
  annotations:
    kubeblocks.io/crd-api-version: apps.kubeblocks.io/v1beta1
---
apiVersion: apps.kubeblocks.io/v1
kind: ComponentVersion
metadata:
  name: demo-a
  annotations:
    kubeblocks.io/crd-api-version: apps.kubeblocks.io/v1
"#;

    #[test]
    fn definitions_without_a_served_crd_api_version_are_unavailable() {
        let addon = Addon::from_objects(parse_documents(DEFS).unwrap()).unwrap();
        let unavailable = addon.unavailable();
        assert_eq!(
            unavailable,
            vec![
                ("ComponentDefinition".to_owned(), "demo-a-1.0".to_owned(), None),
                (
                    "ComponentDefinition".to_owned(),
                    "demo-b-1.0".to_owned(),
                    Some("apps.kubeblocks.io/v1beta1".to_owned())
                ),
            ]
        );
        // An unavailable definition resolves to nothing, as KubeBlocks' validation finds no Available match.
        assert!(addon.resolve_comp_def("^demo-a-").is_none());
    }

    #[test]
    fn the_start_script_actions_are_read_from_the_mounted_script() {
        let objects = parse_documents(
            "kind: ConfigMap\nmetadata: {name: s}\ndata:\n  start.sh: |\n    # \"$action\" never\n    \"$action\" rejoin || status=$?\n    exec x\n",
        )
        .unwrap();
        let addon = Addon::from_objects(objects).unwrap();
        let container = Container {
            name: "c".into(),
            command: vec!["/bin/sh".into(), "/scripts/start.sh".into()],
            ..Container::default()
        };
        assert_eq!(addon.start_script_actions(&container).unwrap(), vec!["rejoin".to_owned()]);
    }
}
