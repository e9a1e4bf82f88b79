//! A codis-proxy double: the admin API the dashboard double talks to (online, fill slots, stats, shutdown) and a
//! RESP data port that routes requests through the slot table the dashboard pushed, as codis-proxy does
//! (pkg/proxy/router.go, forward.go, session.go at de1ad026).
//!
//! Admin routes: the recorded ones (`GET /api/proxy/model`, `/api/proxy/xping/{pxauth}`, `/proxy/stats`,
//! `/api/proxy/stats/{pxauth}`, `/api/proxy/slots/{pxauth}`, `PUT /api/proxy/stats/reset/{pxauth}`) and the internal
//! ones the dashboard uses (`PUT /api/proxy/fillslots/{pxauth}` with a JSON array of slots, `start`, `shutdown`,
//! `sentinels`, `loglevel`, `forcegc`).
//!
//! Data port ([`ProxyDouble::data_addr`]): a client connecting before the proxy is online gets
//! `ERR router is not online` and is disconnected. A key's slot is `crc32(key or {tag}) % max_slot_num`. A slot
//! without a backend answers `ERR handle request, slot is not ready, may be offline`; a locked slot holds requests
//! until it is unlocked, and filling a slot waits for the requests in flight on it (codis-proxy's slot lock and
//! reference count). A slot with `migrate_from` follows the migration first, by the slot's `forward_method`:
//! semi-async (1) runs the command on the source if the key still exists there (`SLOTSMGRT-EXEC-WRAPPER`, emulated
//! on redis-server by an atomic Lua script) and otherwise on the target; sync (0) moves the key to the target first
//! (`SLOTSMGRTTAGONE`, emulated by `MIGRATE` of that key) and then runs it there. Everything goes to the group master
//! the dashboard pushed (`replica_groups` are not read from). `MGET`, `MSET`, `DEL`, `EXISTS` are split per key as
//! codis-proxy splits them.
//!
//! [`ProxyDouble::stop`], [`ProxyDouble::freeze`] and [`ProxyDouble::restart`] make it dead, hung, or a fresh
//! process, to exercise the dashboard's stats and stalls.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{Method, Request, Response, Uri};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::sync::{watch, OwnedRwLockWriteGuard, RwLock};
use tower::ServiceExt;

use crate::codis::model::{Proxy, ProxyCmdStats, ProxyOps, ProxyRusage, ProxyRusageRaw, ProxyStats, Slot};
use crate::codis::resp::{read_command, Conn, Reply};
use crate::codis::slothash::slot_of;
use crate::codis::wire::{self, ApiError};
use crate::httpd::{Dropped, Handler, Listener, Runtime};
use crate::process::PortLease;

/// How to start a [`ProxyDouble`].
#[derive(Clone, Debug)]
pub struct ProxyOptions {
    /// Product name (must match the dashboard's).
    pub product: String,
    /// The product auth (part of the proxy xauth); empty by default.
    pub auth: String,
    /// The proxy token; a random one when `None`. The conformance test uses the recorded token.
    pub token: Option<String>,
    /// The admin address the proxy reports in its model (what the dashboard stores and dials through its override
    /// map); the bound address when `None`.
    pub admin_addr: Option<String>,
    /// The data address reported in the model; the data port really listens on [`ProxyDouble::data_addr`].
    pub proxy_addr: String,
    /// Datacenter reported in the model.
    pub datacenter: String,
    /// Pika fork: the model gains `max_slot_num`, the stats `slow_cmd_count`.
    pub fork: bool,
    /// Slot count (the dashboard's).
    pub max_slot_num: usize,
    /// Backend address as the dashboard pushes it (registered spelling) → real `host:port` to dial.
    pub overrides: BTreeMap<String, String>,
    /// `backend_primary_only`, as the proxy's stats report it (the chart sets it; Codis's default is off). The data
    /// port reads from group masters either way.
    pub primary_only: bool,
    /// The backends are redis-servers standing in for codis-server (default): the migration commands
    /// (`SLOTSMGRT-EXEC-WRAPPER`, `SLOTSMGRTTAGONE`) are emulated; `false` sends them as codis-proxy does.
    pub redis_stand_ins: bool,
}

impl ProxyOptions {
    /// Defaults for `product`.
    #[must_use]
    pub fn new(product: &str) -> Self {
        Self {
            product: product.to_owned(),
            auth: String::new(),
            token: None,
            admin_addr: None,
            proxy_addr: "127.0.0.1:19000".into(),
            datacenter: String::new(),
            fork: false,
            max_slot_num: 1024,
            overrides: BTreeMap::new(),
            primary_only: false,
            redis_stand_ins: true,
        }
    }
}

#[derive(Debug)]
struct Inner {
    model: Proxy,
    online: bool,
    closed: bool,
    slots: Vec<Slot>,
    fillslots_calls: u64,
    requests: u64,
}

/// One slot of the router: a lock requests hold while they run (filling the slot takes it exclusively, so it waits
/// for them) and, while the slot is locked, the exclusive guard that keeps new requests waiting.
struct SlotCell {
    lock: Arc<RwLock<()>>,
    held: tokio::sync::Mutex<Option<OwnedRwLockWriteGuard<()>>>,
}

struct Shared {
    opts: ProxyOptions,
    xauth: String,
    inner: Mutex<Inner>,
    frozen: tokio::sync::watch::Sender<bool>,
    listener: OnceLock<Weak<Listener>>,
    cells: Vec<SlotCell>,
    overrides: Mutex<BTreeMap<String, String>>,
    backends: Mutex<HashMap<String, Vec<Conn>>>,
    data: OnceLock<Weak<DataPort>>,
}

impl Shared {
    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn dial_target(&self, addr: &str) -> String {
        let overrides = self.overrides.lock().unwrap_or_else(PoisonError::into_inner);
        let addr = crate::dns::rooted_as_relative(addr);
        overrides.get(addr.as_ref()).cloned().unwrap_or_else(|| addr.into_owned())
    }

    fn fresh_slots(&self) -> Vec<Slot> {
        (0..self.opts.max_slot_num).map(|id| Slot { id, ..Slot::default() }).collect()
    }
}

/// A running proxy admin API double; dropping it stops it.
pub struct ProxyDouble {
    shared: Arc<Shared>,
    listener: Arc<Listener>,
    data: Arc<DataPort>,
    // Declared last: dropped after the listener, so the runtime outlives the tasks it serves.
    _rt: Runtime,
}

impl std::fmt::Debug for ProxyDouble {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyDouble").field("addr", &self.addr()).field("token", &self.token()).finish()
    }
}

impl ProxyDouble {
    /// Starts a proxy double for `product` on a free loopback port.
    ///
    /// # Panics
    /// When no port or thread can be had.
    #[must_use]
    pub fn start(product: &str) -> Self {
        Self::start_with(ProxyOptions::new(product))
    }

    /// Starts a proxy double with `opts`.
    ///
    /// # Panics
    /// When no port or thread can be had.
    #[must_use]
    pub fn start_with(opts: ProxyOptions) -> Self {
        Self::try_start_with(opts).expect("start proxy double")
    }

    /// Starts a proxy double with `opts`.
    ///
    /// # Errors
    /// When no port or thread can be had.
    pub fn try_start_with(opts: ProxyOptions) -> std::io::Result<Self> {
        let std_listener = crate::process::bind_loopback()?;
        let bound = std_listener.local_addr()?.to_string();
        let token = opts.token.clone().unwrap_or_else(|| wire::token(&format!("proxy/{}/{bound}", opts.product)));
        let model = Proxy {
            id: 0,
            token: token.clone(),
            start_time: wire::go_time_now(),
            admin_addr: opts.admin_addr.clone().unwrap_or_else(|| bound.clone()),
            proto_type: "tcp4".into(),
            proxy_addr: opts.proxy_addr.clone(),
            jodis_path: None,
            product_name: opts.product.clone(),
            pid: std::process::id(),
            pwd: std::env::current_dir().map(|p| p.display().to_string()).unwrap_or_default(),
            sys: "testbed proxy double".into(),
            max_slot_num: opts.fork.then_some(opts.max_slot_num),
            hostname: "localhost".into(),
            datacenter: opts.datacenter.clone(),
        };
        let xauth = wire::proxy_xauth(&opts.product, &opts.auth, &token);
        let (frozen, _) = tokio::sync::watch::channel(false);
        let cells = (0..opts.max_slot_num)
            .map(|_| SlotCell { lock: Arc::new(RwLock::new(())), held: tokio::sync::Mutex::new(None) })
            .collect();
        let data_listener = crate::process::bind_loopback()?;
        let slots = (0..opts.max_slot_num).map(|id| Slot { id, ..Slot::default() }).collect();
        let shared = Arc::new(Shared {
            overrides: Mutex::new(opts.overrides.clone()),
            opts,
            xauth,
            cells,
            backends: Mutex::new(HashMap::new()),
            data: OnceLock::new(),
            inner: Mutex::new(Inner { model, online: false, closed: false, slots, fillslots_calls: 0, requests: 0 }),
            frozen,
            listener: OnceLock::new(),
        });
        let rt = Runtime::start("proxy-double")?;
        let router = axum::Router::new().fallback(dispatch).with_state(shared.clone());
        let frozen_rx = shared.frozen.subscribe();
        let handler: Handler = Arc::new(move |req: Request<Body>| {
            let router = router.clone();
            let mut frozen = frozen_rx.clone();
            Box::pin(async move {
                // A frozen proxy accepts connections and never answers: the dashboard sees timeouts.
                while *frozen.borrow_and_update() {
                    if frozen.changed().await.is_err() {
                        break;
                    }
                }
                router.oneshot(req).await.map_err(|_| Dropped)
            })
        });
        let listener = Arc::new(Listener::start(rt.handle(), std_listener, handler)?);
        let _ = shared.listener.set(Arc::downgrade(&listener));
        let data = Arc::new(DataPort::start(rt.handle(), data_listener, shared.clone())?);
        let _ = shared.data.set(Arc::downgrade(&data));
        Ok(Self { shared, listener, data, _rt: rt })
    }

    /// `127.0.0.1:<port>` of the RESP data port.
    #[must_use]
    pub fn data_addr(&self) -> String {
        self.data.addr.to_string()
    }

    /// Maps a backend address as the dashboard pushes it to the real address to dial, from now on.
    pub fn set_override(&self, registered: &str, real: &str) {
        let mut overrides = self.shared.overrides.lock().unwrap_or_else(PoisonError::into_inner);
        overrides.insert(registered.to_owned(), real.to_owned());
    }

    /// `127.0.0.1:<port>` where it really listens.
    #[must_use]
    pub fn addr(&self) -> String {
        self.listener.addr().to_string()
    }

    /// The admin address it reports in its model.
    #[must_use]
    pub fn admin_addr(&self) -> String {
        self.shared.inner().model.admin_addr.clone()
    }

    /// Its token.
    #[must_use]
    pub fn token(&self) -> String {
        self.shared.inner().model.token.clone()
    }

    /// The xauth the dashboard must present.
    #[must_use]
    pub fn xauth(&self) -> String {
        self.shared.xauth.clone()
    }

    /// Its model (as `/api/proxy/model` returns it).
    #[must_use]
    pub fn model(&self) -> Proxy {
        self.shared.inner().model.clone()
    }

    /// The slot table the dashboard pushed (`{id}` only for slots never filled).
    #[must_use]
    pub fn slots(&self) -> Vec<Slot> {
        self.shared.inner().slots.clone()
    }

    /// Started by the dashboard and not shut down.
    #[must_use]
    pub fn is_online(&self) -> bool {
        self.shared.inner().online
    }

    /// Shut down through the API (`proxy/remove` on the dashboard).
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.shared.inner().closed
    }

    /// Locks, through its own admin API (`fillslots`), every slot it routes to `backend`: what a planned transfer's
    /// hold does (pika-action's `steps::hold`). Returns how many.
    ///
    /// # Panics
    /// When its admin API does not take the call.
    #[must_use]
    pub fn hold_slots_of(&self, backend: &str) -> usize {
        let held: Vec<Slot> = self
            .slots()
            .into_iter()
            .filter(|s| s.backend_addr.eq_ignore_ascii_case(backend))
            .map(|s| Slot { locked: true, ..s })
            .collect();
        let body = serde_json::to_string(&held).expect("slots as JSON");
        let path = format!("/api/proxy/fillslots/{}", self.xauth());
        let (status, reply) =
            crate::httpd::blocking_request(&self.admin_addr(), "PUT", &path, &body).expect("the proxy's admin API");
        assert_eq!(status, 200, "fillslots: {reply}");
        held.len()
    }

    /// How many `fillslots` calls it answered.
    #[must_use]
    pub fn fillslots_calls(&self) -> u64 {
        self.shared.inner().fillslots_calls
    }

    /// How many requests it answered (all routes).
    #[must_use]
    pub fn requests(&self) -> u64 {
        self.shared.inner().requests
    }

    /// Closes its ports and drops its clients: a crashed proxy (connections refused). State is kept for
    /// [`ProxyDouble::restart`].
    pub fn stop(&self) {
        self.listener.pause(true);
        self.data.pause();
    }

    /// A fresh proxy process on the same port: not online, not closed, empty slot table. The dashboard's stats loop
    /// re-onlines it, as Codis does.
    ///
    /// # Errors
    /// When the port cannot be bound again.
    pub fn restart(&self) -> std::io::Result<()> {
        self.listener.pause(true);
        self.data.pause();
        {
            let mut inner = self.shared.inner();
            inner.online = false;
            inner.closed = false;
            inner.slots = self.shared.fresh_slots();
            inner.model.start_time = wire::go_time_now();
        }
        for cell in &self.shared.cells {
            *cell.held.blocking_lock() = None;
        }
        self.shared.backends.lock().unwrap_or_else(PoisonError::into_inner).clear();
        self.data.resume()?;
        self.listener.resume()
    }

    /// Makes every request hang until [`ProxyDouble::thaw`] (the dashboard sees timeouts).
    pub fn freeze(&self) {
        self.shared.frozen.send_replace(true);
    }

    /// Answers again.
    pub fn thaw(&self) {
        self.shared.frozen.send_replace(false);
    }
}

fn authed(shared: &Shared, x: &str) -> Result<(), ApiError> {
    if x == shared.xauth {
        Ok(())
    } else {
        Err(ApiError::plain("invalid xauth, please check product name & auth"))
    }
}

/// The proxy's stats; `full` adds the per-command table and the Go runtime figures, as `/proxy/stats` and stats
/// with flags do (the double reports one idle `PING` entry and zeros, so the shape matches).
fn stats(shared: &Shared, full: bool) -> ProxyStats {
    let inner = shared.inner();
    let cmd = full.then(|| vec![ProxyCmdStats { opstr: "PING".into(), ..ProxyCmdStats::default() }]);
    let runtime = full.then(|| {
        serde_json::json!({
            "general": {"alloc": 0, "sys": 0, "lookups": 0, "mallocs": 0, "frees": 0},
            "heap": {"alloc": 0, "sys": 0, "idle": 0, "inuse": 0, "objects": 0},
            "gc": {"num": 0, "cpu_fraction": 0.0, "total_pausems": 0},
            "num_procs": 1,
            "num_goroutines": 1,
            "num_cgo_call": 0,
            "mem_offheap": 0
        })
    });
    ProxyStats {
        online: inner.online,
        closed: inner.closed,
        sentinels: std::collections::BTreeMap::new(),
        ops: ProxyOps { cmd, ..ProxyOps::default() },
        sessions: crate::codis::model::ProxySessions::default(),
        rusage: ProxyRusage {
            now: wire::go_time_now(),
            cpu: 0.0,
            mem: 0,
            raw: ProxyRusageRaw { num_threads: 1, ..ProxyRusageRaw::default() },
        },
        backend: crate::codis::model::ProxyBackend { primary_only: shared.opts.primary_only },
        runtime,
        slow_cmd_count: shared.opts.fork.then_some(0),
    }
}

fn closed_error() -> ApiError {
    ApiError::traced("use of closed proxy")
}

async fn dispatch(State(shared): State<Arc<Shared>>, method: Method, uri: Uri, body: Bytes) -> Response<Body> {
    shared.inner().requests += 1;
    let Some(segs) = wire::segments(uri.path()) else {
        return wire::not_found();
    };
    let s: Vec<&str> = segs.iter().map(String::as_str).collect();
    let get = method == Method::GET;
    let put = method == Method::PUT;
    let model = || {
        let mut m = shared.inner().model.clone();
        m.id = 0;
        wire::ok_json(&m)
    };
    let slots = || wire::ok_json(&shared.inner().slots);
    let result = match s.as_slice() {
        ["proxy", "model"] | ["api", "proxy", "model"] if get => Ok(model()),
        ["proxy", "stats"] if get => Ok(wire::ok_json(&stats(&shared, true))),
        ["proxy", "slots"] if get => Ok(slots()),
        ["api", "proxy", "xping", x] if get => authed(&shared, x).map(|()| wire::ok()),
        ["api", "proxy", "stats", x] if get => authed(&shared, x).map(|()| wire::ok_json(&stats(&shared, false))),
        ["api", "proxy", "stats", x, flags] if get => {
            authed(&shared, x).map(|()| wire::ok_json(&stats(&shared, flags.parse::<u32>().is_ok_and(|f| f != 0))))
        }
        ["api", "proxy", "slots", x] if get => authed(&shared, x).map(|()| slots()),
        ["api", "proxy", "stats", "reset", x]
        | ["api", "proxy", "forcegc", x]
        | ["api", "proxy", "loglevel", x, _]
        | ["api", "proxy", "sentinels", x, "rewatch"]
            if put =>
        {
            authed(&shared, x).map(|()| wire::ok())
        }
        ["api", "proxy", "sentinels", x] if put => authed(&shared, x).map(|()| wire::ok()),
        ["api", "proxy", "start", x] if put => authed(&shared, x).and_then(|()| {
            let mut inner = shared.inner();
            if inner.closed {
                return Err(closed_error());
            }
            inner.online = true;
            Ok(wire::ok())
        }),
        ["api", "proxy", "fillslots", x] if put => match authed(&shared, x) {
            Ok(()) => fill_slots(&shared, &body).await,
            Err(e) => Err(e),
        },
        ["api", "proxy", "shutdown", x] if put => authed(&shared, x).map(|()| {
            {
                let mut inner = shared.inner();
                inner.closed = true;
                inner.online = false;
            }
            // Close the ports once this answer is out (the listener lets in-flight requests finish).
            if let Some(l) = shared.listener.get().and_then(Weak::upgrade) {
                l.pause(false);
            }
            if let Some(d) = shared.data.get().and_then(Weak::upgrade) {
                d.pause();
            }
            wire::ok()
        }),
        _ => return wire::not_found(),
    };
    wire::reply(result)
}

/// `fillslots`: each slot is taken exclusively (waiting for its requests in flight), replaced, and released unless
/// it comes locked, in which case the exclusive hold stays until a later fill unlocks it.
async fn fill_slots(shared: &Shared, body: &[u8]) -> Result<Response<Body>, ApiError> {
    let filled: Vec<Slot> = serde_json::from_slice(body).unwrap_or_default();
    {
        let inner = shared.inner();
        if inner.closed {
            return Err(closed_error());
        }
        let n = inner.slots.len();
        if let Some(bad) = filled.iter().find(|s| s.id >= n) {
            return Err(ApiError::traced(format!("invalid slot id = {}", bad.id)));
        }
    }
    for slot in filled {
        let cell = &shared.cells[slot.id];
        let mut held = cell.held.lock().await;
        let guard = match held.take() {
            Some(g) => g,
            None => cell.lock.clone().write_owned().await,
        };
        let locked = slot.locked;
        let id = slot.id;
        shared.inner().slots[id] = slot;
        if locked {
            *held = Some(guard);
        }
    }
    shared.inner().fillslots_calls += 1;
    Ok(wire::ok())
}

// ---- the data port --------------------------------------------------------------------------------------------------

/// The RESP listener: can be closed (clients dropped, connections refused) and opened again on the same port.
struct DataPort {
    addr: SocketAddr,
    rt: tokio::runtime::Handle,
    shared: Weak<Shared>,
    stop: Mutex<Option<watch::Sender<bool>>>,
    /// While closed the port is free: no redis-server or etcd of this process may be given it.
    _lease: Option<PortLease>,
}

impl DataPort {
    fn start(
        rt: &tokio::runtime::Handle,
        listener: std::net::TcpListener,
        shared: Arc<Shared>,
    ) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        let port = Self {
            addr,
            rt: rt.clone(),
            shared: Arc::downgrade(&shared),
            stop: Mutex::new(None),
            _lease: PortLease::hold(addr.port()),
        };
        port.serve(listener)?;
        Ok(port)
    }

    fn serve(&self, listener: std::net::TcpListener) -> std::io::Result<()> {
        listener.set_nonblocking(true)?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let shared = self.shared.clone();
        self.rt.spawn(async move {
            let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                return;
            };
            let mut stop = stop_rx.clone();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        let Some(shared) = shared.upgrade() else { return };
                        tokio::spawn(serve_client(shared, stream, stop_rx.clone()));
                    }
                    _ = stop.changed() => return,
                }
            }
        });
        *self.stop.lock().unwrap_or_else(PoisonError::into_inner) = Some(stop_tx);
        Ok(())
    }

    fn pause(&self) {
        if let Some(stop) = self.stop.lock().unwrap_or_else(PoisonError::into_inner).take() {
            let _ = stop.send(true);
        }
    }

    fn resume(&self) -> std::io::Result<()> {
        if self.stop.lock().unwrap_or_else(PoisonError::into_inner).is_some() {
            return Ok(());
        }
        let mut last = None;
        for _ in 0..100 {
            match std::net::TcpListener::bind(self.addr) {
                Ok(l) => return self.serve(l),
                Err(e) => last = Some(e),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("cannot rebind")))
    }
}

impl Drop for DataPort {
    fn drop(&mut self) {
        self.pause();
    }
}

/// One client session: refused unless the proxy is online, then one command at a time.
async fn serve_client(shared: Arc<Shared>, stream: tokio::net::TcpStream, mut stop: watch::Receiver<bool>) {
    let _ = stream.set_nodelay(true);
    let (read, mut write) = stream.into_split();
    let online = {
        let inner = shared.inner();
        inner.online && !inner.closed
    };
    if !online {
        let _ = write.write_all(b"-ERR router is not online\r\n").await;
        return;
    }
    let mut reader = BufReader::new(read);
    loop {
        let command = tokio::select! {
            c = read_command(&mut reader) => c,
            _ = stop.changed() => return,
        };
        let Ok(Some(args)) = command else { return };
        let quit = args[0].eq_ignore_ascii_case(b"QUIT");
        let reply = tokio::select! {
            r = handle(&shared, args) => r,
            _ = stop.changed() => return,
        };
        let mut out = Vec::new();
        reply.encode(&mut out);
        if write.write_all(&out).await.is_err() || quit {
            return;
        }
    }
}

fn error(text: impl Into<String>) -> Reply {
    Reply::Error(text.into())
}

/// `Session.handleRequest`: the commands the proxy answers itself, the multi-key ones it splits, the rest routed.
async fn handle(shared: &Shared, args: Vec<Vec<u8>>) -> Reply {
    let op = String::from_utf8_lossy(&args[0]).to_ascii_uppercase();
    let wrong = || error(format!("ERR wrong number of arguments for '{op}' command"));
    match op.as_str() {
        "QUIT" => Reply::Status("OK".into()),
        "AUTH" => error("ERR Client sent AUTH, but no password is set"),
        "PING" => match args.get(1) {
            Some(msg) => Reply::Bulk(Some(msg.clone())),
            None => Reply::Status("PONG".into()),
        },
        "SELECT" => match args.get(1).map(Vec::as_slice) {
            Some(b"0") => Reply::Status("OK".into()),
            Some(_) => error("ERR the testbed proxy double serves database 0 only"),
            None => wrong(),
        },
        "MGET" | "DEL" | "EXISTS" if args.len() > 2 => {
            let mut replies = Vec::with_capacity(args.len() - 1);
            for key in &args[1..] {
                let sub =
                    if op == "MGET" { vec![b"GET".to_vec(), key.clone()] } else { vec![args[0].clone(), key.clone()] };
                match route(shared, &sub).await {
                    Ok(r) => replies.push(r),
                    Err(e) => return error(format!("ERR handle request, {e}")),
                }
            }
            coalesce(&op, replies)
        }
        "MGET" | "DEL" | "EXISTS" if args.len() < 2 => wrong(),
        "MSET" if args.len() > 3 => {
            if args.len().is_multiple_of(2) {
                return wrong();
            }
            let mut last = Reply::Status("OK".into());
            for pair in args[1..].chunks(2) {
                let sub = vec![args[0].clone(), pair[0].clone(), pair[1].clone()];
                match route(shared, &sub).await {
                    Ok(Reply::Error(e)) => return error(format!("ERR handle response, bad mset resp: {e}")),
                    Ok(r) => last = r,
                    Err(e) => return error(format!("ERR handle request, {e}")),
                }
            }
            last
        }
        _ => match route(shared, &args).await {
            Ok(r) => r,
            Err(e) => error(format!("ERR handle request, {e}")),
        },
    }
}

/// Joins the answers of a split `MGET`, `DEL` or `EXISTS`.
fn coalesce(op: &str, replies: Vec<Reply>) -> Reply {
    if let Some(Reply::Error(e)) = replies.iter().find(|r| matches!(r, Reply::Error(_))) {
        return error(format!("ERR handle response, bad {} resp: {e}", op.to_ascii_lowercase()));
    }
    match op {
        "MGET" => Reply::Array(Some(replies)),
        "EXISTS" => Reply::Int(
            replies.iter().filter(|r| r.as_int().is_some_and(|n| n != 0)).count().try_into().unwrap_or(i64::MAX),
        ),
        _ => Reply::Int(replies.iter().filter_map(Reply::as_int).sum()),
    }
}

/// The key a command is routed by (codis-proxy's `getHashKey`).
fn hash_key<'a>(op: &str, args: &'a [Vec<u8>]) -> &'a [u8] {
    let index = match op {
        "ZINTERSTORE" | "ZUNIONSTORE" | "EVAL" | "EVALSHA" => 3,
        _ => 1,
    };
    args.get(index).map_or(&[], Vec::as_slice)
}

/// Runs `script` on the source master and tells what happened (`SLOTSMGRT-EXEC-WRAPPER`'s reply): `[0]` the key is
/// not there (the target has it or will), `[2, reply]` it ran there.
const EXEC_WRAPPER: &str = "if redis.call('EXISTS', KEYS[1]) == 0 then return {0} end \
                            return {2, redis.pcall(unpack(ARGV))}";

/// `Router.dispatch` + `forwardSemiAsync`/`forwardSync`: the request of one key through its slot.
async fn route(shared: &Shared, args: &[Vec<u8>]) -> Result<Reply, String> {
    let op = String::from_utf8_lossy(&args[0]).to_ascii_uppercase();
    let hkey = hash_key(&op, args);
    let nslots = shared.opts.max_slot_num;
    let cell = &shared.cells[slot_of(hkey, nslots)];
    // Held for the whole request: a fill of this slot waits for it, and a locked slot makes it wait.
    let _running = cell.lock.clone().read_owned().await;
    let route = shared.inner().slots[slot_of(hkey, nslots)].clone();
    if route.backend_addr.is_empty() {
        return Err("slot is not ready, may be offline".into());
    }
    let backend = shared.dial_target(&route.backend_addr);
    if !route.migrate_from.is_empty() && !hkey.is_empty() {
        let from = shared.dial_target(&route.migrate_from);
        if route.forward_method == 0 {
            move_key(shared, &from, &backend, hkey).await?;
        } else if let Some(reply) = exec_on_source(shared, &from, hkey, args).await? {
            return Ok(reply);
        }
    }
    call(shared, &backend, &args.iter().map(Vec::as_slice).collect::<Vec<_>>()).await
}

/// Semi-async: runs the command on the source when the key is still there; `None` when it is not.
async fn exec_on_source(shared: &Shared, from: &str, hkey: &[u8], args: &[Vec<u8>]) -> Result<Option<Reply>, String> {
    let mut wrapped: Vec<&[u8]> = if shared.opts.redis_stand_ins {
        vec![b"EVAL", EXEC_WRAPPER.as_bytes(), b"1", hkey]
    } else {
        vec![b"SLOTSMGRT-EXEC-WRAPPER", hkey]
    };
    wrapped.extend(args.iter().map(Vec::as_slice));
    loop {
        match call(shared, from, &wrapped).await? {
            Reply::Array(Some(items)) if !items.is_empty() => match (items[0].as_int(), items.get(1)) {
                (Some(0), _) => return Ok(None),
                (Some(2), Some(reply)) => return Ok(Some(reply.clone())),
                // The key is in a batch on the wire: retry, as codis-proxy does.
                (Some(1), _) => tokio::time::sleep(Duration::from_millis(1)).await,
                _ => return Err(format!("bad slotsmgrt-exec-wrapper resp: {items:?}")),
            },
            Reply::Error(e) => return Err(format!("bad slotsmgrt-exec-wrapper resp: {e}")),
            other => return Err(format!("bad slotsmgrt-exec-wrapper resp: {other:?}")),
        }
    }
}

/// Sync: moves the key from the source to the target before the command runs there.
async fn move_key(shared: &Shared, from: &str, to: &str, hkey: &[u8]) -> Result<(), String> {
    let (host, port) = to.rsplit_once(':').unwrap_or((to, ""));
    let reply = if shared.opts.redis_stand_ins {
        let mut args: Vec<&[u8]> = vec![b"MIGRATE", host.as_bytes(), port.as_bytes(), hkey, b"0", b"3000", b"REPLACE"];
        if !shared.opts.auth.is_empty() {
            args.extend([b"AUTH".as_slice(), shared.opts.auth.as_bytes()]);
        }
        call(shared, from, &args).await?
    } else {
        call(shared, from, &[b"SLOTSMGRTTAGONE", host.as_bytes(), port.as_bytes(), b"3000", hkey]).await?
    };
    match reply {
        Reply::Error(e) => Err(format!("bad slotsmgrt resp: {e}")),
        _ => Ok(()),
    }
}

/// One command on a pooled backend connection; a connection that fails is dropped.
async fn call(shared: &Shared, real: &str, args: &[&[u8]]) -> Result<Reply, String> {
    let pooled = {
        let mut pool = shared.backends.lock().unwrap_or_else(PoisonError::into_inner);
        pool.get_mut(real).and_then(Vec::pop)
    };
    let auth = Some(shared.opts.auth.as_str()).filter(|a| !a.is_empty());
    let mut conn = match pooled {
        // Killed while idle (a SLAVEOF with CLIENT KILL on that server): nothing was sent, so dial again.
        Some(c) if !c.peer_closed() => c,
        _ => Conn::dial(real, auth, Duration::from_secs(3)).await?,
    };
    let reply = conn.request(args).await?;
    shared.backends.lock().unwrap_or_else(PoisonError::into_inner).entry(real.to_owned()).or_default().push(conn);
    Ok(reply)
}
