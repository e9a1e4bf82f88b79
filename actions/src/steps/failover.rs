//! What is kept about unplanned mastership changes, for people and for the next decision: the last failover of each
//! group (when, from, to, why, by whom), whether a group ever held data, and the Kubernetes Events that announce a
//! failover or a refused start.
//!
//! The failover watcher ([`crate::actions::watcher`]) and `rejoin` ([`crate::actions::rejoin`]) write these; `topology` reads them.
//! All of it lives in etcd under the cluster's prefix:
//!
//! - `<prefix>failovers/<gid>`: the last [`FailoverRecord`] of the group, as JSON (overwritten by the next one);
//! - `<prefix>held-data/<gid>`: written by the watcher when it first probes the group's master: [`NEVER_HELD`] while
//!   its replication offset is zero, then `<server> offset <n>` once it is above zero, that is, once it took a write.
//!   `rejoin` starts an empty master with no replica left with data only when the mark says [`NEVER_HELD`] (starting
//!   empty loses nothing); with any other mark, or none (no watcher ever looked: nobody can say), it refuses.
//!
//! Writing a record or an Event is best effort: a failure is logged and never undoes or blocks the failover.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::clients::etcd::Etcd;
use crate::clients::kube::{Kube, ObjectRef};
use crate::input::replication::BinlogPosition;

/// How long recording an Event may take before it is given up.
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(3);

/// Event reason of a master replaced by the watcher or handed over by a restarting master.
pub const REASON_FAILOVER: &str = "Failover";
/// Event reason of a failed-over master's last writes written again when it came back.
pub const REASON_SALVAGED: &str = "Salvaged";
/// Event reason of a pika that `rejoin` would not let start.
pub const REASON_REFUSED_START: &str = "RefusedStart";

/// One unplanned change of a group's master.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailoverRecord {
    /// The group.
    pub gid: u32,
    /// When the new master was confirmed, RFC 3339.
    pub at: String,
    /// The old master (`<fqdn>:<port>`).
    pub from: String,
    /// The new master.
    pub to: String,
    /// Why the old master had to go.
    pub why: String,
    /// Who did it: `watcher <pod>` or `rejoin <pod>`.
    pub by: String,
    /// From the moment the old master was found gone to the new master's confirmation, in milliseconds.
    pub took_ms: u64,
    /// How far the new master's binlog was, at its promotion, behind the old master's at the old master's last
    /// answer, when both are known: a lower bound of what the old master had acknowledged and the new one lacked,
    /// since writes the old master took after its last answer cannot be counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_bytes: Option<u64>,
    /// Where the new master's binlog stood at its promotion: the old master's records past it are what the new
    /// master never got, salvaged when the old master comes back with its volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promoted_at: Option<BinlogPosition>,
}

impl FailoverRecord {
    /// One line, for logs, Events and `topology`.
    #[must_use]
    pub fn describe(&self) -> String {
        let lag = self
            .lag_bytes
            .map(|l| {
                format!(", replication lag at least {l} bytes (writes after the master's last answer not counted)")
            })
            .unwrap_or_default();
        format!(
            "group {}: {} replaced {} as master at {} ({}; by {}, {} ms{lag})",
            self.gid, self.to, self.from, self.at, self.why, self.by, self.took_ms
        )
    }
}

/// The held-data mark of a group whose master the watcher saw with offset zero: it never took a write.
pub const NEVER_HELD: &str = "none";

/// What a group's held-data mark says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeldData {
    /// The watcher saw its master with offset zero and never above.
    Never,
    /// Its master was seen with an offset above zero.
    Held,
    /// No mark: no watcher looked (or etcd could not be read).
    Unknown,
}

impl HeldData {
    /// From the mark's value (`None`: no mark).
    #[must_use]
    pub fn of(mark: Option<&str>) -> Self {
        match mark {
            None => Self::Unknown,
            Some(v) if v.trim() == NEVER_HELD => Self::Never,
            Some(_) => Self::Held,
        }
    }

    /// Whether the group may hold data (anything but [`HeldData::Never`]).
    #[must_use]
    pub fn may_hold_data(self) -> bool {
        self != Self::Never
    }
}

/// The current time, RFC 3339.
#[must_use]
pub fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

/// `<prefix>failovers/<gid>`.
#[must_use]
pub fn record_key(prefix: &str, gid: u32) -> String {
    format!("{}/failovers/{gid}", prefix.trim_end_matches('/'))
}

/// `<prefix>held-data/<gid>`.
#[must_use]
pub fn held_data_key(prefix: &str, gid: u32) -> String {
    format!("{}/held-data/{gid}", prefix.trim_end_matches('/'))
}

/// Stores `record` as its group's last failover; failures are logged.
pub async fn store(etcd: &Etcd, prefix: &str, record: &FailoverRecord) {
    let Ok(json) = serde_json::to_string(record) else { return };
    if let Err(e) = etcd.put(&record_key(prefix, record.gid), &json, None).await {
        tracing::warn!(gid = record.gid, error = %e, "could not store the failover record");
    }
}

/// Group `gid`'s last failover; `None` when it had none (or its record does not parse).
///
/// # Errors
/// etcd errors.
pub async fn last_failover(
    etcd: &Etcd,
    prefix: &str,
    gid: u32,
) -> Result<Option<FailoverRecord>, crate::clients::etcd::Error> {
    Ok(etcd.get(&record_key(prefix, gid)).await?.and_then(|e| serde_json::from_str(&e.value).ok()))
}

/// The last failover of every group that had one, by group.
///
/// # Errors
/// etcd errors (a record that does not parse is skipped).
pub async fn last_failovers(
    etcd: &Etcd,
    prefix: &str,
) -> Result<BTreeMap<u32, FailoverRecord>, crate::clients::etcd::Error> {
    let dir = format!("{}/failovers/", prefix.trim_end_matches('/'));
    let mut out = BTreeMap::new();
    for (key, entry) in etcd.list(&dir).await? {
        let Some(gid) = key.strip_prefix(&dir).and_then(|g| g.parse().ok()) else { continue };
        match serde_json::from_str::<FailoverRecord>(&entry.value) {
            Ok(record) => {
                out.insert(gid, record);
            }
            Err(e) => tracing::warn!(key, error = %e, "skipping a failover record that does not parse"),
        }
    }
    Ok(out)
}

/// Announces `message` as a Kubernetes Event on `involved` when an API is reachable (`kube_api`, else the pod's
/// service account); best effort, bounded by [`EVENT_TIMEOUT`].
pub async fn announce(
    kube_api: Option<&str>,
    namespace: &str,
    involved: &ObjectRef,
    reason: &str,
    message: &str,
    warning: bool,
) {
    let attempt = async {
        let Some(kube) = Kube::reachable(kube_api, namespace, EVENT_TIMEOUT).await else {
            tracing::debug!(reason, "no kubernetes api: the event is only logged");
            return;
        };
        if let Err(e) = kube.record_event(namespace, involved, reason, message, warning).await {
            tracing::warn!(reason, error = %e, "could not record the kubernetes event");
        }
    };
    if tokio::time::timeout(EVENT_TIMEOUT * 2, attempt).await.is_err() {
        tracing::warn!(reason, "the kubernetes api did not answer in time; the event is only logged");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_live_under_the_cluster_prefix() {
        assert_eq!(record_key("/pika-kubeblocks/ns/c1/", 3), "/pika-kubeblocks/ns/c1/failovers/3");
        assert_eq!(held_data_key("/pika-kubeblocks/ns/c1/", 12), "/pika-kubeblocks/ns/c1/held-data/12");
    }

    #[test]
    fn only_a_never_held_mark_says_the_group_has_no_data() {
        assert_eq!(HeldData::of(Some(NEVER_HELD)), HeldData::Never);
        assert_eq!(HeldData::of(Some("c1-pika-a-0:9221 offset 14")), HeldData::Held);
        assert_eq!(HeldData::of(None), HeldData::Unknown);
        assert!(HeldData::Unknown.may_hold_data() && HeldData::Held.may_hold_data());
        assert!(!HeldData::Never.may_hold_data());
    }

    #[test]
    fn a_record_reads_back_and_describes_itself() {
        let record = FailoverRecord {
            gid: 4,
            at: "2026-03-01T10:00:00Z".into(),
            from: "c1-pika-a-0.c1-pika-a-headless.ns.svc.cluster.local:9221".into(),
            to: "c1-pika-a-1.c1-pika-a-headless.ns.svc.cluster.local:9221".into(),
            why: "no answer for 2000 ms (connection refused)".into(),
            by: "watcher c1-codis-dashboard-0".into(),
            took_ms: 2400,
            lag_bytes: Some(14),
            promoted_at: Some(BinlogPosition::new(0, 1200)),
        };
        let json = serde_json::to_string(&record).unwrap();
        assert_eq!(serde_json::from_str::<FailoverRecord>(&json).unwrap(), record);
        let line = record.describe();
        assert!(line.starts_with("group 4: c1-pika-a-1."), "{line}");
        assert!(line.contains("replaced c1-pika-a-0.") && line.contains("lag at least 14 bytes"), "{line}");
        assert!(line.contains("connection refused") && line.contains("2400 ms"), "{line}");
    }
}
