//! The server side of HTTP/1.1 as the test stand-ins of the Kubernetes API need it: requests read one at a time off
//! a keep-alive connection, answers in JSON. Bodies come with `Content-Length` (what kube-rs and reqwest send for a
//! JSON body); chunked uploads, pipelining beyond one request at a time and `Expect: 100-continue` are not handled.

use std::io::{self, BufRead, Write};

/// One request.
#[derive(Debug, Clone)]
pub struct HttpRequest {
    /// The request line as sent, without its line end: `GET /api/v1/namespaces/ns/pods HTTP/1.1`.
    pub line: String,
    /// `GET`, `POST`, ...
    pub method: String,
    /// The request target, query included.
    pub target: String,
    /// The body (`Content-Length` bytes; empty without one).
    pub body: Vec<u8>,
}

impl HttpRequest {
    /// The target without its query.
    #[must_use]
    pub fn path(&self) -> &str {
        self.target.split_once('?').map_or(self.target.as_str(), |(path, _)| path)
    }

    /// The query of the target (`""` without one).
    #[must_use]
    pub fn query(&self) -> &str {
        self.target.split_once('?').map_or("", |(_, query)| query)
    }
}

/// Reads the next request off `reader`: `None` when the connection ends, also in the middle of a request.
pub fn read_request(reader: &mut impl BufRead) -> Option<HttpRequest> {
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return None;
    }
    let mut length = 0usize;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).unwrap_or(0) == 0 {
            return None;
        }
        if header.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    let line = line.trim_end().to_owned();
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_owned();
    let target = parts.next().unwrap_or("/").to_owned();
    Some(HttpRequest { line, method, target, body })
}

/// Writes an answer with `status` and the JSON text `json`.
///
/// # Errors
/// When the connection is gone.
pub fn write_json(writer: &mut impl Write, status: u16, json: &str) -> io::Result<()> {
    let reason = match status {
        200 => "OK",
        201 => "Created",
        403 => "Forbidden",
        404 => "Not Found",
        409 => "Conflict",
        _ => "Error",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        json.len()
    );
    writer.write_all(head.as_bytes())?;
    writer.write_all(json.as_bytes())?;
    writer.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_read_one_after_another_with_their_bodies() {
        let wire = b"POST /api/v1/namespaces/ns/events?x=1 HTTP/1.1\r\nHost: a\r\ncontent-length: 4\r\n\r\n{\"a\"GET /b HTTP/1.1\r\n\r\n";
        let mut reader = io::BufReader::new(&wire[..]);
        let first = read_request(&mut reader).expect("first");
        assert_eq!(first.line, "POST /api/v1/namespaces/ns/events?x=1 HTTP/1.1");
        assert_eq!(
            (first.method.as_str(), first.path(), first.query()),
            ("POST", "/api/v1/namespaces/ns/events", "x=1")
        );
        assert_eq!(first.body, b"{\"a\"");
        let second = read_request(&mut reader).expect("second");
        assert_eq!((second.method.as_str(), second.path(), second.query()), ("GET", "/b", ""));
        assert!(second.body.is_empty());
        assert!(read_request(&mut reader).is_none(), "the end of the connection");
        let cut = b"POST /c HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc";
        assert!(read_request(&mut io::BufReader::new(&cut[..])).is_none(), "a body cut short");
    }

    #[test]
    fn answers_carry_status_reason_and_length() {
        let mut out = Vec::new();
        write_json(&mut out, 404, "{}").unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
        );
    }
}
