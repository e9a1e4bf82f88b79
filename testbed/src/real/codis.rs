//! The fork's codis-dashboard and codis-proxy, as the chart runs them (its rendered `dashboard.toml`/`proxy.toml` and
//! the container's arguments), in the root namespace on ports of the bed's node address (which pods reach, as they
//! reach a Service), and what the dashboard reports.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::network::Network;
use super::{set_toml, ChartFiles, Servers};
use crate::process::RespConnection;

/// A blocking `GET` of `path` at `addr` (`host:port`); the body of a 200.
///
/// # Errors
/// The reason, when the server cannot be reached or answers anything else.
pub fn http_get(addr: &str, path: &str) -> Result<String, String> {
    let mut stream = TcpStream::connect(addr).map_err(|e| format!("GET {addr}{path}: {e}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .map_err(|e| format!("GET {addr}{path}: {e}"))?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).map_err(|e| format!("GET {addr}{path}: {e}"))?;
    let (head, body) = reply.split_once("\r\n\r\n").ok_or_else(|| format!("GET {addr}{path}: no HTTP reply"))?;
    if head.lines().next().is_some_and(|l| l.contains(" 200 ")) {
        Ok(body.to_owned())
    } else {
        Err(format!("GET {addr}{path}: {}", head.lines().next().unwrap_or_default()))
    }
}

/// Starts `program` as the chart's container command does: through `exec-redacted.sh`, with the password in
/// `PIKA_PASSWORD`, its output to `log`.
fn spawn(network: &Network, program: &Path, args: &[String], password: &str, log: &Path) -> Result<Child, String> {
    let dir = log.parent().ok_or("a log in a directory")?;
    let script = dir.join("exec-redacted.sh");
    std::fs::write(&script, &ChartFiles::rendered().exec_redacted).map_err(|e| e.to_string())?;
    let out = std::fs::File::create(log).map_err(|e| e.to_string())?;
    let child = network
        .command(None, Path::new("/bin/sh"))
        .arg(&script)
        .arg(program)
        .args(args)
        .env("PIKA_PASSWORD", password)
        .stdout(out.try_clone().map_err(|e| e.to_string())?)
        .stderr(out)
        .spawn()
        .map_err(|e| format!("{}: {e}", program.display()))?;
    network.started(child.id());
    Ok(child)
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(20).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join("\n")
}

fn wait(what: &str, child: &mut Child, log: &Path, mut ready: impl FnMut() -> bool) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("{what} exited ({status}) before it served:\n{}", tail(log)));
        }
        if ready() {
            return Ok(());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{what} did not serve within 30 s:\n{}", tail(log)));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The bed's codis-dashboard: the fork's, or the double in fork mode where a test needs what the fork cannot be made
/// to do on demand (refusals, failures, pauses at a chosen request).
#[derive(Debug)]
pub struct Dashboard {
    addr: String,
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    /// The fork's codis-dashboard process, logging into `dir`.
    Fork { dir: PathBuf, child: Option<Child> },
    /// The double, serving from this process.
    Double(Box<crate::CodisDouble>),
}

impl Dashboard {
    /// Starts it for `product` over etcd at `etcd` with the chart's configuration, `settings` (TOML values) replacing
    /// the chart's; waits until it serves.
    ///
    /// # Errors
    /// When it exits or does not serve within 30 s (with the tail of its log).
    pub fn start(
        network: &Network,
        servers: &Servers,
        etcd: &str,
        product: &str,
        password: &str,
        settings: &[(&str, &str)],
    ) -> Result<Self, String> {
        let dir = network.dir().join("dashboard");
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let addr = format!("{}:{}", network.node(), network.node_port());
        let mut toml = set_toml(&ChartFiles::rendered().dashboard_toml, "admin_addr", &format!("\"{addr}\""));
        for (key, value) in settings {
            toml = set_toml(&toml, key, value);
        }
        let config = dir.join("dashboard.toml");
        std::fs::write(&config, toml).map_err(|e| e.to_string())?;
        // The container's arguments (cmpd-codis-dashboard.yaml), with the bed's addresses.
        let args = vec![
            format!("--config={}", config.display()),
            format!("--etcd={etcd}"),
            format!("--product_name={product}"),
            format!("--product_auth={password}"),
            format!("--host-admin={addr}"),
            "--remove-lock".to_owned(),
            "--log-level=INFO".to_owned(),
        ];
        let log = dir.join("dashboard.log");
        let mut child = spawn(network, &servers.dashboard, &args, password, &log)?;
        let probe = addr.clone();
        wait("codis-dashboard", &mut child, &log, || http_get(&probe, "/topom/model").is_ok())?;
        Ok(Self { addr, kind: Kind::Fork { dir, child: Some(child) } })
    }

    /// Starts the double with `opts` at the node address, where the actions and the pods reach it as they reach the
    /// fork's.
    ///
    /// # Errors
    /// When it cannot listen there.
    pub fn start_double(network: &Network, opts: crate::DoubleOptions) -> Result<Self, String> {
        let listen = std::net::SocketAddr::from((network.node(), network.node_port()));
        let double = crate::CodisDouble::try_start(crate::DoubleOptions { listen: Some(listen), ..opts })
            .map_err(|e| format!("the Codis double at {listen}: {e}"))?;
        Ok(Self { addr: double.addr(), kind: Kind::Double(Box::new(double)) })
    }

    /// The double, when the bed runs one.
    #[must_use]
    pub fn double(&self) -> Option<&crate::CodisDouble> {
        match &self.kind {
            Kind::Double(d) => Some(d),
            Kind::Fork { .. } => None,
        }
    }

    /// One request to its HTTP API (`{xauth}` in `path` replaced by the product's), as the double's
    /// [`crate::CodisDouble::call_with_body`] makes one: the conformance check sends both the same.
    #[must_use]
    pub fn call(&self, product: &str, method: &str, path: &str, body: &str) -> crate::codis::HttpReply {
        if let Kind::Double(d) = &self.kind {
            return d.call_with_body(method, path, body);
        }
        let path = path.replace("{xauth}", &crate::codis::xauth(product));
        match crate::httpd::blocking_request(&self.addr, method, &path, body) {
            Ok((status, body)) => crate::codis::HttpReply { status, body },
            Err(e) => crate::codis::HttpReply { status: 0, body: e.to_string() },
        }
    }

    /// `127.0.0.1:<port>`: CODIS_DASHBOARD_ADDR.
    #[must_use]
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Its log (the double's: the last requests it answered).
    #[must_use]
    pub fn log(&self) -> String {
        match &self.kind {
            Kind::Fork { dir, .. } => tail(&dir.join("dashboard.log")),
            Kind::Double(d) => request_log(d, 40),
        }
    }

    /// Everything it logged.
    #[must_use]
    pub fn whole_log(&self) -> String {
        match &self.kind {
            Kind::Fork { dir, .. } => std::fs::read_to_string(dir.join("dashboard.log")).unwrap_or_default(),
            Kind::Double(d) => request_log(d, usize::MAX),
        }
    }

    /// What it reports now (`GET /topom`), read again while a slot entry is torn (the fork encodes its slot cache
    /// after releasing its lock, so a read racing a slot change may show `null` for that slot).
    ///
    /// # Panics
    /// When it cannot be read or never reads whole.
    #[must_use]
    pub fn topology(&self) -> Topology {
        let mut last = String::new();
        for attempt in 0..20u64 {
            let body = match &self.kind {
                Kind::Fork { .. } => http_get(&self.addr, "/topom"),
                Kind::Double(d) => Ok(d.call("GET", "/topom").body),
            };
            match body.and_then(|body| Topology::parse(&body)) {
                Ok(t) => return t,
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(10 * (attempt + 1)));
        }
        panic!("codis-dashboard at {}: {last}", self.addr);
    }
}

/// The last `last` requests the double answered, one line each.
fn request_log(double: &crate::CodisDouble, last: usize) -> String {
    let requests = double.requests();
    let from = requests.len().saturating_sub(last);
    requests[from..].iter().map(|r| format!("{} {} -> {}\n", r.method, r.path, r.status)).collect()
}

impl Drop for Dashboard {
    fn drop(&mut self) {
        if let Kind::Fork { child: Some(c), .. } = &mut self.kind {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A real codis-proxy of the fork, online at its dashboard.
#[derive(Debug)]
pub struct Proxy {
    data: String,
    admin: String,
    /// `<pod FQDN>:<admin port>`, what it advertises (`--host-admin`) and the dashboard lists, as in the chart.
    advertised_admin: String,
    password: String,
    program: PathBuf,
    args: Vec<String>,
    dir: PathBuf,
    child: Option<Child>,
}

impl Proxy {
    /// Starts it with the chart's configuration (`settings`, TOML values, replacing the chart's) and arguments; it
    /// comes online at `dashboard` by itself (`--dashboard`) and advertises its addresses at pod `pod`'s FQDN, as in
    /// the chart. Waits until it says it is online.
    ///
    /// # Errors
    /// When it exits or does not serve within 30 s.
    pub fn start(
        network: &Network,
        servers: &Servers,
        dashboard: &str,
        product: &str,
        password: &str,
        index: usize,
        settings: &[(&str, &str)],
    ) -> Result<Self, String> {
        let mut proxy = Self::configured(network, servers, dashboard, product, password, index, settings)?;
        proxy.spawn(network)?;
        Ok(proxy)
    }

    /// [`Proxy::start`] up to its start: its addresses and configuration are known, nothing runs yet.
    ///
    /// # Errors
    /// When its directory, name or configuration cannot be made.
    pub fn configured(
        network: &Network,
        servers: &Servers,
        dashboard: &str,
        product: &str,
        password: &str,
        index: usize,
        settings: &[(&str, &str)],
    ) -> Result<Self, String> {
        let dir = network.dir().join(format!("proxy-{index}"));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let (data_port, admin_port) = (network.node_port(), network.node_port());
        let data = format!("{}:{data_port}", network.node());
        let admin = format!("{}:{admin_port}", network.node());
        // The chart's PROXY_FQDN: the pod's name under the proxy component's headless service.
        let pod = format!("{product}-codis-proxy-{index}");
        let fqdn = format!("{pod}.{product}-codis-proxy-headless.{}.svc.cluster.local", super::bed::NAMESPACE);
        network.resolve(&fqdn, network.node())?;
        let advertised_admin = format!("{fqdn}:{admin_port}");
        let mut toml = set_toml(&ChartFiles::rendered().proxy_toml, "admin_addr", &format!("\"{admin}\""));
        toml = set_toml(&toml, "proxy_addr", &format!("\"{data}\""));
        for (key, value) in settings {
            toml = set_toml(&toml, key, value);
        }
        let config = dir.join("proxy.toml");
        std::fs::write(&config, toml).map_err(|e| e.to_string())?;
        let args = vec![
            format!("--config={}", config.display()),
            format!("--dashboard={dashboard}"),
            format!("--product_name={product}"),
            format!("--product_auth={password}"),
            format!("--session_auth={password}"),
            format!("--host-admin={advertised_admin}"),
            format!("--host-proxy={fqdn}:{data_port}"),
            "--log-level=INFO".to_owned(),
        ];
        Ok(Self {
            data,
            admin,
            advertised_admin,
            password: password.to_owned(),
            program: servers.proxy.clone(),
            args,
            dir,
            child: None,
        })
    }

    /// Starts the process (the log of an earlier one is kept beside, numbered) and waits until it is online.
    ///
    /// # Errors
    /// When it exits or does not come online within 30 s.
    pub fn spawn(&mut self, network: &Network) -> Result<(), String> {
        let mut log = self.dir.join("proxy.log");
        for n in 1.. {
            if !log.exists() {
                break;
            }
            log = self.dir.join(format!("proxy.{n}.log"));
        }
        let mut child = spawn(network, &self.program, &self.args, &self.password, &log)?;
        // Online once the dashboard filled it (`--dashboard` has it come online by itself); PING is no check: the
        // fork forwards it to a backend, and no slot has one before the first registration.
        let probe = self.admin.clone();
        wait("codis-proxy", &mut child, &log, || {
            http_get(&probe, "/proxy/stats")
                .ok()
                .and_then(|body| serde_json::from_str::<Value>(&body).ok())
                .is_some_and(|stats| stats.get("online").and_then(Value::as_bool) == Some(true))
        })?;
        self.child = Some(child);
        Ok(())
    }

    /// Kills it with SIGKILL, as a node lost or a pod deleted without its preStop: it stays registered at the
    /// dashboard.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Kills it with SIGKILL and starts a new process at the same addresses, as a container restarted in its pod:
    /// the new one comes online under a token of its own, and the old one's entry stays registered.
    ///
    /// # Errors
    /// When the new one does not come online.
    pub fn restart(&mut self, network: &Network) -> Result<(), String> {
        self.kill();
        self.spawn(network)
    }

    /// Its token as its own admin API reports it (`GET /api/proxy/model`).
    ///
    /// # Errors
    /// When it cannot be reached.
    pub fn token(&self) -> Result<String, String> {
        let body = http_get(&self.admin, "/api/proxy/model")?;
        let model: Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        model.get("token").and_then(Value::as_str).map(str::to_owned).ok_or_else(|| format!("no token in {body}"))
    }

    /// Where clients connect.
    #[must_use]
    pub fn data_addr(&self) -> &str {
        &self.data
    }

    /// Where its admin API listens (the pod's address): what a dashboard's dial error names.
    #[must_use]
    pub fn admin_listen_addr(&self) -> &str {
        &self.admin
    }

    /// Its admin address as the dashboard lists it: its pod's FQDN and the admin port.
    #[must_use]
    pub fn admin_addr(&self) -> &str {
        &self.advertised_admin
    }

    /// Its pod's name: the first label of its FQDN.
    #[must_use]
    pub fn pod_name(&self) -> &str {
        self.advertised_admin.split('.').next().unwrap_or_default()
    }

    /// SIGSTOP: a proxy that hangs (a stalled node): its pod still runs, and it answers nobody.
    pub fn freeze(&self) {
        crate::process::signal(self.child.as_ref(), "-STOP");
    }

    /// SIGCONT after [`Proxy::freeze`].
    pub fn thaw(&self) {
        crate::process::signal(self.child.as_ref(), "-CONT");
    }

    /// A client connection, authenticated.
    ///
    /// # Errors
    /// When the proxy cannot be reached.
    pub fn connect(&self) -> Result<RespConnection, String> {
        RespConnection::connect(&self.data, Some(&self.password), Duration::from_secs(5))
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A Codis group as the dashboard lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// Its id.
    pub id: u32,
    /// Its servers in Codis' order: the master first.
    pub servers: Vec<String>,
    /// What the fork's health checks last recorded of each server, in the same order: `(role, state)` (state 0
    /// normal, 1 subjectively offline, 2 offline).
    pub health: Vec<(String, u64)>,
    /// The fork's `out_of_sync` flag.
    pub out_of_sync: bool,
}

impl Group {
    /// The master, when it has servers.
    #[must_use]
    pub fn master(&self) -> Option<&str> {
        self.servers.first().map(String::as_str)
    }
}

/// Groups and slot owners as the dashboard reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// Every group, by id.
    pub groups: Vec<Group>,
    /// Slot i's group (0: offline).
    pub slots: Vec<u32>,
    /// Slots with a migration action.
    pub migrating: usize,
    /// Registered proxies as `(token, admin address)`, by id.
    pub proxies: Vec<(String, String)>,
    /// Whether the migration executor is paused (`slot_action.disabled`).
    pub actions_disabled: bool,
}

impl Topology {
    /// From the body of `GET /topom`.
    ///
    /// # Errors
    /// When it does not have the shape the fork gives it, or a slot entry is torn (`null`).
    pub fn parse(body: &str) -> Result<Self, String> {
        let v: Value = serde_json::from_str(body).map_err(|e| format!("/topom is not JSON: {e}"))?;
        let stats = v.get("stats").ok_or("/topom has no stats")?;
        let groups = stats
            .pointer("/group/models")
            .and_then(Value::as_array)
            .map(|models| {
                models
                    .iter()
                    .map(|g| {
                        let servers = g.get("servers").and_then(Value::as_array).into_iter().flatten();
                        Group {
                            id: g.get("id").and_then(Value::as_u64).unwrap_or(0) as u32,
                            servers: servers
                                .clone()
                                .filter_map(|s| s.get("server").and_then(Value::as_str).map(str::to_owned))
                                .collect(),
                            health: servers
                                .map(|s| {
                                    let role = s.get("role").and_then(Value::as_str).unwrap_or_default().to_owned();
                                    (role, s.get("state").and_then(Value::as_u64).unwrap_or(0))
                                })
                                .collect(),
                            out_of_sync: g.get("out_of_sync").and_then(Value::as_bool).unwrap_or(false),
                        }
                    })
                    .collect()
            })
            .unwrap_or_default();
        let mut slots = Vec::new();
        let mut migrating = 0;
        for (i, slot) in stats.get("slots").and_then(Value::as_array).ok_or("/topom has no slots")?.iter().enumerate() {
            if slot.is_null() {
                return Err(format!("slot {i} is null (a torn read)"));
            }
            slots.push(slot.get("group_id").and_then(Value::as_u64).unwrap_or(0) as u32);
            if slot.get("action").and_then(Value::as_object).is_some_and(|a| !a.is_empty()) {
                migrating += 1;
            }
        }
        let proxies = stats
            .pointer("/proxy/models")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|p| {
                let field = |k: &str| p.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
                (field("token"), field("admin_addr"))
            })
            .collect();
        let actions_disabled = stats.pointer("/slot_action/disabled").and_then(Value::as_bool).unwrap_or(false);
        Ok(Self { groups, slots, migrating, proxies, actions_disabled })
    }

    /// The group listing `server`.
    #[must_use]
    pub fn group_of(&self, server: &str) -> Option<&Group> {
        self.groups.iter().find(|g| g.servers.iter().any(|s| s == server))
    }

    /// How many slots group `gid` owns.
    #[must_use]
    pub fn slots_of(&self, gid: u32) -> usize {
        self.slots.iter().filter(|&&g| g == gid).count()
    }
}
