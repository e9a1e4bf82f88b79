//! What the failover tests share: a provisioned cluster over the test bed with a proxy double serving its data port
//! (online, every slot routed), optionally a partitionable [`Forwarder`] in front of every pod (what every client —
//! the dashboard double, the proxy, replicas, pika-action — dials instead of the redis-server); `pika-action watch`
//! processes; a sampler of every pod's `INFO replication` role, Codis's master and the proxy's routes; a paced writer
//! that records when each write was sent and acknowledged; and `rejoin` as the pika container runs it.
//!
//! Declared with `mod failover_bed;` next to `mod support;` (it uses it).
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::{describe, eventually, run, run_to_completion, Bed, ClusterFixture, PodFixture, NAMESPACE};
use testbed::{DoubleOptions, Forwarder, Ledger, ProxyDouble, ProxyOptions};

/// Generous bound for anything a test waits for: a hang detector, not a timing check.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// How the bed is built.
#[derive(Debug, Clone)]
pub struct Options {
    /// Shards.
    pub shards: usize,
    /// Pods per shard.
    pub pods: usize,
    /// A forwarder in front of every pod.
    pub forwarders: bool,
    /// The dashboard double's options (overrides and product are filled in).
    pub double: DoubleOptions,
}

impl Default for Options {
    /// One shard of one pod, no forwarders, the double's defaults.
    fn default() -> Self {
        Self { shards: 1, pods: 1, forwarders: false, double: DoubleOptions::default() }
    }
}

impl Options {
    /// How many shards.
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = shards;
        self
    }

    /// How many pods each shard has.
    pub fn pods(mut self, pods: usize) -> Self {
        self.pods = pods;
        self
    }
}

/// A provisioned cluster with a proxy serving it.
pub struct FailoverBed {
    /// The cluster and the dashboard double.
    pub bed: Bed,
    /// The proxy double, online, with every slot routed.
    pub proxy: ProxyDouble,
    /// Registered server → its forwarder, when built with forwarders.
    pub forwarders: BTreeMap<String, Forwarder>,
    logs: tempfile::TempDir,
}

impl FailoverBed {
    /// Builds, provisions (post-provision, as KubeBlocks runs it) and onlines the proxy.
    pub fn new(opts: Options) -> Self {
        let cluster = ClusterFixture::builder().shards(opts.shards).pods(opts.pods).build();
        let forwarders: BTreeMap<String, Forwarder> = if opts.forwarders {
            cluster.overrides().into_iter().map(|(server, real)| (server, Forwarder::start(&real))).collect()
        } else {
            BTreeMap::new()
        };
        let mut routes = cluster.overrides();
        for (server, fwd) in &forwarders {
            routes.insert(server.clone(), fwd.addr());
        }
        let product = format!("{}-codis", cluster.name);
        let proxy = ProxyDouble::start_with(ProxyOptions {
            overrides: routes.clone(),
            max_slot_num: opts.double.max_slot_num,
            ..ProxyOptions::new(&product)
        });
        let bed = Bed::with(cluster, opts.double);
        for (server, dial) in &routes {
            bed.codis.set_override(server, dial);
        }
        let fb = Self { bed, proxy, forwarders, logs: tempfile::tempdir().expect("temp dir") };
        run_to_completion("post-provision", &fb.env(0));
        let reply = fb.bed.codis.call("PUT", &format!("/api/topom/proxy/online/{{xauth}}/{}", fb.proxy.addr()));
        assert!(reply.is_ok(), "proxy online: {reply:?}");
        for shard in 0..opts.shards {
            assert_eq!(fb.codis_master(shard), 0);
            assert!(fb.wait_converged(shard), "shard {shard} did not converge after provisioning");
        }
        fb
    }

    /// Registered server → where clients dial it (the forwarder, else the redis-server).
    pub fn routes(&self) -> BTreeMap<String, String> {
        let mut routes = self.bed.cluster.overrides();
        for (server, fwd) in &self.forwarders {
            routes.insert(server.clone(), fwd.addr());
        }
        routes
    }

    /// The environment of shard `index`'s actions (1.1), dialling through the forwarders.
    pub fn env(&self, index: usize) -> BTreeMap<String, String> {
        let mut env = self.bed.env(index);
        let overrides = self.routes().into_iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
        env.insert("PIKA_ADDRESS_OVERRIDES".into(), overrides);
        env
    }

    /// The environment of `pika-action watch` named `name`, detecting a dead master after `detection_ms`.
    pub fn watch_env(&self, name: &str, detection_ms: u64) -> BTreeMap<String, String> {
        testbed::cluster::watcher_env(&self.env(0), name, detection_ms, (detection_ms / 4).max(10), 3)
    }

    /// Starts `pika-action watch` with `env`; its stderr goes to a log file.
    pub fn watcher(&self, name: &str, env: &BTreeMap<String, String>) -> Watcher {
        let log = self.logs.path().join(format!("{name}-{}.log", now_ms()));
        let file = std::fs::File::create(&log).expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_pika-action"))
            .arg("watch")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(env)
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("start pika-action watch");
        Watcher { name: name.to_owned(), child: Some(child), log }
    }

    /// Shard `index`'s pods.
    pub fn pods(&self, index: usize) -> &[PodFixture] {
        &self.bed.cluster.shards[index].pods
    }

    /// Pod `ordinal` of shard `index`, mutable.
    pub fn pod_mut(&mut self, index: usize, ordinal: u32) -> &mut PodFixture {
        self.bed.cluster.shards[index].pods.iter_mut().find(|p| p.ordinal == ordinal).expect("pod")
    }

    /// Shard `index`'s group.
    pub fn gid(&self, index: usize) -> u32 {
        self.bed.gid(index).expect("registered")
    }

    /// The ordinal Codis lists at index 0 of shard `index`'s group.
    pub fn codis_master(&self, index: usize) -> u32 {
        let snap = self.bed.codis.snapshot();
        let gid = self.gid(index);
        let master = snap.master(gid).expect("a master").to_owned();
        self.pods(index).iter().find(|p| p.server() == master).expect("a pod of the shard").ordinal
    }

    /// Successful `group/promote` requests since the request log was last cleared.
    pub fn promotes(&self) -> usize {
        self.bed
            .codis
            .requests()
            .iter()
            .filter(|r| r.method == "PUT" && r.path.starts_with("/api/topom/group/promote/") && r.status == 200)
            .count()
    }

    /// Waits until Codis lists a master of shard `index`'s group other than `old`; the new one.
    pub fn wait_new_master(&self, index: usize, old: u32) -> Option<u32> {
        let deadline = Instant::now() + PATIENCE;
        while Instant::now() < deadline {
            let master = self.codis_master(index);
            if master != old
                && self.bed.codis.snapshot().group(self.gid(index)).is_none_or(|g| g.promoting.state.is_nothing())
            {
                return Some(master);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    /// Waits until every running pod of shard `index` other than Codis's master replicates it with the link up, and
    /// that master is the only `role:master` among them.
    pub fn wait_converged(&self, index: usize) -> bool {
        eventually(PATIENCE, || {
            let master = self.codis_master(index);
            let routes = self.routes();
            let pods = self.pods(index);
            let m = pods.iter().find(|p| p.ordinal == master).expect("master pod");
            let dial = routes[&m.server()].clone();
            let (host, port) = dial.rsplit_once(':').expect("host:port");
            let port: u16 = port.parse().expect("port");
            m.redis.is_running()
                && m.redis.role() == "master"
                && pods
                    .iter()
                    .filter(|p| p.ordinal != master && p.redis.is_running())
                    .all(|p| p.redis.master().is_some_and(|(h, pp, up)| h == host && pp == port && up))
        })
    }

    /// Turns on an append-only file on pod `ordinal` of shard `index`, flushed at every write and kept in its config,
    /// so that a kill and restart in place keeps its data (as pika's RocksDB does).
    pub fn persist(&self, index: usize, ordinal: u32) {
        let pod = self.pods(index).iter().find(|p| p.ordinal == ordinal).expect("pod");
        for args in [
            &["CONFIG", "SET", "appendfsync", "always"][..],
            &["CONFIG", "SET", "appendonly", "yes"][..],
            &["CONFIG", "REWRITE"][..],
        ] {
            let reply = pod.redis.command(args);
            assert!(reply.contains("OK"), "{args:?}: {reply}");
        }
        // The first rewrite of the append-only file runs in the background.
        assert!(eventually(PATIENCE, || {
            let info = pod.redis.command(&["INFO", "persistence"]);
            testbed::process::info_field(&info, "aof_rewrite_in_progress").as_deref() == Some("0")
                && testbed::process::info_field(&info, "aof_enabled").as_deref() == Some("1")
        }));
    }

    /// Kills pod `ordinal` of shard `index` and gives it an empty volume: a fresh config, no data directory.
    pub fn lose_volume(&mut self, index: usize, ordinal: u32) {
        kill9(&self.pods(index)[ordinal as usize]);
        let pod = self.pod_mut(index, ordinal);
        pod.redis.reset_config();
        let _ = std::fs::remove_dir_all(pod.redis.dir().join("appendonlydir"));
    }

    /// pika's data directory as `rejoin` is told it is (`PIKA_DATA_DIR`): the redis-server's append-only directory.
    pub fn data_dir(&self, index: usize, ordinal: u32) -> PathBuf {
        self.pods(index).iter().find(|p| p.ordinal == ordinal).expect("pod").redis.dir().join("appendonlydir")
    }

    /// Runs `rejoin` for pod `ordinal` of shard `index` (stopped), as the pika container does before pika starts.
    pub fn rejoin(&self, index: usize, ordinal: u32, extra: &[(&str, String)]) -> Output {
        let pod = self.pods(index).iter().find(|p| p.ordinal == ordinal).expect("pod");
        let mut env = self.env(index);
        env.insert("POD_NAME".into(), pod.name.clone());
        env.insert("PIKA_CONFIG_FILE".into(), pod.redis.dir().join("redis.conf").display().to_string());
        env.insert("PIKA_DATA_DIR".into(), self.data_dir(index, ordinal).display().to_string());
        for (k, v) in extra {
            env.insert((*k).to_owned(), v.clone());
        }
        run("rejoin", &env)
    }

    /// Direct (not through forwarders) `role:` of every pod of shard `index` that answers.
    pub fn roles(&self, index: usize) -> BTreeMap<u32, String> {
        self.pods(index)
            .iter()
            .filter(|p| p.redis.is_running())
            .filter_map(|p| role_of(p.redis.port()).map(|r| (p.ordinal, r)))
            .collect()
    }
}

/// A running `pika-action watch`; killed on drop.
pub struct Watcher {
    /// Its name (POD_NAME).
    pub name: String,
    child: Option<Child>,
    log: PathBuf,
}

impl Watcher {
    /// Its stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until its stderr contains `needle`.
    pub fn wait_log(&self, needle: &str, timeout: Duration) -> bool {
        eventually(timeout, || self.log().contains(needle))
    }

    /// Kills it with SIGKILL (a crash).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops it with SIGTERM and waits for its exit code.
    pub fn terminate(&mut self) -> Option<i32> {
        let mut c = self.child.take()?;
        let _ = Command::new("kill").args(["-TERM", &c.id().to_string()]).status();
        let deadline = Instant::now() + PATIENCE;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = c.try_wait() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        None
    }

    /// Its exit code, once it exited by itself (`Some(None)`: killed by a signal).
    pub fn exited(&mut self) -> Option<Option<i32>> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        Some(status.code())
    }

    /// Its process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.kill();
    }
}

fn now_ms() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

// ---- sampling ------------------------------------------------------------------------------------------------------

/// One look at a group during a test.
#[derive(Debug, Clone)]
pub struct Sample {
    /// When.
    pub at: Instant,
    /// Ordinals of the pods answering `role:master`, asked directly (not through the forwarders).
    pub masters: BTreeSet<u32>,
    /// Ordinals of those masters the proxies can reach (not behind a partitioned forwarder).
    pub reachable_masters: BTreeSet<u32>,
    /// Codis's `servers[0]`, by ordinal.
    pub codis_master: Option<u32>,
    /// The ordinals the proxy serves the group's slots from (backend, and source while migrating); a locked slot
    /// (held during a promote) serves nothing.
    pub routed: BTreeSet<u32>,
}

/// What the sampler looks at: borrowed apart from the cluster, so that a test can restart pods while sampling.
pub struct View<'a> {
    codis: &'a testbed::CodisDouble,
    proxy: &'a ProxyDouble,
    forwarders: &'a BTreeMap<String, Forwarder>,
    gid: u32,
    pods: Vec<(u32, u16, String)>,
}

impl FailoverBed {
    /// The sampler's view of shard `index`, and the cluster to act on meanwhile.
    pub fn split(&mut self, index: usize) -> (View<'_>, &mut ClusterFixture) {
        let gid = self.gid(index);
        let pods = self.pods(index).iter().map(|p| (p.ordinal, p.redis.port(), p.server())).collect();
        let view = View { codis: &self.bed.codis, proxy: &self.proxy, forwarders: &self.forwarders, gid, pods };
        (view, &mut self.bed.cluster)
    }

    fn view(&self, index: usize) -> View<'_> {
        let pods = self.pods(index).iter().map(|p| (p.ordinal, p.redis.port(), p.server())).collect();
        View { codis: &self.bed.codis, proxy: &self.proxy, forwarders: &self.forwarders, gid: self.gid(index), pods }
    }
}

/// Runs `f` while a thread samples shard `index`'s group every 2 ms; returns `f`'s result and the samples.
pub fn sampling<T>(fb: &FailoverBed, index: usize, f: impl FnOnce() -> T) -> (T, Vec<Sample>) {
    sampling_view(&fb.view(index), f)
}

/// [`sampling`] over a [`View`].
pub fn sampling_view<T>(view: &View<'_>, f: impl FnOnce() -> T) -> (T, Vec<Sample>) {
    let (gid, pods) = (view.gid, &view.pods);
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let sampler = scope.spawn(|| {
            let mut conns: BTreeMap<u32, RoleConn> = BTreeMap::new();
            let mut samples = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let mut masters = BTreeSet::new();
                for (ordinal, port, _) in pods {
                    let conn = conns.entry(*ordinal).or_insert_with(|| RoleConn::new(*port));
                    if conn.role().as_deref() == Some("master") {
                        masters.insert(*ordinal);
                    }
                }
                let ordinal_of = |server: &str| pods.iter().find(|(_, _, s)| s == server).map(|(o, _, _)| *o);
                let reachable_masters = masters
                    .iter()
                    .copied()
                    .filter(|o| {
                        let server = &pods.iter().find(|(p, _, _)| p == o).expect("pod").2;
                        view.forwarders.get(server).is_none_or(|f| !f.is_partitioned())
                    })
                    .collect();
                let snap = view.codis.snapshot();
                let codis_master = snap.master(gid).and_then(ordinal_of);
                let routed = view
                    .proxy
                    .slots()
                    .iter()
                    .filter(|s| !s.locked && (s.backend_addr_group_id == gid || s.migrate_from_group_id == gid))
                    .flat_map(|s| {
                        let mut v = Vec::new();
                        if s.backend_addr_group_id == gid {
                            v.extend(ordinal_of(&s.backend_addr));
                        }
                        if s.migrate_from_group_id == gid {
                            v.extend(ordinal_of(&s.migrate_from));
                        }
                        v
                    })
                    .collect();
                samples.push(Sample { at: Instant::now(), masters, reachable_masters, codis_master, routed });
                std::thread::sleep(Duration::from_millis(2));
            }
            samples
        });
        // Stops the sampler even when `f` panics, or the scope would wait for it forever.
        struct StopOnDrop<'a>(&'a AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let result = {
            let _stop = StopOnDrop(&stop);
            f()
        };
        (result, sampler.join().expect("sampler"))
    })
}

/// A kept connection asking one redis-server its role.
struct RoleConn {
    port: u16,
    stream: Option<BufReader<TcpStream>>,
}

impl RoleConn {
    fn new(port: u16) -> Self {
        Self { port, stream: None }
    }

    fn role(&mut self) -> Option<String> {
        if self.stream.is_none() {
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
            let s = TcpStream::connect_timeout(&addr, Duration::from_millis(50)).ok()?;
            s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
            self.stream = Some(BufReader::new(s));
        }
        let answer = self.stream.as_mut().and_then(info_replication);
        if answer.is_none() {
            self.stream = None;
        }
        testbed::process::info_field(&answer?, "role")
    }
}

fn info_replication(s: &mut BufReader<TcpStream>) -> Option<String> {
    s.get_mut().write_all(b"*2\r\n$4\r\nINFO\r\n$11\r\nreplication\r\n").ok()?;
    let mut line = String::new();
    s.read_line(&mut line).ok()?;
    let n: usize = line.trim().strip_prefix('$')?.parse().ok()?;
    let mut body = vec![0; n + 2];
    std::io::Read::read_exact(s, &mut body).ok()?;
    String::from_utf8(body).ok()
}

/// The `role:` of the redis-server on `port`, on a fresh connection.
pub fn role_of(port: u16) -> Option<String> {
    RoleConn::new(port).role()
}

/// `(master_repl_offset or slave_repl_offset)` of the redis-server on `port`.
pub fn offset_of(port: u16) -> Option<u64> {
    let mut conn = RoleConn::new(port);
    conn.role()?;
    let info = info_replication(conn.stream.as_mut()?)?;
    let role = testbed::process::info_field(&info, "role")?;
    let key = if role == "master" { "master_repl_offset" } else { "slave_repl_offset" };
    testbed::process::info_field(&info, key)?.parse().ok()
}

// ---- a paced writer that keeps times ------------------------------------------------------------------------------

/// One write of the [`Pulse`].
#[derive(Debug, Clone)]
pub struct Beat {
    /// The key (value `value-of-<key>`, as the workload's).
    pub key: String,
    /// When it was sent.
    pub sent: Instant,
    /// When it was acknowledged (`None`: failed or unknown).
    pub acked: Option<Instant>,
}

/// A writer through a proxy's data port that records when every write was sent and acknowledged.
pub struct Pulse {
    stop: Arc<AtomicBool>,
    beats: Arc<Mutex<Vec<Beat>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Pulse {
    /// Writes `<prefix>:<n>` through `addr` every `pace`, each with a 300 ms timeout.
    pub fn start(addr: &str, prefix: &str, pace: Duration) -> Self {
        Self::start_keys(addr, prefix, pace, |_| true)
    }

    /// Like [`Pulse::start`], skipping the keys `wanted` refuses (to write only to some slots).
    pub fn start_keys(addr: &str, prefix: &str, pace: Duration, wanted: fn(&str) -> bool) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let beats = Arc::new(Mutex::new(Vec::new()));
        let (s, b, addr, prefix) = (Arc::clone(&stop), Arc::clone(&beats), addr.to_owned(), prefix.to_owned());
        let thread = std::thread::spawn(move || {
            let mut conn: Option<BufReader<TcpStream>> = None;
            let mut n = 0u64;
            while !s.load(Ordering::SeqCst) {
                let key = format!("{prefix}:{n}");
                n += 1;
                if !wanted(&key) {
                    continue;
                }
                let sent = Instant::now();
                let ok = set(&mut conn, &addr, &key);
                b.lock().unwrap().push(Beat { key, sent, acked: ok.then(Instant::now) });
                if !ok {
                    conn = None;
                }
                std::thread::sleep(pace);
            }
        });
        Self { stop, beats, thread: Some(thread) }
    }

    /// Writes acknowledged so far.
    pub fn acked(&self) -> usize {
        self.beats.lock().unwrap().iter().filter(|b| b.acked.is_some()).count()
    }

    /// Stops and returns every beat.
    pub fn stop(mut self) -> Vec<Beat> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        std::mem::take(&mut *self.beats.lock().unwrap())
    }
}

impl Drop for Pulse {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn set(conn: &mut Option<BufReader<TcpStream>>, addr: &str, key: &str) -> bool {
    if conn.is_none() {
        let Ok(sock) = addr.parse() else { return false };
        let Ok(s) = TcpStream::connect_timeout(&sock, Duration::from_millis(300)) else { return false };
        let _ = s.set_read_timeout(Some(Duration::from_millis(300)));
        let _ = s.set_nodelay(true);
        *conn = Some(BufReader::new(s));
    }
    let Some(s) = conn.as_mut() else { return false };
    let value = format!("value-of-{key}");
    let cmd = format!("*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${}\r\n{value}\r\n", key.len(), value.len());
    if s.get_mut().write_all(cmd.as_bytes()).is_err() {
        return false;
    }
    let mut line = String::new();
    s.read_line(&mut line).is_ok() && line.trim_end() == "+OK"
}

/// The acknowledged beats as a workload ledger, to read back.
pub fn ledger_of(beats: &[Beat]) -> Ledger {
    let mut ledger = Ledger::default();
    for b in beats {
        if b.acked.is_some() {
            ledger.acked.insert(b.key.clone(), format!("value-of-{}", b.key));
        } else {
            ledger.failed += 1;
        }
    }
    ledger
}

/// From `t0` to the first acknowledgement of a write sent at or after `t0`.
pub fn outage(beats: &[Beat], t0: Instant) -> Option<Duration> {
    beats.iter().filter(|b| b.sent >= t0).find_map(|b| b.acked).map(|a| a.saturating_duration_since(t0))
}

/// From `t0` to the first acknowledgement of a write sent after the first write (sent at or after `t0`) that
/// failed: for a partition, which takes a few milliseconds to stop the bytes already on their way.
pub fn outage_after_first_failure(beats: &[Beat], t0: Instant) -> Option<Duration> {
    let failed = beats.iter().find(|b| b.sent >= t0 && b.acked.is_none())?.sent;
    beats.iter().filter(|b| b.sent > failed).find_map(|b| b.acked).map(|a| a.saturating_duration_since(t0))
}

/// Writes sent after `t0` that failed before the first one acknowledged.
pub fn failed_writes(beats: &[Beat], t0: Instant) -> usize {
    beats.iter().filter(|b| b.sent >= t0).take_while(|b| b.acked.is_none()).count()
}

/// Median, 90th percentile and maximum of some durations, in milliseconds.
pub fn distribution(mut ms: Vec<u128>) -> String {
    if ms.is_empty() {
        return "no runs".to_owned();
    }
    ms.sort_unstable();
    let at = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
    format!(
        "n={} min={} median={} p90={} max={} ms (all: {:?})",
        ms.len(),
        ms[0],
        at(0.5),
        at(0.9),
        ms[ms.len() - 1],
        ms
    )
}

/// Prints `out` with the failing action's name when it did not exit 0.
pub fn expect_ok(what: &str, out: &Output) {
    assert_eq!(out.status.code(), Some(0), "{what}: {}", describe(out));
}

/// The namespace every fixture cluster lives in.
pub fn namespace() -> &'static str {
    NAMESPACE
}

// ---- a Kubernetes API that records Events --------------------------------------------------------------------------

/// A stand-in for the one Kubernetes call the watcher and `rejoin` make, `POST /api/v1/namespaces/{ns}/events`:
/// answered 201 with the object, as the API server does; every other path is 404. Nothing else is modelled (no
/// auth, no validation, no other resource).
pub struct EventsApi {
    url: String,
    events: Arc<Mutex<Vec<serde_json::Value>>>,
}

impl EventsApi {
    /// Serves on a free loopback port.
    pub fn start() -> Self {
        let listener = testbed::bind_loopback().expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let events = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&events);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let seen = Arc::clone(&seen);
                std::thread::spawn(move || serve_events(stream, &seen));
            }
        });
        Self { url, events }
    }

    /// `http://127.0.0.1:<port>`, for `KUBE_API_URL`.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The Events created so far.
    pub fn events(&self) -> Vec<serde_json::Value> {
        self.events.lock().unwrap().clone()
    }

    /// Waits for an Event with `reason`.
    pub fn wait_for(&self, reason: &str) -> Option<serde_json::Value> {
        let deadline = Instant::now() + PATIENCE;
        while Instant::now() < deadline {
            if let Some(e) = self.events().into_iter().find(|e| e["reason"] == reason) {
                return Some(e);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

fn serve_events(stream: TcpStream, seen: &Mutex<Vec<serde_json::Value>>) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut writer = stream;
    while let Some(request) = testbed::http1::read_request(&mut reader) {
        let (method, path, body) = (request.method.as_str(), request.path(), &request.body);
        let is_events = path.starts_with("/api/v1/namespaces/") && path.ends_with("/events");
        let (status, json) = if method == "POST" && is_events {
            let mut event: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
            let n = {
                let mut all = seen.lock().unwrap();
                all.push(event.clone());
                all.len()
            };
            event["metadata"]["name"] = serde_json::json!(format!("event-{n}"));
            event["metadata"]["uid"] = serde_json::json!(format!("00000000-0000-4000-8000-{n:012}"));
            event["metadata"]["resourceVersion"] = serde_json::json!(n.to_string());
            (201, event.to_string())
        } else {
            let status = serde_json::json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404});
            (404, status.to_string())
        };
        if testbed::http1::write_json(&mut writer, status, &json).is_err() {
            return;
        }
    }
}

/// Kills the redis-server of `pod` with SIGKILL (`kill -9` of its process id, from `INFO server`) and returns the
/// moment the signal was sent (after `kill` returned), once the port refuses connections. The fixture still thinks
/// it runs: call its `kill()` afterwards to reap it.
pub fn kill9(pod: &PodFixture) -> Instant {
    let info = pod.redis.command(&["INFO", "server"]);
    let pid = testbed::process::info_field(&info, "process_id").expect("process_id");
    let status = Command::new("kill").args(["-9", pid.trim()]).status().expect("kill");
    let t0 = Instant::now();
    assert!(status.success(), "kill -9 {pid}");
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], pod.redis.port()));
    assert!(eventually(PATIENCE, || TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_err()));
    t0
}

/// The replication lag of shard `index` now: the master's offset minus the most advanced replica's, in bytes.
pub fn lag_now(fb: &FailoverBed, index: usize, master: u32) -> Option<u64> {
    let pods = fb.pods(index);
    let m = offset_of(pods.iter().find(|p| p.ordinal == master)?.redis.port())?;
    let best = pods.iter().filter(|p| p.ordinal != master).filter_map(|p| offset_of(p.redis.port())).max()?;
    Some(m.saturating_sub(best))
}

/// Whether the watcher marked group `gid` as having held data (its master was seen with an offset above zero).
pub fn held_data(fb: &FailoverBed, gid: u32) -> bool {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let Ok(etcd) =
            crate::support::connect_etcd(&fb.bed.cluster.etcd.endpoint()).await
        else {
            return false;
        };
        let prefix = pika_action::clients::etcd::cluster_prefix(NAMESPACE, &fb.bed.cluster.name);
        matches!(etcd.get(&pika_action::steps::failover::held_data_key(&prefix, gid)).await, Ok(Some(e)) if e.value != pika_action::steps::failover::NEVER_HELD)
    })
}

/// The pulse's lost writes are only its last acknowledged ones sent before `t0`, the kill: asynchronous replication
/// gives the new master a prefix of the old master's stream, and the pulse writes over one connection in order, so a
/// lost write sent before a kept one is a real loss; so is a lost write sent after the kill (only the new master
/// could have acknowledged it). Returns how many were lost.
pub fn assert_lost_only_a_tail(beats: &[Beat], lost: &[String], t0: Instant) -> usize {
    let lost: BTreeSet<&str> = lost.iter().map(String::as_str).collect();
    let mut first_lost: Option<&str> = None;
    let mut count = 0;
    // The pulse sends one write at a time: send order is acknowledgement order.
    for beat in beats.iter().filter(|b| b.acked.is_some()) {
        if lost.contains(beat.key.as_str()) {
            assert!(beat.sent <= t0, "{} was sent after the kill, acknowledged by the new master, and lost", beat.key);
            first_lost.get_or_insert(beat.key.as_str());
            count += 1;
        } else if let Some(first) = first_lost {
            assert!(beat.sent > t0, "{first} was lost although {}, acknowledged after it, was kept", beat.key);
        }
    }
    count
}
