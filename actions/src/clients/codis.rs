//! Typed client for the codis-dashboard admin API: the only way actions read or change the Codis topology.
//!
//! Actions hold a [`Dashboard`] for the whole run: [`Dashboard::connect`] learns the product name from the model,
//! derives the xauth and checks it with `xping`; every call after that is one bounded HTTP request. Reads decode into
//! the serde models below, which tolerate the fields the Pika fork adds or drops; mutations succeed only on HTTP 200
//! with the body `"OK"`. Failures carry the dashboard's `Cause` text verbatim, since that is what an operator reads,
//! and [`Error::is_already_exists`], [`Error::is_not_found`] and [`Error::is_promoting`] let the idempotent verbs of
//! the actions treat "already done" as success. The xauth never appears in an error or a log line: endpoints are
//! rendered with a literal `{xauth}` placeholder.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use reqwest::Method;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::input::address::HostPort;

/// What stands for the xauth in every endpoint shown to people; the real value is substituted only into the URL.
const XAUTH: &str = "{xauth}";

/// Longest piece of a non-Codis error body kept in a message (proxies and load balancers can answer with pages).
const MAX_BODY_IN_ERROR: usize = 300;

/// Failures talking to the codis-dashboard.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The dashboard answered with something other than HTTP 200 (Codis reports its own errors as HTTP 800).
    #[error("codis {endpoint}: {cause}{}", http_note(.status))]
    Codis {
        /// Method and path, with `{xauth}` in place of the xauth.
        endpoint: String,
        /// The HTTP status (800 for errors Codis itself reports).
        status: u16,
        /// The `Cause` of an HTTP 800 reply, verbatim; otherwise the body, trimmed and truncated.
        cause: String,
    },
    /// The request did not complete: connection refused, DNS failure, timeout, reset.
    #[error("codis {endpoint}: cannot talk to {addr}")]
    Transport {
        /// The dashboard, or the proxy asked through its admin API.
        addr: String,
        /// Method and path, with `{xauth}` in place of the xauth.
        endpoint: String,
        /// What went wrong (its URL stripped, since the URL holds the xauth).
        #[source]
        source: reqwest::Error,
    },
    /// The dashboard answered HTTP 200 with a body that is not what the endpoint returns.
    #[error("codis {endpoint}: unexpected reply: {message}")]
    Decode {
        /// Method and path, with `{xauth}` in place of the xauth.
        endpoint: String,
        /// Why the body could not be used.
        message: String,
    },
    /// The dashboard serves another product than the one the cluster is configured for.
    #[error("codis dashboard serves product {actual:?}, expected {expected:?}")]
    ProductMismatch {
        /// The configured product name.
        expected: String,
        /// The dashboard's product name.
        actual: String,
    },
    /// A value cannot be sent as a path segment (Codis has no escaping for `/`, `#` or `?`).
    #[error("codis {endpoint}: {value:?} cannot be sent as a path segment")]
    BadSegment {
        /// The route the value was meant for, with `{xauth}` in place of the xauth.
        endpoint: String,
        /// The offending value.
        value: String,
    },
}

#[allow(clippy::trivially_copy_pass_by_ref)] // thiserror hands fields over by reference
fn http_note(status: &u16) -> String {
    // 800 is how Codis reports its own refusals: the cause says it all. Anything else came from elsewhere.
    if *status == 800 {
        String::new()
    } else {
        format!(" (http {status})")
    }
}

impl Error {
    /// The dashboard's own explanation, when it gave one.
    #[must_use]
    pub fn cause(&self) -> Option<&str> {
        match self {
            Self::Codis { cause, .. } => Some(cause),
            _ => None,
        }
    }

    /// Whether Codis refused because the thing to create is already there (`group-[3] already exists`,
    /// `server-[a] already exists`; also the sync-action spelling `server-[a] action already exist`).
    #[must_use]
    pub fn is_already_exists(&self) -> bool {
        self.codis_cause().is_some_and(|c| c.ends_with("already exists") || c.ends_with("already exist"))
    }

    /// Whether Codis refused because the thing to act on is not there (`group-[3] doesn't exist`).
    #[must_use]
    pub fn is_not_found(&self) -> bool {
        self.codis_cause().is_some_and(|c| c.contains("doesn't exist"))
    }

    /// Whether Codis refused because a server is not in the group (`group-[g] doesn't have server-[a]`).
    #[must_use]
    pub fn is_not_member(&self) -> bool {
        self.codis_cause().is_some_and(|c| c.contains("doesn't have server"))
    }

    /// Whether Codis refused because the group is in the middle of a promotion (`group-[3] is promoting`).
    #[must_use]
    pub fn is_promoting(&self) -> bool {
        self.codis_cause().is_some_and(|c| c.contains("is promoting"))
    }

    /// Whether Codis refused to remove a slot action that has started (`slot-[100] action isn't pending`).
    #[must_use]
    pub fn is_not_pending(&self) -> bool {
        self.codis_cause().is_some_and(|c| c.contains("isn't pending"))
    }

    /// Whether Codis refused to remove a group's master while the group holds slots
    /// (`group-[2] can't remove master, still in use`).
    #[must_use]
    pub fn is_master_in_use(&self) -> bool {
        self.codis_cause().is_some_and(|c| c.contains("can't remove master"))
    }

    /// Whether Codis refused a promote because the server is the master already (`group-[1] can't promote master`).
    #[must_use]
    pub fn is_master_already(&self) -> bool {
        self.codis_cause().is_some_and(|c| c.contains("can't promote master"))
    }

    /// Whether Codis refused a promote only because a migration batch is on the wire
    /// (`slots-migration is running = 1`): accepted between two batches.
    #[must_use]
    pub fn is_migration_running(&self) -> bool {
        self.codis_cause().is_some_and(|c| c.contains("slots-migration is running"))
    }

    /// The cause, only when Codis itself produced it: a proxy's 404 page must never read as "doesn't exist".
    fn codis_cause(&self) -> Option<&str> {
        match self {
            Self::Codis { status: 800, cause, .. } => Some(cause),
            _ => None,
        }
    }
}

/// The xauth of a product: lowercase hex of the first 16 bytes of SHA-256 of `Codis-XAuth-[<product>]`.
#[must_use]
pub fn xauth(product: &str) -> String {
    let digest = Sha256::digest(format!("Codis-XAuth-[{product}]").as_bytes());
    hex::encode(&digest[..16])
}

/// The xauth a proxy takes: like [`xauth`], over `Codis-XAuth-[<product>]-[<product_auth>]-[<proxy token>]`.
#[must_use]
pub fn proxy_xauth(product: &str, auth: &str, token: &str) -> String {
    let digest = Sha256::digest(format!("Codis-XAuth-[{product}]-[{auth}]-[{token}]").as_bytes());
    hex::encode(&digest[..16])
}

/// A connected codis-dashboard whose product name and xauth are known and checked.
#[derive(Clone)]
pub struct Dashboard {
    addr: HostPort,
    product: String,
    xauth: String,
    http: reqwest::Client,
    timeout: Duration,
}

impl fmt::Debug for Dashboard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Written out by hand so that the xauth stays out of debug output.
        f.debug_struct("Dashboard")
            .field("addr", &self.addr)
            .field("product", &self.product)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Dashboard {
    /// Connects to the dashboard at `addr`: reads the model to learn the product name, checks it against `expected_product` when given (and not empty), and verifies the derived xauth
    /// with `xping`.
    /// Every request of this dashboard is bounded by `timeout`.
    pub async fn connect(addr: &HostPort, expected_product: Option<&str>, timeout: Duration) -> Result<Self, Error> {
        let addr = addr.clone();
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            // The dashboard is an in-cluster service and its URLs carry the xauth: never route them via a proxy.
            .no_proxy()
            .build()
            .map_err(|source| Error::Transport {
                addr: addr.to_string(),
                endpoint: "GET /api/topom/model".into(),
                source: source.without_url(),
            })?;
        let mut dashboard = Self { addr, product: String::new(), xauth: String::new(), http, timeout };
        let model = dashboard.model().await?;
        // An empty product name means "not configured", as an unset variable renders it.
        if let Some(expected) = expected_product.filter(|p| !p.is_empty()) {
            if expected != model.product_name {
                return Err(Error::ProductMismatch { expected: expected.to_owned(), actual: model.product_name });
            }
        }
        dashboard.xauth = xauth(&model.product_name);
        dashboard.product = model.product_name;
        let endpoint = "GET /api/topom/xping/{xauth}";
        let body = dashboard.send(Method::GET, "/api/topom/xping/{xauth}", None).await?;
        expect_ok(endpoint, &body)?;
        Ok(dashboard)
    }

    /// The product name the dashboard serves.
    #[must_use]
    pub fn product(&self) -> &str {
        &self.product
    }

    /// The dashboard's address.
    #[must_use]
    pub fn addr(&self) -> &HostPort {
        &self.addr
    }

    // ---- reads -------------------------------------------------------------------------------------------------

    /// The dashboard's model (`GET /api/topom/model`, no xauth).
    pub async fn model(&self) -> Result<Model, Error> {
        self.get_json("/api/topom/model").await
    }

    /// Slots, groups, proxies and the slot-action state (`GET /api/topom/stats/{xauth}`).
    pub async fn stats(&self) -> Result<Stats, Error> {
        self.get_json(&route("stats", &[])?).await
    }

    /// Only the groups and proxies of the stats (the same call): decoding skips the slot table, every server's INFO
    /// map and every proxy's counters instead of building them, which is most of what a read costs a process that
    /// reads it every few seconds.
    pub async fn watched(&self) -> Result<Watched, Error> {
        #[derive(Deserialize)]
        struct StatsWatched {
            group: GroupModels,
            #[serde(default)]
            proxy: ProxyHealths,
        }
        #[derive(Deserialize)]
        struct GroupModels {
            #[serde(default)]
            models: Vec<Group>,
        }
        #[derive(Deserialize, Default)]
        struct ProxyHealths {
            #[serde(default)]
            models: Vec<Proxy>,
            #[serde(default)]
            stats: BTreeMap<String, Health>,
        }
        /// A proxy's stats entry without its counters.
        #[derive(Deserialize)]
        struct Health {
            #[serde(default)]
            error: Option<Value>,
            #[serde(default)]
            timeout: Option<bool>,
        }
        let only: StatsWatched = self.get_json(&route("stats", &[])?).await?;
        let mut health = only.proxy.stats;
        let proxies = only
            .proxy
            .models
            .into_iter()
            .map(|proxy| {
                let unreachable =
                    health.remove(&proxy.token).and_then(|h| unreachable_reason(h.error.as_ref(), h.timeout));
                ProxyHealth { proxy, unreachable }
            })
            .collect();
        Ok(Watched { groups: only.group.models, proxies })
    }

    // ---- groups ------------------------------------------------------------------------------------------------

    /// Creates group `gid` (1..=9999).
    pub async fn group_create(&self, gid: u32) -> Result<(), Error> {
        self.put_ok("group/create", &[&gid.to_string()], None).await
    }

    /// Removes group `gid`, which must have no servers.
    pub async fn group_remove(&self, gid: u32) -> Result<(), Error> {
        self.put_ok("group/remove", &[&gid.to_string()], None).await
    }

    /// Appends server `addr` to group `gid` (the first server added is the master). The dashboard dials it first.
    pub async fn group_add(&self, gid: u32, addr: &str) -> Result<(), Error> {
        self.put_ok("group/add", &[&gid.to_string(), addr], None).await
    }

    /// Removes server `addr` from group `gid`.
    pub async fn group_del(&self, gid: u32, addr: &str) -> Result<(), Error> {
        self.put_ok("group/del", &[&gid.to_string(), addr], None).await
    }

    /// Makes `addr` the master of group `gid` (moves it to index 0 and sends it `SLAVEOF NO ONE`).
    pub async fn group_promote(&self, gid: u32, addr: &str) -> Result<(), Error> {
        self.put_ok("group/promote", &[&gid.to_string(), addr], None).await
    }

    /// Pushes every group's slots to every proxy.
    pub async fn group_resync_all(&self) -> Result<(), Error> {
        self.put_ok("group/resync-all", &[], None).await
    }

    /// Pushes group `gid`'s slots, as the dashboard has them, to every proxy: undoes a [`Dashboard::proxy_fill_slots`].
    pub async fn group_resync(&self, gid: u32) -> Result<(), Error> {
        self.put_ok("group/resync", &[&gid.to_string()], None).await
    }

    // ---- a proxy's own admin API ---------------------------------------------------------------------------------

    /// The slot table of the proxy with `token` whose admin API is at `at` (`GET /api/proxy/slots/{pxauth}`);
    /// `auth` is the product's `product_auth`.
    pub async fn proxy_slots(&self, at: &HostPort, token: &str, auth: &str) -> Result<Vec<ProxySlot>, Error> {
        let body = self.send_to_proxy(at, token, auth, Method::GET, "slots", None).await?;
        decode(&format!("GET {at}/api/proxy/slots/{XAUTH}"), &body)
    }

    /// Replaces these slots of `proxy`'s table (`PUT /api/proxy/fillslots/{pxauth}`), as the dashboard does. A slot
    /// filled `locked` holds its requests at the proxy, once those already sent to its backend are answered.
    pub async fn proxy_fill_slots(
        &self,
        at: &HostPort,
        token: &str,
        auth: &str,
        slots: &[ProxySlot],
    ) -> Result<(), Error> {
        let endpoint = format!("PUT {at}/api/proxy/fillslots/{XAUTH}");
        let body = serde_json::to_value(slots)
            .map_err(|e| Error::Decode { endpoint: endpoint.clone(), message: e.to_string() })?;
        crate::failpoint::step("proxy fillslots");
        let reply = self.send_to_proxy(at, token, auth, Method::PUT, "fillslots", Some(body)).await?;
        expect_ok(&endpoint, &reply)
    }

    /// The token of the proxy serving its admin API at `at` (`GET /api/proxy/model`, no xauth): another token than
    /// the one registered means the registered process is gone and another took its address.
    pub async fn proxy_token_at(&self, at: &HostPort) -> Result<String, Error> {
        let path = "/api/proxy/model";
        let body = self.send_at(&at.to_string(), "", Method::GET, path, None).await?;
        let proxy: Proxy = decode(&format!("GET {at}{path}"), &body)?;
        Ok(proxy.token)
    }

    // ---- slots -------------------------------------------------------------------------------------------------

    /// Queues the migration of slots `beg..=end` to group `gid` (all or nothing).
    pub async fn slot_action_create_range(&self, beg: u32, end: u32, gid: u32) -> Result<(), Error> {
        self.put_ok("slots/action/create-range", &[&beg.to_string(), &end.to_string(), &gid.to_string()], None).await
    }

    /// Pauses (`true`) or resumes the migration executor (`slots/action/disabled`): paused, it starts no batch and
    /// takes up no pending action; a batch on the wire finishes. Kept in the dashboard's memory only.
    pub async fn slot_actions_disabled(&self, disabled: bool) -> Result<(), Error> {
        self.put_ok("slots/action/disabled", &[flag(disabled)], None).await
    }

    /// Cancels the pending migration of slot `sid` (only pending actions can be cancelled).
    pub async fn slot_action_remove(&self, sid: u32) -> Result<(), Error> {
        self.put_ok("slots/action/remove", &[&sid.to_string()], None).await
    }

    /// Maps each `(slot, group)` pair without moving any data (for slots with no keys).
    pub async fn slots_assign(&self, mapping: &[(u32, u32)]) -> Result<(), Error> {
        let body: Vec<Value> =
            mapping.iter().map(|(sid, gid)| serde_json::json!({ "id": sid, "group_id": gid })).collect();
        self.put_ok("slots/assign", &[], Some(Value::Array(body))).await
    }

    /// Sets the given slots offline (they must already map to group 0).
    pub async fn slots_assign_offline(&self, slots: &[u32]) -> Result<(), Error> {
        let body: Vec<Value> = slots.iter().map(|sid| serde_json::json!({ "id": sid })).collect();
        self.put_ok("slots/assign", &["offline"], Some(Value::Array(body))).await
    }

    /// Computes the dashboard's rebalance plan, slot id → group id; with `confirm` it also queues the migrations.
    pub async fn rebalance(&self, confirm: bool) -> Result<BTreeMap<u32, u32>, Error> {
        let path = route("slots/rebalance", &[flag(confirm)])?;
        self.log_mutation(&path);
        let body = self.send(Method::PUT, &path, None).await?;
        decode(&format!("PUT {path}"), &body)
    }

    // ---- proxies and the dashboard itself ------------------------------------------------------------------------

    /// Registers the proxy whose admin API is at `admin_addr`, or refreshes it (idempotent).
    pub async fn proxy_online(&self, admin_addr: &str) -> Result<(), Error> {
        self.put_ok("proxy/online", &[admin_addr], None).await
    }

    /// Removes the proxy with `token` and shuts it down; `force` drops it even when it cannot be reached.
    pub async fn proxy_remove(&self, token: &str, force: bool) -> Result<(), Error> {
        self.put_ok("proxy/remove", &[token, flag(force)], None).await
    }

    /// Makes the dashboard re-read its state from the coordinator.
    pub async fn reload(&self) -> Result<(), Error> {
        self.put_ok("reload", &[], None).await
    }

    // ---- plumbing ----------------------------------------------------------------------------------------------

    async fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T, Error> {
        let body = self.send(Method::GET, path, None).await?;
        decode(&format!("GET {path}"), &body)
    }

    async fn put_ok(&self, name: &str, args: &[&str], body: Option<Value>) -> Result<(), Error> {
        let path = route(name, args)?;
        self.log_mutation(&path);
        let reply = self.send(Method::PUT, &path, body).await?;
        expect_ok(&format!("PUT {path}"), &reply)
    }

    fn log_mutation(&self, path: &str) {
        crate::failpoint::step(path);
        // `path` holds the placeholder, not the xauth.
        tracing::debug!(dashboard = %self.addr, endpoint = %format!("PUT {path}"), "codis request");
    }

    /// One request to a proxy's admin API route `/api/proxy/<name>/{pxauth}`; the xauth a proxy takes is made of the
    /// product, its `product_auth` and the proxy's token (codis `rpc.NewXAuth`).
    async fn send_to_proxy(
        &self,
        at: &HostPort,
        token: &str,
        auth: &str,
        method: Method,
        name: &str,
        body: Option<Value>,
    ) -> Result<String, Error> {
        let pxauth = proxy_xauth(&self.product, auth, token);
        let path = format!("/api/proxy/{name}/{XAUTH}");
        self.send_at(&at.to_string(), &pxauth, method, &path, body).await
    }

    /// Sends one request and returns the body of a 200 reply. `path` carries the `{xauth}` placeholder, replaced only
    /// in the URL that goes on the wire.
    async fn send(&self, method: Method, path: &str, body: Option<Value>) -> Result<String, Error> {
        let addr = self.addr.to_string();
        self.send_at(&addr, &self.xauth, method, path, body).await
    }

    /// [`Dashboard::send`] to `addr` with `xauth`.
    async fn send_at(
        &self,
        addr: &str,
        xauth: &str,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<String, Error> {
        let endpoint = format!("{method} {path}");
        let url = format!("http://{addr}{}", path.replace(XAUTH, xauth));
        let mut request = self.http.request(method, url).timeout(self.timeout);
        request = match body {
            Some(json) => request.json(&json),
            // Codis reads no body on these routes; an explicit empty one keeps Content-Length: 0 on PUTs.
            None => request.body(""),
        };
        let transport = |source: reqwest::Error| Error::Transport {
            addr: addr.to_owned(),
            endpoint: endpoint.clone(),
            source: source.without_url(),
        };
        let response = request.send().await.map_err(transport)?;
        let status = response.status().as_u16();
        let text = response.text().await.map_err(transport)?;
        // `error_for_status` would let Codis' 800 through as a success: anything but 200 is a failure.
        if status != 200 {
            return Err(Error::Codis { endpoint, status, cause: error_cause(status, &text) });
        }
        Ok(text)
    }
}

/// The path of an xauth route: `/api/topom/<name>/{xauth}/<args…>`, each argument checked to be one segment.
fn route(name: &str, args: &[&str]) -> Result<String, Error> {
    let mut path = format!("/api/topom/{name}/{XAUTH}");
    for arg in args {
        path.push('/');
        path.push_str(segment(&format!("/api/topom/{name}/{XAUTH}"), arg)?);
    }
    Ok(path)
}

/// Codis splits paths on `/` and would stop at `#` or `?`; such values cannot be sent and would silently hit
/// another route.
fn segment<'a>(route: &str, value: &'a str) -> Result<&'a str, Error> {
    if value.is_empty() || value.contains(['/', '#', '?']) || value.chars().any(char::is_whitespace) {
        return Err(Error::BadSegment { endpoint: route.to_owned(), value: value.to_owned() });
    }
    Ok(value)
}

fn flag(value: bool) -> &'static str {
    if value {
        "1"
    } else {
        "0"
    }
}

/// What to report for a non-200 reply: Codis' `Cause` for its own errors, otherwise the start of the body.
fn error_cause(status: u16, body: &str) -> String {
    #[derive(Deserialize)]
    struct CodisError {
        #[serde(rename = "Cause")]
        cause: String,
    }
    if status == 800 {
        if let Ok(err) = serde_json::from_str::<CodisError>(body) {
            return err.cause;
        }
    }
    let trimmed = body.trim();
    if trimmed.is_empty() {
        return "empty reply".to_owned();
    }
    truncate(trimmed, MAX_BODY_IN_ERROR)
}

fn truncate(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

fn decode<T: DeserializeOwned>(endpoint: &str, body: &str) -> Result<T, Error> {
    serde_json::from_str(body).map_err(|e| Error::Decode { endpoint: endpoint.to_owned(), message: e.to_string() })
}

/// Mutations and `xping` answer the JSON string `"OK"`; anything else means the request did not do what it says.
fn expect_ok(endpoint: &str, body: &str) -> Result<(), Error> {
    match serde_json::from_str::<String>(body) {
        Ok(s) if s == "OK" => Ok(()),
        _ => Err(Error::Decode {
            endpoint: endpoint.to_owned(),
            message: format!("expected \"OK\", got {:?}", truncate(body.trim(), MAX_BODY_IN_ERROR)),
        }),
    }
}

/// Decodes a fork-only field leniently: a value of an unexpected type becomes `None` instead of failing the whole
/// reply, because these fields changed type and name across fork versions.
fn lenient<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    let value = Value::deserialize(deserializer)?;
    Ok(serde_json::from_value(value).ok())
}

// ---- models ------------------------------------------------------------------------------------------------------

/// The dashboard's model (`/api/topom/model`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Model {
    /// The dashboard's token.
    pub token: String,
    /// When it started (Go's time format).
    pub start_time: String,
    /// Its admin address as configured.
    pub admin_addr: String,
    /// The product name, from which the xauth is derived.
    pub product_name: String,
    /// Its process id.
    pub pid: i64,
    /// Its working directory.
    pub pwd: String,
    /// `uname` of its host.
    pub sys: String,
}

/// Everything the dashboard knows (`/api/topom/stats/{xauth}`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Stats {
    /// Whether the dashboard is shutting down.
    pub closed: bool,
    /// Every slot, index == id; as many as the dashboard's `max_slot_num`.
    pub slots: Vec<SlotMapping>,
    /// Groups and the health of their servers.
    pub group: GroupStats,
    /// Proxies and their health.
    pub proxy: ProxyStats,
    /// The migration executor.
    pub slot_action: SlotActionStats,
}

impl Stats {
    /// Group `gid`, if it exists.
    #[must_use]
    pub fn group(&self, gid: u32) -> Option<&Group> {
        self.group.models.iter().find(|g| g.id == gid)
    }

    /// The group that has server `addr` (compared without case: these are host names).
    #[must_use]
    pub fn group_of_server(&self, addr: &str) -> Option<&Group> {
        self.group.models.iter().find(|g| g.server(addr).is_some())
    }

    /// The slots mapped to group `gid` (including those being migrated away from it).
    #[must_use]
    pub fn slots_of(&self, gid: u32) -> Vec<&SlotMapping> {
        self.slots.iter().filter(|s| s.group_id == gid).collect()
    }

    /// The slots with a migration towards group `gid`.
    #[must_use]
    pub fn slots_targeting(&self, gid: u32) -> Vec<&SlotMapping> {
        self.slots.iter().filter(|s| !s.is_idle() && s.action.target_id == Some(gid)).collect()
    }

    /// The number of slots (Codis' `max_slot_num`; the Pika fork makes it configurable, so never assume 1024).
    #[must_use]
    pub fn max_slot_num(&self) -> usize {
        self.slots.len()
    }

    /// Whether any slot has a migration queued or running.
    #[must_use]
    pub fn is_migrating(&self) -> bool {
        self.slots.iter().any(|s| !s.is_idle())
    }

    /// The latest health report of server `addr`.
    #[must_use]
    pub fn server_stats(&self, addr: &str) -> Option<&ServerStats> {
        self.group.stats.iter().find(|(k, _)| k.eq_ignore_ascii_case(addr)).map(|(_, v)| v)
    }

    /// The first registered proxy the dashboard cannot reach, and why. Every slot transition and every promote waits
    /// for every proxy, so such a proxy stalls them (a proxy the stats loop has not reached yet counts as alive).
    #[must_use]
    pub fn unreachable_proxy(&self) -> Option<(&Proxy, String)> {
        self.proxy.models.iter().find_map(|proxy| {
            let entry = self.proxy.stats.get(&proxy.token)?;
            Some((proxy, unreachable_reason(entry.error.as_ref(), entry.timeout)?))
        })
    }

    /// The proxy whose admin API is at `admin_addr`.
    #[must_use]
    pub fn proxy_by_admin_addr(&self, admin_addr: &str) -> Option<&Proxy> {
        self.proxy.models.iter().find(|p| p.admin_addr.eq_ignore_ascii_case(admin_addr))
    }
}

/// A slot and the migration it takes part in.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SlotMapping {
    /// Slot id.
    pub id: u32,
    /// The owning group; 0 = offline.
    pub group_id: u32,
    /// The migration of this slot; all fields empty (`{}` on the wire) when there is none.
    pub action: SlotAction,
}

impl SlotMapping {
    /// Whether no migration is queued or running for this slot.
    #[must_use]
    pub fn is_idle(&self) -> bool {
        self.action.state().is_none()
    }
}

/// A slot migration: `pending → preparing → prepared → migrating → finished`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SlotAction {
    /// Queue position.
    pub index: Option<u64>,
    /// The state, as Codis spells it.
    pub state: Option<String>,
    /// The destination group.
    pub target_id: Option<u32>,
}

impl SlotAction {
    /// The state, `None` when there is no action (Go omits empty strings, but an empty one means the same).
    #[must_use]
    pub fn state(&self) -> Option<&str> {
        self.state.as_deref().filter(|s| !s.is_empty())
    }
}

/// Groups and per-server health.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GroupStats {
    /// Every group, by ascending id.
    pub models: Vec<Group>,
    /// Latest health report per server address.
    pub stats: BTreeMap<String, ServerStats>,
}

/// A Codis group: one pika shard.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Group {
    /// Group id.
    pub id: u32,
    /// Its servers; index 0 is the master (the fork's HA may reorder them at any time).
    pub servers: Vec<GroupServer>,
    /// A promotion in progress; all fields empty when there is none.
    pub promoting: Promoting,
    /// Whether proxies may hold a stale view of the group.
    pub out_of_sync: bool,
}

impl Group {
    /// The master's address: the server at index 0 (position is the only marker Codis has).
    #[must_use]
    pub fn master(&self) -> Option<&str> {
        self.servers.first().map(|s| s.server.as_str())
    }

    /// Server `addr` (compared without case: these are host names).
    #[must_use]
    pub fn server(&self, addr: &str) -> Option<&GroupServer> {
        self.servers.iter().find(|s| s.server.eq_ignore_ascii_case(addr))
    }

    /// The index of server `addr` in the group.
    #[must_use]
    pub fn position(&self, addr: &str) -> Option<usize> {
        self.servers.iter().position(|s| s.server.eq_ignore_ascii_case(addr))
    }

    /// Whether a promotion is under way (then Codis refuses most changes to the group).
    #[must_use]
    pub fn is_promoting(&self) -> bool {
        self.promoting.index.is_some() || self.promoting.state.as_deref().is_some_and(|s| !s.is_empty())
    }
}

/// A promotion: `preparing → prepared → finished`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Promoting {
    /// The index of the server being promoted.
    pub index: Option<usize>,
    /// The state.
    pub state: Option<String>,
}

/// A server of a group.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct GroupServer {
    /// Its address as registered (`<pod fqdn>:<port>`).
    pub server: String,
    /// Its datacenter (unused here).
    pub datacenter: String,
    /// Its sync action; all fields empty when there is none.
    pub action: ServerAction,
    /// Whether it serves reads for its replica group.
    pub replica_group: bool,
    /// Fork only: `master` / `slave` from its INFO; empty until the first health check.
    #[serde(alias = "Role", deserialize_with = "lenient")]
    pub role: Option<String>,
    /// Fork only: 0 normal, 1 subjectively offline, 2 offline (only 0 serves).
    #[serde(deserialize_with = "lenient")]
    pub state: Option<i32>,
    /// Fork only: binlog file number from its INFO.
    #[serde(deserialize_with = "lenient")]
    pub binlog_file_num: Option<u64>,
    /// Fork only: binlog offset within that file.
    #[serde(deserialize_with = "lenient")]
    pub binlog_offset: Option<u64>,
    /// Fork only: whether its HA may promote it.
    #[serde(deserialize_with = "lenient")]
    pub is_eligible_for_master_election: Option<bool>,
    /// Fork only: failed health checks so far.
    #[serde(deserialize_with = "lenient")]
    pub recall_times: Option<i64>,
}

/// A server's sync action: `pending → syncing → synced | synced_failed`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ServerAction {
    /// Queue position (gone once done).
    pub index: Option<u64>,
    /// The state.
    pub state: Option<String>,
}

/// What the failover watcher reads of the stats: the groups, and each proxy with the dashboard's last word on it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Watched {
    /// Every group, by ascending id.
    pub groups: Vec<Group>,
    /// Every registered proxy, by ascending id.
    pub proxies: Vec<ProxyHealth>,
}

/// A registered proxy and whether the dashboard reached it the last time it asked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyHealth {
    /// The proxy.
    pub proxy: Proxy,
    /// Why the dashboard could not reach it the last time it asked; `None` when it could, or has not asked yet.
    pub unreachable: Option<String>,
}

/// Why the dashboard could not reach a proxy, from the error and timeout of its stats entry; `None` when it could.
fn unreachable_reason(error: Option<&Value>, timeout: Option<bool>) -> Option<String> {
    match (error, timeout) {
        (Some(e), _) if !e.is_null() => Some(cause_of(e)),
        (_, Some(true)) => Some("its stats request timed out".to_owned()),
        _ => None,
    }
}

/// The cause Codis gives in an error object (`{"Cause": …}`), else the object itself.
fn cause_of(error: &Value) -> String {
    error.get("Cause").and_then(|c| c.as_str()).map_or_else(|| error.to_string(), str::to_owned)
}

/// Proxies and their health.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProxyStats {
    /// Every proxy, by ascending id.
    pub models: Vec<Proxy>,
    /// Latest health report per proxy token.
    pub stats: BTreeMap<String, ProxyStatsEntry>,
}

/// One slot of a proxy's routing table (codis `models.Slot`). Fields this product does not read are kept as they
/// came, so a table read and filled back changes only what was meant.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProxySlot {
    /// The slot.
    pub id: u32,
    /// Requests to it are held.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub locked: bool,
    /// The master it routes to.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub backend_addr: String,
    /// Every other field, untouched.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// A registered codis-proxy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Proxy {
    /// Proxy id.
    pub id: u32,
    /// Its token: what `proxy/remove` takes.
    pub token: String,
    /// When it started.
    pub start_time: String,
    /// Its admin API address.
    pub admin_addr: String,
    /// `tcp4` etc.
    pub proto_type: String,
    /// Its data address.
    pub proxy_addr: String,
    /// Its jodis path, if any.
    pub jodis_path: Option<String>,
    /// The product it serves.
    pub product_name: String,
    /// Its process id.
    pub pid: i64,
    /// Its working directory.
    pub pwd: String,
    /// `uname` of its host.
    pub sys: String,
    /// Fork only: its slot count.
    #[serde(deserialize_with = "lenient")]
    pub max_slot_num: Option<u32>,
    /// Its host name.
    pub hostname: String,
    /// Its datacenter.
    pub datacenter: String,
}

/// A health report: `{"stats": …}`, `{"error": …}` or `{"timeout": true}`, with the time it was taken.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StatsEntry {
    /// What the server or proxy reported.
    pub stats: Option<Map<String, Value>>,
    /// Why it could not be asked (Codis error object).
    pub error: Option<Value>,
    /// Whether asking it timed out.
    pub timeout: Option<bool>,
    /// When the report was taken (Unix seconds).
    pub unixtime: i64,
}

impl StatsEntry {
    /// Whether the last check succeeded.
    #[must_use]
    pub fn is_healthy(&self) -> bool {
        let failed = matches!(&self.error, Some(e) if !e.is_null());
        self.stats.is_some() && !failed && self.timeout != Some(true)
    }

    /// One reported value.
    #[must_use]
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.stats.as_ref().and_then(|s| s.get(key))
    }
}

/// The health report of a server (its `INFO` as a string map, or the dial error).
pub type ServerStats = StatsEntry;

/// The health report of a proxy (`online`, `closed`, ops, sessions…).
pub type ProxyStatsEntry = StatsEntry;

/// The migration executor.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SlotActionStats {
    /// Pause between batches, µs (memory only).
    pub interval: u64,
    /// Whether picking pending actions is paused (memory only).
    pub disabled: bool,
    /// The last batch's outcome.
    pub progress: Progress,
    /// Non-zero only while a batch is on the wire.
    pub executor: i64,
}

/// The last migration batch's outcome: `""`, `[OK] Slot[0683]@DB[0]=700` or `[ERROR] Slot[0683]: <err>`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Progress {
    /// The status line.
    pub status: String,
}

impl Progress {}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// One recorded exchange of `shared/codis-transcripts`.
    #[derive(Deserialize)]
    struct Transcript {
        status: u16,
        response_body: String,
    }

    fn transcript(id: &str) -> Transcript {
        let path = format!("{}/../../shared/codis-transcripts/{id}.json", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        serde_json::from_str(&text).unwrap()
    }

    #[test]
    fn xauth_matches_the_worked_examples() {
        assert_eq!(xauth("codis-demo"), "95b62887719520f17e312eaa76d28f2b");
        assert_eq!(xauth("pika-demo"), "13fef069ae10d4b93a95cd230634c19e");
    }

    #[test]
    fn model_decodes_from_a_recorded_reply() {
        let model: Model = serde_json::from_str(&transcript("002").response_body).unwrap();
        assert_eq!(model.product_name, "codis-demo");
        assert_eq!(model.token, "4a462740b2c4ca0cef8a05d7ff42433a");
        assert_eq!(model.admin_addr, "127.0.0.1:18080");
        assert_eq!(model.pid, 18235);
    }

    #[test]
    fn stats_of_an_empty_cluster_has_1024_offline_idle_slots() {
        let stats: Stats = serde_json::from_str(&transcript("005").response_body).unwrap();
        assert_eq!(stats.max_slot_num(), 1024);
        assert!(stats.slots.iter().enumerate().all(|(i, s)| s.id as usize == i && s.group_id == 0 && s.is_idle()));
        assert!(stats.group.models.is_empty());
        assert!(stats.proxy.models.is_empty());
        assert!(!stats.is_migrating());
        assert!(!stats.slot_action.disabled);
        assert!(stats.group(1).is_none());
    }

    #[test]
    fn stats_while_migrating_shows_the_migrating_slot_and_its_target() {
        let stats: Stats = serde_json::from_str(&transcript("038").response_body).unwrap();
        assert_eq!(stats.max_slot_num(), 1024);
        let migrating: Vec<_> = stats.slots.iter().filter(|s| s.action.state() == Some("migrating")).collect();
        assert_eq!(migrating.len(), 1);
        assert_eq!(migrating[0].id, 517);
        assert_eq!(migrating[0].group_id, 2);
        assert_eq!(migrating[0].action.target_id, Some(1));
        assert_eq!(migrating[0].action.index, Some(6));
        assert!(stats.is_migrating());
        assert!(stats.slots_targeting(1).iter().all(|s| s.group_id == 2));
        assert!(stats.slots_targeting(2).is_empty());

        let group1 = stats.group(1).unwrap();
        assert_eq!(group1.master(), Some("127.0.0.1:6379"));
        assert_eq!(group1.servers[1].action.state.as_deref(), Some("synced"));
        assert!(!group1.is_promoting());
        assert_eq!(stats.group_of_server("127.0.0.1:6381").map(|g| g.id), Some(1));
        assert_eq!(stats.group_of_server("127.0.0.1:6380").map(|g| g.id), Some(2));
        assert!(stats.group_of_server("127.0.0.1:6999").is_none());
        // Upstream servers carry none of the fork's fields.
        assert_eq!(group1.servers[0].state, None);
        assert_eq!(group1.servers[0].role, None);

        let master = stats.server_stats("127.0.0.1:6379").unwrap();
        assert!(master.is_healthy());
        assert_eq!(master.get("role"), Some(&Value::from("master")));

        let proxy = stats.proxy_by_admin_addr("127.0.0.1:11080").unwrap();
        assert_eq!(proxy.token, "2c97b44860344b5271fe1ef5d4849c55");
        let health = &stats.proxy.stats[&proxy.token];
        assert!(health.is_healthy());
        assert_eq!(health.get("online"), Some(&Value::Bool(true)));
    }

    #[test]
    fn fork_group_servers_decode_including_unexpected_types() {
        let json = r#"{"id": 3, "servers": [
            {"server": "a:9221", "datacenter": "", "action": {"state": "synced"}, "role": "master",
             "binlog_file_num": 3, "binlog_offset": 52428800, "is_eligible_for_master_election": true,
             "state": 0, "recall_times": 0, "replica_group": true},
            {"server": "B:9221", "datacenter": "", "action": {}, "role": "", "binlog_file_num": "junk",
             "state": 2, "replica_group": false}],
            "promoting": {"index": 1, "state": "preparing"}, "out_of_sync": false}"#;
        let group: Group = serde_json::from_str(json).unwrap();
        assert_eq!(group.servers[0].role.as_deref(), Some("master"));
        assert_eq!(group.servers[0].binlog_offset, Some(52_428_800));
        assert_eq!(group.servers[0].is_eligible_for_master_election, Some(true));
        assert_eq!(group.servers[1].binlog_file_num, None);
        assert_eq!(group.servers[1].state, Some(2));
        assert_eq!(group.position("b:9221"), Some(1));
        assert!(group.is_promoting());
    }

    #[test]
    fn rebalance_plan_keys_are_slot_ids() {
        let plan: BTreeMap<u32, u32> = decode("PUT x", &transcript("028").response_body).unwrap();
        assert_eq!(plan.len(), 1024);
        assert_eq!(plan[&0], 1);
        assert_eq!(plan[&511], 1);
        assert_eq!(plan[&512], 2);
        assert_eq!(plan[&1023], 2);
    }

    #[test]
    fn codis_error_bodies_yield_their_cause() {
        let t = transcript("004");
        assert_eq!(t.status, 800);
        assert_eq!(error_cause(t.status, &t.response_body), "invalid xauth, please check product name & auth");
        let t = transcript("015");
        assert_eq!(error_cause(t.status, &t.response_body), "server-[127.0.0.1:6381] already exists");
        let t = transcript("007");
        assert_eq!(error_cause(t.status, &t.response_body), "404 page not found");
        assert_eq!(error_cause(800, "not json"), "not json");
        assert_eq!(error_cause(502, ""), "empty reply");
        assert!(error_cause(500, &"x".repeat(5000)).chars().count() <= MAX_BODY_IN_ERROR + 1);
    }

    #[test]
    fn predicates_read_only_codis_causes() {
        let err = |status, cause: &str| Error::Codis { endpoint: "PUT p".into(), status, cause: cause.into() };
        assert!(err(800, "group-[1] already exists").is_already_exists());
        assert!(err(800, "server-[a:1] action already exist").is_already_exists());
        assert!(err(800, "group-[2] doesn't exist").is_not_found());
        assert!(err(800, "group-[2] doesn't have server-[a:1]").is_not_member());
        assert!(err(800, "group-[2] is promoting").is_promoting());
        assert!(err(800, "group-[2] is promoting index = 1").is_promoting());
        assert!(!err(800, "group-[2] isn't empty").is_not_found());
        // Causes as the second recording has them.
        assert!(err(800, "slot-[5] action already exists").is_already_exists());
        assert!(err(800, "slot-[100] action isn't pending").is_not_pending());
        assert!(err(800, "group-[2] can't remove master, still in use").is_master_in_use());
        assert!(err(800, "group-[1] can't promote master").is_master_already());
        assert!(err(800, "slots-migration is running = 1").is_migration_running());
        assert!(!err(800, "group-[3] is promoting").is_migration_running());
        assert!(!err(500, "slots-migration is running = 1").is_migration_running());
        assert!(!err(404, "doesn't exist").is_not_found());
        assert_eq!(err(404, "404 page not found").cause(), Some("404 page not found"));
        let text = err(800, "group-[1] already exists").to_string();
        assert_eq!(text, "codis PUT p: group-[1] already exists");
        assert_eq!(err(404, "404 page not found").to_string(), "codis PUT p: 404 page not found (http 404)");
    }

    #[test]
    fn routes_keep_the_placeholder_and_refuse_unsendable_segments() {
        assert_eq!(route("group/add", &["3", "a.b.svc:9221"]).unwrap(), "/api/topom/group/add/{xauth}/3/a.b.svc:9221");
        assert_eq!(route("slots/assign", &["offline"]).unwrap(), "/api/topom/slots/assign/{xauth}/offline");
        for bad in ["", "a/b", "a?b", "a#b", "a b"] {
            assert!(matches!(route("group/add", &["1", bad]), Err(Error::BadSegment { .. })), "{bad:?}");
        }
    }

    // ---- over HTTP ---------------------------------------------------------------------------------------------

    /// A throwaway HTTP server answering each connection with the next canned reply, recording what it was asked.
    struct Canned {
        addr: String,
        requests: Arc<Mutex<Vec<String>>>,
    }

    impl Canned {
        /// `replies` are `(status line, body)`, served one per connection (each reply closes its connection).
        fn serve(replies: Vec<(&'static str, String)>) -> Self {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap().to_string();
            let requests = Arc::new(Mutex::new(Vec::new()));
            let seen = Arc::clone(&requests);
            std::thread::spawn(move || {
                for (status_line, body) in replies {
                    let Ok((mut stream, _)) = listener.accept() else { return };
                    let request = read_request(&mut stream);
                    seen.lock().unwrap().push(request);
                    let reply = format!(
                        "HTTP/1.1 {status_line}\r\nContent-Type: application/json; charset=utf-8\r\n\
                         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(reply.as_bytes());
                }
            });
            Self { addr, requests }
        }

        fn requests(&self) -> Vec<String> {
            self.requests.lock().unwrap().clone()
        }
    }

    /// Reads one request; returns `METHOD PATH` and, when there is one, ` BODY`.
    fn read_request(stream: &mut std::net::TcpStream) -> String {
        let mut data = Vec::new();
        let mut buf = [0u8; 4096];
        let header_end = loop {
            if let Some(pos) = data.windows(4).position(|w| w == b"\r\n\r\n") {
                break pos + 4;
            }
            let n = stream.read(&mut buf).unwrap();
            assert!(n > 0, "connection closed mid-request");
            data.extend_from_slice(&buf[..n]);
        };
        let head = String::from_utf8_lossy(&data[..header_end]).to_string();
        let length: usize = head
            .lines()
            .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))
            .unwrap_or(0);
        while data.len() < header_end + length {
            let n = stream.read(&mut buf).unwrap();
            assert!(n > 0, "connection closed mid-body");
            data.extend_from_slice(&buf[..n]);
        }
        let request_line = head.lines().next().unwrap_or_default();
        let mut parts = request_line.split(' ');
        let method = parts.next().unwrap_or_default();
        let path = parts.next().unwrap_or_default();
        let body = String::from_utf8_lossy(&data[header_end..header_end + length]);
        if body.is_empty() {
            format!("{method} {path}")
        } else {
            format!("{method} {path} {body}")
        }
    }

    const OK: (&str, &str) = ("200 OK", "\"OK\"");

    fn ok() -> (&'static str, String) {
        (OK.0, OK.1.to_owned())
    }

    fn model_reply() -> (&'static str, String) {
        ("200 OK", transcript("002").response_body)
    }

    async fn connected(server: &Canned) -> Dashboard {
        Dashboard::connect(&HostPort::parse(&server.addr).unwrap(), Some("codis-demo"), Duration::from_secs(5))
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn connect_reads_the_model_and_checks_the_xauth() {
        let server = Canned::serve(vec![model_reply(), ok()]);
        let dashboard = connected(&server).await;
        assert_eq!(dashboard.product(), "codis-demo");
        assert_eq!(dashboard.addr().to_string(), server.addr);
        assert!(!format!("{dashboard:?}").contains("95b62887"));
        assert_eq!(
            server.requests(),
            ["GET /api/topom/model", "GET /api/topom/xping/95b62887719520f17e312eaa76d28f2b"]
        );
    }

    #[tokio::test]
    async fn connect_refuses_another_product() {
        let server = Canned::serve(vec![model_reply()]);
        let err =
            Dashboard::connect(&HostPort::parse(&server.addr).unwrap(), Some("pika-demo"), Duration::from_secs(5))
                .await
                .unwrap_err();
        match err {
            Error::ProductMismatch { expected, actual } => {
                assert_eq!(expected, "pika-demo");
                assert_eq!(actual, "codis-demo");
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_wrong_xauth_is_reported_with_its_cause() {
        let server = Canned::serve(vec![model_reply(), ("800 status code 800", transcript("004").response_body)]);
        let err = Dashboard::connect(&HostPort::parse(&server.addr).unwrap(), None, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert_eq!(err.cause(), Some("invalid xauth, please check product name & auth"));
        assert!(err.to_string().contains("GET /api/topom/xping/{xauth}"), "{err}");
    }

    #[tokio::test]
    async fn the_watched_groups_and_proxies_are_those_of_the_stats_of_the_same_call() {
        let body = transcript("038").response_body;
        let server = Canned::serve(vec![model_reply(), ok(), ("200 OK", body.clone()), ("200 OK", body.clone())]);
        let dashboard = connected(&server).await;
        let watched = dashboard.watched().await.unwrap();
        let stats = dashboard.stats().await.unwrap();
        assert!(watched.groups.len() >= 2, "{watched:?}");
        assert_eq!(watched.groups, stats.group.models);
        let proxies: Vec<Proxy> = watched.proxies.iter().map(|p| p.proxy.clone()).collect();
        assert!(!proxies.is_empty(), "{watched:?}");
        assert_eq!(proxies, stats.proxy.models);
        let unreachable: Vec<Option<String>> = watched.proxies.iter().map(|p| p.unreachable.clone()).collect();
        let expected: Vec<Option<String>> = stats
            .proxy
            .models
            .iter()
            .map(|p| stats.proxy.stats.get(&p.token).filter(|e| !e.is_healthy()).map(|_| String::new()))
            .collect();
        assert_eq!(
            unreachable.iter().map(Option::is_some).collect::<Vec<_>>(),
            expected.iter().map(Option::is_some).collect::<Vec<_>>()
        );
        assert_eq!(server.requests()[2], server.requests()[3]);
    }

    #[tokio::test]
    async fn an_http_800_becomes_a_codis_error_with_the_cause_and_no_xauth() {
        let server = Canned::serve(vec![model_reply(), ok(), ("800 status code 800", transcript("015").response_body)]);
        let dashboard = connected(&server).await;
        let err = dashboard.group_add(2, "127.0.0.1:6381").await.unwrap_err();
        match &err {
            Error::Codis { endpoint, status, cause } => {
                assert_eq!(endpoint, "PUT /api/topom/group/add/{xauth}/2/127.0.0.1:6381");
                assert_eq!(*status, 800);
                assert_eq!(cause, "server-[127.0.0.1:6381] already exists");
            }
            other => panic!("{other:?}"),
        }
        assert!(err.is_already_exists());
        let text = crate::error::Error::from(err).one_line();
        assert!(text.contains("server-[127.0.0.1:6381] already exists"), "{text}");
        assert!(!text.contains("95b62887719520f17e312eaa76d28f2b"), "{text}");
        assert_eq!(server.requests()[2], "PUT /api/topom/group/add/95b62887719520f17e312eaa76d28f2b/2/127.0.0.1:6381");
    }

    #[tokio::test]
    async fn a_404_is_an_error() {
        let server = Canned::serve(vec![model_reply(), ok(), ("404 Not Found", "404 page not found\n".to_owned())]);
        let dashboard = connected(&server).await;
        let err = dashboard.group_create(3).await.unwrap_err();
        assert!(matches!(err, Error::Codis { status: 404, .. }), "{err:?}");
        assert!(!err.is_not_found());
    }

    #[tokio::test]
    async fn mutations_succeed_on_ok_and_send_their_bodies() {
        let server = Canned::serve(vec![model_reply(), ok(), ok(), ok(), ok(), ok()]);
        let dashboard = connected(&server).await;
        dashboard.group_create(3).await.unwrap();
        dashboard.slots_assign(&[(0, 1), (1, 2)]).await.unwrap();
        dashboard.slots_assign_offline(&[5]).await.unwrap();
        dashboard.proxy_remove("2c97b448", true).await.unwrap();
        let x = "95b62887719520f17e312eaa76d28f2b";
        assert_eq!(
            server.requests()[2..],
            [
                format!("PUT /api/topom/group/create/{x}/3"),
                format!(r#"PUT /api/topom/slots/assign/{x} [{{"group_id":1,"id":0}},{{"group_id":2,"id":1}}]"#),
                format!(r#"PUT /api/topom/slots/assign/{x}/offline [{{"id":5}}]"#),
                format!("PUT /api/topom/proxy/remove/{x}/2c97b448/1"),
            ]
        );
    }

    #[tokio::test]
    async fn a_200_that_is_not_ok_is_a_decode_error() {
        let server = Canned::serve(vec![model_reply(), ok(), ("200 OK", "{}".to_owned())]);
        let dashboard = connected(&server).await;
        let err = dashboard.reload().await.unwrap_err();
        assert!(matches!(err, Error::Decode { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn rebalance_returns_the_plan() {
        let server = Canned::serve(vec![model_reply(), ok(), ("200 OK", transcript("028").response_body)]);
        let dashboard = connected(&server).await;
        let plan = dashboard.rebalance(false).await.unwrap();
        assert_eq!(plan.len(), 1024);
        assert!(server.requests()[2].ends_with("/slots/rebalance/95b62887719520f17e312eaa76d28f2b/0"));
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_transport_error_without_the_url() {
        // Bind then drop, so that nothing listens on the port.
        let addr = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
        let err = Dashboard::connect(&HostPort::parse(&addr).unwrap(), None, Duration::from_secs(5)).await.unwrap_err();
        assert!(matches!(&err, Error::Transport { endpoint, .. } if endpoint == "GET /api/topom/model"), "{err:?}");
        let text = crate::error::Error::from(err).one_line();
        assert!(text.contains(&addr), "{text}");
        assert!(!text.contains("http://"), "{text}");
    }

    #[tokio::test]
    async fn a_silent_dashboard_times_out() {
        // Accepts and never answers.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let hold = std::thread::spawn(move || listener.accept().map(|(s, _)| s));
        let err =
            Dashboard::connect(&HostPort::parse(&addr).unwrap(), None, Duration::from_millis(300)).await.unwrap_err();
        match &err {
            Error::Transport { source, .. } => assert!(source.is_timeout(), "{err:?}"),
            other => panic!("{other:?}"),
        }
        drop(hold);
    }
}
