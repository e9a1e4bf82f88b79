//! Keeps secrets out of every byte the binary writes.
//!
//! Secrets (the pika password, credentials embedded in addresses) are registered once at start-up; every log line and
//! the final error line pass through [`scrub`], so a secret echoed back by a server or a library error never reaches
//! stderr.

use std::borrow::Cow;
use std::io::Write;
use std::sync::{Mutex, PoisonError};

static SECRETS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// The text that replaces a secret.
pub const MASK: &str = "[redacted]";

/// Registers a secret so that it is masked from now on. Empty strings are ignored.
pub fn register(secret: &str) {
    if secret.is_empty() {
        return;
    }
    let mut secrets = SECRETS.lock().unwrap_or_else(PoisonError::into_inner);
    if !secrets.iter().any(|s| s == secret) {
        secrets.push(secret.to_owned());
        // Longest first, so a secret that contains another is masked whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    }
}

/// Returns `text` with every registered secret masked.
#[must_use]
pub fn scrub(text: &str) -> Cow<'_, str> {
    let secrets = SECRETS.lock().unwrap_or_else(PoisonError::into_inner);
    if !secrets.iter().any(|s| text.contains(s.as_str())) {
        return Cow::Borrowed(text);
    }
    let mut out = text.to_owned();
    for secret in secrets.iter() {
        out = out.replace(secret.as_str(), MASK);
    }
    Cow::Owned(out)
}

/// A stderr writer for `tracing` that masks secrets in every line it is handed.
#[derive(Debug, Default, Clone, Copy)]
pub struct ScrubbedStderr;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for ScrubbedStderr {
    type Writer = LineBuffer;
    fn make_writer(&'a self) -> Self::Writer {
        LineBuffer(Vec::new())
    }
}

/// Collects one formatted log event and writes it, scrubbed, to stderr when dropped.
#[derive(Debug)]
pub struct LineBuffer(Vec<u8>);

impl Write for LineBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LineBuffer {
    fn drop(&mut self) {
        let text = String::from_utf8_lossy(&self.0);
        // Nothing sensible to do if stderr is gone.
        let _ = std::io::stderr().lock().write_all(scrub(&text).as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_secrets_are_masked_longest_first() {
        register("hunter2");
        register("hunter2-and-more");
        assert_eq!(scrub("auth hunter2-and-more then hunter2"), "auth [redacted] then [redacted]");
        assert_eq!(scrub("nothing here"), "nothing here");
    }
}
