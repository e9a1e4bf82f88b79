//! Replays the recorded Codis 3.2 exchanges (`shared/codis-transcripts`) against the dashboard double and the proxy
//! double, in id order, and checks each answer with [`testbed::transcript::compare`].
//!
//! The recording ran one scenario on 127.0.0.1 (dashboard 18080, proxy 11080, codis-servers 6379/6380/6381). Here the
//! same addresses are registered and the double's override map sends them to three real redis-servers and a proxy
//! double carrying the recorded proxy token; 127.0.0.1:6999 stays unmapped so its dial really fails. Where the
//! recording waited for something between two requests (a sync action, a rebalance, a drain, keys written through
//! the proxy), the test waits for the same condition through the double's snapshot before sending the next one.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use testbed::codis::SlotState;
use testbed::transcript::{self, Answer, Exchange};
use testbed::{CodisDouble, DoubleOptions, ProxyDouble, ProxyOptions, RedisServer};

const TRANSCRIPTS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../shared/codis-transcripts"
);
const RECORDED_PROXY_TOKEN: &str = "2c97b44860344b5271fe1ef5d4849c55";
const WAIT: Duration = Duration::from_secs(30);

struct Bed {
    rt: tokio::runtime::Runtime,
    http: reqwest::Client,
    double: CodisDouble,
    proxy: ProxyDouble,
    redis: BTreeMap<u16, RedisServer>,
}

impl Bed {
    fn start() -> Self {
        let redis: BTreeMap<u16, RedisServer> = [6379, 6380, 6381]
            .into_iter()
            .map(|p| (p, RedisServer::start()))
            .collect();
        let proxy = ProxyDouble::start_with(ProxyOptions {
            token: Some(RECORDED_PROXY_TOKEN.into()),
            admin_addr: Some("127.0.0.1:11080".into()),
            ..ProxyOptions::new("codis-demo")
        });
        let mut overrides: BTreeMap<String, String> = redis
            .iter()
            .map(|(p, r)| (format!("127.0.0.1:{p}"), r.addr()))
            .collect();
        overrides.insert("127.0.0.1:11080".into(), proxy.addr());
        let double = CodisDouble::start(DoubleOptions {
            product: "codis-demo".into(),
            overrides,
            tick: Duration::from_millis(1),
            stats_interval: Duration::from_millis(50),
            ..DoubleOptions::default()
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let http = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        Self {
            rt,
            http,
            double,
            proxy,
            redis,
        }
    }

    fn send(&self, base: &str, method: &str, path: &str, body: Option<&str>) -> Answer {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut req = self.http.request(method, format!("http://{base}{path}"));
        if let Some(b) = body {
            req = req
                .header("Content-Type", "application/json")
                .body(b.to_owned());
        }
        self.rt.block_on(async {
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            let content_type = resp
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            Answer {
                status,
                content_type,
                body: resp.text().await.unwrap(),
            }
        })
    }

    fn replay(&self, ex: &Exchange) -> Answer {
        let base = if ex.service == "proxy-admin" {
            self.proxy.addr()
        } else {
            self.double.addr()
        };
        self.send(&base, &ex.method, &ex.path, ex.request_body.as_deref())
    }

    fn dashboard(&self, method: &str, path: &str) -> Answer {
        let path = path.replace("{x}", self.double.xauth());
        self.send(&self.double.addr(), method, &path, None)
    }

    /// Like `CodisDouble::wait_for`, polling every 10 ms: the long waits here (a rebalance and a drain of 512
    /// slots each) should leave the CPU to the double.
    fn poll(&self, mut ready: impl FnMut(&testbed::Snapshot) -> bool) -> Option<testbed::Snapshot> {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let snap = self.double.snapshot();
            if ready(&snap) {
                return Some(snap);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn redis(&self, port: u16) -> &RedisServer {
        &self.redis[&port]
    }

    /// Stats show every registered server with INFO (and `check` holds for them) and every proxy with stats.
    fn wait_stats(&self, what: &str, check: impl Fn(&str, &BTreeMap<String, String>) -> bool) {
        assert!(self.double.wait_stats_refresh(WAIT), "no stats refresh");
        let ok = self.poll(|s| {
            let servers: Vec<&str> = s
                .groups
                .iter()
                .flat_map(|g| g.servers.iter().map(|x| x.server.as_str()))
                .collect();
            s.server_stats.len() == servers.len()
                && servers.iter().all(|a| {
                    s.server_stats
                        .get(*a)
                        .and_then(|e| e.stats.as_ref())
                        .is_some_and(|info| check(a, info))
                })
                && s.proxies.iter().all(|p| {
                    s.proxy_stats
                        .get(&p.token)
                        .is_some_and(|e| e.stats.is_some())
                })
        });
        assert!(ok.is_some(), "stats never showed {what}");
    }

    /// What the recording did (or waited for) right before exchange `id`.
    fn before(&self, id: &str) {
        match id {
            "018" => {
                // 017 created the sync action; the recording shows 6381 replicating 6379 with the link up.
                let synced = self.poll(|s| {
                    s.server("127.0.0.1:6381").is_some_and(|(_, x)| {
                        x.action.state == testbed::codis::ServerActionState::Synced
                    })
                });
                assert!(synced.is_some(), "sync action of 6381 never finished");
                let master = self.redis(6379).port();
                assert!(
                    wait(|| self.redis(6381).master() == Some(("127.0.0.1".into(), master, true))),
                    "no replication"
                );
            }
            "029" => {
                // Not in the transcript: between the preview (028) and 029 the recording confirmed the rebalance and
                // let it run to completion (1024 offline slots onto groups 1 and 2).
                let a = self.dashboard("PUT", "/api/topom/slots/rebalance/{x}/1");
                assert_eq!(a.status, 200, "{}", a.body);
                let done = self.poll(|s| s.with_action().is_empty());
                assert!(done.is_some(), "rebalance did not finish");
            }
            "033" => self.wait_stats("INFO with slave0 on 6379", |a, info| {
                a != "127.0.0.1:6379" || info.contains_key("slave0")
            }),
            "036" => {
                // Not in the transcript: the recording wrote keys through the proxy before the drain (038 shows db0
                // on every server). The proxy double has no data path, so the keys go to the masters directly.
                for port in [6379, 6380] {
                    for i in 0..10 {
                        let _ = self
                            .redis(port)
                            .command(&["SET", &format!("key-{port}-{i}"), "v"]);
                    }
                }
                assert!(
                    wait(|| self.redis(6381).command(&["DBSIZE"]).contains(":10")),
                    "replica never got the keys"
                );
                self.wait_stats("db0 everywhere", |_, info| info.contains_key("db0"));
            }
            "037" => {
                // Hold the first slot of the drain in `migrating` so 038/039 see a migration in progress, as recorded.
                self.double.set_migration_ticks(512, u32::MAX);
            }
            "038" => {
                let migrating = self.poll(|s| s.slots[512].action.state == SlotState::Migrating);
                assert!(migrating.is_some(), "slot 512 never reached migrating");
            }
            "040" => {
                self.double.set_migration_ticks(512, 1);
                let drained = self.poll(|s| s.slots_of(2) == 0 && s.with_action().is_empty());
                assert!(drained.is_some(), "drain of group 2 did not finish");
            }
            "044" => self.wait_stats("group 2 gone", |_, _| true),
            _ => {}
        }
    }

    /// Why a recorded exchange cannot be reproduced here, if it cannot.
    fn skip_reason(&self, ex: &Exchange) -> Option<String> {
        if ex.service == "fe" {
            return Some(
                "codis-fe (product list, ?forward=) is not modelled by the testbed".into(),
            );
        }
        if ex.id == "016" && std::net::TcpStream::connect("127.0.0.1:6999").is_ok() {
            return Some(
                "something listens on 127.0.0.1:6999 on this machine, so the dial cannot fail"
                    .into(),
            );
        }
        None
    }
}

fn wait(mut ready: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + WAIT;
    while std::time::Instant::now() < deadline {
        if ready() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

fn load() -> Vec<Exchange> {
    let dir = Path::new(TRANSCRIPTS);
    transcript::load_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read transcripts at {}: {e}", dir.display()))
}

#[test]
fn every_recorded_exchange_is_answered_like_codis() {
    let exchanges = load();
    assert!(
        exchanges.len() >= 50,
        "expected the recorded transcripts, found {}",
        exchanges.len()
    );
    let bed = Bed::start();
    let mut failures = Vec::new();
    println!(
        "{:<4} {:<12} {:<6} {:<64} {:>6} {:>6} result",
        "id", "service", "method", "path", "status", "ms"
    );
    for ex in &exchanges {
        let path: String = ex.path.chars().take(64).collect();
        if let Some(reason) = bed.skip_reason(ex) {
            println!(
                "{:<4} {:<12} {:<6} {:<64} {:>6} {:>6} SKIPPED: {reason}",
                ex.id, ex.service, ex.method, path, ex.status, 0
            );
            continue;
        }
        // The time column includes the wait before the exchange (rebalance before 029, drain before 040).
        let started = std::time::Instant::now();
        bed.before(&ex.id);
        let answer = bed.replay(ex);
        let ms = started.elapsed().as_millis();
        // CONFORMANCE_DUMP=018,039 prints those answers in full, to look at what the double says.
        if std::env::var("CONFORMANCE_DUMP").is_ok_and(|ids| ids.split(',').any(|i| i == ex.id)) {
            println!("--- {} answer:\n{}", ex.id, answer.body);
        }
        let mismatches = transcript::compare(ex, &answer);
        let verdict = if mismatches.is_empty() {
            "ok".to_owned()
        } else {
            format!("MISMATCH: {}", mismatches.join("; "))
        };
        println!(
            "{:<4} {:<12} {:<6} {:<64} {:>6} {ms:>6} {verdict}",
            ex.id, ex.service, ex.method, path, answer.status
        );
        if !mismatches.is_empty() {
            failures.push(format!(
                "{} {} {}: {}",
                ex.id,
                ex.method,
                ex.path,
                mismatches.join("; ")
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} exchange(s) differ from the recording:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The acceptance criterion "the conformance test fails when a recorded field is changed", on real recordings and
/// real answers of the double.
#[test]
fn the_comparison_flags_a_changed_recording() {
    let exchanges = load();
    let find = |id: &str| exchanges.iter().find(|e| e.id == id).cloned().unwrap();
    let bed = Bed::start();
    let model = find("002");
    let answer = bed.replay(&model);
    assert!(transcript::compare(&model, &answer).is_empty());

    let mut renamed = model.clone();
    renamed.response_body = renamed
        .response_body
        .replace("\"product_name\"", "\"product\"");
    assert!(
        !transcript::compare(&renamed, &answer).is_empty(),
        "renamed field not detected"
    );

    let mut removed = model.clone();
    let mut v: serde_json::Value = serde_json::from_str(&removed.response_body).unwrap();
    v.as_object_mut().unwrap().remove("pid");
    removed.response_body = v.to_string();
    assert!(
        !transcript::compare(&removed, &answer).is_empty(),
        "removed field not detected"
    );

    let mut status = model.clone();
    status.status = 800;
    assert!(
        !transcript::compare(&status, &answer).is_empty(),
        "status change not detected"
    );

    // Before any mutation, so the live stats still match the empty-cluster recording.
    let stats = find("005");
    let answer = bed.replay(&stats);
    assert!(transcript::compare(&stats, &answer).is_empty());
    let mut nested = stats.clone();
    nested.response_body = nested
        .response_body
        .replacen("\"out_of_sync\"", "\"outofsync\"", 1);
    assert!(
        !transcript::compare(&nested, &answer).is_empty(),
        "renamed nested field not detected"
    );

    let created = find("008");
    assert!(transcript::compare(&created, &bed.replay(&created)).is_empty());
    let again = find("010");
    let answer = bed.replay(&again);
    assert!(transcript::compare(&again, &answer).is_empty());
    let mut cause = again.clone();
    cause.response_body = cause
        .response_body
        .replace("group-[1] already exists", "group-[1] already exist");
    assert!(
        !transcript::compare(&cause, &answer).is_empty(),
        "changed Cause not detected"
    );
}
