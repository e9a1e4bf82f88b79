//! What the reliability suite's attacks share: a non-panicking RESP client for watching redis-servers that may be
//! down or frozen, a watcher that checks Codis's and the pikas' invariants while actions run, a steady writer whose
//! acknowledged writes must survive, running the real binary without panicking, and etcd inspection.
//!
//! Declared with `#[path = "support/attack.rs"] mod attack;` next to `mod support;`.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Output;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::support::{describe, run, Bed, NAMESPACE};

// ---- running the binary ----------------------------------------------------------------------------------------

/// Runs `action` until it exits 0, rerunning on 75 as KubeBlocks requeues, at most `runs` times; any other exit is
/// an error carrying the run's output (the caller decides whether that fails a trial).
pub fn run_until_done(action: &str, env: &BTreeMap<String, String>, runs: usize) -> Result<Vec<Output>, String> {
    let mut outputs = Vec::new();
    for _ in 0..runs {
        let out = run(action, env);
        let code = out.status.code();
        outputs.push(out);
        match code {
            Some(0) => return Ok(outputs),
            Some(75) => continue,
            _ => return Err(format!("{action}: {}", describe(outputs.last().expect("one run")))),
        }
    }
    Err(format!("{action} did not finish in {runs} runs: {}", outputs.last().map(describe).unwrap_or_default()))
}

/// stdout and stderr of a run, as text.
pub fn texts(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

// ---- etcd --------------------------------------------------------------------------------------------------------

/// Runs `f` with a client of the bed's etcd and this cluster's key prefix.
pub fn with_etcd<T, F: std::future::Future<Output = T>>(
    bed: &Bed,
    f: impl FnOnce(pika_action::clients::etcd::Etcd, String) -> F,
) -> T {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let etcd = crate::support::connect_etcd(&bed.cluster.etcd.endpoint()).await.expect("etcd");
        f(etcd, pika_action::clients::etcd::cluster_prefix(NAMESPACE, &bed.cluster.name)).await
    })
}

/// A proxy that Codis onlined and can no longer reach: started, onlined, stopped, and seen unreachable by the
/// dashboard's stats (the stopped proxy is returned for its token and address).
pub fn dead_proxy(bed: &Bed) -> testbed::ProxyDouble {
    let proxy = testbed::ProxyDouble::start(bed.codis.product());
    let x = bed.codis.xauth().to_owned();
    assert!(bed.codis.call("PUT", &format!("/api/topom/proxy/online/{x}/{}", proxy.addr())).is_ok());
    proxy.stop();
    let token = proxy.token();
    assert!(bed
        .codis
        .wait_for(Duration::from_secs(5), |s| s.proxy_stats.get(&token).is_some_and(|e| e.error.is_some()))
        .is_some());
    proxy
}

/// Every key of this cluster in etcd with its value.
pub fn etcd_entries(bed: &Bed) -> BTreeMap<String, String> {
    with_etcd(bed, |etcd, prefix| async move {
        etcd.list(&prefix).await.expect("list").into_iter().map(|(k, e)| (k, e.value)).collect()
    })
}

/// What the lease of a killed process expiring does, without waiting its TTL out: its lock keys go.
pub fn expire_locks(bed: &Bed) {
    with_etcd(bed, |etcd, prefix| async move {
        for (key, _) in etcd.list(&prefix).await.expect("list") {
            if key.contains("/locks/") {
                etcd.delete(&key).await.expect("delete");
            }
        }
    });
}

/// The keys of the cluster's locks in etcd (a lock is held while its key exists).
pub fn held_locks(bed: &Bed) -> Vec<String> {
    with_etcd(bed, |etcd, prefix| async move {
        etcd.list(&prefix)
            .await
            .expect("list")
            .into_iter()
            .map(|(key, _)| key)
            .filter(|k| k.contains("/locks/"))
            .collect()
    })
}

// ---- RESP ----------------------------------------------------------------------------------------------------------

/// A connection to a redis-server that never panics: every failure is an `Err` with the reason.
pub use testbed::process::RespConnection as Resp;

/// One command on a fresh connection.
pub fn resp(addr: &str, password: Option<&str>, args: &[&str]) -> Result<String, String> {
    Resp::connect(addr, password, Duration::from_millis(500))?.command(args)
}

/// The `role:` a redis-server reports, or why it could not be asked.
pub fn role_at(addr: &str, password: Option<&str>) -> Result<String, String> {
    let info = resp(addr, password, &["INFO", "replication"])?;
    testbed::process::info_field(&info, "role").ok_or_else(|| format!("{addr}: no role in {info:?}"))
}

// ---- the watcher -------------------------------------------------------------------------------------------------

/// What [`watch`] saw.
#[derive(Debug, Default)]
pub struct Watched {
    /// Broken invariants, each with what was seen.
    pub violations: Vec<String>,
    /// Observations made.
    pub observations: usize,
    /// Observations in which one group had two pika masters (the old master awaiting demotion and the new one).
    pub two_masters: usize,
}

/// Watches Codis and the pikas every few milliseconds while `f` runs, checking at every observation:
///
/// - no slot lost: a slot that had an owner never goes back to group 0, and every slot's owner and migration target
///   is a group that exists (a group is never removed while it owns a slot or one is migrating to it);
/// - a group that owns slots never has no server;
/// - each server is in at most one group;
/// - in every group that existed when the watch began, every pika reporting `role:master` is a server Codis listed
///   at index 0 at some point of the watch (the new master, or the old one while it waits to be demoted): never a
///   third, never a replica that was promoted behind Codis's back.
pub fn watch<T>(bed: &Bed, f: impl FnOnce() -> T) -> (T, Watched) {
    let stop = AtomicBool::new(false);
    let password = bed.cluster.password.clone();
    let overrides = bed.cluster.overrides();
    std::thread::scope(|scope| {
        let watcher = scope.spawn(|| {
            let mut seen = Watched::default();
            let first = bed.codis.snapshot();
            let established: BTreeSet<u32> = first.groups.iter().map(|g| g.id).collect();
            let mut owned: BTreeSet<usize> = first.slots.iter().filter(|s| s.group_id != 0).map(|s| s.id).collect();
            let mut masters_seen: BTreeMap<u32, BTreeSet<String>> = first
                .groups
                .iter()
                .filter_map(|g| g.master().map(|m| (g.id, BTreeSet::from([m.to_owned()]))))
                .collect();
            let total = first.slots.len();
            let mut rounds = 0usize;
            loop {
                let stopping = stop.load(Ordering::SeqCst);
                let before = bed.codis.snapshot();
                for g in &before.groups {
                    if let Some(m) = g.master() {
                        masters_seen.entry(g.id).or_default().insert(m.to_owned());
                    }
                }
                check_codis(&before, total, &mut owned, &mut seen.violations);
                // The pikas, only every few rounds: each costs a connection per server.
                if rounds.is_multiple_of(4) {
                    let mut roles: BTreeMap<u32, BTreeSet<String>> = BTreeMap::new();
                    for g in before.groups.iter().filter(|g| established.contains(&g.id)) {
                        for s in &g.servers {
                            let Some(addr) = overrides.get(&s.server) else { continue };
                            if role_at(addr, password.as_deref()).is_ok_and(|r| r == "master") {
                                roles.entry(g.id).or_default().insert(s.server.clone());
                            }
                        }
                    }
                    let after = bed.codis.snapshot();
                    for g in &after.groups {
                        if let Some(m) = g.master() {
                            masters_seen.entry(g.id).or_default().insert(m.to_owned());
                        }
                    }
                    for (gid, masters) in &roles {
                        let allowed = masters_seen.get(gid).cloned().unwrap_or_default();
                        let strangers: Vec<&String> = masters.iter().filter(|m| !allowed.contains(*m)).collect();
                        if !strangers.is_empty() {
                            seen.violations.push(format!(
                                "group {gid}: pika master(s) {strangers:?} that codis never listed as master \
                                 (masters now {masters:?}, codis masters so far {allowed:?})"
                            ));
                        }
                        if masters.len() > 1 {
                            seen.two_masters += 1;
                        }
                        if masters.len() > 2 {
                            seen.violations
                                .push(format!("group {gid}: {} pika masters at once: {masters:?}", masters.len()));
                        }
                    }
                }
                seen.observations += 1;
                rounds += 1;
                if stopping {
                    return seen;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        // Stops the watcher even when `f` panics, or the scope would wait for it forever.
        struct StopOnDrop<'a>(&'a AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let guard = StopOnDrop(&stop);
        let result = f();
        drop(guard);
        let mut seen = watcher.join().expect("watcher");
        seen.violations.dedup();
        (result, seen)
    })
}

fn check_codis(snap: &testbed::Snapshot, total: usize, owned: &mut BTreeSet<usize>, violations: &mut Vec<String>) {
    if snap.slots.len() != total {
        violations.push(format!("{} slots instead of {total}", snap.slots.len()));
    }
    let groups: BTreeSet<u32> = snap.groups.iter().map(|g| g.id).collect();
    for slot in &snap.slots {
        if slot.group_id == 0 {
            if owned.contains(&slot.id) {
                violations.push(format!("slot {} lost its owner", slot.id));
            }
        } else {
            owned.insert(slot.id);
            if !groups.contains(&slot.group_id) {
                violations.push(format!("slot {} is owned by group {}, which does not exist", slot.id, slot.group_id));
            }
        }
        if !slot.action.state.is_nothing() && !groups.contains(&slot.action.target_id) {
            violations
                .push(format!("slot {} migrates to group {}, which does not exist", slot.id, slot.action.target_id));
        }
    }
    let mut listed: BTreeMap<&str, u32> = BTreeMap::new();
    for g in &snap.groups {
        if g.servers.is_empty() && snap.slots.iter().any(|s| s.group_id == g.id) {
            violations.push(format!("group {} owns slots but has no server", g.id));
        }
        for s in &g.servers {
            if let Some(other) = listed.insert(&s.server, g.id) {
                violations.push(format!("{} is in groups {other} and {}", s.server, g.id));
            }
        }
    }
}

// ---- the writer --------------------------------------------------------------------------------------------------

/// What a [`Writer`] did.
#[derive(Debug, Default)]
pub struct Written {
    /// Writes sent.
    pub sent: usize,
    /// Writes acknowledged: replicated to every replica of the group (`WAIT`), with Codis listing the same master
    /// before and after and no promote in between (what a proxy would have routed).
    pub acked: Vec<u64>,
}

/// A steady writer: increasing counters `SET <prefix>:<n> <n>` to the group's master as Codis lists it, each
/// followed by `WAIT <replicas> 1000`.
pub struct Writer {
    stop: std::sync::Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<Written>>,
    prefix: String,
}

impl Writer {
    /// Starts writing to the group serving shard `index` of `bed`.
    pub fn start(bed: &Bed, index: usize, prefix: &str) -> Self {
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&stop);
        let overrides = bed.cluster.overrides();
        let password = bed.cluster.password.clone();
        let servers: BTreeSet<String> = bed.cluster.shards[index].pods.iter().map(|p| p.server()).collect();
        let url = bed.codis.url();
        let xauth = bed.codis.xauth().to_owned();
        let key = prefix.to_owned();
        let handle = std::thread::spawn(move || {
            let mut done = Written::default();
            let mut conn: Option<(String, Resp)> = None;
            let mut n = 0u64;
            while !flag.load(Ordering::SeqCst) {
                n += 1;
                let Some((master, replicas)) = codis_master(&url, &xauth, &servers) else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                let Some(addr) = overrides.get(&master).cloned() else { continue };
                if conn.as_ref().is_none_or(|(a, _)| *a != addr) {
                    conn = Resp::connect(&addr, password.as_deref(), Duration::from_secs(2))
                        .ok()
                        .map(|c| (addr.clone(), c));
                }
                let Some((_, c)) = conn.as_mut() else { continue };
                done.sent += 1;
                let value = n.to_string();
                let set = c.command(&["SET", &format!("{key}:{n}"), &value]);
                let wait = c.command(&["WAIT", &replicas.to_string(), "1000"]);
                if set.as_deref() != Ok("+OK") {
                    conn = None;
                    continue;
                }
                let acked =
                    wait.ok().and_then(|w| w.trim_start_matches(':').parse::<usize>().ok()).unwrap_or(0) >= replicas;
                let still = codis_master(&url, &xauth, &servers).map(|(m, _)| m);
                if acked && still.as_deref() == Some(master.as_str()) {
                    done.acked.push(n);
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            done
        });
        Self { stop, handle: Some(handle), prefix: prefix.to_owned() }
    }

    /// Stops writing and returns what was written.
    pub fn stop(mut self) -> Written {
        self.stop.store(true, Ordering::SeqCst);
        self.handle.take().expect("running").join().expect("writer")
    }

    /// The acknowledged writes missing (or wrong) on the master Codis lists for shard `index` now.
    pub fn lost(bed: &Bed, index: usize, prefix: &str, written: &Written) -> Vec<u64> {
        let servers: BTreeSet<String> = bed.cluster.shards[index].pods.iter().map(|p| p.server()).collect();
        let Some((master, _)) = codis_master(&bed.codis.url(), bed.codis.xauth(), &servers) else {
            return written.acked.clone();
        };
        let addr = bed.cluster.overrides()[&master].clone();
        let Ok(mut c) = Resp::connect(&addr, bed.cluster.password.as_deref(), Duration::from_secs(2)) else {
            return written.acked.clone();
        };
        written
            .acked
            .iter()
            .copied()
            .filter(|n| c.command(&["GET", &format!("{prefix}:{n}")]).as_deref() != Ok(n.to_string().as_str()))
            .collect()
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// The master Codis lists for the group holding any of `servers`, and its number of replicas; `None` while the group
/// is promoting (a proxy would hold the request) or cannot be read. Read over HTTP so that the writer thread needs
/// no handle on the double.
fn codis_master(url: &str, xauth: &str, servers: &BTreeSet<String>) -> Option<(String, usize)> {
    let addr = url.trim_start_matches("http://");
    let mut stream = TcpStream::connect_timeout(&addr.parse().ok()?, Duration::from_millis(500)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(stream, "GET /api/topom/stats/{xauth} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).ok()?;
    let body = reply.split_once("\r\n\r\n")?.1;
    let stats: serde_json::Value = serde_json::from_str(body).ok()?;
    let groups: Vec<testbed::codis::Group> = serde_json::from_value(stats["group"]["models"].clone()).ok()?;
    let group = groups.iter().find(|g| g.servers.iter().any(|s| servers.contains(&s.server)))?;
    if !group.promoting.state.is_nothing() {
        return None;
    }
    Some((group.master()?.to_owned(), group.servers.len().saturating_sub(1)))
}

/// Waits until every replica of shard `index`'s group follows Codis's master with the link up (bounded).
pub fn settled(bed: &Bed, index: usize, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let password = bed.cluster.password.clone();
    let overrides = bed.cluster.overrides();
    while Instant::now() < deadline {
        let snap = bed.codis.snapshot();
        let server = bed.cluster.shards[index].pods.iter().find_map(|p| snap.server(&p.server()).map(|(g, _)| g.id));
        if let Some(group) = server.and_then(|gid| snap.group(gid)) {
            let master = group.master().and_then(|m| overrides.get(m)).cloned().unwrap_or_default();
            let ok = group.servers.iter().enumerate().all(|(i, s)| {
                let Some(addr) = overrides.get(&s.server) else { return false };
                let Ok(info) = resp(addr, password.as_deref(), &["INFO", "replication"]) else { return false };
                let field = |k: &str| testbed::process::info_field(&info, k).unwrap_or_default();
                if i == 0 {
                    field("role") == "master"
                } else {
                    field("role") == "slave"
                        && format!("{}:{}", field("master_host"), field("master_port")) == master
                        && field("master_link_status") == "up"
                }
            });
            if ok {
                return true;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// Collects lines from several threads.
#[derive(Default)]
pub struct Notes(Mutex<Vec<String>>);

impl Notes {
    /// Adds a line.
    pub fn push(&self, line: String) {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(line);
    }

    /// Every line.
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }
}
