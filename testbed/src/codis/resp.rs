//! A minimal async RESP client for the double's calls to backends (dial check, INFO, SLAVEOF, the migration
//! commands) and the RESP framing the proxy double's data port shares (reading commands, writing replies).
//!
//! Hand-rolled rather than the `redis` crate because the double must report failures with the exact text Go's
//! `net` package and redigo produce (`dial tcp 127.0.0.1:6999: connect: connection refused`, or a server error
//! without its `-` prefix), and that needs the raw `io::Error` of each step.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufStream};
use tokio::net::TcpStream;

/// A RESP reply. Error replies are returned as `Err` by [`Conn::call`] instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    Status(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
    Error(String),
}

impl Reply {
    /// Appends the RESP encoding of the reply (RESP2, as codis-proxy speaks).
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Self::Status(s) => {
                out.push(b'+');
                out.extend_from_slice(s.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            Self::Error(e) => {
                out.push(b'-');
                out.extend_from_slice(e.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            Self::Int(i) => out.extend_from_slice(format!(":{i}\r\n").as_bytes()),
            Self::Bulk(None) => out.extend_from_slice(b"$-1\r\n"),
            Self::Bulk(Some(b)) => {
                out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
            }
            Self::Array(None) => out.extend_from_slice(b"*-1\r\n"),
            Self::Array(Some(items)) => {
                out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
                for item in items {
                    item.encode(out);
                }
            }
        }
    }

    /// The integer of an integer reply.
    pub(crate) fn as_int(&self) -> Option<i64> {
        match self {
            Self::Int(i) => Some(*i),
            _ => None,
        }
    }

    pub(crate) fn text(&self) -> Option<String> {
        match self {
            Self::Status(s) => Some(s.clone()),
            Self::Bulk(Some(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            Self::Int(i) => Some(i.to_string()),
            _ => None,
        }
    }
}

/// One connection to a backend.
pub(crate) struct Conn {
    stream: BufStream<TcpStream>,
    local: String,
    peer: String,
    timeout: Duration,
}

/// Go's text for an OS error: the strerror text in lower case, without Rust's `(os error N)` suffix.
fn os_text(e: &std::io::Error) -> String {
    match e.kind() {
        ErrorKind::ConnectionRefused => "connection refused".into(),
        ErrorKind::ConnectionReset => "connection reset by peer".into(),
        ErrorKind::TimedOut => "i/o timeout".into(),
        _ => {
            let text = e.to_string();
            let text = text.split(" (os error").next().unwrap_or(&text).to_owned();
            let mut chars = text.chars();
            chars.next().map(|c| c.to_lowercase().collect::<String>() + chars.as_str()).unwrap_or_default()
        }
    }
}

impl Conn {
    /// Dials `addr` (`host:port`) within `timeout`, then sends `AUTH` when a password is given, like Codis's
    /// `redis.NewClient`. Errors read like Go's.
    pub(crate) async fn dial(addr: &str, password: Option<&str>, timeout: Duration) -> Result<Self, String> {
        let Some((host, port)) = addr.rsplit_once(':') else {
            return Err(format!("dial tcp: address {addr}: missing port in address"));
        };
        if port.parse::<u16>().is_err() {
            return Err(format!("dial tcp: address {addr}: invalid port"));
        }
        let resolved: Vec<SocketAddr> = match tokio::time::timeout(timeout, tokio::net::lookup_host(addr)).await {
            Ok(Ok(addrs)) => addrs.collect(),
            Ok(Err(_)) => return Err(format!("dial tcp: lookup {}: no such host", host.trim_matches(['[', ']']))),
            Err(_) => return Err(format!("dial tcp: lookup {host}: i/o timeout")),
        };
        let Some(target) = resolved.first().copied() else {
            return Err(format!("dial tcp: lookup {host}: no such host"));
        };
        let stream = match tokio::time::timeout(timeout, TcpStream::connect(target)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(format!("dial tcp {target}: connect: {}", os_text(&e))),
            Err(_) => return Err(format!("dial tcp {target}: i/o timeout")),
        };
        let local = stream.local_addr().map(|a| a.to_string()).unwrap_or_default();
        let mut conn = Self { stream: BufStream::new(stream), local, peer: target.to_string(), timeout };
        if let Some(p) = password.filter(|p| !p.is_empty()) {
            conn.call(&["AUTH", p]).await?;
        }
        Ok(conn)
    }

    fn io_error(&self, op: &str, e: &std::io::Error) -> String {
        if e.kind() == ErrorKind::UnexpectedEof {
            return "EOF".into();
        }
        format!("{op} tcp {}->{}: {}", self.local, self.peer, os_text(e))
    }

    fn timeout_error(&self, op: &str) -> String {
        format!("{op} tcp {}->{}: i/o timeout", self.local, self.peer)
    }

    async fn send(&mut self, args: &[&str]) -> Result<(), String> {
        let bytes: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        self.send_bytes(&bytes).await
    }

    async fn send_bytes(&mut self, args: &[&[u8]]) -> Result<(), String> {
        let mut buf = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            buf.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            buf.extend_from_slice(a);
            buf.extend_from_slice(b"\r\n");
        }
        let write = async {
            self.stream.write_all(&buf).await?;
            self.stream.flush().await
        };
        match tokio::time::timeout(self.timeout, write).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(self.io_error("write", &e)),
            Err(_) => Err(self.timeout_error("write")),
        }
    }

    async fn receive(&mut self) -> Result<Reply, String> {
        match tokio::time::timeout(self.timeout, read_reply(&mut self.stream)).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => Err(self.io_error("read", &e)),
            Err(_) => Err(self.timeout_error("read")),
        }
    }

    /// Sends one command; a RESP error reply becomes `Err(message)` (redigo's `redis.Error` text).
    pub(crate) async fn call(&mut self, args: &[&str]) -> Result<Reply, String> {
        self.send(args).await?;
        match self.receive().await? {
            Reply::Error(e) => Err(e),
            r => Ok(r),
        }
    }

    /// Whether the server closed this (idle, pooled) connection, as one does to clients it kills: the next read
    /// would give `EOF`. Looks without consuming anything.
    pub(crate) fn peer_closed(&self) -> bool {
        // A non-blocking peek straight on the socket: tokio's own peek waits for a readiness event first.
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 1];
        match socket2::SockRef::from(self.stream.get_ref()).peek(&mut buf) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => e.kind() != ErrorKind::WouldBlock,
        }
    }

    /// The next message a subscribed connection receives; waits as long as it takes.
    pub(crate) async fn next_message(&mut self) -> Result<Reply, String> {
        read_reply(&mut self.stream).await.map_err(|e| self.io_error("read", &e))
    }

    /// Sends one command of binary-safe arguments; the reply as it came, RESP errors included. `Err` only for
    /// transport failures (the connection should then be dropped).
    pub(crate) async fn request(&mut self, args: &[&[u8]]) -> Result<Reply, String> {
        self.send_bytes(args).await?;
        self.receive().await
    }

    /// `MULTI`, the commands, `EXEC`; the first error (queueing, EXEC abort, or inside the transaction) wins.
    pub(crate) async fn transaction(&mut self, commands: &[&[&str]]) -> Result<(), String> {
        self.call(&["MULTI"]).await?;
        let mut queue_error = None;
        for c in commands {
            if let Err(e) = self.call(c).await {
                queue_error.get_or_insert(e);
            }
        }
        let exec = self.call(&["EXEC"]).await;
        if let Some(e) = queue_error {
            return Err(e);
        }
        if let Reply::Array(Some(items)) = exec? {
            for item in items {
                if let Reply::Error(e) = item {
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// `INFO [section]` as a flat map, plus `master_addr` (from `master_host`/`master_port`) and `maxmemory` (from
    /// `CONFIG GET maxmemory`), as Codis's `Client.Info` builds it.
    pub(crate) async fn info(&mut self, section: Option<&str>) -> Result<BTreeMap<String, String>, String> {
        let reply = match section {
            Some(s) => self.call(&["INFO", s]).await?,
            None => self.call(&["INFO"]).await?,
        };
        let text = reply.text().unwrap_or_default();
        let mut info = BTreeMap::new();
        for line in text.lines() {
            if let Some((k, v)) = line.split_once(':') {
                let key = k.trim();
                if !key.is_empty() && !key.starts_with('#') {
                    info.insert(key.to_owned(), v.trim().to_owned());
                }
            }
        }
        let host = info.get("master_host").cloned().unwrap_or_default();
        let port = info.get("master_port").cloned().unwrap_or_default();
        if !host.is_empty() || !port.is_empty() {
            info.insert("master_addr".into(), join_host_port(&host, &port));
        }
        let reply = self.call(&["CONFIG", "GET", "maxmemory"]).await?;
        let value = match &reply {
            Reply::Array(Some(items)) if items.len() == 2 => items[1].text(),
            _ => None,
        };
        match value.and_then(|v| v.parse::<i64>().ok()) {
            Some(v) => {
                info.insert("maxmemory".into(), v.to_string());
                Ok(info)
            }
            None => Err(format!("invalid response = {reply:?}")),
        }
    }
}

/// Go's `net.JoinHostPort`: brackets around IPv6 hosts.
pub(crate) fn join_host_port(host: &str, port: &str) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Reads one client command from a RESP stream: an array of bulk strings, or an inline command (words separated by
/// spaces, as `redis-cli` and telnet send). `Ok(None)` at a clean end of stream.
pub(crate) async fn read_command<R>(stream: &mut R) -> std::io::Result<Option<Vec<Vec<u8>>>>
where
    R: tokio::io::AsyncBufRead + Unpin,
{
    loop {
        let mut line = Vec::new();
        if stream.read_until(b'\n', &mut line).await? == 0 {
            return Ok(None);
        }
        while line.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
            line.pop();
        }
        let bad = || std::io::Error::new(ErrorKind::InvalidData, "Protocol error: invalid multibulk length");
        if line.first() != Some(&b'*') {
            let words: Vec<Vec<u8>> =
                line.split(|b| *b == b' ').filter(|w| !w.is_empty()).map(<[u8]>::to_vec).collect();
            if words.is_empty() {
                continue;
            }
            return Ok(Some(words));
        }
        let n: usize = std::str::from_utf8(&line[1..]).ok().and_then(|t| t.parse().ok()).ok_or_else(bad)?;
        let mut args = Vec::with_capacity(n);
        for _ in 0..n {
            let mut head = Vec::new();
            if stream.read_until(b'\n', &mut head).await? == 0 {
                return Err(ErrorKind::UnexpectedEof.into());
            }
            let text = std::str::from_utf8(&head).map_err(|_| bad())?.trim_end();
            let len: usize = text.strip_prefix('$').and_then(|t| t.parse().ok()).ok_or_else(bad)?;
            let mut buf = vec![0; len + 2];
            stream.read_exact(&mut buf).await?;
            buf.truncate(len);
            args.push(buf);
        }
        if !args.is_empty() {
            return Ok(Some(args));
        }
    }
}

/// Reads one reply; nested arrays are read iteratively through boxing.
fn read_reply<'a, R>(
    stream: &'a mut R,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<Reply>> + Send + 'a>>
where
    R: tokio::io::AsyncBufRead + Unpin + Send,
{
    Box::pin(async move {
        let mut line = String::new();
        if stream.read_line(&mut line).await? == 0 {
            return Err(ErrorKind::UnexpectedEof.into());
        }
        let line = line.trim_end_matches(['\r', '\n']);
        let bad = || std::io::Error::new(ErrorKind::InvalidData, format!("bad RESP line {line:?}"));
        let (kind, rest) = line.split_at(line.len().min(1));
        match kind {
            "+" => Ok(Reply::Status(rest.to_owned())),
            "-" => Ok(Reply::Error(rest.to_owned())),
            ":" => rest.parse().map(Reply::Int).map_err(|_| bad()),
            "$" => {
                let len: i64 = rest.parse().map_err(|_| bad())?;
                let Ok(len) = usize::try_from(len) else {
                    return Ok(Reply::Bulk(None));
                };
                let mut buf = vec![0; len + 2];
                stream.read_exact(&mut buf).await?;
                buf.truncate(len);
                Ok(Reply::Bulk(Some(buf)))
            }
            "*" => {
                let n: i64 = rest.parse().map_err(|_| bad())?;
                let Ok(n) = usize::try_from(n) else {
                    return Ok(Reply::Array(None));
                };
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(read_reply(stream).await?);
                }
                Ok(Reply::Array(Some(items)))
            }
            _ => Err(bad()),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{free_port, RedisServer};

    #[tokio::test]
    async fn dial_errors_read_like_go() {
        let port = free_port();
        let err = Conn::dial(&format!("127.0.0.1:{port}"), None, Duration::from_secs(1)).await.err().unwrap();
        assert_eq!(err, format!("dial tcp 127.0.0.1:{port}: connect: connection refused"));
        let err = Conn::dial("no-such-host.invalid:9221", None, Duration::from_secs(1)).await.err().unwrap();
        assert_eq!(err, "dial tcp: lookup no-such-host.invalid: no such host");
        let err = Conn::dial("10.0.0.1", None, Duration::from_secs(1)).await.err().unwrap();
        assert_eq!(err, "dial tcp: address 10.0.0.1: missing port in address");
    }

    #[tokio::test]
    async fn info_adds_master_addr_and_maxmemory_and_errors_lose_their_dash() {
        let master = RedisServer::start();
        let replica = RedisServer::start();
        let _ = replica.command(&["SLAVEOF", "127.0.0.1", &master.port().to_string()]);
        let mut c = Conn::dial(&replica.addr(), None, Duration::from_secs(1)).await.unwrap();
        let info = c.info(None).await.unwrap();
        assert_eq!(info["role"], "slave");
        assert_eq!(info["master_addr"], master.addr());
        assert_eq!(info["maxmemory"], "0");
        let err = c.call(&["SLAVEOF", "127.0.0.1", "1", "-f"]).await.err().unwrap();
        assert!(err.starts_with("ERR wrong number of arguments"), "{err}");
    }
}
