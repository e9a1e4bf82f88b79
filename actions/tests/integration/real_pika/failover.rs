//! Failover on the real servers with what blocks it in a cluster (issue 35): proxies gone without their preStop.
//! The fork's own HA loops run throughout, at the chart's settings (health checks every 10 s and 2 s; its master
//! failover kept dormant while the watcher is enabled).

use std::time::Duration;

use testbed::real::bed::{Line, RealBed};
use testbed::Ledger;

use super::{bed, create, failed_over, writer};

/// Every acknowledged key of `ledger` reads back through proxy `index`.
fn assert_kept(bed: &RealBed, index: usize, ledger: Ledger, what: &str) {
    let check = ledger.verify_through_authed(bed.proxies[index].data_addr(), Some(&bed.password));
    assert!(check.is_clean(), "{what}: {}", check.summary());
}

/// The proxies the dashboard lists, as `(token, admin address)`.
fn registered(bed: &RealBed) -> Vec<(String, String)> {
    bed.topology().proxies
}

/// Preloads keys through proxy 0.
fn preload(bed: &RealBed, prefix: &str) -> Ledger {
    let keys: Vec<String> = (0..500).map(|n| format!("{prefix}:pre:{n}")).collect();
    let ledger = Ledger::write_keys_authed(bed.proxies[0].data_addr(), Some(&bed.password), &keys).expect("preload");
    assert_eq!(ledger.acked.len(), keys.len(), "preload: {:?}", ledger.errors);
    ledger
}

/// A proxy whose pod died without its preStop (SIGKILL, never offlined) stays registered, and Codis pushes every
/// promote to every registered proxy: the fork answers "proxy-[…] resync slots failed" and leaves the group
/// promoting. The watcher must remove that proxy (Codis's force removal) and fail the master over, and keep the
/// live proxy, which serves every key afterwards.
#[test]
fn a_proxy_killed_without_its_prestop_blocks_no_failover_and_the_live_proxy_stays() {
    let mut bed = bed(1, 2, Line::V1_0, 2);
    create(&bed);
    let live = (bed.proxies[0].token().expect("proxy 0's token"), bed.proxies[0].admin_addr().to_owned());
    assert_eq!(registered(&bed).len(), 2, "both proxies online: {:?}", registered(&bed));
    let preloaded = preload(&bed, "stale");
    let watcher = bed.start_watcher();
    let during = writer(&bed, "stale:w");

    bed.proxies[1].kill();
    let master = bed.master_ordinal(0);
    bed.shards[0].pod_mut(master).kill();
    let promoted = failed_over(&bed, master, &watcher);
    assert_ne!(promoted, master);

    assert_eq!(registered(&bed), vec![live], "the dead proxy is still listed, or the live one went");
    let acked = during.acked();
    assert!(
        during.wait_for_acked(acked + 50, Duration::from_secs(30)),
        "no write through the live proxy after the failover:\n{}",
        watcher.log()
    );
    let log = watcher.log();
    assert!(log.contains("proxy gone: removed"), "the watcher did not say it removed the proxy:\n{log}");
    assert_kept(&bed, 0, preloaded, "preloaded keys lost");
    let during = during.stop();
    // Writes the killed master alone took may go with it (asynchronous replication); none may come back wrong.
    let check = during.verify_through_authed(bed.proxies[0].data_addr(), Some(&bed.password));
    assert!(check.wrong.is_empty() && check.errors.is_empty(), "{}", check.summary());
    eprintln!("writes lost with the killed master: {} of {}", check.lost.len(), check.checked);
}

/// A proxy pod deleted without its preStop and made again on another node comes back at the same address (its
/// pod's FQDN) under another token (the fork's token hashes the host's MAC addresses), and its old entry stays
/// registered: the dashboard can no longer reach that entry (the new process refuses its xauth), so every promote
/// fails on it. The watcher removes the old entry and never the new proxy answering at the same address; a master
/// killed afterwards is failed over.
#[test]
fn a_proxy_pod_made_again_leaves_an_entry_that_is_removed_and_the_new_proxy_stays() {
    let mut bed = bed(1, 2, Line::V1_1, 1);
    create(&bed);
    let old = bed.proxies[0].token().expect("the proxy's token");
    bed.replace_proxy_pod(0);
    let new = bed.proxies[0].token().expect("the restarted proxy's token");
    assert_ne!(old, new, "the restarted proxy kept its token");
    let admin = bed.proxies[0].admin_addr().to_owned();
    let both = registered(&bed);
    assert!(both.contains(&(old.clone(), admin.clone())), "the old entry is not listed: {both:?}");
    let preloaded = preload(&bed, "restarted");
    let watcher = bed.start_watcher();

    let only_new = || registered(&bed) == vec![(new.clone(), admin.clone())];
    assert!(
        testbed::cluster::eventually(Duration::from_secs(30), only_new),
        "the old entry was not removed, or the new proxy went: {:?}\n{}",
        registered(&bed),
        watcher.log()
    );
    let master = bed.master_ordinal(0);
    bed.shards[0].pod_mut(master).kill();
    failed_over(&bed, master, &watcher);
    assert_eq!(registered(&bed), vec![(new, admin)], "the live proxy went");
    assert_kept(&bed, 0, preloaded, "preloaded keys lost");
}
