//! Crash points for the crash-at-every-step tests.
//!
//! Every external mutation (a Codis PUT, a SLAVEOF or CONFIG REWRITE, an etcd write) calls [`step`] first. Built
//! with the `failpoints` feature and run with `PIKA_ACTION_CRASH_AT=<n>`, the process aborts just before its n-th
//! mutation, with no cleanup, as a killed pod would; the tests then rerun the action and check that it converges.
//! With `PIKA_ACTION_CRASH_BEFORE=<text>` it aborts before the first mutation whose name contains `<text>`: a
//! process with background work (the watcher's sweeps and repairs) numbers its mutations differently from run to
//! run, so a test that must crash before one given mutation names it. With `PIKA_ACTION_PAUSE_AT=<text>` and
//! `PIKA_ACTION_PAUSE_FILE=<path>`, the first [`pause`] point whose name contains `<text>` creates `<path>` and waits
//! until the test removes it: two runs can then be made to overlap in a given order. Without the feature this
//! compiles to nothing, and the variables are never read.

/// Marks the mutation `what` as about to happen.
#[inline]
pub fn step(what: &str) {
    #[cfg(feature = "failpoints")]
    armed::step(what);
    #[cfg(not(feature = "failpoints"))]
    let _ = what;
}

/// Marks the point `what` (not a mutation) where a test may hold the run while another one goes on.
#[inline]
pub async fn pause(what: &str) {
    #[cfg(feature = "failpoints")]
    armed::pause(what).await;
    #[cfg(not(feature = "failpoints"))]
    let _ = what;
}

#[cfg(feature = "failpoints")]
mod armed {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::OnceLock;

    static COUNT: AtomicUsize = AtomicUsize::new(0);
    static CRASH_AT: OnceLock<Option<usize>> = OnceLock::new();
    static CRASH_BEFORE: OnceLock<Option<String>> = OnceLock::new();

    pub(super) fn step(what: &str) {
        // Read here rather than in `vars`: these hooks exist only in test builds.
        let crash_at =
            *CRASH_AT.get_or_init(|| std::env::var("PIKA_ACTION_CRASH_AT").ok().and_then(|v| v.parse().ok()));
        let crash_before = CRASH_BEFORE.get_or_init(|| std::env::var("PIKA_ACTION_CRASH_BEFORE").ok());
        let n = COUNT.fetch_add(1, Ordering::SeqCst) + 1;
        if crash_at == Some(n) || crash_before.as_deref().is_some_and(|t| what.contains(t)) {
            eprintln!("crash point {n}: aborting before {what}");
            std::process::abort();
        }
    }

    static PAUSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

    pub(super) async fn pause(what: &str) {
        let (Ok(at), Ok(file)) = (std::env::var("PIKA_ACTION_PAUSE_AT"), std::env::var("PIKA_ACTION_PAUSE_FILE"))
        else {
            return;
        };
        if !what.contains(&at) || PAUSED.swap(true, Ordering::SeqCst) {
            return;
        }
        eprintln!("pause point: holding before {what} until {file} is removed");
        if let Err(e) = std::fs::write(&file, what) {
            eprintln!("pause point: cannot create {file}: {e}");
            return;
        }
        while std::path::Path::new(&file).exists() {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        eprintln!("pause point: going on past {what}");
    }
}
