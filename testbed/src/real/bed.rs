//! A cluster of real servers as KubeBlocks would describe it: shards of pika pods (each its own network namespace,
//! reached by its FQDN), real etcd, the fork's dashboard and a proxy; pika-action runs with the environment of the
//! chart and resolves names as in the cluster, with no address overrides.
//!
//! Names differ from what a production chart renders (cluster `rp<n>`, sharding `pk`, namespace `ns-rp`) so that a
//! test cannot pass on a hard-coded production name.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::codis::{Dashboard, Proxy, Topology};
use super::network::Network;
use super::pika::{PikaPod, ReplicaState, PIKA_PORT};
use super::Servers;
use crate::cluster::eventually;
use crate::process::EtcdServer;

/// The namespace of every real-bed cluster.
pub const NAMESPACE: &str = "ns-rp";
/// Shards and pods a bed has room for: shard `s` has the namespace slots `s * MAX_ORDINALS ..` for its pods.
const MAX_SHARDS: usize = 24;
const MAX_ORDINALS: u32 = 8;

static BEDS: AtomicUsize = AtomicUsize::new(0);

/// The KubeBlocks line a bed's actions run as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Line {
    /// KubeBlocks 1.0.x: component actions with the legacy component list.
    V1_0,
    /// KubeBlocks 1.1+: ShardingDefinition actions.
    V1_1,
}

/// One shard: a pika component.
#[derive(Debug)]
pub struct RealShard {
    /// `<sharding>-<id>`.
    pub short: String,
    /// `<cluster>-<sharding>-<id>`.
    pub full: String,
    /// Its pods, by ordinal.
    pub pods: Vec<PikaPod>,
    /// Its block of pod addresses in the bed's /24 (a deleted shard's block is taken again).
    index: usize,
    /// Where in its block the next pod's address is looked for: a pod added after one was deleted gets another
    /// address, as a new Kubernetes pod usually does (a pod reusing a gone pod's address is not modelled).
    next_slot: usize,
}

impl RealShard {
    /// Comma-separated FQDNs (SHARD_POD_FQDNS).
    #[must_use]
    pub fn fqdns(&self) -> String {
        self.pods.iter().map(|p| p.fqdn.clone()).collect::<Vec<_>>().join(",")
    }

    /// The pod with `ordinal`.
    ///
    /// # Panics
    /// When there is none.
    #[must_use]
    pub fn pod(&self, ordinal: u32) -> &PikaPod {
        self.pods.iter().find(|p| p.ordinal == ordinal).expect("no such pod")
    }

    /// The pod with `ordinal`, to kill or restart.
    ///
    /// # Panics
    /// When there is none.
    pub fn pod_mut(&mut self, ordinal: u32) -> &mut PikaPod {
        self.pods.iter_mut().find(|p| p.ordinal == ordinal).expect("no such pod")
    }
}

/// What a [`RealBed`] starts with.
#[derive(Debug, Clone)]
pub struct RealBedOptions {
    /// Shards at the start.
    pub shards: usize,
    /// Pods per shard.
    pub pods: u32,
    /// The KubeBlocks line of the actions.
    pub line: Line,
    /// Proxies.
    pub proxies: usize,
    /// dashboard.toml settings (TOML values) in place of the chart's: to show what a setting the chart decided
    /// against would do.
    pub dashboard_settings: Vec<(&'static str, &'static str)>,
    /// proxy.toml settings (TOML values) in place of the chart's, for the same reason.
    pub proxy_settings: Vec<(&'static str, &'static str)>,
    /// The slot count in place of the chart's 1024, the same in every server (the dashboard's and proxies'
    /// `max_slot_num`, pika's `default-slot-num`), as Codis requires. Fewer slots only make fewer migrations of each
    /// rebalance and drain: what runs per slot is the same. `None`: the chart's.
    pub slots: Option<u16>,
    /// The Codis double in fork mode as the dashboard, with these options (the bed sets its product, password,
    /// slot count, address and the pods' and proxies' addresses), in place of the fork's: for what the fork cannot
    /// be made to do on demand.
    pub double: Option<crate::DoubleOptions>,
}

impl Default for RealBedOptions {
    fn default() -> Self {
        Self {
            shards: 1,
            pods: 1,
            line: Line::V1_1,
            proxies: 1,
            dashboard_settings: Vec::new(),
            proxy_settings: Vec::new(),
            slots: None,
            double: None,
        }
    }
}

/// A cluster of real servers. Fields drop in order: pods, proxies, dashboard, etcd, and last the network, which
/// removes every namespace, link and file the bed made.
#[derive(Debug)]
pub struct RealBed {
    /// The Cluster name (also the Codis product).
    pub name: String,
    /// The shards.
    pub shards: Vec<RealShard>,
    /// Online proxies.
    pub proxies: Vec<Proxy>,
    /// The dashboard.
    pub dashboard: Dashboard,
    /// etcd.
    pub etcd: EtcdServer,
    /// requirepass = masterauth = product_auth = session_auth.
    pub password: String,
    /// The line the actions run as.
    pub line: Line,
    servers: Servers,
    action: PathBuf,
    proxy_settings: Vec<(&'static str, &'static str)>,
    slots: Option<u16>,
    next_shard: usize,
    network: Network,
}

/// dashboard.toml or proxy.toml `settings` with the bed's own slot count (`max_slot_num`), if it has one.
fn with_slots<'a>(settings: &[(&'a str, &'a str)], slots: Option<&'a str>) -> Vec<(&'a str, &'a str)> {
    settings.iter().copied().chain(slots.map(|n| ("max_slot_num", n))).collect()
}

fn shard_id(n: usize) -> String {
    // Three characters like KubeBlocks' random shard ids, but deterministic.
    let letters = b"abcdefghijklmnopqrstuvwxyz";
    format!("{}{}z", letters[n % 26] as char, n / 26)
}

impl RealBed {
    /// Starts etcd, the dashboard, `opts.shards` shards of `opts.pods` pods (each by the chart's pika-start.sh, so
    /// each runs `rejoin` first) and the proxies; nothing is registered in Codis yet. `action` is the pika-action
    /// binary.
    ///
    /// # Panics
    /// When a server does not start (with its logs), the real servers are not installed, or the bed's network
    /// cannot be made.
    #[must_use]
    pub fn start(opts: &RealBedOptions, action: &Path) -> Self {
        let servers = Servers::installed();
        let network = Network::lease().unwrap_or_else(|e| panic!("real bed network: {e}"));
        let name = format!("rp{}{}", std::process::id() % 1000, BEDS.fetch_add(1, Ordering::SeqCst));
        let password = format!("bed-secret-{name}");
        let etcd = EtcdServer::start_on(network.node(), || network.node_port());
        let slots = opts.slots.map(|n| n.to_string());
        let dashboard_settings = with_slots(&opts.dashboard_settings, slots.as_deref());
        let dashboard = match &opts.double {
            None => Dashboard::start(&network, &servers, &etcd.endpoint(), &name, &password, &dashboard_settings),
            Some(double) => {
                let opts = crate::DoubleOptions {
                    product: name.clone(),
                    password: Some(password.clone()),
                    fork: true,
                    redis_stand_ins: false,
                    backends_resolve: true,
                    max_slot_num: opts.slots.map_or(1024, usize::from),
                    ..double.clone()
                };
                Dashboard::start_double(&network, opts)
            }
        }
        .unwrap_or_else(|e| panic!("{e}"));
        let mut bed = Self {
            name,
            shards: Vec::new(),
            proxies: Vec::new(),
            dashboard,
            etcd,
            password,
            line: opts.line,
            servers,
            action: action.to_owned(),
            proxy_settings: opts.proxy_settings.clone(),
            slots: opts.slots,
            next_shard: 0,
            network,
        };
        for _ in 0..opts.shards {
            bed.add_shard(opts.pods);
        }
        for _ in 0..opts.proxies {
            bed.add_proxy();
        }
        bed
    }

    /// Starts one more proxy, online at the dashboard.
    ///
    /// # Panics
    /// When it does not start.
    pub fn add_proxy(&mut self) -> &Proxy {
        let slots = self.slots.map(|n| n.to_string());
        let settings = with_slots(&self.proxy_settings, slots.as_deref());
        let mut proxy = Proxy::configured(
            &self.network,
            &self.servers,
            self.dashboard.addr(),
            &self.name,
            &self.password,
            self.proxies.len(),
            &settings,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        if let Some(double) = self.dashboard.double() {
            // The double dials the address the proxy advertises, outside the bed's hosts file.
            double.set_override(proxy.admin_addr(), proxy.admin_listen_addr());
        }
        proxy.spawn(&self.network).unwrap_or_else(|e| panic!("{e}\ndashboard log:\n{}", self.dashboard.log()));
        self.proxies.push(proxy);
        self.proxies.last().expect("just pushed")
    }

    /// Kills proxy `index` with SIGKILL and starts a new process at its addresses, as a container restarted in its
    /// pod (see [`Proxy::restart`]).
    ///
    /// # Panics
    /// When the new one does not come online.
    pub fn restart_proxy(&mut self, index: usize) {
        let proxy = &mut self.proxies[index];
        proxy.restart(&self.network).unwrap_or_else(|e| panic!("{e}\ndashboard log:\n{}", self.dashboard.log()));
    }

    /// Kills proxy `index` with SIGKILL, without its preStop, and starts a new one at its addresses under another
    /// token, as a pod made again on another node: the old entry stays registered at the same address.
    ///
    /// # Panics
    /// When the new one does not come online.
    pub fn replace_proxy_pod(&mut self, index: usize) {
        self.proxies[index].kill();
        self.network.add_dummy_link().unwrap_or_else(|e| panic!("a dummy link: {e}"));
        self.restart_proxy(index);
    }

    /// Strands the connections processes of the root namespace (the watcher, the actions) hold to pod `ordinal` of
    /// shard `index`: they hang with no reset, as after a middlebox dropped them; new connections work
    /// ([`Network::strand_node_connections`]).
    ///
    /// # Panics
    /// When iproute2 refuses.
    pub fn strand_connections_to(&self, index: usize, ordinal: u32) {
        let net = &self.shards[index].pod(ordinal).net;
        self.network.strand_node_connections(net).unwrap_or_else(|e| panic!("strand connections to {}: {e}", net.ns));
    }

    /// How many connections the root namespace holds established to pod `ordinal` of shard `index`'s pika port, from
    /// the node address (those [`RealBed::strand_connections_to`] would strand).
    #[must_use]
    pub fn node_connections_to(&self, index: usize, ordinal: u32) -> usize {
        let pod = self.shards[index].pod(ordinal);
        let to = pod.addr();
        let from = format!("{}:", self.network.node());
        let out = std::process::Command::new("ss").args(["-Htn", "state", "established"]).output().expect("run ss");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() >= 4 && cols[2].starts_with(&from) && cols[3] == to
            })
            .count()
    }

    /// Adds a shard of `pods` pods (started) and returns its index.
    ///
    /// # Panics
    /// When a pod does not start, or the bed has no room for another shard.
    pub fn add_shard(&mut self, pods: u32) -> usize {
        // A new name each time, as KubeBlocks draws one; the addresses of a deleted shard are taken again.
        let slot = (0..MAX_SHARDS).find(|&i| self.shards.iter().all(|s| s.index != i));
        let slot = slot.unwrap_or_else(|| panic!("a real bed has room for {MAX_SHARDS} shards at once"));
        let short = format!("pk-{}", shard_id(self.next_shard));
        let full = format!("{}-{short}", self.name);
        self.shards.push(RealShard { short, full, pods: Vec::new(), index: slot, next_slot: 0 });
        self.next_shard += 1;
        let index = self.shards.len() - 1;
        for _ in 0..pods {
            self.add_pod(index);
        }
        index
    }

    /// Adds a pod to shard `index` (replica scale-out), starts it, and returns its ordinal.
    ///
    /// # Panics
    /// When it does not start.
    pub fn add_pod(&mut self, index: usize) -> u32 {
        let shard = &self.shards[index];
        let ordinal = shard.pods.iter().map(|p| p.ordinal + 1).max().unwrap_or(0);
        assert!(ordinal < MAX_ORDINALS, "a real bed has room for {MAX_ORDINALS} pods per shard");
        let block = shard.index * MAX_ORDINALS as usize;
        let used: Vec<usize> = shard.pods.iter().map(|p| usize::from(p.net.slot)).collect();
        let offset = (0..MAX_ORDINALS as usize)
            .map(|k| (shard.next_slot + k) % MAX_ORDINALS as usize)
            .find(|&o| !used.contains(&(block + o)))
            .expect("a free address in the shard's block");
        self.shards[index].next_slot = offset + 1;
        let shard = &self.shards[index];
        let slot = u8::try_from(block + offset).expect("slot within the /24");
        let name = format!("{}-{ordinal}", shard.full);
        let fqdn = format!("{name}.{}-headless.{NAMESPACE}.svc.cluster.local", shard.full);
        let net = self.network.add_pod(slot).unwrap_or_else(|e| panic!("{name}: {e}"));
        // The fork's binaries and pika resolve through glibc, which reads the hosts file at every lookup.
        self.network.resolve(&fqdn, net.addr).unwrap_or_else(|e| panic!("{e}"));
        let dir = self.network.dir().join("pods").join(&name);
        let pod = PikaPod::new(name, fqdn, ordinal, net, dir, Some(self.password.clone()), self.slots);
        if let Some(double) = self.dashboard.double() {
            // The double runs in this process, outside the bed's hosts file.
            double.set_override(&pod.server(), &pod.addr());
        }
        self.shards[index].pods.push(pod);
        self.start_pod(index, ordinal);
        ordinal
    }

    /// Deletes pod `ordinal` of shard `index` with its volume (a replica scale-in).
    pub fn remove_pod(&mut self, index: usize, ordinal: u32) {
        self.shards[index].pod_mut(ordinal).lose_volume();
        self.shards[index].pods.retain(|p| p.ordinal != ordinal);
    }

    /// Deletes shard `index` with its pods and volumes (a shard scale-in). Later shards keep their names.
    pub fn remove_shard(&mut self, index: usize) {
        for pod in &mut self.shards[index].pods {
            pod.lose_volume();
            self.network.unresolve(&pod.fqdn).unwrap_or_else(|e| panic!("{e}"));
        }
        self.shards.remove(index);
    }

    /// (Re)starts the pika container of pod `ordinal` of shard `index` (stopped first as the kubelet stops a pod, if
    /// it runs), with the environment the chart gives it now.
    ///
    /// # Panics
    /// When it does not start (with its logs).
    pub fn start_pod(&mut self, index: usize, ordinal: u32) {
        self.start_pod_with(index, ordinal, &[]).unwrap_or_else(|e| panic!("{e}"));
    }

    /// [`RealBed::start_pod`] with `extra` variables in the container (a crash point), returning why it did not
    /// serve instead of panicking.
    ///
    /// # Errors
    /// The container exited before pika served (its start log), or pika did not answer.
    pub fn start_pod_with(&mut self, index: usize, ordinal: u32, extra: &[(&str, &str)]) -> Result<(), String> {
        let mut env = self.container_env(index);
        env.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        let (network, servers, action) = (&self.network, &self.servers, &self.action);
        let pod = self.shards[index].pod_mut(ordinal);
        // A restart is a deletion and a recreation: a running pika is stopped as the kubelet stops it.
        pod.stop();
        pod.start(network, servers, action, &env)
    }

    /// The pika container's environment (the component's vars; the container adds its own).
    fn container_env(&self, index: usize) -> BTreeMap<String, String> {
        let mut env = self.env(index);
        env.insert("ACTION_BUDGET_SECONDS".into(), "40".into());
        env
    }

    /// The variables of shard `index`'s actions, on the bed's line (on 1.0 no shard is being deleted).
    #[must_use]
    pub fn env(&self, index: usize) -> BTreeMap<String, String> {
        let shard = &self.shards[index];
        let mut env = BTreeMap::from([
            ("CODIS_DASHBOARD_ADDR".to_owned(), self.dashboard.addr().to_owned()),
            ("ETCD_ENDPOINTS".to_owned(), self.etcd.endpoint()),
            ("CLUSTER_NAME".to_owned(), self.name.clone()),
            ("CLUSTER_NAMESPACE".to_owned(), NAMESPACE.to_owned()),
            ("CODIS_PRODUCT_NAME".to_owned(), self.name.clone()),
            ("PIKA_PORT".to_owned(), PIKA_PORT.to_string()),
            ("PIKA_PASSWORD".to_owned(), self.password.clone()),
            ("SHARD_NAME".to_owned(), shard.full.clone()),
            ("SHARD_POD_FQDNS".to_owned(), shard.fqdns()),
            ("ALL_SHARDS_POD_FQDNS".to_owned(), self.all_shards()),
            ("ACTION_BUDGET_SECONDS".to_owned(), "40".to_owned()),
        ]);
        match self.line {
            Line::V1_1 => {
                env.insert("KUBEBLOCKS_LINE".into(), "1.1".into());
            }
            Line::V1_0 => {
                env.insert("KUBEBLOCKS_LINE".into(), "1.0".into());
                env.extend(self.legacy_env(&[]));
            }
        }
        env
    }

    /// ALL_SHARDS_POD_FQDNS.
    #[must_use]
    pub fn all_shards(&self) -> String {
        self.shards.iter().map(|s| format!("{}:{}", s.short, s.fqdns())).collect::<Vec<_>>().join(";")
    }

    /// The 1.0.x legacy component list variables, with the shards at `deleting` being deleted.
    #[must_use]
    pub fn legacy_env(&self, deleting: &[usize]) -> BTreeMap<String, String> {
        let shards: Vec<&str> = self.shards.iter().map(|s| s.short.as_str()).collect();
        let deleting: Vec<&str> = deleting.iter().map(|&i| self.shards[i].short.as_str()).collect();
        crate::cluster::legacy_component_lists(&shards, &deleting)
    }

    /// Runs `pika-action <args>` as kbagent does (no shell, working directory `/`, exactly `env` plus PATH), with
    /// the bed's names resolving as in the cluster.
    ///
    /// # Panics
    /// When the binary cannot be run.
    #[must_use]
    pub fn run(&self, args: &[&str], env: &BTreeMap<String, String>) -> Output {
        self.action_command(None, args, env).output().expect("run pika-action")
    }

    /// [`RealBed::run`] inside the network namespace of pod `ordinal` of shard `index`, where kbagent runs beside
    /// pika (a probe reaches its pika at 127.0.0.1).
    ///
    /// # Panics
    /// When the binary cannot be run.
    #[must_use]
    pub fn run_in_pod(&self, index: usize, ordinal: u32, args: &[&str], env: &BTreeMap<String, String>) -> Output {
        let ns = self.shards[index].pod(ordinal).net.ns.clone();
        self.action_command(Some(&ns), args, env).output().expect("run pika-action")
    }

    /// `pika-action <args>` as kbagent starts it (no shell, working directory `/`, exactly `env` plus PATH), with
    /// the bed's names resolving as in the cluster, in network namespace `ns` (the root one when `None`).
    fn action_command(&self, ns: Option<&str>, args: &[&str], env: &BTreeMap<String, String>) -> std::process::Command {
        let mut command = self.network.command(ns, &self.action);
        command
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(env)
            .current_dir("/");
        command
    }

    /// Starts the failover watcher (`pika-action watch`) as the chart's container beside the dashboard runs it, with
    /// the chart's default failover values; its output goes to `watcher.log` in the bed's directory. It runs until
    /// the returned [`Watcher`] drops.
    ///
    /// # Panics
    /// When it cannot be started.
    #[must_use]
    pub fn start_watcher(&self) -> Watcher {
        self.start_watcher_with(&[])
    }

    /// [`RealBed::start_watcher`] with `extra` variables besides (`KUBE_API_URL`, say).
    ///
    /// # Panics
    /// When it cannot be started.
    #[must_use]
    pub fn start_watcher_with(&self, extra: &[(&str, &str)]) -> Watcher {
        // values.yaml `failover`: detectionMs 2000, probeIntervalMs 500, leaseSeconds 5.
        let pod = format!("{}-codis-dashboard-0", self.name);
        let mut vars = crate::cluster::watcher_env(&self.env(0), &pod, 2000, 500, 5);
        vars.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        // One log per identity: two watchers may run at once.
        let log = self.network.dir().join(format!("watcher-{}.log", vars.get("POD_NAME").map_or("", String::as_str)));
        let file = std::fs::File::create(&log).expect("the watcher's log");
        let child = self
            .action_command(None, &["watch"], &vars)
            .stdin(std::process::Stdio::null())
            .stdout(file.try_clone().expect("the watcher's log"))
            .stderr(file)
            .spawn()
            .expect("start pika-action watch");
        self.network.started(child.id());
        Watcher { child, log }
    }

    /// The bed's directory: every server's volume, configuration and log lives under it until the bed drops.
    #[must_use]
    pub fn dir(&self) -> &Path {
        self.network.dir()
    }

    /// Every file the bed's servers wrote (pods' volumes, start output and logs; Codis' configs and logs) whose
    /// bytes contain `needle`.
    #[must_use]
    pub fn files_containing(&self, needle: &str) -> Vec<PathBuf> {
        fn walk(dir: &Path, needle: &[u8], found: &mut Vec<PathBuf>) {
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let path = entry.path();
                match entry.file_type() {
                    Ok(t) if t.is_dir() => walk(&path, needle, found),
                    Ok(t) if t.is_file() => {
                        let bytes = std::fs::read(&path).unwrap_or_default();
                        if bytes.windows(needle.len()).any(|w| w == needle) {
                            found.push(path);
                        }
                    }
                    _ => {}
                }
            }
        }
        let mut found = Vec::new();
        walk(self.network.dir(), needle.as_bytes(), &mut found);
        found.sort();
        found
    }

    /// `codis-admin --dashboard=<the dashboard> <args>`.
    ///
    /// # Panics
    /// When it cannot be run.
    #[must_use]
    pub fn codis_admin(&self, args: &[&str]) -> Output {
        std::process::Command::new(&self.servers.admin)
            .arg(format!("--dashboard={}", self.dashboard.addr()))
            .args(args)
            .output()
            .expect("run codis-admin")
    }

    /// The variables of a switchover of shard `index`'s master (the pod Codis lists), as KubeBlocks gives them.
    #[must_use]
    pub fn switchover_env(&self, index: usize) -> BTreeMap<String, String> {
        let current = self.shards[index].pod(self.master_ordinal(index));
        let mut env = self.env(index);
        env.insert("KB_SWITCHOVER_CURRENT_NAME".into(), current.name.clone());
        env.insert("KB_SWITCHOVER_CURRENT_FQDN".into(), current.fqdn.clone());
        env.insert("KB_SWITCHOVER_ROLE".into(), "master".into());
        env
    }

    /// The ordinal of the pod Codis lists as shard `index`'s master.
    ///
    /// # Panics
    /// When Codis lists none of the shard's pods as a group's master.
    #[must_use]
    pub fn master_ordinal(&self, index: usize) -> u32 {
        let topology = self.topology();
        let shard = &self.shards[index];
        let master = topology.group_of(&shard.pods[0].server()).and_then(|g| g.master().map(str::to_owned));
        shard.pods.iter().find(|p| Some(p.server()) == master).map(|p| p.ordinal).expect("the shard's master")
    }

    /// What the dashboard reports now.
    #[must_use]
    pub fn topology(&self) -> Topology {
        self.dashboard.topology()
    }

    /// Asserts what a registered shard must look like: a group with exactly these pods as servers, `master` first,
    /// every other pod replicating it (its link up, `db0:connected`), as the dashboard and the pikas report;
    /// returns the group id.
    ///
    /// # Panics
    /// When it does not look like that within 30 s (replicas may still be in their full sync).
    pub fn assert_registered(&self, index: usize, master_ordinal: u32) -> u32 {
        let shard = &self.shards[index];
        let master = shard.pod(master_ordinal);
        let topology = self.topology();
        let group =
            topology.group_of(&master.server()).unwrap_or_else(|| panic!("{} has no group: {topology:?}", shard.full));
        assert_eq!(group.master(), Some(master.server().as_str()), "{} master in Codis", shard.full);
        let mut listed = group.servers.clone();
        listed.sort();
        let mut expected: Vec<String> = shard.pods.iter().map(PikaPod::server).collect();
        expected.sort();
        assert_eq!(listed, expected, "{} servers in Codis", shard.full);
        assert_eq!(master.role(), "master", "{} role", master.name);
        for pod in shard.pods.iter().filter(|p| p.ordinal != master_ordinal) {
            let mut last = None;
            let ok = eventually(Duration::from_secs(30), || {
                last = ReplicaState::of(&pod.info_replication());
                last.as_ref().is_some_and(|r| {
                    (r.master_host == master.fqdn || r.master_host == master.net.addr.to_string())
                        && r.master_port == PIKA_PORT
                        && r.in_sync()
                })
            });
            assert!(
                ok,
                "{} does not replicate {} in sync: {last:?}\n{}",
                pod.name,
                master.name,
                pod.info_replication()
            );
        }
        group.id
    }

    /// The keys of `expected` (key → value written) that pod `ordinal` of shard `index` does not hold with that
    /// value (read from that pika directly; pika's DBSIZE counts only after a keyspace scan).
    #[must_use]
    pub fn missing_on(&self, index: usize, ordinal: u32, expected: &BTreeMap<String, String>) -> Vec<String> {
        let mut conn = self.shards[index].pod(ordinal).connect();
        expected
            .iter()
            .filter(|(k, v)| conn.command(&["GET", k]).ok().as_deref() != Some(v.as_str()))
            .map(|(k, _)| k.clone())
            .collect()
    }
}

/// A running `pika-action watch`; killed on drop.
#[derive(Debug)]
pub struct Watcher {
    child: std::process::Child,
    log: PathBuf,
}

impl Watcher {
    /// What it logged so far.
    #[must_use]
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether it has exited (a crash point aborts it).
    pub fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL, as a crashed pod: its etcd lease is neither revoked nor renewed.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
