//! Faults of the systems around the actions, over real etcd, real redis-servers and the Codis double, with Codis and
//! the pikas watched while each action runs (no slot lost, no group removed while it owns one, no pika master Codis
//! never listed):
//!
//! - the dashboard failing one mutation — HTTP 800, HTTP 500, a dropped connection, an answer that comes after the
//!   client gave up — at every distinct mutation each action sends; then the action is rerun as KubeBlocks does and
//!   must converge, and a further run must change nothing;
//! - the dashboard restarting in the middle of an action;
//! - etcd down: every topology action refuses cleanly (exit 1 naming etcd, nothing changed in Codis or the pikas),
//!   while `role-probe`, `rejoin` and `topology`, which change nothing there, still work;
//! - a pika that stops answering (SIGSTOP: connections hang instead of being refused);
//! - a replica that never syncs;
//! - a slot migration that keeps reporting `[ERROR]`.

use crate::attack;
use crate::rollout;
use crate::summary;
use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Output;
use std::time::{Duration, Instant};

use attack::{etcd_entries, run_until_done, texts, watch, Watched};
use rollout::{bed_with_master, codis_master, leave_env, pika_masters, promotes, switchover_env};
use summary::Category;
use support::{describe, eventually, run, Bed, ClusterFixture};
use testbed::{DoubleOptions, Fault};

type Env = BTreeMap<String, String>;

/// `shards` × `pods`, provisioned over Codis's 1024 slots.
fn provisioned(shards: usize, pods: usize) -> Bed {
    let bed = Bed::builder().shards(shards).pods(pods).bed_default();
    run_until_done("post-provision", &bed.env(0), 10).expect("post-provision");
    bed
}

fn gids(bed: &Bed, shards: &[usize]) -> Vec<u32> {
    shards.iter().map(|&i| bed.gid(i).expect("registered")).collect()
}

fn no_violations(what: &str, watched: &Watched) {
    assert!(watched.violations.is_empty(), "{what}: {:?}", watched.violations);
}

// ---- the scenarios every dashboard fault is tried on ---------------------------------------------------------------

/// One action on a bed prepared for it, and what it must leave behind.
struct Scenario {
    action: &'static str,
    setup: fn() -> (Bed, Env),
    check: fn(&Bed),
}

fn scenarios() -> Vec<Scenario> {
    vec![
        Scenario {
            action: "post-provision",
            setup: || {
                let bed = Bed::builder().shards(2).pods(2).bed_default();
                let env = bed.env(0);
                (bed, env)
            },
            check: |bed| {
                bed.assert_registered(0, 0);
                bed.assert_registered(1, 0);
                bed.assert_balanced(&gids(bed, &[0, 1]));
                assert_eq!(bed.codis.snapshot().groups.len(), 2, "a stray group");
            },
        },
        Scenario {
            action: "shard-add",
            setup: || {
                let mut bed = provisioned(2, 1);
                let added = bed.add_shard(2);
                let mut env = bed.env(0);
                env.insert("KB_ADD_SHARD_NAME".into(), bed.cluster.shards[added].full.clone());
                (bed, env)
            },
            check: |bed| {
                bed.assert_registered(2, 0);
                bed.assert_balanced(&gids(bed, &[0, 1, 2]));
                assert_eq!(bed.codis.snapshot().groups.len(), 3, "a stray group");
            },
        },
        Scenario {
            action: "shard-remove",
            setup: || {
                let bed = provisioned(3, 1);
                let mut env = bed.env(2);
                env.insert("KB_REMOVE_SHARD_NAME".into(), bed.cluster.shards[2].full.clone());
                (bed, env)
            },
            check: |bed| {
                assert_eq!(bed.gid(2), None, "the removed shard is still registered");
                assert_eq!(bed.codis.snapshot().groups.len(), 2, "a stray group");
                bed.assert_balanced(&gids(bed, &[0, 1]));
            },
        },
        Scenario {
            action: "member-join",
            setup: || {
                let mut bed = provisioned(1, 1);
                let ordinal = bed.add_pod(0);
                let pod = bed.cluster.shards[0].pod(ordinal);
                let mut env = bed.env(0);
                env.insert("KB_JOIN_MEMBER_POD_NAME".into(), pod.name.clone());
                env.insert("KB_JOIN_MEMBER_POD_FQDN".into(), pod.fqdn.clone());
                (bed, env)
            },
            check: |bed| bed.assert_registered(0, 0),
        },
        Scenario {
            action: "member-leave",
            setup: || {
                let bed = bed_with_master(2, 0);
                let env = leave_env(&bed, 0);
                (bed, env)
            },
            check: |bed| {
                let snap = bed.codis.snapshot();
                let shard = &bed.cluster.shards[0];
                assert!(snap.server(&shard.pod(0).server()).is_none(), "the leaving master is still listed");
                assert_eq!(codis_master(bed), 1);
                assert!(pika_masters(bed).contains(&1), "the remaining pod is no master");
                assert_eq!(promotes(bed), 1, "{:?}", bed.mutations());
            },
        },
        Scenario {
            action: "switchover",
            setup: || {
                let bed = bed_with_master(2, 0);
                let env = switchover_env(&bed, 0, None);
                (bed, env)
            },
            check: |bed| {
                rollout::assert_one_master(bed, 1);
                assert_eq!(promotes(bed), 1, "{:?}", bed.mutations());
            },
        },
    ]
}

/// The distinct mutation paths a clean run of the scenario sends, in order.
fn mutation_paths(sc: &Scenario) -> Vec<String> {
    let (bed, env) = (sc.setup)();
    bed.codis.clear_requests();
    run_until_done(sc.action, &env, 10).unwrap_or_else(|e| panic!("clean run: {e}"));
    (sc.check)(&bed);
    let mut seen = BTreeSet::new();
    bed.mutations().into_iter().filter(|p| seen.insert(p.clone())).collect()
}

fn fault_name(fault: &Fault) -> &'static str {
    match fault {
        Fault::Status800(_) => "800",
        Fault::Status500 => "500",
        Fault::Drop => "dropped connection",
        Fault::Timeout(_) => "answer after the client gave up",
    }
}

const INJECTED: &str = "injected by the reliability suite";

/// One trial: the scenario's action meets `fault` on its first request to `path`, then is rerun to completion.
fn fault_trial(sc: &Scenario, path: &str, fault: &Fault) {
    let (bed, env) = (sc.setup)();
    bed.codis.clear_requests();
    bed.codis.fail_next_on(path, 1, fault.clone());
    let mut faulty = env.clone();
    let slow = matches!(fault, Fault::Timeout(_));
    if slow {
        // The client gives up after the budget (2 s); the dashboard acts after 3 s, while the rerun runs.
        faulty.insert("ACTION_BUDGET_SECONDS".into(), "2".into());
    }
    // One watch over the faulty run and the rerun: an old master may wait for its demotion across both.
    let ((out, ended, done), watched) = watch(&bed, || {
        let out = run(sc.action, &faulty);
        let ended = Instant::now();
        (out, ended, run_until_done(sc.action, &env, 10))
    });
    let (_, stderr) = texts(&out);
    assert!(matches!(out.status.code(), Some(0 | 1 | 75)), "faulty run: {}", describe(&out));
    assert!(!stderr.contains("panicked"), "faulty run panicked: {stderr}");
    if matches!(fault, Fault::Status800(_)) && out.status.code() == Some(1) {
        assert!(stderr.contains(INJECTED), "the cause is not reported: {stderr}");
    }
    done.unwrap_or_else(|e| panic!("rerun: {e}"));
    no_violations("during the faulty run and the rerun", &watched);
    if slow {
        // Let the late mutation land, then the cluster must still be as the rerun left it.
        std::thread::sleep(Duration::from_millis(3500).saturating_sub(ended.elapsed()));
    }
    bed.codis.clear_faults();
    (sc.check)(&bed);
    bed.codis.clear_requests();
    let out = run(sc.action, &env);
    assert_eq!(out.status.code(), Some(0), "one more run: {}", describe(&out));
    assert!(bed.mutations().is_empty(), "one more run changed codis: {:?}", bed.mutations());
}

fn dashboard_faults(action: &str) {
    let sc = scenarios().into_iter().find(|s| s.action == action).expect("scenario");
    let paths = mutation_paths(&sc);
    assert!(!paths.is_empty(), "{action} sent no mutation");
    let kinds = [Fault::Status800(INJECTED.into()), Fault::Status500, Fault::Drop];
    let mut errors = Category::new(format!("dashboard 800/500/dropped at each mutation: {action}"));
    // Every distinct mutation meets one kind of failure, in turn; each kind is tried at least once.
    let trials: Vec<(usize, &Fault)> =
        (0..paths.len().max(kinds.len())).map(|i| (i % paths.len(), &kinds[i % 3])).collect();
    for (i, fault) in trials {
        errors.trial(format!("{} on {}", fault_name(fault), paths[i]), || fault_trial(&sc, &paths[i], fault));
    }
    let mut late = Category::new(format!("dashboard answers after the client gave up: {action}"));
    let last = paths.last().expect("a path");
    late.trial(format!("late answer on {last}"), || fault_trial(&sc, last, &Fault::Timeout(Duration::from_secs(3))));
    errors.finish();
    late.finish();
}

#[test]
fn post_provision_converges_after_the_dashboard_fails_any_of_its_mutations() {
    dashboard_faults("post-provision");
}

#[test]
fn shard_add_converges_after_the_dashboard_fails_any_of_its_mutations() {
    dashboard_faults("shard-add");
}

#[test]
fn shard_remove_converges_after_the_dashboard_fails_any_of_its_mutations() {
    dashboard_faults("shard-remove");
}

#[test]
fn member_join_converges_after_the_dashboard_fails_any_of_its_mutations() {
    dashboard_faults("member-join");
}

#[test]
fn member_leave_converges_after_the_dashboard_fails_any_of_its_mutations() {
    dashboard_faults("member-leave");
}

#[test]
fn switchover_converges_after_the_dashboard_fails_any_of_its_mutations() {
    dashboard_faults("switchover");
}

// ---- the dashboard restarting mid-action -------------------------------------------------------------------------

/// Runs the scenario's action while the dashboard goes down for a second right after the first mutation matching
/// `when` is answered; then reruns it to completion.
fn restart_trial(sc: &Scenario, when: &str) {
    let (bed, env) = (sc.setup)();
    bed.codis.set_default_migration_ticks(5);
    bed.codis.clear_requests();
    let ((out, done), watched) = watch(&bed, || {
        let out = std::thread::scope(|scope| {
            let action = scope.spawn(|| run(sc.action, &env));
            let hit = eventually(Duration::from_secs(20), || {
                bed.codis.requests().iter().any(|r| r.method == "PUT" && r.path.contains(when) && r.status == 200)
                    || action.is_finished()
            });
            assert!(hit, "{when} never sent");
            bed.codis.pause();
            std::thread::sleep(Duration::from_secs(1));
            bed.codis.resume().expect("resume");
            action.join().expect("action")
        });
        bed.codis.set_default_migration_ticks(1);
        (out, run_until_done(sc.action, &env, 10))
    });
    assert!(matches!(out.status.code(), Some(0 | 1 | 75)), "run across the restart: {}", describe(&out));
    done.unwrap_or_else(|e| panic!("rerun: {e}"));
    no_violations("across the restart and the rerun", &watched);
    (sc.check)(&bed);
}

#[test]
fn a_dashboard_restart_in_the_middle_of_an_action_is_survived_by_a_rerun() {
    let mut restarts = Category::new("dashboard restart mid-action");
    let all = scenarios();
    for (action, when) in [
        ("post-provision", "/group/add/"),
        ("shard-add", "/slots/action/create"),
        ("shard-remove", "/slots/action/create"),
        ("member-leave", "/group/promote/"),
        ("switchover", "/group/promote/"),
    ] {
        let sc = all.iter().find(|s| s.action == action).expect("scenario");
        restarts.trial(format!("{action}, restart after {when}"), || restart_trial(sc, when));
    }
    restarts.finish();
}

// ---- etcd down ----------------------------------------------------------------------------------------------------

/// The pikas' roles and what they follow, to show nothing changed.
/// A pod's name and whom it replicates (host, port, link up), if anyone.
type Following = (String, Option<(String, u16, bool)>);

fn replication(bed: &Bed) -> Vec<Following> {
    bed.cluster
        .shards
        .iter()
        .flat_map(|s| &s.pods)
        .map(|p| (p.redis.role(), p.redis.master().map(|(h, p, _)| (h, p, true))))
        .collect()
}

#[test]
fn with_etcd_down_topology_actions_refuse_cleanly_and_role_probe_rejoin_and_topology_still_work() {
    let mut bed = provisioned(3, 2);
    let added = bed.add_shard(1);
    let joining = bed.add_pod(0);
    let all: Vec<usize> = (0..bed.cluster.shards.len()).collect();
    let with = |index: usize, pairs: &[(&str, String)]| {
        let mut env = bed.env(index);
        env.insert("ALL_SHARDS_POD_FQDNS".into(), bed.cluster.all_shards_of(&all));
        env.insert("ACTION_BUDGET_SECONDS".into(), "4".into());
        for (k, v) in pairs {
            env.insert((*k).to_owned(), v.clone());
        }
        env
    };
    let shard0 = &bed.cluster.shards[0];
    let mut pre_terminate = bed.env_v1_0(2, &[2]);
    pre_terminate.insert("KB_CLUSTER_COMPONENT_IS_SCALING_IN".into(), "true".into());
    pre_terminate.insert("ACTION_BUDGET_SECONDS".into(), "4".into());
    let topology_actions: Vec<(&str, Env)> = vec![
        ("post-provision", with(0, &[])),
        ("shard-add", with(0, &[("KB_ADD_SHARD_NAME", bed.cluster.shards[added].full.clone())])),
        ("shard-remove", with(1, &[("KB_REMOVE_SHARD_NAME", bed.cluster.shards[1].full.clone())])),
        ("pre-terminate", pre_terminate),
        (
            "member-join",
            with(
                0,
                &[
                    ("KB_JOIN_MEMBER_POD_NAME", shard0.pod(joining).name.clone()),
                    ("KB_JOIN_MEMBER_POD_FQDN", shard0.pod(joining).fqdn.clone()),
                ],
            ),
        ),
        (
            "member-leave",
            with(
                0,
                &[
                    ("KB_LEAVE_MEMBER_POD_NAME", shard0.pod(1).name.clone()),
                    ("KB_LEAVE_MEMBER_POD_FQDN", shard0.pod(1).fqdn.clone()),
                ],
            ),
        ),
        (
            "switchover",
            with(
                0,
                &[
                    ("KB_SWITCHOVER_CURRENT_NAME", shard0.pod(0).name.clone()),
                    ("KB_SWITCHOVER_CURRENT_FQDN", shard0.pod(0).fqdn.clone()),
                    ("KB_SWITCHOVER_ROLE", "master".to_owned()),
                ],
            ),
        ),
    ];
    let probes: Vec<(u32, Env)> = [0, 1]
        .into_iter()
        .map(|ordinal| {
            let env = Env::from([
                ("PIKA_HOST".to_owned(), "127.0.0.1".to_owned()),
                ("PIKA_PORT".to_owned(), shard0.pod(ordinal).redis.port().to_string()),
            ]);
            (ordinal, env)
        })
        .collect();
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("pika.conf");
    std::fs::write(&config, "port 7001\n").expect("config");
    let rejoin =
        with(0, &[("POD_NAME", shard0.pod(1).name.clone()), ("PIKA_CONFIG_FILE", config.display().to_string())]);
    let topology = with(0, &[]);
    let master_port = shard0.pod(0).redis.port();
    let groups = format!("{:?}", bed.codis.snapshot().groups);
    let roles = replication(&bed);
    let etcd_before = etcd_entries(&bed);

    bed.cluster.etcd.stop();
    bed.codis.clear_requests();
    let mut refused = Category::new("etcd down: topology actions refuse cleanly");
    // All at once: none may change anything, so they cannot disturb each other.
    let outs: Vec<(&str, Output)> = std::thread::scope(|scope| {
        let handles: Vec<_> = topology_actions
            .iter()
            .map(|(action, env)| scope.spawn(move || (*action, support::run_time_boxed(action, env, 50))))
            .collect();
        handles.into_iter().map(|h| h.join().expect("action")).collect()
    });
    for (action, out) in &outs {
        let (stdout, stderr) = texts(out);
        let ok = out.status.code() == Some(1)
            && stderr.contains("etcd")
            && stdout.is_empty()
            && !stderr.contains("panicked");
        refused.judge(*action, ok, || describe(out));
    }
    let puts = bed.mutations();
    refused.judge("no mutation reached codis", puts.is_empty(), || format!("{puts:?}"));
    let same = format!("{:?}", bed.codis.snapshot().groups) == groups && replication(&bed) == roles;
    refused.judge("codis groups and pika roles unchanged", same, || "changed".to_owned());

    let mut unaffected = Category::new("etcd down: role-probe, rejoin and topology unaffected");
    for (ordinal, env) in &probes {
        let out = run("role-probe", env);
        let expected = if *ordinal == 0 { "master" } else { "slave" };
        let (stdout, _) = texts(&out);
        let ok = out.status.code() == Some(0) && stdout.trim() == expected;
        unaffected.judge(format!("role-probe of pod {ordinal}"), ok, || describe(&out));
    }
    let out = run("rejoin", &rejoin);
    let written = std::fs::read_to_string(&config).unwrap_or_default();
    let ok = out.status.code() == Some(0) && written.contains(&format!("replicaof 127.0.0.1 {master_port}"));
    unaffected
        .judge("rejoin of a replica points it at its master", ok, || format!("config {written:?}: {}", describe(&out)));
    let out = run("topology", &topology);
    let (stdout, _) = texts(&out);
    unaffected.judge("topology", out.status.code() == Some(0) && stdout.contains("ok"), || describe(&out));

    // Back up: the same actions go through, and nothing was left half done.
    bed.cluster.etcd.resume();
    let mut recovered = Category::new("etcd back: the refused actions complete");
    for (action, env) in topology_actions.iter().filter(|(a, _)| matches!(*a, "shard-add" | "member-join")) {
        let mut env = env.clone();
        env.insert("ACTION_BUDGET_SECONDS".into(), "40".into());
        let result = run_until_done(action, &env, 10);
        recovered.judge(*action, result.is_ok(), || result.unwrap_err());
    }
    let etcd_after = etcd_entries(&bed);
    let kept = etcd_before.iter().all(|(k, v)| etcd_after.get(k) == Some(v))
        && !etcd_after.keys().any(|k| k.contains("/locks/"));
    recovered.judge("etcd kept its records and no lock is left", kept, || {
        format!("before {etcd_before:?} after {etcd_after:?}")
    });
    refused.finish();
    unaffected.finish();
    recovered.finish();
}

// ---- a pika that stops answering ---------------------------------------------------------------------------------

/// Freezes a redis-server (SIGSTOP: connections are accepted by the kernel and never answered) until dropped.
struct Frozen(String);

impl Frozen {
    fn new(redis: &testbed::RedisServer) -> Self {
        let info = redis.command(&["INFO", "server"]);
        let pid = testbed::process::info_field(&info, "process_id").expect("process_id");
        assert!(std::process::Command::new("kill").args(["-STOP", &pid]).status().expect("kill").success());
        Self(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill").args(["-CONT", &self.0]).status();
    }
}

#[test]
fn a_pika_that_stops_answering_ends_the_run_within_its_budget_and_a_rerun_finishes() {
    let mut frozen = Category::new("pika stops answering");

    frozen.trial("member-join of a pod that hangs", || {
        let sc = scenarios().into_iter().find(|s| s.action == "member-join").expect("scenario");
        let (bed, mut env) = (sc.setup)();
        env.insert("ACTION_BUDGET_SECONDS".into(), "6".into());
        let joining = bed.cluster.shards[0].pod(1);
        let ice = Frozen::new(&joining.redis);
        // The pod stays frozen for the whole run: only the action's own time box can end it.
        let (out, watched) = watch(&bed, || support::run_time_boxed("member-join", &env, 6));
        assert!(matches!(out.status.code(), Some(1 | 75)), "{}", describe(&out));
        let (_, stderr) = texts(&out);
        assert!(stderr.contains(&joining.fqdn) || stderr.contains(&joining.redis.addr()), "names no server: {stderr}");
        no_violations("while it hangs", &watched);
        assert_eq!(
            bed.codis.snapshot().master(bed.gid(0).expect("group")),
            Some(bed.cluster.shards[0].pod(0).server().as_str())
        );
        drop(ice);
        env.insert("ACTION_BUDGET_SECONDS".into(), "40".into());
        run_until_done("member-join", &env, 10).unwrap_or_else(|e| panic!("rerun: {e}"));
        (sc.check)(&bed);
    });

    frozen.trial("switchover of a master whose preferred replica hangs", || {
        // The ordinal rule would pick pod 2; it hangs, so pod 1 takes over. The old master cannot follow pod 1 while
        // the hung pod stays connected to it as a replica (pika and redis refuse SLAVEOF then), so the run ends 1
        // (switchover gets one call, never 75) with Codis routing to pod 1, unless that link dropped in time; once
        // pod 2 answers again, the next switchover finishes the repair.
        let bed = bed_with_master(3, 0);
        let mut env = switchover_env(&bed, 0, None);
        env.insert("ACTION_BUDGET_SECONDS".into(), "12".into());
        let ice = Frozen::new(&bed.cluster.shards[0].pod(2).redis);
        let ((out, done), watched) = watch(&bed, || {
            let out = run("switchover", &env);
            assert!(matches!(out.status.code(), Some(0 | 1)), "{}", describe(&out));
            assert_eq!(codis_master(&bed), 1, "{}", describe(&out));
            drop(ice);
            env.insert("ACTION_BUDGET_SECONDS".into(), "40".into());
            // KubeBlocks calls switchover again (and for the hung pod before restarting it): it finishes the repair.
            (
                out,
                run_until_done("switchover", &env, 10)
                    .and_then(|_| run_until_done("switchover", &switchover_env(&bed, 2, None), 10)),
            )
        });
        done.unwrap_or_else(|e| panic!("rerun: {e}"));
        no_violations("while pod 2 hangs and after", &watched);
        println!("switchover with a hung replica: first run {}", describe(&out).lines().last().unwrap_or_default());
        rollout::assert_one_master(&bed, 1);
        assert_eq!(promotes(&bed), 1);
    });

    frozen.trial("post-provision with a hung replica", || {
        let bed = Bed::builder().shards(2).pods(2).bed_default();
        let mut env = bed.env(0);
        env.insert("ACTION_BUDGET_SECONDS".into(), "6".into());
        let ice = Frozen::new(&bed.cluster.shards[1].pod(1).redis);
        let (out, watched) = watch(&bed, || support::run_time_boxed("post-provision", &env, 6));
        assert!(matches!(out.status.code(), Some(1 | 75)), "{}", describe(&out));
        no_violations("while it hangs", &watched);
        drop(ice);
        env.insert("ACTION_BUDGET_SECONDS".into(), "40".into());
        run_until_done("post-provision", &env, 10).unwrap_or_else(|e| panic!("rerun: {e}"));
        bed.assert_registered(0, 0);
        bed.assert_registered(1, 0);
        bed.assert_balanced(&gids(&bed, &[0, 1]));
    });
    frozen.finish();
}

// ---- a replica that never syncs ------------------------------------------------------------------------------------

#[test]
fn a_replica_that_never_syncs_is_reported_and_never_promoted() {
    let mut never = Category::new("replica never syncs");

    never.trial("member-join of a pod that cannot sync: exit 75 naming it, then done once it can", || {
        let mut cluster = ClusterFixture::builder().shards(1).pods(1).password("never-syncs-pw").build();
        cluster.add_pod(0);
        let bed = Bed::with(cluster, DoubleOptions::default());
        let mut env = bed.env(0);
        // Provision the master alone first.
        env.insert("SHARD_POD_FQDNS".into(), bed.cluster.shards[0].pod(0).fqdn.clone());
        env.insert(
            "ALL_SHARDS_POD_FQDNS".into(),
            format!("{}:{}", bed.cluster.shards[0].short, bed.cluster.shards[0].pod(0).fqdn),
        );
        run_until_done("post-provision", &env, 10).expect("post-provision");
        let joining = bed.cluster.shards[0].pod(1);
        let _ = joining.redis.command(&["CONFIG", "SET", "masterauth", "not-the-password"]);
        let mut join = bed.env(0);
        join.insert("KB_JOIN_MEMBER_POD_NAME".into(), joining.name.clone());
        join.insert("KB_JOIN_MEMBER_POD_FQDN".into(), joining.fqdn.clone());
        join.insert("ACTION_BUDGET_SECONDS".into(), "3".into());
        let (out, watched) = watch(&bed, || run("member-join", &join));
        assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
        let (_, stderr) = texts(&out);
        assert!(stderr.contains(&joining.fqdn) && stderr.contains("sync"), "{stderr}");
        assert!(!stderr.contains("never-syncs-pw"), "password leaked");
        no_violations("member-join", &watched);
        let gid = bed.gid(0).expect("group");
        assert_eq!(bed.codis.snapshot().master(gid), Some(bed.cluster.shards[0].pod(0).server().as_str()));
        // The switchover of the master must not pick it: it has no data.
        let out = run("switchover", &switchover_env(&bed, 0, None));
        assert_eq!(out.status.code(), Some(1), "a replica that never synced was made master? {}", describe(&out));
        let mut candidate = switchover_env(&bed, 0, Some(1));
        candidate.insert("ACTION_BUDGET_SECONDS".into(), "10".into());
        let out = run("switchover", &candidate);
        assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
        assert!(texts(&out).1.contains("KB_SWITCHOVER_CANDIDATE_FQDN"), "{}", describe(&out));
        assert_eq!(promotes(&bed), 0, "{:?}", bed.mutations());
        assert_eq!(codis_master(&bed), 0);
        // Fixed: the next run finishes.
        let _ = joining.redis.command(&["CONFIG", "SET", "masterauth", "never-syncs-pw"]);
        join.insert("ACTION_BUDGET_SECONDS".into(), "40".into());
        run_until_done("member-join", &join, 10).unwrap_or_else(|e| panic!("rerun: {e}"));
        bed.assert_registered(0, 0);
    });
    never.finish();
}

// ---- a slot migration that reports [ERROR] ---------------------------------------------------------------------------

#[test]
fn a_migration_that_keeps_failing_stops_the_rebalance_with_codis_error_and_loses_no_slot() {
    let mut failing = Category::new("slot migration reports [ERROR]");
    failing.trial("shard-add whose migrations fail until fixed", || {
        // 4→5: the new shard's share of each donor (a fifth) is too small to split off, so every slot migrates.
        let mut bed = provisioned(4, 1);
        let added = bed.add_shard(1);
        let mut env = bed.env(0);
        env.insert("KB_ADD_SHARD_NAME".into(), bed.cluster.shards[added].full.clone());
        env.insert("ACTION_BUDGET_SECONDS".into(), "4".into());
        // Every slot fails, whichever the plan moves first.
        for slot in 0..bed.codis.options().max_slot_num {
            bed.codis.set_slot_error(slot, "ERR target refused the keys (injected)");
        }
        let before = bed.owners();
        let (out, watched) = watch(&bed, || run("shard-add", &env));
        assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
        let (_, stderr) = texts(&out);
        assert!(stderr.contains("[ERROR]") && stderr.contains("target refused the keys"), "{stderr}");
        no_violations("while failing", &watched);
        // Nothing moved; the failing slot stays with its owner.
        assert_eq!(bed.owners(), before);
        for slot in 0..bed.codis.options().max_slot_num {
            bed.codis.clear_slot_error(slot);
        }
        env.insert("ACTION_BUDGET_SECONDS".into(), "40".into());
        let (done, watched) = watch(&bed, || run_until_done("shard-add", &env, 10));
        done.unwrap_or_else(|e| panic!("rerun: {e}"));
        no_violations("rerun", &watched);
        bed.assert_balanced(&gids(&bed, &[0, 1, 2, 3, 4]));
    });
    failing.trial("shard-remove whose drain fails until fixed: the group stays until its slots are gone", || {
        let bed = provisioned(3, 1);
        let leaving = bed.gid(2).expect("group");
        let mut env = bed.env(2);
        env.insert("KB_REMOVE_SHARD_NAME".into(), bed.cluster.shards[2].full.clone());
        env.insert("ACTION_BUDGET_SECONDS".into(), "4".into());
        let snap = bed.codis.snapshot();
        let theirs: Vec<usize> = snap.slots.iter().filter(|s| s.group_id == leaving).map(|s| s.id).collect();
        bed.codis.set_slot_error(theirs[0], "ERR slotsmgrt failed (injected)");
        let (out, watched) = watch(&bed, || run("shard-remove", &env));
        assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
        no_violations("while failing", &watched);
        assert!(
            bed.codis.snapshot().group(leaving).is_some_and(|g| !g.servers.is_empty()),
            "servers deleted too early"
        );
        bed.codis.clear_slot_error(theirs[0]);
        env.insert("ACTION_BUDGET_SECONDS".into(), "40".into());
        let (done, watched) = watch(&bed, || run_until_done("shard-remove", &env, 10));
        done.unwrap_or_else(|e| panic!("rerun: {e}"));
        no_violations("rerun", &watched);
        assert!(bed.codis.snapshot().group(leaving).is_none());
        bed.assert_balanced(&gids(&bed, &[0, 1]));
    });
    failing.finish();
}
