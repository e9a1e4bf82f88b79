//! What Codis's HTTP layer puts on the wire: Go-style indented JSON, `"OK"`, status 800 error bodies, the plain-text
//! 404, plus the helpers both doubles share (xauth, Go time text, path segments).
//!
//! Shared by the dashboard double and the proxy double so both answer exactly like martini-based Go servers.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::http::{header, HeaderValue, Response, StatusCode};
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::model::{ErrorBody, StackFrame};

/// `application/json; charset=utf-8`, what Codis sends with every JSON body (errors included).
pub(crate) const JSON: &str = "application/json; charset=utf-8";
/// `text/plain; charset=utf-8`, what Go's `http.NotFound` sends.
pub(crate) const TEXT: &str = "text/plain; charset=utf-8";

/// The dashboard xauth: lowercase hex of the first 16 bytes of SHA-256(`Codis-XAuth-[<product>]`); `product_auth` is
/// not an input.
#[must_use]
pub fn xauth(product: &str) -> String {
    let digest = Sha256::digest(format!("Codis-XAuth-[{product}]").as_bytes());
    hex::encode(&digest[..16])
}

/// The xauth the dashboard presents to a proxy: SHA-256(`Codis-XAuth-[<product>]-[<auth>]-[<token>]`), truncated.
#[must_use]
pub fn proxy_xauth(product: &str, auth: &str, token: &str) -> String {
    let digest = Sha256::digest(format!("Codis-XAuth-[{product}]-[{auth}]-[{token}]").as_bytes());
    hex::encode(&digest[..16])
}

/// An error as Codis reports it. `traced` errors carry a stack, untraced ones (xauth, integer parsing, loglevel)
/// have `"Stack": null`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ApiError {
    pub(crate) cause: String,
    pub(crate) traced: bool,
}

impl ApiError {
    /// A traced error (`Stack` is an array).
    pub(crate) fn traced(cause: impl Into<String>) -> Self {
        Self { cause: cause.into(), traced: true }
    }

    /// An untraced error (`Stack: null`).
    pub(crate) fn plain(cause: impl Into<String>) -> Self {
        Self { cause: cause.into(), traced: false }
    }

    pub(crate) fn body(&self) -> ErrorBody {
        let stack = self.traced.then(|| {
            // Real stacks name Go functions and files; one frame that names the double is enough for clients, which
            // read only `Cause`, and it keeps `Stack` an array where Codis would send one.
            vec![StackFrame { name: "testbed::codis::CodisDouble".into(), file: "testbed/src/codis".into(), line: 0 }]
        });
        ErrorBody { cause: self.cause.clone(), stack }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.cause)
    }
}

/// Serialises like Go's `json.MarshalIndent(v, "", "    ")`: four-space indent and HTML-escaped `& < >`.
pub(crate) fn go_json<T: Serialize + ?Sized>(value: &T) -> Result<String, serde_json::Error> {
    let mut out = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut out, formatter);
    value.serialize(&mut ser)?;
    let text = String::from_utf8_lossy(&out).into_owned();
    // Go escapes these inside strings; they cannot occur outside strings in JSON, so a textual replace is exact.
    Ok(text
        .replace('&', "\\u0026")
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029"))
}

fn response(status: StatusCode, content_type: &'static str, body: String) -> Response<Body> {
    let mut resp = Response::new(Body::from(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

/// A 200 with `value` as indented JSON.
pub(crate) fn ok_json<T: Serialize + ?Sized>(value: &T) -> Response<Body> {
    match go_json(value) {
        Ok(text) => response(StatusCode::OK, JSON, text),
        Err(e) => error(&ApiError::traced(format!("json encode failed: {e}"))),
    }
}

/// The `"OK"` every successful mutation returns.
pub(crate) fn ok() -> Response<Body> {
    response(StatusCode::OK, JSON, "\"OK\"".to_owned())
}

/// Status 800 with the Codis error body; the reason phrase is Go's (`800 status code 800`).
pub(crate) fn error(err: &ApiError) -> Response<Body> {
    let body = go_json(&err.body()).unwrap_or_else(|_| format!("{{\"Cause\": {:?}, \"Stack\": null}}", err.cause));
    let status = StatusCode::from_u16(800).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = response(status, JSON, body);
    resp.extensions_mut().insert(hyper::ext::ReasonPhrase::from_static(b"status code 800"));
    resp
}

/// Go's `404 page not found`.
pub(crate) fn not_found() -> Response<Body> {
    response(StatusCode::NOT_FOUND, TEXT, "404 page not found\n".to_owned())
}

/// A bare 500 (fault injection).
pub(crate) fn internal_error() -> Response<Body> {
    response(StatusCode::INTERNAL_SERVER_ERROR, TEXT, "500 internal server error\n".to_owned())
}

/// `302 Location: <to>`.
pub(crate) fn redirect(to: &'static str) -> Response<Body> {
    let mut resp = response(StatusCode::FOUND, TEXT, String::new());
    resp.headers_mut().insert(header::LOCATION, HeaderValue::from_static(to));
    resp
}

/// Either an API result or an error, as a response.
pub(crate) fn reply(result: Result<Response<Body>, ApiError>) -> Response<Body> {
    result.unwrap_or_else(|e| error(&e))
}

/// Splits a request path into segments the way martini matches them: one trailing `/` is accepted, empty segments
/// never match (so they make the path unknown), and each segment is percent-decoded (`%3A` works like `:`).
/// Returns `None` for paths that can match no route.
pub(crate) fn segments(path: &str) -> Option<Vec<String>> {
    let rest = path.strip_prefix('/')?;
    if rest.is_empty() {
        return Some(Vec::new());
    }
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    rest.split('/').map(|s| if s.is_empty() { None } else { Some(percent_decode(s)) }).collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok());
            if let Some(b) = hex {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Seconds since the epoch.
pub(crate) fn unix_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX)).unwrap_or(0)
}

/// Now in Go's `time.Time.String()` form for UTC, e.g. `2026-11-30 05:49:02.769518193 +0000 UTC`.
pub(crate) fn go_time_now() -> String {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = i64::try_from(now.as_secs()).unwrap_or(0);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:09} +0000 UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        now.subsec_nanos()
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// A random-looking 32-hex-digit token (same shape as Codis's md5 tokens).
pub(crate) fn token(seed: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
    let digest = Sha256::digest(format!("{seed}/{nanos}/{}", std::process::id()).as_bytes());
    hex::encode(&digest[..16])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xauth_matches_the_worked_examples_of_the_reference() {
        assert_eq!(xauth("codis-demo"), "95b62887719520f17e312eaa76d28f2b");
        assert_eq!(xauth("pika-demo"), "13fef069ae10d4b93a95cd230634c19e");
        assert_eq!(
            proxy_xauth("codis-demo", "", "2c97b44860344b5271fe1ef5d4849c55"),
            "bd8176242b847d812210ee8dc66442bd"
        );
    }

    #[test]
    fn json_is_indented_with_four_spaces_and_html_escaped() {
        let body = ApiError::plain("invalid xauth, please check product name & auth").body();
        assert_eq!(
            go_json(&body).unwrap(),
            "{\n    \"Cause\": \"invalid xauth, please check product name \\u0026 auth\",\n    \"Stack\": null\n}"
        );
        assert_eq!(go_json(&Vec::<u8>::new()).unwrap(), "[]");
    }

    #[test]
    fn segments_accept_one_trailing_slash_and_decode_colons() {
        assert_eq!(segments("/").unwrap(), Vec::<String>::new());
        assert_eq!(segments("/api/topom/xping/x/").unwrap(), ["api", "topom", "xping", "x"]);
        assert_eq!(segments("/a/10.0.0.1%3A9221").unwrap(), ["a", "10.0.0.1:9221"]);
        assert!(segments("/a//b").is_none());
        assert!(segments("/a/b//").is_none());
    }

    #[test]
    fn go_time_has_the_go_layout() {
        let t = go_time_now();
        assert!(t.ends_with(" +0000 UTC"), "{t}");
        assert_eq!(t.len(), "2026-11-30 05:49:02.769518193 +0000 UTC".len(), "{t}");
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_422), (2025, 11, 30));
    }
}
