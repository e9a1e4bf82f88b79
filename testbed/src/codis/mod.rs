//! A Codis dashboard test double: the HTTP API of `codis-dashboard` 3.2 (and, with [`DoubleOptions::fork`], of the
//! Pika fork) over real redis-server backends, so every test of the actions runs against Codis's wire contract
//! without Codis installed. Its behaviour follows the source of CodisLabs/codis at de1ad026 (pkg/topom) and is
//! checked value by value against two recordings of that build (`tests/conformance.rs`).
//!
//! # What it models
//! - Every dashboard route except the sentinel routes, with Codis's conventions (martini routing, `"OK"`,
//!   HTTP 800 `{"Cause", "Stack"}` errors with the recorded causes, checked in Codis's order, xauth first).
//! - Groups, servers, sync actions and promotes against **real** backends (`SLAVEOF` inside `MULTI` with
//!   `CONFIG SET masterauth`, `CONFIG REWRITE`, `CLIENT KILL TYPE normal`, as Codis sends it).
//! - The slot executor in rounds, as `ProcessSlotAction` runs them (see the `executor` module), with real key movement:
//!   each batch moves up to 500 keys of the slot from the source master to the target master
//!   (`SLOTSMGRTTAGSLOT-ASYNC` emulated with `MIGRATE ... KEYS` over a per-slot key index, see the `slotkeys` module),
//!   `slot_action.executor` counts batches on the wire, `interval` is slept between batches, and `group/promote`
//!   is refused with `slots-migration is running = N` while a batch runs.
//! - `group/add` checks the server with `SLOTSINFO`, computed by the double for redis-server stand-ins.
//! - A restart ([`CodisDouble::pause`] + [`CodisDouble::resume`], or [`CodisDouble::restart`]) keeps the model (the
//!   coordinator) and loses what Codis keeps in memory: `slot_action` (interval, disabled, progress), stats.
//! - Stats refreshed in the background over pooled connections (so a `CLIENT KILL` shows as `EOF` once, as in
//!   Codis), the rebalance planner, removal rules, promote rules and `out_of_sync`.
//! - Pika fork mode: extra GroupServer fields filled by the fork's three check loops, automatic failover of a dead
//!   master, the forced `SLAVEOF h p -f` re-attach that real backends reject, sync actions that leave the server
//!   offline. Checked against the real fork over real pikas (`real_pika::conformance` of pika-action's tests).
//! - Fault injection and test knobs: failed, slow or dropped requests; migration errors; holds at a precise point
//!   of a migration; a slot whose keys are deleted instead of moved; a stuck promote.
//!
//! Every Codis delay is scaled by one factor, `tick / 1 s` ([`DoubleOptions::tick`], 10 ms by default: 1/100).
//!
//! # What it does not model
//! See the crate's README for the exact list: no coordinator (memory only), no sentinels, only database 0 is
//! migrated, keys written straight to a backend (not through a proxy) after the double last scanned it are not
//! migrated, `replica_groups` priorities compare host strings instead of resolved IPs.

mod api;
mod executor;
pub mod model;
mod proxy_client;
mod rebalance;
pub(crate) mod resp;
pub mod slothash;
pub(crate) mod slotkeys;
mod state;
mod stats;
pub(crate) mod wire;

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::Request;
use tower::ServiceExt;

pub use model::{
    ErrorBody, Group, GroupServer, Promoting, PromotingState, Proxy, ProxyStats, ProxyStatsEntry, ServerAction,
    ServerActionState, ServerStats, Slot, SlotAction, SlotActionStats, SlotMapping, SlotState, TopomModel,
};
pub use state::{MigrationHold, Mutation};
pub use wire::{proxy_xauth, xauth};

use crate::httpd::{Dropped, Handler, Listener, Runtime};
use proxy_client::ProxyClient;
use resp::Conn;
use state::{KeyFault, State, Topo};

/// How to start a [`CodisDouble`].
#[derive(Clone, Debug)]
pub struct DoubleOptions {
    /// Product name (the xauth input). Default `codis-demo`.
    pub product: String,
    /// Number of slots. Default 1024.
    pub max_slot_num: usize,
    /// Server (or proxy admin) address as registered → real `host:port` to dial. Unmapped addresses are dialled as
    /// written. SLAVEOF targets are mapped too, so replicas are told their master's real address, and `master_addr`
    /// /`master_host`/`master_port` in INFO maps are mapped back to the registered spelling.
    pub overrides: BTreeMap<String, String>,
    /// `product_auth`: sent as `AUTH` and `masterauth` to backends, part of the proxy xauth.
    pub password: Option<String>,
    /// What Codis's 1 s becomes: every Codis delay is scaled by `tick / 1 s` (the executors' 1 s sleeps, the 10 ms
    /// between rounds, the 5 s after an error, `slot_action.interval`). Default 10 ms (1/100).
    pub tick: Duration,
    /// Pika fork mode (the dashboard of the `codis/` directory in OpenAtomFoundation/pika).
    pub fork: bool,
    /// Where to listen; a free loopback port when `None`.
    pub listen: Option<SocketAddr>,
    /// Stats refresh (and fork health check) period. Default 100 ms.
    pub stats_interval: Duration,
    /// How long one stats refresh waits for a server or proxy before reporting `timeout`. Default 1 s.
    pub stats_timeout: Duration,
    /// Dial timeout for backends (Codis: 1 s for `group/add`).
    pub dial_timeout: Duration,
    /// Timeout of every call to a proxy. Default 1 s.
    pub proxy_timeout: Duration,
    /// Fork: failed checks of a server already in state 1 (`recall_times`) before it is offline (state 2) and, a
    /// master, failed over. Default 10 (as the fork's `sentinel_master_dead_check_times`; the chart's is 127).
    pub dead_checks: u32,
    /// Fork: how often servers in state 0 are checked (`sentinel_check_server_state_interval`, 10 s). Checks run on
    /// a stats refresh, so never more often than `stats_interval`. Default 100 ms (10 s at the default tick).
    pub server_check_interval: Duration,
    /// Fork: how often servers in state 1 are checked again (`sentinel_check_master_failover_interval`, 2 s; the
    /// chart's is 3600 s while its failover is on). Default 20 ms (2 s at the default tick).
    pub failover_check_interval: Duration,
    /// Fork: how often servers in state 2 are checked (`sentinel_check_offline_server_interval`, 2 s). Default 20 ms.
    pub offline_check_interval: Duration,
    /// Most slots in one executor round. Default 100.
    pub migration_parallel_slots: usize,
    /// `semi-async` (default) or `sync`: the slots' `forward_method`.
    pub migration_method: String,
    /// The backends are redis-servers standing in for codis-server (default): the double computes what
    /// `SLOTSINFO` and `SLOTSMGRTTAGSLOT-ASYNC` would do itself. `false` sends those commands as Codis does (a real
    /// codis-server or Pika; redis-server then refuses `group/add` with its unknown-command error).
    pub redis_stand_ins: bool,
    /// The backends resolve the registered names themselves (real pods reading the bed's hosts file): `SLAVEOF` and
    /// migration targets are sent as registered, as Codis sends them; only the double's own dials go through
    /// `overrides`. Default `false`: backends are told the real addresses.
    pub backends_resolve: bool,
    /// A planted defect, for the conformance test's proof that it catches one. Never set it elsewhere.
    #[doc(hidden)]
    pub mutation: Option<Mutation>,
}

impl Default for DoubleOptions {
    fn default() -> Self {
        Self {
            product: "codis-demo".into(),
            max_slot_num: 1024,
            overrides: BTreeMap::new(),
            password: None,
            tick: Duration::from_millis(10),
            fork: false,
            listen: None,
            stats_interval: Duration::from_millis(100),
            stats_timeout: Duration::from_secs(1),
            dial_timeout: Duration::from_secs(1),
            proxy_timeout: Duration::from_secs(1),
            dead_checks: 10,
            server_check_interval: Duration::from_millis(100),
            failover_check_interval: Duration::from_millis(20),
            offline_check_interval: Duration::from_millis(20),
            migration_parallel_slots: 100,
            migration_method: "semi-async".into(),
            backends_resolve: false,
            redis_stand_ins: true,
            mutation: None,
        }
    }
}

/// An injected failure of the dashboard's HTTP API (see [`CodisDouble::fail_next`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Answer HTTP 800 with this `Cause` (nothing is done).
    Status800(String),
    /// Answer a bare HTTP 500 (nothing is done).
    Status500,
    /// Wait this long, then handle the request normally (a slow dashboard: a client that gives up earlier does not
    /// know whether the mutation happened).
    Timeout(Duration),
    /// Close the connection without answering (nothing is done).
    Drop,
}

#[derive(Clone, Debug)]
struct FaultRule {
    prefix: Option<String>,
    remaining: usize,
    fault: Fault,
}

/// One request the dashboard double received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestRecord {
    /// `GET` or `PUT` (or whatever was sent).
    pub method: String,
    /// The path with the xauth replaced by `{xauth}`.
    pub path: String,
    /// The status answered; 0 when the connection was dropped by a fault.
    pub status: u16,
}

/// The dashboard's view at one instant, as typed values.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// Groups by ascending id.
    pub groups: Vec<Group>,
    /// All slots, index == id.
    pub slots: Vec<SlotMapping>,
    /// Registered proxies by ascending id.
    pub proxies: Vec<Proxy>,
    /// Interval, disabled flag and progress status.
    pub slot_action: SlotActionStats,
    /// Last stats refresh of each server.
    pub server_stats: BTreeMap<String, ServerStats>,
    /// Last stats refresh of each proxy, by token.
    pub proxy_stats: BTreeMap<String, ProxyStatsEntry>,
    /// Completed stats refreshes so far.
    pub refreshes: u64,
}

impl Snapshot {
    fn of(st: &State) -> Self {
        let mut proxies: Vec<Proxy> = st.topo.proxies.values().cloned().collect();
        proxies.sort_by_key(|p| p.id);
        Self {
            groups: st.topo.groups.values().cloned().collect(),
            slots: st.topo.slots.clone(),
            proxies,
            slot_action: st.mem.slot_action.clone(),
            server_stats: st.mem.server_stats.clone(),
            proxy_stats: st.mem.proxy_stats.clone(),
            refreshes: st.refreshes,
        }
    }

    /// The group with this id.
    #[must_use]
    pub fn group(&self, gid: u32) -> Option<&Group> {
        self.groups.iter().find(|g| g.id == gid)
    }

    /// The master (index 0) of a group.
    #[must_use]
    pub fn master(&self, gid: u32) -> Option<&str> {
        self.group(gid).and_then(Group::master)
    }

    /// The group holding `addr` and the server entry.
    #[must_use]
    pub fn server(&self, addr: &str) -> Option<(&Group, &GroupServer)> {
        self.groups.iter().find_map(|g| g.servers.iter().find(|s| s.server == addr).map(|s| (g, s)))
    }

    /// Number of slots whose `group_id` is `gid`.
    #[must_use]
    pub fn slots_of(&self, gid: u32) -> usize {
        self.slots.iter().filter(|m| m.group_id == gid).count()
    }

    /// Slots with any action (pending included).
    #[must_use]
    pub fn with_action(&self) -> Vec<&SlotMapping> {
        self.slots.iter().filter(|m| !m.action.state.is_nothing()).collect()
    }
}

/// An answer read by [`CodisDouble::call`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpReply {
    /// Status code (800 for Codis errors); 0 when the request failed (connection refused or dropped).
    pub status: u16,
    /// Body text (the transport error text when `status` is 0).
    pub body: String,
}

impl HttpReply {
    /// HTTP 200 with the body `"OK"`.
    #[must_use]
    pub fn is_ok(&self) -> bool {
        self.status == 200 && self.body == "\"OK\""
    }

    /// The `Cause` of an error body.
    #[must_use]
    pub fn cause(&self) -> Option<String> {
        let v: serde_json::Value = serde_json::from_str(&self.body).ok()?;
        v.get("Cause")?.as_str().map(str::to_owned)
    }

    /// The body as JSON.
    #[must_use]
    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_str(&self.body).ok()
    }
}

/// Failures of the handle's test helpers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DoubleError {
    /// The group does not exist.
    NoGroup(u32),
    /// The group has no such server.
    NoServer {
        /// Group id.
        gid: u32,
        /// Server address.
        addr: String,
    },
    /// The server is the group's master, which cannot be the promote target.
    IsMaster {
        /// Group id.
        gid: u32,
    },
}

impl std::fmt::Display for DoubleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoGroup(g) => write!(f, "group-[{g}] doesn't exist"),
            Self::NoServer { gid, addr } => write!(f, "group-[{gid}] doesn't have server-[{addr}]"),
            Self::IsMaster { gid } => write!(f, "group-[{gid}] can't promote master"),
        }
    }
}

impl std::error::Error for DoubleError {}

/// A record of the double's state at every change (consecutive equal values collapsed), with the time since it
/// started. `next` is asked at every release of the state lock, which happens thousands of times a second in a
/// 1024-slot migration: given the last entry, it returns the new one only when the state reads differently.
struct Trace<T> {
    next: NextEntry<T>,
    started: Instant,
    log: Vec<(Duration, T)>,
}

/// Given a trace's last entry and the state, the entry to record, if the state reads differently.
type NextEntry<T> = Box<dyn Fn(Option<&T>, &State) -> Option<T> + Send>;

impl<T> Trace<T> {
    fn start(st: &State, next: NextEntry<T>) -> Self {
        let log = next(None, st).map(|first| (Duration::ZERO, first)).into_iter().collect();
        Self { next, started: Instant::now(), log }
    }

    fn observe(&mut self, st: &State) {
        if let Some(entry) = (self.next)(self.log.last().map(|(_, last)| last), st) {
            let at = self.started.elapsed();
            self.log.push((at, entry));
        }
    }
}

/// A trace of a projection of the whole [`Snapshot`] (see [`CodisDouble::start_trace`]); building the snapshot
/// clones the stats caches, so it is for short checks against a recording.
type ProjectionTrace = Trace<serde_json::Value>;

/// The owner of every slot (index = slot id, 0 = offline) (see [`CodisDouble::start_owner_trace`]), compared in
/// place: for counting moves over a whole change.
type OwnerTrace = Trace<Vec<u32>>;

fn owners_of(st: &State) -> Vec<u32> {
    st.topo.slots.iter().map(|s| s.group_id).collect()
}

/// The state lock; on release, a running trace records the projection if it changed.
pub(crate) struct StateGuard<'a> {
    guard: MutexGuard<'a, State>,
    trace: &'a Mutex<Option<ProjectionTrace>>,
    owners: &'a Mutex<Option<OwnerTrace>>,
    tracing: &'a AtomicBool,
}

impl std::ops::Deref for StateGuard<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.guard
    }
}

impl std::ops::DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.guard
    }
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        if !self.tracing.load(Ordering::SeqCst) {
            return;
        }
        if let Some(t) = self.trace.lock().unwrap_or_else(PoisonError::into_inner).as_mut() {
            t.observe(&self.guard);
        }
        if let Some(t) = self.owners.lock().unwrap_or_else(PoisonError::into_inner).as_mut() {
            t.observe(&self.guard);
        }
    }
}

/// What the HTTP handlers, the executors and the handle share.
pub(crate) struct Shared {
    pub(crate) opts: DoubleOptions,
    pub(crate) xauth: String,
    /// The dashboard's own model; a restart gives it a new token and start time.
    pub(crate) topom: Mutex<TopomModel>,
    overrides: Mutex<BTreeMap<String, String>>,
    state: Mutex<State>,
    trace: Mutex<Option<ProjectionTrace>>,
    owners: Mutex<Option<OwnerTrace>>,
    /// Whether either trace runs.
    tracing: AtomicBool,
    /// Pooled connections, as Codis pools them: the migration executor's and the stats loop's, by real address.
    action_pool: Mutex<HashMap<String, Vec<Conn>>>,
    pub(crate) stats_pool: Mutex<HashMap<String, Vec<Conn>>>,
    /// Serialises mutations and executor steps, I/O included, like Codis's topom mutex.
    pub(crate) op: tokio::sync::Mutex<()>,
    faults: Mutex<Vec<FaultRule>>,
    log: Mutex<Vec<RequestRecord>>,
    /// The dashboard is "down" (paused): executors and loops idle.
    pub(crate) paused: AtomicBool,
    /// Slot-action rounds run and slots taken by them since start (benchmarks read them; Codis does not count).
    pub(crate) rounds: AtomicU64,
    pub(crate) round_slots: AtomicU64,
    /// Migrations finished since start, counted for their source group and for their target (tests read them).
    pub(crate) migrated: Mutex<BTreeMap<u32, u64>>,
    pub(crate) http: reqwest::Client,
    listener: OnceLock<Weak<Listener>>,
}

impl Shared {
    pub(crate) fn state(&self) -> StateGuard<'_> {
        StateGuard {
            guard: self.state.lock().unwrap_or_else(PoisonError::into_inner),
            trace: &self.trace,
            owners: &self.owners,
            tracing: &self.tracing,
        }
    }

    /// A Codis delay in the double's time: `codis × tick / 1 s`.
    pub(crate) fn scaled(&self, codis: Duration) -> Duration {
        codis.mul_f64(self.opts.tick.as_secs_f64())
    }

    /// Sleeps a scaled Codis delay; below the timer's 1 ms resolution it only yields, so a 10 ms pause scaled to
    /// 0.1 ms does not become a whole millisecond.
    pub(crate) async fn pause_for(&self, codis: Duration) {
        let d = self.scaled(codis);
        if d < Duration::from_millis(1) {
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(d).await;
        }
    }

    /// The process of `generation` is running: not paused and not restarted since.
    pub(crate) fn is_online(&self, generation: u64) -> bool {
        !self.is_paused() && self.state().generation == generation
    }

    /// A pooled connection of the migration executor to `real`, or a new one.
    pub(crate) async fn action_conn(&self, real: &str) -> Result<Conn, String> {
        let pooled = {
            let mut pool = self.action_pool.lock().unwrap_or_else(PoisonError::into_inner);
            pool.get_mut(real).and_then(Vec::pop)
        };
        match pooled {
            // The server killed it while idle (a SLAVEOF with CLIENT KILL): the batch fails with EOF, as in Codis.
            Some(c) if c.peer_closed() => Err("EOF".into()),
            Some(c) => Ok(c),
            // Codis's migration pool uses `migration_timeout` (30 s) for every call.
            None => Conn::dial(real, self.password(), Duration::from_secs(30)).await,
        }
    }

    /// Gives a connection that worked back to the migration pool.
    pub(crate) fn return_action_conn(&self, real: &str, conn: Conn) {
        let mut pool = self.action_pool.lock().unwrap_or_else(PoisonError::into_inner);
        pool.entry(real.to_owned()).or_default().push(conn);
    }

    /// How a backend is told of `addr` (a master to replicate, a migration's target): as registered when the
    /// backends resolve names, else the address the double dials.
    pub(crate) fn told_target(&self, addr: &str) -> String {
        if self.opts.backends_resolve {
            addr.to_owned()
        } else {
            self.dial_target(addr)
        }
    }

    /// The real address to dial for a registered server or proxy admin address.
    pub(crate) fn dial_target(&self, addr: &str) -> String {
        let overrides = self.overrides.lock().unwrap_or_else(PoisonError::into_inner);
        let addr = crate::dns::rooted_as_relative(addr);
        overrides.get(addr.as_ref()).cloned().unwrap_or_else(|| addr.into_owned())
    }

    /// A client of proxy `p`'s admin API, dialled through the overrides.
    pub(crate) fn proxy_client(&self, p: &Proxy) -> ProxyClient {
        let xauth = wire::proxy_xauth(&self.opts.product, self.auth(), &p.token);
        ProxyClient::new(&self.http, &p.admin_addr, &self.dial_target(&p.admin_addr), &xauth)
    }

    /// The registered spelling of a real address, if an override maps to it.
    pub(crate) fn registered_name(&self, real: &str) -> Option<String> {
        let overrides = self.overrides.lock().unwrap_or_else(PoisonError::into_inner);
        overrides.iter().find(|(_, r)| r.as_str() == real).map(|(k, _)| k.clone())
    }

    pub(crate) fn password(&self) -> Option<&str> {
        self.opts.password.as_deref()
    }

    /// `product_auth` as a string (empty when unset).
    pub(crate) fn auth(&self) -> &str {
        self.opts.password.as_deref().unwrap_or("")
    }

    pub(crate) fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// Stops serving from inside a handler (`/api/topom/shutdown`), without waiting.
    pub(crate) fn shutdown_soon(&self) {
        self.paused.store(true, Ordering::SeqCst);
        if let Some(l) = self.listener.get().and_then(Weak::upgrade) {
            l.pause(false);
        }
    }

    fn take_fault(&self, path: &str) -> Option<Fault> {
        let mut faults = self.faults.lock().unwrap_or_else(PoisonError::into_inner);
        let rule =
            faults.iter_mut().find(|r| r.remaining > 0 && r.prefix.as_deref().is_none_or(|p| path.starts_with(p)))?;
        rule.remaining -= 1;
        let fault = rule.fault.clone();
        faults.retain(|r| r.remaining > 0);
        Some(fault)
    }

    fn record(&self, method: &str, path: &str, status: u16) {
        let path = path.replace(&self.xauth, "{xauth}");
        let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        log.push(RequestRecord { method: method.to_owned(), path, status });
    }
}

/// A running dashboard double; dropping it stops everything it runs.
pub struct CodisDouble {
    shared: Arc<Shared>,
    listener: Arc<Listener>,
    // Declared last: dropped after the listener, so the runtime outlives the tasks it serves.
    _rt: Runtime,
}

impl std::fmt::Debug for CodisDouble {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CodisDouble").field("addr", &self.addr()).field("product", &self.shared.opts.product).finish()
    }
}

impl CodisDouble {
    /// Starts the double: HTTP API, slot and sync executors, stats loop.
    ///
    /// # Panics
    /// When the address cannot be bound or the thread cannot be started.
    #[must_use]
    pub fn start(opts: DoubleOptions) -> Self {
        Self::try_start(opts).expect("start codis dashboard double")
    }

    /// Like [`CodisDouble::start`], returning the error.
    ///
    /// # Errors
    /// When the address cannot be bound or the thread cannot be started.
    pub fn try_start(opts: DoubleOptions) -> std::io::Result<Self> {
        let std_listener = match opts.listen {
            Some(addr) => std::net::TcpListener::bind(addr)?,
            None => crate::process::bind_loopback()?,
        };
        let addr = std_listener.local_addr()?.to_string();
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(opts.proxy_timeout)
            .connect_timeout(opts.proxy_timeout)
            // Kept alive like Go's default transport (two idle connections per host), which Codis's API client uses.
            .pool_max_idle_per_host(2)
            .build()
            .map_err(std::io::Error::other)?;
        let mut topo = Topo::new(opts.max_slot_num, opts.fork, u32::from(opts.migration_method != "sync"));
        topo.mutation = opts.mutation;
        let topom = TopomModel {
            token: wire::token(&format!("dashboard/{}/{addr}", opts.product)),
            start_time: wire::go_time_now(),
            admin_addr: addr,
            product_name: opts.product.clone(),
            pid: std::process::id(),
            pwd: std::env::current_dir().map(|p| p.display().to_string()).unwrap_or_default(),
            sys: "testbed codis dashboard double".into(),
        };
        let shared = Arc::new(Shared {
            xauth: wire::xauth(&opts.product),
            topom: Mutex::new(topom),
            overrides: Mutex::new(opts.overrides.clone()),
            state: Mutex::new(State::new(topo)),
            trace: Mutex::new(None),
            owners: Mutex::new(None),
            tracing: AtomicBool::new(false),
            action_pool: Mutex::new(HashMap::new()),
            stats_pool: Mutex::new(HashMap::new()),
            op: tokio::sync::Mutex::new(()),
            faults: Mutex::new(Vec::new()),
            log: Mutex::new(Vec::new()),
            paused: AtomicBool::new(false),
            rounds: AtomicU64::new(0),
            round_slots: AtomicU64::new(0),
            migrated: Mutex::new(BTreeMap::new()),
            http,
            listener: OnceLock::new(),
            opts,
        });
        let rt = Runtime::start("codis-double")?;
        let router = axum::Router::new().fallback(api::dispatch).with_state(shared.clone());
        let handler_shared = shared.clone();
        let handler: Handler = Arc::new(move |req: Request<Body>| {
            let router = router.clone();
            let shared = handler_shared.clone();
            Box::pin(async move {
                let method = req.method().to_string();
                let path = req.uri().path().to_owned();
                let resp = match shared.take_fault(&path) {
                    Some(Fault::Drop) => {
                        shared.record(&method, &path, 0);
                        return Err(Dropped);
                    }
                    Some(Fault::Status500) => wire::internal_error(),
                    Some(Fault::Status800(cause)) => wire::error(&wire::ApiError::traced(cause)),
                    Some(Fault::Timeout(d)) => {
                        tokio::time::sleep(d).await;
                        router.oneshot(req).await.map_err(|_| Dropped)?
                    }
                    None => router.oneshot(req).await.map_err(|_| Dropped)?,
                };
                shared.record(&method, &path, resp.status().as_u16());
                Ok(resp)
            })
        });
        let listener = Arc::new(Listener::start(rt.handle(), std_listener, handler)?);
        let _ = shared.listener.set(Arc::downgrade(&listener));
        rt.handle().spawn(executor::run_slots(shared.clone()));
        rt.handle().spawn(executor::run_syncs(shared.clone()));
        rt.handle().spawn(stats::run(shared.clone()));
        if shared.opts.fork {
            rt.handle().spawn(stats::run_health(shared.clone()));
        }
        Ok(Self { shared, listener, _rt: rt })
    }

    /// `127.0.0.1:<port>`.
    #[must_use]
    pub fn addr(&self) -> String {
        self.listener.addr().to_string()
    }

    /// `http://127.0.0.1:<port>`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// The product name.
    #[must_use]
    pub fn product(&self) -> &str {
        &self.shared.opts.product
    }

    /// The xauth clients must send.
    #[must_use]
    pub fn xauth(&self) -> &str {
        &self.shared.xauth
    }

    /// The options it was started with (overrides as at start).
    #[must_use]
    pub fn options(&self) -> &DoubleOptions {
        &self.shared.opts
    }

    /// Maps a registered address to a real one from now on (e.g. a pod added after start).
    pub fn set_override(&self, registered: &str, real: &str) {
        let mut overrides = self.shared.overrides.lock().unwrap_or_else(PoisonError::into_inner);
        overrides.insert(registered.to_owned(), real.to_owned());
    }

    /// Sends one request to the double (blocking; works from sync and async tests). `{xauth}` in `path` is replaced
    /// by the xauth. Requests go through fault injection and the request log like any other.
    #[must_use]
    pub fn call(&self, method: &str, path: &str) -> HttpReply {
        self.call_with_body(method, path, "")
    }

    /// [`CodisDouble::call`] with a JSON body (the `slots/assign` routes).
    #[must_use]
    pub fn call_with_body(&self, method: &str, path: &str, body: &str) -> HttpReply {
        let path = path.replace("{xauth}", &self.shared.xauth);
        match crate::httpd::blocking_request(&self.addr(), method, &path, body) {
            Ok((status, body)) => HttpReply { status, body },
            Err(e) => HttpReply { status: 0, body: e.to_string() },
        }
    }

    /// Slot-action rounds the executor has run since start, and the slots they took; a double's own count, for
    /// benchmarks (how wide the rounds of a change were).
    #[must_use]
    pub fn executor_rounds(&self) -> (u64, u64) {
        (self.shared.rounds.load(Ordering::SeqCst), self.shared.round_slots.load(Ordering::SeqCst))
    }

    /// Slot migrations finished since start, by group: each counts for its source group and for its target, so
    /// the largest is the most executor rounds a group took part in (a slot assigned, as a split hands slots over,
    /// counts nowhere).
    #[must_use]
    pub fn migrations_by_group(&self) -> BTreeMap<u32, u64> {
        self.shared.migrated.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The current model and stats as typed values.
    #[must_use]
    pub fn snapshot(&self) -> Snapshot {
        Snapshot::of(&self.shared.state())
    }

    /// The real address the double dials for a registered server or proxy admin address (the override, or the
    /// address itself).
    #[must_use]
    pub fn real_addr(&self, registered: &str) -> String {
        self.shared.dial_target(registered)
    }

    /// The current override map (registered → real).
    #[must_use]
    pub fn overrides(&self) -> BTreeMap<String, String> {
        self.shared.overrides.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Starts recording `projection` of the state at every change (consecutive equal values collapse), with the
    /// time since this call; replaces a running trace. For checking the order of states against a recording.
    pub fn start_trace(&self, projection: impl Fn(&Snapshot) -> serde_json::Value + Send + 'static) {
        let next = move |last: Option<&serde_json::Value>, st: &State| {
            let value = projection(&Snapshot::of(st));
            (last != Some(&value)).then_some(value)
        };
        // The state lock before the trace's, as a releasing state guard takes them: no change falls between the
        // first entry and the flag.
        let state = self.shared.state.lock().unwrap_or_else(PoisonError::into_inner);
        *self.shared.trace.lock().unwrap_or_else(PoisonError::into_inner) = Some(Trace::start(&state, Box::new(next)));
        self.shared.tracing.store(true, Ordering::SeqCst);
    }

    /// Stops the trace and returns what it recorded.
    pub fn take_trace(&self) -> Vec<(Duration, serde_json::Value)> {
        let log = self.shared.trace.lock().unwrap_or_else(PoisonError::into_inner).take().map(|t| t.log);
        self.keep_tracing_if_any();
        log.unwrap_or_default()
    }

    /// Clears the tracing flag unless a trace still runs, so that releasing the state lock costs nothing then.
    fn keep_tracing_if_any(&self) {
        let state = self.shared.state.lock().unwrap_or_else(PoisonError::into_inner);
        let any = self.shared.trace.lock().unwrap_or_else(PoisonError::into_inner).is_some()
            || self.shared.owners.lock().unwrap_or_else(PoisonError::into_inner).is_some();
        self.shared.tracing.store(any, Ordering::SeqCst);
        drop(state);
    }

    /// Starts recording the owner of every slot at every change, consecutive equal ones collapsed, with the time
    /// since this call; replaces a running owner trace. For counting slot moves over a whole change.
    pub fn start_owner_trace(&self) {
        let next = |last: Option<&Vec<u32>>, st: &State| {
            let same = last.is_some_and(|l| l.iter().copied().eq(st.topo.slots.iter().map(|s| s.group_id)));
            (!same).then(|| owners_of(st))
        };
        let state = self.shared.state.lock().unwrap_or_else(PoisonError::into_inner);
        *self.shared.owners.lock().unwrap_or_else(PoisonError::into_inner) = Some(Trace::start(&state, Box::new(next)));
        self.shared.tracing.store(true, Ordering::SeqCst);
    }

    /// Stops the owner trace and returns what it recorded.
    pub fn take_owner_trace(&self) -> Vec<(Duration, Vec<u32>)> {
        let log = self.shared.owners.lock().unwrap_or_else(PoisonError::into_inner).take().map(|t| t.log);
        self.keep_tracing_if_any();
        log.unwrap_or_default()
    }

    /// Polls [`CodisDouble::snapshot`] every few milliseconds until `ready` holds; the matching snapshot, or `None`
    /// after `timeout`.
    pub fn wait_for(&self, timeout: Duration, mut ready: impl FnMut(&Snapshot) -> bool) -> Option<Snapshot> {
        let deadline = Instant::now() + timeout;
        loop {
            let snap = self.snapshot();
            if ready(&snap) {
                return Some(snap);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Waits until a stats refresh that started after this call has completed, so stats reflect the current model.
    #[must_use]
    pub fn wait_stats_refresh(&self, timeout: Duration) -> bool {
        let now = self.snapshot().refreshes;
        self.wait_for(timeout, |s| s.refreshes >= now + 2).is_some()
    }

    /// Every request received so far.
    #[must_use]
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared.log.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Forgets the request log.
    pub fn clear_requests(&self) {
        self.shared.log.lock().unwrap_or_else(PoisonError::into_inner).clear();
    }

    /// The next `n` requests (any path) fail with `fault`.
    pub fn fail_next(&self, n: usize, fault: Fault) {
        self.push_fault(None, n, fault);
    }

    /// The next `n` requests whose path starts with `prefix` fail with `fault`; `{xauth}` may be written out, e.g.
    /// `/api/topom/group/promote/` or `/api/topom/group/promote/{xauth}/2/`.
    pub fn fail_next_on(&self, prefix: &str, n: usize, fault: Fault) {
        self.push_fault(Some(prefix.replace("{xauth}", &self.shared.xauth)), n, fault);
    }

    fn push_fault(&self, prefix: Option<String>, n: usize, fault: Fault) {
        if n > 0 {
            let mut faults = self.shared.faults.lock().unwrap_or_else(PoisonError::into_inner);
            faults.push(FaultRule { prefix, remaining: n, fault });
        }
    }

    /// Drops every pending fault.
    pub fn clear_faults(&self) {
        self.shared.faults.lock().unwrap_or_else(PoisonError::into_inner).clear();
    }

    /// Makes every migration batch of `slot` fail with `text`, as a codis-server error reply would: the slot ends
    /// its round with `[ERROR] Slot[NNNN]: <text>` and stays `migrating`, the executor sleeps 5 s + 1 s (scaled) and
    /// tries again, until [`CodisDouble::clear_slot_error`].
    pub fn set_slot_error(&self, slot: usize, text: &str) {
        self.shared.state().slot_errors.insert(slot, text.to_owned());
    }

    /// Lets `slot` migrate again.
    pub fn clear_slot_error(&self, slot: usize) {
        self.shared.state().slot_errors.remove(&slot);
    }

    /// Stretches `slot`'s migration over at least `ticks` batches of one tick each on the wire (default 1: as many
    /// batches as its keys need, at their real speed), like a slot with many keys; takes effect on a slot already
    /// migrating. While such a batch runs, `slot_action.executor` is 1 and promotes are refused.
    pub fn set_migration_ticks(&self, slot: usize, ticks: u32) {
        self.shared.state().migration_ticks.insert(slot, ticks.max(1));
    }

    /// [`CodisDouble::set_migration_ticks`] for every slot without its own setting.
    pub fn set_default_migration_ticks(&self, ticks: u32) {
        self.shared.state().default_migration_ticks = ticks.max(1);
    }

    /// A dashboard restart, first half: the process is gone (port closed, connections refused, executors stop
    /// after the batch on the wire).
    pub fn pause(&self) {
        self.shared.paused.store(true, Ordering::SeqCst);
        self.listener.pause(true);
    }

    /// Second half: a new dashboard process on the same port. The model is kept (Codis keeps it in its
    /// coordinator); what Codis keeps in memory is lost: `slot_action` (interval 0, enabled, no progress), stats,
    /// pooled connections; the dashboard gets a new token and start time. Executors resume from the stored states.
    ///
    /// # Errors
    /// When the port cannot be bound again.
    pub fn resume(&self) -> std::io::Result<()> {
        self.shared.state().restart();
        {
            let mut topom = self.shared.topom.lock().unwrap_or_else(PoisonError::into_inner);
            topom.token = wire::token(&format!("dashboard/{}/{}", self.shared.opts.product, topom.admin_addr));
            topom.start_time = wire::go_time_now();
        }
        self.shared.action_pool.lock().unwrap_or_else(PoisonError::into_inner).clear();
        self.shared.stats_pool.lock().unwrap_or_else(PoisonError::into_inner).clear();
        self.listener.resume()?;
        self.shared.paused.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// [`CodisDouble::pause`] then [`CodisDouble::resume`].
    ///
    /// # Errors
    /// When the port cannot be bound again.
    pub fn restart(&self) -> std::io::Result<()> {
        self.pause();
        self.resume()
    }

    /// Holds `slot`'s migration at `at` until [`CodisDouble::release_migration`]: the round it is in waits too.
    /// Reproduces an instant of a recording deterministically (between two batches, or with a batch on the wire).
    pub fn hold_migration(&self, slot: usize, at: MigrationHold) {
        let mut st = self.shared.state();
        // Not at the new hold until the executor gets there.
        st.held.remove(&slot);
        st.holds.insert(slot, at);
    }

    /// Lets a held migration go on.
    pub fn release_migration(&self, slot: usize) {
        self.shared.state().holds.remove(&slot);
    }

    /// Whether `slot`'s migration is waiting at its hold now.
    #[must_use]
    pub fn is_migration_held(&self, slot: usize) -> bool {
        self.shared.state().held.contains(&slot)
    }

    /// Makes every migration batch of `slot` delete its keys on the source instead of moving them (a data-losing
    /// defect, to prove a verifier notices), until [`CodisDouble::clear_key_faults`].
    pub fn drop_keys_of(&self, slot: usize) {
        self.shared.state().key_faults.insert(slot, KeyFault::Delete);
    }

    /// Migrations move keys again.
    pub fn clear_key_faults(&self) {
        self.shared.state().key_faults.clear();
    }

    /// Keeps the sync-action executor from taking its next turn while `held` (as when a request lands within the
    /// 1 s it sleeps between turns).
    pub fn hold_sync_actions(&self, held: bool) {
        self.shared.state().sync_held = held;
    }

    /// Keeps the stats loop from refreshing while `held` (as between two of Codis's once-a-second refreshes).
    pub fn hold_stats(&self, held: bool) {
        self.shared.state().stats_held = held;
    }

    /// Whether the port is closed (paused or shut down through the API).
    #[must_use]
    pub fn is_paused(&self) -> bool {
        !self.listener.is_serving()
    }

    /// Leaves group `gid` with `promoting = {index of addr, preparing}`, as a promote whose proxy push failed does;
    /// the group then refuses add/del/sync actions, and a promote of the same address resumes it.
    ///
    /// # Errors
    /// When the group or the server does not exist, or `addr` is the master.
    pub fn promote_in_progress(&self, gid: u32, addr: &str) -> Result<(), DoubleError> {
        let mut st = self.shared.state();
        let g = st.topo.groups.get_mut(&gid).ok_or(DoubleError::NoGroup(gid))?;
        let index = g.index_of(addr).ok_or_else(|| DoubleError::NoServer { gid, addr: addr.to_owned() })?;
        if index == 0 {
            return Err(DoubleError::IsMaster { gid });
        }
        g.promoting = Promoting { index: u32::try_from(index).unwrap_or(u32::MAX), state: PromotingState::Preparing };
        Ok(())
    }
}

impl Drop for CodisDouble {
    fn drop(&mut self) {
        self.shared.paused.store(true, Ordering::SeqCst);
    }
}
