//! The command line: one subcommand per KubeBlocks lifecycle action, each documenting the variables it reads.

use clap::{Args, Parser, Subcommand};

use crate::input::vars::{
    AddShardVars, AllShardsVars, ClusterVars, Collect, DashboardVars, EtcdVars, JoinVars, KubeVars, LeaveVars,
    LegacyVars, PikaVars, PodVars, PreStopVars, ProbeVars, RemoveShardVars, RunVars, ScalingInVars, ShardVars,
    SwitchoverVars, VarMap, WatchVars,
};

/// KubeBlocks lifecycle actions for Pika sharded behind Codis.
///
/// Every input comes from environment variables (the flags mirror them). Exit status: 0 done, 75 budget ran out
/// (run again to resume), 2 invalid input (nothing changed), 1 any other failure.
#[derive(Debug, Parser)]
#[command(name = "pika-action", version)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// A lifecycle action, or a tool for people.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a lifecycle action.
    #[command(flatten)]
    Action(Action),
    /// Print the event the environment produces for an action, without doing anything.
    Render {
        /// The action whose event to print.
        #[command(subcommand)]
        action: Action,
    },
}

macro_rules! action_args {
    ($(#[$doc:meta])* $name:ident { $($group:ident: $ty:ty),* $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Default, Args)]
        pub struct $name {
            $(
                #[allow(missing_docs)]
                #[command(flatten)]
                pub $group: $ty,
            )*
        }
        impl Collect for $name {
            fn collect(&self, into: &mut VarMap) {
                $(self.$group.collect(into);)*
            }
        }
    };
}

action_args!(
    /// Variables of `post-provision`.
    PostProvisionVars { dashboard: DashboardVars, etcd: EtcdVars, pika: PikaVars, cluster: ClusterVars, shard: ShardVars, all: AllShardsVars, legacy: LegacyVars, kube: KubeVars, run: RunVars }
);

/// Arguments of `post-provision`: its variables and whether only this shard is registered.
#[derive(Debug, Clone, Default, Args)]
pub struct PostProvisionArgs {
    /// Register only this shard (SHARD_NAME, SHARD_POD_FQDNS) as a Codis group and move no slot: the component
    /// postProvision of the 1.1 chart, beside the ShardingDefinition's, which registers every shard
    #[arg(long)]
    pub own_shard: bool,
    #[allow(missing_docs)]
    #[command(flatten)]
    pub vars: PostProvisionVars,
}

impl Collect for PostProvisionArgs {
    fn collect(&self, into: &mut VarMap) {
        self.vars.collect(into);
    }
}
action_args!(
    /// Variables of `shard-add`.
    ShardAddArgs { dashboard: DashboardVars, etcd: EtcdVars, pika: PikaVars, cluster: ClusterVars, shard: ShardVars, all: AllShardsVars, add: AddShardVars, run: RunVars }
);
action_args!(
    /// Variables of `shard-remove`.
    ShardRemoveArgs { dashboard: DashboardVars, etcd: EtcdVars, pika: PikaVars, cluster: ClusterVars, shard: ShardVars, all: AllShardsVars, remove: RemoveShardVars, kube: KubeVars, run: RunVars }
);
action_args!(
    /// Variables of `pre-terminate`.
    PreTerminateArgs { dashboard: DashboardVars, etcd: EtcdVars, pika: PikaVars, cluster: ClusterVars, shard: ShardVars, all: AllShardsVars, legacy: LegacyVars, scaling_in: ScalingInVars, kube: KubeVars, run: RunVars }
);
action_args!(
    /// Variables of `member-join`.
    MemberJoinArgs { dashboard: DashboardVars, etcd: EtcdVars, pika: PikaVars, cluster: ClusterVars, shard: ShardVars, join: JoinVars, run: RunVars }
);
action_args!(
    /// Variables of `member-leave`.
    MemberLeaveArgs { dashboard: DashboardVars, etcd: EtcdVars, pika: PikaVars, cluster: ClusterVars, shard: ShardVars, leave: LeaveVars, run: RunVars }
);
action_args!(
    /// Variables of `switchover`.
    SwitchoverArgs { dashboard: DashboardVars, etcd: EtcdVars, pika: PikaVars, cluster: ClusterVars, shard: ShardVars, switchover: SwitchoverVars, kube: KubeVars, run: RunVars }
);
action_args!(
    /// Variables of `role-probe`.
    RoleProbeArgs { probe: ProbeVars, pika: PikaVars, run: RunVars }
);
action_args!(
    /// Variables of `topology`.
    TopologyArgs { dashboard: DashboardVars, etcd: EtcdVars, pika: PikaVars, cluster: ClusterVars, all: AllShardsVars, run: RunVars }
);
action_args!(
    /// Variables of `rejoin`.
    RejoinArgs { dashboard: DashboardVars, etcd: EtcdVars, pika: PikaVars, cluster: ClusterVars, shard: ShardVars, pod: PodVars, kube: KubeVars, run: RunVars }
);
action_args!(
    /// Variables of `pre-stop`.
    PreStopArgs { dashboard: DashboardVars, etcd: EtcdVars, pika: PikaVars, cluster: ClusterVars, shard: ShardVars, pod: PreStopVars, kube: KubeVars, run: RunVars }
);
action_args!(
    /// Variables of `watch`.
    WatchArgs { dashboard: DashboardVars, etcd: EtcdVars, pika: PikaVars, cluster: ClusterVars, watch: WatchVars, kube: KubeVars, run: RunVars }
);

/// The lifecycle actions of the contract.
#[derive(Debug, Clone, Subcommand)]
pub enum Action {
    /// Register every shard in Codis (groups, servers, replication), assign and balance the slots, online proxies.
    PostProvision(PostProvisionArgs),
    /// Register the shard KB_ADD_SHARD_NAME and move slots onto it with the fewest moves (1.1+).
    ShardAdd(ShardAddArgs),
    /// Drain every slot of KB_REMOVE_SHARD_NAME to the other shards, then remove its servers and group (1.1+).
    ShardRemove(ShardRemoveArgs),
    /// A shard's component is being deleted: drain and remove it from Codis when the cluster stays (1.0.x:
    /// KB_CLUSTER_COMPONENT_IS_SCALING_IN=true; 1.1+: the Cluster is not being deleted and the group still holds or
    /// receives slots); nothing on cluster deletion.
    PreTerminate(PreTerminateArgs),
    /// Add the new pod to its shard's Codis group as a replica of the current master.
    MemberJoin(MemberJoinArgs),
    /// Remove the leaving pod from its Codis group, promoting another member first if it is the master.
    MemberLeave(MemberLeaveArgs),
    /// Move mastership away from the pod about to restart or leave (a no-op for a replica).
    Switchover(SwitchoverArgs),
    /// Print `master` or `slave` for the local pika.
    RoleProbe(RoleProbeArgs),
    /// At container start, before pika serves: follow the group's current master; when Codis still lists this pod
    /// as the master, hand mastership to the most advanced live replica first (never start a second master, never
    /// serve an empty group), or refuse to start.
    Rejoin(RejoinArgs),
    /// The pika container's preStop hook, before the kubelet stops pika: when this pod is its group's master, move
    /// mastership to a healthy replica as `switchover` does, within PRE_STOP_BUDGET_SECONDS; nothing for a replica,
    /// or when the Cluster is being deleted.
    PreStop(PreStopArgs),
    /// Long-running (not a lifecycle action): the failover watcher. One elected copy per cluster probes every
    /// group's master and promotes the most advanced replica, fenced in etcd, when a master stops answering for
    /// FAILOVER_DETECTION_MS; runs until SIGTERM. ACTION_BUDGET_SECONDS bounds each failover.
    Watch(WatchArgs),
    /// For people, read-only: each group's master and replicas as Codis and the pikas see them; exit 1 when they
    /// disagree (or a pika cannot be asked), 0 when every group is consistent.
    Topology(TopologyArgs),
}

impl Action {
    /// The action's name as KubeBlocks knows it (kebab-case), which also names its template.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Self::PostProvision(_) => "post-provision",
            Self::ShardAdd(_) => "shard-add",
            Self::ShardRemove(_) => "shard-remove",
            Self::PreTerminate(_) => "pre-terminate",
            Self::MemberJoin(_) => "member-join",
            Self::MemberLeave(_) => "member-leave",
            Self::Switchover(_) => "switchover",
            Self::RoleProbe(_) => "role-probe",
            Self::Rejoin(_) => "rejoin",
            Self::PreStop(_) => "pre-stop",
            Self::Topology(_) => "topology",
            Self::Watch(_) => "watch",
        }
    }

    /// The command-line options given (by name without `--`), which templates read with `option(name=...)`.
    #[must_use]
    pub fn options(&self) -> Vec<&'static str> {
        match self {
            Self::PostProvision(a) if a.own_shard => vec!["own-shard"],
            _ => Vec::new(),
        }
    }

    /// The variables this action was given.
    #[must_use]
    pub fn vars(&self) -> VarMap {
        let mut map = VarMap::new();
        match self {
            Self::PostProvision(a) => a.collect(&mut map),
            Self::ShardAdd(a) => a.collect(&mut map),
            Self::ShardRemove(a) => a.collect(&mut map),
            Self::PreTerminate(a) => a.collect(&mut map),
            Self::MemberJoin(a) => a.collect(&mut map),
            Self::MemberLeave(a) => a.collect(&mut map),
            Self::Switchover(a) => a.collect(&mut map),
            Self::RoleProbe(a) => a.collect(&mut map),
            Self::Rejoin(a) => a.collect(&mut map),
            Self::PreStop(a) => a.collect(&mut map),
            Self::Topology(a) => a.collect(&mut map),
            Self::Watch(a) => a.collect(&mut map),
        }
        map
    }
}
