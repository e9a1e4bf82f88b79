//! Real etcd and redis-server processes for tests.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Ports this process has handed out whose owner still lives. The kernel knows a port only while something listens
/// on it: between `free_port` and the server's bind, or between a kill and a restart on the same port, it would hand
/// the port to a concurrent test, and a server that lost that race would be mistaken for the winner.
static LEASED: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// The same leases across processes (cargo nextest runs each test in a process of its own): one file per leased
/// port, holding the pid of the process that leased it; a file whose process is gone leases nothing.
const LEASE_DIR: &str = "/tmp/testbed-port-leases";

/// The lease file of `port`.
fn lease_file(port: u16) -> PathBuf {
    Path::new(LEASE_DIR).join(port.to_string())
}

/// The pid `port`'s lease file names, if any.
fn lease_holder(port: u16) -> Option<u32> {
    std::fs::read_to_string(lease_file(port)).ok().and_then(|t| t.trim().parse().ok())
}

fn is_running(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Takes `port` for this process across processes: `false` when a live other process holds it.
fn lease_across_processes(port: u16) -> bool {
    let _ = std::fs::create_dir_all(LEASE_DIR);
    let file = lease_file(port);
    let own = std::process::id();
    for _ in 0..3 {
        match std::fs::OpenOptions::new().write(true).create_new(true).open(&file) {
            Ok(mut f) => return f.write_all(own.to_string().as_bytes()).is_ok(),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                match lease_holder(port) {
                    Some(pid) if pid == own => return true,
                    Some(pid) if is_running(pid) => return false,
                    // Its holder is gone (or the file is being written: the next look sees it whole).
                    _ => {
                        let _ = std::fs::remove_file(&file);
                    }
                }
            }
            // No lease directory to write in: this process's own set still guards its tests.
            Err(_) => return true,
        }
    }
    false
}

/// Gives `port` back across processes (only when this process holds it).
fn release_across_processes(port: u16) {
    if lease_holder(port) == Some(std::process::id()) {
        let _ = std::fs::remove_file(lease_file(port));
    }
}

/// Whether a live other process leases `port`.
fn leased_elsewhere(port: u16) -> bool {
    lease_holder(port).is_some_and(|pid| pid != std::process::id() && is_running(pid))
}

/// A loopback port held for its owner until dropped: no other caller in this process is given it meanwhile.
#[derive(Debug)]
pub(crate) struct PortLease(u16);

impl PortLease {
    /// Holds `port`, which the caller has bound itself (a listener that closes and reopens it); `None` when it is
    /// leased already (its holder's bind then fails, and it takes another).
    pub(crate) fn hold(port: u16) -> Option<Self> {
        // Lazily: a lease built and dropped on refusal would release the holder's port.
        let mut leased = LEASED.lock().unwrap_or_else(PoisonError::into_inner);
        if leased.contains(&port) || !lease_across_processes(port) {
            return None;
        }
        leased.insert(port);
        Some(Self(port))
    }

    /// A port chosen outside the kernel's ephemeral range on an address of the caller's own (the real bed's node
    /// address), which nothing else binds: nothing to lease. Leased ports are all from the ephemeral range, so
    /// dropping this one releases none of them.
    pub(crate) fn fixed(port: u16) -> Self {
        Self(port)
    }

    /// A port the kernel picks, leased; the listener that found it closes, for the owner's server to bind.
    fn take() -> Self {
        for _ in 0..1000 {
            let port = bind_loopback().and_then(|l| l.local_addr()).map(|a| a.port()).expect("no free port");
            // Another thread may have leased it since bind_loopback looked.
            if let Some(lease) = Self::hold(port) {
                return lease;
            }
        }
        panic!("no loopback port that is not already leased");
    }
}

impl Drop for PortLease {
    fn drop(&mut self) {
        let mut leased = LEASED.lock().unwrap_or_else(PoisonError::into_inner);
        if leased.remove(&self.0) {
            release_across_processes(self.0);
        }
    }
}

/// A listener on a loopback port the kernel picks, never one leased here (a killed redis-server's, say, which its
/// restart would then find taken).
///
/// # Errors
/// When no port can be bound.
pub fn bind_loopback() -> std::io::Result<TcpListener> {
    for _ in 0..1000 {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        if !LEASED.lock().unwrap_or_else(PoisonError::into_inner).contains(&port) && !leased_elsewhere(port) {
            return Ok(listener);
        }
    }
    Err(std::io::Error::other("every loopback port offered is leased"))
}

/// A loopback port that was free a moment ago and that no later call in this process returns (it stays leased for
/// the life of the process: for addresses a test wants closed, or a listener it binds itself).
///
/// # Panics
/// When the system has no free port.
#[must_use]
pub fn free_port() -> u16 {
    let lease = PortLease::take();
    let port = lease.0;
    std::mem::forget(lease);
    port
}

fn wait_until(what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if ready() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("testbed: {what} did not become ready within {timeout:?}");
    false
}

fn stop(child: &mut Option<Child>) {
    if let Some(mut c) = child.take() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Sends `signal` (as `kill` spells it: `-STOP`, `-CONT`, `-KILL`) to `child`, when it runs: a stalled node or a
/// crash, from a shared borrow while another thread drives the bed.
pub fn signal(child: Option<&Child>, signal: &str) {
    if let Some(child) = child {
        let _ = Command::new("kill").args([signal, &child.id().to_string()]).status();
    }
}

/// A real `redis-server` on 127.0.0.1, standing in for one pika pod.
#[derive(Debug)]
pub struct RedisServer {
    port: PortLease,
    password: Option<String>,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a redis-server without a password.
    #[must_use]
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// Starts a redis-server whose `requirepass` and `masterauth` are `password`.
    ///
    /// # Panics
    /// When redis-server cannot be started.
    #[must_use]
    pub fn start_with(password: Option<&str>) -> Self {
        let mut dir = tempfile::tempdir().expect("temp dir");
        for _ in 0..5 {
            let mut server = Self { port: PortLease::take(), password: password.map(str::to_owned), dir, child: None };
            server.write_config();
            if server.spawn() {
                return server;
            }
            dir = server.into_dir();
        }
        panic!("redis-server did not start (is /usr/bin/redis-server installed?)");
    }

    fn into_dir(mut self) -> tempfile::TempDir {
        stop(&mut self.child);
        let dir = tempfile::tempdir().expect("temp dir");
        std::mem::replace(&mut self.dir, dir)
    }

    fn config_path(&self) -> PathBuf {
        self.dir.path().join("redis.conf")
    }

    fn write_config(&self) {
        let mut conf = format!(
            "port {}\nbind 127.0.0.1\ndir {}\nsave \"\"\nappendonly no\nprotected-mode no\nrepl-diskless-sync no\n\
             repl-ping-replica-period 1\nlogfile {}\n",
            self.port.0,
            self.dir.path().display(),
            self.dir.path().join("redis.log").display()
        );
        if let Some(p) = &self.password {
            conf.push_str(&format!("requirepass {p}\nmasterauth {p}\n"));
        }
        std::fs::write(self.config_path(), conf).expect("write redis.conf");
    }

    fn spawn(&mut self) -> bool {
        let child = Command::new("redis-server")
            .arg(self.config_path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let Ok(child) = child else { return false };
        let pid = child.id().to_string();
        self.child = Some(child);
        let port = self.port.0;
        let password = self.password.clone();
        let up = wait_until("redis-server", Duration::from_secs(10), || ping(port, password.as_deref()))
            && answered_by(port, password.as_deref(), &pid);
        if !up {
            stop(&mut self.child);
        }
        up
    }

    /// The port it listens on (127.0.0.1).
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port.0
    }

    /// `127.0.0.1:<port>`.
    #[must_use]
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port.0)
    }

    /// The server's directory (config file, log).
    #[must_use]
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Kills the process (a crash: nothing is saved beyond what CONFIG REWRITE wrote).
    pub fn kill(&mut self) {
        stop(&mut self.child);
    }

    /// Whether the process is running.
    #[must_use]
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Starts it again on the same port with the same (possibly rewritten) config file.
    ///
    /// # Panics
    /// When it does not come back.
    pub fn restart(&mut self) {
        stop(&mut self.child);
        assert!(self.spawn(), "redis-server did not restart on port {}", self.port.0);
    }

    /// Starts it again with an empty data directory and a fresh config (a pod rescheduled onto an empty volume).
    ///
    /// # Panics
    /// When it does not come back.
    pub fn restart_empty(&mut self) {
        stop(&mut self.child);
        self.write_config();
        let _ = std::fs::remove_file(self.dir.path().join("dump.rdb"));
        assert!(self.spawn(), "redis-server did not restart on port {}", self.port.0);
    }

    /// Replaces the config file with a fresh one and drops the data, without starting (an empty volume).
    pub fn reset_config(&mut self) {
        stop(&mut self.child);
        self.write_config();
        let _ = std::fs::remove_file(self.dir.path().join("dump.rdb"));
    }

    /// Runs one command and returns the raw RESP reply (for assertions in tests).
    ///
    /// # Panics
    /// When the server does not answer.
    #[must_use]
    pub fn command(&self, args: &[&str]) -> String {
        command(self.port.0, self.password.as_deref(), args).expect("redis command")
    }

    /// `INFO replication` as text.
    #[must_use]
    pub fn info_replication(&self) -> String {
        self.command(&["INFO", "replication"])
    }

    /// The `role:` of `INFO replication`.
    #[must_use]
    pub fn role(&self) -> String {
        info_field(&self.info_replication(), "role").unwrap_or_default()
    }

    /// `(master_host, master_port, link up)` when it is a replica.
    #[must_use]
    pub fn master(&self) -> Option<(String, u16, bool)> {
        let info = self.info_replication();
        if info_field(&info, "role").as_deref() != Some("slave") {
            return None;
        }
        let host = info_field(&info, "master_host")?;
        let port = info_field(&info, "master_port")?.parse().ok()?;
        Some((host, port, info_field(&info, "master_link_status").as_deref() == Some("up")))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

/// The value of `key:` in INFO text.
#[must_use]
pub fn info_field(info: &str, key: &str) -> Option<String> {
    info.lines().find_map(|l| l.trim_end().strip_prefix(key)?.strip_prefix(':').map(str::to_owned))
}

/// Whether the redis-server answering on `port` is process `pid`: a PONG from another process (one that bound the
/// port first; ours then exited) is not this server.
fn answered_by(port: u16, password: Option<&str>, pid: &str) -> bool {
    let answering = command(port, password, &["INFO", "server"]).and_then(|info| info_field(&info, "process_id"));
    if answering.as_deref() != Some(pid) {
        eprintln!("testbed: port {port} answers, but not from the redis-server started on it");
        return false;
    }
    true
}

fn ping(port: u16, password: Option<&str>) -> bool {
    command(port, password, &["PING"]).is_some_and(|r| r.contains("PONG"))
}

/// One command on a fresh connection to the redis-server on `port`; the reply flattened to text by
/// [`RespConnection::command`] (`None` when the server cannot be reached).
fn command(port: u16, password: Option<&str>, args: &[&str]) -> Option<String> {
    let addr = format!("127.0.0.1:{port}");
    let mut conn = RespConnection::connect(&addr, password, Duration::from_millis(500)).ok()?;
    conn.set_timeout(Duration::from_secs(5)).ok()?;
    conn.command(args).ok()
}

/// A synchronous connection to a redis-server (the `redis` crate) for tests that poke servers directly. Replies are
/// flattened to text: `+status`, `-error`, `:integer` lines as the server sent them, bulk strings verbatim (nil as
/// empty), array elements one per line.
pub struct RespConnection {
    conn: redis::Connection,
}

impl RespConnection {
    /// Connects to `addr` (`host:port`) within `timeout` and authenticates with `password`; replies are awaited at
    /// most `timeout`.
    ///
    /// # Errors
    /// The reason, when the server cannot be reached or refuses the password.
    pub fn connect(addr: &str, password: Option<&str>, timeout: Duration) -> Result<Self, String> {
        let (host, port) = addr.rsplit_once(':').ok_or_else(|| format!("{addr}: not host:port"))?;
        let port: u16 = port.parse().map_err(|e| format!("{addr}: {e}"))?;
        use redis::IntoConnectionInfo;
        // No `CLIENT SETINFO` on connect (pika does not know it); AUTH is sent as a command.
        let info = redis::ConnectionAddr::Tcp(host.to_owned(), port)
            .into_connection_info()
            .map(|i| i.set_redis_settings(redis::RedisConnectionInfo::default().set_skip_set_lib_name()))
            .map_err(|e| format!("{addr}: {e}"))?;
        let client = redis::Client::open(info).map_err(|e| format!("{addr}: {e}"))?;
        let conn = client.get_connection_with_timeout(timeout).map_err(|e| format!("{addr}: {e}"))?;
        let mut this = Self { conn };
        this.set_timeout(timeout)?;
        if let Some(p) = password {
            if this.command(&["AUTH", p])?.starts_with('-') {
                return Err(format!("{addr}: AUTH refused"));
            }
        }
        Ok(this)
    }

    /// How long later replies are awaited.
    ///
    /// # Errors
    /// When the socket refuses the setting.
    pub fn set_timeout(&mut self, timeout: Duration) -> Result<(), String> {
        self.conn.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
        self.conn.set_write_timeout(Some(timeout)).map_err(|e| e.to_string())
    }

    /// One command; the reply as text (a server error is `Ok("-<code> <detail>")`, not an `Err`).
    ///
    /// # Errors
    /// When the connection fails or the reply does not arrive in time.
    pub fn command(&mut self, args: &[&str]) -> Result<String, String> {
        let (name, rest) = args.split_first().ok_or("an empty command")?;
        let mut cmd = redis::cmd(name);
        for a in rest {
            cmd.arg(*a);
        }
        match cmd.query::<redis::Value>(&mut self.conn) {
            Ok(value) => Ok(flatten(value)),
            Err(e) if e.code().is_some() => {
                Ok(format!("-{} {}", e.code().unwrap_or("ERR"), e.detail().unwrap_or_default()))
            }
            Err(e) => Err(e.to_string()),
        }
    }
}

fn flatten(value: redis::Value) -> String {
    use redis::Value;
    match value {
        Value::Nil => String::new(),
        Value::Int(n) => format!(":{n}"),
        Value::BulkString(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Value::SimpleString(s) => format!("+{s}"),
        Value::Okay => "+OK".to_owned(),
        Value::Array(items) | Value::Set(items) => items.into_iter().map(flatten).collect::<Vec<_>>().join("\n"),
        Value::ServerError(e) => format!("-{} {}", e.code(), e.details().unwrap_or_default()),
        other => format!("{other:?}"),
    }
}

/// A real single-member etcd (Debian's etcd-server) on 127.0.0.1.
#[derive(Debug)]
pub struct EtcdServer {
    host: std::net::Ipv4Addr,
    client_port: PortLease,
    peer_port: PortLease,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl EtcdServer {
    /// Starts etcd and waits until it serves.
    ///
    /// # Panics
    /// When etcd cannot be started.
    #[must_use]
    pub fn start() -> Self {
        Self::start_at(std::net::Ipv4Addr::LOCALHOST)
    }

    /// Starts etcd listening on `host` (an address of this host: the real bed's node address, which its pods
    /// reach) and waits until it serves.
    ///
    /// # Panics
    /// When etcd cannot be started.
    #[must_use]
    pub fn start_at(host: std::net::Ipv4Addr) -> Self {
        Self::start_with(host, PortLease::take)
    }

    /// Starts etcd listening on `host`, an address of this process's own (the real bed's node address), at ports
    /// `port` hands out (below the kernel's ephemeral range: a port picked from it may be the local port of an
    /// outgoing connection from `host` by the time etcd binds it), and waits until it serves.
    ///
    /// # Panics
    /// When etcd cannot be started.
    #[must_use]
    pub fn start_on(host: std::net::Ipv4Addr, mut port: impl FnMut() -> u16) -> Self {
        Self::start_with(host, || PortLease::fixed(port()))
    }

    fn start_with(host: std::net::Ipv4Addr, mut lease: impl FnMut() -> PortLease) -> Self {
        for _ in 0..5 {
            let mut server = Self {
                host,
                client_port: lease(),
                peer_port: lease(),
                dir: tempfile::tempdir().expect("temp dir"),
                child: None,
            };
            if server.spawn() {
                return server;
            }
        }
        panic!("etcd did not start (is /usr/bin/etcd from etcd-server installed?)");
    }

    fn spawn(&mut self) -> bool {
        let client = format!("http://{}:{}", self.host, self.client_port.0);
        let peer = format!("http://{}:{}", self.host, self.peer_port.0);
        let log = std::fs::File::create(self.dir.path().join("etcd.log")).ok();
        let child = Command::new("etcd")
            .args(["--name", "testbed", "--data-dir"])
            .arg(self.dir.path().join("data"))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("testbed={peer}")])
            .args(["--log-level", "error"])
            // Codis keeps its topology through etcd's v2 API, as the chart's etcd serves it (etcd-start.sh).
            .arg("--enable-v2=true")
            .env("ETCD_UNSUPPORTED_ARCH", std::env::consts::ARCH)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log.map_or_else(Stdio::null, Stdio::from))
            .spawn();
        let Ok(child) = child else { return false };
        self.child = Some(child);
        let port = self.client_port.0;
        let host = self.host;
        let up = wait_until("etcd", Duration::from_secs(20), || http_get_ok_at(host, port, "/health"));
        // An etcd that lost its ports exits; a healthy answer then came from another process.
        let up = up && self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)));
        if !up {
            stop(&mut self.child);
        }
        up
    }

    /// `<host>:<client port>` (`127.0.0.1` unless started at another host), as ETCD_ENDPOINTS takes it.
    #[must_use]
    pub fn endpoint(&self) -> String {
        format!("{}:{}", self.host, self.client_port.0)
    }

    /// Stops etcd (its data stays), to test behaviour with etcd down.
    pub fn stop(&mut self) {
        stop(&mut self.child);
    }

    /// Starts it again with the same data.
    ///
    /// # Panics
    /// When it does not come back.
    pub fn resume(&mut self) {
        stop(&mut self.child);
        assert!(self.spawn(), "etcd did not restart");
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

#[cfg(test)]
fn http_get_ok(port: u16, path: &str) -> bool {
    http_get_ok_at(std::net::Ipv4Addr::LOCALHOST, port, path)
}

fn http_get_ok_at(host: std::net::Ipv4Addr, port: u16, path: &str) -> bool {
    let addr = SocketAddr::from((host, port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(300)) else { return false };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes()).is_err() {
        return false;
    }
    let mut reply = String::new();
    let _ = stream.read_to_string(&mut reply);
    reply.starts_with("HTTP/1.") && reply.contains(" 200 ") && reply.contains("true")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_another_live_process_leases_is_refused_and_one_whose_process_is_gone_is_taken() {
        let port = bind_loopback().and_then(|l| l.local_addr()).expect("a port").port();
        let file = lease_file(port);
        std::fs::create_dir_all(LEASE_DIR).expect("the lease directory");
        // pid 1 always runs.
        std::fs::write(&file, "1").expect("another process's lease");
        assert!(PortLease::hold(port).is_none(), "a live process's port was given out");
        assert!(leased_elsewhere(port), "bind_loopback would offer a port another live process leases");
        // No process has this pid (above the kernel's pid_max).
        std::fs::write(&file, u32::MAX.to_string()).expect("a dead process's lease");
        let lease = PortLease::hold(port).expect("the port of a process that is gone");
        assert_eq!(std::fs::read_to_string(&file).ok(), Some(std::process::id().to_string()), "the file names us");
        drop(lease);
        assert!(!file.exists(), "the lease file outlived the lease");
    }

    #[test]
    fn a_killed_servers_port_stays_leased_until_it_is_dropped() {
        let mut server = RedisServer::start();
        let port = server.port();
        server.kill();
        assert!(PortLease::hold(port).is_none(), "port {port} of a killed server was free to lease");
        server.restart();
        drop(server);
        assert!(PortLease::hold(port).is_some(), "port {port} stayed leased after its server was dropped");
    }

    #[test]
    fn a_server_that_finds_its_port_answered_by_another_does_not_pass_for_it() {
        let other = RedisServer::start();
        // Outside the lease: as when another test process, or a listener bound before the lease, holds the port.
        let mut loser = RedisServer {
            port: PortLease(other.port()),
            password: None,
            dir: tempfile::tempdir().expect("temp dir"),
            child: None,
        };
        loser.write_config();
        let started = loser.spawn();
        // The other server's lease is not the loser's to release.
        std::mem::forget(std::mem::replace(&mut loser.port, PortLease::take()));
        assert!(!started, "a PONG from port {} was taken for the loser's own", other.port());
        assert!(!loser.is_running());
        assert_eq!(other.role(), "master");
    }

    #[test]
    fn redis_servers_replicate_and_stop() {
        let a = RedisServer::start();
        let b = RedisServer::start_with(None);
        assert_eq!(a.role(), "master");
        assert!(b.command(&["SLAVEOF", "127.0.0.1", &a.port().to_string()]).contains("OK"));
        assert!(wait_until("link", Duration::from_secs(10), || b.master().is_some_and(|(_, _, up)| up)));
        let port = a.port();
        drop(a);
        assert!(!ping(port, None));
    }

    #[test]
    fn redis_password_is_required_and_config_rewrite_persists_replication() {
        let a = RedisServer::start_with(Some("pw1"));
        let mut b = RedisServer::start_with(Some("pw1"));
        assert!(command(a.port(), None, &["INFO", "replication"]).is_some_and(|r| r.contains("NOAUTH")));
        let _ = b.command(&["SLAVEOF", "127.0.0.1", &a.port().to_string()]);
        assert!(b.command(&["CONFIG", "REWRITE"]).contains("OK"));
        b.restart();
        assert!(wait_until("link", Duration::from_secs(10), || b.master().is_some_and(|(_, _, up)| up)));
        b.restart_empty();
        assert_eq!(b.role(), "master");
    }

    #[test]
    fn etcd_serves_and_stops() {
        let mut etcd = EtcdServer::start();
        let port: u16 = etcd.endpoint().rsplit_once(':').unwrap().1.parse().unwrap();
        assert!(http_get_ok(port, "/health"));
        etcd.stop();
        assert!(!http_get_ok(port, "/health"));
        etcd.resume();
        assert!(http_get_ok(port, "/health"));
    }
}
