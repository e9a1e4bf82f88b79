//! A codis-proxy admin API double: what the dashboard double talks to when it onlines a proxy, pushes slots, polls
//! stats and shuts a proxy down.
//!
//! It serves the recorded routes (`GET /api/proxy/model`, `/api/proxy/xping/{pxauth}`, `/proxy/stats`,
//! `/api/proxy/stats/{pxauth}`, `/api/proxy/slots/{pxauth}`, `PUT /api/proxy/stats/reset/{pxauth}`) and the internal
//! ones the dashboard uses (`PUT /api/proxy/fillslots/{pxauth}` with a JSON array of slots, `start`, `shutdown`,
//! `sentinels`, `loglevel`, `forcegc`). There is no data port: nothing is proxied; the double only remembers the slot
//! table it was given, which tests can read with [`ProxyDouble::slots`]. [`ProxyDouble::stop`], [`ProxyDouble::freeze`]
//! and [`ProxyDouble::restart`] make it dead, hung, or a fresh process, to exercise the dashboard's stats and stalls.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{Method, Request, Response, Uri};
use tower::ServiceExt;

use crate::codis::model::{
    Proxy, ProxyCmdStats, ProxyOps, ProxyRusage, ProxyRusageRaw, ProxyStats, Slot,
};
use crate::codis::wire::{self, ApiError};
use crate::httpd::{Dropped, Handler, Listener, Runtime};

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
    /// The data address reported in the model (nothing listens there).
    pub proxy_addr: String,
    /// Datacenter reported in the model.
    pub datacenter: String,
    /// Pika fork: the model gains `max_slot_num`, the stats `slow_cmd_count`.
    pub fork: bool,
    /// Slot count.
    pub max_slot_num: usize,
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

struct Shared {
    opts: ProxyOptions,
    xauth: String,
    inner: Mutex<Inner>,
    frozen: tokio::sync::watch::Sender<bool>,
    listener: OnceLock<Weak<Listener>>,
}

impl Shared {
    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn fresh_slots(&self) -> Vec<Slot> {
        (0..self.opts.max_slot_num)
            .map(|id| Slot {
                id,
                ..Slot::default()
            })
            .collect()
    }
}

/// A running proxy admin API double; dropping it stops it.
pub struct ProxyDouble {
    shared: Arc<Shared>,
    listener: Arc<Listener>,
    // Declared last: dropped after the listener, so the runtime outlives the tasks it serves.
    _rt: Runtime,
}

impl std::fmt::Debug for ProxyDouble {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyDouble")
            .field("addr", &self.addr())
            .field("token", &self.token())
            .finish()
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
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let bound = std_listener.local_addr()?.to_string();
        let token = opts
            .token
            .clone()
            .unwrap_or_else(|| wire::token(&format!("proxy/{}/{bound}", opts.product)));
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
            pwd: std::env::current_dir()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            sys: "testbed proxy double".into(),
            max_slot_num: opts.fork.then_some(opts.max_slot_num),
            hostname: "localhost".into(),
            datacenter: opts.datacenter.clone(),
        };
        let xauth = wire::proxy_xauth(&opts.product, &opts.auth, &token);
        let (frozen, _) = tokio::sync::watch::channel(false);
        let slots = (0..opts.max_slot_num)
            .map(|id| Slot {
                id,
                ..Slot::default()
            })
            .collect();
        let shared = Arc::new(Shared {
            opts,
            xauth,
            inner: Mutex::new(Inner {
                model,
                online: false,
                closed: false,
                slots,
                fillslots_calls: 0,
                requests: 0,
            }),
            frozen,
            listener: OnceLock::new(),
        });
        let rt = Runtime::start("proxy-double")?;
        let router = axum::Router::new()
            .fallback(dispatch)
            .with_state(shared.clone());
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
        Ok(Self {
            shared,
            listener,
            _rt: rt,
        })
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

    /// Closes its port: a crashed proxy (connections refused). State is kept for [`ProxyDouble::restart`].
    pub fn stop(&self) {
        self.listener.pause(true);
    }

    /// A fresh proxy process on the same port: not online, not closed, empty slot table. The dashboard's stats loop
    /// re-onlines it, as Codis does.
    ///
    /// # Errors
    /// When the port cannot be bound again.
    pub fn restart(&self) -> std::io::Result<()> {
        self.listener.pause(true);
        {
            let mut inner = self.shared.inner();
            inner.online = false;
            inner.closed = false;
            inner.slots = self.shared.fresh_slots();
            inner.model.start_time = wire::go_time_now();
        }
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
        Err(ApiError::plain(
            "invalid xauth, please check product name & auth",
        ))
    }
}

/// The proxy's stats; `full` adds the per-command table and the Go runtime figures, as `/proxy/stats` and stats
/// with flags do (the double reports one idle `PING` entry and zeros, so the shape matches).
fn stats(shared: &Shared, full: bool) -> ProxyStats {
    let inner = shared.inner();
    let cmd = full.then(|| {
        vec![ProxyCmdStats {
            opstr: "PING".into(),
            ..ProxyCmdStats::default()
        }]
    });
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
        ops: ProxyOps {
            cmd,
            ..ProxyOps::default()
        },
        sessions: crate::codis::model::ProxySessions::default(),
        rusage: ProxyRusage {
            now: wire::go_time_now(),
            cpu: 0.0,
            mem: 0,
            raw: ProxyRusageRaw {
                num_threads: 1,
                ..ProxyRusageRaw::default()
            },
        },
        backend: crate::codis::model::ProxyBackend::default(),
        runtime,
        slow_cmd_count: shared.opts.fork.then_some(0),
    }
}

fn closed_error() -> ApiError {
    ApiError::traced("use of closed proxy")
}

async fn dispatch(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    body: Bytes,
) -> Response<Body> {
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
        ["api", "proxy", "stats", x] if get => {
            authed(&shared, x).map(|()| wire::ok_json(&stats(&shared, false)))
        }
        ["api", "proxy", "stats", x, flags] if get => authed(&shared, x)
            .map(|()| wire::ok_json(&stats(&shared, flags.parse::<u32>().is_ok_and(|f| f != 0)))),
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
        ["api", "proxy", "fillslots", x] if put => authed(&shared, x).and_then(|()| {
            let filled: Vec<Slot> = serde_json::from_slice(&body).unwrap_or_default();
            let mut inner = shared.inner();
            if inner.closed {
                return Err(closed_error());
            }
            let n = inner.slots.len();
            if let Some(bad) = filled.iter().find(|s| s.id >= n) {
                return Err(ApiError::traced(format!("invalid slot id = {}", bad.id)));
            }
            for slot in filled {
                let id = slot.id;
                inner.slots[id] = slot;
            }
            inner.fillslots_calls += 1;
            Ok(wire::ok())
        }),
        ["api", "proxy", "shutdown", x] if put => authed(&shared, x).map(|()| {
            {
                let mut inner = shared.inner();
                inner.closed = true;
                inner.online = false;
            }
            // Close the port once this answer is out (the listener lets in-flight requests finish).
            if let Some(l) = shared.listener.get().and_then(Weak::upgrade) {
                l.pause(false);
            }
            wire::ok()
        }),
        _ => return wire::not_found(),
    };
    wire::reply(result)
}
