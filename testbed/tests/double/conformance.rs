//! Replays both recordings of Codis 3.2 (`shared/codis-transcripts`: 001–054, and `second-recording`: 055–122)
//! against the dashboard double and the proxy double, each from its own start state, and checks every answer's
//! status, shape, `Cause` and values ([`testbed::transcript`]), and the two recorded sequences as orderings.
//!
//! Each recording ran one scenario on 127.0.0.1 (dashboard 18080, proxy admin 11080, codis-servers 6379…). The same
//! addresses are registered here and the override maps send them to real redis-servers and a proxy double with the
//! recorded token; unmapped addresses (6999, 11081) really refuse connections. Where the recording did something
//! between two recorded exchanges (setup calls, waits, a killed server), [`Bed::before`] does the same, as the
//! recordings' scenario notes and the recorded bodies tell. Where a recording caught an instant of a migration or a
//! promote (a slot migrating before its first batch, between two batches, with a batch on the wire; stats taken before
//! the next refresh), the replay holds the double at that instant instead of racing for it.
//!
//! The last test plants four defects in the double, one at a time, and shows the replay reports each at the
//! exchanges that reveal it.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testbed::codis::slothash::slot_of;
use testbed::codis::{Mutation, ServerActionState};
use testbed::transcript::{self, Answer, Exchange, Normaliser, OrderReport};
use testbed::{CodisDouble, DoubleOptions, Ledger, MigrationHold, ProxyDouble, ProxyOptions, RedisServer, Snapshot};

const FIRST: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/codis-transcripts");
const SECOND: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/codis-transcripts/second-recording");
const WAIT: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Recording {
    First,
    Second,
}

impl Recording {
    fn dir(self) -> &'static str {
        match self {
            Self::First => FIRST,
            Self::Second => SECOND,
        }
    }

    fn proxy_token(self) -> &'static str {
        match self {
            Self::First => "2c97b44860344b5271fe1ef5d4849c55",
            Self::Second => "63454aa4abe96e1d394cb234974834e3",
        }
    }

    fn ports(self) -> std::ops::RangeInclusive<u16> {
        match self {
            Self::First => 6379..=6381,
            Self::Second => 6379..=6385,
        }
    }
}

fn load(rec: Recording) -> Vec<Exchange> {
    let dir = Path::new(rec.dir());
    let all = transcript::load_dir(dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
    assert!(all.len() >= 50, "expected the recorded transcripts in {}, found {}", dir.display(), all.len());
    all
}

fn server(port: u16) -> String {
    format!("127.0.0.1:{port}")
}

/// The exchange's verdict.
#[derive(Clone, Debug)]
enum Verdict {
    Ok,
    Mismatch(Vec<String>),
    Skipped(String),
}

#[derive(Clone, Debug)]
struct Row {
    id: String,
    verdict: Verdict,
    /// Values compared (leaves of a body, or samples of a sequence).
    values: usize,
}

struct Bed {
    rec: Recording,
    rt: tokio::runtime::Runtime,
    http: reqwest::Client,
    double: CodisDouble,
    proxy: ProxyDouble,
    redis: Mutex<BTreeMap<u16, RedisServer>>,
    norm: Normaliser,
}

impl Bed {
    fn start(rec: Recording, mutation: Option<Mutation>) -> Self {
        let redis: BTreeMap<u16, RedisServer> = rec.ports().map(|p| (p, RedisServer::start())).collect();
        let backends: BTreeMap<String, String> = redis.iter().map(|(p, r)| (server(*p), r.addr())).collect();
        let proxy = ProxyDouble::start_with(ProxyOptions {
            token: Some(rec.proxy_token().into()),
            admin_addr: Some("127.0.0.1:11080".into()),
            overrides: backends.clone(),
            ..ProxyOptions::new("codis-demo")
        });
        let mut overrides = backends;
        overrides.insert("127.0.0.1:11080".into(), proxy.addr());
        let double = CodisDouble::start(DoubleOptions {
            product: "codis-demo".into(),
            overrides: overrides.clone(),
            // Codis's 1 s is 1 ms here.
            tick: Duration::from_millis(1),
            stats_interval: Duration::from_millis(50),
            mutation,
            ..DoubleOptions::default()
        });
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let http = reqwest::Client::builder().no_proxy().redirect(reqwest::redirect::Policy::none()).build().unwrap();
        Self { rec, rt, http, double, proxy, redis: Mutex::new(redis), norm: Normaliser::new(&overrides) }
    }

    fn send(&self, base: &str, method: &str, path: &str, body: Option<&str>) -> Answer {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut req = self.http.request(method, format!("http://{base}{path}"));
        if let Some(b) = body {
            req = req.header("Content-Type", "application/json").body(b.to_owned());
        }
        self.rt.block_on(async {
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            let content_type = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).map(str::to_owned);
            Answer { status, content_type, body: resp.text().await.unwrap() }
        })
    }

    fn replay(&self, ex: &Exchange) -> Answer {
        let base = if ex.service == "proxy-admin" { self.proxy.addr() } else { self.double.addr() };
        self.send(&base, &ex.method, &ex.path, ex.request_body.as_deref())
    }

    /// An unrecorded call the recording made: must succeed.
    fn put(&self, path: &str) -> Result<(), String> {
        let reply = self.double.call("PUT", path);
        if reply.status == 200 {
            Ok(())
        } else {
            Err(format!("setup call {path} answered {}: {}", reply.status, reply.body))
        }
    }

    fn until(&self, what: &str, ready: impl FnMut(&Snapshot) -> bool) -> Result<(), String> {
        self.double.wait_for(WAIT, ready).map(|_| ()).ok_or_else(|| format!("never {what}"))
    }

    fn sync_action(&self, port: u16) -> Result<(), String> {
        let addr = server(port);
        self.put(&format!("/api/topom/group/action/create/{{xauth}}/{addr}"))?;
        self.until(&format!("{addr} synced"), |s| {
            s.server(&addr).is_some_and(|(_, x)| x.action.state == ServerActionState::Synced)
        })
    }

    /// Waits for a stats refresh that started now, then until `check` holds for every server's entry.
    fn fresh_stats(&self, what: &str, check: impl Fn(&Snapshot) -> bool) -> Result<(), String> {
        if !self.double.wait_stats_refresh(WAIT) {
            return Err("no stats refresh".into());
        }
        self.until(what, |s| {
            let servers: Vec<&str> =
                s.groups.iter().flat_map(|g| g.servers.iter().map(|x| x.server.as_str())).collect();
            servers.iter().all(|a| s.server_stats.contains_key(*a))
                && s.proxies.iter().all(|p| s.proxy_stats.contains_key(&p.token))
                && check(s)
        })
    }

    fn write_into(&self, slot: usize, n: usize, tag: &str) -> Result<(), String> {
        let keys = keys_in(slot, n, tag);
        let ledger = Ledger::write_keys(&self.proxy.data_addr(), &keys).map_err(|e| e.to_string())?;
        if ledger.acked.len() == n {
            Ok(())
        } else {
            Err(format!("writing into slot {slot} through the proxy: {:?}", ledger.errors))
        }
    }

    fn info_of(s: &Snapshot, port: u16, key: &str) -> Option<String> {
        s.server_stats.get(&server(port)).and_then(|e| e.stats.as_ref()).and_then(|m| m.get(key).cloned())
    }

    /// What the recording did (or waited for) right before exchange `id`.
    fn before(&self, id: &str) -> Result<(), String> {
        match (self.rec, id) {
            (Recording::First, "018") => {
                self.until("6381 synced", |s| {
                    s.server(&server(6381)).is_some_and(|(_, x)| x.action.state == ServerActionState::Synced)
                })?;
                self.fresh_stats("6381 replicating 6379", |s| {
                    Self::info_of(s, 6381, "master_link_status").as_deref() == Some("up")
                })
            }
            // Not in the transcript: between the preview (028) and 029 the recording confirmed the rebalance and
            // let it run to completion (029 shows every slot assigned).
            (Recording::First, "029") => {
                self.put("/api/topom/slots/rebalance/{xauth}/1")?;
                self.until("rebalanced", |s| s.with_action().is_empty())
            }
            (Recording::First, "033") => self
                .fresh_stats("slave0 on 6379", |s| Self::info_of(s, 6379, "connected_slaves").as_deref() == Some("1")),
            // The recording wrote keys through the proxy before the drain (038 shows db0 everywhere).
            (Recording::First, "036") => {
                let ledger = Ledger::preload(&self.proxy.data_addr(), "rec1", 2000).map_err(|e| e.to_string())?;
                if ledger.acked.len() != 2000 {
                    return Err(format!("writes through the proxy failed: {:?}", ledger.errors));
                }
                self.fresh_stats("db0 on every server", |s| (6379..=6381).all(|p| Self::info_of(s, p, "db0").is_some()))
            }
            // 038/039 caught the drain with 512-516 moved and 517 migrating before its first batch.
            (Recording::First, "037") => {
                self.double.hold_migration(517, MigrationHold::BeforeBatch { after: 0 });
                Ok(())
            }
            (Recording::First, "038") => self.held(517),
            // 039 was taken a little later: 518-523 moved, 524 migrating before its first batch.
            (Recording::First, "039") => {
                self.double.hold_migration(524, MigrationHold::BeforeBatch { after: 0 });
                self.double.release_migration(517);
                self.held(524)
            }
            (Recording::First, "040") => {
                self.double.release_migration(524);
                self.until("group 2 drained", |s| s.slots_of(2) == 0 && s.with_action().is_empty())
            }
            (Recording::First, "044") => self.fresh_stats("group 2 gone", |_| true),

            (Recording::Second, "055") => {
                self.setup_second()?;
                // 056 caught the rebalance with its first slot migrating before its first batch.
                self.double.hold_migration(342, MigrationHold::BeforeBatch { after: 0 });
                Ok(())
            }
            (Recording::Second, "056") => self.held(342),
            (Recording::Second, "057") => {
                self.double.release_migration(342);
                self.until("rebalanced", |s| s.with_action().is_empty())?;
                self.put("/api/topom/slots/action/disabled/{xauth}/1")
            }
            (Recording::Second, "059") => self.fresh_stats("stats after the rebalance", |_| true),
            (Recording::Second, "065") => self.put("/api/topom/group/create/{xauth}/4"),
            (Recording::Second, "069") => {
                // 075 shows slots 10-15 still in group 1: their pending actions were removed; then slot 100 got
                // its keys and a migration throttled with interval = 1 s, caught between two batches (070).
                for sid in 10..=15 {
                    self.put(&format!("/api/topom/slots/action/remove/{{xauth}}/{sid}"))?;
                }
                self.put("/api/topom/slots/action/disabled/{xauth}/0")?;
                self.write_into(100, 1500, "big")?;
                self.put("/api/topom/slots/action/interval/{xauth}/1000000")?;
                self.double.hold_migration(100, MigrationHold::BeforeBatch { after: 1 });
                self.put("/api/topom/slots/action/create/{xauth}/100/2")?;
                self.held(100)
            }
            (Recording::Second, "070") => self.fresh_stats("stats between two batches", |_| true),
            (Recording::Second, "072") => {
                // Interval 0 and a batch on the wire (executor 1).
                self.put("/api/topom/slots/action/interval/{xauth}/0")?;
                self.double.hold_migration(100, MigrationHold::InBatch { after: 1 });
                self.until("a batch of slot 100 on the wire", |s| s.slot_action.executor == 1)?;
                self.held(100)
            }
            (Recording::Second, "073") => {
                self.double.release_migration(100);
                self.until("slot 100 moved", |s| s.slots[100].group_id == 2 && s.with_action().is_empty())?;
                // 075 shows slots 200-202 in group 3: an unrecorded migration before the recorded one.
                self.write_into(200, 300, "mid")?;
                self.put("/api/topom/slots/action/create-range/{xauth}/200/202/3")?;
                self.until("200-202 moved", |s| s.with_action().is_empty())?;
                // The sequence's data: slot 300 takes several batches of 500 keys, 301/302 one each.
                self.write_into(300, 3521, "seq")?;
                self.write_into(301, 21, "seq")?;
                self.write_into(302, 19, "seq")?;
                self.put("/api/topom/slots/action/interval/{xauth}/100000")
            }
            (Recording::Second, "074") => {
                self.put("/api/topom/slots/action/interval/{xauth}/0")?;
                // 075 shows the INFO taken before the promote: no refresh in between.
                self.fresh_stats("stats before the promote", |_| true)?;
                self.double.hold_stats(true);
                Ok(())
            }
            (Recording::Second, "076") => {
                self.double.hold_stats(false);
                Ok(())
            }
            (Recording::Second, "079") => {
                // A pending sync action the executor has not run yet (the recording was inside its 1 s sleep).
                self.double.hold_sync_actions(true);
                self.put(&format!("/api/topom/group/action/create/{{xauth}}/{}", server(6379)))
            }
            (Recording::Second, "081") => {
                self.double.hold_sync_actions(false);
                self.sync_action(6379)
            }
            (Recording::Second, "085") => {
                self.sync_action(6380)?;
                self.redis.lock().unwrap().get_mut(&6381).ok_or("no 6381")?.kill();
                self.fresh_stats("6381 refused, 6382's link down", |s| {
                    s.server_stats
                        .get(&server(6381))
                        .and_then(|e| e.error.as_ref())
                        .is_some_and(|e| e.cause.starts_with("dial tcp"))
                        && Self::info_of(s, 6382, "master_link_status").as_deref() == Some("down")
                        && Self::info_of(s, 6379, "connected_slaves").as_deref() == Some("1")
                })
            }
            (Recording::Second, "088") => {
                self.fresh_stats("6382 a master", |s| Self::info_of(s, 6382, "role").as_deref() == Some("master"))
            }
            (Recording::Second, "090") => {
                self.sync_action(6383)?;
                self.proxy.stop();
                let token = self.rec.proxy_token();
                self.fresh_stats("the proxy refusing, 6383 replicating", |s| {
                    s.proxy_stats.get(token).is_some_and(|e| e.error.is_some())
                        && Self::info_of(s, 6383, "master_link_status").as_deref() == Some("up")
                        && Self::info_of(s, 6384, "connected_slaves").as_deref() == Some("1")
                })
            }
            (Recording::Second, "091") => {
                // 092 and 101 show stats taken before the promotes changed anything: no refresh meanwhile.
                self.double.hold_stats(true);
                Ok(())
            }
            (Recording::Second, "102") => {
                self.double.hold_stats(false);
                self.proxy.restart().map_err(|e| e.to_string())
            }
            _ => Ok(()),
        }
    }

    fn held(&self, slot: usize) -> Result<(), String> {
        let deadline = Instant::now() + WAIT;
        while !self.double.is_migration_held(slot) {
            if Instant::now() > deadline {
                return Err(format!("slot {slot} never reached its hold"));
            }
            if self.double.snapshot().slots[slot].action.state.is_nothing() && !self.double.is_migration_held(slot) {
                return Err(format!("slot {slot} has no migration to hold"));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    }

    /// The second recording's start state: groups 1–3 of two synced servers each, the proxy online,
    /// every slot in group 1 and resynced, keys written through the proxy.
    fn setup_second(&self) -> Result<(), String> {
        for (g, (m, r)) in [(1, (6379, 6380)), (2, (6381, 6382)), (3, (6383, 6384))] {
            self.put(&format!("/api/topom/group/create/{{xauth}}/{g}"))?;
            self.put(&format!("/api/topom/group/add/{{xauth}}/{g}/{}", server(m)))?;
            self.put(&format!("/api/topom/group/add/{{xauth}}/{g}/{}", server(r)))?;
            self.sync_action(r)?;
        }
        self.put("/api/topom/proxy/online/{xauth}/127.0.0.1:11080")?;
        let body: Vec<String> = (0..1024).map(|s| format!("{{\"id\":{s},\"group_id\":1}}")).collect();
        let reply =
            self.double.call_with_body("PUT", "/api/topom/slots/assign/{xauth}", &format!("[{}]", body.join(",")));
        if !reply.is_ok() {
            return Err(format!("assign: {reply:?}"));
        }
        self.put("/api/topom/group/resync-all/{xauth}")?;
        let ledger = Ledger::preload(&self.proxy.data_addr(), "rec2", 2000).map_err(|e| e.to_string())?;
        if ledger.acked.len() != 2000 {
            return Err(format!("writes through the proxy failed: {:?}", ledger.errors));
        }
        self.fresh_stats("replicas up", |s| {
            [6380, 6382, 6384].iter().all(|p| Self::info_of(s, *p, "master_link_status").as_deref() == Some("up"))
        })
    }

    /// Why a recorded exchange cannot be reproduced here, if it cannot.
    fn skip_reason(&self, ex: &Exchange) -> Option<String> {
        if ex.service == "fe" {
            return Some("codis-fe (product list, ?forward=) is not modelled by the testbed".into());
        }
        if ex.path.starts_with("/api/topom/sentinels/") {
            return Some(
                "sentinel routes are upstream-only and not modelled: the product never calls them and the Pika fork \
                 has none (the double answers 404)"
                    .into(),
            );
        }
        if self.rec == Recording::Second && ex.id == "119" {
            return Some("stats with a sentinel registered (114), which is not modelled".into());
        }
        for port in [6999, 11081] {
            if ex.path.contains(&format!(":{port}")) && std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Some(format!("something listens on 127.0.0.1:{port} on this machine, so the dial cannot fail"));
            }
        }
        None
    }

    /// A recorded sequence, replayed as an ordering of states.
    fn sequence(&self, ex: &Exchange) -> Result<OrderReport, String> {
        match ex.id.as_str() {
            "073" => {
                let project = |v: &Value| {
                    let slots: Vec<Value> = v["slots"]
                        .as_array()
                        .map(|a| a.iter().map(|m| json!([m["id"], m["group_id"], m["action"]])).collect())
                        .unwrap_or_default();
                    let sa = &v["slot_action"];
                    json!({
                        "slots": slots,
                        "interval": sa["interval"],
                        "disabled": sa["disabled"],
                        "executor": sa["executor"],
                        "status": transcript::normalise_status(sa["progress"]["status"].as_str().unwrap_or("")),
                    })
                };
                self.double.start_trace(move |s| {
                    let slots: Vec<Value> =
                        s.slots[300..=302].iter().map(|m| serde_json::to_value(m).unwrap_or_default()).collect();
                    project(&json!({"slots": slots, "slot_action": s.slot_action}))
                });
                self.put("/api/topom/slots/action/create-range/{xauth}/300/302/3")?;
                self.until("300-302 moved", |s| (300..=302).all(|i| s.slots[i].group_id == 3))?;
                let trace = self.double.take_trace();
                let recorded = samples(ex).map(|v| project(&v));
                // A state the recording's 20 ms sampling can miss: a slot inside a push (preparing, prepared,
                // finished: one round trip to the proxy), a batch on the wire of a small slot (executor 1), and the
                // 10 ms between two rounds (no slot migrating, executor 0, no status) — topom_action.go, topom_slots.go.
                // and the instant between the round taking a slot and its first batch (migrating, executor 0, no
                // status; the recording caught it once, for 301). Never two of these slots in progress at once: they
                // share their source and their target.
                let transient = |v: &Value| {
                    let states: Vec<&str> =
                        v["slots"].as_array().into_iter().flatten().filter_map(|m| m[2]["state"].as_str()).collect();
                    let in_progress = states.iter().filter(|s| **s != "pending").count();
                    in_progress <= 1
                        && (states.iter().any(|s| ["preparing", "prepared", "finished"].contains(s))
                            || v["executor"].as_i64().unwrap_or(0) > 0
                            || (v["executor"] == 0 && v["status"] == ""))
                };
                Ok(transcript::check_order(recorded, trace.into_iter().map(|(_, v)| v), transient))
            }
            "084" => {
                let project = |v: &Value| {
                    let model = v["group"]["models"][0].clone();
                    let stats: serde_json::Map<String, Value> = v["group"]["stats"]
                        .as_object()
                        .into_iter()
                        .flatten()
                        .map(|(addr, e)| {
                            let view = if let Some(c) = e["error"]["Cause"].as_str() {
                                // The promote's CLIENT KILL closes the stats connection: the next read finds it
                                // closed (EOF), or reset when its request reached the closed socket first; both are
                                // the kill, which one is the timing's (a loaded machine sees the reset).
                                let killed = c == "EOF" || c.ends_with(": connection reset by peer");
                                json!({"error": if killed { "closed by the server" } else { c }})
                            } else {
                                let st = &e["stats"];
                                json!({
                                    "role": st["role"], "master_host": st["master_host"], "master_port": st["master_port"],
                                    "master_link_status": st["master_link_status"], "connected_slaves": st["connected_slaves"],
                                })
                            };
                            (addr.clone(), view)
                        })
                        .collect();
                    json!({"model": model, "stats": stats})
                };
                let addrs = [server(6379), server(6380)];
                self.fresh_stats("stats before the promote", |s| {
                    Self::info_of(s, 6379, "master_link_status").as_deref() == Some("up")
                })?;
                self.double.start_trace(move |s| {
                    let stats: serde_json::Map<String, Value> = addrs
                        .iter()
                        .filter_map(|a| {
                            s.server_stats.get(a).map(|e| (a.clone(), serde_json::to_value(e).unwrap_or_default()))
                        })
                        .collect();
                    project(&json!({"group": {"models": [s.group(1)], "stats": stats}}))
                });
                self.put(&format!("/api/topom/group/promote/{{xauth}}/1/{}", server(6379)))?;
                // Until the stats show the promoted server a master again after its one EOF (the recording's end).
                self.until("6379's INFO a master", |s| {
                    Self::info_of(s, 6379, "role").as_deref() == Some("master")
                        && Self::info_of(s, 6380, "connected_slaves").as_deref() == Some("0")
                })?;
                let trace = self.double.take_trace();
                let recorded: Vec<Value> = samples(ex).map(|v| project(&v)).collect();
                // Missable: the promote's own steps (promoting non-empty, within the 32 ms the call took), and a
                // refresh that caught one server's change and not yet the other's (Codis refreshes each server in
                // its own goroutine): every part of the state is then a recorded part.
                let models: Vec<Value> = recorded.iter().map(|r| r["model"].clone()).collect();
                let parts: Vec<(String, Value)> =
                    recorded.iter().flat_map(|r| r["stats"].as_object().cloned().unwrap_or_default()).collect();
                let transient = move |v: &Value| {
                    v["model"]["promoting"] != json!({})
                        || (models.contains(&v["model"])
                            && v["stats"].as_object().is_some_and(|m| {
                                m.iter().all(|(a, s)| parts.iter().any(|(pa, ps)| pa == a && ps == s))
                            }))
                };
                Ok(transcript::check_order(recorded, trace.into_iter().map(|(_, v)| v), transient))
            }
            other => Err(format!("no replay for sequence {other}")),
        }
    }
}

fn samples(ex: &Exchange) -> impl Iterator<Item = Value> + '_ {
    ex.exchanges.iter().filter_map(|s| serde_json::from_str(&s.response_body).ok())
}

/// `n` keys of `slot` among 1024, `<prefix>:{<tag>}:<i>`: a hash tag of that slot puts them all there.
fn keys_in(slot: usize, n: usize, prefix: &str) -> Vec<String> {
    let tag = (0..).map(|i| format!("t{i}")).find(|t| slot_of(t.as_bytes(), 1024) == slot).unwrap_or_default();
    (0..n).map(|i| format!("{prefix}:{{{tag}}}:{i}")).collect()
}

/// Replays `rec` (up to and including `until`) on a fresh bed; prints a table and returns one row per exchange.
fn run(rec: Recording, mutation: Option<Mutation>, until: Option<&str>) -> Vec<Row> {
    let bed = Bed::start(rec, mutation);
    let mut rows = Vec::new();
    let label = mutation.map_or_else(String::new, |m| format!(" with {m:?} planted"));
    println!("--- {rec:?} recording{label}");
    println!("{:<4} {:<6} {:<60} {:>6} {:>6} {:>6} result", "id", "method", "path", "status", "values", "ms");
    for ex in load(rec) {
        if until.is_some_and(|u| ex.id.as_str() > u) {
            break;
        }
        let path: String = ex.path.replace(bed.double.xauth(), "{x}").chars().take(60).collect();
        if let Some(reason) = bed.skip_reason(&ex) {
            println!("{:<4} {:<6} {path:<60} {:>6} {:>6} {:>6} SKIPPED: {reason}", ex.id, ex.method, ex.status, 0, 0);
            rows.push(Row { id: ex.id.clone(), verdict: Verdict::Skipped(reason), values: 0 });
            continue;
        }
        let started = Instant::now();
        let (verdict, values, status) = match bed.before(&ex.id) {
            Err(e) => (Verdict::Mismatch(vec![format!("the replay could not reach the recorded state: {e}")]), 0, 0),
            Ok(()) if ex.is_sequence() => match bed.sequence(&ex) {
                Ok(report) if report.mismatches.is_empty() => (Verdict::Ok, ex.exchanges.len(), 200),
                Ok(report) => {
                    let mut m = report.mismatches.clone();
                    let show =
                        |states: &[Value]| states.iter().map(Value::to_string).collect::<Vec<_>>().join("\n      ");
                    m.push(format!("recorded states:\n      {}", show(&report.recorded)));
                    m.push(format!("observed states:\n      {}", show(&report.observed)));
                    (Verdict::Mismatch(m), ex.exchanges.len(), 200)
                }
                Err(e) => (Verdict::Mismatch(vec![e]), 0, 0),
            },
            Ok(()) => {
                let mut answer = bed.replay(&ex);
                // Real addresses back to the recorded ones (the double dials the overrides).
                answer.body = bed.norm.apply(&answer.body);
                if std::env::var("CONFORMANCE_DUMP").is_ok_and(|ids| ids.split(',').any(|i| i == ex.id)) {
                    println!("--- {} answer:\n{}", ex.id, answer.body);
                }
                let mut mismatches = transcript::compare(&ex, &answer);
                let values = transcript::compare_values(&ex, &answer, &bed.norm);
                mismatches.extend(values.mismatches);
                let verdict = if mismatches.is_empty() { Verdict::Ok } else { Verdict::Mismatch(mismatches) };
                (verdict, values.compared, answer.status)
            }
        };
        let ms = started.elapsed().as_millis();
        let shown = match &verdict {
            Verdict::Ok => "ok".to_owned(),
            Verdict::Mismatch(m) => format!("MISMATCH: {}", m.iter().take(12).cloned().collect::<Vec<_>>().join("; ")),
            Verdict::Skipped(r) => format!("SKIPPED: {r}"),
        };
        println!("{:<4} {:<6} {path:<60} {status:>6} {values:>6} {ms:>6} {shown}", ex.id, ex.method);
        rows.push(Row { id: ex.id.clone(), verdict, values });
    }
    let compared = rows.iter().filter(|r| matches!(r.verdict, Verdict::Ok | Verdict::Mismatch(_))).count();
    let values: usize = rows.iter().map(|r| r.values).sum();
    println!(
        "--- {rec:?}{label}: {compared} exchanges compared by value ({values} values), {} skipped",
        rows.len() - compared
    );
    rows
}

fn mismatched(rows: &[Row]) -> Vec<String> {
    rows.iter().filter(|r| matches!(r.verdict, Verdict::Mismatch(_))).map(|r| r.id.clone()).collect()
}

fn assert_all_conform(rows: &[Row]) {
    let failures: Vec<String> = rows
        .iter()
        .filter_map(|r| match &r.verdict {
            Verdict::Mismatch(m) => Some(format!("{}: {}", r.id, m.join("; "))),
            _ => None,
        })
        .collect();
    assert!(failures.is_empty(), "{} exchange(s) differ from the recording:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn every_exchange_of_the_first_recording_is_answered_like_codis_value_by_value() {
    for (rule, reason) in transcript::IGNORED {
        println!("not compared: {rule} ({reason})");
    }
    assert_all_conform(&run(Recording::First, None, None));
}

#[test]
fn every_exchange_of_the_second_recording_is_answered_like_codis_value_by_value() {
    assert_all_conform(&run(Recording::Second, None, None));
}

/// Each planted defect must show as a mismatch at the exchange that reveals it (others may follow from it).
#[test]
fn each_planted_defect_is_reported_at_the_exchanges_that_reveal_it() {
    let cases: [(Mutation, Recording, &str, &[&str]); 4] = [
        // 038: the drain's actions are on the wrong slots (owners, indexes, states).
        (Mutation::CreateSomeTakesHighestSlots, Recording::First, "038", &["038"]),
        // 033: slots/assign (025) left group 1 in sync.
        (Mutation::AssignKeepsGroupsInSync, Recording::First, "038", &["033", "038"]),
        // 039: the migrating slot 517 is served by its source.
        (Mutation::MigratingSlotServedBySource, Recording::First, "039", &["039"]),
        // 072: a promote accepted while a batch is on the wire.
        (Mutation::PromoteIgnoresRunningMigration, Recording::Second, "072", &["072"]),
    ];
    let results: Vec<(Mutation, Vec<String>, &[&str])> = std::thread::scope(|scope| {
        let handles: Vec<_> = cases
            .iter()
            .map(|(m, rec, until, expected)| {
                scope.spawn(move || (*m, mismatched(&run(*rec, Some(*m), Some(until))), *expected))
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("replay thread")).collect()
    });
    for (m, got, expected) in &results {
        println!("{m:?}: mismatches at {got:?}");
        for id in *expected {
            assert!(got.iter().any(|g| g == id), "{m:?} not caught at {id}: mismatches at {got:?}");
        }
    }
}

/// The comparison itself can fail: a changed recorded field, value, status or Cause is reported on real
/// recordings against the live double.
#[test]
fn the_comparison_flags_a_changed_recording() {
    let exchanges = load(Recording::First);
    let find = |id: &str| exchanges.iter().find(|e| e.id == id).cloned().unwrap();
    let bed = Bed::start(Recording::First, None);
    let flags = |ex: &Exchange, answer: &Answer| {
        !transcript::compare(ex, answer).is_empty()
            || !transcript::compare_values(ex, answer, &bed.norm).mismatches.is_empty()
    };
    let model = find("002");
    let answer = bed.replay(&model);
    assert!(!flags(&model, &answer));
    let mut renamed = model.clone();
    renamed.response_body = renamed.response_body.replace("\"product_name\"", "\"product\"");
    assert!(flags(&renamed, &answer), "renamed field not detected");
    let mut value = model.clone();
    value.response_body = value.response_body.replace("\"codis-demo\"", "\"codis-other\"");
    assert!(flags(&value, &answer), "changed value not detected");
    let mut status = model.clone();
    status.status = 800;
    assert!(flags(&status, &answer), "status change not detected");

    let stats = find("005");
    let answer = bed.replay(&stats);
    assert!(!flags(&stats, &answer));
    let mut owner = stats.clone();
    owner.response_body = owner.response_body.replacen("\"group_id\": 0", "\"group_id\": 1", 1);
    assert!(flags(&owner, &answer), "changed slot owner not detected");
    let mut disabled = stats.clone();
    disabled.response_body = disabled.response_body.replacen("\"disabled\": false", "\"disabled\": true", 1);
    assert!(flags(&disabled, &answer), "changed slot_action.disabled not detected");

    let created = find("008");
    assert!(!flags(&created, &bed.replay(&created)));
    let again = find("010");
    let answer = bed.replay(&again);
    assert!(!flags(&again, &answer));
    let mut cause = again.clone();
    cause.response_body = cause.response_body.replace("group-[1] already exists", "group-[1] already exist");
    assert!(flags(&cause, &answer), "changed Cause not detected");
}
