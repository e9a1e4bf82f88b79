//! The dashboard double's calls to proxies' admin APIs (model, xping, fillslots, start, sentinels, shutdown, stats).
//!
//! Errors are plain strings: Codis folds them into its own messages (`proxy-[t] resync slots failed`) or into
//! `stats.proxy.stats[t].error.Cause`.

use serde::de::DeserializeOwned;

use super::model::{Proxy, ProxyStats, Slot};

/// A proxy's admin API at `addr` (as registered), dialled at `target`, authenticated with `xauth`.
pub(crate) struct ProxyClient {
    http: reqwest::Client,
    addr: String,
    target: String,
    xauth: String,
}

/// Go's `net/http` client error text: `Get "http://...": dial tcp ...: connect: connection refused`, the URL as
/// requested (the registered address) and the address dialled (what it resolved to).
fn transport_error(method: &str, url: &str, target: &str, e: &reqwest::Error) -> String {
    let inner = if e.is_timeout() {
        format!("dial tcp {target}: i/o timeout")
    } else if e.is_connect() {
        format!("dial tcp {target}: connect: connection refused")
    } else {
        let mut text = String::new();
        let mut cur: Option<&dyn std::error::Error> = Some(e);
        while let Some(err) = cur {
            text = err.to_string();
            cur = err.source();
        }
        text
    };
    format!("{method} \"{url}\": {inner}")
}

async fn decode<T: DeserializeOwned>(
    method: &str,
    url: &str,
    target: &str,
    resp: Result<reqwest::Response, reqwest::Error>,
) -> Result<T, String> {
    let resp = resp.map_err(|e| transport_error(method, url, target, &e))?;
    let status = resp.status().as_u16();
    let body = resp.bytes().await.map_err(|e| transport_error(method, url, target, &e))?;
    if status == 200 {
        return serde_json::from_slice(&body).map_err(|e| format!("json decode failed: {e}"));
    }
    let cause = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("Cause").and_then(|c| c.as_str()).map(str::to_owned));
    Err(cause.unwrap_or_else(|| format!("http status {status}: {}", String::from_utf8_lossy(&body).trim())))
}

impl ProxyClient {
    pub(crate) fn new(http: &reqwest::Client, addr: &str, target: &str, xauth: &str) -> Self {
        Self { http: http.clone(), addr: addr.to_owned(), target: target.to_owned(), xauth: xauth.to_owned() }
    }

    /// The URL of `path` as dialled and as an error names it.
    fn urls(&self, path: &str) -> (String, String) {
        (format!("http://{}{path}", self.target), format!("http://{}{path}", self.addr))
    }

    /// `GET /api/proxy/model` (no auth) of the proxy registered at `addr`, dialled at `target`.
    pub(crate) async fn model(http: &reqwest::Client, addr: &str, target: &str) -> Result<Proxy, String> {
        let (url, shown) = (format!("http://{target}/api/proxy/model"), format!("http://{addr}/api/proxy/model"));
        decode("Get", &shown, target, http.get(&url).send().await).await
    }

    async fn put_ok(&self, path: &str, body: Option<String>) -> Result<(), String> {
        let (url, shown) = self.urls(&format!("{path}/{}", self.xauth));
        let mut req = self.http.put(&url);
        if let Some(b) = body {
            req = req.header(reqwest::header::CONTENT_TYPE, "application/json").body(b);
        }
        let reply: String = decode("Put", &shown, &self.target, req.send().await).await?;
        if reply == "OK" {
            Ok(())
        } else {
            Err(format!("unexpected reply {reply:?}"))
        }
    }

    /// `GET /api/proxy/xping/{pxauth}`.
    pub(crate) async fn xping(&self) -> Result<(), String> {
        let (url, shown) = self.urls(&format!("/api/proxy/xping/{}", self.xauth));
        let reply: String = decode("Get", &shown, &self.target, self.http.get(&url).send().await).await?;
        if reply == "OK" {
            Ok(())
        } else {
            Err(format!("unexpected reply {reply:?}"))
        }
    }

    /// `PUT /api/proxy/fillslots/{pxauth}`.
    pub(crate) async fn fill_slots(&self, slots: &[Slot]) -> Result<(), String> {
        let body = serde_json::to_string(slots).map_err(|e| e.to_string())?;
        self.put_ok("/api/proxy/fillslots", Some(body)).await
    }

    /// `PUT /api/proxy/start/{pxauth}`.
    pub(crate) async fn start(&self) -> Result<(), String> {
        self.put_ok("/api/proxy/start", None).await
    }

    /// `PUT /api/proxy/sentinels/{pxauth}` (upstream only; the double has no sentinels).
    pub(crate) async fn set_sentinels(&self) -> Result<(), String> {
        self.put_ok("/api/proxy/sentinels", Some("{\"out_of_sync\":false}".into())).await
    }

    /// `PUT /api/proxy/shutdown/{pxauth}`.
    pub(crate) async fn shutdown(&self) -> Result<(), String> {
        self.put_ok("/api/proxy/shutdown", None).await
    }

    /// `GET /api/proxy/stats/{pxauth}`.
    pub(crate) async fn stats(&self) -> Result<ProxyStats, String> {
        let (url, shown) = self.urls(&format!("/api/proxy/stats/{}", self.xauth));
        decode("Get", &shown, &self.target, self.http.get(&url).send().await).await
    }
}
