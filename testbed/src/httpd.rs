//! The serving machinery both HTTP doubles share: a private tokio runtime on its own thread, and a listener that can
//! be stopped and restarted on the same port while the double's state lives on.
//!
//! The accept loop is hyper's rather than `axum::serve` because fault injection must be able to drop a connection
//! without answering, which only a service error at the hyper level does; the routing inside stays axum's.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::process::PortLease;

/// Returned by a handler to close the connection without an answer.
#[derive(Debug)]
pub(crate) struct Dropped;

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection dropped by fault injection")
    }
}

impl std::error::Error for Dropped {}

/// The boxed future a handler returns.
pub(crate) type HandlerFuture = Pin<Box<dyn Future<Output = Result<Response<Body>, Dropped>> + Send>>;
/// A request handler.
pub(crate) type Handler = Arc<dyn Fn(Request<Body>) -> HandlerFuture + Send + Sync>;

/// A current-thread tokio runtime on a dedicated thread, so sync and async tests can both drive the doubles; dropped
/// runtimes cancel every task they run.
pub(crate) struct Runtime {
    handle: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Runtime {
    pub(crate) fn start(name: &str) -> std::io::Result<Self> {
        let (handle_tx, handle_rx) = mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new().name(name.to_owned()).spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = handle_tx.send(Err(e));
                    return;
                }
            };
            let _ = handle_tx.send(Ok(rt.handle().clone()));
            rt.block_on(async {
                let _ = stop_rx.await;
            });
        })?;
        let handle = handle_rx.recv().map_err(|_| std::io::Error::other("runtime thread exited before starting"))??;
        Ok(Self { handle, stop: Some(stop_tx), thread: Some(thread) })
    }

    pub(crate) fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Serving {
    stop: watch::Sender<bool>,
    done: mpsc::Receiver<()>,
}

/// An HTTP listener on a fixed address that can be paused (socket closed, connections refused) and resumed.
pub(crate) struct Listener {
    addr: SocketAddr,
    handler: Handler,
    rt: tokio::runtime::Handle,
    serving: Mutex<Option<Serving>>,
    /// While paused the port is closed: no redis-server or etcd of this process may be given it.
    _lease: Option<PortLease>,
}

impl Listener {
    /// Serves `listener` (already bound) with `handler` on `rt`.
    pub(crate) fn start(
        rt: &tokio::runtime::Handle,
        listener: std::net::TcpListener,
        handler: Handler,
    ) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        let this =
            Self { addr, handler, rt: rt.clone(), serving: Mutex::new(None), _lease: PortLease::hold(addr.port()) };
        this.serve(listener)?;
        Ok(this)
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn serve(&self, listener: std::net::TcpListener) -> std::io::Result<()> {
        listener.set_nonblocking(true)?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let (done_tx, done_rx) = mpsc::channel();
        let handler = self.handler.clone();
        self.rt.spawn(async move {
            if let Ok(listener) = tokio::net::TcpListener::from_std(listener) {
                accept_loop(listener, handler, stop_rx).await;
            }
            let _ = done_tx.send(());
        });
        let mut serving = self.serving.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *serving = Some(Serving { stop: stop_tx, done: done_rx });
        Ok(())
    }

    /// Whether the listener is open.
    pub(crate) fn is_serving(&self) -> bool {
        self.serving.lock().unwrap_or_else(std::sync::PoisonError::into_inner).is_some()
    }

    /// Closes the socket and the open connections (in-flight requests finish first, bounded), and waits for it when
    /// `wait` is set. Must not wait when called from the runtime's own thread (a handler).
    pub(crate) fn pause(&self, wait: bool) {
        let serving = self.serving.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some(s) = serving {
            let _ = s.stop.send(true);
            if wait {
                let _ = s.done.recv_timeout(Duration::from_secs(5));
            }
        }
    }

    /// Opens the same address again. Retries for a few seconds, since the kernel may still hold the port briefly.
    pub(crate) fn resume(&self) -> std::io::Result<()> {
        if self.is_serving() {
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

impl Drop for Listener {
    fn drop(&mut self) {
        self.pause(false);
    }
}

async fn accept_loop(listener: tokio::net::TcpListener, handler: Handler, mut stop: watch::Receiver<bool>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((stream, _)) = accepted {
                    conns.spawn(serve_conn(stream, handler.clone(), stop.clone()));
                }
            }
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() {
                    break;
                }
            }
        }
    }
    drop(listener);
    let _ = tokio::time::timeout(Duration::from_secs(2), async { while conns.join_next().await.is_some() {} }).await;
}

async fn serve_conn(stream: tokio::net::TcpStream, handler: Handler, mut stop: watch::Receiver<bool>) {
    let service = hyper::service::service_fn(move |req: Request<Incoming>| (handler)(req.map(Body::new)));
    let conn = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    if *stop.borrow() {
        conn.as_mut().graceful_shutdown();
    }
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = stop.changed() => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(Duration::from_secs(2), conn).await;
        }
    }
}

/// One blocking HTTP/1.1 request with `Connection: close`; `(status, body)`. Used by the doubles' test helpers so
/// sync tests need no runtime.
pub(crate) fn blocking_request(addr: &str, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    let content_type = if body.is_empty() { "" } else { "Content-Type: application/json\r\n" };
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{content_type}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("bad response {head:?}")))?;
    let chunked = head.lines().any(|l| l.to_ascii_lowercase().starts_with("transfer-encoding: chunked"));
    Ok((status, if chunked { dechunk(body) } else { body.to_owned() }))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}
