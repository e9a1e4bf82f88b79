//! A real-pika bed with the Codis double in fork mode as its dashboard (`RealBedOptions::double`), and what the
//! tests on it read: the double's request log (promotes, mutations), its model, and the pikas themselves.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use testbed::cluster::eventually;
use testbed::real::bed::{Line, RealBed, RealBedOptions};
use testbed::real::pika::ReplicaState;
use testbed::{CodisDouble, DoubleOptions};

use super::{create, options, run_to_completion};

/// One shard of `pods` real pikas registered at the double, with the fork's codis-proxy, its master moved to
/// `master` by a switchover.
pub(super) fn bed_with_master(pods: u32, master: u32, double: DoubleOptions) -> RealBed {
    let bed =
        RealBed::start(&RealBedOptions { double: Some(double), ..options(1, pods, Line::V1_1, 1) }, super::action());
    create(&bed);
    if master != 0 {
        let env = candidate(bed.switchover_env(0), &bed, master);
        run_to_completion(&bed, &["switchover"], &env);
    }
    bed.assert_registered(0, master);
    codis(&bed).clear_requests();
    bed
}

pub(super) fn candidate(mut env: BTreeMap<String, String>, bed: &RealBed, ordinal: u32) -> BTreeMap<String, String> {
    let pod = bed.shards[0].pod(ordinal);
    env.insert("KB_SWITCHOVER_CANDIDATE_NAME".into(), pod.name.clone());
    env.insert("KB_SWITCHOVER_CANDIDATE_FQDN".into(), pod.fqdn.clone());
    env
}

pub(super) fn codis(bed: &RealBed) -> &CodisDouble {
    bed.dashboard.double().expect("the bed's dashboard is the double")
}

/// The ordinal Codis lists first in shard 0's group.
pub(super) fn codis_master(bed: &RealBed) -> u32 {
    let snap = codis(bed).snapshot();
    let gid = bed.shards[0].pods.iter().find_map(|p| snap.server(&p.server()).map(|(g, _)| g.id)).expect("registered");
    let master = snap.master(gid).expect("a master").to_owned();
    bed.shards[0].pods.iter().find(|p| p.server() == master).expect("a pod of the shard").ordinal
}

/// Promotes the double answered with success.
pub(super) fn promotes(bed: &RealBed) -> usize {
    let promote =
        |r: &&testbed::codis::RequestRecord| r.path.starts_with("/api/topom/group/promote/") && r.status == 200;
    codis(bed).requests().iter().filter(promote).count()
}

/// Requests that change Codis, as the double answered them.
pub(super) fn mutations(bed: &RealBed) -> Vec<String> {
    codis(bed).requests().iter().filter(|r| r.method == "PUT").map(|r| r.path.clone()).collect()
}

/// The ordinals whose pika reports `role:master` (a pod that does not answer counts as nothing).
pub(super) fn pika_masters(bed: &RealBed) -> BTreeSet<u32> {
    let role = |p: &testbed::real::pika::PikaPod| {
        testbed::process::RespConnection::connect(&p.addr(), Some(&bed.password), Duration::from_secs(2))
            .and_then(|mut c| c.command(&["INFO", "replication"]))
            .ok()
            .and_then(|info| testbed::process::info_field(&info, "role"))
    };
    bed.shards[0].pods.iter().filter(|p| role(p).as_deref() == Some("master")).map(|p| p.ordinal).collect()
}

/// Whether pod `ordinal` replicates pod `master` in sync within 30 s.
pub(super) fn follows(bed: &RealBed, ordinal: u32, master: u32) -> bool {
    let m = bed.shards[0].pod(master);
    eventually(Duration::from_secs(30), || {
        ReplicaState::of(&bed.shards[0].pod(ordinal).info_replication())
            .is_some_and(|r| (r.master_host == m.fqdn || r.master_host == m.net.addr.to_string()) && r.in_sync())
    })
}

pub(super) fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}
