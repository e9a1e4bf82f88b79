//! The slot executor's rounds, the refusals they cause, and what a dashboard restart loses, as codis-dashboard does
//! them (pkg/topom/topom_action.go, topom_slots.go, topom_group.go, topom.go at de1ad026).

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};
use testbed::codis::SlotState;
use testbed::{CodisDouble, DoubleOptions, MigrationHold, RedisServer};

const WAIT: Duration = Duration::from_secs(30);

fn pod(n: usize) -> String {
    format!("pika-{n}.pika-headless.ns.svc:9221")
}

/// Groups 1..=n of one server each (`extra` more servers join the last group), slots 0..16 assigned 4 per group.
fn bed(n: usize, extra: usize, opts: DoubleOptions) -> (Vec<RedisServer>, CodisDouble) {
    let redis: Vec<RedisServer> = (0..n + extra).map(|_| RedisServer::start()).collect();
    let overrides: BTreeMap<String, String> = redis.iter().enumerate().map(|(i, r)| (pod(i), r.addr())).collect();
    let d = CodisDouble::start(DoubleOptions { overrides, ..opts });
    for g in 1..=n {
        ok(&d, &format!("/api/topom/group/create/{{xauth}}/{g}"));
        ok(&d, &format!("/api/topom/group/add/{{xauth}}/{g}/{}", pod(g - 1)));
    }
    for i in n..n + extra {
        ok(&d, &format!("/api/topom/group/add/{{xauth}}/{n}/{}", pod(i)));
    }
    let body: Vec<String> = (0..4 * n).map(|s| format!("{{\"id\":{s},\"group_id\":{}}}", s / 4 + 1)).collect();
    assert!(d.call_with_body("PUT", "/api/topom/slots/assign/{xauth}", &format!("[{}]", body.join(","))).is_ok());
    (redis, d)
}

fn ok(d: &CodisDouble, path: &str) {
    let r = d.call("PUT", path);
    assert!(r.is_ok(), "PUT {path}: {} {}", r.status, r.body);
}

fn cause(d: &CodisDouble, path: &str) -> String {
    let r = d.call("PUT", path);
    assert_eq!(r.status, 800, "PUT {path}: {}", r.body);
    r.cause().unwrap_or_default()
}

fn held(d: &CodisDouble, slot: usize) {
    let reached = d.wait_for(WAIT, |_| d.is_migration_held(slot)).is_some();
    let snap = d.snapshot();
    assert!(reached, "slot {slot} never reached its hold: {:?}, {:?}", snap.slots[slot], snap.slot_action);
}

#[test]
fn a_promote_is_refused_while_a_batch_is_on_the_wire_even_to_resume_and_accepted_between_batches() {
    let (redis, d) = bed(3, 1, DoubleOptions::default());
    // Written straight to the master after `group/add` scanned it: the keyspace events tell the slot index.
    for i in 0..3 {
        let _ = redis[0].command(&["SET", &format!("{{t0}}:{i}"), "v"]);
    }
    let slot = testbed::codis::slothash::slot_of(b"t0", 1024);
    let body = format!("[{{\"id\":{slot},\"group_id\":1}}]");
    assert!(d.call_with_body("PUT", "/api/topom/slots/assign/{xauth}", &body).is_ok());
    d.hold_migration(slot, MigrationHold::InBatch { after: 0 });
    ok(&d, &format!("/api/topom/slots/action/create/{{xauth}}/{slot}/2"));
    held(&d, slot);
    assert_eq!(d.snapshot().slot_action.executor, 1);
    let promote = format!("/api/topom/group/promote/{{xauth}}/3/{}", pod(3));
    assert_eq!(cause(&d, &promote), "slots-migration is running = 1");
    // A promote left half-way is refused the same way when resumed (the executor check comes after the index one).
    d.promote_in_progress(3, &pod(3)).unwrap();
    assert_eq!(cause(&d, &promote), "slots-migration is running = 1");
    assert_eq!(
        cause(&d, &format!("/api/topom/group/promote/{{xauth}}/3/{}", pod(2))),
        "group-[3] is promoting index = 1",
        "the index check comes first"
    );
    // Between two batches nothing is on the wire: the resumed promote goes through.
    d.hold_migration(slot, MigrationHold::BeforeBatch { after: 1 });
    held(&d, slot);
    let snap = d.snapshot();
    assert_eq!((snap.slot_action.executor, snap.slots[slot].action.state), (0, SlotState::Migrating));
    assert_eq!(snap.slot_action.progress.status, format!("[OK] Slot[{slot:04}]@DB[0]=3"));
    ok(&d, &promote);
    assert_eq!(d.snapshot().master(3), Some(pod(3).as_str()));
    d.release_migration(slot);
    assert!(d.wait_for(WAIT, |s| s.slots[slot].group_id == 2).is_some());
    assert_eq!(redis[1].command(&["EXISTS", "{t0}:0", "{t0}:1", "{t0}:2"]), ":3", "the keys moved");
    assert_eq!(redis[0].command(&["EXISTS", "{t0}:0", "{t0}:1", "{t0}:2"]), ":0", "and left the source");
}

/// Per group, which of the watched slots are where: `[[slot, group, state]...]`.
fn watch(slots: &'static [usize]) -> impl Fn(&testbed::Snapshot) -> Value + Send {
    move |s| {
        json!({
            "slots": slots.iter().map(|&i| json!([i, s.slots[i].group_id, s.slots[i].action.state.as_str()])).collect::<Vec<_>>(),
            "status": s.slot_action.progress.status,
        })
    }
}

fn state_of(v: &Value, i: usize) -> (u64, String) {
    let m = &v["slots"][i];
    (m[1].as_u64().unwrap_or(0), m[2].as_str().unwrap_or("").to_owned())
}

#[test]
fn a_slot_whose_group_is_promoting_holds_its_whole_round() {
    // Group 4 has a second server, so it can be left promoting.
    let (_redis, d) = bed(4, 1, DoubleOptions::default());
    d.promote_in_progress(4, &pod(4)).unwrap();
    d.start_trace(watch(&[0, 4, 1]));
    // A: 0 (1 → 2) and B: 4 (2 → 4) share no group, so one round takes both; C: 1 (1 → 2) must wait for the next.
    ok(&d, "/api/topom/slots/action/disabled/{xauth}/1");
    ok(&d, "/api/topom/slots/action/create/{xauth}/0/2");
    ok(&d, "/api/topom/slots/action/create/{xauth}/4/4");
    ok(&d, "/api/topom/slots/action/create/{xauth}/1/2");
    ok(&d, "/api/topom/slots/action/disabled/{xauth}/0");
    assert!(d.wait_for(WAIT, |s| s.slots[0].group_id == 2).is_some(), "A never moved");
    // B waits for the promote; the round waits for B; C waits for the round. Let a good many rounds' worth pass.
    std::thread::sleep(Duration::from_millis(300));
    let snap = d.snapshot();
    assert_eq!(snap.slots[4].action.state, SlotState::Migrating);
    assert_eq!(snap.slots[1].action.state, SlotState::Pending, "C started although its round-mate was held");
    // The promote finishes (nothing is on the wire: B is waiting, not migrating a batch), the round ends, C runs.
    ok(&d, &format!("/api/topom/group/promote/{{xauth}}/4/{}", pod(4)));
    assert!(d.wait_for(WAIT, |s| s.with_action().is_empty()).is_some());
    let trace = d.take_trace();
    let first = |pred: &dyn Fn(&Value) -> bool| trace.iter().position(|(_, v)| pred(v));
    let in_progress = |s: &str| ["preparing", "prepared", "migrating", "finished"].contains(&s);
    let c_started = first(&|v| in_progress(&state_of(v, 2).1)).expect("C never started");
    let b_done = first(&|v| state_of(v, 1).0 == 4).expect("B never moved");
    assert!(b_done < c_started, "C started at state {c_started}, before B was done at {b_done}");
}

#[test]
fn an_error_ends_the_round_and_the_next_round_starts_after_the_executor_slept() {
    let (_redis, d) = bed(4, 0, DoubleOptions::default());
    // A: 0 (1 → 2) fails every batch; B: 8 (3 → 4) is fine; C: 9 (3 → 4) can only start in a later round.
    d.set_slot_error(0, "ERR injected");
    d.start_trace(watch(&[0, 8, 9]));
    ok(&d, "/api/topom/slots/action/disabled/{xauth}/1");
    ok(&d, "/api/topom/slots/action/create/{xauth}/0/2");
    ok(&d, "/api/topom/slots/action/create/{xauth}/8/4");
    ok(&d, "/api/topom/slots/action/create/{xauth}/9/4");
    ok(&d, "/api/topom/slots/action/disabled/{xauth}/0");
    assert!(d.wait_for(WAIT, |s| s.slots[9].group_id == 4).is_some(), "C never moved");
    let trace = d.take_trace();
    let c_started = trace
        .iter()
        .position(|(_, v)| ["preparing", "prepared", "migrating", "finished"].contains(&state_of(v, 2).1.as_str()))
        .expect("C never started");
    // One round took A and B; A's error ended it; C came in the next round. Had slots been planned one step at a
    // time, A would have failed once per step while B walked its states.
    let errors_before_c = trace[..c_started]
        .windows(2)
        .filter(|w| w[1].1["status"] == "[ERROR] Slot[0000]: ERR injected" && w[0].1["status"] != w[1].1["status"])
        .count();
    assert_eq!(errors_before_c, 1, "{:#?}", &trace[..c_started]);
    assert_eq!(state_of(&trace[c_started].1, 0).1, "migrating", "A stays migrating");
    d.clear_slot_error(0);
    assert!(d.wait_for(WAIT, |s| s.with_action().is_empty()).is_some());
}

#[test]
fn a_restart_loses_what_codis_keeps_in_memory_and_keeps_the_model() {
    let (_redis, d) = bed(2, 0, DoubleOptions::default());
    ok(&d, "/api/topom/slots/action/interval/{xauth}/5000");
    ok(&d, "/api/topom/slots/action/disabled/{xauth}/1");
    ok(&d, "/api/topom/slots/action/create/{xauth}/0/2");
    // A slot held migrating through the restart resumes from its stored state.
    d.hold_migration(1, MigrationHold::BeforeBatch { after: 0 });
    ok(&d, "/api/topom/slots/action/create/{xauth}/1/2");
    let before = d.snapshot();
    assert!(before.slot_action.disabled);
    let token = d.call("GET", "/topom/model").json().unwrap()["token"].clone();
    d.restart().unwrap();
    let after = d.snapshot();
    assert_eq!(after.groups, before.groups, "the model is kept");
    assert_eq!(after.slots[1].action, before.slots[1].action, "slot actions are kept");
    assert!(!after.slot_action.disabled, "disabled is memory only");
    assert_eq!(after.slot_action.interval, 0, "interval is memory only");
    assert_ne!(d.call("GET", "/topom/model").json().unwrap()["token"], token, "a new process has a new token");
    // Enabled again by the restart: the pending action runs.
    assert!(d.wait_for(WAIT, |s| s.slots[0].group_id == 2).is_some());
    held(&d, 1);
    d.release_migration(1);
    assert!(d.wait_for(WAIT, |s| s.with_action().is_empty() && s.slots[1].group_id == 2).is_some());
}

#[test]
fn group_add_checks_the_server_with_slotsinfo_which_only_a_stand_in_answers() {
    let redis = RedisServer::start();
    let overrides: BTreeMap<String, String> = [(pod(0), redis.addr())].into();
    let native = CodisDouble::start(DoubleOptions {
        overrides: overrides.clone(),
        redis_stand_ins: false,
        ..DoubleOptions::default()
    });
    ok(&native, "/api/topom/group/create/{xauth}/1");
    let c = cause(&native, &format!("/api/topom/group/add/{{xauth}}/1/{}", pod(0)));
    assert!(c.starts_with("ERR unknown command 'SLOTSINFO'"), "{c}");
    let emulated = CodisDouble::start(DoubleOptions { overrides, ..DoubleOptions::default() });
    ok(&emulated, "/api/topom/group/create/{xauth}/1");
    ok(&emulated, &format!("/api/topom/group/add/{{xauth}}/1/{}", pod(0)));
    assert_eq!(DoubleOptions::default().max_slot_num, 1024, "Codis has 1024 slots");
}
