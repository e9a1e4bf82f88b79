//! Trial records of the reliability suite: every category of attack (a crash point, an injected fault, a pair of
//! actions launched at once, a bad input) counts its trials and failures here, and appends one JSON line per
//! category to `$CARGO_TARGET_TMPDIR/reliability/<test binary>.jsonl` when it is done — also when a trial panicked,
//! so a failure is counted before the test fails. `scripts/test.sh` prints the table after `cargo test`.
//!
//! Declared by the test files that use it with `#[path = "support/summary.rs"] mod summary;`, so that the other
//! test binaries sharing `support/` are not affected.
#![allow(dead_code)]

use std::fmt::Display;
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

/// The directory the records go to.
pub fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("reliability")
}

/// Appends one record `{"category": ..., "trials": n, "failures": m}`.
pub fn record(category: &str, trials: usize, failures: usize) {
    let dir = dir();
    let _ = std::fs::create_dir_all(&dir);
    let binary = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "tests".to_owned());
    let line = format!(
        "{{\"category\": {}, \"trials\": {trials}, \"failures\": {failures}}}\n",
        serde_json::Value::from(category)
    );
    // One write of a short line to a file opened for appending: lines of parallel tests never interleave.
    if let Ok(mut file) =
        std::fs::OpenOptions::new().create(true).append(true).open(dir.join(format!("{binary}.jsonl")))
    {
        let _ = file.write_all(line.as_bytes());
    }
}

/// The trials of one category. Each [`Category::trial`] runs one attack and catches its panic, so that every trial
/// runs and is counted; [`Category::finish`] records the counts and fails the test with every failure's message.
/// Dropped unfinished (the test failed elsewhere), it still records what it counted.
pub struct Category {
    name: String,
    trials: usize,
    failures: Vec<String>,
    recorded: bool,
}

impl Category {
    /// A category named as it appears in the summary table, e.g. `crash: member-leave`.
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into(), trials: 0, failures: Vec::new(), recorded: false }
    }

    /// Runs one trial named `label`; a panic is a failure of this trial, not of the test (yet).
    pub fn trial<T>(&mut self, label: impl Display, f: impl FnOnce() -> T) -> Option<T> {
        self.trials += 1;
        match catch_unwind(AssertUnwindSafe(f)) {
            Ok(value) => Some(value),
            Err(panic) => {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| "panicked".to_owned());
                self.failures.push(format!("{label}: {message}"));
                None
            }
        }
    }

    /// Counts a trial whose outcome the caller judged.
    pub fn judge(&mut self, label: impl Display, ok: bool, why: impl FnOnce() -> String) {
        self.trials += 1;
        if !ok {
            self.failures.push(format!("{label}: {}", why()));
        }
    }

    /// Counts `n` generated cases (a property test) as trials, one of them failed when `failure` is given.
    pub fn cases(&mut self, label: impl Display, n: usize, failure: Option<String>) {
        self.trials += n;
        if let Some(why) = failure {
            self.failures.push(format!("{label}: {why}"));
        }
    }

    /// Trials so far.
    pub fn trials(&self) -> usize {
        self.trials
    }

    /// Records the counts and panics listing every failed trial.
    pub fn finish(mut self) {
        self.write();
        println!("{}: {} trial(s), {} failure(s)", self.name, self.trials, self.failures.len());
        assert!(
            self.failures.is_empty(),
            "{}: {} of {} trial(s) failed:\n{}",
            self.name,
            self.failures.len(),
            self.trials,
            self.failures.join("\n")
        );
    }

    fn write(&mut self) {
        if !self.recorded {
            self.recorded = true;
            record(&self.name, self.trials, self.failures.len());
        }
    }
}

impl Drop for Category {
    fn drop(&mut self) {
        // Not finished: the test failed elsewhere (another category's finish, or outside any trial); what was
        // counted is still recorded.
        self.write();
    }
}
