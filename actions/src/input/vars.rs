//! The environment variables of the action contract, and the only code that reads them.
//!
//! Stage one of configuration: clap structs whose fields are backed by these variables (so `--help` documents the
//! contract), collected into a [`VarMap`] that the event templates render from. Nothing else reads the environment.

use std::collections::BTreeMap;

use clap::Args;

/// Variable values by name, as KubeBlocks handed them over (unset variables are absent).
pub type VarMap = BTreeMap<String, String>;

macro_rules! names {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        $($(#[$doc])* pub const $name: &str = stringify!($name);)*
        /// Every variable name the binary knows.
        pub const ALL: &[&str] = &[$($name),*];
    };
}

names! {
    /// `host:port` of the codis-dashboard admin API.
    CODIS_DASHBOARD_ADDR,
    /// Codis product name; read from the dashboard when absent.
    CODIS_PRODUCT_NAME,
    /// Comma-separated `host:port` of the etcd holding locks and fences.
    ETCD_ENDPOINTS,
    /// Pika port (default 9221).
    PIKA_PORT,
    /// Pika `requirepass` (secret).
    PIKA_PASSWORD,
    /// The local pika for `role-probe` (default 127.0.0.1).
    PIKA_HOST,
    /// The Cluster object's name.
    CLUSTER_NAME,
    /// The Cluster object's namespace.
    CLUSTER_NAMESPACE,
    /// This shard's full component name `<cluster>-<sharding>-<id>`.
    SHARD_NAME,
    /// This shard's pod FQDNs, comma-separated.
    SHARD_POD_FQDNS,
    /// Every shard's pod FQDNs: `<shard>:<fqdn>,<fqdn>;<shard>:...`, keyed by short name.
    ALL_SHARDS_POD_FQDNS,
    /// Seconds one run may work before it stops and reports progress (default 50).
    ACTION_BUDGET_SECONDS,
    /// Directory of event templates replacing the built-in ones.
    ACTION_TEMPLATES_DIR,
    /// `text` (default) or `json`.
    LOG_FORMAT,
    /// KubeBlocks line, `1.0` or `1.1` (1.1 covers 1.1 and later); detected when absent.
    KUBEBLOCKS_LINE,
    /// Test and port-forward hook: `<server>=<host:port>` pairs, comma-separated.
    PIKA_ADDRESS_OVERRIDES,
    /// The pod this process runs in (`rejoin`, `pre-stop`, `watch`).
    POD_NAME,
    /// Seconds `pre-stop` may work handing mastership over before the pod stops anyway (default 20).
    PRE_STOP_BUDGET_SECONDS,
    /// The local pika's config file, edited by `rejoin` before pika starts (default `/data/pika.conf`).
    PIKA_CONFIG_FILE,
    /// pika's data directory, which `rejoin` checks for data (default: the config file's `db-path`).
    PIKA_DATA_DIR,
    /// `watch`: how long a master must fail every probe before it is failed over, in milliseconds (default 2000).
    FAILOVER_DETECTION_MS,
    /// `watch`: how often each master is probed, in milliseconds (default 500).
    WATCH_PROBE_INTERVAL_MS,
    /// `watch`: the TTL of the watchers' election lease in seconds (default 5).
    WATCH_LEASE_SECONDS,
    /// 1.0.x: the cluster's components.
    KB_CLUSTER_COMPONENT_LIST,
    /// 1.0.x: the cluster's components being deleted.
    KB_CLUSTER_COMPONENT_DELETING_LIST,
    /// 1.0.x: the cluster's components not being deleted.
    KB_CLUSTER_COMPONENT_UNDELETED_LIST,
    /// 1.0.x preTerminate: `true` when the number of shards decreased.
    KB_CLUSTER_COMPONENT_IS_SCALING_IN,
    /// 1.1+ shardAdd: the added shard's full name.
    KB_ADD_SHARD_NAME,
    /// 1.1+ shardRemove: the removed shard's full name.
    KB_REMOVE_SHARD_NAME,
    /// memberJoin: the new pod's name.
    KB_JOIN_MEMBER_POD_NAME,
    /// memberJoin: the new pod's FQDN.
    KB_JOIN_MEMBER_POD_FQDN,
    /// memberLeave: the leaving pod's name.
    KB_LEAVE_MEMBER_POD_NAME,
    /// memberLeave: the leaving pod's FQDN.
    KB_LEAVE_MEMBER_POD_FQDN,
    /// switchover: the pod about to restart or leave.
    KB_SWITCHOVER_CURRENT_NAME,
    /// switchover: its FQDN.
    KB_SWITCHOVER_CURRENT_FQDN,
    /// switchover: its role label (may be empty or stale).
    KB_SWITCHOVER_ROLE,
    /// switchover (OpsRequest only): the requested new master's name.
    KB_SWITCHOVER_CANDIDATE_NAME,
    /// switchover (OpsRequest only): the requested new master's FQDN.
    KB_SWITCHOVER_CANDIDATE_FQDN,
    /// Plain-http URL of a Kubernetes API proxy (`kubectl proxy`, tests) used instead of the in-cluster service
    /// account to read rollout facts and the Cluster object.
    KUBE_API_URL,
}

/// Variables whose values are secrets: never rendered into events, never logged.
pub const SECRETS: &[&str] = &[PIKA_PASSWORD];

/// Implemented by every variable group: adds the set variables to the map.
pub trait Collect {
    /// Adds every variable of this group that is set.
    fn collect(&self, into: &mut VarMap);
}

macro_rules! group {
    ($(#[$doc:meta])* $group:ident ($heading:literal) { $($(#[$fdoc:meta])* $field:ident => $var:ident $(, $extra:ident)?;)* }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Default, Args)]
        #[command(next_help_heading = $heading)]
        pub struct $group {
            $(
                $(#[$fdoc])*
                #[arg(long, env = $var, value_name = stringify!($var) $(, $extra = true)?)]
                pub $field: Option<String>,
            )*
        }
        impl Collect for $group {
            fn collect(&self, into: &mut VarMap) {
                $(if let Some(v) = &self.$field { into.insert($var.to_owned(), v.clone()); })*
            }
        }
    };
}

group!(
    /// How to reach Codis.
    DashboardVars ("Codis") {
        /// `host:port` of the codis-dashboard admin API
        codis_dashboard_addr => CODIS_DASHBOARD_ADDR;
        /// Codis product name; read from the dashboard when unset, and must match it when set
        codis_product_name => CODIS_PRODUCT_NAME;
    }
);

group!(
    /// How to reach etcd.
    EtcdVars ("etcd") {
        /// comma-separated `host:port` of the etcd that holds this addon's locks and primary fences
        etcd_endpoints => ETCD_ENDPOINTS;
    }
);

group!(
    /// How to reach pika.
    PikaVars ("Pika") {
        /// pika port [default: 9221]
        pika_port => PIKA_PORT;
        /// pika `requirepass`, if set (never printed)
        pika_password => PIKA_PASSWORD, hide_env_values;
        /// overrides where a server address really is: `<fqdn>:<port>=<host>:<port>,...`, for pika servers and codis-proxy
        /// admin APIs (port-forwards, tests)
        pika_address_overrides => PIKA_ADDRESS_OVERRIDES;
    }
);

group!(
    /// The Cluster object.
    ClusterVars ("Cluster") {
        /// the Cluster object's name
        cluster_name => CLUSTER_NAME;
        /// the Cluster object's namespace
        cluster_namespace => CLUSTER_NAMESPACE;
    }
);

group!(
    /// The shard this action runs in.
    ShardVars ("Shard") {
        /// this shard's full component name, `<cluster>-<sharding>-<id>`
        shard_name => SHARD_NAME;
        /// this shard's pod FQDNs, comma-separated
        shard_pod_fqdns => SHARD_POD_FQDNS;
    }
);

group!(
    /// Every shard of the cluster.
    AllShardsVars ("All shards") {
        /// every shard's pod FQDNs: `<sharding>-<id>:<fqdn>,<fqdn>;<sharding>-<id>:...`
        all_shards_pod_fqdns => ALL_SHARDS_POD_FQDNS;
    }
);

group!(
    /// How the run itself behaves.
    RunVars ("Run") {
        /// seconds one run may work before it stops, reports progress and exits 75 [default: 50]
        action_budget_seconds => ACTION_BUDGET_SECONDS;
        /// directory of event templates that replace the built-in ones
        action_templates_dir => ACTION_TEMPLATES_DIR;
        /// log format on stderr: `text` or `json` [default: text]
        log_format => LOG_FORMAT;
        /// KubeBlocks line, `1.0` or `1.1` (1.1 and later); detected from the KB_CLUSTER_COMPONENT_* variables when unset
        kubeblocks_line => KUBEBLOCKS_LINE;
    }
);

group!(
    /// KubeBlocks 1.0.x legacy component variables.
    LegacyVars ("KubeBlocks 1.0.x") {
        /// 1.0.x: the cluster's component names, comma-separated
        kb_cluster_component_list => KB_CLUSTER_COMPONENT_LIST;
        /// 1.0.x: components being deleted, comma-separated
        kb_cluster_component_deleting_list => KB_CLUSTER_COMPONENT_DELETING_LIST;
        /// 1.0.x: components not being deleted, comma-separated
        kb_cluster_component_undeleted_list => KB_CLUSTER_COMPONENT_UNDELETED_LIST;
    }
);

group!(
    /// 1.0.x preTerminate's scaling-in flag.
    ScalingInVars ("KubeBlocks 1.0.x preTerminate") {
        /// 1.0.x preTerminate: `true` when the number of shards decreased (drain), otherwise cluster deletion
        kb_cluster_component_is_scaling_in => KB_CLUSTER_COMPONENT_IS_SCALING_IN;
    }
);

group!(
    /// shardAdd's variable.
    AddShardVars ("shardAdd") {
        /// the added shard's full name `<cluster>-<sharding>-<id>`
        kb_add_shard_name => KB_ADD_SHARD_NAME;
    }
);

group!(
    /// shardRemove's variable.
    RemoveShardVars ("shardRemove") {
        /// the removed shard's full name `<cluster>-<sharding>-<id>`
        kb_remove_shard_name => KB_REMOVE_SHARD_NAME;
    }
);

group!(
    /// memberJoin's variables.
    JoinVars ("memberJoin") {
        /// the new pod's name
        kb_join_member_pod_name => KB_JOIN_MEMBER_POD_NAME;
        /// the new pod's FQDN
        kb_join_member_pod_fqdn => KB_JOIN_MEMBER_POD_FQDN;
    }
);

group!(
    /// memberLeave's variables.
    LeaveVars ("memberLeave") {
        /// the leaving pod's name
        kb_leave_member_pod_name => KB_LEAVE_MEMBER_POD_NAME;
        /// the leaving pod's FQDN
        kb_leave_member_pod_fqdn => KB_LEAVE_MEMBER_POD_FQDN;
    }
);

group!(
    /// switchover's variables.
    SwitchoverVars ("switchover") {
        /// the pod about to be restarted or removed
        kb_switchover_current_name => KB_SWITCHOVER_CURRENT_NAME;
        /// its FQDN
        kb_switchover_current_fqdn => KB_SWITCHOVER_CURRENT_FQDN;
        /// its role label as KubeBlocks saw it (informational; Codis decides)
        kb_switchover_role => KB_SWITCHOVER_ROLE;
        /// OpsRequest only: the pod to make master
        kb_switchover_candidate_name => KB_SWITCHOVER_CANDIDATE_NAME;
        /// OpsRequest only: its FQDN
        kb_switchover_candidate_fqdn => KB_SWITCHOVER_CANDIDATE_FQDN;
    }
);

group!(
    /// Where the Kubernetes API is, when not the in-cluster one.
    KubeVars ("Kubernetes") {
        /// plain-http URL of a Kubernetes API proxy such as `kubectl proxy` (e.g. `http://127.0.0.1:8001`), read
        /// instead of the pod's service account; unauthenticated, so never point it at a real API server's port.
        /// Unset: the in-cluster API when the pod has one, else none (switchover: the ordinal rule decides;
        /// pre-terminate on 1.1: Codis' state decides whether the cluster is going; post-provision on 1.0: the
        /// Cluster's shard count is not known; shard-remove: only the shards recorded as leaving are known to go)
        kube_api_url => KUBE_API_URL;
    }
);

group!(
    /// role-probe's target.
    ProbeVars ("roleProbe") {
        /// the local pika's host [default: 127.0.0.1]
        pika_host => PIKA_HOST;
    }
);

group!(
    /// The pod `rejoin` runs in.
    PodVars ("This pod") {
        /// this pod's name (the pika container sets it from `metadata.name`)
        pod_name => POD_NAME;
        /// the local pika's config file, whose `slaveof` is set before pika starts [default: /data/pika.conf]
        pika_config_file => PIKA_CONFIG_FILE;
        /// pika's data directory: absent or empty means this pod came back on an empty volume [default: the
        /// config file's `db-path`, relative to the file's directory]
        pika_data_dir => PIKA_DATA_DIR;
    }
);

group!(
    /// The pod `pre-stop` runs in.
    PreStopVars ("pre-stop (the pika container's preStop hook)") {
        /// this pod's name (the pika container sets it from `metadata.name`)
        pod_name => POD_NAME;
        /// seconds the hand-over may take; the pod's termination grace period must leave pika's own shutdown room
        /// above it [default: 20]
        pre_stop_budget_seconds => PRE_STOP_BUDGET_SECONDS;
    }
);

group!(
    /// The failover watcher's settings.
    WatchVars ("Failover watcher") {
        /// how long a master must fail every probe (no answer, refused, timed out) before it is failed over, in
        /// milliseconds; a master answering every probe within half of this (the probe deadline) is never failed
        /// over [default: 2000]
        failover_detection_ms => FAILOVER_DETECTION_MS;
        /// how often each group's master is probed (`INFO replication`), in milliseconds [default: 500]
        watch_probe_interval_ms => WATCH_PROBE_INTERVAL_MS;
        /// TTL of the etcd lease that elects the one acting watcher, in seconds; a dead leader is replaced within
        /// about this [default: 5]
        watch_lease_seconds => WATCH_LEASE_SECONDS;
        /// this watcher's pod (the container sets it from `metadata.name`); names the leader in etcd and logs
        pod_name => POD_NAME;
    }
);
