//! The real-pika tier: pika v4.0.1 pods (each in its own network namespace, started by the chart's own
//! `pika-start.sh` from the chart's own `pika.conf`), the dashboard and proxy of Pika's Codis fork, real etcd
//! (`testbed::real`). pika-action runs with the chart's environment and reaches pods by their FQDNs, as in a cluster.
//! Every outcome is read from the dashboard, the pikas and the proxy.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use testbed::process::info_field;
use testbed::real::bed::{Line, RealBed, RealBedOptions};
use testbed::{Ledger, Workload, WorkloadOptions};

use crate::support::describe;

mod conformance;
#[cfg(feature = "failpoints")]
mod crash;
mod failover;
mod member_leave;
mod on_double;
mod role_probe;
mod switchover;

fn action() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_pika-action"))
}

/// The slot count of this tier's beds, in place of the chart's 1024 (which the chart's own tests below, the
/// emulation and the demo keep): what the actions do per group, slot range or batch of keys is the same over 128
/// slots; 1024 only hand Codis eight times the migrations of each rebalance and drain (about 16 ms each on this
/// fork, a third of the slots 5 s), time every multi-shard test spent waiting.
const TIER_SLOTS: u16 = 128;

/// A bed over [`TIER_SLOTS`] slots.
fn options(shards: usize, pods: u32, line: Line, proxies: usize) -> RealBedOptions {
    RealBedOptions { shards, pods, line, proxies, slots: Some(TIER_SLOTS), ..RealBedOptions::default() }
}

fn bed(shards: usize, pods: u32, line: Line, proxies: usize) -> RealBed {
    started(&options(shards, pods, line, proxies))
}

/// A bed of `opts`, its slot count checked where each server keeps it: the dashboard's slot table and every pika's
/// `default-slot-num` (a pika with another count would put keys in slots their group does not own).
fn started(opts: &RealBedOptions) -> RealBed {
    let bed = RealBed::start(opts, action());
    let slots = usize::from(opts.slots.unwrap_or(1024));
    assert_eq!(bed.dashboard.topology().slots.len(), slots, "the dashboard's slot count");
    for pod in bed.shards.iter().flat_map(|s| &s.pods) {
        let said = pod.command(&["CONFIG", "GET", "default-slot-num"]);
        assert_eq!(said.lines().nth(1), Some(slots.to_string().as_str()), "{}'s slot count: {said}", pod.name);
    }
    bed
}

/// Runs the action until it exits 0, rerunning on 75 (as KubeBlocks requeues); panics on anything else. Returns
/// what each run printed.
fn run_to_completion(bed: &RealBed, args: &[&str], env: &std::collections::BTreeMap<String, String>) -> Vec<String> {
    // Ten budgets (40 s each) is far beyond what any of these operations needs on this bed: a run that still
    // exits 75 then is not progressing. Between runs a pause, growing as KubeBlocks' requeue backoff does (1, 2,
    // 4, then 8 s): a run that waits for something another process mends (a master's failover) returns at once.
    let mut said = Vec::new();
    for run in 0..10 {
        if run > 0 {
            std::thread::sleep(Duration::from_secs(1 << (run - 1).min(3)));
        }
        let out = bed.run(args, env);
        said.push(describe(&out));
        match out.status.code() {
            Some(0) => return said,
            Some(75) => continue,
            _ => panic!("{args:?} failed: {}\ndashboard log:\n{}", describe(&out), bed.dashboard.log()),
        }
    }
    let last = said.last().map(String::as_str).unwrap_or_default();
    panic!(
        "{args:?} did not finish in 10 runs; the last said:\n{last}\ndashboard log:\n{}\n{}",
        bed.dashboard.log(),
        pods_report(bed)
    );
}

/// Every pod's replication and log tail, for a run that did not finish.
fn pods_report(bed: &RealBed) -> String {
    bed.shards.iter().flat_map(|s| &s.pods).map(testbed::real::pika::PikaPod::report).collect::<Vec<_>>().join("\n")
}

/// The value [`write_through_proxy`] writes to `key`.
fn value_of(key: &str) -> String {
    format!("v-{key}")
}

/// `keys` with the values [`write_through_proxy`] wrote, as [`RealBed::missing_on`] takes them.
fn written(keys: &[String]) -> std::collections::BTreeMap<String, String> {
    keys.iter().map(|k| (k.clone(), value_of(k))).collect()
}

/// Writes `n` keys through the proxy; returns them.
fn write_through_proxy(bed: &RealBed, prefix: &str, n: usize) -> Vec<String> {
    let mut conn = bed.proxies[0].connect().expect("connect to codis-proxy");
    (0..n)
        .map(|i| {
            let key = format!("{prefix}:{i}");
            let reply = conn.command(&["SET", &key, &value_of(&key)]).expect("SET through codis-proxy");
            assert_eq!(reply, "+OK", "SET {key} through codis-proxy");
            key
        })
        .collect()
}

/// Every key of `keys` whose value read through the proxy is not the one written.
fn missing_through_proxy(bed: &RealBed, keys: &[String]) -> Vec<String> {
    let mut conn = bed.proxies[0].connect().expect("connect to codis-proxy");
    keys.iter().filter(|k| conn.command(&["GET", k]).ok().as_deref() != Some(&value_of(k))).cloned().collect()
}

#[test]
fn a_fresh_pod_of_the_chart_serves_on_an_empty_volume() {
    // No Codis registration: only the pika container's start on an empty volume, as a new pod of the chart (its
    // slot count too).
    let bed = RealBed::start(&RealBedOptions { proxies: 0, ..RealBedOptions::default() }, action());
    let pod = bed.shards[0].pod(0);
    // The persisted config did not exist; pika-start.sh made it from the chart's template, and pika serves it.
    let persisted = std::fs::read_to_string(pod.volume().join("pika.conf")).expect("the persisted pika.conf");
    assert!(persisted.lines().any(|l| l.trim() == "slotmigrate : yes"), "{persisted}");
    let mut conn = pod.connect();
    // The chart's maxclients (20000) needs 25000 open files; where the hard limit is lower (20000 on the machine
    // these tests were written on), pika-start.sh lowered it so that pika could start at all.
    let hard = std::process::Command::new("sh").args(["-c", "ulimit -Hn"]).output().expect("sh").stdout;
    let hard = String::from_utf8_lossy(&hard).trim().to_owned();
    let maxclients = hard.parse::<u64>().map_or(20000, |h| (h - 5000).min(20000)).to_string();
    for (key, expected) in
        [("slotmigrate", "yes"), ("default-slot-num", "1024"), ("databases", "1"), ("maxclients", maxclients.as_str())]
    {
        let reply = conn.command(&["CONFIG", "GET", key]).expect("CONFIG GET");
        assert_eq!(reply.lines().nth(1), Some(expected), "CONFIG GET {key}: {reply}");
    }
    assert_eq!(info_field(&pod.info_replication(), "role").as_deref(), Some("master"));
    // The password protects it: a client without it is refused.
    let anonymous = testbed::process::RespConnection::connect(&pod.addr(), None, std::time::Duration::from_secs(5))
        .and_then(|mut c| c.command(&["SET", "k", "v"]))
        .expect("reach pika");
    assert!(anonymous.starts_with("-"), "pika took a write without the password: {anonymous}");
}

#[test]
fn post_provision_registers_a_shard_of_real_pikas_on_the_forks_dashboard() {
    // The chart's slot count.
    let bed = started(&RealBedOptions { pods: 2, ..RealBedOptions::default() });
    run_to_completion(&bed, &["post-provision"], &bed.env(0));
    let gid = bed.assert_registered(0, 0);
    let topology = bed.topology();
    assert_eq!(topology.groups.len(), 1, "{topology:?}");
    assert_eq!(topology.slots_of(gid), topology.slots.len(), "every slot to the one group: {topology:?}");
    assert_eq!(topology.slots.len(), 1024);

    let keys = write_through_proxy(&bed, "first", 200);
    assert_eq!(missing_through_proxy(&bed, &keys), Vec::<String>::new(), "keys lost through the proxy");
    // The replica holds them too, once its binlog is applied.
    let held = testbed::cluster::eventually(std::time::Duration::from_secs(20), || {
        bed.missing_on(0, 1, &written(&keys)).is_empty()
    });
    assert!(held, "the replica lacks {} of 200 keys", bed.missing_on(0, 1, &written(&keys)).len());

    // Running it again changes nothing.
    let out = bed.run(&["post-provision"], &bed.env(0));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(bed.topology(), topology);
}

#[test]
fn the_chart_offers_only_the_pika_and_codis_the_tests_run() {
    use testbed::kubeblocks::chart::{helm_template, repo_chart};
    let (tag, commit) = testbed::real::PIKA_RELEASE;
    let version =
        std::process::Command::new(&testbed::real::Servers::installed().pika).arg("-v").output().expect("pika");
    let version = String::from_utf8_lossy(&version.stdout).into_owned();
    assert!(version.contains(&format!("pika_git_sha:{commit}")), "the installed pika is not {tag}: {version}");
    let service_version = tag.trim_start_matches('v');

    let addon = helm_template(&repo_chart("addon"), "pika", "kb-system", &[]).expect("render the addon");
    let named = |kind: &str, name: &str| {
        addon
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name}"))
            .clone()
    };
    let image = |repository: &str| format!("docker.io/{repository}:{tag}");
    let offered = |cmpv: &serde_json::Value| -> Vec<String> {
        cmpv["spec"]["releases"].as_array().expect("releases").iter().map(|r| r["serviceVersion"].to_string()).collect()
    };
    let pika = named("ComponentVersion", "pika-group");
    assert_eq!(offered(&pika), [format!("{service_version:?}")], "the pika releases offered");
    assert_eq!(pika["spec"]["releases"][0]["images"]["pika"], image("pikadb/pika").as_str());
    assert_eq!(pika["spec"]["releases"][0]["images"]["exporter"], image("pikadb/pika-exporter").as_str());
    for name in ["codis-dashboard", "codis-proxy", "codis-fe"] {
        let codis = named("ComponentVersion", &format!("pika-{name}"));
        assert_eq!(offered(&codis), [format!("{service_version:?}")], "{name}: the releases offered");
        assert_eq!(codis["spec"]["releases"][0]["images"][name], image("pikadb/codis").as_str(), "{name}");
    }
    let definitions = addon.iter().filter(|o| o["kind"] == "ComponentDefinition");
    for cmpd in definitions.filter(|o| !o["metadata"]["name"].as_str().is_some_and(|n| n.contains("etcd"))) {
        assert_eq!(cmpd["spec"]["serviceVersion"], service_version, "{}", cmpd["metadata"]["name"]);
    }
    // A cluster made with the cluster chart's defaults runs that release.
    let cluster = helm_template(&repo_chart("clusterdefs"), "demo", "default", &[]).expect("render the cluster");
    let cluster = cluster.iter().find(|o| o["kind"] == "Cluster").expect("a Cluster");
    for sharding in cluster["spec"]["shardings"].as_array().expect("shardings") {
        assert_eq!(sharding["template"]["serviceVersion"], service_version, "{sharding}");
    }
}

/// What writing new keys to a slot while Codis migrates it came to.
struct SlotMove {
    moved: bool,
    written: usize,
    errors: Vec<String>,
    lost: Vec<String>,
}

/// Two shards registered; 5000 keys in one slot; that slot moved to the other group by a slot action while new keys
/// of the slot are written through the proxy, until the move is done or a write is refused with `stop_on`; then every
/// acknowledged key is read back through the proxy.
fn move_a_slot_while_writing_to_it(dashboard_settings: Vec<(&'static str, &'static str)>, stop_on: &str) -> SlotMove {
    let bed = started(&RealBedOptions { dashboard_settings, ..options(2, 1, Line::V1_1, 1) });
    run_to_completion(&bed, &["post-provision"], &bed.env(0));
    let mut proxy = bed.proxies[0].connect().expect("connect to codis-proxy");
    // SLOTSHASHKEY answers an array of one slot id.
    let reply = bed.shards[0].pod(0).command(&["SLOTSHASHKEY", "{moved}"]);
    let slot: usize = reply
        .split(|c: char| !c.is_ascii_digit())
        .rfind(|t| !t.is_empty())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("SLOTSHASHKEY: {reply}"));
    let mut keys = Vec::new();
    for i in 0..5000 {
        let key = format!("{{moved}}:old:{i}");
        assert_eq!(proxy.command(&["SET", &key, &format!("v-{key}")]).as_deref(), Ok("+OK"));
        keys.push(key);
    }
    let before = bed.topology();
    let from = before.slots[slot];
    let to = before.groups.iter().map(|g| g.id).find(|&g| g != from).expect("a second group");
    let out = bed.codis_admin(&["--slot-action", "--create", &format!("--sid={slot}"), &format!("--gid={to}")]);
    assert!(out.status.success(), "codis-admin --slot-action: {}", describe(&out));

    let (mut written, mut errors) = (0, Vec::new());
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let topology = bed.topology();
        let done = topology.slots[slot] == to && topology.migrating == 0;
        for _ in 0..50 {
            let key = format!("{{moved}}:new:{written}");
            written += 1;
            match proxy.command(&["SET", &key, &format!("v-{key}")]) {
                Ok(reply) if reply == "+OK" => keys.push(key),
                Ok(reply) => errors.push(format!("SET {key}: {reply}")),
                // A late reply would be taken for the next command's: a new connection.
                Err(e) => {
                    errors.push(format!("SET {key}: {e}"));
                    proxy = bed.proxies[0].connect().expect("connect to codis-proxy");
                }
            }
        }
        if done || errors.iter().any(|e| e.contains(stop_on)) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "slot {slot} did not move in 60 s ({} written, errors {:?}); dashboard log:\n{}",
            written,
            errors.iter().take(5).collect::<Vec<_>>(),
            bed.dashboard.log()
        );
    }
    let topology = bed.topology();
    let moved = topology.slots[slot] == to && topology.migrating == 0;
    SlotMove { moved, written, errors, lost: missing_through_proxy(&bed, &keys) }
}

#[test]
#[ignore = "flaky under CI load: in 1 of 3 fresh-clone runs the slot moved with 1750 writes and none refused, so the refusal asserted last is timing-dependent; untouched by issue 33, to be made deterministic"]
fn the_charts_semi_async_migration_moves_a_slot_between_password_protected_pikas_refusing_new_keys_meanwhile() {
    let chart = &testbed::real::ChartFiles::rendered().dashboard_toml;
    assert!(chart.lines().any(|l| l.trim() == "migration_method = \"semi-async\""), "the chart's setting: {chart}");
    let moved = move_a_slot_while_writing_to_it(Vec::new(), "no error stops this move");
    assert!(moved.moved, "the slot did not move");
    assert!(moved.lost.is_empty(), "{} acknowledged keys lost by the move: {:?}", moved.lost.len(), moved.lost.first());
    // The price on pika v4.0.1: SLOTSMGRT-EXEC-WRAPPER answers [-1,-1] for a key that does not exist yet, which the
    // fork's proxy takes for a failure, so writes of new keys to the migrating slot are refused (never acknowledged,
    // so never lost), and one may hang until the client's timeout, until the slot has moved.
    assert!(
        moved.errors.iter().all(|e| e.contains("slotsmgrt-exec-wrapper") || e.contains("temporarily unavailable")),
        "a write refused for another reason: {:?}",
        moved.errors
    );
    assert!(
        moved.errors.iter().any(|e| e.contains("slotsmgrt-exec-wrapper")),
        "no write was refused during the move ({} written)",
        moved.written
    );
}

#[test]
fn sync_migration_cannot_move_a_slot_between_password_protected_pikas() {
    // Why the chart does not take sync migration, which would take new keys: pika v4.0.1's SLOTSMGRTTAGSLOT and
    // SLOTSMGRTTAGONE connect to the target without AUTH, which a target with requirepass refuses, so the slot
    // never moves and every write to it fails.
    let moved = move_a_slot_while_writing_to_it(vec![("migration_method", "\"sync\"")], "noauth");
    assert!(!moved.moved, "the slot moved");
    assert!(moved.errors.iter().any(|e| e.to_lowercase().contains("noauth")), "{:?}", moved.errors.first());
    // Reads of the slot go the same way (the proxy migrates a key before it reads it): its keys cannot be read.
    assert!(!moved.lost.is_empty(), "the stalled slot's keys were readable");
}

/// Keys written through the proxy while one replica serves other data than its master, and how many of them read
/// back through the proxy. The replica is taken off replication by a `SLAVEOF NO ONE` sent to it directly (a replica
/// in a full sync, or in pika's error state, is as far behind) once the dashboard's health check has put it in its
/// group's replica groups, which the fork does by itself for every reachable server.
fn reads_while_a_replica_is_behind(proxy_settings: Vec<(&'static str, &'static str)>) -> (usize, usize) {
    let bed = started(&RealBedOptions { proxy_settings, ..options(1, 2, Line::V1_1, 1) });
    run_to_completion(&bed, &["post-provision"], &bed.env(0));
    bed.assert_registered(0, 0);
    let replica = bed.shards[0].pod(1);
    assert_eq!(replica.command(&["SLAVEOF", "NO", "ONE"]), "+OK");
    let in_replica_groups = || {
        testbed::real::codis::http_get(bed.dashboard.addr(), "/topom").ok().is_some_and(|body| {
            let topom: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            topom.pointer("/stats/group/models").and_then(|m| m.as_array()).into_iter().flatten().any(|g| {
                g["servers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|s| s["server"].as_str() == Some(replica.server().as_str()) && s["replica_group"] == true)
            })
        })
    };
    // The health check runs every 10 s (sentinel_check_server_state_interval).
    assert!(testbed::cluster::eventually(Duration::from_secs(40), in_replica_groups), "never a replica group");
    // The proxies learn replica groups with the group's next push (any slot change or promote does it).
    let out = bed.codis_admin(&["--resync-group", "--all"]);
    assert!(out.status.success(), "codis-admin --resync-group: {}", describe(&out));
    let keys = write_through_proxy(&bed, "behind", 200);
    let missing = missing_through_proxy(&bed, &keys);
    (keys.len() - missing.len(), keys.len())
}

#[test]
fn the_charts_proxies_read_from_masters_only_so_a_replica_behind_serves_no_read() {
    let chart = &testbed::real::ChartFiles::rendered().proxy_toml;
    assert!(chart.lines().any(|l| l.trim() == "backend_primary_only = true"), "the chart's setting: {chart}");
    let (read, written) = reads_while_a_replica_is_behind(Vec::new());
    assert_eq!(read, written, "keys that did not read back");
}

#[test]
fn with_replica_reads_a_replica_behind_answers_reads_with_nil() {
    // Why the chart sets backend_primary_only: Codis' default sends reads to the group's replica groups.
    let (read, written) = reads_while_a_replica_is_behind(vec![("backend_primary_only", "false")]);
    assert!(read < written, "every key read back ({read} of {written}): no read went to the replica");
}

/// Through the proxy, on one connection: `SELECT 1`, then a SET, then a SET after `SELECT 0`.
fn select_one_through_the_proxy(proxy_settings: Vec<(&'static str, &'static str)>) -> [String; 3] {
    let bed = started(&RealBedOptions { proxy_settings, ..options(1, 1, Line::V1_1, 1) });
    run_to_completion(&bed, &["post-provision"], &bed.env(0));
    let pika = bed.shards[0].pod(0).command(&["CONFIG", "GET", "databases"]);
    assert_eq!(pika.lines().nth(1), Some("1"), "pika's databases: {pika}");
    let mut conn = bed.proxies[0].connect().expect("connect to codis-proxy");
    let mut reply = |args: &[&str]| conn.command(args).unwrap_or_else(|e| format!("(no reply: {e})"));
    let select = reply(&["SELECT", "1"]);
    let set = reply(&["SET", "db-key", "v"]);
    let _ = reply(&["SELECT", "0"]);
    let set0 = reply(&["SET", "db0-key", "v"]);
    [select, set, set0]
}

#[test]
fn the_charts_proxy_offers_the_one_database_pika_has() {
    let chart = &testbed::real::ChartFiles::rendered().proxy_toml;
    assert!(chart.lines().any(|l| l.trim() == "backend_number_databases = 1"), "the chart's setting: {chart}");
    let [select, set, set0] = select_one_through_the_proxy(Vec::new());
    assert!(select.starts_with('-'), "SELECT 1 was taken: {select}");
    assert_eq!(set, "+OK", "the connection stays on database 0");
    assert_eq!(set0, "+OK");
}

#[test]
fn a_proxy_offering_more_databases_than_pika_has_takes_select_and_fails_the_writes() {
    // Why the two settings are equal: the proxy routes database n to its own backend connections, which pika
    // refuses to SELECT when it has fewer databases.
    let [select, set, _] = select_one_through_the_proxy(vec![("backend_number_databases", "2")]);
    assert_eq!(select, "+OK", "SELECT 1 through a proxy offering 2 databases");
    assert_ne!(set, "+OK", "a write to database 1, which pika does not have, was acknowledged");
}

#[test]
fn the_demo_runs_every_step_on_the_real_servers_reads_every_key_back_and_leaves_no_process() {
    let mut out = Vec::new();
    let problems = testbed::real::demo::run(action(), &mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    assert_eq!(problems, 0, "the demo showed problems:\n{text}");
    for step in [
        "== create the cluster",
        "== scale out to 4 shards",
        "== scale in to 3 shards",
        "== switch the first shard's master over",
        "== kill the first shard's master",
        "== the killed pod comes back",
    ] {
        assert!(text.contains(step), "no step {step:?}:\n{text}");
    }
    assert!(text.contains("keys: 1800 written so far, 1800 read back through the proxy"), "{text}");
    assert!(text.contains("as master") && text.contains("after the kill"), "no failover shown:\n{text}");
    // Nothing it started runs on: every server it started named the product on its command line or in its paths.
    let product = text
        .split_whitespace()
        .skip_while(|w| *w != "product")
        .nth(1)
        .map(|w| w.trim_end_matches(','))
        .expect("the product name")
        .to_owned();
    let left: Vec<String> = std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&product))
        .collect();
    assert_eq!(left, Vec::<String>::new(), "processes of the demo's cluster {product} still run");
}

/// One command on a fresh connection that sent no AUTH, or only `auth`.
fn unauthenticated(addr: &str, auth: &[&str], command: &[&str]) -> (Option<String>, String) {
    let mut conn =
        testbed::process::RespConnection::connect(addr, None, Duration::from_secs(5)).expect("reach the server");
    let auth_reply = (!auth.is_empty()).then(|| conn.command(auth).unwrap_or_else(|e| e));
    (auth_reply, conn.command(command).unwrap_or_else(|e| e))
}

#[test]
fn only_the_password_opens_pika_and_it_reaches_no_log() {
    let bed = bed(1, 2, Line::V1_1, 1);
    let mut outputs = run_to_completion(&bed, &["post-provision"], &bed.env(0));
    bed.assert_registered(0, 0);
    let master = bed.shards[0].pod(0);

    // Nothing is served before AUTH, and a wrong password opens nothing. (With userpass empty, pika v4.0.1 answered
    // `AUTH <anything>` with +OK through its second account and then took SET, SLAVEOF and CONFIG GET.)
    for command in [&["GET", "k"][..], &["SET", "k", "v"], &["CONFIG", "GET", "requirepass"], &["SLAVEOF", "NO", "ONE"]]
    {
        let (_, reply) = unauthenticated(&master.addr(), &[], command);
        assert!(reply.contains("NOAUTH"), "{command:?} before AUTH: {reply}");
    }
    for wrong in ["", "wrong", "x", &format!("{}x", bed.password)] {
        let (auth, reply) = unauthenticated(&master.addr(), &["AUTH", wrong], &["SET", "k", "v"]);
        let auth = auth.unwrap_or_default();
        assert!(auth.starts_with('-'), "AUTH {wrong:?} was accepted: {auth}");
        assert!(reply.contains("NOAUTH"), "SET after AUTH {wrong:?}: {reply}");
        let (auth, _) = unauthenticated(&master.addr(), &["AUTH", "limit", wrong], &["PING"]);
        assert!(auth.unwrap_or_default().starts_with('-'), "AUTH limit {wrong:?} was accepted");
    }
    // The right one opens everything.
    let (auth, reply) = unauthenticated(&master.addr(), &["AUTH", &bed.password], &["CONFIG", "GET", "slotmigrate"]);
    assert_eq!(auth.as_deref(), Some("+OK"));
    assert!(reply.ends_with("yes"), "{reply}");

    // The second account, were its random password ever known, runs no administrative command.
    let persisted = std::fs::read_to_string(master.volume().join("pika.conf")).expect("the persisted pika.conf");
    let userpass = persisted
        .lines()
        .find_map(|l| l.strip_prefix("userpass").map(|v| v.trim_start_matches([' ', ':']).trim().to_owned()))
        .unwrap_or_default();
    assert!(userpass.len() >= 32, "userpass is not a long random secret: {userpass:?}");
    assert_ne!(userpass, bed.password);
    let user = ["AUTH", "limit", userpass.as_str()];
    for command in [
        &["SLAVEOF", "NO", "ONE"][..],
        &["CONFIG", "GET", "requirepass"],
        &["CONFIG", "SET", "requirepass", "x"],
        &["FLUSHALL"],
        &["SHUTDOWN"],
        &["CLIENT", "LIST"],
        &["KEYS", "*"],
        &["SLOTSDEL", "1"],
        &["CLEARREPLICATIONID"],
        &["ACL", "LIST"],
    ] {
        let (auth, reply) = unauthenticated(&master.addr(), &user, command);
        assert_eq!(auth.as_deref(), Some("+OK"));
        // SHUTDOWN from another host is refused before the account is looked at ("shutdown should be localhost").
        let refused = reply.contains("NOPERM") || (command[0] == "SHUTDOWN" && reply.starts_with('-'));
        assert!(refused, "the user account ran {command:?}: {reply}");
    }
    let (_, reply) = unauthenticated(&master.addr(), &user, &["SET", "user-key", "v"]);
    assert_eq!(reply, "+OK", "the user account is for data");
    assert_eq!(info_field(&master.info_replication(), "role").as_deref(), Some("master"), "still the master");

    // Codis, the proxy and the replica still work with the password.
    let keys = write_through_proxy(&bed, "auth", 100);
    assert_eq!(missing_through_proxy(&bed, &keys), Vec::<String>::new());
    let held =
        testbed::cluster::eventually(Duration::from_secs(20), || bed.missing_on(0, 1, &written(&keys)).is_empty());
    assert!(held, "the replica lacks {} of 100 keys", bed.missing_on(0, 1, &written(&keys)).len());
    let (host, port) = master.addr().rsplit_once(':').map(|(h, p)| (h.to_owned(), p.to_owned())).expect("host:port");
    let probe = BTreeMap::from([
        ("PIKA_HOST".to_owned(), host),
        ("PIKA_PORT".to_owned(), port),
        ("PIKA_PASSWORD".to_owned(), bed.password.clone()),
    ]);
    let out = bed.run(&["role-probe"], &probe);
    outputs.push(describe(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "master", "{}", describe(&out));

    // The password is in no log: only in each pod's persisted pika.conf, which pika reads.
    let holding: Vec<String> = bed
        .files_containing(&bed.password)
        .into_iter()
        .map(|p| p.display().to_string())
        .filter(|p| !p.ends_with("/data/pika.conf"))
        .collect();
    assert_eq!(holding, Vec::<String>::new(), "files holding the password besides the persisted configs");
    for out in outputs {
        assert!(!out.contains(&bed.password), "an action printed the password: {out}");
    }
    // The filter left the rest of pika's start output alone.
    let start = std::fs::read_to_string(master.volume().join("../start.log")).unwrap_or_default();
    assert!(start.contains("requirepass <redacted>"), "pika's config dump was not seen: {start}");
}

// ---- scenarios: what KubeBlocks runs for each operation, in its order, with a writer through the real proxy --------
//
// Each scenario runs the actions KubeBlocks would run for one operation (the chart's actions with the chart's
// environment, on the line given) directly, in the order the line's controllers run them; the KubeBlocks emulation
// (`testbed::kubeblocks`) still runs over redis-servers and the Codis double. What this does not model: the
// controllers' retries and timing, preconditions, role probes and the Kubernetes API (no KUBE_API_URL, so
// switchover and member-leave decide by the ordinal rule and 1.1's pre-terminate safety net is not run).

/// A writer through the real proxy, with keys preloaded before the operation.
struct Traffic {
    preloaded: Ledger,
    writer: Workload,
}

impl Traffic {
    fn start(bed: &RealBed, prefix: &str) -> Self {
        Self::start_paced(bed, prefix, Duration::from_millis(2))
    }

    /// [`Traffic::start`] with each writer waiting `pace` between writes (zero: as fast as the proxy answers).
    fn start_paced(bed: &RealBed, prefix: &str, pace: Duration) -> Self {
        Self::start_with(bed, prefix, pace, None)
    }

    /// [`Traffic::start_paced`] with each writer cycling through `keys_per_writer` keys (each written again with a
    /// new value), when given: the data stays small however long the operations go on.
    fn start_with(bed: &RealBed, prefix: &str, pace: Duration, keys_per_writer: Option<u64>) -> Self {
        let proxy = bed.proxies[0].data_addr().to_owned();
        let keys: Vec<String> = (0..2000).map(|n| format!("{prefix}:pre:{n}")).collect();
        let preloaded =
            Ledger::write_keys_authed(&proxy, Some(&bed.password), &keys).expect("preload through the proxy");
        assert_eq!(preloaded.acked.len(), keys.len(), "preload: {:?}", preloaded.errors);
        let writer = Workload::start(WorkloadOptions {
            prefix: prefix.to_owned(),
            auth: Some(bed.password.clone()),
            pace,
            keys_per_writer,
            ..WorkloadOptions::through(&[proxy])
        });
        assert!(writer.wait_for_acked(50, Duration::from_secs(20)), "the writer got no write through the proxy");
        Self { preloaded, writer }
    }

    /// [`Traffic::finish`], then every pod of every shard holds every acknowledged key with its value (read from
    /// each pika directly, replicas given time to apply what they received): after the operation the replicas' data
    /// equals their master's, as far as the writes go. Gives back every acknowledged key, preloaded ones included.
    fn finish_on_every_pod(self, bed: &RealBed) -> Ledger {
        let (ledger, _, _) = self.finish_with_ledger(bed);
        for shard in &bed.shards {
            let master = shard.pods.iter().find(|p| p.role() == "master").map(|p| p.ordinal);
            for pod in &shard.pods {
                let mut conn = pod.connect();
                // Each key lives in one shard: a pod holds the keys its master holds.
                let mut on_master = shard.pods.iter().find(|p| Some(p.ordinal) == master).expect("a master").connect();
                let mut differing = || {
                    ledger
                        .acked
                        .keys()
                        .filter(|k| conn.command(&["GET", k]).ok() != on_master.command(&["GET", k]).ok())
                        .count()
                };
                let mut last = 0;
                let same = testbed::cluster::eventually(Duration::from_secs(20), || {
                    last = differing();
                    last == 0
                });
                assert!(same, "{} differs from its master on {last} acknowledged keys", pod.name);
            }
        }
        ledger
    }

    /// Every key acknowledged so far, preloaded ones included, read back through the proxy while the writer goes
    /// on: which step lost a key, in a test of many. Writers that write each key once only.
    fn assert_kept_so_far(&self, bed: &RealBed) {
        let mut ledger = self.writer.acked_so_far();
        ledger.merge(self.preloaded.clone());
        assert_read_back(&ledger, bed, "acknowledged keys lost so far");
    }

    /// Stops the writer and reads every acknowledged key back through the proxy.
    fn finish(self, bed: &RealBed) -> (usize, usize) {
        let (_, during, failed) = self.finish_with_ledger(bed);
        (during, failed)
    }

    /// [`Traffic::finish`], giving back every acknowledged key with its value too.
    fn finish_with_ledger(self, bed: &RealBed) -> (Ledger, usize, usize) {
        let mut ledger = self.writer.stop();
        let during = ledger.acked.len();
        let failed = ledger.failed;
        ledger.merge(self.preloaded);
        assert_read_back(&ledger, bed, "acknowledged keys lost");
        assert!(during > 0, "no write was acknowledged during the operation ({failed} failed)");
        (ledger, during, failed)
    }
}

/// Reads every key of `ledger` back through the bed's first proxy; `what` names a failure.
fn assert_read_back(ledger: &Ledger, bed: &RealBed, what: &str) {
    let check = ledger.verify_through_authed(bed.proxies[0].data_addr(), Some(&bed.password));
    assert!(check.is_clean(), "{what}: {}", check.summary());
}

/// Every shard a Codis group with its pods, the master Codis lists being a pika master and every replica in sync
/// with it; every slot owned by one of these groups, none migrating, sizes within one of each other.
fn assert_healthy(bed: &RealBed) {
    let topology = bed.topology();
    assert_eq!(topology.migrating, 0, "slots still migrating: {topology:?}");
    let mut gids = Vec::new();
    for (index, shard) in bed.shards.iter().enumerate() {
        let group = topology
            .group_of(&shard.pods[0].server())
            .unwrap_or_else(|| panic!("{} has no group: {topology:?}", shard.full));
        let master = group.master().expect("a group with servers");
        let ordinal = shard.pods.iter().find(|p| p.server() == master).expect("a master of the shard's pods").ordinal;
        gids.push(bed.assert_registered(index, ordinal));
    }
    assert_eq!(topology.groups.len(), bed.shards.len(), "groups: {topology:?}");
    let sizes: Vec<usize> = gids.iter().map(|&g| topology.slots_of(g)).collect();
    assert_eq!(sizes.iter().sum::<usize>(), topology.slots.len(), "slots outside the shards' groups: {sizes:?}");
    let (max, min) = (sizes.iter().max().copied().unwrap_or(0), sizes.iter().min().copied().unwrap_or(0));
    assert!(max - min <= 1, "unbalanced: {sizes:?}");
}

fn with(mut env: BTreeMap<String, String>, extra: &[(&str, String)]) -> BTreeMap<String, String> {
    for (k, v) in extra {
        env.insert((*k).to_owned(), v.clone());
    }
    env
}

/// Cluster creation as the line runs it: 1.1 registers each shard on its own (component postProvision
/// `--own-shard`), then the ShardingDefinition's postProvision assigns the slots; 1.0 runs each shard's component
/// postProvision, which registers every shard.
fn create(bed: &RealBed) {
    match bed.line {
        Line::V1_1 => {
            for index in 0..bed.shards.len() {
                run_to_completion(bed, &["post-provision", "--own-shard"], &bed.env(index));
            }
            run_to_completion(bed, &["post-provision"], &bed.env(0));
        }
        Line::V1_0 => {
            for index in 0..bed.shards.len() {
                run_to_completion(bed, &["post-provision"], &bed.env(index));
            }
        }
    }
}

/// A bed of one proxy whose cluster is created and healthy.
fn created(shards: usize, pods: u32, line: Line) -> RealBed {
    let bed = bed(shards, pods, line, 1);
    create(&bed);
    assert_healthy(&bed);
    bed
}

fn switchover(bed: &RealBed, index: usize) {
    run_to_completion(bed, &["switchover"], &bed.switchover_env(index));
}

fn scenario_create(shards: usize, line: Line) {
    let bed = created(shards, 2, line);
    let traffic = Traffic::start(&bed, "create");
    std::thread::sleep(Duration::from_secs(1));
    traffic.finish(&bed);
    assert_healthy(&bed);
}

fn scenario_replicas(line: Line) {
    let mut bed = created(2, 2, line);
    let traffic = Traffic::start(&bed, "replicas");
    // A replica joins shard 0 ...
    let ordinal = bed.add_pod(0);
    let (name, fqdn) = (bed.shards[0].pod(ordinal).name.clone(), bed.shards[0].pod(ordinal).fqdn.clone());
    let env = with(bed.env(0), &[("KB_JOIN_MEMBER_POD_NAME", name.clone()), ("KB_JOIN_MEMBER_POD_FQDN", fqdn.clone())]);
    run_to_completion(&bed, &["member-join"], &env);
    assert_healthy(&bed);
    // ... and leaves again (a replica scale-in removes the highest ordinal: switchover first if it is the master).
    if bed.master_ordinal(0) == ordinal {
        switchover(&bed, 0);
    }
    let env = with(bed.env(0), &[("KB_LEAVE_MEMBER_POD_NAME", name), ("KB_LEAVE_MEMBER_POD_FQDN", fqdn)]);
    run_to_completion(&bed, &["member-leave"], &env);
    bed.remove_pod(0, ordinal);
    assert_healthy(&bed);
    traffic.finish(&bed);
}

/// A replica joins a master that was itself copied in full: its binlog starts with the padding pika writes up to the
/// copy's position. The joining pod must hold its master's data.
#[test]
fn a_replica_joins_a_master_that_was_itself_copied_in_full() {
    let mut bed = created(1, 2, Line::V1_1);
    let traffic = Traffic::start(&bed, "join-copied");
    let first = bed.master_ordinal(0);
    let copied = bed.shards[0].pods.iter().find(|p| p.ordinal != first).expect("a replica").ordinal;
    let master_fqdn = bed.shards[0].pod(first).fqdn.clone();
    let pod = bed.shards[0].pod(copied);
    assert_eq!(pod.command(&["SLAVEOF", &master_fqdn, "9221", "force"]), "+OK");
    let in_sync = || {
        let info = pod.info_replication();
        testbed::real::pika::ReplicaState::of(&info).is_some_and(|r| r.in_sync())
            && !info.contains("binlog_offset=0 0,")
    };
    assert!(testbed::cluster::eventually(Duration::from_secs(60), in_sync), "{}", pod.report());
    switchover(&bed, 0);
    assert_eq!(bed.master_ordinal(0), copied, "the copied replica is the master");
    let ordinal = bed.add_pod(0);
    let (name, fqdn) = (bed.shards[0].pod(ordinal).name.clone(), bed.shards[0].pod(ordinal).fqdn.clone());
    let env = with(bed.env(0), &[("KB_JOIN_MEMBER_POD_NAME", name), ("KB_JOIN_MEMBER_POD_FQDN", fqdn)]);
    run_to_completion(&bed, &["member-join"], &env);
    let _ = traffic.finish_on_every_pod(&bed);
}

/// A pod still making its first full copy when its master is switched over: it took the old master's replication
/// ID when the copy began and its binlog holds nothing yet, so it must copy the new master in full. Sent there
/// incrementally it asks the new master for a binlog from where its empty one stands, refused every 10 s for good
/// (seen in the member-leave crash test: binlog `0 0`, `db0:NoConnect`, the switchover after it refused for the
/// link). The new master joined after the cluster's creation, so its binlog does not reach back to `0 0`. The pod's
/// rsync client is slowed (`throttle-bytes-per-second`) so that the copy is still running when the switchover re-points it;
/// afterwards the pod holds every acknowledged key.
#[test]
fn a_pod_still_copying_its_master_when_it_is_switched_over_copies_the_new_master_in_full() {
    let mut bed = created(1, 2, Line::V1_1);
    let traffic = Traffic::start(&bed, "cut-copy");
    let old_master = bed.master_ordinal(0);
    let first_replica = bed.shards[0].pods.iter().find(|p| p.ordinal != old_master).expect("a replica").ordinal;
    // The next master joins now and copies the master in full under writes: its binlog starts with pika's padding
    // up to the copy's position, so it cannot serve a binlog from `0 0` (the first replica, made from an empty
    // master at the cluster's creation, can). The master's dump of the creation, at `0 0`, is deleted first, or pika
    // would serve it again.
    assert_eq!(bed.shards[0].pod(old_master).command(&["DELBACKUP"]), "+OK");
    let next = bed.add_pod(0);
    let pod_env = |kind: &str, ordinal: u32| {
        let pod = bed.shards[0].pod(ordinal);
        with(
            bed.env(0),
            &[
                (&format!("KB_{kind}_MEMBER_POD_NAME"), pod.name.clone()),
                (&format!("KB_{kind}_MEMBER_POD_FQDN"), pod.fqdn.clone()),
            ],
        )
    };
    run_to_completion(&bed, &["member-join"], &pod_env("JOIN", next));
    let copied = || {
        let info = bed.shards[0].pod(next).info_replication();
        testbed::real::pika::ReplicaState::of(&info).is_some_and(|r| r.in_sync())
            && !info.contains("binlog_offset=0 0,")
    };
    assert!(testbed::cluster::eventually(Duration::from_secs(60), copied), "{}", bed.shards[0].pod(next).report());
    // The first replica leaves: the next master is the switchover's only candidate.
    run_to_completion(&bed, &["member-leave"], &pod_env("LEAVE", first_replica));
    bed.remove_pod(0, first_replica);
    let joined = bed.add_pod(0);
    let pod = bed.shards[0].pod(joined);
    let env = with(
        bed.env(0),
        &[("KB_JOIN_MEMBER_POD_NAME", pod.name.clone()), ("KB_JOIN_MEMBER_POD_FQDN", pod.fqdn.clone())],
    );
    assert_eq!(pod.command(&["CONFIG", "SET", "throttle-bytes-per-second", "1024"]), "+OK");
    // member-join sends the SLAVEOF, then waits for a link the slowed copy keeps down: a short budget ends it (75).
    let out = bed.run(&["member-join"], &with(env.clone(), &[("ACTION_BUDGET_SECONDS", "5".into())]));
    assert_eq!(out.status.code(), Some(75), "member-join: {}", describe(&out));
    let copying = || pod.info_replication().contains("is_eligible_for_master_election:false");
    assert!(testbed::cluster::eventually(Duration::from_secs(20), copying), "no copy began: {}", pod.report());
    let copies_before = pod.pika_log().matches("Need Wait To Sync").count();
    // The switchover waits for every member in sync: once the pod has left the old master, its copy goes at full
    // speed again.
    let old_fqdn = bed.shards[0].pod(old_master).fqdn.clone();
    let unthrottled = std::thread::scope(|scope| {
        let lift = scope.spawn(|| {
            let moved = || {
                testbed::real::pika::ReplicaState::of(&pod.info_replication())
                    .is_some_and(|s| s.master_host != old_fqdn)
            };
            testbed::cluster::eventually(Duration::from_secs(60), moved)
                && pod.command(&["CONFIG", "SET", "throttle-bytes-per-second", "209715200"]) == "+OK"
        });
        switchover(&bed, 0);
        lift.join().expect("the thread lifting the throttle")
    });
    assert!(unthrottled, "the pod never left {old_fqdn}: {}", pod.report());
    let new_master = bed.master_ordinal(0);
    assert!(new_master != old_master && new_master != joined, "the switchover went to {new_master}");
    run_to_completion(&bed, &["member-join"], &env);
    let master_fqdn = bed.shards[0].pod(new_master).fqdn.clone();
    let in_sync =
        || testbed::real::pika::ReplicaState::of(&pod.info_replication()).is_some_and(|s| s.in_sync_with(&master_fqdn));
    assert!(testbed::cluster::eventually(Duration::from_secs(60), in_sync), "{}", pod.report());
    let _ = traffic.finish_on_every_pod(&bed);
    let log = pod.pika_log();
    let copies = log.matches("Need Wait To Sync").count();
    let sync_lines = ["Need Wait", "dbsync info", "Change db", "TrySync", "Remove Master", "RsyncClient"];
    let history: Vec<&str> = log.lines().filter(|l| sync_lines.iter().any(|w| l.contains(w))).collect();
    assert!(copies > copies_before, "the pod was not copied again from its new master:\n{}", history.join("\n"));
}

/// A pod that served a full copy as a master, was then copied in full itself and became the master again serves a
/// new dump to the next pod that joins, never the one from before its own copy. pika reuses the dump it has while
/// that dump's binlog file exists (`PikaServer::TryDBSync`), and the dump no longer matches its data or its binlog,
/// which starts with the copy's padding: seen in the member-leave crash test, a pod joining got the empty dump of the
/// cluster's creation at `0 0` and was then refused that binlog position for good. Here the pod is copied in full by
/// the product (a replica's switchover repairing pika's error state); the new pod must hold every acknowledged key.
#[test]
fn a_master_that_was_copied_in_full_serves_a_new_dump_to_a_joining_pod() {
    let mut bed = created(1, 2, Line::V1_1);
    let traffic = Traffic::start(&bed, "stale-dump");
    let first = bed.master_ordinal(0);
    let keys = write_through_proxy(&bed, "before", 200);
    switchover(&bed, 0);
    let second = bed.master_ordinal(0);
    assert_ne!(second, first, "the switchover moved nothing");
    diverge(&bed, first, second, "stray");
    let pod = bed.shards[0].pod(first);
    replica_switchover(&bed, pod);
    let ok = testbed::cluster::eventually(Duration::from_secs(30), || repaired(&bed, first, second, "stray", &keys));
    assert!(ok, "{} was not copied in full from {}: {}", pod.name, second, pod.report());
    switchover(&bed, 0);
    assert_eq!(bed.master_ordinal(0), first, "the copied pod is the master again");
    let joined = bed.add_pod(0);
    let (name, fqdn) = (bed.shards[0].pod(joined).name.clone(), bed.shards[0].pod(joined).fqdn.clone());
    let env = with(bed.env(0), &[("KB_JOIN_MEMBER_POD_NAME", name), ("KB_JOIN_MEMBER_POD_FQDN", fqdn)]);
    run_to_completion(&bed, &["member-join"], &env);
    let _ = traffic.finish_on_every_pod(&bed);
}

/// A split's pod that becomes its shard's master serves the next pod that joins a dump of what it holds since the
/// split, never the one it made for its own replica when its shard was created (empty, at `0 0`): the split copies
/// the new pods from the donor in full, which leaves pika's dump of before in place, and pika reuses a dump while
/// that dump's binlog file exists (`PikaServer::TryDBSync`). The split makes the shard's free replica its master, so
/// a switchover gives mastership back to pod 0, the one that served the copy at creation. The joining pod must hold
/// every key its master holds.
#[test]
fn a_splits_pod_made_master_serves_a_new_dump_to_a_joining_pod() {
    let mut bed = created(1, 2, Line::V1_1);
    let traffic = Traffic::start(&bed, "split-dump");
    let keys = write_through_proxy(&bed, "before", 400);
    scale_out_by(&mut bed, 1, 2);
    assert_healthy(&bed);
    let index = bed.shards.len() - 1;
    if bed.master_ordinal(index) != 0 {
        switchover(&bed, index);
    }
    assert_eq!(bed.master_ordinal(index), 0, "pod 0, which served its replica's copy at creation, is not the master");
    let joined = bed.add_pod(index);
    let (name, fqdn) = (bed.shards[index].pod(joined).name.clone(), bed.shards[index].pod(joined).fqdn.clone());
    let env = with(bed.env(index), &[("KB_JOIN_MEMBER_POD_NAME", name), ("KB_JOIN_MEMBER_POD_FQDN", fqdn)]);
    run_to_completion(&bed, &["member-join"], &env);
    // The keys written before the split that the new shard's master holds, the joined pod must hold too.
    let master = bed.master_ordinal(index);
    let mut on_master = written(&keys);
    let elsewhere = bed.missing_on(index, master, &on_master);
    on_master.retain(|k, _| !elsewhere.contains(k));
    assert!(!on_master.is_empty(), "the split gave the new shard none of the keys written before it");
    let copied = || bed.missing_on(index, joined, &on_master).is_empty();
    assert!(
        testbed::cluster::eventually(Duration::from_secs(30), copied),
        "the joined pod lacks {} of the {} keys its master holds: {}",
        bed.missing_on(index, joined, &on_master).len(),
        on_master.len(),
        bed.shards[index].pod(joined).report()
    );
    let _ = traffic.finish_on_every_pod(&bed);
}

/// A switchover under a writer as fast as the proxy answers, with the failover watcher running as the chart runs it:
/// no acknowledged key lost, and afterwards every pod, the old master among them, holds what its new master holds.
/// pika lets the old master go of its last replica only at that replica's next 3 s replication cron, after the
/// switchover has returned; the watcher re-points it then.
fn scenario_switchover(line: Line) {
    let bed = created(2, 2, line);
    let _watcher = bed.start_watcher();
    let traffic = Traffic::start_paced(&bed, "switchover", Duration::ZERO);
    let before = bed.master_ordinal(0);
    switchover(&bed, 0);
    assert_ne!(bed.master_ordinal(0), before, "the master did not move");
    // Every pod, the old master among them, replicates its master in sync (within 30 s).
    assert_healthy(&bed);
    traffic.finish_on_every_pod(&bed);
}

/// A rolling restart: per shard, the replicas first, then a switchover, then the old master (KubeBlocks' Serial
/// update in role-priority order). Each pod comes back through the chart's pika-start.sh (rejoin first).
fn scenario_rolling_restart(line: Line) {
    let mut bed = created(2, 2, line);
    let traffic = Traffic::start(&bed, "restart");
    for index in 0..bed.shards.len() {
        let master = bed.master_ordinal(index);
        let replicas: Vec<u32> = bed.shards[index].pods.iter().map(|p| p.ordinal).filter(|&o| o != master).collect();
        for ordinal in replicas {
            bed.start_pod(index, ordinal);
        }
        switchover(&bed, index);
        bed.start_pod(index, master);
        assert_healthy(&bed);
    }
    traffic.finish(&bed);
}

/// A scale-out by `new` shards of `pods` pods each, as the line runs it: on 1.1 each new shard registers on its own
/// (component postProvision `--own-shard`), then the ShardingDefinition's shardAdds run as a reconcile calls them
/// (so a 2→4 splits both new shards, each off a donor of its own); on 1.0 each new shard's component postProvision
/// does it all.
fn scale_out_by(bed: &mut RealBed, new: usize, pods: u32) {
    let added: Vec<usize> = (0..new).map(|_| bed.add_shard(pods)).collect();
    for &index in &added {
        match bed.line {
            Line::V1_1 => run_to_completion(bed, &["post-provision", "--own-shard"], &bed.env(index)),
            Line::V1_0 => run_to_completion(bed, &["post-provision"], &bed.env(index)),
        };
    }
    if bed.line == Line::V1_1 {
        let envs: Vec<_> =
            added.iter().map(|&i| with(bed.env(0), &[("KB_ADD_SHARD_NAME", bed.shards[i].full.clone())])).collect();
        reconcile(bed, &["shard-add"], &envs);
    }
}

/// What KubeBlocks 1.1 reconciles do with one change's shardAdds ([`one_call_each`]): each once, in order; those that
/// exit 75 again in the next reconcile, after a pause that doubles from 5 ms, capped at 1 s here (controller-runtime's
/// goes on to 1000 s); at most 60 reconciles.
fn reconcile(bed: &RealBed, args: &[&str], envs: &[BTreeMap<String, String>]) {
    use testbed::kubeblocks::retry::{one_call_each, Ended};
    let r = one_call_each(envs, 60, Duration::from_secs(1), |env| bed.run(args, env));
    let last = r.outputs.last().map(describe).unwrap_or_default();
    match r.ended {
        Ended::Done => {}
        Ended::Failed => panic!("{args:?} failed: {last}\ndashboard log:\n{}", bed.dashboard.log()),
        Ended::OutOfPasses => panic!(
            "{args:?} did not finish in 60 reconciles; the last said:\n{last}\ndashboard log:\n{}\n{}",
            bed.dashboard.log(),
            pods_report(bed)
        ),
    }
}

fn scale_out(bed: &mut RealBed) {
    scale_out_by(bed, 1, 2);
}

fn scenario_scale_out(line: Line) {
    let mut bed = created(3, 2, line);
    let traffic = Traffic::start(&bed, "scaleout");
    scale_out(&mut bed);
    assert_healthy(&bed);
    traffic.finish(&bed);
}

fn scenario_scale_in(line: Line) {
    let mut bed = created(4, 2, line);
    let traffic = Traffic::start(&bed, "scalein");
    let index = 3;
    let full = bed.shards[index].full.clone();
    match line {
        Line::V1_1 => {
            run_to_completion(&bed, &["shard-remove"], &with(bed.env(0), &[("KB_REMOVE_SHARD_NAME", full)]));
        }
        Line::V1_0 => {
            let mut env = bed.env(index);
            env.extend(bed.legacy_env(&[index]));
            env.insert("KB_CLUSTER_COMPONENT_IS_SCALING_IN".into(), "true".into());
            run_to_completion(&bed, &["pre-terminate"], &env);
        }
    }
    bed.remove_shard(index);
    assert_healthy(&bed);
    traffic.finish(&bed);
}

/// A pod comes back on an empty volume (its PVC lost): the chart's start runs rejoin on it first. The master is
/// stopped as a pod deletion stops it (SIGTERM: pika flushes and stops); killed with writes not yet sent to its
/// replica, a master's loss of its disk loses them whatever the product does (replication is asynchronous).
fn scenario_empty_volume(line: Line, of_master: bool) {
    let mut bed = created(2, 2, line);
    let traffic = Traffic::start(&bed, "empty");
    let master = bed.master_ordinal(0);
    let ordinal = if of_master { master } else { 1 - master };
    let pod = bed.shards[0].pod_mut(ordinal);
    pod.stop();
    pod.lose_volume();
    bed.start_pod(0, ordinal);
    assert_healthy(&bed);
    traffic.finish(&bed);
}

#[test]
fn create_three_shards_on_1_0() {
    scenario_create(3, Line::V1_0);
}

#[test]
fn create_three_shards_on_1_1() {
    scenario_create(3, Line::V1_1);
}

#[test]
fn create_one_shard_on_1_0() {
    scenario_create(1, Line::V1_0);
}

#[test]
fn create_one_shard_on_1_1() {
    scenario_create(1, Line::V1_1);
}

#[test]
fn a_replica_added_and_removed_on_1_0() {
    scenario_replicas(Line::V1_0);
}

#[test]
fn a_replica_added_and_removed_on_1_1() {
    scenario_replicas(Line::V1_1);
}

/// The replicas marked for a re-link ([`pika_action::steps::transfer::relink_key`]), by server.
fn relink_marks(bed: &RealBed) -> BTreeMap<String, pika_action::steps::transfer::RelinkMark> {
    with_etcd(bed, async |etcd, prefix| {
        pika_action::steps::transfer::relink_marks(etcd, prefix).await.expect("read the relink marks")
    })
}

/// `f` over a client of the bed's etcd and the bed's cluster prefix there, as the actions name it.
fn with_etcd<T>(bed: &RealBed, f: impl AsyncFnOnce(&pika_action::clients::etcd::Etcd, &str) -> T) -> T {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    rt.block_on(async {
        let etcd = crate::support::connect_etcd(&bed.etcd.endpoint()).await.expect("etcd");
        let prefix = pika_action::clients::etcd::cluster_prefix(testbed::real::bed::NAMESPACE, &bed.name);
        f(&etcd, &prefix).await
    })
}

/// Waits (at most 60 s) until no replica is marked for a re-link: the watcher re-linked each and saw it in sync.
fn wait_for_relinks(bed: &RealBed, watcher: &testbed::real::bed::Watcher) {
    let mut left = BTreeMap::new();
    let gone = testbed::cluster::eventually(Duration::from_secs(60), || {
        left = relink_marks(bed);
        left.is_empty()
    });
    assert!(gone, "replicas never re-linked: {left:?}\nwatcher:\n{}", watcher.log());
}

/// Every replica of a new cluster was copied in full when it joined, and pika leaves its rsync client idle but not
/// stopped after that; the first `SLAVEOF` it gets stops it, refusing writes meanwhile, which unpaid is the promote
/// of the first switchover to it. Registration marks those replicas, and the failover watcher re-links each once it
/// is in sync: under a writer, every mark goes, each replica's own log shows its rsync client stopped, no master's
/// log shows the new link refused (pika tries to link at once, and a master still listing the old link refuses it,
/// after which pika tries again only about 10 s later: sent back to back, the pair was refused for 2 of 4 replicas
/// in one run), every pod replicates its master in sync again, and no acknowledged key is lost.
fn scenario_relink(line: Line) {
    let bed = created(2, 2, line);
    let replicas: Vec<&testbed::real::pika::PikaPod> =
        bed.shards.iter().flat_map(|s| s.pods.iter().filter(|p| p.role() != "master")).collect();
    let marks = relink_marks(&bed);
    for pod in &replicas {
        assert_eq!(
            marks.get(&pod.server().to_ascii_lowercase()),
            Some(&pika_action::steps::transfer::RelinkMark::Copied),
            "{} was copied in full and is not marked: {marks:?}",
            pod.name
        );
    }
    // pika logs this whenever it stops a replica's rsync client that is not idle: a full sync retried may have already.
    let stops = |pod: &testbed::real::pika::PikaPod| pod.pika_log().matches("RsyncClient stop").count();
    let before: Vec<usize> = replicas.iter().map(|p| stops(p)).collect();
    let masters: Vec<&testbed::real::pika::PikaPod> =
        bed.shards.iter().flat_map(|s| s.pods.iter().filter(|p| p.role() == "master")).collect();
    let refusals = |pod: &testbed::real::pika::PikaPod| pod.pika_log().matches("Slave Already Exist").count();
    let refused_before: Vec<usize> = masters.iter().map(|p| refusals(p)).collect();
    let traffic = Traffic::start(&bed, "relink");
    let watcher = bed.start_watcher();
    wait_for_relinks(&bed, &watcher);
    for (pod, before) in replicas.iter().zip(before) {
        assert!(stops(pod) > before, "{}'s idle rsync client was not stopped by its re-link", pod.name);
    }
    for (pod, before) in masters.iter().zip(refused_before) {
        assert_eq!(refusals(pod), before, "{} refused a re-linked replica's new link\n{}", pod.name, watcher.log());
    }
    assert_healthy(&bed);
    traffic.finish_on_every_pod(&bed);
}

/// A re-link killed between its two commands leaves the replica a master of nothing that Codis lists behind the
/// group's master and never routes to. With a writer going, the watcher re-points it (its sweep finds it answering as
/// a master; its repair round every 30 s would too): every pod replicates its master in sync again, each holds what
/// its master holds, no acknowledged key is lost.
#[test]
fn a_re_link_killed_between_its_two_commands_is_repaired_by_the_watcher() {
    let bed = created(1, 2, Line::V1_1);
    let watcher = bed.start_watcher();
    wait_for_relinks(&bed, &watcher);
    let traffic = Traffic::start(&bed, "relink-killed");
    let replica = bed.shards[0].pods.iter().find(|p| p.role() != "master").expect("a replica");
    let reply = replica.connect().command(&["SLAVEOF", "NO", "ONE"]).expect("SLAVEOF NO ONE");
    assert_eq!(reply, "+OK", "SLAVEOF NO ONE on {}", replica.name);
    assert_eq!(replica.role(), "master", "{} is not left a master", replica.name);
    assert_healthy(&bed);
    traffic.finish_on_every_pod(&bed);
}

/// A replica copied in full whose first link drops before anything re-linked it: pika tries again about 10 s later
/// from its binlog position, which after such a drop may lie past writes it never applied (seen in the split bench:
/// its master refused its acks after a session mismatch and closed the link, and 35 writes went missing). The link is
/// cut here with `ss -K`, under a writer, and the watcher started: it copies the replica again in full instead of
/// waiting for pika, and every pod then replicates its master in sync, holding what it holds.
#[test]
fn a_replica_whose_first_link_after_its_full_copy_drops_is_copied_again_by_the_watcher() {
    let bed = created(1, 2, Line::V1_1);
    let replica = bed.shards[0].pods.iter().find(|p| p.role() != "master").expect("a replica");
    let marks = relink_marks(&bed);
    assert_eq!(
        marks.get(&replica.server().to_ascii_lowercase()),
        Some(&pika_action::steps::transfer::RelinkMark::Copied),
        "{} was copied in full at registration and is not marked: {marks:?}",
        replica.name
    );
    let traffic = Traffic::start(&bed, "dropped");
    replica.cut_replication_link();
    let watcher = bed.start_watcher();
    let copied = testbed::cluster::eventually(Duration::from_secs(30), || {
        watcher.log().contains("first link after its full copy dropped")
    });
    assert!(copied, "the watcher did not copy {} again:\n{}\n{}", replica.name, watcher.log(), pods_report(&bed));
    assert_healthy(&bed);
    traffic.finish_on_every_pod(&bed);
}

#[test]
fn replicas_copied_in_full_are_re_linked_by_the_watcher_on_1_0() {
    scenario_relink(Line::V1_0);
}

#[test]
fn replicas_copied_in_full_are_re_linked_by_the_watcher_on_1_1() {
    scenario_relink(Line::V1_1);
}

#[test]
fn switchover_on_1_0() {
    scenario_switchover(Line::V1_0);
}

#[test]
fn switchover_on_1_1() {
    scenario_switchover(Line::V1_1);
}

#[test]
fn rolling_restart_on_1_0() {
    scenario_rolling_restart(Line::V1_0);
}

#[test]
fn rolling_restart_on_1_1() {
    scenario_rolling_restart(Line::V1_1);
}

#[test]
fn scale_out_three_to_four_on_1_0() {
    scenario_scale_out(Line::V1_0);
}

#[test]
fn scale_out_three_to_four_on_1_1() {
    scenario_scale_out(Line::V1_1);
}

// ---- splits (issue 34) --------------------------------------------------------------------------------------------

/// No pod holds a key of a slot its group does not own: a donor gave its copies up with the slots, a new group kept
/// none of the slots it did not take, on every replica too (the deletes went through the binlog). pika's per-slot
/// bookkeeping sets count for the slot they name. Replicas are given time to apply what they received.
fn assert_owns_only(bed: &RealBed) {
    let topology = bed.topology();
    let count = topology.slots.len();
    for shard in &bed.shards {
        let gid = topology.group_of(&shard.pods[0].server()).expect("a group").id;
        for pod in &shard.pods {
            let mut strays = Vec::new();
            let clean = testbed::cluster::eventually(Duration::from_secs(20), || {
                strays = pod
                    .keys()
                    .into_iter()
                    .filter(|k| topology.slots[pika_action::plan::keyslot::slot_of(k.as_bytes(), count)] != gid)
                    .collect();
                strays.is_empty()
            });
            let some: Vec<&String> = strays.iter().take(5).collect();
            assert!(clean, "{} holds {} keys of slots group {gid} does not own, e.g. {some:?}", pod.name, strays.len());
        }
    }
}

/// Splits of shards of three pods under a writer: 1 to 2, then 2 to 4 (each new shard split off a donor of its
/// own). After each, every pod of every group replicates its master in sync, holds what its master holds, and no
/// pod holds a key of a slot its group does not own. Then the newest shard's master is killed: the watcher promotes
/// one of its replicas, and every key acknowledged before the kill is still served. The split's other pods followed
/// the donor's master, which kept taking writes for its own slots after the promote: pointed at the new master
/// incrementally they diverged or stopped in pika's error state with their links up (5 to 6 replicas before this
/// was fixed), and a failover to one of them lost keys.
fn scenario_split_three_pods(line: Line) {
    let mut bed = created(1, 3, line);
    let traffic = Traffic::start(&bed, "split3");
    scale_out_by(&mut bed, 1, 3);
    assert_healthy(&bed);
    assert_owns_only(&bed);
    scale_out_by(&mut bed, 2, 3);
    assert_healthy(&bed);
    let kept = traffic.finish_on_every_pod(&bed);
    assert_owns_only(&bed);

    let watcher = bed.start_watcher();
    let during = writer(&bed, "split3:kill");
    let index = bed.shards.len() - 1;
    let killed = bed.master_ordinal(index);
    bed.shards[index].pod_mut(killed).kill();
    let promoted = failed_over_in(&bed, index, killed, &watcher);
    assert_ne!(promoted, killed);
    let during = during.stop();
    let proxy = bed.proxies[0].data_addr().to_owned();
    let check = kept.verify_through_authed(&proxy, Some(&bed.password));
    assert!(check.is_clean(), "keys acknowledged before the kill lost: {}\n{}", check.summary(), watcher.log());
    // Writes in flight at the kill may go with the master (asynchronous replication): none comes back wrong. The
    // watcher's report of them (a lag it often cannot see: 4 keys lost with no lag reported, here) is issue 35's.
    let lost = during.verify_through_authed(&proxy, Some(&bed.password));
    eprintln!("writes in flight lost with the killed master: {} of {}", lost.lost.len(), lost.checked);
    assert!(lost.wrong.is_empty() && lost.errors.is_empty(), "{}", lost.summary());
    let done = || watcher.log().lines().find(|l| l.contains("failover done")).map(str::to_owned);
    assert!(testbed::cluster::eventually(Duration::from_secs(30), || done().is_some()), "{}", watcher.log());
    eprintln!("{}", done().unwrap_or_default());
}

#[test]
fn splits_of_three_pod_shards_one_to_two_to_four_on_1_0() {
    scenario_split_three_pods(Line::V1_0);
}

#[test]
fn splits_of_three_pod_shards_one_to_two_to_four_on_1_1() {
    scenario_split_three_pods(Line::V1_1);
}

/// A split whose pods cannot sync from the donor by themselves, as pika leaves them for good:
/// - before the begin, the new shard's pod 0 already follows the donor under the replication ID of its own shard
///   (registered on its own first, as 1.1 does): the donor refuses it, its link stays down (how a CI run found one,
///   60 reconciles of "waiting for ... to sync from" the donor);
/// - midway (a run killed before its cutover's promote: the group serves its slots through the alias, the proxies
///   hold them), pod 0 goes into pika's error state: made a master, written to directly far past the donor's binlog
///   position, pointed back at the donor.
///
/// The shardAdd copies the pod again each time and finishes the split: every pod in sync with its master, no pod
/// holding a key of a slot its group does not own, every acknowledged key kept, and the key written behind Codis's
/// back gone.
#[test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "stops the split before its cutover with a crash point (--features failpoints)"
)]
fn a_split_copies_again_a_pod_the_donor_refused_or_sent_into_pikas_error_state() {
    use testbed::real::pika::ReplicaState;
    let mut bed = created(1, 2, Line::V1_1);
    let traffic = Traffic::start(&bed, "stuck");
    let index = bed.add_shard(2);
    run_to_completion(&bed, &["post-provision", "--own-shard"], &bed.env(index));
    // The split's pods follow the donor's pod by its FQDN (the alias is Codis's name for it, not pika's).
    let donor = bed.shards[0].pods[bed.master_ordinal(0) as usize].fqdn.clone();
    let alias = format!("{donor}.:");
    let pod0_state = |bed: &RealBed| ReplicaState::of(&bed.shards[index].pods[0].info_replication());

    // Pod 0 follows the donor under its own ID (it must lose its replica first: pika refuses SLAVEOF until then).
    let own_id = info_field(&bed.shards[index].pods[0].info_replication(), "ReplicationID").unwrap_or_default();
    assert!(!own_id.trim().is_empty(), "the new shard's pod 0 has no replication ID of its own");
    assert_eq!(bed.shards[index].pods[1].command(&["SLAVEOF", "NO", "ONE"]), "+OK");
    let alone = testbed::cluster::eventually(Duration::from_secs(20), || {
        info_field(&bed.shards[index].pods[0].info_replication(), "connected_slaves").as_deref() == Some("0")
    });
    assert!(alone, "pod 1 did not leave pod 0");
    assert_eq!(bed.shards[index].pods[0].command(&["SLAVEOF", &donor, "9221"]), "+OK");
    std::thread::sleep(Duration::from_secs(5));
    let refused = pod0_state(&bed).expect("pod 0 is a replica");
    assert!(!refused.link_up, "the donor let pod 0 in under its own replication ID: {refused:?}");

    // A run killed just before its cutover's promote: the group serves its slots through the alias.
    let full = bed.shards[index].full.clone();
    let crashing = with(
        bed.env(0),
        &[("KB_ADD_SHARD_NAME", full.clone()), ("PIKA_ACTION_CRASH_BEFORE", "/group/promote/".into())],
    );
    // A run out of its budget before the crash point (the donor's copy under load) exits 75; the next resumes it.
    // Pika v4.0.1 re-pointed at the donor after its refused link segfaults at times (1 run in 4 here: its replication
    // client thread, `ClientThread[..]: segfault ... in libc` in the kernel log, right after it loaded the donor's
    // copy), or stops answering for a while: the run exits 1 on a refused or timed-out connection; the kubelet
    // restarts a dead container (rejoin first), as the bed does here, and KubeBlocks calls the action again.
    let mut said = String::new();
    let mut killed = false;
    for _ in 0..10 {
        let out = bed.run(&["shard-add"], &crashing);
        let this = describe(&out);
        killed = out.status.code().is_none() && this.contains("crash point");
        said.push_str(&this);
        said.push('\n');
        if out.status.code() == Some(1) && this.contains(&bed.shards[index].pods[0].fqdn) {
            if !bed.shards[index].pod_mut(0).is_running() {
                eprintln!("pod 0's pika died under the run:\n{}", bed.shards[index].pods[0].logs());
                bed.start_pod(index, 0);
            }
            continue;
        }
        if out.status.code() != Some(75) {
            break;
        }
    }
    assert!(killed, "the run was not killed:\n{said}");
    let topology = bed.topology();
    let midway = topology
        .group_of(&bed.shards[index].pods[0].server())
        .is_some_and(|g| g.master().is_some_and(|m| m.starts_with(&alias)) && topology.slots_of(g.id) > 0);
    assert!(midway, "the split does not serve its slots through the alias: {topology:?}\n{said}");
    assert!(
        said.lines()
            .any(|l| l.contains("forgetting the pod's own replication ID")
                && l.contains(&bed.shards[index].pods[0].fqdn)),
        "pod 0 was not made to forget its ID:\n{said}"
    );

    // Pod 0, in sync with the donor and re-linked to it, into pika's error state.
    let pod0 = &bed.shards[index].pods[0];
    let synced = testbed::cluster::eventually(Duration::from_secs(60), || pod0_state(&bed).is_some_and(|r| r.link_up));
    assert!(synced, "pod 0 did not sync from the donor: {:?}", pod0_state(&bed));
    assert_eq!(pod0.command(&["SLAVEOF", "NO", "ONE"]), "+OK");
    let big = "x".repeat(4 << 20);
    assert_eq!(pod0.command(&["SET", "behind-codis", &big]), "+OK");
    assert_eq!(pod0.command(&["SLAVEOF", &donor, "9221"]), "+OK");
    let error =
        testbed::cluster::eventually(Duration::from_secs(20), || pod0_state(&bed).is_some_and(|r| r.db0 == "error"));
    assert!(error, "pod 0 did not go into pika's error state: {:?}", pod0_state(&bed));

    let runs = run_to_completion(&bed, &["shard-add"], &with(bed.env(0), &[("KB_ADD_SHARD_NAME", full)]));
    assert!(
        runs.iter().any(|r| r.contains("pika's error state") && r.contains("copying it again in full")),
        "pod 0 was not copied again:\n{}",
        runs.join("\n")
    );
    assert_healthy(&bed);
    assert_owns_only(&bed);
    traffic.finish_on_every_pod(&bed);
    for pod in &bed.shards[index].pods {
        assert_eq!(pod.command(&["EXISTS", "behind-codis"]), ":0", "{} kept the key written behind Codis", pod.name);
    }
}

/// Two runs of one split at once: one that read Codis before the other's cutover goes on after it. Both complete the
/// split, and the late one must not command the shard's pods as if the alias still served: pointing the promoted new
/// master back at the donor (which deleted the split's slots at its cleanup) would lose every key the split took.
/// Before the guard, the late run's catch-up did exactly that. A pause point holds the late run at its catch-up while
/// the other runs the split to its end.
#[test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "holds one run at its catch-up with a pause point (--features failpoints)"
)]
fn a_split_run_late_for_the_cutover_another_run_made_leaves_the_new_master_alone() {
    let mut bed = created(1, 2, Line::V1_1);
    let traffic = Traffic::start(&bed, "late");
    // One pod: pika refuses SLAVEOF to a master with replicas, which would hide the loss behind an error.
    let index = bed.add_shard(1);
    run_to_completion(&bed, &["post-provision", "--own-shard"], &bed.env(index));
    let full = bed.shards[index].full.clone();
    let env = with(bed.env(0), &[("KB_ADD_SHARD_NAME", full), ("ACTION_BUDGET_SECONDS", "600".into())]);
    let pause = bed.dir().join("late-run.paused");
    let paused = with(
        env.clone(),
        &[
            ("PIKA_ACTION_PAUSE_AT", "split catch-up".into()),
            ("PIKA_ACTION_PAUSE_FILE", pause.to_string_lossy().into_owned()),
        ],
    );
    let (late, early) = std::thread::scope(|scope| {
        let late = scope.spawn(|| bed.run(&["shard-add"], &paused));
        let held = testbed::cluster::eventually(Duration::from_secs(240), || pause.exists() || late.is_finished());
        assert!(held && pause.exists(), "the late run did not reach its catch-up");
        let early = run_to_completion(&bed, &["shard-add"], &env);
        std::fs::remove_file(&pause).expect("let the late run go on");
        (late.join().expect("the late run"), early)
    });
    let said = describe(&late);
    assert_eq!(late.status.code(), Some(0), "the late run failed:\n{said}");
    assert!(
        early.iter().any(|r| r.contains("promoted with writes held")),
        "the early run did not make the cutover:\n{}",
        early.join("\n")
    );
    assert_healthy(&bed);
    assert_owns_only(&bed);
    traffic.finish_on_every_pod(&bed);
    assert!(said.contains("another run began the split's cutover"), "the late run did not notice the cutover:\n{said}");
}

/// The slots a 1.1 shardAdd of `new` (registered on its own, serving nothing yet) takes from their donor by a split,
/// as the product plans it: the step toward every group owning its share.
fn split_slots(bed: &RealBed, new: usize) -> std::collections::BTreeSet<usize> {
    use pika_action::plan::{self, SlotState};
    let topology = bed.topology();
    let gid = topology.group_of(&bed.shards[new].pods[0].server()).expect("the new shard's group").id;
    let states: Vec<SlotState> =
        topology.slots.iter().map(|&g| SlotState { owner: (g != 0).then_some(g), in_flight_target: None }).collect();
    let goal = plan::Goal::new(topology.groups.iter().map(|g| g.id), 0);
    let step = plan::toward(&states, &goal).expect("a step toward the goal");
    let split = plan::split::split_of(&states, &step, gid).expect("the new shard is split off a donor");
    split.slots.iter().map(|&s| s as usize).collect()
}

/// A split's cutover under writers aimed at the split's slots only, as fast as the proxy answers: every write the
/// donor's master acknowledged before the promote reaches the new master. Before the cutover was fenced the split
/// re-checked the new master's position for at most 3 s and promoted anyway, so writes acknowledged after the last
/// check went; the proxies now hold the slots first and the donor's position is read after that.
#[test]
fn a_splits_cutover_under_writers_aimed_at_its_slots_keeps_every_acknowledged_key() {
    let mut bed = created(1, 2, Line::V1_1);
    let index = bed.add_shard(2);
    run_to_completion(&bed, &["post-provision", "--own-shard"], &bed.env(index));
    let slots = split_slots(&bed, index);
    let count = bed.topology().slots.len();
    let keys: Vec<String> = (0..20_000)
        .map(|n| format!("aimed:pre:{n}"))
        .filter(|k| slots.contains(&testbed::codis::slothash::slot_of(k.as_bytes(), count)))
        .collect();
    let proxy = bed.proxies[0].data_addr().to_owned();
    let preloaded = Ledger::write_keys_authed(&proxy, Some(&bed.password), &keys).expect("preload");
    assert_eq!(preloaded.acked.len(), keys.len(), "preload: {:?}", preloaded.errors);
    let aimed = Workload::start(WorkloadOptions {
        prefix: "aimed".to_owned(),
        auth: Some(bed.password.clone()),
        pace: Duration::ZERO,
        writers: 4,
        only_slots: Some((count, slots.clone())),
        ..WorkloadOptions::through(std::slice::from_ref(&proxy))
    });
    assert!(aimed.wait_for_acked(200, Duration::from_secs(20)), "the aimed writers got no write through the proxy");
    let full = bed.shards[index].full.clone();
    let said = run_to_completion(&bed, &["shard-add"], &with(bed.env(0), &[("KB_ADD_SHARD_NAME", full)]));
    let mut ledger = aimed.stop();
    // How long the split's slots were held, for the record (speed is the benchmark's to judge).
    for line in said.iter().flat_map(|s| s.lines()).filter(|l| l.contains("promoted with writes held")) {
        eprintln!("{line}");
    }
    let during = ledger.acked.len();
    // The writers were aimed at what the split took: the new group owns exactly those slots.
    let topology = bed.topology();
    let gid = topology.group_of(&bed.shards[index].pods[0].server()).expect("a group").id;
    let owned: std::collections::BTreeSet<usize> =
        topology.slots.iter().enumerate().filter(|(_, &g)| g == gid).map(|(i, _)| i).collect();
    assert_eq!(owned, slots, "the split did not take the slots the writers were aimed at");
    ledger.merge(preloaded);
    let check = ledger.verify_through_authed(&proxy, Some(&bed.password));
    assert!(check.is_clean(), "acknowledged keys lost at the split's cutover: {}", check.summary());
    assert!(during > 0, "no write was acknowledged during the split");
    assert_healthy(&bed);
    assert_owns_only(&bed);
}

#[test]
fn scale_in_four_to_three_on_1_0() {
    scenario_scale_in(Line::V1_0);
}

#[test]
fn scale_in_four_to_three_on_1_1() {
    scenario_scale_in(Line::V1_1);
}

/// A scale-in whose only remaining group's master does not answer (its pod died; one pod per shard, so no failover
/// mends it): the drain cannot ask it for `slotmigrate`, moves nothing and exits 75 for a later run, as any wait
/// another process ends; once the pod is back, the next run drains.
#[test]
fn a_drain_onto_a_master_that_does_not_answer_moves_nothing_and_is_run_again() {
    let mut bed = created(2, 1, Line::V1_1);
    let before = bed.topology().slots;
    let env = with(bed.env(0), &[("KB_REMOVE_SHARD_NAME", bed.shards[1].full.clone())]);
    bed.shards[0].pod(0).crash();
    let out = bed.run(&["shard-remove"], &env);
    let said = describe(&out);
    assert_eq!(out.status.code(), Some(75), "a drain onto a dead master: {said}");
    assert!(said.contains("drain waiting") && said.contains("slotmigrate"), "{said}");
    assert_eq!(bed.topology().slots, before, "slots moved onto a master nobody could ask");
    bed.start_pod(0, 0);
    run_to_completion(&bed, &["shard-remove"], &env);
    bed.remove_shard(1);
    assert_healthy(&bed);
}

#[test]
fn a_master_back_on_an_empty_volume_on_1_0() {
    scenario_empty_volume(Line::V1_0, true);
}

#[test]
fn a_master_back_on_an_empty_volume_on_1_1() {
    scenario_empty_volume(Line::V1_1, true);
}

/// The pika container's preStop hook, run as the kubelet runs it before SIGTERM: a replica's moves nothing; a
/// master's moves nothing when the Kubernetes API says the Cluster is being deleted; otherwise the master's hands
/// mastership to its replica once, before pika is stopped, and the old master follows the new one.
#[test]
fn pre_stop_hands_a_masters_role_over_unless_the_cluster_is_being_deleted_and_leaves_a_replica_alone() {
    use crate::cluster_api::{ClusterAnswer, ClusterApi};
    let bed = created(1, 2, Line::V1_1);
    let api = ClusterApi::start(testbed::real::bed::NAMESPACE, &bed.name, ClusterAnswer::Deleting);
    let hook = |ordinal: u32| {
        let pod = bed.shards[0].pod(ordinal).name.clone();
        let env = with(bed.env(0), &[("POD_NAME", pod), ("KUBE_API_URL", api.url())]);
        let out = bed.run(&["pre-stop"], &env);
        let said = describe(&out);
        assert_eq!(out.status.code(), Some(0), "pre-stop of pod {ordinal}: {said}");
        said
    };
    let master = bed.master_ordinal(0);
    let replica = 1 - master;
    let promoted_before = promotes(&bed);

    let said = hook(master);
    assert!(said.contains("is being deleted"), "the hook did not see the cluster's deletion: {said}");
    assert_eq!(bed.master_ordinal(0), master, "a hook moved the master of a cluster being deleted");

    api.set(ClusterAnswer::Stays(vec![("pk".to_owned(), 1)]));
    let said = hook(replica);
    assert_eq!(bed.master_ordinal(0), master, "a replica's hook moved the master: {said}");
    assert_eq!(promotes(&bed), promoted_before, "a promote without a master's hook");

    let said = hook(master);
    assert_eq!(bed.master_ordinal(0), replica, "the master's hook did not hand over: {said}");
    assert_eq!(promotes(&bed), promoted_before + 1, "one hand-over, one promote");
    // The old master still runs (SIGTERM comes after the hook) and already follows the new one.
    let new_master = bed.shards[0].pod(replica).fqdn.clone();
    let follows = || {
        testbed::real::pika::ReplicaState::of(&bed.shards[0].pod(master).info_replication())
            .is_some_and(|s| s.in_sync_with(&new_master))
    };
    assert!(testbed::cluster::eventually(Duration::from_secs(30), follows), "the old master does not follow: {said}");
    assert_healthy(&bed);
}

#[test]
fn a_replica_back_on_an_empty_volume_on_1_0() {
    scenario_empty_volume(Line::V1_0, false);
}

#[test]
fn a_replica_back_on_an_empty_volume_on_1_1() {
    scenario_empty_volume(Line::V1_1, false);
}

// ---- what the stand-in cannot show ----------------------------------------------------------------------------

/// The same attack on a redis-server pair and on a real pika pair: a replica is promoted, takes writes the master
/// never sees, and is pointed back at its master with a plain `SLAVEOF`. redis-server notices the other history
/// (another replication ID) and resyncs in full; pika v4.0.1 checks only the binlog position, finds the replica
/// ahead of its master, and leaves it in an error state with its link down and its stray writes kept, for good
/// (pika.md §8). A product tested only on the stand-in would count such a replica converged; a bed that ran
/// redis-server as pika again fails the pika half of this test.
#[test]
fn a_replica_pointed_back_after_diverging_resyncs_on_redis_server_and_stays_stuck_on_real_pika() {
    use testbed::real::pika::ReplicaState;
    use testbed::RedisServer;

    let redis_master = RedisServer::start();
    let redis_replica = RedisServer::start();
    let port = redis_master.port().to_string();
    let follow = |replica: &RedisServer| replica.command(&["SLAVEOF", "127.0.0.1", &port]);
    assert!(follow(&redis_replica).contains("OK"));
    let linked = || redis_replica.master().is_some_and(|(_, _, up)| up);
    assert!(testbed::cluster::eventually(Duration::from_secs(10), linked), "redis replica never linked");
    assert!(redis_master.command(&["SET", "shared", "1"]).contains("OK"));
    assert!(redis_replica.command(&["SLAVEOF", "NO", "ONE"]).contains("OK"));
    for n in 0..100 {
        assert!(redis_replica.command(&["SET", &format!("stray:{n}"), "x"]).contains("OK"));
    }
    assert!(follow(&redis_replica).contains("OK"));
    let resynced = || linked() && redis_replica.command(&["EXISTS", "stray:0"]).contains(":0");
    assert!(
        testbed::cluster::eventually(Duration::from_secs(15), resynced),
        "redis-server did not resync the diverged replica: {}",
        redis_replica.info_replication()
    );

    let bed = bed(1, 2, Line::V1_1, 0);
    let (master, replica) = (bed.shards[0].pod(0), bed.shards[0].pod(1));
    let state = || ReplicaState::of(&replica.info_replication());
    let in_sync = || state().is_some_and(|s| s.in_sync());
    let pika_follow = || replica.command(&["SLAVEOF", &master.fqdn, "9221"]);
    assert!(pika_follow().contains("OK"), "SLAVEOF refused");
    assert!(testbed::cluster::eventually(Duration::from_secs(20), in_sync), "pika replica never synced: {:?}", state());
    assert!(master.command(&["SET", "shared", "1"]).contains("OK"));
    assert!(replica.command(&["SLAVEOF", "NO", "ONE"]).contains("OK"));
    for n in 0..100 {
        assert!(replica.command(&["SET", &format!("stray:{n}"), "x"]).contains("OK"));
    }
    assert!(pika_follow().contains("OK"), "SLAVEOF refused");
    // It never gets back in sync: watched for 10 s (pika never retries from its error state).
    let recovered = testbed::cluster::eventually(Duration::from_secs(10), in_sync);
    let seen = state();
    assert!(!recovered, "pika resynced the diverged replica by itself: {seen:?}");
    assert!(seen.as_ref().is_some_and(|s| !s.link_up), "the link of a stuck replica is reported up: {seen:?}");
    assert_eq!(replica.command(&["EXISTS", "stray:0"]), ":1", "the stray write went: a resync happened after all");
}

/// Puts pod `ordinal` of shard 0 into pika's replication error state, as a history of its own puts a replica
/// there: it becomes a master, takes `stray` writes nobody else gets, and is pointed back at `master` with a plain
/// `SLAVEOF` (pika.md §8). Waits until pika says `db0:error`, and checks it still calls itself eligible.
fn diverge(bed: &RealBed, ordinal: u32, master: u32, stray: &str) {
    use testbed::real::pika::ReplicaState;
    let (pod, master) = (bed.shards[0].pod(ordinal), bed.shards[0].pod(master));
    assert_eq!(pod.command(&["SLAVEOF", "NO", "ONE"]), "+OK");
    for n in 0..100 {
        assert_eq!(pod.command(&["SET", &format!("{stray}:{n}"), "stray"]), "+OK");
    }
    // A megabyte of binlog ahead of the master: pika accepts a returning replica at any record boundary within its
    // master's binlog (pika.md §8), so a master whose writers took more meanwhile than the stray writes would take
    // the pod back incrementally, with no error state (seen once on a loaded machine: `db0:connected`).
    let ballast = "b".repeat(1 << 20);
    assert_eq!(pod.command(&["SET", &format!("{stray}:ballast"), &ballast]), "+OK");
    assert_eq!(pod.command(&["SLAVEOF", &master.fqdn, "9221"]), "+OK");
    let in_error = || ReplicaState::of(&pod.info_replication()).is_some_and(|s| s.db0 == "error");
    assert!(
        testbed::cluster::eventually(Duration::from_secs(20), in_error),
        "{} did not enter pika's error state: {}",
        pod.name,
        pod.info_replication()
    );
    let info = pod.info_replication();
    assert_eq!(info_field(&info, "is_eligible_for_master_election").as_deref(), Some("true"), "{info}");
}

/// Whether pod `ordinal` of shard 0 replicates `master` with its link up and `db0:connected`, holds none of the keys
/// of `stray` and every key of `keys`.
fn repaired(bed: &RealBed, ordinal: u32, master: u32, stray: &str, keys: &[String]) -> bool {
    use testbed::real::pika::ReplicaState;
    let (pod, master) = (bed.shards[0].pod(ordinal), bed.shards[0].pod(master));
    ReplicaState::of(&pod.info_replication()).is_some_and(|s| s.in_sync_with(&master.fqdn))
        && pod.command(&["EXISTS", &format!("{stray}:0")]) == ":0"
        && bed.missing_on(0, ordinal, &written(keys)).is_empty()
}

/// The switchover KubeBlocks calls for replica `pod` of shard 0 before it restarts it, run to completion.
fn replica_switchover(bed: &RealBed, pod: &testbed::real::pika::PikaPod) {
    let env = with(
        bed.env(0),
        &[
            ("KB_SWITCHOVER_CURRENT_NAME", pod.name.clone()),
            ("KB_SWITCHOVER_CURRENT_FQDN", pod.fqdn.clone()),
            ("KB_SWITCHOVER_ROLE", "slave".into()),
        ],
    );
    run_to_completion(bed, &["switchover"], &env);
}

/// One shard of three pods: its master, the replica to put in pika's error state (the one the ordinal rule would
/// promote: the highest ordinal above the master, else the lowest below) and the other, healthy replica.
fn one_replica_to_spoil() -> (RealBed, u32, u32, u32) {
    let bed = created(1, 3, Line::V1_0);
    let master = bed.master_ordinal(0);
    let spoiled = (0..3).filter(|&o| o != master).max().expect("a replica");
    let healthy = (0..3).find(|&o| o != master && o != spoiled).expect("another replica");
    (bed, master, spoiled, healthy)
}

/// Issue 33: a replica in pika's error state still says it is eligible, but its link is down and it never gets out
/// by itself. A replica's switchover (KubeBlocks calls one for every pod it restarts) converges the group, and
/// converged means in sync: the replica copies its master in full, its stray writes gone, the master's keys there.
#[test]
fn a_replicas_switchover_resyncs_a_replica_in_pikas_error_state_in_full() {
    let (bed, master, spoiled, _) = one_replica_to_spoil();
    let keys = write_through_proxy(&bed, "before", 200);
    diverge(&bed, spoiled, master, "stray");
    let pod = bed.shards[0].pod(spoiled);
    replica_switchover(&bed, pod);
    assert_eq!(bed.master_ordinal(0), master, "a replica's switchover moved the master");
    let ok = testbed::cluster::eventually(Duration::from_secs(30), || repaired(&bed, spoiled, master, "stray", &keys));
    assert!(ok, "{} was not resynced from its master: {}", pod.name, pod.info_replication());
}

/// Three master switchovers under a writer: each time, the replica that is neither the old master nor the new one
/// leaves the old master before it follows the new one: the old master's log shows it dropped the replica's link
/// before the replica's own log shows its sync with the new master accepted (pika closes the old link only at the
/// replica's next 3 s cron; a replica sent straight to the new master syncs with it about 0.2 s after the `SLAVEOF`,
/// and the old master's messages then reach the new session: the member-leave crash test found such a replica
/// missing 33 acknowledged writes), no session mismatch is logged after it left, and no acknowledged key is lost on
/// any pod.
#[test]
fn a_replica_moved_to_a_new_master_leaves_the_old_one_first() {
    let bed = created(1, 3, Line::V1_1);
    let traffic = Traffic::start(&bed, "leave-first");
    // Three switchovers: each moves one replica. Sent straight to the new master, a replica synced with it before
    // the old link closed in 3 of 5 such moves here.
    for _ in 0..3 {
        let old = bed.master_ordinal(0);
        switchover(&bed, 0);
        let new = bed.master_ordinal(0);
        assert_ne!(new, old, "the switchover moved nothing");
        let moved = bed.shards[0].pods.iter().find(|p| p.ordinal != old && p.ordinal != new).expect("a third pod");
        let old_pod = bed.shards[0].pod(old);
        let log = moved.pika_log();
        let lines: Vec<&str> = log.lines().collect();
        let left = lines
            .iter()
            .rposition(|l| l.contains("Remove Master Success") && l.contains(old_pod.fqdn.as_str()))
            .unwrap_or_else(|| panic!("{} never left {}:\n{log}", moved.name, old_pod.fqdn));
        let after = &lines[left..];
        let report = after.join("\n");
        let synced = after
            .iter()
            .find(|l| l.contains("TrySync Ok"))
            .unwrap_or_else(|| panic!("{} did not sync with the new master:\n{report}", moved.name));
        // The old master's own record of dropping the link, between the replica's leaving and its new sync.
        let dropped = format!("Delete Slave Success, ip_port: {}:9221", moved.net.addr);
        let old_log = old_pod.pika_log();
        let dropped_at = old_log
            .lines()
            .filter(|l| l.contains(&dropped))
            .map(glog_time)
            .find(|&at| at >= glog_time(after[0]) && at <= glog_time(synced));
        assert!(
            dropped_at.is_some(),
            "{} synced with the new master before {} dropped its link:\n{report}\n--- {} ---\n{}",
            moved.name,
            old_pod.name,
            old_pod.name,
            old_log.lines().filter(|l| l.contains(&moved.net.addr.to_string())).collect::<Vec<_>>().join("\n")
        );
        assert!(!report.contains("SessionId Mismatch"), "a session mismatch after {} left:\n{report}", moved.name);
    }
    let _ = traffic.finish_on_every_pod(&bed);
}

/// The time of a glog line (`I20261207 03:53:46.236635 ...`), as text that sorts in time order.
fn glog_time(line: &str) -> &str {
    line.get(1..25).unwrap_or_default()
}

/// Issue 33: a master's switchover with a replica in pika's error state. Named as the candidate it is refused (exit 2
/// naming the variable, nothing changed); without a candidate the healthy replica is promoted although the ordinal
/// rule prefers the other; and the replica in error, left following the old master, copies the new one in full
/// (pointed at it with a plain `SLAVEOF` it would stay in error, or sync on from a position the new master's history
/// does not share).
#[test]
fn a_masters_switchover_never_promotes_a_replica_in_pikas_error_state_and_resyncs_it_from_the_new_master() {
    let (bed, master, spoiled, healthy) = one_replica_to_spoil();
    let mut keys = write_through_proxy(&bed, "before", 200);
    diverge(&bed, spoiled, master, "stray");

    let pod = bed.shards[0].pod(spoiled);
    let env = with(
        bed.switchover_env(0),
        &[("KB_SWITCHOVER_CANDIDATE_NAME", pod.name.clone()), ("KB_SWITCHOVER_CANDIDATE_FQDN", pod.fqdn.clone())],
    );
    let out = bed.run(&["switchover"], &env);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    assert!(describe(&out).contains("KB_SWITCHOVER_CANDIDATE"), "{}", describe(&out));
    assert_eq!(bed.master_ordinal(0), master, "a refused switchover moved the master");
    let state = testbed::real::pika::ReplicaState::of(&pod.info_replication());
    assert!(state.as_ref().is_some_and(|s| s.db0 == "error"), "a refused switchover touched it: {state:?}");

    switchover(&bed, 0);
    assert_eq!(bed.master_ordinal(0), healthy, "the switchover did not promote the healthy replica");
    keys.extend(write_through_proxy(&bed, "after", 200));
    let ok = testbed::cluster::eventually(Duration::from_secs(30), || repaired(&bed, spoiled, healthy, "stray", &keys));
    assert!(ok, "{} was not resynced from the new master: {}", pod.name, pod.info_replication());
    assert_eq!(missing_through_proxy(&bed, &keys), Vec::<String>::new(), "keys lost through the proxy");
}

/// Issue 33: once its master is gone, a replica that was in pika's error state reads like any other (pika turns
/// `error` into `no_connect`), says it is eligible, and is further ahead than the healthy replica (its stray
/// writes). The failover watcher must not promote it: it promotes the healthy replica, and the one that was in
/// error then copies the new master in full.
#[test]
fn a_replica_that_was_in_pikas_error_state_is_not_elected_when_its_master_dies() {
    let (bed, master, spoiled, healthy) = one_replica_to_spoil();
    let keys = write_through_proxy(&bed, "before", 200);
    let caught_up = || bed.missing_on(0, healthy, &written(&keys)).is_empty();
    assert!(testbed::cluster::eventually(Duration::from_secs(20), caught_up), "the healthy replica never caught up");
    // The watcher starts once the replica is in error: running before, it re-points a replica that leaves its master
    // (the divergence's SLAVEOF NO ONE) before the stray writes land.
    diverge(&bed, spoiled, master, "stray");
    let watcher = bed.start_watcher();
    // The master dies the moment the watcher has seen the replica in error (its repair, a full resync, takes longer).
    let seen = || watcher.log().contains("replica out of sync");
    assert!(
        testbed::cluster::eventually(Duration::from_secs(10), seen),
        "the watcher never saw it:\n{}",
        watcher.log()
    );
    let mut bed = bed;
    bed.shards[0].pod_mut(master).kill();
    assert_eq!(
        failed_over(&bed, master, &watcher),
        healthy,
        "the replica that was in pika's error state was promoted (its stray writes served, the master's lost):\n{}",
        watcher.log()
    );
    let ok = testbed::cluster::eventually(Duration::from_secs(60), || repaired(&bed, spoiled, healthy, "stray", &keys));
    let pod = bed.shards[0].pod(spoiled);
    assert!(ok, "{} was not resynced from the new master: {}\n{}", pod.name, pod.info_replication(), watcher.log());
    assert_eq!(missing_through_proxy(&bed, &keys), Vec::<String>::new(), "keys lost through the proxy");
}

/// A writer through the bed's proxy at the pace of [`Traffic`], keys named `<prefix>:…`.
fn writer(bed: &RealBed, prefix: &str) -> Workload {
    let writer = Workload::start(WorkloadOptions {
        prefix: prefix.to_owned(),
        auth: Some(bed.password.clone()),
        pace: Duration::from_millis(2),
        ..WorkloadOptions::through(&[bed.proxies[0].data_addr().to_owned()])
    });
    assert!(writer.wait_for_acked(50, Duration::from_secs(20)), "the writer got no write through the proxy");
    writer
}

/// Waits until Codis lists a master other than `killed` for shard 0; returns its ordinal.
fn failed_over(bed: &RealBed, killed: u32, watcher: &testbed::real::bed::Watcher) -> u32 {
    failed_over_in(bed, 0, killed, watcher)
}

/// Promotes the fork's dashboard ran so far: each logs "resync to prepared" once (`topom_group.go`). Not its last
/// line, "resync to finished": the dashboard's logger holds its latest line until the next one (seen held over 60 s).
fn promotes(bed: &RealBed) -> usize {
    bed.dashboard.whole_log().lines().filter(|l| l.contains("resync to prepared")).count()
}

/// Waits until Codis lists a master other than `killed` for shard `index`; returns its ordinal.
fn failed_over_in(bed: &RealBed, index: usize, killed: u32, watcher: &testbed::real::bed::Watcher) -> u32 {
    let dead = bed.shards[index].pod(killed).server();
    let moved =
        || bed.topology().group_of(&dead).and_then(|g| g.master().map(str::to_owned)).is_some_and(|m| m != dead);
    assert!(testbed::cluster::eventually(Duration::from_secs(60), moved), "no failover:\n{}", watcher.log());
    bed.master_ordinal(index)
}

/// Issue 33: failover after failover. A master is SIGKILLed with writes in flight, so it may hold writes its
/// replicas never got; the watcher promotes a replica; the killed pod comes back through `rejoin` and must copy the
/// new master in full (pointed at it incrementally it would keep its stray writes or stop in pika's error state,
/// yet say it is eligible). Then the new master is killed too. Whoever is promoted the second time must hold every
/// key preloaded before and acknowledged between the two failovers. Only writes the first master alone took (its
/// replicas hung) may go, and the watcher must report a lag for them, as a lower bound (it cannot see writes after
/// the master's last answer).
#[test]
fn a_failover_after_a_failover_promotes_no_stale_server_and_loses_no_key_written_between() {
    let mut bed = created(1, 3, Line::V1_0);
    let preload: Vec<String> = (0..1000).map(|n| format!("twice:pre:{n}")).collect();
    let preloaded =
        Ledger::write_keys_authed(bed.proxies[0].data_addr(), Some(&bed.password), &preload).expect("preload");
    let watcher = bed.start_watcher();
    let before = writer(&bed, "twice:a");
    let first = bed.master_ordinal(0);
    // The replicas hang for a moment: the master alone takes the writes acknowledged meanwhile.
    let replicas: Vec<u32> = (0..3).filter(|&o| o != first).collect();
    for &o in &replicas {
        bed.shards[0].pod(o).freeze();
    }
    let acked = before.acked();
    assert!(before.wait_for_acked(acked + 100, Duration::from_secs(20)), "no write while the replicas hung");
    bed.shards[0].pod_mut(first).kill();
    for &o in &replicas {
        bed.shards[0].pod(o).thaw();
    }
    let second = failed_over(&bed, first, &watcher);
    let before = before.stop();

    // Between the failovers: a second writer, on while the first master comes back.
    let between = writer(&bed, "twice:b");
    bed.start_pod(0, first);
    let master_fqdn = bed.shards[0].pod(second).fqdn.clone();
    let in_sync = || {
        testbed::real::pika::ReplicaState::of(&bed.shards[0].pod(first).info_replication())
            .is_some_and(|s| s.in_sync_with(&master_fqdn))
    };
    let synced = testbed::cluster::eventually(Duration::from_secs(60), in_sync);
    assert!(synced, "the first master never synced from the second: {}", bed.shards[0].pod(first).info_replication());
    let between = between.stop();
    // Every write acknowledged so far reached the replicas: wait for them, so the second kill loses nothing.
    let third = (0..3).find(|&o| o != first && o != second).expect("a third pod");
    for ordinal in [first, third] {
        let mut conn = bed.shards[0].pod(ordinal).connect();
        let caught_up =
            || between.acked.iter().all(|(k, v)| conn.command(&["GET", k]).ok().as_deref() == Some(v.as_str()));
        assert!(testbed::cluster::eventually(Duration::from_secs(30), caught_up), "pod {ordinal} never caught up");
    }

    bed.shards[0].pod_mut(second).kill();
    let promoted = failed_over(&bed, second, &watcher);
    assert_ne!(promoted, second);
    let proxy = bed.proxies[0].data_addr().to_owned();
    let mut kept = preloaded;
    kept.merge(between);
    let check = kept.verify_through_authed(&proxy, Some(&bed.password));
    assert!(
        check.is_clean(),
        "keys acknowledged before the first kill or between the kills lost after promoting pod {promoted}: {}\n{}",
        check.summary(),
        watcher.log()
    );
    // Writes the first master alone took may go with it (asynchronous replication): no failover can keep them.
    let lost = before.verify_through_authed(&proxy, Some(&bed.password));
    eprintln!("writes of the first writer lost with the first master: {} of {}", lost.lost.len(), lost.checked);
    assert!(lost.wrong.is_empty() && lost.errors.is_empty(), "{}", lost.summary());
    // The watcher cannot see writes after the master's last answer: it reports the lag it saw as a lower bound.
    if !lost.lost.is_empty() {
        let reported =
            watcher.log().lines().any(|l| l.contains("failover done") && l.contains("replication lag at least"));
        assert!(
            reported,
            "{} keys went with the first master and no lag was reported:\n{}",
            lost.lost.len(),
            watcher.log()
        );
    }
}

// ---- through the KubeBlocks emulation, on the real servers ------------------------------------------------------
//
// The same operations as KubeBlocks runs them (`testbed::kubeblocks` with `real_servers`: its controllers, retries,
// preconditions, role probes and API server, each action run by kbagent in its pod's network namespace), over real
// pika pods, the fork's dashboard and proxy and real etcd. What the emulation does not model is listed in
// `testbed/src/kubeblocks/mod.rs`; with real servers the codis-proxy preStop script is not run either.

mod emulated {
    use std::time::Duration;

    use testbed::kubeblocks::{KubeBlocks, Line, Options};
    use testbed::real::pika::ReplicaState;
    use testbed::{Ledger, Workload, WorkloadOptions};

    fn install(line: Line, name: &str) -> KubeBlocks {
        let mut opts = Options::new(line, env!("CARGO_BIN_EXE_pika-action"));
        opts.cluster = format!("{name}{}", if line == Line::V1_0 { "a" } else { "b" });
        opts.real_servers = true;
        KubeBlocks::install(opts).unwrap_or_else(|e| panic!("installing the addon chart: {e}"))
    }

    fn step(kb: &KubeBlocks, what: &str, result: Result<Duration, testbed::kubeblocks::Stuck>) {
        if let Err(stuck) = result {
            panic!("[KubeBlocks {}] {what}: {stuck}", kb.line().chart_value());
        }
    }

    /// Every live shard a Codis group with exactly its pods; its master a pika master; every other pod in sync with
    /// it (link up, db0 connected); no other group; every slot owned, none migrating, balanced.
    fn assert_converged(kb: &KubeBlocks, shards: usize, replicas: usize) {
        let line = kb.line().chart_value();
        let dashboard = kb.dashboard().expect("codis-dashboard");
        let settled = testbed::cluster::eventually(Duration::from_secs(30), || dashboard.topology().migrating == 0);
        assert!(settled, "[{line}] slots still migrating: {:?}", dashboard.topology());
        let topology = dashboard.topology();
        let live: Vec<_> = kb.shards().into_iter().filter(|s| !s.deleting).collect();
        assert_eq!(live.len(), shards, "[{line}] shards");
        let mut gids = Vec::new();
        for shard in &live {
            assert_eq!(shard.pods.len(), replicas, "[{line}] pods of {}", shard.full);
            let group = topology
                .group_of(&shard.pods[0].server)
                .unwrap_or_else(|| panic!("[{line}] {} is in no group: {topology:?}", shard.full));
            let mut listed = group.servers.clone();
            listed.sort();
            let mut expected: Vec<String> = shard.pods.iter().map(|p| p.server.clone()).collect();
            expected.sort();
            assert_eq!(listed, expected, "[{line}] group {} lists exactly the pods of {}", group.id, shard.full);
            gids.push(group.id);
            let master = group.master().expect("a master");
            let master_pod = shard.pods.iter().find(|p| p.server == master).expect("the master is a pod of the shard");
            let master_pika = kb.pika(&master_pod.name).expect("the master's pika");
            let (master_fqdn, master_ip) = {
                let p = master_pika.lock().unwrap();
                assert_eq!(p.role(), "master", "[{line}] {} is a pika master", master_pod.name);
                (p.fqdn.clone(), p.net.addr.to_string())
            };
            for pod in shard.pods.iter().filter(|p| p.server != master) {
                let pika = kb.pika(&pod.name).expect("a pika");
                let mut last = None;
                let in_sync = testbed::cluster::eventually(Duration::from_secs(30), || {
                    last = ReplicaState::of(&pika.lock().unwrap().info_replication());
                    last.as_ref()
                        .is_some_and(|r| (r.master_host == master_fqdn || r.master_host == master_ip) && r.in_sync())
                });
                assert!(in_sync, "[{line}] {} is not in sync with {}: {last:?}", pod.name, master_pod.name);
            }
        }
        assert_eq!(topology.groups.len(), shards, "[{line}] no group but the shards': {topology:?}");
        let sizes: Vec<usize> = gids.iter().map(|&g| topology.slots_of(g)).collect();
        assert_eq!(sizes.iter().sum::<usize>(), topology.slots.len(), "[{line}] slots outside the groups: {sizes:?}");
        let (max, min) = (sizes.iter().max().copied().unwrap_or(0), sizes.iter().min().copied().unwrap_or(0));
        assert!(max - min <= 1, "[{line}] unbalanced: {sizes:?}");
        // The cluster's password reached no Event, no action's output and no server's log.
        let password = kb.password().expect("the cluster's password");
        let events = serde_json::to_string(&kb.events()).expect("events as JSON");
        assert!(!events.contains(&password), "[{line}] an Event holds the password");
        for record in kb.actions() {
            let said = format!("{}{}", record.stdout, record.stderr);
            assert!(!said.contains(&password), "[{line}] {} on {} printed the password", record.action, record.pod);
        }
        for shard in &live {
            for pod in &shard.pods {
                let logs = kb.pika(&pod.name).map(|p| p.lock().unwrap().logs()).unwrap_or_default();
                assert!(!logs.contains(&password), "[{line}] the log of {} holds the password", pod.name);
            }
        }
        let log = dashboard.whole_log();
        assert!(log.contains("product_auth"), "[{line}] the dashboard's log is not the one read");
        assert!(!log.contains(&password), "[{line}] the dashboard's log holds the password");
    }

    /// Preloads keys and writes through the real proxy while `f` runs; every acknowledged key must read back.
    fn writing_during(kb: &KubeBlocks, prefix: &str, f: impl FnOnce()) {
        let proxy = kb.proxy_data_addrs().into_iter().next().expect("a codis-proxy");
        let password = kb.password().expect("the cluster's password");
        let keys: Vec<String> = (0..1000).map(|n| format!("{prefix}:pre:{n}")).collect();
        let mut ledger = Ledger::write_keys_authed(&proxy, Some(&password), &keys).expect("preload");
        assert_eq!(ledger.acked.len(), keys.len(), "preload: {:?}", ledger.errors);
        let writer = Workload::start(WorkloadOptions {
            prefix: prefix.to_owned(),
            auth: Some(password.clone()),
            pace: Duration::from_millis(2),
            ..WorkloadOptions::through(std::slice::from_ref(&proxy))
        });
        f();
        let during = writer.stop();
        assert!(!during.acked.is_empty(), "no write acknowledged during the step: {:?}", during.errors);
        ledger.merge(during);
        let check = ledger.verify_through_authed(&proxy, Some(&password));
        assert!(
            check.is_clean(),
            "[{}] acknowledged keys lost: {}\nswitchovers and rejoins run:\n{}",
            kb.line().chart_value(),
            check.summary(),
            transfers_run(kb)
        );
    }

    /// What each switchover and rejoin run said: the first place to look when a key went missing.
    fn transfers_run(kb: &KubeBlocks) -> String {
        kb.actions()
            .iter()
            .filter(|r| r.action == "switchover" || r.action == "rejoin")
            .map(|r| format!("{} on {} (exit {:?}): {}{}", r.action, r.pod, r.code, r.stdout.trim(), r.stderr.trim()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn created(line: Line, name: &str, shards: u32, replicas: u32) -> KubeBlocks {
        let kb = install(line, name);
        step(&kb, "create", kb.create_cluster(shards, replicas));
        assert_converged(&kb, shards as usize, replicas as usize);
        kb
    }

    fn create(line: Line, shards: u32) {
        let kb = created(line, "rkc", shards, 2);
        writing_during(&kb, "create", || std::thread::sleep(Duration::from_secs(1)));
        step(&kb, "delete", kb.delete_cluster());
    }

    fn replicas(line: Line) {
        let kb = created(line, "rkr", 2, 2);
        writing_during(&kb, "replicas", || {
            step(&kb, "replicas 2 to 3", kb.scale_replicas(3));
            assert_converged(&kb, 2, 3);
            step(&kb, "replicas 3 to 2", kb.scale_replicas(2));
            assert_converged(&kb, 2, 2);
        });
        step(&kb, "delete", kb.delete_cluster());
    }

    fn switchover(line: Line) {
        let kb = created(line, "rks", 2, 2);
        let shard = kb.shards()[0].clone();
        let dashboard = kb.dashboard().expect("dashboard");
        let master = dashboard.topology().group_of(&shard.pods[0].server).and_then(|g| g.master().map(str::to_owned));
        let current = shard.pods.iter().find(|p| Some(&p.server) == master.as_ref()).expect("master").name.clone();
        let candidate = shard.pods.iter().find(|p| p.name != current).expect("a replica").name.clone();
        writing_during(&kb, "switchover", || {
            step(&kb, "switchover", kb.switchover(&shard.full, &current, &candidate));
            assert_converged(&kb, 2, 2);
        });
        step(&kb, "delete", kb.delete_cluster());
    }

    fn rolling_restart(line: Line) {
        let kb = created(line, "rkt", 2, 2);
        writing_during(&kb, "restart", || {
            step(&kb, "rolling restart", kb.rolling_restart());
            assert_converged(&kb, 2, 2);
        });
        step(&kb, "delete", kb.delete_cluster());
    }

    fn scale_shards(line: Line, from: u32, to: u32) {
        let kb = created(line, "rkh", from, 2);
        let before: Vec<String> = kb.shards().into_iter().map(|s| s.full).collect();
        writing_during(&kb, "scale", || {
            step(&kb, "scale shards", kb.scale_shards(to));
            assert_converged(&kb, to as usize, 2);
        });
        // Each shard that went was drained by its line's scale-in action, which succeeded.
        let remaining: Vec<String> = kb.shards().into_iter().filter(|s| !s.deleting).map(|s| s.full).collect();
        let gone: Vec<&String> = before.iter().filter(|f| !remaining.contains(f)).collect();
        assert_eq!(gone.len(), before.len().saturating_sub(to as usize), "[{}] shards gone", line.chart_value());
        for full in gone {
            let drained = kb.actions().into_iter().any(|a| {
                a.result.is_ok()
                    && match line {
                        Line::V1_0 => {
                            a.action == "preTerminate"
                                && a.component == *full
                                && a.env.get("KB_CLUSTER_COMPONENT_IS_SCALING_IN").map(String::as_str) == Some("true")
                        }
                        Line::V1_1 => {
                            a.action == "udf-shardingShardRemove"
                                && a.env.get("KB_REMOVE_SHARD_NAME").is_some_and(|n| n == full)
                        }
                    }
            });
            assert!(drained, "[{}] {full} was not drained by its scale-in action", line.chart_value());
        }
        step(&kb, "delete", kb.delete_cluster());
    }

    /// A pod of shard 0 recreated empty by the InstanceSet, writes running throughout: the master deleted with its
    /// PVC (the kubelet runs its preStop hook: it hands over before pika stops), a replica lost with its node (killed,
    /// no hook). A master lost with its node is the failover watcher's (`failover`), where only what a replica got
    /// before the loss can be kept (asynchronous replication).
    fn empty_volume(line: Line, of_master: bool) {
        let kb = created(line, "rkv", 2, 2);
        let shard = kb.shards()[0].clone();
        let dashboard = kb.dashboard().expect("dashboard");
        let master = dashboard.topology().group_of(&shard.pods[0].server).and_then(|g| g.master().map(str::to_owned));
        let pod = shard
            .pods
            .iter()
            .find(|p| (Some(&p.server) == master.as_ref()) == of_master)
            .expect("the pod")
            .name
            .clone();
        writing_during(&kb, "empty", || {
            let replaced = if of_master { kb.delete_pod_with_volume(&pod) } else { kb.lose_pod_volume(&pod) };
            step(&kb, "a pod back on an empty volume", replaced);
            assert_converged(&kb, 2, 2);
        });
        step(&kb, "delete", kb.delete_cluster());
    }

    #[test]
    fn a_replica_back_on_an_empty_volume_on_1_0() {
        empty_volume(Line::V1_0, false);
    }

    #[test]
    fn a_replica_back_on_an_empty_volume_on_1_1() {
        empty_volume(Line::V1_1, false);
    }

    #[test]
    fn a_master_deleted_with_its_volume_on_1_0() {
        empty_volume(Line::V1_0, true);
    }

    #[test]
    fn a_master_deleted_with_its_volume_on_1_1() {
        empty_volume(Line::V1_1, true);
    }

    #[test]
    fn create_three_shards_on_1_0() {
        create(Line::V1_0, 3);
    }

    #[test]
    fn create_three_shards_on_1_1() {
        create(Line::V1_1, 3);
    }

    #[test]
    fn create_one_shard_on_1_0() {
        create(Line::V1_0, 1);
    }

    #[test]
    fn create_one_shard_on_1_1() {
        create(Line::V1_1, 1);
    }

    #[test]
    fn replicas_added_and_removed_on_1_0() {
        replicas(Line::V1_0);
    }

    #[test]
    fn replicas_added_and_removed_on_1_1() {
        replicas(Line::V1_1);
    }

    #[test]
    fn switchover_on_1_0() {
        switchover(Line::V1_0);
    }

    #[test]
    fn switchover_on_1_1() {
        switchover(Line::V1_1);
    }

    #[test]
    fn rolling_restart_on_1_0() {
        rolling_restart(Line::V1_0);
    }

    #[test]
    fn rolling_restart_on_1_1() {
        rolling_restart(Line::V1_1);
    }

    #[test]
    fn scale_out_three_to_four_on_1_0() {
        scale_shards(Line::V1_0, 3, 4);
    }

    #[test]
    fn scale_out_three_to_four_on_1_1() {
        scale_shards(Line::V1_1, 3, 4);
    }

    #[test]
    fn scale_in_four_to_three_on_1_0() {
        scale_shards(Line::V1_0, 4, 3);
    }

    #[test]
    fn scale_in_four_to_two_on_1_0() {
        scale_shards(Line::V1_0, 4, 2);
    }

    #[test]
    fn scale_in_four_to_two_on_1_1() {
        scale_shards(Line::V1_1, 4, 2);
    }

    #[test]
    fn scale_in_four_to_three_on_1_1() {
        scale_shards(Line::V1_1, 4, 3);
    }
}
