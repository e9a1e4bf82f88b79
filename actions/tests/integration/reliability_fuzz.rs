//! Fuzzing the inputs, in-process with proptest: what KubeBlocks hands over (the environment, through the event
//! templates) and what pika answers (`INFO replication`, through the decisions taken on it) must never make the binary
//! panic. A random environment — every contract variable present, absent, empty, or replaced by junk, near-misses and
//! huge values, starting from each action's golden environment — renders to a valid event or to exit 2 naming a
//! variable, never another error; a valid event survives a round trip through its document, and never carries the
//! password. The INFO parser's own proptests live beside it (`pika.rs`); here arbitrary INFO replies go on through the
//! master choice and the convergence step, and the config editor of `rejoin` stays idempotent over arbitrary config
//! files.

use crate::summary;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use pika_action::error::Error;
use pika_action::input::address::HostPort;
use pika_action::input::context::Context;
use pika_action::input::event::Event;
use pika_action::input::vars::{self, VarMap};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// The golden environments of every action and line: each a valid starting point.
fn golden() -> Vec<(String, VarMap)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let mut cases: Vec<(String, VarMap)> = std::fs::read_dir(&dir)
        .expect("golden dir")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "env"))
        .map(|p| {
            let stem = p.file_stem().expect("stem").to_string_lossy().into_owned();
            let action = stem.split('.').next().expect("action").to_owned();
            let vars = std::fs::read_to_string(&p)
                .expect("env")
                .lines()
                .filter_map(|l| l.split_once('='))
                .filter(|(k, _)| *k != vars::PIKA_PASSWORD && *k != vars::ACTION_TEMPLATES_DIR)
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
            (action, vars)
        })
        .collect();
    cases.sort();
    assert!(cases.len() >= 15, "golden environments went missing");
    cases
}

/// Values that are almost right, plainly wrong, or hostile.
fn junk() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just(" ".to_owned()),
        Just("\t\n".to_owned()),
        Just("0".to_owned()),
        Just("-1".to_owned()),
        Just("18446744073709551616".to_owned()),
        Just("true".to_owned()),
        Just("1.1".to_owned()),
        Just("1.0.2".to_owned()),
        Just("v9.9".to_owned()),
        Just(",".to_owned()),
        Just(";".to_owned()),
        Just(":".to_owned()),
        Just("=".to_owned()),
        Just("a:b:c".to_owned()),
        Just("host:9221".to_owned()),
        Just("[::1]:9221".to_owned()),
        Just("c1-pika-x7k-0.c1-pika-x7k-headless.prod.svc.cluster.local".to_owned()),
        Just("c1-pika-x7k-0.c1-pika-x7k-headless.prod.svc.cluster.local.".to_owned()),
        Just("C1-PIKA-X7K-0.C1-PIKA-X7K-HEADLESS.PROD.SVC".to_owned()),
        Just("pika-x7k:c1-pika-x7k-0.c1-pika-x7k-headless.prod.svc.cluster.local".to_owned()),
        Just(
            "pika-x7k:c1-pika-x7k-0.c1-pika-x7k-headless.prod.svc;pika-x7k:c1-pika-x7k-1.c1-pika-x7k-headless.prod.svc"
                .to_owned()
        ),
        Just("c1-pika-x7k-0.c1-pika-x7k-headless.prod.svc:9221=127.0.0.1:7000".to_owned()),
        Just("{{ 1 }}".to_owned()),
        Just("{% raw %}".to_owned()),
        Just("\"},\"action\":\"role-probe".to_owned()),
        Just("\\u0000".to_owned()),
        Just("é.svc".to_owned()),
        Just("a".repeat(300)),
        Just(format!("{}.b.c.svc", "a".repeat(64))),
        Just(format!("p:{}", vec!["a.b.c.svc"; 200].join(","))),
        "[a-z0-9.:,;=-]{0,40}",
        "\\PC{0,24}",
        any::<u32>().prop_map(|n| n.to_string()),
    ]
}

/// A change to one variable: removed, or set to a junk value.
fn change() -> impl Strategy<Value = (&'static str, Option<String>)> {
    (proptest::sample::select(vars::ALL.to_vec()), proptest::option::weighted(0.85, junk()))
        .prop_filter("the password is fuzzed separately", |(var, _)| *var != vars::PIKA_PASSWORD)
        .prop_filter("no template directory", |(var, _)| *var != vars::ACTION_TEMPLATES_DIR)
}

fn mutate(base: &VarMap, changes: &[(&'static str, Option<String>)]) -> VarMap {
    let mut env = base.clone();
    for (var, value) in changes {
        match value {
            Some(v) => env.insert((*var).to_owned(), v.clone()),
            None => env.remove(*var),
        };
    }
    env
}

/// The property: no panic; `Ok` or exit 2 naming a variable; an `Ok` event round-trips and holds no password.
fn check(action: &str, env: &VarMap, password: Option<&str>) -> Result<bool, TestCaseError> {
    let mut env = env.clone();
    if let Some(p) = password {
        env.insert(vars::PIKA_PASSWORD.to_owned(), p.to_owned());
    }
    let outcome = std::panic::catch_unwind(|| Context::from_vars(action, &env));
    let Ok(result) = outcome else {
        return Err(TestCaseError::fail(format!("{action} panicked on {env:?}")));
    };
    match result {
        Ok(ctx) => {
            let doc = serde_json::to_value(&ctx.event).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let text = doc.to_string();
            if let Some(p) = password {
                prop_assert!(!text.contains(p), "{action}: the event carries the password: {text}");
            }
            let again = Event::from_document(action, doc, "template");
            prop_assert!(again.as_ref().is_ok_and(|e| *e == ctx.event), "{action}: no round trip: {again:?}");
            Ok(true)
        }
        Err(Error::InvalidInput { var, reason }) => {
            prop_assert!(!var.is_empty() && !reason.is_empty(), "{action}: an unnamed refusal");
            prop_assert!(
                var == "template" || vars::ALL.contains(&var.as_str()),
                "{action}: refusal names {var:?}, which is no variable"
            );
            if let Some(p) = password {
                prop_assert!(!reason.contains(p), "{action}: the refusal carries the password");
            }
            Ok(false)
        }
        Err(other) => Err(TestCaseError::fail(format!("{action}: {other} is not exit 2 on {env:?}"))),
    }
}

#[test]
fn no_environment_makes_an_event_template_panic_or_fail_other_than_exit_2() {
    let cases = golden();
    let mut category =
        summary::Category::of(summary::Kind::FuzzInput, "fuzz: random environments through every event template");
    let accepted = AtomicUsize::new(0);
    for (action, base) in &cases {
        let mut runner = TestRunner::new(Config { cases: 96, failure_persistence: None, ..Config::default() });
        let strategy = (
            proptest::collection::vec(change(), 1..5),
            proptest::option::of("[A-Za-z0-9!@#%^&*()_+=-]{6,20}".prop_map(|p| format!("Zq9{p}"))),
        );
        let result = runner.run(&strategy, |(changes, password)| {
            let env = mutate(base, &changes);
            if check(action, &env, password.as_deref())? {
                accepted.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        });
        category.cases(action, 96, result.err().map(|e| e.to_string()));
    }
    // Some random environments must still be valid, or the fuzzing only ever tested the first check.
    let accepted = accepted.load(Ordering::Relaxed);
    println!("{accepted} of {} random environments were valid events", cases.len() * 96);
    category.judge("some random environments are accepted", accepted > 50, || format!("only {accepted}"));
    category.finish();
}

#[test]
fn an_environment_made_entirely_of_junk_is_exit_2_and_never_a_panic() {
    let actions: BTreeSet<String> = golden().into_iter().map(|(a, _)| a).collect();
    let mut category = summary::Category::of(summary::Kind::FuzzInput, "fuzz: environments of junk only");
    for action in &actions {
        let mut runner = TestRunner::new(Config { cases: 48, failure_persistence: None, ..Config::default() });
        let strategy = proptest::collection::btree_map(proptest::sample::select(vars::ALL.to_vec()), junk(), 0..12);
        let result = runner.run(&strategy, |vars: BTreeMap<&'static str, String>| {
            let env: VarMap = vars
                .into_iter()
                .filter(|(k, _)| *k != vars::PIKA_PASSWORD && *k != vars::ACTION_TEMPLATES_DIR)
                .map(|(k, v)| (k.to_owned(), v))
                .collect();
            check(action, &env, None).map(drop)
        });
        category.cases(action, 48, result.err().map(|e| e.to_string()));
    }
    category.finish();
}

// ---- what pika answers -----------------------------------------------------------------------------------------

/// INFO lines, valid and broken, in pika's and redis' layouts.
fn info_line() -> impl Strategy<Value = String> {
    let value = prop_oneof![
        Just(String::new()),
        any::<u64>().prop_map(|n| n.to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        Just("127.0.0.1".to_owned()),
        Just("up".to_owned()),
        Just("down".to_owned()),
        Just("master".to_owned()),
        Just("slave".to_owned()),
        Just("master&&slave".to_owned()),
        Just("true".to_owned()),
        Just("3 52428800,safety_purge=none".to_owned()),
        Just("binlog_offset=18446744073709551615 18446744073709551615".to_owned()),
        Just("ip=10.0.0.1,port=9221,conn_fd=8,lag=(db0:0)".to_owned()),
        Just("ip=127.0.0.1,port=7001,state=online,offset=50,lag=1".to_owned()),
        "\\PC{0,16}",
    ];
    let key = proptest::sample::select(vec![
        "role",
        "master_host",
        "master_port",
        "master_link_status",
        "connected_slaves",
        "slave0",
        "slave1",
        "slave_repl_offset",
        "master_repl_offset",
        "is_eligible_for_master_election",
        "db0",
        "db1",
        "ReplicationID",
        "# Replication(MASTER)",
        "# Replication(SLAVE)",
        "# Replication(Master && SLAVE)",
        "x",
    ]);
    (key, value).prop_map(|(k, v)| if k.starts_with('#') { k.to_owned() } else { format!("{k}:{v}") })
}

fn info() -> impl Strategy<Value = String> {
    proptest::collection::vec(info_line(), 0..14).prop_map(|lines| lines.join("\r\n"))
}

#[test]
fn no_info_reply_makes_the_master_choice_or_the_convergence_step_panic() {
    use pika_action::clients::codis::{Group, GroupServer};
    use pika_action::clients::pika::parse_replication;
    use pika_action::steps::transfer::{member_facts, member_step};

    let server = |o: u32| format!("c1-pika-x7k-{o}.c1-pika-x7k-headless.prod.svc.cluster.local:9221");
    let mut runner = TestRunner::new(Config { cases: 512, failure_persistence: None, ..Config::default() });
    let strategy =
        (proptest::collection::vec(proptest::option::weighted(0.8, info()), 3), 0u32..3, proptest::option::of(0u32..4));
    let result = runner.run(&strategy, |(replies, from, candidate)| {
        let group = Group {
            id: 3,
            servers: (0..3).map(|o| GroupServer { server: server(o), ..GroupServer::default() }).collect(),
            ..Group::default()
        };
        let infos: BTreeMap<String, Result<pika_action::clients::pika::Replication, String>> = replies
            .iter()
            .enumerate()
            .map(|(o, r)| {
                let o = u32::try_from(o).unwrap_or(0);
                (server(o), r.as_deref().map(parse_replication).ok_or_else(|| "connection refused".to_owned()))
            })
            .collect();
        for info in infos.values().flatten() {
            let _ = member_step(info, &HostPort::new("127.0.0.1".to_owned(), 7000));
        }
        let (current, members) =
            member_facts(&group, &server(from), &HostPort::new("127.0.0.1".to_owned(), 7000), &infos);
        let candidate = candidate.map(|c| format!("c1-pika-x7k-{c}"));
        if let Ok(choice) = pika_action::plan::choose_new_master(&current, &members, candidate.as_deref(), None) {
            prop_assert_ne!(&choice.pod, &current.pod, "the master was chosen to replace itself");
            prop_assert!(members.iter().any(|m| m.pod == choice.pod), "{} is no member", choice.pod);
            prop_assert!(
                members.iter().find(|m| m.pod == choice.pod).is_some_and(|m| m.unfit_reason().is_none()),
                "an unfit member was chosen: {choice:?} from {members:?}"
            );
        }
        Ok(())
    });
    let mut category = summary::Category::of(
        summary::Kind::ProptestCase,
        "proptest: INFO replies through master choice and convergence",
    );
    category.cases("groups of random INFO replies", 512, result.err().map(|e| e.to_string()));
    category.finish();
}

#[test]
fn rejoin_edits_any_config_file_idempotently_leaving_one_replication_line() {
    use pika_action::actions::rejoin::with_replication;

    let line = prop_oneof![
        Just("port : 9221".to_owned()),
        Just("port 7001".to_owned()),
        Just("slaveof : old:9221".to_owned()),
        Just("slaveof 127.0.0.1 7000".to_owned()),
        Just("replicaof 127.0.0.1 7000".to_owned()),
        Just("# slaveof a b".to_owned()),
        Just("  SLAVEOF : x:1".to_owned()),
        Just("slaveof:".to_owned()),
        Just("replication-id : abc".to_owned()),
        Just(String::new()),
        "\\PC{0,30}",
    ];
    let strategy = (proptest::collection::vec(line, 0..12), proptest::option::of(("[a-z0-9.-]{1,20}", 1u16..)));
    let mut runner = TestRunner::new(Config { cases: 512, failure_persistence: None, ..Config::default() });
    let result = runner.run(&strategy, |(lines, master)| {
        let text = lines.join("\n");
        let master = master.as_ref().map(|(h, p)| HostPort::new(h.clone(), *p));
        let master = master.as_ref();
        let once = with_replication(&text, master);
        prop_assert_eq!(&with_replication(&once, master), &once, "not idempotent");
        let replication: Vec<&str> = once
            .lines()
            .filter(|l| {
                let l = l.trim_start();
                let key = l.split([' ', ':', '\t']).next().unwrap_or_default().to_ascii_lowercase();
                !l.starts_with('#') && (key == "slaveof" || key == "replicaof")
            })
            .collect();
        prop_assert!(replication.len() <= 1, "several replication lines: {replication:?}");
        if let Some(master) = master {
            let (host, port) = (master.host(), master.port());
            let wanted =
                replication.len() == 1 && replication[0].contains(host) && replication[0].contains(&port.to_string());
            prop_assert!(wanted, "the replication line does not name {}:{}: {:?}", host, port, replication);
        }
        Ok(())
    });
    let mut category =
        summary::Category::of(summary::Kind::FuzzInput, "fuzz: rejoin's config editor over random config files");
    category.cases("config files", 512, result.err().map(|e| e.to_string()));
    category.finish();
}
