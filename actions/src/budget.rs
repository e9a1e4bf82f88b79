//! The time box of one run (`ACTION_BUDGET_SECONDS`).
//!
//! KubeBlocks kills a blocking action after at most 60 s, so long work is split into resumable steps; every wait
//! is bounded by what is left of the budget, and when it runs out the action returns [`Error::InProgress`] (exit 75)
//! saying how far it got.

use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// The deadline of this run.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    started: Instant,
    deadline: Instant,
}

impl Budget {
    /// A budget of `seconds` from now.
    #[must_use]
    pub fn new(seconds: u64) -> Self {
        Self::of(Duration::from_secs(seconds))
    }

    /// A budget of `length` from now.
    #[must_use]
    pub fn of(length: Duration) -> Self {
        let started = Instant::now();
        Self { started, deadline: started + length }
    }

    /// Time left (zero once expired).
    #[must_use]
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Time since the run started.
    #[must_use]
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Whether the budget is used up.
    #[must_use]
    pub fn expired(&self) -> bool {
        self.remaining().is_zero()
    }

    /// `Err(InProgress)` with the progress text once the budget is used up.
    pub fn check(&self, progress: impl FnOnce() -> String) -> Result<()> {
        if self.expired() {
            Err(Error::InProgress { progress: progress() })
        } else {
            Ok(())
        }
    }

    /// `wanted`, but no longer than what is left (for timeouts of single calls).
    #[must_use]
    pub fn cap(&self, wanted: Duration) -> Duration {
        wanted.min(self.remaining()).max(Duration::from_millis(1))
    }
}
