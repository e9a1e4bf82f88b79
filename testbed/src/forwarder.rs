//! A TCP forwarder that can partition one server from everyone: put it between the address a server is registered
//! under (through `PIKA_ADDRESS_OVERRIDES` and the doubles' overrides) and the real redis-server, and every client
//! — the dashboard, the proxies, replicas, `pika-action` — reaches the server through it.
//!
//! [`Forwarder::partition`] makes the server unreachable the way a lost node or a network partition does, not the
//! way a dead process does: connections are accepted and then nothing comes back (no refusal, no reset), and bytes
//! on open connections stop moving in both directions. [`Forwarder::heal`] lets them move again; what was sent in
//! between is delivered then, as TCP would after retransmission. [`Forwarder::cut`] closes every open connection.
//!
//! What it does not model: packet loss short of a full partition, one-way partitions, latency.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// How long a pump waits for bytes before it looks at the partition flag again.
const POLL: Duration = Duration::from_millis(5);

#[derive(Default)]
struct Shared {
    partitioned: AtomicBool,
    stopped: AtomicBool,
    accepted: AtomicUsize,
    /// Accepted connections whose thread has not ended yet.
    live: AtomicUsize,
    open: Mutex<Vec<TcpStream>>,
}

/// A forwarder listening on a free loopback port.
pub struct Forwarder {
    addr: SocketAddr,
    target: SocketAddr,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Forwarder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forwarder")
            .field("addr", &self.addr)
            .field("target", &self.target)
            .field("partitioned", &self.is_partitioned())
            .finish_non_exhaustive()
    }
}

impl Forwarder {
    /// Forwards a new loopback port to `target` (`host:port`).
    ///
    /// # Panics
    /// When `target` is not a socket address or no port can be bound.
    #[must_use]
    pub fn start(target: &str) -> Self {
        let target: SocketAddr = target.parse().expect("a socket address");
        let listener = crate::process::bind_loopback().expect("bind a forwarder");
        let addr = listener.local_addr().expect("local address");
        let shared = Arc::new(Shared::default());
        let accepting = Arc::clone(&shared);
        thread::Builder::new()
            .name(format!("forward-{}", addr.port()))
            .spawn(move || accept_loop(&listener, target, &accepting))
            .expect("start the forwarder");
        Self { addr, target, shared }
    }

    /// `127.0.0.1:<port>`: where clients connect.
    #[must_use]
    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// The server it forwards to.
    #[must_use]
    pub fn target(&self) -> String {
        self.target.to_string()
    }

    /// Partitions the server: new connections are accepted and never answered, open ones stop moving bytes.
    pub fn partition(&self) {
        self.shared.partitioned.store(true, Ordering::SeqCst);
    }

    /// Ends the partition: held bytes move again, held connections are connected through.
    pub fn heal(&self) {
        self.shared.partitioned.store(false, Ordering::SeqCst);
    }

    /// Whether the server is partitioned now.
    #[must_use]
    pub fn is_partitioned(&self) -> bool {
        self.shared.partitioned.load(Ordering::SeqCst)
    }

    /// Closes every open connection (both sides see it closed).
    pub fn cut(&self) {
        let open = std::mem::take(&mut *self.shared.open.lock().expect("open connections"));
        for stream in open {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    /// Connections accepted so far.
    #[must_use]
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Accepted connections still being served (held by a partition, or pumping).
    #[must_use]
    pub fn live(&self) -> usize {
        self.shared.live.load(Ordering::SeqCst)
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        self.heal();
        self.cut();
        // Wake the accept loop so that it sees the stop.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}

fn accept_loop(listener: &TcpListener, target: SocketAddr, shared: &Arc<Shared>) {
    for incoming in listener.incoming() {
        if shared.stopped.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = incoming else { continue };
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        let shared = Arc::clone(shared);
        shared.live.fetch_add(1, Ordering::SeqCst);
        let spawned = thread::Builder::new().name("forward-conn".into()).spawn({
            let shared = Arc::clone(&shared);
            move || {
                connect_through(client, target, &shared);
                shared.live.fetch_sub(1, Ordering::SeqCst);
            }
        });
        if spawned.is_err() {
            shared.live.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Waits out a partition (the client sees a connection that never answers), then connects to the target and pumps.
/// A client that gives up while held (every probe and reconnect does, after its timeout) ends its thread at once:
/// otherwise a long partition piles up one thread per attempt.
fn connect_through(mut client: TcpStream, target: SocketAddr, shared: &Arc<Shared>) {
    let _ = client.set_read_timeout(Some(POLL));
    // What the client sent while held, delivered after the heal.
    let mut held = Vec::new();
    let mut buf = [0u8; 4096];
    while shared.partitioned.load(Ordering::SeqCst) {
        if shared.stopped.load(Ordering::SeqCst) {
            return;
        }
        match client.read(&mut buf) {
            // The client hung up (or reset): nobody is waiting any more.
            Ok(0) => return,
            Ok(n) => held.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
            Err(_) => return,
        }
    }
    let Ok(mut server) = TcpStream::connect_timeout(&target, Duration::from_secs(2)) else {
        // The server is down: the client sees the connection closed, as a refused connect would end.
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    if !held.is_empty() && server.write_all(&held).is_err() {
        let _ = client.shutdown(Shutdown::Both);
        return;
    }
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    {
        let mut open = shared.open.lock().expect("open connections");
        if let (Ok(c), Ok(s)) = (client.try_clone(), server.try_clone()) {
            open.push(c);
            open.push(s);
        }
    }
    let (Ok(client_in), Ok(server_in)) = (client.try_clone(), server.try_clone()) else { return };
    let up = Arc::clone(shared);
    let upstream = thread::Builder::new().name("forward-up".into()).spawn(move || pump(client_in, server, &up));
    pump(server_in, client, shared);
    if let Ok(handle) = upstream {
        let _ = handle.join();
    }
}

/// Copies `from` to `to` until either closes; holds the bytes while partitioned.
fn pump(mut from: TcpStream, mut to: TcpStream, shared: &Shared) {
    let _ = from.set_read_timeout(Some(POLL));
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if shared.stopped.load(Ordering::SeqCst) {
            break;
        }
        if shared.partitioned.load(Ordering::SeqCst) {
            thread::sleep(POLL);
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                // A partition that began while this read was waiting holds these bytes too: the sender wrote them
                // after the partition, so they must not get through before the heal.
                while shared.partitioned.load(Ordering::SeqCst) && !shared.stopped.load(Ordering::SeqCst) {
                    thread::sleep(POLL);
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
            Err(_) => break,
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RedisServer;

    fn ping(addr: &str, timeout: Duration) -> std::io::Result<String> {
        let mut s = TcpStream::connect_timeout(&addr.parse().unwrap(), timeout)?;
        s.set_read_timeout(Some(timeout))?;
        s.write_all(b"*1\r\n$4\r\nPING\r\n")?;
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
    }

    #[test]
    fn a_partition_makes_the_server_hang_for_new_and_open_connections_until_healed() {
        let redis = RedisServer::start();
        let fwd = Forwarder::start(&redis.addr());
        assert_eq!(ping(&fwd.addr(), Duration::from_secs(2)).unwrap(), "+PONG\r\n");

        // An open connection, then the partition.
        let mut open = TcpStream::connect(fwd.addr()).unwrap();
        open.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        fwd.partition();
        open.write_all(b"*1\r\n$4\r\nPING\r\n").unwrap();
        let mut buf = [0u8; 16];
        let err = open.read(&mut buf).expect_err("no answer through a partition");
        assert!(matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut), "{err:?}");
        // A new connection is accepted (no refusal) and never answered.
        let err = ping(&fwd.addr(), Duration::from_millis(300)).expect_err("hangs");
        assert!(matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut), "{err:?}");

        fwd.heal();
        open.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let n = open.read(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"+PONG\r\n", "the held request is delivered after the heal");
        assert_eq!(ping(&fwd.addr(), Duration::from_secs(2)).unwrap(), "+PONG\r\n");
    }

    #[test]
    fn a_client_that_gives_up_during_a_partition_leaves_no_thread_behind() {
        let redis = RedisServer::start();
        let fwd = Forwarder::start(&redis.addr());
        fwd.partition();
        for _ in 0..30 {
            let err = ping(&fwd.addr(), Duration::from_millis(20)).expect_err("hangs");
            assert!(matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut), "{err:?}");
        }
        // One held client still waiting keeps its thread; the 30 that hung up do not.
        let mut waiting = TcpStream::connect(fwd.addr()).unwrap();
        waiting.write_all(b"*1\r\n$4\r\nPING\r\n").unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        // Until all 31 connections are accepted (on a loaded machine the accept loop lags the clients' connects,
        // which the backlog completes) and only the waiting client's thread is left.
        while (fwd.accepted() < 31 || fwd.live() != 1) && std::time::Instant::now() < deadline {
            thread::sleep(Duration::from_millis(10));
        }
        assert!(fwd.accepted() >= 31, "accepted {}", fwd.accepted());
        assert_eq!(fwd.live(), 1, "threads of clients that hung up are still there");
        fwd.heal();
        waiting.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut buf = [0u8; 16];
        let n = waiting.read(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"+PONG\r\n", "the held client is served after the heal");
    }

    #[test]
    fn a_cut_closes_open_connections_and_a_dead_server_closes_new_ones() {
        let mut redis = RedisServer::start();
        let fwd = Forwarder::start(&redis.addr());
        let mut open = TcpStream::connect(fwd.addr()).unwrap();
        open.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        open.write_all(b"*1\r\n$4\r\nPING\r\n").unwrap();
        let mut buf = [0u8; 16];
        assert!(open.read(&mut buf).unwrap() > 0);
        fwd.cut();
        assert_eq!(open.read(&mut buf).unwrap_or(0), 0, "closed");
        redis.kill();
        let reply = ping(&fwd.addr(), Duration::from_secs(3));
        assert!(reply.as_ref().map_or(true, String::is_empty), "{reply:?}");
    }
}
