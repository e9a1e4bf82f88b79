//! The legacy environment KubeBlocks 1.0.x adds to a component's `postProvision` and `preTerminate`
//! (`hackParameters4Comp`, `pkg/controller/lifecycle/lfa_component.go` at v1.0.2). 1.1 passes neither action any
//! system variable.
//!
//! Emulated: every variable and its content. The cluster lists walk the Component objects of the cluster (label
//! `app.kubernetes.io/instance`) in the order the cached client lists them — which is unspecified, so callers pass
//! them in the order they choose (the emulation shuffles) — and, per component, its pods in listing order:
//! `KB_CLUSTER_POD_{NAME,IP,HOST_NAME,HOST_IP}_LIST` over every component's pods, `KB_CLUSTER_COMPONENT_POD_*` over the
//! action's own component, `KB_CLUSTER_COMPONENT_LIST` every short name, `_DELETING_LIST` those with a deletion
//! timestamp, `_UNDELETED_LIST` the others; `preTerminate` only: `KB_CLUSTER_COMPONENT_IS_SCALING_IN`, the value of
//! the component's `apps.kubeblocks.io/component-scale-in` annotation when present (absent otherwise).
//!
//! Does NOT model: pods of the stand-in components (etcd, Codis) are named after their replicas but carry made-up
//! IPs and node names.

use std::collections::BTreeMap;

/// A pod as the legacy lists see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LegacyPod {
    /// Name.
    pub name: String,
    /// `status.podIP`.
    pub ip: String,
    /// `spec.nodeName`.
    pub node: String,
    /// `status.hostIP`.
    pub host_ip: String,
}

/// A Component as the legacy lists see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LegacyComponent {
    /// Short name.
    pub short: String,
    /// Whether it has a deletion timestamp.
    pub deleting: bool,
    /// Its `apps.kubeblocks.io/component-scale-in` annotation.
    pub scale_in: Option<String>,
    /// Its pods, in listing order.
    pub pods: Vec<LegacyPod>,
}

/// The variables for the action of component `comp` (`terminate` for preTerminate).
pub fn legacy_env(components: &[LegacyComponent], comp: &str, terminate: bool) -> BTreeMap<String, String> {
    let join = |pods: &[&LegacyPod], f: fn(&LegacyPod) -> &str| pods.iter().map(|p| f(p)).collect::<Vec<_>>().join(",");
    let all_pods: Vec<&LegacyPod> = components.iter().flat_map(|c| &c.pods).collect();
    let own_pods: Vec<&LegacyPod> = components.iter().filter(|c| c.short == comp).flat_map(|c| &c.pods).collect();
    let mut m = BTreeMap::new();
    m.insert("KB_CLUSTER_POD_NAME_LIST".to_owned(), join(&all_pods, |p| &p.name));
    m.insert("KB_CLUSTER_POD_IP_LIST".to_owned(), join(&all_pods, |p| &p.ip));
    m.insert("KB_CLUSTER_POD_HOST_NAME_LIST".to_owned(), join(&all_pods, |p| &p.node));
    m.insert("KB_CLUSTER_POD_HOST_IP_LIST".to_owned(), join(&all_pods, |p| &p.host_ip));
    m.insert("KB_CLUSTER_COMPONENT_POD_NAME_LIST".to_owned(), join(&own_pods, |p| &p.name));
    m.insert("KB_CLUSTER_COMPONENT_POD_IP_LIST".to_owned(), join(&own_pods, |p| &p.ip));
    m.insert("KB_CLUSTER_COMPONENT_POD_HOST_NAME_LIST".to_owned(), join(&own_pods, |p| &p.node));
    m.insert("KB_CLUSTER_COMPONENT_POD_HOST_IP_LIST".to_owned(), join(&own_pods, |p| &p.host_ip));
    let names = |f: &dyn Fn(&LegacyComponent) -> bool| {
        components.iter().filter(|c| f(c)).map(|c| c.short.as_str()).collect::<Vec<_>>().join(",")
    };
    m.insert("KB_CLUSTER_COMPONENT_LIST".to_owned(), names(&|_| true));
    m.insert("KB_CLUSTER_COMPONENT_DELETING_LIST".to_owned(), names(&|c| c.deleting));
    m.insert("KB_CLUSTER_COMPONENT_UNDELETED_LIST".to_owned(), names(&|c| !c.deleting));
    if terminate {
        if let Some(value) = components.iter().find(|c| c.short == comp).and_then(|c| c.scale_in.clone()) {
            m.insert("KB_CLUSTER_COMPONENT_IS_SCALING_IN".to_owned(), value);
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn comp(short: &str, pods: usize, deleting: bool, scale_in: Option<&str>) -> LegacyComponent {
        LegacyComponent {
            short: short.into(),
            deleting,
            scale_in: scale_in.map(str::to_owned),
            pods: (0..pods)
                .map(|i| LegacyPod {
                    name: format!("c1-{short}-{i}"),
                    ip: format!("10.0.{}.{i}", short.len()),
                    node: format!("node-{i}"),
                    host_ip: format!("192.168.0.{i}"),
                })
                .collect(),
        }
    }

    #[test]
    fn every_list_in_listing_order_and_scale_in_only_for_pre_terminate() {
        let comps = vec![
            comp("etcd", 1, false, None),
            comp("pika-b7k", 2, false, None),
            comp("pika-x2z", 1, true, Some("true")),
            comp("codis-dashboard", 1, false, None),
        ];
        let env = legacy_env(&comps, "pika-x2z", true);
        let want: BTreeMap<String, String> = [
            ("KB_CLUSTER_POD_NAME_LIST", "c1-etcd-0,c1-pika-b7k-0,c1-pika-b7k-1,c1-pika-x2z-0,c1-codis-dashboard-0"),
            ("KB_CLUSTER_POD_IP_LIST", "10.0.4.0,10.0.8.0,10.0.8.1,10.0.8.0,10.0.15.0"),
            ("KB_CLUSTER_POD_HOST_NAME_LIST", "node-0,node-0,node-1,node-0,node-0"),
            ("KB_CLUSTER_POD_HOST_IP_LIST", "192.168.0.0,192.168.0.0,192.168.0.1,192.168.0.0,192.168.0.0"),
            ("KB_CLUSTER_COMPONENT_POD_NAME_LIST", "c1-pika-x2z-0"),
            ("KB_CLUSTER_COMPONENT_POD_IP_LIST", "10.0.8.0"),
            ("KB_CLUSTER_COMPONENT_POD_HOST_NAME_LIST", "node-0"),
            ("KB_CLUSTER_COMPONENT_POD_HOST_IP_LIST", "192.168.0.0"),
            ("KB_CLUSTER_COMPONENT_LIST", "etcd,pika-b7k,pika-x2z,codis-dashboard"),
            ("KB_CLUSTER_COMPONENT_DELETING_LIST", "pika-x2z"),
            ("KB_CLUSTER_COMPONENT_UNDELETED_LIST", "etcd,pika-b7k,codis-dashboard"),
            ("KB_CLUSTER_COMPONENT_IS_SCALING_IN", "true"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(env, want);

        let post = legacy_env(&comps, "pika-x2z", false);
        assert!(!post.contains_key("KB_CLUSTER_COMPONENT_IS_SCALING_IN"), "postProvision never gets it");
        // A cluster deletion sets no annotation: the variable is absent, not "false".
        let deleting = legacy_env(&[comp("pika-b7k", 1, true, None)], "pika-b7k", true);
        assert!(!deleting.contains_key("KB_CLUSTER_COMPONENT_IS_SCALING_IN"));
        assert_eq!(deleting["KB_CLUSTER_COMPONENT_UNDELETED_LIST"], "");
    }
}
