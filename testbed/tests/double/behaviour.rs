//! Behaviour of the dashboard double beyond the recordings: real backends, the executors, Codis's checks, slot actions,
//! removal, promote, sync and rebalance rules, fault injection and fork-mode HA.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use testbed::codis::{HttpReply, PromotingState, ServerActionState, SlotState};
use testbed::{CodisDouble, DoubleOptions, Fault, ProxyDouble, ProxyOptions, RedisServer};

const WAIT: Duration = Duration::from_secs(20);

/// A pod-like registered name for the n-th backend.
fn pod(n: usize) -> String {
    format!("c1-pika-a-{n}.c1-pika-a-headless.default.svc.cluster.local:9221")
}

fn double_for(servers: &[&RedisServer], opts: DoubleOptions) -> CodisDouble {
    let mut overrides: BTreeMap<String, String> = opts.overrides.clone();
    for (i, s) in servers.iter().enumerate() {
        overrides.insert(pod(i), s.addr());
    }
    CodisDouble::start(DoubleOptions { overrides, ..opts })
}

fn put(d: &CodisDouble, path: &str) -> HttpReply {
    d.call("PUT", path)
}

fn ok(d: &CodisDouble, path: &str) {
    let r = put(d, path);
    assert!(r.is_ok(), "PUT {path}: {} {}", r.status, r.body);
}

fn cause(d: &CodisDouble, path: &str) -> String {
    let r = put(d, path);
    assert_eq!(r.status, 800, "PUT {path}: {}", r.body);
    r.cause().unwrap_or_default()
}

fn wait(mut ready: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        if ready() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

fn order(d: &CodisDouble, gid: u32) -> Vec<String> {
    d.snapshot().group(gid).map(|g| g.servers.iter().map(|s| s.server.clone()).collect()).unwrap_or_default()
}

#[test]
fn xauth_is_checked_first_and_routing_follows_martini() {
    let d = CodisDouble::start(DoubleOptions::default());
    let wrong = put(&d, "/api/topom/group/create/0123456789abcdef0123456789abcdef/notanumber");
    assert_eq!(wrong.cause().unwrap(), "invalid xauth, please check product name & auth");
    assert_eq!(wrong.json().unwrap()["Stack"], serde_json::Value::Null);
    let bad = put(&d, "/api/topom/group/create/{xauth}/notanumber");
    assert_eq!(bad.cause().unwrap(), "invalid gid");
    assert_eq!(bad.json().unwrap()["Stack"], serde_json::Value::Null);
    let traced = put(&d, "/api/topom/group/create/{xauth}/0");
    assert!(traced.json().unwrap()["Stack"].is_array());
    // Wrong method and unknown path are both Go's 404; a trailing slash is accepted; GET / redirects.
    assert_eq!(
        d.call("GET", "/api/topom/group/create/{xauth}/1"),
        HttpReply { status: 404, body: "404 page not found\n".into() }
    );
    assert_eq!(d.call("GET", "/api/topom//xping/{xauth}").status, 404);
    assert!(d.call("GET", "/api/topom/xping/{xauth}/").is_ok());
    assert_eq!(d.call("GET", "/").status, 302);
    ok(&d, "/api/topom/group/create/{xauth}/1/");
    assert_eq!(cause(&d, "/api/topom/loglevel/{xauth}/LOUD"), "invalid loglevel");
    ok(&d, "/api/topom/loglevel/{xauth}/WARN");
    // The model needs no xauth and reports the product, like Codis.
    let model = d.call("GET", "/api/topom/model").json().unwrap();
    assert_eq!(model["product_name"], "codis-demo");
}

#[test]
fn group_add_dials_the_server_and_reports_go_dial_errors() {
    let redis = RedisServer::start();
    let d = double_for(&[&redis], DoubleOptions::default());
    ok(&d, "/api/topom/group/create/{xauth}/1");
    let dead = format!("127.0.0.1:{}", testbed::free_port());
    assert_eq!(
        cause(&d, &format!("/api/topom/group/add/{{xauth}}/1/{dead}")),
        format!("dial tcp {dead}: connect: connection refused")
    );
    // The dial comes before every other check, so even a missing group reports it.
    assert!(cause(&d, &format!("/api/topom/group/add/{{xauth}}/7/{dead}")).starts_with("dial tcp"));
    // Registered under its pod name, dialled at the real address; %3A works like ':'.
    let escaped = pod(0).replace(':', "%3A");
    ok(&d, &format!("/api/topom/group/add/{{xauth}}/1/{escaped}/dc1"));
    let snap = d.snapshot();
    let (_, s) = snap.server(&pod(0)).unwrap();
    assert_eq!(s.datacenter, "dc1");
    assert_eq!(
        cause(&d, &format!("/api/topom/group/add/{{xauth}}/2/{}", pod(0))),
        format!("server-[{}] already exists", pod(0))
    );
    // group/info is the backend's real INFO.
    let info = d.call("GET", &format!("/api/topom/group/info/{}", pod(0))).json().unwrap();
    assert_eq!(info["tcp_port"], redis.port().to_string());
    assert_eq!(info["role"], "master");
}

#[test]
fn a_password_is_sent_as_auth_and_its_absence_shows() {
    let redis = RedisServer::start_with(Some("s3cret"));
    let without = double_for(&[&redis], DoubleOptions::default());
    ok(&without, "/api/topom/group/create/{xauth}/1");
    let c = cause(&without, &format!("/api/topom/group/add/{{xauth}}/1/{}", pod(0)));
    assert!(c.starts_with("NOAUTH"), "{c}");
    let with = double_for(&[&redis], DoubleOptions { password: Some("s3cret".into()), ..DoubleOptions::default() });
    ok(&with, "/api/topom/group/create/{xauth}/1");
    ok(&with, &format!("/api/topom/group/add/{{xauth}}/1/{}", pod(0)));
}

#[test]
fn a_sync_action_walks_its_states_and_makes_a_real_replica() {
    let master = RedisServer::start();
    let mut replica = RedisServer::start();
    let d =
        double_for(&[&master, &replica], DoubleOptions { tick: Duration::from_millis(40), ..DoubleOptions::default() });
    ok(&d, "/api/topom/group/create/{xauth}/1");
    ok(&d, &format!("/api/topom/group/add/{{xauth}}/1/{}", pod(0)));
    ok(&d, &format!("/api/topom/group/add/{{xauth}}/1/{}", pod(1)));
    assert_eq!(replica.role(), "master", "group/add must not send SLAVEOF");
    ok(&d, &format!("/api/topom/group/action/create/{{xauth}}/{}", pod(1)));
    assert_eq!(
        cause(&d, &format!("/api/topom/group/action/create/{{xauth}}/{}", pod(1))),
        format!("server-[{}] action already exist", pod(1))
    );
    let mut seen = Vec::new();
    let done = d.wait_for(WAIT, |s| {
        let a = s.server(&pod(1)).unwrap().1.action;
        if seen.last() != Some(&a.state) {
            seen.push(a.state);
        }
        a.state == ServerActionState::Synced
    });
    assert!(done.is_some(), "states seen: {seen:?}");
    assert_eq!(seen, [ServerActionState::Pending, ServerActionState::Syncing, ServerActionState::Synced]);
    assert_eq!(done.unwrap().server(&pod(1)).unwrap().1.action.index, 0, "the index is gone once done");
    assert!(
        wait(|| replica.master() == Some(("127.0.0.1".into(), master.port(), true))),
        "{}",
        replica.info_replication()
    );
    // CONFIG REWRITE made it stick across a restart.
    replica.restart();
    assert!(wait(|| replica.master().is_some_and(|(_, p, _)| p == master.port())));
    ok(&d, &format!("/api/topom/group/action/remove/{{xauth}}/{}", pod(1)));
    assert_eq!(
        cause(&d, &format!("/api/topom/group/action/remove/{{xauth}}/{}", pod(1))),
        format!("server-[{}] action doesn't exist", pod(1))
    );
    assert_eq!(cause(&d, "/api/topom/group/action/create/{xauth}/nowhere:1"), "server-[nowhere:1] doesn't exist");
}

fn replicated_group(d: &CodisDouble, servers: &[&RedisServer]) {
    ok(d, "/api/topom/group/create/{xauth}/1");
    for i in 0..servers.len() {
        ok(d, &format!("/api/topom/group/add/{{xauth}}/1/{}", pod(i)));
    }
    for i in 1..servers.len() {
        ok(d, &format!("/api/topom/group/action/create/{{xauth}}/{}", pod(i)));
    }
    let synced = d.wait_for(WAIT, |s| {
        s.group(1).unwrap().servers.iter().skip(1).all(|x| x.action.state == ServerActionState::Synced)
    });
    assert!(synced.is_some());
}

#[test]
fn promote_sends_slaveof_no_one_to_the_new_master_only_and_reorders() {
    let (a, b, c) = (RedisServer::start(), RedisServer::start(), RedisServer::start());
    let d = double_for(&[&a, &b, &c], DoubleOptions::default());
    replicated_group(&d, &[&a, &b, &c]);
    assert_eq!(
        cause(&d, &format!("/api/topom/group/promote/{{xauth}}/1/{}", pod(0))),
        "group-[1] can't promote master"
    );
    assert_eq!(cause(&d, "/api/topom/group/promote/{xauth}/1/x:1"), "group-[1] doesn't have server-[x:1]");
    ok(&d, &format!("/api/topom/group/promote/{{xauth}}/1/{}", pod(2)));
    assert_eq!(order(&d, 1), [pod(2), pod(1), pod(0)]);
    let snap = d.snapshot();
    let g = snap.group(1).unwrap();
    assert!(g.promoting.state.is_nothing());
    assert!(g.servers.iter().all(|s| s.action.state.is_nothing()), "server actions are cleared");
    assert_eq!(c.role(), "master");
    // Faithful to Codis: the old master and the other slave were not touched.
    assert_eq!(a.role(), "master");
    assert_eq!(b.master().map(|(_, p, _)| p), Some(a.port()));
}

#[test]
fn a_promote_whose_proxy_push_fails_stays_preparing_and_resumes() {
    let (a, b) = (RedisServer::start(), RedisServer::start());
    let proxy = ProxyDouble::start("codis-demo");
    let d = double_for(&[&a, &b], DoubleOptions::default());
    replicated_group(&d, &[&a, &b]);
    ok(&d, &format!("/api/topom/proxy/online/{{xauth}}/{}", proxy.addr()));
    assert!(proxy.is_online());
    assert!(d.call_with_body("PUT", "/api/topom/slots/assign/{xauth}", r#"[{"id":0,"group_id":1}]"#).is_ok());
    proxy.stop();
    let token = proxy.token();
    let promote = format!("/api/topom/group/promote/{{xauth}}/1/{}", pod(1));
    assert_eq!(cause(&d, &promote), format!("proxy-[{token}] resync slots failed"));
    let g = d.snapshot().group(1).unwrap().clone();
    assert_eq!((g.promoting.index, g.promoting.state), (1, PromotingState::Preparing));
    assert_eq!(
        cause(&d, &format!("/api/topom/group/add/{{xauth}}/1/{}", pod(0))),
        format!("server-[{}] already exists", pod(0))
    );
    assert_eq!(cause(&d, &format!("/api/topom/group/del/{{xauth}}/1/{}", pod(1))), "group-[1] is promoting");
    assert_eq!(
        cause(&d, &format!("/api/topom/group/promote/{{xauth}}/1/{}", pod(0))),
        "group-[1] is promoting index = 1"
    );
    proxy.restart().unwrap();
    ok(&d, &promote);
    assert_eq!(order(&d, 1), [pod(1), pod(0)]);
    assert_eq!(b.role(), "master");
    // The proxy got the group's slot pointing at the new master.
    assert!(wait(|| proxy.slots()[0].backend_addr == pod(1)));
}

#[test]
fn promote_in_progress_blocks_group_changes_until_the_promote_is_resumed() {
    let (a, b) = (RedisServer::start(), RedisServer::start());
    let d = double_for(&[&a, &b], DoubleOptions::default());
    replicated_group(&d, &[&a, &b]);
    d.promote_in_progress(1, &pod(1)).unwrap();
    assert!(d.promote_in_progress(1, &pod(0)).is_err());
    assert_eq!(cause(&d, &format!("/api/topom/group/action/create/{{xauth}}/{}", pod(1))), "group-[1] is promoting");
    assert_eq!(
        cause(&d, &format!("/api/topom/group/replica-groups/{{xauth}}/1/{}/1", pod(1))),
        "group-[1] is promoting"
    );
    ok(&d, &format!("/api/topom/group/promote/{{xauth}}/1/{}", pod(1)));
    assert_eq!(order(&d, 1), [pod(1), pod(0)]);
}

fn assign_body(owner: impl Fn(usize) -> u32, n: usize) -> String {
    let items: Vec<String> = (0..n).map(|s| format!("{{\"id\":{s},\"group_id\":{}}}", owner(s))).collect();
    format!("[{}]", items.join(","))
}

#[test]
fn draining_one_of_four_groups_never_puts_a_group_in_two_migrations() {
    let redis = RedisServer::start();
    // Four groups whose masters are four registered names for one real server: the double never moves keys.
    let overrides = (0..4).map(|i| (pod(i), redis.addr())).collect();
    let d = CodisDouble::start(DoubleOptions { overrides, tick: Duration::from_millis(2), ..DoubleOptions::default() });
    for g in 1..=4 {
        ok(&d, &format!("/api/topom/group/create/{{xauth}}/{g}"));
        ok(&d, &format!("/api/topom/group/add/{{xauth}}/{g}/{}", pod(g - 1)));
    }
    let body = assign_body(|s| u32::try_from(s / 256 + 1).unwrap(), 1024);
    assert!(d.call_with_body("PUT", "/api/topom/slots/assign/{xauth}", &body).is_ok());
    d.set_slot_error(900, "boom");
    ok(&d, "/api/topom/slots/action/create-some/{xauth}/4/1/86");
    ok(&d, "/api/topom/slots/action/create-some/{xauth}/4/2/85");
    ok(&d, "/api/topom/slots/action/create-some/{xauth}/4/3/85");
    // Every state the executor goes through is traced: per group, the slots in progress it takes part in.
    d.start_trace(|s| {
        let mut per_group: BTreeMap<u32, usize> = BTreeMap::new();
        for m in s.slots.iter().filter(|m| m.action.state.in_progress()) {
            for g in [m.group_id, m.action.target_id] {
                if g != 0 {
                    *per_group.entry(g).or_default() += 1;
                }
            }
        }
        serde_json::json!(per_group)
    });
    let mut error_seen = false;
    let done = d.wait_for(Duration::from_secs(40), |s| {
        if s.slot_action.progress.status == "[ERROR] Slot[0900]: boom" && !error_seen {
            error_seen = true;
            assert_eq!(s.slots[900].action.state, SlotState::Migrating);
        }
        if error_seen && s.slots[900].action.state == SlotState::Migrating {
            d.clear_slot_error(900);
        }
        s.with_action().is_empty()
    });
    let snap = done.expect("drain did not finish");
    let trace = d.take_trace();
    assert!(error_seen, "the injected slot error never showed");
    let mut busiest = 0;
    for (_, state) in &trace {
        for (g, n) in state.as_object().unwrap() {
            let n = n.as_u64().unwrap();
            assert!(n <= 1, "group {g} takes part in {n} migrations at once: {state}");
            busiest = busiest.max(n);
        }
    }
    assert_eq!(busiest, 1);
    assert!(trace.len() > 100, "only {} states traced", trace.len());
    assert_eq!(snap.slots_of(4), 0);
    assert_eq!((snap.slots_of(1), snap.slots_of(2), snap.slots_of(3)), (256 + 86, 256 + 85, 256 + 85));
    // Group 4 owns nothing now: its master can go, then the group.
    ok(&d, &format!("/api/topom/group/del/{{xauth}}/4/{}", pod(3)));
    ok(&d, "/api/topom/group/remove/{xauth}/4");
}

#[test]
fn a_slow_migration_can_be_watched_and_index_and_status_follow_codis() {
    let redis = RedisServer::start();
    let overrides = (0..2).map(|i| (pod(i), redis.addr())).collect();
    let d =
        CodisDouble::start(DoubleOptions { overrides, tick: Duration::from_millis(20), ..DoubleOptions::default() });
    for g in 1..=2 {
        ok(&d, &format!("/api/topom/group/create/{{xauth}}/{g}"));
        ok(&d, &format!("/api/topom/group/add/{{xauth}}/{g}/{}", pod(g - 1)));
    }
    ok(&d, "/api/topom/slots/action/disabled/{xauth}/1");
    ok(&d, "/api/topom/slots/action/create-range/{xauth}/10/12/2");
    // All into group 2, so they run one after the other and the (global) status shows one slot at a time.
    ok(&d, "/api/topom/slots/action/create/{xauth}/3/2");
    let snap = d.snapshot();
    assert_eq!(snap.slots[3].action.index, 4);
    assert_eq!(cause(&d, "/api/topom/slots/action/create/{xauth}/3/1"), "slot-[3] action already exists");
    assert_eq!(snap.slots[12].action, testbed::codis::SlotAction { index: 3, state: SlotState::Pending, target_id: 2 });
    ok(&d, "/api/topom/slots/action/remove/{xauth}/11");
    assert_eq!(cause(&d, "/api/topom/slots/action/create-range/{xauth}/10/12/2"), "slot-[10] action already exists");
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(d.snapshot().slots[10].action.state, SlotState::Pending, "disabled: nothing picked");
    d.set_migration_ticks(10, 5);
    ok(&d, "/api/topom/slots/action/disabled/{xauth}/0");
    let statuses: std::cell::RefCell<Vec<String>> = std::cell::RefCell::default();
    let done = d.wait_for(WAIT, |s| {
        let st = &s.slot_action.progress.status;
        let mut seen = statuses.borrow_mut();
        if seen.last() != Some(st) {
            seen.push(st.clone());
        }
        s.with_action().is_empty()
    });
    assert!(done.is_some());
    let seen = statuses.into_inner();
    // Five batches: the status after each of the first four counts down; the last one (0 left) completes the slot
    // without a status, as `processSlotAction` does.
    for left in (1..5).rev() {
        let expected = format!("[OK] Slot[0010]@DB[0]={left}");
        assert!(seen.contains(&expected), "{expected} not seen in {seen:?}");
    }
    assert_eq!(seen.last().map(String::as_str), Some(""), "a completed slot clears the status");
    assert_eq!(cause(&d, "/api/topom/slots/action/remove/{xauth}/10"), "slot-[10] action doesn't exist");
}

#[test]
fn rebalance_follows_the_recorded_plans() {
    let redis = RedisServer::start();
    let overrides = (0..3).map(|i| (pod(i), redis.addr())).collect();
    let d = CodisDouble::start(DoubleOptions { overrides, ..DoubleOptions::default() });
    assert_eq!(cause(&d, "/api/topom/slots/rebalance/{xauth}/0"), "no valid group could be found");
    assert_eq!(cause(&d, "/api/topom/slots/rebalance/{xauth}/yes"), "invalid confirm");
    let plan = |d: &CodisDouble| -> Vec<(String, u64)> {
        let r = put(d, "/api/topom/slots/rebalance/{xauth}/0");
        assert_eq!(r.status, 200, "{}", r.body);
        // Keep the wire order: Go sorts the keys as strings.
        let mut out = Vec::new();
        for line in r.body.lines() {
            if let Some((k, v)) = line.trim().trim_end_matches(',').split_once(": ") {
                out.push((k.trim_matches('"').to_owned(), v.parse().unwrap()));
            }
        }
        out
    };
    for g in 1..=2 {
        ok(&d, &format!("/api/topom/group/create/{{xauth}}/{g}"));
        ok(&d, &format!("/api/topom/group/add/{{xauth}}/{g}/{}", pod(g - 1)));
    }
    let two = plan(&d);
    assert_eq!(&two[..4], &[("0".into(), 1), ("1".into(), 1), ("10".into(), 1), ("100".into(), 1)]);
    assert_eq!(two.iter().find(|(k, _)| k == "1000").map(|(_, g)| *g), Some(2));
    assert_eq!(two.iter().filter(|(k, g)| *g == 1 && k.parse::<usize>().unwrap() <= 511).count(), 512);
    ok(&d, "/api/topom/group/create/{xauth}/3");
    ok(&d, &format!("/api/topom/group/add/{{xauth}}/3/{}", pod(2)));
    let three: BTreeMap<usize, u64> = plan(&d).into_iter().map(|(k, g)| (k.parse().unwrap(), g)).collect();
    for (sid, g) in &three {
        let expected = if *sid <= 341 {
            1
        } else if *sid <= 682 {
            2
        } else {
            3
        };
        assert_eq!(*g, expected, "slot {sid}");
    }
    assert!(d.snapshot().with_action().is_empty(), "confirm=0 changes nothing");
    ok(&d, "/api/topom/slots/action/disabled/{xauth}/1");
    let r = put(&d, "/api/topom/slots/rebalance/{xauth}/1");
    assert_eq!(r.status, 200);
    let snap = d.snapshot();
    assert_eq!(snap.with_action().len(), 1024);
    assert!(snap.slots.windows(2).all(|w| w[0].action.index < w[1].action.index), "pending in ascending slot order");
    assert_eq!(put(&d, "/api/topom/slots/rebalance/{xauth}/0").body, "{}", "in-flight actions count for their target");
}

#[test]
fn removal_is_refused_while_a_group_is_in_use() {
    let (a, b) = (RedisServer::start(), RedisServer::start());
    let d = double_for(&[&a, &b], DoubleOptions::default());
    ok(&d, "/api/topom/group/create/{xauth}/1");
    ok(&d, &format!("/api/topom/group/add/{{xauth}}/1/{}", pod(0)));
    ok(&d, &format!("/api/topom/group/add/{{xauth}}/1/{}", pod(1)));
    assert_eq!(cause(&d, "/api/topom/group/remove/{xauth}/1"), "group-[1] isn't empty");
    let master = format!("/api/topom/group/del/{{xauth}}/1/{}", pod(0));
    assert_eq!(cause(&d, &master), "group-[1] can't remove master, still in use");
    ok(&d, &format!("/api/topom/group/replica-groups/{{xauth}}/1/{}/1", pod(1)));
    assert!(d.call_with_body("PUT", "/api/topom/slots/assign/{xauth}", r#"[{"id":7,"group_id":1}]"#).is_ok());
    assert!(d.snapshot().group(1).unwrap().out_of_sync);
    ok(&d, "/api/topom/group/resync/{xauth}/1");
    assert!(!d.snapshot().group(1).unwrap().out_of_sync);
    // Deleting a replica-group slave sets out_of_sync; the slave is not contacted.
    ok(&d, &format!("/api/topom/group/del/{{xauth}}/1/{}", pod(1)));
    assert!(d.snapshot().group(1).unwrap().out_of_sync);
    assert_eq!(cause(&d, &master), "group-[1] can't remove master, still in use");
    assert!(d.call_with_body("PUT", "/api/topom/slots/assign/{xauth}/offline", r#"[{"id":7}]"#).is_ok());
    // A pending action targeting the group also keeps it in use.
    ok(&d, "/api/topom/slots/action/disabled/{xauth}/1");
    ok(&d, "/api/topom/slots/action/create/{xauth}/9/1");
    assert_eq!(cause(&d, &master), "group-[1] can't remove master, still in use");
    ok(&d, "/api/topom/slots/action/remove/{xauth}/9");
    ok(&d, &master);
    assert!(!d.snapshot().group(1).unwrap().out_of_sync, "an empty group is in sync");
    ok(&d, "/api/topom/group/remove/{xauth}/1");
    assert_eq!(cause(&d, "/api/topom/group/remove/{xauth}/1"), "group-[1] doesn't exist");
}

#[test]
fn faults_fail_delay_or_drop_requests_and_pause_keeps_state() {
    let d = CodisDouble::start(DoubleOptions::default());
    d.fail_next(1, Fault::Status800("etcd is down".into()));
    assert_eq!(cause(&d, "/api/topom/group/create/{xauth}/1"), "etcd is down");
    assert!(d.snapshot().groups.is_empty(), "a failed request does nothing");
    d.fail_next(1, Fault::Status500);
    assert_eq!(put(&d, "/api/topom/group/create/{xauth}/1").status, 500);
    d.fail_next(1, Fault::Drop);
    assert_eq!(put(&d, "/api/topom/group/create/{xauth}/1").status, 0);
    assert!(d.snapshot().groups.is_empty());
    d.fail_next_on("/api/topom/group/create/{xauth}/", 1, Fault::Timeout(Duration::from_millis(300)));
    assert!(d.call("GET", "/api/topom/xping/{xauth}").is_ok(), "other paths are not affected");
    let started = Instant::now();
    ok(&d, "/api/topom/group/create/{xauth}/1");
    assert!(started.elapsed() >= Duration::from_millis(300));
    let log = d.requests();
    let statuses: Vec<(String, u16)> = log.iter().map(|r| (r.path.clone(), r.status)).collect();
    assert_eq!(
        statuses,
        [
            ("/api/topom/group/create/{xauth}/1".to_owned(), 800),
            ("/api/topom/group/create/{xauth}/1".to_owned(), 500),
            ("/api/topom/group/create/{xauth}/1".to_owned(), 0),
            ("/api/topom/xping/{xauth}".to_owned(), 200),
            ("/api/topom/group/create/{xauth}/1".to_owned(), 200),
        ]
    );
    d.pause();
    assert!(d.is_paused());
    assert_eq!(d.call("GET", "/topom/model").status, 0, "connection refused while paused");
    d.resume().unwrap();
    assert_eq!(d.snapshot().groups.len(), 1);
    assert_eq!(cause(&d, "/api/topom/group/create/{xauth}/1"), "group-[1] already exists");
    // The shutdown route closes the port too; resume brings it back.
    ok(&d, "/api/topom/shutdown/{xauth}");
    assert!(wait(|| d.call("GET", "/topom/model").status == 0));
    d.resume().unwrap();
    assert_eq!(d.call("GET", "/topom/model").status, 200);
}

#[test]
fn a_dead_proxy_shows_in_stats_and_stalls_migrations_in_preparing() {
    let redis = RedisServer::start();
    let proxy = ProxyDouble::start_with(ProxyOptions {
        admin_addr: Some("proxy-0.proxy:11080".into()),
        ..ProxyOptions::new("codis-demo")
    });
    let mut overrides: BTreeMap<String, String> = (0..2).map(|i| (pod(i), redis.addr())).collect();
    overrides.insert("proxy-0.proxy:11080".into(), proxy.addr());
    let d = CodisDouble::start(DoubleOptions {
        overrides,
        stats_interval: Duration::from_millis(20),
        stats_timeout: Duration::from_millis(200),
        proxy_timeout: Duration::from_millis(200),
        ..DoubleOptions::default()
    });
    for g in 1..=2 {
        ok(&d, &format!("/api/topom/group/create/{{xauth}}/{g}"));
        ok(&d, &format!("/api/topom/group/add/{{xauth}}/{g}/{}", pod(g - 1)));
    }
    ok(&d, "/api/topom/proxy/online/{xauth}/proxy-0.proxy:11080");
    ok(&d, "/api/topom/proxy/online/{xauth}/proxy-0.proxy:11080");
    let token = proxy.token();
    let snap = d.snapshot();
    assert_eq!(snap.proxies.len(), 1, "online is idempotent");
    assert_eq!((snap.proxies[0].id, snap.proxies[0].admin_addr.as_str()), (1, "proxy-0.proxy:11080"));
    assert_eq!(
        cause(&d, "/api/topom/proxy/create/{xauth}/proxy-0.proxy:11080"),
        format!("proxy-[{token}] already exists")
    );
    assert!(d
        .wait_for(WAIT, |s| s.proxy_stats.get(&token).is_some_and(|e| e.stats.as_ref().is_some_and(|x| x.online)))
        .is_some());

    proxy.freeze();
    assert!(d.wait_for(WAIT, |s| s.proxy_stats.get(&token).is_some_and(|e| e.timeout)).is_some(), "no timeout entry");
    proxy.thaw();
    proxy.stop();
    assert!(
        d.wait_for(WAIT, |s| s.proxy_stats.get(&token).is_some_and(|e| e.error.is_some())).is_some(),
        "no error entry"
    );
    ok(&d, "/api/topom/slots/action/create/{xauth}/5/2");
    std::thread::sleep(Duration::from_millis(300));
    let snap = d.snapshot();
    assert_eq!(snap.slots[5].action.state, SlotState::Preparing, "one dead proxy stalls the slot");
    assert_eq!(snap.slot_action.progress.status, "");
    assert_eq!(
        cause(&d, &format!("/api/topom/proxy/remove/{{xauth}}/{token}/0")),
        format!("proxy-[{token}] shutdown failed")
    );
    ok(&d, &format!("/api/topom/proxy/remove/{{xauth}}/{token}/1"));
    assert!(d.wait_for(WAIT, |s| s.slots[5].group_id == 2 && s.with_action().is_empty()).is_some());
    assert_eq!(
        cause(&d, &format!("/api/topom/proxy/reinit/{{xauth}}/{token}")),
        format!("proxy-[{token}] doesn't exist")
    );
}

#[test]
fn proxy_remove_shuts_the_proxy_down_and_a_restarted_proxy_is_re_onlined() {
    let proxy = ProxyDouble::start("codis-demo");
    let d = CodisDouble::start(DoubleOptions { stats_interval: Duration::from_millis(20), ..DoubleOptions::default() });
    ok(&d, &format!("/api/topom/proxy/online/{{xauth}}/{}", proxy.addr()));
    // Held so the restarted proxy can be seen offline before the next refresh re-onlines it.
    d.hold_stats(true);
    proxy.restart().unwrap();
    assert!(!proxy.is_online());
    d.hold_stats(false);
    assert!(wait(|| proxy.is_online()), "the stats loop re-onlines a restarted proxy");
    ok(&d, &format!("/api/topom/proxy/remove/{{xauth}}/{}/0", proxy.token()));
    assert!(proxy.is_closed());
    assert!(d.snapshot().proxies.is_empty());
    let gone = ProxyDouble::start("codis-demo");
    gone.stop();
    assert_eq!(
        cause(&d, &format!("/api/topom/proxy/online/{{xauth}}/{}", gone.addr())),
        format!("proxy@{} fetch model failed", gone.addr())
    );
    let c = cause(&d, &format!("/api/topom/proxy/create/{{xauth}}/{}", gone.addr()));
    assert!(
        c.starts_with(&format!(
            "proxy@{} fetch model failed, Get \"http://{}/api/proxy/model\": dial tcp",
            gone.addr(),
            gone.addr()
        )),
        "{c}"
    );
    let other = ProxyDouble::start("another-product");
    assert_eq!(
        cause(&d, &format!("/api/topom/proxy/online/{{xauth}}/{}", other.addr())),
        format!("proxy@{} check xauth failed", other.addr())
    );
}

#[test]
fn fork_mode_shows_the_fork_fields_and_fails_over_a_killed_master() {
    let (mut a, b, c) = (RedisServer::start(), RedisServer::start(), RedisServer::start());
    let d = double_for(
        &[&a, &b, &c],
        DoubleOptions {
            fork: true,
            dead_checks: 3,
            stats_interval: Duration::from_millis(30),
            ..DoubleOptions::default()
        },
    );
    ok(&d, "/api/topom/group/create/{xauth}/1");
    for i in 0..3 {
        ok(&d, &format!("/api/topom/group/add/{{xauth}}/1/{}", pod(i)));
    }
    // With the fork, replicate by hand (its sync action leaves the server offline, see the next test).
    for s in [&b, &c] {
        let _ = s.command(&["SLAVEOF", "127.0.0.1", &a.port().to_string()]);
    }
    assert!(wait(|| [&b, &c].iter().all(|s| s.master().is_some_and(|(_, _, up)| up))));
    let healthy = d.wait_for(WAIT, |s| {
        let g = s.group(1).unwrap();
        g.servers.iter().map(|x| x.role.as_deref().unwrap_or("")).collect::<Vec<_>>() == ["master", "slave", "slave"]
            && g.servers.iter().all(|x| x.state == Some(0))
    });
    assert!(healthy.is_some(), "{:?}", d.snapshot().group(1));
    // Field order of the first server object, read from the indented text (JSON values lose order).
    let stats = d.call("GET", "/topom/stats").body;
    let lines: Vec<&str> = stats.lines().collect();
    let first = lines.iter().position(|l| l.trim_start().starts_with("\"server\":")).unwrap();
    let indent = |l: &str| l.len() - l.trim_start().len();
    let keys: Vec<&str> = lines[first..]
        .iter()
        .take_while(|l| indent(l) >= indent(lines[first]))
        .filter(|l| indent(l) == indent(lines[first]))
        .filter_map(|l| l.trim_start().strip_prefix('"')?.split('"').next())
        .collect();
    assert_eq!(
        keys,
        [
            "server",
            "datacenter",
            "action",
            "role",
            "binlog_file_num",
            "binlog_offset",
            "is_eligible_for_master_election",
            "state",
            "recall_times",
            "replica_group"
        ]
    );
    let overview = d.call("GET", "/topom").json().unwrap();
    assert_eq!(overview["config"]["max_slot_num"], 1024);
    assert!(overview["config"].get("sentinel_client_timeout").is_none());
    assert_eq!(d.call("PUT", "/api/topom/sentinels/add/{xauth}/127.0.0.1:26379").status, 404);

    a.kill();
    let failed_over = d.wait_for(WAIT, |s| s.master(1) != Some(pod(0).as_str()));
    let snap = failed_over.expect("no failover");
    let g = snap.group(1).unwrap();
    let new_master = g.servers[0].server.clone();
    let (promoted, other) = if new_master == pod(1) { (&b, &c) } else { (&c, &b) };
    assert_eq!(promoted.role(), "master");
    assert!(wait(|| other.master().is_some_and(|(_, p, _)| p == promoted.port())), "other slave not re-pointed");
    let old = g.servers.iter().find(|s| s.server == pod(0)).unwrap();
    assert_eq!(old.state, Some(2));
    // `trySwitchGroupsToNewMaster` clears it once every proxy took the switch, but each check of the dead old master
    // (now a replica in state 2) marks its group out of sync again.
    let marked = d.wait_for(WAIT, |s| s.group(1).unwrap().out_of_sync);
    assert!(marked.is_some(), "the dead old master does not keep its group out of sync");
    // The old master comes back: the forced re-attach is rejected, so it stays offline and still claims master.
    a.restart();
    std::thread::sleep(Duration::from_millis(300));
    let snap = d.snapshot();
    let old = snap.server(&pod(0)).unwrap().1;
    assert_eq!(old.state, Some(2));
    assert!(old.recall_times.unwrap_or(0) >= 1);
    assert_eq!(a.role(), "master");
}

/// The fork's sync action sends a plain `SLAVEOF h p` (`updateMasterToNewOne`), then marks the server offline
/// (state 2) however it went; its offline check re-attaches it with a forced `SLAVEOF h p -f`, which redis-server
/// (like pika) rejects, so it stays offline and its group out of sync. Seen on the real fork by the conformance
/// check (`real_pika::conformance`).
#[test]
fn fork_sync_actions_replicate_then_leave_the_server_offline_for_good() {
    let (a, b) = (RedisServer::start(), RedisServer::start());
    let d = double_for(
        &[&a, &b],
        DoubleOptions { fork: true, stats_interval: Duration::from_millis(30), ..DoubleOptions::default() },
    );
    ok(&d, "/api/topom/group/create/{xauth}/1");
    ok(&d, &format!("/api/topom/group/add/{{xauth}}/1/{}", pod(0)));
    ok(&d, &format!("/api/topom/group/add/{{xauth}}/1/{}", pod(1)));
    ok(&d, &format!("/api/topom/group/action/create/{{xauth}}/{}", pod(1)));
    let offline = d.wait_for(WAIT, |s| s.server(&pod(1)).unwrap().1.state == Some(2));
    assert!(offline.is_some(), "{:?}", d.snapshot().group(1));
    assert!(wait(|| b.master().is_some_and(|(_, p, _)| p == a.port())), "the plain SLAVEOF went through");
    std::thread::sleep(Duration::from_millis(300));
    let snap = d.snapshot();
    let (g, s) = snap.server(&pod(1)).unwrap();
    assert_eq!(s.state, Some(2), "re-attached although -f is rejected");
    assert_eq!(s.action.state, ServerActionState::Synced);
    assert!(g.out_of_sync, "each failed re-attach leaves the group out of sync");
}

#[test]
fn the_binary_serves_until_killed() {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_codis-double"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--product",
            "demo-bin",
            "--tick-ms",
            "5",
            "--overrides",
            "a:1=127.0.0.1:2,b:1=127.0.0.1:3",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
    let addr = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("unexpected {line:?}")).to_owned();
    let mut stream = std::net::TcpStream::connect(&addr).unwrap();
    std::io::Write::write_all(&mut stream, b"GET /api/topom/model HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut reply = String::new();
    std::io::Read::read_to_string(&mut stream, &mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("\"product_name\": \"demo-bin\""), "{reply}");
    child.kill().unwrap();
    child.wait().unwrap();
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_codis-double")).args(["--tick-ms", "x"]).output().unwrap();
    assert!(!bad.status.success());
}

#[test]
fn the_owner_trace_records_every_change_of_a_slots_owner_and_nothing_else() {
    let (a, b) = (RedisServer::start(), RedisServer::start());
    let d = double_for(&[&a, &b], DoubleOptions { max_slot_num: 16, ..DoubleOptions::default() });
    for gid in [1, 2] {
        ok(&d, &format!("/api/topom/group/create/{{xauth}}/{gid}"));
        ok(&d, &format!("/api/topom/group/add/{{xauth}}/{gid}/{}", pod(gid as usize - 1)));
    }
    let assign = |gid: u32| {
        let body = format!(r#"[{{"id":7,"group_id":{gid}}}]"#);
        assert!(d.call_with_body("PUT", "/api/topom/slots/assign/{xauth}", &body).is_ok());
    };
    d.start_owner_trace();
    assign(1);
    ok(&d, "/api/topom/group/create/{xauth}/3"); // no slot changes owner: nothing recorded
    assign(2);
    assign(2); // the same owner again: nothing recorded
    assign(1);
    let trace = d.take_owner_trace();
    let slot7: Vec<u32> = trace.iter().map(|(_, owners)| owners[7]).collect();
    assert_eq!(slot7, [0, 1, 2, 1], "{trace:?}");
    assert!(trace
        .iter()
        .all(|(_, owners)| owners.len() == 16 && owners.iter().enumerate().all(|(i, g)| i == 7 || *g == 0)));
    assert!(trace.windows(2).all(|w| w[0].0 <= w[1].0), "times go forward");
    // Stopped: later changes are not recorded, and a new trace starts from the current owners.
    assign(2);
    assert!(d.take_owner_trace().is_empty());
    d.start_owner_trace();
    assert_eq!(d.take_owner_trace().iter().map(|(_, o)| o[7]).collect::<Vec<_>>(), [2]);
}
