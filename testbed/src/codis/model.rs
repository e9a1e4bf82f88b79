//! The dashboard's JSON models, field for field and in Codis's serialisation order (upstream and fork).
//!
//! These are what the double stores and serves, and what [`super::CodisDouble::snapshot`] hands to tests. Field order
//! matters only cosmetically (JSON objects are unordered), but it is kept so the double's output reads like a
//! recording. Go's `omitempty` becomes `skip_serializing_if`; fork-only fields are `Option`s that are `Some` exactly
//! when the double runs in fork mode.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}

fn is_false(v: &bool) -> bool {
    !*v
}

/// The dashboard's own model (`/topom/model`, `/api/topom/model`, and `model` in `/topom`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TopomModel {
    /// Random token of this dashboard process.
    pub token: String,
    /// Start time in Go's `time.Time` text form.
    pub start_time: String,
    /// The configured admin address.
    pub admin_addr: String,
    /// The product name (the input of the xauth).
    pub product_name: String,
    /// Process id.
    pub pid: u32,
    /// Working directory.
    pub pwd: String,
    /// `uname`-like description.
    pub sys: String,
}

/// State of a server's sync action.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServerActionState {
    /// No action (`{}` on the wire).
    #[default]
    #[serde(rename = "")]
    Nothing,
    /// Waiting for the executor.
    Pending,
    /// SLAVEOF is being sent.
    Syncing,
    /// SLAVEOF was accepted.
    Synced,
    /// SLAVEOF failed.
    SyncedFailed,
}

impl ServerActionState {
    /// Whether there is no action.
    #[must_use]
    pub fn is_nothing(&self) -> bool {
        *self == Self::Nothing
    }
}

/// A server's sync action: `{}`, `{"index": n, "state": "pending"}`, `{"state": "synced"}`, ...
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ServerAction {
    /// Queue position while pending or syncing; 0 (omitted) otherwise.
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub index: u32,
    /// The state; omitted when there is no action.
    #[serde(skip_serializing_if = "ServerActionState::is_nothing")]
    pub state: ServerActionState,
}

/// One server of a group. `servers[0]` is the master; position is the only marker upstream.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct GroupServer {
    /// The address exactly as registered.
    pub server: String,
    /// Datacenter given to `group/add`, or empty.
    pub datacenter: String,
    /// Sync action.
    pub action: ServerAction,
    /// Fork only: `role:` from the last health check, `""` before the first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// Fork only: binlog file number (redis-server: always 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub binlog_file_num: Option<u64>,
    /// Fork only: binlog offset (redis-server: `master_repl_offset`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub binlog_offset: Option<u64>,
    /// Fork only: `is_eligible_for_master_election` from INFO (redis-server: always true).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub is_eligible_for_master_election: Option<bool>,
    /// Fork only: 0 normal, 1 subjectively offline, 2 offline.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<i32>,
    /// Fork only: how many times an offline server was re-attached.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recall_times: Option<i64>,
    /// Whether proxies may read from this server.
    pub replica_group: bool,
}

/// State of a group's promote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PromotingState {
    /// Not promoting (`{}` on the wire).
    #[default]
    #[serde(rename = "")]
    Nothing,
    /// Stored, slots not yet pushed locked.
    Preparing,
    /// Slots pushed locked to every proxy.
    Prepared,
    /// Servers reordered, slots not yet pushed unlocked.
    Finished,
}

impl PromotingState {
    /// Whether no promote is in progress.
    #[must_use]
    pub fn is_nothing(&self) -> bool {
        *self == Self::Nothing
    }
}

/// A group's promote: `{}` or `{"index": i, "state": ...}`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Promoting {
    /// Index of the server being promoted (0 once finished).
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub index: u32,
    /// The state; omitted when not promoting.
    #[serde(skip_serializing_if = "PromotingState::is_nothing")]
    pub state: PromotingState,
}

/// A server group (one shard).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Group {
    /// Group id, 1..=9999.
    pub id: u32,
    /// Servers, master first.
    pub servers: Vec<GroupServer>,
    /// Promote in progress.
    pub promoting: Promoting,
    /// Informational flag: set by slot assigns, replica-group changes and HA switches; cleared by a resync or a
    /// completed promote.
    pub out_of_sync: bool,
}

impl Group {
    /// The master's registered address, if the group has servers.
    #[must_use]
    pub fn master(&self) -> Option<&str> {
        self.servers.first().map(|s| s.server.as_str())
    }

    /// The position of `addr` in `servers`.
    #[must_use]
    pub fn index_of(&self, addr: &str) -> Option<usize> {
        self.servers.iter().position(|s| s.server == addr)
    }
}

/// State of a slot action.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SlotState {
    /// No action (`{}` on the wire).
    #[default]
    #[serde(rename = "")]
    Nothing,
    /// Created, waiting for the executor.
    Pending,
    /// Picked by the executor, not yet pushed to the proxies.
    Preparing,
    /// Pushed locked to every proxy.
    Prepared,
    /// Keys are moving, batch by batch.
    Migrating,
    /// Moved, not yet pushed to the proxies.
    Finished,
}

impl SlotState {
    /// Whether there is no action.
    #[must_use]
    pub fn is_nothing(&self) -> bool {
        *self == Self::Nothing
    }

    /// Whether the action has been picked by the executor (anything but nothing and pending).
    #[must_use]
    pub fn in_progress(&self) -> bool {
        !matches!(self, Self::Nothing | Self::Pending)
    }

    /// The wire name (`""` for nothing).
    #[must_use]
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Nothing => "",
            Self::Pending => "pending",
            Self::Preparing => "preparing",
            Self::Prepared => "prepared",
            Self::Migrating => "migrating",
            Self::Finished => "finished",
        }
    }
}

/// A slot's action: `{}` or `{"index", "state", "target_id"}`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SlotAction {
    /// Queue position (max index among slots with an action + 1 at creation).
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub index: u32,
    /// The state; omitted when there is no action.
    #[serde(skip_serializing_if = "SlotState::is_nothing")]
    pub state: SlotState,
    /// Destination group.
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub target_id: u32,
}

/// The dashboard's slot mapping (`stats.slots[]`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SlotMapping {
    /// Slot id, equal to its index.
    pub id: usize,
    /// Owning group; 0 = offline.
    pub group_id: u32,
    /// Migration in progress.
    pub action: SlotAction,
}

/// The proxy's view of a slot (`/topom/slots`, and what is pushed to proxies).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Slot {
    /// Slot id.
    pub id: usize,
    /// Requests are held (prepared, or a relevant group's promote is prepared).
    #[serde(skip_serializing_if = "is_false")]
    pub locked: bool,
    /// Master serving the slot.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub backend_addr: String,
    /// Its group.
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub backend_addr_group_id: u32,
    /// Source master while prepared/migrating.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub migrate_from: String,
    /// Its group.
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub migrate_from_group_id: u32,
    /// 1 = semi-async, 0 (omitted) = sync.
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub forward_method: u32,
    /// Replica groups by priority.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub replica_groups: Vec<Vec<String>>,
}

/// A proxy as registered (and as its own `/api/proxy/model` reports it, without `id`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Proxy {
    /// Assigned by the dashboard (max + 1); absent in the proxy's own model.
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub id: u32,
    /// Proxy token (the key of `stats.proxy.stats`).
    pub token: String,
    /// Start time in Go's text form.
    pub start_time: String,
    /// Admin address (port 11080 by default).
    pub admin_addr: String,
    /// `tcp4`.
    pub proto_type: String,
    /// Data address (port 19000 by default).
    pub proxy_addr: String,
    /// Jodis path, when configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jodis_path: Option<String>,
    /// Product name.
    pub product_name: String,
    /// Process id.
    pub pid: u32,
    /// Working directory.
    pub pwd: String,
    /// `uname`-like description.
    pub sys: String,
    /// Fork only: slot count.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_slot_num: Option<usize>,
    /// Host name.
    pub hostname: String,
    /// Datacenter.
    pub datacenter: String,
}

/// One frame of a Codis error stack.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StackFrame {
    /// Function.
    #[serde(rename = "Name")]
    pub name: String,
    /// File.
    #[serde(rename = "File")]
    pub file: String,
    /// Line.
    #[serde(rename = "Line")]
    pub line: u32,
}

/// A Codis error body: `{"Cause": "...", "Stack": [...] | null}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The message clients read.
    #[serde(rename = "Cause")]
    pub cause: String,
    /// Stack frames of a traced error, `None` (null) for untraced ones.
    #[serde(rename = "Stack")]
    pub stack: Option<Vec<StackFrame>>,
}

/// One server's entry in `stats.group.stats`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ServerStats {
    /// INFO as a flat map, plus `master_addr` and `maxmemory` (upstream: full INFO; fork: INFO replication).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stats: Option<BTreeMap<String, String>>,
    /// Why the server could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
    /// When the entry was taken.
    pub unixtime: i64,
    /// The refresh did not finish in time.
    #[serde(skip_serializing_if = "is_false")]
    pub timeout: bool,
}

/// `ops.redis` of the proxy stats.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProxyRedisOps {
    /// Backend errors.
    pub errors: i64,
}

/// `ops` of the proxy stats.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProxyOps {
    /// Commands handled.
    pub total: i64,
    /// Commands failed.
    pub fails: i64,
    /// Backend errors.
    pub redis: ProxyRedisOps,
    /// Commands per second.
    pub qps: i64,
    /// Per-command counters (only in the full stats: `/proxy/stats`, or stats with flags).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Vec<ProxyCmdStats>>,
}

/// One command's counters in the full proxy stats.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProxyCmdStats {
    /// Command name.
    pub opstr: String,
    /// Calls.
    pub calls: i64,
    /// Total time (µs).
    pub usecs: i64,
    /// Time per call (µs).
    pub usecs_percall: i64,
    /// Failures.
    pub fails: i64,
    /// Backend error replies.
    pub redis_errtype: i64,
}

/// `sessions` of the proxy stats.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProxySessions {
    /// Sessions opened.
    pub total: i64,
    /// Sessions open now.
    pub alive: i64,
}

/// `rusage.raw` of the proxy stats.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProxyRusageRaw {
    /// User time (ns).
    pub utime: i64,
    /// System time (ns).
    pub stime: i64,
    /// Children user time.
    pub cutime: i64,
    /// Children system time.
    pub cstime: i64,
    /// Threads.
    pub num_threads: i64,
    /// Virtual size.
    pub vm_size: i64,
    /// Resident size.
    pub vm_rss: i64,
}

/// `rusage` of the proxy stats.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProxyRusage {
    /// Sample time in Go's text form.
    pub now: String,
    /// CPU share.
    pub cpu: f64,
    /// Resident memory.
    pub mem: i64,
    /// Raw counters.
    pub raw: ProxyRusageRaw,
}

/// `backend` of the proxy stats.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProxyBackend {
    /// Reads go to masters only.
    pub primary_only: bool,
}

/// A proxy's own stats (`/proxy/stats`, `/api/proxy/stats/{pxauth}`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProxyStats {
    /// Started by the dashboard (fillslots + start).
    pub online: bool,
    /// Shut down.
    pub closed: bool,
    /// Sentinel view (always `{}` here).
    pub sentinels: BTreeMap<String, serde_json::Value>,
    /// Command counters.
    pub ops: ProxyOps,
    /// Session counters.
    pub sessions: ProxySessions,
    /// Resource usage.
    pub rusage: ProxyRusage,
    /// Backend options.
    pub backend: ProxyBackend,
    /// Go runtime figures (only in the full stats).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<serde_json::Value>,
    /// Fork only: slow commands seen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slow_cmd_count: Option<i64>,
}

/// One proxy's entry in `stats.proxy.stats`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProxyStatsEntry {
    /// What the proxy reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stats: Option<ProxyStats>,
    /// Why it could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
    /// When the entry was taken.
    pub unixtime: i64,
    /// The refresh did not finish in time.
    #[serde(skip_serializing_if = "is_false")]
    pub timeout: bool,
}

/// `stats.slot_action`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SlotActionStats {
    /// Pause between batches in µs (memory only).
    pub interval: i64,
    /// Pending actions are not picked.
    pub disabled: bool,
    /// `{"status": "..."}`.
    pub progress: SlotActionProgress,
    /// Migration batches on the wire now (the promote refusal reads it); memory only.
    pub executor: i64,
}

/// `stats.slot_action.progress`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SlotActionProgress {
    /// `""`, `"[OK] Slot[0683]@DB[0]=0"` or `"[ERROR] Slot[0683]: <err>"`.
    pub status: String,
}
