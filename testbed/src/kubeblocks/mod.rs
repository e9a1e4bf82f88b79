//! A chart-driven emulation of KubeBlocks, for end-to-end tests of `pika-action`: it takes the Helm-rendered addon
//! and cluster charts and does with them what each KubeBlocks line does, running the real binary for every action
//! the chart declares, over real etcd, real redis-servers (one per pod) and the Codis double.
//!
//! Two lines, each emulated from its source (apecloud/kubeblocks):
//!
//! | | [`Line::V1_0`]: tag v1.0.2 (release-1.0 head is the same) | [`Line::V1_1`]: release-1.1 (main where it agrees) |
//! |---|---|---|
//! | definitions | refused without `kubeblocks.io/crd-api-version` | same |
//! | `requireAllComponentObjects` | exact count of the spec's components | fails only when fewer exist |
//! | ShardingDefinition actions | never run | postProvision, shardAdd, shardRemove as `udf-sharding*` on `pods[0]` |
//! | a shard removed before its shardAdd succeeded | – | deleted without shardRemove |
//! | component postProvision / preTerminate env | vars + legacy `KB_CLUSTER_*` lists | vars only |
//! | role probe output | trimmed, lower-cased | `<role>` or `<role> <uint64>` |
//! | retries | postProvision 5 s (preCondition 10 s), preTerminate backoff, members 1 s | same, sharding actions backoff |
//!
//! On both: vars resolved per call ([`vars`]), actions exec'd with the environment and timeout kbagent gives them
//! ([`kbagent`]), switchover failures ignored in rolling updates and scale-ins (an OpsRequest fails instead), the
//! Serial rolling update in role-priority order ([`instanceset`]), scale-in as switchover → memberLeave → delete,
//! memberJoin for scaled-out replicas only, topology orders for creation and deletion ([`controller`]).
//!
//! What stands in for the parts that cannot run here:
//! - a **pod** is a real redis-server on a loopback port with its own data directory; its FQDN
//!   `<cluster>-<comp>-<ordinal>.<cluster>-<comp>-headless.<ns>.svc.cluster.local:<pika port>` is mapped to that
//!   port in the Codis double and in `PIKA_ADDRESS_OVERRIDES` (a test-only variable); inside the pod,
//!   `127.0.0.1:<PIKA_PORT>` is its own server, so the role probe gets `PIKA_PORT` set to the real port; the data
//!   volume mount is the server's directory and `pika.conf` there is the server's `redis.conf`;
//! - the **components whose workloads are not pika** are stand-ins: etcd is one real etcd, codis-dashboard the
//!   Codis double (product = cluster name, `product_auth` = its system account's password), codis-proxy one proxy
//!   double per replica (its RESP data port routes to the pods; [`KubeBlocks::proxy_data_addrs`]), onlined on start
//!   and removed on deletion as the chart's scripts do, codis-fe nothing; their own lifecycle actions are not run;
//! - the **cluster network**: a var resolving to a Service address (`<svc>:<port>`) reaches the process rewritten to
//!   the loopback address of the stand-in serving it;
//! - the **API server** is a minimal plain-HTTP one ([`api`]) at `KUBE_API_URL` (a test-only variable).
//!
//! With [`Options::real_servers`] the stand-ins give way to the servers the addon ships ([`crate::real`]): each pod
//! is a real pika v4.0.1 in its own network namespace (a volume directory kept across recreations, its pika stopped
//! on deletion with SIGTERM and a 30 s grace period, as the kubelet stops it; the pika
//! container is the chart's `pika-start.sh`, which runs `rejoin` and execs pika, restarted with CrashLoopBackOff
//! while it fails), etcd listens on the bed's node address, codis-dashboard and codis-proxy are the fork's, and
//! every action and role probe runs in its pod's namespace (kbagent's place) with the cluster's names resolving and
//! no `PIKA_ADDRESS_OVERRIDES`; the API server listens on the node address. Not modelled there: codis-proxy's
//! preStop script (a deleted proxy is stopped, not removed from the dashboard first), codis-fe.
//!
//! Time: controller waits run [`retry::TIME_SCALE`] times faster than real time; actions run at real speed (see
//! [`retry`]). Operations wait for their end state up to a real-time deadline, a hang detector, and then fail with
//! a diagnosis of what is stuck ([`Stuck`]).
//!
//! Does NOT model (beyond each module's list): OpsRequest objects and their validation (operations patch specs
//! directly), other operations (vertical scaling, reconfiguration, backup, upgrade), multiple controller
//! workers per kind, the Addon CR, kbcli.

pub mod api;
pub mod chart;
pub mod controller;
pub mod instanceset;
pub mod kbagent;
pub mod legacy;
pub mod retry;
pub mod sharding;
pub mod vars;
pub mod world;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{CodisDouble, RedisServer};
use chart::Addon;
use controller::{Backing, Inner, Settings};
use world::{ActionRecord, ClusterObj, Key, Phase, Warning, World};

/// A KubeBlocks line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Line {
    /// 1.0.x (v1.0.2).
    V1_0,
    /// 1.1 and later (release-1.1, main).
    V1_1,
}

impl Line {
    /// The addon chart's `kubeblocksLine` value for this line.
    pub fn chart_value(self) -> &'static str {
        match self {
            Line::V1_0 => "1.0",
            Line::V1_1 => "1.1",
        }
    }

    /// Both lines.
    pub fn all() -> [Line; 2] {
        [Line::V1_0, Line::V1_1]
    }
}

/// How to start an emulation.
#[derive(Debug, Clone)]
pub struct Options {
    /// The line emulated.
    pub line: Line,
    /// The line the addon chart is rendered for (`kubeblocksLine`); the emulated line by default.
    pub chart_line: Line,
    /// The `pika-action` binary.
    pub binary: PathBuf,
    /// The addon chart directory.
    pub addon_chart: PathBuf,
    /// The cluster chart directory.
    pub cluster_chart: PathBuf,
    /// Cluster name (the cluster chart's release name).
    pub cluster: String,
    /// Namespace.
    pub namespace: String,
    /// Test-only: chart var values replaced after resolution (e.g. a shorter `ACTION_BUDGET_SECONDS`).
    pub var_overrides: BTreeMap<String, String>,
    /// Seed of every random choice; from `KBEMU_SEED`, else the clock.
    pub seed: Option<u64>,
    /// The Codis double's executor tick.
    pub codis_tick: Duration,
    /// Ticks a slot spends `migrating` in the double (default 1).
    pub migration_ticks: Option<u32>,
    /// How long (real time) an operation may take before it counts as hung.
    pub deadline: Duration,
    /// Emulated seconds per real second for controller waits (`KBEMU_TIME_SCALE`, default [`retry::TIME_SCALE`]).
    pub time_scale: u32,
    /// Print what happens to stderr (`KBEMU_VERBOSE=1`).
    pub verbose: bool,
    /// Run the real servers the addon ships instead of the stand-ins ([`crate::real`]): pika v4.0.1 pods in their
    /// own network namespaces started by the chart's `pika-start.sh`, the fork's dashboard and proxies; actions and
    /// probes run in their pod's namespace with no address override.
    pub real_servers: bool,
}

/// The deadline of an operation unless set otherwise (real time): a hang detector, generous on a loaded machine.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(120);

impl Options {
    /// Defaults for `line` running `binary`, with this repository's charts (`KBEMU_ADDON_CHART` and
    /// `KBEMU_CLUSTER_CHART` point at other chart directories, e.g. a chart under development).
    pub fn new(line: Line, binary: impl Into<PathBuf>) -> Options {
        let dir = |var: &str, name: &str| std::env::var_os(var).map_or_else(|| chart::repo_chart(name), PathBuf::from);
        Options {
            line,
            chart_line: line,
            binary: binary.into(),
            addon_chart: dir("KBEMU_ADDON_CHART", "addon"),
            cluster_chart: dir("KBEMU_CLUSTER_CHART", "clusterdefs"),
            cluster: "kbemu".into(),
            namespace: "ns-kbemu".into(),
            var_overrides: BTreeMap::new(),
            seed: std::env::var("KBEMU_SEED").ok().and_then(|s| s.parse().ok()),
            codis_tick: Duration::from_millis(10),
            migration_ticks: None,
            deadline: DEFAULT_DEADLINE,
            time_scale: std::env::var("KBEMU_TIME_SCALE")
                .ok()
                .and_then(|v| v.parse().ok())
                .filter(|s| *s > 0)
                .unwrap_or(retry::TIME_SCALE),
            verbose: std::env::var("KBEMU_VERBOSE").is_ok_and(|v| !v.is_empty() && v != "0"),
            real_servers: false,
        }
    }
}

/// An operation that did not reach its end state: what KubeBlocks would still be doing.
#[derive(Debug, Clone)]
pub struct Stuck {
    /// The end state waited for.
    pub what: String,
    /// Real time waited.
    pub waited: Duration,
    /// Why: the emulation's state, the last errors and actions.
    pub diagnosis: String,
}

impl std::fmt::Display for Stuck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} not reached after {:.0?}: {}", self.what, self.waited, self.diagnosis)
    }
}

impl std::error::Error for Stuck {}

/// A pod as tests see it.
#[derive(Debug, Clone)]
pub struct PodInfo {
    /// Name.
    pub name: String,
    /// Ordinal.
    pub ordinal: u32,
    /// `<fqdn>:<port>` as registered in Codis.
    pub server: String,
    /// Its role label.
    pub role: Option<String>,
    /// Ready.
    pub ready: bool,
    /// The loopback port of its redis-server.
    pub port: u16,
}

/// A shard as tests see it.
#[derive(Debug, Clone)]
pub struct ShardInfo {
    /// Short name.
    pub short: String,
    /// Full name.
    pub full: String,
    /// Being deleted.
    pub deleting: bool,
    /// Its pods, by ordinal.
    pub pods: Vec<PodInfo>,
}

/// A running emulation; dropping it stops every process it started.
pub struct KubeBlocks {
    inner: Arc<Inner>,
    api: api::ApiServer,
    opts: Options,
}

impl std::fmt::Debug for KubeBlocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeBlocks").field("line", &self.opts.line).field("api", &self.api).finish_non_exhaustive()
    }
}

struct ApiView(std::sync::Weak<Inner>);

impl api::Backend for ApiView {
    fn get(&self, path: &[&str], query: &BTreeMap<String, String>) -> Option<Value> {
        self.0.upgrade()?.w().api_get(path, query)
    }

    fn event(&self, _namespace: &str, event: Value) {
        if let Some(inner) = self.0.upgrade() {
            inner.w().events.push(event);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl KubeBlocks {
    /// Installs the addon chart (rendered by real Helm) into a fresh emulation of `opts.line`.
    pub fn install(opts: Options) -> Result<KubeBlocks, String> {
        let addon = Addon::render(&opts.addon_chart, opts.chart_line.chart_value()).map_err(|e| e.to_string())?;
        let seed = opts.seed.unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
        });
        eprintln!(
            "kbemu: KubeBlocks {} emulation, chart for {}, seed {seed} (KBEMU_SEED replays it)",
            opts.line.chart_value(),
            opts.chart_line.chart_value()
        );
        controller::REPORT_HOLDS.store(opts.verbose, Ordering::Relaxed);
        let settings = Settings {
            line: opts.line,
            binary: opts.binary.clone(),
            var_overrides: opts.var_overrides.clone(),
            cluster_domain: "cluster.local".into(),
            codis_tick: opts.codis_tick,
            migration_ticks: opts.migration_ticks,
            verbose: opts.verbose,
        };
        let inner = Arc::new(Inner {
            settings,
            addon,
            clock: retry::Clock::new(opts.time_scale),
            world: Mutex::new(World::default()),
            cv: Condvar::new(),
            stop: std::sync::atomic::AtomicBool::new(false),
            backing: Mutex::new(Backing::default()),
            volumes: Mutex::new(BTreeMap::new()),
            servers: Mutex::new(BTreeMap::new()),
            proxy_admins: Mutex::new(BTreeMap::new()),
            rng: Mutex::new(sharding::Rng::new(seed)),
            next_suffixes: Mutex::new(Vec::new()),
            api_url: Mutex::new(String::new()),
            threads: Mutex::new(Vec::new()),
            pikas: Mutex::new(BTreeMap::new()),
            pod_slots: Mutex::new(BTreeMap::new()),
            real: if opts.real_servers {
                Some(controller::RealServers {
                    servers: crate::real::Servers::installed(),
                    network: crate::real::network::Network::lease()?,
                })
            } else {
                None
            },
        });
        let view = Arc::new(ApiView(Arc::downgrade(&inner)));
        let api = match &inner.real {
            // Pods reach it from their own namespaces, at the node address.
            Some(real) => api::ApiServer::start_at(view, real.network.node()),
            None => api::ApiServer::start(view),
        }
        .map_err(|e| e.to_string())?;
        *lock(&inner.api_url) = api.url().to_owned();
        Ok(KubeBlocks { inner, api, opts })
    }

    /// The emulated line.
    pub fn line(&self) -> Line {
        self.opts.line
    }

    /// The clock.
    pub fn clock(&self) -> &retry::Clock {
        &self.inner.clock
    }

    /// The rendered addon.
    pub fn addon(&self) -> &Addon {
        &self.inner.addon
    }

    /// Reads the world.
    pub fn view<T>(&self, f: impl FnOnce(&World) -> T) -> T {
        f(&self.inner.w())
    }

    /// Creates the cluster the cluster chart renders for `shards` shards of `replicas` pods and waits until it is
    /// Running (on 1.1 with its sharding postProvision done).
    pub fn create_cluster(&self, shards: u32, replicas: u32) -> Result<Duration, Stuck> {
        let started = Instant::now();
        self.request_cluster(shards, replicas)?;
        self.wait_for(&format!("cluster created with {shards} shard(s) of {replicas}"), self.opts.deadline, |w| {
            w.cluster.as_ref().is_some_and(|c| c.phase == "Running")
        })
        .map(|_| started.elapsed())
    }

    /// Creates the cluster without waiting for it.
    pub fn request_cluster(&self, shards: u32, replicas: u32) -> Result<(), Stuck> {
        let rendered =
            chart::render_cluster(&self.opts.cluster_chart, &self.opts.cluster, &self.opts.namespace, shards, replicas)
                .map_err(|e| self.stuck("the cluster chart rendered", Duration::ZERO, &e.to_string()))?;
        let unavailable = self.inner.addon.unavailable();
        {
            let mut w = self.inner.w();
            if !unavailable.is_empty() {
                let list = unavailable
                    .iter()
                    .map(|(k, n, v)| {
                        format!(
                            "{k} {n} ({})",
                            v.as_deref().map_or("no kubeblocks.io/crd-api-version annotation".to_owned(), |v| format!(
                                "kubeblocks.io/crd-api-version {v:?}"
                            ))
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                w.fatal = Some(format!(
                    "KubeBlocks never reconciles {list}: they never become Available, and the Cluster fails validation"
                ));
            }
            let serial = w.next_serial();
            w.cluster = Some(ClusterObj {
                name: rendered.metadata.name.clone(),
                namespace: rendered.metadata.namespace.clone().unwrap_or_else(|| self.opts.namespace.clone()),
                uid: format!("c1a57e40-0000-4000-8000-{serial:012x}"),
                spec: rendered.spec,
                generation: 1,
                deleting: false,
                phase: "Creating".into(),
                sharding_post_provision: BTreeMap::new(),
                sharding_pre_terminate: BTreeMap::new(),
            });
            self.inner.spawn_worker(&mut w, Key::Cluster);
        }
        self.inner.notify();
        Ok(())
    }

    fn patch_cluster(&self, f: impl FnOnce(&mut ClusterObj)) {
        let mut w = self.inner.w();
        if let Some(c) = w.cluster.as_mut() {
            f(c);
            c.generation += 1;
            if c.phase == "Running" {
                c.phase = "Updating".into();
            }
        }
        w.touch(&Key::Cluster);
        drop(w);
        self.inner.notify();
    }

    /// Sets the sharding's `shards` (what an OpsRequest HorizontalScaling with `shards` does), without waiting.
    pub fn request_shards(&self, shards: u32) {
        self.patch_cluster(|c| {
            if let Some(s) = c.spec.shardings.first_mut() {
                s.shards = shards;
            }
        });
    }

    /// The next new shards get these suffixes (`<sharding>-<suffix>`) instead of random ones: a test choosing one of
    /// KubeBlocks' possible draws, e.g. `zzz` to make a new shard the one a scale-in removes (the last in order).
    pub fn choose_next_shard_suffixes(&self, suffixes: &[&str]) {
        *lock(&self.inner.next_suffixes) = suffixes.iter().map(|s| (*s).to_owned()).collect();
    }

    /// Sets the sharding's `shards` (what an OpsRequest HorizontalScaling with `shards` does) and waits until exactly
    /// that many shards exist, none being deleted, and the cluster is Running.
    pub fn scale_shards(&self, shards: u32) -> Result<Duration, Stuck> {
        self.request_shards(shards);
        let sharding = self.sharding_name();
        self.wait_for(&format!("scaled to {shards} shard(s)"), self.opts.deadline, |w| {
            let shards_now = w.shards_of(&sharding);
            shards_now.len() == shards as usize
                && shards_now.iter().all(|c| !c.deleting)
                && w.cluster.as_ref().is_some_and(|c| c.phase == "Running")
        })
    }

    /// Sets the shards' `replicas` and waits until every shard has that many pods and the cluster is Running.
    pub fn scale_replicas(&self, replicas: u32) -> Result<Duration, Stuck> {
        self.patch_cluster(|c| {
            if let Some(s) = c.spec.shardings.first_mut() {
                s.template.replicas = replicas;
            }
        });
        let sharding = self.sharding_name();
        self.wait_for(&format!("scaled to {replicas} replica(s) per shard"), self.opts.deadline, |w| {
            w.shards_of(&sharding).iter().all(|c| w.pods_of(&c.full).len() == replicas as usize)
                && w.cluster.as_ref().is_some_and(|c| c.phase == "Running")
        })
    }

    /// A rolling restart of every shard (an OpsRequest Restart): a new template revision, every pod recreated.
    pub fn rolling_restart(&self) -> Result<Duration, Stuck> {
        let sharding = self.sharding_name();
        {
            let mut w = self.inner.w();
            let comps: Vec<String> = w.shards_of(&sharding).iter().map(|c| c.full.clone()).collect();
            for full in comps {
                if let Some(c) = w.components.get_mut(&full) {
                    c.restarts += 1;
                }
                w.touch(&Key::Component(full));
            }
        }
        self.inner.notify();
        self.wait_for("every pod restarted", self.opts.deadline, |w| {
            w.shards_of(&sharding).iter().all(|c| {
                w.instance_sets.get(&c.full).is_some_and(|its| {
                    its.revision == c.restarts + 1
                        && its.current_revision == its.revision
                        && w.pods_of(&c.full).iter().all(|p| p.revision == its.revision && p.ready && p.role.is_some())
                })
            }) && w.shards_of(&sharding).iter().all(|c| c.phase == Phase::Running)
        })
    }

    /// A Switchover OpsRequest of `instance` to `candidate` in shard `shard` (full name): runs the action once (a
    /// failure fails the request) and waits until the candidate holds the instance's role.
    pub fn switchover(&self, shard: &str, instance: &str, candidate: &str) -> Result<Duration, Stuck> {
        let started = Instant::now();
        let role = self.inner.ops_switchover(shard, instance, candidate).map_err(|e| {
            self.stuck("the Switchover OpsRequest", started.elapsed(), &format!("OpsRequest Failed: {e}"))
        })?;
        let candidate = candidate.to_owned();
        self.wait_for(&format!("{candidate} labelled {role}"), self.opts.deadline, move |w| {
            w.pods.get(&candidate).is_some_and(|p| p.role.as_deref() == Some(role.as_str()))
        })
        .map(|d| d + started.elapsed())
    }

    /// A pod lost with its volume (its node and PVC gone): killed at once, with no action and no hook run (a failed
    /// node runs none), its data dropped; the InstanceSet controller recreates it on an empty volume. Waits until it
    /// is ready and labelled with a role again.
    pub fn lose_pod_volume(&self, pod: &str) -> Result<Duration, Stuck> {
        self.replace_pod_volume(pod, false)
    }

    /// A pod deleted with its PVC (`kubectl delete pvc,pod`): stopped as the kubelet stops it (the chart's preStop
    /// hook, SIGTERM), its data dropped; the InstanceSet controller recreates it on an empty volume. KubeBlocks runs
    /// no action for a deletion it did not make. Waits until it is ready and labelled with a role again.
    pub fn delete_pod_with_volume(&self, pod: &str) -> Result<Duration, Stuck> {
        self.replace_pod_volume(pod, true)
    }

    fn replace_pod_volume(&self, pod: &str, graceful: bool) -> Result<Duration, Stuck> {
        let started = Instant::now();
        if !self.inner.w().pods.contains_key(pod) {
            return Err(self.stuck(&format!("pod {pod} lost"), Duration::ZERO, "no such pod"));
        }
        if graceful {
            self.inner.delete_pod(pod, true);
        } else {
            self.inner.lose_pod(pod);
        }
        let pod = pod.to_owned();
        self.wait_for(&format!("{pod} back on an empty volume"), self.opts.deadline, move |w| {
            w.pods.get(&pod).is_some_and(|p| p.ready && p.role.is_some())
        })
        .map(|d| d + started.elapsed())
    }

    /// Deletes the cluster and waits until it is gone.
    pub fn delete_cluster(&self) -> Result<Duration, Stuck> {
        {
            let mut w = self.inner.w();
            if let Some(c) = w.cluster.as_mut() {
                c.deleting = true;
            }
            w.touch(&Key::Cluster);
        }
        self.inner.notify();
        self.wait_for("cluster deleted", self.opts.deadline, |w| w.cluster.is_none())
    }

    /// Waits (real time, up to `deadline`) until `done` holds; a fatal condition fails at once.
    pub fn wait_for(&self, what: &str, deadline: Duration, done: impl Fn(&World) -> bool) -> Result<Duration, Stuck> {
        let started = Instant::now();
        loop {
            {
                let w = self.inner.w();
                if done(&w) {
                    return Ok(started.elapsed());
                }
                if let Some(fatal) = w.fatal.clone() {
                    drop(w);
                    return Err(self.stuck(what, started.elapsed(), &fatal));
                }
                let hopeless =
                    w.keys.iter().find_map(|(k, st)| st.never_progresses().map(|f| (k.clone(), f.to_owned())));
                if let Some((key, failure)) = hopeless {
                    drop(w);
                    let why = format!(
                        "hung: {key:?} failed {} times in a row with the same error, which KubeBlocks would retry \
                         forever: {failure}",
                        world::HOPELESS_STREAK
                    );
                    return Err(self.stuck(what, started.elapsed(), &why));
                }
            }
            if started.elapsed() > deadline {
                return Err(self.stuck(
                    what,
                    started.elapsed(),
                    "hung: KubeBlocks would keep waiting (see the state below)",
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn stuck(&self, what: &str, waited: Duration, why: &str) -> Stuck {
        Stuck { what: what.to_owned(), waited, diagnosis: format!("{why}\n{}", self.diagnosis()) }
    }

    fn sharding_name(&self) -> String {
        self.inner
            .w()
            .cluster
            .as_ref()
            .and_then(|c| c.spec.shardings.first().map(|s| s.name.clone()))
            .unwrap_or_default()
    }

    /// The shards as they are now, by name.
    pub fn shards(&self) -> Vec<ShardInfo> {
        let sharding = self.sharding_name();
        let servers = lock(&self.inner.servers).clone();
        let w = self.inner.w();
        w.shards_of(&sharding)
            .into_iter()
            .map(|c| ShardInfo {
                short: c.short.clone(),
                full: c.full.clone(),
                deleting: c.deleting,
                pods: w
                    .pods_of(&c.full)
                    .into_iter()
                    .map(|p| PodInfo {
                        name: p.name.clone(),
                        ordinal: p.ordinal,
                        server: servers.get(&p.name).map(|s| s.0.clone()).unwrap_or_default(),
                        role: p.role.clone(),
                        ready: p.ready,
                        port: servers
                            .get(&p.name)
                            .and_then(|s| s.1.rsplit_once(':').and_then(|(_, port)| port.parse().ok()))
                            .unwrap_or(0),
                    })
                    .collect(),
            })
            .collect()
    }

    /// The Codis group of each shard (by short name), found by its first pod's server; shards Codis does not list,
    /// or all of them before codis-dashboard exists, are left out.
    pub fn groups_by_shard(&self) -> BTreeMap<String, u32> {
        let Some(codis) = self.codis() else { return BTreeMap::new() };
        let snap = codis.snapshot();
        self.shards()
            .iter()
            .filter_map(|s| {
                let server = &s.pods.first()?.server;
                snap.server(server).map(|(g, _)| (s.short.clone(), g.id))
            })
            .collect()
    }

    /// `<fqdn>:<port>` → `127.0.0.1:<port>` of every pod that has a volume.
    pub fn server_addresses(&self) -> BTreeMap<String, String> {
        lock(&self.inner.servers).values().cloned().collect()
    }

    /// The redis-server of a pod (its volume), if it has one.
    pub fn redis(&self, pod: &str) -> Option<Arc<Mutex<RedisServer>>> {
        lock(&self.inner.volumes).get(pod).cloned()
    }

    /// The Codis dashboard double, once codis-dashboard exists.
    pub fn codis(&self) -> Option<Arc<CodisDouble>> {
        lock(&self.inner.backing).codis.clone()
    }

    /// The data ports of the codis-proxy stand-ins, or of the real proxies (where clients write), once codis-proxy
    /// exists.
    pub fn proxy_data_addrs(&self) -> Vec<String> {
        let backing = lock(&self.inner.backing);
        backing
            .proxies
            .iter()
            .map(|(_, p)| p.data_addr())
            .chain(backing.real_proxies.iter().map(|p| p.data_addr().to_owned()))
            .collect()
    }

    /// With real servers: the fork's dashboard, once codis-dashboard exists.
    pub fn dashboard(&self) -> Option<Arc<crate::real::codis::Dashboard>> {
        lock(&self.inner.backing).dashboard.clone()
    }

    /// With real servers: the pika of a pod (its volume), if it has one.
    pub fn pika(&self, pod: &str) -> Option<Arc<Mutex<crate::real::pika::PikaPod>>> {
        lock(&self.inner.pikas).get(pod).cloned()
    }

    /// The etcd endpoint, once etcd exists.
    pub fn etcd_endpoint(&self) -> Option<String> {
        lock(&self.inner.backing).etcd.as_ref().map(crate::EtcdServer::endpoint)
    }

    /// The password of the cluster (codis-dashboard's system account), once it exists.
    pub fn password(&self) -> Option<String> {
        self.inner
            .w()
            .components
            .values()
            .find(|c| c.short == "codis-dashboard")
            .and_then(|c| c.accounts.values().next().cloned())
    }

    /// Every action run so far.
    pub fn actions(&self) -> Vec<ActionRecord> {
        self.inner.w().actions.clone()
    }

    /// KubeBlocks' warning events so far.
    pub fn warnings(&self) -> Vec<Warning> {
        self.inner.w().warnings.clone()
    }

    /// Events the binary posted.
    pub fn events(&self) -> Vec<Value> {
        self.inner.w().events.clone()
    }

    /// Requests the API server served.
    pub fn api_requests(&self) -> Vec<api::Request> {
        self.api.requests()
    }

    /// The emulation's state in a few lines: the cluster, each component with its workqueue, pods, the last actions.
    pub fn diagnosis(&self) -> String {
        let w = self.inner.w();
        let now = self.inner.clock.now();
        let mut out = String::new();
        if let Some(fatal) = &w.fatal {
            out.push_str(&format!("fatal: {fatal}\n"));
        }
        match &w.cluster {
            Some(c) => out.push_str(&format!(
                "cluster {} phase {} deleting {} sharding postProvision {:?}; emulated time {:.0?} (x{})\n",
                c.name,
                c.phase,
                c.deleting,
                c.sharding_post_provision,
                now,
                self.inner.clock.scale()
            )),
            None => out.push_str("cluster: gone\n"),
        }
        for (key, st) in &w.keys {
            let name = match key {
                Key::Cluster => "cluster controller".to_owned(),
                Key::Component(c) => {
                    let comp = w.components.get(c);
                    format!(
                        "component {c} [{}{}] {:?}",
                        comp.map_or("?", |c| c.phase.as_str()),
                        if comp.is_some_and(|c| c.deleting) { ", deleting" } else { "" },
                        comp.map(|c| c.annotations.keys().collect::<Vec<_>>()).unwrap_or_default()
                    )
                }
                Key::InstanceSet(i) => format!("instanceset {i}"),
            };
            out.push_str(&format!(
                "  {name}: {} reconciles, {} failures in a row, next {}, last {}",
                st.reconciles,
                st.backoff.failures(),
                st.due.map_or("on change".to_owned(), |d| format!("in {:.1?}", d.saturating_sub(now))),
                st.last_next
            ));
            if let Some((at, e)) = &st.last_error {
                out.push_str(&format!("; last error at {at:.0?}: {}", truncate(e, 400)));
            }
            out.push('\n');
        }
        for p in w.pods.values() {
            out.push_str(&format!(
                "  pod {} rev {} ready {} role {:?}{}\n",
                p.name,
                p.revision,
                p.ready,
                p.role,
                if p.terminating { " terminating" } else { "" }
            ));
        }
        out.push_str("  last actions:\n");
        for a in w.actions.iter().rev().take(12).collect::<Vec<_>>().into_iter().rev() {
            out.push_str(&format!(
                "    {:.0?} {} on {}: {:?} {}\n",
                a.at,
                a.action,
                a.pod,
                a.code,
                truncate(a.result.as_ref().err().map_or("", String::as_str), 300)
            ));
        }
        out
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.len() <= n {
        return s.replace('\n', " | ");
    }
    let mut end = n;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", s[..end].replace('\n', " | "))
}

impl Drop for KubeBlocks {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        self.inner.notify();
        let threads: Vec<_> = lock(&self.inner.threads).drain(..).collect();
        for t in threads {
            let _ = t.join();
        }
        // Threads may have started more threads while stopping.
        let threads: Vec<_> = lock(&self.inner.threads).drain(..).collect();
        for t in threads {
            let _ = t.join();
        }
        lock(&self.inner.volumes).clear();
        lock(&self.inner.pikas).clear();
        let mut backing = lock(&self.inner.backing);
        backing.proxies.clear();
        backing.real_proxies.clear();
        backing.dashboard = None;
        backing.codis = None;
        backing.etcd = None;
    }
}

/// The cluster's component phases by full name (for tests' messages).
pub fn phases(w: &World) -> BTreeMap<String, Phase> {
    w.components.iter().map(|(k, c)| (k.clone(), c.phase)).collect()
}
