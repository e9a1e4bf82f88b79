//! Removing a registered codis-proxy that is gone for good ([`crate::plan::proxies`] decides), with Codis's force
//! removal, so that promotes and slot changes no longer wait for it.

use std::time::Duration;

use crate::clients::codis::Proxy;
use crate::clients::kube::{ContainerLife, Kube};
use crate::error::Result;
use crate::input::address::HostPort;
use crate::plan::proxies::{judge, Judgement, PodSays, ProxySeen};
use crate::steps::cluster::Session;

/// Event reason of a proxy the failover watcher removed from Codis.
pub const REASON_PROXY_REMOVED: &str = "ProxyRemoved";
/// The chart's proxy container (`cmpd-codis-proxy.yaml`).
pub const PROXY_CONTAINER: &str = "codis-proxy";
/// Longest one Kubernetes API call may take here.
const KUBE_TIMEOUT: Duration = Duration::from_secs(2);

/// What [`remove_if_gone`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Removal {
    /// Codis forgot it; why it was judged gone.
    Removed {
        /// Why it was judged gone.
        why: &'static str,
    },
    /// It is no longer registered (someone removed it, or its preStop ran late).
    NotListed,
    /// It may be alive; why.
    Kept(&'static str),
}

/// Removes the proxy registered under `token` if it is gone: its probes failed for the detection time (the
/// caller's finding), `replaced` when another token answered at its address, and the dashboard's fresh stats and
/// the Kubernetes API (at `kube_api`, or in-cluster) are asked here.
///
/// Idempotent: a proxy no longer listed is [`Removal::NotListed`].
///
/// # Errors
/// The dashboard cannot be read or refuses the removal.
pub async fn remove_if_gone(s: &Session<'_>, token: &str, replaced: bool, kube_api: Option<&str>) -> Result<Removal> {
    let watched = s.dashboard.watched().await?;
    let Some(health) = watched.proxies.into_iter().find(|p| p.proxy.token == token) else {
        return Ok(Removal::NotListed);
    };
    let dashboard_reaches = health.unreachable.is_none();
    let pod = if dashboard_reaches || replaced {
        // Not asked: the judgement does not depend on it.
        PodSays::CannotAsk
    } else {
        pod_says(s, &health.proxy, kube_api).await
    };
    match judge(ProxySeen { dashboard_reaches, replaced, pod }) {
        Judgement::Keep(why) => Ok(Removal::Kept(why)),
        Judgement::Remove(why) => match s.dashboard.proxy_remove(token, true).await {
            Ok(()) => Ok(Removal::Removed { why }),
            Err(e) if e.is_not_found() => Ok(Removal::NotListed),
            Err(e) => Err(e.into()),
        },
    }
}

/// What the Kubernetes API says of the pod `proxy` runs in: the chart advertises a proxy's admin API at its pod's
/// FQDN (`<pod>.<headless service>…`), whose first label is the pod's name.
async fn pod_says(s: &Session<'_>, proxy: &Proxy, kube_api: Option<&str>) -> PodSays {
    let namespace = &s.common.cluster.namespace;
    let Some(kube) = Kube::reachable(kube_api, namespace, KUBE_TIMEOUT).await else { return PodSays::NoApi };
    let Some(pod) = pod_of(&proxy.admin_addr) else { return PodSays::Unnamed };
    match kube.container_life(namespace, &pod, PROXY_CONTAINER).await {
        Ok(ContainerLife::PodGone) => PodSays::Gone,
        Ok(ContainerLife::PodTerminating) => PodSays::Terminating,
        Ok(ContainerLife::NotRunning) => PodSays::NotRunning,
        Ok(ContainerLife::Running) => PodSays::Running,
        Err(e) => {
            tracing::info!(proxy = %proxy.admin_addr, error = %e, "cannot ask the kubernetes api about the proxy's pod");
            PodSays::CannotAsk
        }
    }
}

/// The pod named by an admin address `<pod>.<service>…:<port>`; `None` for an IP address or a name of one label.
fn pod_of(admin_addr: &str) -> Option<String> {
    let at = HostPort::parse(admin_addr).ok()?;
    if at.host().parse::<std::net::IpAddr>().is_ok() {
        return None;
    }
    at.host().split_once('.').map(|(pod, _)| pod.to_owned()).filter(|pod| !pod.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pod_is_the_first_label_of_the_chart_s_admin_address() {
        assert_eq!(pod_of("c1-proxy-0.c1-proxy-headless.ns.svc.cluster.local:11080").as_deref(), Some("c1-proxy-0"));
        assert_eq!(pod_of("10.0.0.7:11080"), None);
        assert_eq!(pod_of("[fd00::7]:11080"), None);
        assert_eq!(pod_of("localhost:11080"), None);
        assert_eq!(pod_of("not an address"), None);
    }
}
