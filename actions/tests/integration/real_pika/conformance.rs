//! The Codis double against the fork it stands in for (issue 36): one scenario run on the fork's codis-dashboard
//! over real pikas and the fork's codis-proxy, then on the double in fork mode over other real pikas of the same
//! release and a proxy double, registered under the same names and token; every answer compared value by value with
//! `testbed::transcript` (status, shape, `Cause`, every leaf but what is run-specific: process identity,
//! timestamps, and the few values the list below names). The scenario covers what the actions meet: groups,
//! servers, sync actions, the slot table, promotes, a migration, the refusals they handle (all but a promote refused
//! while a migration batch runs, which needs a batch in flight at the moment of the call), and a proxy that died
//! registered (the promote it fails, the group left promoting, the forced removal, the promote resumed).
//!
//! The scenario waits where the fork works in the background (its health check every 10 s, a sync action, a
//! migration) until both sides reach the same settled state, then reads it. What the double is not asked to match
//! (left out here, each for its reason): the dashboard's configured timings, which the double scales down
//! ([`DoubleOptions::tick`], its stats period), and the binlog positions, which follow each run's own writes.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;
use testbed::codis::HttpReply;
use testbed::real::bed::{Line, RealBed, RealBedOptions};
use testbed::transcript::{self, Answer, Exchange, Normaliser};
use testbed::{CodisDouble, DoubleOptions, ProxyDouble, ProxyOptions};

/// One side of the comparison.
trait Dashboard {
    fn call(&self, method: &str, path: &str, body: &str) -> HttpReply;
    /// Starts a proxy and brings it online at this dashboard; where it listens (the address a dial error names).
    fn start_proxy(&self) -> String;
    /// Kills that proxy: it stays registered.
    fn kill_proxy(&self);
}

/// The fork's dashboard of the bed and the fork's codis-proxy, which comes online by itself (`--dashboard`).
struct Fork<'a> {
    bed: &'a RefCell<RealBed>,
    /// The proxy's model as its admin API gave it, once started.
    proxy_model: RefCell<Value>,
}

impl Dashboard for Fork<'_> {
    fn call(&self, method: &str, path: &str, body: &str) -> HttpReply {
        let bed = self.bed.borrow();
        bed.dashboard.call(&bed.name, method, path, body)
    }

    fn start_proxy(&self) -> String {
        let listen = self.bed.borrow_mut().add_proxy().admin_listen_addr().to_owned();
        let model = testbed::real::codis::http_get(&listen, "/api/proxy/model").expect("the proxy's model");
        *self.proxy_model.borrow_mut() = serde_json::from_str(&model).expect("a JSON model");
        listen
    }

    fn kill_proxy(&self) {
        self.bed.borrow_mut().proxies[0].kill();
    }
}

/// The double in fork mode and a proxy double standing in for the fork's proxy under its token and addresses.
struct Double {
    dashboard: CodisDouble,
    proxy_options: ProxyOptions,
    proxy: RefCell<Option<ProxyDouble>>,
}

impl Dashboard for Double {
    fn call(&self, method: &str, path: &str, body: &str) -> HttpReply {
        self.dashboard.call_with_body(method, path, body)
    }

    fn start_proxy(&self) -> String {
        let proxy = ProxyDouble::start_with(self.proxy_options.clone());
        let advertised = self.proxy_options.admin_addr.clone().expect("the fork proxy's advertised address");
        self.dashboard.set_override(&advertised, &proxy.addr());
        // What the fork's proxy does at its start (`--dashboard`): not a step of the scenario.
        let online = self.dashboard.call("PUT", &format!("/api/topom/proxy/online/{{xauth}}/{advertised}"));
        assert!(online.is_ok(), "the proxy double did not come online: {online:?}");
        let listen = proxy.addr();
        *self.proxy.borrow_mut() = Some(proxy);
        listen
    }

    fn kill_proxy(&self) {
        if let Some(proxy) = self.proxy.borrow().as_ref() {
            proxy.stop();
        }
    }
}

/// One request of the scenario and what a side answered, pod addresses put back to pod names.
#[derive(Debug, Clone)]
struct Step {
    what: String,
    method: &'static str,
    path: String,
    body: String,
    reply: HttpReply,
}

/// The pods' registered names (`A`, `B`, `C` of the scenario) and the addresses a side's pods hold, in order.
struct Side<'a> {
    label: &'static str,
    dashboard: &'a dyn Dashboard,
    names: Vec<String>,
    ips: Vec<String>,
    /// Where the side's proxy listens, once started.
    proxy: RefCell<Option<String>>,
}

impl Side<'_> {
    /// `text` with each of this side's pod addresses written `<pod-i>` (pika reports its peers by address), and
    /// its proxy's `<proxy>` (a dial error names the address dialled).
    fn neutral(&self, text: &str) -> String {
        let mut real: BTreeMap<String, String> =
            self.ips.iter().enumerate().map(|(i, ip)| (format!("<pod-{i}>"), ip.clone())).collect();
        real.extend(self.proxy.borrow().iter().map(|listen| ("<proxy>".to_owned(), listen.clone())));
        Normaliser::new(&real).apply(text)
    }

    fn send(&self, steps: &mut Vec<Step>, what: &str, method: &'static str, path: &str, body: &str) -> HttpReply {
        let reply = self.dashboard.call(method, path, body);
        let neutral = HttpReply { status: reply.status, body: self.neutral(&reply.body) };
        steps.push(Step {
            what: what.to_owned(),
            method,
            path: path.to_owned(),
            body: body.to_owned(),
            reply: neutral,
        });
        reply
    }

    /// Polls `GET /topom/stats` until `settled` holds of it (60 s at most: the fork checks servers every 10 s);
    /// that reply.
    fn settle(&self, what: &str, settled: impl Fn(&Value) -> bool) -> HttpReply {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let reply = self.dashboard.call("GET", "/topom/stats", "");
            let stats: Value = serde_json::from_str(&reply.body).unwrap_or(Value::Null);
            if settled(&stats) {
                return reply;
            }
            assert!(
                Instant::now() < deadline,
                "{}: never settled: {what}\nlast group stats: {:#}",
                self.label,
                stats["group"]
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// The group server `addr` in a stats body.
fn member<'v>(stats: &'v Value, addr: &str) -> Option<&'v Value> {
    stats["group"]["models"]
        .as_array()?
        .iter()
        .flat_map(|g| g["servers"].as_array().into_iter().flatten())
        .find(|s| s["server"] == addr)
}

/// The INFO map the dashboard last read from `addr`.
fn info<'v>(stats: &'v Value, addr: &str) -> &'v Value {
    &stats["group"]["stats"][addr]["stats"]
}

/// A side's run of the scenario: what it answered, step by step.
struct Run<'s> {
    side: &'s Side<'s>,
    steps: Vec<Step>,
}

impl Run<'_> {
    fn send(&mut self, what: &str, method: &'static str, path: &str) {
        self.send_body(what, method, path, "");
    }

    fn send_body(&mut self, what: &str, method: &'static str, path: &str, body: &str) {
        self.side.send(&mut self.steps, what, method, path, body);
    }

    /// `GET /topom/stats` once `settled` holds of it, that very reply recorded: nothing the background checks do
    /// between the wait and the read.
    fn settled(&mut self, what: &str, settled: impl Fn(&Value) -> bool) {
        let reply = self.side.settle(what, settled);
        let reply = HttpReply { status: reply.status, body: self.side.neutral(&reply.body) };
        let (method, path) = ("GET", "/topom/stats".to_owned());
        self.steps.push(Step { what: what.to_owned(), method, path, body: String::new(), reply });
    }
}

/// The scenario: groups, servers, a sync action, refusals, slots, a promote and a migration.
fn scenario(side: &Side) -> Vec<Step> {
    let mut run = Run { side, steps: Vec::new() };
    let [a, b, c] = [&side.names[0], &side.names[1], &side.names[2]];
    run.send("the model", "GET", "/topom/model");
    run.send("xping", "GET", "/api/topom/xping/{xauth}");
    run.send("a wrong xauth", "GET", "/api/topom/xping/0123456789abcdef0123456789abcdef");
    run.send("no sentinels API", "PUT", &format!("/api/topom/sentinels/add/{{xauth}}/{a}"));
    run.send("group 1", "PUT", "/api/topom/group/create/{xauth}/1");
    run.send("group 1 again", "PUT", "/api/topom/group/create/{xauth}/1");
    run.send("group 0", "PUT", "/api/topom/group/create/{xauth}/0");
    run.send("A into 1", "PUT", &format!("/api/topom/group/add/{{xauth}}/1/{a}"));
    run.send("A into 1 again", "PUT", &format!("/api/topom/group/add/{{xauth}}/1/{a}"));
    run.send("B into a group not there", "PUT", &format!("/api/topom/group/add/{{xauth}}/2/{b}"));
    run.send("B into 1", "PUT", &format!("/api/topom/group/add/{{xauth}}/1/{b}"));
    run.settled("two masters in group 1", |s| {
        [a, b].iter().all(|x| member(s, x).is_some_and(|m| m["role"] == "master"))
    });
    run.send("promote the master", "PUT", &format!("/api/topom/group/promote/{{xauth}}/1/{a}"));
    run.send("promote a server of no group", "PUT", &format!("/api/topom/group/promote/{{xauth}}/1/{c}"));
    run.send("sync B to A", "PUT", &format!("/api/topom/group/action/create/{{xauth}}/{b}"));
    // Synced, linked, and its first re-attach tried (the fork's offline check, every 2 s: the group out of sync).
    run.settled("B synced to A", |s| {
        member(s, b).is_some_and(|m| m["action"]["state"] == "synced" && m["state"] == 2)
            && info(s, b)["master_link_status"] == "up"
            && s["group"]["models"][0]["out_of_sync"] == true
    });
    run.send("remove the master before its replica", "PUT", &format!("/api/topom/group/del/{{xauth}}/1/{a}"));
    // A server whose sync action completed stays offline for the fork (state 2: its re-attach sends a `SLAVEOF -f`
    // pika refuses, and a master in state 2 is failed over at its first missed check): removed and added again, it
    // is a normal server at the next check.
    run.send("B out of group 1", "PUT", &format!("/api/topom/group/del/{{xauth}}/1/{b}"));
    run.send("B into 1 again", "PUT", &format!("/api/topom/group/add/{{xauth}}/1/{b}"));
    run.settled("B back in group 1", |s| member(s, b).is_some_and(|m| m["state"] == 0 && m["role"] == "slave"));
    run.send("group 2", "PUT", "/api/topom/group/create/{xauth}/2");
    run.send("C into 2", "PUT", &format!("/api/topom/group/add/{{xauth}}/2/{c}"));
    run.send("the rebalance plan", "PUT", "/api/topom/slots/rebalance/{xauth}/0");
    let assign = r#"[{"id":0,"group_id":1},{"id":1,"group_id":1},{"id":2,"group_id":2}]"#;
    run.send_body("slots 0-2 assigned", "PUT", "/api/topom/slots/assign/{xauth}", assign);
    run.send("the slots", "GET", "/topom/slots");
    run.send("remove group 2 with a slot", "PUT", "/api/topom/group/remove/{xauth}/2");
    run.send("promote B", "PUT", &format!("/api/topom/group/promote/{{xauth}}/1/{b}"));
    // pika lets the old master go of a replica made a master only at that replica's next replication cron (3 s):
    // until then A still lists B, on either side.
    let released = |s: &Value| info(s, a)["connected_slaves"] == "0";
    run.settled("after the promote", |s| {
        s["group"]["models"][0]["servers"][0]["server"] == b.as_str()
            && s["group"]["models"][0]["promoting"].as_object().is_some_and(serde_json::Map::is_empty)
            && member(s, b).is_some_and(|m| m["role"] == "master")
            && member(s, c).is_some_and(|m| m["role"] != "")
            && released(s)
    });
    run.send("slot 0 to group 2", "PUT", "/api/topom/slots/action/create/{xauth}/0/2");
    let moved = |s: &Value| {
        let read = |x: &String| member(s, x).is_some_and(|m| m["role"] != "") && info(s, x)["role"].is_string();
        s["slots"][0]["group_id"] == 2
            && s["slots"][0]["action"].as_object().is_some_and(serde_json::Map::is_empty)
            && [a, b, c].into_iter().all(read)
            && released(s)
    };
    side.settle("slot 0 moved, every server checked and read", moved);
    run.send("slots after the migration", "GET", "/topom/slots");
    run.settled("after the migration", moved);
    refusals(&mut run, a);
    a_dead_proxy(&mut run, a, b);
    run.steps
}

/// What the actions meet when a call is refused: slot actions (held pending while the executor is paused), sync
/// actions, promotes, groups, proxies, each refusal's `Cause` as the fork words it, then the slot table carrying a
/// pending action.
fn refusals(run: &mut Run, a: &str) {
    let create = |sid: &str, gid: &str| format!("/api/topom/slots/action/create/{{xauth}}/{sid}/{gid}");
    run.send("slot actions paused", "PUT", "/api/topom/slots/action/disabled/{xauth}/1");
    run.send("slot 1 to group 2, held pending", "PUT", &create("1", "2"));
    run.send("slot 1 again", "PUT", &create("1", "2"));
    run.send("slot 0 onto its own group", "PUT", &create("0", "2"));
    run.send("a range over the pending slot", "PUT", "/api/topom/slots/action/create-range/{xauth}/1/3/2");
    run.send("a range backwards", "PUT", "/api/topom/slots/action/create-range/{xauth}/3/1/2");
    run.send("a slot past the last", "PUT", &create("1024", "2"));
    run.send("group 3, empty", "PUT", "/api/topom/group/create/{xauth}/3");
    run.send("slot 3 onto an empty group", "PUT", &create("3", "3"));
    run.send("slot 3 onto a group not there", "PUT", &create("3", "42"));
    let assign = r#"[{"id":1,"group_id":2}]"#;
    run.send_body("assign the slot with an action", "PUT", "/api/topom/slots/assign/{xauth}", assign);
    run.send("the rebalance plan with an action pending", "PUT", "/api/topom/slots/rebalance/{xauth}/0");
    run.send("the slots with a pending action", "GET", "/topom/slots");
    run.send("slot 1's action removed", "PUT", "/api/topom/slots/action/remove/{xauth}/1");
    run.send("slot 1's action removed again", "PUT", "/api/topom/slots/action/remove/{xauth}/1");
    run.send("slot actions resumed", "PUT", "/api/topom/slots/action/disabled/{xauth}/0");
    run.send("group 3 removed", "PUT", "/api/topom/group/remove/{xauth}/3");
    run.send("group 3 removed again", "PUT", "/api/topom/group/remove/{xauth}/3");
    run.send("sync a server of no group", "PUT", "/api/topom/group/action/create/{xauth}/nowhere:9221");
    run.send("promote in a group not there", "PUT", &format!("/api/topom/group/promote/{{xauth}}/42/{a}"));
    run.send("A into a second group", "PUT", &format!("/api/topom/group/add/{{xauth}}/2/{a}"));
    run.send("a group id that is no number", "PUT", "/api/topom/group/create/{xauth}/abc");
    run.send("an unknown log level", "PUT", "/api/topom/loglevel/{xauth}/NOPE");
    let token = "0123456789abcdef0123456789abcdef";
    run.send("reinit a proxy not there", "PUT", &format!("/api/topom/proxy/reinit/{{xauth}}/{token}"));
    run.send("remove a proxy not there", "PUT", &format!("/api/topom/proxy/remove/{{xauth}}/{token}/0"));
    run.send("online a proxy nobody runs", "PUT", "/api/topom/proxy/online/{xauth}/127.0.0.1:1");
    run.send("create a proxy nobody runs", "PUT", "/api/topom/proxy/create/{xauth}/127.0.0.1:1");
}

/// A proxy that died registered: every promote and slot change must reach every proxy, so the promote fails and
/// the group stays promoting (refusing other changes of it) until the proxy is removed by force; then the promote
/// resumes. The dashboard's stats name the dead proxy's error.
fn a_dead_proxy(run: &mut Run, a: &str, b: &str) {
    // A promote pushes the group's slots to the proxies: group 1 needs one (slot 1 went to group 2 above).
    let assign = r#"[{"id":3,"group_id":1}]"#;
    run.send_body("slot 3 to group 1", "PUT", "/api/topom/slots/assign/{xauth}", assign);
    let listen = run.side.dashboard.start_proxy();
    *run.side.proxy.borrow_mut() = Some(listen);
    let token = |s: &Value| s["proxy"]["models"][0]["token"].as_str().map(str::to_owned);
    // Online, and past its first usage sample (the fork's proxy measures its CPU over its first second before its
    // stats carry `rusage.raw`).
    run.settled("a proxy online", |s| {
        token(s).is_some_and(|t| {
            let stats = &s["proxy"]["stats"][&t]["stats"];
            stats["online"] == true && stats["rusage"]["raw"].is_object()
        })
    });
    run.side.dashboard.kill_proxy();
    run.settled("the proxy dead", |s| token(s).is_some_and(|t| s["proxy"]["stats"][&t]["error"].is_object()));
    let promote = |x: &str| format!("/api/topom/group/promote/{{xauth}}/1/{x}");
    run.send("promote A past a dead proxy", "PUT", &promote(a));
    run.send("promote B while A's promote is stuck", "PUT", &promote(b));
    run.send("A out of the promoting group", "PUT", &format!("/api/topom/group/del/{{xauth}}/1/{a}"));
    run.send("sync A in the promoting group", "PUT", &format!("/api/topom/group/action/create/{{xauth}}/{a}"));
    run.send("the slots while promoting", "GET", "/topom/slots");
    let dead = run.side.dashboard.call("GET", "/topom/stats", "");
    let dead: Value = serde_json::from_str(&dead.body).expect("stats");
    let dead = token(&dead).expect("the dead proxy's token");
    let remove = |force: u8| format!("/api/topom/proxy/remove/{{xauth}}/{dead}/{force}");
    run.send("remove the dead proxy", "PUT", &remove(0));
    run.send("remove the dead proxy by force", "PUT", &remove(1));
    run.send("promote A again", "PUT", &promote(a));
    run.settled("after the resumed promote", |s| {
        s["group"]["models"][0]["servers"][0]["server"] == a
            && s["group"]["models"][0]["promoting"].as_object().is_some_and(serde_json::Map::is_empty)
            && member(s, a).is_some_and(|m| m["role"] == "master")
            && s["proxy"]["models"].as_array().is_some_and(Vec::is_empty)
    });
}

/// A JSON body's `Content-Type` (the header itself is compared by the recordings' replay, not here).
fn json_type(body: &str) -> BTreeMap<String, String> {
    let json = serde_json::from_str::<Value>(body).is_ok();
    json.then(|| ("Content-Type".to_owned(), "application/json; charset=utf-8".to_owned())).into_iter().collect()
}

/// The steps' differences: the fork's answer taken as the recording, the double's as the answer.
fn differences(fork: &[Step], double: &[Step]) -> Vec<String> {
    let mut out = Vec::new();
    assert_eq!(fork.len(), double.len(), "the sides ran different scenarios");
    for (f, d) in fork.iter().zip(double) {
        let recorded = Exchange {
            id: f.what.clone(),
            title: f.what.clone(),
            service: "dashboard".into(),
            method: f.method.into(),
            path: f.path.clone(),
            request_body: (!f.body.is_empty()).then(|| f.body.clone()),
            kind: String::new(),
            status: f.reply.status,
            response_headers: json_type(&f.reply.body),
            response_body: f.reply.body.clone(),
            exchanges: Vec::new(),
        };
        let content_type = json_type(&d.reply.body).remove("Content-Type");
        let answer = Answer { status: d.reply.status, content_type, body: d.reply.body.clone() };
        let mut found = transcript::compare(&recorded, &answer);
        found.extend(transcript::compare_values(&recorded, &answer, &Normaliser::default()).mismatches);
        out.extend(found.into_iter().map(|m| format!("{} ({} {}): {m}", f.what, f.method, f.path)));
    }
    out
}

#[test]
fn the_double_answers_a_scenario_as_the_forks_dashboard_over_real_pikas() {
    let bed = RealBed::start(
        &RealBedOptions { shards: 2, pods: 3, line: Line::V1_1, proxies: 0, ..RealBedOptions::default() },
        std::path::Path::new(env!("CARGO_BIN_EXE_pika-action")),
    );
    let names: Vec<String> = bed.shards[0].pods.iter().map(|p| p.server()).collect();
    let ips = |shard: usize| bed.shards[shard].pods.iter().map(|p| p.net.addr.to_string()).collect::<Vec<_>>();
    let (fork_ips, double_ips) = (ips(0), ips(1));
    let overrides: BTreeMap<String, String> =
        names.iter().zip(&bed.shards[1].pods).map(|(name, pod)| (name.clone(), pod.addr())).collect();
    let (product, password) = (bed.name.clone(), bed.password.clone());
    let bed = RefCell::new(bed);

    let fork_dashboard = Fork { bed: &bed, proxy_model: Value::Null.into() };
    let fork_side =
        Side { label: "fork", dashboard: &fork_dashboard, names: names.clone(), ips: fork_ips, proxy: None.into() };
    let fork = scenario(&fork_side);

    // The proxy double takes the fork's proxy's token and addresses, as the pods' names are shared.
    let proxy_model = fork_dashboard.proxy_model.take();
    let double = Double {
        dashboard: CodisDouble::start(DoubleOptions {
            product: product.clone(),
            password: Some(password.clone()),
            fork: true,
            redis_stand_ins: false,
            overrides: overrides.clone(),
            // The fork's races with its own checks (one overwrites a running sync action as synced) are the
            // fork's; checks less frequent than the default 100 ms keep them as rare here as on the fork (10 s).
            server_check_interval: Duration::from_secs(2),
            ..DoubleOptions::default()
        }),
        proxy_options: ProxyOptions {
            auth: password,
            token: proxy_model["token"].as_str().map(str::to_owned),
            admin_addr: proxy_model["admin_addr"].as_str().map(str::to_owned),
            proxy_addr: proxy_model["proxy_addr"].as_str().unwrap_or_default().to_owned(),
            fork: true,
            overrides,
            // The chart's proxy.toml.
            primary_only: true,
            redis_stand_ins: false,
            ..ProxyOptions::new(&product)
        },
        proxy: None.into(),
    };
    let double_side = Side { label: "double", dashboard: &double, names, ips: double_ips, proxy: None.into() };
    let answered = scenario(&double_side);
    let found = differences(&fork, &answered);
    assert!(found.is_empty(), "{} differences:\n{}", found.len(), found.join("\n"));
}
