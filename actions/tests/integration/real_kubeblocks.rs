//! What a real KubeBlocks hands the binary and the chart-tests cannot: a one-shard cluster's bare
//! `ALL_SHARDS_POD_FQDNS`; on 1.0.x, a var that lists the shard components that exist (a deleting one included, a
//! not-yet-created one missing) next to the legacy `KB_CLUSTER_COMPONENT_*` lists of the same Components; the 1.1
//! component actions (`post-provision --own-shard`, the `pre-terminate` safety net that asks the Kubernetes API
//! whether the Cluster is going); and an addon installed for the other line. Over real redis-servers, real etcd, the
//! Codis double and a stand-in for the one API call made; every check reads the double, etcd or the servers.

use crate::cluster_api;
use crate::support;

use std::collections::BTreeMap;

use cluster_api::{ClusterAnswer, ClusterApi};
use support::{describe, minimum_moves, moved, run, run_args, run_to_completion, Bed, NAMESPACE};
use testbed::ProxyDouble;

type Env = BTreeMap<String, String>;

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The bare value KubeBlocks gives `ALL_SHARDS_POD_FQDNS` when exactly one shard exists.
fn bare(bed: &Bed, index: usize) -> String {
    bed.cluster.shards[index].fqdns()
}

fn creates(bed: &Bed) -> usize {
    bed.mutations().iter().filter(|p| p.contains("/slots/action/create")).count()
}

/// The legacy lists of a 1.0.x Cluster whose shard Components are exactly `existing` (short names; `deleting` among
/// them have a deletionTimestamp), as `hackParameters4Comp` builds them: every Component of the Cluster by short name.
fn legacy(bed: &Bed, existing: &[usize], deleting: &[usize]) -> Env {
    let short = |i: &usize| bed.cluster.shards[*i].short.clone();
    let mut all = vec!["etcd".to_owned(), "codis-dashboard".to_owned()];
    all.extend(existing.iter().map(short));
    all.extend(["codis-proxy".to_owned(), "codis-fe".to_owned()]);
    let deleting: Vec<String> = deleting.iter().map(short).collect();
    let undeleted: Vec<String> = all.iter().filter(|c| !deleting.contains(c)).cloned().collect();
    Env::from([
        ("KB_CLUSTER_COMPONENT_LIST".to_owned(), all.join(",")),
        ("KB_CLUSTER_COMPONENT_DELETING_LIST".to_owned(), deleting.join(",")),
        ("KB_CLUSTER_COMPONENT_UNDELETED_LIST".to_owned(), undeleted.join(",")),
    ])
}

/// A 1.0.x component action's environment for shard `index` when the shard Components `existing` exist: the var
/// lists them all (no requireAllComponentObjects), the legacy lists name them.
fn env_1_0(bed: &Bed, index: usize, existing: &[usize], deleting: &[usize]) -> Env {
    let mut env = bed.cluster.env(&bed.codis.addr(), index);
    env.insert("KUBEBLOCKS_LINE".into(), "1.0".into());
    let all = if existing.len() == 1 { bare(bed, existing[0]) } else { bed.cluster.all_shards_of(existing) };
    env.insert("ALL_SHARDS_POD_FQDNS".into(), all);
    env.extend(legacy(bed, existing, deleting));
    env
}

// ---- one shard -----------------------------------------------------------------------------------------------------

#[test]
fn a_one_shard_cluster_comes_up_on_both_lines_with_the_bare_all_shards_value() {
    for line in ["1.0", "1.1"] {
        let bed = Bed::builder().shards(1).pods(2).bed_default();
        let env = if line == "1.0" {
            env_1_0(&bed, 0, &[0], &[])
        } else {
            let mut env = bed.env(0);
            env.insert("ALL_SHARDS_POD_FQDNS".into(), bare(&bed, 0));
            env
        };
        assert!(!env["ALL_SHARDS_POD_FQDNS"].contains(':'), "the value has no key");
        let out = run("post-provision", &env);
        assert_eq!(out.status.code(), Some(0), "{line}: {}", describe(&out));
        bed.assert_registered(0, 0);
        let gid = bed.gid(0).unwrap();
        assert_eq!(bed.assert_balanced(&[gid]), BTreeMap::from([(gid, 1024)]), "{line}: every slot in the one group");
        // Every other reader of the var takes it too.
        let out = run("topology", &env);
        assert_eq!(out.status.code(), Some(0), "{line} topology: {}", describe(&out));
        let mut deletion = env.clone();
        if line == "1.0" {
            deletion.insert("KB_CLUSTER_COMPONENT_IS_SCALING_IN".into(), "false".into());
        } else {
            let api = ClusterApi::start(NAMESPACE, &bed.cluster.name, ClusterAnswer::Deleting);
            deletion.insert("KUBE_API_URL".into(), api.url());
        }
        let out = run("pre-terminate", &deletion);
        assert_eq!(out.status.code(), Some(0), "{line} pre-terminate: {}", describe(&out));
        assert!(bed.codis.snapshot().group(gid).is_some(), "a cluster deletion leaves codis as it is");
    }
}

#[test]
fn on_1_1_a_one_shard_cluster_grows_and_shrinks_through_the_bare_value() {
    let mut bed = Bed::builder().shards(1).pods(1).bed_default();
    let mut env = bed.env(0);
    env.insert("ALL_SHARDS_POD_FQDNS".into(), bare(&bed, 0));
    run_to_completion("post-provision", &env);
    let new = bed.add_shard(1);
    let mut add = bed.env(new);
    add.insert("KB_ADD_SHARD_NAME".into(), bed.cluster.shards[new].full.clone());
    run_to_completion("shard-add", &add);
    let (g0, g1) = (bed.gid(0).unwrap(), bed.gid(new).unwrap());
    bed.assert_balanced(&[g0, g1]);
    // Removing the first shard: KubeBlocks lists both shards while the removed one exists.
    let mut remove = bed.env(0);
    remove.insert("KB_REMOVE_SHARD_NAME".into(), bed.cluster.shards[0].full.clone());
    run_to_completion("shard-remove", &remove);
    bed.assert_balanced(&[g1]);
    // Now one shard is left: its var is bare again, and removing it is refused as the last shard.
    let mut last = bed.env(new);
    last.insert("ALL_SHARDS_POD_FQDNS".into(), bare(&bed, new));
    last.insert("KB_REMOVE_SHARD_NAME".into(), bed.cluster.shards[new].full.clone());
    let out = run("shard-remove", &last);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(stderr(&out).contains("last shard"), "{}", describe(&out));
}

// ---- 1.0.x: the components that exist ---------------------------------------------------------------------------------

#[test]
fn on_1_0_the_slots_wait_for_every_shard_the_cluster_wants_even_one_whose_component_does_not_exist_yet() {
    let bed = Bed::builder().shards(3).pods(1).bed_default();
    let api = ClusterApi::start(NAMESPACE, &bed.cluster.name, ClusterAnswer::Stays(vec![("pk".into(), 3)]));
    // Shards 0 and 1 exist; the third Component is not created yet, so neither the var nor the lists name it.
    for index in [0, 1] {
        let mut env = env_1_0(&bed, index, &[0, 1], &[]);
        env.insert("KUBE_API_URL".into(), api.url());
        let out = run("post-provision", &env);
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        assert!(stdout(&out).contains("all 3 shards of the Cluster exist (2 do)"), "{}", describe(&out));
    }
    assert!(api.requests().iter().any(|r| r.contains("/clusters/")), "the Cluster was read: {:?}", api.requests());
    let snap = bed.codis.snapshot();
    assert!(bed.gid(0).is_some() && bed.gid(1).is_some(), "each registered itself");
    assert!(snap.slots.iter().all(|s| s.group_id == 0), "no slot assigned before the third shard exists");

    // The third exists now; its postProvision finds everyone registered and assigns every slot, moving none.
    let mut env = env_1_0(&bed, 2, &[0, 1, 2], &[]);
    env.insert("KUBE_API_URL".into(), api.url());
    bed.codis.clear_requests();
    run_to_completion("post-provision", &env);
    assert_eq!(creates(&bed), 0, "slots were assigned, not migrated: {:?}", bed.mutations());
    bed.assert_balanced(&[bed.gid(0).unwrap(), bed.gid(1).unwrap(), bed.gid(2).unwrap()]);
}

#[test]
fn on_1_0_a_shard_the_legacy_list_names_but_the_var_does_not_is_waited_for_without_an_api() {
    let bed = Bed::builder().shards(2).pods(1).bed_default();
    // KubeBlocks resolved the var a moment before the third Component existed; the lists already name it.
    let mut env = env_1_0(&bed, 0, &[0], &[]);
    env.extend(legacy(&bed, &[0, 1], &[]));
    let out = run("post-provision", &env);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(stdout(&out).contains(&format!("{} register", bed.cluster.shards[1].full)), "{}", describe(&out));
    assert!(bed.codis.snapshot().slots.iter().all(|s| s.group_id == 0));
    run_to_completion("post-provision", &env_1_0(&bed, 1, &[0, 1], &[]));
    bed.assert_balanced(&[bed.gid(0).unwrap(), bed.gid(1).unwrap()]);
}

/// What a finished 1.0 provisioning over every shard looks like.
fn provisioned_1_0(shards: usize) -> Bed {
    let bed = Bed::builder().shards(shards).pods(1).bed_default();
    let all: Vec<usize> = (0..shards).collect();
    for index in 0..shards {
        run_to_completion("post-provision", &env_1_0(&bed, index, &all, &[]));
    }
    bed
}

#[test]
fn on_1_0_a_scale_in_by_two_drains_both_onto_the_shards_that_stay_though_the_var_still_lists_them() {
    let bed = provisioned_1_0(4);
    let gids: Vec<u32> = (0..4).map(|i| bed.gid(i).unwrap()).collect();
    let before = bed.owners();
    bed.codis.clear_requests();
    for index in [2, 3] {
        let mut env = env_1_0(&bed, index, &[0, 1, 2, 3], &[2, 3]);
        env.insert("KB_CLUSTER_COMPONENT_IS_SCALING_IN".into(), "true".into());
        run_to_completion("pre-terminate", &env);
    }
    // No migration ever targeted a leaving group.
    for path in bed.mutations().iter().filter(|p| p.contains("/slots/action/create")) {
        let to: u32 = path.rsplit('/').next().unwrap().parse().unwrap();
        assert!(to == gids[0] || to == gids[1], "a migration onto a leaving group: {path}");
    }
    bed.assert_balanced(&gids[..2]);
    assert_eq!(moved(&before, &bed.owners()), minimum_moves(&before, &gids[..2]));
    assert!(bed.codis.snapshot().group(gids[2]).is_none() && bed.codis.snapshot().group(gids[3]).is_none());
}

#[test]
fn on_1_0_a_shard_added_during_a_scale_in_waits_for_the_drain_then_takes_its_share() {
    let mut bed = provisioned_1_0(3);
    let leaving = bed.gid(2).unwrap();
    let new = bed.add_shard(1);
    // Shard 2 is deleting and still holds its slots; shard 3 was just created.
    let out = run("post-provision", &env_1_0(&bed, new, &[0, 1, 2, new], &[2]));
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    assert!(stderr(&out).contains("drain has not finished"), "{}", describe(&out));
    assert!(bed.gid(new).is_some(), "it registered itself");
    assert_eq!(bed.codis.snapshot().slots_of(bed.gid(new).unwrap()), 0, "no slot moved yet");
    assert!(bed.codis.snapshot().slots_of(leaving) > 0);

    let mut env = env_1_0(&bed, 2, &[0, 1, 2, new], &[2]);
    env.insert("KB_CLUSTER_COMPONENT_IS_SCALING_IN".into(), "true".into());
    run_to_completion("pre-terminate", &env);
    run_to_completion("post-provision", &env_1_0(&bed, new, &[0, 1, new], &[]));
    bed.assert_balanced(&[bed.gid(0).unwrap(), bed.gid(1).unwrap(), bed.gid(new).unwrap()]);
}

// ---- the line ----------------------------------------------------------------------------------------------------

#[test]
fn an_addon_installed_for_the_other_line_is_exit_2_naming_kubeblocks_line_and_contacts_nothing() {
    let bed = Bed::builder().shards(2).pods(1).bed_default();
    let etcd_before = crate::attack::etcd_entries(&bed);
    let mut on_1_0 = env_1_0(&bed, 0, &[0, 1], &[]);
    on_1_0.insert("KUBEBLOCKS_LINE".into(), "1.1".into());
    let mut on_1_1 = bed.env(0);
    on_1_1.insert("KUBEBLOCKS_LINE".into(), "1.0".into());
    let mut scaling_in = env_1_0(&bed, 1, &[0, 1], &[1]);
    scaling_in.insert("KB_CLUSTER_COMPONENT_IS_SCALING_IN".into(), "true".into());
    scaling_in.insert("KUBEBLOCKS_LINE".into(), "1.1".into());
    let cases: [(&[&str], &Env, &str); 4] = [
        (&["post-provision"], &on_1_0, "kubeblocksLine=1.0"),
        (&["post-provision", "--own-shard"], &on_1_0, "kubeblocksLine=1.0"),
        (&["post-provision"], &on_1_1, "kubeblocksLine=1.1"),
        (&["pre-terminate"], &scaling_in, "kubeblocksLine=1.0"),
    ];
    for (args, env, fix) in cases {
        bed.codis.clear_requests();
        let out = run_args(args, env);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", describe(&out));
        let text = stderr(&out);
        assert!(text.contains("KUBEBLOCKS_LINE") && text.contains(fix), "{args:?}: {text}");
        assert!(bed.codis.requests().is_empty(), "{args:?} contacted the dashboard: {:?}", bed.codis.requests());
    }
    assert!(bed.codis.snapshot().groups.is_empty());
    assert_eq!(crate::attack::etcd_entries(&bed), etcd_before, "etcd untouched");
}

// ---- --own-shard ---------------------------------------------------------------------------------------------------

#[test]
fn own_shard_registers_only_this_shard_and_moves_no_slot_on_both_lines() {
    for line in ["1.0", "1.1"] {
        let bed = Bed::builder().shards(2).pods(2).bed_default();
        let env_of = |index: usize| {
            let mut env = if line == "1.0" { env_1_0(&bed, index, &[0, 1], &[]) } else { bed.env(index) };
            // Not read with --own-shard: even a value that would be refused does not matter.
            env.remove("ALL_SHARDS_POD_FQDNS");
            env
        };
        let out = run_args(&["post-provision", "--own-shard"], &env_of(1));
        assert_eq!(out.status.code(), Some(0), "{line}: {}", describe(&out));
        assert!(stdout(&out).contains("no slot moved"), "{}", describe(&out));
        bed.assert_registered(1, 0);
        assert!(bed.gid(0).is_none(), "{line}: only this shard");
        assert!(bed.codis.snapshot().slots.iter().all(|s| s.group_id == 0), "{line}: no slot assigned");

        // With the slots placed (the sharding's postProvision), a rerun still moves none of them.
        let mut all = bed.env(0);
        if line == "1.0" {
            all = env_1_0(&bed, 0, &[0, 1], &[]);
        }
        run_to_completion("post-provision", &all);
        let before = bed.owners();
        bed.codis.clear_requests();
        let out = run_args(&["post-provision", "--own-shard"], &env_of(0));
        assert_eq!(out.status.code(), Some(0), "{line}: {}", describe(&out));
        assert_eq!(bed.owners(), before, "{line}");
        assert!(bed.mutations().iter().all(|p| !p.contains("/slots/")), "{line}: {:?}", bed.mutations());
    }
}

// ---- pre-terminate on 1.1 ------------------------------------------------------------------------------------------

/// Three shards of one pod, slots balanced; shard 2 is the one whose component is deleted.
fn three() -> Bed {
    let bed = Bed::builder().shards(3).pods(1).bed_default();
    run_to_completion("post-provision", &bed.env(0));
    bed
}

fn pre_terminate_env(bed: &Bed, api: Option<&ClusterApi>) -> Env {
    let mut env = bed.env(2);
    if let Some(api) = api {
        env.insert("KUBE_API_URL".into(), api.url());
    }
    env
}

fn stays(bed: &Bed) -> ClusterApi {
    ClusterApi::start(NAMESPACE, &bed.cluster.name, ClusterAnswer::Stays(vec![("pk".into(), 2)]))
}

fn assert_drained(bed: &Bed, leaving: u32, before: &[u32]) {
    let snap = bed.codis.snapshot();
    assert!(snap.group(leaving).is_none(), "group {leaving} is still there");
    let remaining = [bed.gid(0).unwrap(), bed.gid(1).unwrap()];
    bed.assert_balanced(&remaining);
    assert_eq!(moved(before, &bed.owners()), minimum_moves(before, &remaining));
}

#[test]
fn on_1_1_pre_terminate_of_a_deleted_cluster_is_done_at_once_without_touching_codis() {
    for answer in [ClusterAnswer::Deleting, ClusterAnswer::Gone] {
        let bed = three();
        let snapshot = bed.codis.snapshot();
        let api = ClusterApi::start(NAMESPACE, &bed.cluster.name, answer.clone());
        // The dashboard is gone too: nothing is asked of it.
        bed.codis.pause();
        bed.codis.clear_requests();
        let out = run("pre-terminate", &pre_terminate_env(&bed, Some(&api)));
        assert_eq!(out.status.code(), Some(0), "{answer:?}: {}", describe(&out));
        assert!(stdout(&out).contains("codis is left as it is"), "{}", describe(&out));
        bed.codis.resume().unwrap();
        assert!(bed.codis.requests().is_empty(), "{answer:?}: {:?}", bed.codis.requests());
        assert_eq!(bed.codis.snapshot().groups, snapshot.groups);
        assert_eq!(api.requests().len(), 1, "{:?}", api.requests());
    }
}

#[test]
fn on_1_1_pre_terminate_while_the_cluster_stays_drains_exactly_as_shard_remove_does() {
    let bed = three();
    let leaving = bed.gid(2).unwrap();
    let before = bed.owners();
    let holding = before.iter().filter(|g| **g == leaving).count();
    let api = stays(&bed);
    // Slow migrations and a short budget: the drain reports its progress with exit 75 and resumes.
    bed.codis.set_default_migration_ticks(20);
    let mut env = pre_terminate_env(&bed, Some(&api));
    env.insert("ACTION_BUDGET_SECONDS".into(), "2".into());
    let out = run("pre-terminate", &env);
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    assert!(
        stderr(&out).contains("drain in progress: ") && stderr(&out).contains(&format!("/{holding} slots moved")),
        "{}",
        describe(&out)
    );
    assert!(bed.codis.snapshot().group(leaving).is_some_and(|g| g.servers.len() == 1), "no server deleted yet");
    bed.codis.set_default_migration_ticks(1);
    env.insert("ACTION_BUDGET_SECONDS".into(), "40".into());
    let outs = run_to_completion("pre-terminate", &env);
    assert!(stdout(outs.last().unwrap()).contains("drained and removed"), "{}", describe(outs.last().unwrap()));
    assert_drained(&bed, leaving, &before);

    // Done is done: shardRemove got there first, or this run did.
    bed.codis.clear_requests();
    let out = run("pre-terminate", &env);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(stdout(&out).contains("nothing to drain"), "{}", describe(&out));
    assert!(bed.mutations().is_empty(), "{:?}", bed.mutations());
}

#[test]
fn on_1_1_pre_terminate_cancels_migrations_onto_the_leaving_shard_and_drains_what_arrived() {
    let bed = three();
    let (g0, leaving) = (bed.gid(0).unwrap(), bed.gid(2).unwrap());
    let before = bed.owners();
    // A shardAdd that never finished was moving slots onto the shard now being removed.
    let snap = bed.codis.snapshot();
    let of_g0: Vec<usize> = snap.slots.iter().filter(|s| s.group_id == g0).map(|s| s.id).take(3).collect();
    let x = bed.codis.xauth().to_owned();
    for slot in &of_g0 {
        assert!(bed.codis.call("PUT", &format!("/api/topom/slots/action/create/{x}/{slot}/{leaving}")).is_ok());
    }
    let api = stays(&bed);
    run_to_completion("pre-terminate", &pre_terminate_env(&bed, Some(&api)));
    let snap = bed.codis.snapshot();
    assert!(snap.group(leaving).is_none());
    assert!(snap.with_action().is_empty());
    bed.assert_balanced(&[g0, bed.gid(1).unwrap()]);
    assert!(moved(&before, &bed.owners()) >= 32);
}

#[test]
fn on_1_1_pre_terminate_of_a_shard_codis_never_knew_is_done_at_once() {
    let mut bed = three();
    let stranger = bed.add_shard(1);
    let api = ClusterApi::start(NAMESPACE, &bed.cluster.name, ClusterAnswer::Stays(vec![("pk".into(), 3)]));
    bed.codis.clear_requests();
    let mut env = bed.env(stranger);
    env.insert("KUBE_API_URL".into(), api.url());
    let out = run("pre-terminate", &env);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(stdout(&out).contains("nothing to drain"), "{}", describe(&out));
    assert!(bed.mutations().is_empty(), "{:?}", bed.mutations());
}

#[test]
fn on_1_1_pre_terminate_while_the_cluster_stays_never_skips_a_drain_when_codis_does_not_answer() {
    let bed = three();
    let leaving = bed.gid(2).unwrap();
    let api = stays(&bed);
    bed.codis.pause();
    let mut env = pre_terminate_env(&bed, Some(&api));
    env.insert("ACTION_BUDGET_SECONDS".into(), "4".into());
    let out = run("pre-terminate", &env);
    assert_eq!(out.status.code(), Some(1), "retried by KubeBlocks, not skipped: {}", describe(&out));
    bed.codis.resume().unwrap();
    assert!(bed.codis.snapshot().slots_of(leaving) > 0, "its slots are still there, still its");
    env.insert("ACTION_BUDGET_SECONDS".into(), "40".into());
    run_to_completion("pre-terminate", &env);
    assert!(bed.codis.snapshot().group(leaving).is_none());
}

#[test]
fn on_1_1_pre_terminate_without_an_answering_api_drains_unless_codis_shows_a_cluster_deletion() {
    // No API at all, one that refuses (missing rights) and one that hangs: none of them answers whether the
    // Cluster stays, and Codis shows a live cluster (proxy reachable, other shards registered): the drain runs.
    for answer in [None, Some(ClusterAnswer::Forbidden), Some(ClusterAnswer::Hang)] {
        let bed = three();
        let proxy = ProxyDouble::start(bed.codis.product());
        let x = bed.codis.xauth().to_owned();
        assert!(bed.codis.call("PUT", &format!("/api/topom/proxy/online/{x}/{}", proxy.addr())).is_ok());
        let leaving = bed.gid(2).unwrap();
        let before = bed.owners();
        let api = answer.clone().map(|a| ClusterApi::start(NAMESPACE, &bed.cluster.name, a));
        let mut env = pre_terminate_env(&bed, api.as_ref());
        env.insert("ACTION_BUDGET_SECONDS".into(), "12".into());
        let outs = run_to_completion("pre-terminate", &env);
        let text = stderr(&outs[0]);
        assert!(text.contains("cannot tell from the kubernetes api"), "{answer:?}: {text}");
        assert_drained(&bed, leaving, &before);
    }
}

#[test]
fn on_1_1_pre_terminate_without_an_api_leaves_codis_alone_when_every_proxy_is_gone_or_it_is_the_last_shard() {
    // A cluster deletion terminates the proxies first: Codis reaches none of them.
    let bed = three();
    let _proxy = crate::attack::dead_proxy(&bed);
    bed.codis.clear_requests();
    let out = run("pre-terminate", &pre_terminate_env(&bed, None));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(stdout(&out).contains("none of its 1 proxies"), "{}", describe(&out));
    assert!(bed.mutations().is_empty(), "{:?}", bed.mutations());

    // The last shard of a cluster: a scale-in always keeps one.
    let bed = Bed::builder().shards(1).pods(1).bed_default();
    let mut env = bed.env(0);
    env.insert("ALL_SHARDS_POD_FQDNS".into(), bare(&bed, 0));
    run_to_completion("post-provision", &env);
    bed.codis.clear_requests();
    let out = run("pre-terminate", &env);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(stdout(&out).contains("last registered shard"), "{}", describe(&out));
    assert!(bed.mutations().is_empty(), "{:?}", bed.mutations());
}
