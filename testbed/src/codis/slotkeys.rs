//! The per-slot key index codis-server keeps and redis-server lacks, so the double can migrate a slot's keys between
//! real redis-servers in batches, the way `SLOTSMGRTTAGSLOT-ASYNC` does, and answer the equivalent of `SLOTSINFO`.
//!
//! codis-server buckets every key by slot as it is written. A redis-server stand-in cannot, so the index is built by
//! one full `SCAN` of a backend and then kept current by what the test bed itself does to that backend:
//! - the proxy doubles note every key they write (before the write goes out, so a write racing a scan is kept);
//! - a migration batch moves its keys from the source's index to the target's.
//!
//! An index is trusted only while the backend's data lineage is unchanged: its role and its `master_replid` (a
//! restart, a promotion, or a resync from another master gives a new one, as the data set is replaced or forked).
//! Any change means a new `SCAN` before the next batch. This is what makes the index exact for proxy traffic: once a slot is
//! `migrating`, codis-proxy never creates a key of that slot on the source (it writes missing keys to the target),
//! so the source's keys of that slot are the scanned ones plus the noted ones. Keys written straight to a backend,
//! bypassing the proxies, after its last scan are not seen (codis-server would migrate them); see the README.
//!
//! Entries may hold keys that no longer exist (a failed write, a delete); `MIGRATE` skips missing keys, so they
//! only make the reported "keys left" an upper bound.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use super::resp::{Conn, Reply};
use super::slothash::slot_of;

/// The index of one backend (by real address and slot count).
#[derive(Debug, Default)]
struct BackendKeys {
    /// `(role, master_replid)` at the last scan; `None` until scanned.
    lineage: Option<(String, String)>,
    /// Keys by slot; only non-empty slots.
    slots: HashMap<usize, HashSet<Vec<u8>>>,
    /// While a scan runs: keys noted meanwhile, merged into the scan's result.
    noted_during_scan: Option<Vec<(usize, Vec<u8>)>>,
}

impl BackendKeys {
    fn insert(&mut self, slot: usize, key: Vec<u8>) {
        if let Some(noted) = &mut self.noted_during_scan {
            noted.push((slot, key.clone()));
        }
        self.slots.entry(slot).or_default().insert(key);
    }
}

type Registry = Mutex<HashMap<(String, usize), Arc<Mutex<BackendKeys>>>>;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Registry::default)
}

fn entry(real: &str, nslots: usize) -> Arc<Mutex<BackendKeys>> {
    let mut reg = registry().lock().unwrap_or_else(PoisonError::into_inner);
    reg.entry((real.to_owned(), nslots)).or_default().clone()
}

fn lock(e: &Mutex<BackendKeys>) -> MutexGuard<'_, BackendKeys> {
    e.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Records that `key` is (about to be) written to the backend at `real`.
pub(crate) fn note(real: &str, nslots: usize, key: &[u8]) {
    let e = entry(real, nslots);
    lock(&e).insert(slot_of(key, nslots), key.to_vec());
}

/// Records that `keys` now live on `real` (a migration batch or a single-key move delivered them).
pub(crate) fn add_all(real: &str, nslots: usize, keys: &[Vec<u8>]) {
    let e = entry(real, nslots);
    let mut g = lock(&e);
    for k in keys {
        g.insert(slot_of(k, nslots), k.clone());
    }
}

/// Forgets `key` on `real` (a single-key move took it away).
pub(crate) fn forget(real: &str, nslots: usize, key: &[u8]) {
    let e = entry(real, nslots);
    let mut g = lock(&e);
    let slot = slot_of(key, nslots);
    if let Some(set) = g.slots.get_mut(&slot) {
        set.remove(key);
        if set.is_empty() {
            g.slots.remove(&slot);
        }
    }
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
        let slot = slot_of(&k, nslots);
        g.slots.entry(slot).or_default().insert(k);
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

/// `(role, master_replid)` of the server `conn` talks to. A restarted redis-server (no persistence here) starts with
/// a new replication id, so the id alone tells a restart too.
async fn lineage(conn: &mut Conn) -> Result<(String, String), String> {
    let reply = conn.request(&[b"INFO", b"replication"]).await?;
    let text = match reply {
        Reply::Error(e) => return Err(e),
        r => r.text().unwrap_or_default(),
    };
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')))
            .map(|v| v.trim().to_owned())
            .unwrap_or_default()
    };
    Ok((field("role"), field("master_replid")))
}

/// Makes sure the index of `real` (reached through `conn`) describes its current data set: scans it when it was
/// never scanned or its lineage changed since.
pub(crate) async fn ensure_fresh(conn: &mut Conn, real: &str, nslots: usize) -> Result<(), String> {
    let now = lineage(conn).await?;
    let e = entry(real, nslots);
    {
        let mut g = lock(&e);
        if g.lineage.as_ref() == Some(&now) {
            return Ok(());
        }
        g.noted_during_scan = Some(Vec::new());
    }
    let scanned = scan(conn, nslots).await;
    let mut g = lock(&e);
    let noted = g.noted_during_scan.take().unwrap_or_default();
    let mut slots = scanned?;
    for (slot, key) in noted {
        slots.entry(slot).or_default().insert(key);
    }
    g.slots = slots;
    g.lineage = Some(now);
    Ok(())
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
) -> Result<BTreeMap<usize, usize>, String> {
    ensure_fresh(conn, real, nslots).await?;
    let e = entry(real, nslots);
    let g = lock(&e);
    Ok(g.slots.iter().map(|(s, keys)| (*s, keys.len())).collect())
}
