//! The one place where failures become exit codes.
//!
//! Every module has its own `thiserror` enum; they meet here in [`Error`], and [`Error::exit_code`] is the single
//! mapping from failure to the exit status of the action contract (0 done, 75 budget ran out, 2 invalid input,
//! 1 anything else).

use std::process::ExitCode;

/// Exit status for "work under way, budget exhausted; run again to resume" (`EX_TEMPFAIL`).
pub const EXIT_IN_PROGRESS: u8 = 75;
/// Exit status for invalid input or configuration; nothing was changed.
pub const EXIT_INVALID_INPUT: u8 = 2;
/// Exit status for every other failure.
pub const EXIT_FAILURE: u8 = 1;

/// Any failure of an action.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A variable is missing or malformed, or the configuration is unusable; nothing was changed.
    #[error("{var}: {reason}")]
    InvalidInput {
        /// The environment variable (or template) at fault.
        var: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The time budget ran out with work still to do; the next run resumes from `progress`.
    #[error("{progress}")]
    InProgress {
        /// How far the work got, e.g. `drain in progress: 312/512 slots moved`.
        progress: String,
    },
    /// The codis-dashboard refused or failed a request.
    #[error(transparent)]
    Codis(#[from] crate::clients::codis::Error),
    /// A pika (or redis) server failed a request.
    #[error(transparent)]
    Pika(#[from] crate::clients::pika::Error),
    /// etcd failed or a lock could not be taken.
    #[error(transparent)]
    Etcd(#[from] crate::clients::etcd::Error),
    /// The Kubernetes API failed a request that the action needed.
    #[error(transparent)]
    Kube(#[from] crate::clients::kube::Error),
    /// A shard could not be registered.
    #[error(transparent)]
    Register(#[from] crate::steps::register::Refusal),
    /// Slots stopped moving.
    #[error(transparent)]
    Rebalance(#[from] crate::steps::rebalance::Refusal),
    /// A drain will not start.
    #[error(transparent)]
    Drain(#[from] crate::steps::drain::Refusal),
    /// A drain could not check what it must, or was overtaken.
    #[error(transparent)]
    DrainStopped(#[from] crate::steps::drain::Stopped),
    /// Mastership was not moved.
    #[error(transparent)]
    Transfer(#[from] crate::steps::transfer::Refusal),
    /// A split could not go on.
    #[error(transparent)]
    Split(#[from] crate::steps::split::Refusal),
    /// A failed-over master's tail could not be written again.
    #[error(transparent)]
    Salvage(#[from] crate::steps::salvage::Unsalvaged),
    /// etcd was needed and did not answer.
    #[error(transparent)]
    EtcdNeeded(#[from] crate::steps::cluster::EtcdNeeded),
    /// `post-provision` will not move slots it does not own.
    #[error(transparent)]
    PostProvision(#[from] crate::actions::post_provision::Refusal),
    /// `member-leave` will not remove the member.
    #[error(transparent)]
    MemberLeave(#[from] crate::actions::member_leave::Refusal),
    /// `switchover` did not finish in its one call.
    #[error(transparent)]
    Switchover(#[from] crate::actions::switchover::Unfinished),
    /// `rejoin` does not start the pod.
    #[error(transparent)]
    Rejoin(#[from] crate::actions::rejoin::Refusal),
    /// `topology` found Codis and the pikas disagreeing.
    #[error(transparent)]
    Topology(#[from] crate::actions::topology::Disagreement),
    /// The failover watcher lost its election mid-work.
    #[error(transparent)]
    LeaseGone(#[from] crate::actions::watcher::LeaseGone),
    /// The async runtime could not start.
    #[error("cannot start the async runtime")]
    Runtime(#[source] std::io::Error),
    /// The event could not be printed.
    #[error("cannot print the event")]
    Print(#[from] serde_json::Error),
}

impl Error {
    /// Shorthand for [`Error::InvalidInput`].
    pub fn invalid(var: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidInput { var: var.into(), reason: reason.into() }
    }

    /// The exit status the contract assigns to this failure.
    #[must_use]
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::InvalidInput { .. } => EXIT_INVALID_INPUT,
            Self::InProgress { .. } => EXIT_IN_PROGRESS,
            _ => EXIT_FAILURE,
        }
    }

    /// The whole cause chain on one line: what an operator reads in the KubeBlocks event.
    #[must_use]
    pub fn one_line(&self) -> String {
        let mut line = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(cause) = source {
            let text = cause.to_string();
            if !line.contains(&text) {
                line.push_str(": ");
                line.push_str(&text);
            }
            source = cause.source();
        }
        line.replace('\n', " ")
    }
}

/// The result type of the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Maps an action's result to the process exit code, printing the error (redacted) on stderr.
#[must_use]
pub fn finish(result: Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            let prefix = match err.exit_code() {
                EXIT_IN_PROGRESS => "in progress",
                EXIT_INVALID_INPUT => "invalid input",
                _ => "error",
            };
            eprintln!("{prefix}: {}", crate::redact::scrub(&err.one_line()));
            ExitCode::from(err.exit_code())
        }
    }
}
