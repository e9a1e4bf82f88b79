//! Client for the etcd that holds this addon's locks and primary fences.
//!
//! Actions that change Codis run concurrently (KubeBlocks may call `switchover`, `member-leave` and a sharding action
//! at once, and retries overlap their predecessors), so before touching a group they take a [`LockGuard`] here, and a
//! switchover writes its expected-primary fence here before it acts. Everything lives under one prefix per cluster
//! ([`cluster_prefix`]); every call is bounded by the timeout given to [`Etcd::connect`], and an etcd that cannot be
//! reached is reported as [`Error::Unavailable`] rather than waited for. Reads keep "absent" ([`None`], `false`) and
//! "could not tell" ([`Err`]) apart, because a fence that cannot be read must stop an action, not let it through.
//!
//! Locks follow etcd's own recipe (the one behind its lock service), done with plain KV calls so that the holder's
//! description can be stored as the value of its queue key: each contender puts `<lock>/<lease id>` bound to its own
//! lease; the key with the smallest create revision holds the lock, the others wait for the deletion of the key just
//! before theirs. The holder's create revision is its fencing token: it grows from holder to holder, and a write
//! fenced on it ([`Etcd::put_if_held`]) fails once the lease is gone. A holder that dies stops renewing its lease, etcd
//! deletes its key when the lease expires, and the next contender proceeds.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, KeyValue, LeaseKeepAliveStream, LeaseKeeper,
    PutOptions, SortOrder, SortTarget, Txn, TxnOp, WatchOptions,
};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::input::address::{Endpoints, HostPort};

/// The root of every key this addon writes.
pub const ROOT: &str = "/pika-kubeblocks";

// gRPC status codes (fixed by the gRPC specification) that tell "etcd cannot be reached" from "etcd said no".
const GRPC_CANCELLED: i32 = 1;
const GRPC_NOT_FOUND: i32 = 5;
const GRPC_DEADLINE_EXCEEDED: i32 = 4;
const GRPC_UNAVAILABLE: i32 = 14;

/// Failures talking to etcd.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No endpoint was given (`ETCD_ENDPOINTS` empty).
    #[error("no etcd endpoints given")]
    NoEndpoints,
    /// An endpoint is not a valid `host:port` or URL.
    #[error("invalid etcd endpoints {endpoints}")]
    InvalidEndpoints {
        /// The endpoints, comma-separated.
        endpoints: String,
        /// Why they were rejected.
        #[source]
        source: etcd_client::Error,
    },
    /// etcd could not be reached, or did not answer within the timeout.
    #[error("etcd at {endpoints} is unavailable: {message}")]
    Unavailable {
        /// The endpoints, comma-separated.
        endpoints: String,
        /// The step that failed and why.
        message: String,
    },
    /// etcd answered a request with an error.
    #[error("etcd refused to {step} {key}")]
    Request {
        /// What was being done (`put`, `get`, `grant a lease for`, ...).
        step: &'static str,
        /// The key (or lock) concerned.
        key: String,
        /// etcd's answer.
        #[source]
        source: etcd_client::Error,
    },
    /// A value is not UTF-8 text, so it cannot be one this addon wrote.
    #[error("etcd key {key} holds a value that is not utf-8 text")]
    NotText {
        /// The key.
        key: String,
    },
    /// Another holder kept the lock for the whole wait.
    #[error("lock {key} is busy{}", holder_note(.holder))]
    LockBusy {
        /// The lock.
        key: String,
        /// The current holder's description, when it could be read.
        holder: Option<String>,
    },
    /// The lease of a contender expired before it got the lock (its keep-alive could not reach etcd in time).
    #[error("lost lock {key} while waiting for it: lease {lease:x} expired")]
    LockLost {
        /// The lock.
        key: String,
        /// The contender's lease.
        lease: i64,
    },
}

#[allow(clippy::ref_option)] // thiserror hands fields over by reference
fn holder_note(holder: &Option<String>) -> String {
    holder.as_ref().map_or_else(|| " (holder unknown)".to_owned(), |h| format!(": held by {h}"))
}

/// The prefix of every key of one cluster, with a trailing `/`: `/pika-kubeblocks/<namespace>/<cluster>/`.
///
/// Callers append their own part (`format!("{prefix}locks/topology")`); [`Etcd::list`] over the prefix sees nothing
/// of a cluster whose name merely starts with this one's.
#[must_use]
pub fn cluster_prefix(namespace: &str, cluster: &str) -> String {
    format!("{ROOT}/{namespace}/{cluster}/")
}

/// One stored value with its metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The value.
    pub value: String,
    /// Revision at which the key was created (stays the same across updates; new after a delete).
    pub create_revision: i64,
    /// Revision of the last change.
    pub mod_revision: i64,
    /// The lease the key is bound to, `0` for none.
    pub lease: i64,
}

impl Entry {
    fn from_kv(key: &str, kv: &KeyValue) -> Result<Self, Error> {
        let value = kv.value_str().map_err(|_| Error::NotText { key: key.to_owned() })?;
        Ok(Self {
            value: value.to_owned(),
            create_revision: kv.create_revision(),
            mod_revision: kv.mod_revision(),
            lease: kv.lease(),
        })
    }
}

/// A connection to etcd; cheap to clone.
#[derive(Clone)]
pub struct Etcd {
    client: Client,
    endpoints: String,
    timeout: Duration,
}

impl fmt::Debug for Etcd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Etcd")
            .field("endpoints", &self.endpoints)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// What etcd said to one keep-alive.
enum Renewal {
    Alive,
    Gone,
    Failed,
}

impl Etcd {
    /// Connects to `endpoints` and checks that etcd answers.
    ///
    /// `timeout` bounds the connection and this check together, and afterwards every single request; an etcd that
    /// is down or unreachable yields [`Error::Unavailable`] within it.
    pub async fn connect(endpoints: &Endpoints, timeout: Duration) -> Result<Etcd, Error> {
        if endpoints.is_empty() {
            return Err(Error::NoEndpoints);
        }
        let joined = endpoints.to_string();
        let endpoints: Vec<String> = endpoints.iter().map(HostPort::to_string).collect();
        let options = ConnectOptions::new().with_connect_timeout(timeout).with_timeout(timeout);
        // One deadline for connecting and checking, so a dead etcd costs `timeout` and not twice that.
        let attempt = async {
            let mut client = Client::connect(&endpoints, Some(options)).await?;
            client.status().await?;
            Ok::<_, etcd_client::Error>(client)
        };
        match tokio::time::timeout(timeout, attempt).await {
            Ok(Ok(client)) => Ok(Etcd { client, endpoints: joined, timeout }),
            Ok(Err(e @ (etcd_client::Error::InvalidArgs(_) | etcd_client::Error::InvalidUri(_)))) => {
                Err(Error::InvalidEndpoints { endpoints: joined, source: e })
            }
            Ok(Err(e)) => Err(Error::Unavailable { endpoints: joined, message: format!("cannot connect: {e}") }),
            Err(_) => Err(Error::Unavailable { endpoints: joined, message: format!("no answer within {timeout:?}") }),
        }
    }

    /// The timeout of every request.
    #[must_use]
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sets `key` to `value`, bound to a fresh lease of `ttl` when given (the key then disappears `ttl` after the
    /// write unless written again); returns the revision of the write.
    pub async fn put(&self, key: &str, value: &str, ttl: Option<Duration>) -> Result<i64, Error> {
        crate::failpoint::step("etcd put");
        let lease = self.lease_for(key, ttl).await?;
        let mut client = self.client.clone();
        let resp = self.call("put", key, client.put(key, value, Some(put_options(lease)))).await?;
        Ok(resp.header().map_or(0, etcd_client::ResponseHeader::revision))
    }

    /// The entry at `key`, [`None`] when there is none.
    ///
    /// An error means "unknown", never "absent": a caller guarding an action on a fence must not act on it.
    pub async fn get(&self, key: &str) -> Result<Option<Entry>, Error> {
        let mut client = self.client.clone();
        let resp = self.call("get", key, client.get(key, None)).await?;
        resp.kvs().first().map(|kv| Entry::from_kv(key, kv)).transpose()
    }

    /// Deletes `key`; `true` when it existed.
    pub async fn delete(&self, key: &str) -> Result<bool, Error> {
        crate::failpoint::step("etcd delete");
        let mut client = self.client.clone();
        let resp = self.call("delete", key, client.delete(key, None)).await?;
        Ok(resp.deleted() > 0)
    }

    /// Every entry whose key starts with `prefix`, in key order.
    pub async fn list(&self, prefix: &str) -> Result<Vec<(String, Entry)>, Error> {
        let mut client = self.client.clone();
        let options = GetOptions::new().with_prefix().with_sort(SortTarget::Key, SortOrder::Ascend);
        let resp = self.call("list", prefix, client.get(prefix, Some(options))).await?;
        resp.kvs()
            .iter()
            .map(|kv| {
                let key = kv.key_str().map_err(|_| Error::NotText { key: prefix.to_owned() })?.to_owned();
                let entry = Entry::from_kv(&key, kv)?;
                Ok((key, entry))
            })
            .collect()
    }

    /// Creates `key` with `value` (bound to a lease of `ttl` when given) only if it does not exist; `true` when
    /// written.
    pub async fn put_if_absent(&self, key: &str, value: &str, ttl: Option<Duration>) -> Result<bool, Error> {
        crate::failpoint::step("etcd put_if_absent");
        self.compare_and_put(key, None, value, ttl).await
    }

    /// Sets `key` to `value` only if its current value is `expected` (`None`: only if the key is absent), in one
    /// transaction; `true` when written.
    ///
    /// With `ttl` the new value is bound to a fresh lease, so a fence whose writer fails expires on its own.
    pub async fn compare_and_put(
        &self,
        key: &str,
        expected: Option<&str>,
        value: &str,
        ttl: Option<Duration>,
    ) -> Result<bool, Error> {
        crate::failpoint::step("etcd compare_and_put");
        let compare = match expected {
            None => Compare::create_revision(key, CompareOp::Equal, 0),
            // etcd fails a value comparison on a missing key, so "absent" never matches an expected value.
            Some(expected) => Compare::value(key, CompareOp::Equal, expected),
        };
        let lease = self.lease_for(key, ttl).await?;
        let txn = Txn::new().when([compare]).and_then([TxnOp::put(key, value, Some(put_options(lease)))]);
        let written = self.txn("compare and put", key, txn).await?;
        if !written && lease != 0 {
            // Nothing is bound to the unused lease; revoking it only saves etcd the bookkeeping until it expires.
            let mut client = self.client.clone();
            let _ = self.call("revoke the unused lease of", key, client.lease_revoke(lease)).await;
        }
        Ok(written)
    }

    /// Deletes `key` only if its value is `expected`; `true` when deleted. Lets the writer of a fence remove its
    /// own fence without removing a newer one written by someone else.
    pub async fn delete_if_value(&self, key: &str, expected: &str) -> Result<bool, Error> {
        crate::failpoint::step("etcd delete_if_value");
        let txn =
            Txn::new().when([Compare::value(key, CompareOp::Equal, expected)]).and_then([TxnOp::delete(key, None)]);
        self.txn("delete if value matches", key, txn).await
    }

    /// Takes the lock `key`, waiting at most `wait` for the current holder; `holder` describes this process (pod,
    /// action) and is what a contender that gives up reports.
    ///
    /// The lock is bound to a lease of `ttl` (etcd counts whole seconds and raises very short TTLs to its minimum,
    /// about 2 s), renewed every third of it by a background task for as long as the guard lives. A holder that
    /// crashes frees the lock after the TTL. On [`Error::LockBusy`] this contender's lease is revoked, leaving
    /// nothing behind.
    ///
    /// Contenders queue under `<key>/`, so no lock may be named like another one followed by `/` (`.../locks/a`
    /// and `.../locks/a/b`): use flat names below one prefix.
    pub async fn lock(&self, key: &str, ttl: Duration, wait: Duration, holder: &str) -> Result<LockGuard, Error> {
        crate::failpoint::step("etcd lock");
        self.acquire(key, ttl, wait, holder, true).await
    }

    async fn acquire(
        &self,
        key: &str,
        ttl: Duration,
        wait: Duration,
        holder: &str,
        keep_alive: bool,
    ) -> Result<LockGuard, Error> {
        let deadline = Instant::now() + wait;
        let (lease, granted) = self.grant(key, ttl).await?;
        let lost = Arc::new(AtomicBool::new(false));
        let renewals =
            keep_alive.then(|| tokio::spawn(keep_lease_alive(self.client.clone(), lease, granted, Arc::clone(&lost))));
        let mut guard = LockGuard {
            etcd: self.clone(),
            key: key.to_owned(),
            queue_key: format!("{key}/{lease:x}"),
            holder: holder.to_owned(),
            lease,
            ttl: granted,
            fence: 0,
            lost,
            keepalive: renewals,
            released: false,
        };
        match self.contend(&mut guard, deadline).await {
            Ok(()) => Ok(guard),
            // etcd is gone: do not spend another timeout on a revoke; dropping the guard stops the renewals and
            // tries the revoke in the background, and the lease expires on its own anyway.
            Err(e @ Error::Unavailable { .. }) => Err(e),
            Err(e) => {
                let _ = guard.release().await;
                Err(e)
            }
        }
    }

    /// Queues the guard's key and waits until it is first in line or the deadline passes.
    async fn contend(&self, guard: &mut LockGuard, deadline: Instant) -> Result<(), Error> {
        let mut client = self.client.clone();
        let options = Some(PutOptions::new().with_lease(guard.lease));
        let resp = self
            .call("queue for lock", &guard.key, client.put(guard.queue_key.as_str(), guard.holder.as_str(), options))
            .await?;
        // The key is new (its lease is new), so the revision of this put is its create revision.
        guard.fence = resp.header().map_or(0, etcd_client::ResponseHeader::revision);
        let prefix = format!("{}/", guard.key);
        loop {
            // The contender queued just before this one; none means this one is first.
            let options = GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_max_create_revision(guard.fence - 1)
                .with_limit(1);
            let resp =
                self.call("read the queue of lock", &guard.key, client.get(prefix.as_str(), Some(options))).await?;
            let Some(before) = resp.kvs().first() else { break };
            let before = before.key().to_vec();
            // Watching from the revision just read cannot miss a deletion that happens in between.
            let from = resp.header().map_or(0, etcd_client::ResponseHeader::revision) + 1;
            let remaining = deadline.saturating_duration_since(Instant::now());
            let Ok(result) = tokio::time::timeout(remaining, self.deleted(&guard.key, before, from)).await else {
                // The holder may have left just now: the wait is over, but the turn may have come.
                match self.first_in_line(&prefix).await {
                    Some((first, _)) if first == guard.queue_key => break,
                    first => return Err(Error::LockBusy { key: guard.key.clone(), holder: first.map(|(_, h)| h) }),
                }
            };
            result?;
        }
        // The lease may have expired while waiting (renewals failing); then the key is gone and so is the turn.
        match self.get(&guard.queue_key).await? {
            Some(entry) if entry.lease == guard.lease && entry.create_revision == guard.fence => Ok(()),
            _ => {
                guard.lost.store(true, Ordering::SeqCst);
                Err(Error::LockLost { key: guard.key.clone(), lease: guard.lease })
            }
        }
    }

    /// Returns once `key` is deleted at or after revision `from`, or when the watch ends (the caller re-reads).
    async fn deleted(&self, lock: &str, key: Vec<u8>, from: i64) -> Result<(), Error> {
        let mut client = self.client.clone();
        let options = WatchOptions::new().with_start_revision(from);
        let mut stream = self.call("watch the queue of lock", lock, client.watch(key, Some(options))).await?;
        loop {
            match stream.message().await {
                Ok(Some(resp)) => {
                    // Cancelled (e.g. the revision was compacted): re-reading the queue is always safe.
                    if resp.canceled() || resp.events().iter().any(|e| e.event_type() == EventType::Delete) {
                        return Ok(());
                    }
                }
                Ok(None) => return Ok(()),
                Err(e) => return Err(self.classify("watch the queue of lock", lock, e)),
            }
        }
    }

    /// The key and holder description of the first in the queue (the holder), if they can be read.
    async fn first_in_line(&self, prefix: &str) -> Option<(String, String)> {
        let mut client = self.client.clone();
        let options = GetOptions::new().with_prefix().with_sort(SortTarget::Create, SortOrder::Ascend).with_limit(1);
        let resp = self.call("read the holder of lock", prefix, client.get(prefix, Some(options))).await.ok()?;
        let first = resp.kvs().first()?;
        Some((first.key_str().ok()?.to_owned(), first.value_str().ok()?.to_owned()))
    }

    async fn grant(&self, key: &str, ttl: Duration) -> Result<(i64, Duration), Error> {
        let mut client = self.client.clone();
        let resp = self.call("grant a lease for", key, client.lease_grant(lease_seconds(ttl), None)).await?;
        let granted = u64::try_from(resp.ttl()).unwrap_or(0).max(1);
        Ok((resp.id(), Duration::from_secs(granted)))
    }

    /// A fresh lease for a write with a TTL, `0` (no lease) without one.
    async fn lease_for(&self, key: &str, ttl: Option<Duration>) -> Result<i64, Error> {
        match ttl {
            Some(ttl) => Ok(self.grant(key, ttl).await?.0),
            None => Ok(0),
        }
    }

    async fn txn(&self, step: &'static str, key: &str, txn: Txn) -> Result<bool, Error> {
        let mut client = self.client.clone();
        Ok(self.call(step, key, client.txn(txn)).await?.succeeded())
    }

    /// Runs one request within the timeout, naming the step and key in any error.
    async fn call<T>(
        &self,
        step: &'static str,
        key: &str,
        request: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, Error> {
        match tokio::time::timeout(self.timeout, request).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(self.classify(step, key, e)),
            Err(_) => Err(self.unavailable(format!("no answer within {:?} to {step} {key}", self.timeout))),
        }
    }

    fn classify(&self, step: &'static str, key: &str, error: etcd_client::Error) -> Error {
        let unreachable = match &error {
            etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
            etcd_client::Error::GRpcStatus(status) => {
                matches!(status.code() as i32, GRPC_CANCELLED | GRPC_DEADLINE_EXCEEDED | GRPC_UNAVAILABLE)
            }
            _ => false,
        };
        if unreachable {
            self.unavailable(format!("{step} {key}: {error}"))
        } else {
            Error::Request { step, key: key.to_owned(), source: error }
        }
    }

    fn unavailable(&self, message: String) -> Error {
        Error::Unavailable { endpoints: self.endpoints.clone(), message }
    }
}

fn put_options(lease: i64) -> PutOptions {
    if lease == 0 {
        PutOptions::new()
    } else {
        PutOptions::new().with_lease(lease)
    }
}

/// etcd leases count whole seconds: round up, at least one.
fn lease_seconds(ttl: Duration) -> i64 {
    let seconds = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(seconds.max(1)).unwrap_or(i64::MAX)
}

/// Renews `lease` every third of its TTL until aborted, or until the lease is known to be gone (etcd says so, or no
/// renewal succeeded for a whole TTL); then it flags `lost` and stops, so the holder stops trusting its lock.
async fn keep_lease_alive(client: Client, lease: i64, ttl: Duration, lost: Arc<AtomicBool>) {
    let period = (ttl / 3).max(Duration::from_millis(100));
    let mut client = client;
    let mut stream: Option<(LeaseKeeper, LeaseKeepAliveStream)> = None;
    let mut confirmed = Instant::now();
    loop {
        tokio::time::sleep(period).await;
        let renewal = tokio::time::timeout(period, renew(&mut client, lease, &mut stream)).await;
        match renewal {
            Ok(Renewal::Alive) => confirmed = Instant::now(),
            Ok(Renewal::Gone) => break,
            Ok(Renewal::Failed) | Err(_) => {
                // Start a new stream next time: the old one may be bound to a dead connection.
                stream = None;
                if confirmed.elapsed() >= ttl {
                    break;
                }
            }
        }
    }
    lost.store(true, Ordering::SeqCst);
    tracing::warn!(lease = format!("{lease:x}"), "lock lease lost: etcd no longer renews it");
}

async fn renew(client: &mut Client, lease: i64, stream: &mut Option<(LeaseKeeper, LeaseKeepAliveStream)>) -> Renewal {
    if stream.is_none() {
        match client.lease_keep_alive(lease).await {
            Ok(opened) => *stream = Some(opened),
            Err(_) => return Renewal::Failed,
        }
    }
    let Some((keeper, responses)) = stream.as_mut() else { return Renewal::Failed };
    if keeper.keep_alive().await.is_err() {
        return Renewal::Failed;
    }
    match responses.message().await {
        // etcd answers a keep-alive of an unknown (expired or revoked) lease with TTL 0.
        Ok(Some(resp)) if resp.ttl() > 0 => Renewal::Alive,
        Ok(Some(_)) => Renewal::Gone,
        Ok(None) | Err(_) => Renewal::Failed,
    }
}

/// A held lock. Renewed in the background while it lives; [`LockGuard::release`] frees it at once, dropping it
/// without release stops the renewals (and tries a revoke in the background) so that it expires within its TTL.
pub struct LockGuard {
    etcd: Etcd,
    key: String,
    queue_key: String,
    holder: String,
    lease: i64,
    ttl: Duration,
    fence: i64,
    lost: Arc<AtomicBool>,
    keepalive: Option<JoinHandle<()>>,
    released: bool,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.key)
            .field("holder", &self.holder)
            .field("lease", &format_args!("{:x}", self.lease))
            .field("fence", &self.fence)
            .field("released", &self.released)
            .finish_non_exhaustive()
    }
}

impl LockGuard {
    /// The fencing token: the etcd revision at which this holder queued for the lock. It is larger for every later
    /// holder of the same lock, so a write stamped with it can be told apart from one by an earlier, stale holder.
    #[must_use]
    pub fn fence(&self) -> i64 {
        self.fence
    }

    /// The lock's name, as given to [`Etcd::lock`].
    #[must_use]
    pub fn key(&self) -> &str {
        &self.key
    }

    /// This holder's description, as given to [`Etcd::lock`].
    #[must_use]
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// The lease TTL etcd granted.
    #[must_use]
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Whether the lock is still held: not released, its lease still renewed, and its key still in etcd. Any doubt
    /// (etcd unreachable) counts as "not held".
    pub async fn is_held(&self) -> bool {
        if self.released || self.lost.load(Ordering::SeqCst) {
            return false;
        }
        matches!(
            self.etcd.get(&self.queue_key).await,
            Ok(Some(entry)) if entry.lease == self.lease && entry.create_revision == self.fence
        )
    }

    /// Frees the lock now by revoking its lease. Idempotent; a lease that already expired counts as released. When
    /// etcd cannot be reached the error is returned and the lock expires within its TTL.
    pub async fn release(&mut self) -> Result<(), Error> {
        if let Some(task) = self.keepalive.take() {
            task.abort();
        }
        if self.released {
            return Ok(());
        }
        let mut client = self.etcd.client.clone();
        match self.etcd.call("release lock", &self.key, client.lease_revoke(self.lease)).await {
            Ok(_) => {}
            Err(Error::Request { source: etcd_client::Error::GRpcStatus(status), .. })
                if status.code() as i32 == GRPC_NOT_FOUND => {}
            Err(e) => return Err(e),
        }
        self.released = true;
        Ok(())
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(task) = self.keepalive.take() {
            task.abort();
        }
        if self.released {
            return;
        }
        // Never block here: a background revoke frees the lock early if the runtime lives on; if it does not, the
        // lease simply expires.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let mut client = self.etcd.client.clone();
            let (lease, timeout) = (self.lease, self.etcd.timeout);
            runtime.spawn(async move {
                let _ = tokio::time::timeout(timeout, client.lease_revoke(lease)).await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use testbed::EtcdServer;

    const TIMEOUT: Duration = Duration::from_secs(2);
    const TTL: Duration = Duration::from_secs(2);

    fn endpoints(server: &EtcdServer) -> Endpoints {
        Endpoints::parse(&server.endpoint()).expect("the test etcd's endpoint")
    }

    async fn connect(server: &EtcdServer) -> Etcd {
        Etcd::connect(&endpoints(server), TIMEOUT).await.expect("etcd connects")
    }

    fn lock_key(name: &str) -> String {
        format!("{}locks/{name}", cluster_prefix("test-ns", "test-cluster"))
    }

    #[test]
    fn cluster_prefix_is_one_directory_per_cluster() {
        assert_eq!(cluster_prefix("ns-a", "pk"), "/pika-kubeblocks/ns-a/pk/");
        assert!(!cluster_prefix("ns-a", "pk2").starts_with(&cluster_prefix("ns-a", "pk")));
    }

    #[test]
    fn lease_ttls_round_up_to_whole_seconds() {
        assert_eq!(lease_seconds(Duration::from_millis(1)), 1);
        assert_eq!(lease_seconds(Duration::ZERO), 1);
        assert_eq!(lease_seconds(Duration::from_millis(2500)), 3);
        assert_eq!(lease_seconds(Duration::from_secs(15)), 15);
    }

    #[test]
    fn busy_lock_messages_name_the_holder() {
        let busy = Error::LockBusy { key: "/k".into(), holder: Some("pod-1 switchover".into()) };
        assert_eq!(busy.to_string(), "lock /k is busy: held by pod-1 switchover");
        let unknown = Error::LockBusy { key: "/k".into(), holder: None };
        assert_eq!(unknown.to_string(), "lock /k is busy (holder unknown)");
    }

    #[tokio::test]
    async fn connect_without_endpoints_is_refused() {
        let err = Etcd::connect(&Endpoints::parse(" ").unwrap(), TIMEOUT).await.expect_err("no endpoints");
        assert!(matches!(err, Error::NoEndpoints), "{err:?}");
    }

    #[tokio::test]
    async fn a_held_lock_makes_a_second_contender_busy_naming_the_first_holder() {
        let server = EtcdServer::start();
        let etcd = connect(&server).await;
        let key = lock_key("exclusive");
        let mut first = etcd.lock(&key, TTL, TIMEOUT, "pod-a switchover").await.expect("first lock");
        assert!(first.is_held().await);

        let other = connect(&server).await;
        let started = std::time::Instant::now();
        let err = other.lock(&key, TTL, Duration::from_millis(300), "pod-b member-leave").await.expect_err("busy");
        assert!(started.elapsed() < Duration::from_secs(2), "busy took {:?}", started.elapsed());
        match err {
            Error::LockBusy { key: busy, holder } => {
                assert_eq!(busy, key);
                assert_eq!(holder.as_deref(), Some("pod-a switchover"));
            }
            other => panic!("expected LockBusy, got {other:?}"),
        }
        // The loser left nothing in the queue.
        let queue = etcd.list(&format!("{key}/")).await.expect("list queue");
        assert_eq!(queue.len(), 1, "{queue:?}");

        first.release().await.expect("release");
        first.release().await.expect("release is idempotent");
        assert!(!first.is_held().await);
        assert!(etcd.list(&format!("{key}/")).await.expect("list queue").is_empty());
    }

    #[tokio::test]
    async fn a_released_lock_can_be_taken_and_the_fence_grows_from_holder_to_holder() {
        let server = EtcdServer::start();
        let etcd = connect(&server).await;
        let key = lock_key("fence");
        let mut fences = Vec::new();
        for round in 0..3 {
            let mut guard = etcd.lock(&key, TTL, TIMEOUT, &format!("holder {round}")).await.expect("lock");
            // Unrelated writes in between must not break the order.
            etcd.put(&format!("{key}-noise"), "x", None).await.expect("put");
            fences.push(guard.fence());
            guard.release().await.expect("release");
        }
        assert!(fences.windows(2).all(|w| w[0] < w[1]), "fences {fences:?}");
    }

    #[tokio::test]
    async fn a_waiting_contender_gets_the_lock_as_soon_as_the_holder_releases() {
        let server = EtcdServer::start();
        let etcd = connect(&server).await;
        let key = lock_key("handover");
        let mut first = etcd.lock(&key, TTL, TIMEOUT, "first").await.expect("first lock");
        let other = connect(&server).await;
        let waiter = {
            let key = key.clone();
            tokio::spawn(async move { other.lock(&key, TTL, Duration::from_secs(5), "second").await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released_at = std::time::Instant::now();
        first.release().await.expect("release");
        let mut second = waiter.await.expect("join").expect("second lock");
        assert!(released_at.elapsed() < Duration::from_secs(1), "handover took {:?}", released_at.elapsed());
        assert!(second.fence() > first.fence());
        assert!(second.is_held().await);
        second.release().await.expect("release");
    }

    #[tokio::test]
    async fn a_crashed_holder_loses_the_lock_after_its_ttl() {
        let server = EtcdServer::start();
        let etcd = connect(&server).await;
        let key = lock_key("crash");
        // A holder whose process died: its lease is never renewed and never revoked.
        let crashed = etcd.acquire(&key, TTL, TIMEOUT, "crashed pod", false).await.expect("lock");
        let crashed_fence = crashed.fence();
        let ttl = crashed.ttl();
        std::mem::forget(crashed);

        let other = connect(&server).await;
        let started = std::time::Instant::now();
        let mut next = other.lock(&key, TTL, ttl + Duration::from_secs(5), "next pod").await.expect("next lock");
        let waited = started.elapsed();
        // etcd checks for expired leases about twice a second.
        assert!(waited <= ttl + Duration::from_secs(2), "waited {waited:?} for a ttl of {ttl:?}");
        assert!(next.fence() > crashed_fence);
        next.release().await.expect("release");
    }

    #[tokio::test]
    async fn a_kept_alive_lock_outlives_its_ttl() {
        let server = EtcdServer::start();
        let etcd = connect(&server).await;
        let key = lock_key("renewed");
        let mut guard = etcd.lock(&key, TTL, TIMEOUT, "long runner").await.expect("lock");
        tokio::time::sleep(guard.ttl() * 2 + Duration::from_millis(500)).await;
        assert!(guard.is_held().await, "the renewed lease expired");
        let err = etcd.lock(&key, TTL, Duration::from_millis(200), "other").await.expect_err("still busy");
        assert!(matches!(err, Error::LockBusy { .. }), "{err:?}");
        guard.release().await.expect("release");
    }

    #[tokio::test]
    async fn a_dropped_guard_frees_the_lock_within_its_ttl() {
        let server = EtcdServer::start();
        let etcd = connect(&server).await;
        let key = lock_key("dropped");
        let guard = etcd.lock(&key, TTL, TIMEOUT, "dropped").await.expect("lock");
        let ttl = guard.ttl();
        drop(guard);
        let started = std::time::Instant::now();
        let mut next = etcd.lock(&key, TTL, ttl + Duration::from_secs(3), "next").await.expect("next lock");
        assert!(started.elapsed() <= ttl + Duration::from_secs(2), "waited {:?}", started.elapsed());
        next.release().await.expect("release");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_contenders_never_hold_the_lock_at_the_same_time() {
        let server = EtcdServer::start();
        let key = lock_key("contended");
        let mut tasks = Vec::new();
        for name in ["contender-a", "contender-b"] {
            let etcd = connect(&server).await;
            let key = key.clone();
            tasks.push(tokio::spawn(async move {
                let mut held = Vec::new();
                for round in 0..20 {
                    let mut guard =
                        etcd.lock(&key, TTL, Duration::from_secs(10), &format!("{name} {round}")).await.expect("lock");
                    let start = std::time::Instant::now();
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    assert!(guard.is_held().await);
                    let end = std::time::Instant::now();
                    held.push((start, end, guard.fence()));
                    guard.release().await.expect("release");
                }
                held
            }));
        }
        let mut intervals = Vec::new();
        for task in tasks {
            intervals.extend(task.await.expect("contender finished"));
        }
        intervals.sort_by_key(|(start, _, _)| *start);
        assert_eq!(intervals.len(), 40);
        for pair in intervals.windows(2) {
            let ((_, end, fence), (next_start, _, next_fence)) = (pair[0], pair[1]);
            assert!(end <= next_start, "two holders overlapped");
            assert!(fence < next_fence, "fences out of order: {fence} then {next_fence}");
        }
    }

    #[tokio::test]
    async fn a_put_with_a_ttl_expires() {
        let server = EtcdServer::start();
        let etcd = connect(&server).await;
        let key = format!("{}fence/expiring", cluster_prefix("test-ns", "test-cluster"));
        let revision = etcd.put(&key, "pod-1", Some(Duration::from_secs(1))).await.expect("put");
        let entry = etcd.get(&key).await.expect("get").expect("present");
        assert_eq!(entry.value, "pod-1");
        assert_eq!(entry.mod_revision, revision);
        assert_ne!(entry.lease, 0);

        let started = std::time::Instant::now();
        while etcd.get(&key).await.expect("get").is_some() {
            assert!(started.elapsed() < Duration::from_secs(5), "the key did not expire");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        let permanent = etcd.put(&key, "pod-2", None).await.expect("put");
        let entry = etcd.get(&key).await.expect("get").expect("present");
        assert_eq!((entry.lease, entry.create_revision), (0, permanent));
        assert!(etcd.delete(&key).await.expect("delete"));
        assert!(!etcd.delete(&key).await.expect("delete again"));
    }

    #[tokio::test]
    async fn compare_and_put_writes_only_over_what_was_expected() {
        let server = EtcdServer::start();
        let etcd = connect(&server).await;
        let key = format!("{}fence/group-3", cluster_prefix("test-ns", "test-cluster"));

        assert!(!etcd.compare_and_put(&key, Some("pod-1"), "pod-2", None).await.expect("cas"), "absent != pod-1");
        assert!(etcd.compare_and_put(&key, None, "pod-1", None).await.expect("cas"), "absent as expected");
        assert!(!etcd.compare_and_put(&key, None, "pod-9", None).await.expect("cas"), "present, expected absent");
        assert!(!etcd.put_if_absent(&key, "pod-9", Some(TTL)).await.expect("put if absent"));
        assert!(!etcd.compare_and_put(&key, Some("pod-7"), "pod-9", None).await.expect("cas"), "mismatch");
        assert_eq!(etcd.get(&key).await.expect("get").expect("present").value, "pod-1");
        assert!(etcd.compare_and_put(&key, Some("pod-1"), "pod-2", Some(TTL)).await.expect("cas"), "match");
        let entry = etcd.get(&key).await.expect("get").expect("present");
        assert_eq!(entry.value, "pod-2");
        assert_ne!(entry.lease, 0, "the new value is bound to its own lease");

        let other = format!("{}fence/group-4", cluster_prefix("test-ns", "test-cluster"));
        assert!(etcd.put_if_absent(&other, "pod-5", None).await.expect("put if absent"));
        let listed = etcd.list(&format!("{}fence/", cluster_prefix("test-ns", "test-cluster"))).await.expect("list");
        let listed: Vec<_> = listed.into_iter().map(|(k, e)| (k, e.value)).collect();
        assert_eq!(listed, vec![(key.clone(), "pod-2".to_owned()), (other, "pod-5".to_owned())]);
    }

    #[tokio::test]
    async fn delete_if_value_leaves_a_newer_value_alone() {
        let server = EtcdServer::start();
        let etcd = connect(&server).await;
        let key = format!("{}fence/group-1", cluster_prefix("test-ns", "test-cluster"));
        assert!(!etcd.delete_if_value(&key, "pod-1").await.expect("delete absent"));
        etcd.put(&key, "pod-2", None).await.expect("put");
        assert!(!etcd.delete_if_value(&key, "pod-1").await.expect("delete mismatch"));
        assert_eq!(etcd.get(&key).await.expect("get").expect("still there").value, "pod-2");
        assert!(etcd.delete_if_value(&key, "pod-2").await.expect("delete match"));
        assert!(etcd.get(&key).await.expect("get").is_none());
    }

    #[tokio::test]
    async fn an_etcd_that_is_down_fails_fast_as_unavailable() {
        let mut server = EtcdServer::start();
        let etcd = connect(&server).await;
        server.stop();

        let started = std::time::Instant::now();
        let err = Etcd::connect(&endpoints(&server), TIMEOUT).await.expect_err("etcd is down");
        assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
        assert!(started.elapsed() < TIMEOUT + Duration::from_millis(500), "connect took {:?}", started.elapsed());
        assert!(err.to_string().contains(&server.endpoint()), "{err}");

        let started = std::time::Instant::now();
        let err = etcd.lock(&lock_key("down"), TTL, Duration::from_secs(10), "pod").await.expect_err("etcd is down");
        assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
        assert!(started.elapsed() < TIMEOUT + Duration::from_millis(500), "lock took {:?}", started.elapsed());

        let started = std::time::Instant::now();
        let err = etcd.get("/pika-kubeblocks/x").await.expect_err("etcd is down");
        assert!(matches!(err, Error::Unavailable { .. }), "a read error is not 'absent': {err:?}");
        assert!(started.elapsed() < TIMEOUT + Duration::from_millis(500), "get took {:?}", started.elapsed());

        server.resume();
        let etcd = connect(&server).await;
        assert!(etcd.get("/pika-kubeblocks/x").await.expect("etcd is back").is_none());
    }
}
