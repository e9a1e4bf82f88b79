//! Automatic failover: `pika-action watch` over the test bed (real redis-servers standing in for pika, real etcd,
//! the Codis dashboard double and a proxy double serving the data port). A master killed with `kill -9` is
//! replaced, writes through the proxy resume and every acknowledged key is read back through the data path; the old
//! master follows when it returns; a replica that is down is left alone and nothing is deleted from Codis; two
//! watchers elect one; a watcher without etcd never promotes; a partitioned old
//! master is never routed to again and is demoted when it reappears; a slow master is left alone; under the Pika
//! fork's dashboard, whose HA the chart keeps dormant, the two never fight.
//!
//! "Never two masters" is checked on samples taken every 2 ms: every pod's `INFO replication` role asked directly,
//! Codis's `servers[0]`, and where the proxy routes the group's slots. What is asserted: at most one server the
//! proxies can reach answers `role:master` at every sample of a kill, the proxy routes the group to one server at a
//! time, and never to the old master again once Codis listed the new one. A partitioned old master keeps saying
//! `role:master` to whoever can still reach it (the sampler, directly) until the partition heals: pika cannot be
//! told anything through a partition, and nothing routes to it.

use crate::failover_bed;
use crate::support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use failover_bed::{
    expect_ok, kill9, lag_now, ledger_of, outage, sampling, EventsApi, FailoverBed, Options, Pulse, Sample, PATIENCE,
};
use support::{describe, eventually, run};

/// A planned transfer killed while the proxies held its group's writes, and never run again (KubeBlocks ignores a
/// failed switchover): the failover watcher's periodic round finds the group's idle slots locked with no transfer
/// under way (no fence) and releases them, and the held write goes through.
#[test]
fn the_watcher_releases_writes_a_killed_transfer_left_held_at_the_proxies() {
    let fb = FailoverBed::new(Options::default().shards(1).pods(2));
    let master = fb.pods(0)[fb.codis_master(0) as usize].server();
    assert!(fb.proxy.hold_slots_of(&master) > 0, "no slot routed to {master}");
    let proxy = fb.proxy.data_addr();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // A key of every slot of the group would do: write until one lands on a held slot.
        let mut conn = testbed::process::RespConnection::connect(&proxy, None, Duration::from_secs(60))
            .expect("connect to the proxy");
        let replies: Vec<String> =
            (0..64).map(|n| format!("{:?}", conn.command(&["SET", &format!("held:{n}"), "v"]))).collect();
        let _ = tx.send(replies);
    });
    assert!(rx.recv_timeout(Duration::from_secs(2)).is_err(), "writes went through while the slots were held");
    let watcher = fb.watcher("w", &fb.watch_env("w", 400));
    let released = rx.recv_timeout(Duration::from_secs(30));
    assert!(released.is_ok(), "the held writes never went through:\n{}", watcher.log());
    assert!(watcher.log().contains("releasing them"), "{}", watcher.log());
}
use testbed::{DoubleOptions, Workload, WorkloadOptions};

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The proxy serves the group from one server at every sample, and never from the old master again once Codis
/// listed the new one.
fn assert_one_master_served(samples: &[Sample], old: u32, new: u32) {
    assert!(samples.len() > 20, "too few samples: {}", samples.len());
    let mut listed_new = false;
    for (i, s) in samples.iter().enumerate() {
        assert!(s.routed.len() <= 1, "sample {i}: the group is served from {:?}", s.routed);
        listed_new |= s.codis_master == Some(new);
        if listed_new {
            assert!(!s.routed.contains(&old), "sample {i}: routed to the old master {old} after the promote");
        }
    }
    assert!(listed_new, "codis never listed the new master {new}");
}

#[test]
fn a_master_killed_and_never_back_is_replaced_writes_resume_and_it_follows_when_it_returns() {
    let mut fb = FailoverBed::new(Options::default().shards(1).pods(3));
    let api = EventsApi::start();
    let mut env = fb.watch_env("watcher-a", 1000);
    env.insert("KUBE_API_URL".into(), api.url());
    let watcher = fb.watcher("watcher-a", &env);
    assert!(watcher.wait_log("leading", PATIENCE), "{}", watcher.log());

    let data = fb.proxy.data_addr();
    let workload = Workload::start(WorkloadOptions::through(std::slice::from_ref(&data)));
    let pulse = Pulse::start(&data, "pulse", Duration::from_millis(2));
    assert!(workload.wait_for_acked(300, PATIENCE));
    fb.bed.codis.clear_requests();
    let old = fb.codis_master(0);

    let ((t0, lag, new), samples) = sampling(&fb, 0, || {
        let lag = lag_now(&fb, 0, old);
        let t0 = kill9(&fb.pods(0)[old as usize]);
        let new = fb.wait_new_master(0, old).expect("a new master");
        // Writes resume: wait for a few acknowledged after the kill.
        let before = pulse.acked();
        assert!(eventually(PATIENCE, || pulse.acked() > before + 20), "writes did not resume");
        (t0, lag, new)
    });
    fb.pod_mut(0, old).redis.kill();
    let beats = pulse.stop();
    let ledger = workload.stop();

    assert_ne!(new, old);
    assert_eq!(fb.promotes(), 1, "{:?}", fb.bed.mutations());
    assert_one_master_served(&samples, old, new);
    // The old master is dead: at no sample did two servers answer `role:master`.
    for (i, s) in samples.iter().enumerate() {
        assert!(s.masters.len() <= 1, "sample {i}: two masters {:?}", s.masters);
    }
    assert!(fb.wait_converged(0), "the surviving replica follows the new master");
    let took = outage(&beats, t0).expect("a write after the kill was acknowledged");

    // Every acknowledged write, read back through the proxy and from the masters Codis lists: only writes
    // acknowledged in the last moments before the kill (within the replication lag) may be missing.
    let pulse_ledger = ledger_of(&beats);
    let through = pulse_ledger.verify_through(&data);
    assert!(through.errors.is_empty(), "{}", through.summary());
    failover_bed::assert_lost_only_a_tail(&beats, &through.lost, t0);
    let bulk = ledger.verify_on_backends(&fb.bed.codis);
    assert!(bulk.errors.is_empty() && bulk.wrong.is_empty(), "{}", bulk.summary());
    assert!(bulk.lost.len() <= 20, "more lost than a replication lag holds: {}", bulk.summary());
    eprintln!(
        "kill -9 of the master: first write acknowledged {} ms after; replication lag at the kill {lag:?} bytes; \
         pulse {} checked, {} lost; workload {} checked, {} lost; {} samples, max masters at once {}",
        took.as_millis(),
        through.checked,
        through.lost.len(),
        bulk.checked,
        bulk.lost.len(),
        samples.len(),
        samples.iter().map(|s| s.masters.len()).max().unwrap_or(0)
    );

    // Logged, recorded for `topology`, and announced as an Event on the Cluster.
    assert!(watcher.wait_log("failover done", PATIENCE), "{}", watcher.log());
    let event = api.wait_for("Failover").expect("a Failover event");
    let old_server = fb.pods(0)[old as usize].server();
    let new_server = fb.pods(0)[new as usize].server();
    let message = event["message"].as_str().unwrap_or_default();
    assert!(message.contains(&old_server) && message.contains(&new_server), "{event}");
    assert_eq!(event["involvedObject"]["kind"], "Cluster");
    assert_eq!(event["type"], "Warning");
    let out = run("topology", &fb.env(0));
    let text = stdout(&out);
    assert!(text.contains("last failover") && text.contains(&format!("{old_server} -> {new_server}")), "{text}");
    assert!(text.contains("by watcher watcher-a"), "{text}");

    // The old master comes back (its pod restarted): rejoin makes it follow the new one.
    let out = fb.rejoin(0, old, &[]);
    expect_ok("rejoin of the old master", &out);
    assert!(stdout(&out).contains(&format!("follows {new_server}")), "{}", describe(&out));
    let (view, cluster) = fb.split(0);
    let (_, samples) = failover_bed::sampling_view(&view, || {
        let pod = cluster.shards[0].pods.iter_mut().find(|p| p.ordinal == old).expect("pod");
        pod.redis.restart();
        std::thread::sleep(Duration::from_secs(2));
    });
    assert!(fb.wait_converged(0));
    assert!(samples.iter().all(|s| s.masters.len() <= 1), "two masters after the old master returned");
    assert_eq!(fb.promotes(), 1, "nobody promoted the old master back");
    assert_eq!(fb.codis_master(0), new);
}

#[test]
fn two_watchers_at_once_elect_one_that_acts_and_the_other_takes_over_when_it_dies() {
    let mut fb = FailoverBed::new(Options::default().shards(1).pods(3));
    let mut a = fb.watcher("watcher-a", &fb.watch_env("watcher-a", 800));
    let mut b = fb.watcher("watcher-b", &fb.watch_env("watcher-b", 800));
    assert!(eventually(PATIENCE, || a.log().contains("leading") || b.log().contains("leading")));
    assert!(eventually(PATIENCE, || a.log().contains("standing by") || b.log().contains("standing by")));
    let (leader, standby) = if a.log().contains("leading") { (&mut a, &mut b) } else { (&mut b, &mut a) };
    assert!(!standby.log().contains("leading"), "both lead:\n{}\n{}", leader.log(), standby.log());
    fb.bed.codis.clear_requests();

    let old = fb.codis_master(0);
    kill9(&fb.pods(0)[old as usize]);
    let new = fb.wait_new_master(0, old).expect("a new master");
    fb.pod_mut(0, old).redis.kill();
    assert!(leader.wait_log("failover done", PATIENCE), "{}", leader.log());
    assert!(fb.wait_converged(0));
    assert_eq!(fb.promotes(), 1, "{:?}", fb.bed.mutations());
    assert!(!standby.log().contains("failing over"), "the standby acted:\n{}", standby.log());

    // The leader crashes; the standby takes over once its lease ends, and handles the next death.
    leader.kill();
    assert!(standby.wait_log("leading", PATIENCE), "{}", standby.log());
    kill9(&fb.pods(0)[new as usize]);
    let third = fb.wait_new_master(0, new).expect("a third master");
    fb.pod_mut(0, new).redis.kill();
    assert!(![old, new].contains(&third));
    assert!(standby.wait_log("failover done", PATIENCE), "{}", standby.log());
    assert_eq!(fb.promotes(), 2, "{:?}", fb.bed.mutations());
    assert_eq!(fb.roles(0).values().filter(|r| *r == "master").count(), 1, "{:?}", fb.roles(0));
}

#[test]
fn with_etcd_unreachable_no_master_is_promoted_until_the_fence_can_be_written() {
    let mut fb = FailoverBed::new(Options::default().shards(1).pods(3));
    let watcher = fb.watcher("watcher-a", &fb.watch_env("watcher-a", 800));
    assert!(watcher.wait_log("leading", PATIENCE), "{}", watcher.log());
    fb.bed.codis.clear_requests();
    let old = fb.codis_master(0);

    fb.bed.cluster.etcd.stop();
    kill9(&fb.pods(0)[old as usize]);
    fb.pod_mut(0, old).redis.kill();
    // The watcher notices the death, cannot fence it, and stands down when its lease cannot be confirmed.
    assert!(
        watcher.wait_log("standing down", PATIENCE) || watcher.wait_log("failover did not complete", PATIENCE),
        "{}",
        watcher.log()
    );
    // Several detection times later, still nothing was promoted.
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(fb.promotes(), 0, "promoted without etcd: {:?}", fb.bed.mutations());
    assert_eq!(fb.codis_master(0), old);
    assert!(fb.roles(0).values().all(|r| r == "slave"), "a replica made itself master: {:?}", fb.roles(0));

    fb.bed.cluster.etcd.resume();
    let new =
        fb.wait_new_master(0, old).unwrap_or_else(|| panic!("not promoted once etcd answers:\n{}", watcher.log()));
    assert!(fb.wait_converged(0));
    assert_eq!(fb.promotes(), 1, "{:?}", fb.bed.mutations());
    assert_ne!(new, old);
}

#[test]
fn a_partitioned_old_master_is_never_routed_to_again_and_is_demoted_when_it_reappears() {
    // A promote pushes the group's slots to the proxy, whose fill waits for the requests in flight on each slot; those
    // sent to the partitioned master end only at the proxy's backend timeout (3 s in the double, codis-proxy's
    // `backend_recv_timeout` in a cluster). The dashboard's call to the proxy must outlast that, or every push of the
    // promote times out and is retried from the start.
    let double = DoubleOptions { proxy_timeout: Duration::from_secs(10), ..DoubleOptions::default() };
    let fb = FailoverBed::new(Options { forwarders: true, double, ..Options::default().shards(1).pods(3) });
    let watcher = fb.watcher("watcher-a", &fb.watch_env("watcher-a", 1000));
    assert!(watcher.wait_log("leading", PATIENCE), "{}", watcher.log());
    let data = fb.proxy.data_addr();
    let pulse = Pulse::start(&data, "pulse", Duration::from_millis(2));
    assert!(eventually(PATIENCE, || pulse.acked() > 100));
    fb.bed.codis.clear_requests();
    let old = fb.codis_master(0);
    let old_server = fb.pods(0)[old as usize].server();
    let fwd = &fb.forwarders[&old_server];

    let ((t0, cut, held_at_cut, new, healed, demoted), samples) = sampling(&fb, 0, || {
        let t0 = Instant::now();
        fwd.partition();
        let cut = Instant::now();
        // What the replicas hold once the cut has settled (a pump's write under way when it came ends; what the
        // master sent after waits for the heal): a write the old master acknowledged just before the cut whose
        // replication stream it had not sent yet is on no replica, and no failover can keep it (asynchronous
        // replication; seen once on a loaded machine: 1 of 187).
        std::thread::sleep(Duration::from_millis(50));
        let held_at_cut: BTreeSet<String> = fb
            .pods(0)
            .iter()
            .filter(|p| p.ordinal != old)
            .flat_map(|p| p.redis.command(&["KEYS", "pulse:*"]).lines().map(str::to_owned).collect::<Vec<_>>())
            .collect();
        assert!(held_at_cut.len() > 100, "the replicas held {} of the writes at the cut", held_at_cut.len());
        let new = fb.wait_new_master(0, old).unwrap_or_else(|| panic!("no new master:\n{}", watcher.log()));
        let before = pulse.acked();
        assert!(eventually(PATIENCE, || pulse.acked() > before + 20), "writes did not resume");
        // Alive all along, it still says master to whoever reaches it directly.
        assert_eq!(fb.roles(0).get(&old).map(String::as_str), Some("master"));
        let healed = Instant::now();
        fwd.heal();
        let demoted = eventually(PATIENCE, || fb.roles(0).get(&old).map(String::as_str) == Some("slave"));
        (t0, cut, held_at_cut, new, healed, demoted.then(Instant::now))
    });
    let beats = pulse.stop();
    assert!(demoted.is_some(), "the old master was never demoted:\n{}", watcher.log());
    assert!(fb.wait_converged(0));
    assert_eq!(fb.promotes(), 1);
    assert_one_master_served(&samples, old, new);
    // Two servers answered master only while the old one was cut off (seen directly by the sampler, not by any
    // client) and in the moment after the heal before the watcher reached it.
    let both: Vec<&Sample> = samples.iter().filter(|s| s.masters.len() > 1).collect();
    let after_heal = both.iter().filter(|s| s.at >= healed).count();
    let demoted = demoted.unwrap();
    assert!(both.iter().all(|s| s.at <= demoted), "two masters after the demotion");
    // Every acknowledged write a replica held at the cut, and every one after it, is kept; only those no replica had
    // may go.
    let unreplicated: BTreeSet<&String> = beats
        .iter()
        .filter(|b| b.acked.is_some() && b.sent < cut && !held_at_cut.contains(&b.key))
        .map(|b| &b.key)
        .collect();
    let verification = ledger_of(&beats).verify_through(&data);
    let kept = verification.lost.iter().all(|k| unreplicated.contains(k));
    assert!(
        kept && verification.wrong.is_empty() && verification.errors.is_empty(),
        "{} (on no replica at the cut: {unreplicated:?})",
        verification.summary()
    );
    eprintln!(
        "partitioned master: {} acknowledged write(s) on no replica at the cut, {} lost;",
        unreplicated.len(),
        verification.lost.len()
    );
    eprintln!(
        "partitioned master: first write {} ms after the partition; demoted {} ms after the heal; samples with two \
         masters answering: {} while partitioned (unreachable to clients), {after_heal} after the heal",
        failover_bed::outage_after_first_failure(&beats, t0).map_or(0, |d| d.as_millis()),
        demoted.duration_since(healed).as_millis(),
        both.len() - after_heal,
    );
}

#[test]
fn a_master_that_is_only_slow_is_not_failed_over() {
    let fb = FailoverBed::new(Options { forwarders: true, ..Options::default().shards(1).pods(2) });
    let watcher = fb.watcher("watcher-a", &fb.watch_env("watcher-a", 2000));
    assert!(watcher.wait_log("leading", PATIENCE), "{}", watcher.log());
    fb.bed.codis.clear_requests();
    let old = fb.codis_master(0);
    let fwd = &fb.forwarders[&fb.pods(0)[old as usize].server()];
    // Three stalls of 1.2 s (held bytes are delivered late, as after retransmission), below the 2 s threshold.
    for _ in 0..3 {
        fwd.partition();
        std::thread::sleep(Duration::from_millis(1200));
        fwd.heal();
        std::thread::sleep(Duration::from_millis(400));
    }
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(fb.promotes(), 0, "a slow master was failed over: {:?}\n{}", fb.bed.mutations(), watcher.log());
    assert_eq!(fb.codis_master(0), old);
    assert!(!watcher.log().contains("failing over"), "{}", watcher.log());
}

#[test]
fn under_the_pika_fork_the_watcher_fails_over_and_the_forks_dormant_ha_never_fights_it() {
    // The chart's dashboard.toml gives the fork 127 dead checks an hour apart; the double checks every 100 ms, so
    // its failover would fire after 12.7 s: long after ours, and it must then have nothing to do.
    let double = DoubleOptions { fork: true, dead_checks: 127, ..DoubleOptions::default() };
    let mut fb = FailoverBed::new(Options { double, ..Options::default().shards(1).pods(3) });
    let watcher = fb.watcher("watcher-a", &fb.watch_env("watcher-a", 800));
    assert!(watcher.wait_log("leading", PATIENCE), "{}", watcher.log());
    fb.bed.codis.clear_requests();
    let old = fb.codis_master(0);
    kill9(&fb.pods(0)[old as usize]);
    fb.pod_mut(0, old).redis.kill();
    let new = fb.wait_new_master(0, old).expect("a new master");
    assert!(fb.wait_converged(0));
    let order: Vec<String> =
        fb.bed.codis.snapshot().group(fb.gid(0)).unwrap().servers.iter().map(|s| s.server.clone()).collect();
    // Past the fork's own dead-check window: nothing moved again.
    let (_, samples) = sampling(&fb, 0, || std::thread::sleep(Duration::from_secs(15)));
    let now: Vec<String> =
        fb.bed.codis.snapshot().group(fb.gid(0)).unwrap().servers.iter().map(|s| s.server.clone()).collect();
    assert_eq!(order, now, "the fork reordered the group after our failover");
    assert_eq!(fb.codis_master(0), new);
    // Our promote did it (the double logs a promote whose answer came late with status 0), not the fork's own HA.
    let log = watcher.log();
    assert!(log.contains("failover done") && !log.contains("already replaced"), "{log}");
    assert!(fb.promotes() <= 1, "{:?}", fb.bed.mutations());
    assert!(fb.bed.mutations().iter().any(|p| p.starts_with("/api/topom/group/promote/")), "{:?}", fb.bed.mutations());
    assert!(samples.iter().all(|s| s.masters.len() <= 1 && s.codis_master == Some(new)));
    let masters: BTreeSet<u32> = fb.roles(0).into_iter().filter(|(_, r)| r == "master").map(|(o, _)| o).collect();
    assert_eq!(masters, BTreeSet::from([new]));
}

#[test]
fn a_replica_that_is_down_is_left_alone_and_nothing_is_ever_deleted_from_codis() {
    let mut fb = FailoverBed::new(Options::default().shards(1).pods(3));
    let watcher = fb.watcher("watcher-a", &fb.watch_env("watcher-a", 800));
    assert!(watcher.wait_log("leading", PATIENCE), "{}", watcher.log());
    fb.bed.codis.clear_requests();
    let old = fb.codis_master(0);
    let down = (old + 2) % 3;
    kill9(&fb.pods(0)[down as usize]);
    fb.pod_mut(0, down).redis.kill();
    // Several detection times with a replica down: nothing is done about it.
    std::thread::sleep(Duration::from_secs(3));
    assert!(fb.bed.mutations().is_empty(), "acted on a replica that is down: {:?}", fb.bed.mutations());
    assert!(!watcher.log().contains("failing over"), "{}", watcher.log());

    // The master dies too: the one live replica takes over, and the down one stays registered.
    kill9(&fb.pods(0)[old as usize]);
    fb.pod_mut(0, old).redis.kill();
    let new = fb.wait_new_master(0, old).unwrap_or_else(|| panic!("no new master:\n{}", watcher.log()));
    assert!(![old, down].contains(&new), "promoted a dead member {new}");
    assert!(watcher.wait_log("failover done", PATIENCE), "{}", watcher.log());
    let servers = fb.bed.codis.snapshot().group(fb.gid(0)).expect("group").servers.len();
    assert_eq!(servers, 3, "a member was removed from codis");
    let deletes: Vec<String> = fb
        .bed
        .mutations()
        .into_iter()
        .filter(|p| p.contains("/group/del/") || p.contains("/proxy/remove/") || p.contains("/group/remove/"))
        .collect();
    assert!(deletes.is_empty(), "the watcher deleted from codis: {deletes:?}");
    assert_eq!(fb.promotes(), 1, "{:?}", fb.bed.mutations());
    assert_eq!(fb.roles(0).into_iter().filter(|(_, r)| r == "master").map(|(o, _)| o).collect::<Vec<_>>(), [new]);
}
