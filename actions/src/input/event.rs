//! The typed event an action acts on: what happened (which action, cluster, shard, pods, KubeBlocks line).
//!
//! Parsed from the rendered template, then validated across fields (pods belong to this cluster and shard, names
//! agree), each failure naming the variable the built-in templates take that field from.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::clients::server::ServerAddr;
use crate::error::{Error, Result};
use crate::input::address::{Endpoints, HostPort};
use crate::input::line::KbLine;
use crate::input::vars;

/// Fields every Codis-facing event carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Common {
    /// The KubeBlocks line the action runs on.
    pub kubeblocks: KbLine,
    /// The Cluster object.
    pub cluster: ClusterRef,
    /// The codis-dashboard.
    pub codis: CodisRef,
    /// etcd endpoints (empty where the action needs none).
    pub etcd: Endpoints,
    /// How to reach the pikas.
    pub pika: PikaRef,
    /// Seconds this run may work.
    pub budget_seconds: u64,
}

/// The Cluster object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterRef {
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
}

/// The codis-dashboard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodisRef {
    /// The admin API.
    pub dashboard: HostPort,
    /// The product name, when given (it must then match the dashboard's).
    pub product: Option<String>,
}

/// How to reach pika servers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PikaRef {
    /// The pika port every server is registered with.
    pub port: u16,
    /// Whether a password is set (the password itself never enters an event).
    pub auth: bool,
    /// Where some server addresses really are (`<fqdn>:<port>` → `host:port`), for port-forwards and tests.
    #[serde(default)]
    pub overrides: BTreeMap<String, HostPort>,
}

/// A pod, named by its FQDN.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Pod {
    /// `<pod>.<service>.<namespace>.svc...`
    pub fqdn: String,
}

impl TryFrom<String> for Pod {
    type Error = String;
    fn try_from(fqdn: String) -> std::result::Result<Self, String> {
        crate::input::address::check_fqdn(&fqdn)?;
        let pod = Self { fqdn: fqdn.trim_end_matches('.').to_ascii_lowercase() };
        pod.ordinal().ok_or_else(|| format!("pod name {:?} does not end in an ordinal", pod.name()))?;
        Ok(pod)
    }
}

impl From<Pod> for String {
    fn from(pod: Pod) -> Self {
        pod.fqdn
    }
}

impl Pod {
    /// The pod name: the FQDN's first label.
    #[must_use]
    pub fn name(&self) -> &str {
        ServerAddr::of(&self.fqdn).pod()
    }

    /// The headless service: the FQDN's second label.
    #[must_use]
    pub fn service(&self) -> &str {
        ServerAddr::of(&self.fqdn).service().unwrap_or_default()
    }

    /// The namespace: the FQDN's third label.
    #[must_use]
    pub fn namespace(&self) -> &str {
        ServerAddr::of(&self.fqdn).namespace().unwrap_or_default()
    }

    /// The number after the pod name's last `-`.
    #[must_use]
    pub fn ordinal(&self) -> Option<u32> {
        ServerAddr::of(&self.fqdn).ordinal()
    }

    /// The address the pod is registered under in Codis: `<fqdn>:<port>`.
    #[must_use]
    pub fn server(&self, port: u16) -> String {
        format!("{}:{port}", self.fqdn)
    }
}

/// A pod named by KubeBlocks with both its name and FQDN.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRef {
    /// The pod name.
    pub name: String,
    /// The pod.
    pub fqdn: Pod,
}

/// A shard: one pika component, one Codis group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    /// Full component name `<cluster>-<sharding>-<id>`.
    pub name: String,
    /// Its pods (desired spec: includes pods being created by a scale-out).
    pub pods: Vec<Pod>,
}

/// 1.0.x legacy component lists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Legacy {
    /// `KB_CLUSTER_COMPONENT_LIST`.
    pub components: Vec<String>,
    /// `KB_CLUSTER_COMPONENT_DELETING_LIST`.
    pub deleting: Vec<String>,
    /// `KB_CLUSTER_COMPONENT_UNDELETED_LIST`.
    pub undeleted: Vec<String>,
}

/// The event of each action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "kebab-case")]
pub enum Event {
    /// `post-provision`.
    PostProvision(PostProvision),
    /// `shard-add`.
    ShardAdd(ShardAdd),
    /// `shard-remove`.
    ShardRemove(ShardRemove),
    /// `pre-terminate`.
    PreTerminate(PreTerminate),
    /// `member-join`.
    MemberJoin(MemberJoin),
    /// `member-leave`.
    MemberLeave(MemberLeave),
    /// `switchover`.
    Switchover(Switchover),
    /// `role-probe`.
    RoleProbe(RoleProbe),
    /// `topology` (for people, read-only).
    Topology(Topology),
    /// `rejoin`.
    Rejoin(Rejoin),
    /// `pre-stop`, the pika container's preStop hook.
    PreStop(PreStop),
    /// `watch`, the long-running failover watcher.
    Watch(Watch),
}

/// The event of `post-provision`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PostProvision {
    /// Common fields.
    #[serde(flatten)]
    pub common: Common,
    /// The shard the action runs in (on 1.0.x: the shard being provisioned).
    pub shard: Shard,
    /// Every shard of the cluster (empty with `own_shard`).
    pub shards: Vec<Shard>,
    /// 1.0.x component lists.
    pub legacy: Option<Legacy>,
    /// `--own-shard`: register only `shard` and move no slot.
    #[serde(default)]
    pub own_shard: bool,
    /// 1.0.x: a plain-http Kubernetes API proxy to read the Cluster's shard count from instead of the in-cluster
    /// API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kube_api: Option<String>,
}

/// The event of `shard-add`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardAdd {
    /// Common fields.
    #[serde(flatten)]
    pub common: Common,
    /// The shard the action runs in.
    pub shard: Shard,
    /// Every shard of the cluster.
    pub shards: Vec<Shard>,
    /// The added shard's full name.
    pub added: String,
}

/// The event of `shard-remove`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardRemove {
    /// Common fields.
    #[serde(flatten)]
    pub common: Common,
    /// The shard the action runs in.
    pub shard: Shard,
    /// Every shard of the cluster.
    pub shards: Vec<Shard>,
    /// The removed shard's full name.
    pub removed: String,
    /// A plain-http Kubernetes API proxy to read the Cluster's shard count from instead of the in-cluster API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kube_api: Option<String>,
}

/// The event of `pre-terminate`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreTerminate {
    /// Common fields.
    #[serde(flatten)]
    pub common: Common,
    /// The shard being terminated.
    pub shard: Shard,
    /// Every shard of the cluster (on 1.0.x, empty on cluster deletion).
    pub shards: Vec<Shard>,
    /// 1.0.x component lists; `None` on 1.1+.
    pub legacy: Option<Legacy>,
    /// 1.0.x: whether the number of shards decreased (drain) rather than the cluster being deleted; `None` on
    /// 1.1+, where the Cluster object says whether it is being deleted.
    pub scaling_in: Option<bool>,
    /// 1.1+: a plain-http Kubernetes API proxy to read the Cluster from instead of the in-cluster API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kube_api: Option<String>,
}

/// The event of `member-join`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberJoin {
    /// Common fields.
    #[serde(flatten)]
    pub common: Common,
    /// The pod's shard.
    pub shard: Shard,
    /// The joining pod.
    pub member: PodRef,
}

/// The event of `member-leave`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberLeave {
    /// Common fields.
    #[serde(flatten)]
    pub common: Common,
    /// The pod's shard.
    pub shard: Shard,
    /// The leaving pod.
    pub member: PodRef,
}

/// The event of `switchover`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Switchover {
    /// Common fields.
    #[serde(flatten)]
    pub common: Common,
    /// The pod's shard.
    pub shard: Shard,
    /// The pod about to restart or leave.
    pub current: PodRef,
    /// Its role label as KubeBlocks saw it.
    pub role: Option<String>,
    /// The requested new master (OpsRequest only).
    pub candidate: Option<PodRef>,
    /// A plain-http Kubernetes API proxy to read rollout facts from instead of the in-cluster API.
    #[serde(default)]
    pub kube_api: Option<String>,
}

/// The event of `role-probe`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleProbe {
    /// The KubeBlocks line.
    pub kubeblocks: KbLine,
    /// The local pika's host.
    pub host: String,
    /// How to reach it.
    pub pika: PikaRef,
    /// Seconds this run may work.
    pub budget_seconds: u64,
}

/// The event of `topology` (for people, read-only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    /// Common fields.
    #[serde(flatten)]
    pub common: Common,
    /// Every shard of the cluster when `ALL_SHARDS_POD_FQDNS` is given (names the groups), else empty.
    pub shards: Vec<Shard>,
}

/// The event of `rejoin`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejoin {
    /// Common fields.
    #[serde(flatten)]
    pub common: Common,
    /// This pod's shard.
    pub shard: Shard,
    /// This pod's name.
    pub pod: String,
    /// The local pika's config file.
    pub config_file: String,
    /// pika's data directory (`PIKA_DATA_DIR`); `None`: the config file's `db-path`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<String>,
    /// A plain-http Kubernetes API proxy to record a refused start on, instead of the in-cluster API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kube_api: Option<String>,
}

/// The event of `pre-stop`: the pika container's preStop hook, run before the kubelet sends pika SIGTERM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreStop {
    /// Common fields (etcd required: the hand-over takes the topology and group locks and writes a fence).
    #[serde(flatten)]
    pub common: Common,
    /// This pod's shard.
    pub shard: Shard,
    /// This pod's name.
    pub pod: String,
    /// A plain-http Kubernetes API proxy to ask whether the Cluster is being deleted and for rollout facts, instead
    /// of the in-cluster API.
    #[serde(default)]
    pub kube_api: Option<String>,
}

/// The event of `watch`, the long-running failover watcher.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Watch {
    /// Common fields (etcd required: the election and the fences live there).
    #[serde(flatten)]
    pub common: Common,
    /// How long a master must fail every probe before it is failed over, in milliseconds.
    pub detection_ms: u64,
    /// How often each master is probed, in milliseconds.
    pub probe_interval_ms: u64,
    /// TTL of the election lease, in seconds.
    pub lease_seconds: u64,
    /// This watcher's pod, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// A plain-http Kubernetes API proxy to record failovers on, instead of the in-cluster API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kube_api: Option<String>,
}

impl Event {
    /// Parses and validates the rendered document of `action`; `template_var` names the template's source.
    pub fn from_document(action: &str, doc: Value, template_var: &str) -> Result<Self> {
        // The tag names the variant; checked before parsing, so that another action's event is refused as such.
        let rendered = doc.get("action").and_then(Value::as_str).unwrap_or("no action's").to_owned();
        if rendered != action {
            return Err(Error::invalid(template_var, format!("the {action} template rendered a {rendered} event")));
        }
        let event: Self = serde_json::from_value(doc)
            .map_err(|e| Error::invalid(template_var, format!("the {action} event does not parse: {e}")))?;
        event.validate()?;
        Ok(event)
    }

    /// The common fields (every action but `role-probe`).
    #[must_use]
    pub fn common(&self) -> Option<&Common> {
        match self {
            Self::PostProvision(PostProvision { common, .. })
            | Self::ShardAdd(ShardAdd { common, .. })
            | Self::ShardRemove(ShardRemove { common, .. })
            | Self::PreTerminate(PreTerminate { common, .. })
            | Self::MemberJoin(MemberJoin { common, .. })
            | Self::MemberLeave(MemberLeave { common, .. })
            | Self::Switchover(Switchover { common, .. })
            | Self::Rejoin(Rejoin { common, .. })
            | Self::PreStop(PreStop { common, .. })
            | Self::Topology(Topology { common, .. })
            | Self::Watch(Watch { common, .. }) => Some(common),
            Self::RoleProbe(_) => None,
        }
    }

    /// Seconds this run may work.
    #[must_use]
    pub fn budget_seconds(&self) -> u64 {
        match self {
            Self::RoleProbe(RoleProbe { budget_seconds, .. }) => *budget_seconds,
            other => other.common().map_or(50, |c| c.budget_seconds),
        }
    }

    /// Cross-field checks; each failure names the variable the built-in templates read the field from.
    pub fn validate(&self) -> Result<()> {
        let Some(common) = self.common() else { return Ok(()) };
        let cluster = &common.cluster;
        crate::input::address::check_label(&cluster.name).map_err(|e| Error::invalid(vars::CLUSTER_NAME, e))?;
        crate::input::address::check_label(&cluster.namespace)
            .map_err(|e| Error::invalid(vars::CLUSTER_NAMESPACE, e))?;
        if let Some(product) = &common.codis.product {
            if product.contains(['/', ' ', '#', '?']) {
                return Err(Error::invalid(vars::CODIS_PRODUCT_NAME, format!("{product:?} is not a product name")));
            }
        }
        match self {
            Self::PostProvision(PostProvision { shard, shards, own_shard, kube_api, .. }) => {
                if let Some(url) = kube_api {
                    check_kube_api(url)?;
                }
                check_shard(cluster, shard, vars::SHARD_POD_FQDNS)?;
                if !own_shard {
                    check_shards(cluster, shards)?;
                    require_listed(shard, shards, vars::SHARD_NAME)?;
                }
            }
            Self::ShardAdd(ShardAdd { shard, shards, added, .. }) => {
                check_shard(cluster, shard, vars::SHARD_POD_FQDNS)?;
                check_shards(cluster, shards)?;
                check_shard_name(cluster, added, vars::KB_ADD_SHARD_NAME)?;
                if !shards.iter().any(|s| &s.name == added) {
                    return Err(Error::invalid(
                        vars::KB_ADD_SHARD_NAME,
                        format!("{added} is not among the shards of {}", vars::ALL_SHARDS_POD_FQDNS),
                    ));
                }
            }
            Self::ShardRemove(ShardRemove { shard, shards, removed, kube_api, .. }) => {
                if let Some(url) = kube_api {
                    check_kube_api(url)?;
                }
                check_shard(cluster, shard, vars::SHARD_POD_FQDNS)?;
                check_shards(cluster, shards)?;
                check_shard_name(cluster, removed, vars::KB_REMOVE_SHARD_NAME)?;
            }
            Self::PreTerminate(PreTerminate { shard, shards, legacy, scaling_in, kube_api, .. }) => {
                if let Some(url) = kube_api {
                    check_kube_api(url)?;
                }
                check_shard(cluster, shard, vars::SHARD_POD_FQDNS)?;
                // 1.0.x gives the shards only when scaling in; 1.1+ always (a drain may be needed).
                if scaling_in.unwrap_or(true) {
                    check_shards(cluster, shards)?;
                }
                if common.kubeblocks == KbLine::V1_0 && (legacy.is_none() || scaling_in.is_none()) {
                    return Err(Error::invalid(
                        "template",
                        "a 1.0.x pre-terminate event needs the legacy component lists and the scaling-in flag",
                    ));
                }
            }
            Self::MemberJoin(MemberJoin { shard, member, .. }) => {
                check_shard(cluster, shard, vars::SHARD_POD_FQDNS)?;
                check_member(cluster, shard, member, vars::KB_JOIN_MEMBER_POD_NAME, vars::KB_JOIN_MEMBER_POD_FQDN)?;
                if !shard.pods.contains(&member.fqdn) {
                    return Err(Error::invalid(
                        vars::KB_JOIN_MEMBER_POD_FQDN,
                        format!("{} is not a pod of {} ({})", member.fqdn.fqdn, shard.name, vars::SHARD_POD_FQDNS),
                    ));
                }
            }
            Self::MemberLeave(MemberLeave { shard, member, .. }) => {
                check_shard(cluster, shard, vars::SHARD_POD_FQDNS)?;
                // The leaving pod is already gone from the desired pod list: check only that it is this shard's.
                check_member(cluster, shard, member, vars::KB_LEAVE_MEMBER_POD_NAME, vars::KB_LEAVE_MEMBER_POD_FQDN)?;
            }
            Self::Switchover(Switchover { shard, current, candidate, kube_api, .. }) => {
                if let Some(url) = kube_api {
                    check_kube_api(url)?;
                }
                check_shard(cluster, shard, vars::SHARD_POD_FQDNS)?;
                check_member(
                    cluster,
                    shard,
                    current,
                    vars::KB_SWITCHOVER_CURRENT_NAME,
                    vars::KB_SWITCHOVER_CURRENT_FQDN,
                )?;
                if let Some(candidate) = candidate {
                    check_member(
                        cluster,
                        shard,
                        candidate,
                        vars::KB_SWITCHOVER_CANDIDATE_NAME,
                        vars::KB_SWITCHOVER_CANDIDATE_FQDN,
                    )?;
                    if candidate.fqdn == current.fqdn {
                        return Err(Error::invalid(
                            vars::KB_SWITCHOVER_CANDIDATE_FQDN,
                            "the candidate is the current pod itself",
                        ));
                    }
                }
            }
            Self::Rejoin(Rejoin { shard, pod, kube_api, .. }) | Self::PreStop(PreStop { shard, pod, kube_api, .. }) => {
                if let Some(url) = kube_api {
                    check_kube_api(url)?;
                }
                check_shard(cluster, shard, vars::SHARD_POD_FQDNS)?;
                if !shard.pods.iter().any(|p| p.name() == pod) {
                    return Err(Error::invalid(
                        vars::POD_NAME,
                        format!("{pod} is not a pod of {} ({})", shard.name, vars::SHARD_POD_FQDNS),
                    ));
                }
            }
            Self::Topology(Topology { shards, .. }) => {
                if !shards.is_empty() {
                    check_shards(cluster, shards)?;
                }
            }
            Self::Watch(Watch { detection_ms, probe_interval_ms, kube_api, pod, .. }) => {
                // The only action that cannot run at all without etcd: the watchers elect their leader there.
                if common.etcd.is_empty() {
                    return Err(Error::invalid(
                        vars::ETCD_ENDPOINTS,
                        "is not set: the watchers elect their leader there",
                    ));
                }
                if let Some(url) = kube_api {
                    check_kube_api(url)?;
                }
                if let Some(pod) = pod {
                    crate::input::address::check_label(pod).map_err(|e| Error::invalid(vars::POD_NAME, e))?;
                }
                // A probe interval as long as the detection time would fail a master over on one missed probe.
                if probe_interval_ms >= detection_ms {
                    return Err(Error::invalid(
                        vars::WATCH_PROBE_INTERVAL_MS,
                        format!(
                            "{probe_interval_ms} ms is not shorter than {} ({detection_ms} ms): a master would be \
                             failed over on a single missed probe",
                            vars::FAILOVER_DETECTION_MS
                        ),
                    ));
                }
            }
            Self::RoleProbe(_) => {}
        }
        Ok(())
    }
}

/// `KUBE_API_URL` must be a plain-http URL of a host and port: it is meant for `kubectl proxy` and tests, and
/// carries no credentials, so an `https://` API server (which needs them) is a configuration error.
fn check_kube_api(url: &str) -> Result<()> {
    let rest = url.strip_prefix("http://").ok_or_else(|| {
        Error::invalid(vars::KUBE_API_URL, format!("{url:?} is not a plain http:// url (e.g. http://127.0.0.1:8001)"))
    })?;
    let authority = rest.split('/').next().unwrap_or_default();
    crate::input::address::check_host_port(authority).map_err(|e| Error::invalid(vars::KUBE_API_URL, e))
}

fn check_shard_name(cluster: &ClusterRef, name: &str, var: &str) -> Result<()> {
    crate::input::address::check_label(name).map_err(|e| Error::invalid(var, e))?;
    if !name.starts_with(&format!("{}-", cluster.name)) {
        return Err(Error::invalid(var, format!("{name} is not a component of cluster {}", cluster.name)));
    }
    Ok(())
}

/// Every pod must be `<shard>-<n>.<shard>-headless.<namespace>.svc...`: anything else is another shard's or cluster's.
fn check_shard(cluster: &ClusterRef, shard: &Shard, pods_var: &str) -> Result<()> {
    let name_var = if pods_var == vars::SHARD_POD_FQDNS { vars::SHARD_NAME } else { pods_var };
    check_shard_name(cluster, &shard.name, name_var)?;
    if shard.pods.is_empty() {
        return Err(Error::invalid(pods_var, format!("shard {} has no pods", shard.name)));
    }
    for pod in &shard.pods {
        check_pod_of(cluster, shard, pod, pods_var)?;
    }
    Ok(())
}

fn check_pod_of(cluster: &ClusterRef, shard: &Shard, pod: &Pod, var: &str) -> Result<()> {
    let service = format!("{}-headless", shard.name);
    let prefix = format!("{}-", shard.name);
    let own_name = pod.name().strip_prefix(&prefix).is_some_and(|rest| rest.parse::<u32>().is_ok());
    if pod.service() != service || !own_name {
        return Err(Error::invalid(var, format!("{} is not a pod of shard {}", pod.fqdn, shard.name)));
    }
    if pod.namespace() != cluster.namespace {
        return Err(Error::invalid(
            var,
            format!("{} is in namespace {}, not {}", pod.fqdn, pod.namespace(), cluster.namespace),
        ));
    }
    Ok(())
}

fn check_shards(cluster: &ClusterRef, shards: &[Shard]) -> Result<()> {
    if shards.is_empty() {
        return Err(Error::invalid(vars::ALL_SHARDS_POD_FQDNS, "lists no shard"));
    }
    for shard in shards {
        check_shard(cluster, shard, vars::ALL_SHARDS_POD_FQDNS)?;
    }
    Ok(())
}

fn require_listed(shard: &Shard, shards: &[Shard], var: &str) -> Result<()> {
    if shards.iter().any(|s| s.name == shard.name) {
        Ok(())
    } else {
        Err(Error::invalid(var, format!("{} is not among the shards of {}", shard.name, vars::ALL_SHARDS_POD_FQDNS)))
    }
}

/// The pod KubeBlocks names must be this shard's: its name matches its FQDN, which names the shard's headless service
/// in the cluster's namespace (a pod of a same-named cluster in another namespace is not ours: exit 2).
fn check_member(cluster: &ClusterRef, shard: &Shard, member: &PodRef, name_var: &str, fqdn_var: &str) -> Result<()> {
    if member.fqdn.name() != member.name {
        return Err(Error::invalid(
            name_var,
            format!("{} does not match the pod of {fqdn_var} ({})", member.name, member.fqdn.fqdn),
        ));
    }
    let service = format!("{}-headless", shard.name);
    if member.fqdn.service() != service {
        return Err(Error::invalid(fqdn_var, format!("{} is not a pod of shard {}", member.fqdn.fqdn, shard.name)));
    }
    if member.fqdn.namespace() != cluster.namespace {
        return Err(Error::invalid(
            fqdn_var,
            format!("{} is in namespace {}, not {}", member.fqdn.fqdn, member.fqdn.namespace(), cluster.namespace),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_parts_come_from_the_fqdn() {
        let pod = Pod::try_from("c1-pika-x7k-2.c1-pika-x7k-headless.ns.svc.cluster.local".to_owned()).unwrap();
        assert_eq!(pod.name(), "c1-pika-x7k-2");
        assert_eq!(pod.service(), "c1-pika-x7k-headless");
        assert_eq!(pod.namespace(), "ns");
        assert_eq!(pod.ordinal(), Some(2));
        assert_eq!(pod.server(9221), "c1-pika-x7k-2.c1-pika-x7k-headless.ns.svc.cluster.local:9221");
        assert!(Pod::try_from("c1-pika.c1-pika-headless.ns.svc".to_owned()).is_err());
    }
}
