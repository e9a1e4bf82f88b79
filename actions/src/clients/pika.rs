//! Client for pika servers (and redis-server, which stands in for pika in tests): what actions ask a data node.
//!
//! Actions reach a pika through [`dial_address`] (its Codis server string, or where an override says it really is),
//! then use the async [`Pika`] client for replication changes: `SLAVEOF` followed by `CONFIG REWRITE`, because pika
//! persists replication only on rewrite. The role probe, which runs every two seconds in every pod, uses the
//! synchronous [`probe_role`] instead: one connection, no runtime. [`parse_replication`] is the pure reader of
//! `INFO replication` for both pika's and redis' layouts. Errors name the server and the command but never its
//! arguments, and the password never reaches an error or a log line.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo};

use crate::input::address::HostPort;
use crate::input::replication::{BinlogPosition, SyncState};

/// pika's default `binlog-file-size`: the unit of the file number in `db0:binlog_offset=<file> <offset>`.
const BINLOG_FILE_SIZE: u64 = 104_857_600;

/// Failures talking to a pika server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No connection could be made.
    #[error("pika {addr}: cannot connect: {message}")]
    Connect {
        /// `host:port` dialled.
        addr: String,
        /// Why.
        message: String,
    },
    /// The server refused or failed a command.
    #[error("pika {addr}: {command} failed: {message}")]
    Command {
        /// `host:port` of the server.
        addr: String,
        /// The command's name only: arguments may hold secrets.
        command: &'static str,
        /// The server's reply or the client's reason, secrets masked.
        message: String,
    },
    /// Connecting or a command took longer than allowed.
    #[error("pika {addr}: {command} timed out")]
    Timeout {
        /// `host:port` of the server.
        addr: String,
        /// The command's name (or `connect`).
        command: &'static str,
    },
    /// A server address (or its override) is not `host:port`.
    #[error("pika address {address:?}: {reason}")]
    Address {
        /// The address at fault.
        address: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl Error {
    /// Whether the server did not answer at all (no connection, or none in time): a pod down or restarting, which
    /// its group's failover or the kubelet mends, not a refusal.
    #[must_use]
    pub fn is_unreachable(&self) -> bool {
        matches!(self, Self::Connect { .. } | Self::Timeout { .. })
    }

    /// Whether SLAVEOF was refused for a reason that clears by itself (the node still has replicas, or is in the
    /// middle of a replication state change), rather than for good.
    #[must_use]
    pub fn is_transient_slaveof_refusal(&self) -> bool {
        match self {
            Self::Command { message, .. } => {
                message.contains("already master of others") || message.contains("not in correct state for slaveof")
            }
            _ => false,
        }
    }
}

// ---- INFO replication --------------------------------------------------------------------------------------------

/// A server's replication role as pika reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Role {
    /// `role:master`, also a standalone server with no slaves.
    #[default]
    Master,
    /// `role:slave`.
    Slave,
    /// `role:master&&slave`: a slave that has slaves of its own (chained).
    MasterAndSlave,
}

impl Role {
    /// What the role probe prints: `master`, or `slave` for both kinds of slave (`role:slave` and a chained
    /// `role:master&&slave`).
    #[must_use]
    pub fn probe_name(self) -> &'static str {
        match self {
            Self::Master => "master",
            Self::Slave | Self::MasterAndSlave => "slave",
        }
    }

    /// Whether the server replicates from a master.
    #[must_use]
    pub fn is_slave(self) -> bool {
        matches!(self, Self::Slave | Self::MasterAndSlave)
    }

    fn parse(text: &str) -> Option<Self> {
        let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect::<String>().to_ascii_lowercase();
        match compact.as_str() {
            "master" => Some(Self::Master),
            "slave" => Some(Self::Slave),
            "master&&slave" => Some(Self::MasterAndSlave),
            _ => None,
        }
    }
}

/// A slave as its master lists it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplicaInfo {
    /// The slave's IP (pika lists slaves by IP, never by host name).
    pub ip: String,
    /// The slave's port.
    pub port: u16,
    /// Bytes produced by the master and not yet sent to it; `None` while it is not in incremental sync. For redis:
    /// the master's offset minus the one the replica acknowledged.
    pub lag: Option<u64>,
    /// Whether it is in a full sync.
    pub syncing: bool,
}

/// Which server answered: pika, or the redis-server that stands in for it in tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ServerKind {
    /// pika (its layout: a `# Replication(…)` header, `ReplicationID`, binlog lines).
    #[default]
    Pika,
    /// redis-server.
    Redis,
}

/// What `INFO replication` says, in pika's or redis' layout.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Replication {
    /// Which server answered.
    pub kind: ServerKind,
    /// The role (from the `role:` line, else the pika header; `Master` when neither is there).
    pub role: Role,
    /// The master as given to `SLAVEOF` (pika keeps the spelling; `127.0.0.1` becomes the node's own host).
    pub master_host: Option<String>,
    /// The master's port.
    pub master_port: Option<u16>,
    /// Whether the link to the master is up and every DB connected.
    pub link_up: bool,
    /// How a slave's data stands with its master, the worst over its DBs; `None` on a master.
    pub sync: Option<SyncState>,
    /// `connected_slaves`.
    pub connected_slaves: u32,
    /// The slaves the master lists.
    pub replicas: Vec<ReplicaInfo>,
    /// `is_eligible_for_master_election` (absent before pika v3.5.5).
    pub eligible: Option<bool>,
    /// db0's binlog position (pika); redis' replication offset as file 0.
    pub position: Option<BinlogPosition>,
    /// How far this node's data goes: pika `slave_repl_offset` (its own binlog position, computed from the binlog
    /// lines on versions without it); redis `master_repl_offset` on a master, `slave_repl_offset` on a replica.
    pub offset: Option<u64>,
    /// pika's `ReplicationID`, `None` while empty. Redis' `master_replid` follows other rules and is not reported.
    pub replication_id: Option<String>,
    /// A replica whose link to its master never came up since it started (redis' `master_link_down_since_seconds:-1`;
    /// pika does not say, its `is_eligible_for_master_election` covers it): it may hold nothing.
    pub never_linked: bool,
}

impl Replication {
    /// Whether the server is a slave of `master` (host compared without case). The link may still be down.
    #[must_use]
    pub fn follows(&self, master: &HostPort) -> bool {
        self.role.is_slave()
            && self.master_port == Some(master.port())
            && self.master_host.as_deref().is_some_and(|h| h.eq_ignore_ascii_case(master.host()))
    }

    /// Whether it replicates from a master with every DB taking the binlog incrementally: pika's
    /// `master_link_status:up` alone does not say a DB is in sync.
    #[must_use]
    pub fn in_sync(&self) -> bool {
        self.role.is_slave() && self.link_up && self.sync == Some(SyncState::Connected)
    }

    /// The slave listed with `ip:port`.
    #[must_use]
    pub fn replica(&self, ip: &str, port: u16) -> Option<&ReplicaInfo> {
        self.replicas.iter().find(|r| r.port == port && r.ip.eq_ignore_ascii_case(ip))
    }
}

/// Reads `INFO replication` in pika's layout (every version since v3.5.3) or redis'. Total: unknown, missing or
/// malformed lines are skipped, never an error.
#[must_use]
pub fn parse_replication(info: &str) -> Replication {
    parse(info).1
}

/// The role `INFO replication` reports, `None` when it reports none (then the reply is not what was asked for, and
/// the role probe must not guess).
#[must_use]
pub fn parse_role(info: &str) -> Option<Role> {
    parse(info).0
}

/// One pass over the reply; returns the role actually reported next to the full reading.
fn parse(info: &str) -> (Option<Role>, Replication) {
    let mut out = Replication::default();
    let mut role_line = None;
    let mut header_role = None;
    let mut is_pika = false;
    let mut link_status_up = false;
    let mut dbs_connected = true;
    let mut slave_repl_offset: Option<u64> = None;
    let mut master_repl_offset: Option<u64> = None;
    let mut binlog_total: Option<u64> = None;
    let mut worst_db: Option<SyncState> = None;
    let mut redis_full_sync = false;
    let mut worse = |state: Option<SyncState>| {
        if let Some(state) = state {
            worst_db = Some(worst_db.map_or(state, |w| w.max(state)));
        }
    };
    // Redis replicas report their acknowledged offset; the lag needs the master's, which comes later.
    let mut acked: Vec<Option<u64>> = Vec::new();

    for line in info.lines() {
        let line = line.trim();
        if let Some(header) = line.strip_prefix('#') {
            if let Some(role) = header_role_of(header) {
                header_role = Some(role);
                is_pika = true;
            }
            continue;
        }
        let Some((key, value)) = line.split_once(':') else { continue };
        let (key, value) = (key.trim(), value.trim());
        match key {
            "role" => role_line = Role::parse(value).or(role_line),
            "ReplicationID" => {
                is_pika = true;
                out.replication_id = (!value.is_empty()).then(|| value.to_owned());
            }
            "master_host" => out.master_host = (!value.is_empty()).then(|| value.to_owned()),
            "master_port" => out.master_port = value.parse().ok(),
            "master_link_status" => link_status_up = value.eq_ignore_ascii_case("up"),
            "connected_slaves" => out.connected_slaves = value.parse().unwrap_or(0),
            "is_eligible_for_master_election" => out.eligible = parse_bool(value),
            "slave_repl_offset" => slave_repl_offset = value.parse().ok(),
            "master_repl_offset" => master_repl_offset = value.parse().ok(),
            "master_link_down_since_seconds" => out.never_linked = value == "-1",
            "master_sync_in_progress" => redis_full_sync = value == "1",
            // `(db0:WaitDBSync)(db1:Error)`, only while some DB is not connected.
            "db_repl_state" => {
                for group in value.split(')') {
                    if let Some((_, state)) = group.trim().trim_start_matches('(').split_once(':') {
                        worse(SyncState::parse(state));
                    }
                }
            }
            _ if numbered(key, "db") => {
                // Two kinds of line share the prefix: `db0:binlog_offset=F O,…` and, under `repl_connect_status:`,
                // `db0:connected`. Redis' keyspace lines (`db0:keys=…`) land here too when given a full INFO.
                if let Some(position) = value.strip_prefix("binlog_offset=") {
                    is_pika = true;
                    if let Some((file, offset)) = parse_binlog(position) {
                        if key == "db0" {
                            out.position = Some(BinlogPosition::new(file, offset));
                        }
                        let bytes = file.saturating_mul(BINLOG_FILE_SIZE).saturating_add(offset);
                        binlog_total = Some(binlog_total.unwrap_or(0).saturating_add(bytes));
                    }
                } else if !value.contains('=') {
                    dbs_connected &= value.eq_ignore_ascii_case("connected");
                    worse(SyncState::parse(value));
                }
            }
            _ if numbered(key, "slave") => {
                if let Some((replica, offset)) = parse_replica(value) {
                    out.replicas.push(replica);
                    acked.push(offset);
                }
            }
            _ => {}
        }
    }

    if !is_pika {
        if let Some(master) = master_repl_offset {
            for (replica, acked) in out.replicas.iter_mut().zip(&acked) {
                if let Some(acked) = acked {
                    replica.lag = Some(master.saturating_sub(*acked));
                }
            }
        }
    }
    let role = role_line.or(header_role);
    out.role = role.unwrap_or_default();
    out.kind = if is_pika { ServerKind::Pika } else { ServerKind::Redis };
    out.link_up = link_status_up && dbs_connected;
    out.sync = out.role.is_slave().then(|| {
        let reported = if redis_full_sync { Some(SyncState::FullSync) } else { worst_db };
        // Without a per-DB state (redis, pika before v3.5.5) the link says it.
        let linked = if out.link_up { SyncState::Connected } else { SyncState::Connecting };
        reported.map_or(linked, |r| r.max(linked))
    });
    out.offset = if is_pika {
        slave_repl_offset.or(binlog_total)
    } else if out.role == Role::Master {
        master_repl_offset
    } else {
        slave_repl_offset.or(master_repl_offset)
    };
    if !is_pika {
        out.position = out.offset.map(|o| BinlogPosition::new(0, o));
    }
    (role, out)
}

/// pika's header `# Replication(MASTER)`, `(SLAVE)` or `(Master && SLAVE)`; redis' bare `# Replication` has none.
fn header_role_of(header: &str) -> Option<Role> {
    let header = header.trim();
    let (name, rest) = header.split_at_checked("Replication(".len())?;
    if !name.eq_ignore_ascii_case("Replication(") {
        return None;
    }
    Role::parse(rest.strip_suffix(')')?)
}

/// Whether `key` is `prefix` followed by digits only (`slave0`, `db12`; not `slave_priority`).
fn numbered(key: &str, prefix: &str) -> bool {
    key.strip_prefix(prefix).is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

fn parse_bool(value: &str) -> Option<bool> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "yes" | "1" => Some(true),
        "false" | "no" | "0" => Some(false),
        _ => None,
    }
}

/// `3 52428800,safety_purge=none` → `(3, 52428800)`.
fn parse_binlog(position: &str) -> Option<(u64, u64)> {
    let numbers = position.split(',').next()?;
    let mut parts = numbers.split_whitespace();
    let file = parts.next()?.parse().ok()?;
    let offset = parts.next()?.parse().ok()?;
    Some((file, offset))
}

/// pika `ip=…,port=…,conn_fd=…,lag=(db0:N)` or redis `ip=…,port=…,state=online,offset=…,lag=…`; returns the
/// replica and, for redis, the offset it acknowledged.
fn parse_replica(value: &str) -> Option<(ReplicaInfo, Option<u64>)> {
    let mut replica = ReplicaInfo::default();
    let mut port = None;
    let mut acked = None;
    for field in value.split(',') {
        let Some((name, v)) = field.split_once('=') else { continue };
        match name.trim() {
            "ip" => v.trim().clone_into(&mut replica.ip),
            "port" => port = v.trim().parse().ok(),
            "lag" if v.trim_start().starts_with('(') => (replica.lag, replica.syncing) = parse_pika_lag(v),
            // Redis' `lag` is seconds since the last ack, not bytes: the byte lag comes from the offsets instead.
            "state" => replica.syncing = !v.trim().eq_ignore_ascii_case("online"),
            "offset" => acked = v.trim().parse().ok(),
            _ => {}
        }
    }
    if replica.ip.is_empty() {
        return None;
    }
    replica.port = port?;
    Some((replica, acked))
}

/// `(db0:0)`, `(db0:full syncing)`, `(db0:not syncing)`, one group per DB → (largest numeric lag if every DB has
/// one, whether any DB is in full sync).
fn parse_pika_lag(value: &str) -> (Option<u64>, bool) {
    let mut lag: Option<u64> = None;
    let mut all_numeric = true;
    let mut syncing = false;
    for group in value.split(')') {
        let Some((_, state)) = group.trim().trim_start_matches('(').split_once(':') else { continue };
        let state = state.trim();
        if let Ok(n) = state.parse::<u64>() {
            lag = Some(lag.map_or(n, |l| l.max(n)));
        } else {
            all_numeric = false;
            syncing |= state.eq_ignore_ascii_case("full syncing");
        }
    }
    (lag.filter(|_| all_numeric), syncing)
}

// ---- addresses ---------------------------------------------------------------------------------------------------

/// Where to dial the server registered in Codis as `server` (`<pod fqdn>:<port>`): its entry in `overrides` (from
/// `PIKA_ADDRESS_OVERRIDES`, matched without case) when there is one, else `server` itself; an alias
/// ([`ServerAddr::alias_of`](crate::clients::server::ServerAddr::alias_of)) as the server it stands for. Codis's
/// server strings are read here and nowhere else.
pub fn dial_address(server: &str, overrides: &BTreeMap<String, HostPort>) -> Result<HostPort, Error> {
    // An alias is dialled as the server it stands for, as DNS resolves it.
    let unaliased = crate::clients::server::ServerAddr::unaliased(server.trim());
    let server = unaliased.as_ref();
    if let Some((_, real)) = overrides.iter().find(|(k, _)| k.trim().eq_ignore_ascii_case(server)) {
        return Ok(real.clone());
    }
    HostPort::parse(server).map_err(|reason| Error::Address { address: server.to_owned(), reason })
}

// ---- clients -----------------------------------------------------------------------------------------------------

/// The connection settings: no password (AUTH is sent explicitly, so the password never sits in the crate's
/// connection info) and no `CLIENT SETINFO`, which pika does not know.
fn connection_info(host: &str, port: u16) -> redis::RedisResult<ConnectionInfo> {
    let info = ConnectionAddr::Tcp(host.to_owned(), port).into_connection_info()?;
    Ok(info.set_redis_settings(RedisConnectionInfo::default().set_skip_set_lib_name()))
}

/// The server's reply (`ERR …`) or the client's reason, with `secret` masked should the server echo it.
fn describe(err: &redis::RedisError, secret: Option<&str>) -> String {
    let text = match (err.code(), err.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        _ => err.to_string(),
    };
    match secret {
        Some(secret) if !secret.is_empty() && text.contains(secret) => text.replace(secret, crate::redact::MASK),
        _ => text,
    }
}

fn connect_error(addr: &str, err: &redis::RedisError) -> Error {
    if err.is_timeout() {
        Error::Timeout { addr: addr.to_owned(), command: "connect" }
    } else {
        Error::Connect { addr: addr.to_owned(), message: describe(err, None) }
    }
}

fn command_error(addr: &str, command: &'static str, err: &redis::RedisError, secret: Option<&str>) -> Error {
    if err.is_timeout() {
        Error::Timeout { addr: addr.to_owned(), command }
    } else {
        Error::Command { addr: addr.to_owned(), command, message: describe(err, secret) }
    }
}

/// Connections [`Pika::connect`] makes when each is dropped before its first answer.
const DIAL_ATTEMPTS: u32 = 3;

/// Why one dial failed: whether dialling again may help.
enum Dial {
    /// The server reset or closed the connection before its first answer.
    Dropped(Error),
    /// Anything else: refused, timed out, a wrong password.
    Failed(Error),
}

/// An async connection to one pika server; every command is bounded by the timeout given to [`Pika::connect`].
#[derive(Clone)]
pub struct Pika {
    addr: String,
    conn: MultiplexedConnection,
    timeout: Duration,
}

impl fmt::Debug for Pika {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pika").field("addr", &self.addr).field("timeout", &self.timeout).finish_non_exhaustive()
    }
}

impl Pika {
    /// Connects to `server` and authenticates with `password` when one is given (an empty one counts as none).
    ///
    /// The first exchange (`AUTH`, or `PING` without a password) proves the connection: one the server resets or
    /// closes before it answers is dialled again, up to [`DIAL_ATTEMPTS`] times within `timeout`, because nothing
    /// was done on it (seen in CI: `Connection reset by peer` on the first command to a healthy redis-server, beside
    /// a busy test churning loopback connections). A server that answers, even with an error other than a refused
    /// `AUTH`, is connected; a refused `AUTH` or a timeout is final.
    pub async fn connect(server: &HostPort, password: Option<&str>, timeout: Duration) -> Result<Self, Error> {
        let password = password.filter(|p| !p.is_empty());
        let deadline = tokio::time::Instant::now() + timeout;
        let mut attempt = 1;
        loop {
            match Self::dial(server, password, timeout).await {
                Ok(pika) => return Ok(pika),
                Err(Dial::Dropped(error)) if attempt < DIAL_ATTEMPTS && tokio::time::Instant::now() < deadline => {
                    tracing::debug!(pika = %server, %error, attempt, "connection dropped before its first answer; dialling again");
                    attempt += 1;
                }
                Err(Dial::Dropped(error) | Dial::Failed(error)) => return Err(error),
            }
        }
    }

    /// One connection and its first exchange.
    async fn dial(server: &HostPort, password: Option<&str>, timeout: Duration) -> Result<Self, Dial> {
        let addr = server.to_string();
        let client = connection_info(server.host(), server.port())
            .and_then(Client::open)
            .map_err(|e| Dial::Failed(connect_error(&addr, &e)))?;
        let config =
            AsyncConnectionConfig::new().set_connection_timeout(Some(timeout)).set_response_timeout(Some(timeout));
        let mut conn =
            match tokio::time::timeout(timeout, client.get_multiplexed_async_connection_with_config(&config)).await {
                Err(_) => return Err(Dial::Failed(Error::Timeout { addr, command: "connect" })),
                Ok(result) => result.map_err(|e| Dial::Failed(connect_error(&addr, &e)))?,
            };
        let (command, first) = match password {
            Some(password) => {
                let mut auth = redis::cmd("AUTH");
                auth.arg(password);
                ("AUTH", auth)
            }
            None => ("PING", redis::cmd("PING")),
        };
        match tokio::time::timeout(timeout, first.query_async::<()>(&mut conn)).await {
            Err(_) => return Err(Dial::Failed(Error::Timeout { addr, command })),
            Ok(Err(e)) if e.is_connection_dropped() => {
                return Err(Dial::Dropped(command_error(&addr, command, &e, password)));
            }
            // A PING refused (NOAUTH, say) still proves the connection; the commands that follow say what is wrong.
            Ok(Err(e)) if password.is_none() && e.code().is_some() => {}
            Ok(Err(e)) => return Err(Dial::Failed(command_error(&addr, command, &e, password))),
            Ok(Ok(())) => {}
        }
        tracing::debug!(pika = %addr, "connected");
        Ok(Self { addr, conn, timeout })
    }

    /// `host:port` of the server.
    #[must_use]
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// `PING`.
    pub async fn ping(&self) -> Result<(), Error> {
        let reply: String = self.query("PING", &redis::cmd("PING"), None).await?;
        if reply.eq_ignore_ascii_case("PONG") {
            Ok(())
        } else {
            Err(self.unexpected("PING", &reply))
        }
    }

    /// `INFO replication`, parsed.
    pub async fn info_replication(&self) -> Result<Replication, Error> {
        let mut cmd = redis::cmd("INFO");
        cmd.arg("replication");
        let text: String = self.query("INFO replication", &cmd, None).await?;
        Ok(parse_replication(&text))
    }

    /// `SLAVEOF host port` of `master`. Only switches the state machine: poll [`Replication::link_up`], and persist
    /// with [`Pika::config_rewrite`]. Idempotent on pika when the host is spelled as before.
    pub async fn slaveof(&self, master: &HostPort) -> Result<(), Error> {
        crate::failpoint::step("SLAVEOF");
        tracing::debug!(pika = %self.addr, master = %master, "slaveof");
        let mut cmd = redis::cmd("SLAVEOF");
        cmd.arg(master.host()).arg(master.port());
        self.query("SLAVEOF", &cmd, None).await
    }

    /// `SLAVEOF host port force` on pika: a full resync from `master` whatever the two histories are (pika's
    /// incremental sync checks only that the replica's binlog position exists on the master). redis-server takes
    /// no `force` and needs none: it compares replication IDs and resyncs in full by itself, so it gets the plain
    /// form. A pika in its replication error state ignores this: send [`Pika::slaveof_no_one`] first.
    pub async fn slaveof_full_sync(&self, master: &HostPort, kind: ServerKind) -> Result<(), Error> {
        crate::failpoint::step("SLAVEOF force");
        tracing::debug!(pika = %self.addr, master = %master, "slaveof, forcing a full sync");
        let mut cmd = redis::cmd("SLAVEOF");
        cmd.arg(master.host()).arg(master.port());
        if kind == ServerKind::Pika {
            cmd.arg("force");
        }
        self.query("SLAVEOF", &cmd, None).await
    }

    /// `DELBACKUP` (pika): deletes the dumps under its dump path, unless a replica is copying one. A master answers a
    /// replica's full sync with the dump it already has whenever that dump's binlog file is still there
    /// (`PikaServer::TryDBSync`), without checking that its data still comes from it: a pod that was a master, then
    /// copied another in full, then became a master again served its dump from before the copy (seen: a pod joining
    /// it got the empty dump of the cluster's creation at `0 0`, then was refused that binlog position for good).
    /// Send it before the pod becomes a master.
    pub async fn delete_dumps(&self) -> Result<(), Error> {
        crate::failpoint::step("DELBACKUP");
        tracing::debug!(pika = %self.addr, "delbackup");
        self.query("DELBACKUP", &redis::cmd("DELBACKUP"), None).await
    }

    /// `CLEARREPLICATIONID` (pika): forgets the replication ID (and an unfinished full sync), persisted by pika itself.
    /// pika refuses a master whose ID differs from its own, non-empty one ("replicationid on both sides of the
    /// connection are inconsistent") and stays in its error state; with none it adopts the master's and copies it in
    /// full. Send it to a server that follows nothing ([`Pika::slaveof_no_one`] first).
    pub async fn clear_replication_id(&self) -> Result<(), Error> {
        crate::failpoint::step("CLEARREPLICATIONID");
        tracing::debug!(pika = %self.addr, "clear replication id");
        let reply: String = self.query("CLEARREPLICATIONID", &redis::cmd("CLEARREPLICATIONID"), None).await?;
        // pika answers `+ReplicationID is cleared` rather than `+OK`.
        if reply.to_ascii_lowercase().contains("cleared") || reply.eq_ignore_ascii_case("OK") {
            Ok(())
        } else {
            Err(self.unexpected("CLEARREPLICATIONID", &reply))
        }
    }

    /// `SLAVEOF NO ONE` (a no-op on a master). Persist with [`Pika::config_rewrite`].
    pub async fn slaveof_no_one(&self) -> Result<(), Error> {
        crate::failpoint::step("SLAVEOF NO ONE");
        tracing::debug!(pika = %self.addr, "slaveof no one");
        let mut cmd = redis::cmd("SLAVEOF");
        cmd.arg("NO").arg("ONE");
        self.query("SLAVEOF NO ONE", &cmd, None).await
    }

    /// `CONFIG REWRITE`: the only way pika persists a replication change across restarts.
    pub async fn config_rewrite(&self) -> Result<(), Error> {
        crate::failpoint::step("CONFIG REWRITE");
        tracing::debug!(pika = %self.addr, "config rewrite");
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("REWRITE");
        self.query("CONFIG REWRITE", &cmd, None).await
    }

    /// `SCAN cursor COUNT count`: the next cursor (0 when the scan is complete) and a batch of keys.
    pub async fn scan(&self, cursor: u64, count: usize) -> Result<(u64, Vec<Vec<u8>>), Error> {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor).arg("COUNT").arg(count);
        let (next, keys): (String, Vec<Vec<u8>>) = self.query("SCAN", &cmd, None).await?;
        let next = next.parse().map_err(|_| self.unexpected("SCAN", &next))?;
        Ok((next, keys))
    }

    /// `SLOTSRELOAD`: pika rebuilds its per-slot key sets in the background (a promoted replica may have none).
    /// `Ok(false)` from a server without the command (redis-server).
    pub async fn slots_reload(&self) -> Result<bool, Error> {
        crate::failpoint::step("SLOTSRELOAD");
        match self.query::<redis::Value>("SLOTSRELOAD", &redis::cmd("SLOTSRELOAD"), None).await {
            Ok(_) => Ok(true),
            Err(Error::Command { message, .. }) if message.to_ascii_lowercase().contains("unknown command") => {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// `DEL key…`: how many of `keys` existed. Nothing is sent for none.
    pub async fn del(&self, keys: &[Vec<u8>]) -> Result<u64, Error> {
        if keys.is_empty() {
            return Ok(0);
        }
        crate::failpoint::step("DEL");
        let mut cmd = redis::cmd("DEL");
        for key in keys {
            cmd.arg(key.as_slice());
        }
        self.query("DEL", &cmd, None).await
    }

    /// `EXISTS key`.
    pub async fn exists(&self, key: &[u8]) -> Result<bool, Error> {
        let mut cmd = redis::cmd("EXISTS");
        cmd.arg(key);
        let n: u64 = self.query("EXISTS", &cmd, None).await?;
        Ok(n > 0)
    }

    /// Sends `command` (its name first) as it is, for its effect: its reply is not read, an error reply is an error.
    pub async fn send(&self, command: &[Vec<u8>]) -> Result<(), Error> {
        let Some((name, args)) = command.split_first() else { return Ok(()) };
        crate::failpoint::step("salvaged write");
        let mut cmd = redis::cmd(&String::from_utf8_lossy(name));
        for arg in args {
            cmd.arg(arg.as_slice());
        }
        self.query::<redis::Value>("a salvaged write", &cmd, None).await.map(|_| ())
    }

    /// `CONFIG GET key`: the value, `None` when the server has no such item.
    pub async fn config_get(&self, key: &str) -> Result<Option<String>, Error> {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg(key);
        let flat: Vec<String> = self.query("CONFIG GET", &cmd, None).await?;
        let mut pairs = flat.chunks_exact(2);
        let exact = pairs.find(|p| p[0].eq_ignore_ascii_case(key)).map(|p| p[1].clone());
        // A server that renames the item in its reply still answers with exactly one pair.
        Ok(exact.or_else(|| match flat.as_slice() {
            [_, value] => Some(value.clone()),
            _ => None,
        }))
    }

    async fn query<T: redis::FromRedisValue>(
        &self,
        command: &'static str,
        cmd: &redis::Cmd,
        secret: Option<&str>,
    ) -> Result<T, Error> {
        let mut conn = self.conn.clone();
        match tokio::time::timeout(self.timeout, cmd.query_async::<T>(&mut conn)).await {
            Err(_) => Err(Error::Timeout { addr: self.addr.clone(), command }),
            Ok(result) => result.map_err(|e| command_error(&self.addr, command, &e, secret)),
        }
    }

    fn unexpected(&self, command: &'static str, reply: &str) -> Error {
        Error::Command { addr: self.addr.clone(), command, message: format!("unexpected reply {reply:?}") }
    }
}

/// The role of the server at `host:port`, synchronously: one connection, `AUTH` when a password is given,
/// `INFO replication`. `timeout` bounds the whole probe, connection included.
pub fn probe_role(server: &HostPort, password: Option<&str>, timeout: Duration) -> Result<Role, Error> {
    let (host, port) = (server.host(), server.port());
    let addr = server.to_string();
    let start = Instant::now();
    // What is left of the budget for the next step; sockets refuse a zero timeout, so an exhausted budget is a timeout.
    let left = |command: &'static str| {
        timeout
            .checked_sub(start.elapsed())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| Error::Timeout { addr: addr.clone(), command })
    };
    let client = connection_info(host, port).and_then(Client::open).map_err(|e| connect_error(&addr, &e))?;
    let mut conn = client.get_connection_with_timeout(left("connect")?).map_err(|e| connect_error(&addr, &e))?;
    let bound = |conn: &redis::Connection, command: &'static str| -> Result<(), Error> {
        let t = left(command)?;
        conn.set_read_timeout(Some(t))
            .and_then(|()| conn.set_write_timeout(Some(t)))
            .map_err(|e| command_error(&addr, command, &e, None))
    };
    if let Some(password) = password.filter(|p| !p.is_empty()) {
        bound(&conn, "AUTH")?;
        redis::cmd("AUTH")
            .arg(password)
            .query::<()>(&mut conn)
            .map_err(|e| command_error(&addr, "AUTH", &e, Some(password)))?;
    }
    bound(&conn, "INFO replication")?;
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query(&mut conn)
        .map_err(|e| command_error(&addr, "INFO replication", &e, None))?;
    parse_role(&info).ok_or_else(|| Error::Command {
        addr: addr.clone(),
        command: "INFO replication",
        message: "the reply names no role".to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::path::PathBuf;
    use std::process::{Child, Command, Stdio};

    use proptest::prelude::*;

    use super::*;

    fn local(port: u16) -> HostPort {
        HostPort::new("127.0.0.1".to_owned(), port)
    }

    #[test]
    fn only_a_server_that_does_not_answer_is_unreachable() {
        let addr = "p:9221".to_owned();
        assert!(Error::Connect { addr: addr.clone(), message: "refused".into() }.is_unreachable());
        assert!(Error::Timeout { addr: addr.clone(), command: "CONFIG" }.is_unreachable());
        assert!(!Error::Command { addr: addr.clone(), command: "CONFIG", message: "ERR".into() }.is_unreachable());
        assert!(!Error::Address { address: addr, reason: "no port".into() }.is_unreachable());
    }

    macro_rules! fixture {
        ($name:literal) => {
            include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/pika-info/", $name))
        };
    }

    /// The fixtures are stored with LF; servers send CRLF. Both must read the same.
    fn both_endings(text: &str) -> Replication {
        let lf = parse_replication(text);
        let crlf = parse_replication(&text.replace('\n', "\r\n"));
        assert_eq!(lf, crlf);
        crlf
    }

    const REPL_ID: &str = "4f0c1ab9e27d5c3a8b6e0f91d2c7a4b5e83f6d0a1c9b2e7f4a";
    const MASTER_FQDN: &str = "mycluster-pika-x7k-0.mycluster-pika-x7k-headless.default.svc.cluster.local";

    #[test]
    fn pika_master_lists_a_synced_and_a_full_syncing_slave() {
        let r = both_endings(fixture!("master.txt"));
        assert_eq!(r.role, Role::Master);
        assert_eq!(r.role.probe_name(), "master");
        assert_eq!(r.replication_id.as_deref(), Some(REPL_ID));
        assert_eq!(r.connected_slaves, 2);
        assert_eq!(
            r.replicas,
            [
                ReplicaInfo { ip: "10.244.1.17".into(), port: 9221, lag: Some(0), syncing: false },
                ReplicaInfo { ip: "10.244.2.9".into(), port: 9221, lag: None, syncing: true },
            ]
        );
        assert_eq!(r.eligible, Some(true));
        assert_eq!(r.position, Some(BinlogPosition::new(3, 52_428_800)));
        assert_eq!(r.offset, Some(367_001_600));
        assert_eq!(r.master_host, None);
        assert!(!r.link_up);
        assert!(r.replica("10.244.2.9", 9221).is_some_and(|s| s.syncing));
    }

    #[test]
    fn pika_healthy_slave_has_its_link_up() {
        let r = both_endings(fixture!("slave.txt"));
        assert_eq!(r.role, Role::Slave);
        assert_eq!(r.role.probe_name(), "slave");
        assert_eq!(r.master_host.as_deref(), Some(MASTER_FQDN));
        assert_eq!(r.master_port, Some(9221));
        assert!(r.link_up);
        assert_eq!(r.eligible, Some(true));
        assert_eq!(r.position, Some(BinlogPosition::new(3, 52_428_800)));
        assert_eq!(r.offset, Some(367_001_600));
        assert_eq!(r.connected_slaves, 0);
        assert!(r.replicas.is_empty());
        assert!(r.follows(&HostPort::new(MASTER_FQDN.to_ascii_uppercase(), 9221)));
        assert!(!r.follows(&HostPort::new(MASTER_FQDN.to_owned(), 9222)));
        assert!(!r.follows(&HostPort::new("other".to_owned(), 9221)));
    }

    #[test]
    fn pika_slave_in_full_sync_is_down_and_not_eligible() {
        let r = both_endings(fixture!("slave-full-sync.txt"));
        assert_eq!(r.role, Role::Slave);
        assert!(!r.link_up);
        assert_eq!(r.eligible, Some(false));
        assert_eq!(r.position, Some(BinlogPosition::new(0, 0)));
        assert_eq!(r.offset, Some(0));
        assert!(r.follows(&HostPort::new(MASTER_FQDN.to_owned(), 9221)));
    }

    #[test]
    fn a_db_that_is_not_connected_keeps_the_link_down_even_if_the_status_says_up() {
        let text = fixture!("slave.txt").replace("db0:connected", "db0:connecting");
        let r = parse_replication(&text);
        assert!(!r.link_up);
        assert_eq!(r.sync, Some(SyncState::Connecting));
        assert!(!r.in_sync());
        let r = both_endings(fixture!("slave.txt"));
        assert_eq!((r.kind, r.sync), (ServerKind::Pika, Some(SyncState::Connected)));
        assert!(r.in_sync());
    }

    #[test]
    fn pikas_error_state_and_full_sync_are_read_from_either_line_whatever_it_says_of_eligibility() {
        // As observed on v4.0.1: a replica whose position its master refused (pika.md §8).
        let error = "# Replication(SLAVE)\r\nrole:slave\r\nReplicationID:ab\r\nmaster_host:m\r\nmaster_port:9221\r\n\
                     master_link_status:down\r\nrepl_connect_status:\r\ndb0:error\r\nslave_priority:100\r\n\
                     slave_read_only:1\r\ndb_repl_state:(db0:Error)\r\nis_eligible_for_master_election:true\r\n\
                     db0:binlog_offset=0 4242,safety_purge=none\r\n";
        let r = parse_replication(error);
        assert_eq!(r.sync, Some(SyncState::Error));
        assert_eq!(r.eligible, Some(true));
        assert!(!r.in_sync());
        // Only the db_repl_state line says it (a layout without repl_connect_status).
        let r = parse_replication(&error.replace("db0:error\r\n", ""));
        assert_eq!(r.sync, Some(SyncState::Error));
        let r = both_endings(fixture!("slave-full-sync.txt"));
        assert_eq!(r.sync, Some(SyncState::FullSync));
        let mut two = fixture!("slave.txt").replace("db0:connected", "db0:connected\ndb1:syncing_full");
        two.push_str("db_repl_state:(db1:WaitDBSync)\n");
        assert_eq!(parse_replication(&two).sync, Some(SyncState::FullSync), "the worst DB counts");
    }

    #[test]
    fn pika_chained_slave_is_reported_as_slave_with_its_own_replica() {
        let r = both_endings(fixture!("master-and-slave.txt"));
        assert_eq!(r.role, Role::MasterAndSlave);
        assert_eq!(r.role.probe_name(), "slave");
        assert!(r.link_up);
        assert!(r.follows(&HostPort::new(MASTER_FQDN.to_owned(), 9221)));
        assert_eq!(r.connected_slaves, 1);
        assert_eq!(r.replicas[0].lag, Some(1024));
        assert_eq!(r.offset, Some(367_000_576));
    }

    #[test]
    fn pika_v3_5_3_without_the_newer_keys_still_reads() {
        let r = both_endings(fixture!("v3.5.3-slave.txt"));
        assert_eq!(r.role, Role::Slave);
        // No repl_connect_status section: the link status alone decides.
        assert!(r.link_up);
        assert_eq!(r.eligible, None);
        assert_eq!(r.position, Some(BinlogPosition::new(2, 1_048_576)));
        assert_eq!(r.offset, Some(2 * BINLOG_FILE_SIZE + 1_048_576));

        let r = both_endings(fixture!("v3.5.3-master.txt"));
        assert_eq!(r.role, Role::Master);
        assert_eq!(r.replication_id, None);
        assert_eq!(r.offset, Some(1234));
    }

    #[test]
    fn redis_master_reports_its_replica_and_offset() {
        let r = both_endings(fixture!("redis7-master.txt"));
        assert_eq!(r.role, Role::Master);
        assert_eq!(r.connected_slaves, 1);
        assert_eq!(r.replicas, [ReplicaInfo { ip: "127.0.0.1".into(), port: 16392, lag: Some(0), syncing: false }]);
        assert_eq!(r.offset, Some(50));
        assert_eq!(r.replication_id, None);
        assert_eq!(r.kind, ServerKind::Redis);
        assert_eq!(r.sync, None, "a master has no master to be in sync with");
        // redis' one offset, as file 0.
        assert_eq!(r.position, Some(BinlogPosition::new(0, 50)));
        assert_eq!(r.eligible, None);
    }

    #[test]
    fn redis_replica_reports_its_master() {
        let r = both_endings(fixture!("redis7-replica.txt"));
        assert_eq!(r.role, Role::Slave);
        assert!(r.link_up);
        assert!(r.follows(&HostPort::new(("127.0.0.1").to_string(), 16391)));
        assert_eq!(r.offset, Some(50));
        assert!(r.replicas.is_empty());
    }

    #[test]
    fn redis_replica_lag_is_the_offset_gap_and_sync_states_count_as_syncing() {
        let text = "role:master\nconnected_slaves:2\n\
                    slave0:ip=10.0.0.2,port=6379,state=online,offset=40,lag=0\n\
                    slave1:ip=10.0.0.3,port=6379,state=wait_bgsave,offset=0,lag=0\n\
                    master_repl_offset:100\n";
        let r = parse_replication(text);
        assert_eq!(r.replicas[0].lag, Some(60));
        assert!(!r.replicas[0].syncing);
        assert!(r.replicas[1].syncing);
    }

    #[test]
    fn the_header_gives_the_role_when_the_role_line_is_missing() {
        assert_eq!(parse_role("# Replication(SLAVE)\r\n"), Some(Role::Slave));
        assert_eq!(parse_role("# Replication(Master && SLAVE)\r\n"), Some(Role::MasterAndSlave));
        assert_eq!(parse_role("# Replication\r\nconnected_slaves:0\r\n"), None);
        assert_eq!(parse_role(""), None);
        assert_eq!(parse_replication("").role, Role::Master);
        assert_eq!(parse_role("role:bogus\n"), None);
    }

    #[test]
    fn pika_lag_with_several_dbs_takes_the_largest_and_needs_all_numeric() {
        assert_eq!(parse_pika_lag("(db0:5)(db1:7)"), (Some(7), false));
        assert_eq!(parse_pika_lag("(db0:5)(db1:full syncing)"), (None, true));
        assert_eq!(parse_pika_lag("(db0:not syncing)"), (None, false));
        assert_eq!(parse_pika_lag("garbage"), (None, false));
    }

    #[test]
    fn malformed_values_are_skipped() {
        let text = "role:slave\nmaster_port:99999\nconnected_slaves:x\nslave0:ip=,port=1\nslave1:ip=a,port=no\n\
                    db0:binlog_offset=x y\nslave_repl_offset:-1\nno colon here\n:\n";
        let r = parse_replication(text);
        assert_eq!(r.role, Role::Slave);
        assert_eq!(r.master_port, None);
        assert_eq!(r.connected_slaves, 0);
        assert!(r.replicas.is_empty());
        assert_eq!(r.position, None);
        assert_eq!(r.offset, None);
    }

    #[test]
    fn huge_binlog_positions_saturate_instead_of_overflowing() {
        let r = parse_replication(&format!("# Replication(MASTER)\ndb0:binlog_offset={} {},x\n", u64::MAX, u64::MAX));
        assert_eq!(r.offset, Some(u64::MAX));
    }

    #[test]
    fn dial_address_prefers_an_override_matched_without_case() {
        let at = |raw: &str| HostPort::parse(raw).unwrap();
        let overrides = BTreeMap::from([(
            "c1-pika-a-0.c1-pika-a-headless.default.svc.cluster.local:9221".to_owned(),
            at("127.0.0.1:41234"),
        )]);
        assert_eq!(
            dial_address("C1-PIKA-A-0.c1-pika-a-headless.default.svc.cluster.local:9221", &overrides).unwrap(),
            at("127.0.0.1:41234")
        );
        assert_eq!(
            dial_address("c1-pika-a-0.c1-pika-a-headless.default.svc.cluster.local.:9221", &overrides).unwrap(),
            at("127.0.0.1:41234"),
            "an alias is dialled as the server it stands for"
        );
        let own = dial_address("c1-pika-a-1.c1-pika-a-headless.default.svc.cluster.local:9221", &overrides).unwrap();
        assert_eq!((own.host(), own.port()), ("c1-pika-a-1.c1-pika-a-headless.default.svc.cluster.local", 9221));
        let v6 = dial_address("[::1]:6379", &BTreeMap::new()).unwrap();
        assert_eq!((v6.host(), v6.port()), ("::1", 6379));
        for bad in ["nohost", ":9221", "host:", "host:0", "host:70000", "::1:6379", "a b:1"] {
            assert!(matches!(dial_address(bad, &BTreeMap::new()), Err(Error::Address { .. })), "{bad:?}");
        }
    }

    /// Lines of both layouts, valid alone, for shuffled replies.
    const LINES: &[&str] = &[
        "# Replication(MASTER)",
        "# Replication(SLAVE)",
        "# Replication(Master && SLAVE)",
        "# Replication",
        "role:master",
        "role:slave",
        "role:master&&slave",
        "ReplicationID:4f0c1ab9e27d5c3a8b6e0f91d2c7a4b5e83f6d0a1c9b2e7f4a",
        "ReplicationID:",
        "master_host:10.0.0.1",
        "master_port:9221",
        "master_link_status:up",
        "master_link_status:down",
        "repl_connect_status:",
        "db0:connected",
        "db0:syncing_full",
        "slave_priority:100",
        "slave_read_only:1",
        "db_repl_state:(db0:WaitDBSync)",
        "connected_slaves:2",
        "slave0:ip=10.244.1.17,port=9221,conn_fd=88,lag=(db0:0)",
        "slave1:ip=10.244.2.9,port=9221,conn_fd=91,lag=(db0:full syncing)",
        "slave0:ip=127.0.0.1,port=6380,state=online,offset=50,lag=1",
        "is_eligible_for_master_election:true",
        "db0:binlog_offset=3 52428800,safety_purge=none",
        "db0:binlog_offset=18446744073709551615 18446744073709551615,safety_purge=none",
        "slave_repl_offset:367001600",
        "master_repl_offset:50",
        "master_sync_in_progress:0",
        "",
    ];

    proptest! {
        #[test]
        fn parse_replication_never_panics_on_arbitrary_text(text in "\\PC*") {
            let _ = parse_replication(&text);
        }

        #[test]
        fn parse_replication_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse_replication(&String::from_utf8_lossy(&bytes));
        }

        #[test]
        fn parse_replication_handles_any_interleaving_of_valid_lines(
            lines in proptest::collection::vec(proptest::sample::select(LINES), 0..40),
            crlf in any::<bool>(),
        ) {
            let text = lines.join(if crlf { "\r\n" } else { "\n" });
            let r = parse_replication(&text);
            // Whatever the order, the role is the last role line's, else a header's.
            if let Some(last) = lines.iter().rev().find_map(|l| l.strip_prefix("role:")) {
                prop_assert_eq!(Some(r.role), Role::parse(last));
            }
            prop_assert!(r.replicas.len() <= lines.len());
        }
    }

    // ---- against a real redis-server -----------------------------------------------------------------------------

    /// A redis-server of its own on a free loopback port, with a config file (so `CONFIG REWRITE` works); killed on
    /// drop.
    struct TestRedis {
        child: Child,
        port: u16,
        dir: tempfile::TempDir,
    }

    impl TestRedis {
        fn start(extra_config: &str) -> Self {
            let dir = tempfile::tempdir().unwrap();
            // Bind and drop to learn a free port; a rare collision fails the start below loudly.
            let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            std::fs::write(
                dir.path().join("redis.conf"),
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {}\nsave \"\"\nappendonly no\n\
                     repl-diskless-sync-delay 0\n{extra_config}\n",
                    dir.path().display()
                ),
            )
            .unwrap();
            let child = Command::new("/usr/bin/redis-server")
                .arg(dir.path().join("redis.conf"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let server = Self { child, port, dir };
            let deadline = Instant::now() + Duration::from_secs(10);
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                assert!(Instant::now() < deadline, "redis-server on {port} did not start");
                std::thread::sleep(Duration::from_millis(20));
            }
            server
        }

        fn config_path(&self) -> PathBuf {
            self.dir.path().join("redis.conf")
        }
    }

    impl Drop for TestRedis {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    const T: Duration = Duration::from_secs(5);

    async fn wait_for<F>(pika: &Pika, what: &str, done: F) -> Replication
    where
        F: Fn(&Replication) -> bool,
    {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let r = pika.info_replication().await.unwrap();
            if done(&r) {
                return r;
            }
            assert!(Instant::now() < deadline, "{what}: still {r:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    #[test]
    fn pikas_refusals_while_it_has_replicas_are_waited_out_and_others_are_not() {
        let refusal = |message: &str| Error::Command {
            addr: "10.0.0.1:9221".into(),
            command: "SLAVEOF",
            message: message.into(),
        };
        assert!(refusal("ERR already master of others, invalid usage").is_transient_slaveof_refusal());
        assert!(refusal("ERR Server is not in correct state for slaveof").is_transient_slaveof_refusal());
        assert!(!refusal("ERR The master ip:port and the slave ip:port are the same").is_transient_slaveof_refusal());
        assert!(!Error::Timeout { addr: "a:1".into(), command: "SLAVEOF" }.is_transient_slaveof_refusal());
    }

    #[tokio::test]
    async fn a_standalone_server_is_a_master() {
        let server = TestRedis::start("");
        let pika = Pika::connect(&local(server.port), None, T).await.unwrap();
        assert_eq!(pika.addr(), format!("127.0.0.1:{}", server.port));
        pika.ping().await.unwrap();
        let r = pika.info_replication().await.unwrap();
        assert_eq!(r.role, Role::Master);
        assert_eq!(r.connected_slaves, 0);
        assert_eq!(pika.config_get("port").await.unwrap(), Some(server.port.to_string()));
        assert_eq!(pika.config_get("no-such-item").await.unwrap(), None);
        assert_eq!(probe_role(&local(server.port), None, T).unwrap(), Role::Master);
    }

    #[tokio::test]
    async fn slaveof_then_rewrite_then_no_one() {
        let master = TestRedis::start("");
        let replica = TestRedis::start("");
        let to_master = Pika::connect(&local(master.port), None, T).await.unwrap();
        let to_replica = Pika::connect(&local(replica.port), None, T).await.unwrap();

        to_replica.slaveof(&local(master.port)).await.unwrap();
        let r = wait_for(&to_replica, "link up", |r| r.link_up).await;
        assert!(r.follows(&local(master.port)));
        assert_eq!(probe_role(&local(replica.port), None, T).unwrap(), Role::Slave);
        let m = wait_for(&to_master, "replica listed", |r| r.connected_slaves == 1).await;
        assert_eq!(m.replicas.len(), 1);
        assert_eq!(m.replicas[0].port, replica.port);

        to_replica.config_rewrite().await.unwrap();
        let config = std::fs::read_to_string(replica.config_path()).unwrap();
        assert!(config.contains(&format!("replicaof 127.0.0.1 {}", master.port)), "{config}");

        to_replica.slaveof_no_one().await.unwrap();
        let r = to_replica.info_replication().await.unwrap();
        assert_eq!(r.role, Role::Master);
        assert!(!r.follows(&local(master.port)));
        assert_eq!(probe_role(&local(replica.port), None, T).unwrap(), Role::Master);
        // On a master it is a no-op.
        to_replica.slaveof_no_one().await.unwrap();
    }

    #[tokio::test]
    async fn a_password_is_sent_and_never_shown() {
        let password = "s3cret-Pa55word";
        let server = TestRedis::start(&format!("requirepass {password}"));
        let pika = Pika::connect(&local(server.port), Some(password), T).await.unwrap();
        pika.ping().await.unwrap();
        assert!(!format!("{pika:?}").contains(password));
        assert_eq!(probe_role(&local(server.port), Some(password), T).unwrap(), Role::Master);

        let wrong = "not-the-s3cret";
        let err = Pika::connect(&local(server.port), Some(wrong), T).await.unwrap_err();
        assert!(matches!(err, Error::Command { command: "AUTH", .. }), "{err:?}");
        let err = probe_role(&local(server.port), Some(wrong), T).unwrap_err();
        assert!(matches!(err, Error::Command { command: "AUTH", .. }), "{err:?}");
        for text in [err.to_string(), format!("{err:?}"), crate::error::Error::from(err).one_line()] {
            assert!(!text.contains(wrong) && !text.contains(password), "{text}");
        }

        // Without the password the server refuses the command, and says so.
        let anonymous = Pika::connect(&local(server.port), None, T).await.unwrap();
        let err = anonymous.info_replication().await.unwrap_err();
        assert!(err.to_string().contains("NOAUTH"), "{err}");
        assert!(probe_role(&local(server.port), None, T).is_err());
    }

    #[tokio::test]
    async fn nothing_listening_is_a_connect_error() {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let err = Pika::connect(&local(port), None, T).await.unwrap_err();
        assert!(matches!(err, Error::Connect { .. }), "{err:?}");
        assert!(err.to_string().contains(&format!("127.0.0.1:{port}")), "{err}");
        let err = probe_role(&local(port), None, T).unwrap_err();
        assert!(matches!(err, Error::Connect { .. }), "{err:?}");
    }

    #[test]
    fn a_silent_server_times_the_probe_out() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        // The kernel completes the handshake; nobody ever answers.
        let started = Instant::now();
        let err = probe_role(&local(port), None, Duration::from_millis(300)).unwrap_err();
        assert!(matches!(err, Error::Timeout { command: "INFO replication", .. }), "{err:?}");
        assert!(started.elapsed() < Duration::from_secs(3));
        drop(listener);
    }

    #[tokio::test]
    async fn a_silent_server_times_a_command_out() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let err = Pika::connect(&local(port), None, Duration::from_millis(300)).await.unwrap_err();
        assert!(matches!(err, Error::Timeout { command: "PING", .. }), "{err:?}");
        drop(listener);
    }

    /// A server that resets its first `resets` connections once their first command arrives (closed with it unread,
    /// so the kernel answers with RST), then answers `+PONG` to every read; returns its port and the count of
    /// connections it accepted.
    fn resetting_server(resets: usize) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use std::io::{Read, Write};
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = std::sync::Arc::new(AtomicUsize::new(0));
        let counter = std::sync::Arc::clone(&accepted);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let n = counter.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || {
                    let mut buf = [0u8; 512];
                    if n < resets {
                        // Wait for the command, leave it unread, close: RST.
                        let _ = stream.peek(&mut buf);
                        return;
                    }
                    while matches!(stream.read(&mut buf), Ok(k) if k > 0) {
                        if stream.write_all(b"+PONG\r\n").is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (port, accepted)
    }

    #[tokio::test]
    async fn a_connection_reset_before_its_first_answer_is_dialled_again() {
        use std::sync::atomic::Ordering;
        let (port, accepted) = resetting_server(DIAL_ATTEMPTS as usize - 1);
        let pika = Pika::connect(&local(port), None, T).await.unwrap();
        pika.ping().await.unwrap();
        assert_eq!(accepted.load(Ordering::SeqCst), DIAL_ATTEMPTS as usize);
    }

    #[tokio::test]
    async fn a_server_that_resets_every_connection_is_an_error_after_the_last_attempt() {
        use std::sync::atomic::Ordering;
        let (port, accepted) = resetting_server(usize::MAX);
        let err = Pika::connect(&local(port), None, T).await.unwrap_err();
        assert!(matches!(err, Error::Command { command: "PING", .. }), "{err:?}");
        assert!(err.to_string().contains(&format!("127.0.0.1:{port}")), "{err}");
        assert_eq!(accepted.load(Ordering::SeqCst), DIAL_ATTEMPTS as usize);
    }
}
