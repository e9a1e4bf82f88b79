//! Records of the reliability suite. Each category counts one [`Kind`] of thing and its failures, and appends one
//! JSON line to `$CARGO_TARGET_TMPDIR/reliability/<test module>-<test binary>.jsonl` when it is done (the module is
//! the file that opened the category) — also when a trial panicked,
//! so a failure is counted before the test fails, and when the test failed outside any trial, which then counts as
//! a failure of the category. `scripts/test.sh` prints one table per kind after `cargo test`, so that generated
//! cases never pass for attacks.
//!
#![allow(dead_code)]

use std::fmt::Display;
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

/// The directory the records go to.
pub fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("reliability")
}

/// What a category counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// One attack on a running system (real etcd, redis-servers, the Codis double) whose outcome was checked
    /// against Codis, redis and etcd state.
    Trial,
    /// One run of the real binary whose exit status and output were checked (a bad input refused, a log line
    /// without the password), with no attack on the running system.
    Check,
    /// One case a property test generated and checked in process.
    ProptestCase,
    /// One generated input fed to the binary or a parser (fuzzing).
    FuzzInput,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Self::Trial => "trial",
            Self::Check => "check",
            Self::ProptestCase => "proptest case",
            Self::FuzzInput => "fuzz input",
        }
    }
}

/// Appends one record `{"kind": ..., "category": ..., "count": n, "failures": m}` of the test module `source`.
fn record(source: &str, kind: Kind, category: &str, count: usize, failures: usize) {
    let dir = dir();
    let _ = std::fs::create_dir_all(&dir);
    let binary = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "tests".to_owned());
    let file_name = format!("{source}-{binary}.jsonl");
    let line = format!(
        "{{\"kind\": \"{}\", \"category\": {}, \"count\": {count}, \"failures\": {failures}}}\n",
        kind.label(),
        serde_json::Value::from(category)
    );
    // One write of a short line to a file opened for appending: lines of parallel tests never interleave.
    if let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(dir.join(file_name)) {
        let _ = file.write_all(line.as_bytes());
    }
}

/// The trials of one category. Each [`Category::trial`] runs one attack and catches its panic, so that every trial
/// runs and is counted; [`Category::finish`] records the counts and fails the test with every failure's message.
/// Dropped unfinished (the test failed elsewhere), it still records what it counted.
pub struct Category {
    /// The test module that opened it: the file name of the caller of [`Category::of`].
    source: String,
    kind: Kind,
    name: String,
    trials: usize,
    failures: Vec<String>,
    recorded: bool,
}

impl Category {
    /// A category of trials, named as it appears in the summary table, e.g. `crash: member-leave`.
    #[track_caller]
    pub fn new(name: impl Into<String>) -> Self {
        Self::of(Kind::Trial, name)
    }

    /// A category counting `kind`.
    #[track_caller]
    pub fn of(kind: Kind, name: impl Into<String>) -> Self {
        let file = std::panic::Location::caller().file();
        let source =
            std::path::Path::new(file).file_stem().map_or_else(|| "tests".into(), |s| s.to_string_lossy().into());
        Self { source, kind, name: name.into(), trials: 0, failures: Vec::new(), recorded: false }
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

    /// Counts `n` generated cases (a property test or a fuzz run), one of them failed when `failure` is given.
    pub fn cases(&mut self, label: impl Display, n: usize, failure: Option<String>) {
        assert!(
            matches!(self.kind, Kind::ProptestCase | Kind::FuzzInput),
            "{}: generated cases are not trials or checks",
            self.name
        );
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
        let kind = self.kind.label();
        println!("{}: {} {kind}(s), {} failure(s)", self.name, self.trials, self.failures.len());
        assert!(
            self.failures.is_empty(),
            "{}: {} of {} {kind}(s) failed:\n{}",
            self.name,
            self.failures.len(),
            self.trials,
            self.failures.join("\n")
        );
    }

    fn write(&mut self) {
        if !self.recorded {
            self.recorded = true;
            record(&self.source, self.kind, &self.name, self.trials, self.failures.len());
        }
    }
}

impl Drop for Category {
    fn drop(&mut self) {
        // Not finished: the test failed elsewhere (another category's finish, or outside any trial). What was
        // counted is still recorded, and a failure outside the trials counts as one, so the table never shows 0.
        if !self.recorded && std::thread::panicking() {
            self.failures.push("the test failed outside this category's trials".to_owned());
        }
        self.write();
    }
}
