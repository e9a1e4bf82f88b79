//! What the switchover, member-leave and crash tests share: a one-shard bed with its master where a test wants it,
//! the environments KubeBlocks gives `switchover`, `rejoin` and `member-leave`, a rolling restart in KubeBlocks'
//! order (or any other), counting Codis promotes, and a stand-in Kubernetes API for rollout facts.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::{describe, eventually, run, run_to_completion, Bed, NAMESPACE};

/// A bed of one shard of `pods` pods, registered, with the master at ordinal `master` (moved there by an explicit
/// switchover) and Codis's request log cleared.
pub fn bed_with_master(pods: usize, master: u32) -> Bed {
    let bed = Bed::builder().shards(1).pods(pods).bed_default();
    run_to_completion("post-provision", &bed.env(0));
    if master != 0 {
        let out = run("switchover", &switchover_env(&bed, 0, Some(master)));
        assert_eq!(out.status.code(), Some(0), "moving the master to {master}: {}", describe(&out));
    }
    bed.assert_registered(0, master);
    bed.codis.clear_requests();
    bed
}

/// The environment of `switchover` for pod `ordinal` of shard 0, with KB_SWITCHOVER_ROLE from its role probe, and
/// a candidate when given.
pub fn switchover_env(bed: &Bed, ordinal: u32, candidate: Option<u32>) -> BTreeMap<String, String> {
    let shard = &bed.cluster.shards[0];
    let pod = shard.pod(ordinal);
    let mut env = bed.env(0);
    env.insert("KB_SWITCHOVER_CURRENT_NAME".into(), pod.name.clone());
    env.insert("KB_SWITCHOVER_CURRENT_FQDN".into(), pod.fqdn.clone());
    env.insert("KB_SWITCHOVER_ROLE".into(), role_probe(bed, ordinal).unwrap_or_default());
    if let Some(c) = candidate {
        env.insert("KB_SWITCHOVER_CANDIDATE_NAME".into(), shard.pod(c).name.clone());
        env.insert("KB_SWITCHOVER_CANDIDATE_FQDN".into(), shard.pod(c).fqdn.clone());
    }
    env
}

/// The environment of `member-leave` for pod `ordinal` of shard 0.
pub fn leave_env(bed: &Bed, ordinal: u32) -> BTreeMap<String, String> {
    let pod = bed.cluster.shards[0].pod(ordinal);
    let mut env = bed.env(0);
    env.insert("KB_LEAVE_MEMBER_POD_NAME".into(), pod.name.clone());
    env.insert("KB_LEAVE_MEMBER_POD_FQDN".into(), pod.fqdn.clone());
    env
}

/// What `role-probe` prints for pod `ordinal` (what KubeBlocks labels the pod with); `None` when it fails.
pub fn role_probe(bed: &Bed, ordinal: u32) -> Option<String> {
    let pod = bed.cluster.shards[0].pod(ordinal);
    let env = BTreeMap::from([
        ("PIKA_HOST".to_owned(), "127.0.0.1".to_owned()),
        ("PIKA_PORT".to_owned(), pod.redis.port().to_string()),
    ]);
    let out = run("role-probe", &env);
    (out.status.code() == Some(0)).then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Successful `group/promote` requests Codis received since the log was last cleared.
pub fn promotes(bed: &Bed) -> usize {
    bed.codis
        .requests()
        .iter()
        .filter(|r| r.method == "PUT" && r.path.starts_with("/api/topom/group/promote/") && r.status == 200)
        .count()
}

/// The ordinal Codis lists at index 0 of shard 0's group.
pub fn codis_master(bed: &Bed) -> u32 {
    let snap = bed.codis.snapshot();
    // Any listed pod names the group (pod 0 may have left it).
    let gid = bed.cluster.shards[0]
        .pods
        .iter()
        .find_map(|p| snap.server(&p.server()).map(|(g, _)| g.id))
        .expect("shard 0 is registered");
    let master = snap.master(gid).expect("a master").to_owned();
    bed.cluster.shards[0].pods.iter().find(|p| p.server() == master).expect("a pod of the shard").ordinal
}

/// The ordinals whose redis-server reports `role:master` now (servers that are down count as nothing).
pub fn pika_masters(bed: &Bed) -> BTreeSet<u32> {
    bed.cluster.shards[0]
        .pods
        .iter()
        .filter(|p| p.redis.is_running() && role_of(p.redis.port()).as_deref() == Some("master"))
        .map(|p| p.ordinal)
        .collect()
}

/// Restarts pod `ordinal` the way KubeBlocks recreates it: kill, run `rejoin` against its config (as the pika
/// container does before pika starts), start again; then waits until it replicates Codis's master (or is it).
pub fn restart(bed: &mut Bed, ordinal: u32) {
    let mut env = bed.env(0);
    {
        let pod = bed.cluster.shards[0].pods.iter_mut().find(|p| p.ordinal == ordinal).expect("pod");
        pod.redis.kill();
        env.insert("POD_NAME".into(), pod.name.clone());
        env.insert("PIKA_CONFIG_FILE".into(), pod.redis.dir().join("redis.conf").display().to_string());
    }
    let out = run("rejoin", &env);
    assert_eq!(out.status.code(), Some(0), "rejoin of {ordinal}: {}", describe(&out));
    let pod = bed.cluster.shards[0].pods.iter_mut().find(|p| p.ordinal == ordinal).expect("pod");
    pod.redis.restart();
    wait_in_sync(bed, ordinal);
}

/// Waits until pod `ordinal` is Codis's master or replicates it with the link up.
pub fn wait_in_sync(bed: &Bed, ordinal: u32) {
    let ok = eventually(Duration::from_secs(20), || {
        let master = codis_master(bed);
        if master == ordinal {
            return true;
        }
        let port = bed.cluster.shards[0].pod(master).redis.port();
        bed.cluster.shards[0].pod(ordinal).redis.master().is_some_and(|(h, p, up)| h == "127.0.0.1" && p == port && up)
    });
    assert!(ok, "pod {ordinal} does not replicate codis's master {}", codis_master(bed));
}

/// The order pods are restarted in.
#[derive(Debug, Clone)]
pub enum Order {
    /// KubeBlocks with role priorities (its InstanceSet update order): `updatePriority` ascending — slaves (1) before
    /// the master (2) — ties by ordinal descending, recomputed from the live role labels before every pod.
    KubeBlocks,
    /// A fixed order of ordinals.
    Fixed(Vec<u32>),
}

/// One rolling restart of shard 0: before each pod, `switchover` as KubeBlocks calls it (must exit 0), then the
/// restart; the stand-in API (when given) marks the pod updated. Returns the pods in the order they restarted.
pub fn rolling_restart(bed: &mut Bed, order: &Order, kube: Option<&FakeKube>) -> Vec<u32> {
    let mut pending: BTreeSet<u32> = bed.cluster.shards[0].pods.iter().map(|p| p.ordinal).collect();
    let mut done = Vec::new();
    while !pending.is_empty() {
        let next = match order {
            Order::KubeBlocks => {
                let roles: BTreeMap<u32, Option<String>> = pending.iter().map(|&o| (o, role_probe(bed, o))).collect();
                let priority = |o: &u32| match roles[o].as_deref() {
                    Some("master") => 2,
                    Some("slave") => 1,
                    _ => 0,
                };
                let mut candidates: Vec<u32> = pending.iter().copied().collect();
                candidates.sort_by_key(|o| (priority(o), std::cmp::Reverse(*o)));
                candidates[0]
            }
            Order::Fixed(list) => list[done.len()],
        };
        let mut env = switchover_env(bed, next, None);
        if let Some(k) = kube {
            env.insert("KUBE_API_URL".into(), k.url());
        }
        let out = run("switchover", &env);
        assert_eq!(out.status.code(), Some(0), "switchover of {next}: {}", describe(&out));
        restart(bed, next);
        if let Some(k) = kube {
            k.update(&bed.cluster.shards[0].pod(next).name);
        }
        pending.remove(&next);
        done.push(next);
    }
    done
}

/// Asserts the end state every transfer must leave: Codis's master is `master`, it is the only pika master, and
/// every other pod replicates it with the link up (both as Codis lists them and as the redis-servers say).
pub fn assert_one_master(bed: &Bed, master: u32) {
    bed.assert_registered(0, master);
    assert_eq!(pika_masters(bed), BTreeSet::from([master]), "pika masters");
}

/// A stand-in for the Kubernetes API, served over plain http (what `KUBE_API_URL` points at): the shard's pods with
/// their `controller-revision-hash` labels and its InstanceSet, whose status names the update revision.
pub struct FakeKube {
    url: String,
    revisions: Arc<Mutex<BTreeMap<String, String>>>,
    requests: Arc<Mutex<Vec<String>>>,
}

/// The revision pods are updated to.
pub const NEW_REVISION: &str = "pk-6b9f7c5d88";
/// The revision pods start with.
pub const OLD_REVISION: &str = "pk-58c4d9f7b6";

impl FakeKube {
    /// Serves the pods of shard 0, all on the old revision, with the InstanceSet updating to the new one.
    pub fn start(bed: &Bed) -> Self {
        let listener = testbed::bind_loopback().expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let revisions: BTreeMap<String, String> =
            bed.cluster.shards[0].pods.iter().map(|p| (p.name.clone(), OLD_REVISION.to_owned())).collect();
        let revisions = Arc::new(Mutex::new(revisions));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (revs, reqs, its) = (Arc::clone(&revisions), Arc::clone(&requests), bed.cluster.shards[0].full.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (revs, reqs, its) = (Arc::clone(&revs), Arc::clone(&reqs), its.clone());
                std::thread::spawn(move || serve(stream, &revs, &reqs, &its));
            }
        });
        Self { url, revisions, requests }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// Marks `pod` as recreated from the update revision.
    pub fn update(&self, pod: &str) {
        self.revisions.lock().unwrap().insert(pod.to_owned(), NEW_REVISION.to_owned());
    }

    /// The request lines served so far.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

fn serve(stream: TcpStream, revisions: &Mutex<BTreeMap<String, String>>, requests: &Mutex<Vec<String>>, its: &str) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut writer = stream;
    while let Some(request) = testbed::http1::read_request(&mut reader) {
        requests.lock().unwrap().push(request.line.clone());
        let (status, json) = route(&request.target, revisions, its);
        if testbed::http1::write_json(&mut writer, status, &json).is_err() {
            return;
        }
    }
}

fn route(path: &str, revisions: &Mutex<BTreeMap<String, String>>, its: &str) -> (u16, String) {
    let pods = format!("/api/v1/namespaces/{NAMESPACE}/pods");
    let instance_set = format!("/apis/workloads.kubeblocks.io/v1/namespaces/{NAMESPACE}/instancesets/{its}");
    if path.split('?').next() == Some(pods.as_str()) {
        let items: Vec<serde_json::Value> = revisions
            .lock()
            .unwrap()
            .iter()
            .map(|(name, rev)| {
                serde_json::json!({
                    "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"controller-revision-hash": rev}},
                    "status": {"conditions": [{"type": "Ready", "status": "True"}]}
                })
            })
            .collect();
        let list = serde_json::json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items});
        (200, list.to_string())
    } else if path.split('?').next() == Some(instance_set.as_str()) {
        let its = serde_json::json!({
            "apiVersion": "workloads.kubeblocks.io/v1", "kind": "InstanceSet",
            "metadata": {"name": its, "namespace": NAMESPACE},
            "status": {"updateRevision": NEW_REVISION, "currentRevision": OLD_REVISION}
        });
        (200, its.to_string())
    } else {
        let status = serde_json::json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404});
        (404, status.to_string())
    }
}

/// Runs `f` while a thread samples the pika masters of shard 0 every few milliseconds; returns `f`'s result and
/// every sample.
pub fn observing<T>(bed: &Bed, f: impl FnOnce() -> T) -> (T, Vec<BTreeSet<u32>>) {
    let ports: Vec<(u32, u16)> = bed.cluster.shards[0].pods.iter().map(|p| (p.ordinal, p.redis.port())).collect();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let samples = Arc::new(Mutex::new(Vec::new()));
    let (s, out) = (Arc::clone(&stop), Arc::clone(&samples));
    let observer = std::thread::spawn(move || {
        while !s.load(std::sync::atomic::Ordering::SeqCst) {
            let masters: BTreeSet<u32> =
                ports.iter().filter(|(_, port)| role_of(*port).as_deref() == Some("master")).map(|(o, _)| *o).collect();
            out.lock().unwrap().push(masters);
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    let result = f();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    observer.join().expect("observer");
    let samples = samples.lock().unwrap().clone();
    (result, samples)
}

/// `role:` of the redis-server on `port`, by a raw RESP exchange (the observer must not panic on a restart).
fn role_of(port: u16) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
    stream.write_all(b"*2\r\n$4\r\nINFO\r\n$11\r\nreplication\r\n").ok()?;
    let mut reader = BufReader::new(stream);
    let mut first = String::new();
    reader.read_line(&mut first).ok()?;
    let len: usize = first.trim().strip_prefix('$')?.parse().ok()?;
    let mut body = vec![0; len];
    reader.read_exact(&mut body).ok()?;
    let text = String::from_utf8_lossy(&body).into_owned();
    testbed::process::info_field(&text, "role").map(|r| r.trim().to_owned())
}

/// The output's stdout as text.
pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}
