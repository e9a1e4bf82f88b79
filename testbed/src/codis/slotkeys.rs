//! The per-slot key index codis-server keeps and redis-server lacks, so the double can migrate a slot's keys between
//! real redis-servers in batches, the way `SLOTSMGRTTAGSLOT-ASYNC` does, and answer the equivalent of `SLOTSINFO`.
//!
//! codis-server buckets every key by slot as it is written. A redis-server stand-in is made to tell: the first time
//! the double needs a backend's index it turns on keyspace events there (`notify-keyspace-events Egxen`: new keys,
//! deletions, expirations, evictions, renames and moves), subscribes to them, and then scans the keyspace once;
//! from then on the events keep the index current whoever writes (a proxy, a test writing straight to the backend,
//! `MIGRATE` itself). Before each migration batch a marker is published on the backend and awaited on the
//! subscription: events come in the order the server made them, so once the marker is back the index holds every
//! key written before it. A SCAN per batch is never needed.
//!
//! An index is rebuilt (resubscribe, rescan) when its subscription died (the server restarted or the double that
//! watched it is gone) or the backend's `master_replid` changed: a promotion, or a full resync from another master,
//! replaces the data set without per-key events.
//!
//! Entries may hold keys that no longer exist (a key deleted while the scan ran); `MIGRATE` skips missing keys, so
//! they only make the reported count an upper bound. Only database 0 is indexed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use super::resp::{Conn, Reply};
use super::slothash::slot_of;

/// How long a batch waits for its marker to come back through the subscription.
const BARRIER_TIMEOUT: Duration = Duration::from_secs(10);

/// A live subscription to one backend's keyspace events.
#[derive(Debug)]
struct Watcher {
    /// Cleared when the subscription ends (connection lost, runtime gone).
    alive: AtomicBool,
    /// The last marker seen on the subscription.
    seen: AtomicU64,
    /// The last marker handed out.
    sent: AtomicU64,
    notify: tokio::sync::Notify,
    /// The marker channel of this subscription.
    channel: String,
}

/// Clears `alive` when the watching task ends, however it ends.
struct AliveGuard(Arc<Watcher>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.alive.store(false, Ordering::SeqCst);
        self.0.notify.notify_waiters();
    }
}

/// The index of one backend (by real address and slot count).
#[derive(Debug, Default)]
struct BackendKeys {
    /// `master_replid` when the index was built.
    lineage: Option<String>,
    /// Keys by slot; only non-empty slots.
    slots: HashMap<usize, HashSet<Vec<u8>>>,
    watcher: Option<Arc<Watcher>>,
}

impl BackendKeys {
    fn insert(&mut self, slot: usize, key: Vec<u8>) {
        self.slots.entry(slot).or_default().insert(key);
    }

    fn remove(&mut self, slot: usize, key: &[u8]) {
        if let Some(set) = self.slots.get_mut(&slot) {
            set.remove(key);
            if set.is_empty() {
                self.slots.remove(&slot);
            }
        }
    }

    fn is_live(&self) -> bool {
        self.watcher.as_ref().is_some_and(|w| w.alive.load(Ordering::SeqCst))
    }
}

type Entry = Arc<Mutex<BackendKeys>>;
type Registry = Mutex<HashMap<(String, usize), Entry>>;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Registry::default)
}

fn entry(real: &str, nslots: usize) -> Entry {
    let mut reg = registry().lock().unwrap_or_else(PoisonError::into_inner);
    reg.entry((real.to_owned(), nslots)).or_default().clone()
}

fn lock(e: &Mutex<BackendKeys>) -> MutexGuard<'_, BackendKeys> {
    e.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Takes up to `n` keys of `slot` off the index of `real` (the next batch); the smallest keys first, so batches
/// are reproducible.
pub(crate) fn take(real: &str, nslots: usize, slot: usize, n: usize) -> Vec<Vec<u8>> {
    let e = entry(real, nslots);
    let mut g = lock(&e);
    let Some(set) = g.slots.get_mut(&slot) else {
        return Vec::new();
    };
    let mut keys: Vec<Vec<u8>> = set.iter().cloned().collect();
    keys.sort_unstable();
    keys.truncate(n.max(1));
    for k in &keys {
        set.remove(k);
    }
    if set.is_empty() {
        g.slots.remove(&slot);
    }
    keys
}

/// Puts keys back after a failed batch.
pub(crate) fn put_back(real: &str, nslots: usize, keys: Vec<Vec<u8>>) {
    let e = entry(real, nslots);
    let mut g = lock(&e);
    for k in keys {
        g.insert(slot_of(&k, nslots), k);
    }
}

/// Keys of `slot` the index holds for `real`.
pub(crate) fn count(real: &str, nslots: usize, slot: usize) -> usize {
    let e = entry(real, nslots);
    let g = lock(&e);
    g.slots.get(&slot).map_or(0, HashSet::len)
}

/// Forgets every key of `slot` on `real` (a move onto the same server: the keys are already in place).
pub(crate) fn clear_slot(real: &str, nslots: usize, slot: usize) {
    let e = entry(real, nslots);
    lock(&e).slots.remove(&slot);
}

/// `master_replid` of the server `conn` talks to. A restarted redis-server (no persistence here) starts with a new
/// replication id, so the id tells a restart too.
async fn lineage(conn: &mut Conn) -> Result<String, String> {
    let reply = conn.request(&[b"INFO", b"replication"]).await?;
    let text = match reply {
        Reply::Error(e) => return Err(e),
        r => r.text().unwrap_or_default(),
    };
    Ok(text.lines().find_map(|l| l.strip_prefix("master_replid:")).map(|v| v.trim().to_owned()).unwrap_or_default())
}

/// Makes sure the index of `real` (reached through `conn`, which this may use) holds every key of the backend as
/// of now: (re)builds it when needed, then waits for a marker to come back through the subscription.
pub(crate) async fn ensure_fresh(
    conn: &mut Conn,
    real: &str,
    nslots: usize,
    password: Option<&str>,
) -> Result<(), String> {
    let now = lineage(conn).await?;
    let e = entry(real, nslots);
    let current = {
        let g = lock(&e);
        g.is_live() && g.lineage.as_deref() == Some(now.as_str())
    };
    if !current {
        rebuild(conn, &e, real, nslots, password, now).await?;
    }
    barrier(conn, &e).await
}

async fn rebuild(
    conn: &mut Conn,
    e: &Entry,
    real: &str,
    nslots: usize,
    password: Option<&str>,
    now: String,
) -> Result<(), String> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let reply = conn.request(&[b"CONFIG", b"SET", b"notify-keyspace-events", b"Egxen"]).await?;
    if let Reply::Error(err) = reply {
        return Err(format!("turning on keyspace events: {err}"));
    }
    let channel = format!("testbed:slot-index:{}:{}", std::process::id(), NEXT.fetch_add(1, Ordering::SeqCst));
    let mut sub = Conn::dial(real, password, Duration::from_secs(5)).await?;
    for args in [[b"PSUBSCRIBE".as_slice(), b"__keyevent@0__:*"], [b"SUBSCRIBE".as_slice(), channel.as_bytes()]] {
        match sub.request(&args).await? {
            Reply::Array(Some(_)) => {}
            other => return Err(format!("subscribing to keyspace events: {other:?}")),
        }
    }
    let watcher = Arc::new(Watcher {
        alive: AtomicBool::new(true),
        seen: AtomicU64::new(0),
        sent: AtomicU64::new(0),
        notify: tokio::sync::Notify::new(),
        channel,
    });
    {
        let mut g = lock(e);
        if let Some(old) = g.watcher.replace(watcher.clone()) {
            old.alive.store(false, Ordering::SeqCst);
        }
        g.slots.clear();
        g.lineage = None;
    }
    tokio::spawn(watch(sub, e.clone(), watcher.clone(), nslots));
    // Events from here on are applied as they come; the scan adds what was there before.
    let scanned = scan(conn, nslots).await?;
    let mut g = lock(e);
    for (slot, keys) in scanned {
        g.slots.entry(slot).or_default().extend(keys);
    }
    g.lineage = Some(now);
    Ok(())
}

/// Applies keyspace events to the index until the subscription ends.
async fn watch(mut sub: Conn, e: Entry, watcher: Arc<Watcher>, nslots: usize) {
    let _alive = AliveGuard(watcher.clone());
    while watcher.alive.load(Ordering::SeqCst) {
        let Ok(Reply::Array(Some(parts))) = sub.next_message().await else {
            return;
        };
        match parts.as_slice() {
            [Reply::Bulk(Some(kind)), _, Reply::Bulk(Some(channel)), Reply::Bulk(Some(key))] if kind == b"pmessage" => {
                let event = channel.rsplit(|b| *b == b':').next().unwrap_or_default();
                let slot = slot_of(key, nslots);
                let mut g = lock(&e);
                match event {
                    b"new" | b"rename_to" | b"move_to" => g.insert(slot, key.clone()),
                    b"del" | b"expired" | b"evicted" | b"rename_from" | b"move_from" => g.remove(slot, key),
                    _ => {}
                }
            }
            [Reply::Bulk(Some(kind)), Reply::Bulk(Some(_)), Reply::Bulk(Some(token))] if kind == b"message" => {
                let token = String::from_utf8_lossy(token).parse().unwrap_or(0);
                watcher.seen.fetch_max(token, Ordering::SeqCst);
                watcher.notify.notify_waiters();
            }
            _ => {}
        }
    }
}

/// Publishes a marker on the backend and waits until the subscription has it: every event before it is applied.
async fn barrier(conn: &mut Conn, e: &Entry) -> Result<(), String> {
    let Some(watcher) = lock(e).watcher.clone() else {
        return Err("the slot index has no subscription".into());
    };
    let token = watcher.sent.fetch_add(1, Ordering::SeqCst) + 1;
    let text = token.to_string();
    match conn.request(&[b"PUBLISH", watcher.channel.as_bytes(), text.as_bytes()]).await? {
        Reply::Int(n) if n > 0 => {}
        other => {
            watcher.alive.store(false, Ordering::SeqCst);
            return Err(format!("the slot index lost its subscription (PUBLISH answered {other:?})"));
        }
    }
    let wait = async {
        loop {
            let notified = watcher.notify.notified();
            if watcher.seen.load(Ordering::SeqCst) >= token {
                return Ok(());
            }
            if !watcher.alive.load(Ordering::SeqCst) {
                return Err("the slot index lost its subscription".to_owned());
            }
            notified.await;
        }
    };
    tokio::time::timeout(BARRIER_TIMEOUT, wait)
        .await
        .unwrap_or_else(|_| Err("the slot index's marker did not come back".into()))
}

/// One full `SCAN` of database 0, bucketed by slot.
async fn scan(conn: &mut Conn, nslots: usize) -> Result<HashMap<usize, HashSet<Vec<u8>>>, String> {
    let mut slots: HashMap<usize, HashSet<Vec<u8>>> = HashMap::new();
    let mut cursor = b"0".to_vec();
    loop {
        let reply = conn.request(&[b"SCAN", &cursor, b"COUNT", b"1000"]).await?;
        let Reply::Array(Some(parts)) = reply else {
            return Err(format!("invalid SCAN response = {reply:?}"));
        };
        let [Reply::Bulk(Some(next)), Reply::Array(Some(keys))] = parts.as_slice() else {
            return Err(format!("invalid SCAN response = {parts:?}"));
        };
        for k in keys {
            if let Reply::Bulk(Some(key)) = k {
                slots.entry(slot_of(key, nslots)).or_default().insert(key.clone());
            }
        }
        if next.as_slice() == b"0" {
            return Ok(slots);
        }
        cursor.clone_from(next);
    }
}

/// The equivalent of codis-server's `SLOTSINFO` for a redis-server stand-in: keys per non-empty slot.
pub(crate) async fn slots_info(
    conn: &mut Conn,
    real: &str,
    nslots: usize,
    password: Option<&str>,
) -> Result<BTreeMap<usize, usize>, String> {
    ensure_fresh(conn, real, nslots, password).await?;
    let e = entry(real, nslots);
    let g = lock(&e);
    Ok(g.slots.iter().map(|(s, keys)| (*s, keys.len())).collect())
}
