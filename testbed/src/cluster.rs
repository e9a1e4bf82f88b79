//! A fixture Pika cluster as KubeBlocks would describe it, over the test bed: every pod is a real redis-server on
//! loopback, registered in Codis under its pod FQDN and reached through `PIKA_ADDRESS_OVERRIDES`, with a real etcd
//! and the Codis double. Used by pika-action's integration tests and by the demo.
//!
//! Names differ from what a production chart renders (cluster `tb<n>`, sharding `pk`, namespace `ns-tb`) so that a
//! test can never pass by accident on a hard-coded production name.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::{CodisDouble, DoubleOptions, EtcdServer, ProxyDouble, ProxyOptions, RedisServer};

/// The pika port every server is registered with (what the chart's PIKA_PORT says).
pub const PIKA_PORT: u16 = 9221;
/// The namespace of every fixture cluster.
pub const NAMESPACE: &str = "ns-tb";

static CLUSTERS: AtomicUsize = AtomicUsize::new(0);

/// One pod: its names and the redis-server standing in for its pika.
#[derive(Debug)]
pub struct PodFixture {
    /// `<cluster>-<sharding>-<id>-<ordinal>`.
    pub name: String,
    /// Its FQDN.
    pub fqdn: String,
    /// Its ordinal.
    pub ordinal: u32,
    /// The server standing in for pika.
    pub redis: RedisServer,
}

impl PodFixture {
    /// `<fqdn>:9221`, the address Codis knows it by.
    pub fn server(&self) -> String {
        format!("{}:{PIKA_PORT}", self.fqdn)
    }
}

/// One shard: a pika component.
#[derive(Debug)]
pub struct ShardFixture {
    /// `<sharding>-<id>`.
    pub short: String,
    /// `<cluster>-<sharding>-<id>`.
    pub full: String,
    /// Its pods, by ordinal.
    pub pods: Vec<PodFixture>,
}

impl ShardFixture {
    /// Comma-separated FQDNs (SHARD_POD_FQDNS).
    pub fn fqdns(&self) -> String {
        self.pods.iter().map(|p| p.fqdn.clone()).collect::<Vec<_>>().join(",")
    }

    /// The pod with `ordinal`.
    pub fn pod(&self, ordinal: u32) -> &PodFixture {
        self.pods.iter().find(|p| p.ordinal == ordinal).expect("no such pod")
    }
}

/// What a [`ClusterFixture`] is built with; unset, one shard of one pod whose redis-servers need no password.
#[derive(Debug, Clone)]
pub struct ClusterBuilder {
    shards: usize,
    pods: usize,
    password: Option<String>,
}

impl Default for ClusterBuilder {
    fn default() -> Self {
        Self { shards: 1, pods: 1, password: None }
    }
}

impl ClusterBuilder {
    /// How many shards.
    #[must_use]
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = shards;
        self
    }

    /// How many pods each shard has.
    #[must_use]
    pub fn pods(mut self, pods: usize) -> Self {
        self.pods = pods;
        self
    }

    /// The password every redis-server requires.
    #[must_use]
    pub fn password(mut self, password: &str) -> Self {
        self.password = Some(password.to_owned());
        self
    }

    /// Starts etcd and the redis-servers; nothing is registered anywhere yet.
    #[must_use]
    pub fn build(self) -> ClusterFixture {
        let n = CLUSTERS.fetch_add(1, Ordering::SeqCst);
        let mut cluster = ClusterFixture {
            name: format!("tb{}{n}", std::process::id() % 1000),
            shards: Vec::new(),
            etcd: EtcdServer::start(),
            password: self.password,
            next_shard: 0,
        };
        for _ in 0..self.shards {
            cluster.add_shard(self.pods);
        }
        cluster
    }

    /// The fixture wired to a Codis double started with `double` (the overrides are filled in).
    #[must_use]
    pub fn bed(self, double: DoubleOptions) -> Bed {
        Bed::with(self.build(), double)
    }

    /// The fixture wired to a Codis double that behaves as upstream Codis does.
    #[must_use]
    pub fn bed_default(self) -> Bed {
        self.bed(DoubleOptions::default())
    }
}

/// A fixture cluster: shards of redis-servers plus the etcd; Codis is added by the caller.
#[derive(Debug)]
pub struct ClusterFixture {
    /// The Cluster name.
    pub name: String,
    /// The shards.
    pub shards: Vec<ShardFixture>,
    /// etcd.
    pub etcd: EtcdServer,
    /// Password of every redis-server, if any.
    pub password: Option<String>,
    next_shard: usize,
}

impl ClusterFixture {
    /// How to build a fixture: `ClusterFixture::builder().shards(3).pods(2).build()`.
    #[must_use]
    pub fn builder() -> ClusterBuilder {
        ClusterBuilder::default()
    }

    /// Adds a shard of `pods` pods (its redis-servers start now) and returns its index.
    pub fn add_shard(&mut self, pods: usize) -> usize {
        let id = shard_id(self.next_shard);
        self.next_shard += 1;
        let short = format!("pk-{id}");
        let full = format!("{}-{short}", self.name);
        self.shards.push(ShardFixture { short, full, pods: Vec::new() });
        let index = self.shards.len() - 1;
        for _ in 0..pods {
            self.add_pod(index);
        }
        index
    }

    /// Adds a pod to shard `index` (replica scale-out) and returns its ordinal.
    pub fn add_pod(&mut self, index: usize) -> u32 {
        let password = self.password.clone();
        let shard = &mut self.shards[index];
        let ordinal = shard.pods.iter().map(|p| p.ordinal + 1).max().unwrap_or(0);
        let name = format!("{}-{ordinal}", shard.full);
        let fqdn = format!("{name}.{}-headless.{NAMESPACE}.svc.cluster.local", shard.full);
        shard.pods.push(PodFixture { name, fqdn, ordinal, redis: RedisServer::start_with(password.as_deref()) });
        ordinal
    }

    /// Every pod's `<fqdn>:9221` → `127.0.0.1:<port>`.
    pub fn overrides(&self) -> BTreeMap<String, String> {
        self.shards.iter().flat_map(|s| &s.pods).map(|p| (p.server(), p.redis.addr())).collect()
    }

    /// ALL_SHARDS_POD_FQDNS for the given shards.
    pub fn all_shards_of(&self, shards: &[usize]) -> String {
        shards
            .iter()
            .map(|&i| format!("{}:{}", self.shards[i].short, self.shards[i].fqdns()))
            .collect::<Vec<_>>()
            .join(";")
    }

    /// ALL_SHARDS_POD_FQDNS for every shard.
    pub fn all_shards(&self) -> String {
        self.all_shards_of(&(0..self.shards.len()).collect::<Vec<_>>())
    }

    /// The variables every Codis-facing action gets, for shard `index`.
    pub fn env(&self, dashboard: &str, index: usize) -> BTreeMap<String, String> {
        let shard = &self.shards[index];
        let overrides = self.overrides().into_iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
        let mut env = BTreeMap::from([
            ("CODIS_DASHBOARD_ADDR".to_owned(), dashboard.to_owned()),
            ("ETCD_ENDPOINTS".to_owned(), self.etcd.endpoint()),
            ("CLUSTER_NAME".to_owned(), self.name.clone()),
            ("CLUSTER_NAMESPACE".to_owned(), NAMESPACE.to_owned()),
            ("PIKA_PORT".to_owned(), PIKA_PORT.to_string()),
            ("PIKA_ADDRESS_OVERRIDES".to_owned(), overrides),
            ("SHARD_NAME".to_owned(), shard.full.clone()),
            ("SHARD_POD_FQDNS".to_owned(), shard.fqdns()),
            ("ALL_SHARDS_POD_FQDNS".to_owned(), self.all_shards()),
            ("ACTION_BUDGET_SECONDS".to_owned(), "40".to_owned()),
        ]);
        if let Some(p) = &self.password {
            env.insert("PIKA_PASSWORD".to_owned(), p.clone());
        }
        env
    }

    /// The 1.0.x legacy component list variables, for every shard plus the other components.
    pub fn legacy_env(&self, deleting: &[usize]) -> BTreeMap<String, String> {
        let shards: Vec<&str> = self.shards.iter().map(|s| s.short.as_str()).collect();
        let deleting: Vec<&str> = deleting.iter().map(|&i| self.shards[i].short.as_str()).collect();
        legacy_component_lists(&shards, &deleting)
    }
}

/// The 1.0.x legacy component list variables of a cluster whose shards (short names) are `shards`, `deleting`
/// among them being deleted, beside the chart's other components.
#[must_use]
pub fn legacy_component_lists(shards: &[&str], deleting: &[&str]) -> BTreeMap<String, String> {
    let mut all = vec!["etcd", "codis-dashboard"];
    all.extend_from_slice(shards);
    all.extend(["codis-proxy", "codis-fe"]);
    let undeleted: Vec<&str> = all.iter().copied().filter(|c| !deleting.contains(c)).collect();
    BTreeMap::from([
        ("KB_CLUSTER_COMPONENT_LIST".to_owned(), all.join(",")),
        ("KB_CLUSTER_COMPONENT_DELETING_LIST".to_owned(), deleting.join(",")),
        ("KB_CLUSTER_COMPONENT_UNDELETED_LIST".to_owned(), undeleted.join(",")),
    ])
}

fn shard_id(n: usize) -> String {
    // Three characters like KubeBlocks' random shard ids, but deterministic.
    let letters = b"abcdefghijklmnopqrstuvwxyz";
    format!("{}{}z", letters[n % 26] as char, n / 26)
}

/// The environment of `pika-action watch` (the failover watcher beside the dashboard) named `pod`, from a shard
/// action's environment `action_env`: the variables it shares with the actions, then the watcher's own.
#[must_use]
pub fn watcher_env(
    action_env: &BTreeMap<String, String>,
    pod: &str,
    detection_ms: u64,
    probe_interval_ms: u64,
    lease_seconds: u64,
) -> BTreeMap<String, String> {
    let shared = [
        "CODIS_DASHBOARD_ADDR",
        "CODIS_PRODUCT_NAME",
        "ETCD_ENDPOINTS",
        "CLUSTER_NAME",
        "CLUSTER_NAMESPACE",
        "PIKA_PORT",
        "PIKA_PASSWORD",
        "PIKA_ADDRESS_OVERRIDES",
        "KUBEBLOCKS_LINE",
    ];
    let mut env: BTreeMap<String, String> =
        shared.iter().filter_map(|k| action_env.get(*k).map(|v| ((*k).to_owned(), v.clone()))).collect();
    env.insert("FAILOVER_DETECTION_MS".into(), detection_ms.to_string());
    env.insert("WATCH_PROBE_INTERVAL_MS".into(), probe_interval_ms.to_string());
    env.insert("WATCH_LEASE_SECONDS".into(), lease_seconds.to_string());
    env.insert("POD_NAME".into(), pod.to_owned());
    env.insert("ACTION_BUDGET_SECONDS".into(), "30".into());
    env
}

/// Polls `cond` every 50 ms until it holds or `timeout` passes.
pub fn eventually(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A fixture cluster wired to a Codis double: what every topology test starts from.
pub struct Bed {
    /// The pods, shards and etcd.
    pub cluster: ClusterFixture,
    /// The Codis dashboard double.
    pub codis: CodisDouble,
}

impl std::fmt::Debug for Bed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bed").field("cluster", &self.cluster.name).field("codis", &self.codis.addr()).finish()
    }
}

impl Bed {
    /// How to build a bed: `Bed::builder().shards(3).pods(2).bed_default()`, or `.bed(DoubleOptions { .. })`.
    #[must_use]
    pub fn builder() -> ClusterBuilder {
        ClusterBuilder::default()
    }

    /// From a fixture and double options (the overrides are filled in here).
    pub fn with(cluster: ClusterFixture, mut opts: DoubleOptions) -> Self {
        opts.overrides.extend(cluster.overrides());
        opts.password = cluster.password.clone();
        opts.product = format!("{}-codis", cluster.name);
        let codis = CodisDouble::start(opts);
        Self { cluster, codis }
    }

    /// Adds a shard of `pods` pods and tells the double where they are; returns its index.
    pub fn add_shard(&mut self, pods: usize) -> usize {
        let index = self.cluster.add_shard(pods);
        self.tell_double();
        index
    }

    /// Adds a pod to shard `index` and tells the double where it is; returns its ordinal.
    pub fn add_pod(&mut self, index: usize) -> u32 {
        let ordinal = self.cluster.add_pod(index);
        self.tell_double();
        ordinal
    }

    fn tell_double(&self) {
        for (server, real) in self.cluster.overrides() {
            self.codis.set_override(&server, &real);
        }
    }

    /// Starts a codis-proxy of this cluster and brings it online in the double, as `codis-proxy --dashboard` does,
    /// so that a test can write through [`ProxyDouble::data_addr`] while the topology changes.
    pub fn start_proxy(&self) -> ProxyDouble {
        let proxy = ProxyDouble::start_with(ProxyOptions {
            auth: self.cluster.password.clone().unwrap_or_default(),
            overrides: self.cluster.overrides(),
            max_slot_num: self.codis.options().max_slot_num,
            ..ProxyOptions::new(&self.codis.options().product)
        });
        let reply = self.codis.call("PUT", &format!("/api/topom/proxy/online/{{xauth}}/{}", proxy.admin_addr()));
        assert!(reply.is_ok(), "codis-proxy could not come online: {reply:?}");
        proxy
    }

    /// The environment of shard `index`'s actions, on KubeBlocks 1.1+.
    pub fn env(&self, index: usize) -> BTreeMap<String, String> {
        let mut env = self.cluster.env(&self.codis.addr(), index);
        env.insert("KUBEBLOCKS_LINE".into(), "1.1".into());
        env
    }

    /// The environment of shard `index`'s component actions on KubeBlocks 1.0.x.
    pub fn env_v1_0(&self, index: usize, deleting: &[usize]) -> BTreeMap<String, String> {
        let mut env = self.cluster.env(&self.codis.addr(), index);
        env.extend(self.cluster.legacy_env(deleting));
        env
    }

    /// The group id Codis has for shard `index`, found by its servers.
    pub fn gid(&self, index: usize) -> Option<u32> {
        let snap = self.codis.snapshot();
        let server = self.cluster.shards[index].pods[0].server();
        snap.server(&server).map(|(g, _)| g.id)
    }

    /// Asserts what a registered shard must look like: a group with exactly these pods as servers, `master` at
    /// index 0, every other pod replicating it with the link up, as both Codis and the redis-servers report.
    pub fn assert_registered(&self, index: usize, master_ordinal: u32) {
        let shard = &self.cluster.shards[index];
        let gid = self.gid(index).unwrap_or_else(|| panic!("{} has no group", shard.full));
        let snap = self.codis.snapshot();
        let group = snap.group(gid).unwrap();
        let master = shard.pod(master_ordinal);
        assert_eq!(group.master(), Some(master.server().as_str()), "{} master", shard.full);
        let mut listed: Vec<&str> = group.servers.iter().map(|s| s.server.as_str()).collect();
        listed.sort_unstable();
        let mut expected: Vec<String> = shard.pods.iter().map(PodFixture::server).collect();
        expected.sort();
        assert_eq!(listed, expected, "{} servers", shard.full);
        assert_eq!(master.redis.role(), "master", "{} master role", master.name);
        for pod in shard.pods.iter().filter(|p| p.ordinal != master_ordinal) {
            let ok = eventually(Duration::from_secs(10), || {
                pod.redis.master().is_some_and(|(h, p, up)| h == "127.0.0.1" && p == master.redis.port() && up)
            });
            assert!(ok, "{} does not replicate {} with link up: {:?}", pod.name, master.name, pod.redis.master());
        }
    }

    /// Asserts that every slot is owned by one of `gids`, none migrating, sizes within one of each other; returns
    /// the sizes.
    pub fn assert_balanced(&self, gids: &[u32]) -> BTreeMap<u32, usize> {
        let snap = self.codis.snapshot();
        assert!(snap.with_action().is_empty(), "slots still migrating");
        let mut sizes: BTreeMap<u32, usize> = gids.iter().map(|&g| (g, 0)).collect();
        for slot in &snap.slots {
            *sizes
                .get_mut(&slot.group_id)
                .unwrap_or_else(|| panic!("slot {} is in group {}", slot.id, slot.group_id)) += 1;
        }
        let max = sizes.values().max().copied().unwrap_or(0);
        let min = sizes.values().min().copied().unwrap_or(0);
        assert!(max - min <= 1, "unbalanced: {sizes:?}");
        assert_eq!(sizes.values().sum::<usize>(), snap.slots.len());
        sizes
    }

    /// Slot → owning group, as Codis has it now.
    pub fn owners(&self) -> Vec<u32> {
        self.codis.snapshot().slots.iter().map(|s| s.group_id).collect()
    }

    /// The mutating requests (PUT) the double received since the last clear.
    pub fn mutations(&self) -> Vec<String> {
        self.codis.requests().into_iter().filter(|r| r.method == "PUT").map(|r| r.path).collect()
    }
}

/// How many slots changed owner between two slot tables (migrations; offline → owned is an assignment).
pub fn moved(before: &[u32], after: &[u32]) -> usize {
    before.iter().zip(after).filter(|(b, a)| **b != 0 && b != a).count()
}

/// The fewest migrations that can balance `before` over `groups`: Σ max(0, current − target) with the larger
/// quotas given to the groups that hold the most.
pub fn minimum_moves(before: &[u32], groups: &[u32]) -> usize {
    let n = before.len();
    let k = groups.len();
    let mut held: Vec<usize> = groups.iter().map(|g| before.iter().filter(|o| *o == g).count()).collect();
    held.sort_unstable_by(|a, b| b.cmp(a));
    let (base, extra) = (n / k, n % k);
    let foreign = before.iter().filter(|o| **o != 0 && !groups.contains(o)).count();
    foreign + held.iter().enumerate().map(|(i, &h)| h.saturating_sub(base + usize::from(i < extra))).sum::<usize>()
}
