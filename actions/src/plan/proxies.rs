//! Whether a registered codis-proxy that stopped answering is gone for good, so that Codis may forget it.
//!
//! Codis pushes every promote and every slot change to every registered proxy and fails when one does not answer,
//! and a proxy whose pod died without its preStop stays registered for ever: from then on no failover, switchover
//! or scale succeeds. Removing a proxy that is alive is worse than leaving it: it keeps serving clients with a
//! routing table nobody updates. So a proxy is removed only when three things agree, each a different witness: the
//! watcher's own probes failed for the whole detection time ([`crate::plan::detector`]), the dashboard cannot
//! reach it either (otherwise Codis's own removal would shut a live proxy down), and its process is known gone:
//! another proxy answers at its address under another token (a container restarted in its pod), or the Kubernetes
//! API says its pod is gone, being deleted, or runs no proxy container. Without a Kubernetes API (outside a
//! cluster) the first two witnesses decide alone.

/// What the Kubernetes API says of the proxy's pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodSays {
    /// No API to ask: not running in a cluster.
    NoApi,
    /// No such pod.
    Gone,
    /// The pod is being deleted.
    Terminating,
    /// The pod exists and its proxy container is not running.
    NotRunning,
    /// The proxy container runs: the proxy may be alive behind a partition.
    Running,
    /// The proxy's address names no pod (an IP address), so the API cannot be asked about it.
    Unnamed,
    /// The API did not answer.
    CannotAsk,
}

/// What was seen of a proxy whose every probe failed for the detection time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxySeen {
    /// The dashboard reached it the last time it asked.
    pub dashboard_reaches: bool,
    /// Another proxy, under another token, answers at its admin address.
    pub replaced: bool,
    /// What the API says of its pod.
    pub pod: PodSays,
}

/// Whether to remove it, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judgement {
    /// It is gone: remove it (Codis's force removal).
    Remove(&'static str),
    /// It may be alive: keep it.
    Keep(&'static str),
}

/// Judges a proxy that failed every probe for the detection time (see the module's rule).
#[must_use]
pub fn judge(seen: ProxySeen) -> Judgement {
    if seen.dashboard_reaches {
        return Judgement::Keep("the dashboard still reaches it");
    }
    if seen.replaced {
        return Judgement::Remove("another proxy answers at its address: its process is gone");
    }
    match seen.pod {
        PodSays::NoApi => Judgement::Remove("neither the watcher nor the dashboard reached it for the detection time"),
        PodSays::Gone => Judgement::Remove("its pod is gone"),
        PodSays::Terminating => Judgement::Remove("its pod is being deleted"),
        PodSays::NotRunning => Judgement::Remove("its pod runs no proxy container"),
        PodSays::Running => Judgement::Keep("its pod's proxy container runs: it may be alive behind a partition"),
        PodSays::Unnamed => {
            Judgement::Keep("its address names no pod, so the Kubernetes API cannot confirm it is gone")
        }
        PodSays::CannotAsk => Judgement::Keep("the Kubernetes API cannot confirm it is gone"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PODS: [PodSays; 7] = [
        PodSays::NoApi,
        PodSays::Gone,
        PodSays::Terminating,
        PodSays::NotRunning,
        PodSays::Running,
        PodSays::Unnamed,
        PodSays::CannotAsk,
    ];

    fn every_case() -> impl Iterator<Item = ProxySeen> {
        [false, true].into_iter().flat_map(|dashboard_reaches| {
            [false, true].into_iter().flat_map(move |replaced| {
                PODS.into_iter().map(move |pod| ProxySeen { dashboard_reaches, replaced, pod })
            })
        })
    }

    #[test]
    fn a_proxy_is_removed_exactly_when_both_probes_fail_and_its_process_is_known_gone() {
        for seen in every_case() {
            let gone = seen.replaced
                || matches!(seen.pod, PodSays::NoApi | PodSays::Gone | PodSays::Terminating | PodSays::NotRunning);
            let expected = !seen.dashboard_reaches && gone;
            assert_eq!(matches!(judge(seen), Judgement::Remove(_)), expected, "{seen:?}");
        }
    }

    #[test]
    fn a_proxy_the_dashboard_reaches_or_whose_container_runs_at_its_address_is_never_removed() {
        for seen in every_case() {
            if seen.dashboard_reaches || (seen.pod == PodSays::Running && !seen.replaced) {
                assert!(matches!(judge(seen), Judgement::Keep(_)), "{seen:?}");
            }
        }
    }
}
