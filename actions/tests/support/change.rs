//! What the tests of many shards in one change share: a fixture cluster with a proxy online in Codis (its data port
//! is where a `Workload` writes), the slot moves counted from every state change of the double (a slot that moved
//! twice counts twice), and the ways KubeBlocks calls one change's actions: concurrently, or one after another as a
//! 1.1 reconcile does, each shuffled.
//!
//! Declared with `#[path = "support/change.rs"] mod change;` next to `mod support;`.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::process::Output;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use testbed::{DoubleOptions, Ledger, ProxyDouble, ProxyOptions, Workload, WorkloadOptions};

use crate::support::{describe, run, Bed, ClusterBuilder, ClusterFixture, NAMESPACE};

pub type Env = BTreeMap<String, String>;

/// The proxy's admin address as Codis registers it.
const PROXY: &str = "codis-proxy-0.codis-proxy-headless.ns-tb.svc.cluster.local:11080";

/// A cluster of `shards` shards over `slots` slots, a proxy online in Codis and following the pods.
pub struct Change {
    pub bed: Bed,
    pub proxy: ProxyDouble,
}

impl Change {
    /// The cluster `cluster` describes, over `slots` slots.
    pub fn new(cluster: ClusterBuilder, slots: usize) -> Self {
        Self::with(cluster.build(), DoubleOptions { max_slot_num: slots, ..DoubleOptions::default() })
    }

    pub fn with(cluster: ClusterFixture, opts: DoubleOptions) -> Self {
        let slots = opts.max_slot_num;
        let bed = Bed::with(cluster, opts);
        let proxy = ProxyDouble::start_with(ProxyOptions {
            admin_addr: Some(PROXY.into()),
            overrides: bed.cluster.overrides(),
            max_slot_num: slots,
            ..ProxyOptions::new(bed.codis.product())
        });
        bed.codis.set_override(PROXY, &proxy.addr());
        let reply = bed.codis.call("PUT", &format!("/api/topom/proxy/online/{{xauth}}/{PROXY}"));
        assert!(reply.is_ok(), "proxy online: {reply:?}");
        Self { bed, proxy }
    }

    /// Adds a shard of `pods` pods; Codis and the proxy learn where its pods are.
    pub fn add_shard(&mut self, pods: usize) -> usize {
        let index = self.bed.add_shard(pods);
        for (server, real) in self.bed.cluster.overrides() {
            self.proxy.set_override(&server, &real);
        }
        index
    }

    pub fn gids(&self, shards: &[usize]) -> Vec<u32> {
        shards.iter().map(|&i| self.bed.gid(i).unwrap_or_else(|| panic!("shard {i} has no group"))).collect()
    }

    /// The environment of shard `index`, the proxy's admin API among the overrides (a planned switchover holds
    /// writes there).
    pub fn env(&self, index: usize) -> Env {
        let mut env = self.bed.env(index);
        let overrides = env.entry("PIKA_ADDRESS_OVERRIDES".into()).or_default();
        if !overrides.is_empty() {
            overrides.push(',');
        }
        overrides.push_str(&format!("{PROXY}={}", self.proxy.addr()));
        env
    }

    /// The 1.1 environment of shard `index` with `listed` shards in `ALL_SHARDS_POD_FQDNS`.
    pub fn env_1_1(&self, index: usize, listed: &[usize]) -> Env {
        let mut env = self.env(index);
        env.insert("ALL_SHARDS_POD_FQDNS".into(), self.bed.cluster.all_shards_of(listed));
        env
    }

    /// The 1.0 environment of shard `index`: `listed` shards exist (the var and the legacy lists name them),
    /// `deleting` of them are being deleted.
    pub fn env_1_0(&self, index: usize, listed: &[usize], deleting: &[usize]) -> Env {
        let mut env = self.env_1_1(index, listed);
        env.remove("KUBEBLOCKS_LINE");
        let short = |i: &usize| self.bed.cluster.shards[*i].short.clone();
        let mut all = vec!["etcd".to_owned(), "codis-dashboard".to_owned()];
        all.extend(listed.iter().map(short));
        all.extend(["codis-proxy".to_owned(), "codis-fe".to_owned()]);
        let deleting: Vec<String> = deleting.iter().map(short).collect();
        let undeleted: Vec<String> = all.iter().filter(|c| !deleting.contains(c)).cloned().collect();
        env.insert("KB_CLUSTER_COMPONENT_LIST".into(), all.join(","));
        env.insert("KB_CLUSTER_COMPONENT_DELETING_LIST".into(), deleting.join(","));
        env.insert("KB_CLUSTER_COMPONENT_UNDELETED_LIST".into(), undeleted.join(","));
        env
    }

    /// Starts counting slot moves: every change of a slot's owner from now on.
    pub fn count_moves(&self) {
        self.bed.codis.start_owner_trace();
    }

    /// Slot moves since [`Change::count_moves`]: every time a slot owned by a group changed owner.
    pub fn moves(&self) -> usize {
        slot_moves(&self.bed.codis.take_owner_trace()).count()
    }

    /// Keys written through the proxy before the change, and a writer running through it during the change.
    pub fn start_writing(&self, preload: usize) -> (Ledger, Workload) {
        let ledger = Ledger::preload(&self.proxy.data_addr(), "pre", preload).expect("preload through the proxy");
        let writer = Workload::start(WorkloadOptions::through(&[self.proxy.data_addr()]));
        assert!(writer.wait_for_acked(50, Duration::from_secs(20)), "the writer does not get through the proxy");
        (ledger, writer)
    }

    /// Stops the writer and reads every acknowledged key back, through the proxy and from the groups' masters.
    pub fn check_no_key_lost(&self, mut ledger: Ledger, writer: Workload) {
        let written = writer.stop();
        assert!(written.acked.len() > 50, "the writer got {} writes through", written.acked.len());
        ledger.merge(written);
        ledger.verify_kept(&self.proxy.data_addr(), &self.bed.codis).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Every slot in `gids`, balanced, nothing migrating, the groups of `gone` removed with their servers.
    pub fn assert_done(&self, gids: &[u32], gone: &[usize]) {
        self.bed.assert_balanced(gids);
        let snap = self.bed.codis.snapshot();
        assert!(snap.with_action().is_empty(), "slot actions left");
        for &i in gone {
            let shard = &self.bed.cluster.shards[i];
            for pod in &shard.pods {
                assert!(snap.server(&pod.server()).is_none(), "{} is still registered", pod.name);
            }
        }
        for g in &snap.groups {
            let aliases: Vec<&str> = g.servers.iter().map(|gs| gs.server.as_str()).filter(|s| is_alias(s)).collect();
            assert!(aliases.is_empty(), "group {} still lists the alias(es) {aliases:?}", g.id);
        }
        let expected: usize = gids.len();
        assert_eq!(
            snap.groups.len(),
            expected,
            "groups left: {:?}",
            snap.groups.iter().map(|g| g.id).collect::<Vec<_>>()
        );
    }
}

/// Whether a registered server is an alias: its host spelled with the DNS root's trailing dot.
pub fn is_alias(server: &str) -> bool {
    server.rsplit_once(':').is_some_and(|(host, _)| host.ends_with('.'))
}

impl Change {
    /// Every group's master holds keys of its own slots only: nothing a split copied and did not delete.
    pub fn assert_no_stray_keys(&self) {
        let snap = self.bed.codis.snapshot();
        let owners = self.bed.owners();
        for g in &snap.groups {
            let Some(master) = g.servers.first() else { continue };
            let real = self.bed.codis.real_addr(&master.server);
            let pods = self.bed.cluster.shards.iter().flat_map(|sh| &sh.pods);
            let pod = pods
                .clone()
                .find(|p| p.redis.addr() == real)
                .unwrap_or_else(|| panic!("group {}'s master {} is no pod", g.id, master.server));
            let strays = keys_not_owned(&pod.redis, &owners, g.id);
            assert!(
                strays.is_empty(),
                "group {} holds {} key(s) of slots it does not own, e.g. {:?}",
                g.id,
                strays.len(),
                strays.first()
            );
        }
    }
}

/// The keys on `server` whose slot `owners` does not give to `gid`.
pub fn keys_not_owned(server: &testbed::process::RedisServer, owners: &[u32], gid: u32) -> Vec<String> {
    let mut found = Vec::new();
    let mut cursor = "0".to_owned();
    loop {
        let reply = server.command(&["SCAN", &cursor, "COUNT", "1000"]);
        let mut lines = reply.lines();
        cursor = lines.next().unwrap_or("0").to_owned();
        let slot = |k: &str| testbed::codis::slothash::slot_of(k.as_bytes(), owners.len());
        found.extend(lines.filter(|k| owners[slot(k)] != gid).map(str::to_owned));
        if cursor == "0" {
            return found;
        }
    }
}

/// Every slot move in an owner trace (as [`testbed::CodisDouble::take_owner_trace`] records it): a slot owned by a
/// group that changed owner, as `(when, from, to)`.
pub fn slot_moves(trace: &[(Duration, Vec<u32>)]) -> impl Iterator<Item = (Duration, u32, u32)> + '_ {
    trace.windows(2).flat_map(|w| {
        let when = w[1].0;
        w[0].1.iter().zip(&w[1].1).filter(|(from, to)| **from != 0 && from != to).map(move |(&f, &t)| (when, f, t))
    })
}

/// The most slots one group sends or receives between two slot tables: Codis's executor takes at most one slot per
/// group into a round, so no change between them finishes in fewer executor rounds.
pub fn busiest(before: &[u32], after: &[u32]) -> usize {
    let mut per: BTreeMap<u32, usize> = BTreeMap::new();
    for (b, a) in before.iter().zip(after) {
        if *b != 0 && b != a {
            *per.entry(*b).or_default() += 1;
            *per.entry(*a).or_default() += 1;
        }
    }
    per.values().copied().max().unwrap_or(0)
}

/// A shuffled copy of `items`, from a seed printed so that a failing order can be replayed (`SCALE_ORDER_SEED`).
pub fn shuffled<T: Clone + std::fmt::Debug>(items: &[T], what: &str) -> Vec<T> {
    let seed = std::env::var("SCALE_ORDER_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        SystemTime::now().duration_since(UNIX_EPOCH).map(|d| u64::from(d.subsec_nanos())).unwrap_or(7)
    });
    let mut state = seed | 1;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut out = items.to_vec();
    for i in (1..out.len()).rev() {
        let j = usize::try_from(next() % (i as u64 + 1)).expect("index");
        out.swap(i, j);
    }
    eprintln!("{what}: order {out:?} (SCALE_ORDER_SEED={seed})");
    out
}

/// Runs `action` until it exits 0, pausing `pause` after each exit 75 (KubeBlocks requeues it), at most `runs`
/// times; panics on any other exit.
pub fn until_done(action: &str, env: &Env, pause: Duration, runs: usize) -> Vec<Output> {
    let mut outputs = Vec::new();
    for _ in 0..runs {
        let out = run(action, env);
        let code = out.status.code();
        outputs.push(out);
        match code {
            Some(0) => return outputs,
            Some(75) => std::thread::sleep(pause),
            _ => panic!("{action}: {}", describe(outputs.last().expect("a run"))),
        }
    }
    panic!("{action} did not finish in {runs} runs: {}", describe(outputs.last().expect("a run")));
}

/// Starts every action at once, each in its own thread (spawned in the order given, `stagger` apart), each rerun
/// on 75 until it exits 0.
pub fn concurrently(actions: &[(&str, Env)], stagger: Duration, pause: Duration) -> Vec<Vec<Output>> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = actions
            .iter()
            .map(|(action, env)| {
                let handle = scope.spawn(move || until_done(action, env, pause, 40));
                std::thread::sleep(stagger);
                handle
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("action thread")).collect()
    })
}

/// What a KubeBlocks 1.1 reconcile does with one change's shardAdds or shardRemoves: calls them one after another,
/// each to its end, in the order given; the ones that failed (exit 75) are called again in the next reconcile, after
/// the controller's backoff (5 ms doubling). Returns how many reconciles it took.
pub fn one_after_another(actions: &[(&str, Env)]) -> usize {
    use testbed::kubeblocks::retry::{one_call_each, Ended, BACKOFF_MAX};
    let started = Instant::now();
    let r = one_call_each(actions, 40, BACKOFF_MAX, |a| run(a.0, &a.1));
    match r.ended {
        Ended::Done => {
            eprintln!("done in {} reconcile(s), {:.1?}", r.passes, started.elapsed());
            r.passes
        }
        Ended::Failed => panic!("reconcile {}: {}", r.passes, r.outputs.last().map(describe).unwrap_or_default()),
        Ended::OutOfPasses => panic!("the change did not finish in 40 reconciles"),
    }
}

/// Holds the cluster's topology lock in etcd, as another action would, until dropped.
pub struct HeldLock {
    runtime: tokio::runtime::Runtime,
    guard: Option<pika_action::clients::etcd::LockGuard>,
}

impl HeldLock {
    pub fn take(bed: &Bed) -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let guard = runtime.block_on(async {
            let etcd = crate::support::connect_etcd(&bed.cluster.etcd.endpoint()).await.expect("etcd");
            let key =
                format!("{}/locks/topology", pika_action::clients::etcd::cluster_prefix(NAMESPACE, &bed.cluster.name));
            etcd.lock(&key, Duration::from_secs(15), Duration::from_secs(5), "the test").await.expect("lock")
        });
        Self { runtime, guard: Some(guard) }
    }
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        if let Some(mut guard) = self.guard.take() {
            let _ = self.runtime.block_on(guard.release());
        }
    }
}

/// The shards recorded as leaving in etcd.
pub fn recorded_leavers(bed: &Bed) -> Vec<String> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let etcd = crate::support::connect_etcd(&bed.cluster.etcd.endpoint()).await.expect("etcd");
        let dir = format!("{}/leaving/", pika_action::clients::etcd::cluster_prefix(NAMESPACE, &bed.cluster.name));
        etcd.list(&dir).await.expect("list").into_iter().map(|(_, e)| e.value).collect()
    })
}
