//! The controllers: one worker per workqueue key (the cluster, each component, each InstanceSet), pod processes and
//! their role probes, and the stand-ins for the components whose workloads are test-bed processes.
//!
//! Emulated, per line (the facts are in the sibling modules' docs; this is how they are put together):
//! - cluster controller (`controllers/apps/cluster/transformer_cluster_component.go`): components and shardings
//!   created stage by stage in the topology's provision order, each stage once the previous one is Running; updates
//!   in update order; a sharding's shards kept, added or cut ([`super::sharding`]); a removed shard deleted with
//!   `apps.kubeblocks.io/component-scale-in: "true"`; on deletion, stages removed in terminate order, each once the
//!   previous one is gone. 1.0 runs no ShardingDefinition action. 1.1 runs them as `udf-sharding*` actions on
//!   `pods[0]` of the target shard with that shard's vars: postProvision first (scheduled, then run after 3 s; while
//!   it has not succeeded nothing is added, removed or created), shardAdd for a shard created by a scale-out (retried
//!   until it succeeds; the shard is marked until then), shardRemove before a removed shard is deleted (a failure
//!   keeps the shard and is retried) — except for a shard whose shardAdd never succeeded, which is deleted without
//!   it; errors are rate-limited retries of the cluster key;
//! - component controller: var resolution first (an error stops the component); the InstanceSet created or
//!   updated (replicas, template vars, restart revision); replica scale-in: for each removed pod that had joined,
//!   switchover (failure ignored) then memberLeave (failure: retry after 1 s, the pod stays); scale-out: memberJoin for
//!   each new pod once it exists (retry after 1 s); postProvision once the workload exists (its preCondition; 10 s /
//!   5 s requeues), on `pods[0]`; phase Running when the InstanceSet is ready, every pod role-labelled, nothing
//!   pending; deletion: phase Deleting (1 s), preTerminate once if declared and a replica was provisioned
//!   (rate-limited retries), then the workload, then the object;
//! - InstanceSet controller: pods created in parallel, removed when the component lowered `replicas`, and the Serial
//!   rolling update ([`super::instanceset`]) with its switchover whose failure is ignored;
//! - pods: a pod is a real redis-server with its own data directory (its volume, kept across recreations, dropped on
//!   scale-in; the server saves its data there before a recreation stops it, as pika's data survives on its
//!   volume); a start runs what the chart's server container runs before the server (the `"$action" <sub>`
//!   lines of its start script), a failure restarts the container after 10 s doubling to 300 s; it is Ready once
//!   the server answers; kbagent probes its role every `periodSeconds` and the label follows ([`super::instanceset`]).
//!
//! Does NOT model: OpsRequest objects (operations are applied directly to specs), the ClusterReady/ComponentReady
//! status aggregation beyond the phases above, status conditions, PVC/Service/Secret objects (a component's Services
//! and accounts exist with it), the `checkAllCompsUpToDate` short-cut of the cluster controller (it reconciles while
//! anything is pending), controllers restarting, node failures, and the stand-in components' own lifecycle actions.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::chart::{Action, Addon, ComponentDefinition, Container, Topology};
use super::instanceset::{self, PodView, ProbeEffect, UpdateStep};
use super::kbagent::{self, TargetPod};
use super::legacy::{self, LegacyComponent, LegacyPod};
use super::retry::{self, Clock, Next};
use super::sharding::{self, Rng};
use super::vars::{self, ComponentFacts, ResolvedVars, VarContext};
use super::world::{
    ActionPhase, ActionRecord, ClusterObj, CompObj, ItsObj, Key, KeyState, Phase, PodObj, ReplicaStatus, Warning,
    World, POST_PROVISION_DONE, PRE_TERMINATE_DONE, SCALE_IN, SHARD_ADD_PENDING, SKIP_PRE_TERMINATE,
};
use super::Line;
use crate::real::codis::{Dashboard, Proxy};
use crate::real::network::Network;
use crate::real::pika::PikaPod;
use crate::real::Servers;
use crate::{CodisDouble, DoubleOptions, EtcdServer, ProxyDouble, ProxyOptions, RedisServer};

/// The real servers an emulation runs instead of the stand-ins: every pod a real pika in its own network namespace,
/// started by the chart's own `pika-start.sh`; codis-dashboard and codis-proxy the fork's; actions and probes run
/// in their pod's namespace, where names resolve as in the cluster (no address overrides).
pub struct RealServers {
    /// The bed's network (dropped last: it removes the namespaces and whatever still runs in them).
    pub network: Network,
    /// The installed servers.
    pub servers: Servers,
}

/// What an emulation is set up with.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The line emulated.
    pub line: Line,
    /// The pika-action binary every chart command naming `pika-action` runs.
    pub binary: std::path::PathBuf,
    /// Test-only: chart var values replaced after resolution (e.g. `ACTION_BUDGET_SECONDS`).
    pub var_overrides: BTreeMap<String, String>,
    /// The cluster domain of FQDNs.
    pub cluster_domain: String,
    /// The Codis double's executor tick.
    pub codis_tick: Duration,
    /// Ticks each slot spends `migrating` in the double.
    pub migration_ticks: Option<u32>,
    /// Print reconcile errors and actions to stderr as they happen.
    pub verbose: bool,
}

/// The test-bed processes standing in for components.
#[derive(Default)]
pub struct Backing {
    /// etcd.
    pub etcd: Option<EtcdServer>,
    /// The Codis dashboard.
    pub codis: Option<Arc<CodisDouble>>,
    /// Codis proxies: (admin address as registered, double).
    pub proxies: Vec<(String, ProxyDouble)>,
    /// The emulated cluster network: `<service>:<port>` → the address really serving it.
    pub services: BTreeMap<String, String>,
    /// With real servers: the fork's dashboard.
    pub dashboard: Option<Arc<Dashboard>>,
    /// With real servers: the fork's proxies.
    pub real_proxies: Vec<Proxy>,
}

/// The shared state of one emulation.
pub struct Inner {
    /// Settings.
    pub settings: Settings,
    /// The addon chart as KubeBlocks received it.
    pub addon: Addon,
    /// The clock.
    pub clock: Clock,
    /// The API server's objects.
    pub world: Mutex<World>,
    /// Signalled on every change.
    pub cv: std::sync::Condvar,
    /// Set when the emulation shuts down.
    pub stop: AtomicBool,
    /// Stand-in processes.
    pub backing: Mutex<Backing>,
    /// Pod volumes: the redis-server of each pod (by pod name), surviving pod recreation.
    pub volumes: Mutex<BTreeMap<String, Arc<Mutex<RedisServer>>>>,
    /// Pod name → (`<fqdn>:<port>` as registered in Codis, `127.0.0.1:<port>` where its server listens).
    pub servers: Mutex<BTreeMap<String, (String, String)>>,
    /// codis-proxy admin address as registered in Codis (`<fqdn>:<port>`) → where its double listens.
    pub proxy_admins: Mutex<BTreeMap<String, String>>,
    /// Randomness (seeded).
    pub rng: Mutex<Rng>,
    /// Suffixes the next new shards get (tests choosing a draw).
    pub next_suffixes: Mutex<Vec<String>>,
    /// The API server's URL.
    pub api_url: Mutex<String>,
    /// Every thread started.
    pub threads: Mutex<Vec<JoinHandle<()>>>,
    /// With real servers: each pod's pika (by pod name), its volume surviving pod recreation.
    pub pikas: Mutex<BTreeMap<String, Arc<Mutex<PikaPod>>>>,
    /// Pod namespaces handed out (a pod keeps its own across recreations).
    pub pod_slots: Mutex<BTreeMap<String, u8>>,
    /// Real servers instead of stand-ins; declared last, so dropped after every process above.
    pub real: Option<RealServers>,
}

/// The world, locked; reports holds long enough to stall the other controllers.
pub struct WorldGuard<'a> {
    g: MutexGuard<'a, World>,
    at: Instant,
    loc: &'static std::panic::Location<'static>,
}

impl std::ops::Deref for WorldGuard<'_> {
    type Target = World;
    fn deref(&self) -> &World {
        &self.g
    }
}

impl std::ops::DerefMut for WorldGuard<'_> {
    fn deref_mut(&mut self) -> &mut World {
        &mut self.g
    }
}

/// Set from `KBEMU_VERBOSE`: report long holds of the world lock.
pub static REPORT_HOLDS: AtomicBool = AtomicBool::new(false);

impl Drop for WorldGuard<'_> {
    fn drop(&mut self) {
        if REPORT_HOLDS.load(Ordering::Relaxed) && self.at.elapsed() > Duration::from_millis(250) {
            eprintln!("kbemu: world lock held {:?} at {}", self.at.elapsed(), self.loc);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Marker of an unmet preCondition in an error message.
const PRECONDITION_FAILED: &str = "precondition failed";

impl Inner {
    /// The world, locked.
    #[track_caller]
    pub fn w(&self) -> WorldGuard<'_> {
        WorldGuard { g: lock(&self.world), at: Instant::now(), loc: std::panic::Location::caller() }
    }

    /// Wakes every waiter.
    pub fn notify(&self) {
        self.cv.notify_all();
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn log(&self, text: &str) {
        if self.settings.verbose {
            eprintln!("kbemu [{:>8.1}s] {text}", self.clock.now().as_secs_f64());
        }
    }

    fn comp_def(&self, name: &str) -> Option<&ComponentDefinition> {
        self.addon.comp_defs.get(name)
    }

    /// Sleeps an emulated duration (at the scale when it starts), waking early on shutdown.
    fn sleep(&self, emulated: Duration) {
        let end = Instant::now() + self.clock.real(emulated);
        while !self.stopped() {
            let now = Instant::now();
            if now >= end {
                return;
            }
            std::thread::sleep((end - now).min(Duration::from_millis(50)));
        }
    }

    /// Starts a worker for `key` (idempotent).
    pub fn spawn_worker(self: &Arc<Self>, w: &mut World, key: Key) {
        if w.keys.contains_key(&key) {
            if let Some(st) = w.keys.get_mut(&key) {
                st.dirty = true;
            }
            return;
        }
        w.keys.insert(key.clone(), KeyState { dirty: true, ..KeyState::default() });
        let inner = Arc::clone(self);
        let name = format!("kbemu-{key:?}");
        let handle = std::thread::Builder::new().name(name).spawn(move || inner.work(&key)).expect("spawn worker");
        lock(&self.threads).push(handle);
    }

    /// One workqueue worker: waits for a change or a due requeue, reconciles, applies what the reconcile asked for.
    fn work(self: &Arc<Self>, key: &Key) {
        loop {
            {
                let mut w = lock(&self.world);
                loop {
                    if self.stopped() {
                        return;
                    }
                    let now = self.clock.now();
                    let Some(st) = w.keys.get_mut(key) else { return };
                    if st.dirty || st.due.is_some_and(|d| d <= now) {
                        st.dirty = false;
                        st.due = None;
                        st.reconciles += 1;
                        break;
                    }
                    let wait = st.due.map_or(Duration::from_millis(100), |d| self.clock.real(d.saturating_sub(now)));
                    w = self
                        .cv
                        .wait_timeout(w, wait.clamp(Duration::from_millis(1), Duration::from_millis(100)))
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
            }
            let started = Instant::now();
            let next = match key {
                Key::Cluster => self.reconcile_cluster(),
                Key::Component(c) => self.reconcile_component(c),
                Key::InstanceSet(i) => self.reconcile_its(i),
            };
            if started.elapsed() > Duration::from_millis(300) {
                self.log(&format!("slow reconcile of {key:?}: {:?} real -> {next:?}", started.elapsed()));
            }
            let mut w = self.w();
            let now = self.clock.now();
            let Some(next) = next else {
                w.keys.remove(key);
                drop(w);
                self.notify();
                return;
            };
            let mut warning = None;
            if let Some(st) = w.keys.get_mut(key) {
                st.last_next = format!("{next:?}");
                st.note(match &next {
                    Next::Error(e) | Next::Retry(_, e) => Some(e.as_str()),
                    Next::Idle | Next::After(_) => None,
                });
                match &next {
                    Next::Idle => st.backoff.forget(),
                    Next::After(d) => {
                        st.backoff.forget();
                        st.due = Some(now + *d);
                    }
                    Next::Error(e) => {
                        let delay = st.backoff.next_delay();
                        st.due = Some(now + delay);
                        st.last_error = Some((now, e.clone()));
                        warning = Some(e.clone());
                    }
                    Next::Retry(d, e) => {
                        st.backoff.forget();
                        st.due = Some(now + *d);
                        st.last_error = Some((now, e.clone()));
                        self.log(&format!("{key:?}: {e} (retry in {d:?})"));
                    }
                }
            }
            if let Some(message) = warning {
                let object = match key {
                    Key::Cluster => format!("Cluster/{}", w.cluster.as_ref().map_or("", |c| c.name.as_str())),
                    Key::Component(c) => format!("Component/{c}"),
                    Key::InstanceSet(i) => format!("InstanceSet/{i}"),
                };
                self.log(&format!("{object}: {message}"));
                w.warnings.push(Warning { at: now, object, message });
            }
            drop(w);
            self.notify();
        }
    }

    // ---- helpers over the world -------------------------------------------------------------------------------

    fn topology<'a>(&'a self, cluster: &ClusterObj) -> Option<&'a Topology> {
        let def = self.addon.cluster_defs.get(cluster.spec.cluster_def.as_deref()?)?;
        match cluster.spec.topology.as_deref() {
            Some(t) => def.spec.topologies.iter().find(|x| x.name == t),
            None => def.spec.topologies.iter().find(|x| x.default),
        }
    }

    /// `VarContext` for `comp` over the world as it is.
    fn var_context(&self, w: &World, comp: &CompObj) -> VarContext {
        let cluster = w.cluster.as_ref().expect("a cluster");
        let components = w
            .components
            .values()
            .map(|c| {
                let services = self
                    .comp_def(&c.comp_def)
                    .map(|d| {
                        d.spec
                            .services
                            .iter()
                            .map(|s| (s.name.clone(), s.service_name.clone().unwrap_or_default()))
                            .collect()
                    })
                    .unwrap_or_default();
                ComponentFacts {
                    short: c.short.clone(),
                    comp_def: c.comp_def.clone(),
                    replicas: c.replicas,
                    services,
                    accounts: c.accounts.clone(),
                }
            })
            .collect();
        let mut expected = BTreeMap::new();
        if let Some(topology) = self.topology(cluster) {
            for spec in &cluster.spec.component_specs {
                if let Some(def) = topology
                    .components
                    .iter()
                    .find(|t| t.name == spec.name)
                    .and_then(|t| self.addon.resolve_comp_def(t.comp_def.as_deref()?))
                {
                    *expected.entry(def.metadata.name.clone()).or_insert(0) += 1;
                }
            }
            for sh in &cluster.spec.shardings {
                if let Some(def) = self.shard_comp_def(topology, &sh.name) {
                    *expected.entry(def).or_insert(0) += sh.shards;
                }
            }
        }
        VarContext {
            line: self.settings.line,
            namespace: cluster.namespace.clone(),
            cluster: cluster.name.clone(),
            cluster_uid: cluster.uid.clone(),
            cluster_domain: self.settings.cluster_domain.clone(),
            self_short: comp.short.clone(),
            self_comp_def: comp.comp_def.clone(),
            components,
            expected,
        }
    }

    fn shard_comp_def(&self, topology: &Topology, sharding: &str) -> Option<String> {
        let entry = topology.shardings.iter().find(|s| s.name == sharding)?;
        let sdef = self.addon.resolve_sharding_def(entry.sharding_def.as_deref()?)?;
        Some(self.addon.resolve_comp_def(sdef.comp_def_pattern()?)?.metadata.name.clone())
    }

    /// The component's vars now, with the test-only overrides applied.
    fn resolve(&self, w: &World, comp: &CompObj) -> Result<ResolvedVars, String> {
        let def = self.comp_def(&comp.comp_def).ok_or_else(|| format!("no ComponentDefinition {}", comp.comp_def))?;
        let mut resolved = self.var_context(w, comp).resolve(&def.spec.vars)?;
        for (k, v) in &self.settings.var_overrides {
            if resolved.template.contains_key(k) {
                resolved.template.insert(k.clone(), v.clone());
            }
        }
        Ok(resolved)
    }

    /// The component's pods as an unordered listing returns them.
    fn listed_pods(&self, w: &World, comp: &str) -> Vec<TargetPod> {
        let mut pods: Vec<TargetPod> =
            w.pods_of(comp).into_iter().map(|p| TargetPod { name: p.name.clone(), role: p.role.clone() }).collect();
        lock(&self.rng).shuffle(&mut pods);
        pods
    }

    /// The 1.0 legacy variables for `comp`'s postProvision (`terminate` false) or preTerminate.
    fn legacy_env(&self, w: &World, comp: &CompObj, terminate: bool) -> BTreeMap<String, String> {
        let mut comps: Vec<LegacyComponent> = w
            .components
            .values()
            .map(|c| {
                let pods = if c.stand_in {
                    (0..c.replicas)
                        .map(|i| LegacyPod {
                            name: format!("{}-{i}", c.full),
                            ip: format!("10.{}.0.{i}", 200 + c.short.len() % 50),
                            node: format!("node-{i}"),
                            host_ip: format!("192.168.0.{i}"),
                        })
                        .collect()
                } else {
                    let mut pods: Vec<LegacyPod> = w
                        .pods_of(&c.full)
                        .into_iter()
                        .map(|p| LegacyPod {
                            name: p.name.clone(),
                            ip: p.ip.clone(),
                            node: p.node.clone(),
                            host_ip: p.host_ip.clone(),
                        })
                        .collect();
                    lock(&self.rng).shuffle(&mut pods);
                    pods
                };
                LegacyComponent {
                    short: c.short.clone(),
                    deleting: c.deleting,
                    scale_in: c.annotations.get(SCALE_IN).cloned(),
                    pods,
                }
            })
            .collect();
        lock(&self.rng).shuffle(&mut comps);
        legacy::legacy_env(&comps, &comp.short, terminate)
    }

    /// `IsInstancesReady` of the component's InstanceSet (RuntimeReady).
    fn runtime_ready(&self, w: &World, comp: &str) -> bool {
        let Some(its) = w.instance_sets.get(comp) else { return false };
        let pods = w.pods_of(comp);
        let min_ready = self.min_ready(w, comp);
        pods.len() == its.replicas as usize
            && pods.iter().all(|p| p.ready && !p.terminating && p.revision == its.revision)
            && pods.iter().all(|p| self.available(p, min_ready))
    }

    fn min_ready(&self, w: &World, comp: &str) -> Duration {
        let secs = w
            .components
            .get(comp)
            .and_then(|c| self.comp_def(&c.comp_def))
            .and_then(|d| d.spec.min_ready_seconds)
            .unwrap_or(0);
        Duration::from_secs(u64::try_from(secs).unwrap_or(0))
    }

    fn available(&self, pod: &PodObj, min_ready: Duration) -> bool {
        pod.ready && pod.ready_since.is_some_and(|s| self.clock.now().saturating_sub(s) >= min_ready)
    }

    /// The component's pods all ready, available, updated and role-labelled (its part of Running).
    fn workload_running(&self, w: &World, comp: &str) -> bool {
        let roleful =
            w.components.get(comp).and_then(|c| self.comp_def(&c.comp_def)).is_some_and(|d| !d.spec.roles.is_empty());
        self.runtime_ready(w, comp) && (!roleful || w.pods_of(comp).iter().all(|p| p.role.is_some()))
    }

    fn precondition(&self, w: &World, comp: &CompObj, action: &Action, sharding: Option<&str>) -> Result<(), String> {
        let Some(pre) = action.pre_condition.as_deref() else { return Ok(()) };
        let targets: Vec<&CompObj> = match sharding {
            Some(s) => w.shards_of(s),
            None => vec![comp],
        };
        let failed = |what: &str| Err(format!("{PRECONDITION_FAILED}: {what} is not ready"));
        match pre {
            "Immediately" => Ok(()),
            "RuntimeReady" => {
                let its: Vec<&CompObj> =
                    targets.into_iter().filter(|c| w.instance_sets.contains_key(&c.full)).collect();
                if its.is_empty() {
                    return Err(format!("{PRECONDITION_FAILED}: no runtime found"));
                }
                if its.iter().all(|c| self.runtime_ready(w, &c.full)) {
                    Ok(())
                } else {
                    failed("runtime")
                }
            }
            "ComponentReady" => {
                if targets.iter().all(|c| c.phase == Phase::Running) {
                    Ok(())
                } else {
                    failed("component")
                }
            }
            "ClusterReady" => {
                // Sharding actions look for Cluster objects with the sharding label, which carry none.
                if sharding.is_some() {
                    return Err(format!("{PRECONDITION_FAILED}: no cluster found"));
                }
                if w.cluster.as_ref().is_some_and(|c| c.phase == "Running") {
                    Ok(())
                } else {
                    failed("cluster")
                }
            }
            other => Err(format!("unknown precondition type {other}")),
        }
    }

    /// The environment a process in `pod` finally gets: `env` plus the test-only variables, with the emulated
    /// network's service addresses rewritten to where they really are.
    fn deliver(&self, mut env: BTreeMap<String, String>) -> BTreeMap<String, String> {
        let services = lock(&self.backing).services.clone();
        for value in env.values_mut() {
            if value.split(',').any(|t| services.contains_key(t.trim())) {
                *value = value
                    .split(',')
                    .map(|t| services.get(t.trim()).cloned().unwrap_or_else(|| t.to_owned()))
                    .collect::<Vec<_>>()
                    .join(",");
            }
        }
        if self.real.is_none() {
            // The proxies' admin APIs too: a planned switchover holds writes there (pika-action's steps::hold).
            let proxies = lock(&self.proxy_admins).clone();
            let overrides = lock(&self.servers)
                .values()
                .cloned()
                .chain(proxies)
                .map(|(server, addr)| format!("{server}={addr}"))
                .collect::<Vec<_>>()
                .join(",");
            env.insert("PIKA_ADDRESS_OVERRIDES".into(), overrides);
        }
        env.insert("KUBE_API_URL".into(), lock(&self.api_url).clone());
        env
    }

    /// argv with a chart command naming pika-action mapped to the binary under test.
    fn argv(&self, action: &Action) -> Result<Vec<String>, String> {
        let exec = action.exec.as_ref().ok_or("only exec actions are emulated")?;
        let (first, rest) = exec.command.split_first().ok_or("the action has no command")?;
        if std::path::Path::new(first).file_name().and_then(|f| f.to_str()) != Some("pika-action") {
            return Err(format!("the emulation runs pika-action only, not {first}"));
        }
        let mut argv = vec![self.settings.binary.display().to_string()];
        argv.extend(rest.iter().cloned());
        argv.extend(exec.args.iter().cloned());
        Ok(argv)
    }

    /// Runs one action on `pod` of `comp` with `params` (already merged), unlocked; records it.
    fn call(
        &self,
        name: &str,
        comp: &str,
        pod: &str,
        action: &Action,
        params: &BTreeMap<String, String>,
    ) -> Result<String, String> {
        let (agent_env, credentials) = {
            let w = self.w();
            let Some(p) = w.pods.get(pod) else {
                return Err(format!("pod {pod} is unavailable to execute action {name}"));
            };
            let creds: BTreeSet<String> = w
                .components
                .get(comp)
                .and_then(|c| self.resolve(&w, c).ok())
                .map(|r| r.credentials.keys().cloned().collect())
                .unwrap_or_default();
            (p.agent_env.clone(), creds)
        };
        let mut argv = self.argv(action)?;
        if let Some(real) = &self.real {
            // kbagent runs in the pod: its network namespace, names resolving as in the cluster.
            let pika = lock(&self.pikas).get(pod).cloned();
            let ns = pika.map(|p| lock(&p).net.ns.clone());
            argv = real.network.jail(ns.as_deref()).into_iter().chain(argv).collect();
        }
        let env = self.deliver(kbagent::process_env(params, &agent_env));
        let at = self.clock.now();
        self.log(&format!("run {name} on {pod}"));
        let out = kbagent::run(&argv, &env, kbagent::call_timeout(action), Some(&self.stop));
        let result = out.result.clone().map_err(|e| format!("action: {name}, error: {e}"));
        let redacted = env
            .iter()
            .map(|(k, v)| (k.clone(), if credentials.contains(k) { "<redacted>".to_owned() } else { v.clone() }))
            .collect();
        self.log(&format!("{name} on {pod}: {:?} in {:.1}s", out.code, out.elapsed.as_secs_f64()));
        let stdout = out.stdout.clone();
        self.w().actions.push(ActionRecord {
            at,
            action: name.to_owned(),
            component: comp.to_owned(),
            pod: pod.to_owned(),
            argv: action.exec.as_ref().map(|e| e.command.iter().chain(&e.args).cloned().collect()).unwrap_or_default(),
            env: redacted,
            code: out.code,
            result: result.clone(),
            stdout: out.stdout,
            stderr: out.stderr,
            elapsed: out.elapsed,
        });
        self.notify();
        result.map(|()| stdout)
    }

    // ---- the cluster controller -----------------------------------------------------------------------------

    fn entity_comps(&self, w: &World, cluster: &ClusterObj, topology: &Topology, entity: &str) -> Vec<String> {
        if topology.shardings.iter().any(|s| s.name == entity) {
            w.shards_of(entity).into_iter().map(|c| c.full.clone()).collect()
        } else {
            let full = format!("{}-{entity}", cluster.name);
            w.components.contains_key(&full).then_some(full).into_iter().collect()
        }
    }

    /// Whether an entity is Running (`phasePrecondition`): for a sharding, as many shards as desired, all Running.
    fn entity_running(
        &self,
        w: &World,
        cluster: &ClusterObj,
        topology: &Topology,
        entity: &str,
        ignore_missing: bool,
    ) -> bool {
        let comps = self.entity_comps(w, cluster, topology, entity);
        if comps.is_empty() {
            return ignore_missing;
        }
        if let Some(sh) = cluster.spec.shardings.iter().find(|s| s.name == entity) {
            if comps.len() != sh.shards as usize {
                return false;
            }
        }
        comps.iter().all(|c| w.components.get(c).is_some_and(|c| c.phase == Phase::Running))
    }

    fn stages(order: &[String]) -> Vec<Vec<String>> {
        order.iter().map(|s| s.split(',').map(|e| e.trim().to_owned()).collect()).collect()
    }

    /// Entities in the order given, each with its predecessors (the previous stage).
    fn ordered(order: &[String], entities: &[String]) -> Vec<(String, Vec<String>)> {
        let stages = Self::stages(order);
        let mut out = Vec::new();
        let mut previous: Vec<String> = Vec::new();
        for stage in &stages {
            for e in stage {
                if entities.contains(e) {
                    out.push((e.clone(), previous.clone()));
                }
            }
            previous = stage.clone();
        }
        for e in entities {
            if !out.iter().any(|(x, _)| x == e) {
                out.push((e.clone(), Vec::new()));
            }
        }
        out
    }

    fn new_component(
        &self,
        w: &mut World,
        cluster: &ClusterObj,
        short: &str,
        comp_def: &str,
        sharding: Option<&str>,
        replicas: u32,
    ) -> CompObj {
        let def = self.comp_def(comp_def);
        let stand_in = sharding.is_none();
        let accounts = def
            .map(|d| d.spec.system_accounts.iter().map(|a| (a.name.clone(), lock(&self.rng).suffix(16))).collect())
            .unwrap_or_default();
        let custom_actions = match (self.settings.line, sharding) {
            (Line::V1_1, Some(s)) => self.sharding_custom_actions(cluster, s),
            _ => Vec::new(),
        };
        let _ = w;
        CompObj {
            full: format!("{}-{short}", cluster.name),
            short: short.to_owned(),
            comp_def: comp_def.to_owned(),
            sharding: sharding.map(str::to_owned),
            stand_in,
            replicas,
            deleting: false,
            phase: Phase::Creating,
            was_running: false,
            annotations: BTreeMap::new(),
            restarts: 0,
            accounts,
            custom_actions,
            sub_resources_deleted: false,
        }
    }

    fn sharding_def_of(&self, cluster: &ClusterObj, sharding: &str) -> Option<&super::chart::ShardingDefinition> {
        let topology = self.topology(cluster)?;
        let entry = topology.shardings.iter().find(|s| s.name == sharding)?;
        self.addon.resolve_sharding_def(entry.sharding_def.as_deref()?)
    }

    fn sharding_custom_actions(&self, cluster: &ClusterObj, sharding: &str) -> Vec<(String, Action)> {
        let Some(def) = self.sharding_def_of(cluster, sharding) else { return Vec::new() };
        let a = def.actions();
        let mut out: Vec<(String, Action)> = [
            ("udf-shardingPostProvision", a.post_provision),
            ("udf-shardingPreTerminate", a.pre_terminate),
            ("udf-shardingShardAdd", a.shard_add),
            ("udf-shardingShardRemove", a.shard_remove),
        ]
        .into_iter()
        .filter_map(|(n, a)| a.map(|a| (n.to_owned(), a)))
        .collect();
        out.sort_by(|x, y| x.0.cmp(&y.0));
        out
    }

    fn create_entity(
        self: &Arc<Self>,
        w: &mut World,
        cluster: &ClusterObj,
        topology: &Topology,
        entity: &str,
    ) -> Option<Next> {
        if let Some(sh) = cluster.spec.shardings.iter().find(|s| s.name == entity).cloned() {
            let comp_def = self.shard_comp_def(topology, entity)?;
            let names =
                sharding::desired_shards(entity, &[], sh.shards, &mut lock(&self.rng), &mut lock(&self.next_suffixes));
            for short in names {
                let comp = self.new_component(w, cluster, &short, &comp_def, Some(entity), sh.template.replicas);
                self.log(&format!("create shard {}", comp.full));
                let key = Key::Component(comp.full.clone());
                w.components.insert(comp.full.clone(), comp);
                self.spawn_worker(w, key);
            }
            if self.settings.line == Line::V1_1 {
                return self.sharding_post_provision_init(w, entity);
            }
            return None;
        }
        let spec = cluster.spec.component_specs.iter().find(|c| c.name == entity)?;
        let comp_def = topology.components.iter().find(|c| c.name == entity)?.comp_def.clone()?;
        let comp_def = self.addon.resolve_comp_def(&comp_def)?.metadata.name.clone();
        let comp = self.new_component(w, cluster, entity, &comp_def, None, spec.replicas);
        self.log(&format!("create component {}", comp.full));
        let key = Key::Component(comp.full.clone());
        w.components.insert(comp.full.clone(), comp);
        self.spawn_worker(w, key);
        None
    }

    /// 1.1: first sight of a sharding's postProvision: Pending, run it 3 s later (or Skipped when undefined).
    fn sharding_post_provision_init(&self, w: &mut World, sharding: &str) -> Option<Next> {
        let cluster = w.cluster.clone()?;
        let defined = self.sharding_def_of(&cluster, sharding).is_some_and(|d| d.actions().post_provision.is_some());
        let c = w.cluster.as_mut()?;
        if !defined {
            c.sharding_post_provision.insert(sharding.to_owned(), ActionPhase::Skipped);
            return None;
        }
        if c.sharding_post_provision.contains_key(sharding) {
            return None;
        }
        c.sharding_post_provision.insert(sharding.to_owned(), ActionPhase::Pending);
        Some(Next::After(retry::SHARDING_POST_PROVISION_INIT))
    }

    fn reconcile_cluster(self: &Arc<Self>) -> Option<Next> {
        let cluster = self.w().cluster.clone()?;
        if let Some(fatal) = self.w().fatal.clone() {
            return Some(Next::Error(fatal));
        }
        let Some(topology) = self.topology(&cluster).cloned() else {
            let e = format!("the topology of cluster {} is not found in an available ClusterDefinition", cluster.name);
            self.w().fatal = Some(e.clone());
            return Some(Next::Error(e));
        };
        let orders = topology.orders.clone().unwrap_or_default();
        let entities: Vec<String> = topology
            .components
            .iter()
            .map(|c| c.name.clone())
            .chain(topology.shardings.iter().map(|s| s.name.clone()))
            .collect();
        if cluster.deleting {
            return Some(self.reconcile_cluster_deletion(&cluster, &topology, &orders.terminate, &entities));
        }
        let mut result: Option<Next> = None;
        let mut delayed: Option<Next> = None;
        // Updates (entities that exist), in update order.
        let existing: Vec<String> = {
            let w = self.w();
            entities.iter().filter(|e| !self.entity_comps(&w, &cluster, &topology, e).is_empty()).cloned().collect()
        };
        for (entity, preds) in Self::ordered(&orders.update, &existing) {
            let ready = {
                let w = self.w();
                preds.iter().all(|p| self.entity_running(&w, &cluster, &topology, p, true))
            };
            if !ready {
                delayed = Some(Next::After(Duration::from_millis(500)));
                break;
            }
            if cluster.spec.shardings.iter().any(|s| s.name == entity) {
                if let Some(next) = self.update_sharding(&cluster, &topology, &entity) {
                    result = Some(next);
                    break;
                }
            } else if let Some(spec) = cluster.spec.component_specs.iter().find(|c| c.name == entity) {
                let full = format!("{}-{entity}", cluster.name);
                let mut w = self.w();
                if let Some(c) = w.components.get_mut(&full) {
                    if c.replicas != spec.replicas {
                        c.replicas = spec.replicas;
                        w.touch(&Key::Component(full));
                    }
                }
            }
        }
        // Creations, in provision order, each once its predecessors are Running.
        if result.is_none() {
            let mut w = self.w();
            let missing: Vec<String> =
                entities.iter().filter(|e| self.entity_comps(&w, &cluster, &topology, e).is_empty()).cloned().collect();
            for (entity, preds) in Self::ordered(&orders.provision, &missing) {
                if !preds.iter().all(|p| self.entity_running(&w, &cluster, &topology, p, false)) {
                    delayed = delayed.or(Some(Next::After(Duration::from_millis(500))));
                    break;
                }
                if let Some(next) = self.create_entity(&mut w, &cluster, &topology, &entity) {
                    delayed = Some(next);
                }
            }
        }
        self.update_cluster_phase(&topology);
        Some(result.or(delayed).unwrap_or(Next::Idle))
    }

    fn update_cluster_phase(&self, topology: &Topology) {
        let mut w = self.w();
        let Some(cluster) = w.cluster.clone() else { return };
        let entities_ok = topology.components.iter().all(|c| {
            w.components
                .get(&format!("{}-{}", cluster.name, c.name))
                .is_some_and(|c| c.phase == Phase::Running && !c.deleting)
        }) && cluster.spec.shardings.iter().all(|sh| {
            let shards = w.shards_of(&sh.name);
            shards.len() == sh.shards as usize
                && shards.iter().all(|c| {
                    c.phase == Phase::Running
                        && !c.deleting
                        && !c.annotations.contains_key(SHARD_ADD_PENDING)
                        && c.replicas == sh.template.replicas
                })
                && match cluster.sharding_post_provision.get(&sh.name) {
                    None => self.settings.line == Line::V1_0,
                    Some(p) => matches!(p, ActionPhase::Succeeded | ActionPhase::Skipped),
                }
        });
        let phase = if cluster.deleting {
            "Deleting"
        } else if entities_ok {
            "Running"
        } else if cluster.phase == "Running" || cluster.phase == "Updating" {
            "Updating"
        } else {
            "Creating"
        };
        if let Some(c) = w.cluster.as_mut() {
            if c.phase != phase {
                self.log(&format!("cluster phase {} -> {phase}", c.phase));
                c.phase = phase.to_owned();
            }
        }
    }

    /// A sharding's update: 1.1 actions and the shard set.
    fn update_sharding(self: &Arc<Self>, cluster: &ClusterObj, topology: &Topology, sharding: &str) -> Option<Next> {
        let spec = cluster.spec.shardings.iter().find(|s| s.name == sharding)?.clone();
        let comp_def = self.shard_comp_def(topology, sharding)?;
        let (running, proto): (Vec<CompObj>, Vec<String>) = {
            let w = self.w();
            let running: Vec<CompObj> = w.shards_of(sharding).into_iter().cloned().collect();
            let undeleted: Vec<String> = running.iter().filter(|c| !c.deleting).map(|c| c.short.clone()).collect();
            let proto = sharding::desired_shards(
                sharding,
                &undeleted,
                spec.shards,
                &mut lock(&self.rng),
                &mut lock(&self.next_suffixes),
            );
            (running, proto)
        };
        let running_names: BTreeSet<String> = running.iter().map(|c| c.short.clone()).collect();
        let to_create: Vec<String> = proto.iter().filter(|p| !running_names.contains(*p)).cloned().collect();
        let to_delete: Vec<&CompObj> = running.iter().filter(|c| !proto.contains(&c.short)).collect();
        let to_update: Vec<&CompObj> = running.iter().filter(|c| proto.contains(&c.short)).collect();
        let sdef = self.sharding_def_of(cluster, sharding).cloned();
        let actions = sdef.as_ref().map(super::chart::ShardingDefinition::actions).unwrap_or_default();
        let mut error: Option<String> = None;
        let mut skip: BTreeSet<String> = BTreeSet::new();
        if self.settings.line == Line::V1_1 {
            // postProvision first: until it succeeded, nothing is added, removed or created.
            let status = cluster.sharding_post_provision.get(sharding).cloned();
            match (&actions.post_provision, status) {
                (None, _) => {
                    if let Some(c) = self.w().cluster.as_mut() {
                        c.sharding_post_provision.insert(sharding.to_owned(), ActionPhase::Skipped);
                    }
                }
                (Some(_), Some(ActionPhase::Succeeded | ActionPhase::Skipped)) => {}
                (Some(_), None) => {
                    let mut w = self.w();
                    return self.sharding_post_provision_init(&mut w, sharding);
                }
                (Some(action), Some(_)) => {
                    let all: Vec<&CompObj> = running.iter().collect();
                    let r = self.sharding_action(
                        cluster,
                        sharding,
                        "udf-shardingPostProvision",
                        action,
                        &BTreeMap::new(),
                        &all,
                        None,
                    );
                    let mut w = self.w();
                    let c = w.cluster.as_mut()?;
                    match r {
                        Ok(()) => {
                            c.sharding_post_provision.insert(sharding.to_owned(), ActionPhase::Succeeded);
                        }
                        Err(e) => {
                            c.sharding_post_provision.insert(sharding.to_owned(), ActionPhase::Failed(e.clone()));
                            return Some(Next::Error(e));
                        }
                    }
                }
            }
            // shardAdd for shards still marked.
            if let Some(action) = &actions.shard_add {
                let all: Vec<&CompObj> = running.iter().collect();
                for comp in &to_update {
                    if !comp.annotations.contains_key(SHARD_ADD_PENDING) {
                        continue;
                    }
                    let args = BTreeMap::from([("KB_ADD_SHARD_NAME".to_owned(), comp.full.clone())]);
                    match self.sharding_action(
                        cluster,
                        sharding,
                        "udf-shardingShardAdd",
                        action,
                        &args,
                        &all,
                        Some(comp),
                    ) {
                        Ok(()) => {
                            let mut w = self.w();
                            if let Some(c) = w.components.get_mut(&comp.full) {
                                c.annotations.remove(SHARD_ADD_PENDING);
                            }
                            w.touch(&Key::Component(comp.full.clone()));
                        }
                        Err(e) => {
                            error.get_or_insert(e);
                        }
                    }
                }
            }
            // shardRemove before a removed shard goes, unless its shardAdd never succeeded.
            if let Some(action) = &actions.shard_remove {
                let all: Vec<&CompObj> = running.iter().collect();
                for comp in &to_delete {
                    if comp.annotations.contains_key(SHARD_ADD_PENDING) || comp.deleting {
                        continue;
                    }
                    let args = BTreeMap::from([("KB_REMOVE_SHARD_NAME".to_owned(), comp.full.clone())]);
                    if let Err(e) = self.sharding_action(
                        cluster,
                        sharding,
                        "udf-shardingShardRemove",
                        action,
                        &args,
                        &all,
                        Some(comp),
                    ) {
                        skip.insert(comp.full.clone());
                        error.get_or_insert(e);
                    }
                }
            }
        }
        let mut w = self.w();
        for comp in &to_delete {
            if skip.contains(&comp.full) || comp.deleting {
                continue;
            }
            if let Some(c) = w.components.get_mut(&comp.full) {
                self.log(&format!("delete shard {} (scale-in)", c.full));
                c.deleting = true;
                c.annotations.insert(SCALE_IN.into(), "true".into());
            }
            w.touch(&Key::Component(comp.full.clone()));
        }
        for comp in &to_update {
            if let Some(c) = w.components.get_mut(&comp.full) {
                if c.replicas != spec.template.replicas {
                    c.replicas = spec.template.replicas;
                    let key = Key::Component(c.full.clone());
                    w.touch(&key);
                }
            }
        }
        let shard_add = self.settings.line == Line::V1_1 && actions.shard_add.is_some();
        for short in &to_create {
            let mut comp =
                self.new_component(&mut w, cluster, short, &comp_def, Some(sharding), spec.template.replicas);
            if shard_add {
                comp.annotations.insert(SHARD_ADD_PENDING.into(), format!("{:?}", self.clock.now()));
            }
            self.log(&format!("create shard {} (scale-out)", comp.full));
            let key = Key::Component(comp.full.clone());
            w.components.insert(comp.full.clone(), comp);
            self.spawn_worker(&mut w, key);
        }
        error.map(Next::Error)
    }

    /// Runs a sharding action (1.1) on the target shard(s): that shard's vars, `pods[0]`, the action's own selector.
    #[allow(clippy::too_many_arguments)]
    fn sharding_action(
        &self,
        _cluster: &ClusterObj,
        sharding: &str,
        name: &str,
        action: &Action,
        args: &BTreeMap<String, String>,
        shards: &[&CompObj],
        concerned: Option<&CompObj>,
    ) -> Result<(), String> {
        if shards.is_empty() {
            return Err("has no shards to running the action".into());
        }
        let targets: Vec<&CompObj> = match action.target_shard_selector.as_deref().unwrap_or_default() {
            "All" => shards.to_vec(),
            "Any" | "" => vec![concerned.unwrap_or_else(|| shards[lock(&self.rng).below(shards.len())])],
            other => return Err(format!("unknown target shard selector: {other}")),
        };
        for shard in targets {
            let (params, pods) = {
                let w = self.w();
                let Some(comp) = w.components.get(&shard.full) else { continue };
                let vars = self.resolve(&w, comp)?;
                let pods = self.listed_pods(&w, &comp.full);
                if pods.is_empty() {
                    return Err("has no pods to running the action".into());
                }
                self.precondition(&w, comp, action, Some(sharding))?;
                (kbagent::parameters(&vars.template, args), pods)
            };
            let line = self.settings.line;
            let targets =
                kbagent::select_targets(line, action, &pods, Some(&pods[0]), name, &mut |n| lock(&self.rng).below(n))?;
            for pod in targets {
                self.call(name, &shard.full, &pod.name, action, &params)?;
            }
        }
        Ok(())
    }

    fn reconcile_cluster_deletion(
        self: &Arc<Self>,
        cluster: &ClusterObj,
        topology: &Topology,
        terminate: &[String],
        entities: &[String],
    ) -> Next {
        let deletable: Vec<String> = {
            let mut w = self.w();
            let present: Vec<String> =
                entities.iter().filter(|e| !self.entity_comps(&w, cluster, topology, e).is_empty()).cloned().collect();
            if present.is_empty() {
                self.log("cluster deleted");
                w.cluster = None;
                return Next::Idle;
            }
            if let Some(c) = w.cluster.as_mut() {
                c.phase = "Deleting".into();
            }
            let mut deletable = Vec::new();
            for (entity, preds) in Self::ordered(terminate, &present) {
                if preds.iter().any(|p| !self.entity_comps(&w, cluster, topology, p).is_empty()) {
                    break;
                }
                deletable.push(entity);
            }
            deletable
        };
        for entity in deletable {
            // 1.1: a sharding's preTerminate first (unless its postProvision never succeeded); a failure keeps it.
            if self.settings.line == Line::V1_1 && cluster.spec.shardings.iter().any(|s| s.name == entity) {
                if let Some(next) = self.sharding_pre_terminate(cluster, &entity) {
                    return next;
                }
            }
            let mut w = self.w();
            for full in self.entity_comps(&w, cluster, topology, &entity) {
                if let Some(c) = w.components.get_mut(&full) {
                    if !c.deleting {
                        self.log(&format!("delete {full} (cluster deletion)"));
                        c.deleting = true;
                        w.touch(&Key::Component(full));
                    }
                }
            }
        }
        Next::Idle
    }

    /// 1.1: a sharding's preTerminate on cluster deletion; `Some` when the deletion must wait.
    fn sharding_pre_terminate(self: &Arc<Self>, cluster: &ClusterObj, sharding: &str) -> Option<Next> {
        let action = self.sharding_def_of(cluster, sharding)?.actions().pre_terminate?;
        let current = self.w().cluster.as_ref().map(|c| {
            (c.sharding_pre_terminate.get(sharding).cloned(), c.sharding_post_provision.get(sharding).cloned())
        });
        let (done, post) = current?;
        if matches!(done, Some(ActionPhase::Succeeded | ActionPhase::Skipped)) {
            return None;
        }
        let set = |phase: ActionPhase| {
            if let Some(c) = self.w().cluster.as_mut() {
                c.sharding_pre_terminate.insert(sharding.to_owned(), phase);
            }
        };
        if post.is_some_and(|p| !matches!(p, ActionPhase::Succeeded | ActionPhase::Skipped)) {
            set(ActionPhase::Skipped);
            return None;
        }
        let shards: Vec<CompObj> = self.w().shards_of(sharding).into_iter().cloned().collect();
        let all: Vec<&CompObj> = shards.iter().collect();
        match self.sharding_action(cluster, sharding, "udf-shardingPreTerminate", &action, &BTreeMap::new(), &all, None)
        {
            Ok(()) => {
                set(ActionPhase::Succeeded);
                None
            }
            Err(e) => {
                set(ActionPhase::Failed(e.clone()));
                Some(Next::Error(e))
            }
        }
    }

    // ---- the component controller ---------------------------------------------------------------------------

    fn reconcile_component(self: &Arc<Self>, full: &str) -> Option<Next> {
        let comp = self.w().components.get(full).cloned()?;
        if comp.stand_in {
            return self.reconcile_stand_in(&comp);
        }
        if comp.deleting {
            return self.reconcile_component_deletion(&comp);
        }
        let def = self.comp_def(&comp.comp_def)?.clone();
        let actions = def.actions();
        // Vars first: nothing else happens while they do not resolve.
        let vars = {
            let w = self.w();
            match self.resolve(&w, &comp) {
                Ok(v) => v,
                Err(e) => return Some(Next::Error(e)),
            }
        };
        // The workload.
        {
            let mut w = self.w();
            match w.instance_sets.get_mut(full) {
                None => {
                    let mut replicas_status = BTreeMap::new();
                    for i in 0..comp.replicas {
                        replicas_status
                            .insert(format!("{full}-{i}"), ReplicaStatus { provisioned: true, member_joined: None });
                    }
                    let its = ItsObj {
                        name: full.to_owned(),
                        comp: full.to_owned(),
                        replicas: comp.replicas,
                        revision: comp.restarts + 1,
                        current_revision: comp.restarts + 1,
                        template_vars: vars.template.clone(),
                        replicas_status,
                        env_vars: vars.all(),
                        deleting: false,
                        status_seen: String::new(),
                    };
                    w.instance_sets.insert(full.to_owned(), its);
                    self.spawn_worker(&mut w, Key::InstanceSet(full.to_owned()));
                }
                Some(its) => {
                    its.template_vars = vars.template.clone();
                    its.env_vars = vars.all();
                    if its.revision != comp.restarts + 1 {
                        its.revision = comp.restarts + 1;
                        w.touch(&Key::InstanceSet(full.to_owned()));
                    }
                }
            }
        }
        // Horizontal scaling.
        let its_replicas = self.w().instance_sets.get(full).map_or(0, |i| i.replicas);
        if comp.replicas < its_replicas {
            let victims = instanceset::scale_in_victims(full, its_replicas, comp.replicas);
            let mut errors = Vec::new();
            for victim in &victims {
                let (exists, joined, role) = {
                    let w = self.w();
                    let st = w.instance_sets.get(full).and_then(|i| i.replicas_status.get(victim).copied());
                    let joined = st.is_some_and(|s| s.provisioned && s.member_joined != Some(false));
                    let pod = w.pods.get(victim);
                    (pod.is_some(), joined, pod.and_then(|p| p.role.clone()))
                };
                if !joined {
                    continue;
                }
                if !exists {
                    errors.push(format!(
                        "some replicas have joined but not leaved since the Pod object is not exist: [{victim}]"
                    ));
                    continue;
                }
                if let Some(action) = &actions.switchover {
                    let params = self.member_params(&vars, full, "switchover", victim, role.as_deref(), None);
                    // Failures are ignored: KubeBlocks logs "failed to call switchover action, ignore it".
                    let _ = self.call("switchover", full, victim, action, &params);
                }
                if let Some(action) = &actions.member_leave {
                    let params = self.member_params(&vars, full, "memberLeave", victim, None, None);
                    if let Err(e) = self.call("memberLeave", full, victim, action, &params) {
                        errors.push(e);
                    }
                }
            }
            if !errors.is_empty() {
                return Some(Next::Retry(retry::MEMBER_ACTION_FAILED, errors.join("; ")));
            }
            let mut w = self.w();
            if let Some(its) = w.instance_sets.get_mut(full) {
                its.replicas = comp.replicas;
                for v in &victims {
                    its.replicas_status.remove(v);
                }
            }
            w.touch(&Key::InstanceSet(full.to_owned()));
        } else if comp.replicas > its_replicas {
            let mut w = self.w();
            if let Some(its) = w.instance_sets.get_mut(full) {
                for i in its_replicas..comp.replicas {
                    let joined = if actions.member_join.is_some() { Some(false) } else { None };
                    its.replicas_status
                        .insert(format!("{full}-{i}"), ReplicaStatus { provisioned: true, member_joined: joined });
                }
                its.replicas = comp.replicas;
            }
            w.touch(&Key::InstanceSet(full.to_owned()));
        } else if let Some(action) = &actions.member_join {
            let pending: Vec<String> = {
                let w = self.w();
                w.instance_sets
                    .get(full)
                    .map(|its| {
                        its.replicas_status
                            .iter()
                            .filter(|(name, s)| s.member_joined == Some(false) && w.pods.contains_key(*name))
                            .map(|(n, _)| n.clone())
                            .collect()
                    })
                    .unwrap_or_default()
            };
            let mut errors = Vec::new();
            for pod in &pending {
                let params = self.member_params(&vars, full, "memberJoin", pod, None, None);
                match self.call("memberJoin", full, pod, action, &params) {
                    Ok(_) => {
                        let mut w = self.w();
                        if let Some(s) = w.instance_sets.get_mut(full).and_then(|i| i.replicas_status.get_mut(pod)) {
                            s.member_joined = Some(true);
                        }
                    }
                    Err(e) => errors.push(format!("pod {pod}: {e}")),
                }
            }
            let still: Vec<String> = {
                let w = self.w();
                w.instance_sets
                    .get(full)
                    .map(|i| {
                        i.replicas_status
                            .iter()
                            .filter(|(_, s)| s.member_joined == Some(false))
                            .map(|(n, _)| n.clone())
                            .collect()
                    })
                    .unwrap_or_default()
            };
            if !still.is_empty() {
                errors.push(format!("some replicas have not joined: {still:?}"));
            }
            if !errors.is_empty() {
                return Some(Next::Retry(retry::MEMBER_ACTION_FAILED, errors.join("; ")));
            }
        }
        // postProvision.
        if let Some(action) = &actions.post_provision {
            if !comp.annotations.contains_key(POST_PROVISION_DONE) {
                let prepared = {
                    let w = self.w();
                    let pods = self.listed_pods(&w, full);
                    if pods.is_empty() {
                        Err("has no pods to running the post-provision action".to_owned())
                    } else {
                        self.precondition(&w, &comp, action, None).map(|()| {
                            let system = match self.settings.line {
                                Line::V1_0 => self.legacy_env(&w, &comp, false),
                                Line::V1_1 => BTreeMap::new(),
                            };
                            (kbagent::parameters(&vars.template, &system), pods)
                        })
                    }
                };
                let (params, pods) = match prepared {
                    Ok(p) => p,
                    Err(e) if e.starts_with(PRECONDITION_FAILED) => {
                        return Some(Next::Retry(retry::POST_PROVISION_PRECONDITION, e.clone()));
                    }
                    Err(e) => return Some(Next::Retry(retry::POST_PROVISION_FAILED, e.clone())),
                };
                let line = self.settings.line;
                let targets = match kbagent::select_targets(line, action, &pods, None, "postProvision", &mut |n| {
                    lock(&self.rng).below(n)
                }) {
                    Ok(t) => t,
                    Err(e) => return Some(Next::Retry(retry::POST_PROVISION_FAILED, e.clone())),
                };
                for pod in targets {
                    if let Err(e) = self.call("postProvision", full, &pod.name, action, &params) {
                        self.warn(&format!("Component/{full}"), &e);
                        return Some(Next::Retry(retry::POST_PROVISION_FAILED, e.clone()));
                    }
                }
                let mut w = self.w();
                if let Some(c) = w.components.get_mut(full) {
                    c.annotations.insert(POST_PROVISION_DONE.into(), format!("{:?}", self.clock.now()));
                }
                w.touch(&Key::Cluster);
                return Some(Next::After(Duration::ZERO));
            }
        }
        // Status.
        let mut w = self.w();
        let joins_pending = w.instance_sets.get(full).is_some_and(|i| {
            i.replicas != comp.replicas || i.replicas_status.values().any(|s| s.member_joined == Some(false))
        });
        let running = !joins_pending && self.workload_running(&w, full);
        if let Some(c) = w.components.get_mut(full) {
            let phase = if running {
                Phase::Running
            } else if c.was_running {
                Phase::Updating
            } else {
                Phase::Creating
            };
            if c.phase != phase {
                self.log(&format!("{full}: {} -> {}", c.phase.as_str(), phase.as_str()));
                c.phase = phase;
                c.was_running |= running;
                w.touch(&Key::Cluster);
            }
        }
        Some(Next::Idle)
    }

    fn warn(&self, object: &str, message: &str) {
        let at = self.clock.now();
        self.w().warnings.push(Warning { at, object: object.to_owned(), message: message.to_owned() });
    }

    /// Parameters of switchover / memberJoin / memberLeave for `pod`.
    fn member_params(
        &self,
        vars: &ResolvedVars,
        comp: &str,
        action: &str,
        pod: &str,
        role: Option<&str>,
        candidate: Option<&str>,
    ) -> BTreeMap<String, String> {
        let (ns, domain) = {
            let w = self.w();
            (w.cluster.as_ref().map(|c| c.namespace.clone()).unwrap_or_default(), self.settings.cluster_domain.clone())
        };
        let fqdn = |p: &str| vars::pod_fqdn(&ns, comp, p, &domain);
        let mut system = BTreeMap::new();
        match action {
            "switchover" => {
                if let Some(c) = candidate {
                    system.insert("KB_SWITCHOVER_CANDIDATE_NAME".into(), c.to_owned());
                    system.insert("KB_SWITCHOVER_CANDIDATE_FQDN".into(), fqdn(c));
                }
                system.insert("KB_SWITCHOVER_CURRENT_NAME".into(), pod.to_owned());
                system.insert("KB_SWITCHOVER_CURRENT_FQDN".into(), fqdn(pod));
                system.insert("KB_SWITCHOVER_ROLE".into(), role.unwrap_or_default().to_owned());
            }
            "memberJoin" => {
                system.insert("KB_JOIN_MEMBER_POD_FQDN".into(), fqdn(pod));
                system.insert("KB_JOIN_MEMBER_POD_NAME".into(), pod.to_owned());
            }
            _ => {
                system.insert("KB_LEAVE_MEMBER_POD_FQDN".into(), fqdn(pod));
                system.insert("KB_LEAVE_MEMBER_POD_NAME".into(), pod.to_owned());
            }
        }
        kbagent::parameters(&vars.template, &system)
    }

    /// Runs the switchover OpsRequest's action for `pod` with `candidate` (the caller waits for its end).
    pub fn ops_switchover(&self, comp: &str, pod: &str, candidate: &str) -> Result<String, String> {
        let (action, vars, role) = {
            let w = self.w();
            let c = w.components.get(comp).ok_or_else(|| format!("component {comp} not found"))?;
            let def = self.comp_def(&c.comp_def).ok_or("no definition")?;
            let action = def.actions().switchover.ok_or("no switchover action")?;
            let vars = self.resolve(&w, c)?;
            let p = w.pods.get(pod).ok_or_else(|| format!("pod {pod} not found"))?;
            let role = p.role.clone().ok_or_else(|| format!("pod {pod} has no role label"))?;
            if !w.pods.contains_key(candidate) {
                return Err(format!("candidate pod {candidate} not found"));
            }
            (action, vars, role)
        };
        let params = self.member_params(&vars, comp, "switchover", pod, Some(&role), Some(candidate));
        self.call("switchover", comp, pod, &action, &params)?;
        Ok(role)
    }

    fn reconcile_component_deletion(self: &Arc<Self>, comp: &CompObj) -> Option<Next> {
        let full = comp.full.as_str();
        if comp.phase != Phase::Deleting {
            let mut w = self.w();
            if let Some(c) = w.components.get_mut(full) {
                c.phase = Phase::Deleting;
            }
            w.touch(&Key::Cluster);
            return Some(Next::After(retry::DELETION_STEP));
        }
        let def = self.comp_def(&comp.comp_def)?.clone();
        if let Some(action) = def.actions().pre_terminate {
            let skip = comp.annotations.get(SKIP_PRE_TERMINATE).is_some_and(|v| v.eq_ignore_ascii_case("true"));
            let provisioned =
                self.w().instance_sets.get(full).is_some_and(|i| i.replicas_status.values().any(|s| s.provisioned));
            if !skip && provisioned && !comp.annotations.contains_key(PRE_TERMINATE_DONE) {
                let prepared = {
                    let w = self.w();
                    self.resolve(&w, comp).and_then(|vars| {
                        let pods = self.listed_pods(&w, full);
                        if pods.is_empty() {
                            return Err("has no pods to running the pre-terminate action".to_owned());
                        }
                        self.precondition(&w, comp, &action, None)?;
                        let system = match self.settings.line {
                            Line::V1_0 => self.legacy_env(&w, comp, true),
                            Line::V1_1 => BTreeMap::new(),
                        };
                        Ok((kbagent::parameters(&vars.template, &system), pods))
                    })
                };
                let (params, pods) = match prepared {
                    Ok(p) => p,
                    Err(e) => return Some(Next::Error(e)),
                };
                let line = self.settings.line;
                let targets = match kbagent::select_targets(line, &action, &pods, None, "preTerminate", &mut |n| {
                    lock(&self.rng).below(n)
                }) {
                    Ok(t) => t,
                    Err(e) => return Some(Next::Error(e)),
                };
                for pod in targets {
                    if let Err(e) = self.call("preTerminate", full, &pod.name, &action, &params) {
                        return Some(Next::Error(e));
                    }
                }
                let mut w = self.w();
                if let Some(c) = w.components.get_mut(full) {
                    c.annotations.insert(PRE_TERMINATE_DONE.into(), format!("{:?}", self.clock.now()));
                }
                return Some(Next::After(Duration::ZERO));
            }
        }
        // The workload first, then the rest, then the object.
        let mut w = self.w();
        if let Some(its) = w.instance_sets.get_mut(full) {
            if !its.deleting {
                its.deleting = true;
                w.touch(&Key::InstanceSet(full.to_owned()));
            }
            return Some(Next::Idle);
        }
        if !comp.sub_resources_deleted {
            if let Some(c) = w.components.get_mut(full) {
                c.sub_resources_deleted = true;
            }
            return Some(Next::After(retry::DELETION_STEP));
        }
        self.log(&format!("{full} deleted"));
        w.components.remove(full);
        w.touch(&Key::Cluster);
        None
    }

    // ---- stand-ins ----------------------------------------------------------------------------------------

    fn reconcile_stand_in(self: &Arc<Self>, comp: &CompObj) -> Option<Next> {
        let def = self.comp_def(&comp.comp_def)?.clone();
        let (cluster, ns) = {
            let w = self.w();
            let c = w.cluster.as_ref()?;
            (c.name.clone(), c.namespace.clone())
        };
        let service_names = |backing_addr: &str, services: &mut BTreeMap<String, String>| {
            for svc in &def.spec.services {
                let name = match svc.service_name.as_deref() {
                    Some(s) if !s.is_empty() => format!("{}-{s}", comp.full),
                    _ => comp.full.clone(),
                };
                for port in svc.ports() {
                    services.insert(format!("{name}:{port}"), backing_addr.to_owned());
                }
            }
        };
        if comp.deleting {
            let mut b = lock(&self.backing);
            if def.spec.service_kind.as_deref() == Some("codis-proxy") {
                // With real servers the proxies stop (their preStop script is not run: what it does is not modelled).
                b.real_proxies.clear();
                // codis-proxy's preStop takes each proxy out of the dashboard before it stops.
                let codis = b.codis.clone();
                for (_, proxy) in b.proxies.drain(..) {
                    if let Some(codis) = &codis {
                        let _ = codis.call("PUT", &format!("/api/topom/proxy/remove/{{xauth}}/{}/1", proxy.token()));
                    }
                    proxy.stop();
                }
            }
            drop(b);
            let mut w = self.w();
            self.log(&format!("{} deleted", comp.full));
            w.components.remove(&comp.full);
            w.touch(&Key::Cluster);
            return None;
        }
        if comp.phase == Phase::Running {
            return Some(Next::Idle);
        }
        match def.spec.service_kind.as_deref().unwrap_or_default() {
            "etcd" => {
                let etcd = match &self.real {
                    Some(real) => EtcdServer::start_on(real.network.node(), || real.network.node_port()),
                    None => EtcdServer::start(),
                };
                let mut b = lock(&self.backing);
                let addr = etcd.endpoint();
                service_names(&addr, &mut b.services);
                b.etcd = Some(etcd);
            }
            "codis-dashboard" if self.real.is_some() => {
                let real = self.real.as_ref().expect("real servers");
                let password = comp.accounts.values().next().cloned().unwrap_or_default();
                let etcd = lock(&self.backing).etcd.as_ref().map(EtcdServer::endpoint);
                let Some(etcd) = etcd else { return Some(Next::Error("codis-dashboard before etcd".into())) };
                let dashboard = match Dashboard::start(&real.network, &real.servers, &etcd, &cluster, &password, &[]) {
                    Ok(d) => d,
                    Err(e) => return Some(Next::Error(e)),
                };
                let mut b = lock(&self.backing);
                service_names(dashboard.addr(), &mut b.services);
                b.dashboard = Some(Arc::new(dashboard));
            }
            "codis-proxy" if self.real.is_some() => {
                let real = self.real.as_ref().expect("real servers");
                let password = {
                    let w = self.w();
                    w.components
                        .values()
                        .find(|c| c.short == "codis-dashboard")
                        .and_then(|c| c.accounts.values().next().cloned())
                        .unwrap_or_default()
                };
                let dashboard = lock(&self.backing).dashboard.clone();
                let Some(dashboard) = dashboard else {
                    return Some(Next::Error("codis-proxy before codis-dashboard".into()));
                };
                for i in 0..comp.replicas {
                    let index = lock(&self.backing).real_proxies.len();
                    let proxy =
                        Proxy::start(&real.network, &real.servers, dashboard.addr(), &cluster, &password, index, &[]);
                    match proxy {
                        Ok(p) => lock(&self.backing).real_proxies.push(p),
                        Err(e) => return Some(Next::Error(format!("codis-proxy {}-{i}: {e}", comp.full))),
                    }
                }
            }
            "codis-dashboard" => {
                let password = comp.accounts.values().next().cloned();
                let double = CodisDouble::start(DoubleOptions {
                    product: cluster.clone(),
                    password,
                    tick: self.settings.codis_tick,
                    ..DoubleOptions::default()
                });
                if let Some(t) = self.settings.migration_ticks {
                    double.set_default_migration_ticks(t);
                }
                let mut b = lock(&self.backing);
                service_names(&double.addr(), &mut b.services);
                b.codis = Some(Arc::new(double));
            }
            "codis-proxy" => {
                let password = {
                    let w = self.w();
                    w.components
                        .values()
                        .find(|c| c.short == "codis-dashboard")
                        .and_then(|c| c.accounts.values().next().cloned())
                };
                let container = def.spec.runtime.containers.first().cloned().unwrap_or_default();
                let port = |name: &str, default: u16| {
                    container
                        .ports
                        .iter()
                        .find(|p| p.name.as_deref() == Some(name))
                        .map_or(default, |p| p.container_port)
                };
                let (admin_port, data_port) = (port("admin", 11080), port("proxy", 19000));
                let codis = lock(&self.backing).codis.clone();
                for i in 0..comp.replicas {
                    let pod = format!("{}-{i}", comp.full);
                    let fqdn = vars::pod_fqdn(&ns, &comp.full, &pod, &self.settings.cluster_domain);
                    let admin = format!("{fqdn}:{admin_port}");
                    // The proxy dials the pods by their registered addresses, through the emulated network.
                    let overrides = lock(&self.servers).values().cloned().collect();
                    let proxy = ProxyDouble::start_with(ProxyOptions {
                        auth: password.clone().unwrap_or_default(),
                        admin_addr: Some(admin.clone()),
                        proxy_addr: format!("{fqdn}:{data_port}"),
                        overrides,
                        ..ProxyOptions::new(&cluster)
                    });
                    lock(&self.proxy_admins).insert(admin.clone(), proxy.addr());
                    if let Some(codis) = &codis {
                        codis.set_override(&admin, &proxy.addr());
                        // What codis-proxy --dashboard does once it serves.
                        let reply = codis.call("PUT", &format!("/api/topom/proxy/online/{{xauth}}/{admin}"));
                        if !reply.is_ok() {
                            return Some(Next::Error(format!("codis-proxy {pod} could not come online: {reply:?}")));
                        }
                    }
                    lock(&self.backing).proxies.push((admin, proxy));
                }
            }
            _ => {}
        }
        let mut w = self.w();
        if let Some(c) = w.components.get_mut(&comp.full) {
            c.phase = Phase::Running;
            c.was_running = true;
        }
        w.touch(&Key::Cluster);
        self.log(&format!("{} (stand-in) Running", comp.full));
        Some(Next::Idle)
    }

    // ---- the InstanceSet controller -------------------------------------------------------------------------

    fn reconcile_its(self: &Arc<Self>, name: &str) -> Option<Next> {
        let (its, comp) = {
            let w = self.w();
            (w.instance_sets.get(name).cloned()?, w.components.get(name).cloned())
        };
        let Some(comp) = comp else {
            self.w().instance_sets.remove(name);
            return None;
        };
        let def = self.comp_def(&comp.comp_def)?.clone();
        if its.deleting {
            let pods: Vec<String> = self.w().pods_of(name).iter().map(|p| p.name.clone()).collect();
            for p in pods {
                self.delete_pod(&p, comp.annotations.contains_key(SCALE_IN));
            }
            let mut w = self.w();
            w.instance_sets.remove(name);
            w.touch(&Key::Component(name.to_owned()));
            return None;
        }
        // Scale: create missing pods, remove the ones above replicas.
        let (missing, extra): (Vec<u32>, Vec<String>) = {
            let w = self.w();
            let pods = w.pods_of(name);
            let missing = (0..its.replicas).filter(|i| !pods.iter().any(|p| p.ordinal == *i)).collect();
            let extra = pods.iter().filter(|p| p.ordinal >= its.replicas).map(|p| p.name.clone()).collect();
            (missing, extra)
        };
        for p in extra {
            self.delete_pod(&p, true);
        }
        for ordinal in missing {
            self.create_pod(&comp, &def, ordinal, its.revision);
        }
        // Rolling update.
        let roles: Vec<(String, i32)> = def.spec.roles.iter().map(|r| (r.name.clone(), r.update_priority)).collect();
        let mut next = Next::Idle;
        let needs_update = self.w().pods_of(name).iter().any(|p| p.revision != its.revision);
        if needs_update {
            let strategy = def.spec.update_strategy.as_deref().unwrap_or("Serial");
            if strategy != "Serial" {
                return Some(Next::Error(format!("update strategy {strategy} is not emulated")));
            }
            let views: Vec<PodView> = {
                let w = self.w();
                let min_ready = self.min_ready(&w, name);
                w.pods_of(name)
                    .iter()
                    .map(|p| PodView {
                        name: p.name.clone(),
                        role: p.role.clone(),
                        ready: p.ready,
                        available: self.available(p, min_ready),
                        updated: p.revision == its.revision,
                        terminating: p.terminating,
                    })
                    .collect()
            };
            match instanceset::next_update(&views, &roles) {
                UpdateStep::Update(pod) => {
                    if let Some(action) = def.actions().switchover {
                        let role = views.iter().find(|v| v.name == pod).and_then(|v| v.role.clone());
                        let vars = ResolvedVars { template: its.template_vars.clone(), credentials: BTreeMap::new() };
                        let params = self.member_params(&vars, name, "switchover", &pod, role.as_deref(), None);
                        // Failures are ignored and the pod is deleted at once.
                        let _ = self.call("switchover", name, &pod, &action, &params);
                    }
                    self.log(&format!("rolling update: recreate {pod}"));
                    self.delete_pod(&pod, false);
                    let ordinal = pod.rsplit('-').next().and_then(|o| o.parse().ok()).unwrap_or(0);
                    self.create_pod(&comp, &def, ordinal, its.revision);
                    next = Next::After(Duration::from_millis(200));
                }
                UpdateStep::Wait(_) => next = Next::After(Duration::from_millis(500)),
                UpdateStep::Done => {}
            }
        } else if its.current_revision != its.revision {
            let mut w = self.w();
            if let Some(i) = w.instance_sets.get_mut(name) {
                i.current_revision = i.revision;
            }
        }
        // Status: a change wakes the component; waiting for availability needs a requeue.
        let mut w = self.w();
        let min_ready = self.min_ready(&w, name);
        let pods = w.pods_of(name);
        let status = pods
            .iter()
            .map(|p| format!("{}:{}:{}:{}:{:?}", p.name, p.ready, self.available(p, min_ready), p.revision, p.role))
            .collect::<Vec<_>>()
            .join(",");
        let waiting_available = pods.iter().any(|p| p.ready && !self.available(p, min_ready));
        if waiting_available && next == Next::Idle {
            next = Next::After(min_ready.max(Duration::from_millis(100)));
        }
        if w.instance_sets.get(name).is_some_and(|i| i.status_seen != status) {
            if let Some(i) = w.instance_sets.get_mut(name) {
                i.status_seen = status;
            }
            w.touch(&Key::Component(name.to_owned()));
        }
        Some(next)
    }

    // ---- pods -----------------------------------------------------------------------------------------------

    /// The container of the definition that runs pika-action before its server (the one whose start script does).
    fn server_container<'a>(&self, def: &'a ComponentDefinition) -> Option<(&'a Container, Vec<String>)> {
        def.spec.runtime.containers.iter().find_map(|c| {
            let actions = self.addon.start_script_actions(c).ok()?;
            (!actions.is_empty()).then_some((c, actions))
        })
    }

    fn create_pod(self: &Arc<Self>, comp: &CompObj, def: &ComponentDefinition, ordinal: u32, revision: u64) {
        let name = format!("{}-{ordinal}", comp.full);
        let vars_env = self.w().instance_sets.get(&comp.full).map(|i| i.env_vars.clone()).unwrap_or_default();
        let (ns, serial) = {
            let mut w = self.w();
            (w.cluster.as_ref().map(|c| c.namespace.clone()).unwrap_or_default(), w.next_serial())
        };
        let uid = format!("00000000-0000-4000-8000-{serial:012x}");
        let node = format!("node-{}", serial % 3);
        let field = |e: &super::chart::EnvEntry| -> Option<String> {
            e.value.clone().or_else(|| {
                let path = e.value_from.as_ref()?.pointer("/fieldRef/fieldPath")?.as_str()?;
                match path {
                    "metadata.name" => Some(name.clone()),
                    "metadata.namespace" => Some(ns.clone()),
                    "spec.nodeName" => Some(node.clone()),
                    _ => None,
                }
            })
        };
        let mut agent_env = BTreeMap::from([
            ("KB_AGENT_NAMESPACE".to_owned(), ns.clone()),
            ("KB_AGENT_POD_NAME".to_owned(), name.clone()),
            ("KB_AGENT_POD_UID".to_owned(), uid.clone()),
            ("KB_AGENT_NODE_NAME".to_owned(), node.clone()),
        ]);
        agent_env.extend(vars_env.clone());
        for e in kbagent::exec_env_union(&def.actions(), &comp.custom_actions) {
            if let Some(v) = field(&e) {
                agent_env.entry(e.name.clone()).or_insert(v);
            }
        }
        let mut container_env = vars_env;
        if let Some((c, _)) = self.server_container(def) {
            for e in &c.env {
                if let Some(v) = field(e) {
                    container_env.insert(e.name.clone(), v);
                }
            }
        }
        let pod = PodObj {
            name: name.clone(),
            comp: comp.full.clone(),
            ordinal,
            revision,
            role: None,
            ready: false,
            ready_since: None,
            terminating: false,
            uid,
            ip: format!("10.{}.{}.{}", 1 + serial / 65536 % 250, serial / 256 % 256, serial % 256),
            node,
            host_ip: format!("192.168.0.{}", serial % 3),
            agent_env,
            container_env,
            incarnation: serial,
        };
        // The volume: kept across recreations.
        let password = pod.container_env.get("PIKA_PASSWORD").cloned();
        let port =
            self.server_container(def).and_then(|(c, _)| c.ports.first().map(|p| p.container_port)).unwrap_or(9221);
        let fqdn = vars::pod_fqdn(&ns, &comp.full, &name, &self.settings.cluster_domain);
        if let Some(real) = &self.real {
            let pika = {
                let existing = lock(&self.pikas).get(&name).cloned();
                match existing {
                    Some(p) => p,
                    None => {
                        let slot = {
                            let mut slots = lock(&self.pod_slots);
                            let next = u8::try_from(slots.len()).unwrap_or(u8::MAX);
                            *slots.entry(name.clone()).or_insert(next)
                        };
                        let net = match real.network.add_pod(slot) {
                            Ok(net) => net,
                            Err(e) => {
                                self.warn(&format!("Pod/{name}"), &e);
                                return;
                            }
                        };
                        if let Err(e) = real.network.resolve(&fqdn, net.addr) {
                            self.warn(&format!("Pod/{name}"), &e);
                            return;
                        }
                        let dir = real.network.dir().join("pods").join(&name);
                        let p = Arc::new(Mutex::new(PikaPod::new(
                            name.clone(),
                            fqdn.clone(),
                            ordinal,
                            net,
                            dir,
                            password,
                            None,
                        )));
                        lock(&self.pikas).insert(name.clone(), Arc::clone(&p));
                        p
                    }
                }
            };
            let (server, addr) = {
                let p = lock(&pika);
                (p.server(), p.addr())
            };
            lock(&self.servers).insert(name.clone(), (server, addr));
            let def = def.clone();
            self.spawn_pod(pod, &comp.full, move |inner, name, incarnation| {
                inner.run_real_pod(name, incarnation, &def, &pika);
            });
            return;
        }
        let existing = lock(&self.volumes).get(&name).cloned();
        let volume = match existing {
            Some(v) => v,
            None => {
                // A new volume: the server is created (and stopped again) before its pod's containers start.
                let mut r = RedisServer::start_with(password.as_deref());
                r.kill();
                let v = Arc::new(Mutex::new(r));
                lock(&self.volumes).insert(name.clone(), Arc::clone(&v));
                v
            }
        };
        let server = format!("{fqdn}:{port}");
        let real = lock(&volume).addr();
        lock(&self.servers).insert(name.clone(), (server.clone(), real.clone()));
        {
            let backing = lock(&self.backing);
            if let Some(codis) = &backing.codis {
                codis.set_override(&server, &real);
            }
            for (_, proxy) in &backing.proxies {
                proxy.set_override(&server, &real);
            }
        }
        let def = def.clone();
        self.spawn_pod(pod, &comp.full, move |inner, name, incarnation| {
            inner.run_pod(name, incarnation, &def, &volume);
        });
    }

    /// Puts `pod` of component `comp` into the world and runs its life (`life(inner, name, incarnation)`) on a
    /// thread of its own.
    fn spawn_pod(self: &Arc<Self>, pod: PodObj, comp: &str, life: impl FnOnce(&Arc<Self>, &str, u64) + Send + 'static) {
        let (name, incarnation) = (pod.name.clone(), pod.incarnation);
        {
            let mut w = self.w();
            w.pods.insert(name.clone(), pod);
            w.touch(&Key::InstanceSet(comp.to_owned()));
            w.touch(&Key::Component(comp.to_owned()));
        }
        self.log(&format!("pod {name} created"));
        let inner = Arc::clone(self);
        let handle = std::thread::Builder::new()
            .name(format!("kbemu-pod-{name}"))
            .spawn(move || life(&inner, &name, incarnation))
            .expect("spawn pod");
        lock(&self.threads).push(handle);
    }

    fn pod_alive(&self, name: &str, incarnation: u64) -> bool {
        !self.stopped() && self.w().pods.get(name).is_some_and(|p| p.incarnation == incarnation && !p.terminating)
    }

    /// A pod's life: the server container's start (pre-start actions, then the server), then role probes.
    fn run_pod(
        self: &Arc<Self>,
        name: &str,
        incarnation: u64,
        def: &ComponentDefinition,
        volume: &Arc<Mutex<RedisServer>>,
    ) {
        let comp = self.w().pods.get(name).map(|p| p.comp.clone()).unwrap_or_default();
        if let Some((container, subcommands)) = self.server_container(def) {
            let data_mount = container.volume_mounts.iter().find(|m| m.name == "data").map(|m| m.mount_path.clone());
            let mut crash_delay = Duration::from_secs(10);
            loop {
                if !self.pod_alive(name, incarnation) {
                    return;
                }
                let mut env = self.w().pods.get(name).map(|p| p.container_env.clone()).unwrap_or_default();
                // The data volume is the stand-in server's directory; its config file stands in for pika.conf.
                if let Some(mount) = &data_mount {
                    let dir = lock(volume).dir().to_path_buf();
                    for value in env.values_mut() {
                        if let Some(rest) = value.strip_prefix(&format!("{mount}/")) {
                            let file = if rest == "pika.conf" { "redis.conf" } else { rest };
                            *value = dir.join(file).display().to_string();
                        }
                    }
                }
                let env = self.deliver(env);
                let mut failed = None;
                for sub in &subcommands {
                    let at = self.clock.now();
                    let argv = vec![self.settings.binary.display().to_string(), sub.clone()];
                    let out = kbagent::run(&argv, &env, None, Some(&self.stop));
                    let result = out.result.clone().map_err(|e| format!("container {}: {sub}: {e}", container.name));
                    self.w().actions.push(ActionRecord {
                        at,
                        action: format!("container:{}:{sub}", container.name),
                        component: comp.clone(),
                        pod: name.to_owned(),
                        argv: vec!["pika-action".into(), sub.clone()],
                        env: redacted(&env),
                        code: out.code,
                        result: result.clone(),
                        stdout: out.stdout,
                        stderr: out.stderr,
                        elapsed: out.elapsed,
                    });
                    if let Err(e) = result {
                        failed = Some(e);
                        break;
                    }
                }
                let Some(e) = failed else { break };
                self.log(&format!("pod {name}: {e}; CrashLoopBackOff {crash_delay:?}"));
                self.warn(&format!("Pod/{name}"), &e);
                self.sleep(crash_delay);
                crash_delay = (crash_delay * 2).min(Duration::from_secs(300));
            }
        }
        if !self.pod_alive(name, incarnation) {
            return;
        }
        lock(volume).restart();
        self.mark_ready(name, incarnation, &comp);
        let port = lock(volume).port();
        self.probe_roles(name, incarnation, def, &comp, &[], Some(port));
    }

    /// A pod's life with a real pika: the pika container (the chart's `pika-start.sh`, which runs `rejoin` and
    /// execs pika), restarted with a growing back-off while it fails, then role probes in the pod's namespace.
    fn run_real_pod(
        self: &Arc<Self>,
        name: &str,
        incarnation: u64,
        def: &ComponentDefinition,
        pika: &Arc<Mutex<PikaPod>>,
    ) {
        let Some(real) = &self.real else { return };
        let comp = self.w().pods.get(name).map(|p| p.comp.clone()).unwrap_or_default();
        let mut crash_delay = Duration::from_secs(10);
        loop {
            if !self.pod_alive(name, incarnation) {
                return;
            }
            let env = self.w().pods.get(name).map(|p| p.container_env.clone()).unwrap_or_default();
            let env = self.deliver(env);
            let at = self.clock.now();
            let started = Instant::now();
            let result = lock(pika).start(&real.network, &real.servers, &self.settings.binary, &env);
            self.w().actions.push(ActionRecord {
                at,
                action: "container:pika:pika-start.sh".to_owned(),
                component: comp.clone(),
                pod: name.to_owned(),
                argv: vec!["/bin/sh".into(), "/scripts/pika-start.sh".into()],
                env: redacted(&env),
                code: Some(i32::from(result.is_err())),
                result: result.clone(),
                stdout: String::new(),
                stderr: result.clone().err().unwrap_or_default(),
                elapsed: started.elapsed(),
            });
            let Err(e) = result else { break };
            self.log(&format!("pod {name}: {e}; CrashLoopBackOff {crash_delay:?}"));
            self.warn(&format!("Pod/{name}"), &e);
            self.sleep(crash_delay);
            crash_delay = (crash_delay * 2).min(Duration::from_secs(300));
        }
        if !self.pod_alive(name, incarnation) {
            lock(pika).kill();
            return;
        }
        self.mark_ready(name, incarnation, &comp);
        let ns = lock(pika).net.ns.clone();
        self.probe_roles(name, incarnation, def, &comp, &real.network.jail(Some(&ns)), None);
    }

    fn mark_ready(&self, name: &str, incarnation: u64, comp: &str) {
        {
            let mut w = self.w();
            let now = self.clock.now();
            if let Some(p) = w.pods.get_mut(name).filter(|p| p.incarnation == incarnation) {
                p.ready = true;
                p.ready_since = Some(now);
            }
            w.touch(&Key::InstanceSet(comp.to_owned()));
            w.touch(&Key::Component(comp.to_owned()));
        }
        self.notify();
        self.log(&format!("pod {name} ready"));
    }

    /// Role probes every period while the pod lives: `prefix` goes before the probe's argv (the real bed's jail
    /// of the pod), `port` replaces PIKA_PORT (a stand-in's loopback port).
    fn probe_roles(
        &self,
        name: &str,
        incarnation: u64,
        def: &ComponentDefinition,
        comp: &str,
        prefix: &[String],
        port: Option<u16>,
    ) {
        let Some(probe) = def.actions().role_probe else { return };
        let period = Duration::from_secs(u64::try_from(probe.period_seconds.unwrap_or(60).max(1)).unwrap_or(60));
        let timeout = Duration::from_secs(u64::try_from(probe.timeout_seconds.unwrap_or(1).max(1)).unwrap_or(1));
        let roles: Vec<(String, i32)> = def.spec.roles.iter().map(|r| (r.name.clone(), r.update_priority)).collect();
        let Ok(argv) = self.argv(&probe) else { return };
        let argv: Vec<String> = prefix.iter().cloned().chain(argv).collect();
        while self.pod_alive(name, incarnation) {
            let mut env = self.w().pods.get(name).map(|p| p.agent_env.clone()).unwrap_or_default();
            if let Some(port) = port {
                // In the pod, 127.0.0.1:<PIKA_PORT> is its own server.
                env.insert("PIKA_PORT".into(), port.to_string());
            }
            let out = kbagent::run(&argv, &self.deliver(env), Some(timeout), Some(&self.stop));
            let effect = instanceset::probe_effect(self.settings.line, out.result.is_ok(), &out.stdout, &roles);
            let changed = {
                let mut w = self.w();
                let change = w.pods.get_mut(name).filter(|p| p.incarnation == incarnation).and_then(|p| {
                    let before = p.role.clone();
                    match effect {
                        ProbeEffect::Set(r) => p.role = Some(r),
                        ProbeEffect::Remove => p.role = None,
                        ProbeEffect::Keep(_) => {}
                    }
                    (p.role != before).then(|| (before, p.role.clone()))
                });
                if change.is_some() {
                    w.touch(&Key::InstanceSet(comp.to_owned()));
                    w.touch(&Key::Component(comp.to_owned()));
                }
                change
            };
            if let Some((before, after)) = changed {
                self.log(&format!("pod {name} role {before:?} -> {after:?}"));
                self.notify();
            }
            self.sleep(period.max(self.clock.emulated(retry::PROBE_FLOOR)));
        }
    }

    /// Deletes a pod through the API: its server stops as the kubelet stops it; `drop_volume` also drops its data
    /// afterwards (scale-in, a PVC deleted with its pod).
    pub(crate) fn delete_pod(&self, name: &str, drop_volume: bool) {
        self.remove_pod(name, drop_volume, true);
    }

    /// A pod lost with its node and volume: its server is killed (no hook, no SIGTERM: the node is gone), its data
    /// dropped, and the pod removed.
    pub(crate) fn lose_pod(&self, name: &str) {
        self.remove_pod(name, true, false);
    }

    fn remove_pod(&self, name: &str, drop_volume: bool, graceful: bool) {
        let password = {
            let w = self.w();
            let Some(p) = w.pods.get(name) else { return };
            p.container_env.get("PIKA_PASSWORD").cloned()
        };
        // The pod's servers stop (and a dropped volume goes) before the pod leaves the world: its InstanceSet may
        // recreate it at once, and the new pod must find neither the old process nor, when dropped, its data.
        if drop_volume {
            lock(&self.servers).remove(name);
        }
        let pika = if drop_volume { lock(&self.pikas).remove(name) } else { lock(&self.pikas).get(name).cloned() };
        if let Some(p) = pika {
            let mut p = lock(&p);
            // As the kubelet stops it, whatever becomes of its volume: the chart's preStop hook, SIGTERM, then
            // SIGKILL at the end of the grace period.
            if graceful {
                p.stop();
            }
            if drop_volume {
                p.lose_volume();
            }
        }
        let volume =
            if drop_volume { lock(&self.volumes).remove(name) } else { lock(&self.volumes).get(name).cloned() };
        if let Some(v) = volume {
            let mut server = lock(&v);
            if !drop_volume && server.is_running() {
                // Pika keeps its data on the volume; the stand-in server writes it there before it stops.
                let _ = resp(server.port(), password.as_deref(), &["SAVE"]);
            }
            server.kill();
        }
        let comp = {
            let mut w = self.w();
            let Some(p) = w.pods.remove(name) else { return };
            w.touch(&Key::InstanceSet(p.comp.clone()));
            w.touch(&Key::Component(p.comp.clone()));
            p.comp
        };
        self.log(&format!("pod {name} of {comp} deleted"));
        self.notify();
    }
}

/// A container's environment as an action record keeps it: passwords redacted.
fn redacted(env: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    env.iter().map(|(k, v)| (k.clone(), if k.contains("PASSWORD") { "<redacted>".into() } else { v.clone() })).collect()
}

/// One command to a local server over RESP, `None` when it does not answer (never panics).
fn resp(port: u16, password: Option<&str>, args: &[&str]) -> Option<String> {
    use std::io::{BufRead, BufReader, Write};
    let stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut writer = stream.try_clone().ok()?;
    let mut reader = BufReader::new(stream);
    let mut send = |args: &[&str]| -> Option<String> {
        let mut out = format!("*{}\r\n", args.len());
        for a in args {
            out.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        writer.write_all(out.as_bytes()).ok()?;
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        Some(line.trim_end().to_owned())
    };
    if let Some(p) = password.filter(|p| !p.is_empty()) {
        send(&["AUTH", p])?;
    }
    send(args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entities_are_ordered_by_stage_with_the_previous_stage_as_predecessors() {
        let order =
            vec!["etcd".to_owned(), "codis-dashboard".to_owned(), "pika".to_owned(), "codis-proxy,codis-fe".to_owned()];
        let entities: Vec<String> =
            ["codis-fe", "pika", "etcd", "codis-proxy"].iter().map(|s| (*s).to_owned()).collect();
        let got = Inner::ordered(&order, &entities);
        let names: Vec<&str> = got.iter().map(|(e, _)| e.as_str()).collect();
        assert_eq!(names, vec!["etcd", "pika", "codis-proxy", "codis-fe"]);
        assert_eq!(got[1].1, vec!["codis-dashboard".to_owned()]);
        assert_eq!(got[2].1, vec!["pika".to_owned()]);
    }
}
