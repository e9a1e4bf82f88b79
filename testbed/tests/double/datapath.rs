//! The data path: keys move with their slots between real redis-servers, the proxy double serves them through the
//! slot table the dashboard pushed, and the workload's verifier sees a lost key.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use testbed::codis::slothash::slot_of;
use testbed::{CodisDouble, DoubleOptions, Ledger, ProxyDouble, ProxyOptions, RedisServer, Workload, WorkloadOptions};

const WAIT: Duration = Duration::from_secs(120);

fn pod(n: usize) -> String {
    format!("pika-{n}.pika-headless.ns.svc:9221")
}

/// Two groups of one server each, a proxy online, every slot in group 1.
struct Bed {
    redis: Vec<RedisServer>,
    proxy: ProxyDouble,
    double: CodisDouble,
}

impl Bed {
    fn start(groups: usize, opts: DoubleOptions) -> Self {
        let redis: Vec<RedisServer> = (0..groups).map(|_| RedisServer::start()).collect();
        let servers: BTreeMap<String, String> = redis.iter().enumerate().map(|(i, r)| (pod(i), r.addr())).collect();
        let proxy = ProxyDouble::start_with(ProxyOptions {
            admin_addr: Some("proxy-0.proxy:11080".into()),
            overrides: servers.clone(),
            max_slot_num: opts.max_slot_num,
            ..ProxyOptions::new("codis-demo")
        });
        let mut overrides = servers;
        overrides.insert("proxy-0.proxy:11080".into(), proxy.addr());
        let double = CodisDouble::start(DoubleOptions { overrides, ..opts });
        for g in 1..=groups {
            ok(&double, &format!("/api/topom/group/create/{{xauth}}/{g}"));
            ok(&double, &format!("/api/topom/group/add/{{xauth}}/{g}/{}", pod(g - 1)));
        }
        Self { redis, proxy, double }
    }

    fn online(&self) {
        ok(&self.double, "/api/topom/proxy/online/{xauth}/proxy-0.proxy:11080");
    }

    fn assign_all_to(&self, gid: u32) {
        let n = self.double.options().max_slot_num;
        let body: Vec<String> = (0..n).map(|s| format!("{{\"id\":{s},\"group_id\":{gid}}}")).collect();
        let reply =
            self.double.call_with_body("PUT", "/api/topom/slots/assign/{xauth}", &format!("[{}]", body.join(",")));
        assert!(reply.is_ok(), "{reply:?}");
    }

    fn drained(&self, from: u32) -> bool {
        self.double.wait_for(WAIT, |s| s.slots_of(from) == 0 && s.with_action().is_empty()).is_some()
    }
}

fn ok(d: &CodisDouble, path: &str) {
    let reply = d.call("PUT", path);
    assert!(reply.is_ok(), "{path}: {reply:?}");
}

/// One command on a fresh connection; the raw reply.
fn resp(addr: &str, args: &[&str]) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut out = format!("*{}\r\n", args.len());
    for a in args {
        out.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    s.write_all(out.as_bytes()).unwrap();
    let mut r = BufReader::new(s);
    read_reply(&mut r)
}

fn read_reply(r: &mut BufReader<TcpStream>) -> String {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    match line.as_bytes().first() {
        Some(b'$') if !line.starts_with("$-1") => {
            let n: usize = line[1..].trim().parse().unwrap();
            let mut buf = vec![0; n + 2];
            r.read_exact(&mut buf).unwrap();
            format!("{}{}", line, String::from_utf8_lossy(&buf))
        }
        Some(b'*') if !line.starts_with("*-1") => {
            let n: usize = line[1..].trim().parse().unwrap();
            (0..n).fold(line.clone(), |acc, _| acc + &read_reply(r))
        }
        _ => line,
    }
}

/// A key of `slot` among `n` slots.
fn key_in(slot: usize, n: usize, tag: &str) -> String {
    (0..).map(|i| format!("{tag}-{i}")).find(|k| slot_of(k.as_bytes(), n) == slot).unwrap()
}

#[test]
fn the_proxy_routes_through_the_pushed_slot_table_and_answers_like_codis_proxy() {
    let bed = Bed::start(2, DoubleOptions::default());
    let data = bed.proxy.data_addr();
    assert_eq!(resp(&data, &["GET", "k"]), "-ERR router is not online\r\n");
    bed.online();
    // Online, but every slot is offline.
    assert_eq!(resp(&data, &["GET", "k"]), "-ERR handle request, slot is not ready, may be offline\r\n");
    bed.assign_all_to(1);
    assert_eq!(resp(&data, &["SET", "k", "v"]), "+OK\r\n");
    assert_eq!(resp(&data, &["GET", "k"]), "$1\r\nv\r\n");
    assert_eq!(resp(&bed.redis[0].addr(), &["GET", "k"]), "$1\r\nv\r\n", "the key is on group 1's master");
    assert_eq!(resp(&data, &["MSET", "a", "1", "b", "2"]), "+OK\r\n");
    assert_eq!(resp(&data, &["MGET", "a", "b", "missing"]), "*3\r\n$1\r\n1\r\n$1\r\n2\r\n$-1\r\n");
    assert_eq!(resp(&data, &["EXISTS", "a", "b", "missing"]), ":2\r\n");
    assert_eq!(resp(&data, &["INCR", "n"]), ":1\r\n");
    assert_eq!(resp(&data, &["DEL", "a", "b", "missing"]), ":2\r\n");
    assert_eq!(resp(&data, &["PING"]), "+PONG\r\n");

    // One slot moved to group 2: its keys go with it and the proxy follows the new owner.
    let n = 1024;
    let k = key_in(7, n, "moved");
    assert_eq!(resp(&data, &["SET", &k, "here"]), "+OK\r\n");
    ok(&bed.double, "/api/topom/slots/action/create/{xauth}/7/2");
    assert!(bed.double.wait_for(WAIT, |s| s.slots[7].group_id == 2).is_some());
    assert_eq!(resp(&bed.redis[1].addr(), &["GET", &k]), "$4\r\nhere\r\n", "the key moved to group 2's master");
    assert_eq!(resp(&bed.redis[0].addr(), &["EXISTS", &k]), ":0\r\n", "and left group 1's");
    assert_eq!(resp(&data, &["GET", &k]), "$4\r\nhere\r\n");
}

#[test]
fn a_migrating_slot_is_followed_key_by_key_and_a_restarted_proxy_is_served_again_once_re_onlined() {
    let bed = Bed::start(2, DoubleOptions::default());
    bed.online();
    bed.assign_all_to(1);
    let data = bed.proxy.data_addr();
    let n = 1024;
    let (old, new) = (key_in(9, n, "old"), key_in(9, n, "new"));
    assert_eq!(resp(&data, &["SET", &old, "1"]), "+OK\r\n");
    // Held before its first batch: migrating, nothing moved yet.
    bed.double.hold_migration(9, testbed::MigrationHold::BeforeBatch { after: 0 });
    ok(&bed.double, "/api/topom/slots/action/create/{xauth}/9/2");
    assert!(bed.double.wait_for(WAIT, |_| bed.double.is_migration_held(9)).is_some());
    let route = &bed.proxy.slots()[9];
    assert_eq!((route.backend_addr.as_str(), route.migrate_from.as_str()), (pod(1).as_str(), pod(0).as_str()));
    // An existing key is still served (and updated) on the source; a new key is created on the target.
    assert_eq!(resp(&data, &["INCR", &old]), ":2\r\n");
    assert_eq!(resp(&bed.redis[0].addr(), &["GET", &old]), "$1\r\n2\r\n");
    assert_eq!(resp(&data, &["SET", &new, "x"]), "+OK\r\n");
    assert_eq!(resp(&bed.redis[1].addr(), &["GET", &new]), "$1\r\nx\r\n");
    assert_eq!(resp(&bed.redis[0].addr(), &["EXISTS", &new]), ":0\r\n");
    bed.double.release_migration(9);
    assert!(bed.double.wait_for(WAIT, |s| s.slots[9].group_id == 2).is_some());
    assert_eq!(resp(&bed.redis[1].addr(), &["GET", &old]), "$1\r\n2\r\n", "the updated key moved");
    assert_eq!(resp(&data, &["GET", &old]), "$1\r\n2\r\n");

    // A proxy that missed a promote's push is restarted; the dashboard re-onlines it with the whole table.
    bed.proxy.stop();
    let replica = RedisServer::start();
    bed.double.set_override("pika-9.pika-headless.ns.svc:9221", &replica.addr());
    bed.proxy.set_override("pika-9.pika-headless.ns.svc:9221", &replica.addr());
    ok(&bed.double, "/api/topom/group/add/{xauth}/2/pika-9.pika-headless.ns.svc:9221");
    let reply = bed.double.call("PUT", "/api/topom/group/promote/{xauth}/2/pika-9.pika-headless.ns.svc:9221");
    assert_eq!(reply.cause().as_deref(), Some(format!("proxy-[{}] resync slots failed", bed.proxy.token()).as_str()));
    bed.proxy.restart().unwrap();
    // A restarted proxy is offline and its table empty until the dashboard re-onlines it.
    assert!(bed.double.wait_for(WAIT, |_| bed.proxy.is_online()).is_some());
    assert!(resp(&data, &["GET", &old]).starts_with('$'), "re-onlined, the slot table is back");
}

fn preload_and_write(bed: &Bed, keys: usize) -> (Ledger, Workload) {
    let data = bed.proxy.data_addr();
    let started = Instant::now();
    let preload = Ledger::preload(&data, "pre", keys).expect("preload");
    assert_eq!(preload.acked.len(), keys, "{:?}", preload.errors);
    println!("preloaded {keys} keys through the proxy in {:?}", started.elapsed());
    let workload = Workload::start(WorkloadOptions::through(&[data]));
    assert!(workload.wait_for_acked(50, WAIT), "the writer got nothing through: {workload:?}");
    (preload, workload)
}

#[test]
fn a_clean_drain_of_1024_slots_under_a_running_writer_loses_no_acknowledged_key() {
    let bed = Bed::start(2, DoubleOptions::default());
    bed.online();
    bed.assign_all_to(1);
    let (mut ledger, workload) = preload_and_write(&bed, 20_000);
    let started = Instant::now();
    ok(&bed.double, "/api/topom/slots/action/create-some/{xauth}/1/2/1024");
    assert!(bed.drained(1), "the drain did not finish");
    let took = started.elapsed();
    let during = workload.acked();
    std::thread::sleep(Duration::from_millis(100));
    ledger.merge(workload.stop());
    println!(
        "drained 1024 slots ({} keys) in {took:?}; the writer had {during} writes acknowledged by the end of the drain, \
         {} acknowledged and {} failed in all",
        20_000,
        ledger.acked.len() - 20_000,
        ledger.failed
    );
    assert_eq!(resp(&bed.redis[0].addr(), &["DBSIZE"]), ":0\r\n", "keys left behind on the drained master");
    let through = ledger.verify_through(&bed.proxy.data_addr());
    assert!(through.is_clean(), "through the proxy: {}", through.summary());
    let direct = ledger.verify_on_backends(&bed.double);
    assert!(direct.is_clean(), "on the backends: {}", direct.summary());
    assert_eq!(through.checked, ledger.acked.len());
}

#[test]
fn a_drain_that_drops_one_slots_keys_is_caught_by_the_verifier() {
    // 64 slots rather than 1024 so that the 2,000 keys put some thirty into the dropped slot: a loss the verifier
    // must see, not one key that might by chance be absent.
    let bed = Bed::start(2, DoubleOptions { max_slot_num: 64, ..DoubleOptions::default() });
    bed.online();
    bed.assign_all_to(1);
    let (mut ledger, workload) = preload_and_write(&bed, 2_000);
    let victim = 17;
    bed.double.drop_keys_of(victim);
    ok(&bed.double, "/api/topom/slots/action/create-some/{xauth}/1/2/64");
    assert!(bed.drained(1), "the drain did not finish");
    ledger.merge(workload.stop());
    let expected: Vec<String> = ledger.acked.keys().filter(|k| slot_of(k.as_bytes(), 64) == victim).cloned().collect();
    assert!(!expected.is_empty(), "no acknowledged key in slot {victim}");
    let through = ledger.verify_through(&bed.proxy.data_addr());
    let lost_slots: std::collections::BTreeSet<usize> =
        through.lost.iter().map(|k| slot_of(k.as_bytes(), 64)).collect();
    assert_eq!(lost_slots, [victim].into(), "{}", through.summary());
    // Every acknowledged key of the slot written before its migration is gone (keys written into it while it was
    // migrating went to the target and survive).
    let preloaded_victims = expected.iter().filter(|k| k.starts_with("pre:")).count();
    assert!(through.lost.len() >= preloaded_victims, "{}", through.summary());
    assert!(through.wrong.is_empty() && through.errors.is_empty(), "{}", through.summary());
    let direct = ledger.verify_on_backends(&bed.double);
    assert_eq!(direct.lost, through.lost, "the backends tell the same");
    // The check the topology tests use sees it on both sides.
    let kept = ledger.verify_kept(&bed.proxy.data_addr(), &bed.double).expect_err("a lost slot is not kept");
    assert!(kept.contains("through the proxy") && kept.contains("on the masters"), "{kept}");
}

#[test]
fn a_locked_slot_holds_requests_until_a_fill_unlocks_it() {
    let bed = Bed::start(2, DoubleOptions::default());
    bed.online();
    bed.assign_all_to(1);
    let data = bed.proxy.data_addr();
    let k = key_in(3, 1024, "locked");
    assert_eq!(resp(&data, &["SET", &k, "1"]), "+OK\r\n");
    let fill = |locked: bool| {
        let slot = format!(
            "[{{\"id\":3,\"locked\":{locked},\"backend_addr\":\"{}\",\"backend_addr_group_id\":1,\"forward_method\":1}}]",
            pod(0)
        );
        let (status, body) = http_put(&bed.proxy.addr(), &format!("/api/proxy/fillslots/{}", bed.proxy.xauth()), &slot);
        let reply = testbed::codis::HttpReply { status, body };
        assert!(reply.is_ok(), "{reply:?}");
    };
    fill(true);
    let waiting = std::thread::spawn({
        let (data, k) = (data.clone(), k.clone());
        move || resp(&data, &["GET", &k])
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(!waiting.is_finished(), "a request on a locked slot was answered");
    // Other slots are served meanwhile.
    assert_eq!(resp(&data, &["SET", &key_in(4, 1024, "free"), "1"]), "+OK\r\n");
    fill(false);
    assert_eq!(waiting.join().unwrap(), "$1\r\n1\r\n");
}

/// One HTTP PUT with a JSON body; `(status, body)`.
fn http_put(addr: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "PUT {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    (head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0), body.to_owned())
}
